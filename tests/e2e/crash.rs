//! kill -9 of the stdio MCP server (`taskbridge mcp`, what Claude Desktop runs) in the middle of a
//! stream of `submit_task` calls: every task the client saw acknowledged is in the database, whole,
//! and the database passes `PRAGMA integrity_check`.
#![allow(clippy::unwrap_used)]

use crate::support::Env;
use rmcp::model::CallToolRequestParams;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_server_mid_submit_loses_no_acknowledged_task() {
    let env = Env::new();
    let mut cmd = tokio::process::Command::new(crate::support::bin());
    cmd.args(["mcp", "--no-worker"]).envs(env.env_vars()).current_dir(&env.repo);
    let (client, mut child) = crate::support::stdio_client(cmd).await;
    let client = Arc::new(client);

    let acked: Arc<Mutex<Vec<(i64, String)>>> = Arc::default();
    // Two streams of submits at once, so the kill lands while calls are in flight.
    let streams: Vec<_> = (0..2)
        .map(|s| {
            let (client, acked) = (client.clone(), acked.clone());
            tokio::spawn(async move {
                for i in 0.. {
                    let prompt = format!("crash test stream {s} task {i}");
                    let args = json!({"prompt": prompt}).as_object().cloned().unwrap();
                    let req = CallToolRequestParams::new("submit_task").with_arguments(args);
                    let Ok(r) = client.call_tool(req).await else { return };
                    let id = r.structured_content.unwrap()["task_id"].as_i64().unwrap();
                    acked.lock().unwrap().push((id, prompt));
                }
            })
        })
        .collect();
    while acked.lock().unwrap().len() < 40 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let pid = child.id().unwrap() as i32;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    child.wait().await.unwrap();
    for s in streams {
        let _ = tokio::time::timeout(Duration::from_secs(10), s).await;
    }

    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 40);
    let store = queue::Store::open(env.home.join("taskbridge.db")).unwrap();
    assert_eq!(store.integrity_check().unwrap(), "ok");
    for (id, prompt) in &acked {
        let task = store.get(queue::TaskId(*id)).unwrap();
        assert_eq!(&task.prompt, prompt, "task {id} is not what was acknowledged");
        assert_eq!(task.status, queue::TaskStatus::Queued);
    }
    // Whatever was written but not acknowledged is whole too.
    for task in
        store.list(&queue::ListFilter { limit: Some(10_000), ..Default::default() }).unwrap()
    {
        assert!(task.prompt.starts_with("crash test stream "), "{task:?}");
    }
}
