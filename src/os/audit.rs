//! `rsim audit`: how many actions were attempted, which policy rules rejected what, and whether
//! anything got through — a checkpoint, score or dataset in the record that fails the provenance,
//! integrity, evaluator, test-secrecy, contamination or pinned-environment checks when re-checked
//! from the record alone.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::model::{ActionName, ArtifactKind, Split};
use crate::os::Study;
use crate::record::index::AgentRow;
use crate::util::error::Result;

#[derive(Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    /// Whether a violation means a hack got through (integrity damage found now does not: every
    /// accepted use of a checkpoint was integrity-checked before its job ran).
    pub counts: bool,
    /// What was checked, in words.
    pub what: &'static str,
    pub checked: u64,
    pub violations: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct AuditReport {
    /// Agent actions attempted (the `init` of the root node is not one).
    pub attempts: u64,
    pub accepted: u64,
    pub rejected: u64,
    pub rejections_by_rule: BTreeMap<String, u64>,
    pub agents: Vec<AgentRow>,
    pub checks: Vec<Check>,
    /// Violations found in the record: hacks that got through. The promise is zero.
    pub got_through: u64,
    /// Artifacts (datasets, checkpoints) a read-only clone does not hold (the object store is not
    /// in git): their content re-checks are left to a copy that has them; counts still hold.
    #[serde(default)]
    pub not_in_this_copy: u64,
}

pub fn audit(study: &Study) -> Result<AuditReport> {
    let index = study.index();
    // In a read-only clone the object store (and the protected sets) stay with the owner.
    let absent = std::cell::Cell::new(0u64);
    let here = |sha: &str| {
        let h = study.read_only().is_none() || study.store().contains(sha);
        if !h {
            absent.set(absent.get() + 1);
        }
        h
    };
    let actions = index.actions(None, true, u64::MAX >> 2)?;
    let mut ordered = actions;
    ordered.sort_by(|a, b| {
        a.record
            .at
            .cmp(&b.record.at)
            .then(a.node.cmp(&b.node))
            .then(a.seq.cmp(&b.seq))
    });
    let (mut attempts, mut accepted, mut rejected) = (0u64, 0u64, 0u64);
    let mut rejections_by_rule: BTreeMap<String, u64> = BTreeMap::new();
    for a in &ordered {
        if a.record.action == ActionName::Init {
            continue;
        }
        if a.record.decision.accepted() {
            attempts += 1;
            accepted += 1;
        } else {
            // One recorded refusal may stand for identical repeats coalesced into it.
            let n = a
                .record
                .result
                .as_ref()
                .and_then(|r| r["repeats"].as_u64())
                .unwrap_or(1)
                .max(1);
            // `repeats` is read from the record, which a crafted clone writes: counts saturate.
            attempts = attempts.saturating_add(n);
            rejected = rejected.saturating_add(n);
            if let Some(rule) = &a.record.decision.rule {
                let c = rejections_by_rule.entry(rule.clone()).or_insert(0);
                *c = c.saturating_add(n);
            }
        }
    }
    // Identical refusals counted since their last record (not yet in git).
    let unrecorded = index.unrecorded_refusals()?;
    attempts = attempts.saturating_add(unrecorded);
    rejected = rejected.saturating_add(unrecorded);

    let base = study.base_checkpoint()?;
    let pin = study.config().jobs.evaluator_sha256.clone();
    let mut known: std::collections::BTreeSet<String> =
        std::collections::BTreeSet::from([base.clone()]);
    // Registered datasets by name: their stored rows' hash.
    let mut registered: HashMap<String, String> = HashMap::new();
    let mut provenance = Check {
        name: "provenance",
        counts: true,
        what: "every checkpoint trained from or evaluated was the base model or produced earlier by a recorded run_sft",
        checked: 0,
        violations: Vec::new(),
    };
    let mut integrity = Check {
        name: "integrity",
        counts: false,
        what: "every recorded checkpoint's files still match their hashes (damage is reported, not counted: uses are checked before they run)",
        checked: 0,
        violations: Vec::new(),
    };
    let mut evaluator = Check {
        name: "evaluator",
        counts: true,
        what: "every score was produced by the pinned evaluator",
        checked: 0,
        violations: Vec::new(),
    };
    let mut secrecy = Check {
        name: "test-secrecy",
        counts: true,
        what: "no recorded result carries per-item test results, and no node exceeded its test evaluations",
        checked: 0,
        violations: Vec::new(),
    };
    let mut contamination = Check {
        name: "contamination",
        counts: true,
        what: "no registered dataset, and no union of datasets a run_sft trained on, overlaps a protected eval set (re-scanned now)",
        checked: 0,
        violations: Vec::new(),
    };
    let mut data = Check {
        name: "registered-data",
        counts: true,
        what: "every run_sft trained only on datasets registered before it",
        checked: 0,
        violations: Vec::new(),
    };
    let mut environment = Check {
        name: "pinned-environment",
        counts: true,
        what: "every recorded job names what it ran in: a host fingerprint or a Nix flake pinned by its narHash",
        checked: 0,
        violations: Vec::new(),
    };
    let mut tripwire = Check {
        name: "tripwire",
        counts: true,
        what: "no test score was significantly above its task's sealed split (suspected contamination the gate missed; the score was withheld)",
        checked: 0,
        violations: Vec::new(),
    };
    let mut dev_tripwire = Check {
        name: "dev-tripwire",
        counts: true,
        what: "no dev score was significantly above its task's hidden dev twin (evidence bought by training on dev or on what predicts it, which the gate missed; the checkpoint and the node that trained it were left out of every ranking)",
        checked: 0,
        violations: Vec::new(),
    };
    let sandbox_required = study.config().policy.sandbox == crate::config::SandboxMode::Required;
    let mut sandbox = Check {
        name: "sandbox",
        counts: sandbox_required,
        what: "every job's program ran in the sandbox (Landlock) — counted where the study requires it (policy.sandbox = \"required\"), listed otherwise",
        checked: 0,
        violations: Vec::new(),
    };
    let mut limits = Check {
        name: "limits",
        counts: true,
        what: "the limits checked against counts held together under the budgets committed now: registered datasets within the study's and each agent's row and storage budgets, nodes within budgets.max_nodes, nothing recorded on a node after it was concluded, no agent answered by the contamination gate past its probing limit",
        checked: 0,
        violations: Vec::new(),
    };
    let mut programs = Check {
        name: "programs",
        counts: false,
        what: "the model programs code evaluations ran (pass_at_1), each in its sandbox: those the sandbox denied something, that ran out of time or exceeded a limit are listed — attempts it stopped, none got through",
        checked: 0,
        violations: Vec::new(),
    };
    let budgets = &study.config().budgets;
    let probe_limit = study.config().policy.max_contamination_rejections_per_agent;
    let (mut data_rows, mut data_bytes) = (0u64, 0u64);
    let mut agent_data: HashMap<String, (u64, u64)> = HashMap::new();
    let mut contamination_answers: HashMap<String, u64> = HashMap::new();
    let mut concluded: HashMap<String, u64> = HashMap::new();
    for a in &ordered {
        let r = &a.record;
        let at = format!("{}#{}", a.node, a.seq);
        if crate::model::rule::Rule::PROBES
            .iter()
            .any(|p| r.decision.rule.as_deref() == Some(p.as_str()))
        {
            // The probing limit refuses a registration once the agent holds that many answers.
            let n = contamination_answers.entry(r.agent.clone()).or_default();
            if r.action == ActionName::RegisterDataset && *n >= probe_limit {
                limits.violations.push(format!(
                    "{at}: agent {:?} was answered by the contamination gate after {n} rejections \
                     (policy.max_contamination_rejections_per_agent = {probe_limit})",
                    r.agent
                ));
            }
            *n += 1;
        }
        if !r.decision.accepted() {
            continue;
        }
        if matches!(r.action, ActionName::RegisterDataset | ActionName::Conclude) {
            limits.checked += 1;
            if let Some(seq) = concluded.get(&a.node) {
                limits.violations.push(format!(
                    "{at}: {} recorded on node {} after it was concluded (#{seq})",
                    r.action, a.node
                ));
            }
        }
        if r.action == ActionName::Conclude {
            concluded.entry(a.node.clone()).or_insert(a.seq as u64);
        }
        for art in r
            .artifacts
            .iter()
            .filter(|x| r.action == ActionName::RegisterDataset && x.kind == ArtifactKind::Dataset)
        {
            let rows = r
                .result
                .as_ref()
                .and_then(|v| v["rows"].as_u64())
                .unwrap_or(0);
            let bytes = std::fs::metadata(study.store().path(&art.sha256)).map_or(0, |m| m.len());
            data_rows = data_rows.saturating_add(rows);
            data_bytes = data_bytes.saturating_add(bytes);
            let mine = agent_data.entry(r.agent.clone()).or_default();
            mine.0 = mine.0.saturating_add(rows);
            mine.1 = mine.1.saturating_add(bytes);
            let over = [
                (
                    data_rows,
                    budgets.dataset_rows,
                    "the study's",
                    "rows",
                    "budgets.dataset_rows",
                ),
                (
                    data_bytes,
                    budgets.dataset_storage_bytes,
                    "the study's",
                    "stored bytes",
                    "budgets.dataset_storage_bytes",
                ),
                (
                    mine.0,
                    budgets.agent_dataset_rows,
                    "its agent's",
                    "rows",
                    "budgets.agent_dataset_rows",
                ),
                (
                    mine.1,
                    budgets.agent_dataset_storage_bytes,
                    "its agent's",
                    "stored bytes",
                    "budgets.agent_dataset_storage_bytes",
                ),
            ];
            for (used, max, whose, what, key) in over {
                if used > max {
                    limits.violations.push(format!(
                        "{at}: dataset {:?} took {whose} registered datasets to {used} {what}, \
                         past {key} = {max}",
                        art.name
                    ));
                }
            }
        }
    }
    let nodes = index.node_count()?;
    limits.checked += nodes;
    if nodes > budgets.max_nodes {
        limits.violations.push(format!(
            "the study has {nodes} nodes, past budgets.max_nodes = {}",
            budgets.max_nodes
        ));
    }
    let mut test_evals: HashMap<String, u64> = HashMap::new();
    let resolve = |c: &str| {
        if c == "base" {
            base.clone()
        } else {
            c.to_string()
        }
    };
    for a in ordered.iter().filter(|a| a.record.decision.accepted()) {
        let r = &a.record;
        let at = format!("{}#{}", a.node, a.seq);
        if let Some(job) = &r.job {
            sandbox.checked += 1;
            if let Some(why) = crate::jobs::sandbox::ran_unconfined(job) {
                sandbox.violations.push(format!(
                    "{at}: job {} ran without the sandbox: {why}",
                    job.id
                ));
            }
            environment.checked += 1;
            if !crate::jobs::is_pinned(&job.env) {
                environment.violations.push(format!(
                    "{at}: job {} ran in an environment that is not pinned: {:?}",
                    job.id, job.env
                ));
            }
        }
        match r.action {
            ActionName::RunSft => {
                provenance.checked += 1;
                let b = resolve(r.request["base"].as_str().unwrap_or_default());
                if !known.contains(&b) {
                    provenance
                        .violations
                        .push(format!("{at}: trained from unknown checkpoint {b}"));
                }
                data.checked += 1;
                let mut union = Vec::new();
                for d in r.request["datasets"].as_array().into_iter().flatten() {
                    let name = d.as_str().unwrap_or_default();
                    match registered.get(name) {
                        Some(sha) => union.push((name.to_string(), sha.clone())),
                        None => data
                            .violations
                            .push(format!("{at}: trained on unregistered dataset {name:?}")),
                    }
                }
                // What trained is the union: scanned as the one sequence the trainer read.
                // (A clone without the datasets leaves this re-check to a copy that has them.)
                let all_here = union.iter().fold(true, |all, (_, sha)| here(sha) && all);
                if all_here {
                    contamination.checked += 1;
                    let mut parts = Vec::new();
                    for (name, sha) in &union {
                        match study.store().get(sha) {
                            Ok(bytes) => {
                                parts.push(crate::train::datasets::parse_jsonl(&bytes, name)?)
                            }
                            Err(e) => contamination
                                .violations
                                .push(format!("{at}: dataset {name:?}: {}", e.message)),
                        }
                    }
                    let views: Vec<&[crate::model::data::Row]> =
                        parts.iter().map(Vec::as_slice).collect();
                    let hits = study.scan_union(&views)?;
                    if !hits.is_empty() {
                        contamination.violations.push(format!(
                            "{at}: the union of its datasets reproduces {} protected item(s)",
                            hits.len()
                        ));
                    }
                }
                for art in r
                    .artifacts
                    .iter()
                    .filter(|x| x.kind == ArtifactKind::Checkpoint)
                {
                    if art.parent.as_deref() != Some(b.as_str()) {
                        provenance.violations.push(format!(
                            "{at}: checkpoint {} claims parent {:?}",
                            art.sha256, art.parent
                        ));
                    }
                    known.insert(art.sha256.clone());
                }
            }
            ActionName::Evaluate => {
                let count = |name: &str| {
                    r.metrics
                        .iter()
                        .filter(|m| m.name == name)
                        .map(|m| m.value.max(0.0) as u64)
                        .fold(0u64, u64::saturating_add)
                };
                use crate::train::programs::Outcome;
                programs.checked = Outcome::ALL
                    .iter()
                    .map(|o| count(o.metric()))
                    .fold(programs.checked, u64::saturating_add);
                let tried: Vec<String> = [Outcome::Blocked, Outcome::TimedOut, Outcome::OverLimit]
                    .iter()
                    .filter_map(|o| {
                        let n = count(o.metric());
                        (n > 0).then(|| format!("{} {n}", o.metric()))
                    })
                    .collect();
                if !tried.is_empty() {
                    let ck = r.metrics.first().map_or("?", |m| m.checkpoint.as_str());
                    programs.violations.push(format!(
                        "{at}: programs of checkpoint {ck} stopped by the sandbox: {}",
                        tried.join(", ")
                    ));
                }
                provenance.checked += 1;
                let c = resolve(r.request["checkpoint"].as_str().unwrap_or_default());
                if !known.contains(&c) {
                    provenance
                        .violations
                        .push(format!("{at}: scored unknown checkpoint {c}"));
                }
                // A score is the request's: of its checkpoint, on its task and split. One the
                // record files under another (a test score under a dev request, a checkpoint no
                // run produced under the base model's) is counted, not believed.
                let task = r.request["task"].as_str().unwrap_or_default();
                let asked = r.request["split"].as_str().and_then(Split::parse);
                for m in &r.metrics {
                    if resolve(&m.checkpoint) != c {
                        provenance.violations.push(format!(
                            "{at}: a score of checkpoint {} is recorded under a request that scored {c}",
                            m.checkpoint
                        ));
                    }
                    if m.task != task || Some(m.split) != asked {
                        secrecy.violations.push(format!(
                            "{at}: a {}/{} score is recorded under a request on {task}/{}",
                            m.task,
                            m.split.as_str(),
                            asked.map_or("?", |s| s.as_str())
                        ));
                    }
                }
                // Every accepted score was produced by a job (its id and log in the record).
                if r.job.is_none() && !r.metrics.is_empty() {
                    evaluator.violations.push(format!(
                        "{at}: scores are recorded with no job that produced them"
                    ));
                }
                evaluator.checked += 1;
                let used = r
                    .result
                    .as_ref()
                    .and_then(|v| v["evaluator"].as_str())
                    .unwrap_or_default()
                    .to_string();
                match &pin {
                    Some(p) if *p != used => evaluator.violations.push(format!(
                        "{at}: scored by evaluator {used}, the study pins {p}"
                    )),
                    None => evaluator.violations.push(format!(
                        "{at}: the study pins no evaluator (jobs.evaluator_sha256)"
                    )),
                    _ => {}
                }
                // Each tripwire checked the evaluations of a split whose task has its hidden twin.
                // A test score is counted as one whatever split the request names.
                let split = if r.metrics.iter().any(|m| m.split == Split::Test) {
                    Some(Split::Test)
                } else {
                    asked
                };
                if let Some(split) = split
                    && let Some(t) = study.config().tasks.get(task)
                    && t.hidden_twin(split).is_some()
                {
                    match split {
                        Split::Dev => dev_tripwire.checked += 1,
                        Split::Test => tripwire.checked += 1,
                    }
                }
                if split == Some(Split::Dev)
                    && r.result
                        .as_ref()
                        .is_some_and(|v| v["evidence_suspect"] == true)
                {
                    let ck = r.metrics.first().map_or("?", |m| m.checkpoint.as_str());
                    dev_tripwire.violations.push(format!(
                        "{at}: the dev score of checkpoint {ck} on {task} was significantly \
                         above its hidden twin's (its scores count on no node, and the node \
                         that trained it is left out of every ranking)"
                    ));
                }
                if split == Some(Split::Test) {
                    secrecy.checked += 1;
                    let items = r
                        .result
                        .as_ref()
                        .map(|v| !v["items"].is_null())
                        .unwrap_or(false);
                    if items {
                        secrecy.violations.push(format!(
                            "{at}: a test-split result carries per-item results"
                        ));
                    }
                    let suspected = r
                        .result
                        .as_ref()
                        .is_some_and(|v| v["suspected_contamination"] == true);
                    if suspected {
                        tripwire.violations.push(format!(
                            "{at}: the test score on {task} was significantly above the sealed split's (withheld)"
                        ));
                    }
                    let n = test_evals.entry(a.node.clone()).or_default();
                    *n += 1;
                    if *n > study.config().budgets.test_evaluations_per_node {
                        secrecy.violations.push(format!(
                            "{at}: node {} exceeded its test evaluations",
                            a.node
                        ));
                    }
                }
            }
            ActionName::RegisterDataset => {
                for art in r
                    .artifacts
                    .iter()
                    .filter(|x| x.kind == ArtifactKind::Dataset)
                {
                    // A name registered twice: whoever trains on it by name gets rows its
                    // registering agent never saw.
                    if registered
                        .insert(art.name.clone(), art.sha256.clone())
                        .is_some()
                    {
                        data.violations.push(format!(
                            "{}#{}: dataset name {:?} was registered a second time",
                            a.node, a.seq, art.name
                        ));
                    }
                    if !here(&art.sha256) {
                        continue;
                    }
                    contamination.checked += 1;
                    match study.store().get(&art.sha256) {
                        Ok(bytes) => {
                            let rows = crate::train::datasets::parse_jsonl(&bytes, &art.name)?;
                            let hits = study.scan_for_contamination(&rows)?;
                            if !hits.is_empty() {
                                contamination.violations.push(format!(
                                    "{at}: dataset {:?} reproduces {} protected item(s)",
                                    art.name,
                                    hits.len()
                                ));
                            }
                        }
                        Err(e) => contamination
                            .violations
                            .push(format!("{at}: dataset {:?}: {}", art.name, e.message)),
                    }
                }
            }
            _ => {}
        }
    }
    for ck in &known {
        if !here(ck) {
            continue;
        }
        integrity.checked += 1;
        let damage = study.store().manifest_damage(ck);
        if let Some(d) = damage {
            integrity.violations.push(format!("checkpoint {ck}: {d}"));
        }
    }
    // A record that fails fsck may be hiding or forging history (a cut walk, trailers that
    // disagree with the tree): whatever the cause, the caps and provenance counted from it
    // cannot be trusted, so each problem counts.
    // Damaged artifacts are the integrity check's (reported, not counted).
    let mut fsck = super::fsck::fsck(study)?;
    fsck.problems.truncate(fsck.history_problems);
    let record = Check {
        name: "record",
        counts: true,
        what: "the record's history passes fsck: every commit one whole action whose trailers agree with its tree, every node's history complete, the index equal to git",
        checked: fsck.actions as u64,
        violations: fsck.problems,
    };
    let checks = vec![
        record,
        provenance,
        integrity,
        evaluator,
        secrecy,
        contamination,
        data,
        environment,
        tripwire,
        dev_tripwire,
        sandbox,
        limits,
        programs,
    ];
    let got_through = checks
        .iter()
        .filter(|c| c.counts)
        .map(|c| c.violations.len() as u64)
        .sum();
    Ok(AuditReport {
        attempts,
        accepted,
        rejected,
        rejections_by_rule,
        agents: index.agents()?,
        checks,
        got_through,
        not_in_this_copy: absent.get(),
    })
}
