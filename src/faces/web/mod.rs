//! The web page: `rsim serve --http ADDR` serves it at `/` beside `/mcp`, on the same listener
//! with the same tokens and roles; `rsim report --html` writes it as one self-contained file.
//!
//! What it serves: the page and its three assets (embedded in the binary: no CDN, works offline;
//! `dag.js` is the DAG view the VS Code extension bundles too), JSON reads under `/api/` (the DAG
//! laid out by `faces::dagview`, a node's panel, loss curves, comparisons with 95% intervals,
//! budget and lock-in over time, the audit summary), `/api/events` (server-sent events, one tick
//! per change of the record, whoever wrote it; at most `MAX_EVENT_STREAMS` open, at most
//! `server.max_streams_per_agent` of one identity, the last `server.owner_reserve` kept for the
//! study owner), and writes only as `POST /api/call/<action>` through `Session::call` under the
//! caller's role — the same validation, policy and recording as every other face.
//!
//! Identity: on loopback without `--tokens` every page is an observer (read-only; writes are
//! refused by the policy and recorded as refusals), and requests must name a loopback host
//! (against DNS rebinding); that page is the study owner's (`Web::identify`: the one the
//! server's reserve of connections and streams is kept for). With `--tokens` a request carries a
//! token: `Authorization: Bearer`, or the cookie a browser gets from the sign-in form
//! (`HttpOnly; SameSite=Strict`); the tokens file's `[owner]` token is the owner. Every POST
//! must come from the page's own origin (`Origin` header), writes must be JSON. Every string an
//! agent wrote is escaped where it is put into HTML and set as text by the page's script; the
//! Content-Security-Policy allows only the page's own script (hashed inline in the static file).
//!
//! Invariant: thin over `os::session`; no record writes of its own, no policy.

pub mod page;

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::faces::dagview::{self, LayoutOptions};
use crate::model::{Caller, Role};
use crate::os::DagOverview;
use crate::os::session::Session;
use crate::util::error::{Error, ErrorKind};

/// Open event streams at most; one more is answered 503.
pub const MAX_EVENT_STREAMS: usize = 1000;
/// Largest body of a write from the page.
pub const MAX_CALL_BODY: usize = 1 << 20;
/// Largest sign-in form.
const MAX_LOGIN_BODY: usize = 4096;
/// Most node ids one request may name (`expand`, `nodes`).
const MAX_IDS: usize = 1000;
/// A job log's tail as the node panel shows it.
const LOG_TAIL_BYTES: u64 = 64 << 10;
/// The cookie that holds a browser's token (hex-encoded).
pub const COOKIE: &str = "rsim_token";
/// Keep-alive comment on an idle event stream.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Who may use the page.
pub enum WebAuth {
    /// Loopback without tokens: every page is this observer, and the study owner's.
    Observer,
    /// Token → caller (the `--tokens` file the MCP face uses; a caller of role owner is the
    /// study owner).
    Tokens(HashMap<String, Caller>),
}

/// Limits on the page's event streams.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// Open at once, all identities together.
    pub max: usize,
    /// Open at once for one identity other than the owner (`server.max_streams_per_agent`).
    pub per_agent: usize,
    /// Of `max`, kept for the study owner (`server.owner_reserve`).
    pub owner_reserve: usize,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits::of(&crate::config::ServerConfig::default())
    }
}

impl StreamLimits {
    /// The limits `[server]` sets.
    pub fn of(server: &crate::config::ServerConfig) -> StreamLimits {
        StreamLimits {
            max: MAX_EVENT_STREAMS,
            per_agent: server.max_streams_per_agent,
            owner_reserve: server.owner_reserve.min(MAX_EVENT_STREAMS - 1),
        }
    }
}

/// The event streams open now, counted per identity.
struct Streams {
    lim: StreamLimits,
    st: Mutex<StreamsState>,
}

#[derive(Default)]
struct StreamsState {
    open: usize,
    by_agent: HashMap<String, usize>,
}

/// One open event stream's place; dropped (its client left), the place is free.
struct StreamPermit {
    streams: Arc<Streams>,
    /// The identity it counts for (none: the owner's).
    agent: Option<String>,
}

impl Streams {
    fn new(lim: StreamLimits) -> Arc<Streams> {
        Arc::new(Streams {
            lim,
            st: Mutex::default(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, StreamsState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for one more stream of `caller`, or the message of the `503` that refuses it.
    fn acquire(self: &Arc<Self>, caller: &Caller, owner: bool) -> Result<StreamPermit, String> {
        let lim = self.lim;
        let mut st = self.state();
        if st.open >= lim.max {
            return Err(format!(
                "the server holds its maximum of {} open event streams; retry shortly",
                lim.max
            ));
        }
        if owner {
            st.open += 1;
            return Ok(StreamPermit {
                streams: self.clone(),
                agent: None,
            });
        }
        if st.open >= lim.max.saturating_sub(lim.owner_reserve) {
            return Err(format!(
                "the last {} event streams (server.owner_reserve) are kept for the study owner; retry shortly",
                lim.owner_reserve
            ));
        }
        let held = st.by_agent.get(&caller.agent).copied().unwrap_or(0);
        if held >= lim.per_agent {
            return Err(format!(
                "agent {:?} holds its maximum of {} open event streams (server.max_streams_per_agent); close a page",
                caller.agent, lim.per_agent
            ));
        }
        st.open += 1;
        *st.by_agent.entry(caller.agent.clone()).or_default() += 1;
        Ok(StreamPermit {
            streams: self.clone(),
            agent: Some(caller.agent.clone()),
        })
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut st = self.streams.state();
        st.open = st.open.saturating_sub(1);
        if let Some(a) = &self.agent
            && let Some(n) = st.by_agent.get_mut(a)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                st.by_agent.remove(a);
            }
        }
    }
}

/// The web face's state.
pub struct Web {
    session: Arc<Session>,
    auth: WebAuth,
    streams: Arc<Streams>,
    tick: tokio::sync::watch::Receiver<u64>,
    /// The overview at a tick: a hundred pages reloading on one change read the index once.
    cache: TickCache<DagOverview>,
    /// The default view's JSON at a tick (what every page asks first).
    layout_cache: TickCache<String>,
    /// `/api/overview`'s JSON: the audit behind it re-hashes every trained dataset, so a page
    /// polling it (or a client flooding it) runs the audit at most once per change of the record
    /// and per `AUDIT_FRESH` (a changed object in the store moves no tick, so the audit is redone
    /// after that long even with no change).
    overview_cache: TickCache<String>,
    study: String,
    /// A fixed DAG instead of the study's (`rsim bench --web`: a made-up DAG of any size).
    fixed: Option<Arc<DagOverview>>,
}

impl Web {
    pub fn new(session: Arc<Session>, auth: WebAuth) -> Arc<Web> {
        Self::with_streams(session, auth, StreamLimits::default())
    }

    pub fn with_streams(session: Arc<Session>, auth: WebAuth, streams: StreamLimits) -> Arc<Web> {
        let tick = session.watch();
        let study = session
            .root()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "study".into());
        Arc::new(Web {
            session,
            auth,
            streams: Streams::new(streams),
            tick,
            cache: TickCache::default(),
            layout_cache: TickCache::default(),
            overview_cache: TickCache::default(),
            study,
            fixed: None,
        })
    }

    /// A page whose DAG is `overview` whatever the study holds (benchmarks only).
    pub fn with_overview(session: Arc<Session>, overview: DagOverview) -> Arc<Web> {
        let tick = session.watch();
        Arc::new(Web {
            session,
            auth: WebAuth::Observer,
            streams: Streams::new(StreamLimits::default()),
            tick,
            cache: TickCache::default(),
            layout_cache: TickCache::default(),
            overview_cache: TickCache::default(),
            study: format!("synthetic DAG of {} nodes", overview.nodes.len()),
            fixed: Some(Arc::new(overview)),
        })
    }

    /// Event streams open now.
    pub fn open_streams(&self) -> usize {
        self.streams.state().open
    }

    /// Who a request is (none: no valid token), and whether that is the study owner: the
    /// tokens file's `[owner]` token, or on loopback without tokens every page.
    pub fn identify(&self, headers: &HeaderMap) -> Option<(Caller, bool)> {
        let caller = self.caller(headers)?;
        let owner = self.is_owner(&caller);
        Some((caller, owner))
    }

    fn is_owner(&self, caller: &Caller) -> bool {
        matches!(self.auth, WebAuth::Observer) || caller.role == Role::Owner
    }

    fn caller(&self, headers: &HeaderMap) -> Option<Caller> {
        match &self.auth {
            WebAuth::Observer => Some(Caller::new("web", Role::Observer)),
            WebAuth::Tokens(map) => {
                let bearer = headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|s| s.strip_prefix("Bearer "))
                    .map(|s| s.trim().to_string());
                let token = bearer.or_else(|| cookie_token(headers))?;
                map.get(&token).cloned()
            }
        }
    }

    fn overview(&self) -> crate::util::error::Result<Arc<DagOverview>> {
        if let Some(o) = &self.fixed {
            return Ok(o.clone());
        }
        self.cache.get_or_make(*self.tick.borrow(), None, || {
            self.session.with(|s| s.dag_overview(None))
        })
    }
}

/// How long `/api/overview`'s audit is served from the cache when the record has not changed.
const AUDIT_FRESH: std::time::Duration = std::time::Duration::from_secs(30);

/// A value made at most once per record tick (and, if given, per age): its lock is held while
/// it is made, so requests that arrive meanwhile wait for that one making rather than each
/// doing it again. It counts the makings.
struct TickCache<T> {
    slot: Mutex<Option<(u64, std::time::Instant, Arc<T>)>>,
    made: std::sync::atomic::AtomicU64,
}

impl<T> Default for TickCache<T> {
    fn default() -> Self {
        TickCache {
            slot: Mutex::new(None),
            made: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl<T> TickCache<T> {
    fn get_or_make(
        &self,
        tick: u64,
        max_age: Option<std::time::Duration>,
        make: impl FnOnce() -> crate::util::error::Result<T>,
    ) -> crate::util::error::Result<Arc<T>> {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((t, at, v)) = slot.as_ref()
            && *t == tick
            && max_age.is_none_or(|m| at.elapsed() < m)
        {
            return Ok(v.clone());
        }
        let v = Arc::new(make()?);
        self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *slot = Some((tick, std::time::Instant::now(), v.clone()));
        Ok(v)
    }
}

impl Web {
    /// `/api/overview` (budget, lock-in, the audit in counts) as JSON.
    fn overview_json(&self) -> crate::util::error::Result<Arc<String>> {
        self.overview_cache
            .get_or_make(*self.tick.borrow(), Some(AUDIT_FRESH), || {
                Ok(serde_json::to_string(
                    &self.session.with(page::overview_data)?,
                )?)
            })
    }

    /// How many times `/api/overview` has been made (the audit run) since the page started.
    pub fn overviews_made(&self) -> u64 {
        self.overview_cache
            .made
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A JSON text already made, or the error that stopped it.
fn json_text(r: crate::util::error::Result<Arc<String>>) -> Response {
    match r {
        Ok(j) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
            j.as_str().to_owned(),
        )
            .into_response(),
        Err(e) => from_error(&e),
    }
}

/// Serve the page alone at `addr` over a made-up DAG of `n` nodes in place of the study's at
/// `root` (the layout and everything after it run as for a real study) until interrupted by
/// Ctrl-C or SIGTERM: what `rsim bench --web N` times in Chromium (`tools/web-bench.sh`).
pub fn serve_made_up(
    root: &std::path::Path,
    n: usize,
    addr: &str,
) -> crate::util::error::Result<()> {
    use crate::util::error::Error;
    let session = Arc::new(Session::open(root)?);
    let web = Web::with_overview(session, dagview::synthetic(n, 1));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::internal(format!("cannot start a runtime: {e}")))?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Error::invalid(format!("--http {addr}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::internal(e.to_string()))?;
        eprintln!("rsim: a made-up DAG of {n} nodes (benchmark)");
        eprintln!("rsim: the web page is at http://{local}/");
        axum::serve(listener, router(web))
            .with_graceful_shutdown(crate::util::proc::shutdown_signal())
            .await
            .map_err(|e| Error::internal(e.to_string()))
    })
}

/// The web routes, to merge beside `/mcp`.
pub fn router(web: Arc<Web>) -> axum::Router {
    use axum::routing::any;
    axum::Router::new()
        .route("/", any(handle))
        .route("/login", any(handle))
        .route("/logout", any(handle))
        .route("/assets/{*rest}", any(handle))
        .route("/api/{*rest}", any(handle))
        .with_state(web)
}

/// The token in the request's cookie, if any (hex-encoded there).
fn cookie_token(headers: &HeaderMap) -> Option<String> {
    for v in headers.get_all(header::COOKIE) {
        let Ok(s) = v.to_str() else { continue };
        for part in s.split(';') {
            if let Some(val) = part
                .trim()
                .strip_prefix(COOKIE)
                .and_then(|r| r.strip_prefix('='))
            {
                let bytes = hex::decode(val.trim()).ok()?;
                return String::from_utf8(bytes).ok();
            }
        }
    }
    None
}

/// Security headers every answer of the web face carries.
fn secure(mut r: Response, csp: &str) -> Response {
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(csp) {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        // Not no-referrer: under it a browser sends `Origin: null` with a form POST, and the
        // sign-in form could not prove where it came from.
        HeaderValue::from_static("same-origin"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    r
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        v.to_string(),
    )
        .into_response()
}

fn error_response(status: StatusCode, msg: &str) -> Response {
    json_response(status, &json!({ "error": msg }))
}

fn status_of(e: &Error) -> StatusCode {
    match e.kind {
        ErrorKind::Invalid => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Rejected | ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn from_error(e: &Error) -> Response {
    let mut v = json!({ "error": e.message, "kind": e.kind });
    if let Some(r) = &e.rule {
        v["rule"] = json!(r);
    }
    json_response(status_of(e), &v)
}

/// The host part of a Host header (without the port; IPv6 brackets kept off).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

fn loopback_host(host: &str) -> bool {
    let h = host_name(host);
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A POST must come from this page: its `Origin` names the host the request was sent to.
fn same_origin(headers: &HeaderMap) -> bool {
    let (Some(origin), Some(host)) = (
        headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()),
        headers.get(header::HOST).and_then(|v| v.to_str().ok()),
    ) else {
        return false;
    };
    origin == format!("http://{host}") || origin == format!("https://{host}")
}

/// A node id as the record writes them (`n` and a number); anything else is refused before a
/// lookup.
pub fn node_id(s: &str) -> Option<&str> {
    let digits = s.strip_prefix('n')?;
    (!digits.is_empty()
        && digits.len() <= 9
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0')))
    .then_some(s)
}

/// A job id: letters, digits, '-' and '_' (never a path).
fn job_id(s: &str) -> Option<&str> {
    (!s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
    .then_some(s)
}

/// `key=value` pairs of a query string, percent-decoded.
fn query(q: Option<&str>) -> HashMap<String, String> {
    q.unwrap_or("")
        .split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            Some((percent_decode(k)?, percent_decode(v)?))
        })
        .collect()
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// A comma-separated list of node ids from the query; an id that is not one is an error
/// (its message).
fn id_list(q: &HashMap<String, String>, key: &str) -> Result<Vec<String>, String> {
    let Some(v) = q.get(key).filter(|v| !v.is_empty()) else {
        return Ok(Vec::new());
    };
    let ids: Vec<&str> = v.split(',').collect();
    if ids.len() > MAX_IDS {
        return Err(format!("{key}: at most {MAX_IDS} node ids"));
    }
    ids.into_iter()
        .map(|s| {
            node_id(s)
                .map(str::to_string)
                .ok_or_else(|| format!("{key}: {:?} is not a node id (n0, n1, ...)", clip(s)))
        })
        .collect()
}

fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

async fn handle(State(w): State<Arc<Web>>, req: Request) -> Response {
    let csp = page::CSP;
    secure(route(w, req).await, csp)
}

async fn route(w: Arc<Web>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let method = parts.method.clone();
    let headers = parts.headers;
    if matches!(w.auth, WebAuth::Observer) {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !loopback_host(host) {
            return error_response(
                StatusCode::FORBIDDEN,
                "this server listens on loopback: use http://127.0.0.1:PORT/ or http://localhost:PORT/",
            );
        }
    }
    let get = method == Method::GET || method == Method::HEAD;
    if let Some(name) = path.strip_prefix("/assets/") {
        if !get {
            return error_response(StatusCode::METHOD_NOT_ALLOWED, "assets: GET only");
        }
        return match page::asset(name) {
            Some((ctype, body)) => {
                let mut r = (StatusCode::OK, [(header::CONTENT_TYPE, ctype)], body).into_response();
                r.headers_mut()
                    .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                r
            }
            None => (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
        };
    }
    let caller = w.caller(&headers);
    match (path.as_str(), get) {
        ("/", true) => {
            let html = match &caller {
                Some(_) => page::served_page(&w.study),
                None => page::sign_in(None),
            };
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                html,
            )
                .into_response()
        }
        ("/login", false) if method == Method::POST => login(&w, &headers, body).await,
        ("/logout", false) if method == Method::POST => {
            if !same_origin(&headers) {
                return error_response(StatusCode::FORBIDDEN, "cross-origin request refused");
            }
            let mut r = StatusCode::SEE_OTHER.into_response();
            r.headers_mut()
                .insert(header::LOCATION, HeaderValue::from_static("/"));
            r.headers_mut().insert(
                header::SET_COOKIE,
                HeaderValue::from_static(
                    "rsim_token=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
                ),
            );
            r
        }
        ("/login" | "/logout" | "/", _) => {
            error_response(StatusCode::METHOD_NOT_ALLOWED, "method not allowed here")
        }
        (p, _) if p.starts_with("/api/") => {
            let Some(caller) = caller else {
                return error_response(
                    StatusCode::UNAUTHORIZED,
                    "sign in with your token (the page at /) or send `Authorization: Bearer <token>`",
                );
            };
            api(w, caller, &method, p, parts.uri.query(), &headers, body).await
        }
        _ => (StatusCode::NOT_FOUND, "not found\n").into_response(),
    }
}

async fn login(w: &Web, headers: &HeaderMap, body: Body) -> Response {
    let html = |status: StatusCode, msg: &str| {
        (
            status,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            page::sign_in(Some(msg)),
        )
            .into_response()
    };
    if !same_origin(headers) {
        return html(
            StatusCode::FORBIDDEN,
            "Sign-in refused: the form must be sent from this page.",
        );
    }
    let WebAuth::Tokens(map) = &w.auth else {
        return html(
            StatusCode::BAD_REQUEST,
            "This server has no tokens: every page is a read-only observer.",
        );
    };
    let Ok(bytes) = axum::body::to_bytes(body, MAX_LOGIN_BODY).await else {
        return html(StatusCode::PAYLOAD_TOO_LARGE, "Sign-in form too large.");
    };
    let form = query(std::str::from_utf8(&bytes).ok());
    let token = form.get("token").map(|t| t.trim()).unwrap_or("");
    if token.is_empty() || !map.contains_key(token) {
        // A wrong token costs its sender a pause (tokens are 16+ characters; this only slows a
        // guesser on one connection further).
        tokio::time::sleep(Duration::from_millis(250)).await;
        return html(StatusCode::UNAUTHORIZED, "That token is not valid.");
    }
    let cookie = format!(
        "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age=86400",
        hex::encode(token)
    );
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static("/"));
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// Run a blocking read on the session off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::util::error::Result<T> + Send + 'static,
) -> crate::util::error::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal(format!("a worker thread failed: {e}")))?
}

fn ok_json<T: serde::Serialize>(r: crate::util::error::Result<T>) -> Response {
    match r.and_then(|v| Ok(serde_json::to_value(v)?)) {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => from_error(&e),
    }
}

async fn api(
    w: Arc<Web>,
    caller: Caller,
    method: &Method,
    path: &str,
    q: Option<&str>,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let rest = &path["/api/".len()..];
    if let Some(action) = rest.strip_prefix("call/") {
        if method != Method::POST {
            return error_response(StatusCode::METHOD_NOT_ALLOWED, "call: POST only");
        }
        return call(w, caller, action, headers, body).await;
    }
    if method != Method::GET && method != Method::HEAD {
        return error_response(StatusCode::METHOD_NOT_ALLOWED, "GET only");
    }
    let q = query(q);
    let s = w.session.clone();
    match rest {
        "me" => json_response(
            StatusCode::OK,
            &json!({
                "agent": caller.agent,
                "role": caller.role,
                "can_write": caller.role != Role::Observer,
                "tokens": matches!(w.auth, WebAuth::Tokens(_)),
                "study": w.study,
            }),
        ),
        "dag" => {
            let expand = match id_list(&q, "expand") {
                Ok(v) => v,
                Err(m) => return error_response(StatusCode::BAD_REQUEST, &m),
            };
            let w2 = w.clone();
            json_text(
                blocking(move || {
                    let layout = |o: &DagOverview| -> crate::util::error::Result<String> {
                        let opts = LayoutOptions {
                            expand: expand.iter().cloned().collect::<HashSet<_>>(),
                            ..Default::default()
                        };
                        Ok(serde_json::to_string(&dagview::layout(o, &opts))?)
                    };
                    if expand.is_empty() {
                        let tick = *w2.tick.borrow();
                        w2.layout_cache
                            .get_or_make(tick, None, || layout(&*w2.overview()?))
                    } else {
                        Ok(Arc::new(layout(&*w2.overview()?)?))
                    }
                })
                .await,
            )
        }
        "overview" => {
            let w2 = w.clone();
            json_text(blocking(move || w2.overview_json()).await)
        }
        "compare" => {
            let nodes = match id_list(&q, "nodes") {
                Ok(v) => v,
                Err(m) => return error_response(StatusCode::BAD_REQUEST, &m),
            };
            ok_json(blocking(move || s.with(|st| st.compare_nodes(&nodes, None))).await)
        }
        r if r.starts_with("node/") => {
            let Some(id) = node_id(&r["node/".len()..]).map(str::to_string) else {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "{:?} is not a node id (n0, n1, ...)",
                        clip(&r["node/".len()..])
                    ),
                );
            };
            ok_json(blocking(move || s.with(|st| page::node_panel(st, &caller, &id))).await)
        }
        r if r.starts_with("log/") => {
            let Some(id) = job_id(&r["log/".len()..]).map(str::to_string) else {
                return error_response(StatusCode::BAD_REQUEST, "not a job id");
            };
            ok_json(
                blocking(move || {
                    let running = s.job_progress(&id);
                    let log = s.with(|st| st.job_log(&id, LOG_TAIL_BYTES))?;
                    Ok(json!({ "job": id, "log": log, "progress": running.map(|p| p.line) }))
                })
                .await,
            )
        }
        "events" => events(w, &caller),
        _ => error_response(StatusCode::NOT_FOUND, "no such API path"),
    }
}

/// A write from the page: the same action any face runs, under the caller's role.
async fn call(
    w: Arc<Web>,
    caller: Caller,
    action: &str,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    // A cookie is sent by the browser on its own: a write must prove it comes from this page.
    if !same_origin(headers) {
        return error_response(
            StatusCode::FORBIDDEN,
            "cross-origin write refused (the Origin header must name this server)",
        );
    }
    let json_ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| {
            c.split(';')
                .next()
                .is_some_and(|m| m.trim() == "application/json")
        });
    if !json_ct {
        return error_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a write is a JSON body (Content-Type: application/json)",
        );
    }
    let action = action.to_string();
    if crate::api::schema::spec(&action).is_none() {
        return error_response(
            StatusCode::NOT_FOUND,
            &format!("no action {:?}", clip(&action)),
        );
    }
    let bytes = match axum::body::to_bytes(body, MAX_CALL_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("a write's body is at most {MAX_CALL_BODY} bytes"),
            );
        }
    };
    let args: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return error_response(StatusCode::BAD_REQUEST, &format!("body: not JSON: {e}"));
        }
    };
    let s = w.session.clone();
    ok_json(blocking(move || s.call(&caller, &action, args)).await)
}

/// A body that yields what a channel receives; dropped (the client went away) → the sender
/// sees it closed.
struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl futures_core::Stream for ChannelBody {
    type Item = std::result::Result<Bytes, Infallible>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|o| o.map(Ok))
    }
}

/// `GET /api/events`: `event: change` with the record's tick whenever it changes. Bounded: past
/// `MAX_EVENT_STREAMS` open ones, past `max_streams_per_agent` of the caller's, or into the
/// owner's reserve when the caller is not the owner, 503 naming the limit. A stream whose client
/// left ends at its next write (a change or the 15 s keep-alive) and frees its place.
fn events(w: Arc<Web>, caller: &Caller) -> Response {
    let owner = w.is_owner(caller);
    let permit = match w.streams.acquire(caller, owner) {
        Ok(p) => p,
        Err(msg) => {
            tracing::debug!(agent = %caller.agent, "event stream refused: {msg}");
            let mut r = error_response(StatusCode::SERVICE_UNAVAILABLE, &msg);
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            return r;
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let mut tick = w.tick.clone();
    tokio::spawn(async move {
        let _permit = permit;
        let first = format!("retry: 3000\nevent: change\ndata: {}\n\n", *tick.borrow());
        if tx.send(Bytes::from(first)).await.is_err() {
            return;
        }
        loop {
            let msg = tokio::select! {
                changed = tick.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    format!("event: change\ndata: {}\n\n", *tick.borrow_and_update())
                }
                _ = tokio::time::sleep(KEEP_ALIVE) => ": keep-alive\n\n".to_string(),
                _ = tx.closed() => return,
            };
            if tx.send(Bytes::from(msg)).await.is_err() {
                return;
            }
        }
    });
    let mut r = Response::new(Body::from_stream(ChannelBody(rx)));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_checked_before_any_lookup() {
        assert_eq!(node_id("n0"), Some("n0"));
        assert_eq!(node_id("n12"), Some("n12"));
        for bad in [
            "",
            "n",
            "n01",
            "../n1",
            "n1/../..",
            "n1%2f",
            "x1",
            "n-1",
            "n1234567890",
            "n1 ",
        ] {
            assert_eq!(node_id(bad), None, "{bad:?}");
        }
        assert_eq!(job_id("../../etc/passwd"), None);
        assert_eq!(job_id("j-1_a"), Some("j-1_a"));
    }

    #[test]
    fn hosts_and_origins() {
        assert!(loopback_host("127.0.0.1:8765"));
        assert!(loopback_host("localhost:1"));
        assert!(loopback_host("[::1]:80"));
        assert!(!loopback_host("evil.example:8765"));
        assert!(!loopback_host("127.0.0.1.evil.example"));
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:9"));
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("http://evil:9"));
        assert!(!same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:9"),
        );
        assert!(same_origin(&h));
    }

    #[test]
    fn query_and_cookie_parsing() {
        let q = query(Some("expand=n1%2Cn2&x=a+b&bad=%zz"));
        assert_eq!(q.get("expand").map(String::as_str), Some("n1,n2"));
        assert_eq!(q.get("x").map(String::as_str), Some("a b"));
        assert!(!q.contains_key("bad"));
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("a=b; {COOKIE}={}", hex::encode("tok;en=1")))
                .expect("header"),
        );
        assert_eq!(cookie_token(&h).as_deref(), Some("tok;en=1"));
        h.insert(header::COOKIE, HeaderValue::from_static("rsim_token=zz"));
        assert_eq!(cookie_token(&h), None);
    }
}
