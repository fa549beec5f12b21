//! The TaskBridge tools. Each is one queue or worker operation with the same name as its CLI verb
//! and TUI action; arguments are described in the input schema by their doc comments.

use crate::params::Parameters;
use crate::replies::{
    BatchReply, ClearReply, DefaultModelReply, ListReply, ListedTask, LogsReply, ModelsReply,
    PingReply, RestartReply, ResultReply, RunReply, TaskReply, WaitReply, WorkersReply,
};
use crate::server::{TaskBridge, ToolResult, ok, refuse};
use crate::waiting::Waited;
use queue::{DepRef, ListFilter, StatusFilter, TaskId, TaskStatus};
use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::tool::{InputResponses, RequestState};
use rmcp::model::CallToolResponse;
use rmcp::schemars::{self, JsonSchema};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use rmcp::{tool, tool_router};
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;
use worker::SubmitRequest;

pub use crate::task_args::{BatchDep, BatchItem, SubmitTaskArgs, TaskArgs};

pub const MAX_BATCH: usize = 20;
pub const MAX_WAIT_S: f64 = 50.0;
pub const MAX_LOG_BYTES: usize = 262_144;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitBatchArgs {
    /// 1 to 20 tasks, created all or none.
    pub tasks: Vec<BatchItem>,
    /// One budget in US dollars shared by the batch's tasks: when their spend together passes
    /// it, the task that passed it waits with a question of kind budget.
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
    /// The same for input plus output tokens.
    #[serde(default)]
    pub max_tokens: Option<i64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskIdArgs {
    /// The task's id.
    pub task_id: i64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditArgs {
    /// The task's id; it must be queued and not yet run.
    pub task_id: i64,
    /// The new prompt.
    pub prompt: String,
    /// A new title (left out: the title stays).
    #[serde(default)]
    pub title: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetResultArgs {
    /// The task's id (an integer, as submit_task returned it).
    pub task_id: i64,
    /// Cut the diff at this many bytes (default 65536); `diff_truncated` says when it was cut.
    #[serde(default)]
    pub max_diff_bytes: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetLogsArgs {
    /// The task's id (an integer, as submit_task returned it).
    pub task_id: i64,
    /// Byte offset to read from; omit to get the tail. Pass `next_offset` back to follow.
    #[serde(default)]
    pub offset: Option<u64>,
    /// At most this many bytes (default 16384, at most 262144).
    #[serde(default)]
    pub max_bytes: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema, Clone, Copy, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum WaitMode {
    Any,
    All,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitForArgs {
    /// Tasks to wait for.
    pub task_ids: Vec<i64>,
    /// `any` (default): return when one is done, failed, cancelled or waiting; `all`: when all are.
    #[serde(default)]
    pub mode: Option<WaitMode>,
    /// Seconds to wait, at most 50 (default 25): clients drop calls that last about 60 s.
    #[serde(default)]
    pub timeout_s: Option<f64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerArgs {
    /// The task's id (an integer, as submit_task returned it).
    pub task_id: i64,
    /// The decision: free text, an option's label, several labels (an array, or one string
    /// separated by commas) when the question allows several; for a permission once, always,
    /// reject or "reject: <what to do instead>"; for a budget continue, "continue 2.00" or stop.
    pub answer: AnswerValue,
}

/// Inlined in the schema: some clients do not follow `$ref`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
#[schemars(inline)]
pub enum AnswerValue {
    Text(String),
    Labels(Vec<String>),
}

impl AnswerValue {
    fn text(self) -> String {
        match self {
            AnswerValue::Text(t) => t,
            AnswerValue::Labels(l) => l.join(", "),
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// queued, blocked, running, waiting, done, failed or cancelled.
    #[serde(default)]
    pub status: Option<String>,
    /// Only tasks in this repository.
    #[serde(default)]
    pub repo: Option<String>,
    /// Default 50, at most 500.
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default)]
    pub offset: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoteArgs {
    /// The task's id (an integer, as submit_task returned it).
    pub task_id: i64,
    /// Extra guidance for the agent.
    pub note: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PriorityArgs {
    /// The task's id (an integer, as submit_task returned it).
    pub task_id: i64,
    /// -100..=100, higher runs first.
    pub priority: i64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClearArgs {
    /// Only tasks finished at least this many seconds ago (default 0).
    #[serde(default)]
    pub older_than_s: Option<f64>,
    /// Any of done, failed, cancelled (default all three).
    #[serde(default)]
    pub statuses: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListModelsArgs {
    /// Only this provider's models, e.g. anthropic (OpenCode's).
    #[serde(default)]
    pub provider: Option<String>,
    /// Whose models: opencode (the default), claude-code or codex.
    #[serde(default)]
    pub agent: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetModelArgs {
    /// provider/model, checked against OpenCode's list.
    pub model: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

#[derive(Debug, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct ListWorkersArgs {
    /// Every worker the queue has seen; by default those stopped or silent for over a day are
    /// left out.
    #[serde(default)]
    pub all: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FollowupArgs {
    /// The done or failed task to refine.
    pub task_id: i64,
    /// What to change next, in full.
    pub prompt: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeArgs {
    /// The done task to merge.
    pub task_id: i64,
    /// The branch to merge into (default: the branch the task was submitted from).
    #[serde(default)]
    pub into: Option<String>,
    /// One squashed commit instead of a merge commit (or a fast-forward).
    #[serde(default)]
    pub squash: bool,
}

fn field_error(field: &str, message: impl std::fmt::Display) -> ToolResult {
    refuse(format!("invalid {field}: {message}"))
}

impl TaskBridge {
    /// `args` as a request, its repository under the server's roots and its dependencies
    /// resolved (`index`: its place in a batch, for the error).
    pub(crate) fn request<D>(
        &self,
        args: TaskArgs<D>,
        index: usize,
    ) -> Result<SubmitRequest, String>
    where
        D: Clone + Send + Sync + std::str::FromStr + Into<BatchDep> + 'static,
        <D as std::str::FromStr>::Err: std::error::Error + Send + Sync + 'static,
    {
        let repo = match &args.repo {
            Some(r) => {
                let p = PathBuf::from(r);
                if p.is_absolute() { p } else { self.cwd().join(p) }
            }
            None => self.cwd().to_path_buf(),
        };
        self.check_repo_allowed(&repo)?;
        let mut depends_on = Vec::new();
        for d in args.depends_on.iter().cloned().map(Into::into) {
            depends_on.push(match d {
                // A task outside the roots is not found, as one that does not exist.
                BatchDep::Id(id) => self.dependency(TaskId(id))?,
                BatchDep::Ref(s) => match s.strip_prefix('#').and_then(|n| n.parse::<usize>().ok())
                {
                    Some(i) => DepRef::Batch(i),
                    None => match s.parse::<i64>() {
                        Ok(id) => self.dependency(TaskId(id))?,
                        Err(_) => {
                            return Err(format!(
                                "invalid depends_on of item #{index}: '{s}' is neither a task id \
                                 nor '#N' naming an item of the batch"
                            ));
                        }
                    },
                },
            });
        }
        Ok(args.into_request(repo, depends_on))
    }
}

fn parse_statuses(list: Option<Vec<String>>) -> Result<Vec<TaskStatus>, String> {
    match list {
        None => Ok(vec![TaskStatus::Done, TaskStatus::Failed, TaskStatus::Cancelled]),
        Some(v) => v.iter().map(|s| s.parse::<TaskStatus>()).collect(),
    }
}

#[tool_router(vis = "pub(crate)")]
impl TaskBridge {
    /// Queue a coding task for an agent (OpenCode by default; Claude Code or Codex with agent) to
    /// run headless in its own git worktree and branch.
    /// Returns the task (task_id, status, ...) and warnings (for example: no worker is alive to run
    /// it). Follow with wait_for, then get_task_result.
    #[tool(
        output_schema = schema_for_output::<TaskReply>(),
        annotations(title = "Submit a task", read_only_hint = false, idempotent_hint = false))]
    async fn submit_task(
        &self,
        Parameters(args): Parameters<SubmitTaskArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let req = match self.request(args, 0) {
            Ok(r) => r,
            Err(e) => return refuse(e),
        };
        let (cwd, cfg) = (self.cwd().to_path_buf(), self.worker_config().clone());
        match self.blocking(move |s| worker::submit(s, &cwd, &cfg, req)).await {
            // Said, not refused: no worker alive to run it, a model that could not be checked.
            Ok((task, created, warnings)) => {
                self.ask_submitter(vec![task.id.0], &ctx);
                ok(TaskReply::submitted(&task, created, warnings))
            }
            Err(e) => self.fail(e),
        }
    }

    /// Queue 1 to 20 tasks at once, all or none. An item's depends_on may name earlier items of
    /// the same batch as "#0", "#1", ...
    #[tool(
        output_schema = schema_for_output::<BatchReply>(),
        annotations(title = "Submit several tasks", read_only_hint = false))]
    async fn submit_batch(
        &self,
        Parameters(args): Parameters<SubmitBatchArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        if args.tasks.is_empty() || args.tasks.len() > MAX_BATCH {
            return field_error(
                "tasks",
                format!("a batch holds 1 to {MAX_BATCH} tasks; this one has {}", args.tasks.len()),
            );
        }
        let mut reqs = Vec::new();
        for (i, item) in args.tasks.into_iter().enumerate() {
            match self.request(item, i) {
                Ok(r) => reqs.push(r),
                Err(e) => return refuse(e),
            }
        }
        let (cwd, cfg) = (self.cwd().to_path_buf(), self.worker_config().clone());
        let shared = queue::Budget { max_cost_usd: args.max_cost_usd, max_tokens: args.max_tokens };
        match self.blocking(move |s| worker::submit_batch(s, &cwd, &cfg, reqs, shared)).await {
            Ok(out) => {
                self.ask_submitter(out.tasks.iter().map(|(t, _)| t.id.0).collect(), &ctx);
                ok(BatchReply {
                    tasks: out
                        .tasks
                        .iter()
                        .map(|(t, created)| TaskReply {
                            created: Some(*created),
                            ..TaskReply::of(t, false)
                        })
                        .collect(),
                    warnings: out.warnings,
                })
            }
            Err(e) => self.fail(e),
        }
    }

    /// Everything about a task: state, prompt, question and answers, notes, attempts, error, and
    /// its result without the diff (get_task_result has the diff).
    #[tool(
        output_schema = schema_for_output::<TaskReply>(),
        annotations(title = "Get a task", read_only_hint = true))]
    async fn get_task(&self, Parameters(args): Parameters<TaskIdArgs>) -> ToolResult {
        match self.visible_task(TaskId(args.task_id)) {
            Ok(task) => ok(TaskReply::of(&task, true)),
            Err(e) => self.fail(e),
        }
    }

    /// The structured result: summary, files_touched, tests_run (observed or only claimed),
    /// open_questions, diff (diff_truncated when cut), diffstat, usage and cost, branch, commit,
    /// permissions, reverted_files, error; host (its worker's) and pushed_to (where a worker
    /// that ran from a mirror of the remote pushed the branch); agent (which ran it, what it
    /// could do natively, and the fallbacks that held instead; usage.cost_usd is null for an
    /// agent that reports no cost).
    #[tool(
        output_schema = schema_for_output::<ResultReply>(),
        annotations(title = "Get a task's result", read_only_hint = true))]
    async fn get_task_result(&self, Parameters(args): Parameters<GetResultArgs>) -> ToolResult {
        let max = args.max_diff_bytes.unwrap_or(65_536);
        let read = self.read_now(|s| {
            let task = self.visible_task(TaskId(args.task_id))?;
            let overlaps = worker::overlaps(s, &task)?;
            Ok((task, overlaps))
        });
        match read {
            Ok((task, overlaps)) => ok(ResultReply::of(&task, max, overlaps)),
            Err(e) => self.fail(e),
        }
    }

    /// A page of the task's readable log. Omit offset for the tail; pass next_offset back to
    /// follow a running task.
    #[tool(
        output_schema = schema_for_output::<LogsReply>(),
        annotations(title = "Read a task's log", read_only_hint = true))]
    async fn get_task_logs(&self, Parameters(args): Parameters<GetLogsArgs>) -> ToolResult {
        if let Err(e) = self.visible_task(TaskId(args.task_id)) {
            return self.fail(e);
        }
        let max = args.max_bytes.unwrap_or(16_384);
        if max == 0 || max > MAX_LOG_BYTES {
            return field_error(
                "max_bytes",
                format!("{max} is out of range; use 1 to {MAX_LOG_BYTES}"),
            );
        }
        let logs = self.home().logs_dir();
        let r = self
            .blocking(move |s| {
                let task = s.get(TaskId(args.task_id))?;
                let chunk = worker::logs::read_log(
                    &worker::logs::log_path(&logs, task.id.0),
                    args.offset,
                    max,
                )
                .map_err(|e| worker::Error::Io {
                    context: "reading the task log".into(),
                    source: e,
                })?;
                Ok((task, chunk))
            })
            .await;
        match r {
            Ok((task, c)) => {
                // The full log stays on the host of the worker that ran the task.
                let here = worker::hostname(&self.worker_config().env);
                let elsewhere = worker::logs::elsewhere(&task, c.size, &here);
                ok(LogsReply {
                    task_id: task.id.0,
                    text: c.text,
                    offset: c.offset,
                    next_offset: c.next_offset,
                    size: c.size,
                    eof: c.eof,
                    running: task.status == TaskStatus::Running,
                    host: task.worker_host,
                    elsewhere,
                })
            }
            Err(e) => self.fail(e),
        }
    }

    /// Wait for tasks to finish or ask a question: mode any (default) or all, up to timeout_s
    /// (default 25, at most 50). Wakes as soon as the queue changes. Returns which tasks are done,
    /// failed, cancelled, waiting (answer them with answer_task) or still pending, and timed_out.
    /// A client that can ask the person (elicitation) is asked a waiting task's decision
    /// directly, once; a client that sent a progress token gets a line per change.
    #[tool(
        output_schema = schema_for_output::<WaitReply>(),
        annotations(title = "Wait for tasks", read_only_hint = true))]
    async fn wait_for(
        &self,
        Parameters(args): Parameters<WaitForArgs>,
        InputResponses(responses): InputResponses,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let timeout = args.timeout_s.unwrap_or(25.0);
        if !(0.0..=MAX_WAIT_S).contains(&timeout) {
            return field_error(
                "timeout_s",
                format!(
                    "{timeout} is out of range; use 0 to {MAX_WAIT_S} seconds (clients drop calls near 60 s; call again to keep waiting)"
                ),
            )
            .map(Into::into);
        }
        if args.task_ids.is_empty() || args.task_ids.len() > 100 {
            return field_error("task_ids", "give 1 to 100 task ids").map(Into::into);
        }
        let mode = args.mode.unwrap_or(WaitMode::Any);
        let timeout = Duration::from_secs_f64(timeout);
        match self.wait_tasks(&args.task_ids, mode, timeout, &ctx, responses).await {
            Ok(Waited::Reply(r)) => ok(r).map(Into::into),
            Ok(Waited::Input(i)) => Ok(i.into()),
            Err(e) => self.fail(e).map(Into::into),
        }
    }

    /// Delegate a coding task and see it through: submit_task and wait_for in one call. It
    /// takes submit_task's arguments. A client that supports MCP Tasks gets a task at once
    /// (poll it with tasks/get; the MCP task id is the TaskBridge task id); any other waits up
    /// to 50 s with progress and returns the task's state (as wait_for does) with its result
    /// when it is done; call wait_for to go on waiting.
    #[tool(
        output_schema = schema_for_output::<RunReply>(),
        annotations(title = "Run a task with OpenCode", read_only_hint = false, idempotent_hint = false))]
    async fn run_task(
        &self,
        Parameters(args): Parameters<SubmitTaskArgs>,
        InputResponses(responses): InputResponses,
        RequestState(state): RequestState,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.run(args, responses, state, ctx).await
    }

    /// Answer a waiting task's question, permission request or budget stop (its `ask` says
    /// which, with the options or choices). The agent gets the answer in the same session: as
    /// the result of its blocked tool call when it is still waiting on it.
    #[tool(
        output_schema = schema_for_output::<TaskReply>(),
        annotations(title = "Answer a question", read_only_hint = false))]
    async fn answer_task(
        &self,
        Parameters(args): Parameters<AnswerArgs>,
        ctx: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> ToolResult {
        if let Err(e) = self.visible_task(TaskId(args.task_id)) {
            return self.fail(e);
        }
        // From the session's handshake, or (2026-07-28, no handshake) from the request itself.
        let by = match ctx.client_info() {
            Some(info) => format!("mcp:{}", info.name),
            None => "mcp".to_owned(),
        };
        let answer = args.answer.text();
        match self.blocking(move |s| Ok(s.answer(TaskId(args.task_id), &answer, &by)?)).await {
            Ok(task) => ok(TaskReply::of(&task, true)),
            Err(e) => self.fail(e),
        }
    }

    /// Refine a done or failed task: a new task on its own branch that starts from that task's
    /// commit (a failed one's worktree as it was left) and resumes the same agent session, so the
    /// agent keeps the whole conversation. Its diff is only the new change. Chains work.
    #[tool(
        output_schema = schema_for_output::<TaskReply>(),
        annotations(title = "Follow up a task", read_only_hint = false))]
    async fn followup_task(&self, Parameters(args): Parameters<FollowupArgs>) -> ToolResult {
        if let Err(e) = self.visible_task(TaskId(args.task_id)) {
            return self.fail(e);
        }
        let r =
            self.blocking(move |s| worker::followup(s, TaskId(args.task_id), &args.prompt)).await;
        match r {
            Ok(task) => ok(TaskReply::of(&task, false)),
            Err(e) => self.fail(e),
        }
    }

    /// Bring a done task's work into the branch it was submitted from (or `into`): a
    /// fast-forward when possible, else a merge commit (`squash`: one squashed commit). Where
    /// the branch is checked out, that working tree must be clean and is updated as `git merge`
    /// would. A conflict changes nothing and lists the paths. The dependencies whose work the
    /// branch carries are marked merged too.
    #[tool(
        output_schema = schema_for_output::<worker::MergeReport>(),
        annotations(title = "Merge a task", read_only_hint = false, destructive_hint = false))]
    async fn merge_task(&self, Parameters(args): Parameters<MergeArgs>) -> ToolResult {
        if let Err(e) = self.visible_task(TaskId(args.task_id)) {
            return self.fail(e);
        }
        let r = self
            .blocking(move |s| {
                worker::merge_task(s, TaskId(args.task_id), args.into.as_deref(), args.squash)
            })
            .await;
        match r {
            Ok(report) => ok(report),
            Err(e) => self.fail(e),
        }
    }

    /// Task summaries, newest first: filter by status (queued, blocked, running, waiting, done,
    /// failed, cancelled) and repo; page with limit (default 50) and offset.
    #[tool(
        output_schema = schema_for_output::<ListReply>(),
        annotations(title = "List tasks", read_only_hint = true))]
    async fn list_tasks(&self, Parameters(args): Parameters<ListArgs>) -> ToolResult {
        let status = match args.status.as_deref().map(str::parse::<StatusFilter>).transpose() {
            Ok(s) => s,
            Err(e) => return field_error("status", e),
        };
        let limit = args.limit.unwrap_or(50);
        if limit == 0 || limit > 500 {
            return field_error("limit", format!("{limit} is out of range; use 1 to 500"));
        }
        let repo = args.repo.map(|r| {
            let p = PathBuf::from(&r);
            let p = if p.is_absolute() { p } else { self.cwd().join(p) };
            worker::resolve_repo(&p, None).map(|x| x.toplevel.display().to_string()).unwrap_or(r)
        });
        let offset = args.offset.unwrap_or(0);
        let restricted = !self.roots_as_text().is_empty();
        // Under roots the page is cut after the tasks outside them are left out, so that
        // limit and offset count only what the caller may see.
        let filter = if restricted {
            ListFilter { status, repo, limit: None, offset: 0 }
        } else {
            ListFilter { status, repo, limit: Some(limit), offset }
        };
        let listed = self.read_now(|s| Ok(s.list(&filter)?)).map(|tasks| {
            if restricted {
                tasks
                    .into_iter()
                    .filter(|t| self.visible(&t.repo))
                    .skip(offset)
                    .take(limit)
                    .collect()
            } else {
                tasks
            }
        });
        match listed {
            Ok(tasks) => ok(ListReply { tasks: tasks.iter().map(ListedTask::of).collect() }),
            Err(e) => self.fail(e),
        }
    }

    /// Counts per state, the oldest queued task's age, workers and the default model.
    #[tool(
        output_schema = schema_for_output::<queue::QueueStatus>(),
        annotations(title = "Queue status", read_only_hint = true))]
    async fn queue_status(&self, Parameters(_): Parameters<Empty>) -> ToolResult {
        match self.read_now(|s| Ok(s.queue_status()?)) {
            Ok(st) => ok(st),
            Err(e) => self.fail(e),
        }
    }

    /// Each worker: id, pid, host, started, last heartbeat, current tasks, and whether it is stale.
    #[tool(
        output_schema = schema_for_output::<WorkersReply>(),
        annotations(title = "List workers", read_only_hint = true))]
    async fn list_workers(&self, Parameters(args): Parameters<ListWorkersArgs>) -> ToolResult {
        let listed = self.read_now(move |s| {
            Ok(if args.all { s.list_all_workers()? } else { s.list_workers()? })
        });
        match listed {
            Ok(workers) => ok(WorkersReply { workers }),
            Err(e) => self.fail(e),
        }
    }

    /// Restart stale or dead workers: their running tasks are requeued (the attempt counts) and,
    /// when no worker is left alive, this server starts one in process, or, when it runs none
    /// itself, restarts the installed `taskbridge service` through systemd or launchd.
    #[tool(
        output_schema = schema_for_output::<RestartReply>(),
        annotations(title = "Restart workers", read_only_hint = false))]
    async fn restart_worker(&self, Parameters(_): Parameters<Empty>) -> ToolResult {
        match self.restart_workers().await {
            Ok(v) => ok(v),
            Err(e) => self.fail(e),
        }
    }

    /// Add a note for the agent: a queued task gets it with its prompt, a waiting one with the
    /// answer, a running one at its next step on OpenCode's warm server (other agents: at their
    /// next turn). A note the agent never got because its task ended first says so
    /// (`ended_first`).
    #[tool(
        output_schema = schema_for_output::<TaskReply>(),
        annotations(title = "Add a note", read_only_hint = false))]
    async fn add_task_note(&self, Parameters(args): Parameters<NoteArgs>) -> ToolResult {
        if let Err(e) = self.visible_task(TaskId(args.task_id)) {
            return self.fail(e);
        }
        match self.blocking(move |s| Ok(s.add_note(TaskId(args.task_id), &args.note)?)).await {
            Ok(task) => ok(TaskReply::of(&task, true)),
            Err(e) => self.fail(e),
        }
    }

    /// Cancel a task. Queued and waiting tasks end at once; a running agent is stopped (SIGTERM,
    /// then SIGKILL) within a second or two and its worktree kept.
    #[tool(
        output_schema = schema_for_output::<TaskReply>(),
        annotations(title = "Cancel a task", read_only_hint = false, destructive_hint = true))]
    async fn cancel_task(&self, Parameters(args): Parameters<TaskIdArgs>) -> ToolResult {
        if let Err(e) = self.visible_task(TaskId(args.task_id)) {
            return self.fail(e);
        }
        match self.blocking(move |s| Ok(s.cancel(TaskId(args.task_id))?)).await {
            Ok(task) => ok(TaskReply::of(&task, true)),
            Err(e) => self.fail(e),
        }
    }

    /// Change a queued task's prompt (and title) before any worker ran it.
    #[tool(
        output_schema = schema_for_output::<TaskReply>(),
        annotations(title = "Edit a queued task", read_only_hint = false))]
    async fn edit_task(&self, Parameters(args): Parameters<EditArgs>) -> ToolResult {
        if let Err(e) = self.visible_task(TaskId(args.task_id)) {
            return self.fail(e);
        }
        let edited = self.blocking(move |s| {
            Ok(s.edit_task(TaskId(args.task_id), &args.prompt, args.title.as_deref())?)
        });
        match edited.await {
            Ok(task) => ok(TaskReply::of(&task, true)),
            Err(e) => self.fail(e),
        }
    }

    /// Pause the queue: workers finish what they run and claim nothing new until
    /// resume_queue. Returns the queue's status.
    #[tool(
        output_schema = schema_for_output::<queue::QueueStatus>(),
        annotations(title = "Pause the queue", read_only_hint = false))]
    async fn pause_queue(&self, Parameters(_): Parameters<Empty>) -> ToolResult {
        match self.blocking(|s| Ok(s.pause_queue().and_then(|_| s.queue_status())?)).await {
            Ok(st) => ok(st),
            Err(e) => self.fail(e),
        }
    }

    /// Let workers claim tasks again after pause_queue. Returns the queue's status.
    #[tool(
        output_schema = schema_for_output::<queue::QueueStatus>(),
        annotations(title = "Resume the queue", read_only_hint = false))]
    async fn resume_queue(&self, Parameters(_): Parameters<Empty>) -> ToolResult {
        match self.blocking(|s| Ok(s.resume_queue().and_then(|_| s.queue_status())?)).await {
            Ok(st) => ok(st),
            Err(e) => self.fail(e),
        }
    }

    /// Run a failed or cancelled task again (tasks that failed because it did follow).
    #[tool(
        output_schema = schema_for_output::<TaskReply>(),
        annotations(title = "Retry a task", read_only_hint = false))]
    async fn retry_task(&self, Parameters(args): Parameters<TaskIdArgs>) -> ToolResult {
        if let Err(e) = self.visible_task(TaskId(args.task_id)) {
            return self.fail(e);
        }
        match self.blocking(move |s| Ok(s.retry(TaskId(args.task_id))?)).await {
            Ok(task) => ok(TaskReply::of(&task, true)),
            Err(e) => self.fail(e),
        }
    }

    /// Change a task's priority (-100..=100, higher runs first).
    #[tool(
        output_schema = schema_for_output::<TaskReply>(),
        annotations(title = "Set a task's priority", read_only_hint = false))]
    async fn set_task_priority(&self, Parameters(args): Parameters<PriorityArgs>) -> ToolResult {
        if let Err(e) = self.visible_task(TaskId(args.task_id)) {
            return self.fail(e);
        }
        match self.blocking(move |s| Ok(s.set_priority(TaskId(args.task_id), args.priority)?)).await
        {
            Ok(task) => ok(TaskReply::of(&task, true)),
            Err(e) => self.fail(e),
        }
    }

    /// Remove finished tasks with their logs and worktrees (uncommitted work is committed to the
    /// branch first; branches are never deleted).
    #[tool(
        output_schema = schema_for_output::<ClearReply>(),
        annotations(
        title = "Clear finished tasks",
        read_only_hint = false,
        destructive_hint = true
    ))]
    async fn clear_finished(&self, Parameters(args): Parameters<ClearArgs>) -> ToolResult {
        let statuses = match parse_statuses(args.statuses) {
            Ok(s) => s,
            Err(e) => return field_error("statuses", e),
        };
        let older = args.older_than_s.unwrap_or(0.0);
        let home = self.home().clone();
        let under = self.roots_as_text();
        match self
            .blocking(move |s| worker::clear_finished(s, &home, older, &statuses, &under))
            .await
        {
            Ok(cleared) => ok(ClearReply {
                cleared: cleared.iter().map(|t| t.id.0).collect(),
                branches_kept: cleared.iter().filter_map(|t| t.branch.clone()).collect(),
            }),
            Err(e) => self.fail(e),
        }
    }

    /// Models an agent can use: OpenCode's (from `opencode models`, cached for an hour, the
    /// default), or with `agent` Claude Code's or Codex's.
    #[tool(
        output_schema = schema_for_output::<ModelsReply>(),
        annotations(title = "List models", read_only_hint = true))]
    async fn list_models(&self, Parameters(args): Parameters<ListModelsArgs>) -> ToolResult {
        let cfg = self.worker_config();
        let agent = match worker::agent::AgentSpec::resolve(
            args.agent.as_deref().unwrap_or(""),
            &cfg.agents,
        ) {
            Ok(a) => a,
            Err(e) => return refuse(e),
        };
        if let Some(configured) = agent.configured.as_deref().and_then(|n| cfg.agent(n)).cloned() {
            let env = cfg.env.clone();
            let name = configured.name.clone();
            let listed = tokio::task::spawn_blocking(move || {
                worker::models::configured_agent_models(&configured, &env)
            })
            .await;
            return match listed {
                Ok(Ok((models, note))) => ok(ModelsReply { agent: name, models, note }),
                Ok(Err(e)) => self.fail(e),
                Err(e) => self.fail(worker::Error::Join(e.to_string())),
            };
        }
        if agent.kind != worker::agent::AgentKind::OpenCode {
            let cfg = self.worker_config();
            let (program, env) = (cfg.program(agent.kind).to_path_buf(), cfg.env.clone());
            let listed = tokio::task::spawn_blocking(move || {
                worker::models::agent_models(agent.kind, &program, &env)
            })
            .await;
            return match listed {
                Ok(Ok((models, note))) => {
                    ok(ModelsReply { agent: agent.kind.name().to_owned(), models, note })
                }
                Ok(Err(e)) => self.fail(e),
                Err(e) => self.fail(worker::Error::Join(e.to_string())),
            };
        }
        let opencode = self.worker_config().opencode.clone();
        match self
            .blocking(move |s| {
                worker::models::list_models(s, &opencode, args.provider.as_deref(), false)
            })
            .await
        {
            Ok(models) => ok(ModelsReply { agent: "opencode".into(), models, note: None }),
            Err(e) => self.fail(e),
        }
    }

    /// Set the model used by tasks that name none (checked against list_models).
    #[tool(
        output_schema = schema_for_output::<DefaultModelReply>(),
        annotations(title = "Set the default model", read_only_hint = false))]
    async fn set_default_model(&self, Parameters(args): Parameters<SetModelArgs>) -> ToolResult {
        let (opencode, model) = (self.worker_config().opencode.clone(), args.model.clone());
        match self.blocking(move |s| worker::models::set_default_model(s, &opencode, &model)).await
        {
            Ok(()) => ok(DefaultModelReply { default_model: args.model }),
            Err(e) => self.fail(e),
        }
    }

    /// Version, the database (a path, or a URL with its password masked), its backend (sqlite or
    /// postgres) and workers alive.
    #[tool(
        output_schema = schema_for_output::<PingReply>(),
        annotations(title = "Ping", read_only_hint = true))]
    async fn ping(&self, Parameters(_): Parameters<Empty>) -> ToolResult {
        match self.read_now(|s| Ok(s.list_workers()?)) {
            Ok(workers) => ok(PingReply {
                version: env!("CARGO_PKG_VERSION").to_owned(),
                database: self.store().location().to_string(),
                backend: self.store().location().backend().to_owned(),
                workers_alive: workers.iter().filter(|w| !w.stopped && !w.stale).count(),
            }),
            Err(e) => self.fail(e),
        }
    }
}
