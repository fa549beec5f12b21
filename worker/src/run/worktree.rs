//! The run's first and last stages. Prepare: the commit the task starts from (its dependencies'
//! work put together on its first run), the directory it runs in (an earlier attempt's, a
//! follow-up's parent's, a spare, or a new one) on its branch, and the repository's set-up
//! commands. Finish: the work committed on the branch, a read-only task's edits reverted, files
//! and diff read from git, and the directory removed or kept as a spare.

use super::{DepInfo, Run, Stage};
use crate::agent::{AgentKind, AgentSpec};
use crate::claim_loop::Worker;
use crate::config::RepoConfig;
use crate::error::Error;
use crate::git;
use crate::logs::TaskLog;
use crate::result::TaskResult;
use queue::{Outcome, RunFacts, Task};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where a run's worktree goes, before git is asked.
struct Place {
    dir: PathBuf,
    /// A spare worktree being reused (cleaned, put on the task's branch).
    spare: Option<PathBuf>,
    /// The directory of a follow-up's parent, taken for it.
    at_parents: Option<PathBuf>,
}

impl Worker {
    /// Stage one: the worktree on the task's branch at the commit it starts from, recorded on
    /// the task, with the repository's set-up run in it when it is new.
    pub(super) async fn prepare<'a>(
        &self,
        task: &'a Task,
        token: i64,
        log: &mut TaskLog,
    ) -> Stage<Run<'a>> {
        let id = task.id;
        // An earlier attempt's worktree is reused when it is this worker's home's: one made by
        // a worker with another home (another host of a shared queue) belongs to that home's
        // repository or mirror, and its path may not even exist here; the task then starts
        // afresh here, as on its first run.
        let own = self.home.worktrees_dir();
        let earlier = task.worktree.as_ref().map(PathBuf::from).filter(|w| w.starts_with(&own));
        // A task with dependencies starts from their work, put together before any agent runs.
        let first_run = earlier.is_none() && (task.branch.is_none() || task.worktree.is_some());
        let (start, deps) = self.stack(task, first_run, log).await?;
        let spec = AgentSpec::of_in(task, &self.cfg.agents);
        // An OpenCode follow-up's first run goes in the directory its parent ran in when that is
        // free: the parent's session lives there (see `prompt::Conversation`). Claude Code and
        // Codex take a session to any directory.
        let parent_dir = match (task.parent, &earlier) {
            (Some(parent), None) if first_run && spec.kind == AgentKind::OpenCode => self
                .blocking(move |s| s.get(parent))
                .await
                .ok()
                .and_then(|p| p.worktree.map(PathBuf::from))
                .filter(|p| p.starts_with(&own)),
            _ => None,
        };
        let place = self.place(task, earlier, parent_dir.clone());
        let prepared = self.make_worktree(task, &start, &place, log).await?;
        for r in &prepared.repairs {
            log.line(&format!("repaired: {r}"));
            tracing::warn!(task = %id, "{r}");
        }
        // The directory the worktree is in: another task's worktree at the one asked for is
        // stepped around (see `git::prepare_worktree`).
        let (dir, branch) = (prepared.dir.clone(), prepared.branch.clone());
        log.line(&format!("worktree {} on branch {branch}", dir.display()));
        let facts = RunFacts {
            branch: Some(branch.clone()),
            worktree: Some(dir.display().to_string()),
            started_from: Some(start.clone()),
            stacked_on: first_run
                .then(|| deps.iter().filter(|d| d.commit.is_some()).map(|d| d.id).collect()),
            ..Default::default()
        };
        self.blocking(move |s| s.record_run(id, token, facts)).await?;
        if prepared.created
            && let Some(error) = self.setup(task, &dir, log).await
        {
            let backoff_s = self.backoff(task.attempts);
            return Err(Outcome::Failed {
                error,
                kind: queue::FailureKind::Setup,
                result: None,
                backoff_s,
            }
            .into());
        }
        let model = self.model_for(task, &spec).await;
        let acp = self.acp_launch(&spec)?;
        Ok(Run {
            task,
            token,
            spec,
            dir,
            branch,
            start,
            deps,
            first_run,
            parent_dir,
            model,
            warm_server: self.servers.is_some(),
            acp,
            opencode_major: self.opencode_version.as_deref().and_then(crate::agent::major),
            deadline: tokio::time::Instant::now()
                + Duration::from_secs(task.timeout_s.max(1) as u64),
            walled: Default::default(),
        })
    }

    /// The model named to the agent. The default model is OpenCode's `provider/model`; the other
    /// agents use their own default unless the task names one.
    pub(crate) async fn model_for(&self, task: &Task, spec: &AgentSpec) -> Option<String> {
        match &task.model {
            Some(m) => Some(m.clone()),
            None if spec.kind != AgentKind::OpenCode => None,
            None => self
                .blocking(|s| s.setting("default_model"))
                .await
                .ok()
                .flatten()
                .or_else(|| self.cfg.default_model.clone()),
        }
    }

    /// The directory the run asks git for: an earlier attempt's, else a spare of the repository
    /// (the parent's own directory for a follow-up, when this worker keeps it), else the
    /// parent's directory when it is gone, else a new one.
    fn place(&self, task: &Task, earlier: Option<PathBuf>, parent_dir: Option<PathBuf>) -> Place {
        let at_parents = parent_dir.filter(|p| self.take_spare_at(&task.repo, p) || !p.exists());
        let spare = match (&earlier, &at_parents) {
            (None, None) => self.take_spare(&task.repo),
            (None, Some(p)) if p.exists() => Some(p.clone()),
            _ => None,
        };
        let dir = earlier
            .or_else(|| spare.clone())
            .or_else(|| at_parents.clone())
            .unwrap_or_else(|| self.repo_worktrees(&task.repo).join(format!("task-{}", task.id.0)));
        Place { dir, spare, at_parents }
    }

    /// The worktree at `place`, on the task's branch at `start`; a failure is the run's outcome.
    async fn make_worktree(
        &self,
        task: &Task,
        start: &str,
        place: &Place,
        log: &mut TaskLog,
    ) -> Stage<git::Prepared> {
        let (repo, base, d) = (PathBuf::from(&task.repo), start.to_owned(), place.dir.clone());
        let (id, known, pause) = (task.id, task.branch.clone(), self.cfg.fault_worktree_pause);
        log.line(&match &place.spare {
            Some(s) => format!("preparing the worktree (reusing {}, cleaned)", s.display()),
            None => "preparing the worktree".to_owned(),
        });
        let reuse = place.spare.is_some();
        let fresh = self.repo_worktrees(&task.repo).join(format!("task-{}", task.id.0));
        let (spare_log, prepared) = tokio::task::spawn_blocking(move || {
            let mut said = None;
            if reuse {
                match git::reuse_worktree(&repo, &d, &base, id.0) {
                    Ok(p) => return (None, Ok(p)),
                    // A spare that cannot be reused (one whose git metadata an earlier agent
                    // changed, too) is thrown away, unread, and the task gets a new worktree.
                    Err(e) => {
                        let gone = git::remove_worktree(&repo, &d).err();
                        said = Some(match gone {
                            None => format!(
                                "the spare worktree {} could not be reused, and \
                                 was removed: {e}",
                                d.display()
                            ),
                            Some(g) => format!(
                                "the spare worktree {} could not be reused \
                                 ({e}), nor removed ({g})",
                                d.display()
                            ),
                        });
                    }
                }
            }
            let dir = if reuse { fresh } else { d };
            (said, git::prepare_worktree(&repo, &base, id.0, known.as_deref(), &dir, pause))
        })
        .await
        .map_err(|e| Error::Join(e.to_string()))?;
        if let Some(said) = spare_log {
            log.line(&said);
            tracing::warn!(task = %task.id, "{said}");
        }
        match prepared {
            Ok(p) => Ok(p),
            // Another process may have taken the parent's directory since it was seen free:
            // the next attempt goes elsewhere.
            Err(e) if e.tampered => {
                let mut result = Box::<crate::result::TaskResult>::default();
                result.tampered = Some(e.message.trim_start_matches("tampered: ").to_owned());
                let error = format!("could not prepare the worktree: {e}");
                let kind = queue::FailureKind::Tampered;
                Err(Outcome::FailedPermanently { error, kind, result: Some(result) }.into())
            }
            Err(e) if e.permanent && !(place.at_parents.is_some() && place.spare.is_none()) => {
                let error = format!("could not prepare the worktree: {e}");
                Err(Outcome::FailedPermanently {
                    error,
                    kind: queue::FailureKind::Worktree,
                    result: None,
                }
                .into())
            }
            // A lock, a crash's leftovers we could not clear yet, a file system hiccup: another
            // attempt, after the backoff, may well succeed.
            Err(e) => Err(Outcome::Failed {
                error: format!(
                    "could not prepare the worktree (another attempt may fix this): {e}"
                ),
                kind: queue::FailureKind::Worktree,
                result: None,
                backoff_s: self.backoff(task.attempts),
            }
            .into()),
        }
    }

    /// The commit a task starts from, and what its dependencies did (for its prompt): on its
    /// first run, its dependencies' commits put together (a conflict, naming the tasks and
    /// paths, ends the run); later, what the first run recorded.
    async fn stack(
        &self,
        task: &Task,
        first_run: bool,
        log: &mut TaskLog,
    ) -> Stage<(String, Vec<DepInfo>)> {
        if !first_run || task.depends_on.is_empty() {
            let start = task.started_from.clone().unwrap_or_else(|| task.base.clone());
            return Ok((start, vec![]));
        }
        let ids = task.depends_on.clone();
        let deps = self
            .blocking(move |s| ids.iter().map(|id| s.get(*id)).collect::<queue::Result<Vec<_>>>())
            .await?;
        let infos: Vec<DepInfo> = deps.iter().map(DepInfo::of).collect();
        // A dependency that changed nothing adds nothing.
        let with_work: Vec<&DepInfo> = infos.iter().filter(|d| d.commit.is_some()).collect();
        if with_work.is_empty() {
            return Ok((task.base.clone(), infos));
        }
        let commits: Vec<String> = with_work.iter().filter_map(|d| d.commit.clone()).collect();
        let names: Vec<String> = with_work.iter().map(|d| format!("#{}", d.id.0)).collect();
        let message = format!(
            "taskbridge: task {} starts from the work of tasks {}",
            task.id.0,
            names.join(", ")
        );
        let repo = PathBuf::from(&task.repo);
        let stacked =
            tokio::task::spawn_blocking(move || git::stack_start(&repo, &commits, &message))
                .await
                .map_err(|e| Error::Join(e.to_string()))??;
        let c = match stacked {
            Ok(start) => return Ok((start.unwrap_or_else(|| task.base.clone()), infos)),
            Err(c) => c,
        };
        let name = |i: usize| {
            let d = with_work[i];
            format!("#{} ({})", d.id.0, d.title)
        };
        let merged: Vec<String> = c.merged.iter().map(|&i| name(i)).collect();
        let error = format!(
            "the tasks this one depends on conflict: {} and {} change {} differently; no agent \
             ran. Resolve it on one of them (a follow-up task, or a commit on its branch), then \
             retry this task",
            merged.join(", "),
            name(c.with),
            c.paths.join(", ")
        );
        log.line(&error);
        Err(Outcome::FailedPermanently { error, kind: queue::FailureKind::Conflict, result: None }
            .into())
    }

    /// Runs the repository's set-up commands in a new worktree. Returns an error message if one
    /// fails. They run outside the wall (they install, they fetch), so they are read from the
    /// commit the task was submitted on, never from the work of the agents it is stacked on.
    async fn setup(&self, task: &Task, dir: &Path, log: &mut TaskLog) -> Option<String> {
        let cfg = match RepoConfig::at(Path::new(&task.repo), &task.base) {
            Ok(c) => c,
            Err(e) => return Some(e),
        };
        for cmd in cfg.setup.commands {
            log.line(&format!("setup: {cmd}"));
            let out = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(&cmd)
                .current_dir(dir)
                .env("PWD", dir)
                .env("TASKBRIDGE_REPO", &task.repo)
                .env("TASKBRIDGE_TASK_ID", task.id.0.to_string())
                .stdin(std::process::Stdio::null())
                .output()
                .await;
            match out {
                Ok(o) => {
                    for l in String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .chain(String::from_utf8_lossy(&o.stderr).lines())
                    {
                        log.line(&format!("setup: {l}"));
                    }
                    if !o.status.success() {
                        return Some(format!("setup command `{cmd}` failed with {}", o.status));
                    }
                }
                Err(e) => return Some(format!("setup command `{cmd}` could not start: {e}")),
            }
        }
        None
    }

    /// The last stage: the agent finished and its checks passed. The work is committed on the
    /// task's branch (a read-only task's edits reverted first), files and diff come from git,
    /// and the directory is removed or kept as a spare.
    pub(super) async fn finish(
        &self,
        run: &Run<'_>,
        mut res: TaskResult,
        log: &mut TaskLog,
    ) -> Stage<Outcome> {
        let (task, dir) = (run.task, &run.dir);
        // A worktree removed under the agent (by hand, a clean-up script) took the work with it:
        // committing "nothing" would report lost work as done.
        if !git::is_worktree(dir) {
            let error = format!(
                "the worktree {} disappeared while the agent ran (removed from outside TaskBridge); \
                 the work in it is lost, so another attempt starts again from the task's start",
                dir.display()
            );
            log.line(&error);
            return Ok(Outcome::Failed {
                error,
                kind: queue::FailureKind::Worktree,
                result: Some(Box::new(res)),
                backoff_s: self.backoff(task.attempts),
            });
        }
        if task.readonly {
            let (repo, d, b) = (PathBuf::from(&task.repo), dir.clone(), run.branch.clone());
            let reverted = tokio::task::spawn_blocking(move || git::revert_all(&repo, &d, &b))
                .await
                .map_err(|e| Error::Join(e.to_string()))?;
            match reverted {
                Ok(files) => res.reverted_files = files,
                Err(Error::Tampered(what)) => res.tampered = Some(what),
                Err(e) => return Err(e.into()),
            }
            if !res.reverted_files.is_empty() {
                log.line(&format!("read-only task: reverted {}", res.reverted_files.join(", ")));
            }
        }
        if res.tampered.is_none() {
            self.fill_diff(run, &mut res, true).await;
        }
        if let Some(end) = tampered(&mut res) {
            return Ok(end);
        }
        if !task.readonly && res.files_touched.is_empty() && res.commit.is_none() {
            // Done, since the agent says so; the summary the planner reads says this first.
            res.no_changes = true;
        }
        if !task.worktree_keep {
            self.leave_worktree(run, log).await;
        }
        Ok(Outcome::Done { result: Box::new(res) })
    }

    /// A done task's directory: kept for this worker's next task of the repository (on a warm
    /// agent: OpenCode's server, an ACP agent, which set themselves up for it), else removed, with the session its turn made ahead there for that next task; the
    /// branch keeps the work either way.
    async fn leave_worktree(&self, run: &Run<'_>, log: &mut TaskLog) {
        let (task, dir) = (run.task, &run.dir);
        if run.serving() && self.keep_spare(&task.repo, dir, &run.branch).await {
            log.line(
                "work committed (the branch keeps it); the directory stays for this worker's \
                 next task of this repository, cleaned first",
            );
            return;
        }
        if let Some(server) = run.walled.shared_server() {
            server.forget_ready(dir).await;
        }
        if let Some(agent) = &run.walled.acp {
            agent.forget_ready(dir);
        }
        let (repo, d) = (PathBuf::from(&task.repo), dir.to_path_buf());
        match tokio::task::spawn_blocking(move || git::remove_worktree(&repo, &d)).await {
            Ok(Ok(())) => log.line("work committed; worktree removed (the branch keeps it)"),
            Ok(Err(e)) => log.line(&format!("could not remove the worktree: {e}")),
            Err(e) => log.line(&format!("could not remove the worktree: {e}")),
        }
    }

    /// Fills files_touched, diff and diffstat from git; with `commit`, first commits the work on
    /// the task branch. Errors are logged into the result's summary rather than losing it.
    /// A worktree whose git metadata the agent changed is not read: `res.tampered` says what
    /// changed, and the caller ends the run with [`tampered`].
    pub(super) async fn fill_diff(&self, run: &Run<'_>, res: &mut TaskResult, commit: bool) {
        let task = run.task;
        // Its own work only: against the commit it started from (its dependencies' work, when
        // it was stacked on them).
        let base = res.started_from.clone().unwrap_or_else(|| task.base.clone());
        let (repo, d, branch) = (PathBuf::from(&task.repo), run.dir.clone(), run.branch.clone());
        let message = format!("taskbridge: task {}: {}\n\n{}", task.id.0, task.title, res.summary);
        let out = tokio::task::spawn_blocking(move || -> crate::error::Result<_> {
            let checkout = git::Checkout::open(&repo, &d)?;
            let sha = if commit { checkout.commit_all(&branch, &message)? } else { None };
            Ok((sha, checkout.diff_against(&branch, &base)?))
        })
        .await;
        match out {
            Ok(Ok((sha, diff))) => {
                res.commit = sha;
                res.files_touched = diff.files;
                res.diff = diff.patch;
                res.diffstat = diff.stat;
            }
            Ok(Err(Error::Tampered(what))) => res.tampered = Some(what),
            Ok(Err(e)) => tracing::warn!(task = %task.id, error = %e, "diff failed"),
            Err(e) => tracing::warn!(task = %task.id, error = %e, "diff failed"),
        }
    }
}

/// The run's end when the agent changed the git metadata of its worktree: the task fails for
/// good, saying what changed (the worktree is left as it is, unread).
pub(super) fn tampered(res: &mut TaskResult) -> Option<Outcome> {
    let what = res.tampered.clone()?;
    let error = format!(
        "tampered: {what}. TaskBridge committed nothing and read nothing through it; the \
         worktree is left as the agent left it"
    );
    tracing::warn!("{error}");
    let result = Some(Box::new(std::mem::take(res)));
    Some(Outcome::FailedPermanently { error, kind: queue::FailureKind::Tampered, result })
}
