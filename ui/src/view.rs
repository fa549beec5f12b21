//! Drawing: a pure function of the model. Only what is visible is built, so a frame costs the
//! same with ten tasks or a million, and with a short log or a huge one.

mod stats;

use crate::app::{ConfirmKind, Focus, Model, Popup, RightPane, filter_name};
use crate::diff::LineKind;
use crate::keymap::Mode;
use queue::TaskRow;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Clear, Paragraph, Row, Table, Wrap};

pub fn status_color(status: &str) -> Color {
    match status {
        "queued" => Color::Cyan,
        "blocked" => Color::DarkGray,
        "running" => Color::Yellow,
        "waiting" => Color::Magenta,
        "done" => Color::Green,
        "failed" => Color::Red,
        _ => Color::Gray,
    }
}

pub fn human_duration(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// Time since the task was submitted, whatever its state.
fn age(r: &TaskRow, now: f64) -> String {
    human_duration(now - r.created_at)
}

/// How long it has run: so far for a running task, in all for a finished one; blank when it never
/// started.
fn ran(r: &TaskRow, now: f64) -> String {
    match (r.started_at, r.finished_at) {
        (Some(s), Some(f)) => human_duration(f - s),
        (Some(s), None) => human_duration(now - s),
        _ => String::new(),
    }
}

fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

pub fn draw(m: &Model, f: &mut Frame) {
    let area = f.area();
    if area.width < 20 || area.height < 6 {
        f.render_widget(Paragraph::new("TaskBridge: window too small"), area);
        return;
    }
    // The header takes a second line when the MCP address (a public URL, a token file) does not
    // fit beside the counts.
    let header_lines =
        if header_spans(m).iter().map(|s| s.width()).sum::<usize>() > area.width as usize {
            2
        } else {
            1
        };
    let [header, body, footer] = Layout::vertical([
        Constraint::Length(header_lines),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(area);
    draw_header(m, f, header);
    let left_pct = if area.width >= 120 { 50 } else { 60 };
    let [left, right] = Layout::horizontal([
        Constraint::Percentage(left_pct),
        Constraint::Percentage(100 - left_pct),
    ])
    .areas(body);
    draw_queue(m, f, left);
    match m.right {
        RightPane::Detail => draw_detail(m, f, right),
        RightPane::Logs => draw_logs(m, f, right),
        RightPane::Diff => draw_diff(m, f, right),
        RightPane::Questions => draw_questions(m, f, right),
        RightPane::Plan => draw_plan(m, f, right),
    }
    draw_footer(m, f, footer);
    match &m.popup {
        None => {}
        Some(Popup::Help) => draw_help(m, f, area),
        Some(Popup::Stats(s)) => stats::draw_stats(s.as_deref(), f, area),
        Some(Popup::Confirm(kind)) => draw_confirm(*kind, f, area),
        Some(Popup::Editor { area: textarea, .. }) => {
            let r = centered(area, 80, 50);
            f.render_widget(Clear, r);
            f.render_widget(&**textarea, r);
        }
        Some(Popup::NewTask(form)) => draw_new_task(form, f, area),
        Some(Popup::Choose(c)) => draw_choice(m, c, f, area),
    }
}

fn draw_choice(m: &Model, c: &crate::app::Choice, f: &mut Frame, area: Rect) {
    let r = centered(area, 80, 60);
    f.render_widget(Clear, r);
    let key = |a: crate::action::Action| {
        m.keymap.first_key(Mode::Choice, a).unwrap_or_else(|| "?".into())
    };
    use crate::action::Action as A;
    let hint = if c.multiple {
        format!(
            " {} picks, {} sends, {} free text, {} cancels ",
            key(A::ToggleChoice),
            key(A::Send),
            key(A::WriteAnswer),
            key(A::Dismiss)
        )
    } else {
        format!(
            " {} sends, {} free text, {} cancels ",
            key(A::Send),
            key(A::WriteAnswer),
            key(A::Dismiss)
        )
    };
    let title = format!(" Answer task {}: {} ", c.id, c.header.as_deref().unwrap_or("question"));
    let mut lines = vec![Line::raw(c.question.clone()), Line::raw("")];
    for (i, item) in c.items.iter().enumerate() {
        let here = i == c.sel;
        let mark = match (c.multiple, c.picked.contains(&i)) {
            (true, true) => "[x] ",
            (true, false) if item.send.is_some() => "[ ] ",
            _ => "",
        };
        let style = if here { Style::new().fg(Color::Black).bg(Color::Cyan) } else { Style::new() };
        let mut spans = vec![Span::styled(
            format!("{} {mark}{}", if here { ">" } else { " " }, item.label),
            style,
        )];
        if let Some(d) = &item.description {
            spans.push(Span::styled(format!("  {d}"), Style::new().fg(Color::DarkGray)));
        }
        lines.push(Line::from(spans));
    }
    f.render_widget(
        Paragraph::new(lines)
            .block(Block::bordered().title(title).title_bottom(hint))
            .wrap(Wrap { trim: false }),
        r,
    );
}

fn draw_new_task(form: &crate::app::NewTask, f: &mut Frame, area: Rect) {
    use crate::app::NewTaskField;
    let r = centered(area, 80, 60);
    f.render_widget(Clear, r);
    let [repo, recent, prompt] =
        Layout::vertical([Constraint::Length(3), Constraint::Length(1), Constraint::Min(3)])
            .areas(r);
    let focus = |on: bool| {
        if on { Style::new().fg(Color::Cyan) } else { Style::new().fg(Color::DarkGray) }
    };
    let mut repo_area = form.repo.clone();
    let mut prompt_area = form.prompt.clone();
    let on_repo = form.field == NewTaskField::Repo;
    if let Some(b) = repo_area.block().cloned() {
        repo_area.set_block(b.border_style(focus(on_repo)));
    }
    if let Some(b) = prompt_area.block().cloned() {
        prompt_area.set_block(b.border_style(focus(!on_repo)));
    }
    // Only the field being typed in shows a cursor.
    let hidden = Style::new();
    if on_repo {
        prompt_area.set_cursor_style(hidden);
    } else {
        repo_area.set_cursor_style(hidden);
    }
    f.render_widget(&repo_area, repo);
    let others: Vec<&str> = form.recent.iter().map(String::as_str).collect();
    let line = if form.sending {
        "submitting…".to_owned()
    } else {
        format!("recent: {}", others.join("  "))
    };
    f.render_widget(
        Paragraph::new(truncate(&line, recent.width as usize))
            .style(Style::new().fg(Color::DarkGray)),
        recent,
    );
    f.render_widget(&prompt_area, prompt);
}

fn header_spans(m: &Model) -> Vec<Span<'static>> {
    let h = &m.header;
    let c = |k: &str| m.counts.get(k).copied().unwrap_or(0);
    let here = if h.worker_embedded {
        format!("this TUI's worker runs {}", h.worker_running)
    } else {
        "no worker in this TUI".into()
    };
    // Where they run, once they run on more than one host (a queue shared by several).
    let on = if m.worker_hosts.len() < 2 {
        String::new()
    } else {
        format!(" on {}", m.worker_hosts.join(", "))
    };
    let workers = format!(
        "{} worker{} alive{on}",
        m.workers_alive,
        if m.workers_alive == 1 { "" } else { "s" }
    );
    let count = |k: &str, label: &str| {
        Span::styled(format!("{label} {} ", c(k)), Style::new().fg(status_color(k)))
    };
    vec![
        Span::styled(
            " TaskBridge ",
            Style::new().add_modifier(Modifier::BOLD | Modifier::REVERSED),
        ),
        Span::raw(" "),
        count("queued", "queued"),
        count("running", "run"),
        count("waiting", "wait"),
        count("done", "done"),
        count("failed", "fail"),
        Span::raw(format!("│ {workers} ({here}) │ ")),
        // The label says how the server asks for its token (`token in …`).
        Span::raw(format!("MCP {}", h.mcp)),
    ]
}

fn draw_header(m: &Model, f: &mut Frame, area: Rect) {
    let mut spans = header_spans(m);
    if area.height >= 2 {
        // Counts and workers on the first line, the MCP address on its own.
        let mcp = spans.pop().unwrap_or_default();
        let first = Line::from(spans);
        let second = Line::from(vec![Span::raw(" "), mcp]);
        f.render_widget(Paragraph::new(vec![first, second]), area);
    } else {
        f.render_widget(Paragraph::new(Line::from(spans)), area);
    }
}

fn pane_block(title: String, focused: bool) -> Block<'static> {
    let style =
        if focused { Style::new().fg(Color::Cyan) } else { Style::new().fg(Color::DarkGray) };
    Block::bordered().title(title).border_style(style)
}

fn draw_queue(m: &Model, f: &mut Frame, area: Rect) {
    let block = pane_block(
        format!(" Queue ({} shown, filter: {}) ", m.rows.len(), filter_name(m.filter)),
        m.focus == Focus::Queue,
    );
    let inner = block.inner(area);
    f.render_widget(block, area);
    if m.rows.is_empty() {
        let total: i64 = m.counts.values().sum();
        let hint = if m.filter.is_some() && total > 0 {
            format!(
                "No {} tasks ({total} in all). Press {} to change the filter.",
                filter_name(m.filter),
                m.keymap
                    .first_key(Mode::Normal, crate::action::Action::CycleFilter)
                    .unwrap_or_default()
            )
        } else {
            format!(
                "No tasks. Press {} to submit one, or submit from Claude.",
                m.keymap
                    .first_key(Mode::Normal, crate::action::Action::SubmitTask)
                    .unwrap_or_default()
            )
        };
        f.render_widget(
            Paragraph::new(hint).style(Style::new().fg(Color::DarkGray)).wrap(Wrap { trim: true }),
            inner,
        );
        return;
    }
    let visible = inner.height.saturating_sub(1) as usize;
    let offset = if m.selected < visible { 0 } else { m.selected + 1 - visible };
    let wide = inner.width >= 78;
    // What is left for the title once the fixed columns (and their spacing) are laid out.
    let fixed = 5 + 9 + 4 + 5 + 4 + 4 + 6 + if wide { 12 + 9 + 2 } else { 0 };
    let title_width = (inner.width as usize).saturating_sub(fixed).max(10);
    let rows: Vec<Row> = m.rows[offset..(offset + visible).min(m.rows.len())]
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let st = r.display_status();
            let mut cells = vec![
                Cell::from(r.id.0.to_string()),
                Cell::from(st).style(Style::new().fg(status_color(st))),
                Cell::from(r.priority.to_string()),
                Cell::from(format!("{}/{}", r.attempts, r.max_attempts)),
                Cell::from(age(r, m.now)),
                Cell::from(ran(r, m.now)),
                Cell::from(truncate(&r.title, title_width)),
            ];
            if wide {
                let repo = std::path::Path::new(&r.repo)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                cells.push(Cell::from(repo));
                let waits = if r.waiting_on.is_empty() {
                    String::new()
                } else {
                    format!(
                        "after {}",
                        r.waiting_on.iter().map(|t| t.0.to_string()).collect::<Vec<_>>().join(",")
                    )
                };
                cells.push(Cell::from(waits));
            }
            let mut row = Row::new(cells);
            if offset + i == m.selected {
                let style =
                    if m.focus == Focus::Queue { Modifier::REVERSED } else { Modifier::UNDERLINED };
                row = row.style(Style::new().add_modifier(style));
            }
            row
        })
        .collect();
    let mut widths = vec![
        Constraint::Length(5),
        Constraint::Length(9),
        Constraint::Length(4),
        Constraint::Length(5),
        Constraint::Length(4),
        Constraint::Length(4),
        Constraint::Min(10),
    ];
    let mut header = vec!["ID", "STATE", "PRI", "TRY", "AGE", "RAN", "TITLE"];
    if wide {
        widths.extend([Constraint::Length(12), Constraint::Length(9)]);
        header.extend(["REPO", "WAITS"]);
    }
    let table = Table::new(rows, widths)
        .header(Row::new(header).style(Style::new().add_modifier(Modifier::BOLD)))
        .column_spacing(1);
    f.render_widget(table, inner);
}

/// `text` after `tag`, a line of its own for each of its lines (a question's options below it):
/// one ratatui line shows a newline as nothing, running them together.
fn tagged(tag: &str, text: &str) -> Vec<Line<'static>> {
    if text.is_empty() {
        return vec![Line::from(tag.trim_end().to_owned())];
    }
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            let lead = if i == 0 { tag } else { "   " };
            Line::from(format!("{lead}{l}"))
        })
        .collect()
}

fn section(lines: &mut Vec<Line<'static>>, title: &str) {
    lines.push(Line::from(""));
    lines.push(Line::styled(title.to_owned(), Style::new().add_modifier(Modifier::BOLD)));
}

fn draw_detail(m: &Model, f: &mut Frame, area: Rect) {
    let focused = m.focus == Focus::Right;
    let Some(t) = m.detail.as_ref().filter(|t| Some(t.id.0) == m.selected_id()) else {
        f.render_widget(Paragraph::new("").block(pane_block(" Detail ".into(), focused)), area);
        return;
    };
    let mut lines: Vec<Line<'static>> = Vec::new();
    let st = t.display_status.clone();
    lines.push(Line::from(vec![
        Span::styled(format!("#{} ", t.id.0), Style::new().add_modifier(Modifier::BOLD)),
        Span::styled(st.clone(), Style::new().fg(status_color(&st))),
        Span::raw(format!("  priority {}  attempt {}/{}", t.priority, t.attempts, t.max_attempts)),
    ]));
    lines.push(Line::from(format!("repo {} @ {}", t.repo, &t.base[..t.base.len().min(10)])));
    if let Some(b) = &t.branch {
        lines.push(Line::from(format!("branch {b}")));
    }
    if let Some(h) = &t.worker_host {
        let by = t.worker.as_deref().map(|w| format!(" (worker {w})")).unwrap_or_default();
        lines.push(Line::from(format!("host {h}{by}")));
    }
    let ids =
        |v: &[queue::TaskId]| v.iter().map(|i| format!("#{}", i.0)).collect::<Vec<_>>().join(", ");
    if !t.stacked_on.is_empty() {
        lines.push(Line::from(format!("builds on {}", ids(&t.stacked_on))));
    }
    if let Some(p) = t.parent {
        lines.push(Line::from(format!("follows up #{} (its session)", p.0)));
    }
    if !t.dependents.is_empty() {
        lines.push(Line::from(format!("needed by {}", ids(&t.dependents))));
    }
    if !t.followups.is_empty() {
        lines.push(Line::from(format!("follow-ups {}", ids(&t.followups))));
    }
    if let Some(into) = &t.merged_into {
        lines.push(Line::styled(format!("merged into {into}"), Style::new().fg(Color::Green)));
    }
    if m.overlaps.0 == Some(t.id.0) && !m.overlaps.1.is_empty() {
        section(&mut lines, "Overlaps (other unmerged work on the same paths)");
        for o in &m.overlaps.1 {
            lines.push(Line::styled(o.clone(), Style::new().fg(Color::Yellow)));
        }
    }
    if let Some(model) = &t.model {
        lines.push(Line::from(format!("model {model}")));
    }
    if let Some(agent) = &t.agent {
        lines.push(Line::from(format!("agent {agent}")));
    }
    if let Some(q) = &t.question {
        section(&mut lines, "Question (press a to answer)");
        for l in q.lines() {
            lines.push(Line::styled(l.to_owned(), Style::new().fg(Color::Magenta)));
        }
        // The options with what each means, as the answer dialog shows them.
        lines.extend(option_lines(t.ask.as_ref(), "  "));
    }
    for (i, q) in t.questions.iter().enumerate().filter(|(_, q)| q.answer.is_some()) {
        section(&mut lines, &format!("Q&A {}", i + 1));
        lines.extend(tagged("Q: ", &q.question));
        lines.extend(tagged("A: ", q.answer.as_deref().unwrap_or("")));
    }
    if let Some(e) = &t.error {
        // A task that is running again after a failed attempt still carries that attempt's
        // error; it is history, not the task's state.
        let title = if t.status.is_terminal() { "Error" } else { "Previous attempt failed" };
        section(&mut lines, title);
        lines.push(Line::styled(e.clone(), Style::new().fg(Color::Red)));
    }
    if let Some(r) = &t.result {
        if !r.summary.is_empty() {
            section(&mut lines, "Summary");
            lines.extend(r.summary.lines().map(|l| Line::from(l.to_owned())));
        }
        match (&r.commit, r.no_changes) {
            (Some(c), _) => lines.push(Line::from(format!("commit {}", &c[..c.len().min(12)]))),
            (None, true) => lines.push(Line::styled(
                "no changes: the agent said it was done without changing a file",
                Style::new().fg(Color::Yellow),
            )),
            _ => {}
        }
        if !r.files_touched.is_empty() {
            section(&mut lines, "Files touched");
            for fl in &r.files_touched {
                lines.push(Line::from(format!("{:<9} {}", fl.status, fl.path)));
            }
        }
        if !r.tests_run.is_empty() {
            section(&mut lines, "Tests run");
            for tr in &r.tests_run {
                let (text, color) = match (tr.observed, tr.exit_code) {
                    (true, Some(0)) => ("exit 0".to_owned(), Color::Green),
                    (true, Some(c)) => (format!("exit {c}"), Color::Red),
                    (true, None) => ("no exit code".to_owned(), Color::Yellow),
                    (false, _) => ("claimed, not observed".to_owned(), Color::Yellow),
                };
                lines.push(Line::from(vec![
                    Span::raw(format!("{}  ", tr.command)),
                    Span::styled(text, Style::new().fg(color)),
                ]));
            }
        }
        let u = &r.usage;
        section(&mut lines, "Usage");
        let cost = match u.cost_usd {
            Some(c) => queue::usd(c),
            None => "cost not reported by the agent".into(),
        };
        lines.push(Line::from(format!(
            "{} in, {} out, {} reasoning, {} cache read, {} cache write; {cost}",
            u.input_tokens,
            u.output_tokens,
            u.reasoning_tokens,
            u.cache_read_tokens,
            u.cache_write_tokens,
        )));
        if r.permissions.iter().any(|p| p.enabled) {
            section(&mut lines, "Permissions");
            for p in r.permissions.iter().filter(|p| p.enabled) {
                lines.push(Line::from(format!("{} [{}]: {}", p.flag, p.enforcement, p.how)));
            }
        }
        if !r.reverted_files.is_empty() {
            lines.push(Line::from(format!("reverted: {}", r.reverted_files.join(", "))));
        }
    }
    if !t.notes.is_empty() {
        section(&mut lines, "Notes");
        for n in &t.notes {
            lines.push(Line::from(format!("- {}{}", n.note, n.marker())));
        }
    }
    section(&mut lines, "Prompt");
    lines.extend(t.prompt.lines().take(200).map(|l| Line::from(l.to_owned())));
    let p = Paragraph::new(lines)
        .block(pane_block(format!(" Detail: {} ", truncate(&t.title, 40)), focused))
        .wrap(Wrap { trim: false })
        .scroll((m.detail_scroll.min(u16::MAX as usize) as u16, 0));
    f.render_widget(p, area);
}

fn draw_logs(m: &Model, f: &mut Frame, area: Rect) {
    let log = &m.log;
    let title = format!(
        " Log{} {}{} ",
        log.id.map(|i| format!(" #{i}")).unwrap_or_default(),
        if log.follow { "(following)" } else { "(scrolled; F follows)" },
        log.search.as_ref().map(|s| format!(" /{s}")).unwrap_or_default()
    );
    let block = pane_block(title, m.focus == Focus::Right);
    let inner = block.inner(area);
    f.render_widget(block, area);
    let h = inner.height as usize;
    let n = log.lines.len();
    // Scrolled to the top, the first page is still a full page.
    let end = n.saturating_sub(log.scroll).max(h.min(n));
    let start = end.saturating_sub(h);
    let lines: Vec<Line> = (start..end)
        .map(|i| {
            let text = &log.lines[i];
            let shown = truncate(text, inner.width as usize * 4);
            match &log.search {
                Some(s) if !s.is_empty() && shown.contains(s.as_str()) => highlight(&shown, s),
                _ => Line::from(shown),
            }
        })
        .collect();
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}

fn highlight(text: &str, needle: &str) -> Line<'static> {
    let mut spans = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(needle) {
        spans.push(Span::raw(rest[..i].to_owned()));
        spans.push(Span::styled(needle.to_owned(), Style::new().add_modifier(Modifier::REVERSED)));
        rest = &rest[i + needle.len()..];
    }
    spans.push(Span::raw(rest.to_owned()));
    Line::from(spans)
}

pub fn diff_style(kind: LineKind) -> Style {
    match kind {
        LineKind::FileHeader => Style::new().fg(Color::White).add_modifier(Modifier::BOLD),
        LineKind::Hunk => Style::new().fg(Color::Cyan),
        LineKind::Added => Style::new().fg(Color::Green),
        LineKind::Removed => Style::new().fg(Color::Red),
        LineKind::Context => Style::new(),
    }
}

fn draw_diff(m: &Model, f: &mut Frame, area: Rect) {
    let d = &m.diff;
    let finished =
        m.rows.iter().find(|r| Some(r.id.0) == d.id).is_some_and(|r| r.status.is_terminal());
    let title = match d.id {
        Some(id) if d.lines.is_empty() && finished => format!(" Diff #{id}: no changes "),
        Some(id) if d.lines.is_empty() => format!(" Diff #{id}: no changes yet "),
        Some(id) => format!(" Diff #{id} ({} lines) ", d.lines.len()),
        None => " Diff ".into(),
    };
    let block = pane_block(title, m.focus == Focus::Right);
    let inner = block.inner(area);
    f.render_widget(block, area);
    let h = inner.height as usize;
    let lines: Vec<Line> = d
        .lines
        .iter()
        .skip(d.scroll)
        .take(h)
        .map(|l| {
            let style = diff_style(l.kind);
            match l.emph {
                Some((a, b))
                    if b <= l.text.len()
                        && l.text.is_char_boundary(a)
                        && l.text.is_char_boundary(b) =>
                {
                    Line::from(vec![
                        Span::styled(l.text[..a].to_owned(), style),
                        Span::styled(
                            l.text[a..b].to_owned(),
                            style.add_modifier(Modifier::REVERSED | Modifier::BOLD),
                        ),
                        Span::styled(l.text[b..].to_owned(), style),
                    ])
                }
                _ => Line::styled(l.text.clone(), style),
            }
        })
        .collect();
    f.render_widget(Paragraph::new(lines), inner);
}

fn draw_plan(m: &Model, f: &mut Frame, area: Rect) {
    let block = pane_block(" Plan: dependencies and follow-ups ".into(), m.focus == Focus::Right);
    let here = m.selected_id();
    let lines: Vec<Line> = match (m.plan.0, here) {
        (Some(id), Some(sel)) if id == sel => m
            .plan
            .1
            .iter()
            .map(|l| {
                let mine =
                    l.trim_start().trim_start_matches("then ").trim_start_matches("follow-up ");
                let style = if mine.starts_with(&format!("#{sel} ")) {
                    Style::new().add_modifier(Modifier::BOLD)
                } else {
                    Style::new()
                };
                let state = l.split_whitespace().find(|w| {
                    ["queued", "blocked", "running", "waiting", "done", "failed", "cancelled"]
                        .contains(w)
                });
                let color = state.map(status_color).unwrap_or(Color::Reset);
                Line::styled(l.clone(), style.fg(color))
            })
            .collect(),
        _ => vec![Line::from("")],
    };
    f.render_widget(Paragraph::new(lines).block(block).scroll((m.detail_scroll as u16, 0)), area);
}

/// A question's options, one line each with what it means, behind `indent`.
fn option_lines(ask: Option<&queue::Ask>, indent: &str) -> Vec<Line<'static>> {
    let options = ask.into_iter().flat_map(|a| &a.questions).flat_map(|q| &q.options);
    options
        .map(|o| {
            let d = o.description.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
            Line::styled(format!("{indent}- {}{d}", o.label), Style::new().fg(Color::DarkGray))
        })
        .collect()
}

fn draw_questions(m: &Model, f: &mut Frame, area: Rect) {
    let waiting = m.waiting();
    let block =
        pane_block(format!(" Questions ({} waiting) ", waiting.len()), m.focus == Focus::Right);
    if waiting.is_empty() {
        f.render_widget(Paragraph::new("No task is waiting for an answer.").block(block), area);
        return;
    }
    let mut lines = Vec::new();
    for (i, r) in waiting.iter().enumerate() {
        let sel = i == m.question_sel;
        let style = if sel { Style::new().add_modifier(Modifier::REVERSED) } else { Style::new() };
        lines.push(Line::styled(
            format!("#{} {}", r.id.0, r.title),
            style.add_modifier(Modifier::BOLD),
        ));
        let kind = match r.ask.as_ref().map(|a| a.kind) {
            Some(queue::AskKind::Permission) => "permission: ",
            Some(queue::AskKind::Budget) => "budget: ",
            _ => "",
        };
        for (j, l) in r.question.as_deref().unwrap_or("").lines().enumerate() {
            let kind = if j == 0 { kind } else { "" };
            lines.push(Line::styled(format!("  {kind}{l}"), Style::new().fg(Color::Magenta)));
        }
        lines.extend(option_lines(r.ask.as_deref(), "    "));
        lines.push(Line::from(""));
    }
    let key = m
        .keymap
        .first_key(Mode::Normal, crate::action::Action::AnswerTask)
        .unwrap_or_else(|| "?".into());
    lines.push(Line::styled(
        format!("{key} answers the highlighted question (pick an option, or write your own)"),
        Style::new().fg(Color::DarkGray),
    ));
    f.render_widget(Paragraph::new(lines).block(block).wrap(Wrap { trim: false }), area);
}

fn draw_footer(m: &Model, f: &mut Frame, area: Rect) {
    if let Some(msg) = &m.message {
        let style = if msg.starts_with("error") {
            Style::new().fg(Color::Red)
        } else {
            Style::new().fg(Color::Yellow)
        };
        f.render_widget(Paragraph::new(msg.clone()).style(style), area);
        return;
    }
    use crate::action::Action::*;
    let hint = |a: &crate::action::Action| {
        m.keymap.first_key(Mode::Normal, *a).map(|k| format!("{k} {}", a.hint()))
    };
    // Help and quit always show; the others fill what width is left, in order.
    let always: Vec<String> = [ToggleHelp, Quit].iter().filter_map(hint).collect();
    let always = always.join("  ");
    let budget = (area.width as usize).saturating_sub(always.chars().count() + 2);
    let mut shown = String::new();
    for h in [
        FocusNext,
        OpenDetail,
        OpenLogs,
        OpenDiff,
        AnswerTask,
        SubmitTask,
        CancelTask,
        RetryTask,
        AddTaskNote,
        CycleFilter,
    ]
    .iter()
    .filter_map(hint)
    {
        if shown.chars().count() + h.chars().count() + 2 > budget {
            break;
        }
        shown.push_str(&h);
        shown.push_str("  ");
    }
    shown.push_str(&always);
    f.render_widget(Paragraph::new(shown).style(Style::new().fg(Color::DarkGray)), area);
}

fn draw_help(m: &Model, f: &mut Frame, area: Rect) {
    let r = centered(area, 90, 90);
    f.render_widget(Clear, r);
    let block = Block::bordered().title(" Help: keys from the keymap (? or Esc closes) ");
    let inner = block.inner(r);
    f.render_widget(block, r);
    let entry = |keys: &[String], action: crate::action::Action| {
        Line::from(vec![
            Span::styled(format!("{:<11}", keys.join(" ")), Style::new().fg(Color::Cyan)),
            Span::raw(action.describe()),
        ])
    };
    // Every section in one list, split over two columns.
    let mut all: Vec<Line> =
        m.keymap.keys_for(Mode::Normal).iter().map(|(a, k)| entry(k, *a)).collect();
    for (mode, title) in [
        (Mode::Editor, "In an editor"),
        (Mode::Choice, "Picking an answer"),
        (Mode::Confirm, "When asked"),
    ] {
        all.push(Line::styled(title, Style::new().add_modifier(Modifier::BOLD)));
        all.extend(m.keymap.keys_for(mode).iter().map(|(a, k)| entry(k, *a)));
    }
    let half = all.len().div_ceil(2);
    let right = all.split_off(half);
    let [l, rr] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(inner);
    f.render_widget(Paragraph::new(all), l);
    f.render_widget(Paragraph::new(right), rr);
}

fn draw_confirm(kind: ConfirmKind, f: &mut Frame, area: Rect) {
    let text = match kind {
        ConfirmKind::Merge(id) => format!(
            "Merge task {id} into the branch it was submitted from? A fast-forward when it can, \
             else a merge commit; a dirty checkout or a conflict changes nothing.\n\ny: merge   n: no"
        ),
        ConfirmKind::Cancel(id) => format!(
            "Cancel task {id}? Its agent is stopped and its worktree kept.\n\ny: yes   n: no"
        ),
        ConfirmKind::Quit { running } => format!(
            "{running} task(s) are running in this TUI's worker. Quit? They go back to the queue \
             and resume when a worker runs again.\n\ny: quit   n: stay"
        ),
    };
    let r = centered(area, 60, 30);
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(text).block(Block::bordered().title(" Confirm ")).wrap(Wrap { trim: true }),
        r,
    );
}

fn centered(area: Rect, pct_w: u16, pct_h: u16) -> Rect {
    let w = (area.width * pct_w / 100).max(20.min(area.width));
    let h = (area.height * pct_h / 100).max(5.min(area.height));
    Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    }
}
