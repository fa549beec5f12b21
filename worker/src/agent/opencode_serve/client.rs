//! The server's HTTP routes a turn uses, each with the password and the task's directory:
//! sessions (create, locate, read as a transcript, prompt, abort) and the event stream.

use super::{ServeAgent, Turn, io_err};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Where a session to continue was made, seen from the turn's directory.
pub(super) enum Located {
    Here,
    Elsewhere(String),
    Missing,
}

/// Tool output beyond this many characters is cut in a transcript.
const TRANSCRIPT_OUTPUT_CHARS: usize = 2_000;

/// `GET /session/:id/message`'s answer as text a model reads: each message's text and tool
/// calls (their input and output, cut), in order.
fn render_transcript(messages: &Value) -> String {
    let cut = |s: &str| -> String {
        match s.char_indices().nth(TRANSCRIPT_OUTPUT_CHARS) {
            Some((i, _)) => format!("{}… (cut)", &s[..i]),
            None => s.to_owned(),
        }
    };
    let mut out = String::new();
    for m in messages.as_array().into_iter().flatten() {
        let role = m.pointer("/info/role").and_then(Value::as_str).unwrap_or("?");
        for part in m["parts"].as_array().into_iter().flatten() {
            match part["type"].as_str() {
                Some("text") if part["synthetic"] != true => {
                    let text = part["text"].as_str().unwrap_or_default().trim();
                    if !text.is_empty() {
                        out.push_str(&format!("[{role}] {text}\n\n"));
                    }
                }
                Some("tool") => {
                    let tool = part["tool"].as_str().unwrap_or("tool");
                    let input = part.pointer("/state/input").cloned().unwrap_or(Value::Null);
                    let output = part
                        .pointer("/state/output")
                        .or_else(|| part.pointer("/state/error"))
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    out.push_str(&format!("[tool {tool}] {input}\n{}\n\n", cut(output.trim())));
                }
                _ => {}
            }
        }
    }
    if out.is_empty() {
        return out;
    }
    format!(
        "The conversation so far, from the session of the work this continues (its tool calls \
         ran in that task's worktree; this worktree holds their result):\n\n{out}---\n\n"
    )
}

/// `directory=<path>` for a query string.
fn directory_query(dir: &Path) -> String {
    let encoded: String = dir
        .display()
        .to_string()
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!("directory={encoded}")
}

/// The way to one server: an HTTP client and the server's password. Cheap to clone, for work
/// that goes on beside a turn (a session made ahead, its title).
#[derive(Clone)]
pub(super) struct Http {
    client: reqwest::Client,
    password: Arc<str>,
}

impl Http {
    pub(super) fn new(password: String) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        Http { client, password: password.into() }
    }

    pub(super) fn password(&self) -> &str {
        &self.password
    }

    pub(super) fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        self.client.request(method, url).basic_auth("opencode", Some(&*self.password))
    }

    /// A request with a JSON body; an answer that is not a success is an error that names it.
    pub(super) async fn send(
        &self,
        method: reqwest::Method,
        url: &str,
        body: &Value,
    ) -> std::io::Result<reqwest::Response> {
        let resp = self.request(method, url).json(body).send().await.map_err(io_err)?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            return Err(io_err(format!("OpenCode server answered {status} to {url}: {text}")));
        }
        Ok(resp)
    }
}

/// A route of the server on `port`, for `dir`.
pub(super) fn route(port: u16, path: &str, dir: &Path) -> String {
    format!("http://127.0.0.1:{port}{path}?{}", directory_query(dir))
}

impl ServeAgent {
    pub(super) fn url(&self, port: u16, path: &str, dir: &Path) -> String {
        route(port, path, dir)
    }

    pub(super) async fn post(&self, url: &str, body: &Value) -> std::io::Result<reqwest::Response> {
        self.http.send(reqwest::Method::POST, url, body).await
    }

    /// A GET to the server, with its password.
    fn get(&self, url: &str) -> reqwest::RequestBuilder {
        self.http.request(reqwest::Method::GET, url)
    }

    pub(super) async fn subscribe(&self, port: u16, dir: &Path) -> std::io::Result<SseLines> {
        let events = self
            .get(&self.url(port, "/event", dir))
            .header("accept", "text/event-stream")
            .send()
            .await
            .map_err(io_err)?;
        Ok(SseLines::new(events))
    }

    pub(super) async fn prompt(
        &self,
        port: u16,
        turn: &Turn<'_>,
        session: &str,
        text: &str,
    ) -> std::io::Result<()> {
        let mut prompt = json!({"parts": [{"type": "text", "text": text}]});
        if let Some((provider, model)) = turn.model.as_deref().and_then(|m| m.split_once('/')) {
            prompt["model"] = json!({"providerID": provider, "modelID": model});
        }
        // A task names OpenCode's own agents `opencode:<agent>`; the server takes the bare name.
        if let Some(agent) = crate::agent::AgentSpec::of(turn.task).opencode_agent {
            prompt["agent"] = json!(agent);
        }
        let url = self.url(port, &format!("/session/{session}/prompt_async"), turn.dir);
        self.post(&url, &prompt).await.map(|_| ())
    }

    /// A new session for the task, with its permission rules, in the turn's directory.
    pub(super) async fn create(&self, port: u16, turn: &Turn<'_>) -> std::io::Result<String> {
        let body = json!({
            "title": super::session_title(turn.task),
            "permission": crate::policy::permission_rules(turn.task),
        });
        let created: Value = self
            .post(&self.url(port, "/session", turn.dir), &body)
            .await?
            .json()
            .await
            .map_err(io_err)?;
        created["id"].as_str().map(str::to_owned).ok_or_else(|| io_err("no session id"))
    }

    /// Where `session` was made: in `dir`, elsewhere, or not in this server's database at all
    /// (it was made on another host, or OpenCode's data was removed).
    pub(super) async fn locate(
        &self,
        port: u16,
        dir: &Path,
        session: &str,
    ) -> std::io::Result<Located> {
        let url = self.url(port, &format!("/session/{session}"), dir);
        let resp = self.get(&url).send().await.map_err(io_err)?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(Located::Missing);
        }
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            return Err(io_err(format!("OpenCode server answered {status} to {url}: {text}")));
        }
        let info: Value = resp.json().await.map_err(io_err)?;
        let there = info["directory"].as_str().unwrap_or_default();
        Ok(if crate::git::same_path(Path::new(there), dir) {
            Located::Here
        } else {
            Located::Elsewhere(there.to_owned())
        })
    }

    /// The conversation of `session` as text, for a new session to go on from (empty when it
    /// cannot be read).
    pub(super) async fn transcript(&self, port: u16, dir: &Path, session: &str) -> String {
        let url = self.url(port, &format!("/session/{session}/message"), dir);
        let read = async {
            let resp = self.get(&url).send().await.ok()?;
            resp.status().is_success().then_some(())?;
            resp.json::<Value>().await.ok()
        };
        match tokio::time::timeout(Duration::from_secs(30), read).await {
            Ok(Some(messages)) => render_transcript(&messages),
            _ => String::new(),
        }
    }

    pub(super) async fn abort(&self, port: u16, session: &str, dir: &Path) {
        let url = self.url(port, &format!("/session/{session}/abort"), dir);
        if let Err(e) = self.post(&url, &json!({})).await {
            tracing::warn!(error = %e, "aborting the session failed");
        }
    }
}

/// The `data:` payloads of a server-sent event stream.
pub(super) struct SseLines {
    resp: reqwest::Response,
    buf: String,
    pending: std::collections::VecDeque<String>,
}

impl SseLines {
    fn new(resp: reqwest::Response) -> Self {
        SseLines { resp, buf: String::new(), pending: Default::default() }
    }

    pub(super) async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(d) = self.pending.pop_front() {
                return Some(d);
            }
            let chunk = self.resp.chunk().await.ok()??;
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(i) = self.buf.find('\n') {
                let line: String = self.buf.drain(..=i).collect();
                if let Some(data) = line.trim_end().strip_prefix("data:") {
                    self.pending.push_back(data.trim_start().to_owned());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transcript_has_each_messages_text_and_tool_calls_with_long_output_cut() {
        assert_eq!(render_transcript(&json!([])), "");
        let long = "x".repeat(TRANSCRIPT_OUTPUT_CHARS + 5);
        let messages = json!([
            {"info": {"role": "user"}, "parts": [
                {"type": "text", "text": " Add parse() "},
                {"type": "text", "text": "hidden", "synthetic": true},
                {"type": "text", "text": "   "},
            ]},
            {"info": {"role": "assistant"}, "parts": [
                {"type": "tool", "tool": "bash", "state": {"input": {"command": "ls"}, "output": long}},
                {"type": "tool", "tool": "edit", "state": {"input": {}, "error": "denied"}},
                {"type": "reasoning", "text": "thinking"},
                {"type": "text", "text": "Done."},
            ]},
        ]);
        let t = render_transcript(&messages);
        assert!(t.starts_with("The conversation so far"), "{t}");
        assert!(t.ends_with("---\n\n"), "{t}");
        assert!(t.contains("[user] Add parse()\n\n"), "{t}");
        assert!(!t.contains("hidden") && !t.contains("thinking"), "{t}");
        let cut = format!("[tool bash] {{\"command\":\"ls\"}}\n{}… (cut)\n\n", "x".repeat(2_000));
        assert!(t.contains(&cut), "{t}");
        assert!(t.contains("[tool edit] {}\ndenied\n\n"), "{t}");
        assert!(t.contains("[assistant] Done.\n\n"), "{t}");
        let short = render_transcript(&json!([{"info": {"role": "assistant"}, "parts": [
            {"type": "tool", "tool": "bash", "state": {"input": {}, "output": "x".repeat(2_000)}}
        ]}]));
        assert!(
            short.contains(&format!("\n{}\n\n", "x".repeat(2_000))),
            "exactly the limit is kept"
        );
        assert!(!short.contains("(cut)"));
    }

    #[test]
    fn a_directory_is_percent_encoded_in_its_query() {
        assert_eq!(
            directory_query(Path::new("/home/me/my repo/a&b=c~_.-")),
            "directory=/home/me/my%20repo/a%26b%3Dc~_.-"
        );
        assert_eq!(directory_query(Path::new("/tmp/é")), "directory=/tmp/%C3%A9");
    }

    #[test]
    fn a_route_is_the_servers_loopback_address_with_the_directory() {
        assert_eq!(
            route(4242, "/session/ses_1", Path::new("/w/my repo")),
            "http://127.0.0.1:4242/session/ses_1?directory=/w/my%20repo"
        );
    }

    /// A loopback server that answers one request with `status` and `body`, and hands back the
    /// request's head and body as it came.
    async fn answer_once(status: &str, body: &str) -> (u16, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let reply = format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let seen = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = sock.read(&mut buf).await.unwrap();
                request.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&request).to_string();
                let Some((head, rest)) = text.split_once("\r\n\r\n") else { continue };
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase().strip_prefix("content-length: ").map(str::to_owned)
                    })
                    .and_then(|l| l.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                if rest.len() >= length {
                    break;
                }
            }
            sock.write_all(reply.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&request).to_string()
        });
        (port, seen)
    }

    #[tokio::test]
    async fn a_request_carries_the_servers_password_and_a_refusal_is_an_error_naming_it() {
        crate::notify::install_tls();
        let http = Http::new("s3cret".into());
        assert_eq!(http.password(), "s3cret");
        // `opencode:s3cret` in HTTP basic authentication.
        let auth = "authorization: Basic b3BlbmNvZGU6czNjcmV0";

        let (port, seen) = answer_once("200 OK", "{}").await;
        let url = format!("http://127.0.0.1:{port}/session/ses_1?directory=/w");
        let sent = http.send(reqwest::Method::PATCH, &url, &json!({"title": "t"})).await;
        assert!(sent.is_ok(), "{sent:?}");
        let request = seen.await.unwrap();
        assert!(request.starts_with("PATCH /session/ses_1?directory=/w HTTP/1.1"), "{request}");
        assert!(request.contains(auth), "{request}");
        assert!(request.ends_with(r#"{"title":"t"}"#), "{request}");

        let (port, _) = answer_once("404 Not Found", "no such session").await;
        let url = format!("http://127.0.0.1:{port}/session/ses_2");
        let e = http.send(reqwest::Method::DELETE, &url, &json!({})).await.unwrap_err();
        let e = e.to_string();
        assert!(e.contains("404") && e.contains(&url) && e.contains("no such session"), "{e}");

        let (port, seen) = answer_once("200 OK", "").await;
        let url = format!("http://127.0.0.1:{port}/event");
        http.request(reqwest::Method::GET, &url).send().await.unwrap();
        assert!(seen.await.unwrap().contains(auth));
    }

    #[tokio::test]
    async fn an_event_streams_data_lines_are_read_across_chunks_and_nothing_else() {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut sock, &mut request).await;
            sock.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
                  data: {\"a\":1}\n\nda",
            )
            .await
            .unwrap();
            sock.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            sock.write_all(b"ta: two\r\n: a comment\nevent: x\ndata:three\n\n").await.unwrap();
        });
        crate::notify::install_tls();
        let resp = reqwest::get(format!("http://127.0.0.1:{port}/event")).await.unwrap();
        let mut lines = SseLines::new(resp);
        assert_eq!(lines.next().await.as_deref(), Some(r#"{"a":1}"#));
        assert_eq!(lines.next().await.as_deref(), Some("two"), "a line split between chunks");
        assert_eq!(lines.next().await.as_deref(), Some("three"));
        assert_eq!(lines.next().await, None, "the stream ended");
        server.await.unwrap();
    }
}
