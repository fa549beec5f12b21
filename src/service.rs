//! `taskbridge service`: run `taskbridge serve` (server and worker) without a terminal, as a
//! systemd user unit on Linux or a launchd agent on macOS.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

use worker::service::{LABEL, UNIT};

fn unit_path(env: &queue::Environment) -> anyhow::Result<PathBuf> {
    worker::service::unit_path(env).context("neither HOME nor XDG_CONFIG_HOME is set")
}

fn plist_path(env: &queue::Environment) -> anyhow::Result<PathBuf> {
    worker::service::plist_path(env).context("HOME is not set")
}

/// Where the service finds a `--db` other than the home's own file: a file only its user can
/// read, since a PostgreSQL URL carries a password and unit files are world-readable.
pub fn env_file(home: &Path) -> PathBuf {
    home.join("service.env")
}

/// The systemd user unit for `taskbridge serve` with this home (and the queue in `env_file`,
/// when there is one).
pub fn systemd_unit(exe: &Path, home: &Path, env_file: Option<&Path>) -> String {
    let env = env_file.map(|f| format!("EnvironmentFile={}\n", f.display())).unwrap_or_default();
    format!(
        "[Unit]\n\
         Description=TaskBridge MCP server and worker\n\
         After=network.target\n\
         \n\
         [Service]\n\
         Type=simple\n\
         {env}\
         ExecStart=\"{exe}\" --home \"{home}\" serve\n\
         Restart=on-failure\n\
         RestartSec=2\n\
         # Running tasks are handed back to the queue on stop; give the worker time to do it.\n\
         TimeoutStopSec=15\n\
         KillMode=mixed\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n",
        exe = exe.display(),
        home = home.display()
    )
}

pub fn launchd_plist(exe: &Path, home: &Path, db: Option<&str>) -> String {
    let xml = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let env = db
        .map(|d| {
            format!(
                "  <key>EnvironmentVariables</key>\n  <dict><key>TASKBRIDGE_DB</key><string>{}</string></dict>\n",
                xml(d)
            )
        })
        .unwrap_or_default();
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
  <key>Label</key><string>{LABEL}</string>
  <key>ProgramArguments</key>
  <array><string>{exe}</string><string>--home</string><string>{home}</string><string>serve</string></array>
  <key>RunAtLoad</key><true/>
  <key>KeepAlive</key><true/>
  <key>StandardErrorPath</key><string>{home}/logs/service.err</string>
{env}</dict>
</plist>
"#,
        exe = exe.display(),
        home = home.display()
    )
}

fn run(cmd: &mut Command) -> bool {
    cmd.status().is_ok_and(|s| s.success())
}

/// Runs a service manager's command; on failure, what it said (its stderr, or why it did not
/// start).
fn run_saying(cmd: &mut Command) -> Result<(), String> {
    match cmd.stderr(std::process::Stdio::piped()).output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
        Err(e) => Err(format!("{}: {e}", cmd.get_program().to_string_lossy())),
    }
}

/// `db`: the queue when it is not the home's own file (`--db`/`TASKBRIDGE_DB`), so that the
/// service's worker runs on the same queue as the command that installed it.
pub fn service(
    action: &str,
    home: &Path,
    db: Option<&str>,
    environment: &queue::Environment,
) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let exe = exe.canonicalize().unwrap_or(exe);
    let mac = cfg!(target_os = "macos");
    match action {
        "install" => {
            let env = env_file(home);
            let (path, text) = if mac {
                (plist_path(environment)?, launchd_plist(&exe, home, db))
            } else {
                (unit_path(environment)?, systemd_unit(&exe, home, db.map(|_| env.as_path())))
            };
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            match db {
                Some(db) if !mac => {
                    queue::home::create_private_file(&env)?;
                    let quoted = db.replace('\\', "\\\\").replace('"', "\\\"");
                    std::fs::write(&env, format!("TASKBRIDGE_DB=\"{quoted}\"\n"))
                        .with_context(|| format!("writing {}", env.display()))?;
                    outln!("wrote {} (the queue's URL, readable by you only)", env.display());
                }
                _ => {
                    let _ = std::fs::remove_file(&env);
                }
            }
            if mac && db.is_some() {
                // The plist carries the URL: readable by its user only.
                queue::home::create_private_file(&path)?;
            }
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            outln!("wrote {}", path.display());
            let started = if mac {
                run_saying(Command::new("launchctl").arg("load").arg("-w").arg(&path))
            } else {
                run_saying(Command::new("systemctl").args(["--user", "daemon-reload"])).and_then(
                    |()| {
                        run_saying(
                            Command::new("systemctl").args(["--user", "enable", "--now", UNIT]),
                        )
                    },
                )
            };
            match started {
                Ok(()) => outln!("the service is running: http://127.0.0.1:8765/mcp"),
                Err(said) if mac => bail!(
                    "the service is written to {}, but launchd did not start it: {said}; start \
                     it with: launchctl load -w {}",
                    path.display(),
                    path.display()
                ),
                Err(said)
                    if said.contains("connect to bus") || said.contains("XDG_RUNTIME_DIR") =>
                {
                    bail!(
                        "the unit is written to {}, but systemd's user manager cannot be reached \
                         ({said}): there is no user session here (an ssh or su session without \
                         a login, or a container). Log in as this user (with `loginctl \
                         enable-linger $USER` the service also runs while you are logged out), \
                         then run `taskbridge service install` again; or run `taskbridge serve` \
                         yourself",
                        path.display()
                    )
                }
                Err(said) => bail!(
                    "the unit is written to {}, but systemd did not start it: {said}; see \
                     `systemctl --user status {UNIT}`, then start it with: systemctl --user \
                     daemon-reload && systemctl --user enable --now {UNIT}",
                    path.display()
                ),
            }
        }
        "uninstall" => {
            let path = if mac { plist_path(environment)? } else { unit_path(environment)? };
            if mac {
                run(Command::new("launchctl").arg("unload").arg(&path));
            } else {
                run(Command::new("systemctl").args(["--user", "disable", "--now", UNIT]));
            }
            let _ = std::fs::remove_file(env_file(home));
            match std::fs::remove_file(&path) {
                Ok(()) => outln!("removed {}", path.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    outln!("no service was installed ({})", path.display())
                }
                Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
            }
            if !mac {
                run(Command::new("systemctl").args(["--user", "daemon-reload"]));
            }
        }
        "status" => {
            let path = if mac { plist_path(environment)? } else { unit_path(environment)? };
            if !path.exists() {
                outln!(
                    "not installed ({} does not exist); `taskbridge service install` installs it",
                    path.display()
                );
                return Ok(());
            }
            outln!("installed: {}", path.display());
            let shown = if mac {
                run(Command::new("launchctl").args(["list", LABEL]))
            } else {
                run(Command::new("systemctl").args(["--user", "--no-pager", "status", UNIT]))
            };
            if !shown {
                outln!("(the service manager did not report on it)");
            }
        }
        other => bail!("unknown action '{other}'; use install, uninstall or status"),
    }
    Ok(())
}
