//! The server's event stream, read for one turn of one session: which events are the turn's
//! (its session and the sessions its agent started), the decisions the agent blocks on, and what
//! it did, as agent events (`crate::events::AgentEvent`, through the same reading of a finished
//! part as `opencode run`'s lines get), so the readable log and the run's usage read the same in
//! both of OpenCode's modes. The raw event file keeps the server's own events that said
//! something.

use crate::events::{AgentEvent, PartKind, RunLog, Usage, agent_error, part_event};
use crate::logs::TaskLog;
use queue::{AgentQuestion, Ask, PermissionAsk, QuestionOption};
use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// One turn's reading of the stream.
pub(super) struct Following {
    session: String,
    state: TurnState,
    run: RunLog,
    /// Sessions the agent started itself (its `task` tool), which ask through the same requests.
    children: HashSet<String>,
}

impl Following {
    pub(super) fn new(session: &str) -> Self {
        Following {
            session: session.to_owned(),
            state: TurnState::default(),
            run: RunLog { session_id: Some(session.to_owned()), ..Default::default() },
            children: HashSet::new(),
        }
    }

    pub(super) fn session(&self) -> &str {
        &self.session
    }

    /// The agent is mid-turn already (blocked on the request an answer went to).
    pub(super) fn busy(&mut self) {
        self.state.busy = true;
    }

    /// A new server goes on with the session: what the old stream said of the turn is over.
    pub(super) fn restart(&mut self) {
        self.state = TurnState::default();
    }

    /// Whether the session went idle after the turn was busy.
    pub(super) fn finished(&self) -> bool {
        self.state.finished
    }

    pub(super) fn into_run(self) -> RunLog {
        self.run
    }

    /// Whether `ev` belongs to this turn: its session's, or a request of a session its agent
    /// started. Notes the sessions started and the model the server chose on the way.
    pub(super) fn ours(&mut self, ev: &Value) -> bool {
        if let (Some(child), Some(parent)) = (
            ev.pointer("/properties/info/id").and_then(Value::as_str),
            ev.pointer("/properties/info/parentID").and_then(Value::as_str),
        ) && (parent == self.session || self.children.contains(parent))
        {
            self.children.insert(child.to_owned());
        }
        let from = ev.pointer("/properties/sessionID").and_then(Value::as_str);
        let asks = matches!(ev["type"].as_str(), Some("question.asked" | "permission.asked"));
        let ours = from == Some(self.session.as_str())
            || (asks && from.is_some_and(|f| self.children.contains(f)));
        if !ours {
            return false;
        }
        // The model the server chose, its own default when none was named, as `--print-logs`
        // tells it in `run` mode.
        if self.run.model_seen.is_none()
            && let (Some(p), Some(m)) = (
                ev.pointer("/properties/info/model/providerID").and_then(Value::as_str),
                ev.pointer("/properties/info/model/modelID").and_then(Value::as_str),
            )
        {
            self.run.model_seen = Some(format!("{p}/{m}"));
        }
        true
    }

    /// Folds an event of this turn into the log and the run; the run's usage so far when it
    /// finished a step.
    pub(super) fn read(&mut self, ev: &Value, log: &mut TaskLog) -> Option<&Usage> {
        let events = self.state.events(ev, log);
        if events.is_empty() {
            return None;
        }
        log.raw(&ev.to_string());
        self.run.events += 1;
        let steps = self.run.usage.steps;
        for e in events {
            if let Some(text) = self.run.apply(e) {
                log.line(&text);
            }
        }
        (self.run.usage.steps != steps).then_some(&self.run.usage)
    }
}

/// Whether `ev` says that `session`'s agent began a step: the model has been asked.
pub(super) fn step_started(ev: &Value, session: &str) -> bool {
    ev["type"] == "message.part.updated"
        && ev.pointer("/properties/sessionID").and_then(Value::as_str) == Some(session)
        && ev.pointer("/properties/part/type").and_then(Value::as_str) == Some("step-start")
}

/// The decision an event asks for: the agent's question, or a permission request.
pub(super) fn decision(ev: &Value) -> Option<Ask> {
    let props = &ev["properties"];
    match ev["type"].as_str()? {
        "question.asked" => Some(Ask::question(questions_of(props))),
        "permission.asked" => Some(Ask::permission(permission_of(props))),
        _ => None,
    }
}

/// The agent's questions from a `question.asked` event.
fn questions_of(props: &Value) -> Vec<AgentQuestion> {
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    props["questions"]
        .as_array()
        .map(|qs| {
            qs.iter()
                .map(|q| AgentQuestion {
                    question: text(q, "question").unwrap_or_default(),
                    header: text(q, "header"),
                    options: q["options"]
                        .as_array()
                        .map(|os| {
                            os.iter()
                                .map(|o| QuestionOption {
                                    label: text(o, "label").unwrap_or_default(),
                                    description: text(o, "description"),
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                    multiple: q["multiple"].as_bool().unwrap_or(false),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The permission a `permission.asked` event asks for.
fn permission_of(props: &Value) -> PermissionAsk {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let patterns = strings(&props["patterns"]);
    let target = ["command", "filepath", "filePath", "path", "url", "pattern"]
        .iter()
        .find_map(|k| props.pointer(&format!("/metadata/{k}")).and_then(Value::as_str))
        .map(str::to_owned)
        .or_else(|| (!patterns.is_empty()).then(|| patterns.join(", ")));
    PermissionAsk {
        permission: props["permission"].as_str().unwrap_or("?").to_owned(),
        patterns,
        target,
        always: strings(&props["always"]),
    }
}

/// What a turn's events have said so far, to turn them into `run --format json` lines.
#[derive(Default)]
struct TurnState {
    roles: HashMap<String, String>,
    running_tools: HashSet<String>,
    busy: bool,
    finished: bool,
}

impl TurnState {
    /// What `ev` says the agent did: a finished part of its own messages (not the user's, not
    /// one still being written), or the session's error. Notes the turn's start and end.
    fn events(&mut self, ev: &Value, log: &mut TaskLog) -> Vec<AgentEvent> {
        let props = &ev["properties"];
        match ev["type"].as_str().unwrap_or("") {
            "message.updated" => {
                if let (Some(id), Some(role)) = (
                    props.pointer("/info/id").and_then(Value::as_str),
                    props.pointer("/info/role").and_then(Value::as_str),
                ) {
                    self.roles.insert(id.to_owned(), role.to_owned());
                }
                vec![]
            }
            "message.part.updated" => {
                let part = &props["part"];
                let message = part["messageID"].as_str().unwrap_or("");
                if self.roles.get(message).map(String::as_str) == Some("user") {
                    return vec![];
                }
                let kind = match part["type"].as_str().unwrap_or("") {
                    "step-start" => PartKind::StepStart,
                    "step-finish" => PartKind::StepFinish,
                    "text" if part.pointer("/time/end").is_some() => PartKind::Text,
                    "reasoning" if part.pointer("/time/end").is_some() => PartKind::Reasoning,
                    "tool" => match part.pointer("/state/status").and_then(Value::as_str) {
                        Some("running") => {
                            let call = part["callID"].as_str().unwrap_or("").to_owned();
                            if self.running_tools.insert(call) {
                                let t = crate::events::tool_call(part);
                                log.line(&format!("tool {}: {} (running)", t.tool, t.target));
                            }
                            return vec![];
                        }
                        Some("completed") | Some("error") => PartKind::Tool,
                        _ => return vec![],
                    },
                    _ => return vec![],
                };
                vec![part_event(kind, part)]
            }
            "session.status" => {
                match props.pointer("/status/type").and_then(Value::as_str) {
                    Some("busy") => self.busy = true,
                    Some("idle") if self.busy => self.finished = true,
                    _ => {}
                }
                vec![]
            }
            "session.idle" if self.busy => {
                self.finished = true;
                vec![]
            }
            "session.error" => vec![AgentEvent::Error(agent_error(&props["error"]))],
            _ => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn questions_and_permissions_are_read_from_opencodes_events() {
        let qs = questions_of(&json!({"questions": [
            {"question": "Which DB?", "header": "DB", "multiple": true,
             "options": [{"label": "SQLite", "description": "a file"}, {"label": "Postgres"}]},
            {"question": "Go?"},
        ]}));
        assert_eq!(qs.len(), 2);
        assert_eq!(
            (qs[0].question.as_str(), qs[0].header.as_deref(), qs[0].multiple),
            ("Which DB?", Some("DB"), true)
        );
        assert_eq!(
            qs[0]
                .options
                .iter()
                .map(|o| (o.label.as_str(), o.description.as_deref()))
                .collect::<Vec<_>>(),
            vec![("SQLite", Some("a file")), ("Postgres", None)]
        );
        assert_eq!((qs[1].header.clone(), qs[1].options.len(), qs[1].multiple), (None, 0, false));
        assert!(questions_of(&json!({})).is_empty());

        let p = permission_of(&json!({"permission": "bash", "patterns": ["git push *", 3],
            "always": ["git push *"], "metadata": {"command": "git push origin"}}));
        assert_eq!(
            p,
            PermissionAsk {
                permission: "bash".into(),
                patterns: vec!["git push *".into()],
                target: Some("git push origin".into()),
                always: vec!["git push *".into()],
            }
        );
        let p = permission_of(&json!({"permission": "edit", "patterns": ["a.rs", "b.rs"]}));
        assert_eq!(p.target.as_deref(), Some("a.rs, b.rs"), "the patterns when no metadata says");
        let p = permission_of(&json!({"metadata": {"filePath": "/x"}}));
        assert_eq!((p.permission.as_str(), p.target.as_deref()), ("?", Some("/x")));
        assert_eq!(permission_of(&json!({})).target, None);
    }

    fn turn() -> TurnState {
        TurnState {
            roles: HashMap::new(),
            running_tools: HashSet::new(),
            busy: false,
            finished: false,
        }
    }

    #[test]
    fn a_turn_becomes_agent_events_and_ends_when_the_busy_session_goes_idle() {
        let logs = tempfile::tempdir().unwrap();
        let mut log = TaskLog::open(logs.path(), 1);
        let mut t = turn();
        let ev = |ty: &str, props: Value| json!({"type": ty, "properties": props});
        let part = |p: Value| ev("message.part.updated", json!({"part": p}));
        // Idle before the turn was busy is the previous turn's end.
        assert!(t.events(&ev("session.idle", json!({})), &mut log).is_empty());
        t.events(&ev("session.status", json!({"status": {"type": "idle"}})), &mut log);
        assert!(!t.finished);
        t.events(&ev("message.updated", json!({"info": {"id": "u1", "role": "user"}})), &mut log);
        t.events(
            &ev("message.updated", json!({"info": {"id": "a1", "role": "assistant"}})),
            &mut log,
        );
        assert!(
            t.events(
                &part(json!({"messageID": "u1", "type": "text", "time": {"end": 1}})),
                &mut log
            )
            .is_empty(),
            "the user's own text is no output"
        );
        assert_eq!(
            t.events(&part(json!({"messageID": "a1", "type": "step-start"})), &mut log),
            [AgentEvent::StepStarted]
        );
        assert!(
            t.events(&part(json!({"messageID": "a1", "type": "text", "time": {}})), &mut log)
                .is_empty(),
            "text still being written"
        );
        let done = |ty: &str| {
            part(json!({"messageID": "a1", "type": ty, "text": "hm", "time": {"end": 2}}))
        };
        assert_eq!(t.events(&done("text"), &mut log), [AgentEvent::Text("hm".into())]);
        assert_eq!(t.events(&done("reasoning"), &mut log), [AgentEvent::Thinking("hm".into())]);
        let unfinished = part(json!({"messageID": "a1", "type": "reasoning", "time": {}}));
        assert!(t.events(&unfinished, &mut log).is_empty(), "reasoning still being written");
        let tool = |status: &str| {
            part(
                json!({"messageID": "a1", "type": "tool", "callID": "c1", "tool": "bash", "state": {"status": status, "input": {"command": "ls"}}}),
            )
        };
        assert!(t.events(&tool("running"), &mut log).is_empty());
        assert!(t.events(&tool("running"), &mut log).is_empty());
        assert!(t.events(&tool("pending"), &mut log).is_empty());
        for status in ["completed", "error"] {
            let got = t.events(&tool(status), &mut log);
            assert!(
                matches!(&got[..], [AgentEvent::ToolEnded { call, .. }] if call.tool == "bash" && call.target == "ls"),
                "{got:?}"
            );
        }
        let finish = part(json!({"messageID": "a1", "type": "step-finish", "reason": "stop"}));
        assert!(matches!(
            &t.events(&finish, &mut log)[..],
            [AgentEvent::Usage { usage, reason: Some(r) }] if usage.steps == 1 && r == "stop"
        ));
        let err = t.events(&ev("session.error", json!({"error": {"name": "APIError"}})), &mut log);
        assert!(matches!(&err[..], [AgentEvent::Error(_)]), "{err:?}");
        assert!(t.events(&ev("other", json!({})), &mut log).is_empty());
        // The running tool was logged once, by name and target.
        let text =
            std::fs::read_to_string(crate::logs::log_path(logs.path(), 1)).unwrap_or_default();
        assert_eq!(text.matches("(running)").count(), 1, "{text}");
        assert!(!t.finished);
        t.events(&ev("session.status", json!({"status": {"type": "busy"}})), &mut log);
        t.events(&ev("session.status", json!({"status": {"type": "idle"}})), &mut log);
        assert!(t.finished);
        let mut t2 = turn();
        t2.busy = true;
        t2.events(&ev("session.idle", json!({})), &mut log);
        assert!(t2.finished, "session.idle ends a busy turn too");
    }

    #[test]
    fn a_turn_follows_its_session_and_the_requests_of_the_sessions_its_agent_started() {
        let mut f = Following::new("s");
        let ev = |ty: &str, props: Value| json!({"type": ty, "properties": props});
        assert!(f.ours(&ev("message.updated", json!({"sessionID": "s"}))));
        assert!(!f.ours(&ev("message.updated", json!({"sessionID": "other"}))));
        assert!(!f.ours(&ev("message.updated", json!({}))), "an event of no session");
        // The agent starts a session (its task tool), which starts another.
        assert!(!f.ours(&ev("session.created", json!({"info": {"id": "c1", "parentID": "s"}}))));
        f.ours(&ev("session.created", json!({"info": {"id": "c2", "parentID": "c1"}})));
        f.ours(&ev("session.created", json!({"info": {"id": "x", "parentID": "nobody"}})));
        for child in ["c1", "c2"] {
            assert!(f.ours(&ev("question.asked", json!({"sessionID": child}))), "{child}");
            assert!(f.ours(&ev("permission.asked", json!({"sessionID": child}))), "{child}");
            assert!(!f.ours(&ev("message.updated", json!({"sessionID": child}))), "{child}");
        }
        assert!(!f.ours(&ev("question.asked", json!({"sessionID": "x"}))), "not our agent's");
        // The first model the session names is the one seen.
        let model = |p: &str, m: &str| {
            ev(
                "message.updated",
                json!({"sessionID": "s", "info": {"model": {"providerID": p, "modelID": m}}}),
            )
        };
        assert!(f.ours(&ev(
            "message.updated",
            json!({"sessionID": "s", "info": {"model": {"providerID": "p"}}})
        )));
        assert_eq!(f.run.model_seen, None, "a model needs both its names");
        f.ours(&model("mock", "one"));
        f.ours(&model("mock", "two"));
        assert_eq!(f.into_run().model_seen.as_deref(), Some("mock/one"));
    }

    #[test]
    fn a_turns_events_go_into_the_raw_log_and_the_run_and_a_step_reports_its_usage() {
        let logs = tempfile::tempdir().unwrap();
        let mut log = TaskLog::open(logs.path(), 1);
        let mut f = Following::new("s");
        assert_eq!(f.session(), "s");
        let part = |p: Value| json!({"type": "message.part.updated", "properties": {"sessionID": "s", "part": p}});
        assert!(f.read(&part(json!({"type": "step-start"})), &mut log).is_none());
        let text = part(json!({"type": "text", "text": "Done.", "time": {"end": 1}}));
        assert!(f.read(&text, &mut log).is_none(), "text is no step");
        let finish = part(json!({"type": "step-finish", "reason": "stop", "cost": 0.5,
            "tokens": {"input": 7, "output": 3}}));
        let usage = f.read(&finish, &mut log).unwrap();
        assert_eq!((usage.steps, usage.input_tokens, usage.cost_usd), (1, 7, Some(0.5)));
        assert_eq!(f.read(&finish, &mut log).unwrap().steps, 2);
        let raw =
            std::fs::read_to_string(crate::logs::events_path(logs.path(), 1)).unwrap_or_default();
        assert_eq!(raw.lines().count(), 4, "{raw}");
        assert!(raw.lines().all(|l| l.contains(r#""sessionID":"s""#)), "{raw}");
        let readable = std::fs::read_to_string(crate::logs::log_path(logs.path(), 1)).unwrap();
        assert!(readable.contains("agent: Done."), "{readable}");
        assert!(!f.finished());
        let status = |t: &str| json!({"type": "session.status", "properties": {"sessionID": "s", "status": {"type": t}}});
        f.read(&status("idle"), &mut log);
        assert!(!f.finished(), "idle before busy is the previous turn's end");
        f.busy();
        f.read(&status("idle"), &mut log);
        assert!(f.finished(), "an answered request's turn was busy already");
        f.restart();
        assert!(!f.finished(), "a new server's stream starts the turn's reading afresh");
        let run = f.into_run();
        assert_eq!(run.final_text(), "Done.", "what the run read is kept");
        assert_eq!(run.events, 4, "each event that said something is counted");
    }

    #[test]
    fn an_event_asks_a_question_or_a_permission_or_nothing() {
        let ev = |ty: &str, props: Value| json!({"type": ty, "properties": props});
        let q = decision(&ev("question.asked", json!({"questions": [{"question": "Go?"}]})));
        let q = q.unwrap();
        assert_eq!((q.questions[0].question.as_str(), q.permission.is_none()), ("Go?", true));
        let p = decision(&ev("permission.asked", json!({"permission": "bash"}))).unwrap();
        assert_eq!(p.permission.map(|p| p.permission).as_deref(), Some("bash"));
        assert!(decision(&ev("session.idle", json!({}))).is_none());
        assert!(decision(&json!({})).is_none());
    }

    #[test]
    fn a_step_started_is_the_sessions_own_step_start_part_and_nothing_else() {
        let part = |session: &str, ty: &str| {
            json!({"type": "message.part.updated",
                   "properties": {"sessionID": session, "part": {"type": ty}}})
        };
        assert!(step_started(&part("s", "step-start"), "s"));
        assert!(!step_started(&part("other", "step-start"), "s"), "another session's");
        assert!(!step_started(&part("s", "text"), "s"), "not a step's start");
        let updated = json!({"type": "message.updated",
                             "properties": {"sessionID": "s", "part": {"type": "step-start"}}});
        assert!(!step_started(&updated, "s"), "not a part's event");
    }
}
