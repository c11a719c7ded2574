//! `rsim lsp`: the editor face, a language server over stdio (tower-lsp-server).
//!
//! - `rsim.toml`: diagnostics from the core's own parser and checks (`config::diagnose`), hover
//!   and completion from the config's schema (`config` here).
//! - Node ids (`n12`) in any other document: hover shows the node, go-to-definition opens the
//!   read-only document `rsim://node/n12` (its text: `rsim/nodeDocument`), workspace symbols find
//!   nodes by id or title.
//! - Custom requests the VS Code extension uses (`rsim/…`, see `METHODS`), answered by the core's
//!   queries and OS reads through `os::session`, and the notification `rsim/recordChanged` when
//!   the record changes (`Session::watch`), whoever wrote it.
//! - Owner commands (`workspace/executeCommand`: branch, compare, conclude, cancel a job) are
//!   `Session::call` with the editor user's caller: the same validation, policy and recording as
//!   every other face.
//!
//! Invariant: a thin face. stdout carries only the protocol (logs go to stderr); every read and
//! write goes through `os::session::Session`; nothing here touches git, the index or job
//! directories, or decides policy.

pub mod config;
pub mod text;
pub mod wire;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use serde_json::{Value, json};
use tower_lsp_server::jsonrpc::{Error as RpcError, ErrorCode, Result as RpcResult};
use tower_lsp_server::ls_types::*;
use tower_lsp_server::{Client, LanguageServer, LspService, Server};

use crate::model::Caller;
use crate::os::session::Session;
use crate::util::error::{Error, Result};

/// Documents larger than this are not kept or checked (a clear diagnostic says so).
pub const MAX_DOCUMENT_BYTES: usize = 4 << 20;
/// Open documents kept at once (beyond it, a newly opened document is not kept: no hovers there).
pub const MAX_DOCUMENTS: usize = 256;
/// The longest document URI kept (a longer one is not kept): with the text's and the count's
/// bounds, what open documents hold stays under about 1 GiB whatever the client names them.
pub const MAX_URI_BYTES: usize = 8 << 10;
/// Nodes a workspace-symbol search looks through (beyond it, narrow the query in the DAG view).
const SYMBOL_SCAN_NODES: usize = 20_000;
/// Symbols a search answers with.
const MAX_SYMBOLS: usize = 200;
/// Collapsed nodes one `rsim/dag` request may open.
const MAX_EXPAND: usize = 1000;
/// Nodes of one group the Research view lists (the DAG view shows them all).
const MAX_TREE_NODES: usize = 500;
/// Bytes of a job log a panel shows.
const LOG_TAIL_BYTES: u64 = 64 << 10;

/// The owner commands `workspace/executeCommand` accepts, each an action of the core.
pub const COMMANDS: [(&str, &str); 4] = [
    ("rsim.branch", "branch"),
    ("rsim.compare", "compare"),
    ("rsim.conclude", "conclude"),
    ("rsim.cancelJob", "cancel_job"),
];

/// The custom requests (params: one JSON object).
pub const METHODS: [&str; 9] = [
    "rsim/dag",
    "rsim/node",
    "rsim/nodeDocument",
    "rsim/log",
    "rsim/compare",
    "rsim/jobLog",
    "rsim/jobs",
    "rsim/summary",
    "rsim/status",
];

/// The notification sent when the record changed: `{ "version": n }`.
pub enum RecordChanged {}
impl notification::Notification for RecordChanged {
    type Params = Value;
    const METHOD: &'static str = "rsim/recordChanged";
}

pub struct Options {
    /// The study (from `-C` or `RSIM_STUDY`); else found from the editor's workspace folder.
    pub root: Option<PathBuf>,
    /// Who the editor's user is (owner commands run as this caller).
    pub caller: Caller,
}

struct State {
    client: Client,
    caller: Caller,
    explicit_root: Option<PathBuf>,
    workspace: RwLock<Option<PathBuf>>,
    /// The one session, opened on first use. The lock is held while it opens, so concurrent
    /// first requests (VS Code sends `initialized` and its first queries together) open one
    /// session, not one each: a second one would replace the first and drop its watcher.
    session: Mutex<Option<Arc<Session>>>,
    /// Why there is no session (shown once, returned by every request that needs the study).
    no_study: Mutex<Option<String>>,
    docs: Mutex<HashMap<String, String>>,
    schema: config::Schema,
}

pub struct Backend {
    s: Arc<State>,
}

/// Serve one editor over stdin/stdout until it exits.
pub fn serve_stdio(opts: Options) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(serve(tokio::io::stdin(), tokio::io::stdout(), opts));
    // Blocking reads still in flight (a job log, a long query) are not waited for.
    rt.shutdown_timeout(std::time::Duration::from_millis(200));
    Ok(())
}

/// Serve one editor on `input`/`output` (LSP frames) until it exits or closes its end.
pub async fn serve<R, W>(input: R, output: W, opts: Options)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (service, socket) = service(opts);
    let (to_server, server_in) = tokio::io::duplex(1 << 16);
    let (server_out, from_server) = tokio::io::duplex(1 << 16);
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let writer = tokio::spawn(wire::write_frames(output, rx));
    let reader = tokio::spawn(wire::filter_input(input, to_server, tx.clone()));
    let frames = tokio::spawn(wire::frames_of(from_server, tx));
    Server::new(server_in, server_out, socket)
        .serve(service)
        .await;
    reader.abort();
    let _ = frames.await;
    let _ = writer.await;
}

/// The language service (what `serve_stdio` serves; tests drive it in memory).
pub fn service(opts: Options) -> (LspService<Backend>, tower_lsp_server::ClientSocket) {
    LspService::build(|client| Backend {
        s: Arc::new(State {
            client,
            caller: opts.caller,
            explicit_root: opts.root,
            workspace: RwLock::new(None),
            session: Mutex::new(None),
            no_study: Mutex::new(None),
            docs: Mutex::new(HashMap::new()),
            schema: config::Schema::default(),
        }),
    })
    .custom_method("rsim/dag", Backend::dag)
    .custom_method("rsim/node", Backend::node)
    .custom_method("rsim/nodeDocument", Backend::node_document)
    .custom_method("rsim/log", Backend::log)
    .custom_method("rsim/compare", Backend::compare)
    .custom_method("rsim/jobLog", Backend::job_log)
    .custom_method("rsim/jobs", Backend::jobs)
    .custom_method("rsim/summary", Backend::summary)
    .custom_method("rsim/status", Backend::status)
    .finish()
}

/// The core's error as a JSON-RPC error: its message, and the error itself (kind, rule, the
/// commit recording a rejection) as `data`.
fn rpc_error(e: Error) -> RpcError {
    let code = match e.kind {
        crate::util::error::ErrorKind::Invalid => ErrorCode::InvalidParams,
        _ => ErrorCode::ServerError(-32001),
    };
    RpcError {
        code,
        message: e.message.clone().into(),
        data: serde_json::to_value(&e).ok(),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The study folder for a workspace folder: it or its nearest ancestor holding `.rsim/`.
fn find_study(folder: &Path) -> Option<PathBuf> {
    folder
        .ancestors()
        .find(|d| d.join(crate::os::STATE_DIR).is_dir())
        .map(Path::to_path_buf)
}

/// A request's params as an object (custom requests take one JSON object).
fn object(params: Value) -> RpcResult<serde_json::Map<String, Value>> {
    match params {
        Value::Object(m) => Ok(m),
        Value::Null => Ok(Default::default()),
        other => Err(RpcError::invalid_params(format!(
            "expected an object of parameters, got {}",
            kind_of(&other)
        ))),
    }
}

/// Client text quoted in an error: one line, at most 80 characters.
fn short(s: &str) -> String {
    crate::util::text::sanitize_line(s)
        .chars()
        .take(80)
        .collect()
}

/// Agent-written text in Markdown: deceptive and control characters shown as U+FFFD, and
/// Markdown's and HTML's special characters escaped, so a title cannot become a link or markup.
fn md(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in crate::util::text::display(s).chars() {
        if "\\`*_{}[]()<>#+-.!|~&".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A string parameter, required.
fn string_param(m: &serde_json::Map<String, Value>, key: &str) -> RpcResult<String> {
    m.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| RpcError::invalid_params(format!("`{key}`: expected a string")))
}

impl State {
    /// The session, opening the study on first use (and again after a failure, so a study made
    /// after the editor started is found).
    /// Called on a blocking thread of the runtime (`Backend::blocking`), never on an async one.
    fn session(&self) -> Result<Arc<Session>> {
        let mut slot = lock(&self.session);
        if let Some(s) = slot.as_ref() {
            return Ok(s.clone());
        }
        let root = match &self.explicit_root {
            Some(r) => r.clone(),
            None => {
                let ws = self
                    .workspace
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                match ws.as_deref().and_then(find_study) {
                    Some(r) => r,
                    None => {
                        let msg = match ws {
                            Some(w) => format!(
                                "no rsim study in the workspace ({}): open a study's folder, or set `rsim.studyFolder`",
                                w.display()
                            ),
                            None => "no workspace folder: open a study's folder, or set `rsim.studyFolder`".to_string(),
                        };
                        *lock(&self.no_study) = Some(msg.clone());
                        return Err(Error::not_found(msg));
                    }
                }
            }
        };
        match Session::open(&root) {
            Ok(s) => {
                let s = Arc::new(s);
                self.forward_changes(&s);
                *slot = Some(s.clone());
                *lock(&self.no_study) = None;
                Ok(s)
            }
            Err(e) => {
                let msg = format!("cannot open the study at {}: {}", root.display(), e.message);
                *lock(&self.no_study) = Some(msg.clone());
                Err(Error::new(e.kind, msg))
            }
        }
    }

    /// Send `rsim/recordChanged` to the editor whenever the record changes. Started by whoever
    /// opens the session, before the session serves anything: no action run through it can come
    /// before the watcher's first reading, and so none goes unnotified.
    fn forward_changes(&self, session: &Session) {
        let mut rx = session.watch();
        let client = self.client.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    while rx.changed().await.is_ok() {
                        let v = *rx.borrow_and_update();
                        client
                            .send_notification::<RecordChanged>(json!({ "version": v }))
                            .await;
                    }
                });
            }
            Err(e) => tracing::warn!("record changes will not be sent to the editor: {e}"),
        }
    }
}

impl Backend {
    /// Run `f` on the session, off the async threads (SQLite and git block).
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Session) -> Result<T> + Send + 'static,
    ) -> RpcResult<T> {
        let s = self.s.clone();
        let r = tokio::task::spawn_blocking(move || {
            let session = s.session()?;
            f(&session)
        })
        .await
        .map_err(|e| RpcError {
            code: ErrorCode::InternalError,
            message: format!("the request failed: {e}").into(),
            data: None,
        })?;
        r.map_err(rpc_error)
    }

    /// Open the study now (which starts forwarding its changes), and say so if it cannot be.
    async fn open_study(&self) {
        let s = self.s.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || s.session()).await {
            self.s
                .client
                .show_message(MessageType::WARNING, format!("rsim: {}", e.message))
                .await;
        }
    }

    async fn publish_config(&self, uri: Uri, text: Option<&str>, version: Option<i32>) {
        let diags = match text {
            Some(t) => config::diagnostics(t),
            None => vec![Diagnostic {
                range: Range::default(),
                severity: Some(DiagnosticSeverity::WARNING),
                source: Some("rsim".into()),
                message: format!(
                    "not checked: the document is larger than {} MiB, its URI longer than {} KiB, or {} documents are open",
                    MAX_DOCUMENT_BYTES >> 20,
                    MAX_URI_BYTES >> 10,
                    MAX_DOCUMENTS
                ),
                ..Diagnostic::default()
            }],
        };
        self.s.client.publish_diagnostics(uri, diags, version).await;
    }

    async fn set_document(&self, uri: Uri, text: String, version: i32) {
        let key = uri.as_str().to_string();
        let fits = text.len() <= MAX_DOCUMENT_BYTES && key.len() <= MAX_URI_BYTES;
        {
            let mut docs = lock(&self.s.docs);
            if fits && (docs.len() < MAX_DOCUMENTS || docs.contains_key(&key)) {
                docs.insert(key.clone(), text);
            } else {
                docs.remove(&key);
            }
        }
        if config::is_config_uri(&key) {
            let t = fits
                .then(|| lock(&self.s.docs).get(&key).cloned())
                .flatten();
            self.publish_config(uri, t.as_deref(), Some(version)).await;
        }
    }

    fn document(&self, uri: &Uri) -> Option<String> {
        lock(&self.s.docs).get(uri.as_str()).cloned()
    }

    // ------------------------------------------------------------ custom requests

    /// `rsim/dag` {expand?: [node ids], max_nodes?}: the DAG laid out for the shared renderer
    /// (`faces::dagview`, the web page's layout): summarised past `max_nodes`, the best path and
    /// the frontier always drawn, collapsed subtrees opened by naming them in `expand`.
    async fn dag(&self, params: Value) -> RpcResult<Value> {
        let m = object(params)?;
        let mut opts = crate::faces::dagview::LayoutOptions::default();
        match m.get("expand") {
            None | Some(Value::Null) => {}
            Some(Value::Array(ids)) if ids.len() <= MAX_EXPAND => {
                for id in ids {
                    match id.as_str() {
                        Some(i) if text::is_node_id(i) => {
                            opts.expand.insert(i.to_string());
                        }
                        _ => {
                            return Err(RpcError::invalid_params(
                                "`expand`: expected node ids (n0, n12, …)",
                            ));
                        }
                    }
                }
            }
            Some(_) => {
                return Err(RpcError::invalid_params(format!(
                    "`expand`: expected a list of at most {MAX_EXPAND} node ids"
                )));
            }
        }
        if let Some(v) = m.get("max_nodes") {
            let n = v
                .as_u64()
                .filter(|n| (1..=200_000).contains(n))
                .ok_or_else(|| RpcError::invalid_params("`max_nodes`: expected 1 to 200000"))?;
            opts.max_nodes = n as usize;
        }
        self.blocking(move |s| {
            let o = s.with(|st| st.dag_overview(None))?;
            Ok(serde_json::to_value(crate::faces::dagview::layout(
                &o, &opts,
            ))?)
        })
        .await
    }

    /// `rsim/node` {node}: the node, its card (score, verdict) and each run's training curve.
    async fn node(&self, params: Value) -> RpcResult<Value> {
        let m = object(params)?;
        let id = string_param(&m, "node")?;
        let caller = self.s.caller.clone();
        self.blocking(move |s| node_panel(s, &caller, &id)).await
    }

    /// `rsim/nodeDocument` {uri: "rsim://node/n12"}: the node's read-only document (Markdown).
    async fn node_document(&self, params: Value) -> RpcResult<Value> {
        let m = object(params)?;
        let uri = string_param(&m, "uri")?;
        let id = text::node_of_uri(&uri)
            .ok_or_else(|| {
                RpcError::invalid_params(format!(
                    "`uri`: expected rsim://node/<id> (e.g. rsim://node/n12), got {:?}",
                    short(&uri)
                ))
            })?
            .to_string();
        let caller = self.s.caller.clone();
        self.blocking(move |s| {
            let v = s.call(&caller, "get_node", json!({ "node": id }))?;
            let card = node_card(s, &caller, &id)?;
            Ok(json!({ "text": node_markdown(&v, &card) }))
        })
        .await
    }

    /// `rsim/log`: the core's `log` query.
    async fn log(&self, params: Value) -> RpcResult<Value> {
        let args = Value::Object(object(params)?);
        let caller = self.s.caller.clone();
        self.blocking(move |s| s.call(&caller, "log", args)).await
    }

    /// `rsim/compare` {nodes, task?}: each node's dev mean with its 95% interval, and each
    /// pair's difference with Welch's interval (read-only, as the web page's; the recorded
    /// comparison is the `rsim.compare` command).
    async fn compare(&self, params: Value) -> RpcResult<Value> {
        let m = object(params)?;
        let nodes: Vec<String> = match m.get("nodes") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .filter(|i| text::is_node_id(i))
                        .map(str::to_string)
                        .ok_or_else(|| RpcError::invalid_params("`nodes`: expected node ids"))
                })
                .collect::<RpcResult<_>>()?,
            _ => return Err(RpcError::invalid_params("`nodes`: expected node ids")),
        };
        let task = m.get("task").and_then(Value::as_str).map(str::to_string);
        self.blocking(move |s| {
            let c = s.with(|st| st.compare_nodes(&nodes, task.as_deref()))?;
            Ok(serde_json::to_value(c)?)
        })
        .await
    }

    /// `rsim/jobLog` {job, max_bytes?}: a job's log tail and progress.
    async fn job_log(&self, params: Value) -> RpcResult<Value> {
        let m = object(params)?;
        let job = string_param(&m, "job")?;
        let max = m
            .get("max_bytes")
            .and_then(Value::as_u64)
            .unwrap_or(LOG_TAIL_BYTES)
            .min(1 << 20);
        self.blocking(move |s| {
            // The id is checked by the query's own schema before any path is made of it.
            crate::api::schema::validate("get_job", &json!({ "job": job }))?;
            s.with(|st| {
                if !st.job_exists(&job) {
                    return Err(Error::not_found(format!("job: no job {job} in this study")));
                }
                let progress = st.job_progress(&job).map(
                    |p| json!({ "step": p.step, "total": p.total, "loss": p.loss, "line": p.line }),
                );
                let running = st.running_jobs().iter().any(|o| o.job == job);
                Ok(json!({
                    "job": job, "log": st.job_log(&job, max)?, "progress": progress,
                    "running": running,
                }))
            })
        })
        .await
    }

    /// `rsim/jobs`: the running jobs with their progress.
    async fn jobs(&self, params: Value) -> RpcResult<Value> {
        object(params)?;
        self.blocking(|s| s.with(|st| Ok(running_jobs(st)))).await
    }

    /// `rsim/summary`: for the status bar and the Research view — the `summary` view of the DAG
    /// (counts, best node, frontier), budgets used, running jobs, and every node's group.
    async fn summary(&self, params: Value) -> RpcResult<Value> {
        object(params)?;
        let caller = self.s.caller.clone();
        self.blocking(move |s| summary(s, &caller)).await
    }

    /// `rsim/status`: where the server stands (its study, or why it has none).
    async fn status(&self, params: Value) -> RpcResult<Value> {
        object(params)?;
        let s = self.s.clone();
        let r = tokio::task::spawn_blocking(move || match s.session() {
            Ok(session) => json!({
                "study": session.root(), "caller": s.caller.agent,
                "read_only": session.with(|st| Ok(st.read_only().map(str::to_string))).ok().flatten(),
            }),
            Err(e) => json!({ "study": null, "error": e.message }),
        })
        .await
        .map_err(|_| RpcError::internal_error())?;
        Ok(r)
    }
}

/// The study's first task and its metric (what "the score" means in the views).
fn first_task(s: &Session) -> Result<(String, String)> {
    s.with(|st| {
        st.config()
            .tasks
            .iter()
            .next()
            .map(|(name, t)| (name.clone(), t.metric.clone()))
            .ok_or_else(|| Error::invalid("the study has no task"))
    })
}

/// n, mean and 95% interval of one metric in a `get_node` answer.
fn score_of(
    node: &Value,
    task: &str,
    split: &str,
    metric: &str,
) -> (usize, Option<f64>, Option<[f64; 2]>) {
    let values: Vec<f64> = node["metrics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["task"] == task && m["split"] == split && m["name"] == metric)
        .filter_map(|m| m["value"].as_f64())
        .collect();
    let (mean, ci) = crate::util::stats::mean_ci95(&values);
    (values.len(), mean, ci)
}

/// What a hover and the views say about a node: title, status, outcome, latest review verdict,
/// the first task's dev score (mean, 95% interval, n) and its runs.
fn node_card(s: &Session, caller: &Caller, id: &str) -> Result<Value> {
    let v = s.call(caller, "get_node", json!({ "node": id }))?;
    let (task, metric) = first_task(s)?;
    let (n, mean, ci95) = score_of(&v, &task, "dev", &metric);
    let verdict = s.with(|st| st.latest_verdicts())?.remove(id);
    let suspect = s.with(|st| st.suspect_nodes())?.contains(id);
    let runs = v["actions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["action"] == "run_sft" && a["decision"] == "accepted")
        .count();
    Ok(json!({
        "id": id, "title": v["title"], "status": v["status"], "outcome": v["outcome"],
        "verdict": verdict, "task": task, "metric": metric,
        "score": { "n": n, "mean": mean, "ci95": ci95 }, "runs": runs, "suspect": suspect,
        "parents": v["parents"], "children": v["children"],
    }))
}

fn fmt_score(card: &Value) -> String {
    let s = &card["score"];
    match s["mean"].as_f64() {
        None => "no dev evaluation yet".into(),
        Some(m) => {
            let ci = s["ci95"]
                .as_array()
                .and_then(|c| Some((c.first()?.as_f64()?, c.get(1)?.as_f64()?)))
                .map(|(a, b)| format!(" ± {:.4} (95% CI [{a:.4}, {b:.4}])", (b - a) / 2.0))
                .unwrap_or_default();
            let suspect = if card["suspect"] == true {
                " — SUSPECT: significantly above the hidden dev twin's, not ranked"
            } else {
                ""
            };
            format!("{m:.4}{ci}, n = {}{suspect}", s["n"])
        }
    }
}

/// Hover Markdown for a node.
fn node_hover(card: &Value) -> String {
    let mut out = format!(
        "**{}** — {}\n\n",
        card["id"].as_str().unwrap_or_default(),
        md(card["title"].as_str().unwrap_or_default())
    );
    out += &format!(
        "status: {}{} · verdict: {} · runs: {}\n\n",
        card["status"].as_str().unwrap_or("?"),
        card["outcome"]
            .as_str()
            .map(|o| format!(" ({o})"))
            .unwrap_or_default(),
        card["verdict"].as_str().unwrap_or("not reviewed"),
        card["runs"]
    );
    out += &format!(
        "{} on {} (dev): {}",
        card["metric"].as_str().unwrap_or_default(),
        card["task"].as_str().unwrap_or_default(),
        fmt_score(card)
    );
    out
}

/// The read-only document of a node: what `rsim node` says, as Markdown.
fn node_markdown(v: &Value, card: &Value) -> String {
    let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    let mut out = format!("# {} — {}\n\n", s("id"), md(&s("title")));
    out += &format!(
        "{}\n\n",
        node_hover(card)
            .lines()
            .skip(2)
            .collect::<Vec<_>>()
            .join("\n")
    );
    out += &format!("branch `{}` · tip `{}`\n\n", s("branch"), s("tip"));
    out += &format!("## Hypothesis\n\n{}\n\n", md(&s("hypothesis")));
    let ids = |k: &str| {
        v[k].as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    };
    out += &format!(
        "parents: {} · children: {}\n\n",
        ids("parents"),
        ids("children")
    );
    out += "## Actions\n\n| seq | action | decision | agent | commit | summary |\n|---|---|---|---|---|---|\n";
    for a in v["actions"].as_array().into_iter().flatten() {
        let commit = a["commit"].as_str().unwrap_or_default();
        out += &format!(
            "| {} | {} | {} | {} | `{}` | {} |\n",
            a["seq"],
            a["action"].as_str().unwrap_or_default(),
            a["decision"].as_str().unwrap_or_default(),
            md(a["agent"].as_str().unwrap_or_default()),
            &commit[..commit.len().min(10)],
            md(a["summary"].as_str().unwrap_or_default()),
        );
    }
    out += "\n## Metrics\n\n| task | split | metric | value |\n|---|---|---|---|\n";
    for m in v["metrics"].as_array().into_iter().flatten() {
        out += &format!(
            "| {} | {} | {} | {} |\n",
            m["task"].as_str().unwrap_or_default(),
            m["split"].as_str().unwrap_or_default(),
            m["name"].as_str().unwrap_or_default(),
            m["value"]
        );
    }
    if let Some(n) = v["notes"].as_str() {
        out += &format!("\n## Findings\n\n{}\n", md(n));
    }
    out
}

/// The node panel: the node, its card, each run's loss curve (running ones too), the reviews
/// naming it, and its running jobs.
fn node_panel(s: &Session, caller: &Caller, id: &str) -> Result<Value> {
    let v = s.call(caller, "get_node", json!({ "node": id }))?;
    let card = node_card(s, caller, id)?;
    let (curves, reviews, running) = s.with(|st| {
        let running: Vec<Value> = running_jobs(st)
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["node"] == id)
            .cloned()
            .collect();
        Ok((st.loss_curves(id)?, st.reviews_of(id)?, running))
    })?;
    Ok(json!({
        "node": v, "card": card, "curves": curves, "reviews": reviews, "running": running,
    }))
}

fn running_jobs(st: &crate::os::Study) -> Value {
    let jobs: Vec<Value> = st
        .running_jobs()
        .into_iter()
        .map(|o| {
            let p = st.job_progress(&o.job);
            json!({
                "job": o.job, "node": o.node, "action": o.action, "agent": o.agent,
                "started_at": o.started_at,
                "progress": p.map(|p| json!({ "step": p.step, "total": p.total, "loss": p.loss })),
            })
        })
        .collect();
    Value::Array(jobs)
}

/// The status bar's and the Research view's data: the `summary` view of the DAG, budgets used,
/// running jobs, and the nodes by group (frontier, promising, dead end, concluded) with their
/// dev score, at most `MAX_TREE_NODES` a group (best first; `groups` has the counts).
fn summary(s: &Session, caller: &Caller) -> Result<Value> {
    let dag = s.call(caller, "dag", json!({ "view": "summary" }))?;
    let (o, jobs, used, cfg) = s.with(|st| {
        Ok((
            st.dag_overview(None)?,
            running_jobs(st),
            st.compute_seconds_used()?,
            st.config().budgets.clone(),
        ))
    })?;
    let mut groups: std::collections::BTreeMap<&str, Vec<&crate::os::OverviewNode>> =
        Default::default();
    for n in &o.nodes {
        let group = match (n.verdict.as_deref(), n.status) {
            (Some("dead_end"), _) => "dead_end",
            (_, crate::model::NodeStatus::Concluded)
                if n.outcome.as_deref() == Some("negative") =>
            {
                "dead_end"
            }
            (Some("promising"), _) => "promising",
            (_, crate::model::NodeStatus::Open) => "frontier",
            _ => "concluded",
        };
        groups.entry(group).or_default().push(n);
    }
    let mut counts = serde_json::Map::new();
    let mut nodes = Vec::new();
    for (g, mut list) in groups {
        counts.insert(g.to_string(), json!(list.len()));
        list.sort_by(|a, b| {
            b.score
                .unwrap_or(f64::NEG_INFINITY)
                .total_cmp(&a.score.unwrap_or(f64::NEG_INFINITY))
        });
        for n in list.into_iter().take(MAX_TREE_NODES) {
            nodes.push(json!({
                "id": n.id, "title": n.title, "status": n.status, "verdict": n.verdict,
                "outcome": n.outcome, "score": n.score, "evals": n.evals, "group": g,
            }));
        }
    }
    Ok(json!({
        "summary": dag["summary"],
        "task": o.task, "metric": o.metric, "best": o.best,
        "budgets": {
            "compute_seconds": { "used": used, "limit": cfg.compute_seconds },
            "max_nodes": cfg.max_nodes,
        },
        "jobs": jobs,
        "groups": counts,
        "nodes": nodes,
        "read_only": o.read_only,
    }))
}

impl LanguageServer for Backend {
    async fn initialize(&self, params: InitializeParams) -> RpcResult<InitializeResult> {
        let folder = params
            .workspace_folders
            .as_ref()
            .and_then(|f| f.first())
            .map(|f| f.uri.clone())
            .or_else(|| {
                #[allow(deprecated)]
                params.root_uri.clone()
            })
            .and_then(|u| u.to_file_path().map(|p| p.into_owned()));
        *self.s.workspace.write().unwrap_or_else(|e| e.into_inner()) = folder;
        Ok(InitializeResult {
            server_info: Some(ServerInfo {
                name: "rsim".into(),
                version: Some(env!("CARGO_PKG_VERSION").into()),
            }),
            capabilities: ServerCapabilities {
                text_document_sync: Some(TextDocumentSyncCapability::Kind(
                    TextDocumentSyncKind::FULL,
                )),
                hover_provider: Some(HoverProviderCapability::Simple(true)),
                completion_provider: Some(CompletionOptions {
                    trigger_characters: Some(vec!["=".into(), " ".into(), "[".into()]),
                    ..CompletionOptions::default()
                }),
                definition_provider: Some(OneOf::Left(true)),
                workspace_symbol_provider: Some(OneOf::Left(true)),
                execute_command_provider: Some(ExecuteCommandOptions {
                    commands: COMMANDS.iter().map(|(c, _)| c.to_string()).collect(),
                    ..ExecuteCommandOptions::default()
                }),
                ..ServerCapabilities::default()
            },
            ..InitializeResult::default()
        })
    }

    async fn initialized(&self, _: InitializedParams) {
        self.open_study().await;
    }

    async fn shutdown(&self) -> RpcResult<()> {
        Ok(())
    }

    async fn did_open(&self, p: DidOpenTextDocumentParams) {
        let d = p.text_document;
        self.set_document(d.uri, d.text, d.version).await;
    }

    async fn did_change(&self, p: DidChangeTextDocumentParams) {
        // Full sync: the last change holds the whole text.
        if let Some(c) = p.content_changes.into_iter().last() {
            self.set_document(p.text_document.uri, c.text, p.text_document.version)
                .await;
        }
    }

    async fn did_close(&self, p: DidCloseTextDocumentParams) {
        lock(&self.s.docs).remove(p.text_document.uri.as_str());
    }

    async fn hover(&self, p: HoverParams) -> RpcResult<Option<Hover>> {
        let pp = p.text_document_position_params;
        let Some(text) = self.document(&pp.text_document.uri) else {
            return Ok(None);
        };
        let markdown = |value: String, range: Option<Range>| Hover {
            contents: HoverContents::Markup(MarkupContent {
                kind: MarkupKind::Markdown,
                value,
            }),
            range,
        };
        if config::is_config_uri(pp.text_document.uri.as_str()) {
            return Ok(
                config::hover(&self.s.schema, &text, pp.position).map(|(h, _)| markdown(h, None))
            );
        }
        let Some((id, span)) = text::node_id_at(&text, text::offset_of(&text, pp.position)) else {
            return Ok(None);
        };
        let range = text::range_of(&text, span);
        let caller = self.s.caller.clone();
        match self.blocking(move |s| node_card(s, &caller, &id)).await {
            Ok(card) => Ok(Some(markdown(node_hover(&card), Some(range)))),
            // A word that looks like a node id but names none: no hover.
            Err(e) if e.code == ErrorCode::ServerError(-32001) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn completion(&self, p: CompletionParams) -> RpcResult<Option<CompletionResponse>> {
        let tp = p.text_document_position;
        if !config::is_config_uri(tp.text_document.uri.as_str()) {
            return Ok(None);
        }
        let Some(text) = self.document(&tp.text_document.uri) else {
            return Ok(None);
        };
        Ok(Some(CompletionResponse::Array(config::complete(
            &self.s.schema,
            &text,
            tp.position,
        ))))
    }

    async fn goto_definition(
        &self,
        p: GotoDefinitionParams,
    ) -> RpcResult<Option<GotoDefinitionResponse>> {
        let pp = p.text_document_position_params;
        let Some(text) = self.document(&pp.text_document.uri) else {
            return Ok(None);
        };
        let Some((id, _)) = text::node_id_at(&text, text::offset_of(&text, pp.position)) else {
            return Ok(None);
        };
        let caller = self.s.caller.clone();
        let probe = id.clone();
        // Only nodes that exist.
        if self
            .blocking(move |s| s.call(&caller, "get_node", json!({ "node": probe })))
            .await
            .is_err()
        {
            return Ok(None);
        }
        let uri: Uri = text::node_uri(&id)
            .parse()
            .map_err(|_| RpcError::internal_error())?;
        Ok(Some(GotoDefinitionResponse::Scalar(Location {
            uri,
            range: Range::default(),
        })))
    }

    async fn symbol(&self, p: WorkspaceSymbolParams) -> RpcResult<Option<WorkspaceSymbolResponse>> {
        let q = p.query.to_lowercase();
        let caller = self.s.caller.clone();
        let found = self
            .blocking(move |s| {
                let mut out = Vec::new();
                let mut cursor: Option<String> = None;
                let mut seen = 0usize;
                loop {
                    let mut args = json!({ "view": "full", "max_tokens": 200_000 });
                    if let Some(c) = &cursor {
                        args["cursor"] = json!(c);
                    }
                    let page = s.call(&caller, "dag", args)?;
                    for n in page["nodes"].as_array().into_iter().flatten() {
                        seen += 1;
                        let id = n["id"].as_str().unwrap_or_default();
                        let title = n["title"].as_str().unwrap_or_default();
                        if q.is_empty() || id == q || title.to_lowercase().contains(&q) {
                            out.push((id.to_string(), title.to_string()));
                        }
                    }
                    cursor = page["next_cursor"].as_str().map(str::to_string);
                    if cursor.is_none() || out.len() >= MAX_SYMBOLS || seen >= SYMBOL_SCAN_NODES {
                        break;
                    }
                }
                out.truncate(MAX_SYMBOLS);
                Ok(out)
            })
            .await?;
        let symbols = found
            .into_iter()
            .filter_map(|(id, title)| {
                Some(WorkspaceSymbol {
                    name: format!("{id} {title}"),
                    kind: SymbolKind::OBJECT,
                    tags: None,
                    container_name: Some("research DAG".into()),
                    location: OneOf::Left(Location {
                        uri: text::node_uri(&id).parse().ok()?,
                        range: Range::default(),
                    }),
                    data: None,
                })
            })
            .collect();
        Ok(Some(WorkspaceSymbolResponse::Nested(symbols)))
    }

    async fn execute_command(&self, p: ExecuteCommandParams) -> RpcResult<Option<LSPAny>> {
        let action = COMMANDS
            .iter()
            .find(|(c, _)| *c == p.command)
            .map(|(_, a)| *a)
            .ok_or_else(|| {
                RpcError::invalid_params(format!(
                    "unknown command {:?}; the commands are {}",
                    short(&p.command),
                    COMMANDS.map(|(c, _)| c).join(", ")
                ))
            })?;
        let args = match <[Value; 1]>::try_from(p.arguments) {
            Ok([v @ Value::Object(_)]) => v,
            _ => {
                return Err(RpcError::invalid_params(format!(
                    "{}: expected one argument, an object of the `{action}` action's fields (see `rsim schemas`)",
                    p.command
                )));
            }
        };
        let caller = self.s.caller.clone();
        // The same call every face makes: schema, semantic checks, policy, the commit protocol.
        self.blocking(move |s| s.call(&caller, action, args))
            .await
            .map(Some)
    }
}

#[cfg(test)]
mod tests;
