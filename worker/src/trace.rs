//! Traces of a task's runs, through the `opentelemetry` API: a span per attempt with a child for
//! each stage (the worktree, each agent turn, the checks, the commit). The binary installs an
//! OTLP exporter and calls [`enable`] only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or its traces
//! variant) is set; until then every call here returns at once and builds nothing.
//!
//! Attributes follow OpenTelemetry's GenAI conventions where they fit (`gen_ai.agent.name`,
//! `gen_ai.request.model`, `gen_ai.usage.*`); what is TaskBridge's own is `taskbridge.*`.

use opentelemetry::trace::{Span, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue, global};
use queue::{Outcome, Task, TaskResult, Usage};
use std::sync::atomic::{AtomicBool, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns tracing on (an exporter has been installed as the global tracer provider).
pub fn enable() {
    ENABLED.store(true, Ordering::SeqCst);
}

fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

const TRACER: &str = "taskbridge";

/// One attempt's span, the parent of its stages' spans.
pub(crate) struct Attempt {
    cx: Option<Context>,
}

/// A stage's span; it ends when dropped (a stage that returns early ends it too).
pub(crate) struct Step {
    span: Option<global::BoxedSpan>,
}

impl Attempt {
    pub fn start(task: &Task, resuming: bool) -> Attempt {
        if !enabled() {
            return Attempt { cx: None };
        }
        let tracer = global::tracer(TRACER);
        let span = tracer
            .span_builder(format!("task {}", task.id.0))
            .with_kind(SpanKind::Internal)
            .with_attributes(vec![
                KeyValue::new("taskbridge.task.id", task.id.0),
                KeyValue::new("taskbridge.task.title", task.title.clone()),
                KeyValue::new("taskbridge.task.attempt", task.attempts),
                KeyValue::new("taskbridge.task.resuming", resuming),
                KeyValue::new("taskbridge.repository", task.repo.clone()),
                KeyValue::new("gen_ai.agent.name", crate::metrics::agent_label(task)),
                KeyValue::new("gen_ai.request.model", crate::metrics::model_label(task).to_owned()),
            ])
            .start(&tracer);
        Attempt { cx: Some(Context::current_with_span(span)) }
    }

    /// A child span named `name`.
    pub fn step(&self, name: &'static str) -> Step {
        let Some(cx) = &self.cx else { return Step { span: None } };
        Step { span: Some(global::tracer(TRACER).start_with_context(name, cx)) }
    }

    /// One agent turn, in the GenAI conventions' words.
    pub fn turn(&self, task: &Task) -> Step {
        let Some(cx) = &self.cx else { return Step { span: None } };
        let tracer = global::tracer(TRACER);
        let agent = crate::metrics::agent_label(task);
        let span = tracer
            .span_builder(format!("invoke_agent {agent}"))
            .with_kind(SpanKind::Client)
            .with_attributes(vec![
                KeyValue::new("gen_ai.operation.name", "invoke_agent"),
                KeyValue::new("gen_ai.agent.name", agent),
                KeyValue::new("gen_ai.request.model", crate::metrics::model_label(task).to_owned()),
            ])
            .start_with_context(&tracer, cx);
        Step { span: Some(span) }
    }

    /// Ends the attempt with how it went and what it spent (beyond the task's earlier runs).
    pub fn end(self, task: &Task, outcome: &Outcome) {
        let Some(cx) = self.cx else { return };
        let span = cx.span();
        let (name, result, error) = match outcome {
            Outcome::Done { result } => ("done", Some(result.as_ref()), None),
            Outcome::Failed { result, error, kind, .. }
            | Outcome::FailedPermanently { result, error, kind } => {
                span.set_attribute(KeyValue::new("error.type", kind.as_str()));
                ("failed", result.as_deref(), Some(error.clone()))
            }
            Outcome::Waiting { result, .. } => ("waiting", result.as_deref(), None),
            Outcome::Cancelled { result } => ("cancelled", result.as_deref(), None),
            Outcome::Released => ("released", None, None),
        };
        span.set_attribute(KeyValue::new("taskbridge.outcome", name));
        if let Some(r) = result {
            let before = task.result.as_ref().map(|r| r.usage.clone()).unwrap_or_default();
            for kv in usage_attributes(&r.usage, &before) {
                span.set_attribute(kv);
            }
            if let Some(commit) = &r.commit {
                span.set_attribute(KeyValue::new("taskbridge.commit", commit.clone()));
            }
            cost(r, &before, |kv| span.set_attribute(kv));
        }
        if let Some(e) = error {
            span.set_status(Status::error(e));
        }
        span.end();
    }
}

impl Step {
    /// Records a turn's spend on its span.
    pub fn usage(&mut self, used: &Usage) {
        if let Some(span) = &mut self.span {
            span.set_attributes(usage_attributes(used, &Usage::default()));
            if let Some(c) = used.cost_usd {
                span.set_attribute(KeyValue::new("taskbridge.cost_usd", c));
            }
        }
    }

    /// Marks the step failed.
    pub fn failed(&mut self, why: &str) {
        if let Some(span) = &mut self.span {
            span.set_status(Status::error(why.to_owned()));
        }
    }
}

fn usage_attributes(now: &Usage, before: &Usage) -> Vec<KeyValue> {
    let d = |a: u64, b: u64| i64::try_from(a.saturating_sub(b)).unwrap_or(i64::MAX);
    vec![
        KeyValue::new("gen_ai.usage.input_tokens", d(now.input_tokens, before.input_tokens)),
        KeyValue::new("gen_ai.usage.output_tokens", d(now.output_tokens, before.output_tokens)),
        KeyValue::new(
            "gen_ai.usage.cache_read.input_tokens",
            d(now.cache_read_tokens, before.cache_read_tokens),
        ),
        KeyValue::new(
            "gen_ai.usage.cache_creation.input_tokens",
            d(now.cache_write_tokens, before.cache_write_tokens),
        ),
    ]
}

fn cost(r: &TaskResult, before: &Usage, mut set: impl FnMut(KeyValue)) {
    if r.usage.cost_usd.is_some() {
        set(KeyValue::new("taskbridge.cost_usd", (r.usage.cost() - before.cost()).max(0.0)));
    }
}

/// A moment in a task's run, in the worker's log (target `taskbridge::stamp`, at debug): where
/// TaskBridge's own part of a run begins and ends around the agent's, which the benchmark of the
/// agents reads (`TASKBRIDGE_LOG=warn,taskbridge::stamp=debug`).
pub fn stamp(task: queue::TaskId, what: &'static str) {
    tracing::debug!(target: "taskbridge::stamp", task = task.0, stamp = what);
}
