//! Tracing to `<home>/logs/taskbridge.log`, never to stdout: stdout is the MCP channel in stdio
//! mode and the screen in the TUI. `TASKBRIDGE_LOG` sets the filter (default `info`).

use std::path::Path;
use tracing_subscriber::{EnvFilter, Layer, fmt, layer::SubscriberExt, util::SubscriberInitExt};

/// Keeps the background log writer alive; hold it in `main`.
#[must_use]
pub struct LogGuard(#[allow(dead_code)] Option<tracing_appender::non_blocking::WorkerGuard>);

pub fn init(logs_dir: &Path, also_stderr: bool) -> LogGuard {
    let filter =
        || EnvFilter::try_from_env("TASKBRIDGE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let path = logs_dir.join("taskbridge.log");
    let file = queue::home::create_private_file(&path)
        .ok()
        .and_then(|_| std::fs::OpenOptions::new().append(true).open(&path).ok());
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
