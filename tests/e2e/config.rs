//! The one configuration, as a user writes it: `~/.config/taskbridge/config.toml` read by the
//! real binary (worker settings, the notification webhook against a loopback HTTP server), and
//! `restart_worker` starting a worker configured as the server's own was.
#![allow(clippy::unwrap_used)]

use crate::support::*;
use rmcp::model::CallToolRequestParams;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An agent that records its arguments and the bridge config it was given, then ends: `ok`
/// succeeds, anything else fails.
fn recording_agent(dir: &Path) -> PathBuf {
    let log = dir.join("agent-calls.log");
    script(
        dir,
        "agent",
        &format!(
            "prompt=$(cat)\n\
             echo \"ARGS $(basename \"$PWD\") $*\" >> '{log}'\n\
             echo \"BRIDGE $(basename \"$PWD\") ${{OPENCODE_CONFIG_CONTENT:-none}}\" >> '{log}'\n\
             case \"$prompt\" in *fail-me*) exit 3;; esac\n",
            log = log.display()
        ),
    )
}

/// Writes the user's config file where TaskBridge looks for it (`$XDG_CONFIG_HOME/taskbridge`).
fn write_config(env: &Env, text: &str) {
    let dir = env.oc_home.join(".config/taskbridge");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.toml"), text).unwrap();
}

/// A loopback HTTP server recording each request body; `hang` keeps every connection open
/// without answering.
struct Hook {
    port: u16,
    bodies: Arc<Mutex<Vec<Value>>>,
}

fn hook(hang: bool) -> Hook {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
    let seen = bodies.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut len = 0;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; len];
                reader.read_exact(&mut body).unwrap();
                seen.lock().unwrap().push(serde_json::from_slice(&body).unwrap());
                if hang {
                    std::thread::sleep(Duration::from_secs(600));
                }
                let mut stream = stream;
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
            });
        }
    });
    Hook { port, bodies }
}

#[test]
fn the_config_file_sets_the_worker_and_a_webhook_hears_done_and_failed() {
    let env = Env::new();
    let agent = recording_agent(env.dir.path());
    let hook = hook(false);
    write_config(
        &env,
        &format!(
            "[worker]\nmodel = \"anthropic/from-the-config-file\"\nopencode = \"{}\"\n\n\
             [notify]\ndesktop = false\nwebhook = \"http://127.0.0.1:{}/taskbridge\"\n",
            agent.display(),
            hook.port
        ),
    );
    let done = env.submit(&["all good", "--title", "the good one"]);
    let failed = env.submit(&["fail-me please", "--max-attempts", "1"]);
    let mut worker = env.cmd();
    // The config file, not the test's own settings, must name the model and the agent.
    // A stand-in agent is a process per prompt: `run` mode.
    worker
        .env_remove("TASKBRIDGE_MODEL")
        .env_remove("TASKBRIDGE_OPENCODE")
        .env("TASKBRIDGE_OPENCODE_MODE", "run");
    assert!(worker.args(["worker", "--once"]).output().unwrap().status.success());
    assert_eq!(env.show(done)["status"], "done");
    assert_eq!(env.show(failed)["status"], "failed");
    let calls = std::fs::read_to_string(env.dir.path().join("agent-calls.log")).unwrap();
    assert!(calls.contains("-m anthropic/from-the-config-file"), "{calls}");

    assert!(eventually(Duration::from_secs(10), || hook.bodies.lock().unwrap().len() >= 2));
    let bodies = hook.bodies.lock().unwrap().clone();
    let of = |id: i64| bodies.iter().find(|b| b["task_id"] == id).cloned().unwrap();
    let d = of(done);
    assert_eq!((d["event"].as_str(), d["status"].as_str()), (Some("done"), Some("done")));
    assert_eq!(d["title"], "the good one");
    assert_eq!(d["repo"], env.repo.display().to_string());
    let f = of(failed);
    assert_eq!(f["event"], "failed");
    assert!(f["error"].as_str().unwrap().contains("status 3"), "{f}");
}

#[test]
fn a_webhook_that_hangs_never_holds_up_the_worker() {
    let env = Env::new();
    let agent = recording_agent(env.dir.path());
    let hook = hook(true);
    write_config(
        &env,
        &format!(
            "[notify]\ndesktop = false\nwebhook = \"http://127.0.0.1:{}/\"\nwebhook_timeout_s = 300\n",
            hook.port
        ),
    );
    let ids: Vec<i64> = (0..3).map(|i| env.submit(&[&format!("task {i}")])).collect();
    let mut worker = env.cmd();
    worker.env("TASKBRIDGE_OPENCODE", &agent).env("TASKBRIDGE_OPENCODE_MODE", "run");
    worker.args(["worker", "--once", "--concurrency", "1"]);
    let started = std::time::Instant::now();
    assert!(worker.output().unwrap().status.success());
    for id in ids {
        assert_eq!(env.show(id)["status"], "done");
    }
    // Each webhook waits up to 300 s for an answer that never comes; the worker did not.
    assert!(started.elapsed() < Duration::from_secs(120), "{:?}", started.elapsed());
    assert!(eventually(Duration::from_secs(10), || hook.bodies.lock().unwrap().len() == 3));
}

#[test]
fn a_bad_config_file_is_refused_with_the_file_and_the_key_named() {
    let env = Env::new();
    write_config(&env, "[worker]\nconcurrancy = 4\n");
    let out = env.run(&["queue-status"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("config.toml") && err.contains("concurrancy"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_worker_starts_a_worker_configured_like_the_servers_own() {
    let env = Env::new();
    let agent = recording_agent(env.dir.path());
    let mut cmd = tokio::process::Command::new(bin());
    cmd.args(["mcp", "--concurrency", "3", "--claude-bridge"])
        .envs(env.env_vars())
        .env("TASKBRIDGE_OPENCODE", &agent)
        .env("TASKBRIDGE_OPENCODE_MODE", "run")
        .current_dir(&env.repo);
    let (client, _child) = stdio_client(cmd).await;
    let call = |name: &'static str| {
        let client = &client;
        async move {
            let r = client.call_tool(CallToolRequestParams::new(name)).await.unwrap();
            r.structured_content.unwrap()
        }
    };
    let mut first = Value::Null;
    for _ in 0..200 {
        first = call("list_workers").await["workers"][0].clone();
        if !first.is_null() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(first["concurrency"], 3);
    // The embedded worker is gone as far as the database knows (as after a crash of its
    // thread); restart_worker must bring back the same worker, not a default one.
    let store = queue::Store::open(env.home.join("taskbridge.db")).unwrap();
    store.worker_stopped(first["id"].as_str().unwrap()).unwrap();
    let r = call("restart_worker").await;
    let started = r["started_worker"].as_str().expect("a worker was started").to_owned();
    let mut new = None;
    for _ in 0..200 {
        let workers = call("list_workers").await;
        new = workers["workers"].as_array().unwrap().iter().find(|w| w["id"] == started).cloned();
        if new.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let new = new.expect("the restarted worker registered");
    assert_eq!(new["concurrency"], 3, "--concurrency survives the restart");
    // Tasks from another process, until the new worker has run one (the old one, marked
    // stopped but still in the process, may take some): it ran with the bridge and the model.
    for _ in 0..20 {
        let id = env.submit(&["after the restart"]);
        let t = env.wait_status(id, "done", Duration::from_secs(30));
        if t["worker"].as_str() != Some(started.as_str()) {
            continue;
        }
        let calls = std::fs::read_to_string(env.dir.path().join("agent-calls.log")).unwrap();
        let mine: Vec<&str> =
            calls.lines().filter(|l| l.contains(&format!("task-{id} "))).collect();
        assert!(mine.iter().any(|l| l.contains(&format!("-m {MODEL}"))), "{calls}");
        assert!(
            mine.iter().any(|l| l.starts_with("BRIDGE") && l.contains("claude-mcp")),
            "--claude-bridge survives the restart: {calls}"
        );
        return;
    }
    panic!("the restarted worker never ran a task");
}

#[test]
fn worker_settings_come_from_the_config_file_or_the_one_config_names() {
    let env = Env::new();
    write_config(&env, "[worker]\nconcurrency = 3\nopencode_mode = \"serve\"\n");
    let alive = |env: &Env| -> Value {
        let mut found = Value::Null;
        assert!(eventually(Duration::from_secs(20), || {
            let v: Value = serde_json::from_str(&env.ok(&["list-workers", "--json"])).unwrap();
            found = v
                .as_array()
                .unwrap()
                .iter()
                .find(|w| w["stopped"] == false)
                .cloned()
                .unwrap_or_default();
            !found.is_null()
        }));
        found
    };
    let mut w = env.start_worker_with(1, &[]);
    // --concurrency 1 from the command line beats the file's 3; the mode comes from the file.
    let first = alive(&env);
    assert_eq!(
        (first["concurrency"].as_i64(), first["agent"].as_str()),
        (Some(1), Some("opencode serve"))
    );
    w.terminate();
    // --config names another file, read instead of the default one.
    let other = env.dir.path().join("other.toml");
    std::fs::write(&other, "[worker]\nconcurrency = 4\nopencode_mode = \"run\"\n").unwrap();
    let mut cmd = env.cmd();
    cmd.args(["--config", other.to_str().unwrap(), "worker"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let _w = Child(cmd.spawn().unwrap());
    assert!(eventually(Duration::from_secs(20), || {
        let v: Value = serde_json::from_str(&env.ok(&["list-workers", "--json"])).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .any(|w| w["stopped"] == false && w["concurrency"] == 4 && w["agent"] == "opencode run")
    }));
}

/// A task that asks: the webhook hears `waiting` with the question, and with
/// `--question-timeout 1` nobody answering fails the task, saying so (and the webhook hears
/// that too).
#[test]
fn a_webhook_hears_a_question_and_an_unanswered_one_times_out() {
    let env = Env::new();
    let hook = hook(false);
    write_config(
        &env,
        &format!("[notify]\ndesktop = false\nwebhook = \"http://127.0.0.1:{}/\"\n", hook.port),
    );
    let agent = script(
        env.dir.path(),
        "agent",
        "cat > /dev/null\n\
         printf '%s\\n' '{\"type\":\"text\",\"sessionID\":\"ses_q\",\"part\":{\"type\":\"text\",\"text\":\"```taskbridge-question\\nRed or blue?\\n```\"}}'\n",
    );
    let id = env.submit(&["Ask me", "--question-timeout", "1"]);
    // A worker that stays: the question's deadline is kept by a live worker's sweep.
    let _worker = Child(
        env.cmd()
            .args(["worker", "--concurrency", "1"])
            .env("TASKBRIDGE_OPENCODE", &agent)
            .env("TASKBRIDGE_OPENCODE_MODE", "run")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t = env.wait_status(id, "failed", Duration::from_secs(60));
    assert_eq!(t["error"], "the question was not answered within 1 s", "{t:#}");
    assert_eq!(t["questions"][0]["question"], "Red or blue?");
    let events = || -> Vec<String> {
        let bodies = hook.bodies.lock().unwrap();
        bodies.iter().filter(|b| b["task_id"] == id).map(|b| b["event"].to_string()).collect()
    };
    assert!(eventually(Duration::from_secs(10), || events().len() >= 2), "{:?}", events());
    let bodies = hook.bodies.lock().unwrap().clone();
    let waiting = bodies.iter().find(|b| b["event"] == "waiting").unwrap();
    assert_eq!(waiting["question"], "Red or blue?", "{waiting}");
    assert_eq!(events(), [r#""waiting""#, r#""failed""#]);
}
