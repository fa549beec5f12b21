//! What the agent is told, and in which session: a new task (with what its dependencies did and
//! the planner's notes), an answer to its question or permission request, a follow-up going on in
//! its parent's session (or standing alone where that session cannot be reached), an interrupted
//! run going on in its own, and a failed check's output in a fix round.

use super::Run;
use crate::agent::AgentKind;
use crate::config::WorkerConfig;
use crate::opencode_config::{headless, permission_json, with_task_bridge};
use crate::result::Check;
use queue::{Answer, Resume, Task, TaskId};

const PREAMBLE: &str = include_str!("../../../assets/preamble.md");
const RESUME: &str = include_str!("../../../assets/resume.md");

/// What a task builds on, for its prompt.
pub(crate) struct DepInfo {
    pub id: TaskId,
    pub title: String,
    pub summary: String,
    pub branch: Option<String>,
    pub files: Vec<String>,
    pub commit: Option<String>,
}

impl DepInfo {
    pub fn of(dep: &Task) -> DepInfo {
        let r = dep.result.clone().unwrap_or_default();
        DepInfo {
            id: dep.id,
            title: dep.title.clone(),
            summary: r.summary,
            branch: dep.branch.clone(),
            files: r.files_touched.into_iter().map(|f| f.path).collect(),
            commit: r.commit,
        }
    }
}

/// The conversation with the agent over one run: the next prompt and the session it goes in,
/// carried from turn to turn (a check's fix round goes on in the session the last turn ran in).
pub(super) struct Conversation {
    pub prompt: String,
    /// The answer this run resumes with, until the first turn has delivered it.
    pub resume: Option<Resume>,
    /// What a bare `reject` in that answer refused: the agent is stopped, as OpenCode does.
    pub rejected: Option<String>,
    /// A follow-up's first run, in its parent's session when it can reach it.
    followup_session: Option<String>,
    /// A run that was interrupted (its worker or server died, an attempt failed) goes on in its
    /// session: the agent keeps its context and the worktree keeps its work.
    interrupted: bool,
    /// What a session that is on no server here is replaced with: a follow-up's request as one
    /// that stands alone, an interrupted run's whole task (its worktree keeps the work).
    pub without_session: Option<String>,
    /// The session a fix round goes on in.
    round_session: Option<String>,
    /// `opencode run`'s arguments and environment (the other agents build their own).
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// What this run's earlier turns spent (its fix rounds).
    pub carried: crate::events::Usage,
}

impl Conversation {
    pub fn new(
        run: &Run<'_>,
        resume: Option<Resume>,
        new_notes: &[String],
        cfg: &WorkerConfig,
    ) -> Conversation {
        let task = run.task;
        let native_opencode = run.spec.kind == AgentKind::OpenCode;
        let notes = notes_section(new_notes);
        let followup = resume.is_none() && run.first_run && task.parent.is_some();
        // OpenCode runs a session's tools in the directory the session was made in, whatever
        // directory it is prompted from: the parent's session is continued only from the
        // directory the parent ran in; from anywhere else the follow-up starts a new session (on
        // the warm server, given the parent's conversation as text). Claude Code and Codex take
        // a session to any directory.
        let in_parents_dir = run.parent_dir.as_deref() == Some(run.dir.as_path());
        let followup_session = task
            .session_id
            .clone()
            .filter(|_| followup && (run.serving() || in_parents_dir || !native_opencode));
        let interrupted = resume.is_none()
            && (run.serving() || !native_opencode)
            && task.session_id.is_some()
            && !followup;
        // The task's own prompt, standing without any earlier conversation.
        let fresh = format!(
            "{PREAMBLE}\n{}# Task {}: {}\n\n{}{}",
            builds_on(&run.deps),
            task.id.0,
            task.title,
            task.prompt,
            notes
        );
        let without_session = if followup {
            Some(format!(
                "{PREAMBLE}\n# Task {}: {}\n\nThis follows up earlier work: the worktree holds \
                 it, and this task's branch starts where it ended.\n\n{}{}",
                task.id.0, task.title, task.prompt, notes
            ))
        } else {
            interrupted.then(|| fresh.clone())
        };
        let prompt = match &resume {
            Some(r) => match &r.ask {
                Some(ask) => format!("{}{notes}", crate::decisions::answer_prompt(ask, &r.answer)),
                None => format!("{RESUME}{}{notes}", r.answer),
            },
            None if interrupted => format!("{}{notes}", crate::agent::opencode_serve::INTERRUPTED),
            None if followup && followup_session.is_none() => {
                without_session.clone().unwrap_or_default()
            }
            None if followup => format!(
                "The planner has a follow-up on the work above. It is task {} (\"{}\"), on a new \
                 branch that starts from where that work ended; the worktree holds it.\n\n{}\n\n\
                 End as before with a taskbridge-result block.{notes}",
                task.id.0, task.title, task.prompt
            ),
            None => fresh,
        };
        let rejected = resume.as_ref().and_then(|r| {
            let ask = r.ask.as_ref()?;
            match ask.parse_answer(&r.answer) {
                Ok(Answer::PermissionReject { feedback: None }) => Some(ask.subject()),
                _ => None,
            }
        });
        let mut args = opencode_run_args(run);
        let session = resume.as_ref().map(|r| r.session_id.clone());
        if let Some(s) = session.or_else(|| followup_session.clone().filter(|_| !run.serving())) {
            args.extend(["--session".into(), s]);
        }
        let content = headless(cfg.opencode_config_content.as_deref());
        let content = with_task_bridge(Some(&content), cfg);
        let env = vec![
            ("OPENCODE_PERMISSION".to_owned(), permission_json(task)),
            ("OPENCODE_CONFIG_CONTENT".to_owned(), content),
        ];
        Conversation {
            prompt,
            resume,
            rejected,
            followup_session,
            interrupted,
            without_session,
            round_session: None,
            args,
            env,
            carried: Default::default(),
        }
    }

    /// The session the next turn goes on in: the answer's, a fix round's, the parent's for a
    /// follow-up, an interrupted run's own; `None` for a new one.
    pub fn session(&self, task: &Task) -> Option<String> {
        self.resume
            .as_ref()
            .map(|r| r.session_id.clone())
            .or_else(|| self.round_session.clone())
            .or_else(|| self.followup_session.clone())
            .or_else(|| task.session_id.clone().filter(|_| self.interrupted))
    }

    /// The permission the answer approved (once or always): the agent asks again for it when
    /// the blocked request is gone, and this time it is let through.
    pub fn approved(&self) -> Option<(String, Vec<String>)> {
        let r = self.resume.as_ref()?;
        let ask = r.ask.as_ref()?;
        let p = ask.permission.as_ref()?;
        match ask.parse_answer(&r.answer) {
            Ok(Answer::PermissionOnce | Answer::PermissionAlways) => {
                Some((p.permission.clone(), p.patterns.clone()))
            }
            _ => None,
        }
    }

    /// A failed check's output goes back to the agent, in the session its last turn ran in.
    pub fn fix_round(&mut self, run: &Run<'_>, failed: &Check, session: Option<String>) {
        self.prompt = format!(
            "verification failed: `{}` exited {} in your worktree. Its output ends:\n\n{}\n\n\
             Fix it, then end as before with a taskbridge-result block.",
            failed.command,
            exit_status(failed.exit_code),
            failed.output_tail
        );
        self.round_session = session;
        if !run.serving()
            && run.spec.kind == AgentKind::OpenCode
            && let Some(s) = &self.round_session
            && !self.args.iter().any(|a| a == "--session")
        {
            self.args.extend(["--session".into(), s.clone()]);
        }
        self.resume = None;
        self.rejected = None;
    }
}

/// How a check exited, in words.
pub(super) fn exit_status(code: Option<i32>) -> String {
    code.map_or("without a status (timed out)".into(), |c| c.to_string())
}

/// `opencode run`'s arguments for the task, before any session.
fn opencode_run_args(run: &Run<'_>) -> Vec<String> {
    // `--print-logs --log-level ERROR` adds OpenCode's error lines to stderr, which name the
    // provider and model it used: its own default when TaskBridge names none.
    let mut args: Vec<String> = ["run", "--format", "json", "--print-logs", "--log-level", "ERROR"]
        .map(String::from)
        .into();
    // --auto answers "ask" rules (which headless OpenCode would auto-reject, ending the run);
    // our explicit denies still hold.
    args.push("--auto".into());
    // The session's name only: a task's title is the user's text, and every user of the
    // machine can read a command line.
    args.extend(["--title".into(), format!("taskbridge #{}", run.task.id.0)]);
    if let Some(m) = &run.model {
        args.extend(["-m".into(), m.clone()]);
    }
    if let Some(a) = &run.spec.opencode_agent {
        args.extend(["--agent".into(), a.clone()]);
    }
    args
}

/// The prompt's section on the work a task starts from.
fn builds_on(deps: &[DepInfo]) -> String {
    if deps.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "# What this task builds on\nYour worktree starts from the work of the tasks this one \
         depends on:\n",
    );
    for d in deps {
        let summary = if d.summary.trim().is_empty() { "(no summary)" } else { d.summary.trim() };
        let files = if d.files.is_empty() { "none".to_owned() } else { d.files.join(", ") };
        s.push_str(&format!(
            "- Task {} \"{}\" (branch {}): {}\n  Files: {}\n",
            d.id.0,
            d.title,
            d.branch.as_deref().unwrap_or("none"),
            summary.replace('\n', " "),
            files
        ));
    }
    s.push('\n');
    s
}

/// The planner's notes, as a section of a prompt.
pub(super) fn notes_section(notes: &[String]) -> String {
    if notes.is_empty() {
        return String::new();
    }
    let mut s = String::from("\n\n# Notes from the planner\n");
    for n in notes {
        s.push_str(&format!("- {n}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::tests::run_of;

    fn cfg() -> WorkerConfig {
        WorkerConfig::default()
    }

    fn has_session(args: &[String]) -> Option<&str> {
        let i = args.iter().position(|a| a == "--session")?;
        args.get(i + 1).map(String::as_str)
    }

    fn permission_resume(answer: &str) -> Resume {
        let ask = queue::Ask::permission(queue::PermissionAsk {
            permission: "bash".into(),
            patterns: vec!["rm -rf build".into()],
            target: Some("rm -rf build".into()),
            always: vec![],
        });
        Resume { session_id: "ses_asked".into(), answer: answer.into(), ask: Some(ask) }
    }

    #[test]
    fn a_new_task_is_told_its_task_and_notes_in_a_new_session() {
        let mut task = crate::sample_task();
        task.title = "Add a test".into();
        task.prompt = "Cover the parser.".into();
        let run = run_of(&task, AgentKind::OpenCode);
        let talk = Conversation::new(&run, None, &["use tabs".into()], &cfg());
        assert!(talk.prompt.starts_with(PREAMBLE));
        assert!(talk.prompt.contains("# Task 1: Add a test\n\nCover the parser."));
        assert!(talk.prompt.ends_with("# Notes from the planner\n- use tabs\n"), "{}", talk.prompt);
        assert_eq!(talk.session(&task), None);
        assert_eq!((talk.rejected.clone(), talk.without_session.clone()), (None, None));
        assert_eq!(has_session(&talk.args), None);
        let title = talk.args.iter().position(|a| a == "--title").unwrap();
        assert_eq!(talk.args[title + 1], "taskbridge #1", "no user text on a command line");
        let model = talk.args.iter().position(|a| a == "-m").unwrap();
        assert_eq!(talk.args[model + 1], "anthropic/claude-x");
        assert_eq!(talk.env[0].0, "OPENCODE_PERMISSION");
    }

    #[test]
    fn an_answer_goes_on_in_the_session_that_asked() {
        let task = crate::sample_task();
        let run = run_of(&task, AgentKind::OpenCode);
        let resume = Resume { session_id: "ses_q".into(), answer: "blue".into(), ask: None };
        let talk = Conversation::new(&run, Some(resume), &[], &cfg());
        assert_eq!(talk.prompt, format!("{RESUME}blue"));
        assert_eq!(talk.session(&task).as_deref(), Some("ses_q"));
        assert_eq!(has_session(&talk.args), Some("ses_q"));
        assert_eq!(talk.approved(), None);
    }

    #[test]
    fn a_bare_reject_stops_the_agent_and_an_approval_is_let_through_when_asked_again() {
        let task = crate::sample_task();
        let run = run_of(&task, AgentKind::ClaudeCode);
        let rejected = Conversation::new(&run, Some(permission_resume("reject")), &[], &cfg());
        assert_eq!(rejected.rejected.as_deref(), Some("permission to bash: rm -rf build"));
        assert_eq!(rejected.approved(), None);
        let with_reason =
            Conversation::new(&run, Some(permission_resume("reject: not now")), &[], &cfg());
        assert_eq!(with_reason.rejected, None, "a reject with feedback lets the agent go on");
        for answer in ["once", "always"] {
            let talk = Conversation::new(&run, Some(permission_resume(answer)), &[], &cfg());
            assert_eq!(talk.approved(), Some(("bash".into(), vec!["rm -rf build".into()])));
            assert_eq!(talk.rejected, None);
        }
    }

    #[test]
    fn an_interrupted_run_goes_on_in_its_session_and_can_stand_alone() {
        let mut task = crate::sample_task();
        task.session_id = Some("ses_before".into());
        let run = run_of(&task, AgentKind::OpenCode);
        let talk = Conversation::new(&run, None, &[], &cfg());
        assert_eq!(talk.prompt, crate::agent::opencode_serve::INTERRUPTED);
        assert_eq!(talk.session(&task).as_deref(), Some("ses_before"));
        let alone = talk.without_session.clone().unwrap();
        assert!(alone.starts_with(PREAMBLE) && alone.contains("# Task 1: t"), "{alone}");
        // `opencode run` keeps no session between processes: it starts the task again.
        let mut run_mode = run_of(&task, AgentKind::OpenCode);
        run_mode.warm_server = false;
        let talk = Conversation::new(&run_mode, None, &[], &cfg());
        assert!(talk.prompt.starts_with(PREAMBLE));
        assert_eq!(talk.session(&task), None);
    }

    #[test]
    fn a_followup_goes_on_in_its_parents_session_only_where_that_session_can_run() {
        let mut task = crate::sample_task();
        task.parent = Some(TaskId(9));
        task.session_id = Some("ses_parent".into());
        task.prompt = "Now rename it.".into();
        let serving = run_of(&task, AgentKind::OpenCode);
        let talk = Conversation::new(&serving, None, &[], &cfg());
        assert!(talk.prompt.starts_with("The planner has a follow-up on the work above."));
        assert!(talk.prompt.contains("Now rename it."));
        assert_eq!(talk.session(&task).as_deref(), Some("ses_parent"));
        assert!(talk.without_session.as_deref().unwrap().contains("This follows up earlier work"));

        // `opencode run` elsewhere than the parent's directory: a request that stands alone.
        let mut elsewhere = run_of(&task, AgentKind::OpenCode);
        elsewhere.warm_server = false;
        let talk = Conversation::new(&elsewhere, None, &[], &cfg());
        assert!(talk.prompt.contains("This follows up earlier work"), "{}", talk.prompt);
        assert_eq!((talk.session(&task), has_session(&talk.args)), (None, None));

        // In the parent's own directory, the parent's session.
        let mut at_parents = run_of(&task, AgentKind::OpenCode);
        at_parents.warm_server = false;
        at_parents.parent_dir = Some(at_parents.dir.clone());
        let talk = Conversation::new(&at_parents, None, &[], &cfg());
        assert_eq!(has_session(&talk.args), Some("ses_parent"));
        assert!(talk.prompt.starts_with("The planner has a follow-up"));

        // Not its first run: a retry of the follow-up goes on as an interrupted run.
        let mut retry = run_of(&task, AgentKind::OpenCode);
        retry.first_run = false;
        assert_eq!(
            Conversation::new(&retry, None, &[], &cfg()).prompt,
            crate::agent::opencode_serve::INTERRUPTED
        );
    }

    #[test]
    fn a_fix_round_sends_the_checks_output_in_the_turns_session() {
        let task = crate::sample_task();
        let mut run = run_of(&task, AgentKind::OpenCode);
        run.warm_server = false;
        let mut talk = Conversation::new(&run, None, &[], &cfg());
        talk.rejected = Some("permission to bash: x".into());
        let failed = Check {
            command: "cargo test".into(),
            exit_code: Some(101),
            duration_s: 1.0,
            output_tail: "test parse ... FAILED".into(),
            round: 1,
        };
        talk.fix_round(&run, &failed, Some("ses_turn".into()));
        assert!(talk.prompt.starts_with("verification failed: `cargo test` exited 101"));
        assert!(talk.prompt.contains("test parse ... FAILED"));
        assert_eq!(
            (talk.session(&task).as_deref(), talk.rejected.as_deref()),
            (Some("ses_turn"), None)
        );
        assert_eq!(has_session(&talk.args), Some("ses_turn"));
        talk.fix_round(&run, &Check { exit_code: None, ..failed }, Some("ses_turn".into()));
        assert!(talk.prompt.contains("exited without a status (timed out)"));
        assert_eq!(talk.args.iter().filter(|a| *a == "--session").count(), 1);
    }

    #[test]
    fn what_a_task_builds_on_names_each_dependency_its_branch_and_files() {
        assert_eq!(builds_on(&[]), "");
        let deps = [
            DepInfo {
                id: TaskId(2),
                title: "parser".into(),
                summary: "Wrote it.\nTested it.".into(),
                branch: Some("taskbridge/task-2".into()),
                files: vec!["a.rs".into(), "b.rs".into()],
                commit: Some("c".into()),
            },
            DepInfo {
                id: TaskId(3),
                title: "nothing".into(),
                summary: " ".into(),
                branch: None,
                files: vec![],
                commit: None,
            },
        ];
        let s = builds_on(&deps);
        assert!(s.starts_with("# What this task builds on\n"));
        assert!(s.contains(
            "- Task 2 \"parser\" (branch taskbridge/task-2): Wrote it. Tested it.\n  Files: a.rs, b.rs\n"
        ));
        assert!(s.contains("- Task 3 \"nothing\" (branch none): (no summary)\n  Files: none\n"));
        assert_eq!(notes_section(&[]), "");
    }
}
