//! End to end in `--opencode serve` mode: the agent's own decisions. The real OpenCode server
//! (pinned) runs against the loopback mock of the Messages API; the mock's scripted turns call
//! OpenCode's `question` tool, run commands that an `ask` rule holds for approval, and spend.
//! Every answer goes through the real binary (the CLI) or a real MCP client.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::{MockAnthropic, Turn};
use crate::support::*;
use serde_json::{Value, json};
use std::time::Duration;

const RUN: Duration = Duration::from_secs(120);

fn result_block(summary: &str) -> String {
    format!(
        "Finished.\n\n```taskbridge-result\n{}\n```",
        json!({"summary": summary, "tests_run": [], "open_questions": []})
    )
}

/// A turn that calls OpenCode's `question` tool with one question and its options.
fn ask_colour(multiple: bool) -> Turn {
    Turn::tool(
        "question",
        json!({"questions": [{
            "question": "Which colour should the banner be?",
            "header": "Banner colour",
            "options": [
                {"label": "red", "description": "Warm and loud"},
                {"label": "blue", "description": "Calm"},
                {"label": "green", "description": "Fresh"},
            ],
            "multiple": multiple,
        }]}),
    )
}

fn serve_worker(env: &Env) -> Child {
    env.start_worker_with(1, &["--opencode", "serve"])
}

#[test]
fn a_native_question_answered_with_an_option_label_over_mcp_returns_to_the_same_tool_call() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Add a banner"]);
    let banner = env.worktree(id).join("banner.txt");
    mock.push([
        ask_colour(false),
        Turn::tool("write", json!({"filePath": banner, "content": "blue\n"})),
        Turn::text(result_block("Made a blue banner.")),
    ]);
    let _worker = serve_worker(&env);
    let t = env.wait_status(id, "waiting", RUN);
    let ask = &t["ask"];
    assert_eq!(ask["kind"], "question", "{t:#}");
    assert_eq!(ask["questions"][0]["question"], "Which colour should the banner be?");
    assert_eq!(ask["questions"][0]["header"], "Banner colour");
    assert_eq!(option_labels(ask), ["red", "blue", "green"]);
    assert_eq!(ask["questions"][0]["options"][1]["description"], "Calm");
    assert!(t["question"].as_str().unwrap().contains("one of: red, blue, green"), "{t:#}");
    // `show` prints the choices too.
    let shown = env.ok(&["show", &id.to_string()]);
    assert!(shown.contains("blue") && shown.contains("Calm"), "{shown}");
    let session = t["session_id"].as_str().unwrap().to_owned();
    let requests_before = mock.requests().len();

    // Over MCP, with the official Python SDK.
    let answered = python_mcp_call(&env, "answer_task", json!({"task_id": id, "answer": "Blue"}));
    assert_eq!(answered["status"], "queued", "{answered:#}");
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["result"]["summary"], "Made a blue banner.");
    assert_eq!(t["session_id"], session);
    assert_eq!(t["attempts"], 1);
    assert_eq!(t["questions"][0]["answer"], "Blue");
    let by = t["questions"][0]["answered_by"].as_str().unwrap();
    assert!(by.starts_with("mcp:"), "who answered: {by}");
    let branch = t["result"]["branch"].as_str().unwrap();
    assert_eq!(git_out(&env.repo, &["show", &format!("{branch}:banner.txt")]), "blue");

    // The answer came back as the question tool's result, in the same turn: the request after
    // the answer carries it as a tool result (not a new user prompt).
    let reqs = mock.requests();
    assert_eq!(reqs.len(), requests_before + 2, "one request per scripted turn after the answer");
    let after = &reqs[requests_before];
    let results = tool_results(after);
    assert!(results.contains("blue"), "the tool result carries the label: {results}");
    assert!(
        !after["messages"].to_string().contains("The answer is:"),
        "no new prompt was sent: {}",
        after["messages"]
    );
    let log = env.log(id);
    assert!(log.contains("answered the agent's pending request"), "{log}");
}

#[test]
fn a_native_question_answered_with_free_text_from_the_cli_goes_on_in_the_same_session() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        ask_colour(true),
        Turn::text(result_block("Used the colour the planner described.")),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Add a banner"]);
    let _worker = serve_worker(&env);
    let t = env.wait_status(id, "waiting", RUN);
    assert_eq!(t["ask"]["questions"][0]["multiple"], true);
    let session = t["session_id"].as_str().unwrap().to_owned();

    env.ok(&["answer", &id.to_string(), "a dark teal, like the logo"]);
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["session_id"], session);
    assert_eq!(t["questions"][0]["answered_by"], "cli");
    let reqs = mock.requests();
    let results = tool_results(reqs.last().unwrap());
    assert!(results.contains("a dark teal, like the logo"), "{results}");
}

fn permission_requests(t: &Value) -> Vec<Value> {
    t["result"]["permission_requests"].as_array().cloned().unwrap_or_default()
}

#[test]
fn a_permission_request_answered_once_lets_the_command_run() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo deploy-now > deployed.txt"),
        Turn::text(result_block("Deployed.")),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Deploy it", "--ask", "bash:echo deploy*"]);
    let _worker = serve_worker(&env);
    let t = env.wait_status(id, "waiting", RUN);
    let ask = &t["ask"];
    assert_eq!(ask["kind"], "permission", "{t:#}");
    assert_eq!(ask["permission"]["permission"], "bash");
    assert_eq!(ask["permission"]["target"], "echo deploy-now > deployed.txt");
    assert_eq!(ask["choices"], json!(["once", "always", "reject"]));
    assert!(!env.worktree(id).join("deployed.txt").exists(), "nothing ran before the answer");
    let refused = env.run(&["answer", &id.to_string(), "sure"]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("once") && err.contains("reject:"), "{err}");

    env.ok(&["answer", &id.to_string(), "once"]);
    let t = env.wait_status(id, "done", RUN);
    let branch = t["result"]["branch"].as_str().unwrap();
    assert_eq!(git_out(&env.repo, &["show", &format!("{branch}:deployed.txt")]), "deploy-now");
    let reqs = permission_requests(&t);
    assert_eq!(reqs.len(), 1, "{t:#}");
    assert_eq!(reqs[0]["permission"], "bash");
    assert_eq!(reqs[0]["answer"], "once");
    assert_eq!(reqs[0]["answered_by"], "cli");
}

#[test]
fn a_permission_rejected_with_feedback_reaches_the_model_and_the_command_never_runs() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo deploy-prod > deployed.txt"),
        Turn::text(result_block("Used the staging branch instead.")),
    ]);
    let env = env.with_mock(&mock);
    // Submitted over MCP, whose `ask` is an array of the same rules.
    let t = python_mcp_call(
        &env,
        "submit_task",
        json!({"prompt": "Deploy it", "ask": ["bash:echo deploy*"]}),
    );
    let id = t["task_id"].as_i64().unwrap();
    assert_eq!(t["ask_rules"], json!(["bash:echo deploy*"]), "{t:#}");
    let _worker = serve_worker(&env);
    env.wait_status(id, "waiting", RUN);
    env.ok(&["answer", &id.to_string(), "reject: use the staging branch"]);
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["result"]["summary"], "Used the staging branch instead.");
    assert!(t["result"]["files_touched"].as_array().unwrap().is_empty(), "{t:#}");
    let results = tool_results(mock.requests().last().unwrap());
    assert!(
        results.contains("use the staging branch"),
        "the feedback reached the model: {results}"
    );
    assert_eq!(permission_requests(&t)[0]["answer"], "reject: use the staging branch");
}

#[test]
fn a_bare_reject_fails_the_task_saying_so_and_the_command_never_runs() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo deploy-prod > deployed.txt"),
        Turn::text(result_block("Deployed anyway.")),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Deploy it", "--ask", "bash:echo deploy*"]);
    let _worker = serve_worker(&env);
    env.wait_status(id, "waiting", RUN);
    env.ok(&["answer", &id.to_string(), "reject"]);
    let t = env.wait_task(id, RUN, |t| t["status"] == "done" || t["status"] == "failed");
    assert_eq!(t["status"], "failed", "a rejected permission is not done work: {t:#}");
    let error = t["error"].as_str().unwrap_or_default();
    assert!(error.contains("reject"), "the error says the permission was rejected: {error}");
    assert!(!env.worktree(id).join("deployed.txt").exists(), "the rejected command ran");
    assert_eq!(permission_requests(&t)[0]["answer"], "reject", "{t:#}");
}

#[test]
fn always_approves_the_rest_of_the_task_without_asking_again() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo deploy-one >> deployed.txt"),
        Turn::bash("echo deploy-two >> deployed.txt"),
        Turn::text(result_block("Deployed twice.")),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Deploy twice", "--ask", "bash:echo deploy*"]);
    let _worker = serve_worker(&env);
    env.wait_status(id, "waiting", RUN);
    env.ok(&["answer", &id.to_string(), "always"]);
    let t = env.wait_status(id, "done", RUN);
    let branch = t["result"]["branch"].as_str().unwrap();
    assert_eq!(
        git_out(&env.repo, &["show", &format!("{branch}:deployed.txt")]),
        "deploy-one\ndeploy-two"
    );
    let reqs = permission_requests(&t);
    assert_eq!(reqs.len(), 2, "both requests are listed: {t:#}");
    assert_eq!(reqs[0]["answered_by"], "cli");
    assert_eq!(reqs[1]["answered_by"], "rule", "the second was approved by the first answer");
    assert_eq!(t["questions"].as_array().unwrap().len(), 2);
}

/// Each mock turn reports 100+n input and 20+n output tokens: two steps pass 150.
fn spender() -> MockAnthropic {
    // The budget is checked when a step ends, and OpenCode may already have asked the model for
    // the next one by the time the stop aborts the session: that answer is lost. So the final
    // text comes twice, and a test that stops twice still ends on it whichever answer was lost.
    MockAnthropic::spawn(vec![
        Turn::bash("echo one >> steps.txt"),
        Turn::bash("echo two >> steps.txt"),
        Turn::bash("echo three >> steps.txt"),
        Turn::text(result_block("Spent and finished.")),
        Turn::text(result_block("Spent and finished.")),
    ])
}

#[test]
fn a_budget_reached_waits_and_continue_raises_it_until_the_task_finishes() {
    let env = Env::new();
    let mock = spender();
    let env = env.with_mock(&mock);
    let id = env.submit(&["Spend", "--max-tokens", "150"]);
    let _worker = serve_worker(&env);
    let t = env.wait_status(id, "waiting", RUN);
    assert_eq!(t["ask"]["kind"], "budget", "{t:#}");
    let b = &t["ask"]["budget"];
    assert_eq!(b["limit"], "tokens");
    assert_eq!(b["max"], 150.0);
    assert!(b["spent"].as_f64().unwrap() > 150.0, "{b}");
    assert!(t["question"].as_str().unwrap().contains("of 150 tokens"), "{t:#}");
    // The running spend was on the task while it ran, and stays.
    let used = t["result"]["usage"]["input_tokens"].as_u64().unwrap()
        + t["result"]["usage"]["output_tokens"].as_u64().unwrap();
    assert_eq!(used as f64, b["spent"].as_f64().unwrap());
    let session = t["session_id"].clone();

    env.ok(&["answer", &id.to_string(), "continue 10000"]);
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["budget"]["max_tokens"], 10000);
    assert_eq!(t["result"]["summary"], "Spent and finished.");
    assert_eq!(t["session_id"], session, "the budget stop went on in the same session");
    let status: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    assert!(status["spend_today"]["tokens"].as_i64().unwrap() >= used as i64, "{status:#}");
}

#[test]
fn a_budget_stop_fails_the_task_naming_the_budget_and_leaves_nothing_running() {
    let env = Env::new();
    let mock = spender();
    let env = env.with_mock(&mock);
    let id = env.submit(&["Spend", "--max-tokens", "150"]);
    let _worker = serve_worker(&env);
    env.wait_status(id, "waiting", RUN);
    let before = mock.requests().len();
    let said = env.ok(&["answer", &id.to_string(), "stop"]);
    assert!(said.starts_with(&format!("task {id}: stopped: the task failed as asked")), "{said}");
    assert!(!said.contains("resume"), "{said}");
    let t = env.wait_status(id, "failed", RUN);
    let error = t["error"].as_str().unwrap();
    assert!(error.contains("task budget") && error.contains("of 150 tokens"), "{error}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(mock.requests().len(), before, "the agent made no request after the stop");
}

#[test]
fn a_cost_budget_waits_and_continue_continue_x_and_stop_each_do_what_they_say() {
    let env = Env::new();
    let mock = spender();
    mock.push([Turn::bash("echo four >> steps.txt"), Turn::text(result_block("Stopped."))]);
    let env = env.with_mock(&mock);
    // A hundredth of a cent: the first step of the mock's model costs more.
    let id = env.submit(&["Spend money", "--max-cost-usd", "0.0001"]);
    let _worker = serve_worker(&env);
    let t = env.wait_status(id, "waiting", RUN);
    assert_eq!(t["ask"]["kind"], "budget", "{t:#}");
    let b = &t["ask"]["budget"];
    assert_eq!((b["limit"].as_str(), b["max"].as_f64()), (Some("cost"), Some(0.0001)), "{b}");
    assert!(b["spent"].as_f64().unwrap() > 0.0001, "{b}");
    assert!(t["question"].as_str().unwrap().contains("$0.0001"), "{t:#}");
    // `continue`: the limit goes up by the original amount, which the next step passes again.
    env.ok(&["answer", &id.to_string(), "continue"]);
    let asked_at = t["questions"].as_array().unwrap().len();
    let t = env.wait_task(id, RUN, |t| {
        t["status"] == "waiting" && t["questions"].as_array().unwrap().len() > asked_at
    });
    assert_eq!(t["budget"]["max_cost_usd"], 0.0002, "{t:#}");
    // `continue X`: the limit X, enough for the rest.
    env.ok(&["answer", &id.to_string(), "continue 5"]);
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["budget"]["max_cost_usd"], 5.0);
    assert_eq!(t["result"]["summary"], "Spent and finished.");
    assert!(t["result"]["usage"]["cost_usd"].as_f64().unwrap() > 0.0002, "{t:#}");
    // `stop` on another: it fails naming the budget.
    let two = env.submit(&["Spend more money", "--max-cost-usd", "0.0001"]);
    env.wait_status(two, "waiting", RUN);
    env.ok(&["answer", &two.to_string(), "stop"]);
    let t = env.wait_status(two, "failed", RUN);
    let error = t["error"].as_str().unwrap();
    assert!(error.contains("task budget") && error.contains("$0.0001"), "{error}");
}

#[test]
fn kill_9_of_the_opencode_server_alone_restarts_it_and_the_task_goes_on_in_its_session() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        sleeper("pgid.txt"),
        Turn::text(result_block("Finished after the agent's server died.")),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Survive the agent's server"]);
    let _worker = serve_worker(&env);
    let pgid = read_pgid(&env.worktree(id).join("pgid.txt"));
    let server = server_pid(&env).unwrap();
    let session = env.show(id)["session_id"].as_str().unwrap().to_owned();
    // The worker keeps a record of what its server started, refreshed every 250 ms.
    std::thread::sleep(Duration::from_secs(1));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(server), nix::sys::signal::SIGKILL).unwrap();

    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["result"]["summary"], "Finished after the agent's server died.");
    assert_eq!(t["session_id"], session, "the same session went on");
    assert_eq!(t["attempts"], 1, "the worker did not lose the task");
    assert!(!group_alive(pgid), "the dead server's command was stopped");
    let new_server = server_pid(&env).unwrap();
    assert_ne!(new_server, server, "a new server was started");
    let last = mock.requests().last().unwrap()["messages"].to_string();
    assert!(last.contains("was interrupted"), "{last}");
    assert!(env.log(id).contains("continuing the session on a new one"), "{}", env.log(id));
}

#[test]
fn an_answer_given_after_the_worker_died_arrives_as_a_new_prompt_in_the_same_session() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        ask_colour(false),
        Turn::text(result_block("Blue it is, after a restart.")),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Add a banner"]);
    let mut worker = serve_worker(&env);
    let t = env.wait_status(id, "waiting", RUN);
    let session = t["session_id"].as_str().unwrap().to_owned();
    let server = server_pid(&env).unwrap();
    worker.0.kill().unwrap(); // SIGKILL: the pending request dies with its server
    worker.0.wait().unwrap();
    env.ok(&["answer", &id.to_string(), "blue"]);

    let _worker = serve_worker(&env);
    assert!(
        eventually(Duration::from_secs(10), || !group_alive(server)),
        "the dead worker's server was killed"
    );
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["result"]["summary"], "Blue it is, after a restart.");
    assert_eq!(t["session_id"], session);
    assert_eq!(t["attempts"], 1, "an answer does not use an attempt");
    let last = mock.requests().last().unwrap()["messages"].to_string();
    assert!(last.contains("Which colour should the banner be?"), "{last}");
    assert!(last.contains("The answer is: blue"), "{last}");
}

/// The warm server has set itself up for a done task's directory, so the worker keeps it for the
/// next task of the repository: cleaned, on the new task's own branch, with nothing of the
/// last task left in it; and `clear` never takes a directory another task holds.
#[test]
fn the_next_task_reuses_a_done_tasks_directory_cleaned_and_on_its_own_branch() {
    let env = Env::new();
    std::fs::write(env.repo.join(".gitignore"), "*.log\n").unwrap();
    git(&env.repo, &["add", ".gitignore"]);
    git(&env.repo, &["commit", "-qm", "ignore logs"]);
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo one > one.txt; echo junk > cache.log; echo edit >> README.md"),
        Turn::text(result_block("First.")),
        Turn::bash("ls -a > seen.txt; cat README.md >> seen.txt"),
        Turn::text(result_block("Second.")),
    ]);
    let env = env.with_mock(&mock);
    let _worker = serve_worker(&env);
    let first = env.submit(&["First"]);
    let t1 = env.wait_status(first, "done", RUN);
    let second = env.submit(&["Second"]);
    let t2 = env.wait_status(second, "done", RUN);
    assert_eq!(t2["worktree"], t1["worktree"], "the directory was reused");
    assert!(env.log(second).contains("reusing"), "{}", env.log(second));
    let files: Vec<&str> = t2["result"]["files_touched"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["seen.txt"], "only its own work: {t2:#}");
    let seen = git_out(&env.repo, &["show", "taskbridge/task-2:seen.txt"]);
    assert!(!seen.contains("one.txt") && !seen.contains("cache.log"), "leftovers: {seen}");
    assert!(!seen.contains("edit"), "the last task's edit is gone: {seen}");
    assert_eq!(git_out(&env.repo, &["show", "taskbridge/task-1:one.txt"]), "one");

    // Clearing the done tasks leaves the directory the worker keeps.
    env.ok(&["clear"]);
    let dir = std::path::PathBuf::from(t2["worktree"].as_str().unwrap());
    assert!(dir.exists(), "clear took a directory the worker holds");
    mock.push([Turn::text(result_block("Third."))]);
    let third = env.submit(&["Third"]);
    let t3 = env.wait_status(third, "done", RUN);
    assert_eq!(t3["worktree"], t2["worktree"]);
}

/// OpenCode's own list of the repository's sessions, as `opencode session list` prints it:
/// each session's id and title.
fn opencode_sessions(env: &Env) -> Vec<(String, String)> {
    let out = std::process::Command::new(opencode())
        .args(["session", "list", "--format", "json"])
        .envs(env.env_vars())
        .current_dir(&env.repo)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let list: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    list.iter()
        .map(|s| (s["id"].as_str().unwrap().to_owned(), s["title"].as_str().unwrap().to_owned()))
        .collect()
}

/// A done task's directory, kept for the next task, gets a session made ahead on the warm
/// server. The next task goes on in it under its own title in OpenCode's list and with its own
/// rules (its `ask` rule holds the command for approval); the one after it likewise; and the
/// worker, stopping, deletes the session it made ahead that no task took.
#[test]
fn the_next_task_goes_on_in_a_session_made_ahead_with_its_own_title_and_rules() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::text(result_block("First.")),
        Turn::bash("echo deploy-now > deployed.txt"),
        Turn::text(result_block("Deployed.")),
        Turn::text(result_block("Third.")),
    ]);
    let env = env.with_mock(&mock);
    let mut worker = serve_worker(&env);
    let first = env.submit(&["First"]);
    let t1 = env.wait_status(first, "done", RUN);
    assert!(!env.log(first).contains("made ahead"), "{}", env.log(first));

    let second = env.submit(&["Deploy it", "--ask", "bash:echo deploy*"]);
    let t2 = env.wait_status(second, "waiting", RUN);
    assert!(env.log(second).contains("was made ahead for this directory"), "{}", env.log(second));
    assert_eq!(t2["worktree"], t1["worktree"]);
    assert_eq!(t2["ask"]["permission"]["target"], "echo deploy-now > deployed.txt", "{t2:#}");
    assert!(!env.worktree(second).join("deployed.txt").exists(), "nothing ran before the answer");
    env.ok(&["answer", &second.to_string(), "once"]);
    let t2 = env.wait_status(second, "done", RUN);
    assert_eq!(touched_paths(&t2), ["deployed.txt"], "{t2:#}");

    let third = env.submit(&["Third"]);
    let t3 = env.wait_status(third, "done", RUN);
    assert!(env.log(third).contains("was made ahead for this directory"), "{}", env.log(third));
    let titled = |t: &Value, title: &str| {
        let id = t["session_id"].as_str().unwrap().to_owned();
        let sessions = opencode_sessions(&env);
        assert!(sessions.contains(&(id, title.to_owned())), "{title}: {sessions:?}");
    };
    titled(&t1, "taskbridge #1: First");
    titled(&t2, "taskbridge #2: Deploy it");
    titled(&t3, "taskbridge #3: Third");

    // The third task's directory has a session made ahead for a fourth; stopping, the worker
    // deletes it, and OpenCode's list keeps the three tasks' sessions.
    let ready = |sessions: &[(String, String)]| {
        sessions.iter().filter(|(_, title)| title.starts_with("taskbridge: ready")).count()
    };
    let deadline = std::time::Instant::now() + RUN;
    while ready(&opencode_sessions(&env)) != 1 {
        assert!(std::time::Instant::now() < deadline, "{:?}", opencode_sessions(&env));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(worker.terminate().success());
    let left = opencode_sessions(&env);
    assert_eq!((ready(&left), left.len()), (0, 3), "{left:?}");
}

#[test]
fn a_timeout_aborts_the_session_stops_its_command_and_fails_the_task() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![Turn::text(result_block("Warm.")), sleeper("pgid.txt")]);
    let env = env.with_mock(&mock);
    // A first task warms the server (and the directory the next task reuses), so the timed one
    // starts its command well within its time even on a busy machine.
    let _worker = serve_worker(&env);
    let warm = env.submit(&["Warm up"]);
    env.wait_status(warm, "done", RUN);
    let id = env.submit(&["Slow", "--timeout", "10", "--max-attempts", "1"]);
    let wt = env.wait_task(id, RUN, |t| t["worktree"].is_string())["worktree"].clone();
    let pgid = read_pgid(&std::path::PathBuf::from(wt.as_str().unwrap()).join("pgid.txt"));
    let t = env.wait_status(id, "failed", RUN);
    assert!(t["error"].as_str().unwrap().contains("timed out after 10 s"), "{t:#}");
    assert!(eventually(Duration::from_secs(30), || !group_alive(pgid)), "the command lives on");
    assert!(env.log(id).contains("aborting its session"), "{}", env.log(id));
}

/// One budget shared by a batch's tasks (over MCP), in tokens and then in dollars: the first
/// task spends within it, the second passes it and waits with a question naming the batch.
#[test]
fn a_batch_budget_in_tokens_or_dollars_is_shared_by_its_tasks() {
    let env = Env::new();
    let mut turns = Vec::new();
    for _ in 0..2 {
        turns.extend([
            Turn::bash("echo a > a.txt"),
            Turn::text(result_block("First.")),
            Turn::bash("echo b > b.txt"),
            Turn::text(result_block("Second.")),
        ]);
    }
    let mock = MockAnthropic::spawn(turns);
    let env = env.with_mock(&mock);
    let _worker = serve_worker(&env);
    let tokens = |t: &Value| {
        t["result"]["usage"]["input_tokens"].as_f64().unwrap()
            + t["result"]["usage"]["output_tokens"].as_f64().unwrap()
    };
    let dollars = |t: &Value| t["result"]["usage"]["cost_usd"].as_f64().unwrap();
    // Each task's two steps cost about $0.0016 against the mock's prices.
    for (key, given, max, spent) in [
        ("max_tokens", json!(300), 300.0, &tokens as &dyn Fn(&Value) -> f64),
        ("max_cost_usd", json!(0.002), 0.002, &dollars),
    ] {
        let mut args =
            json!({"tasks": [{"prompt": "first"}, {"prompt": "second", "depends_on": ["#0"]}]});
        args[key] = given;
        let out = python_mcp_call(&env, "submit_batch", args);
        let ids: Vec<i64> = out["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["task_id"].as_i64().unwrap())
            .collect();
        let first = env.wait_status(ids[0], "done", RUN);
        assert!(spent(&first) < max, "{key}: {first:#}");
        let second = env.wait_status(ids[1], "waiting", RUN);
        let b = &second["ask"]["budget"];
        assert_eq!(b["scope"], "batch", "{key}: {second:#}");
        assert_eq!(b["max"], max, "{key}: {second:#}");
        let together = spent(&first) + spent(&second);
        assert!((b["spent"].as_f64().unwrap() - together).abs() < 1e-6, "{key}: {b} vs {together}");
        env.ok(&["answer", &ids[1].to_string(), "stop"]);
        let t = env.wait_status(ids[1], "failed", RUN);
        assert!(t["error"].as_str().unwrap().contains("batch budget"), "{key}: {t:#}");
    }
}

/// A worker killed while a task runs in a directory it reused: the next worker cleans up the
/// dead one's spares but never that directory, and the task goes on in it.
#[test]
fn kill_9_while_a_task_runs_in_a_reused_directory_keeps_that_directory() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::text(result_block("First.")),
        Turn::bash("echo work > work.txt; ps -o pgid= $$ | tr -d ' ' > pgid.txt; sleep 300"),
        Turn::text(result_block("Second, after the crash.")),
    ]);
    let env = env.with_mock(&mock);
    let mut worker = serve_worker(&env);
    let first = env.submit(&["First"]);
    let t1 = env.wait_status(first, "done", RUN);
    let second = env.submit(&["Second"]);
    let dir = std::path::PathBuf::from(
        env.wait_task(second, RUN, |t| t["worktree"].is_string())["worktree"].as_str().unwrap(),
    );
    assert_eq!(
        dir.to_str(),
        t1["worktree"].as_str(),
        "the second task reused the first's directory"
    );
    read_pgid(&dir.join("pgid.txt"));
    worker.0.kill().unwrap(); // SIGKILL
    worker.0.wait().unwrap();

    let _worker = serve_worker(&env);
    let t = env.wait_status(second, "done", RUN);
    assert_eq!(t["result"]["summary"], "Second, after the crash.");
    assert_eq!(git_out(&env.repo, &["show", "taskbridge/task-2:work.txt"]), "work");
}

/// `--no-shell` and `--no-network` on the warm server: the model is offered neither the shell
/// nor the web tools, and its calls to them run nothing. The next task, without the flags, on
/// the same server, has both (so the test sees the difference the flags make).
#[test]
fn no_shell_and_no_network_take_the_shell_and_the_web_away_and_the_next_task_has_them() {
    let env = Env::new();
    let web = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://127.0.0.1:{}/page", web.local_addr().unwrap().port());
    let fetched = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = fetched.clone();
    std::thread::spawn(move || {
        for mut s in web.incoming().flatten() {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            use std::io::Write;
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        }
    });
    let fetch = || Turn::tool("webfetch", json!({"url": url, "format": "text"}));
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo ran > shell.txt"),
        fetch(),
        Turn::text(result_block("Tried both.")),
        Turn::bash("echo ran > shell.txt"),
        fetch(),
        Turn::text(result_block("Did both.")),
    ]);
    let env = env.with_mock(&mock);
    let walled = env.submit(&["Try the shell and the web", "--no-shell", "--no-network"]);
    let _worker = serve_worker(&env);
    let t = env.wait_task(walled, RUN, |t| t["status"] == "done" || t["status"] == "failed");
    assert!(!touched_paths(&t).contains(&"shell.txt".to_owned()), "the shell ran: {t:#}");
    assert_eq!(fetched.load(std::sync::atomic::Ordering::SeqCst), 0, "the web was reached");
    let offered = |req: &Value| -> Vec<String> {
        req["tools"].as_array().unwrap().iter().map(|t| t["name"].to_string()).collect()
    };
    let first = offered(&mock.requests()[0]);
    assert!(!first.iter().any(|n| n == "\"bash\"" || n == "\"webfetch\""), "{first:?}");

    let open = env.submit(&["Use the shell and the web"]);
    let t = env.wait_status(open, "done", RUN);
    assert_eq!(touched_paths(&t), ["shell.txt"], "{t:#}\n{}", env.log(open));
    assert_eq!(fetched.load(std::sync::atomic::Ordering::SeqCst), 1);
    let later = offered(&mock.requests()[3]);
    assert!(later.iter().any(|n| n == "\"bash\"") && later.iter().any(|n| n == "\"webfetch\""));
}
