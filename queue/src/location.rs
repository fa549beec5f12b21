//! Where the queue lives: a SQLite file (the default) or a PostgreSQL schema (several hosts).
//!
//! `--db` and `TASKBRIDGE_DB` take either a path (or `sqlite://PATH`) or a
//! `postgres://user:pass@host:port/db?schema=NAME` URL. TaskBridge's own URL parameters are
//! `schema`, `listen` (`off` for poolers without LISTEN), `poll_ms` and, beside the driver's
//! `sslmode`, `sslmode=verify-full` with `sslrootcert=PATH`; everything else goes to the
//! driver. The password is never shown: [`Location`]'s `Display` masks it.

use crate::error::{Error, Result};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Clone)]
pub enum Location {
    Sqlite(PathBuf),
    Postgres(PgUrl),
}

/// How the connection is encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tls {
    /// No TLS (`sslmode=disable`).
    Off,
    /// TLS when the server offers it (`prefer`, the driver's default), unverified, as libpq does.
    Prefer,
    /// TLS or no connection; the certificate is not checked (`require`, as in libpq).
    Require,
    /// TLS with the server's certificate checked against `sslrootcert` and its name
    /// (`verify-full`).
    VerifyFull,
}

#[derive(Clone)]
pub struct PgUrl {
    /// The URL as the driver reads it: TaskBridge's own parameters removed.
    pub(crate) driver_url: String,
    /// The same with the password masked, for messages and `status`.
    redacted: String,
    pub schema: String,
    /// LISTEN/NOTIFY for wake-ups; off, only the poll.
    pub listen: bool,
    /// How often watchers look again without a notification.
    pub poll: Duration,
    pub tls: Tls,
    pub root_cert: Option<PathBuf>,
}

impl fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl Location {
    /// Reads `--db`/`TASKBRIDGE_DB`.
    pub fn parse(s: &str) -> Result<Location> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("sqlite://") {
            if rest.is_empty() {
                return Err(Error::invalid(
                    "db",
                    "sqlite:// needs a path, e.g. sqlite:///home/me/q.db",
                ));
            }
            return Ok(Location::Sqlite(PathBuf::from(rest)));
        }
        if let Some(rest) = s.strip_prefix("sqlite:")
            && !rest.is_empty()
        {
            return Ok(Location::Sqlite(PathBuf::from(rest)));
        }
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            return PgUrl::parse(s).map(Location::Postgres);
        }
        if s.contains("://") {
            return Err(Error::invalid(
                "db",
                format!(
                    "'{}' is neither a path nor a sqlite:// or postgres:// URL",
                    s.split("://").next().unwrap_or_default()
                ),
            ));
        }
        if s.is_empty() {
            return Err(Error::invalid("db", "it is empty; give a path or a postgres:// URL"));
        }
        if looks_like_libpq_keywords(s) {
            // Never echoed: such a string usually carries `password=`.
            return Err(Error::invalid(
                "db",
                "it is a libpq keyword string (host=… dbname=…), which TaskBridge does not read; \
                 give PostgreSQL as a URL, postgres://USER@HOST:PORT/DBNAME, with the password \
                 in PGPASSWORD or ~/.pgpass",
            ));
        }
        Ok(Location::Sqlite(PathBuf::from(s)))
    }

    /// True when other hosts may share this queue (tasks must then carry a fetchable base).
    pub fn is_shared(&self) -> bool {
        matches!(self, Location::Postgres(_))
    }

    /// A short name for this queue that stays the same across processes and hosts (eight hex
    /// digits of a hash of the file's real path, or of the server, database and schema), for
    /// what must not collide between two queues used from one home: worktree directories.
    pub fn key(&self) -> String {
        let id = match self {
            // The directory's real path and the file's name: the same before the file exists
            // as after.
            Location::Sqlite(p) => {
                let dir =
                    p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
                let real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
                real.join(p.file_name().unwrap_or_default()).display().to_string()
            }
            Location::Postgres(u) => format!("{}#{}", u.redacted, u.schema),
        };
        short_hash(&id)
    }

    pub fn backend(&self) -> &'static str {
        match self {
            Location::Sqlite(_) => "sqlite",
            Location::Postgres(_) => "postgres",
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Sqlite(p) => write!(f, "{}", p.display()),
            Location::Postgres(u) => f.write_str(&u.redacted),
        }
    }
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `user:secret@` becomes `user:***@`.
fn mask_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => authority.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

impl PgUrl {
    fn parse(url: &str) -> Result<PgUrl> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut schema = "taskbridge".to_owned();
        let mut listen = true;
        let mut poll_ms = None;
        let mut tls = Tls::Prefer;
        let mut root_cert = None;
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "schema" => schema = v.to_owned(),
                "listen" => {
                    listen = match v {
                        "on" | "true" | "1" => true,
                        "off" | "false" | "0" => false,
                        other => {
                            return Err(Error::invalid(
                                "db",
                                format!("listen={other}: use listen=on or listen=off"),
                            ));
                        }
                    }
                }
                "poll_ms" => {
                    let ms: u64 =
                        v.parse().ok().filter(|ms| (10..=60_000).contains(ms)).ok_or_else(
                            || {
                                Error::invalid(
                                    "db",
                                    format!("poll_ms={v}: use 10 to 60000 milliseconds"),
                                )
                            },
                        )?;
                    poll_ms = Some(ms);
                }
                "sslmode" => {
                    tls = match v {
                        "disable" => Tls::Off,
                        "prefer" | "allow" => Tls::Prefer,
                        "require" => Tls::Require,
                        "verify-full" | "verify-ca" => Tls::VerifyFull,
                        other => {
                            return Err(Error::invalid(
                                "db",
                                format!(
                                    "sslmode={other}: use disable, prefer, require or verify-full"
                                ),
                            ));
                        }
                    };
                    // The driver knows disable/prefer/require; verification is done here.
                    let driver = match tls {
                        Tls::Off => "disable",
                        Tls::Prefer => "prefer",
                        Tls::Require | Tls::VerifyFull => "require",
                    };
                    rest.push(format!("sslmode={driver}"));
                }
                "sslrootcert" => root_cert = Some(PathBuf::from(v)),
                _ => rest.push(pair.to_owned()),
            }
        }
        let schema_ok = !schema.is_empty()
            && schema.len() <= 48
            && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && schema.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !schema_ok {
            return Err(Error::invalid(
                "db",
                format!(
                    "schema={schema}: use 1 to 48 lowercase letters, digits and underscores, \
                     starting with a letter"
                ),
            ));
        }
        if tls == Tls::VerifyFull && root_cert.is_none() {
            return Err(Error::invalid(
                "db",
                "sslmode=verify-full needs sslrootcert=PATH, the PEM file of the CA that signed \
                 the server's certificate",
            ));
        }
        let driver_url =
            if rest.is_empty() { base.to_owned() } else { format!("{base}?{}", rest.join("&")) };
        driver_url
            .parse::<postgres::Config>()
            .map_err(|e| Error::invalid("db", format!("{}: {e}", mask_password(url))))?;
        Ok(PgUrl {
            redacted: mask_password(url),
            driver_url,
            schema,
            listen,
            poll: Duration::from_millis(poll_ms.unwrap_or(if listen { 2000 } else { 500 })),
            tls,
            root_cert,
        })
    }

    /// The NOTIFY channel of this schema.
    pub fn channel(&self) -> String {
        format!("taskbridge_{}", self.schema)
    }
}

/// `host=db.example port=5432 …`: a word made of a libpq connection keyword and `=` starts it.
/// No file of a queue is named that way, and taking it as one would create an empty queue under
/// a name that holds a password.
fn looks_like_libpq_keywords(s: &str) -> bool {
    const KEYWORDS: [&str; 14] = [
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "password",
        "passfile",
        "sslmode",
        "sslrootcert",
        "connect_timeout",
        "application_name",
        "options",
        "service",
        "target_session_attrs",
    ];
    s.split_whitespace().any(|word| {
        word.split_once('=')
            .is_some_and(|(k, _)| KEYWORDS.contains(&k.trim().to_ascii_lowercase().as_str()))
    })
}

/// Eight hex digits naming `id` in a file name: FNV-1a, stable across builds and platforms,
/// unlike the standard library's hasher.
pub fn short_hash(id: &str) -> String {
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{:08x}", hash as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_libpq_keyword_string_is_refused_without_its_password() {
        for s in ["host=db.example port=5432 dbname=q user=me password=hunter2", "dbname=q"] {
            let e = Location::parse(s).unwrap_err().to_string();
            assert!(e.contains("libpq keyword string") && e.contains("postgres://"), "{e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
        // Paths with '=' in them are still paths.
        assert!(matches!(Location::parse("./a=b/queue.db"), Ok(Location::Sqlite(_))));
    }

    #[test]
    fn paths_and_urls() {
        assert!(
            matches!(Location::parse("/tmp/q.db").unwrap(), Location::Sqlite(p) if p == std::path::Path::new("/tmp/q.db"))
        );
        assert!(
            matches!(Location::parse("sqlite:/tmp/q.db").unwrap(), Location::Sqlite(p) if p == std::path::Path::new("/tmp/q.db"))
        );
        assert!(
            matches!(Location::parse("sqlite:///tmp/q.db").unwrap(), Location::Sqlite(p) if p == std::path::Path::new("/tmp/q.db"))
        );
        let pg = Location::parse(
            "postgres://me:s3cret@db.example:5433/q?schema=team_a&listen=off&connect_timeout=5",
        )
        .unwrap();
        let Location::Postgres(u) = &pg else { panic!("not postgres") };
        assert_eq!(u.schema, "team_a");
        assert!(!u.listen);
        assert_eq!(u.poll, Duration::from_millis(500));
        assert_eq!(u.driver_url, "postgres://me:s3cret@db.example:5433/q?connect_timeout=5");
        let shown = pg.to_string();
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("me:***@db.example:5433"), "{shown}");
        assert_eq!(u.channel(), "taskbridge_team_a");
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        let e = Location::parse("postgres://h/db?schema=Bad-Name").unwrap_err().to_string();
        assert!(e.contains("schema=Bad-Name"), "{e}");
        let e = Location::parse("postgres://h/db?listen=maybe").unwrap_err().to_string();
        assert!(e.contains("listen=on or listen=off"), "{e}");
        let e = Location::parse("mysql://h/db").unwrap_err().to_string();
        assert!(e.contains("'mysql'"), "{e}");
        let e =
            Location::parse("postgres://u:pw@h/db?sslmode=verify-full").unwrap_err().to_string();
        assert!(e.contains("sslrootcert"), "{e}");
        let e = Location::parse("postgres://u:pw@h:notaport/db").unwrap_err().to_string();
        assert!(!e.contains("pw@"), "{e}");
    }

    #[test]
    fn a_queue_is_shared_named_and_shown_without_its_password() {
        let pg = Location::parse("postgres://me:pw@h/db?schema=team_a").unwrap();
        let file = Location::parse("/tmp/q.db").unwrap();
        assert!(pg.is_shared() && !file.is_shared());
        assert_eq!((pg.backend(), file.backend()), ("postgres", "sqlite"));
        assert_eq!(format!("{pg:?}"), "postgres://me:***@h/db?schema=team_a");
        let Location::Postgres(u) = &pg else { panic!("not postgres") };
        assert_eq!(format!("{u:?}"), "postgres://me:***@h/db?schema=team_a");
        assert_eq!(format!("{file:?}"), "/tmp/q.db");
    }

    #[test]
    fn a_queues_key_is_a_stable_hash_of_what_it_is() {
        // FNV-1a of "postgres://me:***@h/db?schema=team_a#team_a", cut to 32 bits: the same in
        // every build, since worktree directories are named by it.
        let key = |s: &str| Location::parse(s).unwrap().key();
        assert_eq!(key("postgres://me:pw@h/db?schema=team_a"), "625657c9");
        assert_ne!(
            key("postgres://me:pw@h/db?schema=team_b"),
            key("postgres://me:pw@h/db?schema=team_a")
        );
        let d = tempfile::tempdir().unwrap();
        let real = d.path().canonicalize().unwrap();
        std::os::unix::fs::symlink(&real, d.path().join("link")).unwrap();
        let a = key(real.join("q.db").to_str().unwrap());
        assert_eq!(a.len(), 8);
        assert_eq!(a, key(d.path().join("link/q.db").to_str().unwrap()), "the real path counts");
        assert_ne!(a, key(real.join("other.db").to_str().unwrap()));
        // A bare file name is in the current directory.
        let here = std::env::current_dir().unwrap().canonicalize().unwrap();
        assert_eq!(key("q.db"), key(here.join("q.db").to_str().unwrap()));
    }

    #[test]
    fn the_poll_the_schema_and_the_ca_are_read_from_the_url() {
        let pg = |q: &str| match Location::parse(&format!("postgres://u:pw@h/db?{q}")) {
            Ok(Location::Postgres(u)) => Ok(u),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(pg("poll_ms=250").unwrap().poll, Duration::from_millis(250));
        assert_eq!(pg("").unwrap().poll, Duration::from_millis(2000));
        assert!(pg("poll_ms=5").unwrap_err().contains("use 10 to 60000"));
        let u = pg("sslmode=verify-full&sslrootcert=/etc/ca.pem").unwrap();
        assert_eq!(
            (u.tls, u.root_cert.as_deref()),
            (Tls::VerifyFull, Some(Path::new("/etc/ca.pem")))
        );
        assert_eq!(u.driver_url, "postgres://u:pw@h/db?sslmode=require");
        assert_eq!(pg("schema=_team").unwrap().schema, "_team");
        for bad in ["1team", "team-a", "Team"] {
            assert!(
                pg(&format!("schema={bad}")).unwrap_err().contains("lowercase letters"),
                "{bad}"
            );
        }
    }
}
