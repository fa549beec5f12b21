//! End to end: the kernel's wall around the agent. The real binary runs each agent (OpenCode's
//! warm server, Claude Code, Codex; each against its loopback mock) on a repository that
//! commits a probe script and a symbolic link out of it; the model's scripted command runs the
//! probe, which tries what a misbehaving agent would (a redirection outside the worktree, a
//! write through the link, reading the queue's database, a connection to the test's own
//! listener under `--no-network`, a write in a `--readonly` worktree) and says per attempt
//! whether it got through. The test checks what the model was told, what is on disk after, and
//! what the result says enforced each rule.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::{MockAnthropic, Turn};
use crate::support::mock_openai::{MockOpenAi, Reply};
use crate::support::*;
use serde_json::{Value, json};
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Duration;

const RUN: Duration = Duration::from_secs(180);

fn result_block(summary: &str, tests: &[&str]) -> String {
    format!(
        "Done.\n\n```taskbridge-result\n{}\n```",
        json!({"summary": summary, "tests_run": tests, "open_questions": []})
    )
}

/// A repository with the probe and `esc -> <outside>`, a directory outside it, and a loopback
/// listener nobody may reach.
struct Probe {
    outside: PathBuf,
    listener: TcpListener,
}

impl Probe {
    fn commit(env: &mut Env) -> Probe {
        // A kernel without what the wall needs fails here, saying so, never skips.
        let kernel = worker::sandbox::Kernel::probe();
        assert!(
            kernel.walls() && kernel.tcp_rules(),
            "these tests need Landlock with TCP rules (Linux 6.7+, ABI 4): {}",
            kernel.describe()
        );
        // The world's scratch directory is where `outside` is: nothing there is the agent's.
        env.scratch_writable = false;
        let outside = env.dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let db = env.home.join("taskbridge.db");
        let script = format!(
            r#"#!/bin/bash
try() {{ if eval "$2" >/dev/null 2>&1; then echo "$1=through"; else echo "$1=denied"; fi; }}
try redirect "echo x > {out}/redirected"
try symlink "echo x > esc/through-the-link"
try database "cat {db}"
try agent_config "echo x > {config}/opencode/agent-wrote"
if [ "$1" = net ]; then
  try loopback "bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}'"
  try elsewhere "timeout 5 bash -c 'exec 3<>/dev/tcp/10.255.255.1/80'"
fi
try inside "echo greeting > hello.txt"
"#,
            out = outside.display(),
            db = db.display(),
            config = env.oc_home.join(".config").display(),
        );
        std::fs::create_dir_all(env.oc_home.join(".config/opencode")).unwrap();
        std::fs::write(env.repo.join("probe.sh"), script).unwrap();
        std::os::unix::fs::symlink(&outside, env.repo.join("esc")).unwrap();
        git(&env.repo, &["add", "."]);
        git(&env.repo, &["commit", "-qm", "probe"]);
        Probe { outside, listener }
    }

    /// Nothing was written outside and nobody connected.
    fn nothing_got_out(&self) {
        let left: Vec<_> = std::fs::read_dir(&self.outside).unwrap().flatten().collect();
        assert!(left.is_empty(), "written outside the worktree: {left:?}");
        assert!(self.listener.accept().is_err(), "the agent's command reached the listener");
    }
}

fn finished(env: &Env, id: i64) -> Value {
    env.wait_task(id, RUN, |t| {
        ["done", "failed", "waiting"].contains(&t["status"].as_str().unwrap())
    })
}

/// What each attempt of the probe reported, from everything the model was sent.
fn said(requests: &[Value], attempt: &str) -> &'static str {
    let text = serde_json::to_string(requests).unwrap();
    match (
        text.contains(&format!("{attempt}=denied")),
        text.contains(&format!("{attempt}=through")),
    ) {
        (true, false) => "denied",
        (false, true) => "through",
        (false, false) => "never tried",
        (true, true) => "both",
    }
}

fn permission<'a>(t: &'a Value, flag: &str) -> &'a Value {
    let ps = t["result"]["permissions"].as_array().unwrap();
    ps.iter().find(|p| p["flag"] == flag).unwrap_or_else(|| panic!("no {flag} in {ps:#?}"))
}

/// What the probe said in the last request the model was sent for it.
fn said_last(requests: &[Value], attempt: &str) -> &'static str {
    let text = serde_json::to_string(requests).unwrap();
    let Some(at) = text.rfind(&format!("{attempt}=")) else { return "never tried" };
    match text[at..].starts_with(&format!("{attempt}=denied")) {
        true => "denied",
        false => "through",
    }
}

/// The two tasks every agent gets: a plain one that tries to get out, edits and runs the
/// test, then a read-only one without network that tries all of that and to connect.
/// `requests` reads what the model was sent by then.
fn walls_hold(env: &Env, probe: &Probe, agent: &str, requests: &dyn Fn() -> Vec<Value>) {
    let plain = env.submit(&["Probe the wall", "--agent", agent]);
    let t = finished(env, plain);
    assert_eq!(t["status"], "done", "{t:#}\nlog:\n{}", env.log(plain));
    let sent = requests();
    for attempt in ["redirect", "symlink", "database", "agent_config"] {
        assert_eq!(said(&sent, attempt), "denied", "{agent}: {attempt}\nlog:\n{}", env.log(plain));
    }
    assert_eq!(said(&sent, "inside"), "through", "{agent}: the worktree stays writable");
    assert_eq!(files_touched(&t["result"]), vec![("hello.txt".into(), "added".into())]);
    let tests = &t["result"]["tests_run"];
    assert_eq!(tests, &json!([{"command": "sh test.sh", "exit_code": 0, "observed": true}]));
    let branch = format!("taskbridge/task-{plain}:hello.txt");
    assert_eq!(git_out(&env.repo, &["show", &branch]), "greeting");
    let sandbox = permission(&t, "sandbox");
    assert_eq!(
        (sandbox["enabled"].as_bool(), sandbox["enforcement"].as_str()),
        (Some(true), Some("kernel"))
    );
    assert!(sandbox["how"].as_str().unwrap().contains("Landlock ABI"), "{sandbox:#}");
    assert!(env.log(plain).contains("sandbox: Landlock ABI"), "{}", env.log(plain));

    let walled = env.submit(&["Probe the network", "--agent", agent, "--readonly", "--no-network"]);
    let t = finished(env, walled);
    // Done: the agent still reached its model through the worker's proxy, after the probe.
    assert_eq!(t["status"], "done", "{t:#}\nlog:\n{}", env.log(walled));
    let sent = requests();
    for attempt in
        ["redirect", "symlink", "database", "agent_config", "loopback", "elsewhere", "inside"]
    {
        let log = env.log(walled);
        assert_eq!(said_last(&sent, attempt), "denied", "{agent}: {attempt}\nlog:\n{log}");
    }
    for flag in ["readonly", "no_network"] {
        let p = permission(&t, flag);
        assert_eq!(p["enforcement"], "kernel", "{agent}: {p:#}");
    }
    assert_eq!(files_touched(&t["result"]), vec![], "{agent}: nothing changed");
    probe.nothing_got_out();
}

#[test]
fn opencodes_warm_server_and_its_commands_stay_inside_the_wall() {
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("bash probe.sh plain"),
        Turn::bash("sh test.sh"),
        Turn::text(result_block("Probed.", &["sh test.sh"])),
        Turn::bash("bash probe.sh net"),
        Turn::text(result_block("Probed the network.", &[])),
    ]);
    let mut env = Env::new().with_mock(&mock);
    let probe = Probe::commit(&mut env);
    // OpenCode made its data directory itself, readable by everyone (its transcripts).
    let data = env.oc_home.join(".local/share/opencode");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let _worker = env.start_worker_with(1, &["--opencode", "serve"]);
    walls_hold(&env, &probe, "opencode", &|| mock.requests());
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&data).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700, "OpenCode's transcripts are the user's alone");
    // What doctor says holds, on the same machine.
    let out = env.cmd().arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line =
        text.lines().find(|l| l.contains("sandbox (enforce)")).unwrap_or_else(|| panic!("{text}"));
    for part in ["Landlock ABI", "writes outside the worktree", "--no-network by address"] {
        assert!(line.contains(part), "{part}: {line}");
    }
}

#[test]
fn opencode_2_over_acp_and_its_commands_stay_inside_the_wall() {
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("bash probe.sh plain"),
        Turn::bash("sh test.sh"),
        Turn::text(result_block("Probed.", &["sh test.sh"])),
        Turn::bash("bash probe.sh net"),
        Turn::text(result_block("Probed the network.", &[])),
    ]);
    let mut env = Env::new().with_opencode2(&mock);
    let probe = Probe::commit(&mut env);
    let _worker = env.start_worker(1);
    walls_hold(&env, &probe, "opencode", &|| mock.requests());
}

#[test]
fn claude_code_and_its_commands_stay_inside_the_wall() {
    let bash = |c: &str| Turn::tool("Bash", json!({"command": c, "description": "probe"}));
    let mock = MockAnthropic::spawn(vec![
        bash("bash probe.sh plain"),
        bash("sh test.sh"),
        Turn::text(result_block("Probed.", &["sh test.sh"])),
        bash("bash probe.sh net"),
        Turn::text(result_block("Probed the network.", &[])),
    ]);
    let mut env = Env::new().with_claude(&mock);
    let probe = Probe::commit(&mut env);
    let _worker = env.start_worker(1);
    walls_hold(&env, &probe, "claude-code", &|| mock.requests());
}

#[test]
fn codex_and_its_commands_stay_inside_the_wall() {
    let mock = MockOpenAi::spawn(vec![
        Reply::Exec("bash probe.sh plain".into()),
        Reply::Exec("sh test.sh".into()),
        Reply::Text(result_block("Probed.", &["sh test.sh"])),
        Reply::Exec("bash probe.sh net".into()),
        Reply::Text(result_block("Probed the network.", &[])),
    ]);
    let mut env = Env::new().with_codex(&mock);
    let probe = Probe::commit(&mut env);
    let _worker = env.start_worker(1);
    walls_hold(&env, &probe, "codex", &|| mock.requests());
}

/// A registry that takes the connection and never answers: what OpenCode's background install
/// of `@opencode-ai/plugin` meets when the network is slow, or when npm inside the wall cannot
/// write its cache and retries (issue #55: 54–56 s before a new repository's first task).
fn silent_registry() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", l.local_addr().unwrap());
    let accept = l.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in accept.incoming().flatten() {
            held.push(c);
        }
    });
    (l, url)
}

#[test]
fn a_new_repositorys_first_task_does_not_wait_for_opencodes_plugin_install() {
    let mock = MockAnthropic::spawn(vec![
        Turn::text(result_block("First.", &[])),
        Turn::text(result_block("Second.", &[])),
    ]);
    let (_registry, url) = silent_registry();
    let mut env = Env::new().with_mock(&mock);
    env.extra_env.push(("NPM_CONFIG_REGISTRY".into(), url.clone()));
    env.extra_env.push(("npm_config_registry".into(), url));
    let _worker = env.start_worker_with(1, &["--opencode", "serve"]);
    // How soon is a benchmark's (docs/BENCHMARKS.md); before, the task never got there.
    let id = env.submit(&["Say done.", "--repo", env.repo.to_str().unwrap()]);
    env.wait_status(id, "done", RUN);
}
