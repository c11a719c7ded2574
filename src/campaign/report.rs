//! `rsim report`: what a campaign found — the best node against the base model, the DAG, the
//! lock-in index, budget used and the audit — as text or JSON. (`--html` writes the web page's
//! static snapshot, `faces::web::page::static_page`.)

use crate::api::types::ReviewVerdict;
use crate::campaign::state::{CampaignState, LockIn};
use crate::campaign::{RunOptions, saved_options};
use crate::model::NodeStatus;
use crate::os::Execute;
use crate::os::Study;
use crate::util::error::Result;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

#[derive(Debug, Serialize)]
pub struct NodeRow {
    pub id: String,
    pub title: String,
    pub parents: Vec<String>,
    pub status: NodeStatus,
    pub verdict: Option<ReviewVerdict>,
    /// The latest verdict's reason: the evidence it rests on.
    pub verdict_reason: Option<String>,
    pub runs: usize,
    pub dev: Vec<f64>,
    pub dev_mean: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct Best {
    pub node: String,
    pub title: String,
    pub dev_mean: Option<f64>,
    pub checkpoint: String,
    pub dev: f64,
    /// Whether the campaign promoted it (for orchestration, a node its reviewers judged
    /// promising; for a baseline, the best on dev). An orchestration campaign that judged nothing
    /// promising promotes nothing: this is then its best on dev, shown, not promoted, and the
    /// base model stands.
    pub promoted: bool,
    /// The protected test score, when the node was promoted and evaluated.
    pub test: Option<f64>,
    /// The checkpoint's score on evidence it was not selected on (the dev twin), when the task
    /// has one: the report is the owner's.
    pub fresh: Option<crate::os::FreshEvidence>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub study: String,
    pub task: String,
    pub metric: String,
    pub campaign: Option<RunOptions>,
    pub base_dev: Option<f64>,
    pub base_test: Option<f64>,
    pub best: Option<Best>,
    pub nodes: Vec<NodeRow>,
    pub nodes_by_status: BTreeMap<String, usize>,
    pub verdicts: BTreeMap<String, usize>,
    pub reviews: usize,
    pub experiments_used: u64,
    pub experiments_budget: Option<u64>,
    pub compute_seconds: f64,
    pub lock_in: LockIn,
    pub audit_attempts: u64,
    pub audit_rejected: u64,
    pub rejections_by_rule: BTreeMap<String, u64>,
    pub hacks_got_through: u64,
    pub dag_text: String,
}

pub fn build(study: &Study, task: Option<&str>) -> Result<Report> {
    let campaign = saved_options(study.root())?;
    let task = task
        .map(str::to_string)
        .or_else(|| campaign.as_ref().map(|c| c.task.clone()))
        .or_else(|| study.config().tasks.keys().next().cloned())
        .unwrap_or_default();
    let metric = campaign
        .as_ref()
        .map_or("exact_match".to_string(), |c| c.metric.clone());
    let st = CampaignState::load(study, &task)?;
    let base = study.base_checkpoint()?;
    let root_metrics: Vec<(u32, crate::model::MetricRecord)> = study
        .get_node(
            &crate::model::Caller::owner(),
            crate::api::types::GetNodeRequest::whole(crate::os::ROOT_NODE),
        )?
        .metrics
        .into_iter()
        .map(|m| (0, m))
        .collect();
    let base_score = |split: crate::model::Split| {
        root_metrics
            .iter()
            .find(|(_, m)| {
                m.checkpoint == base && m.split == split && m.task == task && m.name == metric
            })
            .map(|(_, m)| m.value)
    };
    let promoted_only = campaign
        .as_ref()
        .is_some_and(|c| c.strategy == crate::campaign::Strategy::Orchestra);
    let promoted = st.best_by_dev(promoted_only);
    let best = promoted.or_else(|| st.best_by_dev(false)).and_then(|n| {
        let (ck, dev) = n.best_checkpoint()?;
        Some((n, ck, dev))
    });
    let promoted = promoted.is_some();
    let fresh = match best {
        Some((_, ck, dev)) => {
            study.dev_twin_evidence(&crate::model::Caller::owner(), &task, ck, dev)?
        }
        None => None,
    };
    let best = best.map(|(n, ck, dev)| Best {
        node: n.id.clone(),
        title: n.title.clone(),
        dev_mean: n.mean_dev(),
        checkpoint: ck.to_string(),
        dev,
        promoted,
        test: st
            .test_evals
            .iter()
            .find(|t| t.checkpoint == ck)
            .map(|t| t.value),
        fresh,
    });
    let mut nodes_by_status = BTreeMap::new();
    let mut verdicts = BTreeMap::new();
    let mut ordered: Vec<_> = st.campaign_nodes().collect();
    ordered.sort_by_key(|n| crate::model::node_num(&n.id));
    let nodes: Vec<NodeRow> = ordered
        .into_iter()
        .map(|n| {
            *nodes_by_status
                .entry(format!("{:?}", n.status).to_lowercase())
                .or_insert(0) += 1;
            if let Some(v) = n.verdict {
                *verdicts.entry(verdict_name(v).to_string()).or_insert(0) += 1;
            }
            NodeRow {
                id: n.id.clone(),
                title: n.title.clone(),
                parents: n.parents.clone(),
                status: n.status,
                verdict: n.verdict,
                verdict_reason: n.verdict_reason.clone(),
                runs: n.experiments.len(),
                dev: n.dev_scores(),
                dev_mean: n.mean_dev(),
            }
        })
        .collect();
    let audit = crate::os::audit::audit(study)?;
    let (base_dev, base_test) = (
        base_score(crate::model::Split::Dev),
        base_score(crate::model::Split::Test),
    );
    Ok(Report {
        study: study.config().study.name.clone(),
        task,
        metric,
        experiments_budget: campaign.as_ref().map(|c| c.experiments),
        campaign,
        base_dev,
        base_test,
        best,
        nodes,
        nodes_by_status,
        verdicts,
        reviews: st.reviews.len(),
        experiments_used: st.experiments_used,
        compute_seconds: study.compute_seconds_used()?,
        lock_in: st.lock_in(),
        audit_attempts: audit.attempts,
        audit_rejected: audit.rejected,
        rejections_by_rule: audit.rejections_by_rule,
        hacks_got_through: audit.got_through,
        dag_text: study.dag_graph()?.to_text(),
    })
}

fn verdict_name(v: ReviewVerdict) -> &'static str {
    match v {
        ReviewVerdict::Promising => "promising",
        ReviewVerdict::DeadEnd => "dead_end",
        ReviewVerdict::NeedsMoreSeeds => "needs_more_seeds",
        ReviewVerdict::StillLearning => "still_learning",
    }
}

fn f3(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.3}"))
}

pub fn text(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Study {} — task {} ({})", r.study, r.task, r.metric);
    if let Some(c) = &r.campaign {
        let _ = writeln!(
            s,
            "Campaign: {:?}, {} experiments × {} steps, {} seed(s) per node, {} worker slot(s), seed {}",
            c.strategy, c.experiments, c.steps, c.seeds_per_node, c.workers, c.seed
        );
    }
    let _ = writeln!(
        s,
        "Base model: dev {}, test {}",
        f3(r.base_dev),
        f3(r.base_test)
    );
    match &r.best {
        Some(b) => {
            if !b.promoted {
                let _ = writeln!(
                    s,
                    "Promoted: nothing (no node was judged promising), so no test evaluation was \
                     spent and the base model stands (test {})",
                    f3(r.base_test)
                );
            }
            let _ = writeln!(
                s,
                "{}: {} \"{}\" — dev mean {}, best run {:.3}, test {} (checkpoint {})",
                if b.promoted {
                    "Best node"
                } else {
                    "Best on dev, not promoted"
                },
                b.node,
                crate::util::text::display(&b.title),
                f3(b.dev_mean),
                b.dev,
                f3(b.test),
                &b.checkpoint[..12.min(b.checkpoint.len())]
            );
            if let Some(f) = &b.fresh {
                let _ = writeln!(
                    s,
                    "  on evidence it was not selected on: {} {:.3} over {} items (dev {:.3}{})",
                    f.split,
                    f.score,
                    f.n,
                    f.dev,
                    b.test
                        .map(|t| format!(
                            "; dev − test {:+.3}, {} − test {:+.3}",
                            f.dev - t,
                            f.split,
                            f.score - t
                        ))
                        .unwrap_or_default()
                );
            }
            if let (Some(t), Some(bt)) = (b.test, r.base_test) {
                let _ = writeln!(
                    s,
                    "  vs base model on the protected test split: {:+.3}",
                    t - bt
                );
            }
        }
        None => {
            let _ = writeln!(s, "Best node: none scored yet");
        }
    }
    let _ = writeln!(
        s,
        "Budget: {} of {} experiments, {:.0} s of job compute",
        r.experiments_used,
        r.experiments_budget.map_or("-".into(), |b| b.to_string()),
        r.compute_seconds
    );
    let _ = writeln!(
        s,
        "DAG: {} node(s) {:?}, {} review(s), verdicts {:?}",
        r.nodes.len(),
        r.nodes_by_status,
        r.reviews,
        r.verdicts
    );
    let _ = writeln!(
        s,
        "Lock-in index: {:.0}% of experiments under the largest top-level direction ({}), longest \
         refinement chain without a sibling {}, {} top-level direction(s)",
        100.0 * r.lock_in.top_share,
        r.lock_in.top_direction.as_deref().unwrap_or("-"),
        r.lock_in.max_lonely_depth,
        r.lock_in.directions
    );
    let _ = writeln!(
        s,
        "Audit: {} attempted actions, {} rejected {:?}, hacks that got through: {}",
        r.audit_attempts, r.audit_rejected, r.rejections_by_rule, r.hacks_got_through
    );
    let _ = writeln!(s, "\nNodes:");
    for n in &r.nodes {
        let _ = writeln!(
            s,
            "  {:<5} {:<10} {:<17} runs {} dev {:<6} {}  ← {}",
            n.id,
            format!("{:?}", n.status).to_lowercase(),
            n.verdict.map_or("-", verdict_name),
            n.runs,
            f3(n.dev_mean),
            crate::util::text::display(&n.title),
            n.parents.join(" + ")
        );
        if let Some(why) = &n.verdict_reason {
            let _ = writeln!(s, "        {}", crate::util::text::display(why));
        }
    }
    let _ = writeln!(s, "\n{}", r.dag_text);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(promoted: bool, test: Option<f64>) -> Report {
        Report {
            study: "s".into(),
            task: "mixed4".into(),
            metric: "exact_match".into(),
            campaign: None,
            base_dev: Some(0.0),
            base_test: Some(0.004),
            best: Some(Best {
                node: "n1".into(),
                title: "plain format".into(),
                dev_mean: Some(0.0),
                checkpoint: "c224fd8ba9d797b2".into(),
                dev: 0.0,
                promoted,
                test,
                fresh: None,
            }),
            nodes: Vec::new(),
            nodes_by_status: BTreeMap::new(),
            verdicts: BTreeMap::new(),
            reviews: 0,
            experiments_used: 16,
            experiments_budget: Some(16),
            compute_seconds: 1.0,
            lock_in: LockIn {
                top_share: 0.5,
                top_direction: None,
                max_lonely_depth: 0,
                directions: 1,
            },
            audit_attempts: 0,
            audit_rejected: 0,
            rejections_by_rule: BTreeMap::new(),
            hacks_got_through: 0,
            dag_text: String::new(),
        }
    }

    #[test]
    fn a_campaign_that_promoted_nothing_says_so_and_that_the_base_model_stands() {
        let t = text(&report(false, None));
        assert!(
            t.contains("Promoted: nothing") && t.contains("the base model stands (test 0.004)"),
            "{t}"
        );
        assert!(t.contains("Best on dev, not promoted: n1"), "{t}");
        assert!(!t.contains("Best node:"), "{t}");
        let t = text(&report(true, Some(0.8)));
        assert!(
            t.contains("Best node: n1") && !t.contains("Promoted: nothing"),
            "{t}"
        );
    }
}
