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

//! Where each part lives: the server process (`server.rs`: start, restart, the files a dead
//! worker's server is found by), its HTTP routes (`client.rs`), its event stream read for one
//! session (`protocol.rs`), the requests parked while their tasks wait (`parked.rs`), and the
//! sessions made ahead in spare directories for the next task (`ready.rs`). The rules a session
//! is created with are the crate's policy (`crate::policy`).

mod client;
mod parked;
mod protocol;
mod ready;
mod server;

pub use server::{
    env_plugin, kill_orphaned_servers, npm_offline, plugin_dir, random_password, record_pid,
    server_file_name, spares_file,
};

use crate::events::Usage;
use crate::logs::TaskLog;
use crate::policy::Grants;
use crate::process::{AgentExit, StopReason};
use crate::sandbox::Wall;
use client::Located;
use parked::Parked;
use protocol::Following;
use queue::{Ask, Task, TaskId};
use serde_json::{Value, json};
use server::Running;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// A turn that went on after the server died mid-turn is prompted again at most this often.
const MAX_SERVER_RESTARTS_PER_TURN: u32 = 2;

/// The prompt that continues a session whose run was interrupted.
pub const INTERRUPTED: &str = include_str!("../../../../assets/interrupted.md");

/// The worker's warm servers, one per wall: a repository's (every task of it whose rules are
/// the repository's), a task's own (read-only, no network, a directory outside the
/// repository's), or, with no sandbox, one for every task. The worker decides which
/// (`crate::run`'s wall stage); a server is made on first use and started on its first turn.
pub struct Servers {
    program: PathBuf,
    env: Vec<(String, String)>,
    dir: PathBuf,
    worker_file: String,
    by_wall: std::sync::Mutex<HashMap<String, Arc<ServeAgent>>>,
}

impl Servers {
    pub fn new(
        program: PathBuf,
        env: Vec<(String, String)>,
        home: &queue::Home,
        worker: &str,
    ) -> Self {
        crate::notify::install_tls();
        Servers {
            program,
            env,
            dir: home.root().join("servers"),
            worker_file: server_file_name(worker),
            by_wall: Default::default(),
        }
    }

    /// The server behind the wall named `key`; when there is none yet, `make` gives the wall
    /// and the environment it adds (its TMPDIR, the proxy).
    pub fn get<E>(
        &self,
        key: &str,
        make: impl FnOnce() -> Result<(Option<Arc<Wall>>, Vec<(String, String)>), E>,
    ) -> Result<Arc<ServeAgent>, E> {
        let mut by_wall = self.by_wall.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = by_wall.get(key) {
            return Ok(s.clone());
        }
        let (wall, more) = make()?;
        let mut env = self.env.clone();
        env.extend(more);
        let server = Arc::new(ServeAgent {
            program: self.program.clone(),
            env,
            wall,
            pid_file: self.dir.join(format!("{}@{key}.json", self.worker_file)),
            http: client::Http::new(server::random_password()),
            state: tokio::sync::Mutex::new(None),
            generation: Default::default(),
            parked: Default::default(),
            ready: Default::default(),
        });
        by_wall.insert(key.to_owned(), server.clone());
        Ok(server)
    }

    /// Stops the server behind `key` (a task's own, after its run), if there is one.
    pub async fn stop(&self, key: &str) {
        let server = self.by_wall.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
        if let Some(s) = server {
            s.shutdown().await;
        }
    }

    fn all(&self) -> Vec<Arc<ServeAgent>> {
        self.by_wall.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// Stops every server and everything they started, deleting the sessions they made ahead.
    pub async fn shutdown(&self) {
        for s in self.all() {
            s.forget_all_ready().await;
            s.shutdown().await;
        }
    }

    /// Kills what any server still runs in `dir`, a task's worktree whose run is over: a
    /// command the agent left behind, detached or not, must not outlive its task (nor write
    /// the directory the repository's next task may reuse). Returns how many.
    pub async fn kill_working_in(&self, dir: &Path) -> usize {
        let mut killed = 0;
        for s in self.all() {
            killed += s.kill_working_in(dir).await;
        }
        killed
    }

    /// Deletes the sessions made ahead in `dir` (a spare being removed), on every server.
    pub async fn forget_ready(&self, dir: &Path) {
        for s in self.all() {
            s.forget_ready(dir).await;
        }
    }

    /// The tasks whose agents are parked in any of the servers.
    pub fn parked_tasks(&self) -> Vec<TaskId> {
        self.all().iter().flat_map(|s| s.parked_tasks()).collect()
    }

    /// [`ServeAgent::sweep_parked`] on every server.
    pub async fn sweep_parked(&self, still_waiting: impl Fn(TaskId) -> bool) {
        for s in self.all() {
            s.sweep_parked(&still_waiting).await;
        }
    }
}

/// One OpenCode server: started on first use, started again if it died.
pub struct ServeAgent {
    program: PathBuf,
    env: Vec<(String, String)>,
    /// The Landlock ruleset the server (and so every command its agents run) is raised in.
    wall: Option<Arc<Wall>>,
    /// `<home>/servers/<worker>@<wall>.json`: the server's pid and start time, so the next
    /// worker on this host can kill a server whose worker was killed.
    pid_file: PathBuf,
    http: client::Http,
    state: tokio::sync::Mutex<Option<Running>>,
    generation: std::sync::atomic::AtomicU64,
    parked: std::sync::Mutex<HashMap<TaskId, Parked>>,
    /// Sessions made ahead in spare directories, for the next task there.
    ready: std::sync::Mutex<HashMap<PathBuf, ready::Ready>>,
}

/// How a turn begins.
pub enum Delivery {
    /// A prompt: a new task, an answer the server can no longer take natively, a continuation.
    Prompt(String),
    /// The answer to the request the agent is blocked on (`path` is the reply route).
    Reply { path: String, body: Value },
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
    /// Whether to make a session in the directory for the next task there, once the model has
    /// been asked: the task shares its repository's server, and may leave the directory to the
    /// repository's next task.
    pub ahead: bool,
}

/// What OpenCode's session list calls a task's session.
fn session_title(task: &Task) -> String {
    format!("taskbridge #{}: {}", task.id.0, task.title)
}

fn io_err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl ServeAgent {
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
        // A session made ahead is given its title once the model has been asked.
        let mut untitled = None;
        let (mut events, session) = match self.ready_for(port, &turn, log).await {
            Some((events, session)) => {
                untitled = Some(session_title(turn.task));
                (events, session)
            }
            // Subscribe before prompting, so no event of the turn is missed; the session is made
            // (or found) meanwhile, one round trip to the server instead of two before the prompt.
            None => {
                tokio::try_join!(self.subscribe(port, dir), self.session_for(port, &mut turn, log))?
            }
        };
        log.line(&format!("OpenCode server on port {port}: session {session}"));
        on_progress(Progress::Session(&session));
        let mut follow = Following::new(&session);
        match std::mem::replace(&mut turn.delivery, Delivery::Prompt(String::new())) {
            Delivery::Prompt(text) => self.prompt(port, &turn, &session, &text).await?,
            Delivery::Reply { path, body } => {
                // The agent is mid-turn, blocked on the request this answers.
                follow.busy();
                self.post(&self.url(port, &path, dir), &body).await?;
                log.line("answered the agent's pending request; its turn goes on");
            }
        }

        let mut stopped = None;
        let mut waiting = None;
        let mut restarts = 0;
        let mut asked = false;
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Control::Say(text) = on_progress(Progress::Tick) {
                        self.say(port, &turn, &session, &text, log).await;
                    }
                }
                ev = events.next() => match ev {
                    Some(data) => {
                        let Ok(ev) = serde_json::from_str::<Value>(&data) else { continue };
                        if !asked && protocol::step_started(&ev, &session) {
                            // While the model works, OpenCode is free for what the turn's
                            // prompt need not wait for.
                            asked = true;
                            if let Some(title) = untitled.take() {
                                self.give_title(port, dir, &session, title);
                            }
                            if turn.ahead {
                                self.make_ready(dir).await;
                            }
                        }
                        match self.event(port, &mut turn, &mut follow, &ev, log, on_progress).await? {
                            Next::Go => {}
                            Next::Finished => break,
                            Next::Wait(ask) => {
                                waiting = Some(*ask);
                                break;
                            }
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
                        follow.restart();
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
            self.park(turn.task.id, &session, request_id, dir).await;
        }
        if let Some(title) = untitled.take() {
            // The turn ended before the model was asked (stopped, or it failed first).
            self.give_title(port, dir, &session, title);
        }
        if stopped.is_none() && waiting.is_none() {
            // The directory's stream goes on, with the session made ahead for the next task.
            self.hand_over(dir, events);
        }
        let run = follow.into_run();
        Ok(AgentExit { exit_code: Some(0), stopped, stderr_tail: String::new(), run, waiting })
    }

    /// The session a turn goes on in: a new one, or the one to continue when it was made in
    /// this directory. A session made elsewhere, or on another host, is replaced by a new one
    /// here, given what it needs in its prompt instead.
    async fn session_for(
        &self,
        port: u16,
        turn: &mut Turn<'_>,
        log: &mut TaskLog,
    ) -> std::io::Result<String> {
        let Some(s) = turn.session.clone() else { return self.create(port, turn).await };
        let (fresh, prompt) = match self.locate(port, turn.dir, &s).await? {
            Located::Here => return Ok(s),
            Located::Elsewhere(there) => {
                // A session runs its tools in the directory it was made in whatever the request
                // says, and its events go to that directory's subscribers: prompted from here it
                // would write into whatever lives there now (another task's worktree). A new
                // session here gets the conversation as text instead.
                let earlier = self.transcript(port, turn.dir, &s).await;
                let fresh = self.create(port, turn).await?;
                log.line(&format!(
                    "session {s} belongs to {there}, which another task holds; going on in a new \
                     session {fresh} here, given that conversation as text"
                ));
                (fresh, turn.without_session.take().map(|alone| format!("{earlier}{alone}")))
            }
            Located::Missing => {
                let fresh = self.create(port, turn).await?;
                log.line(&format!(
                    "session {s} is not in this host's OpenCode; starting {fresh} afresh"
                ));
                (fresh, turn.without_session.take())
            }
        };
        if let (Delivery::Prompt(text), Some(prompt)) = (&mut turn.delivery, prompt) {
            *text = prompt;
        }
        Ok(fresh)
    }

    /// One event of the server's stream, for this turn: a question or a permission request the
    /// agent blocks on (answered here when a grant covers it), or what the agent did, which
    /// goes into the log and the run, and may end the turn or make the caller stop it.
    async fn event(
        &self,
        port: u16,
        turn: &mut Turn<'_>,
        follow: &mut Following,
        ev: &Value,
        log: &mut TaskLog,
        on_progress: &mut (dyn FnMut(Progress<'_>) -> Control + Send),
    ) -> std::io::Result<Next> {
        if !follow.ours(ev) {
            return Ok(Next::Go);
        }
        let request = ev.pointer("/properties/id").and_then(Value::as_str).unwrap_or("");
        if let Some(mut ask) = protocol::decision(ev) {
            if let Some(asked) = ask.permission.as_ref()
                && turn.grants.approves(asked)
            {
                let url = self.url(port, &format!("/permission/{request}/reply"), turn.dir);
                self.post(&url, &json!({"reply": "once"})).await?;
                log.line(&format!("approved by an earlier answer: {}", ask.text()));
                on_progress(Progress::Approved(&ask));
                return Ok(Next::Go);
            }
            ask.request_id = Some(request.to_owned());
            log.line(&match ask.permission {
                Some(_) => format!("the agent asks for {}", ask.text()),
                None => format!("the agent asks: {}", ask.text()),
            });
            return Ok(Next::Wait(Box::new(ask)));
        }
        if let Some(usage) = follow.read(ev, log)
            && let Control::Stop(ask) = on_progress(Progress::Step(usage))
        {
            log.line(&format!("stopping the agent: {}", ask.text()));
            self.abort(port, follow.session(), turn.dir).await;
            return Ok(Next::Wait(ask));
        }
        Ok(if follow.finished() { Next::Finished } else { Next::Go })
    }

    /// Gives a busy session a note from the planner: a prompt to a busy session joins it, and
    /// the agent reads it as a new user message when its current step ends.
    async fn say(&self, port: u16, turn: &Turn<'_>, session: &str, text: &str, log: &mut TaskLog) {
        let mut said = json!({"parts": [{"type": "text", "text": text}]});
        if let Some(agent) = crate::agent::AgentSpec::of(turn.task).opencode_agent {
            said["agent"] = json!(agent);
        }
        let url = self.url(port, &format!("/session/{session}/prompt_async"), turn.dir);
        match self.post(&url, &said).await {
            Ok(_) => log.line("gave the agent the planner's new notes, for its next step"),
            Err(e) => log.line(&format!("could not give the agent the new notes: {e}")),
        }
    }
}

/// What an event means for the turn.
enum Next {
    Go,
    Finished,
    /// The agent blocks on a decision, or the caller stopped it with one.
    Wait(Box<Ask>),
}
