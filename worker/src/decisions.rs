//! Answers to the agent's decisions as OpenCode takes them: a reply on the blocked request, or a
//! prompt in the same session when the request is gone; the grants an `always` leaves; and how
//! the task's `ask` rules and budget held, for the result.

use crate::result;
use queue::Task;

/// The task's earlier `always` answers, as grants for the rest of the task.
pub fn always_grants(task: &Task) -> crate::serve::Grants {
    let mut grants = crate::serve::Grants::default();
    for q in &task.questions {
        let (Some(ask), Some(answer)) = (&q.ask, &q.answer) else { continue };
        let Some(p) = &ask.permission else { continue };
        if ask.parse_answer(answer) == Ok(queue::Answer::PermissionAlways) {
            let patterns = if p.always.is_empty() { &p.patterns } else { &p.always };
            grants.always.extend(patterns.iter().map(|pat| (p.permission.clone(), pat.clone())));
        }
    }
    grants
}

/// The reply to the request the agent is blocked on. Notes that came with the answer join a
/// question's answer (the agent reads the tool's result); an `always` is a `once` to OpenCode,
/// whose own `always` would outlive the task, and TaskBridge approves the rest itself.
pub fn native_reply(ask: &queue::Ask, answer: &str, notes: &[String]) -> crate::serve::Delivery {
    use queue::Answer;
    let request = ask.request_id.clone().unwrap_or_default();
    let (path, body) = match ask.parse_answer(answer) {
        Ok(Answer::Question(mut answers)) => {
            if let Some(last) = answers.last_mut() {
                last.extend(notes.iter().map(|n| format!("Note from the planner: {n}")));
            }
            (format!("/question/{request}/reply"), serde_json::json!({"answers": answers}))
        }
        Ok(Answer::PermissionOnce | Answer::PermissionAlways) => {
            (format!("/permission/{request}/reply"), serde_json::json!({"reply": "once"}))
        }
        Ok(Answer::PermissionReject { feedback }) => {
            let mut body = serde_json::json!({"reply": "reject"});
            if let Some(f) = feedback {
                body["message"] = f.into();
            }
            (format!("/permission/{request}/reply"), body)
        }
        _ => return crate::serve::Delivery::Prompt(answer_prompt(ask, answer)),
    };
    crate::serve::Delivery::Reply { path, body }
}

/// An answer as a new prompt in the session: the blocked request is gone (the server restarted,
/// another worker took the task) or the agent was stopped (a budget).
pub fn answer_prompt(ask: &queue::Ask, answer: &str) -> String {
    use queue::Answer;
    let end = "End as before with a taskbridge-result block.";
    let what = |p: &queue::PermissionAsk| {
        format!("{}: {}", p.permission, p.target.clone().unwrap_or_else(|| p.patterns.join(", ")))
    };
    match (ask.parse_answer(answer), &ask.permission) {
        (Ok(Answer::PermissionOnce), Some(p)) => {
            format!("You asked for permission to {}. It is approved: go on with it. {end}", what(p))
        }
        (Ok(Answer::PermissionAlways), Some(p)) => format!(
            "You asked for permission to {}. It is approved for the rest of this task: go on \
             with it. {end}",
            what(p)
        ),
        (Ok(Answer::PermissionReject { feedback }), Some(p)) => format!(
            "You asked for permission to {}. It was rejected: {}. Carry on without it. {end}",
            what(p),
            feedback.unwrap_or_else(|| "no reason given".into())
        ),
        (Ok(Answer::BudgetContinue(_)), _) => format!(
            "You were paused because the task reached its budget; the planner raised the limit. \
             Continue the task where you stopped. {end}"
        ),
        _ => format!(
            "You asked:\n{}\n\nThe answer is: {}\n\nContinue the task with this answer. {end}",
            ask.text(),
            answer.trim()
        ),
    }
}

/// Which agent ran the task and what held where it could not do something itself.
pub fn agent_report(
    task: &Task,
    spec: &crate::agent::AgentSpec,
    serving: bool,
    server_mode: bool,
) -> result::AgentReport {
    use crate::agent::AgentKind;
    let caps = spec.kind.capabilities(serving);
    let mut fallbacks = Vec::new();
    if !caps.native_questions {
        fallbacks.push(
            "questions: the agent asks with a taskbridge-question block in its answer; the \
             answer goes on in the same session as a prompt"
                .to_owned(),
        );
    }
    if !caps.native_permissions && !task.ask_rules.is_empty() {
        fallbacks.push(match spec.kind {
            AgentKind::Codex => "permissions: codex exec cannot ask for approval; the task's ask \
                                 rules were not applied (its sandbox held)"
                .to_owned(),
            _ => "permissions: deny-only; what an ask rule names is denied".to_owned(),
        });
    }
    if !caps.reports_cost {
        fallbacks.push(
            "cost: the agent reports tokens only, so usage.cost_usd is null and a cost budget \
             cannot be checked"
                .to_owned(),
        );
    }
    if spec.kind == AgentKind::ClaudeCode && !task.ask_rules.is_empty() {
        fallbacks.push(
            "ask rules: Claude Code applies its own settings' allow rules (~/.claude/settings.json, \
             the repository's .claude/) before it asks; a tool call they allow is not asked about"
                .to_owned(),
        );
    }
    if spec.kind == AgentKind::ClaudeCode {
        fallbacks.push(
            "decisions: a question or approval stops Claude Code's process; the answer resumes \
             the same session (--resume), and an approved call is let through when the agent \
             makes it again"
                .to_owned(),
        );
    }
    result::AgentReport {
        name: spec.stored().unwrap_or_else(|| "opencode".into()),
        mode: (spec.kind == AgentKind::OpenCode)
            .then(|| if server_mode { "serve" } else { "run" }.to_owned()),
        capabilities: caps,
        fallbacks,
    }
}

/// How the task's `ask` rules and budget held.
pub fn ask_permissions(
    task: &Task,
    kind: crate::agent::AgentKind,
    serving: bool,
) -> Vec<result::Permission> {
    use crate::agent::AgentKind;
    if kind != AgentKind::OpenCode {
        return cli_ask_permissions(task, kind);
    }
    let mut out = Vec::new();
    if task.budget.is_set() || task.budget_group.is_some() {
        out.push(result::Permission {
            flag: "budget".into(),
            enabled: true,
            enforcement: if serving { "enforced" } else { "not enforced" }.into(),
            how: if serving {
                "the spend is checked after every step; past the budget the agent is stopped and \
                 the task waits for continue or stop"
                    .into()
            } else {
                "`opencode run` reports the spend only as it goes by; a worker with --opencode \
                 serve stops the agent at the budget"
                    .into()
            },
        });
    }
    if task.ask_rules.is_empty() {
        return out;
    }
    let rules = task.ask_rules.join(", ");
    let (enforcement, how) = if serving {
        (
            "enforced",
            format!("{rules}: ask rules in the session; each request waited for an answer"),
        )
    } else {
        (
            "enforced",
            format!(
                "{rules}: denied, since `opencode run` cannot wait for an answer (a worker with \
                 --opencode serve asks)"
            ),
        )
    };
    out.push(result::Permission {
        flag: "ask".into(),
        enabled: true,
        enforcement: enforcement.into(),
        how,
    });
    out
}

/// How the `ask` rules and budget held on Claude Code or Codex.
fn cli_ask_permissions(task: &Task, kind: crate::agent::AgentKind) -> Vec<result::Permission> {
    use crate::agent::AgentKind;
    let mut out = Vec::new();
    if task.budget.is_set() || task.budget_group.is_some() {
        out.push(result::Permission {
            flag: "budget".into(),
            enabled: true,
            enforcement: "not enforced".into(),
            how: format!(
                "{} reports its spend when a turn ends; only OpenCode's server stops an agent at \
                 the budget",
                kind.name()
            ),
        });
    }
    if !task.ask_rules.is_empty() {
        let rules = task.ask_rules.join(", ");
        out.push(result::Permission {
            flag: "ask".into(),
            enabled: true,
            enforcement: if kind == AgentKind::ClaudeCode { "enforced" } else { "not enforced" }
                .into(),
            how: if kind == AgentKind::ClaudeCode {
                format!(
                    "{rules}: every matching tool call came to TaskBridge over Claude Code's \
                     permission channel and waited for an answer"
                )
            } else {
                format!("{rules}: codex exec cannot ask; submit refuses ask rules for codex")
            },
        });
    }
    out
}
