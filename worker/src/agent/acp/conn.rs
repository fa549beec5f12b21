//! One ACP agent process and the JSON-RPC connection to it: started inside its wall, its stdout
//! read line by line (a line that is not JSON-RPC ends the connection, with that line as the
//! reason), and every message the agent sends routed to the session it names. The crate
//! (`agent-client-protocol`) carries the JSON-RPC: ids, responses, errors, cancellation; the
//! messages themselves are read as JSON by `wire.rs`, leniently, since agents differ in what they
//! fill in.

use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, Client, Dispatch, Lines, UntypedMessage};
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// How long an agent may take to answer `initialize` (OpenCode takes 2–3 s cold).
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(60);

/// What the agent sent that concerns one session, in the order it sent it.
pub(super) enum Incoming {
    /// A `session/update`'s `update`.
    Update(Value),
    /// `session/request_permission`: the agent waits for the response.
    Permission { params: Value, responder: Responder<Value> },
    /// `elicitation/create` (OpenCode 2's `question` tool): the agent waits for the response.
    Form { params: Value, responder: Responder<Value> },
    /// A request TaskBridge does not know (answered "method not found").
    Unknown(String),
    /// The prompt's answer, or why there is none.
    Done(Result<Value, String>),
    /// The connection ended: why.
    Closed(String),
}

type Routes = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Incoming>>>>;

/// How to start the agent.
#[derive(Clone, PartialEq)]
pub struct Launch {
    /// The agent's name (`opencode`, or the `[agents.NAME]` it was configured as).
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// Names only: the environment holds the agent's password and whatever keys a configuration
/// gives it.
impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.env.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("Launch")
            .field("name", &self.name)
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env", &names)
            .finish()
    }
}

/// A live agent process and its connection.
pub(super) struct Conn {
    cx: ConnectionTo<Agent>,
    routes: Routes,
    pub(super) pid: i32,
    /// What the agent has started, refreshed while it lives.
    pub(super) tree: Arc<Mutex<crate::process::ProcessTree>>,
    child: Mutex<tokio::process::Child>,
    /// `initialize`'s answer.
    pub(super) init: Value,
    /// Why the connection ended, once it has.
    ended: Arc<Mutex<Option<String>>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// The reader of its stderr, which ends when the process does.
    stderr_done: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    _forwarding: Option<crate::sandbox::netns::Forwarding>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn io_err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// A protocol error: the agent spoke ACP wrongly, which no retry mends.
pub(super) fn protocol_err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
}

impl Conn {
    /// Starts the agent inside `wall` and initializes the connection.
    pub(super) async fn start(
        launch: &Launch,
        wall: Option<&Arc<crate::sandbox::Wall>>,
        env: &[(String, String)],
    ) -> std::io::Result<Conn> {
        let mut cmd = tokio::process::Command::new(&launch.program);
        for var in crate::process::SECRET_ENV {
            cmd.env_remove(var);
        }
        let link = crate::sandbox::confine(&mut cmd, wall, false)?;
        let mut child = cmd
            .args(&launch.args)
            .envs(env.iter().chain(&launch.env).map(|(k, v)| (k, v)))
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let forwarding = link.map(|l| l.forward()).transpose()?;
        let pid = child.id().map_or(0, |p| p as i32);
        let stdin = child.stdin.take().ok_or_else(|| io_err("no stdin"))?;
        let stdout = child.stdout.take().ok_or_else(|| io_err("no stdout"))?;
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let mut stderr_done = None;
        if let Some(err) = child.stderr.take() {
            let tail = stderr.clone();
            stderr_done = Some(tokio::spawn(async move {
                let mut lines = BufReader::new(err).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    tracing::debug!(target: "acp_agent", "{l}");
                    let mut t = lock(&tail);
                    t.push_back(l);
                    if t.len() > 20 {
                        t.pop_front();
                    }
                }
            }));
        }
        let ended = Arc::new(Mutex::new(None));
        let routes: Routes = Default::default();
        let (cx_tx, cx_rx) = tokio::sync::oneshot::channel();
        let transport = Lines::new(writer(stdin), reader(stdout, ended.clone()));
        tokio::spawn(serve(transport, routes.clone(), ended.clone(), cx_tx));
        let cx = cx_rx.await.map_err(|_| io_err(ended_why(&ended, &stderr)))?;
        let tree = Arc::new(Mutex::new(crate::process::ProcessTree::new(pid)));
        let mut conn = Conn {
            cx,
            routes,
            pid,
            tree,
            child: Mutex::new(child),
            init: Value::Null,
            ended,
            stderr,
            stderr_done: tokio::sync::Mutex::new(stderr_done),
            _forwarding: forwarding,
        };
        conn.init = conn.initialize(launch).await?;
        Ok(conn)
    }

    async fn initialize(&mut self, launch: &Launch) -> std::io::Result<Value> {
        let params = json!({
            "protocolVersion": 1,
            "clientCapabilities": {
                "fs": {"readTextFile": false, "writeTextFile": false},
                "terminal": false,
                // OpenCode 2 asks its `question` tool's questions as a form.
                "elicitation": {"form": {}},
            },
            "clientInfo": {"name": "taskbridge", "version": env!("CARGO_PKG_VERSION")},
        });
        let answer = tokio::time::timeout(INITIALIZE_TIMEOUT, self.request("initialize", params));
        match answer.await {
            Ok(Ok(init)) if init.get("protocolVersion").and_then(Value::as_u64) == Some(1) => {
                Ok(init)
            }
            Ok(Ok(init)) => Err(protocol_err(format!(
                "the {} agent ('{}') answered `initialize` with protocol version {}; TaskBridge \
                 speaks ACP version 1",
                launch.name,
                launch.program.display(),
                init.get("protocolVersion").unwrap_or(&Value::Null)
            ))),
            Ok(Err(e)) => Err(protocol_err(format!(
                "the {} agent ('{}') did not start an ACP session: {e}{}",
                launch.name,
                launch.program.display(),
                self.last_words().await
            ))),
            Err(_) => Err(protocol_err(format!(
                "the {} agent ('{}') did not answer ACP's `initialize` within {} s: is it an \
                 agent that speaks ACP on its stdio?{}",
                launch.name,
                launch.program.display(),
                INITIALIZE_TIMEOUT.as_secs(),
                self.stderr_note()
            ))),
        }
    }

    /// A request to the agent and its answer.
    pub(super) async fn request(&self, method: &str, params: Value) -> Result<Value, String> {
        let msg = UntypedMessage::new(method, params).map_err(|e| e.to_string())?;
        match self.cx.send_request(msg).block_task().await {
            Ok(v) => Ok(v),
            Err(e) => match lock(&self.ended).clone() {
                Some(why) => Err(why),
                None => Err(e.to_string()),
            },
        }
    }

    /// Sends `session/prompt`; its answer arrives on the session's route as [`Incoming::Done`].
    pub(super) fn prompt(&self, session: &str, text: &str) {
        let params = json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
        let route = lock(&self.routes).get(session).cloned();
        let Ok(msg) = UntypedMessage::new("session/prompt", params) else { return };
        let sent = self.cx.send_request(msg);
        let ended = self.ended.clone();
        tokio::spawn(async move {
            let done = sent.block_task().await.map_err(|e| match lock(&ended).clone() {
                Some(why) => why,
                None => e.to_string(),
            });
            if let Some(r) = route {
                let _ = r.send(Incoming::Done(done));
            }
        });
    }

    /// `session/cancel`: the agent stops the session's turn and answers its prompt `cancelled`.
    pub(super) fn cancel(&self, session: &str) {
        if let Ok(msg) = UntypedMessage::new("session/cancel", json!({"sessionId": session})) {
            let _ = self.cx.send_notification(msg);
        }
    }

    /// The route of `session`'s messages from now on (replacing any earlier one).
    pub(super) fn route(&self, session: &str) -> mpsc::UnboundedReceiver<Incoming> {
        let (tx, rx) = mpsc::unbounded_channel();
        if let Some(why) = lock(&self.ended).clone() {
            let _ = tx.send(Incoming::Closed(why));
        }
        lock(&self.routes).insert(session.to_owned(), tx);
        rx
    }

    pub(super) fn unroute(&self, session: &str) {
        lock(&self.routes).remove(session);
    }

    /// Why the connection ended, once it has.
    pub(super) fn ended_reason(&self) -> Option<String> {
        lock(&self.ended).clone()
    }

    pub(super) fn alive(&self) -> bool {
        lock(&self.ended).is_none() && matches!(lock(&self.child).try_wait(), Ok(None))
    }

    /// The end of the agent's stderr, as a sentence to add to an error.
    pub(super) fn stderr_note(&self) -> String {
        stderr_note(&self.stderr)
    }

    /// [`Conn::stderr_note`] once the process has ended: its last words read to the end.
    pub(super) async fn last_words(&self) -> String {
        if let Some(reader) = self.stderr_done.lock().await.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), reader).await;
        }
        self.stderr_note()
    }

    /// Kills the agent and everything it started.
    pub(super) fn kill(&self) {
        if let Ok(mut tree) = self.tree.lock() {
            tree.refresh();
            tree.signal(nix::sys::signal::Signal::SIGKILL);
        }
        let _ = lock(&self.child).start_kill();
    }
}

fn stderr_note(stderr: &Mutex<VecDeque<String>>) -> String {
    let tail: Vec<String> = lock(stderr).iter().rev().take(5).rev().cloned().collect();
    match tail.is_empty() {
        true => String::new(),
        false => format!(" (its stderr ends: {})", tail.join(" | ")),
    }
}

fn ended_why(ended: &Mutex<Option<String>>, stderr: &Mutex<VecDeque<String>>) -> String {
    let why = lock(ended).clone().unwrap_or_else(|| "the agent's connection ended".into());
    format!("{why}{}", stderr_note(stderr))
}

/// Writes each outgoing message as one line on the agent's stdin.
fn writer(
    stdin: tokio::process::ChildStdin,
) -> impl futures::Sink<String, Error = std::io::Error> + Send + 'static {
    futures::sink::unfold(stdin, |mut stdin, line: String| async move {
        stdin.write_all(line.as_bytes()).await?;
        stdin.write_all(b"\n").await?;
        stdin.flush().await?;
        Ok::<_, std::io::Error>(stdin)
    })
}

/// The agent's stdout as lines, each checked to be a JSON-RPC message: the first that is not
/// ends the stream, and says why in `ended`.
fn reader(
    stdout: tokio::process::ChildStdout,
    ended: Arc<Mutex<Option<String>>>,
) -> impl futures::Stream<Item = std::io::Result<String>> + Send + 'static {
    let lines = BufReader::new(stdout).lines();
    futures::stream::unfold(Some(lines), move |lines| {
        let ended = ended.clone();
        async move {
            let mut lines = lines?;
            loop {
                match lines.next_line().await {
                    Ok(Some(line)) if line.trim().is_empty() => continue,
                    Ok(Some(line)) => {
                        let msg = serde_json::from_str::<Value>(&line).ok();
                        if msg.as_ref().and_then(|m| m.get("jsonrpc")).and_then(Value::as_str)
                            == Some("2.0")
                        {
                            return Some((Ok(line), Some(lines)));
                        }
                        let shown: String = line.chars().take(200).collect();
                        let why =
                            format!("the agent wrote a line that is not ACP's JSON-RPC: {shown}");
                        lock(&ended).get_or_insert(why.clone());
                        return Some((Err(protocol_err(why)), None));
                    }
                    Ok(None) => {
                        lock(&ended).get_or_insert_with(|| "the agent's process exited".into());
                        return None;
                    }
                    Err(e) => {
                        lock(&ended)
                            .get_or_insert_with(|| format!("reading the agent failed: {e}"));
                        return None;
                    }
                }
            }
        }
    })
}

/// Runs the connection until the agent's output ends: every incoming message is routed to the
/// session it names; when it ends, every session hears why.
async fn serve(
    transport: Lines<
        impl futures::Sink<String, Error = std::io::Error> + Send + 'static,
        impl futures::Stream<Item = std::io::Result<String>> + Send + 'static,
    >,
    routes: Routes,
    ended: Arc<Mutex<Option<String>>>,
    cx_tx: tokio::sync::oneshot::Sender<ConnectionTo<Agent>>,
) {
    let dispatched = routes.clone();
    let result = Client
        .v1()
        .name("taskbridge")
        .on_receive_dispatch(
            async move |d: agent_client_protocol::v1::Dispatch, _cx| {
                dispatch(d, &dispatched);
                Ok(())
            },
            agent_client_protocol::on_receive_dispatch!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
            let _ = cx_tx.send(cx.clone());
            cx.incoming_closed().await;
            Ok(())
        })
        .await;
    let why = {
        let mut e = lock(&ended);
        if let Err(err) = &result {
            e.get_or_insert_with(|| format!("the connection to the agent failed: {err}"));
        }
        e.get_or_insert_with(|| "the agent's process exited".into()).clone()
    };
    for (_, route) in lock(&routes).drain() {
        let _ = route.send(Incoming::Closed(why.clone()));
    }
}

/// Routes one incoming message to the session it names.
fn dispatch(d: agent_client_protocol::v1::Dispatch, routes: &Routes) {
    let send = |session: Option<&str>, msg: Incoming| {
        let routes = lock(routes);
        let route = session.and_then(|s| routes.get(s));
        match route {
            Some(r) => {
                let _ = r.send(msg);
            }
            // A request for no session TaskBridge follows: every session hears of it, since
            // the agent may be waiting for its answer.
            None => {
                if let Incoming::Unknown(m) = &msg {
                    for r in routes.values() {
                        let _ = r.send(Incoming::Unknown(m.clone()));
                    }
                }
            }
        }
    };
    match d {
        Dispatch::Notification(n) => {
            if n.method() == "session/update" {
                let session =
                    n.params().get("sessionId").and_then(Value::as_str).map(str::to_owned);
                let update = n.params().get("update").cloned().unwrap_or(Value::Null);
                send(session.as_deref(), Incoming::Update(update));
            }
        }
        Dispatch::Request(req, responder) => {
            let session = req.params().get("sessionId").and_then(Value::as_str).map(str::to_owned);
            let (method, params) = req.into_parts();
            match method.as_str() {
                "session/request_permission" => {
                    send(session.as_deref(), Incoming::Permission { params, responder })
                }
                "elicitation/create" => {
                    send(session.as_deref(), Incoming::Form { params, responder })
                }
                // ACP's file and terminal methods, which the client said at `initialize` it
                // does not offer: OpenCode 1.x still asks to write each approved edit (its own
                // tool writes it too), so the refusal ends nothing.
                m if m.starts_with("fs/") || m.starts_with("terminal/") => {
                    tracing::debug!(method = m, "refused an ACP method TaskBridge does not offer");
                    let _ = responder
                        .respond_with_error(agent_client_protocol::Error::method_not_found());
                }
                _ => {
                    let _ = responder
                        .respond_with_error(agent_client_protocol::Error::method_not_found());
                    send(session.as_deref(), Incoming::Unknown(method));
                }
            }
        }
        Dispatch::Response(result, router) => {
            let _ = router.route_with_result(result);
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_line_that_is_not_json_rpc_ends_the_stream_and_says_which() {
        let mut child = tokio::process::Command::new("sh")
            .args([
                "-c",
                r#"printf '{"jsonrpc":"2.0","method":"x"}\n\nhello there\n{"jsonrpc":"2.0"}\n'"#,
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let ended = Arc::new(Mutex::new(None));
        use futures::StreamExt;
        let lines: Vec<_> = reader(child.stdout.take().unwrap(), ended.clone()).collect().await;
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].is_ok());
        assert_eq!(lines[1].as_ref().unwrap_err().kind(), std::io::ErrorKind::InvalidData);
        let why = ended.lock().unwrap().clone().unwrap();
        assert!(why.contains("hello there"), "{why}");
        let _ = child.wait().await;
    }
}
