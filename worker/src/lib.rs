//! `taskbridge-worker`: turns queued tasks into commits.
//!
//! Where each responsibility lives:
//! - the claim loop (`claim_loop.rs`: claiming, leases and heartbeats, mirrors of remote
//!   repositories, recording outcomes) and its housekeeping (`housekeeping.rs`: reaping, dead
//!   workers on this host, parked requests nobody will answer, spare worktrees);
//! - one task's run as a pipeline of stages (`run/`: prepare the worktree, the prompt, the
//!   agent's turns with their checks and budgets, each turn's assessment, finish);
//! - configuration (`config.rs`: the worker's, a repository's `.taskbridge.toml`, the host's
//!   name; `opencode_config.rs`: what TaskBridge gives the OpenCode it runs);
//! - the agents behind one interface ([`agent`]: `AgentProtocol`, capabilities, programs):
//!   OpenCode's warm server (`agent/opencode_serve/`: the server, its routes, its event stream,
//!   parked requests) or `opencode run` (`agent/opencode_run.rs`), Claude Code
//!   (`agent/claude.rs`) and Codex (`agent/codex.rs`); their event streams (`events.rs`), the
//!   permission policy they all meet (`policy.rs`: the task's rules, grants, wildcards, the
//!   decision on a tool call), answers and reports (`decisions.rs`), failures explained
//!   (`diagnose.rs`), the models they offer ([`models`]) and process supervision ([`process`]);
//! - git (`git.rs`: worktrees, stacking, commits, diffs; `merge.rs`; `remote.rs`: the remote that
//!   lets workers on several hosts share a repository, and their mirrors of it);
//! - the checks of `[verify]` (`verify.rs`), reading what the agent said into the task's result
//!   (`result.rs`; the result's type, `TaskResult`, is the queue's), task log files
//!   ([`logs`]), notifications (`notify.rs`), metrics (`metrics.rs`: what `/metrics` serves)
//!   and traces (`trace.rs`), the user service that runs a worker without a terminal
//!   ([`service`]), `clear_finished` (`clear.rs`), and the `submit` and `followup`
//!   operations that resolve a repository before it reaches the queue (`submit.rs`).
//!
//! The front ends use what is re-exported here and the six public modules (the agents, logs,
//! models, processes, the sandbox, the service); the rest is private.
//!
//! It reads no environment variable itself: what the process was started with comes in
//! `WorkerConfig::env` (a `queue::Environment` the binary read once), and programs are found
//! on PATH only through `Environment::find_program`.
//!
//! It depends on `taskbridge-queue` and must not depend on the UI or MCP crates: those sit on top
//! of it and meet it only through the queue database.

pub mod agent;
mod claim_loop;
mod clear;
mod config;
mod decisions;
mod diagnose;
mod error;
mod events;
mod git;
mod housekeeping;
pub mod logs;
mod merge;
mod metrics;
pub mod models;
mod notify;
mod opencode_config;
mod policy;
pub mod process;
mod remote;
mod result;
mod run;
pub mod sandbox;
pub mod service;
mod submit;
mod trace;
mod verify;

pub use claim_loop::{RunningWorker, Worker};
pub use clear::clear_finished;

/// Kills the OpenCode servers of workers on this host that died, as far as their pid files
/// tell without the database (a worker that cannot open it still cleans up after the dead).
pub fn reap_orphaned_servers(home: &queue::Home) {
    agent::opencode_serve::kill_orphaned_servers(home, |_| true);
}
pub use config::{
    ConfiguredAgent, OpenCodeMode, RepoConfig, SandboxConfig, WorkerConfig, hostname,
};
pub use error::{Error, Result};
pub use events::RunLog;
pub use git::{ResolvedRepo, WorkDiff, diff_against_base, resolve_repo};
pub use merge::{MergeReport, Overlap, merge_task, overlaps};
pub use metrics::{CONTENT_TYPE as METRICS_CONTENT_TYPE, render as render_metrics};
pub use notify::{NotifyConfig, install_tls};
pub use opencode_config::{
    BRIDGE_MCP_NAME, headless as headless_opencode_config, registered_bridge_unoffered,
};
pub use result::{TaskResult, question_options};
pub use submit::{SubmitRequest, Submitted, followup, submit, submit_batch};
pub use trace::enable as enable_traces;

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
