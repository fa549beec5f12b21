//! `[verify]` in `.taskbridge.toml`: checks TaskBridge runs itself in the worktree after the
//! agent says it is done; a failure goes back to the agent (the run's turns, `run/turns.rs`) or fails the task.

use crate::logs::TaskLog;
use crate::{process, result};
use serde::Deserialize;
use std::path::Path;
use std::time::Duration;

/// `[verify]`: checks TaskBridge runs itself after the agent says it is done.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyConfig {
    /// Shell commands, run in the worktree in order; the first that fails is sent back.
    #[serde(default)]
    pub commands: Vec<String>,
    /// How many times a failure goes back to the agent before the task fails.
    #[serde(default = "default_rounds")]
    pub rounds: u32,
    /// Each command's time limit.
    #[serde(default = "default_check_timeout")]
    pub timeout_s: u64,
}

fn default_rounds() -> u32 {
    2
}

fn default_check_timeout() -> u64 {
    600
}

impl Default for VerifyConfig {
    fn default() -> Self {
        VerifyConfig {
            commands: vec![],
            rounds: default_rounds(),
            timeout_s: default_check_timeout(),
        }
    }
}

/// Where the checks run: the task's wall and the environment that goes with it (its TMPDIR,
/// the proxy). They run the agent's code (its tests, its build scripts), so never outside the
/// wall the agent had; `None` only where the agent had none either.
#[derive(Clone, Default)]
pub struct Confined {
    pub wall: Option<std::sync::Arc<crate::sandbox::Wall>>,
    pub env: Vec<(String, String)>,
}

/// Runs the checks in order (stopping at the first failure), logging each. Returns what ran
/// and the failure, if any.
pub async fn run_checks(
    dir: &Path,
    cfg: &VerifyConfig,
    round: u32,
    confined: &Confined,
    log: &mut TaskLog,
) -> (Vec<result::Check>, Option<result::Check>) {
    let mut out = Vec::new();
    for cmd in &cfg.commands {
        log.line(&format!("verify: $ {cmd}"));
        let started = std::time::Instant::now();
        let child = spawn_check(cmd, dir, confined);
        let (exit_code, output) = match child {
            Err(e) => (Some(127), format!("could not start: {e}")),
            Ok((child, _forwarding)) => {
                let pid = child.id();
                match tokio::time::timeout(
                    Duration::from_secs(cfg.timeout_s),
                    child.wait_with_output(),
                )
                .await
                {
                    Ok(Ok(o)) => (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned()),
                    Ok(Err(e)) => (Some(127), format!("failed: {e}")),
                    Err(_) => {
                        if let Some(p) = pid {
                            process::kill_group(p as i32);
                        }
                        (None, format!("stopped after {} s", cfg.timeout_s))
                    }
                }
            }
        };
        let tail = tail_lines(&output, 40, 4000);
        let check = result::Check {
            command: cmd.clone(),
            exit_code,
            duration_s: started.elapsed().as_secs_f64(),
            output_tail: tail,
            round,
        };
        log.line(&format!(
            "verify: `{cmd}` {} in {:.1} s",
            exit_code.map_or("timed out".to_owned(), |c| format!("exited {c}")),
            check.duration_s
        ));
        let failed = exit_code != Some(0);
        out.push(check.clone());
        if failed {
            return (out, Some(check));
        }
    }
    (out, None)
}

/// One check's shell, confined as the agent was, with the forwarding out of its network
/// namespace (kept as long as it runs).
fn spawn_check(
    cmd: &str,
    dir: &Path,
    confined: &Confined,
) -> std::io::Result<(tokio::process::Child, Option<crate::sandbox::netns::Forwarding>)> {
    let mut command = tokio::process::Command::new("sh");
    for var in process::SECRET_ENV {
        command.env_remove(var);
    }
    let link = crate::sandbox::confine(&mut command, confined.wall.as_ref(), false)?;
    let child = command
        .envs(confined.env.iter().map(|(k, v)| (k, v)))
        .arg("-c")
        .arg(format!("{cmd} 2>&1"))
        .current_dir(dir)
        .env("PWD", dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    Ok((child, link.map(|l| l.forward()).transpose()?))
}

/// The last `lines` lines of `text`, at most `max` bytes.
fn tail_lines(text: &str, lines: usize, max: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    let mut tail = all[all.len().saturating_sub(lines)..].join("\n");
    if tail.len() > max {
        let mut cut = tail.len() - max;
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        tail = tail[cut..].to_owned();
    }
    tail
}
