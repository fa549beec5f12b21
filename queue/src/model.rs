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

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;

pub use crate::failure::FailureKind;

/// Bounds that the store enforces on every submit.
pub const MAX_PROMPT_BYTES: usize = 256 * 1024;
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i64> = -100..=100;
pub const DEFAULT_MAX_ATTEMPTS: i64 = 2;
pub const DEFAULT_TIMEOUT_S: i64 = 3600;

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct TaskId(pub i64);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
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
    /// Permission requests that wait for an answer instead of being allowed or denied, each
    /// `PERMISSION[:PATTERN]` (see [`parse_ask_rule`]).
    pub ask: Vec<String>,
    pub budget: Budget,
    /// The branch the task was submitted from, when it was on one (what `merge_task` merges
    /// into by default).
    pub base_ref: Option<String>,
    /// The git remote every worker can fetch the base from (and pushes the task's branch to
    /// when it runs from a mirror), for a queue shared by several hosts.
    pub remote: Option<String>,
    /// A follow-up: the task whose session it resumes (`session_id`) and whose commit is its
    /// `base`.
    pub parent: Option<TaskId>,
    pub session_id: Option<String>,
    /// The host whose agent keeps `session_id` (a follow-up's parent ran there).
    pub session_host: Option<String>,
}

/// A spending limit: the agent is interrupted when its spend passes either.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Budget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Input plus output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<i64>,
}

impl Budget {
    pub fn is_set(&self) -> bool {
        self.max_cost_usd.is_some() || self.max_tokens.is_some()
    }
}

/// The permissions OpenCode asks about; an `ask` rule must name one of them (or `*`).
pub const PERMISSIONS: &[&str] = &[
    "*",
    "read",
    "edit",
    "glob",
    "grep",
    "list",
    "bash",
    "task",
    "external_directory",
    "todowrite",
    "todoread",
    "webfetch",
    "websearch",
    "codesearch",
    "lsp",
    "skill",
    "doom_loop",
];

/// `PERMISSION[:PATTERN]` as (permission, pattern); the pattern defaults to `*`.
pub fn parse_ask_rule(rule: &str) -> Result<(String, String), String> {
    let (perm, pattern) = match rule.split_once(':') {
        Some((p, pat)) => (p.trim(), pat.trim()),
        None => (rule.trim(), "*"),
    };
    if !PERMISSIONS.contains(&perm) {
        return Err(format!(
            "'{rule}' names no permission; write PERMISSION[:PATTERN] with one of {} (for \
             example bash:'git push*' or external_directory)",
            PERMISSIONS[1..].join(", ")
        ));
    }
    if pattern.is_empty() {
        return Err(format!("'{rule}' has an empty pattern; leave out ':' to mean every one"));
    }
    Ok((perm.to_owned(), pattern.to_owned()))
}

/// A task's budgets as they stand, for the worker that checks its spend.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BudgetState {
    pub own: Budget,
    pub batch: Option<BatchBudget>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchBudget {
    pub budget: Budget,
    /// What the batch's other tasks have spent (their recorded usage).
    pub others_cost_usd: f64,
    pub others_tokens: i64,
}

impl BudgetState {
    /// The first budget that `cost_usd` and `tokens` (this task's spend) pass, if any.
    pub fn passed(&self, cost_usd: f64, tokens: i64) -> Option<BudgetStop> {
        let own = (self.own, 0.0, 0, "task");
        let batch =
            self.batch.as_ref().map(|b| (b.budget, b.others_cost_usd, b.others_tokens, "batch"));
        for (budget, other_cost, other_tokens, scope) in std::iter::once(own).chain(batch) {
            if let Some(max) = budget.max_cost_usd
                && cost_usd + other_cost > max
            {
                return Some(BudgetStop {
                    limit: "cost".into(),
                    scope: scope.into(),
                    spent: cost_usd + other_cost,
                    max,
                    original: max,
                });
            }
            if let Some(max) = budget.max_tokens
                && tokens + other_tokens > max
            {
                return Some(BudgetStop {
                    limit: "tokens".into(),
                    scope: scope.into(),
                    spent: (tokens + other_tokens) as f64,
                    max: max as f64,
                    original: max as f64,
                });
            }
        }
        None
    }
}

/// What a waiting task waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AskKind {
    /// The agent asked (its own question tool, or the prompt-level block).
    Question,
    /// The agent wants to do something a rule says needs approval.
    Permission,
    /// The agent's spend passed its budget.
    Budget,
}

/// One of the agent's structured questions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentQuestion {
    pub question: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    #[serde(default)]
    pub options: Vec<QuestionOption>,
    /// Several options may be chosen.
    #[serde(default)]
    pub multiple: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QuestionOption {
    pub label: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A permission the agent asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PermissionAsk {
    pub permission: String,
    pub patterns: Vec<String>,
    /// The command or path, from the request's metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// What `always` approves from now on (the agent's own suggestion, e.g. `git push *`).
    #[serde(default)]
    pub always: Vec<String>,
}

/// A budget the agent's spend passed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BudgetStop {
    /// `cost` (USD) or `tokens`.
    pub limit: String,
    /// `task`, or `batch` when the budget is shared by a batch's tasks.
    pub scope: String,
    pub spent: f64,
    pub max: f64,
    /// The budget as first given: `continue` raises the limit by this much.
    pub original: f64,
}

/// The decision a waiting task needs, structured for clients that offer choices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Ask {
    pub kind: AskKind,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub questions: Vec<AgentQuestion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission: Option<PermissionAsk>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetStop>,
    /// The answers that are accepted, when not free text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<String>,
    /// The agent's own request id, while the agent is blocked on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// An answer, read against the decision it answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Per question, the chosen labels or one free text.
    Question(Vec<Vec<String>>),
    PermissionOnce,
    PermissionAlways,
    PermissionReject {
        feedback: Option<String>,
    },
    /// `continue` (None: raise by the original amount) or `continue X`.
    BudgetContinue(Option<f64>),
    BudgetStop,
}

impl Ask {
    pub fn question(questions: Vec<AgentQuestion>) -> Ask {
        Ask {
            kind: AskKind::Question,
            questions,
            permission: None,
            budget: None,
            choices: vec![],
            request_id: None,
        }
    }

    pub fn permission(p: PermissionAsk) -> Ask {
        Ask {
            kind: AskKind::Permission,
            questions: vec![],
            permission: Some(p),
            budget: None,
            choices: vec!["once".into(), "always".into(), "reject".into()],
            request_id: None,
        }
    }

    pub fn budget(b: BudgetStop) -> Ask {
        Ask {
            kind: AskKind::Budget,
            questions: vec![],
            permission: None,
            budget: Some(b),
            choices: vec!["continue".into(), "stop".into()],
            request_id: None,
        }
    }

    /// The decision in one readable text (the task's `question`).
    /// What was asked, without how to answer it (for saying what an answer did).
    pub fn subject(&self) -> String {
        match (self.kind, &self.permission) {
            (AskKind::Permission, Some(p)) => {
                let what = p.target.clone().unwrap_or_else(|| p.patterns.join(", "));
                format!("permission to {}: {what}", p.permission)
            }
            _ => self.text(),
        }
    }

    pub fn text(&self) -> String {
        match self.kind {
            AskKind::Question => {
                let mut out = String::new();
                for q in &self.questions {
                    if !out.is_empty() {
                        out.push('\n');
                    }
                    out.push_str(&q.question);
                    if !q.options.is_empty() {
                        let labels: Vec<&str> =
                            q.options.iter().map(|o| o.label.as_str()).collect();
                        let how = if q.multiple { "one or more of" } else { "one of" };
                        out.push_str(&format!(" ({how}: {})", labels.join(", ")));
                    }
                }
                out
            }
            AskKind::Permission => {
                let p = self.permission.as_ref();
                let perm = p.map(|p| p.permission.as_str()).unwrap_or("?");
                let what = p
                    .and_then(|p| p.target.clone())
                    .unwrap_or_else(|| p.map(|p| p.patterns.join(", ")).unwrap_or_default());
                format!(
                    "permission to {perm}: {what} (answer once, always, reject, or reject: \
                     <what to do instead>)"
                )
            }
            AskKind::Budget => match &self.budget {
                Some(b) if b.limit == "cost" => format!(
                    "spent {} of {} ({} budget); answer continue, continue <new limit \
                     in USD>, or stop",
                    usd(b.spent),
                    usd(b.max),
                    b.scope
                ),
                Some(b) => format!(
                    "used {} of {} tokens ({} budget); answer continue, continue <new limit>, \
                     or stop",
                    b.spent, b.max, b.scope
                ),
                None => "budget reached; answer continue or stop".into(),
            },
        }
    }

    /// Reads `answer`, or says what an answer to this decision must look like.
    pub fn parse_answer(&self, answer: &str) -> Result<Answer, String> {
        let a = answer.trim();
        match self.kind {
            AskKind::Question => Ok(Answer::Question(self.question_answers(a))),
            AskKind::Permission => {
                let lower = a.to_ascii_lowercase();
                match lower.as_str() {
                    "once" | "allow" | "yes" => Ok(Answer::PermissionOnce),
                    "always" => Ok(Answer::PermissionAlways),
                    "reject" | "no" | "deny" => Ok(Answer::PermissionReject { feedback: None }),
                    _ if lower.starts_with("reject:") => {
                        let text = a["reject:".len()..].trim();
                        Ok(Answer::PermissionReject {
                            feedback: (!text.is_empty()).then(|| text.to_owned()),
                        })
                    }
                    _ => Err(format!(
                        "'{a}' is not an answer to a permission request; answer once (allow \
                         this one), always (allow it for the rest of this task), reject (stop \
                         the turn) or reject: <what to do instead>"
                    )),
                }
            }
            AskKind::Budget => {
                let lower = a.to_ascii_lowercase();
                if lower == "stop" {
                    return Ok(Answer::BudgetStop);
                }
                let Some(rest) = lower.strip_prefix("continue") else {
                    return Err(format!(
                        "'{a}' is not an answer to a budget stop; answer continue (raise the \
                         limit by the original amount), continue <new limit> or stop"
                    ));
                };
                let rest = rest.trim().trim_start_matches('$');
                if rest.is_empty() {
                    return Ok(Answer::BudgetContinue(None));
                }
                let new: f64 = rest.parse().map_err(|_| {
                    format!("'{rest}' is not a number; write continue 2.00 to set a new limit")
                })?;
                let spent = self.budget.as_ref().map(|b| b.spent).unwrap_or(0.0);
                if new <= spent {
                    return Err(format!(
                        "a limit of {new} is not above what is already spent ({spent}); give \
                         a higher one, or answer stop"
                    ));
                }
                Ok(Answer::BudgetContinue(Some(new)))
            }
        }
    }

    /// Per question: the labels the answer names (a label, or several separated by commas when
    /// several may be chosen), else the answer as free text. With several questions, each line
    /// answers the next one.
    fn question_answers(&self, answer: &str) -> Vec<Vec<String>> {
        if self.questions.is_empty() {
            return vec![vec![answer.to_owned()]];
        }
        let lines: Vec<&str> = if self.questions.len() > 1 {
            answer.lines().map(str::trim).filter(|l| !l.is_empty()).collect()
        } else {
            vec![answer]
        };
        self.questions
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let line = lines.get(i).copied().unwrap_or("").trim();
                let label = |s: &str| {
                    q.options
                        .iter()
                        .find(|o| o.label.eq_ignore_ascii_case(s.trim()))
                        .map(|o| o.label.clone())
                };
                if let Some(l) = label(line) {
                    return vec![l];
                }
                if q.multiple {
                    let parts: Option<Vec<String>> = line.split(',').map(label).collect();
                    if let Some(parts) = parts.filter(|p| !p.is_empty()) {
                        return parts;
                    }
                }
                vec![line.to_owned()]
            })
            .collect()
    }
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
            ask: Vec::new(),
            budget: Budget::default(),
            base_ref: None,
            remote: None,
            parent: None,
            session_id: None,
            session_host: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Note {
    pub note: String,
    pub created_at: f64,
    /// Whether the agent has been given this note yet.
    pub delivered: bool,
    /// The task ended before the agent's next step: it never saw this note.
    #[serde(default)]
    pub ended_first: bool,
}

impl Note {
    /// What to show after the note: nothing once delivered.
    pub fn marker(&self) -> &'static str {
        match (self.delivered, self.ended_first) {
            (true, _) => "",
            (false, true) => " (not delivered: the task ended first)",
            (false, false) => " (not yet delivered)",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QuestionRound {
    pub question: String,
    pub asked_at: f64,
    pub answer: Option<String>,
    pub answered_at: Option<f64>,
    /// The structured decision (absent for a prompt-level question).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<Ask>,
    /// Who answered: `mcp` (with the client's name), `cli`, `tui`, or `rule` for an `always`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
}

/// A task as stored, plus what is derived from its dependencies. This is also the stable `--json`
/// shape of `taskbridge show`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    /// The pending decision, structured, while the task is waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<Ask>,
    pub questions: Vec<QuestionRound>,
    pub notes: Vec<Note>,
    /// Permission requests that wait for an answer (`PERMISSION[:PATTERN]`).
    #[serde(default)]
    pub ask_rules: Vec<String>,
    /// The task's own budget (raised by a `continue`).
    #[serde(default)]
    pub budget: Budget,
    /// The batch budget this task shares, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_group: Option<i64>,
    /// The branch it was submitted from (`merge_task`'s default target).
    #[serde(default)]
    pub base_ref: Option<String>,
    /// The git remote its base can be fetched from and its branch is pushed to by a worker on
    /// another host.
    #[serde(default)]
    pub remote: Option<String>,
    /// The host of the worker that runs (or last ran) it: where its full log is.
    #[serde(default)]
    pub worker_host: Option<String>,
    /// The commit its branch started from: `base`, or its dependencies' work.
    #[serde(default)]
    pub started_from: Option<String>,
    /// The dependencies whose work it started from.
    #[serde(default)]
    pub stacked_on: Vec<TaskId>,
    #[serde(default)]
    pub merged_into: Option<String>,
    #[serde(default)]
    pub merge_commit: Option<String>,
    /// Tasks that depend on this one.
    #[serde(default)]
    pub dependents: Vec<TaskId>,
    /// The task this one follows up (its session and its commit).
    #[serde(default)]
    pub parent: Option<TaskId>,
    /// Follow-ups of this task.
    #[serde(default)]
    pub followups: Vec<TaskId>,
    pub session_id: Option<String>,
    pub result: Option<crate::TaskResult>,
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
    /// How long the task had been ready to run (submitted, its retry delay over, its
    /// dependencies done, its decision answered) when this claim took it.
    pub queue_wait_s: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Resume {
    pub session_id: String,
    pub answer: String,
    /// The structured decision that was answered (`None`: a prompt-level question).
    pub ask: Option<Ask>,
}

/// How a run ended, as reported by the worker holding the lease.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Done {
        result: Box<crate::TaskResult>,
    },
    /// The attempt failed; the store requeues it with `backoff_s` delay while attempts remain.
    Failed {
        error: String,
        kind: FailureKind,
        result: Option<Box<crate::TaskResult>>,
        backoff_s: f64,
    },
    /// The attempt failed in a way another attempt cannot fix (e.g. the agent binary is missing).
    FailedPermanently {
        error: String,
        kind: FailureKind,
        result: Option<Box<crate::TaskResult>>,
    },
    Waiting {
        question: String,
        session_id: String,
        result: Option<Box<crate::TaskResult>>,
        /// The structured decision; with a `request_id`, the agent is blocked on it in this
        /// worker's server, and only this worker resumes the task while it lives.
        ask: Option<Box<Ask>>,
    },
    Cancelled {
        result: Option<Box<crate::TaskResult>>,
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

/// An agent process a dead worker left running on some host.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Orphan {
    pub pid: i64,
    /// Its start time as the OS reported it, so that a reused pid is not taken for it.
    pub started: Option<String>,
    pub task: Option<TaskId>,
}

/// A task the sweep ended or handed back: its lease expired (its agent, if it had one, waits
/// in the queue's orphans for a worker on its host, [`crate::Store::take_orphans`]), or its
/// question went unanswered past its `question_timeout_s`.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Reaped {
    pub id: TaskId,
    /// Queued again for another attempt; otherwise the task failed.
    pub requeued: bool,
    pub question_timed_out: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    /// The agents it can run: `opencode`, and `claude-code` and `codex` when their CLIs are on
    /// its host (empty from an older binary: OpenCode only).
    #[serde(default)]
    pub agents: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QueueStatus {
    pub counts: std::collections::BTreeMap<String, i64>,
    pub total: i64,
    pub oldest_queued_age_s: Option<f64>,
    pub workers: Vec<WorkerInfo>,
    pub workers_alive: usize,
    pub default_model: Option<String>,
    /// What tasks active today (local time) have spent, in all and per state.
    #[serde(default)]
    pub spend_today: Spend,
    /// The queue is paused (`pause_queue`): workers finish what runs and claim nothing new.
    #[serde(default)]
    pub paused: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Spend {
    pub cost_usd: f64,
    /// Input plus output tokens.
    pub tokens: i64,
    pub cost_usd_by_status: std::collections::BTreeMap<String, f64>,
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
    /// The pending decision, structured, while the task waits.
    pub ask: Option<Box<Ask>>,
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

/// An amount in US dollars as people read small spends: cents for a dollar or more, else two
/// significant digits (`$0.0031`, not `$0.00`; up to three, `$0.0123`), never fewer than two
/// decimals.
pub fn usd(amount: f64) -> String {
    if !amount.is_finite() || amount == 0.0 {
        return "$0.00".into();
    }
    let magnitude = amount.abs().log10().floor() as i32;
    let decimals = (2 - magnitude).clamp(2, 8) as usize;
    let mut s = format!("{amount:.decimals$}");
    // Trailing zeros go while more than two decimals are left.
    while s.ends_with('0') && s.len() - s.find('.').unwrap_or(0) > 3 {
        s.pop();
    }
    match s.strip_prefix('-') {
        Some(rest) => format!("-${rest}"),
        None => format!("${s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permissions_subject_leaves_out_how_to_answer_and_a_notes_marker_says_where_it_is() {
        let ask = Ask::permission(PermissionAsk {
            permission: "bash".into(),
            patterns: vec!["echo deploy-prod".into()],
            target: None,
            always: vec![],
        });
        assert_eq!(ask.subject(), "permission to bash: echo deploy-prod");
        assert!(ask.text().starts_with(&ask.subject()) && ask.text().contains("answer once"));
        let note = |delivered, ended_first| Note {
            note: "n".into(),
            created_at: 0.0,
            delivered,
            ended_first,
        };
        assert_eq!(note(true, false).marker(), "");
        assert_eq!(note(false, false).marker(), " (not yet delivered)");
        assert_eq!(note(false, true).marker(), " (not delivered: the task ended first)");
    }

    #[test]
    fn small_spends_show_their_significant_digits() {
        let shown: Vec<String> =
            [0.0, 0.0031, 0.003, 0.00314159, 0.0123, 0.03, 0.5, 1.0, 12.345, -0.0042]
                .map(usd)
                .into();
        assert_eq!(
            shown,
            [
                "$0.00", "$0.0031", "$0.003", "$0.00314", "$0.0123", "$0.03", "$0.50", "$1.00",
                "$12.35", "-$0.0042"
            ]
        );
    }

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
    fn an_answer_picks_labels_or_is_free_text() {
        let opt = |l: &str| QuestionOption { label: l.into(), description: None };
        let q = |multiple| AgentQuestion {
            question: "Which?".into(),
            header: None,
            options: vec![opt("Red"), opt("Blue"), opt("Green")],
            multiple,
        };
        let one = Ask::question(vec![q(false)]);
        assert_eq!(one.parse_answer(" blue "), Ok(Answer::Question(vec![vec!["Blue".into()]])));
        assert_eq!(
            one.parse_answer("red, blue"),
            Ok(Answer::Question(vec![vec!["red, blue".into()]])),
            "one choice only: the text as it is"
        );
        let several = Ask::question(vec![q(true)]);
        assert_eq!(
            several.parse_answer("red, green"),
            Ok(Answer::Question(vec![vec!["Red".into(), "Green".into()]]))
        );
        assert_eq!(
            several.parse_answer("red and a bit of teal"),
            Ok(Answer::Question(vec![vec!["red and a bit of teal".into()]]))
        );
        let two = Ask::question(vec![q(false), q(true)]);
        assert_eq!(
            two.parse_answer("green\nblue, red"),
            Ok(Answer::Question(vec![vec!["Green".into()], vec!["Blue".into(), "Red".into()]]))
        );
    }

    #[test]
    fn permission_and_budget_answers_take_their_words_only() {
        let p = Ask::permission(PermissionAsk {
            permission: "bash".into(),
            patterns: vec!["x".into()],
            target: None,
            always: vec![],
        });
        assert_eq!(p.parse_answer("ONCE"), Ok(Answer::PermissionOnce));
        assert_eq!(p.parse_answer("reject:"), Ok(Answer::PermissionReject { feedback: None }));
        assert_eq!(
            p.parse_answer("reject: not on main"),
            Ok(Answer::PermissionReject { feedback: Some("not on main".into()) })
        );
        assert!(p.parse_answer("ok").is_err());
        let b = Ask::budget(BudgetStop {
            limit: "tokens".into(),
            scope: "task".into(),
            spent: 120.0,
            max: 100.0,
            original: 100.0,
        });
        assert_eq!(b.parse_answer("continue"), Ok(Answer::BudgetContinue(None)));
        assert_eq!(b.parse_answer("continue 500"), Ok(Answer::BudgetContinue(Some(500.0))));
        assert!(b.parse_answer("continue lots").unwrap_err().contains("not a number"));
        assert!(b.parse_answer("continue 100").unwrap_err().contains("already spent"));
        assert_eq!(b.parse_answer("Stop"), Ok(Answer::BudgetStop));
    }

    #[test]
    fn status_round_trips_through_its_name() {
        for s in TaskStatus::ALL {
            assert_eq!(s.as_str().parse::<TaskStatus>(), Ok(s));
        }
        assert_eq!("blocked".parse::<StatusFilter>(), Ok(StatusFilter::Blocked));
        assert!("bogus".parse::<TaskStatus>().unwrap_err().contains("expected one of"));
    }

    #[test]
    fn a_budget_is_passed_only_above_its_limit_and_a_batch_counts_its_other_tasks() {
        let b = |cost: Option<f64>, tokens: Option<i64>| Budget {
            max_cost_usd: cost,
            max_tokens: tokens,
        };
        assert!(!b(None, None).is_set());
        assert!(b(Some(1.0), None).is_set() && b(None, Some(10)).is_set());
        let own = BudgetState { own: b(Some(1.0), Some(100)), batch: None };
        assert_eq!(own.passed(1.0, 100), None, "at the limit is not past it");
        let stop = own.passed(1.5, 10).unwrap();
        assert_eq!(
            (stop.limit.as_str(), stop.scope.as_str(), stop.spent, stop.max, stop.original),
            ("cost", "task", 1.5, 1.0, 1.0)
        );
        let stop = own.passed(0.5, 101).unwrap();
        assert_eq!(
            (stop.limit.as_str(), stop.scope.as_str(), stop.spent, stop.max),
            ("tokens", "task", 101.0, 100.0)
        );
        assert_eq!(BudgetState::default().passed(1e9, i64::MAX / 2), None);
        let batch = BudgetState {
            own: b(None, None),
            batch: Some(BatchBudget {
                budget: b(Some(2.0), Some(1_000)),
                others_cost_usd: 1.5,
                others_tokens: 900,
            }),
        };
        assert_eq!(batch.passed(0.5, 100), None, "together exactly at the limits");
        let stop = batch.passed(0.75, 0).unwrap();
        assert_eq!((stop.limit.as_str(), stop.scope.as_str(), stop.spent), ("cost", "batch", 2.25));
        let stop = batch.passed(0.0, 101).unwrap();
        assert_eq!(
            (stop.limit.as_str(), stop.scope.as_str(), stop.spent),
            ("tokens", "batch", 1001.0)
        );
    }

    #[test]
    fn the_state_machine_allows_exactly_its_moves() {
        use TaskStatus::*;
        let allowed: Vec<(TaskStatus, TaskStatus)> = TaskStatus::ALL
            .into_iter()
            .flat_map(|a| TaskStatus::ALL.into_iter().map(move |b| (a, b)))
            .filter(|(a, b)| a.can_become(*b))
            .collect();
        assert_eq!(
            allowed,
            vec![
                (Queued, Running),
                (Queued, Failed),
                (Queued, Cancelled),
                (Running, Queued),
                (Running, Waiting),
                (Running, Done),
                (Running, Failed),
                (Running, Cancelled),
                (Waiting, Queued),
                (Waiting, Failed),
                (Waiting, Cancelled),
                (Failed, Queued),
                (Cancelled, Queued),
            ]
        );
        let terminal: Vec<TaskStatus> =
            TaskStatus::ALL.into_iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(terminal, vec![Done, Failed, Cancelled]);
    }

    #[test]
    fn only_a_queued_task_with_unfinished_dependencies_is_blocked() {
        let row = |status, waiting_on: Vec<TaskId>| {
            let mut t: Task = serde_json::from_value(serde_json::json!({
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
            .unwrap();
            t.status = status;
            t.waiting_on = waiting_on;
            t
        };
        assert!(row(TaskStatus::Queued, vec![TaskId(2)]).is_blocked());
        assert!(!row(TaskStatus::Queued, vec![]).is_blocked());
        assert!(!row(TaskStatus::Running, vec![TaskId(2)]).is_blocked());
        let list_row = |status, waiting_on: Vec<TaskId>| TaskRow {
            id: TaskId(1),
            title: "t".into(),
            status,
            priority: 0,
            repo: "/r".into(),
            attempts: 0,
            max_attempts: 1,
            created_at: 0.0,
            started_at: None,
            finished_at: None,
            question: None,
            waiting_on,
            ask: None,
        };
        assert_eq!(list_row(TaskStatus::Queued, vec![TaskId(2)]).display_status(), "blocked");
        assert_eq!(list_row(TaskStatus::Queued, vec![]).display_status(), "queued");
        assert_eq!(list_row(TaskStatus::Waiting, vec![TaskId(2)]).display_status(), "waiting");
    }

    #[test]
    fn an_ask_rule_names_a_permission_and_maybe_a_pattern() {
        assert_eq!(parse_ask_rule("bash: git push* "), Ok(("bash".into(), "git push*".into())));
        assert_eq!(
            parse_ask_rule(" external_directory "),
            Ok(("external_directory".into(), "*".into()))
        );
        assert_eq!(parse_ask_rule("*:x"), Ok(("*".into(), "x".into())));
        let err = parse_ask_rule("shell:rm").unwrap_err();
        assert!(
            err.contains("'shell:rm' names no permission") && err.contains("read, edit"),
            "{err}"
        );
        assert!(!err.contains("*, read"), "the wildcard is not offered as an example: {err}");
        assert!(parse_ask_rule("bash:").unwrap_err().contains("empty pattern"));
    }

    #[test]
    fn a_decisions_text_says_what_was_asked_and_how_to_answer() {
        let opt = |l: &str| QuestionOption { label: l.into(), description: None };
        let q = |text: &str, options, multiple| AgentQuestion {
            question: text.into(),
            header: None,
            options,
            multiple,
        };
        let ask = Ask::question(vec![
            q("Which DB?", vec![opt("SQLite"), opt("Postgres")], false),
            q("Which features?", vec![opt("a"), opt("b")], true),
            q("Anything else?", vec![], false),
        ]);
        assert_eq!(
            ask.text(),
            "Which DB? (one of: SQLite, Postgres)\nWhich features? (one or more of: a, b)\nAnything else?"
        );
        assert_eq!(ask.subject(), ask.text());
        let stop = |limit: &str| {
            Ask::budget(BudgetStop {
                limit: limit.into(),
                scope: "batch".into(),
                spent: 0.0123,
                max: 0.01,
                original: 0.01,
            })
        };
        assert_eq!(
            stop("cost").text(),
            "spent $0.0123 of $0.01 (batch budget); answer continue, continue <new limit in USD>, or stop"
        );
        assert!(stop("tokens").text().starts_with("used 0.0123 of 0.01 tokens (batch budget)"));
        let p = Ask::permission(PermissionAsk {
            permission: "edit".into(),
            patterns: vec!["a.rs".into(), "b.rs".into()],
            target: Some("/w/a.rs".into()),
            always: vec![],
        });
        assert!(p.text().starts_with("permission to edit: /w/a.rs (answer once"), "{}", p.text());
        assert_eq!(p.subject(), "permission to edit: /w/a.rs");
        let p = Ask::permission(PermissionAsk { target: None, ..p.permission.clone().unwrap() });
        assert_eq!(p.subject(), "permission to edit: a.rs, b.rs");
        assert!(p.text().starts_with("permission to edit: a.rs, b.rs (answer"));
    }

    #[test]
    fn every_answer_word_is_read_and_a_new_limit_may_carry_a_dollar_sign() {
        let p = Ask::permission(PermissionAsk {
            permission: "bash".into(),
            patterns: vec!["x".into()],
            target: None,
            always: vec![],
        });
        for w in ["once", "allow", "Yes"] {
            assert_eq!(p.parse_answer(w), Ok(Answer::PermissionOnce), "{w}");
        }
        assert_eq!(p.parse_answer(" always "), Ok(Answer::PermissionAlways));
        for w in ["reject", "no", "DENY"] {
            assert_eq!(p.parse_answer(w), Ok(Answer::PermissionReject { feedback: None }), "{w}");
        }
        assert_eq!(
            p.parse_answer("Reject: Use the Staging Branch"),
            Ok(Answer::PermissionReject { feedback: Some("Use the Staging Branch".into()) }),
            "the feedback keeps its case"
        );
        let b = Ask::budget(BudgetStop {
            limit: "cost".into(),
            scope: "task".into(),
            spent: 1.2,
            max: 1.0,
            original: 1.0,
        });
        assert_eq!(b.parse_answer("continue $2.50"), Ok(Answer::BudgetContinue(Some(2.5))));
        assert!(b.parse_answer("continue 1.2").unwrap_err().contains("not above"));
        assert!(b.parse_answer("go on").unwrap_err().contains("not an answer to a budget stop"));
        // A free answer to a question that offered nothing is the text itself.
        let free = Ask::question(vec![]);
        assert_eq!(
            free.parse_answer(" use SQLite "),
            Ok(Answer::Question(vec![vec!["use SQLite".into()]]))
        );
        let two = Ask::question(vec![
            AgentQuestion { question: "a".into(), header: None, options: vec![], multiple: false },
            AgentQuestion { question: "b".into(), header: None, options: vec![], multiple: true },
        ]);
        assert_eq!(
            two.parse_answer("first\n\n"),
            Ok(Answer::Question(vec![vec!["first".into()], vec!["".into()]])),
            "a question no line answers gets an empty answer"
        );
    }

    #[test]
    fn ids_and_statuses_print_as_users_read_them_and_one_question_keeps_a_long_answer_whole() {
        assert_eq!(TaskId(42).to_string(), "#42");
        assert_eq!(TaskStatus::Waiting.to_string(), "waiting");
        let one = Ask::question(vec![AgentQuestion {
            question: "Why?".into(),
            header: None,
            options: vec![],
            multiple: false,
        }]);
        assert_eq!(
            one.parse_answer("because\nit is faster"),
            Ok(Answer::Question(vec![vec!["because\nit is faster".into()]])),
            "one question: its answer may run over several lines"
        );
    }
}
