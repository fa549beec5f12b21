//! Reading what the agent said into the task's result ([`TaskResult`], which the queue owns):
//! its report block, its question, its summary and the tests it ran, checked against what the
//! event stream shows it did.

use crate::events::RunLog;
pub use queue::{AgentReport, Check, Permission, PermissionRequest, TaskResult, TestRun};
use serde::Deserialize;
use serde_json::Value;

/// What the agent put in its ```taskbridge-result block.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ReportedResult {
    #[serde(default)]
    pub summary: Option<String>,
    #[serde(default)]
    pub tests_run: Vec<Value>,
    #[serde(default)]
    pub open_questions: Vec<String>,
}

/// The body of the last fenced block with the given info string, e.g. ```taskbridge-result.
pub fn fenced_block(text: &str, info: &str) -> Option<String> {
    let mut found = None;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        let fence: String = t.chars().take_while(|&c| c == '`' || c == '~').collect();
        if fence.len() >= 3 && t[fence.len()..].trim() == info {
            let mut body = Vec::new();
            for l in lines.by_ref() {
                if l.trim() == fence {
                    break;
                }
                body.push(l);
            }
            found = Some(body.join("\n"));
        }
    }
    found
}

/// The text with every ```taskbridge-* block removed, for a summary taken from free text.
fn without_blocks(text: &str) -> String {
    let mut out = Vec::new();
    let mut skipping: Option<String> = None;
    for line in text.lines() {
        let t = line.trim_start();
        match &skipping {
            Some(fence) if line.trim() == fence => skipping = None,
            Some(_) => {}
            None => {
                let fence: String = t.chars().take_while(|&c| c == '`' || c == '~').collect();
                if fence.len() >= 3 && t[fence.len()..].trim().starts_with("taskbridge-") {
                    skipping = Some(fence);
                } else {
                    out.push(line);
                }
            }
        }
    }
    out.join("\n").trim().to_owned()
}

/// How a question from the agent's answer carries its options: a last line of its own.
const OPTIONS: &str = "Options: ";
const OPTION_SEP: &str = " | ";

/// A question asked in the agent's answer, split into the question and the options it offers
/// (its last line, as [`question`] writes it), for a picker to offer them; `None` without.
pub fn question_options(question: &str) -> Option<(&str, Vec<&str>)> {
    let (text, last) = question.rsplit_once('\n')?;
    let options: Vec<&str> = last.strip_prefix(OPTIONS)?.split(OPTION_SEP).collect();
    (!options.iter().any(|o| o.trim().is_empty())).then_some((text, options))
}

/// The question from a ```taskbridge-question block: plain text, or JSON with a `question` key.
pub fn question(final_text: &str) -> Option<String> {
    let body = fenced_block(final_text, "taskbridge-question")?;
    let body = body.trim();
    if body.is_empty() {
        return None;
    }
    if let Ok(v) = serde_json::from_str::<Value>(body)
        && let Some(q) = v.get("question").and_then(Value::as_str)
    {
        let mut q = q.to_owned();
        if let Some(opts) = v.get("options").and_then(Value::as_array) {
            let opts: Vec<String> =
                opts.iter().map(|o| o.as_str().map_or(o.to_string(), str::to_owned)).collect();
            q.push_str(&format!("\n{OPTIONS}{}", opts.join(OPTION_SEP)));
        }
        return Some(q);
    }
    Some(body.to_owned())
}

pub fn reported(final_text: &str) -> ReportedResult {
    fenced_block(final_text, "taskbridge-result")
        .and_then(|b| serde_json::from_str(&b).ok())
        .unwrap_or_default()
}

pub fn summary(final_text: &str, reported: &ReportedResult) -> String {
    reported
        .summary
        .clone()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| without_blocks(final_text))
}

const TEST_WORDS: &[&str] = &[
    "test",
    "pytest",
    "jest",
    "vitest",
    "mocha",
    "rspec",
    "ctest",
    "nextest",
    "tox",
    "phpunit",
    "make check",
    "go vet",
    "spec",
];

fn looks_like_test(cmd: &str) -> bool {
    let c = cmd.to_lowercase();
    TEST_WORDS.iter().any(|w| c.contains(w))
}

fn normalise(cmd: &str) -> String {
    cmd.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Test commands the agent really ran (bash calls that look like tests, with exit codes), then
/// any it claimed in its report without running them, marked not observed.
pub fn tests_run(run: &RunLog, reported: &ReportedResult) -> Vec<TestRun> {
    let mut out: Vec<TestRun> = run
        .tool_calls
        .iter()
        .filter(|c| c.tool == "bash" && looks_like_test(&c.target))
        .map(|c| TestRun { command: c.target.clone(), exit_code: c.exit_code, observed: true })
        .collect();
    for claim in &reported.tests_run {
        let cmd = match claim {
            Value::String(s) => s.clone(),
            other => other.get("command").and_then(Value::as_str).unwrap_or_default().to_owned(),
        };
        if cmd.trim().is_empty() {
            continue;
        }
        let n = normalise(&cmd);
        let seen = run.tool_calls.iter().any(|c| {
            c.tool == "bash" && (normalise(&c.target) == n || normalise(&c.target).contains(&n))
        });
        if !seen && !out.iter().any(|t| normalise(&t.command) == n) {
            out.push(TestRun { command: cmd, exit_code: None, observed: false });
        }
    }
    out
}

/// How each safety flag was applied on this agent, and what the sandbox held, said honestly:
/// a flag the kernel held says so first, then what the agent's own rules add.
pub fn permissions_for(
    kind: crate::agent::AgentKind,
    readonly: bool,
    no_shell: bool,
    no_network: bool,
    held: &crate::sandbox::Held,
) -> Vec<Permission> {
    let mut flags = agent_permissions(kind, readonly, no_shell, no_network);
    for p in &mut flags {
        let by_kernel = match p.flag.as_str() {
            "readonly" => held
                .by_kernel(false)
                .map(|k| format!("{k}: the worktree is read-only to the agent and all it runs")),
            "no_network" => held.by_kernel(true),
            _ => None,
        };
        if let Some(k) = by_kernel {
            p.enforcement = "kernel".into();
            p.how = format!("{k}; besides, {}", p.how);
        }
    }
    flags.push(match (held.abi, &held.missing) {
        (Some(_), _) => Permission {
            flag: "sandbox".into(),
            enabled: true,
            enforcement: "kernel".into(),
            how: format!(
                "{}: the agent and all it runs write only in {}, the git directories, the \
                 agent's own state and a private TMPDIR, and cannot read TaskBridge's home or \
                 the queue's database",
                held.by_kernel(false).unwrap_or_default(),
                match held.repository {
                    true => "the worktrees of the task's repository (the warm server's wall)",
                    false => "the task's worktree",
                }
            ),
        },
        (None, why) => Permission {
            flag: "sandbox".into(),
            enabled: false,
            enforcement: "none".into(),
            how: why.clone().unwrap_or_else(|| "the agent ran without a sandbox".into()),
        },
    });
    flags
}

/// How each safety flag is applied by the agent's own rules.
fn agent_permissions(
    kind: crate::agent::AgentKind,
    readonly: bool,
    no_shell: bool,
    no_network: bool,
) -> Vec<Permission> {
    use crate::agent::AgentKind;
    let p = |flag: &str, enabled: bool, enforcement: &str, how: &str| Permission {
        flag: flag.into(),
        enabled,
        enforcement: enforcement.into(),
        how: how.into(),
    };
    match kind {
        AgentKind::OpenCode => permissions(readonly, no_shell, no_network),
        AgentKind::ClaudeCode => vec![
            p(
                "readonly",
                readonly,
                "enforced",
                "Claude Code's Edit, MultiEdit, Write and NotebookEdit tools are removed, every \
                 other tool call is decided by TaskBridge, and every change left in the worktree \
                 is reverted after the run and listed in reverted_files",
            ),
            p("no_shell", no_shell, "enforced", "Claude Code's Bash tools are removed"),
            p(
                "no_network",
                no_network,
                "advisory",
                "Claude Code's WebFetch and WebSearch tools are removed; shell commands could \
                 still reach the network",
            ),
        ],
        AgentKind::Codex => vec![
            p(
                "readonly",
                readonly,
                "enforced",
                "Codex runs in its read-only sandbox, and every change left in the worktree is \
                 reverted after the run and listed in reverted_files",
            ),
            p(
                "no_shell",
                no_shell,
                "not enforced",
                "codex exec always has its shell tool; submit refuses no_shell for codex, so \
                 only a task queued otherwise gets here",
            ),
            p(
                "no_network",
                no_network,
                "enforced",
                "Codex's sandbox runs commands with its network off (TaskBridge sets \
                 sandbox_workspace_write.network_access=false, whatever the user's config says)",
            ),
        ],
        AgentKind::Acp => vec![
            p(
                "readonly",
                readonly,
                "enforced",
                "every change the agent asks to make is denied, and every change left in the \
                 worktree is reverted after the run and listed in reverted_files",
            ),
            p(
                "no_shell",
                no_shell,
                "enforced where the agent asks",
                "every command the agent asks to run is denied; an agent that runs commands \
                 without asking is held only by the sandbox",
            ),
            p(
                "no_network",
                no_network,
                "enforced where the agent asks",
                "every fetch the agent asks for is denied; the sandbox holds the rest where the \
                 kernel can",
            ),
        ],
    }
}

/// How each safety flag was applied on OpenCode, said honestly.
pub fn permissions(readonly: bool, no_shell: bool, no_network: bool) -> Vec<Permission> {
    let p = |flag: &str, enabled: bool, enforcement: &str, how: &str| Permission {
        flag: flag.into(),
        enabled,
        enforcement: enforcement.into(),
        how: how.into(),
    };
    vec![
        p(
            "readonly",
            readonly,
            "enforced",
            "OpenCode's edit permission is denied, and every change left in the worktree (for \
             example by a shell command) is reverted after the run and listed in reverted_files",
        ),
        p("no_shell", no_shell, "enforced", "OpenCode's bash permission is denied"),
        p(
            "no_network",
            no_network,
            "advisory",
            "OpenCode's webfetch and websearch permissions are denied; shell commands could \
             still reach the network",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::ToolCall;

    const REPORT: &str = "Done.\n\n```taskbridge-result\n{\"summary\": \"Added parse()\", \"tests_run\": [\"cargo test\", \"npm test\"], \"open_questions\": [\"Keep the old API?\"]}\n```\n";

    #[test]
    fn reported_block_gives_summary_and_questions() {
        let r = reported(REPORT);
        assert_eq!(summary(REPORT, &r), "Added parse()");
        assert_eq!(r.open_questions, vec!["Keep the old API?"]);
        let plain = "Fixed it.\n```taskbridge-result\nnot json\n```";
        assert_eq!(summary(plain, &reported(plain)), "Fixed it.");
    }

    #[test]
    fn claimed_tests_that_never_ran_are_marked_not_observed() {
        let run = RunLog {
            tool_calls: vec![ToolCall {
                tool: "bash".into(),
                target: "cargo  test".into(),
                status: "completed".into(),
                exit_code: Some(101),
            }],
            ..Default::default()
        };
        let t = tests_run(&run, &reported(REPORT));
        assert_eq!(
            t,
            vec![
                TestRun { command: "cargo  test".into(), exit_code: Some(101), observed: true },
                TestRun { command: "npm test".into(), exit_code: None, observed: false },
            ]
        );
    }

    #[test]
    fn question_block_in_text_or_json() {
        assert_eq!(
            question("I need input.\n```taskbridge-question\nSQLite or Postgres?\n```").as_deref(),
            Some("SQLite or Postgres?")
        );
        assert_eq!(
            question("```taskbridge-question\n{\"question\": \"Which?\", \"options\": [\"a\", \"b\"]}\n```").as_deref(),
            Some("Which?\nOptions: a | b")
        );
        assert_eq!(question("no block"), None);
    }

    #[test]
    fn a_questions_options_are_read_back_as_it_wrote_them() {
        let q = question(
            "```taskbridge-question\n{\"question\": \"Red\\nor blue?\", \"options\": [\"red\", \"dark blue\"]}\n```",
        )
        .unwrap();
        assert_eq!(question_options(&q), Some(("Red\nor blue?", vec!["red", "dark blue"])));
        for plain in ["Which?", "Which?\nOptions: ", "Which?\nOptions: a |  | b", "Options: a"] {
            assert_eq!(question_options(plain), None, "{plain}");
        }
    }

    fn bash(target: &str) -> ToolCall {
        ToolCall {
            tool: "bash".into(),
            target: target.into(),
            status: "completed".into(),
            exit_code: Some(0),
        }
    }

    #[test]
    fn only_a_block_with_the_info_string_is_read_and_only_taskbridge_blocks_are_cut() {
        let text = "Here:\n```rust\nfn main() {}\n```\nand\n```taskbridge-result\n{}\n```\nbye";
        assert_eq!(fenced_block("```json\n{}\n```", "taskbridge-result"), None);
        assert_eq!(fenced_block(text, "taskbridge-result").as_deref(), Some("{}"));
        assert_eq!(fenced_block(text, "rust").as_deref(), Some("fn main() {}"));
        assert_eq!(without_blocks(text), "Here:\n```rust\nfn main() {}\n```\nand\nbye");
    }

    #[test]
    fn a_test_is_a_shell_command_that_looks_like_one() {
        let run = RunLog {
            tool_calls: vec![
                bash("ls -la"),
                ToolCall { tool: "read".into(), ..bash("src/test_parse.rs") },
                bash("pytest -q"),
            ],
            ..Default::default()
        };
        let t = tests_run(&run, &ReportedResult::default());
        assert_eq!(
            t,
            vec![TestRun { command: "pytest -q".into(), exit_code: Some(0), observed: true }]
        );
    }

    #[test]
    fn a_claimed_test_run_inside_a_longer_command_is_observed() {
        let run = RunLog {
            tool_calls: vec![
                bash("cd app && cargo test -q"),
                ToolCall { tool: "read".into(), ..bash("npm test") },
            ],
            ..Default::default()
        };
        let claims = ReportedResult {
            tests_run: vec![Value::from("cargo test"), serde_json::json!({"command": "npm test"})],
            ..Default::default()
        };
        assert_eq!(
            tests_run(&run, &claims),
            vec![
                TestRun {
                    command: "cd app && cargo test -q".into(),
                    exit_code: Some(0),
                    observed: true
                },
                // Reading a file named like the command is not running it.
                TestRun { command: "npm test".into(), exit_code: None, observed: false },
            ]
        );
    }

    #[test]
    fn a_flag_the_kernel_held_says_so_and_the_sandbox_is_listed_either_way() {
        use crate::agent::AgentKind;
        let held = crate::sandbox::Held { abi: Some(7), network: true, ..Default::default() };
        let ps = permissions_for(AgentKind::OpenCode, true, false, true, &held);
        let by = |f: &str| ps.iter().find(|p| p.flag == f).unwrap().clone();
        assert_eq!(by("readonly").enforcement, "kernel");
        assert!(by("readonly").how.starts_with("enforced by the kernel (Landlock ABI 7)"));
        assert!(by("readonly").how.contains("besides, OpenCode's edit permission is denied"));
        assert_eq!(by("no_network").enforcement, "kernel");
        assert_eq!(by("no_shell").enforcement, "enforced");
        assert_eq!((by("sandbox").enabled, by("sandbox").enforcement.as_str()), (true, "kernel"));
        let fs_only = crate::sandbox::Held { network: false, ..held };
        let ps = permissions_for(AgentKind::ClaudeCode, false, false, true, &fs_only);
        let net = ps.iter().find(|p| p.flag == "no_network").unwrap();
        assert_eq!(net.enforcement, "advisory", "a wall without TCP rules held no network");
        let off = crate::sandbox::Held {
            missing: Some("the sandbox is off".into()),
            ..Default::default()
        };
        let ps = permissions_for(AgentKind::Codex, true, false, false, &off);
        let sandbox = ps.iter().find(|p| p.flag == "sandbox").unwrap();
        assert_eq!((sandbox.enabled, sandbox.how.as_str()), (false, "the sandbox is off"));
        assert_eq!(ps.iter().find(|p| p.flag == "readonly").unwrap().enforcement, "enforced");
    }

    #[test]
    fn every_agent_reports_all_three_flags_with_how_each_held() {
        use crate::agent::AgentKind;
        let words = |ps: Vec<Permission>| {
            ps.into_iter().map(|p| (p.flag, p.enabled, p.enforcement)).collect::<Vec<_>>()
        };
        let permissions_for = agent_permissions;
        let e = |f: &str, on: bool, how: &str| (f.to_owned(), on, how.to_owned());
        assert_eq!(
            words(permissions_for(AgentKind::OpenCode, true, false, true)),
            vec![
                e("readonly", true, "enforced"),
                e("no_shell", false, "enforced"),
                e("no_network", true, "advisory")
            ]
        );
        assert_eq!(
            words(permissions_for(AgentKind::ClaudeCode, false, true, false)),
            vec![
                e("readonly", false, "enforced"),
                e("no_shell", true, "enforced"),
                e("no_network", false, "advisory")
            ]
        );
        assert_eq!(
            words(permissions_for(AgentKind::Codex, true, true, true)),
            vec![
                e("readonly", true, "enforced"),
                e("no_shell", true, "not enforced"),
                e("no_network", true, "enforced")
            ]
        );
    }
}
