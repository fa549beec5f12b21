//! A loopback mock of the OpenAI Responses API (`POST /v1/responses`, streamed), enough for the
//! real Codex CLI: `response.created`, each output item as `response.output_item.done`, then
//! `response.completed` with the usage, as the real API streams them. Codex is pointed here
//! with a provider of its own in `CODEX_HOME/config.toml` (see [`MockOpenAi::codex_config`]).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// One scripted answer of the model.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A message, then the turn ends.
    Text(String),
    /// One shell command through Codex's `exec_command` tool.
    Exec(String),
    /// An HTTP error with an OpenAI error body.
    Error { status: u16, message: String },
}

#[derive(Default)]
struct Inner {
    script: VecDeque<Reply>,
    /// Requests whose last user message contains the needle get this answer, script or not.
    rules: Vec<(String, Reply)>,
    requests: Vec<Value>,
    /// When each request arrived.
    arrivals: Vec<std::time::Instant>,
    served: u64,
    /// Tokens sent, summed: (input, cached, output).
    sent: (u64, u64, u64),
}

#[derive(Clone)]
pub struct MockOpenAi {
    pub port: u16,
    inner: Arc<Mutex<Inner>>,
}

/// The text of the user's messages since the model last spoke (Codex sends its own context as
/// user messages beside the prompt).
fn last_user_text(req: &Value) -> String {
    let items = req["input"].as_array().cloned().unwrap_or_default();
    let start = items.iter().rposition(|i| i["role"] == "assistant").map_or(0, |i| i + 1);
    items[start..]
        .iter()
        .filter(|i| i["role"] == "user")
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter_map(|p| p["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

async fn responses(State(m): State<MockOpenAi>, body: Bytes) -> Response {
    let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let last_user = last_user_text(&req);
    let (reply, n) = {
        let mut s = m.inner.lock().unwrap();
        s.requests.push(req);
        s.arrivals.push(std::time::Instant::now());
        let ruled = s.rules.iter().find(|(needle, _)| last_user.contains(needle.as_str()));
        let reply = match ruled {
            Some((_, r)) => r.clone(),
            None => s
                .script
                .pop_front()
                .unwrap_or_else(|| Reply::Text("(mock: the script is exhausted)".into())),
        };
        s.served += 1;
        (reply, s.served)
    };
    if let Reply::Error { status, message } = &reply {
        let body = json!({"error": {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}});
        let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return (status, [("content-type", "application/json")], body.to_string()).into_response();
    }
    // Usage differs per turn so that a sum is a real check.
    let (input, cached, output) = (200 + n, 50 + n, 10 + n);
    {
        let mut s = m.inner.lock().unwrap();
        s.sent.0 += input;
        s.sent.1 += cached;
        s.sent.2 += output;
    }
    let item = match &reply {
        Reply::Text(text) => {
            json!({"type": "message", "id": format!("msg_{n}"), "role": "assistant",
            "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]})
        }
        Reply::Exec(cmd) => json!({"type": "function_call", "id": format!("fc_{n}"),
            "call_id": format!("call_{n}"), "name": "exec_command", "status": "completed",
            "arguments": json!({"cmd": cmd}).to_string()}),
        Reply::Error { .. } => unreachable!(),
    };
    let id = format!("resp_{n}");
    let events = [
        json!({"type": "response.created", "response": {"id": id, "object": "response", "status": "in_progress", "output": []}}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        json!({"type": "response.completed", "response": {"id": id, "object": "response", "status": "completed", "output": [],
            "usage": {"input_tokens": input, "input_tokens_details": {"cached_tokens": cached},
                      "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": input + output}}}),
    ];
    let body: String = events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("")))
        .collect();
    ([("content-type", "text/event-stream")], body).into_response()
}

impl MockOpenAi {
    /// Starts the mock on its own thread and runtime, so tests can stay synchronous.
    pub fn spawn(script: Vec<Reply>) -> MockOpenAi {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let mock = MockOpenAi {
            port,
            inner: Arc::new(Mutex::new(Inner { script: script.into(), ..Default::default() })),
        };
        let app = axum::Router::new()
            .route("/v1/responses", axum::routing::post(responses))
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

    pub fn push(&self, replies: impl IntoIterator<Item = Reply>) {
        self.inner.lock().unwrap().script.extend(replies);
    }

    /// Answers every request whose last user message contains `needle` with `reply`.
    pub fn answer_when(&self, needle: &str, reply: Reply) {
        self.inner.lock().unwrap().rules.push((needle.to_owned(), reply));
    }

    pub fn requests(&self) -> Vec<Value> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// When each request arrived, in order.
    pub fn arrivals(&self) -> Vec<std::time::Instant> {
        self.inner.lock().unwrap().arrivals.clone()
    }

    /// (input, cached input, output) tokens sent over every answered turn.
    pub fn sent(&self) -> (u64, u64, u64) {
        self.inner.lock().unwrap().sent
    }

    /// A `config.toml` for `CODEX_HOME` that makes this mock Codex's provider, as a user would
    /// point Codex at a provider of their own.
    pub fn codex_config(&self) -> String {
        format!(
            "model = \"gpt-5.5\"\nmodel_provider = \"mock\"\n\n[model_providers.mock]\nname = \
             \"mock\"\nbase_url = \"http://127.0.0.1:{}/v1\"\nenv_key = \"OPENAI_API_KEY\"\n\
             wire_api = \"responses\"\n\n[analytics]\nenabled = false\n",
            self.port
        )
    }
}
