//! Repositories reached through a git remote, for a queue shared by several hosts: the submit
//! side makes sure a task's base can be fetched from its remote; a worker that does not have
//! the repository (or runs with `--use-remote`) works from a mirror of the remote under its own
//! home and pushes the task's branch back.
//!
//! These shell out to `git`, not libgit2, so that the user's own credentials (SSH agent,
//! credential helpers, `url.*.insteadOf`) apply exactly as on their command line; they never
//! prompt (`GIT_TERMINAL_PROMPT=0`).

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What a mirror fetches: the remote's branches (under `refs/remotes/origin/`, so that a fetch
/// never moves a branch a running task has checked out), its tags, and the bases submitters
/// pushed for tasks.
const FETCH: &[&str] = &[
    "+refs/heads/*:refs/remotes/origin/*",
    "+refs/tags/*:refs/tags/*",
    "+refs/taskbridge/*:refs/taskbridge/*",
];

/// Runs git in `dir`; the error names the command and carries git's own words.
fn git(dir: &Path, args: &[&str]) -> std::result::Result<String, String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .map_err(|e| format!("running git: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        Err(format!("`git {}` failed: {}", args.join(" "), stderr.trim()))
    }
}

/// The URL of the repository's `origin`, the default remote of a task.
pub fn origin_url(repo: &Path) -> Option<String> {
    let repo = git2::Repository::open(repo).ok()?;
    let origin = repo.find_remote("origin").ok()?;
    origin.url().ok().map(str::to_owned)
}

/// Refuses a remote that is neither a remote's name nor a URL: one that starts with `-` would be
/// read by git as an option (`--upload-pack=…` runs a command), a control character has no
/// place in either, and a `<helper>::` address (`ext::`, `fd::`) makes git run a program.
pub fn check_remote(remote: &str) -> Result<()> {
    let why = if remote.trim().is_empty() {
        "it is empty"
    } else if remote.starts_with('-') {
        "it starts with '-', which git would read as an option"
    } else if remote.chars().any(char::is_control) {
        "it contains a control character"
    } else if remote.split_once("::").is_some_and(|(helper, _)| {
        !helper.is_empty() && helper.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    }) {
        "it names a remote helper ('<helper>::…'), which makes git run a program"
    } else {
        return Ok(());
    };
    Err(Error::Repo(format!(
        "invalid remote {:?}: {why}; give a remote's name (origin) or its URL \
         (https://host/repo.git, git@host:repo.git, /path/to/repo.git)",
        remote
    )))
}

/// The ref a submitter pushes a base to when no ref of the remote contains it.
pub fn base_ref_name(base: &str) -> String {
    format!("refs/taskbridge/base/{base}")
}

/// Makes sure a worker elsewhere can fetch `base` from `remote`: fine when a ref there contains
/// it; otherwise pushes it to [`base_ref_name`]. Returns what was pushed, if anything. An
/// unreachable remote or a refused push is an error that says so, and the caller stores
/// nothing.
pub fn ensure_fetchable(repo: &Path, remote: &str, base: &str) -> Result<Option<String>> {
    let listed = git(repo, &["ls-remote", "--", remote]).map_err(|e| {
        Error::Repo(format!(
            "the remote {remote} cannot be reached, so a worker on another host could not fetch \
             this task's base: {e}; fix the remote (or pass --remote URL)"
        ))
    })?;
    let r = git2::Repository::open(repo)?;
    let base_oid = git2::Oid::from_str(base)?;
    let contained = listed.lines().filter_map(|l| l.split_whitespace().next()).any(|tip| {
        let Ok(tip) = git2::Oid::from_str(tip) else { return false };
        // A tip this repository does not have cannot contain a commit made here.
        tip == base_oid || r.graph_descendant_of(tip, base_oid).unwrap_or(false)
    });
    if contained {
        return Ok(None);
    }
    let target = base_ref_name(base);
    git(repo, &["push", "--quiet", "--", remote, &format!("{base}:{target}")]).map_err(|e| {
        Error::Repo(format!(
            "the base commit {} is on no ref of {remote}, so a worker on another host could not \
             fetch it, and pushing it to {target} failed: {e}; push the branch yourself, or \
             pass --remote with a remote you can push to",
            &base[..base.len().min(12)]
        ))
    })?;
    Ok(Some(target))
}

/// Where a worker keeps its mirror of `remote`: a bare repository under its home, named after
/// the remote so that each remote has one.
pub fn mirror_dir(mirrors: &Path, remote: &str) -> PathBuf {
    let tail: String = remote
        .trim_end_matches('/')
        .trim_end_matches(".git")
        .rsplit(['/', ':'])
        .next()
        .unwrap_or("repo")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    // FNV-1a: stable across builds and hosts, unlike std's hasher.
    let hash = remote
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    mirrors.join(format!("{tail}-{:012x}.git", hash & 0xffff_ffff_ffff))
}

/// Creates the mirror if it is missing and fetches the remote into it, so that the task's base
/// and its dependencies' branches are there.
pub fn sync_mirror(dir: &Path, remote: &str) -> Result<()> {
    if !dir.join("HEAD").exists() {
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
        }
        let parent = dir.parent().unwrap_or(Path::new("."));
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("mirror.git");
        let tmp = format!("{name}.partial");
        let _ = std::fs::remove_dir_all(parent.join(&tmp));
        git(parent, &["init", "--quiet", "--bare", &tmp]).map_err(Error::Repo)?;
        git(&parent.join(&tmp), &["remote", "add", "--", "origin", remote]).map_err(Error::Repo)?;
        // Renamed only once it is complete: a crash leaves a .partial, never a broken mirror.
        std::fs::rename(parent.join(&tmp), dir)
            .map_err(|e| Error::io(format!("creating the mirror {}", dir.display()), e))?;
    }
    let mut args = vec!["fetch", "--quiet", "--prune", "--", remote];
    args.extend_from_slice(FETCH);
    git(dir, &args).map_err(|e| Error::Repo(format!("fetching {remote} into the mirror: {e}")))?;
    Ok(())
}

/// Pushes the task's branch from the mirror to the remote, replacing an earlier attempt's.
pub fn push_branch(mirror: &Path, remote: &str, branch: &str) -> Result<()> {
    let spec = format!("+refs/heads/{branch}:refs/heads/{branch}");
    git(mirror, &["push", "--quiet", "--", remote, &spec])
        .map(|_| ())
        .map_err(|e| Error::Repo(format!("pushing {branch} to {remote}: {e}")))
}

/// Brings a task branch that was pushed by a worker elsewhere into the local repository, so that
/// it can be merged or inspected; nothing to do when the branch is already here.
pub fn fetch_branch(repo: &Path, remote: &str, branch: &str) -> Result<()> {
    let spec = format!("+refs/heads/{branch}:refs/heads/{branch}");
    git(repo, &["fetch", "--quiet", "--", remote, &spec])
        .map(|_| ())
        .map_err(|e| Error::Repo(format!("fetching {branch} from {remote}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_names_are_stable_and_distinct() {
        let m = Path::new("/h/mirrors");
        let a = mirror_dir(m, "git://127.0.0.1:9418/app.git");
        assert_eq!(a, mirror_dir(m, "git://127.0.0.1:9418/app.git"));
        assert!(a.file_name().unwrap().to_str().unwrap().starts_with("app-"));
        assert_ne!(a, mirror_dir(m, "git@example.com:team/app.git"));
    }

    #[test]
    fn a_remote_is_a_name_or_a_url_and_never_an_option_or_a_helper() {
        for ok in [
            "origin",
            "https://example.com/team/app.git",
            "git@example.com:team/app.git",
            "ssh://git@example.com:2222/app.git",
            "/srv/git/app.git",
            "file:///srv/git/app.git",
            "git://127.0.0.1:9418/app.git",
            // "::" inside an IPv6 host is no helper.
            "git@[::1]:team/app.git",
            "ssh://[::1]:2222/app.git",
        ] {
            assert!(check_remote(ok).is_ok(), "{ok} was refused");
        }
        for (bad, why) in [
            ("--upload-pack=id > /tmp/x; git-upload-pack", "option"),
            ("-uorigin", "option"),
            ("", "empty"),
            ("   ", "empty"),
            ("origin\nx", "control"),
            ("ext::sh -c touch% /tmp/pwned", "helper"),
            ("fd::17", "helper"),
            ("my-helper::address", "helper"),
        ] {
            let e = check_remote(bad).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("invalid remote"), "{bad:?}: {e}");
        }
    }

    fn sh(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// A working repository with one commit on main, and a bare remote holding it as origin.
    fn repo_and_remote(root: &Path) -> (PathBuf, String, String) {
        let work = root.join("work");
        std::fs::create_dir(&work).unwrap();
        sh(&work, &["init", "-q", "-b", "main"]);
        std::fs::write(work.join("a.txt"), "a\n").unwrap();
        sh(&work, &["add", "."]);
        sh(&work, &["commit", "-qm", "one"]);
        let remote = root.join("remote.git").display().to_string();
        sh(root, &["init", "-q", "--bare", "remote.git"]);
        sh(&work, &["remote", "add", "origin", &remote]);
        sh(&work, &["push", "-q", "origin", "main"]);
        let head = sh(&work, &["rev-parse", "HEAD"]);
        (work, remote, head)
    }

    #[test]
    fn mirror_names_keep_the_remotes_last_word_and_hash_all_of_it() {
        let m = Path::new("/h/mirrors");
        assert_eq!(
            mirror_dir(m, "git@example.com:team/my app.v2.git"),
            m.join("my_app_v2-8631832af529.git"),
            "the same in every build: workers on several hosts share the name"
        );
        let name =
            mirror_dir(m, "/srv/git/a-b_c/").file_name().unwrap().to_str().unwrap().to_owned();
        assert!(name.starts_with("a-b_c-"), "{name}");
    }

    #[test]
    fn a_base_no_ref_of_the_remote_holds_is_pushed_for_it_and_one_it_holds_is_not() {
        let root = tempfile::tempdir().unwrap();
        let (work, remote, head) = repo_and_remote(root.path());
        assert_eq!(origin_url(&work).as_deref(), Some(remote.as_str()));
        assert_eq!(origin_url(Path::new(&remote)), None, "the remote has no origin of its own");
        assert_eq!(ensure_fetchable(&work, "origin", &head).unwrap(), None, "main's tip");
        std::fs::write(work.join("b.txt"), "b\n").unwrap();
        sh(&work, &["add", "."]);
        sh(&work, &["commit", "-qm", "two"]);
        let second = sh(&work, &["rev-parse", "HEAD"]);
        sh(&work, &["push", "-q", "origin", "main"]);
        assert_eq!(ensure_fetchable(&work, "origin", &head).unwrap(), None, "an ancestor of main");
        std::fs::write(work.join("c.txt"), "c\n").unwrap();
        sh(&work, &["add", "."]);
        sh(&work, &["commit", "-qm", "local only"]);
        let local = sh(&work, &["rev-parse", "HEAD"]);
        let pushed = ensure_fetchable(&work, "origin", &local).unwrap();
        assert_eq!(pushed, Some(format!("refs/taskbridge/base/{local}")));
        let listed = sh(root.path(), &["ls-remote", &remote]);
        assert!(listed.contains(&format!("{local}\trefs/taskbridge/base/{local}")), "{listed}");
        assert!(listed.contains(&format!("{second}\trefs/heads/main")), "{listed}");
        let err = ensure_fetchable(&work, "/nowhere/at/all.git", &local).unwrap_err().to_string();
        assert!(err.contains("cannot be reached"), "{err}");
    }

    #[test]
    fn a_mirror_is_made_once_fetches_the_remote_and_pushes_a_task_branch_back() {
        let root = tempfile::tempdir().unwrap();
        let (work, remote, head) = repo_and_remote(root.path());
        let mirror = root.path().join("mirrors/remote-x.git");
        sync_mirror(&mirror, &remote).unwrap();
        assert!(mirror.join("HEAD").exists());
        assert!(!root.path().join("mirrors/remote-x.git.partial").exists());
        assert_eq!(sh(&mirror, &["rev-parse", "refs/remotes/origin/main"]), head);
        // A second sync fetches what is new, into the same mirror.
        std::fs::write(work.join("b.txt"), "b\n").unwrap();
        sh(&work, &["add", "."]);
        sh(&work, &["commit", "-qm", "two"]);
        sh(&work, &["push", "-q", "origin", "main"]);
        let second = sh(&work, &["rev-parse", "HEAD"]);
        sync_mirror(&mirror, &remote).unwrap();
        assert_eq!(sh(&mirror, &["rev-parse", "refs/remotes/origin/main"]), second);
        let err = sync_mirror(&mirror, "/nowhere/at/all.git").unwrap_err().to_string();
        assert!(err.contains("fetching /nowhere/at/all.git into the mirror"), "{err}");

        // The task's branch, made in the mirror, goes to the remote and from there to the user.
        sh(&mirror, &["branch", "taskbridge/task-1", &head]);
        push_branch(&mirror, &remote, "taskbridge/task-1").unwrap();
        assert_eq!(sh(Path::new(&remote), &["rev-parse", "refs/heads/taskbridge/task-1"]), head);
        fetch_branch(&work, "origin", "taskbridge/task-1").unwrap();
        assert_eq!(sh(&work, &["rev-parse", "refs/heads/taskbridge/task-1"]), head);
        let err = fetch_branch(&work, "origin", "no-such").unwrap_err().to_string();
        assert!(err.contains("fetching no-such from origin"), "{err}");
        let err = push_branch(&mirror, &remote, "no-such").unwrap_err().to_string();
        assert!(err.contains("pushing no-such to"), "{err}");
    }
}
