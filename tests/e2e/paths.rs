//! User-facing paths through the real binary that no other test runs: dependencies through a
//! real worker (`--depends-on` on the CLI, `submit_batch` over MCP), `get-logs` and `--follow` on
//! a running task, `clear-finished --older-than`, the HTTP guard flags (`--allowed-host`,
//! `--token-file`, `--repo-root`), `--claude-bridge` on `serve`, and the model and worker tools
//! called over MCP. The agent is a stand-in script wherever the model's behaviour is not what is
//! tested.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::MockAnthropic;
use crate::support::*;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// An agent that notes when it started and ended (in the worktree and in a shared log), and
/// which files of other tasks it could see.
fn agent(dir: &Path, body: &str) -> PathBuf {
    let log = dir.join("runs.log");
    script(
        dir,
        "agent",
        &format!(
            "cat > /dev/null\n\
             t=$(basename \"$PWD\")\n\
             echo \"start $t $(date +%s%N)\" >> '{log}'\n\
             {body}\n\
             echo \"end $t $(date +%s%N)\" >> '{log}'\n",
            log = log.display()
        ),
    )
}

/// (start, end) in nanoseconds of each task's run, from the agent's log.
fn runs(dir: &Path) -> std::collections::HashMap<String, (u128, u128)> {
    let mut out = std::collections::HashMap::new();
    for line in std::fs::read_to_string(dir.join("runs.log")).unwrap_or_default().lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let e = out.entry(f[1].to_owned()).or_insert((0, 0));
        let t: u128 = f[2].parse().unwrap();
        if f[0] == "start" { e.0 = t } else { e.1 = t }
    }
    out
}

#[test]
fn a_dependent_task_runs_only_after_its_dependency_is_done() {
    let env = Env::new();
    let agent = agent(env.dir.path(), "sleep 0.5");
    let a = env.submit(&["first"]);
    let b = env.submit(&["second", "--depends-on", &a.to_string()]);
    let c = env.submit(&["independent"]);
    env.run_queue_with(&agent, &["--concurrency", "3"]);
    for id in [a, b, c] {
        assert_eq!(env.show(id)["status"], "done", "task {id}");
    }
    let r = runs(env.dir.path());
    let (ra, rb, rc) = (r[&format!("task-{a}")], r[&format!("task-{b}")], r[&format!("task-{c}")]);
    assert!(rb.0 > ra.1, "the dependent started after its dependency ended: {r:?}");
    assert!(rc.0 < ra.1, "the independent task ran alongside, not after: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_mcp_runs_in_dependency_order_and_its_failure_propagates() {
    let env = Env::new();
    let agent = agent(env.dir.path(), "case \"$t\" in task-2) exit 4;; esac\nsleep 0.2");
    let mut cmd = tokio::process::Command::new(bin());
    cmd.args(["mcp", "--concurrency", "3"])
        .envs(env.env_vars())
        .env("TASKBRIDGE_OPENCODE", &agent)
        .env("TASKBRIDGE_OPENCODE_MODE", "run")
        .current_dir(&env.repo);
    let (client, _child) = stdio_client(cmd).await;
    let call = |name: &'static str, args: Value| {
        let client = &client;
        async move {
            let req =
                CallToolRequestParams::new(name).with_arguments(args.as_object().cloned().unwrap());
            client.call_tool(req).await.unwrap().structured_content.unwrap()
        }
    };
    let batch = call(
        "submit_batch",
        json!({"tasks": [
            {"prompt": "base"},
            {"prompt": "fails", "max_attempts": 1},
            {"prompt": "after base", "depends_on": ["#0"]},
            {"prompt": "after the failure", "depends_on": ["#1"]},
        ]}),
    )
    .await;
    let ids: Vec<i64> =
        batch["tasks"].as_array().unwrap().iter().map(|t| t["task_id"].as_i64().unwrap()).collect();
    let mut all = Value::Null;
    for _ in 0..20 {
        all = call("wait_for", json!({"task_ids": ids, "mode": "all", "timeout_s": 30})).await;
        if all["timed_out"] == false {
            break;
        }
    }
    assert_eq!(all["done"], json!([ids[0], ids[2]]), "{all}");
    assert_eq!(all["failed"], json!([ids[1], ids[3]]), "{all}");
    let r = runs(env.dir.path());
    assert!(r[&format!("task-{}", ids[2])].0 > r[&format!("task-{}", ids[0])].1, "{r:?}");
    assert!(!r.contains_key(&format!("task-{}", ids[3])), "no agent ran after a failed dependency");
    let t = call("get_task", json!({"task_id": ids[3]})).await;
    assert!(t["error"].as_str().unwrap().contains(&ids[1].to_string()), "{t}");
}

#[test]
fn get_logs_and_follow_show_a_running_task_and_clear_finished_keeps_branches() {
    let env = Env::new();
    let agent = agent(
        env.dir.path(),
        "echo '{\"type\":\"text\",\"sessionID\":\"s\",\"part\":{\"type\":\"text\",\"text\":\"halfway there\"}}'\n\
         while [ ! -e go ]; do sleep 0.05; done\n\
         echo done > result.txt",
    );
    let id = env.submit(&["logged"]).to_string();
    let mut worker = env.cmd();
    worker
        .env("TASKBRIDGE_OPENCODE", &agent)
        .env("TASKBRIDGE_OPENCODE_MODE", "run")
        .args(["worker", "--concurrency", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _worker = Child(worker.spawn().unwrap());
    assert!(eventually(Duration::from_secs(30), || env
        .log(id.parse().unwrap())
        .contains("halfway")));
    assert_eq!(env.show(id.parse().unwrap())["status"], "running");
    // The log of a running task, under both spellings.
    for verb in ["get-logs", "logs"] {
        let text = env.ok(&[verb, &id]);
        assert!(text.contains("agent: halfway there"), "{verb}: {text}");
    }
    // --follow prints what is there, keeps going as the log grows, and ends with the task.
    let mut follow = env.cmd();
    follow.args(["get-logs", &id, "--follow"]).stdout(Stdio::piped());
    let mut follow = Child(follow.spawn().unwrap());
    let mut lines = BufReader::new(follow.0.stdout.take().unwrap()).lines();
    // What is already there comes first.
    assert!(
        lines.by_ref().map(Result::unwrap).any(|l| l.contains("agent: halfway there")),
        "--follow printed the log so far"
    );
    std::fs::write(env.worktree(id.parse().unwrap()).join("go"), "").unwrap();
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(rest.iter().any(|l| l.contains("task is done")), "followed to the end: {rest:?}");
    assert!(follow.0.wait().unwrap().success(), "--follow exits once the task is done");

    // clear-finished --older-than: too young first, then gone with its log; the branch stays.
    let out = env.ok(&["clear-finished", "--older-than", "1h"]);
    assert!(out.contains("cleared 0 task"), "{out}");
    std::thread::sleep(Duration::from_millis(1100));
    let out = env.ok(&["clear-finished", "--older-than", "1s"]);
    assert!(out.contains("cleared 1 task"), "{out}");
    assert!(!env.home.join(format!("logs/{id}.log")).exists(), "the log went with the task");
    assert!(!env.worktree(id.parse().unwrap()).exists());
    let branch = format!("taskbridge/task-{id}");
    assert_eq!(git_out(&env.repo, &["show", &format!("{branch}:result.txt")]), "done");
}

#[test]
fn the_http_guard_flags_do_what_they_say() {
    let env = Env::new();
    let token_file = env.dir.path().join("token");
    std::fs::write(&token_file, "file-token-0123456789abcdef0123456789\n").unwrap();
    // A token file other users can read is refused, saying the chmod to run.
    let refused = env.run(&["serve", "--no-worker", "--token-file", token_file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let other = env.dir.path().join("other-repo");
    repo_with_one_commit(&other);
    let root = env.repo.display().to_string();
    let (_server, p) = start_serve(
        &env,
        &[
            "--no-worker",
            "--token-file",
            token_file.to_str().unwrap(),
            "--allowed-host",
            "tb.example.test",
            "--repo-root",
            &root,
        ],
    );
    let host = format!("127.0.0.1:{p}");
    assert_eq!(
        post(p, &host, Some("file-token-0123456789abcdef0123456789")),
        200,
        "the file's token, trimmed"
    );
    assert_eq!(post(p, &host, None), 401);
    assert_eq!(
        post(p, "tb.example.test", Some("file-token-0123456789abcdef0123456789")),
        200,
        "--allowed-host"
    );
    assert_eq!(post(p, "other.example.test", Some("file-token-0123456789abcdef0123456789")), 403);
    // --repo-root: a real MCP client with the token; a repository elsewhere is refused.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = http_client(p, Some("file-token-0123456789abcdef0123456789")).await;
        let submit = |repo: String| {
            let client = &client;
            async move {
                let args = json!({"prompt": "x", "repo": repo});
                let req = CallToolRequestParams::new("submit_task")
                    .with_arguments(args.as_object().cloned().unwrap());
                client.call_tool(req).await.unwrap()
            }
        };
        let refused = submit(other.display().to_string()).await;
        assert_eq!(refused.is_error, Some(true));
        let text = refused.structured_content.unwrap().to_string();
        assert!(text.contains("outside the roots this server may run tasks in"), "{text}");
        let accepted = submit(root.clone()).await;
        assert_eq!(accepted.structured_content.unwrap()["task_id"], 1);
    });
}

/// rmcp's own Streamable HTTP client on a local server, with a bearer token if given.
async fn http_client(
    port: u16,
    token: Option<&str>,
) -> rmcp::service::RunningService<rmcp::service::RoleClient, ()> {
    use rmcp::ServiceExt;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    worker::install_tls();
    let mut cfg =
        StreamableHttpClientTransportConfig::with_uri(format!("http://127.0.0.1:{port}/mcp"));
    if let Some(t) = token {
        cfg = cfg.auth_header(t);
    }
    ().serve(rmcp::transport::StreamableHttpClientTransport::from_config(cfg)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_and_workers_over_mcp_and_the_bridge_offered_by_serve() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![]);
    let env = env.with_mock(&mock);
    let recorder = script(
        env.dir.path(),
        "recorder",
        &format!(
            "case \"$1\" in models) exec '{}' \"$@\";; esac\ncat > /dev/null\necho \"$OPENCODE_CONFIG_CONTENT\" > bridge.json\n",
            opencode().display()
        ),
    );
    let (_server, port) = {
        let mut cmd = env.cmd();
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--claude-bridge", "--concurrency", "2"])
            .env("TASKBRIDGE_OPENCODE", &recorder)
            .env("TASKBRIDGE_OPENCODE_MODE", "run");
        let (c, p, _) = start_http(&mut cmd);
        (c, p)
    };
    let client = http_client(port, Some(&env.token())).await;
    let call = |name: &'static str, args: Value| {
        let client = &client;
        async move {
            let req =
                CallToolRequestParams::new(name).with_arguments(args.as_object().cloned().unwrap());
            client.call_tool(req).await.unwrap()
        }
    };
    let models = call("list_models", json!({"provider": "anthropic"})).await;
    let models = models.structured_content.unwrap();
    let names: Vec<&str> =
        models["models"].as_array().unwrap().iter().map(|m| m.as_str().unwrap()).collect();
    assert!(
        names.contains(&MODEL) && names.iter().all(|m| m.starts_with("anthropic/")),
        "{names:?}"
    );
    let set = call("set_default_model", json!({"model": MODEL})).await;
    assert_eq!(set.structured_content.unwrap()["default_model"], MODEL);
    let bad = call("set_default_model", json!({"model": "anthropic/nope-9"})).await;
    assert_eq!(bad.is_error, Some(true));
    let st = call("queue_status", json!({})).await.structured_content.unwrap();
    assert_eq!(st["default_model"], MODEL);
    let workers = call("list_workers", json!({})).await.structured_content.unwrap();
    let live: Vec<&Value> = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["stopped"] == false && w["stale"] == false)
        .collect();
    assert_eq!(live.len(), 1, "{workers}");
    assert_eq!(live[0]["concurrency"], 2);
    assert_eq!(live[0]["pid"].as_u64(), Some(_server.pid() as u64));
    // --claude-bridge on serve: the run's OpenCode config carries the bridge.
    let t = call("submit_task", json!({"prompt": "x"})).await.structured_content.unwrap();
    let id = t["task_id"].as_i64().unwrap();
    env.wait_status(id, "done", Duration::from_secs(30));
    // The agent wrote it in its worktree, so it is on the task's branch.
    let written = git_out(&env.repo, &["show", &format!("taskbridge/task-{id}:bridge.json")]);
    let cfg: Value = serde_json::from_str(&written).unwrap();
    assert!(cfg["mcp"]["taskbridge"]["command"].to_string().contains("claude-mcp"), "{cfg}");
}
