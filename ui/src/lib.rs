//! `taskbridge-ui`: the terminal control center.
//!
//! It owns the ratatui app: the keymap ([`keymap`]), actions ([`action`]), the model and its
//! update function ([`app`]), the pure view ([`view`]), the stats view's figures ([`stats`]) and the runtime that does the I/O
//! ([`runtime`]). Events become actions, actions update the model, the view draws it.
//!
//! It reads and writes the queue and uses the worker's git and log helpers. It must not depend on
//! the MCP crate: the TUI and the MCP server meet only through the queue database.

pub mod action;
pub mod app;
pub mod diff;
pub mod keymap;
mod outside;
pub mod runtime;
pub mod stats;
pub mod view;

pub use keymap::Keymap;
pub use runtime::{TuiOptions, run};
