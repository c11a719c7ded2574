//! `rsim serve --http ADDR`: the MCP face over streamable HTTP at `/mcp`, many agents at once.
//!
//! Identity: on a loopback address every request gets `--role` and the agent name from the
//! `X-Rsim-Agent` header, one of the names `--agents` allows; without it, the server's default
//! name, which every client that sends none shares — its limits included (its write rate, its
//! connections), so a loopback server for several agents lists them. Any other address needs `--tokens`:
//! a TOML file of `[[agent]] name, role, token`; each request's bearer token picks its agent and
//! role, and a missing or unknown token is answered 401. rmcp answers oversized bodies with 413 and
//! malformed JSON-RPC with an error; the server keeps serving.
//!
//! The study owner: the tokens file may hold an `[owner]` token, which signs in to the web page
//! as the owner (never to `/mcp`: agents use their own tokens); on loopback without tokens the
//! web page is the owner's. Connections are admitted twice (`limits::Conns`): at accept, per
//! remote address and against `max_connections`, before a byte is read; then each request, once
//! its headers say whose it is, per agent identity and against the owner's reserve.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde::Deserialize;

use super::{Options, Server, Shared, limits};
use crate::model::{Caller, Role};
use crate::util::error::{Error, IoContext, Result};

/// Largest request body accepted (inline datasets are the big ones); larger → 413.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// Header naming the agent on a loopback server without tokens.
pub const AGENT_HEADER: &str = "x-rsim-agent";

#[derive(Debug, Clone)]
pub struct HttpOptions {
    pub addr: String,
    pub tokens: Option<PathBuf>,
    /// Role of every connection on a loopback server without tokens.
    pub role: Role,
    /// Loopback without tokens: the identity of every connection that names none.
    pub agent: String,
    /// Loopback without tokens: the names `X-Rsim-Agent` may claim (the owner's list; empty:
    /// none, every connection is `agent`). An identity is what the owner allowed, never what a
    /// header claims: a connection that could rename itself would start its per-agent
    /// allowances (evaluations, compute, the contamination-probing limit) again.
    pub agents: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    agent: Vec<TokenEntry>,
    /// The study owner's token: the web page signs in with it as the owner.
    owner: Option<OwnerEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OwnerEntry {
    token: String,
}

/// The tokens file: agents' tokens, and the owner's if it names one.
#[derive(Debug, Clone)]
struct Tokens {
    agents: HashMap<String, Caller>,
    owner: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    role: String,
    token: String,
}

/// Who may connect.
enum Auth {
    /// Loopback without tokens: everyone gets this role, and the default name or one of the
    /// names the owner allowed.
    Loopback {
        role: Role,
        default: String,
        allowed: std::collections::BTreeSet<String>,
    },
    /// Bearer token → caller (the owner's token is refused at `/mcp`).
    Tokens(Tokens),
}

/// Roles an MCP connection may have (the owner works at the terminal).
pub fn agent_role(s: &str) -> Result<Role> {
    match Role::parse(s) {
        Some(r @ (Role::Worker | Role::Reviewer | Role::Observer)) => Ok(r),
        _ => Err(Error::invalid(format!(
            "role: {s:?} is not an agent role (worker, reviewer, observer)"
        ))),
    }
}

fn load_tokens(path: &Path) -> Result<Tokens> {
    let text = std::fs::read_to_string(path).at("cannot read tokens file", path)?;
    let file: TokensFile =
        toml::from_str(&text).map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
    let mut out = HashMap::new();
    for (i, a) in file.agent.iter().enumerate() {
        let at = format!("{}: agent[{i}] ({})", path.display(), a.name);
        let role = agent_role(&a.role).map_err(|e| e.context(&at))?;
        if a.token.len() < 16 {
            return Err(Error::invalid(format!(
                "{at}: token: use at least 16 characters"
            )));
        }
        if a.name.is_empty()
            || a.name.len() > 64
            || a.name.chars().any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(Error::invalid(format!(
                "{at}: name: 1-64 characters without spaces"
            )));
        }
        if out
            .insert(a.token.clone(), Caller::new(a.name.clone(), role))
            .is_some()
        {
            return Err(Error::invalid(format!(
                "{at}: token: the same token is given to two agents"
            )));
        }
    }
    if out.is_empty() {
        return Err(Error::invalid(format!(
            "{}: no [[agent]] entries (name, role, token)",
            path.display()
        )));
    }
    let owner = match file.owner {
        Some(o) => {
            let at = format!("{}: owner", path.display());
            if o.token.len() < 16 {
                return Err(Error::invalid(format!(
                    "{at}: token: use at least 16 characters"
                )));
            }
            if out.contains_key(&o.token) {
                return Err(Error::invalid(format!(
                    "{at}: token: the same token is given to an agent"
                )));
            }
            Some(o.token)
        }
        None => None,
    };
    Ok(Tokens { agents: out, owner })
}

impl Tokens {
    /// What the web page signs in with: every agent's token, and the owner's as the owner.
    fn for_web(&self) -> HashMap<String, Caller> {
        let mut map = self.agents.clone();
        if let Some(t) = &self.owner {
            map.insert(t.clone(), Caller::owner());
        }
        map
    }
}

impl Auth {
    fn caller(&self, headers: &HeaderMap) -> std::result::Result<Caller, String> {
        match self {
            Auth::Loopback {
                role,
                default,
                allowed,
            } => {
                let named = headers
                    .get(AGENT_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::trim)
                    .filter(|s| !s.is_empty());
                match named {
                    None => Ok(Caller::new(default.clone(), *role)),
                    Some(a) if allowed.contains(a) => Ok(Caller::new(a, *role)),
                    Some(a) => Err(format!(
                        "X-Rsim-Agent {a:?} is not an agent this server allows: the study owner lists the names with `rsim serve --agents NAME,...` (or issues tokens with --tokens); without the header a connection is {default:?}"
                    )),
                }
            }
            Auth::Tokens(tokens) => {
                let Some(v) = headers.get(header::AUTHORIZATION) else {
                    return Err("missing bearer token: send `Authorization: Bearer <token>` (tokens are issued in the server's --tokens file)".into());
                };
                let token = v
                    .to_str()
                    .ok()
                    .and_then(|s| {
                        s.strip_prefix("Bearer ")
                            .or_else(|| s.strip_prefix("bearer "))
                    })
                    .map(str::trim)
                    .ok_or("malformed Authorization header: expected `Bearer <token>`")?;
                if tokens.owner.as_deref() == Some(token) {
                    return Err("the owner token signs in to the web page (/); agents connect to /mcp with the tokens the owner issued them".into());
                }
                tokens
                    .agents
                    .get(token)
                    .cloned()
                    .ok_or_else(|| "invalid bearer token".to_string())
            }
        }
    }
}

/// A POST's body is read whole (at most `MAX_BODY_BYTES`, as rmcp would) and checked as the
/// stdio face checks a line (`stdio::check`: strict JSON of at most `stdio::MAX_VALUES` values)
/// before rmcp decodes it: decoded, each value costs some hundred bytes whatever its size in the
/// body, so a body of tiny values cost a hundred times its size. A body that fails is answered
/// 400 with a JSON-RPC parse error naming why.
async fn check_body(req: Request, next: Next) -> Response {
    if req.method() != axum::http::Method::POST {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                [(header::CONTENT_TYPE, "application/json")],
                limits::rpc_error(
                    -32700,
                    &format!("Parse error: the request is longer than {MAX_BODY_BYTES} bytes"),
                ),
            )
                .into_response();
        }
    };
    let checked = bytes.clone();
    let verdict = tokio::task::spawn_blocking(move || super::stdio::check(&checked))
        .await
        .unwrap_or_else(|e| Err(format!("the check failed: {e}")));
    if let Err(why) = verdict {
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            limits::rpc_error(-32700, &format!("Parse error: {why}")),
        )
            .into_response();
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

async fn authenticate(State(auth): State<Arc<Auth>>, mut req: Request, next: Next) -> Response {
    match auth.caller(req.headers()) {
        Ok(c) => {
            req.extensions_mut().insert(c);
            next.run(req).await
        }
        Err(msg) => (
            StatusCode::UNAUTHORIZED,
            [
                (header::WWW_AUTHENTICATE, "Bearer realm=\"rsim\""),
                (header::CONTENT_TYPE, "application/json"),
            ],
            limits::rpc_error(-32001, &msg),
        )
            .into_response(),
    }
}

async fn not_found(uri: axum::http::Uri) -> Response {
    let path = uri.path();
    let text = if path.starts_with("/.well-known/oauth") || path == "/register" {
        "rsim has no OAuth: send the bearer token the study owner issued you (`Authorization: Bearer <token>`, from the server's --tokens file) with every request to /mcp\n"
    } else {
        "rsim serves MCP at /mcp (streamable HTTP) and the web page at /\n"
    };
    (StatusCode::NOT_FOUND, text).into_response()
}

/// Run the HTTP server until interrupted (SIGINT/SIGTERM). Jobs still running then are waited for
/// and recorded before the process exits.
pub fn serve(study: &Path, http: HttpOptions, opts: Options) -> Result<()> {
    let rt = super::runtime()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&http.addr)
            .await
            .map_err(|e| Error::invalid(format!("--http {}: cannot bind: {e}", http.addr)))?;
        let local: SocketAddr = listener
            .local_addr()
            .map_err(|e| Error::internal(format!("cannot read the bound address: {e}")))?;
        let loopback = local.ip().is_loopback();
        let tokens = match &http.tokens {
            Some(p) => Some(load_tokens(p)?),
            None => None,
        };
        let auth = match &tokens {
            Some(t) => Auth::Tokens(t.clone()),
            None if loopback => Auth::Loopback {
                role: http.role,
                default: http.agent.clone(),
                allowed: http.agents.iter().cloned().collect(),
            },
            None => {
                return Err(Error::invalid(format!(
                    "--http {}: refusing to serve a non-loopback address without --tokens FILE (bearer tokens per agent)",
                    http.addr
                )));
            }
        };
        let shared: Arc<Shared> = Shared::open(study, opts)?;
        let lim = shared.server_limits()?;
        let fd_limit = limits::raise_fd_limit();
        let max_connections = limits::connection_limit(lim.max_connections, fd_limit);
        if max_connections < lim.max_connections {
            eprintln!(
                "rsim: serving at most {max_connections} connections (server.max_connections = {}), what the file-descriptor limit of {fd_limit} leaves after {} for the study",
                lim.max_connections,
                limits::FD_RESERVE
            );
        }
        let owner_reserve = lim.owner_reserve.min(max_connections - 1);
        if owner_reserve < lim.owner_reserve {
            eprintln!(
                "rsim: keeping {owner_reserve} connections for the owner (server.owner_reserve = {}), what {max_connections} connections allow",
                lim.owner_reserve
            );
        }
        let mut config = StreamableHttpServerConfig::default()
            .with_max_request_body_bytes(MAX_BODY_BYTES)
            .with_sse_keep_alive(Some(std::time::Duration::from_secs(15)));
        if !loopback {
            // Bearer tokens authenticate every request; Host checks (against DNS rebinding of
            // local servers) would only refuse legitimate remote names.
            config = config.disable_allowed_hosts();
        }
        let server_ct = config.cancellation_token.clone();
        let sh = shared.clone();
        let sessions: limits::Sessions = Arc::new(limits::BoundedSessions::new(
            lim.max_sessions,
            Duration::from_secs(lim.session_idle_s),
        ));
        let service = StreamableHttpService::new(
            move || Ok(Server::new(sh.clone(), None)),
            sessions.clone(),
            config,
        );
        let session_limits = Arc::new(SessionLimits {
            sessions,
            agents: Arc::new(limits::AgentSessions::default()),
            per_agent: lim.max_sessions_per_agent,
        });
        // Only /mcp is authenticated: OAuth discovery (`/.well-known/oauth-*`, `/register`) and
        // every other path get a plain 404, so a host without a token reports the 401's reason
        // instead of failing to parse a JSON-RPC error as OAuth metadata.
        // The web page beside /mcp: the same session, the same tokens (on loopback without
        // tokens every page is a read-only observer).
        let web = crate::faces::web::Web::with_streams(
            shared.session(),
            match &tokens {
                Some(t) => crate::faces::web::WebAuth::Tokens(t.for_web()),
                None => crate::faces::web::WebAuth::Observer,
            },
            crate::faces::web::StreamLimits::of(&lim),
        );
        let auth = Arc::new(auth);
        let identities = Arc::new(Identities {
            auth: auth.clone(),
            web: web.clone(),
        });
        let app = axum::Router::new()
            .route_service("/mcp", service)
            .route_layer(middleware::from_fn(check_body))
            .route_layer(middleware::from_fn(super::priming::strip_for_old_clients))
            .route_layer(middleware::from_fn_with_state(session_limits, limit_sessions))
            .route_layer(middleware::from_fn_with_state(auth, authenticate))
            .merge(crate::faces::web::router(web))
            .fallback(not_found)
            .layer(middleware::from_fn_with_state(identities, admit_request));
        eprintln!("rsim: listening on http://{local}/mcp");
        eprintln!("rsim: the web page is at http://{local}/");
        tracing::info!(%local, study = %shared.root().display(), "serving MCP over HTTP");
        accept_loop(
            listener,
            app,
            Accept {
                conns: limits::Conns::new(limits::ConnLimits {
                    max_connections,
                    per_address: lim.max_connections_per_address,
                    per_agent: lim.max_connections_per_agent,
                    owner_reserve,
                }),
                idle: Duration::from_secs(lim.idle_timeout_s),
                header: Duration::from_secs(lim.header_timeout_s),
            },
        )
        .await;
        // End the sessions' open streams so the connections can close.
        server_ct.cancel();
        eprintln!("rsim: stopped; recording jobs still running before exit");
        Ok(())
    })
}

/// The accept loop's limits (`[server]`).
struct Accept {
    conns: Arc<limits::Conns>,
    idle: Duration,
    header: Duration,
}

/// Serve connections until SIGINT/SIGTERM, each under the connection limits, the header timeout
/// and the idle timeout; then stop accepting and give open connections 5 s to finish.
async fn accept_loop(listener: tokio::net::TcpListener, app: axum::Router, lim: Accept) {
    use hyper::service::Service as _;
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tokio::io::AsyncWriteExt;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let shutdown = crate::util::proc::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors or a connection reset before accept: keep serving.
                    tracing::warn!("cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let conn = match lim.conns.admit(peer.ip()) {
            Ok(c) => c,
            Err(msg) => {
                tracing::debug!(%peer, "connection refused: {msg}");
                let busy = limits::refusal_response(&msg);
                tokio::spawn(async move {
                    let mut stream = stream;
                    let _ =
                        tokio::time::timeout(Duration::from_secs(2), stream.write_all(&busy)).await;
                    let _ = stream.shutdown().await;
                });
                continue;
            }
        };
        let io = TokioIo::new(limits::Idle::new(stream, lim.idle));
        // Every request carries its connection, to be counted for its identity.
        let handle = conn.handle();
        let app = hyper_util::service::TowerToHyperService::new(app.clone());
        let service =
            hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(handle.clone());
                app.call(req)
            });
        let served = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(lim.header)
            .serve_connection(io, service);
        let served = graceful.watch(served);
        let evicted = conn.evicted();
        tokio::spawn(async move {
            tokio::select! {
                r = served => {
                    if let Err(e) = r {
                        tracing::debug!("connection closed: {e}");
                    }
                }
                // It said nothing, and a newer connection took its place (`limits::Conns`).
                _ = evicted.notified() => tracing::debug!("closed a connection that said nothing for a newer one"),
            }
            drop(conn);
        });
    }
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(Duration::from_secs(5)) => {}
    }
}

/// What tells whose a request is: the MCP face's tokens at `/mcp`, the web page's elsewhere.
struct Identities {
    auth: Arc<Auth>,
    web: Arc<crate::faces::web::Web>,
}

/// Every request, once its headers are read: its connection is counted for its identity
/// (`limits::ConnHandle::admit`); past the identity's connections, or an agent's request on a
/// connection of the owner's reserve, it is answered 503 naming the limit and the connection
/// closed.
async fn admit_request(State(ids): State<Arc<Identities>>, req: Request, next: Next) -> Response {
    let Some(conn) = req.extensions().get::<limits::ConnHandle>().cloned() else {
        return next.run(req).await;
    };
    let mcp = req.uri().path() == "/mcp";
    let who = if mcp {
        ids.auth.caller(req.headers()).ok().map(|c| (c, false))
    } else {
        ids.web.identify(req.headers())
    };
    let admit = match &who {
        None => conn.admit(limits::Who::Anonymous),
        Some((_, true)) => conn.admit(limits::Who::Owner),
        Some((c, false)) => conn.admit(limits::Who::Agent(&c.agent)),
    };
    match admit {
        limits::Admit::Serve => next.run(req).await,
        limits::Admit::ServeThenClose => {
            let mut resp = next.run(req).await;
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            resp
        }
        limits::Admit::Refuse(msg) => {
            tracing::debug!(agent = ?who.as_ref().map(|(c, _)| &c.agent), "request refused: {msg}");
            let body = if mcp {
                limits::rpc_error(-32000, &msg)
            } else {
                serde_json::json!({ "error": msg }).to_string()
            };
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [
                    (header::CONTENT_TYPE, "application/json"),
                    (header::RETRY_AFTER, "5"),
                    (header::CONNECTION, "close"),
                ],
                body,
            )
                .into_response()
        }
    }
}

/// The session limits the middleware enforces (the global bound is also exact in
/// `BoundedSessions` itself).
struct SessionLimits {
    sessions: limits::Sessions,
    agents: Arc<limits::AgentSessions>,
    per_agent: usize,
}

/// A request that may start a session (a POST without `Mcp-Session-Id`) is let through only
/// within the identity's and the server's session limits; otherwise 503 with a JSON-RPC error
/// naming the limit.
async fn limit_sessions(
    State(st): State<Arc<SessionLimits>>,
    req: Request,
    next: Next,
) -> Response {
    let starts_session =
        req.method() == axum::http::Method::POST && !req.headers().contains_key(SESSION_HEADER);
    let agent = req.extensions().get::<Caller>().map(|c| c.agent.clone());
    // A session is its opener's: another identity's request naming it (to close it, fill its
    // places, or cancel its calls) is answered as if it did not exist.
    if let (Some(id), Some(agent)) = (
        req.headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok()),
        &agent,
    ) && st.agents.owner_of(id).is_some_and(|owner| &owner != agent)
    {
        tracing::debug!(agent, "a request named another identity's MCP session");
        return (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "application/json")],
            limits::rpc_error(-32000, "Session not found (it is not this identity's)"),
        )
            .into_response();
    }
    let (true, Some(agent)) = (starts_session, agent) else {
        return next.run(req).await;
    };
    let opening = match st.agents.begin(&agent, st.per_agent, &st.sessions).await {
        Ok(o) => o,
        Err(msg) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [
                    (header::CONTENT_TYPE, "application/json"),
                    (header::RETRY_AFTER, "5"),
                ],
                limits::rpc_error(-32000, &msg),
            )
                .into_response();
        }
    };
    let resp = next.run(req).await;
    let session = resp
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    opening.finish(session);
    resp
}

/// The MCP session header (streamable HTTP).
const SESSION_HEADER: &str = "mcp-session-id";
