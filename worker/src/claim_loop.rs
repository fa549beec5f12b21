//! The claim loop: a worker registers, claims runnable tasks while it has a free slot, runs each
//! (a repository here or a mirror of its remote, the run's stages in [`crate::run`], the work
//! pushed back to the remote) and records its outcome.
//!
//! # Lifecycle
//! A [`Worker`] registers itself in the database, recovers tasks left by dead workers on this
//! host, then loops: while it has a free slot it claims the next runnable task and runs it; when
//! nothing is runnable it sleeps until a commit is noticed (same process: at once; another
//! process: the queue's [`queue::ChangeWatcher`]) or a one-second safety-net tick. Each run holds
//! a lease that a heartbeat extends every third of its length; the heartbeat also carries cancel
//! requests. A lost lease stops the run without writing anything: the fencing token makes sure a
//! worker that was paused or partitioned can never overwrite the next run's result.
//! Housekeeping (reaping, dead workers on this host, spare worktrees) is in
//! [`crate::housekeeping`].

use crate::agent::AgentKind;
use crate::config::{OpenCodeMode, WorkerConfig, hostname};
use crate::error::{Error, Result};
use crate::git;
use crate::housekeeping::Spare;
use crate::logs::TaskLog;
use crate::notify;
use crate::opencode_config::{headless, with_plugin, with_task_bridge};
use crate::process::StopReason;
use queue::{Claim, Home, Outcome, Store, Task, TaskId, TaskResult};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore, watch};
use tokio_util::sync::CancellationToken;

/// A started worker: the handle to wait for it, and the watcher that wakes it while it runs.
pub struct RunningWorker {
    pub worker: Arc<Worker>,
    pub handle: tokio::task::JoinHandle<Result<()>>,
    _watcher: Option<queue::ChangeWatcher>,
}

pub struct Worker {
    pub(crate) store: Arc<Store>,
    pub(crate) home: Home,
    pub(crate) cfg: WorkerConfig,
    pub(crate) id: String,
    pub(crate) host: String,
    pub(crate) wake: Arc<Notify>,
    pub(crate) running: AtomicUsize,
    pub(crate) notifier: notify::Notifier,
    /// The warm OpenCode servers, in `serve` mode.
    pub(crate) servers: Option<crate::agent::opencode_serve::Servers>,
    /// The warm ACP agents: OpenCode in `acp` mode, and the configured `[agents.NAME]`.
    pub(crate) acp: crate::agent::acp::AcpAgents,
    /// How OpenCode is started over ACP, in `acp` mode.
    pub(crate) opencode_acp: Option<crate::agent::acp::Launch>,
    /// The version of the OpenCode this worker runs, where it could tell.
    pub(crate) opencode_version: Option<String>,
    /// Done tasks' worktrees kept for the next task of their repository (`serve` mode): the
    /// server has set itself up for those directories, which takes it over a second for a new
    /// one, most of a one-turn task.
    pub(crate) spares: std::sync::Mutex<Vec<Spare>>,
    /// Held while a mirror is fetched: two fetches into one repository would fight over its
    /// ref locks.
    pub(crate) mirrors: Arc<std::sync::Mutex<()>>,
    /// The way to the model provider out of a wall without network, started on first use.
    pub(crate) proxy: tokio::sync::OnceCell<crate::sandbox::proxy::Proxy>,
}

impl Worker {
    pub fn new(store: Arc<Store>, home: Home, mut cfg: WorkerConfig) -> Arc<Worker> {
        let opencode_version = crate::agent::opencode_version(&cfg.opencode, &cfg.env);
        let major = opencode_version.as_deref().and_then(crate::agent::major);
        if major.is_some_and(|m| m >= 2) && cfg.opencode_mode != OpenCodeMode::Acp {
            // OpenCode 2 serves another HTTP API and prints another `run` format: ACP is the
            // one way TaskBridge speaks to it.
            if cfg.opencode_mode_chosen {
                tracing::warn!(
                    mode = cfg.opencode_mode.as_str(),
                    "OpenCode {} has no `{}` mode TaskBridge speaks; running it over ACP",
                    opencode_version.as_deref().unwrap_or("2"),
                    cfg.opencode_mode.as_str()
                );
            }
            cfg.opencode_mode = OpenCodeMode::Acp;
        }
        let opencode_acp = (cfg.opencode_mode == OpenCodeMode::Acp).then(|| {
            let plugin = crate::agent::opencode_serve::env_plugin(&home);
            if let Err(e) = &plugin {
                // Said, not fatal: the agent's commands would see OpenCode's password.
                tracing::warn!(error = %e, "cannot write OpenCode's environment plugin");
            }
            crate::agent::opencode_acp_launch(&cfg, plugin.ok().as_deref())
        });
        let wake = Arc::new(Notify::new());
        let w = wake.clone();
        store.on_change(move || w.notify_one());
        let host = hostname(&cfg.env);
        let id = format!("{host}:{}:{}", std::process::id(), fastrand::u32(..) % 100_000);
        let notifier = notify::Notifier::new(cfg.notify.clone());
        let servers = (cfg.opencode_mode == OpenCodeMode::Serve).then(|| {
            let content = headless(cfg.opencode_config_content.as_deref());
            let mut content = Some(with_task_bridge(Some(&content), &cfg));
            match crate::agent::opencode_serve::env_plugin(&home) {
                Ok(plugin) => content = Some(with_plugin(content.as_deref(), &plugin)),
                // Said, not fatal: the agent's commands would see the server's password.
                Err(e) => tracing::warn!(error = %e, "cannot write OpenCode's environment plugin"),
            }
            let mut env: Vec<(String, String)> =
                content.map(|c| ("OPENCODE_CONFIG_CONTENT".to_owned(), c)).into_iter().collect();
            env.extend(crate::agent::opencode_serve::npm_offline(&cfg.env));
            crate::agent::opencode_serve::Servers::new(cfg.opencode.clone(), env, &home, &id)
        });
        let acp = crate::agent::acp::AcpAgents::new(&home, &id);
        Arc::new(Worker {
            store,
            home,
            cfg,
            acp,
            opencode_acp,
            opencode_version,
            id,
            host,
            wake,
            running: AtomicUsize::new(0),
            notifier,
            servers,
            spares: Default::default(),
            mirrors: Default::default(),
            proxy: Default::default(),
        })
    }

    /// Stops this worker's OpenCode server now (its shutdown does too; again is harmless): for
    /// a process that cannot wait for the worker to finish stopping.
    pub async fn stop_server(&self) {
        if let Some(servers) = &self.servers {
            servers.shutdown().await;
        }
        self.acp.shutdown().await;
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

    pub(crate) async fn blocking<T: Send + 'static>(
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
        if let Some(v) = &self.opencode_version {
            tracing::info!(version = %v, mode = self.cfg.opencode_mode.as_str(), "OpenCode found");
        }
        self.blocking(move |s| s.register_worker(&id, std::process::id(), &host, conc, &agent))
            .await?;
        let agents = self.agents();
        tracing::info!(worker = %self.id, ?agents, "agents this worker can run");
        let id = self.id.clone();
        self.blocking(move |s| {
            let names: Vec<&str> = agents.iter().map(String::as_str).collect();
            s.worker_runs(&id, &names)
        })
        .await?;
        self.recover_dead_local_workers().await;
        let housekeeping = tokio::spawn(self.clone().housekeeping(shutdown.clone()));
        let slots = Arc::new(Semaphore::new(self.cfg.concurrency.max(1)));
        let mut runs = tokio::task::JoinSet::new();
        tracing::info!(worker = %self.id, concurrency = self.cfg.concurrency, "worker started");
        let mut failing = ClaimFailures::default();
        loop {
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                _ = shutdown.cancelled() => break,
            };
            let (id, host, lease) = (self.id.clone(), self.host.clone(), self.cfg.lease);
            let claimed = match self.blocking(move |s| s.claim_next(&id, &host, lease)).await {
                Ok(c) => {
                    failing.recovered();
                    c
                }
                Err(e) => {
                    drop(permit);
                    let wait = failing.failed(&e);
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = shutdown.cancelled() => break,
                    }
                    continue;
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
        if let Some(servers) = &self.servers {
            servers.shutdown().await;
        }
        self.acp.shutdown().await;
        self.drop_spares(true).await;
        let _ =
            std::fs::remove_file(crate::agent::opencode_serve::spares_file(&self.home, &self.id));
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

    pub(crate) fn backoff(&self, attempts: i64) -> f64 {
        let exp = self.cfg.retry_base.as_secs_f64() * 2f64.powi(attempts.clamp(0, 20) as i32);
        fastrand::f64() * exp.min(self.cfg.retry_cap.as_secs_f64())
    }

    /// One run of a claimed task, from worktree to recorded outcome.
    async fn execute(self: Arc<Self>, claim: Claim, shutdown: CancellationToken) -> Result<()> {
        crate::metrics::claimed(&claim);
        let began = std::time::Instant::now();
        let attempt = crate::trace::Attempt::start(&claim.task, claim.resume.is_some());
        let Claim { task, token, resume, new_notes, .. } = claim;
        let id = task.id;
        crate::trace::stamp(id, "claimed");
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
            None => {
                let given = crate::run::Given { resume, new_notes };
                self.run_once(&task, token, given, &mut log, stop_rx, &attempt).await
            }
        };
        // Work done from a mirror reaches the remote before the task is called done, while
        // the lease is still kept.
        let outcome = match (&mirror, outcome) {
            (Some(dir), Ok(Some(Outcome::Done { result }))) => {
                let _push = attempt.step("push");
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
                    kind: queue::FailureKind::Worker,
                    result: None,
                    backoff_s: self.backoff(task.attempts),
                }
            }
        };
        let model =
            self.model_for(&task, &crate::agent::AgentSpec::of_in(&task, &self.cfg.agents)).await;
        crate::metrics::finished(&task, model.as_deref(), &outcome, began.elapsed().as_secs_f64());
        attempt.end(&task, &outcome);
        let summary = describe(&outcome);
        match self.blocking(move |s| s.finish(id, token, outcome)).await {
            Ok(t) => {
                crate::trace::stamp(id, "finished");
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
        let opened = match git2::Repository::open(&task.repo) {
            Ok(r) => Some(r),
            // Out of descriptors or memory, a disk error: the repository may well be here, and
            // saying it is not would send the user the wrong way.
            Err(e)
                if e.class() == git2::ErrorClass::Os && e.code() != git2::ErrorCode::NotFound =>
            {
                return Err(Outcome::Failed {
                    error: format!(
                        "could not open the repository {} ({}); another attempt follows",
                        task.repo,
                        e.message()
                    ),
                    kind: queue::FailureKind::Repository,
                    result: None,
                    backoff_s: self.backoff(task.attempts),
                });
            }
            Err(_) => None,
        };
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
                kind: queue::FailureKind::Repository,
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
                kind: queue::FailureKind::Repository,
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
        mut result: Box<TaskResult>,
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
                result.pushed_to = Some(format!("{remote} {branch}"));
                Outcome::Done { result }
            }
            Err(e) => {
                log.line(&format!("error: {e}"));
                Outcome::Failed {
                    error: format!(
                        "the work is done but could not be pushed, so it is not done yet: {e}"
                    ),
                    kind: queue::FailureKind::Push,
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

    /// The agents whose CLIs this worker has (OpenCode is always listed: a task on it fails
    /// saying what to install, as before there were several agents).
    /// The configured `[agents.NAME]` are listed whose programs are here.
    pub fn agents(&self) -> Vec<String> {
        let builtin = crate::agent::ALL.iter().filter(|k| {
            **k == AgentKind::OpenCode || self.cfg.env.find_program(self.program(**k)).is_some()
        });
        let configured = self.cfg.agents.iter().filter(|a| a.missing(&self.cfg.env).is_none());
        builtin.map(|k| k.name().to_owned()).chain(configured.map(|a| a.name.clone())).collect()
    }

    /// The CLI an agent runs as, as this worker is configured.
    pub fn program(&self, kind: AgentKind) -> &Path {
        self.cfg.program(kind)
    }
}

fn describe(o: &Outcome) -> String {
    match o {
        Outcome::Done { .. } => "done".into(),
        Outcome::Failed { error, .. } => format!("attempt failed: {error}"),
        Outcome::FailedPermanently { error, .. } => format!("failed: {error}"),
        // A native ask was logged when the agent made it; a question in the agent's answer
        // (its prompt-level block) is said here, once.
        Outcome::Waiting { ask: Some(_), .. } => "waiting for the answer".into(),
        Outcome::Waiting { question, .. } => format!("the agent asks: {question}"),
        Outcome::Cancelled { .. } => "cancelled".into(),
        Outcome::Released => "released back to the queue (worker shutting down)".into(),
    }
}

/// Claims that keep failing (a database that went away, or is damaged): one line when it
/// starts, and again only when the reason changes, and a wait that doubles up to a minute,
/// rather than a line a second.
#[derive(Default)]
struct ClaimFailures {
    last: Option<String>,
    wait: Duration,
}

impl ClaimFailures {
    const FIRST: Duration = Duration::from_secs(1);
    const MOST: Duration = Duration::from_secs(60);

    /// How long to wait before the next claim.
    fn failed(&mut self, e: &crate::Error) -> Duration {
        let why = e.to_string();
        if self.last.as_deref() != Some(why.as_str()) {
            tracing::error!(error = %why, "claiming tasks fails; trying again less and less often (at most every minute) until it works");
            self.last = Some(why);
        }
        self.wait = if self.wait.is_zero() { Self::FIRST } else { (self.wait * 2).min(Self::MOST) };
        self.wait
    }

    fn recovered(&mut self) {
        if self.last.take().is_some() {
            tracing::info!("claiming tasks works again");
        }
        self.wait = Duration::ZERO;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_claims_wait_longer_and_longer_up_to_a_minute_and_start_over_once_they_work() {
        let mut f = ClaimFailures::default();
        let e = crate::Error::Config("the database went away".into());
        let waits: Vec<u64> = (0..9).map(|_| f.failed(&e).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(f.last.as_deref(), Some("the database went away"));
        f.recovered();
        assert_eq!((f.last.clone(), f.failed(&e).as_secs()), (None, 1));
    }
}
