//! Chaos: several worker processes claim from one database while a driver SIGKILLs and SIGSTOPs
//! them at random. Every task must end exactly once, none may be lost, no two live leases on a
//! task may overlap, and completions from stale leases must be rejected.
//!
//! Short by default (CI); `TASKBRIDGE_CHAOS_TASKS=10000 cargo test -p taskbridge-queue --test chaos
//! -- --nocapture` is the long run.
#![allow(clippy::unwrap_used)]

mod support;
use support::{Backend, Db};

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use taskbridge_queue::{Location, Outcome, Store, TaskId, TaskSpec};

const LEASE: Duration = Duration::from_millis(400);

/// A worker process and the thread that reads its events; the thread ends when the process's
/// stdout closes (it exited or was killed).
fn spawn_worker(
    db: &str,
    tx: mpsc::Sender<String>,
    readers: &mut Vec<std::thread::JoinHandle<()>>,
) -> Child {
    let mut child =
        support::child(db).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let out = child.stdout.take().unwrap();
    readers.push(std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            // The harness prints "test <name> ... " before the first line.
            if let Some(i) = line.find("EV ") {
                let _ = tx.send(line[i + 3..].to_owned());
            }
        }
    }));
    child
}

/// The worker, a child process of the chaos test: claim, "work" for a few ms while
/// heartbeating, finish. Prints every event.
fn worker_process(db: &str) {
    let store = Store::connect(&Location::parse(db).unwrap()).unwrap();
    let me = format!("w{}", std::process::id());
    loop {
        let Some(c) = store.claim_next(&me, "host", LEASE).unwrap() else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        let id = c.task.id.0;
        let mut until = c.task.lease_until.unwrap();
        println!("EV CLAIM {id} {} {until}", c.token);
        let work_end = Instant::now() + Duration::from_millis(5 + fastrand_ms());
        let mut stale = false;
        while Instant::now() < work_end {
            std::thread::sleep(Duration::from_millis(3));
            match store.heartbeat(c.task.id, c.token, LEASE) {
                Ok(r) => {
                    until = r.lease_until;
                    println!("EV LEASE {id} {} {until}", c.token);
                }
                Err(_) => {
                    stale = true;
                    break;
                }
            }
        }
        if stale {
            println!("EV LOST {id} {}", c.token);
            continue;
        }
        match store.finish(c.task.id, c.token, Outcome::Done { result: Box::default() }) {
            Ok(_) => println!("EV DONE {id} {}", c.token),
            Err(_) => println!("EV STALE {id} {}", c.token),
        }
    }
}

fn fastrand_ms() -> u64 {
    (std::process::id() as u64 * 7 + Instant::now().elapsed().subsec_nanos() as u64) % 10
}

on_both!(chaos_every_task_ends_exactly_once);

fn chaos_every_task_ends_exactly_once(b: Backend) {
    if let Some(db) = support::child_db() {
        return worker_process(&db);
    }
    let n: usize =
        std::env::var("TASKBRIDGE_CHAOS_TASKS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let d = Db::new(b);
    let db = d.arg.clone();
    let store = d.open();
    let specs: Vec<TaskSpec> = (0..n)
        .map(|i| {
            TaskSpec::new(
                format!("task {i}"),
                "/tmp/repo",
                "0123456789abcdef0123456789abcdef01234567",
            )
        })
        .collect();
    for chunk in specs.chunks(20) {
        let mut chunk = chunk.to_vec();
        for s in &mut chunk {
            s.max_attempts = 20; // kills use attempts; the test is about exactly-once, not giving up
        }
        store.submit_batch(chunk).unwrap();
    }
    // Every task is in the queue before any worker starts: a submit that lost some would
    // otherwise only show as a run that never finishes.
    assert_eq!(store.queue_status().unwrap().counts["queued"] as usize, n, "submitted, queued");
    // The sweeper runs on its own: when a stopped worker holds the write lock, only it waits.
    let stop_reaper = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reaper = {
        let (db, stop) = (db.clone(), stop_reaper.clone());
        std::thread::spawn(move || {
            let store = Store::connect(&Location::parse(&db).unwrap()).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                store.reap_expired().unwrap();
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let (tx, rx) = mpsc::channel::<String>();
    let mut readers = Vec::new();
    let mut workers: Vec<Child> =
        (0..3).map(|_| spawn_worker(&db, tx.clone(), &mut readers)).collect();
    let mut rng = 0x2545F4914F6CDD1Du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut kills, mut stops) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(if n > 1000 { 1800 } else { 240 });
    loop {
        std::thread::sleep(Duration::from_millis(50 + next() % 200));
        let st = store.queue_status().unwrap();
        if st.counts["done"] as usize == n {
            break;
        }
        assert!(Instant::now() < deadline, "chaos run did not finish: {:?}", st.counts);
        let i = (next() % workers.len() as u64) as usize;
        if next() % 2 == 0 {
            workers[i].kill().unwrap(); // SIGKILL
            workers[i].wait().unwrap();
            workers[i] = spawn_worker(&db, tx.clone(), &mut readers);
            kills += 1;
        } else {
            // Paused for longer than the lease: its task is handed to someone else meanwhile.
            let pid = nix::unistd::Pid::from_raw(workers[i].id() as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
            std::thread::sleep(LEASE * 2);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
            stops += 1;
        }
    }
    for mut w in workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    stop_reaper.store(true, std::sync::atomic::Ordering::Relaxed);
    reaper.join().unwrap();
    // Every event every worker printed, dead ones included: each reader ends at its process's
    // end of output, so joining them all means nothing is still on its way.
    for r in readers {
        r.join().unwrap();
    }
    drop(tx);

    // token -> (task, first lease end, last lease end)
    let mut leases: HashMap<(i64, i64), (f64, f64)> = HashMap::new();
    let mut done: BTreeMap<i64, usize> = BTreeMap::new();
    let mut done_tokens: Vec<(i64, i64)> = Vec::new();
    let mut stale = 0;
    for ev in rx.iter() {
        let f: Vec<&str> = ev.split_whitespace().collect();
        let (id, token): (i64, i64) = (f[1].parse().unwrap(), f[2].parse().unwrap());
        match f[0] {
            "CLAIM" | "LEASE" => {
                let until: f64 = f[3].parse().unwrap();
                let e = leases.entry((id, token)).or_insert((until, until));
                e.1 = e.1.max(until);
            }
            "DONE" => {
                *done.entry(id).or_default() += 1;
                done_tokens.push((id, token));
            }
            "STALE" | "LOST" => stale += 1,
            _ => {}
        }
    }
    // Only the newest lease may complete a task: an accepted completion carries the last
    // token any claim of that task got (a completion under an older one must have been refused).
    let newest = |id: i64| leases.keys().filter(|(i, _)| *i == id).map(|(_, t)| *t).max();
    let from_stale: Vec<_> = done_tokens.iter().filter(|(id, t)| newest(*id) != Some(*t)).collect();
    assert!(from_stale.is_empty(), "completions accepted from stale leases: {from_stale:?}");
    let twice: Vec<_> = done.iter().filter(|(_, c)| **c > 1).collect();
    assert!(twice.is_empty(), "tasks completed twice: {twice:?}");
    // A worker killed between its commit and its print completed a task without saying so;
    // each kill can hide at most one (the store's state below is the real check).
    let unreported = n - done.len();
    assert!(
        unreported <= kills,
        "{unreported} tasks completed without a DONE event, more than the {kills} kills explain"
    );
    for i in 1..=n as i64 {
        assert_eq!(store.get(TaskId(i)).unwrap().status, taskbridge_queue::TaskStatus::Done);
    }
    // No two live leases on a task overlap: the next claim starts after the previous lease ended.
    let mut by_task: BTreeMap<i64, Vec<(i64, f64, f64)>> = BTreeMap::new();
    for ((id, token), (first, last)) in leases {
        let start = first - LEASE.as_secs_f64();
        by_task.entry(id).or_default().push((token, start, last));
    }
    let mut overlaps = 0;
    for runs in by_task.values_mut() {
        runs.sort_by_key(|r| r.0);
        for w in runs.windows(2) {
            if w[1].1 < w[0].2 - 1e-6 {
                overlaps += 1;
            }
        }
    }
    assert_eq!(overlaps, 0, "overlapping live leases");
    assert_eq!(store.integrity_check().unwrap(), "ok");
    println!(
        "chaos: tasks={n} kills={kills} stops={stops} stale_or_lost_rejected={stale} overlaps={overlaps}"
    );
}
