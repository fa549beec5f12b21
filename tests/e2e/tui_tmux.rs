//! The TUI as a person uses it: in tmux, with keys sent and the screen read back, against a real
//! database that a real worker (running the real OpenCode against the mock) fills.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::{MockAnthropic, Turn};
use crate::support::*;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

pub(crate) struct Tmux {
    socket: String,
}

impl Tmux {
    /// A tmux of the test's own: its own socket, and no user configuration (`-f /dev/null`), so
    /// key bindings and options on the machine change nothing.
    fn cmd(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-f", "/dev/null", "-L"])
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }
    pub(crate) fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", "tb"]).stdout).into_owned()
    }
    pub(crate) fn keys(&self, keys: &[&str]) {
        for k in keys {
            assert!(self.cmd(&["send-keys", "-t", "tb", k]).status.success());
            std::thread::sleep(Duration::from_millis(60));
        }
    }
    /// Keys in one write, as a person's fast typing reaches the program (Esc then a key
    /// arrives as that key with Alt).
    pub(crate) fn keys_at_once(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "tb"];
        args.extend_from_slice(keys);
        assert!(self.cmd(&args).status.success());
    }
    pub(crate) fn text(&self, s: &str) {
        assert!(self.cmd(&["send-keys", "-t", "tb", "-l", s]).status.success());
    }
    pub(crate) fn wait_for(&self, needle: &str) -> String {
        self.wait_within(needle, Duration::from_secs(20))
    }
    pub(crate) fn wait_within(&self, needle: &str, limit: Duration) -> String {
        let mut last = String::new();
        let ok = eventually(limit, || {
            last = self.screen();
            last.contains(needle)
        });
        assert!(ok, "'{needle}' never appeared on screen:\n{last}");
        last
    }
    fn alive(&self) -> bool {
        self.cmd(&["has-session", "-t", "tb"]).status.success()
    }
}

/// Starts `taskbridge tui ARGS` in a fresh tmux server, through a script that carries this test's
/// environment.
fn start_tui(env: &Env, args: &str, width: u32) -> Tmux {
    start_tui_with(env, args, width, &[])
}

fn start_tui_with(env: &Env, args: &str, width: u32, extra: &[(&str, &str)]) -> Tmux {
    start_in_tmux(env, &format!("exec '{}' tui {args}", bin().display()), width, extra)
}

/// Runs the shell line `run` in the repository, in a fresh tmux server, with this test's
/// environment.
pub(crate) fn start_in_tmux(env: &Env, run: &str, width: u32, extra: &[(&str, &str)]) -> Tmux {
    static SCRIPTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = SCRIPTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let script = env.dir.path().join(format!("tmux-{width}-{k}.sh"));
    let mut text = String::from("#!/bin/sh\n");
    let extra = extra.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    for (k, v) in env.env_vars().into_iter().chain(extra) {
        text.push_str(&format!("export {k}='{}'\n", v.replace('\'', "'\\''")));
    }
    text.push_str(&format!("cd '{}'\n{run}\n", env.repo.display()));
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    // One tmux server per test: tests run in parallel in this process.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmux = Tmux { socket: format!("tb-test-{}-{width}-{n}", std::process::id()) };
    let w = width.to_string();
    let out = tmux.cmd(&[
        "new-session",
        "-d",
        "-s",
        "tb",
        "-x",
        &w,
        "-y",
        "30",
        script.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    tmux
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

#[test]
fn answer_a_waiting_task_and_cancel_a_running_one_from_the_keyboard() {
    answer_and_cancel(Env::new());
}

/// The same, with the queue on PostgreSQL: the TUI, the CLI and two workers meet only there.
#[test]
fn on_postgres_the_tui_answers_and_cancels_from_the_keyboard() {
    answer_and_cancel(Env::new().on_postgres());
}

fn answer_and_cancel(env: Env) {
    let mock = MockAnthropic::spawn(vec![
        Turn::text(
            "One thing first.\n\n```taskbridge-question\nShould the banner be red or blue?\n```",
        ),
        Turn::bash("ps -o pgid= $$ | tr -d ' ' > pgid.txt; sleep 300"),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Add a banner", "--title", "banner task"]);
    let mut worker = env.start_worker(1);
    env.wait_status(id, "waiting", Duration::from_secs(120));
    worker.terminate();

    let tmux = start_tui(&env, "--no-http --no-worker", 120);

    let screen = tmux.wait_for("banner task");
    assert!(screen.contains("waiting"), "{screen}");
    // The questions pane, then answer in the editor and send with Ctrl-S.
    tmux.keys(&["Q"]);
    tmux.wait_for("Should the banner be red or blue?");
    tmux.keys(&["a"]);
    tmux.wait_for("Ctrl-S sends");
    tmux.text("Blue, please.");
    tmux.keys(&["C-s"]);
    tmux.wait_for("answered; it resumes its session");
    let t = env.show(id);
    assert_eq!(t["status"], "queued", "the task is requeued");
    assert_eq!(t["questions"][0]["answer"], "Blue, please.", "the answer is stored");
    tmux.wait_for("queued");

    // A worker resumes it; the agent starts a long command; cancel it with c, y.
    let _worker = env.start_worker(1);
    env.wait_status(id, "running", Duration::from_secs(60));
    let pgid_file = env.worktree(id).join("pgid.txt");
    assert!(eventually(Duration::from_secs(90), || std::fs::read_to_string(&pgid_file)
        .is_ok_and(|s| !s.trim().is_empty())));
    let pgid: i32 = std::fs::read_to_string(&pgid_file).unwrap().trim().parse().unwrap();
    tmux.wait_for("running");
    // Tab leaves the questions pane for the queue; g selects the top row.
    tmux.keys(&["Tab", "g", "c"]);
    tmux.wait_for(&format!("Cancel task {id}?"));
    tmux.keys(&["y"]);
    let t = env.wait_status(id, "cancelled", Duration::from_secs(15));
    assert_eq!(t["status"], "cancelled");
    assert!(
        eventually(Duration::from_secs(30), || !group_alive(pgid)),
        "the agent's command was stopped"
    );
    tmux.wait_for("cancelled");

    // q quits (this TUI runs no worker, so it does not ask) and gives the terminal back.
    tmux.keys(&["q"]);
    assert!(eventually(Duration::from_secs(30), || !tmux.alive()), "the TUI exited");
}

#[test]
fn a_port_in_use_is_shown_in_the_header_and_the_tui_still_runs() {
    let env = Env::new();
    env.submit(&["Something to show", "--title", "still here"]);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let tmux = start_tui(&env, &format!("--no-worker --listen 127.0.0.1:{port}"), 160);
    let screen = tmux.wait_for("still here");
    assert!(screen.contains("MCP unavailable: cannot listen"), "{screen}");
    tmux.keys(&["q"]);
    assert!(eventually(Duration::from_secs(30), || !tmux.alive()));
    drop(taken);
}

/// The port the newest TUI's MCP server bound (it picks one itself, `--listen 127.0.0.1:0`), from
/// its log; `not` is an earlier TUI's.
fn tui_port(env: &Env, not: Option<u16>) -> u16 {
    let log = env.home.join("logs/taskbridge.log");
    let mut port = None;
    assert!(eventually(Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        port = text
            .lines()
            .rev()
            .filter_map(|l| l.split("MCP over HTTP at http://127.0.0.1:").nth(1))
            .find_map(|rest| rest.split('/').next()?.parse::<u16>().ok())
            .filter(|p| Some(*p) != not);
        port.is_some()
    }));
    port.unwrap()
}

#[test]
fn public_mode_in_the_tui_shows_the_url_guards_it_and_reports_a_dead_tunnel() {
    let env = Env::new();
    let tools = env.dir.path().join("tunnel");
    std::fs::create_dir_all(&tools).unwrap();
    let fake = fake_cloudflared(&tools, "exec sleep 600");
    let fake = fake.to_str().unwrap();
    let host = "four-dashed-word-url.trycloudflare.com";

    // Quitting the TUI stops the tunnel.
    let args = "--public cloudflare --no-worker --listen 127.0.0.1:0";
    let tmux = start_tui_with(&env, args, 200, &[("TASKBRIDGE_CLOUDFLARED", fake)]);
    let screen = tmux.wait_for(&format!("https://{host}/mcp (public"));
    let p = tui_port(&env, None);
    assert!(screen.contains(&format!("token in {}", env.home.join("token").display())), "{screen}");
    assert!(!screen.contains("(token)"), "the token is said once:\n{screen}");
    let token = std::fs::read_to_string(env.home.join("token")).unwrap();
    let token = token.trim();
    assert_eq!(post(p, host, Some(token)), 200, "the tunnel's host with the token");
    assert_eq!(post(p, host, None), 401, "no token");
    assert_eq!(post(p, "evil.example", Some(token)), 403, "another host");
    let tunnel = read_pid(&tools.join("tunnel.pid"));
    assert!(pid_alive(tunnel));
    tmux.keys(&["q"]);
    assert!(eventually(Duration::from_secs(10), || !tmux.alive()));
    assert!(
        eventually(Duration::from_secs(30), || !pid_alive(tunnel)),
        "the tunnel outlived the TUI"
    );

    // A tunnel that dies takes the public URL with it, and the header says so.
    std::fs::remove_file(tools.join("tunnel.pid")).unwrap();
    let args = "--public cloudflare --no-worker --listen 127.0.0.1:0";
    let tmux = start_tui_with(&env, args, 201, &[("TASKBRIDGE_CLOUDFLARED", fake)]);
    tmux.wait_for("(public");
    let p = tui_port(&env, Some(p));
    let tunnel = read_pid(&tools.join("tunnel.pid"));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(tunnel), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    tmux.wait_for("public URL down: the tunnel stopped");
    assert!(
        eventually(Duration::from_secs(30), || std::net::TcpStream::connect(("127.0.0.1", p))
            .is_err()),
        "the HTTP server stopped with its tunnel"
    );
    assert!(tmux.alive(), "the TUI itself keeps running");
    tmux.keys(&["q"]);
    assert!(eventually(Duration::from_secs(10), || !tmux.alive()));
}

/// The TUI as `install.sh` starts it, in its default mode (the HTTP MCP server and a worker
/// inside), with a keymap of the user's own: a new task from the dialog, then every steering key
/// on it, each checked in the database, and `q` while it runs.
#[test]
fn the_default_tui_runs_tasks_and_every_key_reaches_the_queue() {
    let env = Env::new();
    // The user's keymap: `x` cancels (as well as `c`).
    let keymap_dir = env.oc_home.join(".config/taskbridge");
    std::fs::create_dir_all(&keymap_dir).unwrap();
    std::fs::write(keymap_dir.join("keymap.toml"), "[normal]\n\"x\" = \"cancel-task\"\n").unwrap();
    // A stand-in agent: it writes a file, says so, and waits for `go` (or fails on request).
    let agent = script(
        env.dir.path(),
        "agent",
        "prompt=$(cat)\n\
         case \"$prompt\" in *fail-me*) exit 3;; esac\n\
         echo \"$OPENCODE_CONFIG_CONTENT\" > bridge.json\n\
         echo 'work in progress' > wip.txt\n\
         echo '{\"type\":\"text\",\"sessionID\":\"s\",\"part\":{\"type\":\"text\",\"text\":\"halfway there\"}}'\n\
         for i in $(seq 1 60); do echo \"{\\\"type\\\":\\\"text\\\",\\\"part\\\":{\\\"text\\\":\\\"line $i\\\"}}\"; done\n\
         while [ ! -e go ]; do sleep 0.05; done\n",
    );
    let agent = agent.to_str().unwrap();
    let tmux = start_tui_with(
        &env,
        "--listen 127.0.0.1:0 --concurrency 1 --claude-bridge",
        130,
        &[("TASKBRIDGE_OPENCODE", agent), ("TASKBRIDGE_OPENCODE_MODE", "run")],
    );
    tmux.wait_for("No tasks. Press n");
    // The HTTP server runs inside.
    let p = tui_port(&env, None);
    // It asks for the home's token, like `serve`.
    assert_eq!(post(p, &format!("127.0.0.1:{p}"), Some(&env.token())), 200);
    assert_eq!(post(p, &format!("127.0.0.1:{p}"), None), 401);
    for wrong in near_misses(&env.token()) {
        assert_eq!(post(p, &format!("127.0.0.1:{p}"), Some(&wrong)), 401, "{wrong}");
    }

    // n: the dialog starts with the TUI's directory as the repository.
    tmux.keys(&["n"]);
    tmux.wait_for(&env.repo.display().to_string());
    tmux.text("write the work file");
    tmux.keys(&["C-s"]);
    tmux.wait_for("task 1 submitted");
    let t = env.wait_status(1, "running", Duration::from_secs(30));
    assert_eq!(t["repo"], env.repo.display().to_string());
    assert_eq!(t["prompt"], "write the work file");
    let wt = env.worktree(1);
    assert!(eventually(Duration::from_secs(30), || wt.join("wip.txt").exists()));
    let bridge = std::fs::read_to_string(wt.join("bridge.json")).unwrap();
    assert!(bridge.contains("claude-mcp"), "--claude-bridge on tui: {bridge}");

    // + and - change the priority.
    tmux.keys(&["+"]);
    assert!(eventually(Duration::from_secs(30), || env.show(1)["priority"] == 1));
    tmux.keys(&["-", "-"]);
    assert!(eventually(Duration::from_secs(30), || env.show(1)["priority"] == -1));
    // N adds a note.
    tmux.keys(&["N"]);
    tmux.wait_for("Note for task 1");
    tmux.text("mind the tabs");
    tmux.keys(&["C-s"]);
    assert!(
        eventually(Duration::from_secs(30), || env.show(1)["notes"][0]["note"] == "mind the tabs")
    );
    // l: the live log; / searches it; F follows again; Esc goes back to the queue.
    tmux.keys(&["l"]);
    tmux.wait_for("agent: line 60");
    tmux.keys(&["k"]);
    tmux.wait_for("(scrolled; F follows)");
    tmux.keys(&["F"]);
    tmux.wait_for("(following)");
    tmux.keys(&["/"]);
    tmux.text("halfway");
    tmux.keys(&["C-s"]);
    tmux.wait_for("/halfway");
    // d: the running task's diff, from its worktree.
    tmux.keys(&["d"]);
    tmux.wait_for("+work in progress");
    tmux.keys(&["Escape"]);
    // f: the filter cycles; an empty view says so.
    tmux.keys(&["f", "f"]);
    tmux.wait_for("filter: blocked");
    tmux.wait_for("No blocked tasks (1 in all)");
    for _ in 0..6 {
        tmux.keys(&["f"]);
    }
    tmux.wait_for("filter: all");

    // r retries a failed task.
    let failing = env.submit(&["fail-me now", "--max-attempts", "1"]);
    // The worker is busy with task 1 (concurrency 1); release it so the failing one runs.
    std::fs::write(wt.join("go"), "").unwrap();
    env.wait_status(1, "done", Duration::from_secs(30));
    env.wait_status(failing, "failed", Duration::from_secs(30));
    tmux.wait_for("failed");
    tmux.keys(&["g"]);
    tmux.keys(&["r"]);
    tmux.wait_for(&format!("task {failing} queued again"));
    env.wait_status(failing, "failed", Duration::from_secs(30));
    assert_eq!(env.show(failing)["attempts"], 1, "retried: a fresh count of attempts");

    // x (the user's own binding) cancels, after asking.
    let slow = env.submit(&["one more"]);
    env.wait_status(slow, "running", Duration::from_secs(30));
    tmux.wait_for("running");
    tmux.keys(&["g", "x"]);
    tmux.wait_for(&format!("Cancel task {slow}?"));
    tmux.keys(&["n"]);
    assert_eq!(env.show(slow)["status"], "running", "n keeps it");

    // q with a task running asks, and the task goes back to the queue.
    tmux.keys(&["q"]);
    tmux.wait_for("are running in this TUI's worker. Quit?");
    tmux.keys(&["y"]);
    assert!(eventually(Duration::from_secs(15), || !tmux.alive()), "the TUI exited");
    let t = env.show(slow);
    assert_eq!(t["status"], "queued", "released, not lost: {t:#}");
    assert_eq!(t["attempts"], 0, "a shutdown does not use an attempt");
}

/// A native question (OpenCode's own `question` tool, on a warm `opencode serve`) answered by
/// picking its second option from the list: the agent's blocked tool call gets the label.
#[test]
fn the_tui_answers_a_native_question_by_picking_an_option() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::tool(
            "question",
            serde_json::json!({"questions": [{
                "question": "Which colour should the banner be?",
                "header": "Banner colour",
                "options": [
                    {"label": "red", "description": "Warm and loud"},
                    {"label": "blue", "description": "Calm"},
                ],
            }]}),
        ),
        Turn::tool(
            "question",
            serde_json::json!({"questions": [{
                "question": "Which sizes should it come in?",
                "header": "Banner sizes",
                "multiple": true,
                "options": [
                    {"label": "small", "description": "for phones"},
                    {"label": "medium", "description": "for tablets"},
                    {"label": "large", "description": "for screens"},
                ],
            }]}),
        ),
        Turn::text(
            "Done.\n```taskbridge-result\n{\"summary\": \"Picked.\", \"tests_run\": []}\n```",
        ),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Add a banner", "--title", "banner task"]);
    let _worker = env.start_worker_with(1, &["--opencode", "serve"]);
    env.wait_status(id, "waiting", Duration::from_secs(120));

    let tmux = start_tui(&env, "--no-http --no-worker", 120);
    tmux.wait_for("banner task");
    tmux.keys(&["Q"]);
    let screen = tmux.wait_for("Which colour should the banner be?");
    assert!(screen.contains("- blue: Calm"), "the pane lists the options:\n{screen}");
    tmux.keys(&["a"]);
    let screen = tmux.wait_for("Banner colour");
    assert!(screen.contains("> red"), "the first option is highlighted:\n{screen}");
    assert!(screen.contains("Type my own answer"), "free text is offered:\n{screen}");
    tmux.keys(&["j"]);
    tmux.wait_for("> blue");
    tmux.keys(&["Enter"]);
    tmux.wait_for("answered");
    // Then a question where several may be picked: space picks and unpicks, Enter sends them.
    env.wait_task(id, Duration::from_secs(120), |t| {
        t["question"].as_str().is_some_and(|q| q.contains("Which sizes"))
    });
    tmux.wait_for("Which sizes should it come in?");
    tmux.keys(&["a"]);
    let screen = tmux.wait_for("Banner sizes");
    assert!(screen.contains("[ ] small"), "several may be picked:\n{screen}");
    tmux.keys(&["Space", "j"]);
    tmux.wait_for("[x] small");
    tmux.keys(&["Space"]);
    tmux.wait_for("[x] medium");
    tmux.keys(&["Space"]);
    tmux.wait_for("[ ] medium");
    tmux.keys(&["j", "Space"]);
    tmux.wait_for("[x] large");
    tmux.keys(&["Enter"]);
    let t = env.wait_status(id, "done", Duration::from_secs(120));
    assert_eq!(t["questions"][0]["answer"], "blue");
    assert_eq!(t["questions"][0]["answered_by"], "tui");
    assert_eq!(t["questions"][1]["answer"], "small, large");
    let sent: Vec<String> = mock
        .requests()
        .iter()
        .map(|r| r["messages"].as_array().unwrap().last().unwrap().to_string())
        .collect();
    assert!(sent.iter().any(|m| m.contains("tool_result") && m.contains("blue")), "{sent:?}");
    let sizes = sent.last().unwrap();
    assert!(
        sizes.contains("small") && sizes.contains("large") && !sizes.contains("medium"),
        "{sizes}"
    );
}

/// A plan seen and brought home from the keyboard: `p` draws the stacked task under its
/// dependency, `m` then `y` merges it into the checked-out main.
#[test]
fn the_plan_view_shows_a_stacked_task_and_m_merges_it() {
    let env = Env::new();
    let done = |s: &str| {
        Turn::text(format!(
            "Done.\n```taskbridge-result\n{{\"summary\": \"{s}\", \"tests_run\": []}}\n```"
        ))
    };
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo parser > parser.txt"),
        done("Parser."),
        Turn::bash("echo tests > tests.txt"),
        done("Tests."),
    ]);
    let env = env.with_mock(&mock);
    let a = env.submit(&["Add a parser", "--title", "parser step"]);
    let b = env.submit(&["Test it", "--title", "tests step", "--after", &a.to_string()]);
    let _worker = env.start_worker(1);
    env.wait_status(b, "done", Duration::from_secs(120));

    let tmux = start_tui(&env, "--no-http --no-worker", 120);
    tmux.wait_for("tests step");
    // The newest task is selected first: task 2.
    tmux.keys(&["p"]);
    let screen = tmux.wait_for("then #2");
    assert!(screen.contains("#1 done") && screen.contains("parser step"), "{screen}");
    tmux.keys(&["m"]);
    tmux.wait_for(&format!("Merge task {b}"));
    tmux.keys(&["y"]);
    tmux.wait_for("merged into main");
    assert_eq!(std::fs::read_to_string(env.repo.join("tests.txt")).unwrap(), "tests\n");
    assert_eq!(env.show(a)["merged_into"], "main", "the dependency came with it");
}

/// A done task's detail has what `get` has (files, tests, commit); a task made with `n` is
/// selected once submitted; a question's detail lists what each option means.
#[test]
fn the_detail_shows_a_done_tasks_work_and_a_new_task_is_selected() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo greeting > hello.txt && sh test.sh"),
        Turn::text(
            "Done.\n```taskbridge-result\n{\"summary\": \"Greeted.\", \"tests_run\": [\"sh test.sh\"]}\n```",
        ),
        Turn::tool(
            "question",
            serde_json::json!({"questions": [{
                "question": "Which greeting?",
                "header": "Greeting",
                "options": [
                    {"label": "hello", "description": "the usual one"},
                    {"label": "hi", "description": "a short one"},
                ],
            }]}),
        ),
    ]);
    let env = env.with_mock(&mock);
    let first = env.submit(&["Greet", "--title", "greeting task"]);
    let tmux = start_tui(&env, "--listen 127.0.0.1:0 --concurrency 1", 130);
    let t = env.wait_status(first, "done", Duration::from_secs(120));
    let commit = t["result"]["commit"].as_str().unwrap()[..12].to_owned();
    tmux.wait_for("greeting task");
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("Files touched");
    assert!(screen.contains("hello.txt"), "{screen}");
    assert!(screen.contains("Tests run") && screen.contains("sh test.sh  exit 0"), "{screen}");
    assert!(screen.contains(&format!("commit {commit}")), "{screen}");

    tmux.keys(&["Escape", "n"]);
    tmux.wait_for(&env.repo.display().to_string());
    tmux.text("Ask which greeting");
    tmux.keys(&["C-s"]);
    tmux.wait_for("task 2 submitted");
    env.wait_status(2, "waiting", Duration::from_secs(120));
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("Which greeting?");
    assert!(screen.contains("#2 "), "the new task is the one selected:\n{screen}");
    assert!(screen.contains("- hello: the usual one"), "{screen}");
    assert!(screen.contains("- hi: a short one"), "{screen}");
    // `e` in the answer dialog: an answer of one's own, in the editor. (The queue's rows are
    // read apart from the detail: wait until they too say the task waits.)
    tmux.wait_for("run 0 wait 1");
    tmux.keys(&["a"]);
    tmux.wait_for("> hello");
    tmux.keys(&["e"]);
    tmux.wait_for("(Ctrl-S sends, Esc cancels)");
    tmux.text("howdy, partner");
    tmux.keys(&["C-s"]);
    tmux.wait_for("answered");
    let t = env.wait_task(2, Duration::from_secs(120), |t| t["status"] != "waiting");
    assert_eq!(t["questions"][0]["answer"], "howdy, partner", "{t:#}");
    let reached = || mock.requests().iter().any(|r| r["messages"].to_string().contains("howdy"));
    assert!(eventually(Duration::from_secs(60), reached), "the answer never reached the agent");
    // The terminal goes away (tmux killed: a hangup): the TUI's worker takes its OpenCode
    // server down with it.
    let server = server_pid(&env).expect("the TUI's worker ran a warm OpenCode server");
    drop(tmux);
    assert!(
        eventually(Duration::from_secs(30), || !pid_alive(server)),
        "the OpenCode server outlived the TUI's terminal; the TUI's log:\n{}",
        std::fs::read_to_string(env.home.join("logs/taskbridge.log")).unwrap_or_default()
    );
}

#[test]
fn diff_on_a_terminal_is_coloured_and_paged_and_plain_into_a_pipe() {
    let env = Env::new();
    // A stand-in agent whose change is longer than the screen, so the pager has to page.
    let agent = script(
        env.dir.path(),
        "agent",
        "cat > /dev/null\nseq 1 200 | sed 's/^/line /' > long.txt\n",
    );
    let id = env.submit(&["Write a long file"]);
    env.run_queue_with(&agent, &[]);
    assert_eq!(env.show(id)["status"], "done", "{}", env.log(id));
    // No PAGER set: git's own choice, less with colours; `q` leaves it.
    let bin = bin().display().to_string();
    let tmux = start_in_tmux(
        &env,
        &format!("unset PAGER LESS; '{bin}' diff {id}; echo diff-exited-$?; sleep 60"),
        100,
        &[],
    );
    let screen = tmux.wait_for("+line 1");
    assert!(!screen.contains("+line 200"), "the whole diff at once, no pager: {screen}");
    let coloured =
        String::from_utf8_lossy(&tmux.cmd(&["capture-pane", "-p", "-e", "-t", "tb"]).stdout)
            .into_owned();
    assert!(coloured.contains("\x1b[32m+line 1"), "additions are not green: {coloured:?}");
    tmux.keys(&["q"]);
    tmux.wait_for("diff-exited-0");
    // Into a pipe: plain text, all of it.
    let piped = env.ok(&["diff", &id.to_string()]);
    assert!(piped.contains("+line 200") && !piped.contains('\x1b'), "{piped}");
}

/// `--keymap FILE` replaces keys (here `x` opens the help, `?` is unbound) and the help screen
/// and footer say so; `G`, PageUp and PageDown move through a queue longer than the screen; `u`
/// follows a done task up in its session.
#[test]
fn a_keymap_file_moving_through_a_long_queue_and_a_followup_from_the_keyboard() {
    let env = Env::new();
    // A stand-in that reports a session, as OpenCode's event stream does: a follow-up needs one.
    let agent = script(
        env.dir.path(),
        "agent",
        "cat > /dev/null\necho one > one.txt\n\
         echo '{\"type\":\"text\",\"sessionID\":\"ses_1\",\"part\":{\"type\":\"text\",\"text\":\"ok\"}}'\n",
    );
    let first = env.submit(&["The first task", "--title", "first task"]);
    env.run_queue_with(&agent, &[]);
    let commit = env.show(first)["result"]["commit"].as_str().unwrap().to_owned();
    for i in 2..=40 {
        env.submit(&[&format!("Queued task {i}"), "--title", &format!("queued {i}")]);
    }
    let keymap = env.dir.path().join("my-keys.toml");
    std::fs::write(&keymap, "[normal]\n\"x\" = \"toggle-help\"\n\"?\" = \"none\"\n").unwrap();
    let tmux =
        start_tui(&env, &format!("--no-http --no-worker --keymap '{}'", keymap.display()), 120);
    let screen = tmux.wait_for("queued 40");
    assert!(screen.contains("x help") && !screen.contains("? help"), "the footer:\n{screen}");
    tmux.keys(&["x"]);
    let help = tmux.wait_for("Help: keys from the keymap");
    let line = help.lines().find(|l| l.contains("Help") && !l.contains("keys from")).unwrap();
    assert!(line.contains("x ") && !line.contains('?'), "help lists the file's key: {line}");
    tmux.keys(&["Escape"]);

    // The newest task is selected first; in the queue (Esc goes back to it from the detail), G
    // goes to the oldest, at the bottom.
    tmux.keys(&["Enter"]);
    tmux.wait_for("#40 queued  priority");
    tmux.keys(&["Escape", "G"]);
    tmux.wait_for("#1 done  priority");
    // A page up is a screenful of rows above: a queued task, more than one row up.
    tmux.keys(&["PPage"]);
    let mut screen = String::new();
    let paged_up = eventually(Duration::from_secs(20), || {
        screen = tmux.screen();
        ["#1 ", "#2 "].iter().all(|id| !screen.contains(&format!("{id}queued  priority")))
            && !screen.contains("#1 done")
            && screen.contains(" queued  priority")
    });
    assert!(paged_up, "PageUp did not go up a page:\n{screen}");
    tmux.keys(&["NPage"]);
    tmux.wait_for("#1 done  priority");

    tmux.keys(&["u"]);
    tmux.wait_for("Follow up task 1 in its session");
    tmux.text("Now a second file");
    tmux.keys(&["C-s"]);
    tmux.wait_for("task 41: follows up task 1 in its session");
    let t = env.show(41);
    assert_eq!(t["prompt"], "Now a second file");
    assert_eq!(t["base"], commit, "the follow-up starts from the first task's commit");
}

/// The stats view (`s`) draws the tasks that ran: how many finished, what they spent, how long
/// they waited and ran, per agent, and why the failed one failed.
#[test]
fn the_stats_view_charts_the_tasks_that_ran() {
    let env = Env::new();
    // OpenCode in run mode, as a stand-in: it reports one step that cost 42 cents, and fails the
    // task that asks it to.
    let step = r#"{"type":"step_finish","sessionID":"ses_S","part":{"reason":"stop","tokens":{"input":100,"output":20,"reasoning":0,"cache":{"write":0,"read":0}},"cost":0.42}}"#;
    let agent = script(
        env.dir.path(),
        "agent",
        &format!(
            "p=$(cat)\ncase \"$p\" in *FAILME*) echo boom >&2; exit 3;; esac\necho '{step}'\n"
        ),
    );
    for prompt in ["one", "two", "three"] {
        env.submit(&[prompt]);
    }
    let failing = env.submit(&["FAILME please", "--max-attempts", "1"]);
    env.run_queue_with(&agent, &[]);
    assert_eq!(env.show(failing)["status"], "failed");

    let tmux = start_tui(&env, "--no-http --no-worker", 140);
    tmux.wait_for("FAILME");
    tmux.keys(&["s"]);
    let screen = tmux.wait_for("Tasks finished per 10 minutes: 4 in 24 h");
    assert!(screen.contains("Spend per hour (cents, UTC): $1.26 in 24 h"), "{screen}");
    // The hour's bar carries its value: three tasks at 42 cents.
    assert!(screen.contains("126"), "{screen}");
    let agents = screen.lines().find(|l| l.contains("opencode")).unwrap();
    assert!(agents.contains("3 / 1 / 0"), "{agents}");
    let exit = screen.lines().find(|l| l.contains("exit ")).unwrap_or_default();
    assert!(
        exit.trim_end_matches(['│', ' ']).ends_with('1'),
        "one failure of kind exit:\n{screen}"
    );
    for line in ["queue wait  p50", "run time    p50"] {
        assert!(screen.contains(line), "{line}:\n{screen}");
    }
    // The sparkline draws the last ten minutes as a bar at the right edge.
    let spark = screen.lines().skip_while(|l| !l.contains("Tasks finished")).nth(1).unwrap();
    assert!(spark.chars().any(|c| "▁▂▃▄▅▆▇█".contains(c)), "{spark}");
    // s closes it, as Esc does.
    tmux.keys(&["s"]);
    let mut screen = String::new();
    assert!(eventually(Duration::from_secs(10), || {
        screen = tmux.screen();
        !screen.contains("Tasks finished per 10 minutes")
    }));
    assert!(screen.contains("FAILME"), "{screen}");
}

/// A question the agent asks in its answer (the prompt-level block) with options: the task that
/// starts waiting is announced and selected, `a` offers its options as a picker, the detail
/// pane keeps the question's lines apart, the log says the question once; and Esc typed at once
/// with `l` is the two keys, not Alt-l.
#[test]
fn a_question_in_the_agents_answer_is_announced_selected_and_answered_from_a_picker() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::text(
            "Done.\n```taskbridge-result\n{\"summary\": \"First.\", \"tests_run\": []}\n```",
        ),
        Turn::text(
            "I need a decision.\n```taskbridge-question\n{\"question\": \"Red or blue?\", \
             \"options\": [\"red\", \"blue\"]}\n```",
        ),
        Turn::text(
            "Done.\n```taskbridge-result\n{\"summary\": \"Blue it is.\", \"tests_run\": []}\n```",
        ),
    ]);
    let env = env.with_mock(&mock);
    let first = env.submit(&["Say done", "--title", "first task"]);
    let tmux = start_tui(&env, "--no-http --no-worker", 140);
    let _worker = env.start_worker_with(1, &["--opencode", "serve"]);
    env.wait_status(first, "done", Duration::from_secs(120));
    tmux.wait_for("first task");
    let id = env.submit(&["Pick a colour", "--title", "colour task"]);
    let screen = tmux.wait_for(&format!("#{id} is waiting: Red or blue? (a answers)"));
    assert!(!screen.contains("?Options"), "{screen}");
    tmux.keys(&["a"]);
    let screen = tmux.wait_for("> red");
    assert!(screen.contains("Type my own answer"), "free text is offered:\n{screen}");
    tmux.keys(&["j"]);
    tmux.wait_for("> blue");
    tmux.keys(&["Enter"]);
    let t = env.wait_status(id, "done", Duration::from_secs(120));
    assert_eq!(t["questions"][0]["answer"], "blue");
    assert_eq!(env.log(id).matches("the agent asks").count(), 1, "{}", env.log(id));
    // The answered question in the detail pane: its options on a line of their own.
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("A: blue");
    assert!(screen.contains("Q: Red or blue?"), "{screen}");
    assert!(screen.contains("Options: red | blue") && !screen.contains("?Options"), "{screen}");
    // Esc and l at once: the log opens, as `l` alone does.
    tmux.keys_at_once(&["Escape", "l"]);
    tmux.wait_for("attempt 1 of");
}

/// `e` edits a queued task's prompt; `S` opens a shell in a task's worktree and `D` its diff
/// in the editor, and the TUI comes back as it was after each.
#[test]
fn e_edits_a_queued_prompt_and_s_and_d_step_out_to_a_shell_and_the_editor() {
    let env = Env::new();
    let wt = env.worktree(1);
    let mock = MockAnthropic::spawn(vec![
        Turn::tool("write", serde_json::json!({"filePath": wt.join("x.txt"), "content": "x\n"})),
        Turn::text(
            "Done.\n```taskbridge-result\n{\"summary\": \"Wrote x.\", \"tests_run\": []}\n```",
        ),
    ]);
    let env = env.with_mock(&mock);
    let first = env.submit(&["Write x", "--title", "with a diff", "--keep-worktree"]);
    {
        let _worker = env.start_worker_with(1, &["--opencode", "serve"]);
        env.wait_status(first, "done", Duration::from_secs(120));
    }
    env.ok(&["pause"]);
    let queued = env.submit(&["Say ORIGINAL", "--title", "edit me"]);
    let copied = env.dir.path().join("seen.diff");
    let editor = script(env.dir.path(), "editor", &format!("cp \"$1\" '{}'", copied.display()));
    let extra = [("SHELL", "/bin/sh"), ("EDITOR", editor.to_str().unwrap())];
    let tmux = start_tui_with(&env, "--no-http --no-worker", 140, &extra);
    tmux.wait_for("edit me");
    let select = |title: &str| {
        tmux.keys(&["g"]);
        for _ in 0..5 {
            if tmux.screen().contains(&format!("Detail: {title}")) {
                return;
            }
            tmux.keys(&["j"]);
        }
        panic!("'{title}' never selected:\n{}", tmux.screen());
    };
    select("edit me");
    tmux.keys(&["e"]);
    tmux.wait_for("Say ORIGINAL");
    tmux.text(" PLUS");
    tmux.keys(&["C-s"]);
    tmux.wait_for(&format!("task {queued}: prompt changed"));
    assert_eq!(env.show(queued)["prompt"], "Say ORIGINAL PLUS");

    select("with a diff");
    tmux.keys(&["S"]);
    let out = env.dir.path().join("pwd.txt");
    tmux.text(&format!("pwd > '{}'; exit", out.display()));
    tmux.keys(&["Enter"]);
    tmux.wait_for("back from /bin/sh");
    let pwd = std::fs::read_to_string(&out).unwrap();
    assert_eq!(pwd.trim(), env.show(first)["worktree"].as_str().unwrap());
    tmux.wait_for("with a diff");

    tmux.keys(&["D"]);
    tmux.wait_for("back from");
    let diff = std::fs::read_to_string(&copied).unwrap();
    assert!(diff.contains("+++ b/x.txt"), "{diff}");
    let screen = tmux.wait_for("edit me");
    assert!(screen.contains("with a diff"), "the queue is drawn again:\n{screen}");
}
