//! `--no-network` by address, not only by port: the agent runs in a network namespace of its
//! own with nothing but loopback. Landlock's TCP rule names a port, so on the host's network
//! any address on the proxy's port (127.0.0.2, another host) and UDP stayed open; in the
//! namespace there is no other address to reach.
//!
//! The agent's child makes the namespace between fork and exec (with a user namespace that
//! maps the user to itself, where the worker is not root), brings its loopback up, and binds
//! the proxy's address there, `127.0.0.1:<proxy port>`. It hands that listening socket to the
//! worker over a socket pair before it runs the agent; the worker accepts on it and forwards
//! each connection to the real proxy on the host's loopback ([`Link::forward`]). A connection
//! the agent makes before the worker gets there waits in the listen queue.
//!
//! A server in the namespace (OpenCode's warm server) is also called into: the child leaves a
//! small helper behind in the namespace, a fork that never runs the agent, which connects to a
//! port inside on the worker's request and hands the connected socket back
//! ([`Link::connect_inside`]). The agent cannot reach it: its end of the socket pair closes on
//! exec, and the wall keeps the agent from signalling or tracing what is outside it.
//!
//! Everything between fork and exec is system calls on memory prepared before the fork.

use nix::libc;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

/// Whether this kernel lets this user make a network namespace (as root, or through an
/// unprivileged user namespace), tried once on a child that runs `true`.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let Ok(link) = Link::new(0, false) else { return false };
        let mut cmd = std::process::Command::new("true");
        link.prepare_std(&mut cmd);
        let ran = cmd.status().is_ok_and(|s| s.success());
        ran && link.receive().is_ok()
    })
}

/// The uid and gid maps of a user namespace that maps the user to itself, as the child writes
/// them.
struct Maps {
    root: bool,
    uid: [u8; 64],
    uid_len: usize,
    gid: [u8; 64],
    gid_len: usize,
}

impl Maps {
    fn of_this_process() -> Maps {
        let fill = |text: String| {
            let mut buf = [0u8; 64];
            let len = text.len().min(64);
            buf[..len].copy_from_slice(&text.as_bytes()[..len]);
            (buf, len)
        };
        let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        let (uid, uid_len) = fill(format!("{uid} {uid} 1\n"));
        let (gid, gid_len) = fill(format!("{gid} {gid} 1\n"));
        Maps { root: nix::unistd::geteuid().is_root(), uid, uid_len, gid, gid_len }
    }
}

/// At most this many loopback ports besides the proxy's are forwarded into a namespace.
const MAX_FORWARDS: usize = 8;

/// One agent's way out of its namespace: the socket pair its child sends the listening socket
/// on, and the proxy's port.
pub struct Link {
    port: u16,
    /// Ports of the host's loopback forwarded into the namespace at the same address (model
    /// providers there, for an agent whose loopback bypasses the proxy).
    forwards: [u16; MAX_FORWARDS],
    n_forwards: usize,
    parent: OwnedFd,
    child: OwnedFd,
    maps: Maps,
    /// Leave the helper that connects inside (for a server the worker calls).
    inbound: bool,
    /// One request to the helper at a time.
    asking: std::sync::Mutex<()>,
}

impl Link {
    pub fn new(port: u16, inbound: bool) -> io::Result<Link> {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
        let (parent, child) =
            socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)?;
        let maps = Maps::of_this_process();
        let (forwards, n_forwards) = ([0; MAX_FORWARDS], 0);
        Ok(Link {
            port,
            forwards,
            n_forwards,
            parent,
            child,
            maps,
            inbound,
            asking: Default::default(),
        })
    }

    /// The same link, with `ports` of the host's loopback reachable inside at the same address
    /// (the first [`MAX_FORWARDS`] of them).
    pub fn with_forwards(mut self, ports: &[u16]) -> Link {
        let ports: Vec<u16> = ports.iter().copied().filter(|p| *p != self.port).collect();
        self.n_forwards = ports.len().min(MAX_FORWARDS);
        self.forwards[..self.n_forwards].copy_from_slice(&ports[..self.n_forwards]);
        self
    }

    /// Has `cmd`'s child make the namespace before anything else it does between fork and exec
    /// (so before the Landlock wall, which would refuse the writes to `/proc/self`).
    pub fn prepare(self: &std::sync::Arc<Self>, cmd: &mut tokio::process::Command) {
        let link = self.clone();
        // SAFETY: the closure runs between fork and exec and only makes system calls on memory
        // prepared before the fork (the maps, the address); it allocates nothing.
        unsafe {
            cmd.pre_exec(move || link.isolate());
        }
    }

    fn prepare_std(&self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let (port, child, maps) = (self.port, self.child.as_raw_fd(), self.maps_copy());
        // SAFETY: as in `prepare`.
        unsafe {
            cmd.pre_exec(move || isolate(port, &[], child, &maps, false));
        }
    }

    fn maps_copy(&self) -> Maps {
        let m = &self.maps;
        Maps { root: m.root, uid: m.uid, uid_len: m.uid_len, gid: m.gid, gid_len: m.gid_len }
    }

    fn isolate(&self) -> io::Result<()> {
        let forwards = &self.forwards[..self.n_forwards];
        isolate(self.port, forwards, self.child.as_raw_fd(), &self.maps, self.inbound)
    }

    /// A connection to `port` inside the namespace, made by the helper (see the module's
    /// documentation).
    fn connect_inside(&self, port: u16) -> io::Result<std::net::TcpStream> {
        use nix::sys::socket::{MsgFlags, send};
        let _one = self.asking.lock().unwrap_or_else(|e| e.into_inner());
        send(self.parent.as_raw_fd(), &port.to_be_bytes(), MsgFlags::empty())?;
        let fd = self.receive_fd(MsgFlags::empty())?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("nothing listens on port {port} in the agent's network namespace"),
            )
        })?;
        Ok(std::net::TcpStream::from(fd))
    }

    /// The descriptor the other end sent with its next message, if it sent one.
    fn receive_fd(&self, flags: nix::sys::socket::MsgFlags) -> io::Result<Option<OwnedFd>> {
        use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
        let mut byte = [0u8; 1];
        let mut iov = [io::IoSliceMut::new(&mut byte)];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let flags = flags | MsgFlags::MSG_CMSG_CLOEXEC;
        let msg = recvmsg::<()>(self.parent.as_raw_fd(), &mut iov, Some(&mut space), flags)?;
        for cmsg in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = cmsg
                && let Some(&fd) = fds.first()
            {
                // SAFETY: the kernel just gave this process the descriptor; nothing else owns it.
                return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        Ok(None)
    }

    /// A loopback port on the host that leads to `port` inside the namespace (the warm
    /// server's), until the returned guard is dropped.
    pub async fn expose(self: &std::sync::Arc<Self>, port: u16) -> io::Result<(u16, Forwarding)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let outside = listener.local_addr()?.port();
        let link = self.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut caller, _)) = listener.accept().await {
                let link = link.clone();
                tokio::spawn(async move {
                    let inside =
                        tokio::task::spawn_blocking(move || link.connect_inside(port)).await;
                    let Ok(Ok(inside)) = inside else { return };
                    let Ok(()) = inside.set_nonblocking(true) else { return };
                    let Ok(mut inside) = tokio::net::TcpStream::from_std(inside) else { return };
                    let _ = tokio::io::copy_bidirectional(&mut caller, &mut inside).await;
                });
            }
        });
        Ok((outside, Forwarding(task)))
    }

    /// The listening socket the child sent, once it has run the agent.
    fn receive(&self) -> io::Result<std::net::TcpListener> {
        let fd = self.receive_fd(nix::sys::socket::MsgFlags::MSG_DONTWAIT)?;
        let fd = fd.ok_or_else(|| io::Error::other("the agent's child sent no socket"))?;
        let listener = std::net::TcpListener::from(fd);
        listener.set_nonblocking(true)?;
        Ok(listener)
    }

    /// Forwards every connection the agent makes to its namespace's `127.0.0.1:<port>` to the
    /// proxy at the same address on the host (and the same for each forwarded port), until the
    /// returned guard is dropped (with the agent).
    pub fn forward(&self) -> io::Result<Forwarding> {
        let ports: Vec<u16> = std::iter::once(self.port)
            .chain(self.forwards[..self.n_forwards].iter().copied())
            .collect();
        let mut listeners = Vec::new();
        for _ in &ports {
            listeners.push(tokio::net::TcpListener::from_std(self.receive()?)?);
        }
        let task = tokio::spawn(async move {
            let each = listeners.into_iter().zip(ports).map(|(listener, port)| async move {
                while let Ok((mut inside, _)) = listener.accept().await {
                    tokio::spawn(async move {
                        if let Ok(mut host) =
                            tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                        {
                            let _ = tokio::io::copy_bidirectional(&mut inside, &mut host).await;
                        }
                    });
                }
            });
            futures::future::join_all(each).await;
        });
        Ok(Forwarding(task))
    }
}

/// The forwarding of one agent's namespace; it stops when dropped.
pub struct Forwarding(tokio::task::JoinHandle<()>);

impl Drop for Forwarding {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Writes `data` to the file at `path` (a NUL-terminated `/proc/self/...`).
fn write_file(path: &[u8], data: &[u8]) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated; `data` is a live slice; the descriptor is closed here.
    unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC);
        check(fd)?;
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        libc::close(fd);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// In the child: the namespaces, loopback up, the listeners bound (the proxy's, then each of
/// `forwards`) and sent to the worker; with `inbound`, the helper forked off.
fn isolate(port: u16, forwards: &[u16], chan: RawFd, maps: &Maps, inbound: bool) -> io::Result<()> {
    // SAFETY: system calls on integers and on structures on this stack frame.
    unsafe {
        let flags = match maps.root {
            true => libc::CLONE_NEWNET,
            false => libc::CLONE_NEWUSER | libc::CLONE_NEWNET,
        };
        check(libc::unshare(flags))?;
        if !maps.root {
            write_file(b"/proc/self/setgroups\0", b"deny")?;
            write_file(b"/proc/self/uid_map\0", &maps.uid[..maps.uid_len])?;
            write_file(b"/proc/self/gid_map\0", &maps.gid[..maps.gid_len])?;
        }
        // Loopback, which a new namespace has down.
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        check(s)?;
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            ifr.ifr_name[i] = *b as libc::c_char;
        }
        ifr.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        let up = libc::ioctl(s, libc::SIOCSIFFLAGS, &ifr);
        libc::close(s);
        check(up)?;
        // The proxy's address inside, then the forwarded ones.
        for p in std::iter::once(&port).chain(forwards) {
            let l = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            check(l)?;
            let (addr, len) = loopback(*p);
            check(libc::bind(l, (&raw const addr).cast(), len))?;
            check(libc::listen(l, 128))?;
            let sent = send(chan, Some(l));
            libc::close(l);
            if sent < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if inbound {
            let pid = libc::fork();
            check(pid)?;
            if pid == 0 {
                helper(chan);
            }
        }
    }
    Ok(())
}

/// `127.0.0.1:port` as the kernel takes it, and its length.
fn loopback(port: u16) -> (libc::sockaddr_in, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_in is a valid value of it.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    addr.sin_family = libc::AF_INET as libc::sa_family_t;
    addr.sin_port = port.to_be();
    addr.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 1]).to_be();
    (addr, std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t)
}

/// Sends one byte on `chan`, with `fd` (when given) as SCM_RIGHTS; what sendmsg returns.
fn send(chan: RawFd, fd: Option<RawFd>) -> isize {
    // SAFETY: the message and its control buffer live on this frame for the call; the control
    // buffer is aligned (u64) and has room for one descriptor's header and data.
    unsafe {
        let mut byte = [u8::from(fd.is_some())];
        let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
        let mut control = [0u64; 4];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        if let Some(fd) = fd {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        }
        libc::sendmsg(chan, &raw const msg, 0)
    }
}

/// The helper left in the namespace: for each port the worker sends, a socket connected to it
/// inside, sent back (or, when the connection fails, one byte without it). It ends with the
/// agent (the parent-death signal) or when the worker's end closes. Never returns.
unsafe fn helper(chan: RawFd) -> ! {
    // SAFETY: system calls on integers and on structures on this stack frame; `_exit` ends the
    // fork without running anything of the worker's.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        // Nothing of the agent's but the channel: not its pipes, and above all not the one
        // through which the worker's spawn waits for the exec (it would wait for ever).
        let chan_u = chan as libc::c_uint;
        if chan_u > 0 {
            libc::syscall(libc::SYS_close_range, 0 as libc::c_uint, chan_u - 1, 0 as libc::c_uint);
        }
        libc::syscall(libc::SYS_close_range, chan_u + 1, libc::c_uint::MAX, 0 as libc::c_uint);
        loop {
            let mut port = [0u8; 2];
            if libc::recv(chan, port.as_mut_ptr().cast(), 2, 0) != 2 {
                libc::_exit(0);
            }
            let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            let (addr, len) = loopback(u16::from_be_bytes(port));
            let connected = s >= 0 && libc::connect(s, (&raw const addr).cast(), len) == 0;
            let sent = send(chan, connected.then_some(s));
            if s >= 0 {
                libc::close(s);
            }
            if sent < 0 {
                libc::_exit(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A namespace made for a python server on `port` inside it, the user mapped through a
    /// user namespace (as for a worker that is not root) or not.
    async fn server_inside(userns: bool) -> (tokio::process::Child, Arc<Link>, u16) {
        let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        // The proxy's port (the child binds it inside for the way out) and the server's.
        let (proxy, port) = (free().port(), free().port());
        let mut link = Link::new(proxy, true).unwrap();
        link.maps.root = link.maps.root && !userns;
        let link = Arc::new(link);
        let mut cmd = tokio::process::Command::new("python3");
        let serve = format!(
            "import socket\ns = socket.socket()\ns.bind(('127.0.0.1', {port}))\ns.listen()\n\
             while True:\n    c, _ = s.accept()\n    c.sendall(b'inside\\n')\n    c.close()\n"
        );
        cmd.args(["-c", &serve]).kill_on_drop(true);
        link.prepare(&mut cmd);
        (cmd.spawn().unwrap(), link, port)
    }

    async fn read_line(port: u16) -> std::io::Result<String> {
        use tokio::io::AsyncReadExt;
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let mut text = String::new();
        s.read_to_string(&mut text).await?;
        Ok(text)
    }

    /// The server inside, reached from the host through the helper; the host's own loopback
    /// at the same port is not it; the way in closes with its guard.
    async fn reached_from_outside(userns: bool) {
        let (child, link, port) = server_inside(userns).await;
        // The process the worker started is the program itself, not the helper.
        // Read once it has exec'd: until then it is a copy of this test (or, mid-exec, empty).
        let pid = child.id().unwrap();
        let cmdline = || {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&raw).into_owned()
        };
        let start = std::time::Instant::now();
        while !cmdline().contains("python3") && start.elapsed().as_secs() < 60 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let cmdline = cmdline();
        assert!(cmdline.contains("python3") && !cmdline.contains("taskbridge"), "{cmdline}");
        // The listener the child bound for the proxy arrived (it was sent before the exec).
        let _out = link.forward().unwrap();
        let (outside, inward) = link.expose(port).await.unwrap();
        let mut got = String::new();
        for _ in 0..200 {
            match read_line(outside).await {
                Ok(text) if !text.is_empty() => {
                    got = text;
                    break;
                }
                _ => tokio::time::sleep(std::time::Duration::from_millis(25)).await,
            }
        }
        assert_eq!(got, "inside\n", "userns: {userns}");
        assert!(read_line(port).await.is_err(), "nothing listens at that port on the host");
        drop(inward);
        tokio::task::yield_now().await;
        let after =
            tokio::time::timeout(std::time::Duration::from_secs(5), read_line(outside)).await;
        assert!(
            !matches!(after, Ok(Ok(ref t)) if !t.is_empty()),
            "closed with its guard: {after:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_in_the_namespace_is_reached_through_the_helper() {
        assert!(available(), "this kernel and user can make a network namespace");
        reached_from_outside(false).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn through_a_user_namespace_too_as_for_a_worker_that_is_not_root() {
        reached_from_outside(true).await;
    }

    #[tokio::test]
    async fn a_namespace_that_cannot_be_made_fails_the_start_saying_why() {
        // A user map the kernel refuses (as if this user could not map itself).
        let mut link = Link::new(0, false).unwrap();
        link.maps.root = false;
        let bogus = b"not a map\n";
        link.maps.uid[..bogus.len()].copy_from_slice(bogus);
        link.maps.uid_len = bogus.len();
        let link = Arc::new(link);
        let mut cmd = tokio::process::Command::new("true");
        link.prepare(&mut cmd);
        let err = cmd.spawn().map(|_| ()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    }
}
