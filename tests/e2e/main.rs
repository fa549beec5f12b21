//! The end-to-end suite: the real binary driven as its users drive it, one module per
//! subject (each module's own doc says what it covers). One test binary, not one per file, so
//! that the tests of every subject share the test threads (a subject whose last test is a long
//! one no longer holds the rest back) and the suite links once. `tests/pg_outage.rs` keeps a
//! binary of its own: it restarts the PostgreSQL server the others share.
#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod acp;
mod agents;
mod claude_bridge;
mod claude_today;
mod cli;
mod clients;
mod config;
mod conformance;
mod crash;
mod doctor;
mod faults;
mod hosts;
mod mcp_python;
mod mcp_tasks;
mod observe;
mod paths;
mod plans;
mod public;
mod sandbox;
mod serve_native;
mod tamper;
mod trust;
mod tui_tmux;
mod worker_e2e;
mod worktrees;
