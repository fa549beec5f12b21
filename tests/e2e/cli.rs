//! The command line, as a user types it: each verb on a real home and repository, bad input
//! refused on stderr with a non-zero exit, and the `--json` forms.
#![allow(clippy::unwrap_used)]

use crate::support::*;
use serde_json::Value;

fn stderr_of(env: &Env, args: &[&str]) -> String {
    let out = env.run(args);
    assert!(!out.status.success(), "taskbridge {args:?} should fail");
    assert!(out.stdout.is_empty(), "errors go to stderr only");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn submit_list_show_and_the_json_forms() {
    // The model named below is checked against what the pinned OpenCode offers: the mock's
    // config gives it the anthropic provider, whatever is on this machine's PATH.
    let mock = crate::support::mock_anthropic::MockAnthropic::spawn(vec![]);
    let env = Env::new().with_mock(&mock);
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
    child.stdin.take().unwrap().write_all(b"From stdin\nwith two lines\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3");
    assert_eq!(env.show(3)["prompt"], "From stdin\nwith two lines", "the final newline is dropped");
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

#[test]
fn every_operation_answers_to_its_one_name_and_its_earlier_spellings() {
    let env = Env::new();
    let a = env.submit(&["first", "--worktree-keep"]);
    let b = env.submit(&["second", "--depends-on", &a.to_string(), "--keep-worktree"]);
    let c = env.submit(&["third", "--after", &b.to_string()]);
    assert_eq!(env.show(b)["depends_on"], serde_json::json!([a]));
    assert_eq!(env.show(c)["depends_on"], serde_json::json!([b]));
    assert_eq!(env.show(b)["worktree_keep"], true);
    let id = a.to_string();
    for verb in ["add-note", "note", "add-task-note"] {
        env.ok(&[verb, &id, verb]);
    }
    let notes: Vec<String> = env.show(a)["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["note"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(notes, ["add-note", "note", "add-task-note"]);
    for (verb, p) in [("set-priority", "-7"), ("priority", "8"), ("set-task-priority", "9")] {
        assert!(env.ok(&[verb, &id, p]).contains(&format!("priority {p}")), "{verb}");
    }
    for verb in ["get", "show", "get-task"] {
        assert!(env.ok(&[verb, &id]).contains("task 1: first"), "{verb}");
    }
    for verb in ["queue-status", "status"] {
        let st: serde_json::Value = serde_json::from_str(&env.ok(&[verb, "--json"])).unwrap();
        assert_eq!(st["counts"]["queued"], 1, "{verb}");
    }
    for verb in ["list-workers", "workers", "worker-heartbeat"] {
        assert!(env.ok(&[verb]).contains("no workers have run"), "{verb}");
    }
    for verb in ["cancel", "cancel-task"] {
        env.ok(&[verb, &c.to_string()]);
        env.ok(&["retry", &c.to_string()]);
    }
    env.ok(&["cancel", &c.to_string()]);
    assert!(env.ok(&["clear-finished"]).contains("cleared 1 task"));
    env.ok(&["cancel", &b.to_string()]);
    assert!(env.ok(&["clear"]).contains("cleared 1 task"));
}

#[test]
fn submit_help_describes_every_argument() {
    let env = Env::new();
    let help = env.ok(&["submit", "--help"]);
    for arg in [
        "<PROMPT>",
        "--title",
        "--readonly",
        "--no-network",
        "--no-shell",
        "--worktree-keep",
        "--depends-on",
        "--json",
    ] {
        let lines: Vec<&str> = help.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.trim_start().starts_with(arg))
            .unwrap_or_else(|| panic!("{arg} is not in the help:\n{help}"));
        // Clap puts the description after the argument, or on the next line when it is long.
        let same =
            lines[at].trim_start()[arg.len()..].split_whitespace().filter(|w| !w.starts_with('<'));
        let next =
            lines.get(at + 1).filter(|l| !l.trim_start().starts_with('-')).copied().unwrap_or("");
        let words = same.count() + next.split_whitespace().count();
        let line = format!("{}\n{next}", lines[at]);
        assert!(words >= 3, "{arg} has no description: '{line}'");
    }
}

#[test]
fn submit_says_when_no_worker_is_alive_to_run_the_task() {
    let env = Env::new();
    let out = env.run(&["submit", "x"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no worker is running") && err.contains("taskbridge worker"), "{err}");

    // With a worker alive, nothing to warn about. The worker has no OpenCode, so its task
    // fails at once; that does not matter here.
    let _worker = env.start_worker(1);
    assert!(eventually(std::time::Duration::from_secs(20), || {
        env.ok(&["list-workers"]).contains("alive")
    }));
    let out = env.run(&["submit", "y"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "no warning with a worker alive");
}

/// Runs `taskbridge ARGS`, reads `keep` bytes of its output and closes the pipe.
fn read_then_close(env: &Env, args: &[&str], keep: usize) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    let mut child = env
        .cmd()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = vec![0u8; keep];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The read end is closed here, as `head` closes it.
    let out = child.wait_with_output().unwrap();
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_closed_stdout_ends_every_printing_command_quietly() {
    let env = Env::new();
    env.submit(&["x"]);
    // Enough output to overflow a pipe's buffer, so the writer meets the closed end.
    let store = queue::Store::open(env.home.join("taskbridge.db")).unwrap();
    let base = env.show(1)["base"].as_str().unwrap().to_owned();
    let repo = env.repo.display().to_string();
    let specs: Vec<queue::TaskSpec> = (0..1500)
        .map(|i| {
            queue::TaskSpec::new(
                format!("task {i} {}", "p".repeat(150_000 * (i == 0) as usize)),
                &repo,
                &base,
            )
        })
        .collect();
    store.submit_batch(specs).unwrap();
    std::fs::write(env.home.join("logs/2.log"), "a log line\n".repeat(30_000)).unwrap();
    for args in [
        vec!["list", "--limit", "1600"],
        vec!["list", "--limit", "1600", "--json"],
        vec!["show", "2", "--json"],
        vec!["logs", "2", "--max-bytes", "300000"],
    ] {
        let (status, stderr) = read_then_close(&env, &args, 10);
        assert!(status.success(), "{args:?}: {status:?} {stderr}");
        assert_eq!(stderr, "", "{args:?} printed on stderr");
    }
}

#[test]
fn ask_rules_come_from_the_flag_and_from_the_repositorys_taskbridge_toml() {
    let env = Env::new();
    std::fs::write(
        env.repo.join(".taskbridge.toml"),
        "[permissions]\nask = [\"external_directory\"]\n",
    )
    .unwrap();
    // Read from the commit the task starts from, so it is committed first.
    git(&env.repo, &["add", ".taskbridge.toml"]);
    git(&env.repo, &["commit", "-qm", "ask rules"]);
    let id = env.submit(&["Deploy", "--ask", "bash:git push*"]);
    let t = env.show(id);
    assert_eq!(t["ask_rules"], serde_json::json!(["bash:git push*", "external_directory"]));
    let shown = env.ok(&["show", &id.to_string()]);
    assert!(shown.contains("asks:      bash:git push*, external_directory"), "{shown}");
    // A rule that names no permission is refused before anything is stored, saying which.
    let out = env.run(&["submit", "x", "--ask", "shell:rm*"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("'shell:rm*' names no permission") && err.contains("bash"), "{err}");
    let out = env.run(&["submit", "x", "--max-cost-usd", "-2"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_cost_usd"));
    let listed: Value = serde_json::from_str(&env.ok(&["list", "--json"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "nothing refused was stored");
}

/// The flags a user reaches for less often, each through the binary: `worker --model`,
/// `list --repo`, `logs --offset`/`--max-bytes`, `clear-finished --statuses`.
#[test]
fn worker_model_list_repo_logs_offset_and_clear_statuses_do_what_they_say() {
    let env = Env::new();
    let other = env.dir.path().join("other");
    repo_with_one_commit(&other);
    let calls = env.dir.path().join("calls.log");
    let agent = script(
        env.dir.path(),
        "agent",
        &format!("cat > /dev/null\necho \"$@\" >> '{}'\necho hi > out.txt\n", calls.display()),
    );
    let here = env.submit(&["Work here"]);
    let there = env.submit(&["Work there", "--repo", other.to_str().unwrap()]);
    // The flag wins over TASKBRIDGE_MODEL, which every command of this world sets.
    env.run_queue_with(&agent, &["--model", "anthropic/from-the-worker-flag"]);
    let argv = std::fs::read_to_string(&calls).unwrap();
    assert_eq!(argv.matches("-m anthropic/from-the-worker-flag").count(), 2, "{argv}");

    let ids = |args: &[&str]| -> Vec<i64> {
        let list: Value = serde_json::from_str(&env.ok(args)).unwrap();
        list.as_array().unwrap().iter().map(|t| t["id"].as_i64().unwrap()).collect()
    };
    assert_eq!(ids(&["list", "--json", "--repo", other.to_str().unwrap()]), [there]);
    assert_eq!(ids(&["list", "--json", "--repo", env.repo.to_str().unwrap()]), [here]);

    let whole = env.log(here);
    assert!(whole.len() > 60, "{whole}");
    let page = env.ok(&["logs", &here.to_string(), "--offset", "20", "--max-bytes", "40"]);
    assert_eq!(page.trim_end_matches('\n'), whole[20..60].trim_end_matches('\n'));

    let cancelled = env.submit(&["Never mind"]);
    env.ok(&["cancel", &cancelled.to_string()]);
    assert!(env.ok(&["clear", "--statuses", "failed"]).contains("cleared 0 task(s)"));
    assert!(env.ok(&["clear", "--statuses", "cancelled"]).contains("cleared 1 task"));
    assert_eq!(ids(&["list", "--json"]), [there, here], "only the cancelled task was cleared");
}

/// `list-models` gives the cached list within its hour; `--refresh` asks OpenCode again (here
/// after the provider was set up) and caches what it said.
#[test]
fn list_models_refresh_asks_opencode_again_instead_of_the_cache() {
    let mut env = Env::new();
    env.opencode_config = Some(r#"{"autoupdate": false, "share": "disabled"}"#.into());
    env.extra_env.push(("ANTHROPIC_API_KEY".into(), String::new()));
    let lists_model = |env: &Env, args: &[&str]| env.ok(args).lines().any(|m| m == MODEL);
    assert!(!lists_model(&env, &["list-models"]), "no provider set up, no model");
    let mock = crate::support::mock_anthropic::MockAnthropic::spawn(vec![]);
    let env = env.with_mock(&mock);
    assert!(!lists_model(&env, &["list-models"]), "within its hour the cached list is given");
    assert!(lists_model(&env, &["list-models", "--refresh"]));
    assert!(lists_model(&env, &["list-models"]), "the refreshed list is the cached one now");
}

/// `wait` returns when the tasks settle, with an exit code a script can branch on; `pause`
/// holds every claim until `resume`; `edit` changes a queued prompt (as an argument, from
/// stdin, or in $EDITOR) and refuses one that ran; `completions bash` is a script bash takes.
#[test]
fn wait_pause_resume_edit_and_completions_as_a_script_uses_them() {
    use crate::support::mock_anthropic::{MockAnthropic, Turn};
    let done = |s: &str| {
        Turn::text(format!(
            "Done.\n```taskbridge-result\n{{\"summary\": \"{s}\", \"tests_run\": []}}\n```"
        ))
    };
    let mock = MockAnthropic::spawn(vec![
        done("first"),
        Turn::text("I need input.\n```taskbridge-question\nSQLite or Postgres?\n```"),
    ]);
    let env = Env::new().with_mock(&mock);
    // Paused before any worker: a task waits, whoever is alive.
    assert!(env.ok(&["pause"]).contains("queue paused"));
    assert!(env.ok(&["pause"]).contains("already paused"));
    let status: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    assert_eq!(status["paused"], true);
    let a = env.submit(&["Say EDIT-ME"]);
    // Its prompt, changed while it waits: as an argument, then from stdin, then in the editor.
    env.ok(&["edit", &a.to_string(), "Say FIRST-EDIT", "--title", "renamed"]);
    let mut cmd = env.cmd();
    cmd.args(["edit", &a.to_string(), "-"]).stdin(std::process::Stdio::piped());
    let mut child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"Say SECOND-EDIT\n").unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    let editor =
        script(env.dir.path(), "editor", "sed -i 's/SECOND-EDIT/EDITED-IN-EDITOR/' \"$1\"");
    let out = env.cmd().args(["edit", &a.to_string()]).env("EDITOR", &editor).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(env.show(a)["prompt"], "Say EDITED-IN-EDITOR");
    assert_eq!(env.show(a)["title"], "renamed");

    let _worker = env.start_worker(1);
    let timed_out = env.run(&["wait", &a.to_string(), "--timeout", "2"]);
    assert_eq!(timed_out.status.code(), Some(124), "{timed_out:?}");
    assert_eq!(env.show(a)["status"], "queued", "nothing claimed while paused");
    assert!(env.ok(&["resume"]).contains("queue resumed"));
    let out = env.run(&["wait", &a.to_string()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("task {a}: done"));
    assert!(mock.requests()[0].to_string().contains("EDITED-IN-EDITOR"), "the agent got the edit");
    // A task that ran keeps its prompt.
    let err = stderr_of(&env, &["edit", &a.to_string(), "Say later"]);
    assert!(err.contains("edit needs a task that is queued and not yet run"), "{err}");

    // One that asks: exit code 4, with the question; one that fails: 3, and it outranks 4.
    let b = env.submit(&["Pick a database"]);
    let out = env.run(&["wait-for", &b.to_string()]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("waiting: SQLite or Postgres?"));
    // A failure outranks a question, in whichever order they are named.
    let c = env.submit(&["Never run"]);
    env.ok(&["cancel", &c.to_string()]);
    for ids in [[b, c], [c, b]] {
        let out = env.run(&["wait", &ids[0].to_string(), &ids[1].to_string()]);
        assert_eq!(out.status.code(), Some(3), "{ids:?}: {out:?}");
    }
    env.ok(&["cancel", &b.to_string()]);
    let out = env.run(&["wait", &a.to_string(), &b.to_string()]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = stderr_of(&env, &["wait", "999"]);
    assert!(err.contains("task #999 does not exist"), "{err}");

    // The completion script, sourced by the real bash, completes the verbs.
    let bash = env.ok(&["completions", "bash"]);
    let file = env.dir.path().join("taskbridge.bash");
    std::fs::write(&file, bash).unwrap();
    let probe = format!(
        "source '{}'; COMP_WORDS=(taskbridge wa); COMP_CWORD=1; COMP_LINE='taskbridge wa'; \
         COMP_POINT=13; _taskbridge taskbridge wa taskbridge; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        file.display()
    );
    let out = std::process::Command::new("bash").args(["-c", &probe]).output().unwrap();
    let words = String::from_utf8_lossy(&out.stdout);
    assert!(words.lines().any(|w| w == "wait"), "{words}{}", String::from_utf8_lossy(&out.stderr));
    for shell in ["zsh", "fish"] {
        assert!(env.ok(&["completions", shell]).contains("taskbridge"), "{shell}");
    }
}
