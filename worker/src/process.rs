//! Running an agent as the leader of its own process group, reading its event stream as it
//! arrives, and stopping the whole group on cancel, timeout or a lost lease.

use crate::events::RunLog;
use crate::logs::TaskLog;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::{mpsc, watch};

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
}

pub struct AgentExit {
    pub exit_code: Option<i32>,
    pub stopped: Option<StopReason>,
    pub stderr_tail: String,
    pub run: RunLog,
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
    let Ok(pid) = i32::try_from(pid) else { return false };
    nix::sys::signal::kill(Pid::from_raw(pid), None).is_ok()
}

/// Kills the process group led by `pid` if that process is the one that started at `started`.
pub fn kill_orphan(pid: i64, started: Option<&str>) -> bool {
    let (Ok(p), Some(started)) = (i32::try_from(pid), started) else { return false };
    if process_start_time(pid).as_deref() != Some(started) {
        return false;
    }
    killpg(Pid::from_raw(p), Signal::SIGKILL).is_ok()
}

fn signal_group(pgid: i32, sig: Signal) {
    // ESRCH (the group is gone) is the normal case after a clean exit.
    let _ = killpg(Pid::from_raw(pgid), sig);
}

/// Spawns the agent, feeds it `stdin` and closes it (OpenCode reads stdin to EOF), and reads its
/// events until it exits or `stop` says otherwise. `on_spawn` gets the pid and start time so an
/// orphan can be found after a crash.
pub async fn run_agent(
    cmd: AgentCommand,
    log: &mut TaskLog,
    mut stop: watch::Receiver<Option<StopReason>>,
    deadline: tokio::time::Instant,
    on_spawn: impl FnOnce(i64, Option<String>),
) -> std::io::Result<AgentExit> {
    let mut child = Command::new(&cmd.program)
        .args(&cmd.args)
        .current_dir(&cmd.cwd)
        // OpenCode takes its project directory from PWD, not from the real cwd (agent-clis.md §5).
        .env("PWD", &cmd.cwd)
        .envs(cmd.env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id().map(i64::from).unwrap_or(0);
    on_spawn(pid, process_start_time(pid));
    let pgid = i32::try_from(pid).unwrap_or(0);

    if let Some(mut stdin) = child.stdin.take() {
        let prompt = cmd.stdin;
        tokio::spawn(async move {
            let _ = stdin.write_all(prompt.as_bytes()).await;
            let _ = stdin.shutdown().await;
        });
    }
    let (err_tx, mut err_rx) = mpsc::unbounded_channel::<String>();
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
    let mut run = RunLog::default();
    let mut tail: VecDeque<String> = VecDeque::new();
    let mut stopped = None;
    let mut stdout = child.stdout.take().map(|s| BufReader::new(s).lines());
    let mut stderr_open = true;
    loop {
        tokio::select! {
            line = async { match stdout.as_mut() { Some(l) => l.next_line().await, None => std::future::pending().await } } => {
                match line {
                    Ok(Some(line)) => {
                        log.raw(&line);
                        if let Some(text) = run.ingest(&line) {
                            log.line(&text);
                        }
                    }
                    _ => stdout = None,
                }
            }
            line = err_rx.recv(), if stderr_open => match line {
                Some(line) => {
                    log.line(&format!("stderr: {line}"));
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
            _ = tokio::time::sleep_until(deadline), if stopped.is_none() => {
                stopped = Some(StopReason::Timeout);
                break;
            }
        }
        if stdout.is_none() && !stderr_open {
            break;
        }
    }
    let status = if let Some(reason) = stopped {
        log.line(&format!("stopping the agent ({reason:?}): SIGTERM to its process group"));
        signal_group(pgid, Signal::SIGTERM);
        match tokio::time::timeout(KILL_GRACE, child.wait()).await {
            Ok(status) => status?,
            Err(_) => {
                log.line("the agent did not exit in 3 s: SIGKILL");
                signal_group(pgid, Signal::SIGKILL);
                child.wait().await?
            }
        }
    } else {
        child.wait().await?
    };
    // Anything the agent left running in its group (servers, watchers) goes with it.
    signal_group(pgid, Signal::SIGKILL);
    Ok(AgentExit {
        exit_code: status.code(),
        stopped,
        stderr_tail: tail.into_iter().collect::<Vec<_>>().join("\n"),
        run,
    })
}
