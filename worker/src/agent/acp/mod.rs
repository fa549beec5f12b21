//! Any agent that speaks the Agent Client Protocol (ACP: JSON-RPC over the agent's stdio), kept
//! warm as the OpenCode server is: one agent process per wall (a repository's, a task's own),
//! holding a session per task. OpenCode 2 runs this way by default (`opencode acp`; its HTTP API
//! moved, and 1.x speaks ACP too), and so does every `[agents.NAME]` of the configuration.
//!
//! A turn is a `session/prompt`; the agent's `session/update`s are read into the task's log and
//! events as they come (`wire.rs`). The agent asks for every tool call it makes
//! (`session/request_permission`; OpenCode is configured to ask), and TaskBridge answers from the
//! task's rules: allowed, denied, or a decision the task waits for. Waiting, the request is
//! *parked* here with its session, and when this worker claims the answered task again the
//! answer is the request's response: the same turn goes on. Where the request is gone (the
//! process died, another worker claimed the task) the answer is a prompt in the same session,
//! loaded again with `session/load` in a new process. OpenCode 2's `question` tool arrives as a
//! form (`elicitation/create`) and is a question the same way.
//!
//! Stopping a turn is `session/cancel`, then whatever the agent still runs in the task's
//! worktree is killed; a process of the task's own goes with its run. An agent that speaks the
//! protocol wrongly (a line that is not JSON-RPC, a request TaskBridge does not know, an exit
//! mid-turn) ends the turn with an error that says so.

mod conn;
pub mod ledger;
mod wire;

pub use conn::Launch;

use crate::events::{AgentError, AgentEvent, RunLog, Usage};
use crate::logs::TaskLog;
use crate::policy::{Decision, Grants};
use crate::process::{AgentExit, StopReason};
use crate::sandbox::Wall;
use conn::{Conn, Incoming, io_err, protocol_err};
use queue::{Ask, Task, TaskId};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

pub use crate::agent::opencode_serve::{Control, Progress};

/// How long a cancelled turn may take to answer before it is taken as stopped.
const CANCEL_GRACE: Duration = Duration::from_secs(3);

/// How often a turn asks its caller whether there is something to tell the agent.
const TICK: Duration = Duration::from_secs(1);

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The worker's ACP agent processes, one per agent and wall.
pub struct AcpAgents {
    /// `<home>/servers/<worker>`: each process's pid file starts so (see `record_pid`).
    files: PathBuf,
    by_key: std::sync::Mutex<HashMap<String, Arc<AcpAgent>>>,
}

impl AcpAgents {
    pub fn new(home: &queue::Home, worker: &str) -> AcpAgents {
        let name = crate::agent::opencode_serve::server_file_name(worker);
        AcpAgents { files: home.root().join("servers").join(name), by_key: Default::default() }
    }

    /// The process of `launch` behind the wall named `wall_key`; `make` gives the wall and the
    /// environment it adds when there is none yet.
    pub fn get<E>(
        &self,
        launch: &Launch,
        wall_key: &str,
        make: impl FnOnce() -> Result<(Option<Arc<Wall>>, Vec<(String, String)>), E>,
    ) -> Result<Arc<AcpAgent>, E> {
        let key = format!("{}@{wall_key}", launch.name);
        let mut by_key = lock(&self.by_key);
        if let Some(a) = by_key.get(&key) {
            return Ok(a.clone());
        }
        let (wall, env) = make()?;
        let file = crate::agent::opencode_serve::server_file_name(&key);
        let pid_file = PathBuf::from(format!("{}@acp-{file}.json", self.files.display()));
        let agent = Arc::new(AcpAgent {
            launch: launch.clone(),
            pid_file,
            wall,
            env,
            state: Default::default(),
            generation: Default::default(),
            live: Default::default(),
            models: Default::default(),
            ready: Default::default(),
            costs: Default::default(),
            parked: Default::default(),
        });
        by_key.insert(key, agent.clone());
        Ok(agent)
    }

    fn all(&self) -> Vec<Arc<AcpAgent>> {
        lock(&self.by_key).values().cloned().collect()
    }

    /// Stops the processes behind `wall_key` (a task's own, after its run).
    pub async fn stop(&self, wall_key: &str) {
        let suffix = format!("@{wall_key}");
        let gone: Vec<Arc<AcpAgent>> = {
            let mut by_key = lock(&self.by_key);
            let keys: Vec<String> =
                by_key.keys().filter(|k| k.ends_with(&suffix)).cloned().collect();
            keys.iter().filter_map(|k| by_key.remove(k)).collect()
        };
        for a in gone {
            a.shutdown().await;
        }
    }

    /// Forgets the sessions made ahead in `dir` (a spare being removed), on every agent.
    pub fn forget_ready(&self, dir: &Path) {
        for a in self.all() {
            a.forget_ready(dir);
        }
    }

    /// Stops every agent process and everything they started.
    pub async fn shutdown(&self) {
        for a in self.all() {
            a.shutdown().await;
        }
    }

    /// Kills what any agent still runs in `dir`, a task's worktree whose run is over.
    pub async fn kill_working_in(&self, dir: &Path) -> usize {
        let mut killed = 0;
        for a in self.all() {
            killed += a.kill_working_in(dir).await;
        }
        killed
    }

    /// The tasks whose agents are parked on a decision here.
    pub fn parked_tasks(&self) -> Vec<TaskId> {
        self.all()
            .iter()
            .flat_map(|a| lock(&a.parked).keys().copied().collect::<Vec<_>>())
            .collect()
    }

    /// Cancels the turns parked for tasks that `still_waiting` no longer sees waiting.
    pub async fn sweep_parked(&self, still_waiting: impl Fn(TaskId) -> bool) {
        for a in self.all() {
            let gone: Vec<Parked> = {
                let mut parked = lock(&a.parked);
                let ids: Vec<TaskId> =
                    parked.keys().copied().filter(|id| !still_waiting(*id)).collect();
                ids.iter().filter_map(|id| parked.remove(id)).collect()
            };
            let conn = a.state.lock().await.clone();
            for p in gone {
                if let Some(c) = &conn {
                    c.cancel(&p.session);
                    c.unroute(&p.session);
                }
            }
        }
    }
}

/// One ACP agent process behind one wall: started on first use, again if it died.
pub struct AcpAgent {
    launch: Launch,
    /// Where the process's pid is kept for a later worker, should this one be killed.
    pid_file: PathBuf,
    wall: Option<Arc<Wall>>,
    env: Vec<(String, String)>,
    state: tokio::sync::Mutex<Option<Arc<Conn>>>,
    generation: std::sync::atomic::AtomicU64,
    /// The sessions the live process holds, and the directory each was made in.
    live: Arc<std::sync::Mutex<HashMap<String, PathBuf>>>,
    /// Each live session's model, as its `model` option last said.
    models: Arc<std::sync::Mutex<HashMap<String, String>>>,
    /// Sessions made ahead, by directory, for the next task there.
    ready: Arc<std::sync::Mutex<HashMap<PathBuf, String>>>,
    /// Each session's cost as the agent last counted it (its `usage_update`s are the
    /// session's total, not the turn's).
    costs: std::sync::Mutex<HashMap<String, f64>>,
    parked: std::sync::Mutex<HashMap<TaskId, Parked>>,
}

/// A turn waiting on a decision: the agent blocks on `pending`, the turn's messages keep
/// arriving on `rx`.
struct Parked {
    session: String,
    request_id: String,
    generation: u64,
    rx: mpsc::UnboundedReceiver<Incoming>,
    pending: Pending,
    turn: TurnState,
}

enum Pending {
    Permission { params: Value, responder: agent_client_protocol::v1::Responder<Value> },
    Form { params: Value, responder: agent_client_protocol::v1::Responder<Value> },
}

/// What a turn has read so far, carried across a parked decision.
struct TurnState {
    updates: wire::Updates,
    run: RunLog,
    /// When the turn's first prompt went out (Unix ms): OpenCode's steps since then are its.
    since_ms: i64,
    /// The session's cost before the turn, as the agent counts it.
    cost_before: Option<f64>,
    /// Prompts to send in the session once its current one is answered (an answer's feedback,
    /// the planner's notes).
    queued: Vec<String>,
}

/// What a turn needs.
pub struct Turn<'a> {
    pub task: &'a Task,
    pub dir: &'a Path,
    /// The prompt, when no parked request takes the answer natively.
    pub prompt: String,
    /// The answer to the decision the task waited on, with the notes that came with it.
    pub answer: Option<(Ask, String, Vec<String>)>,
    pub model: Option<String>,
    /// The session to continue, or `None` for a new one.
    pub session: Option<String>,
    /// The prompt to send instead when `session` cannot be had here.
    pub without_session: Option<String>,
    pub grants: Grants,
    /// MCP servers handed to a new session (the reverse bridge).
    pub mcp_servers: Value,
    /// OpenCode's database, where its steps' spend is read exactly.
    pub ledger: Option<PathBuf>,
    /// Make a session in the directory for the next task there, once the model has been asked
    /// (the directory may be kept for the repository's next task).
    pub ahead: bool,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl AcpAgent {
    /// The live process, started when there is none (or it died).
    async fn ensure(&self) -> std::io::Result<Arc<Conn>> {
        let mut state = self.state.lock().await;
        if let Some(c) = state.as_ref()
            && c.alive()
        {
            return Ok(c.clone());
        }
        if let Some(dead) = state.take() {
            dead.kill();
            tracing::warn!(agent = %self.launch.name, "the ACP agent had died; starting a new one");
        }
        // What a dead process held is gone with it (a session loaded again says its model anew).
        lock(&self.live).clear();
        lock(&self.ready).clear();
        lock(&self.models).clear();
        let conn = Arc::new(Conn::start(&self.launch, self.wall.as_ref(), &self.env).await?);
        crate::agent::opencode_serve::record_pid(&self.pid_file, i64::from(conn.pid));
        self.generation.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tree = Arc::downgrade(&conn.tree);
        tokio::spawn(async move {
            while let Some(tree) = tree.upgrade() {
                if let Ok(mut t) = tree.lock() {
                    t.refresh();
                }
                drop(tree);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        *state = Some(conn.clone());
        Ok(conn)
    }

    fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// What `initialize` said of the agent: its name and version.
    pub async fn agent_info(&self) -> Option<String> {
        let c = self.state.lock().await.clone()?;
        let info = c.init.get("agentInfo")?;
        let name = info.get("name").and_then(Value::as_str).unwrap_or(&self.launch.name);
        let version = info.get("version").and_then(Value::as_str).unwrap_or("?");
        Some(format!("{name} {version}"))
    }

    /// The Landlock ABI of the wall the process runs in, if it has one.
    pub fn wall_abi(&self) -> Option<i32> {
        self.wall.as_ref().map(|w| w.abi())
    }

    pub async fn shutdown(&self) {
        lock(&self.parked).clear();
        if let Some(c) = self.state.lock().await.take() {
            c.kill();
        }
        let _ = std::fs::remove_file(&self.pid_file);
    }

    pub async fn kill_working_in(&self, dir: &Path) -> usize {
        let Some(c) = self.state.lock().await.clone() else { return 0 };
        c.tree.lock().map_or(0, |mut t| t.kill_working_in(dir))
    }

    /// Whether the decision `request_id` of `task` is still parked here, live, to be answered
    /// natively.
    pub async fn holds_parked(&self, task: TaskId, request_id: &str) -> bool {
        let live = self.state.lock().await.as_ref().is_some_and(|c| c.alive());
        let parked = lock(&self.parked);
        live && parked
            .get(&task)
            .is_some_and(|p| p.request_id == request_id && p.generation == self.generation())
    }

    /// Runs one turn to its end, until it is stopped, or until the agent waits on a decision.
    pub async fn run(
        &self,
        mut turn: Turn<'_>,
        log: &mut TaskLog,
        stop: watch::Receiver<Option<StopReason>>,
        deadline: tokio::time::Instant,
        on_progress: &mut (dyn FnMut(Progress<'_>) -> Control + Send),
    ) -> std::io::Result<AgentExit> {
        let conn = self.ensure().await?;
        let answer = turn.answer.take();
        let parked = answer.as_ref().and_then(|(ask, _, _)| {
            let id = ask.request_id.as_deref()?;
            let mut p = lock(&self.parked);
            let hit = p.get(&turn.task.id).is_some_and(|x| x.request_id == id);
            if hit { p.remove(&turn.task.id) } else { None }
        });
        let (session, mut rx, mut state) = match (parked, answer) {
            (Some(p), Some((ask, answer, notes))) if p.generation == self.generation() => {
                let queued = self.answer_parked(p.pending, &ask, &answer, &notes, log);
                let mut state = p.turn;
                state.queued.extend(queued);
                (p.session, p.rx, state)
            }
            // No request to answer here: the answer is in the turn's prompt.
            _ => {
                crate::trace::stamp(turn.task.id, "acp.session_asked");
                let session = self.session_for(&conn, &mut turn, log).await?;
                crate::trace::stamp(turn.task.id, "acp.session_had");
                let rx = conn.route(&session);
                let state = TurnState {
                    updates: wire::Updates::default(),
                    run: RunLog { session_id: Some(session.clone()), ..RunLog::default() },
                    since_ms: now_ms(),
                    cost_before: lock(&self.costs).get(&session).copied(),
                    queued: Vec::new(),
                };
                conn.prompt(&session, &turn.prompt);
                crate::trace::stamp(turn.task.id, "acp.prompted");
                (session, rx, state)
            }
        };
        on_progress(Progress::Session(&session));
        self.follow(
            &conn,
            &session,
            &mut rx,
            &mut state,
            &mut turn,
            log,
            stop,
            deadline,
            on_progress,
        )
        .await
        .map(|(exit, waiting)| {
            if let Some((request_id, pending)) = waiting {
                lock(&self.parked).insert(
                    turn.task.id,
                    Parked {
                        session: session.clone(),
                        request_id,
                        generation: self.generation(),
                        rx,
                        pending,
                        turn: state,
                    },
                );
            } else {
                conn.unroute(&session);
            }
            exit
        })
    }

    /// The response to a parked request, from the answer: what to prompt once the agent's
    /// turn ends (a rejection's feedback, which ACP's response cannot carry).
    fn answer_parked(
        &self,
        pending: Pending,
        ask: &Ask,
        answer: &str,
        notes: &[String],
        log: &mut TaskLog,
    ) -> Vec<String> {
        let mut queued = Vec::new();
        match pending {
            Pending::Permission { params, responder } => {
                let verdict = ask.parse_answer(answer);
                let allow = matches!(
                    verdict,
                    Ok(queue::Answer::PermissionOnce | queue::Answer::PermissionAlways)
                );
                if let Ok(queue::Answer::PermissionReject { feedback: Some(f) }) = &verdict {
                    queued.push(format!(
                        "The planner rejected {} and says: {f}\n\nTake that into account and go \
                         on with the task; end as before with a taskbridge-result block.",
                        ask.subject()
                    ));
                }
                if !notes.is_empty() {
                    let notes: Vec<String> = notes.iter().map(|n| format!("- {n}")).collect();
                    queued.push(format!(
                        "Notes from the planner that came with the answer:\n{}",
                        notes.join("\n")
                    ));
                }
                let _ = responder.respond(wire::permission_response(&params, allow));
            }
            Pending::Form { params, responder } => {
                let _ = responder.respond(wire::form_response(&params, ask, answer, notes));
            }
        }
        log.line("answered the agent's pending request; its turn goes on");
        queued
    }

    /// The session a new turn goes in: the one to continue, held by this process or loaded
    /// into it, or a new one (given the prompt that stands without the conversation).
    async fn session_for(
        &self,
        conn: &Conn,
        turn: &mut Turn<'_>,
        log: &mut TaskLog,
    ) -> std::io::Result<String> {
        let dir = turn.dir.display().to_string();
        if let Some(s) = turn.session.clone() {
            let here = lock(&self.live).get(&s).cloned();
            match here {
                Some(d) if d == turn.dir => return Ok(s),
                Some(_) => {}
                None if conn.init.pointer("/agentCapabilities/loadSession")
                    == Some(&json!(true)) =>
                {
                    let params =
                        json!({"sessionId": s, "cwd": dir, "mcpServers": turn.mcp_servers});
                    match conn.request("session/load", params).await {
                        Ok(_) => {
                            log.line(&format!("loaded session {s} into the agent again"));
                            lock(&self.live).insert(s.clone(), turn.dir.to_path_buf());
                            self.set_model(conn, &s, turn, log).await?;
                            return Ok(s);
                        }
                        Err(e) => log.line(&format!("could not load session {s}: {e}")),
                    }
                }
                None => {}
            }
            if let Some(alone) = turn.without_session.take() {
                turn.prompt = alone;
            }
        }
        let ahead = lock(&self.ready).remove(turn.dir);
        if let Some(s) = ahead.filter(|s| lock(&self.live).contains_key(s)) {
            log.line(&format!("{} over ACP: session {s} (made ahead)", self.launch.name));
            self.set_model(conn, &s, turn, log).await?;
            return Ok(s);
        }
        let s = new_session(conn, turn.dir, &turn.mcp_servers, &self.live, &self.models)
            .await
            .map_err(|e| {
                protocol_err(format!("the {} agent did not make a session: {e}", self.launch.name))
            })?;
        log.line(&format!("{} over ACP: session {s}", self.launch.name));
        self.set_model(conn, &s, turn, log).await?;
        Ok(s)
    }

    /// Makes a session in `dir` for the next task there, off the turn's way.
    fn make_ready(&self, conn: &Arc<Conn>, dir: &Path, mcp_servers: &Value) {
        if lock(&self.ready).contains_key(dir) {
            return;
        }
        let (conn, dir, mcp) = (conn.clone(), dir.to_path_buf(), mcp_servers.clone());
        let (live, models, ready) = (self.live.clone(), self.models.clone(), self.ready.clone());
        tokio::spawn(async move {
            match new_session(&conn, &dir, &mcp, &live, &models).await {
                Ok(s) => {
                    lock(&ready).insert(dir, s);
                }
                Err(e) => tracing::debug!(error = %e, "making a session ahead failed"),
            }
        });
    }

    /// Forgets the session made ahead in `dir` (a directory being removed).
    pub fn forget_ready(&self, dir: &Path) {
        lock(&self.ready).remove(dir);
    }

    /// Sets the task's model on the session, through the agent's `model` option (when it is
    /// not that already).
    async fn set_model(
        &self,
        conn: &Conn,
        session: &str,
        turn: &Turn<'_>,
        log: &mut TaskLog,
    ) -> std::io::Result<()> {
        let Some(model) = &turn.model else { return Ok(()) };
        if lock(&self.models).get(session) == Some(model) {
            return Ok(());
        }
        let params = json!({"sessionId": session, "configId": "model", "value": model});
        match conn.request("session/set_config_option", params).await {
            Ok(_) => {
                lock(&self.models).insert(session.to_owned(), model.clone());
                Ok(())
            }
            Err(e) if e.contains("-32601") || e.to_lowercase().contains("method not found") => {
                log.line(&format!(
                    "the {} agent cannot be given a model over ACP; it uses its own",
                    self.launch.name
                ));
                Ok(())
            }
            Err(e) => Err(protocol_err(format!(
                "the {} agent refused the model '{model}': {e}",
                self.launch.name
            ))),
        }
    }

    /// Reads the session's messages until the turn ends, stops, or waits on a decision.
    #[allow(clippy::too_many_arguments)]
    async fn follow(
        &self,
        conn: &Arc<Conn>,
        session: &str,
        rx: &mut mpsc::UnboundedReceiver<Incoming>,
        state: &mut TurnState,
        turn: &mut Turn<'_>,
        log: &mut TaskLog,
        mut stop: watch::Receiver<Option<StopReason>>,
        deadline: tokio::time::Instant,
        on_progress: &mut (dyn FnMut(Progress<'_>) -> Control + Send),
    ) -> std::io::Result<(AgentExit, Option<(String, Pending)>)> {
        let mut tick = tokio::time::interval(TICK);
        let mut stopped = None;
        let mut waiting: Option<(Ask, Option<(String, Pending)>)> = None;
        let mut steps = 0;
        let mut asked = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Control::Say(text) = on_progress(Progress::Tick) {
                        state.queued.push(text);
                        log.line("the planner's new notes go to the agent when its current prompt is answered");
                    }
                }
                msg = rx.recv() => {
                    let Some(msg) = msg else {
                        return Err(io_err("the agent's connection ended"));
                    };
                    match msg {
                        Incoming::Update(u) => {
                            if !asked && turn.ahead {
                                // The model has been asked: the agent is free meanwhile.
                                asked = true;
                                self.make_ready(conn, turn.dir, &turn.mcp_servers);
                            }
                            let events = state.updates.read(&u);
                            let step_ended = events.iter().any(|e| matches!(e, AgentEvent::StepStarted | AgentEvent::ToolEnded { .. }));
                            apply(&mut state.run, events, log);
                            if step_ended && let Some(spent) = self.spent(turn, session, state) && spent.steps > steps {
                                steps = spent.steps;
                                if let Control::Stop(ask) = on_progress(Progress::Step(&spent)) {
                                    log.line(&format!("stopping the agent: {}", ask.text()));
                                    conn.cancel(session);
                                    drain(rx, state, log).await;
                                    waiting = Some((*ask, None));
                                    break;
                                }
                            }
                        }
                        Incoming::Permission { params, responder } => {
                            match self.permission(turn, &params) {
                                Ok((verdict, approved)) => {
                                    let _ = responder.respond(verdict);
                                    if let Some(ask) = approved {
                                        log.line(&format!("approved by an earlier answer: {}", ask.text()));
                                        on_progress(Progress::Approved(&ask));
                                    }
                                }
                                Err(ask) => {
                                    let id = params.pointer("/toolCall/toolCallId").and_then(Value::as_str).unwrap_or("permission").to_owned();
                                    log.line(&format!("the agent asks for {}", ask.text()));
                                    let mut ask = *ask;
                                    ask.request_id = Some(id.clone());
                                    waiting = Some((ask, Some((id, Pending::Permission { params, responder }))));
                                    break;
                                }
                            }
                        }
                        Incoming::Form { params, responder } => {
                            let questions = wire::form_questions(&params);
                            let mut ask = Ask::question(questions);
                            let id = params.get("toolCallId").and_then(Value::as_str).unwrap_or("question").to_owned();
                            ask.request_id = Some(id.clone());
                            log.line(&format!("the agent asks: {}", ask.text()));
                            waiting = Some((ask, Some((id, Pending::Form { params, responder }))));
                            break;
                        }
                        Incoming::Unknown(method) => {
                            conn.cancel(session);
                            return Err(protocol_err(format!(
                                "the {} agent sent a request that is not ACP's (`{method}`): \
                                 TaskBridge answers sessions' permission requests and questions \
                                 only; is the agent's ACP version one TaskBridge speaks?",
                                self.launch.name
                            )));
                        }
                        Incoming::Done(Ok(result)) => {
                            crate::trace::stamp(turn.task.id, "acp.answered");
                            if let Some(next) = (!state.queued.is_empty()).then(|| state.queued.remove(0)) {
                                conn.prompt(session, &next);
                                continue;
                            }
                            self.finish(turn, session, state, &result, log);
                            break;
                        }
                        Incoming::Done(Err(e)) if !conn.alive() => {
                            return Err(self.ended(conn, &e).await);
                        }
                        Incoming::Done(Err(e)) => {
                            let error = AgentError { name: "ACPError".into(), message: e, ..Default::default() };
                            apply(&mut state.run, vec![AgentEvent::Error(error)], log);
                            break;
                        }
                        Incoming::Closed(why) => {
                            return Err(self.ended(conn, &why).await);
                        }
                    }
                }
                _ = stop.changed(), if stopped.is_none() => {
                    let reason = *stop.borrow();
                    if let Some(reason) = reason {
                        stopped = Some(reason);
                        log.line(&format!("stopping the agent ({reason:?}): cancelling its session"));
                        conn.cancel(session);
                        drain(rx, state, log).await;
                        break;
                    }
                }
                _ = tokio::time::sleep_until(deadline), if stopped.is_none() => {
                    stopped = Some(StopReason::Timeout);
                    conn.cancel(session);
                    drain(rx, state, log).await;
                    break;
                }
            }
        }
        if waiting.as_ref().is_some_and(|(_, p)| p.is_none()) || stopped.is_some() {
            // Stopped mid-turn: what it spent is still the task's.
            if let Some(spent) = self.spent(turn, session, state) {
                state.run.usage = spent;
            }
        }
        if let Some(c) = state.updates.session_cost {
            lock(&self.costs).insert(session.to_owned(), c);
        }
        let (ask, pending) = match waiting {
            Some((ask, pending)) => (Some(ask), pending),
            None => (None, None),
        };
        let run = std::mem::take(&mut state.run);
        let exit = AgentExit {
            exit_code: Some(0),
            stopped,
            stderr_tail: String::new(),
            run,
            waiting: ask,
        };
        Ok((exit, pending))
    }

    /// The error of a turn whose agent went away: a line that was not the protocol's is the
    /// agent's fault for good; an exit may be mended by a retry.
    async fn ended(&self, conn: &Conn, why: &str) -> std::io::Error {
        let why = conn.ended_reason().unwrap_or_else(|| why.to_owned());
        let error = format!(
            "the {} agent's process ended mid-turn: {why}{}",
            self.launch.name,
            conn.last_words().await
        );
        match why.contains("not ACP's JSON-RPC") {
            true => protocol_err(error),
            false => io_err(error),
        }
    }

    /// The task's rules on a permission request: the response when they decide it (with the
    /// request, when an earlier answer approved what a rule asks about), the decision to wait
    /// on when they ask.
    fn permission(
        &self,
        turn: &mut Turn<'_>,
        params: &Value,
    ) -> Result<(Value, Option<Ask>), Box<Ask>> {
        let tool = wire::permission_use(params);
        let outside =
            wire::permission_paths(params).iter().any(|p| crate::policy::outside(turn.dir, p));
        let decision = if outside && tool.permission != "bash" {
            Decision::Deny { message: "it reaches outside the task's worktree".into() }
        } else {
            crate::policy::decide(turn.task, turn.dir, &mut turn.grants, &tool, &Value::Null)
        };
        let granted = matches!(decision, Decision::Allow { .. })
            && crate::policy::rules_ask(turn.task, &tool);
        match wire::decided(params, &decision) {
            Some(v) => Ok((v, granted.then(|| crate::policy::rule_decision(turn.task, &tool)))),
            None => Err(Box::new(crate::policy::rule_decision(turn.task, &tool))),
        }
    }

    /// The turn's spend so far: OpenCode's steps from its database, else nothing to tell yet.
    fn spent(&self, turn: &Turn<'_>, session: &str, state: &TurnState) -> Option<Usage> {
        let db = turn.ledger.as_deref()?;
        ledger::spent(db, session, state.since_ms)
    }

    /// The turn is over: its last text, and its spend, exactly where OpenCode's database
    /// says it, else as the answer and the cost updates say it.
    fn finish(
        &self,
        turn: &Turn<'_>,
        session: &str,
        state: &mut TurnState,
        result: &Value,
        log: &mut TaskLog,
    ) {
        let events = state.updates.flush();
        apply(&mut state.run, events, log);
        let usage = self.spent(turn, session, state).filter(|u| u.steps > 0).or_else(|| {
            let mut u = wire::prompt_usage(result)?;
            u.cost_usd = match (state.updates.session_cost, state.cost_before) {
                (Some(after), Some(before)) => Some((after - before).max(0.0)),
                (Some(after), None) => Some(after),
                (None, _) => None,
            };
            Some(u)
        });
        let reason = result.get("stopReason").and_then(Value::as_str).map(str::to_owned);
        if let Some(usage) = usage {
            apply(&mut state.run, vec![AgentEvent::Usage { usage, reason: reason.clone() }], log);
        }
        if reason.as_deref() == Some("refusal") {
            let error = AgentError {
                name: "Refusal".into(),
                message: "the model refused to go on".into(),
                ..Default::default()
            };
            apply(&mut state.run, vec![AgentEvent::Error(error)], log);
        }
    }
}

/// The models an ACP agent offers: the choices of the `model` option of a session made in an
/// empty directory (the session is closed with the process). Blocking: it starts the agent on a
/// runtime of its own.
pub fn models(launch: &Launch) -> Result<Vec<String>, String> {
    let launch = launch.clone();
    let listed = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let rt = rt.map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let dir =
                std::env::temp_dir().join(format!("taskbridge-models-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            let conn = Conn::start(&launch, None, &[]).await.map_err(|e| e.to_string())?;
            let params = json!({"cwd": dir.display().to_string(), "mcpServers": []});
            let made = conn.request("session/new", params).await;
            conn.kill();
            let _ = std::fs::remove_dir(&dir);
            let made = made?;
            let options = made.get("configOptions").and_then(Value::as_array).cloned();
            let model = options.unwrap_or_default().into_iter().find(|o| o["id"] == "model");
            let choices = model.and_then(|m| m.get("options").and_then(Value::as_array).cloned());
            Ok(choices
                .unwrap_or_default()
                .iter()
                .filter_map(|o| o.get("value").and_then(Value::as_str).map(str::to_owned))
                .collect())
        })
    });
    listed.join().map_err(|_| "listing the agent's models panicked".to_owned())?
}

/// Who the agent says it is (`initialize`'s `agentInfo`: name and version), once it is
/// started and has answered: what `doctor` shows. Blocking, like [`models`].
pub fn probe(launch: &Launch) -> Result<String, String> {
    let launch = launch.clone();
    let probed = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let rt = rt.map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let conn = Conn::start(&launch, None, &[]).await.map_err(|e| e.to_string())?;
            conn.kill();
            let info = conn.init.get("agentInfo");
            let text = |k: &str| info.and_then(|i| i.get(k)).and_then(Value::as_str);
            Ok(match (text("name"), text("version")) {
                (Some(n), Some(v)) => format!("{n} {v}"),
                (Some(n), None) => n.to_owned(),
                _ => format!("an agent that does not say its name ({})", launch.name),
            })
        })
    });
    probed.join().map_err(|_| "probing the agent panicked".to_owned())?
}

/// What an ACP agent's failed turn means: its credentials refused (no retry helps), or
/// something a retry may mend.
pub fn diagnose(e: &AgentError, agent: &str, model: Option<&str>) -> crate::diagnose::Diagnosis {
    let model = model.map_or_else(|| "its own default model".to_owned(), |m| format!("model {m}"));
    let text = e.message.to_lowercase();
    let auth = matches!(e.status, Some(401 | 403))
        || ["401", "unauthorized", "authentication", "api key", "x-api-key"]
            .iter()
            .any(|w| text.contains(w));
    crate::diagnose::Diagnosis {
        message: match auth {
            true => format!(
                "the {agent} agent could not authenticate with its provider for {model}: set its \
                 API key in the worker's environment (or its [agents.NAME] env). It said: {}",
                e.message
            ),
            false => format!("the {agent} agent failed ({model}): {}", e.message),
        },
        retryable: !auth && e.retryable.unwrap_or(true),
        kind: match auth {
            true => queue::FailureKind::Auth,
            false => queue::FailureKind::Provider,
        },
    }
}

/// A new session in `dir`, recorded as live there with its model.
async fn new_session(
    conn: &Conn,
    dir: &Path,
    mcp_servers: &Value,
    live: &std::sync::Mutex<HashMap<String, PathBuf>>,
    models: &std::sync::Mutex<HashMap<String, String>>,
) -> Result<String, String> {
    let params = json!({"cwd": dir.display().to_string(), "mcpServers": mcp_servers});
    let made = conn.request("session/new", params).await?;
    let Some(s) = made.get("sessionId").and_then(Value::as_str).map(str::to_owned) else {
        return Err(format!("its answer to `session/new` has no sessionId: {made}"));
    };
    lock(live).insert(s.clone(), dir.to_path_buf());
    let options = made.get("configOptions").and_then(Value::as_array).cloned().unwrap_or_default();
    if let Some(model) = options
        .iter()
        .find(|o| o["id"] == "model")
        .and_then(|o| o.get("currentValue")?.as_str().map(str::to_owned))
    {
        lock(models).insert(s.clone(), model);
    }
    Ok(s)
}

/// Folds events into the run and writes what they say to the log.
fn apply(run: &mut RunLog, events: Vec<AgentEvent>, log: &mut TaskLog) {
    for ev in events {
        run.events += 1;
        if let Some(line) = run.apply(ev) {
            log.line(&line);
        }
    }
}

/// After a cancel: the turn's last messages, until its prompt is answered or the grace ends.
async fn drain(
    rx: &mut mpsc::UnboundedReceiver<Incoming>,
    state: &mut TurnState,
    log: &mut TaskLog,
) {
    let until = tokio::time::Instant::now() + CANCEL_GRACE;
    while let Ok(Some(msg)) = tokio::time::timeout_at(until, rx.recv()).await {
        match msg {
            Incoming::Update(u) => {
                let events = state.updates.read(&u);
                apply(&mut state.run, events, log);
            }
            // Nobody will answer: the cancel covers it.
            Incoming::Permission { params, responder } => {
                let _ = responder.respond(wire::permission_response(&params, false));
            }
            Incoming::Form { responder, .. } => {
                let _ = responder.respond(json!({"action": "cancel"}));
            }
            Incoming::Done(_) | Incoming::Closed(_) => break,
            Incoming::Unknown(_) => {}
        }
    }
    let events = state.updates.flush();
    apply(&mut state.run, events, log);
}
