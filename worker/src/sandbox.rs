//! The wall around an agent: one policy, applied by the kernel (Linux Landlock) to the agent's
//! process and everything it starts, the same for every agent.
//!
//! A [`Policy`] says what a run may touch: the directories it may write (its worktree, the git
//! admin directory and object store that worktree needs, the agent's own state, a private
//! temporary directory), what it may only read (a read-only task's worktree), what it may not
//! even read (TaskBridge's home with the queue and its token, the queue's database), and, for a
//! task without network, the one TCP port it may connect to (the worker's [`proxy`] to the model
//! provider). [`Wall::build`] turns it into a Landlock ruleset in the worker, where allocating
//! and opening files is safe; [`Wall::raise`] only makes two system calls between `fork` and
//! `exec`, so a spawn cannot deadlock on a lock another thread held at the fork.
//!
//! Landlock rules only ever allow, so "everything but the home" is written as every entry of
//! each directory on the way to a hidden path except the one that leads there (see
//! [`readable_parts`]). Entries made later in those directories are not readable by the agent;
//! everything below an entry is. Any directory may be listed: the names in the home show, not
//! what its files hold.

#![allow(unsafe_code)]

pub mod netns;
pub mod proxy;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// What to do with the wall (`[sandbox] mode`, `TASKBRIDGE_SANDBOX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Every agent runs inside the wall; a task whose rule the kernel cannot hold is refused.
    #[default]
    Enforce,
    /// Inside the wall where the kernel can build it; otherwise the task runs with a warning.
    Warn,
    /// No wall: the agents' own rules only.
    Off,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "enforce" => Ok(Mode::Enforce),
            "warn" => Ok(Mode::Warn),
            "off" => Ok(Mode::Off),
            other => Err(format!("'{other}' is not a sandbox mode; use enforce, warn or off")),
        }
    }
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Warn => "warn",
            Mode::Off => "off",
        }
    }
}

/// What this kernel offers, asked once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernel {
    /// The Landlock ABI version, 0 when Landlock is missing or disabled.
    pub landlock_abi: i32,
    /// This user can give an agent a network namespace of its own ([`netns`]).
    pub network_namespaces: bool,
}

/// The first ABI with TCP rules.
const NET_ABI: i32 = 4;
/// The first ABI that scopes signals and abstract Unix sockets to the domain.
const SCOPE_ABI: i32 = 6;

impl Kernel {
    /// Asks the kernel (`landlock_create_ruleset` with the version flag).
    pub fn probe() -> Kernel {
        static KERNEL: OnceLock<Kernel> = OnceLock::new();
        *KERNEL.get_or_init(|| {
            // SAFETY: with a null attribute, size 0 and LANDLOCK_CREATE_RULESET_VERSION the call
            // only returns the version (or fails); it touches no memory.
            let v = unsafe {
                nix::libc::syscall(
                    nix::libc::SYS_landlock_create_ruleset,
                    std::ptr::null::<u8>(),
                    0usize,
                    1u32,
                )
            };
            Kernel {
                landlock_abi: i32::try_from(v).unwrap_or(0).max(0),
                network_namespaces: netns::available(),
            }
        })
    }

    pub fn walls(&self) -> bool {
        self.landlock_abi >= 1
    }

    pub fn tcp_rules(&self) -> bool {
        self.landlock_abi >= NET_ABI
    }

    /// Why `rule` cannot be held by the kernel here, if it cannot.
    pub fn cannot_hold(&self, rule: Rule) -> Option<String> {
        if !self.walls() {
            return Some(format!(
                "this kernel has no Landlock ({}), so nothing but the agent itself would keep {}",
                if cfg!(target_os = "linux") {
                    "it needs Linux 5.13 or later with Landlock enabled in CONFIG_LSM"
                } else {
                    "TaskBridge's sandbox is Linux-only for now"
                },
                rule.what()
            ));
        }
        if rule == Rule::NoNetwork && !self.tcp_rules() {
            return Some(format!(
                "this kernel's Landlock is ABI {} and TCP rules need ABI {NET_ABI} (Linux 6.7)",
                self.landlock_abi
            ));
        }
        None
    }

    /// Of a task's `readonly` and `no_network`, those asked for that this kernel cannot hold:
    /// the flag's name and why. Submit and the run refuse (or warn) by the same rule.
    pub fn unheld(&self, readonly: bool, no_network: bool) -> Vec<(&'static str, String)> {
        [(readonly, Rule::Readonly, "readonly"), (no_network, Rule::NoNetwork, "no_network")]
            .into_iter()
            .filter(|(asked, ..)| *asked)
            .filter_map(|(_, rule, flag)| Some((flag, self.cannot_hold(rule)?)))
            .collect()
    }

    /// The `doctor` line.
    pub fn describe(&self) -> String {
        if !self.walls() {
            return "no Landlock on this kernel: agents run without a wall".to_owned();
        }
        let mut held = vec!["writes outside the worktree", "reads of the queue and its token"];
        match (self.tcp_rules(), self.network_namespaces) {
            (_, true) => {
                held.push("--no-network by address (a network namespace with only loopback)")
            }
            (true, false) => held.push("TCP for --no-network (by port: no network namespace here)"),
            (false, false) => {}
        }
        if self.landlock_abi >= SCOPE_ABI {
            held.push("signals and abstract sockets out of the wall");
        }
        format!("Landlock ABI {} holds {}", self.landlock_abi, held.join(", "))
    }
}

/// A task's rule the wall can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    Readonly,
    NoNetwork,
}

impl Rule {
    fn what(self) -> &'static str {
        match self {
            Rule::Readonly => "a read-only task from writing",
            Rule::NoNetwork => "a task without network off the network",
        }
    }
}

/// What one wall allows.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Directories (or files) the agent may read and change.
    pub write: Vec<PathBuf>,
    /// Directories the agent may read but not change, inside a hidden one (a read-only task's
    /// worktree in the home).
    pub read: Vec<PathBuf>,
    /// Not even readable: everything else is.
    pub hidden: Vec<PathBuf>,
    /// `Some(ports)`: TCP connections only to these ports; `None`: the network is not walled.
    pub connect_only: Option<Vec<u16>>,
    /// The agent talks to servers of its own on loopback (OpenCode 2's `acp` starts one). In a
    /// network namespace of its own that loopback is its own and the namespace holds the
    /// network shut, so no TCP rule is added; without a namespace the rules still hold.
    pub own_loopback: bool,
    /// With `own_loopback`, the ports of the host's loopback the agent reaches directly (its
    /// model provider there), forwarded into its namespace at the same address.
    pub loopback_forwards: Vec<u16>,
}

/// Devices every program writes to (`> /dev/null`, a terminal), and nothing else in `/dev`.
const DEVICES: [&str; 8] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// What held the task's rules, said in the result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// The Landlock ABI of the wall the agent ran in.
    pub abi: Option<i32>,
    /// The wall also held TCP (no network but the proxy).
    pub network: bool,
    /// Why there was no wall, when there was none.
    pub missing: Option<String>,
    /// The wall was the warm server's, around every worktree of the task's repository.
    pub repository: bool,
    /// The agent ran in a network namespace with only loopback (see [`netns`]).
    pub namespace: bool,
}

impl Held {
    /// "enforced by the kernel (Landlock ABI 7, ...)" for a rule the wall held.
    pub fn by_kernel(&self, network: bool) -> Option<String> {
        let abi = self.abi?;
        match network {
            true if self.network && self.namespace => Some(format!(
                "enforced by the kernel (a network namespace with only loopback, and Landlock \
                 ABI {abi} TCP rules): the agent reaches only the worker's proxy, which forwards \
                 to the model provider's hosts and nowhere else; no other address, no UDP out"
            )),
            true if self.network => Some(format!(
                "enforced by the kernel (Landlock ABI {abi}, TCP rules): the agent may connect \
                 only to the worker's proxy's port, which forwards to the model provider's hosts \
                 and nowhere else; other addresses on that port, UDP and Unix sockets are not \
                 held (this host gives no network namespace)"
            )),
            true => None,
            false => Some(format!("enforced by the kernel (Landlock ABI {abi})")),
        }
    }
}

/// A ruleset ready to be raised in a child.
#[derive(Debug)]
pub struct Wall {
    fd: OwnedFd,
    abi: i32,
    network: bool,
    /// The proxy's port, when the agent runs in a network namespace of its own ([`netns`]).
    namespace: Option<u16>,
    /// Ports of the host's loopback forwarded into that namespace (`Policy::loopback_forwards`).
    forwards: Vec<u16>,
}

/// Why a wall could not be built.
#[derive(Debug, thiserror::Error)]
#[error("could not build the sandbox: {0}")]
pub struct WallError(String);

impl Wall {
    /// The Landlock ruleset for `policy`, on this kernel's ABI.
    pub fn build(policy: &Policy) -> Result<Wall, WallError> {
        let kernel = Kernel::probe();
        if !kernel.walls() {
            return Err(WallError("this kernel has no Landlock".into()));
        }
        let err = |e: landlock::RulesetError| WallError(e.to_string());
        let abi = ABI::from(kernel.landlock_abi);
        // Ioctls on devices are left alone: terminals need them and they reach no file.
        let all = AccessFs::from_all(abi) & !AccessFs::IoctlDev;
        let read = AccessFs::from_read(abi);
        let mut ruleset = Ruleset::default().handle_access(all).map_err(err)?;
        let network = policy.connect_only.is_some();
        let in_namespace = network && kernel.network_namespaces;
        let tcp_rules = network && !(policy.own_loopback && in_namespace);
        if tcp_rules {
            if !kernel.tcp_rules() {
                return Err(WallError(format!(
                    "TCP rules need Landlock ABI {NET_ABI}; this kernel has {}",
                    kernel.landlock_abi
                )));
            }
            ruleset = ruleset.handle_access(AccessNet::ConnectTcp).map_err(err)?;
        }
        if kernel.landlock_abi >= SCOPE_ABI {
            // Signals and abstract Unix sockets stay inside the wall: no killing the worker,
            // no talking to a desktop bus or another program's abstract socket.
            ruleset = ruleset.scope(Scope::from_all(abi)).map_err(err)?;
        }
        let mut created = ruleset.create().map_err(err)?;
        let hidden: Vec<PathBuf> =
            policy.hidden.iter().filter_map(|h| std::fs::canonicalize(h).ok()).collect();
        let mut readable = Vec::new();
        readable_parts(Path::new("/"), &hidden, &mut readable);
        let writable = |p: &Path| policy.write.iter().any(|w| p.starts_with(w));
        let rules = readable
            .iter()
            .filter(|p| !writable(p))
            .map(|p| (p.as_path(), read))
            .chain(policy.read.iter().map(|p| (p.as_path(), read)))
            .chain(policy.write.iter().map(|p| (p.as_path(), all)))
            .chain(DEVICES.iter().map(|d| (Path::new(d), read | AccessFs::WriteFile)))
            // Listing any directory: a hidden path's names show (`ls ~` works), not what the
            // files hold.
            .chain(std::iter::once((Path::new("/"), BitFlags::from(AccessFs::ReadDir))));
        for (path, access) in rules {
            // A path that went away since it was listed (or never was) holds nothing to allow.
            let Ok(fd) = PathFd::new(path) else { continue };
            let access = if path.is_dir() { access } else { access & file_access(abi) };
            created = created.add_rule(PathBeneath::new(fd, access)).map_err(err)?;
        }
        if let Some(ports) = policy.connect_only.as_ref().filter(|_| tcp_rules) {
            for &port in ports {
                created =
                    created.add_rule(NetPort::new(port, AccessNet::ConnectTcp)).map_err(err)?;
            }
        }
        let fd: Option<OwnedFd> = created.into();
        let fd = fd.ok_or_else(|| WallError("the kernel made no ruleset".into()))?;
        let namespace = match &policy.connect_only {
            Some(ports) if in_namespace => ports.first().copied(),
            _ => None,
        };
        let forwards = match (namespace, policy.own_loopback) {
            (Some(_), true) => policy.loopback_forwards.clone(),
            _ => Vec::new(),
        };
        Ok(Wall { fd, abi: kernel.landlock_abi, network, namespace, forwards })
    }

    /// Has `cmd`'s child raise the wall before it runs the program. What the child then
    /// starts stays inside. Without network, first the namespace: the returned link forwards
    /// it to the proxy once the child runs ([`netns::Link::forward`]).
    /// `inbound`: the worker will also call a server the child runs ([`netns::Link::expose`]).
    pub fn raise(
        self: &std::sync::Arc<Self>,
        cmd: &mut tokio::process::Command,
        inbound: bool,
    ) -> std::io::Result<Option<std::sync::Arc<netns::Link>>> {
        let link = match self.namespace {
            Some(port) => {
                let link = netns::Link::new(port, inbound)?.with_forwards(&self.forwards);
                let link = std::sync::Arc::new(link);
                link.prepare(cmd);
                Some(link)
            }
            None => None,
        };
        let wall = self.clone();
        // SAFETY: the closure runs between fork and exec, and only makes two system calls on
        // an fd the parent keeps open (the Arc holds it); it allocates nothing.
        unsafe {
            cmd.pre_exec(move || wall.restrict_self());
        }
        Ok(link)
    }

    /// The same as [`Wall::raise`] for a `std` command (no network namespace).
    pub fn raise_std(self: &std::sync::Arc<Self>, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let wall = self.clone();
        // SAFETY: as in `raise`.
        unsafe {
            cmd.pre_exec(move || wall.restrict_self());
        }
    }

    fn restrict_self(&self) -> std::io::Result<()> {
        use nix::libc;
        // SAFETY: plain system calls on integers; no_new_privs is what Landlock requires of a
        // process that is not privileged, and keeps a setuid program from leaving the wall.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::syscall(libc::SYS_landlock_restrict_self, self.fd.as_raw_fd(), 0u32) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    pub fn abi(&self) -> i32 {
        self.abi
    }

    /// Whether the wall also holds the network.
    pub fn network(&self) -> bool {
        self.network
    }

    /// Whether the agent runs in a network namespace with only loopback.
    pub fn namespace(&self) -> bool {
        self.namespace.is_some()
    }
}

/// Readies `cmd` to run confined: inside `wall` when there is one (its network namespace
/// first), adopting the processes orphaned below it. Forward the returned link once the child
/// runs ([`netns::Link::forward`]).
pub fn confine(
    cmd: &mut tokio::process::Command,
    wall: Option<&std::sync::Arc<Wall>>,
    inbound: bool,
) -> std::io::Result<Option<std::sync::Arc<netns::Link>>> {
    let link = match wall {
        Some(wall) => wall.raise(cmd, inbound)?,
        None => None,
    };
    adopt_orphans(cmd);
    Ok(link)
}

/// Has `cmd`'s child adopt every process orphaned below it (`PR_SET_CHILD_SUBREAPER`, which
/// an exec keeps): a command that detaches itself (`setsid`, a double fork, a daemon) is
/// reparented to the agent rather than to PID 1, so it stays in the agent's tree, where the
/// worker finds it and stops it with the agent's task (`crate::process::ProcessTree`).
pub fn adopt_orphans(cmd: &mut tokio::process::Command) {
    // SAFETY: the closure runs between fork and exec and makes one system call on integers.
    unsafe {
        cmd.pre_exec(|| {
            if nix::libc::prctl(nix::libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The access rights that apply to a file (not a directory) on `abi`.
/// (Not `IoctlDev`: no wall handles it, see [`Wall::build`].)
fn file_access(abi: ABI) -> BitFlags<AccessFs> {
    let mut f: BitFlags<AccessFs> =
        [AccessFs::Execute, AccessFs::WriteFile, AccessFs::ReadFile].into_iter().collect();
    if abi >= ABI::V3 {
        f |= AccessFs::Truncate;
    }
    f
}

/// Every path under `root` that holds nothing hidden, which together hold everything under
/// `root` but the hidden paths: `root` itself when no hidden path is inside it, else the same
/// for each of its entries. A symbolic link is left out when it leads into a hidden path (a
/// rule follows it); `hidden` must be canonical.
pub fn readable_parts(root: &Path, hidden: &[PathBuf], out: &mut Vec<PathBuf>) {
    if hidden.iter().any(|h| h == root) {
        return;
    }
    if !hidden.iter().any(|h| h.starts_with(root)) {
        out.push(root.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for e in entries.flatten() {
        let path = e.path();
        if e.file_type().is_ok_and(|t| t.is_symlink()) {
            match std::fs::canonicalize(&path) {
                Ok(to) if !hidden.iter().any(|h| to.starts_with(h) || h.starts_with(&to)) => {
                    out.push(path)
                }
                _ => {}
            }
            continue;
        }
        readable_parts(&path, hidden, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn sh(wall: &Arc<Wall>, dir: &Path, script: &str) -> (bool, String) {
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", script]).current_dir(dir);
        wall.raise_std(&mut cmd);
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    }

    #[test]
    fn the_parts_around_a_hidden_path_cover_everything_else() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path().canonicalize().unwrap();
        for d in ["a/b/secret", "a/b/open", "a/c", "d"] {
            std::fs::create_dir_all(r.join(d)).unwrap();
        }
        std::fs::write(r.join("a/file"), "x").unwrap();
        std::os::unix::fs::symlink(r.join("a/b/secret"), r.join("to-secret")).unwrap();
        std::os::unix::fs::symlink(r.join("d"), r.join("to-d")).unwrap();
        // A link to a directory the hidden one is in would show it too.
        std::os::unix::fs::symlink(r.join("a/b"), r.join("to-b")).unwrap();
        let mut out = Vec::new();
        readable_parts(&r, &[r.join("a/b/secret")], &mut out);
        out.sort();
        let want: Vec<PathBuf> =
            ["a/b/open", "a/c", "a/file", "d", "to-d"].iter().map(|p| r.join(p)).collect();
        assert_eq!(out, want);
        let mut whole = Vec::new();
        readable_parts(&r, &[PathBuf::from("/elsewhere")], &mut whole);
        assert_eq!(whole, vec![r.clone()], "nothing hidden inside: the root itself");
        let mut none = Vec::new();
        readable_parts(&r, std::slice::from_ref(&r), &mut none);
        assert!(none.is_empty());
    }

    #[test]
    fn what_the_kernel_held_is_said_per_rule() {
        let held = Held { abi: Some(7), network: true, ..Held::default() };
        assert_eq!(held.by_kernel(false).unwrap(), "enforced by the kernel (Landlock ABI 7)");
        assert!(held.by_kernel(true).unwrap().contains("TCP rules"));
        assert!(held.by_kernel(true).unwrap().contains("not held"), "by port only");
        let netns = Held { namespace: true, ..held.clone() };
        assert!(netns.by_kernel(true).unwrap().contains("network namespace with only loopback"));
        let fs_only = Held { network: false, ..held.clone() };
        assert_eq!(fs_only.by_kernel(true), None);
        assert_eq!(Held::default().by_kernel(false), None);
    }

    #[test]
    fn modes_parse_and_a_bad_one_says_which_there_are() {
        for m in [Mode::Enforce, Mode::Warn, Mode::Off] {
            assert_eq!(m.as_str().parse::<Mode>(), Ok(m));
        }
        let e = "strict".parse::<Mode>().unwrap_err();
        assert!(e.contains("'strict'") && e.contains("enforce, warn or off"), "{e}");
    }

    #[test]
    fn a_kernel_without_landlock_or_tcp_rules_says_what_it_cannot_hold() {
        let none = Kernel { landlock_abi: 0, network_namespaces: false };
        let readonly = none.cannot_hold(Rule::Readonly).unwrap();
        assert!(readonly.contains("no Landlock") && readonly.contains("read-only task"));
        assert!(none.cannot_hold(Rule::NoNetwork).unwrap().contains("a task without network"));
        let old = Kernel { landlock_abi: 3, network_namespaces: false };
        assert_eq!(old.cannot_hold(Rule::Readonly), None);
        let e = old.cannot_hold(Rule::NoNetwork).unwrap();
        assert!(e.contains("ABI 3") && e.contains("ABI 4"), "{e}");
        assert_eq!(
            Kernel { landlock_abi: 4, network_namespaces: false }.cannot_hold(Rule::NoNetwork),
            None
        );
        assert!(
            Kernel { landlock_abi: 6, network_namespaces: false }.describe().contains("signals")
        );
        assert!(
            !Kernel { landlock_abi: 5, network_namespaces: false }.describe().contains("signals")
        );
        assert!(!old.describe().contains("TCP"));
    }

    /// The wall, as the kernel holds it: this machine has Landlock (see docs/TESTING.md), and
    /// a machine without it fails here with the reason rather than skipping.
    #[test]
    fn the_kernel_keeps_writes_in_the_worktree_hides_the_home_and_holds_tcp() {
        let kernel = Kernel::probe();
        assert!(kernel.tcp_rules(), "this test needs Landlock ABI 4+: {}", kernel.describe());
        let root = tempfile::tempdir().unwrap();
        let r = root.path().canonicalize().unwrap();
        let (work, ro, elsewhere, home) =
            (r.join("work"), r.join("home/ro"), r.join("elsewhere"), r.join("home"));
        for d in [&work, &ro, &elsewhere] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(home.join("taskbridge.db"), "secret").unwrap();
        // A file of its own the wall lets the agent rewrite (the bridge's database, say).
        let own_file = elsewhere.join("allowed.txt");
        std::fs::write(&own_file, "old").unwrap();
        std::fs::write(ro.join("kept.txt"), "kept").unwrap();
        std::os::unix::fs::symlink(&elsewhere, work.join("esc")).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let open = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (closed_port, open_port) =
            (listener.local_addr().unwrap().port(), open.local_addr().unwrap().port());
        let wall = Arc::new(
            Wall::build(&Policy {
                write: vec![work.clone(), own_file.clone()],
                read: vec![ro.clone()],
                hidden: vec![home.clone()],
                connect_only: Some(vec![open_port]),
                own_loopback: false,
                loopback_forwards: vec![],
            })
            .unwrap(),
        );
        let (ok, out) = sh(&wall, &work, "echo in > inside.txt && cat inside.txt && ls /");
        assert!(ok, "{out}");
        assert!(out.starts_with("in\n") && out.contains("usr"), "{out}");
        let (ok, out) = sh(&wall, &work, &format!("echo x > {}/out.txt", elsewhere.display()));
        assert!(!ok && out.contains("Permission denied"), "{out}");
        let (ok, out) = sh(&wall, &work, "echo x > esc/through-link.txt");
        assert!(!ok && out.contains("Permission denied"), "{out}");
        let (ok, out) = sh(&wall, &work, &format!("cat {}/taskbridge.db", home.display()));
        assert!(!ok && out.contains("Permission denied"), "{out}");
        let (ok, out) =
            sh(&wall, &work, &format!("cat {0}/kept.txt; echo y > {0}/kept.txt", ro.display()));
        assert!(!ok && out.starts_with("kept") && out.contains("Permission denied"), "{out}");
        let (ok, out) = sh(&wall, &work, "echo quiet > /dev/null && echo fine");
        assert!(ok && out.contains("fine"), "{out}");
        // Rewritten in place: truncating a file the wall allows is allowed too.
        let (ok, out) = sh(&wall, &work, &format!("echo new > {}", own_file.display()));
        assert!(ok, "{out}");
        assert_eq!(std::fs::read_to_string(&own_file).unwrap(), "new\n");
        // Signals stay inside: this test's process is outside the wall, the shell itself is in.
        let (ok, out) =
            sh(&wall, &work, &format!("kill -0 {} || exit 1; echo", std::process::id()));
        assert!(!ok && out.contains("not permitted"), "{out}");
        assert!(sh(&wall, &work, "kill -0 $$").0);
        assert_eq!((wall.abi(), wall.network()), (kernel.landlock_abi, true));
        // The same wall raised in a tokio command, as the worker spawns agents.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c").arg(format!("echo x > {}/tokio.txt", elsewhere.display()));
        let _link = confine(&mut cmd, Some(&wall), false).unwrap();
        let status = rt.block_on(async { cmd.status().await.unwrap() });
        assert!(!status.success() && !elsewhere.join("tokio.txt").exists());
        let fs_only =
            Wall::build(&Policy { write: vec![work.clone()], ..Policy::default() }).unwrap();
        assert!(!fs_only.network(), "no TCP rules without connect_only");
        assert!(!fs_only.namespace(), "no network namespace without connect_only");
        assert!(
            !elsewhere.join("out.txt").exists() && !elsewhere.join("through-link.txt").exists()
        );
        assert_eq!(std::fs::read_to_string(ro.join("kept.txt")).unwrap(), "kept");
        // TCP: the allowed port connects, any other is refused by the kernel.
        let connect = |port: u16| {
            format!(
                "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))' \
                 && echo connected"
            )
        };
        let (ok, out) = sh(&wall, &work, &connect(open_port));
        assert!(ok && out.contains("connected"), "{out}");
        let (ok, out) = sh(&wall, &work, &connect(closed_port));
        assert!(!ok && out.contains("Permission denied"), "{out}");
        drop(listener);
    }

    #[test]
    fn without_network_the_agent_reaches_the_proxys_address_and_no_other() {
        let kernel = Kernel::probe();
        // A kernel or user that cannot make the namespace fails here, saying so, never skips.
        assert!(kernel.tcp_rules() && kernel.network_namespaces, "{}", kernel.describe());
        let work = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        rt.block_on(async {
            // The stand-in proxy, and a listener on another loopback address at the same port.
            let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = proxy.local_addr().unwrap().port();
            let other = std::net::TcpListener::bind(("127.0.0.2", port)).unwrap();
            other.set_nonblocking(true).unwrap();
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                while let Ok((mut s, _)) = proxy.accept().await {
                    let _ = s.write_all(b"the proxy\n").await;
                }
            });
            let policy = Policy {
                write: vec![work.path().to_path_buf()],
                connect_only: Some(vec![port]),
                ..Policy::default()
            };
            let wall = std::sync::Arc::new(Wall::build(&policy).unwrap());
            assert!(wall.namespace() && wall.network());
            let script = format!(
                r#"
import socket
def attempt(name, f):
    try:
        print(name + "=" + str(f()))
    except OSError as e:
        print(name + "=denied " + e.strerror)
attempt("proxy", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=5).makefile().readline().strip())
attempt("other_address", lambda: socket.create_connection(("127.0.0.2", {port}), timeout=5) and "through")
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("10.255.255.1", 53)) and "through")
"#
            );
            let mut cmd = tokio::process::Command::new("python3");
            cmd.args(["-c", &script]).current_dir(work.path());
            cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
            let link = wall.raise(&mut cmd, false).unwrap().expect("a namespace without network");
            let child = cmd.spawn().unwrap();
            let _forwarding = link.forward().unwrap();
            let out = child.wait_with_output().await.unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(text.contains("proxy=the proxy"), "{text}");
            assert!(text.contains("other_address=denied"), "{text}");
            assert!(text.contains("udp=denied"), "{text}");
            assert!(other.accept().is_err(), "nothing reached 127.0.0.2 on the proxy's port");

            // An agent with a server of its own on loopback reaches it, and a model provider on
            // the host's loopback forwarded in, and still nothing else.
            let provider = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let provider_port = provider.local_addr().unwrap().port();
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                while let Ok((mut s, _)) = provider.accept().await {
                    let _ = s.write_all(b"the provider\n").await;
                }
            });
            let policy = Policy { own_loopback: true, loopback_forwards: vec![provider_port], ..policy };
            let wall = std::sync::Arc::new(Wall::build(&policy).unwrap());
            let script = format!(
                r#"
import socket
own = socket.socket(); own.bind(("127.0.0.1", 0)); own.listen()
def attempt(name, f):
    try:
        print(name + "=" + str(f()))
    except OSError as e:
        print(name + "=denied " + e.strerror)
attempt("own", lambda: socket.create_connection(own.getsockname(), timeout=5) and "through")
attempt("proxy", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=5).makefile().readline().strip())
attempt("provider", lambda: socket.create_connection(("127.0.0.1", {provider_port}), timeout=5).makefile().readline().strip())
attempt("other_address", lambda: socket.create_connection(("127.0.0.2", {port}), timeout=5) and "through")
"#
            );
            let mut cmd = tokio::process::Command::new("python3");
            cmd.args(["-c", &script]).current_dir(work.path());
            cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
            let link = wall.raise(&mut cmd, false).unwrap().expect("a namespace without network");
            let child = cmd.spawn().unwrap();
            let _forwarding = link.forward().unwrap();
            let out = child.wait_with_output().await.unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(text.contains("own=through"), "{text}");
            assert!(text.contains("provider=the provider"), "{text}");
            assert!(text.contains("proxy=the proxy"), "{text}");
            assert!(text.contains("other_address=denied"), "{text}");
            assert!(other.accept().is_err(), "nothing reached 127.0.0.2 on the proxy's port");
        });
    }

    #[test]
    fn a_command_that_detaches_stays_below_the_process_that_adopts_orphans() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        // A subshell starts a command in a session of its own and exits: the command is
        // orphaned, and the shell that adopts orphans is its parent now, not PID 1.
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args([
            "-c",
            "( setsid sleep 30 & echo $! > /dev/shm/.tb-adopt-$$ ); \
             p=$(cat /dev/shm/.tb-adopt-$$); rm -f /dev/shm/.tb-adopt-$$; \
             echo \"$$ $(cut -d' ' -f4 /proc/$p/stat)\"; kill -9 $p",
        ]);
        assert!(confine(&mut cmd, None, false).unwrap().is_none(), "no wall, no namespace");
        let out = rt.block_on(async { cmd.output().await }).unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let (shell, parent) = text.trim().split_once(' ').unwrap();
        assert_eq!(parent, shell, "the orphan's parent: {text}");
    }
}
