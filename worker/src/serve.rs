//! OpenCode's own server as the agent (`--opencode serve`): one warm `opencode serve` per worker,
//! on a loopback port it picks, behind a random password, serving every task's worktree through
//! the `directory` query parameter. A task is a session: create it with the task's permission
//! rules, send the prompt with `prompt_async`, follow `/event` for that session until it goes
//! idle. A resume is a new prompt in the same session, with no new process.
//!
//! The server's events are turned into the lines `opencode run --format json` prints, so the
//! readable log, the raw event file and the result come from the same parser as in `run` mode.
//!
//! Not yet here (the rest of the "native OpenCode" work): native questions and permission
//! approvals (the `question` tool is denied and every other permission allowed or denied by the
//! task's flags, so nothing ever waits on the server), budgets.

use crate::events::RunLog;
use crate::logs::TaskLog;
use crate::process::{AgentExit, StopReason};
use queue::Task;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::watch;

/// How long a new server may take to say it is listening.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One `opencode serve` child and how to reach it.
struct Running {
    child: tokio::process::Child,
    port: u16,
}

/// The worker's OpenCode server: started on first use, started again if it died.
pub struct ServeAgent {
    program: PathBuf,
    env: Vec<(String, String)>,
    /// `<home>/servers/<worker>.json`: the server's pid and start time, so the next worker on
    /// this host can kill a server whose worker was killed.
    pid_file: PathBuf,
    password: String,
    http: reqwest::Client,
    state: tokio::sync::Mutex<Option<Running>>,
}

/// What one prompt needs.
pub struct Turn<'a> {
    pub task: &'a Task,
    pub dir: &'a Path,
    pub prompt: String,
    pub model: Option<String>,
    /// The session to continue (a resume), or `None` for a new one.
    pub session: Option<String>,
}

fn io_err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// A password nobody else on the machine can guess: 32 bytes from the kernel.
fn random_password() -> String {
    use std::io::Read;
    let mut buf = [0u8; 32];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf));
    if read.is_err() {
        for b in &mut buf {
            *b = fastrand::u8(..);
        }
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// `directory=<path>` for a query string.
fn directory_query(dir: &Path) -> String {
    let encoded: String = dir
        .display()
        .to_string()
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!("directory={encoded}")
}

/// The task's flags as the session's permission rules. The last matching rule wins, and a
/// request no rule matches would wait for an answer that nothing gives yet, so everything is
/// allowed first; `question` is denied, which also hides the tool from the model.
pub fn permission_rules(task: &Task) -> Value {
    let mut rules = vec![
        json!({"permission": "*", "pattern": "*", "action": "allow"}),
        json!({"permission": "external_directory", "pattern": "*", "action": "deny"}),
        json!({"permission": "question", "pattern": "*", "action": "deny"}),
    ];
    let mut deny = |p: &str| rules.push(json!({"permission": p, "pattern": "*", "action": "deny"}));
    if task.readonly {
        deny("edit");
    }
    if task.no_shell {
        deny("bash");
    }
    if task.no_network {
        deny("webfetch");
        deny("websearch");
    }
    Value::Array(rules)
}

/// The name of a worker's server file (`<home>/servers/<this>.json`).
pub fn server_file_name(worker: &str) -> String {
    worker.replace([':', '/'], "_")
}

impl ServeAgent {
    pub fn new(
        program: PathBuf,
        env: Vec<(String, String)>,
        home: &queue::Home,
        worker: &str,
    ) -> Self {
        let file = server_file_name(worker);
        crate::notify::install_tls();
        ServeAgent {
            program,
            env,
            pid_file: home.root().join("servers").join(format!("{file}.json")),
            password: random_password(),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .build()
                .unwrap_or_default(),
            state: tokio::sync::Mutex::new(None),
        }
    }

    /// The port of a live server, starting one if there is none (or it died).
    async fn ensure(&self) -> std::io::Result<u16> {
        let mut state = self.state.lock().await;
        if let Some(r) = state.as_mut()
            && matches!(r.child.try_wait(), Ok(None))
        {
            return Ok(r.port);
        }
        if state.take().is_some() {
            tracing::warn!("the OpenCode server had died; starting a new one");
        }
        let mut last = None;
        // The server cannot pick a free port itself (`--port 0` means its default, 4096), so
        // one is chosen here; another process may take it in between, so try a few.
        for _ in 0..3 {
            match self.start().await {
                Ok(r) => {
                    let port = r.port;
                    *state = Some(r);
                    return Ok(port);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io_err("the OpenCode server did not start")))
    }

    async fn start(&self) -> std::io::Result<Running> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut child = tokio::process::Command::new(&self.program)
            .args(["serve", "--port", &port.to_string(), "--hostname", "127.0.0.1"])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("OPENCODE_SERVER_PASSWORD", &self.password)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().map(i64::from).unwrap_or(0);
        let mut out =
            BufReader::new(child.stdout.take().ok_or_else(|| io_err("no stdout"))?).lines();
        let listening = tokio::time::timeout(START_TIMEOUT, async {
            while let Ok(Some(line)) = out.next_line().await {
                if line.contains("listening on") {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false);
        if !listening {
            let _ = child.start_kill();
            return Err(io_err(format!(
                "'{} serve' did not start listening within {} s",
                self.program.display(),
                START_TIMEOUT.as_secs()
            )));
        }
        // Keep draining its output so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
        if let Some(err) = child.stderr.take() {
            tokio::spawn(async move {
                let mut lines = BufReader::new(err).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    tracing::debug!(target: "opencode_serve", "{l}");
                }
            });
        }
        let started = crate::process::process_start_time(pid);
        if let Some(dir) = self.pid_file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = std::fs::write(&self.pid_file, json!({"pid": pid, "started": started}).to_string());
        tracing::info!(port, pid, "OpenCode server started");
        Ok(Running { child, port })
    }

    /// Stops the server and everything it started.
    pub async fn shutdown(&self) {
        if let Some(mut r) = self.state.lock().await.take() {
            if let Some(pid) = r.child.id() {
                crate::process::kill_group(pid as i32);
            }
            let _ = r.child.kill().await;
        }
        let _ = std::fs::remove_file(&self.pid_file);
    }

    fn url(&self, port: u16, path: &str, dir: &Path) -> String {
        format!("http://127.0.0.1:{port}{path}?{}", directory_query(dir))
    }

    async fn post(&self, url: &str, body: &Value) -> std::io::Result<reqwest::Response> {
        let resp = self
            .http
            .post(url)
            .basic_auth("opencode", Some(&self.password))
            .json(body)
            .send()
            .await
            .map_err(io_err)?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            return Err(io_err(format!("OpenCode server answered {status} to {url}: {text}")));
        }
        Ok(resp)
    }

    /// Runs one prompt to the end of the agent's turn (or until stopped).
    /// `on_step` hears the run's usage so far after every finished step, so a running task's
    /// spend can be shown.
    pub async fn run(
        &self,
        turn: Turn<'_>,
        log: &mut TaskLog,
        mut stop: watch::Receiver<Option<StopReason>>,
        deadline: tokio::time::Instant,
        on_step: &mut (dyn FnMut(&crate::events::Usage) + Send),
    ) -> std::io::Result<AgentExit> {
        let port = self.ensure().await?;
        let dir = turn.dir;
        // Subscribe before prompting, so no event of the turn is missed.
        let events = self
            .http
            .get(self.url(port, "/event", dir))
            .basic_auth("opencode", Some(&self.password))
            .header("accept", "text/event-stream")
            .send()
            .await
            .map_err(io_err)?;
        let mut events = SseLines::new(events);
        let session = match turn.session {
            Some(s) => s,
            None => {
                let body = json!({
                    "title": format!("taskbridge #{}: {}", turn.task.id.0, turn.task.title),
                    "permission": permission_rules(turn.task),
                });
                let created: Value = self
                    .post(&self.url(port, "/session", dir), &body)
                    .await?
                    .json()
                    .await
                    .map_err(io_err)?;
                created["id"].as_str().ok_or_else(|| io_err("no session id"))?.to_owned()
            }
        };
        log.line(&format!("OpenCode server on port {port}: session {session}"));
        let mut prompt = json!({"parts": [{"type": "text", "text": turn.prompt}]});
        if let Some((provider, model)) = turn.model.as_deref().and_then(|m| m.split_once('/')) {
            prompt["model"] = json!({"providerID": provider, "modelID": model});
        }
        if let Some(agent) = &turn.task.agent {
            prompt["agent"] = json!(agent);
        }
        let url = self.url(port, &format!("/session/{session}/prompt_async"), dir);
        self.post(&url, &prompt).await?;

        let mut run = RunLog { session_id: Some(session.clone()), ..Default::default() };
        let mut state = TurnState::default();
        let mut stopped = None;
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    Some(data) => {
                        let Ok(ev) = serde_json::from_str::<Value>(&data) else { continue };
                        if ev.pointer("/properties/sessionID").and_then(Value::as_str) != Some(session.as_str()) {
                            continue;
                        }
                        // The model the server chose, its own default when none was named, as
                        // `--print-logs` tells it in `run` mode.
                        if run.model_seen.is_none()
                            && let (Some(p), Some(m)) = (
                                ev.pointer("/properties/info/model/providerID").and_then(Value::as_str),
                                ev.pointer("/properties/info/model/modelID").and_then(Value::as_str),
                            )
                        {
                            run.model_seen = Some(format!("{p}/{m}"));
                        }
                        for line in state.lines(&session, &ev, log) {
                            log.raw(&line);
                            let steps = run.usage.steps;
                            if let Some(text) = run.ingest(&line) {
                                log.line(&text);
                            }
                            if run.usage.steps != steps {
                                on_step(&run.usage);
                            }
                        }
                        if state.finished {
                            break;
                        }
                    }
                    None => {
                        // The stream ended: the server went away mid-turn.
                        return Err(io_err("the OpenCode server closed its event stream mid-turn"));
                    }
                },
                _ = stop.changed(), if stopped.is_none() => {
                    if let Some(reason) = *stop.borrow() {
                        stopped = Some(reason);
                        break;
                    }
                }
                _ = tokio::time::sleep_until(deadline), if stopped.is_none() => {
                    stopped = Some(StopReason::Timeout);
                    break;
                }
            }
        }
        if let Some(reason) = stopped {
            log.line(&format!("stopping the agent ({reason:?}): aborting its session"));
            let url = self.url(port, &format!("/session/{session}/abort"), dir);
            if let Err(e) = self.post(&url, &json!({})).await {
                tracing::warn!(error = %e, "aborting the session failed");
            }
        }
        Ok(AgentExit { exit_code: Some(0), stopped, stderr_tail: String::new(), run })
    }
}

/// What a turn's events have said so far, to turn them into `run --format json` lines.
#[derive(Default)]
struct TurnState {
    roles: HashMap<String, String>,
    running_tools: HashSet<String>,
    busy: bool,
    finished: bool,
}

impl TurnState {
    fn lines(&mut self, session: &str, ev: &Value, log: &mut TaskLog) -> Vec<String> {
        let props = &ev["properties"];
        match ev["type"].as_str().unwrap_or("") {
            "message.updated" => {
                if let (Some(id), Some(role)) = (
                    props.pointer("/info/id").and_then(Value::as_str),
                    props.pointer("/info/role").and_then(Value::as_str),
                ) {
                    self.roles.insert(id.to_owned(), role.to_owned());
                }
                vec![]
            }
            "message.part.updated" => {
                let part = &props["part"];
                let message = part["messageID"].as_str().unwrap_or("");
                if self.roles.get(message).map(String::as_str) == Some("user") {
                    return vec![];
                }
                let line = |kind: &str| {
                    json!({"type": kind, "sessionID": session, "part": part}).to_string()
                };
                match part["type"].as_str().unwrap_or("") {
                    "step-start" => vec![line("step_start")],
                    "step-finish" => vec![line("step_finish")],
                    "text" | "reasoning" if part.pointer("/time/end").is_some() => {
                        vec![line(part["type"].as_str().unwrap_or("text"))]
                    }
                    "tool" => match part.pointer("/state/status").and_then(Value::as_str) {
                        Some("running") => {
                            let call = part["callID"].as_str().unwrap_or("").to_owned();
                            if self.running_tools.insert(call) {
                                let t = crate::events::tool_call(part);
                                log.line(&format!("tool {}: {} (running)", t.tool, t.target));
                            }
                            vec![]
                        }
                        Some("completed") | Some("error") => vec![line("tool_use")],
                        _ => vec![],
                    },
                    _ => vec![],
                }
            }
            "session.status" => {
                match props.pointer("/status/type").and_then(Value::as_str) {
                    Some("busy") => self.busy = true,
                    Some("idle") if self.busy => self.finished = true,
                    _ => {}
                }
                vec![]
            }
            "session.idle" if self.busy => {
                self.finished = true;
                vec![]
            }
            "session.error" => {
                vec![
                    json!({"type": "error", "sessionID": session, "error": props["error"]})
                        .to_string(),
                ]
            }
            _ => vec![],
        }
    }
}

/// The `data:` payloads of a server-sent event stream.
struct SseLines {
    resp: reqwest::Response,
    buf: String,
    pending: std::collections::VecDeque<String>,
}

impl SseLines {
    fn new(resp: reqwest::Response) -> Self {
        SseLines { resp, buf: String::new(), pending: Default::default() }
    }

    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(d) = self.pending.pop_front() {
                return Some(d);
            }
            let chunk = self.resp.chunk().await.ok()??;
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(i) = self.buf.find('\n') {
                let line: String = self.buf.drain(..=i).collect();
                if let Some(data) = line.trim_end().strip_prefix("data:") {
                    self.pending.push_back(data.trim_start().to_owned());
                }
            }
        }
    }
}

/// Kills the OpenCode servers that workers on this host left behind when they died, from their
/// pid files; `alive` says whether a worker (by its file name) still runs.
pub fn kill_orphaned_servers(home: &queue::Home, alive: impl Fn(&str) -> bool) {
    let dir = home.root().join("servers");
    let Ok(entries) = std::fs::read_dir(&dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().trim_end_matches(".json").to_owned();
        if alive(&name) {
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(e.path())
            && let Ok(v) = serde_json::from_str::<Value>(&text)
            && let Some(pid) = v["pid"].as_i64()
            && crate::process::kill_orphan(pid, v["started"].as_str())
        {
            tracing::warn!(pid, "killed the OpenCode server of a dead worker");
        }
        let _ = std::fs::remove_file(e.path());
    }
}
