//! A turn's exit, assessed: what the agent reported as a [`TaskResult`], and a [`Verdict`] on
//! how the turn ended (stopped, failed and why, waiting on a decision, finished). Both are pure
//! functions of the exit and the run, so every case is tested with made-up exits; the worker
//! then turns the verdict into the run's outcome ([`Worker::settle`]).

use super::{End, Run, Stage, spent_before};
use crate::agent::AgentKind;
use crate::claim_loop::Worker;
use crate::diagnose::{self, Diagnosis, ModelUsed};
use crate::events::{AgentError, Usage};
use crate::models;
use crate::process::{AgentExit, StopReason};
use crate::result::{self, TaskResult};
use queue::{FailureKind, Outcome, TaskId};

/// How a turn ended.
#[derive(Debug)]
pub(super) enum Verdict {
    /// The lease was lost: nothing may be written.
    LostLease,
    /// The worker is shutting down: the task goes back to the queue.
    Released,
    Cancelled,
    Failed(Diagnosis),
    /// An OpenCode error that its model list may explain (asked by [`Worker::settle`]).
    Explain(AgentError, ModelUsed),
    /// The agent asked the planner a question in its final answer.
    Asks(String),
    /// The agent is blocked on a decision (a native question, a permission request, a budget).
    Waits(queue::Ask),
    /// The agent says it is done: the repository's checks come next.
    Finished,
}

/// The turn's verdict. `rejected` names what a bare `reject` in the answer this run resumed
/// with refused: the agent was told to stop, so a turn that ends without another failure ends
/// the task there.
pub(super) fn assess(exit: &AgentExit, run: &Run<'_>, rejected: Option<&str>) -> Verdict {
    let model = run.model.as_deref();
    let failure = match exit.stopped {
        Some(StopReason::LostLease) => return Verdict::LostLease,
        Some(StopReason::Shutdown) => return Verdict::Released,
        Some(StopReason::Cancel) => return Verdict::Cancelled,
        Some(StopReason::Timeout) => Some(Diagnosis {
            message: format!("timed out after {} s", run.task.timeout_s),
            retryable: true,
            kind: FailureKind::Timeout,
        }),
        // Stopped to wait for a decision: not a failure.
        None if exit.waiting.is_some() && exit.run.error_detail.is_none() => None,
        None => match (&exit.run.error_detail, exit.exit_code, run.spec.kind) {
            (Some(e), _, AgentKind::ClaudeCode) => Some(crate::agent::claude::diagnose(e, model)),
            (Some(e), _, AgentKind::Codex) => Some(crate::agent::codex::diagnose(e, model)),
            (Some(e), _, AgentKind::Acp) => {
                Some(crate::agent::acp::diagnose(e, run.spec.name(), model))
            }
            (Some(e), _, AgentKind::OpenCode) => {
                let used =
                    ModelUsed { requested: run.model.clone(), seen: exit.run.model_seen.clone() };
                return Verdict::Explain(e.clone(), used);
            }
            (None, Some(0), _) => None,
            (None, code, AgentKind::OpenCode) => {
                Some(diagnose::exit_failure(code, &exit.stderr_tail))
            }
            (None, code, kind) => {
                Some(diagnose::cli_exit_failure(kind.name(), code, &exit.stderr_tail))
            }
        },
    };
    let failure = failure.or_else(|| {
        rejected.map(|what| Diagnosis {
            message: format!("stopped: the answer rejected {what}"),
            retryable: false,
            kind: FailureKind::Rejected,
        })
    });
    if let Some(d) = failure {
        return Verdict::Failed(d);
    }
    if let Some(question) = result::question(&exit.run.final_text()) {
        return Verdict::Asks(question);
    }
    match &exit.waiting {
        Some(ask) => Verdict::Waits(ask.clone()),
        None => Verdict::Finished,
    }
}

/// What the turn reported, as the task's result so far: files and diff come later, from git.
/// `carried` is what this run's earlier turns (its fix rounds) spent.
pub(super) fn result_of(exit: &AgentExit, run: &Run<'_>, carried: &Usage) -> TaskResult {
    let task = run.task;
    let final_text = exit.run.final_text();
    let reported = result::reported(&final_text);
    let mut usage = spent_before(task, carried);
    usage.add(&exit.run.usage);
    let mut permissions = result::permissions_for(
        run.spec.kind,
        task.readonly,
        task.no_shell,
        task.no_network,
        &run.walled.held,
    );
    permissions.extend(crate::decisions::ask_permissions(task, run.spec.kind, run.serving()));
    let agent = crate::decisions::agent_report(task, &run.spec, run.capabilities(), run.mode());
    // An agent that reports no cost spent an unknown amount (`null`), not nothing; one that
    // reports it and took no step spent nothing.
    usage.cost_usd = agent.capabilities.reports_cost.then(|| usage.cost());
    TaskResult {
        summary: result::summary(&final_text, &reported),
        tests_run: result::tests_run(&exit.run, &reported),
        open_questions: reported.open_questions.clone(),
        usage,
        branch: Some(run.branch.clone()),
        permissions,
        session_id: exit.run.session_id.clone().or_else(|| task.session_id.clone()),
        exit_code: exit.exit_code,
        tool_calls: exit.run.tool_calls.len(),
        started_from: Some(run.start.clone()),
        stacked_on: task
            .stacked_on
            .iter()
            .map(|t| t.0)
            .chain(run.deps.iter().filter(|d| d.commit.is_some()).map(|d| d.id.0))
            .collect(),
        agent: Some(agent),
        ..Default::default()
    }
}

impl Worker {
    /// The verdict as the run's end, or the result to check when the agent finished. A failed
    /// turn keeps its diff on the result; it fails for good or is retried after the backoff.
    pub(super) async fn settle(
        &self,
        run: &Run<'_>,
        verdict: Verdict,
        mut res: TaskResult,
    ) -> Stage<TaskResult> {
        let task = run.task;
        let d = match verdict {
            Verdict::Finished => return Ok(res),
            Verdict::LostLease => return Err(End::LostLease),
            Verdict::Released => return Err(Outcome::Released.into()),
            Verdict::Cancelled => {
                self.fill_diff(run, &mut res, false).await;
                return Err(Outcome::Cancelled { result: Some(Box::new(res)) }.into());
            }
            Verdict::Asks(question) => {
                let Some(session_id) = res.session_id.clone() else {
                    let error = format!(
                        "the agent asked a question but {} reported no session to resume",
                        run.spec.kind.name()
                    );
                    let result = Some(Box::new(res));
                    let kind = FailureKind::Rejected;
                    return Err(Outcome::Failed { error, kind, result, backoff_s: 0.0 }.into());
                };
                let result = Some(Box::new(res));
                return Err(Outcome::Waiting { question, session_id, result, ask: None }.into());
            }
            Verdict::Waits(ask) => {
                return Err(Outcome::Waiting {
                    question: ask.text(),
                    session_id: res.session_id.clone().unwrap_or_default(),
                    result: Some(Box::new(res)),
                    ask: Some(Box::new(ask)),
                }
                .into());
            }
            Verdict::Failed(d) => d,
            Verdict::Explain(e, used) => self.diagnose_agent_error(&e, &used).await,
        };
        self.fill_diff(run, &mut res, false).await;
        if let Some(end) = super::worktree::tampered(&mut res) {
            return Err(end.into());
        }
        let result = Some(Box::new(res));
        Err(match d.retryable {
            false => Outcome::FailedPermanently { error: d.message, kind: d.kind, result },
            true => Outcome::Failed {
                error: d.message,
                kind: d.kind,
                result,
                backoff_s: self.backoff(task.attempts),
            },
        }
        .into())
    }

    /// An agent error, explained. OpenCode answers a model it does not offer with an
    /// `UnknownError` that says nothing more; asking its model list tells that case apart.
    async fn diagnose_agent_error(&self, e: &AgentError, used: &ModelUsed) -> Diagnosis {
        if e.name == "UnknownError"
            && let Some(m) = used.requested.clone()
        {
            let opencode = self.cfg.opencode.clone();
            let check = self.blocking(move |s| Ok(models::check_model(s, &opencode, &m))).await;
            if let Ok(Err(unknown)) = check {
                return Diagnosis {
                    message: format!("{unknown}; the task cannot run with it"),
                    retryable: false,
                    kind: FailureKind::Model,
                };
            }
        }
        diagnose::agent_error(e, used)
    }

    /// Every permission request of the task so far, with its answer and who gave it.
    pub(super) async fn permission_requests(&self, id: TaskId) -> Vec<result::PermissionRequest> {
        let Ok(task) = self.blocking(move |s| s.get(id)).await else { return vec![] };
        task.questions
            .iter()
            .filter_map(|q| {
                let p = q.ask.as_ref()?.permission.as_ref()?;
                Some(result::PermissionRequest {
                    permission: p.permission.clone(),
                    patterns: p.patterns.clone(),
                    target: p.target.clone(),
                    answer: q.answer.clone(),
                    answered_by: q.answered_by.clone(),
                    asked_at: q.asked_at,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{RunLog, ToolCall};
    use crate::run::tests::run_of;

    fn exit(code: Option<i32>, text: &str) -> AgentExit {
        let run = RunLog { last_step_texts: vec![text.to_owned()], ..Default::default() };
        AgentExit { exit_code: code, stopped: None, stderr_tail: String::new(), run, waiting: None }
    }

    fn failed(v: Verdict) -> Diagnosis {
        match v {
            Verdict::Failed(d) => d,
            other => panic!("not a failure: {other:?}"),
        }
    }

    fn ask() -> queue::Ask {
        queue::Ask::question(vec![queue::AgentQuestion {
            question: "Red or blue?".into(),
            header: None,
            options: vec![],
            multiple: false,
        }])
    }

    #[test]
    fn a_stop_ends_the_turn_as_what_stopped_it() {
        let task = crate::sample_task();
        let run = run_of(&task, AgentKind::OpenCode);
        let stopped = |r| AgentExit { stopped: Some(r), ..exit(None, "done") };
        assert!(matches!(assess(&stopped(StopReason::LostLease), &run, None), Verdict::LostLease));
        assert!(matches!(assess(&stopped(StopReason::Shutdown), &run, None), Verdict::Released));
        assert!(matches!(assess(&stopped(StopReason::Cancel), &run, None), Verdict::Cancelled));
        let d = failed(assess(&stopped(StopReason::Timeout), &run, None));
        assert_eq!(
            d,
            Diagnosis {
                message: "timed out after 1 s".into(),
                retryable: true,
                kind: FailureKind::Timeout
            }
        );
    }

    #[test]
    fn a_clean_exit_finishes_and_a_failing_one_says_how_for_each_agent() {
        let task = crate::sample_task();
        let opencode = run_of(&task, AgentKind::OpenCode);
        assert!(matches!(assess(&exit(Some(0), "All done."), &opencode, None), Verdict::Finished));
        let crashed = AgentExit { stderr_tail: "boom".into(), ..exit(Some(3), "") };
        assert_eq!(
            failed(assess(&crashed, &opencode, None)),
            diagnose::exit_failure(Some(3), "boom")
        );
        let codex = run_of(&task, AgentKind::Codex);
        assert_eq!(
            failed(assess(&crashed, &codex, None)),
            diagnose::cli_exit_failure("codex", Some(3), "boom")
        );
    }

    #[test]
    fn an_agent_error_is_explained_by_the_agent_that_reported_it() {
        let task = crate::sample_task();
        let e = AgentError { name: "APIError".into(), status: Some(401), ..Default::default() };
        let mut errored = exit(Some(1), "");
        errored.run.error_detail = Some(e.clone());
        errored.run.model_seen = Some("anthropic/seen".into());
        for kind in [AgentKind::ClaudeCode, AgentKind::Codex] {
            let run = run_of(&task, kind);
            let want = match kind {
                AgentKind::ClaudeCode => crate::agent::claude::diagnose(&e, run.model.as_deref()),
                _ => crate::agent::codex::diagnose(&e, run.model.as_deref()),
            };
            assert_eq!(failed(assess(&errored, &run, None)), want, "{kind:?}");
        }
        // OpenCode's is explained with the model asked for and the one its log saw, and even
        // when it also waits on a decision.
        errored.waiting = Some(ask());
        match assess(&errored, &run_of(&task, AgentKind::OpenCode), None) {
            Verdict::Explain(got, used) => {
                assert_eq!(got, e);
                assert_eq!(used.requested.as_deref(), Some("anthropic/claude-x"));
                assert_eq!(used.seen.as_deref(), Some("anthropic/seen"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_bare_reject_fails_a_turn_that_otherwise_finished_or_waits() {
        let task = crate::sample_task();
        let run = run_of(&task, AgentKind::OpenCode);
        let d = failed(assess(&exit(Some(0), "ok"), &run, Some("bash: rm -rf x")));
        assert_eq!(d.message, "stopped: the answer rejected bash: rm -rf x");
        assert!(!d.retryable);
        let waits = AgentExit { waiting: Some(ask()), ..exit(None, "") };
        assert!(matches!(assess(&waits, &run, Some("x")), Verdict::Failed(_)));
        // A failure of its own is said rather than the reject.
        let timed_out = AgentExit { stopped: Some(StopReason::Timeout), ..exit(None, "") };
        assert!(failed(assess(&timed_out, &run, Some("x"))).message.starts_with("timed out"));
    }

    #[test]
    fn a_question_in_the_final_answer_comes_before_a_decision_it_waits_on() {
        let task = crate::sample_task();
        let run = run_of(&task, AgentKind::OpenCode);
        let text = "Which?\n```taskbridge-question\n{\"question\": \"A or B?\"}\n```";
        let both = AgentExit { waiting: Some(ask()), ..exit(Some(0), text) };
        assert!(matches!(assess(&both, &run, None), Verdict::Asks(q) if q == "A or B?"));
        let waits = AgentExit { waiting: Some(ask()), ..exit(None, "") };
        assert!(matches!(assess(&waits, &run, None), Verdict::Waits(a) if a == ask()));
    }

    #[test]
    fn a_cost_is_null_only_when_the_agent_reports_none() {
        let task = crate::sample_task();
        let mut e = exit(Some(0), "Done.");
        e.run.usage = Usage { input_tokens: 7, cost_usd: None, ..Default::default() };
        let codex = result_of(&e, &run_of(&task, AgentKind::Codex), &Usage::default());
        assert_eq!((codex.usage.cost_usd, codex.usage.input_tokens), (None, 7));
        assert!(!codex.cost_known());
        assert!(serde_json::to_value(&codex).unwrap()["usage"]["cost_usd"].is_null());
        // An agent that reports its cost and took no step spent nothing, which is known.
        let claude = result_of(&e, &run_of(&task, AgentKind::ClaudeCode), &Usage::default());
        assert_eq!(claude.usage.cost_usd, Some(0.0));
    }

    #[test]
    fn the_result_adds_up_the_runs_spend_and_keeps_where_the_task_started() {
        let mut task = crate::sample_task();
        task.session_id = Some("ses_task".into());
        task.stacked_on = vec![TaskId(3)];
        let earlier = TaskResult {
            usage: Usage { input_tokens: 100, cost_usd: Some(0.5), ..Default::default() },
            ..Default::default()
        };
        task.result = Some(earlier);
        let mut run = run_of(&task, AgentKind::ClaudeCode);
        run.deps = vec![
            super::super::DepInfo {
                id: TaskId(4),
                title: "d".into(),
                summary: String::new(),
                branch: None,
                files: vec![],
                commit: Some("c".into()),
            },
            super::super::DepInfo {
                id: TaskId(5),
                title: "nothing".into(),
                summary: String::new(),
                branch: None,
                files: vec![],
                commit: None,
            },
        ];
        let text = "Done.\n```taskbridge-result\n{\"summary\": \"Added a test.\", \
                    \"tests_run\": [\"cargo test\"], \"open_questions\": [\"Keep it?\"]}\n```";
        let mut e = exit(Some(0), text);
        e.run.usage = Usage {
            input_tokens: 10,
            output_tokens: 5,
            cost_usd: Some(0.25),
            ..Default::default()
        };
        e.run.tool_calls = vec![ToolCall {
            tool: "bash".into(),
            target: "cargo test".into(),
            status: "completed".into(),
            exit_code: Some(0),
        }];
        let carried = Usage { input_tokens: 1, cost_usd: Some(0.125), ..Default::default() };
        let res = result_of(&e, &run, &carried);
        assert_eq!((res.usage.input_tokens, res.usage.output_tokens), (111, 5));
        assert_eq!(res.usage.cost_usd, Some(0.875));
        assert_eq!(
            res.session_id.as_deref(),
            Some("ses_task"),
            "the task's, when the turn names none"
        );
        assert_eq!(res.stacked_on, vec![3, 4], "only a dependency with work is stacked on");
        assert_eq!(res.started_from.as_deref(), Some(run.start.as_str()));
        assert_eq!(res.branch.as_deref(), Some("taskbridge/task-1"));
        assert_eq!((res.exit_code, res.tool_calls), (Some(0), 1));
        assert_eq!(res.summary, "Added a test.");
        assert_eq!(res.open_questions, ["Keep it?"]);
        let observed =
            result::TestRun { command: "cargo test".into(), exit_code: Some(0), observed: true };
        assert_eq!(res.tests_run, [observed]);
        let flags = result::permissions_for(
            AgentKind::ClaudeCode,
            false,
            false,
            false,
            &Default::default(),
        );
        assert!(!flags.is_empty());
        assert_eq!(res.permissions, flags);
        assert_eq!(res.agent.as_ref().map(|a| a.name.as_str()), Some("claude-code"));
        e.run.session_id = Some("ses_turn".into());
        assert_eq!(result_of(&e, &run, &carried).session_id.as_deref(), Some("ses_turn"));
    }

    /// A worker on a real queue whose `opencode models` offers two models.
    fn worker_offering_models(
        dir: &std::path::Path,
    ) -> (std::sync::Arc<Worker>, std::sync::Arc<queue::Store>) {
        use std::os::unix::fs::PermissionsExt;
        let home = queue::Home::at(dir.join("home")).unwrap();
        home.ensure().unwrap();
        let store = std::sync::Arc::new(queue::Store::open(home.db_path()).unwrap());
        let opencode = dir.join("opencode");
        std::fs::write(
            &opencode,
            "#!/bin/sh\nprintf 'anthropic/claude-a\\nanthropic/claude-b\\n'\n",
        )
        .unwrap();
        std::fs::set_permissions(&opencode, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cfg = crate::config::WorkerConfig {
            opencode,
            opencode_mode: crate::config::OpenCodeMode::Run,
            ..Default::default()
        };
        (Worker::new(store.clone(), home, cfg), store)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn opencodes_unknown_error_for_a_model_it_does_not_offer_fails_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let (worker, _) = worker_offering_models(dir.path());
        let unknown = AgentError { name: "UnknownError".into(), ..Default::default() };
        let used = |m: &str| ModelUsed { requested: Some(m.into()), seen: None };
        let d = worker.diagnose_agent_error(&unknown, &used("anthropic/claude-z")).await;
        assert!(!d.retryable && d.message.ends_with("; the task cannot run with it"), "{d:?}");
        assert!(d.message.contains("anthropic/claude-z"), "{d:?}");
        // A model it offers, or another error: OpenCode's own words, explained.
        let api = AgentError { name: "APIError".into(), ..Default::default() };
        for (e, m) in [(&unknown, "anthropic/claude-a"), (&api, "anthropic/claude-z")] {
            let got = worker.diagnose_agent_error(e, &used(m)).await;
            assert_eq!(got, diagnose::agent_error(e, &used(m)), "{} {m}", e.name);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_results_permission_requests_are_the_tasks_with_their_answers() {
        let dir = tempfile::tempdir().unwrap();
        let (worker, store) = worker_offering_models(dir.path());
        let spec = queue::TaskSpec::new("t", "/tmp/r", "0123456789abcdef0123456789abcdef01234567");
        let (t, _) = store.submit(spec).unwrap();
        let c = store.claim_next("w", "h", std::time::Duration::from_secs(60)).unwrap().unwrap();
        let ask = queue::Ask::permission(queue::PermissionAsk {
            permission: "bash".into(),
            patterns: vec!["rm x".into()],
            target: Some("rm x".into()),
            always: vec![],
        });
        let waiting = Outcome::Waiting {
            question: ask.text(),
            session_id: "s".into(),
            result: None,
            ask: Some(Box::new(ask)),
        };
        store.finish(t.id, c.token, waiting).unwrap();
        store.answer(t.id, "once", "tui").unwrap();
        let got = worker.permission_requests(t.id).await;
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            (got[0].permission.as_str(), got[0].patterns.clone()),
            ("bash", vec!["rm x".into()])
        );
        assert_eq!(
            (got[0].answer.as_deref(), got[0].answered_by.as_deref()),
            (Some("once"), Some("tui"))
        );
        assert_eq!(got[0].target.as_deref(), Some("rm x"));
        assert!(worker.permission_requests(queue::TaskId(99)).await.is_empty());
    }
}
