//! Watching TaskBridge as a service: the real Prometheus (Debian's package) scrapes `serve`'s
//! `/metrics` with the token while the real OpenCode runs tasks against the mock Messages API,
//! and an OTLP/HTTP receiver of the test's own decodes the spans the same run exports.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::MockAnthropic;
use crate::support::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const RUN: Duration = Duration::from_secs(120);

/// An OTLP/HTTP traces endpoint on loopback: every span of every request it is sent.
struct Receiver {
    port: u16,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let got = spans.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().map_while(Result::ok) {
                let got = got.clone();
                std::thread::spawn(move || serve_otlp(conn, &got));
            }
        });
        Receiver { port, spans }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

/// Answers each POST on one connection (the exporter keeps it alive) with an empty success.
fn serve_otlp(conn: TcpStream, got: &Mutex<Vec<Span>>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut conn = conn;
    loop {
        let mut len = 0usize;
        let mut path = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some(p) = l.strip_prefix("POST ") {
                path = p.split(' ').next().unwrap_or("").to_owned();
            }
            if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        reader.read_exact(&mut body).unwrap();
        assert_eq!(path, "/v1/traces", "the standard traces path");
        let req = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        for rs in req.resource_spans {
            for ss in rs.scope_spans {
                got.lock().unwrap().extend(ss.spans);
            }
        }
        let reply =
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
        if conn.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a any_value::Value> {
    span.attributes
        .iter()
        .find(|KeyValue { key: k, .. }| k == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|AnyValue { value }| value.as_ref())
}

fn int_attr(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key)? {
        any_value::Value::IntValue(i) => Some(*i),
        _ => None,
    }
}

fn str_attr<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(span, key)? {
        any_value::Value::StringValue(s) => Some(s),
        _ => None,
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A raw HTTP GET; the status code and the body.
fn get(port: u16, path_and_query: &str, headers: &str) -> (u16, String) {
    // Zero: nothing listens there (yet).
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return (0, String::new()) };
    write!(
        s,
        "GET {path_and_query} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// The README's scrape config, as a user pastes it.
fn readme_scrape_config() -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let after = readme.split("<!-- scrape-config:").nth(1).expect("the README's scrape config");
    let block = after.split("```yaml\n").nth(1).unwrap().split("```").next().unwrap();
    // It is indented under its list item.
    block.lines().map(|l| format!("{}\n", l.strip_prefix("  ").unwrap_or(l))).collect()
}

/// The real Prometheus, scraping `target` every second twice: with the README's config (the
/// token in a file), and as a scraper that has no token.
struct Prometheus {
    _child: Child,
    port: u16,
}

impl Prometheus {
    fn start(dir: &Path, target: u16, token_file: &Path) -> Prometheus {
        let config = dir.join("prometheus.yml");
        let target = format!("'127.0.0.1:{target}'");
        let readme = readme_scrape_config()
            .replace("'127.0.0.1:8765'", &target)
            .replace("/etc/prometheus/taskbridge.token", token_file.to_str().unwrap());
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n{readme}  - job_name: without_token\n    \
                 static_configs:\n      - targets: [{target}]\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let child = Command::new("/usr/bin/prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("Prometheus (Debian's package `prometheus`; .ci/run installs it)");
        Prometheus { _child: Child(child), port }
    }

    /// The instant vector a PromQL query returns.
    fn query(&self, promql: &str) -> Vec<Value> {
        let v = self.ask(promql);
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// What the query API answers to `promql` (`Null` while it does not listen yet).
    fn ask(&self, promql: &str) -> Value {
        let q: String = promql
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (status, body) = get(self.port, &format!("/api/v1/query?query={q}"), "");
        if status == 0 {
            return Value::Null;
        }
        serde_json::from_str(&body).unwrap_or(Value::Null)
    }

    /// The one value `promql` gives, once it gives one that `ok` accepts.
    fn wait_value(&self, promql: &str, ok: impl Fn(f64) -> bool) -> f64 {
        let mut last = vec![];
        let seen = eventually(Duration::from_secs(60), || {
            last = self.query(promql);
            last.len() == 1
                && last[0]["value"][1].as_str().and_then(|s| s.parse().ok()).is_some_and(&ok)
        });
        assert!(seen, "Prometheus never gave an accepted value for {promql}: {last:?}");
        last[0]["value"][1].as_str().unwrap().parse().unwrap()
    }
}

#[test]
fn prometheus_scrapes_the_tasks_that_ran_and_an_otlp_receiver_gets_a_span_per_task() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![result_turn("first"), result_turn("second")]);
    let mut env = env.with_mock(&mock);
    let receiver = Receiver::start();
    env.extra_env.push((
        "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
        format!("http://127.0.0.1:{}", receiver.port),
    ));
    // Spans leave in batches; a short delay keeps the test short.
    env.extra_env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "200".into()));
    let (_serve, port) = start_serve(&env, &["--concurrency", "1"]);
    let token = env.token();

    // Without the token, or with a wrong one, /metrics says nothing.
    let (status, body) = get(port, "/metrics", "");
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains("taskbridge_"), "{body}");
    let (status, _) = get(port, "/metrics", "Authorization: Bearer not-the-token\r\n");
    assert_eq!(status, 401);

    let ids = [env.submit(&["Say hello", "--title", "first"]), env.submit(&["Say bye"])];
    for id in ids {
        let t =
            env.wait_task(id, RUN, |t| ["done", "failed"].contains(&t["status"].as_str().unwrap()));
        assert_eq!(t["status"], "done", "{t:#}\nlog:\n{}", env.log(id));
    }

    let token_file = env.dir.path().join("scrape-token");
    std::fs::write(&token_file, &token).unwrap();
    let prom = Prometheus::start(env.dir.path(), port, &token_file);
    prom.wait_value(r#"up{job="taskbridge"}"#, |v| v == 1.0);
    assert_eq!(prom.wait_value(r#"up{job="without_token"}"#, |_| true), 0.0, "refused");
    prom.wait_value(r#"taskbridge_tasks{state="done"}"#, |v| v == 2.0);
    prom.wait_value(r#"taskbridge_tasks_submitted_total{agent="opencode"}"#, |v| v == 2.0);
    prom.wait_value(r#"taskbridge_tasks_finished_total{agent="opencode",outcome="done"}"#, |v| {
        v == 2.0
    });
    prom.wait_value("taskbridge_queue_wait_seconds_count", |v| v == 2.0);
    prom.wait_value("taskbridge_task_run_seconds_count", |v| v == 2.0);
    let sent = mock.sent_usage();
    prom.wait_value(r#"sum(taskbridge_agent_tokens_total{kind="output"})"#, |v| v > 0.0);
    prom.wait_value(r#"sum(taskbridge_agent_tokens_total{kind="cache_read"})"#, |v| {
        v == sent.cache_read as f64
    });
    prom.wait_value("sum(taskbridge_agent_cost_usd_total)", |v| v > 0.0);
    // The tasks name no model: they ran on the worker's default, and are counted under it.
    let on_default = format!(r#"sum(taskbridge_agent_cost_usd_total{{model="{MODEL}"}})"#);
    prom.wait_value(&on_default, |v| v > 0.0);
    prom.wait_value(r#"taskbridge_worker_slots{state="free"}"#, |v| v == 1.0);
    prom.wait_value("sum(taskbridge_workers)", |v| v == 1.0);
    // The histogram's buckets make quantiles (over all time here: every task ran before the
    // first scrape, so a rate over a window would be empty).
    let p95 = "histogram_quantile(0.95, sum by (le) (taskbridge_queue_wait_seconds_bucket))";
    prom.wait_value(p95, |v| (0.0..120.0).contains(&v));

    // Every PromQL line of the README is one Prometheus takes (the rates may be empty this
    // soon after the first scrape).
    let after =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let block = after.split("<!-- promql:").nth(1).unwrap().split("```\n").nth(1).unwrap();
    let lines: Vec<&str> = block
        .split("```")
        .next()
        .unwrap()
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .collect();
    assert!(lines.len() >= 5, "{lines:?}");
    for q in lines.iter().filter(|l| !l.is_empty()) {
        let v = prom.ask(q);
        assert_eq!(v["status"], "success", "{q}: {v}");
    }

    // One span per task's attempt, with its stages as children.
    let mut spans = vec![];
    assert!(
        eventually(Duration::from_secs(30), || {
            spans = receiver.spans();
            ids.iter().all(|id| spans.iter().any(|s| s.name == format!("task {id}")))
        }),
        "spans received: {:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    for id in ids {
        let attempts: Vec<&Span> =
            spans.iter().filter(|s| s.name == format!("task {id}")).collect();
        assert_eq!(attempts.len(), 1, "one attempt span for task {id}");
        let a = attempts[0];
        assert_eq!(int_attr(a, "taskbridge.task.id"), Some(id));
        assert_eq!(str_attr(a, "taskbridge.repository"), Some(env.repo.to_str().unwrap()));
        assert_eq!(str_attr(a, "gen_ai.agent.name"), Some("opencode"));
        assert_eq!(str_attr(a, "taskbridge.outcome"), Some("done"));
        assert!(str_attr(a, "gen_ai.request.model").is_some_and(|m| !m.is_empty()));
        assert!(int_attr(a, "gen_ai.usage.output_tokens").is_some_and(|n| n > 0), "{a:?}");
        assert!(
            matches!(attr(a, "taskbridge.cost_usd"), Some(any_value::Value::DoubleValue(c)) if *c > 0.0)
        );
        let children: Vec<&str> = spans
            .iter()
            .filter(|s| s.parent_span_id == a.span_id && s.trace_id == a.trace_id)
            .map(|s| s.name.as_str())
            .collect();
        for stage in ["worktree", "invoke_agent opencode", "commit"] {
            assert!(children.contains(&stage), "task {id}'s children: {children:?}");
        }
        let turn = spans
            .iter()
            .find(|s| s.parent_span_id == a.span_id && s.name == "invoke_agent opencode")
            .unwrap();
        assert!(int_attr(turn, "gen_ai.usage.output_tokens").is_some_and(|n| n > 0), "{turn:?}");
    }
}

/// With the SDK disabled the standard way, a worker exports nothing even with an endpoint set.
#[test]
fn with_otel_sdk_disabled_nothing_is_exported() {
    let mut env = Env::new();
    let receiver = Receiver::start();
    env.extra_env.push((
        "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
        format!("http://127.0.0.1:{}", receiver.port),
    ));
    env.extra_env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()));
    let agent = script(env.dir.path(), "agent", "cat > /dev/null\n");
    let id = env.submit(&["Nothing to see"]);
    let mut off = Env::new();
    off.extra_env = env.extra_env.clone();
    off.extra_env.push(("OTEL_SDK_DISABLED".into(), "true".into()));
    let quiet = off.submit(&["Nothing either"]);
    env.run_queue_with(&agent, &[]);
    off.run_queue_with(&agent, &[]);
    assert_eq!(env.show(id)["status"], "done", "{}", env.log(id));
    assert_eq!(off.show(quiet)["status"], "done", "{}", off.log(quiet));
    // The enabled worker's span arrived before its process exited (the exit flushes); the
    // disabled one's never did.
    let attempts: Vec<Span> =
        receiver.spans().into_iter().filter(|s| s.name.starts_with("task ")).collect();
    let repos: Vec<Option<&str>> =
        attempts.iter().map(|s| str_attr(s, "taskbridge.repository")).collect();
    assert_eq!(repos, vec![Some(env.repo.to_str().unwrap())], "only the enabled worker's");
}

/// A worker alone serves `/metrics` on its own listener, behind the home's token.
#[test]
fn a_worker_alone_serves_metrics_behind_the_token() {
    let env = Env::new();
    let agent = script(env.dir.path(), "agent", "cat > /dev/null\n");
    let (_worker, port, _) = start_http(
        env.cmd()
            .args(["worker", "--metrics-listen", "127.0.0.1:0"])
            .env("TASKBRIDGE_OPENCODE", &agent)
            .env("TASKBRIDGE_OPENCODE_MODE", "run"),
    );
    let (status, _) = get(port, "/metrics", "");
    assert_eq!(status, 401);
    let id = env.submit(&["Count me"]);
    env.wait_status(id, "done", RUN);
    let auth = format!("Authorization: Bearer {}\r\n", env.token());
    let mut body = String::new();
    assert!(
        eventually(Duration::from_secs(20), || {
            body = get(port, "/metrics", &auth).1;
            body.contains(r#"taskbridge_tasks_finished_total{agent="opencode",outcome="done"} 1"#)
        }),
        "{body}"
    );
    assert!(body.contains(r#"taskbridge_tasks{state="done"} 1"#), "{body}");
    assert!(body.contains("taskbridge_workers{host="), "{body}");
    assert!(body.ends_with("# EOF\n"), "OpenMetrics text: {body}");
}
