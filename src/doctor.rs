//! `taskbridge doctor`: what a newcomer runs to see what is missing. Each check prints one line,
//! `ok`, `warn` or `FAIL`, and every line that is not `ok` says the fix. Exits non-zero when a
//! check fails (a warning alone does not).

use crate::Ctx;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The OpenCode release TaskBridge is tested against.
pub use worker::agent::OPENCODE_TESTED;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Level {
    Ok,
    Warn,
    Fail,
}

struct Check {
    level: Level,
    what: String,
    fix: Option<String>,
}

fn ok(what: impl Into<String>) -> Check {
    Check { level: Level::Ok, what: what.into(), fix: None }
}
fn warn(what: impl Into<String>, fix: impl Into<String>) -> Check {
    Check { level: Level::Warn, what: what.into(), fix: Some(fix.into()) }
}
fn fail(what: impl Into<String>, fix: impl Into<String>) -> Check {
    Check { level: Level::Fail, what: what.into(), fix: Some(fix.into()) }
}

/// Runs `cmd` with a time limit (stdout and stderr captured), killing it if it overruns.
fn run_limited(cmd: &mut Command, limit: Duration) -> Result<std::process::Output, String> {
    worker::process::output_within(cmd, limit)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no answer within {} s", limit.as_secs()))
}

/// `program args`' stdout, or what went wrong.
fn output(program: &Path, args: &[&str], limit: Duration) -> Result<String, String> {
    let out = run_limited(Command::new(program).args(args), limit)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(format!("{}: {}", out.status, err.trim().lines().last().unwrap_or("")))
    }
}

/// The `sandbox` line: what the kernel holds for every agent, and what a mode that cannot
/// hold means for tasks.
fn sandbox(ctx: &Ctx) -> Check {
    use worker::sandbox::{Kernel, Mode};
    let mode = ctx.config.worker.sandbox.mode;
    let kernel = Kernel::probe();
    // `describe` names the mechanism that holds --no-network: a network namespace where this
    // user may make one, else Landlock's TCP rules, which hold the proxy's port only.
    let line = format!("sandbox ({}): {}", mode.as_str(), kernel.describe());
    match (mode, kernel.walls(), kernel.tcp_rules()) {
        (Mode::Off, ..) => warn(
            "sandbox: off; agents keep to the worktree only as far as they honour their rules",
            "set [sandbox] mode = \"enforce\" in the config file (the default)",
        ),
        (_, true, true) if !kernel.network_namespaces => warn(
            line,
            "--no-network holds the proxy's port, not its address: other addresses on that port \
             and UDP stay open. Allow user namespaces (sysctl user.max_user_namespaces, or \
             kernel.unprivileged_userns_clone=1) or run the worker as root",
        ),
        (_, true, true) => ok(line),
        (Mode::Enforce, true, false) => warn(
            line,
            "tasks asking for no_network are refused here: TCP rules need Linux 6.7 (Landlock ABI 4)",
        ),
        (Mode::Enforce, false, _) => warn(
            line,
            "tasks asking for readonly or no_network are refused here; other tasks run without a \
             wall. Use Linux 5.13+ with Landlock in CONFIG_LSM",
        ),
        (_, _, _) => {
            warn(line, "tasks run with the agent's own rules where the kernel cannot hold them")
        }
    }
}

fn opencode(ctx: &Ctx) -> Check {
    use worker::agent::{OPENCODE2_PACKAGE, OPENCODE2_TESTED};
    let program = &ctx.config.worker.opencode;
    let install = format!(
        "install it with `npm install -g {OPENCODE2_PACKAGE}@{OPENCODE2_TESTED}` (OpenCode 2) or \
         `npm install -g opencode-ai@{OPENCODE_TESTED}` (OpenCode 1), or set TASKBRIDGE_OPENCODE \
         (or `[worker] opencode` in the config file) to its path"
    );
    let Some(path) = ctx.env.find_program(program) else {
        return fail(format!("OpenCode: '{}' not found", program.display()), install);
    };
    let version = match worker::agent::opencode_version(&path, &ctx.env) {
        Some(v) => v,
        None => match output(&path, &["--version"], Duration::from_secs(30)) {
            Ok(v) => v.split_whitespace().last().unwrap_or("").trim_start_matches('v').to_owned(),
            Err(e) => {
                return fail(format!("OpenCode at {} does not run: {e}", path.display()), install);
            }
        },
    };
    let major = worker::agent::major(&version);
    let chosen = ctx.config.worker.opencode_mode;
    let way = match (major, chosen) {
        (Some(m), _) if m >= 2 => "over ACP (`opencode acp`, one per repository)".to_owned(),
        (_, worker::OpenCodeMode::Acp) => "over ACP (`opencode acp`, one per repository)".into(),
        (_, worker::OpenCodeMode::Serve) => "on its warm server (`opencode serve`)".into(),
        (_, worker::OpenCodeMode::Run) => "a process per prompt (`opencode run`)".into(),
    };
    let line = format!(
        "OpenCode {version} (major version {}) at {}: tasks run {way}",
        major.map_or_else(|| "?".to_owned(), |m| m.to_string()),
        path.display()
    );
    let tested = [OPENCODE_TESTED, OPENCODE2_TESTED];
    match (major, tested.contains(&version.as_str())) {
        (_, true) => ok(line),
        (Some(1 | 2), false) => warn(
            format!("{line} (TaskBridge is tested with {OPENCODE_TESTED} and {OPENCODE2_TESTED})"),
            format!(
                "if tasks misbehave, `npm install -g {OPENCODE2_PACKAGE}@{OPENCODE2_TESTED}` or \
                 `npm install -g opencode-ai@{OPENCODE_TESTED}`"
            ),
        ),
        _ => warn(
            format!("{line}: an OpenCode TaskBridge does not know; it is driven over ACP"),
            format!("`npm install -g {OPENCODE2_PACKAGE}@{OPENCODE2_TESTED}`"),
        ),
    }
}

/// Each `[agents.NAME]` of the configuration: started, and asked over ACP who it is.
fn configured_agents(ctx: &Ctx) -> Vec<Check> {
    let agents = &ctx.config.worker.agents;
    agents
        .iter()
        .map(|a| {
            let fix = format!("fix `command` in [agents.{}] of {}", a.name, config_name(ctx));
            if let Some(missing) = a.missing(&ctx.env) {
                return fail(format!("agent {}: {missing}", a.name), fix);
            }
            let program = a.command.first().cloned().unwrap_or_default();
            match worker::agent::acp::probe(&a.launch()) {
                Ok(info) => ok(format!("agent {}: {info} over ACP at {program}", a.name)),
                Err(e) => fail(format!("agent {}: {e}", a.name), fix),
            }
        })
        .collect()
}

fn config_name(ctx: &Ctx) -> String {
    ctx.config
        .path
        .as_ref()
        .map_or_else(|| "TaskBridge's config.toml".into(), |p| p.display().to_string())
}

/// Claude Code and Codex: optional, so a missing one is not a warning; an installed one is
/// named with its version, and one other than the tested version says which that is.
fn other_agent(ctx: &Ctx, kind: worker::agent::AgentKind) -> Check {
    use worker::agent::{AgentKind, CLAUDE_CODE_TESTED, CODEX_TESTED};
    let (name, tested) = match kind {
        AgentKind::ClaudeCode => ("Claude Code", CLAUDE_CODE_TESTED),
        _ => ("Codex", CODEX_TESTED),
    };
    let program = ctx.config.worker.program(kind);
    let Some(path) = ctx.env.find_program(program) else {
        return ok(format!(
            "agent {}: {name} is not installed (only tasks with --agent {} need it: `{}`)",
            kind.name(),
            kind.name(),
            kind.install_command()
        ));
    };
    match output(&path, &["--version"], Duration::from_secs(30)) {
        Ok(v) if v.contains(tested) => {
            ok(format!("agent {}: {name} {tested} at {}", kind.name(), path.display()))
        }
        Ok(v) => warn(
            format!(
                "agent {}: {name} {} at {} (TaskBridge is tested with {tested})",
                kind.name(),
                v.trim(),
                path.display()
            ),
            format!("if its tasks misbehave, `{}`", kind.install_command()),
        ),
        Err(e) => warn(
            format!("agent {}: {name} at {} does not run: {e}", kind.name(), path.display()),
            format!("reinstall it: `{}`", kind.install_command()),
        ),
    }
}

/// The model tasks get when they name none, checked against what OpenCode offers.
fn model(ctx: &Ctx) -> (Check, Option<String>) {
    let stored = ctx.store.setting("default_model").ok().flatten();
    let (model, from) = match (&stored, &ctx.config.worker.default_model) {
        (Some(m), _) => (Some(m.clone()), "set with set-default-model"),
        (None, Some(m)) => (Some(m.clone()), "from TASKBRIDGE_MODEL or the config file"),
        (None, None) => (None, ""),
    };
    let set_up = "set up a provider (`opencode auth login`, or its API key such as \
                  ANTHROPIC_API_KEY), then `taskbridge set-default-model PROVIDER/MODEL` \
                  (`taskbridge list-models` lists them)";
    // OpenCode's own config may name one (`model` in opencode.json).
    let own = || {
        let path = ctx.env.find_program(&ctx.config.worker.opencode)?;
        let text = output(&path, &["debug", "config"], Duration::from_secs(30)).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v.get("model")?.as_str().map(str::to_owned)
    };
    let (m, from) = match model {
        Some(m) => (m, from),
        None => match own() {
            Some(m) => (m, "from OpenCode's own config"),
            None => {
                return (
                    warn(
                        "model: none configured, so OpenCode picks its own default (a hosted \
                         one, which needs the network)",
                        set_up,
                    ),
                    None,
                );
            }
        },
    };
    let check = worker::models::check_model(&ctx.store, &ctx.config.worker.opencode, &m);
    let c = match check {
        Ok(worker::models::ModelCheck::Known) => {
            ok(format!("model {m} ({from}) is offered by OpenCode"))
        }
        Ok(worker::models::ModelCheck::Unverified(why)) => {
            warn(format!("model {m} ({from}) could not be checked: {why}"), "fix OpenCode first")
        }
        Err(e) => fail(format!("model {m} ({from}): {e}"), set_up),
    };
    (c, Some(m))
}

/// A one-token prompt through OpenCode: the model is not only named but answers, within
/// `limit` (`--probe-timeout`: OpenCode retries an endpoint that does not answer for over a
/// minute, and a person running doctor wants to know sooner).
fn probe(ctx: &Ctx, model: &str, limit: Duration) -> Check {
    let Some(path) = ctx.env.find_program(&ctx.config.worker.opencode) else {
        return fail("probe: OpenCode not found", "see the OpenCode line above");
    };
    let dir = std::env::temp_dir().join(format!("taskbridge-probe-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let mut cmd = Command::new(&path);
    cmd.args(["run", "--format", "json", "-m", model, "Reply with the single word OK."])
        .current_dir(&dir);
    let provider = model.split('/').next().unwrap_or(model);
    // Where the provider is reached: the baseURL OpenCode's config gives it, else its default.
    let endpoint = output(&path, &["debug", "config"], Duration::from_secs(30))
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|v| {
            v.pointer(&format!("/provider/{provider}/options/baseURL"))?.as_str().map(str::to_owned)
        })
        .unwrap_or_else(|| "its default endpoint".to_owned());
    let who = format!("{model} (provider {provider}, {endpoint})");
    let started = Instant::now();
    let out = run_limited(&mut cmd, limit);
    let _ = std::fs::remove_dir_all(&dir);
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            return fail(
                format!("probe: {who} did not answer: {e}"),
                "check that the endpoint is up and reachable and the provider's key is right \
                 (`opencode auth login`), or choose another model",
            );
        }
    };
    let mut run = worker::RunLog::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        run.ingest(line);
    }
    match (&run.error, out.status.success()) {
        (None, true) if run.usage.output_tokens > 0 || !run.texts.is_empty() => {
            ok(format!("probe: {model} answered in {:.1} s", started.elapsed().as_secs_f64()))
        }
        (Some(e), _) => fail(
            format!("probe: {who} did not answer: {e}"),
            "check the provider's key (`opencode auth login`) and endpoint, or choose another model",
        ),
        _ => fail(
            format!("probe: {who} gave no answer (opencode exited with {})", out.status),
            "run `opencode run -m MODEL hi` to see OpenCode's own error",
        ),
    }
}

fn home(ctx: &Ctx) -> Check {
    let probe = ctx.home.root().join(".doctor-write-test");
    let file = std::fs::write(&probe, b"ok").and_then(|()| std::fs::remove_file(&probe));
    let db = ctx
        .store
        .set_setting("doctor_checked_at", &format!("{:?}", std::time::SystemTime::now()))
        .and_then(|()| match ctx.store.quick_check()?.as_str() {
            "ok" => Ok(()),
            damage => Err(queue::Error::Corrupt {
                path: ctx.store.location().to_string(),
                detail: format!("quick_check: {damage}"),
            }),
        });
    match (file, db) {
        (Ok(()), Ok(())) => ok(format!(
            "home {} and database {} are writable ({})",
            ctx.home.root().display(),
            ctx.store.location(),
            ctx.store.backend_info().unwrap_or_else(|e| format!("version unknown: {e}"))
        )),
        (Err(e), _) => fail(
            format!("home {} is not writable: {e}", ctx.home.root().display()),
            "free some space or fix its permissions, or pass --home DIR",
        ),
        (_, Err(queue::Error::Corrupt { path, detail })) => fail(
            format!("database {path} is damaged ({detail})"),
            format!(
                "stop every TaskBridge process, then restore it from a backup, or rescue what is \
                 left: {}",
                queue::recover_commands(&path)
            ),
        ),
        (_, Err(queue::Error::ReadOnly { path, detail })) => fail(
            format!("database {path} cannot be written ({detail})"),
            format!(
                "make the file and its directory yours and writable (`ls -l {path}`), check the \
                 file system is not read-only, or point --db (TASKBRIDGE_DB) elsewhere"
            ),
        ),
        (_, Err(e)) => fail(
            format!("database {} is not writable: {e}", ctx.store.location()),
            "free some space or fix its permissions, or point --db (TASKBRIDGE_DB) elsewhere",
        ),
    }
}

/// The `mcpServers.taskbridge` entry of a client's JSON config, if any.
fn entry(path: &Path, section: &str) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(path).ok()?;
    let doc: serde_json::Value = serde_json::from_str(&text).ok()?;
    doc.get(section)?.get("taskbridge").cloned()
}

/// The command an entry runs exists (a stale path after a reinstall is a common breakage).
fn entry_check(client: &str, path: &Path, e: serde_json::Value, fix: &str) -> Check {
    let command = match &e["command"] {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(a) => a.first().and_then(|v| v.as_str()).map(str::to_owned),
        _ => None,
    };
    match command {
        Some(c) if !Path::new(&c).exists() => fail(
            format!("{client}: the entry in {} runs {c}, which does not exist", path.display()),
            fix,
        ),
        Some(c) => ok(format!("{client}: registered in {} ({c})", path.display())),
        None if e.get("url").is_some() => {
            ok(format!("{client}: registered in {} (HTTP {})", path.display(), e["url"]))
        }
        None => warn(format!("{client}: the entry in {} has no command", path.display()), fix),
    }
}

fn registrations(ctx: &Ctx) -> Vec<Check> {
    let mut out = Vec::new();
    let home = ctx.env.home_dir().unwrap_or_default();
    let claude = home.join(".claude.json");
    let project = ctx.cwd.join(".mcp.json");
    let fix = "run `taskbridge config claude-code --write` (or paste a line from `taskbridge config claude-code`)";
    match entry(&claude, "mcpServers")
        .map(|e| (claude.clone(), e))
        .or_else(|| entry(&project, "mcpServers").map(|e| (project.clone(), e)))
    {
        Some((p, e)) => out.push(entry_check("Claude Code", &p, e, fix)),
        None => out.push(warn("Claude Code: TaskBridge is not registered", fix)),
    }
    let fix = "run `taskbridge config claude-desktop --write`, then restart Claude Desktop";
    if let Ok(p) = crate::clients::claude_desktop_path(&ctx.env) {
        match entry(&p, "mcpServers") {
            Some(e) => out.push(entry_check("Claude Desktop", &p, e, fix)),
            None if p.parent().is_some_and(Path::exists) => {
                out.push(warn("Claude Desktop: installed, but TaskBridge is not registered", fix))
            }
            None => {}
        }
    }
    if let Ok(p) = crate::clients::opencode_config_path(&ctx.env)
        && let Some(e) = entry(&p, "mcp")
    {
        out.push(entry_check(
            "OpenCode (reverse bridge)",
            &p,
            e,
            "run `taskbridge config opencode --write`",
        ));
        if !ctx.config.claude_bridge {
            out.push(warn(
                "OpenCode (reverse bridge): registered, but tasks do not get it (workers \
                 offer it only with --claude-bridge)",
                "set `claude_bridge = true` under [worker] in config.toml, or start workers \
                 with --claude-bridge",
            ));
        }
    }
    out
}

fn workers(ctx: &Ctx) -> Check {
    match ctx.store.list_workers() {
        Ok(ws) => {
            let alive: Vec<_> = ws.iter().filter(|w| !w.stopped && !w.stale).collect();
            if alive.is_empty() {
                warn(
                    "worker: none alive, so submitted tasks wait in the queue",
                    "start `taskbridge tui` or `taskbridge worker`, or `taskbridge service install` \
                     to keep one running (the MCP servers run one inside)",
                )
            } else {
                let list: Vec<String> =
                    alive.iter().map(|w| format!("{} (pid {})", w.id, w.pid)).collect();
                ok(format!("worker: {} alive: {}", alive.len(), list.join(", ")))
            }
        }
        Err(e) => fail(format!("worker: cannot read the workers: {e}"), "see the home line above"),
    }
}

/// Every check, and with `probe` (its time limit) the model's answer to a one-word prompt.
pub fn run(ctx: &Ctx, probe_limit: Option<Duration>) -> anyhow::Result<std::process::ExitCode> {
    let mut checks = vec![opencode(ctx)];
    checks.push(other_agent(ctx, worker::agent::AgentKind::ClaudeCode));
    checks.push(other_agent(ctx, worker::agent::AgentKind::Codex));
    checks.extend(configured_agents(ctx));
    let (m, model) = model(ctx);
    checks.push(m);
    if let Some(limit) = probe_limit {
        match &model {
            Some(m) => checks.push(probe(ctx, m, limit)),
            None => {
                checks.push(warn("probe: skipped, no model is configured", "configure one first"))
            }
        }
    }
    checks.push(home(ctx));
    checks.push(sandbox(ctx));
    checks.extend(registrations(ctx));
    checks.push(workers(ctx));
    if let Some(p) = &ctx.config.path
        && p.exists()
    {
        checks.push(ok(format!("config file {} read", p.display())));
    }
    let mut failed = false;
    for c in &checks {
        let tag = match c.level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        failed |= c.level == Level::Fail;
        outln!("{tag}  {}", c.what);
        if let Some(fix) = &c.fix {
            outln!("      fix: {fix}");
        }
    }
    if probe_limit.is_none() && !failed {
        outln!("(`taskbridge doctor --probe` also sends the model a one-word prompt)");
    }
    Ok(if failed { std::process::ExitCode::FAILURE } else { std::process::ExitCode::SUCCESS })
}
