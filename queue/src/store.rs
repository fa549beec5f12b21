//! The store: every state transition is one transaction here, written once for both backends
//! against [`crate::sql::Tx`]. SQLite (`sqlite`) serialises writers with `BEGIN
//! IMMEDIATE`; PostgreSQL (`pg`) locks the rows each transition decides on. The few
//! statements whose dialects differ branch on [`Dialect`].

use crate::error::{Error, Result};
use crate::location::Location;
use crate::model::*;
use crate::sql::{Arg, Dialect, Row, Tx, args};
use crate::sqlite::Durability;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A worker with no heartbeat for this long is reported as stale.
pub const WORKER_STALE_AFTER_S: f64 = 30.0;

type Listener = Arc<dyn Fn() + Send + Sync>;

// One per open store: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Backend {
    Sqlite(crate::sqlite::Db),
    Postgres(crate::pg::Db),
}

/// A handle on the queue database. Cheap to share behind an `Arc`; every method takes `&self`.
/// Writes serialise on one connection per process (SQLite serialises writers anyway; on
/// PostgreSQL other processes and hosts write beside it).
pub struct Store {
    pub(crate) backend: Backend,
    location: Location,
    listeners: Mutex<Vec<Listener>>,
}

const TASK_COLUMNS: &str = "id, title, prompt, repo, base, priority, model, agent, readonly, \
    no_network, no_shell, worktree_keep, max_attempts, timeout_s, question_timeout_s, request_id, \
    status, question, session_id, result, error, attempts, worker, lease_until, cancel_requested, \
    branch, worktree, created_at, started_at, finished_at, updated_at, not_before, ask, ask_rules, \
    max_cost_usd, max_tokens, budget_group, base_ref, started_from, stacked_on, merged_into, \
    merge_commit, parent, remote, worker_host";

fn status_from_str(s: &str) -> Result<TaskStatus> {
    s.parse().map_err(|message: String| Error::Decode { column: 0, message })
}

fn task_from_row(row: &Row) -> Result<Task> {
    let status = status_from_str(&row.get::<String>(16)?)?;
    let result = match row.get::<Option<String>>(19)? {
        Some(text) => Some(
            serde_json::from_str(&text)
                .map_err(|source| Error::Json { column: "result", source })?,
        ),
        None => None,
    };
    let json_col = |i: usize| -> Result<Option<serde_json::Value>> {
        Ok(row.get::<Option<String>>(i)?.and_then(|text| serde_json::from_str(&text).ok()))
    };
    // The decision is shown only while it is pending; after the answer it waits for the claim
    // that delivers it.
    let ask = match status {
        TaskStatus::Waiting => json_col(32)?.and_then(|v| serde_json::from_value(v).ok()),
        _ => None,
    };
    let ask_rules = json_col(33)?.and_then(|v| serde_json::from_value(v).ok()).unwrap_or_default();
    Ok(Task {
        id: TaskId(row.get(0)?),
        title: row.get(1)?,
        prompt: row.get(2)?,
        repo: row.get(3)?,
        base: row.get(4)?,
        priority: row.get(5)?,
        depends_on: Vec::new(),
        waiting_on: Vec::new(),
        model: row.get(6)?,
        agent: row.get(7)?,
        readonly: row.get(8)?,
        no_network: row.get(9)?,
        no_shell: row.get(10)?,
        worktree_keep: row.get(11)?,
        max_attempts: row.get(12)?,
        timeout_s: row.get(13)?,
        question_timeout_s: row.get(14)?,
        request_id: row.get(15)?,
        status,
        display_status: status.as_str().to_owned(),
        question: row.get(17)?,
        ask,
        questions: Vec::new(),
        notes: Vec::new(),
        ask_rules,
        budget: Budget { max_cost_usd: row.get(34)?, max_tokens: row.get(35)? },
        budget_group: row.get(36)?,
        base_ref: row.get(37)?,
        remote: row.get(43)?,
        worker_host: row.get(44)?,
        started_from: row.get(38)?,
        stacked_on: json_col(39)?
            .and_then(|v| serde_json::from_value::<Vec<i64>>(v).ok())
            .unwrap_or_default()
            .into_iter()
            .map(TaskId)
            .collect(),
        merged_into: row.get(40)?,
        merge_commit: row.get(41)?,
        dependents: Vec::new(),
        parent: row.get::<Option<i64>>(42)?.map(TaskId),
        followups: Vec::new(),
        session_id: row.get(18)?,
        result,
        error: row.get(20)?,
        attempts: row.get(21)?,
        worker: row.get(22)?,
        lease_until: row.get(23)?,
        cancel_requested: row.get(24)?,
        branch: row.get(25)?,
        worktree: row.get(26)?,
        created_at: row.get(27)?,
        started_at: row.get(28)?,
        finished_at: row.get(29)?,
        updated_at: row.get(30)?,
        not_before: row.get(31)?,
    })
}

fn default_title(prompt: &str) -> String {
    let line = prompt.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    let mut title: String = line.chars().take(80).collect();
    if line.chars().count() > 80 {
        title.push('…');
    }
    title
}

fn validate(spec: &TaskSpec) -> Result<()> {
    if spec.prompt.trim().is_empty() {
        return Err(Error::invalid("prompt", "it is empty; describe the change you want made"));
    }
    if spec.prompt.len() > MAX_PROMPT_BYTES {
        return Err(Error::invalid(
            "prompt",
            format!(
                "it is {} bytes and the limit is {MAX_PROMPT_BYTES} (256 KiB); put large context \
                 in a file in the repository and refer to it",
                spec.prompt.len()
            ),
        ));
    }
    if !PRIORITY_RANGE.contains(&spec.priority) {
        return Err(Error::invalid(
            "priority",
            format!("{} is out of range; use an integer from -100 to 100", spec.priority),
        ));
    }
    if !(1..=20).contains(&spec.max_attempts) {
        return Err(Error::invalid(
            "max_attempts",
            format!("{} is out of range; use 1 to 20", spec.max_attempts),
        ));
    }
    if !(1..=7 * 86_400).contains(&spec.timeout_s) {
        return Err(Error::invalid(
            "timeout_s",
            format!("{} is out of range; use 1 to 604800 seconds", spec.timeout_s),
        ));
    }
    if let Some(q) = spec.question_timeout_s
        && q < 1
    {
        return Err(Error::invalid("question_timeout_s", "must be at least 1 second"));
    }
    if !Path::new(&spec.repo).is_absolute() {
        return Err(Error::invalid(
            "repo",
            format!("'{}' is not an absolute path to a repository", spec.repo),
        ));
    }
    if spec.base.trim().is_empty() {
        return Err(Error::invalid("base", "no base commit was resolved"));
    }
    if let Some(model) = &spec.model {
        let ok = model.split_once('/').is_some_and(|(p, m)| !p.is_empty() && !m.is_empty());
        if !ok {
            return Err(Error::invalid(
                "model",
                format!(
                    "'{model}' is not of the form provider/model, e.g. anthropic/claude-sonnet-4-5"
                ),
            ));
        }
    }
    if let Some(title) = &spec.title
        && title.chars().count() > 200
    {
        return Err(Error::invalid("title", "it is longer than 200 characters"));
    }
    if let Some(key) = &spec.request_id
        && (key.is_empty() || key.len() > 200)
    {
        return Err(Error::invalid("request_id", "use 1 to 200 characters"));
    }
    for rule in &spec.ask {
        parse_ask_rule(rule).map_err(|e| Error::invalid("ask", e))?;
    }
    validate_budget(&spec.budget)
}

fn validate_budget(b: &Budget) -> Result<()> {
    if let Some(c) = b.max_cost_usd
        && !(c > 0.0 && c.is_finite())
    {
        return Err(Error::invalid(
            "max_cost_usd",
            format!("{c} is not a positive amount of US dollars, e.g. 0.50"),
        ));
    }
    if let Some(t) = b.max_tokens
        && t < 1
    {
        return Err(Error::invalid(
            "max_tokens",
            format!("{t} is not a positive number of tokens"),
        ));
    }
    Ok(())
}

/// Finds a cycle among batch items (existing tasks cannot depend on new ones, so a cycle can only
/// run through the batch). Returns the path, e.g. `#0 -> #2 -> #0`.
fn batch_cycle(specs: &[TaskSpec]) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Closed,
    }
    fn visit(i: usize, specs: &[TaskSpec], marks: &mut [Mark], path: &mut Vec<usize>) -> bool {
        marks[i] = Mark::Open;
        path.push(i);
        for dep in &specs[i].depends_on {
            if let DepRef::Batch(j) = *dep {
                let mark = marks[j];
                if mark == Mark::Open {
                    path.push(j);
                    return true;
                }
                if mark == Mark::New && visit(j, specs, marks, path) {
                    return true;
                }
            }
        }
        path.pop();
        marks[i] = Mark::Closed;
        false
    }
    let mut marks = vec![Mark::New; specs.len()];
    for i in 0..specs.len() {
        let mut path = Vec::new();
        if marks[i] == Mark::New && visit(i, specs, &mut marks, &mut path) {
            let last = *path.last()?;
            let start = path.iter().position(|&p| p == last)?;
            return Some(path[start..].iter().map(|i| format!("#{i}")).collect());
        }
    }
    None
}

impl Store {
    /// Opens (creating if needed, mode 0600) the SQLite database at `path` and brings its schema
    /// up to date. The parent directory must exist.
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        Store::connect(&Location::Sqlite(path.as_ref().to_path_buf()))
    }

    /// Opens the queue at `location` (a SQLite file or a PostgreSQL schema) and brings its
    /// schema up to date.
    pub fn connect(location: &Location) -> Result<Store> {
        let backend = match location {
            Location::Sqlite(path) => Backend::Sqlite(crate::sqlite::Db::open(path)?),
            Location::Postgres(url) => Backend::Postgres(crate::pg::Db::open(url)?),
        };
        Ok(Store { backend, location: location.clone(), listeners: Mutex::new(Vec::new()) })
    }

    pub fn location(&self) -> &Location {
        &self.location
    }

    /// The SQLite file, when that is the backend.
    pub fn path(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Sqlite(db) => Some(db.path()),
            Backend::Postgres(_) => None,
        }
    }

    /// Registers a callback run after every committed write made through this handle. Writers in
    /// other processes are seen through [`crate::watch::ChangeWatcher`] instead.
    pub fn on_change(&self, f: impl Fn() + Send + Sync + 'static) {
        self.listeners.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::new(f));
    }

    pub(crate) fn write<T: Send>(
        &self,
        f: impl FnMut(&mut dyn Tx, f64) -> Result<T> + Send,
    ) -> Result<T> {
        self.write_with(Durability::Full, f)
    }

    /// Runs `f` as one transaction with the database's time read inside it. On PostgreSQL `f`
    /// may run more than once (after a lost connection or a deadlock, each rolled back), so it
    /// must decide from what it reads, never from state of its own.
    fn write_with<T: Send>(
        &self,
        durability: Durability,
        mut f: impl FnMut(&mut dyn Tx, f64) -> Result<T> + Send,
    ) -> Result<T> {
        let (out, changed) = match &self.backend {
            Backend::Sqlite(db) => db.write(durability, &mut f)?,
            // A claim is not made crash-safe-only here: the database server can crash without
            // the workers, which would then run a task whose claim was lost.
            Backend::Postgres(db) => db.write(&mut f)?,
        };
        // Only real changes wake listeners: a claim that found nothing must not wake the claim
        // loop that made it.
        if !changed {
            return Ok(out);
        }
        let listeners = self.listeners.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for l in listeners {
            l();
        }
        Ok(out)
    }

    pub(crate) fn read<T: Send>(
        &self,
        mut f: impl FnMut(&mut dyn Tx) -> Result<T> + Send,
    ) -> Result<T> {
        match &self.backend {
            Backend::Sqlite(db) => db.read(&mut f),
            Backend::Postgres(db) => db.read(&mut f),
        }
    }

    fn exec_alone(&self, sql: &str, args: &[Arg]) -> Result<u64> {
        match &self.backend {
            Backend::Sqlite(db) => db.exec_alone(sql, args),
            Backend::Postgres(db) => db.exec_alone(sql, args),
        }
    }

    // ---- submit -------------------------------------------------------------------------------

    /// Submits one task. With a `request_id` that was seen before, returns the first task and
    /// `false` instead of creating another.
    pub fn submit(&self, spec: TaskSpec) -> Result<(Task, bool)> {
        let mut out = self.submit_batch(vec![spec])?;
        out.pop().ok_or_else(|| Error::invalid("tasks", "nothing was submitted"))
    }

    /// Submits several tasks at once, all or none. Items may depend on each other by index
    /// (`DepRef::Batch`); a cycle is refused.
    pub fn submit_batch(&self, specs: Vec<TaskSpec>) -> Result<Vec<(Task, bool)>> {
        self.submit_batch_budgeted(specs, Budget::default())
    }

    /// [`Store::submit_batch`] with one budget shared by the batch's new tasks (each may also
    /// have its own).
    pub fn submit_batch_budgeted(
        &self,
        specs: Vec<TaskSpec>,
        shared: Budget,
    ) -> Result<Vec<(Task, bool)>> {
        validate_budget(&shared)?;
        if specs.is_empty() {
            return Err(Error::invalid("tasks", "the batch is empty; give 1 to 20 tasks"));
        }
        for (i, spec) in specs.iter().enumerate() {
            validate(spec).map_err(|e| match e {
                Error::Invalid { field, message } if specs.len() > 1 => {
                    Error::Invalid { field, message: format!("task #{i} of the batch: {message}") }
                }
                other => other,
            })?;
            for dep in &spec.depends_on {
                if let DepRef::Batch(j) = *dep
                    && j >= specs.len()
                {
                    return Err(Error::invalid(
                        "depends_on",
                        format!("'#{j}' names no item of this batch (it has {})", specs.len()),
                    ));
                }
            }
        }
        if let Some(cycle) = batch_cycle(&specs) {
            return Err(Error::DependencyCycle(cycle));
        }
        let ids = self.write(|tx, now| {
            let mut ids: Vec<(TaskId, bool)> = Vec::with_capacity(specs.len());
            let group: Option<i64> = if shared.is_set() {
                Some(
                    tx.query_one(
                        "INSERT INTO budgets (max_cost_usd, max_tokens, created_at)
                         VALUES (?1, ?2, ?3) RETURNING id",
                        args![shared.max_cost_usd, shared.max_tokens, now],
                    )?
                    .get(0)?,
                )
            } else {
                None
            };
            for spec in &specs {
                let title = spec
                    .title
                    .clone()
                    .filter(|t| !t.trim().is_empty())
                    .unwrap_or_else(|| default_title(&spec.prompt));
                // A request id seen before gives the first task back. ON CONFLICT makes a
                // concurrent duplicate wait for the first one's commit instead of failing.
                let inserted = tx.query_opt(
                    "INSERT INTO tasks (title, prompt, repo, base, priority, model, agent, readonly,
                        no_network, no_shell, worktree_keep, max_attempts, timeout_s,
                        question_timeout_s, request_id, status, created_at, updated_at,
                        ask_rules, max_cost_usd, max_tokens, budget_group, base_ref, parent,
                        session_id, remote, worker_host)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15,
                        'queued', ?16, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25)
                     ON CONFLICT (request_id) DO NOTHING RETURNING id",
                    args![
                        title,
                        &spec.prompt,
                        &spec.repo,
                        &spec.base,
                        spec.priority,
                        &spec.model,
                        &spec.agent,
                        spec.readonly,
                        spec.no_network,
                        spec.no_shell,
                        spec.worktree_keep,
                        spec.max_attempts,
                        spec.timeout_s,
                        spec.question_timeout_s,
                        &spec.request_id,
                        now,
                        (!spec.ask.is_empty())
                            .then(|| serde_json::Value::from(spec.ask.clone()).to_string()),
                        spec.budget.max_cost_usd,
                        spec.budget.max_tokens,
                        group,
                        &spec.base_ref,
                        spec.parent.map(|p| p.0),
                        &spec.session_id,
                        &spec.remote,
                        &spec.session_host,
                    ],
                )?;
                match inserted {
                    Some(row) => ids.push((TaskId(row.get(0)?), true)),
                    None => {
                        let key = spec.request_id.clone();
                        let id: i64 = tx
                            .query_one("SELECT id FROM tasks WHERE request_id = ?1", args![key])?
                            .get(0)?;
                        ids.push((TaskId(id), false));
                    }
                }
            }
            for (spec, &(id, created)) in specs.iter().zip(&ids) {
                if !created {
                    continue;
                }
                for dep in &spec.depends_on {
                    let dep_id = match *dep {
                        DepRef::Task(t) => t,
                        DepRef::Batch(j) => ids[j].0,
                    };
                    if dep_id == id {
                        return Err(Error::DependencyCycle(vec![id.to_string(), id.to_string()]));
                    }
                    // Locked, so that the dependency cannot fail between this check and the
                    // new edge (its failure would not reach a task it cannot see yet).
                    let status: Option<String> = tx
                        .query_opt(
                            "SELECT status FROM tasks WHERE id = ?1 FOR UPDATE",
                            args![dep_id.0],
                        )?
                        .map(|r| r.get(0))
                        .transpose()?;
                    match status.as_deref() {
                        None => {
                            return Err(Error::invalid(
                                "depends_on",
                                format!("task {} does not exist", dep_id.0),
                            ));
                        }
                        Some("failed") | Some("cancelled") => {
                            return Err(Error::invalid(
                                "depends_on",
                                format!(
                                    "task {} is {}, so this task could never run; retry it first",
                                    dep_id.0,
                                    status.unwrap_or_default()
                                ),
                            ));
                        }
                        Some(_) => {}
                    }
                    tx.exec(
                        "INSERT INTO task_deps (task_id, depends_on) VALUES (?1, ?2)
                         ON CONFLICT DO NOTHING",
                        args![id.0, dep_id.0],
                    )?;
                }
            }
            Ok(ids)
        })?;
        self.read(|conn| {
            ids.iter().map(|&(id, created)| Ok((load_task(conn, id)?, created))).collect()
        })
    }

    // ---- reads --------------------------------------------------------------------------------

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
            let mut spend_today = Spend::default();
            for row in conn.query(
                "SELECT status, coalesce(sum(json_extract(result, '$.usage.cost_usd')), 0.0),
                        CAST(coalesce(sum(json_extract(result, '$.usage.input_tokens')
                          + json_extract(result, '$.usage.output_tokens')), 0) AS BIGINT)
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
            })
        })
    }

    // ---- the worker's side -------------------------------------------------------------------

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
        const SET: &str = "status = 'running', worker = ?1, worker_host = ?2,
            lease_token = lease_token + 1, lease_until = ?3 + ?4,
            attempts = attempts + CASE WHEN pending_answer IS NULL THEN 1 ELSE 0 END,
            started_at = coalesce(started_at, ?3), updated_at = ?3,
            agent_pid = NULL, agent_started = NULL, cancel_requested = 0,
            not_before = NULL, parked_worker = NULL";
        const RUNNABLE: &str = "t.status = 'queued'
            AND (t.not_before IS NULL OR t.not_before <= ?3)
            AND NOT EXISTS (SELECT 1 FROM task_deps d JOIN tasks p
                 ON p.id = d.depends_on WHERE d.task_id = t.id AND p.status != 'done')
            AND (t.parked_worker IS NULL OR t.parked_worker = ?1
                 OR NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = t.parked_worker
                     AND w.stopped_at IS NULL AND w.heartbeat_at > ?3 - ?5))
            AND (t.session_id IS NULL OR t.worker_host IS NULL OR t.worker_host = ?2
                 OR NOT EXISTS (SELECT 1 FROM workers w WHERE w.host = t.worker_host
                     AND w.stopped_at IS NULL AND w.heartbeat_at > ?3 - ?5))
            AND (t.agent IS NULL OR t.agent NOT IN ('claude-code', 'codex')
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
                 RETURNING id, lease_token, session_id, pending_answer, ask"
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
                    tasks.pending_answer, tasks.ask",
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
            Ok(Some((TaskId(id), token, resume, new_notes)))
        })?;
        let Some((id, token, resume, new_notes)) = claimed else { return Ok(None) };
        let task = self.get(id)?;
        Ok(Some(Claim { task, token, resume, new_notes }))
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

    /// Records facts about the current run (agent process, session, branch) under the lease.
    pub fn record_run(&self, id: TaskId, token: i64, facts: RunFacts) -> Result<()> {
        let result = facts.result.as_ref().map(|v| v.to_string());
        let stacked_on = facts.stacked_on.as_ref().map(|ids| {
            serde_json::Value::from(ids.iter().map(|i| i.0).collect::<Vec<_>>()).to_string()
        });
        self.write(|tx, now| {
            let n = tx.exec(
                "UPDATE tasks SET agent_pid = coalesce(?1, agent_pid),
                    agent_started = coalesce(?2, agent_started),
                    session_id = coalesce(?3, session_id), branch = coalesce(?4, branch),
                    worktree = coalesce(?5, worktree), result = coalesce(?9, result),
                    started_from = coalesce(?10, started_from),
                    stacked_on = coalesce(?11, stacked_on), updated_at = ?6
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
                    &result,
                    &facts.started_from,
                    &stacked_on,
                ],
            )?;
            if n == 0 { Err(Error::StaleLease { id, token }) } else { Ok(()) }
        })
    }

    /// Ends a run. Rejected with [`Error::StaleLease`] unless `token` is the current one and the
    /// task is still running: a worker that lost its lease cannot overwrite the next run's work.
    pub fn finish(&self, id: TaskId, token: i64, outcome: Outcome) -> Result<Task> {
        let json = |v: &Option<serde_json::Value>| v.as_ref().map(|v| v.to_string());
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
                            "UPDATE tasks SET status = 'done', result = ?1, error = NULL,
                               question = NULL, finished_at = ?2, updated_at = ?2, {END_RUN}
                             WHERE id = ?3"
                        ),
                        args![result.to_string(), now, id.0],
                    )?;
                    notes_ended_first(tx, id)?;
                }
                Outcome::Failed { error, result, backoff_s } if attempts < max_attempts => {
                    // A run that was delivering an answer keeps it, so the next attempt still
                    // delivers it; that attempt is counted here, since a resuming claim does
                    // not count one.
                    tx.exec(
                        "UPDATE tasks SET status = 'queued', result = coalesce(?1, result), error = ?2,
                           worker = NULL, not_before = ?3 + ?4, updated_at = ?3,
                           attempts = attempts + CASE WHEN pending_answer IS NULL THEN 0 ELSE 1 END,
                           lease_until = NULL, cancel_requested = 0, agent_pid = NULL,
                           agent_started = NULL, parked_worker = NULL
                         WHERE id = ?5",
                        args![json(result), error, now, backoff_s.max(0.0), id.0],
                    )?;
                }
                Outcome::Failed { error, result, .. }
                | Outcome::FailedPermanently { error, result } => {
                    end_terminal(tx, now, id, TaskStatus::Failed, Some(error), json(result))?;
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
                    end_terminal(tx, now, id, TaskStatus::Cancelled, None, json(result))?;
                }
                Outcome::Waiting { question, session_id, result, ask } => {
                    let parked = ask.as_ref().is_some_and(|a| a.request_id.is_some());
                    tx.exec(
                        &format!(
                            "UPDATE tasks SET status = 'waiting', question = ?1, session_id = ?2,
                               asked_at = ?3, result = coalesce(?4, result), updated_at = ?3,
                               {END_RUN_KEEPING_ASK}, ask = ?6,
                               parked_worker = CASE WHEN ?7 = 1 THEN worker ELSE NULL END
                             WHERE id = ?5"
                        ),
                        args![question, session_id, now, json(result), id.0, &waiting_ask, parked],
                    )?;
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
            .map(|r| {
                Ok(Orphan {
                    pid: r.get(0)?,
                    started: r.get(1)?,
                    task: r.get::<Option<i64>>(2)?.map(TaskId),
                })
            })
            .collect()
        })
    }

    // ---- the user's side ---------------------------------------------------------------------

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
                        "SELECT coalesce(sum(json_extract(result, '$.usage.cost_usd')), 0.0),
                                CAST(coalesce(sum(json_extract(result, '$.usage.input_tokens')
                                  + json_extract(result, '$.usage.output_tokens')), 0) AS BIGINT)
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

    // ---- workers and settings ----------------------------------------------------------------

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

    /// Workers that are alive or stopped within the last day.
    pub fn list_workers(&self) -> Result<Vec<WorkerInfo>> {
        self.read(|conn| {
            conn.query(
                "SELECT w.id, w.pid, w.host, w.started_at, w.heartbeat_at, w.concurrency,
                        CASE WHEN w.stopped_at IS NULL THEN 0 ELSE 1 END,
                        unixepoch('subsec') - w.heartbeat_at,
                        (SELECT group_concat(t.id) FROM tasks t
                          WHERE t.worker = w.id AND t.status = 'running'),
                        w.agent, w.agents
                   FROM workers w
                  WHERE w.stopped_at IS NULL OR w.stopped_at > unixepoch('subsec') - 86400
                  ORDER BY w.started_at",
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

/// Facts recorded during a run; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct RunFacts {
    pub agent_pid: Option<i64>,
    pub agent_started: Option<String>,
    pub session_id: Option<String>,
    pub branch: Option<String>,
    pub worktree: Option<String>,
    /// The result so far (a running task's spend), replaced by the final one when it ends.
    pub result: Option<serde_json::Value>,
    /// The commit the branch started from, and the dependencies whose work that is.
    pub started_from: Option<String>,
    pub stacked_on: Option<Vec<TaskId>>,
}

/// Task ids from a `group_concat(id)` column (NULL when there are none).
fn id_list(ids: Option<String>) -> Vec<TaskId> {
    ids.unwrap_or_default().split(',').filter_map(|s| s.parse().ok().map(TaskId)).collect()
}

fn get_setting(conn: &mut dyn Tx, key: &str) -> Result<Option<String>> {
    conn.query_opt("SELECT value FROM settings WHERE key = ?1", args![key])?
        .map(|r| r.get(0))
        .transpose()
}

/// The task's status, its row locked for the rest of the transaction (on PostgreSQL; SQLite's
/// writers are serialised anyway), so the transition decided on it cannot race another.
fn status_of(tx: &mut dyn Tx, id: TaskId) -> Result<TaskStatus> {
    let s: String = tx
        .query_opt("SELECT status FROM tasks WHERE id = ?1 FOR UPDATE", args![id.0])?
        .ok_or(Error::NotFound(id))?
        .get(0)?;
    status_from_str(&s)
}

/// [`Error::StaleLease`] unless `token` is the running task's current lease.
fn holds_lease(tx: &mut dyn Tx, id: TaskId, token: i64) -> Result<()> {
    let held = tx.query_opt(
        "SELECT id FROM tasks WHERE id = ?1 AND lease_token = ?2 AND status = 'running'
          FOR UPDATE",
        args![id.0, token],
    )?;
    if held.is_none() { Err(Error::StaleLease { id, token }) } else { Ok(()) }
}

/// `task_notes.delivered`: not yet (0), given to the agent, or never (its task ended first).
const NOTE_DELIVERED: i64 = 1;
const NOTE_ENDED_FIRST: i64 = 2;

/// The notes of a task that ends now and its agent never got.
fn notes_ended_first(tx: &mut dyn Tx, id: TaskId) -> Result<()> {
    tx.exec(
        "UPDATE task_notes SET delivered = ?1 WHERE task_id = ?2 AND delivered = 0",
        args![NOTE_ENDED_FIRST, id.0],
    )?;
    Ok(())
}

/// Moves a task to a terminal state and fails every queued or waiting task that depends on it,
/// directly or not, naming the dependency that ended.
fn end_terminal(
    tx: &mut dyn Tx,
    now: f64,
    id: TaskId,
    to: TaskStatus,
    error: Option<&str>,
    result: Option<String>,
) -> Result<()> {
    let from = status_of(tx, id)?;
    if !from.can_become(to) {
        return Err(Error::InvalidTransition {
            id,
            from,
            action: to.as_str(),
            allowed: "not finished",
        });
    }
    tx.exec(
        "UPDATE tasks SET status = ?1, error = coalesce(?2, error), result = coalesce(?3, result),
           finished_at = ?4, updated_at = ?4, lease_until = NULL, pending_answer = NULL,
           cancel_requested = 0, agent_pid = NULL, agent_started = NULL, ask = NULL,
           question = CASE WHEN ?1 = 'waiting' THEN question ELSE NULL END
         WHERE id = ?5",
        args![to.as_str(), error, result, now, id.0],
    )?;
    notes_ended_first(tx, id)?;
    let mut stack = vec![(id, to)];
    while let Some((dep, how)) = stack.pop() {
        let dependents = tx.query(
            "SELECT t.id FROM task_deps d JOIN tasks t ON t.id = d.task_id
              WHERE d.depends_on = ?1 AND t.status IN ('queued', 'waiting') FOR UPDATE",
            args![dep.0],
        )?;
        for row in dependents {
            let t = TaskId(row.get(0)?);
            let verb = if how == TaskStatus::Cancelled { "was cancelled" } else { "failed" };
            tx.exec(
                "UPDATE tasks SET status = 'failed', error = ?1, failed_dependency = ?2,
                   finished_at = ?3, updated_at = ?3 WHERE id = ?4",
                args![format!("dependency task {} {verb}", dep.0), id.0, now, t.0],
            )?;
            notes_ended_first(tx, t)?;
            stack.push((t, TaskStatus::Failed));
        }
    }
    Ok(())
}

fn load_task(conn: &mut dyn Tx, id: TaskId) -> Result<Task> {
    static BY_ID: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?1"));
    let row = conn.query_opt(&BY_ID, args![id.0])?.ok_or(Error::NotFound(id))?;
    let mut task = task_from_row(&row)?;
    fill_relations(conn, &mut task)?;
    Ok(task)
}

fn fill_relations(conn: &mut dyn Tx, task: &mut Task) -> Result<()> {
    for row in conn.query(
        "SELECT d.depends_on, coalesce(p.status, 'done') FROM task_deps d
           LEFT JOIN tasks p ON p.id = d.depends_on WHERE d.task_id = ?1 ORDER BY d.depends_on",
        args![task.id.0],
    )? {
        let (dep, status): (i64, String) = (row.get(0)?, row.get(1)?);
        task.depends_on.push(TaskId(dep));
        if status != "done" {
            task.waiting_on.push(TaskId(dep));
        }
    }
    if task.is_blocked() {
        task.display_status = "blocked".into();
    }
    let ids = |rows: Vec<Row>| -> Result<Vec<TaskId>> {
        rows.iter().map(|r| r.get(0).map(TaskId)).collect()
    };
    task.dependents = ids(conn.query(
        "SELECT task_id FROM task_deps WHERE depends_on = ?1 ORDER BY task_id",
        args![task.id.0],
    )?)?;
    task.followups =
        ids(conn.query("SELECT id FROM tasks WHERE parent = ?1 ORDER BY id", args![task.id.0])?)?;
    task.notes = conn
        .query(
            "SELECT note, created_at, delivered FROM task_notes WHERE task_id = ?1 ORDER BY id",
            args![task.id.0],
        )?
        .iter()
        .map(|r| {
            let delivered: i64 = r.get(2)?;
            Ok(Note {
                note: r.get(0)?,
                created_at: r.get(1)?,
                delivered: delivered == NOTE_DELIVERED,
                ended_first: delivered == NOTE_ENDED_FIRST,
            })
        })
        .collect::<Result<_>>()?;
    task.questions = conn
        .query(
            "SELECT question, asked_at, answer, answered_at, ask, answered_by FROM task_questions
              WHERE task_id = ?1 ORDER BY id",
            args![task.id.0],
        )?
        .iter()
        .map(|r| {
            Ok(QuestionRound {
                question: r.get(0)?,
                asked_at: r.get(1)?,
                answer: r.get(2)?,
                answered_at: r.get(3)?,
                ask: r.get::<Option<String>>(4)?.and_then(|a| serde_json::from_str(&a).ok()),
                answered_by: r.get(5)?,
            })
        })
        .collect::<Result<_>>()?;
    Ok(())
}

/// Whether the directory `path` is `root` or below it, by whole components (`/a/bc` is not
/// under `/a/b`).
pub fn path_under(path: &str, root: &str) -> bool {
    std::path::Path::new(path).starts_with(std::path::Path::new(root))
}
