//! Codex as a task's agent: `codex exec --json`, one process per turn, in the task's worktree,
//! resumed by thread id (`codex exec resume`) for answers and follow-ups.
//!
//! `exec` has no channel for questions or approvals: the agent asks with the prompt-level
//! `taskbridge-question` block, the sandbox enforces what it can (`read-only` for a read-only
//! task; `workspace-write`, which has no network, otherwise), and the result says which of the
//! task's rules could not hold. It reports tokens, never a cost.

use crate::agent::AgentProtocol;
use crate::events::{AgentError, AgentEvent, ToolCall, Usage};
use serde_json::Value;

/// The arguments of one turn, the prompt read from stdin (`-`). `walled`: the turn runs inside
/// TaskBridge's own wall (`crate::sandbox`), which holds the task's rules for every agent alike;
/// Codex's sandbox is then off, since its bubblewrap cannot run inside a Landlock domain (it must
/// write `/proc/<pid>/uid_map`, which the wall keeps read-only).
pub fn args(
    task: &queue::Task,
    model: Option<&str>,
    session: Option<&str>,
    walled: bool,
) -> Vec<String> {
    let sandbox = match (walled, task.readonly) {
        (true, _) => "danger-full-access",
        (false, true) => "read-only",
        (false, false) => "workspace-write",
    };
    let mut args: Vec<String> = vec!["exec".into()];
    if session.is_some() {
        args.push("resume".into());
    }
    args.extend(["--json".into(), "--skip-git-repo-check".into()]);
    // `resume` takes no --sandbox: the same setting, as configuration.
    args.extend(["-c".into(), format!("sandbox_mode=\"{sandbox}\"")]);
    if task.no_network {
        // Whatever the user's own config allows.
        args.extend(["-c".into(), "sandbox_workspace_write.network_access=false".into()]);
    }
    if let Some(m) = model {
        args.extend(["-m".into(), crate::agent::model_for(crate::agent::AgentKind::Codex, m)]);
    }
    if let Some(s) = session {
        args.push(s.to_owned());
    }
    args.push("-".into());
    args
}

/// Codex's `--json` stream, read into events.
#[derive(Default)]
pub struct CodexStream;

impl AgentProtocol for CodexStream {
    fn events(&mut self, line: &str) -> Option<Vec<AgentEvent>> {
        let v: Value = serde_json::from_str(line).ok()?;
        let s = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("").to_owned();
        let mut out = Vec::new();
        match v["type"].as_str().unwrap_or("") {
            "thread.started" => out.push(AgentEvent::Session(s("/thread_id"))),
            "turn.started" => out.push(AgentEvent::StepStarted),
            "item.started" if v.pointer("/item/type") == Some(&"command_execution".into()) => {
                out.push(AgentEvent::ToolStarted {
                    tool: "bash".into(),
                    target: unwrap_shell(&s("/item/command")),
                });
            }
            "item.completed" => match v.pointer("/item/type").and_then(Value::as_str).unwrap_or("")
            {
                "agent_message" => out.push(AgentEvent::Text(s("/item/text"))),
                "reasoning" => out.push(AgentEvent::Thinking(s("/item/text"))),
                "command_execution" => out.push(AgentEvent::ToolEnded {
                    call: ToolCall {
                        tool: "bash".into(),
                        target: unwrap_shell(&s("/item/command")),
                        status: s("/item/status"),
                        exit_code: v.pointer("/item/exit_code").and_then(Value::as_i64),
                    },
                    error: None,
                }),
                "file_change" => {
                    let paths: Vec<&str> = v
                        .pointer("/item/changes")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|c| c["path"].as_str())
                        .collect();
                    out.push(AgentEvent::ToolEnded {
                        call: ToolCall {
                            tool: "edit".into(),
                            target: paths.join(", "),
                            status: s("/item/status"),
                            exit_code: None,
                        },
                        error: None,
                    });
                }
                // Warnings (a model it has no metadata for, say): the turn goes on.
                "error" => out.push(AgentEvent::Note(format!("codex: {}", s("/item/message")))),
                _ => {}
            },
            "turn.completed" => {
                let t = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
                // OpenAI counts cached input inside input_tokens; TaskBridge, as Anthropic
                // and OpenCode do, apart.
                let cached = t("/usage/cached_input_tokens");
                let usage = Usage {
                    input_tokens: t("/usage/input_tokens").saturating_sub(cached),
                    output_tokens: t("/usage/output_tokens"),
                    reasoning_tokens: t("/usage/reasoning_output_tokens"),
                    cache_read_tokens: cached,
                    cache_write_tokens: t("/usage/cache_write_input_tokens"),
                    cost_usd: None,
                    steps: 1,
                };
                out.push(AgentEvent::Usage { usage, reason: Some("stop".into()) });
                out.push(AgentEvent::TurnFinished);
            }
            "turn.failed" => out.push(AgentEvent::Error(error_of(&s("/error/message")))),
            "error" => {
                let e = error_of(&s("/message"));
                // "Reconnecting... 1/5 (...)": Codex retries by itself; only a refused
                // credential is final at once.
                if e.retryable == Some(false) {
                    out.push(AgentEvent::Error(e));
                } else {
                    out.push(AgentEvent::Note(format!("codex: {}", s("/message"))));
                }
            }
            _ => {}
        }
        Some(out)
    }

    fn is_fatal(&self, e: &AgentError) -> bool {
        e.retryable == Some(false)
    }
}

/// The command the model gave, without the `bash -lc '…'` Codex runs it in: what the model
/// asked for is what a test run is recognised by.
fn unwrap_shell(command: &str) -> String {
    let inner =
        ["/bin/bash -lc ", "bash -lc ", "/bin/bash -c ", "bash -c ", "/bin/sh -c ", "sh -c "]
            .iter()
            .find_map(|p| command.strip_prefix(p));
    match inner {
        Some(q) if q.len() >= 2 && q.starts_with('\'') && q.ends_with('\'') => {
            q[1..q.len() - 1].replace(r"'\''", "'")
        }
        Some(q) => q.to_owned(),
        None => command.to_owned(),
    }
}

/// Codex's error text (`unexpected status 401 Unauthorized: ..., url: ...`) as its parts.
fn error_of(message: &str) -> AgentError {
    let status = message
        .split("unexpected status ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|c| c.parse::<i64>().ok());
    let url = message
        .rsplit("url: ")
        .next()
        .filter(|_| message.contains("url: "))
        .map(|u| u.trim_end_matches(')').trim().to_owned());
    AgentError {
        name: "CodexError".into(),
        message: message.to_owned(),
        status,
        retryable: match status {
            Some(401 | 403) => Some(false),
            _ => None,
        },
        url,
    }
}

/// Explains a failed Codex turn.
pub fn diagnose(e: &AgentError, model: Option<&str>) -> crate::diagnose::Diagnosis {
    let model =
        model.map_or_else(|| "Codex's own default model".to_owned(), |m| format!("model {m}"));
    if matches!(e.status, Some(401 | 403)) {
        return crate::diagnose::Diagnosis {
            message: format!(
                "Codex could not authenticate with {} (HTTP {}) for {model}: log in with `codex \
                 login`, or set OPENAI_API_KEY (or your provider's key) in the worker's \
                 environment. Codex said: {}",
                e.url.as_deref().unwrap_or("its provider"),
                e.status.unwrap_or(0),
                e.message
            ),
            retryable: false,
            kind: queue::FailureKind::Auth,
        };
    }
    crate::diagnose::Diagnosis {
        message: format!("Codex failed ({model}): {}", e.message),
        retryable: e.retryable.unwrap_or(true),
        kind: queue::FailureKind::Provider,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_reads_as_events_and_a_refused_key_is_final() {
        let mut s = CodexStream;
        let mut all = Vec::new();
        for l in [
            r#"{"type":"thread.started","thread_id":"T1"}"#,
            r#"{"type":"turn.started"}"#,
            r#"{"type":"item.completed","item":{"id":"i1","type":"command_execution","command":"bash -lc 'cargo test'","aggregated_output":"ok","exit_code":0,"status":"completed"}}"#,
            r#"{"type":"item.completed","item":{"id":"i2","type":"file_change","changes":[{"path":"src/a.rs","kind":"update"}],"status":"completed"}}"#,
            r#"{"type":"item.completed","item":{"id":"i3","type":"agent_message","text":"Done."}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":11,"cached_input_tokens":2,"output_tokens":5,"reasoning_output_tokens":1}}"#,
        ] {
            all.extend(s.events(l).unwrap());
        }
        assert_eq!(all[0], AgentEvent::Session("T1".into()));
        assert!(all.iter().any(|e| matches!(e, AgentEvent::ToolEnded { call, .. }
            if call.exit_code == Some(0) && call.target == "cargo test")));
        assert_eq!(unwrap_shell(r"/bin/bash -lc 'echo '\''hi'\'''"), "echo 'hi'");
        assert!(all.iter().any(|e| matches!(e, AgentEvent::Usage { usage, .. } if usage.cost_usd.is_none() && usage.input_tokens == 9 && usage.cache_read_tokens == 2)));
        let e = s
            .events(r#"{"type":"error","message":"Reconnecting... 1/5 (unexpected status 401 Unauthorized: Incorrect API key provided, url: http://127.0.0.1:9/v1/responses)"}"#)
            .unwrap();
        let AgentEvent::Error(e) = &e[0] else { panic!("{e:?}") };
        assert_eq!(
            (e.status, e.url.as_deref()),
            (Some(401), Some("http://127.0.0.1:9/v1/responses"))
        );
        assert!(s.is_fatal(e));
    }
}
