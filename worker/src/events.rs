//! What an agent's run adds up to ([`RunLog`]), folded from normalised [`AgentEvent`]s, and
//! reading `opencode run --format json` into them: one JSON event per line (`step_start`,
//! `text`, `reasoning`, `tool_use`, `step_finish`, `error`), each with the `sessionID` and a
//! `part`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use queue::Usage;

/// One tool call the agent made, as OpenCode reported it when it completed or failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub tool: String,
    /// The bash command, the file path, or the tool's title.
    pub target: String,
    pub status: String,
    pub exit_code: Option<i64>,
}

/// What a run's events add up to.
#[derive(Debug, Clone, Default)]
pub struct RunLog {
    pub session_id: Option<String>,
    pub texts: Vec<String>,
    /// Texts since the last `step_start`: the agent's final answer once the run ends.
    pub last_step_texts: Vec<String>,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    pub error: Option<String>,
    /// The error event's fields, for telling an error a retry can fix from one it cannot.
    pub error_detail: Option<AgentError>,
    /// `provider/model` as OpenCode's own log names it (`--print-logs`): the model it really
    /// used, which is its default when TaskBridge named none.
    pub model_seen: Option<String>,
    pub events: u64,
}

/// An `error` event's fields.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentError {
    /// `APIError`, `ProviderAuthError`, `UnknownError`, ...
    pub name: String,
    pub message: String,
    pub status: Option<i64>,
    /// OpenCode's own verdict (`isRetryable`), when it gives one.
    pub retryable: Option<bool>,
    /// The endpoint that was called (`metadata.url`).
    pub url: Option<String>,
}

/// A human-readable line for the task log, if the event deserves one.
pub type LogLine = Option<String>;

impl RunLog {
    /// The agent's final text: the text of the last step that had any.
    pub fn final_text(&self) -> String {
        if self.last_step_texts.is_empty() {
            self.texts.last().cloned().unwrap_or_default()
        } else {
            self.last_step_texts.join("\n")
        }
    }

    /// Folds one line of `opencode run --format json` into the run and returns what the
    /// readable log should say.
    pub fn ingest(&mut self, line: &str) -> LogLine {
        let Some(events) = opencode_events(line) else {
            return Some(format!("(not JSON) {line}"));
        };
        self.events += 1;
        let lines: Vec<String> = events.into_iter().filter_map(|e| self.apply(e)).collect();
        (!lines.is_empty()).then(|| lines.join("\n"))
    }

    /// Folds one normalised event into the run and returns what the readable log should say:
    /// every agent's stream ends up here, so a result reads the same whichever agent ran.
    pub fn apply(&mut self, ev: AgentEvent) -> LogLine {
        match ev {
            AgentEvent::Session(s) => {
                if self.session_id.is_none() {
                    self.session_id = Some(s);
                }
                None
            }
            AgentEvent::Model(m) => {
                if self.model_seen.is_none() {
                    self.model_seen = Some(m);
                }
                None
            }
            AgentEvent::StepStarted => {
                self.last_step_texts.clear();
                None
            }
            AgentEvent::Text(text) => {
                if text.is_empty() {
                    return None;
                }
                self.texts.push(text.clone());
                self.last_step_texts.push(text.clone());
                Some(format!("agent: {text}"))
            }
            AgentEvent::Thinking(text) => Some(format!("thinking: {text}")),
            AgentEvent::ToolStarted { tool, target } => {
                Some(format!("tool {tool}: {target} (started)"))
            }
            AgentEvent::ToolEnded { call, error } => {
                let line = match call.exit_code {
                    Some(code) => format!("tool {}: {} (exit {code})", call.tool, call.target),
                    None => format!("tool {}: {} ({})", call.tool, call.target, call.status),
                };
                self.tool_calls.push(call);
                Some(match error {
                    Some(e) => format!("{line}: {e}"),
                    None => line,
                })
            }
            AgentEvent::Usage { usage, reason } => {
                self.usage.add(&usage);
                let cost = match usage.cost_usd {
                    Some(c) => format!("${c:.6}"),
                    None => "cost not reported".to_owned(),
                };
                Some(format!(
                    "step finished ({}): {} in, {} out, {} reasoning, {} cache read, {} \
                     cache write, {cost}",
                    reason.as_deref().unwrap_or("?"),
                    usage.input_tokens,
                    usage.output_tokens,
                    usage.reasoning_tokens,
                    usage.cache_read_tokens,
                    usage.cache_write_tokens,
                ))
            }
            AgentEvent::Error(e) => {
                let msg = match e.status {
                    Some(code) => format!("{} (HTTP {code}): {}", e.name, e.message),
                    None => format!("{}: {}", e.name, e.message),
                };
                self.error = Some(msg.clone());
                self.error_detail = Some(e);
                Some(format!("error: {msg}"))
            }
            AgentEvent::Note(text) => Some(text),
            // Decisions are the supervisor's to answer; the log line is its own.
            AgentEvent::Decision { .. } | AgentEvent::TurnFinished => None,
        }
    }
}

/// One thing an agent reported, whichever agent it was: what each agent's own stream is read
/// into (`opencode run`'s JSON lines here, Claude Code's and Codex's in their modules).
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEvent {
    /// The session (thread) the run is in, to resume it later.
    Session(String),
    /// `provider/model` the agent says it uses.
    Model(String),
    /// A new model step: the texts before it are not the final answer.
    StepStarted,
    Text(String),
    Thinking(String),
    ToolStarted {
        tool: String,
        target: String,
    },
    ToolEnded {
        call: ToolCall,
        error: Option<String>,
    },
    /// A step's or a turn's usage; `reason` is why it ended (`stop`, `tool-calls`, ...). Its
    /// `cost_usd` is `None` when the agent reports no cost.
    Usage {
        usage: Usage,
        reason: Option<String>,
    },
    /// The agent waits on a decision over its control channel: its own question, or approval
    /// for a tool call. `request` is its id for the answer; `input` the tool call's input.
    Decision {
        request: String,
        ask: Box<queue::Ask>,
        input: Value,
    },
    TurnFinished,
    Error(AgentError),
    /// A line for the log that changes nothing (a retry the agent makes itself, say).
    Note(String),
}

/// `opencode run --format json`'s line as events, or `None` when it is not JSON.
pub fn opencode_events(line: &str) -> Option<Vec<AgentEvent>> {
    let ev = serde_json::from_str::<Value>(line).ok()?;
    let mut out = Vec::new();
    if let Some(s) = ev.get("sessionID").and_then(Value::as_str) {
        out.push(AgentEvent::Session(s.to_owned()));
    }
    let kind = match ev.get("type").and_then(Value::as_str).unwrap_or("") {
        "step_start" => PartKind::StepStart,
        "text" => PartKind::Text,
        "reasoning" => PartKind::Reasoning,
        "tool_use" => PartKind::Tool,
        "step_finish" => PartKind::StepFinish,
        "error" => {
            out.push(AgentEvent::Error(agent_error(ev.get("error").unwrap_or(&Value::Null))));
            return Some(out);
        }
        _ => return Some(out),
    };
    out.push(part_event(kind, ev.get("part").unwrap_or(&Value::Null)));
    Some(out)
}

/// A finished part of an OpenCode message, as both of its modes report one: `opencode run`
/// prints it as a line of its own type, the server sends it in `message.part.updated`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartKind {
    StepStart,
    Text,
    Reasoning,
    /// A tool call that completed or failed.
    Tool,
    StepFinish,
}

/// The event an OpenCode part is.
pub(crate) fn part_event(kind: PartKind, part: &Value) -> AgentEvent {
    let text = || part.get("text").and_then(Value::as_str).unwrap_or("").to_owned();
    match kind {
        PartKind::StepStart => AgentEvent::StepStarted,
        PartKind::Text => AgentEvent::Text(text()),
        PartKind::Reasoning => AgentEvent::Thinking(text()),
        PartKind::Tool => {
            let error = part.pointer("/state/error").and_then(Value::as_str).map(str::to_owned);
            AgentEvent::ToolEnded { call: tool_call(part), error }
        }
        PartKind::StepFinish => {
            let t = |p: &str| part.pointer(p).and_then(Value::as_u64).unwrap_or(0);
            let usage = Usage {
                input_tokens: t("/tokens/input"),
                output_tokens: t("/tokens/output"),
                reasoning_tokens: t("/tokens/reasoning"),
                cache_read_tokens: t("/tokens/cache/read"),
                cache_write_tokens: t("/tokens/cache/write"),
                cost_usd: Some(part.get("cost").and_then(Value::as_f64).unwrap_or(0.0)),
                steps: 1,
            };
            let reason = part.get("reason").and_then(Value::as_str).unwrap_or("?").to_owned();
            AgentEvent::Usage { usage, reason: Some(reason) }
        }
    }
}

impl RunLog {
    /// Reads one line of OpenCode's stderr log (`key=value` pairs) for the model it used.
    pub fn ingest_stderr(&mut self, line: &str) {
        if self.model_seen.is_some() {
            return;
        }
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .map(|v| v.trim_matches('"').to_owned())
                .filter(|v| !v.is_empty() && v != "undefined")
        };
        if let (Some(p), Some(m)) = (field("providerID="), field("modelID=")) {
            self.model_seen = Some(format!("{p}/{m}"));
        }
    }
}

pub(crate) fn agent_error(err: &Value) -> AgentError {
    let data = err.get("data").cloned().unwrap_or(Value::Null);
    AgentError {
        name: err.get("name").and_then(Value::as_str).unwrap_or("Error").to_owned(),
        message: data
            .get("message")
            .and_then(Value::as_str)
            .or_else(|| err.get("message").and_then(Value::as_str))
            .unwrap_or("unknown error")
            .to_owned(),
        status: data.get("statusCode").and_then(Value::as_i64),
        retryable: data.get("isRetryable").and_then(Value::as_bool),
        url: data.pointer("/metadata/url").and_then(Value::as_str).map(str::to_owned),
    }
}

/// The tool call a `tool` part describes (its target: the command, the path, ...).
pub(crate) fn tool_call(part: &Value) -> ToolCall {
    let tool = part.get("tool").and_then(Value::as_str).unwrap_or("?").to_owned();
    let state = part.get("state").cloned().unwrap_or(Value::Null);
    let input = state.get("input").cloned().unwrap_or(Value::Null);
    let target = ["command", "filePath", "path", "pattern", "url"]
        .iter()
        .find_map(|k| input.get(*k).and_then(Value::as_str))
        .or_else(|| state.get("title").and_then(Value::as_str))
        .unwrap_or("")
        .to_owned();
    ToolCall {
        tool,
        target,
        status: state.get("status").and_then(Value::as_str).unwrap_or("?").to_owned(),
        exit_code: state.pointer("/metadata/exit").and_then(Value::as_i64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_turn_is_summed_and_described() {
        let lines = [
            r#"{"type":"step_start","sessionID":"ses_A","part":{"type":"step-start"}}"#,
            r#"{"type":"text","sessionID":"ses_A","part":{"type":"text","text":"Looking."}}"#,
            r#"{"type":"tool_use","sessionID":"ses_A","part":{"type":"tool","tool":"bash","callID":"t1","state":{"status":"completed","input":{"command":"cargo test -q"},"output":"ok","title":"cargo test -q","metadata":{"output":"ok","exit":0}}}}"#,
            r#"{"type":"step_finish","sessionID":"ses_A","part":{"reason":"tool-calls","tokens":{"total":5120,"input":980,"output":140,"reasoning":0,"cache":{"write":0,"read":4000}},"cost":0.00624}}"#,
            r#"{"type":"step_start","sessionID":"ses_A","part":{}}"#,
            r#"{"type":"text","sessionID":"ses_A","part":{"type":"text","text":"All green."}}"#,
            r#"{"type":"step_finish","sessionID":"ses_A","part":{"reason":"stop","tokens":{"input":10,"output":5,"reasoning":1,"cache":{"write":2,"read":3}},"cost":0.001}}"#,
        ];
        let mut log = RunLog::default();
        let out: Vec<_> = lines.iter().filter_map(|l| log.ingest(l)).collect();
        assert_eq!(log.session_id.as_deref(), Some("ses_A"));
        assert_eq!(log.final_text(), "All green.");
        assert_eq!(log.usage.input_tokens, 990);
        assert_eq!(log.usage.cache_read_tokens, 4003);
        assert!((log.usage.cost() - 0.00724).abs() < 1e-9);
        assert_eq!(log.tool_calls[0].exit_code, Some(0));
        assert!(out.iter().any(|l| l == "tool bash: cargo test -q (exit 0)"), "{out:?}");
    }

    #[test]
    fn each_line_of_opencode_run_is_its_event() {
        let events = |l: &str| opencode_events(l).unwrap();
        assert_eq!(
            events(r#"{"type":"reasoning","sessionID":"s","part":{"text":"hm"}}"#),
            [AgentEvent::Session("s".into()), AgentEvent::Thinking("hm".into())]
        );
        assert_eq!(
            events(r#"{"type":"text","part":{"text":"ok"}}"#),
            [AgentEvent::Text("ok".into())]
        );
        assert_eq!(events(r#"{"type":"step_start"}"#), [AgentEvent::StepStarted]);
        assert!(events(r#"{"type":"something_new"}"#).is_empty());
        assert_eq!(opencode_events("not json"), None);
    }

    #[test]
    fn a_line_is_counted_only_when_it_is_json_and_logged_only_when_it_says_something() {
        let mut log = RunLog::default();
        assert_eq!(
            log.ingest("npm warn something").as_deref(),
            Some("(not JSON) npm warn something")
        );
        assert_eq!(log.events, 0);
        assert_eq!(log.ingest(r#"{"type":"step_start","sessionID":"s","part":{}}"#), None);
        assert_eq!(
            log.ingest(r#"{"type":"text","part":{"text":"Half way."}}"#).as_deref(),
            Some("agent: Half way.")
        );
        assert_eq!(log.events, 2);
        // A last step with no text of its own: the final text is the last one said.
        log.ingest(r#"{"type":"step_start","part":{}}"#);
        assert_eq!(log.final_text(), "Half way.");
    }

    #[test]
    fn the_model_is_read_from_opencodes_stderr_once_it_names_one() {
        let mut log = RunLog::default();
        log.ingest_stderr("INFO service=llm providerID=anthropic modelID=undefined stream");
        log.ingest_stderr(r#"INFO service=llm providerID="" modelID=claude-x stream"#);
        assert_eq!(log.model_seen, None, "an empty or undefined name is no model");
        log.ingest_stderr(r#"INFO service=llm providerID=anthropic modelID="claude-x" stream"#);
        assert_eq!(log.model_seen.as_deref(), Some("anthropic/claude-x"));
        log.ingest_stderr("INFO service=llm providerID=openai modelID=gpt-y stream");
        assert_eq!(log.model_seen.as_deref(), Some("anthropic/claude-x"), "the first one stays");
    }

    #[test]
    fn an_error_event_keeps_the_agents_message_and_status() {
        let mut log = RunLog::default();
        log.ingest(r#"{"type":"error","sessionID":"s","error":{"name":"APIError","data":{"message":"invalid x-api-key","statusCode":401}}}"#);
        assert_eq!(log.error.as_deref(), Some("APIError (HTTP 401): invalid x-api-key"));
    }
}
