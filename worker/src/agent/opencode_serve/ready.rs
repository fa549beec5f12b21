//! Sessions made ahead. A task's turn on its repository's server makes, once the model has been
//! asked, a session in its directory for the next task there (the directory stays for the
//! repository's next task when the task is done), and when the turn finishes it hands its event
//! stream (the directory's) on with it. The next task in that directory then prompts the agent
//! with no round trip to the server first.
//!
//! Why then: making a session costs OpenCode a write to its database and keeps it busy for tens
//! of milliseconds after it answers, as does a turn's end; a prompt that arrives meanwhile waits.
//! While the model works on the turn that made it, OpenCode has nothing else to do.
//!
//! The next task gives the session its own rules before the prompt (when it has `ask` rules or
//! flags), and its title once the model has been asked, so that the prompt waits for neither. A
//! session made ahead that no task takes (the directory not kept, a session continued there
//! instead, the worker stopping) is deleted, so that OpenCode's list keeps no empty sessions,
//! and its stream is closed, so that the server buffers nothing for it. (One made in the
//! directory of a task that then failed waits there for the task's next attempt, or for the
//! worker to stop.)

use super::client::{Http, SseLines, route};
use super::{ServeAgent, Turn, io_err};
use crate::logs::TaskLog;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;
use tokio::task::JoinHandle;

/// A session's title until its task gives it its own. Not OpenCode's default title, which
/// would have OpenCode ask the model for one.
pub(super) const READY_TITLE: &str = "taskbridge: ready for the next task";

/// A deletion of a session nobody took waits at most this long (a worker that stops deletes
/// the sessions it made ahead on its way out).
const DELETE_WITHIN: Duration = Duration::from_secs(2);

/// A session being made (or made) ahead in a directory, for the next task there.
pub(super) struct Ready {
    made: JoinHandle<std::io::Result<Made>>,
    /// The directory's event stream, handed on by the turn that made the session.
    events: Option<SseLines>,
}

/// A session made ahead.
pub(super) struct Made {
    /// The server it was made on: a server started since would not stream its events.
    generation: u64,
    /// Where it is, to be named or deleted.
    url: String,
    session: String,
}

impl ServeAgent {
    /// Starts making a session in `dir` for the next task there, beside the turn. One already
    /// there (made by an earlier turn there that no task has taken since) is kept.
    pub(super) async fn make_ready(&self, dir: &Path) {
        let Some((generation, port)) = self.live().await else { return };
        let Ok(mut ready) = self.ready.lock() else { return };
        if ready.contains_key(dir) {
            return;
        }
        let (http, d) = (self.http.clone(), dir.to_path_buf());
        let made = tokio::spawn(async move {
            let body = json!({"title": READY_TITLE, "permission": crate::policy::base_rules()});
            let created: Value = http
                .send(reqwest::Method::POST, &route(port, "/session", &d), &body)
                .await?
                .json()
                .await
                .map_err(io_err)?;
            let session = created["id"].as_str().ok_or_else(|| io_err("no session id"))?;
            let url = route(port, &format!("/session/{session}"), &d);
            Ok(Made { generation, url, session: session.to_owned() })
        });
        ready.insert(dir.to_path_buf(), Ready { made, events: None });
    }

    /// A finished turn's event stream, for the session made ahead in its directory.
    pub(super) fn hand_over(&self, dir: &Path, events: SseLines) {
        if let Ok(mut ready) = self.ready.lock()
            && let Some(r) = ready.get_mut(dir)
        {
            r.events.get_or_insert(events);
        }
    }

    /// The session made ahead in the turn's directory and that directory's event stream, for a
    /// turn that begins a session, given the task's rules. `None` when there is none, when it
    /// could not be made or readied, when its server has gone since, or when the turn goes on in
    /// a session of its own (then the one made ahead is deleted).
    pub(super) async fn ready_for(
        &self,
        port: u16,
        turn: &Turn<'_>,
        log: &mut TaskLog,
    ) -> Option<(SseLines, String)> {
        let dir = turn.dir;
        let Ready { made, events } = self.ready.lock().ok()?.remove(dir)?;
        if turn.session.is_some() {
            tokio::spawn(delete_once_made(self.http.clone(), made));
            return None;
        }
        let made = match made.await {
            Ok(Ok(made)) => made,
            Ok(Err(e)) => {
                tracing::warn!(dir = %dir.display(), error = %e, "making a session ahead failed");
                return None;
            }
            Err(_) => return None,
        };
        if self.live().await.is_none_or(|(generation, _)| generation != made.generation) {
            // Its server died: the session stays in OpenCode's list, empty (the address it would
            // be deleted at went with the server, and a restart is rare enough not to look it up).
            return None;
        }
        let rules = crate::policy::permission_rules(turn.task);
        let given = async {
            match rules == Value::Array(crate::policy::base_rules()) {
                true => Ok(()),
                false => self
                    .http
                    .send(reqwest::Method::PATCH, &made.url, &json!({"permission": rules}))
                    .await
                    .map(|_| ()),
            }
        };
        let events = async {
            match events {
                Some(e) => Ok(e),
                None => self.subscribe(port, dir).await,
            }
        };
        match tokio::try_join!(events, given) {
            Ok((events, ())) => {
                log.line(&format!("session {} was made ahead for this directory", made.session));
                Some((events, made.session))
            }
            Err(e) => {
                log.line(&format!(
                    "the session made ahead for this directory could not be readied ({e}); \
                     making a new one"
                ));
                tokio::spawn(delete(self.http.clone(), made));
                None
            }
        }
    }

    /// Gives a session made ahead (on the server now at `port`) its task's title, beside the turn.
    pub(super) fn give_title(&self, port: u16, dir: &Path, session: &str, title: String) {
        let (http, url) = (self.http.clone(), self.url(port, &format!("/session/{session}"), dir));
        tokio::spawn(async move {
            let named = http.send(reqwest::Method::PATCH, &url, &json!({"title": title})).await;
            if let Err(e) = named {
                tracing::warn!(error = %e, "naming a session made ahead failed");
            }
        });
    }

    /// Deletes the session made ahead in `dir`, if there is one, and waits for it: no task will
    /// come there.
    pub async fn forget_ready(&self, dir: &Path) {
        let ready = self.ready.lock().ok().and_then(|mut r| r.remove(dir));
        if let Some(Ready { made, .. }) = ready {
            delete_once_made(self.http.clone(), made).await;
        }
    }

    /// Deletes every session made ahead (the worker stops).
    pub(super) async fn forget_all_ready(&self) {
        let all: Vec<Ready> = match self.ready.lock() {
            Ok(mut r) => r.drain().map(|(_, ready)| ready).collect(),
            Err(_) => return,
        };
        for Ready { made, .. } in all {
            delete_once_made(self.http.clone(), made).await;
        }
    }

    /// The live server's generation and port, without starting one.
    async fn live(&self) -> Option<(u64, u16)> {
        let mut state = self.state.lock().await;
        let r = state.as_mut()?;
        matches!(r.child.try_wait(), Ok(None)).then_some((r.generation, r.port))
    }
}

/// Deletes a session made ahead that no task took, once it is made.
async fn delete_once_made(http: Http, made: JoinHandle<std::io::Result<Made>>) {
    if let Ok(Ok(made)) = made.await {
        delete(http, made).await;
    }
}

/// Deletes a session made ahead that no task took.
async fn delete(http: Http, Made { url, session, .. }: Made) {
    let sent = http.request(reqwest::Method::DELETE, &url).send();
    match tokio::time::timeout(DELETE_WITHIN, sent).await {
        Ok(Ok(r)) if r.status().is_success() => {}
        Ok(Ok(r)) => {
            tracing::warn!(session, status = %r.status(), "deleting an unused session failed")
        }
        Ok(Err(e)) => tracing::warn!(session, error = %e, "deleting an unused session failed"),
        Err(_) => tracing::warn!(session, "deleting an unused session timed out"),
    }
}
