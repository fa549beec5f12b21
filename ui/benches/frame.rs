//! TUI frame time and log memory.
//!
//!   cargo bench -p taskbridge-ui --bench frame      full run: 1,000 / 100,000 / 1,000,000 tasks, 1 GiB log
//!   cargo test  -p taskbridge-ui --bench frame      small run: a smoke test
//!
//! Each line: `bench=tui.frame tasks=N w=200 h=50 p50_ms=.. p99_ms=..` and
//! `bench=tui.log bytes=.. first_paint_ms=.. rss_delta_mb=..`.
#![allow(clippy::unwrap_used)]

use queue::{TaskId, TaskRow, TaskStatus};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;
use taskbridge_ui::app::{Event, Model};
use taskbridge_ui::keymap::Keymap;

fn rows(n: usize) -> Vec<TaskRow> {
    let statuses = [
        TaskStatus::Queued,
        TaskStatus::Running,
        TaskStatus::Waiting,
        TaskStatus::Done,
        TaskStatus::Failed,
    ];
    (0..n)
        .map(|i| TaskRow {
            id: TaskId((n - i) as i64),
            title: format!("Task number {i}: refactor the module and add tests"),
            status: statuses[i % statuses.len()],
            priority: (i % 7) as i64,
            repo: "/home/me/src/app".into(),
            attempts: 1,
            max_attempts: 2,
            created_at: 1.0e9,
            started_at: Some(1.0e9 + 5.0),
            finished_at: None,
            question: None,
            waiting_on: vec![],
            ask: None,
        })
        .collect()
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn frame_bench(n: usize, frames: usize, log_lines: Option<&[String]>) {
    let mut m = Model::new(Keymap::load(None).unwrap(), "/tmp".into());
    m.now = 1.0e9 + 100.0;
    m.handle(Event::Loaded {
        rows: rows(n),
        counts: BTreeMap::new(),
        workers: vec!["devbox".into()],
        priorities_applied: 0,
    });
    if let Some(lines) = log_lines {
        m.update(taskbridge_ui::action::Action::OpenLogs);
        let id = m.selected_id().unwrap();
        let text = lines.join("\n") + "\n";
        m.handle(Event::LogLoaded { id, text, next_offset: 1 << 30, from_tail: true });
    }
    let mut t = Terminal::new(TestBackend::new(200, 50)).unwrap();
    let mut times = Vec::with_capacity(frames);
    for i in 0..frames {
        // Move the selection so every frame has something new to draw.
        m.update(if i % 2 == 0 {
            taskbridge_ui::action::Action::SelectNext
        } else {
            taskbridge_ui::action::Action::SelectPrev
        });
        let start = Instant::now();
        t.draw(|f| taskbridge_ui::view::draw(&m, f)).unwrap();
        times.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    let (p50, p99) = (pct(&mut times, 0.5), pct(&mut times, 0.99));
    println!(
        "bench=tui.frame tasks={n} log={} w=200 h=50 frames={frames} p50_ms={p50:.3} p99_ms={p99:.3}",
        if log_lines.is_some() { "open" } else { "none" }
    );
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let dir = tempfile::tempdir().unwrap();
    // A big log, written once; the TUI reads only its tail.
    let log_bytes: u64 = if full { 1 << 30 } else { 8 << 20 };
    let path = dir.path().join("1.log");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let line =
            "[12:00:00] tool bash: cargo test --workspace (exit 0) and some more text to fill\n";
        let mut written = 0u64;
        while written < log_bytes {
            f.write_all(line.as_bytes()).unwrap();
            written += line.len() as u64;
        }
    }
    let before = rss_kb();
    let start = Instant::now();
    let chunk = worker::logs::read_log(&path, None, 256 * 1024).unwrap();
    let mut m = Model::new(Keymap::load(None).unwrap(), "/tmp".into());
    m.handle(Event::Loaded {
        rows: rows(1),
        counts: BTreeMap::new(),
        workers: vec!["devbox".into()],
        priorities_applied: 0,
    });
    m.update(taskbridge_ui::action::Action::OpenLogs);
    m.handle(Event::LogLoaded {
        id: 1,
        text: chunk.text,
        next_offset: chunk.next_offset,
        from_tail: true,
    });
    let mut t = Terminal::new(TestBackend::new(200, 50)).unwrap();
    t.draw(|f| taskbridge_ui::view::draw(&m, f)).unwrap();
    let first_paint = start.elapsed().as_secs_f64() * 1000.0;
    let delta_mb = rss_kb().saturating_sub(before) as f64 / 1024.0;
    println!(
        "bench=tui.log bytes={} first_paint_ms={first_paint:.2} rss_delta_mb={delta_mb:.2} lines_kept={}",
        chunk.size,
        m.log.lines.len()
    );
    let tail: Vec<String> = m.log.lines.iter().cloned().collect();

    let sizes: &[usize] = if full { &[1_000, 100_000, 1_000_000] } else { &[1_000, 10_000] };
    let frames = if full { 300 } else { 30 };
    for &n in sizes {
        frame_bench(n, frames, None);
    }
    frame_bench(if full { 100_000 } else { 10_000 }, frames, Some(&tail));
}
