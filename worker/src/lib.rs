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
