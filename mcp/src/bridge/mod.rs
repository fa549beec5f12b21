//! The reverse bridge (`taskbridge claude-mcp`): an MCP server that lets OpenCode, or any MCP
//! client, ask Claude for a plan, a review or a second opinion.
//!
//! `claude_ask` waits for the answer; `claude_submit` records a job in the TaskBridge database and
//! runs it in the background of this process, where `claude_poll`, `claude_result` and
//! `claude_cancel` find it (from any bridge process sharing the database).

pub mod backend;

use crate::params::Parameters;
use crate::server::{ToolResult, ok, refuse};
use backend::{Answer, Ask, Backend, BridgeConfig};
use queue::{Job, JobId, JobOutcome, JobOwner, JobStatus, Store};
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::schemars::{self, JsonSchema};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// `claude_ask` answers within one MCP call, and clients drop calls that last about 60 s.
pub const ASK_DEFAULT_TIMEOUT_S: u64 = 50;
pub const SUBMIT_DEFAULT_TIMEOUT_S: u64 = 600;
pub const MAX_TIMEOUT_S: u64 = 3600;
pub const MAX_PROMPT_BYTES: usize = 1 << 20;

const INSTRUCTIONS: &str = "Ask Claude (Anthropic) for a plan, a review or a second opinion. \
claude_ask waits for the answer (keep it under about 50 s); for longer questions use \
claude_submit, then claude_poll until the job is done and claude_result for the answer. \
claude_status says which backend is in use and why none is, if so.";

/// Installs rustls's crypto provider (see [`worker::install_tls`]); every process that
/// builds a reqwest client, rmcp's HTTP client included, calls this first.
pub fn install_tls() {
    worker::install_tls();
}

struct Inner {
    store: Arc<Store>,
    backend: Backend,
    owner: JobOwner,
    running: Mutex<HashMap<JobId, CancellationToken>>,
    shutdown: CancellationToken,
}

#[derive(Clone)]
pub struct ClaudeBridge {
    inner: Arc<Inner>,
}

/// This process as a job's owner, on host `host`.
fn this_process(host: &str) -> JobOwner {
    let pid = std::process::id() as i64;
    JobOwner { host: host.to_owned(), pid, started: worker::process::process_start_time(pid) }
}

/// A job's owner is alive if a process with its pid runs and started when the owner did.
fn owner_alive(pid: i64, started: Option<&str>) -> bool {
    if !worker::process::pid_alive(pid) {
        return false;
    }
    match started {
        Some(s) => worker::process::process_start_time(pid).as_deref() == Some(s),
        None => true,
    }
}

impl ClaudeBridge {
    /// Opens the bridge on `store`. Jobs left queued or running by a bridge process on this host
    /// that has since died are marked failed as interrupted.
    pub fn new(store: Arc<Store>, cfg: &BridgeConfig) -> Self {
        let bridge = ClaudeBridge {
            inner: Arc::new(Inner {
                store,
                backend: Backend::choose(cfg),
                owner: this_process(&cfg.host),
                running: Mutex::new(HashMap::new()),
                shutdown: CancellationToken::new(),
            }),
        };
        bridge.interrupt_orphans();
        tracing::info!(backend = bridge.inner.backend.name(), "Claude bridge ready");
        bridge
    }

    pub fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    fn interrupt_orphans(&self) {
        match self.inner.store.interrupt_orphaned_jobs(&self.inner.owner.host, owner_alive) {
            Ok(ids) if !ids.is_empty() => tracing::warn!(?ids, "interrupted Claude jobs"),
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "could not check for interrupted Claude jobs"),
        }
    }

    /// Stops the jobs this process runs and marks them failed as interrupted, so that none is
    /// left `running` with nobody running it.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
        let ids: Vec<JobId> = self.running().keys().copied().collect();
        for id in ids {
            let outcome = JobOutcome::Failed(
                "interrupted: the bridge stopped before Claude answered; submit it again".into(),
            );
            if let Err(e) = self.inner.store.job_finish(id, outcome) {
                tracing::warn!(job = %id, error = %e, "could not mark the job interrupted");
            }
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, CancellationToken>> {
        self.inner.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> queue::Result<T> + Send + 'static,
    ) -> Result<T, crate::Error> {
        let store = self.inner.store.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| crate::Error::Protocol(format!("a database call panicked: {e}")))?
            .map_err(crate::Error::from)
    }

    /// Runs a job to its end: the answer, an error, or a cancel (by `claude_cancel` here, or by
    /// any process through the database, checked twice a second).
    async fn run_job(self, id: JobId, ask: Ask, cancel: CancellationToken) {
        match self.blocking(move |s| s.job_start(id)).await {
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(e) => {
                tracing::error!(job = %id, error = %e, "could not start the job");
                return;
            }
        }
        let store = self.inner.store.clone();
        let cancelled_elsewhere = async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if store.job(id).is_ok_and(|j| j.status != JobStatus::Running) {
                    return;
                }
            }
        };
        let outcome = tokio::select! {
            r = self.inner.backend.ask(&ask) => Some(match r {
                Ok(answer) => JobOutcome::Done(answer_json(&answer)),
                Err(e) => JobOutcome::Failed(e.to_string()),
            }),
            _ = cancel.cancelled() => None,
            _ = cancelled_elsewhere => None,
            // `shutdown` records the job as interrupted; it needs the entry.
            _ = self.inner.shutdown.cancelled() => return,
        };
        self.running().remove(&id);
        let Some(outcome) = outcome else { return };
        if let Err(e) = self.blocking(move |s| s.job_finish(id, outcome)).await {
            tracing::error!(job = %id, error = %e, "could not record the job's outcome");
        }
    }

    async fn job(&self, id: i64) -> Result<Job, crate::Error> {
        let bridge = self.clone();
        // A job whose owner died is failed here rather than reported as running forever.
        self.blocking(move |s| {
            let job = s.job(JobId(id))?;
            if !job.status.is_finished() && job.owner_host == bridge.inner.owner.host {
                s.interrupt_orphaned_jobs(&bridge.inner.owner.host, owner_alive)?;
                return s.job(JobId(id));
            }
            Ok(job)
        })
        .await
    }

    fn fail(&self, e: crate::Error) -> ToolResult {
        match &e {
            crate::Error::Queue(q) if !q.is_user_error() => {
                tracing::error!(error = %e, "bridge tool failed");
                Err(rmcp::ErrorData::internal_error(e.to_string(), None))
            }
            _ => refuse(e.to_string()),
        }
    }
}

fn answer_json(a: &Answer) -> Value {
    serde_json::to_value(a).unwrap_or(Value::Null)
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AskArgs {
    /// The question, with all the context Claude needs (it cannot see your files). Up to 1 MiB.
    pub prompt: String,
    /// A system prompt (for example "You are a strict code reviewer").
    #[serde(default)]
    pub system: Option<String>,
    /// A Claude model id or alias, e.g. claude-sonnet-4-5 (default: the bridge's default).
    #[serde(default)]
    pub model: Option<String>,
    /// Longest answer in tokens, 1..=64000 (default 4096).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Seconds to wait for the answer, retries included (claude_ask: default 50; claude_submit:
    /// default 600; at most 3600).
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

impl AskArgs {
    fn into_ask(self, default_timeout: u64) -> Result<Ask, String> {
        if self.prompt.trim().is_empty() {
            return Err("invalid prompt: it is empty; write the question for Claude".into());
        }
        if self.prompt.len() > MAX_PROMPT_BYTES {
            return Err(format!(
                "invalid prompt: it is {} bytes and the limit is {MAX_PROMPT_BYTES} (1 MiB)",
                self.prompt.len()
            ));
        }
        if let Some(m) = self.max_tokens
            && !(1..=64_000).contains(&m)
        {
            return Err(format!("invalid max_tokens: {m} is out of range; use 1 to 64000"));
        }
        let timeout_s = self.timeout_s.unwrap_or(default_timeout);
        if !(1..=MAX_TIMEOUT_S).contains(&timeout_s) {
            return Err(format!(
                "invalid timeout_s: {timeout_s} is out of range; use 1 to {MAX_TIMEOUT_S} seconds"
            ));
        }
        Ok(Ask {
            prompt: self.prompt,
            system: self.system.filter(|s| !s.trim().is_empty()),
            model: self.model.filter(|s| !s.trim().is_empty()),
            max_tokens: self.max_tokens,
            timeout_s,
        })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobIdArgs {
    /// The id claude_submit returned.
    pub job_id: i64,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

fn elapsed_s(job: &Job) -> f64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(job.created_at);
    let start = job.started_at.unwrap_or(job.created_at);
    let end = job.finished_at.unwrap_or(now);
    ((end - start).max(0.0) * 1000.0).round() / 1000.0
}

#[tool_router]
impl ClaudeBridge {
    /// Ask Claude and wait for the answer: text, model, stop_reason, usage (input, output,
    /// cache_read, cache_write tokens), cost_usd where known, backend. For questions that may take
    /// longer than about 50 s use claude_submit.
    #[tool(annotations(title = "Ask Claude", read_only_hint = true, open_world_hint = true))]
    async fn claude_ask(&self, Parameters(args): Parameters<AskArgs>) -> ToolResult {
        let ask = match args.into_ask(ASK_DEFAULT_TIMEOUT_S) {
            Ok(a) => a,
            Err(e) => return refuse(e),
        };
        match self.inner.backend.ask(&ask).await {
            Ok(answer) => ok(answer),
            Err(e) => refuse(e.to_string()),
        }
    }

    /// Ask Claude in the background; returns job_id at once. Follow with claude_poll and
    /// claude_result.
    #[tool(annotations(title = "Ask Claude in the background", read_only_hint = false))]
    async fn claude_submit(&self, Parameters(args): Parameters<AskArgs>) -> ToolResult {
        let ask = match args.into_ask(SUBMIT_DEFAULT_TIMEOUT_S) {
            Ok(a) => a,
            Err(e) => return refuse(e),
        };
        if let Backend::None(reason) = &self.inner.backend {
            return refuse(reason.clone());
        }
        let request = serde_json::to_value(&ask).unwrap_or(Value::Null);
        let owner = self.inner.owner.clone();
        let job = match self.blocking(move |s| s.job_submit(&request, &owner)).await {
            Ok(j) => j,
            Err(e) => return self.fail(e),
        };
        let cancel = CancellationToken::new();
        self.running().insert(job.id, cancel.clone());
        tokio::spawn(self.clone().run_job(job.id, ask, cancel));
        ok(json!({"job_id": job.id, "status": job.status, "backend": self.inner.backend.name()}))
    }

    /// A job's status (queued, running, done, failed, cancelled) and elapsed seconds.
    #[tool(annotations(title = "Poll a Claude job", read_only_hint = true))]
    async fn claude_poll(&self, Parameters(args): Parameters<JobIdArgs>) -> ToolResult {
        match self.job(args.job_id).await {
            Ok(job) => ok(json!({
                "job_id": job.id,
                "status": job.status,
                "elapsed_s": elapsed_s(&job),
                "finished": job.status.is_finished(),
                "error": job.error,
            })),
            Err(e) => self.fail(e),
        }
    }

    /// A finished job's answer (what claude_ask returns), or its error.
    #[tool(annotations(title = "Get a Claude job's answer", read_only_hint = true))]
    async fn claude_result(&self, Parameters(args): Parameters<JobIdArgs>) -> ToolResult {
        let job = match self.job(args.job_id).await {
            Ok(j) => j,
            Err(e) => return self.fail(e),
        };
        match (job.status, job.result) {
            (JobStatus::Done, Some(mut answer)) => {
                answer["job_id"] = json!(job.id);
                answer["status"] = json!(job.status);
                ok(answer)
            }
            (status, _) if status.is_finished() => {
                Ok(rmcp::model::CallToolResult::structured_error(json!({
                    "job_id": job.id,
                    "status": status,
                    "error": job.error.unwrap_or_else(|| format!("the job is {status}")),
                })))
            }
            (status, _) => refuse(format!(
                "job {} is {status} and has no answer yet; call claude_poll until it is done",
                job.id
            )),
        }
    }

    /// Cancel a queued or running job.
    #[tool(annotations(title = "Cancel a Claude job", read_only_hint = false))]
    async fn claude_cancel(&self, Parameters(args): Parameters<JobIdArgs>) -> ToolResult {
        let id = JobId(args.job_id);
        match self.blocking(move |s| s.job_cancel(id)).await {
            Ok(job) => {
                if let Some(token) = self.running().remove(&id) {
                    token.cancel();
                }
                ok(json!({"job_id": job.id, "status": job.status}))
            }
            Err(e) => self.fail(e),
        }
    }

    /// The backend in use (messages-api, claude-cli or none, and why none), the default model,
    /// and the number of jobs in each state.
    #[tool(annotations(title = "Claude bridge status", read_only_hint = true))]
    async fn claude_status(&self, Parameters(_): Parameters<NoArgs>) -> ToolResult {
        self.interrupt_orphans();
        let counts = match self.blocking(|s| s.job_counts()).await {
            Ok(c) => c,
            Err(e) => return self.fail(e),
        };
        let backend = &self.inner.backend;
        ok(json!({
            "backend": backend.name(),
            "usable": !matches!(backend, Backend::None(_)),
            "reason": match backend { Backend::None(r) => Some(r.clone()), _ => None },
            "default_model": backend.default_model(),
            "jobs": counts,
        }))
    }
}

/// Built once rather than on every call (see the TaskBridge server's router).
static ROUTER: std::sync::LazyLock<rmcp::handler::server::router::tool::ToolRouter<ClaudeBridge>> =
    std::sync::LazyLock::new(|| crate::schema::cleaned(ClaudeBridge::tool_router()));

/// The tools as `tools/list` gives them.
#[cfg(test)]
pub(crate) fn listed_tools() -> Vec<rmcp::model::Tool> {
    ROUTER.list_all()
}

#[tool_handler(router = ROUTER)]
impl ServerHandler for ClaudeBridge {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("taskbridge-claude", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}
