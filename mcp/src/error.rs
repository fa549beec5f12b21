/// Failures of the MCP transports, and of the reverse bridge's calls to Claude. Tool-level
/// failures reach the client as tool results built from these messages, never as protocol errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {message}")]
    Listen { addr: String, message: String },
    #[error(
        "refusing to listen on {0} without a token: anyone who can reach that address could run \
         commands on this machine. --no-token is for loopback only; drop it (the server then \
         asks for the token kept in its home), or listen on 127.0.0.1"
    )]
    Insecure(String),
    #[error("the HTTP server stopped: {0}")]
    Serve(String),
    #[error("MCP: {0}")]
    Protocol(String),
    #[error("{0}")]
    NoBackend(String),
    #[error(
        "no answer from Claude ({backend}) within {waited_s} s; raise timeout_s, or use \
         claude_submit and claude_poll for long questions"
    )]
    ClaudeTimeout { waited_s: u64, backend: &'static str },
    #[error("cannot reach Claude at {url}: {detail}; check ANTHROPIC_BASE_URL and the network")]
    ClaudeUnreachable { url: String, detail: String },
    #[error(
        "Claude refused the credentials ({detail}); check ANTHROPIC_API_KEY, or the Claude Code \
         login (`claude /login`)"
    )]
    ClaudeAuth { detail: String },
    #[error("{}", busy_message(*.status, *.attempts, *.waited_s, .detail))]
    ClaudeBusy { status: u16, attempts: u32, waited_s: u64, detail: String },
    #[error("Claude refused the request ({detail}); check the model name and the arguments")]
    ClaudeRefused { status: u16, detail: String },
    #[error("{0}")]
    ClaudeCli(String),
    #[error(transparent)]
    Queue(#[from] queue::Error),
}

fn busy_message(status: u16, attempts: u32, waited_s: u64, detail: &str) -> String {
    let what = if status == 429 { "rate-limited" } else { "overloaded or failing" };
    let tries = if attempts > 1 {
        format!(" after {attempts} attempts over {waited_s} s")
    } else {
        String::new()
    };
    format!("Claude is {what} ({detail}){tries}; wait a minute and try again")
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
