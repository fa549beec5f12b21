//! `clear`: removing finished tasks with their logs and worktrees, never a branch.

use crate::error::Result;
use crate::{git, logs};
use queue::{Home, Store, Task, TaskStatus};
use std::path::Path;

/// Deletes finished tasks in `statuses` older than `older_than_s`, their log files and their
/// worktrees. Uncommitted work in a worktree is first committed to the task's branch, so clearing
/// never loses work.
pub fn clear_finished(
    store: &Store,
    home: &Home,
    older_than_s: f64,
    statuses: &[TaskStatus],
    under: &[String],
) -> Result<Vec<Task>> {
    let cleared = store.clear_finished(older_than_s, statuses, under)?;
    for task in &cleared {
        for p in [
            logs::log_path(&home.logs_dir(), task.id.0),
            logs::events_path(&home.logs_dir(), task.id.0),
        ] {
            let _ = std::fs::remove_file(p);
        }
        if let Some(wt) = &task.worktree {
            let wt = Path::new(wt);
            // A done task's directory may since have been taken by another task (a worker in
            // serve mode reuses it): it is this task's only while it is on this task's branch.
            let repo = Path::new(&task.repo);
            let on_branch = task
                .branch
                .as_ref()
                .filter(|b| wt.exists() && git::head_branch(repo, wt).as_ref() == Some(b));
            if let Some(branch) = on_branch {
                let msg = format!(
                    "taskbridge: task {} (work left in the worktree when it was cleared)",
                    task.id.0
                );
                match git::commit_all(repo, wt, branch, &msg) {
                    Ok(_) => {
                        if let Err(e) = git::remove_worktree(Path::new(&task.repo), wt) {
                            tracing::warn!(task = %task.id, error = %e, "removing the worktree failed");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(task = %task.id, error = %e, "worktree kept: its work could not be committed")
                    }
                }
            }
        }
    }
    Ok(cleared)
}
