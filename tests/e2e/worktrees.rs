//! Worktrees under pressure, through the real binary and real git: many tasks starting at once
//! on a repository that has no worktree yet, and workers killed (SIGKILL) while they are making
//! a task's worktree. Every task must end `done`, its branch holding its agent's work. The agent
//! is a stand-in script: what is tested is the worker's git, not the model.
#![allow(clippy::unwrap_used)]

use crate::support::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// An agent that writes which worktree it ran in, then takes a moment, as a real one would.
fn stand_in_agent(dir: &Path) -> PathBuf {
    script(dir, "agent", "cat > /dev/null\nbasename \"$PWD\" > agent-was-here.txt\nsleep 0.3\n")
}

fn worker(env: &Env, agent: &Path, concurrency: usize, pause_ms: u64) -> Child {
    Child(
        env.cmd()
            .args(["worker", "--concurrency", &concurrency.to_string()])
            .env("TASKBRIDGE_OPENCODE", agent)
            .env("TASKBRIDGE_OPENCODE_MODE", "run")
            .env("TASKBRIDGE_LEASE_S", "1")
            .env("TASKBRIDGE_FAULT_WORKTREE_PAUSE_MS", pause_ms.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

fn submit_many(env: &Env, n: usize) -> Vec<i64> {
    (0..n).map(|i| env.submit(&[&format!("task number {i}"), "--max-attempts", "10"])).collect()
}

/// Every task is done and its branch holds the file its agent wrote in its own worktree.
fn assert_all_done_on_their_branches(env: &Env, ids: &[i64], within: Duration) {
    for &id in ids {
        let t = env.wait_task(id, within, |t| {
            t["status"] == "done" || t["status"] == "failed" || t["status"] == "cancelled"
        });
        assert_eq!(t["status"], "done", "task {id}: {t:#}\nlog:\n{}", env.log(id));
        let branch = format!("taskbridge/task-{id}");
        let file = git_out(&env.repo, &["show", &format!("{branch}:agent-was-here.txt")]);
        assert_eq!(file, format!("task-{id}"), "task {id}'s branch holds its own work");
    }
}

#[test]
fn many_tasks_starting_at_once_on_a_fresh_repository_all_finish() {
    for round in 0..3 {
        let env = Env::new();
        let agent = stand_in_agent(env.dir.path());
        let ids = submit_many(&env, 8);
        let _w = worker(&env, &agent, 8, 0);
        assert_all_done_on_their_branches(&env, &ids, Duration::from_secs(60));
        for &id in &ids {
            assert_eq!(env.show(id)["attempts"], 1, "round {round}: task {id} needed a retry");
        }
    }
}

/// The pid in a worker id (`host:pid:n`).
fn worker_pid(t: &serde_json::Value) -> Option<u32> {
    t["worker"].as_str()?.split(':').nth(1)?.parse().ok()
}

#[test]
fn workers_killed_while_making_worktrees_leave_every_task_done() {
    let env = Env::new();
    // Enough files that a checkout takes a moment, so some kills land inside it.
    for d in 0..20 {
        let dir = env.repo.join(format!("pkg{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..40 {
            std::fs::write(dir.join(format!("f{f}.txt")), format!("{d} {f}\n").repeat(200))
                .unwrap();
        }
    }
    git(&env.repo, &["add", "."]);
    git(&env.repo, &["commit", "-qm", "many files"]);
    let agent = stand_in_agent(env.dir.path());
    let ids = submit_many(&env, 30);
    const PAUSE_MS: u64 = 400;
    let mut workers: Vec<Child> = (0..3).map(|_| worker(&env, &agent, 2, PAUSE_MS)).collect();

    // Kill the worker of a task whose log says it is making its worktree, at a random moment
    // in the pause or the checkout after it; start a replacement each time.
    let mut killed = BTreeSet::new();
    let start = Instant::now();
    while killed.len() < 5 {
        assert!(start.elapsed() < Duration::from_secs(120), "found only {} kills", killed.len());
        let preparing = ids.iter().copied().find(|&id| {
            !killed.contains(&id)
                && env.log(id).lines().last().is_some_and(|l| l.contains("preparing the worktree"))
        });
        let Some(id) = preparing else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        std::thread::sleep(Duration::from_millis(fastrand_ms(PAUSE_MS + 150)));
        let Some(pid) = worker_pid(&env.show(id)) else { continue };
        let Some(pos) = workers.iter().position(|w| w.pid() == pid) else { continue };
        let mut victim = workers.swap_remove(pos);
        victim.0.kill().unwrap();
        victim.0.wait().unwrap();
        killed.insert(id);
        workers.push(worker(&env, &agent, 2, PAUSE_MS));
    }
    assert_all_done_on_their_branches(&env, &ids, Duration::from_secs(180));
    let repairs: usize = ids.iter().map(|&id| env.log(id).matches("repaired:").count()).sum();
    eprintln!("{} kills inside worktree creation; {repairs} repairs logged", killed.len());
    let retried = ids.iter().filter(|&&id| env.show(id)["attempts"].as_i64() > Some(1)).count();
    assert!(retried >= 1, "a killed worker's tasks ran again");
    // Nothing was left half-made: every task's worktree was removed once its work was committed.
    let repo_dir = env.worktree(ids[0]).parent().unwrap().to_path_buf();
    let left: Vec<_> = std::fs::read_dir(repo_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.contains(".aside-"))
        .collect();
    assert!(left.is_empty(), "worktrees left behind: {left:?}");
    let registered = git_out(&env.repo, &["worktree", "list", "--porcelain"]);
    assert_eq!(registered.matches("worktree ").count(), 1, "only the main checkout: {registered}");
}

fn fastrand_ms(max: u64) -> u64 {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos()
            as u64;
    nanos % max.max(1)
}
