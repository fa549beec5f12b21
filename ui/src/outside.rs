//! The TUI stepping aside for a program on the terminal (a shell in a task's worktree, the
//! editor on its diff) and coming back as it was. The keys are read on a thread of their own
//! that can be parked: while the program runs, nothing of the TUI reads the terminal.

use crate::app::Outside;
use crossterm::event::{Event as TermEvent, KeyEvent, KeyEventKind};
use queue::{Store, TaskId};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// What the terminal sends the TUI: a key, or a new height.
pub enum Input {
    Key(KeyEvent),
    Resize(u16),
}

/// The thread that reads the terminal, and the way to park it.
#[derive(Clone)]
pub struct Reader {
    park: Arc<AtomicBool>,
    parked: Arc<AtomicBool>,
}

impl Reader {
    /// Reads keys and resizes into `send` until it returns false (the TUI has gone).
    pub fn spawn(send: impl Fn(Input) -> bool + Send + 'static) -> Reader {
        let reader = Reader { park: Default::default(), parked: Default::default() };
        let r = reader.clone();
        std::thread::spawn(move || {
            loop {
                if r.park.load(Ordering::Acquire) {
                    r.parked.store(true, Ordering::Release);
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                r.parked.store(false, Ordering::Release);
                // A short poll, so that a park is noticed before the next read.
                match crossterm::event::poll(Duration::from_millis(50)) {
                    Ok(false) => continue,
                    Ok(true) => {}
                    Err(_) => break,
                }
                let input = match crossterm::event::read() {
                    Ok(TermEvent::Key(k)) if k.kind != KeyEventKind::Release => Input::Key(k),
                    Ok(TermEvent::Resize(_, h)) => Input::Resize(h),
                    Ok(_) => continue,
                    Err(_) => break,
                };
                if !send(input) {
                    break;
                }
            }
        });
        reader
    }

    /// Stops reading, and returns once the thread is no longer in a read.
    fn park(&self) {
        self.park.store(true, Ordering::Release);
        while !self.parked.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn unpark(&self) {
        self.park.store(false, Ordering::Release);
    }
}

/// Runs what `what` asks on the terminal the TUI leaves for it, then takes the terminal back;
/// what to say on the message line.
pub async fn run(
    terminal: &mut ratatui::DefaultTerminal,
    reader: &Reader,
    what: Outside,
    store: &Arc<Store>,
    env: &queue::Environment,
) -> Result<String, String> {
    let (id, program) = match what {
        Outside::Shell(id) | Outside::EditDiff(id) => (id, prepare(what, store, env).await?),
    };
    reader.park();
    ratatui::restore();
    let (mut cmd, said) = program;
    let status = tokio::task::spawn_blocking(move || cmd.status()).await;
    // Back as it was: the alternate screen, raw mode, and everything drawn anew.
    let back = crossterm::terminal::enable_raw_mode().and_then(|()| {
        crossterm::execute!(std::io::stdout(), crossterm::terminal::EnterAlternateScreen)
    });
    let _ = terminal.clear();
    reader.unpark();
    back.map_err(|e| format!("taking the terminal back: {e}"))?;
    match status {
        Ok(Ok(s)) if s.success() => Ok(said),
        Ok(Ok(s)) => Ok(format!("{said} (it exited with {s})")),
        Ok(Err(e)) => Err(format!("task {id}: could not start it: {e}")),
        Err(e) => Err(format!("task {id}: {e}")),
    }
}

/// The program to run for `what`, and what to say once it ended; or why there is none.
async fn prepare(
    what: Outside,
    store: &Arc<Store>,
    env: &queue::Environment,
) -> Result<(std::process::Command, String), String> {
    let store = store.clone();
    let env = env.clone();
    // The task, and for the editor its diff (git, on a live task): off the async threads.
    let (task, diff) = tokio::task::spawn_blocking(move || {
        let (id, with_diff) = match what {
            Outside::Shell(id) => (id, false),
            Outside::EditDiff(id) => (id, true),
        };
        let task = store.get(TaskId(id)).map_err(|e| e.to_string())?;
        let diff = with_diff.then(|| crate::runtime::diff_of(task.clone()));
        Ok::<_, String>((task, diff.unwrap_or_default()))
    })
    .await
    .map_err(|e| e.to_string())??;
    let id = task.id.0;
    match what {
        Outside::Shell(_) => {
            let dir = task
                .worktree
                .clone()
                .filter(|w| std::path::Path::new(w).is_dir())
                .ok_or_else(|| {
                    format!(
                        "task {id} has no worktree on this machine (not started yet, or removed \
                         when it ended; --keep-worktree keeps one)"
                    )
                })?;
            let shell = env.var("SHELL").filter(|s| !s.trim().is_empty());
            let shell = shell.unwrap_or_else(|| "/bin/sh".to_owned());
            let mut cmd = std::process::Command::new(&shell);
            cmd.current_dir(&dir);
            Ok((cmd, format!("task {id}: back from {shell} in {dir}")))
        }
        Outside::EditDiff(_) => {
            if diff.is_empty() {
                return Err(format!("task {id} has no diff yet"));
            }
            let file = std::env::temp_dir().join(format!("taskbridge-task-{id}.diff"));
            std::fs::write(&file, diff).map_err(|e| format!("writing {}: {e}", file.display()))?;
            let editor = env
                .var("VISUAL")
                .or_else(|| env.var("EDITOR"))
                .filter(|e| !e.trim().is_empty())
                .unwrap_or_else(|| "vi".to_owned());
            // `$EDITOR` may carry arguments: the shell splits it, the file goes as $1.
            let mut cmd = std::process::Command::new("sh");
            cmd.args(["-c", &format!("{editor} \"$1\""), "sh"]).arg(&file);
            Ok((cmd, format!("task {id}: back from {editor} on {}", file.display())))
        }
    }
}
