//! Faults found by trying TaskBridge as a new user and as a fault injector would, each driven
//! the way it was found: the real binary, the real OpenCode (warm server unless said) against the
//! loopback mock, real git repositories.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::{MockAnthropic, Turn};
use crate::support::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

const RUN: Duration = Duration::from_secs(120);

use crate::support::{result_turn as result_block, touched_paths as files};

/// Every worktree of the world's repository, spares included.
fn worktree_dirs(env: &Env) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(env.worktree(0).parent().unwrap()) else { return Vec::new() };
    rd.filter_map(|e| Some(e.ok()?.path())).filter(|p| p.is_dir()).collect()
}

/// What `git status` shows in `dir` (untracked files included), one path a line.
fn dirt(dir: &Path) -> String {
    git_out(dir, &["status", "--porcelain", "--untracked-files=all"])
}

#[test]
fn a_followup_after_a_worker_restart_runs_in_its_own_worktree_with_its_parents_conversation() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo v1 > feature.txt"),
        result_block("Added the feature."),
        Turn::bash("echo docs > docs.txt"),
        result_block("Documented the feature."),
    ]);
    let env = env.with_mock(&mock);
    let a = env.submit(&["Add the feature"]);
    let mut worker = env.start_worker(1);
    let ta = env.wait_status(a, "done", RUN);
    worker.terminate();

    let _worker = env.start_worker(1);
    let b: i64 = env.ok(&["followup", &a.to_string(), "Now document it"]).trim().parse().unwrap();
    let tb = env.wait_status(b, "done", RUN);
    assert_eq!(files(&tb), ["docs.txt"], "its own work, in its own worktree: {}", env.log(b));
    assert_eq!(tb["result"]["started_from"], ta["result"]["commit"]);
    let branch = tb["branch"].as_str().unwrap();
    assert_eq!(git_out(&env.repo, &["show", &format!("{branch}:docs.txt")]), "docs");
    // The parent's conversation went on, in its own session: the follow-up ran where the
    // parent's session lives, and its first request carries the parent's.
    assert_eq!(tb["session_id"], ta["session_id"], "{}", env.log(b));
    let first = request_with(&mock, "Now document it");
    assert!(first.contains("echo v1 > feature.txt"), "the parent's tool call is in context");
    for dir in worktree_dirs(&env) {
        assert_eq!(dirt(&dir), "", "nothing stray in {}", dir.display());
    }
}

#[test]
fn a_followup_whose_parents_directory_other_tasks_reused_writes_only_into_its_own_worktree() {
    let env = Env::new();
    let mut script = vec![Turn::bash("echo v1 > feature.txt"), result_block("Added the feature.")];
    for n in 1..=3 {
        script.push(Turn::bash(&format!("echo {n} > other{n}.txt")));
        script.push(result_block("Another change."));
    }
    script.extend([
        Turn::bash("echo docs > docs.txt"),
        result_block("Documented the feature."),
        Turn::bash("echo more >> docs.txt"),
        result_block("Extended the docs."),
    ]);
    let mock = MockAnthropic::spawn(script);
    // A task that holds the parent's old directory while the follow-up runs.
    let held = Turn::Slow { after_ms: 20_000, turn: Box::new(result_block("Held it.")) };
    mock.answer_when("Hold the directory", held);
    let env = env.with_mock(&mock);
    let _worker = env.start_worker(2);
    let a = env.submit(&["Add the feature"]);
    let ta = env.wait_status(a, "done", RUN);
    // One at a time, so each takes the spare directory the one before left.
    for n in 1..=3 {
        let id = env.submit(&[&format!("Another change {n}")]);
        let t = env.wait_status(id, "done", RUN);
        assert_eq!(files(&t), [format!("other{n}.txt")]);
    }
    let x = env.submit(&["Hold the directory"]);
    assert!(
        eventually(RUN, || mock.requests().iter().any(|r| r.to_string().contains("Hold the dir"))),
        "the holding task never reached the model"
    );
    let b: i64 = env.ok(&["followup", &a.to_string(), "Now document it"]).trim().parse().unwrap();
    let tb = env.wait_status(b, "done", RUN);
    // A follow-up of the follow-up: the chain goes on.
    let c: i64 =
        env.ok(&["followup", &b.to_string(), "Say more in the docs"]).trim().parse().unwrap();
    let tc = env.wait_status(c, "done", RUN);
    let tx = env.wait_status(x, "done", RUN);

    assert_eq!(files(&tb), ["docs.txt"], "{}", env.log(b));
    assert!(env.log(b).contains("given that conversation as text"), "{}", env.log(b));
    assert_eq!(tb["result"]["started_from"], ta["result"]["commit"]);
    assert_eq!(files(&tc), ["docs.txt"], "{}", env.log(c));
    assert_eq!(tc["result"]["started_from"], tb["result"]["commit"]);
    let branch = tc["branch"].as_str().unwrap();
    assert_eq!(git_out(&env.repo, &["show", &format!("{branch}:docs.txt")]), "docs\nmore");
    assert!(request_with(&mock, "Now document it").contains("echo v1 > feature.txt"));
    let of_c = request_with(&mock, "Say more in the docs");
    assert!(of_c.contains("echo docs > docs.txt") && of_c.contains("echo v1 > feature.txt"));
    // Nothing of the follow-ups landed in the task that held the parent's directory.
    assert_eq!(tx["result"]["no_changes"], true, "{tx:#}\n{}", env.log(x));
    for dir in worktree_dirs(&env) {
        assert_eq!(dirt(&dir), "", "nothing stray in {}", dir.display());
    }
    for t in [a + 1, a + 2, a + 3] {
        let branch = env.show(t)["branch"].as_str().unwrap().to_owned();
        let changed = git_out(&env.repo, &["diff", "--name-only", "main", &branch]);
        assert!(!changed.contains("docs"), "task {t}'s branch: {changed}");
    }
}

#[test]
fn a_worktree_removed_under_the_agent_fails_the_attempt_and_the_retry_does_the_work_again() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("sleep 4; echo first > first.txt"),
        result_block("Wrote it."),
        Turn::bash("echo again > again.txt"),
        result_block("Wrote it again."),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Write a file"]);
    let _worker = env.start_worker(1);
    let wt = env.worktree(id);
    assert!(eventually(RUN, || !mock.requests().is_empty() && wt.exists()), "never started");
    std::fs::remove_dir_all(&wt).unwrap();
    let t = env.wait_task(id, RUN, |t| t["status"] == "done" || t["status"] == "failed");
    let log = env.log(id);
    assert!(log.contains(&format!("the worktree {} disappeared", wt.display())), "{log}");
    assert!(log.contains("the work in it is lost"), "{log}");
    assert_eq!(t["status"], "done", "the retry did the work: {t:#}\n{log}");
    assert_eq!(t["attempts"], 2);
    assert_eq!(files(&t), ["again.txt"], "{t:#}");
    assert_eq!(t["result"]["no_changes"], false);
}

#[test]
fn a_small_cost_budget_shows_its_significant_digits() {
    let env = Env::new();
    let id = env.submit(&["Cheap work", "--max-cost-usd", "0.003"]);
    let shown = env.ok(&["show", &id.to_string()]);
    assert!(shown.contains("budget:    $0.003\n"), "{shown}");
    assert!(!shown.contains("$0.00\n"), "{shown}");
}

#[test]
fn a_live_peer_kills_a_sigkilled_workers_agent_before_its_task_runs_again() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![sleeper("pgid.txt"), result_block("Ran again.")]);
    let env = env.with_mock(&mock);
    let workers = [env.start_worker(1), env.start_worker(1)];
    let id = env.submit(&["Sleep a long time"]);
    let pgid = read_pgid(&env.worktree(id).join("pgid.txt"));
    let t = env.show(id);
    let owner = t["worker"].as_str().unwrap().to_owned();
    let pid: u32 = owner.split(':').nth(1).unwrap().parse().unwrap();
    // `<worker>@<wall>.json`: the server of the task's repository.
    let named = format!("{}@", owner.replace(':', "_"));
    let server_file = std::fs::read_dir(env.home.join("servers"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(&named))
        .unwrap();
    let server: Value =
        serde_json::from_str(&std::fs::read_to_string(&server_file).unwrap()).unwrap();
    let server = server["pid"].as_i64().unwrap() as i32;
    let [a, b] = workers;
    let (mut victim, _survivor) = if a.pid() == pid { (a, b) } else { (b, a) };
    assert_eq!(victim.pid(), pid);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    victim.0.wait().unwrap();
    // Never two runs of the task's commands at once: while the dead worker's command lives, the
    // task has not started again.
    let done = eventually(RUN, || {
        let t = env.show(id);
        if t["attempts"].as_i64().unwrap() > 1 || t["worker"] != owner.as_str() {
            assert!(
                !group_alive(pgid),
                "the task runs again while the dead worker's command lives"
            );
        }
        t["status"] == "done"
    });
    assert!(done, "{:#}\n{}", env.show(id), env.log(id));
    assert!(!group_alive(pgid), "the dead worker's command was killed");
    assert!(!pid_alive(server), "the dead worker's OpenCode server was killed");
    let t = env.show(id);
    assert_ne!(t["worker"], owner.as_str(), "the live peer ran it");
    assert_eq!(t["result"]["summary"], "Ran again.");
}

/// What the finished task's usage says against every turn the mock answered but `unreported`
/// (the mock's turn n sends 100 + n input, 20 + n output, 40 + n cache-read and 30 + n
/// cache-write tokens).
fn assert_spend_counted(mock: &MockAnthropic, t: &Value, unreported: u64, log: &str) {
    let sent = mock.sent_usage();
    let u = &t["result"]["usage"];
    let got = |k: &str| u[k].as_u64().unwrap();
    assert_eq!(
        got("cache_read_tokens"),
        sent.cache_read - (40 + unreported),
        "{u:#} vs {sent:?}\n{log}"
    );
    assert_eq!(got("cache_write_tokens"), sent.cache_write - (30 + unreported), "{u:#}");
    assert_eq!(got("output_tokens") + got("reasoning_tokens"), sent.output - (20 + unreported));
}

fn spend_across_an_interruption(mode: &str, kill: bool) {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo a > a.txt"),
        sleeper("pgid.txt"),
        result_block("Finished after the interruption."),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Spend across an interruption"]);
    let mut worker = env.start_worker_with(1, &["--opencode", mode]);
    let pgid = read_pgid(&env.worktree(id).join("pgid.txt"));
    if kill {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(worker.pid() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        worker.0.wait().unwrap();
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pgid),
            nix::sys::signal::Signal::SIGKILL,
        );
    } else {
        worker.terminate();
    }
    let _worker = env.start_worker_with(1, &["--opencode", mode]);
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(mock.requests().len(), 3, "{}", env.log(id));
    // The step cut short mid-tool-call (turn 2) was never reported by the agent: the provider
    // billed it, but no agent says how much. Every step reported before and after counts.
    assert_spend_counted(&mock, &t, 2, &env.log(id));
}

#[test]
fn spend_before_a_ctrl_c_counts_on_the_warm_server() {
    spend_across_an_interruption("serve", false);
}

#[test]
fn spend_before_a_kill_9_counts_on_the_warm_server() {
    spend_across_an_interruption("serve", true);
}

#[test]
fn spend_before_a_ctrl_c_counts_in_run_mode() {
    spend_across_an_interruption("run", false);
}

#[test]
fn spend_before_a_kill_9_counts_in_run_mode() {
    spend_across_an_interruption("run", true);
}

#[test]
fn a_note_to_a_running_task_reaches_the_agent_at_its_next_step_on_the_warm_server() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("sleep 4; echo a > a.txt"),
        result_block("Done, with the note in mind."),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Work a while"]);
    let _worker = env.start_worker(1);
    assert!(eventually(RUN, || !mock.requests().is_empty()), "never started");
    let said = env.ok(&["add-note", &id.to_string(), "Use tabs, not spaces"]);
    assert!(said.contains("note added; the agent gets it at its next step"), "{said}");
    let t = env.wait_status(id, "done", RUN);
    let later = request_with(&mock, "Use tabs, not spaces");
    assert!(later.contains("echo a > a.txt"), "given after the step that was running: {later}");
    assert_eq!(t["notes"][0]["delivered"], true, "{t:#}");
    let shown = env.ok(&["show", &id.to_string()]);
    assert!(shown.contains("note: Use tabs, not spaces\n"), "{shown}");
}

#[test]
fn a_note_the_agent_never_got_because_its_task_ended_first_says_so() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("sleep 4; echo a > a.txt"),
        result_block("Done before any note."),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Work a while"]);
    // `opencode run` takes no prompt mid-turn: the note waits for a next turn that never comes.
    let _worker = env.start_worker_with(1, &["--opencode", "run"]);
    assert!(eventually(RUN, || !mock.requests().is_empty()), "never started");
    env.ok(&["add-note", &id.to_string(), "Too late"]);
    let t = env.wait_status(id, "done", RUN);
    assert_eq!(t["notes"][0]["delivered"], false);
    assert_eq!(t["notes"][0]["ended_first"], true, "{t:#}");
    let shown = env.ok(&["show", &id.to_string()]);
    assert!(shown.contains("note: Too late (not delivered: the task ended first)"), "{shown}");
    assert!(mock.requests().iter().all(|r| !r.to_string().contains("Too late")));
}

/// A running `serve` and the token it asks for.
struct Srv {
    port: u16,
    token: String,
}

fn mcp_post(srv: &Srv, headers: &str, body: &str) -> (u16, String) {
    let auth = format!("Authorization: Bearer {}\r\n{headers}", srv.token);
    post_with(srv.port, "127.0.0.1", &auth, body)
}

/// A new MCP session on the server at `port`, initialized; its id.
fn new_session(srv: &Srv) -> String {
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let (status, resp) = mcp_post(srv, "", init);
    assert_eq!(status, 200, "{resp}");
    let id = resp
        .lines()
        .find_map(|l| {
            l.strip_prefix("mcp-session-id: ").or_else(|| l.strip_prefix("Mcp-Session-Id: "))
        })
        .unwrap_or_else(|| panic!("no session id: {resp}"))
        .trim()
        .to_owned();
    let done = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let (status, _) = mcp_post(srv, &format!("Mcp-Session-Id: {id}\r\n"), done);
    assert_eq!(status, 202);
    id
}

/// Whether the session still answers `tools/list`.
fn session_lives(srv: &Srv, id: &str) -> bool {
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let (status, resp) = mcp_post(
        srv,
        &format!("Mcp-Session-Id: {id}\r\nMcp-Protocol-Version: 2025-11-25\r\n"),
        list,
    );
    match status {
        200 => true,
        404 => false,
        other => panic!("{other}: {resp}"),
    }
}

#[test]
fn mcp_sessions_are_capped_closing_the_least_recently_used() {
    let env = Env::new();
    let (_serve, port) = start_serve(&env, &[]);
    let srv = &Srv { port, token: env.token() };
    let first = new_session(srv);
    let kept = new_session(srv);
    for _ in 0..mcp::sessions::MAX_SESSIONS {
        assert!(session_lives(srv, &kept), "a session in use is kept");
        new_session(srv);
    }
    assert!(!session_lives(srv, &first), "the least recently used session was closed");
    assert!(session_lives(srv, &kept));
    // The client whose session went away initializes again, as the protocol says.
    let again = new_session(srv);
    assert!(session_lives(srv, &again));
}

#[test]
fn the_log_is_rotated_by_size_keeping_a_few_private_files() {
    let mut env = Env::new();
    env.extra_env.push(("TASKBRIDGE_LOG_MAX_BYTES".into(), "1000".into()));
    // A worker that finds nothing to do logs its start and stop (a few hundred bytes).
    for _ in 0..20 {
        env.ok(&["worker", "--once"]);
    }
    let logs = env.home.join("logs");
    let mut names: Vec<String> = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("taskbridge.log"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "taskbridge.log",
            "taskbridge.log.1",
            "taskbridge.log.2",
            "taskbridge.log.3",
            "taskbridge.log.4"
        ],
        "rotated, and only a few kept"
    );
    for n in &names {
        let meta = std::fs::metadata(logs.join(n)).unwrap();
        assert!(meta.len() < 2000, "{n} is {} bytes", meta.len());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{n}");
    }
}

/// A queue with a few tasks whose database file then has some of its pages overwritten.
fn damaged_queue() -> (Env, PathBuf) {
    damage(Env::new())
}

fn damage(env: Env) -> (Env, PathBuf) {
    let long = "x".repeat(3000);
    for i in 0..30 {
        env.submit(&[&format!("Task {i}: {long}"), "--title", &format!("Task {i}")]);
    }
    let db = env.home.join("taskbridge.db");
    // Everything in the file, none of it in the write-ahead log.
    let out = std::process::Command::new("sqlite3")
        .arg(&db)
        .arg("PRAGMA wal_checkpoint(TRUNCATE)")
        .output()
        .expect("sqlite3 (Debian's package, which .ci/run installs)");
    assert!(out.status.success(), "{out:?}");
    let mut bytes = std::fs::read(&db).unwrap();
    let end = bytes.len();
    bytes[end - 3 * 4096 + 200..end - 4096].fill(0);
    std::fs::write(&db, bytes).unwrap();
    (env, db)
}

#[test]
fn a_damaged_database_is_named_with_how_to_recover_and_doctor_finds_it() {
    let (env, db) = damaged_queue();
    let out = env.run(&["submit", "One more"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("the database {} is damaged", db.display())), "{err}");
    assert!(err.contains("restore it from a backup") && err.contains(".recover"), "{err}");
    let doctor = env.run(&["doctor"]);
    let text = String::from_utf8_lossy(&doctor.stdout);
    assert!(text.contains(&format!("FAIL  database {} is damaged", db.display())), "{text}");
    assert!(text.contains("sqlite3 '") && text.contains(".recovered"), "{text}");
}

#[test]
fn a_worker_on_a_damaged_database_refuses_to_start_and_still_kills_a_dead_workers_server() {
    let mock = MockAnthropic::spawn(vec![result_block("Done before the crash.")]);
    let env = Env::new().with_mock(&mock);
    let worker = env.start_worker_with(1, &["--opencode", "serve"]);
    let id = env.submit(&["Start the warm server"]);
    env.wait_status(id, "done", Duration::from_secs(120));
    let server = server_pid(&env).expect("the warm server's pid file");
    assert!(pid_alive(server));
    // The worker is killed (its server outlives it), and then the file is damaged.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    drop(worker);
    let (env, db) = damage(env);
    for command in [&["worker"][..], &["serve", "--listen", "127.0.0.1:0"]] {
        let out = env.run(command);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command:?} started: {err}");
        assert!(err.contains(&format!("the database {} is damaged", db.display())), "{err}");
        assert!(err.contains(".recover"), "the fix: {err}");
    }
    assert!(
        eventually(Duration::from_secs(10), || !worker::process::pid_alive(server.into())),
        "the dead worker's OpenCode server was killed"
    );
}

#[test]
fn a_read_only_database_is_named_with_what_to_check() {
    let env = Env::new();
    env.submit(&["First"]);
    let db = env.home.join("taskbridge.db");
    // Root writes through file modes: the immutable flag stops it too.
    let root = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").unwrap().uid() == 0
    };
    if root {
        assert!(
            std::process::Command::new("chattr").arg("+i").arg(&db).status().unwrap().success()
        );
    } else {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o400)).unwrap();
    }
    let out = env.run(&["submit", "Second"]);
    if root {
        std::process::Command::new("chattr").arg("-i").arg(&db).status().unwrap();
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("the database {} cannot be written", db.display())), "{err}");
    assert!(err.contains(&format!("ls -l {}", db.display())), "{err}");
    assert_eq!(env.show(1)["title"], "First", "nothing lost");
}

#[test]
#[ignore = "needs root, to give the repository to another user (.ci/run runs it as root)"]
fn a_repository_of_another_user_is_explained_as_safe_directory_and_the_command_works() {
    let env = Env::new();
    let chown = std::process::Command::new("chown").args(["-R", "nobody"]).arg(&env.repo).status();
    assert!(chown.unwrap().success(), "chown needs root");
    let out = env.run(&["submit", "Anything"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("owned by another user") && err.contains("safe.directory"), "{err}");
    assert!(!err.contains("git init"), "{err}");
    // The command it gives, run as given (HOME is this world's), lets the submit through.
    let command = err.split('`').nth(1).unwrap();
    let ran = std::process::Command::new("sh")
        .args(["-c", command])
        .env("HOME", &env.oc_home)
        .env("XDG_CONFIG_HOME", env.oc_home.join(".config"))
        .status()
        .unwrap();
    assert!(ran.success(), "{command}");
    env.submit(&["Now it goes in"]);
}

#[test]
fn list_shows_age_and_run_time_apart_and_says_when_rows_were_left_out() {
    let env = Env::new();
    for i in 0..3 {
        env.submit(&[&format!("Task {i}")]);
    }
    // Task 1 was submitted 15 minutes ago and ran for 5 seconds, 1 minute ago.
    let db = env.home.join("taskbridge.db");
    let sql = "UPDATE tasks SET status = 'done', created_at = unixepoch() - 900, \
               started_at = unixepoch() - 65, finished_at = unixepoch() - 60 WHERE id = 1";
    let out = std::process::Command::new("sqlite3").arg(&db).arg(sql).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let list = env.ok(&["list"]);
    let header = list.lines().next().unwrap();
    assert!(header.contains("AGE") && header.contains("RAN"), "{list}");
    let row = list.lines().find(|l| l.trim_start().starts_with("1 ")).unwrap();
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cols[..6], ["1", "done", "0", "0", "15m", "5s"], "{list}");
    assert!(!list.contains("shown"), "all rows shown: {list}");
    let two = env.ok(&["list", "--limit", "2"]);
    assert_eq!(two.lines().count(), 4, "{two}");
    assert_eq!(two.lines().last().unwrap(), "2 of 3 shown; --limit N shows more");
}

#[test]
fn submit_warns_of_uncommitted_changes_the_agent_will_not_see() {
    let env = Env::new();
    std::fs::write(env.repo.join("README.md"), "changed\n").unwrap();
    for n in 0..5 {
        std::fs::write(env.repo.join(format!("new{n}.txt")), "x").unwrap();
    }
    let out = env.run(&["submit", "Use the new files"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.lines().find(|l| l.contains("uncommitted")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("has 6 uncommitted changes the agent will not see"), "{line}");
    assert!(line.contains("README.md") && line.contains("and 3 more"), "{line}");
    // A clean tree gets no such warning.
    git(&env.repo, &["add", "."]);
    git(&env.repo, &["commit", "-qm", "more"]);
    let out = env.run(&["submit", "Again"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("uncommitted"));
}

#[test]
fn result_and_diff_verbs_print_a_tasks_result_and_its_diff() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("printf 'hello\\n' > hello.txt"),
        result_block("Wrote hello."),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Write hello"]);
    let out = env.run(&["result", &id.to_string()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no result yet"), "{out:?}");
    let _worker = env.start_worker(1);
    let t = env.wait_status(id, "done", RUN);
    let result: Value = serde_json::from_str(&env.ok(&["result", &id.to_string()])).unwrap();
    assert_eq!(result["summary"], "Wrote hello.");
    assert_eq!(result["commit"], t["result"]["commit"]);
    assert_eq!(result["diff"], t["result"]["diff"]);
    // Into a pipe: the plain diff, as git would print it.
    let diff = env.ok(&["diff", &id.to_string()]);
    assert_eq!(diff, t["result"]["diff"].as_str().unwrap());
    assert!(diff.contains("+hello\n") && !diff.contains('\x1b'), "{diff}");
    let coloured = env.ok(&["diff", &id.to_string(), "--color", "always"]);
    assert!(coloured.contains("\x1b[32m+hello\x1b[0m"), "{coloured:?}");
    assert!(coloured.contains("\x1b[1mdiff --git"), "{coloured:?}");
}

#[test]
fn a_bare_reject_fails_the_task_saying_what_was_rejected_and_the_command_never_ran() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo deploy-prod > deployed.txt"),
        result_block("Should not get here."),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Deploy it", "--ask", "bash:echo deploy*"]);
    let _worker = env.start_worker(1);
    env.wait_status(id, "waiting", RUN);
    env.ok(&["answer", &id.to_string(), "reject"]);
    let t = env.wait_status(id, "failed", RUN);
    let error = t["error"].as_str().unwrap();
    assert!(error.starts_with("stopped: the answer rejected permission to bash"), "{error}");
    assert!(error.contains("echo deploy-prod"), "{error}");
    assert!(!error.contains("answer once"), "no answer instructions in a failure: {error}");
    assert!(!env.worktree(id).join("deployed.txt").exists(), "the command never ran");
    let branch = t["branch"].as_str().unwrap();
    let changed = git_out(&env.repo, &["diff", "--name-only", "main", branch]);
    assert!(!changed.contains("deployed.txt"), "{changed}");
}

#[test]
fn get_keeps_a_multi_line_question_in_its_column_and_says_when_dependencies_are_done() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::tool(
            "question",
            json!({"questions": [{"question": "Which one?\nThe second line says why.", "header": "Pick",
                   "options": [{"label": "a", "description": "the first"}, {"label": "b", "description": "the second"}]}]}),
        ),
        result_block("Picked."),
        result_block("Dependent done."),
    ]);
    let env = env.with_mock(&mock);
    let first = env.submit(&["Ask first"]);
    let _worker = env.start_worker(1);
    env.wait_status(first, "waiting", RUN);
    let shown = env.ok(&["get", &first.to_string()]);
    assert!(
        shown.contains("QUESTION   Which one?\n             The second line says why."),
        "{shown}"
    );
    env.ok(&["answer", &first.to_string(), "a"]);
    env.wait_status(first, "done", RUN);
    let second = env.submit(&["After it", "--depends-on", &first.to_string()]);
    let shown = env.ok(&["get", &second.to_string()]);
    assert!(shown.contains(&format!("after:     {first} (all done)")), "{shown}");
    let qa = env.ok(&["get", &first.to_string()]);
    assert!(qa.contains("Q1: Which one?\n      The second line says why."), "{qa}");
}

#[test]
fn doctor_checks_a_model_against_a_fresh_list_when_the_cached_one_lacks_it() {
    // First without the provider set up: OpenCode's list (cached) has none of its models.
    let mut env = Env::new();
    env.opencode_config = Some(json!({"autoupdate": false, "share": "disabled"}).to_string());
    env.extra_env.push(("ANTHROPIC_API_KEY".into(), String::new()));
    let before = env.run(&["list-models"]);
    let listed = String::from_utf8_lossy(&before.stdout).into_owned();
    assert!(!listed.lines().any(|m| m == crate::support::MODEL), "no key, no model: {listed}");
    assert!(String::from_utf8_lossy(&before.stderr).contains("as fetched 0s ago"), "{before:?}");
    // Then the provider is configured, within the cache's hour.
    let mock = MockAnthropic::spawn(vec![]);
    let env = env.with_mock(&mock);
    let doctor = env.run(&["doctor"]);
    let text = String::from_utf8_lossy(&doctor.stdout);
    assert!(text.contains(&format!("ok    model {}", crate::support::MODEL)), "{text}");
    assert!(!text.contains("unknown model"), "{text}");
}

#[test]
fn doctor_probe_against_a_dead_endpoint_gives_up_soon_naming_model_provider_and_url() {
    let mut env = Env::new();
    // A loopback port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/v1");
    env.opencode_config = Some(
        json!({"provider": {"anthropic": {"options": {"baseURL": url, "apiKey": "k"}}},
               "autoupdate": false, "share": "disabled"})
        .to_string(),
    );
    let out = env.run(&["doctor", "--probe"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("probe:")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.starts_with("FAIL"), "{text}");
    assert!(
        line.contains(&format!("{} (provider anthropic, {url})", crate::support::MODEL)),
        "{line}"
    );
}

/// A world on `of`'s repository and the queue `db`, with a home of its own.
fn same_repository(of: &Env, db: &Path) -> Env {
    let mut other = Env::new();
    other.repo = of.repo.clone();
    other.db = Some(db.display().to_string());
    other
}

#[test]
fn a_second_queue_on_the_same_home_steps_around_the_first_queues_worktrees_and_branches() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo first > first.txt"),
        result_block("First queue's task 1."),
        Turn::bash("echo second > second.txt"),
        result_block("Second queue's task 1."),
    ]);
    let env = env.with_mock(&mock);
    let one = env.submit(&["First queue", "--keep-worktree"]);
    let mut w = env.start_worker_with(1, &["--opencode", "run"]);
    let t1 = env.wait_status(one, "done", RUN);
    w.terminate();
    // The same home (and repository) on a second queue: its task numbers start at 1 again.
    let mut second = same_repository(&env, &env.dir.path().join("second.db"));
    second.home = env.home.clone();
    let second = second.with_mock(&mock);
    let two = second.submit(&["Second queue"]);
    assert_eq!(two, one, "both queues have a task {one}");
    let _w2 = second.start_worker_with(1, &["--opencode", "run"]);
    let t2 = second.wait_status(two, "done", RUN);
    assert_eq!(files(&t2), ["second.txt"], "{}", second.log(two));
    assert_ne!(t2["worktree"], t1["worktree"], "a directory of its own");
    assert_ne!(t2["branch"], t1["branch"], "a branch of its own");
    // The first queue's kept worktree and branch are as it left them.
    let kept = PathBuf::from(t1["worktree"].as_str().unwrap());
    assert!(kept.join("first.txt").exists() && !kept.join("second.txt").exists());
    let b1 = t1["branch"].as_str().unwrap();
    assert_eq!(git_out(&env.repo, &["rev-parse", b1]), t1["result"]["commit"].as_str().unwrap());
}

#[test]
fn a_task_left_running_by_another_homes_dead_worker_runs_here_on_a_branch_of_its_own() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![sleeper("pgid.txt"), result_block("Ran here.")]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Sleep, then finish"]);
    let mut first = env.start_worker_with(1, &["--opencode", "run"]);
    let pgid = read_pgid(&env.worktree(id).join("pgid.txt"));
    let left = env.show(id);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    first.0.wait().unwrap();
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pgid),
        nix::sys::signal::Signal::SIGKILL,
    );
    // Another home on the same queue and repository; the first home's worktree still holds the
    // task's branch.
    let other = same_repository(&env, &env.home.join("taskbridge.db")).with_mock(&mock);
    let _w = other.start_worker_with(1, &["--opencode", "run"]);
    let t = env.wait_task(id, RUN, |t| t["status"] == "done" || t["status"] == "failed");
    let log = env.log(id);
    assert_eq!(t["status"], "done", "{t:#}\n{log}\n{}", other.log(id));
    assert_ne!(t["branch"], left["branch"], "{t:#}");
    assert!(
        log.contains("this attempt starts afresh on") || other.log(id).contains("starts afresh on")
    );
    assert!(
        PathBuf::from(left["worktree"].as_str().unwrap()).exists(),
        "the other home's worktree is left alone"
    );
}

#[test]
fn a_queue_migrated_from_sqlite_to_postgres_keeps_the_home_and_its_worktrees_stay_apart() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![result_block("Done."); 3]);
    mock.answer_when("Before the move", Turn::bash("echo one > one.txt"));
    mock.answer_when("Queued across the move", Turn::bash("echo two > two.txt"));
    mock.answer_when("After the move", Turn::bash("echo three > three.txt"));
    let env = env.with_mock(&mock);
    let one = env.submit(&["Before the move", "--keep-worktree"]);
    let mut w = env.start_worker_with(1, &["--opencode", "run"]);
    let t1 = env.wait_status(one, "done", RUN);
    w.terminate();
    let two = env.submit(&["Queued across the move"]);
    // The same home, its queue copied to a PostgreSQL schema; the home's worktrees stay.
    let mut pg = Env::new().on_postgres();
    let target = pg.db.clone().unwrap();
    let sqlite = env.home.join("taskbridge.db");
    env.ok(&["migrate", "--from", &format!("sqlite:{}", sqlite.display()), "--to", &target]);
    pg.home = env.home.clone();
    pg.repo = env.repo.clone();
    pg.oc_home = env.oc_home.clone();
    let pg = pg.with_mock(&mock);
    let three = pg.submit(&["After the move"]);
    let _w = pg.start_worker_with(1, &["--opencode", "run"]);
    for (id, file) in [(two, "two.txt"), (three, "three.txt")] {
        let t = pg.wait_task(id, RUN, |t| t["status"] == "done" || t["status"] == "failed");
        assert_eq!(t["status"], "done", "{t:#}\n{}", pg.log(id));
        assert_eq!(files(&t), [file], "only its own work: {}", pg.log(id));
        assert_ne!(t["worktree"], t1["worktree"], "{t:#}");
    }
    // The task done before the move keeps its worktree and branch as they were.
    let kept = PathBuf::from(t1["worktree"].as_str().unwrap());
    assert!(kept.join("one.txt").exists() && !kept.join("two.txt").exists());
    let b1 = t1["branch"].as_str().unwrap();
    assert_eq!(git_out(&env.repo, &["rev-parse", b1]), t1["result"]["commit"].as_str().unwrap());
}
