//! The user service that runs `taskbridge serve` (and so a worker) without a terminal: a systemd
//! user unit on Linux, a launchd agent on macOS. The binary installs it; `restart_worker` restarts
//! it through its service manager when it is installed.

use std::path::PathBuf;
use std::process::Command;

pub const UNIT: &str = "taskbridge.service";
pub const LABEL: &str = "dev.taskbridge.serve";

fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from)
}

/// Where the systemd user unit lives (`$XDG_CONFIG_HOME/systemd/user/taskbridge.service`).
pub fn unit_path() -> Option<PathBuf> {
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| home_dir().map(|h| h.join(".config")))?;
    Some(config.join("systemd/user").join(UNIT))
}

/// Where the launchd agent lives (`~/Library/LaunchAgents/dev.taskbridge.serve.plist`).
pub fn plist_path() -> Option<PathBuf> {
    Some(home_dir()?.join("Library/LaunchAgents").join(format!("{LABEL}.plist")))
}

/// The service definition for this OS, whether or not it is installed.
pub fn definition_path() -> Option<PathBuf> {
    if cfg!(target_os = "macos") { plist_path() } else { unit_path() }
}

pub fn installed() -> bool {
    definition_path().is_some_and(|p| p.exists())
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let shown = format!("{cmd:?}").replace('"', "");
    match cmd.output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => {
            Err(format!("`{shown}` failed: {}", String::from_utf8_lossy(&out.stderr).trim()))
        }
        Err(e) => Err(format!("could not run `{shown}`: {e}")),
    }
}

/// Restarts the installed service through its manager. `None` when no service is installed;
/// otherwise which manager did it, or why it could not.
pub fn restart() -> Option<Result<&'static str, String>> {
    if !installed() {
        return None;
    }
    Some(if cfg!(target_os = "macos") {
        let plist = plist_path()?;
        // unload fails harmlessly when the agent is not loaded.
        let _ = run(Command::new("launchctl").arg("unload").arg(&plist));
        run(Command::new("launchctl").arg("load").arg("-w").arg(&plist)).map(|()| "launchd")
    } else {
        run(Command::new("systemctl").args(["--user", "restart", UNIT])).map(|()| "systemd")
    })
}
