//! Queue benchmarks on both backends, side by side in one run: a real SQLite file, and the
//! PostgreSQL server named by `TASKBRIDGE_TEST_PG` (over loopback TCP; `.ci/pg start DIR` starts
//! one), each benchmark in a fresh schema.
//!
//!   TASKBRIDGE_TEST_PG=postgres://… cargo bench -p taskbridge-queue --bench queue   full run
//!   cargo test -p taskbridge-queue --bench queue            small run: a smoke test
//!
//! Each benchmark prints one line a script can read: `bench=<name> backend=<b> key=value ...`.
//! - submit: durable submits per second from one process (SQLite: WAL, synchronous=FULL;
//!   PostgreSQL: synchronous_commit on).
//! - claim4: 4 processes claim from one file until it is drained: claim transactions per second,
//!   per-process counts (fairness), and the worst wait of a single claim call.
//! - cycle4: the same with each claim followed by its completion (two durable transactions per
//!   task), which is what a worker really does.
//! - pickup: a consumer process idles on `ChangeWatcher`; the producer submits one task at a time;
//!   latency = submit started -> claim returned in the consumer, across processes.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use taskbridge_queue::{ChangeWatcher, Location, Outcome, Store, TaskSpec};

const LEASE: Duration = Duration::from_secs(30);

fn spec(prompt: String) -> TaskSpec {
    TaskSpec::new(prompt, "/tmp/repo", "0123456789abcdef0123456789abcdef01234567")
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn done() -> Outcome {
    Outcome::Done { result: Box::default() }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("child-claim") => return child_claim(&args[2], args[3] == "finish"),
        Some("child-pickup") => return child_pickup(&args[2]),
        _ => {}
    }
    // `cargo bench` passes --bench; `cargo test` does not: then run small.
    let full = args.iter().any(|a| a == "--bench");
    let dir = tempfile::tempdir().unwrap();
    let (submits, claims, pickups) = if full { (2000, 4000, 1000) } else { (100, 200, 50) };
    let pg = std::env::var("TASKBRIDGE_TEST_PG").ok();
    if pg.is_none() {
        println!("bench backend=postgres skipped: set TASKBRIDGE_TEST_PG=postgres://…");
    }
    // One queue per benchmark and backend.
    let fresh = |backend: &str, name: &str| -> String {
        match (backend, &pg) {
            ("postgres", Some(url)) => {
                let schema = format!("bench_{name}_{}", std::process::id());
                let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
                c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).unwrap();
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}schema={schema}")
            }
            _ => dir.path().join(format!("{name}.db")).display().to_string(),
        }
    };
    let backends: Vec<&str> =
        if pg.is_some() { vec!["sqlite", "postgres"] } else { vec!["sqlite"] };
    for b in &backends {
        bench_submit(b, &fresh(b, "submit"), submits);
    }
    for b in &backends {
        bench_claim4(b, &fresh(b, "claim"), claims, false);
    }
    for b in &backends {
        bench_claim4(b, &fresh(b, "cycle"), claims, true);
    }
    for b in &backends {
        bench_pickup(b, &fresh(b, "pickup"), pickups, 0);
    }
    if let Some(url) = &pg {
        // listen=off: the poll alone (for poolers without LISTEN).
        let db = fresh("postgres", "pickup_poll");
        bench_pickup("postgres-listen-off", &format!("{db}&listen=off"), pickups / 10, 500);
        let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
        for name in ["submit", "claim", "cycle", "pickup", "pickup_poll"] {
            let schema = format!("bench_{name}_{}", std::process::id());
            c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).unwrap();
        }
    }
}

fn open(db: &str) -> Store {
    Store::connect(&Location::parse(db).unwrap()).unwrap()
}

fn bench_submit(backend: &str, db: &str, n: usize) {
    let store = open(db);
    let start = Instant::now();
    for i in 0..n {
        store.submit(spec(format!("task {i}"))).unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    println!("bench=submit backend={backend} n={n} secs={secs:.3} per_s={:.0}", n as f64 / secs);
}

fn bench_claim4(backend: &str, db: &str, n: usize, finish: bool) {
    let store = open(db);
    for i in 0..n {
        store.submit(spec(format!("task {i}"))).unwrap();
    }
    drop(store);
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let kids: Vec<_> = (0..4)
        .map(|_| {
            Command::new(&exe)
                .args(["child-claim", db, if finish { "finish" } else { "claim" }])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut counts = Vec::new();
    let mut worst_ms: f64 = 0.0;
    let mut waits: Vec<f64> = Vec::new();
    for k in kids {
        let out = k.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let mut count = 0;
        for line in text.lines() {
            if let Some(ms) = line.strip_prefix("wait_ms=") {
                let ms: f64 = ms.parse().unwrap();
                worst_ms = worst_ms.max(ms);
                waits.push(ms);
                count += 1;
            }
        }
        counts.push(count);
    }
    let secs = start.elapsed().as_secs_f64();
    waits.sort_by(f64::total_cmp);
    let total: usize = counts.iter().sum();
    assert_eq!(total, n, "every task claimed exactly once");
    println!(
        "bench={} backend={backend} n={n} secs={secs:.3} per_s={:.0} per_process={} p50_ms={:.2} p99_ms={:.2} max_wait_ms={worst_ms:.1}",
        if finish { "cycle4" } else { "claim4" },
        n as f64 / secs,
        counts.iter().map(|c| c.to_string()).collect::<Vec<_>>().join("/"),
        pct(&waits, 0.5),
        pct(&waits, 0.99),
    );
}

fn child_claim(db: &str, finish: bool) {
    let store = open(db);
    let me = format!("bench-{}", std::process::id());
    let mut out = std::io::BufWriter::new(std::io::stdout());
    loop {
        let t = Instant::now();
        let Some(c) = store.claim_next(&me, "host", LEASE).unwrap() else { break };
        writeln!(out, "wait_ms={:.3}", t.elapsed().as_secs_f64() * 1000.0).unwrap();
        if finish {
            store.finish(c.task.id, c.token, done()).unwrap();
        }
    }
}

/// `jitter_ms`: a varying pause before each submit, so that with a poll the submits land at
/// every phase of it rather than just after a look.
fn bench_pickup(backend: &str, db: &str, n: usize, jitter_ms: u64) {
    let store = open(db);
    let exe = std::env::current_exe().unwrap();
    let mut kid = Command::new(&exe)
        .args(["child-pickup", db])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(kid.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let mut lat = Vec::with_capacity(n);
    for i in 0..n as u64 {
        // Only once the consumer is idle (asleep on its watcher), so that the latency is a
        // wake-up's and not a busy consumer's next look.
        // (A poll that found nothing says idle again: skip to the first one.)
        while lines.next().unwrap().unwrap() != "idle" {}
        let jitter = if jitter_ms == 0 { 0 } else { i * 7919 % jitter_ms };
        std::thread::sleep(Duration::from_millis(2 + jitter));
        let t0 = now_ns();
        store.submit(spec(t0.to_string())).unwrap();
        let claimed_at: u128 = loop {
            let line = lines.next().unwrap().unwrap();
            if let Ok(t) = line.parse() {
                break t;
            }
        };
        lat.push((claimed_at - t0) as f64 / 1e6);
    }
    drop(kid.stdin.take());
    let _ = kid.kill();
    let _ = kid.wait();
    lat.sort_by(f64::total_cmp);
    println!(
        "bench=pickup backend={backend} n={n} p50_ms={:.2} p99_ms={:.2} max_ms={:.2}",
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        lat.last().copied().unwrap_or(0.0)
    );
}

fn child_pickup(db: &str) {
    let store = open(db);
    let (tx, rx) = std::sync::mpsc::channel();
    let _w = ChangeWatcher::spawn(&store, move || {
        let _ = tx.send(());
    })
    .unwrap();
    // On PostgreSQL the listener calls once when it is connected: ready only after that.
    if store.location().is_shared() {
        rx.recv().unwrap();
    }
    println!("ready");
    let mut out = std::io::stdout();
    loop {
        while let Some(c) = store.claim_next("pickup", "host", LEASE).unwrap() {
            writeln!(out, "{}", now_ns()).unwrap();
            out.flush().unwrap();
            store.finish(c.task.id, c.token, done()).unwrap();
        }
        while rx.try_recv().is_ok() {}
        writeln!(out, "idle").unwrap();
        out.flush().unwrap();
        if rx.recv().is_err() {
            return;
        }
        while rx.try_recv().is_ok() {}
    }
}
