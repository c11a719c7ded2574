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
//! Claims are not derived from git (they describe jobs not yet recorded), so `rebuild` keeps them.

use rusqlite::{OptionalExtension, TransactionBehavior, params};

use crate::record::index::Index;
use crate::util::error::Result;

const NAMES_SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS name_claims(name TEXT PRIMARY KEY, pid INTEGER NOT NULL)";

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS claims(
  job TEXT PRIMARY KEY, node TEXT NOT NULL, agent TEXT NOT NULL, evaluation INTEGER NOT NULL,
  test INTEGER NOT NULL, compute_s REAL NOT NULL, pid INTEGER NOT NULL)";

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
        self.conn().execute_batch(SCHEMA)?;
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
            tx.execute(
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
            .query_row(
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

    /// The job's action is recorded (or it never ran): its claim ends.
    pub fn release_claim(&self, job: &str) -> Result<()> {
        self.claims_table()?;
        self.conn()
            .execute("DELETE FROM claims WHERE job=?1", [job])?;
        Ok(())
    }

    /// Claim a dataset name for a registration in flight, atomically with the check that no
    /// dataset has it and no other registration holds it (in this process or another): false if
    /// it is taken. Checked and then written later, two registrations racing for one name both
    /// passed, and the second silently replaced the rows the first one's agent trains on.
    pub fn claim_dataset_name(&self, name: &str) -> Result<bool> {
        self.conn().execute_batch(NAMES_SCHEMA)?;
        let tx = rusqlite::Transaction::new_unchecked(self.conn(), TransactionBehavior::Immediate)?;
        let taken = self.dataset(name)?.is_some()
            || tx
                .query_row("SELECT pid FROM name_claims WHERE name=?1", [name], |r| {
                    r.get::<_, u32>(0)
                })
                .optional()?
                .is_some_and(crate::util::proc::process_alive);
        if !taken {
            tx.execute(
                "INSERT OR REPLACE INTO name_claims(name, pid) VALUES(?1, ?2)",
                params![name, std::process::id()],
            )?;
        }
        tx.commit()?;
        Ok(!taken)
    }

    /// The registration is recorded (the name is in the datasets table) or gave up.
    pub fn release_dataset_name(&self, name: &str) -> Result<()> {
        self.conn().execute_batch(NAMES_SCHEMA)?;
        self.conn()
            .execute("DELETE FROM name_claims WHERE name=?1", [name])?;
        Ok(())
    }

    /// Drop the claims of writers that died (their jobs are recovered from the job directories).
    /// Writes nothing when there is nothing to drop (opening a study for a query stays a read).
    pub fn drop_dead_claims(&self) -> Result<usize> {
        let exists: bool = self.conn().query_row(
            "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE type='table' AND name='claims')",
            [],
            |r| r.get(0),
        )?;
        if !exists {
            return Ok(0);
        }
        let mut st = self.conn().prepare("SELECT job, pid FROM claims")?;
        let rows: Vec<(String, u32)> = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let mut dropped = 0;
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
}
