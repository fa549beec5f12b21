//! Tracing to `<home>/logs/taskbridge.log`, never to stdout: stdout is the MCP channel in stdio
//! mode and the screen in the TUI. `TASKBRIDGE_LOG` sets the filter (default `info`). The file is
//! rotated by size (`taskbridge.log.1` … `.4`, the oldest dropped); `TASKBRIDGE_LOG_MAX_BYTES`
//! sets the size (default 10 MiB). Each process counts from the file's size when it opened it,
//! so with several processes writing a file may pass the limit by what the others wrote since.

use file_rotate::{ContentLimit, FileRotate, compression::Compression, suffix::AppendCount};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use tracing_subscriber::{EnvFilter, Layer, fmt, layer::SubscriberExt, util::SubscriberInitExt};

/// Rotated files kept beside the current one.
const KEEP: usize = 4;
const DEFAULT_MAX_BYTES: usize = 10 * 1024 * 1024;

/// Keeps the background log writer alive; hold it in `main`.
#[must_use]
pub struct LogGuard(#[allow(dead_code)] Option<tracing_appender::non_blocking::WorkerGuard>);

/// `directives` is `TASKBRIDGE_LOG` (`info` when unset or unreadable).
pub fn init(
    logs_dir: &Path,
    also_stderr: bool,
    max_bytes: Option<usize>,
    directives: Option<&str>,
) -> LogGuard {
    let filter = || {
        directives
            .and_then(|d| EnvFilter::try_new(d).ok())
            .unwrap_or_else(|| EnvFilter::new("info"))
    };
    let path = logs_dir.join("taskbridge.log");
    let file = queue::home::create_private_file(&path).ok().map(|_| {
        let mut private = std::fs::OpenOptions::new();
        private.read(true).create(true).append(true).mode(0o600);
        FileRotate::new(
            &path,
            AppendCount::new(KEEP),
            ContentLimit::BytesSurpassed(max_bytes.unwrap_or(DEFAULT_MAX_BYTES).max(1)),
            Compression::None,
            Some(private),
        )
    });
    let (file_layer, guard) = match file {
        Some(f) => {
            let (w, g) = tracing_appender::non_blocking(f);
            (Some(fmt::layer().with_writer(w).with_ansi(false).with_filter(filter())), Some(g))
        }
        None => (None, None),
    };
    let stderr_layer = also_stderr.then(|| {
        fmt::layer().with_writer(std::io::stderr).with_ansi(false).compact().with_filter(filter())
    });
    let _ = tracing_subscriber::registry().with(file_layer).with(stderr_layer).try_init();
    LogGuard(guard)
}
