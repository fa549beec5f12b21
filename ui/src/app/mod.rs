//! The model and its update function.
//!
//! # Flow
//! Terminal and queue events arrive as [`Event`]s. Keys go through the keymap to [`Action`]s;
//! `update` changes only the [`Model`] and returns [`Effect`]s (queue operations, loads). The
//! runtime performs effects off the UI thread and feeds their results back as events. The view is
//! a pure function of the model. Nothing here does I/O, so every key can be tested on a model.

use crate::action::Action;
use crate::diff::{DiffLine, parse_diff};
use crate::keymap::{Keymap, Mode};
use crossterm::event::KeyEvent;
use queue::{StatusFilter, Task, TaskRow, TaskStatus};
use ratatui_textarea::TextArea;
use std::collections::{BTreeMap, HashMap, VecDeque};

mod dialogs;
mod task_actions;

pub use dialogs::{Choice, ChoiceItem, NewTask, NewTaskField};

/// Lines kept in memory for the log pane, whatever the file's size.
pub const LOG_RING: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Focus {
    Queue,
    Right,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RightPane {
    Detail,
    Logs,
    Diff,
    Questions,
    Plan,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EditorKind {
    Answer(i64),
    Note(i64),
    Followup(i64),
    /// A queued task's new prompt.
    Edit(i64),
    Search,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfirmKind {
    Cancel(i64),
    Merge(i64),
    Quit { running: usize },
}

pub enum Popup {
    Help,
    /// The stats view, full screen; its figures once loaded.
    Stats(Option<Box<crate::stats::Stats>>),
    Confirm(ConfirmKind),
    Editor {
        kind: EditorKind,
        area: Box<TextArea<'static>>,
    },
    NewTask(Box<NewTask>),
    Choose(Box<Choice>),
}

/// A change requested of the queue.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Cancel(i64),
    Retry(i64),
    SetPriority(i64, i64),
    Answer(i64, String),
    Note(i64, String),
    Submit { prompt: String, repo: String },
    Merge(i64),
    Followup(i64, String),
    Edit(i64, String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    Reload,
    LoadDetail(i64),
    /// Read the task's log from this offset (`None`: the tail).
    LoadLog {
        id: i64,
        offset: Option<u64>,
    },
    LoadDiff(i64),
    /// The tasks related to this one, drawn as a tree.
    LoadPlan(i64),
    /// The stats view's figures, from the tasks that finished in the last day.
    LoadStats,
    Queue(Op),
    Bell {
        title: String,
        body: String,
    },
    /// The TUI steps aside for a program on the terminal, and comes back as it was: a shell in
    /// the task's worktree, or the editor on its diff.
    Outside(Outside),
    Quit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outside {
    Shell(i64),
    EditDiff(i64),
}

/// Results and facts coming into the app.
pub enum Event {
    Key(KeyEvent),
    Resize {
        height: u16,
    },
    Tick {
        now: f64,
    },
    Loaded {
        rows: Vec<TaskRow>,
        counts: BTreeMap<String, i64>,
        /// The host of each live worker.
        workers: Vec<String>,
        /// How many of this TUI's priority changes the queue had taken when it was read.
        priorities_applied: u64,
    },
    DetailLoaded(Box<Task>),
    StatsLoaded(Box<crate::stats::Stats>),
    /// The queue could not be read for the stats view (it says so; nothing else reloads).
    StatsFailed(String),
    /// Other unmerged tasks that changed the same paths as this one, one line each.
    OverlapsLoaded {
        id: i64,
        overlaps: Vec<String>,
    },
    LogLoaded {
        id: i64,
        text: String,
        next_offset: u64,
        from_tail: bool,
    },
    DiffLoaded {
        id: i64,
        text: String,
    },
    PlanLoaded {
        id: i64,
        lines: Vec<String>,
    },
    OpDone(Result<String, String>),
    /// The queue's answer to the new-task dialog.
    /// The new task's id and what to say, or why it was refused.
    Submitted(Result<(i64, String), String>),
    Header(Header),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Header {
    /// The MCP endpoint, or why there is none (e.g. the port is in use).
    pub mcp: String,
    pub worker_embedded: bool,
    pub worker_running: usize,
}

#[derive(Debug, Default)]
pub struct LogView {
    pub id: Option<i64>,
    pub lines: VecDeque<String>,
    pub next_offset: u64,
    pub partial: String,
    pub follow: bool,
    /// Lines scrolled up from the bottom.
    pub scroll: usize,
    pub search: Option<String>,
}

#[derive(Debug, Default)]
pub struct DiffView {
    pub id: Option<i64>,
    pub lines: Vec<DiffLine>,
    pub scroll: usize,
}

pub struct Model {
    pub keymap: Keymap,
    pub rows: Vec<TaskRow>,
    /// The task to select at the next load (one just submitted from the form).
    pub select_next: Option<i64>,
    pub counts: BTreeMap<String, i64>,
    pub workers_alive: usize,
    /// The hosts the live workers run on, each once.
    pub worker_hosts: Vec<String>,
    pub selected: usize,
    pub focus: Focus,
    pub right: RightPane,
    pub filter: Option<StatusFilter>,
    pub detail: Option<Task>,
    pub detail_scroll: usize,
    /// A task whose prompt opens in the editor once its detail (with the prompt) is loaded.
    pub edit_when_loaded: Option<i64>,
    pub log: LogView,
    pub diff: DiffView,
    pub question_sel: usize,
    /// The plan pane: the task it was drawn for and its lines.
    pub plan: (Option<i64>, Vec<String>),
    /// The detail's overlaps: the task they are for, and one line per other task.
    pub overlaps: (Option<i64>, Vec<String>),
    pub popup: Option<Popup>,
    pub header: Header,
    pub message: Option<String>,
    pub now: f64,
    pub height: u16,
    pub cwd: String,
    pub quit: bool,
    /// Last known state per task, to notice transitions worth a notification.
    seen: HashMap<i64, TaskStatus>,
    /// Priorities pressed that a load may not show yet: task id → (the value, the count of
    /// priority changes sent when it was). A load read before the queue took the change would
    /// put the old value back, and the next press would step from that.
    pending_priorities: HashMap<i64, (i64, u64)>,
    /// Priority changes sent to the queue so far (they are applied in order).
    priorities_sent: u64,
    loaded_once: bool,
}

const FILTERS: [Option<StatusFilter>; 8] = [
    None,
    Some(StatusFilter::Is(TaskStatus::Queued)),
    Some(StatusFilter::Blocked),
    Some(StatusFilter::Is(TaskStatus::Running)),
    Some(StatusFilter::Is(TaskStatus::Waiting)),
    Some(StatusFilter::Is(TaskStatus::Done)),
    Some(StatusFilter::Is(TaskStatus::Failed)),
    Some(StatusFilter::Is(TaskStatus::Cancelled)),
];

pub fn filter_name(f: Option<StatusFilter>) -> &'static str {
    match f {
        None => "all",
        Some(StatusFilter::Blocked) => "blocked",
        Some(StatusFilter::Is(s)) => s.as_str(),
    }
}

fn editor(title: &str) -> Box<TextArea<'static>> {
    let mut area = TextArea::default();
    area.set_block(ratatui::widgets::Block::bordered().title(title.to_owned()));
    Box::new(area)
}

impl Model {
    pub fn new(keymap: Keymap, cwd: String) -> Model {
        Model {
            keymap,
            rows: Vec::new(),
            select_next: None,
            counts: BTreeMap::new(),
            workers_alive: 0,
            worker_hosts: Vec::new(),
            selected: 0,
            focus: Focus::Queue,
            right: RightPane::Detail,
            filter: None,
            detail: None,
            detail_scroll: 0,
            edit_when_loaded: None,
            log: LogView { follow: true, ..Default::default() },
            diff: DiffView::default(),
            question_sel: 0,
            plan: (None, Vec::new()),
            overlaps: (None, Vec::new()),
            popup: None,
            header: Header::default(),
            message: None,
            now: 0.0,
            height: 24,
            cwd,
            quit: false,
            seen: HashMap::new(),
            pending_priorities: HashMap::new(),
            priorities_sent: 0,
            loaded_once: false,
        }
    }

    pub fn mode(&self) -> Mode {
        match &self.popup {
            None => Mode::Normal,
            // The stats view closes with the help screen's keys.
            Some(Popup::Help) | Some(Popup::Stats(_)) => Mode::Help,
            Some(Popup::Confirm(_)) => Mode::Confirm,
            Some(Popup::Editor { .. }) | Some(Popup::NewTask(_)) => Mode::Editor,
            Some(Popup::Choose(_)) => Mode::Choice,
        }
    }

    pub fn selected_row(&self) -> Option<&TaskRow> {
        self.rows.get(self.selected)
    }

    pub fn selected_id(&self) -> Option<i64> {
        self.selected_row().map(|r| r.id.0)
    }

    /// Waiting tasks, for the questions pane.
    pub fn waiting(&self) -> Vec<&TaskRow> {
        self.rows.iter().filter(|r| r.status == TaskStatus::Waiting).collect()
    }

    /// The task an action applies to: the selected question in the questions pane, else the
    /// selected row.
    fn target(&self) -> Option<&TaskRow> {
        if self.focus == Focus::Right && self.right == RightPane::Questions {
            self.waiting().get(self.question_sel).copied()
        } else {
            self.selected_row()
        }
    }

    fn page(&self) -> usize {
        (self.height as usize).saturating_sub(6).max(1)
    }

    /// Effects that load what the right pane shows for the selected task.
    fn load_selected(&mut self) -> Vec<Effect> {
        let Some(id) = self.selected_id() else { return vec![] };
        self.detail_scroll = 0;
        match self.right {
            RightPane::Detail | RightPane::Questions => vec![Effect::LoadDetail(id)],
            RightPane::Logs => {
                if self.log.id != Some(id) {
                    self.log = LogView { id: Some(id), follow: true, ..Default::default() };
                }
                vec![Effect::LoadLog { id, offset: None }]
            }
            RightPane::Diff => {
                if self.diff.id != Some(id) {
                    self.diff = DiffView { id: Some(id), ..Default::default() };
                }
                vec![Effect::LoadDiff(id)]
            }
            RightPane::Plan => vec![Effect::LoadPlan(id)],
        }
    }

    pub fn handle(&mut self, ev: Event) -> Vec<Effect> {
        match ev {
            Event::Key(k) => self.key(k),
            Event::Resize { height } => {
                self.height = height;
                vec![]
            }
            Event::Tick { now } => {
                self.now = now;
                // A running task's log and diff keep changing: follow them.
                match (self.right, self.selected_row()) {
                    (RightPane::Logs, Some(r))
                        if self.log.id == Some(r.id.0) && r.status == TaskStatus::Running =>
                    {
                        vec![Effect::LoadLog { id: r.id.0, offset: Some(self.log.next_offset) }]
                    }
                    _ => vec![],
                }
            }
            Event::Loaded { mut rows, counts, workers, priorities_applied } => {
                self.pending_priorities.retain(|_, (_, sent)| *sent > priorities_applied);
                for r in &mut rows {
                    if let Some((p, _)) = self.pending_priorities.get(&r.id.0) {
                        r.priority = *p;
                    }
                }
                let mut effects = self.loaded(rows, counts, workers);
                // The queue changed: an open stats view is drawn again from it.
                if matches!(self.popup, Some(Popup::Stats(_))) {
                    effects.push(Effect::LoadStats);
                }
                effects
            }
            Event::StatsFailed(e) => self.say(format!("error: reading the stats: {e}")),
            Event::StatsLoaded(s) => {
                if let Some(Popup::Stats(shown)) = &mut self.popup {
                    *shown = Some(s);
                }
                vec![]
            }
            Event::DetailLoaded(t) => {
                if self.edit_when_loaded == Some(t.id.0) {
                    self.edit_when_loaded = None;
                    self.edit_prompt(&t);
                }
                if Some(t.id.0) == self.selected_id()
                    || self.detail.as_ref().is_some_and(|d| d.id == t.id)
                {
                    self.detail = Some(*t);
                }
                vec![]
            }
            Event::OverlapsLoaded { id, overlaps } => {
                self.overlaps = (Some(id), overlaps);
                vec![]
            }
            Event::LogLoaded { id, text, next_offset, from_tail } => {
                if self.log.id == Some(id) {
                    self.append_log(&text, next_offset, from_tail);
                }
                vec![]
            }
            Event::PlanLoaded { id, lines } => {
                if self.selected_id() == Some(id) {
                    self.plan = (Some(id), lines);
                }
                vec![]
            }
            Event::DiffLoaded { id, text } => {
                if self.diff.id == Some(id) {
                    self.diff.lines = parse_diff(&text);
                    self.diff.scroll =
                        self.diff.scroll.min(self.diff.lines.len().saturating_sub(1));
                }
                vec![]
            }
            Event::OpDone(r) => {
                self.message = Some(match r {
                    Ok(m) => m,
                    Err(e) => format!("error: {e}"),
                });
                vec![Effect::Reload]
            }
            Event::Submitted(r) => match r {
                Ok((id, m)) => {
                    self.popup = None;
                    self.message = Some(m);
                    // The next load selects it: the person wants to see what they just made.
                    self.select_next = Some(id);
                    vec![Effect::Reload]
                }
                Err(e) => {
                    if let Some(Popup::NewTask(form)) = &mut self.popup {
                        form.sending = false;
                    }
                    self.message = Some(format!("error: {e}"));
                    vec![]
                }
            },
            Event::Header(h) => {
                self.header = h;
                vec![]
            }
        }
    }

    fn append_log(&mut self, text: &str, next_offset: u64, from_tail: bool) {
        let log = &mut self.log;
        if from_tail {
            log.lines.clear();
            log.partial.clear();
        }
        log.next_offset = next_offset;
        let mut buf = std::mem::take(&mut log.partial);
        buf.push_str(text);
        let mut parts: Vec<&str> = buf.split('\n').collect();
        let last = parts.pop().unwrap_or("");
        let mut first = from_tail;
        for p in parts {
            // A tail starts mid-file: its first line is probably cut.
            if first && next_offset as usize > text.len() {
                first = false;
                continue;
            }
            first = false;
            log.lines.push_back(p.to_owned());
            if log.lines.len() > LOG_RING {
                log.lines.pop_front();
            }
        }
        log.partial = last.to_owned();
        if log.follow {
            log.scroll = 0;
        }
    }

    fn loaded(
        &mut self,
        rows: Vec<TaskRow>,
        counts: BTreeMap<String, i64>,
        workers: Vec<String>,
    ) -> Vec<Effect> {
        let mut keep = self.select_next.take().or_else(|| self.selected_id());
        let mut effects = Vec::new();
        // Notify on transitions into waiting, done and failed (not on the first load).
        for r in &rows {
            let before = self.seen.insert(r.id.0, r.status);
            // A task that starts waiting is said on the message line and, unless a dialog is
            // open, selected, so that `a` answers it at once.
            if self.loaded_once
                && r.status == TaskStatus::Waiting
                && before != Some(TaskStatus::Waiting)
            {
                let question = r.question.as_deref().unwrap_or("a decision");
                let first = question.lines().next().unwrap_or_default();
                self.message = Some(format!("#{} is waiting: {first} (a answers)", r.id.0));
                if self.popup.is_none() {
                    keep = Some(r.id.0);
                }
            }
            if self.loaded_once && before.is_some() && before != Some(r.status) {
                let what = match r.status {
                    TaskStatus::Waiting => Some("asks a question"),
                    TaskStatus::Done => Some("is done"),
                    TaskStatus::Failed => Some("failed"),
                    _ => None,
                };
                if let Some(what) = what {
                    effects.push(Effect::Bell {
                        title: format!("TaskBridge: task {} {what}", r.id.0),
                        body: r.question.clone().unwrap_or_else(|| r.title.clone()),
                    });
                }
            }
        }
        self.loaded_once = true;
        let changed_selection = self.rows.get(self.selected).map(|r| (r.id, r.status))
            != keep.and_then(|k| rows.iter().find(|r| r.id.0 == k)).map(|r| (r.id, r.status));
        self.rows = rows;
        self.counts = counts;
        self.workers_alive = workers.len();
        let mut hosts = workers;
        hosts.sort();
        hosts.dedup();
        self.worker_hosts = hosts;
        if let Some(k) = keep
            && let Some(i) = self.rows.iter().position(|r| r.id.0 == k)
        {
            self.selected = i;
        }
        self.selected = self.selected.min(self.rows.len().saturating_sub(1));
        self.question_sel = self.question_sel.min(self.waiting().len().saturating_sub(1));
        // Refresh what the right pane shows for the selection.
        if let Some(id) = self.selected_id() {
            match self.right {
                RightPane::Detail | RightPane::Questions => effects.push(Effect::LoadDetail(id)),
                RightPane::Diff if changed_selection => effects.push(Effect::LoadDiff(id)),
                RightPane::Plan => effects.push(Effect::LoadPlan(id)),
                RightPane::Logs if self.log.id != Some(id) => effects.extend(self.load_selected()),
                _ => {}
            }
        }
        effects
    }

    fn key(&mut self, k: KeyEvent) -> Vec<Effect> {
        use crossterm::event::{KeyCode, KeyModifiers};
        let mode = self.mode();
        let action = self.keymap.resolve(mode, &k);
        let typing = matches!(self.popup, Some(Popup::Editor { .. } | Popup::NewTask(_)));
        // A terminal sends Alt-x as Esc then x, so Esc and a key typed at once reach us as
        // Alt and that key. Unbound, outside a text field (where Alt-f and the like move by
        // words), it is read as the two keys the person pressed.
        if action.is_none()
            && !typing
            && k.modifiers.contains(KeyModifiers::ALT)
            && matches!(k.code, KeyCode::Char(_))
        {
            let mut effects = self.key(KeyEvent::new(KeyCode::Esc, KeyModifiers::NONE));
            effects.extend(self.key(KeyEvent::new(k.code, k.modifiers - KeyModifiers::ALT)));
            return effects;
        }
        if action.is_none() {
            match &mut self.popup {
                Some(Popup::Editor { area, .. }) => {
                    area.input(k);
                    return vec![];
                }
                Some(Popup::NewTask(form)) if !form.sending => {
                    match form.field {
                        // One line: Enter moves on to the prompt.
                        NewTaskField::Repo if k.code == crossterm::event::KeyCode::Enter => {
                            form.field = NewTaskField::Prompt;
                        }
                        NewTaskField::Repo => {
                            form.repo.input(k);
                        }
                        NewTaskField::Prompt => {
                            form.prompt.input(k);
                        }
                    }
                    return vec![];
                }
                _ => {}
            }
        }
        match action {
            Some(a) => self.update(a),
            None => vec![],
        }
    }

    /// Applies one action.
    pub fn update(&mut self, action: Action) -> Vec<Effect> {
        self.message = None;
        match self.mode() {
            Mode::Editor => return self.update_editor(action),
            Mode::Confirm => return self.update_confirm(action),
            Mode::Choice => return self.update_choice(action),
            Mode::Help => {
                if matches!(action, Action::ToggleHelp | Action::Dismiss | Action::OpenStats) {
                    self.popup = None;
                }
                return vec![];
            }
            Mode::Normal => {}
        }
        match action {
            Action::SelectNext => self.move_by(1),
            Action::SelectPrev => self.move_by(-1),
            Action::PageDown => self.move_by(self.page() as isize),
            Action::PageUp => self.move_by(-(self.page() as isize)),
            Action::SelectFirst => self.move_by(isize::MIN / 2),
            Action::SelectLast => self.move_by(isize::MAX / 2),
            // Two places to be: the queue, or the right pane (which one is picked with its own
            // key: Enter, l, d, Q).
            Action::FocusNext | Action::FocusPrev => {
                if self.focus == Focus::Queue {
                    let pane = self.right;
                    self.open(pane)
                } else {
                    self.focus = Focus::Queue;
                    vec![]
                }
            }
            Action::FocusQueue => {
                self.focus = Focus::Queue;
                vec![]
            }
            Action::OpenDetail => self.open(RightPane::Detail),
            Action::OpenLogs => self.open(RightPane::Logs),
            Action::OpenDiff => self.open(RightPane::Diff),
            Action::OpenQuestions => self.open(RightPane::Questions),
            Action::OpenPlan => self.open(RightPane::Plan),
            Action::OpenStats => {
                self.popup = Some(Popup::Stats(None));
                vec![Effect::LoadStats]
            }
            Action::MergeTask => self.merge(),
            Action::FollowupTask => self.followup(),
            Action::EditTask => self.edit(),
            Action::OpenShell => self.outside(Outside::Shell),
            Action::EditDiff => self.outside(Outside::EditDiff),
            Action::AnswerTask => self.answer(),
            Action::SubmitTask => self.new_task(),
            Action::AddTaskNote => self.note(),
            Action::SearchLog => self.search(),
            Action::RetryTask => self.retry(),
            Action::CancelTask => self.cancel(),
            Action::RaisePriority => self.nudge_priority(1),
            Action::LowerPriority => self.nudge_priority(-1),
            Action::CycleFilter => {
                let i = FILTERS.iter().position(|f| *f == self.filter).unwrap_or(0);
                self.filter = FILTERS[(i + 1) % FILTERS.len()];
                self.selected = 0;
                vec![Effect::Reload]
            }
            Action::ToggleFollow => {
                self.log.follow = !self.log.follow;
                if self.log.follow {
                    self.log.scroll = 0;
                }
                vec![]
            }
            Action::ToggleHelp => {
                self.popup = Some(Popup::Help);
                vec![]
            }
            Action::Quit => self.ask_to_quit(),
            Action::Send
            | Action::Confirm
            | Action::Dismiss
            | Action::NextField
            | Action::ToggleChoice
            | Action::WriteAnswer
            | Action::CycleRepo => vec![],
        }
    }

    fn say(&mut self, m: String) -> Vec<Effect> {
        self.message = Some(m);
        vec![]
    }

    fn open(&mut self, pane: RightPane) -> Vec<Effect> {
        self.focus = Focus::Right;
        self.right = pane;
        self.load_selected()
    }

    fn move_by(&mut self, delta: isize) -> Vec<Effect> {
        if self.focus == Focus::Right {
            match self.right {
                RightPane::Logs => {
                    // Up means older lines: scroll away from the bottom and stop following. At
                    // the top, the first page is still full.
                    let visible = (self.height as usize).saturating_sub(5).max(1);
                    let max = self.log.lines.len().saturating_sub(visible);
                    let s = (self.log.scroll as isize - delta).clamp(0, max as isize) as usize;
                    self.log.scroll = s;
                    self.log.follow = s == 0 && self.log.follow;
                    return vec![];
                }
                RightPane::Diff => {
                    let max = self.diff.lines.len().saturating_sub(1);
                    self.diff.scroll =
                        (self.diff.scroll as isize + delta).clamp(0, max as isize) as usize;
                    return vec![];
                }
                RightPane::Detail | RightPane::Plan => {
                    self.detail_scroll = (self.detail_scroll as isize + delta).max(0) as usize;
                    return vec![];
                }
                RightPane::Questions => {
                    let n = self.waiting().len();
                    self.question_sel = (self.question_sel as isize + delta)
                        .clamp(0, n.saturating_sub(1) as isize)
                        as usize;
                    return vec![];
                }
            }
        }
        if self.rows.is_empty() {
            return vec![];
        }
        let before = self.selected;
        self.selected = (self.selected as isize)
            .saturating_add(delta)
            .clamp(0, self.rows.len() as isize - 1) as usize;
        if before == self.selected { vec![] } else { self.load_selected() }
    }
}
