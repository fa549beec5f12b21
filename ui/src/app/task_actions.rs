//! What the keys that act on the selected task (or the queue) do in the normal mode: each
//! checks the task can take it, then opens its dialog or asks the queue, or says why not.

use super::*;

impl Model {
    pub(super) fn merge(&mut self) -> Vec<Effect> {
        match self.target() {
            Some(r) if r.status == TaskStatus::Done => {
                self.popup = Some(Popup::Confirm(ConfirmKind::Merge(r.id.0)));
                vec![]
            }
            Some(r) => self.say(format!(
                "task {} is {}: only a done task can be merged",
                r.id.0,
                r.display_status()
            )),
            None => self.say("no task selected".into()),
        }
    }

    pub(super) fn followup(&mut self) -> Vec<Effect> {
        match self.target() {
            Some(r) if matches!(r.status, TaskStatus::Done | TaskStatus::Failed) => {
                let title = format!(
                    " Follow up task {} in its session: what next? (Ctrl-S sends, Esc cancels) ",
                    r.id.0
                );
                self.popup = Some(Popup::Editor {
                    kind: EditorKind::Followup(r.id.0),
                    area: editor(&title),
                });
                vec![]
            }
            Some(r) => self.say(format!(
                "task {} is {}: only a done or failed task can be followed up",
                r.id.0,
                r.display_status()
            )),
            None => self.say("no task selected".into()),
        }
    }

    /// A queued task's prompt, in the editor: at once when its detail is loaded, else once it
    /// is.
    pub(super) fn edit(&mut self) -> Vec<Effect> {
        match self.target() {
            Some(r) if r.status == TaskStatus::Queued => {
                let id = r.id.0;
                match self.detail.clone().filter(|d| d.id.0 == id) {
                    Some(t) => {
                        self.edit_prompt(&t);
                        vec![]
                    }
                    None => {
                        self.edit_when_loaded = Some(id);
                        vec![Effect::LoadDetail(id)]
                    }
                }
            }
            Some(r) => self.say(format!(
                "task {} is {}: only a queued task's prompt can be edited",
                r.id.0,
                r.display_status()
            )),
            None => self.say("no task selected".into()),
        }
    }

    pub(super) fn edit_prompt(&mut self, t: &queue::Task) {
        let title = format!(" Edit task {}'s prompt (Ctrl-S saves, Esc cancels) ", t.id.0);
        let mut area = editor(&title);
        area.insert_str(&t.prompt);
        self.popup = Some(Popup::Editor { kind: EditorKind::Edit(t.id.0), area });
    }

    /// A shell in the selected task's worktree, or its diff in the editor.
    pub(super) fn outside(&mut self, what: fn(i64) -> Outside) -> Vec<Effect> {
        match self.target() {
            Some(r) => vec![Effect::Outside(what(r.id.0))],
            None => self.say("no task selected".into()),
        }
    }

    /// A decision with answers on offer opens the choice list; anything else the editor.
    pub(super) fn answer(&mut self) -> Vec<Effect> {
        match self.target() {
            Some(r) if r.status == TaskStatus::Waiting => {
                let choice = match (&r.ask, &r.question) {
                    (Some(a), _) => Choice::for_ask(r.id.0, a),
                    (None, Some(q)) => Choice::for_question(r.id.0, q),
                    (None, None) => None,
                };
                if let Some(choice) = choice {
                    self.popup = Some(Popup::Choose(Box::new(choice)));
                    return vec![];
                }
                let title = format!(
                    " Answer task {}: {} (Ctrl-S sends, Esc cancels) ",
                    r.id.0,
                    r.question.as_deref().unwrap_or("").lines().next().unwrap_or("")
                );
                self.popup =
                    Some(Popup::Editor { kind: EditorKind::Answer(r.id.0), area: editor(&title) });
                vec![]
            }
            Some(r) => self.say(format!(
                "task {} is {}: only a waiting task can be answered",
                r.id.0,
                r.display_status()
            )),
            None => self.say("no task selected".into()),
        }
    }

    /// The new-task dialog, offering the TUI's directory and the repositories of the newest
    /// tasks.
    pub(super) fn new_task(&mut self) -> Vec<Effect> {
        let mut recent = vec![self.cwd.clone()];
        for r in &self.rows {
            if recent.len() >= 6 {
                break;
            }
            if !recent.contains(&r.repo) {
                recent.push(r.repo.clone());
            }
        }
        self.popup = Some(Popup::NewTask(Box::new(NewTask::new(recent))));
        vec![]
    }

    pub(super) fn note(&mut self) -> Vec<Effect> {
        match self.target() {
            Some(r) if !r.status.is_terminal() => {
                let title = format!(" Note for task {} (Ctrl-S adds, Esc cancels) ", r.id.0);
                self.popup =
                    Some(Popup::Editor { kind: EditorKind::Note(r.id.0), area: editor(&title) });
                vec![]
            }
            Some(r) => {
                self.say(format!("task {} is {}: notes go to unfinished tasks", r.id.0, r.status))
            }
            None => self.say("no task selected".into()),
        }
    }

    pub(super) fn search(&mut self) -> Vec<Effect> {
        if self.right != RightPane::Logs {
            return self.say("open the log (l) to search it".into());
        }
        self.popup = Some(Popup::Editor {
            kind: EditorKind::Search,
            area: editor(" Search the log (Ctrl-S finds the previous match) "),
        });
        vec![]
    }

    pub(super) fn retry(&mut self) -> Vec<Effect> {
        match self.target() {
            Some(r) if matches!(r.status, TaskStatus::Failed | TaskStatus::Cancelled) => {
                vec![Effect::Queue(Op::Retry(r.id.0))]
            }
            Some(r) => self.say(format!(
                "task {} is {}: only failed or cancelled tasks can be retried",
                r.id.0,
                r.display_status()
            )),
            None => self.say("no task selected".into()),
        }
    }

    pub(super) fn cancel(&mut self) -> Vec<Effect> {
        match self.target() {
            Some(r) if !r.status.is_terminal() => {
                self.popup = Some(Popup::Confirm(ConfirmKind::Cancel(r.id.0)));
                vec![]
            }
            Some(r) => self.say(format!("task {} is already {}", r.id.0, r.status)),
            None => self.say("no task selected".into()),
        }
    }

    /// One step up or down, within the queue's bounds. The row takes the new priority at once,
    /// and keeps it through loads read before the queue took it: a second press steps from it,
    /// not from the old value (two quick `-` from 1 are -1, not 0 twice).
    pub(super) fn nudge_priority(&mut self, step: i64) -> Vec<Effect> {
        match self.target() {
            Some(r) if !r.status.is_terminal() => {
                let (id, p) = (r.id, (r.priority + step).clamp(-100, 100));
                for row in self.rows.iter_mut().filter(|row| row.id == id) {
                    row.priority = p;
                }
                self.priorities_sent += 1;
                self.pending_priorities.insert(id.0, (p, self.priorities_sent));
                vec![Effect::Queue(Op::SetPriority(id.0, p))]
            }
            Some(r) => self.say(format!("task {} is {}", r.id.0, r.status)),
            None => vec![],
        }
    }

    /// Quits at once, unless a worker this TUI started still runs tasks.
    pub(super) fn ask_to_quit(&mut self) -> Vec<Effect> {
        if self.header.worker_running > 0 {
            self.popup =
                Some(Popup::Confirm(ConfirmKind::Quit { running: self.header.worker_running }));
            vec![]
        } else {
            self.quit = true;
            vec![Effect::Quit]
        }
    }
}
