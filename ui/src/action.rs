//! What a key can do. Names are the keymap's `run` values and match the queue operations, MCP
//! tools and CLI verbs where there is one (`cancel-task` = `cancel_task` = `taskbridge cancel`).

/// An imperative request from the user; `App::update` turns it into model changes and effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    SelectNext,
    SelectPrev,
    PageDown,
    PageUp,
    SelectFirst,
    SelectLast,
    FocusNext,
    FocusPrev,
    OpenDetail,
    OpenLogs,
    OpenDiff,
    OpenQuestions,
    AnswerTask,
    SubmitTask,
    RetryTask,
    CancelTask,
    RaisePriority,
    LowerPriority,
    AddTaskNote,
    CycleFilter,
    ToggleFollow,
    SearchLog,
    ToggleHelp,
    Quit,
    Send,
    Confirm,
    Dismiss,
}

impl Action {
    pub const ALL: [Action; 27] = [
        Action::SelectNext,
        Action::SelectPrev,
        Action::PageDown,
        Action::PageUp,
        Action::SelectFirst,
        Action::SelectLast,
        Action::FocusNext,
        Action::FocusPrev,
        Action::OpenDetail,
        Action::OpenLogs,
        Action::OpenDiff,
        Action::OpenQuestions,
        Action::AnswerTask,
        Action::SubmitTask,
        Action::RetryTask,
        Action::CancelTask,
        Action::RaisePriority,
        Action::LowerPriority,
        Action::AddTaskNote,
        Action::CycleFilter,
        Action::ToggleFollow,
        Action::SearchLog,
        Action::ToggleHelp,
        Action::Quit,
        Action::Send,
        Action::Confirm,
        Action::Dismiss,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Action::SelectNext => "select-next",
            Action::SelectPrev => "select-prev",
            Action::PageDown => "page-down",
            Action::PageUp => "page-up",
            Action::SelectFirst => "select-first",
            Action::SelectLast => "select-last",
            Action::FocusNext => "focus-next",
            Action::FocusPrev => "focus-prev",
            Action::OpenDetail => "open-detail",
            Action::OpenLogs => "open-logs",
            Action::OpenDiff => "open-diff",
            Action::OpenQuestions => "open-questions",
            Action::AnswerTask => "answer-task",
            Action::SubmitTask => "submit-task",
            Action::RetryTask => "retry-task",
            Action::CancelTask => "cancel-task",
            Action::RaisePriority => "raise-priority",
            Action::LowerPriority => "lower-priority",
            Action::AddTaskNote => "add-task-note",
            Action::CycleFilter => "cycle-filter",
            Action::ToggleFollow => "toggle-follow",
            Action::SearchLog => "search-log",
            Action::ToggleHelp => "toggle-help",
            Action::Quit => "quit",
            Action::Send => "send",
            Action::Confirm => "confirm",
            Action::Dismiss => "dismiss",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Action::SelectNext => "Move down",
            Action::SelectPrev => "Move up",
            Action::PageDown => "Page down",
            Action::PageUp => "Page up",
            Action::SelectFirst => "Go to the top",
            Action::SelectLast => "Go to the bottom",
            Action::FocusNext => "Next pane",
            Action::FocusPrev => "Previous pane",
            Action::OpenDetail => "Show the task's detail",
            Action::OpenLogs => "Show the task's live log",
            Action::OpenDiff => "Show the task's diff",
            Action::OpenQuestions => "Show every pending question",
            Action::AnswerTask => "Answer the selected waiting task",
            Action::SubmitTask => "Submit a new task",
            Action::RetryTask => "Retry a failed or cancelled task",
            Action::CancelTask => "Cancel the selected task (asks first)",
            Action::RaisePriority => "Raise the priority",
            Action::LowerPriority => "Lower the priority",
            Action::AddTaskNote => "Add a note for the agent",
            Action::CycleFilter => "Filter the queue by state",
            Action::ToggleFollow => "Follow the log as it grows",
            Action::SearchLog => "Search the log",
            Action::ToggleHelp => "Help",
            Action::Quit => "Quit",
            Action::Send => "Send",
            Action::Confirm => "Yes",
            Action::Dismiss => "Cancel / close",
        }
    }

    /// One word for the hint bar.
    pub fn hint(self) -> &'static str {
        match self {
            Action::OpenDetail => "detail",
            Action::OpenLogs => "logs",
            Action::OpenDiff => "diff",
            Action::OpenQuestions => "questions",
            Action::AnswerTask => "answer",
            Action::SubmitTask => "new",
            Action::CancelTask => "cancel",
            Action::RetryTask => "retry",
            Action::CycleFilter => "filter",
            Action::AddTaskNote => "note",
            Action::ToggleHelp => "help",
            Action::Quit => "quit",
            Action::FocusNext => "pane",
            other => other.name(),
        }
    }

    pub fn from_name(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == name)
    }
}
