//! A waiting task's decision as an MCP elicitation: the form a client shows the person (the
//! agent's question with its options, a permission, a budget) and the answer its reply stands
//! for, in the words `answer_task` takes.
//!
//! A decision is named by its task and its round (the index of the question round that is
//! open), so a reply that arrives after the task moved on (answered in the TUI, a new question)
//! answers nothing.

use queue::{Ask, AskKind, Task, TaskId, TaskStatus};
use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction};
use serde_json::{Map, Value, json};

/// One open decision of a waiting task.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decision {
    pub task: TaskId,
    pub round: usize,
    pub ask: Ask,
    pub title: String,
}

impl Decision {
    /// The decision a task waits on, when it waits on a structured one.
    pub fn of(task: &Task) -> Option<Decision> {
        if task.status != TaskStatus::Waiting {
            return None;
        }
        let round = task.questions.len().checked_sub(1)?;
        let open = &task.questions[round];
        if open.answer.is_some() {
            return None;
        }
        // A prompt-level question has no structure: it is asked as free text.
        let ask = task.ask.clone().or_else(|| open.ask.clone()).unwrap_or_else(|| {
            Ask::question(vec![queue::AgentQuestion {
                question: open.question.clone(),
                header: None,
                options: vec![],
                multiple: false,
            }])
        });
        Some(Decision { task: task.id, round, ask, title: task.title.clone() })
    }

    /// The key this decision goes by in an `input_required` round trip and in the set of
    /// decisions already asked.
    pub fn key(&self) -> String {
        format!("task-{}-decision-{}", self.task.0, self.round)
    }

    /// Reads a key back: the task and the round it names.
    pub fn parse_key(key: &str) -> Option<(TaskId, usize)> {
        let rest = key.strip_prefix("task-")?;
        let (task, round) = rest.split_once("-decision-")?;
        Some((TaskId(task.parse().ok()?), round.parse().ok()?))
    }

    /// The elicitation form: a message a person can act on and one field per thing to decide.
    pub fn form(&self) -> ElicitRequestParams {
        let (message, schema) = self.schema();
        let params = json!({"mode": "form", "message": message, "requestedSchema": schema});
        // Built as the wire shape: every field here is one the schema type allows, so this
        // cannot fail; the fallback keeps the decision askable as free text all the same.
        serde_json::from_value(params).unwrap_or_else(|_| {
            ElicitRequestParams::FormElicitationParams {
                meta: None,
                message: self.ask.text(),
                requested_schema: serde_json::from_value(
                    json!({"type": "object", "properties": {"answer": {"type": "string"}}}),
                )
                .unwrap_or_else(|_| unreachable_schema()),
            }
        })
    }

    fn schema(&self) -> (String, Value) {
        let head = format!("Task {} ({})", self.task.0, clip(&self.title, 60));
        let mut props = Map::new();
        let mut required = vec![];
        let message = match self.ask.kind {
            AskKind::Question => {
                let many = self.ask.questions.len() > 1;
                for (i, q) in self.ask.questions.iter().enumerate() {
                    let name = if many { format!("answer_{}", i + 1) } else { "answer".into() };
                    let title = q.header.clone().unwrap_or_else(|| clip(&q.question, 80));
                    let labels: Vec<&str> = q.options.iter().map(|o| o.label.as_str()).collect();
                    if labels.is_empty() {
                        props.insert(
                            name.clone(),
                            json!({"type": "string", "title": title, "description": q.question}),
                        );
                        required.push(name);
                        continue;
                    }
                    let field = if q.multiple {
                        json!({"type": "array", "title": title, "description": q.question,
                               "items": {"type": "string", "enum": labels}})
                    } else {
                        json!({"type": "string", "title": title, "description": q.question,
                               "enum": labels})
                    };
                    props.insert(name.clone(), field);
                    // The agent takes an answer of its own words too.
                    props.insert(
                        format!("{name}_text"),
                        json!({"type": "string", "title": "Or in your own words",
                               "description": "Used instead of the choice when given"}),
                    );
                }
                let asked: Vec<&str> =
                    self.ask.questions.iter().map(|q| q.question.as_str()).collect();
                format!("{head} asks: {}", asked.join(" / "))
            }
            AskKind::Permission => {
                props.insert(
                    "decision".into(),
                    json!({"type": "string", "title": "Allow?",
                           "enum": ["once", "always", "reject"],
                           "enumNames": ["Allow once", "Allow always (this task)", "Reject"]}),
                );
                props.insert(
                    "feedback".into(),
                    json!({"type": "string", "title": "What to do instead",
                           "description": "With reject: told to the agent"}),
                );
                required.push("decision".into());
                format!("{head} asks for {}", self.ask.subject())
            }
            AskKind::Budget => {
                props.insert(
                    "decision".into(),
                    json!({"type": "string", "title": "Go on?", "enum": ["continue", "stop"],
                           "enumNames": ["Continue", "Stop"]}),
                );
                let unit = match &self.ask.budget {
                    Some(b) if b.limit == "cost" => "USD",
                    _ => "tokens",
                };
                props.insert(
                    "new_limit".into(),
                    json!({"type": "number", "title": format!("New limit ({unit})"),
                           "description": "With continue: the new limit (default: raise by the first budget)"}),
                );
                required.push("decision".into());
                format!("{head} stopped at its budget: {}", self.ask.text())
            }
        };
        let schema = json!({"type": "object", "properties": props, "required": required});
        (clip(&message, 400), schema)
    }

    /// The answer an accepted form stands for (as `answer_task` takes it), or `None` when the
    /// person chose nothing.
    pub fn answer(&self, content: &Value) -> Option<String> {
        let text = |k: &str| {
            content.get(k).and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty())
        };
        match self.ask.kind {
            AskKind::Question => {
                let many = self.ask.questions.len() > 1;
                let mut lines = vec![];
                for i in 0..self.ask.questions.len().max(1) {
                    let name = if many { format!("answer_{}", i + 1) } else { "answer".into() };
                    let own = text(&format!("{name}_text"));
                    let chosen = match content.get(&name) {
                        Some(Value::Array(a)) => {
                            let l: Vec<&str> = a.iter().filter_map(Value::as_str).collect();
                            (!l.is_empty()).then(|| l.join(", "))
                        }
                        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_owned()),
                        _ => None,
                    };
                    lines.push(own.map(str::to_owned).or(chosen)?);
                }
                Some(lines.join("\n"))
            }
            AskKind::Permission => match text("decision")? {
                "reject" => Some(match text("feedback") {
                    Some(f) => format!("reject: {f}"),
                    None => "reject".into(),
                }),
                d => Some(d.to_owned()),
            },
            AskKind::Budget => match text("decision")? {
                "continue" => Some(match content.get("new_limit").and_then(Value::as_f64) {
                    Some(n) => format!("continue {n}"),
                    None => "continue".into(),
                }),
                d => Some(d.to_owned()),
            },
        }
    }
}

/// What a client's reply to a decision's form comes to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reply {
    /// Accepted with an answer.
    Answer(String),
    /// Declined, cancelled, or accepted with nothing chosen: the task goes on waiting.
    NotAnswered(&'static str),
}

impl Reply {
    pub fn of(decision: &Decision, result: &ElicitResult) -> Reply {
        match result.action {
            ElicitationAction::Accept => {
                match result.content.as_ref().and_then(|c| decision.answer(c)) {
                    Some(a) => Reply::Answer(a),
                    None => Reply::NotAnswered("accepted with nothing chosen"),
                }
            }
            ElicitationAction::Decline => Reply::NotAnswered("declined"),
            ElicitationAction::Cancel => Reply::NotAnswered("cancelled"),
            _ => Reply::NotAnswered("answered in a way TaskBridge does not know"),
        }
    }
}

/// An `ElicitResult` from the opaque JSON an `input_required` round trip carries.
pub(crate) fn parse_result(v: &Value) -> Option<ElicitResult> {
    serde_json::from_value(v.clone()).ok()
}

fn clip(s: &str, max: usize) -> String {
    let s = s.trim();
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let cut: String = s.chars().take(max.saturating_sub(1)).collect();
    format!("{cut}…")
}

/// An empty object schema, the last resort of [`Decision::form`].
fn unreachable_schema() -> rmcp::model::ElicitationSchema {
    rmcp::model::ElicitationSchema::builder().build_unchecked()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use queue::{AgentQuestion, BudgetStop, PermissionAsk, QuestionOption};

    fn decision(ask: Ask) -> Decision {
        Decision { task: TaskId(7), round: 2, ask, title: "banner".into() }
    }

    fn question(labels: &[&str], multiple: bool) -> Ask {
        Ask::question(vec![AgentQuestion {
            question: "Which colour?".into(),
            header: None,
            options: labels
                .iter()
                .map(|l| QuestionOption { label: (*l).into(), description: None })
                .collect(),
            multiple,
        }])
    }

    fn schema_of(d: &Decision) -> Value {
        match d.form() {
            ElicitRequestParams::FormElicitationParams { message, requested_schema, .. } => {
                assert!(message.contains("Task 7 (banner)"), "{message}");
                serde_json::to_value(requested_schema).unwrap()
            }
            other => panic!("not a form: {other:?}"),
        }
    }

    #[test]
    fn keys_name_the_task_and_round_and_read_back() {
        let d = decision(question(&["red"], false));
        assert_eq!(d.key(), "task-7-decision-2");
        assert_eq!(Decision::parse_key(&d.key()), Some((TaskId(7), 2)));
        assert_eq!(Decision::parse_key("task-x-decision-2"), None);
        assert_eq!(Decision::parse_key("other"), None);
    }

    #[test]
    fn a_question_with_options_is_an_enum_and_an_own_words_field() {
        let d = decision(question(&["red", "blue"], false));
        let s = schema_of(&d);
        assert_eq!(s["properties"]["answer"]["enum"], json!(["red", "blue"]));
        assert_eq!(s["properties"]["answer_text"]["type"], "string");
        assert_eq!(d.answer(&json!({"answer": "blue"})).as_deref(), Some("blue"));
        assert_eq!(
            d.answer(&json!({"answer": "blue", "answer_text": "green"})).as_deref(),
            Some("green")
        );
        assert_eq!(d.answer(&json!({})), None);
    }

    #[test]
    fn several_choices_are_an_array_answered_as_labels() {
        let d = decision(question(&["a", "b", "c"], true));
        let s = schema_of(&d);
        assert_eq!(s["properties"]["answer"]["type"], "array");
        assert_eq!(s["properties"]["answer"]["items"]["enum"], json!(["a", "b", "c"]));
        assert_eq!(d.answer(&json!({"answer": ["a", "c"]})).as_deref(), Some("a, c"));
        assert_eq!(d.answer(&json!({"answer": []})), None);
    }

    #[test]
    fn a_free_text_question_requires_its_text() {
        let d = decision(question(&[], false));
        let s = schema_of(&d);
        assert_eq!(s["required"], json!(["answer"]));
        assert_eq!(
            d.answer(&json!({"answer": " Blue, please. "})).as_deref(),
            Some("Blue, please.")
        );
    }

    #[test]
    fn several_questions_answer_one_line_each() {
        let mut ask = question(&["x", "y"], false);
        ask.questions.push(AgentQuestion {
            question: "Why?".into(),
            header: None,
            options: vec![],
            multiple: false,
        });
        let d = decision(ask);
        let s = schema_of(&d);
        assert!(
            s["properties"].get("answer_1").is_some() && s["properties"].get("answer_2").is_some()
        );
        assert_eq!(
            d.answer(&json!({"answer_1": "y", "answer_2": "because"})).as_deref(),
            Some("y\nbecause")
        );
        assert_eq!(d.answer(&json!({"answer_1": "y"})), None, "every question needs an answer");
    }

    #[test]
    fn a_permission_is_once_always_reject_or_reject_with_feedback() {
        let d = decision(Ask::permission(PermissionAsk {
            permission: "bash".into(),
            patterns: vec!["git push".into()],
            target: Some("git push".into()),
            always: vec![],
        }));
        let s = schema_of(&d);
        assert_eq!(s["properties"]["decision"]["enum"], json!(["once", "always", "reject"]));
        assert_eq!(d.answer(&json!({"decision": "always"})).as_deref(), Some("always"));
        assert_eq!(d.answer(&json!({"decision": "reject"})).as_deref(), Some("reject"));
        assert_eq!(
            d.answer(&json!({"decision": "reject", "feedback": "commit only"})).as_deref(),
            Some("reject: commit only")
        );
        // What the form gives, the queue takes.
        for a in ["once", "always", "reject: commit only"] {
            assert!(d.ask.parse_answer(a).is_ok(), "{a}");
        }
    }

    #[test]
    fn a_budget_is_continue_with_an_optional_limit_or_stop() {
        let d = decision(Ask::budget(BudgetStop {
            limit: "cost".into(),
            scope: "task".into(),
            spent: 1.2,
            max: 1.0,
            original: 1.0,
        }));
        let s = schema_of(&d);
        assert_eq!(s["properties"]["decision"]["enum"], json!(["continue", "stop"]));
        assert!(s["properties"]["new_limit"]["title"].as_str().unwrap().contains("USD"));
        assert_eq!(d.answer(&json!({"decision": "continue"})).as_deref(), Some("continue"));
        assert_eq!(
            d.answer(&json!({"decision": "continue", "new_limit": 3.5})).as_deref(),
            Some("continue 3.5")
        );
        assert_eq!(d.answer(&json!({"decision": "stop"})).as_deref(), Some("stop"));
        assert!(d.ask.parse_answer("continue 3.5").is_ok());
    }

    #[test]
    fn replies_answer_only_when_accepted_with_a_choice() {
        let d = decision(question(&["red", "blue"], false));
        let result = |v: Value| parse_result(&v).unwrap();
        assert_eq!(
            Reply::of(&d, &result(json!({"action": "accept", "content": {"answer": "red"}}))),
            Reply::Answer("red".into())
        );
        assert_eq!(
            Reply::of(&d, &result(json!({"action": "decline"}))),
            Reply::NotAnswered("declined")
        );
        assert_eq!(
            Reply::of(&d, &result(json!({"action": "cancel"}))),
            Reply::NotAnswered("cancelled")
        );
        assert_eq!(
            Reply::of(&d, &result(json!({"action": "accept", "content": {}}))),
            Reply::NotAnswered("accepted with nothing chosen")
        );
    }
}
