//! The permission policy every agent's tool calls meet: the task's rules (its `ask` rules and the
//! flags' denies), the grants earlier answers made, OpenCode's wildcard, and the decision on one
//! tool call. It sits below the agents and their server, which all read it and none of which it
//! knows.

use queue::{Ask, PermissionAsk, Task};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Permission requests approved without asking: the task's earlier `always` answers, and an
/// approval that arrives as a prompt after the blocked request was lost.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// (permission, pattern), for the rest of the task.
    pub always: Vec<(String, String)>,
    /// (permission, patterns), for the next matching request only.
    pub once: Vec<(String, Vec<String>)>,
}

impl Grants {
    /// Whether `p` is approved; a one-time approval is used up.
    pub fn approves(&mut self, p: &PermissionAsk) -> bool {
        if let Some(i) =
            self.once.iter().position(|(perm, pats)| perm == &p.permission && pats == &p.patterns)
        {
            self.once.remove(i);
            return true;
        }
        !p.patterns.is_empty()
            && p.patterns.iter().all(|pat| {
                self.always.iter().any(|(perm, glob)| {
                    (perm == "*" || perm == &p.permission) && wildcard_match(glob, pat)
                })
            })
    }
}

/// OpenCode's wildcard: `*` any run of characters, `?` one.
pub fn wildcard_match(glob: &str, text: &str) -> bool {
    let (g, t): (Vec<char>, Vec<char>) = (glob.chars().collect(), text.chars().collect());
    let (mut gi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        // A star first: read as a literal, a `*` in the text would use the glob's star up and
        // leave nothing to backtrack to (`echo *` would not cover `echo **`).
        if gi < g.len() && g[gi] == '*' {
            star = Some(gi);
            mark = ti;
            gi += 1;
        } else if gi < g.len() && (g[gi] == '?' || g[gi] == t[ti]) {
            gi += 1;
            ti += 1;
        } else if let Some(s) = star {
            gi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|c| *c == '*')
}

/// The rules every task's session starts from: everything allowed but leaving the directory.
/// A task with no `ask` rules and no flags has exactly these, so a session made before its task
/// is known (`crate::agent::opencode_serve`'s sessions made ahead) is made with them.
pub fn base_rules() -> Vec<Value> {
    vec![
        json!({"permission": "*", "pattern": "*", "action": "allow"}),
        json!({"permission": "external_directory", "pattern": "*", "action": "deny"}),
    ]
}

/// The task's rules as the session's permission rules. The last matching rule wins and a
/// request no rule matches asks, so everything is allowed first; then the task's `ask` rules;
/// then the flags' denies, which no `ask` rule may loosen.
pub fn permission_rules(task: &Task) -> Value {
    let mut rules = base_rules();
    for rule in &task.ask_rules {
        if let Ok((permission, pattern)) = queue::parse_ask_rule(rule) {
            rules.push(json!({"permission": permission, "pattern": pattern, "action": "ask"}));
        }
    }
    let mut deny = |p: &str| rules.push(json!({"permission": p, "pattern": "*", "action": "deny"}));
    if task.readonly {
        deny("edit");
    }
    if task.no_shell {
        deny("bash");
    }
    if task.no_network {
        deny("webfetch");
        deny("websearch");
    }
    Value::Array(rules)
}

/// What the supervisor answers to a request the agent made over its control channel.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Go on, with the tool call's input (a question's answers added to it, say).
    Allow { input: Value },
    /// Refused, with the reason the agent reads.
    Deny { message: String },
    /// Nobody here can decide: the run stops and the task waits for an answer.
    Wait,
}

/// A tool call, as the permission it needs in TaskBridge's vocabulary (OpenCode's: `bash`,
/// `edit`, `read`, `webfetch`, ...) and the pattern the task's rules are matched against.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolUse {
    pub permission: String,
    pub pattern: String,
}

/// Decides a tool call the way OpenCode's server does for the task's rules: a change outside
/// the task's worktree `dir` and the flags' denies first (no `ask` rule loosens them), then the
/// task's `ask` rules, which wait for an answer unless an earlier answer granted it; everything
/// else is allowed (the worktree is the task's).
pub fn decide(
    task: &Task,
    dir: &Path,
    grants: &mut Grants,
    tool: &ToolUse,
    input: &Value,
) -> Decision {
    let denied = match tool.permission.as_str() {
        "edit" if outside(dir, &tool.pattern) => {
            Some("it changes a file outside the task's worktree; work in the worktree")
        }
        "edit" if task.readonly => Some("this task is read-only: it may not change files"),
        "bash" if task.no_shell => Some("this task may not run shell commands"),
        "webfetch" | "websearch" if task.no_network => Some("this task may not use the network"),
        _ => None,
    };
    if let Some(why) = denied {
        return Decision::Deny { message: format!("TaskBridge denied this: {why}.") };
    }
    let ask = permission_ask(tool);
    if rules_ask(task, tool) && !grants.approves(&ask) {
        return Decision::Wait;
    }
    Decision::Allow { input: input.clone() }
}

/// Whether one of `task`'s ask rules names `tool`.
pub fn rules_ask(task: &Task, tool: &ToolUse) -> bool {
    task.ask_rules
        .iter()
        .filter_map(|r| queue::parse_ask_rule(r).ok())
        .any(|(p, glob)| (p == "*" || p == tool.permission) && wildcard_match(&glob, &tool.pattern))
}

/// Whether `path` (as a tool names it: absolute, or relative to the worktree) is outside `dir`.
/// `..` is resolved by the path's words, so a path that climbs out is outside.
pub(crate) fn outside(dir: &Path, path: &str) -> bool {
    use std::path::Component;
    let joined = dir.join(path);
    let mut normal = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                normal.pop();
            }
            Component::CurDir => {}
            other => normal.push(other),
        }
    }
    let real = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    !(normal.starts_with(dir) || normal.starts_with(&real))
}

/// The permission request a tool call makes, as the task waits on it.
pub fn permission_ask(tool: &ToolUse) -> PermissionAsk {
    PermissionAsk {
        permission: tool.permission.clone(),
        patterns: vec![tool.pattern.clone()],
        target: Some(tool.pattern.clone()),
        always: vec![tool.pattern.clone()],
    }
}

/// A decision an agent asked for, with the request it is answered on.
pub fn permission_decision(tool: &ToolUse) -> Ask {
    Ask::permission(permission_ask(tool))
}

/// The decision `task`'s ask rules wait on for `tool`: an `always` approves what the rules that
/// asked name (`git push*`), for the rest of the task, not only this one command.
pub fn rule_decision(task: &Task, tool: &ToolUse) -> Ask {
    let mut ask = permission_ask(tool);
    let globs: Vec<String> = task
        .ask_rules
        .iter()
        .filter_map(|r| queue::parse_ask_rule(r).ok())
        .filter(|(p, glob)| {
            (p == "*" || *p == tool.permission) && wildcard_match(glob, &tool.pattern)
        })
        .map(|(_, glob)| glob)
        .collect();
    if !globs.is_empty() {
        ask.always = globs;
    }
    Ask::permission(ask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_deny_before_ask_rules_and_an_always_grant_lets_the_next_call_through() {
        let mut t = crate::sample_task();
        t.no_shell = true;
        let bash = ToolUse { permission: "bash".into(), pattern: "git push origin".into() };
        let dir = Path::new("/w/task-1");
        let d = decide(&t, dir, &mut Grants::default(), &bash, &Value::Null);
        assert!(matches!(d, Decision::Deny { .. }), "{d:?}");
        t.no_shell = false;
        t.ask_rules = vec!["bash:git push*".into()];
        assert_eq!(decide(&t, dir, &mut Grants::default(), &bash, &Value::Null), Decision::Wait);
        let mut grants = Grants { always: vec![("bash".into(), "git push*".into())], once: vec![] };
        assert!(matches!(
            decide(&t, dir, &mut grants, &bash, &Value::Null),
            Decision::Allow { .. }
        ));
        let ls = ToolUse { permission: "bash".into(), pattern: "ls".into() };
        assert!(matches!(
            decide(&t, dir, &mut Grants::default(), &ls, &Value::Null),
            Decision::Allow { .. }
        ));
    }

    #[test]
    fn always_on_a_rules_request_approves_what_the_rule_names() {
        let mut t = crate::sample_task();
        t.ask_rules = vec!["bash:echo deploy*".into(), "edit:*".into()];
        let tool = ToolUse { permission: "bash".into(), pattern: "echo deploy-one".into() };
        let ask = rule_decision(&t, &tool);
        let p = ask.permission.unwrap();
        assert_eq!(
            (p.patterns, p.always),
            (vec!["echo deploy-one".to_owned()], vec!["echo deploy*".to_owned()])
        );
        t.ask_rules.clear();
        let p = rule_decision(&t, &tool).permission.unwrap();
        assert_eq!(p.always, vec!["echo deploy-one".to_owned()], "no rule: the command itself");
        // A rule for every permission asks about this one too; a rule for another does not.
        t.ask_rules = vec!["*:echo *".into()];
        assert!(rules_ask(&t, &tool));
        t.ask_rules = vec!["edit:echo *".into()];
        assert!(!rules_ask(&t, &tool));
    }

    #[test]
    fn an_edit_outside_the_worktree_is_denied_and_one_inside_allowed() {
        let t = crate::sample_task();
        let dir = Path::new("/w/task-1");
        let edit = |p: &str| ToolUse { permission: "edit".into(), pattern: p.into() };
        let decided = |p: &str| decide(&t, dir, &mut Grants::default(), &edit(p), &Value::Null);
        for inside in ["/w/task-1/src/a.rs", "src/a.rs", "/w/task-1/x/../b.rs"] {
            assert!(matches!(decided(inside), Decision::Allow { .. }), "{inside}");
        }
        for out in ["/w/repo/src/a.rs", "../repo/a.rs", "/w/task-1/../task-2/a.rs", "/etc/passwd"] {
            assert!(matches!(decided(out), Decision::Deny { .. }), "{out}");
        }
    }

    #[test]
    fn wildcards_match_as_opencode_reads_them() {
        assert!(wildcard_match("git push *", "git push origin main"));
        assert!(wildcard_match("*", ""));
        assert!(wildcard_match("*.lock", "Cargo.lock"));
        assert!(wildcard_match("a?c", "abc"));
        assert!(!wildcard_match("git push *", "git pull"));
        assert!(!wildcard_match("*.lock", "Cargo.lock.bak"));
    }

    #[test]
    fn an_always_grant_covers_its_pattern_and_a_once_grant_is_used_up() {
        let ask = |pat: &str| PermissionAsk {
            permission: "bash".into(),
            patterns: vec![pat.into()],
            target: None,
            always: vec![],
        };
        let mut g = Grants { always: vec![("bash".into(), "git push *".into())], once: vec![] };
        assert!(g.approves(&ask("git push origin")));
        assert!(!g.approves(&ask("rm -rf /")));
        g.once.push(("bash".into(), vec!["rm -rf build".into()]));
        assert!(g.approves(&ask("rm -rf build")));
        assert!(!g.approves(&ask("rm -rf build")), "once means once");
    }

    #[test]
    fn the_flags_denies_come_after_the_ask_rules_so_no_ask_loosens_them() {
        let task = queue::Task {
            ask_rules: vec!["bash:git push*".into()],
            no_shell: true,
            ..crate::sample_task()
        };
        let rules = permission_rules(&task);
        let rules = rules.as_array().unwrap();
        let ask = rules.iter().position(|r| r["action"] == "ask").unwrap();
        let deny = rules.iter().rposition(|r| r["permission"] == "bash").unwrap();
        assert!(deny > ask, "{rules:?}");
        assert_eq!(rules[deny]["action"], "deny");
        assert!(!rules.iter().any(|r| r["permission"] == "question"), "the question tool is on");
    }

    #[test]
    fn wildcards_backtrack_and_a_pattern_must_cover_the_whole_text() {
        assert!(wildcard_match("a*b*c", "a-b-b-c"));
        assert!(wildcard_match("*b", "abab"));
        assert!(wildcard_match("a**", "a"));
        assert!(wildcard_match("", ""));
        assert!(!wildcard_match("", "a"));
        assert!(!wildcard_match("a", ""));
        assert!(!wildcard_match("a?", "a"));
        assert!(!wildcard_match("abc", "abd"));
        assert!(!wildcard_match("a*c", "abcd"));
        assert!(!wildcard_match("ab", "a"));
        assert!(wildcard_match("?", "é"), "a character, not a byte");
        // A star in the text is text like any other.
        assert!(wildcard_match("echo *", "echo **"));
        assert!(wildcard_match("ls *?", "ls a*"));
        assert!(wildcard_match("rm *", "rm -rf *"));
    }

    #[test]
    fn a_grant_covers_every_pattern_asked_of_its_permission_or_any_for_a_star() {
        let ask = |perm: &str, pats: &[&str]| PermissionAsk {
            permission: perm.into(),
            patterns: pats.iter().map(|p| p.to_string()).collect(),
            target: None,
            always: vec![],
        };
        let mut g = Grants { always: vec![("bash".into(), "git *".into())], once: vec![] };
        assert!(g.approves(&ask("bash", &["git status", "git log"])));
        assert!(!g.approves(&ask("bash", &["git status", "rm x"])), "every pattern, not one");
        assert!(!g.approves(&ask("edit", &["git status"])), "only its own permission");
        assert!(!g.approves(&ask("bash", &[])), "a request naming nothing is asked");
        g.always.push(("*".into(), "src/*".into()));
        assert!(g.approves(&ask("edit", &["src/lib.rs"])));
        // A once grant is for the same permission and the same patterns only.
        g.once.push(("edit".into(), vec!["README.md".into()]));
        assert!(!g.approves(&ask("write", &["README.md"])));
        assert!(!g.approves(&ask("edit", &["README.md", "x"])));
        assert!(g.approves(&ask("edit", &["README.md"])));
        assert!(g.once.is_empty());
    }

    #[test]
    fn each_flag_denies_its_own_permissions_after_everything_is_allowed() {
        let rules = |readonly, no_shell, no_network| {
            let task = queue::Task {
                readonly,
                no_shell,
                no_network,
                ask_rules: vec!["edit:*.lock".into(), "not a rule".into()],
                ..crate::sample_task()
            };
            permission_rules(&task)
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    format!(
                        "{} {} {}",
                        r["permission"].as_str().unwrap(),
                        r["pattern"].as_str().unwrap(),
                        r["action"].as_str().unwrap()
                    )
                })
                .collect::<Vec<_>>()
        };
        let first = ["* * allow", "external_directory * deny", "edit *.lock ask"];
        assert_eq!(rules(false, false, false), first);
        let mut all = first.to_vec();
        all.extend(["edit * deny", "bash * deny", "webfetch * deny", "websearch * deny"]);
        assert_eq!(rules(true, true, true), all);
        let mut net = first.to_vec();
        net.extend(["webfetch * deny", "websearch * deny"]);
        assert_eq!(rules(false, false, true), net);
    }

    #[test]
    fn a_task_without_ask_rules_or_flags_has_the_base_rules_and_any_of_them_changes_them() {
        let plain = crate::sample_task();
        assert_eq!(permission_rules(&plain), Value::Array(base_rules()));
        let asks = queue::Task { ask_rules: vec!["bash:git push*".into()], ..plain.clone() };
        let no_shell = queue::Task { no_shell: true, ..plain };
        for task in [asks, no_shell] {
            assert_ne!(permission_rules(&task), Value::Array(base_rules()));
        }
    }
}
