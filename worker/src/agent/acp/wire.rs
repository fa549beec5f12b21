//! What an ACP agent says, read into TaskBridge's terms, and what TaskBridge answers, written in
//! the agent's: `session/update` notifications become [`AgentEvent`]s, a
//! `session/request_permission` becomes the tool use the task's rules decide, an
//! `elicitation/create` form (OpenCode 2's `question` tool) becomes the agent's questions, and an
//! answer becomes the response the agent waits for. Pure functions of JSON, read leniently: the
//! agents differ in what they fill in (OpenCode 2 names the tool, 1.x only its kind and title).

use crate::events::{AgentEvent, ToolCall, Usage};
use crate::policy::{Decision, ToolUse};
use queue::{AgentQuestion, Answer, Ask, QuestionOption};
use serde_json::{Value, json};
use std::collections::HashMap;

/// Folds a turn's `session/update`s into events: message chunks are joined into one text per
/// message (a new message after a tool call is a new step, as OpenCode's own steps are), tool
/// calls are followed from their start to their end, and the session's running cost is read.
#[derive(Debug, Default)]
pub struct Updates {
    /// The message being streamed: its id and the text so far.
    text: Option<(String, String)>,
    thought: String,
    /// Tool calls started and not yet ended: (tool, target).
    tools: HashMap<String, (String, String)>,
    /// Whether a tool ran since the last message: the next message is a new step.
    tool_since_text: bool,
    /// Assistant message ids in the order they began: OpenCode's steps.
    pub messages: Vec<String>,
    /// The session's cost as the agent last reported it (`usage_update`: the session's total).
    pub session_cost: Option<f64>,
}

impl Updates {
    /// The events one update carries. A text is given whole when its message ends (another
    /// update arrives, or the turn ends: [`Updates::flush`]).
    pub fn read(&mut self, update: &Value) -> Vec<AgentEvent> {
        let kind = update.get("sessionUpdate").and_then(Value::as_str).unwrap_or("");
        let mut out = Vec::new();
        match kind {
            "agent_message_chunk" => {
                let id = update.get("messageId").and_then(Value::as_str).unwrap_or("").to_owned();
                let chunk = chunk_text(update);
                if self.text.as_ref().is_some_and(|(m, _)| *m != id) {
                    out.extend(self.flush());
                }
                if self.text.is_none() {
                    out.extend(self.flush_thought());
                    if self.tool_since_text || self.messages.is_empty() {
                        out.push(AgentEvent::StepStarted);
                    }
                    self.tool_since_text = false;
                    if !id.is_empty() && !self.messages.contains(&id) {
                        self.messages.push(id.clone());
                    }
                    self.text = Some((id, String::new()));
                }
                if let Some((_, text)) = &mut self.text {
                    text.push_str(&chunk);
                }
            }
            "agent_thought_chunk" => {
                out.extend(self.flush());
                self.thought.push_str(&chunk_text(update));
            }
            "tool_call" | "tool_call_update" => {
                out.extend(self.flush());
                out.extend(self.flush_thought());
                out.extend(self.tool(update, kind == "tool_call"));
            }
            "usage_update" => {
                if let Some(c) = update.pointer("/cost/amount").and_then(Value::as_f64) {
                    self.session_cost = Some(c);
                }
            }
            _ => {}
        }
        out
    }

    /// The text of the message being streamed, whole: the turn ended or moved on.
    pub fn flush(&mut self) -> Vec<AgentEvent> {
        match self.text.take() {
            Some((_, text)) if !text.trim().is_empty() => vec![AgentEvent::Text(text)],
            _ => vec![],
        }
    }

    fn flush_thought(&mut self) -> Vec<AgentEvent> {
        let thought = std::mem::take(&mut self.thought);
        match thought.trim() {
            "" => vec![],
            t => vec![AgentEvent::Thinking(t.to_owned())],
        }
    }

    fn tool(&mut self, update: &Value, started: bool) -> Vec<AgentEvent> {
        let id = update.get("toolCallId").and_then(Value::as_str).unwrap_or("").to_owned();
        let status = update.get("status").and_then(Value::as_str).unwrap_or("");
        let (name, target) = (tool_name(update), target(update));
        let known = self.tools.entry(id.clone()).or_insert_with(|| (name.clone(), String::new()));
        if known.0.is_empty() {
            known.0 = name;
        }
        // What the input names wins over a location (a command's is its directory).
        if !target.is_empty() && (known.1.is_empty() || from_input(update)) {
            known.1 = target;
        }
        let mut out = Vec::new();
        if started {
            self.tool_since_text = true;
            out.push(AgentEvent::ToolStarted { tool: known.0.clone(), target: known.1.clone() });
        }
        if matches!(status, "completed" | "failed") {
            let (tool, target) = self.tools.remove(&id).unwrap_or_default();
            let error = update
                .pointer("/rawOutput/error")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .filter(|_| status == "failed");
            let exit_code = update.pointer("/rawOutput/metadata/exit").and_then(Value::as_i64);
            let status = if status == "failed" { "error" } else { "completed" }.to_owned();
            out.push(AgentEvent::ToolEnded {
                call: ToolCall { tool, target, status, exit_code },
                error,
            });
        }
        out
    }
}

fn chunk_text(update: &Value) -> String {
    update.pointer("/content/text").and_then(Value::as_str).unwrap_or("").to_owned()
}

/// A tool call's name in OpenCode's vocabulary: the name OpenCode 2 gives (`shell` is its
/// `bash`), else what its kind says.
fn tool_name(call: &Value) -> String {
    if let Some(name) = call.get("name").and_then(Value::as_str) {
        return match name {
            "shell" => "bash".to_owned(),
            other => other.to_owned(),
        };
    }
    match call.get("kind").and_then(Value::as_str).unwrap_or("") {
        "execute" => "bash".to_owned(),
        "edit" | "delete" | "move" => "edit".to_owned(),
        "fetch" => "webfetch".to_owned(),
        "read" => "read".to_owned(),
        "search" => "grep".to_owned(),
        _ => call.get("title").and_then(Value::as_str).unwrap_or("tool").to_owned(),
    }
}

const TARGET_KEYS: [&str; 7] =
    ["command", "filePath", "filepath", "path", "url", "pattern", "query"];

/// Whether the call's input names what it acts on.
fn from_input(call: &Value) -> bool {
    TARGET_KEYS
        .iter()
        .any(|k| call.pointer(&format!("/rawInput/{k}")).is_some_and(Value::is_string))
}

/// What a tool call acts on: its command, its file, its URL or pattern, else its title.
fn target(call: &Value) -> String {
    let input = call.get("rawInput").cloned().unwrap_or(Value::Null);
    TARGET_KEYS
        .iter()
        .find_map(|k| input.get(*k).and_then(Value::as_str))
        .or_else(|| call.pointer("/locations/0/path").and_then(Value::as_str))
        .unwrap_or("")
        .to_owned()
}

/// The tool use a `session/request_permission` asks to make, as the task's rules see it.
pub fn permission_use(params: &Value) -> ToolUse {
    let call = params.get("toolCall").cloned().unwrap_or(Value::Null);
    // The rules speak of `edit` for every change to a file (OpenCode 2 names `write`, `patch`).
    let permission = match call.get("kind").and_then(Value::as_str) {
        Some("edit" | "delete" | "move") => "edit".to_owned(),
        _ => tool_name(&call),
    };
    let mut pattern = target(&call);
    if pattern.is_empty() {
        pattern = call.get("title").and_then(Value::as_str).unwrap_or("").to_owned();
    }
    ToolUse { permission, pattern }
}

/// The option that answers a permission request the way `decision` says: the agent's own
/// `allow_once` or `reject_once` (an `always` is TaskBridge's to keep: the agent's would
/// outlive the task).
pub fn permission_response(params: &Value, allow: bool) -> Value {
    let want =
        if allow { ["allow_once", "allow_always"] } else { ["reject_once", "reject_always"] };
    let options = params.get("options").and_then(Value::as_array).cloned().unwrap_or_default();
    let chosen = want.iter().find_map(|kind| {
        options
            .iter()
            .find(|o| o.get("kind").and_then(Value::as_str) == Some(kind))
            .and_then(|o| o.get("optionId").cloned())
    });
    match chosen {
        Some(id) => json!({"outcome": {"outcome": "selected", "optionId": id}}),
        None => json!({"outcome": {"outcome": "cancelled"}}),
    }
}

/// The paths a permission request names (its locations and its input's path).
pub fn permission_paths(params: &Value) -> Vec<String> {
    let call = params.get("toolCall").cloned().unwrap_or(Value::Null);
    let mut paths: Vec<String> = call
        .get("locations")
        .and_then(Value::as_array)
        .map(|l| l.iter().filter_map(|p| p.get("path")?.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let input = call.get("rawInput").cloned().unwrap_or(Value::Null);
    paths.extend(
        ["filePath", "filepath", "path"]
            .iter()
            .filter_map(|k| input.get(*k).and_then(Value::as_str).map(str::to_owned)),
    );
    paths
}

/// A decision already made (a rule, a grant) as the permission response.
pub fn decided(params: &Value, decision: &Decision) -> Option<Value> {
    match decision {
        Decision::Allow { .. } => Some(permission_response(params, true)),
        Decision::Deny { .. } => Some(permission_response(params, false)),
        Decision::Wait => None,
    }
}

/// The questions an `elicitation/create` form asks: one per field the agent did not mark as
/// the free-text twin of another (OpenCode 2 adds `q0_custom` beside `q0`).
pub fn form_questions(params: &Value) -> Vec<AgentQuestion> {
    let props = params.pointer("/requestedSchema/properties").and_then(Value::as_object);
    let Some(props) = props else { return vec![] };
    let message = params.get("message").and_then(Value::as_str).unwrap_or("");
    props
        .iter()
        .filter(|(key, _)| !is_custom_twin(key, props))
        .map(|(_, field)| {
            let text = |k: &str| field.get(k).and_then(Value::as_str).map(str::to_owned);
            let items = field.get("items").unwrap_or(field);
            let options = field_options(items);
            AgentQuestion {
                question: text("description")
                    .or_else(|| text("title"))
                    .unwrap_or_else(|| message.to_owned()),
                header: text("title"),
                options,
                multiple: field.get("type").and_then(Value::as_str) == Some("array"),
            }
        })
        .collect()
}

fn is_custom_twin(key: &str, props: &serde_json::Map<String, Value>) -> bool {
    key.strip_suffix("_custom").is_some_and(|base| props.contains_key(base))
}

/// A field's choices: `oneOf`/`anyOf` constants with their titles, or a bare `enum`.
fn field_options(field: &Value) -> Vec<QuestionOption> {
    let listed = ["oneOf", "anyOf"].iter().find_map(|k| field.get(*k).and_then(Value::as_array));
    if let Some(list) = listed {
        return list
            .iter()
            .filter_map(|o| {
                let label = o.get("const").and_then(Value::as_str)?.to_owned();
                let description = o.get("description").and_then(Value::as_str).map(str::to_owned);
                Some(QuestionOption { label, description })
            })
            .collect();
    }
    let values = field.get("enum").and_then(Value::as_array).cloned().unwrap_or_default();
    values
        .iter()
        .filter_map(|v| v.as_str())
        .map(|label| QuestionOption { label: label.to_owned(), description: None })
        .collect()
}

/// The response to a form from an answer to its questions: each field filled with the chosen
/// labels (a label that is not one of its options goes in the field's free-text twin, where
/// there is one). Notes that came with the answer join its last question's answer.
pub fn form_response(params: &Value, ask: &Ask, answer: &str, notes: &[String]) -> Value {
    let Ok(Answer::Question(mut answers)) = ask.parse_answer(answer) else {
        return json!({"action": "decline"});
    };
    if let Some(last) = answers.last_mut() {
        last.extend(notes.iter().map(|n| format!("Note from the planner: {n}")));
    }
    let props = params
        .pointer("/requestedSchema/properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let keys: Vec<&String> = props.keys().filter(|k| !is_custom_twin(k, &props)).collect();
    let mut content = serde_json::Map::new();
    for (key, chosen) in keys.iter().zip(answers) {
        let field = &props[key.as_str()];
        let options = field_options(field.get("items").unwrap_or(field));
        let known = |l: &String| options.iter().any(|o| &o.label == l);
        let twin = format!("{key}_custom");
        if field.get("type").and_then(Value::as_str) == Some("array") {
            content.insert((*key).clone(), json!(chosen));
        } else if chosen.iter().all(known) || !props.contains_key(&twin) {
            content.insert((*key).clone(), json!(chosen.join(", ")));
        } else {
            content.insert(twin, json!(chosen.join(", ")));
        }
    }
    json!({"action": "accept", "content": content})
}

/// The usage a turn's answer reports (`session/prompt`'s `usage`), if it reports one.
pub fn prompt_usage(result: &Value) -> Option<Usage> {
    let u = result.get("usage")?;
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    Some(Usage {
        input_tokens: n("inputTokens"),
        output_tokens: n("outputTokens"),
        reasoning_tokens: n("thoughtTokens"),
        cache_read_tokens: n("cachedReadTokens"),
        cache_write_tokens: n("cachedWriteTokens"),
        cost_usd: None,
        steps: 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(v: Value) -> Value {
        v
    }

    #[test]
    fn a_turn_of_chunks_and_a_tool_call_reads_as_opencodes_steps() {
        let mut u = Updates::default();
        let mut events = Vec::new();
        for v in [
            json!({"sessionUpdate": "agent_message_chunk", "messageId": "m1", "content": {"type": "text", "text": "Writ"}}),
            json!({"sessionUpdate": "agent_message_chunk", "messageId": "m1", "content": {"type": "text", "text": "ing."}}),
            json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "write", "kind": "edit", "status": "pending", "rawInput": {}}),
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "in_progress", "rawInput": {"filePath": "hello.txt"}}),
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed", "rawOutput": {"metadata": {"exit": 0}}}),
            json!({"sessionUpdate": "agent_message_chunk", "messageId": "m2", "content": {"type": "text", "text": "Done."}}),
            json!({"sessionUpdate": "usage_update", "used": 5, "size": 10, "cost": {"amount": 0.5, "currency": "USD"}}),
        ] {
            events.extend(u.read(&update(v)));
        }
        events.extend(u.flush());
        let mut log = crate::events::RunLog::default();
        for e in events.clone() {
            log.apply(e);
        }
        assert_eq!(log.texts, ["Writing.", "Done."]);
        assert_eq!(log.final_text(), "Done.");
        assert_eq!(
            log.tool_calls,
            [ToolCall {
                tool: "edit".into(),
                target: "hello.txt".into(),
                status: "completed".into(),
                exit_code: Some(0)
            }]
        );
        assert_eq!(events.iter().filter(|e| **e == AgentEvent::StepStarted).count(), 2);
        assert_eq!(u.messages, ["m1", "m2"]);
        assert_eq!(u.session_cost, Some(0.5));
    }

    #[test]
    fn two_messages_in_a_row_are_two_texts_and_a_thought_is_said_before_what_follows_it() {
        let mut u = Updates::default();
        let chunk = |id: &str, text: &str| json!({"sessionUpdate": "agent_message_chunk", "messageId": id, "content": {"type": "text", "text": text}});
        let mut events = u.read(&json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": " hm "}}));
        events.extend(u.read(&chunk("m1", "One.")));
        events.extend(u.read(&chunk("m2", "Two.")));
        events.extend(u.read(&chunk("m2", "  ")));
        events.extend(u.flush());
        assert_eq!(
            events,
            [
                AgentEvent::Thinking("hm".into()),
                AgentEvent::StepStarted,
                AgentEvent::Text("One.".into()),
                AgentEvent::Text("Two.  ".into()),
            ]
        );
        assert_eq!(u.messages, ["m1", "m2"]);
        assert_eq!(u.flush(), [], "flushed once");
        let blank =
            u.read(&json!({"sessionUpdate": "agent_thought_chunk", "content": {"text": " "}}));
        assert!(
            blank.is_empty() && u.read(&chunk("m3", "x")).is_empty(),
            "a blank thought says nothing"
        );
    }

    #[test]
    fn a_message_of_blanks_says_nothing_one_without_an_id_is_no_step_and_a_location_is_a_target() {
        let mut u = Updates::default();
        let blank = json!({"sessionUpdate": "agent_message_chunk", "content": {"text": "   "}});
        assert_eq!(u.read(&blank), [AgentEvent::StepStarted]);
        assert_eq!(u.flush(), [], "only blanks: no text");
        assert!(u.messages.is_empty(), "a message without an id is not listed: {:?}", u.messages);
        u.read(&json!({"sessionUpdate": "tool_call", "toolCallId": "r", "kind": "read", "locations": [{"path": "/w/x.rs"}]}));
        let ended = u.read(
            &json!({"sessionUpdate": "tool_call_update", "toolCallId": "r", "status": "completed"}),
        );
        let AgentEvent::ToolEnded { call, .. } = &ended[0] else { panic!("{ended:?}") };
        assert_eq!((call.tool.as_str(), call.target.as_str()), ("read", "/w/x.rs"));
    }

    #[test]
    fn a_tool_is_named_by_its_kind_when_the_agent_gives_no_name() {
        let named = |kind: &str| tool_name(&json!({"kind": kind, "title": "t"}));
        assert_eq!(
            ["execute", "edit", "delete", "move", "fetch", "read", "search", "think"].map(named),
            ["bash", "edit", "edit", "edit", "webfetch", "read", "grep", "t"]
        );
        assert_eq!(tool_name(&json!({"name": "write", "kind": "edit"})), "write");
        assert_eq!(tool_name(&json!({})), "tool");
    }

    #[test]
    fn a_permission_requests_paths_are_its_locations_and_its_inputs_path() {
        let params = json!({"toolCall": {"locations": [{"path": "/w/a"}, {"line": 3}],
            "rawInput": {"filepath": "/w/b", "path": "/w/c", "command": "x"}}});
        assert_eq!(permission_paths(&params), ["/w/a", "/w/b", "/w/c"]);
        assert!(permission_paths(&json!({})).is_empty());
        let opts = json!({"options": [{"optionId": "y", "kind": "allow_once"}, {"optionId": "n", "kind": "reject_once"}]});
        let allow = Decision::Allow { input: Value::Null };
        assert_eq!(decided(&opts, &allow).unwrap()["outcome"]["optionId"], "y");
        let deny = Decision::Deny { message: "no".into() };
        assert_eq!(decided(&opts, &deny).unwrap()["outcome"]["optionId"], "n");
        let always = json!({"options": [{"optionId": "a", "kind": "allow_always"}]});
        assert_eq!(permission_response(&always, true)["outcome"]["optionId"], "a");
    }

    #[test]
    fn a_form_of_an_enum_and_a_list_is_asked_and_answered_with_notes() {
        let form = json!({"message": "Pick", "requestedSchema": {"properties": {
            "size": {"type": "string", "enum": ["s", "m"]},
            "tags": {"type": "array", "items": {"anyOf": [{"const": "a"}, {"const": "b"}]}}}}});
        let qs = form_questions(&form);
        assert_eq!((qs[0].question.as_str(), qs[0].multiple), ("Pick", false));
        assert_eq!(qs[0].options.iter().map(|o| o.label.as_str()).collect::<Vec<_>>(), ["s", "m"]);
        assert!(qs[1].multiple && qs[1].options.len() == 2, "{qs:?}");
        let ask = Ask::question(qs);
        let answered = form_response(&form, &ask, "m\na, b", &["hurry".into()]);
        assert_eq!(answered["action"], "accept", "{answered}");
        assert_eq!(answered["content"]["size"], "m");
        let tags = answered["content"]["tags"].as_array().unwrap();
        assert_eq!(tags.len(), 3, "the note joins the last answer: {answered}");
        assert!(tags[2].as_str().unwrap().contains("hurry"));
        let budget = Ask::budget(queue::BudgetStop {
            limit: "cost".into(),
            scope: "task".into(),
            spent: 1.0,
            max: 1.0,
            original: 1.0,
        });
        assert_eq!(form_response(&form, &budget, "continue", &[])["action"], "decline");
        assert!(form_questions(&json!({})).is_empty());
    }

    #[test]
    fn a_failed_tool_call_keeps_its_error_and_opencode_2s_shell_is_bash() {
        let mut u = Updates::default();
        u.read(&json!({"sessionUpdate": "tool_call", "toolCallId": "t", "name": "shell", "kind": "execute", "status": "pending", "locations": [{"path": "/w"}], "rawInput": {}}));
        u.read(&json!({"sessionUpdate": "tool_call_update", "toolCallId": "t", "status": "in_progress", "rawInput": {"command": "false"}}));
        u.read(&json!({"sessionUpdate": "tool_call_update", "toolCallId": "t", "status": "in_progress", "locations": [{"path": "/w"}]}));
        let ev = u.read(&json!({"sessionUpdate": "tool_call_update", "toolCallId": "t", "status": "failed", "rawOutput": {"error": "boom"}}));
        assert_eq!(
            ev,
            [AgentEvent::ToolEnded {
                call: ToolCall {
                    tool: "bash".into(),
                    target: "false".into(),
                    status: "error".into(),
                    exit_code: None
                },
                error: Some("boom".into())
            }]
        );
    }

    #[test]
    fn a_permission_request_is_the_tool_use_the_rules_decide_and_is_answered_by_kind() {
        let params = json!({"sessionId": "s", "toolCall": {"toolCallId": "t", "title": "git push", "kind": "execute", "rawInput": {"command": "git push origin"}},
            "options": [{"optionId": "yes", "kind": "allow_once"}, {"optionId": "ever", "kind": "allow_always"}, {"optionId": "no", "kind": "reject_once"}]});
        assert_eq!(
            permission_use(&params),
            ToolUse { permission: "bash".into(), pattern: "git push origin".into() }
        );
        assert_eq!(permission_response(&params, true)["outcome"]["optionId"], "yes");
        assert_eq!(permission_response(&params, false)["outcome"]["optionId"], "no");
        // OpenCode 2 names its `write`: any change to a file is `edit` to the rules.
        let write =
            json!({"toolCall": {"name": "write", "kind": "edit", "rawInput": {"path": "a.rs"}}});
        assert_eq!(
            permission_use(&write),
            ToolUse { permission: "edit".into(), pattern: "a.rs".into() }
        );
        let bare = json!({"toolCall": {"kind": "edit", "locations": [{"path": "/w/a.rs"}]}, "options": []});
        assert_eq!(permission_use(&bare).pattern, "/w/a.rs");
        assert_eq!(permission_response(&bare, true)["outcome"]["outcome"], "cancelled");
        assert_eq!(decided(&params, &Decision::Wait), None);
    }

    fn opencode2_form() -> Value {
        json!({"mode": "form", "sessionId": "s", "toolCallId": "t", "message": "Questions",
            "requestedSchema": {"type": "object", "properties": {
                "q0": {"type": "string", "title": "Colour", "description": "Which colour?",
                       "oneOf": [{"const": "red", "title": "red", "description": "warm"}, {"const": "blue", "title": "blue"}]},
                "q0_custom": {"type": "string", "title": "Colour (other)"}}, "required": []}})
    }

    #[test]
    fn opencode_2s_question_form_is_one_question_with_its_options() {
        let qs = form_questions(&opencode2_form());
        assert_eq!(qs.len(), 1);
        assert_eq!(qs[0].question, "Which colour?");
        assert_eq!(qs[0].header.as_deref(), Some("Colour"));
        let labels: Vec<_> = qs[0].options.iter().map(|o| o.label.as_str()).collect();
        assert_eq!(labels, ["red", "blue"]);
        assert_eq!(qs[0].options[0].description.as_deref(), Some("warm"));
    }

    #[test]
    fn an_answer_fills_the_form_as_a_string_and_free_text_goes_to_the_twin() {
        let form = opencode2_form();
        let ask = Ask::question(form_questions(&form));
        assert_eq!(
            form_response(&form, &ask, "blue", &[]),
            json!({"action": "accept", "content": {"q0": "blue"}})
        );
        let free = form_response(&form, &ask, "green, please", &[]);
        assert_eq!(free["content"]["q0_custom"], "green, please", "{free}");
        assert_eq!(free["content"].get("q0"), None);
    }

    #[test]
    fn the_answers_usage_is_read_and_a_missing_one_is_none() {
        let u = prompt_usage(&json!({"stopReason": "end_turn", "usage": {"inputTokens": 3, "outputTokens": 2, "totalTokens": 9, "cachedReadTokens": 1, "cachedWriteTokens": 4}})).unwrap();
        assert_eq!(
            (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens),
            (3, 2, 1, 4)
        );
        assert_eq!(prompt_usage(&json!({"stopReason": "end_turn"})), None);
    }
}
