//! MCP latency and throughput: `get_task` over stdio and over HTTP, cold start to initialized,
//! side by side with a Python FastMCP server serving the same read from the same database.
//!
//!   cargo bench --bench mcp       full run (2,000 calls per transport)
//!   cargo test  --bench mcp       small run (50 calls): a smoke test
//!
//! Prints `bench=mcp.<server>.<transport> cold_start_ms=.. p50_ms=.. p99_ms=.. calls_per_s=..`
//! (`http` answers with event streams, `http_json` with plain JSON as public mode does) and the
//! ratio against FastMCP; and `bench=mcp.wait_for.other_process`: a worker in another process
//! finishes a task → the `wait_for` call waiting on it answers (200 tasks; 10 in the small
//! run; `-- wait_for` runs it alone). The Python side runs when `.venv` has the `mcp` package
//! (`.ci/run` installs it); otherwise it is skipped with a line that says so.
#![allow(clippy::unwrap_used)]

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, NumberOrString, ProgressToken, RequestParamsMeta};
use rmcp::service::{RoleClient, RunningService};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

struct Figures {
    cold_start_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    per_s: f64,
}

async fn measure(client: &RunningService<RoleClient, ()>, n: usize) -> (f64, f64, f64) {
    let args = serde_json::json!({"task_id": 1}).as_object().cloned().unwrap();
    let mut lat = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let r = client
            .call_tool(CallToolRequestParams::new("get_task").with_arguments(args.clone()))
            .await
            .unwrap();
        assert_ne!(r.is_error, Some(true), "{r:?}");
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let per_s = n as f64 / start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    (quantile(&lat, 0.5), quantile(&lat, 0.99), per_s)
}

/// The `q` quantile (0 to 1) of latencies sorted in increasing order.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

async fn stdio(program: &Path, args: &[&str], envs: &[(&str, &Path)], n: usize) -> Figures {
    let start = Instant::now();
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client = ().serve(io).await.unwrap();
    let cold_start_ms = start.elapsed().as_secs_f64() * 1000.0;
    let (p50_ms, p99_ms, per_s) = measure(&client, n).await;
    let _ = client.cancel().await;
    let _ = child.kill().await;
    Figures { cold_start_ms, p50_ms, p99_ms, per_s }
}

/// `taskbridge serve --no-worker` (with `extra`) on a free loopback port, once it accepts
/// connections: the child, the port and the token it asks for (the home's, as a client reads
/// it).
async fn serve(home: &Path, extra: Option<&str>) -> (tokio::process::Child, u16, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_taskbridge"))
        .args(["serve", "--no-worker", "--listen", &format!("127.0.0.1:{port}")])
        .args(extra)
        .env("TASKBRIDGE_HOME", home)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let token = std::fs::read_to_string(home.join("token")).unwrap().trim().to_owned();
    (child, port, token)
}

/// `serve` with its default event-stream answers, or with `--json-response` (plain JSON, what
/// public mode uses).
async fn http(home: &Path, n: usize, json_response: bool) -> Figures {
    let start = Instant::now();
    let (mut child, port, token) = serve(home, json_response.then_some("--json-response")).await;
    let config =
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            format!("http://127.0.0.1:{port}/mcp"),
        )
        .auth_header(token);
    let transport = rmcp::transport::StreamableHttpClientTransport::from_config(config);
    let client = ().serve(transport).await.unwrap();
    let cold_start_ms = start.elapsed().as_secs_f64() * 1000.0;
    let (p50_ms, p99_ms, per_s) = measure(&client, n).await;
    let _ = client.cancel().await;
    let _ = child.kill().await;
    Figures { cold_start_ms, p50_ms, p99_ms, per_s }
}

/// A process's resident memory, in MB.
fn rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

/// `n` sessions opened (an `initialize` each, never closed) against `serve`: its memory before
/// and after. The server keeps at most `mcp::sessions::MAX_SESSIONS` of them.
async fn sessions(home: &Path, n: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut child, port, token) = serve(home, None).await;
    let pid = child.id().unwrap();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#;
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let before = rss_mb(pid);
    let start = Instant::now();
    for _ in 0..n {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).await.unwrap();
        assert!(resp.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&resp));
    }
    let secs = start.elapsed().as_secs_f64();
    let after = rss_mb(pid);
    println!(
        "bench=mcp.taskbridge.http_sessions n={n} rss_before_mb={before:.1} rss_after_mb={after:.1} growth_mb={:.1} secs={secs:.1}",
        after - before
    );
    let _ = child.kill().await;
}

/// A client that hands on each progress line it hears.
#[derive(Clone)]
struct Heard(tokio::sync::mpsc::UnboundedSender<String>);

impl rmcp::ClientHandler for Heard {
    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _: rmcp::service::NotificationContext<RoleClient>,
    ) {
        let _ = self.0.send(params.message.unwrap_or_default());
    }
}

/// `wait_for` over stdio to `taskbridge mcp --no-worker` while a worker in another process (this
/// one, through its own connection to the database) finishes the task: the worker's `done`
/// committed → the reply in the client's hands. The server hears of the commit only through
/// the database watch, as it does of any worker that is not its own. The call carries a progress
/// token, so the server says when it has read the task queued and begins to wait.
async fn wake(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let home = queue::Home::at(dir.path().join("home")).unwrap();
    home.ensure().unwrap();
    let store = queue::Store::open(home.db_path()).unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_taskbridge"));
    cmd.args(["mcp", "--no-worker"])
        .env("TASKBRIDGE_HOME", home.root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let client = Heard(tx).serve(io).await.unwrap();
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let spec = queue::TaskSpec::new(
            format!("wait {i}"),
            "/tmp/repo",
            "0123456789abcdef0123456789abcdef01234567",
        );
        let (task, _) = store.submit(spec).unwrap();
        let args = serde_json::json!({"task_ids": [task.id.0], "timeout_s": 10});
        let mut params = CallToolRequestParams::new("wait_for")
            .with_arguments(args.as_object().cloned().unwrap());
        params.set_progress_token(ProgressToken(NumberOrString::Number(task.id.0)));
        let peer = client.peer().clone();
        let waiting = tokio::spawn(async move {
            let r = peer.call_tool(params).await.unwrap();
            (Instant::now(), r)
        });
        // The call reports the task queued just before it waits; only then does it finish (the
        // last round's lines may come first).
        let queued = format!("task {} queued", task.id.0);
        tokio::time::timeout(Duration::from_secs(10), async {
            while heard.recv().await.unwrap() != queued {}
        })
        .await
        .expect("the wait_for call never reported its task queued");
        let claim = store.claim_next("bench", "host", Duration::from_secs(60)).unwrap().unwrap();
        assert_eq!(claim.task.id, task.id);
        let done = queue::Outcome::Done { result: Box::default() };
        store.finish(task.id, claim.token, done).unwrap();
        let finished = Instant::now();
        let (replied, r) = waiting.await.unwrap();
        assert_ne!(r.is_error, Some(true), "{r:?}");
        let reply = r.structured_content.unwrap();
        assert_eq!(reply["done"], serde_json::json!([task.id.0]), "{reply}");
        lat.push(replied.duration_since(finished).as_secs_f64() * 1000.0);
    }
    let _ = client.cancel().await;
    let _ = child.kill().await;
    lat.sort_by(f64::total_cmp);
    println!(
        "bench=mcp.wait_for.other_process n={n} p50_ms={:.2} p99_ms={:.2} max_ms={:.2}",
        quantile(&lat, 0.5),
        quantile(&lat, 0.99),
        quantile(&lat, 1.0)
    );
}

fn print(name: &str, f: &Figures) {
    println!(
        "bench={name} cold_start_ms={:.1} p50_ms={:.3} p99_ms={:.3} calls_per_s={:.0}",
        f.cold_start_ms, f.p50_ms, f.p99_ms, f.per_s
    );
}

#[tokio::main]
async fn main() {
    // rmcp's HTTP client is a reqwest client, built without a TLS provider of its own.
    mcp::bridge::install_tls();
    let full = std::env::args().any(|a| a == "--bench");
    let n = if full { 2000 } else { 50 };
    // `cargo bench --bench mcp -- wait_for`: only the wake-up of a waiting call.
    let wait_for_only = std::env::args().any(|a| a == "wait_for");
    if wait_for_only {
        return wake(if full { 200 } else { 10 }).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let home = queue::Home::at(dir.path().join("home")).unwrap();
    home.ensure().unwrap();
    let store = queue::Store::open(home.db_path()).unwrap();
    let spec = queue::TaskSpec::new(
        "Benchmark task: read me",
        "/tmp/repo",
        "0123456789abcdef0123456789abcdef01234567",
    );
    store.submit(spec).unwrap();
    store.add_note(queue::TaskId(1), "a note").unwrap();
    drop(store);

    let tb = Path::new(env!("CARGO_BIN_EXE_taskbridge"));
    let rust_stdio =
        stdio(tb, &["mcp", "--no-worker"], &[("TASKBRIDGE_HOME", home.root())], n).await;
    print("mcp.taskbridge.stdio", &rust_stdio);
    let rust_http = http(home.root(), n, false).await;
    print("mcp.taskbridge.http", &rust_http);
    let rust_http_json = http(home.root(), n, true).await;
    print("mcp.taskbridge.http_json", &rust_http_json);
    sessions(home.root(), if full { 5000 } else { 300 }).await;
    wake(if full { 200 } else { 10 }).await;

    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/fastmcp_server.py");
    let has_sdk = std::process::Command::new(&py)
        .args(["-c", "import mcp"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_sdk {
        println!("bench=mcp.fastmcp.stdio skipped=no .venv with the mcp package (run .ci/run)");
        return;
    }
    let db = home.db_path();
    let py_stdio = stdio(&py, &[script.to_str().unwrap(), db.to_str().unwrap()], &[], n).await;
    print("mcp.fastmcp.stdio", &py_stdio);
    println!(
        "bench=mcp.ratio.stdio p50_fastmcp_over_taskbridge={:.1} throughput_taskbridge_over_fastmcp={:.1} cold_start_fastmcp_over_taskbridge={:.1}",
        py_stdio.p50_ms / rust_stdio.p50_ms,
        rust_stdio.per_s / py_stdio.per_s,
        py_stdio.cold_start_ms / rust_stdio.cold_start_ms
    );
}
