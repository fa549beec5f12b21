//! `taskbridge`: the one binary. Thin wiring only: it parses the command line, opens the home and
//! the queue, and hands over to the queue, worker, MCP and UI crates.
//!
//! Settings are read here, once: the flags (clap), the process environment (one
//! `queue::Environment`, taken in `real_main`; no other code reads the environment) and the
//! config file (`config.rs`, which folds the three into the worker's configuration). The
//! crates below get these as values: the worker's configuration, and that `Environment` for
//! what they look up in it (the host's name, PATH, an agent's own variables).

#[macro_use]
mod output;
mod cli;
mod clients;
mod commands;
mod config;
mod doctor;
mod logging;
mod pager;
mod public;
mod run;
mod service;
mod telemetry;
mod token;
mod verbs;

use anyhow::Context;
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;

/// What every command needs: where files live and the open queue.
pub struct Ctx {
    pub home: queue::Home,
    /// `--db` as given (with any password), for the processes this one starts; show
    /// `store.location()` instead, which masks it.
    pub db_arg: String,
    pub store: Arc<queue::Store>,
    pub cwd: PathBuf,
    pub config: config::Config,
    /// The environment, read once here; nothing below reads it again.
    pub env: queue::Environment,
}

fn open(cli: &cli::Cli, env: queue::Environment) -> anyhow::Result<Ctx> {
    let home = queue::Home::resolve(cli.home.clone(), &env)?;
    home.ensure()
        .with_context(|| format!("preparing the home directory {}", home.root().display()))?;
    let db_arg = match &cli.db_file {
        Some(f) => crate::token::read_private_text(f, "the --db-file")?,
        None => cli.db.clone().unwrap_or_else(|| home.db_path().display().to_string()),
    };
    let location = queue::Location::parse(&db_arg).context("reading --db/TASKBRIDGE_DB")?;
    // A PostgreSQL error names the (masked) URL itself.
    let store = queue::Store::connect(&location).with_context(|| match &location {
        queue::Location::Sqlite(path) => format!("opening the queue at {}", path.display()),
        queue::Location::Postgres(_) => "opening the queue on PostgreSQL".to_owned(),
    })?;
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let config = config::Config::load(cli.config.as_deref(), &env)?;
    Ok(Ctx { home, db_arg, store: Arc::new(store), cwd, config, env })
}

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    match real_main(cli) {
        Ok(code) => code,
        Err(e) => {
            // An error may quote a title, a remote's answer or a file: escaped like stdout.
            // Not eprintln!: a standard error that is a terminal gone away must not panic.
            let text = format!("{e:#}");
            let msg = output::escape_controls(&text);
            let _ =
                std::io::Write::write_fmt(&mut std::io::stderr(), format_args!("error: {msg}\n"));
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main(cli: cli::Cli) -> anyhow::Result<std::process::ExitCode> {
    if let cli::Command::Migrate { from, to } = &cli.command {
        // Needs neither the home nor the default queue.
        return commands::migrate(from, to);
    }
    let ctx = open(&cli, queue::Environment::from_vars(std::env::vars_os()))?;
    let long_running = matches!(
        cli.command,
        cli::Command::Worker(_)
            | cli::Command::Mcp { .. }
            | cli::Command::Serve(_)
            | cli::Command::Tui(_)
            | cli::Command::ClaudeMcp(_)
    );
    // The headless worker also logs to stderr; the stdio server must keep stdout clean and logs
    // to its file only (stderr would end up in the client's log, which is fine but noisy).
    let log_max = ctx.env.var("TASKBRIDGE_LOG_MAX_BYTES").and_then(|v| v.parse().ok());
    let _log = logging::init(
        &ctx.home.logs_dir(),
        matches!(cli.command, cli::Command::Worker(_)),
        log_max,
        ctx.env.var("TASKBRIDGE_LOG").as_deref(),
    );
    if long_running {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        // Flushed when dropped, after the runtime's work is done.
        let _traces = telemetry::init(&ctx.env)?;
        return rt.block_on(run::long_running(ctx, cli.command));
    }
    commands::run(ctx, cli.command)
}
