//! The task model and its state machine.
//!
//! ```text
//!             submit                      claim (deps all done, not_before passed)
//!   ───────────────▶ queued ───────────────────────────────────────▶ running
//!                    ▲  │ ▲                                            │ │ │ │
//!   retry (failed,   │  │ └── attempt failed, attempts left (backoff) ─┘ │ │ │
//!   cancelled) ──────┘  │ └── lease expired, attempts left ──────────────┘ │ │
//!                       │                                                  │ │
//!        answer ┌── waiting ◀──────────── agent asked a question ──────────┘ │
//!               │      │                                                     │
//!               ▼      ├── cancel ─▶ cancelled ◀── cancel (queued, or running│
//!             queued   └── question timeout ─▶ failed        via the worker) │
//!                                                                            ▼
//!                                        done ◀── success      failed ◀── attempts used up
//! ```
//!
//! A queued task whose dependencies are not all `done` is shown as `blocked` (a display state, not
//! a stored one). When a task ends `failed` or `cancelled`, every queued or waiting task that
//! depends on it, directly or not, fails in the same transaction with an error naming it.
//! `done`, `failed` and `cancelled` are terminal: only `retry` (failed, cancelled) leaves them.
//! Any other transition is refused with [`crate::Error::InvalidTransition`].

use serde::{Deserialize, Serialize};
use std::fmt;

/// Bounds that the store enforces on every submit.
pub const MAX_PROMPT_BYTES: usize = 256 * 1024;
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i64> = -100..=100;
pub const DEFAULT_MAX_ATTEMPTS: i64 = 2;
pub const DEFAULT_TIMEOUT_S: i64 = 3600;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskId(pub i64);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    Queued,
    Running,
    Waiting,
    Done,
    Failed,
    Cancelled,
}

impl TaskStatus {
    pub const ALL: [TaskStatus; 6] = [
        TaskStatus::Queued,
        TaskStatus::Running,
        TaskStatus::Waiting,
        TaskStatus::Done,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Queued => "queued",
            TaskStatus::Running => "running",
            TaskStatus::Waiting => "waiting",
            TaskStatus::Done => "done",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, TaskStatus::Done | TaskStatus::Failed | TaskStatus::Cancelled)
    }

    /// The state machine in one place: may a task in `self` move to `to`?
    pub fn can_become(self, to: TaskStatus) -> bool {
        use TaskStatus::*;
        matches!(
            (self, to),
            (Queued, Running)
                | (Queued, Cancelled)
                | (Queued, Failed) // a dependency failed or was cancelled
                | (Running, Done)
                | (Running, Failed)
                | (Running, Queued) // retry after a failed attempt, or an expired lease
                | (Running, Waiting)
                | (Running, Cancelled)
                | (Waiting, Queued) // answered
                | (Waiting, Cancelled)
                | (Waiting, Failed) // question timed out, or a dependency failed
                | (Failed, Queued) // retry
                | (Cancelled, Queued) // retry
        )
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TaskStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskStatus::ALL.into_iter().find(|st| st.as_str() == s).ok_or_else(|| {
            format!(
                "unknown status '{s}'; expected one of queued, blocked, running, waiting, done, \
                 failed, cancelled"
            )
        })
    }
}

/// A filter over displayed states: the stored states plus `blocked`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    Is(TaskStatus),
    Blocked,
}

impl std::str::FromStr for StatusFilter {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "blocked" { Ok(StatusFilter::Blocked) } else { s.parse().map(StatusFilter::Is) }
    }
}

/// A dependency named at submit time: an existing task, or an earlier (or any other) item of the
/// same batch by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DepRef {
    Task(TaskId),
    Batch(usize),
}

/// What a caller submits. `repo` and `base` arrive already resolved (the worker's git layer checks
/// that the repository exists and turns a ref into a commit): the queue stores facts, not guesses.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    pub title: Option<String>,
    pub prompt: String,
    pub repo: String,
    pub base: String,
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

impl TaskSpec {
    pub fn new(
        prompt: impl Into<String>,
        repo: impl Into<String>,
        base: impl Into<String>,
    ) -> Self {
        TaskSpec {
            title: None,
            prompt: prompt.into(),
            repo: repo.into(),
            base: base.into(),
            priority: 0,
            depends_on: Vec::new(),
            model: None,
            agent: None,
            readonly: false,
            no_network: false,
            no_shell: false,
            worktree_keep: false,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            timeout_s: DEFAULT_TIMEOUT_S,
            question_timeout_s: None,
            request_id: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Note {
    pub note: String,
    pub created_at: f64,
    /// Whether the agent has been given this note yet.
    pub delivered: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuestionRound {
    pub question: String,
    pub asked_at: f64,
    pub answer: Option<String>,
    pub answered_at: Option<f64>,
}

/// A task as stored, plus what is derived from its dependencies. This is also the stable `--json`
/// shape of `taskbridge show`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: TaskId,
    pub title: String,
    pub prompt: String,
    pub repo: String,
    pub base: String,
    pub priority: i64,
    pub depends_on: Vec<TaskId>,
    /// Dependencies that are not `done` yet; non-empty on a queued task means it is blocked.
    pub waiting_on: Vec<TaskId>,
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
    pub status: TaskStatus,
    /// `blocked` for a queued task with unfinished dependencies, else `status`.
    pub display_status: String,
    pub question: Option<String>,
    pub questions: Vec<QuestionRound>,
    pub notes: Vec<Note>,
    pub session_id: Option<String>,
    pub result: Option<serde_json::Value>,
    pub error: Option<String>,
    pub attempts: i64,
    pub worker: Option<String>,
    pub lease_until: Option<f64>,
    pub cancel_requested: bool,
    pub branch: Option<String>,
    pub worktree: Option<String>,
    pub created_at: f64,
    pub started_at: Option<f64>,
    pub finished_at: Option<f64>,
    pub updated_at: f64,
    /// A retry waits until this time (exponential backoff after a failed attempt).
    pub not_before: Option<f64>,
}

impl Task {
    pub fn is_blocked(&self) -> bool {
        self.status == TaskStatus::Queued && !self.waiting_on.is_empty()
    }
}

/// What a worker gets from a successful claim.
#[derive(Debug, Clone)]
pub struct Claim {
    pub task: Task,
    /// The fencing token: every later write for this run must present it.
    pub token: i64,
    /// Set when the task is resuming an agent session after a question was answered.
    pub resume: Option<Resume>,
    /// Notes not yet given to the agent; the claim marks them delivered.
    pub new_notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Resume {
    pub session_id: String,
    pub answer: String,
}

/// How a run ended, as reported by the worker holding the lease.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Done {
        result: serde_json::Value,
    },
    /// The attempt failed; the store requeues it with `backoff_s` delay while attempts remain.
    Failed {
        error: String,
        result: Option<serde_json::Value>,
        backoff_s: f64,
    },
    /// The attempt failed in a way another attempt cannot fix (e.g. the agent binary is missing).
    FailedPermanently {
        error: String,
        result: Option<serde_json::Value>,
    },
    Waiting {
        question: String,
        session_id: String,
        result: Option<serde_json::Value>,
    },
    Cancelled {
        result: Option<serde_json::Value>,
    },
    /// The worker is shutting down: the task goes back to the queue without using an attempt,
    /// and a pending answer is kept so the session still resumes.
    Released,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeartbeatReply {
    pub cancel_requested: bool,
    /// The lease's new end, by the database's clock.
    pub lease_until: f64,
}

/// A task whose lease expired; the caller kills the agent's process group if it is on this host.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reaped {
    pub id: TaskId,
    pub requeued: bool,
    pub agent_pid: Option<i64>,
    pub agent_started: Option<String>,
    pub worker_host: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    pub id: String,
    pub pid: i64,
    pub host: String,
    pub started_at: f64,
    pub heartbeat_at: f64,
    pub concurrency: i64,
    pub current_tasks: Vec<TaskId>,
    pub stopped: bool,
    /// No heartbeat for three intervals, and not stopped cleanly.
    pub stale: bool,
    /// What it drives: `opencode run` or `opencode serve` (`None` from an older binary).
    #[serde(default)]
    pub agent: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueStatus {
    pub counts: std::collections::BTreeMap<String, i64>,
    pub total: i64,
    pub oldest_queued_age_s: Option<f64>,
    pub workers: Vec<WorkerInfo>,
    pub workers_alive: usize,
    pub default_model: Option<String>,
}

/// A light projection of a task for long lists (the TUI's queue): no prompt, notes or result.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRow {
    pub id: TaskId,
    pub title: String,
    pub status: TaskStatus,
    pub priority: i64,
    pub repo: String,
    pub attempts: i64,
    pub max_attempts: i64,
    pub created_at: f64,
    pub started_at: Option<f64>,
    pub finished_at: Option<f64>,
    pub question: Option<String>,
    /// Unfinished dependencies: non-empty on a queued task means it is blocked.
    pub waiting_on: Vec<TaskId>,
}

impl TaskRow {
    pub fn display_status(&self) -> &'static str {
        if self.status == TaskStatus::Queued && !self.waiting_on.is_empty() {
            "blocked"
        } else {
            self.status.as_str()
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub status: Option<StatusFilter>,
    pub repo: Option<String>,
    pub limit: Option<usize>,
    pub offset: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_retry_leaves_a_terminal_state() {
        for from in TaskStatus::ALL.into_iter().filter(|s| s.is_terminal()) {
            for to in TaskStatus::ALL {
                let allowed = from.can_become(to);
                let expected = to == TaskStatus::Queued && from != TaskStatus::Done;
                assert_eq!(allowed, expected, "{from} -> {to}");
            }
        }
    }

    #[test]
    fn status_round_trips_through_its_name() {
        for s in TaskStatus::ALL {
            assert_eq!(s.as_str().parse::<TaskStatus>(), Ok(s));
        }
        assert_eq!("blocked".parse::<StatusFilter>(), Ok(StatusFilter::Blocked));
        assert!("bogus".parse::<TaskStatus>().unwrap_err().contains("expected one of"));
    }
}
