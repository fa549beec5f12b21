//! A task's worktree as TaskBridge's own git sees it. The agent can write its worktree, the
//! worktree's `.git` file and its admin directory (`<common>/worktrees/<name>`), so none of
//! them may steer what TaskBridge reads or writes: a `.git` file repointed at the user's own
//! repository, or at a git directory of the agent's making with `core.worktree` set elsewhere,
//! would otherwise carry TaskBridge's commit, diff and checkout out of the wall.
//!
//! So a worktree is never opened through its `.git`. [`Checkout::open`] opens the main
//! repository by the path the task recorded (its configuration, refs and objects are the
//! user's, out of the agent's reach), sets the working directory to the worktree's recorded
//! path, and builds the index from the task's branch, never reading the agent's. HEAD is read
//! only to check it. Before any of that, the `.git` file and the admin directory are checked
//! to be as git made them, each pointing at the other, inside the repository's worktree
//! administration; anything else is [`Error::Tampered`], naming what changed.
//!
//! libgit2 runs no hooks, filters, `core.fsmonitor` or other commands, and reads no
//! configuration but the main repository's, its includes and the user's global files: nothing
//! the wall lets the agent write. The object store's `info/` (alternates) is outside the wall
//! (`crate::run::wall`).

use crate::error::{Error, Result};
use git2::{Index, IndexAddOption, Oid, Repository, RepositoryOpenFlags};
use std::path::{Path, PathBuf};

/// What a worktree's HEAD holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Head {
    /// `ref: refs/heads/<name>`.
    Branch(String),
    /// A commit (a parked spare).
    Detached(Oid),
}

/// A linked worktree of a repository, checked, and opened through the main repository.
pub struct Checkout {
    /// The main repository, its working directory set to the worktree.
    repo: Repository,
    dir: PathBuf,
    admin: PathBuf,
    head: Head,
}

fn tampered(dir: &Path, what: impl std::fmt::Display) -> Error {
    Error::Tampered(format!("the worktree {}: {what}", dir.display()))
}

/// A small text file of the admin directory, which must be a plain file (a link could make
/// TaskBridge read anything), trimmed.
fn admin_file(dir: &Path, admin: &Path, name: &str) -> Result<String> {
    let path = admin.join(name);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_file() => {}
        Ok(_) => return Err(tampered(dir, format!("{} is not a plain file", path.display()))),
        Err(e) => return Err(tampered(dir, format!("{} is unreadable: {e}", path.display()))),
    }
    std::fs::read_to_string(&path)
        .map(|t| t.trim_end().to_owned())
        .map_err(|e| tampered(dir, format!("{} is unreadable: {e}", path.display())))
}

fn canonical(p: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(p).ok()
}

/// Checks that `dir` is a linked worktree of the repository whose common git directory is
/// `common`, as git made it: a real directory whose `.git` is a plain file naming an admin
/// directory directly under `<common>/worktrees`, whose `gitdir` names `dir/.git` back and
/// whose `commondir` leads to `common`. Returns the admin directory and its HEAD.
/// `Ok(None)`: there is no worktree at `dir` at all (no `.git`).
pub fn verify(common: &Path, dir: &Path) -> Result<Option<(PathBuf, Head)>> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_dir() => {}
        Ok(_) => return Err(tampered(dir, "is no longer a directory (a link or a file)")),
        Err(_) => return Ok(None),
    }
    let dot_git = dir.join(".git");
    match std::fs::symlink_metadata(&dot_git) {
        Ok(m) if m.file_type().is_file() => {}
        Ok(m) if m.file_type().is_dir() => {
            return Err(tampered(dir, ".git is a directory of its own, not the file git makes"));
        }
        Ok(_) => return Err(tampered(dir, ".git is a link, not the file git makes")),
        Err(_) => return Ok(None),
    }
    let text = std::fs::read_to_string(&dot_git)
        .map_err(|e| tampered(dir, format!(".git is unreadable: {e}")))?;
    let Some(named) = text.trim_end().strip_prefix("gitdir: ") else {
        return Err(tampered(dir, ".git does not name a git directory"));
    };
    let admin = dir.join(named);
    let worktrees = common.join("worktrees");
    let under = admin.parent().and_then(canonical) == canonical(&worktrees);
    let kind = std::fs::symlink_metadata(&admin).map(|m| m.file_type());
    if under && kind.is_err() {
        // A registration removed under a checkout (a crash, `git worktree prune`): no worktree.
        return Ok(None);
    }
    if !under || !kind.is_ok_and(|k| k.is_dir()) {
        return Err(tampered(
            dir,
            format!(
                ".git points at {}, not at a worktree administration directory under {}",
                admin.display(),
                worktrees.display()
            ),
        ));
    }
    let back = admin_file(dir, &admin, "gitdir")?;
    if canonical(Path::new(&back)) != canonical(&dot_git) {
        return Err(tampered(
            dir,
            format!("{} names {back}, not this worktree", admin.join("gitdir").display()),
        ));
    }
    let common_named = admin_file(dir, &admin, "commondir")?;
    if canonical(&admin.join(&common_named)) != canonical(common) {
        return Err(tampered(
            dir,
            format!(
                "{} leads to {common_named}, not the repository",
                admin.join("commondir").display()
            ),
        ));
    }
    let head = admin_file(dir, &admin, "HEAD")?;
    let head = match head.strip_prefix("ref: refs/heads/") {
        Some(branch) => Head::Branch(branch.to_owned()),
        None => match Oid::from_str(&head) {
            Ok(oid) if head.len() == 40 => Head::Detached(oid),
            _ => return Err(tampered(dir, format!("its HEAD holds '{head}'"))),
        },
    };
    Ok(Some((admin, head)))
}

impl Checkout {
    /// The worktree at `dir` of the repository at `repo_path` (the path the task recorded),
    /// checked (see [`verify`]). No worktree there is [`Error::Repo`].
    pub fn open(repo_path: &Path, dir: &Path) -> Result<Checkout> {
        let repo = open_main(repo_path)?;
        let Some((admin, head)) = verify(repo.commondir(), dir)? else {
            return Err(Error::Repo(format!("there is no worktree at {}", dir.display())));
        };
        repo.set_workdir(dir, false)?;
        Ok(Checkout { repo, dir: dir.to_path_buf(), admin, head })
    }

    pub fn head(&self) -> &Head {
        &self.head
    }

    pub fn admin(&self) -> &Path {
        &self.admin
    }

    pub fn repo(&self) -> &Repository {
        &self.repo
    }

    /// The tip of the task's `branch`, once HEAD is checked to be on it: anything else (the
    /// user's branch, another task's, a commit) was not put there by TaskBridge.
    pub fn branch_tip(&self, branch: &str) -> Result<git2::Commit<'_>> {
        if self.head != Head::Branch(branch.to_owned()) {
            let held = match &self.head {
                Head::Branch(b) => format!("branch {b}"),
                Head::Detached(c) => format!("commit {c}"),
            };
            return Err(tampered(&self.dir, format!("its HEAD is on {held}, not on {branch}")));
        }
        let r = self.repo.find_reference(&format!("refs/heads/{branch}"))?;
        Ok(r.peel_to_commit()?)
    }

    /// An index holding `tree`, owned by the repository (so that it reads the worktree). On
    /// disk, it is the worktree's index, written anew: whatever the agent left there is not read.
    fn index_of(&self, tree: &git2::Tree<'_>, on_disk: bool) -> Result<Index> {
        let mut index = if on_disk {
            let path = self.admin.join("index");
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.file_type().is_dir() => {
                    return Err(tampered(&self.dir, format!("{} is a directory", path.display())));
                }
                Ok(_) => std::fs::remove_file(&path)
                    .map_err(|e| Error::io(format!("removing {}", path.display()), e))?,
                Err(_) => {}
            }
            Index::open(&path)?
        } else {
            Index::new()?
        };
        index.read_tree(tree)?;
        self.repo.set_index(&mut index)?;
        Ok(index)
    }

    /// Commits everything in the worktree (new, changed and deleted files; ignored files stay
    /// out) on `branch`, the task's. `None` when there was nothing to commit.
    pub fn commit_all(&self, branch: &str, message: &str) -> Result<Option<String>> {
        let tip = self.branch_tip(branch)?;
        let mut index = self.index_of(&tip.tree()?, true)?;
        index.add_all(["*"], IndexAddOption::DEFAULT, None)?;
        index.update_all(["*"], None)?;
        let tree_id = index.write_tree()?;
        index.write()?;
        if tip.tree_id() == tree_id {
            return Ok(None);
        }
        let tree = self.repo.find_tree(tree_id)?;
        let sig = super::signature(&self.repo)?;
        let reference = format!("refs/heads/{branch}");
        let oid = self.repo.commit(Some(&reference), &sig, &sig, message, &tree, &[&tip])?;
        Ok(Some(oid.to_string()))
    }

    /// Everything in the worktree that differs from `base`, against the tip of `branch`.
    pub fn diff_against(&self, branch: &str, base: &str) -> Result<super::WorkDiff> {
        let tip = self.branch_tip(branch)?;
        let index = self.index_of(&tip.tree()?, false)?;
        let base_tree = self.repo.find_commit(Oid::from_str(base)?)?.tree()?;
        super::diff_to_workdir(&self.repo, &base_tree, &index)
    }

    /// Puts the worktree back to the tip of `branch`, deleting untracked files, and returns the
    /// paths that had changed.
    pub fn revert_all(&self, branch: &str) -> Result<Vec<String>> {
        let tip = self.branch_tip(branch)?;
        let tree = tip.tree()?;
        let index = self.index_of(&tree, true)?;
        let mut opts = git2::DiffOptions::new();
        opts.include_untracked(true).recurse_untracked_dirs(true);
        let diff = self.repo.diff_index_to_workdir(Some(&index), Some(&mut opts))?;
        let changed: Vec<String> = diff
            .deltas()
            .filter_map(|d| d.new_file().path().or(d.old_file().path()))
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if !changed.is_empty() {
            let mut co = git2::build::CheckoutBuilder::new();
            co.force().recreate_missing(true).remove_untracked(true);
            self.repo.checkout_tree(tree.as_object(), Some(&mut co))?;
        }
        let mut index = index;
        index.write()?;
        Ok(changed)
    }

    /// Detaches HEAD at the tip of `branch` (a spare keeps its files, and frees the branch).
    pub fn park(&self, branch: &str) -> Result<()> {
        let tip = self.branch_tip(branch)?.id();
        self.write_head(&format!("{tip}\n"))
    }

    /// Makes the worktree hold exactly `commit`'s files on `branch`: everything in it is
    /// removed first (links are removed, never followed), then checked out afresh.
    pub fn reset_to(&self, branch: &str, commit: &git2::Commit<'_>) -> Result<()> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| Error::io(format!("reading {}", self.dir.display()), e))?;
        for entry in entries.flatten() {
            if entry.file_name() == ".git" {
                continue;
            }
            let path = entry.path();
            let gone = match entry.file_type() {
                Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
                _ => std::fs::remove_file(&path),
            };
            gone.map_err(|e| Error::io(format!("removing {}", path.display()), e))?;
        }
        let tree = commit.tree()?;
        let mut index = self.index_of(&tree, true)?;
        let mut co = git2::build::CheckoutBuilder::new();
        co.force().recreate_missing(true).remove_untracked(true).remove_ignored(true);
        self.repo.checkout_tree(tree.as_object(), Some(&mut co))?;
        index.write()?;
        self.write_head(&format!("ref: refs/heads/{branch}\n"))
    }

    /// Replaces the admin directory's HEAD (a new file moved into place: whatever stood there,
    /// a link included, is replaced, never written through).
    fn write_head(&self, text: &str) -> Result<()> {
        let path = self.admin.join("HEAD");
        let tmp = self.admin.join("HEAD.taskbridge");
        let _ = std::fs::remove_file(&tmp);
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| Error::io(format!("writing {}", path.display()), e))
    }
}

/// The repository at `path` (a path TaskBridge recorded): no search upwards, no environment.
pub fn open_main(path: &Path) -> Result<Repository> {
    let none: [&std::ffi::OsStr; 0] = [];
    Ok(Repository::open_ext(path, RepositoryOpenFlags::NO_SEARCH, none)?)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{git, head_of, repo};
    use super::super::{park_worktree, prepare_worktree, resolve_repo, reuse_worktree};
    use super::*;

    /// A repository, a task's worktree of it on `taskbridge/task-5`, and a directory outside
    /// both with a file of the user's in it.
    struct World {
        repo: tempfile::TempDir,
        _root: tempfile::TempDir,
        wt: PathBuf,
        outside: PathBuf,
        base: String,
    }

    const BRANCH: &str = "taskbridge/task-5";

    fn world() -> World {
        let repo = repo();
        let base = resolve_repo(repo.path(), None).unwrap().base;
        let root = tempfile::tempdir().unwrap();
        let wt = root.path().join("task-5");
        prepare_worktree(repo.path(), &base, 5, None, &wt, None).unwrap();
        let outside = root.path().join("home");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join(".bashrc"), "the user's own\n").unwrap();
        std::fs::write(outside.join("token"), "secret\n").unwrap();
        World { repo, _root: root, wt, outside, base }
    }

    /// Every file under `dir` with its bytes, and every ref and HEAD of the repository at `repo`.
    fn snapshot(repo: &Path, dirs: &[&Path]) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        for d in dirs {
            let mut stack = vec![d.to_path_buf()];
            while let Some(p) = stack.pop() {
                for e in std::fs::read_dir(&p).unwrap().flatten() {
                    let path = e.path();
                    if path.file_name() == Some(std::ffi::OsStr::new(".git")) {
                        continue;
                    }
                    match e.file_type().unwrap().is_dir() {
                        true => stack.push(path),
                        false => {
                            out.push((path.display().to_string(), std::fs::read(&path).unwrap()))
                        }
                    }
                }
            }
        }
        let refs = std::process::Command::new("git")
            .args(["for-each-ref", "--format=%(refname) %(objectname)"])
            .current_dir(repo)
            .output()
            .unwrap()
            .stdout;
        out.push(("refs".into(), refs));
        out.push(("HEAD".into(), std::fs::read(repo.join(".git/HEAD")).unwrap()));
        out.sort();
        out
    }

    fn is_tampered(r: Result<impl std::fmt::Debug>, needle: &str) {
        match r {
            Err(Error::Tampered(what)) => assert!(what.contains(needle), "{what}"),
            other => panic!("not refused as tampered: {other:?}"),
        }
    }

    #[test]
    fn a_git_file_pointed_at_the_users_repository_is_refused_and_nothing_there_moves() {
        let w = world();
        let before = snapshot(w.repo.path(), &[w.repo.path()]);
        std::fs::write(w.wt.join("work.txt"), "agent's work\n").unwrap();
        let users = w.repo.path().join(".git");
        std::fs::write(w.wt.join(".git"), format!("gitdir: {}\n", users.display())).unwrap();
        is_tampered(Checkout::open(w.repo.path(), &w.wt).map(|_| ()), ".git points at");
        is_tampered(super::super::commit_all(w.repo.path(), &w.wt, BRANCH, "m"), ".git points at");
        is_tampered(super::super::park_worktree(w.repo.path(), &w.wt, BRANCH), ".git points at");
        assert_eq!(snapshot(w.repo.path(), &[w.repo.path()]), before);
        assert_eq!(super::super::head_branch(w.repo.path(), &w.wt), None);
    }

    /// The issue's steps: a git directory of the agent's making inside the worktree, whose
    /// `core.worktree` is another directory, borrowing the repository's objects, with every
    /// task branch name pointing at a commit of its making.
    fn forge_git_dir(w: &World) {
        let script = format!(
            r#"set -e
W=$PWD; git init -q --bare .fg; git --git-dir=.fg config core.bare false
git --git-dir=.fg config core.worktree {out}
echo {repo}/.git/objects > .fg/objects/info/alternates
export GIT_DIR=$W/.fg GIT_INDEX_FILE=$W/.fg/tmpidx
b=$(echo 'echo PWNED'|git hash-object -w --stdin); git update-index --add --cacheinfo 100644,$b,.bashrc
c=$(echo x|git -c user.name=a -c user.email=a@b commit-tree $(git write-tree))
for n in 5 6 7 8; do git update-ref refs/heads/taskbridge/task-$n $c; done
git symbolic-ref HEAD refs/heads/taskbridge/task-5; printf 'gitdir: %s/.fg\n' $W > .git
"#,
            out = w.outside.display(),
            repo = w.repo.path().display()
        );
        let ok = std::process::Command::new("bash")
            .args(["-c", &script])
            .current_dir(&w.wt)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    #[test]
    fn a_forged_git_dir_with_another_worktree_reads_and_writes_nothing_there() {
        let w = world();
        std::fs::write(w.wt.join("work.txt"), "agent's work\n").unwrap();
        let before = snapshot(w.repo.path(), &[w.repo.path(), &w.outside]);
        forge_git_dir(&w);
        let rp = w.repo.path();
        is_tampered(super::super::commit_all(rp, &w.wt, BRANCH, "m"), ".git points at");
        is_tampered(super::super::diff_against_base(rp, &w.wt, BRANCH, &w.base), ".git points at");
        is_tampered(super::super::revert_all(rp, &w.wt, BRANCH), ".git points at");
        let r = reuse_worktree(rp, &w.wt, &w.base, 6);
        assert!(r.as_ref().is_err_and(|e| e.tampered && e.permanent), "{r:?}");
        let r = prepare_worktree(rp, &w.base, 5, Some(BRANCH), &w.wt, None);
        assert!(r.as_ref().is_err_and(|e| e.tampered), "{r:?}");
        assert_eq!(snapshot(rp, &[rp, &w.outside]), before, "the outside and the repository");
    }

    #[test]
    fn a_spare_tampered_after_it_was_parked_is_not_reused() {
        let w = world();
        let rp = w.repo.path();
        park_worktree(rp, &w.wt, BRANCH).unwrap();
        let before = snapshot(rp, &[rp, &w.outside]);
        forge_git_dir(&w);
        let r = reuse_worktree(rp, &w.wt, &w.base, 6);
        assert!(r.as_ref().is_err_and(|e| e.tampered), "{r:?}");
        assert_eq!(snapshot(rp, &[rp, &w.outside]), before);
    }

    #[test]
    fn a_head_moved_to_the_users_branch_commits_nothing_there() {
        let w = world();
        let rp = w.repo.path();
        let admin = Checkout::open(rp, &w.wt).unwrap().admin().to_path_buf();
        std::fs::write(w.wt.join("work.txt"), "agent's work\n").unwrap();
        let before = snapshot(rp, &[rp]);
        std::fs::write(admin.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        is_tampered(super::super::commit_all(rp, &w.wt, BRANCH, "m"), "HEAD is on branch main");
        std::fs::write(admin.join("HEAD"), "garbage\n").unwrap();
        is_tampered(Checkout::open(rp, &w.wt).map(|_| ()), "HEAD holds 'garbage'");
        // A short hexadecimal name git would take as an abbreviation is no commit of ours.
        std::fs::write(admin.join("HEAD"), "abcdef\n").unwrap();
        is_tampered(Checkout::open(rp, &w.wt).map(|_| ()), "HEAD holds 'abcdef'");
        assert_eq!(snapshot(rp, &[rp]), before);
    }

    #[test]
    fn an_admin_directory_that_names_another_worktree_or_repository_is_refused() {
        let w = world();
        let rp = w.repo.path();
        let admin = Checkout::open(rp, &w.wt).unwrap().admin().to_path_buf();
        let good = |f: &str| std::fs::read(admin.join(f)).unwrap();
        let (gitdir, commondir) = (good("gitdir"), good("commondir"));
        std::fs::write(admin.join("gitdir"), "/elsewhere/.git\n").unwrap();
        is_tampered(Checkout::open(rp, &w.wt).map(|_| ()), "not this worktree");
        std::fs::write(admin.join("gitdir"), &gitdir).unwrap();
        let other = repo();
        let to = format!("{}\n", other.path().join(".git").display());
        std::fs::write(admin.join("commondir"), to).unwrap();
        is_tampered(Checkout::open(rp, &w.wt).map(|_| ()), "not the repository");
        std::fs::write(admin.join("commondir"), &commondir).unwrap();
        // A link in place of one of its files is not followed.
        std::fs::remove_file(admin.join("gitdir")).unwrap();
        std::os::unix::fs::symlink(w.wt.join(".git"), admin.join("gitdir")).unwrap();
        is_tampered(Checkout::open(rp, &w.wt).map(|_| ()), "is not a plain file");
        std::fs::remove_file(admin.join("gitdir")).unwrap();
        std::fs::write(admin.join("gitdir"), &gitdir).unwrap();
        // A `.git` that is a link, or a directory of its own.
        let dot_git = w.wt.join(".git");
        let text = std::fs::read(&dot_git).unwrap();
        std::fs::remove_file(&dot_git).unwrap();
        std::os::unix::fs::symlink(rp.join(".git"), &dot_git).unwrap();
        is_tampered(Checkout::open(rp, &w.wt).map(|_| ()), ".git is a link");
        std::fs::remove_file(&dot_git).unwrap();
        std::fs::create_dir(&dot_git).unwrap();
        is_tampered(Checkout::open(rp, &w.wt).map(|_| ()), "a directory of its own");
        std::fs::remove_dir(&dot_git).unwrap();
        std::fs::write(&dot_git, text).unwrap();
        // The worktree moved away and a link left in its place, which would lead to it: not
        // followed.
        let real = w.wt.with_file_name("task-5-real");
        std::fs::rename(&w.wt, &real).unwrap();
        std::os::unix::fs::symlink(&real, &w.wt).unwrap();
        is_tampered(Checkout::open(rp, &w.wt).map(|_| ()), "no longer a directory");
        std::fs::remove_file(&w.wt).unwrap();
        std::fs::rename(&real, &w.wt).unwrap();
        assert!(Checkout::open(rp, &w.wt).is_ok(), "as git made it again");
    }

    #[test]
    fn an_index_linked_outside_is_replaced_not_written_through_or_read() {
        let w = world();
        let rp = w.repo.path();
        let admin = Checkout::open(rp, &w.wt).unwrap().admin().to_path_buf();
        std::fs::remove_file(admin.join("index")).unwrap();
        std::os::unix::fs::symlink(w.outside.join("token"), admin.join("index")).unwrap();
        std::fs::write(w.wt.join("work.txt"), "agent's work\n").unwrap();
        let sha = super::super::commit_all(rp, &w.wt, BRANCH, "m").unwrap().unwrap();
        assert_eq!(std::fs::read_to_string(w.outside.join("token")).unwrap(), "secret\n");
        assert!(std::fs::symlink_metadata(admin.join("index")).unwrap().file_type().is_file());
        assert_eq!(head_of(rp, BRANCH), sha);
        // The commit holds the worktree's files, the base's and the new one.
        let files = std::process::Command::new("git")
            .args(["ls-tree", "--name-only", "-r", &sha])
            .current_dir(rp)
            .output()
            .unwrap()
            .stdout;
        assert_eq!(String::from_utf8(files).unwrap(), "a.txt\ngone.txt\nold.txt\nwork.txt\n");
        // And git in the worktree agrees: nothing left uncommitted.
        let status = std::process::Command::new("git")
            .args(["status", "--porcelain"])
            .current_dir(&w.wt)
            .output()
            .unwrap()
            .stdout;
        assert_eq!(String::from_utf8(status).unwrap(), "");
        // An index that is a directory is no index git made.
        std::fs::remove_file(admin.join("index")).unwrap();
        std::fs::create_dir(admin.join("index")).unwrap();
        is_tampered(super::super::commit_all(rp, &w.wt, BRANCH, "m"), "is a directory");
        std::fs::remove_dir(admin.join("index")).unwrap();
    }

    #[test]
    fn a_reused_spare_removes_links_out_of_it_without_following_them() {
        let w = world();
        let rp = w.repo.path();
        std::fs::create_dir(w.wt.join("sub")).unwrap();
        std::os::unix::fs::symlink(&w.outside, w.wt.join("sub/out")).unwrap();
        std::os::unix::fs::symlink(&w.outside, w.wt.join("a-link")).unwrap();
        std::fs::write(w.wt.join("a.txt"), "changed\n").unwrap();
        park_worktree(rp, &w.wt, BRANCH).unwrap();
        let p = reuse_worktree(rp, &w.wt, &w.base, 6).unwrap();
        assert_eq!(p.branch, "taskbridge/task-6");
        assert_eq!(super::super::head_branch(rp, &w.wt).as_deref(), Some("taskbridge/task-6"));
        let mut left: Vec<String> = std::fs::read_dir(&w.wt)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [".git", "a.txt", "gone.txt", "old.txt"]);
        assert_eq!(std::fs::read_to_string(w.wt.join("a.txt")).unwrap(), "one\ntwo\n");
        assert_eq!(std::fs::read_to_string(w.outside.join(".bashrc")).unwrap(), "the user's own\n");
        assert!(w.outside.join("token").exists());
        git(&w.wt, &["status", "--porcelain"]);
    }
}
