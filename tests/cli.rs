//! The command line, as a user types it: each verb on a real home and repository, bad input
//! refused on stderr with a non-zero exit, and the `--json` forms.
#![allow(clippy::unwrap_used)]

mod support;

use serde_json::Value;
use support::*;

fn stderr_of(env: &Env, args: &[&str]) -> String {
    let out = env.run(args);
    assert!(!out.status.success(), "taskbridge {args:?} should fail");
    assert!(out.stdout.is_empty(), "errors go to stderr only");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn submit_list_show_and_the_json_forms() {
    let env = Env::new();
    let a = env.submit(&["Write the docs", "--title", "docs", "--priority", "-3", "--readonly"]);
    let b = env.submit(&[
        "Then the tests",
        "--after",
        &a.to_string(),
        "--model",
        "anthropic/claude-sonnet-4-5",
    ]);
    assert_eq!((a, b), (1, 2));
    let table = env.ok(&["list"]);
    assert!(table.contains("blocked") && table.contains("docs"), "{table}");
    let list: Value = serde_json::from_str(&env.ok(&["list", "--json"])).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 2);
    let blocked: Value =
        serde_json::from_str(&env.ok(&["list", "--status", "blocked", "--json"])).unwrap();
    assert_eq!(blocked[0]["id"], 2);
    let t = env.show(1);
    assert_eq!(t["priority"], -3);
    assert_eq!(t["readonly"], true);
    assert_eq!(t["repo"], env.repo.display().to_string());
    assert_eq!(t["base"].as_str().unwrap(), git_out(&env.repo, &["rev-parse", "HEAD"]));
    let t2 = env.show(2);
    assert_eq!(t2["display_status"], "blocked");
    assert_eq!(t2["waiting_on"], serde_json::json!([1]));
    let human = env.ok(&["show", "2"]);
    assert!(human.contains("after:     1 (waiting on: 1)"), "{human}");

    // A prompt from stdin, and the idempotency key.
    let mut child = env
        .cmd()
        .args(["submit", "-", "--request-id", "abc"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"From stdin\nwith two lines").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3");
    assert_eq!(env.show(3)["prompt"], "From stdin\nwith two lines");
    assert_eq!(env.submit(&["other", "--request-id", "abc"]), 3);

    let st: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    assert_eq!(st["counts"]["queued"], 2);
    assert_eq!(st["counts"]["blocked"], 1);
}

#[test]
fn steering_verbs_change_the_task() {
    let env = Env::new();
    let id = env.submit(&["x"]).to_string();
    assert!(env.ok(&["priority", &id, "42"]).contains("priority 42"));
    env.ok(&["note", &id, "mind the tabs"]);
    assert_eq!(env.show(1)["notes"][0]["note"], "mind the tabs");
    assert!(env.ok(&["cancel", &id]).contains("cancelled"));
    assert!(env.ok(&["retry", &id]).contains("queued"));
    env.ok(&["cancel", &id]);
    assert!(env.ok(&["clear"]).contains("cleared 1 task"));
    assert!(env.ok(&["list"]).contains("no tasks"));
}

#[test]
fn bad_input_is_refused_with_a_message_that_says_what_to_do() {
    let env = Env::new();
    let plain = env.dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["submit".into(), "".into()], "invalid prompt: it is empty"),
        (
            vec!["submit".into(), "x".into(), "--repo".into(), plain.display().to_string()],
            "is not inside a git repository",
        ),
        (
            vec!["submit".into(), "x".into(), "--repo".into(), "/no/such/dir".into()],
            "does not exist",
        ),
        (vec!["submit".into(), "x".into(), "--ref".into(), "v9".into()], "unknown ref 'v9'"),
        (vec!["submit".into(), "x".into(), "--after".into(), "5".into()], "task 5 does not exist"),
        (
            vec!["submit".into(), "x".into(), "--priority".into(), "500".into()],
            "500 is out of range; use an integer from -100 to 100",
        ),
        (vec!["show".into(), "9".into()], "task #9 does not exist"),
        (vec!["answer".into(), "9".into(), "yes".into()], "task #9 does not exist"),
        (vec!["list".into(), "--status".into(), "nope".into()], "unknown status 'nope'"),
        (vec!["clear".into(), "--older-than".into(), "soon".into()], "'soon' is not a duration"),
    ];
    for (args, expected) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let err = stderr_of(&env, &args);
        assert!(err.starts_with("error: "), "{err}");
        assert!(
            err.contains(expected),
            "{:?}: expected '{expected}' in '{err}'",
            &args[..args.len().min(3)]
        );
    }
    // An oversized prompt (through stdin: it is too long for one argument).
    let mut child = env
        .cmd()
        .args(["submit", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all("x".repeat(300 * 1024).as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("the limit is 262144 (256 KiB)"));

    env.submit(&["ok"]);
    let err = stderr_of(&env, &["answer", "1", "yes"]);
    assert!(err.contains("task #1 is queued; answer needs a task that is waiting"), "{err}");
    let err = stderr_of(&env, &["retry", "1"]);
    assert!(err.contains("retry needs a task that is failed or cancelled"), "{err}");
    // Nothing refused was written.
    assert_eq!(
        serde_json::from_str::<Value>(&env.ok(&["list", "--json"]))
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn home_and_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    env.submit(&["x"]);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&env.home), 0o700);
    assert_eq!(mode(&env.home.join("taskbridge.db")), 0o600);
    assert_eq!(mode(&env.home.join("logs")), 0o700);
    assert_eq!(mode(&env.home.join("logs/taskbridge.log")), 0o600);
    // --db moves the database alone.
    let db = env.dir.path().join("other.db");
    env.ok(&["--db", db.to_str().unwrap(), "submit", "y"]);
    assert_eq!(mode(&db), 0o600);
    let other: Value =
        serde_json::from_str(&env.ok(&["--db", db.to_str().unwrap(), "list", "--json"])).unwrap();
    assert_eq!(other.as_array().unwrap().len(), 1);
}

#[test]
fn a_missing_opencode_fails_the_task_with_how_to_install_it() {
    let env = Env::new();
    let id = env.submit(&["x"]);
    let mut child = env.cmd();
    child.env("TASKBRIDGE_OPENCODE", "/nonexistent/opencode").args(["worker", "--once"]);
    let out = child.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t = env.show(id);
    assert_eq!(t["status"], "failed");
    let e = t["error"].as_str().unwrap();
    assert!(e.contains("not found") && e.contains("npm install -g opencode-ai"), "{e}");
}
