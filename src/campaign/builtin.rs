//! Built-in agents (no LLM): deterministic, seeded search policies. The Worker runs a node's
//! recipe with a few seeds and concludes; the Reviewer compares related evidence, gives verdicts
//! and proposes new directions. Both act only through the Experiment OS actions. Neither ever
//! reads a test-split score: they see dev scores only (`CampaignState` keeps test results apart,
//! and nothing here touches them).

use super::recipe::{Init, Recipe, TaskFamily};
use super::state::{CampaignState, NodeState};
use super::{ReviewTask, ReviewerAgent, WorkerAgent, WorkerTask};
use crate::api::types::{
    CompareRequest, ConcludeRequest, EvaluateRequest, NodeVerdict, Proposal, ReviewRequest,
    ReviewVerdict, RunSftRequest, Trend,
};
use crate::model::{JobState, NodeStatus, Outcome, Split};
use crate::os::Execute;
use crate::os::Study;
use crate::util::error::{Error, ErrorKind, Result};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::BTreeSet;

pub struct BuiltinWorker;

/// The seed of the k-th experiment on a node: a function of the campaign seed, the node and k,
/// so a resumed campaign repeats nothing and a rerun with the same seed repeats everything.
pub fn experiment_seed(campaign_seed: u64, node: &str, k: usize) -> u64 {
    let n = crate::model::node_num(node).max(0) as u64;
    campaign_seed
        .wrapping_mul(1_000_003)
        .wrapping_add(n * 101)
        .wrapping_add(k as u64)
}

impl WorkerAgent for BuiltinWorker {
    fn name(&self) -> &str {
        "builtin"
    }

    fn work(&self, study: &Study, t: &WorkerTask) -> Result<()> {
        let task = &t.opts.task;
        let st = CampaignState::load(study, task)?;
        let family = TaskFamily::from_task(task, &t.opts.metric)?;
        let node = st
            .nodes
            .get(&t.node)
            .ok_or_else(|| Error::not_found(format!("node {}", t.node)))?;
        let Some(recipe) = node.recipe.clone() else {
            study.conclude(
                &t.caller,
                ConcludeRequest {
                    node: t.node.clone(),
                    outcome: Outcome::Inconclusive,
                    findings: "No `recipe:` line in the hypothesis: the built-in worker only runs \
                               recipes."
                        .into(),
                    best_checkpoint: None,
                },
            )?;
            return Ok(());
        };
        for (name, req) in recipe.datasets(&family, &t.node)? {
            if study.dataset(&name)?.is_none() {
                match study.register_dataset(&t.caller, req) {
                    Ok(_) => {}
                    // Another worker registered it meanwhile.
                    Err(e) if e.kind == ErrorKind::Rejected && study.dataset(&name)?.is_some() => {}
                    Err(e) => return Err(e),
                }
            }
            // A dataset is reused only if the campaign registered it: a name another agent took
            // first (with other rows under it) is never trained on.
            if let Some((_, on, _)) = study.dataset(&name)? {
                let (_, actions) = study.node_history(&on)?;
                let by = actions
                    .iter()
                    .find(|a| {
                        a.action == crate::model::ActionName::RegisterDataset
                            && a.decision.accepted()
                            && a.request["name"] == name.as_str()
                    })
                    .map(|a| a.agent.clone())
                    .unwrap_or_default();
                if !(by.starts_with("worker-") || super::state::campaign_author(&by)) {
                    return Err(Error::invalid(format!(
                        "dataset {name:?} was registered outside this campaign (by {:?} on {on}); the built-in worker will not train on it",
                        crate::util::text::sanitize_line(&by)
                    )));
                }
            }
        }
        let datasets: Vec<String> = recipe
            .datasets(&family, &t.node)?
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let base = match recipe.init {
            Init::Base => "base".to_string(),
            Init::Parent => node
                .parents
                .iter()
                .filter_map(|p| st.nodes.get(p)?.best_checkpoint())
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map_or("base".to_string(), |(c, _)| c.to_string()),
        };
        // Resume: score any checkpoint trained but not yet evaluated.
        let mut scored: Vec<(String, f64)> = Vec::new();
        for e in &node.experiments {
            match (&e.checkpoint, e.dev) {
                (Some(c), Some(v)) => scored.push((c.clone(), v)),
                // A checkpoint whose scoring is refused or fails (a spent budget; a hidden split
                // that could not be scored in what its evaluation had left) stays unscored.
                (Some(c), None) => {
                    if let Ok(v) = evaluate_dev(study, t, c)? {
                        scored.push((c.clone(), v));
                    }
                }
                _ => {}
            }
        }
        let mut failures = node
            .experiments
            .iter()
            .filter(|e| e.job_state != JobState::Succeeded)
            .count();
        let mut k = node.experiments.len();
        let mut errors = Vec::new();
        // The seeds a node still needs run side by side (the backend's job slots bound how many
        // train at once): a direction climbing the rungs alone keeps both slots busy.
        while scored.len() < t.opts.seeds_per_node as usize && failures < 2 {
            let want = t.opts.seeds_per_node as usize - scored.len();
            let claimed = (0..want).take_while(|_| t.budget.claim()).count();
            if claimed == 0 {
                break;
            }
            let req = |i: usize| RunSftRequest {
                node: t.node.clone(),
                base: base.clone(),
                datasets: datasets.clone(),
                learning_rate: recipe.lr,
                steps: t.opts.steps,
                batch_size: t.opts.batch_size,
                warmup_steps: (t.opts.steps / 10).min(50),
                schedule: recipe.schedule,
                adapter: Default::default(),
                answer_only_loss: true,
                seed: experiment_seed(t.opts.seed, &t.node, k + i),
                // A dev score half-way and at the end: how the run was still moving.
                eval_every: (t.opts.steps / 2).max(1),
                eval_task: Some(task.clone()),
            };
            let root = study.root().to_path_buf();
            let root = &root;
            let outcomes: Vec<Result<SeedRun>> = if claimed == 1 {
                vec![one_seed(study, t, req(0))]
            } else {
                std::thread::scope(|scope| {
                    let handles: Vec<_> = (0..claimed)
                        .map(|i| {
                            let r = req(i);
                            scope.spawn(move || Study::open(root).and_then(|s| one_seed(&s, t, r)))
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| {
                            h.join().unwrap_or_else(|_| {
                                Err(Error::internal("a worker thread panicked"))
                            })
                        })
                        .collect()
                })
            };
            k += claimed;
            let mut stop = None;
            for o in outcomes {
                match o {
                    Ok(SeedRun::Scored(c, v)) => scored.push((c, v)),
                    Ok(SeedRun::Failed(why)) => {
                        failures += 1;
                        errors.push(why);
                    }
                    Ok(SeedRun::Refused(why)) => {
                        t.budget.release();
                        errors.push(why);
                        stop = Some(None);
                    }
                    Err(e) => {
                        t.budget.release();
                        stop = Some(Some(e));
                    }
                }
            }
            match stop {
                Some(Some(e)) => return Err(e),
                Some(None) => break,
                None => {}
            }
        }
        let parent_mean = node
            .parents
            .iter()
            .filter_map(|p| st.nodes.get(p)?.mean_dev())
            .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v))))
            .or(t.base_dev);
        let scores: Vec<f64> = scored.iter().map(|s| s.1).collect();
        let best = scored
            .iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(c, _)| c.clone());
        let (outcome, findings) = findings(&recipe, &scores, parent_mean, &errors, t.opts.steps);
        study.conclude(
            &t.caller,
            ConcludeRequest {
                node: t.node.clone(),
                outcome,
                findings,
                best_checkpoint: best,
            },
        )?;
        Ok(())
    }
}

/// What one seed's run came to.
enum SeedRun {
    /// Its checkpoint and dev score.
    Scored(String, f64),
    /// Its job failed (the budget was spent).
    Failed(String),
    /// The policy refused it (nothing ran).
    Refused(String),
}

/// Train one seed and score its checkpoint on dev (the run's own `eval_every` scored it, unless
/// that evaluation was refused or failed).
fn one_seed(study: &Study, t: &WorkerTask, req: RunSftRequest) -> Result<SeedRun> {
    match study.run_sft(&t.caller, req) {
        Ok(r) => match r.checkpoint {
            Some(c) => {
                let scored_at_end = r
                    .dev_curve
                    .iter()
                    .find(|p| p.checkpoint == c)
                    .and_then(|p| p.metrics.get(&t.opts.metric).copied());
                match scored_at_end {
                    Some(v) => Ok(SeedRun::Scored(c, v)),
                    None => Ok(match evaluate_dev(study, t, &c)? {
                        Ok(v) => SeedRun::Scored(c, v),
                        // Trained (its compute spent) but not scored.
                        Err(why) => {
                            SeedRun::Failed(format!("checkpoint {c} was not scored: {why}"))
                        }
                    }),
                }
            }
            None => Ok(SeedRun::Failed(format!(
                "job {} {}: {}",
                r.job.id,
                r.job.state.as_str(),
                r.job.error.unwrap_or_default()
            ))),
        },
        Err(e) if e.kind == ErrorKind::Rejected => Ok(SeedRun::Refused(e.message)),
        Err(e) => Err(e),
    }
}

/// Score a checkpoint on dev: `Ok(Err(why))` when the evaluation was refused (a spent budget)
/// or recorded no score (its job, or its hidden twin's, failed); `Err` for anything else.
fn evaluate_dev(
    study: &Study,
    t: &WorkerTask,
    checkpoint: &str,
) -> Result<std::result::Result<f64, String>> {
    let r = match study.evaluate(
        &t.caller,
        EvaluateRequest {
            node: t.node.clone(),
            checkpoint: checkpoint.to_string(),
            task: t.opts.task.clone(),
            split: Split::Dev,
        },
    ) {
        Ok(r) => r,
        Err(e) if e.kind == ErrorKind::Rejected => return Ok(Err(e.message)),
        Err(e) => return Err(e),
    };
    Ok(r.metrics.get(&t.opts.metric).copied().ok_or_else(|| {
        format!(
            "the evaluation of {checkpoint} recorded no {} (job {}: {}{})",
            t.opts.metric,
            r.job.id,
            r.job.state.as_str(),
            r.job
                .error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        )
    }))
}

fn findings(
    recipe: &Recipe,
    scores: &[f64],
    parent: Option<f64>,
    errors: &[String],
    steps: u64,
) -> (Outcome, String) {
    let mut s = format!("Ran `{recipe}` for {steps} steps per seed.\n\n");
    if scores.is_empty() {
        s.push_str("No run produced a scored checkpoint.");
        for e in errors {
            s.push_str(&format!("\n- {e}"));
        }
        return (Outcome::Inconclusive, s);
    }
    let mean = scores.iter().sum::<f64>() / scores.len() as f64;
    let list: Vec<String> = scores.iter().map(|v| format!("{v:.3}")).collect();
    s.push_str(&format!(
        "Dev exact match over {} seed(s): mean {mean:.3} ({}).",
        scores.len(),
        list.join(", ")
    ));
    let outcome = match parent {
        Some(p) => {
            s.push_str(&format!(" The parent (or base model) scored {p:.3}."));
            if mean > p + 0.005 {
                Outcome::Positive
            } else if mean + 0.005 < p {
                Outcome::Negative
            } else {
                Outcome::Inconclusive
            }
        }
        None => Outcome::Inconclusive,
    };
    for e in errors {
        s.push_str(&format!("\n- failed run: {e}"));
    }
    (outcome, s)
}

/// The built-in Reviewer: compares the nodes under review with their siblings, parent and
/// cousins (mean ± 95% interval over seeds), gives each a verdict, and proposes refinements of the
/// promising ones, merges of two promising findings, replications of uncertain ones — and a new
/// top-level direction whenever the lock-in guard says exploration has narrowed too far.
pub struct BuiltinReviewer;

impl ReviewerAgent for BuiltinReviewer {
    fn name(&self) -> &str {
        "builtin"
    }

    fn review(&self, study: &Study, t: &ReviewTask) -> Result<()> {
        let st = CampaignState::load(study, &t.opts.task)?;
        let mut rng = StdRng::seed_from_u64(
            t.opts
                .seed
                .wrapping_mul(7919)
                .wrapping_add(st.reviews.len() as u64),
        );
        if t.opening {
            return opening_review(study, t, &st);
        }
        // Evidence: the targets, their siblings and the anchor's other children (cousins of deeper
        // nodes), all with dev scores.
        let mut related: BTreeSet<String> = t.targets.iter().cloned().collect();
        for id in &t.targets {
            if let Some(n) = st.nodes.get(id) {
                for p in &n.parents {
                    if st.nodes.get(p).is_some_and(|pn| pn.mean_dev().is_some()) {
                        related.insert(p.clone());
                    }
                    for s in st.campaign_nodes().filter(|s| s.parents.contains(p)) {
                        if s.mean_dev().is_some() {
                            related.insert(s.id.clone());
                        }
                    }
                }
            }
        }
        // Also the best node elsewhere, so verdicts are relative to the whole campaign.
        if let Some(b) = st.best_by_dev(false) {
            related.insert(b.id.clone());
        }
        // And the other nodes of each target's rung: promotion to the next rung is among them.
        let rung_of = |n: &NodeState| n.recipe.as_ref().map_or(0, |r| r.rung);
        // With the line each came from: whether a line's dev gain grew since its previous rung,
        // and the line's first run: a line on the floor is judged on its loss since then.
        for id in &t.targets {
            if let Some(n) = st.nodes.get(id)
                && rung_of(n) > 0
            {
                for p in st.campaign_nodes().filter(|p| rung_of(p) == rung_of(n)) {
                    related.insert(p.id.clone());
                    related.extend(p.parents.first().cloned());
                    related.extend(line_first_run(&st, p).map(|f| f.id.clone()));
                }
            }
            if let Some(f) = st.nodes.get(id).and_then(|n| line_first_run(&st, n)) {
                related.insert(f.id.clone());
            }
        }
        let compared: Vec<String> = related.into_iter().take(64).collect();
        let rows = if compared.len() >= 2 {
            study
                .compare(
                    &t.caller,
                    CompareRequest {
                        node: t.anchor.clone(),
                        nodes: compared.clone(),
                        task: t.opts.task.clone(),
                        split: Split::Dev,
                        metric: t.opts.metric.clone(),
                    },
                )?
                .rows
        } else {
            Vec::new()
        };
        let mean_of = |id: &str| -> Option<(f64, u64, Option<[f64; 2]>)> {
            rows.iter()
                .find(|r| r.node == id)
                .and_then(|r| Some((r.mean?, r.n, r.ci95)))
                .or_else(|| {
                    let n = st.nodes.get(id)?;
                    Some((n.mean_dev()?, n.dev_scores().len() as u64, None))
                })
        };
        let best_mean = compared
            .iter()
            .filter_map(|id| mean_of(id).map(|m| m.0))
            .fold(0.0f64, f64::max);

        let trend_of = |id: &str| rows.iter().find(|r| r.node == id).and_then(|r| r.trend);
        let top = top_rung(
            t.opts.experiments,
            t.opts.seeds_per_node,
            st.formats().len(),
        );
        // The dev gain per 1,000 steps and the training loss at the end of the run of the
        // checkpoint a continued node started from (its line's rung before).
        let rung_before = |n: &NodeState| -> RungBefore {
            let Some(tr) = n
                .recipe
                .as_ref()
                .filter(|r| r.init == Init::Parent)
                .and_then(|_| trend_of(n.parents.first()?))
            else {
                return RungBefore::default();
            };
            RungBefore {
                gain: tr.gain_per_1k.map(|g| g.mean),
                loss_end: Some(tr.loss_end.mean).filter(|l| l.is_finite() && *l > 0.0),
                first_run: line_first_run(&st, n)
                    .and_then(|f| trend_of(&f.id))
                    .and_then(|f| {
                        Some(FirstRun {
                            loss_end: Some(f.loss_end.mean)
                                .filter(|l| l.is_finite() && *l > 0.0)?,
                            trained_steps: f.trained_steps,
                        })
                    }),
            }
        };

        let mut verdicts = Vec::new();
        let mut promising: Vec<(&NodeState, f64)> = Vec::new();
        let mut replicate: Vec<&NodeState> = Vec::new();
        // Nodes that earn a larger budget (continued training), with their projected score.
        let mut to_continue: Vec<(&NodeState, f64, String)> = Vec::new();
        for id in &t.targets {
            let Some(n) = st.nodes.get(id) else { continue };
            let trend = trend_of(id);
            let judged = judge(
                n,
                mean_of(id),
                trend,
                rung_before(n),
                best_mean,
                t.opts.steps,
                top,
            );
            match judged.verdict {
                ReviewVerdict::Promising => promising.push((n, judged.mean)),
                ReviewVerdict::NeedsMoreSeeds => replicate.push(n),
                ReviewVerdict::DeadEnd | ReviewVerdict::StillLearning => {}
            }
            if judged.continue_it {
                to_continue.push((n, judged.projected, judged.evidence.clone()));
            }
            verdicts.push(NodeVerdict {
                node: id.clone(),
                verdict: judged.verdict,
                reason: judged.reason,
            });
        }
        // Successive halving. At the first rung every opening direction (a child of the root)
        // still learning goes on: at a small budget exact match lags the loss (a format can score
        // 0.01 at 600 steps and 0.75 at 1,200). Every other node — a refinement at the first rung,
        // any node above it — goes on only if it is in the better third of its rung (η = 3, two
        // tracks below). Above the first rung that waits until the last node of the rung
        // concludes; the first rung never completes (new directions keep arriving), so there the
        // ranking is among the nodes concluded so far.
        let opening = |n: &NodeState| n.parents == [st.root.clone()];
        // Learners above the first rung whose rung is not complete yet wait for it; the budget
        // their line may need is kept for them (below).
        let learners_above: Vec<&NodeState> = to_continue
            .iter()
            .map(|(n, _, _)| *n)
            .filter(|n| rung_of(n) > 0)
            .collect();
        let mut waiting: Vec<&NodeState> = Vec::new();
        to_continue.retain(|(n, _, _)| rung_of(n) == 0 && opening(n));
        let rungs: BTreeSet<u32> = t
            .targets
            .iter()
            .filter_map(|id| st.nodes.get(id))
            .filter(|n| rung_of(n) > 0 || !opening(n))
            .map(rung_of)
            .collect();
        for rung in rungs {
            let peers: Vec<&NodeState> = st
                .campaign_nodes()
                .filter(|p| rung_of(p) == rung)
                .filter(|p| rung > 0 || p.status != NodeStatus::Open)
                .collect();
            if peers.iter().any(|p| p.status == NodeStatus::Open) {
                waiting.extend(learners_above.iter().filter(|n| rung_of(n) == rung));
                continue;
            }
            let judged: Vec<(&NodeState, Judged)> = peers
                .iter()
                .map(|p| {
                    (
                        *p,
                        judge(
                            p,
                            mean_of(&p.id),
                            trend_of(&p.id),
                            rung_before(p),
                            best_mean,
                            t.opts.steps,
                            top,
                        ),
                    )
                })
                .collect();
            for (p, j) in halving_keep(judged) {
                let continued_already = st
                    .campaign_nodes()
                    .any(|c| c.parents.first() == Some(&p.id) && rung_of(c) == rung + 1);
                if j.continue_it && !continued_already {
                    to_continue.push((p, j.projected, j.evidence));
                }
            }
        }
        // Higher rungs first (they survived more halving), then by projected dev.
        to_continue.sort_by(|a, b| {
            rung_of(b.0)
                .cmp(&rung_of(a.0))
                .then_with(|| b.1.total_cmp(&a.1))
                .then_with(|| a.0.id.cmp(&b.0.id))
        });
        // A line never climbs on the budget kept for a line above it: a continuation goes ahead
        // only if the budget left covers it after the runs kept for every line climbing at a
        // higher rung (open there, or waiting for its rung to complete).
        let seeds = u64::from(t.opts.seeds_per_node.max(1));
        // The rungs of the lines open above the first rung (each runs there now).
        let open_above: Vec<u32> = st
            .campaign_nodes()
            .filter(|n| n.status == NodeStatus::Open && rung_of(n) > 0)
            .map(rung_of)
            .collect();
        let climbing: Vec<u32> = waiting
            .iter()
            .map(|n| rung_of(n))
            .chain(open_above.iter().copied())
            .collect();
        let rungs: Vec<u32> = to_continue.iter().map(|(n, _, _)| rung_of(n)).collect();
        let grants = grant_rungs(&rungs, &climbing, t.budget_left, seeds, top);
        let (granted, held): (Vec<_>, Vec<_>) =
            to_continue.into_iter().zip(grants).partition(|(_, g)| *g);
        let to_continue: Vec<_> = granted.into_iter().map(|(c, _)| c).collect();
        let held_back: Vec<String> = held.iter().map(|((n, _, _), _)| n.id.clone()).collect();
        for v in verdicts.iter_mut().filter(|v| held_back.contains(&v.node)) {
            v.reason.push_str(
                "; held back for now: the budget left is kept for the lines climbing above it",
            );
        }
        promising.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.id.cmp(&b.0.id)));

        // Proposals, within the budget that is left.
        let slots = t.budget_left.div_ceil(t.opts.seeds_per_node.max(1) as u64) as usize;
        let mut proposals = Vec::new();
        let mut tried: BTreeSet<String> = st
            .campaign_nodes()
            .filter_map(|n| n.recipe.as_ref().map(|r| r.to_string()))
            .collect();
        // A larger budget for what is still learning comes first: the evidence says "not yet".
        for (n, projected, evidence) in &to_continue {
            let Some(r) = &n.recipe else { continue };
            let c = r.continued();
            if tried.insert(c.to_string()) {
                proposals.push(proposal(
                    vec![n.id.clone()],
                    &c,
                    &format!(
                        "Continue {} from its best checkpoint for {} more steps (rung {} of \
                         successive halving): {evidence}; projected dev {:.3}.",
                        n.id,
                        t.opts.steps,
                        c.rung,
                        projected.min(1.0)
                    ),
                ));
            }
        }
        let lock = st.lock_in();
        if t.guard_active {
            // Open a different direction first: a format no top-level direction has used, or the
            // least-used one, with the best optimiser settings seen so far.
            let template = promising
                .first()
                .and_then(|(n, _)| n.recipe.clone())
                .unwrap_or_else(|| st.default_recipe());
            let used: Vec<_> = st
                .campaign_nodes()
                .filter(|n| n.parents.iter().any(|p| p == &st.root))
                .filter_map(|n| n.recipe.as_ref().map(|r| r.format))
                .collect();
            let dominant = lock
                .top_direction
                .as_ref()
                .and_then(|d| st.nodes.get(d))
                .and_then(|n| n.recipe.as_ref())
                .map(|r| r.format);
            let mut formats = st.formats().to_vec();
            formats.sort_by_key(|f| {
                (
                    used.iter().filter(|u| *u == f).count(),
                    Some(*f) == dominant,
                )
            });
            for f in formats {
                let mut r = template.with_format(f);
                r.init = Init::Base;
                if Some(f) == dominant {
                    continue;
                }
                for _ in 0..4 {
                    if !tried.contains(&r.to_string()) {
                        break;
                    }
                    r = r.mutate(&mut rng).0;
                    r.init = Init::Base;
                }
                if tried.insert(r.to_string()) {
                    proposals.push(proposal(
                        vec![st.root.clone()],
                        &r,
                        &format!(
                            "Lock-in guard: {:.0}% of experiments sit under {} and refinements run \
                             {} deep without a sibling; opening a different direction.",
                            100.0 * lock.top_share,
                            lock.top_direction.as_deref().unwrap_or("one direction"),
                            lock.max_lonely_depth
                        ),
                    ));
                    break;
                }
            }
        }
        // The ladder: while directions climb the rungs, the budget their next rungs need is kept
        // from exploration (refinements, merges, replications), as successive halving keeps it
        // for promotions: for each line climbing (a node continued now, one open above the first
        // rung, or one still learning that waits for its rung to complete), the runs from its next
        // rung to the top one. Halving drops lines rung by rung, and what they had kept goes back
        // to exploration.
        let reserve: u64 = to_continue
            .iter()
            .map(|(n, _, _)| rung_of(n) + 1)
            // (A waiting line has not started its next rung: it needs that one too.)
            .chain(waiting.iter().map(|n| rung_of(n)))
            .chain(open_above.iter().copied())
            .map(|r| u64::from(top.saturating_sub(r)) * seeds)
            .sum();
        let continuing = to_continue.len() as u64 * seeds;
        let explore_slots = (t.budget_left.saturating_sub(continuing + reserve) / seeds) as usize;
        let fixed = proposals.len();
        // Keep every worker slot busy: when this group has too few promising nodes, refine the
        // campaign's best earlier promising ones too (dev evidence only, never dead ends).
        let mut to_refine = promising.clone();
        if to_refine.len() < t.opts.workers {
            let mut earlier: Vec<(&NodeState, f64)> = st
                .campaign_nodes()
                .filter(|n| n.verdict == Some(ReviewVerdict::Promising))
                .filter(|n| !to_refine.iter().any(|(p, _)| p.id == n.id))
                .filter_map(|n| Some((n, n.mean_dev()?)))
                .collect();
            earlier.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.id.cmp(&b.0.id)));
            let need = t.opts.workers - to_refine.len();
            to_refine.extend(earlier.into_iter().take(need));
        }
        // The campaign's best node, once its line has levelled off above the first rung, is
        // polished from its own checkpoint (a lower learning rate first, then another knob), as
        // a practitioner anneals a run that has stopped improving: it beat every peer of every
        // rung it climbed, so nothing is skipped, and a variant restarted from the base model
        // could not catch up.
        //
        // Late in the budget a variant from the base model is hopeless: the budget left for
        // exploration cannot take it to the rung of the campaign's best line. Then no such variant
        // is started; a levelled-off node above the first rung is polished instead (it survived
        // the rung below it), and one on the first rung gets nothing.
        let campaign_best = st.best_by_dev(false);
        let best_rung = campaign_best.map_or(0, rung_of);
        let hopeless = restart_is_hopeless(explore_slots as u64 * seeds, best_rung, seeds);
        let campaign_best = campaign_best.map(|b| b.id.clone());
        for (i, (n, m)) in to_refine.iter().enumerate() {
            let Some(r) = &n.recipe else { continue };
            let polish = rung_of(n) > 0
                && (hopeless || campaign_best.as_ref() == Some(&n.id))
                && !to_continue.iter().any(|(c, _, _)| c.id == n.id)
                && !waiting.iter().any(|c| c.id == n.id);
            if hopeless && !polish {
                continue;
            }
            let count = if i == 0 { 2 } else { 1 };
            let mut polishes = if polish {
                r.polishes(&mut rng)
            } else {
                Vec::new()
            };
            polishes.reverse();
            for _ in 0..count {
                for _attempt in 0..6 {
                    let (c, what) = if let Some(p) = polishes.pop() {
                        p
                    } else if hopeless {
                        break;
                    } else {
                        // A refinement starts from the base model (the first rung): only halving
                        // promotes a line to a larger budget, so a variant of a climbing node
                        // cannot climb past the nodes of its rung it never beat.
                        let (mut c, what) = r.mutate(&mut rng);
                        if c.init == Init::Parent {
                            // (A mutation that only continued the parent is now the parent's
                            // own recipe, already tried.)
                            c.init = Init::Base;
                            c.rung = 0;
                        }
                        (c, what)
                    };
                    if tried.insert(c.to_string()) {
                        let why = if c.init == Init::Parent {
                            format!(
                                "Polish {} (dev {m:.3}, {}, levelled off at rung {}) from its \
                                 best checkpoint: {what}.",
                                n.id,
                                if campaign_best.as_ref() == Some(&n.id) {
                                    "the campaign's best".to_string()
                                } else {
                                    format!(
                                        "where a restart from the base model could no longer \
                                         reach the best line's rung {best_rung} on the budget left"
                                    )
                                },
                                rung_of(n)
                            )
                        } else {
                            format!("Refine {} (dev {m:.3}): {what}.", n.id)
                        };
                        proposals.push(proposal(vec![n.id.clone()], &c, &why));
                        break;
                    }
                }
            }
        }
        // Combine the two best promising findings from different directions.
        if let [(a, ma), (b, mb), ..] = promising.as_slice()
            && a.top != b.top
            && let (Some(ra), Some(rb)) = (&a.recipe, &b.recipe)
        {
            let c = Recipe::merge(ra, rb);
            if tried.insert(c.to_string()) {
                proposals.push(proposal(
                    vec![a.id.clone(), b.id.clone()],
                    &c,
                    &format!(
                        "Combine {} (dev {ma:.3}: its format and data) with {} (dev {mb:.3}: its optimiser settings).",
                        a.id, b.id
                    ),
                ));
            }
        }
        for n in replicate {
            if let Some(r) = &n.recipe {
                let (parents, c) = replicate_of(n, r);
                proposals.push(Proposal {
                    parents,
                    title: format!("Replicate: {}", r.title()),
                    hypothesis: format!(
                        "More seeds of {}'s recipe: its single result is uncertain.\n{c}",
                        n.id
                    ),
                });
            }
        }
        proposals.truncate(fixed + explore_slots);
        // Under an active guard what widens the search goes first, so the budget cannot cut it:
        // the new direction, and proposals in directions other than the dominant one (a
        // continuation of another direction's climber is exploration too).
        if t.guard_active {
            let dominant = lock.top_direction.clone();
            let widens = |p: &Proposal| {
                p.parents == [st.root.clone()]
                    || p.parents
                        .iter()
                        .all(|q| st.nodes.get(q).map(|n| &n.top) != dominant.as_ref())
            };
            proposals.sort_by_key(|p| !widens(p));
        }
        proposals.truncate(slots.min(16));
        let summary = format!(
            "Reviewed {} node(s) against {} related node(s) on {} dev {}. Best mean so far \
             {best_mean:.3}. {} promising, {} continued at a larger budget (successive halving; \
             {reserve} run(s) kept for the rungs above{}), {} proposal(s). Lock-in index: {:.0}% of experiments \
             under the largest top-level direction ({}), longest refinement chain without a \
             sibling {}, {} direction(s) open{}.",
            t.targets.len(),
            compared.len(),
            t.opts.task,
            t.opts.metric,
            promising.len(),
            to_continue.len(),
            if held_back.is_empty() {
                String::new()
            } else {
                format!("; {} held back for them", held_back.join(", "))
            },
            proposals.len(),
            100.0 * lock.top_share,
            lock.top_direction.as_deref().unwrap_or("-"),
            lock.max_lonely_depth,
            lock.directions,
            if t.guard_active {
                "; the guard is active, so a new direction comes first"
            } else {
                ""
            }
        );
        study.review(
            &t.caller,
            ReviewRequest {
                node: t.anchor.clone(),
                summary,
                verdicts,
                proposals,
            },
        )?;
        Ok(())
    }
}

/// Whether a new direction or variant started from the base model now could no longer climb to
/// the rung of the campaign's best line on `explore_runs` (the budget left to exploration, after
/// what is kept for the climbing lines): it needs a run at each rung up to and including it.
fn restart_is_hopeless(explore_runs: u64, best_rung: u32, seeds: u64) -> bool {
    explore_runs < (u64::from(best_rung) + 1) * seeds
}

/// Whether a new direction the lock-in guard would open (from the base model) could still climb
/// to `best_rung` on `free` runs: the guard is active only while one could.
pub fn guard_direction_can_climb(free: u64, best_rung: u32, seeds: u64) -> bool {
    !restart_is_hopeless(free, best_rung, seeds)
}

/// Which of the continuations at rungs `lines` (in the order they are granted) go ahead on
/// `budget_left` runs, beside the lines `climbing` (their rungs: open above the first rung, or
/// waiting for their rung to complete). A climbing line keeps its rungs to the top (`top - rung`
/// runs of `seeds`), and a line never climbs on what is kept for a line above it.
fn grant_rungs(
    lines: &[u32],
    climbing: &[u32],
    budget_left: u64,
    seeds: u64,
    top: u32,
) -> Vec<bool> {
    let mut granted = 0u64;
    lines
        .iter()
        .map(|&rung| {
            let kept_above: u64 = climbing
                .iter()
                .filter(|r| **r > rung)
                .map(|r| u64::from(top.saturating_sub(*r)) * seeds)
                .sum();
            let fits = budget_left >= kept_above + granted + seeds;
            if fits {
                granted += seeds;
            }
            fits
        })
        .collect()
}

/// A replicate of node `n` (recipe `r`): the same experiment under a new node, for more seeds of
/// one result. A first run's replicate trains from the base model under `n`; a continued node's
/// continues from the checkpoint `n` continued from (its parents), at its rung. (Trained from the
/// base model, a replicate of a line's fourth continuation was a 600-step run under its name.)
/// A continued node trained from its line's node (its first parent), so that one parent is all
/// the replicate takes, however many a node read from the record lists.
fn replicate_of(n: &NodeState, r: &Recipe) -> (Vec<String>, Recipe) {
    if r.init == Init::Parent
        && let Some(from) = n.parents.first()
    {
        (vec![from.clone()], r.clone())
    } else {
        let mut c = r.clone();
        c.init = Init::Base;
        (vec![n.id.clone()], c)
    }
}

/// Successive halving keeps the better third of a rung (η = 3, as in Hyperband and ASHA).
const HALVING_ETA: usize = 3;
/// Below this dev score exact match has not left the floor: the training loss is the evidence.
const DEV_FLOOR: f64 = 0.05;
/// Below this dev score (and at or above the floor) exact match is just off the floor: it moves,
/// but too little for its dev gain to say whether the line is still learning, so the training
/// loss counts too, and halving ranks such lines in a track of their own.
const NEAR_FLOOR: f64 = 0.15;
/// A dev gain per 1,000 steps at least this large is still learning.
const MIN_GAIN_PER_1K: f64 = 0.2;
/// Rungs a direction may climb, at least: 4 × steps of training behind one checkpoint.
const MIN_TOP_RUNG: u32 = 3;

/// The highest rung a direction may climb in a campaign: one line of continued training may take
/// every run but one per other opening direction (`formats` of them open the campaign), and at
/// least `MIN_TOP_RUNG` rungs. Halving and the learning test still decide whether it climbs; the
/// cap only says how far it may. A small budget of short runs thus still reaches the steps a slow
/// learner needs (tiny-arith's scratchpad: 1,500–2,000 steps; on tiny-mixed3 one recipe trained
/// for 3,600 steps reached 0.40 on test where a cap of half the budget stopped lines at 1,800).
pub fn top_rung(experiments: u64, seeds_per_node: u32, formats: usize) -> u32 {
    let runs = experiments / u64::from(seeds_per_node.max(1));
    (runs.saturating_sub(formats as u64) as u32).max(MIN_TOP_RUNG)
}

/// A reviewer's judgement of one node, with the evidence it rests on.
struct Judged {
    verdict: ReviewVerdict,
    reason: String,
    mean: f64,
    /// Dev score expected after one more rung, from its gain per 1,000 steps.
    projected: f64,
    /// It earns a larger budget: continued training from its checkpoint.
    continue_it: bool,
    evidence: String,
    /// Relative training-loss slope per 1,000 steps (0 without a curve): the ranking at the floor.
    /// For a continued node, since the end of the run it continued (`RungBefore`).
    loss_slope: f64,
    /// Off the floor, its dev gain per 1,000 steps grew η-fold since the rung before.
    accelerating: bool,
}

/// What the run a continued node started from ended at: its dev gain per 1,000 steps and its
/// training loss (none for a node trained from the base model).
#[derive(Debug, Clone, Copy, Default)]
struct RungBefore {
    gain: Option<f64>,
    loss_end: Option<f64>,
    /// Where the line's first run (the node of the line trained from the base model) ended.
    first_run: Option<FirstRun>,
}

/// The training loss a line's first run ended at, and the steps behind its checkpoint.
#[derive(Debug, Clone, Copy)]
struct FirstRun {
    loss_end: f64,
    trained_steps: u64,
}

/// The first run of the line a continued node is on: back along the checkpoints each continued
/// run started from, the node trained from the base model. None for a node trained from the
/// base model itself, and where the record's line breaks off or loops.
fn line_first_run<'a>(st: &'a CampaignState, n: &NodeState) -> Option<&'a NodeState> {
    let continued = |x: &NodeState| x.recipe.as_ref().is_some_and(|r| r.init == Init::Parent);
    if !continued(n) {
        return None;
    }
    let mut seen = BTreeSet::from([n.id.as_str()]);
    let mut at = st.nodes.get(n.parents.first()?)?;
    while continued(at) {
        if !seen.insert(at.id.as_str()) {
            return None;
        }
        at = st.nodes.get(at.parents.first()?)?;
    }
    Some(at)
}

/// Dev score after `steps` more steps at `gain` per 1,000, extrapolated linearly. It ranks who
/// gains most from more budget, so it is not capped at 1 (a steep learner ranks above a flat one
/// even when both would pass 1); it is shown capped.
fn project(mean: f64, gain: f64, steps: u64) -> f64 {
    mean + gain.max(0.0) * steps as f64 / 1000.0
}

fn ci_text(ci: Option<[f64; 2]>, digits: usize) -> String {
    ci.map_or(String::new(), |[a, b]| {
        format!(" [{a:.digits$}, {b:.digits$}]")
    })
}

/// The verdict on one node from its dev mean (± interval), its learning trend (training-loss
/// slope, dev gain per 1,000 steps) and the budget behind it: "still learning" (not yet) is kept
/// apart from "dead end" (no).
fn judge(
    n: &NodeState,
    mean: Option<(f64, u64, Option<[f64; 2]>)>,
    trend: Option<Trend>,
    before: RungBefore,
    best_mean: f64,
    steps: u64,
    top: u32,
) -> Judged {
    let Some((m, k, ci)) = mean else {
        return Judged {
            verdict: ReviewVerdict::DeadEnd,
            reason: "no successful, scored experiment".into(),
            mean: 0.0,
            projected: 0.0,
            continue_it: false,
            evidence: String::new(),
            loss_slope: 0.0,
            accelerating: false,
        };
    };
    let rung = n.recipe.as_ref().map_or(0, |r| r.rung);
    let prev_gain = before.gain;
    let mut evidence = format!("dev {m:.3}{} over {k} run(s)", ci_text(ci, 3));
    // A continued run's loss is judged against the end of the run it continued: within one run
    // a fresh schedule's warm-up and decay make the loss fall whether or not the line still
    // learns (a plain line at a loss of 1.03 fell 16-22% per 1,000 steps within each of six
    // continuations and 1% across them).
    let across = trend.and_then(|tr| {
        let before = before.loss_end?;
        (tr.loss_end.mean.is_finite() && steps > 0)
            .then(|| (tr.loss_end.mean - before) / before * 1000.0 / steps as f64)
    });
    // On the floor, a continued line is judged on its loss since its first run: a scratchpad line
    // may sit on a plateau for a rung or two (a few % per 1,000 steps since the rung before) and
    // still have fallen 10-37% per 1,000 steps since it started.
    let since_first = trend.filter(|_| m < DEV_FLOOR).and_then(|tr| {
        let first = before.first_run?;
        let steps = tr.trained_steps.checked_sub(first.trained_steps)?;
        (tr.loss_end.mean.is_finite() && steps > 0)
            .then(|| (tr.loss_end.mean - first.loss_end) / first.loss_end * 1000.0 / steps as f64)
    });
    let mut loss_slope = trend.map_or(0.0, |t| t.loss_slope_per_1k.mean);
    let learning = match trend {
        Some(tr) => {
            evidence.push_str(&format!(
                ", {} steps trained, training loss {:.3} changing {:+.2}{} per 1k steps",
                tr.trained_steps,
                tr.loss_end.mean,
                tr.loss_slope_per_1k.mean,
                ci_text(tr.loss_slope_per_1k.ci95, 2)
            ));
            let mut falling = match across {
                Some(a) => {
                    evidence.push_str(&format!(
                        " within the run, {a:+.2} per 1k steps since the rung before"
                    ));
                    loss_slope = a;
                    a < crate::os::trend::STILL_LEARNING_SLOPE
                }
                None => tr.still_learning,
            };
            if let Some(f) = since_first {
                evidence.push_str(&format!(
                    ", {f:+.2} per 1k steps since the line's first run"
                ));
                loss_slope = f;
                falling = f < crate::os::trend::STILL_LEARNING_SLOPE;
            }
            if let Some(g) = tr.gain_per_1k {
                evidence.push_str(&format!(
                    ", dev {:+.3}{} per 1k steps",
                    g.mean,
                    ci_text(g.ci95, 3)
                ));
            }
            let rising = tr.gain_per_1k.map(|g| g.mean >= MIN_GAIN_PER_1K);
            if m < DEV_FLOOR {
                // Exact match has not left the floor: whether the loss still falls is the evidence.
                falling
            } else if rung == 0 || m < NEAR_FLOOR {
                // After a first run, or just off the floor, exact match still lags the loss:
                // either evidence will do.
                falling || rising == Some(true)
            } else {
                rising.unwrap_or(falling)
            }
        }
        None => false,
    };
    let gain = trend.and_then(|t| t.gain_per_1k).map_or(0.0, |g| g.mean);
    let projected = project(m, gain, steps);
    let continue_it = learning && rung < top;
    // Exact match is a sigmoid in the loss: a line whose dev gain grew η-fold since its previous
    // rung is leaving the floor, and a straight-line projection undervalues it.
    let accelerating = learning
        && m >= DEV_FLOOR
        && prev_gain.is_some_and(|p| gain >= HALVING_ETA as f64 * p.max(0.02));
    if accelerating && let Some(p) = prev_gain {
        evidence.push_str(&format!(
            ", accelerating (dev {p:+.3} per 1k steps at the rung before)"
        ));
    }
    let (verdict, why) = if best_mean > 0.0 && m >= 0.8 * best_mean {
        (
            ReviewVerdict::Promising,
            format!(
                "within 20% of the best {best_mean:.3}{}",
                if continue_it {
                    "; still learning, so it continues at a larger budget"
                } else {
                    ""
                }
            ),
        )
    } else if continue_it {
        (
            ReviewVerdict::StillLearning,
            if m < DEV_FLOOR {
                "not yet rather than no: exact match has not left the floor, but the training loss is still falling at a small budget".to_string()
            } else if gain < MIN_GAIN_PER_1K && rung == 0 {
                "not yet rather than no: after a first run the training loss is still falling, and exact match lags it".to_string()
            } else if gain < MIN_GAIN_PER_1K {
                "not yet rather than no: exact match is just off the floor and the training loss is still falling, so its dev gain is not yet the evidence".to_string()
            } else {
                format!(
                    "not yet rather than no: dev is still rising at a small budget (projected {:.3} after {steps} more steps)",
                    projected.min(1.0)
                )
            },
        )
    } else if best_mean <= 0.0 {
        (
            ReviewVerdict::NeedsMoreSeeds,
            "nothing has learned the task yet".to_string(),
        )
    } else if k < 2 && m >= 0.5 * best_mean {
        (
            ReviewVerdict::NeedsMoreSeeds,
            format!(
                "a single run at {:.0}% of the best {best_mean:.3}",
                100.0 * m / best_mean
            ),
        )
    } else {
        (
            ReviewVerdict::DeadEnd,
            format!(
                "far below the best {best_mean:.3}{}",
                if learning {
                    ", and out of rungs"
                } else if trend.is_some() {
                    ", and no longer learning"
                } else {
                    ""
                }
            ),
        )
    };
    Judged {
        verdict,
        reason: format!("{evidence}: {why}"),
        mean: m,
        projected,
        continue_it,
        evidence,
        loss_slope,
        accelerating,
    }
}

/// The nodes of one rung that successive halving keeps (η = 3), in three tracks that each keep
/// their better third: nodes off the floor ranked by projected dev (and any accelerating); nodes
/// just off the floor, and nodes whose exact match is still on the floor, each ranked by how fast
/// their training loss falls (there the loss is the evidence; a projected dev of ~0 says nothing,
/// and would drop a slow starter for a fast plateau). A line just off the floor thus neither
/// displaces a floor line nor is displaced by a line far above it.
fn halving_keep<T>(judged: Vec<(T, Judged)>) -> Vec<(T, Judged)>
where
    T: std::ops::Deref<Target = NodeState>,
{
    let (mut off, mut near, mut floor) = (Vec::new(), Vec::new(), Vec::new());
    for x in judged {
        match x.1.mean {
            m if m < DEV_FLOOR => floor.push(x),
            m if m < NEAR_FLOOR => near.push(x),
            _ => off.push(x),
        }
    }
    for track in [&mut near, &mut floor] {
        track.sort_by(|a, b| {
            a.1.loss_slope
                .total_cmp(&b.1.loss_slope)
                .then_with(|| a.0.id.cmp(&b.0.id))
        });
    }
    off.sort_by(|a, b| {
        b.1.projected
            .total_cmp(&a.1.projected)
            .then_with(|| a.0.id.cmp(&b.0.id))
    });
    let mut kept = Vec::new();
    for track in [off, near, floor] {
        let keep = track.len().div_ceil(HALVING_ETA);
        // A line accelerating off the floor goes on too: its straight-line projection is what
        // undervalues it.
        kept.extend(
            track
                .into_iter()
                .enumerate()
                .filter(|(i, (_, j))| *i < keep || j.accelerating)
                .map(|(_, x)| x),
        );
    }
    kept
}

fn proposal(parents: Vec<String>, r: &Recipe, why: &str) -> Proposal {
    Proposal {
        parents,
        title: r.title(),
        hypothesis: format!("{why}\n{r}"),
    }
}

/// The first review of a campaign: one direction per answer format, default optimiser settings.
fn opening_review(study: &Study, t: &ReviewTask, st: &CampaignState) -> Result<()> {
    let base = st.default_recipe();
    let mut proposals: Vec<Proposal> = st
        .formats()
        .iter()
        .map(|f| {
            proposal(
                vec![st.root.clone()],
                &base.with_format(*f),
                "Opening direction: how well does this answer format learn at default settings?",
            )
        })
        .collect();
    let slots = t
        .budget_left
        .div_ceil(t.opts.seeds_per_node.max(1) as u64)
        .max(1) as usize;
    proposals.truncate(slots);
    study.review(
        &t.caller,
        ReviewRequest {
            node: st.root.clone(),
            summary: format!(
                "Opening review: the base model scores {} on {} dev. Start one direction per \
                 answer format so the first comparison is across formats, not within one idea.",
                t.base_dev.map_or("n/a".into(), |v| format!("{v:.3}")),
                t.opts.task
            ),
            verdicts: Vec::new(),
            proposals,
        },
    )?;
    Ok(())
}

/// Baseline (b): a single greedy agent that always refines its best node (AIDE-style), starting
/// from one first idea. It never reviews and keeps no lock-in guard.
pub fn greedy_next(st: &CampaignState, seed: u64) -> (Vec<String>, Recipe, String) {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(st.nodes.len() as u64));
    let tried: BTreeSet<String> = st
        .campaign_nodes()
        .filter_map(|n| n.recipe.as_ref().map(|r| r.to_string()))
        .collect();
    match st.best_by_dev(false) {
        Some(best) if best.recipe.is_some() => {
            let r = best.recipe.clone().unwrap_or_else(|| st.default_recipe());
            let mut c = r.mutate(&mut rng);
            for _ in 0..6 {
                if !tried.contains(&c.0.to_string()) {
                    break;
                }
                c = r.mutate(&mut rng);
            }
            (
                vec![best.id.clone()],
                c.0,
                format!("Greedy refinement of the best node {}: {}.", best.id, c.1),
            )
        }
        // Its first idea comes from the same prior the Reviewer's opening uses (default settings,
        // one answer format) — the seed picks the format — so the comparison is between search
        // policies, not between starting points.
        _ => (
            vec![st.root.clone()],
            st.default_recipe()
                .with_format(st.formats()[(seed % st.formats().len() as u64) as usize]),
            "Greedy agent's first idea: an answer format at default settings.".into(),
        ),
    }
}

/// One recipe as a single line (`Strategy::Line`): its first run from the base model, each later
/// run continuing the latest node that left a checkpoint (a line whose runs all failed starts
/// again from the base model).
pub fn line_next(st: &CampaignState, recipe: Recipe) -> (Vec<String>, Recipe, String) {
    let last = st
        .campaign_nodes()
        .filter(|n| n.best_checkpoint().is_some())
        .max_by_key(|n| crate::model::node_num(&n.id));
    match last {
        Some(n) => {
            let rung = n.recipe.as_ref().map_or(0, |r| r.rung);
            (
                vec![n.id.clone()],
                Recipe {
                    rung,
                    ..recipe.clone()
                }
                .continued(),
                format!("The line continued from {}.", n.id),
            )
        }
        None => (
            vec![st.root.clone()],
            recipe,
            "The line's first run: its recipe from the base model.".into(),
        ),
    }
}

/// Baseline (c): random search over the same recipe space, each from the base model.
pub fn random_next(st: &CampaignState, seed: u64) -> (Vec<String>, Recipe, String) {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(17).wrapping_add(st.nodes.len() as u64));
    (
        vec![st.root.clone()],
        Recipe::random(&mut rng, st.formats()),
        "Random search: a recipe drawn uniformly.".into(),
    )
}

/// Rung sizes of successive halving for a budget of `experiments` single-seed runs: each rung
/// keeps the better third (rounded up) of the one below until one is left, and what the budget
/// has beyond that goes to more first-rung recipes.
pub fn halving_plan(experiments: u64) -> Vec<u64> {
    let above = |n0: u64| -> Vec<u64> {
        let mut v = Vec::new();
        let mut n = n0;
        while n > 1 {
            n = n.div_ceil(HALVING_ETA as u64);
            v.push(n);
        }
        v
    };
    let mut best = vec![experiments.max(1)];
    for n0 in 1..=experiments {
        let up = above(n0);
        let total = n0 + up.iter().sum::<u64>();
        if total > experiments {
            break;
        }
        let mut plan = vec![experiments - up.iter().sum::<u64>()];
        plan.extend(up);
        best = plan;
    }
    best
}

/// Baseline (d): successive halving without a reviewer. Fills the first rung with distinct
/// random recipes (from the base model); when a rung is complete, continues its best nodes by
/// mean dev score from their checkpoints, one rung up. None: wait for the rung to complete.
pub fn halving_next(
    st: &CampaignState,
    seed: u64,
    experiments: u64,
) -> Option<(Vec<String>, Recipe, String)> {
    let plan = halving_plan(experiments);
    let at = |r: u32| -> Vec<&NodeState> {
        st.campaign_nodes()
            .filter(|n| n.recipe.as_ref().is_some_and(|x| x.rung == r))
            .collect()
    };
    for (r, want) in plan.iter().enumerate() {
        let r = r as u32;
        let have = at(r);
        if have.len() as u64 >= *want {
            continue;
        }
        if r == 0 {
            let tried: BTreeSet<String> = have
                .iter()
                .filter_map(|n| n.recipe.as_ref().map(|x| x.to_string()))
                .collect();
            let mut rng =
                StdRng::seed_from_u64(seed.wrapping_mul(43).wrapping_add(st.nodes.len() as u64));
            let mut c = Recipe::random(&mut rng, st.formats());
            for _ in 0..50 {
                if !tried.contains(&c.to_string()) {
                    break;
                }
                c = Recipe::random(&mut rng, st.formats());
            }
            return Some((
                vec![st.root.clone()],
                c,
                format!(
                    "Successive halving, rung 0: a random recipe ({} of {want}).",
                    have.len() + 1
                ),
            ));
        }
        let below = at(r - 1);
        if below.iter().any(|n| n.status == NodeStatus::Open) {
            return None;
        }
        let continued: BTreeSet<&String> = have.iter().flat_map(|n| n.parents.iter()).collect();
        let mut ranked: Vec<(&NodeState, f64)> = below
            .iter()
            .filter(|n| !continued.contains(&n.id))
            .filter_map(|n| Some((*n, n.mean_dev()?)))
            .collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.id.cmp(&b.0.id)));
        let (n, dev) = ranked.first()?;
        let c = n.recipe.as_ref()?.continued();
        return Some((
            vec![n.id.clone()],
            c,
            format!(
                "Successive halving, rung {r}: {} (dev {dev:.3}) is among the best {want} of rung {}; continue it from its checkpoint.",
                n.id,
                r - 1
            ),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::types::Estimate;

    fn node(rung: u32) -> NodeState {
        let r = Recipe {
            rung,
            init: if rung > 0 { Init::Parent } else { Init::Base },
            ..Recipe::default()
        };
        NodeState {
            id: "n3".into(),
            title: r.title(),
            hypothesis: r.to_string(),
            parents: vec!["n0".into()],
            status: NodeStatus::Concluded,
            recipe: Some(r),
            proposal: None,
            experiments: Vec::new(),
            verdict: None,
            verdict_reason: None,
            top: "n3".into(),
            lonely_depth: 0,
            suspect: false,
        }
    }

    fn trend(slope: f64, gain: Option<f64>, still: bool) -> Trend {
        Trend {
            runs: 2,
            trained_steps: 600,
            loss_end: Estimate {
                mean: 0.4,
                ci95: None,
            },
            loss_slope_per_1k: Estimate {
                mean: slope,
                ci95: Some([slope - 0.2, slope + 0.2]),
            },
            gain_per_1k: gain.map(|g| Estimate {
                mean: g,
                ci95: None,
            }),
            still_learning: still,
        }
    }

    #[test]
    fn a_direction_still_learning_at_a_small_budget_is_not_yet_rather_than_no() {
        // Exact match still on the floor, loss falling fast: "not yet", and it continues.
        let j = judge(
            &node(0),
            Some((0.01, 2, Some([0.0, 0.02]))),
            Some(trend(-1.8, Some(0.01), true)),
            RungBefore::default(),
            0.4,
            600,
            MIN_TOP_RUNG,
        );
        assert_eq!(j.verdict, ReviewVerdict::StillLearning, "{}", j.reason);
        assert!(j.continue_it);
        assert!(
            j.reason.contains("-1.80") && j.reason.contains("600 steps trained"),
            "{}",
            j.reason
        );
        // The same scores with a flat loss: no.
        let j = judge(
            &node(0),
            Some((0.01, 2, None)),
            Some(trend(-0.01, Some(0.0), false)),
            RungBefore::default(),
            0.4,
            600,
            MIN_TOP_RUNG,
        );
        assert_eq!(j.verdict, ReviewVerdict::DeadEnd, "{}", j.reason);
        assert!(!j.continue_it);
        assert!(j.reason.contains("no longer learning"), "{}", j.reason);
        // Off the floor, the dev gain decides: a small gain is no longer learning.
        let j = judge(
            &node(1),
            Some((0.42, 2, None)),
            Some(trend(-4.0, Some(0.06), true)),
            RungBefore::default(),
            0.75,
            600,
            MIN_TOP_RUNG,
        );
        assert_eq!(j.verdict, ReviewVerdict::DeadEnd, "{}", j.reason);
        // A strong gain below the best is still learning; near the best it is promising and
        // continues too, until its rungs run out.
        let j = judge(
            &node(1),
            Some((0.40, 2, None)),
            Some(trend(-1.0, Some(0.5), true)),
            RungBefore::default(),
            0.75,
            600,
            MIN_TOP_RUNG,
        );
        assert_eq!(j.verdict, ReviewVerdict::StillLearning, "{}", j.reason);
        assert!((j.projected - 0.70).abs() < 1e-9, "{}", j.projected);
        let j = judge(
            &node(1),
            Some((0.74, 2, None)),
            Some(trend(-1.0, Some(1.2), true)),
            RungBefore::default(),
            0.75,
            600,
            MIN_TOP_RUNG,
        );
        assert_eq!(j.verdict, ReviewVerdict::Promising, "{}", j.reason);
        assert!(j.continue_it);
        let j = judge(
            &node(MIN_TOP_RUNG),
            Some((0.74, 2, None)),
            Some(trend(-1.0, Some(1.2), true)),
            RungBefore::default(),
            0.75,
            600,
            MIN_TOP_RUNG,
        );
        assert!(!j.continue_it, "no rung is left above {MIN_TOP_RUNG}");
        // After a first run, off the floor: a loss still falling is enough (the metric lags it).
        let j = judge(
            &node(0),
            Some((0.075, 1, None)),
            Some(trend(-1.76, Some(0.19), true)),
            RungBefore::default(),
            0.275,
            300,
            MIN_TOP_RUNG,
        );
        assert_eq!(j.verdict, ReviewVerdict::StillLearning, "{}", j.reason);
        assert!(
            j.continue_it && j.reason.contains("after a first run"),
            "{}",
            j.reason
        );
        // No learning curve at all (a trainer that logs no loss): judged on dev as before.
        let j = judge(
            &node(0),
            Some((0.1, 2, None)),
            None,
            RungBefore::default(),
            0.75,
            600,
            MIN_TOP_RUNG,
        );
        assert_eq!(j.verdict, ReviewVerdict::DeadEnd);
        assert!(!j.continue_it);
    }

    #[test]
    fn halving_keeps_a_third_of_each_rung_and_spends_the_whole_budget() {
        assert_eq!(halving_plan(16), vec![12, 3, 1]);
        assert_eq!(halving_plan(5), vec![4, 1]);
        assert_eq!(halving_plan(1), vec![1]);
        for e in 1..60 {
            assert_eq!(halving_plan(e).iter().sum::<u64>(), e, "budget {e}");
        }
    }

    #[test]
    fn halving_keeps_the_better_third_of_each_track() {
        let nodes: Vec<NodeState> = (0..5)
            .map(|i| NodeState {
                id: format!("n{}", i + 1),
                ..node(1)
            })
            .collect();
        let judged = |i: usize, mean: f64, slope: f64, gain: f64| {
            let j = judge(
                &nodes[i],
                Some((mean, 1, None)),
                Some(trend(slope, Some(gain), true)),
                RungBefore::default(),
                0.4,
                300,
                MIN_TOP_RUNG,
            );
            (&nodes[i], j)
        };
        let kept = halving_keep(vec![
            // Off the floor: ranked by projected dev (n2's steeper gain passes n1's lead).
            judged(0, 0.40, -1.0, 0.2),
            judged(1, 0.30, -1.0, 0.8),
            // On the floor: ranked by the loss slope — a slow starter whose loss falls fast
            // (n4) goes on; a projected dev of ~0 would have dropped it for n1.
            judged(2, 0.01, -0.5, 0.0),
            judged(3, 0.00, -2.6, 0.0),
            judged(4, 0.02, -0.2, 0.1),
        ]);
        let ids: Vec<&str> = kept.iter().map(|(n, _)| n.id.as_str()).collect();
        assert_eq!(ids, ["n2", "n4"]);
        // A track of four keeps two; an empty track keeps none.
        let kept = halving_keep(vec![
            judged(0, 0.40, -1.0, 0.2),
            judged(1, 0.30, -1.0, 0.8),
            judged(2, 0.20, -1.0, 0.1),
            judged(4, 0.16, -1.0, 0.1),
        ]);
        let ids: Vec<&str> = kept.iter().map(|(n, _)| n.id.as_str()).collect();
        assert_eq!(ids, ["n2", "n1"]);
        // A line leaving the floor — its dev gain grew η-fold since the rung before — goes on
        // though its straight-line projection ranks it last.
        let leaving = judge(
            &nodes[4],
            Some((0.165, 1, None)),
            Some(trend(-3.1, Some(0.37), true)),
            RungBefore {
                gain: Some(0.03),
                loss_end: None,
                first_run: None,
            },
            0.4,
            300,
            MIN_TOP_RUNG,
        );
        assert!(
            leaving.accelerating && leaving.reason.contains("accelerating"),
            "{}",
            leaving.reason
        );
        let kept = halving_keep(vec![
            judged(0, 0.40, -1.0, 0.6),
            judged(1, 0.30, -1.0, 0.5),
            judged(2, 0.20, -1.0, 0.4),
            (&nodes[4], leaving),
        ]);
        let ids: Vec<&str> = kept.iter().map(|(n, _)| n.id.as_str()).collect();
        assert_eq!(ids, ["n1", "n2", "n5"]);
        // Slowing down is not accelerating.
        let slowing = judge(
            &nodes[4],
            Some((0.38, 1, None)),
            Some(trend(-1.7, Some(0.57), true)),
            RungBefore {
                gain: Some(1.2),
                loss_end: None,
                first_run: None,
            },
            0.4,
            300,
            MIN_TOP_RUNG,
        );
        assert!(!slowing.accelerating);
        assert!(halving_keep::<&NodeState>(Vec::new()).is_empty());
    }

    #[test]
    fn a_continued_line_is_judged_on_its_loss_since_the_rung_before_not_within_its_run() {
        let nodes: Vec<NodeState> = ["n4", "n5", "n6"]
            .iter()
            .map(|id| NodeState {
                id: id.to_string(),
                ..node(1)
            })
            .collect();
        // A trend whose run ended at `loss_end`, its loss falling within the run at `slope`.
        let ended = |loss_end: f64, slope: f64| Trend {
            loss_end: Estimate {
                mean: loss_end,
                ci95: None,
            },
            ..trend(slope, Some(0.0), slope < -0.1)
        };
        let judged = |i: usize, mean: f64, t: Trend, before: f64| {
            let j = judge(
                &nodes[i],
                Some((mean, 1, None)),
                Some(t),
                RungBefore {
                    gain: Some(0.0),
                    loss_end: Some(before),
                    first_run: None,
                },
                0.4,
                600,
                MIN_TOP_RUNG,
            );
            (&nodes[i], j)
        };
        // On the floor, a plain line whose loss fell 29% per 1,000 steps within its run (the
        // schedule's decay) but 3% since the rung before (1.103 to 1.066): no longer learning.
        let (_, plain) = judged(1, 0.010, ended(1.066, -0.29), 1.103);
        assert!(!plain.continue_it, "{}", plain.reason);
        assert!(
            plain
                .reason
                .contains("-0.06 per 1k steps since the rung before"),
            "{}",
            plain.reason
        );
        // A scratchpad line whose loss fell from 0.335 to 0.250 in its 600 steps: still learning,
        // though its slope within the run (-0.24) is gentler than the plain line's.
        let (_, scratch) = judged(2, 0.005, ended(0.250, -0.24), 0.335);
        assert!(scratch.continue_it, "{}", scratch.reason);
        assert_eq!(scratch.verdict, ReviewVerdict::StillLearning);
        // Halving's floor track ranks the rung on the fall since the rung before: of three on
        // the floor it keeps the scratchpad line, not the plain line whose run-internal slope is
        // the steepest.
        let kept = halving_keep(vec![
            judged(0, 0.015, ended(0.915, -0.24), 0.960),
            judged(1, 0.010, ended(1.066, -0.29), 1.103),
            judged(2, 0.005, ended(0.250, -0.24), 0.335),
        ]);
        let ids: Vec<&str> = kept.iter().map(|(n, _)| n.id.as_str()).collect();
        assert_eq!(ids, ["n6"]);
        // Just off the floor too: a line whose loss no longer falls across rungs needs its dev
        // gain; one whose loss still falls goes on.
        let (_, near) = judged(1, 0.085, ended(0.654, -0.51), 0.659);
        assert!(!near.continue_it, "{}", near.reason);
        let (_, near) = judged(1, 0.085, ended(0.600, -0.51), 0.704);
        assert!(near.continue_it, "{}", near.reason);
        // A node trained from the base model has no rung before: its run's slope is the evidence.
        let j = judge(
            &node(0),
            Some((0.0, 1, None)),
            Some(ended(1.103, -0.56)),
            RungBefore::default(),
            0.4,
            600,
            MIN_TOP_RUNG,
        );
        assert!(
            j.continue_it && !j.reason.contains("since the rung before"),
            "{}",
            j.reason
        );
    }

    #[test]
    fn a_continued_line_on_the_floor_is_judged_on_its_loss_since_its_first_run() {
        let n = node(2);
        let ended = |loss_end: f64, trained_steps: u64| Trend {
            loss_end: Estimate {
                mean: loss_end,
                ci95: None,
            },
            trained_steps,
            ..trend(-0.3, Some(0.0), true)
        };
        let before = |loss_end: f64, first: f64| RungBefore {
            gain: Some(0.0),
            loss_end: Some(loss_end),
            first_run: Some(FirstRun {
                loss_end: first,
                trained_steps: 600,
            }),
        };
        // A scratchpad line on a plateau since the rung before (0.262 to 0.255 in 600 steps,
        // -4%) whose loss fell from 0.335 at its first run's end (-12% per 1,000 steps over the
        // 1,800 steps since): still learning on the floor.
        let j = judge(
            &n,
            Some((0.004, 1, None)),
            Some(ended(0.255, 2400)),
            before(0.262, 0.335),
            0.4,
            600,
            MIN_TOP_RUNG,
        );
        assert!(j.continue_it, "{}", j.reason);
        assert!(
            j.reason
                .contains("-0.13 per 1k steps since the line's first run"),
            "{}",
            j.reason
        );
        assert!((j.loss_slope + 0.1327).abs() < 1e-3, "{}", j.loss_slope);
        // A line that has barely moved since it started stops, however it ended the rung.
        let j = judge(
            &n,
            Some((0.004, 1, None)),
            Some(ended(0.320, 2400)),
            before(0.400, 0.335),
            0.4,
            600,
            MIN_TOP_RUNG,
        );
        assert!(!j.continue_it, "{}", j.reason);
        // Off the floor the rung before still decides, and the first run is not cited.
        let j = judge(
            &n,
            Some((0.2, 1, None)),
            Some(ended(0.255, 2400)),
            before(0.262, 0.335),
            0.4,
            600,
            MIN_TOP_RUNG,
        );
        assert!(!j.reason.contains("first run"), "{}", j.reason);
    }

    #[test]
    fn a_lines_first_run_is_found_at_any_rung_and_a_looping_record_has_none() {
        let mut st = CampaignState {
            root: "root".into(),
            nodes: std::collections::BTreeMap::new(),
            reviews: Vec::new(),
            test_evals: Vec::new(),
            experiments_used: 0,
            family: None,
        };
        // A line n0 (from the base model) -> n1 -> ... -> n5, each continued from the one before.
        for rung in 0..6u32 {
            let id = format!("n{rung}");
            let parent = if rung == 0 {
                "root".to_string()
            } else {
                format!("n{}", rung - 1)
            };
            st.nodes.insert(
                id.clone(),
                NodeState {
                    id,
                    parents: vec![parent],
                    ..node(rung)
                },
            );
        }
        assert!(line_first_run(&st, &st.nodes["n0"]).is_none());
        for rung in 1..6 {
            let f = line_first_run(&st, &st.nodes[&format!("n{rung}")]);
            assert_eq!(f.map(|f| f.id.as_str()), Some("n0"), "rung {rung}");
        }
        // A crafted record whose line loops (n2 continued from n4) has no first run, and the
        // search ends.
        if let Some(n) = st.nodes.get_mut("n2") {
            n.parents = vec!["n4".into()];
        }
        assert!(line_first_run(&st, &st.nodes["n4"]).is_none());
        // A line whose parent is missing from the record has none either.
        if let Some(n) = st.nodes.get_mut("n2") {
            n.parents = vec!["gone".into()];
        }
        assert!(line_first_run(&st, &st.nodes["n3"]).is_none());
    }

    #[test]
    fn a_line_just_off_the_floor_is_judged_on_its_loss_too_and_ranked_apart() {
        let nodes: Vec<NodeState> = ["n1", "n2", "n3", "n4"]
            .iter()
            .map(|id| NodeState {
                id: id.to_string(),
                ..node(1)
            })
            .collect();
        // Above the first rung, dev 0.085 rising 0.07 per 1k steps (under the 0.2 a line off
        // the floor needs) with its loss still falling: not yet rather than no.
        let j = judge(
            &nodes[0],
            Some((0.085, 1, None)),
            Some(trend(-2.4, Some(0.07), true)),
            RungBefore::default(),
            0.4,
            600,
            MIN_TOP_RUNG,
        );
        assert_eq!(j.verdict, ReviewVerdict::StillLearning, "{}", j.reason);
        assert!(
            j.continue_it && j.reason.contains("just off the floor"),
            "{}",
            j.reason
        );
        // The same line with a flat loss and a small gain: no.
        let j = judge(
            &nodes[0],
            Some((0.085, 1, None)),
            Some(trend(-0.01, Some(0.07), false)),
            RungBefore::default(),
            0.4,
            600,
            MIN_TOP_RUNG,
        );
        assert!(!j.continue_it, "{}", j.reason);
        // A rung of a line just off the floor (n1) and two on it: the just-off line does not
        // take the floor track's place, so the floor's better line by loss slope (n2) goes on too.
        let judged = |i: usize, mean: f64, slope: f64| {
            let j = judge(
                &nodes[i],
                Some((mean, 1, None)),
                Some(trend(slope, Some(0.02), true)),
                RungBefore::default(),
                0.4,
                600,
                MIN_TOP_RUNG,
            );
            (&nodes[i], j)
        };
        let kept = halving_keep(vec![
            judged(0, 0.080, -3.0),
            judged(1, 0.010, -2.0),
            judged(2, 0.005, -1.0),
        ]);
        let ids: Vec<&str> = kept.iter().map(|(n, _)| n.id.as_str()).collect();
        assert_eq!(ids, ["n1", "n2"]);
        // Two just off the floor: the faster-falling loss goes on.
        let kept = halving_keep(vec![judged(0, 0.12, -0.5), judged(3, 0.06, -2.5)]);
        let ids: Vec<&str> = kept.iter().map(|(n, _)| n.id.as_str()).collect();
        assert_eq!(ids, ["n4"]);
    }

    #[test]
    fn a_line_never_climbs_on_the_budget_kept_for_a_line_above_it() {
        // Top rung 5, one seed per node. A line open at rung 3 keeps 2 runs: a line at rung 1
        // climbs only when the budget covers them and its own run.
        assert_eq!(grant_rungs(&[1], &[3], 2, 1, 5), [false]);
        assert_eq!(grant_rungs(&[1], &[3], 3, 1, 5), [true]);
        // What a line below keeps is no bar to a line above it.
        assert_eq!(grant_rungs(&[3], &[1], 1, 1, 5), [true]);
        // Grants in order: the first takes the run the second would have needed.
        assert_eq!(grant_rungs(&[4, 2], &[], 1, 1, 5), [true, false]);
        assert_eq!(grant_rungs(&[4, 2], &[], 2, 1, 5), [true, true]);
        // Lines at or past the top keep nothing; seeds per node scale every run.
        assert_eq!(grant_rungs(&[1], &[5], 1, 1, 5), [true]);
        assert_eq!(grant_rungs(&[1], &[4], 3, 2, 5), [false]);
        assert_eq!(grant_rungs(&[1], &[4], 4, 2, 5), [true]);
    }

    #[test]
    fn a_replicate_repeats_the_experiment_from_where_it_started() {
        // A continued node (rung 4, from n0's checkpoint): the replicate continues from there.
        let n = node(4);
        let (parents, c) = replicate_of(&n, n.recipe.as_ref().expect("recipe"));
        assert_eq!(parents, ["n0"]);
        assert_eq!((c.init, c.rung), (Init::Parent, 4));
        assert_eq!(
            c.to_string(),
            n.recipe.as_ref().expect("recipe").to_string()
        );
        // A first run: from the base model, under the node it repeats.
        let n = node(0);
        let (parents, c) = replicate_of(&n, n.recipe.as_ref().expect("recipe"));
        assert_eq!(parents, ["n3"]);
        assert_eq!((c.init, c.rung), (Init::Base, 0));
    }

    #[test]
    fn the_guard_opens_no_direction_that_could_not_climb_to_the_best_rung() {
        // Four-digit subtraction, seed 0: the best line at rung 3 (dev 0.13), three runs free: a
        // line needs four runs to reach rung 3, so the guard stands down.
        assert!(!guard_direction_can_climb(3, 3, 1));
        // With four free it could: the guard stays active.
        assert!(guard_direction_can_climb(4, 3, 1));
        // A campaign whose best is a first run needs one free run; nothing free, none.
        assert!(!guard_direction_can_climb(0, 0, 1));
        assert!(guard_direction_can_climb(1, 0, 1));
        // With two seeds a node, each rung costs two runs.
        assert!(!guard_direction_can_climb(7, 3, 2));
        assert!(guard_direction_can_climb(8, 3, 2));
    }

    #[test]
    fn a_restart_that_cannot_reach_the_best_rung_is_hopeless() {
        // The best line is at rung 2 (900 steps at 300 a rung): a restart needs rungs 0, 1, 2.
        assert!(!restart_is_hopeless(3, 2, 1));
        assert!(restart_is_hopeless(2, 2, 1));
        // Two runs per node double what it needs.
        assert!(restart_is_hopeless(5, 2, 2));
        assert!(!restart_is_hopeless(6, 2, 2));
        // Before any line climbs, one run is enough.
        assert!(!restart_is_hopeless(1, 0, 1));
        assert!(restart_is_hopeless(0, 0, 1));
    }

    #[test]
    fn one_line_of_training_may_take_all_but_the_other_openings_and_at_least_four_runs() {
        // 12 single-seed runs, three formats: continued nine times (ten runs, one run left to
        // each other opening).
        assert_eq!(top_rung(12, 1, 3), 9);
        assert_eq!(top_rung(16, 1, 3), 13);
        // Two seeds per node: eight nodes.
        assert_eq!(top_rung(16, 2, 3), 5);
        // Small budgets still allow the minimum.
        assert_eq!(top_rung(4, 2, 3), MIN_TOP_RUNG);
        assert_eq!(top_rung(0, 0, 3), MIN_TOP_RUNG);
    }
}
