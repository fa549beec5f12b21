//! PostgreSQL going away under running workers, through the real binary: the server restarted
//! (`pg_ctl restart -m fast`) while two workers run tasks, and the change listener's connection
//! killed by the server (`pg_terminate_backend`). Its own test binary, since it restarts the
//! server every PostgreSQL test shares. The agent is a stand-in script.
#![allow(clippy::unwrap_used)]

mod support;

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

/// The two tests take turns: one restarts the server the other's connections are on.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn restart_server() {
    let dir = std::env::var("TASKBRIDGE_TEST_PG_DIR").unwrap_or_else(|_| {
        panic!("restarting needs the server's directory: TASKBRIDGE_TEST_PG_DIR (.ci/run sets it)")
    });
    let ci = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/pg");
    let out = Command::new(ci).args(["restart", &dir]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn worker(env: &Env, agent: &Path) -> Child {
    Child(
        env.cmd()
            .args(["worker", "--concurrency", "2"])
            .env("TASKBRIDGE_OPENCODE", agent)
            .env("TASKBRIDGE_OPENCODE_MODE", "run")
            .env("TASKBRIDGE_LEASE_S", "5")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// A stand-in agent that appends its task's branch to `runs.txt` (so a task run twice shows
/// twice), leaves a file and sleeps `secs`; and that file.
fn recording_agent(env: &Env, secs: f64) -> (std::path::PathBuf, std::path::PathBuf) {
    let runs = env.dir.path().join("runs.txt");
    let agent = script(
        env.dir.path(),
        "agent",
        &format!(
            "cat > /dev/null\ngit symbolic-ref --short HEAD >> '{}'\necho done > agent-was-here.txt\nsleep {secs}\n",
            runs.display()
        ),
    );
    (agent, runs)
}

/// Every task ran, and none more often than its attempts: a run is repeated only by a new
/// attempt (a lease that lapsed, a killed worker), never twice at once or completed twice.
fn each_ran_once_per_attempt(env: &Env, runs: &Path, ids: &[i64]) {
    let runs = std::fs::read_to_string(runs).unwrap();
    for &id in ids {
        let t = env.show(id);
        let n = runs.lines().filter(|l| *l == format!("taskbridge/task-{id}")).count();
        assert!(
            n >= 1 && n as i64 <= t["attempts"].as_i64().unwrap(),
            "task {id} ran {n} times: {t:#}"
        );
    }
}

/// How many tasks are in `status`.
fn count(env: &Env, status: &str) -> u64 {
    let st: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    st["counts"][status].as_u64().unwrap_or(0)
}

#[test]
fn workers_ride_out_a_server_restart_and_every_task_ends_done_once() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let env = Env::new().on_postgres();
    let (agent, runs) = recording_agent(&env, 0.3);
    let ids: Vec<i64> = (0..16).map(|i| env.submit(&[&format!("task {i}")])).collect();
    // The other world's worker runs this world's stand-in, which records in this world's
    // directory: its wall lets it.
    let mut other = env.sharing_queue();
    other.scratch_writable = false;
    let both = std::env::join_paths([env.dir.path(), other.dir.path()]).unwrap();
    let both = both.to_string_lossy().into_owned();
    other.extra_env.push(("TASKBRIDGE_SANDBOX_WRITABLE".into(), both));
    let _w1 = worker(&env, &agent);
    let _w2 = worker(&other, &agent);
    // Restart while tasks are claimed, running and finishing: once the first agents run, and
    // again once the first tasks are done.
    for status in ["running", "done"] {
        assert!(eventually(Duration::from_secs(60), || count(&env, status) > 0), "no {status}");
        restart_server();
    }
    for &id in &ids {
        let t = env.wait_task(id, Duration::from_secs(120), |t| {
            t["status"] == "done" || t["status"] == "failed"
        });
        assert_eq!(t["status"], "done", "task {id}: {t:#}");
    }
    each_ran_once_per_attempt(&env, &runs, &ids);
    let st: serde_json::Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    assert_eq!(st["counts"]["done"], ids.len());
    assert_eq!(st["workers_alive"], 2, "both workers are still alive");
    // The restarts really hit them: the workers' logs say they waited for the server.
    let logs: String = [&env, &other]
        .iter()
        .flat_map(|e| std::fs::read_dir(e.home.join("logs")).unwrap().flatten())
        .map(|f| std::fs::read_to_string(f.path()).unwrap_or_default())
        .collect();
    assert!(logs.contains("the database is unavailable; trying again"), "no outage was seen");
}

#[test]
fn a_killed_listener_connection_reconnects_and_pickup_still_happens() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let env = Env::new().on_postgres();
    let agent = script(env.dir.path(), "agent", "cat > /dev/null\necho hi > agent-was-here.txt\n");
    let _w = worker(&env, &agent);
    let first = env.submit(&["before"]);
    env.wait_status(first, "done", Duration::from_secs(30));
    let schema = env.db.as_deref().unwrap().split("schema=").nth(1).unwrap().to_owned();
    let mut admin = postgres::Client::connect(&pg_server(), postgres::NoTls).unwrap();
    let listeners = |admin: &mut postgres::Client| -> Vec<i32> {
        admin
            .query(
                "SELECT pid FROM pg_stat_activity WHERE query = $1",
                &[&format!("LISTEN \"taskbridge_{schema}\"")],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    let before = listeners(&mut admin);
    assert_eq!(before.len(), 1, "the worker listens on its schema's channel");
    admin.execute("SELECT pg_terminate_backend($1)", &[&before[0]]).unwrap();
    // It comes back on a new connection.
    assert!(eventually(Duration::from_secs(15), || {
        let now = listeners(&mut admin);
        now.len() == 1 && now[0] != before[0]
    }));
    let second = env.submit(&["after"]);
    env.wait_status(second, "done", Duration::from_secs(30));
}

/// Chaos on PostgreSQL through the real binary: 40 tasks, three workers on one host, four of
/// them SIGKILLed one after another and the server restarted in the middle. Every task must be
/// done within a bound after the last fault: a task left queued while the workers idle (a retry
/// delay grown out of proportion, a claim rule that leaves it to nobody, a lost wake-up) fails
/// this.
#[test]
fn after_kills_and_a_server_restart_every_task_is_done_soon_after_the_last_fault() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let env = Env::new().on_postgres();
    let (agent, runs) = recording_agent(&env, 0.5);
    // Kills use attempts (a task that crashes its worker must not loop for ever); this test is
    // about every task getting run, so each has attempts to spare.
    let ids: Vec<i64> =
        (0..40).map(|i| env.submit(&[&format!("task {i}"), "--max-attempts", "10"])).collect();
    let mut workers: Vec<Child> = (0..3).map(|_| worker(&env, &agent)).collect();
    assert!(eventually(Duration::from_secs(60), || count(&env, "running") > 0), "none started");
    for kill in 0..4 {
        // Each victim is killed while it runs tasks, mid-agent.
        let victim = kill % workers.len();
        std::thread::sleep(Duration::from_millis(700));
        let _ = workers[victim].0.kill();
        let _ = workers[victim].0.wait();
        workers[victim] = worker(&env, &agent);
        if kill == 1 {
            restart_server();
        }
    }
    // The last fault was the fourth kill. Recovery needs a dead peer noticed (about a second), a
    // lease to lapse (5 s here) and the remaining tasks' runs: 90 s is far beyond all of it.
    let last_fault = std::time::Instant::now();
    let all_done = eventually(Duration::from_secs(90), || count(&env, "done") == ids.len() as u64);
    eprintln!("every task was done {:?} after the last fault", last_fault.elapsed());
    if !all_done {
        let left: Vec<Value> =
            ids.iter().map(|&id| env.show(id)).filter(|t| t["status"] != "done").collect();
        let logs: Vec<String> = left
            .iter()
            .map(|t| {
                String::from_utf8_lossy(&env.run(&["get-logs", &t["id"].to_string()]).stdout)
                    .into_owned()
            })
            .collect();
        let admin = std::process::Command::new("sh")
            .arg("-c")
            .arg("for f in .git/worktrees/*/*; do echo \"$f: $(head -c 200 $f 2>/dev/null)\"; done")
            .current_dir(&env.repo)
            .output()
            .unwrap();
        panic!(
            "not every task was done {:?} after the last fault: {left:#?}\n{}\n{}",
            last_fault.elapsed(),
            logs.join("\n---\n"),
            String::from_utf8_lossy(&admin.stdout)
        );
    }
    each_ran_once_per_attempt(&env, &runs, &ids);
}
