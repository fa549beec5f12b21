//! The agents a task can run on, behind one interface: which agent a task names, what each can
//! do, where its CLI is, and how its tool calls are decided against the task's rules.
//!
//! Every agent is started in the task's worktree with a prompt, a model and the task's
//! permissions, and its stream is read into [`crate::events::AgentEvent`]s (session, text, tool
//! calls with their command or path and exit status, usage, decisions, turn end, errors) that
//! [`crate::events::RunLog`] adds up the same way for all of them. OpenCode runs on its warm
//! server ([`crate::serve`]) or `opencode run`; Claude Code ([`crate::claude`]) and Codex
//! ([`crate::codex`]) run as a process per turn, resumed by session id for answers and
//! follow-ups. Where an agent cannot do something natively, the result says what held instead
//! ([`Capabilities`], `TaskResult::agent`).

use crate::process::Decision;
use crate::serve::Grants;
use queue::{Ask, PermissionAsk, Task};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The pinned versions `.ci/run` tests against, and the install commands named to users.
pub const OPENCODE_TESTED: &str = "1.18.33";
pub const CLAUDE_CODE_TESTED: &str = "2.1.197";
pub const CODEX_TESTED: &str = "0.171.0";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentKind {
    #[serde(rename = "opencode")]
    OpenCode,
    ClaudeCode,
    Codex,
}

pub const ALL: [AgentKind; 3] = [AgentKind::OpenCode, AgentKind::ClaudeCode, AgentKind::Codex];

/// The agent a task names: `opencode` (the default), `opencode:<agent>` for one of OpenCode's
/// own agents, `claude-code` or `codex`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSpec {
    pub kind: AgentKind,
    /// OpenCode's own agent (`plan`, `build`, one of the user's), for `opencode:<agent>`.
    pub opencode_agent: Option<String>,
}

impl AgentSpec {
    /// What a submit names, checked: an unknown agent is refused with the ones there are.
    pub fn parse(spec: &str) -> Result<AgentSpec, String> {
        let spec = spec.trim();
        let kind = |kind| Ok(AgentSpec { kind, opencode_agent: None });
        match spec {
            "" | "opencode" => kind(AgentKind::OpenCode),
            "claude-code" | "claude" => kind(AgentKind::ClaudeCode),
            "codex" => kind(AgentKind::Codex),
            _ => match spec.strip_prefix("opencode:") {
                Some(a) if !a.trim().is_empty() => Ok(AgentSpec {
                    kind: AgentKind::OpenCode,
                    opencode_agent: Some(a.trim().to_owned()),
                }),
                _ => Err(format!(
                    "'{spec}' is not an agent: use opencode (the default), claude-code, codex, or \
                     opencode:<agent> for one of OpenCode's own agents (for example opencode:plan)"
                )),
            },
        }
    }

    /// The agent a queued task runs on. Tasks queued before there were several agents name an
    /// OpenCode agent bare (`plan`); they keep meaning that.
    pub fn of(task: &Task) -> AgentSpec {
        match task.agent.as_deref() {
            None => AgentSpec { kind: AgentKind::OpenCode, opencode_agent: None },
            Some(a) => AgentSpec::parse(a).unwrap_or_else(|_| AgentSpec {
                kind: AgentKind::OpenCode,
                opencode_agent: Some(a.to_owned()),
            }),
        }
    }

    /// How it is stored on the task: `None` for plain OpenCode.
    pub fn stored(&self) -> Option<String> {
        match (&self.kind, &self.opencode_agent) {
            (AgentKind::OpenCode, None) => None,
            (AgentKind::OpenCode, Some(a)) => Some(format!("opencode:{a}")),
            (k, _) => Some(k.name().to_owned()),
        }
    }
}

/// What an agent can do natively; where it cannot, TaskBridge's fallback holds instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Its own question tool, answered with the options it offered (else: the prompt-level
    /// `taskbridge-question` block).
    pub native_questions: bool,
    /// Approval requests for tool calls, so `ask` rules can wait for an answer (else: what an
    /// `ask` rule names is denied, or not enforceable, as the result says).
    pub native_permissions: bool,
    /// It reports what a run cost (else: `usage.cost_usd` is `null`).
    pub reports_cost: bool,
    /// A session can be resumed for answers and follow-ups.
    pub resumable: bool,
}

impl AgentKind {
    pub fn name(self) -> &'static str {
        match self {
            AgentKind::OpenCode => "opencode",
            AgentKind::ClaudeCode => "claude-code",
            AgentKind::Codex => "codex",
        }
    }

    /// What it can do; OpenCode's depends on whether the worker runs its server (`serving`).
    pub fn capabilities(self, serving: bool) -> Capabilities {
        match self {
            AgentKind::OpenCode => Capabilities {
                native_questions: serving,
                native_permissions: serving,
                reports_cost: true,
                resumable: true,
            },
            AgentKind::ClaudeCode => Capabilities {
                native_questions: true,
                native_permissions: true,
                reports_cost: true,
                resumable: true,
            },
            AgentKind::Codex => Capabilities {
                native_questions: false,
                native_permissions: false,
                reports_cost: false,
                resumable: true,
            },
        }
    }

    /// The command a user runs to install its CLI.
    pub fn install_command(self) -> String {
        match self {
            AgentKind::OpenCode => format!("npm install -g opencode-ai@{}", OPENCODE_TESTED),
            AgentKind::ClaudeCode => {
                format!("npm install -g @anthropic-ai/claude-code@{CLAUDE_CODE_TESTED}")
            }
            AgentKind::Codex => format!("npm install -g @openai/codex@{CODEX_TESTED}"),
        }
    }

    /// The environment variable that names its CLI's path.
    pub fn env_var(self) -> &'static str {
        match self {
            AgentKind::OpenCode => "TASKBRIDGE_OPENCODE",
            AgentKind::ClaudeCode => "TASKBRIDGE_CLAUDE",
            AgentKind::Codex => "TASKBRIDGE_CODEX",
        }
    }

    pub fn default_program(self) -> &'static str {
        match self {
            AgentKind::OpenCode => "opencode",
            AgentKind::ClaudeCode => "claude",
            AgentKind::Codex => "codex",
        }
    }

    /// Its CLI as configured: the environment variable, else the program on PATH.
    pub fn program_from_env(self) -> PathBuf {
        std::env::var_os(self.env_var())
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(self.default_program()))
    }

    /// Why this agent cannot run here (its CLI is missing), with the command that fixes it.
    pub fn missing(self, program: &Path) -> Option<String> {
        if find_program(program).is_some() {
            return None;
        }
        Some(format!(
            "the {} agent's CLI '{}' is not installed here: install it with `{}`, or set {} to \
             its path",
            self.name(),
            program.display(),
            self.install_command(),
            self.env_var()
        ))
    }
}

/// `program` itself when it is a path to an executable, else the first executable of that name
/// on PATH.
pub fn find_program(program: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if program.components().count() > 1 {
        return runnable(program).then(|| program.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(program)).find(|p| runnable(p))
}

/// A model name as this agent takes it: OpenCode's `provider/model` loses its provider for the
/// agents that have only one.
pub fn model_for(kind: AgentKind, model: &str) -> String {
    match (kind, model.split_once('/')) {
        (AgentKind::ClaudeCode, Some(("anthropic", m)))
        | (AgentKind::Codex, Some(("openai", m))) => m.to_owned(),
        _ => model.to_owned(),
    }
}

/// A tool call, as the permission it needs in TaskBridge's vocabulary (OpenCode's: `bash`,
/// `edit`, `read`, `webfetch`, ...) and the pattern the task's rules are matched against.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolUse {
    pub permission: String,
    pub pattern: String,
}

/// Decides a tool call the way OpenCode's server does for the task's rules: a change outside
/// the task's worktree `dir` and the flags' denies first (no `ask` rule loosens them), then the
/// task's `ask` rules, which wait for an answer unless an earlier answer granted it; everything
/// else is allowed (the worktree is the task's).
pub fn decide(
    task: &Task,
    dir: &Path,
    grants: &mut Grants,
    tool: &ToolUse,
    input: &Value,
) -> Decision {
    let denied = match tool.permission.as_str() {
        "edit" if outside(dir, &tool.pattern) => {
            Some("it changes a file outside the task's worktree; work in the worktree")
        }
        "edit" if task.readonly => Some("this task is read-only: it may not change files"),
        "bash" if task.no_shell => Some("this task may not run shell commands"),
        "webfetch" | "websearch" if task.no_network => Some("this task may not use the network"),
        _ => None,
    };
    if let Some(why) = denied {
        return Decision::Deny { message: format!("TaskBridge denied this: {why}.") };
    }
    let asks =
        task.ask_rules.iter().filter_map(|r| queue::parse_ask_rule(r).ok()).any(|(p, glob)| {
            (p == "*" || p == tool.permission) && crate::serve::wildcard_match(&glob, &tool.pattern)
        });
    let ask = permission_ask(tool);
    if asks && !grants.approves(&ask) {
        return Decision::Wait;
    }
    Decision::Allow { input: input.clone() }
}

/// Whether `path` (as a tool names it: absolute, or relative to the worktree) is outside `dir`.
/// `..` is resolved by the path's words, so a path that climbs out is outside.
fn outside(dir: &Path, path: &str) -> bool {
    use std::path::Component;
    let joined = dir.join(path);
    let mut normal = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                normal.pop();
            }
            Component::CurDir => {}
            other => normal.push(other),
        }
    }
    let real = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    !(normal.starts_with(dir) || normal.starts_with(&real))
}

/// The permission request a tool call makes, as the task waits on it.
pub fn permission_ask(tool: &ToolUse) -> PermissionAsk {
    PermissionAsk {
        permission: tool.permission.clone(),
        patterns: vec![tool.pattern.clone()],
        target: Some(tool.pattern.clone()),
        always: vec![tool.pattern.clone()],
    }
}

/// A decision an agent asked for, with the request it is answered on.
pub fn permission_decision(tool: &ToolUse) -> Ask {
    Ask::permission(permission_ask(tool))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_are_named_as_submit_takes_them_and_unknown_ones_say_which_there_are() {
        assert_eq!(AgentSpec::parse("claude-code").map(|s| s.kind), Ok(AgentKind::ClaudeCode));
        assert_eq!(AgentSpec::parse("codex").map(|s| s.kind), Ok(AgentKind::Codex));
        let plan = AgentSpec::parse("opencode:plan").unwrap();
        assert_eq!(
            (plan.kind, plan.opencode_agent.as_deref()),
            (AgentKind::OpenCode, Some("plan"))
        );
        assert_eq!(plan.stored().as_deref(), Some("opencode:plan"));
        let e = AgentSpec::parse("gpt").unwrap_err();
        assert!(e.contains("claude-code") && e.contains("opencode:plan"), "{e}");
        let mut t = crate::sample_task();
        t.agent = Some("plan".into());
        assert_eq!(AgentSpec::of(&t).opencode_agent.as_deref(), Some("plan"));
    }

    #[test]
    fn flags_deny_before_ask_rules_and_an_always_grant_lets_the_next_call_through() {
        let mut t = crate::sample_task();
        t.no_shell = true;
        let bash = ToolUse { permission: "bash".into(), pattern: "git push origin".into() };
        let dir = Path::new("/w/task-1");
        let d = decide(&t, dir, &mut Grants::default(), &bash, &Value::Null);
        assert!(matches!(d, Decision::Deny { .. }), "{d:?}");
        t.no_shell = false;
        t.ask_rules = vec!["bash:git push*".into()];
        assert_eq!(decide(&t, dir, &mut Grants::default(), &bash, &Value::Null), Decision::Wait);
        let mut grants = Grants { always: vec![("bash".into(), "git push*".into())], once: vec![] };
        assert!(matches!(
            decide(&t, dir, &mut grants, &bash, &Value::Null),
            Decision::Allow { .. }
        ));
        let ls = ToolUse { permission: "bash".into(), pattern: "ls".into() };
        assert!(matches!(
            decide(&t, dir, &mut Grants::default(), &ls, &Value::Null),
            Decision::Allow { .. }
        ));
    }

    #[test]
    fn an_edit_outside_the_worktree_is_denied_and_one_inside_allowed() {
        let t = crate::sample_task();
        let dir = Path::new("/w/task-1");
        let edit = |p: &str| ToolUse { permission: "edit".into(), pattern: p.into() };
        let decided = |p: &str| decide(&t, dir, &mut Grants::default(), &edit(p), &Value::Null);
        for inside in ["/w/task-1/src/a.rs", "src/a.rs", "/w/task-1/x/../b.rs"] {
            assert!(matches!(decided(inside), Decision::Allow { .. }), "{inside}");
        }
        for out in ["/w/repo/src/a.rs", "../repo/a.rs", "/w/task-1/../task-2/a.rs", "/etc/passwd"] {
            assert!(matches!(decided(out), Decision::Deny { .. }), "{out}");
        }
    }
}
