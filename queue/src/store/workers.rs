//! The workers' registry (who runs, on which host, with which agents) and the queue's settings
//! and health checks.

use super::*;

impl Store {
    /// Registers a worker; `agent` says what it drives (`opencode serve`, say).
    pub fn register_worker(
        &self,
        id: &str,
        pid: u32,
        host: &str,
        concurrency: usize,
        agent: &str,
    ) -> Result<()> {
        self.write(|tx, now| {
            tx.exec(
                "INSERT INTO workers (id, pid, host, started_at, heartbeat_at, concurrency, agent)
                 VALUES (?1, ?2, ?3, ?4, ?4, ?5, ?6)
                 ON CONFLICT (id) DO UPDATE SET pid = excluded.pid, host = excluded.host,
                    started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,
                    concurrency = excluded.concurrency, agent = excluded.agent, stopped_at = NULL",
                args![id, pid, host, now, concurrency as i64, agent],
            )?;
            Ok(())
        })
    }

    /// Records the agents worker `id` can run (`opencode`, `claude-code`, `codex`): a task for
    /// one of them is left to such a worker while one is alive.
    pub fn worker_runs(&self, id: &str, agents: &[&str]) -> Result<()> {
        let list = format!(",{},", agents.join(","));
        self.exec_alone("UPDATE workers SET agents = ?2 WHERE id = ?1", args![id, list])?;
        Ok(())
    }

    pub fn worker_heartbeat(&self, id: &str) -> Result<()> {
        self.exec_alone(
            "UPDATE workers SET heartbeat_at = unixepoch('subsec') WHERE id = ?1",
            args![id],
        )?;
        Ok(())
    }

    pub fn worker_stopped(&self, id: &str) -> Result<()> {
        self.write(|tx, now| {
            tx.exec("UPDATE workers SET stopped_at = ?1 WHERE id = ?2", args![now, id])?;
            Ok(())
        })
    }

    /// Workers that are alive, or stopped or silent within the last day: a worker that died
    /// without saying so (the embedded worker of each `claude -p` session, say) stays a day,
    /// then only `list_all_workers` shows it.
    pub fn list_workers(&self) -> Result<Vec<WorkerInfo>> {
        self.workers(
            "WHERE (w.stopped_at IS NULL AND w.heartbeat_at > unixepoch('subsec') - 86400)
                OR w.stopped_at > unixepoch('subsec') - 86400",
        )
    }

    /// Every worker the queue has seen: the history.
    pub fn list_all_workers(&self) -> Result<Vec<WorkerInfo>> {
        self.workers("")
    }

    fn workers(&self, filter: &str) -> Result<Vec<WorkerInfo>> {
        self.read(|conn| {
            conn.query(
                &format!(
                    "SELECT w.id, w.pid, w.host, w.started_at, w.heartbeat_at, w.concurrency,
                        CASE WHEN w.stopped_at IS NULL THEN 0 ELSE 1 END,
                        unixepoch('subsec') - w.heartbeat_at,
                        (SELECT group_concat(t.id) FROM tasks t
                          WHERE t.worker = w.id AND t.status = 'running'),
                        w.agent, w.agents
                   FROM workers w
                  {filter}
                  ORDER BY w.started_at"
                ),
                &[],
            )?
            .iter()
            .map(|r| {
                let stopped: bool = r.get(6)?;
                let silent_for: f64 = r.get(7)?;
                Ok(WorkerInfo {
                    id: r.get(0)?,
                    pid: r.get(1)?,
                    host: r.get(2)?,
                    started_at: r.get(3)?,
                    heartbeat_at: r.get(4)?,
                    concurrency: r.get(5)?,
                    current_tasks: id_list(r.get(8)?),
                    stopped,
                    stale: !stopped && silent_for > WORKER_STALE_AFTER_S,
                    agent: r.get(9)?,
                    agents: r
                        .get::<Option<String>>(10)?
                        .map(|a| {
                            a.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect()
                        })
                        .unwrap_or_default(),
                })
            })
            .collect()
        })
    }

    /// Requeues the running tasks of a worker that is known to be dead (e.g. a stale one being
    /// restarted); the attempt counts, as with an expired lease.
    pub fn release_worker_tasks(&self, worker: &str) -> Result<Vec<TaskId>> {
        self.write(|tx, now| {
            let ids = tx
                .query(
                    "UPDATE tasks SET lease_until = ?1 - 1 WHERE worker = ?2 AND status = 'running'
                     RETURNING id",
                    args![now, worker],
                )?
                .iter()
                .map(|r| r.get(0).map(TaskId))
                .collect::<Result<Vec<_>>>()?;
            tx.exec("UPDATE workers SET stopped_at = ?1 WHERE id = ?2", args![now, worker])?;
            Ok(ids)
        })
    }

    /// Pauses the queue: workers finish what they run and claim nothing new until
    /// `resume_queue`. True when it was not paused before.
    pub fn pause_queue(&self) -> Result<bool> {
        self.write(|tx, now| {
            let was = get_setting(tx, PAUSED)?.is_some();
            tx.exec(
                "INSERT INTO settings (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                args![PAUSED, now.to_string()],
            )?;
            Ok(!was)
        })
    }

    /// Lets workers claim again; true when the queue was paused.
    pub fn resume_queue(&self) -> Result<bool> {
        self.write(|tx, _| Ok(tx.exec("DELETE FROM settings WHERE key = ?1", args![PAUSED])? > 0))
    }

    pub fn setting(&self, key: &str) -> Result<Option<String>> {
        self.read(|conn| get_setting(conn, key))
    }

    pub fn set_setting(&self, key: &str, value: &str) -> Result<()> {
        self.write(|tx, _| {
            tx.exec(
                "INSERT INTO settings (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                args![key, value],
            )?;
            Ok(())
        })
    }

    /// What the queue runs on, for `doctor`: the engine and its version, and on PostgreSQL the
    /// schema and how workers are woken.
    pub fn backend_info(&self) -> Result<String> {
        match (&self.backend, &self.location) {
            (Backend::Postgres(db), Location::Postgres(url)) => {
                let version: String = db.read(&mut |conn| {
                    conn.query_one("SELECT current_setting('server_version')", &[])?.get(0)
                })?;
                let wake = if url.listen {
                    "LISTEN/NOTIFY".to_owned()
                } else {
                    format!("a poll every {} ms (listen=off)", url.poll.as_millis())
                };
                Ok(format!("PostgreSQL {version}, schema {}, woken by {wake}", url.schema))
            }
            _ => Ok(format!("SQLite {}", rusqlite::version())),
        }
    }

    /// A quick check of the SQLite file (`PRAGMA quick_check`: "ok" when sound, else what is
    /// damaged), for `doctor`; "ok" on PostgreSQL, which checks its own pages.
    pub fn quick_check(&self) -> Result<String> {
        match &self.backend {
            Backend::Sqlite(db) => db.quick_check(),
            Backend::Postgres(_) => Ok("ok".into()),
        }
    }

    /// A health check of the database: SQLite's `PRAGMA integrity_check` ("ok" when sound), or
    /// on PostgreSQL a round trip ("ok" when the server answers).
    pub fn integrity_check(&self) -> Result<String> {
        match &self.backend {
            Backend::Sqlite(db) => db.integrity_check(),
            Backend::Postgres(db) => {
                db.read(&mut |conn| conn.query_one("SELECT 'ok'", &[])?.get(0))
            }
        }
    }
}
