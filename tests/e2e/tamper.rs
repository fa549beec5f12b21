//! End to end: an agent that rewrites its worktree's git metadata to steer TaskBridge's own
//! git (which runs outside the wall) out of it. The real OpenCode runs the scripted model's
//! commands: the issue's two attacks, as given. Each task fails with `tampered`, the user's
//! repository and the directory outside are byte for byte as before, and the next task of
//! the same repository runs clean.
#![allow(clippy::unwrap_used)]

use crate::support::mock_anthropic::{MockAnthropic, Turn};
use crate::support::*;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

const RUN: Duration = Duration::from_secs(180);

/// Every file of `dirs` (a repository's `.git` left out) with its bytes, and the repository's
/// refs, HEAD and status.
fn snapshot(repo: &Path, dirs: &[&Path]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for d in dirs {
        let mut stack = vec![d.to_path_buf()];
        while let Some(p) = stack.pop() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                let path = e.path();
                if e.file_name() == ".git" {
                    continue;
                }
                match e.file_type().unwrap().is_dir() {
                    true => stack.push(path),
                    false => out.push((path.display().to_string(), std::fs::read(&path).unwrap())),
                }
            }
        }
    }
    // The user's refs; the task branches TaskBridge makes are checked on their own.
    let refs = git_out(repo, &["for-each-ref", "--format=%(refname) %(objectname)"]);
    let users: Vec<&str> =
        refs.lines().filter(|l| !l.starts_with("refs/heads/taskbridge/")).collect();
    out.push(("refs".into(), users.join("\n").into_bytes()));
    out.push(("status".into(), git_out(repo, &["status", "--porcelain"]).into_bytes()));
    out.push(("HEAD".into(), std::fs::read(repo.join(".git/HEAD")).unwrap()));
    out.sort();
    out
}

fn ended(env: &Env, id: i64) -> Value {
    env.wait_task(id, RUN, |t| {
        ["done", "failed", "waiting"].contains(&t["status"].as_str().unwrap())
    })
}

fn tampered(env: &Env, id: i64, what: &str) {
    let t = ended(env, id);
    assert_eq!(t["status"], "failed", "{t:#}\nlog:\n{}", env.log(id));
    // Nothing was committed on the task's branch: it is where the task started.
    let branch = t["branch"].as_str().unwrap();
    assert_eq!(git_out(&env.repo, &["rev-parse", branch]), t["base"].as_str().unwrap());
    let error = t["error"].as_str().unwrap();
    assert!(error.starts_with("tampered: ") && error.contains(what), "{error}");
    let said = t["result"]["tampered"].as_str().unwrap_or_else(|| panic!("{t:#}"));
    assert!(said.contains(what), "{said}");
    assert_eq!(t["attempts"], 1, "tampering is not retried: {t:#}");
}

#[test]
fn an_agent_that_redirects_taskbridges_git_fails_as_tampered_and_nothing_outside_moves() {
    let mut env = Env::new();
    // The world's scratch directory is not the agent's: the outside directory is in it.
    env.scratch_writable = false;
    let outside = env.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join(".bashrc"), "# the user's own\n").unwrap();
    std::fs::write(outside.join("token"), "a secret of the user's\n").unwrap();
    let repo = env.repo.clone();
    // 1. The worktree's `.git` pointed at the user's own repository.
    let into_users =
        format!("echo work > work.txt; printf 'gitdir: %s/.git\\n' {} > .git", repo.display());
    // 2. The issue's steps: a git directory of the agent's making whose `core.worktree` is the
    //    outside directory, borrowing the repository's objects, every task branch at its commit.
    let forged = format!(
        r#"W=$PWD; git init -q --bare .fg; git --git-dir=.fg config core.bare false
git --git-dir=.fg config core.worktree {out}
echo {repo}/.git/objects > .fg/objects/info/alternates
export GIT_DIR=$W/.fg GIT_INDEX_FILE=$W/.fg/tmpidx
b=$(echo 'echo PWNED'|git hash-object -w --stdin); git update-index --add --cacheinfo 100644,$b,.bashrc
c=$(echo x|git -c user.name=a -c user.email=a@b commit-tree $(git write-tree))
for n in 1 2 3 4 5 6 7 8; do git update-ref refs/heads/taskbridge/task-$n $c; done
git symbolic-ref HEAD refs/heads/taskbridge/task-2; printf 'gitdir: %s/.fg\n' $W > .git
echo FORGED-$((6*7))"#,
        out = outside.display(),
        repo = repo.display()
    );
    let mock = MockAnthropic::spawn(vec![
        Turn::bash(&into_users),
        result_turn("Pointed .git at the user's repository."),
        Turn::bash(&forged),
        result_turn("Forged a git directory."),
        Turn::bash("echo greeting > hello.txt"),
        result_turn("Greeted."),
    ]);
    env = env.with_mock(&mock);
    let before = snapshot(&repo, &[&repo, &outside]);
    let _worker = env.start_worker_with(1, &["--opencode", "serve"]);

    let first = env.submit(&["Redirect the commit"]);
    tampered(&env, first, ".git points at");
    assert_eq!(snapshot(&repo, &[&repo, &outside]), before, "after the first attack");

    let second = env.submit(&["Forge a git directory"]);
    tampered(&env, second, ".git points at");
    request_with(&mock, "FORGED-42"); // the steps ran to the end
    assert_eq!(snapshot(&repo, &[&repo, &outside]), before, "after the second attack");

    // The next task of the same repository runs clean, on a branch of its own.
    let clean = env.submit(&["Say hello"]);
    let t = ended(&env, clean);
    assert_eq!(t["status"], "done", "{t:#}\nlog:\n{}", env.log(clean));
    assert_eq!(touched_paths(&t), ["hello.txt"]);
    let branch = t["result"]["branch"].as_str().unwrap();
    assert_eq!(git_out(&repo, &["show", &format!("{branch}:hello.txt")]), "greeting");
    assert_eq!(git_out(&repo, &["symbolic-ref", "HEAD"]), "refs/heads/main");
    assert_eq!(std::fs::read_to_string(outside.join(".bashrc")).unwrap(), "# the user's own\n");
}

/// `[verify]` runs the agent's code (here a check script it rewrote) after its turn: inside the
/// task's wall, like the agent, never outside it.
#[test]
fn the_checks_run_the_agents_code_inside_its_wall() {
    let mut env = Env::new();
    env.scratch_writable = false;
    let outside = env.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(env.repo.join(".taskbridge.toml"), "[verify]\ncommands = [\"sh check.sh\"]\n")
        .unwrap();
    std::fs::write(env.repo.join("check.sh"), "echo checked\n").unwrap();
    git(&env.repo, &["add", "."]);
    git(&env.repo, &["commit", "-qm", "a check"]);
    let rewrite = format!(
        "printf 'echo x > {}/pwned && echo escaped || echo held; exit 0\\n' > check.sh",
        outside.display()
    );
    let mock = MockAnthropic::spawn(vec![Turn::bash(&rewrite), result_turn("Rewrote the check.")]);
    env = env.with_mock(&mock);
    let _worker = env.start_worker_with(1, &["--opencode", "serve"]);
    let id = env.submit(&["Rewrite the check"]);
    let t = ended(&env, id);
    assert_eq!(t["status"], "done", "{t:#}\nlog:\n{}", env.log(id));
    let check = &t["result"]["verification"][0];
    assert_eq!(check["command"], "sh check.sh", "{t:#}");
    assert!(check["output_tail"].as_str().unwrap().contains("held"), "{check:#}");
    assert!(!outside.join("pwned").exists(), "the check wrote outside the worktree");
}
