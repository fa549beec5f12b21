//! The PostgreSQL backend, for a queue shared by workers on several hosts.
//!
//! Same schema versions and semantics as SQLite. Transitions run in READ COMMITTED
//! transactions that lock the rows they decide on (`FOR UPDATE`, which SQLite's side drops);
//! the claim is one statement with `FOR UPDATE SKIP LOCKED`. Time is always the database's
//! (`now()`), so hosts with skewed clocks agree on leases. A connection that went away (the
//! server restarted, a proxy dropped it) is opened again and the transaction run again, for up
//! to [`RECONNECT_FOR`]; every transition is safe to run again because each one checks the
//! state (and the lease) it starts from.

use crate::error::{Error, Result};
use crate::location::{PgUrl, Tls};
use crate::sql::{Arg, Dialect, Row, Tx, Value};
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use postgres::{Client, GenericClient, Statement};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Embedded migrations as (schema version, SQL). PostgreSQL support came with schema 5, so its
/// first migration creates that schema whole; later versions add a file to both backends.
const MIGRATIONS: &[(i64, &str)] = &[
    (5, include_str!("../migrations/pg/0005_schema.sql")),
    (6, include_str!("../migrations/pg/0006_remote.sql")),
    (7, include_str!("../migrations/pg/0007_orphans.sql")),
    (8, include_str!("../migrations/pg/0008_worker_agents.sql")),
    (9, include_str!("../migrations/pg/0009_spend.sql")),
    (10, include_str!("../migrations/pg/0010_metrics.sql")),
];

/// How long an operation keeps trying to reach a database that went away.
pub const RECONNECT_FOR: Duration = Duration::from_secs(60);

/// Prepared statements by SQL and argument types, each with whether it can change rows.
type Cache = HashMap<(String, Vec<Type>), (Statement, bool)>;

#[derive(Default)]
struct Conn {
    client: Option<Client>,
    cache: Cache,
}

pub struct Db {
    url: PgUrl,
    writer: Mutex<Conn>,
    reader: Mutex<Conn>,
}

impl Db {
    pub fn open(url: &PgUrl) -> Result<Db> {
        let client = off_runtime(|| {
            let mut client = connect(url)?;
            migrate(&mut client, url)?;
            Ok::<_, Error>(client)
        })?;
        Ok(Db {
            url: url.clone(),
            writer: Mutex::new(Conn { client: Some(client), cache: Cache::new() }),
            reader: Mutex::new(Conn::default()),
        })
    }

    /// Runs `f` with a live connection, opening one (again) when needed, and runs it again
    /// after a lost connection, a deadlock or a serialisation failure (each rolled back).
    fn with_conn<T: Send>(
        &self,
        conn: &Mutex<Conn>,
        f: &mut (dyn FnMut(&mut Client, &mut Cache) -> Result<T> + Send),
    ) -> Result<T> {
        off_runtime(|| self.with_conn_here(conn, f))
    }

    fn with_conn_here<T>(
        &self,
        conn: &Mutex<Conn>,
        f: &mut (dyn FnMut(&mut Client, &mut Cache) -> Result<T> + Send),
    ) -> Result<T> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(50);
        let mut guard = conn.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let attempt = (|| {
                if guard.client.as_ref().is_none_or(Client::is_closed) {
                    guard.cache.clear();
                    // Unreachable now is worth waiting for: the server may be restarting.
                    guard.client = Some(connect(&self.url).map_err(|e| match e {
                        Error::Open { message, .. } => Error::Unavailable { message },
                        e => e,
                    })?);
                }
                let Conn { client, cache } = &mut *guard;
                let client = client
                    .as_mut()
                    .ok_or(Error::Unavailable { message: "no connection".into() })?;
                f(client, cache)
            })();
            match attempt {
                Err(e) if retryable(&e) && started.elapsed() < RECONNECT_FOR => {
                    if matches!(e, Error::Unavailable { .. }) {
                        guard.client = None;
                    }
                    tracing::warn!(error = %e, "the database is unavailable; trying again");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                other => return other,
            }
        }
    }

    /// One transaction with the database's time read inside it; returns its result and
    /// whether it changed anything (and then it notified the schema's channel).
    pub fn write<T: Send>(
        &self,
        f: &mut (dyn FnMut(&mut dyn Tx, f64) -> Result<T> + Send),
    ) -> Result<(T, bool)> {
        let channel = self.url.listen.then(|| self.url.channel());
        self.with_conn(&self.writer, &mut |client, cache| {
            // BEGIN with the clock, and NOTIFY with COMMIT, each in one round trip: a claim is
            // then three (the claim itself being the third), not five.
            let mut changed = false;
            let result = clock(client).and_then(|now| {
                let mut ptx = PgTx { client: &mut *client, cache, changed: false };
                let out = f(&mut ptx, now);
                changed = ptx.changed;
                out
            });
            match result {
                Ok(out) => {
                    let end = match &channel {
                        // The channel is `taskbridge_` and a validated schema name.
                        Some(ch) if changed => format!("SELECT pg_notify('{ch}', ''); COMMIT"),
                        _ => "COMMIT".to_owned(),
                    };
                    client.simple_query(&end).map_err(pg_error)?;
                    Ok((out, changed))
                }
                Err(e) => {
                    // A broken connection is dropped by the caller; a live one must not stay
                    // inside the failed transaction.
                    let _ = client.simple_query("ROLLBACK");
                    Err(e)
                }
            }
        })
    }

    /// A statement in a transaction of its own, without a notification (a worker's heartbeat).
    pub fn exec_alone(&self, sql: &str, args: &[Arg]) -> Result<u64> {
        self.with_conn(&self.writer, &mut |client, cache| {
            PgTx { client, cache, changed: false }.exec(sql, args)
        })
    }

    pub fn read<T: Send>(&self, f: &mut (dyn FnMut(&mut dyn Tx) -> Result<T> + Send)) -> Result<T> {
        self.with_conn(&self.reader, &mut |client, cache| {
            f(&mut PgTx { client, cache, changed: false })
        })
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        // Closing a connection blocks on the driver's runtime too (see `off_runtime`).
        let conns = [&mut self.writer, &mut self.reader]
            .map(|m| std::mem::take(m.get_mut().unwrap_or_else(|e| e.into_inner())));
        off_runtime(move || drop(conns));
    }
}

/// Runs `f` on a thread of its own and waits for it. The driver blocks on a small runtime of
/// its own, which tokio refuses on a thread that drives an async runtime (the MCP server, the
/// worker and the TUI call the store from such threads, as they may with SQLite); a scoped
/// thread is outside any runtime, and lets `f` borrow what the caller holds.
fn off_runtime<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|s| match s.spawn(f).join() {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

/// Opens a transaction and reads the database's clock in it.
fn clock(client: &mut Client) -> Result<f64> {
    let msgs =
        client.simple_query("BEGIN; SELECT extract(epoch from now())::float8").map_err(pg_error)?;
    msgs.iter()
        .find_map(|m| match m {
            postgres::SimpleQueryMessage::Row(r) => r.get(0).and_then(|v| v.parse().ok()),
            _ => None,
        })
        .ok_or_else(|| Error::Decode {
            column: 0,
            message: "the server gave no clock reading".into(),
        })
}

/// Errors after which running the transaction again is right: it was rolled back.
fn retryable(e: &Error) -> bool {
    match e {
        Error::Unavailable { .. } => true,
        Error::Postgres { code, .. } => {
            matches!(code.as_deref(), Some("40001" | "40P01" | "57P01" | "57P02" | "57P03"))
                || code.as_deref().is_some_and(|c| c.starts_with("08"))
        }
        _ => false,
    }
}

/// Maps a driver error onto the crate's: a lost connection, a full disk, or the server's
/// message with its SQLSTATE.
pub(crate) fn pg_error(e: postgres::Error) -> Error {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code().to_owned();
        if code == "53100" {
            return Error::DiskFull(db.message().to_owned());
        }
        if code.starts_with("08") || code.starts_with("57P") {
            return Error::Unavailable { message: db.message().to_owned() };
        }
        return Error::Postgres { code: Some(code), message: db.message().to_owned() };
    }
    if e.is_closed() || std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>()) {
        return Error::Unavailable { message: e.to_string() };
    }
    Error::Postgres { code: None, message: e.to_string() }
}

/// Opens a connection with the schema on its search path.
pub(crate) fn connect(url: &PgUrl) -> Result<Client> {
    let config: postgres::Config =
        url.driver_url.parse().map_err(|e| Error::invalid("db", format!("{url:?}: {e}")))?;
    let unreachable = |e: postgres::Error| {
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message = format!("{message}: {s}");
            source = s.source();
        }
        Error::Open {
            path: format!("{url:?}"),
            message: format!(
                "{message}; check that the server runs and that --db (TASKBRIDGE_DB) names it, \
                 its database and a user that may log in"
            ),
        }
    };
    let mut client = match url.tls {
        Tls::Off => config.connect(postgres::NoTls).map_err(unreachable)?,
        tls => config
            .connect(crate::pg_tls::connector(tls, url.root_cert.as_deref())?)
            .map_err(unreachable)?,
    };
    client.batch_execute(&format!("SET search_path TO \"{}\"", url.schema)).map_err(pg_error)?;
    Ok(client)
}

/// Brings the schema up to date under an advisory lock, so that hosts starting at once do not
/// race; refuses a schema written by a newer build.
fn migrate(client: &mut Client, url: &PgUrl) -> Result<()> {
    let mut tx = client.transaction().map_err(pg_error)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext($1))",
        &[&format!("taskbridge:{}", url.schema)],
    )
    .map_err(pg_error)?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS \"{}\";
         CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)",
        url.schema
    ))
    .map_err(pg_error)?;
    let found: Option<i64> = tx
        .query_one("SELECT max(version) FROM schema_version", &[])
        .map_err(pg_error)?
        .try_get(0)
        .map_err(pg_error)?;
    let found = found.unwrap_or(0);
    let known = crate::sqlite::SCHEMA_VERSION;
    if found > known {
        return Err(Error::SchemaTooNew { found, known });
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        tx.batch_execute(sql).map_err(pg_error)?;
        tx.execute("INSERT INTO schema_version (version) VALUES ($1)", &[version])
            .map_err(pg_error)?;
    }
    tx.commit().map_err(pg_error)?;
    Ok(())
}

/// The shared SQL, as PostgreSQL reads it: `$N` placeholders and PostgreSQL's names for the
/// few SQLite functions the store uses.
pub(crate) fn translate(sql: &str) -> String {
    const SPELLINGS: &[(&str, &str)] = &[
        (
            "unixepoch('now', 'localtime', 'start of day', 'utc')",
            "extract(epoch from date_trunc('day', now()))::float8",
        ),
        ("unixepoch('subsec')", "extract(epoch from now())::float8"),
        ("group_concat(t.id)", "string_agg(t.id::text, ',')"),
        ("group_concat(d.depends_on)", "string_agg(d.depends_on::text, ',')"),
    ];
    let mut out = String::with_capacity(sql.len() + 16);
    let mut in_string = false;
    for c in sql.chars() {
        if c == '\'' {
            in_string = !in_string;
        }
        if c == '?' && !in_string {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    for (from, to) in SPELLINGS {
        if out.contains(from) {
            out = out.replace(from, to);
        }
    }
    out
}

struct PgTx<'a, C: GenericClient> {
    client: &'a mut C,
    cache: &'a mut Cache,
    changed: bool,
}

impl<C: GenericClient> PgTx<'_, C> {
    fn statement(&mut self, sql: &str, args: &[Arg]) -> Result<(Statement, bool)> {
        let types: Vec<Type> = args
            .iter()
            .map(|a| match a {
                Arg::Int(_) => Type::INT8,
                Arg::Real(_) => Type::FLOAT8,
                Arg::Text(_) => Type::TEXT,
            })
            .collect();
        let key = (sql.to_owned(), types);
        if let Some(s) = self.cache.get(&key) {
            return Ok(s.clone());
        }
        let stmt = self.client.prepare_typed(&translate(sql), &key.1).map_err(pg_error)?;
        let entry = (stmt, is_write(sql));
        self.cache.insert(key, entry.clone());
        Ok(entry)
    }
}

fn params(args: &[Arg]) -> Vec<&(dyn ToSql + Sync)> {
    args.iter().map(|a| a as &(dyn ToSql + Sync)).collect()
}

/// A statement that may change rows: only those wake the schema's listeners. The claim is a
/// `WITH … UPDATE`.
fn is_write(sql: &str) -> bool {
    let upper = sql.trim_start().to_ascii_uppercase();
    let verbs = ["INSERT", "UPDATE", "DELETE"];
    verbs.iter().any(|v| upper.starts_with(v))
        || (upper.starts_with("WITH") && verbs.iter().any(|v| upper.contains(&format!("{v} "))))
}

impl<C: GenericClient> Tx for PgTx<'_, C> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn exec(&mut self, sql: &str, args: &[Arg]) -> Result<u64> {
        let (stmt, writes) = self.statement(sql, args)?;
        let n = self.client.execute(&stmt, &params(args)).map_err(pg_error)?;
        if n > 0 && writes {
            self.changed = true;
        }
        Ok(n)
    }

    fn query(&mut self, sql: &str, args: &[Arg]) -> Result<Vec<Row>> {
        let (stmt, writes) = self.statement(sql, args)?;
        let rows = self.client.query(&stmt, &params(args)).map_err(pg_error)?;
        if !rows.is_empty() && writes {
            self.changed = true;
        }
        rows.iter().map(row).collect()
    }
}

fn row(r: &postgres::Row) -> Result<Row> {
    let mut out = Vec::with_capacity(r.len());
    for (i, col) in r.columns().iter().enumerate() {
        let decode = |e: postgres::Error| Error::Decode { column: i, message: e.to_string() };
        let v = match *col.type_() {
            Type::INT8 => r.try_get::<_, Option<i64>>(i).map_err(decode)?.map(Value::Int),
            Type::INT4 => {
                r.try_get::<_, Option<i32>>(i).map_err(decode)?.map(|v| Value::Int(v.into()))
            }
            Type::INT2 => {
                r.try_get::<_, Option<i16>>(i).map_err(decode)?.map(|v| Value::Int(v.into()))
            }
            Type::BOOL => {
                r.try_get::<_, Option<bool>>(i).map_err(decode)?.map(|v| Value::Int(v.into()))
            }
            Type::FLOAT8 => r.try_get::<_, Option<f64>>(i).map_err(decode)?.map(Value::Real),
            Type::FLOAT4 => {
                r.try_get::<_, Option<f32>>(i).map_err(decode)?.map(|v| Value::Real(v.into()))
            }
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => {
                r.try_get::<_, Option<String>>(i).map_err(decode)?.map(Value::Text)
            }
            ref other => {
                return Err(Error::Decode {
                    column: i,
                    message: format!(
                        "column {} has type {other}, which the store does not read",
                        col.name()
                    ),
                });
            }
        };
        out.push(v.unwrap_or(Value::Null));
    }
    Ok(Row(out))
}

impl ToSql for Arg {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Arg::Int(v) => v.to_sql(ty, out),
            Arg::Real(v) => v.to_sql(ty, out),
            Arg::Text(v) => v.as_deref().to_sql(ty, out),
        }
    }

    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::INT8 | Type::FLOAT8 | Type::TEXT)
    }

    to_sql_checked!();
}

/// Calls `on_change` soon after any process commits to the schema: LISTEN on its channel, a
/// ping and a look every `url.poll` (a dead connection can be silent; NOTIFYs sent while the
/// listener was away are lost), and a call after every reconnect, since anything may have
/// happened meanwhile. With `listen=off` only the poll.
pub fn watch(
    url: &PgUrl,
    stop: Arc<std::sync::atomic::AtomicBool>,
    on_change: Arc<dyn Fn() + Send + Sync>,
) -> Result<()> {
    use std::sync::atomic::Ordering;
    let url = url.clone();
    std::thread::Builder::new()
        .name("taskbridge-pg-listen".into())
        .spawn(move || {
            let mut pause = Duration::from_millis(100);
            while !stop.load(Ordering::Relaxed) {
                if !url.listen {
                    std::thread::sleep(url.poll);
                    on_change();
                    continue;
                }
                let mut client = match connect(&url).and_then(|mut c| {
                    c.batch_execute(&format!("LISTEN \"{}\"", url.channel())).map_err(pg_error)?;
                    Ok(c)
                }) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "the change listener cannot connect; trying again");
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(Duration::from_secs(5));
                        continue;
                    }
                };
                pause = Duration::from_millis(100);
                on_change();
                'listening: while !stop.load(Ordering::Relaxed) {
                    // One notification (or the poll's timeout) wakes once: several commits
                    // in a burst need one look.
                    let next = {
                        let mut notes = client.notifications();
                        let mut iter = notes.timeout_iter(url.poll);
                        postgres::fallible_iterator::FallibleIterator::next(&mut iter)
                    };
                    let got = match next {
                        Ok(n) => n.is_some(),
                        Err(e) => {
                            tracing::warn!(error = %e, "the change listener lost its connection");
                            break 'listening;
                        }
                    };
                    if !got && client.is_valid(Duration::from_secs(5)).is_err() {
                        tracing::warn!("the change listener's connection is dead; reconnecting");
                        break 'listening;
                    }
                    on_change();
                }
            }
        })
        .map_err(|e| Error::Io { context: "starting the change listener".into(), source: e })?;
    Ok(())
}
