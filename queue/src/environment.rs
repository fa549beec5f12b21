//! The process environment, read once by the binary and handed down as a value.
//!
//! No library crate reads the environment itself: what a setting, a path or a program comes
//! from is decided in one place (the binary's `main`), and a test gives the environment it
//! means instead of changing the process's, which every thread shares.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// The variables of the environment TaskBridge was started in.
#[derive(Clone, Default)]
pub struct Environment {
    vars: HashMap<OsString, OsString>,
}

/// Names only: the values hold secrets (the token, the database's password, API keys), and a
/// configuration that carries this may be printed with `{:?}`.
impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<_> = self.vars.keys().map(|k| k.to_string_lossy()).collect();
        names.sort();
        f.debug_struct("Environment").field("names", &names).finish()
    }
}

impl Environment {
    /// The environment made of these variables (the binary gives `std::env::vars_os()`).
    pub fn from_vars<K, V>(vars: impl IntoIterator<Item = (K, V)>) -> Environment
    where
        K: Into<OsString>,
        V: Into<OsString>,
    {
        Environment { vars: vars.into_iter().map(|(k, v)| (k.into(), v.into())).collect() }
    }

    /// The variable `key`, when it is set and not empty.
    pub fn var_os(&self, key: &str) -> Option<&OsStr> {
        self.vars.get(OsStr::new(key)).map(OsString::as_os_str).filter(|v| !v.is_empty())
    }

    /// The variable `key` as text, trimmed, when it is set to something other than blanks.
    pub fn var(&self, key: &str) -> Option<String> {
        self.var_os(key)?.to_str().map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned)
    }

    /// The variable `key` as a path, when it is set and not empty.
    pub fn path(&self, key: &str) -> Option<PathBuf> {
        self.var_os(key).map(PathBuf::from)
    }

    /// The variable `key` as a list of paths, `:`-separated as `PATH` is; none when unset.
    pub fn paths(&self, key: &str) -> Vec<PathBuf> {
        self.var_os(key)
            .map(|v| std::env::split_paths(v).filter(|p| !p.as_os_str().is_empty()).collect())
            .unwrap_or_default()
    }

    /// Whether `key` is set at all, empty or not.
    pub fn is_set(&self, key: &str) -> bool {
        self.vars.contains_key(OsStr::new(key))
    }

    /// The user's home directory (`HOME`).
    pub fn home_dir(&self) -> Option<PathBuf> {
        self.path("HOME")
    }

    /// `program` itself when it is a path to an executable file, else the first executable file
    /// of that name in `PATH`: the one way TaskBridge finds a program.
    pub fn find_program(&self, program: &Path) -> Option<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let runnable = |p: &Path| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        };
        if program.components().count() > 1 {
            return runnable(program).then(|| program.to_path_buf());
        }
        std::env::split_paths(self.var_os("PATH")?).map(|d| d.join(program)).find(|p| runnable(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_variable_counts_when_set_and_not_empty_and_text_is_trimmed() {
        let env = Environment::from_vars([("A", " x "), ("EMPTY", ""), ("BLANK", "  ")]);
        assert_eq!(env.var("A").as_deref(), Some("x"));
        assert_eq!(env.var_os("A"), Some(OsStr::new(" x ")));
        assert_eq!(env.var("EMPTY"), None);
        assert_eq!(env.var_os("EMPTY"), None);
        assert_eq!(env.path("EMPTY"), None);
        assert_eq!(env.var("BLANK"), None, "blanks are no value");
        assert_eq!(env.path("BLANK"), Some(PathBuf::from("  ")), "a path is taken as it is");
        assert_eq!(env.var("MISSING"), None);
        assert!(env.is_set("EMPTY") && !env.is_set("MISSING"));
        let home = Environment::from_vars([("HOME", "/home/me")]);
        assert_eq!(home.home_dir(), Some(PathBuf::from("/home/me")));
    }

    #[test]
    fn printed_it_shows_the_names_and_no_value() {
        let env = Environment::from_vars([("TASKBRIDGE_TOKEN", "s3cret-token"), ("HOME", "/h")]);
        let shown = format!("{env:?}");
        assert!(shown.contains("TASKBRIDGE_TOKEN") && shown.contains("HOME"), "{shown}");
        assert!(!shown.contains("s3cret-token") && !shown.contains("/h\""), "{shown}");
    }

    #[test]
    fn a_program_is_found_by_path_or_on_path_and_only_when_it_can_run() {
        let dir = tempfile::tempdir().unwrap();
        let (first, second) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&first).unwrap();
        std::fs::create_dir_all(&second).unwrap();
        let make = |path: &Path, mode: u32| {
            std::fs::write(path, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        make(&first.join("tool"), 0o644);
        make(&second.join("tool"), 0o755);
        std::fs::create_dir_all(first.join("dir")).unwrap();
        let path = std::env::join_paths([&first, &second]).unwrap();
        let env = Environment::from_vars([(OsString::from("PATH"), path)]);
        assert_eq!(env.find_program(Path::new("tool")), Some(second.join("tool")), "not the 0644");
        assert_eq!(env.find_program(Path::new("dir")), None, "a directory does not run");
        assert_eq!(env.find_program(Path::new("nothing")), None);
        assert_eq!(env.find_program(&second.join("tool")), Some(second.join("tool")));
        assert_eq!(env.find_program(&first.join("tool")), None, "a path that cannot run");
        assert_eq!(Environment::default().find_program(Path::new("tool")), None, "no PATH");
    }
}
