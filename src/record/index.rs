//! The SQLite index: a derived, disposable view of the git record for fast queries.
//! `sync_node` brings one node up to date with its branch (idempotent, order independent);
//! `rebuild` recreates everything from git alone. Before a writer moves a branch it marks the
//! node pending here (a marker it keeps while it lives), so a writer killed between the git
//! commit and the index update is repaired the next time the study is opened.

use std::path::Path;
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::model::{
    ActionName, ActionRecord, ArtifactKind, JobRecord, NodeMeta, NodeStatus, Role, Verdict,
};
use crate::record::Record;
use crate::util::error::Result;

/// `Connection::execute` through the connection's cache of prepared statements: the statements
/// every write runs are parsed once per handle, not once per write.
pub(crate) trait ExecCached {
    fn exec_cached<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
    /// `Connection::query_row` through the same cache.
    fn query_row_cached<T, P: rusqlite::Params>(
        &self,
        sql: &str,
        params: P,
        f: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T>;
}

impl ExecCached for Connection {
    fn exec_cached<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn query_row_cached<T, P: rusqlite::Params>(
        &self,
        sql: &str,
        params: P,
        f: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

/// The tables derived from the record (a rebuild empties and refills them); the others are the
/// index's own bookkeeping (pending markers, holds, claims, the queue, rates, refusals).
pub const RECORD_TABLES: [&str; 10] = [
    "nodes",
    "node_parents",
    "actions",
    "metrics",
    "kept",
    "suspect",
    "jobs",
    "artifacts",
    "datasets",
    "agents",
];

/// How many prepared statements a handle keeps (rusqlite's default, 16, is fewer than one
/// write runs).
const STATEMENT_CACHE: usize = 128;

const SCHEMA_VERSION: &str = "7";

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes(
  id TEXT PRIMARY KEY, num INTEGER NOT NULL, title TEXT NOT NULL, hypothesis TEXT NOT NULL,
  status TEXT NOT NULL, outcome TEXT, created_at TEXT NOT NULL, created_by TEXT NOT NULL,
  tip TEXT NOT NULL, action_count INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS nodes_num ON nodes(num);
CREATE TABLE IF NOT EXISTS node_parents(node TEXT NOT NULL, parent TEXT NOT NULL, ord INTEGER NOT NULL,
  node_num INTEGER NOT NULL, parent_num INTEGER NOT NULL, PRIMARY KEY(node, ord)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS node_parents_parent ON node_parents(parent);
CREATE TABLE IF NOT EXISTS actions(
  node TEXT NOT NULL, seq INTEGER NOT NULL, action TEXT NOT NULL, decision TEXT NOT NULL, rule TEXT,
  reason TEXT, agent TEXT NOT NULL, role TEXT NOT NULL, at TEXT NOT NULL, summary TEXT NOT NULL,
  commit_oid TEXT NOT NULL, job TEXT, record TEXT NOT NULL, PRIMARY KEY(node, seq));
CREATE INDEX IF NOT EXISTS actions_at ON actions(at);
CREATE INDEX IF NOT EXISTS actions_rejected ON actions(agent, rule) WHERE decision='rejected';
CREATE TABLE IF NOT EXISTS metrics(
  node TEXT NOT NULL, seq INTEGER NOT NULL, name TEXT NOT NULL, value REAL NOT NULL, task TEXT NOT NULL,
  split TEXT NOT NULL, checkpoint TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS metrics_node ON metrics(node);
CREATE INDEX IF NOT EXISTS metrics_name ON metrics(task, split, name);
CREATE TABLE IF NOT EXISTS jobs(
  id TEXT PRIMARY KEY, node TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, state TEXT NOT NULL,
  exit_code INTEGER, started_at TEXT NOT NULL, finished_at TEXT NOT NULL, duration_s REAL NOT NULL,
  env TEXT NOT NULL, log TEXT, error TEXT, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS artifacts(
  sha256 TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL, node TEXT NOT NULL, seq INTEGER NOT NULL,
  parent TEXT, PRIMARY KEY(sha256, node, seq, kind, name));
CREATE INDEX IF NOT EXISTS artifacts_sha ON artifacts(sha256);
CREATE TABLE IF NOT EXISTS kept(
  node TEXT NOT NULL, seq INTEGER NOT NULL, step INTEGER NOT NULL, sha256 TEXT NOT NULL,
  PRIMARY KEY(node, seq, step)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kept_sha ON kept(node, sha256);
CREATE TABLE IF NOT EXISTS suspect(
  node TEXT NOT NULL, seq INTEGER NOT NULL, checkpoint TEXT NOT NULL, PRIMARY KEY(node, seq)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS suspect_ck ON suspect(checkpoint);
CREATE TABLE IF NOT EXISTS datasets(
  name TEXT PRIMARY KEY, sha256 TEXT NOT NULL, node TEXT NOT NULL, seq INTEGER NOT NULL, rows INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS agents(
  id TEXT PRIMARY KEY, role TEXT NOT NULL, first_seen TEXT NOT NULL, last_seen TEXT NOT NULL,
  actions INTEGER NOT NULL, rejected INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS pending(node TEXT NOT NULL, pid INTEGER NOT NULL, writer TEXT NOT NULL,
  PRIMARY KEY(node, writer));
CREATE TABLE IF NOT EXISTS refusals(agent TEXT NOT NULL, digest TEXT NOT NULL, count INTEGER NOT NULL,
  recorded INTEGER NOT NULL, recorded_at REAL NOT NULL, PRIMARY KEY(agent, digest)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rates(agent TEXT PRIMARY KEY, window_start REAL NOT NULL, calls INTEGER NOT NULL,
  throttled INTEGER NOT NULL) WITHOUT ROWID;
"#;

/// The one rule for which scores are a node's results: a score of a checkpoint that one of the
/// node's own runs kept part-way through (`eval_every`) is that run's trend, not a result. Every
/// query of results (means, bests, a node's results) applies this clause to `metrics`.
const RESULTS_ONLY: &str =
    "NOT EXISTS (SELECT 1 FROM kept k WHERE k.node=metrics.node AND k.sha256=metrics.checkpoint)";

/// The one rule for which scores may be ranked. A dev evaluation the dev tripwire found
/// significantly above its hidden twin (`evidence_suspect`) makes its *checkpoint* suspect: that
/// evidence may have been bought. No score of a suspect checkpoint is ranked, on whichever node
/// it was recorded (a bought checkpoint cannot be laundered through another node, and scoring it
/// on a rival's node costs the rival nothing), and no score of a node that *produced* a suspect
/// checkpoint is ranked (its evidence is suspect). Every query that ranks — the leaderboard, the
/// summary's and the overview's best node, compare's means — applies it with `RESULTS_ONLY`; the
/// scores are still shown, marked.
const RANKABLE: &str = "NOT EXISTS (SELECT 1 FROM suspect s WHERE s.checkpoint=metrics.checkpoint)
   AND metrics.node NOT IN (SELECT a.node FROM artifacts a JOIN suspect s ON s.checkpoint=a.sha256
                            WHERE a.kind='checkpoint')";

/// Nodes whose evidence is suspect: those that produced (trained, or hold as base) a checkpoint
/// a dev evaluation found significantly above the hidden dev twin.
const SUSPECT_NODES: &str =
    "SELECT DISTINCT a.node FROM artifacts a JOIN suspect s ON s.checkpoint=a.sha256
   WHERE a.kind='checkpoint'";

/// A node as the index knows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct NodeRow {
    pub id: String,
    pub num: i64,
    pub title: String,
    pub hypothesis: String,
    pub status: NodeStatus,
    pub outcome: Option<String>,
    pub created_at: String,
    pub created_by: String,
    pub tip: String,
    pub action_count: u32,
    pub parents: Vec<String>,
}

/// One action row. Its record is the recorded one less an inline dataset's rows
/// (`request.source.rows`): those are in the object store under the result's sha256 and whole in
/// git, and reading them back here made every reader of many actions (the audit, the overview,
/// `diff`) hold megabytes per `register_dataset` an agent wrote.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ActionRow {
    pub node: String,
    pub seq: u32,
    pub commit: String,
    pub record: ActionRecord,
}

/// What a line of `log` or `get_node` shows of an action: the index's own columns, written from
/// the record when it was synced, so no record text is read (a `register_dataset` request can
/// carry megabytes of inline rows).
#[derive(Debug, Clone, PartialEq)]
pub struct ActionHeadRow {
    pub node: String,
    pub seq: u32,
    pub commit: String,
    pub action: ActionName,
    pub decision: Verdict,
    pub rule: Option<String>,
    pub reason: Option<String>,
    pub agent: String,
    pub role: Role,
    pub at: String,
    pub summary: String,
    pub job: Option<String>,
}

/// The columns `ActionHeadRow` is read from, in its order. Their text is cut (`…` marks a cut)
/// to many times what rsim itself writes: a cloned repository's record may carry megabytes in
/// any of them, and `log` always answers with at least one line.
const HEAD_COLUMNS: &str = "node,seq,commit_oid,action,decision,\
    CASE WHEN length(rule)>200 THEN substr(rule,1,200)||'…' ELSE rule END,\
    CASE WHEN length(reason)>4000 THEN substr(reason,1,4000)||'…' ELSE reason END,\
    CASE WHEN length(agent)>200 THEN substr(agent,1,200)||'…' ELSE agent END,\
    role,at,\
    CASE WHEN length(summary)>1000 THEN substr(summary,1,1000)||'…' ELSE summary END,\
    job";

fn head_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ActionHeadRow> {
    // The index writes these from parsed records: a value it cannot read back is a damaged index.
    fn known<T>(i: usize, v: Option<T>, text: &str) -> rusqlite::Result<T> {
        v.ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                i,
                rusqlite::types::Type::Text,
                format!("not a known value: {:?}", crate::util::text::display(text)).into(),
            )
        })
    }
    let action: String = r.get(3)?;
    let decision: String = r.get(4)?;
    let role: String = r.get(8)?;
    Ok(ActionHeadRow {
        node: r.get(0)?,
        seq: r.get(1)?,
        commit: r.get(2)?,
        action: known(3, ActionName::parse(&action), &action)?,
        decision: known(
            4,
            [Verdict::Accepted, Verdict::Rejected]
                .into_iter()
                .find(|v| v.as_str() == decision),
            &decision,
        )?,
        rule: r.get(5)?,
        reason: r.get(6)?,
        agent: r.get(7)?,
        role: known(8, Role::parse(&role), &role)?,
        at: r.get(9)?,
        summary: r.get(10)?,
        job: r.get(11)?,
    })
}

/// What whole-record readers get of a record: all of it less an inline dataset's rows.
const WHOLE_RECORD: &str = "json_remove(record,'$.request.source.rows')";

/// Parse a record column as it is read (the text borrowed from SQLite, never copied).
fn parse_record(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<ActionRecord> {
    let text = r.get_ref(i)?.as_str()?;
    serde_json::from_str(text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// The filter and order of a page of actions (`actions_page`, `action_heads_page`).
const PAGE_TAIL: &str = "FROM actions
     WHERE (?1 IS NULL OR node=?1) AND (?2 OR decision='accepted')
       AND (?4 IS NULL OR (at, length(node), node, seq) < (?4, length(?5), ?5, ?6))
     ORDER BY at DESC, length(node) DESC, node DESC, seq DESC LIMIT ?3";

/// The filter and order of one node's actions (`node_actions`, `node_action_heads`).
const NODE_TAIL: &str = "FROM actions WHERE node=?1
     AND (?2 IS NULL OR (action=?2 AND decision=?3)) ORDER BY seq";

/// An agent seen in the record.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AgentRow {
    pub id: String,
    /// Role of its latest action.
    pub role: String,
    pub first_seen: String,
    pub last_seen: String,
    pub actions: u64,
    pub rejected: u64,
}

/// A node as the DAG needs it (a light row: no hypothesis, tip or timestamps).
#[derive(Debug, Clone, PartialEq)]
pub struct DagEntry {
    pub id: String,
    pub num: i64,
    pub title: String,
    pub status: NodeStatus,
    pub outcome: Option<String>,
    /// Filled in when the DAG is built, in parent order.
    pub parents: Vec<String>,
}

/// A DAG edge by node number: (parent, child).
pub type Edge = (i64, i64);

pub struct Index {
    conn: Connection,
    /// This handle's identity in pending markers: only it clears its own markers while it lives.
    writer: String,
    /// The file held an index of another schema version and was emptied: rebuild it from git.
    pub needs_rebuild: bool,
    /// A hold to release in the same transaction that indexes this handle's next own write (the
    /// action it reserved for, or its rejection), instead of in one of its own.
    release_next: std::cell::RefCell<Option<String>>,
    /// Holds released that way (their guard then has nothing left to do).
    released: std::cell::RefCell<Vec<String>>,
    /// Whether pending markers are fsynced before a branch moves (`set_durable`).
    durable: std::cell::Cell<bool>,
    /// Nodes this handle holds a pending marker for. A marker stays while the handle lives (a
    /// further write to the node needs no transaction to mark it again) and goes when the
    /// handle is dropped, or with the next index update once more than `STICKY_MARKERS` are
    /// held — unless its node is `dirty`; a writer that dies leaves them all, and the next open
    /// repairs those nodes from git.
    marked: std::cell::RefCell<std::collections::HashSet<String>>,
    /// Marked nodes whose last write by this handle is not indexed yet (its index update
    /// failed, or has not run): their markers outlive the handle, so the next open repairs them.
    dirty: std::cell::RefCell<std::collections::HashSet<String>>,
    /// The coordination tables (claims, queue, holds: `claims`) this handle has made sure of,
    /// one bit each: each is created when first used, and asked for once per handle.
    pub(crate) tables_made: std::cell::Cell<u8>,
    /// Actions this handle indexed (`WAL_SHORT_WRITES`).
    writes: std::cell::Cell<u32>,
}

/// How many pending markers a handle keeps before its next index update clears them all (they
/// bound what the next open repairs after a writer dies: one cheap sync per node).
const STICKY_MARKERS: usize = 256;

impl Drop for Index {
    fn drop(&mut self) {
        // A long-lived writer lets the WAL grow to `WAL_AUTOCHECKPOINT_PAGES`; the next process
        // to open the study would read all of it back. Past `WAL_SHORT_WRITES` writes, it is
        // checkpointed here (passive: never waits for readers). A CLI call's one write leaves
        // a short WAL and pays no fsync on exit.
        if self.writes.get() >= WAL_SHORT_WRITES
            && let Err(e) = self
                .conn
                .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        {
            tracing::warn!("could not checkpoint the index's WAL: {e}");
        }
        if self.marked.get_mut().is_empty() {
            return;
        }
        // The markers of writes this handle indexed have nothing left to guard.
        if let Err(e) = self.clear_clean_markers(&self.conn, None) {
            tracing::warn!("could not clear this writer's pending markers: {e}");
        }
    }
}

/// Numeric part of a node id, for ordering (domain vocabulary: `model::node_num`).
pub use crate::model::node_num;

/// Pages of WAL past which a committing writer checkpoints it into the database (SQLite's
/// default is 1000, ~4 MiB, which every process opening the study afterwards reads back).
const WAL_AUTOCHECKPOINT_PAGES: i64 = 200;

/// The same for a long-lived writer, once it has indexed `WAL_SHORT_WRITES` actions. Each
/// checkpoint fsyncs the WAL and the database even without `[record] fsync` (synchronous=NORMAL):
/// at 200 pages, one action in about 17 paid two fsyncs. A checkpoint copies each page once
/// however often it was rewritten, so a longer WAL also copies less. Such a handle checkpoints
/// when dropped, so what the next opener reads back stays short.
const WAL_LONG_AUTOCHECKPOINT_PAGES: i64 = 2000;

/// Actions a handle indexes before it counts as a long-lived writer (a CLI call writes one).
const WAL_SHORT_WRITES: u32 = 20;

/// The schema version the index was written with, if it has one (reads only).
fn schema_version(conn: &Connection) -> Option<String> {
    conn.query_row_cached("SELECT value FROM meta WHERE key='schema'", [], |r| {
        r.get(0)
    })
    .optional()
    .unwrap_or(None)
}

/// Set up a new index, or empty one written by another schema version (the index is derived:
/// it is rebuilt from git). Returns whether it was emptied and must be rebuilt.
fn set_up(conn: &Connection) -> Result<bool> {
    // Persistent in the file; WAL lets readers run while a writer commits.
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!("the index could not switch to WAL (journal mode {mode})");
    }
    let tx = rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)?;
    // Another process may have set it up while this one waited for the lock.
    let rebuild = match schema_version(&tx).as_deref() {
        Some(SCHEMA_VERSION) => return Ok(false),
        Some(_) => {
            let tables: Vec<String> = tx
                .prepare("SELECT name FROM sqlite_master WHERE type='table'")?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            for t in tables {
                tx.execute_batch(&format!("DROP TABLE IF EXISTS \"{t}\""))?;
            }
            true
        }
        None => false,
    };
    tx.execute_batch(SCHEMA)?;
    tx.exec_cached(
        "INSERT OR REPLACE INTO meta(key,value) VALUES('schema',?1)",
        [SCHEMA_VERSION],
    )?;
    tx.commit()?;
    Ok(rebuild)
}

/// `synchronous` under WAL. NORMAL (every transaction but one kind): a commit is written to the
/// WAL without an fsync; the WAL is fsynced at each checkpoint. A killed process loses nothing
/// (the WAL is in the OS's cache), and a power loss can roll back the last transactions but never
/// corrupts the database. That suits a derived index: it is rebuilt from git (`rsim reindex`),
/// and a node is repaired from git on open while its pending marker is there. With fsynced git
/// writes (`[record] fsync = true`) a pending marker is committed under FULL, which fsyncs the
/// WAL, so it is on disk before the branch moves: a power loss then cannot leave a branch ahead
/// of an unmarked index. Nothing else needs to reach the disk first (holds and claims end with
/// their process; a lost index update is redone from git because its marker survived), so a
/// durable write fsyncs the index once, for its marker, and only for a node its handle has not
/// marked yet.
fn set_synchronous(conn: &Connection, durable: bool) -> Result<()> {
    conn.pragma_update(None, "synchronous", if durable { "FULL" } else { "NORMAL" })?;
    Ok(())
}

/// Tells whether the index changed since it last asked — a commit by any connection, in this
/// process or another — without reading a table: SQLite's `PRAGMA data_version` on a connection of
/// its own that never writes (a connection's own commits do not move its `data_version`). The
/// commit protocol syncs the index with every recorded action, so a change of the record is a
/// change here; claims, holds and pending markers of writers in flight move it too. Its cost does
/// not depend on the size of the study (one read of the WAL index header).
pub struct Changes {
    conn: Connection,
}

impl Changes {
    /// Open the study's index read-only (it must exist: the study was opened before).
    pub fn open(path: &Path) -> Result<Changes> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(Duration::from_secs(5))?;
        Ok(Changes { conn })
    }

    /// A number that differs from the last one read exactly when another connection committed.
    pub fn version(&self) -> Result<i64> {
        Ok(self
            .conn
            .query_row_cached("PRAGMA data_version", [], |r| r.get(0))?)
    }
}

impl Index {
    /// Open (or create) the index. Opening an index that is already set up only reads: the meta
    /// row, the tables and the journal mode are written when the file is new or was written by
    /// another schema version, never on an ordinary open, so a query process writes nothing.
    pub fn open(path: &Path) -> Result<Index> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(30))?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // SQLite checkpoints the WAL into the database when its last connection closes, with
        // fsyncs: each CLI process paid that on exit, queries included. The WAL is checkpointed
        // by SQLite's automatic checkpoint instead (in the writer that fills it past
        // `wal_autocheckpoint` pages). A WAL left behind is read back by the next opener; a
        // killed process loses nothing, and what a power loss may lose is `set_synchronous`'s
        // matter (the index is rebuilt from git by `rsim reindex`).
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
        // The next process to open the study recovers the WAL left behind by reading all of it:
        // a short WAL keeps that cheap (each write action adds a few pages to it). A long-lived
        // writer checkpoints less often and once more when dropped (`WAL_SHORT_WRITES`).
        conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)?;
        set_synchronous(&conn, false)?;
        // 64 MiB page cache: a 100k-node DAG fits, so repeated queries in one process stay in memory.
        conn.pragma_update(None, "cache_size", -65536)?;
        let needs_rebuild = match schema_version(&conn).as_deref() {
            Some(SCHEMA_VERSION) => false,
            _ => set_up(&conn)?,
        };
        Ok(Index {
            conn,
            writer: format!("{}-{:016x}", std::process::id(), rand::random::<u64>()),
            needs_rebuild,
            release_next: Default::default(),
            released: Default::default(),
            durable: Default::default(),
            marked: Default::default(),
            dirty: Default::default(),
            tables_made: Default::default(),
            writes: Default::default(),
        })
    }

    /// Delete this handle's markers of nodes whose writes are all indexed (in `conn`, which may
    /// be a transaction that indexes `indexing`'s write); the markers of `dirty` nodes stay.
    fn clear_clean_markers(
        &self,
        conn: &Connection,
        indexing: Option<&str>,
    ) -> rusqlite::Result<()> {
        let dirty = self.dirty.borrow();
        let still_dirty = |n: &str| dirty.contains(n) && Some(n) != indexing;
        if !dirty.iter().any(|n| still_dirty(n)) {
            conn.exec_cached("DELETE FROM pending WHERE writer=?1", [&self.writer])?;
        } else {
            for node in self.marked.borrow().iter().filter(|n| !still_dirty(n)) {
                conn.exec_cached(
                    "DELETE FROM pending WHERE node=?1 AND writer=?2",
                    params![node, self.writer],
                )?;
            }
        }
        Ok(())
    }

    /// Fsync pending markers before the branch they guard moves (`true`, for studies whose git
    /// writes are fsynced too) or leave every index transaction to the checkpoints (`false`, the
    /// default); see `set_synchronous`. Only a marker must be on disk first: an index update
    /// lost with a power cut is redone from git at the next open, because its marker is there.
    pub fn set_durable(&self, durable: bool) {
        self.durable.set(durable);
    }

    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// Mark a node as about to change in git (called before the branch moves). The marker is this
    /// writer's own: if the writer dies before its write is indexed, the next open repairs the
    /// node from git. A node this handle marked before is still marked (see `marked`).
    #[tracing::instrument(level = "trace", name = "index.pending", skip_all)]
    pub fn mark_pending(&self, node: &str) -> Result<()> {
        self.dirty.borrow_mut().insert(node.to_string());
        if self.marked.borrow().contains(node) {
            return Ok(());
        }
        let durable = self.durable.get();
        if durable {
            set_synchronous(&self.conn, true)?;
        }
        let marked = self.conn.exec_cached(
            "INSERT OR IGNORE INTO pending(node,pid,writer) VALUES(?1,?2,?3)",
            params![node, std::process::id(), self.writer],
        );
        if durable {
            set_synchronous(&self.conn, false)?;
        }
        marked?;
        self.marked.borrow_mut().insert(node.to_string());
        Ok(())
    }

    /// Pending markers: (node, pid, writer).
    pub fn pending(&self) -> Result<Vec<(String, u32, String)>> {
        let mut st = self
            .conn
            .prepare("SELECT node,pid,writer FROM pending ORDER BY node")?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Repair the nodes whose writers died between moving a branch and updating the index.
    /// Markers of writers that are still running are left to them.
    pub fn repair(&self, record: &Record) -> Result<usize> {
        let mut repaired = 0;
        for (node, pid, writer) in self.pending()? {
            if writer != self.writer && crate::util::proc::process_alive(pid) {
                continue;
            }
            let tx = self.immediate()?;
            sync_node_tx(&tx, record, &node)?;
            tx.exec_cached(
                "DELETE FROM pending WHERE node=?1 AND writer=?2",
                params![node, writer],
            )?;
            tx.commit()?;
            repaired += 1;
        }
        Ok(repaired)
    }

    /// Make the index's view of node `id` match its branch in git, and clear this writer's marker.
    /// Idempotent.
    #[tracing::instrument(level = "trace", name = "index.sync", skip_all)]
    pub fn sync_node(&self, record: &Record, id: &str) -> Result<()> {
        self.sync_node_tx_releasing(record, id, None, None)
    }

    /// Index this handle's own write, which just landed, from what it wrote (nothing is read
    /// back from git): when the index stands exactly where the write started (the node's
    /// indexed tip is the commit it appended to, or the node is new), the write's row and the
    /// node's new tip go in; otherwise another writer moved the node meanwhile and the node is
    /// synced from git as `sync_node` does. The hold set aside with `release_with_next_write`
    /// (if any) ends in the same transaction.
    #[tracing::instrument(level = "trace", name = "index.sync", skip_all)]
    pub fn sync_own_write(&self, record: &Record, w: &OwnWrite<'_>) -> Result<()> {
        let hold = self.release_next.borrow_mut().take();
        self.sync_node_tx_releasing(record, w.node, Some(w), hold)
    }

    fn sync_node_tx_releasing(
        &self,
        record: &Record,
        id: &str,
        own: Option<&OwnWrite<'_>>,
        hold: Option<String>,
    ) -> Result<()> {
        let tx = self.immediate()?;
        match own {
            Some(w) if index_own_write(&tx, w)? => {}
            _ => sync_node_tx(&tx, record, id)?,
        }
        // Every write of this handle is indexed once this commits: past the bound, its markers go.
        let clear = self.marked.borrow().len() > STICKY_MARKERS;
        if clear {
            // This node's write is indexed once this commits: its marker goes with the others.
            self.clear_clean_markers(&tx, Some(id))?;
        }
        if let Some(token) = &hold {
            tx.exec_cached("DELETE FROM holds WHERE token=?1", [token])?;
        }
        tx.commit()?;
        self.writes.set(self.writes.get().saturating_add(1));
        if self.writes.get() == WAL_SHORT_WRITES {
            self.conn
                .pragma_update(None, "wal_autocheckpoint", WAL_LONG_AUTOCHECKPOINT_PAGES)?;
        }
        self.dirty.borrow_mut().remove(id);
        if clear {
            let dirty = self.dirty.borrow();
            self.marked.borrow_mut().retain(|n| dirty.contains(n));
        }
        if let Some(token) = hold {
            self.released.borrow_mut().push(token);
        }
        Ok(())
    }

    /// Release the hold `token` when this handle's next own write is indexed (in that
    /// transaction) rather than in a transaction of its own.
    pub fn release_with_next_write(&self, token: &str) {
        *self.release_next.borrow_mut() = Some(token.to_string());
    }

    /// Whether the hold `token` was released with a write (forgotten once asked); a hold still
    /// waiting for its write is no longer set aside.
    pub fn take_released(&self, token: &str) -> bool {
        let mut released = self.released.borrow_mut();
        if let Some(i) = released.iter().position(|t| t == token) {
            released.swap_remove(i);
            return true;
        }
        let mut next = self.release_next.borrow_mut();
        if next.as_deref() == Some(token) {
            *next = None;
        }
        false
    }

    /// A write transaction that takes the database lock up front (no upgrade deadlocks between writers).
    fn immediate(&self) -> Result<rusqlite::Transaction<'_>> {
        Ok(rusqlite::Transaction::new_unchecked(
            &self.conn,
            rusqlite::TransactionBehavior::Immediate,
        )?)
    }

    /// Rebuild the whole index from git alone. A node whose history cannot be read as this
    /// study's (a commit not signed by its key, a broken action sequence) is left out and
    /// named in the answer's `refused`, with why.
    pub fn rebuild(&mut self, record: &Record) -> Result<Rebuilt> {
        let tips = record.node_tips()?;
        let mut tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        for t in RECORD_TABLES {
            tx.execute(&format!("DELETE FROM {t}"), [])?;
        }
        // Every node is read from git now: markers have nothing left to guard, except those of
        // other writers still running (each guards a write of theirs that may not be in git yet).
        let markers: Vec<(u32, String)> = {
            let mut st = tx.prepare("SELECT pid, writer FROM pending")?;
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?
        };
        for (pid, writer) in markers {
            if writer == self.writer || !crate::util::proc::process_alive(pid) {
                tx.exec_cached("DELETE FROM pending WHERE writer=?1", [&writer])?;
            }
        }
        let mut refused = Vec::new();
        let mut by_node = std::collections::BTreeMap::new();
        for (id, _) in &tips {
            let sp = tx.savepoint()?;
            match sync_node_tx(&sp, record, id) {
                Ok(()) => sp.commit()?,
                // The machine failed to read, which says nothing of the history: nothing is
                // refused, the rebuild is rolled back whole and fails.
                Err(e) if machine_failure(&e) => return Err(e),
                Err(e) => {
                    drop(sp);
                    refused.push(format!("{id}: {}", e.message));
                    by_node.insert(id.clone(), e.message);
                }
            }
        }
        set_refused(&tx, &by_node)?;
        tx.commit()?;
        self.marked.get_mut().clear();
        self.dirty.get_mut().clear();
        Ok(Rebuilt {
            nodes: tips.len() - refused.len(),
            refused,
        })
    }

    /// Bring the index up to git's node branches when they moved outside rsim (a read-only clone
    /// after `git fetch`): each node whose tip differs is synced, in node order; a node whose new
    /// history is not the study's keeps what the index had (its refusal is kept with the others,
    /// `refused_nodes`); a node gone from git means a rebuild. Returns the nodes synced.
    pub fn catch_up(&mut self, record: &Record) -> Result<usize> {
        let mut git = record.node_tips()?;
        git.sort_by_key(|(id, _)| node_num(id));
        let ours: std::collections::HashMap<String, String> = {
            let mut st = self.conn.prepare("SELECT id, tip FROM nodes")?;
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?
        };
        let names: std::collections::HashSet<&str> =
            git.iter().map(|(id, _)| id.as_str()).collect();
        if ours.keys().any(|id| !names.contains(id.as_str())) {
            return Ok(self.rebuild(record)?.nodes);
        }
        let mut synced = 0;
        let mut by_node = self.refused_nodes()?;
        for (id, tip) in &git {
            if ours.get(id).map(String::as_str) == Some(tip.to_string().as_str()) {
                continue;
            }
            let tx = self.immediate()?;
            match sync_node_tx(&tx, record, id) {
                Ok(()) => {
                    tx.commit()?;
                    by_node.remove(id);
                    synced += 1;
                }
                Err(e) if machine_failure(&e) => return Err(e),
                Err(e) => {
                    drop(tx);
                    by_node.insert(id.clone(), e.message);
                }
            }
        }
        set_refused(&self.conn, &by_node)?;
        Ok(synced)
    }

    /// Node branches whose history is not the study's, left out of the index (node → why), as
    /// the last rebuild or catch-up found them.
    pub fn refused_nodes(&self) -> Result<std::collections::BTreeMap<String, String>> {
        Ok(self
            .meta("refused")?
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default())
    }

    /// Count one refusal of `agent` whose request, action, node and rule hash to `digest`. A
    /// refusal is recorded the 1st, 2nd, 4th, 8th… time it repeats, and again once `window_s` has
    /// passed since it was last recorded: a loop of identical calls writes a logarithmic number of
    /// commits. Returns whether to record it now and how many refusals that record stands for
    /// (itself and those counted since the last record).
    pub fn note_refusal(
        &self,
        agent: &str,
        digest: &str,
        now: f64,
        window_s: f64,
    ) -> Result<(bool, u64)> {
        let tx = self.immediate()?;
        let row: Option<(i64, i64, f64)> = tx
            .query_row_cached(
                "SELECT count, recorded, recorded_at FROM refusals WHERE agent=?1 AND digest=?2",
                params![agent, digest],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let (count, recorded, at) = row.unwrap_or((0, 0, f64::NEG_INFINITY));
        let count = count + 1;
        let record = (count as u64).is_power_of_two() || now - at >= window_s;
        let (recorded_now, at_now) = if record { (count, now) } else { (recorded, at) };
        tx.exec_cached(
            "INSERT OR REPLACE INTO refusals(agent,digest,count,recorded,recorded_at) VALUES(?1,?2,?3,?4,?5)",
            params![agent, digest, count, recorded_now, at_now.max(0.0)],
        )?;
        // Bounded: a refusal fully recorded and older than the window is forgotten (its next
        // repeat is recorded afresh), so the table holds at most one window of distinct
        // refusals — which the write rate bounds per agent.
        tx.exec_cached(
            "DELETE FROM refusals WHERE count = recorded AND recorded_at < ?1",
            params![now - window_s],
        )?;
        tx.commit()?;
        Ok((record, (count - recorded).max(1) as u64))
    }

    /// Refusals counted and not recorded (repeats between two records of the same refusal).
    pub fn unrecorded_refusals(&self) -> Result<u64> {
        let n: i64 = self.conn.query_row_cached(
            "SELECT COALESCE(SUM(count - recorded), 0) FROM refusals",
            [],
            |r| r.get(0),
        )?;
        Ok(n.max(0) as u64)
    }

    /// One write call of `agent` at `now` against `limit` calls a minute: `None` admitted;
    /// `Some(first)` throttled, `first` for the first throttled call of this minute (the one
    /// that is recorded).
    #[tracing::instrument(level = "trace", name = "index.rate", skip_all)]
    pub fn admit_write(&self, agent: &str, now: f64, limit: u64) -> Result<Option<bool>> {
        let tx = self.immediate()?;
        let row: Option<(f64, i64, i64)> = tx
            .query_row_cached(
                "SELECT window_start, calls, throttled FROM rates WHERE agent=?1",
                [agent],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let (mut start, mut calls, mut throttled) = row.unwrap_or((now, 0, 0));
        if now - start >= 60.0 || now < start {
            (start, calls, throttled) = (now, 0, 0);
        }
        calls += 1;
        let verdict = if calls as u64 <= limit {
            None
        } else {
            let first = throttled == 0;
            throttled = 1;
            Some(first)
        };
        tx.exec_cached(
            "INSERT OR REPLACE INTO rates(agent,window_start,calls,throttled) VALUES(?1,?2,?3,?4)",
            params![agent, start, calls, throttled],
        )?;
        tx.commit()?;
        Ok(verdict)
    }

    /// A value the index keeps about itself.
    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row_cached("SELECT value FROM meta WHERE key=?1", [key], |r| r.get(0))
            .optional()?)
    }

    pub fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        self.conn.exec_cached(
            "INSERT OR REPLACE INTO meta(key,value) VALUES(?1,?2)",
            params![key, value],
        )?;
        Ok(())
    }

    // ----- queries -----

    /// Who opened node `id`: the agent and role of its first action (its `branch`).
    pub fn node_opener(&self, id: &str) -> Result<Option<(String, String)>> {
        Ok(self
            .conn
            .prepare_cached("SELECT agent, role FROM actions WHERE node=?1 AND seq=1")?
            .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?)
    }

    pub fn node(&self, id: &str) -> Result<Option<NodeRow>> {
        let row = self
            .conn
            .prepare_cached(
                "SELECT id,num,title,hypothesis,status,outcome,created_at,created_by,tip,action_count FROM nodes WHERE id=?1",
            )?
            .query_row([id], node_from_row)
            .optional()?;
        match row {
            Some(mut n) => {
                n.parents = self.parents(id)?;
                Ok(Some(n))
            }
            None => Ok(None),
        }
    }

    pub fn parents(&self, id: &str) -> Result<Vec<String>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT parent FROM node_parents WHERE node=?1 ORDER BY ord")?;
        let rows = st
            .query_map([id], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?;
        Ok(rows)
    }

    pub fn children(&self, id: &str) -> Result<Vec<String>> {
        let mut st = self.conn.prepare_cached(
            "SELECT p.node FROM node_parents p JOIN nodes n ON n.id=p.node WHERE p.parent=?1 ORDER BY n.num",
        )?;
        let rows = st
            .query_map([id], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?;
        Ok(rows)
    }

    /// Nodes ordered by number, optionally filtered by status.
    pub fn nodes(
        &self,
        status: Option<NodeStatus>,
        limit: u64,
        offset: u64,
    ) -> Result<Vec<NodeRow>> {
        let mut st = self.conn.prepare(
            "SELECT id,num,title,hypothesis,status,outcome,created_at,created_by,tip,action_count FROM nodes
             WHERE (?1 IS NULL OR status=?1) ORDER BY num LIMIT ?2 OFFSET ?3",
        )?;
        let mut rows = st
            .query_map(
                params![status.map(|s| s.as_str()), limit as i64, offset as i64],
                node_from_row,
            )?
            .collect::<rusqlite::Result<Vec<NodeRow>>>()?;
        for n in &mut rows {
            n.parents = self.parents(&n.id)?;
        }
        Ok(rows)
    }

    /// All nodes and all parent edges, for building the DAG in one pass.
    /// Every node (light rows, id order) and every parent edge (by node number; each child's
    /// edges in parent order), for building the DAG in one pass.
    pub fn dag_rows(&self) -> Result<(Vec<DagEntry>, Vec<Edge>)> {
        let mut st = self
            .conn
            .prepare("SELECT id,num,title,status,outcome FROM nodes")?;
        let mut nodes = st
            .query_map([], |r| {
                let status: String = r.get(3)?;
                Ok(DagEntry {
                    id: r.get(0)?,
                    num: r.get(1)?,
                    title: r.get(2)?,
                    status: NodeStatus::parse(&status).unwrap_or(NodeStatus::Open),
                    outcome: r.get(4)?,
                    parents: Vec::new(),
                })
            })?
            .collect::<rusqlite::Result<Vec<DagEntry>>>()?;
        nodes.sort_unstable_by_key(|n| n.num);
        // node_parents is clustered on (node, ord): a plain scan yields each child's parents in order.
        let mut st = self
            .conn
            .prepare("SELECT parent_num,node_num FROM node_parents")?;
        let edges = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<Edge>>>()?;
        Ok((nodes, edges))
    }

    pub fn node_count(&self) -> Result<u64> {
        Ok(self
            .conn
            .query_row_cached("SELECT COUNT(*) FROM nodes", [], |r| r.get::<_, i64>(0))?
            as u64)
    }

    pub fn max_node_num(&self) -> Result<i64> {
        Ok(self
            .conn
            .query_row_cached("SELECT COALESCE(MAX(num), -1) FROM nodes", [], |r| r.get(0))?)
    }

    /// Actions, newest first. `node` restricts to one node.
    pub fn actions(
        &self,
        node: Option<&str>,
        include_rejected: bool,
        limit: u64,
    ) -> Result<Vec<ActionRow>> {
        self.actions_page(node, include_rejected, limit, None)
    }

    /// Actions, newest first, from position `offset`.
    /// Actions newest first (by time, then node and seq, descending), optionally only those
    /// strictly after `after` — the sort key `(at, node, seq)` of the last action of the previous
    /// page — so a page never repeats or skips one whatever is recorded between pages.
    pub fn actions_page(
        &self,
        node: Option<&str>,
        include_rejected: bool,
        limit: u64,
        after: Option<(&str, &str, u32)>,
    ) -> Result<Vec<ActionRow>> {
        self.page(
            &format!("node,seq,commit_oid,{WHOLE_RECORD}"),
            node,
            include_rejected,
            limit,
            after,
            |r| {
                Ok(ActionRow {
                    node: r.get(0)?,
                    seq: r.get(1)?,
                    commit: r.get(2)?,
                    record: parse_record(r, 3)?,
                })
            },
        )
    }

    /// `actions_page` with each action's head only, from the index's columns (`log`).
    pub fn action_heads_page(
        &self,
        node: Option<&str>,
        include_rejected: bool,
        limit: u64,
        after: Option<(&str, &str, u32)>,
    ) -> Result<Vec<ActionHeadRow>> {
        self.page(HEAD_COLUMNS, node, include_rejected, limit, after, head_row)
    }

    fn page<T>(
        &self,
        columns: &str,
        node: Option<&str>,
        include_rejected: bool,
        limit: u64,
        after: Option<(&str, &str, u32)>,
        row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>> {
        let mut st = self
            .conn
            .prepare_cached(&format!("SELECT {columns} {PAGE_TAIL}"))?;
        let (at, after_node, after_seq) = match after {
            Some((a, n, q)) => (Some(a), Some(n), Some(q)),
            None => (None, None, None),
        };
        let rows = st
            .query_map(
                params![
                    node,
                    include_rejected,
                    limit.min(i64::MAX as u64) as i64,
                    at,
                    after_node,
                    after_seq
                ],
                row,
            )?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// All actions of one node, oldest first.
    pub fn node_actions(&self, node: &str) -> Result<Vec<ActionRow>> {
        self.node_actions_matching(node, None)
    }

    /// The accepted `action`s of one node, oldest first: only those rows are read (a node
    /// flooded with other actions costs a scan of its rows in SQLite, none of them parsed).
    pub fn node_accepted(&self, node: &str, action: ActionName) -> Result<Vec<ActionRow>> {
        self.node_actions_matching(node, Some(action))
    }

    fn node_actions_matching(
        &self,
        node: &str,
        accepted: Option<ActionName>,
    ) -> Result<Vec<ActionRow>> {
        self.node_rows(
            &format!("seq,commit_oid,{WHOLE_RECORD}"),
            node,
            accepted,
            |r| {
                Ok(ActionRow {
                    node: node.to_string(),
                    seq: r.get(0)?,
                    commit: r.get(1)?,
                    record: parse_record(r, 2)?,
                })
            },
        )
    }

    /// All actions of one node, oldest first, each one's head only from the index's columns
    /// (`get_node`).
    pub fn node_action_heads(&self, node: &str) -> Result<Vec<ActionHeadRow>> {
        self.node_rows(HEAD_COLUMNS, node, None, head_row)
    }

    fn node_rows<T>(
        &self,
        columns: &str,
        node: &str,
        accepted: Option<ActionName>,
        row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>> {
        let mut st = self
            .conn
            .prepare_cached(&format!("SELECT {columns} {NODE_TAIL}"))?;
        let filter = accepted.map(|a| a.as_str());
        let rows = st
            .query_map(params![node, filter, Verdict::Accepted.as_str()], row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    pub fn job(&self, id: &str) -> Result<Option<(String, u32, JobRecord)>> {
        let row = self
            .conn
            .query_row_cached("SELECT node,seq,record FROM jobs WHERE id=?1", [id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, u32>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })
            .optional()?;
        match row {
            Some((node, seq, rec)) => Ok(Some((node, seq, serde_json::from_str(&rec)?))),
            None => Ok(None),
        }
    }

    /// Sum of job seconds over the study.
    pub fn compute_seconds_used(&self) -> Result<f64> {
        self.compute_seconds_used_by(None, None)
    }

    /// Job seconds used, optionally only on one node and/or by one agent.
    pub fn compute_seconds_used_by(&self, node: Option<&str>, agent: Option<&str>) -> Result<f64> {
        Ok(self.conn.query_row_cached(
            "SELECT COALESCE(SUM(COALESCE(json_extract(j.record,'$.compute_s'),j.duration_s)),0) FROM jobs j JOIN actions a ON a.node=j.node AND a.seq=j.seq
             WHERE (?1 IS NULL OR j.node=?1) AND (?2 IS NULL OR a.agent=?2)",
            params![node, agent],
            |r| r.get(0),
        )?)
    }

    /// Every artifact the record references (kept checkpoints included) with its kind and the
    /// agent of the action that referenced it, in the order they were recorded.
    pub fn artifact_refs(&self) -> Result<Vec<(String, String, String)>> {
        let mut st = self.conn.prepare(
            "SELECT sha, kind, agent FROM (
               SELECT a.sha256 AS sha, a.kind AS kind, ac.agent AS agent, ac.at AS at, ac.seq AS seq
                 FROM artifacts a JOIN actions ac ON ac.node=a.node AND ac.seq=a.seq
               UNION ALL
               SELECT k.sha256, 'checkpoint', ac.agent, ac.at, ac.seq
                 FROM kept k JOIN actions ac ON ac.node=k.node AND ac.seq=k.seq)
             ORDER BY at, seq",
        )?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// The agent of each recorded job (the agent of the action that ran it).
    pub fn job_agents(&self) -> Result<std::collections::HashMap<String, String>> {
        let mut st = self.conn.prepare(
            "SELECT j.id, a.agent FROM jobs j JOIN actions a ON a.node=j.node AND a.seq=j.seq",
        )?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// Bytes of each agent's action records (the JSON each commit holds, before git compresses it).
    pub fn record_bytes_by_agent(&self) -> Result<std::collections::BTreeMap<String, u64>> {
        let mut st = self
            .conn
            .prepare("SELECT agent, COALESCE(SUM(LENGTH(record)),0) FROM actions GROUP BY agent")?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)?.max(0) as u64)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// Accepted evaluations (all, or on one node, split, agent).
    pub fn evaluation_count(&self, node: Option<&str>, split: Option<&str>) -> Result<u64> {
        self.evaluation_count_by(node, split, None)
    }

    pub fn evaluation_count_by(
        &self,
        node: Option<&str>,
        split: Option<&str>,
        agent: Option<&str>,
    ) -> Result<u64> {
        let n: i64 = self.conn.query_row_cached(
            "SELECT COUNT(*) FROM actions a WHERE a.decision='accepted'
               AND (a.action='evaluate' OR (a.action='reproduce'
                    AND json_extract(a.record,'$.result.action')='evaluate'))
               AND (?1 IS NULL OR a.node=?1)
               AND (?2 IS NULL OR COALESCE(json_extract(a.record,'$.request.split'),
                                           json_extract(a.record,'$.result.split'))=?2)
               AND (?3 IS NULL OR a.agent=?3)",
            params![node, split, agent],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    /// Rejections of one agent by one rule.
    pub fn rejection_count(&self, agent: &str, rule: &str) -> Result<u64> {
        let n: i64 = self
            .conn
            .prepare_cached(
                "SELECT COUNT(*) FROM actions WHERE decision='rejected' AND agent=?1 AND rule=?2",
            )?
            .query_row(params![agent, rule], |r| r.get(0))?;
        Ok(n as u64)
    }

    /// Every registered dataset with the agent that registered it: (row id, sha256, rows, agent).
    pub fn datasets_registered(&self) -> Result<Vec<(i64, String, u64, String)>> {
        self.datasets_registered_after(i64::MIN)
    }

    /// How many datasets are registered, the largest row id among them (0 when none) and their
    /// rows in all: with `datasets_registered_after`, what a caller keeping running totals needs
    /// to tell whether only new registrations came in since it last counted.
    pub fn datasets_mark(&self) -> Result<(u64, i64, u64)> {
        Ok(self.conn.query_row_cached(
            "SELECT COUNT(*), COALESCE(MAX(rowid), 0), COALESCE(SUM(MAX(rows, 0)), 0) FROM datasets",
            [],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?.max(0) as u64,
                    r.get(1)?,
                    r.get::<_, i64>(2)?.max(0) as u64,
                ))
            },
        )?)
    }

    /// The datasets whose row id is above `after`, with the agent that registered each:
    /// (row id, sha256, rows, agent).
    pub fn datasets_registered_after(&self, after: i64) -> Result<Vec<(i64, String, u64, String)>> {
        let mut st = self.conn.prepare_cached(
            "SELECT d.rowid, d.sha256, d.rows, COALESCE(a.agent, '') FROM datasets d
             LEFT JOIN actions a ON a.node = d.node AND a.seq = d.seq WHERE d.rowid > ?1",
        )?;
        let rows = st
            .query_map([after], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get::<_, i64>(2)?.max(0) as u64,
                    r.get(3)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// The dataset registered under `name`: (sha256, node, rows).
    pub fn dataset(&self, name: &str) -> Result<Option<(String, String, u64)>> {
        Ok(self
            .conn
            .query_row_cached(
                "SELECT sha256,node,rows FROM datasets WHERE name=?1",
                [name],
                |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? as u64)),
            )
            .optional()?)
    }

    /// The checkpoint recorded by a root node's first action (its `init`).
    pub fn base_checkpoint(&self, root: &str) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row_cached(
                "SELECT sha256 FROM artifacts WHERE node=?1 AND seq=1 AND kind='checkpoint'",
                [root],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Where a checkpoint came from: (node, seq, parent checkpoint) of the accepted run_sft that produced it.
    pub fn checkpoint_origin(&self, sha: &str) -> Result<Option<(String, u32, Option<String>)>> {
        Ok(self
            .conn
            .query_row_cached(
                "SELECT node,seq,parent FROM artifacts WHERE sha256=?1 AND kind='checkpoint' ORDER BY node, seq LIMIT 1",
                [sha],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?)
    }

    /// Every value of one metric recorded for a checkpoint, on any node.
    pub fn checkpoint_scores(
        &self,
        checkpoint: &str,
        task: &str,
        split: &str,
        name: &str,
    ) -> Result<Vec<f64>> {
        let mut st = self.conn.prepare_cached(
            "SELECT value FROM metrics WHERE checkpoint=?1 AND task=?2 AND split=?3 AND name=?4 ORDER BY node, seq",
        )?;
        let rows = st
            .query_map([checkpoint, task, split, name], |r| r.get::<_, f64>(0))?
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// Every metric value recorded on a node.
    pub fn node_metrics(&self, node: &str) -> Result<Vec<(u32, crate::model::MetricRecord)>> {
        self.metrics_of(node, "1")
    }

    /// The node's results: its metrics without the scores of checkpoints its runs kept part-way
    /// (see `RESULTS_ONLY`), with the seq of the action that recorded each.
    pub fn node_results(&self, node: &str) -> Result<Vec<(u32, crate::model::MetricRecord)>> {
        self.metrics_of(node, RESULTS_ONLY)
    }

    fn metrics_of(
        &self,
        node: &str,
        filter: &str,
    ) -> Result<Vec<(u32, crate::model::MetricRecord)>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT seq,name,value,task,split,checkpoint FROM metrics WHERE node=?1 AND {filter} ORDER BY seq, task, split, name",
        ))?;
        let rows = st
            .query_map([node], |r| {
                let split: String = r.get(4)?;
                Ok((
                    r.get::<_, u32>(0)?,
                    crate::model::MetricRecord {
                        name: r.get(1)?,
                        value: r.get(2)?,
                        task: r.get(3)?,
                        split: crate::model::Split::parse(&split)
                            .unwrap_or(crate::model::Split::Dev),
                        checkpoint: r.get(5)?,
                    },
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Best result of a metric per node that may be ranked (max; see `RESULTS_ONLY` and
    /// `RANKABLE`), for the nodes that have one: what leaderboards rank.
    pub fn best_per_node(&self, task: &str, split: &str, name: &str) -> Result<Vec<(String, f64)>> {
        let mut st = self.conn.prepare(&format!(
            "SELECT node, MAX(value) FROM metrics WHERE task=?1 AND split=?2 AND name=?3 AND {RESULTS_ONLY} AND {RANKABLE} GROUP BY node ORDER BY node",
        ))?;
        let rows = st
            .query_map(params![task, split, name], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<(String, f64)>>>()?;
        Ok(rows)
    }

    /// Mean and count of a metric's rankable results per node (see `RESULTS_ONLY` and
    /// `RANKABLE`), for the nodes that have one.
    pub fn mean_per_node(
        &self,
        task: &str,
        split: &str,
        name: &str,
    ) -> Result<Vec<(String, f64, u64)>> {
        let mut st = self.conn.prepare(&format!(
            "SELECT node, AVG(value), COUNT(*) FROM metrics WHERE task=?1 AND split=?2 AND name=?3
               AND {RESULTS_ONLY} AND {RANKABLE} GROUP BY node ORDER BY node",
        ))?;
        let rows = st
            .query_map(params![task, split, name], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)?.max(0) as u64))
            })?
            .collect::<rusqlite::Result<Vec<(String, f64, u64)>>>()?;
        Ok(rows)
    }

    /// Nodes whose evidence is suspect (see `SUSPECT_NODES`), in node order.
    pub fn suspect_nodes(&self) -> Result<std::collections::BTreeSet<String>> {
        let mut st = self.conn.prepare_cached(SUSPECT_NODES)?;
        let rows = st
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// Checkpoints a dev evaluation found significantly above the hidden dev twin.
    pub fn suspect_checkpoints(&self) -> Result<std::collections::BTreeSet<String>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT DISTINCT checkpoint FROM suspect")?;
        let rows = st
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// Whether a node's evidence is suspect (see `SUSPECT_NODES`).
    pub fn is_suspect(&self, node: &str) -> Result<bool> {
        // `SUSPECT_NODES` for one node, without building the whole set first: the few suspect
        // checkpoints first (CROSS JOIN keeps that order), each looked up by its hash.
        let mut st = self.conn.prepare_cached(
            "SELECT 1 FROM suspect s CROSS JOIN artifacts a ON a.sha256=s.checkpoint
             WHERE a.kind='checkpoint' AND a.node=?1 LIMIT 1",
        )?;
        Ok(st.exists([node])?)
    }

    /// Every accepted review that names `node` (its LIKE pre-filter is exact once parsed: the
    /// caller checks the verdicts), oldest first.
    pub fn reviews_naming(&self, node: &str) -> Result<Vec<ActionRow>> {
        let mut st = self.conn.prepare(
            "SELECT node,seq,commit_oid,record FROM actions WHERE action='review' AND decision='accepted' AND instr(record, ?1) > 0 ORDER BY at, node, seq",
        )?;
        let needle = format!("\"{node}\"");
        let rows = st
            .query_map([needle], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, u32>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter()
            .map(|(node, seq, commit, rec)| {
                Ok(ActionRow {
                    node,
                    seq,
                    commit,
                    record: serde_json::from_str(&rec)?,
                })
            })
            .collect()
    }

    /// Every accepted review's request, oldest first.
    pub fn review_requests(&self) -> Result<Vec<serde_json::Value>> {
        let mut st = self.conn.prepare(
            "SELECT record FROM actions WHERE action='review' AND decision='accepted' ORDER BY at, node, seq",
        )?;
        let rows = st
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?;
        rows.into_iter()
            .map(|r| {
                let rec: ActionRecord = serde_json::from_str(&r)?;
                Ok(rec.request)
            })
            .collect()
    }

    /// Agents seen in the record.
    pub fn agents(&self) -> Result<Vec<AgentRow>> {
        let mut st = self.conn.prepare(
            "SELECT id,role,first_seen,last_seen,actions,rejected FROM agents ORDER BY id",
        )?;
        let rows = st
            .query_map([], |r| {
                Ok(AgentRow {
                    id: r.get(0)?,
                    role: r.get(1)?,
                    first_seen: r.get(2)?,
                    last_seen: r.get(3)?,
                    actions: r.get::<_, i64>(4)? as u64,
                    rejected: r.get::<_, i64>(5)? as u64,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }
}

fn node_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<NodeRow> {
    let status: String = r.get(4)?;
    Ok(NodeRow {
        id: r.get(0)?,
        num: r.get(1)?,
        title: r.get(2)?,
        hypothesis: r.get(3)?,
        status: NodeStatus::parse(&status).unwrap_or(NodeStatus::Open),
        outcome: r.get(5)?,
        created_at: r.get(6)?,
        created_by: r.get(7)?,
        tip: r.get(8)?,
        action_count: r.get(9)?,
        parents: Vec::new(),
    })
}

/// Whether reading a node failed because the machine could not read — the index's own
/// database failed, or the process is out of file descriptors, memory or disk — rather than
/// because the history is not the study's. Such a failure must never mark a node refused: a
/// process flooded out of file descriptors once left 199 of a study's 200 nodes out of its
/// index, for every later reader. What is matched is text the failure itself ends with or
/// starts with (SQLite's errors, libgit2's, the OS's `(os error N)`), never a repository's words
/// quoted in the middle of a message.
fn machine_failure(e: &crate::util::error::Error) -> bool {
    let m = e.message.to_ascii_lowercase();
    const OS: [&str; 4] = [
        "(os error 12)",
        "(os error 23)",
        "(os error 24)",
        "(os error 28)",
    ];
    m.starts_with("index (sqlite):")
        || OS.iter().any(|c| m.trim_end().ends_with(c))
        || (m.starts_with("git: ")
            && [
                "too many open files",
                "out of memory",
                "no space left on device",
            ]
            .iter()
            .any(|c| m.contains(c)))
}

/// What `rebuild` did: nodes indexed, and nodes refused with why.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Rebuilt {
    pub nodes: usize,
    pub refused: Vec<String>,
}

fn set_refused(
    conn: &rusqlite::Connection,
    by_node: &std::collections::BTreeMap<String, String>,
) -> Result<()> {
    conn.exec_cached(
        "INSERT OR REPLACE INTO meta(key,value) VALUES('refused',?1)",
        [serde_json::to_string(by_node)?],
    )?;
    Ok(())
}

fn sync_node_tx(tx: &rusqlite::Connection, record: &Record, id: &str) -> Result<()> {
    let indexed: Option<(String, u32)> = tx
        .query_row_cached(
            "SELECT tip, action_count FROM nodes WHERE id=?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let Some(tip) = record.node_tip(id)? else {
        // The branch is gone (or never got created): the index must not claim it exists.
        delete_node(tx, id)?;
        return Ok(());
    };
    if let Some((t, _)) = &indexed
        && *t == tip.to_string()
    {
        return Ok(());
    }
    let snap = record.snapshot(tip)?;
    if snap.meta.id != id {
        // A node's meta naming another node would be indexed under that node's key.
        return Err(crate::util::error::Error::internal(format!(
            "branch rsim/n/{id}: its {} names another node",
            crate::record::NODE_FILE
        )));
    }
    let after = indexed.as_ref().map_or(0, |(_, n)| *n);
    let mut new_actions = record.actions_since(id, tip, after)?;
    // The new actions continue what the index holds only when they grow from its tip: a branch
    // rewritten below it (the same number of actions or more, signed anew by the key holder) is
    // numbered on from the same count, and would leave the old actions standing in the index.
    let grows_from_indexed = match (&indexed, new_actions.first()) {
        (None, _) => true,
        (Some((t, _)), Some(a)) => crate::record::commit_at_most(record.repo(), a.commit)?
            .parent_id(0)
            .is_ok_and(|p| p.to_string() == *t),
        // The tip moved and nothing is new past the indexed count: moved back, or rewritten.
        (Some(_), None) => false,
    };
    let contiguous = grows_from_indexed
        && new_actions
            .first()
            .is_none_or(|a| a.record.seq == after + 1)
        && after + new_actions.len() as u32 == snap.action_count;
    if !contiguous {
        // The branch was rewritten behind our back: re-read the node from scratch.
        if snap.action_count >= after && after > 0 {
            tracing::warn!(
                "node {id}: its branch was rewritten below the {after} action(s) this index held; \
                 re-read from git (`git log rsim/n/{id}` shows the history now)"
            );
        }
        delete_node(tx, id)?;
        new_actions = record.actions_since(id, tip, 0)?;
    }
    upsert_node(tx, &snap.meta, &tip.to_string(), snap.action_count)?;
    for a in &new_actions {
        insert_action(tx, a.commit, &a.record)?;
    }
    Ok(())
}

/// What a writer just committed on a node, as it wrote it (`Index::sync_own_write`).
pub struct OwnWrite<'a> {
    pub node: &'a str,
    /// The tip the action was appended to; None when the write created the node.
    pub parent: Option<git2::Oid>,
    /// The commit the node's branch now points at.
    pub tip: git2::Oid,
    /// `node.toml` as of `tip` when the write created or rewrote it (None: unchanged).
    pub meta: Option<&'a NodeMeta>,
    pub record: &'a ActionRecord,
}

/// Index `w` directly when the index holds the node exactly as the write found it; false (and
/// nothing written) otherwise.
fn index_own_write(tx: &rusqlite::Connection, w: &OwnWrite<'_>) -> Result<bool> {
    let indexed: Option<(String, u32)> = tx
        .prepare_cached("SELECT tip, action_count FROM nodes WHERE id=?1")?
        .query_row([w.node], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let in_step = match (w.parent, &indexed) {
        (None, None) => w.record.seq == 1 && w.meta.is_some(),
        (Some(p), Some((tip, n))) => *tip == p.to_string() && n + 1 == w.record.seq,
        _ => false,
    };
    if !in_step || w.record.node != w.node {
        return Ok(false);
    }
    let tip = w.tip.to_string();
    match w.meta {
        Some(m) => upsert_node(tx, m, &tip, w.record.seq)?,
        None => {
            tx.exec_cached(
                "UPDATE nodes SET tip=?2, action_count=?3 WHERE id=?1",
                params![w.node, tip, w.record.seq],
            )?;
        }
    }
    insert_action(tx, w.tip, w.record)?;
    Ok(true)
}

fn delete_node(tx: &rusqlite::Connection, id: &str) -> Result<()> {
    for t in [
        "nodes WHERE id=?1",
        "node_parents WHERE node=?1",
        "actions WHERE node=?1",
        "metrics WHERE node=?1",
        "kept WHERE node=?1",
        "suspect WHERE node=?1",
    ] {
        tx.execute(&format!("DELETE FROM {t}"), [id])?;
    }
    for t in ["jobs", "artifacts", "datasets"] {
        tx.execute(&format!("DELETE FROM {t} WHERE node=?1"), [id])?;
    }
    Ok(())
}

fn upsert_node(
    tx: &rusqlite::Connection,
    m: &NodeMeta,
    tip: &str,
    action_count: u32,
) -> Result<()> {
    tx.exec_cached(
        "INSERT INTO nodes(id,num,title,hypothesis,status,outcome,created_at,created_by,tip,action_count)
         VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10)
         ON CONFLICT(id) DO UPDATE SET title=?3,hypothesis=?4,status=?5,outcome=?6,tip=?9,action_count=?10",
        params![
            m.id,
            node_num(&m.id),
            m.title,
            m.hypothesis,
            m.status.as_str(),
            m.outcome.map(|o| serde_json::to_value(o).ok().and_then(|v| v.as_str().map(str::to_string))),
            m.created_at,
            m.created_by,
            tip,
            action_count
        ],
    )?;
    tx.exec_cached("DELETE FROM node_parents WHERE node=?1", [&m.id])?;
    for (i, p) in m.parents.iter().enumerate() {
        tx.exec_cached(
            "INSERT INTO node_parents(node,parent,ord,node_num,parent_num) VALUES(?1,?2,?3,?4,?5)",
            params![m.id, p, i as i64, node_num(&m.id), node_num(p)],
        )?;
    }
    Ok(())
}

fn insert_action(tx: &rusqlite::Connection, commit: git2::Oid, r: &ActionRecord) -> Result<()> {
    let json = serde_json::to_string(r)?;
    tx.exec_cached(
        "INSERT OR REPLACE INTO actions(node,seq,action,decision,rule,reason,agent,role,at,summary,commit_oid,job,record)
         VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)",
        params![
            r.node,
            r.seq,
            r.action.as_str(),
            r.decision.decision.as_str(),
            r.decision.rule,
            r.decision.reason,
            r.agent,
            r.role.as_str(),
            r.at,
            r.summary,
            commit.to_string(),
            r.job.as_ref().map(|j| j.id.clone()),
            json
        ],
    )?;
    let rejected = i64::from(r.decision.decision == Verdict::Rejected);
    tx.exec_cached(
        "INSERT INTO agents(id,role,first_seen,last_seen,actions,rejected) VALUES(?1,?2,?3,?3,1,?4)
         ON CONFLICT(id) DO UPDATE SET
           role=CASE WHEN ?3>=last_seen THEN ?2 ELSE role END,
           first_seen=MIN(first_seen,?3), last_seen=MAX(last_seen,?3),
           actions=actions+1, rejected=rejected+?4",
        params![r.agent, r.role.as_str(), r.at, rejected],
    )?;
    if r.decision.decision != Verdict::Accepted {
        return Ok(());
    }
    for m in &r.metrics {
        tx.exec_cached(
            "INSERT INTO metrics(node,seq,name,value,task,split,checkpoint) VALUES(?1,?2,?3,?4,?5,?6,?7)",
            params![r.node, r.seq, m.name, m.value, m.task, m.split.as_str(), m.checkpoint],
        )?;
    }
    // A dev evaluation the dev tripwire found above its hidden twin: the node leaves rankings.
    if r.action == ActionName::Evaluate
        && r.result
            .as_ref()
            .is_some_and(|v| v.get("evidence_suspect") == Some(&serde_json::Value::Bool(true)))
    {
        let checkpoint = r.metrics.first().map(|m| m.checkpoint.clone()).or_else(|| {
            r.request
                .get("checkpoint")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        });
        if let Some(ck) = checkpoint {
            tx.exec_cached(
                "INSERT OR IGNORE INTO suspect(node,seq,checkpoint) VALUES(?1,?2,?3)",
                params![r.node, r.seq, ck],
            )?;
        }
    }
    // Checkpoints a run kept part-way (`eval_every`), as its record lists them: their scores
    // are the run's trend, not the node's results (`RESULTS_ONLY`).
    if r.action == ActionName::RunSft {
        let kept = r
            .result
            .as_ref()
            .and_then(|v| v.get("intermediate"))
            .and_then(|v| v.as_array());
        for k in kept.into_iter().flatten() {
            if let (Some(step), Some(sha)) = (
                k.get("step").and_then(|v| v.as_u64()),
                k.get("checkpoint").and_then(|v| v.as_str()),
            ) {
                tx.exec_cached(
                    "INSERT OR IGNORE INTO kept(node,seq,step,sha256) VALUES(?1,?2,?3,?4)",
                    params![r.node, r.seq, step as i64, sha],
                )?;
            }
        }
    }
    if let Some(j) = &r.job {
        tx.exec_cached(
            "INSERT OR REPLACE INTO jobs(id,node,seq,kind,state,exit_code,started_at,finished_at,duration_s,env,log,error,record)
             VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)",
            params![
                j.id,
                r.node,
                r.seq,
                j.kind.as_str(),
                j.state.as_str(),
                j.exit_code,
                j.started_at,
                j.finished_at,
                j.duration_s,
                j.env,
                j.log,
                j.error,
                serde_json::to_string(j)?
            ],
        )?;
    }
    for art in &r.artifacts {
        tx.exec_cached(
            "INSERT OR IGNORE INTO artifacts(sha256,kind,name,node,seq,parent) VALUES(?1,?2,?3,?4,?5,?6)",
            params![art.sha256, art.kind.as_str(), art.name, r.node, r.seq, art.parent],
        )?;
        if art.kind == ArtifactKind::Dataset {
            let rows = r
                .result
                .as_ref()
                .and_then(|v| v.get("rows"))
                .and_then(|v| v.as_u64())
                .unwrap_or(0);
            tx.exec_cached(
                "INSERT OR IGNORE INTO datasets(name,sha256,node,seq,rows) VALUES(?1,?2,?3,?4,?5)",
                params![art.name, art.sha256, r.node, r.seq, rows as i64],
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_that_cannot_read_is_told_from_a_history_that_is_not_the_studys() {
        use crate::util::error::Error;
        for m in [
            "index (sqlite): unable to open database file",
            "index (sqlite): disk I/O error",
            "git: failed to open '/x/.git/objects/pack': Too many open files",
            "cannot read /x/.rsim/keys/pub: Too many open files (os error 24)",
            "cannot write /x: No space left on device (os error 28)",
        ] {
            assert!(machine_failure(&Error::internal(m)), "{m}");
        }
        for m in [
            "commit 1234 is not signed by the study's key",
            "node n3: actions skip from 2 to 4",
            // a repository's words quoted inside a message are not the machine's failure
            "node n3: actions/0002 (os error 24).json is not an action file name",
            "node n3: commit message says: disk I/O error",
        ] {
            assert!(!machine_failure(&Error::internal(m)), "{m}");
        }
    }

    type FileState = (String, Option<Vec<u8>>, Option<std::time::SystemTime>);

    /// The database and its WAL: contents and modification times.
    fn files(path: &Path) -> Vec<FileState> {
        ["", "-wal"]
            .iter()
            .map(|ext| {
                let p = format!("{}{ext}", path.display());
                let bytes = std::fs::read(&p).ok();
                let mtime = std::fs::metadata(&p).and_then(|m| m.modified()).ok();
                (p, bytes, mtime)
            })
            .collect()
    }

    /// A writer killed without dropping its handle: its pending markers stay.
    fn die(ix: Index) {
        std::mem::forget(ix);
    }

    #[test]
    fn action_heads_cut_the_text_a_cloned_record_may_carry() {
        let d = tempfile::tempdir().expect("tempdir");
        let ix = Index::open(&d.path().join("index.sqlite")).expect("create");
        let huge = "é".repeat(1 << 20);
        let record = ActionRecord {
            seq: 1,
            action: ActionName::Branch,
            node: "n1".into(),
            agent: huge.clone(),
            role: Role::Worker,
            at: "2026-12-05T00:00:00Z".into(),
            summary: huge.clone(),
            request: serde_json::json!({}),
            decision: crate::model::Decision {
                decision: Verdict::Rejected,
                rule: Some(huge.clone()),
                reason: Some(huge.clone()),
            },
            result: None,
            job: None,
            artifacts: Vec::new(),
            metrics: Vec::new(),
            refers_to: Vec::new(),
        };
        insert_action(&ix.conn, git2::Oid::ZERO_SHA1, &record).expect("insert");
        let heads = ix.action_heads_page(None, true, 10, None).expect("page");
        let by_node = ix.node_action_heads("n1").expect("node");
        for h in [&heads[0], &by_node[0]] {
            assert_eq!(h.summary.chars().count(), 1001);
            assert!(h.summary.ends_with('…') && h.summary.starts_with("éé"));
            assert_eq!(h.agent.chars().count(), 201);
            assert_eq!(h.rule.as_deref().map(|r| r.chars().count()), Some(201));
            assert_eq!(h.reason.as_deref().map(|r| r.chars().count()), Some(4001));
        }
        // What rsim writes is never cut.
        let record = ActionRecord {
            seq: 2,
            agent: "w".into(),
            summary: "a title".into(),
            decision: crate::model::Decision {
                decision: Verdict::Accepted,
                rule: None,
                reason: None,
            },
            ..record
        };
        insert_action(&ix.conn, git2::Oid::ZERO_SHA1, &record).expect("insert");
        let h = &ix.node_action_heads("n1").expect("node")[1];
        assert_eq!((h.agent.as_str(), h.summary.as_str()), ("w", "a title"));
        assert_eq!((h.rule.as_deref(), h.reason.as_deref()), (None, None));
    }

    #[test]
    fn a_handle_keeps_its_markers_while_it_lives_and_clears_them_when_dropped() {
        let d = tempfile::tempdir().expect("tempdir");
        let path = d.path().join("index.sqlite");
        let ix = Index::open(&path).expect("create");
        let other = Index::open(&path).expect("other");
        ix.mark_pending("n1").expect("mark");
        ix.mark_pending("n1").expect("again");
        ix.mark_pending("n2").expect("mark");
        other.mark_pending("n3").expect("mark");
        assert_eq!(ix.pending().expect("pending").len(), 3);
        // Their index updates ran (what `sync_own_write` records on success).
        ix.dirty.borrow_mut().clear();
        drop(ix);
        let left = other.pending().expect("pending");
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!(left[0].0, "n3");
        // A write whose index update never ran (it failed) keeps its marker past the handle:
        // the next open repairs that node from git.
        let ix = Index::open(&path).expect("again");
        ix.mark_pending("n4").expect("mark");
        drop(ix);
        let left: Vec<String> = other
            .pending()
            .expect("pending")
            .into_iter()
            .map(|m| m.0)
            .collect();
        assert_eq!(left, ["n3", "n4"]);
    }

    #[test]
    fn opening_a_set_up_index_writes_nothing() {
        let d = tempfile::tempdir().expect("tempdir");
        let path = d.path().join("index.sqlite");
        let ix = Index::open(&path).expect("create");
        assert!(!ix.needs_rebuild);
        ix.mark_pending("n1").expect("mark");
        die(ix);
        let before = files(&path);
        for _ in 0..3 {
            let ix = Index::open(&path).expect("open");
            assert!(!ix.needs_rebuild);
            assert_eq!(ix.pending().expect("pending").len(), 1);
            assert_eq!(ix.node("n0").expect("query"), None);
        }
        assert_eq!(files(&path), before, "a read-only open changed the index");
    }

    #[test]
    fn closing_leaves_the_wal_to_the_automatic_checkpoint_and_nothing_is_lost() {
        let d = tempfile::tempdir().expect("tempdir");
        let path = d.path().join("index.sqlite");
        let ix = Index::open(&path).expect("create");
        ix.mark_pending("n7").expect("mark");
        die(ix);
        let wal = std::fs::metadata(format!("{}-wal", path.display())).map_or(0, |m| m.len());
        assert!(wal > 0, "the WAL was checkpointed and removed on close");
        let ix = Index::open(&path).expect("reopen");
        assert_eq!(ix.pending().expect("pending")[0].0, "n7");
    }

    #[test]
    fn an_index_of_another_schema_version_is_emptied_for_a_rebuild() {
        let d = tempfile::tempdir().expect("tempdir");
        let path = d.path().join("index.sqlite");
        let ix = Index::open(&path).expect("create");
        ix.mark_pending("n1").expect("mark");
        ix.conn()
            .exec_cached("UPDATE meta SET value='0' WHERE key='schema'", [])
            .expect("downgrade");
        drop(ix);
        let ix = Index::open(&path).expect("open");
        assert!(ix.needs_rebuild);
        assert!(ix.pending().expect("pending").is_empty());
        drop(ix);
        assert!(!Index::open(&path).expect("open").needs_rebuild);
    }

    #[test]
    fn changes_sees_another_connections_commit_and_nothing_else() {
        let d = tempfile::tempdir().expect("tempdir");
        let path = d.path().join("index.sqlite");
        let writer = Index::open(&path).expect("create");
        let changes = Changes::open(&path).expect("watch");
        let v0 = changes.version().expect("version");
        assert_eq!(
            changes.version().expect("version"),
            v0,
            "moved without a write"
        );
        writer.mark_pending("n1").expect("mark");
        let v1 = changes.version().expect("version");
        assert_ne!(v1, v0, "a commit by another connection was not seen");
        // A second handle, as another process would hold.
        let other = Index::open(&path).expect("open");
        other.mark_pending("n2").expect("mark");
        assert_ne!(changes.version().expect("version"), v1);
    }
}
