//! The SQLite store: every state transition is one `BEGIN IMMEDIATE` transaction here.

use crate::error::{Error, Result};
use crate::model::*;
use rusqlite::{Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Ordered, embedded migrations; `PRAGMA user_version` records how many have run.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_claude_jobs.sql"),
    include_str!("../migrations/0003_worker_agent.sql"),
    include_str!("../migrations/0004_decisions.sql"),
    include_str!("../migrations/0005_plans.sql"),
];

/// A worker with no heartbeat for this long is reported as stale.
pub const WORKER_STALE_AFTER_S: f64 = 30.0;

type Listener = Arc<dyn Fn() + Send + Sync>;

/// id, fencing token, session, pending answer, pending decision.
type ClaimedRow = Option<(i64, i64, Option<String>, Option<String>, Option<String>)>;

/// A handle on the queue database. Cheap to share behind an `Arc`; every method takes `&self` and
/// serialises on one connection, which is what SQLite does with writers anyway.
pub struct Store {
    conn: Mutex<Connection>,
    /// A second connection for reads: in WAL mode readers never wait for a writer, so a read
    /// (an MCP `get_task`, a TUI refresh) is not queued behind another request's fsync.
    reader: Mutex<Connection>,
    path: PathBuf,
    listeners: Mutex<Vec<Listener>>,
}

const TASK_COLUMNS: &str = "id, title, prompt, repo, base, priority, model, agent, readonly, \
    no_network, no_shell, worktree_keep, max_attempts, timeout_s, question_timeout_s, request_id, \
    status, question, session_id, result, error, attempts, worker, lease_until, cancel_requested, \
    branch, worktree, created_at, started_at, finished_at, updated_at, not_before, ask, ask_rules, \
    max_cost_usd, max_tokens, budget_group, base_ref, started_from, stacked_on, merged_into, \
    merge_commit, parent";

/// Short, fixed sleeps between retries keep several writer processes fair; SQLite's default
/// handler backs off to 100 ms sleeps, and a process deep in back-off starves while the others
/// take the lock between its sleeps (measured with four claiming processes: the starved one got
/// a few percent of the claims). Transactions here are short, so the first two seconds
/// retry every 100 µs (the lock is not left idle while its waiters sleep); then every
/// millisecond, about 30 s in all.
fn busy_handler(attempt: i32) -> bool {
    match attempt {
        0..20_000 => std::thread::sleep(Duration::from_micros(100)),
        20_000..48_000 => std::thread::sleep(Duration::from_millis(1)),
        _ => return false,
    }
    true
}

fn status_from_sql(s: &str) -> rusqlite::Result<TaskStatus> {
    s.parse().map_err(|e: String| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, e.into())
    })
}

fn task_from_row(row: &Row<'_>) -> rusqlite::Result<Task> {
    let status = status_from_sql(&row.get::<_, String>(16)?)?;
    let result: Option<String> = row.get(19)?;
    let result = match result {
        Some(text) => Some(serde_json::from_str(&text).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(19, rusqlite::types::Type::Text, e.into())
        })?),
        None => None,
    };
    let json_col = |i: usize| -> rusqlite::Result<Option<serde_json::Value>> {
        match row.get::<_, Option<String>>(i)? {
            Some(text) => Ok(serde_json::from_str(&text).ok()),
            None => Ok(None),
        }
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
        parent: row.get::<_, Option<i64>>(42)?.map(TaskId),
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

/// Current time read inside the transaction, so that it is taken while the write lock is held.
fn now(conn: &Connection) -> Result<f64> {
    Ok(conn.prepare_cached("SELECT unixepoch('subsec')")?.query_row([], |r| r.get(0))?)
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
    /// Opens (creating if needed, mode 0600) the database at `path` and brings its schema up to
    /// date. The parent directory must exist.
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        let path = path.as_ref().to_path_buf();
        crate::home::create_private_file(&path)?;
        let mut conn = Connection::open(&path).map_err(|e| Error::Open {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        conn.busy_handler(Some(busy_handler))?;
        // Two processes creating the database at once (a worker and a submit, say) can meet
        // while one switches it to WAL; SQLite reports that as busy without asking the busy
        // handler, so the set-up is retried here.
        let mut tries = 0;
        loop {
            match prepare(&mut conn) {
                Err(Error::Sqlite(e))
                    if tries < 500
                        && matches!(
                            e.sqlite_error_code(),
                            Some(
                                rusqlite::ErrorCode::DatabaseBusy
                                    | rusqlite::ErrorCode::DatabaseLocked
                            )
                        ) =>
                {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                other => break other?,
            }
        }
        let mut reader = Connection::open(&path).map_err(|e| Error::Open {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        reader.busy_handler(Some(busy_handler))?;
        reader.pragma_update(None, "query_only", "ON")?;
        Ok(Store {
            conn: Mutex::new(conn),
            reader: Mutex::new(reader),
            path,
            listeners: Mutex::new(Vec::new()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Registers a callback run after every committed write made through this handle. Writers in
    /// other processes are seen through [`crate::watch::ChangeWatcher`] instead.
    pub fn on_change(&self, f: impl Fn() + Send + Sync + 'static) {
        self.listeners.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::new(f));
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave a half-written transaction behind (it rolls
        // back on drop), so a poisoned connection is still usable.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn write<T>(&self, f: impl FnOnce(&Transaction<'_>, f64) -> Result<T>) -> Result<T> {
        self.write_with(Durability::Full, f)
    }

    fn write_with<T>(
        &self,
        durability: Durability,
        f: impl FnOnce(&Transaction<'_>, f64) -> Result<T>,
    ) -> Result<T> {
        let (out, changed) = {
            let mut conn = self.lock();
            if durability == Durability::CrashSafe {
                conn.pragma_update(None, "synchronous", "NORMAL")?;
            }
            let result = (|| -> Result<(T, bool)> {
                let before = conn.total_changes();
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let now = now(&tx)?;
                let out = f(&tx, now)?;
                tx.commit()?;
                Ok((out, conn.total_changes() != before))
            })();
            if durability == Durability::CrashSafe {
                conn.pragma_update(None, "synchronous", "FULL")?;
            }
            result?
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

    pub(crate) fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        f(&conn)
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
                tx.execute(
                    "INSERT INTO budgets (max_cost_usd, max_tokens, created_at) VALUES (?1, ?2, ?3)",
                    params![shared.max_cost_usd, shared.max_tokens, now],
                )?;
                Some(tx.last_insert_rowid())
            } else {
                None
            };
            for spec in &specs {
                if let Some(key) = &spec.request_id {
                    let existing: Option<i64> = tx
                        .query_row("SELECT id FROM tasks WHERE request_id = ?1", [key], |r| {
                            r.get(0)
                        })
                        .optional()?;
                    if let Some(id) = existing {
                        ids.push((TaskId(id), false));
                        continue;
                    }
                }
                let title = spec
                    .title
                    .clone()
                    .filter(|t| !t.trim().is_empty())
                    .unwrap_or_else(|| default_title(&spec.prompt));
                tx.execute(
                    "INSERT INTO tasks (title, prompt, repo, base, priority, model, agent, readonly,
                        no_network, no_shell, worktree_keep, max_attempts, timeout_s,
                        question_timeout_s, request_id, status, created_at, updated_at,
                        ask_rules, max_cost_usd, max_tokens, budget_group, base_ref, parent,
                        session_id)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15,
                        'queued', ?16, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23)",
                    params![
                        title,
                        spec.prompt,
                        spec.repo,
                        spec.base,
                        spec.priority,
                        spec.model,
                        spec.agent,
                        spec.readonly,
                        spec.no_network,
                        spec.no_shell,
                        spec.worktree_keep,
                        spec.max_attempts,
                        spec.timeout_s,
                        spec.question_timeout_s,
                        spec.request_id,
                        now,
                        (!spec.ask.is_empty())
                            .then(|| serde_json::Value::from(spec.ask.clone()).to_string()),
                        spec.budget.max_cost_usd,
                        spec.budget.max_tokens,
                        group,
                        spec.base_ref,
                        spec.parent.map(|p| p.0),
                        spec.session_id,
                    ],
                )?;
                ids.push((TaskId(tx.last_insert_rowid()), true));
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
                    let status: Option<String> = tx
                        .query_row("SELECT status FROM tasks WHERE id = ?1", [dep_id.0], |r| {
                            r.get(0)
                        })
                        .optional()?;
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
                    tx.execute(
                        "INSERT OR IGNORE INTO task_deps (task_id, depends_on) VALUES (?1, ?2)",
                        [id.0, dep_id.0],
                    )?;
                }
            }
            Ok(ids)
        })?;
        self.read(|conn| {
            ids.into_iter().map(|(id, created)| Ok((load_task(conn, id)?, created))).collect()
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
            let mut args: Vec<rusqlite::types::Value> = Vec::new();
            match filter.status {
                Some(StatusFilter::Is(s)) => {
                    sql.push_str(" AND status = ?");
                    args.push(s.as_str().to_owned().into());
                }
                Some(StatusFilter::Blocked) => sql.push_str(
                    " AND status = 'queued' AND EXISTS (SELECT 1 FROM task_deps d JOIN tasks p
                       ON p.id = d.depends_on WHERE d.task_id = t.id AND p.status != 'done')",
                ),
                None => {}
            }
            if let Some(repo) = &filter.repo {
                sql.push_str(" AND repo = ?");
                args.push(repo.clone().into());
            }
            sql.push_str(" ORDER BY id DESC LIMIT ? OFFSET ?");
            args.push((filter.limit.map_or(-1, |l| l as i64)).into());
            args.push((filter.offset as i64).into());
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query_map(rusqlite::params_from_iter(args), task_from_row)?;
            let mut tasks = Vec::new();
            for row in rows {
                let mut task = row?;
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
            let mut args: Vec<String> = Vec::new();
            match status {
                Some(StatusFilter::Is(s)) => {
                    sql.push_str(" WHERE t.status = ?1");
                    args.push(s.as_str().to_owned());
                }
                Some(StatusFilter::Blocked) => sql.push_str(
                    " WHERE t.status = 'queued' AND EXISTS (SELECT 1 FROM task_deps d JOIN tasks p
                       ON p.id = d.depends_on WHERE d.task_id = t.id AND p.status != 'done')",
                ),
                None => {}
            }
            sql.push_str(" ORDER BY t.id DESC");
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query_map(rusqlite::params_from_iter(args), |r| {
                let waiting: Option<String> = r.get(11)?;
                Ok(TaskRow {
                    id: TaskId(r.get(0)?),
                    title: r.get(1)?,
                    status: status_from_sql(&r.get::<_, String>(2)?)?,
                    priority: r.get(3)?,
                    repo: r.get(4)?,
                    attempts: r.get(5)?,
                    max_attempts: r.get(6)?,
                    created_at: r.get(7)?,
                    started_at: r.get(8)?,
                    finished_at: r.get(9)?,
                    question: r.get(10)?,
                    waiting_on: id_list(waiting),
                    ask: r
                        .get::<_, Option<String>>(12)?
                        .and_then(|a| serde_json::from_str(&a).ok())
                        .map(Box::new),
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }

    pub fn queue_status(&self) -> Result<QueueStatus> {
        let workers = self.list_workers()?;
        self.read(|conn| {
            let mut counts: BTreeMap<String, i64> =
                TaskStatus::ALL.iter().map(|s| (s.as_str().to_owned(), 0)).collect();
            counts.insert("blocked".into(), 0);
            let mut stmt = conn.prepare("SELECT status, count(*) FROM tasks GROUP BY status")?;
            let mut total = 0;
            for row in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))? {
                let (s, n) = row?;
                total += n;
                counts.insert(s, n);
            }
            let blocked: i64 = conn.query_row(
                "SELECT count(*) FROM tasks t WHERE status = 'queued' AND EXISTS (SELECT 1 FROM
                   task_deps d JOIN tasks p ON p.id = d.depends_on
                   WHERE d.task_id = t.id AND p.status != 'done')",
                [],
                |r| r.get(0),
            )?;
            counts.insert("blocked".into(), blocked);
            if let Some(q) = counts.get_mut("queued") {
                *q -= blocked;
            }
            let oldest_queued_age_s: Option<f64> = conn.query_row(
                "SELECT unixepoch('subsec') - min(created_at) FROM tasks WHERE status = 'queued'",
                [],
                |r| r.get(0),
            )?;
            let default_model = get_setting(conn, "default_model")?;
            let mut spend_today = Spend::default();
            let mut stmt = conn.prepare(
                "SELECT status, coalesce(sum(json_extract(result, '$.usage.cost_usd')), 0.0),
                        coalesce(sum(json_extract(result, '$.usage.input_tokens')
                          + json_extract(result, '$.usage.output_tokens')), 0)
                   FROM tasks
                  WHERE result IS NOT NULL
                    AND updated_at >= unixepoch('now', 'localtime', 'start of day', 'utc')
                  GROUP BY status",
            )?;
            for row in stmt.query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, f64>(1)?, r.get::<_, i64>(2)?))
            })? {
                let (status, cost, tokens) = row?;
                spend_today.cost_usd += cost;
                spend_today.tokens += tokens;
                spend_today.cost_usd_by_status.insert(status, cost);
            }
            let workers_alive = workers.iter().filter(|w| !w.stopped && !w.stale).count();
            Ok(QueueStatus {
                counts,
                total,
                oldest_queued_age_s,
                workers,
                workers_alive,
                default_model,
                spend_today,
            })
        })
    }

    // ---- the worker's side -------------------------------------------------------------------

    /// Claims the next runnable task for `worker`: among queued tasks whose dependencies are all
    /// `done` and whose retry delay has passed, the highest priority, then the oldest (lowest
    /// id). The lease and the new fencing token are computed inside the same transaction.
    ///
    /// The claim is committed crash-safe but not power-safe (WAL with `synchronous=NORMAL`): it
    /// survives any process dying, and a claim lost to a power cut only leaves the task queued,
    /// to be claimed again, which is what must happen anyway since its agent died with the
    /// machine. That halves the fsyncs on the busiest path; everything else stays `FULL`.
    pub fn claim_next(&self, worker: &str, host: &str, lease: Duration) -> Result<Option<Claim>> {
        let claimed = self.write_with(Durability::CrashSafe, |tx, now| {
            // Prepared once per connection: the statement runs while the write lock is held.
            // INDEXED BY: left to itself the planner takes the status index and sorts every
            // queued task on each claim (2 ms at 2,000 queued); the partial index walks them in
            // claim order and stops at the first runnable one (0.4 ms).
            // A task whose agent is blocked on a decision in another live worker's server is
            // that worker's to resume: only it can answer the blocked request.
            let row: ClaimedRow = tx
                .prepare_cached(
                    "UPDATE tasks SET status = 'running', worker = ?1, worker_host = ?2,
                        lease_token = lease_token + 1, lease_until = ?3 + ?4,
                        attempts = attempts + (pending_answer IS NULL),
                        started_at = coalesce(started_at, ?3), updated_at = ?3,
                        agent_pid = NULL, agent_started = NULL, cancel_requested = 0,
                        not_before = NULL, parked_worker = NULL
                     WHERE id = (
                        SELECT t.id FROM tasks t INDEXED BY tasks_claim
                         WHERE t.status = 'queued'
                           AND (t.not_before IS NULL OR t.not_before <= ?3)
                           AND NOT EXISTS (SELECT 1 FROM task_deps d JOIN tasks p
                                ON p.id = d.depends_on WHERE d.task_id = t.id AND p.status != 'done')
                           AND (t.parked_worker IS NULL OR t.parked_worker = ?1
                                OR NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = t.parked_worker
                                    AND w.stopped_at IS NULL AND w.heartbeat_at > ?3 - ?5))
                         ORDER BY t.priority DESC, t.id ASC LIMIT 1)
                     RETURNING id, lease_token, session_id, pending_answer, ask",
                )?
                .query_row(
                    params![worker, host, now, lease.as_secs_f64(), WORKER_STALE_AFTER_S],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
                )
                .optional()?;
            let Some((id, token, session, answer, ask)) = row else { return Ok(None) };
            let mut stmt = tx.prepare_cached(
                "UPDATE task_notes SET delivered = 1 WHERE task_id = ?1 AND delivered = 0
                 RETURNING note",
            )?;
            let new_notes =
                stmt.query_map([id], |r| r.get::<_, String>(0))?.collect::<Result<Vec<_>, _>>()?;
            let resume = match (session, answer) {
                (Some(session_id), Some(answer)) => Some(Resume {
                    session_id,
                    answer,
                    ask: ask.and_then(|a: String| serde_json::from_str(&a).ok()),
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
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let now = now(&tx)?;
        let reply: Option<HeartbeatReply> = tx
            .query_row(
                "UPDATE tasks SET lease_until = ?1 + ?2 WHERE id = ?3 AND lease_token = ?4
                   AND status = 'running' RETURNING cancel_requested, lease_until",
                params![now, lease.as_secs_f64(), id.0, token],
                |r| Ok(HeartbeatReply { cancel_requested: r.get(0)?, lease_until: r.get(1)? }),
            )
            .optional()?;
        tx.commit()?;
        reply.ok_or(Error::StaleLease { id, token })
    }

    /// Records facts about the current run (agent process, session, branch) under the lease.
    pub fn record_run(&self, id: TaskId, token: i64, facts: RunFacts) -> Result<()> {
        self.write(|tx, now| {
            let n = tx.execute(
                "UPDATE tasks SET agent_pid = coalesce(?1, agent_pid),
                    agent_started = coalesce(?2, agent_started),
                    session_id = coalesce(?3, session_id), branch = coalesce(?4, branch),
                    worktree = coalesce(?5, worktree), result = coalesce(?9, result),
                    started_from = coalesce(?10, started_from),
                    stacked_on = coalesce(?11, stacked_on), updated_at = ?6
                 WHERE id = ?7 AND lease_token = ?8 AND status = 'running'",
                params![
                    facts.agent_pid,
                    facts.agent_started,
                    facts.session_id,
                    facts.branch,
                    facts.worktree,
                    now,
                    id.0,
                    token,
                    facts.result.map(|v| v.to_string()),
                    facts.started_from,
                    facts.stacked_on.map(|ids| serde_json::Value::from(
                        ids.iter().map(|i| i.0).collect::<Vec<_>>()
                    )
                    .to_string()),
                ],
            )?;
            if n == 0 { Err(Error::StaleLease { id, token }) } else { Ok(()) }
        })
    }

    /// Ends a run. Rejected with [`Error::StaleLease`] unless `token` is the current one and the
    /// task is still running: a worker that lost its lease cannot overwrite the next run's work.
    pub fn finish(&self, id: TaskId, token: i64, outcome: Outcome) -> Result<Task> {
        self.write(|tx, now| {
            let row: Option<(i64, i64)> = tx
                .query_row(
                    "SELECT attempts, max_attempts FROM tasks
                      WHERE id = ?1 AND lease_token = ?2 AND status = 'running'",
                    params![id.0, token],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let Some((attempts, max_attempts)) = row else {
                return Err(Error::StaleLease { id, token });
            };
            let json = |v: &Option<serde_json::Value>| v.as_ref().map(|v| v.to_string());
            // Fields every end of a run clears.
            const END_RUN: &str = "lease_until = NULL, pending_answer = NULL, \
                cancel_requested = 0, agent_pid = NULL, agent_started = NULL, ask = NULL, \
                parked_worker = NULL";
            match outcome {
                Outcome::Done { result } => {
                    tx.execute(
                        &format!(
                            "UPDATE tasks SET status = 'done', result = ?1, error = NULL,
                               question = NULL, finished_at = ?2, updated_at = ?2, {END_RUN}
                             WHERE id = ?3"
                        ),
                        params![result.to_string(), now, id.0],
                    )?;
                }
                Outcome::Failed { error, result, backoff_s } if attempts < max_attempts => {
                    // A run that was delivering an answer keeps it, so the next attempt still
                    // delivers it; that attempt is counted here, since a resuming claim does
                    // not count one.
                    tx.execute(
                        "UPDATE tasks SET status = 'queued', result = ?1, error = ?2,
                           worker = NULL, not_before = ?3 + ?4, updated_at = ?3,
                           attempts = attempts + (pending_answer IS NOT NULL),
                           lease_until = NULL, cancel_requested = 0, agent_pid = NULL,
                           agent_started = NULL, parked_worker = NULL
                         WHERE id = ?5",
                        params![json(&result), error, now, backoff_s.max(0.0), id.0],
                    )?;
                }
                Outcome::Failed { error, result, .. }
                | Outcome::FailedPermanently { error, result } => {
                    end_terminal(tx, now, id, TaskStatus::Failed, Some(&error), json(&result))?;
                }
                Outcome::Released => {
                    tx.execute(
                        "UPDATE tasks SET status = 'queued', worker = NULL, lease_until = NULL,
                           attempts = max(attempts - (pending_answer IS NULL), 0),
                           cancel_requested = 0, agent_pid = NULL, agent_started = NULL,
                           updated_at = ?1
                         WHERE id = ?2",
                        params![now, id.0],
                    )?;
                }
                Outcome::Cancelled { result } => {
                    end_terminal(tx, now, id, TaskStatus::Cancelled, None, json(&result))?;
                }
                Outcome::Waiting { question, session_id, result, ask } => {
                    let parked = ask.as_ref().is_some_and(|a| a.request_id.is_some());
                    let ask = ask
                        .map(|a| serde_json::to_string(&a))
                        .transpose()
                        .map_err(|source| Error::Json { column: "ask", source })?;
                    tx.execute(
                        &format!(
                            "UPDATE tasks SET status = 'waiting', question = ?1, session_id = ?2,
                               asked_at = ?3, result = coalesce(?4, result), updated_at = ?3,
                               {END_RUN}, ask = ?6,
                               parked_worker = CASE WHEN ?7 THEN worker ELSE NULL END
                             WHERE id = ?5"
                        ),
                        params![question, session_id, now, json(&result), id.0, ask, parked],
                    )?;
                    tx.execute(
                        "INSERT INTO task_questions (task_id, question, asked_at, ask)
                         VALUES (?1, ?2, ?3, ?4)",
                        params![id.0, question, now, ask],
                    )?;
                }
            }
            load_task(tx, id)
        })
    }

    /// Requeues tasks whose lease expired (their worker died or hung), or fails them once their
    /// attempts are used up; fails waiting tasks whose question timed out. Returns what was
    /// reaped so the caller can kill orphaned agents that run on its host.
    pub fn reap_expired(&self) -> Result<Vec<Reaped>> {
        self.write(|tx, now| {
            let mut stmt = tx.prepare(
                "SELECT id, attempts, max_attempts, agent_pid, agent_started, worker_host
                   FROM tasks WHERE status = 'running' AND lease_until < ?1",
            )?;
            let expired = stmt
                .query_map([now], |r| {
                    Ok((
                        TaskId(r.get(0)?),
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let mut reaped = Vec::new();
            for (id, attempts, max_attempts, agent_pid, agent_started, worker_host) in expired {
                let requeued = attempts < max_attempts;
                let error = "the worker running this task stopped responding (its lease expired)";
                if requeued {
                    tx.execute(
                        "UPDATE tasks SET status = 'queued', worker = NULL, lease_until = NULL,
                           error = ?1, updated_at = ?2 WHERE id = ?3",
                        params![format!("{error}; requeued"), now, id.0],
                    )?;
                } else {
                    let msg =
                        format!("{error} and no attempts are left ({attempts} of {max_attempts})");
                    end_terminal(tx, now, id, TaskStatus::Failed, Some(&msg), None)?;
                }
                reaped.push(Reaped { id, requeued, agent_pid, agent_started, worker_host });
            }
            let mut stmt = tx.prepare(
                "SELECT id, question_timeout_s FROM tasks WHERE status = 'waiting'
                   AND question_timeout_s IS NOT NULL AND asked_at + question_timeout_s < ?1",
            )?;
            let timed_out = stmt
                .query_map([now], |r| Ok((TaskId(r.get(0)?), r.get::<_, i64>(1)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            for (id, secs) in timed_out {
                let msg = format!("the question was not answered within {secs} s");
                end_terminal(tx, now, id, TaskStatus::Failed, Some(&msg), None)?;
            }
            Ok(reaped)
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
                    tx.execute(
                        "UPDATE tasks SET cancel_requested = 1, updated_at = ?1 WHERE id = ?2",
                        params![now, id.0],
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
            let dead_dep: Option<(i64, String)> = tx
                .query_row(
                    "SELECT p.id, p.status FROM task_deps d JOIN tasks p ON p.id = d.depends_on
                      WHERE d.task_id = ?1 AND p.status IN ('failed', 'cancelled') LIMIT 1",
                    [id.0],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            if let Some((dep, status)) = dead_dep {
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
                tx.execute(
                    "UPDATE tasks SET status = 'queued', attempts = 0, error = NULL,
                       not_before = NULL, finished_at = NULL, cancel_requested = 0,
                       question = NULL, session_id = NULL, pending_answer = NULL, worker = NULL,
                       failed_dependency = NULL, ask = NULL, parked_worker = NULL,
                       updated_at = ?1 WHERE id = ?2",
                    params![now, t.0],
                )?;
                let mut stmt = tx.prepare(
                    "SELECT id FROM tasks WHERE status = 'failed' AND failed_dependency = ?1",
                )?;
                for dep in stmt.query_map([t.0], |r| r.get(0))? {
                    stack.push(TaskId(dep?));
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
                .query_row("SELECT ask FROM tasks WHERE id = ?1", [id.0], |r| {
                    r.get::<_, Option<String>>(0)
                })?
                .and_then(|a| serde_json::from_str(&a).ok());
            let parsed = match &ask {
                Some(a) => Some(a.parse_answer(answer).map_err(|e| Error::invalid("answer", e))?),
                None => None,
            };
            tx.execute(
                "UPDATE task_questions SET answer = ?1, answered_at = ?2, answered_by = ?4
                  WHERE id = (SELECT max(id) FROM task_questions WHERE task_id = ?3)",
                params![answer.trim(), now, id.0, by],
            )?;
            if let (Some(a), Some(p)) = (&ask, &parsed)
                && let Some(b) = &a.budget
            {
                if *p == Answer::BudgetStop {
                    let spent = match b.limit.as_str() {
                        "cost" => format!("${:.2} of ${:.2}", b.spent, b.max),
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
                    let column = if b.limit == "cost" { "max_cost_usd" } else { "max_tokens" };
                    tx.execute(
                        &format!("UPDATE {table} SET {column} = ?1 WHERE id = {key}"),
                        params![max, id.0],
                    )?;
                }
            }
            tx.execute(
                "UPDATE tasks SET status = 'queued', pending_answer = ?1, question = NULL,
                   asked_at = NULL, worker = NULL, updated_at = ?2 WHERE id = ?3",
                params![answer.trim(), now, id.0],
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
                tx.execute(
                    "UPDATE tasks SET merged_into = ?1, merge_commit = ?2, updated_at = ?3
                      WHERE id = ?4",
                    params![into, commit, now, id.0],
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
                tx.execute(
                    "UPDATE task_notes SET delivered = 0 WHERE task_id = ?1 AND note = ?2",
                    params![id.0, note],
                )?;
            }
            Ok(())
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
            tx.execute(
                "INSERT INTO task_questions (task_id, question, asked_at, ask, answer, answered_at,
                    answered_by) VALUES (?1, ?2, ?3, ?4, ?5, ?3, ?6)",
                params![id.0, text, now, json, answer, by],
            )?;
            Ok(())
        })
    }

    /// What a task may still spend: its own budget and its batch's, with the batch's spend so far
    /// (the recorded usage of the batch's other tasks).
    pub fn budget_of(&self, id: TaskId) -> Result<BudgetState> {
        self.read(|conn| {
            let (own, group): (Budget, Option<i64>) = conn
                .query_row(
                    "SELECT max_cost_usd, max_tokens, budget_group FROM tasks WHERE id = ?1",
                    [id.0],
                    |r| Ok((Budget { max_cost_usd: r.get(0)?, max_tokens: r.get(1)? }, r.get(2)?)),
                )
                .optional()?
                .ok_or(Error::NotFound(id))?;
            let batch = match group {
                None => None,
                Some(g) => {
                    let (max_cost_usd, max_tokens) = conn.query_row(
                        "SELECT max_cost_usd, max_tokens FROM budgets WHERE id = ?1",
                        [g],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )?;
                    let (cost, tokens): (f64, i64) = conn.query_row(
                        "SELECT coalesce(sum(json_extract(result, '$.usage.cost_usd')), 0.0),
                                coalesce(sum(json_extract(result, '$.usage.input_tokens')
                                  + json_extract(result, '$.usage.output_tokens')), 0)
                           FROM tasks WHERE budget_group = ?1 AND id != ?2",
                        params![g, id.0],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )?;
                    Some(BatchBudget {
                        budget: Budget { max_cost_usd, max_tokens },
                        others_cost_usd: cost,
                        others_tokens: tokens,
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
            tx.execute(
                "INSERT INTO task_notes (task_id, note, created_at) VALUES (?1, ?2, ?3)",
                params![id.0, note, now],
            )?;
            tx.execute("UPDATE tasks SET updated_at = ?1 WHERE id = ?2", params![now, id.0])?;
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
            tx.execute(
                "UPDATE tasks SET priority = ?1, updated_at = ?2 WHERE id = ?3",
                params![priority, now, id.0],
            )?;
            load_task(tx, id)
        })
    }

    /// Deletes finished tasks in `statuses` that finished at least `older_than_s` ago and
    /// returns them, so the caller can remove their logs and worktrees.
    pub fn clear_finished(&self, older_than_s: f64, statuses: &[TaskStatus]) -> Result<Vec<Task>> {
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
                let mut stmt = tx.prepare(
                    "SELECT id FROM tasks WHERE status = ?1 AND coalesce(finished_at, updated_at) <= ?2",
                )?;
                let ids = stmt
                    .query_map(params![s.as_str(), now - older_than_s], |r| r.get(0))?
                    .collect::<Result<Vec<i64>, _>>()?;
                for id in ids {
                    out.push(load_task(tx, TaskId(id))?);
                    tx.execute("DELETE FROM tasks WHERE id = ?1", [id])?;
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
            tx.execute(
                "INSERT OR REPLACE INTO workers
                   (id, pid, host, started_at, heartbeat_at, concurrency, agent)
                 VALUES (?1, ?2, ?3, ?4, ?4, ?5, ?6)",
                params![id, pid, host, now, concurrency as i64, agent],
            )?;
            Ok(())
        })
    }

    pub fn worker_heartbeat(&self, id: &str) -> Result<()> {
        let conn = self.lock();
        conn.execute("UPDATE workers SET heartbeat_at = unixepoch('subsec') WHERE id = ?1", [id])?;
        Ok(())
    }

    pub fn worker_stopped(&self, id: &str) -> Result<()> {
        self.write(|tx, now| {
            tx.execute("UPDATE workers SET stopped_at = ?1 WHERE id = ?2", params![now, id])?;
            Ok(())
        })
    }

    /// Workers that are alive or stopped within the last day.
    pub fn list_workers(&self) -> Result<Vec<WorkerInfo>> {
        self.read(|conn| {
            let mut stmt = conn.prepare(
                "SELECT w.id, w.pid, w.host, w.started_at, w.heartbeat_at, w.concurrency,
                        w.stopped_at IS NOT NULL, unixepoch('subsec') - w.heartbeat_at,
                        (SELECT group_concat(t.id) FROM tasks t
                          WHERE t.worker = w.id AND t.status = 'running'),
                        w.agent
                   FROM workers w
                  WHERE w.stopped_at IS NULL OR w.stopped_at > unixepoch('subsec') - 86400
                  ORDER BY w.started_at",
            )?;
            let rows = stmt.query_map([], |r| {
                let stopped: bool = r.get(6)?;
                let silent_for: f64 = r.get(7)?;
                let current: Option<String> = r.get(8)?;
                Ok(WorkerInfo {
                    id: r.get(0)?,
                    pid: r.get(1)?,
                    host: r.get(2)?,
                    started_at: r.get(3)?,
                    heartbeat_at: r.get(4)?,
                    concurrency: r.get(5)?,
                    current_tasks: id_list(current),
                    stopped,
                    stale: !stopped && silent_for > WORKER_STALE_AFTER_S,
                    agent: r.get(9)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }

    /// Requeues the running tasks of a worker that is known to be dead (e.g. a stale one being
    /// restarted); the attempt counts, as with an expired lease.
    pub fn release_worker_tasks(&self, worker: &str) -> Result<Vec<TaskId>> {
        self.write(|tx, now| {
            let mut stmt = tx.prepare(
                "UPDATE tasks SET lease_until = ?1 - 1 WHERE worker = ?2 AND status = 'running'
                 RETURNING id",
            )?;
            let ids = stmt
                .query_map(params![now, worker], |r| r.get(0).map(TaskId))?
                .collect::<Result<Vec<_>, _>>()?;
            tx.execute("UPDATE workers SET stopped_at = ?1 WHERE id = ?2", params![now, worker])?;
            Ok(ids)
        })
    }

    pub fn setting(&self, key: &str) -> Result<Option<String>> {
        self.read(|conn| get_setting(conn, key))
    }

    pub fn set_setting(&self, key: &str, value: &str) -> Result<()> {
        self.write(|tx, _| {
            tx.execute(
                "INSERT INTO settings (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [key, value],
            )?;
            Ok(())
        })
    }

    /// `PRAGMA integrity_check`, for crash tests and `taskbridge status`.
    pub fn integrity_check(&self) -> Result<String> {
        self.read(|conn| Ok(conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?))
    }
}

/// How a write transaction is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// fsync'd before the call returns: survives power loss (`synchronous=FULL`).
    Full,
    /// Survives any process crash, not a power cut (`synchronous=NORMAL` in WAL mode).
    CrashSafe,
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

fn get_setting(conn: &Connection, key: &str) -> Result<Option<String>> {
    Ok(conn
        .query_row("SELECT value FROM settings WHERE key = ?1", [key], |r| r.get(0))
        .optional()?)
}

fn status_of(conn: &Connection, id: TaskId) -> Result<TaskStatus> {
    let s: Option<String> = conn
        .query_row("SELECT status FROM tasks WHERE id = ?1", [id.0], |r| r.get(0))
        .optional()?;
    let s = s.ok_or(Error::NotFound(id))?;
    Ok(status_from_sql(&s)?)
}

/// [`Error::StaleLease`] unless `token` is the running task's current lease.
fn holds_lease(tx: &Transaction<'_>, id: TaskId, token: i64) -> Result<()> {
    let n: i64 = tx.query_row(
        "SELECT count(*) FROM tasks WHERE id = ?1 AND lease_token = ?2 AND status = 'running'",
        params![id.0, token],
        |r| r.get(0),
    )?;
    if n == 0 { Err(Error::StaleLease { id, token }) } else { Ok(()) }
}

/// Moves a task to a terminal state and fails every queued or waiting task that depends on it,
/// directly or not, naming the dependency that ended.
fn end_terminal(
    tx: &Transaction<'_>,
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
    tx.execute(
        "UPDATE tasks SET status = ?1, error = coalesce(?2, error), result = coalesce(?3, result),
           finished_at = ?4, updated_at = ?4, lease_until = NULL, pending_answer = NULL,
           cancel_requested = 0, agent_pid = NULL, agent_started = NULL, ask = NULL,
           question = CASE WHEN ?1 = 'waiting' THEN question ELSE NULL END
         WHERE id = ?5",
        params![to.as_str(), error, result, now, id.0],
    )?;
    let mut stack = vec![(id, to)];
    while let Some((dep, how)) = stack.pop() {
        let mut stmt = tx.prepare(
            "SELECT t.id FROM task_deps d JOIN tasks t ON t.id = d.task_id
              WHERE d.depends_on = ?1 AND t.status IN ('queued', 'waiting')",
        )?;
        let dependents =
            stmt.query_map([dep.0], |r| r.get(0).map(TaskId))?.collect::<Result<Vec<_>, _>>()?;
        for t in dependents {
            let verb = if how == TaskStatus::Cancelled { "was cancelled" } else { "failed" };
            tx.execute(
                "UPDATE tasks SET status = 'failed', error = ?1, failed_dependency = ?2,
                   finished_at = ?3, updated_at = ?3 WHERE id = ?4",
                params![format!("dependency task {} {verb}", dep.0), id.0, now, t.0],
            )?;
            stack.push((t, TaskStatus::Failed));
        }
    }
    Ok(())
}

fn load_task(conn: &Connection, id: TaskId) -> Result<Task> {
    static BY_ID: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?1"));
    let mut task = conn
        .prepare_cached(&BY_ID)?
        .query_row([id.0], task_from_row)
        .optional()?
        .ok_or(Error::NotFound(id))?;
    fill_relations(conn, &mut task)?;
    Ok(task)
}

fn fill_relations(conn: &Connection, task: &mut Task) -> Result<()> {
    let mut stmt = conn.prepare_cached(
        "SELECT d.depends_on, coalesce(p.status, 'done') FROM task_deps d
           LEFT JOIN tasks p ON p.id = d.depends_on WHERE d.task_id = ?1 ORDER BY d.depends_on",
    )?;
    for row in stmt.query_map([task.id.0], |r| Ok((r.get(0)?, r.get::<_, String>(1)?)))? {
        let (dep, status) = row?;
        task.depends_on.push(TaskId(dep));
        if status != "done" {
            task.waiting_on.push(TaskId(dep));
        }
    }
    if task.is_blocked() {
        task.display_status = "blocked".into();
    }
    let mut stmt = conn
        .prepare_cached("SELECT task_id FROM task_deps WHERE depends_on = ?1 ORDER BY task_id")?;
    task.dependents =
        stmt.query_map([task.id.0], |r| r.get(0).map(TaskId))?.collect::<Result<_, _>>()?;
    let mut stmt = conn.prepare_cached("SELECT id FROM tasks WHERE parent = ?1 ORDER BY id")?;
    task.followups =
        stmt.query_map([task.id.0], |r| r.get(0).map(TaskId))?.collect::<Result<_, _>>()?;
    let mut stmt = conn.prepare_cached(
        "SELECT note, created_at, delivered FROM task_notes WHERE task_id = ?1 ORDER BY id",
    )?;
    task.notes = stmt
        .query_map([task.id.0], |r| {
            Ok(Note { note: r.get(0)?, created_at: r.get(1)?, delivered: r.get(2)? })
        })?
        .collect::<Result<_, _>>()?;
    let mut stmt = conn.prepare_cached(
        "SELECT question, asked_at, answer, answered_at, ask, answered_by FROM task_questions
          WHERE task_id = ?1 ORDER BY id",
    )?;
    task.questions = stmt
        .query_map([task.id.0], |r| {
            Ok(QuestionRound {
                question: r.get(0)?,
                asked_at: r.get(1)?,
                answer: r.get(2)?,
                answered_at: r.get(3)?,
                ask: r.get::<_, Option<String>>(4)?.and_then(|a| serde_json::from_str(&a).ok()),
                answered_by: r.get(5)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(())
}

/// Journal mode, durability and schema: what every connection that writes needs first.
fn prepare(conn: &mut Connection) -> Result<()> {
    // WAL + synchronous=FULL: an acknowledged submit survives power loss, not only a crash.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024)?;
    if cfg!(target_os = "macos") {
        conn.pragma_update(None, "fullfsync", "ON")?;
        conn.pragma_update(None, "checkpoint_fullfsync", "ON")?;
    }
    migrate(conn)
}

fn migrate(conn: &mut Connection) -> Result<()> {
    // IMMEDIATE: two processes opening a new database at once must not both run migration 1.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Err(Error::SchemaTooNew { found: version, known });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", i as i64 + 1)?;
    }
    tx.commit()?;
    Ok(())
}
