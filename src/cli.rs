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
    /// The queue: a SQLite file (default <home>/taskbridge.db; also sqlite://PATH) or
    /// postgres://user:pass@host:port/db?schema=NAME for a queue shared by several hosts.
    #[arg(
        long,
        global = true,
        value_name = "PATH|URL",
        env = "TASKBRIDGE_DB",
        hide_env_values = true
    )]
    pub db: Option<String>,
    /// Read --db from this file instead (mode 0600), so that a URL with a password is in no
    /// process's command line; TaskBridge starts its own helpers this way.
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "db")]
    pub db_file: Option<PathBuf>,
    /// The config file (default: $XDG_CONFIG_HOME/taskbridge/config.toml if it exists).
    #[arg(long, global = true, value_name = "FILE", env = "TASKBRIDGE_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Submit a task; prints its id. PROMPT `-` reads the prompt from stdin.
    #[command(visible_alias = "submit-task")]
    Submit(SubmitArgs),
    /// List tasks, newest first.
    #[command(visible_alias = "list-tasks")]
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
    #[command(name = "get", visible_aliases = ["show", "get-task"])]
    Show {
        id: i64,
        #[arg(long)]
        json: bool,
    },
    /// A task's structured result (what `get_task_result` returns): summary, files, tests, diff,
    /// usage and cost, branch and commit.
    #[command(name = "get-result", visible_aliases = ["result", "get-task-result"])]
    Result {
        id: i64,
        /// Cut the diff in the result at this many bytes (`diff` prints it whole).
        #[arg(long, default_value_t = 65536)]
        max_diff_bytes: usize,
    },
    /// A task's diff against the commit it started from: coloured, and through the pager
    /// ($PAGER, else `less -R`), when the output is a terminal.
    #[command(name = "diff", visible_aliases = ["get-diff"])]
    Diff {
        id: i64,
        /// auto (colour on a terminal), always or never.
        #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
        color: String,
    },
    /// Print a task's log (the tail, or from a byte offset).
    #[command(name = "get-logs", visible_aliases = ["logs", "get-task-logs"])]
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
    #[command(visible_alias = "cancel-task")]
    Cancel { id: i64 },
    /// Wait until every task given is done, failed or cancelled, or waits for an answer; a
    /// line per task. Exit code: 0 all done, 3 one failed or was cancelled, 4 one waits for an
    /// answer (and none failed), 124 the timeout passed first.
    #[command(visible_alias = "wait-for")]
    Wait {
        #[arg(required = true, num_args = 1..)]
        ids: Vec<i64>,
        /// Give up after this many seconds (exit code 124).
        #[arg(long, value_name = "SECS")]
        timeout: Option<u64>,
    },
    /// Change a queued task's prompt before it runs: the new prompt as an argument (`-` reads
    /// stdin), or without one in $VISUAL/$EDITOR opened on the current prompt.
    #[command(visible_alias = "edit-task")]
    Edit {
        id: i64,
        prompt: Option<String>,
        /// A new title as well.
        #[arg(long)]
        title: Option<String>,
    },
    /// Pause the queue: workers finish what they run and claim nothing new until `resume`.
    #[command(visible_alias = "pause-queue")]
    Pause,
    /// Let workers claim tasks again after `pause`.
    #[command(visible_alias = "resume-queue")]
    Resume,
    /// Print the shell completion script: `source <(taskbridge completions bash)`, or for zsh
    /// and fish see the README.
    Completions { shell: clap_complete::Shell },
    /// Run a failed or cancelled task again.
    #[command(visible_alias = "retry-task")]
    Retry { id: i64 },
    /// Refine a done or failed task in its own session: a new task on a new branch from its
    /// commit (`-` reads the prompt from stdin).
    #[command(visible_alias = "followup-task")]
    Followup { id: i64, prompt: String },
    /// Merge a done task's branch into the branch it was submitted from (or --into): a
    /// fast-forward when possible, else a merge commit (--squash: one squashed commit).
    #[command(visible_alias = "merge-task")]
    Merge {
        id: i64,
        #[arg(long, value_name = "BRANCH")]
        into: Option<String>,
        #[arg(long)]
        squash: bool,
    },
    /// Add a note for the agent (`-` reads stdin).
    #[command(name = "add-note", visible_aliases = ["note", "add-task-note"])]
    Note { id: i64, text: String },
    /// Answer a waiting task (`-` reads stdin): free text or an option's label (several,
    /// comma-separated); a permission with once, always, reject or "reject: <what instead>"; a
    /// budget with continue, "continue 2.00" or stop. The task resumes its session.
    #[command(visible_alias = "answer-task")]
    Answer { id: i64, text: String },
    /// Set a task's priority (-100..=100, higher runs first).
    #[command(name = "set-priority", visible_aliases = ["priority", "set-task-priority"])]
    Priority {
        id: i64,
        #[arg(allow_hyphen_values = true)]
        priority: i64,
    },
    /// Remove finished tasks with their logs and worktrees (branches stay).
    #[command(name = "clear-finished", visible_alias = "clear")]
    Clear {
        /// Only tasks finished at least this long ago: 30s, 15m, 12h, 7d.
        #[arg(long, default_value = "0s")]
        older_than: String,
        /// Comma-separated: done, failed, cancelled.
        #[arg(long, default_value = "done,failed,cancelled")]
        statuses: String,
    },
    /// Counts per state, workers and the default model.
    #[command(name = "queue-status", visible_alias = "status")]
    Status {
        #[arg(long)]
        json: bool,
    },
    /// The workers: id, pid, host, last heartbeat, current tasks, and whether each is alive.
    #[command(name = "list-workers", visible_aliases = ["workers", "worker-heartbeat"])]
    ListWorkers {
        #[arg(long)]
        json: bool,
        /// Every worker the queue has seen; by default those stopped or silent for over a day
        /// are left out.
        #[arg(long)]
        all: bool,
    },
    /// Run the worker headless.
    Worker(WorkerArgs),
    /// List the models an agent offers (OpenCode's by default); `--set-default M` stores the
    /// default model (OpenCode's).
    #[command(name = "list-models", visible_alias = "models")]
    Models {
        /// Only this provider's models.
        #[arg(long)]
        provider: Option<String>,
        /// opencode (the default), claude-code or codex.
        #[arg(long)]
        agent: Option<String>,
        #[arg(long, value_name = "MODEL")]
        set_default: Option<String>,
        /// Ignore the cached list.
        #[arg(long)]
        refresh: bool,
    },
    /// Set the model for tasks that name none, checked against the models OpenCode offers.
    #[command(name = "set-default-model")]
    SetDefaultModel { model: String },
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
    /// Check what TaskBridge needs: OpenCode, a model, the home and database, the client
    /// registrations and a live worker. Each failing line says the fix.
    Doctor {
        /// Also send the model a one-word prompt, to see that it answers.
        #[arg(long)]
        probe: bool,
        /// How long the probe waits for the model's answer, in seconds: OpenCode retries an
        /// endpoint that does not answer for over a minute; a slow or loaded machine may need
        /// more than the default.
        #[arg(long, value_name = "SECS", default_value_t = 15, requires = "probe")]
        probe_timeout: u64,
    },
    /// Run `taskbridge serve` as a user service (systemd on Linux, launchd on macOS):
    /// install, uninstall or status.
    Service { action: String },
    /// Copy a whole queue to another backend (tasks with their ids, dependencies, notes,
    /// questions, budgets, jobs): `--from sqlite:PATH --to postgres://…?schema=NAME`. The target
    /// must be empty; stop the workers on the source first.
    Migrate {
        /// The queue to copy: a path, sqlite:PATH or a postgres:// URL.
        #[arg(long)]
        from: String,
        /// The empty queue to copy it into.
        #[arg(long)]
        to: String,
    },
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The task, as `submit_task` takes it (`mcp/src/task_args.rs`).
    #[command(flatten)]
    pub task: mcp::task_args::SubmitTaskArgs,
    /// Print the whole task as JSON instead of its id.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args, Clone)]
pub struct WorkerArgs {
    /// Tasks run at once (default 2, or `[worker] concurrency` in the config file).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Exit once nothing is running or runnable.
    #[arg(long)]
    pub once: bool,
    /// Default model when neither the task nor the database names one.
    #[arg(long)]
    pub model: Option<String>,
    /// Offer the reverse bridge (`claude-mcp`) to every task run, so the agent can ask Claude.
    #[arg(long)]
    pub claude_bridge: bool,
    /// How to drive OpenCode: `serve` (one warm `opencode serve` per worker), `acp` (one warm
    /// `opencode acp` per repository, over the Agent Client Protocol) or `run` (a process per
    /// prompt). Default: `[worker] opencode_mode` in the config file, else serve; an OpenCode 2
    /// always runs over ACP.
    #[arg(long = "opencode", value_name = "MODE")]
    pub opencode_mode: Option<worker::OpenCodeMode>,
    /// Run tasks from this worker's mirror of each task's remote (under its home) and push
    /// their branches back, even when the repository is on this host (a worker on another
    /// host does so by itself).
    #[arg(long)]
    pub use_remote: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (the queue's and this worker's), with
    /// the same token as `serve` (see --token-file).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    #[command(flatten)]
    pub guard: GuardArgs,
}

#[derive(Debug, Args, Clone)]
pub struct EmbeddedWorker {
    /// Do not run a worker in this process.
    #[arg(long)]
    pub no_worker: bool,
    /// Tasks run at once (default 2, or `[worker] concurrency` in the config file).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Offer the reverse bridge (`claude-mcp`) to every task run, so the agent can ask Claude.
    #[arg(long)]
    pub claude_bridge: bool,
    /// How to drive OpenCode: `serve` (one warm `opencode serve` per worker), `acp` (one warm
    /// `opencode acp` per repository, over the Agent Client Protocol) or `run` (a process per
    /// prompt). Default: `[worker] opencode_mode` in the config file, else serve; an OpenCode 2
    /// always runs over ACP.
    #[arg(long = "opencode", value_name = "MODE")]
    pub opencode_mode: Option<worker::OpenCodeMode>,
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
    /// The bearer token callers must send (at least 32 characters). Visible to every user in
    /// `ps`: prefer --token-file or TASKBRIDGE_TOKEN. Without any, the server asks for the
    /// token it keeps in <home>/token (made on first use).
    #[arg(long, conflicts_with = "token_file")]
    pub token: Option<String>,
    /// Read the token from this file (mode 0600: a file others can read is refused).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Take calls without a token (loopback only). Any user of this machine can then call the
    /// server and run tasks as you.
    #[arg(long, conflicts_with_all = ["token", "token_file"])]
    pub no_token: bool,
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
