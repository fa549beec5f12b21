//! Telling people a task needs them or has ended: a desktop notification (Linux, macOS,
//! Windows, through `notify-rust`) and an optional webhook, so a worker on a server can ping a
//! phone. Both are best effort: a notification that fails, or a webhook that hangs, never slows
//! or breaks the worker.

use queue::{Task, TaskStatus};
use serde::Serialize;
use std::time::Duration;

/// How to notify; part of [`crate::WorkerConfig`], filled from the config file's `[notify]`.
#[derive(Debug, Clone, PartialEq)]
pub struct NotifyConfig {
    pub desktop: bool,
    /// `http://` or `https://` URL that receives a JSON POST on waiting, done and failed.
    pub webhook: Option<String>,
    /// The webhook's whole request (connect, send, answer) may take this long.
    pub webhook_timeout: Duration,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        NotifyConfig { desktop: true, webhook: None, webhook_timeout: Duration::from_secs(10) }
    }
}

/// The webhook's JSON body.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Event {
    /// `waiting`, `done` or `failed`.
    pub event: &'static str,
    pub task_id: i64,
    pub title: String,
    pub status: String,
    pub repo: String,
    pub question: Option<String>,
    pub error: Option<String>,
}

impl Event {
    /// The event for a task that just settled, if its new state is one people hear about.
    pub fn for_task(task: &Task) -> Option<Event> {
        let event = match task.status {
            TaskStatus::Waiting => "waiting",
            TaskStatus::Done => "done",
            TaskStatus::Failed => "failed",
            _ => return None,
        };
        Some(Event {
            event,
            task_id: task.id.0,
            title: task.title.clone(),
            status: task.display_status.clone(),
            repo: task.repo.clone(),
            question: task.question.clone(),
            error: task.error.clone(),
        })
    }

    fn headline(&self) -> String {
        match self.event {
            "waiting" => format!("TaskBridge task {} asks", self.task_id),
            "done" => format!("TaskBridge task {} is done", self.task_id),
            _ => format!("TaskBridge task {} failed", self.task_id),
        }
    }

    fn body(&self) -> String {
        let detail = self.question.as_deref().or(self.error.as_deref()).unwrap_or("");
        if detail.is_empty() { self.title.clone() } else { format!("{}\n{detail}", self.title) }
    }
}

/// Installs ring as rustls's crypto provider once per process. reqwest is built without a
/// provider of its own (aws-lc takes minutes to build on two cores, and no system OpenSSL is
/// needed this way), so every process that builds a reqwest client calls this first.
pub fn install_tls() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Another part of the process may have installed one already; either is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Sends notifications in the background and keeps track of the webhook requests in flight, so
/// a worker that stops (`--once`, a shutdown) can give them a moment to arrive.
#[derive(Debug, Default)]
pub struct Notifier {
    cfg: NotifyConfig,
    in_flight: tokio_util::task::TaskTracker,
}

impl Notifier {
    pub fn new(cfg: NotifyConfig) -> Notifier {
        Notifier { cfg, in_flight: tokio_util::task::TaskTracker::new() }
    }

    /// Sends `event` everywhere the configuration says. Never waits for the webhook. Must be
    /// called on a tokio runtime when a webhook is set.
    pub fn send(&self, event: Event) {
        if self.cfg.desktop && event.event == "waiting" {
            desktop(&event.headline(), &event.body());
        }
        if let Some(url) = self.cfg.webhook.clone() {
            let timeout = self.cfg.webhook_timeout;
            self.in_flight.spawn(async move {
                if let Err(e) = post(&url, &event, timeout).await {
                    tracing::warn!(task = event.task_id, error = %e, "the notification webhook failed");
                }
            });
        }
    }

    /// Waits up to `grace` for webhook requests still in flight.
    pub async fn flush(&self, grace: Duration) {
        self.in_flight.close();
        let _ = tokio::time::timeout(grace, self.in_flight.wait()).await;
    }
}

async fn post(url: &str, event: &Event, timeout: Duration) -> Result<(), String> {
    install_tls();
    let client = reqwest::Client::builder().timeout(timeout).build().map_err(|e| e.to_string())?;
    let resp = client.post(url).json(event).send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("it answered {}", resp.status()));
    }
    Ok(())
}

/// A desktop notification on its own thread: without a desktop session (a server, CI) it fails
/// quietly.
pub fn desktop(title: &str, body: &str) {
    let (title, body) = (title.to_owned(), body.to_owned());
    let spawned = std::thread::Builder::new().name("notify".into()).spawn(move || {
        if let Err(e) = notify_rust::Notification::new()
            .appname("TaskBridge")
            .summary(&title)
            .body(&body)
            .show()
        {
            tracing::debug!(error = %e, "no desktop notification");
        }
    });
    if let Err(e) = spawned {
        tracing::debug!(error = %e, "no desktop notification");
    }
}
