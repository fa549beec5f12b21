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
    /// Resolves the home directory from an explicit choice or the environment.
    pub fn resolve(explicit: Option<PathBuf>) -> Result<Home> {
        let root = explicit
            .or_else(|| {
                std::env::var_os("TASKBRIDGE_HOME").filter(|v| !v.is_empty()).map(PathBuf::from)
            })
            .or_else(|| {
                std::env::var_os("XDG_DATA_HOME")
                    .filter(|v| !v.is_empty())
                    .map(|d| PathBuf::from(d).join("taskbridge"))
            })
            .or_else(|| {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share/taskbridge"))
            })
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
