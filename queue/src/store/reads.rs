//! Reads: one task, a filtered list, the TUI's rows and the queue's status.

use super::*;

impl Store {
    pub fn get(&self, id: TaskId) -> Result<Task> {
        self.read(|conn| load_task(conn, id))
    }

    /// Tasks matching `filter`, newest first.
    pub fn list(&self, filter: &ListFilter) -> Result<Vec<Task>> {
        self.read(|conn| {
            let mut sql = format!("SELECT {TASK_COLUMNS} FROM tasks t WHERE 1=1");
            let mut params: Vec<Arg> = Vec::new();
            match filter.status {
                Some(StatusFilter::Is(s)) => {
                    params.push(s.as_str().into());
                    sql.push_str(&format!(" AND status = ?{}", params.len()));
                }
                Some(StatusFilter::Blocked) => sql.push_str(
                    " AND status = 'queued' AND EXISTS (SELECT 1 FROM task_deps d JOIN tasks p
                       ON p.id = d.depends_on WHERE d.task_id = t.id AND p.status != 'done')",
                ),
                None => {}
            }
            if let Some(repo) = &filter.repo {
                params.push(repo.into());
                sql.push_str(&format!(" AND repo = ?{}", params.len()));
            }
            params.push(filter.limit.map_or(i64::MAX, |l| l as i64).into());
            params.push((filter.offset as i64).into());
            sql.push_str(&format!(
                " ORDER BY id DESC LIMIT ?{} OFFSET ?{}",
                params.len() - 1,
                params.len()
            ));
            let mut tasks = Vec::new();
            for row in conn.query(&sql, &params)? {
                let mut task = task_from_row(&row)?;
                fill_relations(conn, &mut task)?;
                tasks.push(task);
            }
            Ok(tasks)
        })
    }

    /// Light rows for every task matching `status`, newest first, in one query.
    pub fn rows(&self, status: Option<StatusFilter>) -> Result<Vec<TaskRow>> {
        self.read(|conn| {
            let mut sql = String::from(
                "SELECT t.id, t.title, t.status, t.priority, t.repo, t.attempts, t.max_attempts,
                        t.created_at, t.started_at, t.finished_at, t.question,
                        (SELECT group_concat(d.depends_on) FROM task_deps d JOIN tasks p
                          ON p.id = d.depends_on WHERE d.task_id = t.id AND p.status != 'done'),
                        CASE WHEN t.status = 'waiting' THEN t.ask END
                   FROM tasks t",
            );
            let mut params: Vec<Arg> = Vec::new();
            match status {
                Some(StatusFilter::Is(s)) => {
                    sql.push_str(" WHERE t.status = ?1");
                    params.push(s.as_str().into());
                }
                Some(StatusFilter::Blocked) => sql.push_str(
                    " WHERE t.status = 'queued' AND EXISTS (SELECT 1 FROM task_deps d JOIN tasks p
                       ON p.id = d.depends_on WHERE d.task_id = t.id AND p.status != 'done')",
                ),
                None => {}
            }
            sql.push_str(" ORDER BY t.id DESC");
            conn.query(&sql, &params)?
                .iter()
                .map(|r| {
                    Ok(TaskRow {
                        id: TaskId(r.get(0)?),
                        title: r.get(1)?,
                        status: status_from_str(&r.get::<String>(2)?)?,
                        priority: r.get(3)?,
                        repo: r.get(4)?,
                        attempts: r.get(5)?,
                        max_attempts: r.get(6)?,
                        created_at: r.get(7)?,
                        started_at: r.get(8)?,
                        finished_at: r.get(9)?,
                        question: r.get(10)?,
                        waiting_on: id_list(r.get(11)?),
                        ask: r
                            .get::<Option<String>>(12)?
                            .and_then(|a| serde_json::from_str(&a).ok())
                            .map(Box::new),
                    })
                })
                .collect()
        })
    }

    pub fn queue_status(&self) -> Result<QueueStatus> {
        let workers = self.list_workers()?;
        self.read(|conn| {
            let mut counts: BTreeMap<String, i64> =
                TaskStatus::ALL.iter().map(|s| (s.as_str().to_owned(), 0)).collect();
            counts.insert("blocked".into(), 0);
            let mut total = 0;
            for row in conn.query("SELECT status, count(*) FROM tasks GROUP BY status", &[])? {
                let (s, n): (String, i64) = (row.get(0)?, row.get(1)?);
                total += n;
                counts.insert(s, n);
            }
            let blocked: i64 = conn
                .query_one(
                    "SELECT count(*) FROM tasks t WHERE status = 'queued' AND EXISTS (SELECT 1 FROM
                       task_deps d JOIN tasks p ON p.id = d.depends_on
                       WHERE d.task_id = t.id AND p.status != 'done')",
                    &[],
                )?
                .get(0)?;
            counts.insert("blocked".into(), blocked);
            if let Some(q) = counts.get_mut("queued") {
                *q -= blocked;
            }
            let oldest_queued_age_s: Option<f64> = conn
                .query_one(
                    "SELECT unixepoch('subsec') - min(created_at) FROM tasks
                      WHERE status = 'queued'",
                    &[],
                )?
                .get(0)?;
            let default_model = get_setting(conn, "default_model")?;
            let paused = get_setting(conn, PAUSED)?.is_some();
            let mut spend_today = Spend::default();
            for row in conn.query(
                "SELECT status, coalesce(sum(cost_usd), 0.0),
                        CAST(coalesce(sum(tokens), 0) AS BIGINT)
                   FROM tasks
                  WHERE result IS NOT NULL
                    AND updated_at >= unixepoch('now', 'localtime', 'start of day', 'utc')
                  GROUP BY status",
                &[],
            )? {
                let (status, cost, tokens): (String, f64, i64) =
                    (row.get(0)?, row.get(1)?, row.get(2)?);
                spend_today.cost_usd += cost;
                spend_today.tokens += tokens;
                spend_today.cost_usd_by_status.insert(status, cost);
            }
            let workers_alive = workers.iter().filter(|w| !w.stopped && !w.stale).count();
            Ok(QueueStatus {
                counts,
                total,
                oldest_queued_age_s,
                workers: workers.clone(),
                workers_alive,
                default_model,
                spend_today,
                paused,
            })
        })
    }
}
