//! HTTP MCP sessions with a bound: rmcp's in-memory session manager keeps every session until
//! its client deletes it, and a client that only ever initializes (a misbehaving one, a scanner
//! holding the token) would grow the server without end. This keeps at most [`MAX_SESSIONS`],
//! closing the least recently used when a new one comes, and lets an idle one go after
//! [`IDLE`]. A client whose session went away gets 404 and initializes again, as the protocol
//! says it should.

use futures::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::WorkerTransport;
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, LocalSessionWorker, SessionConfig,
};
use rmcp::transport::streamable_http_server::session::{ServerSseMessage, SessionId};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Sessions kept at once; about 70 KB each when idle.
pub const MAX_SESSIONS: usize = 256;

/// A session nobody used for this long is closed (rmcp's default is five minutes).
pub const IDLE: Duration = Duration::from_secs(120);

/// [`LocalSessionManager`] with a cap and a shorter idle timeout.
pub struct CappedSessions {
    inner: LocalSessionManager,
    max: usize,
    /// When each live session was last used.
    used: std::sync::Mutex<HashMap<SessionId, Instant>>,
}

impl CappedSessions {
    pub fn new(max: usize, idle: Duration) -> Self {
        let mut inner = LocalSessionManager::default();
        let mut config = SessionConfig::default();
        config.keep_alive = Some(idle);
        inner.session_config = config;
        CappedSessions { inner, max: max.max(1), used: Default::default() }
    }

    fn touch(&self, id: &SessionId) {
        if let Ok(mut used) = self.used.lock()
            && let Some(at) = used.get_mut(id)
        {
            *at = Instant::now();
        }
    }

    /// The sessions to close so that one more fits: the least recently used.
    fn over_cap(&self) -> Vec<SessionId> {
        let Ok(mut used) = self.used.lock() else { return Vec::new() };
        let mut gone = Vec::new();
        while used.len() >= self.max {
            let Some(oldest) = used.iter().min_by_key(|(_, at)| **at).map(|(id, _)| id.clone())
            else {
                break;
            };
            used.remove(&oldest);
            gone.push(oldest);
        }
        gone
    }
}

impl SessionManager for CappedSessions {
    type Error = LocalSessionManagerError;
    type Transport = WorkerTransport<LocalSessionWorker>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        for id in self.over_cap() {
            tracing::debug!(session = %id, "closing the least recently used MCP session");
            let _ = self.inner.close_session(&id).await;
        }
        let (id, transport) = self.inner.create_session().await?;
        if let Ok(mut used) = self.used.lock() {
            used.insert(id.clone(), Instant::now());
        }
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.touch(id);
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        if let Ok(mut used) = self.used.lock() {
            used.remove(id);
        }
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.touch(id);
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        self.inner.resume(id, last_event_id).await
    }
}
