//! Between prepare and the prompt: the wall the agent's turns run in (`crate::sandbox`), built
//! for the task's worktree and its rules, or, where the kernel cannot build it, the reason, and
//! a refusal in `enforce` mode when the task asked for a rule only the kernel could hold.
//!
//! A process-per-turn agent (Claude Code, Codex, `opencode run`) gets the task's own wall. The
//! warm OpenCode server serves several tasks from one process, and a process has one wall: its
//! servers are walled per repository (see `warm_wall`), and a task whose rules differ from its
//! neighbours' (read-only, no network) gets a server of its own with the task's wall.

use super::{Run, Stage};
use crate::agent::AgentKind;
use crate::agent::opencode_serve::ServeAgent;
use crate::claim_loop::Worker;
use crate::logs::TaskLog;
use crate::sandbox::proxy::{Host, Proxy};
use crate::sandbox::{Held, Kernel, Mode, Policy, Rule, Wall};
use queue::{Outcome, Task};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a run's agent runs in.
#[derive(Clone, Default)]
pub(crate) struct Walled {
    /// The ruleset the agent's process raises before it starts; `None`: no wall.
    pub wall: Option<Arc<Wall>>,
    /// More environment for the agent: its private TMPDIR and, without network, the proxy.
    pub env: Vec<(String, String)>,
    /// What held each rule, for the result's `permissions`.
    pub held: Held,
    /// The warm server the task's turns go to (`serve` mode), behind the wall that holds it.
    pub server: Option<Arc<ServeAgent>>,
    /// The warm ACP agent the task's turns go to, behind the wall that holds it.
    pub acp: Option<Arc<crate::agent::acp::AcpAgent>>,
}

impl Walled {
    /// The warm server this run shares with the other tasks of its repository (or, with no
    /// sandbox, of the worker), which outlives the run. A server of the task's own is made only
    /// for a task with a wall of its own (`Worker::wall`), and is stopped after its run.
    pub fn shared_server(&self) -> Option<&Arc<ServeAgent>> {
        self.server.as_ref().filter(|_| self.wall.is_none())
    }
}

/// The directory a task's private temporary files go in (`TMPDIR`), removed after its run.
pub(crate) fn task_tmp(home: &queue::Home, task: &Task) -> PathBuf {
    home.root().join("tmp").join(format!("task-{}", task.id.0))
}

/// The name of the warm server a task has to itself, stopped after its run.
pub(crate) fn own_server(task: &Task) -> String {
    format!("task-{}", task.id.0)
}

/// The name of the warm server of every task without a wall (no sandbox on this host).
const OPEN_SERVER: &str = "open";

impl Worker {
    /// The wall for `run`'s agent, or the run's end when the task asks for what this host's
    /// kernel cannot hold and the mode is `enforce`. On the warm server, also the server.
    pub(super) async fn wall(&self, run: &Run<'_>, log: &mut TaskLog) -> Stage<Walled> {
        let mut walled = self.walled(run, log).await?;
        if let (Some(launch), None) = (&run.acp, &walled.acp) {
            let (key, wall, env) = match &walled.wall {
                None => (OPEN_SERVER.to_owned(), None, Vec::new()),
                Some(w) => (own_server(run.task), Some(w.clone()), walled.env.clone()),
            };
            let agent = self.acp.get(launch, &key, || Ok::<_, String>((wall, env)));
            walled.acp = agent.ok();
            return Ok(walled);
        }
        if let (Some(servers), true, None) = (&self.servers, run.serving(), &walled.server) {
            let (key, wall, env) = match &walled.wall {
                None => (OPEN_SERVER.to_owned(), None, Vec::new()),
                Some(w) => (own_server(run.task), Some(w.clone()), walled.env.clone()),
            };
            let server = servers.get(&key, || Ok::<_, String>((wall, env)));
            walled.server = server.ok();
        }
        Ok(walled)
    }

    async fn walled(&self, run: &Run<'_>, log: &mut TaskLog) -> Stage<Walled> {
        let task = run.task;
        let mode = self.cfg.sandbox.mode;
        if mode == Mode::Off {
            let missing = Some("the sandbox is off ([sandbox] mode = \"off\")".to_owned());
            return Ok(Walled { held: Held { missing, ..Held::default() }, ..Walled::default() });
        }
        let kernel = Kernel::probe();
        let unheld: Vec<String> =
            kernel.unheld(task.readonly, task.no_network).into_iter().map(|(_, why)| why).collect();
        if !unheld.is_empty() && mode == Mode::Enforce {
            let error = format!(
                "refused: {} (run it on a host whose kernel can, or set [sandbox] mode = \
                 \"warn\" to run it with the agent's own rules only)",
                unheld.join("; ")
            );
            return Err(Outcome::FailedPermanently {
                error,
                kind: queue::FailureKind::Sandbox,
                result: None,
            }
            .into());
        }
        if !kernel.walls() {
            let why = kernel.cannot_hold(Rule::Readonly).unwrap_or_default();
            log.line(&format!("warning: no sandbox: {why}"));
            return Ok(Walled {
                held: Held { missing: Some(why), ..Held::default() },
                ..Walled::default()
            });
        }
        if run.serving() && self.shares_repository_server(run) {
            return self.repository_server(run, log).await;
        }
        let tmp = task_tmp(&self.home, task);
        let mut env = vec![("TMPDIR".to_owned(), tmp.display().to_string())];
        let proxy = match task.no_network && kernel.tcp_rules() {
            true => match self.proxy().await {
                Ok(p) => Some(p),
                Err(e) => return Err(self.wall_failed(task, format!("the proxy: {e}"))),
            },
            false => None,
        };
        if let Some(p) = proxy {
            env.extend(p.env());
            if run.acp.is_some() && kernel.network_namespaces {
                // In its namespace loopback is the agent's own, and the host's model providers
                // there are forwarded in: nothing on loopback goes through the proxy.
                for k in ["NO_PROXY", "no_proxy"] {
                    env.push((k.to_owned(), "127.0.0.1,localhost,::1".to_owned()));
                }
            }
        }
        let policy = match self.policy(run, &tmp, proxy.map(|p| p.port)) {
            Ok(p) => p,
            Err(e) => return Err(self.wall_failed(task, e)),
        };
        let wall = self.build_wall(task, policy).await?;
        let held = Held {
            abi: Some(wall.abi()),
            network: wall.network(),
            namespace: wall.namespace(),
            ..Held::default()
        };
        log.line(&format!(
            "sandbox: Landlock ABI {}, writes only in the worktree{}{}",
            wall.abi(),
            if task.readonly { " (itself read-only)" } else { "" },
            match (task.no_network, wall.namespace()) {
                (true, true) =>
                    ", no network but the model provider (a network namespace of its own)",
                (true, false) => ", no network but the model provider",
                _ => "",
            }
        ));
        Ok(Walled { wall: Some(Arc::new(wall)), env, held, server: None, acp: None })
    }

    /// The Landlock ruleset for `policy`, built off the runtime; a failure is the run's end.
    async fn build_wall(&self, task: &Task, policy: Policy) -> Stage<Wall> {
        match tokio::task::spawn_blocking(move || Wall::build(&policy)).await {
            Ok(Ok(wall)) => Ok(wall),
            Ok(Err(e)) => Err(self.wall_failed(task, e.to_string())),
            Err(e) => Err(self.wall_failed(task, e.to_string())),
        }
    }

    /// Where `[verify]`'s checks run, which run the agent's code: in the agent's own wall when
    /// it had one of its own (a process-per-turn agent, a server of the task's own); on the
    /// repository's warm server, in a wall of the task's own, made now as for a per-turn agent;
    /// without one only where the agent had none either.
    pub(super) async fn confined(&self, run: &Run<'_>) -> Stage<crate::verify::Confined> {
        let walled = &run.walled;
        if let Some(wall) = &walled.wall {
            return Ok(crate::verify::Confined {
                wall: Some(wall.clone()),
                env: walled.env.clone(),
            });
        }
        if walled.held.abi.is_none() {
            return Ok(crate::verify::Confined::default());
        }
        let tmp = task_tmp(&self.home, run.task);
        let policy = self.policy(run, &tmp, None).map_err(|e| self.wall_failed(run.task, e))?;
        let wall = self.build_wall(run.task, policy).await?;
        let env = vec![("TMPDIR".to_owned(), tmp.display().to_string())];
        Ok(crate::verify::Confined { wall: Some(Arc::new(wall)), env })
    }

    /// Whether the task runs on its repository's warm server: its rules are the server's (it
    /// may write its worktree and use the network) and its worktree is among the repository's.
    fn shares_repository_server(&self, run: &Run<'_>) -> bool {
        let task = run.task;
        !task.readonly && !task.no_network && run.dir.starts_with(self.repo_worktrees(&task.repo))
    }

    /// The warm server of the task's repository, walled to that repository's worktrees (made
    /// on the first task of the repository).
    async fn repository_server(&self, run: &Run<'_>, log: &mut TaskLog) -> Stage<Walled> {
        let repo = &run.task.repo;
        let kind = run.spec.kind;
        let key = queue::home::repo_dir_name(Path::new(repo));
        let make = || {
            let tmp = self.home.root().join("tmp").join(format!("server-{}", key));
            let policy = self.repository_policy(repo, &tmp, kind)?;
            let wall = Wall::build(&policy).map_err(|e| e.to_string())?;
            Ok::<_, String>((
                Some(Arc::new(wall)),
                vec![("TMPDIR".to_owned(), tmp.display().to_string())],
            ))
        };
        let (server, acp, abi) = match (&run.acp, &self.servers) {
            (Some(launch), _) => match self.acp.get(launch, &key, make) {
                Ok(a) => {
                    let abi = a.wall_abi();
                    (None, Some(a), abi)
                }
                Err(e) => return Err(self.wall_failed(run.task, e)),
            },
            (None, Some(servers)) => match servers.get(&key, make) {
                Ok(s) => {
                    let abi = s.wall_abi();
                    (Some(s), None, abi)
                }
                Err(e) => return Err(self.wall_failed(run.task, e)),
            },
            (None, None) => return Ok(Walled::default()),
        };
        log.line(&format!(
            "sandbox: Landlock ABI {}, on the warm agent of {repo}, which writes only in that \
             repository's worktrees",
            abi.unwrap_or_default()
        ));
        let held = Held { abi, repository: true, ..Held::default() };
        Ok(Walled { wall: None, env: Vec::new(), held, server, acp })
    }

    /// What the warm server of `repo` may touch: every worktree of the repository (each
    /// task's directory is inside [`Worker::repo_worktrees`]), their git administration and
    /// objects, OpenCode's state, the server's own TMPDIR; not the rest of the home.
    fn repository_policy(&self, repo: &str, tmp: &Path, kind: AgentKind) -> Result<Policy, String> {
        let text = |e: &dyn std::fmt::Display| e.to_string();
        let mut write = self.common_writes(kind).map_err(|e| text(&e))?;
        let worktrees = self.repo_worktrees(repo);
        std::fs::create_dir_all(&worktrees).map_err(|e| text(&e))?;
        queue::create_private_dir(tmp).map_err(|e| text(&e))?;
        let common = crate::git::common_dir(Path::new(repo)).map_err(|e| text(&e))?;
        let admin = common.join("worktrees");
        std::fs::create_dir_all(&admin).map_err(|e| text(&e))?;
        write.extend(crate::git::object_dirs(&common).map_err(|e| text(&e))?);
        write.extend([worktrees, admin, tmp.to_path_buf()]);
        write.extend(self.bridge_files(kind));
        let read = vec![crate::agent::opencode_serve::plugin_dir(&self.home)];
        Ok(Policy { write, read, hidden: self.hidden(), ..Policy::default() })
    }

    /// How the run's agent is started over ACP, if it is: OpenCode in `acp` mode, or the
    /// configured agent the task names (refused when this worker has no such agent, or its
    /// program is missing here).
    pub(super) fn acp_launch(
        &self,
        spec: &crate::agent::AgentSpec,
    ) -> Stage<Option<crate::agent::acp::Launch>> {
        let refuse = |error: String| {
            let kind = queue::FailureKind::Launch;
            Err(Outcome::FailedPermanently { error, kind, result: None }.into())
        };
        match spec.kind {
            AgentKind::OpenCode => Ok(self.opencode_acp.clone()),
            AgentKind::Acp => {
                let name = spec.configured.as_deref().unwrap_or_default();
                let Some(agent) = self.cfg.agent(name) else {
                    return refuse(format!(
                        "this worker has no agent '{name}': add [agents.{name}] to the config of \
                         the worker that should run it"
                    ));
                };
                if let Some(missing) = agent.missing(&self.cfg.env) {
                    return refuse(missing);
                }
                Ok(Some(agent.launch()))
            }
            _ => Ok(None),
        }
    }

    fn wall_failed(&self, task: &Task, why: String) -> super::End {
        let error = format!("could not put the agent inside its sandbox: {why}");
        tracing::warn!(task = %task.id, "{error}");
        let kind = queue::FailureKind::Sandbox;
        Outcome::Failed { error, kind, result: None, backoff_s: self.backoff(task.attempts) }.into()
    }

    /// What `run`'s agent may touch: see the module's documentation.
    fn policy(&self, run: &Run<'_>, tmp: &Path, proxy: Option<u16>) -> Result<Policy, String> {
        let task = run.task;
        let mut write = self.common_writes(run.spec.kind).map_err(|e| e.to_string())?;
        queue::create_private_dir(tmp).map_err(|e| e.to_string())?;
        let git_dirs = crate::git::worktree_git_dirs(Path::new(&task.repo), &run.dir)
            .map_err(|e| format!("{}: {e}", run.dir.display()))?;
        write.extend(git_dirs);
        write.push(tmp.to_path_buf());
        write.extend(self.bridge_files(run.spec.kind));
        let mut read = Vec::new();
        if run.serving() {
            read.push(crate::agent::opencode_serve::plugin_dir(&self.home));
        }
        match task.readonly {
            true => read.push(run.dir.clone()),
            false => write.push(run.dir.clone()),
        }
        Ok(Policy {
            write,
            read,
            hidden: self.hidden(),
            connect_only: proxy.map(|p| vec![p]),
            // An ACP agent may serve itself on loopback (OpenCode 2 does): there its loopback
            // bypasses the proxy, and a model provider on the host's loopback is forwarded in.
            own_loopback: run.acp.is_some(),
            loopback_forwards: model_hosts(&self.cfg)
                .iter()
                .filter(|h| ["127.0.0.1", "localhost", "::1", "[::1]"].contains(&h.name.as_str()))
                .map(|h| h.port)
                .collect(),
        })
    }

    /// What every wall of this worker lets its agent write: the agent's own state (made here
    /// when missing: inside the wall the agent could not make it) and the directories the
    /// configuration adds.
    pub(crate) fn common_writes(&self, kind: AgentKind) -> std::io::Result<Vec<PathBuf>> {
        let (dirs, files) = kind.state_paths(&self.cfg.env);
        let config = kind.config_paths(&self.cfg.env);
        for d in dirs.iter().chain(&config).filter(|d| !d.exists()) {
            // Private when made here: an agent keeps its sessions there.
            queue::create_private_dir(d).map_err(std::io::Error::other)?;
        }
        for d in kind.private_paths(&self.cfg.env) {
            // Made by the agent itself (outside the wall, with its umask): its transcripts hold
            // whatever a command printed, the environment included.
            if std::fs::metadata(&d).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
                tracing::warn!(dir = %d.display(), "the agent's transcripts were readable by others; now 0700");
                queue::create_private_dir(&d).map_err(std::io::Error::other)?;
            }
        }
        let mut write = dirs;
        write.extend(files);
        write.extend(self.cfg.sandbox.writable.iter().cloned());
        Ok(write)
    }

    /// What the reverse bridge (`--claude-bridge`), which OpenCode starts inside the wall,
    /// needs of the queue: the SQLite file and its WAL, or the 0600 file with the PostgreSQL
    /// URL. Nothing without the bridge, or for another agent.
    fn bridge_files(&self, kind: AgentKind) -> Vec<PathBuf> {
        if self.cfg.claude_bridge.is_none() || !matches!(kind, AgentKind::OpenCode | AgentKind::Acp)
        {
            return Vec::new();
        }
        match self.store.location() {
            queue::Location::Sqlite(db) => sqlite_files(db, &["-wal", "-shm"]),
            location => vec![self.home.db_url_file(location)],
        }
    }

    /// What no agent may read: TaskBridge's home (the queue, its token, every task's log and
    /// worktree but the agent's own) and the queue's database wherever it is.
    pub(crate) fn hidden(&self) -> Vec<PathBuf> {
        let mut hidden = vec![self.home.root().to_path_buf()];
        if let queue::Location::Sqlite(db) = self.store.location() {
            hidden.extend(sqlite_files(db, &["-wal", "-shm", "-journal"]));
        }
        hidden
    }

    /// The worker's proxy for walls without network, started on first use.
    async fn proxy(&self) -> std::io::Result<&Proxy> {
        self.proxy
            .get_or_try_init(|| async {
                let hosts = model_hosts(&self.cfg);
                tracing::info!(hosts = ?hosts.iter().map(Host::to_string).collect::<Vec<_>>(), "starting the sandbox's proxy");
                Proxy::start(hosts).await
            })
            .await
    }
}

/// A SQLite database and the files SQLite keeps beside it (`<db>-wal`, ...).
fn sqlite_files(db: &Path, suffixes: &[&str]) -> Vec<PathBuf> {
    let name = db.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let beside = suffixes.iter().map(|s| db.with_file_name(format!("{name}{s}")));
    std::iter::once(db.to_path_buf()).chain(beside).collect()
}

/// Hosts of the model providers the agents use, as far as the worker can tell: the well-known
/// ones, those named in the agents' own settings (`ANTHROPIC_BASE_URL`, `OPENAI_BASE_URL`,
/// every `baseURL`/`base_url` in OpenCode's and Codex's configuration), and the configured ones.
pub(crate) fn model_hosts(cfg: &crate::config::WorkerConfig) -> Vec<Host> {
    let mut hosts: Vec<Host> = [
        "api.anthropic.com",
        "api.openai.com",
        "chatgpt.com",
        "openrouter.ai",
        "generativelanguage.googleapis.com",
        "opencode.ai",
    ]
    .iter()
    .map(|h| Host { name: (*h).to_owned(), port: 443 })
    .collect();
    let env = &cfg.env;
    let mut urls: Vec<String> =
        ["ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"].iter().filter_map(|k| env.var(k)).collect();
    let mut texts: Vec<String> = cfg.opencode_config_content.iter().cloned().collect();
    let home = env.home_dir();
    let opencode_dir =
        env.path("XDG_CONFIG_HOME").or_else(|| home.as_ref().map(|h| h.join(".config")));
    let codex_dir = env.path("CODEX_HOME").or_else(|| home.as_ref().map(|h| h.join(".codex")));
    let files = [
        opencode_dir.as_ref().map(|d| d.join("opencode/opencode.json")),
        opencode_dir.as_ref().map(|d| d.join("opencode/opencode.jsonc")),
        codex_dir.map(|d| d.join("config.toml")),
    ];
    texts.extend(files.into_iter().flatten().filter_map(|f| std::fs::read_to_string(f).ok()));
    for text in &texts {
        urls.extend(urls_in(text));
    }
    for h in &cfg.sandbox.model_hosts {
        match Host::of_url(h) {
            Some(host) => hosts.push(host),
            None => hosts.extend(Host::parse(h, 443)),
        }
    }
    hosts.extend(urls.iter().filter_map(|u| Host::of_url(u)));
    hosts.dedup();
    hosts
}

/// The `http(s)://` URLs given to a `baseURL` or `base_url` key in a JSON or TOML text.
fn urls_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for key in ["baseURL", "base_url"] {
        let mut rest = text;
        while let Some(at) = rest.find(key) {
            rest = &rest[at + key.len()..];
            let value = rest.trim_start_matches(['"', ' ', ':', '=', '\t']);
            if let Some(end) = value.find('"')
                && value[..end].starts_with("http")
            {
                out.push(value[..end].to_owned());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_hosts_come_from_the_agents_settings_and_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let codex = dir.path().join("codex");
        std::fs::create_dir_all(&codex).unwrap();
        std::fs::write(
            codex.join("config.toml"),
            "[model_providers.mock]\nbase_url = \"http://127.0.0.1:4001/v1\"\n",
        )
        .unwrap();
        let cfg = crate::config::WorkerConfig {
            env: queue::Environment::from_vars([
                ("HOME", dir.path().to_str().unwrap()),
                ("CODEX_HOME", codex.to_str().unwrap()),
                ("ANTHROPIC_BASE_URL", "http://127.0.0.1:4000"),
            ]),
            opencode_config_content: Some(
                r#"{"provider":{"x":{"options":{"baseURL": "https://llm.example:8443/v1"}}}}"#
                    .into(),
            ),
            sandbox: crate::config::SandboxConfig {
                model_hosts: vec!["models.internal:9000".into(), "https://gw.example/v1".into()],
                ..Default::default()
            },
            ..Default::default()
        };
        let hosts: Vec<String> = model_hosts(&cfg).iter().map(Host::to_string).collect();
        for want in [
            "api.anthropic.com:443",
            "127.0.0.1:4000",
            "127.0.0.1:4001",
            "llm.example:8443",
            "models.internal:9000",
            "gw.example:443",
        ] {
            assert!(hosts.contains(&want.to_owned()), "{want} in {hosts:?}");
        }
        assert!(!hosts.iter().any(|h| h.starts_with("127.0.0.1:9")), "{hosts:?}");
    }
}
