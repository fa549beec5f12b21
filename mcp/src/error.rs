/// Failures of the MCP transports. Tool-level failures are tool results, not this.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {message}")]
    Listen { addr: String, message: String },
    #[error(
        "refusing to listen on {0} without a token: anyone who can reach that address could run \
         commands on this machine. Pass --token or --token-file, or listen on 127.0.0.1"
    )]
    Insecure(String),
    #[error("the HTTP server stopped: {0}")]
    Serve(String),
    #[error("MCP: {0}")]
    Protocol(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
