//! Resource limits of `rsim serve --http` that no client can exceed (`[server]` in `rsim.toml`):
//!
//! - **Connections**: at most `max_connections` open at once; one more is answered `503` and
//!   closed without being read. The process's file-descriptor limit is raised to its hard limit
//!   at start, and the connection limit lowered to what it leaves after `FD_RESERVE` descriptors
//!   for the study itself (git, the index, job logs, job processes), so a crowd of clients can
//!   never starve the agents already connected of descriptors.
//! - **Slow clients**: a request's headers must arrive within `header_timeout_s` (hyper's own
//!   timer), and a connection that moves no byte either way for `idle_timeout_s` is closed
//!   (`Idle`). SSE streams send a keep-alive every 15 s, so a live stream is never idle.
//! - **Sessions**: at most `max_sessions` MCP sessions, and `max_sessions_per_agent` for one
//!   identity; an `initialize` past either is answered `503` with a JSON-RPC error saying which
//!   limit. A session with no request for `session_idle_s` is closed by rmcp's session worker.
//!   Both counts are exact under concurrency: creating a session and checking the count happen
//!   under one lock (`BoundedSessions`), and an identity's sessions in flight are counted before
//!   they exist (`AgentSessions`).

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Descriptors kept for the study's own work, never given to connections.
pub const FD_RESERVE: u64 = 128;

/// Raise the soft file-descriptor limit to the hard one; returns the soft limit now in force.
pub fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!("cannot raise the file-descriptor limit from {soft} to {hard}: {e}");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(e) => {
            tracing::warn!("cannot read the file-descriptor limit: {e}");
            1024
        }
    }
}

/// The connection limit the descriptor limit allows: `wanted`, or less when `fd_limit` minus
/// the reserve is smaller (at least 1).
pub fn connection_limit(wanted: usize, fd_limit: u64) -> usize {
    let room = fd_limit.saturating_sub(FD_RESERVE).max(1);
    wanted.min(usize::try_from(room).unwrap_or(usize::MAX))
}

/// A JSON-RPC error with no request id: the body of every refusal the HTTP face makes before
/// rmcp sees a request (401, 503).
pub fn rpc_error(code: i64, message: &str) -> String {
    serde_json::json!({
        "jsonrpc": "2.0", "id": null,
        "error": { "code": code, "message": message },
    })
    .to_string()
}

/// The answer to a connection past `max_connections`, written before closing it.
pub fn busy_response(max: usize) -> Vec<u8> {
    let body = rpc_error(
        -32000,
        &format!(
            "the server holds its maximum of {max} connections (server.max_connections); retry shortly"
        ),
    );
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 2\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A stream that fails with `TimedOut` once no byte has moved either way for `timeout`.
pub struct Idle<S> {
    inner: S,
    timeout: Duration,
    sleep: Pin<Box<Sleep>>,
}

impl<S> Idle<S> {
    pub fn new(inner: S, timeout: Duration) -> Self {
        Idle {
            inner,
            timeout,
            sleep: Box::pin(tokio::time::sleep(timeout)),
        }
    }

    fn moved(&mut self) {
        let at = Instant::now() + self.timeout;
        self.sleep.as_mut().reset(at);
    }

    /// Pending: has the idle deadline passed (registering the waker if not)?
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.sleep.as_mut().poll(cx).is_ready()
    }
}

fn idle_error(timeout: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "no byte moved for {} s (server.idle_timeout_s)",
            timeout.as_secs()
        ),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for Idle<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(idle_error(self.timeout))),
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Idle<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, data) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(idle_error(self.timeout))),
            other => other,
        }
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(idle_error(self.timeout))),
            other => other,
        }
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Why a session could not be created or used.
#[derive(Debug, thiserror::Error)]
pub enum BoundedError {
    #[error("the server holds its maximum of {0} MCP sessions (server.max_sessions)")]
    Full(usize),
    #[error(transparent)]
    Inner(#[from] LocalSessionManagerError),
}

/// rmcp's local session manager with a bound on how many sessions exist at once. The check and
/// the creation happen under one lock, so concurrent `initialize`s cannot pass it together.
pub struct BoundedSessions {
    inner: LocalSessionManager,
    max: usize,
    creating: tokio::sync::Mutex<()>,
}

impl BoundedSessions {
    pub fn new(max: usize, idle: Duration) -> Self {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = Some(idle);
        BoundedSessions {
            inner,
            max,
            creating: tokio::sync::Mutex::new(()),
        }
    }
    pub async fn count(&self) -> usize {
        self.inner.sessions.read().await.len()
    }
    pub fn max(&self) -> usize {
        self.max
    }
}

impl SessionManager for BoundedSessions {
    type Error = BoundedError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let _one = self.creating.lock().await;
        if self.count().await >= self.max {
            return Err(BoundedError::Full(self.max));
        }
        Ok(self.inner.create_session().await?)
    }
    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }
    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }
    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        Ok(self.inner.close_session(id).await?)
    }
    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<
        impl futures_core::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
        Self::Error,
    > {
        Ok(trait_create_stream(&self.inner, id, message).await?)
    }
    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }
    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<
        impl futures_core::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
        Self::Error,
    > {
        Ok(trait_create_standalone_stream(&self.inner, id).await?)
    }
    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<
        impl futures_core::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
        Self::Error,
    > {
        Ok(trait_resume(&self.inner, id, last_event_id).await?)
    }
}

// Through a generic, rmcp's calls carry the trait's bounds (`Send + Sync` streams) rather than
// the local manager's narrower signatures.
async fn trait_create_stream<M: SessionManager>(
    m: &M,
    id: &SessionId,
    message: ClientJsonRpcMessage,
) -> Result<impl futures_core::Stream<Item = ServerSseMessage> + Send + Sync + 'static, M::Error> {
    m.create_stream(id, message).await
}
async fn trait_create_standalone_stream<M: SessionManager>(
    m: &M,
    id: &SessionId,
) -> Result<impl futures_core::Stream<Item = ServerSseMessage> + Send + Sync + 'static, M::Error> {
    m.create_standalone_stream(id).await
}
async fn trait_resume<M: SessionManager>(
    m: &M,
    id: &SessionId,
    last_event_id: String,
) -> Result<impl futures_core::Stream<Item = ServerSseMessage> + Send + Sync + 'static, M::Error> {
    m.resume(id, last_event_id).await
}

/// Which identity holds which session, and how many each is opening right now: a new session
/// is counted from the moment its `initialize` is let through, so one agent's concurrent
/// `initialize`s cannot pass `max_sessions_per_agent` together.
#[derive(Default)]
pub struct AgentSessions {
    inner: std::sync::Mutex<AgentSessionsState>,
}

#[derive(Default)]
struct AgentSessionsState {
    /// Session id → (agent, when it was seen created).
    owner: HashMap<String, (String, std::time::Instant)>,
    opening: HashMap<String, usize>,
}

/// One `initialize` let through; dropped without `finish` (a failed or abandoned request), it
/// stops counting.
pub struct Opening {
    sessions: Arc<AgentSessions>,
    agent: String,
    done: bool,
}

impl Opening {
    /// The `initialize` was answered, with the new session's id (or none: no session made).
    pub fn finish(mut self, session: Option<String>) {
        self.done = true;
        let mut st = self
            .sessions
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        st.release(&self.agent);
        if let Some(id) = session {
            st.owner
                .insert(id, (self.agent.clone(), std::time::Instant::now()));
        }
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        if !self.done {
            let mut st = self
                .sessions
                .inner
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            st.release(&self.agent);
        }
    }
}

impl AgentSessionsState {
    fn release(&mut self, agent: &str) {
        if let Some(n) = self.opening.get_mut(agent) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.opening.remove(agent);
            }
        }
    }
}

impl AgentSessions {
    /// Let one more session of `agent` start, or say which limit stops it. Sessions rmcp has
    /// since closed (idle, deleted) no longer count.
    pub async fn begin(
        self: &Arc<Self>,
        agent: &str,
        max_per_agent: usize,
        sessions: &BoundedSessions,
    ) -> Result<Opening, String> {
        let seen = std::time::Instant::now();
        let live: std::collections::HashSet<String> = sessions
            .inner
            .sessions
            .read()
            .await
            .keys()
            .map(|k| k.to_string())
            .collect();
        let mut st = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // Forget sessions that are gone (only those that existed before `live` was read).
        st.owner
            .retain(|id, (_, at)| live.contains(id) || *at > seen);
        let held = st.owner.values().filter(|(a, _)| a == agent).count()
            + st.opening.get(agent).copied().unwrap_or(0);
        if held >= max_per_agent {
            return Err(format!(
                "agent {agent:?} holds its maximum of {max_per_agent} MCP sessions (server.max_sessions_per_agent); close one (HTTP DELETE with its Mcp-Session-Id) or let it expire"
            ));
        }
        if live.len() + st.opening.values().sum::<usize>() >= sessions.max() {
            return Err(format!(
                "the server holds its maximum of {} MCP sessions (server.max_sessions); retry when one closes",
                sessions.max()
            ));
        }
        *st.opening.entry(agent.to_string()).or_default() += 1;
        Ok(Opening {
            sessions: self.clone(),
            agent: agent.to_string(),
            done: false,
        })
    }
}

/// Shared so the middleware and rmcp's service see the same sessions.
pub type Sessions = Arc<BoundedSessions>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_limit_leaves_the_reserve() {
        assert_eq!(connection_limit(256, 1024), 256);
        assert_eq!(connection_limit(2000, 1024), 1024 - FD_RESERVE as usize);
        assert_eq!(connection_limit(10, 50), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_stream_times_out_and_a_moving_one_does_not() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (a, mut b) = tokio::io::duplex(64);
        let mut idle = Idle::new(a, Duration::from_secs(10));
        let mut buf = [0u8; 1];
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(6)).await;
            b.write_all(b"x").await.expect("write");
            idle.read_exact(&mut buf)
                .await
                .expect("a moving stream is kept");
        }
        let err = idle.read_exact(&mut buf).await.expect_err("idle for 10 s");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }
}
