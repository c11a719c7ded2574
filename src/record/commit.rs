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
use crate::record::index::{Index, OwnWrite};
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

/// Times a write looks again for a git object it was told is missing (`missing_object`).
const MISSED_OBJECT_RETRIES: u32 = 3;

/// A git object that a branch or a tree names was not found. Another process's pack merge can
/// hide it from one scan of the pack directory: the merged pack is renamed in and the packs it
/// replaces removed while the scan runs, and a directory listing may miss an entry added during
/// it (POSIX leaves that open), so the scan sees neither. libgit2 scans once more on a miss; the
/// write looks again a few times, after a pause, before it answers with the error.
fn missing_object(e: &Error) -> bool {
    // libgit2's words, perhaps behind where they were met ("commit …: git: …").
    e.kind == crate::util::error::ErrorKind::Internal
        && (e.message.starts_with("git: object not found")
            || e.message.contains(": git: object not found"))
}

/// Writes actions into the record with the protocol above.
pub struct Writer<'a> {
    record: &'a Record,
    index: &'a Index,
    deadline: Duration,
}

/// Retry pacing: a random pause that grows with the attempt (0.2–2 ms at first, up to ~50 ms).
struct Pacer {
    attempt: u32,
    started: Instant,
    deadline: Duration,
}

impl Pacer {
    fn new(deadline: Duration) -> Self {
        Pacer {
            attempt: 0,
            started: Instant::now(),
            deadline,
        }
    }
    /// Pause before the next attempt; false once the deadline has passed.
    fn again(&mut self) -> bool {
        if self.started.elapsed() >= self.deadline {
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

impl<'a> Writer<'a> {
    pub fn new(record: &'a Record, index: &'a Index) -> Self {
        Writer {
            record,
            index,
            deadline: CONFLICT_DEADLINE,
        }
    }

    /// Whether a step that failed with `e` before anything landed is worth another try: a
    /// missing object (`missing_object`), at most `MISSED_OBJECT_RETRIES` times, after a rescan.
    fn look_again(&self, missed: &mut u32, e: &Error) -> bool {
        if *missed >= MISSED_OBJECT_RETRIES || !missing_object(e) {
            return false;
        }
        *missed += 1;
        self.record.rescan_objects(e);
        true
    }

    /// How long to keep retrying a lost compare-and-swap (tests use a short one).
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Append one action to `node`; `prepare` sees the tip it will be appended to and runs again
    /// after a lost race. Returns the commit id and the recorded action.
    #[tracing::instrument(level = "trace", name = "commit.append", skip_all)]
    pub fn append(
        &self,
        node: &str,
        caller: &Caller,
        action: ActionName,
        request: &Value,
        mut prepare: impl FnMut(&NodeSnapshot) -> Result<Prepared>,
    ) -> Result<(String, ActionRecord)> {
        let _one = WRITES.lock().unwrap_or_else(|e| e.into_inner());
        let mut pacer = Pacer::new(self.deadline);
        let mut missed = 0;
        loop {
            // Everything up to the branch's move: nothing has landed if it fails.
            let step = (|| {
                let tip = self.record.node_tip(node)?.ok_or_else(|| {
                    Error::not_found(format!("node: no node {node} in this study"))
                })?;
                refuse_unproven(self.record, node, tip)?;
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
                let landed =
                    self.record
                        .append(node, snap.tip, &rec, p.meta.as_ref(), &p.files, &msg)?;
                Ok((snap, p.meta, rec, landed))
            })();
            let (snap, meta, rec, landed) = match step {
                Err(e) if self.look_again(&mut missed, &e) => continue,
                step => step?,
            };
            match landed {
                Append::Committed(oid) => {
                    self.index.sync_own_write(
                        self.record,
                        &OwnWrite {
                            node,
                            parent: Some(snap.tip),
                            tip: oid,
                            meta: meta.as_ref(),
                            record: &rec,
                        },
                    )?;
                    self.record.remember_snapshot(NodeSnapshot {
                        tip: oid,
                        meta: meta.unwrap_or(snap.meta),
                        action_count: rec.seq,
                    });
                    return Ok((oid.to_string(), rec));
                }
                Append::Stale => {
                    if !pacer.again() {
                        return Err(Error::conflict(format!(
                            "node {node}: other writers kept moving the node for {:.1} s; nothing was recorded",
                            self.deadline.as_secs_f64()
                        )));
                    }
                }
            }
        }
    }

    /// Create a node whose first commit has `parent_tips` as git parents (two parents: a merge).
    /// `first` builds the node and its first action for the id the protocol is trying.
    #[tracing::instrument(level = "trace", name = "commit.create", skip_all)]
    pub fn create(
        &self,
        id: NodeId,
        parent_tips: &[Oid],
        parents: &[String],
        mut first: impl FnMut(&str) -> Result<FirstAction>,
    ) -> Result<(String, Oid)> {
        let _one = WRITES.lock().unwrap_or_else(|e| e.into_inner());
        for (i, tip) in parent_tips.iter().enumerate() {
            let name = parents.get(i).map_or("main", String::as_str);
            refuse_unproven(self.record, name, *tip)?;
        }
        let mut pacer = Pacer::new(self.deadline);
        let (mut num, exact) = match id {
            NodeId::Allocate(n) => (n, None),
            NodeId::Exactly(id) => (0, Some(id)),
        };
        let mut missed = 0;
        loop {
            let id = exact.clone().unwrap_or_else(|| format!("n{num}"));
            // Everything up to the branch's creation: nothing has landed if it fails.
            let step = (|| {
                let f = first(&id)?;
                debug_assert_eq!(f.meta.id, id);
                debug_assert_eq!(f.meta.status, NodeStatus::Open);
                let msg = record::commit_message(&f.record, &f.body, parents);
                self.index.mark_pending(&id)?;
                let made = self
                    .record
                    .create_node(&f.meta, &f.record, parent_tips, &msg)?;
                Ok((f, made))
            })();
            let (f, made) = match step {
                Err(e) if self.look_again(&mut missed, &e) => continue,
                step => step?,
            };
            match made {
                Create::Created(commit) => {
                    self.index.sync_own_write(
                        self.record,
                        &OwnWrite {
                            node: &id,
                            parent: None,
                            tip: commit,
                            meta: Some(&f.meta),
                            record: &f.record,
                        },
                    )?;
                    self.record.remember_snapshot(NodeSnapshot {
                        tip: commit,
                        meta: f.meta,
                        action_count: 1,
                    });
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
                            "could not create node {id}: other writers held it for {:.1} s; nothing was recorded",
                            self.deadline.as_secs_f64()
                        )));
                    }
                }
            }
        }
    }
}

/// Nothing is written on top of a commit this study cannot prove it wrote (history fetched in
/// or forged around rsim): the write is refused, naming the commit, and nothing is recorded.
fn refuse_unproven(record: &Record, node: &str, tip: git2::Oid) -> Result<()> {
    record.verify_commit(tip).map_err(|why| {
        Error::internal(format!(
            "{node}: {why}; this study's history stops being provable there, so nothing is written on it (`rsim fsck` names every such commit)"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Role, paths};
    use crate::util::error::ErrorKind;

    struct Fixture {
        _dir: tempfile::TempDir,
        root: std::path::PathBuf,
        record: Record,
        index: Index,
    }

    #[test]
    fn a_missing_object_is_told_apart_from_other_git_errors() {
        let d = tempfile::tempdir().expect("tempdir");
        let repo = git2::Repository::init(d.path()).expect("init");
        let absent = git2::Oid::from_str("0123456789abcdef0123456789abcdef01234567").expect("oid");
        // libgit2's own words for an object no pack or loose file holds (what a write looks
        // again for), read the two ways the record reads objects.
        let e: Error = repo
            .find_commit(absent)
            .map(drop)
            .expect_err("absent")
            .into();
        assert!(missing_object(&e), "{}", e.message);
        let e: Error = repo
            .odb()
            .and_then(|o| o.read(absent).map(drop))
            .expect_err("absent")
            .into();
        assert!(missing_object(&e), "{}", e.message);
        assert!(
            missing_object(&e.clone().context("commit 0123")),
            "{}",
            e.message
        );
        // A missing branch, or a node the request names, is not one.
        let e: Error = repo
            .refname_to_id("refs/heads/n7")
            .expect_err("no ref")
            .into();
        assert!(!missing_object(&e), "{}", e.message);
        assert!(!missing_object(&Error::not_found("node: no node n7")));
    }

    /// A record with `main` and a root node, written through the protocol itself.
    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_path_buf();
        let record = Record::init(&root).expect("git init");
        std::fs::create_dir_all(paths::state_dir(&root)).expect("state dir");
        let index = Index::open(&paths::index_path(&root)).expect("index");
        let main = record
            .commit_main(&[TreeFile::new("rsim.toml", "x")], "init")
            .expect("main");
        Writer::new(&record, &index)
            .create(NodeId::Exactly("n0".into()), &[main], &[], |id| {
                Ok(first(id, ActionName::Init))
            })
            .expect("genesis");
        Fixture {
            _dir: dir,
            root,
            record,
            index,
        }
    }

    fn owner() -> Caller {
        Caller::new("owner", Role::Owner)
    }

    fn first(id: &str, action: ActionName) -> FirstAction {
        FirstAction {
            meta: NodeMeta {
                id: id.into(),
                title: "t".into(),
                hypothesis: String::new(),
                parents: Vec::new(),
                status: NodeStatus::Open,
                created_at: now_rfc3339(),
                created_by: "owner".into(),
                outcome: None,
            },
            record: ActionRecord {
                seq: 1,
                action,
                node: id.into(),
                agent: "owner".into(),
                role: Role::Owner,
                at: now_rfc3339(),
                summary: "s".into(),
                request: Value::Null,
                decision: Decision::accept(),
                result: None,
                job: None,
                artifacts: Vec::new(),
                metrics: Vec::new(),
                refers_to: Vec::new(),
            },
            body: String::new(),
        }
    }

    fn append(f: &Fixture, w: &Writer<'_>) -> Result<(String, ActionRecord)> {
        w.append("n0", &owner(), ActionName::Compare, &Value::Null, |_| {
            Ok(Prepared::accepted("c".into(), Value::Null))
        })
        .inspect(|_| assert!(f.record.node_tip("n0").is_ok()))
    }

    #[test]
    fn a_held_branch_is_waited_out_and_the_action_lands_once() {
        let f = fixture();
        let lock = f.root.join(".git/refs/heads/rsim/n/n0.lock");
        std::fs::write(&lock, b"").expect("hold the ref");
        let release = {
            let lock = lock.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                std::fs::remove_file(lock).expect("release");
            })
        };
        let (_, rec) = append(&f, &Writer::new(&f.record, &f.index)).expect("lands");
        release.join().expect("thread");
        assert_eq!(rec.seq, 2);
        let tip = f.record.node_tip("n0").expect("tip").expect("n0");
        assert_eq!(f.record.snapshot(tip).expect("snap").action_count, 2);
        assert_eq!(f.index.node_actions("n0").expect("indexed").len(), 2);
    }

    #[test]
    fn a_lock_left_by_a_dead_writer_is_broken() {
        let f = fixture();
        let lock = f.root.join(".git/refs/heads/rsim/n/n0.lock");
        let file = std::fs::File::create(&lock).expect("lock");
        // Left behind long ago.
        file.set_modified(std::time::SystemTime::now() - Duration::from_secs(60))
            .expect("age the lock");
        drop(file);
        let (_, rec) = append(&f, &Writer::new(&f.record, &f.index)).expect("lands");
        assert_eq!(rec.seq, 2);
        assert!(!lock.exists());
    }

    #[test]
    fn a_conflict_past_the_deadline_writes_nothing() {
        let f = fixture();
        std::fs::write(f.root.join(".git/refs/heads/rsim/n/n0.lock"), b"").expect("hold");
        let tip = f.record.node_tip("n0").expect("tip");
        let w = Writer::new(&f.record, &f.index).with_deadline(Duration::from_millis(200));
        let e = append(&f, &w).expect_err("conflict");
        assert_eq!(e.kind, ErrorKind::Conflict, "{}", e.message);
        assert!(e.message.contains("nothing was recorded"), "{}", e.message);
        assert_eq!(
            f.record.node_tip("n0").expect("tip"),
            tip,
            "the branch did not move"
        );
        assert_eq!(f.index.node_actions("n0").expect("indexed").len(), 1);
    }

    #[test]
    fn a_taken_id_is_stepped_past_and_an_exact_id_is_a_conflict() {
        let f = fixture();
        let main = f.record.main_tip().expect("main");
        let w = Writer::new(&f.record, &f.index);
        // Ask for n0 (taken): allocation moves on to n1.
        let (id, _) = w
            .create(NodeId::Allocate(0), &[main], &[], |id| {
                Ok(first(id, ActionName::Branch))
            })
            .expect("created");
        assert_eq!(id, "n1");
        let e = w
            .create(NodeId::Exactly("n1".into()), &[main], &[], |id| {
                Ok(first(id, ActionName::Branch))
            })
            .expect_err("n1 exists");
        assert_eq!(e.kind, ErrorKind::Conflict);
    }
}
