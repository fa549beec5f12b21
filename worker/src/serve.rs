//! OpenCode's own server as the agent (`--opencode serve`): one warm `opencode serve` per worker,
//! on a loopback port it picks, behind a random password, serving every task's worktree through
//! the `directory` query parameter. A task is a session: create it with the task's permission
//! rules, send the prompt with `prompt_async`, follow `/event` for that session until it goes
//! idle. A resume is a new prompt in the same session, with no new process.
//!
//! The server's events are turned into the lines `opencode run --format json` prints, so the
//! readable log, the raw event file and the result come from the same parser as in `run` mode.
//!
//! Decisions are native: the agent's `question` tool and the task's `ask` rules block the agent
//! on a request in the server (`question.asked`, `permission.asked`). The run then ends with the
//! decision, the task waits in the queue, and the request is *parked* here: when this worker
//! claims the answered task again it replies on the request, so the agent's tool call returns the
//! answer and the same turn goes on. If the server forgot the request (it restarted) or another
//! worker claims the task, the answer goes in as a new prompt in the same session instead.

use crate::events::{RunLog, Usage};
use crate::logs::TaskLog;
use crate::process::{AgentExit, StopReason};
use queue::{AgentQuestion, Ask, PermissionAsk, QuestionOption, Task, TaskId};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::watch;

/// How long a new server may take to say it is listening.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How often the record of what the server started is refreshed: a command started less than
/// this before the server died may be missed when cleaning up after it.
const TREE_REFRESH: Duration = Duration::from_millis(250);

/// A turn that went on after the server died mid-turn is prompted again at most this often.
const MAX_SERVER_RESTARTS_PER_TURN: u32 = 2;

/// The prompt that continues a session whose run was interrupted.
pub const INTERRUPTED: &str = include_str!("../../assets/interrupted.md");

/// One `opencode serve` child and how to reach it.
struct Running {
    child: tokio::process::Child,
    pid: i32,
    /// What the server has started, refreshed while it lives: OpenCode runs commands in
    /// process groups of their own, which a dead server's pid no longer leads to.
    tree: std::sync::Arc<std::sync::Mutex<crate::process::ProcessTree>>,
    port: u16,
    /// Counts the servers this worker started: a request parked on an earlier one is gone.
    generation: u64,
}

/// A request the agent is blocked on, in this worker's server, while its task waits.
#[derive(Debug, Clone)]
struct Parked {
    session: String,
    request_id: String,
    dir: PathBuf,
    generation: u64,
}

/// An OpenCode plugin that blanks the warm server's password in the environment of every
/// command the agent runs. OpenCode's shell tools start commands with the server's own
/// environment, where the password is (`OPENCODE_SERVER_PASSWORD` is how `opencode serve` takes
/// it), and apply the `shell.env` hook's variables over it; without this a command could call
/// the server and read or drive every session on it. What it cannot stop (a command reading the
/// server's `/proc/PID/environ`, which the same user may) the README says.
const ENV_PLUGIN: &str = r#"// Written by TaskBridge (see worker/src/serve.rs): the agent's commands do not get the
// OpenCode server's password.
export const TaskbridgeEnv = async () => ({
  "shell.env": async (_input, output) => {
    output.env.OPENCODE_SERVER_PASSWORD = "";
  },
});
"#;

/// npm's retry count for the warm server, unless the user set one. Before OpenCode loads any
/// plugin (and the environment plugin is always there) it waits for its own install of
/// `@opencode-ai/plugin` into each config directory, once per task directory. With npm's
/// default retries an offline machine waits about 70 s for each (10 s, then 60 s, between
/// attempts); with none the install fails at once, which OpenCode logs as a warning and shrugs
/// off, and online it installs as before. `env` looks a variable up (npm reads either case).
pub fn npm_retries(env: impl Fn(&str) -> Option<String>) -> Option<(String, String)> {
    let set =
        ["npm_config_fetch_retries", "NPM_CONFIG_FETCH_RETRIES"].iter().any(|k| env(k).is_some());
    (!set).then(|| ("npm_config_fetch_retries".to_owned(), "0".to_owned()))
}

/// Writes the environment plugin into the home (each start: a newer TaskBridge may change it)
/// and returns its path.
pub fn env_plugin(home: &queue::Home) -> std::io::Result<PathBuf> {
    let dir = home.root().join("opencode-plugin");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("taskbridge-env.js");
    std::fs::write(&path, ENV_PLUGIN)?;
    Ok(path)
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
    generation: std::sync::atomic::AtomicU64,
    parked: std::sync::Mutex<HashMap<TaskId, Parked>>,
}

/// How a turn begins.
pub enum Delivery {
    /// A prompt: a new task, an answer the server can no longer take natively, a continuation.
    Prompt(String),
    /// The answer to the request the agent is blocked on (`path` is the reply route).
    Reply { path: String, body: Value },
}

/// Permission requests approved without asking: the task's earlier `always` answers, and an
/// approval that arrives as a prompt after the blocked request was lost.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// (permission, pattern), for the rest of the task.
    pub always: Vec<(String, String)>,
    /// (permission, patterns), for the next matching request only.
    pub once: Vec<(String, Vec<String>)>,
}

impl Grants {
    /// Whether `p` is approved; a one-time approval is used up.
    pub fn approves(&mut self, p: &PermissionAsk) -> bool {
        if let Some(i) =
            self.once.iter().position(|(perm, pats)| perm == &p.permission && pats == &p.patterns)
        {
            self.once.remove(i);
            return true;
        }
        !p.patterns.is_empty()
            && p.patterns.iter().all(|pat| {
                self.always.iter().any(|(perm, glob)| {
                    (perm == "*" || perm == &p.permission) && wildcard_match(glob, pat)
                })
            })
    }
}

/// OpenCode's wildcard: `*` any run of characters, `?` one.
pub fn wildcard_match(glob: &str, text: &str) -> bool {
    let (g, t): (Vec<char>, Vec<char>) = (glob.chars().collect(), text.chars().collect());
    let (mut gi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        // A star first: read as a literal, a `*` in the text would use the glob's star up and
        // leave nothing to backtrack to (`echo *` would not cover `echo **`).
        if gi < g.len() && g[gi] == '*' {
            star = Some(gi);
            mark = ti;
            gi += 1;
        } else if gi < g.len() && (g[gi] == '?' || g[gi] == t[ti]) {
            gi += 1;
            ti += 1;
        } else if let Some(s) = star {
            gi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|c| *c == '*')
}

/// What a run tells its caller as it goes.
pub enum Progress<'a> {
    /// The session the run is in (recorded at once, so that an interrupted task resumes it).
    Session(&'a str),
    /// A step finished: the run's usage so far.
    Step(&'a Usage),
    /// A permission request was approved by a grant, without asking.
    Approved(&'a Ask),
    /// A second went by during the turn (the caller may have a note for the agent).
    Tick,
}

/// The caller's word after a step: go on, stop the agent with a decision (a budget), or (on a
/// tick) say something to the agent at its next step.
pub enum Control {
    Go,
    Stop(Box<Ask>),
    Say(String),
}

/// How often a turn asks its caller whether there is something to tell the agent.
const TICK: Duration = Duration::from_secs(1);

/// What one prompt needs.
pub struct Turn<'a> {
    pub task: &'a Task,
    pub dir: &'a Path,
    pub delivery: Delivery,
    pub model: Option<String>,
    /// The session to continue (a resume), or `None` for a new one.
    pub session: Option<String>,
    /// The prompt to send instead when `session` is not in this server's database (made on
    /// another host): one that stands without the conversation.
    pub without_session: Option<String>,
    pub grants: Grants,
}

/// Where a session to continue was made, seen from the turn's directory.
enum Located {
    Here,
    Elsewhere(String),
    Missing,
}

/// Tool output beyond this many characters is cut in a transcript.
const TRANSCRIPT_OUTPUT_CHARS: usize = 2_000;

/// `GET /session/:id/message`'s answer as text a model reads: each message's text and tool
/// calls (their input and output, cut), in order.
fn render_transcript(messages: &Value) -> String {
    let cut = |s: &str| -> String {
        match s.char_indices().nth(TRANSCRIPT_OUTPUT_CHARS) {
            Some((i, _)) => format!("{}… (cut)", &s[..i]),
            None => s.to_owned(),
        }
    };
    let mut out = String::new();
    for m in messages.as_array().into_iter().flatten() {
        let role = m.pointer("/info/role").and_then(Value::as_str).unwrap_or("?");
        for part in m["parts"].as_array().into_iter().flatten() {
            match part["type"].as_str() {
                Some("text") if part["synthetic"] != true => {
                    let text = part["text"].as_str().unwrap_or_default().trim();
                    if !text.is_empty() {
                        out.push_str(&format!("[{role}] {text}\n\n"));
                    }
                }
                Some("tool") => {
                    let tool = part["tool"].as_str().unwrap_or("tool");
                    let input = part.pointer("/state/input").cloned().unwrap_or(Value::Null);
                    let output = part
                        .pointer("/state/output")
                        .or_else(|| part.pointer("/state/error"))
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    out.push_str(&format!("[tool {tool}] {input}\n{}\n\n", cut(output.trim())));
                }
                _ => {}
            }
        }
    }
    if out.is_empty() {
        return out;
    }
    format!(
        "The conversation so far, from the session of the work this continues (its tool calls \
         ran in that task's worktree; this worktree holds their result):\n\n{out}---\n\n"
    )
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

/// The task's rules as the session's permission rules. The last matching rule wins and a
/// request no rule matches asks, so everything is allowed first; then the task's `ask` rules;
/// then the flags' denies, which no `ask` rule may loosen.
pub fn permission_rules(task: &Task) -> Value {
    let mut rules = vec![
        json!({"permission": "*", "pattern": "*", "action": "allow"}),
        json!({"permission": "external_directory", "pattern": "*", "action": "deny"}),
    ];
    for rule in &task.ask_rules {
        if let Ok((permission, pattern)) = queue::parse_ask_rule(rule) {
            rules.push(json!({"permission": permission, "pattern": pattern, "action": "ask"}));
        }
    }
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

/// The agent's questions from a `question.asked` event.
fn questions_of(props: &Value) -> Vec<AgentQuestion> {
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    props["questions"]
        .as_array()
        .map(|qs| {
            qs.iter()
                .map(|q| AgentQuestion {
                    question: text(q, "question").unwrap_or_default(),
                    header: text(q, "header"),
                    options: q["options"]
                        .as_array()
                        .map(|os| {
                            os.iter()
                                .map(|o| QuestionOption {
                                    label: text(o, "label").unwrap_or_default(),
                                    description: text(o, "description"),
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                    multiple: q["multiple"].as_bool().unwrap_or(false),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The permission a `permission.asked` event asks for.
fn permission_of(props: &Value) -> PermissionAsk {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let patterns = strings(&props["patterns"]);
    let target = ["command", "filepath", "filePath", "path", "url", "pattern"]
        .iter()
        .find_map(|k| props.pointer(&format!("/metadata/{k}")).and_then(Value::as_str))
        .map(str::to_owned)
        .or_else(|| (!patterns.is_empty()).then(|| patterns.join(", ")));
    PermissionAsk {
        permission: props["permission"].as_str().unwrap_or("?").to_owned(),
        patterns,
        target,
        always: strings(&props["always"]),
    }
}

/// Where a worker lists its spare worktrees (`<home>/servers/<worker>.spares.json`).
pub fn spares_file(home: &queue::Home, worker: &str) -> PathBuf {
    home.root().join("servers").join(format!("{}.spares.json", server_file_name(worker)))
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
            generation: Default::default(),
            parked: Default::default(),
        }
    }

    /// Whether the agent of `task` is still blocked on `request_id` in this worker's live
    /// server, so the answer can go to it directly. The parked entry is taken either way.
    pub async fn take_parked(&self, task: TaskId, request_id: &str) -> bool {
        let parked = self.parked.lock().ok().and_then(|mut p| p.remove(&task));
        let Some(parked) = parked else { return false };
        let mut state = self.state.lock().await;
        let live = state.as_mut().is_some_and(|r| {
            r.generation == parked.generation && matches!(r.child.try_wait(), Ok(None))
        });
        live && parked.request_id == request_id
    }

    /// The tasks whose agents are parked here.
    pub fn parked_tasks(&self) -> Vec<TaskId> {
        self.parked.lock().map(|p| p.keys().copied().collect()).unwrap_or_default()
    }

    /// Aborts the sessions parked for tasks that `still_waiting` no longer sees waiting (they
    /// were cancelled, or their question timed out), so that nothing runs on for them.
    pub async fn sweep_parked(&self, still_waiting: impl Fn(TaskId) -> bool) {
        let gone: Vec<(TaskId, Parked)> = match self.parked.lock() {
            Ok(mut p) => {
                let ids: Vec<TaskId> = p.keys().copied().filter(|id| !still_waiting(*id)).collect();
                ids.into_iter().filter_map(|id| p.remove(&id).map(|x| (id, x))).collect()
            }
            Err(_) => return,
        };
        if gone.is_empty() {
            return;
        }
        let port = match self.state.lock().await.as_ref() {
            Some(r) => r.port,
            None => return,
        };
        for (id, p) in gone {
            let url = self.url(port, &format!("/session/{}/abort", p.session), &p.dir);
            match self.post(&url, &json!({})).await {
                Ok(_) => {
                    tracing::info!(task = %id, "aborted the session of a task that stopped waiting")
                }
                Err(e) => {
                    tracing::warn!(task = %id, error = %e, "aborting a parked session failed")
                }
            }
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
        if let Some(dead) = state.take() {
            // What it ran must not outlive it.
            if let Ok(mut tree) = dead.tree.lock() {
                tree.refresh();
                tree.signal(nix::sys::signal::Signal::SIGKILL);
            }
            tracing::warn!(pid = dead.pid, "the OpenCode server had died; starting a new one");
        }
        let mut last = None;
        // The server cannot pick a free port itself (`--port 0` means its default, 4096), so
        // one is chosen here; another process may take it in between, so try a few.
        for _ in 0..3 {
            match self.start().await {
                Ok(mut r) => {
                    r.generation =
                        self.generation.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
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
        let mut child = tokio::process::Command::new(&self.program);
        for var in crate::process::SECRET_ENV {
            child.env_remove(var);
        }
        let mut child = child
            .args(["serve", "--port", &port.to_string(), "--hostname", "127.0.0.1"])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("OPENCODE_SERVER_PASSWORD", &self.password)
            // The agent's own question tool: TaskBridge answers it.
            .env("OPENCODE_ENABLE_QUESTION_TOOL", "1")
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
        let tree = std::sync::Arc::new(std::sync::Mutex::new(crate::process::ProcessTree::new(
            pid as i32,
        )));
        let watched = std::sync::Arc::downgrade(&tree);
        tokio::spawn(async move {
            // Until the server is dropped (a new one replaced it, or the worker stopped).
            while let Some(tree) = watched.upgrade() {
                if let Ok(mut t) = tree.lock() {
                    t.refresh();
                }
                drop(tree);
                tokio::time::sleep(TREE_REFRESH).await;
            }
        });
        let started = crate::process::process_start_time(pid);
        if let Some(dir) = self.pid_file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = std::fs::write(&self.pid_file, json!({"pid": pid, "started": started}).to_string());
        tracing::info!(port, pid, "OpenCode server started");
        Ok(Running { child, pid: pid as i32, tree, port, generation: 0 })
    }

    /// Stops the server and everything it started.
    pub async fn shutdown(&self) {
        if let Some(mut r) = self.state.lock().await.take() {
            if let Ok(mut tree) = r.tree.lock() {
                tree.refresh();
                tree.signal(nix::sys::signal::Signal::SIGKILL);
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

    /// A GET to the server, with its password.
    fn get(&self, url: &str) -> reqwest::RequestBuilder {
        self.http.get(url).basic_auth("opencode", Some(&self.password))
    }

    async fn subscribe(&self, port: u16, dir: &Path) -> std::io::Result<SseLines> {
        let events = self
            .get(&self.url(port, "/event", dir))
            .header("accept", "text/event-stream")
            .send()
            .await
            .map_err(io_err)?;
        Ok(SseLines::new(events))
    }

    async fn prompt(
        &self,
        port: u16,
        turn: &Turn<'_>,
        session: &str,
        text: &str,
    ) -> std::io::Result<()> {
        let mut prompt = json!({"parts": [{"type": "text", "text": text}]});
        if let Some((provider, model)) = turn.model.as_deref().and_then(|m| m.split_once('/')) {
            prompt["model"] = json!({"providerID": provider, "modelID": model});
        }
        // A task names OpenCode's own agents `opencode:<agent>`; the server takes the bare name.
        if let Some(agent) = crate::agent::AgentSpec::of(turn.task).opencode_agent {
            prompt["agent"] = json!(agent);
        }
        let url = self.url(port, &format!("/session/{session}/prompt_async"), turn.dir);
        self.post(&url, &prompt).await.map(|_| ())
    }

    /// Runs one prompt (or one reply) to the end of the agent's turn, until it is stopped, or
    /// until the agent blocks on a decision (`AgentExit::waiting`). `on_progress` hears every
    /// finished step's usage so far, and may stop the agent with a decision of its own.
    pub async fn run(
        &self,
        mut turn: Turn<'_>,
        log: &mut TaskLog,
        mut stop: watch::Receiver<Option<StopReason>>,
        deadline: tokio::time::Instant,
        on_progress: &mut (dyn FnMut(Progress<'_>) -> Control + Send),
    ) -> std::io::Result<AgentExit> {
        let mut port = self.ensure().await?;
        let dir = turn.dir;
        // Subscribe before prompting, so no event of the turn is missed.
        let mut events = self.subscribe(port, dir).await?;
        let session = match turn.session.clone() {
            Some(s) => match self.locate(port, dir, &s).await? {
                Located::Here => s,
                Located::Elsewhere(there) => {
                    // A session runs its tools in the directory it was made in whatever the
                    // request says, and its events go to that directory's subscribers: prompted
                    // from here it would write into whatever lives there now (another task's
                    // worktree). A new session here gets the conversation as text instead.
                    let earlier = self.transcript(port, dir, &s).await;
                    let fresh = self.create(port, &turn).await?;
                    log.line(&format!(
                        "session {s} belongs to {there}, which another task holds; going on in \
                         a new session {fresh} here, given that conversation as text"
                    ));
                    if let (Delivery::Prompt(text), Some(alone)) =
                        (&mut turn.delivery, turn.without_session.take())
                    {
                        *text = format!("{earlier}{alone}");
                    }
                    fresh
                }
                Located::Missing => {
                    let fresh = self.create(port, &turn).await?;
                    log.line(&format!(
                        "session {s} is not in this host's OpenCode; starting {fresh} afresh"
                    ));
                    if let (Delivery::Prompt(text), Some(alone)) =
                        (&mut turn.delivery, turn.without_session.take())
                    {
                        *text = alone;
                    }
                    fresh
                }
            },
            None => self.create(port, &turn).await?,
        };
        log.line(&format!("OpenCode server on port {port}: session {session}"));
        on_progress(Progress::Session(&session));
        let mut state = TurnState::default();
        match std::mem::replace(&mut turn.delivery, Delivery::Prompt(String::new())) {
            Delivery::Prompt(text) => self.prompt(port, &turn, &session, &text).await?,
            Delivery::Reply { path, body } => {
                // The agent is mid-turn, blocked on the request this answers.
                state.busy = true;
                self.post(&self.url(port, &path, dir), &body).await?;
                log.line("answered the agent's pending request; its turn goes on");
            }
        }

        let mut run = RunLog { session_id: Some(session.clone()), ..Default::default() };
        let mut stopped = None;
        let mut waiting = None;
        let mut restarts = 0;
        let mut children: HashSet<String> = HashSet::new();
        let mut tick = tokio::time::interval(TICK);
        'turn: loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Control::Say(text) = on_progress(Progress::Tick) {
                        // A prompt to a busy session joins it: the agent reads it as a new user
                        // message when its current step ends.
                        let mut said = json!({"parts": [{"type": "text", "text": text}]});
                        if let Some(agent) = crate::agent::AgentSpec::of(turn.task).opencode_agent {
                            said["agent"] = json!(agent);
                        }
                        let url = self.url(port, &format!("/session/{session}/prompt_async"), dir);
                        match self.post(&url, &said).await {
                            Ok(_) => log.line("gave the agent the planner's new notes, for its next step"),
                            Err(e) => log.line(&format!("could not give the agent the new notes: {e}")),
                        }
                    }
                }
                ev = events.next() => match ev {
                    Some(data) => {
                        let Ok(ev) = serde_json::from_str::<Value>(&data) else { continue };
                        // Sessions the agent starts itself (its `task` tool) ask through the
                        // same requests; nothing else of theirs belongs to this run's log.
                        if let (Some(child), Some(parent)) = (
                            ev.pointer("/properties/info/id").and_then(Value::as_str),
                            ev.pointer("/properties/info/parentID").and_then(Value::as_str),
                        ) && (parent == session || children.contains(parent))
                        {
                            children.insert(child.to_owned());
                        }
                        let from = ev.pointer("/properties/sessionID").and_then(Value::as_str);
                        let asks = matches!(ev["type"].as_str(), Some("question.asked" | "permission.asked"));
                        let ours = from == Some(session.as_str())
                            || (asks && from.is_some_and(|f| children.contains(f)));
                        if !ours {
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
                        let props = &ev["properties"];
                        let request = props["id"].as_str().unwrap_or("").to_owned();
                        match ev["type"].as_str().unwrap_or("") {
                            "question.asked" => {
                                let mut ask = Ask::question(questions_of(props));
                                ask.request_id = Some(request);
                                log.line(&format!("the agent asks: {}", ask.text()));
                                waiting = Some(ask);
                                break 'turn;
                            }
                            "permission.asked" => {
                                let asked = permission_of(props);
                                let approved = turn.grants.approves(&asked);
                                let mut ask = Ask::permission(asked);
                                if approved {
                                    let url = self.url(port, &format!("/permission/{request}/reply"), dir);
                                    self.post(&url, &json!({"reply": "once"})).await?;
                                    log.line(&format!("approved by an earlier answer: {}", ask.text()));
                                    on_progress(Progress::Approved(&ask));
                                    continue;
                                }
                                ask.request_id = Some(request);
                                log.line(&format!("the agent asks for {}", ask.text()));
                                waiting = Some(ask);
                                break 'turn;
                            }
                            _ => {}
                        }
                        for line in state.lines(&session, &ev, log) {
                            log.raw(&line);
                            let steps = run.usage.steps;
                            if let Some(text) = run.ingest(&line) {
                                log.line(&text);
                            }
                            if run.usage.steps != steps
                                && let Control::Stop(ask) = on_progress(Progress::Step(&run.usage))
                            {
                                log.line(&format!("stopping the agent: {}", ask.text()));
                                self.abort(port, &session, dir).await;
                                waiting = Some(*ask);
                                break 'turn;
                            }
                        }
                        if state.finished {
                            break;
                        }
                    }
                    None => {
                        // The stream ended: the server went away mid-turn. A new one can go on
                        // in the same session (it is in OpenCode's database).
                        restarts += 1;
                        if restarts > MAX_SERVER_RESTARTS_PER_TURN {
                            return Err(io_err("the OpenCode server closed its event stream mid-turn, again after restarting"));
                        }
                        log.line("the OpenCode server went away mid-turn; continuing the session on a new one");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        port = self.ensure().await?;
                        events = self.subscribe(port, dir).await?;
                        state = TurnState::default();
                        self.prompt(port, &turn, &session, INTERRUPTED).await?;
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
            self.abort(port, &session, dir).await;
        }
        if let Some(ask) = &waiting
            && let Some(request_id) = &ask.request_id
        {
            let generation = self.state.lock().await.as_ref().map(|r| r.generation).unwrap_or(0);
            let parked = Parked {
                session: session.clone(),
                request_id: request_id.clone(),
                dir: dir.to_path_buf(),
                generation,
            };
            if let Ok(mut p) = self.parked.lock() {
                p.insert(turn.task.id, parked);
            }
        }
        Ok(AgentExit { exit_code: Some(0), stopped, stderr_tail: String::new(), run, waiting })
    }

    /// A new session for the task, with its permission rules, in the turn's directory.
    async fn create(&self, port: u16, turn: &Turn<'_>) -> std::io::Result<String> {
        let body = json!({
            "title": format!("taskbridge #{}: {}", turn.task.id.0, turn.task.title),
            "permission": permission_rules(turn.task),
        });
        let created: Value = self
            .post(&self.url(port, "/session", turn.dir), &body)
            .await?
            .json()
            .await
            .map_err(io_err)?;
        created["id"].as_str().map(str::to_owned).ok_or_else(|| io_err("no session id"))
    }

    /// Where `session` was made: in `dir`, elsewhere, or not in this server's database at all
    /// (it was made on another host, or OpenCode's data was removed).
    async fn locate(&self, port: u16, dir: &Path, session: &str) -> std::io::Result<Located> {
        let url = self.url(port, &format!("/session/{session}"), dir);
        let resp = self.get(&url).send().await.map_err(io_err)?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(Located::Missing);
        }
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            return Err(io_err(format!("OpenCode server answered {status} to {url}: {text}")));
        }
        let info: Value = resp.json().await.map_err(io_err)?;
        let there = info["directory"].as_str().unwrap_or_default();
        Ok(if crate::git::same_path(Path::new(there), dir) {
            Located::Here
        } else {
            Located::Elsewhere(there.to_owned())
        })
    }

    /// The conversation of `session` as text, for a new session to go on from (empty when it
    /// cannot be read).
    async fn transcript(&self, port: u16, dir: &Path, session: &str) -> String {
        let url = self.url(port, &format!("/session/{session}/message"), dir);
        let read = async {
            let resp = self.get(&url).send().await.ok()?;
            resp.status().is_success().then_some(())?;
            resp.json::<Value>().await.ok()
        };
        match tokio::time::timeout(Duration::from_secs(30), read).await {
            Ok(Some(messages)) => render_transcript(&messages),
            _ => String::new(),
        }
    }

    async fn abort(&self, port: u16, session: &str, dir: &Path) {
        let url = self.url(port, &format!("/session/{session}/abort"), dir);
        if let Err(e) = self.post(&url, &json!({})).await {
            tracing::warn!(error = %e, "aborting the session failed");
        }
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

/// Removes the spare worktrees a dead worker listed.
fn remove_spares(list: &Path) {
    let spares: Vec<Value> = std::fs::read_to_string(list)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    for s in spares {
        if let (Some(repo), Some(dir)) = (s["repo"].as_str(), s["dir"].as_str()) {
            // A spare is detached; one on a branch was taken by a task since.
            if crate::git::head_branch(Path::new(dir)).is_some() {
                continue;
            }
            match crate::git::remove_worktree(Path::new(repo), Path::new(dir)) {
                Ok(()) => tracing::info!(dir, "removed a dead worker's spare worktree"),
                Err(e) => tracing::warn!(dir, error = %e, "removing a dead worker's spare failed"),
            }
        }
    }
    let _ = std::fs::remove_file(list);
}

/// Kills the OpenCode servers that workers on this host left behind when they died, from their
/// pid files; `alive` says whether a worker (by its file name) still runs.
pub fn kill_orphaned_servers(home: &queue::Home, alive: impl Fn(&str) -> bool) {
    let dir = home.root().join("servers");
    let Ok(entries) = std::fs::read_dir(&dir) else { return };
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        if let Some(name) = file.strip_suffix(".spares.json") {
            if !alive(name) {
                remove_spares(&e.path());
            }
            continue;
        }
        let name = file.trim_end_matches(".json").to_owned();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npm_retries_are_turned_off_unless_the_user_set_them_in_either_case() {
        let none = |_: &str| None;
        assert_eq!(npm_retries(none), Some(("npm_config_fetch_retries".into(), "0".into())));
        for key in ["npm_config_fetch_retries", "NPM_CONFIG_FETCH_RETRIES"] {
            let set = |k: &str| (k == key).then(|| "5".to_owned());
            assert_eq!(npm_retries(set), None, "{key} set by the user");
        }
    }

    #[test]
    fn wildcards_match_as_opencode_reads_them() {
        assert!(wildcard_match("git push *", "git push origin main"));
        assert!(wildcard_match("*", ""));
        assert!(wildcard_match("*.lock", "Cargo.lock"));
        assert!(wildcard_match("a?c", "abc"));
        assert!(!wildcard_match("git push *", "git pull"));
        assert!(!wildcard_match("*.lock", "Cargo.lock.bak"));
    }

    #[test]
    fn an_always_grant_covers_its_pattern_and_a_once_grant_is_used_up() {
        let ask = |pat: &str| PermissionAsk {
            permission: "bash".into(),
            patterns: vec![pat.into()],
            target: None,
            always: vec![],
        };
        let mut g = Grants { always: vec![("bash".into(), "git push *".into())], once: vec![] };
        assert!(g.approves(&ask("git push origin")));
        assert!(!g.approves(&ask("rm -rf /")));
        g.once.push(("bash".into(), vec!["rm -rf build".into()]));
        assert!(g.approves(&ask("rm -rf build")));
        assert!(!g.approves(&ask("rm -rf build")), "once means once");
    }

    #[test]
    fn the_flags_denies_come_after_the_ask_rules_so_no_ask_loosens_them() {
        let task = queue::Task {
            ask_rules: vec!["bash:git push*".into()],
            no_shell: true,
            ..crate::sample_task()
        };
        let rules = permission_rules(&task);
        let rules = rules.as_array().unwrap();
        let ask = rules.iter().position(|r| r["action"] == "ask").unwrap();
        let deny = rules.iter().rposition(|r| r["permission"] == "bash").unwrap();
        assert!(deny > ask, "{rules:?}");
        assert_eq!(rules[deny]["action"], "deny");
        assert!(!rules.iter().any(|r| r["permission"] == "question"), "the question tool is on");
    }

    #[test]
    fn wildcards_backtrack_and_a_pattern_must_cover_the_whole_text() {
        assert!(wildcard_match("a*b*c", "a-b-b-c"));
        assert!(wildcard_match("*b", "abab"));
        assert!(wildcard_match("a**", "a"));
        assert!(wildcard_match("", ""));
        assert!(!wildcard_match("", "a"));
        assert!(!wildcard_match("a", ""));
        assert!(!wildcard_match("a?", "a"));
        assert!(!wildcard_match("abc", "abd"));
        assert!(!wildcard_match("a*c", "abcd"));
        assert!(!wildcard_match("ab", "a"));
        assert!(wildcard_match("?", "é"), "a character, not a byte");
        // A star in the text is text like any other.
        assert!(wildcard_match("echo *", "echo **"));
        assert!(wildcard_match("ls *?", "ls a*"));
        assert!(wildcard_match("rm *", "rm -rf *"));
    }

    #[test]
    fn a_grant_covers_every_pattern_asked_of_its_permission_or_any_for_a_star() {
        let ask = |perm: &str, pats: &[&str]| PermissionAsk {
            permission: perm.into(),
            patterns: pats.iter().map(|p| p.to_string()).collect(),
            target: None,
            always: vec![],
        };
        let mut g = Grants { always: vec![("bash".into(), "git *".into())], once: vec![] };
        assert!(g.approves(&ask("bash", &["git status", "git log"])));
        assert!(!g.approves(&ask("bash", &["git status", "rm x"])), "every pattern, not one");
        assert!(!g.approves(&ask("edit", &["git status"])), "only its own permission");
        assert!(!g.approves(&ask("bash", &[])), "a request naming nothing is asked");
        g.always.push(("*".into(), "src/*".into()));
        assert!(g.approves(&ask("edit", &["src/lib.rs"])));
        // A once grant is for the same permission and the same patterns only.
        g.once.push(("edit".into(), vec!["README.md".into()]));
        assert!(!g.approves(&ask("write", &["README.md"])));
        assert!(!g.approves(&ask("edit", &["README.md", "x"])));
        assert!(g.approves(&ask("edit", &["README.md"])));
        assert!(g.once.is_empty());
    }

    #[test]
    fn a_transcript_has_each_messages_text_and_tool_calls_with_long_output_cut() {
        assert_eq!(render_transcript(&json!([])), "");
        let long = "x".repeat(TRANSCRIPT_OUTPUT_CHARS + 5);
        let messages = json!([
            {"info": {"role": "user"}, "parts": [
                {"type": "text", "text": " Add parse() "},
                {"type": "text", "text": "hidden", "synthetic": true},
                {"type": "text", "text": "   "},
            ]},
            {"info": {"role": "assistant"}, "parts": [
                {"type": "tool", "tool": "bash", "state": {"input": {"command": "ls"}, "output": long}},
                {"type": "tool", "tool": "edit", "state": {"input": {}, "error": "denied"}},
                {"type": "reasoning", "text": "thinking"},
                {"type": "text", "text": "Done."},
            ]},
        ]);
        let t = render_transcript(&messages);
        assert!(t.starts_with("The conversation so far"), "{t}");
        assert!(t.ends_with("---\n\n"), "{t}");
        assert!(t.contains("[user] Add parse()\n\n"), "{t}");
        assert!(!t.contains("hidden") && !t.contains("thinking"), "{t}");
        let cut = format!("[tool bash] {{\"command\":\"ls\"}}\n{}… (cut)\n\n", "x".repeat(2_000));
        assert!(t.contains(&cut), "{t}");
        assert!(t.contains("[tool edit] {}\ndenied\n\n"), "{t}");
        assert!(t.contains("[assistant] Done.\n\n"), "{t}");
        let short = render_transcript(&json!([{"info": {"role": "assistant"}, "parts": [
            {"type": "tool", "tool": "bash", "state": {"input": {}, "output": "x".repeat(2_000)}}
        ]}]));
        assert!(
            short.contains(&format!("\n{}\n\n", "x".repeat(2_000))),
            "exactly the limit is kept"
        );
        assert!(!short.contains("(cut)"));
    }

    #[test]
    fn a_password_is_64_hex_digits_never_the_same_twice() {
        let (a, b) = (random_password(), random_password());
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn a_directory_is_percent_encoded_in_its_query() {
        assert_eq!(
            directory_query(Path::new("/home/me/my repo/a&b=c~_.-")),
            "directory=/home/me/my%20repo/a%26b%3Dc~_.-"
        );
        assert_eq!(directory_query(Path::new("/tmp/é")), "directory=/tmp/%C3%A9");
    }

    #[test]
    fn each_flag_denies_its_own_permissions_after_everything_is_allowed() {
        let rules = |readonly, no_shell, no_network| {
            let task = queue::Task {
                readonly,
                no_shell,
                no_network,
                ask_rules: vec!["edit:*.lock".into(), "not a rule".into()],
                ..crate::sample_task()
            };
            permission_rules(&task)
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    format!(
                        "{} {} {}",
                        r["permission"].as_str().unwrap(),
                        r["pattern"].as_str().unwrap(),
                        r["action"].as_str().unwrap()
                    )
                })
                .collect::<Vec<_>>()
        };
        let first = ["* * allow", "external_directory * deny", "edit *.lock ask"];
        assert_eq!(rules(false, false, false), first);
        let mut all = first.to_vec();
        all.extend(["edit * deny", "bash * deny", "webfetch * deny", "websearch * deny"]);
        assert_eq!(rules(true, true, true), all);
        let mut net = first.to_vec();
        net.extend(["webfetch * deny", "websearch * deny"]);
        assert_eq!(rules(false, false, true), net);
    }

    #[test]
    fn questions_and_permissions_are_read_from_opencodes_events() {
        let qs = questions_of(&json!({"questions": [
            {"question": "Which DB?", "header": "DB", "multiple": true,
             "options": [{"label": "SQLite", "description": "a file"}, {"label": "Postgres"}]},
            {"question": "Go?"},
        ]}));
        assert_eq!(qs.len(), 2);
        assert_eq!(
            (qs[0].question.as_str(), qs[0].header.as_deref(), qs[0].multiple),
            ("Which DB?", Some("DB"), true)
        );
        assert_eq!(
            qs[0]
                .options
                .iter()
                .map(|o| (o.label.as_str(), o.description.as_deref()))
                .collect::<Vec<_>>(),
            vec![("SQLite", Some("a file")), ("Postgres", None)]
        );
        assert_eq!((qs[1].header.clone(), qs[1].options.len(), qs[1].multiple), (None, 0, false));
        assert!(questions_of(&json!({})).is_empty());

        let p = permission_of(&json!({"permission": "bash", "patterns": ["git push *", 3],
            "always": ["git push *"], "metadata": {"command": "git push origin"}}));
        assert_eq!(
            p,
            PermissionAsk {
                permission: "bash".into(),
                patterns: vec!["git push *".into()],
                target: Some("git push origin".into()),
                always: vec!["git push *".into()],
            }
        );
        let p = permission_of(&json!({"permission": "edit", "patterns": ["a.rs", "b.rs"]}));
        assert_eq!(p.target.as_deref(), Some("a.rs, b.rs"), "the patterns when no metadata says");
        let p = permission_of(&json!({"metadata": {"filePath": "/x"}}));
        assert_eq!((p.permission.as_str(), p.target.as_deref()), ("?", Some("/x")));
        assert_eq!(permission_of(&json!({})).target, None);
    }

    #[test]
    fn a_workers_files_are_named_without_separators() {
        assert_eq!(server_file_name("host:123/a"), "host_123_a");
        let home = queue::Home::resolve(Some("/h".into())).unwrap();
        assert_eq!(spares_file(&home, "h:1"), Path::new("/h/servers/h_1.spares.json"));
    }

    fn turn() -> TurnState {
        TurnState {
            roles: HashMap::new(),
            running_tools: HashSet::new(),
            busy: false,
            finished: false,
        }
    }

    #[test]
    fn a_turn_becomes_run_lines_and_ends_when_the_busy_session_goes_idle() {
        let logs = tempfile::tempdir().unwrap();
        let mut log = TaskLog::open(logs.path(), 1);
        let mut t = turn();
        let ev = |ty: &str, props: Value| json!({"type": ty, "properties": props});
        let part = |p: Value| ev("message.part.updated", json!({"part": p}));
        // Idle before the turn was busy is the previous turn's end.
        assert!(t.lines("s", &ev("session.idle", json!({})), &mut log).is_empty());
        t.lines("s", &ev("session.status", json!({"status": {"type": "idle"}})), &mut log);
        assert!(!t.finished);
        t.lines(
            "s",
            &ev("message.updated", json!({"info": {"id": "u1", "role": "user"}})),
            &mut log,
        );
        t.lines(
            "s",
            &ev("message.updated", json!({"info": {"id": "a1", "role": "assistant"}})),
            &mut log,
        );
        assert!(
            t.lines(
                "s",
                &part(json!({"messageID": "u1", "type": "text", "time": {"end": 1}})),
                &mut log
            )
            .is_empty(),
            "the user's own text is no output"
        );
        let kinds = |lines: Vec<String>| -> Vec<String> {
            lines
                .iter()
                .map(|l| {
                    serde_json::from_str::<Value>(l).unwrap()["type"].as_str().unwrap().to_owned()
                })
                .collect()
        };
        assert_eq!(
            kinds(t.lines("s", &part(json!({"messageID": "a1", "type": "step-start"})), &mut log)),
            ["step_start"]
        );
        assert!(
            t.lines("s", &part(json!({"messageID": "a1", "type": "text", "time": {}})), &mut log)
                .is_empty(),
            "text still being written"
        );
        assert_eq!(
            kinds(t.lines(
                "s",
                &part(json!({"messageID": "a1", "type": "text", "time": {"end": 2}})),
                &mut log
            )),
            ["text"]
        );
        assert_eq!(
            kinds(t.lines(
                "s",
                &part(json!({"messageID": "a1", "type": "reasoning", "time": {"end": 2}})),
                &mut log
            )),
            ["reasoning"]
        );
        let tool = |status: &str| {
            part(
                json!({"messageID": "a1", "type": "tool", "callID": "c1", "tool": "bash", "state": {"status": status, "input": {"command": "ls"}}}),
            )
        };
        assert!(t.lines("s", &tool("running"), &mut log).is_empty());
        assert!(t.lines("s", &tool("running"), &mut log).is_empty());
        assert!(t.lines("s", &tool("pending"), &mut log).is_empty());
        assert_eq!(kinds(t.lines("s", &tool("completed"), &mut log)), ["tool_use"]);
        assert_eq!(kinds(t.lines("s", &tool("error"), &mut log)), ["tool_use"]);
        assert_eq!(
            kinds(t.lines("s", &part(json!({"messageID": "a1", "type": "step-finish"})), &mut log)),
            ["step_finish"]
        );
        let err =
            t.lines("s", &ev("session.error", json!({"error": {"name": "APIError"}})), &mut log);
        assert_eq!(
            serde_json::from_str::<Value>(&err[0]).unwrap(),
            json!({"type": "error", "sessionID": "s", "error": {"name": "APIError"}})
        );
        assert!(t.lines("s", &ev("other", json!({})), &mut log).is_empty());
        // The running tool was logged once, by name and target.
        let text =
            std::fs::read_to_string(crate::logs::log_path(logs.path(), 1)).unwrap_or_default();
        assert_eq!(text.matches("(running)").count(), 1, "{text}");
        assert!(!t.finished);
        t.lines("s", &ev("session.status", json!({"status": {"type": "busy"}})), &mut log);
        t.lines("s", &ev("session.status", json!({"status": {"type": "idle"}})), &mut log);
        assert!(t.finished);
        let mut t2 = turn();
        t2.busy = true;
        t2.lines("s", &ev("session.idle", json!({})), &mut log);
        assert!(t2.finished, "session.idle ends a busy turn too");
    }

    #[test]
    fn a_dead_workers_server_files_and_detached_spares_are_cleared_and_a_live_ones_kept() {
        let sh = crate::git::tests::git;
        let repo = tempfile::tempdir().unwrap();
        sh(repo.path(), &["init", "-q", "-b", "main"]);
        std::fs::write(repo.path().join("a.txt"), "a\n").unwrap();
        sh(repo.path(), &["add", "."]);
        sh(repo.path(), &["commit", "-qm", "init"]);
        let base = crate::git::resolve_repo(repo.path(), None).unwrap().base;
        let root = tempfile::tempdir().unwrap();
        let spare = root.path().join("spare");
        let taken = root.path().join("taken");
        crate::git::prepare_worktree(repo.path(), &base, 1, None, &spare, None).unwrap();
        crate::git::park_worktree(&spare).unwrap();
        crate::git::prepare_worktree(repo.path(), &base, 2, None, &taken, None).unwrap();

        let home = queue::Home::resolve(Some(root.path().join("home"))).unwrap();
        let servers = home.root().join("servers");
        std::fs::create_dir_all(&servers).unwrap();
        let listed = json!([
            {"repo": repo.path(), "dir": spare},
            {"repo": repo.path(), "dir": taken},
        ]);
        std::fs::write(servers.join("dead.spares.json"), listed.to_string()).unwrap();
        std::fs::write(servers.join("alive.spares.json"), listed.to_string()).unwrap();
        // No process has this pid, so nothing is killed; the file of a dead worker still goes.
        std::fs::write(servers.join("dead.json"), r#"{"pid": 2147483000}"#).unwrap();
        std::fs::write(servers.join("alive.json"), r#"{"pid": 2147483000}"#).unwrap();
        kill_orphaned_servers(&home, |name| name == "alive");
        let mut left: Vec<String> = std::fs::read_dir(&servers)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, vec!["alive.json", "alive.spares.json"]);
        assert!(!spare.exists(), "the dead worker's detached spare is removed");
        assert!(taken.join("a.txt").exists(), "a spare a task took since is its worktree now");
    }

    #[test]
    fn the_environment_plugin_is_written_into_the_home_and_blanks_the_password() {
        let root = tempfile::tempdir().unwrap();
        let home = queue::Home::resolve(Some(root.path().join("home"))).unwrap();
        let path = env_plugin(&home).unwrap();
        assert_eq!(path, home.root().join("opencode-plugin/taskbridge-env.js"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(r#"output.env.OPENCODE_SERVER_PASSWORD = "";"#), "{text}");
        // Written again each start, so a changed plugin replaces an old one.
        std::fs::write(&path, "old").unwrap();
        env_plugin(&home).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), ENV_PLUGIN);
    }

    #[tokio::test]
    async fn an_event_streams_data_lines_are_read_across_chunks_and_nothing_else() {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut sock, &mut request).await;
            sock.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
                  data: {\"a\":1}\n\nda",
            )
            .await
            .unwrap();
            sock.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            sock.write_all(b"ta: two\r\n: a comment\nevent: x\ndata:three\n\n").await.unwrap();
        });
        crate::notify::install_tls();
        let resp = reqwest::get(format!("http://127.0.0.1:{port}/event")).await.unwrap();
        let mut lines = SseLines::new(resp);
        assert_eq!(lines.next().await.as_deref(), Some(r#"{"a":1}"#));
        assert_eq!(lines.next().await.as_deref(), Some("two"), "a line split between chunks");
        assert_eq!(lines.next().await.as_deref(), Some("three"));
        assert_eq!(lines.next().await, None, "the stream ended");
        server.await.unwrap();
    }
}
