//! The `submit` operation shared by the CLI, the MCP server and the TUI: resolve the repository
//! and ref with git, then enqueue.

use crate::error::Result;
use crate::git;
use queue::{DepRef, Store, Task, TaskSpec};
use std::path::{Path, PathBuf};

/// A submit request as front ends receive it: paths and refs not yet checked.
#[derive(Debug, Clone)]
pub struct SubmitRequest {
    pub prompt: String,
    pub repo: PathBuf,
    /// Branch, tag or commit to start from; `HEAD` when `None`.
    pub base_ref: Option<String>,
    pub title: Option<String>,
    pub priority: i64,
    pub depends_on: Vec<DepRef>,
    pub model: Option<String>,
    pub agent: Option<String>,
    pub readonly: bool,
    pub no_network: bool,
    pub no_shell: bool,
    pub worktree_keep: bool,
    pub max_attempts: i64,
    pub timeout_s: i64,
    pub question_timeout_s: Option<i64>,
    pub request_id: Option<String>,
}

impl SubmitRequest {
    pub fn new(prompt: impl Into<String>, repo: impl Into<PathBuf>) -> Self {
        SubmitRequest {
            prompt: prompt.into(),
            repo: repo.into(),
            base_ref: None,
            title: None,
            priority: 0,
            depends_on: Vec::new(),
            model: None,
            agent: None,
            readonly: false,
            no_network: false,
            no_shell: false,
            worktree_keep: false,
            max_attempts: queue::DEFAULT_MAX_ATTEMPTS,
            timeout_s: queue::DEFAULT_TIMEOUT_S,
            question_timeout_s: None,
            request_id: None,
        }
    }

    /// Checks the repository and ref and produces the queue's spec.
    pub fn resolve(self, cwd: &Path) -> Result<TaskSpec> {
        let repo = if self.repo.is_absolute() { self.repo.clone() } else { cwd.join(&self.repo) };
        let resolved = git::resolve_repo(&repo, self.base_ref.as_deref())?;
        Ok(TaskSpec {
            title: self.title,
            prompt: self.prompt,
            repo: resolved.toplevel.display().to_string(),
            base: resolved.base,
            priority: self.priority,
            depends_on: self.depends_on,
            model: self.model,
            agent: self.agent,
            readonly: self.readonly,
            no_network: self.no_network,
            no_shell: self.no_shell,
            worktree_keep: self.worktree_keep,
            max_attempts: self.max_attempts,
            timeout_s: self.timeout_s,
            question_timeout_s: self.question_timeout_s,
            request_id: self.request_id,
        })
    }
}

/// Submits several requests, all or none. The boolean is false for a task that already existed
/// under the same `request_id`.
pub fn submit_batch(
    store: &Store,
    cwd: &Path,
    reqs: Vec<SubmitRequest>,
) -> Result<Vec<(Task, bool)>> {
    let specs = reqs.into_iter().map(|r| r.resolve(cwd)).collect::<Result<Vec<_>>>()?;
    Ok(store.submit_batch(specs)?)
}

pub fn submit(store: &Store, cwd: &Path, req: SubmitRequest) -> Result<(Task, bool)> {
    let mut out = submit_batch(store, cwd, vec![req])?;
    out.pop().ok_or_else(|| crate::Error::Config("nothing was submitted".into()))
}
