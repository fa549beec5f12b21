//! `run_task` and the MCP Tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663) backed by
//! the queue. An MCP task is a TaskBridge task: its id is the task's id, `tasks/get` reads the
//! durable queue (so a client polling after TaskBridge restarted sees the same task), a waiting
//! task is `input_required` with its decision as an elicitation request, `tasks/update` answers
//! it and `tasks/cancel` cancels. Nothing is kept in memory but which decisions were asked.

use crate::decisions::Decision;
use crate::replies::{ResultReply, RunReply, WaitTask};
use crate::server::{TaskBridge, ok, refuse};
use crate::task_args::SubmitTaskArgs;
use crate::tools::{MAX_WAIT_S, WaitMode};
use crate::waiting::{Waited, progress_line};
use queue::{Task, TaskId, TaskStatus};
use rmcp::model::{
    CallToolResponse, CancelTaskParams, CreateTaskResult, DetailedTask, ElicitRequest,
    GetTaskParams, GetTaskResult, InputRequest, InputRequests, InputResponses, JsonObject,
    TaskPayload, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use std::time::Duration;

/// How often a client should poll `tasks/get`.
const POLL_MS: u64 = 1000;
/// What `run_task`'s retried call carries so it waits on the task it submitted instead of
/// submitting again (the client echoes it; it is only ever read as a task id it may see).
const RUN_STATE: &str = "run:";

impl TaskBridge {
    pub(crate) async fn run(
        &self,
        args: SubmitTaskArgs,
        responses: Option<InputResponses>,
        request_state: Option<String>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let resumed = request_state
            .as_deref()
            .and_then(|s| s.strip_prefix(RUN_STATE))
            .and_then(|s| s.parse::<i64>().ok());
        let id = match resumed {
            Some(id) => id,
            None => {
                let req = match self.request(args, 0) {
                    Ok(r) => r,
                    Err(e) => return refuse(e).map(Into::into),
                };
                let (cwd, cfg) = (self.cwd().to_path_buf(), self.worker_config().clone());
                match self.blocking(move |s| worker::submit(s, &cwd, &cfg, req)).await {
                    Ok((task, _, _)) => task.id.0,
                    Err(e) => return self.fail(e).map(Into::into),
                }
            }
        };
        if resumed.is_none() && ctx.client_capabilities().is_some_and(|c| c.supports_tasks()) {
            return match self.visible_task(TaskId(id)) {
                Ok(task) => Ok(CallToolResponse::Task(CreateTaskResult::new(mcp_task(&task)))),
                Err(e) => self.fail(e).map(Into::into),
            };
        }
        let timeout = Duration::from_secs_f64(MAX_WAIT_S);
        let waited = match self.wait_tasks(&[id], WaitMode::Any, timeout, &ctx, responses).await {
            Ok(w) => w,
            Err(e) => return self.fail(e).map(Into::into),
        };
        let reply = match waited {
            Waited::Input(mut input) => {
                input.request_state = Some(format!("{RUN_STATE}{id}"));
                return Ok(input.into());
            }
            Waited::Reply(r) => r,
        };
        let task = match self.visible_task(TaskId(id)) {
            Ok(t) => t,
            Err(e) => return self.fail(e).map(Into::into),
        };
        if !task.status.is_terminal() {
            self.ask_submitter(vec![id], &ctx);
        }
        let mut state = WaitTask::of(&task);
        state.asked = reply.tasks.into_iter().next().and_then(|t| t.asked);
        let result = match task.status {
            TaskStatus::Done | TaskStatus::Failed => Some(self.result_reply(&task)),
            _ => None,
        };
        ok(RunReply {
            task_id: id,
            status: task.display_status.clone(),
            timed_out: reply.timed_out,
            task: state,
            result,
        })
        .map(Into::into)
    }

    fn result_reply(&self, task: &Task) -> ResultReply {
        let overlaps = self.read_now(|s| worker::overlaps(s, task)).unwrap_or_default();
        ResultReply::of(task, 65_536, overlaps)
    }

    /// `tasks/get`: the task as the queue has it now.
    pub(crate) async fn get_mcp_task(
        &self,
        params: GetTaskParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let task = self.mcp_task_of(&params.task_id)?;
        let payload = match task.status {
            TaskStatus::Done => {
                let result = ok(self.result_reply(&task))?;
                TaskPayload::Completed { result: to_object(&result)? }
            }
            TaskStatus::Failed => {
                let mut error = JsonObject::new();
                error.insert("code".into(), (-32000).into());
                error.insert(
                    "message".into(),
                    task.error.clone().unwrap_or_else(|| "the task failed".into()).into(),
                );
                error.insert(
                    "data".into(),
                    serde_json::to_value(self.result_reply(&task)).unwrap_or_default(),
                );
                TaskPayload::Failed { error }
            }
            TaskStatus::Cancelled => TaskPayload::Cancelled,
            TaskStatus::Waiting => match Decision::of(&task) {
                Some(d) if !self.was_asked(&d.key()) => {
                    let mut input_requests = InputRequests::new();
                    input_requests
                        .insert(d.key(), InputRequest::Elicitation(ElicitRequest::new(d.form())));
                    TaskPayload::InputRequired { input_requests }
                }
                // Asked once already: the planner (answer_task) or a person (the TUI) answers.
                _ => TaskPayload::Working,
            },
            _ => TaskPayload::Working,
        };
        Ok(GetTaskResult::new(DetailedTask::new(mcp_task(&task), payload)))
    }

    /// `tasks/update`: the client's answers to the task's decision.
    pub(crate) async fn update_mcp_task(
        &self,
        params: UpdateTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let task = self.mcp_task_of(&params.task_id)?;
        for (key, value) in params.input_responses {
            match Decision::parse_key(&key) {
                Some((id, _)) if id == task.id => {}
                _ => {
                    return Err(ErrorData::invalid_params(
                        format!(
                            "'{key}' is not a decision of task {}; tasks/get lists it",
                            task.id.0
                        ),
                        None,
                    ));
                }
            }
            self.first_ask(&key);
            match self.take_response(&key, &value, &ctx).await {
                Ok(Some((_, outcome))) => tracing::info!(task = %task.id, %outcome, "tasks/update"),
                Ok(None) => {}
                Err(e) => {
                    return Err(protocol_error(e));
                }
            }
        }
        Ok(())
    }

    /// `tasks/cancel`: cancels the task (a finished one stays as it is).
    pub(crate) async fn cancel_mcp_task(
        &self,
        params: CancelTaskParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let task = self.mcp_task_of(&params.task_id)?;
        if task.status.is_terminal() {
            return Ok(());
        }
        let id = task.id;
        match self.blocking(move |s| Ok(s.cancel(id)?)).await {
            Ok(_) => Ok(()),
            Err(e) => Err(protocol_error(e)),
        }
    }

    fn mcp_task_of(&self, id: &str) -> Result<Task, ErrorData> {
        let n: i64 = id.trim().parse().map_err(|_| {
            ErrorData::invalid_params(
                format!(
                    "'{id}' is not a TaskBridge task id; an MCP task id is the task's integer id"
                ),
                None,
            )
        })?;
        self.visible_task(TaskId(n)).map_err(protocol_error)
    }
}

/// A `tasks/*` method has no tool result to carry a refusal: the caller's mistakes are invalid
/// params with the reason, faults are logged and internal.
fn protocol_error(e: worker::Error) -> ErrorData {
    if e.is_user_error() {
        ErrorData::invalid_params(e.to_string(), None)
    } else {
        tracing::error!(error = %e, "a tasks request failed");
        ErrorData::internal_error(e.to_string(), None)
    }
}

fn internal(what: &str) -> ErrorData {
    ErrorData::internal_error(format!("{what} failed"), None)
}

fn to_object(result: &rmcp::model::CallToolResult) -> Result<JsonObject, ErrorData> {
    match serde_json::to_value(result) {
        Ok(serde_json::Value::Object(o)) => Ok(o),
        _ => Err(internal("encoding the result")),
    }
}

/// The MCP view of a task: its id, its state and one line about it.
fn mcp_task(task: &Task) -> rmcp::model::Task {
    let status = match task.status {
        TaskStatus::Done => rmcp::model::TaskStatus::Completed,
        TaskStatus::Failed => rmcp::model::TaskStatus::Failed,
        TaskStatus::Cancelled => rmcp::model::TaskStatus::Cancelled,
        TaskStatus::Waiting => rmcp::model::TaskStatus::InputRequired,
        _ => rmcp::model::TaskStatus::Working,
    };
    let mut t = rmcp::model::Task::new(
        task.id.0.to_string(),
        status,
        iso8601(task.created_at),
        iso8601(task.updated_at),
    );
    t.status_message = Some(progress_line(task, None));
    t.poll_interval_ms = Some(POLL_MS);
    t
}

/// Seconds since the epoch as an ISO 8601 UTC time, to the millisecond.
pub(crate) fn iso8601(epoch: f64) -> String {
    let ms = (epoch * 1000.0).round() as i64;
    let (secs, ms) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (the proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::iso8601;

    #[test]
    fn iso8601_gives_utc_times() {
        assert_eq!(iso8601(0.0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(951_782_400.5), "2000-02-29T00:00:00.500Z");
        assert_eq!(iso8601(1_796_355_709.25), "2026-12-04T03:41:49.250Z");
        assert_eq!(iso8601(4_107_542_399.999), "2100-02-28T23:59:59.999Z");
    }
}
