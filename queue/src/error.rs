use crate::jobs::{JobId, JobStatus};
use crate::model::{TaskId, TaskStatus};

/// Everything that can go wrong in the queue. Messages are written for the person who will read
/// them: they name the thing, the bad value, and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("task {0} does not exist; `taskbridge list` shows the tasks that do")]
    NotFound(TaskId),
    #[error("task {id} is {from}; {action} needs a task that is {allowed}")]
    InvalidTransition { id: TaskId, from: TaskStatus, action: &'static str, allowed: &'static str },
    #[error("job {0} does not exist; claude_submit returns the ids of jobs")]
    JobNotFound(JobId),
    #[error("job {id} is {from}; {action} needs a job that is {allowed}")]
    JobTransition { id: JobId, from: JobStatus, action: &'static str, allowed: &'static str },
    #[error("dependency cycle: {}", fmt_cycle(.0))]
    DependencyCycle(Vec<String>),
    #[error("invalid {field}: {message}")]
    Invalid { field: &'static str, message: String },
    #[error(
        "task {id}: this worker's lease (token {token}) is no longer valid; another worker owns \
         the task now or it was requeued, so this result was rejected"
    )]
    StaleLease { id: TaskId, token: i64 },
    #[error("database {path}: {message}")]
    Open { path: String, message: String },
    #[error(
        "the database was written by a newer TaskBridge (schema {found}, this build knows up to \
         {known}); upgrade taskbridge"
    )]
    SchemaTooNew { found: i64, known: i64 },
    #[error("disk full: the database could not be written ({0}); free some space and retry")]
    DiskFull(String),
    #[error(
        "the database {path} is damaged ({detail}). Stop every TaskBridge process, then restore \
         it from a backup, or rescue what is left: {}. `taskbridge doctor` checks the file",
        crate::sqlite::recover_commands(path)
    )]
    Corrupt { path: String, detail: String },
    #[error(
        "the database {path} cannot be written ({detail}): check that the file and its \
         directory belong to you and are writable (`ls -l {path}`; SQLite also writes files \
         beside it), and that the file system is not mounted read-only; or point --db \
         (TASKBRIDGE_DB) or --home elsewhere"
    )]
    ReadOnly { path: String, detail: String },
    #[error("database error: {0}")]
    Sqlite(rusqlite::Error),
    #[error("PostgreSQL: {message}{}", .code.as_ref().map(|c| format!(" (SQLSTATE {c})")).unwrap_or_default())]
    Postgres { code: Option<String>, message: String },
    #[error(
        "the database is unreachable ({message}); TaskBridge kept trying for a minute. Check that \
         the server runs and the URL in --db/TASKBRIDGE_DB is right"
    )]
    Unavailable { message: String },
    #[error("the database returned something this build cannot read (column {column}: {message})")]
    Decode { column: usize, message: String },
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("corrupt JSON in column {column}: {source}")]
    Json { column: &'static str, source: serde_json::Error },
}

fn fmt_cycle(path: &[String]) -> String {
    format!("{}; a task cannot (indirectly) depend on itself", path.join(" -> "))
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        if let rusqlite::Error::SqliteFailure(f, _) = &e
            && f.code == rusqlite::ErrorCode::DiskFull
        {
            return Error::DiskFull(e.to_string());
        }
        Error::Sqlite(e)
    }
}

impl From<postgres::Error> for Error {
    fn from(e: postgres::Error) -> Self {
        crate::pg::pg_error(e)
    }
}

impl Error {
    pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Error::Invalid { field, message: message.into() }
    }

    /// True for errors caused by the caller's input or the task's state (as opposed to the
    /// database or the disk): front ends report these as refusals, not as server faults.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            Error::NotFound(_)
                | Error::InvalidTransition { .. }
                | Error::JobNotFound(_)
                | Error::JobTransition { .. }
                | Error::DependencyCycle(_)
                | Error::Invalid { .. }
        )
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
