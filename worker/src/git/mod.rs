//! Git, through libgit2: resolving a submitted repository, per-task worktrees on their own branch,
//! committing the agent's work, and the diff Claude gets back. A branch or worktree that holds
//! work is never deleted here.

mod checkout;

use crate::error::{Error, Result};
pub use checkout::{Checkout, Head};
use git2::{
    BranchType, Delta, Diff, DiffFindOptions, DiffFormat, DiffOptions, Oid, Repository, Signature,
    StatusOptions, WorktreeAddOptions, WorktreePruneOptions,
};
use std::path::{Path, PathBuf};

/// A repository as a task records it: its top level and the commit the task starts from.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedRepo {
    pub toplevel: PathBuf,
    pub base: String,
    /// The local branch that was named (or that HEAD is on), if any.
    pub branch: Option<String>,
}

/// The directory at or above `path` that holds a `.git` (the repository git refused), or `path`.
fn owned_repository_root(path: &Path) -> PathBuf {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    path.ancestors().find(|d| d.join(".git").exists()).unwrap_or(&path).to_path_buf()
}

/// Finds the repository containing `path` and resolves `reference` (default `HEAD`) to a commit.
pub fn resolve_repo(path: &Path, reference: Option<&str>) -> Result<ResolvedRepo> {
    if !path.exists() {
        return Err(Error::Repo(format!("'{}' does not exist", path.display())));
    }
    let repo = Repository::discover(path).map_err(|e| {
        if e.code() == git2::ErrorCode::Owner {
            // git's `safe.directory`: a repository owned by another user is refused until the
            // user says it is trusted.
            let top = owned_repository_root(path);
            return Error::Repo(format!(
                "'{}' is a git repository owned by another user, which git refuses to use \
                 (its safe.directory rule). If you trust it, run `git config --global --add \
                 safe.directory {}`; or run TaskBridge as the repository's owner",
                top.display(),
                top.display()
            ));
        }
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
    let branch = if reference == "HEAD" {
        repo.head()
            .ok()
            .filter(|h| h.is_branch())
            .and_then(|h| h.shorthand().ok().map(str::to_owned))
    } else {
        repo.find_branch(reference, BranchType::Local).ok().map(|_| reference.to_owned())
    };
    Ok(ResolvedRepo { toplevel, base: commit.id().to_string(), branch })
}

/// The local branch checked out in `repo`'s worktree at `dir`, if it is one of its worktrees
/// as git made it and on a branch.
pub fn head_branch(repo: &Path, dir: &Path) -> Option<String> {
    match Checkout::open(repo, dir).ok()?.head() {
        Head::Branch(b) => Some(b.clone()),
        Head::Detached(_) => None,
    }
}

/// The paths an in-memory merge left conflicted, sorted.
fn conflicted_paths(index: &git2::Index) -> std::result::Result<Vec<String>, git2::Error> {
    let mut paths: Vec<String> = index
        .conflicts()?
        .flatten()
        .filter_map(|c| c.our.or(c.their).or(c.ancestor))
        .map(|e| String::from_utf8_lossy(&e.path).into_owned())
        .collect();
    paths.sort();
    paths.dedup();
    Ok(paths)
}

/// Why dependencies' work cannot be put together.
#[derive(Debug, Clone, PartialEq)]
pub struct StackConflict {
    /// Indexes (into the caller's list) of the work merged so far, and of the one that conflicts.
    pub merged: Vec<usize>,
    pub with: usize,
    pub paths: Vec<String>,
}

/// The commit a task with dependencies starts from: one dependency's commit, or a merge of
/// several (in the order given) made here, before any agent runs. A commit that another one
/// already contains adds nothing. `None` when there is no commit at all.
pub fn stack_start(
    repo_path: &Path,
    commits: &[String],
    message: &str,
) -> Result<std::result::Result<Option<String>, StackConflict>> {
    let repo = Repository::open(repo_path)?;
    let mut acc: Option<(git2::Commit<'_>, Vec<usize>)> = None;
    for (i, c) in commits.iter().enumerate() {
        let next = repo.find_commit(Oid::from_str(c)?)?;
        let Some((cur, merged)) = acc.take() else {
            acc = Some((next, vec![i]));
            continue;
        };
        if cur.id() == next.id() || repo.graph_descendant_of(cur.id(), next.id())? {
            acc = Some((cur, merged));
            continue;
        }
        if repo.graph_descendant_of(next.id(), cur.id())? {
            let mut merged = merged;
            merged.push(i);
            acc = Some((next, merged));
            continue;
        }
        let mut index = repo.merge_commits(&cur, &next, None)?;
        if index.has_conflicts() {
            let paths = conflicted_paths(&index)?;
            return Ok(Err(StackConflict { merged, with: i, paths }));
        }
        let tree = repo.find_tree(index.write_tree_to(&repo)?)?;
        let sig = signature(&repo)?;
        let oid = repo.commit(None, &sig, &sig, message, &tree, &[&cur, &next])?;
        let mut merged = merged;
        merged.push(i);
        acc = Some((repo.find_commit(oid)?, merged));
    }
    Ok(Ok(acc.map(|(c, _)| c.id().to_string())))
}

/// What [`merge_into`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    pub commit: String,
    /// `fast-forward`, `merge` or `squash`.
    pub how: &'static str,
    /// The working tree that has `into` checked out and was updated, if any.
    pub checkout: Option<PathBuf>,
}

/// Brings `commit` (a task's work) into the local branch `into`: a fast-forward when possible
/// (and not `squash`), else a merge commit, or one squashed commit. Where `into` is checked out
/// (the main working tree or another worktree) that tree must have no uncommitted changes, and
/// it is updated as `git merge` would. A conflict changes nothing. `Err` says why, for the user.
pub fn merge_into(
    repo_path: &Path,
    commit: &str,
    into: &str,
    squash: bool,
    message: &str,
) -> std::result::Result<Merged, String> {
    let fail = |e: git2::Error| e.message().to_owned();
    let repo = Repository::open(repo_path).map_err(fail)?;
    let _lock = RepoLock::acquire(&repo).map_err(|e| e.message)?;
    let theirs = Oid::from_str(commit).and_then(|o| repo.find_commit(o)).map_err(fail)?;
    let target_ref = format!("refs/heads/{into}");
    let mut target = repo.find_reference(&target_ref).map_err(|_| {
        format!("there is no branch '{into}' in '{}'; name one that exists", repo_path.display())
    })?;
    let ours = target.peel_to_commit().map_err(fail)?;
    // Where the branch is checked out, if anywhere.
    let main_on =
        repo.head().ok().and_then(|h| h.name().ok().map(str::to_owned)) == Some(target_ref.clone());
    let checkout: Option<PathBuf> = if main_on {
        repo.workdir().map(Path::to_path_buf)
    } else {
        registrations(&repo)
            .into_iter()
            .find(|r| {
                r.head.as_deref() == Some(target_ref.as_str()) && opens(repo.commondir(), &r.path)
            })
            .map(|r| r.path)
    };
    let wt = match &checkout {
        Some(dir) => {
            let wt = match main_on {
                true => checkout::open_main(repo_path),
                false => open_linked(&repo, dir),
            };
            let wt = wt.map_err(|e| e.to_string())?;
            let mut opts = StatusOptions::new();
            opts.include_untracked(false).include_ignored(false);
            let dirty: Vec<String> = wt
                .statuses(Some(&mut opts))
                .map_err(fail)?
                .iter()
                .filter_map(|s| s.path().ok().map(str::to_owned))
                .collect();
            if !dirty.is_empty() {
                return Err(format!(
                    "'{into}' is checked out in '{}' with uncommitted changes to {}; commit or \
                     stash them, then merge again (nothing was changed)",
                    dir.display(),
                    dirty.join(", ")
                ));
            }
            Some(wt)
        }
        None => None,
    };
    if ours.id() == theirs.id() || repo.graph_descendant_of(ours.id(), theirs.id()).map_err(fail)? {
        return Err(format!("'{into}' already contains this work; nothing to merge"));
    }
    let ff = !squash && repo.graph_descendant_of(theirs.id(), ours.id()).map_err(fail)?;
    let (new, how) = if ff {
        (theirs.clone(), "fast-forward")
    } else {
        let mut index = repo.merge_commits(&ours, &theirs, None).map_err(fail)?;
        if index.has_conflicts() {
            let paths = conflicted_paths(&index).map_err(fail)?;
            return Err(format!(
                "merging into '{into}' conflicts in {}; nothing was changed (a follow-up task can \
                 resolve it on the task's branch)",
                paths.join(", ")
            ));
        }
        let tree_id = index.write_tree_to(&repo).map_err(fail)?;
        let tree = repo.find_tree(tree_id).map_err(fail)?;
        let sig = signature(&repo).map_err(|e| e.to_string())?;
        let parents: Vec<&git2::Commit<'_>> =
            if squash { vec![&ours] } else { vec![&ours, &theirs] };
        let oid = repo.commit(None, &sig, &sig, message, &tree, &parents).map_err(fail)?;
        (repo.find_commit(oid).map_err(fail)?, if squash { "squash" } else { "merge" })
    };
    if let Some(wt) = &wt {
        // As `git merge` would: the files follow, and a file the merge would overwrite that
        // is not tracked stops it before the branch moves.
        // Objects are looked up through the repository handle that checks them out.
        let tree = wt.find_tree(new.tree_id()).map_err(fail)?;
        let mut co = git2::build::CheckoutBuilder::new();
        co.safe();
        wt.checkout_tree(tree.as_object(), Some(&mut co)).map_err(|e| {
            format!("the working tree could not be updated ({}); nothing was merged", e.message())
        })?;
    }
    target.set_target(new.id(), &format!("taskbridge: {how}")).map_err(fail)?;
    if let Some(wt) = &wt {
        // The index follows HEAD, which is the branch that just moved.
        let mut index = wt.index().map_err(fail)?;
        index.read_tree(&wt.find_tree(new.tree_id()).map_err(fail)?).map_err(fail)?;
        index.write().map_err(fail)?;
    }
    Ok(Merged { commit: new.id().to_string(), how, checkout })
}

pub fn branch_name(task_id: i64) -> String {
    format!("taskbridge/task-{task_id}")
}

/// The worktree's registration name for a branch (libgit2 refuses '/' in worktree names).
fn worktree_name(branch: &str) -> String {
    branch.replace('/', "-")
}

/// Whether `name` is one of the names [`free_branch`] gives task `task_id`.
fn is_task_branch(name: &str, task_id: i64) -> bool {
    let first = branch_name(task_id);
    name == first
        || name
            .strip_prefix(&first)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|k| k.parse::<u32>().is_ok())
}

/// The branch a task's first run gets: `taskbridge/task-<id>`, unless that name holds work that
/// is not this task's (a database started afresh counts from 1 again; another home shares the
/// repository), then `taskbridge/task-<id>-2` and so on. An existing branch that is exactly the
/// base commit and not checked out anywhere holds nothing to lose (an earlier attempt of this
/// task that was killed before it was recorded), so it is taken.
fn free_branch(
    repo: &Repository,
    task_id: i64,
    base: &git2::Commit<'_>,
) -> Result<String, PrepareError> {
    let regs = registrations(repo);
    for k in 1..1000 {
        let name =
            if k == 1 { branch_name(task_id) } else { format!("{}-{k}", branch_name(task_id)) };
        let Ok(existing) = repo.find_branch(&name, BranchType::Local) else { return Ok(name) };
        let at_base = existing.get().target() == Some(base.id());
        let reference = format!("refs/heads/{name}");
        let held = regs.iter().any(|r| {
            r.head.as_deref() == Some(reference.as_str()) && opens(repo.commondir(), &r.path)
        });
        if at_base && !held {
            return Ok(name);
        }
    }
    Err(permanent(format!(
        "no free branch name for task {task_id}: delete old taskbridge/task-{task_id}-* branches"
    )))
}

/// A worktree ready for the agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    pub branch: String,
    /// Where the worktree is: the directory asked for, or a fresh one beside it when that held
    /// another task's worktree (another queue's, on the same home).
    pub dir: PathBuf,
    /// True when the worktree was made now (set-up commands run), false when it was reused.
    pub created: bool,
    /// What was repaired on the way, for the task log.
    pub repairs: Vec<String>,
}

/// Why a worktree could not be prepared. `permanent` says whether another attempt could change
/// anything: a repository that is gone or a base commit it does not have cannot be retried into
/// working; a lock or a file system hiccup can.
#[derive(Debug, Clone, PartialEq)]
pub struct PrepareError {
    pub message: String,
    pub permanent: bool,
    /// The agent changed the worktree's git metadata (`Error::Tampered`).
    pub tampered: bool,
}

impl std::fmt::Display for PrepareError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn transient(e: impl std::fmt::Display) -> PrepareError {
    PrepareError { message: e.to_string(), permanent: false, tampered: false }
}

fn permanent(message: String) -> PrepareError {
    PrepareError { message, permanent: true, tampered: false }
}

impl From<Error> for PrepareError {
    fn from(e: Error) -> PrepareError {
        match e {
            Error::Tampered(_) => {
                PrepareError { message: e.to_string(), permanent: true, tampered: true }
            }
            e => transient(e),
        }
    }
}

/// Holds `<git common dir>/taskbridge-worktree.lock` exclusively: libgit2 makes
/// `.git/worktrees/` without tolerating a concurrent creator, so worktree changes in one
/// repository are serialised across threads and processes. The kernel drops the lock when its
/// holder dies, so a killed worker never leaves it held.
struct RepoLock(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

impl RepoLock {
    fn acquire(repo: &Repository) -> std::result::Result<RepoLock, PrepareError> {
        let path = repo.commondir().join("taskbridge-worktree.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| transient(format!("opening {}: {e}", path.display())))?;
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map(RepoLock)
            .map_err(|(_, e)| transient(format!("locking {}: {e}", path.display())))
    }
}

/// A registered worktree, as read from `<common dir>/worktrees/<name>/`.
struct Registration {
    name: String,
    /// The working directory it points at.
    path: PathBuf,
    /// The branch it has checked out (`refs/heads/...`), if any.
    head: Option<String>,
}

/// Every directory under the repository's `worktrees/`, half-made ones included: libgit2 lists
/// only registrations whose files are all there, but a worker killed inside `git worktree add`
/// leaves a directory with some of them, which still blocks the name (and, with its HEAD
/// written, the branch).
fn registrations(repo: &Repository) -> Vec<Registration> {
    let base = repo.commondir().join("worktrees");
    let Ok(entries) = std::fs::read_dir(&base) else { return Vec::new() };
    let names: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .collect();
    names
        .iter()
        .map(|name| {
            let admin = base.join(name);
            let read = |f: &str| std::fs::read_to_string(admin.join(f)).unwrap_or_default();
            let gitfile = PathBuf::from(read("gitdir").trim());
            let path = gitfile.parent().map(Path::to_path_buf).unwrap_or_default();
            let head = read("HEAD").trim().strip_prefix("ref: ").map(str::to_owned);
            Registration { name: name.to_owned(), path, head }
        })
        .collect()
}

/// Whether two paths name the same file or directory (either may be reached through a symlink).
pub fn same_path(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// Whether `dir` is a worktree of the repository whose common directory is `common`, as git
/// made it (see [`checkout::verify`]).
fn opens(common: &Path, dir: &Path) -> bool {
    matches!(checkout::verify(common, dir), Ok(Some(_)))
}

/// A linked worktree that has a branch of the user's checked out (a merge updates it), opened
/// once it is checked to be as git made it, and without a configuration of its own (which
/// could name another working directory).
fn open_linked(repo: &Repository, dir: &Path) -> Result<Repository> {
    let Some((admin, _)) = checkout::verify(repo.commondir(), dir)? else {
        return Err(Error::Repo(format!("there is no worktree at {}", dir.display())));
    };
    if admin.join("config.worktree").exists() {
        return Err(Error::Tampered(format!(
            "the worktree {} has a configuration of its own ({}), which TaskBridge does not follow",
            dir.display(),
            admin.join("config.worktree").display()
        )));
    }
    checkout::open_main(dir)
}

/// `dir` as a worktree whose checkout finished. libgit2 writes the index last, so a worktree
/// registered and pointed at but without an index is a checkout that a crash cut short: it
/// lacks files, and committing it would delete them from the branch. A worktree whose git
/// metadata the agent changed is an error (`Error::Tampered`).
fn finished_worktree(
    repo_path: &Path,
    repo: &Repository,
    dir: &Path,
) -> std::result::Result<Option<Checkout>, PrepareError> {
    let Some((admin, _)) = checkout::verify(repo.commondir(), dir)? else { return Ok(None) };
    if !admin.join("index").exists() {
        return Ok(None);
    }
    Ok(Some(Checkout::open(repo_path, dir)?))
}

/// Whether every file under `dir` is exactly the file at the same path in `tree`: a checkout
/// that a crash cut short holds nothing else, and can be removed without losing work.
fn only_base_files(dir: &Path, tree: &git2::Tree<'_>) -> bool {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { return false };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else { return false };
            let Ok(rel) = path.strip_prefix(dir) else { return false };
            if rel == Path::new(".git") {
                continue;
            }
            if kind.is_dir() {
                stack.push(path);
                continue;
            }
            let Ok(item) = tree.get_path(rel) else { return false };
            let Ok(oid) = Oid::hash_file(git2::ObjectType::Blob, &path) else { return false };
            if item.id() != oid {
                return false;
            }
        }
    }
    true
}

/// Whether `dir` is still there as a checkout (its `.git`, a file in a linked worktree, is
/// there). Only presence: a repository that cannot be opened for another reason is reported by
/// what tries to use it next, with that reason.
pub fn is_worktree(dir: &Path) -> bool {
    dir.join(".git").exists()
}

/// The repository's common git directory (`.git` of the main worktree), where every
/// worktree's administration and the shared objects live.
pub fn common_dir(repo: &Path) -> Result<PathBuf> {
    Ok(Repository::open(repo)?.commondir().to_path_buf())
}

/// What git inside `repo`'s worktree `dir` writes besides the checkout: its admin directory
/// (`<common>/worktrees/<name>`: index, HEAD) and the object store's directories (`git add`).
pub fn worktree_git_dirs(repo: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let checkout = Checkout::open(repo, dir)?;
    let mut dirs = object_dirs(checkout.repo().commondir())?;
    dirs.push(checkout.admin().to_path_buf());
    Ok(dirs)
}

/// The directories of `common`'s object store that git writes new objects into: the 256
/// fan-out directories of loose objects (made here when missing, since an agent inside the
/// wall could not make one it may write) and `pack`. Not `objects/` itself nor `objects/info`,
/// where `alternates` would send every reader of the repository to objects elsewhere.
pub fn object_dirs(common: &Path) -> Result<Vec<PathBuf>> {
    let objects = common.join("objects");
    let mut dirs: Vec<PathBuf> = (0..=255u8).map(|b| objects.join(format!("{b:02x}"))).collect();
    dirs.push(objects.join("pack"));
    for d in &dirs {
        std::fs::create_dir_all(d)
            .map_err(|e| Error::io(format!("creating {}", d.display()), e))?;
    }
    Ok(dirs)
}

/// Creates (or reuses, on a retry or resume) the task's worktree at `dir` on branch
/// `taskbridge/task-<id>`, starting from `base`, and first repairs what a crash can leave: a
/// registration whose directory is missing or has no `.git`, a directory without a
/// registration, the branch checked out in a stale worktree. A directory that holds anything but
/// the base commit's files is moved aside (`<dir>.aside-<unix time>`), never deleted.
/// `pause` is a fault-injection point for the chaos tests: a sleep while the creation is half
/// done (the branch made, the worktree not yet registered and checked out).
pub fn prepare_worktree(
    repo_path: &Path,
    base: &str,
    task_id: i64,
    known_branch: Option<&str>,
    dir: &Path,
    pause: Option<std::time::Duration>,
) -> std::result::Result<Prepared, PrepareError> {
    let repo = open_task_repo(repo_path)?;
    let _lock = RepoLock::acquire(&repo)?;
    let base_commit = base_commit(&repo, repo_path, base)?;
    let mut repairs = Vec::new();
    let own = reuse_own_worktree(repo_path, &repo, task_id, known_branch, dir, &mut repairs)?;
    let dir = match own {
        Reuse::Ours(branch, dir) => return Ok(Prepared { branch, dir, created: false, repairs }),
        Reuse::Make(dir) => dir,
    };
    let dir = dir.as_path();
    clear_leftover_dir(&repo, &base_commit, task_id, known_branch, dir, &mut repairs)?;
    let branch = task_branch(&repo, &base_commit, task_id, known_branch, dir, &mut repairs)?;
    prune_stale_registrations(&repo, &branch, dir, &mut repairs)?;
    if let Some(repair) = clear_stale_ref_lock(&repo, &branch)? {
        repairs.push(repair);
    }
    add_worktree(&repo, &base_commit, &branch, dir, pause)?;
    Ok(Prepared { branch, dir: dir.to_path_buf(), created: true, repairs })
}

/// The task's repository, or a permanent failure saying it is gone.
fn open_task_repo(repo_path: &Path) -> std::result::Result<Repository, PrepareError> {
    if !repo_path.exists() {
        return Err(permanent(format!(
            "the repository '{}' no longer exists; restore it, or cancel the task",
            repo_path.display()
        )));
    }
    Repository::open(repo_path).map_err(|e| {
        permanent(format!(
            "'{}' is no longer a git repository ({}); restore it, or cancel the task",
            repo_path.display(),
            e.message()
        ))
    })
}

/// What a finished worktree at the task's directory means.
enum Reuse {
    /// This task's own worktree, on this branch: reused as it is.
    Ours(String, PathBuf),
    /// A worktree is to be made here.
    Make(PathBuf),
}

/// Reuses the task's own worktree at `asked`; steps around another task's there.
fn reuse_own_worktree(
    repo_path: &Path,
    repo: &Repository,
    task_id: i64,
    known_branch: Option<&str>,
    asked: &Path,
    repairs: &mut Vec<String>,
) -> std::result::Result<Reuse, PrepareError> {
    let Some(wt) = finished_worktree(repo_path, repo, asked)? else {
        return Ok(Reuse::Make(asked.to_path_buf()));
    };
    let on = match wt.head() {
        Head::Branch(b) => Some(b.clone()),
        Head::Detached(_) => None,
    };
    // This task's own worktree: on the branch it recorded, or, before it recorded one, on a
    // name its first run could have chosen.
    let ours = match (&on, known_branch) {
        (Some(on), Some(known)) => on == known,
        (Some(on), None) => is_task_branch(on, task_id),
        (None, _) => false,
    };
    if let (true, Some(branch)) = (ours, on.clone()) {
        // A run killed while committing on the branch may have left its lock.
        repairs.extend(clear_stale_ref_lock(repo, &branch)?);
        return Ok(Reuse::Ours(branch, asked.to_path_buf()));
    }
    // Another task's worktree (another queue's task of the same number, on this home): it is
    // left alone, and this task steps around it.
    let dir = free_dir(asked);
    repairs.push(format!(
        "{} is another task's worktree (on {}); this one goes in {}",
        asked.display(),
        on.unwrap_or_else(|| "no branch".into()),
        dir.display()
    ));
    Ok(Reuse::Make(dir))
}

/// A directory that is not a finished worktree (a checkout a crash cut short, or something
/// else) is removed when it holds only the base's files (or its branch's), else moved aside.
fn clear_leftover_dir(
    repo: &Repository,
    base_commit: &git2::Commit<'_>,
    task_id: i64,
    known_branch: Option<&str>,
    dir: &Path,
    repairs: &mut Vec<String>,
) -> std::result::Result<(), PrepareError> {
    if !dir.exists() {
        return Ok(());
    }
    let tree = base_commit.tree().map_err(transient)?;
    // What its own branch holds counts as not-work too (a retry of a task that committed).
    let own = known_branch.map_or_else(|| branch_name(task_id), str::to_owned);
    let branch_tree =
        repo.find_branch(&own, BranchType::Local).ok().and_then(|b| b.get().peel_to_tree().ok());
    let clean =
        only_base_files(dir, &tree) || branch_tree.is_some_and(|t| only_base_files(dir, &t));
    if clean {
        std::fs::remove_dir_all(dir)
            .map_err(|e| transient(format!("removing {}: {e}", dir.display())))?;
        repairs.push(format!("removed the half-made worktree {}", dir.display()));
        return Ok(());
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let aside = PathBuf::from(format!("{}.aside-{secs}", dir.display()));
    std::fs::rename(dir, &aside)
        .map_err(|e| transient(format!("moving {} to {}: {e}", dir.display(), aside.display())))?;
    repairs.push(format!(
        "{} was not a usable worktree but held files of its own; kept them at {}",
        dir.display(),
        aside.display()
    ));
    Ok(())
}

/// The branch the task's worktree is on: the one it recorded, or a free name; a fresh one
/// when its own is checked out in a live worktree elsewhere (another home's, whose worker
/// stopped with the task running), which is not ours to remove.
fn task_branch(
    repo: &Repository,
    base_commit: &git2::Commit<'_>,
    task_id: i64,
    known_branch: Option<&str>,
    dir: &Path,
    repairs: &mut Vec<String>,
) -> std::result::Result<String, PrepareError> {
    let branch = match known_branch {
        Some(b) => b.to_owned(),
        None => free_branch(repo, task_id, base_commit)?,
    };
    let held = format!("refs/heads/{branch}");
    let Some(other) = registrations(repo).into_iter().find(|r| {
        r.head.as_deref() == Some(held.as_str())
            && !same_path(&r.path, dir)
            && opens(repo.commondir(), &r.path)
    }) else {
        return Ok(branch);
    };
    let fresh = free_branch(repo, task_id, base_commit)?;
    repairs.push(format!(
        "branch {branch} is checked out in another worktree at '{}'; this attempt starts afresh \
         on {fresh}",
        other.path.display()
    ));
    Ok(fresh)
}

/// Registrations that point at our directory, that hold our branch, or that take the name ours
/// gets, in a directory that is gone (or was never made: a kill inside `worktree add`), are
/// stale: only the registration is removed (the directory was dealt with before).
fn prune_stale_registrations(
    repo: &Repository,
    branch: &str,
    dir: &Path,
    repairs: &mut Vec<String>,
) -> std::result::Result<(), PrepareError> {
    let ours = format!("refs/heads/{branch}");
    let wanted_name = worktree_name(branch);
    for reg in registrations(repo) {
        let at_dir = !reg.path.as_os_str().is_empty() && same_path(&reg.path, dir);
        let holds_branch = reg.head.as_deref() == Some(ours.as_str());
        let takes_name = reg.name == wanted_name;
        if !at_dir && !holds_branch && !takes_name {
            continue;
        }
        let live = opens(repo.commondir(), &reg.path);
        if takes_name && !at_dir && !holds_branch && live {
            // A live worktree under that name with another branch: ours takes another name.
            continue;
        }
        if live {
            // Live, and not ours (our directory was cleared before): stepped around before,
            // so one that appeared since is left alone too.
            return Err(transient(format!(
                "branch {branch} was checked out in another worktree at '{}' just now",
                reg.path.display()
            )));
        }
        // A half-made registration libgit2 cannot open is only its directory, removed below.
        // Only the registration: the directory it names may be anything the agent wrote there.
        if let Ok(wt) = repo.find_worktree(&reg.name) {
            wt.prune(Some(
                WorktreePruneOptions::new().valid(true).locked(true).working_tree(false),
            ))
            .map_err(transient)?;
        }
        // libgit2 keeps the admin directory of a registration whose gitdir file is gone.
        let admin = repo.commondir().join("worktrees").join(&reg.name);
        if admin.exists() {
            std::fs::remove_dir_all(&admin)
                .map_err(|e| transient(format!("removing {}: {e}", admin.display())))?;
        }
        repairs.push(format!("removed the stale worktree registration '{}'", reg.name));
    }
    Ok(())
}

/// Makes the worktree at `dir` on `branch` (created at the base when new), under the first free
/// registration name.
fn add_worktree(
    repo: &Repository,
    base_commit: &git2::Commit<'_>,
    branch: &str,
    dir: &Path,
    pause: Option<std::time::Duration>,
) -> std::result::Result<(), PrepareError> {
    let reference = match repo.find_branch(branch, BranchType::Local) {
        Ok(b) => b.into_reference(),
        Err(_) => repo.branch(branch, base_commit, false).map_err(transient)?.into_reference(),
    };
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| transient(format!("creating {}: {e}", parent.display())))?;
    }
    if let Some(p) = pause {
        std::thread::sleep(p);
    }
    let wanted_name = worktree_name(branch);
    let admin = repo.commondir().join("worktrees");
    let name = (1u32..)
        .map(|k| if k == 1 { wanted_name.clone() } else { format!("{wanted_name}-{k}") })
        .find(|n| !admin.join(n).exists())
        .unwrap_or(wanted_name);
    repo.worktree(&name, dir, Some(WorktreeAddOptions::new().reference(Some(&reference))))
        .map_err(transient)?;
    Ok(())
}

/// The text of the file at `path` in `commit`'s tree; `None` when the commit has no such file.
pub fn file_at(repo: &Path, commit: &str, path: &str) -> Result<Option<String>> {
    let repo = Repository::open(repo)?;
    let tree = repo.find_commit(Oid::from_str(commit)?)?.tree()?;
    let Ok(entry) = tree.get_path(Path::new(path)) else { return Ok(None) };
    let blob = entry.to_object(&repo)?.peel_to_blob()?;
    Ok(Some(String::from_utf8_lossy(blob.content()).into_owned()))
}

/// A ref lock older than this on a task's branch is a leftover: git holds one for the few
/// milliseconds of a ref write.
const STALE_REF_LOCK: std::time::Duration = std::time::Duration::from_secs(5);

/// Removes `refs/heads/<branch>.lock` when a process killed while writing the branch (making
/// it, committing on it) left it behind: git never removes such a lock itself, so every later
/// attempt would fail on it. Called under [`RepoLock`], where no TaskBridge process is writing
/// the branch; a lock younger than [`STALE_REF_LOCK`] may still be someone's write, and is left.
fn clear_stale_ref_lock(
    repo: &Repository,
    branch: &str,
) -> std::result::Result<Option<String>, PrepareError> {
    let lock = repo.commondir().join("refs/heads").join(format!("{branch}.lock"));
    let Ok(modified) = std::fs::metadata(&lock).and_then(|m| m.modified()) else {
        return Ok(None);
    };
    if modified.elapsed().is_ok_and(|age| age < STALE_REF_LOCK) {
        return Ok(None);
    }
    std::fs::remove_file(&lock)
        .map_err(|e| transient(format!("removing the stale lock {}: {e}", lock.display())))?;
    Ok(Some(format!(
        "removed the lock {} that a process killed while writing branch {branch} left behind",
        lock.display()
    )))
}

/// `<dir>-2`, `<dir>-3`, …: the first that does not exist.
fn free_dir(dir: &Path) -> PathBuf {
    (2u32..)
        .map(|k| PathBuf::from(format!("{}-{k}", dir.display())))
        .find(|d| !d.exists())
        .unwrap_or_else(|| dir.to_path_buf())
}

/// The task's base commit, or a permanent error saying it is gone.
fn base_commit<'r>(
    repo: &'r Repository,
    repo_path: &Path,
    base: &str,
) -> std::result::Result<git2::Commit<'r>, PrepareError> {
    Oid::from_str(base).and_then(|oid| repo.find_commit(oid)).map_err(|_| {
        permanent(format!(
            "the task's base commit {base} is not in '{}' (history rewritten?); submit the task \
             again from a commit that exists",
            repo_path.display()
        ))
    })
}

/// Keeps a done task's worktree as a spare for the next task of the same repository: HEAD is
/// detached at the tip of the task's `branch`, so the branch is free for anything else (a
/// merge, a follow-up) while the directory waits.
pub fn park_worktree(repo: &Path, dir: &Path, branch: &str) -> Result<()> {
    Checkout::open(repo, dir)?.park(branch)
}

/// Makes a spare worktree ready for task `task_id`: the task's new branch at `base`, checked out
/// with everything else in the directory (changes, untracked and ignored files) removed, as if
/// it had just been made. The directory is reused rather than made anew because the agent's
/// server has already set itself up for it.
pub fn reuse_worktree(
    repo_path: &Path,
    dir: &Path,
    base: &str,
    task_id: i64,
) -> std::result::Result<Prepared, PrepareError> {
    let checkout = Checkout::open(repo_path, dir)?;
    let repo = checkout.repo();
    let _lock = RepoLock::acquire(repo)?;
    let base_commit = base_commit(repo, repo_path, base)?;
    let branch = free_branch(repo, task_id, &base_commit)?;
    if repo.find_branch(&branch, BranchType::Local).is_err() {
        repo.branch(&branch, &base_commit, false).map_err(transient)?;
    }
    checkout.reset_to(&branch, &base_commit)?;
    Ok(Prepared { branch, dir: dir.to_path_buf(), created: true, repairs: vec![] })
}

/// Removes a worktree whose work is committed, and its registration; the branch stays.
pub fn remove_worktree(repo_path: &Path, dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .map_err(|e| Error::io(format!("removing worktree {}", dir.display()), e))?;
    }
    let repo = Repository::open(repo_path)?;
    let _lock = RepoLock::acquire(&repo).map_err(|e| Error::Repo(e.message))?;
    for reg in registrations(&repo).into_iter().filter(|r| same_path(&r.path, dir)) {
        // The registration only: the directory is gone, and libgit2 would remove the one the
        // registration names, which the agent can write.
        if let Ok(wt) = repo.find_worktree(&reg.name) {
            wt.prune(Some(WorktreePruneOptions::new().valid(true).working_tree(false)))?;
        }
    }
    Ok(())
}

pub(crate) fn signature(repo: &Repository) -> Result<Signature<'static>> {
    match repo.signature() {
        Ok(sig) => Ok(sig.to_owned()),
        Err(_) => Ok(Signature::now("TaskBridge", "taskbridge@localhost")?),
    }
}

/// Commits everything in `repo`'s worktree `dir` (new, changed and deleted files; ignored
/// files stay out) on the task's `branch`. Returns the new commit, or `None` when there was
/// nothing to commit.
pub fn commit_all(repo: &Path, dir: &Path, branch: &str, message: &str) -> Result<Option<String>> {
    Checkout::open(repo, dir)?.commit_all(branch, message)
}

/// The paths of `repo`'s working tree that differ from its HEAD (untracked ones included,
/// ignored ones not): what a task starting from a commit will not see.
pub fn uncommitted(repo: &Path) -> Result<Vec<String>> {
    let repo = Repository::open(repo)?;
    let mut opts = StatusOptions::new();
    opts.include_untracked(true).recurse_untracked_dirs(true).include_ignored(false);
    Ok(repo
        .statuses(Some(&mut opts))?
        .iter()
        .filter_map(|s| s.path().ok().map(str::to_owned))
        .collect())
}

/// Puts `repo`'s worktree `dir` back to the tip of `branch`, deleting untracked files, and
/// returns the paths that had changed. Used for read-only tasks.
pub fn revert_all(repo: &Path, dir: &Path, branch: &str) -> Result<Vec<String>> {
    Checkout::open(repo, dir)?.revert_all(branch)
}

pub use queue::{DiffStat, FileTouched};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkDiff {
    pub files: Vec<FileTouched>,
    pub patch: String,
    pub stat: DiffStat,
}

/// Everything that differs between `base` and `repo`'s worktree `dir` on `branch` as it is on
/// disk: commits on the branch, edits, and untracked files (not ignored ones), with renames
/// found.
pub fn diff_against_base(repo: &Path, dir: &Path, branch: &str, base: &str) -> Result<WorkDiff> {
    Checkout::open(repo, dir)?.diff_against(branch, base)
}

/// The diff from `base_tree` to the repository's working directory, through `_index` (the one
/// set on the repository).
fn diff_to_workdir(
    repo: &Repository,
    base_tree: &git2::Tree<'_>,
    _index: &git2::Index,
) -> Result<WorkDiff> {
    let mut opts = DiffOptions::new();
    // A file that became a symlink (or the reverse) is one change, not a deletion and an
    // addition of the same path.
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .show_untracked_content(true)
        .include_typechange(true);
    let mut diff = repo.diff_tree_to_workdir_with_index(Some(base_tree), Some(&mut opts))?;
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
pub(crate) mod tests {
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

    #[test]
    fn a_worktrees_git_directories_are_its_admin_directory_and_the_shared_objects() {
        let r = repo();
        let base = resolve_repo(r.path(), None).unwrap().base;
        let wt = tempfile::tempdir().unwrap();
        let dir = wt.path().join("task-4");
        prepare_worktree(r.path(), &base, 4, None, &dir, None).unwrap();
        let common = common_dir(r.path()).unwrap();
        assert!(same_path(&common, &r.path().join(".git")), "{}", common.display());
        let dirs = worktree_git_dirs(r.path(), &dir).unwrap();
        let admin = dirs.last().unwrap();
        assert!(admin.starts_with(common.join("worktrees")) && admin.join("HEAD").is_file());
        // Every fan-out directory of the object store and its packs, not the store itself
        // (whose `info/alternates` would send readers elsewhere).
        let objects = common.join("objects");
        assert_eq!(dirs.len(), 258, "{dirs:?}");
        assert!(dirs.iter().all(|d| d.parent() == Some(&objects) || d == admin), "{dirs:?}");
        assert!(dirs.contains(&objects.join("00")) && dirs.contains(&objects.join("ff")));
        assert!(dirs.contains(&objects.join("pack")) && objects.join("ab").is_dir());
        assert!(!dirs.contains(&objects) && !dirs.contains(&objects.join("info")));
        assert!(common_dir(wt.path()).is_err(), "not a repository");
    }

    pub(crate) fn repo() -> tempfile::TempDir {
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

    /// A worker killed while git wrote the task's branch leaves `<branch>.lock`; the next
    /// attempt removes it once it is clearly stale, and leaves a fresh one (a write going on).
    #[test]
    fn a_stale_lock_on_the_tasks_branch_is_removed_and_a_fresh_one_left() {
        let r = repo();
        let base = resolve_repo(r.path(), None).unwrap().base;
        let wt_root = tempfile::tempdir().unwrap();
        let heads = r.path().join(".git/refs/heads/taskbridge");
        std::fs::create_dir_all(&heads).unwrap();
        let lock = heads.join("task-3.lock");
        std::fs::write(&lock, "").unwrap();
        let err = prepare_worktree(r.path(), &base, 3, None, &wt_root.path().join("a"), None)
            .unwrap_err();
        assert!(!err.permanent && err.message.contains("lock"), "{}", err.message);
        assert!(lock.exists(), "a fresh lock is someone's write");

        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        std::fs::File::options().write(true).open(&lock).unwrap().set_modified(old).unwrap();
        let p =
            prepare_worktree(r.path(), &base, 3, None, &wt_root.path().join("b"), None).unwrap();
        assert_eq!(p.branch, "taskbridge/task-3");
        assert!(!lock.exists());
        assert!(p.repairs.iter().any(|r| r.contains("task-3.lock")), "{:?}", p.repairs);

        // Killed while committing in its worktree: the retry reuses the worktree, lock removed.
        std::fs::write(&lock, "").unwrap();
        std::fs::File::options().write(true).open(&lock).unwrap().set_modified(old).unwrap();
        let again = prepare_worktree(r.path(), &base, 3, Some(&p.branch), &p.dir, None).unwrap();
        assert!(!again.created && !lock.exists(), "{:?}", again.repairs);
    }

    #[test]
    fn worktree_diff_commit_and_removal_keep_the_branch() {
        let r = repo();
        let base = resolve_repo(r.path(), None).unwrap().base;
        let wt_root = tempfile::tempdir().unwrap();
        let wt = wt_root.path().join("task-1");
        let made = prepare_worktree(r.path(), &base, 1, None, &wt, None).unwrap();
        assert_eq!(made.branch, "taskbridge/task-1");
        assert!(made.created);
        // Reusing it is fine.
        assert!(!prepare_worktree(r.path(), &base, 1, None, &wt, None).unwrap().created);

        std::fs::write(wt.join("a.txt"), "one\nTWO\n").unwrap();
        std::fs::write(wt.join("new.txt"), "fresh\n").unwrap();
        std::fs::remove_file(wt.join("gone.txt")).unwrap();
        std::fs::rename(wt.join("old.txt"), wt.join("moved.txt")).unwrap();
        let (rp, b1) = (r.path(), "taskbridge/task-1");
        let d = diff_against_base(rp, &wt, b1, &base).unwrap();
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

        let commit = commit_all(rp, &wt, b1, "task 1").unwrap().unwrap();
        assert_eq!(commit_all(rp, &wt, b1, "again").unwrap(), None, "nothing left to commit");
        let after = diff_against_base(rp, &wt, b1, &base).unwrap();
        assert_eq!(after.stat, d.stat, "the committed diff is the same diff");
        remove_worktree(r.path(), &wt).unwrap();
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
        prepare_worktree(r.path(), &base, 2, None, &wt, None).unwrap();
        std::fs::write(wt.join("a.txt"), "changed\n").unwrap();
        std::fs::write(wt.join("junk.txt"), "junk\n").unwrap();
        let mut reverted = revert_all(r.path(), &wt, "taskbridge/task-2").unwrap();
        reverted.sort();
        assert_eq!(reverted, vec!["a.txt".to_string(), "junk.txt".to_string()]);
        assert!(
            diff_against_base(r.path(), &wt, "taskbridge/task-2", &base).unwrap().files.is_empty()
        );
    }

    fn prepared_ok(repo: &Path, base: &str, id: i64, wt: &Path) -> Prepared {
        let p = prepare_worktree(repo, base, id, None, wt, None).unwrap();
        assert_eq!(head_branch(repo, wt), Some(branch_name(id)));
        assert!(wt.join("a.txt").exists(), "the worktree is checked out");
        p
    }

    #[test]
    fn a_registration_left_without_a_checkout_is_repaired() {
        // What a kill between `git worktree add` registering the tree and finishing its checkout
        // leaves: a registration holding the branch, and a directory without `.git`.
        let r = repo();
        let base = resolve_repo(r.path(), None).unwrap().base;
        let root = tempfile::tempdir().unwrap();
        let wt = root.path().join("task-4");
        git(
            r.path(),
            &[
                "worktree",
                "add",
                "--no-checkout",
                wt.to_str().unwrap(),
                "-b",
                "taskbridge/task-4",
                &base,
            ],
        );
        std::fs::remove_file(wt.join(".git")).unwrap();
        let p = prepared_ok(r.path(), &base, 4, &wt);
        assert!(p.created);
        assert!(
            p.repairs.iter().any(|m| m.contains("stale worktree registration 'task-4'")),
            "{p:?}"
        );
    }

    #[test]
    fn a_registered_worktree_whose_directory_is_gone_is_made_again() {
        let r = repo();
        let base = resolve_repo(r.path(), None).unwrap().base;
        let root = tempfile::tempdir().unwrap();
        let wt = root.path().join("task-5");
        prepare_worktree(r.path(), &base, 5, None, &wt, None).unwrap();
        std::fs::remove_dir_all(&wt).unwrap();
        assert!(prepared_ok(r.path(), &base, 5, &wt).created);
        // And when only its `.git` went missing: the base files alone are not work to keep.
        std::fs::remove_file(wt.join(".git")).unwrap();
        let p = prepared_ok(r.path(), &base, 5, &wt);
        assert!(p.repairs.iter().any(|m| m.contains("removed the half-made worktree")), "{p:?}");
    }

    #[test]
    fn a_checkout_cut_short_is_made_again_not_committed_as_deletions() {
        let r = repo();
        let base = resolve_repo(r.path(), None).unwrap().base;
        let root = tempfile::tempdir().unwrap();
        let wt = root.path().join("task-9");
        prepare_worktree(r.path(), &base, 9, None, &wt, None).unwrap();
        // Registered, `.git` in place, but the checkout stopped before the files and the index.
        let admin = Repository::open(&wt).unwrap().path().to_path_buf();
        std::fs::remove_file(admin.join("index")).unwrap();
        std::fs::remove_file(wt.join("gone.txt")).unwrap();
        let p = prepared_ok(r.path(), &base, 9, &wt);
        assert!(p.created, "made again: {p:?}");
        assert!(wt.join("gone.txt").exists());
        assert!(diff_against_base(r.path(), &wt, &p.branch, &base).unwrap().files.is_empty());
    }

    #[test]
    fn a_directory_holding_files_of_its_own_is_kept_aside_not_deleted() {
        let r = repo();
        let base = resolve_repo(r.path(), None).unwrap().base;
        let root = tempfile::tempdir().unwrap();
        let wt = root.path().join("task-6");
        std::fs::create_dir_all(wt.join("src")).unwrap();
        std::fs::write(wt.join("src/work.rs"), "fn precious() {}\n").unwrap();
        std::fs::write(wt.join("a.txt"), "edited\n").unwrap();
        let p = prepared_ok(r.path(), &base, 6, &wt);
        let msg = p.repairs.iter().find(|m| m.contains("kept them at")).expect("named in the log");
        let aside = PathBuf::from(msg.rsplit("kept them at ").next().unwrap());
        assert_eq!(
            std::fs::read_to_string(aside.join("src/work.rs")).unwrap(),
            "fn precious() {}\n"
        );
        assert_eq!(std::fs::read_to_string(aside.join("a.txt")).unwrap(), "edited\n");
    }

    #[test]
    fn the_branch_in_a_stale_worktree_is_freed_but_a_live_one_is_stepped_around() {
        let r = repo();
        let base = resolve_repo(r.path(), None).unwrap().base;
        let root = tempfile::tempdir().unwrap();
        let other = root.path().join("elsewhere");
        git(
            r.path(),
            &["worktree", "add", other.to_str().unwrap(), "-b", "taskbridge/task-7", &base],
        );
        let wt = root.path().join("task-7");
        // A task that recorded this branch: live elsewhere (another home's worktree), it is not
        // touched, and this attempt starts afresh on a branch of its own, saying so.
        let p = prepare_worktree(r.path(), &base, 7, Some("taskbridge/task-7"), &wt, None).unwrap();
        assert_eq!(p.branch, "taskbridge/task-7-2");
        assert!(p.repairs.iter().any(|r| r.contains("starts afresh on taskbridge/task-7-2")));
        assert!(other.join("a.txt").exists());
        // Stale: its directory is gone, so the branch is the task's to check out again.
        std::fs::remove_dir_all(&other).unwrap();
        let wt2 = root.path().join("task-7-again");
        let p =
            prepare_worktree(r.path(), &base, 7, Some("taskbridge/task-7"), &wt2, None).unwrap();
        assert_eq!(p.branch, "taskbridge/task-7");
    }

    #[test]
    fn a_registration_a_kill_cut_short_inside_worktree_add_is_cleared() {
        // `git worktree add` writes the admin directory's files one by one; a worker killed in
        // between leaves any prefix of them, and libgit2 no longer lists such a directory but
        // still refuses its name ("directory exists") and, once HEAD is written, the branch.
        let r = repo();
        let base = resolve_repo(r.path(), None).unwrap().base;
        let root = tempfile::tempdir().unwrap();
        let admin = r.path().join(".git/worktrees/taskbridge-task-4");
        let common = common_dir(r.path()).unwrap();
        for keep in [
            &[][..],
            &["HEAD"][..],
            &["gitdir"][..],
            &["commondir"][..],
            &["HEAD", "commondir"][..],
            &["gitdir", "HEAD"][..],
            &["gitdir", "commondir"][..],
        ] {
            let wt = root.path().join("task-4");
            prepare_worktree(r.path(), &base, 4, None, &wt, None).unwrap();
            std::fs::remove_dir_all(&wt).unwrap();
            for f in ["gitdir", "HEAD", "commondir", "index", "ORIG_HEAD", "logs", "refs"] {
                if !keep.contains(&f) {
                    let p = admin.join(f);
                    let _ = std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir_all(&p));
                }
            }
            let p = prepare_worktree(r.path(), &base, 4, Some("taskbridge/task-4"), &wt, None)
                .unwrap_or_else(|e| panic!("with {keep:?} left: {e:?}"));
            assert_eq!(p.branch, "taskbridge/task-4", "with {keep:?} left");
            assert!(opens(&common, &wt), "with {keep:?} left");
        }
    }

    #[test]
    fn a_task_whose_worktree_name_a_reused_spare_holds_gets_another_name() {
        // Task 4's worktree was parked as a spare and handed to task 5 before task 4's end was
        // recorded (its worker was killed in between): task 4 runs again while a live worktree
        // on task 5's branch holds the name its own would get.
        let r = repo();
        let base = resolve_repo(r.path(), None).unwrap().base;
        let root = tempfile::tempdir().unwrap();
        let spare = root.path().join("task-4");
        prepare_worktree(r.path(), &base, 4, None, &spare, None).unwrap();
        park_worktree(r.path(), &spare, "taskbridge/task-4").unwrap();
        assert_eq!(reuse_worktree(r.path(), &spare, &base, 5).unwrap().branch, "taskbridge/task-5");
        let again = root.path().join("task-4-again");
        let p =
            prepare_worktree(r.path(), &base, 4, Some("taskbridge/task-4"), &again, None).unwrap();
        assert_eq!(p.branch, "taskbridge/task-4");
        let common = common_dir(r.path()).unwrap();
        assert!(opens(&common, &again) && opens(&common, &spare), "both worktrees stand");
    }

    #[test]
    fn a_first_run_never_takes_a_branch_that_holds_other_work() {
        // A database started afresh counts from 1 again, and another home may share the
        // repository: their `taskbridge/task-1` is not this task's.
        let r = repo();
        let base = resolve_repo(r.path(), None).unwrap().base;
        let root = tempfile::tempdir().unwrap();
        let old = root.path().join("old-task-1");
        let first = prepare_worktree(r.path(), &base, 1, None, &old, None).unwrap();
        std::fs::write(old.join("a.txt"), "someone else's work\n").unwrap();
        commit_all(r.path(), &old, &first.branch, "old work").unwrap();
        remove_worktree(r.path(), &old).unwrap();
        let wt = root.path().join("task-1");
        let p = prepare_worktree(r.path(), &base, 1, None, &wt, None).unwrap();
        assert_eq!(
            (first.branch.as_str(), p.branch.as_str()),
            ("taskbridge/task-1", "taskbridge/task-1-2")
        );
        assert_eq!(std::fs::read_to_string(wt.join("a.txt")).unwrap(), "one\ntwo\n");
        // The same when the other one is checked out in a live worktree at the base.
        let live = root.path().join("live");
        prepare_worktree(r.path(), &base, 3, None, &live, None).unwrap();
        let p =
            prepare_worktree(r.path(), &base, 3, None, &root.path().join("task-3"), None).unwrap();
        assert_eq!(p.branch, "taskbridge/task-3-2");
        // But a branch left exactly at the base and checked out nowhere (a first attempt killed
        // before it was recorded) is taken: it holds nothing.
        let repo = Repository::open(r.path()).unwrap();
        repo.branch(
            "taskbridge/task-5",
            &repo.find_commit(Oid::from_str(&base).unwrap()).unwrap(),
            false,
        )
        .unwrap();
        let p =
            prepare_worktree(r.path(), &base, 5, None, &root.path().join("task-5"), None).unwrap();
        assert_eq!(p.branch, "taskbridge/task-5");
    }

    #[test]
    fn causes_no_retry_can_change_fail_at_once_and_say_which() {
        let r = repo();
        let root = tempfile::tempdir().unwrap();
        let wt = root.path().join("task-8");
        let unknown = "1234567890123456789012345678901234567890";
        let e = prepare_worktree(r.path(), unknown, 8, None, &wt, None).unwrap_err();
        assert!(e.permanent && e.message.contains("base commit"), "{e}");
        let e =
            prepare_worktree(&root.path().join("gone"), unknown, 8, None, &wt, None).unwrap_err();
        assert!(e.permanent && e.message.contains("no longer exists"), "{e}");
    }

    #[test]
    fn many_worktrees_started_at_once_on_a_fresh_repository_all_succeed() {
        // libgit2 creates `.git/worktrees` without tolerating a concurrent creator; several
        // rounds, since the race needs the first creations to overlap.
        for _ in 0..30 {
            let r = repo();
            let base = resolve_repo(r.path(), None).unwrap().base;
            let root = tempfile::tempdir().unwrap();
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(12));
            let handles: Vec<_> = (1..=12)
                .map(|id| {
                    let (repo, base, barrier) =
                        (r.path().to_path_buf(), base.clone(), barrier.clone());
                    let wt = root.path().join(format!("task-{id}"));
                    std::thread::spawn(move || {
                        barrier.wait();
                        prepare_worktree(&repo, &base, id, None, &wt, None)
                    })
                })
                .collect();
            for h in handles {
                let p = h.join().unwrap().unwrap();
                assert!(p.created);
            }
        }
    }

    pub(crate) fn head_of(dir: &Path, rev: &str) -> String {
        let out = Command::new("git").args(["rev-parse", rev]).current_dir(dir).output().unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// A commit on a new branch `name` from `from`, writing `file`; the main checkout stays put.
    fn branch_commit(repo: &Path, name: &str, from: &str, file: &str, text: &str) -> String {
        let root = tempfile::tempdir().unwrap();
        let wt = root.path().join(name);
        git(repo, &["worktree", "add", "-q", "-b", name, wt.to_str().unwrap(), from]);
        std::fs::write(wt.join(file), text).unwrap();
        git(&wt, &["add", "."]);
        git(&wt, &["commit", "-qm", name]);
        let c = head_of(&wt, "HEAD");
        git(repo, &["worktree", "remove", "--force", wt.to_str().unwrap()]);
        c
    }

    fn parents(repo: &Path, commit: &str) -> Vec<String> {
        let r = Repository::open(repo).unwrap();
        let c = r.find_commit(Oid::from_str(commit).unwrap()).unwrap();
        c.parent_ids().map(|p| p.to_string()).collect()
    }

    #[test]
    fn resolve_names_the_branch_head_is_on_or_the_one_given_and_no_other() {
        let r = repo();
        let head = head_of(r.path(), "HEAD");
        assert_eq!(resolve_repo(r.path(), None).unwrap().branch.as_deref(), Some("main"));
        assert_eq!(resolve_repo(r.path(), Some("main")).unwrap().branch.as_deref(), Some("main"));
        let by_commit = resolve_repo(r.path(), Some(&head)).unwrap();
        assert_eq!((by_commit.base.as_str(), by_commit.branch), (head.as_str(), None));
        git(r.path(), &["tag", "v1"]);
        assert_eq!(resolve_repo(r.path(), Some("v1")).unwrap().branch, None);
        git(r.path(), &["checkout", "-q", "--detach"]);
        let detached = resolve_repo(r.path(), None).unwrap();
        assert_eq!((detached.base, detached.branch), (head, None));
        // In a repository without commits, a named ref is unknown, not "no commits yet".
        let empty = tempfile::tempdir().unwrap();
        git(empty.path(), &["init", "-q"]);
        let err = resolve_repo(empty.path(), Some("feature")).unwrap_err().to_string();
        assert!(err.contains("unknown ref 'feature'"), "{err}");
    }

    #[test]
    fn the_root_named_for_a_refused_repository_is_the_one_holding_git() {
        let r = repo();
        let deep = r.path().join("src/deep");
        std::fs::create_dir_all(&deep).unwrap();
        let top = r.path().canonicalize().unwrap();
        assert_eq!(owned_repository_root(&deep), top);
        assert_eq!(owned_repository_root(r.path()), top);
        // The nearest one: a repository inside another is its own.
        let inner = deep.join("vendored");
        std::fs::create_dir(&inner).unwrap();
        git(&inner, &["init", "-q"]);
        assert_eq!(owned_repository_root(&inner), inner.canonicalize().unwrap());
    }

    #[test]
    fn head_branch_is_the_checked_out_branch_only() {
        let r = repo();
        let root = tempfile::tempdir().unwrap();
        let wt = root.path().join("wt");
        git(r.path(), &["worktree", "add", "-q", "-b", "feature/x", wt.to_str().unwrap()]);
        assert_eq!(head_branch(r.path(), &wt).as_deref(), Some("feature/x"));
        git(&wt, &["checkout", "-q", "--detach"]);
        assert_eq!(head_branch(r.path(), &wt), None);
        assert_eq!(head_branch(r.path(), tempfile::tempdir().unwrap().path()), None);
        // The main checkout is no linked worktree of its own.
        assert_eq!(head_branch(r.path(), r.path()), None);
    }

    #[test]
    fn stacking_takes_the_newest_of_a_line_and_merges_work_that_diverged() {
        let r = repo();
        let base = head_of(r.path(), "HEAD");
        let a = branch_commit(r.path(), "a", &base, "a-only.txt", "a\n");
        let a2 = branch_commit(r.path(), "a2", &a, "a2-only.txt", "a2\n");
        let b = branch_commit(r.path(), "b", &base, "b-only.txt", "b\n");
        let s = |cs: &[&String]| {
            let cs: Vec<String> = cs.iter().map(|c| c.to_string()).collect();
            stack_start(r.path(), &cs, "stack").unwrap()
        };
        assert_eq!(s(&[]), Ok(None));
        assert_eq!(s(&[&a]), Ok(Some(a.clone())));
        assert_eq!(s(&[&a, &a]), Ok(Some(a.clone())), "the same work twice adds nothing");
        assert_eq!(s(&[&a, &a2]), Ok(Some(a2.clone())), "a descendant contains its ancestor");
        assert_eq!(s(&[&a2, &a]), Ok(Some(a2.clone())), "in either order");
        let merged = s(&[&a, &b]).unwrap().unwrap();
        assert_eq!(parents(r.path(), &merged), vec![a.clone(), b.clone()]);
        let wt_root = tempfile::tempdir().unwrap();
        let wt = wt_root.path().join("task-9");
        prepare_worktree(r.path(), &merged, 9, None, &wt, None).unwrap();
        assert!(wt.join("a-only.txt").exists() && wt.join("b-only.txt").exists());
    }

    #[test]
    fn stacking_work_that_conflicts_names_the_paths_and_what_was_merged_before() {
        let r = repo();
        let base = head_of(r.path(), "HEAD");
        let a = branch_commit(r.path(), "a", &base, "a.txt", "one\nA\n");
        let c = branch_commit(r.path(), "c", &base, "c.txt", "c\n");
        let b = branch_commit(r.path(), "b", &base, "a.txt", "one\nB\n");
        let got = stack_start(r.path(), &[a, c, b], "stack").unwrap();
        assert_eq!(
            got,
            Err(StackConflict { merged: vec![0, 1], with: 2, paths: vec!["a.txt".into()] })
        );
    }

    #[test]
    fn merge_fast_forwards_the_checked_out_branch_and_its_files() {
        let r = repo();
        let base = head_of(r.path(), "HEAD");
        let work = branch_commit(r.path(), "work", &base, "a.txt", "one\nWORK\n");
        let m = merge_into(r.path(), &work, "main", false, "merge").unwrap();
        assert_eq!((m.commit.as_str(), m.how), (work.as_str(), "fast-forward"));
        assert_eq!(
            m.checkout.map(|p| p.canonicalize().unwrap()),
            Some(r.path().canonicalize().unwrap())
        );
        assert_eq!(head_of(r.path(), "main"), work);
        assert_eq!(std::fs::read_to_string(r.path().join("a.txt")).unwrap(), "one\nWORK\n");
        let err = merge_into(r.path(), &work, "main", false, "merge").unwrap_err();
        assert!(err.contains("already contains this work"), "{err}");
        let err = merge_into(r.path(), &base, "main", false, "merge").unwrap_err();
        assert!(err.contains("already contains this work"), "{err}");
        let err = merge_into(r.path(), &work, "nope", false, "merge").unwrap_err();
        assert!(err.contains("there is no branch 'nope'"), "{err}");
    }

    #[test]
    fn merge_of_diverged_work_makes_a_merge_or_one_squashed_commit() {
        let r = repo();
        let base = head_of(r.path(), "HEAD");
        let work = branch_commit(r.path(), "work", &base, "w.txt", "w\n");
        let other = branch_commit(r.path(), "target", &base, "t.txt", "t\n");
        // A worktree on another branch is not where the target is checked out.
        let root = tempfile::tempdir().unwrap();
        let bystander = root.path().join("bystander");
        git(r.path(), &["worktree", "add", "-q", "-b", "by", bystander.to_str().unwrap(), &base]);
        let m = merge_into(r.path(), &work, "target", false, "merge").unwrap();
        assert_eq!((m.how, m.checkout), ("merge", None));
        assert!(!bystander.join("w.txt").exists() && head_of(&bystander, "HEAD") == base);
        assert_eq!(head_of(r.path(), "target"), m.commit);
        assert_eq!(parents(r.path(), &m.commit), vec![other.clone(), work.clone()]);
        git(r.path(), &["branch", "-f", "target2", &other]);
        let s = merge_into(r.path(), &work, "target2", true, "squash").unwrap();
        assert_eq!(s.how, "squash");
        assert_eq!(parents(r.path(), &s.commit), vec![other.clone()]);
        assert_eq!(file_at(r.path(), &s.commit, "w.txt").unwrap().as_deref(), Some("w\n"));
        // Squash never fast-forwards: the work is one new commit on the branch.
        git(r.path(), &["branch", "-f", "behind", &base]);
        let s = merge_into(r.path(), &work, "behind", true, "squash").unwrap();
        assert_eq!(s.how, "squash");
        assert_eq!(parents(r.path(), &s.commit), vec![base.clone()]);
        // The main checkout, on another branch, is untouched.
        assert_eq!(head_of(r.path(), "main"), base);
        assert!(!r.path().join("w.txt").exists());
    }

    #[test]
    fn merge_refuses_a_dirty_checkout_or_a_conflict_and_changes_nothing() {
        let r = repo();
        let base = head_of(r.path(), "HEAD");
        let work = branch_commit(r.path(), "work", &base, "a.txt", "one\nWORK\n");
        std::fs::write(r.path().join("gone.txt"), "edited\n").unwrap();
        let err = merge_into(r.path(), &work, "main", false, "merge").unwrap_err();
        assert!(err.contains("uncommitted changes to gone.txt"), "{err}");
        assert_eq!(head_of(r.path(), "main"), base);
        git(r.path(), &["checkout", "-q", "gone.txt"]);
        let theirs = branch_commit(r.path(), "target", &base, "a.txt", "one\nOTHER\n");
        let err = merge_into(r.path(), &work, "target", false, "merge").unwrap_err();
        assert!(err.contains("conflicts in a.txt"), "{err}");
        assert_eq!(head_of(r.path(), "target"), theirs);
    }

    #[test]
    fn merge_into_a_branch_a_linked_worktree_has_checked_out_updates_that_worktree() {
        let r = repo();
        let base = head_of(r.path(), "HEAD");
        let work = branch_commit(r.path(), "work", &base, "a.txt", "one\nWORK\n");
        let root = tempfile::tempdir().unwrap();
        let linked = root.path().join("release");
        git(r.path(), &["worktree", "add", "-q", "-b", "release", linked.to_str().unwrap(), &base]);
        std::fs::write(linked.join("a.txt"), "dirty\n").unwrap();
        let err = merge_into(r.path(), &work, "release", false, "merge").unwrap_err();
        assert!(err.contains("checked out in") && err.contains("a.txt"), "{err}");
        assert_eq!(head_of(r.path(), "release"), base);
        git(&linked, &["checkout", "-q", "a.txt"]);
        // A configuration of the worktree's own (which could name another working directory)
        // is not followed: the merge refuses and changes nothing.
        let own_config = r.path().join(".git/worktrees/release/config.worktree");
        std::fs::write(&own_config, "[core]\n\tworktree = /elsewhere\n").unwrap();
        let err = merge_into(r.path(), &work, "release", false, "merge").unwrap_err();
        assert!(err.contains("tampered") && err.contains("configuration of its own"), "{err}");
        assert_eq!(head_of(r.path(), "release"), base);
        std::fs::remove_file(&own_config).unwrap();
        let m = merge_into(r.path(), &work, "release", false, "merge").unwrap();
        assert_eq!(m.how, "fast-forward");
        assert!(m.checkout.is_some_and(|p| same_path(&p, &linked)));
        assert_eq!(std::fs::read_to_string(linked.join("a.txt")).unwrap(), "one\nWORK\n");
        assert_eq!(head_of(&linked, "HEAD"), work);
        // The index followed: the worktree shows no change.
        assert!(uncommitted(&linked).unwrap().is_empty());
        // The main checkout is untouched.
        assert_eq!(std::fs::read_to_string(r.path().join("a.txt")).unwrap(), "one\ntwo\n");
    }

    #[test]
    fn small_helpers_say_what_their_names_say() {
        assert_eq!(worktree_name("taskbridge/task-3"), "taskbridge-task-3");
        assert!(is_task_branch("taskbridge/task-3", 3));
        assert!(is_task_branch("taskbridge/task-3-2", 3));
        assert!(!is_task_branch("taskbridge/task-3-x", 3));
        assert!(!is_task_branch("taskbridge/task-31", 3));
        assert!(!is_task_branch("main", 3));
        assert_eq!(permanent("the repo is gone".into()).to_string(), "the repo is gone");
        let d = tempfile::tempdir().unwrap();
        let gone = d.path().join("gone");
        assert!(same_path(&gone, &gone), "a path that does not exist is itself");
        std::os::unix::fs::symlink(d.path(), d.path().join("link")).unwrap();
        assert!(same_path(&d.path().join("link"), d.path()), "through a symlink");
        assert!(!same_path(&gone, d.path()));
        let x = d.path().join("x");
        assert_eq!(free_dir(&x), d.path().join("x-2"));
        std::fs::create_dir(d.path().join("x-2")).unwrap();
        assert_eq!(free_dir(&x), d.path().join("x-3"));
    }

    #[test]
    fn only_a_linked_worktree_as_git_made_it_counts_as_one_that_opens() {
        let r = repo();
        let common = common_dir(r.path()).unwrap();
        let root = tempfile::tempdir().unwrap();
        let wt = root.path().join("wt");
        git(r.path(), &["worktree", "add", "-q", "-b", "x", wt.to_str().unwrap()]);
        assert!(opens(&common, &wt) && is_worktree(&wt));
        // The main checkout is a repository, not one of its linked worktrees.
        assert!(!opens(&common, r.path()) && is_worktree(r.path()));
        let plain = tempfile::tempdir().unwrap();
        assert!(!opens(&common, plain.path()) && !is_worktree(plain.path()));
        // A bare repository is no checkout.
        git(plain.path(), &["init", "-q", "--bare"]);
        assert!(!opens(&common, plain.path()));
        // A `.git` that leads nowhere is there but does not open.
        let broken = tempfile::tempdir().unwrap();
        std::fs::write(broken.path().join(".git"), "gitdir: /nowhere/at/all\n").unwrap();
        assert!(is_worktree(broken.path()) && !opens(&common, broken.path()));
    }

    #[test]
    fn uncommitted_lists_changes_and_new_files_but_not_ignored_ones() {
        let r = repo();
        assert!(uncommitted(r.path()).unwrap().is_empty());
        std::fs::write(r.path().join(".gitignore"), "*.log\n").unwrap();
        git(r.path(), &["add", ".gitignore"]);
        git(r.path(), &["commit", "-qm", "ignore"]);
        std::fs::write(r.path().join("a.txt"), "changed\n").unwrap();
        std::fs::create_dir(r.path().join("new")).unwrap();
        std::fs::write(r.path().join("new/file.txt"), "x\n").unwrap();
        std::fs::write(r.path().join("build.log"), "noise\n").unwrap();
        let mut got = uncommitted(r.path()).unwrap();
        got.sort();
        assert_eq!(got, vec!["a.txt".to_string(), "new/file.txt".to_string()]);
    }

    #[test]
    fn a_parked_worktree_is_detached_at_its_commit_and_frees_its_branch() {
        let r = repo();
        let base = head_of(r.path(), "HEAD");
        let root = tempfile::tempdir().unwrap();
        let wt = root.path().join("task-3");
        prepare_worktree(r.path(), &base, 3, None, &wt, None).unwrap();
        std::fs::write(wt.join("a.txt"), "work\n").unwrap();
        let commit = commit_all(r.path(), &wt, "taskbridge/task-3", "work").unwrap().unwrap();
        park_worktree(r.path(), &wt, "taskbridge/task-3").unwrap();
        assert_eq!(head_branch(r.path(), &wt), None);
        assert_eq!(head_of(&wt, "HEAD"), commit);
        // The branch is free: it can be checked out elsewhere.
        let other = root.path().join("other");
        git(r.path(), &["worktree", "add", "-q", other.to_str().unwrap(), "taskbridge/task-3"]);
    }

    #[test]
    fn file_at_reads_a_commits_file_or_says_there_is_none() {
        let r = repo();
        let head = head_of(r.path(), "HEAD");
        assert_eq!(file_at(r.path(), &head, "a.txt").unwrap().as_deref(), Some("one\ntwo\n"));
        assert_eq!(file_at(r.path(), &head, "missing.txt").unwrap(), None);
    }

    #[test]
    fn a_file_turned_into_a_symlink_is_a_typechange() {
        let r = repo();
        let base = head_of(r.path(), "HEAD");
        let root = tempfile::tempdir().unwrap();
        let wt = root.path().join("task-6");
        prepare_worktree(r.path(), &base, 6, None, &wt, None).unwrap();
        std::fs::remove_file(wt.join("a.txt")).unwrap();
        std::os::unix::fs::symlink("gone.txt", wt.join("a.txt")).unwrap();
        let d = diff_against_base(r.path(), &wt, "taskbridge/task-6", &base).unwrap();
        let got: Vec<(&str, &str)> =
            d.files.iter().map(|f| (f.path.as_str(), f.status.as_str())).collect();
        assert_eq!(got, vec![("a.txt", "typechange")]);
    }

    fn registration_names(repo: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(repo.join(".git/worktrees"))
            .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    #[test]
    fn another_tasks_live_worktree_is_left_alone_and_changes_nothing_for_this_one() {
        let r = repo();
        let base = head_of(r.path(), "HEAD");
        let root = tempfile::tempdir().unwrap();
        let one = root.path().join("task-1");
        prepare_worktree(r.path(), &base, 1, None, &one, None).unwrap();
        let two = root.path().join("task-2");
        let p = prepare_worktree(r.path(), &base, 2, None, &two, None).unwrap();
        assert_eq!((p.branch.as_str(), p.repairs.len()), ("taskbridge/task-2", 0), "{p:?}");
        let common = common_dir(r.path()).unwrap();
        assert!(opens(&common, &one) && opens(&common, &two));
        assert_eq!(registration_names(r.path()), vec!["taskbridge-task-1", "taskbridge-task-2"]);
        // Each is reused by its own task, on the branch it recorded, and by no other.
        let again = prepare_worktree(r.path(), &base, 1, Some("taskbridge/task-1"), &one, None);
        assert!(!again.unwrap().created, "reused");
        let wrong =
            prepare_worktree(r.path(), &base, 1, Some("taskbridge/task-1-2"), &two, None).unwrap();
        assert!(
            wrong.created && wrong.dir != two,
            "task 2's worktree is stepped around: {wrong:?}"
        );
        assert!(opens(&common, &two));
        assert_eq!(head_branch(r.path(), &two).as_deref(), Some("taskbridge/task-2"));
    }

    #[test]
    fn stale_registrations_at_the_directory_or_under_the_name_are_removed_and_said() {
        let r = repo();
        let base = head_of(r.path(), "HEAD");
        let root = tempfile::tempdir().unwrap();
        let wt = root.path().join("task-5");
        // One registered at the task's directory (another branch, another name), one under the
        // name the task's worktree gets (another directory): both directories are gone.
        git(r.path(), &["worktree", "add", "-q", "-b", "old", wt.to_str().unwrap(), &base]);
        let named = root.path().join("taskbridge-task-5");
        git(r.path(), &["worktree", "add", "-q", "-b", "older", named.to_str().unwrap(), &base]);
        std::fs::remove_dir_all(&wt).unwrap();
        std::fs::remove_dir_all(&named).unwrap();
        assert_eq!(registration_names(r.path()), vec!["task-5", "taskbridge-task-5"]);
        let p = prepare_worktree(r.path(), &base, 5, None, &wt, None).unwrap();
        assert!(p.repairs.iter().any(|m| m.ends_with("registration 'task-5'")), "{p:?}");
        assert!(p.repairs.iter().any(|m| m.ends_with("registration 'taskbridge-task-5'")), "{p:?}");
        assert_eq!(registration_names(r.path()), vec!["taskbridge-task-5"], "the task's own");
        assert!(opens(&common_dir(r.path()).unwrap(), &wt));
        assert_eq!(head_branch(r.path(), &wt).as_deref(), Some("taskbridge/task-5"));
    }

    #[test]
    fn a_half_made_checkout_of_the_base_is_removed_not_kept_aside() {
        let r = repo();
        let base = head_of(r.path(), "HEAD");
        let root = tempfile::tempdir().unwrap();
        let wt = root.path().join("task-8");
        std::fs::create_dir(&wt).unwrap();
        std::fs::write(wt.join("a.txt"), "one\ntwo\n").unwrap();
        let p = prepared_ok(r.path(), &base, 8, &wt);
        assert!(p.repairs.iter().any(|m| m.starts_with("removed the half-made worktree")), "{p:?}");
        let beside: Vec<_> = std::fs::read_dir(root.path()).unwrap().flatten().collect();
        assert_eq!(beside.len(), 1, "nothing kept aside");
    }
}
