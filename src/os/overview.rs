//! The whole DAG in one read for a picture of it: every node with its status, outcome, latest
//! review verdict and mean dev score, from the index in a few queries (no git walk), so a face
//! can lay out 100,000 nodes without asking per node.
//!
//! Invariant: a read of the index; no layout, no protocol (the layout is the faces' `dagview`).

use std::collections::HashMap;

use serde::Serialize;

use super::*;

/// One node of the overview.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OverviewNode {
    pub id: String,
    pub title: String,
    pub status: NodeStatus,
    /// A concluded node's outcome (positive, negative, inconclusive).
    pub outcome: Option<String>,
    /// Parents in order (the first parent is the one the node grew from).
    pub parents: Vec<String>,
    /// The latest review verdict on this node (promising, dead_end, needs_more_seeds).
    pub verdict: Option<String>,
    /// Mean of the node's dev values of the metric, and how many there are.
    pub score: Option<f64>,
    pub evals: u64,
    /// The node's evidence is suspect (a dev score significantly above the hidden dev twin's):
    /// its score is shown, marked, and never the best.
    pub suspect: bool,
}

/// Every node, in node order (parents before children), with the best node by mean dev score.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DagOverview {
    pub task: Option<String>,
    pub metric: Option<String>,
    pub nodes: Vec<OverviewNode>,
    /// The node with the highest mean dev score among those not suspect (ties: the older node).
    pub best: Option<String>,
    /// Why the study is open read-only (a clone without the study's key), if it is: views say so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<String>,
}

impl Study {
    /// Nodes whose evidence the dev tripwire found suspect (left out of every ranking).
    pub fn suspect_nodes(&self) -> Result<std::collections::BTreeSet<String>> {
        self.index.suspect_nodes()
    }

    /// Checkpoints a dev evaluation found significantly above the hidden dev twin: none of their
    /// scores is ranked, on any node.
    pub fn suspect_checkpoints(&self) -> Result<std::collections::BTreeSet<String>> {
        self.index.suspect_checkpoints()
    }

    /// The overview for `task` (default: the study's first task) and its configured metric.
    pub fn dag_overview(&self, task: Option<&str>) -> Result<DagOverview> {
        let task = match task {
            Some(t) => Some(t.to_string()),
            None => self.config.tasks.keys().next().cloned(),
        };
        let metric = task
            .as_ref()
            .and_then(|t| self.config.tasks.get(t))
            .map(|t| t.metric.clone());
        let mut scores: HashMap<String, (f64, u64)> = HashMap::new();
        if let (Some(t), Some(m)) = (&task, &metric) {
            for (node, mean, n) in self.index.mean_per_node(t, Split::Dev.as_str(), m)? {
                scores.insert(node, (mean, n));
            }
        }
        let suspects = self.index.suspect_nodes()?;
        let mut verdicts: HashMap<String, String> = HashMap::new();
        for r in self.index.review_requests()? {
            for v in r["verdicts"].as_array().into_iter().flatten() {
                if let (Some(n), Some(verdict)) = (v["node"].as_str(), v["verdict"].as_str()) {
                    verdicts.insert(n.to_string(), verdict.to_string());
                }
            }
        }
        let nodes: Vec<OverviewNode> = self
            .dag_graph()?
            .into_nodes()
            .into_iter()
            .map(|n| {
                let (score, evals) = scores.get(&n.id).map_or((None, 0), |&(m, k)| (Some(m), k));
                OverviewNode {
                    suspect: suspects.contains(&n.id),
                    verdict: verdicts.remove(&n.id),
                    score,
                    evals,
                    id: n.id,
                    title: n.title,
                    status: n.status,
                    outcome: n.outcome,
                    parents: n.parents,
                }
            })
            .collect();
        let best = nodes
            .iter()
            .filter(|n| !n.suspect)
            .filter_map(|n| n.score.map(|s| (n, s)))
            .max_by(|a, b| {
                a.1.total_cmp(&b.1).then_with(|| {
                    crate::model::node_num(&b.0.id).cmp(&crate::model::node_num(&a.0.id))
                })
            })
            .map(|(n, _)| n.id.clone());
        Ok(DagOverview {
            task,
            metric,
            nodes,
            best,
            read_only: self.read_only().map(str::to_string),
        })
    }
}

/// One training run's loss per logged step: the curve its run_sft result records, or for a run
/// still going (or recorded before results carried curves) its job's progress lines.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LossCurve {
    pub node: String,
    pub seq: u32,
    pub job: String,
    pub seed: Option<u64>,
    /// The job's state as recorded (`running` while the action is not recorded yet).
    pub state: String,
    /// [step, loss] pairs.
    pub points: Vec<[f64; 2]>,
}

/// A node's dev values of the metric with their mean and 95% interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeStat {
    pub node: String,
    pub values: Vec<f64>,
    pub mean: Option<f64>,
    pub ci95: Option<[f64; 2]>,
    /// The node's evidence is suspect (a dev score significantly above the hidden dev twin's):
    /// shown, marked, and never ranked.
    pub suspect: bool,
}

/// The difference of two nodes' means (`b - a`) with Welch's 95% interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeDiff {
    pub a: String,
    pub b: String,
    pub diff: f64,
    pub ci95: [f64; 2],
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub task: Option<String>,
    pub metric: Option<String>,
    pub nodes: Vec<NodeStat>,
    /// Every pair that has at least two values each.
    pub diffs: Vec<NodeDiff>,
}

/// Budget use and the lock-in index after each recorded action that changed them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimePoint {
    pub at: String,
    /// Training runs accepted so far.
    pub experiments: u64,
    pub evaluations: u64,
    pub compute_s: f64,
    pub nodes: u64,
    /// Share of the training runs under the top-level direction that has the most.
    pub top_share: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    pub points: Vec<TimePoint>,
    pub budget_compute_s: u64,
    pub budget_evaluations: u64,
    pub budget_nodes: u64,
}

/// Most points a timeline returns (evenly thinned past it, the last kept).
pub const TIMELINE_MAX_POINTS: usize = 2000;
/// Most points of a curve read from a job's log (evenly thinned past it).
const CURVE_MAX_POINTS: usize = 2000;
/// Most bytes of a job log read for its curve.
const CURVE_LOG_BYTES: u64 = 8 << 20;
/// Most nodes one comparison takes.
pub const COMPARE_MAX_NODES: usize = 12;

impl Study {
    fn need_node(&self, node: &str) -> Result<()> {
        match self.index.node(node)? {
            Some(_) => Ok(()),
            None => Err(Error::not_found(format!("node: no node {node}"))),
        }
    }

    /// A job's loss per logged step from its log (live while it runs).
    fn log_curve(&self, job: &str) -> Vec<[f64; 2]> {
        let log = self.job_log(job, CURVE_LOG_BYTES).unwrap_or_default();
        crate::jobs::protocol::curve_in(&log, CURVE_MAX_POINTS)
            .into_iter()
            .filter(|(_, l)| l.is_finite())
            .map(|(s, l)| [s as f64, l])
            .collect()
    }

    /// The loss curves of a node's training runs (accepted `run_sft` actions with a job).
    pub fn loss_curves(&self, node: &str) -> Result<Vec<LossCurve>> {
        self.need_node(node)?;
        let mut out = Vec::new();
        for r in self.index.node_accepted(node, ActionName::RunSft)? {
            let rec = &r.record;
            let Some(job) = &rec.job else { continue };
            // The curve run_sft recorded with its result; a run recorded before results
            // carried one: its job's progress lines.
            let recorded: Vec<[f64; 2]> = rec
                .result
                .as_ref()
                .and_then(|v| v.get("curve"))
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|p| Some([p.get("step")?.as_f64()?, p.get("loss")?.as_f64()?]))
                        .filter(|p| p[1].is_finite())
                        .collect()
                })
                .unwrap_or_default();
            let points = if recorded.is_empty() {
                self.log_curve(&job.id)
            } else {
                recorded
            };
            out.push(LossCurve {
                node: node.to_string(),
                seq: r.seq,
                job: job.id.clone(),
                seed: rec.request.get("seed").and_then(Value::as_u64),
                state: job.state.as_str().to_string(),
                points,
            });
        }
        for j in self.open_jobs(node) {
            if j.action != ActionName::RunSft {
                continue;
            }
            out.push(LossCurve {
                node: node.to_string(),
                seq: 0,
                points: self.log_curve(&j.job),
                job: j.job,
                seed: j.seed,
                state: "running".into(),
            });
        }
        Ok(out)
    }

    /// Compare nodes on the dev values of `task`'s metric (default: the first task).
    pub fn compare_nodes(&self, nodes: &[String], task: Option<&str>) -> Result<Comparison> {
        if nodes.is_empty() || nodes.len() > COMPARE_MAX_NODES {
            return Err(Error::invalid(format!(
                "nodes: compare 1 to {COMPARE_MAX_NODES} nodes (got {})",
                nodes.len()
            )));
        }
        let task = match task {
            Some(t) => Some(t.to_string()),
            None => self.config.tasks.keys().next().cloned(),
        };
        let metric = task
            .as_ref()
            .and_then(|t| self.config.tasks.get(t))
            .map(|t| t.metric.clone());
        let mut stats = Vec::new();
        let suspect_cks = self.index.suspect_checkpoints()?;
        for n in nodes {
            self.need_node(n)?;
            // Results only: scores of checkpoints kept part-way through a run are its trend.
            let values: Vec<f64> = self
                .index
                .node_results(n)?
                .into_iter()
                .map(|(_, m)| m)
                .filter(|m| {
                    Some(&m.task) == task.as_ref()
                        && m.split == Split::Dev
                        && Some(&m.name) == metric.as_ref()
                        && !suspect_cks.contains(&m.checkpoint)
                })
                .map(|m| m.value)
                .collect();
            let (mean, ci95) = crate::util::stats::mean_ci95(&values);
            stats.push(NodeStat {
                suspect: self.index.is_suspect(n)?,
                node: n.clone(),
                values,
                mean,
                ci95,
            });
        }
        let mut diffs = Vec::new();
        for i in 0..stats.len() {
            for j in i + 1..stats.len() {
                if let Some((diff, ci95)) =
                    crate::util::stats::welch_ci95(&stats[i].values, &stats[j].values)
                {
                    diffs.push(NodeDiff {
                        a: stats[i].node.clone(),
                        b: stats[j].node.clone(),
                        diff,
                        ci95,
                    });
                }
            }
        }
        Ok(Comparison {
            task,
            metric,
            nodes: stats,
            diffs,
        })
    }

    /// Budget use and lock-in over time, from the accepted actions in the order they were
    /// recorded.
    pub fn timeline(&self) -> Result<Timeline> {
        let dag = self.dag_graph()?;
        // Each node's top-level direction: the child of a root it descends from (first parents).
        let mut top: HashMap<String, String> = HashMap::new();
        for n in dag.nodes() {
            let t = match n.parents.first() {
                None => n.id.clone(),
                Some(p) => match top.get(p) {
                    Some(pt) if dag.node(p).is_some_and(|pn| !pn.parents.is_empty()) => pt.clone(),
                    _ => n.id.clone(),
                },
            };
            top.insert(n.id.clone(), t);
        }
        let mut rows = self.index.actions(None, false, u64::MAX >> 2)?;
        rows.sort_by(|a, b| a.record.at.cmp(&b.record.at));
        let mut per_top: HashMap<String, u64> = HashMap::new();
        let mut nodes_seen: std::collections::HashSet<String> = Default::default();
        let mut p = TimePoint {
            at: String::new(),
            experiments: 0,
            evaluations: 0,
            compute_s: 0.0,
            nodes: 0,
            top_share: 0.0,
        };
        let mut points = Vec::new();
        for r in rows {
            let rec = &r.record;
            if nodes_seen.insert(r.node.clone()) {
                p.nodes += 1;
            }
            if let Some(j) = &rec.job {
                p.compute_s += j.compute_s.unwrap_or(j.duration_s).max(0.0);
            }
            match rec.action {
                ActionName::RunSft => {
                    p.experiments += 1;
                    let t = top.get(&r.node).cloned().unwrap_or_else(|| r.node.clone());
                    *per_top.entry(t).or_default() += 1;
                    let max = per_top.values().copied().max().unwrap_or(0);
                    p.top_share = max as f64 / p.experiments as f64;
                }
                ActionName::Evaluate => p.evaluations += 1,
                _ => {}
            }
            p.at = rec.at.clone();
            points.push(p.clone());
        }
        if points.len() > TIMELINE_MAX_POINTS {
            let step = points.len().div_ceil(TIMELINE_MAX_POINTS);
            let last = points.last().cloned();
            points = points.into_iter().step_by(step).collect();
            if let Some(l) = last
                && points.last() != Some(&l)
            {
                points.push(l);
            }
        }
        let b = &self.config.budgets;
        Ok(Timeline {
            points,
            budget_compute_s: b.compute_seconds,
            budget_evaluations: b.evaluations,
            budget_nodes: b.max_nodes,
        })
    }
}

/// One review's verdict on a node, with the review's reasoning and where it is recorded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReviewOf {
    /// The node the review was recorded on, its action seq and commit.
    pub on: String,
    pub seq: u32,
    pub commit: String,
    pub agent: String,
    pub at: String,
    pub verdict: String,
    pub reason: String,
    /// The review's summary (its whole reasoning).
    pub summary: String,
}

impl Study {
    /// Every accepted review's verdict on `node`, oldest first.
    pub fn reviews_of(&self, node: &str) -> Result<Vec<ReviewOf>> {
        self.need_node(node)?;
        let mut out = Vec::new();
        for r in self.index.reviews_naming(node)? {
            let summary = r.record.request["summary"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            for v in r.record.request["verdicts"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if v["node"].as_str() != Some(node) {
                    continue;
                }
                out.push(ReviewOf {
                    on: r.node.clone(),
                    seq: r.seq,
                    commit: r.commit.clone(),
                    agent: r.record.agent.clone(),
                    at: r.record.at.clone(),
                    verdict: v["verdict"].as_str().unwrap_or_default().to_string(),
                    reason: v["reason"].as_str().unwrap_or_default().to_string(),
                    summary: summary.clone(),
                });
            }
        }
        Ok(out)
    }
}
