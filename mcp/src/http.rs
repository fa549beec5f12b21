//! Streamable HTTP at `/mcp` with the checks a local server needs before anything else: Host and
//! Origin against an allow-list (DNS rebinding), then the bearer token. Both answer before the
//! request body is read.

use crate::error::{Error, Result};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Default)]
pub struct HttpConfig {
    pub listen: String,
    pub token: Option<String>,
    /// Host names accepted besides the loopback ones (e.g. a tunnel's host name).
    pub allowed_hosts: Vec<String>,
    /// Answer POSTs with plain JSON (stateless) instead of SSE streams.
    pub json_response: bool,
}

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
        }
    }
}

async fn guard(State(g): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    if let Err(r) = g.check(req.headers()) {
        return r.into_response();
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
    let g = Arc::new(Guard { hosts, token: cfg.token.filter(|t| !t.is_empty()) });
    let app = axum::Router::new()
        .nest_service("/mcp", svc)
        .layer(axum::middleware::from_fn_with_state(g, guard));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(|e| Error::Serve(e.to_string()))
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
    }

    #[test]
    fn token_and_origin_checks() {
        let g = Guard {
            hosts: vec!["localhost".into(), "127.0.0.1".into()],
            token: Some("s3cret".into()),
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
}
