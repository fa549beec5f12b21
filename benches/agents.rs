//! Every agent side by side in one run: the same one-turn task through `taskbridge worker`,
//! with OpenCode as `opencode run` and as `opencode serve`, Claude Code and Codex, the real CLIs
//! against the loopback mocks of the Messages API (`tests/support/mock_anthropic.rs`) and the
//! Responses API (`tests/support/mock_openai.rs`).
//!
//!   cargo bench --bench agents       full run (20 tasks per agent)
//!   cargo test  --bench agents       small run (3 tasks per agent): a smoke test
//!
//! Prints `bench=agent.<agent> n=.. first_request_p50_ms=.. done_p50_ms=..` per agent: submit →
//! the agent's first request at the mock, and submit → `done`, whose difference is the model's
//! answer (instant here) and what the agent and TaskBridge do after it; then OpenCode's ratios;
//! then, on the warm server, `bench=agent.serve.answer`: a native question answered → the
//! agent's next request. One warm-up task per agent is not counted (OpenCode's first run sets
//! up its database; the server's first prompt in a directory sets up that directory).
//!
//! The floor, in the same run: `bench=agent.opencode.bare` is a bare `opencode serve` in its
//! default configuration (the mock its only provider), driven as a client that does nothing
//! else would drive it: a new session and `prompt_async` per task, in a directory it has served
//! before, until the session goes idle. `bench=agent.floor` divides TaskBridge's warm server by
//! it: submit → first request, and the model's last answer → `done` over its last answer → idle.
//! `bench=agent.opencode.bare_headless` is the same server configured as TaskBridge configures
//! the OpenCode it runs, and `..._ahead` that with the session made before the clock starts:
//! OpenCode alone, how low the first ratio can go with nothing of TaskBridge around it. Then
//! `bench=agent.floor.streamed`: the warm server and the bare one again, against a mock that
//! streams as a model does (its answer 300 ms after the stream starts), the time in which
//! TaskBridge readies the next task's session; "after the last answer" runs from the answer's
//! end.
//!
//! `-- floor pause=MS` waits MS milliseconds before each task on every side alike (the time a
//! submitter takes to read one result before it sends the next task), where by default the next
//! task follows the last one's end at once.
//!
//! `-- acp` runs only OpenCode 1.18.33 on its warm server beside the same over ACP and OpenCode
//! 2.1.2 over ACP (15 tasks after 2 warm-ups each), with TaskBridge's own part of each ACP run
//! from the stamps in the worker's log (`bench=agent.acp.own`, and `.parts` between stamps).
//!
//! `-- after_turn` runs only OpenCode alone, in TaskBridge's pattern against the streaming mock,
//! with each prompt held a given time after the last turn went idle (0 to 500 ms):
//! `bench=agent.opencode.after_turn hold_ms=.. first_request_p50_ms=..`, the prompt → the
//! model's first request. It shows how much a prompt pays for coming right after a turn.
#![allow(clippy::unwrap_used, dead_code)]

mod common;

#[path = "../tests/support/mock_anthropic.rs"]
mod mock_anthropic;
#[path = "../tests/support/mock_openai.rs"]
mod mock_openai;

use mock_anthropic::{MockAnthropic, Turn};
use mock_openai::{MockOpenAi, Reply};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tool(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/node_modules/.bin").join(name)
}

/// OpenCode 2 (`@opencode/cli`), beside OpenCode 1 under `.tools/oc2`.
fn opencode2() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/oc2/node_modules/.bin/opencode")
}

fn opencode() -> PathBuf {
    std::env::var_os("TASKBRIDGE_TEST_OPENCODE").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(".tools/node_modules/opencode-ai/bin/opencode.exe")
    })
}

/// How long each side waits before each task (`pause=MS`), alike on every side.
static PAUSE: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

fn pause() {
    if let Some(d) = PAUSE.get() {
        std::thread::sleep(*d);
    }
}

struct Figures {
    first_request: Vec<f64>,
    done: Vec<f64>,
    /// The model's last answer, sent whole → the end: `done`, or the session idle.
    after: Vec<f64>,
}

fn p50(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A worker in `mode` on a fresh home, against `mock`.
struct Rig {
    _dir: tempfile::TempDir,
    /// TaskBridge's home: its log has the stamps of each run (`taskbridge::stamp`).
    home: PathBuf,
    repo: PathBuf,
    store: queue::Store,
    worker: std::process::Child,
}

impl Drop for Rig {
    fn drop(&mut self) {
        // SIGTERM: the worker stops its OpenCode server with it.
        let _ = Command::new("kill").arg(self.worker.id().to_string()).status();
        let _ = self.worker.wait();
    }
}

fn rig(mode: &str, mock: &MockAnthropic) -> Rig {
    rig_with(mode, mock, &[])
}

/// A worker whose agents' CLIs have `env` (their endpoints and keys).
fn rig_with(mode: &str, mock: &MockAnthropic, env: &[(String, String)]) -> Rig {
    rig_program(mode, mock, env, &opencode())
}

/// [`rig_with`] with `program` as its OpenCode.
fn rig_program(mode: &str, mock: &MockAnthropic, env: &[(String, String)], program: &Path) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let repo = common::repo(dir.path(), "repo");
    let oc_home = dir.path().join("ochome");
    let home = queue::Home::at(dir.path().join("home")).unwrap();
    home.ensure().unwrap();
    let store = queue::Store::open(home.db_path()).unwrap();
    let mut worker = Command::new(env!("CARGO_BIN_EXE_taskbridge"));
    isolated(&mut worker, &oc_home, mock);
    let worker = worker
        .args(["worker", "--concurrency", "1", "--opencode", mode])
        .env("TASKBRIDGE_HOME", home.root())
        .env("TASKBRIDGE_OPENCODE", program)
        .env("TASKBRIDGE_MODEL", "anthropic/claude-sonnet-4-5")
        .env("TASKBRIDGE_LOG", "warn,taskbridge::stamp=debug")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Rig { _dir: dir, home: home.root().to_path_buf(), repo, store, worker }
}

/// OpenCode's environment in a bench: a home of its own under `oc_home`, `mock` its provider,
/// nothing fetched from the network.
fn isolated(cmd: &mut Command, oc_home: &Path, mock: &MockAnthropic) {
    cmd.env("OPENCODE_CONFIG_CONTENT", mock.opencode_config())
        .env("HOME", oc_home)
        .env("XDG_CONFIG_HOME", oc_home.join(".config"))
        .env("XDG_DATA_HOME", oc_home.join(".local/share"))
        .env("XDG_CACHE_HOME", oc_home.join(".cache"))
        .env("XDG_STATE_HOME", oc_home.join(".local/state"))
        .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
        .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
        .env("NPM_CONFIG_REGISTRY", "http://127.0.0.1:9/");
}

fn wait_until(
    store: &queue::Store,
    id: queue::TaskId,
    what: &str,
    ok: impl Fn(&queue::Task) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let t = store.get(id).unwrap();
        if ok(&t) {
            return;
        }
        assert!(!t.status.is_terminal(), "{what}: task {id} ended {}: {:?}", t.status, t.error);
        assert!(Instant::now() < deadline, "{what}: task {id} never got there");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Which agent a measured task names, and where its model's requests arrive.
enum Under<'a> {
    OpenCode(&'a MockAnthropic),
    ClaudeCode(&'a MockAnthropic),
    Codex(&'a MockOpenAi),
}

impl Under<'_> {
    fn arrivals(&self) -> Vec<Instant> {
        match self {
            Under::OpenCode(m) | Under::ClaudeCode(m) => m.arrivals(),
            Under::Codex(m) => m.arrivals(),
        }
    }
    /// When the last answer was sent whole (the Responses API mock answers at once).
    fn last_answer(&self) -> Instant {
        match self {
            Under::OpenCode(m) | Under::ClaudeCode(m) => *m.answered().last().unwrap(),
            Under::Codex(m) => *m.arrivals().last().unwrap(),
        }
    }
    fn agent(&self) -> Option<String> {
        match self {
            Under::OpenCode(_) => None,
            Under::ClaudeCode(_) => Some("claude-code".into()),
            Under::Codex(_) => Some("codex".into()),
        }
    }
}

fn measure(mode: &str, n: usize) -> Figures {
    measure_thinking(mode, n, 0)
}

/// The model's answer: at once, or `thinking_ms` after the stream's start, as a model streams.
fn answer(thinking_ms: u64) -> Turn {
    match thinking_ms {
        0 => Turn::text("Done."),
        ms => Turn::Streamed { after_ms: ms, turn: Box::new(Turn::text("Done.")) },
    }
}

/// The label of a measurement against a model that thinks (`_streamed`) or not.
fn labelled(label: &str, thinking_ms: u64) -> String {
    if thinking_ms == 0 { label.to_owned() } else { format!("{label}_streamed") }
}

fn measure_thinking(mode: &str, n: usize, thinking_ms: u64) -> Figures {
    let mock = MockAnthropic::spawn((0..=n).map(|_| answer(thinking_ms)).collect());
    let rig = rig(mode, &mock);
    let label = labelled(&format!("opencode.{mode}"), thinking_ms);
    measure_on(&label, &rig, &Under::OpenCode(&mock), n)
}

fn measure_claude(n: usize) -> Figures {
    let mock = MockAnthropic::spawn((0..=n).map(|_| Turn::text("Done.")).collect());
    let env = [
        ("TASKBRIDGE_CLAUDE", tool("claude").display().to_string()),
        ("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{}", mock.port)),
        ("ANTHROPIC_AUTH_TOKEN", "bench-token".into()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
        ("DISABLE_AUTOUPDATER", "1".into()),
    ]
    .map(|(k, v)| (k.to_owned(), v));
    // The OpenCode server of this worker's own is not asked: the tasks name claude-code.
    let idle = MockAnthropic::spawn(vec![]);
    let rig = rig_with("serve", &idle, &env);
    measure_on("claude-code", &rig, &Under::ClaudeCode(&mock), n)
}

fn measure_codex(n: usize) -> Figures {
    let mock = MockOpenAi::spawn((0..=n).map(|_| Reply::Text("Done.".into())).collect());
    let idle = MockAnthropic::spawn(vec![]);
    let codex_home = tempfile::tempdir().unwrap();
    std::fs::write(codex_home.path().join("config.toml"), mock.codex_config()).unwrap();
    let env = [
        ("TASKBRIDGE_CODEX", tool("codex").display().to_string()),
        ("CODEX_HOME", codex_home.path().display().to_string()),
        ("OPENAI_API_KEY", "sk-bench".into()),
    ]
    .map(|(k, v)| (k.to_owned(), v));
    let rig = rig_with("serve", &idle, &env);
    measure_on("codex", &rig, &Under::Codex(&mock), n)
}

fn measure_on(label: &str, rig: &Rig, under: &Under<'_>, n: usize) -> Figures {
    measure_warm(label, rig, under, n, 1)
}

/// `n` tasks after `warmups` that are not counted.
fn measure_warm(label: &str, rig: &Rig, under: &Under<'_>, n: usize, warmups: usize) -> Figures {
    let (store, repo) = (&rig.store, &rig.repo);
    let mut figures = Figures { first_request: Vec::new(), done: Vec::new(), after: Vec::new() };
    for i in 0..n + warmups {
        pause();
        let before = under.arrivals().len();
        let t0 = Instant::now();
        let mut req = worker::SubmitRequest::new(format!("Say done ({i})."), repo);
        req.spec.agent = under.agent();
        // Straight into the queue: submit's check that the CLI is installed reads this
        // process's environment, and the CLIs are the worker's (`rig_with`).
        let (task, _) = store.submit(req.resolve(repo).unwrap()).unwrap();
        let deadline = t0 + Duration::from_secs(120);
        loop {
            let t = store.get(task.id).unwrap();
            if t.status.is_terminal() {
                assert_eq!(t.status, queue::TaskStatus::Done, "{label}: {:?}", t.error);
                break;
            }
            assert!(Instant::now() < deadline, "{label}: task {} never finished", task.id);
            std::thread::sleep(Duration::from_millis(2));
        }
        let end = Instant::now();
        let arrivals = under.arrivals();
        if i >= warmups {
            figures.record(t0, end, arrivals[before], under.last_answer());
        }
    }
    figures.print(label, n);
    figures
}

impl Figures {
    /// One task that started at `t0`, asked the model first at `first`, was last answered at
    /// `answered` and ended at `end`.
    fn record(&mut self, t0: Instant, end: Instant, first: Instant, answered: Instant) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        self.done.push(ms(end - t0));
        self.first_request.push(ms(first - t0));
        self.after.push(ms(end - answered));
    }

    fn print(&self, label: &str, n: usize) {
        println!(
            "bench=agent.{label} n={n} first_request_p50_ms={:.0} done_p50_ms={:.0} \
             after_last_answer_p50_ms={:.0}",
            p50(&self.first_request),
            p50(&self.done),
            p50(&self.after)
        );
    }
}

/// A bare `opencode serve`: OpenCode's default configuration but for the mock as its provider,
/// with the same isolated home as the worker's rig.
struct Bare {
    _dir: tempfile::TempDir,
    repo: PathBuf,
    port: u16,
    auth: String,
    child: std::process::Child,
}

impl Drop for Bare {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `user:password` as HTTP basic authentication's base64.
fn basic(text: &str) -> String {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

impl Bare {
    /// The bare server; `headless`, with the configuration TaskBridge gives the OpenCode it runs
    /// (`worker/src/opencode_config.rs`, `headless`) instead of OpenCode's defaults.
    fn start(mock: &MockAnthropic, headless: bool) -> Bare {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        let repo = common::repo(dir.path(), "repo");
        let oc_home = dir.path().join("ochome");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut child = Command::new(opencode());
        isolated(&mut child, &oc_home, mock);
        if headless {
            let config = mock.opencode_config();
            child.env("OPENCODE_CONFIG_CONTENT", worker::headless_opencode_config(Some(&config)));
        }
        let mut child = child
            .args(["serve", "--port", &port.to_string(), "--hostname", "127.0.0.1"])
            .current_dir(&repo)
            .env("OPENCODE_SERVER_PASSWORD", "bench")
            .env("npm_config_fetch_retries", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        loop {
            let line = out.next().expect("opencode serve exited before listening").unwrap();
            if line.contains("listening on") {
                break;
            }
        }
        std::thread::spawn(move || for _ in out {});
        Bare { _dir: dir, repo, port, auth: basic("opencode:bench"), child }
    }

    /// A new session in the bare server's directory.
    fn session(&self) -> String {
        let created = self.call("POST", "/session", &serde_json::json!({"title": "bench"}));
        let created: serde_json::Value = serde_json::from_str(&created).unwrap();
        created["id"].as_str().unwrap().to_owned()
    }

    /// Sends task `i`'s one-line prompt to `session`.
    fn prompt(&self, session: &str, i: usize) {
        let prompt = serde_json::json!({
            "parts": [{"type": "text", "text": format!("Say done ({i}).")}],
            "model": {"providerID": "anthropic", "modelID": "claude-sonnet-4-5"},
        });
        self.call("POST", &format!("/session/{session}/prompt_async"), &prompt);
    }

    fn query(&self) -> String {
        format!("directory={}", self.repo.display()).replace(' ', "%20")
    }

    /// One request on a connection of its own; the answer's body.
    fn call(&self, method: &str, path: &str, body: &serde_json::Value) -> String {
        use std::io::{Read, Write};
        let body = body.to_string();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            s,
            "{method} {path}?{} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.query(),
            self.auth,
            body.len()
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (head, rest) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 2"), "{method} {path}: {head}");
        if !head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            return rest.to_owned();
        }
        let mut out = String::new();
        let mut rest = rest;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            rest = &tail[n + 2..];
        }
        out
    }

    /// Each session's idle after it was busy, as the `/event` stream tells it.
    fn idles(&self) -> std::sync::mpsc::Receiver<(String, Instant)> {
        use std::io::{BufRead, Write};
        let (tx, rx) = std::sync::mpsc::channel();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            s,
            "GET /event?{} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic {}\r\n\
             Accept: text/event-stream\r\n\r\n",
            self.query(),
            self.auth
        )
        .unwrap();
        std::thread::spawn(move || {
            let mut busy = std::collections::HashSet::new();
            for line in std::io::BufReader::new(s).lines() {
                let Ok(line) = line else { return };
                let Some(data) = line.strip_prefix("data:") else { continue };
                let Ok(ev) = serde_json::from_str::<serde_json::Value>(data.trim()) else {
                    continue;
                };
                let props = &ev["properties"];
                let (Some(session), Some(state)) = (
                    props["sessionID"].as_str(),
                    props.pointer("/status/type").and_then(|v| v.as_str()),
                ) else {
                    continue;
                };
                if state == "busy" {
                    busy.insert(session.to_owned());
                } else if state == "idle" && busy.remove(session) {
                    let _ = tx.send((session.to_owned(), Instant::now()));
                }
            }
        });
        rx
    }
}

/// How the bare server is driven.
#[derive(Clone, Copy, PartialEq)]
enum BareMode {
    /// OpenCode's defaults, a session made per task: the floor the issue measures against.
    Default,
    /// TaskBridge's configuration for the OpenCode it runs, a session made per task.
    Headless,
    /// TaskBridge's configuration, and the session made before the clock starts: what OpenCode
    /// alone takes from a prompt to the model's first request, with nothing of TaskBridge's.
    HeadlessAhead,
}

/// OpenCode's own floor ([`Bare`]): per task a new session and `prompt_async`, until it is idle.
fn measure_bare(n: usize, mode: BareMode) -> Figures {
    measure_bare_thinking(n, mode, 0)
}

fn measure_bare_thinking(n: usize, mode: BareMode, thinking_ms: u64) -> Figures {
    let mock = MockAnthropic::spawn((0..=n).map(|_| answer(thinking_ms)).collect());
    let bare = Bare::start(&mock, mode != BareMode::Default);
    let idles = bare.idles();
    let mut figures = Figures { first_request: Vec::new(), done: Vec::new(), after: Vec::new() };
    for i in 0..=n {
        pause();
        let before = mock.arrivals().len();
        let ahead = (mode == BareMode::HeadlessAhead).then(|| bare.session());
        let t0 = Instant::now();
        let session = ahead.unwrap_or_else(|| bare.session());
        bare.prompt(&session, i);
        let end = idle(&idles, &session);
        if i > 0 {
            figures.record(t0, end, mock.arrivals()[before], *mock.answered().last().unwrap());
        }
    }
    let label = match mode {
        BareMode::Default => "opencode.bare",
        BareMode::Headless => "opencode.bare_headless",
        BareMode::HeadlessAhead => "opencode.bare_headless_ahead",
    };
    figures.print(&labelled(label, thinking_ms), n);
    figures
}

/// When the session a prompt went to goes idle, as the bare server's event stream said.
fn idle(idles: &std::sync::mpsc::Receiver<(String, Instant)>, session: &str) -> Instant {
    loop {
        let (s, at) = idles.recv_timeout(Duration::from_secs(120)).expect("never idle");
        if s == session {
            return at;
        }
    }
}

/// How long after a turn each prompt is held in `-- after_turn`.
const HOLDS_MS: [u64; 8] = [0, 10, 20, 40, 60, 80, 160, 500];

/// OpenCode alone in TaskBridge's pattern: TaskBridge's configuration, the streaming mock, each
/// next session made while the model thinks (as TaskBridge makes it once the model has been
/// asked), and each prompt sent `hold` after the bench saw the last turn go idle. The prompt →
/// the model's first request, by how soon after a turn the prompt comes: OpenCode's collector
/// is still busy with the last turn for some tens of milliseconds after it (docs/BENCHMARKS.md,
/// "How soon after a turn a prompt comes").
fn measure_after_turn(n: usize, hold: Duration) -> Figures {
    let mock = MockAnthropic::spawn((0..=n).map(|_| answer(THINKING_MS)).collect());
    let bare = Bare::start(&mock, true);
    let idles = bare.idles();
    let mut figures = Figures { first_request: Vec::new(), done: Vec::new(), after: Vec::new() };
    let mut next = bare.session();
    let mut last_idle: Option<Instant> = None;
    for i in 0..=n {
        if let Some(at) = last_idle {
            std::thread::sleep((at + hold).saturating_duration_since(Instant::now()));
        }
        let before = mock.arrivals().len();
        let t0 = Instant::now();
        let session = std::mem::take(&mut next);
        bare.prompt(&session, i);
        // Halfway through the model's thinking: asked by then, and still far from its answer.
        std::thread::sleep(Duration::from_millis(THINKING_MS / 2));
        next = bare.session();
        let end = idle(&idles, &session);
        last_idle = Some(end);
        if i > 0 {
            figures.record(t0, end, mock.arrivals()[before], *mock.answered().last().unwrap());
        }
    }
    println!(
        "bench=agent.opencode.after_turn hold_ms={} n={n} first_request_p50_ms={:.0}",
        hold.as_millis(),
        p50(&figures.first_request)
    );
    figures
}

/// On the warm server: the agent asks with its `question` tool; the answer goes back on the
/// blocked request. Answer → the agent's next request at the mock.
fn measure_answer(n: usize) -> Vec<f64> {
    let ask = || {
        Turn::tool(
            "question",
            serde_json::json!({"questions": [{"question": "Red or blue?", "header": "Colour",
                "options": [{"label": "red", "description": "warm"}, {"label": "blue", "description": "calm"}]}]}),
        )
    };
    let mock = MockAnthropic::spawn((0..=n).flat_map(|_| [ask(), Turn::text("Done.")]).collect());
    let rig = rig("serve", &mock);
    let (store, repo) = (&rig.store, &rig.repo);
    let mut latencies = Vec::new();
    for i in 0..=n {
        let req = worker::SubmitRequest::new(format!("Ask, then say done ({i})."), repo);
        let (task, _, _) =
            worker::submit(store, repo, &worker::WorkerConfig::default(), req).unwrap();
        wait_until(store, task.id, "asking", |t| t.status == queue::TaskStatus::Waiting);
        let before = mock.arrivals().len();
        let t0 = Instant::now();
        store.answer(task.id, "blue", "bench").unwrap();
        let deadline = t0 + Duration::from_secs(60);
        while mock.arrivals().len() <= before {
            assert!(Instant::now() < deadline, "the answer never reached the agent");
            std::thread::sleep(Duration::from_millis(1));
        }
        let next = mock.arrivals()[before].duration_since(t0).as_secs_f64() * 1e3;
        wait_until(store, task.id, "finishing", |t| t.status == queue::TaskStatus::Done);
        if i > 0 {
            latencies.push(next);
        }
    }
    println!("bench=agent.serve.answer n={n} answer_to_next_request_p50_ms={:.0}", p50(&latencies));
    latencies
}

/// How long the streaming mock thinks before it answers: well under what a real model takes.
const THINKING_MS: u64 = 300;

/// A registry that takes connections and never answers, the worst case OpenCode's background
/// install of `@opencode-ai/plugin` can meet.
fn silent_registry() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", l.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in l.incoming().flatten() {
            held.push(c);
        }
    });
    url
}

/// A new repository's first task on the warm server (its first in a directory: OpenCode sets
/// up the directory, and waits for its plugin install there) beside the next task in the same
/// repository, `n` new repositories, with npm's registry silent:
/// `bench=agent.serve.new_repository first_done_p50_ms=.. warm_done_p50_ms=.. extra_p50_ms=..`.
fn measure_new_repository(n: usize) {
    let mock = MockAnthropic::spawn((0..=2 * n).map(|_| Turn::text("Done.")).collect());
    let registry = silent_registry();
    let env = [("NPM_CONFIG_REGISTRY_X", registry.clone()), ("npm_config_registry_x", registry)]
        .map(|(k, v)| (k.to_owned(), v));
    let rig = rig_with("serve", &mock, &env);
    let run = |repo: &Path, i: usize| {
        let t0 = Instant::now();
        let req = worker::SubmitRequest::new(format!("Say done ({i})."), repo);
        let (task, _) = rig.store.submit(req.resolve(repo).unwrap()).unwrap();
        wait_until(&rig.store, task.id, "new repository", |t| t.status.is_terminal());
        let t = rig.store.get(task.id).unwrap();
        assert_eq!(t.status, queue::TaskStatus::Done, "{:?}", t.error);
        t0.elapsed().as_secs_f64() * 1e3
    };
    // The server started, on the rig's own repository.
    run(&rig.repo, 0);
    let (mut first, mut warm, mut extra) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let repo = common::repo(rig._dir.path(), &format!("new-{i}"));
        let (a, b) = (run(&repo, 2 * i + 1), run(&repo, 2 * i + 2));
        first.push(a);
        warm.push(b);
        extra.push(a - b);
    }
    println!(
        "bench=agent.serve.new_repository n={n} first_done_p50_ms={:.0} warm_done_p50_ms={:.0} \
         extra_p50_ms={:.0} extra_max_ms={:.0}",
        p50(&first),
        p50(&warm),
        p50(&extra),
        extra.iter().cloned().fold(f64::MIN, f64::max)
    );
}

/// OpenCode 1.18.33 on its warm server, the same over ACP, and OpenCode 2.1.2 over ACP, side by
/// side in one run: `bench=agent.opencode.<way>` each, then `bench=agent.acp` the ratios of the
/// ACP paths to the warm server, and `bench=agent.acp.own` TaskBridge's own part of each ACP run
/// from the stamps in the worker's log (claimed → the prompt, less the agent's session request;
/// the prompt's answer → `done`).
fn measure_acp(n: usize, warmups: usize) {
    let way = |label: &str, mode: &str, program: &Path| {
        let mock = MockAnthropic::spawn((0..n + warmups).map(|_| Turn::text("Done.")).collect());
        let rig = rig_program(mode, &mock, &[], program);
        let figures = measure_warm(label, &rig, &Under::OpenCode(&mock), n, warmups);
        let own = own_parts(&rig.home, warmups);
        (figures, own)
    };
    let (serve, _) = way("opencode1.serve", "serve", &opencode());
    let (acp1, own1) = way("opencode1.acp", "acp", &opencode());
    let (acp2, own2) = way("opencode2.acp", "acp", &opencode2());
    let ratio = |a: &Figures, f: fn(&Figures) -> &Vec<f64>| p50(f(a)) / p50(f(&serve));
    println!(
        "bench=agent.acp first_request_acp1_over_serve={:.2} after_last_answer_acp1_over_serve={:.2} \
         first_request_acp2_over_serve={:.2} after_last_answer_acp2_over_serve={:.2}",
        ratio(&acp1, |f| &f.first_request),
        ratio(&acp1, |f| &f.after),
        ratio(&acp2, |f| &f.first_request),
        ratio(&acp2, |f| &f.after),
    );
    for (label, (before, after, parts)) in [("opencode1", own1), ("opencode2", own2)] {
        let parts: Vec<String> =
            parts.iter().map(|(k, v)| format!("{k}_p50_ms={:.2}", p50(v))).collect();
        println!("bench=agent.acp.own.parts agent={label} {}", parts.join(" "));
        println!(
            "bench=agent.acp.own agent={label} before_prompt_p50_ms={:.2} before_prompt_max_ms={:.2} \
             after_answer_p50_ms={:.2} after_answer_max_ms={:.2}",
            p50(&before),
            before.iter().cloned().fold(0.0, f64::max),
            p50(&after),
            after.iter().cloned().fold(0.0, f64::max),
        );
    }
}

/// TaskBridge's own part of each ACP run but the first `warmups`, from the worker log's stamps:
/// (claimed → prompted, less session asked → had; answered → finished), in ms.
type Parts = Vec<(&'static str, Vec<f64>)>;

fn own_parts(home: &Path, warmups: usize) -> (Vec<f64>, Vec<f64>, Parts) {
    let log = std::fs::read_to_string(home.join("logs/taskbridge.log")).unwrap_or_default();
    let mut at: std::collections::BTreeMap<u64, std::collections::HashMap<String, f64>> =
        Default::default();
    for line in log.lines().filter(|l| l.contains("taskbridge::stamp")) {
        let field = |k: &str| {
            line.split_whitespace().find_map(|w| w.strip_prefix(k)).map(|v| v.trim_matches('"'))
        };
        let (Some(task), Some(stamp)) = (field("task="), field("stamp=")) else { continue };
        let Some(clock) = line.get(11..26) else { continue };
        let secs: Vec<f64> = clock.split(':').filter_map(|p| p.parse().ok()).collect();
        let [h, m, s] = secs[..] else { continue };
        let t = (h * 3600.0 + m * 60.0 + s) * 1e3;
        at.entry(task.parse().unwrap_or(0)).or_default().entry(stamp.to_owned()).or_insert(t);
    }
    let (mut before, mut after) = (Vec::new(), Vec::new());
    // Between consecutive stamps of a run, where they are all there.
    let order = [
        "claimed",
        "prepared",
        "walled",
        "acp.session_asked",
        "acp.session_had",
        "acp.prompted",
        "acp.answered",
        "turned",
        "committed",
        "finished",
    ];
    let mut parts: Parts = order.windows(2).map(|w| (w[1], Vec::new())).collect();
    for stamps in at.values().skip(warmups) {
        let g = |k: &str| stamps.get(k).copied();
        for (i, w) in order.windows(2).enumerate() {
            if let (Some(a), Some(b)) = (g(w[0]), g(w[1])) {
                parts[i].1.push(b - a);
            }
        }
        if let (Some(c), Some(p), Some(a), Some(f)) =
            (g("claimed"), g("acp.prompted"), g("acp.answered"), g("finished"))
        {
            let session = match (g("acp.session_asked"), g("acp.session_had")) {
                (Some(x), Some(y)) => y - x,
                _ => 0.0,
            };
            before.push(p - c - session);
            after.push(f - a);
        }
    }
    parts.retain(|(_, v)| !v.is_empty());
    (before, after, parts)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let n = if full { 20 } else { 3 };
    // `cargo bench --bench agents -- acp`: OpenCode's warm server beside both OpenCodes over ACP
    // (15 tasks after 2 warm-ups each).
    if std::env::args().any(|a| a == "acp") {
        measure_acp(if full { 15 } else { 3 }, 2);
        return;
    }
    // `cargo bench --bench agents -- new_repository`: only a new repository's first task.
    if std::env::args().any(|a| a == "new_repository") {
        measure_new_repository(if full { 10 } else { 2 });
        return;
    }
    // `cargo bench --bench agents -- floor`: only the warm server and the bare one beside it.
    let floor_only = std::env::args().any(|a| a == "floor");
    // `cargo bench --bench agents -- after_turn`: only OpenCode alone, by how soon after a turn
    // each prompt comes.
    if std::env::args().any(|a| a == "after_turn") {
        for ms in HOLDS_MS {
            measure_after_turn(n, Duration::from_millis(ms));
        }
        return;
    }
    let pause_ms = std::env::args().find_map(|a| {
        let ms = a.strip_prefix("pause=")?;
        Some(ms.parse::<u64>().unwrap_or_else(|_| panic!("pause={ms}: give whole milliseconds")))
    });
    if let Some(ms) = pause_ms {
        PAUSE.set(Duration::from_millis(ms)).unwrap();
        println!("bench=agent.pause ms={ms}");
    }
    let serve = measure("serve", n);
    let bare = measure_bare(n, BareMode::Default);
    println!(
        "bench=agent.floor first_request_serve_over_bare={:.2} after_last_answer_serve_over_bare={:.2}",
        p50(&serve.first_request) / p50(&bare.first_request),
        p50(&serve.after) / p50(&bare.after)
    );
    // How low the first ratio can go at all: OpenCode itself, configured as TaskBridge
    // configures it, with and without making a session, and nothing of TaskBridge's around it.
    let headless = measure_bare(n, BareMode::Headless);
    let ahead = measure_bare(n, BareMode::HeadlessAhead);
    println!(
        "bench=agent.floor.opencode_alone first_request_headless_over_bare={:.2} \
         first_request_headless_ahead_over_bare={:.2}",
        p50(&headless.first_request) / p50(&bare.first_request),
        p50(&ahead.first_request) / p50(&bare.first_request)
    );
    // The same against a model that streams: its answer comes `THINKING_MS` after the stream
    // starts, as a real model's does (later, in practice). While it thinks, TaskBridge makes the
    // next task's session; a model answering at once leaves no such time between two tasks.
    let serve = measure_thinking("serve", n, THINKING_MS);
    let bare = measure_bare_thinking(n, BareMode::Default, THINKING_MS);
    println!(
        "bench=agent.floor.streamed first_request_serve_over_bare={:.2} \
         after_last_answer_serve_over_bare={:.2}",
        p50(&serve.first_request) / p50(&bare.first_request),
        p50(&serve.after) / p50(&bare.after)
    );
    if floor_only {
        return;
    }
    let run = measure("run", n);
    measure_claude(n);
    measure_codex(n);
    println!(
        "bench=agent.ratio first_request_run_over_serve={:.1} done_run_over_serve={:.1}",
        p50(&run.first_request) / p50(&serve.first_request),
        p50(&run.done) / p50(&serve.done)
    );
    measure_answer(n);
    measure_new_repository(if full { 10 } else { 2 });
    measure_acp(if full { 15 } else { 3 }, 2);
}
