//! Claude Code as a task's agent: `claude -p` with stream-json both ways, one process per turn,
//! in the task's worktree.
//!
//! Approvals and Claude Code's own questions (`AskUserQuestion`) arrive over its stdio control
//! channel (`--permission-prompt-tool stdio`): a `control_request` of subtype `can_use_tool`,
//! answered with a `control_response` that allows (with the tool's input) or denies (with a
//! message the model reads). A tool call the task's rules allow or deny
//! is answered at once; one that needs a person or the planner stops the process, and the answer
//! goes on in the same session (`--resume`) as a prompt, an approval granted for the call the
//! agent then makes again. The wire format is not documented by its authors: what is read here
//! is what Claude Code 2.1.197 writes (the end-to-end tests in `tests/e2e/agents.rs` drive it).

use crate::agent::AgentProtocol;
use crate::events::{AgentError, AgentEvent, ToolCall, Usage};
use crate::policy::Decision;
use crate::policy::ToolUse;
use queue::{AgentQuestion, Ask, QuestionOption};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The arguments of one turn. `session` resumes it; the task's flags remove the tools they
/// forbid, so the model is never offered them.
pub fn args(task: &queue::Task, model: Option<&str>, session: Option<&str>) -> Vec<String> {
    let mut args: Vec<String> = [
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--input-format",
        "stream-json",
        "--permission-prompt-tool",
        "stdio",
        // Every tool call that is not read-only comes to TaskBridge to decide; no mode that
        // skips permissions, so running as root needs no IS_SANDBOX.
        "--permission-mode",
        "default",
        // None of the user's MCP servers: once registered, TaskBridge itself is one of them,
        // and a task must not start another TaskBridge (with its own worker).
        "--strict-mcp-config",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(m) = model {
        args.extend([
            "--model".into(),
            crate::agent::model_for(crate::agent::AgentKind::ClaudeCode, m),
        ]);
    }
    if let Some(s) = session {
        args.extend(["--resume".into(), s.to_owned()]);
    }
    let mut disallowed: Vec<&str> = Vec::new();
    if task.readonly {
        disallowed.extend(["Edit", "MultiEdit", "Write", "NotebookEdit"]);
    }
    if task.no_shell {
        disallowed.extend(["Bash", "BashOutput", "KillShell"]);
    }
    if task.no_network {
        disallowed.extend(["WebFetch", "WebSearch"]);
    }
    if !disallowed.is_empty() {
        args.extend(["--disallowedTools".into(), disallowed.join(",")]);
    }
    args
}

/// The prompt as the one user message stream-json input takes.
pub fn prompt_line(prompt: &str) -> String {
    format!("{}\n", json!({"type": "user", "message": {"role": "user", "content": prompt}}))
}

/// Claude Code's stream, read into events.
#[derive(Default)]
pub struct ClaudeStream {
    /// Tool calls started and not yet ended: id → (tool, target).
    open: HashMap<String, (String, String)>,
    /// The assistant message being streamed: a new one is a new step.
    message: Option<String>,
    /// Where Claude Code sends its requests (`ANTHROPIC_BASE_URL`), named in a refusal.
    base_url: Option<String>,
}

impl ClaudeStream {
    /// The stream of a Claude Code started in `env`.
    pub fn new(env: &queue::Environment) -> Self {
        ClaudeStream { base_url: env.var("ANTHROPIC_BASE_URL"), ..Default::default() }
    }
}

impl AgentProtocol for ClaudeStream {
    fn events(&mut self, line: &str) -> Option<Vec<AgentEvent>> {
        let v: Value = serde_json::from_str(line).ok()?;
        let mut out = Vec::new();
        let str_at = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_owned);
        match v["type"].as_str().unwrap_or("") {
            "system" => match v["subtype"].as_str().unwrap_or("") {
                "init" => {
                    out.extend(str_at("/session_id").map(AgentEvent::Session));
                    out.extend(
                        str_at("/model").map(|m| AgentEvent::Model(format!("anthropic/{m}"))),
                    );
                }
                "api_retry" => {
                    let status = v["error_status"].as_i64();
                    let error = str_at("/error").unwrap_or_else(|| "error".into());
                    if matches!(status, Some(401 | 403)) || error == "authentication_failed" {
                        out.push(AgentEvent::Error(AgentError {
                            name: error,
                            message: "the Messages API refused Claude Code's credentials".into(),
                            status,
                            retryable: Some(false),
                            url: self.base_url.clone(),
                        }));
                    } else {
                        out.push(AgentEvent::Note(format!(
                            "the Messages API answered {} ({error}); Claude Code retries (attempt {})",
                            status.map_or("without a status".into(), |s| s.to_string()),
                            v["attempt"].as_i64().unwrap_or(0)
                        )));
                    }
                }
                _ => {}
            },
            "assistant" => {
                let id = str_at("/message/id");
                if id.is_some() && id != self.message {
                    self.message = id;
                    out.push(AgentEvent::StepStarted);
                }
                for block in
                    v.pointer("/message/content").and_then(Value::as_array).into_iter().flatten()
                {
                    match block["type"].as_str().unwrap_or("") {
                        "text" => out.push(AgentEvent::Text(
                            block["text"].as_str().unwrap_or("").to_owned(),
                        )),
                        "thinking" => out.push(AgentEvent::Thinking(
                            block["thinking"].as_str().unwrap_or("").to_owned(),
                        )),
                        "tool_use" => {
                            let tool = block["name"].as_str().unwrap_or("?").to_owned();
                            let target = target_of(&block["input"]);
                            if let Some(id) = block["id"].as_str() {
                                self.open.insert(id.to_owned(), (tool.clone(), target.clone()));
                            }
                            out.push(AgentEvent::ToolStarted { tool, target });
                        }
                        _ => {}
                    }
                }
            }
            "user" => {
                for block in
                    v.pointer("/message/content").and_then(Value::as_array).into_iter().flatten()
                {
                    if block["type"] != "tool_result" {
                        continue;
                    }
                    let id = block["tool_use_id"].as_str().unwrap_or("");
                    let (tool, target) =
                        self.open.remove(id).unwrap_or_else(|| ("?".into(), String::new()));
                    let text = result_text(&block["content"]);
                    let failed = block["is_error"].as_bool().unwrap_or(false);
                    // A failed command's result starts "Exit code N"; a command that ran
                    // through has none, and exited 0.
                    let exit_code = if tool == "Bash" {
                        if failed { exit_code_of(&text) } else { Some(0) }
                    } else {
                        None
                    };
                    let call = ToolCall {
                        tool: tool_name(&tool),
                        target,
                        status: if failed { "error" } else { "completed" }.into(),
                        exit_code,
                    };
                    let error = (failed && exit_code.is_none()).then(|| first_line(&text));
                    out.push(AgentEvent::ToolEnded { call, error });
                }
            }
            "result" => {
                let t = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
                let usage = Usage {
                    input_tokens: t("/usage/input_tokens"),
                    output_tokens: t("/usage/output_tokens"),
                    reasoning_tokens: 0,
                    cache_read_tokens: t("/usage/cache_read_input_tokens"),
                    cache_write_tokens: t("/usage/cache_creation_input_tokens"),
                    cost_usd: Some(v["total_cost_usd"].as_f64().unwrap_or(0.0)),
                    steps: t("/num_turns").max(1),
                };
                let reason = str_at("/stop_reason").or_else(|| str_at("/subtype"));
                out.push(AgentEvent::Usage { usage, reason });
                if v["is_error"].as_bool().unwrap_or(false) {
                    let message = str_at("/result")
                        .or_else(|| {
                            v["errors"].as_array().map(|e| {
                                e.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("; ")
                            })
                        })
                        .unwrap_or_else(|| "Claude Code ended the turn with an error".into());
                    out.push(AgentEvent::Error(AgentError {
                        name: str_at("/subtype").unwrap_or_else(|| "error".into()),
                        message,
                        status: v["api_error_status"].as_i64(),
                        retryable: None,
                        url: None,
                    }));
                }
                out.push(AgentEvent::TurnFinished);
            }
            "control_request" if v.pointer("/request/subtype") == Some(&json!("can_use_tool")) => {
                let request = str_at("/request_id").unwrap_or_default();
                let tool = v.pointer("/request/tool_name").and_then(Value::as_str).unwrap_or("?");
                let input = v.pointer("/request/input").cloned().unwrap_or(Value::Null);
                let ask = if tool == "AskUserQuestion" {
                    Ask::question(questions_of(&input))
                } else {
                    crate::policy::permission_decision(&tool_use(tool, &input))
                };
                out.push(AgentEvent::Decision { request, ask: Box::new(ask), input });
            }
            _ => {}
        }
        Some(out)
    }

    fn keeps_input_open(&self) -> bool {
        true
    }

    fn answer(&self, request: &str, decision: &Decision) -> Option<String> {
        let response = match decision {
            Decision::Allow { input } => json!({"behavior": "allow", "updatedInput": input}),
            Decision::Deny { message } => json!({"behavior": "deny", "message": message}),
            Decision::Wait => return None,
        };
        Some(
            json!({
                "type": "control_response",
                "response": {"subtype": "success", "request_id": request, "response": response}
            })
            .to_string(),
        )
    }

    fn is_fatal(&self, e: &AgentError) -> bool {
        // Claude Code retries a refused credential for minutes, and would never exit.
        e.retryable == Some(false)
    }
}

/// A Claude Code tool call as the permission it needs, in TaskBridge's (OpenCode's) names.
pub fn tool_use(tool: &str, input: &Value) -> ToolUse {
    let permission = match tool {
        "Bash" | "BashOutput" | "KillShell" => "bash",
        "Edit" | "MultiEdit" | "Write" | "NotebookEdit" => "edit",
        "Read" => "read",
        "Glob" => "glob",
        "Grep" => "grep",
        "WebFetch" => "webfetch",
        "WebSearch" => "websearch",
        "Task" => "task",
        "TodoWrite" => "todowrite",
        other => {
            return ToolUse { permission: other.to_ascii_lowercase(), pattern: target_of(input) };
        }
    };
    ToolUse { permission: permission.into(), pattern: target_of(input) }
}

fn tool_name(tool: &str) -> String {
    tool_use(tool, &Value::Null).permission
}

/// The command, path, URL or pattern a tool call is about.
fn target_of(input: &Value) -> String {
    ["command", "file_path", "notebook_path", "path", "url", "pattern", "query"]
        .iter()
        .find_map(|k| input.get(*k).and_then(Value::as_str))
        .unwrap_or("")
        .to_owned()
}

fn result_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n")
        }
        _ => String::new(),
    }
}

fn exit_code_of(text: &str) -> Option<i64> {
    text.trim_start().strip_prefix("Exit code ")?.split_whitespace().next()?.parse().ok()
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or("").chars().take(300).collect()
}

/// `AskUserQuestion`'s questions, with the options it offers.
fn questions_of(input: &Value) -> Vec<AgentQuestion> {
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    input["questions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|q| AgentQuestion {
            question: text(q, "question").unwrap_or_default(),
            header: text(q, "header"),
            options: q["options"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|o| QuestionOption {
                    label: text(o, "label").unwrap_or_default(),
                    description: text(o, "description"),
                })
                .collect(),
            multiple: q["multiSelect"].as_bool().unwrap_or(false),
        })
        .collect()
}

/// Claude Code's configuration directory, where it keeps its sessions.
fn config_dir(env: &queue::Environment) -> Option<PathBuf> {
    env.path("CLAUDE_CONFIG_DIR").or_else(|| env.home_dir().map(|h| h.join(".claude")))
}

/// Makes `session` resumable from `dir`. Claude Code looks a session up only under the project
/// directory it was started in (`projects/<path with every other character than a letter or
/// digit made '-'>`), and a follow-up runs in a new worktree: its parent's transcript is copied
/// there. Nothing to do when it is there already or cannot be found (the resume then says so).
pub fn carry_session(session: &str, dir: &Path, env: &queue::Environment) {
    let Some(projects) = config_dir(env).map(|d| d.join("projects")) else { return };
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let key: String = dir
        .to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let file = format!("{session}.jsonl");
    let target = projects.join(&key).join(&file);
    if target.exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(&projects) else { return };
    let Some(source) = entries.flatten().map(|e| e.path().join(&file)).find(|p| p.exists()) else {
        return;
    };
    if let Err(e) =
        std::fs::create_dir_all(projects.join(&key)).and_then(|_| std::fs::copy(&source, &target))
    {
        tracing::warn!(session, error = %e, "copying the Claude Code session for a follow-up failed");
    }
}

/// Explains a failed Claude Code turn.
pub fn diagnose(e: &AgentError, model: Option<&str>) -> crate::diagnose::Diagnosis {
    let model = model
        .map_or_else(|| "Claude Code's own default model".to_owned(), |m| format!("model {m}"));
    let endpoint = e.url.clone().unwrap_or_else(|| "the Anthropic API".into());
    if e.retryable == Some(false) || matches!(e.status, Some(401 | 403)) {
        return crate::diagnose::Diagnosis {
            message: format!(
                "Claude Code could not authenticate with {endpoint} ({}{}) for {model}: log in \
                 with `claude` (then /login), or set ANTHROPIC_API_KEY in the worker's environment",
                e.name,
                e.status.map(|s| format!(", HTTP {s}")).unwrap_or_default()
            ),
            retryable: false,
            kind: queue::FailureKind::Auth,
        };
    }
    crate::diagnose::Diagnosis {
        message: format!("Claude Code failed ({model}): {}: {}", e.name, e.message),
        retryable: e.retryable.unwrap_or(true),
        kind: queue::FailureKind::Provider,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_with_a_command_and_a_question_reads_as_events() {
        let mut s = ClaudeStream::default();
        let mut all = Vec::new();
        for l in [
            r#"{"type":"system","subtype":"init","session_id":"S1","model":"claude-sonnet-4-5"}"#,
            r#"{"type":"assistant","message":{"id":"m1","content":[{"type":"text","text":"Running."},{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"cargo test"}}]}}"#,
            r#"{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","content":"Exit code 101\nfailed","is_error":true}]}}"#,
            r#"{"type":"control_request","request_id":"r1","request":{"subtype":"can_use_tool","tool_name":"AskUserQuestion","input":{"questions":[{"question":"Which?","header":"Pick","options":[{"label":"A"},{"label":"B"}],"multiSelect":false}]}}}"#,
            r#"{"type":"result","subtype":"success","is_error":false,"result":"done","total_cost_usd":0.25,"num_turns":2,"usage":{"input_tokens":10,"output_tokens":4,"cache_read_input_tokens":3,"cache_creation_input_tokens":2}}"#,
        ] {
            all.extend(s.events(l).unwrap());
        }
        assert_eq!(all[0], AgentEvent::Session("S1".into()));
        let ended = all
            .iter()
            .find_map(|e| match e {
                AgentEvent::ToolEnded { call, .. } => Some(call.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(
            (ended.tool.as_str(), ended.target.as_str(), ended.exit_code),
            ("bash", "cargo test", Some(101))
        );
        let ask = all
            .iter()
            .find_map(|e| match e {
                AgentEvent::Decision { ask, .. } => Some((**ask).clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(ask.questions[0].options.len(), 2);
        let cost = all.iter().find_map(|e| match e {
            AgentEvent::Usage { usage, .. } => Some(usage.cost_usd),
            _ => None,
        });
        assert_eq!(cost, Some(Some(0.25)));
        assert_eq!(all.last(), Some(&AgentEvent::TurnFinished));
        let reply = s.answer("r1", &Decision::Deny { message: "no".into() }).unwrap();
        let reply: Value = serde_json::from_str(&reply).unwrap();
        assert_eq!(reply["response"]["response"]["behavior"], "deny");
        assert_eq!(reply["response"]["request_id"], "r1");
    }
}
