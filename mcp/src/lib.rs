//! `taskbridge-mcp`: TaskBridge over the Model Context Protocol.
//!
//! It owns the rmcp server with the TaskBridge tools ([`TaskBridge`], `tools`) and their typed
//! replies with output schemas ([`replies`]), the reverse
//! bridge that lets MCP clients ask Claude ([`ClaudeBridge`], `bridge`), their stdio and
//! Streamable HTTP transports, and the HTTP security in front of them (Host/Origin allow-list,
//! bearer token, no token-less non-loopback listening).
//!
//! It sits on the queue and the worker and must not depend on the UI: the TUI and the MCP server
//! meet only through the queue database.

pub mod bridge;
mod decisions;
pub mod error;
pub mod http;
pub mod params;
pub mod replies;
mod schema;
pub mod server;
pub mod sessions;
pub mod shed;
pub mod task_args;
mod task_ext;
pub mod tools;
mod waiting;

pub use bridge::ClaudeBridge;
pub use error::{Error, Result};
pub use http::{HttpConfig, MetricsOf, bind, serve_http, serve_metrics};
pub use server::TaskBridge;

use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

/// Serves MCP on stdin/stdout until the client disconnects or `shutdown` is cancelled.
pub async fn serve_stdio<S>(server: S, shutdown: CancellationToken) -> Result<()>
where
    S: rmcp::ServerHandler + Clone,
{
    let running = match stdio_pipes() {
        Some(io) => server.serve(io).await,
        None => server.serve(rmcp::transport::stdio()).await,
    }
    .map_err(|e| Error::Protocol(e.to_string()))?;
    let ct = running.cancellation_token();
    tokio::select! {
        r = running.waiting() => { r.map_err(|e| Error::Protocol(e.to_string()))?; }
        _ = shutdown.cancelled() => ct.cancel(),
    }
    Ok(())
}

/// stdin and stdout as readiness-based pipes on the runtime, when they are pipes (as they are for
/// a server an MCP client launches). tokio's own stdio hands every read and write to a blocking
/// thread, two thread hops per call that show on a sub-millisecond `get_task`. `None` (a tty, a
/// file, a socket) falls back to tokio's stdio.
fn stdio_pipes() -> Option<(tokio::net::unix::pipe::Receiver, tokio::net::unix::pipe::Sender)> {
    use std::os::fd::AsFd;
    let input = std::io::stdin().as_fd().try_clone_to_owned().ok()?;
    let output = std::io::stdout().as_fd().try_clone_to_owned().ok()?;
    let input = tokio::net::unix::pipe::Receiver::from_file(std::fs::File::from(input)).ok()?;
    let output = tokio::net::unix::pipe::Sender::from_file(std::fs::File::from(output)).ok()?;
    Some((input, output))
}
