//! What a run records while it goes (session, branch, start) and how it finishes: the outcome
//! applied under the run's lease, as one transition.

use super::*;

/// Facts recorded during a run; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct RunFacts {
    pub agent_pid: Option<i64>,
    pub agent_started: Option<String>,
    pub session_id: Option<String>,
    pub branch: Option<String>,
    pub worktree: Option<String>,
    /// The result so far (a running task's spend), replaced by the final one when it ends.
    pub result: Option<TaskResult>,
    /// The commit the branch started from, and the dependencies whose work that is.
    pub started_from: Option<String>,
    pub stacked_on: Option<Vec<TaskId>>,
}

impl Store {
    /// Records facts about the current run (agent process, session, branch) under the lease.
    pub fn record_run(&self, id: TaskId, token: i64, facts: RunFacts) -> Result<()> {
        let stacked_on = facts.stacked_on.as_ref().map(|ids| {
            serde_json::Value::from(ids.iter().map(|i| i.0).collect::<Vec<_>>()).to_string()
        });
        self.write(|tx, now| {
            let n = tx.exec(
                "UPDATE tasks SET agent_pid = coalesce(?1, agent_pid),
                    agent_started = coalesce(?2, agent_started),
                    session_id = coalesce(?3, session_id), branch = coalesce(?4, branch),
                    worktree = coalesce(?5, worktree), started_from = coalesce(?9, started_from),
                    stacked_on = coalesce(?10, stacked_on), updated_at = ?6
                 WHERE id = ?7 AND lease_token = ?8 AND status = 'running'",
                args![
                    facts.agent_pid,
                    &facts.agent_started,
                    &facts.session_id,
                    &facts.branch,
                    &facts.worktree,
                    now,
                    id.0,
                    token,
                    &facts.started_from,
                    &stacked_on,
                ],
            )?;
            if n == 0 {
                return Err(Error::StaleLease { id, token });
            }
            write_result(tx, id, facts.result.as_ref())
        })
    }

    /// Ends a run. Rejected with [`Error::StaleLease`] unless `token` is the current one and the
    /// task is still running: a worker that lost its lease cannot overwrite the next run's work.
    pub fn finish(&self, id: TaskId, token: i64, outcome: Outcome) -> Result<Task> {
        let waiting_ask = match &outcome {
            Outcome::Waiting { ask: Some(a), .. } => Some(
                serde_json::to_string(a).map_err(|source| Error::Json { column: "ask", source })?,
            ),
            _ => None,
        };
        self.write(|tx, now| {
            let row = tx.query_opt(
                "SELECT attempts, max_attempts FROM tasks
                  WHERE id = ?1 AND lease_token = ?2 AND status = 'running' FOR UPDATE",
                args![id.0, token],
            )?;
            let Some(row) = row else {
                return Err(Error::StaleLease { id, token });
            };
            let (attempts, max_attempts): (i64, i64) = (row.get(0)?, row.get(1)?);
            // Fields every end of a run clears (a wait then sets the decision and who holds it;
            // PostgreSQL refuses a column assigned twice, SQLite would take the last).
            const END_RUN_KEEPING_ASK: &str = "lease_until = NULL, pending_answer = NULL, \
                cancel_requested = 0, agent_pid = NULL, agent_started = NULL";
            const END_RUN: &str = "lease_until = NULL, pending_answer = NULL, \
                cancel_requested = 0, agent_pid = NULL, agent_started = NULL, ask = NULL, \
                parked_worker = NULL";
            match &outcome {
                Outcome::Done { result } => {
                    tx.exec(
                        &format!(
                            "UPDATE tasks SET status = 'done', error = NULL, failure_kind = NULL,
                               question = NULL, finished_at = ?1, updated_at = ?1, {END_RUN}
                             WHERE id = ?2"
                        ),
                        args![now, id.0],
                    )?;
                    write_result(tx, id, Some(result))?;
                    notes_ended_first(tx, id)?;
                }
                Outcome::Failed { error, kind, result, backoff_s } if attempts < max_attempts => {
                    // A run that was delivering an answer keeps it, so the next attempt still
                    // delivers it; that attempt is counted here, since a resuming claim does
                    // not count one.
                    tx.exec(
                        "UPDATE tasks SET status = 'queued', error = ?1, failure_kind = ?5,
                           worker = NULL, not_before = ?2 + ?3, updated_at = ?2,
                           attempts = attempts + CASE WHEN pending_answer IS NULL THEN 0 ELSE 1 END,
                           lease_until = NULL, cancel_requested = 0, agent_pid = NULL,
                           agent_started = NULL, parked_worker = NULL
                         WHERE id = ?4",
                        args![error, now, backoff_s.max(0.0), id.0, kind.as_str()],
                    )?;
                    write_result(tx, id, result.as_deref())?;
                }
                Outcome::Failed { error, kind, result, .. }
                | Outcome::FailedPermanently { error, kind, result } => {
                    end_terminal(tx, now, id, TaskStatus::Failed, Some(error), result.as_deref())?;
                    tx.exec(
                        "UPDATE tasks SET failure_kind = ?1 WHERE id = ?2",
                        args![kind.as_str(), id.0],
                    )?;
                }
                Outcome::Released => {
                    tx.exec(
                        "UPDATE tasks SET status = 'queued', worker = NULL, lease_until = NULL,
                           attempts = CASE WHEN pending_answer IS NULL AND attempts > 0
                                THEN attempts - 1 ELSE attempts END,
                           cancel_requested = 0, agent_pid = NULL, agent_started = NULL,
                           updated_at = ?1
                         WHERE id = ?2",
                        args![now, id.0],
                    )?;
                }
                Outcome::Cancelled { result } => {
                    end_terminal(tx, now, id, TaskStatus::Cancelled, None, result.as_deref())?;
                }
                Outcome::Waiting { question, session_id, result, ask } => {
                    let parked = ask.as_ref().is_some_and(|a| a.request_id.is_some());
                    tx.exec(
                        &format!(
                            "UPDATE tasks SET status = 'waiting', question = ?1, session_id = ?2,
                               asked_at = ?3, updated_at = ?3,
                               {END_RUN_KEEPING_ASK}, ask = ?5,
                               parked_worker = CASE WHEN ?6 = 1 THEN worker ELSE NULL END
                             WHERE id = ?4"
                        ),
                        args![question, session_id, now, id.0, &waiting_ask, parked],
                    )?;
                    write_result(tx, id, result.as_deref())?;
                    tx.exec(
                        "INSERT INTO task_questions (task_id, question, asked_at, ask)
                         VALUES (?1, ?2, ?3, ?4)",
                        args![id.0, question, now, &waiting_ask],
                    )?;
                }
            }
            load_task(tx, id)
        })
    }
}
