//! The way out of a wall without network: an HTTP proxy the worker owns, on a loopback port,
//! the only TCP port such a wall lets the agent connect to. It forwards to the model provider's
//! hosts and nowhere else (`CONNECT host:port` for HTTPS, an absolute-form request for plain
//! HTTP), so the agent reaches its model while its commands, which inherit the same wall and
//! the same proxy variables, reach nothing else. The agents are pointed at it with the
//! standard `HTTPS_PROXY`/`HTTP_PROXY` variables.

use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The longest request head the proxy reads before refusing.
const MAX_HEAD: usize = 16 * 1024;

/// A `host:port` the proxy forwards to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub port: u16,
}

impl Host {
    /// The host of an `http://` or `https://` URL, with its port (the scheme's by default).
    pub fn of_url(url: &str) -> Option<Host> {
        let (scheme, rest) = url.split_once("://")?;
        let default = match scheme.to_ascii_lowercase().as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        let authority = rest.split(['/', '?', '#']).next()?;
        let authority = authority.rsplit('@').next()?;
        Host::parse(authority, default)
    }

    /// `name[:port]`, with `default` when no port is given.
    pub fn parse(authority: &str, default: u16) -> Option<Host> {
        let (name, port) = match authority.rsplit_once(':') {
            Some((n, p)) if !n.ends_with(':') && p.chars().all(|c| c.is_ascii_digit()) => {
                (n, p.parse().ok()?)
            }
            _ => (authority, default),
        };
        let name = name.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        (!name.is_empty()).then_some(Host { name, port })
    }
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.name, self.port)
    }
}

/// The running proxy: its port, and the hosts it forwards to.
pub struct Proxy {
    pub port: u16,
    pub allowed: Arc<Vec<Host>>,
}

impl Proxy {
    /// Starts the proxy on a free loopback port; it runs until the runtime stops.
    pub async fn start(allowed: Vec<Host>) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let allowed = Arc::new(allowed);
        let hosts = allowed.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let hosts = hosts.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(conn, &hosts).await {
                        tracing::debug!(error = %e, "a proxied connection ended");
                    }
                });
            }
        });
        Ok(Proxy { port, allowed })
    }

    /// The environment that sends an agent's HTTP through the proxy.
    pub fn env(&self) -> Vec<(String, String)> {
        let url = format!("http://127.0.0.1:{}", self.port);
        ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy"]
            .iter()
            .map(|k| (k.to_string(), url.clone()))
            // Nothing bypasses it: a bypassed host would be refused by the wall anyway.
            .chain(["NO_PROXY", "no_proxy"].iter().map(|k| (k.to_string(), String::new())))
            .collect()
    }
}

/// One client connection: its first request decides where it goes, or that it goes nowhere.
async fn serve(mut conn: TcpStream, allowed: &[Host]) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let end = loop {
        let mut buf = [0u8; 2048];
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(at) = find(&head, b"\r\n\r\n") {
            break at + 4;
        }
        // A head that fills MAX_HEAD and has not ended is longer than MAX_HEAD.
        if head.len() >= MAX_HEAD {
            return refuse(&mut conn, 431, "the request head is too large").await;
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let line = text.lines().next().unwrap_or_default();
    let mut words = line.split(' ');
    let (method, target, version) =
        (words.next().unwrap_or(""), words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (host, rewritten) = if method.eq_ignore_ascii_case("CONNECT") {
        (Host::parse(target, 443), None)
    } else {
        match Host::of_url(target) {
            Some(h) if target.starts_with("http://") => {
                let path_at = target["http://".len()..].find('/').map(|i| i + "http://".len());
                let path = path_at.map_or("/", |i| &target[i..]);
                let first = format!("{method} {path} {version}");
                (Some(h), Some(text.replacen(line, &first, 1)))
            }
            _ => (None, None),
        }
    };
    let Some(host) = host else {
        return refuse(&mut conn, 400, "this proxy takes CONNECT or an absolute http:// URL").await;
    };
    if !allowed.contains(&host) {
        tracing::info!(%host, "the sandbox's proxy refused a host that is not the model provider");
        let why = format!(
            "{host} is outside the sandbox: a task without network reaches only its model \
             provider ([sandbox] model_hosts)"
        );
        return refuse(&mut conn, 403, &why).await;
    }
    let mut upstream = match TcpStream::connect((host.name.as_str(), host.port)).await {
        Ok(u) => u,
        Err(e) => return refuse(&mut conn, 502, &format!("cannot reach {host}: {e}")).await,
    };
    match rewritten {
        None => conn.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n").await?,
        Some(first) => upstream.write_all(first.as_bytes()).await?,
    }
    upstream.write_all(&head[end..]).await?;
    tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
    Ok(())
}

async fn refuse(conn: &mut TcpStream, status: u16, why: &str) -> std::io::Result<()> {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        431 => "Request Header Fields Too Large",
        _ => "Bad Gateway",
    };
    let body = format!("{why}\n");
    let reply = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(reply.as_bytes()).await?;
    conn.shutdown().await
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_read_from_urls_and_authorities_with_the_schemes_port() {
        let h = |n: &str, p| Some(Host { name: n.into(), port: p });
        assert_eq!(Host::of_url("https://api.anthropic.com/v1"), h("api.anthropic.com", 443));
        assert_eq!(Host::of_url("http://127.0.0.1:8080/v1?x"), h("127.0.0.1", 8080));
        assert_eq!(Host::of_url("HTTP://User:pw@Example.COM"), h("example.com", 80));
        assert_eq!(Host::of_url("ftp://x"), None);
        assert_eq!(Host::parse("[::1]:9", 443), h("::1", 9));
        assert_eq!(Host::parse("host", 443), h("host", 443));
        // A bare IPv6 address ends in a group, not a port.
        assert_eq!(Host::parse("::1", 443), h("::1", 443));
        assert_eq!(Host::parse("", 443), None);
    }

    async fn ask(port: u16, request: &str) -> String {
        ask_in_parts(port, &[request]).await
    }

    /// The proxy's answer to a request written in `parts`, each given time to arrive alone.
    async fn ask_in_parts(port: u16, parts: &[&str]) -> String {
        let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        for part in parts {
            // A proxy that refused the head closes; what it answered is still read below.
            if c.write_all(part.as_bytes()).await.is_err() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        // What arrived before the end, or before a reset (the proxy closed on what it left
        // unread). Generous: a proxy that waits for more of a head it should have refused
        // never answers.
        let mut out = Vec::new();
        let read = async {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = c.read(&mut buf).await {
                out.extend_from_slice(&buf[..n]);
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(30), read)
            .await
            .expect("the proxy answered");
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn the_proxy_forwards_to_the_model_host_and_refuses_any_other() {
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = upstream.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = upstream.accept().await {
                let mut buf = vec![0u8; 4096];
                let n = c.read(&mut buf).await.unwrap();
                let got = String::from_utf8_lossy(&buf[..n]).into_owned();
                let first = got.lines().next().unwrap_or_default().to_owned();
                let body = format!("saw {first}");
                let reply =
                    format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                c.write_all(reply.as_bytes()).await.unwrap();
            }
        });
        let proxy = Proxy::start(vec![Host { name: "127.0.0.1".into(), port: up }]).await.unwrap();
        let plain = ask(
            proxy.port,
            &format!("GET http://127.0.0.1:{up}/v1/messages HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
        )
        .await;
        assert!(plain.ends_with("saw GET /v1/messages HTTP/1.1"), "{plain}");
        let tunnel = ask(
            proxy.port,
            &format!("CONNECT 127.0.0.1:{up} HTTP/1.1\r\n\r\nGET /t HTTP/1.1\r\n\r\n"),
        )
        .await;
        assert!(tunnel.starts_with("HTTP/1.1 200 Connection Established"), "{tunnel}");
        assert!(tunnel.ends_with("saw GET /t HTTP/1.1"), "{tunnel}");
        let other = ask(proxy.port, "CONNECT example.com:443 HTTP/1.1\r\n\r\n").await;
        assert!(
            other.starts_with("HTTP/1.1 403 Forbidden\r\n") && other.contains("example.com:443"),
            "{other}"
        );
        let port = up.wrapping_add(1);
        let near = ask(proxy.port, &format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n")).await;
        assert!(
            near.starts_with("HTTP/1.1 403 Forbidden\r\n"),
            "another port of the same host: {near}"
        );
        let bad = ask(proxy.port, "GET /relative HTTP/1.1\r\n\r\n").await;
        assert!(bad.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{bad}");
        // HTTPS goes through CONNECT: an absolute https:// URL is not forwarded in the clear.
        let clear =
            ask(proxy.port, &format!("GET https://127.0.0.1:{up}/x HTTP/1.1\r\n\r\n")).await;
        assert!(clear.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{clear}");
        // Heads as large as an agent's (8 KB of headers) pass; one past 16 KB is refused.
        let cookie = "c".repeat(8 * 1024);
        let large = format!("GET http://127.0.0.1:{up}/big HTTP/1.1\r\nx: {cookie}\r\n\r\n");
        // In two writes: a head that arrives in parts is read to its end.
        let (head, end) = large.split_at(large.len() - 4);
        let mut c = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
        c.write_all(head.as_bytes()).await.unwrap();
        c.flush().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        c.write_all(end.as_bytes()).await.unwrap();
        let mut large = String::new();
        c.read_to_string(&mut large).await.unwrap();
        assert!(large.ends_with("saw GET /big HTTP/1.1"), "{}", &large[..large.len().min(200)]);
        // A head past 16 KB that never ends, first in a part that puts no read on the limit.
        let endless = format!("x: {}", "c".repeat(20_000));
        let line = "GET http://127.0.0.1:1/ HTTP/1.1\r\n";
        let endless = ask_in_parts(proxy.port, &[line, &endless]).await;
        assert!(
            endless.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{}",
            &endless[..endless.len().min(200)]
        );
        // The limit is the head's whole length, its blank line included.
        let start = format!("GET http://127.0.0.1:{up}/edge HTTP/1.1\r\nx: ");
        let fill = |len: usize| "c".repeat(len - start.len() - 4);
        let at = format!("{start}{}\r\n\r\n", fill(MAX_HEAD));
        assert_eq!(at.len(), MAX_HEAD);
        let (first, last) = at.split_at(MAX_HEAD - 1);
        let at = ask_in_parts(proxy.port, &[first, last]).await;
        assert!(at.ends_with("saw GET /edge HTTP/1.1"), "{}", &at[..at.len().min(200)]);
        let past = format!("{start}{}\r\n\r\n", fill(MAX_HEAD + 1));
        let (first, last) = past.split_at(MAX_HEAD);
        let past = ask_in_parts(proxy.port, &[first, last]).await;
        assert!(
            past.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "one byte past: {}",
            &past[..past.len().min(200)]
        );
        let env = proxy.env();
        assert!(env.contains(&("HTTPS_PROXY".into(), format!("http://127.0.0.1:{}", proxy.port))));
        assert!(env.contains(&("NO_PROXY".into(), String::new())));
    }
}
