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

/// How the task's `ask` rules and budget held.
pub fn ask_permissions(task: &Task, serving: bool) -> Vec<result::Permission> {
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
