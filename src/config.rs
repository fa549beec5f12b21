//! One configuration, read once at start-up and passed down: the config file
//! (`$XDG_CONFIG_HOME/taskbridge/config.toml`, commented defaults in
//! `assets/config.default.toml`), then the environment, then the command line, each overriding
//! the one before. Nothing below the binary reads the environment for settings.

use anyhow::{Context, bail};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use worker::NotifyConfig;
use worker::WorkerConfig;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    pub worker: WorkerSection,
    pub notify: NotifySection,
    pub sandbox: SandboxSection,
    /// `[agents.NAME]`: agents that speak ACP, by the name tasks give them.
    pub agents: std::collections::BTreeMap<String, AgentSection>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentSection {
    /// The program and its arguments, as a list (`["opencode", "acp"]`).
    pub command: Vec<String>,
    /// Only "acp" for now; said, so that a config written for another protocol is refused.
    pub protocol: Option<String>,
    pub env: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxSection {
    /// `enforce`, `warn` or `off`.
    pub mode: Option<String>,
    pub writable: Vec<PathBuf>,
    pub model_hosts: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerSection {
    pub concurrency: Option<usize>,
    pub model: Option<String>,
    pub opencode: Option<PathBuf>,
    /// `run` or `serve`.
    pub opencode_mode: Option<String>,
    pub claude_bridge: Option<bool>,
    /// Run every task with a remote from this worker's mirror of it (`--use-remote`).
    pub use_remote: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotifySection {
    pub desktop: bool,
    pub webhook: Option<String>,
    pub webhook_timeout_s: f64,
}

impl Default for NotifySection {
    fn default() -> Self {
        NotifySection { desktop: true, webhook: None, webhook_timeout_s: 10.0 }
    }
}

/// `$XDG_CONFIG_HOME/taskbridge`, else `~/.config/taskbridge`.
pub fn config_dir(env: &queue::Environment) -> Option<PathBuf> {
    let base = env.path("XDG_CONFIG_HOME").or_else(|| env.home_dir().map(|h| h.join(".config")))?;
    Some(base.join("taskbridge"))
}

/// The environment's names only: its values may be keys.
impl std::fmt::Debug for AgentSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&String> = self.env.keys().collect();
        f.debug_struct("AgentSection")
            .field("command", &self.command)
            .field("protocol", &self.protocol)
            .field("env", &names)
            .finish()
    }
}

/// An `[agents.NAME]` table, checked: a name a task can give, a command, the protocol ACP.
fn check_agent(path: &Path, name: &str, agent: &AgentSection) -> anyhow::Result<()> {
    let at = format!("{}: [agents.{name}]", path.display());
    let builtin = ["opencode", "claude-code", "claude", "codex"];
    if builtin.contains(&name) || name.starts_with("opencode:") {
        bail!("{at}: '{name}' is a built-in agent's name; give this one another name");
    }
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        bail!("{at}: an agent's name is letters, digits, '-', '_' and '.'");
    }
    if agent.command.first().is_none_or(|p| p.trim().is_empty()) {
        bail!(
            "{at} has no command: give the program and its arguments as a list, for example \
             command = [\"opencode\", \"acp\"]"
        );
    }
    if let Some(p) = agent.protocol.as_deref().filter(|p| *p != "acp") {
        bail!("{at}: protocol = \"{p}\" is not one TaskBridge speaks; use \"acp\" (the default)");
    }
    Ok(())
}

/// Reads the config file; a missing file is the defaults.
pub fn read_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(FileConfig::default()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let cfg: FileConfig = toml::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "{} is not a valid TaskBridge config: {e}\nfix it (assets/config.default.toml lists \
             every key) or move it away",
            path.display()
        )
    })?;
    for (name, agent) in &cfg.agents {
        check_agent(path, name, agent)?;
    }
    if let Some(url) = &cfg.notify.webhook
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        bail!("{}: [notify] webhook = \"{url}\" is not an http:// or https:// URL", path.display());
    }
    if !(cfg.notify.webhook_timeout_s > 0.0 && cfg.notify.webhook_timeout_s <= 300.0) {
        bail!("{}: [notify] webhook_timeout_s must be from 0 to 300 seconds", path.display());
    }
    Ok(cfg)
}

/// What every long-running command builds its worker from.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file that was read (it may not exist).
    pub path: Option<PathBuf>,
    /// The worker as configured; a command's flags adjust a copy.
    pub worker: WorkerConfig,
    /// Whether `--claude-bridge` is on by default (`[worker] claude_bridge`).
    pub claude_bridge: bool,
}

impl Config {
    /// File, then environment. `explicit` is `--config`, which must exist.
    pub fn load(
        explicit: Option<&Path>,
        environment: &queue::Environment,
    ) -> anyhow::Result<Config> {
        let env = |key: &str| environment.var(key);
        let path = match explicit {
            Some(p) if !p.exists() => bail!("the config file {} does not exist", p.display()),
            Some(p) => Some(p.to_path_buf()),
            None => config_dir(environment).map(|d| d.join("config.toml")),
        };
        let file = match &path {
            Some(p) => read_file(p)?,
            None => FileConfig::default(),
        };
        let mut w = WorkerConfig::default();
        if let Some(c) = file.worker.concurrency {
            w.concurrency = c.max(1);
        }
        w.default_model = env("TASKBRIDGE_MODEL").or(file.worker.model);
        if let Some(p) = env("TASKBRIDGE_OPENCODE").map(PathBuf::from).or(file.worker.opencode) {
            w.opencode = p;
        }
        if let Some(ms) = env("TASKBRIDGE_RETRY_BASE_MS").and_then(|v| v.parse().ok()) {
            w.retry_base = Duration::from_millis(ms);
        }
        if let Some(s) = env("TASKBRIDGE_LEASE_S").and_then(|v| v.parse::<f64>().ok()) {
            w.lease = Duration::from_secs_f64(s.max(0.5));
        }
        if let Some(m) = env("TASKBRIDGE_OPENCODE_MODE").or(file.worker.opencode_mode) {
            w.opencode_mode = m.parse().map_err(|e: String| {
                anyhow::anyhow!("{e} (TASKBRIDGE_OPENCODE_MODE or [worker] opencode_mode)")
            })?;
            w.opencode_mode_chosen = true;
        }
        w.agents = file
            .agents
            .into_iter()
            .map(|(name, a)| worker::ConfiguredAgent {
                name,
                command: a.command,
                env: a.env.into_iter().collect(),
            })
            .collect();
        w.claude = worker::agent::AgentKind::ClaudeCode.program_in(environment);
        w.codex = worker::agent::AgentKind::Codex.program_in(environment);
        w.env = environment.clone();
        w.opencode_config_content = env("OPENCODE_CONFIG_CONTENT");
        w.use_remote = file.worker.use_remote.unwrap_or(false);
        w.fault_worktree_pause = env("TASKBRIDGE_FAULT_WORKTREE_PAUSE_MS")
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis);
        let mode = env("TASKBRIDGE_SANDBOX").or(file.sandbox.mode);
        w.sandbox = worker::SandboxConfig {
            mode: match mode {
                Some(m) => m.parse().map_err(|e: String| {
                    anyhow::anyhow!("{e} (TASKBRIDGE_SANDBOX or [sandbox] mode)")
                })?,
                None => Default::default(),
            },
            // The file's directories, then TASKBRIDGE_SANDBOX_WRITABLE's (a PATH-like list).
            writable: file
                .sandbox
                .writable
                .into_iter()
                .chain(environment.paths("TASKBRIDGE_SANDBOX_WRITABLE"))
                .collect(),
            model_hosts: file.sandbox.model_hosts,
        };
        w.notify = NotifyConfig {
            desktop: file.notify.desktop,
            webhook: file.notify.webhook,
            webhook_timeout: Duration::from_secs_f64(file.notify.webhook_timeout_s),
        };
        Ok(Config { path, worker: w, claude_bridge: file.worker.claude_bridge.unwrap_or(false) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_defaults_parse_and_equal_no_file_at_all() {
        let shipped: FileConfig =
            toml::from_str(include_str!("../assets/config.default.toml")).unwrap();
        let none = FileConfig::default();
        assert_eq!(shipped.notify.desktop, none.notify.desktop);
        assert_eq!(shipped.notify.webhook, none.notify.webhook);
        assert_eq!(shipped.worker.concurrency, none.worker.concurrency);
    }

    #[test]
    fn a_bad_key_or_webhook_names_the_file_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.toml");
        std::fs::write(&p, "[notify]\nwebhok = \"https://x\"\n").unwrap();
        let e = read_file(&p).unwrap_err().to_string();
        assert!(e.contains("config.toml") && e.contains("webhok"), "{e}");
        std::fs::write(&p, "[notify]\nwebhook = \"ftp://x\"\n").unwrap();
        let e = read_file(&p).unwrap_err().to_string();
        assert!(e.contains("not an http:// or https:// URL"), "{e}");
    }
}
