//! The TUI as a person uses it: in tmux, with keys sent and the screen read back, against a real
//! database that a real worker (running the real OpenCode against the mock) fills.
#![allow(clippy::unwrap_used)]

mod support;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;
use support::mock_anthropic::{MockAnthropic, Turn};
use support::*;

struct Tmux {
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
    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", "tb"]).stdout).into_owned()
    }
    fn keys(&self, keys: &[&str]) {
        for k in keys {
            assert!(self.cmd(&["send-keys", "-t", "tb", k]).status.success());
            std::thread::sleep(Duration::from_millis(60));
        }
    }
    fn text(&self, s: &str) {
        assert!(self.cmd(&["send-keys", "-t", "tb", "-l", s]).status.success());
    }
    fn wait_for(&self, needle: &str) -> String {
        let mut last = String::new();
        let ok = eventually(Duration::from_secs(20), || {
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
    let script = env.dir.path().join(format!("tui-{width}.sh"));
    let mut text = String::from("#!/bin/sh\n");
    let extra = extra.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    for (k, v) in env.env_vars().into_iter().chain(extra) {
        text.push_str(&format!("export {k}='{}'\n", v.replace('\'', "'\\''")));
    }
    text.push_str(&format!("cd '{}'\nexec '{}' tui {args}\n", env.repo.display(), bin().display()));
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tmux = Tmux { socket: format!("tb-test-{}-{width}", std::process::id()) };
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
    let env = Env::new();
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
        eventually(Duration::from_secs(5), || !group_alive(pgid)),
        "the agent's command was stopped"
    );
    tmux.wait_for("cancelled");

    // q quits (this TUI runs no worker, so it does not ask) and gives the terminal back.
    tmux.keys(&["q"]);
    assert!(eventually(Duration::from_secs(5), || !tmux.alive()), "the TUI exited");
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
    assert!(eventually(Duration::from_secs(5), || !tmux.alive()));
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
    assert!(screen.contains("public-token"), "{screen}");
    let token = std::fs::read_to_string(env.home.join("public-token")).unwrap();
    let token = token.trim();
    assert_eq!(post(p, host, Some(token)), 200, "the tunnel's host with the token");
    assert_eq!(post(p, host, None), 401, "no token");
    assert_eq!(post(p, "evil.example", Some(token)), 403, "another host");
    let tunnel = read_pid(&tools.join("tunnel.pid"));
    assert!(pid_alive(tunnel));
    tmux.keys(&["q"]);
    assert!(eventually(Duration::from_secs(10), || !tmux.alive()));
    assert!(
        eventually(Duration::from_secs(5), || !pid_alive(tunnel)),
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
        eventually(Duration::from_secs(5), || std::net::TcpStream::connect(("127.0.0.1", p))
            .is_err()),
        "the HTTP server stopped with its tunnel"
    );
    assert!(tmux.alive(), "the TUI itself keeps running");
    tmux.keys(&["q"]);
    assert!(eventually(Duration::from_secs(10), || !tmux.alive()));
}
