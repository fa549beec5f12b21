//! Trust boundaries, probed through the real binary as another local user or a hostile caller
//! would: the token every HTTP listener asks for (loopback too), a remote that would be a git
//! option, terminal escapes in what the CLI prints, and a libpq keyword string given as `--db`.
//! The test that needs a second Unix user runs as root only (ignored otherwise; `.ci/run` runs
//! it).
#![allow(clippy::unwrap_used)]

use crate::support::*;
use std::os::unix::fs::PermissionsExt;

#[test]
fn the_default_server_asks_every_caller_for_the_token_it_keeps_in_the_home() {
    let env = Env::new();
    let (_server, p) = start_serve(&env, &["--no-worker"]);
    let host = format!("127.0.0.1:{p}");
    let token = env.token();
    let file = env.home.join("token");
    assert_eq!(token.len(), 64, "256 bits, hex");
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(post(&p, &host, None), 401, "no token");
    assert_eq!(post(&p, &host, Some(&token)), 200);
    // Wrong tokens of the right length: one differing only in its last byte, one in its first.
    let [last, first] = near_misses(&token);
    assert_eq!(post(&p, &host, Some(&last)), 401, "last byte wrong");
    assert_eq!(post(&p, &host, Some(&first)), 401, "first byte wrong");
    // A burst of wrong tokens is slowed (429, Retry-After); the right one keeps working.
    let mut throttled = None;
    for _ in 0..12 {
        let (status, resp) = post_body(p, &host, Some(&last), INITIALIZE);
        if status == 429 {
            throttled = Some(resp);
            break;
        }
        assert_eq!(status, 401);
    }
    let resp = throttled.expect("a burst of wrong tokens was never slowed");
    assert!(resp.to_ascii_lowercase().contains("retry-after:"), "{resp}");
    assert_eq!(post(&p, &host, Some(&token)), 200, "the right token still works");
    // The refusals are logged, without the tokens that were tried.
    let log = std::fs::read_to_string(env.home.join("logs/taskbridge.log")).unwrap();
    assert!(log.contains("refused a call without the right token"), "{log}");
    assert!(!log.contains(&last) && !log.contains(&first), "a tried token is in the log");
    // The same token again after a restart: clients keep working.
    drop(_server);
    let (_again, p2) = start_serve(&env, &["--no-worker"]);
    assert_eq!(post(&p2, &format!("127.0.0.1:{p2}"), Some(&token)), 200);
}

/// `post` with the port by reference, so the calls above read as a table.
fn post(p: &u16, host: &str, token: Option<&str>) -> u16 {
    crate::support::post(*p, host, token)
}

#[test]
fn a_token_the_user_gives_is_checked_and_argv_is_warned_about() {
    let env = Env::new();
    let short = env.run(&["serve", "--no-worker", "--listen", "127.0.0.1:0", "--token", "x"]);
    let err = String::from_utf8_lossy(&short.stderr);
    assert!(!short.status.success(), "a 1-character token was taken");
    assert!(err.contains("at least 32") && err.contains("openssl rand -hex 32"), "{err}");
    let short_env = env
        .cmd()
        .args(["serve", "--no-worker", "--listen", "127.0.0.1:0"])
        .env("TASKBRIDGE_TOKEN", "too-short")
        .output()
        .unwrap();
    assert!(!short_env.status.success());
    assert!(String::from_utf8_lossy(&short_env.stderr).contains("TASKBRIDGE_TOKEN"));

    let long = "argv-token-0123456789abcdef0123456789";
    let (_server, p, _, stderr) = start_http_stderr(env.cmd().args([
        "serve",
        "--no-worker",
        "--listen",
        "127.0.0.1:0",
        "--token",
        long,
    ]));
    assert!(
        stderr.contains("visible to every user") && stderr.contains("--token-file"),
        "{stderr}"
    );
    assert_eq!(crate::support::post(p, &format!("127.0.0.1:{p}"), Some(long)), 200);
    assert!(!env.home.join("token").exists(), "a given token makes no home token");

    // --no-token: today's open server, on loopback only, with the warning.
    let (_open, p, _, stderr) = start_http_stderr(env.cmd().args([
        "serve",
        "--no-worker",
        "--listen",
        "127.0.0.1:0",
        "--no-token",
    ]));
    assert!(stderr.contains("any user of this machine can call this server"), "{stderr}");
    assert_eq!(crate::support::post(p, &format!("127.0.0.1:{p}"), None), 200);
    let wide = env.run(&["serve", "--no-worker", "--listen", "0.0.0.0:0", "--no-token"]);
    assert!(!wide.status.success());
    assert!(String::from_utf8_lossy(&wide.stderr).contains("--no-token is for loopback only"));
}

#[test]
#[ignore = "needs root, to run a request as another user (runuser); .ci/run runs it"]
fn another_local_user_cannot_drive_the_default_server_or_read_its_token() {
    let env = Env::new();
    let (_server, p) = start_serve(&env, &["--no-worker"]);
    let token = env.token();
    let as_nobody = |code: &str| {
        let out = std::process::Command::new("runuser")
            .args(["-u", "nobody", "--", "python3", "-c", code])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
            + &String::from_utf8_lossy(&out.stderr)
    };
    let call = format!(
        "import urllib.request as u, urllib.error as e\n\
         r = u.Request('http://127.0.0.1:{p}/mcp', data=b'''{INITIALIZE}''', method='POST', headers={{\
         'Content-Type': 'application/json', 'Accept': 'application/json, text/event-stream'}})\n\
         try:\n    print(u.urlopen(r).status)\nexcept e.HTTPError as x:\n    print(x.code)\n"
    );
    assert_eq!(as_nobody(&call), "401", "another user called the server without the token");
    let read = format!(
        "try:\n    print(open('{}').read())\nexcept OSError as x:\n    print('refused', x.errno)\n",
        env.home.join("token").display()
    );
    let got = as_nobody(&read);
    assert!(got.starts_with("refused"), "another user read the token: {got}");
    assert!(!got.contains(&token));
    // No task was stored by the refused call.
    assert!(env.ok(&["list"]).contains("no tasks"));
}

#[test]
fn a_remote_that_git_would_read_as_an_option_is_refused_over_the_cli_and_mcp() {
    // On a shared queue the submit side asks git about the remote, which is where an option
    // would have run its command.
    let env = Env::new().on_postgres();
    let witness = env.dir.path().join("pwned");
    let evil = format!("--upload-pack=touch {}; git-upload-pack", witness.display());
    let cli = env.run(&["submit", &format!("--remote={evil}"), "hello"]);
    let err = String::from_utf8_lossy(&cli.stderr);
    assert!(!cli.status.success(), "the CLI took it");
    assert!(err.contains("invalid remote") && err.contains("read as an option"), "{err}");
    // Given apart, the argument parser already refuses it as an unknown option.
    assert!(!env.run(&["submit", "--remote", &evil, "hello"]).status.success());
    for helper in ["ext::sh -c touch% /tmp/x", "fd::3"] {
        let out = env.run(&["submit", "--remote", helper, "hello"]);
        assert!(String::from_utf8_lossy(&out.stderr).contains("remote helper"), "{helper}");
    }

    let (_server, p) = start_serve(&env, &["--no-worker"]);
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "submit_task", "arguments": {
            "prompt": "hello", "repo": env.repo.display().to_string(), "remote": evil}}
    });
    let resp = mcp_call(p, &env.token(), &body.to_string());
    assert!(resp.contains("invalid remote"), "{resp}");
    assert!(!witness.exists(), "git ran the remote as an option");
    assert!(env.ok(&["list"]).contains("no tasks"), "a refused submit stored a task");
}

#[test]
fn terminal_escapes_in_a_title_are_printed_escaped() {
    let env = Env::new();
    let title = "fix\x1b]0;owned\x07\x1b[2J it\u{9b}31m";
    let id = env.submit(&["--title", title, "do it"]);
    let id = id.to_string();
    for out in [env.ok(&["list"]), env.ok(&["show", &id]), env.ok(&["show", &id, "--json"])] {
        assert!(
            !out.chars().any(|c| c.is_control() && c != '\n' && c != '\t'),
            "a raw control character reached the terminal: {out:?}"
        );
    }
    let shown = env.ok(&["show", &id]);
    assert!(shown.contains(r"fix\x1b]0;owned\x07\x1b[2J it\u{9b}31m"), "{shown}");
    let json: serde_json::Value = serde_json::from_str(&env.ok(&["show", &id, "--json"])).unwrap();
    assert_eq!(json["title"], title, "JSON keeps the title exactly");
}

#[test]
fn a_libpq_keyword_string_as_db_is_refused_without_printing_its_password() {
    let env = Env::new();
    let db = "host=127.0.0.1 port=5432 dbname=q user=me password=hunter2";
    let out = env.cmd().args(["list", "--db", db]).current_dir(env.dir.path()).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("libpq keyword string") && text.contains("postgres://"), "{text}");
    assert!(!text.contains("hunter2"), "the password was printed: {text}");
    let made: Vec<_> = std::fs::read_dir(env.dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("password"))
        .collect();
    assert!(made.is_empty(), "a queue file was created under that name: {made:?}");
}

#[test]
fn under_repo_root_a_task_outside_it_is_not_found_by_any_tool() {
    let env = Env::new();
    // A repository beside the root, with a finished task and a queued one in it (submitted
    // from the CLI, which has no roots).
    let outside = env.dir.path().join("outside");
    repo_with_one_commit(&outside);
    let out_repo = outside.to_str().unwrap();
    let hidden = env.submit(&["--repo", out_repo, "--title", "secret-outside-title", "x"]);
    let queued = env.submit(&["--repo", out_repo, "--title", "secret-queued-title", "y"]);
    env.ok(&["cancel", &hidden.to_string()]);
    let root = env.repo.display().to_string();
    let (_server, p) = start_serve(&env, &["--no-worker", "--repo-root", &root]);
    let token = env.token();
    // The tool's answer: its error's text, or the whole result.
    let tool = |name: &str, args: serde_json::Value| -> String {
        let body = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": name, "arguments": args}});
        let resp = mcp_call(p, &token, &body.to_string());
        let msg: serde_json::Value = resp
            .lines()
            .find_map(|l| l.strip_prefix("data: ").filter(|d| d.starts_with('{')))
            .map(|d| serde_json::from_str(d).unwrap())
            .unwrap_or_else(|| panic!("no answer: {resp}"));
        match msg["result"]["structuredContent"]["error"].as_str() {
            Some(e) => e.to_owned(),
            None => msg["result"].to_string(),
        }
    };
    let by_id = |name: &str, id: i64, more: serde_json::Value| {
        let mut args = serde_json::json!({"task_id": id});
        args.as_object_mut().unwrap().extend(more.as_object().unwrap().clone());
        tool(name, args)
    };
    for (name, more) in [
        ("get_task", serde_json::json!({})),
        ("get_task_result", serde_json::json!({})),
        ("get_task_logs", serde_json::json!({})),
        ("answer_task", serde_json::json!({"answer": "yes"})),
        ("add_task_note", serde_json::json!({"note": "hi"})),
        ("set_task_priority", serde_json::json!({"priority": 5})),
        ("cancel_task", serde_json::json!({})),
        ("retry_task", serde_json::json!({})),
        ("followup_task", serde_json::json!({"prompt": "more"})),
        ("merge_task", serde_json::json!({})),
    ] {
        // Exactly what an id that does not exist gets: nothing says the task is there.
        for id in [hidden, queued] {
            let got = by_id(name, id, more.clone());
            let unknown = by_id(name, 99_999, more.clone());
            assert!(got.contains(&format!("task #{id} does not exist")), "{name} {id}: {got}");
            assert_eq!(
                got.replace(&id.to_string(), "N"),
                unknown.replace("99999", "N"),
                "{name} tells an outside task from a missing one"
            );
        }
    }
    let waited = tool("wait_for", serde_json::json!({"task_ids": [queued], "timeout_s": 0}));
    assert!(waited.contains(&format!("task #{queued} does not exist")), "{waited}");
    let listed = tool("list_tasks", serde_json::json!({}));
    assert!(!listed.contains("secret-"), "list_tasks shows outside tasks: {listed}");
    let batch = tool(
        "submit_batch",
        serde_json::json!({"tasks": [{"prompt": "z", "repo": root, "depends_on": [queued]}]}),
    );
    assert!(batch.contains(&format!("task #{queued} does not exist")), "{batch}");
    let cleared = tool("clear_finished", serde_json::json!({}));
    assert!(cleared.contains(r#""cleared":[]"#), "{cleared}");
    // Nothing was changed behind the refusals.
    let h = env.show(hidden);
    assert_eq!(h["status"], "cancelled", "clear_finished cleared an outside task");
    let q = env.show(queued);
    assert_eq!((q["status"].as_str(), q["priority"].as_i64()), (Some("queued"), Some(0)));
    assert!(q["notes"].as_array().is_none_or(|n| n.is_empty()), "{q:#}");

    // A directory under the root whose repository lies above it, and a symlink out of the
    // root, are outside too.
    let sub = env.repo.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let link = env.repo.join("link-out");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    let (_narrow, p2) = start_serve(&env, &["--no-worker", "--repo-root", sub.to_str().unwrap()]);
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "submit_task", "arguments": {"prompt": "x", "repo": sub}}});
    let above = mcp_call(p2, &token, &body.to_string());
    assert!(above.contains("outside the roots"), "{above}");
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "submit_task", "arguments": {"prompt": "x", "repo": link}}});
    let linked = mcp_call(p, &token, &body.to_string());
    assert!(linked.contains("outside the roots"), "{linked}");
    let all: serde_json::Value = serde_json::from_str(&env.ok(&["list", "--json"])).unwrap();
    assert_eq!(all.as_array().map(Vec::len), Some(2), "a refused submit stored a task: {all:#}");
}

#[test]
fn setup_and_verify_commands_come_from_the_commit_never_from_the_working_tree() {
    let env = Env::new();
    let witness = env.dir.path().join("ran");
    let config = format!(
        "[setup]\ncommands = [\"echo setup >> '{w}'\"]\n[verify]\ncommands = [\"echo verify >> '{w}'\"]\n",
        w = witness.display()
    );
    // Untracked: whoever (or whatever agent) wrote it, it is not the repository's.
    std::fs::write(env.repo.join(".taskbridge.toml"), &config).unwrap();
    let agent = script(env.dir.path(), "agent", "cat > /dev/null\necho hi > out.txt\n");
    let first = env.submit(&["untracked config"]);
    env.run_queue_with(&agent, &[]);
    assert_eq!(env.show(first)["status"], "done", "{}", env.log(first));
    assert!(!witness.exists(), "an untracked .taskbridge.toml ran its commands");
    // Committed, the same file is the repository's configuration.
    git(&env.repo, &["add", ".taskbridge.toml"]);
    git(&env.repo, &["commit", "-qm", "taskbridge config"]);
    let second = env.submit(&["committed config"]);
    env.run_queue_with(&agent, &[]);
    assert_eq!(env.show(second)["status"], "done", "{}", env.log(second));
    assert_eq!(std::fs::read_to_string(&witness).unwrap(), "setup\nverify\n");
}

/// What a command an agent runs would find: its environment and every process's command line.
const LOOK: &str = "env > env.txt; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; \
                    echo; done > ps.txt";

#[test]
fn no_secret_is_in_any_command_line_or_in_what_the_agents_commands_see() {
    use crate::support::mock_anthropic::{MockAnthropic, Turn};
    let mut env = Env::new().on_postgres();
    // The test server trusts loopback, so any password is accepted: one that would be a secret.
    let password = "pw-canary-5e0c1d";
    let url =
        env.db.clone().unwrap().replacen("taskbridge@", &format!("taskbridge:{password}@"), 1);
    assert!(url.contains(password), "{url}");
    env.db = Some(url);
    let token = "token-canary-0123456789abcdef0123456789";
    let mock = MockAnthropic::spawn(vec![result_turn("Looked around."); 4]);
    mock.answer_when("Look around with OpenCode", Turn::bash(LOOK));
    mock.answer_when(
        "Look around with Claude Code",
        Turn::tool("Bash", serde_json::json!({"command": LOOK, "description": "look"})),
    );
    let env = env.with_mock(&mock).with_claude(&mock);
    let oc = env.submit(&["Look around with OpenCode", "--keep-worktree"]);
    let cc =
        env.submit(&["Look around with Claude Code", "--agent", "claude-code", "--keep-worktree"]);
    let _worker = Child(
        env.cmd()
            .args(["worker", "--concurrency", "2", "--opencode", "serve", "--claude-bridge"])
            .env("TASKBRIDGE_TOKEN", token)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Every process's command line, read over and over while the tasks run.
    let home = env.home.display().to_string();
    let mut seen_bridge = false;
    let finished = |id: i64| ["done", "failed"].contains(&env.show(id)["status"].as_str().unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    while !(finished(oc) && finished(cc)) {
        assert!(std::time::Instant::now() < deadline, "the tasks did not finish");
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else { continue };
            let line = String::from_utf8_lossy(&raw).replace('\0', " ");
            assert!(!line.contains(password), "a password in a command line: {line}");
            assert!(!line.contains(token), "a token in a command line: {line}");
            // This test's own bridge (on its home): other modules' tests run beside it.
            seen_bridge |= line.contains("claude-mcp") && line.contains(&home);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(seen_bridge, "the reverse bridge never ran, so its command line was not looked at");
    for id in [oc, cc] {
        let t = env.show(id);
        assert_eq!(t["status"], "done", "{t:#}\n{}", env.log(id));
        let wt = env.worktree(id);
        let seen = std::fs::read_to_string(wt.join("env.txt")).unwrap();
        assert!(seen.contains("PATH="), "the agent's command ran: {seen}");
        for secret in [password, token, "TASKBRIDGE_DB=", "TASKBRIDGE_TOKEN="] {
            assert!(!seen.contains(secret), "task {id}: {secret} in the agent's environment");
        }
        // OpenCode's warm server has a password; its agent's commands get it blank.
        let server_password: Vec<&str> =
            seen.lines().filter(|l| l.starts_with("OPENCODE_SERVER_PASSWORD=")).collect();
        assert!(
            server_password.iter().all(|l| *l == "OPENCODE_SERVER_PASSWORD="),
            "task {id}: the warm server's password in the agent's environment: {server_password:?}"
        );
        let ps = std::fs::read_to_string(wt.join("ps.txt")).unwrap();
        assert!(!ps.contains(password) && !ps.contains(token), "task {id}: a secret in ps");
    }
}

/// Half-sent requests, one more header line every 5 s, as many as the descriptors allow, from
/// another user; reconnecting whatever the server closes, as an attacker would.
const SLOWLORIS: &str = r#"
import socket, sys, time
port = int(sys.argv[1])
def one():
    s = socket.create_connection(('127.0.0.1', port), timeout=2)
    s.sendall(b'POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n')
    return s
socks = []
for _ in range(1100):
    try:
        socks.append(one())
    except OSError:
        pass
print('open', len(socks), flush=True)
end = time.time() + 30
while time.time() < end:
    time.sleep(5)
    alive = []
    for s in socks:
        try:
            s.sendall(b'X-Slow: 1\r\n')
            alive.append(s)
        except OSError:
            try:
                alive.append(one())
            except OSError:
                pass
    socks = alive
print('done', flush=True)
"#;

/// `initialize` with the right token, as a client that gives up after 2 s; the status.
fn answered_within_2s(p: u16, token: &str) -> Result<u16, String> {
    use std::io::{Read, Write};
    let limit = std::time::Duration::from_secs(2);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], p));
    let mut s = std::net::TcpStream::connect_timeout(&addr, limit).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(limit)).unwrap();
    s.set_write_timeout(Some(limit)).unwrap();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{INITIALIZE}",
        INITIALIZE.len()
    )
    .map_err(|e| e.to_string())?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&head);
    text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or(text.into_owned())
}

#[test]
#[ignore = "needs root, to run the flood as another user (runuser); .ci/run runs it"]
fn a_slowloris_flood_from_another_user_keeps_neither_the_token_nor_the_worker_out() {
    use crate::support::mock_anthropic::{MockAnthropic, Turn};
    use std::io::BufRead;
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo greeting > hello.txt"),
        result_turn("Greeted during the flood."),
    ]);
    let env = Env::new().with_mock(&mock);
    // The server and its worker under a 1,024 descriptor limit.
    let mut cmd = std::process::Command::new("prlimit");
    cmd.args(["--nofile=1024:1024", "--"]).arg(bin());
    cmd.args(["serve", "--listen", "127.0.0.1:0"]).current_dir(&env.repo).env_clear();
    cmd.envs(env.env_vars());
    let (_server, p, _) = start_http(&mut cmd);
    let token = env.token();
    // The flood, as `nobody`, with descriptors enough for all of it.
    let mut flood = std::process::Command::new("prlimit")
        .args(["--nofile=4096:4096", "--", "runuser", "-u", "nobody", "--", "python3", "-c"])
        .arg(SLOWLORIS)
        .arg(p.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = std::io::BufReader::new(flood.stdout.take().unwrap()).lines();
    let opened = said.next().unwrap().unwrap();
    let n: usize = opened.strip_prefix("open ").unwrap().parse().unwrap();
    assert!(n >= 1000, "the flood opened {n} connections");
    // A task submitted meanwhile runs; the right token is answered, again and again.
    let id = env.submit(&["Greet during the flood"]);
    for round in 0..4 {
        assert_eq!(answered_within_2s(p, &token), Ok(200), "round {round} of the flood");
        std::thread::sleep(std::time::Duration::from_secs(3));
    }
    let t = env.wait_status(id, "done", std::time::Duration::from_secs(120));
    assert_eq!(touched_paths(&t), ["hello.txt"], "{t:#}");
    assert_eq!(said.next().unwrap().unwrap(), "done", "the flood ran to its end");
    flood.wait().unwrap();
    // And after it, too.
    assert_eq!(answered_within_2s(p, &token), Ok(200));
}
