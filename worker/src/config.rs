//! What a worker is configured with: the agents' programs and modes, concurrency, leases,
//! retries and notifications ([`WorkerConfig`], filled in by the binary), a repository's own
//! `.taskbridge.toml` ([`RepoConfig`], read from the commit a task starts from) and the name this
//! host goes by in the queue.

use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::notify::NotifyConfig;

/// How the worker drives OpenCode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenCodeMode {
    /// A new `opencode run` process for every prompt: the fallback (no native questions or
    /// approvals, no budgets).
    Run,
    /// One warm `opencode serve` per worker; a prompt is a request.
    #[default]
    Serve,
    /// One warm `opencode acp` per wall, over the Agent Client Protocol: the one way OpenCode 2
    /// is driven (its HTTP API moved), and a choice for 1.x.
    Acp,
}

impl std::str::FromStr for OpenCodeMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "run" => Ok(OpenCodeMode::Run),
            "serve" => Ok(OpenCodeMode::Serve),
            "acp" => Ok(OpenCodeMode::Acp),
            other => Err(format!("'{other}' is not an OpenCode mode; use serve, acp or run")),
        }
    }
}

impl OpenCodeMode {
    pub fn as_str(self) -> &'static str {
        match self {
            OpenCodeMode::Run => "run",
            OpenCodeMode::Serve => "serve",
            OpenCodeMode::Acp => "acp",
        }
    }
}

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub concurrency: usize,
    pub lease: Duration,
    /// The OpenCode executable (`opencode`, found on PATH, unless configured).
    pub opencode: PathBuf,
    pub opencode_mode: OpenCodeMode,
    /// Whether the mode was chosen (flag, environment, config file) rather than defaulted: an
    /// OpenCode 2 found with no mode chosen runs over ACP.
    pub opencode_mode_chosen: bool,
    /// The agents of the config file's `[agents.NAME]` tables, driven over ACP.
    pub agents: Vec<ConfiguredAgent>,
    /// The Claude Code and Codex executables (`claude`, `codex` on PATH unless configured).
    pub claude: PathBuf,
    pub codex: PathBuf,
    /// Used when neither the task nor the database names a model.
    pub default_model: Option<String>,
    /// Exit once nothing is running and nothing is runnable.
    pub once: bool,
    /// Base of the full-jitter exponential backoff between attempts.
    pub retry_base: Duration,
    pub retry_cap: Duration,
    /// The command that starts the reverse bridge (`taskbridge claude-mcp`); when set, every
    /// run gets it as an MCP server, so the agent can ask Claude.
    pub claude_bridge: Option<Vec<String>>,
    /// The user's own per-run OpenCode config (`OPENCODE_CONFIG_CONTENT` at start-up); the
    /// bridge is merged into it, since OpenCode reads only one such variable.
    pub opencode_config_content: Option<String>,
    pub notify: NotifyConfig,
    /// Fault injection for the chaos tests (`TASKBRIDGE_FAULT_WORKTREE_PAUSE_MS`): a pause in
    /// the middle of making a worktree, so a kill can land there.
    pub fault_worktree_pause: Option<Duration>,
    /// Run every task that has a remote from this worker's mirror of it (and push its branch
    /// back), even when the repository is on this host (`--use-remote`).
    pub use_remote: bool,
    /// The environment the binary started in: the host's name, PATH, the agents' own settings.
    pub env: queue::Environment,
    /// The wall around every agent (`[sandbox]`).
    pub sandbox: SandboxConfig,
}

/// An agent of the config file (`[agents.NAME]`): a command that speaks ACP on its stdio.
#[derive(Clone, PartialEq)]
pub struct ConfiguredAgent {
    pub name: String,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// More environment for it (its API key's variable, say).
    pub env: Vec<(String, String)>,
}

/// The environment's names only: its values may be keys.
impl std::fmt::Debug for ConfiguredAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.launch().fmt(f)
    }
}

impl ConfiguredAgent {
    /// How it is started.
    pub fn launch(&self) -> crate::agent::acp::Launch {
        crate::agent::acp::Launch {
            name: self.name.clone(),
            program: PathBuf::from(self.command.first().cloned().unwrap_or_default()),
            args: self.command.iter().skip(1).cloned().collect(),
            env: self.env.clone(),
        }
    }

    /// Why it cannot run here (its program is missing), with where it is configured.
    pub fn missing(&self, env: &queue::Environment) -> Option<String> {
        let program = self.command.first()?;
        if env.find_program(Path::new(program)).is_some() {
            return None;
        }
        Some(format!(
            "the agent '{}' runs '{program}', which is not installed here (or not on PATH): \
             install it, or fix `command` in [agents.{}] of TaskBridge's config.toml",
            self.name, self.name
        ))
    }
}

/// The wall around every agent (`[sandbox]` in the config file; see `crate::sandbox`).
#[derive(Debug, Clone, Default)]
pub struct SandboxConfig {
    pub mode: crate::sandbox::Mode,
    /// More directories every agent may write (a build cache the tasks share, say).
    pub writable: Vec<PathBuf>,
    /// Model provider endpoints (URLs or `host:port`) a task without network may reach, besides
    /// the ones found in the agents' own settings.
    pub model_hosts: Vec<String>,
}

impl WorkerConfig {
    /// The CLI this worker runs `kind` with.
    pub fn program(&self, kind: crate::agent::AgentKind) -> &Path {
        use crate::agent::AgentKind;
        match kind {
            AgentKind::OpenCode => &self.opencode,
            AgentKind::ClaudeCode => &self.claude,
            AgentKind::Codex => &self.codex,
            AgentKind::Acp => Path::new(""),
        }
    }

    /// The configured agent named `name`.
    pub fn agent(&self, name: &str) -> Option<&ConfiguredAgent> {
        self.agents.iter().find(|a| a.name == name)
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            concurrency: 2,
            lease: Duration::from_secs(30),
            opencode: PathBuf::from("opencode"),
            opencode_mode: OpenCodeMode::Serve,
            opencode_mode_chosen: false,
            agents: Vec::new(),
            claude: PathBuf::from("claude"),
            codex: PathBuf::from("codex"),
            default_model: None,
            once: false,
            retry_base: Duration::from_secs(10),
            retry_cap: Duration::from_secs(600),
            claude_bridge: None,
            opencode_config_content: None,
            notify: NotifyConfig::default(),
            fault_worktree_pause: None,
            use_remote: false,
            env: queue::Environment::default(),
            sandbox: SandboxConfig::default(),
        }
    }
}

/// Per-repository set-up, from `.taskbridge.toml` at the repository's top level.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepoConfig {
    #[serde(default)]
    pub setup: SetupConfig,
    #[serde(default)]
    pub permissions: PermissionsConfig,
    #[serde(default)]
    pub verify: crate::verify::VerifyConfig,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PermissionsConfig {
    /// `PERMISSION[:PATTERN]` rules every task of the repository asks about (joined with the
    /// task's own `ask`).
    #[serde(default)]
    pub ask: Vec<String>,
}

impl RepoConfig {
    /// The `.taskbridge.toml` committed in `commit` of the repository (an empty config when
    /// that commit has none), or what is wrong with it. Never the working tree's: its setup and
    /// verify commands run, so they come only from what was committed, not from an untracked
    /// file or one an agent wrote.
    pub fn at(repo: &Path, commit: &str) -> std::result::Result<RepoConfig, String> {
        let name = format!(
            ".taskbridge.toml in {repo}@{short}",
            repo = repo.display(),
            short = &commit[..commit.len().min(12)]
        );
        let text = match crate::git::file_at(repo, commit, ".taskbridge.toml") {
            Ok(Some(text)) => text,
            Ok(None) => return Ok(RepoConfig::default()),
            Err(e) => return Err(format!("reading {name}: {e}")),
        };
        toml::from_str(&text).map_err(|e| format!("{name} is not valid: {e}"))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetupConfig {
    /// Shell commands run in a new worktree before the agent starts, with `TASKBRIDGE_REPO` set
    /// to the main checkout (e.g. `cp "$TASKBRIDGE_REPO/.env" .`, `npm ci`).
    #[serde(default)]
    pub commands: Vec<String>,
}

/// The name this host goes by in the queue: `TASKBRIDGE_HOST` when set (a container whose
/// hostname changes at every start, say), else the system's hostname. Workers, reapers and
/// the reverse bridge use it to tell their own host's processes from other hosts'.
pub fn hostname(env: &queue::Environment) -> String {
    host_from(env.var("TASKBRIDGE_HOST"))
}

/// The host's name given what `TASKBRIDGE_HOST` holds.
fn host_from(named: Option<String>) -> String {
    if let Some(h) = named
        && !h.trim().is_empty()
    {
        return h.trim().to_owned();
    }
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_opencode_mode_reads_back_from_its_name_and_an_unknown_one_is_refused() {
        for mode in [OpenCodeMode::Run, OpenCodeMode::Serve, OpenCodeMode::Acp] {
            assert_eq!(mode.as_str().parse::<OpenCodeMode>(), Ok(mode));
        }
        assert_eq!(OpenCodeMode::Serve.as_str(), "serve");
        assert_eq!(
            "warm".parse::<OpenCodeMode>(),
            Err("'warm' is not an OpenCode mode; use serve, acp or run".to_owned())
        );
    }

    /// The host's name is `TASKBRIDGE_HOST` when it names one, else the system's.
    #[test]
    fn the_hosts_name_is_the_systems_unless_the_environment_names_one() {
        let system = nix::unistd::gethostname().unwrap().into_string().unwrap();
        assert!(!system.is_empty());
        assert_eq!(host_from(None), system);
        assert_eq!(host_from(Some("  ".into())), system, "a blank name names none");
        assert_eq!(host_from(Some(" box-1\n".into())), "box-1");
        let named = queue::Environment::from_vars([("TASKBRIDGE_HOST", " box-2 ")]);
        assert_eq!(hostname(&named), "box-2");
        assert_eq!(hostname(&queue::Environment::default()), system);
    }

    #[test]
    fn a_repositorys_config_comes_from_the_commit_not_the_working_tree() {
        let dir = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| crate::git::tests::git(dir.path(), args);
        git(&["init", "-q", "-b", "main"]);
        std::fs::write(
            dir.path().join(".taskbridge.toml"),
            "[setup]\ncommands = [\"npm ci\"]\n[verify]\ncommands = [\"cargo test\"]\nrounds = 1\n",
        )
        .unwrap();
        git(&["add", "."]);
        git(&["commit", "-qm", "config"]);
        let committed = crate::git::tests::head_of(dir.path(), "HEAD");
        // What an agent wrote afterwards is not read.
        std::fs::write(dir.path().join(".taskbridge.toml"), "[setup]\ncommands = [\"evil\"]\n")
            .unwrap();
        let cfg = RepoConfig::at(dir.path(), &committed).unwrap();
        assert_eq!(cfg.setup.commands, ["npm ci"]);
        assert_eq!(
            (cfg.verify.commands.clone(), cfg.verify.rounds),
            (vec!["cargo test".into()], 1)
        );

        std::fs::write(dir.path().join(".taskbridge.toml"), "[setup]\nfoo = 1\n").unwrap();
        git(&["add", "."]);
        git(&["commit", "-qm", "unknown key"]);
        let err = RepoConfig::at(dir.path(), &crate::git::tests::head_of(dir.path(), "HEAD"))
            .unwrap_err();
        assert!(err.starts_with(".taskbridge.toml in ") && err.contains("is not valid"), "{err}");
    }
}
