//! `taskbridge migrate`: copies a whole queue from one backend to another (SQLite to
//! PostgreSQL when a team outgrows one machine, or back), so that moving loses nothing: tasks
//! with their ids, dependencies, notes, questions and answers, budgets, the reverse bridge's
//! jobs, workers and settings.
//!
//! Both stores are at this build's schema version (opening them migrated them), so every
//! column is known here; the copy is one transaction on the target, which must be empty.

use crate::error::{Error, Result};
use crate::sql::{Arg, Dialect, Row, Value};
use crate::store::Store;

/// Each table in an order that satisfies its references, with its columns and their kinds
/// (`i` integer, `r` real, `t` text): a NULL still needs a type on PostgreSQL.
const TABLES: &[(&str, &str)] = &[
    ("settings", "key:t value:t"),
    ("budgets", "id:i max_cost_usd:r max_tokens:i created_at:r"),
    (
        "workers",
        "id:t pid:i host:t started_at:r heartbeat_at:r concurrency:i stopped_at:r agent:t agents:t",
    ),
    (
        "tasks",
        "id:i title:t prompt:t repo:t base:t priority:i model:t agent:t readonly:i no_network:i \
         no_shell:i worktree_keep:i max_attempts:i timeout_s:i question_timeout_s:i request_id:t \
         status:t question:t asked_at:r pending_answer:t session_id:t result:t error:t \
         attempts:i worker:t lease_token:i lease_until:r not_before:r cancel_requested:i \
         failed_dependency:i agent_pid:i agent_started:t worker_host:t branch:t worktree:t \
         created_at:r started_at:r finished_at:r updated_at:r ask:t parked_worker:t ask_rules:t \
         max_cost_usd:r max_tokens:i budget_group:i base_ref:t started_from:t stacked_on:t \
         merged_into:t merge_commit:t parent:i remote:t cost_usd:r tokens:i",
    ),
    ("task_deps", "task_id:i depends_on:i"),
    ("task_notes", "id:i task_id:i note:t created_at:r delivered:i"),
    (
        "task_questions",
        "id:i task_id:i question:t asked_at:r answer:t answered_at:r ask:t answered_by:t",
    ),
    ("orphans", "id:i host:t pid:i started:t task_id:i found_at:r"),
    (
        "claude_jobs",
        "id:i status:t request:t result:t error:t owner_host:t owner_pid:i owner_started:t \
         created_at:r started_at:r finished_at:r",
    ),
];

/// A table's name, its columns with their kinds, and its rows.
type TableRows = (&'static str, Vec<(&'static str, char)>, Vec<Row>);

/// What was copied: rows per table, in copy order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied(pub Vec<(&'static str, usize)>);

fn arg(v: &Value, kind: char) -> Arg {
    match (v, kind) {
        (Value::Null, 'i') => Arg::Int(None),
        (Value::Null, 'r') => Arg::Real(None),
        (Value::Null, _) => Arg::Text(None),
        (Value::Int(i), 'r') => Arg::Real(Some(*i as f64)),
        (Value::Int(i), _) => Arg::Int(Some(*i)),
        (Value::Real(f), 'i') => Arg::Int(Some(*f as i64)),
        (Value::Real(f), _) => Arg::Real(Some(*f)),
        (Value::Text(s), _) => Arg::Text(Some(s.clone())),
    }
}

/// Copies every row of `from` into `to`. Refused while a worker is alive on `from` (its
/// writes would be lost) and when `to` already holds tasks or jobs.
pub fn copy_queue(from: &Store, to: &Store) -> Result<Copied> {
    let alive: Vec<String> = from
        .list_workers()?
        .into_iter()
        .filter(|w| !w.stopped && !w.stale)
        .map(|w| format!("{} on {}", w.id, w.host))
        .collect();
    if !alive.is_empty() {
        return Err(Error::invalid(
            "from",
            format!(
                "workers are running on it ({}); stop them first, so that nothing they write is \
                 left behind",
                alive.join(", ")
            ),
        ));
    }
    let mut data: Vec<TableRows> = Vec::new();
    for (table, spec) in TABLES {
        let cols: Vec<(&'static str, char)> = spec
            .split_whitespace()
            .filter_map(|c| c.split_once(':'))
            .map(|(name, kind)| (name, kind.chars().next().unwrap_or('t')))
            .collect();
        let names: Vec<&str> = cols.iter().map(|(n, _)| *n).collect();
        let order = if names.contains(&"id") { "id" } else { "1, 2" };
        let sql = format!("SELECT {} FROM {table} ORDER BY {order}", names.join(", "));
        let rows = from.read(|conn| conn.query(&sql, &[]))?;
        data.push((table, cols, rows));
    }
    to.write(|tx, _now| {
        let existing: i64 = tx
            .query_one(
                "SELECT (SELECT count(*) FROM tasks) + (SELECT count(*) FROM claude_jobs)",
                &[],
            )?
            .get(0)?;
        if existing > 0 {
            return Err(Error::invalid(
                "to",
                format!(
                    "it already holds {existing} tasks and jobs; migrate into an empty queue (a \
                     new ?schema=NAME on PostgreSQL, a new file on SQLite)"
                ),
            ));
        }
        // The target's own settings (written when it was opened) give way to the source's.
        tx.exec("DELETE FROM settings", &[])?;
        let mut copied = Vec::new();
        for (table, cols, rows) in &data {
            let names: Vec<&str> = cols.iter().map(|(n, _)| *n).collect();
            let marks: Vec<String> = (1..=cols.len()).map(|i| format!("?{i}")).collect();
            let sql =
                format!("INSERT INTO {table} ({}) VALUES ({})", names.join(", "), marks.join(", "));
            for row in rows {
                let args: Vec<Arg> =
                    row.0.iter().zip(cols).map(|(v, (_, kind))| arg(v, *kind)).collect();
                tx.exec(&sql, &args)?;
            }
            copied.push((*table, rows.len()));
        }
        if tx.dialect() == Dialect::Postgres {
            // Ids were copied as they were: new rows must be numbered after them.
            for (table, _) in TABLES.iter().filter(|(_, spec)| spec.starts_with("id:i")) {
                tx.query(
                    &format!(
                        "SELECT setval(pg_get_serial_sequence('{table}', 'id'),
                            coalesce((SELECT max(id) FROM {table}), 0) + 1, false)"
                    ),
                    &[],
                )?;
            }
        }
        Ok(Copied(copied))
    })
}
