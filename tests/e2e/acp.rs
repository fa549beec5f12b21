//! End to end over the Agent Client Protocol: the real OpenCode 2.1.2 (the default when it is the
//! OpenCode found: no flag, no configuration) and 1.18.33 (`--opencode acp`), both pinned, against
//! the loopback mock of the Messages API; an `[agents.NAME]` from a config file; and a tiny ACP
//! agent of the suite's own that speaks the protocol wrongly. Every answer goes through the real
//! binary (the CLI) or a real MCP client.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::{MockAnthropic, SentUsage, Turn};
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

/// Which OpenCode a test drives over ACP.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Oc {
    /// 1.18.33, with `--opencode acp`.
    One,
    /// 2.1.2, found as `opencode`: ACP with nothing set.
    Two,
}

fn world(oc: Oc, mock: &MockAnthropic) -> Env {
    match oc {
        Oc::One => Env::new().with_mock(mock),
        Oc::Two => Env::new().with_opencode2(mock),
    }
}

fn worker(env: &Env, oc: Oc) -> Child {
    match oc {
        Oc::One => env.start_worker_with(1, &["--opencode", "acp"]),
        Oc::Two => env.start_worker(1),
    }
}

fn write(env: &Env, id: i64, file: &str, text: &str) -> Turn {
    Turn::tool("write", json!({"filePath": env.worktree(id).join(file), "content": text}))
}

fn usage_of(t: &Value) -> SentUsage {
    let u = &t["result"]["usage"];
    let n = |k: &str| u[k].as_u64().unwrap();
    SentUsage {
        input: n("input_tokens"),
        output: n("output_tokens") + n("reasoning_tokens"),
        cache_read: n("cache_read_tokens"),
        cache_write: n("cache_write_tokens"),
    }
}

fn first_task(oc: Oc) {
    let mock = MockAnthropic::spawn(vec![]);
    let env = world(oc, &mock);
    let id = env.submit(&["Write hello.txt"]);
    mock.push([
        write(&env, id, "hello.txt", "greeting\n"),
        Turn::bash("sh test.sh"),
        Turn::text(result_block("Wrote hello.txt.")),
    ]);
    let _w = worker(&env, oc);
    let t = env.wait_task(id, RUN, |t| ["done", "failed"].contains(&t["status"].as_str().unwrap()));
    assert_eq!(t["status"], "done", "{t:#}\n{}", env.log(id));
    let r = &t["result"];
    assert_eq!(r["summary"], "Wrote hello.txt.");
    assert_eq!(
        git_out(&env.repo, &[("show"), &format!("taskbridge/task-{id}:hello.txt")]),
        "greeting"
    );
    assert_eq!(r["agent"]["mode"], "acp", "{r:#}");
    // OpenCode 1 cannot put its question tool to a client over ACP; 2 asks it as a form.
    assert_eq!(r["agent"]["native_questions"], oc == Oc::Two, "{r:#}");
    // Every step the model answered, summed exactly (1.18.33's own answer names only the last).
    assert_eq!(usage_of(&t), mock.sent_to_steps(), "{:#}\n{}", r["usage"], env.log(id));
    assert!(r["usage"]["cost_usd"].as_f64().unwrap() > 0.0, "{:#}", r["usage"]);
    assert_eq!(t["session_id"], r["session_id"]);
    assert!(t["session_id"].as_str().unwrap().starts_with("ses_"), "{t:#}");
    let log = env.log(id);
    assert!(log.contains("opencode over ACP: session ses_"), "{log}");
    assert!(log.contains("hello.txt (completed)"), "{log}");
    // The repository's next task goes on in the directory the agent knows, in a session made
    // there ahead while the last one ran.
    mock.push([Turn::text(result_block("Nothing to do."))]);
    let next = env.submit(&["Look again"]);
    let t = env.wait_status(next, "done", RUN);
    let log = env.log(next);
    assert!(log.contains("(reusing") && log.contains("(made ahead)"), "{log}");
    assert_ne!(t["session_id"], r["session_id"], "a session of its own");
}

#[test]
fn opencode_2_is_driven_over_acp_with_nothing_set_and_its_spend_is_summed_exactly() {
    first_task(Oc::Two);
}

#[test]
fn opencode_1_over_acp_does_a_task_and_its_spend_is_summed_exactly() {
    first_task(Oc::One);
}

/// A turn that calls OpenCode's `question` tool with one question and its options.
fn ask_colour() -> Turn {
    Turn::tool(
        "question",
        json!({"questions": [{
            "question": "Which colour should the banner be?",
            "header": "Banner colour",
            "options": [
                {"label": "red", "description": "Warm and loud"},
                {"label": "blue", "description": "Calm"},
            ],
        }]}),
    )
}

#[test]
fn opencode_2s_question_answered_over_mcp_returns_to_the_same_tool_call() {
    let mock = MockAnthropic::spawn(vec![]);
    let env = world(Oc::Two, &mock);
    let id = env.submit(&["Add a banner"]);
    mock.push([
        ask_colour(),
        write(&env, id, "banner.txt", "blue\n"),
        Turn::text(result_block("Made a blue banner.")),
    ]);
    let _w = worker(&env, Oc::Two);
    let t = env.wait_status(id, "waiting", RUN);
    let ask = &t["ask"];
    assert_eq!(ask["kind"], "question", "{t:#}");
    assert_eq!(ask["questions"][0]["question"], "Which colour should the banner be?");
    assert_eq!(option_labels(ask), ["red", "blue"]);
    let session = t["session_id"].clone();
    let before = mock.requests().len();
    let answered = python_mcp_call(&env, "answer_task", json!({"task_id": id, "answer": "blue"}));
    assert_eq!(answered["status"], "queued", "{answered:#}");
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["session_id"], session);
    assert_eq!(t["attempts"], 1);
    assert!(t["questions"][0]["answered_by"].as_str().unwrap().starts_with("mcp:"), "{t:#}");
    let after = &mock.requests()[before];
    assert!(tool_results(after).contains("blue"), "the tool result carries the answer: {after}");
    assert!(!after["messages"].to_string().contains("The answer is:"), "no new prompt was sent");
    assert!(env.log(id).contains("answered the agent's pending request"), "{}", env.log(id));
}

#[test]
fn opencode_2s_question_answered_from_the_cli_with_free_text_reaches_the_model() {
    let mock = MockAnthropic::spawn(vec![ask_colour(), Turn::text(result_block("Teal it is."))]);
    let env = world(Oc::Two, &mock);
    let id = env.submit(&["Add a banner"]);
    let _w = worker(&env, Oc::Two);
    env.wait_status(id, "waiting", RUN);
    env.ok(&["answer", &id.to_string(), "a dark teal, like the logo"]);
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["questions"][0]["answered_by"], "cli");
    let results = tool_results(mock.requests().last().unwrap());
    assert!(results.contains("a dark teal, like the logo"), "{results}");
}

fn permission_requests(t: &Value) -> Vec<Value> {
    t["result"]["permission_requests"].as_array().cloned().unwrap_or_default()
}

fn approved_once(oc: Oc) {
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo deploy-now > deployed.txt"),
        Turn::text(result_block("Deployed.")),
    ]);
    let env = world(oc, &mock);
    let id = env.submit(&["Deploy it", "--ask", "bash:echo deploy*"]);
    let _w = worker(&env, oc);
    let t = env.wait_status(id, "waiting", RUN);
    let ask = &t["ask"];
    assert_eq!(ask["kind"], "permission", "{t:#}");
    assert_eq!(ask["permission"]["permission"], "bash");
    assert_eq!(ask["permission"]["target"], "echo deploy-now > deployed.txt");
    assert!(!env.worktree(id).join("deployed.txt").exists(), "nothing ran before the answer");
    env.ok(&["answer", &id.to_string(), "once"]);
    let t = env.wait_status(id, "done", RUN);
    let branch = t["result"]["branch"].as_str().unwrap();
    assert_eq!(git_out(&env.repo, &["show", &format!("{branch}:deployed.txt")]), "deploy-now");
    let reqs = permission_requests(&t);
    assert_eq!((reqs.len(), reqs[0]["answer"].as_str()), (1, Some("once")), "{t:#}");
    assert!(env.log(id).contains("answered the agent's pending request"), "{}", env.log(id));
}

#[test]
fn opencode_2_asks_for_a_command_and_once_lets_it_run_in_the_same_turn() {
    approved_once(Oc::Two);
}

#[test]
fn opencode_1_over_acp_asks_for_a_command_and_once_lets_it_run() {
    approved_once(Oc::One);
}

#[test]
fn always_approves_the_rest_of_the_task_and_reject_with_feedback_reaches_the_model() {
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo deploy-one >> deployed.txt"),
        Turn::bash("echo deploy-two >> deployed.txt"),
        Turn::text(result_block("Deployed twice.")),
    ]);
    let env = world(Oc::Two, &mock);
    let id = env.submit(&["Deploy twice", "--ask", "bash:echo deploy*"]);
    let _w = worker(&env, Oc::Two);
    env.wait_status(id, "waiting", RUN);
    env.ok(&["answer", &id.to_string(), "always"]);
    let t = env.wait_status(id, "done", RUN);
    let branch = t["result"]["branch"].as_str().unwrap();
    let deployed = git_out(&env.repo, &["show", &format!("{branch}:deployed.txt")]);
    assert_eq!(deployed, "deploy-one\ndeploy-two");
    let reqs = permission_requests(&t);
    assert_eq!(reqs.len(), 2, "{t:#}");
    assert_eq!(reqs[1]["answered_by"], "rule", "the second was approved by the first answer");

    mock.push([
        Turn::bash("echo deploy-prod > prod.txt"),
        Turn::text(result_block("Used the staging branch instead.")),
    ]);
    let id = env.submit(&["Deploy to prod", "--ask", "bash:echo deploy*"]);
    env.wait_status(id, "waiting", RUN);
    env.ok(&["answer", &id.to_string(), "reject: use the staging branch"]);
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["result"]["summary"], "Used the staging branch instead.");
    assert!(!env.worktree(id).join("prod.txt").exists(), "the rejected command never ran");
    let sent = serde_json::to_string(&mock.requests().last().unwrap()["messages"]).unwrap();
    assert!(sent.contains("use the staging branch"), "the feedback reached the model: {sent}");
    assert_eq!(t["session_id"], t["result"]["session_id"]);
}

/// Each mock turn reports 100+n input and 20+n output tokens: two steps pass 150.
fn spender() -> Vec<Turn> {
    vec![
        Turn::bash("echo one >> steps.txt"),
        Turn::bash("echo two >> steps.txt"),
        Turn::bash("echo three >> steps.txt"),
        Turn::text(result_block("Spent and finished.")),
        Turn::text(result_block("Spent and finished.")),
    ]
}

fn budget_pause(oc: Oc) {
    let mock = MockAnthropic::spawn(spender());
    let env = world(oc, &mock);
    let id = env.submit(&["Spend", "--max-tokens", "150"]);
    let _w = worker(&env, oc);
    let t = env.wait_status(id, "waiting", RUN);
    assert_eq!(t["ask"]["kind"], "budget", "{t:#}\n{}", env.log(id));
    let b = &t["ask"]["budget"];
    assert_eq!((b["limit"].as_str(), b["max"].as_f64()), (Some("tokens"), Some(150.0)));
    assert!(b["spent"].as_f64().unwrap() > 150.0, "{b}");
    let steps = std::fs::read_to_string(env.worktree(id).join("steps.txt")).unwrap_or_default();
    assert!(steps.lines().count() < 3, "the budget stopped the turn mid-way: {steps:?}");
    let session = t["session_id"].clone();
    env.ok(&["answer", &id.to_string(), "continue 10000"]);
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["result"]["summary"], "Spent and finished.");
    assert_eq!(t["session_id"], session, "the budget stop went on in the same session");
}

#[test]
fn opencode_2s_budget_pauses_the_turn_and_continue_goes_on_in_its_session() {
    budget_pause(Oc::Two);
}

#[test]
fn opencode_1s_budget_over_acp_pauses_the_turn_mid_way() {
    budget_pause(Oc::One);
}

#[test]
fn cancelling_a_task_over_acp_cancels_its_turn_and_leaves_no_command_running() {
    let mock = MockAnthropic::spawn(vec![
        sleeper("pgid.txt"),
        Turn::text(result_block("Next task done.")),
        Turn::text(result_block("Next task done.")),
    ]);
    let env = world(Oc::Two, &mock);
    let id = env.submit(&["Do something slow"]);
    let _w = worker(&env, Oc::Two);
    let pgid = read_pgid(&env.worktree(id).join("pgid.txt"));
    assert!(group_alive(pgid));
    env.ok(&["cancel", &id.to_string()]);
    env.wait_status(id, "cancelled", RUN);
    assert!(
        eventually(Duration::from_secs(30), || !group_alive(pgid)),
        "the agent's command was stopped with its task"
    );
    assert!(env.log(id).contains("cancelling its session"), "{}", env.log(id));
    let next = env.submit(&["Something quick"]);
    assert_eq!(env.wait_status(next, "done", RUN)["result"]["summary"], "Next task done.");
}

/// The pid the dead worker's ACP agent had, from the file the next worker reads.
fn agent_pid(env: &Env) -> Option<i32> {
    let dir = std::fs::read_dir(env.home.join("servers")).ok()?;
    let f = dir.flatten().map(|e| e.path()).find(|p| p.to_string_lossy().contains("@acp-"))?;
    let v: Value = serde_json::from_str(&std::fs::read_to_string(f).ok()?).ok()?;
    v["pid"].as_i64().map(|p| p as i32)
}

fn killed_mid_turn(oc: Oc) {
    let mock = MockAnthropic::spawn(vec![
        sleeper("pgid.txt"),
        Turn::text(result_block("Went on after the crash.")),
    ]);
    let env = world(oc, &mock);
    let id = env.submit(&["Do something slow"]);
    let mut w = worker(&env, oc);
    let pgid = read_pgid(&env.worktree(id).join("pgid.txt"));
    let session = env.show(id)["session_id"].as_str().unwrap().to_owned();
    let agent = agent_pid(&env).expect("the ACP agent's pid file");
    w.0.kill().unwrap(); // SIGKILL: nothing of the worker's own runs
    w.0.wait().unwrap();
    let _w = worker(&env, oc);
    assert!(
        eventually(Duration::from_secs(60), || !group_alive(pgid) && !pid_alive(agent)),
        "the dead worker's agent and its command were killed"
    );
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["result"]["summary"], "Went on after the crash.");
    assert_eq!(t["session_id"], session.as_str(), "the same session, loaded again");
    let log = env.log(id);
    assert!(log.contains(&format!("loaded session {session}")), "{log}");
}

#[test]
fn kill_9_of_the_worker_mid_turn_goes_on_in_the_same_opencode_2_session() {
    killed_mid_turn(Oc::Two);
}

#[test]
fn kill_9_of_the_worker_mid_turn_goes_on_in_the_same_opencode_1_session_over_acp() {
    killed_mid_turn(Oc::One);
}

#[test]
fn a_follow_up_goes_on_in_its_parents_opencode_2_session() {
    let mock = MockAnthropic::spawn(vec![]);
    let env = world(Oc::Two, &mock);
    let first = env.submit(&["Write one.txt"]);
    mock.push([write(&env, first, "one.txt", "one\n"), Turn::text(result_block("Wrote one."))]);
    let _w = worker(&env, Oc::Two);
    let t1 = env.wait_status(first, "done", RUN);
    let out = env.ok(&["followup", &first.to_string(), "Now write two.txt as well"]);
    let second: i64 = out.split_whitespace().find_map(|w| w.parse().ok()).unwrap();
    // Relative: a follow-up goes on where its parent's session is, its parent's directory.
    let two = Turn::tool("write", json!({"filePath": "two.txt", "content": "two\n"}));
    mock.push([two, Turn::text(result_block("Wrote two."))]);
    let t2 = env.wait_status(second, "done", RUN);
    assert_eq!(t2["result"]["session_id"], t1["result"]["session_id"], "the same session");
    assert_eq!(files_touched(&t2["result"]), vec![("two.txt".into(), "added".into())]);
    let convo = mock.requests().last().unwrap()["messages"].to_string();
    assert!(convo.contains("Write one.txt") && convo.contains("Now write two.txt"), "{convo}");
}

/// A config file with `[agents.NAME]` tables, used by every command of `env`.
fn with_agents(env: &mut Env, toml: &str) {
    let path = env.dir.path().join("config.toml");
    std::fs::write(&path, toml).unwrap();
    env.extra_env.push(("TASKBRIDGE_CONFIG".into(), path.display().to_string()));
}

#[test]
fn an_agent_from_the_config_file_runs_opencode_acp_and_lists_its_models() {
    let mock = MockAnthropic::spawn(vec![]);
    let mut env = world(Oc::One, &mock);
    let oc = opencode().display().to_string();
    with_agents(&mut env, &format!("[agents.oc-acp]\ncommand = [{oc:?}, \"acp\"]\n"));
    let models = env.ok(&["list-models", "--agent", "oc-acp"]);
    assert!(models.lines().any(|l| l == MODEL), "{models}");
    let refused = env.run(&["submit", "Write", "--agent", "oc-apc"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("oc-acp"), "names what there is: {err}");
    // The queue's default model is OpenCode's own; a configured agent is given the task's.
    let id = env.submit(&["Write hello.txt", "--agent", "oc-acp", "--model", MODEL]);
    mock.push([write(&env, id, "hello.txt", "greeting\n"), Turn::text(result_block("Wrote it."))]);
    // The worker's own OpenCode mode is not ACP: the agent is the configured one.
    let _w = env.start_worker_with(1, &["--opencode", "serve"]);
    let t = env.wait_task(id, RUN, |t| ["done", "failed"].contains(&t["status"].as_str().unwrap()));
    assert_eq!(t["status"], "done", "{t:#}\n{}", env.log(id));
    assert_eq!(t["agent"], "oc-acp");
    assert_eq!(t["result"]["agent"]["name"], "oc-acp");
    assert_eq!(t["result"]["agent"]["mode"], "acp");
    assert!(env.log(id).contains("oc-acp over ACP: session"), "{}", env.log(id));
    let doctor = env.ok(&["doctor"]);
    assert!(doctor.contains("agent oc-acp: OpenCode 1.18.33 over ACP"), "{doctor}");
}

/// An ACP agent that answers `initialize` and `session/new`, then misbehaves at the prompt as
/// `how` says.
const BAD_AGENT: &str = r#"
import json, sys
how = sys.argv[1]
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line)
    if m.get("method") == "initialize":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"protocolVersion": 1, "agentCapabilities": {}}})
    elif m.get("method") == "session/new":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"sessionId": "bad-1"}})
    elif m.get("method") == "session/prompt":
        if how == "malformed":
            sys.stdout.write("this is not JSON-RPC\n"); sys.stdout.flush()
        elif how == "exit":
            sys.stderr.write("bad agent: giving up\n"); sys.exit(3)
        elif how == "unknown":
            send({"jsonrpc": "2.0", "id": 99, "method": "_bad/launch_rockets", "params": {"sessionId": "bad-1"}})
"#;

#[test]
fn an_agent_that_speaks_acp_wrongly_ends_its_task_with_a_clear_error_and_nothing_hangs() {
    let mut env = Env::new();
    let script = env.dir.path().join("bad_agent.py");
    std::fs::write(&script, BAD_AGENT).unwrap();
    let s = script.display().to_string();
    let agents: String = ["malformed", "exit", "unknown"]
        .iter()
        .map(|how| format!("[agents.bad-{how}]\ncommand = [\"python3\", {s:?}, \"{how}\"]\n"))
        .collect();
    with_agents(&mut env, &agents);
    let ids: Vec<i64> = ["malformed", "exit", "unknown"]
        .iter()
        .map(|how| env.submit(&["Do it", "--agent", &format!("bad-{how}"), "--max-attempts", "1"]))
        .collect();
    let _w = env.start_worker(3);
    let said =
        ["not ACP's JSON-RPC: this is not JSON-RPC", "bad agent: giving up", "_bad/launch_rockets"];
    for (id, said) in ids.iter().zip(said) {
        let t = env.wait_status(*id, "failed", RUN);
        let error = t["error"].as_str().unwrap();
        assert!(error.contains(said), "task {id}: {error}");
        assert!(error.contains("bad-"), "the error names the agent: {error}");
    }
    // Speaking the protocol wrongly is final; an exit may be mended by another attempt.
    let malformed = env.submit(&["Again", "--agent", "bad-malformed"]);
    let t = env.wait_status(malformed, "failed", RUN);
    assert_eq!(t["attempts"], 1, "no retry mends a malformed message: {t:#}");
}

/// The TCP ports process `pid` listens on (its sockets in `/proc/net/tcp`, state LISTEN).
fn listening_ports(pid: i32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|row| {
            let f: Vec<&str> = row.split_whitespace().collect();
            let listening = f.get(3) == Some(&"0A");
            let ours = f.get(9).is_some_and(|i| inodes.iter().any(|x| x == i));
            let port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            (listening && ours).then_some(port)
        })
        .collect()
}

/// OpenCode 1's `acp` serves its HTTP API on the host's loopback for itself: it asks for a
/// password nobody else has, and the agent's commands do not get it.
#[test]
fn opencode_1s_own_server_over_acp_asks_a_password_its_commands_do_not_get() {
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("env > env.txt"),
        Turn::text(result_block("Looked.")),
        Turn::text(result_block("Looked.")),
    ]);
    let env = world(Oc::One, &mock);
    let id = env.submit(&["Look around", "--keep-worktree"]);
    let _w = worker(&env, Oc::One);
    let t = env.wait_status(id, "done", RUN);
    let seen = std::fs::read_to_string(env.worktree(id).join("env.txt")).unwrap();
    assert!(seen.contains("PATH="), "the command ran: {t:#}");
    let password: Vec<&str> =
        seen.lines().filter(|l| l.starts_with("OPENCODE_SERVER_PASSWORD=")).collect();
    assert!(password.iter().all(|l| *l == "OPENCODE_SERVER_PASSWORD="), "{password:?}");
    let agent = agent_pid(&env).expect("the ACP agent's pid file");
    let ports = listening_ports(agent);
    assert!(!ports.is_empty(), "OpenCode 1's acp serves its API on loopback");
    for port in ports {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /session HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 401"), "port {port} answered: {answer}");
    }
}
