//! Jobs of the reverse bridge: questions sent to Claude in the background (`claude_submit`).
//!
//! A job is run by the bridge process that accepted it, so each row names its owner (host, pid
//! and the process's start time). A job never stays `running` after its owner died: the next
//! bridge to start marks it failed as interrupted ([`Store::interrupt_orphaned_jobs`]).
//!
//! States: `queued -> running -> done | failed`, and `queued | running -> cancelled`. A finished
//! job never changes again; anything else is refused with [`Error::JobTransition`].

use crate::error::{Error, Result};
use crate::sql::{Row, Tx, args};
use crate::store::Store;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub i64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    Queued,
    Running,
    Done,
    Failed,
    Cancelled,
}

impl JobStatus {
    pub const ALL: [JobStatus; 5] = [
        JobStatus::Queued,
        JobStatus::Running,
        JobStatus::Done,
        JobStatus::Failed,
        JobStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Done => "done",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
        }
    }

    pub fn is_finished(self) -> bool {
        matches!(self, JobStatus::Done | JobStatus::Failed | JobStatus::Cancelled)
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for JobStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        JobStatus::ALL
            .into_iter()
            .find(|j| j.as_str() == s)
            .ok_or_else(|| format!("unknown job status '{s}'"))
    }
}

/// The process that runs a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOwner {
    pub host: String,
    pub pid: i64,
    /// The process's start time as the OS reports it, so that a reused pid is not taken for the
    /// owner.
    pub started: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Job {
    pub id: JobId,
    pub status: JobStatus,
    /// The arguments the job was submitted with, as given.
    pub request: Value,
    pub result: Option<Value>,
    pub error: Option<String>,
    pub owner_host: String,
    pub owner_pid: i64,
    #[serde(skip)]
    pub owner_started: Option<String>,
    pub created_at: f64,
    pub started_at: Option<f64>,
    pub finished_at: Option<f64>,
}

/// How a job ended, as its runner reports it.
#[derive(Debug, Clone)]
pub enum JobOutcome {
    Done(Value),
    Failed(String),
}

const JOB_COLUMNS: &str = "id, status, request, result, error, owner_host, owner_pid, \
    owner_started, created_at, started_at, finished_at";

fn json_column(row: &Row, i: usize) -> Result<Option<Value>> {
    row.get::<Option<String>>(i)?
        .map(|t| {
            serde_json::from_str(&t).map_err(|source| Error::Json { column: "request", source })
        })
        .transpose()
}

fn job_from_row(row: &Row) -> Result<Job> {
    let status: String = row.get(1)?;
    let status = status.parse().map_err(|message: String| Error::Decode { column: 1, message })?;
    Ok(Job {
        id: JobId(row.get(0)?),
        status,
        request: json_column(row, 2)?.unwrap_or(Value::Null),
        result: json_column(row, 3)?,
        error: row.get(4)?,
        owner_host: row.get(5)?,
        owner_pid: row.get(6)?,
        owner_started: row.get(7)?,
        created_at: row.get(8)?,
        started_at: row.get(9)?,
        finished_at: row.get(10)?,
    })
}

fn load_job(conn: &mut dyn Tx, id: JobId) -> Result<Job> {
    static READ: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| format!("SELECT {JOB_COLUMNS} FROM claude_jobs WHERE id = ?1"));
    let row = conn.query_opt(&READ, args![id.0])?.ok_or(Error::JobNotFound(id))?;
    job_from_row(&row)
}

/// The job, its row locked for the rest of the transaction (see `store::status_of`).
fn lock_job(tx: &mut dyn Tx, id: JobId) -> Result<Job> {
    static BY_ID: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!("SELECT {JOB_COLUMNS} FROM claude_jobs WHERE id = ?1 FOR UPDATE")
    });
    let row = tx.query_opt(&BY_ID, args![id.0])?.ok_or(Error::JobNotFound(id))?;
    job_from_row(&row)
}

impl Store {
    /// Records a new job, queued, owned by `owner`.
    pub fn job_submit(&self, request: &Value, owner: &JobOwner) -> Result<Job> {
        self.write(|tx, now| {
            let id: i64 = tx
                .query_one(
                    "INSERT INTO claude_jobs (request, owner_host, owner_pid, owner_started,
                        created_at) VALUES (?1, ?2, ?3, ?4, ?5) RETURNING id",
                    args![request.to_string(), &owner.host, owner.pid, &owner.started, now],
                )?
                .get(0)?;
            load_job(tx, JobId(id))
        })
    }

    /// `queued -> running`. Returns `None` when the job is no longer queued (it was cancelled
    /// before it started), which tells the runner not to run it.
    pub fn job_start(&self, id: JobId) -> Result<Option<Job>> {
        self.write(|tx, now| {
            let n = tx.exec(
                "UPDATE claude_jobs SET status = 'running', started_at = ?1
                 WHERE id = ?2 AND status = 'queued'",
                args![now, id.0],
            )?;
            if n == 0 {
                // Distinguish an unknown id from a job that moved on.
                load_job(tx, id)?;
                return Ok(None);
            }
            load_job(tx, id).map(Some)
        })
    }

    /// `running -> done | failed`. A job cancelled meanwhile stays cancelled and its late
    /// outcome is dropped (`Ok(None)`).
    pub fn job_finish(&self, id: JobId, outcome: JobOutcome) -> Result<Option<Job>> {
        let (status, result, error) = match outcome {
            JobOutcome::Done(v) => ("done", Some(v.to_string()), None),
            JobOutcome::Failed(e) => ("failed", None, Some(e)),
        };
        self.write(|tx, now| {
            let n = tx.exec(
                "UPDATE claude_jobs SET status = ?1, result = ?2, error = ?3, finished_at = ?4
                 WHERE id = ?5 AND status = 'running'",
                args![status, &result, &error, now, id.0],
            )?;
            if n == 0 {
                let job = load_job(tx, id)?;
                if job.status == JobStatus::Cancelled {
                    return Ok(None);
                }
                return Err(Error::JobTransition {
                    id,
                    from: job.status,
                    action: "finish",
                    allowed: "running",
                });
            }
            load_job(tx, id).map(Some)
        })
    }

    /// Cancels a queued or running job. Its runner notices the new state and stops.
    pub fn job_cancel(&self, id: JobId) -> Result<Job> {
        self.write(|tx, now| {
            let job = lock_job(tx, id)?;
            if job.status.is_finished() {
                return Err(Error::JobTransition {
                    id,
                    from: job.status,
                    action: "cancel",
                    allowed: "queued or running",
                });
            }
            tx.exec(
                "UPDATE claude_jobs SET status = 'cancelled', finished_at = ?1,
                 error = 'cancelled before it finished' WHERE id = ?2",
                args![now, id.0],
            )?;
            load_job(tx, id)
        })
    }

    pub fn job(&self, id: JobId) -> Result<Job> {
        self.read(|conn| load_job(conn, id))
    }

    /// The number of jobs in each state (every state is present, zero or not).
    pub fn job_counts(&self) -> Result<BTreeMap<String, i64>> {
        self.read(|conn| {
            let mut counts: BTreeMap<String, i64> =
                JobStatus::ALL.iter().map(|s| (s.as_str().to_owned(), 0)).collect();
            for row in
                conn.query("SELECT status, count(*) FROM claude_jobs GROUP BY status", &[])?
            {
                counts.insert(row.get(0)?, row.get(1)?);
            }
            Ok(counts)
        })
    }

    /// Fails every queued or running job on `host` whose owner is gone, as interrupted.
    /// `alive(pid, started)` says whether that process still runs; it is asked outside SQL
    /// because only the caller can look at processes.
    pub fn interrupt_orphaned_jobs(
        &self,
        host: &str,
        alive: impl Fn(i64, Option<&str>) -> bool + Sync,
    ) -> Result<Vec<JobId>> {
        self.write(|tx, now| {
            let open = tx.query(
                "SELECT id, owner_pid, owner_started FROM claude_jobs
                 WHERE status IN ('queued', 'running') AND owner_host = ?1 ORDER BY id FOR UPDATE",
                args![host],
            )?;
            let mut ids = Vec::new();
            for row in open {
                let (id, pid, started): (i64, i64, Option<String>) =
                    (row.get(0)?, row.get(1)?, row.get(2)?);
                if alive(pid, started.as_deref()) {
                    continue;
                }
                tx.exec(
                    "UPDATE claude_jobs SET status = 'failed', finished_at = ?1, error = ?2
                     WHERE id = ?3",
                    args![
                        now,
                        format!(
                            "interrupted: the bridge process running it (pid {pid}) stopped \
                             before it finished; submit it again"
                        ),
                        id
                    ],
                )?;
                ids.push(JobId(id));
            }
            Ok(ids)
        })
    }
}
