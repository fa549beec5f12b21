//! Claude Code of today (2.1.328, pinned beside 2.1.197): it opens with `server/discover`
//! (2026-07-28), keeps MCP tools behind ToolSearch, and shows elicitation as its own dialog.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::{MockAnthropic, Turn};
use crate::support::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;

fn claude328() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/cc328/node_modules/.bin/claude");
    assert!(
        p.exists(),
        "Claude Code 2.1.328 is not installed at {}: run `npm install --prefix .tools/cc328 \
         @anthropic-ai/claude-code@2.1.328` (what .ci/run does)",
        p.display()
    );
    p
}

/// `claude -p PROMPT` (2.1.328) in the test's HOME, allowed TaskBridge's tools.
fn claude_p(env: &Env, prompt: &str) -> String {
    let out = Command::new(claude328())
        .args(["-p", prompt, "--allowedTools", "mcp__taskbridge"])
        .current_dir(&env.repo)
        .envs(env.env_vars())
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("IS_SANDBOX")
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "claude -p failed: {text}");
    text
}

fn tool_names(request: &serde_json::Value) -> Vec<String> {
    let tools = request["tools"].as_array().cloned().unwrap_or_default();
    tools.iter().filter_map(|t| t["name"].as_str().map(str::to_owned)).collect()
}

/// The planner loop as Claude Code 2.1.328 runs it in `-p` mode: the model finds TaskBridge's
/// tools with ToolSearch, run_task delegates the task, the agent's question is put to Claude
/// Code itself (which, with no one at a terminal, cancels it), the model answers with
/// answer_task, wait_for sees the task done.
#[test]
fn claude_code_2_1_328_p_finds_the_tools_runs_a_task_and_answers_its_question() {
    let mock = MockAnthropic::spawn(vec![Turn::text(
        "Done.\n```taskbridge-result\n{\"summary\": \"Added a blue banner.\", \"tests_run\": []}\n```",
    )]);
    let env = Env::new().with_mock(&mock).with_claude(&mock);
    env.ok(&["config", "claude-code", "--write"]);
    // Claude Code's turns, each recognised by what it last got; the agent's from its prompt.
    mock.answer_when(
        "Delegate the banner",
        Turn::tool(
            "ToolSearch",
            json!({"query": "select:mcp__taskbridge__run_task,mcp__taskbridge__wait_for,mcp__taskbridge__answer_task"}),
        ),
    );
    mock.answer_when(
        "Tool loaded.",
        Turn::tool(
            "mcp__taskbridge__run_task",
            json!({"prompt": "Banner\nBANNER-BODY: add banner.txt", "repo": env.repo}),
        ),
    );
    mock.answer_when(
        "BANNER-BODY",
        Turn::text("I need a decision.\n\n```taskbridge-question\nShould it be red or blue?\n```"),
    );
    mock.answer_after(
        "asked in the client",
        Turn::tool("mcp__taskbridge__answer_task", json!({"task_id": 1, "answer": "Blue."})),
    );
    mock.answer_when(
        "The planner answered your question",
        Turn::tool(
            "write",
            json!({"filePath": env.worktree(1).join("banner.txt"), "content": "blue banner\n"}),
        ),
    );
    mock.answer_after(
        "\"answered_by\":\"mcp:claude-code\"",
        Turn::tool("mcp__taskbridge__wait_for", json!({"task_ids": [1], "timeout_s": 50})),
    );
    mock.answer_after("\"done\":[1]", Turn::text("The banner task is done."));

    let out = claude_p(&env, "Delegate the banner");
    assert!(out.contains("The banner task is done."), "{out}");
    // Claude Code validates the tools' schemas with ajv, which warns of every format JSON
    // Schema does not define (`uint` was 44–66 lines a run).
    assert!(!out.contains("unknown format"), "schema warnings: {out}");
    let reqs = mock.requests();
    // The tools stay deferred until the model searched for them.
    assert!(!tool_names(&reqs[0]).iter().any(|t| t.starts_with("mcp__taskbridge__")));
    assert!(tool_names(&reqs[0]).contains(&"ToolSearch".to_owned()));
    let after_search = reqs.iter().find(|r| r["messages"].to_string().contains("tool_reference"));
    let names = tool_names(after_search.unwrap());
    assert!(names.contains(&"mcp__taskbridge__run_task".to_owned()), "{names:?}");
    // Claude Code was asked itself, and the model read that it did not answer.
    let relayed = reqs.iter().any(|r| {
        r["messages"]
            .to_string()
            .contains("asked in the client: cancelled; answer with answer_task")
    });
    assert!(relayed, "the run_task reply says the client was asked");
    let task = env.show(1);
    assert_eq!(task["status"], "done", "{task}");
    assert_eq!(task["questions"][0]["answer"], "Blue.");
    // Who answered: the client's name, which 2026-07-28 carries in each request.
    assert_eq!(task["questions"][0]["answered_by"], "mcp:claude-code", "{task}");
    assert_eq!(task["result"]["files_touched"][0]["path"], "banner.txt", "{task}");
}

/// Claude Code 2.1.328 as a person uses it, in tmux: run_task becomes an MCP task in Claude
/// Code's background, the agent's question comes up as Claude Code's own dialog, the person
/// types the answer and accepts it, the agent goes on in its session, and Claude Code is told
/// the task completed, with its result.
#[test]
fn claude_code_2_1_328_shows_the_agents_question_as_its_own_dialog_and_keys_answer_it() {
    let mock = MockAnthropic::spawn(vec![]);
    let env = Env::new().with_mock(&mock).with_claude(&mock);
    env.ok(&["config", "claude-code", "--write"]);
    // A returning user: onboarding done, this folder trusted.
    let config_path = env.oc_home.join(".claude.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["hasCompletedOnboarding"] = json!(true);
    config["theme"] = json!("dark");
    config["projects"][env.repo.display().to_string()] =
        json!({"hasTrustDialogAccepted": true, "allowedTools": []});
    std::fs::write(&config_path, config.to_string()).unwrap();
    mock.answer_when(
        "Delegate the banner",
        Turn::tool("ToolSearch", json!({"query": "select:mcp__taskbridge__run_task"})),
    );
    mock.answer_when(
        "Tool loaded.",
        Turn::tool(
            "mcp__taskbridge__run_task",
            json!({"prompt": "Banner\nBANNER-BODY: add banner.txt", "repo": env.repo}),
        ),
    );
    mock.answer_after("started server-side task 1", Turn::text("Task 1 runs in the background."));
    mock.answer_when(
        "BANNER-BODY",
        Turn::text("I need a decision.\n\n```taskbridge-question\nShould it be red or blue?\n```"),
    );
    mock.answer_when(
        "The planner answered your question",
        Turn::tool(
            "write",
            json!({"filePath": env.worktree(1).join("banner.txt"), "content": "blue banner\n"}),
        ),
    );
    mock.answer_after(
        "Wrote file successfully.",
        Turn::text(
            "Done.\n```taskbridge-result\n{\"summary\": \"Added a blue banner.\", \"tests_run\": []}\n```",
        ),
    );
    mock.answer_when("Added a blue banner.", Turn::text("The banner task is done."));
    let run = format!(
        "exec '{}' 'Delegate the banner' --allowedTools mcp__taskbridge",
        claude328().display()
    );
    let tmux = crate::tui_tmux::start_in_tmux(
        &env,
        &run,
        120,
        &[("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"), ("DISABLE_AUTOUPDATER", "1")],
    );
    let limit = std::time::Duration::from_secs(90);
    let screen = tmux.wait_within("requests your input", limit);
    assert!(screen.contains("Task 1 (Banner) asks: Should it be red or blue?"), "{screen}");
    tmux.text("Blue.");
    tmux.wait_for("Should it be red or blue?: Blue.");
    // Enter leaves the field for Accept; Enter again accepts.
    tmux.keys(&["Enter"]);
    tmux.wait_for("❯ Accept");
    // Claude Code may still be settling the form when the first press arrives: press again
    // while Accept is still the one chosen.
    let accepted = eventually(std::time::Duration::from_secs(15), || {
        if tmux.screen().contains("❯ Accept") {
            tmux.keys(&["Enter"]);
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
        !tmux.screen().contains("requests your input")
    });
    assert!(accepted, "the dialog stayed open:\n{}", tmux.screen());
    tmux.wait_within("MCP task 1 (taskbridge/run_task) completed.", limit);
    tmux.wait_within("The banner task is done.", limit);
    let task = env.show(1);
    assert_eq!(task["status"], "done", "{task}");
    assert_eq!(task["questions"][0]["answer"], "Blue.", "{task}");
    assert_eq!(task["questions"][0]["answered_by"], "elicitation:claude-code", "{task}");
    assert_eq!(task["result"]["summary"], "Added a blue banner.", "{task}");
    assert_eq!(task["result"]["files_touched"][0]["path"], "banner.txt", "{task}");
}
