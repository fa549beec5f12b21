//! Waiting on tasks for a client: the loop behind `wait_for` and `run_task`. While it waits it
//! tells the client how the tasks go (`notifications/progress`, when the call carried a
//! progress token) and asks the client for their decisions (elicitation, when the client
//! declared it): as an `elicitation/create` request on a 2025-11-25 session, as an
//! `input_required` result under 2026-07-28, where a server may not send requests of its own.

use crate::decisions::{Decision, Reply};
use crate::replies::{WaitReply, WaitTask};
use crate::server::TaskBridge;
use crate::tools::WaitMode;
use queue::{Task, TaskId, TaskStatus};
use rmcp::model::{
    ElicitRequest, InputRequest, InputRequests, InputRequiredResult, InputResponses,
    ProgressNotificationParam, ProgressToken, ProtocolVersion,
};
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// How long a person has to answer a client's dialog before the wait gives up on it (the task
/// keeps waiting; `answer_task` still answers it).
const ELICIT_TIMEOUT: Duration = Duration::from_secs(600);
/// How often a wait with a progress token looks at the running tasks' logs: log lines are not
/// queue changes, so nothing else wakes it for them.
const PROGRESS_TICK: Duration = Duration::from_secs(2);
/// How often a submitter's watch looks again when nothing in the queue changed.
const SUBMITTER_TICK: Duration = Duration::from_secs(5);
/// Claude Code cuts a progress message at 200 characters.
const PROGRESS_MAX: usize = 200;

/// How this call's client can be asked for a decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Asker {
    /// It declared no form elicitation: the planner model answers with `answer_task`.
    No,
    /// A request of the server's own, in the middle of the call (2025-11-25 sessions).
    Request,
    /// An `input_required` result the client answers by calling again (2026-07-28).
    InputRequired,
}

impl Asker {
    pub fn of(ctx: &RequestContext<RoleServer>) -> Asker {
        let form = ctx
            .client_capabilities()
            .and_then(|c| c.elicitation)
            // An empty `elicitation: {}` is the 2025-06-18 way of saying form.
            .is_some_and(|e| e.form.is_some() || e.url.is_none());
        if !form {
            return Asker::No;
        }
        let modern = ctx
            .protocol_version()
            .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
        if modern { Asker::InputRequired } else { Asker::Request }
    }
}

/// What a wait came to.
pub(crate) enum Waited {
    Reply(WaitReply),
    /// The client must answer these decisions and call again.
    Input(InputRequiredResult),
}

/// Who an elicited answer is recorded as answered by.
pub(crate) fn answered_by(ctx: &RequestContext<RoleServer>) -> String {
    match ctx.client_info() {
        Some(info) => format!("elicitation:{}", info.name),
        None => "elicitation".to_owned(),
    }
}

impl TaskBridge {
    /// Waits until `mode` is met or `timeout` passes, asking the client for the decisions of
    /// the tasks it waits on, once each. `responses` are the client's answers to an earlier
    /// `input_required` round of this call.
    pub(crate) async fn wait_tasks(
        &self,
        ids: &[i64],
        mode: WaitMode,
        timeout: Duration,
        ctx: &RequestContext<RoleServer>,
        responses: Option<InputResponses>,
    ) -> worker::Result<Waited> {
        let _counted = self.wait_guard();
        let deadline = tokio::time::Instant::now() + timeout;
        let asker = Asker::of(ctx);
        let by = answered_by(ctx);
        let mut asked: HashMap<i64, String> = HashMap::new();
        if let Some(responses) = responses {
            for (key, value) in responses {
                if let Some((task, outcome)) = self.take_response(&key, &value, ctx).await? {
                    asked.insert(task.0, outcome);
                }
            }
        }
        let mut progress = Progress::new(ctx);
        let mut changes = self.subscribe();
        loop {
            // Mark the current version seen before reading, so no change between the read and
            // the wait is missed.
            changes.borrow_and_update();
            let tasks = ids
                .iter()
                .map(|&i| self.visible_task(TaskId(i)))
                .collect::<worker::Result<Vec<_>>>()?;
            progress.report(self, &tasks).await;
            let mut inputs = InputRequests::new();
            let mut answered = false;
            for t in &tasks {
                let Some(d) = Decision::of(t) else { continue };
                if asker == Asker::No || !self.first_ask(&d.key()) {
                    continue;
                }
                match asker {
                    Asker::InputRequired => {
                        let req = ElicitRequest::new(d.form());
                        inputs.insert(d.key(), InputRequest::Elicitation(req));
                    }
                    _ => {
                        let outcome = self.elicit(&d, &ctx.peer, &by).await?;
                        answered |= outcome == "answered";
                        asked.insert(t.id.0, outcome);
                    }
                }
            }
            if !inputs.is_empty() {
                return Ok(Waited::Input(InputRequiredResult::new(Some(inputs), None)));
            }
            if answered {
                // The answered tasks go on: read again rather than report them as waiting.
                continue;
            }
            let settled = |t: &Task| t.status.is_terminal() || t.status == TaskStatus::Waiting;
            let met = match mode {
                WaitMode::Any => tasks.iter().any(settled),
                WaitMode::All => tasks.iter().all(settled),
            };
            if met || tokio::time::Instant::now() >= deadline {
                let pick = |st: TaskStatus| -> Vec<i64> {
                    tasks.iter().filter(|t| t.status == st).map(|t| t.id.0).collect()
                };
                let pending = tasks.iter().filter(|t| !settled(t)).map(|t| t.id.0).collect();
                let waits = tasks
                    .iter()
                    .map(|t| {
                        let mut w = WaitTask::of(t);
                        w.asked = asked.get(&t.id.0).cloned();
                        w
                    })
                    .collect();
                return Ok(Waited::Reply(WaitReply {
                    done: pick(TaskStatus::Done),
                    failed: pick(TaskStatus::Failed),
                    cancelled: pick(TaskStatus::Cancelled),
                    waiting: pick(TaskStatus::Waiting),
                    pending,
                    timed_out: !met,
                    tasks: waits,
                }));
            }
            let wake = match progress.token {
                Some(_) => deadline.min(tokio::time::Instant::now() + PROGRESS_TICK),
                None => deadline,
            };
            let _ = tokio::time::timeout_at(wake, changes.changed()).await;
        }
    }

    /// Asks the client for `d` with a request of the server's own; what came of it, in words
    /// for the reply's `asked`.
    async fn elicit(
        &self,
        d: &Decision,
        peer: &Peer<RoleServer>,
        by: &str,
    ) -> worker::Result<String> {
        let sent = peer.create_elicitation_with_timeout(d.form(), Some(ELICIT_TIMEOUT)).await;
        match sent {
            Ok(result) => self.apply(d, &Reply::of(d, &result), by).await,
            Err(e) => {
                tracing::info!(task = %d.task, error = %e, "the client did not answer a decision");
                Ok(format!(
                    "asked in the client, which did not answer ({e}); answer with answer_task"
                ))
            }
        }
    }

    /// The client's answer to decision `key` from an `input_required` round or `tasks/update`.
    /// `None` when the key names no decision of a task this server may see.
    pub(crate) async fn take_response(
        &self,
        key: &str,
        value: &serde_json::Value,
        ctx: &RequestContext<RoleServer>,
    ) -> worker::Result<Option<(TaskId, String)>> {
        let Some((id, round)) = Decision::parse_key(key) else { return Ok(None) };
        let task = match self.visible_task(id) {
            Ok(t) => t,
            Err(_) => return Ok(None),
        };
        let Some(d) = Decision::of(&task).filter(|d| d.round == round) else {
            return Ok(Some((id, "the decision was already made elsewhere".to_owned())));
        };
        let Some(result) = crate::decisions::parse_result(value) else {
            return Ok(Some((id, "the client's reply was not an elicitation result".to_owned())));
        };
        let outcome = self.apply(&d, &Reply::of(&d, &result), &answered_by(ctx)).await?;
        Ok(Some((id, outcome)))
    }

    async fn apply(&self, d: &Decision, reply: &Reply, by: &str) -> worker::Result<String> {
        let answer = match reply {
            Reply::Answer(a) => a.clone(),
            Reply::NotAnswered(why) => {
                return Ok(format!("asked in the client: {why}; answer with answer_task"));
            }
        };
        let (id, by, text) = (d.task, by.to_owned(), answer.clone());
        match self.blocking(move |s| Ok(s.answer(id, &text, &by)?)).await {
            Ok(_) => Ok("answered".to_owned()),
            // Answered in the TUI meanwhile, or an answer the decision does not take: the task
            // is as it was and the reply says why.
            Err(e) if e.is_user_error() => Ok(format!("the client's answer was not taken: {e}")),
            Err(e) => Err(e),
        }
    }
}

impl TaskBridge {
    /// Goes on asking the client that submitted `ids` for their decisions after its call
    /// returned, until the tasks end or the client goes away: a planner that submitted work and
    /// went on with something else still gets the agent's questions in front of its person.
    /// Only for a client that takes requests of the server's own (a 2025-11-25 session) over a
    /// transport that always delivers them (stdio); each decision is still asked once, by this
    /// or by a call that waits on it, whichever sees it first.
    pub(crate) fn ask_submitter(&self, ids: Vec<i64>, ctx: &RequestContext<RoleServer>) {
        if ids.is_empty() || !self.asks_outside_calls() || Asker::of(ctx) != Asker::Request {
            return;
        }
        let (bridge, peer, by) = (self.clone(), ctx.peer.clone(), answered_by(ctx));
        let shutdown = self.shutdown_token();
        tokio::spawn(async move {
            let mut changes = bridge.subscribe();
            let mut open = ids;
            while !open.is_empty() && !peer.is_transport_closed() && !shutdown.is_cancelled() {
                changes.borrow_and_update();
                let mut still = Vec::with_capacity(open.len());
                for id in open {
                    let Ok(task) = bridge.visible_task(TaskId(id)) else { continue };
                    if task.status.is_terminal() {
                        continue;
                    }
                    if let Some(d) = Decision::of(&task)
                        && bridge.first_ask(&d.key())
                    {
                        match bridge.elicit(&d, &peer, &by).await {
                            Ok(outcome) => {
                                tracing::info!(task = %id, %outcome, "asked the submitter")
                            }
                            Err(e) => {
                                tracing::warn!(task = %id, error = %e, "asking the submitter failed")
                            }
                        }
                    }
                    still.push(id);
                }
                open = still;
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    // The queue's changes wake it; the tick notices a client that went away.
                    _ = tokio::time::timeout(SUBMITTER_TICK, changes.changed()) => {}
                }
            }
        });
    }
}

/// `notifications/progress` for one call: a short line for each task whose line changed.
struct Progress {
    token: Option<ProgressToken>,
    peer: rmcp::Peer<RoleServer>,
    sent: f64,
    last: BTreeMap<i64, String>,
}

impl Progress {
    fn new(ctx: &RequestContext<RoleServer>) -> Progress {
        Progress {
            token: ctx.meta.get_progress_token(),
            peer: ctx.peer.clone(),
            sent: 0.0,
            last: BTreeMap::new(),
        }
    }

    async fn report(&mut self, bridge: &TaskBridge, tasks: &[Task]) {
        let Some(token) = self.token.clone() else { return };
        for t in tasks {
            let activity = match t.status {
                TaskStatus::Running => last_log_line(bridge, t.id),
                _ => None,
            };
            let line = progress_line(t, activity.as_deref());
            if self.last.get(&t.id.0) == Some(&line) {
                continue;
            }
            self.sent += 1.0;
            let mut p = ProgressNotificationParam::new(token.clone(), self.sent);
            p.message = Some(line.clone());
            if let Err(e) = self.peer.notify_progress(p).await {
                tracing::debug!(error = %e, "sending progress failed");
            }
            self.last.insert(t.id.0, line);
        }
    }
}

/// One line about a task for a progress notification: its state, what it is doing, its spend.
pub(crate) fn progress_line(t: &Task, activity: Option<&str>) -> String {
    let mut line = format!("task {} {}", t.id.0, t.display_status);
    match t.status {
        TaskStatus::Running => {
            if let Some(a) = activity {
                line.push_str(": ");
                line.push_str(a);
            }
            if let Some(usage) = t.result.as_ref().map(|r| &r.usage) {
                let tokens = usage.input_tokens + usage.output_tokens;
                if let Some(cost) = usage.cost_usd.filter(|c| *c > 0.0) {
                    line.push_str(&format!(" · ${cost:.4}"));
                }
                if tokens > 0 {
                    line.push_str(&format!(" · {tokens} tokens"));
                }
            }
        }
        TaskStatus::Waiting => {
            if let Some(q) = &t.question {
                line.push_str(": ");
                line.push_str(q);
            }
        }
        TaskStatus::Failed => {
            if let Some(e) = &t.error {
                line.push_str(": ");
                line.push_str(e);
            }
        }
        _ if t.is_blocked() => {
            let on: Vec<String> = t.waiting_on.iter().map(|d| d.0.to_string()).collect();
            line.push_str(&format!(" on {}", on.join(", ")));
        }
        _ => {}
    }
    let line = line.replace(['\n', '\r'], " ");
    if line.chars().count() <= PROGRESS_MAX {
        return line;
    }
    let cut: String = line.chars().take(PROGRESS_MAX - 1).collect();
    format!("{cut}…")
}

/// The last line of the task's log on this host: what the agent is doing now.
fn last_log_line(bridge: &TaskBridge, id: TaskId) -> Option<String> {
    let path = worker::logs::log_path(&bridge.home().logs_dir(), id.0);
    let chunk = worker::logs::read_log(&path, None, 2048).ok()?;
    let line = chunk.text.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
    Some(line.chars().take(120).collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn task(status: TaskStatus) -> Task {
        let mut t: Task = serde_json::from_value(serde_json::json!({
            "id": 4, "title": "t", "prompt": "p", "repo": "/r", "base": "HEAD", "priority": 0,
            "depends_on": [], "waiting_on": [], "model": null, "agent": null, "readonly": false,
            "no_network": false, "no_shell": false, "worktree_keep": false, "max_attempts": 1,
            "timeout_s": 60, "question_timeout_s": null, "request_id": null, "status": "queued",
            "display_status": "queued", "question": null, "questions": [], "notes": [],
            "session_id": null, "result": null, "error": null, "attempts": 0, "worker": null,
            "lease_until": null, "cancel_requested": false, "branch": null, "worktree": null,
            "created_at": 0.0, "started_at": null, "finished_at": null, "updated_at": 0.0,
            "not_before": null
        }))
        .unwrap();
        t.status = status;
        t.display_status = status.to_string();
        t
    }

    #[test]
    fn a_running_line_says_what_it_does_and_what_it_spent() {
        let mut t = task(TaskStatus::Running);
        let mut r = queue::TaskResult::default();
        r.usage.input_tokens = 100;
        r.usage.output_tokens = 20;
        r.usage.cost_usd = Some(0.0123);
        t.result = Some(r);
        assert_eq!(
            progress_line(&t, Some("bash: cargo test")),
            "task 4 running: bash: cargo test · $0.0123 · 120 tokens"
        );
        t.result = None;
        assert_eq!(progress_line(&t, None), "task 4 running");
    }

    #[test]
    fn waiting_and_failed_lines_carry_the_question_and_the_error_on_one_short_line() {
        let mut t = task(TaskStatus::Waiting);
        t.question = Some("Red\nor blue?".into());
        assert_eq!(progress_line(&t, None), "task 4 waiting: Red or blue?");
        let mut f = task(TaskStatus::Failed);
        f.error = Some("x".repeat(500));
        let line = progress_line(&f, None);
        assert_eq!(line.chars().count(), PROGRESS_MAX);
        assert!(line.starts_with("task 4 failed: xxx") && line.ends_with('…'));
    }

    #[test]
    fn a_blocked_line_names_what_it_waits_on() {
        let mut t = task(TaskStatus::Queued);
        t.waiting_on = vec![TaskId(2), TaskId(3)];
        t.display_status = "blocked".into();
        assert_eq!(progress_line(&t, None), "task 4 blocked on 2, 3");
    }
}
