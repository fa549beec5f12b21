//! The short-lived CLI verbs: each is one queue operation and a print.

use crate::Ctx;
use crate::cli::{Command, SubmitArgs};
use anyhow::{Context, bail};
use queue::{DepRef, ListFilter, StatusFilter, Task, TaskId, TaskStatus};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use worker::TaskResult;

pub(crate) fn read_arg(text: &str, what: &str) -> anyhow::Result<String> {
    if text != "-" {
        return Ok(text.to_owned());
    }
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .with_context(|| format!("reading the {what} from stdin"))?;
    // `echo … |` and heredocs end with a newline that is not part of what was meant.
    let kept = s.trim_end_matches(['\n', '\r']).len();
    s.truncate(kept);
    Ok(s)
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    // serde_json escapes C0 controls itself; DEL and C1 it writes raw, so they are escaped here
    // the JSON way (only strings can hold them).
    let mut text = String::new();
    for c in serde_json::to_string_pretty(v)?.chars() {
        if c.is_control() && c as u32 >= 0x7f {
            text.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            text.push(c);
        }
    }
    text.push('\n');
    crate::output::write_raw(&text);
    Ok(())
}

pub fn run(ctx: Ctx, command: Command) -> anyhow::Result<ExitCode> {
    let store = &ctx.store;
    match command {
        Command::Submit(args) => submit(&ctx, args)?,
        Command::List { status, repo, limit, json } => list(&ctx, status, repo, limit, json)?,
        Command::Followup { id, prompt } => {
            let t = worker::followup(store, TaskId(id), &read_arg(&prompt, "prompt")?)?;
            outln!("{}", t.id.0);
        }
        Command::Merge { id, into, squash } => merge(&ctx, id, into, squash)?,
        Command::Result { id, max_diff_bytes } => {
            let task = store.get(TaskId(id))?;
            if task.result.is_none() {
                bail!(
                    "task {id} is {} and has no result yet; `taskbridge get {id}` shows where it is",
                    task.display_status
                );
            }
            let overlaps = worker::overlaps(store, &task)?;
            print_json(&mcp::replies::ResultReply::of(&task, max_diff_bytes, overlaps))?;
        }
        Command::Diff { id, color } => {
            let task = store.get(TaskId(id))?;
            let diff = task.result.map(|r| r.diff).unwrap_or_default();
            if diff.is_empty() {
                outln!("task {id} ({}): no changes", task.display_status);
                return Ok(ExitCode::SUCCESS);
            }
            crate::pager::show_diff(&diff, &color, &ctx.env)?;
        }
        Command::Show { id, json } => {
            let task = store.get(TaskId(id))?;
            if json {
                let mut v = serde_json::to_value(&task)?;
                v["overlaps"] = serde_json::to_value(worker::overlaps(store, &task)?)?;
                print_json(&v)?;
            } else {
                print_task(&task);
            }
        }
        Command::Logs { id, offset, max_bytes, follow } => {
            logs(&ctx, id, offset, max_bytes, follow)?
        }
        Command::Cancel { id } => {
            let t = store.cancel(TaskId(id))?;
            if t.status == TaskStatus::Running {
                outln!("task {id}: cancel requested; its worker stops the agent");
            } else {
                outln!("task {id}: {}", t.status);
            }
        }
        Command::Wait { ids, timeout } => return crate::verbs::wait(store, &ids, timeout),
        Command::Edit { id, prompt, title } => crate::verbs::edit(&ctx, id, prompt, title)?,
        Command::Pause => crate::verbs::pause(store, true)?,
        Command::Resume => crate::verbs::pause(store, false)?,
        Command::Completions { shell } => crate::verbs::completions(shell),
        Command::Retry { id } => {
            let t = store.retry(TaskId(id))?;
            outln!("task {id}: {}", t.display_status);
        }
        Command::Note { id, text } => note(&ctx, id, &text)?,
        Command::Answer { id, text } => {
            let t = store.answer(TaskId(id), &read_arg(&text, "answer")?, "cli")?;
            if t.status.is_terminal() {
                // `stop` on a budget: what was asked for, not a failure to go on.
                let why = t.error.as_deref().unwrap_or_default();
                outln!("task {id}: stopped: the task {} as asked ({why})", t.status);
            } else {
                outln!("task {id}: answered; {} to resume its session", t.display_status);
            }
        }
        Command::Priority { id, priority } => {
            let t = store.set_priority(TaskId(id), priority)?;
            outln!("task {id}: priority {}", t.priority);
        }
        Command::Clear { older_than, statuses } => clear(&ctx, &older_than, &statuses)?,
        Command::Status { json } => status(&ctx, json)?,
        Command::ListWorkers { json, all } => list_workers(&ctx, json, all)?,
        Command::Config { client, write, http_url } => {
            crate::clients::run(&client, write, ctx.home.root(), &http_url, &ctx.env)?
        }
        Command::Models { provider, agent, set_default, refresh } => {
            models(&ctx, provider, agent, set_default, refresh)?
        }
        Command::SetDefaultModel { model } => {
            worker::models::set_default_model(store, &ctx.config.worker.opencode, &model)?;
            outln!("default model: {model}");
        }
        Command::Doctor { probe, probe_timeout } => {
            let probe = probe.then(|| std::time::Duration::from_secs(probe_timeout));
            return crate::doctor::run(&ctx, probe);
        }
        Command::Service { action } => {
            // A queue other than the home's own file goes with the service.
            let own = ctx.home.db_path().display().to_string();
            let db = (ctx.db_arg != own).then_some(ctx.db_arg.as_str());
            crate::service::service(&action, ctx.home.root(), db, &ctx.env)?
        }
        Command::Migrate { from, to } => return migrate(&from, &to),
        Command::Worker(_)
        | Command::Mcp { .. }
        | Command::Serve(_)
        | Command::Tui(_)
        | Command::ClaudeMcp(_) => unreachable_long_running()?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `list`: the queue's tasks as a table or JSON, newest first, with how many more there are.
fn list(
    ctx: &Ctx,
    status: Option<String>,
    repo: Option<std::path::PathBuf>,
    limit: usize,
    json: bool,
) -> anyhow::Result<()> {
    let store = &ctx.store;
    let status =
        status.map(|s| s.parse::<StatusFilter>()).transpose().map_err(anyhow::Error::msg)?;
    let repo = repo.map(|r| {
        worker::resolve_repo(&ctx.cwd.join(&r), None)
            .map(|x| x.toplevel.display().to_string())
            .unwrap_or_else(|_| r.display().to_string())
    });
    let filter = ListFilter { status, repo: repo.clone(), limit: Some(limit + 1), offset: 0 };
    let mut tasks = store.list(&filter)?;
    let more = tasks.len() > limit;
    tasks.truncate(limit);
    if json {
        print_json(&tasks)?;
    } else {
        print_table(&tasks);
        if more {
            let total = store
                .rows(status)?
                .iter()
                .filter(|r| repo.as_ref().is_none_or(|p| &r.repo == p))
                .count();
            outln!("{} of {total} shown; --limit N shows more", tasks.len());
        }
    }
    Ok(())
}

/// `merge`: a done task's branch into the user's, and what was merged with it.
fn merge(ctx: &Ctx, id: i64, into: Option<String>, squash: bool) -> anyhow::Result<()> {
    let store = &ctx.store;
    let r = worker::merge_task(store, TaskId(id), into.as_deref(), squash)?;
    let others: Vec<String> =
        r.merged.iter().filter(|t| **t != id).map(|t| t.to_string()).collect();
    outln!(
        "task {id}: merged into {} ({}, {}){}{}",
        r.into,
        r.how,
        &r.commit[..r.commit.len().min(12)],
        r.checkout.as_deref().map(|c| format!("; updated {c}")).unwrap_or_default(),
        if others.is_empty() {
            String::new()
        } else {
            format!("; with the work of tasks {}", others.join(", "))
        }
    );
    Ok(())
}

/// `logs`: the task's log from `offset`, following it while the task runs.
fn logs(
    ctx: &Ctx,
    id: i64,
    offset: Option<u64>,
    max_bytes: usize,
    follow: bool,
) -> anyhow::Result<()> {
    let store = &ctx.store;
    let task = store.get(TaskId(id))?;
    let path = worker::logs::log_path(&ctx.home.logs_dir(), task.id.0);
    let mut chunk = worker::logs::read_log(&path, offset, max_bytes)?;
    if let Some(w) = worker::logs::elsewhere(&task, chunk.size, &worker::hostname(&ctx.env)) {
        bail!("{w} (`taskbridge show {id}` shows them)");
    }
    out!("{}", chunk.text);
    // Follow until the task stops running (finished, or waiting for an answer).
    if follow {
        loop {
            if chunk.eof {
                let t = store.get(task.id)?;
                if t.status.is_terminal() || t.status == TaskStatus::Waiting {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            chunk = worker::logs::read_log(&path, Some(chunk.next_offset), max_bytes)?;
            out!("{}", chunk.text);
        }
    }
    Ok(())
}

/// `note`: a note for the agent, and when it gets it.
fn note(ctx: &Ctx, id: i64, text: &str) -> anyhow::Result<()> {
    let store = &ctx.store;
    let t = store.add_note(TaskId(id), &read_arg(text, "note")?)?;
    let when = match t.status {
        TaskStatus::Queued => "with its prompt",
        TaskStatus::Waiting => "with the answer",
        _ => {
            "at its next step on OpenCode's warm server, else at its next turn; if the \
              task ends first, `show` says it was not delivered"
        }
    };
    outln!("task {id}: note added; the agent gets it {when}");
    Ok(())
}

/// `clear-finished`: finished tasks older than `older_than` with one of `statuses`.
fn clear(ctx: &Ctx, older_than: &str, statuses: &str) -> anyhow::Result<()> {
    let store = &ctx.store;
    let secs = parse_duration(older_than)?;
    let statuses = statuses
        .split(',')
        .map(|s| s.trim().parse::<TaskStatus>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let cleared = worker::clear_finished(store, &ctx.home, secs, &statuses, &[])?;
    outln!("cleared {} task(s)", cleared.len());
    Ok(())
}

/// `status`: the queue's counts, spend, default model and live workers.
fn status(ctx: &Ctx, json: bool) -> anyhow::Result<()> {
    let store = &ctx.store;
    let st = store.queue_status()?;
    if json {
        print_json(&st)?;
    } else {
        outln!("database: {}", ctx.store.location());
        let order = ["queued", "blocked", "running", "waiting", "done", "failed", "cancelled"];
        let counts: Vec<String> =
            order.iter().map(|k| format!("{k} {}", st.counts.get(*k).unwrap_or(&0))).collect();
        outln!("tasks: {}", counts.join(", "));
        if let Some(age) = st.oldest_queued_age_s {
            outln!("oldest queued: {}", human_duration(age));
        }
        outln!("default model: {}", st.default_model.as_deref().unwrap_or("(OpenCode's own)"));
        let spend = &st.spend_today;
        let by: Vec<String> = spend
            .cost_usd_by_status
            .iter()
            .map(|(s, c)| format!("{s} {}", queue::usd(*c)))
            .collect();
        outln!(
            "spent today: {}, {} tokens{}",
            queue::usd(spend.cost_usd),
            spend.tokens,
            if by.is_empty() { String::new() } else { format!(" ({})", by.join(", ")) }
        );
        // On a queue shared by several hosts, which of them have a live worker.
        let mut hosts: Vec<&str> =
            st.workers.iter().filter(|w| !w.stopped && !w.stale).map(|w| w.host.as_str()).collect();
        hosts.sort_unstable();
        hosts.dedup();
        let on =
            if hosts.len() > 1 { format!(" (on {})", hosts.join(", ")) } else { String::new() };
        outln!("workers alive: {}{on}", st.workers_alive);
        for w in st.workers.iter().filter(|w| !w.stopped) {
            let tasks: Vec<String> = w.current_tasks.iter().map(|t| t.0.to_string()).collect();
            outln!(
                "  {} pid {}{} ({}) running [{}]",
                w.id,
                w.pid,
                if w.stale { " (stale)" } else { "" },
                w.agent.as_deref().unwrap_or("agent unknown"),
                tasks.join(", ")
            );
        }
    }
    Ok(())
}

/// `list-workers`: the workers of this queue, alive, stale or stopped (within a day, or all).
fn list_workers(ctx: &Ctx, json: bool, all: bool) -> anyhow::Result<()> {
    let store = &ctx.store;
    let workers = if all { store.list_all_workers()? } else { store.list_workers()? };
    if json {
        print_json(&workers)?;
    } else if workers.is_empty() {
        outln!("no workers have run on this database; start one with `taskbridge worker`");
    } else {
        outln!(
            "{:<28}  {:>7}  {:<16}  {:<8}  {:>9}  {:<15}  {:<26}  TASKS",
            "ID",
            "PID",
            "HOST",
            "STATE",
            "HEARTBEAT",
            "AGENT",
            "RUNS"
        );
        for w in &workers {
            let state = match (w.stopped, w.stale) {
                (true, _) => "stopped",
                (false, true) => "stale",
                (false, false) => "alive",
            };
            let tasks: Vec<String> = w.current_tasks.iter().map(|t| t.0.to_string()).collect();
            let runs = if w.agents.is_empty() { "opencode".into() } else { w.agents.join(",") };
            outln!(
                "{:<28}  {:>7}  {:<16}  {:<8}  {:>9}  {:<15}  {:<26}  {}",
                truncate(&w.id, 28),
                w.pid,
                truncate(&w.host, 16),
                state,
                format!("{} ago", human_duration(now() - w.heartbeat_at)),
                w.agent.as_deref().unwrap_or("?"),
                runs,
                tasks.join(", ")
            );
        }
    }
    Ok(())
}

/// `list-models`: OpenCode's models (or another agent's), or `--set-default`.
fn models(
    ctx: &Ctx,
    provider: Option<String>,
    agent: Option<String>,
    set_default: Option<String>,
    refresh: bool,
) -> anyhow::Result<()> {
    let store = &ctx.store;
    let opencode = &ctx.config.worker.opencode;
    let agents = &ctx.config.worker.agents;
    let agent = worker::agent::AgentSpec::resolve(agent.as_deref().unwrap_or(""), agents)
        .map_err(|e| anyhow::anyhow!(e))?;
    if let Some(configured) = agent.configured.as_deref().and_then(|n| ctx.config.worker.agent(n)) {
        let (models, note) = worker::models::configured_agent_models(configured, &ctx.env)?;
        for m in models {
            outln!("{m}");
        }
        if let Some(note) = note {
            eprintln!("({note})");
        }
        return Ok(());
    }
    if agent.kind != worker::agent::AgentKind::OpenCode {
        if set_default.is_some() {
            anyhow::bail!(
                "--set-default sets OpenCode's default model; give another agent's model \
                 to each task with --model"
            );
        }
        let program = ctx.config.worker.program(agent.kind);
        let (models, note) = worker::models::agent_models(agent.kind, program, &ctx.env)?;
        for m in models {
            outln!("{m}");
        }
        if let Some(note) = note {
            eprintln!("({note})");
        }
        return Ok(());
    }
    match set_default {
        Some(m) => {
            worker::models::set_default_model(store, opencode, &m)?;
            outln!("default model: {m}");
        }
        None => {
            for m in worker::models::list_models(store, opencode, provider.as_deref(), refresh)? {
                outln!("{m}");
            }
            if let Some(at) = worker::models::fetched_at(store)? {
                eprintln!(
                    "(OpenCode's list as fetched {} ago; it is kept for an hour, and \
                     --refresh fetches it again)",
                    human_duration(now() - at)
                );
            }
        }
    }
    Ok(())
}

fn unreachable_long_running() -> anyhow::Result<()> {
    bail!("internal: this command runs on the async runtime")
}

fn submit(ctx: &Ctx, a: SubmitArgs) -> anyhow::Result<()> {
    let mut task = a.task;
    task.prompt = read_arg(&task.prompt, "prompt")?;
    let repo = task.repo.take().map_or_else(|| ctx.cwd.clone(), PathBuf::from);
    let deps = task.depends_on.iter().map(|i| DepRef::Task(TaskId(*i))).collect();
    let req = task.into_request(repo, deps);
    let (task, created, warnings) = worker::submit(&ctx.store, &ctx.cwd, &ctx.config.worker, req)?;
    if a.json {
        print_json(&task)?;
    } else {
        outln!("{}", task.id.0);
        if !created {
            eprintln!("(request id seen before: this is the task it created)");
        }
    }
    for w in warnings {
        eprintln!("warning: {}", crate::output::escape_controls(&w));
    }
    Ok(())
}

/// `30s`, `15m`, `12h`, `7d`, or plain seconds.
pub fn parse_duration(s: &str) -> anyhow::Result<f64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1.0),
        Some((i, 'm')) => (&s[..i], 60.0),
        Some((i, 'h')) => (&s[..i], 3600.0),
        Some((i, 'd')) => (&s[..i], 86400.0),
        _ => (s, 1.0),
    };
    match num.parse::<f64>() {
        Ok(n) if n >= 0.0 && n.is_finite() => Ok(n * mult),
        _ => bail!("'{s}' is not a duration; use e.g. 30s, 15m, 12h or 7d"),
    }
}

pub fn human_duration(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// How long it has run (so far, or in all once finished), as the TUI's RAN; blank when it never
/// started. AGE is the time since it was submitted, whatever its state.
fn ran(t: &Task) -> String {
    match (t.started_at, t.finished_at) {
        (Some(s), Some(f)) => human_duration(f - s),
        (Some(s), None) => human_duration(now() - s),
        _ => String::new(),
    }
}

/// `text` with every line after the first indented by `by` spaces, so it stays in its column.
fn indent(text: &str, by: usize) -> String {
    text.lines().collect::<Vec<_>>().join(&format!("\n{}", " ".repeat(by)))
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(n.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

fn print_table(tasks: &[Task]) {
    if tasks.is_empty() {
        outln!("no tasks");
        return;
    }
    outln!(
        "{:>5}  {:<9}  {:>4}  {:>3}  {:>5}  {:>5}  {:<40}  REPO",
        "ID",
        "STATE",
        "PRI",
        "TRY",
        "AGE",
        "RAN",
        "TITLE"
    );
    for t in tasks {
        let repo = std::path::Path::new(&t.repo)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        outln!(
            "{:>5}  {:<9}  {:>4}  {:>3}  {:>5}  {:>5}  {:<40}  {}",
            t.id.0,
            t.display_status,
            t.priority,
            t.attempts,
            human_duration(now() - t.created_at),
            ran(t),
            truncate(&t.title, 40),
            repo
        );
    }
}

fn print_task(t: &Task) {
    outln!("task {}: {}", t.id.0, t.title);
    outln!("  state:     {} (attempt {} of {})", t.display_status, t.attempts, t.max_attempts);
    // A queued task that no worker takes while they idle is waiting out a failed attempt's
    // retry delay: said here, with when and why.
    if let Some(at) = t.not_before.filter(|at| t.status == TaskStatus::Queued && *at > now()) {
        outln!(
            "  retry:     in {} (after a failed attempt: {})",
            human_duration(at - now()),
            t.error.as_deref().unwrap_or("no error recorded")
        );
    }
    outln!("  repo:      {} @ {}", t.repo, &t.base[..t.base.len().min(12)]);
    outln!("  priority:  {}", t.priority);
    if let Some(m) = &t.model {
        outln!("  model:     {m}");
    }
    if let Some(a) = &t.agent {
        outln!("  agent:     {a}");
    }
    let flags: Vec<&str> = [
        (t.readonly, "readonly"),
        (t.no_network, "no-network"),
        (t.no_shell, "no-shell"),
        (t.worktree_keep, "keep-worktree"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, n)| *n)
    .collect();
    if !flags.is_empty() {
        outln!("  flags:     {}", flags.join(", "));
    }
    if !t.ask_rules.is_empty() {
        outln!("  asks:      {}", t.ask_rules.join(", "));
    }
    if let Some(c) = t.budget.max_cost_usd {
        outln!("  budget:    {}", queue::usd(c));
    }
    if let Some(n) = t.budget.max_tokens {
        outln!("  budget:    {n} tokens");
    }
    if !t.depends_on.is_empty() {
        let ids = |v: &[TaskId]| v.iter().map(|i| i.0.to_string()).collect::<Vec<_>>().join(", ");
        if t.waiting_on.is_empty() {
            outln!("  after:     {} (all done)", ids(&t.depends_on));
        } else {
            outln!("  after:     {} (waiting on: {})", ids(&t.depends_on), ids(&t.waiting_on));
        }
    }
    if let Some(b) = &t.branch {
        outln!("  branch:    {b}");
    }
    if !t.stacked_on.is_empty() {
        let ids: Vec<String> = t.stacked_on.iter().map(|i| i.0.to_string()).collect();
        outln!("  stacked:   on the work of tasks {}", ids.join(", "));
    }
    if let Some(p) = t.parent {
        outln!("  follows:   task {} (its session)", p.0);
    }
    if !t.followups.is_empty() {
        let ids: Vec<String> = t.followups.iter().map(|i| i.0.to_string()).collect();
        outln!("  followups: {}", ids.join(", "));
    }
    if !t.dependents.is_empty() {
        let ids: Vec<String> = t.dependents.iter().map(|i| i.0.to_string()).collect();
        outln!("  needed by: {}", ids.join(", "));
    }
    if let (Some(into), Some(c)) = (&t.merged_into, &t.merge_commit) {
        outln!("  merged:    into {into} ({})", &c[..c.len().min(12)]);
    }
    if let Some(w) = &t.worktree {
        outln!("  worktree:  {w}");
    }
    if let Some(s) = &t.session_id {
        outln!("  session:   {s}");
    }
    if let Some(q) = &t.question {
        print_decision(t, q);
    }
    for (i, q) in t.questions.iter().enumerate() {
        if q.answer.is_some() {
            let by = q.answered_by.as_deref().map(|b| format!(" (by {b})")).unwrap_or_default();
            outln!(
                "  Q{}: {}\n  A{}: {}{by}",
                i + 1,
                indent(&q.question, 6),
                i + 1,
                indent(q.answer.as_deref().unwrap_or(""), 6)
            );
        }
    }
    for n in &t.notes {
        outln!("  note: {}{}", n.note, n.marker());
    }
    if let Some(e) = &t.error {
        outln!("  error:     {e}");
    }
    if let Some(r) = &t.result {
        print_result(r);
    }
    outln!("  prompt:\n    {}", t.prompt.replace('\n', "\n    "));
}

/// The decision a waiting task needs: the question, its options, and how to answer.
fn print_decision(t: &Task, q: &str) {
    let kind = match t.ask.as_ref().map(|a| a.kind) {
        Some(queue::AskKind::Permission) => "PERMISSION",
        Some(queue::AskKind::Budget) => "BUDGET",
        _ => "QUESTION",
    };
    outln!("  {kind:<10} {}", indent(q, 13));
    for aq in t.ask.iter().flat_map(|a| &a.questions) {
        if let Some(h) = &aq.header {
            outln!(
                "             [{h}]{}",
                if aq.multiple { " (several may be chosen)" } else { "" }
            );
        }
        for o in &aq.options {
            match &o.description {
                Some(d) => outln!("             - {}: {d}", o.label),
                None => outln!("             - {}", o.label),
            }
        }
    }
    let hint = match t.ask.as_ref().map(|a| a.kind) {
        Some(queue::AskKind::Permission) => "once|always|reject|\"reject: ...\"",
        Some(queue::AskKind::Budget) => "continue|\"continue 2.00\"|stop",
        _ => "\"...\"",
    };
    outln!("             answer with: taskbridge answer {} {hint}", t.id.0);
}

/// What a task's result says: no changes, summary, files, tests, questions, usage, the agent.
fn print_result(r: &TaskResult) {
    if r.no_changes {
        outln!("  NO CHANGES: the agent changed no file");
    }
    if !r.summary.trim().is_empty() {
        outln!("  summary:   {}", r.summary.trim().replace('\n', "\n             "));
    }
    for f in &r.files_touched {
        outln!("  file:      {} {}", f.status, f.path);
    }
    for test in &r.tests_run {
        let code = test.exit_code.map_or("?".to_owned(), |c| c.to_string());
        let seen = if test.observed { "" } else { " (claimed, not observed)" };
        outln!("  test:      {} -> exit {code}{seen}", test.command);
    }
    for q in &r.open_questions {
        outln!("  open:      {q}");
    }
    let u = &r.usage;
    let cost = u.cost_usd.map_or_else(|| "cost not reported".into(), queue::usd);
    outln!(
        "  usage:     {} in, {} out, {} cache read, {} cache write, {cost}",
        u.input_tokens,
        u.output_tokens,
        u.cache_read_tokens,
        u.cache_write_tokens,
    );
    if let Some(a) = &r.agent {
        outln!("  ran on:    {}", a.name);
        for f in &a.fallbacks {
            outln!("             {f}");
        }
    }
    if let Some(c) = &r.commit {
        outln!("  commit:    {c}");
    }
    if !r.reverted_files.is_empty() {
        outln!("  reverted:  {}", r.reverted_files.join(", "));
    }
}

/// `taskbridge migrate --from A --to B`: copies every row; the source is left as it was.
pub fn migrate(from: &str, to: &str) -> anyhow::Result<ExitCode> {
    let (from, to) = (
        queue::Location::parse(from).context("reading --from")?,
        queue::Location::parse(to).context("reading --to")?,
    );
    let src = queue::Store::connect(&from).with_context(|| format!("opening {from}"))?;
    let dst = queue::Store::connect(&to).with_context(|| format!("opening {to}"))?;
    let copied =
        queue::copy_queue(&src, &dst).with_context(|| format!("copying {from} to {to}"))?;
    let rows: Vec<String> = copied.0.iter().map(|(t, n)| format!("{t} {n}")).collect();
    outln!("copied {from} to {to}: {}", rows.join(", "));
    outln!("point every command at the new queue with --db or TASKBRIDGE_DB; {from} is unchanged");
    Ok(ExitCode::SUCCESS)
}
