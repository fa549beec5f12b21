//! Why an attempt failed, as a kind a dashboard groups by (the error text beside it is for a
//! person).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Why an attempt failed, in a few words a dashboard can group by: the label of
/// `taskbridge_agent_errors_total` and the rows of the stats view's failures. Stored with the
/// task (its last failed attempt's) beside the error text a person reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The provider refused the credentials.
    Auth,
    /// The provider does not know the model.
    Model,
    /// The provider could not be reached.
    Connection,
    /// Any other error the agent or its provider reported.
    Provider,
    /// The agent's process exited non-zero without saying why.
    Exit,
    /// The run went past the task's timeout.
    Timeout,
    /// The repository's checks still failed after the fix rounds.
    Checks,
    /// The repository's set-up commands failed.
    Setup,
    /// The worktree could not be prepared, or went away under the agent.
    Worktree,
    /// The work of the task's dependencies conflicts.
    Conflict,
    /// The sandbox could not be raised, or the kernel cannot hold a rule the task asks for.
    Sandbox,
    /// The agent's program is missing or would not start.
    Launch,
    /// The repository could not be fetched (or is on no host a worker can reach).
    Repository,
    /// The work was done but could not be pushed to the task's remote.
    Push,
    /// The planner's answer rejected what the agent needed, or it asked without a session.
    Rejected,
    /// An error of the worker itself.
    Worker,
    /// The agent changed git metadata TaskBridge relies on (its worktree's `.git`, admin
    /// directory or HEAD); nothing was read or written through it.
    Tampered,
    /// It reached its budget and the answer was to stop.
    Budget,
}

impl FailureKind {
    pub const ALL: [FailureKind; 18] = [
        FailureKind::Auth,
        FailureKind::Model,
        FailureKind::Connection,
        FailureKind::Provider,
        FailureKind::Exit,
        FailureKind::Timeout,
        FailureKind::Checks,
        FailureKind::Setup,
        FailureKind::Worktree,
        FailureKind::Conflict,
        FailureKind::Sandbox,
        FailureKind::Launch,
        FailureKind::Repository,
        FailureKind::Push,
        FailureKind::Rejected,
        FailureKind::Worker,
        FailureKind::Tampered,
        FailureKind::Budget,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Auth => "auth",
            FailureKind::Model => "model",
            FailureKind::Connection => "connection",
            FailureKind::Provider => "provider",
            FailureKind::Exit => "exit",
            FailureKind::Timeout => "timeout",
            FailureKind::Checks => "checks",
            FailureKind::Setup => "setup",
            FailureKind::Worktree => "worktree",
            FailureKind::Conflict => "conflict",
            FailureKind::Sandbox => "sandbox",
            FailureKind::Launch => "launch",
            FailureKind::Repository => "repository",
            FailureKind::Push => "push",
            FailureKind::Rejected => "rejected",
            FailureKind::Worker => "worker",
            FailureKind::Tampered => "tampered",
            FailureKind::Budget => "budget",
        }
    }

    pub fn parse(s: &str) -> Option<FailureKind> {
        FailureKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
