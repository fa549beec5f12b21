//! End to end: the real binary runs the real OpenCode CLI against the loopback mock of the
//! Anthropic Messages API, in real git worktrees.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::{MockAnthropic, Turn};
use crate::support::*;
use serde_json::{Value, json};
use std::time::Duration;

const RUN: Duration = Duration::from_secs(120);

fn result_block(summary: &str, tests: &[&str]) -> String {
    format!(
        "All done.\n\n```taskbridge-result\n{}\n```",
        json!({"summary": summary, "tests_run": tests, "open_questions": ["Should hello.txt be localised?"]})
    )
}

#[test]
fn a_task_that_edits_files_and_runs_a_test_ends_done_with_a_commit_and_a_verified_result() {
    edit_scenario("run");
}

/// The same task and the same result through one warm `opencode serve`.
#[test]
fn in_serve_mode_the_edit_task_gives_the_same_verified_result() {
    edit_scenario("serve");
}

fn edit_scenario(mode: &str) {
    let env = Env::new();
    let wt = env.worktree(1);
    let mock = MockAnthropic::spawn(vec![
        Turn::tool("write", json!({"filePath": wt.join("hello.txt"), "content": "a greeting\n"})),
        Turn::tool(
            "edit",
            json!({"filePath": wt.join("README.md"), "oldString": "Hello from the demo.", "newString": "Hello from TaskBridge."}),
        ),
        Turn::bash("sh test.sh"),
        Turn::text(result_block(
            "Added hello.txt and updated the README.",
            &["sh test.sh", "cargo test"],
        )),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Add a greeting file and update the README", "--title", "greeting"]);
    let mut worker = env.start_worker_with(1, &["--opencode", mode]);
    let task =
        env.wait_task(id, RUN, |t| ["done", "failed"].contains(&t["status"].as_str().unwrap()));
    assert_eq!(task["status"], "done", "{task:#}\nlog:\n{}", env.log(id));

    let r = &task["result"];
    assert_eq!(r["summary"], "Added hello.txt and updated the README.");
    assert_eq!(r["open_questions"], json!(["Should hello.txt be localised?"]));
    assert_eq!(
        files_touched(r),
        vec![("README.md".into(), "modified".into()), ("hello.txt".into(), "added".into())]
    );
    assert_eq!(
        r["tests_run"],
        json!([
            {"command": "sh test.sh", "exit_code": 0, "observed": true},
            {"command": "cargo test", "exit_code": null, "observed": false},
        ])
    );
    assert!(r["diff"].as_str().unwrap().contains("+Hello from TaskBridge."), "{}", r["diff"]);
    assert_eq!(r["diffstat"]["files"], 2);

    // Usage is the sum of what the mock sent over the four turns.
    let sent = mock.sent_usage();
    let u = &r["usage"];
    let total_in = u["input_tokens"].as_u64().unwrap()
        + u["cache_read_tokens"].as_u64().unwrap()
        + u["cache_write_tokens"].as_u64().unwrap();
    assert_eq!(total_in, sent.input + sent.cache_read + sent.cache_write, "{u:#} vs {sent:?}");
    assert_eq!(u["cache_read_tokens"].as_u64().unwrap(), sent.cache_read);
    assert_eq!(u["cache_write_tokens"].as_u64().unwrap(), sent.cache_write);
    assert_eq!(
        u["output_tokens"].as_u64().unwrap() + u["reasoning_tokens"].as_u64().unwrap(),
        sent.output
    );
    assert_eq!(u["steps"], 4);
    assert!(u["cost_usd"].as_f64().unwrap() > 0.0);

    // The work is a commit on the task's branch; main and the main checkout are untouched.
    let commit = r["commit"].as_str().unwrap();
    assert_eq!(git_out(&env.repo, &["rev-parse", "taskbridge/task-1"]), commit);
    assert_eq!(git_out(&env.repo, &["show", "taskbridge/task-1:hello.txt"]), "a greeting");
    assert!(
        !env.repo.join("hello.txt").exists(),
        "the agent worked in the worktree, not the checkout"
    );
    assert_eq!(git_out(&env.repo, &["rev-list", "--count", "main"]), "1");
    if mode == "run" {
        assert!(!wt.exists(), "the worktree is removed after success");
    } else {
        // Kept for the worker's next task of this repository: nothing uncommitted in it, and
        // detached, so the task's branch is free.
        assert_eq!(git_out(&wt, &["status", "--porcelain"]), "");
        assert_eq!(git_out(&wt, &["rev-parse", "--abbrev-ref", "HEAD"]), "HEAD");
    }
    assert_eq!(task["branch"], "taskbridge/task-1");
    let workers: Value = serde_json::from_str(&env.ok(&["list-workers", "--json"])).unwrap();
    assert_eq!(workers[0]["agent"], format!("opencode {mode}"), "list-workers says which");

    // The readable log tells the story as it happened; the raw events sit beside it.
    let log = env.log(id);
    assert!(log.contains("tool bash: sh test.sh (exit 0)"), "{log}");
    assert!(log.contains("step finished (stop)"), "{log}");
    // OpenCode's own events: `opencode run`'s lines, or the warm server's events of the task.
    let raw = std::fs::read_to_string(env.home.join("logs/1.events.jsonl")).unwrap();
    let step_finish = if mode == "serve" { "\"step-finish\"" } else { "\"step_finish\"" };
    assert_eq!(raw.lines().filter(|l| l.contains(step_finish)).count(), 4, "{raw}");
    // A worker that stops removes what it kept.
    assert!(worker.terminate().success());
    assert!(!wt.exists(), "the worker's spare worktree outlived it");
    assert_eq!(git_out(&env.repo, &["worktree", "list"]).lines().count(), 1);
}

fn question(text: &str) -> String {
    format!("I need a decision before I go on.\n\n```taskbridge-question\n{text}\n```")
}

#[test]
fn a_question_waits_and_the_answer_resumes_the_same_session() {
    question_scenario(Env::new(), "run");
}

/// In serve mode the answer is a new prompt in the same session on the same warm server.
#[test]
fn in_serve_mode_an_answer_is_a_new_prompt_in_the_same_session() {
    question_scenario(Env::new(), "serve");
}

/// The same round trip with the queue on PostgreSQL: worker, CLI and the real OpenCode server.
#[test]
fn on_postgres_an_answer_resumes_the_same_session() {
    question_scenario(Env::new().on_postgres(), "serve");
}

fn question_scenario(env: Env, mode: &str) {
    let mock = MockAnthropic::spawn(vec![
        Turn::text(question("Which colour should the banner be: red or blue?")),
        Turn::text(question("Bold or plain?")),
        Turn::text(result_block("Made the banner blue and bold.", &[])),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Add a banner"]);
    let _worker = env.start_worker_with(1, &["--opencode", mode]);
    let t = env.wait_status(id, "waiting", RUN);
    assert_eq!(t["question"], "Which colour should the banner be: red or blue?");
    let session = t["session_id"].as_str().unwrap().to_owned();
    assert!(session.starts_with("ses_"));

    env.ok(&["answer", &id.to_string(), "Blue, please."]);
    let t =
        env.wait_task(id, RUN, |t| t["status"] == "waiting" && t["question"] == "Bold or plain?");
    assert_eq!(t["session_id"], session, "the same session resumed");
    env.ok(&["note", &id.to_string(), "Keep it accessible."]);
    env.ok(&["answer", &id.to_string(), "Bold."]);
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["result"]["summary"], "Made the banner blue and bold.");
    assert_eq!(t["attempts"], 1, "answering does not use attempts");
    assert_eq!(t["questions"].as_array().unwrap().len(), 2);

    // The resumed requests carried the earlier conversation and the answer.
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 3);
    let convo = |r: &Value| r["messages"].to_string();
    let second = convo(&reqs[1]);
    assert!(second.contains("red or blue?"), "the earlier question is in context: {second}");
    assert!(second.contains("Blue, please."), "the answer is in context");
    assert!(second.contains("Add a banner"), "the original task is in context");
    let third = convo(&reqs[2]);
    assert!(third.contains("Blue, please.") && third.contains("Bold."));
    assert!(third.contains("Keep it accessible."), "a note rides along with the answer");
    // Usage accumulates over the three runs.
    let sent = mock.sent_usage();
    assert_eq!(t["result"]["usage"]["cache_read_tokens"].as_u64().unwrap(), sent.cache_read);
}

#[test]
fn an_api_401_fails_at_once_naming_the_model_and_how_to_log_in() {
    let env = Env::new();
    let mock = MockAnthropic::spawn((0..6).map(|_| Turn::unauthorized()).collect());
    let env = env.with_mock(&mock);
    let id = env.submit(&["Anything", "--max-attempts", "3"]);
    let _worker = env.start_worker(1);
    let t = env.wait_task(id, RUN, |t| t["status"] == "failed");
    let error = t["error"].as_str().unwrap();
    for part in ["invalid x-api-key", "401", MODEL, "provider anthropic", "opencode auth login"] {
        assert!(error.contains(part), "'{part}' missing from: {error}");
    }
    assert_eq!(error.matches("opencode auth login").count(), 1, "the advice once: {error}");
    assert_eq!(t["attempts"], 1, "credentials a retry cannot fix do not use up the attempts");
    assert!(env.worktree(id).exists(), "a failed task's worktree stays for inspection");
    assert!(env.log(id).contains("attempt 1 of 3"));
}

#[test]
fn with_no_model_configured_the_error_names_the_model_opencode_chose() {
    no_model_scenario("run");
}

#[test]
fn in_serve_mode_with_no_model_configured_the_error_names_the_model_the_server_chose() {
    no_model_scenario("serve");
}

fn no_model_scenario(mode: &str) {
    let env = Env::new();
    let mock = MockAnthropic::spawn((0..6).map(|_| Turn::unauthorized()).collect());
    let mut env = env.with_mock(&mock);
    // Only the loopback provider, so OpenCode's own default is one of its models.
    let mut cfg: Value = serde_json::from_str(env.opencode_config.as_deref().unwrap()).unwrap();
    cfg["enabled_providers"] = serde_json::json!(["anthropic"]);
    env.opencode_config = Some(cfg.to_string());
    let id = env.submit(&["Anything"]);
    let mut worker = env.cmd();
    worker.env_remove("TASKBRIDGE_MODEL").args(["worker", "--once", "--opencode", mode]);
    assert!(worker.output().unwrap().status.success());
    let t = env.show(id);
    assert_eq!(t["status"], "failed");
    let error = t["error"].as_str().unwrap();
    assert!(error.contains("OpenCode's own default model anthropic/"), "{error}");
    assert!(error.contains("no model is configured"), "{error}");
    assert!(error.contains("set-default-model"), "{error}");
}

#[test]
fn a_model_opencode_does_not_offer_is_refused_at_submit_with_the_near_names() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![]);
    let env = env.with_mock(&mock);
    let out = env.run(&["submit", "x", "--model", "anthropic/claude-sonnet-9"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown model 'anthropic/claude-sonnet-9'"), "{err}");
    assert!(err.contains("anthropic/claude-sonnet-4-5"), "near names are offered: {err}");
    assert!(env.ok(&["list"]).contains("no tasks"), "nothing was stored");
    // A known one is accepted.
    env.submit(&["x", "--model", MODEL]);
}

#[test]
fn with_the_sandbox_off_readonly_denies_edits_and_reverts_what_the_shell_changed() {
    // What holds where the kernel cannot (`tests/e2e/sandbox.rs` has the wall's side).
    let mut env = Env::new();
    env.extra_env.push(("TASKBRIDGE_SANDBOX".into(), "off".into()));
    let wt = env.worktree(1);
    let mock = MockAnthropic::spawn(vec![
        Turn::tool("write", json!({"filePath": wt.join("blocked.txt"), "content": "no\n"})),
        Turn::bash("echo sneaky > notes.txt && echo changed >> README.md"),
        Turn::text(result_block("Reviewed the README.", &[])),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Review the README", "--readonly"]);
    let _worker = env.start_worker(1);
    let t = env.wait_task(id, RUN, |t| ["done", "failed"].contains(&t["status"].as_str().unwrap()));
    assert_eq!(t["status"], "done", "{t:#}\n{}", env.log(id));
    let r = &t["result"];
    let mut reverted: Vec<String> = serde_json::from_value(r["reverted_files"].clone()).unwrap();
    reverted.sort();
    assert_eq!(reverted, vec!["README.md", "notes.txt"]);
    assert_eq!(r["files_touched"], json!([]));
    assert_eq!(r["commit"], Value::Null);
    let readonly =
        r["permissions"].as_array().unwrap().iter().find(|p| p["flag"] == "readonly").unwrap();
    assert_eq!(
        (readonly["enabled"].as_bool(), readonly["enforcement"].as_str()),
        (Some(true), Some("enforced"))
    );
    let sandbox =
        r["permissions"].as_array().unwrap().iter().find(|p| p["flag"] == "sandbox").unwrap();
    assert_eq!(
        (sandbox["enabled"].as_bool(), sandbox["enforcement"].as_str()),
        (Some(false), Some("none"))
    );
    // OpenCode refused the write tool itself: no write call completed.
    let raw = std::fs::read_to_string(env.home.join("logs/1.events.jsonl")).unwrap();
    let writes: Vec<Value> = raw
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "tool_use" && e["part"]["tool"] == "write")
        .collect();
    assert!(writes.iter().all(|w| w["part"]["state"]["status"] != "completed"), "{writes:#?}");
}

/// The agent's bash command records its process group, then sleeps.
#[test]
fn cancelling_a_running_task_kills_its_whole_process_group() {
    cancel_scenario("run");
}

/// In serve mode a cancel aborts the session and stops what the server still runs for it; the
/// warm server itself stays up for the next task.
#[test]
fn in_serve_mode_a_cancel_mid_tool_stops_the_command_and_the_server_serves_on() {
    cancel_scenario("serve");
}

fn cancel_scenario(mode: &str) {
    let env = Env::new();
    // The warm-up also leaves a command running that detaches from everything (a session of
    // its own, its parent gone at once) and ignores SIGTERM.
    let detach = "setsid bash -c 'trap \"\" TERM; echo $$ > detached.pid; exec sleep 1000' \
                  >/dev/null 2>&1 </dev/null & echo warming up";
    let mock = MockAnthropic::spawn(vec![
        Turn::bash(detach),
        sleeper("pgid.txt"),
        Turn::text("Next task done."),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Do something slow"]);
    let _worker = env.start_worker_with(1, &["--opencode", mode]);
    let pgid = read_pgid(&env.worktree(id).join("pgid.txt"));
    assert!(group_alive(pgid));
    let detached = read_pid(&env.worktree(id).join("detached.pid"));
    assert!(pid_alive(detached), "the detached command runs");
    if mode == "serve" {
        // The server says when a tool starts: the command shows in the log while it runs.
        let running = |t: &str| t.contains("tool bash: ps -o pgid=") && t.contains("(running)");
        assert!(
            eventually(Duration::from_secs(10), || running(
                &env.ok(&["get-logs", &id.to_string()])
            )),
            "{}",
            env.log(id)
        );
        // The spend so far: the first step (the warm-up command) has finished.
        let t = env.show(id);
        assert_eq!(t["status"], "running");
        assert_eq!(t["result"]["usage"]["steps"], 1, "{t:#}");
        assert!(t["result"]["usage"]["cost_usd"].as_f64().unwrap() > 0.0, "{t:#}");
    }
    let out = env.ok(&["cancel", &id.to_string()]);
    assert!(out.contains("cancel requested"), "{out}");
    let t = env.wait_status(id, "cancelled", Duration::from_secs(10));
    assert!(
        eventually(Duration::from_secs(30), || !group_alive(pgid)),
        "no process of the group survives 5 s"
    );
    assert!(
        // A zombie (killed, not yet reaped by the server that adopted it) is gone too.
        eventually(Duration::from_secs(30), || !worker::process::pid_alive(detached.into())),
        "the detached command that ignored SIGTERM does not survive the cancel"
    );
    assert!(env.worktree(id).exists(), "the worktree is kept");
    assert_eq!(t["cancel_requested"], false);
    // The worker goes on with the next task.
    let next = env.submit(&["Something quick"]);
    assert_eq!(env.wait_status(next, "done", RUN)["result"]["summary"], "Next task done.");
}

#[test]
fn a_task_times_out_like_a_cancel_and_fails() {
    // What is tested is the worker's clock and its kill, not the model: a stand-in agent that
    // starts a child and sleeps, so the timeout does not race OpenCode's start-up on a busy
    // machine.
    let env = Env::new();
    let agent = script(
        env.dir.path(),
        "agent",
        "cat > /dev/null
ps -o pgid= $$ | tr -d ' ' > pgid.txt
sleep 300 &
sleep 300
",
    );
    let id = env.submit(&["Slow", "--timeout", "3", "--max-attempts", "1"]);
    let mut worker = env.cmd();
    // A stand-in agent is a process per prompt: `run` mode.
    worker.env("TASKBRIDGE_OPENCODE", &agent).args(["worker", "--once", "--opencode", "run"]);
    let out = worker.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pgid = read_pgid(&env.worktree(id).join("pgid.txt"));
    let t = env.show(id);
    assert_eq!(t["status"], "failed");
    assert!(t["error"].as_str().unwrap().contains("timed out after 3 s"), "{t:#}");
    assert!(eventually(Duration::from_secs(30), || !group_alive(pgid)), "the agent's group lives");
}

#[test]
fn kill_9_of_the_worker_mid_run_is_recovered_on_restart() {
    kill_9_scenario("run");
}

/// In serve mode the worker's OpenCode server outlives a SIGKILL of the worker; the next worker
/// kills it (and the command it runs) from its pid file.
#[test]
fn in_serve_mode_kill_9_of_the_worker_leaves_no_server_behind() {
    kill_9_scenario("serve");
}

fn kill_9_scenario(mode: &str) {
    let env = Env::new();
    // The rerun's first command looks for the dead run's: nothing of it may still run.
    let overlap = "g=$(cat pgid.txt); if ps -eo pgid=,stat= | awk -v g=$g '$1==g && $2 !~ /^Z/' \
                   | grep -q .; then echo overlap; else echo clean; fi > overlap.txt";
    let mock = MockAnthropic::spawn(vec![
        sleeper("pgid.txt"),
        Turn::bash(overlap),
        Turn::text(result_block("Finished on the second run.", &[])),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Survive a crash"]);
    let mut worker = env.start_worker_with(1, &["--opencode", mode]);
    let pgid = read_pgid(&env.worktree(id).join("pgid.txt"));
    // serve mode: the warm server's pid, from the file the next worker reads.
    let server = server_pid(&env);
    assert_eq!(server.is_some(), mode == "serve", "a server only in serve mode");
    worker.0.kill().unwrap(); // SIGKILL
    worker.0.wait().unwrap();
    assert!(group_alive(pgid), "the agent outlived its worker: an orphan");
    assert_eq!(env.show(id)["status"], "running");

    if let Some(server) = server {
        assert!(group_alive(server), "the server outlived its worker");
    }
    let _worker = env.start_worker_with(1, &["--opencode", mode]);
    assert!(
        eventually(Duration::from_secs(10), || !group_alive(pgid)),
        "the orphan was killed on restart"
    );
    if let Some(server) = server {
        // The server leads its own process group.
        assert!(
            eventually(Duration::from_secs(10), || !group_alive(server)),
            "the orphaned server was killed on restart"
        );
    }
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["result"]["summary"], "Finished on the second run.");
    assert_eq!(t["attempts"], 2, "the interrupted attempt counts");
    let seen = git_out(&env.repo, &["show", &format!("taskbridge/task-{id}:overlap.txt")]);
    assert_eq!(seen.trim(), "clean", "the rerun met the dead run's command");
    if mode == "serve" {
        // The warm server goes on in the interrupted session, so the agent keeps its context.
        let reqs = mock.requests();
        let last = reqs.last().unwrap()["messages"].to_string();
        assert!(last.contains("Survive a crash"), "the first prompt is in context: {last}");
        assert!(last.contains("was interrupted"), "told it was interrupted: {last}");
        assert!(env.log(id).contains(t["session_id"].as_str().unwrap()));
    }
}

/// `taskbridge serve` (server and embedded worker) on a free port; killed when dropped.
fn start_server(env: &Env) -> Child {
    let child = env
        .cmd()
        .args(["serve", "--listen", "127.0.0.1:0", "--concurrency", "1"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    Child(child)
}

#[test]
fn kill_9_of_the_server_mid_task_is_recovered_by_the_restarted_server_with_nothing_lost() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        sleeper("pgid.txt"),
        Turn::text(result_block("Finished after the server crash.", &[])),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Survive a server crash"]);
    let mut server = start_server(&env);
    let pgid = read_pgid(&env.worktree(id).join("pgid.txt"));
    let dead_worker = env.show(id)["worker"].as_str().unwrap().to_owned();
    server.0.kill().unwrap(); // SIGKILL
    server.0.wait().unwrap();
    assert!(group_alive(pgid), "the agent outlived its server: an orphan");

    let _server = start_server(&env);
    // Settled: the orphan is gone and the task left the dead worker (requeued, or already
    // claimed again by the new one). How fast is measured by `benches/pickup.rs` (recovery);
    // here the deadline is only there so a broken recovery fails instead of hanging.
    let settled = eventually(Duration::from_secs(30), || {
        !group_alive(pgid) && env.show(id)["worker"].as_str() != Some(dead_worker.as_str())
    });
    assert!(settled, "not settled after the restart: {:#}", env.show(id));
    let store = queue::Store::open(env.home.join("taskbridge.db")).unwrap();
    assert_eq!(store.integrity_check().unwrap(), "ok");

    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["result"]["summary"], "Finished after the server crash.");
    assert_eq!(t["attempts"], 2, "the interrupted attempt counts");
}

#[test]
fn stopping_the_worker_hands_running_tasks_back_to_the_queue() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![sleeper("pgid.txt")]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Long job"]);
    let mut worker = env.start_worker(1);
    let pgid = read_pgid(&env.worktree(id).join("pgid.txt"));
    // SIGTERM, as the TUI's quit or a service stop does.
    let status = worker.terminate();
    assert!(status.success(), "{status:?}");
    let t = env.show(id);
    assert_eq!(t["status"], "queued", "the task is back in the queue, not lost");
    assert_eq!(t["attempts"], 0, "a shutdown does not use an attempt");
    assert!(eventually(Duration::from_secs(30), || !group_alive(pgid)), "its agent was stopped");
    assert!(env.log(id).contains("released back to the queue"));
}

#[test]
fn models_come_from_opencode_and_the_default_is_checked_and_stored() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![]);
    let env = env.with_mock(&mock);
    let models = env.ok(&["models", "--provider", "anthropic"]);
    assert!(models.lines().any(|m| m == "anthropic/claude-sonnet-4-5"), "{models}");
    assert!(models.lines().all(|m| m.starts_with("anthropic/")));
    let out = env.run(&["models", "--set-default", "anthropic/no-such-model"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown model 'anthropic/no-such-model'")
    );
    env.ok(&["models", "--set-default", "anthropic/claude-sonnet-4-5"]);
    let st: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    assert_eq!(st["default_model"], "anthropic/claude-sonnet-4-5");
}

#[test]
fn repository_setup_commands_run_in_a_new_worktree_before_the_agent() {
    let env = Env::new();
    std::fs::write(env.repo.join(".env"), "SECRET=1\n").unwrap();
    std::fs::write(env.repo.join(".gitignore"), ".env\n").unwrap();
    std::fs::write(
        env.repo.join(".taskbridge.toml"),
        "[setup]\ncommands = [\"cp \\\"$TASKBRIDGE_REPO/.env\\\" .env\", \"echo ready > setup-ran.txt\"]\n",
    )
    .unwrap();
    git(&env.repo, &["add", ".gitignore", ".taskbridge.toml"]);
    git(&env.repo, &["commit", "-qm", "setup"]);
    let wt = env.worktree(1);
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("cat .env setup-ran.txt > seen.txt"),
        Turn::text(result_block("Checked the set-up.", &[])),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Check the environment", "--keep-worktree"]);
    let _worker = env.start_worker(1);
    let t = env.wait_task(id, RUN, |t| ["done", "failed"].contains(&t["status"].as_str().unwrap()));
    assert_eq!(t["status"], "done", "{t:#}\n{}", env.log(id));
    assert_eq!(
        std::fs::read_to_string(wt.join("seen.txt")).unwrap(),
        "SECRET=1\nready\n",
        "the agent saw the set-up"
    );
    assert!(env.log(id).contains("setup: cp"), "{}", env.log(id));
    let committed = git_out(&env.repo, &["ls-tree", "-r", "--name-only", "taskbridge/task-1"]);
    assert!(!committed.contains(".env"), "an ignored file is never committed: {committed}");
}
