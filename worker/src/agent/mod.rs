//! The agents a task can run on, behind one interface: which agent a task names, what each can
//! do, where its CLI is, and how its tool calls are decided against the task's rules.
//!
//! Every agent is started in the task's worktree with a prompt, a model and the task's
//! permissions, and its stream is read into [`crate::events::AgentEvent`]s (session, text, tool
//! calls with their command or path and exit status, usage, decisions, turn end, errors) that
//! [`crate::events::RunLog`] adds up the same way for all of them. OpenCode runs on its warm
//! server ([`opencode_serve`]) or `opencode run`; Claude Code ([`claude`]) and Codex
//! ([`codex`]) run as a process per turn, resumed by session id for answers and
//! follow-ups. Where an agent cannot do something natively, the result says what held instead
//! ([`Capabilities`], `TaskResult::agent`).

pub mod acp;
pub(crate) mod claude;
pub(crate) mod codex;
pub(crate) mod opencode_run;
pub(crate) mod opencode_serve;

use crate::events::{AgentError, AgentEvent};
use crate::policy::Decision;
use queue::Task;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// How an agent's process talks: its stdout lines as events, and, for an agent with a control
/// channel on stdin, how an answer to one of its requests is written there.
pub trait AgentProtocol: Send {
    /// The events one stdout line carries, or `None` when the line is not the agent's format.
    fn events(&mut self, line: &str) -> Option<Vec<AgentEvent>>;
    /// Events in a stderr line (OpenCode's log names the model it used).
    fn stderr(&mut self, _line: &str) -> Vec<AgentEvent> {
        Vec::new()
    }
    /// Whether stdin stays open after the prompt, for answers and the agent's own framing.
    fn keeps_input_open(&self) -> bool {
        false
    }
    /// The line that answers request `request` on stdin.
    fn answer(&self, _request: &str, _decision: &Decision) -> Option<String> {
        None
    }
    /// Whether this event ends the agent's input (its turn is over: close stdin so it exits).
    fn ends_input(&self, ev: &AgentEvent) -> bool {
        matches!(ev, AgentEvent::TurnFinished)
    }
    /// Whether this error means the agent will only retry in vain (it would never exit): the
    /// run is stopped at the first such error.
    fn is_fatal(&self, _error: &AgentError) -> bool {
        false
    }
}

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
    /// An agent of the configuration's `[agents.NAME]`, driven over ACP.
    Acp,
}

pub const ALL: [AgentKind; 3] = [AgentKind::OpenCode, AgentKind::ClaudeCode, AgentKind::Codex];

/// The agent a task names: `opencode` (the default), `opencode:<agent>` for one of OpenCode's
/// own agents, `claude-code` or `codex`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSpec {
    pub kind: AgentKind,
    /// OpenCode's own agent (`plan`, `build`, one of the user's), for `opencode:<agent>`.
    pub opencode_agent: Option<String>,
    /// The `[agents.NAME]` it names, for [`AgentKind::Acp`].
    pub configured: Option<String>,
}

impl AgentSpec {
    /// What a submit names, checked: an unknown agent is refused with the ones there are.
    pub fn parse(spec: &str) -> Result<AgentSpec, String> {
        let spec = spec.trim();
        let kind = |kind| Ok(AgentSpec { kind, opencode_agent: None, configured: None });
        match spec {
            "" | "opencode" => kind(AgentKind::OpenCode),
            "claude-code" | "claude" => kind(AgentKind::ClaudeCode),
            "codex" => kind(AgentKind::Codex),
            _ => match spec.strip_prefix("opencode:") {
                Some(a) if !a.trim().is_empty() => Ok(AgentSpec {
                    kind: AgentKind::OpenCode,
                    opencode_agent: Some(a.trim().to_owned()),
                    configured: None,
                }),
                _ => Err(format!(
                    "'{spec}' is not an agent: use opencode (the default), claude-code, codex, or \
                     opencode:<agent> for one of OpenCode's own agents (for example opencode:plan)"
                )),
            },
        }
    }

    /// What a submit names, against the configuration: a built-in agent, else one of its
    /// `[agents.NAME]`; anything else is refused, saying what there is.
    pub fn resolve(spec: &str, agents: &[crate::ConfiguredAgent]) -> Result<AgentSpec, String> {
        let name = spec.trim();
        if let Some(a) = agents.iter().find(|a| a.name == name) {
            return Ok(AgentSpec::configured(&a.name));
        }
        AgentSpec::parse(spec).map_err(|e| match agents.is_empty() {
            true => format!(
                "{e}; or add it to TaskBridge's config.toml as [agents.{name}] with the command \
                 that starts it speaking ACP"
            ),
            false => {
                let names: Vec<&str> = agents.iter().map(|a| a.name.as_str()).collect();
                format!("{e}, or one of the configured agents: {}", names.join(", "))
            }
        })
    }

    fn configured(name: &str) -> AgentSpec {
        AgentSpec { kind: AgentKind::Acp, opencode_agent: None, configured: Some(name.to_owned()) }
    }

    /// The agent a queued task runs on. Tasks queued before there were several agents name an
    /// OpenCode agent bare (`plan`); they keep meaning that, unless the configuration has an
    /// agent of that name.
    pub fn of_in(task: &Task, agents: &[crate::ConfiguredAgent]) -> AgentSpec {
        AgentSpec::from_stored(task.agent.as_deref(), agents)
    }

    /// The agent as a task stores it ([`AgentSpec::stored`]), read against the configuration.
    pub fn from_stored(stored: Option<&str>, agents: &[crate::ConfiguredAgent]) -> AgentSpec {
        match stored {
            Some(a) if agents.iter().any(|c| c.name == a) => AgentSpec::configured(a),
            _ => AgentSpec::from_builtin(stored),
        }
    }

    /// [`AgentSpec::of_in`] without a configuration: built-in agents only.
    pub fn of(task: &Task) -> AgentSpec {
        AgentSpec::from_builtin(task.agent.as_deref())
    }

    fn from_builtin(stored: Option<&str>) -> AgentSpec {
        match stored {
            None => AgentSpec { kind: AgentKind::OpenCode, opencode_agent: None, configured: None },
            Some(a) => AgentSpec::parse(a).unwrap_or_else(|_| AgentSpec {
                kind: AgentKind::OpenCode,
                opencode_agent: Some(a.to_owned()),
                configured: None,
            }),
        }
    }

    /// The agent's name as the queue and the metrics know it.
    pub fn name(&self) -> &str {
        self.configured.as_deref().unwrap_or(self.kind.name())
    }

    /// How it is stored on the task: `None` for plain OpenCode.
    pub fn stored(&self) -> Option<String> {
        match (&self.kind, &self.opencode_agent) {
            (AgentKind::OpenCode, None) => None,
            (AgentKind::OpenCode, Some(a)) => Some(format!("opencode:{a}")),
            (AgentKind::Acp, _) => self.configured.clone(),
            (k, _) => Some(k.name().to_owned()),
        }
    }
}

pub use queue::Capabilities;

impl AgentKind {
    pub fn name(self) -> &'static str {
        match self {
            AgentKind::OpenCode => "opencode",
            AgentKind::ClaudeCode => "claude-code",
            AgentKind::Codex => "codex",
            AgentKind::Acp => "acp",
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
            AgentKind::Acp => Capabilities {
                native_questions: true,
                native_permissions: true,
                reports_cost: true,
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
            AgentKind::Acp => "the command of its [agents.NAME] in TaskBridge's config.toml".into(),
        }
    }

    /// The environment variable that names its CLI's path.
    pub fn env_var(self) -> &'static str {
        match self {
            AgentKind::OpenCode => "TASKBRIDGE_OPENCODE",
            AgentKind::ClaudeCode => "TASKBRIDGE_CLAUDE",
            AgentKind::Codex => "TASKBRIDGE_CODEX",
            AgentKind::Acp => "",
        }
    }

    pub fn default_program(self) -> &'static str {
        match self {
            AgentKind::OpenCode => "opencode",
            AgentKind::ClaudeCode => "claude",
            AgentKind::Codex => "codex",
            AgentKind::Acp => "",
        }
    }

    /// Its CLI as configured in `env`: the environment variable, else the program on PATH.
    pub fn program_in(self, env: &queue::Environment) -> PathBuf {
        env.path(self.env_var()).unwrap_or_else(|| PathBuf::from(self.default_program()))
    }

    /// Where its CLI keeps its own state (sessions, caches, logs, settings it rewrites): the
    /// directories, then the files, the sandbox lets it write besides the task's own.
    /// OpenCode's configuration directory is not among them: it reads it, and what an agent
    /// wrote there (a plugin, an instruction) would go on in the user's own OpenCode.
    pub fn state_paths(self, env: &queue::Environment) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let home = env.home_dir();
        match self {
            AgentKind::OpenCode => {
                let mut dirs = self.private_paths(env);
                dirs.extend(opencode_dir(env, "XDG_CACHE_HOME", ".cache"));
                (dirs, vec![])
            }
            AgentKind::ClaudeCode => match env.path("CLAUDE_CONFIG_DIR") {
                Some(dir) => (vec![dir], vec![]),
                // Without CLAUDE_CONFIG_DIR it keeps `~/.claude.json` beside `~/.claude`.
                None => home.map_or((vec![], vec![]), |h| {
                    (vec![h.join(".claude")], vec![h.join(".claude.json")])
                }),
            },
            AgentKind::Codex => {
                let dir = env.path("CODEX_HOME").or_else(|| home.map(|h| h.join(".codex")));
                // Its sandbox's helper keeps a directory in /tmp itself, whatever TMPDIR says
                // (seen with `strace` on 0.171: `mkdir("/tmp/codex-daemon-0", 0700)`).
                use std::os::unix::fs::MetadataExt;
                let uid = std::fs::metadata("/proc/self").map(|m| m.uid());
                let daemon = uid.ok().map(|uid| PathBuf::from(format!("/tmp/codex-daemon-{uid}")));
                (dir.into_iter().chain(daemon).collect(), vec![])
            }
            // What a configured agent keeps, TaskBridge cannot know: `[sandbox] writable` says.
            AgentKind::Acp => (vec![], vec![]),
        }
    }

    /// Its configuration directories, which it reads and the wall keeps it from writing: made
    /// here when missing (0700), since OpenCode does not start where it cannot make its own.
    pub fn config_paths(self, env: &queue::Environment) -> Vec<PathBuf> {
        match self {
            AgentKind::OpenCode => {
                opencode_dir(env, "XDG_CONFIG_HOME", ".config").into_iter().collect()
            }
            AgentKind::ClaudeCode | AgentKind::Codex | AgentKind::Acp => vec![],
        }
    }

    /// The directories of its state that hold its transcripts (what the agent was told, what
    /// its commands printed): the worker keeps them private to the user (0700).
    pub fn private_paths(self, env: &queue::Environment) -> Vec<PathBuf> {
        match self {
            AgentKind::OpenCode => {
                [("XDG_DATA_HOME", ".local/share"), ("XDG_STATE_HOME", ".local/state")]
                    .into_iter()
                    .filter_map(|(var, under)| opencode_dir(env, var, under))
                    .collect()
            }
            AgentKind::ClaudeCode | AgentKind::Codex | AgentKind::Acp => vec![],
        }
    }

    /// Why this agent cannot run here (its CLI is missing), with the command that fixes it.
    pub fn missing(self, program: &Path, env: &queue::Environment) -> Option<String> {
        if env.find_program(program).is_some() {
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

/// The OpenCode 2 release `.ci/run` tests against, and its npm package (OpenCode 1 stays
/// `opencode-ai`).
pub const OPENCODE2_TESTED: &str = "2.1.2";
pub const OPENCODE2_PACKAGE: &str = "@opencode/cli";

/// The version of the OpenCode at `program`: from the npm package it was installed from when
/// there is one beside it (no process started), else from `--version` (a native binary; a script
/// is not run, it may be anything).
pub fn opencode_version(program: &Path, env: &queue::Environment) -> Option<String> {
    let path = env.find_program(program)?;
    let real = std::fs::canonicalize(&path).unwrap_or(path);
    for pkg in real.ancestors().skip(1).take(3).map(|d| d.join("package.json")) {
        let Ok(text) = std::fs::read_to_string(&pkg) else { continue };
        let Ok(doc) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
        let name = doc.get("name").and_then(|n| n.as_str()).unwrap_or("");
        if name.contains("opencode") {
            return doc.get("version").and_then(|v| v.as_str()).map(str::to_owned);
        }
    }
    let head = std::fs::read(&real).ok().map(|b| b.starts_with(b"#!"));
    if head != Some(false) {
        return None;
    }
    let mut cmd = std::process::Command::new(&real);
    cmd.arg("--version");
    let out = crate::process::output_within(&mut cmd, std::time::Duration::from_secs(5)).ok()??;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text.split_whitespace().last()?.trim_start_matches('v');
    v.chars().next()?.is_ascii_digit().then(|| v.to_owned())
}

/// A version's major number (`2` of `2.1.2`).
pub fn major(version: &str) -> Option<u32> {
    version.trim_start_matches('v').split('.').next()?.parse().ok()
}

/// How the worker runs OpenCode on ACP: `opencode acp`, told to ask for every tool call (the
/// task's rules decide each), with the user's per-run configuration kept and a bridge the user
/// registered in opencode.json switched off (the worker hands its own to each session).
///
/// OpenCode 1's `acp` serves its own HTTP API on the host's loopback for its ACP side to call:
/// like the warm server it is given a password nobody else knows, and `plugin` (the environment
/// plugin, when it could be written) keeps that password out of the commands the agent runs.
pub fn opencode_acp_launch(cfg: &crate::WorkerConfig, plugin: Option<&Path>) -> acp::Launch {
    let content = crate::opencode_config::headless(cfg.opencode_config_content.as_deref());
    let unoffered = crate::WorkerConfig { claude_bridge: None, ..cfg.clone() };
    let mut content = crate::opencode_config::with_task_bridge(Some(&content), &unoffered);
    if let Some(plugin) = plugin {
        content = crate::opencode_config::with_plugin(Some(&content), plugin);
    }
    let content = crate::opencode_config::asking_for_everything(&content);
    let mut env = vec![
        ("OPENCODE_CONFIG_CONTENT".to_owned(), content),
        ("OPENCODE_SERVER_PASSWORD".to_owned(), opencode_serve::random_password()),
    ];
    env.extend(opencode_serve::npm_offline(&cfg.env));
    acp::Launch {
        name: "opencode".into(),
        program: cfg.opencode.clone(),
        args: vec!["acp".into()],
        env,
    }
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

/// `<$var or ~/under>/opencode`: one of OpenCode's XDG directories.
fn opencode_dir(env: &queue::Environment, var: &str, under: &str) -> Option<PathBuf> {
    let base = env.path(var).or_else(|| env.home_dir().map(|h| h.join(under)));
    base.map(|d| d.join("opencode"))
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
}
