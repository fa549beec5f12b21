//! `opencode run` against `opencode serve`, side by side in one run: the same one-turn task,
//! through `taskbridge worker --opencode MODE`, the real OpenCode against the loopback mock of
//! the Messages API (`tests/support/mock_anthropic.rs`).
//!
//!   cargo bench --bench agents       full run (20 tasks per mode)
//!   cargo test  --bench agents       small run (3 tasks per mode): a smoke test
//!
//! Prints `bench=agent.<mode> n=.. first_request_p50_ms=.. done_p50_ms=..` per mode: submit →
//! the agent's first request at the mock, and submit → `done`; then the ratios. One warm-up task
//! per mode is not counted (OpenCode's first run sets up its database; the server's first
//! prompt loads its providers).
#![allow(clippy::unwrap_used, dead_code)]

mod common;

#[path = "../tests/support/mock_anthropic.rs"]
mod mock_anthropic;

use mock_anthropic::{MockAnthropic, Turn};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn opencode() -> PathBuf {
    std::env::var_os("TASKBRIDGE_TEST_OPENCODE").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(".tools/node_modules/opencode-ai/bin/opencode.exe")
    })
}

struct Figures {
    first_request: Vec<f64>,
    done: Vec<f64>,
}

fn p50(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn measure(mode: &str, n: usize) -> Figures {
    let dir = tempfile::tempdir().unwrap();
    let repo = common::repo(dir.path(), "repo");
    let mock = MockAnthropic::spawn((0..=n).map(|_| Turn::text("Done.")).collect());
    let oc_home = dir.path().join("ochome");
    let home = queue::Home::resolve(Some(dir.path().join("home"))).unwrap();
    home.ensure().unwrap();
    let store = queue::Store::open(home.db_path()).unwrap();
    let mut worker = Command::new(env!("CARGO_BIN_EXE_taskbridge"))
        .args(["worker", "--concurrency", "1", "--opencode", mode])
        .env("TASKBRIDGE_HOME", home.root())
        .env("TASKBRIDGE_OPENCODE", opencode())
        .env("TASKBRIDGE_MODEL", "anthropic/claude-sonnet-4-5")
        .env("TASKBRIDGE_LOG", "warn")
        .env("OPENCODE_CONFIG_CONTENT", mock.opencode_config())
        .env("HOME", &oc_home)
        .env("XDG_CONFIG_HOME", oc_home.join(".config"))
        .env("XDG_DATA_HOME", oc_home.join(".local/share"))
        .env("XDG_CACHE_HOME", oc_home.join(".cache"))
        .env("XDG_STATE_HOME", oc_home.join(".local/state"))
        .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
        .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
        .env("NPM_CONFIG_REGISTRY", "http://127.0.0.1:9/")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut figures = Figures { first_request: Vec::new(), done: Vec::new() };
    for i in 0..=n {
        let before = mock.arrivals().len();
        let t0 = Instant::now();
        let req = worker::SubmitRequest::new(format!("Say done ({i})."), &repo);
        let (task, _, _) = worker::submit(&store, &repo, Path::new("opencode"), req).unwrap();
        let deadline = t0 + Duration::from_secs(120);
        loop {
            let t = store.get(task.id).unwrap();
            if t.status.is_terminal() {
                assert_eq!(t.status, queue::TaskStatus::Done, "{mode}: {:?}", t.error);
                break;
            }
            assert!(Instant::now() < deadline, "{mode}: task {} never finished", task.id);
            std::thread::sleep(Duration::from_millis(2));
        }
        let done = t0.elapsed().as_secs_f64() * 1e3;
        let first = mock.arrivals().get(before).map(|a| a.duration_since(t0).as_secs_f64() * 1e3);
        if i > 0 {
            figures.done.push(done);
            figures.first_request.push(first.unwrap());
        }
    }
    let _ = worker.kill();
    let _ = worker.wait();
    println!(
        "bench=agent.{mode} n={n} first_request_p50_ms={:.0} done_p50_ms={:.0}",
        p50(&figures.first_request),
        p50(&figures.done)
    );
    figures
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let n = if full { 20 } else { 3 };
    let run = measure("run", n);
    let serve = measure("serve", n);
    println!(
        "bench=agent.ratio first_request_run_over_serve={:.1} done_run_over_serve={:.1}",
        p50(&run.first_request) / p50(&serve.first_request),
        p50(&run.done) / p50(&serve.done)
    );
}
