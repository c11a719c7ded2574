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
//! - **Per remote address**: at most `max_connections_per_address` open connections from one
//!   address off loopback, counted at accept before a byte is read (`Conns::admit`), so slow or
//!   silent sockets from one client cannot take every place. Loopback peers are exempt: every
//!   local agent shares 127.0.0.1.
//! - **Per identity**: once a request's headers are read its connection counts for the
//!   request's identity (the agent of its token, `X-Rsim-Agent` or the default; the web page's
//!   caller), idle or not, until the connection closes or carries another identity's request;
//!   past `max_connections_per_agent` the request is answered `503` naming the key and the
//!   connection closed (`ConnHandle::admit`). Over HTTP/1.1 a connection carries one request at
//!   a time, so this bounds an identity's requests in flight and open streams too. The web
//!   page's event streams are further bounded per identity (`max_streams_per_agent`, in
//!   `faces::web`).
//! - **The owner's reserve**: a connection accepted while `max_connections - owner_reserve` or
//!   more are open serves only the study owner's requests (an agent's gets `503` naming
//!   `server.owner_reserve`, an anonymous one is served and its connection closed), and the
//!   last `owner_reserve` event streams are the owner's too; so agents, however many, never
//!   make the owner's page answer `503`. The owner is exempt from the per-identity limits. The
//!   owner is the web page on loopback without `--tokens` (any local process can reach it, as
//!   it can the study's files), or the tokens file's `[owner]` token. Before its headers a
//!   connection has no identity: sockets that send none hold a place of the reserve for at most
//!   `header_timeout_s`, and off loopback no more than `max_connections_per_address` of them.
//! - **Connections that say nothing**: silent sockets and anonymous requests (which loopback's
//!   exemption does not count) keep at most half of `max_connections`: past it, or when the
//!   server is full, a new connection takes the place of the oldest of them that has had 200 ms
//!   to send its request. So a local process with no token cannot fill the server.
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
    refusal_response(&format!(
        "the server holds its maximum of {max} connections (server.max_connections); retry shortly"
    ))
}

/// A `503` naming why a connection is refused before any byte of it is read.
pub fn refusal_response(message: &str) -> Vec<u8> {
    let body = rpc_error(-32000, message);
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 2\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The connection limits of the accept loop and of each request's identity (`[server]`).
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// `server.max_connections` (after the file-descriptor limit lowered it).
    pub max_connections: usize,
    /// `server.max_connections_per_address`: remote peers only.
    pub per_address: usize,
    /// `server.max_connections_per_agent`.
    pub per_agent: usize,
    /// `server.owner_reserve`: less than `max_connections`.
    pub owner_reserve: usize,
}

/// Who sent a request, as far as the connection limits care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who<'a> {
    /// No identity (yet): the sign-in page, a missing or wrong token (answered 401 anyway).
    Anonymous,
    /// The study owner: exempt from the per-agent limits, and may use the reserve.
    Owner,
    /// An agent identity.
    Agent(&'a str),
}

/// What becomes of a request once its identity is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    Serve,
    /// Serve it, then close the connection (`Connection: close`): an anonymous request on a
    /// connection of the owner's reserve does not keep its place.
    ServeThenClose,
    /// Answer `503` with this message and close the connection.
    Refuse(String),
}

/// Every open connection of the HTTP face: counted per remote address when accepted, and per
/// agent identity once a request's headers say whose it is.
///
/// The owner's reserve: a connection accepted while `max_connections - owner_reserve` or more
/// are open is on the reserve; only the owner's requests are served on it (an agent's is
/// refused, an anonymous one is served and the connection closed after it). Connections
/// accepted below that mark number at most `max_connections - owner_reserve` at any time, so
/// agents together never hold more, and the owner always finds `owner_reserve` places that no
/// agent keeps longer than one refused request.
pub struct Conns {
    lim: ConnLimits,
    st: std::sync::Mutex<ConnsState>,
}

#[derive(Default)]
struct ConnsState {
    next: u64,
    open: HashMap<u64, Slot>,
    by_address: HashMap<std::net::IpAddr, usize>,
    by_agent: HashMap<String, usize>,
}

struct Slot {
    /// The remote address it counts for (none: loopback).
    address: Option<std::net::IpAddr>,
    /// Accepted into the owner's reserve.
    reserve: bool,
    /// The agent identity it counts for (its latest request's; none: anonymous or the owner).
    agent: Option<String>,
    /// Whether a request on it was the owner's.
    owner: bool,
    /// When it was accepted, and what tells its task to close it (`Conns::admit`); whether it
    /// was told.
    accepted: std::time::Instant,
    evict: Arc<tokio::sync::Notify>,
    evicted: bool,
}

impl Slot {
    /// Whether no request on it has said whose it is: silent so far, or anonymous.
    fn unidentified(&self) -> bool {
        self.agent.is_none() && !self.owner && !self.evicted
    }
}

/// The connections the study owner's requests may hold at once: an eighth of `max_connections`,
/// at least twice the owner's reserve and 4.
fn owner_cap(max_connections: usize, owner_reserve: usize) -> usize {
    (max_connections / 8).max(owner_reserve * 2).max(4)
}

/// How long a connection has to say whose it is before a newer one may take its place, when
/// connections that have said nothing hold `unidentified_cap` places.
const IDENTIFY_GRACE: Duration = Duration::from_millis(200);

/// Connections that have not said whose they are (silent sockets, anonymous requests) keep at
/// most this many places once they have had `IDENTIFY_GRACE` to speak — half of
/// `max_connections`, at least 4 — and a full server gives a new connection the place of the
/// oldest of them: so a local process with no token, which the per-address limit does not
/// count, cannot hold every place and answer the owner and every agent `503`.
fn unidentified_cap(max_connections: usize) -> usize {
    (max_connections / 2).max(4)
}

impl ConnsState {
    fn unbind(by_agent: &mut HashMap<String, usize>, slot: &mut Slot) {
        if let Some(a) = slot.agent.take()
            && let Some(n) = by_agent.get_mut(&a)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                by_agent.remove(&a);
            }
        }
    }
}

/// The address a peer counts for: none for loopback (IPv4-mapped loopback included).
fn counted_address(peer: std::net::IpAddr) -> Option<std::net::IpAddr> {
    let ip = peer.to_canonical();
    (!ip.is_loopback()).then_some(ip)
}

impl Conns {
    pub fn new(lim: ConnLimits) -> Arc<Conns> {
        Arc::new(Conns {
            lim,
            st: std::sync::Mutex::new(ConnsState::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ConnsState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A connection just accepted from `peer`, before any byte of it is read: its place, or
    /// why it has none (the message of the `503` written before closing it).
    pub fn admit(self: &Arc<Self>, peer: std::net::IpAddr) -> std::result::Result<Conn, String> {
        let address = counted_address(peer);
        let mut st = self.state();
        if let Some(ip) = address {
            let held = st.by_address.get(&ip).copied().unwrap_or(0);
            if held >= self.lim.per_address {
                return Err(format!(
                    "{ip} holds its maximum of {} open connections (server.max_connections_per_address); close one or retry shortly",
                    self.lim.per_address
                ));
            }
        }
        let open = st.open.len();
        // Full, or past the places of connections that have said nothing: the oldest of those
        // gives its place to this one if it has had time to speak (`IDENTIFY_GRACE`). A client
        // sends its request at once, so only a socket that says nothing stays the oldest; a
        // burst of new clients is let in up to the limit.
        let cap = unidentified_cap(self.lim.max_connections);
        let full = open >= self.lim.max_connections;
        let mut count = 0usize;
        let mut oldest: Option<&mut Slot> = None;
        for slot in st.open.values_mut().filter(|s| s.unidentified()) {
            count += 1;
            if oldest.as_ref().is_none_or(|o| slot.accepted < o.accepted) {
                oldest = Some(slot);
            }
        }
        // A place given up is taken as it was (on the owner's reserve or not), so agents never
        // hold more than they could before.
        let mut taken_reserve = None;
        if full || count >= cap {
            match oldest {
                // Full: the oldest connection that has said nothing goes, however young (a
                // flood of fresh sockets would otherwise keep every place too young to give up,
                // and refuse the owner's at accept). An honest client is identified by its
                // first request, within the many newer accepts it takes to become the oldest.
                Some(o) if full || o.accepted.elapsed() >= IDENTIFY_GRACE => {
                    o.evicted = true;
                    o.evict.notify_one();
                    taken_reserve = Some(o.reserve);
                }
                _ if full => {
                    return Err(format!(
                        "the server holds its maximum of {} connections (server.max_connections); retry shortly",
                        self.lim.max_connections
                    ));
                }
                _ => {}
            }
        }
        let reserve = taken_reserve.unwrap_or_else(|| {
            open >= self
                .lim
                .max_connections
                .saturating_sub(self.lim.owner_reserve)
        });
        let evict = Arc::new(tokio::sync::Notify::new());
        let id = st.next;
        st.next += 1;
        st.open.insert(
            id,
            Slot {
                address,
                reserve,
                agent: None,
                owner: false,
                accepted: std::time::Instant::now(),
                evict: evict.clone(),
                evicted: false,
            },
        );
        if let Some(ip) = address {
            *st.by_address.entry(ip).or_default() += 1;
        }
        Ok(Conn {
            handle: ConnHandle {
                conns: self.clone(),
                id,
            },
            evict,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.state().open.len()
    }

    /// Connections counted for `agent` now.
    pub fn held_by(&self, agent: &str) -> usize {
        self.state().by_agent.get(agent).copied().unwrap_or(0)
    }
}

/// A connection's place, held by the task that serves it; dropped, the place is free.
pub struct Conn {
    handle: ConnHandle,
    evict: Arc<tokio::sync::Notify>,
}

impl Conn {
    /// Told when the connection must close to give its place to a newer one (it said nothing).
    pub fn evicted(&self) -> Arc<tokio::sync::Notify> {
        self.evict.clone()
    }

    /// What the connection's requests carry, to be admitted by identity.
    pub fn handle(&self) -> ConnHandle {
        self.handle.clone()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let conns = &self.handle.conns;
        let mut st = conns.state();
        let ConnsState {
            open,
            by_address,
            by_agent,
            ..
        } = &mut *st;
        if let Some(mut slot) = open.remove(&self.handle.id) {
            ConnsState::unbind(by_agent, &mut slot);
            if let Some(ip) = slot.address
                && let Some(n) = by_address.get_mut(&ip)
            {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    by_address.remove(&ip);
                }
            }
        }
    }
}

/// The connection a request came on (a request extension).
#[derive(Clone)]
pub struct ConnHandle {
    conns: Arc<Conns>,
    id: u64,
}

impl ConnHandle {
    /// Admit a request whose headers say it is `who`'s: the connection counts for that
    /// identity from now on (for its previous one no longer).
    pub fn admit(&self, who: Who<'_>) -> Admit {
        let lim = self.conns.lim;
        let mut st = self.conns.state();
        let ConnsState { open, by_agent, .. } = &mut *st;
        let open_now = open.len();
        let Some(slot) = open.get_mut(&self.id) else {
            // The connection is gone (its task ended): nothing to count.
            return Admit::ServeThenClose;
        };
        match who {
            Who::Anonymous if slot.reserve => Admit::ServeThenClose,
            Who::Anonymous => Admit::Serve,
            Who::Owner => {
                // The owner is a person at a browser, a handful of connections: on loopback
                // without tokens anyone local is the owner, so the owner's places are bounded
                // too, and agents keep theirs.
                let owners = open.values().filter(|s| s.owner).count();
                let Some(slot) = open.get_mut(&self.id) else {
                    return Admit::ServeThenClose;
                };
                if !slot.owner && owners >= owner_cap(lim.max_connections, lim.owner_reserve) {
                    return Admit::Refuse(format!(
                        "the study owner holds its maximum of {} connections; close one or retry shortly",
                        owner_cap(lim.max_connections, lim.owner_reserve)
                    ));
                }
                ConnsState::unbind(by_agent, slot);
                slot.owner = true;
                Admit::Serve
            }
            Who::Agent(a) => {
                if slot.agent.as_deref() == Some(a) {
                    return Admit::Serve;
                }
                if slot.reserve {
                    return Admit::Refuse(format!(
                        "the server's last {} connections (server.owner_reserve) are kept for the study owner, and {} of server.max_connections = {} are open; retry shortly",
                        lim.owner_reserve, open_now, lim.max_connections
                    ));
                }
                let held = by_agent.get(a).copied().unwrap_or(0);
                if held >= lim.per_agent {
                    return Admit::Refuse(format!(
                        "agent {a:?} holds its maximum of {} connections (server.max_connections_per_agent), counting its requests in flight and open streams; close one or wait for a request to finish",
                        lim.per_agent
                    ));
                }
                ConnsState::unbind(by_agent, slot);
                slot.agent = Some(a.to_string());
                *by_agent.entry(a.to_string()).or_default() += 1;
                Admit::Serve
            }
        }
    }
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
    /// The identity that opened session `id`, where this server saw it opened.
    pub fn owner_of(&self, id: &str) -> Option<String> {
        let st = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        st.owner.get(id).map(|(agent, _)| agent.clone())
    }

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

    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().expect("ip")
    }

    fn refused(a: &Admit, key: &str) -> bool {
        matches!(a, Admit::Refuse(m) if m.contains(key))
    }

    #[test]
    fn a_remote_address_is_capped_at_accept_and_loopback_is_not() {
        let conns = Conns::new(ConnLimits {
            max_connections: 20,
            per_address: 3,
            per_agent: 20,
            owner_reserve: 0,
        });
        let held: Vec<Conn> = (0..3)
            .map(|_| conns.admit(ip("192.0.2.7")).expect("within the cap"))
            .collect();
        let err = conns.admit(ip("192.0.2.7")).err().expect("past the cap");
        assert!(err.contains("server.max_connections_per_address"), "{err}");
        // The same address written as IPv4-mapped IPv6 is the same peer.
        assert!(conns.admit(ip("::ffff:192.0.2.7")).is_err());
        // Another address, and loopback (however many), still get in.
        let _other = conns.admit(ip("198.51.100.1")).expect("another address");
        let local: Vec<Conn> = (0..10)
            .map(|_| conns.admit(ip("127.0.0.1")).expect("loopback is exempt"))
            .collect();
        let _mapped = conns
            .admit(ip("::ffff:127.0.0.1"))
            .expect("mapped loopback");
        assert_eq!(conns.open(), 15);
        drop(held);
        let _again = conns
            .admit(ip("192.0.2.7"))
            .expect("closed ones free their places");
        drop(local);
        assert_eq!(conns.open(), 3);
    }

    /// Full, a new connection takes the place of the oldest that has said nothing, however
    /// young (that one is told to close), as it was; with every place identified it is refused.
    /// The owner's requests hold at most their share.
    #[test]
    fn a_full_server_gives_the_oldest_silent_place_to_a_new_connection() {
        let conns = Conns::new(ConnLimits {
            max_connections: 4,
            per_address: 100,
            per_agent: 4,
            owner_reserve: 1,
        });
        let lo = ip("127.0.0.1");
        let silent: Vec<Conn> = (0..4).map(|_| conns.admit(lo).expect("accepted")).collect();
        let newer = conns.admit(lo).expect("the oldest silent one's place");
        let told = silent[0].evicted();
        assert!(
            futures_lite_now(told.notified()),
            "the oldest silent connection is told to close"
        );
        drop(silent);
        // Identified, nobody gives a place up.
        let all: Vec<Conn> = (0..3).map(|_| conns.admit(lo).expect("accepted")).collect();
        assert_eq!(newer.handle().admit(Who::Agent("a")), Admit::Serve);
        for (i, c) in all[..2].iter().enumerate() {
            assert_eq!(c.handle().admit(Who::Agent(&format!("b{i}"))), Admit::Serve);
        }
        // the last, on the owner's reserve
        assert_eq!(all[2].handle().admit(Who::Owner), Admit::Serve);
        assert!(conns.admit(lo).is_err(), "past max_connections");
        assert_eq!(owner_cap(256, 8), 32);
        assert_eq!(owner_cap(16, 2), 4);
    }

    /// Whether a `Notified` is ready at once.
    fn futures_lite_now(n: tokio::sync::futures::Notified<'_>) -> bool {
        let mut n = std::pin::pin!(n);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        n.as_mut().poll(&mut cx).is_ready()
    }

    #[test]
    fn an_identity_is_capped_and_the_reserve_is_the_owners() {
        let conns = Conns::new(ConnLimits {
            max_connections: 10,
            per_address: 100,
            per_agent: 3,
            owner_reserve: 2,
        });
        let lo = ip("127.0.0.1");
        // One agent: three connections, the fourth refused naming the key.
        let flood: Vec<Conn> = (0..4).map(|_| conns.admit(lo).expect("accepted")).collect();
        for c in &flood[..3] {
            assert_eq!(c.handle().admit(Who::Agent("flood")), Admit::Serve);
        }
        assert!(refused(
            &flood[3].handle().admit(Who::Agent("flood")),
            "server.max_connections_per_agent"
        ));
        assert_eq!(conns.held_by("flood"), 3);
        // Its next request on a connection it holds is served; another agent still gets in.
        assert_eq!(flood[0].handle().admit(Who::Agent("flood")), Admit::Serve);
        assert_eq!(flood[3].handle().admit(Who::Agent("other")), Admit::Serve);
        // A connection moves to the identity of its latest request.
        assert_eq!(flood[0].handle().admit(Who::Agent("other")), Admit::Serve);
        assert_eq!((conns.held_by("flood"), conns.held_by("other")), (2, 2));
        // The owner is exempt from the per-agent cap and takes no agent's count.
        assert_eq!(flood[1].handle().admit(Who::Owner), Admit::Serve);
        assert_eq!(conns.held_by("flood"), 1);
        // Fill the agents' places (8 of 10): connections past them are the owner's reserve.
        let more: Vec<Conn> = (0..4).map(|_| conns.admit(lo).expect("accepted")).collect();
        for (i, c) in more.iter().enumerate() {
            assert_eq!(c.handle().admit(Who::Agent(&format!("a{i}"))), Admit::Serve);
        }
        let reserve: Vec<Conn> = (0..2).map(|_| conns.admit(lo).expect("accepted")).collect();
        assert!(refused(
            &reserve[0].handle().admit(Who::Agent("late")),
            "server.owner_reserve"
        ));
        assert_eq!(
            reserve[0].handle().admit(Who::Anonymous),
            Admit::ServeThenClose
        );
        assert_eq!(reserve[0].handle().admit(Who::Owner), Admit::Serve);
        assert_eq!(reserve[1].handle().admit(Who::Owner), Admit::Serve);
        // Full of connections that said whose they are: the next is refused.
        assert!(conns.admit(lo).is_err(), "past max_connections");
        // An anonymous request on an agents' place keeps it.
        assert_eq!(more[0].handle().admit(Who::Anonymous), Admit::Serve);
        // Closing frees the identity's count.
        drop(flood);
        assert_eq!((conns.held_by("flood"), conns.held_by("other")), (0, 0));
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
