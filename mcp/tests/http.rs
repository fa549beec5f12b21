//! The Streamable HTTP listener as a client meets it over a real loopback socket: what `bind`
//! refuses, the Host, Origin and token checks with their answers, the throttle on wrong tokens
//! and what it logs, the answer modes, and a session ended with DELETE.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use taskbridge_mcp::{Error, HttpConfig, bind, serve_http};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

#[tokio::test]
async fn bind_refuses_an_open_address_without_a_token_and_names_a_port_in_use() {
    let at = |listen: &str, token: Option<&str>| HttpConfig {
        listen: listen.into(),
        token: token.map(str::to_owned),
        ..Default::default()
    };
    for token in [None, Some("")] {
        let e = bind(&at("0.0.0.0:0", token)).await.unwrap_err();
        assert!(matches!(e, Error::Insecure(_)), "{e}");
    }
    assert!(bind(&at("0.0.0.0:0", Some(TOKEN))).await.is_ok());
    let taken = bind(&at("127.0.0.1:0", None)).await.unwrap();
    let port = taken.local_addr().unwrap().port();
    let e = bind(&at(&format!("127.0.0.1:{port}"), None)).await.unwrap_err().to_string();
    assert!(e.contains("the port is in use") && e.contains("--listen"), "{e}");
    let e = bind(&at("no address at all", None)).await.unwrap_err().to_string();
    assert!(e.contains("not an address"), "{e}");
}

/// A server on a loopback port with `cfg` (its listen address is ignored).
struct Serving {
    _w: common::World,
    port: u16,
    stop: CancellationToken,
}

async fn serving(cfg: HttpConfig) -> Serving {
    let w = common::world().await;
    let listener = bind(&HttpConfig { listen: "127.0.0.1:0".into(), ..cfg.clone() }).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = CancellationToken::new();
    tokio::spawn(serve_http(w.server.clone(), listener, cfg, stop.clone()));
    Serving { _w: w, port, stop }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One request written by hand (so that any header may be left out or forged): the status
/// line's code, the head, the body.
async fn raw(port: u16, request: String) -> (u16, String, String) {
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        (code, head.to_ascii_lowercase(), body.to_owned())
    })
    .await
    .unwrap()
}

/// An `initialize` POST with these extra header lines.
fn initialize(headers: &str) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\n{headers}Accept: application/json, text/event-stream\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n\
         {INITIALIZE}",
        INITIALIZE.len()
    )
}

fn bearer(token: &str) -> String {
    format!("Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n")
}

#[tokio::test]
async fn host_and_origin_are_checked_before_the_token() {
    let s = serving(HttpConfig {
        token: Some(TOKEN.into()),
        allowed_hosts: vec!["Tunnel.Example.com:443".into()],
        ..Default::default()
    })
    .await;
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    // An allowed host given with a port and in capitals is matched by its bare name.
    let (code, _, body) =
        raw(s.port, initialize(&format!("Host: tunnel.example.com\r\n{auth}"))).await;
    assert_eq!(code, 200, "{body}");
    let (code, _, body) = raw(s.port, initialize(&format!("Host: [::1]:8765\r\n{auth}"))).await;
    assert_eq!(code, 200, "{body}");
    let (code, _, body) = raw(s.port, initialize(&format!("Host: evil.example\r\n{auth}"))).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("Host header is not allowed; add it with --allowed-host"), "{body}");
    // `localhost:x` has no port to cut off, so it is not `localhost`.
    let (code, _, _) = raw(s.port, initialize(&format!("Host: localhost:x\r\n{auth}"))).await;
    assert_eq!(code, 403);
    // HTTP/1.0 lets a client leave Host out.
    let no_host = initialize(&auth).replacen("HTTP/1.1", "HTTP/1.0", 1);
    let (code, _, body) = raw(s.port, no_host).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("missing Host header"), "{body}");
    for (origin, want) in [
        ("http://localhost:3000/app", 200),
        ("https://tunnel.example.com", 200),
        ("http://evil.example", 403),
        ("null", 403),
    ] {
        let (code, _, body) =
            raw(s.port, initialize(&format!("{}Origin: {origin}\r\n", bearer(TOKEN)))).await;
        assert_eq!(code, want, "Origin {origin}: {body}");
        if want == 403 {
            assert!(body.contains("Origin header is not allowed"), "{body}");
        }
    }
    // A wrong Host is refused as such even without a token: the token is checked last.
    let (code, _, _) = raw(s.port, initialize("Host: evil.example\r\n")).await;
    assert_eq!(code, 403);
}

/// What the server logs, kept in memory.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn wrong_tokens_are_answered_401_then_429_and_logged_without_the_token() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    // The test's runtime has one thread: the server's tasks log through this subscriber.
    let _logging = tracing::subscriber::set_default(subscriber);
    let s = serving(HttpConfig { token: Some(TOKEN.into()), ..Default::default() }).await;
    let wrong = "0123456789abcdef0123456789abcdeX";
    for n in 1..=10 {
        let (code, head, body) = raw(s.port, initialize(&bearer(wrong))).await;
        assert_eq!(code, 401, "wrong token {n}: {body}");
        assert!(head.contains("www-authenticate: bearer realm=\"taskbridge\""), "{head}");
        assert!(body.contains("send Authorization: Bearer <token>"), "{body}");
    }
    let (code, head, body) = raw(s.port, initialize(&bearer(wrong))).await;
    assert_eq!(code, 429, "{body}");
    let wait: u64 = head
        .lines()
        .find_map(|l| l.strip_prefix("retry-after: "))
        .unwrap_or_else(|| panic!("no Retry-After: {head}"))
        .trim()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    // No token at all counts as a wrong one.
    let (code, _, _) = raw(s.port, initialize("Host: 127.0.0.1\r\n")).await;
    assert_eq!(code, 429);
    // The right token keeps working: every local user shares 127.0.0.1.
    let (code, _, body) = raw(s.port, initialize(&bearer(TOKEN))).await;
    assert_eq!(code, 200, "{body}");
    for _ in 13..=16 {
        raw(s.port, initialize(&bearer(wrong))).await;
    }
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(!text.contains(wrong) && !text.contains(TOKEN), "a token in the log:\n{text}");
    // The first ten (not yet slowed) and then powers of two, so a guesser is seen but the log
    // does not grow with every guess.
    let counts: Vec<u32> = text
        .lines()
        .filter(|l| l.contains("refused a call without the right token"))
        .map(|l| {
            let n = l.split("wrong_tokens_in_window=").nth(1).unwrap();
            n.split_whitespace().next().unwrap().parse().unwrap()
        })
        .collect();
    assert_eq!(counts, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16], "{text}");
}

#[tokio::test]
async fn an_empty_token_is_no_token() {
    let s = serving(HttpConfig { token: Some(String::new()), ..Default::default() }).await;
    for headers in ["Host: 127.0.0.1\r\n".to_owned(), bearer("anything at all")] {
        let (code, _, body) = raw(s.port, initialize(&headers)).await;
        assert_eq!(code, 200, "{headers}: {body}");
    }
}

#[tokio::test]
async fn answers_are_event_streams_with_sessions_or_plain_json() {
    for (json, want) in [(false, "text/event-stream"), (true, "application/json")] {
        let s = serving(HttpConfig {
            token: Some(TOKEN.into()),
            json_response: json,
            ..Default::default()
        })
        .await;
        let (code, head, body) = raw(s.port, initialize(&bearer(TOKEN))).await;
        assert_eq!(code, 200, "{body}");
        assert!(head.contains(&format!("content-type: {want}")), "json_response {json}: {head}");
        assert!(body.contains("\"serverInfo\""), "{body}");
        let session = head.lines().find_map(|l| l.strip_prefix("mcp-session-id: "));
        assert_eq!(session.is_some(), !json, "a session only when streaming: {head}");
        // A notification is accepted, 202, as the protocol says; ending the session answers
        // 200 (rmcp's 202 is changed there only: clients expect 200).
        if let Some(id) = session {
            let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
            let post = format!(
                "POST /mcp HTTP/1.1\r\n{}Mcp-Session-Id: {}\r\nAccept: application/json, \
                 text/event-stream\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{note}",
                bearer(TOKEN),
                id.trim(),
                note.len()
            );
            let (code, _, body) = raw(s.port, post).await;
            assert_eq!(code, 202, "{body}");
            let delete = format!(
                "DELETE /mcp HTTP/1.1\r\n{}Mcp-Session-Id: {}\r\nConnection: close\r\n\r\n",
                bearer(TOKEN),
                id.trim()
            );
            let (code, _, body) = raw(s.port, delete).await;
            assert_eq!(code, 200, "{body}");
        }
    }
}
