//! Git, through libgit2: resolving a submitted repository, per-task worktrees on their own branch,
//! committing the agent's work, and the diff Claude gets back. A branch or worktree that holds
//! work is never deleted here.

use crate::error::{Error, Result};
use git2::{
    BranchType, Delta, Diff, DiffFindOptions, DiffFormat, DiffOptions, IndexAddOption, Oid,
    Repository, Signature, StatusOptions, WorktreeAddOptions, WorktreePruneOptions,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A repository as a task records it: its top level and the commit the task starts from.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedRepo {
    pub toplevel: PathBuf,
    pub base: String,
}

/// Finds the repository containing `path` and resolves `reference` (default `HEAD`) to a commit.
pub fn resolve_repo(path: &Path, reference: Option<&str>) -> Result<ResolvedRepo> {
    if !path.exists() {
        return Err(Error::Repo(format!("'{}' does not exist", path.display())));
    }
    let repo = Repository::discover(path).map_err(|_| {
        Error::Repo(format!(
            "'{}' is not inside a git repository; run `git init` there (and commit) or pass \
             another repo",
            path.display()
        ))
    })?;
    let toplevel = repo.workdir().ok_or_else(|| {
        Error::Repo(format!("'{}' is a bare repository; tasks need a working tree", path.display()))
    })?;
    let toplevel = toplevel.canonicalize().unwrap_or_else(|_| toplevel.to_path_buf());
    let reference = reference.unwrap_or("HEAD");
    let commit =
        repo.revparse_single(reference).and_then(|o| o.peel_to_commit()).map_err(|_| {
            if reference == "HEAD" && repo.head().is_err() {
                Error::Repo(format!(
                    "the repository at '{}' has no commits yet; commit something first, since \
                     a task starts from a commit",
                    toplevel.display()
                ))
            } else {
                Error::Repo(format!(
                    "unknown ref '{reference}' in '{}'; use a branch, tag or commit that exists",
                    toplevel.display()
                ))
            }
        })?;
    Ok(ResolvedRepo { toplevel, base: commit.id().to_string() })
}

pub fn branch_name(task_id: i64) -> String {
    format!("taskbridge/task-{task_id}")
}

fn worktree_name(task_id: i64) -> String {
    // libgit2 refuses '/' in worktree names (dependencies.md §3).
    format!("taskbridge-task-{task_id}")
}

/// Creates (or reuses, on a retry or resume) the task's worktree at `dir` on branch
/// `taskbridge/task-<id>`, starting from `base`.
pub fn prepare_worktree(repo_path: &Path, base: &str, task_id: i64, dir: &Path) -> Result<String> {
    let branch = branch_name(task_id);
    if dir.join(".git").exists() {
        let wt = Repository::open(dir)?;
        let head = wt.head()?;
        if head.shorthand().ok() == Some(branch.as_str()) {
            return Ok(branch);
        }
        return Err(Error::Repo(format!(
            "'{}' exists but is not on branch {branch}; move it away",
            dir.display()
        )));
    }
    let repo = Repository::open(repo_path)?;
    let name = worktree_name(task_id);
    // A stale registration (its directory was deleted by hand) would make `worktree` fail.
    if let Ok(old) = repo.find_worktree(&name)
        && old.validate().is_err()
    {
        old.prune(Some(WorktreePruneOptions::new().working_tree(true)))?;
    }
    let reference = match repo.find_branch(&branch, BranchType::Local) {
        Ok(b) => b.into_reference(),
        Err(_) => {
            let commit = repo.find_commit(Oid::from_str(base)?)?;
            repo.branch(&branch, &commit, false)?.into_reference()
        }
    };
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
    }
    repo.worktree(&name, dir, Some(WorktreeAddOptions::new().reference(Some(&reference))))?;
    Ok(branch)
}

/// Removes a worktree whose work is committed; the branch stays.
pub fn remove_worktree(repo_path: &Path, task_id: i64, dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .map_err(|e| Error::io(format!("removing worktree {}", dir.display()), e))?;
    }
    let repo = Repository::open(repo_path)?;
    if let Ok(wt) = repo.find_worktree(&worktree_name(task_id)) {
        wt.prune(Some(WorktreePruneOptions::new().valid(true).working_tree(true)))?;
    }
    Ok(())
}

fn signature(repo: &Repository) -> Result<Signature<'static>> {
    match repo.signature() {
        Ok(sig) => Ok(sig.to_owned()),
        Err(_) => Ok(Signature::now("TaskBridge", "taskbridge@localhost")?),
    }
}

/// Commits everything in the worktree (new, changed and deleted files; ignored files stay out)
/// on its branch. Returns the new commit, or `None` when there was nothing to commit.
pub fn commit_all(worktree: &Path, message: &str) -> Result<Option<String>> {
    let repo = Repository::open(worktree)?;
    let mut index = repo.index()?;
    index.add_all(["*"], IndexAddOption::DEFAULT, None)?;
    index.update_all(["*"], None)?;
    index.write()?;
    let tree_id = index.write_tree()?;
    let head = repo.head()?.peel_to_commit()?;
    if head.tree_id() == tree_id {
        return Ok(None);
    }
    let tree = repo.find_tree(tree_id)?;
    let sig = signature(&repo)?;
    let oid = repo.commit(Some("HEAD"), &sig, &sig, message, &tree, &[&head])?;
    Ok(Some(oid.to_string()))
}

/// Puts the worktree back to its HEAD commit, deleting untracked files, and returns the paths
/// that had changed. Used for read-only tasks.
pub fn revert_all(worktree: &Path) -> Result<Vec<String>> {
    let repo = Repository::open(worktree)?;
    let mut opts = StatusOptions::new();
    opts.include_untracked(true).recurse_untracked_dirs(true).include_ignored(false);
    let changed: Vec<String> = repo
        .statuses(Some(&mut opts))?
        .iter()
        .filter_map(|s| s.path().ok().map(str::to_owned))
        .collect();
    if changed.is_empty() {
        return Ok(changed);
    }
    let mut checkout = git2::build::CheckoutBuilder::new();
    checkout.force().remove_untracked(true);
    repo.checkout_head(Some(&mut checkout))?;
    Ok(changed)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileTouched {
    pub path: String,
    /// `added`, `modified`, `deleted`, `renamed`, `copied` or `typechange`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub old_path: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DiffStat {
    pub files: usize,
    pub insertions: usize,
    pub deletions: usize,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkDiff {
    pub files: Vec<FileTouched>,
    pub patch: String,
    pub stat: DiffStat,
}

/// Everything that differs between `base` and the worktree as it is on disk: commits the agent
/// made, staged and unstaged edits, and untracked files (not ignored ones), with renames found.
pub fn diff_against_base(worktree: &Path, base: &str) -> Result<WorkDiff> {
    let repo = Repository::open(worktree)?;
    let base_tree = repo.find_commit(Oid::from_str(base)?)?.tree()?;
    let mut opts = DiffOptions::new();
    opts.include_untracked(true).recurse_untracked_dirs(true).show_untracked_content(true);
    let mut diff = repo.diff_tree_to_workdir_with_index(Some(&base_tree), Some(&mut opts))?;
    diff.find_similar(Some(DiffFindOptions::new().renames(true).for_untracked(true)))?;
    render(&diff)
}

fn render(diff: &Diff<'_>) -> Result<WorkDiff> {
    let mut files = Vec::new();
    for delta in diff.deltas() {
        let status = match delta.status() {
            Delta::Added | Delta::Untracked => "added",
            Delta::Deleted => "deleted",
            Delta::Renamed => "renamed",
            Delta::Copied => "copied",
            Delta::Typechange => "typechange",
            _ => "modified",
        };
        let path_of = |f: git2::DiffFile<'_>| f.path().map(|p| p.to_string_lossy().into_owned());
        let new_path = path_of(delta.new_file());
        let old_path = path_of(delta.old_file());
        let path = new_path.clone().or_else(|| old_path.clone()).unwrap_or_default();
        let old_path = if matches!(status, "renamed" | "copied") { old_path } else { None };
        files.push(FileTouched { path, status: status.to_owned(), old_path });
    }
    let mut patch = Vec::new();
    diff.print(DiffFormat::Patch, |_, _, line| {
        if matches!(line.origin(), '+' | '-' | ' ') {
            patch.push(line.origin() as u8);
        }
        patch.extend_from_slice(line.content());
        true
    })?;
    let stats = diff.stats()?;
    Ok(WorkDiff {
        files,
        patch: String::from_utf8_lossy(&patch).into_owned(),
        stat: DiffStat {
            files: stats.files_changed(),
            insertions: stats.insertions(),
            deletions: stats.deletions(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    pub(crate) fn git(dir: &Path, args: &[&str]) {
        let ok = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }

    fn repo() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        git(d.path(), &["init", "-q", "-b", "main"]);
        std::fs::write(d.path().join("a.txt"), "one\ntwo\n").unwrap();
        std::fs::write(d.path().join("gone.txt"), "bye\n").unwrap();
        std::fs::write(
            d.path().join("old.txt"),
            "a file long enough to be recognised as renamed\n".repeat(5),
        )
        .unwrap();
        git(d.path(), &["add", "."]);
        git(d.path(), &["commit", "-qm", "init"]);
        d
    }

    #[test]
    fn resolve_refuses_what_is_not_a_repository_or_ref() {
        let plain = tempfile::tempdir().unwrap();
        let err = resolve_repo(plain.path(), None).unwrap_err().to_string();
        assert!(err.contains("is not inside a git repository"), "{err}");
        let err = resolve_repo(&plain.path().join("nope"), None).unwrap_err().to_string();
        assert!(err.contains("does not exist"), "{err}");
        git(plain.path(), &["init", "-q"]);
        let err = resolve_repo(plain.path(), None).unwrap_err().to_string();
        assert!(err.contains("has no commits yet"), "{err}");
        let r = repo();
        let err = resolve_repo(r.path(), Some("no-such-branch")).unwrap_err().to_string();
        assert!(err.contains("unknown ref 'no-such-branch'"), "{err}");
        let sub = r.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let ok = resolve_repo(&sub, Some("main")).unwrap();
        assert_eq!(ok.toplevel, r.path().canonicalize().unwrap());
        assert_eq!(ok.base.len(), 40);
    }

    #[test]
    fn worktree_diff_commit_and_removal_keep_the_branch() {
        let r = repo();
        let base = resolve_repo(r.path(), None).unwrap().base;
        let wt_root = tempfile::tempdir().unwrap();
        let wt = wt_root.path().join("task-1");
        let branch = prepare_worktree(r.path(), &base, 1, &wt).unwrap();
        assert_eq!(branch, "taskbridge/task-1");
        // Reusing it is fine.
        prepare_worktree(r.path(), &base, 1, &wt).unwrap();

        std::fs::write(wt.join("a.txt"), "one\nTWO\n").unwrap();
        std::fs::write(wt.join("new.txt"), "fresh\n").unwrap();
        std::fs::remove_file(wt.join("gone.txt")).unwrap();
        std::fs::rename(wt.join("old.txt"), wt.join("moved.txt")).unwrap();
        let d = diff_against_base(&wt, &base).unwrap();
        let mut got: Vec<(String, String)> =
            d.files.iter().map(|f| (f.path.clone(), f.status.clone())).collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                ("a.txt".into(), "modified".into()),
                ("gone.txt".into(), "deleted".into()),
                ("moved.txt".into(), "renamed".into()),
                ("new.txt".into(), "added".into()),
            ]
        );
        assert!(d.patch.contains("-two\n+TWO\n"), "{}", d.patch);
        assert!(d.patch.contains("+fresh"), "untracked content is in the patch");

        let commit = commit_all(&wt, "task 1").unwrap().unwrap();
        assert_eq!(commit_all(&wt, "again").unwrap(), None, "nothing left to commit");
        let after = diff_against_base(&wt, &base).unwrap();
        assert_eq!(after.stat, d.stat, "the committed diff is the same diff");
        remove_worktree(r.path(), 1, &wt).unwrap();
        assert!(!wt.exists());
        let repo = Repository::open(r.path()).unwrap();
        let b = repo.find_branch("taskbridge/task-1", BranchType::Local).unwrap();
        assert_eq!(b.get().target().unwrap().to_string(), commit);
        // The main checkout is untouched.
        assert_eq!(std::fs::read_to_string(r.path().join("a.txt")).unwrap(), "one\ntwo\n");
    }

    #[test]
    fn revert_all_lists_and_undoes_every_change() {
        let r = repo();
        let base = resolve_repo(r.path(), None).unwrap().base;
        let wt_root = tempfile::tempdir().unwrap();
        let wt = wt_root.path().join("task-2");
        prepare_worktree(r.path(), &base, 2, &wt).unwrap();
        std::fs::write(wt.join("a.txt"), "changed\n").unwrap();
        std::fs::write(wt.join("junk.txt"), "junk\n").unwrap();
        let mut reverted = revert_all(&wt).unwrap();
        reverted.sort();
        assert_eq!(reverted, vec!["a.txt".to_string(), "junk.txt".to_string()]);
        assert!(diff_against_base(&wt, &base).unwrap().files.is_empty());
    }
}
