//! A loopback mock of the Anthropic Messages API that streams scripted turns, enough for the real
//! OpenCode CLI (and Claude Code) to accept it: `message_start`, each content block's start,
//! deltas and stop, `message_delta` with the usage, then `message_stop`, as the real API streams
//! them. It records every request so a test can check what the agent sent, and the usage it
//! reported so a test can check the sums.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// One scripted answer of the model.
#[derive(Debug, Clone)]
pub enum Turn {
    /// A text block, then `end_turn`.
    Text(String),
    /// Optional text, then one tool call, then `tool_use`.
    Tool { name: String, input: Value },
    /// An HTTP error with an Anthropic error body.
    Error { status: u16, kind: String, message: String },
    /// Never answers (until the connection is dropped): a model that takes forever.
    Hang,
    /// The inner turn, after a delay: a model that answers late.
    Slow { after_ms: u64, turn: Box<Turn> },
    /// The inner turn streamed as a model streams it: `message_start` at once, the rest after a
    /// delay (a model thinks between being asked and answering).
    Streamed { after_ms: u64, turn: Box<Turn> },
}

impl Turn {
    pub fn text(s: impl Into<String>) -> Self {
        Turn::Text(s.into())
    }
    pub fn tool(name: &str, input: Value) -> Self {
        Turn::Tool { name: name.into(), input }
    }
    /// The API refusing the key, as it answers a bad one.
    pub fn unauthorized() -> Self {
        Turn::Error {
            status: 401,
            kind: "authentication_error".into(),
            message: "invalid x-api-key".into(),
        }
    }
    pub fn bash(command: &str) -> Self {
        Turn::tool("bash", json!({"command": command, "description": "run it"}))
    }
}

/// Token figures the mock sent, summed over every answered turn.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SentUsage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

#[derive(Default)]
struct Inner {
    script: VecDeque<Turn>,
    /// Requests whose last user message contains the needle get this answer, script or not.
    rules: Vec<(String, Turn)>,
    /// The same for the tool results of the last user message (what a client's tool returned).
    result_rules: Vec<(String, Turn)>,
    requests: Vec<Value>,
    /// When each request arrived.
    arrivals: Vec<std::time::Instant>,
    /// When each answer was sent whole.
    answered: Vec<std::time::Instant>,
    headers: Vec<HeaderMap>,
    sent: SentUsage,
    /// What was sent to requests that offered tools: an agent's steps, not the side requests
    /// an agent makes without tools (OpenCode's session title).
    sent_to_steps: SentUsage,
    turns_served: u64,
}

#[derive(Clone)]
pub struct MockAnthropic {
    pub port: u16,
    inner: Arc<Mutex<Inner>>,
}

fn sse(events: &[(&str, Value)]) -> String {
    events.iter().map(|(name, data)| format!("event: {name}\ndata: {data}\n\n")).collect()
}

async fn messages(State(m): State<MockAnthropic>, headers: HeaderMap, body: Bytes) -> Response {
    let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let model = req.get("model").and_then(Value::as_str).unwrap_or("claude-sonnet-4-5").to_owned();
    let streaming = req.get("stream").and_then(Value::as_bool) == Some(true);
    let last_user = last_user_text(&req);
    let last_results = last_tool_results(&req);
    let offered: Vec<String> = req["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["name"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let turn = {
        let mut s = m.inner.lock().unwrap();
        s.requests.push(req);
        s.arrivals.push(std::time::Instant::now());
        s.headers.push(headers);
        let ruled =
            s.rules.iter().find(|(needle, _)| last_user.contains(needle.as_str())).or_else(|| {
                s.result_rules.iter().find(|(needle, _)| last_results.contains(needle.as_str()))
            });
        match ruled {
            Some((_, turn)) => turn.clone(),
            None => s
                .script
                .pop_front()
                .unwrap_or_else(|| Turn::text("(mock: the script is exhausted)")),
        }
    };
    if matches!(turn, Turn::Hang) {
        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
    }
    let (turn, thinking) = match turn {
        Turn::Slow { after_ms, turn } => {
            tokio::time::sleep(std::time::Duration::from_millis(after_ms)).await;
            (*turn, None)
        }
        Turn::Streamed { after_ms, turn } if streaming => {
            (*turn, Some(std::time::Duration::from_millis(after_ms)))
        }
        Turn::Streamed { turn, .. } => (*turn, None),
        other => (other, None),
    };
    if let Turn::Error { status, kind, message } = &turn {
        let body = json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_mock"});
        let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return (
            status,
            [("content-type", "application/json"), ("request-id", "req_mock")],
            body.to_string(),
        )
            .into_response();
    }
    let turn = for_tools(turn, &offered);
    // Usage differs per turn so that a sum is a real check.
    let n = {
        let mut s = m.inner.lock().unwrap();
        s.turns_served += 1;
        s.turns_served
    };
    let (input, output, cache_read, cache_write) = (100 + n, 20 + n, 40 + n, 30 + n);
    {
        let mut s = m.inner.lock().unwrap();
        s.sent.input += input;
        s.sent.output += output;
        s.sent.cache_read += cache_read;
        s.sent.cache_write += cache_write;
        if !offered.is_empty() {
            s.sent_to_steps.input += input;
            s.sent_to_steps.output += output;
            s.sent_to_steps.cache_read += cache_read;
            s.sent_to_steps.cache_write += cache_write;
        }
    }
    if !streaming {
        m.inner.lock().unwrap().answered.push(std::time::Instant::now());
        let (content, stop_reason) = match &turn {
            Turn::Text(text) => (json!([{"type": "text", "text": text}]), "end_turn"),
            Turn::Tool { name, input } => (
                json!([{"type": "tool_use", "id": format!("toolu_mock{n}"), "name": name, "input": input}]),
                "tool_use",
            ),
            Turn::Error { .. } | Turn::Hang | Turn::Slow { .. } | Turn::Streamed { .. } => {
                unreachable!()
            }
        };
        let body = json!({"id": format!("msg_mock{n}"), "type": "message", "role": "assistant",
            "model": model, "content": content, "stop_reason": stop_reason, "stop_sequence": null,
            "usage": {"input_tokens": input, "output_tokens": output,
                      "cache_read_input_tokens": cache_read, "cache_creation_input_tokens": cache_write}});
        return (
            [("content-type", "application/json"), ("request-id", "req_mock")],
            body.to_string(),
        )
            .into_response();
    }
    let mut events = vec![(
        "message_start",
        json!({"type": "message_start", "message": {"id": format!("msg_mock{n}"), "type": "message",
            "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input, "output_tokens": 1, "cache_read_input_tokens": cache_read,
                      "cache_creation_input_tokens": cache_write}}}),
    )];
    let stop_reason = match &turn {
        Turn::Text(text) => {
            events.push(("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})));
            events.push(("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}})));
            events.push(("content_block_stop", json!({"type": "content_block_stop", "index": 0})));
            "end_turn"
        }
        Turn::Tool { name, input } => {
            let id = format!("toolu_mock{n}");
            events.push(("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}})));
            events.push(("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": input.to_string()}})));
            events.push(("content_block_stop", json!({"type": "content_block_stop", "index": 0})));
            "tool_use"
        }
        Turn::Error { .. } | Turn::Hang | Turn::Slow { .. } | Turn::Streamed { .. } => {
            unreachable!()
        }
    };
    events.push(("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": output}})));
    events.push(("message_stop", json!({"type": "message_stop"})));
    let headers = [("content-type", "text/event-stream"), ("request-id", "req_mock")];
    let Some(thinking) = thinking else {
        m.inner.lock().unwrap().answered.push(std::time::Instant::now());
        return (headers, sse(&events)).into_response();
    };
    use futures::StreamExt;
    let (start, rest) = (sse(&events[..1]), sse(&events[1..]));
    let answer = async move {
        tokio::time::sleep(thinking).await;
        m.inner.lock().unwrap().answered.push(std::time::Instant::now());
        Ok::<_, std::convert::Infallible>(rest)
    };
    let body = futures::stream::once(async { Ok(start) }).chain(futures::stream::once(answer));
    (headers, axum::body::Body::from_stream(body)).into_response()
}

/// A tool call as the agent asking offers that tool: OpenCode 2 calls `bash` `shell`, and its
/// `write` takes `path` where 1.x takes `filePath`.
fn for_tools(turn: Turn, offered: &[String]) -> Turn {
    let has = |n: &str| offered.iter().any(|o| o == n);
    match turn {
        Turn::Tool { name, input } if name == "bash" && !has("bash") && has("shell") => {
            Turn::Tool { name: "shell".into(), input }
        }
        Turn::Tool { name, mut input } if name == "write" && input.get("path").is_none() => {
            if let Some(p) = input.get("filePath").cloned() {
                input["path"] = p;
            }
            Turn::Tool { name, input }
        }
        other => other,
    }
}

/// The text of the last user message: a string, or its text blocks joined.
fn last_user_text(req: &Value) -> String {
    let Some(msg) =
        req["messages"].as_array().and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
    else {
        return String::new();
    };
    match &msg["content"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The tool results in the last user message, as text.
fn last_tool_results(req: &Value) -> String {
    let Some(msg) =
        req["messages"].as_array().and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
    else {
        return String::new();
    };
    let blocks = msg["content"].as_array().cloned().unwrap_or_default();
    let results = blocks.iter().filter(|b| b["type"] == "tool_result");
    results
        .map(|b| match &b["content"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl MockAnthropic {
    /// Starts the mock on its own thread and runtime, so tests can stay synchronous.
    pub fn spawn(script: Vec<Turn>) -> MockAnthropic {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let mock = MockAnthropic {
            port,
            inner: Arc::new(Mutex::new(Inner { script: script.into(), ..Default::default() })),
        };
        // The query string (Claude Code sends ?beta=true) does not affect routing.
        let app = axum::Router::new()
            .route("/v1/messages", axum::routing::post(messages))
            .with_state(mock.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app).await.unwrap();
            });
        });
        mock
    }

    /// Adds turns to the end of the script.
    pub fn push(&self, turns: impl IntoIterator<Item = Turn>) {
        self.inner.lock().unwrap().script.extend(turns);
    }

    /// Answers every request whose last user message contains `needle` with `turn`, whatever
    /// the script says: how the mock recognises a question the bridge forwards.
    pub fn answer_when(&self, needle: &str, turn: Turn) {
        self.inner.lock().unwrap().rules.push((needle.to_owned(), turn));
    }

    /// Answers every request whose last user message carries a tool result containing
    /// `needle` with `turn`: how the mock plays a planner that reads what its tools returned.
    #[allow(dead_code)]
    pub fn answer_after(&self, needle: &str, turn: Turn) {
        self.inner.lock().unwrap().result_rules.push((needle.to_owned(), turn));
    }

    pub fn requests(&self) -> Vec<Value> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// When each answer was sent whole (a streamed one's last part, not its first).
    pub fn answered(&self) -> Vec<std::time::Instant> {
        self.inner.lock().unwrap().answered.clone()
    }

    /// When each request arrived, in order.
    pub fn arrivals(&self) -> Vec<std::time::Instant> {
        self.inner.lock().unwrap().arrivals.clone()
    }

    pub fn headers(&self) -> Vec<HeaderMap> {
        self.inner.lock().unwrap().headers.clone()
    }

    pub fn sent_usage(&self) -> SentUsage {
        self.inner.lock().unwrap().sent.clone()
    }

    /// [`MockAnthropic::sent_usage`] of the requests that offered tools (an agent's steps).
    #[allow(dead_code)]
    pub fn sent_to_steps(&self) -> SentUsage {
        self.inner.lock().unwrap().sent_to_steps.clone()
    }

    /// `OPENCODE_CONFIG_CONTENT` pointing OpenCode's anthropic provider here (`baseURL` with /v1).
    pub fn opencode_config(&self) -> String {
        json!({
            "provider": {"anthropic": {"options": {"baseURL": format!("http://127.0.0.1:{}/v1", self.port), "apiKey": "test-key"}}},
            "autoupdate": false,
            "share": "disabled",
        })
        .to_string()
    }
}
