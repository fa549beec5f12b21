//! The terminal, the event loop and the effects: everything in the TUI that does I/O.

use crate::app::{Effect, Event, Header, Model, Op};
use crate::keymap::Keymap;
use queue::{Home, Store, TaskId};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use worker::Worker;

/// Log bytes read per load: bounds memory whatever the log's size.
const LOG_PAGE: usize = 256 * 1024;

pub struct TuiOptions {
    pub store: Arc<Store>,
    pub home: Home,
    pub cwd: PathBuf,
    pub keymap: Keymap,
    /// What the header says about the MCP server; it changes if, say, a public tunnel dies.
    pub mcp: tokio::sync::watch::Receiver<String>,
    pub worker: Option<Arc<Worker>>,
    /// The worker's configuration, to check a new task against (its agent's program, its
    /// model), and the environment the TUI started in.
    pub worker_config: worker::WorkerConfig,
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

enum Msg {
    Ev(Event),
    Reload,
}

/// Restores the terminal however the loop ends, quietly: when the terminal has gone (closed,
/// hung up) every step fails, and `ratatui::restore` would print that on a standard error that
/// is that same dead terminal, where `eprintln!` panics, and the panic would skip the worker's
/// shutdown (its OpenCode server left running).
struct TerminalGuard;

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        use crossterm::{cursor::Show, execute, terminal};
        let _ = terminal::disable_raw_mode();
        let _ = execute!(std::io::stdout(), terminal::LeaveAlternateScreen, Show);
    }
}

/// Runs the TUI until the user quits or `shutdown` is cancelled.
pub async fn run(opts: TuiOptions, shutdown: CancellationToken) -> std::io::Result<()> {
    let mut terminal = ratatui::try_init()?;
    let _guard = TerminalGuard;
    let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();

    let t = tx.clone();
    let reader = crate::outside::Reader::spawn(move |input| {
        let msg = match input {
            crate::outside::Input::Key(k) => Msg::Ev(Event::Key(k)),
            crate::outside::Input::Resize(h) => Msg::Ev(Event::Resize { height: h }),
        };
        t.send(msg).is_ok()
    });
    let t = tx.clone();
    let _watcher = queue::ChangeWatcher::spawn(&opts.store, move || {
        let _ = t.send(Msg::Reload);
    })
    .ok();
    let t = tx.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tick.tick().await;
            if t.send(Msg::Ev(Event::Tick { now: now() })).is_err() {
                break;
            }
        }
    });

    let cwd = opts.cwd.display().to_string();
    let mut model = Model::new(opts.keymap.clone(), cwd);
    model.now = now();
    model.height = terminal.size().map(|s| s.height).unwrap_or(24);
    let header = |mcp: String, running: usize| Header {
        mcp,
        worker_embedded: opts.worker.is_some(),
        worker_running: running,
    };
    model.handle(Event::Header(header(opts.mcp.borrow().clone(), 0)));
    let priorities_applied = Arc::new(AtomicU64::new(0));
    let fx = Effects {
        store: opts.store.clone(),
        home: opts.home.clone(),
        ops: op_lane(
            opts.store.clone(),
            opts.cwd.clone(),
            Arc::new(opts.worker_config.clone()),
            priorities_applied.clone(),
            tx.clone(),
        ),
        priorities_applied,
        tx: tx.clone(),
    };
    fx.reload(model.filter);

    let mut dirty = true;
    let mut ticks = 0u64;
    loop {
        if dirty {
            terminal.draw(|f| crate::view::draw(&model, f))?;
            dirty = false;
        }
        let msg = tokio::select! {
            m = rx.recv() => match m { Some(m) => m, None => break },
            _ = shutdown.cancelled() => break,
        };
        // Drain what has queued up, then draw once.
        let mut batch = vec![msg];
        while let Ok(m) = rx.try_recv() {
            batch.push(m);
        }
        let mut reload = false;
        for msg in batch {
            let effects = match msg {
                Msg::Reload => {
                    reload = true;
                    continue;
                }
                Msg::Ev(Event::Tick { now }) => {
                    ticks += 1;
                    let running = opts.worker.as_ref().map_or(0, |w| w.running());
                    // Compared by value: the sender is dropped once it has said its last word.
                    let label_changed = *opts.mcp.borrow() != model.header.mcp;
                    if running != model.header.worker_running || label_changed {
                        model.handle(Event::Header(header(opts.mcp.borrow().clone(), running)));
                        dirty = true;
                    }
                    // Ages on screen move once a second; nothing else needs a redraw when idle.
                    if ticks.is_multiple_of(4) {
                        dirty = true;
                    }
                    model.handle(Event::Tick { now })
                }
                Msg::Ev(ev) => {
                    dirty = true;
                    model.handle(ev)
                }
            };
            for e in effects {
                match e {
                    Effect::Reload => reload = true,
                    Effect::Quit => {}
                    Effect::Outside(what) => {
                        let env = &opts.worker_config.env;
                        let said =
                            crate::outside::run(&mut terminal, &reader, what, &opts.store, env)
                                .await;
                        model.handle(Event::OpDone(said));
                        dirty = true;
                    }
                    other => fx.run(other),
                }
            }
        }
        if reload {
            fx.reload(model.filter);
        }
        if model.quit {
            break;
        }
    }
    drop(terminal);
    Ok(())
}

/// A task's diff: a live task's from its worktree, against where it started (a stacked task's
/// dependencies' work); a finished one's from its result.
pub(crate) fn diff_of(t: queue::Task) -> String {
    let live = t
        .worktree
        .as_deref()
        .zip(t.branch.as_deref())
        .filter(|(w, _)| !t.status.is_terminal() && std::path::Path::new(w).exists());
    match live {
        Some((wt, branch)) => {
            let from = t.started_from.as_deref().unwrap_or(&t.base);
            let (repo, wt) = (std::path::Path::new(&t.repo), std::path::Path::new(wt));
            worker::diff_against_base(repo, wt, branch, from).map(|d| d.patch).unwrap_or_default()
        }
        None => t.result.map(|r| r.diff).unwrap_or_default(),
    }
}

struct Effects {
    store: Arc<Store>,
    home: Home,
    /// The queue operations the keys asked for, applied one after another in that order.
    ops: mpsc::UnboundedSender<Op>,
    /// How many priority changes the lane has applied (a load says what it was read after).
    priorities_applied: Arc<AtomicU64>,
    tx: mpsc::UnboundedSender<Msg>,
}

/// The lane the queue operations go down, one at a time in the order the keys were pressed:
/// run side by side, two quick `-` could reach the queue as -1 then 0. `cwd` is where the TUI
/// started (the base of a relative repository in the new-task dialog).
fn op_lane(
    store: Arc<Store>,
    cwd: PathBuf,
    cfg: Arc<worker::WorkerConfig>,
    priorities_applied: Arc<AtomicU64>,
    tx: mpsc::UnboundedSender<Msg>,
) -> mpsc::UnboundedSender<Op> {
    let (ops, mut lane) = mpsc::unbounded_channel::<Op>();
    tokio::spawn(async move {
        while let Some(op) = lane.recv().await {
            let (store, cwd, cfg) = (store.clone(), cwd.clone(), cfg.clone());
            let priority = matches!(op, Op::SetPriority(..));
            let ev = tokio::task::spawn_blocking(move || match op {
                Op::Submit { prompt, repo } => {
                    Event::Submitted(submit(&store, &cwd, &cfg, prompt, &repo))
                }
                op => Event::OpDone(apply(&store, &cwd, &cfg, op)),
            })
            .await;
            // Counted once the queue has it (or refused it), before anyone hears it is done.
            if priority {
                priorities_applied.fetch_add(1, Ordering::SeqCst);
            }
            let ev =
                ev.unwrap_or_else(|e| Event::OpDone(Err(format!("the operation failed: {e}"))));
            if tx.send(Msg::Ev(ev)).is_err() {
                break;
            }
        }
    });
    ops
}

impl Effects {
    fn reload(&self, filter: Option<queue::StatusFilter>) {
        let (store, tx) = (self.store.clone(), self.tx.clone());
        let applied = self.priorities_applied.clone();
        tokio::task::spawn_blocking(move || {
            // Read before the rows: every change counted here is in them.
            let priorities_applied = applied.load(Ordering::SeqCst);
            let loaded = store.rows(filter).and_then(|rows| Ok((rows, store.queue_status()?)));
            let ev = match loaded {
                Ok((rows, st)) => Event::Loaded {
                    rows,
                    counts: st.counts,
                    workers: st
                        .workers
                        .into_iter()
                        .filter(|w| !w.stopped && !w.stale)
                        .map(|w| w.host)
                        .collect(),
                    priorities_applied,
                },
                Err(e) => Event::OpDone(Err(format!("reading the queue: {e}"))),
            };
            let _ = tx.send(Msg::Ev(ev));
        });
    }

    fn run(&self, effect: Effect) {
        let (store, home, tx) = (self.store.clone(), self.home.clone(), self.tx.clone());
        let send = move |ev: Event| {
            let _ = tx.send(Msg::Ev(ev));
        };
        match effect {
            // The main loop runs these: they need the terminal.
            Effect::Reload | Effect::Quit | Effect::Outside(_) => {}
            Effect::Bell { .. } => {
                let mut out = std::io::stdout();
                let _ = out.write_all(b"\x07");
                let _ = out.flush();
                // The worker that ran the task sends the desktop notification and the webhook;
                // the TUI rings the terminal, which reaches a person over SSH too.
            }
            Effect::LoadDetail(id) => {
                tokio::task::spawn_blocking(move || {
                    if let Ok(t) = store.get(TaskId(id)) {
                        let overlaps = worker::overlaps(&store, &t)
                            .unwrap_or_default()
                            .iter()
                            .map(|o| {
                                format!(
                                    "#{} ({}) also changes {}",
                                    o.task_id,
                                    o.status,
                                    o.paths.join(", ")
                                )
                            })
                            .collect();
                        send(Event::DetailLoaded(Box::new(t)));
                        send(Event::OverlapsLoaded { id, overlaps });
                    }
                });
            }
            Effect::LoadLog { id, offset } => {
                tokio::task::spawn_blocking(move || {
                    let path = worker::logs::log_path(&home.logs_dir(), id);
                    if let Ok(c) = worker::logs::read_log(&path, offset, LOG_PAGE)
                        && (offset.is_none() || !c.text.is_empty())
                    {
                        send(Event::LogLoaded {
                            id,
                            text: c.text,
                            next_offset: c.next_offset,
                            from_tail: offset.is_none(),
                        });
                    }
                });
            }
            Effect::LoadStats => {
                tokio::task::spawn_blocking(move || {
                    let window = std::time::Duration::from_secs_f64(crate::stats::WINDOW_S);
                    match store.finished_within(window) {
                        Ok(recent) => {
                            send(Event::StatsLoaded(Box::new(crate::stats::Stats::of(&recent))))
                        }
                        Err(e) => send(Event::StatsFailed(e.to_string())),
                    }
                });
            }
            Effect::LoadPlan(id) => {
                tokio::task::spawn_blocking(move || {
                    let lines = plan_lines(&store, TaskId(id));
                    send(Event::PlanLoaded { id, lines });
                });
            }
            Effect::LoadDiff(id) => {
                tokio::task::spawn_blocking(move || {
                    let Ok(t) = store.get(TaskId(id)) else { return };
                    send(Event::DiffLoaded { id, text: diff_of(t) });
                });
            }
            Effect::Queue(op) => {
                if self.ops.send(op).is_err() {
                    send(Event::OpDone(Err("the TUI's queue lane has stopped".into())));
                }
            }
        }
    }
}

/// The tasks connected to `id` by dependencies and follow-ups, as an indented tree from the
/// tasks that depend on nothing: each with its state, spend and merge status.
pub fn plan_lines(store: &Store, id: TaskId) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut tasks: BTreeMap<TaskId, queue::Task> = BTreeMap::new();
    let mut todo = vec![id];
    while let Some(t) = todo.pop() {
        if tasks.contains_key(&t) || tasks.len() >= 200 {
            continue;
        }
        let Ok(task) = store.get(t) else { continue };
        todo.extend(task.depends_on.iter().chain(&task.dependents).chain(&task.followups));
        todo.extend(task.parent);
        tasks.insert(t, task);
    }
    let roots: Vec<TaskId> = tasks
        .values()
        .filter(|t| t.parent.is_none() && t.depends_on.iter().all(|d| !tasks.contains_key(d)))
        .map(|t| t.id)
        .collect();
    let mut out = Vec::new();
    let mut shown = BTreeSet::new();
    fn walk(
        t: TaskId,
        depth: usize,
        how: &str,
        tasks: &std::collections::BTreeMap<TaskId, queue::Task>,
        shown: &mut std::collections::BTreeSet<TaskId>,
        out: &mut Vec<String>,
    ) {
        let Some(task) = tasks.get(&t) else { return };
        let indent = "  ".repeat(depth);
        if !shown.insert(t) {
            out.push(format!("{indent}{how}#{} (above)", t.0));
            return;
        }
        let spend = task
            .result
            .as_ref()
            .and_then(|r| r.usage.cost_usd)
            .map(|c| format!("  {}", queue::usd(c)))
            .unwrap_or_default();
        let merged =
            task.merged_into.as_deref().map(|b| format!("  merged into {b}")).unwrap_or_default();
        out.push(format!(
            "{indent}{how}#{} {:<9} {}{spend}{merged}",
            t.0, task.display_status, task.title
        ));
        for d in &task.dependents {
            walk(*d, depth + 1, "then ", tasks, shown, out);
        }
        for f in &task.followups {
            walk(*f, depth + 1, "follow-up ", tasks, shown, out);
        }
    }
    for r in roots {
        walk(r, 0, "", &tasks, &mut shown, &mut out);
    }
    out
}

/// Performs a queue operation and describes the outcome for the status line.
fn apply(
    store: &Store,
    cwd: &std::path::Path,
    cfg: &worker::WorkerConfig,
    op: Op,
) -> Result<String, String> {
    let e = |e: queue::Error| e.to_string();
    match op {
        Op::Cancel(id) => store
            .cancel(TaskId(id))
            .map(|t| {
                if t.status == queue::TaskStatus::Running {
                    format!("task {id}: cancel requested; its agent is being stopped")
                } else {
                    format!("task {id}: {}", t.status)
                }
            })
            .map_err(e),
        Op::Retry(id) => {
            store.retry(TaskId(id)).map(|_| format!("task {id} queued again")).map_err(e)
        }
        Op::SetPriority(id, p) => {
            store.set_priority(TaskId(id), p).map(|_| format!("task {id}: priority {p}")).map_err(e)
        }
        Op::Answer(id, text) => store
            .answer(TaskId(id), &text, "tui")
            .map(|_| format!("task {id} answered; it resumes its session"))
            .map_err(e),
        Op::Merge(id) => worker::merge_task(store, TaskId(id), None, false)
            .map(|r| {
                format!(
                    "task {id}: merged into {} ({}, {})",
                    r.into,
                    r.how,
                    &r.commit[..12.min(r.commit.len())]
                )
            })
            .map_err(|e| e.to_string()),
        Op::Edit(id, text) => store
            .edit_task(TaskId(id), &text, None)
            .map(|_| format!("task {id}: prompt changed"))
            .map_err(e),
        Op::Followup(id, text) => worker::followup(store, TaskId(id), &text)
            .map(|t| format!("task {}: follows up task {id} in its session", t.id.0))
            .map_err(|e| e.to_string()),
        Op::Note(id, text) => {
            store.add_note(TaskId(id), &text).map(|_| format!("task {id}: note added")).map_err(e)
        }
        Op::Submit { prompt, repo } => submit(store, cwd, cfg, prompt, &repo).map(|(_, m)| m),
    }
}

/// The new task form's submit: the new task's id, and what to tell the person.
fn submit(
    store: &Store,
    cwd: &Path,
    cfg: &worker::WorkerConfig,
    prompt: String,
    repo: &str,
) -> Result<(i64, String), String> {
    // `~/…` as a shell would read it.
    let repo = match (repo.strip_prefix("~/"), cfg.env.home_dir()) {
        (Some(rest), Some(home)) => home.join(rest),
        _ => PathBuf::from(repo),
    };
    worker::submit(store, cwd, cfg, worker::SubmitRequest::new(prompt, repo))
        .map(|(t, _, warnings)| {
            let said = match warnings.first() {
                Some(w) => format!("task {} submitted; {w}", t.id.0),
                None => format!("task {} submitted", t.id.0),
            };
            (t.id.0, said)
        })
        .map_err(|e| e.to_string())
}
