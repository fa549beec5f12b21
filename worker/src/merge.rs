//! `merge_task`: a done task's work brought into the branch it was submitted from (or another).

use crate::error::{Error, Result};
use crate::git;
use queue::{Store, Task, TaskId, TaskStatus};
use serde::Serialize;
use std::path::Path;

/// What a merge did, for the caller.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct MergeReport {
    pub task_id: i64,
    pub into: String,
    pub commit: String,
    /// `fast-forward`, `merge` or `squash`.
    pub how: String,
    /// The working tree that had the branch checked out and was updated.
    pub checkout: Option<String>,
    /// Every task marked merged: this one and the dependencies whose work its branch carries.
    pub merged: Vec<i64>,
}

/// Merges task `id` into `into` (default: the branch it was submitted from). Refusals (not done,
/// no work, a dirty checkout, a conflict) are user errors that changed nothing.
pub fn merge_task(
    store: &Store,
    id: TaskId,
    into: Option<&str>,
    squash: bool,
) -> Result<MergeReport> {
    let task = store.get(id)?;
    if task.status != TaskStatus::Done {
        return Err(Error::Repo(format!(
            "task {} is {}; only a done task can be merged",
            id.0, task.display_status
        )));
    }
    let result = task.result.clone().unwrap_or_default();
    let Some(commit) = result.commit.clone() else {
        return Err(Error::Repo(format!(
            "task {} changed nothing, so there is nothing to merge",
            id.0
        )));
    };
    let into = match into.map(str::to_owned).or_else(|| task.base_ref.clone()) {
        Some(b) => b,
        None => {
            return Err(Error::Repo(format!(
                "task {} was not submitted from a branch; name one with `into` (--into)",
                id.0
            )));
        }
    };
    let how_word = if squash { "squash" } else { "merge" };
    let message =
        format!("taskbridge: {how_word} task {}: {}\n\n{}", id.0, task.title, result.summary);
    // Work done by a worker on another host is on the remote, not here yet.
    let repo = Path::new(&task.repo);
    let have = git2::Repository::open(repo)
        .ok()
        .is_some_and(|r| git2::Oid::from_str(&commit).is_ok_and(|oid| r.find_commit(oid).is_ok()));
    if !have && let (Some(remote), Some(branch)) = (&task.remote, &task.branch) {
        crate::remote::fetch_branch(repo, remote, branch)
            .map_err(|e| Error::Repo(format!("task {}: its work is not here: {e}", id.0)))?;
    }
    let merged = git::merge_into(repo, &commit, &into, squash, &message)
        .map_err(|e| Error::Repo(format!("task {}: {e}", id.0)))?;
    // Its branch carries the work of what it was stacked on (and so on): they are merged too.
    let mut ids = vec![id];
    let mut stack: Vec<TaskId> = task.stacked_on.clone();
    while let Some(dep) = stack.pop() {
        if ids.contains(&dep) {
            continue;
        }
        let Ok(t) = store.get(dep) else { continue };
        if t.status == TaskStatus::Done && t.merged_into.is_none() {
            ids.push(dep);
            stack.extend(t.stacked_on.iter().copied());
        }
    }
    store.record_merge(&ids, &into, &merged.commit)?;
    Ok(MergeReport {
        task_id: id.0,
        into,
        commit: merged.commit,
        how: merged.how.to_owned(),
        checkout: merged.checkout.map(|p| p.display().to_string()),
        merged: ids.iter().map(|t| t.0).collect(),
    })
}

/// Another unmerged task that changed some of the same paths.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Overlap {
    pub task_id: i64,
    pub title: String,
    pub status: TaskStatus,
    pub paths: Vec<String>,
}

/// Other unmerged tasks of the same repository whose changed paths meet this one's: a warning
/// for whoever merges them, not a block.
pub fn overlaps(store: &Store, task: &Task) -> Result<Vec<Overlap>> {
    let mine = files_of(task);
    if mine.is_empty() {
        return Ok(vec![]);
    }
    let filter =
        queue::ListFilter { repo: Some(task.repo.clone()), limit: Some(500), ..Default::default() };
    let mut out = Vec::new();
    for other in store.list(&filter)? {
        if other.id == task.id
            || other.merged_into.is_some()
            || other.status.is_terminal() && other.status != TaskStatus::Done
        {
            continue;
        }
        let shared: Vec<String> =
            files_of(&other).into_iter().filter(|p| mine.contains(p)).collect();
        if !shared.is_empty() {
            out.push(Overlap {
                task_id: other.id.0,
                title: other.title,
                status: other.status,
                paths: shared,
            });
        }
    }
    Ok(out)
}

fn files_of(task: &Task) -> Vec<String> {
    task.result
        .as_ref()
        .map(|r| r.files_touched.iter().map(|f| f.path.clone()).collect())
        .unwrap_or_default()
}
