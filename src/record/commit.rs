//! The commit protocol: the one way anything is written into the record.
//!
//! pending marker in the index → commit built in the object database → compare-and-swap of the
//! node's branch (create against "absent", append against the tip the action was prepared on) →
//! index sync. A lost race re-reads the tip and prepares again, with a growing random pause, until
//! a deadline; only then does a writer see `conflict`, and then nothing was written. Within one
//! process the protocol runs one write at a time, so the process's own writers never race each
//! other for a node id or a tip (across processes the compare-and-swap guards).
//!
//! Invariant: the only caller of `Record::create_node` / `Record::append` and of the index's
//! `mark_pending` / `sync_node`. Knows the record and the index, never the policy or a face.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use git2::Oid;
use serde_json::Value;

use crate::model::{
    ActionName, ActionRecord, ArtifactKind, ArtifactRef, Caller, Decision, JobRecord, MetricRecord,
    NodeMeta, NodeStatus, now_rfc3339,
};
use crate::record::index::Index;
use crate::record::{self, Append, Create, NodeSnapshot, Record, TreeFile};
use crate::util::error::{Error, Result};

/// How long a writer keeps retrying a lost compare-and-swap before answering `conflict`.
pub const CONFLICT_DEADLINE: Duration = Duration::from_secs(20);

/// This process's writes, one at a time.
static WRITES: Mutex<()> = Mutex::new(());

/// What an action records once it has seen the node's current tip.
pub struct Prepared {
    pub summary: String,
    pub body: String,
    pub decision: Decision,
    pub result: Option<Value>,
    pub job: Option<JobRecord>,
    pub artifacts: Vec<ArtifactRef>,
    pub metrics: Vec<MetricRecord>,
    pub refers_to: Vec<String>,
    /// A new `node.toml` (conclude).
    pub meta: Option<NodeMeta>,
    pub files: Vec<TreeFile>,
}

impl Prepared {
    pub fn accepted(summary: String, result: Value) -> Self {
        Prepared {
            summary,
            body: String::new(),
            decision: Decision::accept(),
            result: Some(result),
            job: None,
            artifacts: Vec::new(),
            metrics: Vec::new(),
            refers_to: Vec::new(),
            meta: None,
            files: Vec::new(),
        }
    }

    pub fn rejected(decision: Decision) -> Self {
        Prepared {
            summary: format!("rejected by {}", decision.rule.clone().unwrap_or_default()),
            body: decision.reason.clone().unwrap_or_default(),
            decision,
            result: None,
            ..Prepared::accepted(String::new(), Value::Null)
        }
    }

    /// Record the job that ran for this action, with its log as an artifact.
    pub fn attach_job(&mut self, job: &JobRecord) {
        if let Some(l) = &job.log {
            self.artifacts.push(ArtifactRef {
                sha256: l.clone(),
                kind: ArtifactKind::Log,
                name: format!("{}.log", job.id),
                parent: None,
            });
        }
        self.job = Some(job.clone());
    }
}

/// A new node's first action, as the protocol asks for it once it knows the node's id.
pub struct FirstAction {
    pub meta: NodeMeta,
    pub record: ActionRecord,
    pub body: String,
}

/// Which id a new node gets.
pub enum NodeId {
    /// The next free `nK` from K = this number on (another writer's node moves it on).
    Allocate(u64),
    /// Exactly this id (the root node at genesis); taken means conflict.
    Exactly(String),
}

/// Writes actions into the record with the protocol above.
pub struct Writer<'a> {
    pub record: &'a Record,
    pub index: &'a Index,
}

/// Retry pacing: a random pause that grows with the attempt (0.2–2 ms at first, up to ~50 ms).
struct Pacer {
    attempt: u32,
    started: Instant,
}

impl Pacer {
    fn new() -> Self {
        Pacer {
            attempt: 0,
            started: Instant::now(),
        }
    }
    /// Pause before the next attempt; false once the deadline has passed.
    fn again(&mut self) -> bool {
        if self.started.elapsed() >= CONFLICT_DEADLINE {
            return false;
        }
        self.attempt += 1;
        let cap_us = 2_000u64
            .saturating_mul(1 << self.attempt.min(5))
            .min(50_000);
        std::thread::sleep(Duration::from_micros(200 + rand::random::<u64>() % cap_us));
        if self.attempt == 16 {
            tracing::info!("another writer holds the record; retrying (nothing written yet)");
        }
        true
    }
}

impl Writer<'_> {
    /// Append one action to `node`; `prepare` sees the tip it will be appended to and runs again
    /// after a lost race. Returns the commit id and the recorded action.
    pub fn append(
        &self,
        node: &str,
        caller: &Caller,
        action: ActionName,
        request: &Value,
        mut prepare: impl FnMut(&NodeSnapshot) -> Result<Prepared>,
    ) -> Result<(String, ActionRecord)> {
        let _one = WRITES.lock().unwrap_or_else(|e| e.into_inner());
        let mut pacer = Pacer::new();
        loop {
            let tip = self
                .record
                .node_tip(node)?
                .ok_or_else(|| Error::not_found(format!("node: no node {node} in this study")))?;
            let snap = self.record.snapshot(tip)?;
            let p = prepare(&snap)?;
            let rec = ActionRecord {
                seq: snap.action_count + 1,
                action,
                node: node.to_string(),
                agent: caller.agent.clone(),
                role: caller.role,
                at: now_rfc3339(),
                summary: p.summary,
                request: request.clone(),
                decision: p.decision,
                result: p.result,
                job: p.job,
                artifacts: p.artifacts,
                metrics: p.metrics,
                refers_to: p.refers_to,
            };
            let msg = record::commit_message(&rec, &p.body, &[]);
            self.index.mark_pending(node)?;
            match self
                .record
                .append(node, snap.tip, &rec, p.meta.as_ref(), &p.files, &msg)?
            {
                Append::Committed(oid) => {
                    self.index.sync_node(self.record, node)?;
                    return Ok((oid.to_string(), rec));
                }
                Append::Stale => {
                    if !pacer.again() {
                        return Err(Error::conflict(format!(
                            "node {node}: other writers kept moving the node for {} s; nothing was recorded",
                            CONFLICT_DEADLINE.as_secs()
                        )));
                    }
                }
            }
        }
    }

    /// Create a node whose first commit has `parent_tips` as git parents (two parents: a merge).
    /// `first` builds the node and its first action for the id the protocol is trying.
    pub fn create(
        &self,
        id: NodeId,
        parent_tips: &[Oid],
        parents: &[String],
        mut first: impl FnMut(&str) -> Result<FirstAction>,
    ) -> Result<(String, Oid)> {
        let _one = WRITES.lock().unwrap_or_else(|e| e.into_inner());
        let mut pacer = Pacer::new();
        let (mut num, exact) = match id {
            NodeId::Allocate(n) => (n, None),
            NodeId::Exactly(id) => (0, Some(id)),
        };
        loop {
            let id = exact.clone().unwrap_or_else(|| format!("n{num}"));
            let f = first(&id)?;
            debug_assert_eq!(f.meta.id, id);
            debug_assert_eq!(f.meta.status, NodeStatus::Open);
            let msg = record::commit_message(&f.record, &f.body, parents);
            self.index.mark_pending(&id)?;
            match self
                .record
                .create_node(&f.meta, &f.record, parent_tips, &msg)?
            {
                Create::Created(commit) => {
                    self.index.sync_node(self.record, &id)?;
                    return Ok((id, commit));
                }
                Create::Taken if exact.is_some() => {
                    self.index.sync_node(self.record, &id)?;
                    return Err(Error::conflict(format!("node {id} already exists")));
                }
                Create::Taken => {
                    // Another writer took this id: the index may lag, so step past it.
                    self.index.sync_node(self.record, &id)?;
                    num += 1;
                }
                Create::Busy => {
                    if !pacer.again() {
                        return Err(Error::conflict(format!(
                            "could not create node {id}: other writers held it for {} s; nothing was recorded",
                            CONFLICT_DEADLINE.as_secs()
                        )));
                    }
                }
            }
        }
    }
}
