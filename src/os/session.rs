//! The session layer every face uses (CLI, MCP, the orchestrator, the web page, and next LSP):
//! study handles shared by many callers, long jobs whose start the face learns about at once,
//! and the reads a face needs about jobs (progress, log, recorded result).
//!
//! Write serialisation and conflict retry are not here but one level down, where every write
//! passes: quick writes run one at a time per process (`Study::call`), and the commit protocol
//! (`record::commit`) retries a lost compare-and-swap until its deadline.
//!
//! Invariant: knows `Study` and the job runner seam, never a protocol (no rmcp, axum, clap, LSP).

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value;

use crate::jobs::{JobRunner, JobSpec, Reattach};
use crate::model::{Caller, JobRecord};
use crate::os::Study;
use crate::util::error::Result;

/// Told the job's id when the job starts.
type OnStarted = Box<dyn FnOnce(String) + Send>;

thread_local! {
    /// Set on the thread that runs a long action; the runner takes it when the job starts.
    static JOB_STARTED: RefCell<Option<OnStarted>> = const { RefCell::new(None) };
}

/// The study's configured runner (local or Slurm), telling whoever started the current action
/// which job it started, the moment it starts.
struct NotifyingRunner(Box<dyn JobRunner>);

impl JobRunner for NotifyingRunner {
    fn run(&self, spec: &JobSpec) -> Result<JobRecord> {
        if let Some(f) = JOB_STARTED.with(|h| h.borrow_mut().take()) {
            f(spec.id.clone());
        }
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
pub struct Session {
    root: PathBuf,
    idle: Mutex<Vec<(Study, Option<git2::Oid>)>>,
    /// The record-change ticker, started by the first `watch()`.
    watcher: std::sync::Arc<Mutex<Option<tokio::sync::watch::Sender<u64>>>>,
}

impl Session {
    /// Open a session on the study at `root`; fails now (not on the first call) if it is not one.
    pub fn open(root: &Path) -> Result<Session> {
        let s = Session {
            root: root.to_path_buf(),
            idle: Mutex::new(Vec::new()),
            watcher: Default::default(),
        };
        let one = s.open_one()?;
        s.put(one);
        Ok(s)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn open_one(&self) -> Result<(Study, Option<git2::Oid>)> {
        let s = Study::open_wrapping_runner(&self.root, |inner| Box::new(NotifyingRunner(inner)))?;
        let tip = s.main_tip();
        Ok((s, tip))
    }

    fn put(&self, s: (Study, Option<git2::Oid>)) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(s);
    }

    /// Run `f` on an idle study (opening one if none is idle). A study opened before the owner
    /// committed a new `rsim.toml` on main is reopened, so the config in force is always the
    /// committed one.
    pub fn with<T>(&self, f: impl FnOnce(&Study) -> Result<T>) -> Result<T> {
        let taken = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let s = match taken {
            Some((s, tip)) if s.main_tip() == tip => (s, tip),
            _ => self.open_one()?,
        };
        let r = f(&s.0);
        self.put(s);
        r
    }

    /// Run any action or query from its JSON arguments.
    pub fn call(&self, caller: &Caller, action: &str, args: Value) -> Result<Value> {
        self.with(|s| s.call(caller, action, args))
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
        self.with(|s| {
            JOB_STARTED.with(|h| *h.borrow_mut() = Some(Box::new(started)));
            let r = s.call(caller, action, args);
            JOB_STARTED.with(|h| h.borrow_mut().take());
            r
        })
    }

    /// A receiver that ticks (its value grows) whenever the record changes, whoever wrote it:
    /// this process, another rsim process, an MCP agent, `rsim run`. Every recorded action syncs
    /// the index, so the index's files changing is the signal; a thread polls their size and
    /// time every `WATCH_POLL` and stops when every receiver is gone.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<u64> {
        let mut slot = self.watcher.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = slot.as_ref() {
            return tx.subscribe();
        }
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let ticker = tx.clone();
        *slot = Some(tx);
        let shared = self.watcher.clone();
        let root = self.root.clone();
        let spawned = std::thread::Builder::new()
            .name("rsim-watch".into())
            .spawn(move || {
                let mut last = record_stamp(&root);
                loop {
                    std::thread::sleep(WATCH_POLL);
                    {
                        // Under the lock `watch()` subscribes under: no receiver can appear
                        // between this check and the thread's end.
                        let mut slot = shared.lock().unwrap_or_else(|e| e.into_inner());
                        if ticker.is_closed() {
                            *slot = None;
                            return;
                        }
                    }
                    let now = record_stamp(&root);
                    if now != last {
                        last = now;
                        ticker.send_modify(|v| *v += 1);
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the record watcher: {e}");
            *slot = None;
        }
        rx
    }
}

/// How often the watcher looks at the record.
pub const WATCH_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// Sizes and modification times of the index and its write-ahead log: they change with every
/// recorded action (the commit protocol syncs the index), in any process.
fn record_stamp(root: &Path) -> Vec<(u64, Option<std::time::SystemTime>)> {
    let index = crate::model::paths::index_path(root);
    let mut wal = index.clone().into_os_string();
    wal.push("-wal");
    [index, PathBuf::from(wal)]
        .iter()
        .map(|p| match std::fs::metadata(p) {
            Ok(m) => (m.len(), m.modified().ok()),
            Err(_) => (0, None),
        })
        .collect()
}
