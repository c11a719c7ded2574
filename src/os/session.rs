//! The session layer the serving faces use (MCP over stdio and HTTP, the web page, the LSP
//! server; the CLI and the orchestrator open a `Study` for their own callers): study handles
//! shared by many callers, long jobs whose start the face learns about at once, and the reads a
//! face needs about jobs (progress, log, recorded result).
//!
//! Write serialisation and conflict retry are not here but one level down, where every write
//! passes: quick writes run one at a time per process (`Study::call`), and the commit protocol
//! (`record::commit`) retries a lost compare-and-swap until its deadline.
//!
//! Invariant: knows `Study` and the job runner seam, never a protocol (no rmcp, axum, clap, LSP).

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use serde_json::Value;

use crate::jobs::{JobRunner, JobSpec, Reattach};
use crate::model::{Caller, JobRecord, paths};
use crate::os::Study;
use crate::record::index::Changes;
use crate::util::error::Result;

/// Told the job's id when the job starts.
type OnStarted = Box<dyn FnOnce(String) + Send>;

thread_local! {
    /// Set on the thread that runs a long action; the runner takes it when the job starts.
    static JOB_STARTED: RefCell<Option<OnStarted>> = const { RefCell::new(None) };
}

/// Tell whoever started the current long action (on this thread) its job's id, once: when the
/// job starts, or earlier, when it starts waiting in the admission queue.
pub(crate) fn announce_job(id: &str) {
    if let Some(f) = JOB_STARTED.with(|h| h.borrow_mut().take()) {
        f(id.to_string());
    }
}

/// The study's configured runner (local or Slurm), telling whoever started the current action
/// which job it started, the moment it starts.
struct NotifyingRunner(Box<dyn JobRunner>);

impl JobRunner for NotifyingRunner {
    fn run(&self, spec: &JobSpec) -> Result<JobRecord> {
        announce_job(&spec.id);
        self.0.run(spec)
    }
    fn cancel(&self, job_dir: &Path, by: &str) -> Result<()> {
        self.0.cancel(job_dir, by)
    }
    fn reattach(&self, job_dir: &Path, block: bool) -> Result<Reattach> {
        self.0.reattach(job_dir, block)
    }
    fn stop_orphan(&self, job_dir: &Path, job: &str) {
        self.0.stop_orphan(job_dir, job)
    }
}

/// Open studies, one per concurrent caller (a `Study` holds a SQLite connection and is not
/// `Sync`). Studies on different threads and in different processes write safely: the commit
/// protocol records with git compare-and-swap.
///
/// How many are open is bounded, whatever a client sends: at most `MAX_QUICK` callers hold one
/// for a quick call (a query, a write that starts no job) and `MAX_LONG` for an action that runs a
/// job to its end; the next caller of a kind waits for one of its kind to finish. A client that
/// pipes thousands of requests down one connection without reading the answers is served
/// `MAX_QUICK` at a time: the session's memory, threads' studies and open files stay bounded (an
/// unbounded pool opened a study for each request in flight: 1.5 GB and 544 open files for
/// 15,000 requests, and a process out of file descriptors misread its own record). A call made
/// while the thread already holds a study (a nested one) is never made to wait on itself.
pub struct Session {
    root: PathBuf,
    pool: Mutex<Pool>,
    /// Signalled when a study is given back.
    freed: Condvar,
    /// The record-change watcher, started by the first `watch`; its thread ends with the session.
    changes: Mutex<Option<Arc<tokio::sync::watch::Sender<u64>>>>,
    /// Why the study is read-only here (a clone without its key), if it is.
    read_only: Option<String>,
}

/// Callers holding a study for a quick call at once (see `Session`).
pub const MAX_QUICK: usize = 16;

/// Callers holding a study through a job's run at once (see `Session`).
pub const MAX_LONG: usize = 64;

/// Idle studies a session keeps for the next caller; more are closed when given back.
const MAX_IDLE: usize = MAX_QUICK;

/// The session's studies: the idle ones, and how many callers of each kind hold one.
#[derive(Default)]
struct Pool {
    idle: Vec<(Study, Option<git2::Oid>)>,
    quick: usize,
    long: usize,
}

/// What a caller holds a study for.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Quick,
    Long,
    /// While the thread already holds one: never waits.
    Nested,
}

thread_local! {
    /// Whether this thread holds one of a session's studies now.
    static HOLDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A study held by a caller: given back when the call ends, also by a panic (then closed, not
/// kept), so a failed call never holds one of the bound's places.
struct Held<'a> {
    session: &'a Session,
    kind: Kind,
    study: Option<(Study, Option<git2::Oid>)>,
    /// Whether the thread held one before (a nested call).
    nested: bool,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        HOLDING.with(|h| h.set(self.nested));
        let s = self.study.take().filter(|_| !std::thread::panicking());
        self.session.give_back(self.kind, s);
    }
}

/// How often the watcher asks the index whether it changed. One `PRAGMA data_version` a poll:
/// its cost does not grow with the study (see `record::index::Changes`).
pub const WATCH_POLL: Duration = Duration::from_millis(200);

impl Session {
    /// Open a session on the study at `root`; fails now (not on the first call) if it is not one.
    pub fn open(root: &Path) -> Result<Session> {
        let mut s = Session {
            root: root.to_path_buf(),
            pool: Mutex::new(Pool::default()),
            freed: Condvar::new(),
            changes: Mutex::new(None),
            read_only: None,
        };
        let one = s.open_one()?;
        s.read_only = one.0.read_only().map(str::to_string);
        s.lock().idle.push(one);
        Ok(s)
    }

    /// Why the study is read-only here (every write is refused), if it is: faces serve it as an
    /// observer.
    pub fn read_only(&self) -> Option<&str> {
        self.read_only.as_deref()
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn open_one(&self) -> Result<(Study, Option<git2::Oid>)> {
        let s = Study::open_wrapping_runner(&self.root, |inner| Box::new(NotifyingRunner(inner)))?;
        let tip = s.main_tip();
        Ok((s, tip))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A study for a caller of `kind`: an idle one, else a new one, once fewer than the kind's
    /// bound hold one (waiting until then).
    fn take(&self, kind: Kind) -> Result<(Study, Option<git2::Oid>)> {
        let mut p = self.lock();
        loop {
            let (held, cap) = match kind {
                Kind::Quick => (p.quick, MAX_QUICK),
                Kind::Long => (p.long, MAX_LONG),
                Kind::Nested => (0, 1),
            };
            if held < cap {
                break;
            }
            p = self.freed.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        match kind {
            Kind::Quick => p.quick += 1,
            Kind::Long => p.long += 1,
            Kind::Nested => {}
        }
        let taken = p.idle.pop();
        drop(p);
        let s = match taken {
            // After a few pack merges the handle reopens: libgit2 holds on to every pack it
            // loaded, merged away or not (`record::packs`).
            Some((s, tip)) if s.main_tip() == tip && s.packs_merged_since_open() < 4 => {
                Ok((s, tip))
            }
            _ => self.open_one(),
        };
        if s.is_err() {
            self.give_back(kind, None);
        }
        s
    }

    /// A caller of `kind` is done (with its study, to keep for the next, if any).
    fn give_back(&self, kind: Kind, s: Option<(Study, Option<git2::Oid>)>) {
        let mut p = self.lock();
        match kind {
            Kind::Quick => p.quick -= 1,
            Kind::Long => p.long -= 1,
            Kind::Nested => {}
        }
        if let Some(s) = s
            && p.idle.len() < MAX_IDLE
        {
            p.idle.push(s);
        }
        drop(p);
        self.freed.notify_all();
    }

    /// Run `f` on a study of the session, holding it as `kind` (a nested call as `Nested`).
    fn hold<T>(&self, kind: Kind, f: impl FnOnce(&Study) -> Result<T>) -> Result<T> {
        let nested = HOLDING.with(|h| h.get());
        let kind = if nested { Kind::Nested } else { kind };
        let held = Held {
            session: self,
            kind,
            study: Some(self.take(kind)?),
            nested,
        };
        HOLDING.with(|h| h.set(true));
        f(&held.study.as_ref().expect("held until dropped").0)
    }

    /// Run `f` on an idle study (opening one if none is idle), once fewer than `MAX_QUICK`
    /// callers hold one. A study opened before the owner committed a new `rsim.toml` on main is
    /// reopened, so the config in force is always the committed one.
    pub fn with<T>(&self, f: impl FnOnce(&Study) -> Result<T>) -> Result<T> {
        self.hold(Kind::Quick, f)
    }

    /// Run any action or query from its JSON arguments.
    /// An action that runs a job (`run_sft`, `evaluate`, `reproduce`) holds its study as a long
    /// call, so jobs started from any face never take the quick calls' places.
    pub fn call(&self, caller: &Caller, action: &str, args: Value) -> Result<Value> {
        let job = crate::api::schema::spec(action)
            .is_some_and(|a| a.kind == crate::api::actions::Kind::Job);
        let kind = if job { Kind::Long } else { Kind::Quick };
        self.hold(kind, |s| s.call(caller, action, args))
    }

    /// Run an action that may start a job (`run_sft`, `evaluate`) to its end, calling `started`
    /// with the job's id the moment the job starts (not called if the action ends without one,
    /// e.g. refused by the policy). Blocking: faces run it on a worker thread.
    pub fn run_long(
        &self,
        caller: &Caller,
        action: &str,
        args: Value,
        started: impl FnOnce(String) + Send + 'static,
    ) -> Result<Value> {
        self.hold(Kind::Long, |s| {
            JOB_STARTED.with(|h| *h.borrow_mut() = Some(Box::new(started)));
            let r = s.call(caller, action, args);
            JOB_STARTED.with(|h| h.borrow_mut().take());
            r
        })
    }

    /// A receiver that ticks (its value counts changes) whenever the record changes, whoever wrote
    /// it: this process, another `rsim` process, an MCP agent, `rsim run`. The index is synced by
    /// the commit protocol with every recorded action, so one thread per session polls it every
    /// `WATCH_POLL` on a read-only connection of its own; claims and holds of writers in flight
    /// move it too (a job admitted ticks before its action is recorded), so a tick means "look
    /// again", never "exactly one action". Ticks that come faster than a receiver reads coalesce.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<u64> {
        let mut slot = self.changes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = slot.as_ref() {
            return tx.subscribe();
        }
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let tx = Arc::new(tx);
        let weak = Arc::downgrade(&tx);
        let index = paths::index_path(&self.root);
        // The first reading is taken now, so a write right after `watch` returns is seen.
        let first = Changes::open(&index).and_then(|c| {
            let v = c.version()?;
            Ok((c, v))
        });
        let first = first
            .map_err(|e| tracing::warn!("watch: cannot read the index: {e}"))
            .ok();
        let spawned = std::thread::Builder::new()
            .name("rsim-watch".into())
            .spawn(move || poll_changes(&index, first, &weak));
        if let Err(e) = spawned {
            tracing::warn!("the record-change watcher could not start: {e}");
        }
        *slot = Some(tx);
        rx
    }
}

/// The watcher's loop: ends when the session (the only strong owner of the sender) is dropped.
/// An index that cannot be opened or read (being rebuilt, removed) is retried each poll, and
/// reopening it ticks once (what changed meanwhile is unknown).
fn poll_changes(
    index: &Path,
    first: Option<(Changes, i64)>,
    tx: &Weak<tokio::sync::watch::Sender<u64>>,
) {
    let (mut changes, mut last) = match first {
        Some((c, v)) => (Some(c), Some(v)),
        None => (None, None),
    };
    loop {
        std::thread::sleep(WATCH_POLL);
        let Some(tx) = tx.upgrade() else { return };
        if changes.is_none() {
            changes = Changes::open(index)
                .map_err(|e| tracing::debug!("watch: cannot open the index: {e}"))
                .ok();
        }
        let Some(c) = changes.as_ref() else { continue };
        match c.version() {
            Ok(v) => {
                if last != Some(v) {
                    tx.send_modify(|n| *n += 1);
                }
                last = Some(v);
            }
            Err(e) => {
                tracing::debug!("watch: cannot read the index: {e}");
                changes = None;
                last = None;
            }
        }
    }
}
