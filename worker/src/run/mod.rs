//! One run of a claimed task, as a pipeline of stages that each hand the next one value:
//!
//! 1. [`worktree`]: prepare. The task's dependencies' work put together, the directory it runs
//!    in made ready on its branch, the repository's set-up commands run: a [`Run`].
//!    Then [`wall`]: the sandbox the agent's turns run in, built for that worktree and the
//!    task's rules (or the run refused, when the kernel cannot hold a rule it asks for).
//! 2. [`prompt`]: what the agent is told (a new task, an answer, a follow-up, an interrupted run
//!    going on, planner notes): a [`prompt::Conversation`].
//! 3. [`turns`]: the agent's turns, on whichever agent the task names (OpenCode's warm server,
//!    `opencode run`, Claude Code, Codex), with the repository's checks and their fix rounds and
//!    the budgets checked after every step.
//! 4. [`outcome`]: each turn's exit assessed, purely: failed and why, waiting on a decision,
//!    stopped, or finished.
//! 5. [`worktree`] again: finish. The work committed, a read-only task's edits reverted, files
//!    and diff read from git, the directory removed or kept as a spare.
//!
//! A stage that ends the run early returns [`End`]; the claim loop ([`crate::claim_loop`])
//! records whatever outcome the run came to.

mod outcome;
mod prompt;
mod turns;
mod wall;
mod worktree;

use crate::agent::AgentSpec;
use crate::claim_loop::Worker;
use crate::error::{Error, Result};
use crate::events::Usage;
use crate::logs::TaskLog;
use crate::process::StopReason;
use crate::trace::Attempt;
use queue::{Outcome, Task};
use std::path::PathBuf;
use tokio::sync::watch;

pub(crate) use prompt::DepInfo;

/// What the stages share about the run once its worktree is ready.
pub(crate) struct Run<'a> {
    pub task: &'a Task,
    /// The claim's fencing token: every write of this run carries it.
    pub token: i64,
    pub spec: AgentSpec,
    /// The worktree, its branch, and the commit it started from.
    pub dir: PathBuf,
    pub branch: String,
    pub start: String,
    /// What the task's dependencies did (for its prompt; empty after its first run).
    pub deps: Vec<DepInfo>,
    /// Its first run: not a retry, nor an answer's resumption.
    pub first_run: bool,
    /// The directory a follow-up's parent ran in, when this run could go on there.
    pub parent_dir: Option<PathBuf>,
    /// The model named to the agent (the task's, else for OpenCode the queue's default).
    pub model: Option<String>,
    /// Whether this worker has a warm server at all.
    pub warm_server: bool,
    /// The major version of the worker's OpenCode, where it could tell.
    pub opencode_major: Option<u32>,
    /// How the agent is started when it is driven over ACP (OpenCode in `acp` mode, a
    /// configured agent).
    pub acp: Option<crate::agent::acp::Launch>,
    pub deadline: tokio::time::Instant,
    /// The sandbox the agent runs in (filled in by the wall stage).
    pub walled: wall::Walled,
}

/// How a run ends before its last stage.
pub(crate) enum End {
    /// With this outcome.
    Outcome(Outcome),
    /// The lease was lost: another worker owns the task, and nothing may be written.
    LostLease,
    /// An error of the worker itself (the claim loop records it as a failed attempt).
    Error(Error),
}

impl From<Error> for End {
    fn from(e: Error) -> End {
        match e {
            Error::Queue(queue::Error::StaleLease { .. }) => End::LostLease,
            e => End::Error(e),
        }
    }
}

impl From<Outcome> for End {
    fn from(o: Outcome) -> End {
        End::Outcome(o)
    }
}

/// A stage's value, or the run's end.
pub(crate) type Stage<T> = std::result::Result<T, End>;

/// What the claim hands the run besides its task and token.
pub(crate) struct Given {
    /// The answer a resumed session goes on with.
    pub resume: Option<queue::Resume>,
    /// The planner's notes not yet given to the agent.
    pub new_notes: Vec<String>,
}

impl Worker {
    /// Runs the task's stages; `None` when the lease was lost (nothing may be written).
    pub(crate) async fn run_once(
        &self,
        task: &Task,
        token: i64,
        given: Given,
        log: &mut TaskLog,
        stop: watch::Receiver<Option<StopReason>>,
        attempt: &Attempt,
    ) -> Result<Option<Outcome>> {
        let Given { resume, new_notes } = given;
        let mut ran_in = None;
        let stages = async {
            let mut run = {
                let _step = attempt.step("worktree");
                self.prepare(task, token, log).await?
            };
            ran_in = Some(run.dir.clone());
            crate::trace::stamp(task.id, "prepared");
            run.walled = self.wall(&run, log).await?;
            crate::trace::stamp(task.id, "walled");
            let mut talk = prompt::Conversation::new(&run, resume, &new_notes, &self.cfg);
            let res = self.turns(&run, &mut talk, &new_notes, log, stop, attempt).await?;
            crate::trace::stamp(task.id, "turned");
            let _step = attempt.step("commit");
            let finished = self.finish(&run, res, log).await;
            crate::trace::stamp(task.id, "committed");
            finished
        };
        let ended = stages.await;
        // An ACP agent of the task's own goes with its run; what a shared one still runs in
        // the worktree goes too, unless the task waits in its session.
        self.acp.stop(&wall::own_server(task)).await;
        let parked = matches!(
            ended,
            Ok(Outcome::Waiting { .. }) | Err(End::Outcome(Outcome::Waiting { .. }))
        );
        if let (Some(dir), false) = (&ran_in, parked) {
            let killed = self.acp.kill_working_in(dir).await;
            if killed > 0 {
                log.line(&format!(
                    "stopped {killed} process(es) the agent left running in its worktree"
                ));
            }
        }
        // A server of the task's own goes with its run, before the TMPDIR it was given.
        if let Some(servers) = &self.servers {
            servers.stop(&wall::own_server(task)).await;
            // What the agent left running in its worktree on a shared server goes too, unless
            // the task waits in its session (its turn goes on after the answer).
            let waits = matches!(
                ended,
                Ok(Outcome::Waiting { .. }) | Err(End::Outcome(Outcome::Waiting { .. }))
            );
            if let (Some(dir), false) = (&ran_in, waits) {
                let killed = servers.kill_working_in(dir).await;
                if killed > 0 {
                    log.line(&format!(
                        "stopped {killed} process(es) the agent left running in its worktree"
                    ));
                }
            }
        }
        // The task's private temporary files go with the run that made them.
        let _ = std::fs::remove_dir_all(wall::task_tmp(&self.home, task));
        match ended {
            Ok(outcome) | Err(End::Outcome(outcome)) => Ok(Some(outcome)),
            Err(End::LostLease) => Ok(None),
            Err(End::Error(e)) => Err(e),
        }
    }
}

impl Run<'_> {
    /// Whether a warm agent process runs this task, holding its session (OpenCode's server, an
    /// ACP agent); every other agent runs a process a turn.
    pub fn serving(&self) -> bool {
        self.acp.is_some()
            || (self.warm_server && self.spec.kind == crate::agent::AgentKind::OpenCode)
    }

    /// What the agent could do on this run. OpenCode 1 over ACP has no way to put its
    /// `question` tool to the client (2 asks it as a form), so its questions come in its answer.
    pub fn capabilities(&self) -> queue::Capabilities {
        let mut caps = self.spec.kind.capabilities(self.serving());
        if self.acp.is_some()
            && self.spec.kind == crate::agent::AgentKind::OpenCode
            && self.opencode_major.is_some_and(|m| m < 2)
        {
            caps.native_questions = false;
        }
        caps
    }

    /// How the agent is driven, as the result reports it.
    pub fn mode(&self) -> Option<&'static str> {
        match (&self.acp, self.spec.kind) {
            (Some(_), _) => Some("acp"),
            (None, crate::agent::AgentKind::OpenCode) if self.warm_server => Some("serve"),
            (None, crate::agent::AgentKind::OpenCode) => Some("run"),
            _ => None,
        }
    }
}

/// What the task's earlier runs (before an answer, before a retry) spent.
fn previous_usage(task: &Task) -> Usage {
    task.result.as_ref().map(|r| r.usage.clone()).unwrap_or_default()
}

/// What the task had spent before a turn: its earlier runs, and `carried`, this run's earlier
/// turns (its fix rounds).
fn spent_before(task: &Task, carried: &Usage) -> Usage {
    let mut u = previous_usage(task);
    u.add(carried);
    u
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::agent::AgentKind;

    /// A run of `task` on `kind`, its worktree ready, as the stages after the first see it.
    pub(crate) fn run_of(task: &Task, kind: AgentKind) -> Run<'_> {
        Run {
            task,
            token: 7,
            spec: AgentSpec { kind, opencode_agent: None, configured: None },
            dir: PathBuf::from("/w/task-1"),
            branch: "taskbridge/task-1".into(),
            start: "s".repeat(40),
            deps: vec![],
            first_run: true,
            parent_dir: None,
            model: Some("anthropic/claude-x".into()),
            warm_server: true,
            acp: None,
            opencode_major: None,
            deadline: tokio::time::Instant::now(),
            walled: Default::default(),
        }
    }
}
