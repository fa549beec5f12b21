//! End to end: Claude Code and Codex as task agents beside OpenCode. The real binary runs the
//! real CLIs (pinned by `.ci/run`) in real git worktrees, Claude Code against the loopback mock
//! of the Messages API and Codex against a loopback mock of the Responses API.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::{MockAnthropic, Turn};
use crate::support::mock_openai::{MockOpenAi, Reply};
use crate::support::*;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const RUN: Duration = Duration::from_secs(120);

fn result_block(summary: &str, tests: &[&str]) -> String {
    format!(
        "All done.\n\n```taskbridge-result\n{}\n```",
        json!({"summary": summary, "tests_run": tests, "open_questions": []})
    )
}

/// Claude Code's own tools, as its model calls them.
fn claude_bash(command: &str) -> Turn {
    Turn::tool("Bash", json!({"command": command, "description": "run it"}))
}

fn finished(env: &Env, id: i64) -> Value {
    env.wait_task(id, RUN, |t| {
        ["done", "failed", "waiting", "cancelled"].contains(&t["status"].as_str().unwrap())
    })
}

/// The live processes (not zombies) whose working directory is in `dir`: the agent and what
/// it started there.
fn working_in(dir: &std::path::Path) -> Vec<(i32, String)> {
    let Ok(procs) = std::fs::read_dir("/proc") else { return vec![] };
    procs
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir))
        })
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let state = stat[stat.rfind(')')? + 2..].split_whitespace().next()?.to_owned();
            let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).ok()?;
            (state != "Z").then(|| (pid, cmd.replace('\0', " ")))
        })
        .collect()
}

/// The task both edit scenarios give their agent, and what every agent's result must say of
/// it: the summary it reported, the file from git, the test it really ran.
fn greeting_task(env: &Env, agent: &str) -> Value {
    let id = env.submit(&["Add a greeting file", "--agent", agent]);
    let _worker = env.start_worker(1);
    let t = finished(env, id);
    assert_eq!(t["status"], "done", "{t:#}\nlog:\n{}", env.log(id));
    let r = &t["result"];
    assert_eq!(r["summary"], "Added hello.txt.");
    assert_eq!(files_touched(r), vec![("hello.txt".into(), "added".into())]);
    assert_eq!(
        r["tests_run"],
        json!([{"command": "sh test.sh", "exit_code": 0, "observed": true}])
    );
    t
}

#[test]
fn claude_code_edits_runs_the_test_and_reports_usage_and_cost() {
    let mock = MockAnthropic::spawn(vec![
        claude_bash("echo greeting > hello.txt"),
        claude_bash("sh test.sh"),
        Turn::text(result_block("Added hello.txt.", &["sh test.sh"])),
    ]);
    let env = Env::new().with_claude(&mock);
    let t = greeting_task(&env, "claude-code");
    let (id, r) = (t["id"].as_i64().unwrap(), &t["result"]);
    assert_eq!(git_out(&env.repo, &["show", "taskbridge/task-1:hello.txt"]), "greeting");
    // Claude Code's own figures: the tokens the mock sent, and the cost it worked out.
    let sent = mock.sent_usage();
    let u = &r["usage"];
    assert_eq!(u["input_tokens"].as_u64().unwrap(), sent.input, "{u:#} vs {sent:?}");
    assert_eq!(u["cache_read_tokens"].as_u64().unwrap(), sent.cache_read);
    assert!(u["cost_usd"].as_f64().unwrap() > 0.0, "{u:#}");
    let a = &r["agent"];
    assert_eq!(a["name"], "claude-code");
    assert_eq!(
        (
            a["native_questions"].as_bool(),
            a["native_permissions"].as_bool(),
            a["reports_cost"].as_bool()
        ),
        (Some(true), Some(true), Some(true))
    );
    // Its session is the one Claude Code started, to resume later.
    let session = r["session_id"].as_str().unwrap();
    assert_eq!(t["session_id"], session);
    let log = env.log(id);
    assert!(log.contains("tool bash: sh test.sh (exit 0)"), "{log}");
    assert!(log.contains("--output-format stream-json"), "{log}");
}

fn ask_user(question: &str, labels: &[&str]) -> Turn {
    let options: Vec<Value> =
        labels.iter().map(|l| json!({"label": l, "description": format!("{l} it is")})).collect();
    Turn::tool(
        "AskUserQuestion",
        json!({"questions": [{"question": question, "header": "Colour", "options": options, "multiSelect": false}]}),
    )
}

#[test]
fn claude_codes_own_question_waits_with_its_options_and_the_answer_goes_on_in_its_session() {
    // Answers by what was asked, so that a request of Claude Code's own beside the task's takes
    // nothing from the script.
    let mock =
        MockAnthropic::spawn(vec![Turn::text(result_block("Made the banner blue.", &[])); 3]);
    mock.answer_when(
        "Add a banner",
        ask_user("Which colour should the banner be?", &["Red", "Blue"]),
    );
    mock.answer_when("The answer is", claude_bash("echo blue > banner.txt"));
    let env = Env::new().with_claude(&mock);
    let id = env.submit(&["Add a banner", "--agent", "claude-code"]);
    let _worker = env.start_worker(1);
    let t = env.wait_status(id, "waiting", RUN);
    let ask = &t["questions"][0]["ask"];
    assert_eq!(ask["kind"], "question", "{t:#}");
    assert_eq!(ask["questions"][0]["question"], "Which colour should the banner be?");
    assert_eq!(option_labels(ask), ["Red", "Blue"]);
    let session = t["session_id"].as_str().unwrap().to_owned();
    // Nothing runs while the task waits: the agent's process is gone.
    let wt = env.worktree(id);
    assert!(
        eventually(Duration::from_secs(30), || working_in(&wt).is_empty()),
        "{:?}",
        working_in(&wt)
    );

    env.ok(&["answer", &id.to_string(), "Blue"]);
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["result"]["summary"], "Made the banner blue.", "{}", env.log(id));
    assert_eq!(t["session_id"], session, "the same session went on");
    assert_eq!(t["attempts"], 1, "answering does not use attempts");
    assert_eq!(files_touched(&t["result"]), vec![("banner.txt".into(), "added".into())]);
    // The resumed request carried the whole conversation: the task, the question, the answer.
    let reqs = mock.requests();
    let resumed =
        reqs.iter().find(|r| r["messages"].to_string().contains("The answer is")).unwrap();
    let convo = resumed["messages"].to_string();
    assert!(convo.contains("Add a banner") && convo.contains("Which colour"), "{convo}");
    assert!(convo.contains("Blue"), "{convo}");
}

#[test]
fn an_ask_rule_makes_claude_code_wait_for_approval_and_the_approved_call_goes_through() {
    let mock = MockAnthropic::spawn(vec![Turn::text(result_block("Touched it.", &[])); 3]);
    mock.answer_when("Touch a file", claude_bash("touch approved.txt"));
    mock.answer_when("It is approved", claude_bash("touch approved.txt"));
    let env = Env::new().with_claude(&mock);
    let id = env.submit(&["Touch a file", "--agent", "claude-code", "--ask", "bash:touch *"]);
    let _worker = env.start_worker(1);
    let t = env.wait_status(id, "waiting", RUN);
    let ask = &t["questions"][0]["ask"];
    assert_eq!(ask["kind"], "permission", "{t:#}");
    assert_eq!(ask["permission"]["permission"], "bash");
    assert_eq!(ask["permission"]["target"], "touch approved.txt");
    assert!(!env.worktree(id).join("approved.txt").exists(), "nothing ran before the answer");

    env.ok(&["answer", &id.to_string(), "once"]);
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(
        files_touched(&t["result"]),
        vec![("approved.txt".into(), "added".into())],
        "{}",
        env.log(id)
    );
    let req = &t["result"]["permission_requests"][0];
    assert_eq!(
        (req["permission"].as_str(), req["answer"].as_str()),
        (Some("bash"), Some("once")),
        "{t:#}"
    );
    let ask_rule =
        t["result"]["permissions"].as_array().unwrap().iter().find(|p| p["flag"] == "ask").unwrap();
    assert_eq!(ask_rule["enforcement"], "enforced");
}

#[test]
fn a_401_fails_a_claude_code_task_at_once_saying_how_to_log_in() {
    let mock = MockAnthropic::spawn((0..30).map(|_| Turn::unauthorized()).collect());
    let env = Env::new().with_claude(&mock);
    let id = env.submit(&["Anything", "--agent", "claude-code", "--max-attempts", "3"]);
    let _worker = env.start_worker(1);
    let t = env.wait_task(id, RUN, |t| t["status"] == "failed");
    let error = t["error"].as_str().unwrap();
    for part in ["Claude Code could not authenticate", "401", "ANTHROPIC_API_KEY", "/login"] {
        assert!(error.contains(part), "'{part}' missing from: {error}");
    }
    assert_eq!(t["attempts"], 1, "credentials a retry cannot fix do not use up the attempts");
}

#[test]
fn cancelling_a_claude_code_task_leaves_no_process_behind() {
    let mock = MockAnthropic::spawn(vec![
        Turn::tool(
            "Bash",
            json!({"command": "ps -o pgid= $$ | tr -d ' ' > pgid.txt; sleep 300", "description": "wait"}),
        ),
        Turn::text("Next task done."),
    ]);
    let env = Env::new().with_claude(&mock);
    let id = env.submit(&["Do something slow", "--agent", "claude-code"]);
    let _worker = env.start_worker(1);
    let wt = env.worktree(id);
    let pgid = read_pgid(&wt.join("pgid.txt"));
    let running = working_in(&wt);
    assert!(group_alive(pgid) && running.len() >= 2, "Claude Code and its command: {running:?}");
    env.ok(&["cancel", &id.to_string()]);
    env.wait_status(id, "cancelled", Duration::from_secs(10));
    assert!(
        eventually(Duration::from_secs(30), || !group_alive(pgid) && working_in(&wt).is_empty()),
        "no process of the command or of Claude Code survives 5 s: {:?}",
        working_in(&wt)
    );
    let next = env.submit(&["Something quick", "--agent", "claude-code"]);
    assert_eq!(env.wait_status(next, "done", RUN)["result"]["summary"], "Next task done.");
}

#[test]
fn a_readonly_claude_code_task_is_offered_no_edit_tools_and_its_shell_cannot_write() {
    let mock = MockAnthropic::spawn(vec![
        claude_bash("echo sneaky > notes.txt"),
        Turn::text(result_block("Reviewed the README.", &[])),
    ]);
    let env = Env::new().with_claude(&mock);
    let id = env.submit(&["Review the README", "--agent", "claude-code", "--readonly"]);
    let _worker = env.start_worker(1);
    let t = finished(&env, id);
    assert_eq!(t["status"], "done", "{t:#}\n{}", env.log(id));
    // The kernel refused the shell's write (the sandbox's read-only worktree): nothing to revert.
    assert_eq!(t["result"]["reverted_files"], json!([]));
    assert_eq!(t["result"]["files_touched"], json!([]));
    let told = serde_json::to_string(&mock.requests()[1]["messages"]).unwrap();
    assert!(told.contains("Permission denied"), "{told}");
    let readonly = t["result"]["permissions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["flag"] == "readonly")
        .cloned();
    assert_eq!(readonly.unwrap()["enforcement"], "kernel");
    let tools: Vec<String> = mock.requests()[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect();
    assert!(tools.contains(&"Bash".to_owned()) && tools.contains(&"Read".to_owned()), "{tools:?}");
    for edit in ["Edit", "Write", "NotebookEdit"] {
        assert!(!tools.contains(&edit.to_owned()), "{edit} was offered: {tools:?}");
    }
}

#[test]
fn codex_edits_runs_the_test_and_reports_tokens_with_no_cost() {
    let mock = MockOpenAi::spawn(vec![
        Reply::Exec("echo greeting > hello.txt".into()),
        Reply::Exec("sh test.sh".into()),
        Reply::Text(result_block("Added hello.txt.", &["sh test.sh"])),
    ]);
    let env = Env::new().with_codex(&mock);
    let t = greeting_task(&env, "codex");
    let (id, r) = (t["id"].as_i64().unwrap(), &t["result"]);
    let (input, cached, output) = mock.sent();
    let u = &r["usage"];
    // OpenAI counts cached input inside its input tokens; the result, as for every agent, apart.
    assert_eq!(u["input_tokens"].as_u64().unwrap(), input - cached, "{u:#}");
    assert_eq!(u["cache_read_tokens"].as_u64().unwrap(), cached);
    assert_eq!(u["output_tokens"].as_u64().unwrap(), output);
    assert_eq!(u["cost_usd"], Value::Null, "Codex reports no cost: {u:#}");
    let a = &r["agent"];
    assert_eq!(a["name"], "codex");
    assert_eq!(
        (a["native_questions"].as_bool(), a["reports_cost"].as_bool()),
        (Some(false), Some(false))
    );
    assert!(a["fallbacks"].to_string().contains("cost_usd is null"), "{a:#}");
    assert_eq!(t["session_id"], r["session_id"]);
    // What the planner reads says the same.
    let got = python_mcp_call(&env, "get_task_result", json!({"task_id": id}));
    assert_eq!(got["usage"]["cost_usd"], Value::Null, "{got:#}");
    assert_eq!(got["agent"]["name"], "codex");
    let shown = env.ok(&["show", &id.to_string()]);
    assert!(shown.contains("cost not reported") && shown.contains("ran on:    codex"), "{shown}");
}

fn question_block(text: &str) -> String {
    format!("I need a decision before I go on.\n\n```taskbridge-question\n{text}\n```")
}

#[test]
fn codex_asks_with_the_question_block_and_the_answer_resumes_its_thread() {
    let mock = MockOpenAi::spawn(vec![Reply::Text(question_block(
        "Which colour should the banner be: red or blue?",
    ))]);
    mock.answer_when(
        "The planner answered your question",
        Reply::Text(result_block("Made the banner blue.", &[])),
    );
    let env = Env::new().with_codex(&mock);
    let id = env.submit(&["Add a banner", "--agent", "codex"]);
    let _worker = env.start_worker(1);
    let t = env.wait_status(id, "waiting", RUN);
    assert_eq!(t["question"], "Which colour should the banner be: red or blue?", "{t:#}");
    let thread = t["session_id"].as_str().unwrap().to_owned();
    env.ok(&["answer", &id.to_string(), "Blue, please."]);
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["result"]["summary"], "Made the banner blue.", "{}", env.log(id));
    assert_eq!(t["session_id"], thread, "the same thread went on");
    assert!(env.log(id).contains("exec resume --json"), "{}", env.log(id));
    // The resumed request carried the task, the question and the answer.
    let reqs = mock.requests();
    let convo = reqs.last().unwrap()["input"].to_string();
    for part in ["Add a banner", "red or blue?", "Blue, please."] {
        assert!(convo.contains(part), "'{part}' not in the resumed conversation: {convo}");
    }
    let fallbacks = t["result"]["agent"]["fallbacks"].to_string();
    assert!(fallbacks.contains("taskbridge-question block"), "{fallbacks}");
}

#[test]
fn a_401_fails_a_codex_task_at_once_saying_how_to_log_in() {
    let refused =
        || Reply::Error { status: 401, message: "Incorrect API key provided: sk-test.".into() };
    let mock = MockOpenAi::spawn((0..30).map(|_| refused()).collect());
    let env = Env::new().with_codex(&mock);
    let id = env.submit(&["Anything", "--agent", "codex", "--max-attempts", "3"]);
    let _worker = env.start_worker(1);
    let t = env.wait_task(id, RUN, |t| t["status"] == "failed");
    let error = t["error"].as_str().unwrap();
    for part in ["Codex could not authenticate", "401", "codex login", "Incorrect API key"] {
        assert!(error.contains(part), "'{part}' missing from: {error}");
    }
    assert_eq!(t["attempts"], 1);
    // Stopped at the first refusal, not after Codex's own five reconnects.
    assert!(mock.requests().len() <= 2, "{} requests", mock.requests().len());
}

#[test]
fn cancelling_a_codex_task_leaves_no_process_behind() {
    let mock = MockOpenAi::spawn(vec![
        Reply::Exec("ps -o pgid= $$ | tr -d ' ' > pgid.txt; sleep 300".into()),
        Reply::Text("Next task done.".into()),
    ]);
    let env = Env::new().with_codex(&mock);
    let id = env.submit(&["Do something slow", "--agent", "codex"]);
    let _worker = env.start_worker(1);
    let wt = env.worktree(id);
    // Codex's sandbox runs the command in a process namespace of its own, so the group id the
    // command saw means nothing out here: the processes are found by their directory.
    read_pgid(&wt.join("pgid.txt"));
    let running = working_in(&wt);
    assert!(running.iter().any(|(_, c)| c.contains("sleep 300")), "{running:?}");
    assert!(running.iter().any(|(_, c)| c.contains("codex")), "{running:?}");
    env.ok(&["cancel", &id.to_string()]);
    env.wait_status(id, "cancelled", Duration::from_secs(10));
    assert!(
        eventually(Duration::from_secs(30), || working_in(&wt).is_empty()),
        "no process of the command or of Codex survives 5 s: {:?}",
        working_in(&wt)
    );
    let next = env.submit(&["Something quick", "--agent", "codex"]);
    assert_eq!(env.wait_status(next, "done", RUN)["result"]["summary"], "Next task done.");
}

#[test]
fn a_readonly_codex_task_is_held_by_the_kernel_with_codexs_own_sandbox_off() {
    let mock = MockOpenAi::spawn(vec![
        Reply::Exec("echo sneaky > notes.txt".into()),
        Reply::Text(result_block("Reviewed the README.", &[])),
    ]);
    let env = Env::new().with_codex(&mock);
    let id = env.submit(&["Review the README", "--agent", "codex", "--readonly"]);
    let _worker = env.start_worker(1);
    let t = finished(&env, id);
    assert_eq!(t["status"], "done", "{t:#}\n{}", env.log(id));
    assert_eq!(t["result"]["files_touched"], json!([]));
    // TaskBridge's wall holds the rule; Codex's bubblewrap cannot run inside it.
    assert!(env.log(id).contains("sandbox_mode=\"danger-full-access\""), "{}", env.log(id));
    // The kernel refused the write: the command failed and nothing had to be reverted.
    assert_eq!(t["result"]["reverted_files"], json!([]), "{}", env.log(id));
    let outputs: Vec<String> = mock.requests()[1]["input"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .map(|i| i["output"].to_string())
        .collect();
    assert!(outputs.iter().any(|o| o.contains("Permission denied")), "{outputs:?}");
    let readonly = t["result"]["permissions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["flag"] == "readonly")
        .unwrap();
    assert_eq!(readonly["enforcement"], "kernel");
}

#[test]
fn a_batch_runs_each_task_on_its_own_agent() {
    let claude = MockAnthropic::spawn(vec![Turn::text(result_block("Claude did it.", &[]))]);
    let codex = MockOpenAi::spawn(vec![Reply::Text(result_block("Codex did it.", &[]))]);
    let opencode = MockAnthropic::spawn(vec![Turn::text(result_block("OpenCode did it.", &[]))]);
    let env = Env::new().with_mock(&opencode).with_claude(&claude).with_codex(&codex);
    let out = python_mcp_call(
        &env,
        "submit_batch",
        json!({"tasks": [
            {"prompt": "The hard refactor", "agent": "claude-code"},
            {"prompt": "The quick fix", "agent": "opencode"},
            {"prompt": "The test", "agent": "codex", "depends_on": ["#0"]},
        ]}),
    );
    let ids: Vec<i64> =
        out["tasks"].as_array().unwrap().iter().map(|t| t["task_id"].as_i64().unwrap()).collect();
    assert_eq!(ids.len(), 3, "{out:#}");
    let _worker = env.start_worker(2);
    let mut seen = Vec::new();
    for id in &ids {
        let t = env.wait_status(*id, "done", RUN);
        seen.push((
            t["result"]["agent"]["name"].as_str().unwrap().to_owned(),
            t["result"]["summary"].as_str().unwrap().to_owned(),
        ));
    }
    assert_eq!(
        seen,
        vec![
            ("claude-code".to_owned(), "Claude did it.".to_owned()),
            ("opencode".to_owned(), "OpenCode did it.".to_owned()),
            ("codex".to_owned(), "Codex did it.".to_owned()),
        ]
    );
    assert_eq!(env.show(ids[0])["agent"], "claude-code");
}

#[test]
fn list_models_answers_for_each_agent() {
    let env = Env::new()
        .with_claude(&MockAnthropic::spawn(vec![]))
        .with_codex(&MockOpenAi::spawn(vec![]));
    let codex = python_mcp_call(&env, "list_models", json!({"agent": "codex"}));
    assert_eq!(codex["agent"], "codex");
    let models: Vec<&str> =
        codex["models"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(models.contains(&"gpt-5.5"), "{codex:#}");
    let claude = python_mcp_call(&env, "list_models", json!({"agent": "claude-code"}));
    assert_eq!(claude["models"], json!(["sonnet", "opus", "haiku"]));
    assert!(claude["note"].as_str().unwrap().contains("full model name"));
    let out = env.ok(&["list-models", "--agent", "codex"]);
    assert!(out.lines().any(|l| l == "gpt-5.5"), "{out}");
    let wrong = env.run(&["list-models", "--agent", "gemini"]);
    assert!(!wrong.status.success());
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("claude-code"));
}

#[test]
fn a_missing_cli_or_a_rule_the_agent_cannot_hold_is_refused_at_submit_and_nothing_is_queued() {
    let env = Env::new();
    let mut missing = Env::new();
    missing.extra_env.push(("TASKBRIDGE_CODEX".into(), "/nonexistent/codex".into()));
    let out = missing.run(&["submit", "Anything", "--agent", "codex"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("npm install -g @openai/codex@0.171.0") && err.contains("TASKBRIDGE_CODEX"),
        "{err}"
    );
    let mut no_claude = Env::new();
    no_claude.extra_env.push(("PATH".into(), "/usr/bin:/bin".into()));
    let out = no_claude.run(&["submit", "Anything", "--agent", "claude-code"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("npm install -g @anthropic-ai/claude-code@2.1.197"), "{err}");
    // Over MCP too, as a tool error the planner can act on.
    let res =
        python_mcp_call(&missing, "submit_task", json!({"prompt": "Anything", "agent": "codex"}));
    assert!(res["error"].as_str().unwrap().contains("npm install -g @openai/codex"), "{res:#}");
    let codex = env.with_codex(&MockOpenAi::spawn(vec![]));
    let out = codex.run(&["submit", "Anything", "--agent", "codex", "--no-shell"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("codex cannot run without its shell"));
    let out = codex.run(&["submit", "Anything", "--agent", "codex", "--ask", "bash:git push*"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("codex cannot ask for approval"));
    let out = codex.run(&["submit", "Anything", "--agent", "gpt"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("opencode:<agent>"));
    assert_eq!(codex.ok(&["list", "--json"]).trim(), "[]", "nothing was queued");
    assert_eq!(missing.ok(&["list", "--json"]).trim(), "[]", "nothing was queued");
}

/// Task "Write one.txt" on `agent`, then its follow-up `prompt`, both done: (parent, follow-up).
/// The worker runs OpenCode as `run`, which keeps no spare directories, so the follow-up gets a
/// new worktree.
fn follow_up(env: &Env, agent: &str, prompt: &str) -> (Value, Value) {
    let first = env.submit(&["Write one.txt", "--agent", agent]);
    let _worker = env.start_worker_with(1, &["--opencode", "run"]);
    let t1 = env.wait_status(first, "done", RUN);
    let out = env.ok(&["followup", &first.to_string(), prompt]);
    let second: i64 = out.split_whitespace().find_map(|w| w.parse().ok()).unwrap();
    let t2 =
        env.wait_task(second, RUN, |t| ["done", "failed"].contains(&t["status"].as_str().unwrap()));
    assert_eq!(t2["status"], "done", "{t2:#}\n{}", env.log(second));
    (t1, t2)
}

/// A follow-up runs in a worktree of its own (a worker without spare directories makes a new
/// one) and goes on in its parent's session, which Claude Code keeps per directory.
#[test]
fn a_claude_code_follow_up_goes_on_in_its_parents_session_in_a_new_worktree() {
    let mock = MockAnthropic::spawn(vec![
        claude_bash("echo one > one.txt"),
        Turn::text(result_block("Wrote one.", &[])),
        claude_bash("echo two > two.txt"),
        Turn::text(result_block("Wrote two.", &[])),
    ]);
    let env = Env::new().with_claude(&mock);
    let (t1, t2) = follow_up(&env, "claude-code", "Now write two.txt as well");
    assert_eq!(t2["agent"], "claude-code", "a follow-up keeps its parent's agent");
    assert_ne!(t2["worktree"], t1["worktree"]);
    assert_eq!(t2["result"]["session_id"], t1["result"]["session_id"], "the same session");
    assert_eq!(files_touched(&t2["result"]), vec![("two.txt".into(), "added".into())]);
    let convo = mock.requests().last().unwrap()["messages"].to_string();
    assert!(convo.contains("Write one.txt") && convo.contains("Now write two.txt"), "{convo}");
}

#[test]
fn a_codex_follow_up_goes_on_in_its_parents_thread_in_the_new_worktree() {
    let mock = MockOpenAi::spawn(vec![
        Reply::Exec("echo one > one.txt".into()),
        Reply::Text(result_block("Wrote one.", &[])),
        Reply::Exec("pwd > where.txt".into()),
        Reply::Text(result_block("Wrote where.", &[])),
    ]);
    let env = Env::new().with_codex(&mock);
    let (t1, t2) = follow_up(&env, "codex", "Now say where you are");
    assert_eq!(t2["result"]["session_id"], t1["result"]["session_id"], "the same thread");
    // The command ran in the follow-up's own worktree, not its parent's.
    let wt2 = t2["worktree"].as_str().unwrap();
    assert_eq!(
        files_touched(&t2["result"]),
        vec![("where.txt".into(), "added".into())],
        "{}",
        env.log(t2["id"].as_i64().unwrap())
    );
    let shown =
        git_out(&env.repo, &["show", &format!("{}:where.txt", t2["branch"].as_str().unwrap())]);
    assert_eq!(shown, wt2);
    let convo = mock.requests().last().unwrap()["input"].to_string();
    assert!(convo.contains("Write one.txt") && convo.contains("Now say where you are"), "{convo}");
}

/// Two workers on one queue, one of them on a host without Claude Code: its tasks go to the
/// other; with that one gone, submit says so and the task fails saying what to install.
#[test]
fn a_task_goes_to_a_worker_that_has_its_agents_cli() {
    let mock = MockAnthropic::spawn(vec![Turn::text(result_block("Claude did it.", &[])); 3]);
    let env = Env::new().with_claude(&mock);
    let worker = |claude: &str| {
        Child(
            env.cmd()
                .args(["worker", "--concurrency", "1"])
                .env("TASKBRIDGE_CLAUDE", claude)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let mut full = worker(claude_cli().to_str().unwrap());
    let _bare = worker("/nonexistent/claude");
    let listed =
        || -> Vec<Value> { serde_json::from_str(&env.ok(&["list-workers", "--json"])).unwrap() };
    assert!(
        eventually(Duration::from_secs(30), || listed()
            .iter()
            .filter(|w| w["agents"].as_array().is_some_and(|a| !a.is_empty()))
            .count()
            == 2),
        "{:#?}",
        listed()
    );
    let runs_claude = |pid: u32| {
        let w = listed().into_iter().find(|w| w["pid"] == pid).unwrap();
        w["agents"].as_array().unwrap().contains(&json!("claude-code"))
    };
    assert!(runs_claude(full.pid()) && !runs_claude(_bare.pid()));
    assert!(env.ok(&["list-workers"]).contains("opencode,claude-code"));

    for n in 0..3 {
        let id = env.submit(&[&format!("A hard refactor ({n})"), "--agent", "claude-code"]);
        let t = env.wait_status(id, "done", RUN);
        assert!(
            t["worker"].as_str().unwrap().contains(&format!(":{}:", full.pid())),
            "task {id} ran on {} ({:#?})",
            t["worker"],
            listed()
        );
    }

    assert!(full.terminate().success());
    let out = env.run(&["submit", "One more", "--agent", "claude-code"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("no running worker has the claude-code CLI"), "{said}");
    let id: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let t = env.wait_status(id, "failed", RUN);
    let error = t["error"].as_str().unwrap();
    assert!(error.contains("npm install -g @anthropic-ai/claude-code@2.1.197"), "{error}");
}

/// OpenCode's server denies a change outside the worktree; so does TaskBridge for Claude Code,
/// whose model may name any path.
#[test]
fn claude_code_may_not_change_a_file_outside_its_worktree() {
    let env = Env::new();
    let target = env.repo.join("escaped.txt");
    let mock = MockAnthropic::spawn(vec![
        Turn::tool("Write", json!({"file_path": target, "content": "out\n"})),
        Turn::text(result_block("Tried.", &[])),
    ]);
    let env = env.with_claude(&mock);
    let id = env.submit(&["Write a file", "--agent", "claude-code"]);
    let _worker = env.start_worker(1);
    let t = finished(&env, id);
    assert_eq!(t["status"], "done", "{t:#}\n{}", env.log(id));
    assert!(!target.exists(), "the main checkout was changed");
    let told = mock.requests()[1]["messages"].to_string();
    assert!(told.contains("outside the task's worktree"), "the model is told why: {told}");
    assert!(env.log(id).contains("denied edit:"), "{}", env.log(id));
}

/// With TaskBridge registered in Claude Code (what `install.sh --yes` does), a Claude Code task
/// must not start another TaskBridge: the agent runs with none of the user's MCP servers.
#[test]
fn a_claude_code_task_starts_none_of_the_users_mcp_servers() {
    let mock = MockAnthropic::spawn(vec![Turn::text(result_block("Nothing to do.", &[]))]);
    let env = Env::new().with_claude(&mock);
    env.ok(&["config", "claude-code", "--write"]);
    let id = env.submit(&["Look around", "--agent", "claude-code"]);
    let _worker = env.start_worker(1);
    let t = finished(&env, id);
    assert_eq!(t["status"], "done", "{t:#}\n{}", env.log(id));
    let tools: Vec<String> = mock.requests()[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect();
    assert!(tools.contains(&"Bash".to_owned()), "{tools:?}");
    assert!(!tools.iter().any(|t| t.starts_with("mcp__")), "{tools:?}");
}

/// OpenCode's own agents go by `opencode:<agent>`, on the warm server and on `opencode run`
/// alike: the task is run by that agent (its plan-mode instructions reach the model), and its
/// name reaches OpenCode without the prefix (with it, the server never ran the prompt).
#[test]
fn an_opencode_agent_named_opencode_colon_agent_runs_the_task_in_both_modes() {
    for mode in ["serve", "run"] {
        let mock = MockAnthropic::spawn(vec![Turn::text(result_block("Done.", &[])); 2]);
        let env = Env::new().with_mock(&mock);
        let planned = env.submit(&["Plan the change", "--agent", "opencode:plan"]);
        let plain = env.submit(&["Make the change", "--after", &planned.to_string()]);
        let _worker = env.start_worker_with(1, &["--opencode", mode]);
        for id in [planned, plain] {
            let t = finished(&env, id);
            assert_eq!(t["status"], "done", "{mode}: {t:#}\n{}", env.log(id));
        }
        assert_eq!(env.show(planned)["result"]["agent"]["name"], "opencode:plan");
        let reqs = mock.requests();
        assert!(reqs[0].to_string().contains("Plan mode"), "{mode}: the plan agent's request");
        assert!(!reqs[1].to_string().contains("Plan mode"), "{mode}: the default agent's");
    }
}

/// The README's way to give Codex tasks the network (`[sandbox_workspace_write] network_access =
/// true` in its config) works, and a `--no-network` task has none even so.
#[test]
fn a_no_network_codex_task_has_no_network_even_when_codexs_config_allows_it() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = format!(
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 5)\" \
         && echo reached > net.txt || echo blocked > net.txt"
    );
    let mock = MockOpenAi::spawn(vec![]);
    for _ in 0..2 {
        mock.push([Reply::Exec(probe.clone()), Reply::Text(result_block("Probed.", &[]))]);
    }
    let env = Env::new().with_codex(&mock);
    let config = env.oc_home.join(".codex/config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[sandbox_workspace_write]\nnetwork_access = true\n");
    std::fs::write(&config, text).unwrap();
    let open = env.submit(&["Probe the network", "--agent", "codex"]);
    let closed = env.submit(&[
        "Probe it again",
        "--agent",
        "codex",
        "--no-network",
        "--after",
        &open.to_string(),
    ]);
    let _worker = env.start_worker(1);
    let mut seen = Vec::new();
    for id in [open, closed] {
        let t = finished(&env, id);
        assert_eq!(t["status"], "done", "{t:#}\n{}", env.log(id));
        let branch = t["result"]["branch"].as_str().unwrap().to_owned();
        seen.push(git_out(&env.repo, &["show", &format!("{branch}:net.txt")]));
    }
    assert_eq!(seen, ["reached", "blocked"], "{}\n{}", env.log(open), env.log(closed));
    drop(listener);
}

/// The diagnostic in docs/BENCHMARKS.md ("On a Bun without the collection nudge"): the pinned
/// OpenCode, run on the Bun `.ci/run` installs beside it, is the same OpenCode, and its server
/// runs on that Bun.
#[test]
fn opencode_on_another_bun_runs_the_same_opencode_on_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The script's own default, the OpenCode `.ci/run` pins (not `TASKBRIDGE_TEST_OPENCODE`).
    let exe = root.join(".tools/node_modules/opencode-ai/bin/opencode.exe");
    let bun = root.join(".tools/bun/node_modules/bun/bin/bun.exe");
    assert!(bun.exists(), "no Bun at {}: run .ci/run, which installs it", bun.display());
    let script = root.join("benches/opencode_on_bun.py");
    let dir = tempfile::tempdir().unwrap();
    // A home of its own (OpenCode must not read or write the user's), and nothing fetched.
    let isolated = |program: &Path| {
        let mut cmd = Command::new(program);
        cmd.env("HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path().join(".config"))
            .env("XDG_DATA_HOME", dir.path().join(".local/share"))
            .env("XDG_CACHE_HOME", dir.path().join(".cache"))
            .env("XDG_STATE_HOME", dir.path().join(".local/state"))
            .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
            .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
            .env("NPM_CONFIG_REGISTRY", "http://127.0.0.1:9/")
            .env("npm_config_fetch_retries", "0")
            .stdin(Stdio::null());
        cmd
    };
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();

    let out = dir.path().join("out");
    let made = Command::new("python3").arg(&script).arg(&bun).arg(&out).output().unwrap();
    assert!(made.status.success(), "{}", text(made.stderr));
    let launcher = out.join("opencode");
    let through = isolated(&launcher).arg("--version").output().unwrap();
    assert!(through.status.success(), "{}", text(through.stderr));
    let plain = isolated(&exe).arg("--version").output().unwrap();
    assert_eq!(text(through.stdout), text(plain.stdout));

    // Its server, on the Bun given.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut server = isolated(&launcher)
        .args(["serve", "--port", &port.to_string(), "--hostname", "127.0.0.1"])
        .env("OPENCODE_SERVER_PASSWORD", "test")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let listening = eventually(Duration::from_secs(60), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    // The launcher has replaced itself with the Bun it runs on by now.
    let ran = std::fs::read_link(format!("/proc/{}/exe", server.id()));
    let _ = server.kill();
    let _ = server.wait();
    assert!(listening, "OpenCode on {} never listened", bun.display());
    assert_eq!(ran.unwrap(), bun.canonicalize().unwrap());

    // A file that is no Bun executable is refused, saying so.
    let refused = Command::new("python3")
        .arg(&script)
        .arg(&bun)
        .arg(dir.path().join("again"))
        .arg(&script)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let said = text(refused.stderr);
    assert!(said.contains("not a Bun executable (no module graph)"), "{said}");
}
