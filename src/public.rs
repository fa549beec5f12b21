//! Public-URL mode: a Cloudflare quick tunnel or ngrok in front of the loopback HTTP server.
//!
//! The tunnel runs under a small shell wrapper whose stdin is a pipe from this process: if
//! TaskBridge dies, even by SIGKILL, the pipe closes and the wrapper kills the tunnel, so a
//! tunnel never outlives TaskBridge.

use anyhow::{Context, bail};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TunnelKind {
    Cloudflare,
    Ngrok,
}

impl TunnelKind {
    fn program(self, env: &queue::Environment) -> (String, &'static str) {
        let (var, default) = match self {
            TunnelKind::Cloudflare => ("TASKBRIDGE_CLOUDFLARED", "cloudflared"),
            TunnelKind::Ngrok => ("TASKBRIDGE_NGROK", "ngrok"),
        };
        (env.var(var).unwrap_or_else(|| default.to_owned()), var)
    }

    fn args(self, port: u16) -> Vec<String> {
        match self {
            TunnelKind::Cloudflare => {
                vec!["tunnel".into(), "--url".into(), format!("http://127.0.0.1:{port}")]
            }
            TunnelKind::Ngrok => vec![
                "http".into(),
                port.to_string(),
                "--log".into(),
                "stdout".into(),
                "--log-format".into(),
                "json".into(),
            ],
        }
    }

    fn install_hint(self) -> &'static str {
        match self {
            TunnelKind::Cloudflare => {
                "install cloudflared (https://developers.cloudflare.com/cloudflare-one/connections/connect-networks/downloads/; \
                 e.g. `brew install cloudflared` or the .deb from Cloudflare), or set TASKBRIDGE_CLOUDFLARED to its path"
            }
            TunnelKind::Ngrok => {
                "install ngrok (https://ngrok.com/download) and run `ngrok config add-authtoken <token>`, or set \
                 TASKBRIDGE_NGROK to its path"
            }
        }
    }

    /// The public URL in one line of the tunnel's output, if it is there.
    pub fn url_in(self, line: &str) -> Result<Option<String>, String> {
        match self {
            TunnelKind::Cloudflare => {
                // "... INF |  https://four-dashed-word-url.trycloudflare.com  |"
                Ok(line
                    .split(|c: char| c.is_whitespace() || c == '|')
                    .find(|w| w.starts_with("https://") && w.ends_with(".trycloudflare.com"))
                    .map(str::to_owned))
            }
            TunnelKind::Ngrok => {
                // {"lvl":"info","msg":"started tunnel","obj":"tunnels","name":"command_line","addr":"http://localhost:8765","url":"https://….ngrok-free.app"}
                let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                    return Ok(None);
                };
                if v["msg"] == "started tunnel"
                    && let Some(url) = v["url"].as_str().filter(|u| u.starts_with("https://"))
                {
                    return Ok(Some(url.to_owned()));
                }
                if matches!(v["lvl"].as_str(), Some("eror" | "crit")) {
                    let err = v["err"].as_str().or(v["msg"].as_str()).unwrap_or("unknown error");
                    return Err(format!("ngrok: {err}"));
                }
                Ok(None)
            }
        }
    }
}

pub struct Tunnel {
    pub url: String,
    pub host: String,
    child: Child,
    /// Lines the tunnel prints after the URL, and its exit, for the log.
    pub exited: mpsc::Receiver<String>,
}

impl Tunnel {
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Starts the tunnel and waits (up to `timeout`) for its public URL.
pub async fn start(
    kind: TunnelKind,
    port: u16,
    timeout: Duration,
    env: &queue::Environment,
) -> anyhow::Result<Tunnel> {
    let (program, var) = kind.program(env);
    let Some(path) = env.find_program(Path::new(&program)) else {
        bail!("'{program}' was not found ({var} or PATH): {}", kind.install_hint());
    };
    // The wrapper: run the tunnel; kill it when our end of stdin closes; exit with its status.
    // (A background list's stdin is /dev/null unless redirected, hence the copy to fd 3; the
    // watcher's output goes nowhere so the pipes close when the tunnel exits.)
    let script = r#"exec 3<&0; "$0" "$@" <&- & pid=$!; ( cat <&3; kill $pid ) >/dev/null 2>&1 & exec 3<&-; wait $pid"#;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(&path)
        .args(kind.args(port))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", path.display()))?;
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    for reader in [
        child.stdout.take().map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        child.stderr.take().map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(reader).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let mut seen: Vec<String> = Vec::new();
    let found = tokio::time::timeout(timeout, async {
        while let Some(line) = rx.recv().await {
            tracing::debug!(target: "taskbridge::tunnel", "{line}");
            match kind.url_in(&line) {
                Ok(Some(url)) => return Ok(Some(url)),
                Ok(None) => seen.push(line),
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    })
    .await;
    let url = match found {
        Ok(Ok(Some(url))) => url,
        Ok(Err(e)) => bail!("{e}"),
        Ok(Ok(None)) => {
            let status = child.wait().await.ok();
            bail!(
                "{} exited ({}) without printing a public URL; its last lines:\n{}",
                path.display(),
                status.map_or("?".into(), |s| s.to_string()),
                seen.iter().rev().take(10).rev().cloned().collect::<Vec<_>>().join("\n")
            );
        }
        Err(_) => bail!(
            "{} printed no public URL within {} s; its last lines:\n{}",
            path.display(),
            timeout.as_secs(),
            seen.iter().rev().take(10).rev().cloned().collect::<Vec<_>>().join("\n")
        ),
    };
    let host = url.trim_start_matches("https://").split('/').next().unwrap_or("").to_owned();
    // Keep draining its output (so it never blocks on a full pipe) and report when it ends.
    let (exit_tx, exited) = mpsc::channel(1);
    tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            tracing::debug!(target: "taskbridge::tunnel", "{line}");
        }
        let _ = exit_tx.send("the tunnel's output ended".to_owned()).await;
    });
    Ok(Tunnel { url, host, child, exited })
}

/// What public mode needs before the server binds: a token (public mode never runs without
/// one), the repository roots (default: the directory it was started in) and plain JSON
/// answers, which survive proxies that buffer event streams.
pub fn prepare(
    cwd: &Path,
    auth: &Option<(String, crate::token::Source)>,
    roots: &mut Vec<std::path::PathBuf>,
    http: &mut mcp::HttpConfig,
) -> anyhow::Result<()> {
    let Some((token, _)) = auth else {
        bail!("public mode always asks for a token; drop --no-token");
    };
    if roots.is_empty() {
        roots.push(cwd.to_path_buf());
    }
    http.token = Some(token.clone());
    http.json_response = true;
    Ok(())
}

/// Starts the tunnel to the bound server and lets its host in. The server must listen on
/// loopback: the tunnel is the only way in from outside.
pub async fn open(
    kind: TunnelKind,
    addr: std::net::SocketAddr,
    listen: &str,
    http: &mut mcp::HttpConfig,
    env: &queue::Environment,
) -> anyhow::Result<Tunnel> {
    if !addr.ip().is_loopback() {
        anyhow::bail!(
            "public mode listens on loopback only (the tunnel connects to it); drop --listen {listen}"
        );
    }
    let timeout = env
        .var("TASKBRIDGE_TUNNEL_TIMEOUT_S")
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(30), Duration::from_secs);
    let t = start(kind, addr.port(), timeout, env).await?;
    http.allowed_hosts.push(t.host.clone());
    Ok(t)
}

/// The `claude mcp add` line for a public endpoint; the token is read from where it is kept
/// (its file, or the environment), never printed here.
pub fn claude_add_line(url: &str, source: &crate::token::Source) -> String {
    format!(
        "claude mcp add taskbridge -s user --transport http {url}/mcp --header \"Authorization: Bearer {}\"",
        source.shell_expr()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_found_in_real_output_lines() {
        let cf = "2024-06-01T10:00:03Z INF |  https://four-dashed-word-url.trycloudflare.com                                     |";
        assert_eq!(
            TunnelKind::Cloudflare.url_in(cf).unwrap().as_deref(),
            Some("https://four-dashed-word-url.trycloudflare.com")
        );
        assert_eq!(
            TunnelKind::Cloudflare
                .url_in("INF Requesting new quick Tunnel on trycloudflare.com...")
                .unwrap(),
            None
        );
        let ng = r#"{"addr":"http://localhost:8765","lvl":"info","msg":"started tunnel","name":"command_line","obj":"tunnels","t":"2024-06-01T10:00:00Z","url":"https://1a2b-3c4d.ngrok-free.app"}"#;
        assert_eq!(
            TunnelKind::Ngrok.url_in(ng).unwrap().as_deref(),
            Some("https://1a2b-3c4d.ngrok-free.app")
        );
        let err = r#"{"err":"authentication failed: ERR_NGROK_4018","lvl":"eror","msg":"failed to reconnect session","obj":"tunnels.session"}"#;
        assert!(TunnelKind::Ngrok.url_in(err).unwrap_err().contains("ERR_NGROK_4018"));
    }
}
