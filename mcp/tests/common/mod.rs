//! A TaskBridge MCP server and an rmcp client connected in process, on a real database and git
//! repository. Shared by the tool tests and the hostile-input test.
#![allow(dead_code, clippy::unwrap_used)]

use queue::{Home, Store};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::{ServiceError, ServiceExt};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use taskbridge_mcp::TaskBridge;

pub struct World {
    pub _dir: tempfile::TempDir,
    pub repo: PathBuf,
    pub home: Home,
    pub store: Arc<Store>,
    pub client: RunningService<RoleClient, ()>,
    pub server: TaskBridge,
}

pub fn git(dir: &Path, args: &[&str]) {
    let ok = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t")
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

pub async fn world() -> World {
    world_with(worker::WorkerConfig::default()).await
}

/// A world whose server was started with `config` (its environment, its programs).
pub async fn world_with(config: worker::WorkerConfig) -> World {
    world_built(config, |_, _| None).await
}

/// A world whose server runs a worker of its own (as `taskbridge mcp` does), started by
/// `worker` on the world's queue and home.
pub async fn world_running(
    config: worker::WorkerConfig,
    worker: impl FnOnce(&Arc<Store>, &Home) -> Option<Arc<worker::Worker>>,
) -> World {
    world_built(config, worker).await
}

async fn world_built(
    config: worker::WorkerConfig,
    worker: impl FnOnce(&Arc<Store>, &Home) -> Option<Arc<worker::Worker>>,
) -> World {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("a.txt"), "a\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "init"]);
    let home = Home::at(dir.path().join("home")).unwrap();
    home.ensure().unwrap();
    let store = Arc::new(Store::open(home.db_path()).unwrap());
    let embedded = worker(&store, &home);
    let server = TaskBridge::new(store.clone(), home.clone(), repo.clone(), embedded, config);
    let (server_io, client_io) = tokio::io::duplex(1 << 20);
    let handle = server.clone();
    tokio::spawn(async move {
        let running = server.serve(server_io).await.unwrap();
        let _ = running.waiting().await;
    });
    let client = ().serve(client_io).await.unwrap();
    World { repo: repo.canonicalize().unwrap(), _dir: dir, home, store, client, server: handle }
}

impl World {
    pub async fn raw(&self, tool: &str, args: Value) -> Result<CallToolResult, ServiceError> {
        let args = args.as_object().cloned().unwrap_or_default();
        self.client
            .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
            .await
    }

    /// A successful call's structured content; the text content carries the same JSON.
    pub async fn call(&self, tool: &str, args: Value) -> Value {
        let r = self.raw(tool, args).await.unwrap();
        assert_ne!(r.is_error, Some(true), "{tool} failed: {r:?}");
        let structured = r.structured_content.clone().unwrap();
        let text = r.content[0].as_text().unwrap().text.clone();
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), structured);
        structured
    }

    /// A refused call: a tool error whose text names the problem.
    pub async fn refused(&self, tool: &str, args: Value) -> String {
        let r = self.raw(tool, args).await.unwrap();
        assert_eq!(r.is_error, Some(true), "{tool} should have been refused: {r:?}");
        r.content[0].as_text().unwrap().text.clone()
    }

    pub fn task_count(&self) -> usize {
        self.store.list(&queue::ListFilter::default()).unwrap().len()
    }
}

/// Claims the next task and makes it wait on the question "Red or blue?", as a worker would.
pub fn make_it_wait(w: &World) {
    let claim = w.store.claim_next("w", "h", std::time::Duration::from_secs(30)).unwrap().unwrap();
    let waiting = queue::Outcome::Waiting {
        question: "Red or blue?".into(),
        session_id: "ses_x".into(),
        result: None,
        ask: None,
    };
    w.store.finish(claim.task.id, claim.token, waiting).unwrap();
}
