//! A task as a planner describes it, written once for every front end: the CLI's `submit` flags
//! (clap), and the arguments of the MCP tools `submit_task` and `submit_batch` (serde, with the
//! JSON Schema clients read), which are this one struct. Its doc comments are both the CLI's help
//! and the schema's descriptions. The queue's `TaskSpec` is what it becomes
//! ([`TaskArgs::into_request`]).

use queue::DepRef;
use rmcp::schemars::{self, JsonSchema};
use serde::Deserialize;
use std::path::PathBuf;
use worker::SubmitRequest;

/// A dependency inside a batch: a task id, or "#N" for item N of the same batch.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum BatchDep {
    Id(i64),
    Ref(String),
}

impl From<i64> for BatchDep {
    fn from(id: i64) -> Self {
        BatchDep::Id(id)
    }
}

impl std::str::FromStr for BatchDep {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(s.parse().map_or_else(|_| BatchDep::Ref(s.to_owned()), BatchDep::Id))
    }
}

/// A task: what to do, where, and under which rules.
// `D` names a dependency: a task id, or in a batch also "#N" (`BatchDep`).
#[derive(Debug, Clone, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields, bound(deserialize = "D: Deserialize<'de>"))]
pub struct TaskArgs<D>
where
    D: Clone + Send + Sync + std::str::FromStr + 'static,
    <D as std::str::FromStr>::Err: std::error::Error + Send + Sync + 'static,
{
    /// What the agent should do, in full (up to 256 KiB); on the command line `-` reads it
    /// from stdin.
    pub prompt: String,
    /// The git repository to work in (default: the current directory, the server's for MCP).
    #[serde(default)]
    #[arg(long)]
    pub repo: Option<String>,
    /// Branch, tag or commit to start from (default: HEAD at submit time).
    #[serde(default, rename = "ref")]
    #[arg(long = "ref", value_name = "REF")]
    pub base_ref: Option<String>,
    /// A short name for lists and notifications (default: the prompt's first line).
    #[serde(default)]
    #[arg(long)]
    pub title: Option<String>,
    /// -100..=100, higher runs first (default 0).
    #[serde(default)]
    #[arg(long, allow_hyphen_values = true)]
    pub priority: Option<i64>,
    /// Tasks that must be done before this one starts, by id; in a batch also "#0", "#1", ...
    /// for earlier items of the same batch (repeatable).
    #[serde(default)]
    #[arg(long = "depends-on", visible_alias = "after", value_name = "ID")]
    pub depends_on: Vec<D>,
    /// provider/model, e.g. anthropic/claude-sonnet-4-5, checked against the models OpenCode
    /// offers (default: the configured default).
    #[serde(default)]
    #[arg(long)]
    pub model: Option<String>,
    /// The agent that runs it: opencode (the default), claude-code, codex, or opencode:<agent>
    /// for one of OpenCode's own agents (opencode:plan). Refused when its CLI is not installed.
    #[serde(default)]
    #[arg(long)]
    pub agent: Option<String>,
    /// The agent may read but not edit; anything it changes anyway is reverted and listed.
    #[serde(default)]
    #[arg(long)]
    pub readonly: bool,
    /// No network for the agent but its model provider: its web fetch and search tools are
    /// denied, and the kernel's wall keeps its commands from connecting anywhere else (where
    /// the sandbox is on; the result says what enforced it).
    #[serde(default)]
    #[arg(long)]
    pub no_network: bool,
    /// Deny the agent's shell tool.
    #[serde(default)]
    #[arg(long)]
    pub no_shell: bool,
    /// Keep the worktree after the task is done (it is removed by default; the branch always
    /// stays).
    #[serde(default)]
    #[arg(long = "worktree-keep", visible_alias = "keep-worktree")]
    pub worktree_keep: bool,
    /// 1..=20 attempts before the task fails for good (default 2).
    #[serde(default)]
    #[arg(long)]
    pub max_attempts: Option<i64>,
    /// Seconds a run may take before it is stopped, 1..=604800 (default 3600).
    #[serde(default)]
    #[arg(long = "timeout", value_name = "SECONDS")]
    pub timeout_s: Option<i64>,
    /// Fail the task if its question waits longer than this many seconds.
    #[serde(default)]
    #[arg(long = "question-timeout", value_name = "SECONDS")]
    pub question_timeout_s: Option<i64>,
    /// Idempotency key: submitting again with the same key returns the first task.
    #[serde(default)]
    #[arg(long)]
    pub request_id: Option<String>,
    /// The git remote a worker on another host fetches the repository from and pushes the
    /// task's branch to (default: the repository's origin). On a shared (PostgreSQL) queue the
    /// base commit is pushed to refs/taskbridge/base/<commit> when no ref there contains it.
    #[serde(default)]
    #[arg(long, value_name = "URL")]
    pub remote: Option<String>,
    /// Permission requests that wait for an answer (from Claude or a person) instead of being
    /// allowed: each PERMISSION[:PATTERN], e.g. bash:git push*, external_directory,
    /// edit:*.lock (the pattern defaults to every one). The task waits with a question of kind
    /// permission when one matches.
    #[serde(default)]
    #[arg(long = "ask", value_name = "PERMISSION[:PATTERN]")]
    pub ask: Vec<String>,
    /// Stop the agent when the task's spend passes this many US dollars; the task then waits
    /// with a question of kind budget (answer continue, continue <new limit>, or stop).
    #[serde(default)]
    #[arg(long, value_name = "USD", allow_negative_numbers = true)]
    pub max_cost_usd: Option<f64>,
    /// The same for input plus output tokens.
    #[serde(default)]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_tokens: Option<i64>,
}

impl<D> TaskArgs<D>
where
    D: Clone + Send + Sync + std::str::FromStr + 'static,
    <D as std::str::FromStr>::Err: std::error::Error + Send + Sync + 'static,
{
    /// The request these arguments make, given the repository they resolve to and their
    /// dependencies as the queue names them; `prompt` replaces the one given (read from stdin,
    /// say). Where the arguments say nothing, the queue's defaults hold.
    pub fn into_request(self, repo: PathBuf, depends_on: Vec<DepRef>) -> SubmitRequest {
        let mut req = SubmitRequest::new(self.prompt, repo);
        req.base_ref = self.base_ref;
        let spec = &mut req.spec;
        spec.title = self.title;
        spec.priority = self.priority.unwrap_or(0);
        spec.depends_on = depends_on;
        spec.model = self.model;
        spec.agent = self.agent;
        spec.readonly = self.readonly;
        spec.no_network = self.no_network;
        spec.no_shell = self.no_shell;
        spec.worktree_keep = self.worktree_keep;
        spec.max_attempts = self.max_attempts.unwrap_or(queue::DEFAULT_MAX_ATTEMPTS);
        spec.timeout_s = self.timeout_s.unwrap_or(queue::DEFAULT_TIMEOUT_S);
        spec.question_timeout_s = self.question_timeout_s;
        spec.request_id = self.request_id;
        spec.remote = self.remote;
        spec.ask = self.ask;
        spec.budget =
            queue::Budget { max_cost_usd: self.max_cost_usd, max_tokens: self.max_tokens };
        req
    }
}

/// `submit_task`'s arguments.
pub type SubmitTaskArgs = TaskArgs<i64>;

/// An item of `submit_batch`.
pub type BatchItem = TaskArgs<BatchDep>;
