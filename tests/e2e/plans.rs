//! Plans that compose, end to end: dependent tasks stacked on their dependencies' work, a
//! conflict between dependencies caught before any agent runs, and `merge` bringing the work into
//! the user's branch. The real binary and the real OpenCode (warm server) against the loopback
//! mock, in real repositories.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::{MockAnthropic, Turn};
use crate::support::*;
use serde_json::{Value, json};
use std::time::Duration;

const RUN: Duration = Duration::from_secs(120);

use crate::support::{result_turn as result_block, touched_paths as files};

/// The first request the mock got for task `id` (its prompt names it).
fn first_request_of(mock: &MockAnthropic, id: i64) -> String {
    request_with(mock, &format!("# Task {id}:"))
}

#[test]
fn a_dependent_task_builds_on_its_dependency_and_merge_fast_forwards_main() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo parser > parser.txt"),
        result_block("Added the parser."),
        Turn::bash("cat parser.txt > seen.txt; echo tests > tests.txt"),
        result_block("Tested the parser."),
    ]);
    let env = env.with_mock(&mock);
    let a = env.submit(&["Add a parser", "--title", "parser"]);
    let b = env.submit(&["Write tests for the parser", "--after", &a.to_string()]);
    let _worker = env.start_worker(1);
    let ta = env.wait_status(a, "done", RUN);
    let tb = env.wait_status(b, "done", RUN);

    // B's agent saw A's file; B's branch holds both; B's result is only B's own work.
    assert_eq!(git_out(&env.repo, &["show", "taskbridge/task-2:seen.txt"]), "parser");
    assert_eq!(git_out(&env.repo, &["show", "taskbridge/task-2:parser.txt"]), "parser");
    let mut own = files(&tb);
    own.sort();
    assert_eq!(own, ["seen.txt", "tests.txt"], "{tb:#}");
    assert_eq!(tb["stacked_on"], json!([a]));
    assert_eq!(tb["started_from"], ta["result"]["commit"]);
    assert_eq!(tb["result"]["started_from"], ta["result"]["commit"]);
    assert!(!tb["result"]["diff"].as_str().unwrap().contains("parser.txt"), "A's work is not B's");
    let prompt = first_request_of(&mock, b);
    assert!(prompt.contains("What this task builds on"), "{prompt}");
    assert!(prompt.contains("Added the parser.") && prompt.contains("taskbridge/task-1"));
    assert!(prompt.contains("parser.txt"), "A's files are named: {prompt}");
    let shown = env.ok(&["show", &a.to_string()]);
    assert!(shown.contains(&format!("needed by: {b}")), "{shown}");
    assert_eq!(ta["base_ref"], "main");

    // Merge B into main, checked out and clean in the user's tree: a fast-forward that brings
    // A's work too.
    let out = env.ok(&["merge", &b.to_string()]);
    assert!(out.contains("merged into main (fast-forward"), "{out}");
    assert_eq!(std::fs::read_to_string(env.repo.join("parser.txt")).unwrap(), "parser\n");
    assert_eq!(std::fs::read_to_string(env.repo.join("tests.txt")).unwrap(), "tests\n");
    assert_eq!(git_out(&env.repo, &["status", "--porcelain"]), "", "the tree is clean");
    assert_eq!(
        git_out(&env.repo, &["rev-parse", "main"]),
        tb["result"]["commit"].as_str().unwrap()
    );
    for id in [a, b] {
        let t = env.show(id);
        assert_eq!(t["merged_into"], "main", "{t:#}");
    }
    // Again: nothing left to merge, said so.
    let again = env.run(&["merge", &b.to_string()]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already contains"));
}

#[test]
fn dependencies_that_conflict_fail_the_dependent_before_any_agent_runs() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo 'Hello from one.' > README.md"),
        result_block("One."),
        Turn::bash("echo 'Hello from two.' > README.md"),
        result_block("Two."),
    ]);
    let env = env.with_mock(&mock);
    let one = env.submit(&["Greet one way"]);
    let two = env.submit(&["Greet another way"]);
    let c = env.submit(&["Use both", "--after", &one.to_string(), "--after", &two.to_string()]);
    let _worker = env.start_worker(1);
    env.wait_status(one, "done", RUN);
    env.wait_status(two, "done", RUN);
    let t = env.wait_status(c, "failed", RUN);
    let error = t["error"].as_str().unwrap();
    for part in
        [format!("#{one}"), format!("#{two}"), "README.md".to_owned(), "no agent ran".into()]
    {
        assert!(error.contains(&part), "'{part}' missing from: {error}");
    }
    assert_eq!(mock.requests().len(), 4, "no request was made for the dependent task");
    assert!(mock.requests().iter().all(|r| !r["messages"].to_string().contains("Use both")));
}

#[test]
fn merge_refuses_a_dirty_tree_reports_a_conflict_squashes_and_warns_of_overlaps() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo 'Hello from the task.' > README.md"),
        result_block("Reworded the README."),
        Turn::bash("echo 'Another README.' > README.md; echo notes > notes.txt"),
        result_block("Rewrote the README and added notes."),
    ]);
    let env = env.with_mock(&mock);
    let a = env.submit(&["Reword the README"]);
    let b = env.submit(&["Rewrite the README"]);
    let _worker = env.start_worker(1);
    env.wait_status(a, "done", RUN);
    env.wait_status(b, "done", RUN);

    // They touch the same file: each result warns of the other.
    let r: Value = serde_json::from_str(&env.ok(&["show", &a.to_string(), "--json"])).unwrap();
    let overlaps = r["overlaps"].as_array().unwrap();
    assert_eq!(overlaps.len(), 1, "{r:#}");
    assert_eq!(overlaps[0]["task_id"], b);
    assert_eq!(overlaps[0]["paths"], json!(["README.md"]));

    // A dirty checked-out main: refused, naming the path; nothing changed.
    let main_before = git_out(&env.repo, &["rev-parse", "main"]);
    std::fs::write(env.repo.join("test.sh"), "#!/bin/sh\necho changed\n").unwrap();
    let out = env.run(&["merge", &a.to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("uncommitted changes to test.sh"), "{err}");
    assert_eq!(git_out(&env.repo, &["rev-parse", "main"]), main_before);
    git(&env.repo, &["checkout", "--", "test.sh"]);

    // A merges (main moved on meanwhile, so a merge commit); then B conflicts with it.
    std::fs::write(env.repo.join("other.txt"), "other\n").unwrap();
    git(&env.repo, &["add", "other.txt"]);
    git(&env.repo, &["commit", "-qm", "meanwhile"]);
    let out = env.ok(&["merge", &a.to_string()]);
    assert!(out.contains("(merge,"), "{out}");
    assert_eq!(
        std::fs::read_to_string(env.repo.join("README.md")).unwrap(),
        "Hello from the task.\n"
    );
    let merged = git_out(&env.repo, &["log", "-1", "--format=%s%n%P", "main"]);
    assert!(merged.contains(&format!("merge task {a}: Reword the README")), "{merged}");
    assert_eq!(merged.lines().nth(1).unwrap().split(' ').count(), 2, "a merge commit");
    let main_before = git_out(&env.repo, &["rev-parse", "main"]);
    let out = env.run(&["merge", &b.to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("conflicts in README.md") && err.contains("nothing was changed"), "{err}");
    assert_eq!(git_out(&env.repo, &["rev-parse", "main"]), main_before);
    assert_eq!(git_out(&env.repo, &["status", "--porcelain"]), "");

    // Into another branch, squashed: one commit with one parent.
    git(&env.repo, &["branch", "side", &main_before]);
    git(&env.repo, &["branch", "clean-base", "taskbridge/task-1~1"]);
    // Over MCP, with the official Python SDK.
    let out = python_mcp_call(
        &env,
        "merge_task",
        json!({"task_id": b, "into": "clean-base", "squash": true}),
    );
    assert_eq!(out["how"], "squash", "{out:#}");
    assert_eq!(out["into"], "clean-base");
    let parents = git_out(&env.repo, &["log", "-1", "--format=%P", "clean-base"]);
    assert_eq!(parents.split(' ').count(), 1, "one squashed commit");
    assert_eq!(git_out(&env.repo, &["show", "clean-base:notes.txt"]), "notes");
    assert_eq!(env.show(b)["merged_into"], "clean-base");
}

fn commit_config(env: &Env) {
    git(&env.repo, &["add", ".taskbridge.toml"]);
    git(&env.repo, &["commit", "-qm", "checks"]);
}

#[test]
fn a_failing_check_goes_back_to_the_agent_until_it_passes_or_the_rounds_run_out() {
    let env = Env::new();
    std::fs::write(
        env.repo.join(".taskbridge.toml"),
        "[verify]\ncommands = [\"echo checking; test -f fixed.txt\"]\nrounds = 2\n",
    )
    .unwrap();
    // Checks come from the commit a task starts from.
    commit_config(&env);
    let mock = MockAnthropic::spawn(vec![
        result_block("Claimed done without the fix."),
        Turn::bash("echo ok > fixed.txt"),
        result_block("Fixed it."),
    ]);
    let env = env.with_mock(&mock);
    let id = env.submit(&["Make the check pass"]);
    let _worker = env.start_worker(1);
    let t = env.wait_status(id, "done", RUN);
    let v = t["result"]["verification"].as_array().unwrap();
    assert_eq!(v.len(), 2, "{t:#}");
    assert_eq!((v[0]["round"].as_u64(), v[0]["exit_code"].as_i64()), (Some(1), Some(1)));
    assert_eq!((v[1]["round"].as_u64(), v[1]["exit_code"].as_i64()), (Some(2), Some(0)));
    assert!(v[0]["output_tail"].as_str().unwrap().contains("checking"));
    assert_eq!(t["result"]["verified"], true);
    assert_eq!(t["result"]["summary"], "Fixed it.");
    // The failure went back in the same session, as a new turn with the check's output.
    let sent = mock.requests()[1]["messages"].to_string();
    assert!(sent.contains("verification failed") && sent.contains("test -f fixed.txt"), "{sent}");
    assert!(sent.contains("Make the check pass"), "the same session: {sent}");

    // A check that never passes fails the task once the rounds are used.
    std::fs::write(
        env.repo.join(".taskbridge.toml"),
        "[verify]\ncommands = [\"echo nope; false\"]\nrounds = 1\n",
    )
    .unwrap();
    // Checks come from the commit a task starts from.
    commit_config(&env);
    mock.push([result_block("Done, I think."), result_block("Still done, I think.")]);
    let id = env.submit(&["Pass an impossible check"]);
    let t = env.wait_status(id, "failed", RUN);
    let error = t["error"].as_str().unwrap();
    assert!(
        error.contains("verification failed after the agent's work and its one round of fixes")
            && error.contains("its output ends:\nnope"),
        "{error}"
    );
    assert_eq!(t["result"]["verified"], false);
    let log = env.log(id);
    assert!(log.contains("(fix round 1 of 1)"), "{log}");

    // A silent check says so instead of an empty tail.
    std::fs::write(
        env.repo.join(".taskbridge.toml"),
        "[verify]\ncommands = [\"false\"]\nrounds = 0\n",
    )
    .unwrap();
    // Checks come from the commit a task starts from.
    commit_config(&env);
    mock.push([result_block("Done.")]);
    let id = env.submit(&["Pass a silent check"]);
    let error = env.wait_status(id, "failed", RUN)["error"].as_str().unwrap().to_owned();
    assert!(error.ends_with("`false` exited 1; it printed nothing"), "{error}");
}

#[test]
fn a_followup_resumes_the_parents_session_on_a_new_branch_with_only_the_new_change() {
    let env = Env::new();
    let mock = MockAnthropic::spawn(vec![
        Turn::bash("echo v1 > feature.txt"),
        result_block("Added the feature."),
        Turn::bash("echo docs > docs.txt"),
        result_block("Documented the feature."),
        Turn::bash("echo more >> docs.txt"),
        result_block("Extended the docs."),
    ]);
    let env = env.with_mock(&mock);
    let a = env.submit(&["Add the feature"]);
    let _worker = env.start_worker(1);
    let ta = env.wait_status(a, "done", RUN);
    // Over MCP, then a follow-up of the follow-up from the CLI.
    let b =
        python_mcp_call(&env, "followup_task", json!({"task_id": a, "prompt": "Now document it"}));
    let b = b["task_id"].as_i64().unwrap();
    let tb = env.wait_status(b, "done", RUN);
    let c: i64 =
        env.ok(&["followup", &b.to_string(), "Say more in the docs"]).trim().parse().unwrap();
    let tc = env.wait_status(c, "done", RUN);

    assert_eq!(tb["parent"], a);
    assert_eq!(tb["session_id"], ta["session_id"], "the same session: {}", env.log(b));
    assert_eq!(tc["session_id"], ta["session_id"]);
    assert_eq!(files(&tb), ["docs.txt"], "only the new change: {tb:#}");
    assert_eq!(tb["result"]["started_from"], ta["result"]["commit"]);
    assert_ne!(tb["branch"], ta["branch"], "its own branch");
    assert_eq!(
        git_out(&env.repo, &["show", &format!("{}:docs.txt", tc["branch"].as_str().unwrap())]),
        "docs\nmore"
    );
    // The agent kept the conversation: the follow-up's request carries the first task's.
    let reqs = mock.requests();
    let first_of_b = reqs
        .iter()
        .map(|r| r["messages"].to_string())
        .find(|m| m.contains("Now document it"))
        .unwrap();
    assert!(first_of_b.contains("Add the feature"), "{first_of_b}");
    assert!(first_of_b.contains("echo v1 > feature.txt"), "the earlier tool call is in context");
    let shown = env.ok(&["show", &a.to_string()]);
    assert!(shown.contains(&format!("followups: {b}")), "{shown}");
    // A running or queued task cannot be followed up.
    let out = env.run(&["followup", "999", "x"]);
    assert!(!out.status.success());
}

#[test]
fn merge_into_a_branch_checked_out_in_a_linked_worktree_waits_for_it_to_be_clean() {
    let env = Env::new();
    let agent = script(env.dir.path(), "agent", "cat > /dev/null\necho new > feature.txt\n");
    let id = env.submit(&["Add the feature file"]).to_string();
    env.run_queue_with(&agent, &[]);
    // The user's own linked worktree, on branch `side`, with work of theirs not committed.
    let side = env.dir.path().join("side");
    git(&env.repo, &["worktree", "add", "-q", "-b", "side", side.to_str().unwrap()]);
    std::fs::write(side.join("README.md"), "my unsaved edit\n").unwrap();
    let before = git_out(&env.repo, &["rev-parse", "side"]);
    let refused = env.run(&["merge", &id, "--into", "side"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "merged under uncommitted changes");
    assert!(err.contains("README.md") && err.contains(side.to_str().unwrap()), "{err}");
    assert_eq!(git_out(&env.repo, &["rev-parse", "side"]), before, "the branch moved");
    assert_eq!(std::fs::read_to_string(side.join("README.md")).unwrap(), "my unsaved edit\n");
    assert!(!side.join("feature.txt").exists());
    // Clean, the merge goes through and the linked worktree shows it, as `git merge` would.
    git(&side, &["checkout", "--", "README.md"]);
    env.ok(&["merge", &id, "--into", "side"]);
    assert_ne!(git_out(&env.repo, &["rev-parse", "side"]), before);
    assert_eq!(std::fs::read_to_string(side.join("feature.txt")).unwrap(), "new\n");
    assert_eq!(git_out(&side, &["status", "--porcelain"]), "", "the worktree matches its branch");
}

#[test]
fn a_stacked_task_retried_after_a_failed_attempt_starts_again_from_its_dependencys_work() {
    let env = Env::new();
    let failed_once = env.dir.path().join("failed-once");
    // The dependent's first attempt fails; every other run writes its own file.
    let agent = script(
        env.dir.path(),
        "agent",
        &format!(
            "prompt=$(cat)\ncase \"$prompt\" in\n\
             *Dependent*) if [ ! -e '{f}' ]; then touch '{f}'; exit 3; fi\n\
             echo b > b.txt;;\n\
             *) echo a > a.txt;;\nesac\n",
            f = failed_once.display()
        ),
    );
    let a = env.submit(&["Base work"]);
    let b = env.submit(&["Dependent work", "--depends-on", &a.to_string(), "--max-attempts", "2"]);
    env.run_queue_with(&agent, &[]);
    assert!(failed_once.exists(), "the first attempt did not fail, so nothing was retried");
    let ta = env.show(a);
    let tb = env.show(b);
    assert_eq!(tb["status"], "done", "{tb:#}\n{}", env.log(b));
    assert_eq!(tb["attempts"], 2, "{tb:#}");
    assert_eq!(tb["started_from"], ta["result"]["commit"], "it starts from its dependency's work");
    // Its own work only: the dependency's a.txt is in the start, not in its change.
    assert_eq!(files(&tb), ["b.txt"], "only its own work: {tb:#}");
    let branch = tb["result"]["branch"].as_str().unwrap();
    assert_eq!(git_out(&env.repo, &["show", &format!("{branch}:a.txt")]), "a");
}

/// A stacked task that asks a question and is answered resumes where it was: still started from
/// its dependency's commit, and its files are only its own work (the dependency's are in its
/// start, not in its change).
#[test]
fn a_stacked_task_that_asks_and_is_answered_keeps_its_start_and_lists_only_its_own_work() {
    let env = Env::new();
    // The dependent asks first; given the answer (a resumed run), it writes its file.
    let agent = script(
        env.dir.path(),
        "agent",
        "prompt=$(cat)\ncase \"$prompt\" in\n\
         *Dependent*) printf '%s\\n' '{\"type\":\"text\",\"sessionID\":\"ses_b\",\"part\":{\"type\":\"text\",\"text\":\"```taskbridge-question\\nBlue?\\n```\"}}';;\n\
         *Blue*) echo b > b.txt;;\n\
         *) echo a > a.txt;;\nesac\n",
    );
    let a = env.submit(&["Base work"]);
    let b = env.submit(&["Dependent work", "--depends-on", &a.to_string()]);
    env.run_queue_with(&agent, &[]);
    let tb = env.show(b);
    assert_eq!(tb["status"], "waiting", "{tb:#}\n{}", env.log(b));
    env.ok(&["answer", &b.to_string(), "Blue, please"]);
    env.run_queue_with(&agent, &[]);
    let ta = env.show(a);
    let tb = env.show(b);
    assert_eq!(tb["status"], "done", "{tb:#}\n{}", env.log(b));
    assert_eq!(tb["started_from"], ta["result"]["commit"], "it starts from its dependency's work");
    assert_eq!(files(&tb), ["b.txt"], "only its own work: {tb:#}");
}
