//! The long-running modes: the headless worker and the MCP servers with their embedded worker.

use crate::Ctx;
use crate::cli::{Command, EmbeddedWorker};
use anyhow::Context;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;
use worker::{RunningWorker, Worker, WorkerConfig};

/// The command OpenCode runs to start the reverse bridge on this home and database. A
/// PostgreSQL URL (it may hold a password) goes in a 0600 file of the home, named by `--db-file`:
/// a command line is visible to every user, and this one is also in the agent's environment.
pub fn bridge_command(ctx: &Ctx) -> anyhow::Result<Vec<String>> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let mut cmd =
        vec![exe.display().to_string(), "--home".into(), ctx.home.root().display().to_string()];
    match ctx.store.location() {
        queue::Location::Postgres(_) => {
            let file = ctx.home.db_url_file(ctx.store.location());
            queue::home::create_private_file(&file)?;
            std::fs::write(&file, format!("{}\n", ctx.db_arg))
                .with_context(|| format!("writing {}", file.display()))?;
            cmd.extend(["--db-file".into(), file.display().to_string()]);
        }
        queue::Location::Sqlite(_) => cmd.extend(["--db".into(), ctx.db_arg.clone()]),
    }
    cmd.push("claude-mcp".into());
    Ok(cmd)
}

/// What a worker without `--claude-bridge` says when OpenCode's config registers the bridge.
pub const BRIDGE_LEFT_OUT: &str = "note: OpenCode's config registers TaskBridge's reverse bridge, \
     but this worker does not offer it to tasks, so their agents cannot ask Claude: inside the \
     wall the bridge needs the queue, which only a worker that offers it opens to the agent. \
     Start workers with --claude-bridge (or set `claude_bridge = true` under [worker] in \
     config.toml) to offer it.";

/// The configured worker with this command's flags applied.
fn worker_config(
    ctx: &Ctx,
    concurrency: Option<usize>,
    once: bool,
    model: Option<String>,
    claude_bridge: bool,
    mode: Option<worker::OpenCodeMode>,
) -> anyhow::Result<WorkerConfig> {
    let mut cfg = ctx.config.worker.clone();
    if let Some(m) = mode {
        cfg.opencode_mode = m;
        cfg.opencode_mode_chosen = true;
    }
    if let Some(c) = concurrency {
        cfg.concurrency = c.max(1);
    }
    cfg.once = once;
    if model.is_some() {
        cfg.default_model = model;
    }
    if claude_bridge || ctx.config.claude_bridge {
        cfg.claude_bridge = Some(bridge_command(ctx)?);
    }
    if worker::registered_bridge_unoffered(&cfg) {
        eprintln!("{BRIDGE_LEFT_OUT}");
    }
    Ok(cfg)
}

/// Cancels `token` on SIGINT, SIGTERM or SIGHUP. A hangup (the terminal closed, tmux killed)
/// must shut down as cleanly as the others: left to its default it ends the process at once,
/// and the worker's OpenCode server, in a process group of its own, would run on unowned.
pub fn cancel_on_signal(token: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut hup)) =
            (signal(SignalKind::terminate()), signal(SignalKind::hangup()))
        else {
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
        tracing::info!("signal received; shutting down");
        token.cancel();
    });
}

pub async fn long_running(ctx: Ctx, command: Command) -> anyhow::Result<ExitCode> {
    if matches!(command, Command::Worker(_) | Command::Serve(_) | Command::Tui(_)) {
        refuse_a_damaged_database(&ctx)?;
    }
    let shutdown = CancellationToken::new();
    cancel_on_signal(shutdown.clone());
    match command {
        Command::Worker(args) => {
            let cfg = worker_config(
                &ctx,
                args.concurrency,
                args.once,
                args.model,
                args.claude_bridge,
                args.opencode_mode,
            )?;
            let cfg = WorkerConfig { use_remote: args.use_remote || cfg.use_remote, ..cfg };
            let metrics = match &args.metrics_listen {
                Some(listen) => Some(metrics_server(&ctx, listen, &args.guard, &shutdown).await?),
                None => None,
            };
            let running = Worker::start(ctx.store.clone(), ctx.home.clone(), cfg, shutdown.clone());
            eprintln!("taskbridge worker {} on {}", running.worker.id(), ctx.store.location());
            let ran = running.handle.await.context("worker task");
            shutdown.cancel();
            if let Some(m) = metrics {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(2), m).await;
            }
            ran??;
        }
        Command::Mcp { worker: emb } => {
            let embedded = embedded(&ctx, &emb, shutdown.clone())?;
            let server = mcp_server(&ctx, &emb, embedded.as_ref())?;
            server.ask_outside_calls();
            let result = mcp::serve_stdio(server.clone(), shutdown.clone()).await;
            server.shutdown();
            shutdown.cancel();
            finish_embedded(embedded).await;
            result?;
        }
        Command::ClaudeMcp(args) => claude_mcp(ctx, args, shutdown).await?,
        Command::Serve(args) => serve(ctx, args, shutdown).await?,
        Command::Tui(args) => tui(ctx, args, shutdown).await?,
        _ => anyhow::bail!("internal: not a long-running command"),
    }
    Ok(ExitCode::SUCCESS)
}

/// A worker (or a server with one) does not start on a damaged SQLite file: it would fail every
/// claim, and what it wrote could make the damage worse. It says what is wrong and the fix
/// (`doctor` finds the same), after killing the OpenCode servers that dead workers left
/// running, which needs no database. A database that cannot be reached at all is the worker's
/// to wait out (it backs off until it can claim again).
fn refuse_a_damaged_database(ctx: &Ctx) -> anyhow::Result<()> {
    let detail = match ctx.store.quick_check() {
        Ok(r) if r == "ok" => return Ok(()),
        Ok(damage) => format!("quick_check: {damage}"),
        Err(queue::Error::Corrupt { detail, .. }) => detail,
        Err(_) => return Ok(()),
    };
    worker::reap_orphaned_servers(&ctx.home);
    Err(queue::Error::Corrupt { path: ctx.store.location().to_string(), detail }.into())
}

/// `worker --metrics-listen`: `/metrics` alone, bound before the worker starts so that a bad
/// address stops it at once.
async fn metrics_server(
    ctx: &Ctx,
    listen: &str,
    guard: &crate::cli::GuardArgs,
    shutdown: &CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let auth = crate::token::resolve(ctx.home.root(), guard, &ctx.env)?;
    let http = mcp::HttpConfig {
        listen: listen.to_owned(),
        token: auth.as_ref().map(|(t, _)| t.clone()),
        allowed_hosts: guard.allowed_hosts.clone(),
        json_response: false,
        metrics: Some(mcp::MetricsOf(ctx.store.clone())),
    };
    let listener = mcp::bind(&http).await?;
    eprintln!(
        "taskbridge metrics at http://{}/metrics ({})",
        listener.local_addr()?,
        auth_label(&auth)
    );
    let stop = shutdown.clone();
    Ok(tokio::spawn(async move {
        if let Err(e) = mcp::serve_metrics(listener, http, stop).await {
            tracing::warn!(error = %e, "the metrics server stopped");
        }
    }))
}

fn embedded(
    ctx: &Ctx,
    emb: &EmbeddedWorker,
    shutdown: CancellationToken,
) -> anyhow::Result<Option<RunningWorker>> {
    if emb.no_worker {
        return Ok(None);
    }
    let cfg =
        worker_config(ctx, emb.concurrency, false, None, emb.claude_bridge, emb.opencode_mode)?;
    Ok(Some(Worker::start(ctx.store.clone(), ctx.home.clone(), cfg, shutdown)))
}

/// The TaskBridge MCP server, with the same worker configuration as this process's own worker,
/// so a worker that `restart_worker` starts is the worker this command was asked to run.
fn mcp_server(
    ctx: &Ctx,
    emb: &EmbeddedWorker,
    embedded: Option<&RunningWorker>,
) -> anyhow::Result<mcp::TaskBridge> {
    let cfg =
        worker_config(ctx, emb.concurrency, false, None, emb.claude_bridge, emb.opencode_mode)?;
    Ok(mcp::TaskBridge::new(
        ctx.store.clone(),
        ctx.home.clone(),
        ctx.cwd.clone(),
        embedded.map(|e| e.worker.clone()),
        cfg,
    ))
}

async fn finish_embedded(embedded: Option<RunningWorker>) {
    if let Some(running) = embedded
        && let Ok(Err(e)) = running.handle.await
    {
        tracing::error!(error = %e, "embedded worker stopped with an error");
    }
}

/// The reverse bridge, over stdio or (with --listen) Streamable HTTP.
async fn claude_mcp(
    ctx: Ctx,
    args: crate::cli::ClaudeMcpArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut cfg = mcp::bridge::backend::BridgeConfig::from_env(&ctx.env);
    if args.model.is_some() {
        cfg.default_model = args.model.clone();
    }
    let bridge = mcp::ClaudeBridge::new(ctx.store.clone(), &cfg);
    if let mcp::bridge::backend::Backend::None(reason) = bridge.backend() {
        // Still serve: claude_status tells the client what is missing.
        tracing::warn!("{reason}");
    }
    let result = match &args.listen {
        None => mcp::serve_stdio(bridge.clone(), shutdown.clone()).await,
        Some(listen) => {
            let auth = crate::token::resolve(ctx.home.root(), &args.guard, &ctx.env)?;
            let http = mcp::HttpConfig {
                listen: listen.clone(),
                token: auth.as_ref().map(|(t, _)| t.clone()),
                allowed_hosts: args.guard.allowed_hosts.clone(),
                json_response: false,
                metrics: None,
            };
            let listener = mcp::bind(&http).await?;
            eprintln!(
                "taskbridge Claude bridge at http://{}/mcp ({})",
                listener.local_addr()?,
                auth_label(&auth)
            );
            mcp::serve_http(bridge.clone(), listener, http, shutdown.clone()).await
        }
    };
    bridge.shutdown();
    result.map_err(anyhow::Error::from)
}

/// The control center: the UI in front, the HTTP MCP server and a worker behind it.
async fn tui(
    ctx: Ctx,
    args: crate::cli::TuiArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // Everything that can fail on bad input fails here, before the terminal is taken over.
    let keymap_path = args.keymap.clone().or_else(|| {
        Some(crate::config::config_dir(&ctx.env)?.join("keymap.toml")).filter(|p| p.exists())
    });
    let user_keymap = match &keymap_path {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading the keymap {}", p.display()))?,
        ),
        None => None,
    };
    let keymap = ui::Keymap::load(user_keymap.as_deref()).map_err(anyhow::Error::msg)?;
    let auth = crate::token::resolve(ctx.home.root(), &args.http.guard, &ctx.env)?;
    let token = auth.as_ref().map(|(t, _)| t.clone());
    let mut http = mcp::HttpConfig {
        listen: args.http.listen.clone(),
        token: token.clone(),
        allowed_hosts: args.http.guard.allowed_hosts.clone(),
        json_response: false,
        metrics: Some(mcp::MetricsOf(ctx.store.clone())),
    };
    let mut roots = args.repo_roots.clone();
    if args.public.is_some() {
        crate::public::prepare(&ctx.cwd, &auth, &mut roots, &mut http)?;
    }

    let mut mcp_label = "off (--no-http)".to_owned();
    let mut listener = None;
    let mut tunnel = None;
    if !args.no_http {
        match mcp::bind(&http).await {
            Ok(l) => {
                let addr = l.local_addr()?;
                mcp_label = format!("http://{addr}/mcp ({})", auth_label(&auth));
                tracing::info!("MCP over HTTP at {mcp_label}");
                if let Some(kind) = args.public {
                    // Asked for a public URL: without the tunnel the TUI does not start.
                    let t = crate::public::open(kind, addr, &args.http.listen, &mut http, &ctx.env)
                        .await?;
                    mcp_label = format!("{}/mcp (public; {})", t.url, auth_label(&auth));
                    tunnel = Some(t);
                }
                listener = Some(l);
            }
            Err(e) if args.public.is_some() => return Err(e.into()),
            // A port in use is shown in the header; the TUI still runs.
            Err(e) => mcp_label = format!("unavailable: {e}"),
        }
    }

    let embedded = embedded(&ctx, &args.worker, shutdown.clone())?;
    let worker = embedded.as_ref().map(|e| e.worker.clone());
    let server_stop = shutdown.child_token();
    let server_task = match listener {
        Some(listener) => {
            let server = mcp_server(&ctx, &args.worker, embedded.as_ref())?;
            if !roots.is_empty() {
                server.restrict_repos(roots);
            }
            Some(tokio::spawn(mcp::serve_http(server, listener, http, server_stop.clone())))
        }
        None => None,
    };
    let (label_tx, label_rx) = tokio::sync::watch::channel(mcp_label);
    // A tunnel that dies takes the public URL with it: the header says so and the HTTP server
    // stops, as `serve --public` does; the TUI itself keeps running.
    let tunnel_task = tunnel.map(|mut t| {
        let stop = server_stop.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                why = t.exited.recv() => {
                    stop.cancel();
                    let _ = label_tx.send(format!(
                        "public URL down: the tunnel stopped ({}); MCP over HTTP is off",
                        why.unwrap_or_else(|| "it exited".into())
                    ));
                }
                _ = shutdown.cancelled() => {}
            }
            t.stop().await;
        })
    });
    let opts = ui::TuiOptions {
        store: ctx.store.clone(),
        home: ctx.home.clone(),
        cwd: ctx.cwd.clone(),
        keymap,
        mcp: label_rx,
        worker,
        worker_config: ctx.config.worker.clone(),
    };
    let aside = StderrAside::to(&ctx.home.logs_dir().join("tui-stderr.log"));
    let result = ui::run(opts, shutdown.clone()).await;
    // Running tasks go back to the queue (the worker releases them) before the process exits.
    shutdown.cancel();
    if let Some(running) = embedded {
        let worker = running.worker.clone();
        let wait = std::time::Duration::from_secs(10);
        if tokio::time::timeout(wait, running.handle).await.is_err() {
            tracing::warn!("the worker did not stop within 10 s; stopping its OpenCode server");
        }
        // Whatever became of the worker, its server does not outlive this process.
        worker.stop_server().await;
    }
    if let Some(t) = server_task {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), t).await;
    }
    drop(aside);
    if let Some(t) = tunnel_task {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), t).await;
    }
    result.context("running the terminal UI")
}

async fn serve(
    ctx: Ctx,
    args: crate::cli::ServeArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let auth = crate::token::resolve(ctx.home.root(), &args.http.guard, &ctx.env)?;
    let mut http = mcp::HttpConfig {
        listen: args.http.listen.clone(),
        token: auth.as_ref().map(|(t, _)| t.clone()),
        allowed_hosts: args.http.guard.allowed_hosts.clone(),
        json_response: args.json_response,
        metrics: Some(mcp::MetricsOf(ctx.store.clone())),
    };
    let mut roots = args.repo_roots.clone();
    if args.public.is_some() {
        crate::public::prepare(&ctx.cwd, &auth, &mut roots, &mut http)?;
    }
    let listener = mcp::bind(&http).await?;
    let addr = listener.local_addr()?;
    let mut tunnel = None;
    if let Some(kind) = args.public {
        let t = crate::public::open(kind, addr, &args.http.listen, &mut http, &ctx.env).await?;
        outln!("public MCP endpoint: {}/mcp", t.url);
        if let Some((_, source)) = &auth {
            outln!("{}", crate::public::claude_add_line(&t.url, source));
        }
        tunnel = Some(t);
    }
    let embedded = embedded(&ctx, &args.worker, shutdown.clone())?;
    let server = mcp_server(&ctx, &args.worker, embedded.as_ref())?;
    if !roots.is_empty() {
        server.restrict_repos(roots);
    }
    eprintln!("taskbridge MCP server at http://{addr}/mcp ({})", auth_label(&auth));
    let serving = mcp::serve_http(server, listener, http, shutdown.clone());
    let result = match tunnel.as_mut() {
        Some(t) => tokio::select! {
            r = serving => r.map_err(anyhow::Error::from),
            why = t.exited.recv() => Err(anyhow::anyhow!(
                "the tunnel stopped ({}); the public URL no longer works, so the server stops too",
                why.unwrap_or_else(|| "it exited".into())
            )),
        },
        None => serving.await.map_err(anyhow::Error::from),
    };
    shutdown.cancel();
    if let Some(t) = tunnel {
        t.stop().await;
    }
    finish_embedded(embedded).await;
    result
}

/// Whom a listener lets in, for the line that says where it listens.
fn auth_label(auth: &Option<(String, crate::token::Source)>) -> String {
    match auth {
        Some((_, source)) => source.describe(),
        None => "no token: any local user can call it".to_owned(),
    }
}

/// Standard error sent to a file while the TUI owns the terminal, and put back when dropped.
/// Anything written there meanwhile would tear the screen; and once the terminal has gone (a
/// hangup) a write to it fails, where `eprintln!` panics, and a panic there skipped the worker's
/// shutdown and left its OpenCode server running.
struct StderrAside(Option<std::os::fd::OwnedFd>);

impl StderrAside {
    fn to(path: &std::path::Path) -> StderrAside {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path);
        let saved = nix::unistd::dup(std::io::stderr());
        match (file, saved) {
            (Ok(file), Ok(saved)) if nix::unistd::dup2_stderr(&file).is_ok() => {
                StderrAside(Some(saved))
            }
            (file, _) => {
                tracing::warn!(path = %path.display(), ok = file.is_ok(), "stderr stays on the terminal");
                StderrAside(None)
            }
        }
    }
}

impl Drop for StderrAside {
    fn drop(&mut self) {
        if let Some(saved) = self.0.take() {
            let _ = nix::unistd::dup2_stderr(&saved);
        }
    }
}
