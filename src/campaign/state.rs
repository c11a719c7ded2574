//! The campaign's state, derived from the record alone (so `rsim run` can be killed at any point
//! and started again): nodes with their recipes, experiments, dev scores, reviews and verdicts,
//! budget used, and the lock-in index.

use super::recipe::Recipe;
use crate::api::types::{ListNodesRequest, NodeVerdict, Proposal, ReviewVerdict};
use crate::model::{ActionName, JobState, NodeStatus, Split, Verdict};
use crate::os::Execute;
use crate::os::Study;
use crate::util::error::Result;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// One SFT run on a node and its dev score.
#[derive(Debug, Clone, Serialize)]
pub struct Experiment {
    pub seed: u64,
    pub job_state: JobState,
    pub checkpoint: Option<String>,
    pub dev: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeState {
    pub id: String,
    pub title: String,
    pub hypothesis: String,
    pub parents: Vec<String>,
    pub status: NodeStatus,
    #[serde(skip)]
    pub recipe: Option<Recipe>,
    /// `proposal: <node>/<seq>#<k>` — the review proposal this node was branched from.
    pub proposal: Option<String>,
    pub experiments: Vec<Experiment>,
    /// The latest reviewer verdict on this node.
    pub verdict: Option<ReviewVerdict>,
    /// The reason the latest verdict gives (its evidence).
    pub verdict_reason: Option<String>,
    /// The child of the root this node descends from (first parents): its top-level direction.
    pub top: String,
    /// Consecutive refinements without a sibling above this node.
    pub lonely_depth: u32,
    /// The node produced a checkpoint a dev evaluation found significantly above the hidden dev
    /// twin: its dev scores are evidence that may have been bought, so the campaign ranks it on
    /// none of them (its experiments carry no dev score: never best, kept by halving or promoted).
    pub suspect: bool,
}

impl NodeState {
    /// How many more seeds a worker may still train on this node to reach `seeds`: one for each
    /// seed short of a checkpoint. A failed run left none, and the worker tries again.
    pub fn seeds_to_train(&self, seeds: u32) -> u64 {
        let trained = self
            .experiments
            .iter()
            .filter(|e| e.checkpoint.is_some())
            .count() as u64;
        u64::from(seeds).saturating_sub(trained)
    }
    pub fn dev_scores(&self) -> Vec<f64> {
        self.experiments.iter().filter_map(|e| e.dev).collect()
    }
    pub fn mean_dev(&self) -> Option<f64> {
        let s = self.dev_scores();
        (!s.is_empty()).then(|| s.iter().sum::<f64>() / s.len() as f64)
    }
    /// The checkpoint with the best dev score.
    pub fn best_checkpoint(&self) -> Option<(&str, f64)> {
        self.experiments
            .iter()
            .filter_map(|e| Some((e.checkpoint.as_deref()?, e.dev?)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

/// One recorded review.
#[derive(Debug, Clone)]
pub struct ReviewRecord {
    pub node: String,
    pub seq: u32,
    pub verdicts: Vec<NodeVerdict>,
    pub proposals: Vec<Proposal>,
}

/// A test-split evaluation recorded during the campaign.
#[derive(Debug, Clone, Serialize)]
pub struct TestEval {
    pub node: String,
    pub checkpoint: String,
    pub value: f64,
}

/// Lock-in index: how concentrated the campaign's compute is.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LockIn {
    /// Share of experiments under the top-level direction that has the most.
    pub top_share: f64,
    pub top_direction: Option<String>,
    /// Longest chain of consecutive refinements without a sibling.
    pub max_lonely_depth: u32,
    /// Top-level directions opened.
    pub directions: usize,
}

#[derive(Debug, Clone, Default)]
pub struct CampaignState {
    pub root: String,
    pub nodes: BTreeMap<String, NodeState>,
    pub reviews: Vec<ReviewRecord>,
    pub test_evals: Vec<TestEval>,
    /// Accepted run_sft actions under the root (any job outcome: compute was spent).
    pub experiments_used: u64,
    /// The task's family, where the built-in agents can make data for it.
    pub family: Option<super::recipe::TaskFamily>,
}

impl CampaignState {
    /// The formats a recipe of this campaign's task may use (arithmetic's for a task the
    /// built-in agents cannot make data for).
    pub fn formats(&self) -> &'static [super::recipe::Format] {
        self.family
            .as_ref()
            .map_or(&super::recipe::FORMATS, |f| f.formats())
    }

    /// The default recipe in the task's first format.
    pub fn default_recipe(&self) -> super::recipe::Recipe {
        super::recipe::Recipe {
            format: self.formats()[0],
            ..Default::default()
        }
    }

    pub fn load(study: &Study, task: &str) -> Result<CampaignState> {
        let listed = study.list_nodes(
            &crate::model::Caller::new("orchestrator", crate::model::Role::Owner),
            ListNodesRequest {
                status: None,
                limit: 100_000,
                offset: 0,
                // The orchestrator reads every node, not an agent's page.
                max_tokens: Some(10_000_000),
                cursor: None,
            },
        )?;
        let metric = study
            .config()
            .tasks
            .get(task)
            .map_or_else(|| "exact_match".to_string(), |t| t.metric.clone());
        let mut st = CampaignState {
            root: crate::os::ROOT_NODE.to_string(),
            family: super::recipe::TaskFamily::from_task(task, &metric).ok(),
            ..Default::default()
        };
        let mut raw = Vec::new();
        // Evidence the dev tripwire flagged: no score of a suspect checkpoint counts, nor any
        // score of a node that produced one.
        let suspect_nodes = study.suspect_nodes()?;
        let suspect_cks = study.suspect_checkpoints()?;
        for n in &listed.nodes {
            let (meta, actions) = study.node_history(&n.id)?;
            // The campaign's work is only what the campaign branched; any other node in the
            // record (an agent's own, with its own `recipe:` or `proposal:` lines) is never
            // adopted, trained on the campaign's budget, or taken as a proposal done.
            if meta.id != st.root && !campaign_author(&meta.created_by) {
                continue;
            }
            raw.push((meta, actions));
        }
        for (meta, actions) in raw {
            let mut experiments: Vec<Experiment> = Vec::new();
            let mut dev: BTreeMap<String, f64> = BTreeMap::new();
            let suspect = suspect_nodes.contains(&meta.id);
            for a in &actions {
                let r = a;
                if r.decision.decision != Verdict::Accepted {
                    continue;
                }
                match r.action {
                    ActionName::RunSft => {
                        let seed = r.request.get("seed").and_then(|v| v.as_u64()).unwrap_or(0);
                        let checkpoint = r
                            .result
                            .as_ref()
                            .and_then(|v| v.get("checkpoint"))
                            .and_then(|v| v.as_str())
                            .map(str::to_string);
                        experiments.push(Experiment {
                            seed,
                            job_state: r.job.as_ref().map_or(JobState::Lost, |j| j.state),
                            checkpoint,
                            dev: None,
                        });
                    }
                    ActionName::Evaluate => {
                        // The task's own metric only: an evaluation records others beside it
                        // (a code task's counts of programs passed, wrong, crashed, …).
                        for m in r.metrics.iter().filter(|m| m.name == metric) {
                            if m.task == task && m.split == Split::Dev {
                                dev.insert(m.checkpoint.clone(), m.value);
                            } else if m.task == task && m.split == Split::Test {
                                st.test_evals.push(TestEval {
                                    node: meta.id.clone(),
                                    checkpoint: m.checkpoint.clone(),
                                    value: m.value,
                                });
                            }
                        }
                    }
                    ActionName::Review => {
                        let verdicts = r
                            .request
                            .get("verdicts")
                            .and_then(|v| serde_json::from_value(v.clone()).ok())
                            .unwrap_or_default();
                        let proposals = r
                            .request
                            .get("proposals")
                            .and_then(|v| serde_json::from_value(v.clone()).ok())
                            .unwrap_or_default();
                        st.reviews.push(ReviewRecord {
                            node: meta.id.clone(),
                            seq: r.seq,
                            verdicts,
                            proposals,
                        });
                    }
                    _ => {}
                }
            }
            for e in &mut experiments {
                e.dev = e
                    .checkpoint
                    .as_ref()
                    .and_then(|c| dev.get(c).copied())
                    .filter(|_| {
                        !suspect
                            && !e
                                .checkpoint
                                .as_ref()
                                .is_some_and(|c| suspect_cks.contains(c))
                    });
            }
            if !meta.parents.is_empty() {
                st.experiments_used += experiments.len() as u64;
            }
            let recipe = Recipe::find(&meta.hypothesis).and_then(|r| r.ok());
            let proposal = meta.hypothesis.lines().find_map(|l| {
                l.trim()
                    .strip_prefix("proposal:")
                    .map(|p| p.trim().to_string())
            });
            st.nodes.insert(
                meta.id.clone(),
                NodeState {
                    id: meta.id,
                    title: meta.title,
                    hypothesis: meta.hypothesis,
                    parents: meta.parents,
                    status: meta.status,
                    recipe,
                    proposal,
                    experiments,
                    verdict: None,
                    verdict_reason: None,
                    top: String::new(),
                    lonely_depth: 0,
                    suspect,
                },
            );
        }
        // Reviews in the order they were written (by the time in their node's sequence is not
        // global, so order by the review's own position: node then seq is stable and later reviews
        // of the same node win).
        for rv in &st.reviews {
            for v in &rv.verdicts {
                if let Some(n) = st.nodes.get_mut(&v.node) {
                    n.verdict = Some(v.verdict);
                    n.verdict_reason = Some(v.reason.clone());
                }
            }
        }
        st.derive_topology();
        Ok(st)
    }

    fn derive_topology(&mut self) {
        let ids: Vec<String> = self.nodes.keys().cloned().collect();
        let mut children: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for n in self.nodes.values() {
            for p in &n.parents {
                children.entry(p.clone()).or_default().push(n.id.clone());
            }
        }
        // Each node's direction (`top`) and lonely depth follow from its first parent's, so one
        // pass in node order (a parent is always older than its child) computes them all — linear
        // in the DAG, where walking every node's chain up to the root was quadratic in its depth.
        let mut ids = ids;
        ids.sort_by_key(|id| crate::model::node_num(id));
        let mut derived: BTreeMap<String, (String, u32)> = BTreeMap::new();
        for id in ids {
            let first = self.nodes.get(&id).and_then(|n| n.parents.first()).cloned();
            let (top, depth) = match first {
                None => (id.clone(), 0),
                Some(p) if p == self.root => (id.clone(), 0),
                Some(p) => {
                    let lonely = children.get(&p).map_or(0, |v| v.len()) <= 1;
                    // A parent outside the campaign's nodes is its own direction.
                    let (top, up) = derived.get(&p).cloned().unwrap_or((p.clone(), 0));
                    (top, if lonely { up + 1 } else { 0 })
                }
            };
            if let Some(n) = self.nodes.get_mut(&id) {
                n.top = top.clone();
                n.lonely_depth = depth;
            }
            derived.insert(id, (top, depth));
        }
    }

    pub fn lock_in(&self) -> LockIn {
        let mut per_top: BTreeMap<&str, u64> = BTreeMap::new();
        let mut directions = BTreeSet::new();
        let mut max_depth = 0;
        for n in self.nodes.values() {
            if n.id == self.root {
                continue;
            }
            directions.insert(n.top.as_str());
            *per_top.entry(n.top.as_str()).or_default() += n.experiments.len() as u64;
            max_depth = max_depth.max(n.lonely_depth);
        }
        let total: u64 = per_top.values().sum();
        let top = per_top
            .iter()
            .max_by_key(|(k, v)| (**v, std::cmp::Reverse(**k)));
        LockIn {
            top_share: match (top, total) {
                (Some((_, v)), t) if t > 0 => *v as f64 / t as f64,
                _ => 0.0,
            },
            top_direction: top.map(|(k, _)| k.to_string()),
            max_lonely_depth: max_depth,
            directions: directions.len(),
        }
    }

    /// Campaign nodes (everything but the root), in id order.
    pub fn campaign_nodes(&self) -> impl Iterator<Item = &NodeState> {
        self.nodes.values().filter(move |n| n.id != self.root)
    }

    /// Concluded nodes no review has given a verdict on yet.
    pub fn unreviewed(&self) -> Vec<&NodeState> {
        self.campaign_nodes()
            .filter(|n| n.status == NodeStatus::Concluded && n.verdict.is_none())
            .collect()
    }

    /// Proposals already branched, by their `node/seq#k` key.
    pub fn branched_proposals(&self) -> BTreeSet<String> {
        self.nodes
            .values()
            .filter_map(|n| n.proposal.clone())
            .collect()
    }

    /// The best node by mean dev score, optionally only among reviewer-promoted ones.
    pub fn best_by_dev(&self, promoted_only: bool) -> Option<&NodeState> {
        self.campaign_nodes()
            .filter(|n| !promoted_only || n.verdict == Some(ReviewVerdict::Promising))
            .filter(|n| n.best_checkpoint().is_some())
            .max_by(|a, b| {
                let (x, y) = (a.mean_dev().unwrap_or(-1.0), b.mean_dev().unwrap_or(-1.0));
                x.total_cmp(&y).then_with(|| b.id.cmp(&a.id))
            })
    }
}

/// Whether a node's author is the campaign itself: the orchestrator, the campaign's reviewer
/// (which branches its own proposals) or a baseline strategy's agent. Identities are the owner's
/// to give (tokens, `--agents`), so no outside agent can take one.
pub fn campaign_author(agent: &str) -> bool {
    agent == "orchestrator" || agent.starts_with("reviewer-") || agent.ends_with("-agent")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_run_leaves_its_seed_still_to_train() {
        let exp = |state, ckpt: Option<&str>| Experiment {
            seed: 0,
            job_state: state,
            checkpoint: ckpt.map(str::to_string),
            dev: None,
        };
        let mut n = NodeState {
            id: "n1".into(),
            title: String::new(),
            hypothesis: String::new(),
            parents: vec!["n0".into()],
            status: NodeStatus::Open,
            recipe: None,
            proposal: None,
            experiments: Vec::new(),
            verdict: None,
            verdict_reason: None,
            top: "n1".into(),
            lonely_depth: 0,
            suspect: false,
        };
        assert_eq!(n.seeds_to_train(1), 1);
        n.experiments.push(exp(JobState::Failed, None));
        assert_eq!(n.seeds_to_train(1), 1, "a failed run trained nothing");
        n.experiments.push(exp(JobState::Succeeded, Some("c1")));
        assert_eq!(n.seeds_to_train(1), 0);
        assert_eq!(n.seeds_to_train(3), 2);
    }
}
