//! The `opencode serve` process: started on a free loopback port behind the password, started
//! again when it died (and what it ran killed with it), recorded in `<home>/servers/` so the next
//! worker on this host can find a server (and spare worktrees) a killed worker left behind.

use super::{ServeAgent, io_err};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

/// How long a new server may take to say it is listening.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How often the record of what the server started is refreshed: a command started less than
/// this before the server died may be missed when cleaning up after it.
const TREE_REFRESH: Duration = Duration::from_millis(250);

/// One `opencode serve` child and how to reach it.
pub(super) struct Running {
    pub(super) child: tokio::process::Child,
    pid: i32,
    /// What the server has started, refreshed while it lives: OpenCode runs commands in
    /// process groups of their own, which a dead server's pid no longer leads to.
    tree: std::sync::Arc<std::sync::Mutex<crate::process::ProcessTree>>,
    pub(super) port: u16,
    /// Counts the servers this worker started: a request parked on an earlier one is gone.
    pub(super) generation: u64,
    /// Out of its network namespace to the proxy and into it from the worker, for a server
    /// without network.
    _forwarding: Vec<crate::sandbox::netns::Forwarding>,
}

/// An OpenCode plugin that blanks the warm server's password in the environment of every
/// command the agent runs. OpenCode's shell tools start commands with the server's own
/// environment, where the password is (`OPENCODE_SERVER_PASSWORD` is how `opencode serve` takes
/// it), and apply the `shell.env` hook's variables over it; without this a command could call
/// the server and read or drive every session on it. What it cannot stop (a command reading the
/// server's `/proc/PID/environ`, which the same user may) the README says.
const ENV_PLUGIN: &str = r#"// Written by TaskBridge (see worker/src/agent/opencode_serve/server.rs): the agent's commands do not get the
// OpenCode server's password.
export const TaskbridgeEnv = async () => ({
  "shell.env": async (_input, output) => {
    output.env.OPENCODE_SERVER_PASSWORD = "";
  },
});
"#;

/// npm offline for the warm server, unless the user set it. Before OpenCode loads any plugin
/// (and the environment plugin is always there) it waits for its own install of
/// `@opencode-ai/plugin` into each config directory, once per directory it serves, and that
/// install runs inside the wall, where it cannot write (npm's cache, the read-only config
/// directory). Online it waited on npm's retries and timeouts: 54–56 s before a new
/// repository's first task (issue #55), and for ever against a registry that does not answer.
/// Offline the install fails at once, which OpenCode logs as a warning and shrugs off; the
/// plugin TaskBridge gives it needs no package. `env` looks a variable up (npm reads either
/// case).
pub fn npm_offline(env: &queue::Environment) -> Option<(String, String)> {
    let set = ["npm_config_offline", "NPM_CONFIG_OFFLINE"].iter().any(|k| env.is_set(k));
    (!set).then(|| ("npm_config_offline".to_owned(), "true".to_owned()))
}

/// Where the environment plugin is written: a warm server's wall lets it read there.
pub fn plugin_dir(home: &queue::Home) -> PathBuf {
    home.root().join("opencode-plugin")
}

/// Writes the environment plugin into the home (each start: a newer TaskBridge may change it)
/// and returns its path.
pub fn env_plugin(home: &queue::Home) -> std::io::Result<PathBuf> {
    let dir = plugin_dir(home);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("taskbridge-env.js");
    std::fs::write(&path, ENV_PLUGIN)?;
    Ok(path)
}

/// Records an agent process's pid and start time in `file` (under `<home>/servers/`), with the
/// worker's own, so a later worker can tell the process is an orphan without the database (which
/// may be what killed this one): [`kill_orphaned_servers`].
pub fn record_pid(file: &Path, pid: i64) {
    if let Some(dir) = file.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let me = i64::from(std::process::id());
    let record = json!({
        "pid": pid,
        "started": crate::process::process_start_time(pid),
        "worker_pid": me,
        "worker_started": crate::process::process_start_time(me),
    });
    let _ = std::fs::write(file, record.to_string());
}

/// A password nobody else on the machine can guess: 32 bytes from the kernel.
pub fn random_password() -> String {
    use std::io::Read;
    let mut buf = [0u8; 32];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf));
    if read.is_err() {
        for b in &mut buf {
            *b = fastrand::u8(..);
        }
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where a worker lists its spare worktrees (`<home>/servers/<worker>.spares.json`).
pub fn spares_file(home: &queue::Home, worker: &str) -> PathBuf {
    home.root().join("servers").join(format!("{}.spares.json", server_file_name(worker)))
}

/// The name of a worker's server file (`<home>/servers/<this>.json`).
pub fn server_file_name(worker: &str) -> String {
    worker.replace([':', '/'], "_")
}

impl ServeAgent {
    /// The port of a live server, starting one if there is none (or it died).
    pub(super) async fn ensure(&self) -> std::io::Result<u16> {
        let mut state = self.state.lock().await;
        if let Some(r) = state.as_mut()
            && matches!(r.child.try_wait(), Ok(None))
        {
            return Ok(r.port);
        }
        if let Some(dead) = state.take() {
            // What it ran must not outlive it.
            if let Ok(mut tree) = dead.tree.lock() {
                tree.refresh();
                tree.signal(nix::sys::signal::Signal::SIGKILL);
            }
            tracing::warn!(pid = dead.pid, "the OpenCode server had died; starting a new one");
        }
        let mut last = None;
        // The server cannot pick a free port itself (`--port 0` means its default, 4096), so
        // one is chosen here; another process may take it in between, so try a few.
        for _ in 0..3 {
            match self.start().await {
                Ok(mut r) => {
                    r.generation =
                        self.generation.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    let port = r.port;
                    *state = Some(r);
                    return Ok(port);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io_err("the OpenCode server did not start")))
    }

    async fn start(&self) -> std::io::Result<Running> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut child = tokio::process::Command::new(&self.program);
        for var in crate::process::SECRET_ENV {
            child.env_remove(var);
        }
        let link = crate::sandbox::confine(&mut child, self.wall.as_ref(), true)?;
        let mut child = child
            .args(["serve", "--port", &port.to_string(), "--hostname", "127.0.0.1"])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("OPENCODE_SERVER_PASSWORD", self.http.password())
            // The agent's own question tool: TaskBridge answers it.
            .env("OPENCODE_ENABLE_QUESTION_TOOL", "1")
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        // Without network the server is in a namespace of its own: out of it to the proxy, and
        // into it from a port of the host's, which is the one the worker calls.
        let (port, forwarding) = match link {
            Some(link) => {
                let out = link.forward()?;
                let (outside, inward) = link.expose(port).await?;
                (outside, vec![out, inward])
            }
            None => (port, vec![]),
        };
        let pid = child.id().map(i64::from).unwrap_or(0);
        let mut out =
            BufReader::new(child.stdout.take().ok_or_else(|| io_err("no stdout"))?).lines();
        let listening = tokio::time::timeout(START_TIMEOUT, async {
            while let Ok(Some(line)) = out.next_line().await {
                if line.contains("listening on") {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false);
        if !listening {
            let _ = child.start_kill();
            return Err(io_err(format!(
                "'{} serve' did not start listening within {} s",
                self.program.display(),
                START_TIMEOUT.as_secs()
            )));
        }
        // Keep draining its output so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
        if let Some(err) = child.stderr.take() {
            tokio::spawn(async move {
                let mut lines = BufReader::new(err).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    tracing::debug!(target: "opencode_serve", "{l}");
                }
            });
        }
        let tree = std::sync::Arc::new(std::sync::Mutex::new(crate::process::ProcessTree::new(
            pid as i32,
        )));
        let watched = std::sync::Arc::downgrade(&tree);
        tokio::spawn(async move {
            // Until the server is dropped (a new one replaced it, or the worker stopped).
            while let Some(tree) = watched.upgrade() {
                if let Ok(mut t) = tree.lock() {
                    t.refresh();
                }
                drop(tree);
                tokio::time::sleep(TREE_REFRESH).await;
            }
        });
        record_pid(&self.pid_file, pid);
        tracing::info!(port, pid, "OpenCode server started");
        Ok(Running { child, pid: pid as i32, tree, port, generation: 0, _forwarding: forwarding })
    }

    /// The Landlock ABI of the server's wall, when it has one.
    pub fn wall_abi(&self) -> Option<i32> {
        self.wall.as_ref().map(|w| w.abi())
    }

    /// Kills what the server runs in `dir` (a task's worktree, once its run is over).
    pub async fn kill_working_in(&self, dir: &Path) -> usize {
        let state = self.state.lock().await;
        let Some(r) = state.as_ref() else { return 0 };
        r.tree.lock().map_or(0, |mut tree| tree.kill_working_in(dir))
    }

    /// Stops the server and everything it started.
    pub async fn shutdown(&self) {
        if let Some(mut r) = self.state.lock().await.take() {
            if let Ok(mut tree) = r.tree.lock() {
                tree.refresh();
                tree.signal(nix::sys::signal::Signal::SIGKILL);
            }
            let _ = r.child.kill().await;
        }
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

/// Removes the spare worktrees a dead worker listed.
fn remove_spares(list: &Path) {
    let spares: Vec<Value> = std::fs::read_to_string(list)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    for s in spares {
        if let (Some(repo), Some(dir)) = (s["repo"].as_str(), s["dir"].as_str()) {
            // A spare is detached; one on a branch was taken by a task since.
            if crate::git::head_branch(Path::new(repo), Path::new(dir)).is_some() {
                continue;
            }
            match crate::git::remove_worktree(Path::new(repo), Path::new(dir)) {
                Ok(()) => tracing::info!(dir, "removed a dead worker's spare worktree"),
                Err(e) => tracing::warn!(dir, error = %e, "removing a dead worker's spare failed"),
            }
        }
    }
    let _ = std::fs::remove_file(list);
}

/// Whether the worker that wrote a server's pid file still runs, from the file alone: `None`
/// for a file that does not say (one written before it did).
fn worker_alive(record: &Value) -> Option<bool> {
    let pid = record["worker_pid"].as_i64()?;
    let started = record["worker_started"].as_str();
    Some(
        crate::process::pid_alive(pid)
            && crate::process::process_start_time(pid).as_deref() == started,
    )
}

/// Kills the OpenCode servers that workers on this host left behind when they died, from their
/// pid files; `alive` says whether a worker (by its file name) still runs, for a file that does
/// not name its worker's pid (or, with the database out of reach, `|_| true`: kill only what
/// is known to be orphaned).
pub fn kill_orphaned_servers(home: &queue::Home, alive: impl Fn(&str) -> bool) {
    let dir = home.root().join("servers");
    let Ok(entries) = std::fs::read_dir(&dir) else { return };
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        if let Some(name) = file.strip_suffix(".spares.json") {
            if !alive(name) {
                remove_spares(&e.path());
            }
            continue;
        }
        // `<worker>@<wall>.json`; a worker before walls named its one server `<worker>.json`.
        let stem = file.trim_end_matches(".json");
        let name = stem.split('@').next().unwrap_or(stem).to_owned();
        let record = std::fs::read_to_string(e.path())
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .unwrap_or_default();
        if worker_alive(&record).unwrap_or_else(|| alive(&name)) {
            continue;
        }
        if let Some(pid) = record["pid"].as_i64()
            && crate::process::kill_orphan(pid, record["started"].as_str())
        {
            tracing::warn!(pid, "killed the OpenCode server of a dead worker");
        }
        let _ = std::fs::remove_file(e.path());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npm_goes_offline_unless_the_user_set_it_in_either_case() {
        let none = queue::Environment::from_vars([("npm_config_other", "1")]);
        assert_eq!(npm_offline(&none), Some(("npm_config_offline".into(), "true".into())));
        for key in ["npm_config_offline", "NPM_CONFIG_OFFLINE"] {
            let set = queue::Environment::from_vars([(key, "")]);
            assert_eq!(npm_offline(&set), None, "{key} set by the user, even to nothing");
        }
    }

    #[test]
    fn a_password_is_64_hex_digits_never_the_same_twice() {
        let (a, b) = (random_password(), random_password());
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn a_workers_files_are_named_without_separators() {
        assert_eq!(server_file_name("host:123/a"), "host_123_a");
        let home = queue::Home::at("/h").unwrap();
        assert_eq!(spares_file(&home, "h:1"), Path::new("/h/servers/h_1.spares.json"));
    }

    #[test]
    fn a_dead_workers_server_files_and_detached_spares_are_cleared_and_a_live_ones_kept() {
        let sh = crate::git::tests::git;
        let repo = tempfile::tempdir().unwrap();
        sh(repo.path(), &["init", "-q", "-b", "main"]);
        std::fs::write(repo.path().join("a.txt"), "a\n").unwrap();
        sh(repo.path(), &["add", "."]);
        sh(repo.path(), &["commit", "-qm", "init"]);
        let base = crate::git::resolve_repo(repo.path(), None).unwrap().base;
        let root = tempfile::tempdir().unwrap();
        let spare = root.path().join("spare");
        let taken = root.path().join("taken");
        crate::git::prepare_worktree(repo.path(), &base, 1, None, &spare, None).unwrap();
        crate::git::park_worktree(repo.path(), &spare, "taskbridge/task-1").unwrap();
        crate::git::prepare_worktree(repo.path(), &base, 2, None, &taken, None).unwrap();

        let home = queue::Home::at(root.path().join("home")).unwrap();
        let servers = home.root().join("servers");
        std::fs::create_dir_all(&servers).unwrap();
        let listed = json!([
            {"repo": repo.path(), "dir": spare},
            {"repo": repo.path(), "dir": taken},
        ]);
        std::fs::write(servers.join("dead.spares.json"), listed.to_string()).unwrap();
        std::fs::write(servers.join("alive.spares.json"), listed.to_string()).unwrap();
        // No process has this pid, so nothing is killed; the file of a dead worker still goes.
        std::fs::write(servers.join("dead.json"), r#"{"pid": 2147483000}"#).unwrap();
        std::fs::write(servers.join("dead@demo-1a2b3c4d.json"), r#"{"pid": 2147483000}"#).unwrap();
        std::fs::write(servers.join("alive.json"), r#"{"pid": 2147483000}"#).unwrap();
        std::fs::write(servers.join("alive@task-7.json"), r#"{"pid": 2147483000}"#).unwrap();
        // Files that name their worker's pid say themselves whether it lives, whatever the
        // database (`alive`) says: this process lives; a pid that runs nothing does not; nor
        // does this process's pid with another start time (a pid reused).
        let me = std::process::id();
        let started = crate::process::process_start_time(me.into()).unwrap();
        let says = |pid: u32, started: &str| {
            json!({"pid": 2147483000, "worker_pid": pid, "worker_started": started}).to_string()
        };
        std::fs::write(servers.join("dead@own.json"), says(me, &started)).unwrap();
        std::fs::write(servers.join("alive@gone.json"), says(2147483000, &started)).unwrap();
        std::fs::write(servers.join("alive@reused.json"), says(me, "1")).unwrap();
        kill_orphaned_servers(&home, |name| name == "alive");
        let mut left: Vec<String> = std::fs::read_dir(&servers)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            vec!["alive.json", "alive.spares.json", "alive@task-7.json", "dead@own.json"]
        );
        assert!(!spare.exists(), "the dead worker's detached spare is removed");
        assert!(taken.join("a.txt").exists(), "a spare a task took since is its worktree now");
    }

    #[test]
    fn the_environment_plugin_is_written_into_the_home_and_blanks_the_password() {
        let root = tempfile::tempdir().unwrap();
        let home = queue::Home::at(root.path().join("home")).unwrap();
        let path = env_plugin(&home).unwrap();
        assert_eq!(path, home.root().join("opencode-plugin/taskbridge-env.js"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(r#"output.env.OPENCODE_SERVER_PASSWORD = "";"#), "{text}");
        // Written again each start, so a changed plugin replaces an old one.
        std::fs::write(&path, "old").unwrap();
        env_plugin(&home).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), ENV_PLUGIN);
    }
}
