//! Command-line grammar. Verbs share their names with the MCP tools and TUI actions.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "taskbridge",
    version,
    about = "Claude plans, OpenCode codes: a durable task queue between them, over MCP.",
    after_help = "Home: --home, else TASKBRIDGE_HOME, else $XDG_DATA_HOME/taskbridge \
                  (~/.local/share/taskbridge). Logs: <home>/logs/."
)]
pub struct Cli {
    /// Directory holding the database, logs and worktrees.
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Use this database file instead of <home>/taskbridge.db.
    #[arg(long, global = true, value_name = "PATH")]
    pub db: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Submit a task; prints its id. PROMPT `-` reads the prompt from stdin.
    Submit(SubmitArgs),
    /// List tasks, newest first.
    List {
        /// queued, blocked, running, waiting, done, failed or cancelled.
        #[arg(long)]
        status: Option<String>,
        /// Only tasks in this repository.
        #[arg(long)]
        repo: Option<PathBuf>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Show everything about a task.
    Show {
        id: i64,
        #[arg(long)]
        json: bool,
    },
    /// Print a task's log (the tail, or from a byte offset).
    Logs {
        id: i64,
        #[arg(long)]
        offset: Option<u64>,
        #[arg(long, default_value_t = 16384)]
        max_bytes: usize,
        /// Keep printing as the log grows, until the task finishes.
        #[arg(long, short)]
        follow: bool,
    },
    /// Cancel a queued, waiting or running task.
    Cancel { id: i64 },
    /// Run a failed or cancelled task again.
    Retry { id: i64 },
    /// Add a note for the agent.
    Note { id: i64, text: String },
    /// Answer a waiting task's question (`-` reads stdin); the task resumes its session.
    Answer { id: i64, text: String },
    /// Set a task's priority (-100..=100, higher runs first).
    Priority { id: i64, priority: i64 },
    /// Remove finished tasks with their logs and worktrees (branches stay).
    Clear {
        /// Only tasks finished at least this long ago: 30s, 15m, 12h, 7d.
        #[arg(long, default_value = "0s")]
        older_than: String,
        /// Comma-separated: done, failed, cancelled.
        #[arg(long, default_value = "done,failed,cancelled")]
        statuses: String,
    },
    /// Counts per state, workers and the default model.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Run the worker headless.
    Worker(WorkerArgs),
    /// List the models OpenCode offers; `--set-default M` stores the default model.
    Models {
        /// Only this provider's models.
        #[arg(long)]
        provider: Option<String>,
        #[arg(long, value_name = "MODEL")]
        set_default: Option<String>,
        /// Ignore the cached list.
        #[arg(long)]
        refresh: bool,
    },
    /// MCP server over stdio (for Claude Desktop and Claude Code), with an embedded worker.
    Mcp {
        #[command(flatten)]
        worker: EmbeddedWorker,
    },
    /// MCP server over Streamable HTTP at /mcp, with an embedded worker.
    Serve(ServeArgs),
    /// The control center: queue, logs, diffs and questions, with the HTTP MCP server and a
    /// worker running inside.
    Tui(TuiArgs),
    /// The reverse bridge: an MCP server that lets OpenCode (or any MCP client) ask Claude.
    /// Stdio, or Streamable HTTP with --listen. Uses the Messages API when ANTHROPIC_API_KEY is
    /// set, else the Claude Code CLI (`claude -p`).
    ClaudeMcp(ClaudeMcpArgs),
    /// Print (or, with --write, merge) the entry an MCP client needs: claude-desktop,
    /// claude-code, or opencode (the reverse bridge, for opencode.json).
    Config {
        client: String,
        /// Merge it into the client's config file (a backup of the old file is kept).
        #[arg(long)]
        write: bool,
        /// The HTTP endpoint to name for HTTP clients.
        #[arg(long, default_value = "http://127.0.0.1:8765/mcp")]
        http_url: String,
    },
    /// Run `taskbridge serve` as a user service (systemd on Linux, launchd on macOS):
    /// install, uninstall or status.
    Service { action: String },
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    pub prompt: String,
    /// Repository (default: the current directory).
    #[arg(long)]
    pub repo: Option<PathBuf>,
    /// Branch, tag or commit to start from (default HEAD).
    #[arg(long = "ref", value_name = "REF")]
    pub base_ref: Option<String>,
    #[arg(long)]
    pub title: Option<String>,
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub priority: i64,
    /// Run only after this task is done (repeatable).
    #[arg(long = "after", value_name = "ID")]
    pub after: Vec<i64>,
    /// provider/model
    #[arg(long)]
    pub model: Option<String>,
    /// OpenCode agent name.
    #[arg(long)]
    pub agent: Option<String>,
    #[arg(long)]
    pub readonly: bool,
    #[arg(long)]
    pub no_network: bool,
    #[arg(long)]
    pub no_shell: bool,
    #[arg(long)]
    pub keep_worktree: bool,
    #[arg(long, default_value_t = queue::DEFAULT_MAX_ATTEMPTS)]
    pub max_attempts: i64,
    /// Seconds before the run is stopped.
    #[arg(long, default_value_t = queue::DEFAULT_TIMEOUT_S)]
    pub timeout: i64,
    /// Fail the task if its question waits longer than this many seconds.
    #[arg(long)]
    pub question_timeout: Option<i64>,
    /// Idempotency key: a second submit with the same key returns the first task.
    #[arg(long)]
    pub request_id: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args, Clone)]
pub struct WorkerArgs {
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Exit once nothing is running or runnable.
    #[arg(long)]
    pub once: bool,
    /// Default model when neither the task nor the database names one.
    #[arg(long)]
    pub model: Option<String>,
    /// Offer the reverse bridge (`claude-mcp`) to every task run, so the agent can ask Claude.
    #[arg(long)]
    pub claude_bridge: bool,
}

#[derive(Debug, Args, Clone)]
pub struct EmbeddedWorker {
    /// Do not run a worker in this process.
    #[arg(long)]
    pub no_worker: bool,
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Offer the reverse bridge (`claude-mcp`) to every task run, so the agent can ask Claude.
    #[arg(long)]
    pub claude_bridge: bool,
}

#[derive(Debug, Args, Clone)]
pub struct ClaudeMcpArgs {
    /// Serve Streamable HTTP at /mcp on this address instead of stdio.
    #[arg(long)]
    pub listen: Option<String>,
    #[command(flatten)]
    pub guard: GuardArgs,
    /// The Claude model used when a call names none.
    #[arg(long, env = "TASKBRIDGE_CLAUDE_MODEL")]
    pub model: Option<String>,
}

/// Where the HTTP MCP server listens and whom it lets in (shared by `serve` and `tui`).
#[derive(Debug, Args, Clone)]
pub struct HttpArgs {
    #[arg(long, default_value = "127.0.0.1:8765")]
    pub listen: String,
    #[command(flatten)]
    pub guard: GuardArgs,
}

/// Whom an HTTP MCP server lets in (every HTTP server: `serve`, `tui`, `claude-mcp --listen`).
#[derive(Debug, Args, Clone)]
pub struct GuardArgs {
    /// Require `Authorization: Bearer <token>`.
    #[arg(long, conflicts_with = "token_file", env = "TASKBRIDGE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Read the token from this file.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Also accept this Host (and Origin host); repeatable.
    #[arg(long = "allowed-host")]
    pub allowed_hosts: Vec<String>,
}

#[derive(Debug, Args, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub http: HttpArgs,
    /// Answer POSTs with plain JSON instead of an SSE stream (for proxies that buffer SSE).
    #[arg(long)]
    pub json_response: bool,
    /// Expose the server through a Cloudflare quick tunnel or ngrok (always with a token).
    #[arg(long, value_enum)]
    pub public: Option<crate::public::TunnelKind>,
    /// Only run tasks in repositories under this directory (repeatable; public mode defaults to
    /// the directory it was started in).
    #[arg(long = "repo-root", value_name = "DIR")]
    pub repo_roots: Vec<PathBuf>,
    #[command(flatten)]
    pub worker: EmbeddedWorker,
}

#[derive(Debug, Args, Clone)]
pub struct TuiArgs {
    #[command(flatten)]
    pub http: HttpArgs,
    /// Do not serve MCP over HTTP from the TUI.
    #[arg(long, conflicts_with = "public")]
    pub no_http: bool,
    /// Expose the TUI's MCP server through a Cloudflare quick tunnel or ngrok (always with a
    /// token), as `serve --public` does.
    #[arg(long, value_enum)]
    pub public: Option<crate::public::TunnelKind>,
    /// Only run MCP-submitted tasks in repositories under this directory (repeatable; public mode
    /// defaults to the directory it was started in).
    #[arg(long = "repo-root", value_name = "DIR")]
    pub repo_roots: Vec<PathBuf>,
    /// Keymap file (default: $XDG_CONFIG_HOME/taskbridge/keymap.toml if it exists).
    #[arg(long)]
    pub keymap: Option<PathBuf>,
    #[command(flatten)]
    pub worker: EmbeddedWorker,
}
