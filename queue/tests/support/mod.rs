//! The two backends the store's conformance tests run on: a SQLite file in a temporary
//! directory, and a schema of its own on the PostgreSQL server named by `TASKBRIDGE_TEST_PG`
//! (`.ci/run` starts a throwaway one with `.ci/pg` and sets it), dropped when the test ends.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use taskbridge_queue::{Location, Store};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The queue this process works on when it is a child of a test (see [`child`]).
pub fn child_db() -> Option<String> {
    std::env::var("TB_CHILD_DB").ok()
}

/// The test that calls this, run again as a child process on the queue `db`; the test sees
/// [`child_db`] and plays the child's part. libtest names each test's thread after the test, so
/// the child runs exactly it. A child's part is never a test of its own, so nothing passes
/// vacuously under `--ignored`.
pub fn child(db: &str) -> std::process::Command {
    let test = std::thread::current().name().map(str::to_owned);
    let test = test.expect("child() is called from a test's own thread, which names the test");
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"]).env("TB_CHILD_DB", db);
    cmd
}

/// The server the PostgreSQL tests use.
pub fn pg_server() -> String {
    std::env::var("TASKBRIDGE_TEST_PG").unwrap_or_else(|_| {
        panic!(
            "the PostgreSQL tests need a server: set TASKBRIDGE_TEST_PG=postgres://… \
             (`.ci/pg start DIR` starts a throwaway one and prints its URL; .ci/run does this)"
        )
    })
}

/// A fresh queue; dropping it removes the file or the schema.
pub struct Db {
    pub location: Location,
    /// `--db` as a child process or the CLI would be given it.
    pub arg: String,
    dir: Option<tempfile::TempDir>,
    schema: Option<String>,
}

static N: AtomicUsize = AtomicUsize::new(0);

impl Db {
    pub fn new(b: Backend) -> Db {
        Db::with_params(b, "")
    }

    /// `params` go after the schema on a PostgreSQL URL (`&listen=off`, say).
    pub fn with_params(b: Backend, params: &str) -> Db {
        match b {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let arg = dir.path().join("q.db").display().to_string();
                Db { location: Location::parse(&arg).unwrap(), arg, dir: Some(dir), schema: None }
            }
            Backend::Postgres => {
                let schema = format!(
                    "t_{}_{}_{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .subsec_nanos()
                );
                let server = pg_server();
                let sep = if server.contains('?') { '&' } else { '?' };
                let arg = format!("{server}{sep}schema={schema}{params}");
                Db {
                    location: Location::parse(&arg).unwrap(),
                    arg,
                    dir: None,
                    schema: Some(schema),
                }
            }
        }
    }

    pub fn open(&self) -> Store {
        Store::connect(&self.location).unwrap()
    }

    /// Runs `sql` on the queue's own tables behind the store's back, as another program (or
    /// the clock) would change them: how a test makes a row older than the store could.
    pub fn sql(&self, sql: &str) {
        match (&self.location, &self.schema) {
            (Location::Sqlite(path), _) => {
                rusqlite::Connection::open(path).unwrap().execute_batch(sql).unwrap()
            }
            (_, Some(schema)) => {
                let mut c = ::postgres::Client::connect(&pg_server(), ::postgres::NoTls).unwrap();
                c.batch_execute(&format!("SET search_path TO \"{schema}\"; {sql}")).unwrap();
            }
            (Location::Postgres(_), None) => unreachable!("a PostgreSQL Db has its schema"),
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Some(schema) = &self.schema
            && let Ok(mut c) = ::postgres::Client::connect(&pg_server(), ::postgres::NoTls)
        {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"));
        }
    }
}

/// Runs each named test, `fn name(b: Backend)`, on both backends: `sqlite::name` and
/// `postgres::name`.
#[macro_export]
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[test] fn $name() { super::$name(super::support::Backend::Sqlite) } )*
        }
        mod postgres {
            $( #[test] fn $name() { super::$name(super::support::Backend::Postgres) } )*
        }
    };
}
