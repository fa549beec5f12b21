//! The TUI without a terminal: every key action on a model through the real keymap, and the main
//! screens drawn into ratatui's `TestBackend` (insta snapshots, plus cell-style checks).
#![allow(clippy::unwrap_used)]

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use queue::{TaskId, TaskRow, TaskStatus};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::style::{Color, Modifier};
use std::collections::BTreeMap;
use taskbridge_ui::app::{ConfirmKind, Effect, Event, Focus, Header, Model, Op, Popup, RightPane};
use taskbridge_ui::keymap::Keymap;

const NOW: f64 = 1_800_000_000.0;

fn row(id: i64, status: TaskStatus, title: &str) -> TaskRow {
    TaskRow {
        id: TaskId(id),
        title: title.into(),
        status,
        priority: 0,
        repo: "/home/me/src/app".into(),
        attempts: if status == TaskStatus::Queued { 0 } else { 1 },
        max_attempts: 2,
        created_at: NOW - 600.0,
        started_at: (status != TaskStatus::Queued).then_some(NOW - 125.0),
        finished_at: status.is_terminal().then_some(NOW - 5.0),
        question: (status == TaskStatus::Waiting)
            .then(|| "Postgres or SQLite for the cache?".to_owned()),
        waiting_on: vec![],
        ask: None,
    }
}

fn model(rows: Vec<TaskRow>) -> Model {
    let mut m = Model::new(Keymap::load(None).unwrap(), "/home/me/src/app".into());
    m.now = NOW;
    m.handle(Event::Header(Header {
        mcp: "http://127.0.0.1:8765/mcp".into(),
        worker_embedded: true,
        worker_running: 1,
    }));
    let mut counts = BTreeMap::new();
    for r in &rows {
        *counts.entry(r.display_status().to_owned()).or_insert(0) += 1;
    }
    m.handle(Event::Loaded { rows, counts, workers: vec!["devbox".into()], priorities_applied: 0 });
    m
}

fn busy() -> Model {
    let mut blocked = row(5, TaskStatus::Queued, "Write the migration guide");
    blocked.waiting_on = vec![TaskId(4)];
    blocked.priority = 5;
    model(vec![
        blocked,
        row(4, TaskStatus::Running, "Add a cache layer to the API"),
        row(3, TaskStatus::Waiting, "Choose the cache backend"),
        row(2, TaskStatus::Done, "Fix the flaky login test"),
        row(1, TaskStatus::Failed, "Upgrade the web framework"),
    ])
}

fn key(m: &mut Model, c: KeyCode) -> Vec<Effect> {
    m.handle(Event::Key(KeyEvent::new(c, KeyModifiers::NONE)))
}

fn ch(m: &mut Model, c: char) -> Vec<Effect> {
    let mods = if c.is_ascii_uppercase() { KeyModifiers::SHIFT } else { KeyModifiers::NONE };
    m.handle(Event::Key(KeyEvent::new(KeyCode::Char(c), mods)))
}

fn ctrl(m: &mut Model, c: char) -> Vec<Effect> {
    m.handle(Event::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL)))
}

fn typed(m: &mut Model, text: &str) {
    for c in text.chars() {
        ch(m, c);
    }
}

fn render(m: &Model, w: u16, h: u16) -> Terminal<TestBackend> {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| taskbridge_ui::view::draw(m, f)).unwrap();
    t
}

// ---- state: each key action through the real keymap ----------------------------------------

#[test]
fn moving_and_switching_panes() {
    let mut m = busy();
    assert_eq!(m.selected_id(), Some(5));
    assert_eq!(ch(&mut m, 'j'), vec![Effect::LoadDetail(4)]);
    key(&mut m, KeyCode::Down);
    assert_eq!(m.selected_id(), Some(3));
    ch(&mut m, 'k');
    assert_eq!(m.selected_id(), Some(4));
    ch(&mut m, 'G');
    assert_eq!(m.selected_id(), Some(1));
    ch(&mut m, 'g');
    assert_eq!(m.selected_id(), Some(5));
    assert_eq!(ch(&mut m, 'l'), vec![Effect::LoadLog { id: 5, offset: None }]);
    assert_eq!((m.focus, m.right), (Focus::Right, RightPane::Logs));
    assert_eq!(ch(&mut m, 'd'), vec![Effect::LoadDiff(5)]);
    assert_eq!(m.right, RightPane::Diff);
    // Tab goes between the queue and the right pane, which keeps the pane it shows.
    key(&mut m, KeyCode::Tab);
    assert_eq!((m.focus, m.right), (Focus::Queue, RightPane::Diff));
    key(&mut m, KeyCode::Tab);
    assert_eq!((m.focus, m.right), (Focus::Right, RightPane::Diff));
    m.handle(Event::Key(KeyEvent::new(KeyCode::BackTab, KeyModifiers::SHIFT)));
    assert_eq!(m.focus, Focus::Queue);
    key(&mut m, KeyCode::Enter);
    assert_eq!((m.focus, m.right), (Focus::Right, RightPane::Detail));
    // Esc from a right-hand pane is back to the queue.
    ch(&mut m, 'l');
    key(&mut m, KeyCode::Esc);
    assert_eq!((m.focus, m.right), (Focus::Queue, RightPane::Logs));
}

#[test]
fn answering_a_waiting_task_in_the_editor() {
    let mut m = busy();
    ch(&mut m, 'a');
    assert!(m.message.as_deref().unwrap().contains("only a waiting task can be answered"));
    ch(&mut m, 'j');
    ch(&mut m, 'j');
    assert_eq!(m.selected_id(), Some(3));
    ch(&mut m, 'a');
    assert!(matches!(m.popup, Some(Popup::Editor { .. })));
    typed(&mut m, "SQLite, ");
    key(&mut m, KeyCode::Enter);
    typed(&mut m, "keep it simple");
    let fx = ctrl(&mut m, 's');
    assert_eq!(fx, vec![Effect::Queue(Op::Answer(3, "SQLite, \nkeep it simple".into()))]);
    assert!(m.popup.is_none());
    // Esc abandons an answer.
    ch(&mut m, 'a');
    typed(&mut m, "never mind");
    assert_eq!(key(&mut m, KeyCode::Esc), vec![]);
    assert!(m.popup.is_none());
}

#[test]
fn the_questions_pane_answers_the_highlighted_question() {
    let mut m = busy();
    ch(&mut m, 'Q');
    assert_eq!(m.right, RightPane::Questions);
    ch(&mut m, 'a');
    typed(&mut m, "Postgres");
    assert_eq!(ctrl(&mut m, 's'), vec![Effect::Queue(Op::Answer(3, "Postgres".into()))]);
}

#[test]
fn cancel_asks_first() {
    let mut m = busy();
    ch(&mut m, 'j');
    assert_eq!(ch(&mut m, 'c'), vec![]);
    assert!(matches!(m.popup, Some(Popup::Confirm(ConfirmKind::Cancel(4)))));
    assert_eq!(ch(&mut m, 'n'), vec![]);
    assert!(m.popup.is_none());
    ch(&mut m, 'c');
    assert_eq!(ch(&mut m, 'y'), vec![Effect::Queue(Op::Cancel(4))]);
    ch(&mut m, 'G');
    ch(&mut m, 'k');
    ch(&mut m, 'c');
    assert!(m.message.as_deref().unwrap().contains("already done"));
}

#[test]
fn retry_priority_note_submit_and_filter() {
    let mut m = busy();
    ch(&mut m, 'G');
    assert_eq!(ch(&mut m, 'r'), vec![Effect::Queue(Op::Retry(1))]);
    ch(&mut m, 'g');
    assert_eq!(ch(&mut m, '+'), vec![Effect::Queue(Op::SetPriority(5, 6))]);
    // Each press steps from the last one, before the queue is read again.
    assert_eq!(ch(&mut m, '-'), vec![Effect::Queue(Op::SetPriority(5, 5))]);
    assert_eq!(ch(&mut m, '-'), vec![Effect::Queue(Op::SetPriority(5, 4))]);
    ch(&mut m, 'r');
    assert!(m.message.as_deref().unwrap().contains("only failed or cancelled"));
    ch(&mut m, 'N');
    typed(&mut m, "use the v2 API");
    assert_eq!(ctrl(&mut m, 's'), vec![Effect::Queue(Op::Note(5, "use the v2 API".into()))]);
    ch(&mut m, 'n');
    typed(&mut m, "Add a health endpoint");
    assert_eq!(
        ctrl(&mut m, 's'),
        vec![Effect::Queue(Op::Submit {
            prompt: "Add a health endpoint".into(),
            repo: "/home/me/src/app".into()
        })]
    );
    m.handle(Event::Submitted(Ok((6, "task 6 submitted".into()))));
    assert!(m.popup.is_none());
    assert_eq!(ch(&mut m, 'f'), vec![Effect::Reload]);
    assert_eq!(taskbridge_ui::app::filter_name(m.filter), "queued");
}

/// A load read before the queue took a press must not put the old priority back: the next press
/// would step from it (two quick `-` from 1 reached the queue as 0 twice).
#[test]
fn a_load_older_than_a_priority_press_keeps_the_pressed_value() {
    let mut m = busy();
    let stale = |m: &mut Model, applied: u64, p: i64| {
        let mut rows = m.rows.clone();
        rows.iter_mut().filter(|r| r.id.0 == 5).for_each(|r| r.priority = p);
        m.handle(Event::Loaded {
            rows,
            counts: m.counts.clone(),
            workers: vec![],
            priorities_applied: applied,
        });
    };
    let priority = |m: &Model| m.rows.iter().find(|r| r.id.0 == 5).unwrap().priority;
    assert_eq!(ch(&mut m, '-'), vec![Effect::Queue(Op::SetPriority(5, 4))]);
    // Read before the queue had the change: the row keeps 4, and the next press steps from it.
    stale(&mut m, 0, 5);
    assert_eq!(priority(&m), 4);
    assert_eq!(ch(&mut m, '-'), vec![Effect::Queue(Op::SetPriority(5, 3))]);
    // The first change is in, the second not yet: still the pressed value.
    stale(&mut m, 1, 4);
    assert_eq!(priority(&m), 3);
    // Both are in: the queue's word goes again (here someone else has set 9 since).
    stale(&mut m, 2, 9);
    assert_eq!(priority(&m), 9);
    stale(&mut m, 2, 8);
    assert_eq!(priority(&m), 8);
}

#[test]
fn quit_asks_while_the_embedded_worker_runs_tasks() {
    let mut m = busy();
    assert_eq!(ch(&mut m, 'q'), vec![]);
    assert!(matches!(m.popup, Some(Popup::Confirm(ConfirmKind::Quit { running: 1 }))));
    assert_eq!(ch(&mut m, 'y'), vec![Effect::Quit]);
    assert!(m.quit);
    let mut idle = model(vec![]);
    idle.header.worker_running = 0;
    assert_eq!(ch(&mut idle, 'q'), vec![Effect::Quit]);
}

#[test]
fn a_task_that_starts_waiting_rings_the_bell() {
    let mut m = busy();
    let mut rows = m.rows.clone();
    rows[1].status = TaskStatus::Waiting;
    rows[1].question = Some("Redis?".into());
    let fx = m.handle(Event::Loaded {
        rows,
        counts: BTreeMap::new(),
        workers: vec!["devbox".into()],
        priorities_applied: 0,
    });
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Bell { title, .. } if title.contains("task 4 asks"))),
        "{fx:?}"
    );
}

#[test]
fn the_log_keeps_a_bounded_ring_and_follows() {
    let mut m = busy();
    ch(&mut m, 'l');
    let text: String = (0..12_000).map(|i| format!("line {i}\n")).collect();
    m.handle(Event::LogLoaded { id: 5, text, next_offset: 100, from_tail: false });
    assert_eq!(m.log.lines.len(), taskbridge_ui::app::LOG_RING);
    assert_eq!(m.log.lines.back().unwrap(), "line 11999");
    ch(&mut m, 'k');
    assert!(!m.log.follow, "scrolling up stops following");
    ch(&mut m, 'F');
    assert!(m.log.follow && m.log.scroll == 0);
    ch(&mut m, '/');
    typed(&mut m, "line 11990");
    ctrl(&mut m, 's');
    assert_eq!(m.log.scroll, 9);
}

#[test]
fn the_new_task_dialog_asks_for_the_repository_and_keeps_the_text_when_it_is_refused() {
    let mut other = row(7, TaskStatus::Done, "Elsewhere");
    other.repo = "/home/me/src/lib".into();
    let mut m = model(vec![other, row(6, TaskStatus::Done, "Here")]);
    ch(&mut m, 'n');
    let Some(Popup::NewTask(form)) = &m.popup else { panic!("no new-task dialog") };
    assert_eq!(form.repo_text(), "/home/me/src/app", "the TUI's directory by default");
    assert_eq!(form.recent, ["/home/me/src/app", "/home/me/src/lib"]);
    typed(&mut m, "Add a health endpoint");
    // Ctrl-R offers the next recent repository; Tab moves to the field to edit it by hand.
    ctrl(&mut m, 'r');
    let fx = ctrl(&mut m, 's');
    let op = Op::Submit { prompt: "Add a health endpoint".into(), repo: "/home/me/src/lib".into() };
    assert_eq!(fx, vec![Effect::Queue(op)]);
    // Refused (not a repository): the dialog stays, with what was typed, and says why.
    m.handle(Event::Submitted(Err("'/home/me/src/lib' is not inside a git repository".into())));
    let Some(Popup::NewTask(form)) = &m.popup else { panic!("the dialog closed") };
    assert_eq!(form.prompt.lines(), ["Add a health endpoint"]);
    assert!(m.message.as_deref().unwrap().contains("not inside a git repository"));
    key(&mut m, KeyCode::Tab);
    for _ in 0.."/home/me/src/lib".len() {
        key(&mut m, KeyCode::Backspace);
    }
    typed(&mut m, "../api");
    let fx = ctrl(&mut m, 's');
    let op = Op::Submit { prompt: "Add a health endpoint".into(), repo: "../api".into() };
    assert_eq!(fx, vec![Effect::Queue(op)]);
    m.handle(Event::Submitted(Ok((8, "task 8 submitted".into()))));
    assert!(m.popup.is_none());
}

#[test]
fn home_in_the_log_shows_a_full_first_page() {
    let mut m = busy();
    m.handle(Event::Resize { height: 24 });
    ch(&mut m, 'l');
    let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
    m.handle(Event::LogLoaded { id: 5, text, next_offset: 500, from_tail: false });
    ch(&mut m, 'g');
    let screen = format!("{:?}", render(&m, 100, 24).backend());
    assert!(screen.contains("line 0 ") && screen.contains("line 10 "), "{screen}");
}

fn screen_text(m: &Model, w: u16, h: u16) -> String {
    let t = render(m, w, h);
    let buf = t.backend().buffer();
    (0..h)
        .map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_owned()).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn at_100_columns_the_counts_and_quit_stay_on_screen_and_titles_end_in_an_ellipsis() {
    let mut rows = busy().rows.clone();
    rows[1].title = "Add a cache layer to the API and make every endpoint use it by default".into();
    let m = model(rows);
    let text = screen_text(&m, 100, 24);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].contains("fail 1"), "header: {}", lines[0]);
    assert!(lines[0].contains("1 worker alive (this TUI's worker runs 1)"), "{}", lines[0]);
    assert!(lines[23].contains("q quit") && lines[23].contains("? help"), "footer: {}", lines[23]);
    assert!(text.contains("Add a cache layer to"), "{text}");
    assert!(text.contains('…'), "a cut title ends in an ellipsis: {text}");
    // AGE is the time since submit for every task; RAN how long it ran.
    let running = lines.iter().find(|l| l.contains("running")).unwrap();
    assert!(running.contains("10m") && running.contains("2m"), "{running}");
}

#[test]
fn an_empty_filter_says_so_and_how_to_change_it() {
    let mut m = busy();
    ch(&mut m, 'f');
    m.handle(Event::Loaded {
        rows: vec![],
        counts: m.counts.clone(),
        workers: vec!["devbox".into()],
        priorities_applied: 0,
    });
    let text = screen_text(&m, 100, 24);
    assert!(text.contains("No queued tasks (5 in all). Press f"), "{text}");
    assert!(!text.contains("Press n to submit"), "{text}");
}

#[test]
fn a_retried_running_task_shows_the_old_error_as_history_and_a_failed_diff_has_no_changes() {
    let mut m = busy();
    ch(&mut m, 'j');
    let mut t = queue_task(4);
    t.status = TaskStatus::Running;
    t.display_status = "running".into();
    t.error = Some("opencode exited with status 1".into());
    m.handle(Event::DetailLoaded(Box::new(t)));
    let text = screen_text(&m, 120, 40);
    assert!(text.contains("Previous attempt failed") && !text.contains("Error "), "{text}");
    ch(&mut m, 'G');
    ch(&mut m, 'd');
    m.handle(Event::DiffLoaded { id: 1, text: String::new() });
    let text = screen_text(&m, 120, 40);
    assert!(text.contains("Diff #1: no changes ") && !text.contains("no changes yet"), "{text}");
}

// ---- screens -------------------------------------------------------------------------------

#[test]
fn screen_empty_queue() {
    let m = model(vec![]);
    insta::assert_snapshot!(render(&m, 100, 20).backend());
}

#[test]
fn screen_running_tasks_with_detail() {
    let mut m = busy();
    ch(&mut m, 'j');
    let mut task = queue_task(4);
    task.result = serde_json::from_value(
        serde_json::json!({"summary": "Cached GET /items for 60 s.", "files_touched": [{"path": "src/cache.rs", "status": "added"}], "tests_run": [{"command": "cargo test", "exit_code": 0, "observed": true}, {"command": "npm test", "exit_code": null, "observed": false}], "usage": {"input_tokens": 1200, "output_tokens": 300, "reasoning_tokens": 0, "cache_read_tokens": 4000, "cache_write_tokens": 100, "cost_usd": 0.0123, "steps": 3}}),
    )
    .unwrap();
    m.handle(Event::DetailLoaded(Box::new(task)));
    insta::assert_snapshot!(render(&m, 140, 30).backend());
}

#[test]
fn screen_diff_with_colours() {
    let mut m = busy();
    ch(&mut m, 'd');
    let diff = "diff --git a/src/lib.rs b/src/lib.rs\n--- a/src/lib.rs\n+++ b/src/lib.rs\n@@ -1,3 +1,3 @@\n fn main() {\n-    let ttl = 30;\n+    let ttl = 60;\n }\n";
    m.handle(Event::DiffLoaded { id: 5, text: diff.into() });
    let t = render(&m, 120, 16);
    insta::assert_snapshot!(t.backend());
    let buf = t.backend().buffer();
    let find = |needle: &str| -> (u16, u16) {
        for y in 0..buf.area.height {
            let line: String =
                (0..buf.area.width).map(|x| buf[(x, y)].symbol().to_owned()).collect();
            if let Some(i) = line.find(needle) {
                return (line[..i].chars().count() as u16, y);
            }
        }
        panic!("'{needle}' not on screen");
    };
    let (x, y) = find("+    let ttl = 60;");
    assert_eq!(buf[(x, y)].fg, Color::Green, "added lines are green");
    let (x2, y2) = find("-    let ttl = 30;");
    assert_eq!(buf[(x2, y2)].fg, Color::Red, "removed lines are red");
    let (xh, yh) = find("@@ -1,3 +1,3 @@");
    assert_eq!(buf[(xh, yh)].fg, Color::Cyan, "hunk headers are marked");
    // The changed word is highlighted within the line.
    let six = (x + "+    let ttl = ".len() as u16, y);
    assert!(buf[six].modifier.contains(Modifier::REVERSED), "the changed part stands out");
    assert!(!buf[(x + 5, y)].modifier.contains(Modifier::REVERSED));
}

#[test]
fn screen_answering_a_question() {
    let mut m = busy();
    ch(&mut m, 'Q');
    ch(&mut m, 'a');
    typed(&mut m, "SQLite");
    insta::assert_snapshot!(render(&m, 100, 24).backend());
}

#[test]
fn screen_new_task_dialog() {
    let mut m = busy();
    ch(&mut m, 'n');
    typed(&mut m, "Add a health endpoint");
    insta::assert_debug_snapshot!(render(&m, 100, 24).backend());
}

#[test]
fn screen_help() {
    let mut m = busy();
    ch(&mut m, '?');
    insta::assert_snapshot!(render(&m, 100, 30).backend());
}

#[test]
fn screen_80x24_and_tiny_sizes_never_panic() {
    let m = busy();
    insta::assert_snapshot!(render(&m, 80, 24).backend());
    for (w, h) in [(1, 1), (10, 3), (20, 6), (30, 8), (300, 100)] {
        render(&m, w, h);
    }
}

fn queue_task(id: i64) -> queue::Task {
    let dir = tempfile::tempdir().unwrap();
    let store = queue::Store::open(dir.path().join("q.db")).unwrap();
    for i in 0..id {
        store
            .submit(queue::TaskSpec::new(
                format!("Add a cache layer to the API (task {i})"),
                "/home/me/src/app",
                "0123456789abcdef0123456789abcdef01234567",
            ))
            .unwrap();
    }
    let mut t = store.get(TaskId(id)).unwrap();
    t.title = "Add a cache layer to the API".into();
    t.created_at = NOW - 600.0;
    t
}

/// A model whose waiting task has a structured decision.
fn with_ask(ask: queue::Ask) -> Model {
    let mut r = row(3, TaskStatus::Waiting, "Choose the cache backend");
    r.question = Some(ask.text());
    r.ask = Some(Box::new(ask));
    model(vec![r, row(2, TaskStatus::Done, "Fix the flaky login test")])
}

fn colours(multiple: bool) -> queue::Ask {
    let opt =
        |l: &str, d: &str| queue::QuestionOption { label: l.into(), description: Some(d.into()) };
    queue::Ask::question(vec![queue::AgentQuestion {
        question: "Which colour should the banner be?".into(),
        header: Some("Banner colour".into()),
        options: vec![opt("red", "Warm"), opt("blue", "Calm"), opt("green", "Fresh")],
        multiple,
    }])
}

#[test]
fn a_question_with_options_is_answered_by_picking_one() {
    let mut m = with_ask(colours(false));
    assert!(ch(&mut m, 'a').is_empty());
    assert!(matches!(m.popup, Some(Popup::Choose(_))));
    insta::assert_snapshot!(render(&m, 100, 24).backend());
    ch(&mut m, 'j');
    let fx = key(&mut m, KeyCode::Enter);
    assert_eq!(fx, vec![Effect::Queue(Op::Answer(3, "blue".into()))]);
    assert!(m.popup.is_none());
}

#[test]
fn several_options_are_picked_with_space_and_sent_together() {
    let mut m = with_ask(colours(true));
    ch(&mut m, 'a');
    ch(&mut m, ' ');
    ch(&mut m, 'j');
    ch(&mut m, 'j');
    ch(&mut m, ' ');
    let fx = key(&mut m, KeyCode::Enter);
    assert_eq!(fx, vec![Effect::Queue(Op::Answer(3, "red, green".into()))]);
}

#[test]
fn the_last_option_and_e_open_the_editor_for_free_text() {
    let mut m = with_ask(colours(false));
    ch(&mut m, 'a');
    for _ in 0..3 {
        ch(&mut m, 'j');
    }
    key(&mut m, KeyCode::Enter);
    assert!(matches!(m.popup, Some(Popup::Editor { .. })), "Type my own answer opens the editor");
    typed(&mut m, "teal");
    assert_eq!(ctrl(&mut m, 's'), vec![Effect::Queue(Op::Answer(3, "teal".into()))]);
}

#[test]
fn a_permission_request_offers_once_always_reject_and_feedback() {
    let ask = queue::Ask::permission(queue::PermissionAsk {
        permission: "bash".into(),
        patterns: vec!["git push origin main".into()],
        target: Some("git push origin main".into()),
        always: vec!["git push *".into()],
    });
    let mut m = with_ask(ask);
    ch(&mut m, 'a');
    let screen = format!("{:?}", render(&m, 100, 24).backend());
    for s in ["once", "always", "reject with feedback", "git push origin main"] {
        assert!(screen.contains(s), "'{s}' missing:\n{screen}");
    }
    ch(&mut m, 'j');
    assert_eq!(key(&mut m, KeyCode::Enter), vec![Effect::Queue(Op::Answer(3, "always".into()))]);
    // Feedback: the editor opens with "reject: " typed.
    ch(&mut m, 'a');
    for _ in 0..3 {
        ch(&mut m, 'j');
    }
    key(&mut m, KeyCode::Enter);
    typed(&mut m, "use staging");
    assert_eq!(ctrl(&mut m, 's'), vec![Effect::Queue(Op::Answer(3, "reject: use staging".into()))]);
}

#[test]
fn m_merges_a_done_task_after_asking_and_u_follows_one_up() {
    let mut m = busy();
    // Row 2 ("Fix the flaky login test") is done: the 4th row.
    for _ in 0..3 {
        ch(&mut m, 'j');
    }
    assert!(ch(&mut m, 'm').is_empty());
    assert!(matches!(m.popup, Some(Popup::Confirm(ConfirmKind::Merge(2)))));
    let screen = format!("{:?}", render(&m, 100, 24).backend());
    assert!(screen.contains("Merge task 2 into the branch it was submitted from?"), "{screen}");
    assert_eq!(ch(&mut m, 'y'), vec![Effect::Queue(Op::Merge(2))]);

    assert!(ch(&mut m, 'u').is_empty());
    typed(&mut m, "Also cover the logout path");
    assert_eq!(
        ctrl(&mut m, 's'),
        vec![Effect::Queue(Op::Followup(2, "Also cover the logout path".into()))]
    );
    // Only done tasks merge; a running one says why.
    ch(&mut m, 'g');
    ch(&mut m, 'j');
    assert!(ch(&mut m, 'm').is_empty());
    assert!(m.message.as_deref().unwrap().contains("only a done task can be merged"));
}

#[test]
fn p_shows_the_plan_of_the_selected_task_drawn_from_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let store = queue::Store::open(dir.path().join("q.db")).unwrap();
    let spec =
        |p: &str| queue::TaskSpec::new(p, "/tmp/repo", "0123456789abcdef0123456789abcdef01234567");
    let mut b = spec("tests");
    b.depends_on = vec![queue::DepRef::Batch(0)];
    let mut c = spec("docs");
    c.depends_on = vec![queue::DepRef::Batch(0), queue::DepRef::Batch(1)];
    store.submit_batch(vec![spec("parser"), b, c]).unwrap();
    let lines = taskbridge_ui::runtime::plan_lines(&store, TaskId(3));
    assert_eq!(lines.len(), 4, "{lines:#?}");
    assert!(lines[0].starts_with("#1 queued") && lines[0].contains("parser"), "{lines:#?}");
    assert!(lines[1].starts_with("  then #2 blocked"), "{lines:#?}");
    assert!(lines[2].starts_with("    then #3 blocked"), "{lines:#?}");
    assert_eq!(lines[3], "  then #3 (above)");

    let mut m = busy();
    let fx = ch(&mut m, 'p');
    assert_eq!(m.right, RightPane::Plan);
    assert_eq!(fx, vec![Effect::LoadPlan(5)]);
    m.handle(Event::PlanLoaded {
        id: 5,
        lines: vec![
            "#4 running   Add a cache layer".into(),
            "  then #5 blocked   Write the migration guide".into(),
        ],
    });
    let screen = format!("{:?}", render(&m, 100, 24).backend());
    assert!(
        screen.contains("then #5 blocked") && screen.contains("Plan: dependencies"),
        "{screen}"
    );
}

#[test]
fn the_detail_warns_of_other_unmerged_work_on_the_same_paths() {
    let mut m = busy();
    ch(&mut m, 'j');
    m.handle(Event::DetailLoaded(Box::new(queue_task(4))));
    m.handle(Event::OverlapsLoaded {
        id: 4,
        overlaps: vec!["#2 (done) also changes README.md".into()],
    });
    let text = screen_text(&m, 120, 40);
    assert!(
        text.contains("Overlaps") && text.contains("#2 (done) also changes README.md"),
        "{text}"
    );
    // Another task's overlaps are not shown on this one.
    m.handle(Event::OverlapsLoaded { id: 1, overlaps: vec!["#9 (done) also changes x".into()] });
    assert!(!screen_text(&m, 120, 40).contains("#9"));
}

#[test]
fn workers_on_several_hosts_are_named_in_the_header_and_a_task_shows_its_host() {
    let mut m = busy();
    m.handle(Event::Loaded {
        rows: m.rows.clone(),
        counts: m.counts.clone(),
        workers: vec!["build-2".into(), "devbox".into(), "build-2".into()],
        priorities_applied: 0,
    });
    ch(&mut m, 'j');
    let mut t = queue_task(4);
    t.worker_host = Some("build-2".into());
    t.worker = Some("build-2:4242:17".into());
    m.handle(Event::DetailLoaded(Box::new(t)));
    let text = screen_text(&m, 160, 24);
    assert!(text.contains("3 workers alive on build-2, devbox"), "{text}");
    assert!(text.contains("host build-2 (worker build-2:4242:17)"), "{text}");
}

#[test]
fn s_opens_the_stats_view_which_follows_the_queue_and_closes_with_s_or_esc() {
    let mut m = busy();
    assert_eq!(ch(&mut m, 's'), vec![Effect::LoadStats]);
    assert!(matches!(m.popup, Some(Popup::Stats(None))));
    assert!(screen_text(&m, 100, 30).contains("Reading the queue"));
    let recent = queue::Recent {
        now: NOW,
        tasks: vec![queue::FinishedTask {
            id: TaskId(2),
            agent: "claude-code".into(),
            status: TaskStatus::Done,
            finished_at: NOW - 5.0,
            run_s: Some(120.0),
            queue_wait_s: Some(0.5),
            cost_usd: Some(0.5),
            failure_kind: None,
        }],
    };
    m.handle(Event::StatsLoaded(Box::new(taskbridge_ui::stats::Stats::of(&recent))));
    let text = screen_text(&m, 120, 40);
    assert!(text.contains("Tasks finished per 10 minutes: 1 in 24 h"), "{text}");
    assert!(text.contains("$0.50 in 24 h"), "{text}");
    assert!(text.contains("claude-code 1 / 0 / 0"), "{text}");
    assert!(text.contains("run time    p50  2.0 min  p90  2.0 min  p99  2.0 min"), "{text}");
    // A change in the queue reads the figures again while the view is open.
    let fx = m.handle(Event::Loaded {
        rows: busy().rows,
        counts: BTreeMap::new(),
        workers: vec![],
        priorities_applied: 0,
    });
    assert!(fx.contains(&Effect::LoadStats), "{fx:?}");
    ch(&mut m, 's');
    assert!(m.popup.is_none());
    let fx = m.handle(Event::Loaded {
        rows: busy().rows,
        counts: BTreeMap::new(),
        workers: vec![],
        priorities_applied: 0,
    });
    assert!(!fx.contains(&Effect::LoadStats), "closed: {fx:?}");
    ch(&mut m, 's');
    key(&mut m, KeyCode::Esc);
    assert!(m.popup.is_none(), "Esc closes it too");
    // A queue that cannot be read says so, and nothing loops on it.
    ch(&mut m, 's');
    assert!(m.handle(Event::StatsFailed("database is locked".into())).is_empty());
    assert!(m.message.as_deref().unwrap().contains("reading the stats: database is locked"));
}
