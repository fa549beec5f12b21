//! The user service that runs `taskbridge serve` (and so a worker) without a terminal: a systemd
//! user unit on Linux, a launchd agent on macOS. The binary installs it; `restart_worker` restarts
//! it through its service manager when it is installed.

use queue::Environment;
use std::path::PathBuf;
use std::process::Command;

pub const UNIT: &str = "taskbridge.service";
pub const LABEL: &str = "dev.taskbridge.serve";

/// Where the systemd user unit lives (`$XDG_CONFIG_HOME/systemd/user/taskbridge.service`).
pub fn unit_path(env: &Environment) -> Option<PathBuf> {
    let config =
        env.path("XDG_CONFIG_HOME").or_else(|| env.home_dir().map(|h| h.join(".config")))?;
    Some(config.join("systemd/user").join(UNIT))
}

/// Where the launchd agent lives (`~/Library/LaunchAgents/dev.taskbridge.serve.plist`).
pub fn plist_path(env: &Environment) -> Option<PathBuf> {
    Some(env.home_dir()?.join("Library/LaunchAgents").join(format!("{LABEL}.plist")))
}

/// The service definition for this OS, whether or not it is installed.
pub fn definition_path(env: &Environment) -> Option<PathBuf> {
    if cfg!(target_os = "macos") { plist_path(env) } else { unit_path(env) }
}

pub fn installed(env: &Environment) -> bool {
    definition_path(env).is_some_and(|p| p.exists())
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
pub fn restart(env: &Environment) -> Option<Result<&'static str, String>> {
    if !installed(env) {
        return None;
    }
    Some(if cfg!(target_os = "macos") {
        let plist = plist_path(env)?;
        // unload fails harmlessly when the agent is not loaded.
        let _ = run(Command::new("launchctl").arg("unload").arg(&plist));
        run(Command::new("launchctl").arg("load").arg("-w").arg(&plist)).map(|()| "launchd")
    } else {
        run(Command::new("systemctl").args(["--user", "restart", UNIT])).map(|()| "systemd")
    })
}
