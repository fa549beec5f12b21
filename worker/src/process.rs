//! Running an agent as the leader of its own process group, reading its event stream as it
//! arrives, and stopping the whole group on cancel, timeout or a lost lease.

use crate::agent::AgentProtocol;
use crate::events::{AgentEvent, RunLog};
use crate::logs::TaskLog;
use crate::policy::Decision;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::{mpsc, watch};

/// TaskBridge's own secrets, kept out of every agent process (and so out of every command an
/// agent runs, which inherits its environment): the HTTP token, the queue's location (a
/// PostgreSQL URL holds its password), a warm server's password that some other process set,
/// and where TaskBridge's traces go: the OTLP endpoints and their headers (which carry the
/// collector's credentials). An agent that read them would also export its own telemetry there
/// as if it were TaskBridge's.
pub const SECRET_ENV: [&str; 13] = [
    "TASKBRIDGE_DB",
    "TASKBRIDGE_TOKEN",
    "OPENCODE_SERVER_PASSWORD",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
];

/// Why a run was stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Cancel,
    Timeout,
    /// Another worker may own the task now: stop and write nothing.
    LostLease,
    /// This worker is shutting down: the task goes back to the queue.
    Shutdown,
}

/// Grace period between SIGTERM and SIGKILL of the agent's process group.
pub const KILL_GRACE: Duration = Duration::from_secs(3);

pub struct AgentCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub stdin: String,
    /// The sandbox the process raises before it runs (`crate::sandbox`).
    pub wall: Option<std::sync::Arc<crate::sandbox::Wall>>,
}

pub struct AgentExit {
    pub exit_code: Option<i32>,
    pub stopped: Option<StopReason>,
    pub stderr_tail: String,
    pub run: RunLog,
    /// The agent is blocked on a decision (a native question or permission request), or was
    /// stopped for one (a budget).
    pub waiting: Option<queue::Ask>,
}

/// The process's start time in clock ticks since boot (Linux), used to tell a live orphan from a
/// new process that reused its pid.
pub fn process_start_time(pid: i64) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; starttime is field 22 overall.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19).map(str::to_owned)
}

pub fn pid_alive(pid: i64) -> bool {
    let Ok(p) = i32::try_from(pid) else { return false };
    if nix::sys::signal::kill(Pid::from_raw(p), None).is_err() {
        return false;
    }
    // A zombie is dead, only not yet reaped by its parent (a supervisor that is slow to wait).
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X')
        ),
        Err(_) => true,
    }
}

/// Kills the orphaned agent `pid` and everything it started, if that process is the one that
/// started at `started` (a pid alone may have been reused).
/// Returns once nothing of it runs any more (see [`ProcessTree::kill_until_gone`]): a task is
/// given back to the queue after this, and its next run must not meet the last one's commands.
/// Blocks for as long as the kernel takes to end them; call it off the async threads.
pub fn kill_orphan(pid: i64, started: Option<&str>) -> bool {
    let (Ok(p), Some(started)) = (i32::try_from(pid), started) else { return false };
    if process_start_time(pid).as_deref() != Some(started) {
        return false;
    }
    let mut tree = ProcessTree::new(p);
    if !tree.kill_until_gone(Duration::from_secs(10)) {
        tracing::warn!(pid, "processes of an orphaned agent still run 10 s after SIGKILL");
    }
    true
}

/// Runs `cmd` to the end with stdout and stderr captured, or kills it after `limit` (`Ok(None)`).
/// Both pipes are read on threads of their own, so a chatty child never blocks on a full pipe.
pub fn output_within(
    cmd: &mut std::process::Command,
    limit: Duration,
) -> std::io::Result<Option<std::process::Output>> {
    let mut child =
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    fn drain(
        pipe: Option<impl std::io::Read + Send + 'static>,
    ) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let start = std::time::Instant::now();
    let status = loop {
        match child.try_wait()? {
            Some(status) => break status,
            None if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                return Ok(None);
            }
        }
    };
    Ok(Some(std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }))
}

/// Kills `pid` and everything it started (its process groups and descendants).
pub fn kill_group(pid: i32) {
    let mut tree = ProcessTree::new(pid);
    tree.refresh();
    tree.signal(Signal::SIGKILL);
}

/// `(pid, ppid, pgid)` of every process, from /proc; zombies (ended, not yet reaped) left out
/// when `running` is set.
fn processes_where(running: bool) -> Vec<(i32, i32, i32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let mut f = stat[stat.rfind(')')? + 2..].split_whitespace();
        let state = f.next()?;
        if running && state == "Z" {
            return None;
        }
        let ppid = f.next()?.parse().ok()?;
        let pgid = f.next()?.parse().ok()?;
        Some((pid, ppid, pgid))
    })
    .collect()
}

fn processes() -> Vec<(i32, i32, i32)> {
    processes_where(false)
}

/// Whether `pid` has ended and waits to be reaped.
fn zombie(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rfind(')').and_then(|i| stat.get(i + 2..i + 3)) == Some("Z")
}

/// An agent and everything it started. OpenCode runs shell commands detached, in process groups
/// of their own, so killing the agent's group alone would leave them running: the tree remembers
/// every process group it has seen below the agent, and signals them all.
pub struct ProcessTree {
    root: i32,
    own_group: i32,
    groups: std::collections::BTreeSet<i32>,
    pids: std::collections::BTreeSet<i32>,
}

impl ProcessTree {
    pub fn new(root: i32) -> Self {
        let own_group = nix::unistd::getpgrp().as_raw();
        let mut groups = std::collections::BTreeSet::new();
        if root > 0 && root != own_group {
            groups.insert(root);
        }
        ProcessTree { root, own_group, groups, pids: Default::default() }
    }

    /// Records the current descendants of the root and their process groups. A group seen before
    /// stays while any process is still in it, even one whose parent died: a process group id is
    /// not reused while the group has members, so signalling it can only reach the agent's work.
    pub fn refresh(&mut self) {
        if self.root <= 0 {
            return;
        }
        let procs = processes();
        let live_groups: std::collections::BTreeSet<i32> = procs.iter().map(|p| p.2).collect();
        self.groups.retain(|g| live_groups.contains(g));
        self.pids.clear();
        let mut frontier = vec![self.root];
        while let Some(parent) = frontier.pop() {
            for &(pid, ppid, pgid) in &procs {
                if ppid == parent && self.pids.insert(pid) {
                    frontier.push(pid);
                    // Never our own group: that would kill the worker itself.
                    if pgid > 1 && pgid != self.own_group {
                        self.groups.insert(pgid);
                    }
                }
            }
        }
    }

    /// Kills every process below the root (not the root) that works in `dir` or below it: on
    /// a warm server that serves several tasks, what a task's commands left running there
    /// (a detached one included: the server adopts it, see `crate::sandbox::adopt_orphans`).
    /// Returns how many.
    pub fn kill_working_in(&mut self, dir: &std::path::Path) -> usize {
        self.refresh();
        let Ok(dir) = dir.canonicalize() else { return 0 };
        let mut killed = 0;
        for &p in &self.pids {
            let cwd = std::fs::read_link(format!("/proc/{p}/cwd"));
            if cwd.is_ok_and(|c| c.starts_with(&dir))
                && nix::sys::signal::kill(Pid::from_raw(p), Signal::SIGKILL).is_ok()
            {
                killed += 1;
            }
        }
        killed
    }

    /// SIGKILLs the root and everything below it, again at whatever it started meanwhile,
    /// until none of it runs (a zombie has ended) or `limit` passed; whether it is all gone.
    /// A signal is delivered at once but a process ends later, and the root's children outlive
    /// it: what they start after the first kill is caught by the next round.
    pub fn kill_until_gone(&mut self, limit: Duration) -> bool {
        let start = std::time::Instant::now();
        // The root by its start time too, so that a pid the kernel gave to another process
        // after the root ended is never signalled.
        let born = process_start_time(self.root.into());
        let root_lives =
            |root: i32| born.is_some() && process_start_time(root.into()) == born && !zombie(root);
        loop {
            self.refresh();
            if root_lives(self.root) {
                let _ = nix::sys::signal::kill(Pid::from_raw(self.root), Signal::SIGKILL);
            }
            self.signal(Signal::SIGKILL);
            let live = processes_where(true);
            let running = root_lives(self.root)
                || live
                    .iter()
                    .any(|&(pid, _, pgid)| self.pids.contains(&pid) || self.groups.contains(&pgid));
            if !running {
                return true;
            }
            if start.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn signal(&self, sig: Signal) {
        for &g in &self.groups {
            // ESRCH (the group is gone) is the normal case after a clean exit.
            let _ = killpg(Pid::from_raw(g), sig);
        }
        for &p in &self.pids {
            let _ = nix::sys::signal::kill(Pid::from_raw(p), sig);
        }
    }
}

/// Spawns the agent, feeds it `stdin` (and closes it, unless the protocol keeps it open for
/// answers), and reads its events until it exits or `stop` says otherwise. A request the agent
/// makes over its control channel goes to `decide`: answered on stdin, or, when it must wait for
/// a person or the planner, the run stops there with the decision in [`AgentExit::waiting`].
/// `on_spawn` gets the pid and start time so an orphan can be found after a crash; `on_step` the
/// run so far after each step the agent reports (its spend, kept should the run be cut short).
#[allow(clippy::too_many_arguments)]
pub async fn run_agent(
    cmd: AgentCommand,
    protocol: &mut dyn AgentProtocol,
    decide: &mut (dyn FnMut(&queue::Ask, &Value) -> Decision + Send),
    log: &mut TaskLog,
    mut stop: watch::Receiver<Option<StopReason>>,
    deadline: tokio::time::Instant,
    on_spawn: impl FnOnce(i64, Option<String>),
    on_step: &mut (dyn FnMut(&RunLog) + Send),
) -> std::io::Result<AgentExit> {
    let (mut child, _forwarding) = spawn(&cmd)?;
    let pid = child.id().map(i64::from).unwrap_or(0);
    on_spawn(pid, process_start_time(pid));
    let mut tree = ProcessTree::new(i32::try_from(pid).unwrap_or(0));
    let mut scan = tokio::time::interval(Duration::from_millis(500));
    let in_tx = stdin_writer(&mut child, cmd.stdin);
    let mut err_rx = stderr_lines(&mut child);
    let mut reading = Reading {
        run: RunLog::default(),
        waiting: None,
        fatal: false,
        input: protocol.keeps_input_open().then_some(in_tx),
    };
    let mut tail: VecDeque<String> = VecDeque::new();
    let mut stopped = None;
    let mut stdout = child.stdout.take().map(|s| BufReader::new(s).lines());
    let mut stderr_open = true;
    loop {
        tokio::select! {
            line = async { match stdout.as_mut() { Some(l) => l.next_line().await, None => std::future::pending().await } } => {
                match line {
                    Ok(Some(line)) => {
                        if reading.line(&line, protocol, decide, log, on_step) {
                            break;
                        }
                    }
                    _ => stdout = None,
                }
            }
            line = err_rx.recv(), if stderr_open => match line {
                Some(line) => {
                    log.line(&format!("stderr: {line}"));
                    for ev in protocol.stderr(&line) {
                        reading.run.apply(ev);
                    }
                    if tail.len() == 20 {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
                None => stderr_open = false,
            },
            _ = stop.changed(), if stopped.is_none() => {
                let reason = *stop.borrow();
                if let Some(reason) = reason {
                    stopped = Some(reason);
                    break;
                }
            }
            _ = scan.tick() => tree.refresh(),
            _ = tokio::time::sleep_until(deadline), if stopped.is_none() => {
                stopped = Some(StopReason::Timeout);
                break;
            }
        }
        if stdout.is_none() && !stderr_open {
            break;
        }
    }
    let Reading { run, waiting, fatal, input } = reading;
    let why = match (stopped, &waiting, fatal) {
        (Some(reason), _, _) => Some(format!("{reason:?}")),
        (None, Some(_), _) => Some("it waits for a decision".to_owned()),
        (None, None, true) => Some("its error will not go away by retrying".to_owned()),
        _ => None,
    };
    let status = end(&mut child, &mut tree, why, input, log).await?;
    Ok(AgentExit {
        exit_code: status.code(),
        stopped,
        stderr_tail: tail.into_iter().collect::<Vec<_>>().join("\n"),
        run,
        waiting,
    })
}

/// The agent's process, in a process group of its own, without TaskBridge's secrets, inside
/// its wall when it has one.
/// With the forwarding out of its network namespace, which must live as long as it does.
fn spawn(
    cmd: &AgentCommand,
) -> std::io::Result<(tokio::process::Child, Option<crate::sandbox::netns::Forwarding>)> {
    let mut child = Command::new(&cmd.program);
    for var in SECRET_ENV {
        child.env_remove(var);
    }
    let link = crate::sandbox::confine(&mut child, cmd.wall.as_ref(), false)?;
    child
        .args(&cmd.args)
        .current_dir(&cmd.cwd)
        // OpenCode takes its project directory from PWD, not from the real cwd: without this it
        // would work in the worker's directory instead of the task's worktree.
        .env("PWD", &cmd.cwd)
        .envs(cmd.env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let spawned = child.spawn()?;
    let forwarding = link.map(|l| l.forward()).transpose()?;
    Ok((spawned, forwarding))
}

/// Everything for stdin goes through one writer task, so a prompt larger than the pipe never
/// blocks reading the agent's output; dropping the sender closes the agent's stdin. `first` is
/// written first.
fn stdin_writer(child: &mut tokio::process::Child, first: String) -> mpsc::UnboundedSender<String> {
    let (in_tx, mut in_rx) = mpsc::unbounded_channel::<String>();
    if let Some(mut stdin) = child.stdin.take() {
        tokio::spawn(async move {
            while let Some(chunk) = in_rx.recv().await {
                if stdin.write_all(chunk.as_bytes()).await.is_err() {
                    break;
                }
                let _ = stdin.flush().await;
            }
            let _ = stdin.shutdown().await;
        });
    }
    let _ = in_tx.send(first);
    in_tx
}

/// The agent's stderr, a line at a time.
fn stderr_lines(child: &mut tokio::process::Child) -> mpsc::UnboundedReceiver<String> {
    let (err_tx, err_rx) = mpsc::unbounded_channel::<String>();
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if err_tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    err_rx
}

/// What the agent's stdout has said so far.
struct Reading {
    run: RunLog,
    waiting: Option<queue::Ask>,
    /// An error the agent would only retry in vain.
    fatal: bool,
    /// The agent's stdin, while its protocol keeps it open for answers.
    input: Option<mpsc::UnboundedSender<String>>,
}

impl Reading {
    /// Folds one stdout line into the run, answering the agent's requests on the way; whether
    /// reading ends here (the agent waits for a decision, or failed for good).
    fn line(
        &mut self,
        line: &str,
        protocol: &mut dyn AgentProtocol,
        decide: &mut (dyn FnMut(&queue::Ask, &Value) -> Decision + Send),
        log: &mut TaskLog,
        on_step: &mut (dyn FnMut(&RunLog) + Send),
    ) -> bool {
        log.raw(line);
        let Some(events) = protocol.events(line) else {
            log.line(&format!("(not the agent's format) {line}"));
            return false;
        };
        self.run.events += 1;
        for ev in events {
            let close = protocol.ends_input(&ev);
            if let AgentEvent::Decision { request, ask, input } = &ev {
                self.decision(request, ask, input, protocol, decide, log);
            }
            if let AgentEvent::Error(e) = &ev {
                self.fatal |= protocol.is_fatal(e);
            }
            let steps = self.run.usage.steps;
            if let Some(text) = self.run.apply(ev) {
                log.line(&text);
            }
            if self.run.usage.steps != steps {
                on_step(&self.run);
            }
            if close {
                self.input = None;
            }
            if self.waiting.is_some() || self.fatal {
                return true;
            }
        }
        false
    }

    /// A request the agent made over its control channel: answered on stdin, or waited on.
    fn decision(
        &mut self,
        request: &str,
        ask: &queue::Ask,
        tool_input: &Value,
        protocol: &mut dyn AgentProtocol,
        decide: &mut (dyn FnMut(&queue::Ask, &Value) -> Decision + Send),
        log: &mut TaskLog,
    ) {
        let decision = decide(ask, tool_input);
        match (&decision, protocol.answer(request, &decision)) {
            (Decision::Wait, _) => {
                log.line(&format!("the agent waits for a decision: {}", brief(ask)));
                self.waiting = Some(ask.clone());
            }
            (d, Some(reply)) => {
                log.line(&match d {
                    Decision::Deny { message } => format!("denied {}: {message}", brief(ask)),
                    _ => format!("allowed {}", brief(ask)),
                });
                if let Some(tx) = &self.input {
                    let _ = tx.send(format!("{reply}\n"));
                }
            }
            (_, None) => {}
        }
    }
}

/// Waits for the agent to exit, stopping it first (SIGTERM, SIGKILL after [`KILL_GRACE`]) when
/// there is a reason `why`; then kills whatever it left running.
async fn end(
    child: &mut tokio::process::Child,
    tree: &mut ProcessTree,
    why: Option<String>,
    mut input: Option<mpsc::UnboundedSender<String>>,
    log: &mut TaskLog,
) -> std::io::Result<std::process::ExitStatus> {
    // Stdin stays open until the agent has exited: Claude Code takes the end of its input as a
    // refusal of the request it waits on, and would ask its model again before the signal lands.
    let status = if let Some(why) = why {
        log.line(&format!("stopping the agent ({why}): SIGTERM to its processes"));
        tree.refresh();
        tree.signal(Signal::SIGTERM);
        match tokio::time::timeout(KILL_GRACE, child.wait()).await {
            Ok(status) => status?,
            Err(_) => {
                log.line("the agent did not exit in 3 s: SIGKILL");
                tree.refresh();
                tree.signal(Signal::SIGKILL);
                child.wait().await?
            }
        }
    } else {
        // Its output is closed, so it is exiting; an agent still reading stdin ends with it.
        drop(input.take());
        child.wait().await?
    };
    drop(input);
    // Anything the agent left running (servers, watchers, detached commands) goes with it.
    tree.refresh();
    tree.signal(Signal::SIGKILL);
    Ok(status)
}

/// A decision in a few words, for the log: the permission and what it is for, or the question.
fn brief(ask: &queue::Ask) -> String {
    match (&ask.permission, ask.questions.first()) {
        (Some(p), _) => format!("{}: {}", p.permission, p.target.clone().unwrap_or_default()),
        (None, Some(q)) => format!("the question \"{}\"", q.question),
        _ => ask.text(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every process of `pids` that still runs (a zombie has ended).
    fn running(pids: &[i32]) -> Vec<i32> {
        pids.iter().copied().filter(|p| pid_alive(i64::from(*p)) && !zombie(*p)).collect()
    }

    #[test]
    fn an_orphans_whole_tree_is_gone_when_the_kill_returns() {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        // A root in a group of its own, a command detached into a session of its own (as an
        // agent's shell tool runs them), and one in the root's group.
        let script = format!(
            "setsid sh -c 'echo $$ >> {p}; exec sleep 300' & sleep 300 & echo $! >> {p}; wait",
            p = pids.display()
        );
        let mut child = std::process::Command::new("sh")
            .args(["-c", &script])
            .process_group(0)
            .spawn()
            .unwrap();
        let root = child.id() as i32;
        let read = || -> Vec<i32> {
            std::fs::read_to_string(&pids)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect()
        };
        let start = std::time::Instant::now();
        while read().len() < 2 {
            assert!(start.elapsed() < Duration::from_secs(120), "the commands never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        let started = process_start_time(root.into());
        assert!(kill_orphan(root.into(), started.as_deref()));
        let mut all = read();
        all.push(root);
        let _ = child.wait();
        assert_eq!(running(&all), Vec::<i32>::new(), "still running when the kill returned");
    }

    #[test]
    fn a_pid_that_is_another_process_now_is_left_alone() {
        let mut child = std::process::Command::new("sleep").arg("300").spawn().unwrap();
        let pid = child.id() as i64;
        assert!(!kill_orphan(pid, Some("not its start time")));
        assert!(!kill_orphan(pid, None));
        assert_eq!(running(&[pid as i32]), vec![pid as i32]);
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
