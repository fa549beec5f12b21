//! A worker's housekeeping, beside its claim loop: leases that expired and the agents they left
//! on this host, dead workers on this host (their servers killed, their tasks run again), agents
//! parked on a decision nobody will answer, and the spare worktrees kept warm for the next task
//! of a repository.

use crate::claim_loop::Worker;
use crate::git;
use crate::notify;
use crate::process;
use queue::TaskStatus;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A spare worktree: clean, detached, ready to be put on the next task's branch.
pub(crate) struct Spare {
    repo: String,
    dir: PathBuf,
    since: std::time::Instant,
}

/// A spare unused for this long is removed: the server forgets its set-up for a directory
/// after an hour idle, and the disk is worth more than a cold directory.
const SPARE_TTL: Duration = Duration::from_secs(50 * 60);

impl Worker {
    /// Dead workers on this host, every second (a pid that is gone needs no lease to expire:
    /// its server and what that started are killed, then its tasks run again); heartbeats and
    /// the lease sweeper every few seconds.
    pub(crate) async fn housekeeping(self: Arc<Self>, shutdown: CancellationToken) {
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
            Ok(orphans) => kill_agents(orphans, "killed the orphaned agent").await,
            Err(e) => tracing::warn!(error = %e, "collecting orphaned agents failed"),
        }
    }

    /// Agents parked on a decision whose task stopped waiting (cancelled, timed out) are
    /// aborted, so nothing runs on for a task nobody will resume.
    async fn sweep_parked(&self) {
        let mut ids = self.acp.parked_tasks();
        if let Some(servers) = &self.servers {
            ids.extend(servers.parked_tasks());
        }
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
        self.acp.sweep_parked(|id| live.contains(&id)).await;
        if let Some(servers) = &self.servers {
            servers.sweep_parked(|id| live.contains(&id)).await;
        }
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
    pub(crate) async fn recover_dead_local_workers(&self) {
        let Ok(workers) = self.blocking(|s| s.list_workers()).await else { return };
        // Their OpenCode servers first: a server outlives a worker killed with SIGKILL.
        let alive: Vec<String> = workers
            .iter()
            .filter(|w| w.host == self.host && !w.stopped && process::pid_alive(w.pid))
            .map(|w| crate::agent::opencode_serve::server_file_name(&w.id))
            .collect();
        let me = crate::agent::opencode_serve::server_file_name(&self.id);
        let home = self.home.clone();
        // Killing waits until they are gone, which may take the kernel a moment.
        let _ = tokio::task::spawn_blocking(move || {
            crate::agent::opencode_serve::kill_orphaned_servers(&home, |name| {
                name == me || alive.iter().any(|a| a == name)
            })
        })
        .await;
        for w in workers {
            if w.stopped || w.host != self.host || w.id == self.id || process::pid_alive(w.pid) {
                continue;
            }
            // Its agents first, all of them gone, and only then its tasks back to the queue:
            // a rerun must not meet the dead run's commands (issue #55).
            let wid = w.id.clone();
            if let Ok(agents) = self.blocking(move |s| s.running_agents(&wid)).await {
                kill_agents(agents, "killed a dead worker's agent").await;
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

    /// A spare worktree of `repo`, if this worker keeps one.
    pub(crate) fn take_spare(&self, repo: &str) -> Option<PathBuf> {
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
    pub(crate) fn queue_worktrees(&self) -> PathBuf {
        let location = self.store.location();
        match location {
            queue::Location::Sqlite(p) if git::same_path(p, &self.home.db_path()) => {
                self.home.worktrees_dir()
            }
            _ => self.home.worktrees_dir().join(format!("q-{}", location.key())),
        }
    }

    /// Where this queue's new worktrees of `repo` go: a directory of the repository's own inside
    /// [`Worker::queue_worktrees`], so that one wall can hold all of them (a warm server's).
    pub(crate) fn repo_worktrees(&self, repo: &str) -> PathBuf {
        self.queue_worktrees().join(queue::home::repo_dir_name(Path::new(repo)))
    }

    /// Takes this worker's spare worktree at `dir`, if it keeps one there.
    pub(crate) fn take_spare_at(&self, repo: &str, dir: &Path) -> bool {
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
    pub(crate) async fn keep_spare(&self, repo: &str, dir: &Path, branch: &str) -> bool {
        let full = self.spares.lock().map_or(true, |s| {
            s.iter().filter(|s| s.repo == repo).count() >= self.cfg.concurrency.max(1)
        });
        if full {
            return false;
        }
        let (r, d, b) = (PathBuf::from(repo), dir.to_path_buf(), branch.to_owned());
        match tokio::task::spawn_blocking(move || git::park_worktree(&r, &d, &b)).await {
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
    pub(crate) async fn drop_spares(&self, all: bool) {
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
            if let Some(servers) = &self.servers {
                servers.forget_ready(&sp.dir).await;
            }
            self.acp.forget_ready(&sp.dir);
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
        let path = crate::agent::opencode_serve::spares_file(&self.home, &self.id);
        let _ = std::fs::write(path, serde_json::Value::Array(list).to_string());
    }
}

/// Kills each agent that is still the process recorded, and waits until nothing of it runs
/// (off the async threads: the kernel may take a moment).
async fn kill_agents(agents: Vec<queue::Orphan>, said: &'static str) {
    let _ = tokio::task::spawn_blocking(move || {
        for a in agents {
            if process::kill_orphan(a.pid, a.started.as_deref()) {
                tracing::warn!(task = ?a.task, pid = a.pid, "{said}");
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkerConfig;
    use crate::notify::NotifyConfig;
    use queue::{Home, Outcome, Store};
    use serde_json::Value;

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
        let home = Home::at(dir.path().join("home")).unwrap();
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
}
