//! Task logs: `<home>/logs/<id>.log` (readable) and `<id>.events.jsonl` (OpenCode's raw event
//! stream), written as events arrive so a tail is live; and reading them back a page at a time,
//! with memory bounded by the page size whatever the file's size.

use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Where a task's log is when this host has none of it: on the host of the worker that ran
/// it (a queue shared by several hosts keeps results in the database, full logs on hosts).
/// `here` is this host's name ([`crate::hostname`]).
pub fn elsewhere(task: &queue::Task, local_size: u64, here: &str) -> Option<String> {
    let host = task.worker_host.as_deref().filter(|h| *h != here && local_size == 0)?;
    Some(format!(
        "the log is on host {host}, in the logs directory of its worker's home (task-{}.log); \
         this host ({here}) has none. The task's result, diff and files are in the queue",
        task.id.0
    ))
}

pub fn log_path(logs_dir: &Path, task_id: i64) -> PathBuf {
    logs_dir.join(format!("{task_id}.log"))
}

pub fn events_path(logs_dir: &Path, task_id: i64) -> PathBuf {
    logs_dir.join(format!("{task_id}.events.jsonl"))
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).mode(0o600).open(path)
}

/// `HH:MM:SS` in UTC, enough to read a log by.
fn clock() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format!("{:02}:{:02}:{:02}", (secs / 3600) % 24, (secs / 60) % 60, secs % 60)
}

/// The two log files of one task. Write failures (a full disk) are reported once in the tracing
/// log and otherwise ignored: losing log lines must not fail the task.
pub struct TaskLog {
    readable: Option<File>,
    raw: Option<File>,
    warned: bool,
}

impl TaskLog {
    pub fn open(logs_dir: &Path, task_id: i64) -> Self {
        let open = |p: PathBuf| match open_append(&p) {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::warn!(path = %p.display(), error = %e, "cannot open task log");
                None
            }
        };
        TaskLog {
            readable: open(log_path(logs_dir, task_id)),
            raw: open(events_path(logs_dir, task_id)),
            warned: false,
        }
    }

    pub fn line(&mut self, text: &str) {
        let stamp = clock();
        let mut buf = String::with_capacity(text.len() + 12);
        for (i, l) in text.lines().enumerate() {
            if i == 0 {
                buf.push_str(&format!("[{stamp}] {l}\n"));
            } else {
                buf.push_str(&format!("           {l}\n"));
            }
        }
        if text.is_empty() {
            buf.push_str(&format!("[{stamp}]\n"));
        }
        let r = self.readable.as_mut().map(|f| f.write_all(buf.as_bytes()));
        self.check(r);
    }

    pub fn raw(&mut self, line: &str) {
        let r = self.raw.as_mut().map(|f| f.write_all(format!("{line}\n").as_bytes()));
        self.check(r);
    }

    fn check(&mut self, r: Option<std::io::Result<()>>) {
        if let Some(Err(e)) = r
            && !self.warned
        {
            self.warned = true;
            tracing::warn!(error = %e, "writing a task log failed; later lines may be missing");
        }
    }
}

/// One page of a log file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogChunk {
    pub text: String,
    /// Where `text` starts in the file.
    pub offset: u64,
    /// Where the next page starts: pass it back as `offset` to follow the log.
    pub next_offset: u64,
    pub size: u64,
    pub eof: bool,
}

/// Reads at most `max_bytes` from `offset`, or the last `max_bytes` when `offset` is `None`.
/// Page edges are moved off the middle of a UTF-8 character so no text is garbled or lost.
pub fn read_log(path: &Path, offset: Option<u64>, max_bytes: usize) -> std::io::Result<LogChunk> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(LogChunk {
                text: String::new(),
                offset: 0,
                next_offset: 0,
                size: 0,
                eof: true,
            });
        }
        Err(e) => return Err(e),
    };
    let size = file.metadata()?.len();
    let max = max_bytes as u64;
    let tail = offset.is_none();
    let start = offset.unwrap_or_else(|| size.saturating_sub(max)).min(size);
    file.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::with_capacity(max_bytes.min((size - start) as usize));
    Read::by_ref(&mut file).take(max).read_to_end(&mut buf)?;
    let mut skip = 0;
    if tail && start > 0 {
        // Starting mid-file: drop continuation bytes of a character cut by the page edge.
        while skip < buf.len() && skip < 3 && (buf[skip] & 0xC0) == 0x80 {
            skip += 1;
        }
    }
    let body = &buf[skip..];
    let mut valid = match std::str::from_utf8(body) {
        Ok(_) => body.len(),
        // An incomplete character at the end is left for the next page; invalid bytes elsewhere
        // are replaced, not dropped.
        Err(e) if e.error_len().is_none() && body.len() - e.valid_up_to() < 4 => e.valid_up_to(),
        Err(_) => body.len(),
    };
    if valid == 0 {
        // A page too small for one character: take it as it is rather than make no progress.
        valid = body.len();
    }
    let text = String::from_utf8_lossy(&body[..valid]).into_owned();
    let next_offset = start + (skip + valid) as u64;
    Ok(LogChunk { text, offset: start + skip as u64, next_offset, size, eof: next_offset >= size })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_cover_the_file_exactly_even_across_multibyte_characters() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("1.log");
        let content = "héllo wörld ✓ ".repeat(500);
        std::fs::write(&p, &content).unwrap();
        let mut offset = 0;
        let mut out = String::new();
        loop {
            let c = read_log(&p, Some(offset), 7).unwrap();
            out.push_str(&c.text);
            assert!(c.next_offset > offset || c.eof);
            offset = c.next_offset;
            if c.eof {
                break;
            }
        }
        assert_eq!(out, content);
        let tail = read_log(&p, None, 10).unwrap();
        assert!(content.ends_with(&tail.text));
        assert_eq!(tail.next_offset, tail.size);
        assert!(tail.eof);
        let missing = read_log(&dir.path().join("none.log"), None, 10).unwrap();
        assert_eq!((missing.size, missing.eof), (0, true));
    }

    #[test]
    fn invalid_utf8_is_replaced_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("2.log");
        std::fs::write(&p, b"ok \xff\xfe bytes\n").unwrap();
        let c = read_log(&p, Some(0), 1024).unwrap();
        assert_eq!(c.text, "ok \u{FFFD}\u{FFFD} bytes\n");
        assert!(c.eof);
    }
}
