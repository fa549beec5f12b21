//! `taskbridge-queue`: the durable task queue every TaskBridge process shares.
//!
//! It owns the task model and its state machine ([`model`]), the SQLite store in which every state
//! transition is one `BEGIN IMMEDIATE` transaction ([`Store`]), the home directory layout with its
//! private permissions ([`Home`]), cross-process change notification ([`ChangeWatcher`]), and the
//! reverse bridge's Claude jobs ([`jobs`]).
//!
//! The database is the only channel between the MCP server, the worker, the TUI and the CLI, so
//! everything they need to agree on lives here. This crate is synchronous and must not depend on
//! tokio, git, the UI or MCP: async callers wrap it at their edges.

pub mod copy;
pub mod error;
pub mod home;
pub mod jobs;
pub mod location;
pub mod model;
mod pg;
mod pg_tls;
pub mod sql;
mod sqlite;
pub mod store;
pub mod watch;

pub use copy::copy_queue;
pub use error::{Error, Result};
pub use home::Home;
pub use jobs::{Job, JobId, JobOutcome, JobOwner, JobStatus};
pub use location::Location;
pub use model::*;
pub use store::{RunFacts, Store};
pub use watch::ChangeWatcher;
