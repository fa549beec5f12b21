//! `taskbridge doctor` on a machine with nothing set up, then with everything: each missing
//! piece is a line that says the fix, and the exit code says whether anything failed.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::{MockAnthropic, Turn};
use crate::support::*;

#[test]
fn doctor_on_a_fresh_machine_names_each_missing_piece_and_its_fix() {
    let env = Env::new();
    let out = env
        .cmd()
        .arg("doctor")
        .env("TASKBRIDGE_OPENCODE", "/nonexistent/opencode")
        .env("TASKBRIDGE_CODEX", "/nonexistent/codex")
        .env_remove("TASKBRIDGE_MODEL")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "a failed check fails the command: {text}");
    let line_after = |start: &str| {
        let lines: Vec<&str> = text.lines().collect();
        let i = lines.iter().position(|l| l.starts_with(start)).unwrap_or_else(|| {
            panic!("no line starting '{start}' in:\n{text}");
        });
        format!("{}\n{}", lines[i], lines.get(i + 1).unwrap_or(&""))
    };
    assert!(line_after("FAIL  OpenCode").contains("npm install -g opencode-ai@1.18.33"), "{text}");
    assert!(line_after("warn  model: none configured").contains("set-default-model"), "{text}");
    assert!(line_after("ok    home").contains("writable"), "{text}");
    assert!(line_after("warn  Claude Code").contains("config claude-code --write"), "{text}");
    assert!(line_after("warn  worker: none alive").contains("taskbridge worker"), "{text}");
    // The other agents are optional: missing is not a warning, and says how to install it.
    assert!(
        line_after("ok    agent codex: Codex is not installed")
            .contains("npm install -g @openai/codex@0.171.0"),
        "{text}"
    );
}

#[test]
fn doctor_with_everything_set_up_passes_and_the_probe_reaches_the_model() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![Turn::text("OK")]);
    let env = env.with_mock(&mock);
    env.ok(&["set-default-model", MODEL]);
    env.ok(&["config", "claude-code", "--write"]);
    let _worker = env.start_worker(1);
    assert!(eventually(std::time::Duration::from_secs(20), || {
        env.ok(&["list-workers"]).contains("alive")
    }));
    let out = env
        .cmd()
        // A loaded machine may take longer than the 15 s a person waits by default.
        .args(["doctor", "--probe", "--probe-timeout", "300"])
        .env("TASKBRIDGE_CLAUDE", claude_cli())
        .env("TASKBRIDGE_CODEX", codex_cli())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for expected in [
        "ok    agent claude-code: Claude Code 2.1.197",
        "ok    agent codex: Codex 0.171.0",
        "ok    OpenCode 1.18.33",
        &format!("ok    model {MODEL}"),
        &format!("ok    probe: {MODEL} answered"),
        "ok    Claude Code: registered",
        "ok    worker: 1 alive",
    ] {
        assert!(text.lines().any(|l| l.starts_with(expected)), "'{expected}' missing:\n{text}");
    }
    let probes = mock
        .requests()
        .iter()
        .filter(|r| r.to_string().contains("Reply with the single word OK."))
        .count();
    assert!(probes >= 1, "the probe's prompt reached the model");
}
