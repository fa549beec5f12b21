//! A worker's side of a task's life: the claim (fenced by a token), the lease it keeps alive,
//! the reaping of leases that lapsed, and the tasks of workers that died on this host.

use super::*;

impl Store {
    /// Claims the next runnable task for `worker`: among queued tasks whose dependencies are all
    /// `done` and whose retry delay has passed, the highest priority, then the oldest (lowest
    /// id). The lease and the new fencing token are computed inside the same transaction, from
    /// the database's clock.
    ///
    /// On SQLite the claim is committed crash-safe but not power-safe (WAL with
    /// `synchronous=NORMAL`): it survives any process dying, and a claim lost to a power cut
    /// only leaves the task queued, to be claimed again, which is what must happen anyway since
    /// its agent died with the machine. That halves the fsyncs on the busiest path; everything
    /// else stays `FULL`.
    pub fn claim_next(&self, worker: &str, host: &str, lease: Duration) -> Result<Option<Claim>> {
        // What a claim sets, and which tasks it may take, the same on both backends. A task
        // whose agent is blocked on a decision in another live worker's server is that
        // worker's to resume: only it can answer the blocked request. A task that resumes an
        // agent session stays on the host whose agent keeps that session while a worker lives
        // there (several hosts share a PostgreSQL queue; their agents do not share sessions).
        // A task for Claude Code or Codex is left to a worker whose host has that CLI while
        // one is alive; with none, any worker takes it and fails it saying what to install.
        // Its queue wait counts from when it became ready: submitted, its retry delay over,
        // its last dependency done, or its decision answered.
        const SET: &str = "status = 'running', worker = ?1, worker_host = ?2,
            lease_token = lease_token + 1, lease_until = ?3 + ?4,
            attempts = attempts + CASE WHEN pending_answer IS NULL THEN 1 ELSE 0 END,
            started_at = coalesce(started_at, ?3), updated_at = ?3,
            agent_pid = NULL, agent_started = NULL, cancel_requested = 0,
            not_before = NULL, parked_worker = NULL, claimed_at = ?3,
            queue_wait_s = ?3 - GREATEST(created_at, coalesce(not_before, 0),
                coalesce((SELECT max(p.finished_at) FROM task_deps d JOIN tasks p
                    ON p.id = d.depends_on WHERE d.task_id = tasks.id), 0),
                CASE WHEN pending_answer IS NULL THEN 0 ELSE coalesce((SELECT max(q.answered_at)
                    FROM task_questions q WHERE q.task_id = tasks.id), 0) END)";
        // A paused queue (`pause_queue`) hands nothing out, an answered task included.
        const RUNNABLE: &str = "t.status = 'queued'
            AND NOT EXISTS (SELECT 1 FROM settings s WHERE s.key = 'paused')
            AND (t.not_before IS NULL OR t.not_before <= ?3)
            AND NOT EXISTS (SELECT 1 FROM task_deps d JOIN tasks p
                 ON p.id = d.depends_on WHERE d.task_id = t.id AND p.status != 'done')
            AND (t.parked_worker IS NULL OR t.parked_worker = ?1
                 OR NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = t.parked_worker
                     AND w.stopped_at IS NULL AND w.heartbeat_at > ?3 - ?5))
            AND (t.session_id IS NULL OR t.worker_host IS NULL OR t.worker_host = ?2
                 OR NOT EXISTS (SELECT 1 FROM workers w WHERE w.host = t.worker_host
                     AND w.stopped_at IS NULL AND w.heartbeat_at > ?3 - ?5))
            AND (t.agent IS NULL OR t.agent = 'opencode' OR t.agent LIKE 'opencode:%'
                 OR EXISTS (SELECT 1 FROM workers me WHERE me.id = ?1
                     AND me.agents LIKE '%,' || t.agent || ',%')
                 OR NOT EXISTS (SELECT 1 FROM workers w WHERE w.stopped_at IS NULL
                     AND w.heartbeat_at > ?3 - ?5 AND w.agents LIKE '%,' || t.agent || ',%'))";
        static SQLITE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            // INDEXED BY: left to itself the planner takes the status index and sorts every
            // queued task on each claim (2 ms at 2,000 queued); the partial index walks them in
            // claim order and stops at the first runnable one (0.4 ms).
            format!(
                "UPDATE tasks SET {SET} WHERE id = (
                    SELECT t.id FROM tasks t INDEXED BY tasks_claim WHERE {RUNNABLE}
                     ORDER BY t.priority DESC, t.id ASC LIMIT 1)
                 RETURNING id, lease_token, session_id, pending_answer, ask, queue_wait_s",
                SET = SET.replace("GREATEST(", "max("),
            )
        });
        static POSTGRES: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            // SKIP LOCKED: concurrent claimers pass over each other's rows instead of queueing
            // on them. MATERIALIZED keeps the planner from folding the CTE into a join that
            // locks more rows than the one it returns.
            // The clock is read in the statement, after its snapshot: a lease taken over from
            // a reaped task then starts after the reaper saw the old one end (the
            // transaction's own time, read before, could be earlier than that).
            format!(
                "WITH clock AS MATERIALIZED (
                    SELECT extract(epoch from clock_timestamp())::float8 AS now),
                 next AS MATERIALIZED (
                    SELECT t.id FROM tasks t, clock WHERE {RUNNABLE}
                     ORDER BY t.priority DESC, t.id ASC LIMIT 1 FOR UPDATE OF t SKIP LOCKED)
                 UPDATE tasks SET {SET} FROM next, clock WHERE tasks.id = next.id
                 RETURNING tasks.id, tasks.lease_token, tasks.session_id,
                    tasks.pending_answer, tasks.ask, tasks.queue_wait_s",
                RUNNABLE = RUNNABLE.replace("?3", "clock.now"),
                SET = SET.replace("?3", "clock.now"),
            )
        });
        let claimed = self.write_with(Durability::CrashSafe, |tx, now| {
            let sql = match tx.dialect() {
                Dialect::Sqlite => SQLITE.as_str(),
                Dialect::Postgres => POSTGRES.as_str(),
            };
            let row = tx.query_opt(
                sql,
                args![worker, host, now, lease.as_secs_f64(), WORKER_STALE_AFTER_S],
            )?;
            let Some(row) = row else { return Ok(None) };
            let (id, token): (i64, i64) = (row.get(0)?, row.get(1)?);
            let (session, answer, ask): (Option<String>, Option<String>, Option<String>) =
                (row.get(2)?, row.get(3)?, row.get(4)?);
            let queue_wait_s: f64 = row.get::<f64>(5)?.max(0.0);
            let new_notes = tx
                .query(
                    "UPDATE task_notes SET delivered = 1 WHERE task_id = ?1 AND delivered = 0
                     RETURNING note",
                    args![id],
                )?
                .iter()
                .map(|r| r.get::<String>(0))
                .collect::<Result<Vec<_>>>()?;
            let resume = match (session, answer) {
                (Some(session_id), Some(answer)) => Some(Resume {
                    session_id,
                    answer,
                    ask: ask.and_then(|a| serde_json::from_str(&a).ok()),
                }),
                _ => None,
            };
            Ok(Some((TaskId(id), token, resume, new_notes, queue_wait_s)))
        })?;
        let Some((id, token, resume, new_notes, queue_wait_s)) = claimed else { return Ok(None) };
        let task = self.get(id)?;
        Ok(Some(Claim { task, token, resume, new_notes, queue_wait_s }))
    }

    /// Extends the lease of a running task. Fails with [`Error::StaleLease`] when the token no
    /// longer matches: the caller must stop the run, another worker may own the task now.
    pub fn heartbeat(&self, id: TaskId, token: i64, lease: Duration) -> Result<HeartbeatReply> {
        let reply = self.write(|tx, now| {
            tx.query_opt(
                "UPDATE tasks SET lease_until = ?1 + ?2 WHERE id = ?3 AND lease_token = ?4
                   AND status = 'running' RETURNING cancel_requested, lease_until",
                args![now, lease.as_secs_f64(), id.0, token],
            )?
            .map(|r| Ok(HeartbeatReply { cancel_requested: r.get(0)?, lease_until: r.get(1)? }))
            .transpose()
        })?;
        reply.ok_or(Error::StaleLease { id, token })
    }

    /// Requeues tasks whose lease expired (their worker died or hung), or fails them once their
    /// attempts are used up; fails waiting tasks whose question timed out. Returns what was
    /// reaped, so the caller can say so (a webhook hears a task that failed here).
    pub fn reap_expired(&self) -> Result<Vec<Reaped>> {
        self.write(|tx, now| {
            // Locked: reapers on several hosts must not both requeue (and count) one task.
            let expired = tx.query(
                "SELECT id, attempts, max_attempts, agent_pid, agent_started, worker_host
                   FROM tasks WHERE status = 'running' AND lease_until < ?1 FOR UPDATE",
                args![now],
            )?;
            let mut reaped = Vec::new();
            for row in expired {
                let id = TaskId(row.get(0)?);
                let (attempts, max_attempts): (i64, i64) = (row.get(1)?, row.get(2)?);
                // Its agent may still run on its host: kept for a worker there to kill.
                let (pid, started, host): (Option<i64>, Option<String>, Option<String>) =
                    (row.get(3)?, row.get(4)?, row.get(5)?);
                if let (Some(pid), Some(host)) = (pid, &host) {
                    tx.exec(
                        "INSERT INTO orphans (host, pid, started, task_id, found_at)
                         VALUES (?1, ?2, ?3, ?4, ?5)",
                        args![host, pid, &started, id.0, now],
                    )?;
                }
                let requeued = attempts < max_attempts;
                let error = "the worker running this task stopped responding (its lease expired)";
                if requeued {
                    tx.exec(
                        "UPDATE tasks SET status = 'queued', worker = NULL, lease_until = NULL,
                           error = ?1, updated_at = ?2 WHERE id = ?3",
                        args![format!("{error}; requeued"), now, id.0],
                    )?;
                } else {
                    let msg =
                        format!("{error} and no attempts are left ({attempts} of {max_attempts})");
                    end_terminal(tx, now, id, TaskStatus::Failed, Some(&msg), None)?;
                }
                reaped.push(Reaped { id, requeued, question_timed_out: false });
            }
            let timed_out = tx.query(
                "SELECT id, question_timeout_s FROM tasks WHERE status = 'waiting'
                   AND question_timeout_s IS NOT NULL AND asked_at + question_timeout_s < ?1
                   FOR UPDATE",
                args![now],
            )?;
            for row in timed_out {
                let (id, secs): (i64, i64) = (row.get(0)?, row.get(1)?);
                let msg = format!("the question was not answered within {secs} s");
                end_terminal(tx, now, TaskId(id), TaskStatus::Failed, Some(&msg), None)?;
                reaped.push(Reaped { id: TaskId(id), requeued: false, question_timed_out: true });
            }
            Ok(reaped)
        })
    }

    /// The agents of `worker`'s running tasks, as recorded when they started: a worker that
    /// found `worker` dead kills them before it gives the tasks back, so that no rerun starts
    /// while the last run's commands still run.
    pub fn running_agents(&self, worker: &str) -> Result<Vec<Orphan>> {
        self.read(|conn| {
            conn.query(
                "SELECT agent_pid, agent_started, id FROM tasks
                  WHERE worker = ?1 AND status = 'running' AND agent_pid IS NOT NULL",
                args![worker],
            )?
            .iter()
            .map(orphan)
            .collect()
        })
    }

    /// The agents that dead workers left running on `host` (see `reap_expired`), removed from
    /// the queue as they are handed over: the caller kills each one that is still the same
    /// process.
    pub fn take_orphans(&self, host: &str) -> Result<Vec<Orphan>> {
        self.write(|tx, _now| {
            tx.query(
                "DELETE FROM orphans WHERE host = ?1 RETURNING pid, started, task_id",
                args![host],
            )?
            .iter()
            .map(orphan)
            .collect()
        })
    }
}

/// An agent's process from a row of `pid, started, task id`.
fn orphan(r: &Row) -> Result<Orphan> {
    Ok(Orphan { pid: r.get(0)?, started: r.get(1)?, task: r.get::<Option<i64>>(2)?.map(TaskId) })
}
