//! The reverse bridge (`taskbridge claude-mcp`) as its clients use it: the real binary over stdio,
//! driven by rmcp's client, asking the loopback mock of the Messages API, and the real Claude
//! Code CLI pointed at the same mock. The last test runs the whole loop: the real OpenCode,
//! given the bridge by the worker, asks Claude through it.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::{MockAnthropic, Turn};
use crate::support::{Env, guard};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

/// A running `taskbridge claude-mcp` and an MCP client on its stdio.
struct Bridge {
    client: RunningService<RoleClient, ()>,
    child: tokio::process::Child,
}

/// This machine's PATH without any `claude`, so the backend is the one a test chooses whatever is
/// installed here: a directory that holds a `claude` is replaced by a directory of links to
/// everything else in it (node, say, which the pinned CLI needs).
fn plain_path() -> String {
    static SHIMS: std::sync::OnceLock<(tempfile::TempDir, String)> = std::sync::OnceLock::new();
    let (_, path) = SHIMS.get_or_init(|| {
        let shims = tempfile::tempdir().unwrap();
        let path = std::env::var_os("PATH").unwrap_or_default();
        let dirs: Vec<std::path::PathBuf> = std::env::split_paths(&path)
            .enumerate()
            .map(|(i, dir)| {
                if !dir.join("claude").exists() {
                    return dir;
                }
                let shim = shims.path().join(i.to_string());
                std::fs::create_dir_all(&shim).unwrap();
                for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    if entry.file_name() != "claude" {
                        let _ =
                            std::os::unix::fs::symlink(entry.path(), shim.join(entry.file_name()));
                    }
                }
                shim
            })
            .collect();
        let joined = std::env::join_paths(dirs).unwrap().to_string_lossy().into_owned();
        (shims, joined)
    });
    path.clone()
}

async fn bridge(env: &Env, vars: &[(&str, &str)]) -> Bridge {
    bridge_with(env, vars, &[]).await
}

/// `claude-mcp` with more flags.
async fn bridge_with(env: &Env, vars: &[(&str, &str)], flags: &[&str]) -> Bridge {
    let mut cmd = tokio::process::Command::new(crate::support::bin());
    cmd.arg("claude-mcp")
        .args(flags)
        .envs(env.env_vars())
        .env("PATH", plain_path())
        .env("TASKBRIDGE_CLAUDE_RETRY_BASE_MS", "20")
        .env_remove("ANTHROPIC_AUTH_TOKEN")
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("TASKBRIDGE_CLAUDE")
        .envs(vars.iter().copied());
    let (client, child) = crate::support::stdio_client(cmd).await;
    Bridge { client, child }
}

fn api_vars(mock: &MockAnthropic) -> Vec<(&'static str, String)> {
    vec![
        ("ANTHROPIC_API_KEY", "sk-ant-test-key".to_owned()),
        ("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{}", mock.port)),
    ]
}

async fn api_bridge(env: &Env, mock: &MockAnthropic) -> Bridge {
    let vars = api_vars(mock);
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    bridge(env, &vars).await
}

impl Bridge {
    async fn raw(&self, tool: &str, args: Value) -> CallToolResult {
        let args = args.as_object().cloned().unwrap_or_default();
        self.client
            .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
            .await
            .unwrap()
    }

    async fn call(&self, tool: &str, args: Value) -> Value {
        let r = self.raw(tool, args).await;
        assert_ne!(r.is_error, Some(true), "{tool} failed: {r:?}");
        r.structured_content.unwrap()
    }

    /// A tool error; returns its message.
    async fn refused(&self, tool: &str, args: Value) -> String {
        let r = self.raw(tool, args).await;
        assert_eq!(r.is_error, Some(true), "{tool} should have failed: {r:?}");
        let v = r
            .structured_content
            .unwrap_or_else(|| json!({"error": r.content[0].as_text().unwrap().text.clone()}));
        v["error"].as_str().unwrap().to_owned()
    }

    async fn wait_job(&self, job: i64, status: &str) -> Value {
        for _ in 0..200 {
            let p = self.call("claude_poll", json!({"job_id": job})).await;
            if p["status"] == status {
                return p;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("job {job} never became {status}");
    }
}

/// `--model` is the model of every call that names none (here over `TASKBRIDGE_CLAUDE_MODEL`,
/// which it overrides), and a call's own `model` still wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_flag_is_the_default_for_calls_that_name_none() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![Turn::text("one"), Turn::text("two")]);
    let mut vars = api_vars(&mock);
    vars.push(("TASKBRIDGE_CLAUDE_MODEL", "claude-from-the-env".into()));
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let b = bridge_with(&env, &vars, &["--model", "claude-from-the-flag"]).await;
    assert_eq!(b.call("claude_status", json!({})).await["default_model"], "claude-from-the-flag");
    assert_eq!(b.call("claude_ask", json!({"prompt": "a"})).await["model"], "claude-from-the-flag");
    b.call("claude_ask", json!({"prompt": "b", "model": "claude-haiku-4-5"})).await;
    let models: Vec<Value> = mock.requests().iter().map(|r| r["model"].clone()).collect();
    assert_eq!(models, [json!("claude-from-the-flag"), json!("claude-haiku-4-5")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tool_works_against_the_messages_api() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::text("42, of course."),
        Turn::Slow { after_ms: 300, turn: Box::new(Turn::text("Ship it.")) },
    ]);
    let b = api_bridge(&env, &mock).await;

    let tools: Vec<String> =
        b.client.list_all_tools().await.unwrap().into_iter().map(|t| t.name.to_string()).collect();
    for t in [
        "claude_ask",
        "claude_submit",
        "claude_poll",
        "claude_result",
        "claude_cancel",
        "claude_status",
    ] {
        assert!(tools.contains(&t.to_owned()), "{t} missing from {tools:?}");
    }

    let status = b.call("claude_status", json!({})).await;
    assert_eq!(status["backend"], "messages-api");
    assert_eq!(status["usable"], true);
    assert_eq!(status["default_model"], "claude-sonnet-4-5");

    let answer = b
        .call(
            "claude_ask",
            json!({"prompt": "What is 6 x 7?", "system": "Answer briefly.", "model": "claude-haiku-4-5", "max_tokens": 100}),
        )
        .await;
    assert_eq!(answer["text"], "42, of course.");
    assert_eq!(answer["model"], "claude-haiku-4-5");
    assert_eq!(answer["stop_reason"], "end_turn");
    assert_eq!(answer["backend"], "messages-api");
    let sent = mock.sent_usage();
    let usage = &answer["usage"];
    assert_eq!(
        (
            usage["input"].as_u64(),
            usage["output"].as_u64(),
            usage["cache_read"].as_u64(),
            usage["cache_write"].as_u64()
        ),
        (Some(sent.input), Some(sent.output), Some(sent.cache_read), Some(sent.cache_write))
    );
    // Haiku 4.5 lists at $1 / $5 per million tokens; cache writes 1.25x, reads 0.1x.
    let expect = (sent.input as f64
        + sent.output as f64 * 5.0
        + sent.cache_write as f64 * 1.25
        + sent.cache_read as f64 * 0.1)
        / 1e6;
    assert!((answer["cost_usd"].as_f64().unwrap() - expect).abs() < 1e-6, "{answer}");

    // What went over the wire: the key, the API version, and the question as asked.
    let req = &mock.requests()[0];
    assert_eq!(req["model"], "claude-haiku-4-5");
    assert_eq!(req["max_tokens"], 100);
    assert_eq!(req["system"], "Answer briefly.");
    assert_eq!(req["messages"][0]["content"], "What is 6 x 7?");
    let headers = &mock.headers()[0];
    assert_eq!(headers["x-api-key"], "sk-ant-test-key");
    assert_eq!(headers["anthropic-version"], "2023-06-01");

    // In the background: submit, poll, result.
    let submitted = std::time::Instant::now();
    let job = b.call("claude_submit", json!({"prompt": "Review my plan."})).await;
    let id = job["job_id"].as_i64().unwrap();
    let polled = b.wait_job(id, "done").await;
    // The job's own run time: at least the model's 300 ms, and within what this test waited.
    let elapsed = polled["elapsed_s"].as_f64().unwrap();
    assert!(elapsed >= 0.3 && elapsed <= submitted.elapsed().as_secs_f64(), "{polled}");
    let result = b.call("claude_result", json!({"job_id": id})).await;
    assert_eq!(result["text"], "Ship it.");
    assert_eq!(result["model"], "claude-sonnet-4-5");
    assert_eq!(result["job_id"], id);

    let status = b.call("claude_status", json!({})).await;
    assert_eq!(status["jobs"]["done"], 1);

    // Bad input and unknown ids say what was wrong.
    let err = b.refused("claude_ask", json!({"prompt": "  "})).await;
    assert!(err.contains("prompt") && err.contains("empty"), "{err}");
    let err = b.refused("claude_ask", json!({"prompt": "hi", "timeout_s": 0})).await;
    assert!(err.contains("timeout_s") && err.contains("1 to 3600"), "{err}");
    let err = b.refused("claude_poll", json!({"job_id": 999})).await;
    assert!(err.contains("job 999 does not exist"), "{err}");
    let err = b.refused("claude_result", json!({"job_id": "x"})).await;
    assert!(err.contains("job_id"), "{err}");

    // The key is in no file TaskBridge keeps: the database (jobs included) and the logs.
    drop(b);
    assert_no_file_contains(&env.home, "sk-ant-test-key");
}

fn assert_no_file_contains(dir: &Path, secret: &str) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            assert_no_file_contains(&path, secret);
        } else {
            let bytes = std::fs::read(&path).unwrap();
            let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
            assert!(!found, "the API key leaked into {}", path.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_become_messages_a_person_can_act_on() {
    let env = Env::new();
    let err = |status: u16, kind: &str| Turn::Error {
        status,
        kind: kind.into(),
        message: format!("mock {kind}"),
    };
    let mock = MockAnthropic::spawn(vec![
        err(401, "authentication_error"),
        // Four 429s use every attempt; one 529 then an answer is retried through.
        err(429, "rate_limit_error"),
        err(429, "rate_limit_error"),
        err(429, "rate_limit_error"),
        err(429, "rate_limit_error"),
        err(529, "overloaded_error"),
        Turn::text("after the storm"),
        err(404, "not_found_error"),
        Turn::Hang,
    ]);
    let b = api_bridge(&env, &mock).await;

    let e = b.refused("claude_ask", json!({"prompt": "hi"})).await;
    assert!(e.contains("401 authentication_error") && e.contains("check ANTHROPIC_API_KEY"), "{e}");
    assert_eq!(mock.requests().len(), 1, "a 401 is not retried");

    let e = b.refused("claude_ask", json!({"prompt": "hi"})).await;
    assert!(e.contains("rate-limited") && e.contains("after 4 attempts"), "{e}");
    assert_eq!(mock.requests().len(), 5);

    let ok = b.call("claude_ask", json!({"prompt": "hi"})).await;
    assert_eq!(ok["text"], "after the storm");

    let e = b.refused("claude_ask", json!({"prompt": "hi", "model": "claude-nope"})).await;
    assert!(e.contains("404 not_found_error") && e.contains("check the model name"), "{e}");

    let started = std::time::Instant::now();
    let e = b.refused("claude_ask", json!({"prompt": "hi", "timeout_s": 1})).await;
    assert!(e.contains("within 1 s") && e.contains("claude_submit"), "{e}");
    assert!(started.elapsed() < guard(Duration::from_secs(10)), "the call hung");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_job_stops_and_says_so() {
    let env = Env::new();
    // The model does answer, but only after the cancel.
    let mock = MockAnthropic::spawn(vec![Turn::Slow {
        after_ms: 800,
        turn: Box::new(Turn::text("A late answer.")),
    }]);
    let b = api_bridge(&env, &mock).await;
    let job = b.call("claude_submit", json!({"prompt": "think hard"})).await;
    let id = job["job_id"].as_i64().unwrap();
    b.wait_job(id, "running").await;
    let e = b.refused("claude_result", json!({"job_id": id})).await;
    assert!(e.contains("running") && e.contains("claude_poll"), "{e}");

    let cancelled = b.call("claude_cancel", json!({"job_id": id})).await;
    assert_eq!(cancelled["status"], "cancelled");
    let p = b.call("claude_poll", json!({"job_id": id})).await;
    assert_eq!((p["status"].as_str(), p["finished"].as_bool()), (Some("cancelled"), Some(true)));
    let e = b.refused("claude_result", json!({"job_id": id})).await;
    assert!(e.contains("cancelled"), "{e}");
    let e = b.refused("claude_cancel", json!({"job_id": id})).await;
    assert!(e.contains("is cancelled"), "{e}");
    // Still cancelled after the model's late answer: the runner dropped the call instead of
    // recording it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let p = b.call("claude_poll", json!({"job_id": id})).await;
    assert_eq!(p["status"], "cancelled", "{p}");
    assert_eq!(mock.requests().len(), 1, "the question reached the model");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_bridge_was_killed_is_failed_as_interrupted() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![Turn::Hang]);
    let mut b = api_bridge(&env, &mock).await;
    let job = b.call("claude_submit", json!({"prompt": "long question"})).await;
    let id = job["job_id"].as_i64().unwrap();
    b.wait_job(id, "running").await;

    let pid = b.child.id().unwrap() as i32;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    b.child.wait().await.unwrap();

    let b2 = api_bridge(&env, &mock).await;
    let p = b2.call("claude_poll", json!({"job_id": id})).await;
    assert_eq!(p["status"], "failed", "{p}");
    let e = p["error"].as_str().unwrap();
    assert!(e.starts_with("interrupted") && e.contains(&format!("pid {pid}")), "{e}");
    let e = b2.refused("claude_result", json!({"job_id": id})).await;
    assert!(e.contains("interrupted"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_or_a_cli_the_bridge_says_what_to_set_up() {
    let env = Env::new();
    let b = bridge(&env, &[]).await;
    let s = b.call("claude_status", json!({})).await;
    assert_eq!((s["backend"].as_str(), s["usable"].as_bool()), (Some("none"), Some(false)));
    let reason = s["reason"].as_str().unwrap();
    assert!(reason.contains("ANTHROPIC_API_KEY") && reason.contains("claude-code"), "{reason}");
    let e = b.refused("claude_ask", json!({"prompt": "hi"})).await;
    assert_eq!(e, reason);
    let e = b.refused("claude_submit", json!({"prompt": "hi"})).await;
    assert_eq!(e, reason);
}

/// A bridge whose backend is the real Claude Code CLI, pointed at `mock` with `token` (Bearer).
async fn cli_bridge(env: &Env, mock: &MockAnthropic, token: &str) -> Bridge {
    let base = format!("http://127.0.0.1:{}", mock.port);
    let cli = crate::support::claude_cli();
    let vars = [
        ("TASKBRIDGE_CLAUDE", cli.to_str().unwrap()),
        ("ANTHROPIC_BASE_URL", &base),
        ("ANTHROPIC_AUTH_TOKEN", token),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("DISABLE_AUTOUPDATER", "1"),
    ];
    bridge(env, &vars).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claude_code_cli_backend_answers_and_reports_errors() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::text("From the CLI: 42."),
        Turn::Error {
            status: 400,
            kind: "invalid_request_error".into(),
            message: "mock bad request".into(),
        },
    ]);
    let b = cli_bridge(&env, &mock, "cli-test-token").await;
    let s = b.call("claude_status", json!({})).await;
    assert_eq!(s["backend"], "claude-cli");

    let a = b
        .call("claude_ask", json!({"prompt": "What is 6 x 7? QUESTION-CLI", "model": "claude-sonnet-4-5", "timeout_s": 120}))
        .await;
    assert_eq!(a["text"], "From the CLI: 42.");
    assert_eq!(a["backend"], "claude-cli");
    assert_eq!(a["model"], "claude-sonnet-4-5");
    // The usage is what the mock sent, and the cost the CLI's own figure for it at Sonnet 4.5's
    // list prices ($3 in, $15 out, $3.75 cache write, $0.30 cache read per million).
    let sent = mock.sent_usage();
    assert_eq!(a["usage"]["input"].as_u64(), Some(sent.input), "{a}");
    assert_eq!(a["usage"]["output"].as_u64(), Some(sent.output), "{a}");
    assert_eq!(a["usage"]["cache_read"].as_u64(), Some(sent.cache_read), "{a}");
    assert_eq!(a["usage"]["cache_write"].as_u64(), Some(sent.cache_write), "{a}");
    let expect = (sent.input as f64 * 3.0
        + sent.output as f64 * 15.0
        + sent.cache_write as f64 * 3.75
        + sent.cache_read as f64 * 0.3)
        / 1e6;
    assert!((a["cost_usd"].as_f64().unwrap() - expect).abs() < 1e-9, "{a} vs {expect}");
    let asked = mock
        .requests()
        .into_iter()
        .position(|r| r.to_string().contains("QUESTION-CLI"))
        .expect("the CLI sent the question to the mock");
    let auth = mock.headers()[asked]["authorization"].to_str().unwrap().to_owned();
    assert_eq!(auth, "Bearer cli-test-token");

    let e =
        b.refused("claude_ask", json!({"prompt": "second QUESTION-CLI", "timeout_s": 120})).await;
    assert!(e.contains("400"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cli_stuck_on_a_bad_key_is_stopped_by_our_timeout() {
    let env = Env::new();
    // Claude Code retries a 401 on its own for minutes; only our wall clock ends the call.
    let mock = MockAnthropic::spawn(vec![]);
    mock.answer_when(
        "",
        Turn::Error {
            status: 401,
            kind: "authentication_error".into(),
            message: "invalid x-api-key".into(),
        },
    );
    let b = cli_bridge(&env, &mock, "bad-token").await;
    let started = std::time::Instant::now();
    let e = b.refused("claude_ask", json!({"prompt": "hello", "timeout_s": 4})).await;
    // Our timeout, not the CLI giving up on its own (which would say to check the key).
    assert!(e.contains("within 4 s") && e.contains("claude-cli"), "{e}");
    assert!(started.elapsed() >= Duration::from_secs(4), "a 4 s timeout ends a call no sooner");
    assert!(started.elapsed() < guard(Duration::from_secs(30)), "the call hung");
    // Nothing keeps asking the mock once the call ended.
    let n = mock.requests().len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(mock.requests().len() <= n + 1, "the CLI kept running after the timeout");
}

#[test]
fn opencode_asks_claude_through_the_bridge_in_a_task_run() {
    let mock = MockAnthropic::spawn(vec![
        Turn::tool(
            "taskbridge_claude_ask",
            json!({"prompt": "BRIDGE-QUESTION: which port should the server use?"}),
        ),
        Turn::text("Claude says port 4242, so I used it."),
    ]);
    mock.answer_when("BRIDGE-QUESTION", Turn::text("Use port 4242."));
    let env = Env::new().with_mock(&mock);
    let worker = env
        .cmd()
        .args(["worker", "--concurrency", "1", "--claude-bridge"])
        .env("ANTHROPIC_API_KEY", "sk-ant-bridge-key")
        .env("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{}", mock.port))
        .env("PATH", plain_path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _worker = crate::support::Child(worker);
    let id = env.submit(&["Pick a port for the server; ask Claude."]);
    let t = env.wait_status(id, "done", Duration::from_secs(120));

    let reqs = mock.requests();
    // OpenCode offered the bridge's tools to the model.
    let offered: Vec<String> = reqs[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(offered.contains(&"taskbridge_claude_ask".to_owned()), "{offered:?}");
    // The bridge asked "Claude" (the mock recognised the question) over the Messages API ...
    let (i, asked) = reqs
        .iter()
        .enumerate()
        .find(|(_, r)| r["stream"] != true && r.to_string().contains("BRIDGE-QUESTION"))
        .expect("the bridge forwarded the question");
    assert_eq!(
        asked["messages"][0]["content"],
        "BRIDGE-QUESTION: which port should the server use?"
    );
    assert_eq!(mock.headers()[i]["x-api-key"], "sk-ant-bridge-key");
    // ... and Claude's answer reached OpenCode's next request as the tool result.
    let next =
        reqs[i + 1..].iter().find(|r| r["stream"] == true).expect("OpenCode asked the model again");
    assert!(next.to_string().contains("Use port 4242."), "{next}");
    assert!(t["result"]["summary"].as_str().unwrap().contains("port 4242"), "{t:#}");
}

#[test]
fn config_opencode_registers_a_bridge_the_real_opencode_connects_to() {
    let env = Env::new();
    let file = env.oc_home.join(".config/opencode/opencode.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, r#"{"share": "disabled", "mcp": {"other": {"enabled": false}}}"#)
        .unwrap();

    let printed = env.ok(&["config", "opencode"]);
    assert!(
        printed.contains("\"claude-mcp\"") && printed.contains("{env:ANTHROPIC_API_KEY}"),
        "{printed}"
    );
    env.ok(&["config", "opencode", "--write"]);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(v["share"], "disabled");
    assert_eq!(v["mcp"]["other"]["enabled"], false);
    let entry = &v["mcp"]["taskbridge"];
    assert_eq!(entry["type"], "local");
    let command: Vec<&str> =
        entry["command"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    assert!(Path::new(command[0]).is_absolute());
    assert_eq!(command[1..], ["--home", env.home.to_str().unwrap(), "claude-mcp"]);
    assert!(!std::fs::read_to_string(&file).unwrap().contains("sk-"), "no secret in the file");
    assert!(file.with_extension("json.bak").exists(), "a backup was written first");

    let out = std::process::Command::new(crate::support::opencode())
        .args(["mcp", "list"])
        .envs(env.env_vars())
        .current_dir(&env.repo)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("taskbridge")).unwrap_or_default().to_owned();
    assert!(line.contains("connected"), "OpenCode did not connect to the bridge:\n{text}");
}

#[test]
fn over_http_the_bridge_is_guarded_like_the_main_server() {
    let env = Env::new();
    let refused = env.run(&["claude-mcp", "--listen", "0.0.0.0:0", "--no-token"]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("without a token"), "{err}");

    let (_bridge, p, _) = crate::support::start_http(env.cmd().args([
        "claude-mcp",
        "--listen",
        "127.0.0.1:0",
        "--token",
        "bridge-secret-0123456789abcdef0123456789",
    ]));
    assert_eq!(
        crate::support::post(
            p,
            &format!("127.0.0.1:{p}"),
            Some("bridge-secret-0123456789abcdef0123456789")
        ),
        200
    );
    assert_eq!(crate::support::post(p, &format!("127.0.0.1:{p}"), None), 401);
    for wrong in crate::support::near_misses("bridge-secret-0123456789abcdef0123456789") {
        assert_eq!(
            crate::support::post(p, &format!("127.0.0.1:{p}"), Some(&wrong)),
            401,
            "{wrong}"
        );
    }
    assert_eq!(
        crate::support::post(p, "evil.example", Some("bridge-secret-0123456789abcdef0123456789")),
        403
    );
    let (_, body) = crate::support::post_body(
        p,
        &format!("127.0.0.1:{p}"),
        Some("bridge-secret-0123456789abcdef0123456789"),
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    );
    assert!(body.contains("taskbridge-claude"), "{body}");
}

/// install.sh offers to register the bridge in opencode.json (`config opencode --write`); a
/// worker that does not offer it (no `--claude-bridge`) switches that entry off in its tasks,
/// where it could not reach the queue (OpenCode logged "server unavailable" in every task), and
/// says so at its start, as doctor does.
#[test]
fn a_bridge_registered_in_opencode_json_is_left_out_of_tasks_and_the_worker_says_why() {
    let mock = MockAnthropic::spawn(vec![Turn::text("Done.")]);
    let env = Env::new().with_mock(&mock);
    env.ok(&["config", "opencode", "--write"]);
    let log = env.dir.path().join("worker.err");
    let worker = env
        .cmd()
        .args(["worker", "--concurrency", "1", "--opencode", "serve"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let worker = crate::support::Child(worker);
    let id = env.submit(&["Say done."]);
    env.wait_status(id, "done", Duration::from_secs(120));
    let doctor = String::from_utf8_lossy(&env.run(&["doctor"]).stdout).into_owned();
    assert!(doctor.contains("registered, but tasks do not get it"), "{doctor}");
    // OpenCode tries its MCP servers in the background and logs a failure about a second
    // after the task's session began; doctor took longer, and the server stops with the worker.
    drop(worker);
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("does not offer it to tasks") && said.contains("--claude-bridge"),
        "{said}"
    );
    let offered = mock.requests()[0]["tools"].to_string();
    assert!(!offered.contains("taskbridge_claude_ask"), "{offered}");
    // OpenCode did not try to start it inside the wall.
    let logs = env.oc_home.join(".local/share/opencode/log");
    for f in std::fs::read_dir(&logs).unwrap() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        let failed = text.lines().find(|l| l.contains("key=taskbridge") && l.contains("failed"));
        assert!(failed.is_none(), "{failed:?}");
    }
}
