//! Claims: what admitted jobs hold against the budgets and caps until their action is recorded.
//!
//! Caps counted from the recorded past alone let concurrent jobs all pass (five test evaluations
//! admitted at once against a cap of two; six jobs each handed the whole remaining compute). So a
//! job is admitted inside one write transaction of the index: the OS counts what is recorded plus
//! what running jobs have claimed, asks the policy, and — if accepted — claims this job's share
//! (its evaluation, its test evaluation, its compute: its whole wall-clock limit × the units it
//! holds), all before another writer can count. A claim is released when the job's action is
//! recorded (the recorded usage then counts instead), and a claim of a writer that died is
//! dropped once its jobs have been recovered.
//!
//! Quick actions have the same gap between the count and the record without a job: a
//! registration's rows and bytes against the study's dataset budgets and its name against the
//! names taken, a contamination rejection against the agent's probing limit, a new node against
//! the node budget, a campaign against another orchestrator running one. They take a *hold* in one write transaction with their count, released once
//! the action (or its rejection) is recorded; a hold of a writer that died is ignored and dropped.
//!
//! A job that does not fit in what the others' claims leave waits in the *admission queue*,
//! first come first served: it is admitted when it reaches the head and fits (see
//! `Study::admit`), so cancelling and resubmitting never jumps the queue. A queue entry of a
//! writer that died is ignored and dropped.
//!
//! Claims are not derived from git (they describe jobs not yet recorded), so `rebuild` keeps them.

use rusqlite::{OptionalExtension, TransactionBehavior, params};

use crate::record::index::{ExecCached, Index};
use crate::util::error::Result;

/// Holds: what quick actions in flight reserve between their check and their record — a
/// registration's dataset name, rows and stored bytes; a contamination rejection not yet recorded
/// (the probing limit counts it); a node being created (the node budget counts it).
const HOLDS_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS holds(
  token TEXT PRIMARY KEY, kind TEXT NOT NULL, agent TEXT NOT NULL, name TEXT,
  rows INTEGER NOT NULL, bytes INTEGER NOT NULL, pid INTEGER NOT NULL)";

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS claims(
  job TEXT PRIMARY KEY, node TEXT NOT NULL, agent TEXT NOT NULL, evaluation INTEGER NOT NULL,
  test INTEGER NOT NULL, compute_s REAL NOT NULL, pid INTEGER NOT NULL)";

/// The coordination tables' bits in `Index::tables_made`.
const CLAIMS_TABLE: u8 = 1;
const QUEUE_TABLE: u8 = 2;
const HOLDS_TABLE: u8 = 4;

const QUEUE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS queue(
  seq INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL UNIQUE, node TEXT NOT NULL,
  agent TEXT NOT NULL, pid INTEGER NOT NULL, since REAL NOT NULL, cancelled_by TEXT)";

/// A job's place in the admission queue.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Queued {
    /// Live entries ahead of it.
    pub ahead: u64,
    /// Agents with live entries in the queue (this job's agent included).
    pub waiting_agents: std::collections::BTreeSet<String>,
    /// Who cancelled it while it waited.
    pub cancelled_by: Option<String>,
    /// Other live entries of the same agent (anywhere in the queue).
    pub same_agent: u64,
}

/// One admitted job's share.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub job: String,
    pub node: String,
    pub agent: String,
    /// The job is an evaluation (counts against the evaluation budgets) ...
    pub evaluation: bool,
    /// ... on the protected test split (counts against the test caps).
    pub test: bool,
    /// Compute the job may use at most: wall-clock limit × units held.
    pub compute_s: f64,
}

/// What a hold reserves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldKind {
    /// An accepted registration until it is recorded: its name, rows and stored bytes.
    Dataset,
    /// A contamination rejection until it is recorded (counted by the probing limit).
    Probe,
    /// A node until its branch is created and indexed (counted by the node budget).
    Node,
    /// A running campaign (`rsim run`): one orchestrator at a time spends a study's campaign.
    Campaign,
}

impl HoldKind {
    fn as_str(self) -> &'static str {
        match self {
            HoldKind::Dataset => "dataset",
            HoldKind::Probe => "probe",
            HoldKind::Node => "node",
            HoldKind::Campaign => "campaign",
        }
    }
    fn parse(s: &str) -> Option<HoldKind> {
        [
            HoldKind::Dataset,
            HoldKind::Probe,
            HoldKind::Node,
            HoldKind::Campaign,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// One hold to take.
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    pub kind: HoldKind,
    pub agent: String,
    /// The dataset name a registration reserves.
    pub name: Option<String>,
    pub rows: u64,
    pub bytes: u64,
}

impl Hold {
    /// A hold of one unit of `kind` (a node, a campaign) by `agent`, reserving no data.
    pub fn one(kind: HoldKind, agent: &str) -> Hold {
        Hold {
            kind,
            agent: agent.to_string(),
            name: None,
            rows: 0,
            bytes: 0,
        }
    }
}

/// What live holds reserve now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Held {
    pub dataset_rows: u64,
    pub dataset_bytes: u64,
    pub agent_dataset_rows: u64,
    pub agent_dataset_bytes: u64,
    /// Contamination rejections of the agent not yet recorded.
    pub agent_probes: u64,
    /// Nodes being created.
    pub nodes: u64,
    /// Campaigns running (their orchestrators' agents).
    pub campaigns: Vec<String>,
}

/// What running jobs hold now, for one node and one agent.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Claimed {
    pub evaluations: u64,
    pub node_evaluations: u64,
    pub agent_evaluations: u64,
    pub node_test_evaluations: u64,
    pub agent_test_evaluations: u64,
    pub compute_s: f64,
    pub node_compute_s: f64,
    pub agent_compute_s: f64,
}

impl Index {
    fn claims_table(&self) -> Result<()> {
        self.table(CLAIMS_TABLE, SCHEMA)
    }

    /// Create a coordination table if it is missing, once per handle (bit `bit` of `tables_made`).
    fn table(&self, bit: u8, schema: &str) -> Result<()> {
        if self.tables_made.get() & bit == 0 {
            self.conn().execute_batch(schema)?;
            self.tables_made.set(self.tables_made.get() | bit);
        }
        Ok(())
    }

    /// Run `admit` inside one write transaction of the index (no other writer can count or claim
    /// meanwhile); it returns the claim to take, or None to take nothing.
    pub fn with_claims<T>(
        &self,
        admit: impl FnOnce(&Index) -> Result<(Option<Claim>, T)>,
    ) -> Result<T> {
        self.claims_table()?;
        let tx = rusqlite::Transaction::new_unchecked(self.conn(), TransactionBehavior::Immediate)?;
        let (claim, out) = admit(self)?;
        if let Some(c) = claim {
            tx.exec_cached(
                "INSERT OR REPLACE INTO claims(job,node,agent,evaluation,test,compute_s,pid)
                 VALUES(?1,?2,?3,?4,?5,?6,?7)",
                params![
                    c.job,
                    c.node,
                    c.agent,
                    c.evaluation,
                    c.test,
                    c.compute_s,
                    std::process::id()
                ],
            )?;
        }
        tx.commit()?;
        Ok(out)
    }

    /// What running jobs claim, overall and for `node` and `agent`.
    pub fn claimed(&self, node: &str, agent: &str) -> Result<Claimed> {
        self.claims_table()?;
        let row = self
            .conn()
            .query_row_cached(
                "SELECT COALESCE(SUM(evaluation),0),
                        COALESCE(SUM(CASE WHEN node=?1 THEN evaluation END),0),
                        COALESCE(SUM(CASE WHEN agent=?2 THEN evaluation END),0),
                        COALESCE(SUM(CASE WHEN node=?1 THEN test END),0),
                        COALESCE(SUM(CASE WHEN agent=?2 THEN test END),0),
                        COALESCE(SUM(compute_s),0.0),
                        COALESCE(SUM(CASE WHEN node=?1 THEN compute_s END),0.0),
                        COALESCE(SUM(CASE WHEN agent=?2 THEN compute_s END),0.0)
                 FROM claims",
                params![node, agent],
                |r| {
                    Ok(Claimed {
                        evaluations: r.get::<_, i64>(0)? as u64,
                        node_evaluations: r.get::<_, i64>(1)? as u64,
                        agent_evaluations: r.get::<_, i64>(2)? as u64,
                        node_test_evaluations: r.get::<_, i64>(3)? as u64,
                        agent_test_evaluations: r.get::<_, i64>(4)? as u64,
                        compute_s: r.get(5)?,
                        node_compute_s: r.get(6)?,
                        agent_compute_s: r.get(7)?,
                    })
                },
            )
            .optional()?;
        Ok(row.unwrap_or_default())
    }

    /// Whether `job` holds a claim (admitted, not yet recorded).
    pub fn has_claim(&self, job: &str) -> Result<bool> {
        self.claims_table()?;
        Ok(self.conn().query_row_cached(
            "SELECT EXISTS(SELECT 1 FROM claims WHERE job=?1)",
            [job],
            |r| r.get(0),
        )?)
    }

    /// Agents holding claims now (running jobs), with the compute each holds.
    pub fn claim_holders(&self) -> Result<std::collections::BTreeMap<String, f64>> {
        self.claims_table()?;
        let mut st = self
            .conn()
            .prepare("SELECT agent, SUM(compute_s) FROM claims GROUP BY agent")?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, f64>(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    fn queue_table(&self) -> Result<()> {
        self.table(QUEUE_TABLE, QUEUE_SCHEMA)
    }

    /// Put `job` in the admission queue (once: a job keeps its first place) and say where it
    /// stands. Entries of writers that died are skipped (and dropped by `drop_dead_claims`).
    pub fn enqueue(&self, job: &str, node: &str, agent: &str) -> Result<Queued> {
        self.queue_table()?;
        self.conn().exec_cached(
            "INSERT OR IGNORE INTO queue(job,node,agent,pid,since) VALUES(?1,?2,?3,?4,?5)",
            params![
                job,
                node,
                agent,
                std::process::id(),
                crate::util::proc::now_epoch_s()
            ],
        )?;
        let mut st = self
            .conn()
            .prepare("SELECT job, agent, pid, cancelled_by FROM queue ORDER BY seq")?;
        let rows: Vec<(String, String, u32, Option<String>)> = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let mut q = Queued::default();
        let mut found = false;
        for (j, a, pid, cancelled) in rows {
            if j == job {
                found = true;
                q.cancelled_by = cancelled;
                q.waiting_agents.insert(a);
                continue;
            }
            if cancelled.is_some() || !crate::util::proc::process_alive(pid) {
                continue;
            }
            if !found {
                q.ahead += 1;
            }
            if a == agent {
                q.same_agent += 1;
            }
            q.waiting_agents.insert(a);
        }
        Ok(q)
    }

    /// `job` leaves the admission queue (admitted, refused or given up).
    pub fn dequeue(&self, job: &str) -> Result<()> {
        self.queue_table()?;
        self.conn()
            .exec_cached("DELETE FROM queue WHERE job=?1", [job])?;
        Ok(())
    }

    /// The node and agent of `job` if it waits in the admission queue (a live writer's entry).
    pub fn queued_job(&self, job: &str) -> Result<Option<(String, String)>> {
        self.queue_table()?;
        let row: Option<(String, String, u32)> = self
            .conn()
            .query_row_cached(
                "SELECT node, agent, pid FROM queue WHERE job=?1 AND cancelled_by IS NULL",
                [job],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        Ok(row
            .filter(|(_, _, pid)| crate::util::proc::process_alive(*pid))
            .map(|(n, a, _)| (n, a)))
    }

    /// The jobs waiting in the admission queue, first first: (job, node, agent, since).
    pub fn queue(&self) -> Result<Vec<(String, String, String, f64)>> {
        self.queue_table()?;
        let mut st = self.conn().prepare(
            "SELECT job, node, agent, pid, since FROM queue WHERE cancelled_by IS NULL ORDER BY seq",
        )?;
        let rows: Vec<(String, String, String, u32, f64)> = st
            .query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows
            .into_iter()
            .filter(|r| crate::util::proc::process_alive(r.3))
            .map(|(j, n, a, _, t)| (j, n, a, t))
            .collect())
    }

    /// Cancel `job` while it waits: its admission gives up at its next look.
    pub fn cancel_queued(&self, job: &str, by: &str) -> Result<bool> {
        self.queue_table()?;
        Ok(self.conn().exec_cached(
            "UPDATE queue SET cancelled_by=?2 WHERE job=?1 AND cancelled_by IS NULL",
            params![job, by],
        )? > 0)
    }

    /// The job's action is recorded (or it never ran): its claim ends.
    pub fn release_claim(&self, job: &str) -> Result<()> {
        self.claims_table()?;
        self.conn()
            .exec_cached("DELETE FROM claims WHERE job=?1", [job])?;
        Ok(())
    }

    fn holds_table(&self) -> Result<()> {
        self.table(HOLDS_TABLE, HOLDS_SCHEMA)
    }

    /// Run `decide` inside one write transaction of the index: it counts what is recorded plus
    /// what live holds reserve (`held`, `name_held`), and returns the hold to take (or None).
    /// No other writer, in this process or another, can count or hold meanwhile. Returns the
    /// hold's token (to release it once the action is recorded) and `decide`'s answer.
    #[tracing::instrument(level = "trace", name = "index.holds", skip_all)]
    pub fn with_holds<T>(
        &self,
        decide: impl FnOnce(&Index) -> Result<(Option<Hold>, T)>,
    ) -> Result<(Option<String>, T)> {
        self.holds_table()?;
        let tx = rusqlite::Transaction::new_unchecked(self.conn(), TransactionBehavior::Immediate)?;
        let (hold, out) = decide(self)?;
        let token = match hold {
            Some(h) => {
                let token = format!("{}-{:016x}", std::process::id(), rand::random::<u64>());
                tx.exec_cached(
                    "INSERT INTO holds(token,kind,agent,name,rows,bytes,pid)
                     VALUES(?1,?2,?3,?4,?5,?6,?7)",
                    params![
                        token,
                        h.kind.as_str(),
                        h.agent,
                        h.name,
                        h.rows as i64,
                        h.bytes as i64,
                        std::process::id()
                    ],
                )?;
                Some(token)
            }
            None => None,
        };
        tx.commit()?;
        Ok((token, out))
    }

    /// Run `decide` on the index as it stands, outside any write transaction, and take no hold:
    /// for a pre-check whose answer a later `with_holds` decision repeats (it refuses early,
    /// before costly work; it never admits on its own).
    pub fn without_holds<T>(
        &self,
        decide: impl FnOnce(&Index) -> Result<(Option<Hold>, T)>,
    ) -> Result<T> {
        self.holds_table()?;
        Ok(decide(self)?.1)
    }

    /// What live holds (of writers still running) reserve, overall and for `agent`.
    pub fn held(&self, agent: &str) -> Result<Held> {
        self.holds_table()?;
        let mut st = self
            .conn()
            .prepare_cached("SELECT kind, agent, rows, bytes, pid FROM holds")?;
        let rows: Vec<(String, String, i64, i64, u32)> = st
            .query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        let mut h = Held::default();
        for (kind, who, rows, bytes, pid) in rows {
            if !crate::util::proc::process_alive(pid) {
                continue;
            }
            let (rows, bytes) = (rows.max(0) as u64, bytes.max(0) as u64);
            match HoldKind::parse(&kind) {
                Some(HoldKind::Dataset) => {
                    h.dataset_rows += rows;
                    h.dataset_bytes += bytes;
                    if who == agent {
                        h.agent_dataset_rows += rows;
                        h.agent_dataset_bytes += bytes;
                    }
                }
                Some(HoldKind::Probe) if who == agent => h.agent_probes += 1,
                Some(HoldKind::Node) => h.nodes += 1,
                Some(HoldKind::Campaign) => h.campaigns.push(format!("{who} (pid {pid})")),
                _ => {}
            }
        }
        Ok(h)
    }

    /// Whether a live registration in flight holds the dataset name `name`.
    pub fn name_held(&self, name: &str) -> Result<bool> {
        self.holds_table()?;
        let mut st = self
            .conn()
            .prepare_cached("SELECT pid FROM holds WHERE kind='dataset' AND name=?1")?;
        let pids: Vec<u32> = st
            .query_map([name], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(pids.into_iter().any(crate::util::proc::process_alive))
    }

    /// The action the hold reserved for is recorded (it counts from the record now) or gave up.
    pub fn release_hold(&self, token: &str) -> Result<()> {
        self.holds_table()?;
        self.conn()
            .exec_cached("DELETE FROM holds WHERE token=?1", [token])?;
        Ok(())
    }

    /// Drop the claims of writers that died (their jobs are recovered from the job directories).
    /// Writes nothing when there is nothing to drop (opening a study for a query stays a read).
    pub fn drop_dead_claims(&self) -> Result<usize> {
        let table = |name: &str| -> Result<bool> {
            Ok(self.conn().query_row_cached(
                "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE type='table' AND name=?1)",
                [name],
                |r| r.get(0),
            )?)
        };
        let mut dropped = 0;
        if table("holds")? {
            let mut st = self.conn().prepare("SELECT token, pid FROM holds")?;
            let rows: Vec<(String, u32)> = st
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            for (token, pid) in rows {
                if !crate::util::proc::process_alive(pid) {
                    self.release_hold(&token)?;
                    dropped += 1;
                }
            }
        }
        if table("queue")? {
            let mut st = self.conn().prepare("SELECT job, pid FROM queue")?;
            let rows: Vec<(String, u32)> = st
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            for (job, pid) in rows {
                if !crate::util::proc::process_alive(pid) {
                    self.dequeue(&job)?;
                    dropped += 1;
                }
            }
        }
        if !table("claims")? {
            return Ok(dropped);
        }
        let mut st = self.conn().prepare("SELECT job, pid FROM claims")?;
        let rows: Vec<(String, u32)> = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        for (job, pid) in rows {
            if !crate::util::proc::process_alive(pid) {
                self.release_claim(&job)?;
                dropped += 1;
            }
        }
        Ok(dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(job: &str, node: &str, agent: &str, test: bool) -> Claim {
        Claim {
            job: job.into(),
            node: node.into(),
            agent: agent.into(),
            evaluation: true,
            test,
            compute_s: 10.0,
        }
    }

    #[test]
    fn claims_count_per_node_and_agent_until_released() {
        let d = tempfile::tempdir().expect("tempdir");
        let index = Index::open(&d.path().join("index.sqlite")).expect("index");
        for c in [
            claim("j1", "n1", "a", true),
            claim("j2", "n1", "b", false),
            claim("j3", "n2", "a", true),
        ] {
            index.with_claims(|_| Ok((Some(c), ()))).expect("claim");
        }
        let got = index.claimed("n1", "a").expect("claimed");
        assert_eq!(got.evaluations, 3);
        assert_eq!(got.node_evaluations, 2);
        assert_eq!(got.agent_evaluations, 2);
        assert_eq!(got.node_test_evaluations, 1);
        assert_eq!(got.agent_test_evaluations, 2);
        assert_eq!(got.compute_s, 30.0);
        index.release_claim("j1").expect("release");
        assert_eq!(
            index
                .claimed("n1", "a")
                .expect("claimed")
                .agent_test_evaluations,
            1
        );
        // This process is alive: its claims stay.
        assert_eq!(index.drop_dead_claims().expect("drop"), 0);
    }

    #[test]
    fn holds_count_until_released_and_a_dead_writers_holds_are_ignored() {
        let d = tempfile::tempdir().expect("tempdir");
        let index = Index::open(&d.path().join("index.sqlite")).expect("index");
        let hold = |kind, agent: &str, name: Option<&str>, rows| Hold {
            kind,
            agent: agent.into(),
            name: name.map(str::to_string),
            rows,
            bytes: rows * 10,
        };
        let (token, ()) = index
            .with_holds(|_| Ok((Some(hold(HoldKind::Dataset, "a", Some("x"), 3)), ())))
            .expect("hold");
        let token = token.expect("a token");
        index
            .with_holds(|_| Ok((Some(hold(HoldKind::Probe, "a", None, 0)), ())))
            .expect("probe");
        let a = index.held("a").expect("held");
        assert_eq!((a.dataset_rows, a.dataset_bytes), (3, 30));
        assert_eq!((a.agent_dataset_rows, a.agent_probes), (3, 1));
        let b = index.held("b").expect("held");
        assert_eq!(
            (b.dataset_rows, b.agent_dataset_rows, b.agent_probes),
            (3, 0, 0)
        );
        assert!(index.name_held("x").expect("name"));
        // A writer that died (no such process) holds nothing, and its hold is dropped.
        index
            .conn()
            .exec_cached(
                "INSERT INTO holds(token,kind,agent,name,rows,bytes,pid)
                 VALUES('dead','dataset','a','y',5,50,?1)",
                [i32::MAX as u32],
            )
            .expect("dead hold");
        assert!(!index.name_held("y").expect("name"));
        assert_eq!(index.held("a").expect("held").dataset_rows, 3);
        assert_eq!(index.drop_dead_claims().expect("drop"), 1);
        index.release_hold(&token).expect("release");
        assert!(!index.name_held("x").expect("name"));
        assert_eq!(index.held("a").expect("held").dataset_rows, 0);
    }
}
