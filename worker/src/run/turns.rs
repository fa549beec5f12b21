//! The agent's turns. Each turn runs on the agent the task names: OpenCode's warm server (a
//! prompt, or the reply to the request it is blocked on), `opencode run` (a process per turn), or
//! Claude Code or Codex (a process per turn, its tool calls decided against the task's rules as
//! they come). The spend is recorded after every step and checked against the task's budgets;
//! after a turn the agent says it is done, the repository's `[verify]` checks run, and a failure
//! goes back to the agent in the same session, up to `rounds` times.

use super::outcome;
use super::prompt::{Conversation, exit_status, notes_section};
use super::{Run, Stage, previous_usage, spent_before};
use crate::agent::AgentKind;
use crate::agent::opencode_serve::{Control, Delivery, Progress, ServeAgent};
use crate::claim_loop::Worker;
use crate::config::RepoConfig;
use crate::events::{RunLog, Usage};
use crate::logs::TaskLog;
use crate::process::{self, AgentCommand, AgentExit, StopReason};
use crate::result::{Check, TaskResult};
use queue::{Outcome, RunFacts, Store, TaskId};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

type Stop = watch::Receiver<Option<StopReason>>;

impl Worker {
    /// The turns until the agent is done and the checks pass: the result to finish with.
    pub(super) async fn turns(
        &self,
        run: &Run<'_>,
        talk: &mut Conversation,
        new_notes: &[String],
        log: &mut TaskLog,
        stop: Stop,
        attempt: &crate::trace::Attempt,
    ) -> Stage<TaskResult> {
        let (task, id) = (run.task, run.task.id);
        // The checks are the user's: read from the commit the task was submitted on, never from
        // one the agents made (a dependency's work this task is stacked on).
        let verify =
            RepoConfig::at(Path::new(&task.repo), &task.base).map(|c| c.verify).unwrap_or_default();
        let confined = match verify.commands.is_empty() {
            true => crate::verify::Confined::default(),
            false => self.confined(run).await?,
        };
        let mut verification: Vec<Check> = Vec::new();
        let mut round = 0u32;
        loop {
            let mut span = attempt.turn(task);
            let exit = self.turn(run, talk, new_notes, log, stop.clone()).await?;
            span.usage(&exit.run.usage);
            drop(span);
            let mut res = outcome::result_of(&exit, run, &talk.carried);
            if let Some(session) = &exit.run.session_id {
                let facts = RunFacts { session_id: Some(session.clone()), ..Default::default() };
                let token = run.token;
                let _ = self.blocking(move |s| s.record_run(id, token, facts)).await;
            }
            res.permission_requests = self.permission_requests(id).await;
            let verdict = outcome::assess(&exit, run, talk.rejected.as_deref());
            let mut res = self.settle(run, verdict, res).await?;
            if verify.commands.is_empty() {
                return Ok(res);
            }
            round += 1;
            let mut span = attempt.step("verify");
            let (checks, failed) =
                crate::verify::run_checks(&run.dir, &verify, round, &confined, log).await;
            if let Some(f) = &failed {
                span.failed(&format!("`{}` failed", f.command));
            }
            drop(span);
            verification.extend(checks);
            res.verification = verification.clone();
            let Some(f) = failed else {
                res.verified = Some(true);
                return Ok(res);
            };
            if round > verify.rounds {
                res.verified = Some(false);
                self.fill_diff(run, &mut res, false).await;
                if let Some(end) = super::worktree::tampered(&mut res) {
                    return Err(end.into());
                }
                let error = verification_failed(&f, verify.rounds);
                return Err(Outcome::FailedPermanently {
                    error,
                    kind: queue::FailureKind::Checks,
                    result: Some(Box::new(res)),
                }
                .into());
            }
            log.line(&format!(
                "verification failed: sending `{}`'s output back to the agent (fix round {round} \
                 of {})",
                f.command, verify.rounds
            ));
            talk.fix_round(run, &f, res.session_id.clone());
            talk.carried.add(&exit.run.usage);
        }
    }

    /// One turn, on the agent the task names.
    async fn turn(
        &self,
        run: &Run<'_>,
        talk: &Conversation,
        new_notes: &[String],
        log: &mut TaskLog,
        stop: Stop,
    ) -> Stage<AgentExit> {
        if let Some(agent) = &run.walled.acp {
            return self.turn_acp(agent, run, talk, new_notes, log, stop).await;
        }
        match (&run.walled.server, run.spec.kind) {
            (Some(server), AgentKind::OpenCode) => {
                self.turn_serve(server, run, talk, new_notes, log, stop).await
            }
            (None, AgentKind::OpenCode) => self.turn_opencode_run(run, talk, log, stop).await,
            (_, kind) => self.turn_cli(kind, run, talk, log, stop).await,
        }
    }

    /// A turn on OpenCode's warm server: the reply to the request the agent is blocked on when
    /// the server still holds it, else a prompt in the session.
    async fn turn_serve(
        &self,
        server: &ServeAgent,
        run: &Run<'_>,
        talk: &Conversation,
        new_notes: &[String],
        log: &mut TaskLog,
        stop: Stop,
    ) -> Stage<AgentExit> {
        let task = run.task;
        let mut grants = crate::decisions::always_grants(task);
        let delivery = self.delivery(server, run, talk, new_notes).await;
        if let (Some(what), Delivery::Prompt(_)) = (&talk.rejected, &delivery) {
            return Err(rejected(what));
        }
        if let (Delivery::Prompt(_), Some(approved)) = (&delivery, talk.approved()) {
            // The blocked request is gone: an approval must still hold when the agent asks again
            // for the same thing.
            grants.once.push(approved);
        }
        let session = talk.session(task);
        let turn = crate::agent::opencode_serve::Turn {
            task,
            dir: &run.dir,
            delivery,
            model: run.model.clone(),
            session: session.clone(),
            without_session: talk.without_session.clone(),
            grants,
            ahead: run.walled.shared_server().is_some() && !task.worktree_keep,
        };
        let mut on_step = progress(self.store.clone(), run, session);
        match server.run(turn, log, stop, run.deadline, &mut on_step).await {
            Ok(exit) => Ok(exit),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let error = self.opencode_not_found();
                Err(Outcome::FailedPermanently {
                    error,
                    kind: queue::FailureKind::Launch,
                    result: None,
                }
                .into())
            }
            Err(e) => Err(Outcome::Failed {
                error: format!("the OpenCode server failed: {e}"),
                kind: queue::FailureKind::Exit,
                result: None,
                backoff_s: self.backoff(task.attempts),
            }
            .into()),
        }
    }

    /// A turn on a warm ACP agent: the answer as the response to the request the agent is
    /// blocked on when this worker still holds it, else a prompt in the session.
    async fn turn_acp(
        &self,
        agent: &crate::agent::acp::AcpAgent,
        run: &Run<'_>,
        talk: &Conversation,
        new_notes: &[String],
        log: &mut TaskLog,
        stop: Stop,
    ) -> Stage<AgentExit> {
        let task = run.task;
        let mut grants = crate::decisions::always_grants(task);
        let mut answer = None;
        if let Some((r, ask)) = talk.resume.as_ref().and_then(|r| Some((r, r.ask.as_ref()?)))
            && let Some(request) = ask.request_id.as_deref()
            && agent.holds_parked(task.id, request).await
        {
            answer = Some((ask.clone(), r.answer.clone(), new_notes.to_vec()));
        }
        if answer.is_none() {
            if let Some(what) = &talk.rejected {
                return Err(rejected(what));
            }
            // The blocked request is gone: an approval must still hold when the agent asks
            // again for the same thing.
            grants.once.extend(talk.approved());
        }
        let session = talk.session(task);
        let ledger = (run.spec.kind == AgentKind::OpenCode)
            .then(|| crate::agent::acp::ledger::database(&self.cfg.env))
            .flatten();
        let turn = crate::agent::acp::Turn {
            task,
            dir: &run.dir,
            prompt: talk.prompt.clone(),
            answer,
            model: run.model.clone(),
            session: session.clone(),
            without_session: talk.without_session.clone(),
            grants,
            mcp_servers: self.mcp_servers(),
            ledger,
            // A shared agent's directory may be kept for the repository's next task.
            ahead: run.walled.wall.is_none() && !task.worktree_keep,
        };
        let mut on_step = progress(self.store.clone(), run, session);
        let name = run.spec.name().to_owned();
        match agent.run(turn, log, stop, run.deadline, &mut on_step).await {
            Ok(exit) => Ok(exit),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let error = match run.spec.kind {
                    AgentKind::OpenCode => self.opencode_not_found(),
                    _ => format!("could not start the {name} agent: {e}"),
                };
                let kind = queue::FailureKind::Launch;
                Err(Outcome::FailedPermanently { error, kind, result: None }.into())
            }
            // The agent spoke the protocol wrongly: no retry mends that.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                let kind = queue::FailureKind::Launch;
                Err(Outcome::FailedPermanently { error: e.to_string(), kind, result: None }.into())
            }
            Err(e) => Err(Outcome::Failed {
                error: e.to_string(),
                kind: queue::FailureKind::Exit,
                result: None,
                backoff_s: self.backoff(task.attempts),
            }
            .into()),
        }
    }

    /// The MCP servers a new ACP session is given: the reverse bridge, when the worker offers
    /// it (`--claude-bridge`).
    fn mcp_servers(&self) -> serde_json::Value {
        let Some(bridge) = &self.cfg.claude_bridge else { return serde_json::json!([]) };
        let Some((program, args)) = bridge.split_first() else { return serde_json::json!([]) };
        serde_json::json!([{
            "name": crate::opencode_config::BRIDGE_MCP_NAME,
            "command": program,
            "args": args,
            "env": [],
        }])
    }

    /// What the warm server is given: the answer as the reply to the request the agent is
    /// parked on, when the server still holds it; else the conversation's prompt.
    async fn delivery(
        &self,
        server: &ServeAgent,
        run: &Run<'_>,
        talk: &Conversation,
        new_notes: &[String],
    ) -> Delivery {
        let (id, token) = (run.task.id, run.token);
        let prompt = Delivery::Prompt(talk.prompt.clone());
        let Some((r, ask)) = talk.resume.as_ref().and_then(|r| Some((r, r.ask.as_ref()?))) else {
            return prompt;
        };
        let Some(request) = ask.request_id.as_deref() else { return prompt };
        if !server.take_parked(id, request).await {
            return prompt;
        }
        // A tool call's reply carries notes only for a question; a permission's would lose
        // them, so they wait for the next prompt.
        if ask.kind != queue::AskKind::Question && !new_notes.is_empty() {
            let notes = new_notes.to_vec();
            let undone = self.blocking(move |s| s.undeliver_notes(id, token, &notes)).await;
            if let Err(e) = undone {
                tracing::warn!(task = %id, error = %e, "keeping notes for later failed");
            }
        }
        crate::decisions::native_reply(ask, &r.answer, new_notes)
    }

    /// A turn of `opencode run`: a process in the worktree. Several first runs under a fresh
    /// OpenCode home race on its database migration (one of them exits with "Failed query"
    /// before any event); such a run did no work and is simply run again.
    async fn turn_opencode_run(
        &self,
        run: &Run<'_>,
        talk: &Conversation,
        log: &mut TaskLog,
        stop: Stop,
    ) -> Stage<AgentExit> {
        let (id, token) = (run.task.id, run.token);
        let program = self.cfg.opencode.clone();
        let mut tries = 0;
        loop {
            tries += 1;
            let cmd = AgentCommand {
                program: program.clone(),
                args: talk.args.clone(),
                env: talk.env.iter().chain(&run.walled.env).cloned().collect(),
                cwd: run.dir.clone(),
                stdin: talk.prompt.clone(),
                wall: run.walled.wall.clone(),
            };
            log.line(&format!("$ {} {}", program.display(), shell_words(&talk.args)));
            let mut never = |_: &queue::Ask, _: &serde_json::Value| crate::policy::Decision::Wait;
            let mut on_step = spend_recorder(
                self.store.clone(),
                id,
                token,
                spent_before(run.task, &talk.carried),
            );
            let exit = process::run_agent(
                cmd,
                &mut crate::agent::opencode_run::OpenCodeRun,
                &mut never,
                log,
                stop.clone(),
                run.deadline,
                pid_recorder(self.store.clone(), id, token),
                &mut on_step,
            )
            .await;
            let exit = exit.map_err(|e| {
                let error = match e.kind() {
                    std::io::ErrorKind::NotFound => self.opencode_not_found(),
                    _ => format!("could not start '{}': {e}", program.display()),
                };
                Outcome::FailedPermanently { error, kind: queue::FailureKind::Launch, result: None }
            })?;
            let migration_race = exit.stopped.is_none()
                && exit.exit_code != Some(0)
                && exit.run.events == 0
                && exit.stderr_tail.contains("Failed query");
            if !(migration_race && tries < 4) {
                return Ok(exit);
            }
            log.line("OpenCode failed while setting up its database; running it again");
            tokio::time::sleep(Duration::from_millis(300 * tries)).await;
        }
    }

    /// A turn of Claude Code or Codex: a process in the worktree, its tool calls decided
    /// against the task's rules as they come.
    async fn turn_cli(
        &self,
        kind: AgentKind,
        run: &Run<'_>,
        talk: &Conversation,
        log: &mut TaskLog,
        stop: Stop,
    ) -> Stage<AgentExit> {
        let (task, dir, model) = (run.task, run.dir.as_path(), run.model.as_deref());
        if let Some(what) = &talk.rejected {
            return Err(rejected(what));
        }
        let session = talk.session(task);
        let mut grants = crate::decisions::always_grants(task);
        // The agent asks again for what was approved; this time it is let through.
        grants.once.extend(talk.approved());
        let program = self.program(kind).to_path_buf();
        if let Some(missing) = kind.missing(&program, &self.cfg.env) {
            let kind = queue::FailureKind::Launch;
            return Err(Outcome::FailedPermanently { error: missing, kind, result: None }.into());
        }
        let (args, stdin, mut protocol): (_, _, Box<dyn crate::agent::AgentProtocol>) = match kind {
            AgentKind::ClaudeCode => {
                if let Some(s) = &session {
                    crate::agent::claude::carry_session(s, dir, &self.cfg.env);
                }
                (
                    crate::agent::claude::args(task, model, session.as_deref()),
                    crate::agent::claude::prompt_line(&talk.prompt),
                    Box::new(crate::agent::claude::ClaudeStream::new(&self.cfg.env)),
                )
            }
            _ => (
                crate::agent::codex::args(
                    task,
                    model,
                    session.as_deref(),
                    run.walled.wall.is_some(),
                ),
                talk.prompt.clone(),
                Box::new(crate::agent::codex::CodexStream),
            ),
        };
        log.line(&format!("$ {} {}", program.display(), shell_words(&args)));
        let cmd = AgentCommand {
            program,
            args,
            env: run.walled.env.clone(),
            cwd: dir.to_path_buf(),
            stdin,
            wall: run.walled.wall.clone(),
        };
        let mut decide = |ask: &queue::Ask, input: &serde_json::Value| match &ask.permission {
            Some(p) if ask.kind == queue::AskKind::Permission => {
                let tool = crate::policy::ToolUse {
                    permission: p.permission.clone(),
                    pattern: p.patterns.first().cloned().unwrap_or_default(),
                };
                crate::policy::decide(task, dir, &mut grants, &tool, input)
            }
            // The agent's own question: the planner or a person answers it.
            _ => crate::policy::Decision::Wait,
        };
        let (id, token) = (task.id, run.token);
        let mut on_step =
            spend_recorder(self.store.clone(), id, token, spent_before(run.task, &talk.carried));
        let exit = process::run_agent(
            cmd,
            protocol.as_mut(),
            &mut decide,
            log,
            stop,
            run.deadline,
            pid_recorder(self.store.clone(), id, token),
            &mut on_step,
        )
        .await;
        exit.map_err(|e| {
            let error = format!("could not start '{}': {e}", self.program(kind).display());
            Outcome::FailedPermanently { error, kind: queue::FailureKind::Launch, result: None }
                .into()
        })
    }

    fn opencode_not_found(&self) -> String {
        format!(
            "could not start '{}': not found. Install OpenCode with `npm install -g opencode-ai` \
             or set TASKBRIDGE_OPENCODE to its path",
            self.cfg.opencode.display()
        )
    }
}

/// The run's end when the answer it resumes with was a bare `reject` and no blocked request can
/// take it: the agent is stopped there, as OpenCode stops it.
fn rejected(what: &str) -> super::End {
    let error = format!("stopped: the answer rejected {what}");
    let kind = queue::FailureKind::Rejected;
    Outcome::FailedPermanently { error, kind, result: None }.into()
}

/// Why the task failed when its checks still fail after the fix rounds.
fn verification_failed(f: &Check, rounds: u32) -> String {
    let fixes = match rounds {
        0 => String::new(),
        1 => " and its one round of fixes".to_owned(),
        n => format!(" and its {n} rounds of fixes"),
    };
    let output = match f.output_tail.trim() {
        "" => "it printed nothing".to_owned(),
        tail => format!("its output ends:\n{tail}"),
    };
    format!(
        "verification failed after the agent's work{fixes}: `{}` exited {}; {output}",
        f.command,
        exit_status(f.exit_code)
    )
}

/// Records the agent's pid and start time on the task as soon as it is spawned, so that a
/// worker that dies leaves an orphan the next one can find and kill.
fn pid_recorder(store: Arc<Store>, id: TaskId, token: i64) -> impl FnOnce(i64, Option<String>) {
    move |pid, started| {
        let facts = RunFacts { agent_pid: Some(pid), agent_started: started, ..Default::default() };
        if let Err(e) = store.record_run(id, token, facts) {
            tracing::warn!(task = %id, error = %e, "recording the agent pid failed");
        }
    }
}

/// Records the spend so far on the task after each step of an agent process (`spent` before
/// this turn, plus the turn's own), so a run cut short by Ctrl-C or kill -9 loses none of what
/// the agent reported.
fn spend_recorder(
    store: Arc<Store>,
    id: TaskId,
    token: i64,
    spent: Usage,
) -> impl FnMut(&RunLog) + Send + 'static {
    move |run| {
        let mut usage = spent.clone();
        usage.add(&run.usage);
        let partial =
            TaskResult { usage, session_id: run.session_id.clone(), ..Default::default() };
        let facts = RunFacts { result: Some(partial), ..Default::default() };
        if let Err(e) = store.record_run(id, token, facts) {
            tracing::debug!(task = %id, error = %e, "recording the spend failed");
        }
    }
}

/// What the warm server's turn reports as it goes, answered: the session recorded at once (so
/// an interrupted task resumes it), decisions made by a rule recorded, planner notes passed on
/// between steps, and the spend recorded after every step and checked against the budgets.
/// The spend and the budget are read and written in place: both are single-row statements,
/// and the budget must be checked before the agent takes another step.
fn progress(
    store: Arc<Store>,
    run: &Run<'_>,
    mut session: Option<String>,
) -> impl FnMut(Progress<'_>) -> Control + Send + 'static {
    let (task, id, token) = (run.task, run.task.id, run.token);
    let prev = previous_usage(task);
    // Only a task given a budget (its own or its batch's) can get one later.
    let budgeted = task.budget.is_set() || task.budget_group.is_some();
    let earlier_budget =
        task.questions.iter().filter_map(|q| q.ask.as_ref()?.budget.clone()).next();
    move |p| {
        let step = match p {
            Progress::Session(s) => {
                session = Some(s.to_owned());
                let facts = RunFacts { session_id: Some(s.to_owned()), ..Default::default() };
                if let Err(e) = store.record_run(id, token, facts) {
                    tracing::debug!(task = %id, error = %e, "recording the session failed");
                }
                return Control::Go;
            }
            Progress::Approved(ask) => {
                let (store, ask) = (store.clone(), ask.clone());
                tokio::task::spawn_blocking(move || {
                    let r = store.record_decision(id, token, &ask, "once", "rule");
                    if let Err(e) = r {
                        tracing::debug!(task = %id, error = %e, "recording a decision failed");
                    }
                });
                return Control::Go;
            }
            Progress::Tick => return note_for_agent(&store, id, token),
            Progress::Step(u) => u,
        };
        let mut usage = prev.clone();
        usage.add(step);
        let (cost, tokens) = (usage.cost(), usage.tokens());
        let partial = TaskResult { usage, session_id: session.clone(), ..Default::default() };
        let facts = RunFacts { result: Some(partial), ..Default::default() };
        if let Err(e) = store.record_run(id, token, facts) {
            tracing::debug!(task = %id, error = %e, "recording the spend failed");
        }
        if !budgeted {
            return Control::Go;
        }
        match store.budget_of(id).map(|b| b.passed(cost, tokens)) {
            Ok(Some(mut stop)) => {
                // A budget raised by `continue X` keeps saying what it was first set to.
                if let Some(first) = &earlier_budget
                    && first.limit == stop.limit
                    && first.scope == stop.scope
                {
                    stop.original = first.original;
                }
                Control::Stop(Box::new(queue::Ask::budget(stop)))
            }
            Ok(None) => Control::Go,
            Err(e) => {
                tracing::warn!(task = %id, error = %e, "reading the budget failed");
                Control::Go
            }
        }
    }
}

/// The planner's notes that arrived while the agent works, as something to tell it.
fn note_for_agent(store: &Store, id: TaskId, token: i64) -> Control {
    match store.take_notes(id, token) {
        Ok(notes) if !notes.is_empty() => Control::Say(format!(
            "A note from the planner while you work; take it into account from your next step \
             on.{}",
            notes_section(&notes)
        )),
        Ok(_) => Control::Go,
        Err(e) => {
            tracing::debug!(task = %id, error = %e, "reading new notes failed");
            Control::Go
        }
    }
}

fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|a| if a.contains(' ') { format!("'{a}'") } else { a.clone() })
        .collect::<Vec<_>>()
        .join(" ")
}
