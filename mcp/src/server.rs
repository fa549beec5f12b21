//! The TaskBridge MCP server: shared state, result shaping and error mapping.

use crate::replies::ServiceRestart;
use queue::{Home, Store, Task, TaskId};
use rmcp::model::{CallToolResult, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{ErrorData, ServerHandler, tool_handler};
use serde::Serialize;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use worker::{RunningWorker, Worker, WorkerConfig};

pub type ToolResult = Result<CallToolResult, ErrorData>;

const INSTRUCTIONS: &str = "TaskBridge runs coding tasks with OpenCode, headless, each in its own \
git worktree and branch of a local repository. Workflow: submit_task (or submit_batch for several, \
with depends_on) -> wait_for with the task ids (it returns early when a task finishes or asks a \
question; call it again while tasks are pending) -> get_task_result for the summary, files \
touched, tests run, diff and cost (run_task does submit_task and wait_for in one call). When a \
task is `waiting`, read its question (get_task or wait_for) and reply with answer_task: the same \
agent session resumes with your answer. Use get_task_logs to follow a running task, add_task_note \
to add guidance, cancel_task and retry_task to steer. Task failures are reported in the result's `error`, not as tool errors.";

struct Inner {
    store: Arc<Store>,
    home: Home,
    cwd: PathBuf,
    changes: watch::Sender<u64>,
    _watcher: Option<queue::ChangeWatcher>,
    worker: Mutex<Option<Arc<Worker>>>,
    /// How this process's worker is configured; a worker started by `restart_worker` gets the
    /// same configuration (concurrency, model, bridge, OpenCode, notifications).
    worker_config: WorkerConfig,
    /// A worker started by `restart_worker`, with the watcher that wakes it.
    restarted: Mutex<Option<RunningWorker>>,
    repo_roots: std::sync::OnceLock<Vec<PathBuf>>,
    shutdown: CancellationToken,
    /// Decisions already put to a client (`Decision::key`): each is asked once, by whichever
    /// call sees it first, and never again after a decline.
    asked: Mutex<std::collections::HashSet<String>>,
    /// Whether the transport delivers a request of the server's own outside any call (stdio
    /// does; a Streamable HTTP client may never open the stream it would go on).
    asks_outside_calls: std::sync::atomic::AtomicBool,
    /// `wait_for` and `run_task` calls waiting now.
    waits: std::sync::atomic::AtomicUsize,
}

/// A call counted in [`TaskBridge::waiting_calls`].
pub(crate) struct WaitGuard(Arc<Inner>);

impl Drop for WaitGuard {
    fn drop(&mut self) {
        self.0.waits.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The MCP handler. Cheap to clone: rmcp creates one per HTTP session.
#[derive(Clone)]
pub struct TaskBridge {
    inner: Arc<Inner>,
}

impl TaskBridge {
    /// `worker` is the embedded worker, if this process runs one; `restart_worker` may start a
    /// new one, configured as `worker_config`, when none is alive.
    pub fn new(
        store: Arc<Store>,
        home: Home,
        cwd: PathBuf,
        worker: Option<Arc<Worker>>,
        worker_config: WorkerConfig,
    ) -> Self {
        let (changes, _) = watch::channel(0u64);
        let tx = changes.clone();
        store.on_change(move || tx.send_modify(|v| *v = v.wrapping_add(1)));
        let tx = changes.clone();
        let watcher =
            queue::ChangeWatcher::spawn(&store, move || tx.send_modify(|v| *v = v.wrapping_add(1)))
                .map_err(
                    |e| tracing::warn!(error = %e, "cannot watch the database; wait_for will poll"),
                )
                .ok();
        TaskBridge {
            inner: Arc::new(Inner {
                store,
                home,
                cwd,
                changes,
                _watcher: watcher,
                worker: Mutex::new(worker),
                worker_config,
                restarted: Mutex::new(None),
                repo_roots: std::sync::OnceLock::new(),
                shutdown: CancellationToken::new(),
                asked: Mutex::new(Default::default()),
                asks_outside_calls: Default::default(),
                waits: Default::default(),
            }),
        }
    }

    /// Restricts submits to repositories under these roots (public mode). Set once, before
    /// serving.
    pub fn restrict_repos(&self, roots: Vec<PathBuf>) {
        let roots = roots.into_iter().map(|r| r.canonicalize().unwrap_or(r)).collect();
        if self.inner.repo_roots.set(roots).is_err() {
            tracing::warn!("repository roots were already set");
        }
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }
    pub fn home(&self) -> &Home {
        &self.inner.home
    }
    pub fn cwd(&self) -> &Path {
        &self.inner.cwd
    }
    /// The worker's configuration: a new task's checks (its agent's program, its model) and the
    /// environment the server runs in.
    pub(crate) fn worker_config(&self) -> &WorkerConfig {
        &self.inner.worker_config
    }
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// Whether decision `key` is put to a client now: true the first time only.
    pub(crate) fn first_ask(&self, key: &str) -> bool {
        self.inner.asked.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_owned())
    }

    /// Whether decision `key` was put to a client already.
    pub(crate) fn was_asked(&self, key: &str) -> bool {
        self.inner.asked.lock().unwrap_or_else(|e| e.into_inner()).contains(key)
    }

    /// `wait_for` and `run_task` calls waiting now.
    pub fn waiting_calls(&self) -> usize {
        self.inner.waits.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Counts a call as waiting until the guard is dropped.
    pub(crate) fn wait_guard(&self) -> WaitGuard {
        self.inner.waits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        WaitGuard(self.inner.clone())
    }

    /// Lets the server put a decision to the client that submitted its task after the call
    /// returned: for a transport that always delivers the server's own requests (stdio).
    pub fn ask_outside_calls(&self) {
        self.inner.asks_outside_calls.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn asks_outside_calls(&self) -> bool {
        self.inner.asks_outside_calls.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    /// Refuses a submit whose repository is not under a root. What counts is the repository
    /// git finds from `repo`, by its real path: a directory under a root whose repository lies
    /// above the root (or a symlink out of it) is outside.
    pub(crate) fn check_repo_allowed(&self, repo: &Path) -> Result<(), String> {
        let Some(roots) = self.inner.repo_roots.get() else { return Ok(()) };
        let real = worker::resolve_repo(repo, None)
            .map(|r| r.toplevel)
            .unwrap_or_else(|_| repo.to_path_buf());
        let real = real.canonicalize().unwrap_or(real);
        if roots.iter().any(|r| real.starts_with(r)) {
            return Ok(());
        }
        let list: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
        Err(format!(
            "invalid repo: '{}' is outside the roots this server may run tasks in ({}); start it \
             with --repo-root to allow more",
            repo.display(),
            list.join(", ")
        ))
    }

    /// Whether this server may show or touch a task of `repo` (always, without roots).
    pub(crate) fn visible(&self, repo: &str) -> bool {
        let Some(roots) = self.inner.repo_roots.get() else { return true };
        let path = Path::new(repo);
        let real = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        roots.iter().any(|r| real.starts_with(r))
    }

    /// The roots as the queue stores repositories, for the queue's own filters (empty: none).
    pub(crate) fn roots_as_text(&self) -> Vec<String> {
        self.inner
            .repo_roots
            .get()
            .map(|r| r.iter().map(|p| p.display().to_string()).collect())
            .unwrap_or_default()
    }

    /// Task `id` when this server may see it; one outside its roots is "not found", exactly
    /// as an id that does not exist, so a caller learns nothing of it.
    pub(crate) fn visible_task(&self, id: TaskId) -> worker::Result<Task> {
        let task = self.inner.store.get(id)?;
        if self.visible(&task.repo) { Ok(task) } else { Err(queue::Error::NotFound(id).into()) }
    }

    /// A dependency a submit names. Under roots, one outside them (or one that does not exist)
    /// is "not found" before anything is stored, the same either way.
    pub(crate) fn dependency(&self, id: TaskId) -> Result<queue::DepRef, String> {
        if self.inner.repo_roots.get().is_some() {
            self.visible_task(id).map_err(|e| e.to_string())?;
        }
        Ok(queue::DepRef::Task(id))
    }

    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> worker::Result<T> + Send + 'static,
    ) -> worker::Result<T> {
        let store = self.inner.store.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| worker::Error::Join(e.to_string()))?
    }

    /// Runs a short read on the calling thread. Reads go through the store's reader connection,
    /// which never waits for a writer, so this is cheaper than a hop to the blocking pool.
    pub(crate) fn read_now<T>(
        &self,
        f: impl FnOnce(&Store) -> worker::Result<T>,
    ) -> worker::Result<T> {
        f(&self.inner.store)
    }

    /// Maps an error to what the client sees: the caller's mistakes become tool errors it can act
    /// on; infrastructure faults are logged and become internal errors.
    pub(crate) fn fail(&self, e: worker::Error) -> ToolResult {
        if e.is_user_error() {
            refuse(e.to_string())
        } else {
            tracing::error!(error = %e, "tool call failed");
            Err(ErrorData::internal_error(e.to_string(), None))
        }
    }

    pub(crate) async fn restart_workers(&self) -> worker::Result<crate::replies::RestartReply> {
        let workers = self.blocking(|s| Ok(s.list_workers()?)).await?;
        let mut restarted = Vec::new();
        let mut requeued = Vec::new();
        for w in workers.iter().filter(|w| {
            !w.stopped
                && (w.stale
                    || (w.host == worker::hostname(&self.inner.worker_config.env)
                        && !worker::process::pid_alive(w.pid)))
        }) {
            let id = w.id.clone();
            let ids = self.blocking(move |s| Ok(s.release_worker_tasks(&id)?)).await?;
            requeued.extend(ids.iter().map(|t| t.0));
            restarted.push(w.id.clone());
        }
        let embedded = self.inner.worker.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(w) = &embedded {
            w.reap().await;
        }
        let alive = self
            .blocking(|s| Ok(s.list_workers()?))
            .await?
            .iter()
            .filter(|w| !w.stopped && !w.stale)
            .count();
        let mut started = None;
        let mut service = None;
        let mut note = None;
        if alive == 0 && embedded.is_none() {
            // This server runs no worker of its own: the one it should have is the installed
            // service's, so its manager restarts it.
            let env = self.inner.worker_config.env.clone();
            match tokio::task::spawn_blocking(move || worker::service::restart(&env))
                .await
                .ok()
                .flatten()
            {
                Some(Ok(manager)) => {
                    service = Some(ServiceRestart {
                        restarted: true,
                        manager: Some(manager.to_owned()),
                        error: None,
                    })
                }
                Some(Err(e)) => {
                    service =
                        Some(ServiceRestart { restarted: false, manager: None, error: Some(e) })
                }
                None => {
                    note = Some(
                        "no worker is alive, this server runs none (--no-worker) and no service \
                         is installed: start `taskbridge worker`, or `taskbridge service install`",
                    )
                }
            }
        }
        if alive == 0 && embedded.is_some() {
            let running = Worker::start(
                self.inner.store.clone(),
                self.inner.home.clone(),
                self.inner.worker_config.clone(),
                self.inner.shutdown.child_token(),
            );
            started = Some(running.worker.id().to_owned());
            *self.inner.worker.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(running.worker.clone());
            *self.inner.restarted.lock().unwrap_or_else(|e| e.into_inner()) = Some(running);
        }
        Ok(crate::replies::RestartReply {
            restarted,
            requeued_tasks: requeued,
            started_worker: started,
            service,
            note: note.map(str::to_owned),
            workers_alive_before: alive,
        })
    }

    /// Stops a worker this server started through `restart_worker`.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }
}

pub(crate) fn ok(v: impl Serialize) -> ToolResult {
    let v = serde_json::to_value(v).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
    Ok(CallToolResult::structured(v))
}

pub(crate) fn refuse(message: impl Into<String>) -> ToolResult {
    Ok(CallToolResult::structured_error(json!({ "error": message.into() })))
}

/// Built once: by default `#[tool_handler]` builds the whole router (every tool and its schema)
/// on each call, which was most of a `get_task`'s CPU time.
static ROUTER: std::sync::LazyLock<rmcp::handler::server::router::tool::ToolRouter<TaskBridge>> =
    std::sync::LazyLock::new(|| crate::schema::cleaned(TaskBridge::tool_router()));

/// The tools as `tools/list` gives them.
#[cfg(test)]
pub(crate) fn listed_tools() -> Vec<rmcp::model::Tool> {
    ROUTER.list_all()
}

/// Earlier names of tools, still accepted so no client breaks; `tools/list` shows only the
/// current ones (README, "One name per operation").
pub const TOOL_ALIASES: &[(&str, &str)] = &[("worker_heartbeat", "list_workers")];

#[tool_handler(router = ROUTER)]
impl ServerHandler for TaskBridge {
    async fn call_tool(
        &self,
        mut request: rmcp::model::CallToolRequestParams,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        if let Some((_, current)) = TOOL_ALIASES.iter().find(|(old, _)| *old == request.name) {
            request.name = (*current).into();
        }
        if ROUTER.get(&request.name).is_none() {
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown tool '{}'; tools/list lists the {} tools (submit_task, wait_for, \
                     get_task_result, ...)",
                    request.name,
                    ROUTER.list_all().len()
                ),
                None,
            ));
        }
        let tcc = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        ROUTER.call(tcc).await
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        self.get_mcp_task(request, context).await
    }

    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<(), ErrorData> {
        self.update_mcp_task(request, context).await
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<(), ErrorData> {
        self.cancel_mcp_task(request, context).await
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build())
            .with_server_info(Implementation::new("taskbridge", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}
