//! The result of a task as the queue stores it and every front end reads it: one type from the
//! worker that assembles it to the MCP tool, the TUI and the CLI that show it. The worker fills
//! it (from what the agent said, checked against git and the event stream); the queue keeps it
//! as JSON beside the columns it sums (spend and tokens), so no query reads the JSON.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Stored with the task and returned by `get_task_result`. Every field has a default so results
/// written by older builds (or partial ones) still read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct TaskResult {
    pub summary: String,
    pub files_touched: Vec<FileTouched>,
    pub tests_run: Vec<TestRun>,
    pub open_questions: Vec<String>,
    /// Absent when empty (and in `get_task`, which leaves the diff to `get_task_result`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub diff: String,
    pub diffstat: DiffStat,
    pub usage: Usage,
    pub branch: Option<String>,
    pub commit: Option<String>,
    pub permissions: Vec<Permission>,
    pub reverted_files: Vec<String>,
    pub session_id: Option<String>,
    pub exit_code: Option<i32>,
    pub tool_calls: usize,
    /// Every permission request the agent made, with its answer and who gave it.
    pub permission_requests: Vec<PermissionRequest>,
    /// The commit the task's branch started from (its diff is against it).
    pub started_from: Option<String>,
    /// The dependencies whose work it started from.
    pub stacked_on: Vec<i64>,
    /// The task could change files and changed none.
    pub no_changes: bool,
    /// Each check of `.taskbridge.toml`'s `[verify]` run, every round.
    pub verification: Vec<Check>,
    /// Whether the last round of checks passed; `None` when none are configured.
    pub verified: Option<bool>,
    /// Where a worker that ran from a mirror pushed the branch: `<remote> <branch>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pushed_to: Option<String>,
    /// Which agent ran the task, what it could do natively, and what held instead where it
    /// could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentReport>,
    /// What the agent changed of the git metadata TaskBridge relies on (its worktree's `.git`,
    /// admin directory or HEAD), when it did: the task fails, and nothing was read or written
    /// through it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tampered: Option<String>,
}

impl TaskResult {
    /// Whether `usage.cost_usd` is a cost: an agent that reports none spent an unknown amount,
    /// not nothing.
    pub fn cost_known(&self) -> bool {
        self.usage.cost_usd.is_some()
    }
}

/// Token usage and cost summed over every step of a run (or of several runs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    /// `None` (`null`) when the agent reports no cost (see `TaskResult::agent`): the spend is
    /// unknown, not nothing.
    pub cost_usd: Option<f64>,
    pub steps: u64,
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
        self.cost_usd = match (self.cost_usd, other.cost_usd) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.steps += other.steps;
    }

    /// The cost as a budget counts it: an unknown cost counts nothing.
    pub fn cost(&self) -> f64 {
        self.cost_usd.unwrap_or(0.0)
    }

    /// Input and output tokens, the figure a token budget counts (and the `tokens` column).
    pub fn tokens(&self) -> i64 {
        i64::try_from(self.input_tokens.saturating_add(self.output_tokens)).unwrap_or(i64::MAX)
    }
}

/// A file the task's branch changed, as git reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FileTouched {
    pub path: String,
    /// `added`, `modified`, `deleted`, `renamed`, `copied` or `typechange`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub old_path: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DiffStat {
    pub files: usize,
    pub insertions: usize,
    pub deletions: usize,
}

/// The agent that ran a task (`TaskResult::agent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentReport {
    /// `opencode`, `opencode:<agent>`, `claude-code` or `codex`.
    pub name: String,
    /// How OpenCode was driven (`serve` or `run`); absent for the other agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(flatten)]
    pub capabilities: Capabilities,
    /// Each guarantee that held another way than natively, in words.
    #[serde(default)]
    pub fallbacks: Vec<String>,
}

/// What an agent can do natively; where it cannot, TaskBridge's fallback holds instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Capabilities {
    /// Its own question tool, answered with the options it offered (else: the prompt-level
    /// `taskbridge-question` block).
    pub native_questions: bool,
    /// Approval requests for tool calls, so `ask` rules can wait for an answer (else: what an
    /// `ask` rule names is denied, or not enforceable, as the result says).
    pub native_permissions: bool,
    /// It reports what a run cost (else: `usage.cost_usd` is `null`).
    pub reports_cost: bool,
    /// A session can be resumed for answers and follow-ups.
    pub resumable: bool,
}

/// One verification command TaskBridge ran itself in the worktree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Check {
    pub command: String,
    /// `None` when it was stopped at its time limit.
    pub exit_code: Option<i32>,
    pub duration_s: f64,
    /// The last lines of its output (stdout and stderr).
    pub output_tail: String,
    pub round: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PermissionRequest {
    pub permission: String,
    pub patterns: Vec<String>,
    pub target: Option<String>,
    /// `None` while it waits.
    pub answer: Option<String>,
    /// `cli`, `tui`, `mcp:<client>`, or `rule` (approved by an earlier `always`).
    pub answered_by: Option<String>,
    pub asked_at: f64,
}

/// A test command: observed (the agent ran it, with its exit code) or only claimed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TestRun {
    pub command: String,
    pub exit_code: Option<i64>,
    /// False when the agent claimed this test but no such command appears in its tool calls.
    pub observed: bool,
}

/// One of the task's flags and what enforced it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Permission {
    pub flag: String,
    pub enabled: bool,
    /// `enforced` or `advisory`.
    pub enforcement: String,
    pub how: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_cost_is_null_and_reads_back_unknown() {
        let r = TaskResult {
            usage: Usage { input_tokens: 3, output_tokens: 4, ..Default::default() },
            ..Default::default()
        };
        let v = serde_json::to_value(&r).unwrap();
        assert!(v["usage"]["cost_usd"].is_null());
        let back: TaskResult = serde_json::from_value(v).unwrap();
        assert!(!back.cost_known());
        assert_eq!(back.usage.tokens(), 7);
    }

    #[test]
    fn usage_adds_up_field_by_field() {
        let one = Usage {
            input_tokens: 1,
            output_tokens: 2,
            reasoning_tokens: 3,
            cache_read_tokens: 4,
            cache_write_tokens: 5,
            cost_usd: Some(0.5),
            steps: 6,
        };
        let mut u = one;
        u.add(&Usage {
            input_tokens: 10,
            output_tokens: 20,
            reasoning_tokens: 30,
            cache_read_tokens: 40,
            cache_write_tokens: 50,
            cost_usd: Some(0.25),
            steps: 60,
        });
        assert_eq!(
            u,
            Usage {
                input_tokens: 11,
                output_tokens: 22,
                reasoning_tokens: 33,
                cache_read_tokens: 44,
                cache_write_tokens: 55,
                cost_usd: Some(0.75),
                steps: 66,
            }
        );
        let r = TaskResult { usage: u, ..Default::default() };
        assert!(r.cost_known());
        assert_eq!(r.usage.tokens(), 33);
    }

    #[test]
    fn costs_add_and_an_unknown_one_adds_nothing() {
        let mut u = Usage { cost_usd: Some(0.25), steps: 1, ..Default::default() };
        u.add(&Usage { cost_usd: None, steps: 2, ..Default::default() });
        assert_eq!((u.cost_usd, u.steps), (Some(0.25), 3));
        u.add(&Usage { cost_usd: Some(0.5), ..Default::default() });
        assert_eq!(u.cost(), 0.75);
        let mut none = Usage::default();
        none.add(&Usage::default());
        assert_eq!(none.cost_usd, None);
    }

    #[test]
    fn a_result_from_an_older_build_reads() {
        let r: TaskResult =
            serde_json::from_str(r#"{"summary":"ok","usage":{"input_tokens":5,"cost_usd":0.5}}"#)
                .unwrap();
        assert_eq!((r.summary.as_str(), r.usage.cost_usd, r.usage.tokens()), ("ok", Some(0.5), 5));
    }
}
