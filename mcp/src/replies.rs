//! What the TaskBridge tools answer, as types: each is the tool's `structuredContent`, and its
//! JSON Schema is the tool's `outputSchema`, so a client can check a reply and a model can read
//! its shape from `tools/list`. The CLI's `--json` output of the same operations is the same
//! value.

use queue::{
    AgentReport, Ask, Check, DiffStat, FileTouched, Permission, PermissionRequest, Task,
    TaskStatus, TestRun, Usage,
};
use schemars::JsonSchema;
use serde::Serialize;

/// A task (`submit_task`, `get_task`, `answer_task`, `followup_task`, `add_task_note`,
/// `cancel_task`, `retry_task`, `set_task_priority`): every stored field with `task_id` first
/// class. Its `result` leaves out the diff, which can be large (`get_task_result` has it).
#[derive(Debug, Serialize, JsonSchema)]
pub struct TaskReply {
    pub task_id: i64,
    #[serde(flatten)]
    pub task: Task,
    /// Whether `submit_task` created it (`false`: the `request_id` named an earlier task).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<bool>,
    /// What `submit_task` said rather than refused: no worker alive to run it, a model that
    /// could not be checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warnings: Option<Vec<String>>,
}

impl TaskReply {
    /// `with_result`: the result without its diff; else none (a task just submitted).
    pub fn of(task: &Task, with_result: bool) -> TaskReply {
        let mut task = task.clone();
        match (&mut task.result, with_result) {
            (Some(r), true) => r.diff.clear(),
            (r, _) => *r = None,
        }
        TaskReply { task_id: task.id.0, task, created: None, warnings: None }
    }

    pub fn submitted(task: &Task, created: bool, warnings: Vec<String>) -> TaskReply {
        TaskReply { created: Some(created), warnings: Some(warnings), ..TaskReply::of(task, false) }
    }
}

/// `submit_batch`: the tasks in the batch's order, and what was said about them.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BatchReply {
    pub tasks: Vec<TaskReply>,
    pub warnings: Vec<String>,
}

/// `wait_for`: the tasks by where they are, and each one's state.
#[derive(Debug, Serialize, JsonSchema)]
pub struct WaitReply {
    pub done: Vec<i64>,
    pub failed: Vec<i64>,
    pub cancelled: Vec<i64>,
    /// Waiting on a decision: answer with `answer_task`.
    pub waiting: Vec<i64>,
    /// Queued, blocked or running.
    pub pending: Vec<i64>,
    /// The wait ended at its time limit rather than because the condition was met.
    pub timed_out: bool,
    pub tasks: Vec<WaitTask>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct WaitTask {
    pub task_id: i64,
    /// `blocked` for a queued task with unfinished dependencies, else its state.
    pub status: String,
    pub title: String,
    pub question: Option<String>,
    pub ask: Option<Ask>,
    pub error: Option<String>,
    /// When TaskBridge put this task's decision to the client itself (elicitation): what came
    /// of it (`answered`, or declined, cancelled, not answered: then answer with answer_task).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asked: Option<String>,
}

impl WaitTask {
    pub fn of(t: &Task) -> WaitTask {
        WaitTask {
            task_id: t.id.0,
            status: t.display_status.clone(),
            title: t.title.clone(),
            question: t.question.clone(),
            ask: t.ask.clone(),
            error: t.error.clone(),
            asked: None,
        }
    }
}

/// `run_task` for a client without MCP Tasks: the task's state when it finished, asked a
/// question, or the wait ran out (then `timed_out`; go on with wait_for).
#[derive(Debug, Serialize, JsonSchema)]
pub struct RunReply {
    pub task_id: i64,
    /// `blocked` for a queued task with unfinished dependencies, else its state.
    pub status: String,
    pub timed_out: bool,
    pub task: WaitTask,
    /// What get_task_result returns, once the task is done or failed.
    pub result: Option<ResultReply>,
}

/// `list_tasks`: a page of tasks, newest first.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ListReply {
    pub tasks: Vec<ListedTask>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListedTask {
    pub task_id: i64,
    pub title: String,
    pub status: String,
    pub priority: i64,
    pub repo: String,
    pub attempts: i64,
    pub waiting_on: Vec<i64>,
    pub question: Option<String>,
    pub error: Option<String>,
    pub created_at: f64,
    pub updated_at: f64,
}

impl ListedTask {
    pub fn of(t: &Task) -> ListedTask {
        ListedTask {
            task_id: t.id.0,
            title: t.title.clone(),
            status: t.display_status.clone(),
            priority: t.priority,
            repo: t.repo.clone(),
            attempts: t.attempts,
            waiting_on: t.waiting_on.iter().map(|i| i.0).collect(),
            question: t.question.clone(),
            error: t.error.clone(),
            created_at: t.created_at,
            updated_at: t.updated_at,
        }
    }
}

/// `get_task_result`: what the task did, checked against git, with its diff.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ResultReply {
    pub task_id: i64,
    pub status: String,
    /// Done, failed or cancelled: nothing more will change.
    pub finished: bool,
    pub summary: String,
    pub files_touched: Vec<FileTouched>,
    pub tests_run: Vec<TestRun>,
    pub open_questions: Vec<String>,
    pub question: Option<String>,
    /// Cut to `max_diff_bytes` (at a character boundary) when `diff_truncated`.
    pub diff: String,
    pub diff_truncated: bool,
    /// The whole diff's length.
    pub diff_bytes: usize,
    pub diffstat: DiffStat,
    /// `cost_usd` is `null` for an agent that reports no cost.
    pub usage: Usage,
    /// Which agent ran it, what it could do natively, and the fallbacks that held instead.
    pub agent: Option<AgentReport>,
    pub branch: Option<String>,
    pub commit: Option<String>,
    pub permissions: Vec<Permission>,
    pub permission_requests: Vec<PermissionRequest>,
    pub reverted_files: Vec<String>,
    pub started_from: Option<String>,
    pub stacked_on: Vec<i64>,
    pub no_changes: bool,
    pub verification: Vec<Check>,
    pub verified: Option<bool>,
    /// Where a worker that ran from a mirror of the remote pushed the branch.
    pub pushed_to: Option<String>,
    /// The host of the worker that ran it.
    pub host: Option<String>,
    /// Other unmerged tasks that changed some of the same paths.
    pub overlaps: Vec<worker::Overlap>,
    pub merged_into: Option<String>,
    pub merge_commit: Option<String>,
    pub error: Option<String>,
    pub note: Option<String>,
}

impl ResultReply {
    pub fn of(task: &Task, max_diff_bytes: usize, overlaps: Vec<worker::Overlap>) -> ResultReply {
        let r = task.result.clone().unwrap_or_default();
        let truncated = r.diff.len() > max_diff_bytes;
        // The last character boundary at or before the limit (0 always is one).
        let cut = (0..=max_diff_bytes.min(r.diff.len()))
            .rev()
            .find(|&i| r.diff.is_char_boundary(i))
            .unwrap_or(0);
        let diff = r.diff[..cut].to_owned();
        let note = if task.status == TaskStatus::Running && task.result.is_some() {
            Some("still running: usage is the spend so far; the rest comes when it ends")
        } else if task.result.is_none() && task.status != TaskStatus::Done {
            Some("no result yet: the task has not run to the end; see status")
        } else {
            None
        };
        ResultReply {
            task_id: task.id.0,
            status: task.display_status.clone(),
            finished: task.status.is_terminal(),
            summary: if r.no_changes {
                format!("No changes: the agent changed no file. {}", r.summary)
            } else {
                r.summary
            },
            files_touched: r.files_touched,
            tests_run: r.tests_run,
            open_questions: r.open_questions,
            question: task.question.clone(),
            diff,
            diff_truncated: truncated,
            diff_bytes: r.diff.len(),
            diffstat: r.diffstat,
            usage: r.usage,
            agent: r.agent,
            branch: r.branch.or(task.branch.clone()),
            commit: r.commit,
            permissions: r.permissions,
            permission_requests: r.permission_requests,
            reverted_files: r.reverted_files,
            started_from: r.started_from.or(task.started_from.clone()),
            stacked_on: task.stacked_on.iter().map(|i| i.0).collect(),
            no_changes: r.no_changes,
            verification: r.verification,
            verified: r.verified,
            pushed_to: r.pushed_to,
            host: task.worker_host.clone(),
            overlaps,
            merged_into: task.merged_into.clone(),
            merge_commit: task.merge_commit.clone(),
            error: task.error.clone(),
            note: note.map(str::to_owned),
        }
    }
}

/// `get_task_logs`: a page of the task's readable log.
#[derive(Debug, Serialize, JsonSchema)]
pub struct LogsReply {
    pub task_id: i64,
    pub text: String,
    pub offset: u64,
    /// Pass it back as `offset` to read on.
    pub next_offset: u64,
    /// The log's size in bytes on this host.
    pub size: u64,
    pub eof: bool,
    pub running: bool,
    /// The host of the worker that ran it.
    pub host: Option<String>,
    /// Where the log is when another host ran the task and this one has none.
    #[serde(rename = "where", skip_serializing_if = "Option::is_none")]
    pub elsewhere: Option<String>,
}

/// `list_workers`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct WorkersReply {
    pub workers: Vec<queue::WorkerInfo>,
}

/// `restart_worker`: what was restarted and requeued, and what started in their place.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RestartReply {
    /// Stale or dead workers whose tasks went back to the queue.
    pub restarted: Vec<String>,
    pub requeued_tasks: Vec<i64>,
    /// The worker this server started in process, if it did.
    pub started_worker: Option<String>,
    /// The installed service, when its manager was asked to restart it.
    pub service: Option<ServiceRestart>,
    pub note: Option<String>,
    pub workers_alive_before: usize,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ServiceRestart {
    pub restarted: bool,
    /// `systemd` or `launchd`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manager: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `clear_finished`: the tasks removed; their branches are never deleted.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ClearReply {
    pub cleared: Vec<i64>,
    pub branches_kept: Vec<String>,
}

/// `list_models`: the models an agent can use.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ModelsReply {
    /// `opencode`, `claude-code` or `codex`.
    pub agent: String,
    pub models: Vec<String>,
    /// How the list was made, when it is not the agent's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// `set_default_model`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct DefaultModelReply {
    pub default_model: String,
}

/// `ping`: the server and its queue.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PingReply {
    pub version: String,
    /// A path, or a URL with its password masked.
    pub database: String,
    /// `sqlite` or `postgres`.
    pub backend: String,
    pub workers_alive: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use queue::{TaskId, TaskResult};

    fn task(status: TaskStatus, result: Option<TaskResult>) -> Task {
        let mut t: Task = serde_json::from_value(serde_json::json!({
            "id": 7, "title": "t", "prompt": "p", "repo": "/r", "base": "abc", "priority": 0,
            "depends_on": [], "waiting_on": [], "model": null, "agent": null, "readonly": false,
            "no_network": false, "no_shell": false, "worktree_keep": false, "max_attempts": 2,
            "timeout_s": 60, "question_timeout_s": null, "request_id": null, "status": "queued",
            "display_status": "queued", "question": null, "questions": [], "notes": [],
            "session_id": null, "result": null, "error": null, "attempts": 1, "worker": null,
            "lease_until": null, "cancel_requested": false, "branch": "taskbridge/task-7",
            "worktree": null, "created_at": 1.0, "started_at": null, "finished_at": null,
            "updated_at": 1.0, "not_before": null, "started_from": "def"
        }))
        .unwrap();
        t.status = status;
        t.display_status = status.as_str().to_owned();
        t.result = result;
        t
    }

    #[test]
    fn a_diff_is_cut_at_a_character_boundary_and_says_so() {
        let r = TaskResult { diff: "ééé".into(), ..Default::default() };
        let t = task(TaskStatus::Done, Some(r));
        let cut = ResultReply::of(&t, 3, vec![]);
        assert_eq!((cut.diff.as_str(), cut.diff_truncated, cut.diff_bytes), ("é", true, 6));
        let whole = ResultReply::of(&t, 6, vec![]);
        assert_eq!((whole.diff.as_str(), whole.diff_truncated), ("ééé", false));
        assert_eq!(ResultReply::of(&t, 0, vec![]).diff, "");
    }

    #[test]
    fn the_reply_says_how_far_the_task_got_and_falls_back_to_the_tasks_own_fields() {
        let running = task(TaskStatus::Running, Some(TaskResult::default()));
        let r = ResultReply::of(&running, 10, vec![]);
        assert!(r.note.as_deref().unwrap().starts_with("still running"), "{:?}", r.note);
        assert!(!r.finished);
        let queued = ResultReply::of(&task(TaskStatus::Queued, None), 10, vec![]);
        assert!(queued.note.as_deref().unwrap().starts_with("no result yet"));
        let running_bare = ResultReply::of(&task(TaskStatus::Running, None), 10, vec![]);
        assert!(running_bare.note.as_deref().unwrap().starts_with("no result yet"));
        let done = ResultReply::of(&task(TaskStatus::Done, None), 10, vec![]);
        assert_eq!((done.note, done.finished), (None, true));
        assert_eq!(done.branch.as_deref(), Some("taskbridge/task-7"));
        assert_eq!(done.started_from.as_deref(), Some("def"));
        let failed =
            ResultReply::of(&task(TaskStatus::Failed, Some(TaskResult::default())), 10, vec![]);
        assert_eq!(failed.note, None, "a finished task's result is its last");
        let nothing =
            TaskResult { summary: "Looked.".into(), no_changes: true, ..Default::default() };
        let r = ResultReply::of(&task(TaskStatus::Done, Some(nothing)), 10, vec![]);
        assert_eq!(r.summary, "No changes: the agent changed no file. Looked.");
        assert_eq!(r.task_id, 7);
    }

    #[test]
    fn a_task_reply_leaves_out_the_diff_or_the_whole_result() {
        let r = TaskResult { summary: "s".into(), diff: "+x".into(), ..Default::default() };
        let t = task(TaskStatus::Done, Some(r));
        let got = TaskReply::of(&t, true);
        assert_eq!(got.task_id, 7);
        let res = got.task.result.as_ref().unwrap();
        assert_eq!((res.summary.as_str(), res.diff.as_str()), ("s", ""));
        let v = serde_json::to_value(&got).unwrap();
        assert!(v["result"].get("diff").is_none() && v.get("created").is_none(), "{v}");
        assert_eq!(TaskReply::of(&t, false).task.result, None);
        let sub = serde_json::to_value(TaskReply::submitted(&t, false, vec!["w".into()])).unwrap();
        assert_eq!(
            (sub["created"].clone(), sub["warnings"].clone()),
            (false.into(), serde_json::json!(["w"]))
        );
        assert_eq!(sub["task_id"], 7);
        assert_eq!(TaskId(7), t.id);
    }
}
