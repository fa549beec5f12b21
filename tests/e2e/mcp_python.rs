//! The official Python MCP SDK against the real binary, over stdio and over HTTP, on a real task
//! run by the real OpenCode CLI (against the loopback mock).
#![allow(clippy::unwrap_used)]

use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support::mock_anthropic::{MockAnthropic, Turn};
use crate::support::*;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/test_mcp.py")
}

/// The question round trip the Python client drives: ask, then write a file, then report.
fn banner_mock(env: &Env, task_id: i64) -> MockAnthropic {
    MockAnthropic::spawn(vec![
        Turn::text(
            "I need a decision.\n\n```taskbridge-question\nShould the banner be red or blue?\n```",
        ),
        Turn::tool(
            "write",
            json!({"filePath": env.worktree(task_id).join("banner.txt"), "content": "blue banner\n"}),
        ),
        Turn::text(
            "Done.\n```taskbridge-result\n{\"summary\": \"Added a blue banner.\", \"tests_run\": []}\n```",
        ),
    ])
}

fn run_python(mode: &str, envs: Vec<(String, String)>) {
    let out = Command::new(python())
        .arg(script())
        .arg(mode)
        .envs(envs)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python {mode} failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}

#[test]
fn python_sdk_over_stdio_runs_a_task_with_a_question() {
    python_stdio_scenario(Env::new());
}

/// The MCP server, its worker and the client's round trip with the queue on PostgreSQL.
#[test]
fn python_sdk_over_stdio_on_a_postgres_queue() {
    python_stdio_scenario(Env::new().on_postgres());
}

fn python_stdio_scenario(env: Env) {
    let mock = banner_mock(&env, 1);
    let env = env.with_mock(&mock);
    let server_env: serde_json::Map<String, serde_json::Value> =
        env.env_vars().into_iter().map(|(k, v)| (k, json!(v))).collect();
    run_python(
        "stdio",
        vec![
            ("TB_BIN".into(), bin().display().to_string()),
            ("TB_SERVER_ENV".into(), serde_json::Value::Object(server_env).to_string()),
            ("TB_REPO".into(), env.repo.display().to_string()),
            ("TB_LOGS".into(), env.home.join("logs").display().to_string()),
        ],
    );
    // The answer reached the agent in the same session.
    let reqs = mock.requests();
    assert!(reqs[1]["messages"].to_string().contains("Blue, please."));
}

#[test]
fn python_sdk_over_http_with_token_host_and_origin_checks() {
    let env = Env::new();
    let mock = banner_mock(&env, 1);
    let env = env.with_mock(&mock);
    let token = "test-token-0123456789abcdef0123456789";
    let canary_key = "sk-ant-canary-7f3a9c1e5b";
    // The token from the environment, as a service unit would pass it.
    let (mut server, port, _) = start_http(
        env.cmd()
            .args(["serve", "--listen", "127.0.0.1:0", "--concurrency", "1"])
            .env("TASKBRIDGE_TOKEN", token)
            .env("ANTHROPIC_API_KEY", canary_key),
    );
    run_python(
        "http",
        vec![
            ("TB_URL".into(), format!("http://127.0.0.1:{port}/mcp")),
            ("TB_TOKEN".into(), token.into()),
            ("TB_REPO".into(), env.repo.display().to_string()),
            ("TB_LOGS".into(), env.home.join("logs").display().to_string()),
        ],
    );
    server.terminate();
    // Neither the token nor the API key appears in any file TaskBridge keeps: logs, task logs,
    // raw events, the database (task records, errors, results).
    let mut files = 0;
    for entry in walk(&env.home) {
        let bytes = std::fs::read(&entry).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(token), "the token leaked into {}", entry.display());
        assert!(!text.contains(canary_key), "the API key leaked into {}", entry.display());
        files += 1;
    }
    assert!(files >= 4, "the check read the database and the logs");
}

#[test]
fn a_non_loopback_listener_without_a_token_is_refused_at_start() {
    let env = Env::new();
    let out = env.run(&["serve", "--listen", "0.0.0.0:0", "--no-worker", "--no-token"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to listen on 0.0.0.0:0 without a token"), "{err}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().map_while(Result::ok) {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "worktrees") {
                out.extend(walk(&p));
            }
        } else {
            out.push(p);
        }
    }
    out
}

/// The agent's questions asked in the client itself: accepted (the same wait sees the task
/// through, with progress lines), declined (the task waits for answer_task, never asked
/// again), and asked of the client that submitted the task while no call of its waits.
#[test]
fn python_sdk_elicitation_answers_or_declines_a_question_and_progress_follows_the_task() {
    let env = Env::new();
    let mut turns = vec![];
    for (id, file) in [(1, "banner.txt"), (2, "footer.txt"), (3, "header.txt")] {
        turns.extend([
            Turn::text(
                "I need a decision.\n\n```taskbridge-question\nShould it be red or blue?\n```",
            ),
            Turn::tool(
                "write",
                json!({"filePath": env.worktree(id).join(file), "content": "coloured\n"}),
            ),
            Turn::text(
                "Done.\n```taskbridge-result\n{\"summary\": \"Added it.\", \"tests_run\": []}\n```",
            ),
        ]);
    }
    let mock = MockAnthropic::spawn(turns);
    let env = env.with_mock(&mock);
    let server_env: serde_json::Map<String, serde_json::Value> =
        env.env_vars().into_iter().map(|(k, v)| (k, json!(v))).collect();
    let out = Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/test_elicit.py"))
        .env("TB_BIN", bin())
        .env("TB_SERVER_ENV", serde_json::Value::Object(server_env).to_string())
        .env("TB_REPO", &env.repo)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "test_elicit.py failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    // Each answer reached its agent in the same session.
    let reqs = mock.requests();
    assert!(reqs[1]["messages"].to_string().contains("Blue, please."));
    assert!(reqs[4]["messages"].to_string().contains("Green."));
    assert!(reqs[7]["messages"].to_string().contains("Red."));
}
