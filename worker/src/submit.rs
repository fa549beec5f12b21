//! The `submit` operation shared by the CLI, the MCP server and the TUI: resolve the repository
//! and ref with git, then enqueue.

use crate::error::Result;
use crate::git;
use queue::{Store, Task, TaskSpec};
use std::path::{Path, PathBuf};

/// A submit request as front ends receive it: the task, with a repository path and a ref that
/// are not checked yet. `resolve` fills `spec.repo` and `spec.base` from them.
#[derive(Debug, Clone)]
pub struct SubmitRequest {
    pub repo: PathBuf,
    /// Branch, tag or commit to start from; `HEAD` when `None`.
    pub base_ref: Option<String>,
    pub spec: TaskSpec,
}

impl SubmitRequest {
    pub fn new(prompt: impl Into<String>, repo: impl Into<PathBuf>) -> Self {
        SubmitRequest { repo: repo.into(), base_ref: None, spec: TaskSpec::new(prompt, "", "") }
    }

    /// Checks the repository and ref and produces the queue's spec.
    pub fn resolve(self, cwd: &Path) -> Result<TaskSpec> {
        let repo = if self.repo.is_absolute() { self.repo } else { cwd.join(&self.repo) };
        let resolved = git::resolve_repo(&repo, self.base_ref.as_deref())?;
        Ok(TaskSpec {
            repo: resolved.toplevel.display().to_string(),
            base: resolved.base,
            ..self.spec
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
