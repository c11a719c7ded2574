//! The MCP face: the Experiment OS as MCP tools, resources and prompts, over stdio (`rsim mcp`) and
//! streamable HTTP (`rsim serve --http`). A thin layer: every tool call goes through
//! `Study::call` (validation, policy, execution, recording); this module only maps MCP onto it.
//!
//! - Tools: one per action and query in `api::schema::ACTIONS` (input and output schemas from the
//!   same registry), plus `cancel_job` and `wait_job`. Arguments are checked with the project's JSON
//!   Schema validator before serde (rmcp itself only runs serde). Errors are tool results with
//!   `isError: true` and the core's message, which names the field or the policy rule.
//! - Long jobs (`run_sft`, `evaluate`): see `jobs.rs`.
//! - Roles: a session lists only the tools its role may use (`policy::role_allows`); a call outside
//!   the role still reaches the core, whose policy rejects it and records the attempt.

pub mod config;
pub mod http;
pub mod jobs;
pub mod limits;
pub mod priming;
mod stdio;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::*;
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::task_manager::{TaskExit, TaskManager, TaskOptions};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};

use crate::api::actions::Kind;
use crate::api::schema::{self, ACTIONS};
use crate::api::types::CancelJobRequest;
use crate::api::types::{EvaluateResult, RunSftResult};
use crate::model::{ActionName, Caller, Role};
use crate::os::Execute;
use crate::os::session::Session;
use crate::util::error::{Error, ErrorKind, Result};
use jobs::{JobRunning, Registry, WaitJobRequest};

/// The argument Gemini CLI adds to every tool call (see `call_tool`).
const GEMINI_SCHEDULING_ARG: &str = "wait_for_previous";

/// The Worker role prompt (also for the orchestrator).
pub const WORKER_PROMPT: &str = include_str!("../../../prompts/worker.md");
/// The Reviewer role prompt (also for the orchestrator).
pub const REVIEWER_PROMPT: &str = include_str!("../../../prompts/reviewer.md");

/// Settings of one server process.
#[derive(Debug, Clone)]
pub struct Options {
    /// How long `run_sft`/`evaluate` wait for their job before answering `status: "running"`.
    pub job_wait: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            job_wait: Duration::from_secs(5),
        }
    }
}

/// What every session of one server process shares (created once, outside rmcp's per-session factory).
pub struct Shared {
    pool: Arc<Session>,
    registry: Arc<Registry>,
    tasks: TaskManager,
    /// Who started each task (`call_as_task`): only its starter reads, answers or cancels it
    /// (a task id that reaches another identity, by a log or a proxy, gives it nothing).
    task_owners: Mutex<HashMap<String, String>>,
    opts: Options,
    /// Every tool, with the action it stands for (None for the face's own tools).
    tools: Vec<(Tool, ToolKind)>,
    wait_validator: jsonschema::Validator,
}

#[derive(Debug, Clone, Copy)]
enum ToolKind {
    /// A query: every role.
    Query,
    /// An action that writes the record.
    Action(ActionName),
}

impl Shared {
    pub fn open(study: &Path, opts: Options) -> Result<Arc<Shared>> {
        let pool = Session::open(study)?;
        if let Some(why) = pool.read_only() {
            tracing::warn!("read-only clone: every caller is served as an observer ({why})");
        }
        Ok(Arc::new(Shared {
            pool: Arc::new(pool),
            registry: Arc::new(Registry::default()),
            tasks: TaskManager::new(),
            task_owners: Mutex::new(HashMap::new()),
            opts,
            tools: all_tools()?,
            wait_validator: schema::validator_for::<WaitJobRequest>()?,
        }))
    }

    pub fn root(&self) -> &Path {
        self.pool.root()
    }

    /// The session every face of this server shares (the web page uses it too).
    pub fn session(&self) -> Arc<Session> {
        self.pool.clone()
    }

    /// The `[server]` limits of the committed config.
    pub fn server_limits(&self) -> Result<crate::config::ServerConfig> {
        self.pool.with(|s| Ok(s.config().server.clone()))
    }
}

fn object(v: Value) -> Result<Arc<JsonObject>> {
    match v {
        Value::Object(m) => Ok(Arc::new(m)),
        other => Err(Error::internal(format!(
            "a tool schema is not an object: {other}"
        ))),
    }
}

/// `{"type": "object", "anyOf": [a, b, ...]}` from generated schemas, with their `$defs` merged.
fn any_of(schemas: Vec<Value>) -> Value {
    let mut defs = Map::new();
    let mut alts = Vec::new();
    for mut s in schemas {
        if let Value::Object(m) = &mut s {
            if let Some(Value::Object(d)) = m.remove("$defs") {
                defs.extend(d);
            }
            m.remove("$schema");
        }
        alts.push(s);
    }
    let mut out = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "anyOf": alts,
    });
    if !defs.is_empty() {
        out["$defs"] = Value::Object(defs);
    }
    out
}

fn running_schema() -> Value {
    crate::util::schema::schema_of::<JobRunning>().to_value()
}

fn title_of(name: &str) -> String {
    let mut t = name.replace('_', " ");
    if let Some(c) = t.get(0..1) {
        let up = c.to_uppercase();
        t.replace_range(0..1, &up);
    }
    t
}

fn all_tools() -> Result<Vec<(Tool, ToolKind)>> {
    let mut out = Vec::new();
    for a in ACTIONS {
        let mut output = (a.output)().to_value();
        let mut description = a.description.to_string();
        if a.kind == Kind::Job {
            output = any_of(vec![output, running_schema()]);
            description.push_str(" If the job outlives a short wait, answers {job, status: \"running\"} at once (\"queued\" while it waits in the admission queue for compute that running jobs claim); then call wait_job with the job id (progress notifications report training steps and loss). The job runs to the end and is recorded even if you disconnect; cancel_job stops it.");
        }
        let kind = match a.action() {
            Some(n) => ToolKind::Action(n),
            None => ToolKind::Query,
        };
        // conclude closes a node for good; cancel_job stops a job (asking twice is harmless).
        let ann = ToolAnnotations::new()
            .read_only(a.read_only())
            .destructive(matches!(a.name, "conclude" | "cancel_job"))
            .idempotent(a.read_only() || a.name == "cancel_job")
            .open_world(false);
        let tool = Tool::new_with_raw(
            a.name,
            Some(description.into()),
            object((a.input)().to_value())?,
        )
        .with_title(title_of(a.name))
        .with_raw_output_schema(object(output)?)
        .annotate(ann);
        out.push((tool, kind));
    }
    let gen_schema = |s: schemars::Schema| object(s.to_value());
    out.push((
        Tool::new_with_raw(
            "wait_job",
            Some("Wait for a job started by run_sft or evaluate (by any agent or process) until its action is recorded, then return the recorded result (the run_sft or evaluate result). Sends progress notifications while it waits. After timeout_s (default 60) answers {job, status: \"running\"}; call again to keep waiting.".into()),
            gen_schema(crate::util::schema::schema_of::<WaitJobRequest>())?,
        )
        .with_title("Wait for job")
        .with_raw_output_schema(object(any_of(vec![
            crate::util::schema::schema_of::<RunSftResult>().to_value(),
            crate::util::schema::schema_of::<EvaluateResult>().to_value(),
            running_schema(),
        ]))?)
        .annotate(
            ToolAnnotations::new()
                .read_only(true)
                .destructive(false)
                .idempotent(true)
                .open_world(false),
        ),
        ToolKind::Query,
    ));
    Ok(out)
}

fn role_may(role: Role, kind: ToolKind) -> bool {
    match kind {
        ToolKind::Query => true,
        ToolKind::Action(a) => crate::policy::role_allows(role, a),
    }
}

/// A tool error the agent reads: the core's message (naming the field or rule), the rule and the
/// commit that recorded a rejection.
fn tool_error(e: &Error) -> CallToolResult {
    let mut msg = match e.kind {
        ErrorKind::Invalid if e.message.starts_with("invalid") => e.message.clone(),
        ErrorKind::Invalid => format!("invalid request: {}", e.message),
        ErrorKind::NotFound => format!("not found: {}", e.message),
        ErrorKind::Rejected if e.message.starts_with("rejected") => e.message.clone(),
        ErrorKind::Rejected => format!("rejected by policy: {}", e.message),
        ErrorKind::Forbidden => format!("forbidden: {}", e.message),
        ErrorKind::Conflict => format!("conflict: {}", e.message),
        ErrorKind::Internal => format!("internal error: {}", e.message),
    };
    if let Some(r) = &e.rule
        && !msg.contains(r.as_str())
    {
        msg.push_str(&format!(" (rule: {r})"));
    }
    if let Some(c) = &e.commit {
        msg.push_str(&format!(" [the rejection is recorded as commit {c}]"));
    }
    CallToolResult::error(vec![ContentBlock::text(msg)])
}

fn tool_ok(v: Value) -> CallToolResult {
    let text = serde_json::to_string_pretty(&v).unwrap_or_else(|_| v.to_string());
    let mut r = CallToolResult::structured(v);
    r.content = vec![ContentBlock::text(text)];
    r
}

fn outcome_result(o: &jobs::Outcome) -> CallToolResult {
    match o {
        Ok(v) => tool_ok(v.clone()),
        Err(e) => tool_error(e),
    }
}

fn running_result(session: &Session, job: &str, action: Option<&str>) -> CallToolResult {
    match serde_json::to_value(JobRunning::new(session, job, action)) {
        Ok(v) => tool_ok(v),
        Err(e) => tool_error(&Error::from(e)),
    }
}

/// One MCP session's handler. Cheap to clone; all state lives in `Shared`.
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
    /// The caller of a stdio session; HTTP sessions take theirs from each request (see `http.rs`).
    caller: Option<Caller>,
    /// This session's long calls in flight, by request id, and whether its client cancelled
    /// each with `notifications/cancelled`. A cancel naming no call in flight is dropped: a
    /// client that sends endless cancels (of ids as long as a request may be) keeps nothing.
    cancelled: Arc<Mutex<HashMap<RequestId, bool>>>,
    /// Places for this session's quick calls on the study (`IN_FLIGHT`): a client that pipes
    /// thousands of requests without reading the answers waits here, on no thread, and other
    /// clients' calls are not queued behind its requests.
    in_flight: Arc<tokio::sync::Semaphore>,
    /// This session's quick calls running or waiting for a place (at most `MAX_WAITING`).
    waiting: Arc<std::sync::atomic::AtomicUsize>,
}

/// Quick calls one session may have running or waiting at once; past it a call is answered at
/// once with an error and nothing is run, so what a client that never reads its answers costs
/// the server stays bounded (each waiting request holds its arguments).
const MAX_WAITING: usize = 1024;

/// Quick calls (queries, writes that start no job) one MCP session runs at once; the rest of its
/// requests wait their turn. The session layer bounds the studies all sessions hold together
/// (`os::session::MAX_QUICK`).
const IN_FLIGHT: usize = 8;

impl Server {
    pub fn new(shared: Arc<Shared>, caller: Option<Caller>) -> Server {
        Server {
            shared,
            caller,
            cancelled: Arc::new(Mutex::new(HashMap::new())),
            in_flight: Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT)),
            waiting: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        }
    }

    /// Run `f` on a worker thread once this session has a place for it (`IN_FLIGHT`).
    async fn quick<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        use std::sync::atomic::Ordering::SeqCst;
        struct Waiting(Arc<std::sync::atomic::AtomicUsize>);
        impl Drop for Waiting {
            fn drop(&mut self) {
                self.0.fetch_sub(1, SeqCst);
            }
        }
        let was = self.waiting.fetch_add(1, SeqCst);
        let _counted = Waiting(self.waiting.clone());
        if was >= MAX_WAITING {
            return Err(Error::new(
                crate::util::error::ErrorKind::Conflict,
                format!(
                    "too many requests in flight on this connection ({MAX_WAITING} running or waiting): \
                     read the answers before sending more; nothing was run"
                ),
            ));
        }
        let _place = self
            .in_flight
            .acquire()
            .await
            .map_err(|e| Error::internal(format!("the session is closing: {e}")))?;
        tokio::task::spawn_blocking(f)
            .await
            .unwrap_or_else(|e| Err(Error::internal(format!("worker thread failed: {e}"))))
    }

    /// Who is calling. In a read-only clone everyone is an observer: the tools listed are the
    /// queries, and a write still reaches the core, which refuses it (`read-only clone: …`).
    fn caller_of(&self, ext: &Extensions) -> std::result::Result<Caller, McpError> {
        let mut caller = match ext
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>())
        {
            Some(c) => c.clone(),
            None => self.caller.clone().ok_or_else(|| {
                McpError::internal_error("this request carries no identity", None)
            })?,
        };
        if self.shared.pool.read_only().is_some() {
            caller.role = Role::Observer;
        }
        Ok(caller)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&crate::os::Study) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let pool = self.shared.pool.clone();
        self.quick(move || pool.with(f)).await
    }

    async fn call_action(
        &self,
        caller: Caller,
        name: &str,
        args: Value,
        kind: ToolKind,
    ) -> CallToolResult {
        let name = name.to_string();
        let r = if let ToolKind::Action(_) = kind {
            let pool = self.shared.pool.clone();
            self.quick(move || pool.call(&caller, &name, args)).await
        } else {
            self.blocking(move |s| s.call(&caller, &name, args)).await
        };
        match r {
            Ok(v) => tool_ok(v),
            Err(e) => tool_error(&e),
        }
    }

    /// `run_sft` / `evaluate`: answer with the result if the job ends within the short wait, else
    /// with `{job, status: "running"}`; progress and cancellation while the request is open.
    async fn call_long(
        &self,
        caller: Caller,
        name: &str,
        args: Value,
        ctx: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        // Malformed requests answer at once (the core validates again; this only avoids a thread).
        if let Err(e) = schema::validate(name, &args) {
            return tool_error(&e);
        }
        let caller_c = caller.clone();
        let mut started = jobs::start(
            self.shared.pool.clone(),
            self.shared.registry.clone(),
            caller,
            name.to_string(),
            args,
        );
        // In flight until it is answered, or until `after_cancel` has looked.
        let in_flight = InFlight::new(&self.cancelled, ctx.id.clone());
        let job = tokio::select! {
            j = &mut started.job => j.ok(),
            _ = started.done.wait_for(|o| o.is_some()) => None,
            _ = ctx.ct.cancelled() => None,
        };
        let Some(job) = job else {
            if ctx.ct.is_cancelled() {
                self.after_cancel(caller_c.clone(), in_flight, None, started);
                return CallToolResult::error(vec![ContentBlock::text("cancelled")]);
            }
            // The action ended without starting a job (a policy rejection, a bad node, ...): its
            // outcome is on its way; the job channel may close just before it is set.
            let outcome = started
                .done
                .wait_for(|o| o.is_some())
                .await
                .ok()
                .and_then(|g| g.clone());
            return match outcome {
                Some(o) => outcome_result(&o),
                None => tool_error(&Error::internal("the action ended without a result")),
            };
        };
        let deadline = Instant::now() + self.shared.opts.job_wait;
        match self.follow(&job, &mut started.done, deadline, ctx).await {
            Followed::Done(o) => outcome_result(&o),
            Followed::TimedOut => running_result(&self.shared.pool, &job, Some(name)),
            Followed::Cancelled => {
                self.after_cancel(caller_c, in_flight, Some(job), started);
                CallToolResult::error(vec![ContentBlock::text("cancelled")])
            }
        }
    }

    /// The request was cancelled or its client went away. Only an explicit `notifications/cancelled`
    /// (seen by `on_cancelled`, which may arrive just after the token fires) stops the job.
    fn after_cancel(
        &self,
        caller: Caller,
        in_flight: InFlight,
        job: Option<String>,
        started: jobs::Started,
    ) {
        let pool = self.shared.pool.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if !in_flight.cancelled() {
                return;
            }
            let job = match job {
                Some(j) => Some(j),
                None => started.job.await.ok(),
            };
            if let Some(j) = job {
                let r = tokio::task::spawn_blocking(move || {
                    pool.with(|s| s.cancel_job(&caller, CancelJobRequest { job: j }))
                })
                .await;
                if let Ok(Err(e)) = r {
                    tracing::warn!(
                        "could not cancel the job of a cancelled request: {}",
                        e.message
                    );
                }
            }
        });
    }

    /// Wait for a job's outcome until `deadline`, sending progress notifications if the request asked for them.
    async fn follow(
        &self,
        job: &str,
        done: &mut tokio::sync::watch::Receiver<Option<jobs::Outcome>>,
        deadline: Instant,
        ctx: &RequestContext<RoleServer>,
    ) -> Followed {
        let token = ctx.meta.get_progress_token();
        let _root = self.shared.root().to_path_buf();
        let mut last = 0.0_f64;
        let started = Instant::now();
        loop {
            if let Some(o) = done.borrow().clone() {
                return Followed::Done(o);
            }
            if let Some(t) = &token {
                let (value, total, msg) = match self.shared.pool.job_progress(job) {
                    Some(p) => (p.step as f64, p.total.map(|n| n as f64), p.line),
                    None => (
                        started.elapsed().as_secs_f64().floor(),
                        None,
                        format!("job {job} running"),
                    ),
                };
                if value > last {
                    last = value;
                    let mut p = ProgressNotificationParam::new(t.clone(), value).with_message(msg);
                    if let Some(n) = total {
                        p = p.with_total(n);
                    }
                    let _ = ctx.peer.notify_progress(p).await;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Followed::TimedOut;
            }
            let tick = (deadline - now).min(Duration::from_millis(500));
            tokio::select! {
                _ = done.changed() => {}
                _ = tokio::time::sleep(tick) => {}
                _ = ctx.ct.cancelled() => return Followed::Cancelled,
            }
        }
    }

    async fn wait_job(
        &self,
        req: WaitJobRequest,
        ctx: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let timeout = Duration::from_secs(req.timeout_s.unwrap_or(60).min(3600));
        let deadline = Instant::now() + timeout;
        let root = self.shared.root().to_path_buf();
        if let Some(mut done) = self.shared.registry.get(&req.job) {
            return match self.follow(&req.job, &mut done, deadline, ctx).await {
                Followed::Done(o) => outcome_result(&o),
                Followed::TimedOut => running_result(&self.shared.pool, &req.job, None),
                Followed::Cancelled => CallToolResult::error(vec![ContentBlock::text("cancelled")]),
            };
        }
        // A job of another process (or of an earlier session): follow its log until the index has it.
        let (tx, mut rx) = tokio::sync::watch::channel::<Option<jobs::Outcome>>(None);
        let poll = {
            let job = req.job.clone();
            let pool = self.shared.pool.clone();
            let _root = root.clone();
            tokio::spawn(async move {
                loop {
                    let j = job.clone();
                    let r = tokio::task::spawn_blocking({
                        let pool = pool.clone();
                        move || {
                            pool.with(|s| {
                                // A job whose writer died is recorded by the one who waits.
                                s.record_if_orphaned(&j)?;
                                s.recorded_result(&j)
                            })
                        }
                    })
                    .await;
                    let r = match r {
                        Ok(r) => r,
                        Err(e) => Err(Error::internal(format!("worker thread failed: {e}"))),
                    };
                    match r {
                        Ok(Some(v)) => {
                            let _ = tx.send(Some(Ok(v)));
                            return;
                        }
                        Ok(None) if !pool.job_exists(&job) => {
                            let _ = tx.send(Some(Err(Error::not_found(format!(
                                "job: no job {job} in this study"
                            )))));
                            return;
                        }
                        Ok(None) => {}
                        Err(e) => {
                            let _ = tx.send(Some(Err(e)));
                            return;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            })
        };
        let r = match self.follow(&req.job, &mut rx, deadline, ctx).await {
            Followed::Done(o) => outcome_result(&o),
            Followed::TimedOut => running_result(&self.shared.pool, &req.job, None),
            Followed::Cancelled => CallToolResult::error(vec![ContentBlock::text("cancelled")]),
        };
        poll.abort();
        r
    }

    /// Serve a long tool as an MCP task (protocol 2026-07-28 clients that declared the extension).
    fn call_as_task(&self, caller: Caller, name: &str, args: Value) -> CallToolResponse {
        let shared = self.shared.clone();
        let agent = caller.agent.clone();
        let name = name.to_string();
        let task = self.shared.tasks.spawn(
            TaskOptions::new().with_poll_interval_ms(1000),
            move |tctx| {
                Box::pin(async move {
                    if let Err(e) = schema::validate(&name, &args) {
                        return Ok(tool_error(&e));
                    }
                    let cancel_caller = caller.clone();
                    let mut started = jobs::start(
                        shared.pool.clone(),
                        shared.registry.clone(),
                        caller,
                        name,
                        args,
                    );
                    let outcome = tokio::select! {
                        o = started.done.wait_for(|o| o.is_some()) => o.ok().and_then(|g| g.clone()),
                        _ = tctx.cancelled() => None,
                    };
                    let Some(o) = outcome else {
                        if let Ok(j) = started.job.await {
                            let pool = shared.pool.clone();
                            let c = cancel_caller.clone();
                            let _ = tokio::task::spawn_blocking(move || {
                                pool.with(|s| s.cancel_job(&c, CancelJobRequest { job: j }))
                            })
                            .await;
                        }
                        return Err(TaskExit::Cancelled);
                    };
                    let r = outcome_result(&o);
                    Ok(r)
                })
            },
        );
        self.shared.own_task(&task.task_id, &agent);
        CallToolResponse::Task(CreateTaskResult::new(task))
    }

    /// Task `id`, if the caller of `ext` started it; otherwise the error of a task that does
    /// not exist.
    fn owned_task(&self, id: &str, ext: &Extensions) -> std::result::Result<(), McpError> {
        let caller = self.caller_of(ext)?;
        let owners = self
            .shared
            .task_owners
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match owners.get(id) {
            Some(agent) if *agent == caller.agent => Ok(()),
            _ => Err(McpError::invalid_params(
                format!("unknown task: {id}"),
                None,
            )),
        }
    }
}

impl Shared {
    /// Record who started task `id`; past `MAX_TASK_OWNERS` entries, those of tasks the task
    /// manager no longer holds (expired) are let go first.
    fn own_task(&self, id: &str, agent: &str) {
        let mut owners = self.task_owners.lock().unwrap_or_else(|e| e.into_inner());
        if owners.len() >= MAX_TASK_OWNERS {
            owners.retain(|id, _| self.tasks.get_task(id).is_ok());
        }
        owners.insert(id.to_string(), agent.to_string());
    }
}

/// Task starters kept before expired tasks' are let go.
const MAX_TASK_OWNERS: usize = 4096;

/// A long call's place in its session's `cancelled` map, taken out when dropped.
struct InFlight {
    map: Arc<Mutex<HashMap<RequestId, bool>>>,
    id: RequestId,
}

impl InFlight {
    fn new(map: &Arc<Mutex<HashMap<RequestId, bool>>>, id: RequestId) -> InFlight {
        map.lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), false);
        InFlight {
            map: map.clone(),
            id,
        }
    }

    /// Whether the client cancelled the call with `notifications/cancelled`.
    fn cancelled(&self) -> bool {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&self.id)
            .copied()
            .unwrap_or(false)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

enum Followed {
    Done(jobs::Outcome),
    TimedOut,
    Cancelled,
}

fn is_2026(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}

fn resource_error(e: Error, uri: &str) -> McpError {
    match e.kind {
        ErrorKind::NotFound => McpError::resource_not_found(
            format!("{uri}: {}", e.message),
            Some(json!({ "uri": uri })),
        ),
        ErrorKind::Invalid => McpError::invalid_params(format!("{uri}: {}", e.message), None),
        _ => McpError::internal_error(format!("{uri}: {}", e.message), None),
    }
}

/// Read one `rsim://` resource: (mime type, text).
fn read_uri(study: &crate::os::Study, uri: &str) -> Result<(&'static str, String)> {
    let bad = || {
        Error::not_found(format!(
            "no resource {uri:?}; resources are rsim://dag, rsim://node/{{id}}, rsim://node/{{id}}/actions/{{seq}}, rsim://job/{{id}}/log"
        ))
    };
    let rest = uri.strip_prefix("rsim://").ok_or_else(bad)?;
    let parts: Vec<&str> = rest.split('/').collect();
    let json_text = |v: Value| -> Result<(&'static str, String)> {
        Ok(("application/json", serde_json::to_string_pretty(&v)?))
    };
    match parts.as_slice() {
        ["dag"] => json_text(study.call(&Caller::owner(), "dag", json!({}))?),
        ["node", id] => {
            json_text(study.call(&Caller::owner(), "get_node", json!({ "node": id }))?)
        }
        ["node", id, "actions", seq] => {
            let seq: u32 = seq
                .parse()
                .map_err(|_| Error::invalid(format!("seq: {seq:?} is not an action number")))?;
            // Validate the node id with the query's own schema before touching git.
            study.call(&Caller::owner(), "get_node", json!({ "node": id }))?;
            let (rec, commit) = study.action(id, seq)?;
            let mut v = serde_json::to_value(&rec)?;
            v["commit"] = Value::String(commit);
            json_text(v)
        }
        ["job", id, "log"] => {
            schema::validate("get_job", &json!({ "job": id }))?;
            // Bounded like every growing answer: the log's last DEFAULT_MAX_TOKENS × 4 bytes
            // (its end is where a job says why it failed).
            let max = crate::api::types::DEFAULT_MAX_TOKENS * 4;
            Ok(("text/plain", study.job_log(id, max)?))
        }
        _ => Err(bad()),
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        #[allow(unused_mut)]
        let mut caps = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_prompts()
            .enable_tasks()
            .build();
        if conformance_fixtures() {
            conformance::capabilities(&mut caps);
        }
        ServerConfig::new(caps)
        .with_server_info(
            Implementation::new("rsim", env!("CARGO_PKG_VERSION"))
                .with_title("RSI-Master Experiment OS"),
        )
        .with_instructions(
            "RSI-Master Experiment OS: post-train a base model only through these tools. Every call is validated, policy-checked and recorded in git with your agent name and role. Start with the `worker` or `reviewer` prompt, then `dag` and `get_node`. run_sft/evaluate may answer {job, status: \"running\"}: follow with wait_job.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<ListToolsResult, McpError> {
        let role = self.caller_of(&ctx.extensions)?.role;
        #[allow(unused_mut)]
        let mut tools: Vec<Tool> = self
            .shared
            .tools
            .iter()
            .filter(|(_, k)| role_may(role, *k))
            .map(|(t, _)| t.clone())
            .collect();
        if conformance_fixtures() {
            tools.extend(conformance::tools());
            tools.extend(conformance::mrtr_tools());
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        if conformance_fixtures()
            && let Some(t) = conformance::tools()
                .into_iter()
                .chain(conformance::mrtr_tools())
                .find(|t| t.name == name)
        {
            return Some(t);
        }
        self.shared
            .tools
            .iter()
            .find(|(t, _)| t.name == name)
            .map(|(t, _)| t.clone())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResponse, McpError> {
        let caller = self.caller_of(&ctx.extensions)?;
        let name = request.name.to_string();
        if conformance_fixtures() {
            if let Some(r) = conformance::call(&name, &request, &ctx).await {
                return r.map(CallToolResponse::from);
            }
            if let Some(r) = conformance::call_task(&name, &request, &ctx, &self.shared.tasks) {
                if let Ok(CallToolResponse::Task(t)) = &r {
                    self.shared.own_task(&t.task.task_id, &caller.agent);
                }
                return r;
            }
        }
        let Some((_, kind)) = self.shared.tools.iter().find(|(t, _)| t.name == name) else {
            return Err(McpError::invalid_params(
                format!(
                    "unknown tool {name:?}; tools are: {}, wait_job",
                    schema::names()
                ),
                None,
            ));
        };
        // Taken, not copied: a request's arguments may be megabytes of values.
        let mut request = request;
        let mut args = request.arguments.take().unwrap_or_default();
        // Gemini CLI adds `wait_for_previous` (a boolean: whether it ran the call after the
        // previous one) to every tool call it forwards. It is the host's scheduling note, not the
        // agent's request: dropped here, before validation, so every other unknown field is
        // still refused (a typo must not pass silently).
        if matches!(args.get(GEMINI_SCHEDULING_ARG), Some(Value::Bool(_))) {
            args.remove(GEMINI_SCHEDULING_ARG);
        }
        let args = Value::Object(args);
        let result = match (name.as_str(), kind) {
            ("wait_job", _) => {
                match schema::validate_with("wait_job", &self.shared.wait_validator, &args)
                    .and_then(|()| {
                        serde_json::from_value::<WaitJobRequest>(args)
                            .map_err(|e| Error::invalid(format!("invalid wait_job request: {e}")))
                    }) {
                    Ok(req) => self.wait_job(req, &ctx).await,
                    Err(e) => tool_error(&e),
                }
            }
            (n, _) if schema::spec(n).is_some_and(|a| a.kind == Kind::Job) => {
                let tasks_ok = ctx
                    .client_capabilities()
                    .is_some_and(|c| c.supports_tasks())
                    && is_2026(&ctx);
                if tasks_ok {
                    return Ok(self.call_as_task(caller, n, args));
                }
                self.call_long(caller, n, args, &ctx).await
            }
            (n, kind) => self.call_action(caller, n, args, *kind).await,
        };
        Ok(CallToolResponse::Complete(result))
    }

    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        _ctx: NotificationContext<RoleServer>,
    ) {
        if let Some(id) = notification.request_id
            && let Some(c) = self
                .cancelled
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(&id)
        {
            *c = true;
        }
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<ListResourcesResult, McpError> {
        #[allow(unused_mut)]
        let mut resources = vec![
            Resource::new("rsim://dag", "dag")
                .with_title("Research DAG")
                .with_description("Every node and edge of the study's research DAG (JSON, as the dag tool's full view).")
                .with_mime_type("application/json"),
        ];
        if conformance_fixtures() {
            resources.extend(conformance::resources());
        }
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<ListResourceTemplatesResult, McpError> {
        #[allow(unused_mut)]
        let mut templates = vec![
            ResourceTemplate::new("rsim://node/{id}", "node")
                .with_title("Node")
                .with_description("One node as get_node returns it: actions, metrics, findings (JSON).")
                .with_mime_type("application/json"),
            ResourceTemplate::new("rsim://node/{id}/actions/{seq}", "action")
                .with_title("Action record")
                .with_description("The full record of action {seq} on node {id}: request, policy decision, result, job, artifacts, metrics, commit (JSON).")
                .with_mime_type("application/json"),
            ResourceTemplate::new("rsim://job/{id}/log", "job-log")
                .with_title("Job log")
                .with_description("A job's combined stdout/stderr: live while it runs, the recorded log artifact afterwards (text).")
                .with_mime_type("text/plain"),
        ];
        if conformance_fixtures() {
            templates.extend(conformance::resource_templates());
        }
        Ok(ListResourceTemplatesResult::with_all_items(templates))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<ReadResourceResponse, McpError> {
        let uri = request.uri.clone();
        if conformance_fixtures()
            && let Some(r) = conformance::read(&uri)
        {
            return r.map(ReadResourceResponse::from);
        }
        let u = uri.clone();
        match self.blocking(move |s| read_uri(s, &u)).await {
            Ok((mime, text)) => Ok(ReadResourceResult::new(vec![
                ResourceContents::text(text, uri).with_mime_type(mime),
            ])
            .into()),
            Err(e) => Err(resource_error(e, &uri)),
        }
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<ListPromptsResult, McpError> {
        #[allow(unused_mut)]
        let mut prompts = vec![
            Prompt::new(
                "worker",
                Some("Instructions for a Worker: run experiments on a research direction through the study's tools."),
                None,
            )
            .with_title("Worker role"),
            Prompt::new(
                "reviewer",
                Some("Instructions for a Reviewer: compare evidence across related nodes and decide where the DAG grows."),
                None,
            )
            .with_title("Reviewer role"),
        ];
        if conformance_fixtures() {
            prompts.extend(conformance::prompts());
            prompts.push(conformance::mrtr_prompt_def());
        }
        Ok(ListPromptsResult::with_all_items(prompts))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<GetPromptResponse, McpError> {
        if conformance_fixtures() {
            if let Some(r) = conformance::prompt(&request) {
                return r.map(GetPromptResponse::from);
            }
            if let Some(r) = conformance::mrtr_prompt(&request) {
                return r;
            }
        }
        let (text, desc) = match request.name.as_str() {
            "worker" => (WORKER_PROMPT, "The Worker role"),
            "reviewer" => (REVIEWER_PROMPT, "The Reviewer role"),
            other => {
                return Err(McpError::invalid_params(
                    format!("unknown prompt {other:?}; prompts are: worker, reviewer"),
                    None,
                ));
            }
        };
        Ok(
            GetPromptResult::new(vec![PromptMessage::new_text(rmcp::model::Role::User, text)])
                .with_description(desc)
                .into(),
        )
    }

    // The next five answer as rmcp's defaults do (nothing accepted, method not found) unless the
    // conformance fixtures are on.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        conformance_fixtures().then(|| requested.clone())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<CompleteResult, McpError> {
        if !conformance_fixtures() {
            return Err(McpError::method_not_found::<CompleteRequestMethod>());
        }
        Ok(conformance::complete(&request))
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        _request: SetLevelRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<(), McpError> {
        if !conformance_fixtures() {
            return Err(McpError::method_not_found::<SetLevelRequestMethod>());
        }
        Ok(())
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        _request: SubscribeRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<(), McpError> {
        if !conformance_fixtures() {
            return Err(McpError::method_not_found::<SubscribeRequestMethod>());
        }
        Ok(())
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        _request: UnsubscribeRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<(), McpError> {
        if !conformance_fixtures() {
            return Err(McpError::method_not_found::<UnsubscribeRequestMethod>());
        }
        Ok(())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<GetTaskResult, McpError> {
        self.owned_task(&request.task_id, &ctx.extensions)?;
        Ok(GetTaskResult::new(
            self.shared.tasks.get_task(&request.task_id)?,
        ))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<(), McpError> {
        self.owned_task(&request.task_id, &ctx.extensions)?;
        self.shared
            .tasks
            .update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> std::result::Result<(), McpError> {
        self.owned_task(&request.task_id, &ctx.extensions)?;
        self.shared.tasks.cancel_task(&request.task_id)
    }
}

mod conformance;

/// Whether this process serves the official MCP conformance suite's fixture tools, resources and
/// prompts (`conformance`) beside rsim's own. Only the `rsim-conformance` test binary
/// (`tests/mcp/rsim-conformance.rs`) turns them on, before anything is served; `rsim` never does,
/// and no flag, setting or environment variable can.
static CONFORMANCE_FIXTURES: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Serve the conformance suite's fixtures in this process (the `rsim-conformance` test binary).
pub fn enable_conformance_fixtures() {
    CONFORMANCE_FIXTURES.store(true, std::sync::atomic::Ordering::SeqCst);
}

fn conformance_fixtures() -> bool {
    CONFORMANCE_FIXTURES.load(std::sync::atomic::Ordering::Relaxed)
}

/// `rsim mcp`: serve one agent over stdio until the client closes it.
pub fn serve_stdio(study: &Path, caller: Caller, opts: Options) -> Result<()> {
    let rt = runtime()?;
    rt.block_on(async move {
        let shared = Shared::open(study, opts)?;
        tracing::info!(agent = %caller.agent, role = %caller.role, "serving MCP on stdio");
        let server = Server::new(shared, Some(caller));
        let (transport, writer) = stdio::checked(tokio::io::stdin(), tokio::io::stdout());
        let running = rmcp::ServiceExt::serve(server, transport)
            .await
            .map_err(|e| Error::internal(format!("MCP stdio: {e}")))?;
        let done = running.waiting().await;
        // The last answers are still between rmcp and stdout: let them out.
        let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
        done.map_err(|e| Error::internal(format!("MCP stdio: {e}")))?;
        Ok(())
    })
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::internal(format!("cannot start the async runtime: {e}")))
}
