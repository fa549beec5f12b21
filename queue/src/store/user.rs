//! What users and planners do to tasks: cancel, retry, answer a decision, notes for the agent,
//! priorities, the record of a merge, and clearing finished tasks.

use super::*;

impl Store {
    /// Cancels a task. Queued and waiting tasks end at once; a running task gets a cancel request
    /// that its worker acts on within a heartbeat.
    pub fn cancel(&self, id: TaskId) -> Result<Task> {
        self.write(|tx, now| {
            let status = status_of(tx, id)?;
            match status {
                TaskStatus::Queued | TaskStatus::Waiting => {
                    end_terminal(tx, now, id, TaskStatus::Cancelled, None, None)?;
                }
                TaskStatus::Running => {
                    tx.exec(
                        "UPDATE tasks SET cancel_requested = 1, updated_at = ?1 WHERE id = ?2",
                        args![now, id.0],
                    )?;
                }
                from => {
                    return Err(Error::InvalidTransition {
                        id,
                        from,
                        action: "cancel",
                        allowed: "queued, running or waiting",
                    });
                }
            }
            load_task(tx, id)
        })
    }

    /// Runs a failed or cancelled task again from a fresh session (its branch and worktree, if
    /// any, are reused). Tasks that failed only because this one did are requeued with it.
    pub fn retry(&self, id: TaskId) -> Result<Task> {
        self.write(|tx, now| {
            let from = status_of(tx, id)?;
            if !matches!(from, TaskStatus::Failed | TaskStatus::Cancelled) {
                return Err(Error::InvalidTransition {
                    id,
                    from,
                    action: "retry",
                    allowed: "failed or cancelled",
                });
            }
            let dead_dep = tx.query_opt(
                "SELECT p.id, p.status FROM task_deps d JOIN tasks p ON p.id = d.depends_on
                  WHERE d.task_id = ?1 AND p.status IN ('failed', 'cancelled') LIMIT 1",
                args![id.0],
            )?;
            if let Some(row) = dead_dep {
                let (dep, status): (i64, String) = (row.get(0)?, row.get(1)?);
                return Err(Error::invalid(
                    "task_id",
                    format!(
                        "task {} depends on task {dep}, which is {status}; retry task {dep} \
                         instead and this one follows",
                        id.0
                    ),
                ));
            }
            let mut stack = vec![id];
            while let Some(t) = stack.pop() {
                tx.exec(
                    "UPDATE tasks SET status = 'queued', attempts = 0, error = NULL,
                       not_before = NULL, finished_at = NULL, cancel_requested = 0,
                       question = NULL, session_id = NULL, pending_answer = NULL, worker = NULL,
                       failed_dependency = NULL, ask = NULL, parked_worker = NULL,
                       updated_at = ?1 WHERE id = ?2",
                    args![now, t.0],
                )?;
                for row in tx.query(
                    "SELECT id FROM tasks WHERE status = 'failed' AND failed_dependency = ?1",
                    args![t.0],
                )? {
                    stack.push(TaskId(row.get(0)?));
                }
            }
            load_task(tx, id)
        })
    }

    /// Answers a waiting task's question; the task is requeued to resume the same agent session.
    /// `by` says who answered (`cli`, `tui`, `mcp:<client>`), recorded with the round. A
    /// structured decision checks the answer first: a permission takes once, always or reject;
    /// a budget stop takes continue (which raises the budget in the same transaction) or stop
    /// (which fails the task, naming the budget and the spend).
    pub fn answer(&self, id: TaskId, answer: &str, by: &str) -> Result<Task> {
        if answer.trim().is_empty() {
            return Err(Error::invalid(
                "answer",
                "it is empty; write the decision the agent asked for",
            ));
        }
        if answer.len() > MAX_PROMPT_BYTES {
            return Err(Error::invalid("answer", "it is over 256 KiB"));
        }
        self.write(|tx, now| {
            let from = status_of(tx, id)?;
            if from != TaskStatus::Waiting {
                return Err(Error::InvalidTransition {
                    id,
                    from,
                    action: "answer",
                    allowed: "waiting (it asked a question)",
                });
            }
            let ask: Option<Ask> = tx
                .query_one("SELECT ask FROM tasks WHERE id = ?1", args![id.0])?
                .get::<Option<String>>(0)?
                .and_then(|a| serde_json::from_str(&a).ok());
            let parsed = match &ask {
                Some(a) => Some(a.parse_answer(answer).map_err(|e| Error::invalid("answer", e))?),
                None => None,
            };
            tx.exec(
                "UPDATE task_questions SET answer = ?1, answered_at = ?2, answered_by = ?4
                  WHERE id = (SELECT max(id) FROM task_questions WHERE task_id = ?3)",
                args![answer.trim(), now, id.0, by],
            )?;
            if let (Some(a), Some(p)) = (&ask, &parsed)
                && let Some(b) = &a.budget
            {
                if *p == Answer::BudgetStop {
                    let spent = match b.limit.as_str() {
                        "cost" => format!("{} of {}", crate::usd(b.spent), crate::usd(b.max)),
                        _ => format!("{} of {} tokens", b.spent, b.max),
                    };
                    let msg = format!(
                        "stopped at its {} budget ({} spent; {by} answered stop); the work so \
                         far is on its branch",
                        b.scope, spent
                    );
                    end_terminal(tx, now, id, TaskStatus::Failed, Some(&msg), None)?;
                    tx.exec(
                        "UPDATE tasks SET failure_kind = ?1 WHERE id = ?2",
                        args![FailureKind::Budget.as_str(), id.0],
                    )?;
                    return load_task(tx, id);
                }
                if let Answer::BudgetContinue(new) = p {
                    let max = new.unwrap_or(b.max + b.original);
                    let (table, key) = match b.scope.as_str() {
                        "batch" => ("budgets", "(SELECT budget_group FROM tasks WHERE id = ?2)"),
                        _ => ("tasks", "?2"),
                    };
                    let sql = if b.limit == "cost" {
                        format!("UPDATE {table} SET max_cost_usd = ?1 WHERE id = {key}")
                    } else {
                        format!(
                            "UPDATE {table} SET max_tokens = CAST(?1 AS BIGINT) WHERE id = {key}"
                        )
                    };
                    tx.exec(&sql, args![max, id.0])?;
                }
            }
            tx.exec(
                "UPDATE tasks SET status = 'queued', pending_answer = ?1, question = NULL,
                   asked_at = NULL, worker = NULL, updated_at = ?2 WHERE id = ?3",
                args![answer.trim(), now, id.0],
            )?;
            load_task(tx, id)
        })
    }

    /// Records that the work of `ids` (a task and the dependencies its branch carries) was
    /// merged into `into` by `commit`. Only done tasks can be merged.
    pub fn record_merge(&self, ids: &[TaskId], into: &str, commit: &str) -> Result<()> {
        self.write(|tx, now| {
            for id in ids {
                let from = status_of(tx, *id)?;
                if from != TaskStatus::Done {
                    return Err(Error::InvalidTransition {
                        id: *id,
                        from,
                        action: "merge_task",
                        allowed: "done",
                    });
                }
                tx.exec(
                    "UPDATE tasks SET merged_into = ?1, merge_commit = ?2, updated_at = ?3
                      WHERE id = ?4",
                    args![into, commit, now, id.0],
                )?;
            }
            Ok(())
        })
    }

    /// Marks notes the claim handed over as not delivered after all (the run could not pass
    /// them to the agent), so the next prompt carries them.
    pub fn undeliver_notes(&self, id: TaskId, token: i64, notes: &[String]) -> Result<()> {
        if notes.is_empty() {
            return Ok(());
        }
        self.write(|tx, _now| {
            holds_lease(tx, id, token)?;
            for note in notes {
                tx.exec(
                    "UPDATE task_notes SET delivered = 0 WHERE task_id = ?1 AND note = ?2",
                    args![id.0, note],
                )?;
            }
            Ok(())
        })
    }

    /// The notes added to a running task since its claim, marked delivered: the worker hands
    /// them to the agent at its next step.
    pub fn take_notes(&self, id: TaskId, token: i64) -> Result<Vec<String>> {
        // Asked every second of a run: a read first, so that no note costs no write.
        let any = self.read(|conn| {
            conn.query_opt(
                "SELECT id FROM task_notes WHERE task_id = ?1 AND delivered = 0 LIMIT 1",
                args![id.0],
            )
            .map(|r| r.is_some())
        })?;
        if !any {
            return Ok(Vec::new());
        }
        self.write(|tx, _now| {
            holds_lease(tx, id, token)?;
            tx.query(
                "UPDATE task_notes SET delivered = ?1 WHERE task_id = ?2 AND delivered = 0
                 RETURNING note",
                args![NOTE_DELIVERED, id.0],
            )?
            .iter()
            .map(|r| r.get::<String>(0))
            .collect()
        })
    }

    /// Records a decision the worker took by itself during a run (a permission request matched
    /// by an earlier `always`), so that the task's history lists every request and its answer.
    pub fn record_decision(
        &self,
        id: TaskId,
        token: i64,
        ask: &Ask,
        answer: &str,
        by: &str,
    ) -> Result<()> {
        let text = ask.text();
        let json =
            serde_json::to_string(ask).map_err(|source| Error::Json { column: "ask", source })?;
        self.write(|tx, now| {
            holds_lease(tx, id, token)?;
            tx.exec(
                "INSERT INTO task_questions (task_id, question, asked_at, ask, answer, answered_at,
                    answered_by) VALUES (?1, ?2, ?3, ?4, ?5, ?3, ?6)",
                args![id.0, &text, now, &json, answer, by],
            )?;
            Ok(())
        })
    }

    /// What a task may still spend: its own budget and its batch's, with the batch's spend so far
    /// (the recorded usage of the batch's other tasks).
    pub fn budget_of(&self, id: TaskId) -> Result<BudgetState> {
        self.read(|conn| {
            let row = conn
                .query_opt(
                    "SELECT max_cost_usd, max_tokens, budget_group FROM tasks WHERE id = ?1",
                    args![id.0],
                )?
                .ok_or(Error::NotFound(id))?;
            let own = Budget { max_cost_usd: row.get(0)?, max_tokens: row.get(1)? };
            let batch = match row.get::<Option<i64>>(2)? {
                None => None,
                Some(g) => {
                    let b = conn.query_one(
                        "SELECT max_cost_usd, max_tokens FROM budgets WHERE id = ?1",
                        args![g],
                    )?;
                    let spent = conn.query_one(
                        "SELECT coalesce(sum(cost_usd), 0.0),
                                CAST(coalesce(sum(tokens), 0) AS BIGINT)
                           FROM tasks WHERE budget_group = ?1 AND id != ?2",
                        args![g, id.0],
                    )?;
                    Some(BatchBudget {
                        budget: Budget { max_cost_usd: b.get(0)?, max_tokens: b.get(1)? },
                        others_cost_usd: spent.get(0)?,
                        others_tokens: spent.get(1)?,
                    })
                }
            };
            Ok(BudgetState { own, batch })
        })
    }

    /// Adds a note. A queued task's agent gets it with the prompt; a waiting one with the answer;
    /// a running one at its next resume.
    pub fn add_note(&self, id: TaskId, note: &str) -> Result<Task> {
        if note.trim().is_empty() {
            return Err(Error::invalid("note", "it is empty"));
        }
        if note.len() > MAX_PROMPT_BYTES {
            return Err(Error::invalid("note", "it is over 256 KiB"));
        }
        self.write(|tx, now| {
            let from = status_of(tx, id)?;
            if from.is_terminal() {
                return Err(Error::InvalidTransition {
                    id,
                    from,
                    action: "add_note",
                    allowed: "queued, running or waiting",
                });
            }
            tx.exec(
                "INSERT INTO task_notes (task_id, note, created_at) VALUES (?1, ?2, ?3)",
                args![id.0, note, now],
            )?;
            tx.exec("UPDATE tasks SET updated_at = ?1 WHERE id = ?2", args![now, id.0])?;
            load_task(tx, id)
        })
    }

    /// Replaces a queued task's prompt (and its title, when given) before any worker has run
    /// it: once an attempt ran, the agent's session holds the old prompt.
    pub fn edit_task(&self, id: TaskId, prompt: &str, title: Option<&str>) -> Result<Task> {
        if prompt.trim().is_empty() {
            return Err(Error::invalid("prompt", "the new prompt is empty; say what to do"));
        }
        if title.is_some_and(|t| t.trim().is_empty()) {
            return Err(Error::invalid("title", "the new title is empty; leave it out to keep it"));
        }
        self.write(|tx, now| {
            let from = status_of(tx, id)?;
            let row = tx.query_one(
                "SELECT attempts, pending_answer IS NOT NULL FROM tasks WHERE id = ?1",
                args![id.0],
            )?;
            let (attempts, resumes): (i64, bool) = (row.get(0)?, row.get(1)?);
            if from != TaskStatus::Queued || attempts > 0 || resumes {
                return Err(Error::InvalidTransition {
                    id,
                    from,
                    action: "edit",
                    allowed: "queued and not yet run (a task that ran keeps its prompt; \
                              add a note, or cancel it and submit anew)",
                });
            }
            tx.exec(
                "UPDATE tasks SET prompt = ?1, title = coalesce(?2, title), updated_at = ?3
                  WHERE id = ?4",
                args![prompt, title, now, id.0],
            )?;
            load_task(tx, id)
        })
    }

    pub fn set_priority(&self, id: TaskId, priority: i64) -> Result<Task> {
        if !PRIORITY_RANGE.contains(&priority) {
            return Err(Error::invalid(
                "priority",
                format!("{priority} is out of range; use an integer from -100 to 100"),
            ));
        }
        self.write(|tx, now| {
            let from = status_of(tx, id)?;
            if from.is_terminal() {
                return Err(Error::InvalidTransition {
                    id,
                    from,
                    action: "set_priority",
                    allowed: "queued, running or waiting",
                });
            }
            tx.exec(
                "UPDATE tasks SET priority = ?1, updated_at = ?2 WHERE id = ?3",
                args![priority, now, id.0],
            )?;
            load_task(tx, id)
        })
    }

    /// Deletes finished tasks in `statuses` that finished at least `older_than_s` ago and
    /// returns them, so the caller can remove their logs and worktrees.
    /// `under`: only tasks whose repository is one of these directories or below one (a server
    /// restricted to repository roots clears its own); empty for every task.
    pub fn clear_finished(
        &self,
        older_than_s: f64,
        statuses: &[TaskStatus],
        under: &[String],
    ) -> Result<Vec<Task>> {
        if let Some(s) = statuses.iter().find(|s| !s.is_terminal()) {
            return Err(Error::invalid(
                "statuses",
                format!(
                    "'{s}' tasks are not finished; only done, failed and cancelled can be cleared"
                ),
            ));
        }
        if older_than_s < 0.0 || !older_than_s.is_finite() {
            return Err(Error::invalid("older_than_s", "use a duration of 0 or more seconds"));
        }
        self.write(|tx, now| {
            let mut out = Vec::new();
            for s in statuses {
                let ids = tx.query(
                    "SELECT id FROM tasks WHERE status = ?1
                        AND coalesce(finished_at, updated_at) <= ?2 FOR UPDATE",
                    args![s.as_str(), now - older_than_s],
                )?;
                for row in ids {
                    let id: i64 = row.get(0)?;
                    let task = load_task(tx, TaskId(id))?;
                    if !under.is_empty() && !under.iter().any(|root| path_under(&task.repo, root)) {
                        continue;
                    }
                    out.push(task);
                    tx.exec("DELETE FROM tasks WHERE id = ?1", args![id])?;
                }
            }
            Ok(out)
        })
    }
}
