//! Noticing commits made by other processes.
//!
//! The database is the only channel between TaskBridge processes, so a worker must learn quickly
//! that another process submitted a task. On SQLite, two layers: on Linux an inotify watch on
//! the database's directory wakes when the `-wal` file is written, then follows `PRAGMA
//! data_version` on a connection of its own and calls back within a millisecond of each
//! commit becoming readable, until the writes stop; and a `PRAGMA data_version` poll catches
//! anything the edge signal missed (and is the only layer elsewhere). On PostgreSQL, LISTEN on
//! the schema's channel with a ping and a poll (see `crate::pg::watch`).

use crate::error::Result;
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often the safety-net poll runs where a file watch is in place, and where it is not.
const POLL_WITH_WATCH: Duration = Duration::from_millis(250);
const POLL_WITHOUT_WATCH: Duration = Duration::from_millis(20);

/// Calls a callback soon after any process commits to the database. Dropped, it stops calling
/// as soon as its threads look (the poll at its next tick, the file watch within a millisecond
/// while it follows commits, else at its next event), and they end.
pub struct ChangeWatcher {
    stop: Arc<AtomicBool>,
}

impl ChangeWatcher {
    /// Watches the store's database: on SQLite both layers (the file watch where the platform
    /// has one, and the poll); on PostgreSQL the listener.
    pub fn spawn(
        store: &crate::Store,
        on_change: impl Fn() + Send + Sync + 'static,
    ) -> Result<Self> {
        match store.location() {
            crate::Location::Sqlite(path) => Self::with_layers(path, true, true, on_change),
            crate::Location::Postgres(url) => {
                let stop = Arc::new(AtomicBool::new(false));
                crate::pg::watch(url, stop.clone(), Arc::new(on_change))?;
                Ok(ChangeWatcher { stop })
            }
        }
    }

    /// Only the layers asked for, so that each can be tested alone. Asking for the file watch
    /// alone where the platform has none, or where it cannot be set up, is an error.
    pub fn with_layers(
        db_path: &Path,
        file_watch: bool,
        poll: bool,
        on_change: impl Fn() + Send + Sync + 'static,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let on_change: Arc<dyn Fn() + Send + Sync> = Arc::new(on_change);
        let watching = file_watch && spawn_file_watch(db_path, stop.clone(), on_change.clone());
        if file_watch && !poll && !watching {
            return Err(crate::Error::Io {
                context: format!("watching {}", db_path.display()),
                source: std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    "no file watch here; use the poll",
                ),
            });
        }
        if !poll {
            return Ok(ChangeWatcher { stop });
        }
        let interval = if watching { POLL_WITH_WATCH } else { POLL_WITHOUT_WATCH };
        let conn = Connection::open(db_path)?;
        let poll_stop = stop.clone();
        std::thread::Builder::new()
            .name("taskbridge-db-poll".into())
            .spawn(move || {
                let mut last = data_version(&conn);
                loop {
                    std::thread::sleep(interval);
                    // Looked at after the sleep, so a watcher dropped meanwhile calls nobody.
                    if poll_stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let now = data_version(&conn);
                    if now != last {
                        last = now;
                        on_change();
                    }
                }
            })
            .map_err(|e| crate::Error::Io {
                context: "starting the poll thread".into(),
                source: e,
            })?;
        Ok(ChangeWatcher { stop })
    }
}

impl Drop for ChangeWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(target_os = "linux")]
fn spawn_file_watch(
    db_path: &Path,
    stop: Arc<AtomicBool>,
    on_change: Arc<dyn Fn() + Send + Sync>,
) -> bool {
    use inotify::{Inotify, WatchMask};
    let dir = db_path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let Some(mut wal) = db_path.file_name().map(|n| n.to_os_string()) else { return false };
    wal.push("-wal");
    let Ok(mut inotify) = Inotify::init() else { return false };
    // Every commit writes the WAL: its creation, or a move into its place, commits nothing.
    if inotify.watches().add(&dir, WatchMask::MODIFY).is_err() {
        return false;
    }
    let Ok(conn) = Connection::open(db_path) else { return false };
    std::thread::Builder::new()
        .name("taskbridge-db-watch".into())
        .spawn(move || {
            let mut buf = [0u8; 4096];
            let mut last = data_version(&conn);
            loop {
                let Ok(events) = inotify.read_events_blocking(&mut buf) else { return };
                // A watcher dropped while this waited calls nobody: the thread ends here.
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                // Every commit writes the WAL (the store is always in WAL mode); the main file is
                // written only by checkpoints, which commit nothing.
                if events.into_iter().any(|e| e.name.is_some_and(|n| n == wal)) {
                    follow_commits(&conn, &mut last, &stop, &*on_change);
                }
            }
        })
        .is_ok()
}

/// How long the watch goes on looking for commits after the last one it saw (or the write that
/// woke it): longer than an fsync'd commit takes to become readable on a busy disk.
#[cfg(target_os = "linux")]
const QUIET: Duration = Duration::from_millis(100);

/// After a write to the WAL: calls `on_change` for each commit another connection can read,
/// until none has come for [`QUIET`] or the watcher is dropped. SQLite writes a commit's frames
/// to the WAL (and fsyncs them) before it publishes them in the WAL's index, which lives in
/// shared memory that inotify does not see: a waiter called on the write itself would read the
/// database as it was and hear nothing more until the poll's next tick. `PRAGMA data_version`
/// changes once the commit can be read.
#[cfg(target_os = "linux")]
fn follow_commits(
    conn: &Connection,
    last: &mut Option<i64>,
    stop: &AtomicBool,
    on_change: &(dyn Fn() + Send + Sync),
) {
    let mut since = std::time::Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let now = data_version(conn);
        if now != *last {
            *last = now;
            on_change();
            since = std::time::Instant::now();
        } else if since.elapsed() >= QUIET {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `PRAGMA data_version` of `conn`: it changes when another connection commits.
fn data_version(conn: &Connection) -> Option<i64> {
    conn.prepare_cached("PRAGMA data_version").ok()?.query_row([], |r| r.get(0)).ok()
}

/// Elsewhere there is no file watch: the poll alone, every [`POLL_WITHOUT_WATCH`].
#[cfg(not(target_os = "linux"))]
fn no_file_watch(_: &Path, _: Arc<AtomicBool>, _: Arc<dyn Fn() + Send + Sync>) -> bool {
    false
}
#[cfg(not(target_os = "linux"))]
use no_file_watch as spawn_file_watch;
