//! Client registration as a user does it: every line `taskbridge config claude-code` prints is
//! run by a shell with the real Claude Code CLI, and `claude mcp list` must then show each server
//! connected.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::{MockAnthropic, Turn};
use crate::support::*;
use serde_json::json;
use std::path::Path;
use std::process::Command;

/// Runs `claude` (the pinned CLI) in the test's HOME with nothing of the machine's own config.
fn claude(env: &Env, shell_line: &str) -> String {
    let cli = claude_cli();
    let dir = cli.parent().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(shell_line)
        .current_dir(&env.repo)
        .envs(env.env_vars())
        // The pinned CLI first, so a `claude` installed on the machine is not the one that runs.
        .env("PATH", format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default()))
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env_remove("ANTHROPIC_API_KEY")
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "`{shell_line}` failed: {text}");
    text
}

/// The line `claude mcp list` prints for `name`.
fn listed<'a>(list: &'a str, name: &str) -> &'a str {
    list.lines().find(|l| l.starts_with(&format!("{name}:"))).unwrap_or("")
}

#[test]
fn the_printed_claude_mcp_add_lines_register_servers_that_connect() {
    let env = Env::new();
    let (_server, port) = start_serve(&env, &["--no-worker"]);
    let url = format!("http://127.0.0.1:{port}/mcp");
    let printed = env.ok(&["config", "claude-code", "--http-url", &url]);
    let commands: Vec<&str> = printed.lines().filter(|l| l.starts_with("claude mcp add")).collect();
    assert_eq!(commands.len(), 2, "one stdio and one HTTP line: {printed}");
    // The two lines register the same name; run each in turn, checking it connects.
    for line in commands {
        let added = claude(&env, line);
        assert!(added.contains("to user config"), "user scope, for every project: {added}");
        let list = claude(&env, "claude mcp list");
        let entry = listed(&list, "taskbridge");
        assert!(entry.contains("Connected"), "`{line}` gave: {list}");
        claude(&env, "claude mcp remove taskbridge -s user");
    }
}

#[test]
fn config_claude_code_write_registers_a_server_that_connects() {
    let env = Env::new();
    env.ok(&["config", "claude-code", "--write"]);
    let list = claude(&env, "claude mcp list");
    assert!(listed(&list, "taskbridge").contains("Connected"), "{list}");
}

#[test]
fn config_claude_code_says_when_taskbridge_is_registered_and_its_remove_line_makes_room() {
    let env = Env::new();
    env.ok(&["config", "claude-code", "--write"]);
    let printed = env.ok(&["config", "claude-code"]);
    assert!(printed.contains("# TaskBridge is already registered with Claude Code"), "{printed}");
    let remove = printed.lines().find(|l| l.starts_with("claude mcp remove")).unwrap();
    let add = printed.lines().find(|l| l.starts_with("claude mcp add")).unwrap();
    // As printed, in order: the remove line lets the add line through.
    claude(&env, remove);
    claude(&env, add);
    let list = claude(&env, "claude mcp list");
    assert!(listed(&list, "taskbridge").contains("Connected"), "{list}");
    claude(&env, "claude mcp remove taskbridge -s user");
    assert!(!env.ok(&["config", "claude-code"]).contains("already registered"));
}

/// The flag the README gives for `claude -p`, read from the README itself.
fn readme_allowed_tools() -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"));
    let readme = readme.unwrap();
    let at = readme.find("`--allowedTools ").expect("the README gives --allowedTools");
    readme[at + 1..].split('`').next().unwrap().to_owned()
}

#[test]
fn claude_p_calls_taskbridges_tools_with_the_flag_the_readme_gives_and_not_without() {
    let mock = MockAnthropic::spawn(vec![]);
    mock.answer_when("Ping TaskBridge", Turn::tool("mcp__taskbridge__ping", json!({})));
    let env = Env::new().with_claude(&mock);
    env.ok(&["config", "claude-code", "--write"]);
    let flag = readme_allowed_tools();
    assert_eq!(flag, "--allowedTools mcp__taskbridge");
    // What Claude Code sent back after the tool call: its result, or why it did not run.
    let tool_result = |flags: &str| -> String {
        let before = mock.requests().len();
        mock.push([Turn::text("Seen.")]);
        // The prompt first: the flag takes several values (the README says so).
        claude(&env, &format!("claude -p 'Ping TaskBridge' {flags}"));
        mock.requests()[before..]
            .iter()
            .map(|r| r["messages"].to_string())
            .find(|m| m.contains("tool_result"))
            .unwrap_or_else(|| panic!("no tool result reached the model: {:?}", mock.requests()))
    };
    let allowed = tool_result(&flag);
    assert!(allowed.contains("version") && allowed.contains("workers_alive"), "{allowed}");
    let denied = tool_result("");
    assert!(!denied.contains("workers_alive"), "the tool ran without the flag: {denied}");
}

/// OpenCode's own MCP client, given TaskBridge's HTTP server as a remote server with the token
/// header the README's entry carries, connects and its model calls TaskBridge's tools.
#[test]
fn opencodes_remote_mcp_client_connects_to_the_http_server_and_calls_its_tools() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::tool("tb_queue_status", json!({})),
        Turn::text("The queue has no tasks."),
    ]);
    let env = env.with_mock(&mock);
    let (_server, port, _) =
        start_http(env.cmd().args(["serve", "--listen", "127.0.0.1:0", "--no-worker"]));
    let token = std::fs::read_to_string(env.home.join("token")).unwrap();
    let file = env.oc_home.join(".config/opencode/opencode.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let entry = json!({"mcp": {"tb": {
        "type": "remote",
        "url": format!("http://127.0.0.1:{port}/mcp"),
        "headers": {"Authorization": format!("Bearer {}", token.trim())},
    }}});
    std::fs::write(&file, entry.to_string()).unwrap();
    let opencode = |args: &[&str]| {
        Command::new(opencode())
            .args(args)
            .envs(env.env_vars())
            .current_dir(&env.repo)
            .env("PWD", &env.repo)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let listed = opencode(&["mcp", "list"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    let line = text.lines().find(|l| l.contains("tb")).unwrap_or_default().to_owned();
    assert!(line.contains("connected"), "OpenCode did not connect to the server:\n{text}");

    // A title of its own, so OpenCode asks the model nothing but the turns scripted here.
    let ran = opencode(&["run", "-m", MODEL, "--title", "Queue", "How many tasks are queued?"]);
    let said = String::from_utf8_lossy(&ran.stdout);
    assert!(ran.status.success(), "{said}{}", String::from_utf8_lossy(&ran.stderr));
    let reqs = mock.requests();
    let turn = reqs.iter().find(|r| r["tools"].is_array()).expect("OpenCode asked the model");
    let offered = turn["tools"].to_string();
    assert!(
        offered.contains("\"tb_run_task\"") && offered.contains("\"tb_wait_for\""),
        "{offered}"
    );
    // The tool's answer (queue_status's counts) reached the model's next request.
    let answered =
        reqs.iter().map(|r| r["messages"].to_string()).find(|m| m.contains("tool_result"));
    let next = answered.expect("OpenCode gave the model the tool's answer");
    assert!(next.contains("workers_alive") && next.contains("spend_today"), "{next}");
    assert!(said.contains("The queue has no tasks."), "{said}");
}
