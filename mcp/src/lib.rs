//! `taskbridge-mcp`: TaskBridge over the Model Context Protocol.
//!
//! It owns the rmcp server with the TaskBridge tools ([`TaskBridge`], `tools`), the reverse
//! bridge that lets MCP clients ask Claude ([`ClaudeBridge`], `bridge`), their stdio and
//! Streamable HTTP transports, and the HTTP security in front of them (Host/Origin allow-list,
//! bearer token, no token-less non-loopback listening).
//!
//! It sits on the queue and the worker and must not depend on the UI: the TUI and the MCP server
//! meet only through the queue database.

pub mod bridge;
pub mod error;
pub mod http;
pub mod params;
pub mod server;
pub mod tools;

pub use bridge::ClaudeBridge;
pub use error::{Error, Result};
pub use http::{HttpConfig, bind, serve_http};
pub use server::TaskBridge;

use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

/// Serves MCP on stdin/stdout until the client disconnects or `shutdown` is cancelled.
pub async fn serve_stdio<S>(server: S, shutdown: CancellationToken) -> Result<()>
where
    S: rmcp::ServerHandler + Clone,
{
    let running =
        server.serve(rmcp::transport::stdio()).await.map_err(|e| Error::Protocol(e.to_string()))?;
    let ct = running.cancellation_token();
    tokio::select! {
        r = running.waiting() => { r.map_err(|e| Error::Protocol(e.to_string()))?; }
        _ = shutdown.cancelled() => ct.cancel(),
    }
    Ok(())
}
