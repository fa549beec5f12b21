//! Who may call an HTTP listener (`serve`, `tui`, `claude-mcp --listen`): the bearer token, where
//! it comes from, and the checks a token the user gives must pass. Loopback is no boundary (every
//! local user reaches it), so a token is the default everywhere; `--no-token` is the way out, on
//! loopback only, and says what it gives away.

use crate::cli::GuardArgs;
use anyhow::{Context, bail};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The shortest token a user may give: a shorter one can be guessed.
pub const MIN_LEN: usize = 32;

/// Where the token in use came from, for the lines that tell a user how to send it.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// The home's own token file (created on first use).
    Home(PathBuf),
    /// `--token-file`.
    File(PathBuf),
    /// `TASKBRIDGE_TOKEN`.
    Env,
    /// `--token` on the command line.
    Argv,
}

impl Source {
    /// The file that holds the token, when one does.
    pub fn file(&self) -> Option<&Path> {
        match self {
            Source::Home(p) | Source::File(p) => Some(p),
            Source::Env | Source::Argv => None,
        }
    }

    /// A shell expression that gives the token, for a pasted `--header` line.
    pub fn shell_expr(&self) -> String {
        match self.file() {
            Some(f) => format!("$(cat {})", crate::clients::shell_quote(&f.display().to_string())),
            None => "$TASKBRIDGE_TOKEN".to_owned(),
        }
    }

    /// Where the token is, in words.
    pub fn describe(&self) -> String {
        match self {
            Source::Home(p) | Source::File(p) => format!("token in {}", p.display()),
            Source::Env => "token from TASKBRIDGE_TOKEN".to_owned(),
            Source::Argv => "token from --token".to_owned(),
        }
    }
}

/// The home's token file.
pub fn home_token_path(home: &Path) -> PathBuf {
    home.join("token")
}

/// The token an HTTP listener asks for: `--token`, `TASKBRIDGE_TOKEN`, `--token-file`, else the
/// home's own (256 bits, created 0600 on first use). `None` only with `--no-token`. Warnings go
/// to stderr.
pub fn resolve(
    home: &Path,
    guard: &GuardArgs,
    env: &queue::Environment,
) -> anyhow::Result<Option<(String, Source)>> {
    resolve_given(home, guard, env.var("TASKBRIDGE_TOKEN"))
}

/// `resolve`, given `TASKBRIDGE_TOKEN` (read by the caller, so that a test can give one).
fn resolve_given(
    home: &Path,
    guard: &GuardArgs,
    env_token: Option<String>,
) -> anyhow::Result<Option<(String, Source)>> {
    if guard.no_token {
        eprintln!(
            "warning: --no-token: any user of this machine can call this server and run tasks as \
             you; without --no-token the server asks for the token in {}",
            home_token_path(home).display()
        );
        return Ok(None);
    }
    if let Some(t) = &guard.token {
        eprintln!(
            "warning: --token on the command line is visible to every user of this machine (ps); \
             put it in a file only you can read and pass --token-file FILE, or set \
             TASKBRIDGE_TOKEN"
        );
        return Ok(Some((checked(t, "--token")?, Source::Argv)));
    }
    if let Some(f) = &guard.token_file {
        return Ok(Some((read_private(f)?, Source::File(f.clone()))));
    }
    if let Some(t) = env_token.filter(|t| !t.trim().is_empty()) {
        return Ok(Some((checked(&t, "TASKBRIDGE_TOKEN")?, Source::Env)));
    }
    Ok(Some((home_token(home)?, Source::Home(home_token_path(home)))))
}

/// The home's own token, made now if it is not there yet.
pub fn home_token(home: &Path) -> anyhow::Result<String> {
    in_home(home, &home_token_path(home))
}

fn checked(token: &str, what: &str) -> anyhow::Result<String> {
    let t = token.trim();
    if t.chars().count() < MIN_LEN {
        bail!(
            "the token from {what} is {} characters; a token must be at least {MIN_LEN} (make one \
             with `openssl rand -hex 32`), or leave it out and the server uses the one it keeps \
             in its home",
            t.chars().count()
        );
    }
    if t.chars().any(|c| c.is_whitespace() || c.is_control()) {
        bail!("the token from {what} contains spaces or control characters; use printable ones");
    }
    Ok(t.to_owned())
}

/// A secret file's trimmed contents (`what` names it in errors), refused when other users may
/// read it.
pub fn read_private_text(path: &Path, what: &str) -> anyhow::Result<String> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("reading {what} {}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "{what} {} can be read by other users (mode {mode:04o}); run `chmod 600 {}` and \
             start again",
            path.display(),
            crate::clients::shell_quote(&path.display().to_string())
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading {what} {}", path.display()))?;
    Ok(text.trim().to_owned())
}

/// A token file's contents, refused when other users may read it.
fn read_private(path: &Path) -> anyhow::Result<String> {
    let text = read_private_text(path, "the token file")?;
    checked(&text, &format!("the file {}", path.display()))
}

/// The home's token, created on first use. An earlier version kept the public mode's token in
/// `public-token`: it becomes the home's token, so clients given it keep working.
///
/// Two servers started at once on a fresh home (`serve` and the TUI, two workers) must end up
/// with one token: the new one is written whole to a file of its own and linked into place,
/// which fails if another got there first, whose token is then read. Creating the file and
/// writing it after let the other read it empty, or write a token of its own over it.
fn in_home(home: &Path, path: &Path) -> anyhow::Result<String> {
    let old = home.join("public-token");
    if !path.exists()
        && old.exists()
        && let Err(e) = std::fs::rename(&old, path)
        && !path.exists()
    {
        return Err(e).with_context(|| format!("moving {} to {}", old.display(), path.display()));
    }
    if path.exists() {
        return read_private(path);
    }
    let mut bytes = [0u8; 32];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading random bytes for the token")?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    // Named by process and call, never by the token: a name can end up in an error message.
    static DRAFTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = DRAFTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let draft = home.join(format!(".token-{}-{n}", std::process::id()));
    queue::home::create_private_file(&draft)?;
    let made = std::fs::write(&draft, format!("{token}\n"))
        .with_context(|| format!("writing {}", draft.display()))
        .and_then(|()| match std::fs::hard_link(&draft, path) {
            Ok(()) => Ok(token),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_private(path),
            // A filesystem without hard links: renamed into place, which a server started at
            // the same instant could still write over.
            Err(_) => std::fs::rename(&draft, path)
                .map(|()| token)
                .with_context(|| format!("writing {}", path.display())),
        });
    let _ = std::fs::remove_file(&draft);
    made
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> GuardArgs {
        GuardArgs { token: None, token_file: None, no_token: false, allowed_hosts: vec![] }
    }

    fn private_file(dir: &Path, name: &str, text: &str) -> PathBuf {
        let f = dir.join(name);
        std::fs::write(&f, text).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        f
    }

    #[test]
    fn the_token_comes_from_the_flag_the_file_the_environment_or_else_the_home() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path();
        let a = "a".repeat(40);
        let no_env = queue::Environment::default();
        let none = resolve(home, &GuardArgs { no_token: true, ..guard() }, &no_env).unwrap();
        assert_eq!(none, None);
        let flag = resolve(home, &GuardArgs { token: Some(format!(" {a} ")), ..guard() }, &no_env)
            .unwrap();
        assert_eq!(flag, Some((a.clone(), Source::Argv)));
        let file = private_file(home, "given", &format!("{}\n", "f".repeat(40)));
        let from_file = GuardArgs { token_file: Some(file.clone()), ..guard() };
        assert_eq!(
            resolve(home, &from_file, &no_env).unwrap(),
            Some(("f".repeat(40), Source::File(file)))
        );
        assert!(!home_token_path(home).exists(), "a token given makes none in the home");

        let given = queue::Environment::from_vars([("TASKBRIDGE_TOKEN", a.as_str())]);
        let env = resolve(home, &guard(), &given).unwrap();
        assert_eq!(env, Some((a, Source::Env)));
        let e = resolve_given(home, &guard(), Some("short".into())).unwrap_err().to_string();
        assert!(e.contains("the token from TASKBRIDGE_TOKEN is 5 characters"), "{e}");
        // A blank TASKBRIDGE_TOKEN is no token: the home's own is used, made now.
        let (token, source) = resolve_given(home, &guard(), Some("  ".into())).unwrap().unwrap();
        assert_eq!(source, Source::Home(home.join("token")));
        assert_eq!(token.len(), 64);
        assert_eq!(home_token(home).unwrap(), token);
        assert_eq!(resolve_given(home, &guard(), None).unwrap(), Some((token, source)));
    }

    #[test]
    fn each_source_says_where_the_token_is_and_how_a_shell_gets_it() {
        let home = Source::Home(PathBuf::from("/h/token"));
        assert_eq!(home.file(), Some(Path::new("/h/token")));
        assert_eq!(home.describe(), "token in /h/token");
        assert_eq!(home.shell_expr(), "$(cat /h/token)");
        let file = Source::File(PathBuf::from("/my dir/tok"));
        assert_eq!(file.file(), Some(Path::new("/my dir/tok")));
        assert_eq!(file.shell_expr(), "$(cat '/my dir/tok')");
        for (s, said) in
            [(Source::Env, "token from TASKBRIDGE_TOKEN"), (Source::Argv, "token from --token")]
        {
            assert_eq!(s.file(), None);
            assert_eq!(s.describe(), said);
            assert_eq!(s.shell_expr(), "$TASKBRIDGE_TOKEN");
        }
    }

    #[test]
    fn short_or_spaced_tokens_are_refused_with_the_reason() {
        let e = checked("x", "--token").unwrap_err().to_string();
        assert!(e.contains("1 characters") && e.contains("at least 32"), "{e}");
        assert!(checked(&"a".repeat(31), "t").is_err());
        assert_eq!(checked(&format!(" {}\n", "a".repeat(32)), "t").unwrap(), "a".repeat(32));
        assert!(checked(&format!("{} {}", "a".repeat(20), "b".repeat(20)), "t").is_err());
    }

    #[test]
    fn a_token_file_others_can_read_is_refused_with_the_chmod() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tok");
        std::fs::write(&f, "b".repeat(40)).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_private(&f).unwrap_err().to_string();
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_private(&f).unwrap(), "b".repeat(40));
    }

    #[test]
    fn the_home_token_is_made_once_private_and_an_old_public_token_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = home_token_path(dir.path());
        let first = in_home(dir.path(), &path).unwrap();
        assert_eq!(first.len(), 64);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(in_home(dir.path(), &path).unwrap(), first);

        let old = tempfile::tempdir().unwrap();
        std::fs::write(old.path().join("public-token"), format!("{}\n", "c".repeat(64))).unwrap();
        std::fs::set_permissions(
            old.path().join("public-token"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let p = home_token_path(old.path());
        assert_eq!(in_home(old.path(), &p).unwrap(), "c".repeat(64));
    }

    #[test]
    fn servers_started_at_once_on_a_fresh_home_share_one_token() {
        for round in 0..40 {
            let dir = tempfile::tempdir().unwrap();
            let home = dir.path().to_path_buf();
            // Every other round a home of an earlier version, its token still `public-token`:
            // all of them move it once and keep it.
            let old = (round % 2 == 1).then(|| "d".repeat(64));
            if let Some(old) = &old {
                private_file(&home, "public-token", old);
            }
            let start = std::sync::Arc::new(std::sync::Barrier::new(6));
            let got: Vec<String> = (0..6)
                .map(|_| {
                    let (home, start) = (home.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        home_token(&home)
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().unwrap().unwrap())
                .collect();
            let file = std::fs::read_to_string(home_token_path(&home)).unwrap();
            assert!(got.iter().all(|t| *t == file.trim()), "{got:?} vs the file's {file:?}");
            if let Some(old) = &old {
                assert_eq!(file.trim(), old, "the old token was not kept");
            }
            let names: Vec<_> =
                std::fs::read_dir(&home).unwrap().map(|e| e.unwrap().file_name()).collect();
            assert_eq!(names, ["token"], "drafts left behind");
        }
    }
}
