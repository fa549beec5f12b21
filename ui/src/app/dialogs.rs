//! The dialogs: the choice list an agent's decision offers, the new-task form, confirmations
//! and the text editors (answers, notes, follow-ups, the log search), with what each does with
//! the actions it gets.

use super::*;

/// One answer on offer in the choice list.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceItem {
    pub label: String,
    pub description: Option<String>,
    /// What choosing it sends; `None` opens the editor with `prefill` (free text, feedback, a
    /// new limit).
    pub send: Option<String>,
    pub prefill: String,
}

/// Answering a decision that offers options: the agent's own, a permission's, a budget's.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub id: i64,
    pub question: String,
    pub header: Option<String>,
    pub items: Vec<ChoiceItem>,
    /// Several options may be picked (space), then sent together (enter).
    pub multiple: bool,
    pub sel: usize,
    pub picked: std::collections::BTreeSet<usize>,
}

impl Choice {
    /// The list for a question the agent asked in its answer with options (no native ask
    /// behind it), or `None` when it offers none.
    pub fn for_question(id: i64, question: &str) -> Option<Choice> {
        let (text, options) = worker::question_options(question)?;
        let mut items: Vec<ChoiceItem> = options
            .iter()
            .map(|o| ChoiceItem {
                label: (*o).to_owned(),
                description: None,
                send: Some((*o).to_owned()),
                prefill: String::new(),
            })
            .collect();
        items.push(ChoiceItem {
            label: "Type my own answer…".into(),
            description: Some("free text, in the editor".into()),
            send: None,
            prefill: String::new(),
        });
        Some(Choice {
            id,
            question: text.to_owned(),
            header: None,
            items,
            multiple: false,
            sel: 0,
            picked: Default::default(),
        })
    }

    /// The list for `ask`, or `None` when it is best answered in the editor (no options, or
    /// several questions at once).
    pub fn for_ask(id: i64, ask: &queue::Ask) -> Option<Choice> {
        use queue::AskKind;
        let item = |label: &str, description: &str, send: Option<&str>, prefill: &str| ChoiceItem {
            label: label.into(),
            description: Some(description.into()),
            send: send.map(str::to_owned),
            prefill: prefill.into(),
        };
        let (header, items, multiple) = match ask.kind {
            AskKind::Question => {
                let [q] = ask.questions.as_slice() else { return None };
                if q.options.is_empty() {
                    return None;
                }
                let mut items: Vec<ChoiceItem> = q
                    .options
                    .iter()
                    .map(|o| ChoiceItem {
                        label: o.label.clone(),
                        description: o.description.clone(),
                        send: Some(o.label.clone()),
                        prefill: String::new(),
                    })
                    .collect();
                items.push(item("Type my own answer…", "free text, in the editor", None, ""));
                (q.header.clone(), items, q.multiple)
            }
            AskKind::Permission => (
                Some("Permission".into()),
                vec![
                    item("once", "allow this request", Some("once"), ""),
                    item("always", "allow it for the rest of this task", Some("always"), ""),
                    item("reject", "refuse, and stop the agent's turn", Some("reject"), ""),
                    item(
                        "reject with feedback…",
                        "refuse, and tell the agent what to do instead",
                        None,
                        "reject: ",
                    ),
                ],
                false,
            ),
            AskKind::Budget => (
                Some("Budget".into()),
                vec![
                    item(
                        "continue",
                        "raise the limit by the original budget",
                        Some("continue"),
                        "",
                    ),
                    item("continue with a new limit…", "type the new limit", None, "continue "),
                    item("stop", "fail the task; its work stays on its branch", Some("stop"), ""),
                ],
                false,
            ),
        };
        Some(Choice {
            id,
            question: ask.text(),
            header,
            items,
            multiple,
            sel: 0,
            picked: Default::default(),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewTaskField {
    Repo,
    Prompt,
}

/// The new-task dialog: which repository (the TUI's directory by default, recently used ones a
/// key away) and the prompt. It stays open until the queue accepts the task, so a repository
/// that is refused loses nothing typed.
pub struct NewTask {
    pub repo: TextArea<'static>,
    pub prompt: TextArea<'static>,
    pub field: NewTaskField,
    /// The TUI's directory first, then the repositories of the newest tasks.
    pub recent: Vec<String>,
    pub recent_at: usize,
    /// Sent; waiting for the queue's answer.
    pub sending: bool,
}

impl NewTask {
    pub(super) fn new(recent: Vec<String>) -> NewTask {
        let mut repo = TextArea::from([recent.first().cloned().unwrap_or_default()]);
        repo.set_block(
            ratatui::widgets::Block::bordered()
                .title(" Repository (Tab: prompt; Ctrl-R: a recent one) "),
        );
        repo.move_cursor(ratatui_textarea::CursorMove::End);
        let mut prompt = TextArea::default();
        prompt.set_block(
            ratatui::widgets::Block::bordered()
                .title(" New task: what should the agent do? (Ctrl-S submits, Esc cancels) "),
        );
        NewTask { repo, prompt, field: NewTaskField::Prompt, recent, recent_at: 0, sending: false }
    }

    pub fn repo_text(&self) -> String {
        self.repo.lines().join("").trim().to_owned()
    }
}

impl Model {
    pub(super) fn update_confirm(&mut self, action: Action) -> Vec<Effect> {
        let Some(Popup::Confirm(kind)) = self.popup.take() else { return vec![] };
        match (action, kind) {
            (Action::Confirm, ConfirmKind::Cancel(id)) => vec![Effect::Queue(Op::Cancel(id))],
            (Action::Confirm, ConfirmKind::Merge(id)) => vec![Effect::Queue(Op::Merge(id))],
            (Action::Confirm, ConfirmKind::Quit { .. }) => {
                self.quit = true;
                vec![Effect::Quit]
            }
            (Action::Dismiss, _) => vec![],
            _ => {
                self.popup = Some(Popup::Confirm(kind));
                vec![]
            }
        }
    }

    pub(super) fn update_new_task(&mut self, action: Action) -> Vec<Effect> {
        let Some(Popup::NewTask(form)) = &mut self.popup else { return vec![] };
        match action {
            Action::Dismiss => {
                self.popup = None;
                vec![]
            }
            _ if form.sending => vec![],
            Action::NextField => {
                form.field = match form.field {
                    NewTaskField::Repo => NewTaskField::Prompt,
                    NewTaskField::Prompt => NewTaskField::Repo,
                };
                vec![]
            }
            Action::CycleRepo => {
                if !form.recent.is_empty() {
                    form.recent_at = (form.recent_at + 1) % form.recent.len();
                    form.repo = {
                        let mut t = TextArea::from([form.recent[form.recent_at].clone()]);
                        t.set_block(ratatui::widgets::Block::bordered().title(format!(
                            " Repository {}/{} (Tab: prompt; Ctrl-R: a recent one) ",
                            form.recent_at + 1,
                            form.recent.len()
                        )));
                        t.move_cursor(ratatui_textarea::CursorMove::End);
                        t
                    };
                }
                vec![]
            }
            Action::Send => {
                let prompt = form.prompt.lines().join("\n");
                let repo = form.repo_text();
                if repo.is_empty() {
                    form.field = NewTaskField::Repo;
                    return self.say("which repository? type its path (Tab moves to it)".into());
                }
                if prompt.trim().is_empty() {
                    form.field = NewTaskField::Prompt;
                    return self.say("nothing to submit: type the task, or Esc to cancel".into());
                }
                form.sending = true;
                vec![Effect::Queue(Op::Submit { prompt, repo })]
            }
            _ => vec![],
        }
    }

    pub(super) fn update_choice(&mut self, action: Action) -> Vec<Effect> {
        let Some(Popup::Choose(mut c)) = self.popup.take() else { return vec![] };
        let n = c.items.len();
        match action {
            Action::SelectNext => c.sel = (c.sel + 1).min(n.saturating_sub(1)),
            Action::SelectPrev => c.sel = c.sel.saturating_sub(1),
            Action::ToggleChoice if c.multiple && c.items[c.sel].send.is_some() => {
                let sel = c.sel;
                if c.picked.contains(&sel) {
                    c.picked.remove(&sel);
                } else {
                    c.picked.insert(sel);
                }
            }
            Action::ToggleChoice => {
                self.popup = Some(Popup::Choose(c));
                return self.say("only one may be chosen: Enter sends it".into());
            }
            Action::Send => {
                let answer = if c.multiple && !c.picked.is_empty() {
                    let labels: Vec<&str> =
                        c.picked.iter().filter_map(|&i| c.items[i].send.as_deref()).collect();
                    Some(labels.join(", "))
                } else {
                    c.items[c.sel].send.clone()
                };
                return match answer {
                    Some(a) => vec![Effect::Queue(Op::Answer(c.id, a))],
                    None => {
                        let prefill = c.items[c.sel].prefill.clone();
                        self.answer_editor(c.id, &c.question, &prefill);
                        vec![]
                    }
                };
            }
            Action::WriteAnswer => {
                let prefill = c.items[c.sel].prefill.clone();
                self.answer_editor(c.id, &c.question, &prefill);
                return vec![];
            }
            Action::Dismiss => return vec![],
            _ => {}
        }
        self.popup = Some(Popup::Choose(c));
        vec![]
    }

    pub(super) fn answer_editor(&mut self, id: i64, question: &str, prefill: &str) {
        let title = format!(
            " Answer task {id}: {} (Ctrl-S sends, Esc cancels) ",
            question.lines().next().unwrap_or("")
        );
        let mut area = editor(&title);
        area.insert_str(prefill);
        self.popup = Some(Popup::Editor { kind: EditorKind::Answer(id), area });
    }

    pub(super) fn update_editor(&mut self, action: Action) -> Vec<Effect> {
        if matches!(self.popup, Some(Popup::NewTask(_))) {
            return self.update_new_task(action);
        }
        match action {
            Action::Dismiss => {
                self.popup = None;
                vec![]
            }
            Action::Send => {
                let Some(Popup::Editor { kind, area }) = self.popup.take() else { return vec![] };
                let text = area.lines().join("\n");
                if text.trim().is_empty() && kind != EditorKind::Search {
                    self.popup = Some(Popup::Editor { kind, area });
                    return self.say("nothing to send: type something, or Esc to cancel".into());
                }
                match kind {
                    EditorKind::Answer(id) => vec![Effect::Queue(Op::Answer(id, text))],
                    EditorKind::Note(id) => vec![Effect::Queue(Op::Note(id, text))],
                    EditorKind::Followup(id) => vec![Effect::Queue(Op::Followup(id, text))],
                    EditorKind::Edit(id) => vec![Effect::Queue(Op::Edit(id, text))],
                    EditorKind::Search => {
                        self.search_log(text.trim());
                        vec![]
                    }
                }
            }
            _ => vec![],
        }
    }

    /// Scrolls to the previous (older) line containing `needle`, from the current position.
    pub(super) fn search_log(&mut self, needle: &str) {
        if needle.is_empty() {
            self.log.search = None;
            return;
        }
        self.log.search = Some(needle.to_owned());
        let n = self.log.lines.len();
        let bottom = n.saturating_sub(1 + self.log.scroll);
        let start = if self.log.scroll == 0 { bottom } else { bottom.saturating_sub(1) };
        let found = (0..=start.min(n.saturating_sub(1)))
            .rev()
            .find(|&i| self.log.lines[i].contains(needle));
        match found {
            Some(i) => {
                self.log.follow = false;
                self.log.scroll = n - 1 - i;
            }
            None => self.message = Some(format!("'{needle}' not found above")),
        }
    }
}
