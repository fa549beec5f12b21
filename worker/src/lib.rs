//! `taskbridge-worker`: turns queued tasks into commits.
//!
//! It owns the claim loop and process supervision ([`runner`], [`process`]), the agents: OpenCode's
//! warm server ([`serve`]) or `opencode run`, with their decisions ([`decisions`]); git
//! (worktrees, stacking, commits, diffs and merges: [`git`], [`merge`]; the remote that lets
//! workers on several hosts share a repository, and their mirrors of it: [`remote`]); reading
//! OpenCode's event stream ([`events`]), the checks of `[verify]` ([`verify`]), the structured result ([`result`]),
//! task log files ([`logs`]), notifications ([`notify`]), the user service that runs a worker
//! without a terminal ([`service`]) and the `submit` and `followup` operations that resolve a
//! repository before it reaches the queue ([`submit`]).
//!
//! It depends on `taskbridge-queue` and must not depend on the UI or MCP crates: those sit on top
//! of it and meet it only through the queue database.

pub mod agent;
pub mod claude;
pub mod clear;
pub mod codex;
pub mod decisions;
pub mod diagnose;
pub mod error;
pub mod events;
pub mod git;
pub mod logs;
pub mod merge;
pub mod models;
pub mod notify;
pub mod process;
pub mod remote;
pub mod result;
pub mod runner;
pub mod serve;
pub mod service;
pub mod submit;
pub mod verify;

pub use error::{Error, Result};
pub use result::TaskResult;
pub use runner::{OpenCodeMode, RunningWorker, Worker, WorkerConfig};
pub use submit::{SubmitRequest, Submitted, followup, submit, submit_batch};

/// A task as the queue would hand it over, for the unit tests' decisions.
#[cfg(test)]
pub(crate) fn sample_task() -> queue::Task {
    #[allow(clippy::unwrap_used)]
    serde_json::from_value(serde_json::json!({
        "id": 1, "title": "t", "prompt": "p", "repo": "/r", "base": "b", "priority": 0,
        "depends_on": [], "waiting_on": [], "model": null, "agent": null, "readonly": false,
        "no_network": false, "no_shell": false, "worktree_keep": false, "max_attempts": 1,
        "timeout_s": 1, "question_timeout_s": null, "request_id": null, "status": "queued",
        "display_status": "queued", "question": null, "questions": [], "notes": [],
        "session_id": null, "result": null, "error": null, "attempts": 0, "worker": null,
        "lease_until": null, "cancel_requested": false, "branch": null, "worktree": null,
        "created_at": 0.0, "started_at": null, "finished_at": null, "updated_at": 0.0,
        "not_before": null
    }))
    .unwrap()
}
