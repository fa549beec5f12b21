//! The two ways of asking Claude: the Messages API (with `ANTHROPIC_API_KEY`) and the Claude Code
//! CLI (`claude -p --output-format json`, with whatever login it has). Both apply our own
//! wall-clock timeout: the CLI retries a bad key forever, and a stalled connection must not hold
//! a job open.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

pub const DEFAULT_API_MODEL: &str = "claude-sonnet-4-5";
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
const API_VERSION: &str = "2023-06-01";

/// One question for Claude, as `claude_ask` and `claude_submit` take it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Ask {
    pub prompt: String,
    pub system: Option<String>,
    pub model: Option<String>,
    pub max_tokens: Option<u32>,
    pub timeout_s: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClaudeUsage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

impl ClaudeUsage {
    /// From a Messages API `usage` object, which the CLI's result repeats with the same keys.
    fn from_api(usage: Option<&Value>) -> Self {
        let n = |k: &str| usage.and_then(|u| u.get(k)).and_then(Value::as_u64).unwrap_or(0);
        ClaudeUsage {
            input: n("input_tokens"),
            output: n("output_tokens"),
            cache_read: n("cache_read_input_tokens"),
            cache_write: n("cache_creation_input_tokens"),
        }
    }
}

/// Claude's answer. `cost_usd` is there when the backend reports it (the CLI) or the model's
/// list price is known (the API).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Answer {
    pub text: String,
    pub model: String,
    pub stop_reason: Option<String>,
    pub usage: ClaudeUsage,
    pub cost_usd: Option<f64>,
    pub backend: String,
}

/// Where the bridge finds Claude, from the environment unless a caller says otherwise.
#[derive(Debug, Clone)]
pub struct BridgeConfig {
    pub api_key: Option<String>,
    /// The host root, without `/v1` (`ANTHROPIC_BASE_URL`, as the official SDKs read it).
    pub base_url: String,
    /// The Claude Code CLI: `TASKBRIDGE_CLAUDE` or `claude` on PATH.
    pub claude_cli: Option<PathBuf>,
    /// The model used when a call names none (`--model`, else `TASKBRIDGE_CLAUDE_MODEL`).
    pub default_model: Option<String>,
    /// Attempts on 429/529 and 5xx before giving up, and the first backoff (doubled each time,
    /// unless the API says `retry-after`).
    pub attempts: u32,
    pub retry_base: Duration,
    /// The name this host goes by in the queue, which the bridge's jobs are owned under.
    pub host: String,
}

impl BridgeConfig {
    /// As the environment the binary started in says.
    pub fn from_env(env: &queue::Environment) -> Self {
        let retry_ms =
            env.var("TASKBRIDGE_CLAUDE_RETRY_BASE_MS").and_then(|v| v.parse().ok()).unwrap_or(1000);
        BridgeConfig {
            api_key: env.var("ANTHROPIC_API_KEY"),
            base_url: env
                .var("ANTHROPIC_BASE_URL")
                .unwrap_or_else(|| "https://api.anthropic.com".into()),
            claude_cli: env
                .var("TASKBRIDGE_CLAUDE")
                .map(PathBuf::from)
                .or_else(|| env.find_program(std::path::Path::new("claude"))),
            default_model: env.var("TASKBRIDGE_CLAUDE_MODEL"),
            attempts: 4,
            retry_base: Duration::from_millis(retry_ms),
            host: worker::hostname(env),
        }
    }
}

/// The backend in use, chosen once at start-up.
#[derive(Debug, Clone)]
pub enum Backend {
    Api(Api),
    Cli(Cli),
    /// No way to reach Claude; the reason says what to set up.
    None(String),
}

impl Backend {
    pub fn choose(cfg: &BridgeConfig) -> Backend {
        if let Some(key) = &cfg.api_key {
            return match Api::new(cfg, key) {
                Ok(api) => Backend::Api(api),
                Err(e) => Backend::None(e.to_string()),
            };
        }
        if let Some(program) = &cfg.claude_cli {
            return Backend::Cli(Cli {
                program: program.clone(),
                default_model: cfg.default_model.clone(),
            });
        }
        Backend::None(
            "no backend: ANTHROPIC_API_KEY is not set and the Claude Code CLI (`claude`) is not on \
             PATH. Set ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL for a proxy), or install Claude \
             Code with `npm install -g @anthropic-ai/claude-code` and log in (or set \
             TASKBRIDGE_CLAUDE to its path)"
                .into(),
        )
    }

    pub fn name(&self) -> &'static str {
        match self {
            Backend::Api(_) => "messages-api",
            Backend::Cli(_) => "claude-cli",
            Backend::None(_) => "none",
        }
    }

    pub fn default_model(&self) -> Option<String> {
        match self {
            Backend::Api(a) => Some(a.default_model.clone()),
            Backend::Cli(c) => c.default_model.clone(),
            Backend::None(_) => None,
        }
    }

    /// Asks, giving up after `ask.timeout_s` seconds in all (retries included).
    pub async fn ask(&self, ask: &Ask) -> Result<Answer> {
        let limit = Duration::from_secs(ask.timeout_s.max(1));
        let started = Instant::now();
        let work = async {
            match self {
                Backend::Api(api) => api.ask(ask).await,
                Backend::Cli(cli) => cli.ask(ask).await,
                Backend::None(reason) => Err(Error::NoBackend(reason.clone())),
            }
        };
        match tokio::time::timeout(limit, work).await {
            Ok(r) => r,
            Err(_) => Err(Error::ClaudeTimeout {
                waited_s: started.elapsed().as_secs_f64().round() as u64,
                backend: self.name(),
            }),
        }
    }
}

/// List prices in USD per million tokens (input, output), for the models whose price we know.
/// Cache writes cost 1.25x input and cache reads 0.1x (the 5-minute cache).
fn list_price(model: &str) -> Option<(f64, f64)> {
    const PRICES: &[(&str, (f64, f64))] = &[
        ("claude-opus-4-5", (5.0, 25.0)),
        ("claude-opus-4-1", (15.0, 75.0)),
        ("claude-opus-4-0", (15.0, 75.0)),
        ("claude-opus-4-2", (15.0, 75.0)),
        ("claude-sonnet-4", (3.0, 15.0)),
        ("claude-3-7-sonnet", (3.0, 15.0)),
        ("claude-haiku-4-5", (1.0, 5.0)),
        ("claude-3-5-haiku", (0.8, 4.0)),
    ];
    PRICES.iter().find(|(prefix, _)| model.starts_with(prefix)).map(|(_, p)| *p)
}

pub fn cost_usd(model: &str, u: &ClaudeUsage) -> Option<f64> {
    let (input, output) = list_price(model)?;
    let dollars = (u.input as f64 * input
        + u.output as f64 * output
        + u.cache_write as f64 * input * 1.25
        + u.cache_read as f64 * input * 0.1)
        / 1e6;
    Some((dollars * 1e6).round() / 1e6)
}

// ---- the Messages API ----------------------------------------------------------------------

#[derive(Clone)]
pub struct Api {
    client: reqwest::Client,
    url: String,
    key: String,
    default_model: String,
    attempts: u32,
    retry_base: Duration,
}

// By hand, so that the key never reaches a log line through `{:?}`.
impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("url", &self.url)
            .field("key", &"<redacted>")
            .field("default_model", &self.default_model)
            .finish()
    }
}

impl Api {
    fn new(cfg: &BridgeConfig, key: &str) -> Result<Api> {
        crate::bridge::install_tls();
        let client =
            reqwest::Client::builder().connect_timeout(Duration::from_secs(15)).build().map_err(
                |e| Error::ClaudeUnreachable { url: cfg.base_url.clone(), detail: e.to_string() },
            )?;
        Ok(Api {
            client,
            url: format!("{}/v1/messages", cfg.base_url.trim_end_matches('/')),
            key: key.to_owned(),
            default_model: cfg.default_model.clone().unwrap_or_else(|| DEFAULT_API_MODEL.into()),
            attempts: cfg.attempts.max(1),
            retry_base: cfg.retry_base,
        })
    }

    async fn ask(&self, ask: &Ask) -> Result<Answer> {
        let model = ask.model.clone().unwrap_or_else(|| self.default_model.clone());
        let mut body = json!({
            "model": model,
            "max_tokens": ask.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
            "messages": [{"role": "user", "content": ask.prompt}],
        });
        if let Some(system) = &ask.system {
            body["system"] = json!(system);
        }
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let sent = self
                .client
                .post(&self.url)
                .header("x-api-key", &self.key)
                .header("anthropic-version", API_VERSION)
                .json(&body)
                .send()
                .await;
            let resp = match sent {
                Ok(r) => r,
                Err(e) => {
                    return Err(Error::ClaudeUnreachable {
                        url: self.url.clone(),
                        detail: error_chain(&e),
                    });
                }
            };
            let status = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<f64>().ok());
            let text = resp.text().await.map_err(|e| Error::ClaudeUnreachable {
                url: self.url.clone(),
                detail: error_chain(&e),
            })?;
            if (200..300).contains(&status) {
                return parse_message(&text, &model);
            }
            let detail = api_error_detail(status, &text);
            let retryable = matches!(status, 429 | 500 | 502 | 503 | 504 | 529);
            if retryable && attempt < self.attempts {
                let backoff = retry_after
                    .map(|s| Duration::from_secs_f64(s.clamp(0.0, 60.0)))
                    .unwrap_or_else(|| self.retry_base * 2u32.saturating_pow(attempt - 1));
                tracing::info!(status, attempt, ?backoff, "Claude is busy; retrying");
                tokio::time::sleep(backoff).await;
                continue;
            }
            return Err(match status {
                401 => Error::ClaudeAuth { detail },
                _ if retryable => Error::ClaudeBusy {
                    status,
                    attempts: attempt,
                    waited_s: started.elapsed().as_secs_f64().round() as u64,
                    detail,
                },
                _ => Error::ClaudeRefused { status, detail },
            });
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// `"429 rate_limit_error: Number of requests ..."` from an Anthropic error body, or the status
/// and the start of whatever came back (a proxy's HTML page, say).
fn api_error_detail(status: u16, body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let err = parsed.as_ref().and_then(|v| v.get("error"));
    match err {
        Some(e) => format!(
            "{status} {}: {}",
            e.get("type").and_then(Value::as_str).unwrap_or("error"),
            e.get("message").and_then(Value::as_str).unwrap_or("")
        ),
        None => {
            let snippet: String = body.chars().take(200).collect();
            format!("{status}: {}", snippet.trim())
        }
    }
}

fn parse_message(text: &str, requested: &str) -> Result<Answer> {
    let v: Value = serde_json::from_str(text).map_err(|e| Error::ClaudeRefused {
        status: 200,
        detail: format!("the answer is not JSON ({e})"),
    })?;
    let answer: String = v
        .get("content")
        .and_then(Value::as_array)
        .map(|blocks| {
            blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("")
        })
        .unwrap_or_default();
    let usage = ClaudeUsage::from_api(v.get("usage"));
    let model = v.get("model").and_then(Value::as_str).unwrap_or(requested).to_owned();
    Ok(Answer {
        text: answer,
        cost_usd: cost_usd(&model, &usage),
        model,
        stop_reason: v.get("stop_reason").and_then(Value::as_str).map(str::to_owned),
        usage,
        backend: "messages-api".into(),
    })
}

// ---- the Claude Code CLI --------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct Cli {
    pub program: PathBuf,
    pub default_model: Option<String>,
}

impl Cli {
    /// `claude -p --output-format json`, the prompt on stdin, no tools: the bridge asks a
    /// question, it does not hand Claude the machine.
    async fn ask(&self, ask: &Ask) -> Result<Answer> {
        let mut cmd = tokio::process::Command::new(&self.program);
        for var in worker::process::SECRET_ENV {
            cmd.env_remove(var);
        }
        cmd.args(["-p", "--output-format", "json", "--no-session-persistence", "--tools", ""]);
        if let Some(model) = ask.model.as_ref().or(self.default_model.as_ref()) {
            cmd.args(["--model", model]);
        }
        if let Some(system) = &ask.system {
            cmd.args(["--system-prompt", system]);
        }
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child =
            cmd.spawn().map_err(|e| Error::ClaudeCli(cli_spawn_error(&self.program, &e)))?;
        // Dropping this future (timeout, cancel) kills the CLI and anything it started.
        let mut guard = TreeGuard(child.id().map(|pid| pid as i32));
        if let Some(mut stdin) = child.stdin.take()
            && let Err(e) = stdin.write_all(ask.prompt.as_bytes()).await
            // A CLI that exits before reading its prompt says why in its output, read below.
            && e.kind() != std::io::ErrorKind::BrokenPipe
        {
            return Err(Error::ClaudeCli(format!("could not write the prompt to claude: {e}")));
        }
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| Error::ClaudeCli(format!("claude did not run to the end: {e}")))?;
        // It exited by itself: its pid may be reused from now on, so nothing is signalled.
        guard.0 = None;
        parse_cli_output(&out.stdout, &out.stderr, out.status.code(), ask.model.as_deref())
    }
}

fn cli_spawn_error(program: &Path, e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::NotFound {
        format!(
            "could not start '{}': not found. Install Claude Code with `npm install -g \
             @anthropic-ai/claude-code`, or set ANTHROPIC_API_KEY to use the Messages API",
            program.display()
        )
    } else {
        format!("could not start '{}': {e}", program.display())
    }
}

/// Kills a process and everything it started when dropped, unless disarmed (`None`).
struct TreeGuard(Option<i32>);

impl Drop for TreeGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let mut tree = worker::process::ProcessTree::new(pid);
            tree.refresh();
            tree.signal(nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Reads `claude -p --output-format json`. Success needs exit 0 *and* `is_error: false`: the CLI
/// reports an API error as `subtype: "success"` with `is_error: true`.
fn parse_cli_output(
    stdout: &[u8],
    stderr: &[u8],
    code: Option<i32>,
    requested: Option<&str>,
) -> Result<Answer> {
    let stdout = String::from_utf8_lossy(stdout);
    let result: Option<Value> = stdout
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .find(|v| v.get("type").and_then(Value::as_str) == Some("result"));
    let Some(r) = result else {
        let stderr = String::from_utf8_lossy(stderr);
        let tail: String =
            stderr.trim().chars().rev().take(400).collect::<Vec<_>>().into_iter().rev().collect();
        let out: String = stdout.trim().chars().take(400).collect();
        return Err(Error::ClaudeCli(format!(
            "claude exited with {} and no JSON result: {}",
            code.map_or("a signal".to_owned(), |c| format!("code {c}")),
            if tail.is_empty() { out } else { tail }
        )));
    };
    let is_error = r.get("is_error").and_then(Value::as_bool).unwrap_or(false);
    let text = r.get("result").and_then(Value::as_str).unwrap_or("").to_owned();
    if is_error || code != Some(0) {
        let status = r.get("api_error_status").and_then(Value::as_u64);
        let subtype = r.get("subtype").and_then(Value::as_str).unwrap_or("error");
        let mut detail = if text.is_empty() {
            r.get("errors").map(Value::to_string).unwrap_or_else(|| subtype.to_owned())
        } else {
            text
        };
        if detail.len() > 600 {
            let mut cut = 600;
            while !detail.is_char_boundary(cut) {
                cut -= 1;
            }
            detail.truncate(cut);
        }
        return Err(match status {
            Some(401) => Error::ClaudeAuth { detail },
            Some(s @ (429 | 529)) => {
                Error::ClaudeBusy { status: s as u16, attempts: 0, waited_s: 0, detail }
            }
            Some(s) => Error::ClaudeRefused { status: s as u16, detail },
            None => Error::ClaudeCli(format!("claude reported an error ({subtype}): {detail}")),
        });
    }
    let model = r
        .get("modelUsage")
        .and_then(Value::as_object)
        .and_then(|m| m.keys().next().cloned())
        .or_else(|| requested.map(str::to_owned))
        .unwrap_or_default();
    Ok(Answer {
        text,
        model,
        stop_reason: r.get("stop_reason").and_then(Value::as_str).map(str::to_owned),
        usage: ClaudeUsage::from_api(r.get("usage")),
        cost_usd: r.get("total_cost_usd").and_then(Value::as_f64),
        backend: "claude-cli".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_error_reported_as_success_subtype_is_still_an_error() {
        let out = br#"{"type":"result","subtype":"success","is_error":true,"api_error_status":400,"result":"API Error: 400 bad model"}"#;
        let err = parse_cli_output(out, b"", Some(1), None).unwrap_err().to_string();
        assert!(err.contains("400") && err.contains("bad model"), "{err}");
    }

    #[test]
    fn list_prices_give_a_cost_and_unknown_models_none() {
        let u = ClaudeUsage { input: 243, output: 37, cache_read: 80, cache_write: 60 };
        assert_eq!(cost_usd("claude-sonnet-4-5-20250929", &u), Some(0.001533));
        assert_eq!(cost_usd("some-other-model", &u), None);
    }
}
