//! The verbs a user of pueue reaches for first: `wait` for tasks with an exit code by how they
//! ended, `edit` a queued task's prompt, `pause` and `resume` the queue, and shell
//! `completions`.

use crate::Ctx;
use anyhow::Context;
use queue::{Store, Task, TaskId, TaskStatus};
use std::process::ExitCode;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// `wait`'s exit codes beyond 0 (every task done), documented in its help.
pub const WAIT_FAILED: u8 = 3;
pub const WAIT_ASKS: u8 = 4;
pub const WAIT_TIMED_OUT: u8 = 124;

/// How a waited-for task stands.
fn settled(t: &Task) -> bool {
    t.status.is_terminal() || t.status == TaskStatus::Waiting
}

/// `wait ID…`: until every task is done, failed or cancelled, or waits for an answer; one line
/// per task, and the exit code says how they ended (0 all done, 3 one failed or was cancelled,
/// 4 one waits for an answer, 124 the timeout passed first).
pub fn wait(store: &Arc<Store>, ids: &[i64], timeout: Option<u64>) -> anyhow::Result<ExitCode> {
    // Every id first, so a typo is said at once rather than after the others finished.
    for &id in ids {
        store.get(TaskId(id))?;
    }
    let changed = Arc::new((Mutex::new(0u64), Condvar::new()));
    let signal = changed.clone();
    store.on_change(move || {
        let (n, cv) = &*signal;
        if let Ok(mut n) = n.lock() {
            *n += 1;
        }
        cv.notify_all();
    });
    let deadline = timeout.map(|s| Instant::now() + Duration::from_secs(s));
    let tasks = loop {
        let seen = changed.0.lock().map(|n| *n).unwrap_or_default();
        let tasks: Vec<Task> =
            ids.iter().map(|&id| store.get(TaskId(id))).collect::<Result<_, _>>()?;
        if tasks.iter().all(settled) {
            break tasks;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            for t in tasks.iter().filter(|t| !settled(t)) {
                outln!(
                    "task {}: still {} after {}s",
                    t.id.0,
                    t.display_status,
                    timeout.unwrap_or(0)
                );
            }
            return Ok(ExitCode::from(WAIT_TIMED_OUT));
        }
        // Woken by a commit of any process; a second at most, should a change go unseen.
        let (n, cv) = &*changed;
        let guard = n.lock().map_err(|_| anyhow::anyhow!("waiting: a lock was poisoned"))?;
        if *guard == seen {
            let _ = cv.wait_timeout(guard, Duration::from_secs(1));
        }
    };
    let (mut failed, mut asks) = (false, false);
    for t in &tasks {
        let line = match t.status {
            TaskStatus::Done => "done".to_owned(),
            TaskStatus::Waiting => {
                asks = true;
                let q = t.question.as_deref().unwrap_or("a decision");
                format!(
                    "waiting: {} (`taskbridge answer {} …`)",
                    q.lines().next().unwrap_or(q),
                    t.id.0
                )
            }
            s => {
                failed = true;
                match &t.error {
                    Some(e) => format!("{s}: {e}"),
                    None => s.to_string(),
                }
            }
        };
        outln!("task {}: {line}", t.id.0);
    }
    // A failure outranks a question: it is what a script must see first.
    Ok(ExitCode::from(match (failed, asks) {
        (true, _) => WAIT_FAILED,
        (false, true) => WAIT_ASKS,
        (false, false) => 0,
    }))
}

/// `edit ID [PROMPT]`: a queued task's new prompt, from the argument (`-`: stdin) or, with
/// none, from `$VISUAL`/`$EDITOR` opened on the current one.
pub fn edit(
    ctx: &Ctx,
    id: i64,
    prompt: Option<String>,
    title: Option<String>,
) -> anyhow::Result<()> {
    let store = &ctx.store;
    let task = store.get(TaskId(id))?;
    let prompt = match prompt {
        Some(p) => crate::commands::read_arg(&p, "prompt")?,
        None => {
            if task.status != TaskStatus::Queued || task.attempts > 0 {
                // Said before the editor opens, not after the user typed a new prompt.
                store.edit_task(TaskId(id), &task.prompt, None)?;
            }
            edit_in_editor(ctx, &task.prompt)?
        }
    };
    if prompt == task.prompt && title.is_none() {
        outln!("task {id}: prompt unchanged");
        return Ok(());
    }
    let t = store.edit_task(TaskId(id), &prompt, title.as_deref())?;
    outln!("task {id}: prompt changed ({} bytes); title: {}", t.prompt.len(), t.title);
    Ok(())
}

/// `text` in the user's editor, as saved; an editor that fails or is missing is an error that
/// names it.
fn edit_in_editor(ctx: &Ctx, text: &str) -> anyhow::Result<String> {
    let editor = ctx
        .env
        .var("VISUAL")
        .or_else(|| ctx.env.var("EDITOR"))
        .filter(|e| !e.trim().is_empty())
        .unwrap_or_else(|| "vi".to_owned());
    let file = tempfile::Builder::new()
        .prefix("taskbridge-prompt-")
        .suffix(".md")
        .tempfile()
        .context("making a file for the editor")?;
    std::fs::write(file.path(), text).context("writing the prompt for the editor")?;
    // `$EDITOR` may carry arguments (`code --wait`): the shell splits it, the file goes as $1.
    let status = std::process::Command::new("sh")
        .args(["-c", &format!("{editor} \"$1\""), "sh"])
        .arg(file.path())
        .status()
        .with_context(|| format!("starting the editor `{editor}`"))?;
    if !status.success() {
        anyhow::bail!(
            "the editor `{editor}` exited with {status}; the prompt is unchanged (set $EDITOR, \
             or give the new prompt as an argument: `taskbridge edit ID \"…\"`)"
        );
    }
    let edited = std::fs::read_to_string(file.path()).context("reading the edited prompt")?;
    Ok(edited.trim_end_matches(['\n', '\r']).to_owned())
}

/// `pause` / `resume`: workers finish what runs and claim nothing new until the queue resumes.
pub fn pause(store: &Store, pause: bool) -> anyhow::Result<()> {
    if pause {
        let running = store.queue_status()?.counts.get("running").copied().unwrap_or(0);
        let changed = store.pause_queue()?;
        outln!(
            "{}; {running} running task(s) go on; `taskbridge resume` lets workers claim again",
            if changed { "queue paused" } else { "the queue was already paused" }
        );
    } else {
        let changed = store.resume_queue()?;
        outln!("{}", if changed { "queue resumed" } else { "the queue was not paused" });
    }
    Ok(())
}

/// `completions SHELL`: the completion script for bash, zsh or fish, on stdout.
pub fn completions(shell: clap_complete::Shell) {
    let mut cmd = <crate::cli::Cli as clap::CommandFactory>::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "taskbridge", &mut out);
    crate::output::write_raw(&String::from_utf8_lossy(&out));
}
