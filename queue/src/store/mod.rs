//! The store: every state transition is one transaction here, written once for both backends
//! against [`crate::sql::Tx`]. SQLite (`sqlite`) serialises writers with `BEGIN
//! IMMEDIATE`; PostgreSQL (`pg`) locks the rows each transition decides on. The few
//! statements whose dialects differ branch on [`Dialect`].
//!
//! The transitions are grouped as a task lives them: submitting (`submit.rs`), reading
//! (`reads.rs`), a worker's claim, lease and the reaping of lapsed ones (`claim.rs`), what a run
//! records and how it finishes (`finish.rs`), what users and planners do to a task (`user.rs`:
//! cancel, retry, answers, notes, priorities, merges, clearing), the workers' registry and
//! the queue's settings and health (`workers.rs`), and how the queue has been going
//! (`stats.rs`). The helpers they share are below.

mod claim;
mod finish;
mod reads;
mod stats;
mod submit;
mod user;
mod workers;

pub use finish::RunFacts;
use stats::agent_label;
pub use stats::{FinishedTask, QueueCounts, Recent};

use crate::error::{Error, Result};
use crate::location::Location;
use crate::model::*;
use crate::result::TaskResult;
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
    // A result this build cannot read (written by a newer one, say) leaves the task readable:
    // the row keeps the text, and the task shows no result rather than failing every read.
    let result: Option<TaskResult> =
        row.get::<Option<String>>(19)?.and_then(|text| match serde_json::from_str(&text) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(column = "result", error = %e, "a task's result does not read");
                None
            }
        });
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
}

/// Task ids from a `group_concat(id)` column (NULL when there are none).
fn id_list(ids: Option<String>) -> Vec<TaskId> {
    ids.unwrap_or_default().split(',').filter_map(|s| s.parse().ok().map(TaskId)).collect()
}

/// The setting that pauses the queue (its value: when, in seconds since the epoch); the claim's
/// SQL names it too.
const PAUSED: &str = "paused";

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
/// Writes a task's result, when there is one, and its spend beside it: the queue's sums read
/// the `cost_usd` and `tokens` columns, never the JSON. `None` leaves all three as they are.
fn write_result(tx: &mut dyn Tx, id: TaskId, result: Option<&TaskResult>) -> Result<()> {
    let Some(r) = result else { return Ok(()) };
    let text =
        serde_json::to_string(r).map_err(|source| Error::Json { column: "result", source })?;
    tx.exec(
        "UPDATE tasks SET result = ?1, cost_usd = ?2, tokens = ?3 WHERE id = ?4",
        args![text, r.usage.cost_usd, r.usage.tokens(), id.0],
    )?;
    Ok(())
}

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
    result: Option<&TaskResult>,
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
        "UPDATE tasks SET status = ?1, error = coalesce(?2, error),
           finished_at = ?3, updated_at = ?3, lease_until = NULL, pending_answer = NULL,
           cancel_requested = 0, agent_pid = NULL, agent_started = NULL, ask = NULL,
           question = CASE WHEN ?1 = 'waiting' THEN question ELSE NULL END
         WHERE id = ?4",
        args![to.as_str(), error, now, id.0],
    )?;
    write_result(tx, id, result)?;
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
