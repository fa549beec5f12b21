//! The SQLite backend: one file, WAL, every write one `BEGIN IMMEDIATE` transaction.

use crate::error::{Error, Result};
use crate::sql::{Arg, Dialect, Row, Tx, Value};
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, TransactionBehavior};
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Ordered, embedded migrations; `PRAGMA user_version` records how many have run.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_claude_jobs.sql"),
    include_str!("../migrations/0003_worker_agent.sql"),
    include_str!("../migrations/0004_decisions.sql"),
    include_str!("../migrations/0005_plans.sql"),
    include_str!("../migrations/0006_remote.sql"),
    include_str!("../migrations/0007_orphans.sql"),
    include_str!("../migrations/0008_worker_agents.sql"),
    include_str!("../migrations/0009_spend.sql"),
    include_str!("../migrations/0010_metrics.sql"),
];

/// The schema version this build writes (both backends carry the same versions).
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How a write transaction is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync'd before the call returns: survives power loss (`synchronous=FULL`).
    Full,
    /// Survives any process crash, not a power cut (`synchronous=NORMAL` in WAL mode).
    CrashSafe,
}

pub struct Db {
    conn: Mutex<Connection>,
    /// A second connection for reads: in WAL mode readers never wait for a writer, so a read
    /// (an MCP `get_task`, a TUI refresh) is not queued behind another request's fsync.
    reader: Mutex<Connection>,
    path: PathBuf,
}

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

impl Db {
    /// Opens (creating if needed, mode 0600) the database at `path` and brings its schema up to
    /// date. The parent directory must exist.
    pub fn open(path: &Path) -> Result<Db> {
        let path = path.to_path_buf();
        crate::home::create_private_file(&path)?;
        let open_err = |e: rusqlite::Error| Error::Open {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        let mut conn = Connection::open(&path).map_err(open_err)?;
        conn.busy_handler(Some(busy_handler))?;
        prepare_retrying(&mut conn).map_err(|e| locate(&path, e))?;
        let mut reader = Connection::open(&path).map_err(open_err)?;
        reader.busy_handler(Some(busy_handler))?;
        reader.pragma_update(None, "query_only", "ON")?;
        Ok(Db { conn: Mutex::new(conn), reader: Mutex::new(reader), path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The faults a person must fix on the file itself, named with the file.
    fn located(&self, e: Error) -> Error {
        locate(&self.path, e)
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave a half-written transaction behind (it rolls
        // back on drop), so a poisoned connection is still usable.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` in one IMMEDIATE transaction with the time read inside it; returns its result
    /// and whether anything changed.
    pub fn write<T>(
        &self,
        durability: Durability,
        f: &mut (dyn FnMut(&mut dyn Tx, f64) -> Result<T> + Send),
    ) -> Result<(T, bool)> {
        let mut conn = self.lock();
        if durability == Durability::CrashSafe {
            conn.pragma_update(None, "synchronous", "NORMAL")?;
        }
        let result = (|| -> Result<(T, bool)> {
            let before = conn.total_changes();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now: f64 =
                tx.prepare_cached("SELECT unixepoch('subsec')")?.query_row([], |r| r.get(0))?;
            let out = f(&mut Conn(&tx), now)?;
            tx.commit()?;
            Ok((out, conn.total_changes() != before))
        })();
        if durability == Durability::CrashSafe {
            conn.pragma_update(None, "synchronous", "FULL").map_err(|e| self.located(e.into()))?;
        }
        result.map_err(|e| self.located(e))
    }

    /// A statement outside any transaction, for writes that need no lock on anything else (a
    /// worker's heartbeat).
    pub fn exec_alone(&self, sql: &str, args: &[Arg]) -> Result<u64> {
        let conn = self.lock();
        Conn(&conn).exec(sql, args).map_err(|e| self.located(e))
    }

    pub fn read<T>(&self, f: &mut (dyn FnMut(&mut dyn Tx) -> Result<T> + Send)) -> Result<T> {
        let conn = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut Conn(&conn)).map_err(|e| self.located(e))
    }

    /// `PRAGMA integrity_check`, for crash tests and `taskbridge status`.
    pub fn integrity_check(&self) -> Result<String> {
        let conn = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        Ok(conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?)
    }

    /// `PRAGMA quick_check` ("ok" when sound; else what is wrong), for `taskbridge doctor`.
    pub fn quick_check(&self) -> Result<String> {
        let conn = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        let lines = (|| {
            let mut stmt = conn.prepare("PRAGMA quick_check")?;
            stmt.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<Vec<String>>>()
        })();
        // A page too damaged to check fails the check itself.
        lines.map(|l| l.join("; ")).map_err(|e| self.located(e.into()))
    }
}

/// [`prepare`], again while another process holds the file: two processes creating the database
/// at once (a worker and a submit, say) can meet while one switches it to WAL, which SQLite
/// reports as busy without asking the busy handler.
fn prepare_retrying(conn: &mut Connection) -> Result<()> {
    let mut tries = 0;
    loop {
        match prepare(conn) {
            Err(Error::Sqlite(e))
                if tries < 500
                    && matches!(
                        e.sqlite_error_code(),
                        Some(
                            rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                        )
                    ) =>
            {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            other => break other,
        }
    }
}

/// How to rescue what is left of a damaged database file: into a new file first (`.recover`
/// keeps the schema version), looked at, and only then put in place, the damaged one kept.
pub fn recover_commands(path: &str) -> String {
    let q = |p: &str| format!("'{}'", p.replace('\'', r"'\''"));
    let (db, new, old) = (q(path), q(&format!("{path}.recovered")), q(&format!("{path}.damaged")));
    format!(
        "`sqlite3 {db} .recover | sqlite3 {new}`, look at it (`taskbridge --db {new} list`), and \
         if it holds your tasks put it in place: `mv {db} {old} && rm -f {db}-wal {db}-shm && mv \
         {new} {db}`"
    )
}

/// `e`, as the fault of the file at `path` when it is one a person must fix there (damaged, not
/// writable).
fn locate(path: &Path, e: Error) -> Error {
    let Error::Sqlite(inner) = &e else { return e };
    let path = path.display().to_string();
    let detail = inner.to_string();
    match inner.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase) => {
            Error::Corrupt { path, detail }
        }
        Some(rusqlite::ErrorCode::ReadOnly) => Error::ReadOnly { path, detail },
        _ => e,
    }
}

/// A connection (or a transaction, which derefs to one) as a [`Tx`].
pub struct Conn<'a>(pub &'a Connection);

/// SQLite has no row locks (its writers are serialised by the IMMEDIATE transaction), so the
/// shared SQL's `FOR UPDATE` is dropped here.
fn local(sql: &str) -> Cow<'_, str> {
    if sql.contains(" FOR UPDATE") {
        Cow::Owned(sql.replace(" FOR UPDATE", ""))
    } else {
        sql.into()
    }
}

impl rusqlite::ToSql for Arg {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Arg::Int(Some(i)) => ToSqlOutput::from(*i),
            Arg::Real(Some(f)) => ToSqlOutput::from(*f),
            Arg::Text(Some(s)) => ToSqlOutput::from(s.as_str()),
            Arg::Int(None) | Arg::Real(None) | Arg::Text(None) => {
                ToSqlOutput::from(rusqlite::types::Null)
            }
        })
    }
}

fn value(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) | ValueRef::Blob(t) => Value::Text(String::from_utf8_lossy(t).into()),
    }
}

impl Tx for Conn<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn exec(&mut self, sql: &str, args: &[Arg]) -> Result<u64> {
        let mut stmt = self.0.prepare_cached(&local(sql))?;
        Ok(stmt.execute(rusqlite::params_from_iter(args))? as u64)
    }

    fn query(&mut self, sql: &str, args: &[Arg]) -> Result<Vec<Row>> {
        let mut stmt = self.0.prepare_cached(&local(sql))?;
        let width = stmt.column_count();
        let mut rows = stmt.query(rusqlite::params_from_iter(args))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let mut row = Vec::with_capacity(width);
            for i in 0..width {
                row.push(value(r.get_ref(i)?));
            }
            out.push(Row(row));
        }
        Ok(out)
    }
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
    if version > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew { found: version, known: SCHEMA_VERSION });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", i as i64 + 1)?;
    }
    tx.commit()?;
    Ok(())
}
