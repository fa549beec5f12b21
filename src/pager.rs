//! `taskbridge diff`: a diff coloured as git colours it, and paged as git pages it, when a person
//! reads it on a terminal; plain text into a pipe or a file.

use std::ffi::OsStr;
use std::io::{IsTerminal, Write};
use std::process::{Command, Stdio};

const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const CYAN: &str = "\x1b[36m";
const BOLD: &str = "\x1b[1m";
const RESET: &str = "\x1b[0m";

/// `diff` with ANSI colours: file headers bold, hunk headers cyan, removals red, additions green.
pub fn colour(diff: &str) -> String {
    let mut out = String::with_capacity(diff.len() + diff.len() / 4);
    for line in diff.split_inclusive('\n') {
        let (text, nl) = match line.strip_suffix('\n') {
            Some(t) => (t, "\n"),
            None => (line, ""),
        };
        let paint = if text.starts_with("diff --git")
            || text.starts_with("+++ ")
            || text.starts_with("--- ")
            || text.starts_with("index ")
        {
            BOLD
        } else if text.starts_with("@@") {
            CYAN
        } else if text.starts_with('+') {
            GREEN
        } else if text.starts_with('-') {
            RED
        } else {
            ""
        };
        if paint.is_empty() {
            out.push_str(line);
        } else {
            out.push_str(&format!("{paint}{text}{RESET}{nl}"));
        }
    }
    out
}

/// Prints `diff`: `color` is auto (colour and the pager on a terminal), always or never.
pub fn show_diff(diff: &str, color: &str, env: &queue::Environment) -> anyhow::Result<()> {
    let terminal = std::io::stdout().is_terminal();
    let coloured = match color {
        "always" => true,
        "never" => false,
        _ => terminal,
    };
    // A diff shows files an agent wrote: their bytes must not drive the terminal either.
    let diff = crate::output::escape_controls(diff);
    let text = if coloured { colour(&diff) } else { diff.into_owned() };
    if terminal && let Some(mut pager) = spawn_pager(env) {
        if let Some(mut stdin) = pager.stdin.take() {
            // The reader quitting the pager early closes the pipe: not an error.
            let _ = stdin.write_all(text.as_bytes());
        }
        let _ = pager.wait();
        return Ok(());
    }
    crate::output::write_raw(&text);
    Ok(())
}

/// The pager git would use: `$PAGER` (run by the shell, as git runs it), else `less -R`
/// (raw colours, quit when it fits one screen); none when `PAGER` is empty or `cat`.
fn spawn_pager(env: &queue::Environment) -> Option<std::process::Child> {
    // Set but empty is "no pager", unlike unset.
    let pager = match env.is_set("PAGER") {
        true => env.var("PAGER").unwrap_or_default(),
        false => "less".into(),
    };
    if pager.trim().is_empty() || pager.trim() == "cat" {
        return None;
    }
    Command::new("sh")
        .args(["-c", &pager])
        .env("LESS", env.var_os("LESS").map_or_else(|| "FRX".into(), OsStr::to_owned))
        .stdin(Stdio::piped())
        .spawn()
        .ok()
}
