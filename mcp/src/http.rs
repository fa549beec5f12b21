//! Streamable HTTP at `/mcp`, and `/metrics` beside it, with the checks a local server needs
//! before anything else: Host and Origin against an allow-list (DNS rebinding), then the bearer
//! token. Both answer before the request body is read.

use crate::error::{Error, Result};
use crate::shed::{Limits, Peer, Shedding, Table};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Default)]
pub struct HttpConfig {
    pub listen: String,
    pub token: Option<String>,
    /// Host names accepted besides the loopback ones (e.g. a tunnel's host name).
    pub allowed_hosts: Vec<String>,
    /// Answer POSTs with plain JSON (stateless) instead of SSE streams.
    pub json_response: bool,
    /// The queue `/metrics` reads; without it there is no `/metrics`.
    pub metrics: Option<MetricsOf>,
}

/// The queue a `/metrics` route reports on (with this process's own counts).
#[derive(Clone)]
pub struct MetricsOf(pub Arc<queue::Store>);

const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Binds the listener, refusing a non-loopback address without a token.
pub async fn bind(cfg: &HttpConfig) -> Result<TcpListener> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(&cfg.listen)
        .await
        .map_err(|e| Error::Listen {
            addr: cfg.listen.clone(),
            message: format!("not an address: {e}"),
        })?
        .collect();
    let addr = *addrs.first().ok_or_else(|| Error::Listen {
        addr: cfg.listen.clone(),
        message: "resolves to no address".into(),
    })?;
    if !addr.ip().is_loopback() && cfg.token.as_deref().is_none_or(str::is_empty) {
        return Err(Error::Insecure(cfg.listen.clone()));
    }
    TcpListener::bind(addr).await.map_err(|e| Error::Listen {
        addr: cfg.listen.clone(),
        message: if e.kind() == std::io::ErrorKind::AddrInUse {
            "the port is in use (another taskbridge serve or tui?); pick another with --listen"
                .into()
        } else {
            e.to_string()
        },
    })
}

struct Guard {
    hosts: Vec<String>,
    token: Option<String>,
    failures: Failures,
}

/// Wrong tokens per peer address: after a burst, a peer's further wrong tokens are answered 429
/// until its window ends. The right token always passes (every local user shares 127.0.0.1, so
/// blocking the address would let anyone lock the real client out); what the throttle buys is
/// a slower, visible guesser.
#[derive(Default)]
struct Failures {
    per_peer: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, (u32, Instant)>>,
}

/// Wrong tokens a peer may send in one window before it is answered 429.
const BURST: u32 = 10;
const WINDOW: Duration = Duration::from_secs(60);
/// Peers remembered before the ones whose window is over are dropped.
const MAX_PEERS: usize = 4096;

impl Failures {
    /// Counts a wrong token from `peer`; `Some(seconds)` to wait when it is over the burst.
    fn record(&self, peer: std::net::IpAddr) -> (u32, Option<u64>) {
        self.record_at(peer, Instant::now())
    }

    fn record_at(&self, peer: std::net::IpAddr, now: Instant) -> (u32, Option<u64>) {
        let mut map = self.per_peer.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded: a flood from many addresses drops the windows that are over.
        if map.len() > MAX_PEERS {
            map.retain(|_, (_, since)| now.duration_since(*since) < WINDOW);
        }
        let entry = map.entry(peer).or_insert((0, now));
        if now.duration_since(entry.1) >= WINDOW {
            *entry = (0, now);
        }
        entry.0 += 1;
        let wait = (entry.0 > BURST)
            .then(|| WINDOW.saturating_sub(now.duration_since(entry.1)).as_secs().max(1));
        (entry.0, wait)
    }
}

/// `host[:port]` or `[v6]:port` to the bare, lower-case host.
fn host_only(authority: &str) -> String {
    let a = authority.trim().to_ascii_lowercase();
    if let Some(rest) = a.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("").to_owned();
    }
    match a.rsplit_once(':') {
        Some((h, port)) if !h.contains(':') && port.chars().all(|c| c.is_ascii_digit()) => {
            h.to_owned()
        }
        _ => a,
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Guard {
    fn host_allowed(&self, host: &str) -> bool {
        let h = host_only(host);
        self.hosts.contains(&h)
    }

    fn check(&self, headers: &HeaderMap) -> std::result::Result<(), Refusal> {
        match headers.get(header::HOST).and_then(|h| h.to_str().ok()) {
            Some(h) if self.host_allowed(h) => {}
            Some(_) => {
                return Err(Refusal::Forbidden(
                    "Host header is not allowed; add it with --allowed-host",
                ));
            }
            None => return Err(Refusal::Forbidden("missing Host header")),
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let ok = origin
                .to_str()
                .ok()
                .and_then(|o| o.split_once("://").map(|(_, rest)| rest.to_owned()))
                .is_some_and(|rest| self.host_allowed(rest.split('/').next().unwrap_or("")));
            if !ok {
                return Err(Refusal::Forbidden("Origin header is not allowed"));
            }
        }
        if let Some(token) = &self.token {
            let given = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or("");
            if !constant_time_eq(given.trim().as_bytes(), token.as_bytes()) {
                return Err(Refusal::Unauthorized);
            }
        }
        Ok(())
    }
}

#[derive(Debug, PartialEq)]
enum Refusal {
    Forbidden(&'static str),
    Unauthorized,
    /// Too many wrong tokens from this peer; retry after this many seconds.
    Throttled(u64),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Forbidden(msg) => {
                (StatusCode::FORBIDDEN, format!("Forbidden: {msg}\n")).into_response()
            }
            Refusal::Unauthorized => {
                let mut r = (
                    StatusCode::UNAUTHORIZED,
                    "Unauthorized: send Authorization: Bearer <token>\n",
                )
                    .into_response();
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static(
                        "Bearer realm=\"taskbridge\", error=\"invalid_token\"",
                    ),
                );
                r
            }
            Refusal::Throttled(secs) => {
                let mut r = (
                    StatusCode::TOO_MANY_REQUESTS,
                    "Too many wrong tokens from this address; wait, then send the right one\n",
                )
                    .into_response();
                if let Ok(v) = header::HeaderValue::from_str(&secs.to_string()) {
                    r.headers_mut().insert(header::RETRY_AFTER, v);
                }
                r
            }
        }
    }
}

async fn guard(State(g): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let caller = req.extensions().get::<axum::extract::ConnectInfo<Peer>>().map(|c| c.0.clone());
    if let Err(r) = g.check(req.headers()) {
        if r == Refusal::Unauthorized {
            let peer = caller.map_or(std::net::IpAddr::from([0, 0, 0, 0]), |c| c.addr.ip());
            let (count, wait) = g.failures.record(peer);
            // Never the token given: a near miss of the real one would be in the log.
            if count == 1 || count.is_power_of_two() || wait.is_none() {
                tracing::warn!(%peer, wrong_tokens_in_window = count, "refused a call without the right token");
            }
            if let Some(secs) = wait {
                return Refusal::Throttled(secs).into_response();
            }
        }
        return r.into_response();
    }
    // The connection showed the token: it is no longer one to shed first (`crate::shed`).
    if let Some(c) = caller {
        c.conn.trust();
    }
    let is_delete = req.method() == axum::http::Method::DELETE;
    let mut resp = next.run(req).await;
    // rmcp answers a session DELETE with 202; clients (the Python SDK among them) expect 200 for
    // a session that was ended.
    if is_delete && resp.status() == StatusCode::ACCEPTED {
        *resp.status_mut() = StatusCode::OK;
    }
    resp
}

/// Serves until `shutdown` is cancelled.
pub async fn serve_http<S>(
    server: S,
    listener: TcpListener,
    cfg: HttpConfig,
    shutdown: CancellationToken,
) -> Result<()>
where
    S: rmcp::ServerHandler + Clone,
{
    let mut hosts: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| h.to_string()).collect();
    hosts.extend(cfg.allowed_hosts.iter().map(|h| host_only(h)));
    let rmcp_cfg = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts.clone())
        .with_json_response(cfg.json_response)
        .with_legacy_session_mode(!cfg.json_response)
        .with_cancellation_token(shutdown.child_token());
    let svc = StreamableHttpService::new(
        move || Ok(server.clone()),
        crate::sessions::CappedSessions::new(crate::sessions::MAX_SESSIONS, crate::sessions::IDLE)
            .into(),
        rmcp_cfg,
    );
    let metrics = cfg.metrics.clone();
    let app = with_metrics(axum::Router::new().nest_service("/mcp", svc), metrics);
    serve_guarded(app, listener, cfg, hosts, shutdown).await
}

/// `/metrics` alone (`worker --metrics-listen`), behind the same checks as `/mcp`.
pub async fn serve_metrics(
    listener: TcpListener,
    cfg: HttpConfig,
    shutdown: CancellationToken,
) -> Result<()> {
    let mut hosts: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| h.to_string()).collect();
    hosts.extend(cfg.allowed_hosts.iter().map(|h| host_only(h)));
    let app = with_metrics(axum::Router::new(), cfg.metrics.clone());
    serve_guarded(app, listener, cfg, hosts, shutdown).await
}

fn with_metrics(app: axum::Router, metrics: Option<MetricsOf>) -> axum::Router {
    match metrics {
        Some(m) => app.route("/metrics", axum::routing::get(scrape).with_state(m)),
        None => app,
    }
}

async fn serve_guarded(
    app: axum::Router,
    listener: TcpListener,
    cfg: HttpConfig,
    hosts: Vec<String>,
    shutdown: CancellationToken,
) -> Result<()> {
    let g = Arc::new(Guard {
        hosts,
        token: cfg.token.filter(|t| !t.is_empty()),
        failures: Failures::default(),
    });
    let app = app.layer(axum::middleware::from_fn_with_state(g, guard));
    let listener = Shedding::new(listener, Table::new(Limits::of_this_process()));
    axum::serve(listener, app.into_make_service_with_connect_info::<Peer>())
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(|e| Error::Serve(e.to_string()))
}

/// One scrape: the queue read off the runtime (a PostgreSQL round trip, a SQLite read).
async fn scrape(State(MetricsOf(store)): State<MetricsOf>) -> Response {
    let rendered = tokio::task::spawn_blocking(move || worker::render_metrics(&store)).await;
    match rendered {
        Ok(Ok(text)) => {
            ([(header::CONTENT_TYPE, worker::METRICS_CONTENT_TYPE)], text).into_response()
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "a scrape could not read the queue");
            (StatusCode::SERVICE_UNAVAILABLE, format!("the queue could not be read: {e}\n"))
                .into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_forms_are_normalised() {
        assert_eq!(host_only("127.0.0.1:8765"), "127.0.0.1");
        assert_eq!(host_only("[::1]:80"), "::1");
        assert_eq!(host_only("LocalHost"), "localhost");
        assert_eq!(host_only("abc.trycloudflare.com"), "abc.trycloudflare.com");
        assert_eq!(host_only(" [::1] "), "::1");
        // Not a port: kept whole, so it matches no allowed host.
        assert_eq!(host_only("localhost:x"), "localhost:x");
        // A bare IPv6 address has colons but no port.
        assert_eq!(host_only("fe80::1"), "fe80::1");
    }

    #[test]
    fn token_and_origin_checks() {
        let g = Guard {
            hosts: vec!["localhost".into(), "127.0.0.1".into()],
            token: Some("s3cret".into()),
            failures: Failures::default(),
        };
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:1".parse().unwrap());
        assert_eq!(g.check(&h).unwrap_err(), Refusal::Unauthorized);
        h.insert(header::AUTHORIZATION, "Bearer s3cret".parse().unwrap());
        assert!(g.check(&h).is_ok());
        h.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(matches!(g.check(&h).unwrap_err(), Refusal::Forbidden(_)));
        h.insert(header::ORIGIN, "http://localhost:3000".parse().unwrap());
        assert!(g.check(&h).is_ok());
        h.insert(header::HOST, "evil.example".parse().unwrap());
        assert!(matches!(g.check(&h).unwrap_err(), Refusal::Forbidden(_)));
    }

    #[test]
    fn a_wrong_token_of_the_right_length_or_last_byte_is_refused() {
        let right = "a".repeat(63) + "b";
        let g = Guard {
            hosts: vec!["127.0.0.1".into()],
            token: Some(right.clone()),
            failures: Failures::default(),
        };
        let with = |t: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, "127.0.0.1:1".parse().unwrap());
            h.insert(header::AUTHORIZATION, format!("Bearer {t}").parse().unwrap());
            g.check(&h)
        };
        assert!(with(&right).is_ok());
        assert_eq!(with(&("a".repeat(63) + "c")).unwrap_err(), Refusal::Unauthorized);
        assert_eq!(with(&"b".repeat(64)).unwrap_err(), Refusal::Unauthorized);
        assert_eq!(with(&right[..63]).unwrap_err(), Refusal::Unauthorized);
    }

    #[test]
    fn wrong_tokens_are_throttled_per_peer_after_a_burst() {
        let f = Failures::default();
        let (a, b) = ([127, 0, 0, 1].into(), [10, 0, 0, 2].into());
        for n in 1..=BURST {
            assert_eq!(f.record(a), (n, None));
        }
        let (n, wait) = f.record(a);
        assert_eq!(n, BURST + 1);
        assert!(wait.is_some_and(|s| (1..=WINDOW.as_secs()).contains(&s)), "{wait:?}");
        // Another peer has its own count.
        assert_eq!(f.record(b), (1, None));
    }

    #[test]
    fn a_window_ends_and_the_peers_whose_window_is_over_are_forgotten() {
        let f = Failures::default();
        let t0 = Instant::now();
        let a: std::net::IpAddr = [127, 0, 0, 1].into();
        for _ in 0..=BURST {
            f.record_at(a, t0);
        }
        assert!(f.record_at(a, t0 + WINDOW - Duration::from_secs(1)).1.is_some(), "still slowed");
        assert_eq!(f.record_at(a, t0 + WINDOW), (1, None), "a new window starts afresh");
        for i in 0..=MAX_PEERS as u32 {
            f.record_at(std::net::IpAddr::from(i.to_be_bytes()), t0);
        }
        let later = t0 + WINDOW * 2;
        f.record_at(a, later);
        let kept = f.per_peer.lock().unwrap().len();
        assert_eq!(kept, 1, "only the peer seen in the current window is kept");
        // Within the window, nobody is forgotten.
        let g = Failures::default();
        for i in 0..=MAX_PEERS as u32 + 1 {
            g.record_at(std::net::IpAddr::from(i.to_be_bytes()), t0);
        }
        assert_eq!(g.per_peer.lock().unwrap().len(), MAX_PEERS + 2);
        // The bounds exactly: a full table is not pruned yet, and a window exactly over is.
        let h = Failures::default();
        for i in 0..MAX_PEERS as u32 {
            h.record_at(std::net::IpAddr::from(i.to_be_bytes()), t0);
        }
        h.record_at(a, t0 + WINDOW * 2);
        assert_eq!(h.per_peer.lock().unwrap().len(), MAX_PEERS + 1, "pruned before it was over");
        h.record_at([10, 9, 9, 9].into(), t0 + WINDOW * 3);
        assert_eq!(h.per_peer.lock().unwrap().len(), 1, "a window exactly over is dropped");
    }

    #[test]
    fn tokens_differing_by_the_same_bit_in_two_places_are_refused() {
        // Differences that would cancel if they were combined by xor instead of or.
        assert!(!constant_time_eq(b"aa", b"``"));
        assert!(constant_time_eq(b"aa", b"aa"));
        assert!(!constant_time_eq(b"aa", b"a"));
    }
}
