//! A queue shared by several hosts, end to end through the real binary: PostgreSQL as the queue,
//! a bare repository served over the network on loopback (`git daemon`) as the remote, and
//! workers with separate homes, one of which runs from its mirror of the remote
//! (`--use-remote`), as a worker on another host does. Also `taskbridge migrate`, and the
//! database password kept out of what TaskBridge prints and logs. The agent is a stand-in
//! script: what is tested is the queue and git across hosts, not the model.
#![allow(clippy::unwrap_used)]

use crate::support::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// An agent that writes which worktree it ran in, then takes a moment.
fn stand_in_agent(dir: &Path) -> PathBuf {
    script(dir, "agent", "cat > /dev/null\nbasename \"$PWD\" > agent-was-here.txt\nsleep 0.2\n")
}

/// A worker; `host` names the host it goes by in the queue (TASKBRIDGE_HOST), so that one
/// machine can play several. Leases are short, so that a dead host's task moves on quickly.
fn worker_on(env: &Env, host: &str, agent: &Path, extra: &[&str]) -> Child {
    let mut cmd = env.cmd();
    if !host.is_empty() {
        cmd.env("TASKBRIDGE_HOST", host);
    }
    Child(
        cmd.args(["worker", "--concurrency", "2"])
            .args(extra)
            .env("TASKBRIDGE_OPENCODE", agent)
            .env("TASKBRIDGE_OPENCODE_MODE", "run")
            .env("TASKBRIDGE_LEASE_S", "2")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// A bare repository served read-write by `git daemon` on a free loopback port.
struct GitDaemon {
    _proc: Child,
    url: String,
    bare: PathBuf,
}

fn git_daemon(dir: &Path) -> GitDaemon {
    let base = dir.join("served");
    std::fs::create_dir_all(&base).unwrap();
    let bare = base.join("app.git");
    git(&base, &["init", "-q", "--bare", "-b", "main", "app.git"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let proc = Command::new("git")
        .args(["daemon", "--export-all", "--enable=receive-pack", "--reuseaddr"])
        .arg(format!("--base-path={}", base.display()))
        .args(["--listen=127.0.0.1", &format!("--port={port}")])
        .arg(&base)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("git://127.0.0.1:{port}/app.git");
    assert!(
        eventually(Duration::from_secs(10), || {
            Command::new("git").args(["ls-remote", &url]).output().is_ok_and(|o| o.status.success())
        }),
        "git daemon did not come up"
    );
    GitDaemon { _proc: Child(proc), url, bare }
}

#[test]
fn two_hosts_share_a_postgres_queue_and_the_remote_workers_branch_arrives_on_the_remote() {
    let here = Env::new().on_postgres();
    let daemon = git_daemon(here.dir.path());
    git(&here.repo, &["remote", "add", "origin", &daemon.url]);
    git(&here.repo, &["push", "-q", "origin", "main"]);
    // A commit that is on no branch of the remote: submit must push it for the other host.
    std::fs::write(here.repo.join("local.txt"), "only here\n").unwrap();
    git(&here.repo, &["add", "."]);
    git(&here.repo, &["commit", "-qm", "not pushed"]);
    let base = git_out(&here.repo, &["rev-parse", "HEAD"]);

    let out = here.run(&["submit", "first", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("refs/taskbridge/base/{base}")), "{stderr}");
    let on_remote = git_out(&daemon.bare, &["rev-parse", &format!("refs/taskbridge/base/{base}")]);
    assert_eq!(on_remote, base);
    let first: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(first["remote"], daemon.url.as_str(), "the default remote is origin");
    let mut ids = vec![first["id"].as_i64().unwrap()];
    ids.extend((1..6).map(|i| here.submit(&[&format!("task {i}")])));

    // Two workers, separate homes: one here, one that runs from its mirror of the remote.
    let elsewhere = here.sharing_queue();
    let agent_here = stand_in_agent(here.dir.path());
    let agent_there = stand_in_agent(elsewhere.dir.path());
    let _w1 = worker_on(&here, "", &agent_here, &[]);
    let _w2 = worker_on(&elsewhere, "host-b", &agent_there, &["--use-remote"]);

    let mut by_mirror = Vec::new();
    for &id in &ids {
        let t = here.wait_task(id, Duration::from_secs(90), |t| {
            t["status"] == "done" || t["status"] == "failed"
        });
        assert_eq!(t["status"], "done", "task {id}: {t:#}");
        let result = &t["result"];
        if result["pushed_to"].is_string() {
            by_mirror.push((id, result["commit"].as_str().unwrap().to_owned()));
        }
    }
    assert!(!by_mirror.is_empty(), "the --use-remote worker ran none of the tasks");
    assert!(by_mirror.len() < ids.len(), "the local worker ran none of the tasks");
    for (id, commit) in &by_mirror {
        // The agent's commit is on the remote, on the task's branch, on top of the base.
        let branch = format!("refs/heads/taskbridge/task-{id}");
        assert_eq!(&git_out(&daemon.bare, &["rev-parse", &branch]), commit);
        let file = git_out(&daemon.bare, &["show", &format!("{commit}:agent-was-here.txt")]);
        assert_eq!(file, format!("task-{id}"));
        assert_eq!(git_out(&daemon.bare, &["rev-parse", &format!("{commit}^")]), base);
    }
    // Both workers show their hosts; the mirror lives under the remote worker's home.
    let workers = here.ok(&["list-workers", "--json"]);
    let workers: serde_json::Value = serde_json::from_str(&workers).unwrap();
    let hosts: std::collections::BTreeSet<&str> =
        workers.as_array().unwrap().iter().map(|w| w["host"].as_str().unwrap()).collect();
    assert_eq!(hosts.len(), 2, "{workers:#}");
    assert!(hosts.contains("host-b"));
    let status = here.ok(&["status"]);
    assert!(status.contains("workers alive: 2 (on ") && status.contains("host-b"), "{status}");
    assert!(std::fs::read_dir(elsewhere.home.join("mirrors")).unwrap().count() > 0);
    // Its log stayed on host-b; here, `logs` says where it is.
    let (remote_id, _) = &by_mirror[0];
    assert_eq!(here.show(*remote_id)["worker_host"], "host-b");
    let out = here.run(&["logs", &remote_id.to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the log is on host host-b"), "{err}");
    assert!(elsewhere.log(*remote_id).contains("pushed taskbridge/task-"));
    // Over MCP too: the result says which host ran it, where the branch went, and where the
    // log is.
    let r = python_mcp_call(&here, "get_task_result", serde_json::json!({"task_id": remote_id}));
    assert_eq!(r["host"], "host-b");
    assert_eq!(r["pushed_to"], format!("{} taskbridge/task-{remote_id}", daemon.url));
    let l = python_mcp_call(&here, "get_task_logs", serde_json::json!({"task_id": remote_id}));
    assert!(l["where"].as_str().unwrap().contains("on host host-b"), "{l:#}");

    // The submitter merges a task the other worker ran: its branch is fetched from the remote.
    let (id, commit) = &by_mirror[0];
    here.ok(&["merge", &id.to_string()]);
    let merged_log = git_out(&here.repo, &["log", "--format=%H", "main"]);
    assert!(merged_log.lines().any(|l| l == commit), "main has the remote task's commit");
}

#[test]
fn a_base_that_cannot_be_published_refuses_the_submit_and_stores_nothing() {
    let env = Env::new().on_postgres();
    // A remote nobody serves: the base cannot be checked or pushed.
    git(&env.repo, &["remote", "add", "origin", "git://127.0.0.1:9/nothing.git"]);
    let out = env.run(&["submit", "needs a reachable base"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("git://127.0.0.1:9/nothing.git") && err.contains("--remote"), "{err}");
    let list = env.ok(&["list", "--json"]);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&list).unwrap(), serde_json::json!([]));
}

#[test]
fn migrate_copies_a_sqlite_queue_into_postgres_and_ids_go_on_from_there() {
    let env = Env::new();
    let a = env.submit(&["first", "--priority", "5"]);
    let b = env.submit(&["second", "--depends-on", &a.to_string()]);
    env.ok(&["note", &b.to_string(), "mind the tests"]);
    env.ok(&["cancel", &a.to_string()]);
    let before = env.ok(&["list", "--json"]);
    let target = pg_schema_url();
    let sqlite = env.home.join("taskbridge.db");
    let out =
        env.ok(&["migrate", "--from", &format!("sqlite:{}", sqlite.display()), "--to", &target]);
    assert!(out.contains("tasks 2") && out.contains("task_deps 1"), "{out}");
    let on_pg = Env::new().with_db(&target);
    let after = on_pg.ok(&["list", "--json"]);
    let strip = |v: &str| -> serde_json::Value {
        let mut v: serde_json::Value = serde_json::from_str(v).unwrap();
        for t in v.as_array_mut().unwrap() {
            t.as_object_mut().unwrap().remove("worker_host");
        }
        v
    };
    assert_eq!(strip(&before), strip(&after), "every task as it was, ids included");
    let shown = on_pg.show(b);
    assert_eq!(shown["notes"][0]["note"], "mind the tests");
    assert_eq!(shown["status"], "failed", "it failed with its dependency");
    let c = on_pg.submit(&["third"]);
    assert_eq!(c, b + 1, "new ids go on after the copied ones");
    // A second migrate into the same (now full) queue is refused.
    let again =
        env.run(&["migrate", "--from", &format!("sqlite:{}", sqlite.display()), "--to", &target]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("empty queue"));
    drop(on_pg);
    let mut c = postgres::Client::connect(&pg_server(), postgres::NoTls).unwrap();
    let schema = target.split("schema=").nth(1).unwrap();
    c.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE")).unwrap();
}

#[test]
fn the_database_password_is_never_printed_or_logged() {
    // The test server trusts every local login, so any password connects: what matters here is
    // where the URL's password ends up.
    let server = pg_server();
    let with_password = server.replacen("taskbridge@", "taskbridge:hunter2-secret@", 1);
    assert_ne!(with_password, server, "the test server URL names its user: {server}");
    let env = Env::new().with_db(&format!("{with_password}?schema=e2e_pw_{}", std::process::id()));
    env.submit(&["anything"]);
    let status = env.ok(&["status"]);
    assert!(status.contains("taskbridge:***@"), "{status}");
    let json = env.ok(&["status", "--json"]);
    let doctor = env.run(&["doctor"]);
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(said.contains("PostgreSQL ") && said.contains("woken by LISTEN/NOTIFY"), "{said}");
    let mut seen = format!("{status}{json}{}", String::from_utf8_lossy(&doctor.stdout));
    seen.push_str(&String::from_utf8_lossy(&doctor.stderr));
    // A worker that fails to reach a bad host logs the URL in its errors.
    let bad = Env::new().with_db("postgres://taskbridge:hunter2-secret@127.0.0.1:1/postgres");
    let out = bad.run(&["status"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert!(
        err.contains("taskbridge:***@127.0.0.1:1") && err.contains("check that the server runs"),
        "{err}"
    );
    seen.push_str(&err);
    for entry in std::fs::read_dir(env.home.join("logs")).unwrap().flatten() {
        seen.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
    }
    assert!(!seen.contains("hunter2"), "the password leaked:\n{seen}");
    let mut c = postgres::Client::connect(&server, postgres::NoTls).unwrap();
    c.batch_execute(&format!("DROP SCHEMA IF EXISTS e2e_pw_{} CASCADE", std::process::id()))
        .unwrap();
}

#[test]
fn a_push_the_remote_refuses_is_a_failed_attempt_never_a_done_task() {
    let env = Env::new().on_postgres();
    // A second daemon serves the same repository read-only: fetches work, pushes are refused.
    // The base is put there through the file system.
    let daemon = git_daemon(env.dir.path());
    git(&env.repo, &["push", "-q", daemon.bare.to_str().unwrap(), "main"]);
    let base = env.dir.path().join("served");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _ro = Child(
        Command::new("git")
            .args(["daemon", "--export-all", "--reuseaddr", "--listen=127.0.0.1"])
            .arg(format!("--base-path={}", base.display()))
            .arg(format!("--port={port}"))
            .arg(&base)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("git://127.0.0.1:{port}/app.git");
    assert!(eventually(Duration::from_secs(10), || {
        Command::new("git").args(["ls-remote", &url]).output().is_ok_and(|o| o.status.success())
    }));
    let id = env.submit(&["change something", "--remote", &url, "--max-attempts", "2"]);
    let agent = stand_in_agent(env.dir.path());
    let _w = worker_on(&env, "", &agent, &["--use-remote"]);
    let t = env.wait_task(id, Duration::from_secs(60), |t| t["status"] == "failed");
    assert_eq!(t["attempts"], 2, "each refused push used an attempt: {t:#}");
    let error = t["error"].as_str().unwrap();
    assert!(error.contains("could not be pushed") && error.contains(&url), "{error}");
    assert!(
        Command::new("git")
            .args(["-C", daemon.bare.to_str().unwrap(), "rev-parse", "--verify", "-q"])
            .arg(format!("refs/heads/taskbridge/task-{id}"))
            .output()
            .unwrap()
            .stdout
            .is_empty(),
        "nothing reached the remote"
    );
}

#[test]
fn a_host_that_dies_loses_only_its_leases_and_cleans_its_orphans_when_it_returns() {
    let env = Env::new().on_postgres();
    let daemon = git_daemon(env.dir.path());
    git(&env.repo, &["remote", "add", "origin", &daemon.url]);
    git(&env.repo, &["push", "-q", "origin", "main"]);
    let id = env.submit(&["outlive your worker"]);
    // On host-b the agent hangs (recording its process group); on host-a it finishes.
    let there = env.sharing_queue();
    let pgid_file = there.dir.path().join("pgid.txt");
    let hang = script(
        there.dir.path(),
        "agent",
        &format!(
            "cat > /dev/null\nps -o pgid= $$ | tr -d ' ' > '{}'\nsleep 300\n",
            pgid_file.display()
        ),
    );
    let mut b = worker_on(&there, "host-b", &hang, &["--use-remote"]);
    assert!(eventually(Duration::from_secs(30), || std::fs::read_to_string(&pgid_file)
        .is_ok_and(|s| !s.trim().is_empty())));
    let pgid: i32 = std::fs::read_to_string(&pgid_file).unwrap().trim().parse().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(b.pid() as i32), nix::sys::signal::SIGKILL)
        .unwrap();
    let _ = b.0.wait();
    // host-a takes the task over once the lease lapses, and leaves host-b's process alone.
    let agent = stand_in_agent(env.dir.path());
    let _a = worker_on(&env, "host-a", &agent, &["--use-remote"]);
    let t = env.wait_status(id, "done", Duration::from_secs(60));
    assert_eq!(t["worker_host"], "host-a");
    assert_eq!(t["attempts"], 2);
    assert!(group_alive(pgid), "a worker on host-a must not kill what runs on host-b");
    // host-b comes back: its first look finds the orphan and kills it.
    let _b = worker_on(&there, "host-b", &hang, &["--use-remote"]);
    assert!(eventually(Duration::from_secs(15), || !group_alive(pgid)), "the orphan lives on");
}

#[test]
fn a_followup_of_work_done_here_is_made_fetchable_for_other_hosts() {
    let env = Env::new().on_postgres();
    let daemon = git_daemon(env.dir.path());
    git(&env.repo, &["remote", "add", "origin", &daemon.url]);
    git(&env.repo, &["push", "-q", "origin", "main"]);
    let id = env.submit(&["first"]);
    // A stand-in that reports a session, as OpenCode's event stream does.
    let agent = script(
        env.dir.path(),
        "agent",
        "cat > /dev/null\necho done > agent-was-here.txt\n\
         echo '{\"type\":\"text\",\"sessionID\":\"ses_here\",\"part\":{\"type\":\"text\",\"text\":\"ok\"}}'\n",
    );
    let w = worker_on(&env, "", &agent, &[]);
    let t = env.wait_status(id, "done", Duration::from_secs(60));
    drop(w);
    // Run in the repository here: its commit is on no ref of the remote yet.
    let commit = t["result"]["commit"].as_str().unwrap().to_owned();
    assert!(t["result"]["pushed_to"].is_null());
    let follow: i64 =
        env.ok(&["followup", &id.to_string(), "and the docs"]).trim().parse().unwrap();
    assert_eq!(env.show(follow)["base"], commit, "the follow-up starts from the first's commit");
    let on_remote =
        git_out(&daemon.bare, &["rev-parse", &format!("refs/taskbridge/base/{commit}")]);
    assert_eq!(on_remote, commit, "the follow-up's base was pushed for workers elsewhere");
}

/// `[worker] use_remote = true` in the config file, as `assets/config.default.toml` shows it,
/// does what `--use-remote` does.
#[test]
fn use_remote_in_the_config_file_runs_from_the_mirror() {
    let env = Env::new().on_postgres();
    let daemon = git_daemon(env.dir.path());
    git(&env.repo, &["remote", "add", "origin", &daemon.url]);
    git(&env.repo, &["push", "-q", "origin", "main"]);
    let config = env.dir.path().join("config.toml");
    std::fs::write(&config, "[worker]\nuse_remote = true\n").unwrap();
    let id = env.submit(&["from the mirror, by configuration"]);
    let agent = stand_in_agent(env.dir.path());
    let _w = worker_on(&env, "", &agent, &["--config", config.to_str().unwrap()]);
    let t = env.wait_status(id, "done", Duration::from_secs(60));
    assert_eq!(t["result"]["pushed_to"], format!("{} taskbridge/task-{id}", daemon.url));
    assert!(env.log(id).contains("--use-remote: running from the mirror"));
}

#[test]
fn a_change_from_another_process_wakes_wait_for_through_notify_alone() {
    // The poll is a minute (the longest there is): only NOTIFY can wake the server's wait_for
    // within its 40 s.
    let mut env = Env::new().on_postgres();
    let slow = format!("{}&poll_ms=60000", env.db.clone().unwrap());
    env.db = Some(slow);
    let id = env.submit(&["Wait for me"]);
    let (_server, p) = start_serve(&env, &["--no-worker"]);
    let token = env.token();
    let cancel = {
        let cmd = env.cmd();
        std::thread::spawn(move || {
            // Once the call is waiting (it reads the task first), another process changes it.
            std::thread::sleep(Duration::from_secs(2));
            let mut cmd = cmd;
            let out = cmd.args(["cancel", &id.to_string()]).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        })
    };
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "wait_for", "arguments": {"task_ids": [id], "timeout_s": 40}}});
    let asked = std::time::Instant::now();
    let resp = mcp_call(p, &token, &body.to_string());
    let waited = asked.elapsed();
    cancel.join().unwrap();
    // Not a speed check: at its deadline wait_for reads the task again and would report the
    // cancel too, so what shows the wake-up came (from NOTIFY, the only source) is that the call
    // ended well before it.
    assert!(waited < Duration::from_secs(30), "wait_for was not woken: {waited:?}");
    let answer = resp.lines().find_map(|l| l.strip_prefix("data: ").filter(|d| d.starts_with('{')));
    let answer: serde_json::Value = serde_json::from_str(answer.expect(&resp)).unwrap();
    let got = &answer["result"]["structuredContent"];
    assert_eq!(got["timed_out"], false, "the change was never seen: {got}");
    assert_eq!(got["cancelled"], serde_json::json!([id]), "{got}");
}
