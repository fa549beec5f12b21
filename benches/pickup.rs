//! Worker pickup latency: submit -> the agent process started, with an idle `taskbridge worker`
//! in another process and a stand-in agent that only records when it started.
//!
//!   cargo bench --bench pickup       full run (1,000 tasks)
//!   cargo test  --bench pickup       small run (20 tasks): a smoke test
//!   cargo bench --bench pickup -- metrics   only the metrics' cost (1,000 tasks a side)
//!   cargo bench --bench pickup -- recovery  only the kill -9 recoveries (20 rounds each)
//!
//! Prints `bench=worker.pickup.<where> n=.. p50_ms=.. p99_ms=.. max_ms=..` for a worker in another
//! process (woken by the database watch), the same with its `/metrics` scraped meanwhile (and the
//! ratio of the two medians, `metrics_cost`), and one in the submitting process (woken at once). The
//! figure includes the claim, the git worktree on its own branch, and the spawn of the agent (a
//! shell script that runs `date`, which adds about a millisecond).
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let n: usize = if full { 1000 } else { 20 };
    let dir = tempfile::tempdir().unwrap();
    let repo = common::repo(dir.path(), "repo");
    let agent_log = dir.path().join("agent.log");
    let agent = dir.path().join("agent.sh");
    std::fs::write(
        &agent,
        format!("#!/bin/sh\ndate +%s%N >> '{}'\ncat > /dev/null\n", agent_log.display()),
    )
    .unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    // `-- recovery`: only the kill -9 recoveries.
    if std::env::args().any(|a| a == "recovery") {
        recovery(dir.path(), if full { 20 } else { 3 }, false);
        recovery(dir.path(), if full { 20 } else { 3 }, true);
        return;
    }
    let home = queue::Home::at(dir.path().join("home")).unwrap();
    home.ensure().unwrap();
    let store = queue::Store::open(home.db_path()).unwrap();

    // A worker in another process, and the same with `--metrics-listen` and a scraper reading
    // /metrics every second (Prometheus reads every 15 s by default), side by side: blocks of
    // 50 tasks in the order plain, scraped, scraped, plain, repeated, each block a worker of its
    // own in a fresh repository, so that neither the machine's drift nor the repository filling
    // up with branches (pickups grow slower as it does) favours one side.
    let block = (n / 4).clamp(1, 50);
    let blocks = (2 * n / block).div_ceil(4) * 4;
    let (mut plain, mut scraped) = (Vec::new(), Vec::new());
    for (i, scrape) in [false, true, true, false].into_iter().cycle().take(blocks).enumerate() {
        let repo = common::repo(dir.path(), &format!("metrics-{i}"));
        let lat =
            cross_process(&home, dir.path(), &agent, &store, &repo, &agent_log, block, scrape);
        if scrape { scraped.extend(lat) } else { plain.extend(lat) }
    }
    let ratio = median(&scraped) / median(&plain);
    report("cross_process", plain);
    report("cross_process_scraped", scraped);
    println!("bench=worker.pickup.metrics_cost p50_ratio={ratio:.4}");
    // `-- metrics`: only this comparison.
    if std::env::args().any(|a| a == "metrics") {
        return;
    }

    // The same with the worker in this process, sharing the store handle; then again without
    // the sandbox, side by side: the difference is what the wall costs a task (building the
    // Landlock ruleset, its TMPDIR, raising it in the agent's process).
    let store = std::sync::Arc::new(store);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    for (name, mode) in [
        ("in_process", worker::sandbox::Mode::Enforce),
        ("in_process_unwalled", worker::sandbox::Mode::Off),
    ] {
        // A stand-in agent is a process per prompt: `run` mode.
        let cfg = worker::WorkerConfig {
            concurrency: 1,
            opencode: agent.clone(),
            opencode_mode: worker::OpenCodeMode::Run,
            sandbox: worker::SandboxConfig {
                mode,
                writable: vec![dir.path().to_path_buf()],
                ..Default::default()
            },
            ..Default::default()
        };
        let w = worker::Worker::new(store.clone(), home.clone(), cfg);
        let stop = tokio_util::sync::CancellationToken::new();
        let handle = rt.spawn(w.run(stop.clone()));
        std::thread::sleep(Duration::from_millis(500));
        let lat = measure(&store, &repo, &agent_log, n);
        stop.cancel();
        let _ = rt.block_on(handle);
        report(name, lat);
    }

    recovery(dir.path(), if full { 20 } else { 3 }, false);
    recovery(dir.path(), if full { 20 } else { 3 }, true);
}

/// `n` pickups by a `taskbridge worker` of its own; with `scrape`, its `/metrics` listener read
/// every second meanwhile.
#[allow(clippy::too_many_arguments)]
fn cross_process(
    home: &queue::Home,
    dir: &Path,
    agent: &Path,
    store: &queue::Store,
    repo: &Path,
    agent_log: &Path,
    n: usize,
    scrape: bool,
) -> Vec<f64> {
    use std::io::{BufRead, Read, Write};
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_taskbridge"));
    cmd.args(["worker", "--concurrency", "1"])
        .env("TASKBRIDGE_HOME", home.root())
        .env("TASKBRIDGE_OPENCODE", agent)
        .env("TASKBRIDGE_OPENCODE_MODE", "run")
        .env("TASKBRIDGE_LOG", "warn")
        // The stand-in records where the wall lets it.
        .env("TASKBRIDGE_SANDBOX_WRITABLE", dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if scrape {
        cmd.args(["--metrics-listen", "127.0.0.1:0"]);
    }
    let mut worker = cmd.spawn().unwrap();
    let mut lines = std::io::BufReader::new(worker.stderr.take().unwrap()).lines();
    let port: Option<u16> = scrape.then(|| {
        loop {
            let line = lines.next().unwrap().unwrap();
            if let Some(rest) = line.split("http://127.0.0.1:").nth(1) {
                break rest.split('/').next().unwrap().parse().unwrap();
            }
        }
    });
    // Drained, so the worker never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = port.map(|port| {
        let token = std::fs::read_to_string(home.root().join("token")).unwrap();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut scrapes = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                write!(
                    s,
                    "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
                    token.trim()
                )
                .unwrap();
                let mut body = String::new();
                s.read_to_string(&mut body).unwrap();
                assert!(body.contains("taskbridge_tasks{"), "{body}");
                scrapes += 1;
                std::thread::sleep(Duration::from_secs(1));
            }
            scrapes
        })
    });
    // Let the worker come up and go idle.
    std::thread::sleep(Duration::from_millis(500));
    let lat = measure(store, repo, agent_log, n);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(s) = scraper {
        assert!(s.join().unwrap() > 0, "the scraper read /metrics");
    }
    let _ = worker.kill();
    let _ = worker.wait();
    lat
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// kill -9 of `taskbridge serve` while its agent runs, then a new `serve`: the time from the new
/// server's start until the orphaned agent is dead and the task has left the dead worker. With
/// `peer`, a second `serve` on the same home is running all along, and the time is from the kill.
fn recovery(dir: &Path, n: usize, peer: bool) {
    let pgid_file = dir.join("agent.pgid");
    let agent = dir.join("sleepy-agent.sh");
    std::fs::write(
        &agent,
        format!(
            // Reads its prompt first, as OpenCode does: the worker writes it only after it has
            // recorded the agent's pid, so a kill from here on leaves an orphan it knows of.
            "#!/bin/sh
cat > /dev/null
ps -o pgid= $$ | tr -d ' ' > '{}'
exec sleep 600
",
            pgid_file.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let serve = |home: &Path| {
        let n = std::fs::read_dir(home).map_or(0, |d| d.count());
        let err = std::fs::File::create(home.join(format!("serve-{n}.stderr"))).unwrap();
        Command::new(env!("CARGO_BIN_EXE_taskbridge"))
            .args(["serve", "--listen", "127.0.0.1:0", "--concurrency", "1"])
            .env("TASKBRIDGE_HOME", home)
            .env("TASKBRIDGE_OPENCODE", &agent)
            .env("TASKBRIDGE_OPENCODE_MODE", "run")
            .env("TASKBRIDGE_LOG", "warn")
            .env("TASKBRIDGE_SANDBOX_WRITABLE", dir)
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap()
    };
    // A killed orphan stays a zombie until PID 1 reaps it, which in a container can take
    // seconds; a zombie runs nothing, so only live members of the group count.
    let alive = |pgid: i32| {
        std::fs::read_dir("/proc").into_iter().flatten().flatten().any(|e| {
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { return false };
            let Some(close) = stat.rfind(')') else { return false };
            let mut f = stat[close + 2..].split_whitespace();
            let state = f.next();
            f.nth(1).and_then(|g| g.parse::<i32>().ok()) == Some(pgid) && state != Some("Z")
        })
    };
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        // A repository and a home per round: task ids (and so branch names) start again at 1.
        let tag = if peer { "peer" } else { "restart" };
        let repo = &common::repo(dir, &format!("recovery-{tag}-repo-{i}"));
        let home = queue::Home::at(dir.join(format!("recovery-{tag}-{i}"))).unwrap();
        home.ensure().unwrap();
        let store = queue::Store::open(home.db_path()).unwrap();
        let _ = std::fs::remove_file(&pgid_file);
        let req = worker::SubmitRequest::new("sleep", repo);
        let (task, _, _) =
            worker::submit(&store, repo, &worker::WorkerConfig::default(), req).unwrap();
        let mut first = serve(home.root());
        let mut other = peer.then(|| serve(home.root()));
        let deadline = Instant::now() + Duration::from_secs(30);
        let pgid: i32 = loop {
            if let Some(p) =
                std::fs::read_to_string(&pgid_file).ok().and_then(|s| s.trim().parse().ok())
            {
                break p;
            }
            assert!(
                Instant::now() < deadline,
                "the agent never started: {}",
                std::fs::read_to_string(home.logs_dir().join(format!("{}.log", task.id.0)))
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        let dead_worker = store.get(task.id).unwrap().worker;
        // With a peer, the one that claimed the task is killed; its pid is in its worker id.
        let owner_pid = dead_worker.as_deref().and_then(|w| w.split(':').nth(1)?.parse().ok());
        if let Some(o) = other.as_mut()
            && Some(o.id()) == owner_pid
        {
            std::mem::swap(&mut first, o);
        }
        first.kill().unwrap();
        first.wait().unwrap();
        let t0 = Instant::now();
        let mut second = other.unwrap_or_else(|| serve(home.root()));
        loop {
            let moved = store.get(task.id).unwrap().worker != dead_worker;
            if moved && !alive(pgid) {
                break;
            }
            if t0.elapsed() > Duration::from_secs(60) {
                let t = store.get(task.id).unwrap();
                let logs = std::fs::read_dir(home.logs_dir())
                    .into_iter()
                    .chain(std::fs::read_dir(home.root()))
                    .flatten()
                    .flatten()
                    .map(|e| {
                        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                        format!("--- {}\n{text}", e.path().display())
                    })
                    .collect::<String>();
                panic!(
                    "never recovered: the task is {:?} on {:?} (the dead worker: {dead_worker:?}), \
                     its first agent {}; workers: {:?}\n{logs}",
                    t.status,
                    t.worker,
                    if alive(pgid) { "alive" } else { "dead" },
                    store.list_workers().unwrap(),
                );
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        lat.push(t0.elapsed().as_secs_f64() * 1e3);
        let _ = second.kill();
        let _ = second.wait();
        // The second server's own agent for the task.
        if let Some(p) =
            std::fs::read_to_string(&pgid_file).ok().and_then(|s| s.trim().parse::<i32>().ok())
        {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    lat.sort_by(f64::total_cmp);
    println!(
        "bench=worker.recovery.{} n={} p50_ms={:.1} max_ms={:.1}",
        if peer { "peer_kill9" } else { "serve_kill9" },
        lat.len(),
        lat[lat.len() / 2],
        lat[lat.len() - 1]
    );
}

fn measure(store: &queue::Store, repo: &Path, agent_log: &Path, n: usize) -> Vec<f64> {
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let before = std::fs::read_to_string(agent_log).unwrap_or_default().lines().count();
        let t0 = now_ns();
        let req = worker::SubmitRequest::new(format!("task {i}"), repo);
        let (task, _, _) =
            worker::submit(store, repo, &worker::WorkerConfig::default(), req).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let started: u128 = loop {
            let text = std::fs::read_to_string(agent_log).unwrap_or_default();
            if let Some(line) = text.lines().nth(before) {
                break line.trim().parse().unwrap();
            }
            assert!(Instant::now() < deadline, "the agent for task {} never started", task.id);
            std::thread::sleep(Duration::from_micros(200));
        };
        lat.push((started.saturating_sub(t0)) as f64 / 1e6);
        // Wait until the task is finished so the worker is idle when the next one arrives.
        while !store.get(task.id).unwrap().status.is_terminal() {
            assert!(Instant::now() < deadline, "task {} never finished", task.id);
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    lat
}

fn report(place: &str, mut lat: Vec<f64>) {
    lat.sort_by(f64::total_cmp);
    let p = |q: f64| lat[((lat.len() - 1) as f64 * q).round() as usize];
    println!(
        "bench=worker.pickup.{place} n={} p50_ms={:.2} p99_ms={:.2} max_ms={:.2}",
        lat.len(),
        p(0.5),
        p(0.99),
        lat[lat.len() - 1]
    );
}
