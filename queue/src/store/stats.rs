//! What the queue knows about how it has been going, for metrics and the TUI's stats view:
//! tasks per state, what was ever submitted, and the tasks that finished lately with their
//! timings, spend and failure kinds. Plain rows; the front ends draw and aggregate them.

use super::*;

/// The queue's counts, as a scrape reads them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueCounts {
    /// Tasks in each state, every state listed (zero where none).
    pub by_status: Vec<(TaskStatus, u64)>,
    /// Tasks ever submitted, by agent (`opencode`, `claude-code`, `codex`); clearing finished
    /// tasks does not lower it.
    pub submitted: Vec<(String, u64)>,
}

/// A task that finished (done, failed or cancelled) within the window asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedTask {
    pub id: TaskId,
    /// `opencode`, `claude-code` or `codex`.
    pub agent: String,
    pub status: TaskStatus,
    pub finished_at: f64,
    /// Its last claim to its end.
    pub run_s: Option<f64>,
    /// How long it had been ready when its last claim took it.
    pub queue_wait_s: Option<f64>,
    pub cost_usd: Option<f64>,
    pub failure_kind: Option<FailureKind>,
}

/// The tasks that finished lately, and the database's clock when they were read (the stats
/// view buckets them against it, so that another host's clock does not shift its charts).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recent {
    pub now: f64,
    pub tasks: Vec<FinishedTask>,
}

/// How a stored agent reads as a metric label: a task that names none, or one of OpenCode's
/// own agents, runs on OpenCode.
pub(crate) fn agent_label(stored: Option<&str>) -> &'static str {
    match stored {
        Some("claude-code") => "claude-code",
        Some("codex") => "codex",
        _ => "opencode",
    }
}

const AGENT_LABEL_SQL: &str =
    "CASE WHEN agent IN ('claude-code', 'codex') THEN agent ELSE 'opencode' END";

impl Store {
    pub fn counts(&self) -> Result<QueueCounts> {
        self.read(|conn| {
            let mut by_status: Vec<(TaskStatus, u64)> =
                TaskStatus::ALL.iter().map(|s| (*s, 0)).collect();
            for r in conn.query("SELECT status, count(*) FROM tasks GROUP BY status", &[])? {
                let status = status_from_str(&r.get::<String>(0)?)?;
                let n: i64 = r.get(1)?;
                if let Some(slot) = by_status.iter_mut().find(|(s, _)| *s == status) {
                    slot.1 = n.max(0) as u64;
                }
            }
            let submitted = conn
                .query(
                    "SELECT label, value FROM counters WHERE name = 'submitted' ORDER BY label",
                    &[],
                )?
                .iter()
                .map(|r| Ok((r.get::<String>(0)?, r.get::<i64>(1)?.max(0) as u64)))
                .collect::<Result<Vec<_>>>()?;
            Ok(QueueCounts { by_status, submitted })
        })
    }

    /// The tasks that finished within `window` of now, oldest first.
    pub fn finished_within(&self, window: Duration) -> Result<Recent> {
        self.read(|conn| {
            let now: f64 = conn.query_one("SELECT unixepoch('subsec')", &[])?.get(0)?;
            let rows = conn.query(
                &format!(
                    "SELECT id, {AGENT_LABEL_SQL}, status, finished_at,
                            finished_at - claimed_at, queue_wait_s, cost_usd, failure_kind
                       FROM tasks
                      WHERE finished_at IS NOT NULL AND finished_at > ?1
                        AND status IN ('done', 'failed', 'cancelled')
                      ORDER BY finished_at, id"
                ),
                args![now - window.as_secs_f64()],
            )?;
            let tasks = rows
                .iter()
                .map(|r| {
                    Ok(FinishedTask {
                        id: TaskId(r.get(0)?),
                        agent: r.get(1)?,
                        status: status_from_str(&r.get::<String>(2)?)?,
                        finished_at: r.get(3)?,
                        run_s: r.get::<Option<f64>>(4)?.map(|s| s.max(0.0)),
                        queue_wait_s: r.get(5)?,
                        cost_usd: r.get(6)?,
                        failure_kind: r
                            .get::<Option<String>>(7)?
                            .and_then(|k| FailureKind::parse(&k)),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Recent { now, tasks })
        })
    }
}
