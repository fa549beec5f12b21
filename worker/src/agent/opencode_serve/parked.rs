//! Requests parked while their tasks wait: the agent stays blocked on its question or permission
//! in this worker's server, and the answer goes to that request when this worker claims the task
//! again and the server that holds it still lives.

use super::ServeAgent;
use queue::TaskId;
use serde_json::json;
use std::path::{Path, PathBuf};

/// A request the agent is blocked on, in this worker's server, while its task waits.
#[derive(Debug, Clone)]
pub(super) struct Parked {
    session: String,
    request_id: String,
    dir: PathBuf,
    generation: u64,
}

impl ServeAgent {
    /// Whether the agent of `task` is still blocked on `request_id` in this worker's live
    /// server, so the answer can go to it directly. The parked entry is taken either way.
    pub async fn take_parked(&self, task: TaskId, request_id: &str) -> bool {
        let parked = self.parked.lock().ok().and_then(|mut p| p.remove(&task));
        let Some(parked) = parked else { return false };
        let mut state = self.state.lock().await;
        let live = state.as_mut().is_some_and(|r| {
            r.generation == parked.generation && matches!(r.child.try_wait(), Ok(None))
        });
        live && parked.request_id == request_id
    }

    /// The tasks whose agents are parked here.
    pub fn parked_tasks(&self) -> Vec<TaskId> {
        self.parked.lock().map(|p| p.keys().copied().collect()).unwrap_or_default()
    }

    /// Aborts the sessions parked for tasks that `still_waiting` no longer sees waiting (they
    /// were cancelled, or their question timed out), so that nothing runs on for them.
    pub async fn sweep_parked(&self, still_waiting: &impl Fn(TaskId) -> bool) {
        let gone: Vec<(TaskId, Parked)> = match self.parked.lock() {
            Ok(mut p) => {
                let ids: Vec<TaskId> = p.keys().copied().filter(|id| !still_waiting(*id)).collect();
                ids.into_iter().filter_map(|id| p.remove(&id).map(|x| (id, x))).collect()
            }
            Err(_) => return,
        };
        if gone.is_empty() {
            return;
        }
        let port = match self.state.lock().await.as_ref() {
            Some(r) => r.port,
            None => return,
        };
        for (id, p) in gone {
            let url = self.url(port, &format!("/session/{}/abort", p.session), &p.dir);
            match self.post(&url, &json!({})).await {
                Ok(_) => {
                    tracing::info!(task = %id, "aborted the session of a task that stopped waiting")
                }
                Err(e) => {
                    tracing::warn!(task = %id, error = %e, "aborting a parked session failed")
                }
            }
        }
    }

    /// Keeps the request the agent of `task` is blocked on, for the answer to go to.
    pub(super) async fn park(&self, task: TaskId, session: &str, request_id: &str, dir: &Path) {
        let generation = self.state.lock().await.as_ref().map(|r| r.generation).unwrap_or(0);
        let parked = Parked {
            session: session.to_owned(),
            request_id: request_id.to_owned(),
            dir: dir.to_path_buf(),
            generation,
        };
        if let Ok(mut p) = self.parked.lock() {
            p.insert(task, parked);
        }
    }
}
