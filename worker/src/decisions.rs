//! Answers to the agent's decisions as OpenCode takes them: a reply on the blocked request, or a
//! prompt in the same session when the request is gone; the grants an `always` leaves; and how
//! the task's `ask` rules and budget held, for the result.

use crate::result;
use queue::Task;

/// The task's earlier `always` answers, as grants for the rest of the task.
pub fn always_grants(task: &Task) -> crate::policy::Grants {
    let mut grants = crate::policy::Grants::default();
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
pub fn native_reply(
    ask: &queue::Ask,
    answer: &str,
    notes: &[String],
) -> crate::agent::opencode_serve::Delivery {
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
        _ => return crate::agent::opencode_serve::Delivery::Prompt(answer_prompt(ask, answer)),
    };
    crate::agent::opencode_serve::Delivery::Reply { path, body }
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
    caps: queue::Capabilities,
    mode: Option<&str>,
) -> result::AgentReport {
    use crate::agent::AgentKind;
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
        mode: mode.map(str::to_owned),
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::agent::opencode_serve::Delivery;
    use crate::agent::{AgentKind, AgentSpec};
    use queue::{AgentQuestion, Ask, AskKind, PermissionAsk, QuestionOption, QuestionRound};

    fn permission(always: &[&str]) -> Ask {
        Ask {
            kind: AskKind::Permission,
            questions: vec![],
            permission: Some(PermissionAsk {
                permission: "bash".into(),
                patterns: vec!["git push origin main".into()],
                target: Some("git push origin main".into()),
                always: always.iter().map(|s| s.to_string()).collect(),
            }),
            budget: None,
            choices: vec![],
            request_id: Some("per_1".into()),
        }
    }

    fn question() -> Ask {
        let option = |l: &str| QuestionOption { label: l.into(), description: None };
        Ask {
            kind: AskKind::Question,
            questions: vec![AgentQuestion {
                question: "Which database?".into(),
                header: None,
                options: vec![option("SQLite"), option("PostgreSQL")],
                multiple: false,
            }],
            permission: None,
            budget: None,
            choices: vec![],
            request_id: Some("que_1".into()),
        }
    }

    fn budget() -> Ask {
        Ask { kind: AskKind::Budget, request_id: None, ..question() }
    }

    fn answered(ask: Ask, answer: &str) -> QuestionRound {
        QuestionRound {
            question: ask.text(),
            asked_at: 0.0,
            answer: Some(answer.into()),
            answered_at: Some(1.0),
            ask: Some(ask),
            answered_by: None,
        }
    }

    fn reply(d: Delivery) -> (String, serde_json::Value) {
        match d {
            Delivery::Reply { path, body } => (path, body),
            Delivery::Prompt(p) => panic!("a prompt, not a reply: {p}"),
        }
    }

    #[test]
    fn only_always_answers_become_grants_for_the_agents_suggestion_or_else_its_patterns() {
        let mut task = crate::sample_task();
        task.questions = vec![
            answered(permission(&["git push *"]), "always"),
            answered(permission(&[]), "Always"),
            answered(permission(&["rm *"]), "once"),
            answered(permission(&["curl *"]), "reject"),
            answered(question(), "always"),
        ];
        let grants = always_grants(&task);
        let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(
            grants.always,
            vec![pair("bash", "git push *"), pair("bash", "git push origin main")]
        );
        assert!(grants.once.is_empty());
    }

    #[test]
    fn a_native_reply_answers_the_blocked_request_on_its_own_route() {
        let (path, body) = reply(native_reply(&question(), "postgresql", &["be quick".into()]));
        assert_eq!(path, "/question/que_1/reply");
        assert_eq!(
            body,
            serde_json::json!({"answers": [["PostgreSQL", "Note from the planner: be quick"]]})
        );
        for answer in ["once", "always"] {
            let (path, body) = reply(native_reply(&permission(&[]), answer, &[]));
            assert_eq!(path, "/permission/per_1/reply");
            // An `always` is a `once` to OpenCode: its own would outlive the task.
            assert_eq!(body, serde_json::json!({"reply": "once"}), "{answer}");
        }
        let (path, body) = reply(native_reply(&permission(&[]), "reject", &[]));
        assert_eq!(path, "/permission/per_1/reply");
        assert_eq!(body, serde_json::json!({"reply": "reject"}));
        let (_, body) = reply(native_reply(&permission(&[]), "reject: use a branch", &[]));
        assert_eq!(body, serde_json::json!({"reply": "reject", "message": "use a branch"}));
        // A budget has no request to reply on: its answer goes on as a prompt.
        match native_reply(&budget(), "continue", &[]) {
            Delivery::Prompt(p) => assert!(p.contains("raised the limit"), "{p}"),
            Delivery::Reply { path, .. } => panic!("a reply on {path} to a budget"),
        }
    }

    #[test]
    fn an_answer_as_a_prompt_says_what_was_decided_about_what() {
        let once = answer_prompt(&permission(&[]), "once");
        assert!(once.contains("permission to bash: git push origin main. It is approved: go on"));
        let always = answer_prompt(&permission(&[]), "always");
        assert!(always.contains("approved for the rest of this task"), "{always}");
        let rejected = answer_prompt(&permission(&[]), "reject: use a branch");
        assert!(rejected.contains("It was rejected: use a branch. Carry on without it"));
        let bare = answer_prompt(&permission(&[]), "reject");
        assert!(bare.contains("It was rejected: no reason given"), "{bare}");
        let raised = answer_prompt(&budget(), "continue 2");
        assert!(raised.contains("the planner raised the limit"), "{raised}");
        let answer = answer_prompt(&question(), "  SQLite ");
        assert!(answer.contains("You asked:\nWhich database?"), "{answer}");
        assert!(answer.contains("The answer is: SQLite\n"), "{answer}");
        for p in [once, always, rejected, bare, raised, answer] {
            assert!(p.ends_with("End as before with a taskbridge-result block."), "{p}");
        }
    }

    fn report(kind: AgentKind, rules: &[&str], serving: bool) -> result::AgentReport {
        let mut task = crate::sample_task();
        task.ask_rules = rules.iter().map(|s| s.to_string()).collect();
        let spec = AgentSpec { kind, opencode_agent: None, configured: None };
        let mode = (kind == AgentKind::OpenCode).then_some(if serving { "serve" } else { "run" });
        agent_report(&task, &spec, kind.capabilities(serving), mode)
    }

    fn said(r: &result::AgentReport, start: &str) -> bool {
        r.fallbacks.iter().any(|f| f.starts_with(start))
    }

    #[test]
    fn the_agent_report_names_each_guarantee_that_held_another_way() {
        let served = report(AgentKind::OpenCode, &["bash:git push*"], true);
        assert_eq!((served.name.as_str(), served.mode.as_deref()), ("opencode", Some("serve")));
        assert!(served.capabilities.native_questions);
        assert!(served.fallbacks.is_empty(), "{:?}", served.fallbacks);

        let run = report(AgentKind::OpenCode, &["bash:git push*"], false);
        assert_eq!(run.mode.as_deref(), Some("run"));
        assert!(said(&run, "questions: the agent asks with a taskbridge-question block"));
        assert!(said(&run, "permissions: deny-only"));
        assert!(!said(&run, "cost:") && !said(&run, "decisions:"), "{:?}", run.fallbacks);
        // No ask rules: nothing to say about permissions.
        let plain = report(AgentKind::OpenCode, &[], false);
        assert!(!said(&plain, "permissions:"), "{:?}", plain.fallbacks);

        let codex = report(AgentKind::Codex, &["bash:rm*"], false);
        assert_eq!((codex.name.as_str(), codex.mode.as_deref()), ("codex", None));
        assert!(said(&codex, "permissions: codex exec cannot ask"));
        assert!(said(&codex, "cost: the agent reports tokens only"));
        assert!(!said(&codex, "permissions: deny-only"));

        let claude = report(AgentKind::ClaudeCode, &["Bash(rm *)"], false);
        assert_eq!((claude.name.as_str(), claude.mode.as_deref()), ("claude-code", None));
        assert!(said(&claude, "ask rules: Claude Code applies its own settings"));
        assert!(said(&claude, "decisions: a question or approval stops Claude Code"));
        assert!(!said(&claude, "questions:") && !said(&claude, "permissions:"));
        let claude = report(AgentKind::ClaudeCode, &[], false);
        assert!(!said(&claude, "ask rules:") && said(&claude, "decisions:"));
    }

    fn permissions(
        kind: AgentKind,
        serving: bool,
        f: impl Fn(&mut Task),
    ) -> Vec<result::Permission> {
        let mut task = crate::sample_task();
        f(&mut task);
        ask_permissions(&task, kind, serving)
    }

    fn flags(p: &[result::Permission]) -> Vec<(&str, &str)> {
        p.iter().map(|p| (p.flag.as_str(), p.enforcement.as_str())).collect()
    }

    #[test]
    fn the_result_says_what_enforced_the_budget_and_the_ask_rules_on_each_agent() {
        let both = |t: &mut Task| {
            t.budget.max_cost_usd = Some(1.0);
            t.ask_rules = vec!["bash:git push*".into()];
        };
        let served = permissions(AgentKind::OpenCode, true, both);
        assert_eq!(flags(&served), [("budget", "enforced"), ("ask", "enforced")]);
        assert!(served.iter().all(|p| p.enabled));
        assert!(served[0].how.contains("checked after every step"));
        assert!(served[1].how.starts_with("bash:git push*: ask rules in the session"));
        let run = permissions(AgentKind::OpenCode, false, both);
        assert_eq!(flags(&run), [("budget", "not enforced"), ("ask", "enforced")]);
        assert!(run[1].how.contains("denied, since `opencode run` cannot wait"));
        // A batch's shared budget counts as a budget; nothing set says nothing.
        let batch = permissions(AgentKind::OpenCode, true, |t| t.budget_group = Some(7));
        assert_eq!(flags(&batch), [("budget", "enforced")]);
        assert!(permissions(AgentKind::OpenCode, true, |_| {}).is_empty());

        let claude = permissions(AgentKind::ClaudeCode, true, both);
        assert_eq!(flags(&claude), [("budget", "not enforced"), ("ask", "enforced")]);
        assert!(claude[0].how.starts_with("claude-code reports its spend"));
        assert!(claude[1].how.contains("Claude Code's permission channel"));
        let codex = permissions(AgentKind::Codex, true, both);
        assert_eq!(flags(&codex), [("budget", "not enforced"), ("ask", "not enforced")]);
        assert!(codex[1].how.contains("submit refuses ask rules for codex"));
        let batch = permissions(AgentKind::Codex, true, |t| t.budget_group = Some(7));
        assert_eq!(flags(&batch), [("budget", "not enforced")]);
        assert!(permissions(AgentKind::ClaudeCode, true, |_| {}).is_empty());
    }
}
