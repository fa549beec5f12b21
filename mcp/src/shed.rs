//! The HTTP listener's own defence: connections are counted, and the ones that have not yet
//! shown the right token are shed first. Every user of the machine can open connections to a
//! loopback port; without this, a few hundred half-sent requests (slowloris) hold every file
//! descriptor, the real client cannot connect, and the worker's own file operations start to
//! fail with a misleading cause.
//!
//! - A connection is *trusted* once one of its requests passed the guard (`crate::http`), and
//!   *pending* until then. A pending one that has not sent a whole request within
//!   [`HEADER_TIMEOUT`] is closed, and so is a trusted one idle for [`IDLE_TIMEOUT`].
//! - There is a cap in total ([`Limits::total`], from the descriptor limit) and per peer
//!   address. At a cap, a new connection takes the place of the oldest pending one; only when
//!   every connection is trusted is the new one turned away. That is the reserve: a caller with
//!   the token connects, sends its request at once, and is in before a flood of pending
//!   connections could push it out.

use std::future::Future as _;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// How long a connection may take to send its first whole request.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a trusted connection may stay silent both ways (an event stream is not: the
/// server pings it).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections in all.
    pub total: usize,
    /// Connections from one address.
    pub per_peer: usize,
}

impl Limits {
    /// A quarter of the process's descriptor limit, between 16 and 1,024 connections: the rest
    /// is the worker's (its database, logs, agents' pipes, git). One address may hold three
    /// quarters of them.
    pub fn from_descriptors(nofile: u64) -> Limits {
        let total = usize::try_from(nofile / 4).unwrap_or(usize::MAX).clamp(16, 1024);
        Limits { total, per_peer: (total * 3 / 4).max(1) }
    }

    /// From this process's soft `RLIMIT_NOFILE`.
    pub fn of_this_process() -> Limits {
        let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(1024, |(soft, _)| soft);
        Limits::from_descriptors(soft)
    }
}

/// One connection's standing, shared by its stream, the table and the requests made on it.
#[derive(Debug)]
pub struct Conn {
    id: u64,
    peer: IpAddr,
    since: Instant,
    trusted: AtomicBool,
    /// Milliseconds after `since` of its last read or write.
    active_ms: AtomicU64,
    evict: CancellationToken,
}

impl Conn {
    /// One of its requests passed the guard.
    pub fn trust(&self) {
        self.trusted.store(true, Ordering::Relaxed);
    }

    fn trusted(&self) -> bool {
        self.trusted.load(Ordering::Relaxed)
    }

    fn touch(&self) {
        self.touch_at(Instant::now());
    }

    fn touch_at(&self, at: Instant) {
        let ms = u64::try_from(at.saturating_duration_since(self.since).as_millis());
        self.active_ms.store(ms.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn idle(&self, now: Instant) -> Duration {
        let active = self.since + Duration::from_millis(self.active_ms.load(Ordering::Relaxed));
        now.saturating_duration_since(active)
    }
}

/// Who is calling, as requests see it (`ConnectInfo<Peer>`).
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    pub conn: Arc<Conn>,
}

/// The open connections.
#[derive(Debug)]
pub struct Table {
    limits: Limits,
    next: AtomicU64,
    open: Mutex<Vec<Arc<Conn>>>,
}

impl Table {
    pub fn new(limits: Limits) -> Arc<Table> {
        Arc::new(Table { limits, next: AtomicU64::new(0), open: Mutex::default() })
    }

    /// A place for a connection from `peer`, made by shedding the oldest pending one where a
    /// cap is reached; `None` when every connection in the way is trusted.
    pub fn admit(&self, peer: IpAddr) -> Option<Arc<Conn>> {
        self.admit_at(peer, Instant::now())
    }

    fn admit_at(&self, peer: IpAddr, now: Instant) -> Option<Arc<Conn>> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        shed_overdue(&mut open, now);
        let from_peer = open.iter().filter(|c| c.peer == peer).count();
        if from_peer >= self.limits.per_peer && !shed_oldest_pending(&mut open, Some(peer)) {
            return None;
        }
        if open.len() >= self.limits.total && !shed_oldest_pending(&mut open, None) {
            return None;
        }
        let conn = Arc::new(Conn {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            peer,
            since: now,
            trusted: AtomicBool::new(false),
            active_ms: AtomicU64::new(0),
            evict: CancellationToken::new(),
        });
        open.push(conn.clone());
        Some(conn)
    }

    /// Closes what is overdue (see the module's documentation); the listener calls it every
    /// second, so a flood that stops is cleared without a new connection to make room for.
    pub fn sweep(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        shed_overdue(&mut open, Instant::now());
    }

    fn shed_one_pending(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        shed_oldest_pending(&mut open, None);
    }

    fn close(&self, id: u64) {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).retain(|c| c.id != id);
    }

    /// How many are open, and how many of them trusted.
    pub fn counts(&self) -> (usize, usize) {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        (open.len(), open.iter().filter(|c| c.trusted()).count())
    }
}

fn shed(open: &mut Vec<Arc<Conn>>, at: usize) {
    open.remove(at).evict.cancel();
}

fn shed_overdue(open: &mut Vec<Arc<Conn>>, now: Instant) {
    let overdue = |c: &Arc<Conn>| match c.trusted() {
        false => now.saturating_duration_since(c.since) >= HEADER_TIMEOUT,
        true => c.idle(now) >= IDLE_TIMEOUT,
    };
    while let Some(at) = open.iter().position(overdue) {
        shed(open, at);
    }
}

/// Sheds the oldest pending connection (of `peer`, when given); false when there is none.
fn shed_oldest_pending(open: &mut Vec<Arc<Conn>>, peer: Option<IpAddr>) -> bool {
    let at = open.iter().position(|c| !c.trusted() && peer.is_none_or(|p| c.peer == p));
    at.map(|at| shed(open, at)).is_some()
}

/// The listener `axum::serve` accepts from.
pub struct Shedding {
    inner: TcpListener,
    table: Arc<Table>,
    tick: tokio::time::Interval,
}

impl Shedding {
    pub fn new(inner: TcpListener, table: Arc<Table>) -> Shedding {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        Shedding { inner, table, tick }
    }
}

impl axum::serve::Listener for Shedding {
    type Io = Tracked;
    type Addr = Peer;

    async fn accept(&mut self) -> (Tracked, Peer) {
        loop {
            let accepted = tokio::select! {
                a = self.inner.accept() => a,
                _ = self.tick.tick() => {
                    self.table.sweep();
                    continue;
                }
            };
            match accepted {
                Ok((stream, addr)) => {
                    let Some(conn) = self.table.admit(addr.ip()) else {
                        tracing::debug!(%addr, "turned a connection away: every place is taken by a trusted one");
                        continue;
                    };
                    let evicted = Box::pin(conn.evict.clone().cancelled_owned());
                    let peer = Peer { addr, conn: conn.clone() };
                    return (Tracked { stream, conn, table: self.table.clone(), evicted }, peer);
                }
                // Out of descriptors (or another transient failure): make room and wait a
                // moment, rather than spin or give up.
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed; shedding the oldest pending one");
                    self.table.shed_one_pending();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Peer> {
        Err(std::io::Error::other("a shedding listener has no peer of its own"))
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Shedding>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Shedding>) -> Peer {
        stream.remote_addr().clone()
    }
}

/// A connection's stream: it fails once the connection is shed (whatever hyper waits on), and
/// gives its place back when dropped.
pub struct Tracked {
    stream: TcpStream,
    conn: Arc<Conn>,
    table: Arc<Table>,
    evicted: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl Tracked {
    fn shed(&mut self, cx: &mut Context<'_>) -> Option<std::io::Error> {
        self.evicted
            .as_mut()
            .poll(cx)
            .is_ready()
            .then(|| std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "connection shed"))
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.table.close(self.conn.id);
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(e) = self.shed(cx) {
            return Poll::Ready(Err(e));
        }
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if polled.is_ready() {
            self.conn.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if let Some(e) = self.shed(cx) {
            return Poll::Ready(Err(e));
        }
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        if polled.is_ready() {
            self.conn.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn the_caps_follow_the_descriptor_limit() {
        assert_eq!(Limits::from_descriptors(1024), Limits { total: 256, per_peer: 192 });
        assert_eq!(Limits::from_descriptors(20), Limits { total: 16, per_peer: 12 });
        assert_eq!(Limits::from_descriptors(1 << 20), Limits { total: 1024, per_peer: 768 });
    }

    #[test]
    fn at_the_cap_the_oldest_pending_connection_makes_room_and_trusted_ones_stay() {
        let t = Table::new(Limits { total: 3, per_peer: 3 });
        let now = Instant::now();
        let a = t.admit_at(ip(1), now).unwrap();
        let b = t.admit_at(ip(1), now).unwrap();
        let c = t.admit_at(ip(2), now).unwrap();
        a.trust();
        let d = t.admit_at(ip(3), now).unwrap();
        assert!(b.evict.is_cancelled(), "the oldest pending one was shed");
        assert!(!a.evict.is_cancelled() && !c.evict.is_cancelled() && !d.evict.is_cancelled());
        assert_eq!(t.counts(), (3, 1));
        c.trust();
        d.trust();
        assert!(t.admit_at(ip(4), now).is_none(), "every place is trusted: turned away");
        assert_eq!(t.counts(), (3, 3));
        // A closed one gives its place back.
        t.close(a.id);
        assert!(t.admit_at(ip(4), now).is_some());
    }

    #[test]
    fn one_peer_is_capped_below_the_total_and_sheds_its_own_first() {
        let t = Table::new(Limits { total: 10, per_peer: 2 });
        let now = Instant::now();
        let other = t.admit_at(ip(9), now).unwrap();
        let a = t.admit_at(ip(1), now).unwrap();
        let b = t.admit_at(ip(1), now).unwrap();
        let c = t.admit_at(ip(1), now).unwrap();
        assert!(a.evict.is_cancelled() && !b.evict.is_cancelled() && !c.evict.is_cancelled());
        assert!(!other.evict.is_cancelled(), "another peer's pending connection stays");
        b.trust();
        c.trust();
        assert!(t.admit_at(ip(1), now).is_none(), "that peer's places are all trusted");
        assert!(t.admit_at(ip(2), now).is_some(), "another peer still gets in");
    }

    #[test]
    fn a_pending_connection_is_shed_at_the_header_timeout_and_a_trusted_one_when_idle() {
        let t = Table::new(Limits { total: 10, per_peer: 10 });
        let start = Instant::now();
        let slow = t.admit_at(ip(1), start).unwrap();
        let good = t.admit_at(ip(1), start).unwrap();
        good.trust();
        t.admit_at(ip(2), start + HEADER_TIMEOUT - Duration::from_millis(1)).unwrap();
        assert!(!slow.evict.is_cancelled(), "not yet");
        t.admit_at(ip(2), start + HEADER_TIMEOUT).unwrap();
        assert!(slow.evict.is_cancelled(), "overdue");
        assert!(!good.evict.is_cancelled(), "trusted and not idle for long");
        let busy = start + Duration::from_secs(100);
        good.touch_at(busy);
        t.admit_at(ip(3), start + IDLE_TIMEOUT).unwrap();
        assert!(!good.evict.is_cancelled(), "it was active after it started");
        t.admit_at(ip(3), busy + IDLE_TIMEOUT - Duration::from_millis(1)).unwrap();
        assert!(!good.evict.is_cancelled(), "not yet");
        t.admit_at(ip(3), busy + IDLE_TIMEOUT).unwrap();
        assert!(good.evict.is_cancelled(), "idle past the limit");
    }

    #[test]
    fn the_sweep_closes_what_is_overdue_without_a_new_connection() {
        let t = Table::new(Limits { total: 10, per_peer: 10 });
        let now = Instant::now();
        let Some(long_ago) = now.checked_sub(HEADER_TIMEOUT + Duration::from_secs(1)) else {
            return; // a machine up for less than the timeout has no such past
        };
        let fresh = t.admit_at(ip(1), now).unwrap();
        let slow = t.admit_at(ip(1), long_ago).unwrap();
        assert!(!slow.evict.is_cancelled(), "not shed by its own admission");
        t.sweep();
        assert!(slow.evict.is_cancelled() && !fresh.evict.is_cancelled());
        assert_eq!(t.counts(), (1, 0));
    }

    #[test]
    fn out_of_descriptors_the_oldest_pending_connection_goes() {
        let t = Table::new(Limits { total: 10, per_peer: 10 });
        let now = Instant::now();
        let trusted = t.admit_at(ip(1), now).unwrap();
        trusted.trust();
        let (old, young) = (t.admit_at(ip(2), now).unwrap(), t.admit_at(ip(3), now).unwrap());
        t.shed_one_pending();
        assert!(old.evict.is_cancelled());
        assert!(!young.evict.is_cancelled() && !trusted.evict.is_cancelled());
        assert_eq!(t.counts(), (2, 1));
    }

    #[test]
    fn activity_is_stamped_when_it_happens() {
        let t = Table::new(Limits { total: 10, per_peer: 10 });
        let c = t.admit_at(ip(1), Instant::now()).unwrap();
        // Time passes (at least 5 ms), then the connection reads or writes.
        std::thread::sleep(Duration::from_millis(5));
        c.touch();
        assert!(c.idle(c.since + IDLE_TIMEOUT) < IDLE_TIMEOUT, "stamped after it opened");
    }

    #[tokio::test]
    async fn a_shed_connection_fails_its_reads_and_writes_and_a_closed_one_gives_its_place_back() {
        use axum::serve::Listener as _;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let inner = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = inner.local_addr().unwrap();
        let table = Table::new(Limits { total: 2, per_peer: 2 });
        let mut listener = Shedding::new(inner, table.clone());
        let mut c1 = TcpStream::connect(addr).await.unwrap();
        let (mut t1, p1) = listener.accept().await;
        let mut c2 = TcpStream::connect(addr).await.unwrap();
        let (mut t2, p2) = listener.accept().await;
        assert_eq!(p2.addr.ip(), ip(1));
        p2.conn.trust();
        // Bytes go both ways through a tracked stream, and its end reaches the peer.
        c1.write_all(b"hi").await.unwrap();
        let mut got = [0u8; 2];
        t1.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hi");
        t1.write_all(b"yo").await.unwrap();
        t1.flush().await.unwrap();
        c1.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"yo");
        t2.shutdown().await.unwrap();
        let eof = tokio::time::timeout(Duration::from_secs(5), c2.read(&mut got)).await;
        assert_eq!(eof.unwrap().unwrap(), 0, "the peer sees the end");
        // A third connection takes the place of the oldest pending one, the first.
        let _c3 = TcpStream::connect(addr).await.unwrap();
        let (_t3, _) = listener.accept().await;
        assert!(p1.conn.evict.is_cancelled());
        let read = t1.read(&mut got).await.unwrap_err();
        assert_eq!(read.kind(), std::io::ErrorKind::ConnectionAborted);
        let write = t1.write(b"x").await.unwrap_err();
        assert_eq!(write.kind(), std::io::ErrorKind::ConnectionAborted);
        assert_eq!(table.counts(), (2, 1));
        drop(t2);
        assert_eq!(table.counts(), (1, 0), "a dropped stream gives its place back");
    }
}
