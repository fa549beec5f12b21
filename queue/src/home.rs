//! Where TaskBridge keeps its files, and the private permissions they are created with.

use crate::error::{Error, Result};
use std::fs::{self, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The one directory that holds everything TaskBridge keeps: the database, task logs and
/// worktrees. Resolved from `--home`, else `TASKBRIDGE_HOME`, else `$XDG_DATA_HOME/taskbridge`
/// (`~/.local/share/taskbridge`).
#[derive(Debug, Clone)]
pub struct Home {
    root: PathBuf,
}

impl Home {
    /// The home at `root` (relative to the current directory unless absolute).
    pub fn at(root: impl Into<PathBuf>) -> Result<Home> {
        Home::resolve(Some(root.into()), &crate::Environment::default())
    }

    /// Resolves the home directory from an explicit choice or the environment.
    pub fn resolve(explicit: Option<PathBuf>, env: &crate::Environment) -> Result<Home> {
        let root = explicit
            .or_else(|| env.path("TASKBRIDGE_HOME"))
            .or_else(|| env.path("XDG_DATA_HOME").map(|d| d.join("taskbridge")))
            .or_else(|| env.home_dir().map(|h| h.join(".local/share/taskbridge")))
            .ok_or_else(|| Error::Io {
                context: "cannot find a home directory; set TASKBRIDGE_HOME or pass --home".into(),
                source: std::io::Error::from(ErrorKind::NotFound),
            })?;
        let root = if root.is_absolute() {
            root
        } else {
            std::env::current_dir()
                .map_err(|e| Error::Io {
                    context: "reading the current directory".into(),
                    source: e,
                })?
                .join(root)
        };
        Ok(Home { root })
    }

    /// Creates the directory tree (0700) if it does not exist yet.
    pub fn ensure(&self) -> Result<()> {
        for dir in [self.root.clone(), self.logs_dir(), self.worktrees_dir()] {
            create_private_dir(&dir)?;
        }
        Ok(())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn db_path(&self) -> PathBuf {
        self.root.join("taskbridge.db")
    }
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn worktrees_dir(&self) -> PathBuf {
        self.root.join("worktrees")
    }
    /// The 0600 file that gives a process this worker starts (the reverse bridge) the queue's
    /// URL, so that the password is in no command line.
    pub fn db_url_file(&self, location: &crate::Location) -> PathBuf {
        self.root.join(format!("db-{}.url", location.key()))
    }
}

/// The directory a repository's worktrees share inside a queue's worktrees directory: its name
/// and a hash of its path, `demo-1a2b3c4d`. One directory per repository is what lets one wall
/// hold the warm server of that repository's tasks (see `worker/src/run/wall.rs`).
pub fn repo_dir_name(repo: &Path) -> String {
    let name = repo.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let name: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' })
        .collect();
    format!("{name}-{}", crate::location::short_hash(&repo.display().to_string()))
}

/// Creates a directory (and its parents) with mode 0700; an existing one is tightened to 0700.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    let io =
        |source| Error::Io { context: format!("creating directory {}", dir.display()), source };
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io)?;
    let mode = fs::metadata(dir).map_err(io)?.permissions().mode();
    if mode & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io)?;
    }
    Ok(())
}

/// Creates `path` with mode 0600 if it does not exist (before SQLite or anyone else opens it,
/// so it is never briefly readable by others); an existing file is tightened to 0600.
pub fn create_private_file(path: &Path) -> Result<()> {
    let io = |source| Error::Io { context: format!("creating {}", path.display()), source };
    match OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            let mode = fs::metadata(path).map_err(io)?.permissions().mode();
            if mode & 0o077 != 0 {
                tracing::warn!(path = %path.display(), "tightening permissions to 0600");
                fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(io)?;
            }
            Ok(())
        }
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Environment;

    #[test]
    fn a_repositorys_directory_is_its_name_and_a_hash_of_its_path() {
        let a = repo_dir_name(Path::new("/src/demo"));
        assert!(a.starts_with("demo-") && a.len() == "demo-".len() + 8, "{a}");
        assert_ne!(a, repo_dir_name(Path::new("/other/demo")), "two repositories named alike");
        assert_eq!(a, repo_dir_name(Path::new("/src/demo")), "stable");
        assert!(repo_dir_name(Path::new("/src/my repo@x")).starts_with("my_repo_x-"));
    }

    #[test]
    fn the_home_is_the_flag_else_taskbridge_home_else_xdg_data_home_else_under_home() {
        let env = |vars: &[(&str, &str)]| Environment::from_vars(vars.iter().copied());
        let root = |explicit: Option<&str>, e: &Environment| {
            Home::resolve(explicit.map(PathBuf::from), e).map(|h| h.root().to_path_buf())
        };
        let all = env(&[("TASKBRIDGE_HOME", "/t"), ("XDG_DATA_HOME", "/x"), ("HOME", "/h")]);
        assert_eq!(root(Some("/flag"), &all).unwrap(), Path::new("/flag"));
        assert_eq!(root(None, &all).unwrap(), Path::new("/t"));
        let xdg = env(&[("TASKBRIDGE_HOME", ""), ("XDG_DATA_HOME", "/x"), ("HOME", "/h")]);
        assert_eq!(root(None, &xdg).unwrap(), Path::new("/x/taskbridge"), "empty is unset");
        let home = env(&[("XDG_DATA_HOME", ""), ("HOME", "/h")]);
        assert_eq!(root(None, &home).unwrap(), Path::new("/h/.local/share/taskbridge"));
        let e = root(None, &Environment::default()).unwrap_err().to_string();
        assert!(e.contains("set TASKBRIDGE_HOME or pass --home"), "{e}");
        let relative = Home::at("rel").unwrap();
        assert!(relative.root().is_absolute() && relative.root().ends_with("rel"));
    }
}
