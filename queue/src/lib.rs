//! `taskbridge-queue`: the durable task queue every TaskBridge process shares.
//!
//! It owns the task model and its state machine ([`model`]), the store in which every state
//! transition is one transaction ([`Store`]), written once over a small SQL seam ([`sql`]) for
//! two backends: a SQLite file (the default; `BEGIN IMMEDIATE`) and a PostgreSQL schema for
//! workers on several hosts (row locks, a `SKIP LOCKED` claim, LISTEN/NOTIFY), chosen by a
//! [`Location`]. Also the home directory layout with its private permissions ([`Home`]),
//! cross-process change notification ([`ChangeWatcher`]), the process environment as a value the
//! binary reads once and hands down ([`Environment`]: no library crate reads the environment),
//! a task's result ([`TaskResult`], stored as JSON with its spend in columns of its own, so no
//! query reads the JSON), why an attempt failed ([`FailureKind`]), what metrics and the TUI's
//! stats read (`store/stats.rs`: counts, lifetime counters, recent runs), the reverse bridge's
//! Claude jobs ([`jobs`]) and copying a whole queue between backends ([`copy`]).
//!
//! The database is the only channel between the MCP server, the worker, the TUI and the CLI, so
//! everything they need to agree on lives here. This crate is synchronous and must not depend on
//! tokio, git, the UI or MCP: async callers wrap it at their edges. (The `postgres` client it
//! uses runs a small runtime of its own inside; the crate calls it only from threads of its own,
//! see `pg::off_runtime`.)

pub mod copy;
mod environment;
pub mod error;
mod failure;
pub mod home;
pub mod jobs;
pub mod location;
pub mod model;
mod pg;
mod pg_tls;
pub mod result;
pub mod sql;
mod sqlite;
pub mod store;
pub mod watch;

pub use copy::copy_queue;
pub use environment::Environment;
pub use error::{Error, Result};
pub use home::{Home, create_private_dir};
pub use jobs::{Job, JobId, JobOutcome, JobOwner, JobStatus};
pub use location::Location;
pub use model::*;
pub use result::{
    AgentReport, Capabilities, Check, DiffStat, FileTouched, Permission, PermissionRequest,
    TaskResult, TestRun, Usage,
};
pub use sqlite::recover_commands;
pub use store::{FinishedTask, QueueCounts, Recent, RunFacts, Store};
pub use watch::ChangeWatcher;
