//! What a scrape of `/metrics` reads, in Prometheus's text format. Two sources, one rule:
//!
//! - the queue's state, read at each scrape, the same from every process on one queue
//!   (on PostgreSQL the shared queue's): `taskbridge_tasks{state}`,
//!   `taskbridge_tasks_submitted_total{agent}` (kept by the queue, so a submit over stdio or
//!   the CLI counts too), `taskbridge_workers{host}` and `taskbridge_worker_slots{state}` of the
//!   live workers;
//! - what this process's workers did, counted as it happens: runs finished, queue and run
//!   times, decision waits, tokens, cost and failures. Across processes these add up (`sum`).
//!
//! The names are a contract: dashboards depend on them (README, "Metrics").

use crate::error::{Error, Result};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use queue::{AskKind, Claim, Outcome, Store, Task, TaskResult};
use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;

/// The content type of what [`render`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentLabel {
    agent: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentOutcome {
    agent: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentModel {
    agent: String,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentModelKind {
    agent: String,
    model: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentKind {
    agent: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabel {
    host: String,
}

/// What this process's workers counted. One per process (the default registry's way): every
/// worker in it adds to the same series.
struct Local {
    finished: Family<AgentOutcome, Counter>,
    queue_wait: Histogram,
    run: Histogram,
    decision_wait: Family<KindLabel, Histogram>,
    tokens: Family<AgentModelKind, Counter>,
    cost: Family<AgentModel, Counter<f64, AtomicU64>>,
    errors: Family<AgentKind, Counter>,
}

static LOCAL: LazyLock<Local> = LazyLock::new(|| Local {
    finished: Family::default(),
    // 50 ms to about 27 minutes: a warm pickup to a queue that waits on a busy fleet.
    queue_wait: Histogram::new(exponential_buckets(0.05, 2.0, 16)),
    // 1 s to about 4.5 hours: tasks time out after an hour by default.
    run: Histogram::new(exponential_buckets(1.0, 2.0, 15)),
    decision_wait: Family::new_with_constructor(|| {
        Histogram::new(exponential_buckets(1.0, 2.0, 18))
    }),
    tokens: Family::default(),
    cost: Family::default(),
    errors: Family::default(),
});

/// The agent a task runs on, as a label: `opencode` (also for one of OpenCode's own agents),
/// `claude-code` or `codex`.
pub fn agent_label(task: &Task) -> &'static str {
    crate::agent::AgentSpec::of(task).kind.name()
}

/// The model a task names, as a label; `default` for the agent's (or the queue's) default.
/// A finished run is counted under the model it ran on (`finished`'s `model`).
pub fn model_label(task: &Task) -> &str {
    task.model.as_deref().filter(|m| !m.is_empty()).unwrap_or("default")
}

/// A claim taken: how long the task had been ready, and, when it resumes after an answer, how
/// long its decision waited.
pub(crate) fn claimed(claim: &Claim) {
    LOCAL.queue_wait.observe(claim.queue_wait_s.max(0.0));
    let Some(resume) = &claim.resume else { return };
    let Some(round) = claim.task.questions.last() else { return };
    let Some(answered) = round.answered_at else { return };
    let kind = match resume.ask.as_ref().map(|a| a.kind) {
        Some(AskKind::Permission) => "permission",
        Some(AskKind::Budget) => "budget",
        Some(AskKind::Question) | None => "question",
    };
    LOCAL
        .decision_wait
        .get_or_create(&KindLabel { kind: kind.into() })
        .observe((answered - round.asked_at).max(0.0));
}

/// A run ended with `outcome` after `run_s` seconds: what it spent (beyond what the task had
/// spent before it) and how it ended.
/// A run ended, on `model` (the one named to the agent, the queue's default included; `None`
/// for the agent's own default).
pub(crate) fn finished(task: &Task, model: Option<&str>, outcome: &Outcome, run_s: f64) {
    let agent = agent_label(task).to_owned();
    let (name, result, kind) = match outcome {
        Outcome::Done { result } => ("done", Some(result.as_ref()), None),
        Outcome::Failed { result, kind, .. } | Outcome::FailedPermanently { result, kind, .. } => {
            ("failed", result.as_deref(), Some(*kind))
        }
        Outcome::Waiting { result, .. } => ("waiting", result.as_deref(), None),
        Outcome::Cancelled { result } => ("cancelled", result.as_deref(), None),
        Outcome::Released => ("released", None, None),
    };
    LOCAL
        .finished
        .get_or_create(&AgentOutcome { agent: agent.clone(), outcome: name.into() })
        .inc();
    LOCAL.run.observe(run_s.max(0.0));
    if let Some(kind) = kind {
        LOCAL
            .errors
            .get_or_create(&AgentKind { agent: agent.clone(), kind: kind.to_string() })
            .inc();
    }
    if let Some(result) = result {
        let model = model.filter(|m| !m.is_empty()).unwrap_or_else(|| model_label(task));
        spent(task, result, &agent, model);
    }
}

fn spent(task: &Task, result: &TaskResult, agent: &str, model: &str) {
    let before = task.result.as_ref().map(|r| r.usage.clone()).unwrap_or_default();
    let now = &result.usage;
    let model = model.to_owned();
    for (kind, after, was) in [
        ("input", now.input_tokens, before.input_tokens),
        ("output", now.output_tokens, before.output_tokens),
        ("cache_read", now.cache_read_tokens, before.cache_read_tokens),
        ("cache_write", now.cache_write_tokens, before.cache_write_tokens),
    ] {
        let labels =
            AgentModelKind { agent: agent.to_owned(), model: model.clone(), kind: kind.into() };
        LOCAL.tokens.get_or_create(&labels).inc_by(after.saturating_sub(was));
    }
    if now.cost_usd.is_some() {
        let cost = (now.cost() - before.cost()).max(0.0);
        LOCAL.cost.get_or_create(&AgentModel { agent: agent.to_owned(), model }).inc_by(cost);
    }
}

/// This process's metrics and the queue's, in Prometheus's text format (OpenMetrics). Reads
/// the queue: call it off the async runtime.
pub fn render(store: &Store) -> Result<String> {
    let mut reg = Registry::default();
    let counts = store.counts()?;
    let tasks = Family::<StateLabel, Gauge>::default();
    for (status, n) in &counts.by_status {
        tasks.get_or_create(&StateLabel { state: status.as_str().into() }).set(gauge(*n));
    }
    reg.register("taskbridge_tasks", "Tasks in the queue, by state", tasks);
    let submitted = Family::<AgentLabel, Counter>::default();
    for agent in crate::agent::ALL {
        let _ = submitted.get_or_create(&AgentLabel { agent: agent.name().into() });
    }
    for (agent, n) in &counts.submitted {
        submitted.get_or_create(&AgentLabel { agent: agent.clone() }).inc_by(*n);
    }
    reg.register("taskbridge_tasks_submitted", "Tasks submitted to the queue, by agent", submitted);

    let workers = Family::<HostLabel, Gauge>::default();
    let (mut busy, mut free) = (0, 0);
    for w in store.list_workers()?.iter().filter(|w| !w.stopped && !w.stale) {
        workers.get_or_create(&HostLabel { host: w.host.clone() }).inc();
        let running = w.current_tasks.len() as i64;
        busy += running;
        free += (w.concurrency - running).max(0);
    }
    reg.register("taskbridge_workers", "Live workers on the queue, by host", workers);
    let slots = Family::<StateLabel, Gauge>::default();
    slots.get_or_create(&StateLabel { state: "busy".into() }).set(busy);
    slots.get_or_create(&StateLabel { state: "free".into() }).set(free);
    reg.register("taskbridge_worker_slots", "Task slots of the live workers", slots);

    let l = &*LOCAL;
    reg.register(
        "taskbridge_tasks_finished",
        "Runs this process ended, by outcome",
        l.finished.clone(),
    );
    reg.register(
        "taskbridge_queue_wait_seconds",
        "From ready (submitted, retry due, dependencies done, answered) to claimed",
        l.queue_wait.clone(),
    );
    reg.register("taskbridge_task_run_seconds", "From claimed to the run's end", l.run.clone());
    reg.register(
        "taskbridge_decision_wait_seconds",
        "From a decision asked to answered, by kind (question, permission, budget)",
        l.decision_wait.clone(),
    );
    reg.register(
        "taskbridge_agent_tokens",
        "Tokens the agents used, by kind (input, output, cache_read, cache_write)",
        l.tokens.clone(),
    );
    reg.register(
        "taskbridge_agent_cost_usd",
        "What the agents reported they spent",
        l.cost.clone(),
    );
    reg.register("taskbridge_agent_errors", "Failed attempts, by kind", l.errors.clone());

    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg)
        .map_err(|e| Error::Metrics(e.to_string()))?;
    Ok(out)
}

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use queue::{TaskSpec, Usage};
    use std::time::Duration;

    fn line<'a>(text: &'a str, start: &str) -> &'a str {
        text.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("{start}: {text}"))
    }

    // One test: the process's counts are one set, which tests in parallel would share.
    #[test]
    fn a_run_that_waited_for_an_answer_is_counted_with_its_spend_and_the_queues_state() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("q.db")).unwrap();
        let spec = TaskSpec::new("p", "/r", "0123456789abcdef0123456789abcdef01234567");
        let id = store.submit(TaskSpec { model: Some("m/x".into()), ..spec }).unwrap().0.id;
        let lease = Duration::from_secs(30);
        let first = store.claim_next("w", "h", lease).unwrap().unwrap();
        claimed(&first);
        let spent = |input, output, cost| TaskResult {
            usage: Usage {
                input_tokens: input,
                output_tokens: output,
                cost_usd: Some(cost),
                ..Default::default()
            },
            ..Default::default()
        };
        let waiting = Outcome::Waiting {
            question: "Which?".into(),
            session_id: "ses".into(),
            result: Some(Box::new(spent(100, 10, 0.5))),
            ask: None,
        };
        finished(&first.task, None, &waiting, 2.0);
        store.finish(id, first.token, waiting).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        store.answer(id, "that one", "test").unwrap();
        let resumed = store.claim_next("w", "h", lease).unwrap().unwrap();
        assert!(resumed.resume.is_some());
        claimed(&resumed);
        // The result carries the whole task's spend; only what this run added counts again.
        let done = Outcome::Done { result: Box::new(spent(150, 30, 0.75)) };
        finished(&resumed.task, None, &done, 3.0);
        store.finish(id, resumed.token, done).unwrap();

        let timeout = Outcome::Failed {
            error: "timed out".into(),
            kind: queue::FailureKind::Timeout,
            result: None,
            backoff_s: 0.0,
        };
        finished(&resumed.task, None, &timeout, 0.0);

        let text = render(&store).unwrap();
        let errors = r#"taskbridge_agent_errors_total{agent="opencode",kind="timeout"}"#;
        assert_eq!(line(&text, errors), format!("{errors} 1"));
        assert!(text.contains("taskbridge_tasks{state=\"done\"} 1"), "{text}");
        assert!(text.contains("taskbridge_tasks_submitted_total{agent=\"opencode\"} 1"), "{text}");
        for outcome in ["waiting", "done"] {
            let l = format!(
                "taskbridge_tasks_finished_total{{agent=\"opencode\",outcome=\"{outcome}\"}} 1"
            );
            assert!(text.contains(&l), "{l}: {text}");
        }
        let input = r#"taskbridge_agent_tokens_total{agent="opencode",model="m/x",kind="input"}"#;
        assert_eq!(line(&text, input), format!("{input} 150"));
        let output = r#"taskbridge_agent_tokens_total{agent="opencode",model="m/x",kind="output"}"#;
        assert_eq!(line(&text, output), format!("{output} 30"));
        let cost = r#"taskbridge_agent_cost_usd_total{agent="opencode",model="m/x"}"#;
        assert_eq!(line(&text, cost), format!("{cost} 0.75"));
        assert_eq!(
            line(&text, "taskbridge_queue_wait_seconds_count"),
            "taskbridge_queue_wait_seconds_count 2"
        );
        assert_eq!(
            line(&text, "taskbridge_task_run_seconds_sum"),
            "taskbridge_task_run_seconds_sum 5.0"
        );
        let waited = r#"taskbridge_decision_wait_seconds_count{kind="question"}"#;
        assert_eq!(line(&text, waited), format!("{waited} 1"));
        let sum: f64 = line(&text, r#"taskbridge_decision_wait_seconds_sum{kind="question"}"#)
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!((0.04..5.0).contains(&sum), "asked to answered: {sum}");
        assert!(text.ends_with("# EOF\n"));
    }
}
