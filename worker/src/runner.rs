//! The claim loop and the life of one task run.
//!
//! # Lifecycle
//! A [`Worker`] registers itself in the database, recovers tasks left by dead workers on this
//! host, then loops: while it has a free slot it claims the next runnable task and runs it; when
//! nothing is runnable it sleeps until a commit is noticed (same process: at once; another
//! process: the queue's [`queue::ChangeWatcher`]) or a one-second safety-net tick. Each run holds
//! a lease that a heartbeat extends every third of its length; the heartbeat also carries cancel
//! requests. A lost lease stops the run without writing anything: the fencing token makes sure a
//! worker that was paused or partitioned can never overwrite the next run's result.

use crate::agent::AgentKind;
use crate::diagnose::{self, Diagnosis, ModelUsed};
use crate::error::{Error, Result};
use crate::events::{AgentError, Usage};
use crate::git;
use crate::logs::TaskLog;
use crate::models;
use crate::notify::{self, NotifyConfig};
use crate::process::{self, AgentCommand, StopReason};
use crate::result::{self, TaskResult};
use queue::{Claim, Home, Outcome, RunFacts, Store, Task, TaskId, TaskStatus};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore, watch};
use tokio_util::sync::CancellationToken;

const PREAMBLE: &str = include_str!("../../assets/preamble.md");
const RESUME: &str = include_str!("../../assets/resume.md");

/// How the worker drives OpenCode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenCodeMode {
    /// A new `opencode run` process for every prompt: the fallback (no native questions or
    /// approvals, no budgets).
    Run,
    /// One warm `opencode serve` per worker; a prompt is a request.
    #[default]
    Serve,
}

impl std::str::FromStr for OpenCodeMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "run" => Ok(OpenCodeMode::Run),
            "serve" => Ok(OpenCodeMode::Serve),
            other => Err(format!("'{other}' is not an OpenCode mode; use serve or run")),
        }
    }
}

impl OpenCodeMode {
    pub fn as_str(self) -> &'static str {
        match self {
            OpenCodeMode::Run => "run",
            OpenCodeMode::Serve => "serve",
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
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            concurrency: 2,
            lease: Duration::from_secs(30),
            opencode: PathBuf::from("opencode"),
            opencode_mode: OpenCodeMode::Serve,
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

/// A started worker: the handle to wait for it, and the watcher that wakes it while it runs.
pub struct RunningWorker {
    pub worker: Arc<Worker>,
    pub handle: tokio::task::JoinHandle<Result<()>>,
    _watcher: Option<queue::ChangeWatcher>,
}

pub struct Worker {
    store: Arc<Store>,
    home: Home,
    cfg: WorkerConfig,
    id: String,
    host: String,
    wake: Arc<Notify>,
    running: AtomicUsize,
    notifier: notify::Notifier,
    /// The warm OpenCode server, in `serve` mode.
    server: Option<crate::serve::ServeAgent>,
    /// Done tasks' worktrees kept for the next task of their repository (`serve` mode): the
    /// server has set itself up for those directories, which takes it over a second for a new
    /// one, most of a one-turn task.
    spares: std::sync::Mutex<Vec<Spare>>,
    /// Held while a mirror is fetched: two fetches into one repository would fight over its
    /// ref locks.
    mirrors: Arc<std::sync::Mutex<()>>,
}

/// What one turn of a CLI agent (Claude Code, Codex) needs.
struct CliTurn<'a> {
    kind: AgentKind,
    task: &'a Task,
    token: i64,
    dir: &'a Path,
    prompt: &'a str,
    model: Option<&'a str>,
    /// The session to resume: an answer, a verification round, a follow-up, an interrupted run.
    session: Option<&'a str>,
    grants: crate::serve::Grants,
    deadline: tokio::time::Instant,
    /// What the task had spent before this run (earlier runs, earlier rounds of this one).
    spent: Usage,
}

/// A spare worktree: clean, detached, ready to be put on the next task's branch.
struct Spare {
    repo: String,
    dir: PathBuf,
    since: std::time::Instant,
}

/// A spare unused for this long is removed: the server forgets its set-up for a directory
/// after an hour idle, and the disk is worth more than a cold directory.
const SPARE_TTL: Duration = Duration::from_secs(50 * 60);

/// The name this host goes by in the queue: `TASKBRIDGE_HOST` when set (a container whose
/// hostname changes at every start, say), else the system's hostname. Workers, reapers and
/// the reverse bridge use it to tell their own host's processes from other hosts'.
pub fn hostname() -> String {
    if let Ok(h) = std::env::var("TASKBRIDGE_HOST")
        && !h.trim().is_empty()
    {
        return h.trim().to_owned();
    }
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

impl Worker {
    pub fn new(store: Arc<Store>, home: Home, cfg: WorkerConfig) -> Arc<Worker> {
        let wake = Arc::new(Notify::new());
        let w = wake.clone();
        store.on_change(move || w.notify_one());
        let host = hostname();
        let id = format!("{host}:{}:{}", std::process::id(), fastrand::u32(..) % 100_000);
        let notifier = notify::Notifier::new(cfg.notify.clone());
        let server = (cfg.opencode_mode == OpenCodeMode::Serve).then(|| {
            let mut content = cfg.opencode_config_content.clone();
            if let Some(bridge) = &cfg.claude_bridge {
                content = Some(with_bridge(content.as_deref(), bridge));
            }
            match crate::serve::env_plugin(&home) {
                Ok(plugin) => content = Some(with_plugin(content.as_deref(), &plugin)),
                // Said, not fatal: the agent's commands would see the server's password.
                Err(e) => tracing::warn!(error = %e, "cannot write OpenCode's environment plugin"),
            }
            let mut env: Vec<(String, String)> =
                content.map(|c| ("OPENCODE_CONFIG_CONTENT".to_owned(), c)).into_iter().collect();
            env.extend(crate::serve::npm_retries(|k| std::env::var(k).ok()));
            crate::serve::ServeAgent::new(cfg.opencode.clone(), env, &home, &id)
        });
        Arc::new(Worker {
            store,
            home,
            cfg,
            id,
            host,
            wake,
            running: AtomicUsize::new(0),
            notifier,
            server,
            spares: Default::default(),
            mirrors: Default::default(),
        })
    }

    /// Stops this worker's OpenCode server now (its shutdown does too; again is harmless): for
    /// a process that cannot wait for the worker to finish stopping.
    pub async fn stop_server(&self) {
        if let Some(server) = &self.server {
            server.shutdown().await;
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The configuration this worker runs with (a restarted worker reuses it).
    pub fn config(&self) -> &WorkerConfig {
        &self.cfg
    }

    /// Starts a worker on the current runtime. It wakes at once on commits from this process and,
    /// through a watcher on the database file, from other processes too (else only on its
    /// one-second poll).
    pub fn start(
        store: Arc<Store>,
        home: Home,
        cfg: WorkerConfig,
        shutdown: CancellationToken,
    ) -> RunningWorker {
        let worker = Worker::new(store.clone(), home, cfg);
        let waker = worker.waker();
        let watcher = queue::ChangeWatcher::spawn(&store, move || waker.notify_one())
            .map_err(|e| {
                tracing::warn!(error = %e, "cannot watch the database; the worker polls every second")
            })
            .ok();
        let handle = tokio::spawn(worker.clone().run(shutdown));
        RunningWorker { worker, handle, _watcher: watcher }
    }

    /// A handle that wakes the claim loop; give it to anything that learns of outside commits.
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Tasks being run by this worker now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> queue::Result<T> + Send + 'static,
    ) -> Result<T> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| Error::Join(e.to_string()))?
            .map_err(Error::from)
    }

    /// Runs until `shutdown` is cancelled (or, with `once`, until the queue is idle). On shutdown
    /// running agents are stopped and their tasks go back to the queue without using an attempt.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) -> Result<()> {
        let (id, host, conc) = (self.id.clone(), self.host.clone(), self.cfg.concurrency);
        let agent = format!("opencode {}", self.cfg.opencode_mode.as_str());
        self.blocking(move |s| s.register_worker(&id, std::process::id(), &host, conc, &agent))
            .await?;
        let agents = self.agents();
        tracing::info!(worker = %self.id, ?agents, "agents this worker can run");
        let id = self.id.clone();
        self.blocking(move |s| s.worker_runs(&id, &agents)).await?;
        self.recover_dead_local_workers().await;
        let housekeeping = tokio::spawn(self.clone().housekeeping(shutdown.clone()));
        let slots = Arc::new(Semaphore::new(self.cfg.concurrency.max(1)));
        let mut runs = tokio::task::JoinSet::new();
        tracing::info!(worker = %self.id, concurrency = self.cfg.concurrency, "worker started");
        loop {
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                _ = shutdown.cancelled() => break,
            };
            let (id, host, lease) = (self.id.clone(), self.host.clone(), self.cfg.lease);
            let claimed = match self.blocking(move |s| s.claim_next(&id, &host, lease)).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "claiming a task failed; retrying in 1 s");
                    None
                }
            };
            match claimed {
                Some(claim) => {
                    let me = self.clone();
                    let stop = shutdown.clone();
                    self.running.fetch_add(1, Ordering::Relaxed);
                    runs.spawn(async move {
                        let id = claim.task.id;
                        if let Err(e) = me.clone().execute(claim, stop).await {
                            tracing::error!(task = %id, error = %e, "task run failed");
                        }
                        me.running.fetch_sub(1, Ordering::Relaxed);
                        drop(permit);
                    });
                    continue;
                }
                None => drop(permit),
            }
            while runs.try_join_next().is_some() {}
            if self.cfg.once && runs.is_empty() && !self.anything_runnable().await {
                break;
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                Some(_) = runs.join_next(), if !runs.is_empty() => {}
                _ = shutdown.cancelled() => break,
            }
        }
        // Stop: running tasks see the cancellation and release themselves.
        while runs.join_next().await.is_some() {}
        housekeeping.abort();
        let id = self.id.clone();
        let _ = self.blocking(move |s| s.worker_stopped(&id)).await;
        if let Some(server) = &self.server {
            server.shutdown().await;
        }
        self.drop_spares(true).await;
        let _ = std::fs::remove_file(crate::serve::spares_file(&self.home, &self.id));
        // The last tasks' webhooks get a moment to arrive, bounded so a hung one cannot keep
        // the process alive.
        self.notifier.flush(self.cfg.notify.webhook_timeout.min(Duration::from_secs(5))).await;
        tracing::info!(worker = %self.id, "worker stopped");
        Ok(())
    }

    async fn anything_runnable(&self) -> bool {
        match self.blocking(|s| s.queue_status()).await {
            Ok(st) => st.counts.get("queued").copied().unwrap_or(0) > 0,
            Err(_) => true,
        }
    }

    /// Dead workers on this host, every second (a pid that is gone needs no lease to expire:
    /// its server and what that started are killed, then its tasks run again); heartbeats and
    /// the lease sweeper every few seconds.
    async fn housekeeping(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        for n in 0u64.. {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            if self.dead_local_peers().await {
                self.recover_dead_local_workers().await;
            }
            if n % 5 != 0 {
                continue;
            }
            let id = self.id.clone();
            if let Err(e) = self.blocking(move |s| s.worker_heartbeat(&id)).await {
                tracing::warn!(error = %e, "worker heartbeat failed");
            }
            self.reap().await;
            self.sweep_parked().await;
            self.drop_spares(false).await;
        }
    }

    /// Requeues (or fails) tasks whose lease expired and kills their orphaned agents on this
    /// host, so that a task never runs in two places at once.
    pub async fn reap(&self) {
        match self.blocking(|s| s.reap_expired()).await {
            Ok(reaped) => {
                for r in reaped {
                    if r.question_timed_out {
                        tracing::warn!(task = %r.id, "question timed out");
                    } else {
                        tracing::warn!(task = %r.id, requeued = r.requeued, "lease expired");
                    }
                    // Ended here, not by a run: the webhook hears it all the same.
                    if !r.requeued
                        && let Ok(t) = self.blocking(move |s| s.get(r.id)).await
                        && let Some(event) = notify::Event::for_task(&t)
                    {
                        self.notifier.send(event);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "reaping expired leases failed"),
        }
        // Agents left on this host, whoever reaped their tasks (a worker on another host of a
        // shared queue cannot reach them).
        let host = self.host.clone();
        match self.blocking(move |s| s.take_orphans(&host)).await {
            Ok(orphans) => {
                for o in orphans {
                    if process::kill_orphan(o.pid, o.started.as_deref()) {
                        tracing::warn!(task = ?o.task, pid = o.pid, "killed the orphaned agent");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "collecting orphaned agents failed"),
        }
    }

    /// Agents parked on a decision whose task stopped waiting (cancelled, timed out) are
    /// aborted, so nothing runs on for a task nobody will resume.
    async fn sweep_parked(&self) {
        let Some(server) = &self.server else { return };
        let ids = server.parked_tasks();
        if ids.is_empty() {
            return;
        }
        let me = self.id.clone();
        let live = self
            .blocking(move |s| {
                let mut live = Vec::new();
                for id in ids {
                    // Queued: answered, and about to be claimed again. Running here: claimed
                    // again by this worker, which is making its worktree ready and has not
                    // taken the parked request yet (dropping it then lost the answer's reply,
                    // seen under CI load).
                    let keep = match s.get(id) {
                        Ok(t) => match t.status {
                            TaskStatus::Waiting | TaskStatus::Queued => true,
                            TaskStatus::Running => t.worker.as_deref() == Some(me.as_str()),
                            _ => false,
                        },
                        Err(_) => false,
                    };
                    if keep {
                        live.push(id);
                    }
                }
                Ok(live)
            })
            .await
            .unwrap_or_default();
        server.sweep_parked(|id| live.contains(&id)).await;
    }

    /// Whether a worker registered on this host as running has no process any more.
    async fn dead_local_peers(&self) -> bool {
        let Ok(workers) = self.blocking(|s| s.list_workers()).await else { return false };
        workers.iter().any(|w| {
            !w.stopped && w.host == self.host && w.id != self.id && !process::pid_alive(w.pid)
        })
    }

    /// A worker process on this host that died (kill -9, crash) leaves running tasks behind;
    /// there is no need to wait for their leases to expire when its pid is gone.
    async fn recover_dead_local_workers(&self) {
        let Ok(workers) = self.blocking(|s| s.list_workers()).await else { return };
        // Their OpenCode servers first: a server outlives a worker killed with SIGKILL.
        let alive: Vec<String> = workers
            .iter()
            .filter(|w| w.host == self.host && !w.stopped && process::pid_alive(w.pid))
            .map(|w| crate::serve::server_file_name(&w.id))
            .collect();
        let me = crate::serve::server_file_name(&self.id);
        crate::serve::kill_orphaned_servers(&self.home, |name| {
            name == me || alive.iter().any(|a| a == name)
        });
        for w in workers {
            if w.stopped || w.host != self.host || w.id == self.id || process::pid_alive(w.pid) {
                continue;
            }
            let wid = w.id.clone();
            if let Ok(ids) = self.blocking(move |s| s.release_worker_tasks(&wid)).await
                && !ids.is_empty()
            {
                tracing::warn!(worker = %w.id, tasks = ?ids, "recovering tasks of a dead worker");
            }
        }
        self.reap().await;
    }

    fn backoff(&self, attempts: i64) -> f64 {
        let exp = self.cfg.retry_base.as_secs_f64() * 2f64.powi(attempts.clamp(0, 20) as i32);
        fastrand::f64() * exp.min(self.cfg.retry_cap.as_secs_f64())
    }

    /// One run of a claimed task, from worktree to recorded outcome.
    async fn execute(self: Arc<Self>, claim: Claim, shutdown: CancellationToken) -> Result<()> {
        let Claim { task, token, resume, new_notes } = claim;
        let id = task.id;
        let mut log = TaskLog::open(&self.home.logs_dir(), id.0);
        log.line(&match &resume {
            Some(_) => format!("resuming after an answer (worker {})", self.id),
            None => {
                format!("attempt {} of {} (worker {})", task.attempts, task.max_attempts, self.id)
            }
        });

        let (stop_tx, stop_rx) = watch::channel(None);
        let heartbeat = tokio::spawn(self.clone().heartbeat(id, token, stop_tx, shutdown));

        // A repository that is not here (another host submitted it) is run from a mirror of
        // its remote; the task then carries the mirror as its repository for this run.
        let mut early = None;
        let (task, mirror) = match self.repository(&task, &mut log).await {
            Ok(Some(dir)) => (Task { repo: dir.display().to_string(), ..task }, Some(dir)),
            Ok(None) => (task, None),
            Err(outcome) => {
                early = Some(outcome);
                (task, None)
            }
        };
        let outcome = match early {
            Some(o) => Ok(Some(o)),
            None => self.run_once(&task, token, resume, new_notes, &mut log, stop_rx).await,
        };
        // Work done from a mirror reaches the remote before the task is called done, while
        // the lease is still kept.
        let outcome = match (&mirror, outcome) {
            (Some(dir), Ok(Some(Outcome::Done { result }))) => {
                Ok(Some(self.push_back(&task, dir, result, &mut log).await))
            }
            (_, o) => o,
        };
        heartbeat.abort();
        let outcome = match outcome {
            Ok(Some(o)) => o,
            Ok(None) => {
                log.line("this worker lost the lease; another worker owns the task now");
                return Ok(());
            }
            Err(e) => {
                log.line(&format!("error: {e}"));
                Outcome::Failed {
                    error: e.to_string(),
                    result: None,
                    backoff_s: self.backoff(task.attempts),
                }
            }
        };
        let summary = describe(&outcome);
        match self.blocking(move |s| s.finish(id, token, outcome)).await {
            Ok(t) => {
                log.line(&format!("{summary}; task is {}", t.status));
                if let Some(event) = notify::Event::for_task(&t) {
                    self.notifier.send(event);
                }
            }
            Err(Error::Queue(queue::Error::StaleLease { .. })) => {
                log.line("the result was rejected: this worker's lease is no longer valid");
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Where this worker runs the task: `None` for the submitter's repository, when it is here
    /// (and `--use-remote` is off); else a mirror of the task's remote under this worker's home,
    /// fetched now. A task that cannot be run here comes back as its outcome.
    async fn repository(
        &self,
        task: &Task,
        log: &mut TaskLog,
    ) -> std::result::Result<Option<PathBuf>, Outcome> {
        // Here: the repository is on this host and has the task's base (another host's clone at
        // the same path may not have it yet; then the remote is the way).
        let opened = git2::Repository::open(&task.repo).ok();
        let here = opened.as_ref().is_some_and(|r| {
            git2::Oid::from_str(&task.base).is_ok_and(|oid| r.find_commit(oid).is_ok())
        });
        if here && !self.cfg.use_remote {
            return Ok(None);
        }
        let Some(remote) = task.remote.clone() else {
            // Without a remote the repository here is the only way (preparing the worktree
            // says so when it lacks the base).
            if opened.is_some() {
                log.line("the task has no remote; running it in the repository on this host");
                return Ok(None);
            }
            return Err(Outcome::FailedPermanently {
                error: format!(
                    "the repository {} is not on this host ({}) and the task has no remote to \
                     fetch it from; submit it with --remote URL, or run a worker on the host \
                     that has the repository",
                    task.repo, self.host
                ),
                result: None,
            });
        };
        let dir = crate::remote::mirror_dir(&self.home.root().join("mirrors"), &remote);
        log.line(&format!(
            "{}: running from the mirror {} of {remote}",
            match (here, &opened) {
                (true, _) => "--use-remote",
                (false, Some(_)) => "the repository here does not have the task's base",
                (false, None) => "the repository is not on this host",
            },
            dir.display()
        ));
        let (d, r, lock) = (dir.clone(), remote.clone(), self.mirrors.clone());
        let synced = tokio::task::spawn_blocking(move || {
            let _one_at_a_time = lock.lock().unwrap_or_else(|e| e.into_inner());
            crate::remote::sync_mirror(&d, &r)
        })
        .await
        .map_err(|e| Error::Join(e.to_string()))
        .and_then(|r| r);
        match synced {
            Ok(()) => Ok(Some(dir)),
            Err(e) => Err(Outcome::Failed {
                error: format!("could not fetch the repository from {remote}: {e}"),
                result: None,
                backoff_s: self.backoff(task.attempts),
            }),
        }
    }

    /// Pushes the branch of a task run from a mirror to its remote. A push that fails is a
    /// failed attempt (retried), never a done task whose work nobody else can reach.
    async fn push_back(
        &self,
        task: &Task,
        mirror: &Path,
        mut result: serde_json::Value,
        log: &mut TaskLog,
    ) -> Outcome {
        let id = task.id;
        let remote = task.remote.clone().unwrap_or_default();
        let branch = match self.blocking(move |s| s.get(id)).await {
            Ok(t) => t.branch.unwrap_or_else(|| git::branch_name(id.0)),
            Err(_) => git::branch_name(id.0),
        };
        let (m, r, b) = (mirror.to_path_buf(), remote.clone(), branch.clone());
        let pushed = tokio::task::spawn_blocking(move || crate::remote::push_branch(&m, &r, &b))
            .await
            .map_err(|e| Error::Join(e.to_string()))
            .and_then(|r| r);
        match pushed {
            Ok(()) => {
                log.line(&format!("pushed {branch} to {remote}"));
                if let Some(obj) = result.as_object_mut() {
                    obj.insert("pushed_to".into(), format!("{remote} {branch}").into());
                }
                Outcome::Done { result }
            }
            Err(e) => {
                log.line(&format!("error: {e}"));
                Outcome::Failed {
                    error: format!(
                        "the work is done but could not be pushed, so it is not done yet: {e}"
                    ),
                    result: Some(result),
                    backoff_s: self.backoff(task.attempts),
                }
            }
        }
    }

    /// Extends the lease while the run lasts and turns cancel requests, a lost lease and
    /// shutdown into a stop signal for the agent.
    async fn heartbeat(
        self: Arc<Self>,
        id: TaskId,
        token: i64,
        stop: watch::Sender<Option<StopReason>>,
        shutdown: CancellationToken,
    ) {
        let lease = self.cfg.lease;
        let mut tick = tokio::time::interval((lease / 3).max(Duration::from_millis(200)));
        // Cancel requests are also checked more often than the lease needs, so a cancel acts in
        // well under a second.
        let mut fast = tokio::time::interval(Duration::from_millis(250));
        loop {
            let renew = tokio::select! {
                _ = tick.tick() => true,
                _ = fast.tick() => false,
                _ = shutdown.cancelled() => {
                    let _ = stop.send(Some(StopReason::Shutdown));
                    return;
                }
            };
            let result = if renew {
                self.blocking(move |s| s.heartbeat(id, token, lease))
                    .await
                    .map(|r| r.cancel_requested)
            } else {
                self.blocking(move |s| s.get(id)).await.map(|t| t.cancel_requested)
            };
            match result {
                Ok(true) => {
                    let _ = stop.send(Some(StopReason::Cancel));
                    return;
                }
                Ok(false) => {}
                Err(Error::Queue(queue::Error::StaleLease { .. }))
                | Err(Error::Queue(queue::Error::NotFound(_))) => {
                    let _ = stop.send(Some(StopReason::LostLease));
                    return;
                }
                Err(e) => tracing::warn!(task = %id, error = %e, "heartbeat failed"),
            }
        }
    }

    /// Returns `None` when the lease was lost (nothing may be written).
    async fn run_once(
        &self,
        task: &Task,
        token: i64,
        mut resume: Option<queue::Resume>,
        new_notes: Vec<String>,
        log: &mut TaskLog,
        stop: watch::Receiver<Option<StopReason>>,
    ) -> Result<Option<Outcome>> {
        let id = task.id;
        // An earlier attempt's worktree is reused when it is this worker's home's: one made by
        // a worker with another home (another host of a shared queue) belongs to that home's
        // repository or mirror, and its path may not even exist here; the task then starts
        // afresh here, as on its first run.
        let own = self.home.worktrees_dir();
        let earlier = task.worktree.as_ref().map(PathBuf::from).filter(|w| w.starts_with(&own));
        // A task with dependencies starts from their work, put together before any agent runs.
        let first_run = earlier.is_none() && (task.branch.is_none() || task.worktree.is_some());
        let (start, deps) = match self.stack(task, first_run).await? {
            Ok(s) => s,
            Err(error) => {
                log.line(&error);
                return Ok(Some(Outcome::FailedPermanently { error, result: None }));
            }
        };
        // An OpenCode follow-up's first run goes in the directory its parent ran in when that is
        // free: the parent's session lives there (see `followup_session` below). Claude Code and
        // Codex take a session to any directory.
        let opencode = crate::agent::AgentSpec::of(task).kind == AgentKind::OpenCode;
        let parent_dir = match (task.parent, &earlier) {
            (Some(parent), None) if first_run && opencode => self
                .blocking(move |s| s.get(parent))
                .await
                .ok()
                .and_then(|p| p.worktree.map(PathBuf::from))
                .filter(|p| p.starts_with(&own)),
            _ => None,
        };
        let at_parents =
            parent_dir.clone().filter(|p| self.take_spare_at(&task.repo, p) || !p.exists());
        let spare = match (&earlier, &at_parents) {
            (None, None) => self.take_spare(&task.repo),
            (None, Some(p)) if p.exists() => Some(p.clone()),
            _ => None,
        };
        let dir = earlier
            .clone()
            .or_else(|| spare.clone())
            .or_else(|| at_parents.clone())
            .unwrap_or_else(|| self.queue_worktrees().join(format!("task-{}", id.0)));
        let (repo, base, d) = (PathBuf::from(&task.repo), start.clone(), dir.clone());
        let known = task.branch.clone();
        let pause = self.cfg.fault_worktree_pause;
        log.line(&match &spare {
            Some(s) => format!("preparing the worktree (reusing {}, cleaned)", s.display()),
            None => "preparing the worktree".to_owned(),
        });
        let reuse = spare.is_some();
        let prepared = tokio::task::spawn_blocking(move || {
            if reuse {
                git::reuse_worktree(&repo, &d, &base, id.0)
            } else {
                git::prepare_worktree(&repo, &base, id.0, known.as_deref(), &d, pause)
            }
        })
        .await
        .map_err(|e| Error::Join(e.to_string()))?;
        if let (Err(e), Some(s)) = (&prepared, &spare) {
            // A spare that cannot be reused is thrown away; the next attempt makes a new one.
            log.line(&format!("the spare worktree {} could not be reused: {e}", s.display()));
            let (repo, s) = (PathBuf::from(&task.repo), s.clone());
            let _ = tokio::task::spawn_blocking(move || git::remove_worktree(&repo, &s)).await;
        }
        let prepared = match prepared {
            Ok(p) => p,
            // Another process may have taken the parent's directory since it was seen free:
            // the next attempt goes elsewhere.
            Err(e) if e.permanent && !(at_parents.is_some() && spare.is_none()) => {
                let error = format!("could not prepare the worktree: {e}");
                return Ok(Some(Outcome::FailedPermanently { error, result: None }));
            }
            Err(e) => {
                // A lock, a crash's leftovers we could not clear yet, a file system hiccup:
                // another attempt, after the backoff, may well succeed.
                return Ok(Some(Outcome::Failed {
                    error: format!(
                        "could not prepare the worktree (another attempt may fix this): {e}"
                    ),
                    result: None,
                    backoff_s: self.backoff(task.attempts),
                }));
            }
        };
        for r in &prepared.repairs {
            log.line(&format!("repaired: {r}"));
            tracing::warn!(task = %id, "{r}");
        }
        // The directory the worktree is in: another task's worktree at the one asked for is
        // stepped around (see `git::prepare_worktree`).
        let dir = prepared.dir.clone();
        let branch = prepared.branch.clone();
        log.line(&format!("worktree {} on branch {branch}", dir.display()));
        let facts = RunFacts {
            branch: Some(branch.clone()),
            worktree: Some(dir.display().to_string()),
            started_from: Some(start.clone()),
            stacked_on: first_run
                .then(|| deps.iter().filter(|d| d.commit.is_some()).map(|d| d.id).collect()),
            ..Default::default()
        };
        if let Err(e) = self.blocking(move |s| s.record_run(id, token, facts)).await {
            return lost_or(e);
        }
        if prepared.created
            && let Some(error) = self.setup(task, &start, &dir, log).await
        {
            return Ok(Some(Outcome::Failed {
                error,
                result: None,
                backoff_s: self.backoff(task.attempts),
            }));
        }

        let spec = crate::agent::AgentSpec::of(task);
        let native_opencode = spec.kind == AgentKind::OpenCode;
        let model = match &task.model {
            Some(m) => Some(m.clone()),
            // The default model is OpenCode's `provider/model`; the other agents use their own
            // default unless the task names one.
            None if !native_opencode => None,
            None => self
                .blocking(|s| s.setting("default_model"))
                .await
                .ok()
                .flatten()
                .or_else(|| self.cfg.default_model.clone()),
        };
        // `--print-logs --log-level ERROR` adds OpenCode's error lines to stderr, which name the
        // provider and model it used: its own default when TaskBridge names none.
        let mut args: Vec<String> = vec![
            "run".into(),
            "--format".into(),
            "json".into(),
            "--print-logs".into(),
            "--log-level".into(),
            "ERROR".into(),
        ];
        // --auto answers "ask" rules (which headless OpenCode would auto-reject, ending the run);
        // our explicit denies below still hold.
        args.push("--auto".into());
        // The session's name only: a task's title is the user's text, and every user of the
        // machine can read a command line.
        args.extend(["--title".into(), format!("taskbridge #{}", id.0)]);
        if let Some(m) = &model {
            args.extend(["-m".into(), m.clone()]);
        }
        if let Some(a) = &spec.opencode_agent {
            args.extend(["--agent".into(), a.clone()]);
        }
        let notes = notes_section(&new_notes);
        // Whether OpenCode's warm server runs this task (the other agents run a process a turn).
        let serving = self.server.is_some() && native_opencode;
        // A task that ran before in this session and was interrupted (its worker or server died,
        // an attempt failed) goes on in the same session on the warm server: the agent keeps its
        // context and the worktree keeps its work.
        // A follow-up's first run goes on in its parent's session, with the new request.
        let followup = resume.is_none() && first_run && task.parent.is_some();
        // OpenCode runs a session's tools in the directory the session was made in, whatever
        // directory it is prompted from: the parent's session is continued only from the
        // directory the parent ran in (`followup_dir`); from anywhere else the follow-up starts a
        // new session (on the warm server, given the parent's conversation as text).
        let in_parents_dir = parent_dir.as_deref() == Some(dir.as_path());
        let followup_session = task
            .session_id
            .clone()
            .filter(|_| followup && (serving || in_parents_dir || !native_opencode));
        if let Some(s) = &followup_session
            && !serving
        {
            args.extend(["--session".into(), s.clone()]);
        }
        let interrupted = resume.is_none()
            && (serving || !native_opencode)
            && task.session_id.is_some()
            && !followup;
        // The task's own prompt, standing without any earlier conversation.
        let fresh = format!(
            "{PREAMBLE}\n{}# Task {}: {}\n\n{}{}",
            builds_on(&deps),
            id.0,
            task.title,
            task.prompt,
            notes
        );
        // What a session that is on no server here is replaced with: a follow-up's request as
        // one that stands alone, an interrupted run's whole task (its worktree keeps the work).
        let without_session = if followup {
            Some(format!(
                "{PREAMBLE}\n# Task {}: {}\n\nThis follows up earlier work: the worktree holds \
                 it, and this task's branch starts where it ended.\n\n{}{}",
                id.0, task.title, task.prompt, notes
            ))
        } else {
            interrupted.then(|| fresh.clone())
        };
        let mut prompt = match &resume {
            Some(r) => {
                args.extend(["--session".into(), r.session_id.clone()]);
                match &r.ask {
                    Some(ask) => {
                        format!("{}{notes}", crate::decisions::answer_prompt(ask, &r.answer))
                    }
                    None => format!("{RESUME}{}{notes}", r.answer),
                }
            }
            None if interrupted => format!("{}{notes}", crate::serve::INTERRUPTED),
            None if followup && followup_session.is_none() => {
                without_session.clone().unwrap_or_default()
            }
            None if followup => format!(
                "The planner has a follow-up on the work above. It is task {} (\"{}\"), on a new \
                 branch that starts from where that work ended; the worktree holds it.\n\n{}\n\n\
                 End as before with a taskbridge-result block.{notes}",
                id.0, task.title, task.prompt
            ),
            None => fresh,
        };
        // A bare `reject` stops the agent, as OpenCode does: the task ends there.
        let mut rejected = resume.as_ref().and_then(|r| {
            let ask = r.ask.as_ref()?;
            match ask.parse_answer(&r.answer) {
                Ok(queue::Answer::PermissionReject { feedback: None }) => Some(ask.subject()),
                _ => None,
            }
        });
        let mut env = vec![("OPENCODE_PERMISSION".to_owned(), permission_json(task))];
        if let Some(bridge) = &self.cfg.claude_bridge {
            env.push((
                "OPENCODE_CONFIG_CONTENT".to_owned(),
                with_bridge(self.cfg.opencode_config_content.as_deref(), bridge),
            ));
        }
        let deadline =
            tokio::time::Instant::now() + Duration::from_secs(task.timeout_s.max(1) as u64);

        // A failed check sends its output back to the agent in the same session: another turn
        // of this same run, up to the repository's `[verify] rounds`.
        let verify =
            RepoConfig::at(Path::new(&task.repo), &start).map(|c| c.verify).unwrap_or_default();
        let mut verification: Vec<result::Check> = Vec::new();
        let mut verify_round = 0u32;
        let mut follow_session: Option<String> = None;
        let mut carried = Usage::default();
        let mut res = 'agent: loop {
            let mut tries = 0;
            let exit = loop {
                if !native_opencode {
                    let session = resume
                        .as_ref()
                        .map(|r| r.session_id.clone())
                        .or_else(|| follow_session.clone())
                        .or_else(|| followup_session.clone())
                        .or_else(|| task.session_id.clone().filter(|_| interrupted));
                    if let Some(what) = &rejected {
                        let error = format!("stopped: the answer rejected {what}");
                        return Ok(Some(Outcome::FailedPermanently { error, result: None }));
                    }
                    let mut grants = crate::decisions::always_grants(task);
                    if let Some(r) = &resume
                        && let Some(ask) = &r.ask
                        && let (Some(p), Ok(a)) = (&ask.permission, ask.parse_answer(&r.answer))
                        && matches!(
                            a,
                            queue::Answer::PermissionOnce | queue::Answer::PermissionAlways
                        )
                    {
                        // The agent asks again for what was approved; this time it is let through.
                        grants.once.push((p.permission.clone(), p.patterns.clone()));
                    }
                    let run = CliTurn {
                        kind: spec.kind,
                        task,
                        token,
                        dir: &dir,
                        prompt: &prompt,
                        model: model.as_deref(),
                        session: session.as_deref(),
                        grants,
                        deadline,
                        spent: {
                            let mut u = previous_usage(task);
                            u.add(&carried);
                            u
                        },
                    };
                    match self.run_cli(run, log, stop.clone()).await {
                        Ok(exit) => break exit,
                        Err(outcome) => return Ok(Some(outcome)),
                    }
                }
                if let Some(server) = &self.server {
                    let mut grants = crate::decisions::always_grants(task);
                    let delivery = match &resume {
                        Some(r) => match &r.ask {
                            Some(ask)
                                if ask.request_id.as_deref().is_some()
                                    && server
                                        .take_parked(id, ask.request_id.as_deref().unwrap_or(""))
                                        .await =>
                            {
                                // A tool call's reply carries notes only for a question; a
                                // permission's would lose them, so they wait for the next prompt.
                                if ask.kind != queue::AskKind::Question && !new_notes.is_empty() {
                                    let notes = new_notes.clone();
                                    let undone = self
                                        .blocking(move |s| s.undeliver_notes(id, token, &notes))
                                        .await;
                                    if let Err(e) = undone {
                                        tracing::warn!(task = %id, error = %e, "keeping notes for later failed");
                                    }
                                }
                                crate::decisions::native_reply(ask, &r.answer, &new_notes)
                            }
                            Some(ask) => {
                                // The blocked request is gone: an approval must still hold when
                                // the agent asks again for the same thing.
                                if let (Some(p), Ok(a)) =
                                    (&ask.permission, ask.parse_answer(&r.answer))
                                    && matches!(
                                        a,
                                        queue::Answer::PermissionOnce
                                            | queue::Answer::PermissionAlways
                                    )
                                {
                                    grants.once.push((p.permission.clone(), p.patterns.clone()));
                                }
                                crate::serve::Delivery::Prompt(prompt.clone())
                            }
                            None => crate::serve::Delivery::Prompt(prompt.clone()),
                        },
                        None => crate::serve::Delivery::Prompt(prompt.clone()),
                    };
                    if let (Some(what), crate::serve::Delivery::Prompt(_)) = (&rejected, &delivery)
                    {
                        let error = format!("stopped: the answer rejected {what}");
                        return Ok(Some(Outcome::FailedPermanently { error, result: None }));
                    }
                    let turn = crate::serve::Turn {
                        task,
                        dir: &dir,
                        delivery,
                        model: model.clone(),
                        session: resume
                            .as_ref()
                            .map(|r| r.session_id.clone())
                            .or_else(|| follow_session.clone())
                            .or_else(|| followup_session.clone())
                            .or_else(|| task.session_id.clone().filter(|_| interrupted)),
                        without_session: without_session.clone(),
                        grants,
                    };
                    // The spend so far, on the task while it runs (earlier runs' usage included),
                    // checked against the task's budgets after every step.
                    let (store, prev) = (self.store.clone(), previous_usage(task));
                    // The session the run is in (a fork of the one asked for, it may be).
                    let mut session = turn.session.clone();
                    // Only a task given a budget (its own or its batch's) can get one later.
                    let budgeted = task.budget.is_set() || task.budget_group.is_some();
                    let earlier_budget =
                        task.questions.iter().filter_map(|q| q.ask.as_ref()?.budget.clone()).next();
                    let mut on_step = move |p: crate::serve::Progress<'_>| {
                        let u = match p {
                            crate::serve::Progress::Session(s) => {
                                session = Some(s.to_owned());
                                let facts = RunFacts {
                                    session_id: Some(s.to_owned()),
                                    ..Default::default()
                                };
                                if let Err(e) = store.record_run(id, token, facts) {
                                    tracing::debug!(task = %id, error = %e, "recording the session failed");
                                }
                                return crate::serve::Control::Go;
                            }
                            crate::serve::Progress::Approved(ask) => {
                                let (store, ask) = (store.clone(), ask.clone());
                                tokio::task::spawn_blocking(move || {
                                    let r = store.record_decision(id, token, &ask, "once", "rule");
                                    if let Err(e) = r {
                                        tracing::debug!(task = %id, error = %e, "recording a decision failed");
                                    }
                                });
                                return crate::serve::Control::Go;
                            }
                            crate::serve::Progress::Tick => {
                                return match store.take_notes(id, token) {
                                    Ok(notes) if !notes.is_empty() => {
                                        crate::serve::Control::Say(format!(
                                            "A note from the planner while you work; take it \
                                             into account from your next step on.{}",
                                            notes_section(&notes)
                                        ))
                                    }
                                    Ok(_) => crate::serve::Control::Go,
                                    Err(e) => {
                                        tracing::debug!(task = %id, error = %e, "reading new notes failed");
                                        crate::serve::Control::Go
                                    }
                                };
                            }
                            crate::serve::Progress::Step(u) => u,
                        };
                        let mut usage = prev.clone();
                        usage.add(u);
                        let (cost, tokens) =
                            (usage.cost_usd, (usage.input_tokens + usage.output_tokens) as i64);
                        let partial =
                            TaskResult { usage, session_id: session.clone(), ..Default::default() };
                        let facts =
                            RunFacts { result: Some(to_json(&partial)), ..Default::default() };
                        // Read and written in place: both are single-row statements, and the budget
                        // must be checked before the agent takes another step.
                        if let Err(e) = store.record_run(id, token, facts) {
                            tracing::debug!(task = %id, error = %e, "recording the spend failed");
                        }
                        if !budgeted {
                            return crate::serve::Control::Go;
                        }
                        match store.budget_of(id).map(|b| b.passed(cost, tokens)) {
                            Ok(Some(mut stop)) => {
                                if let Some(first) = &earlier_budget
                                    && first.limit == stop.limit
                                    && first.scope == stop.scope
                                {
                                    stop.original = first.original;
                                }
                                crate::serve::Control::Stop(Box::new(queue::Ask::budget(stop)))
                            }
                            Ok(None) => crate::serve::Control::Go,
                            Err(e) => {
                                tracing::warn!(task = %id, error = %e, "reading the budget failed");
                                crate::serve::Control::Go
                            }
                        }
                    };
                    match server.run(turn, log, stop.clone(), deadline, &mut on_step).await {
                        Ok(exit) => break exit,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                            let error = format!(
                                "could not start '{}': not found. Install OpenCode with `npm install \
                             -g opencode-ai` or set TASKBRIDGE_OPENCODE to its path",
                                self.cfg.opencode.display()
                            );
                            return Ok(Some(Outcome::FailedPermanently { error, result: None }));
                        }
                        Err(e) => {
                            return Ok(Some(Outcome::Failed {
                                error: format!("the OpenCode server failed: {e}"),
                                result: None,
                                backoff_s: self.backoff(task.attempts),
                            }));
                        }
                    }
                }
                tries += 1;
                let cmd = AgentCommand {
                    program: self.cfg.opencode.clone(),
                    args: args.clone(),
                    env: env.clone(),
                    cwd: dir.clone(),
                    stdin: prompt.clone(),
                };
                log.line(&format!("$ {} {}", self.cfg.opencode.display(), shell_words(&args)));
                let store = self.store.clone();
                let on_spawn = move |pid: i64, started: Option<String>| {
                    let facts = RunFacts {
                        agent_pid: Some(pid),
                        agent_started: started,
                        ..Default::default()
                    };
                    if let Err(e) = store.record_run(id, token, facts) {
                        tracing::warn!(task = %id, error = %e, "recording the agent pid failed");
                    }
                };
                let mut never = |_: &queue::Ask, _: &serde_json::Value| process::Decision::Wait;
                let mut spent = previous_usage(task);
                spent.add(&carried);
                let mut on_step = self.spend_recorder(id, token, spent);
                let exit = match process::run_agent(
                    cmd,
                    &mut process::OpenCodeRun,
                    &mut never,
                    log,
                    stop.clone(),
                    deadline,
                    on_spawn,
                    &mut on_step,
                )
                .await
                {
                    Ok(exit) => exit,
                    Err(e) => {
                        let error = if e.kind() == std::io::ErrorKind::NotFound {
                            format!(
                                "could not start '{}': not found. Install OpenCode with `npm install -g \
                             opencode-ai` or set TASKBRIDGE_OPENCODE to its path",
                                self.cfg.opencode.display()
                            )
                        } else {
                            format!("could not start '{}': {e}", self.cfg.opencode.display())
                        };
                        return Ok(Some(Outcome::FailedPermanently { error, result: None }));
                    }
                };
                // Several first runs under a fresh OpenCode home race on its database migration (one
                // of them exits with "Failed query" before any event); such a run did no work and is
                // simply run again.
                let migration_race = exit.stopped.is_none()
                    && exit.exit_code != Some(0)
                    && exit.run.events == 0
                    && exit.stderr_tail.contains("Failed query");
                if migration_race && tries < 4 {
                    log.line("OpenCode failed while setting up its database; running it again");
                    tokio::time::sleep(Duration::from_millis(300 * tries)).await;
                    continue;
                }
                break exit;
            };

            let prev_usage = previous_usage(task);
            let final_text = exit.run.final_text();
            let reported = result::reported(&final_text);
            let mut res = TaskResult {
                summary: result::summary(&final_text, &reported),
                tests_run: result::tests_run(&exit.run, &reported),
                open_questions: reported.open_questions.clone(),
                usage: {
                    let mut u: Usage = prev_usage;
                    u.add(&carried);
                    u.add(&exit.run.usage);
                    u
                },
                branch: Some(branch.clone()),
                permissions: result::permissions_for(
                    spec.kind,
                    task.readonly,
                    task.no_shell,
                    task.no_network,
                ),
                session_id: exit.run.session_id.clone().or_else(|| task.session_id.clone()),
                exit_code: exit.exit_code,
                tool_calls: exit.run.tool_calls.len(),
                started_from: Some(start.clone()),
                stacked_on: task
                    .stacked_on
                    .iter()
                    .map(|t| t.0)
                    .chain(deps.iter().filter(|d| d.commit.is_some()).map(|d| d.id.0))
                    .collect(),
                ..Default::default()
            };
            if let Some(session) = &exit.run.session_id {
                let facts = RunFacts { session_id: Some(session.clone()), ..Default::default() };
                let _ = self.blocking(move |s| s.record_run(id, token, facts)).await;
            }
            res.permission_requests = self.permission_requests(id).await;
            res.permissions.extend(crate::decisions::ask_permissions(task, spec.kind, serving));
            res.agent =
                Some(crate::decisions::agent_report(task, &spec, serving, self.server.is_some()));

            let failure = match exit.stopped {
                Some(StopReason::LostLease) => return Ok(None),
                Some(StopReason::Shutdown) => return Ok(Some(Outcome::Released)),
                Some(StopReason::Cancel) => {
                    self.fill_diff(task, &dir, &mut res, false).await;
                    return Ok(Some(Outcome::Cancelled { result: Some(to_json(&res)) }));
                }
                Some(StopReason::Timeout) => Some(Diagnosis {
                    message: format!("timed out after {} s", task.timeout_s),
                    retryable: true,
                }),
                // Stopped to wait for a decision: not a failure.
                None if exit.waiting.is_some() && exit.run.error_detail.is_none() => None,
                None => match (&exit.run.error_detail, exit.exit_code, spec.kind) {
                    (Some(e), _, AgentKind::ClaudeCode) => {
                        Some(crate::claude::diagnose(e, model.as_deref()))
                    }
                    (Some(e), _, AgentKind::Codex) => {
                        Some(crate::codex::diagnose(e, model.as_deref()))
                    }
                    (Some(e), _, AgentKind::OpenCode) => {
                        let used = ModelUsed {
                            requested: model.clone(),
                            seen: exit.run.model_seen.clone(),
                        };
                        Some(self.diagnose_agent_error(e, &used).await)
                    }
                    (None, Some(0), _) => None,
                    (None, code, AgentKind::OpenCode) => {
                        Some(diagnose::exit_failure(code, &exit.stderr_tail))
                    }
                    (None, code, kind) => {
                        Some(diagnose::cli_exit_failure(kind.name(), code, &exit.stderr_tail))
                    }
                },
            };
            let failure = failure.or_else(|| {
                rejected.map(|what| Diagnosis {
                    message: format!("stopped: the answer rejected {what}"),
                    retryable: false,
                })
            });
            if let Some(d) = failure {
                self.fill_diff(task, &dir, &mut res, false).await;
                if !d.retryable {
                    return Ok(Some(Outcome::FailedPermanently {
                        error: d.message,
                        result: Some(to_json(&res)),
                    }));
                }
                return Ok(Some(Outcome::Failed {
                    error: d.message,
                    result: Some(to_json(&res)),
                    backoff_s: self.backoff(task.attempts),
                }));
            }
            if let Some(question) = result::question(&final_text) {
                let Some(session_id) = res.session_id.clone() else {
                    let error = format!(
                        "the agent asked a question but {} reported no session to resume",
                        spec.kind.name()
                    );
                    return Ok(Some(Outcome::Failed {
                        error,
                        result: Some(to_json(&res)),
                        backoff_s: 0.0,
                    }));
                };
                return Ok(Some(Outcome::Waiting {
                    question,
                    session_id,
                    result: Some(to_json(&res)),
                    ask: None,
                }));
            }
            if let Some(ask) = exit.waiting {
                let session_id = res.session_id.clone().unwrap_or_default();
                return Ok(Some(Outcome::Waiting {
                    question: ask.text(),
                    session_id,
                    result: Some(to_json(&res)),
                    ask: Some(Box::new(ask)),
                }));
            }
            if !verify.commands.is_empty() {
                verify_round += 1;
                let (checks, failed) =
                    crate::verify::run_checks(&dir, &verify, verify_round, log).await;
                verification.extend(checks);
                res.verification = verification.clone();
                match failed {
                    None => res.verified = Some(true),
                    Some(f) if verify_round <= verify.rounds => {
                        log.line(&format!(
                            "verification failed: sending `{}`'s output back to the agent (fix \
                             round {verify_round} of {})",
                            f.command, verify.rounds
                        ));
                        prompt = format!(
                            "verification failed: `{}` exited {} in your worktree. Its output \
                         ends:\n\n{}\n\nFix it, then end as before with a taskbridge-result \
                         block.",
                            f.command,
                            f.exit_code
                                .map_or("without a status (timed out)".into(), |c| c.to_string()),
                            f.output_tail
                        );
                        follow_session = res.session_id.clone();
                        if !serving
                            && native_opencode
                            && let Some(s) = &follow_session
                            && !args.iter().any(|a| a == "--session")
                        {
                            args.extend(["--session".into(), s.clone()]);
                        }
                        resume = None;
                        rejected = None;
                        carried.add(&exit.run.usage);
                        continue 'agent;
                    }
                    Some(f) => {
                        res.verified = Some(false);
                        self.fill_diff(task, &dir, &mut res, false).await;
                        let fixes = match verify.rounds {
                            0 => String::new(),
                            1 => " and its one round of fixes".to_owned(),
                            n => format!(" and its {n} rounds of fixes"),
                        };
                        let output = match f.output_tail.trim() {
                            "" => "it printed nothing".to_owned(),
                            tail => format!("its output ends:\n{tail}"),
                        };
                        let error = format!(
                            "verification failed after the agent's work{fixes}: `{}` exited {}; \
                             {output}",
                            f.command,
                            f.exit_code
                                .map_or("without a status (timed out)".into(), |c| c.to_string()),
                        );
                        return Ok(Some(Outcome::FailedPermanently {
                            error,
                            result: Some(to_json(&res)),
                        }));
                    }
                }
            }
            break 'agent res;
        };
        // A worktree removed under the agent (by hand, a clean-up script) took the work with it:
        // committing "nothing" would report lost work as done.
        if !git::is_worktree(&dir) {
            let error = format!(
                "the worktree {} disappeared while the agent ran (removed from outside TaskBridge); \
                 the work in it is lost, so another attempt starts again from the task's start",
                dir.display()
            );
            log.line(&error);
            return Ok(Some(Outcome::Failed {
                error,
                result: Some(to_json(&res)),
                backoff_s: self.backoff(task.attempts),
            }));
        }
        if task.readonly {
            let d = dir.clone();
            res.reverted_files = tokio::task::spawn_blocking(move || git::revert_all(&d))
                .await
                .map_err(|e| Error::Join(e.to_string()))??;
            if !res.reverted_files.is_empty() {
                log.line(&format!("read-only task: reverted {}", res.reverted_files.join(", ")));
            }
        }
        self.fill_diff(task, &dir, &mut res, true).await;
        if !task.readonly && res.files_touched.is_empty() && res.commit.is_none() {
            // Done, since the agent says so; the summary the planner reads says this first.
            res.no_changes = true;
        }
        if !task.worktree_keep {
            let (repo, d) = (PathBuf::from(&task.repo), dir.clone());
            if self.server.is_some() && self.keep_spare(&task.repo, &dir).await {
                log.line("work committed (the branch keeps it); the directory stays for this worker's next task of this repository, cleaned first");
            } else {
                match tokio::task::spawn_blocking(move || git::remove_worktree(&repo, &d)).await {
                    Ok(Ok(())) => {
                        log.line("work committed; worktree removed (the branch keeps it)")
                    }
                    Ok(Err(e)) => log.line(&format!("could not remove the worktree: {e}")),
                    Err(e) => log.line(&format!("could not remove the worktree: {e}")),
                }
            }
        }
        Ok(Some(Outcome::Done { result: to_json(&res) }))
    }

    /// The agents whose CLIs this worker has (OpenCode is always listed: a task on it fails
    /// saying what to install, as before there were several agents).
    pub fn agents(&self) -> Vec<&'static str> {
        crate::agent::ALL
            .iter()
            .filter(|k| {
                **k == AgentKind::OpenCode
                    || crate::agent::find_program(self.program(**k)).is_some()
            })
            .map(|k| k.name())
            .collect()
    }

    /// The CLI an agent runs as, as this worker is configured.
    pub fn program(&self, kind: AgentKind) -> &Path {
        match kind {
            AgentKind::OpenCode => &self.cfg.opencode,
            AgentKind::ClaudeCode => &self.cfg.claude,
            AgentKind::Codex => &self.cfg.codex,
        }
    }

    /// One turn of Claude Code or Codex: a process in the worktree, its tool calls decided
    /// against the task's rules as they come. `Err` is the outcome when it could not start.
    async fn run_cli(
        &self,
        turn: CliTurn<'_>,
        log: &mut TaskLog,
        stop: watch::Receiver<Option<StopReason>>,
    ) -> std::result::Result<process::AgentExit, Outcome> {
        let CliTurn { kind, task, token, dir, prompt, model, session, mut grants, deadline, spent } =
            turn;
        let program = self.program(kind).to_path_buf();
        if let Some(missing) = kind.missing(&program) {
            return Err(Outcome::FailedPermanently { error: missing, result: None });
        }
        let (args, stdin, mut dialect): (_, _, Box<dyn process::Dialect>) = match kind {
            AgentKind::ClaudeCode => {
                if let Some(s) = session {
                    crate::claude::carry_session(s, dir);
                }
                (
                    crate::claude::args(task, model, session),
                    crate::claude::prompt_line(prompt),
                    Box::new(crate::claude::ClaudeStream::default()),
                )
            }
            _ => (
                crate::codex::args(task, model, session),
                prompt.to_owned(),
                Box::new(crate::codex::CodexStream),
            ),
        };
        log.line(&format!("$ {} {}", program.display(), shell_words(&args)));
        let cmd = AgentCommand { program, args, env: vec![], cwd: dir.to_path_buf(), stdin };
        let id = task.id;
        let store = self.store.clone();
        let on_spawn = move |pid: i64, started: Option<String>| {
            let facts =
                RunFacts { agent_pid: Some(pid), agent_started: started, ..Default::default() };
            if let Err(e) = store.record_run(id, token, facts) {
                tracing::warn!(task = %id, error = %e, "recording the agent pid failed");
            }
        };
        let mut decide = |ask: &queue::Ask, input: &serde_json::Value| match &ask.permission {
            Some(p) if ask.kind == queue::AskKind::Permission => {
                let tool = crate::agent::ToolUse {
                    permission: p.permission.clone(),
                    pattern: p.patterns.first().cloned().unwrap_or_default(),
                };
                crate::agent::decide(task, dir, &mut grants, &tool, input)
            }
            // The agent's own question: the planner or a person answers it.
            _ => process::Decision::Wait,
        };
        let mut on_step = self.spend_recorder(id, token, spent);
        let exit = process::run_agent(
            cmd,
            dialect.as_mut(),
            &mut decide,
            log,
            stop,
            deadline,
            on_spawn,
            &mut on_step,
        )
        .await;
        exit.map_err(|e| {
            let error = format!("could not start '{}': {e}", self.program(kind).display());
            Outcome::FailedPermanently { error, result: None }
        })
    }

    /// The commit a task starts from, and what its dependencies did (for its prompt): on its
    /// first run, its dependencies' commits put together (`Err` names the tasks and paths that
    /// conflict); later, what the first run recorded.
    async fn stack(
        &self,
        task: &Task,
        first_run: bool,
    ) -> Result<std::result::Result<(String, Vec<DepInfo>), String>> {
        if !first_run || task.depends_on.is_empty() {
            let start = task.started_from.clone().unwrap_or_else(|| task.base.clone());
            return Ok(Ok((start, vec![])));
        }
        let ids = task.depends_on.clone();
        let deps = self
            .blocking(move |s| ids.iter().map(|id| s.get(*id)).collect::<queue::Result<Vec<_>>>())
            .await?;
        let infos: Vec<DepInfo> = deps
            .iter()
            .map(|d| {
                let r = TaskResult::of(d).unwrap_or_default();
                DepInfo {
                    id: d.id,
                    title: d.title.clone(),
                    summary: r.summary.clone(),
                    branch: d.branch.clone(),
                    files: r.files_touched.iter().map(|f| f.path.clone()).collect(),
                    commit: r.commit.clone(),
                }
            })
            .collect();
        // A dependency that changed nothing adds nothing.
        let with_work: Vec<&DepInfo> = infos.iter().filter(|d| d.commit.is_some()).collect();
        if with_work.is_empty() {
            return Ok(Ok((task.base.clone(), infos)));
        }
        let commits: Vec<String> = with_work.iter().filter_map(|d| d.commit.clone()).collect();
        let names: Vec<String> = with_work.iter().map(|d| format!("#{}", d.id.0)).collect();
        let message = format!(
            "taskbridge: task {} starts from the work of tasks {}",
            task.id.0,
            names.join(", ")
        );
        let repo = PathBuf::from(&task.repo);
        let stacked =
            tokio::task::spawn_blocking(move || git::stack_start(&repo, &commits, &message))
                .await
                .map_err(|e| Error::Join(e.to_string()))??;
        match stacked {
            Ok(start) => Ok(Ok((start.unwrap_or_else(|| task.base.clone()), infos))),
            Err(c) => {
                let name = |i: usize| {
                    let d = with_work[i];
                    format!("#{} ({})", d.id.0, d.title)
                };
                let merged: Vec<String> = c.merged.iter().map(|&i| name(i)).collect();
                Ok(Err(format!(
                    "the tasks this one depends on conflict: {} and {} change {} differently; \
                     no agent ran. Resolve it on one of them (a follow-up task, or a commit on \
                     its branch), then retry this task",
                    merged.join(", "),
                    name(c.with),
                    c.paths.join(", ")
                )))
            }
        }
    }

    /// Records the spend so far on the task after each step of a CLI agent (`spent` before this
    /// run, plus the run's own), so a run cut short by Ctrl-C or kill -9 loses none of what the
    /// agent reported.
    fn spend_recorder(
        &self,
        id: TaskId,
        token: i64,
        spent: Usage,
    ) -> impl FnMut(&crate::events::RunLog) + Send + 'static {
        let store = self.store.clone();
        move |run| {
            let mut usage = spent.clone();
            usage.add(&run.usage);
            let partial =
                TaskResult { usage, session_id: run.session_id.clone(), ..Default::default() };
            let facts = RunFacts { result: Some(to_json(&partial)), ..Default::default() };
            if let Err(e) = store.record_run(id, token, facts) {
                tracing::debug!(task = %id, error = %e, "recording the spend failed");
            }
        }
    }

    /// A spare worktree of `repo`, if this worker keeps one.
    fn take_spare(&self, repo: &str) -> Option<PathBuf> {
        let dir = {
            let mut spares = self.spares.lock().ok()?;
            let i = spares.iter().position(|s| s.repo == repo)?;
            spares.remove(i).dir
        };
        // At once: were this worker killed now, the next one must not remove a directory a
        // task is using.
        self.save_spares();
        Some(dir)
    }

    /// Where this queue's new worktrees go: the home's `worktrees/` for the home's own queue,
    /// `worktrees/q-<queue key>/` for any other (another SQLite file, a PostgreSQL schema), so
    /// that two queues used from one home, whose task numbers both start at 1, never meet in
    /// one directory.
    fn queue_worktrees(&self) -> PathBuf {
        let location = self.store.location();
        match location {
            queue::Location::Sqlite(p) if git::same_path(p, &self.home.db_path()) => {
                self.home.worktrees_dir()
            }
            _ => self.home.worktrees_dir().join(format!("q-{}", location.key())),
        }
    }

    /// Takes this worker's spare worktree at `dir`, if it keeps one there.
    fn take_spare_at(&self, repo: &str, dir: &Path) -> bool {
        let taken = self.spares.lock().is_ok_and(|mut spares| {
            let at = spares.iter().position(|s| s.repo == repo && s.dir == dir);
            at.map(|i| spares.remove(i)).is_some()
        });
        if taken {
            self.save_spares();
        }
        taken
    }

    /// Keeps a done task's worktree as a spare (at most one per slot and repository); false
    /// when it should be removed instead.
    async fn keep_spare(&self, repo: &str, dir: &Path) -> bool {
        let full = self.spares.lock().map_or(true, |s| {
            s.iter().filter(|s| s.repo == repo).count() >= self.cfg.concurrency.max(1)
        });
        if full {
            return false;
        }
        let d = dir.to_path_buf();
        match tokio::task::spawn_blocking(move || git::park_worktree(&d)).await {
            Ok(Ok(())) => {}
            _ => return false,
        }
        if let Ok(mut s) = self.spares.lock() {
            s.push(Spare {
                repo: repo.to_owned(),
                dir: dir.to_path_buf(),
                since: std::time::Instant::now(),
            });
        }
        self.save_spares();
        true
    }

    /// Removes spares (those idle longer than [`SPARE_TTL`], or all of them).
    async fn drop_spares(&self, all: bool) {
        let gone: Vec<Spare> = match self.spares.lock() {
            Ok(mut s) => {
                let (old, keep): (Vec<Spare>, Vec<Spare>) =
                    s.drain(..).partition(|x| all || x.since.elapsed() > SPARE_TTL);
                *s = keep;
                old
            }
            Err(_) => return,
        };
        if gone.is_empty() {
            return;
        }
        for sp in gone {
            let (repo, d) = (PathBuf::from(&sp.repo), sp.dir.clone());
            if let Ok(Err(e)) =
                tokio::task::spawn_blocking(move || git::remove_worktree(&repo, &d)).await
            {
                tracing::warn!(dir = %sp.dir.display(), error = %e, "removing a spare worktree failed");
            }
        }
        self.save_spares();
    }

    /// The spares, next to the server's pid file, so that the next worker on this host removes
    /// them if this one is killed.
    fn save_spares(&self) {
        let list: Vec<serde_json::Value> = self
            .spares
            .lock()
            .map(|s| {
                s.iter()
                    .map(
                        |x| serde_json::json!({"repo": x.repo, "dir": x.dir.display().to_string()}),
                    )
                    .collect()
            })
            .unwrap_or_default();
        let path = crate::serve::spares_file(&self.home, &self.id);
        let _ = std::fs::write(path, serde_json::Value::Array(list).to_string());
    }

    /// Every permission request of the task so far, with its answer and who gave it.
    async fn permission_requests(&self, id: TaskId) -> Vec<result::PermissionRequest> {
        let Ok(task) = self.blocking(move |s| s.get(id)).await else { return vec![] };
        task.questions
            .iter()
            .filter_map(|q| {
                let p = q.ask.as_ref()?.permission.as_ref()?;
                Some(result::PermissionRequest {
                    permission: p.permission.clone(),
                    patterns: p.patterns.clone(),
                    target: p.target.clone(),
                    answer: q.answer.clone(),
                    answered_by: q.answered_by.clone(),
                    asked_at: q.asked_at,
                })
            })
            .collect()
    }

    /// An agent error, explained. OpenCode answers a model it does not offer with an
    /// `UnknownError` that says nothing more; asking its model list tells that case apart.
    async fn diagnose_agent_error(&self, e: &AgentError, used: &ModelUsed) -> Diagnosis {
        if e.name == "UnknownError"
            && let Some(m) = used.requested.clone()
        {
            let opencode = self.cfg.opencode.clone();
            let check = self.blocking(move |s| Ok(models::check_model(s, &opencode, &m))).await;
            if let Ok(Err(unknown)) = check {
                return Diagnosis {
                    message: format!("{unknown}; the task cannot run with it"),
                    retryable: false,
                };
            }
        }
        diagnose::agent_error(e, used)
    }

    /// Fills files_touched, diff and diffstat from git; with `commit`, first commits the work on
    /// the task branch. Errors are logged into the result's summary rather than losing it.
    async fn fill_diff(&self, task: &Task, dir: &Path, res: &mut TaskResult, commit: bool) {
        // Its own work only: against the commit it started from (its dependencies' work, when
        // it was stacked on them).
        let base = res.started_from.clone().unwrap_or_else(|| task.base.clone());
        let d = dir.to_path_buf();
        let message = format!("taskbridge: task {}: {}\n\n{}", task.id.0, task.title, res.summary);
        let out = tokio::task::spawn_blocking(move || -> Result<_> {
            let sha = if commit { git::commit_all(&d, &message)? } else { None };
            Ok((sha, git::diff_against_base(&d, &base)?))
        })
        .await;
        match out {
            Ok(Ok((sha, diff))) => {
                res.commit = sha;
                res.files_touched = diff.files;
                res.diff = diff.patch;
                res.diffstat = diff.stat;
            }
            Ok(Err(e)) => tracing::warn!(task = %task.id, error = %e, "diff failed"),
            Err(e) => tracing::warn!(task = %task.id, error = %e, "diff failed"),
        }
    }

    /// Runs the repository's set-up commands in a new worktree. Returns an error message if one
    /// fails.
    async fn setup(
        &self,
        task: &Task,
        start: &str,
        dir: &Path,
        log: &mut TaskLog,
    ) -> Option<String> {
        let cfg = match RepoConfig::at(Path::new(&task.repo), start) {
            Ok(c) => c,
            Err(e) => return Some(e),
        };
        for cmd in cfg.setup.commands {
            log.line(&format!("setup: {cmd}"));
            let out = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(&cmd)
                .current_dir(dir)
                .env("PWD", dir)
                .env("TASKBRIDGE_REPO", &task.repo)
                .env("TASKBRIDGE_TASK_ID", task.id.0.to_string())
                .stdin(std::process::Stdio::null())
                .output()
                .await;
            match out {
                Ok(o) => {
                    for l in String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .chain(String::from_utf8_lossy(&o.stderr).lines())
                    {
                        log.line(&format!("setup: {l}"));
                    }
                    if !o.status.success() {
                        return Some(format!("setup command `{cmd}` failed with {}", o.status));
                    }
                }
                Err(e) => return Some(format!("setup command `{cmd}` could not start: {e}")),
            }
        }
        None
    }
}

fn lost_or(e: Error) -> Result<Option<Outcome>> {
    match e {
        Error::Queue(queue::Error::StaleLease { .. }) => Ok(None),
        e => Err(e),
    }
}

/// What the task's earlier runs (before an answer) spent.
fn previous_usage(task: &Task) -> Usage {
    TaskResult::of(task).map(|r| r.usage).unwrap_or_default()
}

/// What a task builds on, for its prompt.
struct DepInfo {
    id: TaskId,
    title: String,
    summary: String,
    branch: Option<String>,
    files: Vec<String>,
    commit: Option<String>,
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

fn to_json(res: &TaskResult) -> serde_json::Value {
    res.to_json()
}

fn notes_section(notes: &[String]) -> String {
    if notes.is_empty() {
        return String::new();
    }
    let mut s = String::from("\n\n# Notes from the planner\n");
    for n in notes {
        s.push_str(&format!("- {n}\n"));
    }
    s
}

/// The name OpenCode knows the bridge by; its tools appear to the model as `taskbridge_claude_ask`
/// and so on.
pub const BRIDGE_MCP_NAME: &str = "taskbridge";

/// `OPENCODE_CONFIG_CONTENT` with the bridge added to its `mcp` block. The inherited content (the
/// user's own per-run config) is kept: OpenCode reads only one such variable.
pub fn with_bridge(inherited: Option<&str>, command: &[String]) -> String {
    let mut doc = config_doc(inherited);
    // OpenCode applies `timeout` to every call of the server's tools, and a question to Claude
    // can take minutes.
    let entry = serde_json::json!({
        "type": "local",
        "command": command,
        "enabled": true,
        "timeout": 300_000,
    });
    if !doc["mcp"].is_object() {
        doc["mcp"] = serde_json::json!({});
    }
    doc["mcp"][BRIDGE_MCP_NAME] = entry;
    doc.to_string()
}

/// The inherited `OPENCODE_CONFIG_CONTENT` as a JSON object to add to (an empty one when there
/// is none, or it is not an object).
fn config_doc(inherited: Option<&str>) -> serde_json::Value {
    inherited
        .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| serde_json::json!({}))
}

/// `OPENCODE_CONFIG_CONTENT` with the plugin file at `plugin` added to its `plugin` list.
pub fn with_plugin(inherited: Option<&str>, plugin: &Path) -> String {
    let mut doc = config_doc(inherited);
    let spec = serde_json::Value::from(format!("file://{}", plugin.display()));
    match doc["plugin"].as_array_mut() {
        Some(list) if !list.contains(&spec) => list.push(spec),
        Some(_) => {}
        None => doc["plugin"] = serde_json::json!([spec]),
    }
    doc.to_string()
}

/// OpenCode's permission rules for the task's flags. Nothing may resolve to "ask": headless
/// `opencode run` auto-rejects an "ask" and ends the agent's turn (exit 0), so a rule that asks
/// would silently stop the task.
pub fn permission_json(task: &Task) -> String {
    let mut p = serde_json::Map::new();
    p.insert("external_directory".into(), "deny".into());
    // `ask` rules cannot ask here: what they would ask about is denied instead.
    for rule in &task.ask_rules {
        let Ok((perm, pattern)) = queue::parse_ask_rule(rule) else { continue };
        if pattern == "*" {
            p.insert(perm, "deny".into());
            continue;
        }
        let entry = p.entry(perm).or_insert_with(|| serde_json::json!({"*": "allow"}));
        if let Some(map) = entry.as_object_mut() {
            map.insert(pattern, "deny".into());
        }
    }
    if task.readonly {
        p.insert("edit".into(), "deny".into());
    }
    if task.no_shell {
        p.insert("bash".into(), "deny".into());
    }
    if task.no_network {
        p.insert("webfetch".into(), "deny".into());
        p.insert("websearch".into(), "deny".into());
    }
    serde_json::Value::Object(p).to_string()
}

fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|a| if a.contains(' ') { format!("'{a}'") } else { a.clone() })
        .collect::<Vec<_>>()
        .join(" ")
}

fn describe(o: &Outcome) -> String {
    match o {
        Outcome::Done { .. } => "done".into(),
        Outcome::Failed { error, .. } => format!("attempt failed: {error}"),
        Outcome::FailedPermanently { error, .. } => format!("failed: {error}"),
        Outcome::Waiting { question, .. } => format!("the agent asks: {question}"),
        Outcome::Cancelled { .. } => "cancelled".into(),
        Outcome::Released => "released back to the queue (worker shutting down)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A loopback webhook: each request's JSON body arrives on the channel.
    fn webhook() -> (String, std::sync::mpsc::Receiver<Value>) {
        use std::io::{BufRead, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                let mut len = 0;
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    line.clear();
                }
                let mut body = vec![0; len];
                reader.read_exact(&mut body).unwrap();
                let _ = tx.send(serde_json::from_slice(&body).unwrap());
                let mut stream = stream;
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
            }
        });
        (url, rx)
    }

    /// The sweep's failures reach the webhook as a run's do: a question unanswered past its
    /// timeout is heard as failed; a lease expired with attempts left is requeued, not heard.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_task_the_sweep_fails_is_heard_by_the_webhook_and_a_requeued_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::resolve(Some(dir.path().join("home"))).unwrap();
        home.ensure().unwrap();
        let store = Arc::new(Store::open(home.db_path()).unwrap());
        let spec = |title: &str| {
            queue::TaskSpec::new(title, "/tmp/repo", "0123456789abcdef0123456789abcdef01234567")
        };
        let mut asks = spec("asks");
        asks.question_timeout_s = Some(1);
        let (asks, _) = store.submit(asks).unwrap();
        let c = store.claim_next("w", "h", Duration::from_secs(60)).unwrap().unwrap();
        let waiting = Outcome::Waiting {
            question: "Red or blue?".into(),
            session_id: "s".into(),
            result: None,
            ask: None,
        };
        store.finish(asks.id, c.token, waiting).unwrap();
        let (runs, _) = store.submit(spec("runs")).unwrap();
        store.claim_next("w", "h", Duration::from_millis(1)).unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(1100));

        let (url, heard) = webhook();
        let notify = NotifyConfig {
            desktop: false,
            webhook: Some(url),
            webhook_timeout: Duration::from_secs(10),
        };
        let cfg = WorkerConfig { notify, ..WorkerConfig::default() };
        let worker = Worker::new(store.clone(), home, cfg);
        worker.reap().await;
        worker.notifier.flush(Duration::from_secs(10)).await;
        let got: Vec<Value> = heard.try_iter().collect();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            (got[0]["task_id"].as_i64(), got[0]["event"].as_str()),
            (Some(asks.id.0), Some("failed"))
        );
        assert_eq!(store.get(runs.id).unwrap().status, queue::TaskStatus::Queued);
    }

    #[test]
    fn the_bridge_joins_the_users_own_run_config_without_replacing_it() {
        let cmd = vec!["/bin/taskbridge".to_owned(), "claude-mcp".to_owned()];
        let inherited = r#"{"provider": {"anthropic": {"options": {"baseURL": "http://x/v1"}}},
                            "mcp": {"mine": {"type": "local", "command": ["m"]}}}"#;
        let v: Value = serde_json::from_str(&with_bridge(Some(inherited), &cmd)).unwrap();
        assert_eq!(v["provider"]["anthropic"]["options"]["baseURL"], "http://x/v1");
        assert_eq!(v["mcp"]["mine"]["command"], json!(["m"]));
        assert_eq!(v["mcp"]["taskbridge"]["command"], json!(cmd));
        assert_eq!(v["mcp"]["taskbridge"]["type"], "local");

        // Nothing usable inherited: the bridge alone.
        for inherited in [None, Some("not json"), Some("[1]")] {
            let v: Value = serde_json::from_str(&with_bridge(inherited, &cmd)).unwrap();
            assert_eq!(v["mcp"].as_object().unwrap().len(), 1, "{v}");
        }
    }

    #[test]
    fn the_environment_plugin_joins_the_users_plugins_once() {
        let plugin = Path::new("/h/opencode-plugin/taskbridge-env.js");
        let ours = json!("file:///h/opencode-plugin/taskbridge-env.js");
        let v: Value =
            serde_json::from_str(&with_plugin(Some(r#"{"plugin": ["mine"], "x": 1}"#), plugin))
                .unwrap();
        assert_eq!((v["plugin"].clone(), v["x"].clone()), (json!(["mine", ours]), json!(1)));
        let again: Value =
            serde_json::from_str(&with_plugin(Some(&v.to_string()), plugin)).unwrap();
        assert_eq!(again["plugin"], json!(["mine", ours]), "added once");
        let alone: Value = serde_json::from_str(&with_plugin(None, plugin)).unwrap();
        assert_eq!(alone, json!({"plugin": [ours]}));
    }
}
