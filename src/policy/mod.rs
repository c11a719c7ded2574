//! The policy guard: a pure function of (request, caller, study config, facts from the record).
//! Each check is one named rule with a reason a person understands. Faces never call this
//! directly; the Experiment OS does, and records every rejection.

pub mod canon;
pub mod contamination;
pub mod normal_form;
pub mod string_ops;

use crate::api::types::{
    BranchRequest, CancelJobRequest, ConcludeRequest, DatasetSource, EvaluateRequest,
    RegisterDatasetRequest, ReproduceRequest, RunSftRequest,
};
use crate::config::StudyConfig;
use crate::model::rule::Rule;
use crate::model::{ActionName, Caller, Decision, NodeStatus, Role, Split};

/// A request as the policy sees it: the registry's borrowed view of any action or query.
pub use crate::api::actions::RequestRef as Request;

/// What the record says, gathered before the check so the check itself does no IO.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// Status of the node the action is recorded on (for branch: the first parent).
    pub node_status: Option<NodeStatus>,
    pub node_count: u64,
    /// Job seconds the record says were used (finished jobs' wall clock × units).
    pub compute_seconds_used: f64,
    /// Job seconds running jobs claim (each its whole wall-clock limit × units) until they are
    /// recorded: the study's, the node's and the calling agent's. The policy refuses on what is
    /// used; what is claimed only makes a job wait in the admission queue.
    pub compute_seconds_claimed: f64,
    pub node_compute_claimed: f64,
    pub agent_compute_claimed: f64,
    pub evaluations_total: u64,
    pub test_evaluations_on_node: u64,
    /// register_dataset: the name is already registered.
    pub dataset_name_taken: bool,
    /// run_sft: requested datasets that are not registered.
    pub unregistered_datasets: Vec<String>,
    /// conclude: the agent and role that opened the node (its first action), where known.
    pub node_opened_by: Option<(String, Role)>,
    /// run_sft / evaluate / conclude: the checkpoint is the base model or was produced by a recorded run_sft.
    pub checkpoint_known: bool,
    /// evaluate: the evaluator's current fingerprint and the pinned one.
    pub evaluator_actual: Option<String>,
    pub evaluator_pinned: Option<String>,
    /// evaluate: the eval set's current hash and the pinned one.
    pub eval_set_actual: Option<String>,
    pub eval_set_pinned: Option<String>,
    /// evaluate: the hidden split scored beside the one asked for (test: the sealed split; dev:
    /// the dev twin) — its current hash and the pinned one.
    pub hidden_set_actual: Option<String>,
    pub hidden_set_pinned: Option<String>,
    /// run_sft / evaluate: why the checkpoint's stored files no longer match their hashes, if they don't.
    pub checkpoint_corrupt: Option<String>,
    /// Job seconds already used by the node and by the calling agent.
    pub node_compute_used: f64,
    pub agent_compute_used: f64,
    /// Evaluations already run on the node and by the calling agent.
    pub node_evaluations: u64,
    pub agent_evaluations: u64,
    /// register_dataset / run_sft: rows that reproduce protected eval items (run_sft: in the
    /// union of its datasets, `Hit::part` indexing the request's `datasets`).
    pub contamination: Vec<crate::policy::contamination::Hit>,
    /// register_dataset / run_sft: the projected size of the data, computed before any row is
    /// materialised (None: not computed).
    pub size: Option<SizeFact>,
    /// register_dataset: what the study's registered datasets (and the caller's) hold, with
    /// registrations in flight, and what this one would add (None: not computed).
    pub dataset_storage: Option<StorageFact>,
    /// run_sft / evaluate / reproduce / register_dataset: what the study and the calling agent
    /// hold on disk (None: not counted).
    pub storage: Option<StorageBytes>,
    /// register_dataset: contamination rejections the calling agent already collected (recorded,
    /// and in flight: rejected but not yet recorded).
    pub agent_contamination_rejections: u64,
    /// The dataset a registration would store has no row (its size within the bounds).
    pub dataset_empty: bool,
    /// run_sft / evaluate: jobs cannot be cut off from the network on this machine.
    pub network_isolation_unavailable: bool,
    /// run_sft / evaluate: why this machine cannot sandbox jobs (no Landlock), when it cannot.
    pub sandbox_unavailable: Option<String>,
    /// evaluate: test-split evaluations the calling agent ran or holds, across nodes.
    pub agent_test_evaluations: u64,
    /// run_sft: registered datasets whose stored objects no longer match their hashes (name: why).
    pub dataset_corrupt: Vec<String>,
    /// run_sft / evaluate: why the study's job environment could not be pinned (Nix's own
    /// message), when it could not.
    pub environment_unpinned: Option<String>,
    /// campaign: the orchestrators running a campaign on the study now (other `rsim run`s).
    pub campaigns_running: Vec<String>,
    /// cancel_job: the agent that started the job (None: no such job in this study).
    pub job_agent: Option<String>,
    /// reproduce: the recorded environment and this one, when they differ.
    pub environment_changed: Option<(String, String)>,
    /// reproduce of an evaluation: the recorded evaluate request (checked as an evaluation).
    pub reproduced_evaluation: Option<EvaluateRequest>,
}

/// A size an agent's request controls, projected before allocation: what it is, its rows, and
/// an upper bound on its bytes of training text.
#[derive(Debug, Clone, PartialEq)]
pub struct SizeFact {
    pub what: String,
    pub rows: u64,
    pub bytes: u64,
}

/// The bytes the study holds on disk, and the calling agent's share (`os::storage`), against
/// `budgets.storage_bytes` and `budgets.agent_storage_bytes`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StorageBytes {
    pub study: u64,
    pub agent: u64,
}

/// Registered data against the study's and the agent's dataset budgets: what is used (recorded
/// plus held by registrations in flight), and what a registration would add.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StorageFact {
    pub used_rows: u64,
    pub used_bytes: u64,
    pub agent_used_rows: u64,
    pub agent_used_bytes: u64,
    /// Rows and stored bytes (JSON Lines) of the dataset asked for.
    pub rows: u64,
    pub bytes: u64,
}

/// The dataset budgets (`budgets.dataset_rows`, `budgets.dataset_storage_bytes`, and the
/// per-agent `budgets.agent_dataset_rows`, `budgets.agent_dataset_storage_bytes`).
fn storage_budget(cfg: &StudyConfig, caller: &Caller, facts: &Facts) -> Option<Decision> {
    let s = facts.dataset_storage?;
    let b = &cfg.budgets;
    let over =
        |rule: Rule, whose: String, what: &str, used: u64, asked: u64, key: &str, max: u64| {
            (used.saturating_add(asked) > max).then(|| {
                Decision::reject(
                    rule,
                    format!(
                        "{whose} registered datasets hold {used} {what} (registrations in flight \
                     included); this one would add {asked}, past the limit of {max} ({key})"
                    ),
                )
            })
        };
    let study = "the study's".to_string();
    let agent = format!("agent {:?}'s", caller.agent);
    over(
        Rule::BudgetDatasetStorage,
        study.clone(),
        "rows",
        s.used_rows,
        s.rows,
        "budgets.dataset_rows",
        b.dataset_rows,
    )
    .or_else(|| {
        over(
            Rule::BudgetDatasetStorage,
            study,
            "stored bytes",
            s.used_bytes,
            s.bytes,
            "budgets.dataset_storage_bytes",
            b.dataset_storage_bytes,
        )
    })
    .or_else(|| {
        over(
            Rule::BudgetAgentDatasetStorage,
            agent.clone(),
            "rows",
            s.agent_used_rows,
            s.rows,
            "budgets.agent_dataset_rows",
            b.agent_dataset_rows,
        )
    })
    .or_else(|| {
        over(
            Rule::BudgetAgentDatasetStorage,
            agent,
            "stored bytes",
            s.agent_used_bytes,
            s.bytes,
            "budgets.agent_dataset_storage_bytes",
            b.agent_dataset_storage_bytes,
        )
    })
}

/// The dataset bounds (`policy.max_dataset_rows`, `policy.max_dataset_bytes`).
fn size_limit(cfg: &StudyConfig, facts: &Facts) -> Option<Decision> {
    let s = facts.size.as_ref()?;
    let (max_rows, max_bytes) = (cfg.policy.max_dataset_rows, cfg.policy.max_dataset_bytes);
    if s.rows > max_rows {
        return Some(Decision::reject(
            Rule::DatasetSizeLimit,
            format!(
                "{} would have {} rows; policy.max_dataset_rows = {max_rows}",
                s.what, s.rows
            ),
        ));
    }
    if s.bytes > max_bytes {
        return Some(Decision::reject(
            Rule::DatasetSizeLimit,
            format!(
                "{} would hold up to {} bytes of text; policy.max_dataset_bytes = {max_bytes}",
                s.what, s.bytes
            ),
        ));
    }
    None
}

/// The contamination rejection. Its evidence never prints text — neither the rows' (a declared
/// source's or a mixture's rows that match *are* protected items) nor the items': the row
/// number (only where the rows are the caller's own: inline rows, or registered datasets a
/// run_sft names), the share of the item matched, and the method. A hit on the test or sealed
/// split is `contamination`; hits on the dev split or its hidden twin alone (the evidence
/// reviewers rank on) are `dev-contamination`.
fn contamination(facts: &Facts, row_label: impl Fn(&Hit) -> Option<String>) -> Option<Decision> {
    if facts.contamination.is_empty() {
        return None;
    }
    let on_test: Vec<&Hit> = facts
        .contamination
        .iter()
        .filter(|h| !crate::policy::contamination::is_dev_split(&h.split))
        .collect();
    let (rule, what, hits) = if on_test.is_empty() {
        (
            Rule::DevContamination,
            "the dev evidence reviewers rank on (dev split or its hidden twin; \
             policy.train_on_dev is off)",
            facts.contamination.iter().collect::<Vec<_>>(),
        )
    } else {
        (Rule::Contamination, "protected eval data", on_test)
    };
    let evidence: Vec<String> = hits
        .iter()
        .take(5)
        .map(|h| {
            let row = row_label(h).unwrap_or_else(|| "a row".into());
            match &h.detail {
                Some(why) => format!(
                    "{row} holds a program the gate could not read, so it may reproduce a \
                     protected {} item: {why}",
                    h.task
                ),
                None => format!(
                    "{row} reproduces a protected {} item ({:.0}% matched, {})",
                    h.task,
                    h.overlap * 100.0,
                    h.how
                ),
            }
        })
        .collect();
    Some(Decision::reject(
        rule,
        format!(
            "the data overlaps {what} ({} item(s) matched): {}",
            hits.len(),
            evidence.join("; ")
        ),
    ))
}

use crate::policy::contamination::Hit;

/// Which roles may perform an action: the role table of the action registry
/// (`api::actions`); the genesis `init` is the owner's alone.
pub fn role_allows(role: Role, action: ActionName) -> bool {
    crate::api::actions::spec(action.as_str()).map_or(role == Role::Owner, |s| s.allows(role))
}

/// The study's compute budget (`budgets.compute_seconds`).
fn compute_budget(cfg: &StudyConfig, facts: &Facts) -> Option<Decision> {
    (facts.compute_seconds_used >= cfg.budgets.compute_seconds as f64).then(|| {
        Decision::reject(
            Rule::BudgetCompute,
            format!(
                "the study has used {:.0} s (recorded by finished jobs) of its {} s compute budget \
                 (budgets.compute_seconds; the owner raises it in rsim.toml, committed on main)",
                facts.compute_seconds_used, cfg.budgets.compute_seconds
            ),
        )
    })
}

/// The study's and the agent's storage budgets (`budgets.storage_bytes`,
/// `budgets.agent_storage_bytes`), for actions that store more.
fn disk_budget(cfg: &StudyConfig, facts: &Facts) -> Option<Decision> {
    let s = facts.storage?;
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    if s.study >= cfg.budgets.storage_bytes {
        return Some(Decision::reject(
            Rule::BudgetStorage,
            format!(
                "the study holds {:.2} GiB on disk (objects, job directories, record) of its {:.2} GiB \
                 (budgets.storage_bytes); the owner frees space with `rsim gc` or raises the budget",
                gib(s.study),
                gib(cfg.budgets.storage_bytes)
            ),
        ));
    }
    if s.agent >= cfg.budgets.agent_storage_bytes {
        return Some(Decision::reject(
            Rule::BudgetStorage,
            format!(
                "this agent's checkpoints, logs, datasets, job directories and records take {:.2} GiB \
                 of its {:.2} GiB (budgets.agent_storage_bytes)",
                gib(s.agent),
                gib(cfg.budgets.agent_storage_bytes)
            ),
        ));
    }
    None
}

/// The study's evaluation budget (`budgets.evaluations`).
fn evaluation_budget(cfg: &StudyConfig, facts: &Facts) -> Option<Decision> {
    (facts.evaluations_total >= cfg.budgets.evaluations).then(|| {
        Decision::reject(
            Rule::BudgetEvaluations,
            format!(
                "the study has used all {} evaluations (budgets.evaluations)",
                cfg.budgets.evaluations
            ),
        )
    })
}

/// The study's node budget (`budgets.max_nodes`).
fn node_budget(cfg: &StudyConfig, facts: &Facts) -> Option<Decision> {
    (facts.node_count >= cfg.budgets.max_nodes).then(|| {
        Decision::reject(
            Rule::BudgetNodes,
            format!(
                "the study already has {} nodes (budgets.max_nodes = {})",
                facts.node_count, cfg.budgets.max_nodes
            ),
        )
    })
}

/// Decide on starting (or resuming) a campaign: the owner's, and only while every study-wide
/// budget has something left — a campaign started then would only record rejections.
pub fn check_campaign(caller: &Caller, cfg: &StudyConfig, facts: &Facts) -> Decision {
    if caller.role != Role::Owner {
        return Decision::reject(
            Rule::Role,
            format!(
                "agent {:?} has role {}; only the study owner starts campaigns",
                caller.agent, caller.role
            ),
        );
    }
    compute_budget(cfg, facts)
        .or_else(|| evaluation_budget(cfg, facts))
        .or_else(|| node_budget(cfg, facts))
        .unwrap_or_else(Decision::accept)
}

/// Decide on holding a study's campaign (`rsim run`, before it spends anything): the owner's,
/// and one orchestrator at a time — two spend the same campaign budget twice, each counting only
/// what was recorded when it started, and repeat each other's seeded experiments.
pub fn check_campaign_lease(caller: &Caller, facts: &Facts) -> Decision {
    if caller.role != Role::Owner {
        return Decision::reject(
            Rule::Role,
            format!(
                "agent {:?} has role {}; only the study owner starts campaigns",
                caller.agent, caller.role
            ),
        );
    }
    if !facts.campaigns_running.is_empty() {
        return Decision::reject(
            Rule::CampaignRunning,
            format!(
                "a campaign is already running on this study ({}); one orchestrator at a time \
                 spends a campaign — wait for it to end, or stop it and resume",
                facts.campaigns_running.join(", ")
            ),
        );
    }
    Decision::accept()
}

/// Checks shared by every action that runs a job: isolation, a pinned environment, checkpoint
/// integrity, compute budgets.
fn job_checks(cfg: &StudyConfig, facts: &Facts) -> Option<Decision> {
    if cfg.policy.require_network_isolation && facts.network_isolation_unavailable {
        return Some(Decision::reject(
            Rule::NetworkIsolation,
            "the study requires jobs without network access (policy.require_network_isolation), \
             and this machine cannot give jobs their own network namespace",
        ));
    }
    if cfg.policy.sandbox == crate::config::SandboxMode::Required
        && let Some(why) = &facts.sandbox_unavailable
    {
        return Some(Decision::reject(
            Rule::Sandbox,
            format!(
                "the study requires jobs to run sandboxed (policy.sandbox = \"required\"), and this \
                 machine cannot sandbox them: {why}"
            ),
        ));
    }
    // A refusal, not a failed job: like missing isolation, this machine cannot run the job as the
    // study requires, so the job is never admitted — no job id, no job directory, no JobRecord
    // with an environment that names nothing — and the refusal is recorded with Nix's words.
    if let Some(why) = &facts.environment_unpinned {
        return Some(Decision::reject(
            Rule::EnvironmentPinned,
            format!(
                "the job's environment could not be pinned, so the job does not run (its record \
                 must name exactly what ran): {why}"
            ),
        ));
    }
    if let Some(why) = &facts.checkpoint_corrupt {
        return Some(Decision::reject(
            Rule::CheckpointIntegrity,
            format!("the checkpoint's files changed: {why}"),
        ));
    }
    if let Some(d) = compute_budget(cfg, facts) {
        return Some(d);
    }
    if let Some(max) = cfg.budgets.node_compute_seconds
        && facts.node_compute_used >= max as f64
    {
        return Some(Decision::reject(
            Rule::BudgetNodeCompute,
            format!(
                "this node has used {:.0} s (recorded by finished jobs) of its {max} s \
                 (budgets.node_compute_seconds)",
                facts.node_compute_used
            ),
        ));
    }
    if let Some(max) = cfg.budgets.agent_compute_seconds
        && facts.agent_compute_used >= max as f64
    {
        return Some(Decision::reject(
            Rule::BudgetAgentCompute,
            format!(
                "this agent has used {:.0} s (recorded by finished jobs) of its {max} s \
                 (budgets.agent_compute_seconds)",
                facts.agent_compute_used
            ),
        ));
    }
    None
}

/// Decide on a request. Pure: same inputs, same decision.
#[tracing::instrument(level = "trace", name = "policy", skip_all)]
pub fn check(req: Request<'_>, caller: &Caller, cfg: &StudyConfig, facts: &Facts) -> Decision {
    let Some(action) = ActionName::parse(req.name()) else {
        // Queries change nothing and every role may read.
        return Decision::accept();
    };
    if !role_allows(caller.role, action) {
        return Decision::reject(
            Rule::Role,
            format!(
                "agent {:?} has role {}, which may not perform {action}",
                caller.agent, caller.role
            ),
        );
    }
    let writes_node = matches!(
        action,
        ActionName::RegisterDataset
            | ActionName::RunSft
            | ActionName::Evaluate
            | ActionName::Conclude
    );
    if writes_node && facts.node_status == Some(NodeStatus::Concluded) {
        return Decision::reject(
            Rule::NodeConcluded,
            "the node is concluded; branch a new node from it to continue this direction",
        );
    }
    if let Some(d) = disk_budget(cfg, facts) {
        return d;
    }
    match req {
        Request::Branch(b) => check_branch(b, caller, cfg, facts),
        Request::RegisterDataset(r) => check_register_dataset(r, caller, cfg, facts),
        Request::RunSft(r) => check_run_sft(r, caller, cfg, facts),
        Request::Evaluate(r) => check_evaluate(r, caller, cfg, facts),
        Request::Conclude(c) => check_conclude(c, caller, cfg, facts),
        Request::Reproduce(r) => check_reproduce(r, caller, cfg, facts),
        Request::CancelJob(c) => check_cancel_job(c, caller, cfg, facts),
        Request::Compare(_)
        | Request::Review(_)
        | Request::GetNode(_)
        | Request::ListNodes(_)
        | Request::Dag(_)
        | Request::Log(_)
        | Request::Diff(_)
        | Request::GetJob(_) => Decision::accept(),
    }
}

/// branch: shape of the DAG and the node budget.
fn check_branch(b: &BranchRequest, _caller: &Caller, cfg: &StudyConfig, facts: &Facts) -> Decision {
    if b.parents.len() as u64 > u64::from(cfg.policy.max_parents) {
        return Decision::reject(
            Rule::MaxParents,
            format!(
                "a node may have at most {} parents (policy.max_parents)",
                cfg.policy.max_parents
            ),
        );
    }
    if let Some(d) = node_budget(cfg, facts) {
        return d;
    }
    Decision::accept()
}

/// register_dataset: the contamination gate, registered inputs, names, sizes.
fn check_register_dataset(
    r: &RegisterDatasetRequest,
    caller: &Caller,
    cfg: &StudyConfig,
    facts: &Facts,
) -> Decision {
    if facts.agent_contamination_rejections >= cfg.policy.max_contamination_rejections_per_agent {
        return Decision::reject(
            Rule::ContaminationProbing,
            format!(
                "agent {:?} already had {} datasets rejected for contamination or for keeping \
                 no row, counting rejections not yet recorded \
                 (policy.max_contamination_rejections_per_agent = {}); it may register no more \
                 datasets",
                caller.agent,
                facts.agent_contamination_rejections,
                cfg.policy.max_contamination_rejections_per_agent
            ),
        );
    }
    if !facts.unregistered_datasets.is_empty() {
        return Decision::reject(
            Rule::DatasetUnregistered,
            format!(
                "mixtures and filters take registered datasets only; not registered: {}",
                facts.unregistered_datasets.join(", ")
            ),
        );
    }
    if let Some(d) = size_limit(cfg, facts) {
        return d;
    }
    if let Some(d) = storage_budget(cfg, caller, facts) {
        return d;
    }
    let own_rows = matches!(r.source, DatasetSource::Inline { .. });
    if let Some(d) = contamination(facts, |h| own_rows.then(|| format!("row {}", h.row))) {
        return d;
    }
    if facts.dataset_empty {
        return Decision::reject(
            Rule::EmptyDataset,
            "the dataset keeps no row (a filter that matched nothing); like a contamination \
             rejection it counts toward policy.max_contamination_rejections_per_agent"
                .to_string(),
        );
    }
    if facts.dataset_name_taken {
        return Decision::reject(
            Rule::DatasetNameTaken,
            format!(
                "a dataset named {:?} is already registered; choose another name",
                r.name
            ),
        );
    }
    if let DatasetSource::Inline { rows } = &r.source
        && rows.len() as u64 > cfg.policy.max_inline_rows
    {
        return Decision::reject(
            Rule::InlineRowsLimit,
            format!(
                "{} inline rows exceed policy.max_inline_rows = {}",
                rows.len(),
                cfg.policy.max_inline_rows
            ),
        );
    }
    Decision::accept()
}

/// run_sft: job checks, registered data, checkpoint provenance.
/// A reproduction runs a recorded `run_sft` again: the job's own checks (budgets, isolation,
/// sandbox, a pinned environment, the base checkpoint's integrity), its datasets re-hashed, and
/// the environment the same as recorded unless the request allows a change. A dataset's name is
/// bound to its hash for good, and the hash is checked here, so the same union trains — and it is
/// scanned again against the protected sets as they are now: an owner who protected more since
/// the original ran gets no reproduction that trains on it.
///
/// Reproducing an evaluation is checked as that evaluation (pinned evaluator and eval set, the
/// evaluation budgets), then for the environment.
fn check_reproduce(
    r: &ReproduceRequest,
    caller: &Caller,
    cfg: &StudyConfig,
    facts: &Facts,
) -> Decision {
    if let Some(d) = job_checks(cfg, facts) {
        return d;
    }
    if let Some(ev) = &facts.reproduced_evaluation {
        let d = check_evaluate(ev, caller, cfg, facts);
        if !d.accepted() {
            return d;
        }
    }
    if !facts.dataset_corrupt.is_empty() {
        return Decision::reject(
            Rule::DatasetIntegrity,
            format!(
                "the run cannot be reproduced: a dataset it trained on is no longer what was recorded: {}",
                facts.dataset_corrupt.join("; ")
            ),
        );
    }
    if !facts.checkpoint_known {
        return Decision::reject(
            Rule::CheckpointProvenance,
            "the run cannot be reproduced: its base checkpoint is no longer a recorded checkpoint",
        );
    }
    if let Some(d) = contamination(facts, |h| {
        Some(format!("the run's dataset #{} row {}", h.part + 1, h.row))
    }) {
        return d;
    }
    if let Some((was, now)) = &facts.environment_changed
        && !r.allow_env_change
    {
        return Decision::reject(
            Rule::EnvironmentChanged,
            format!(
                "the run was recorded in environment {was} and would run in {now}; pass \
                 allow_env_change (rsim reproduce --allow-env-change) to reproduce it there anyway"
            ),
        );
    }
    Decision::accept()
}

fn check_run_sft(
    r: &RunSftRequest,
    _caller: &Caller,
    cfg: &StudyConfig,
    facts: &Facts,
) -> Decision {
    if let Some(d) = job_checks(cfg, facts) {
        return d;
    }
    if !facts.dataset_corrupt.is_empty() {
        return Decision::reject(
            Rule::DatasetIntegrity,
            format!(
                "a dataset's stored object changed after it was registered: {}",
                facts.dataset_corrupt.join("; ")
            ),
        );
    }
    if !facts.unregistered_datasets.is_empty() {
        return Decision::reject(
            Rule::DatasetUnregistered,
            format!(
                "only registered datasets can be trained on; not registered: {}",
                facts.unregistered_datasets.join(", ")
            ),
        );
    }
    if !facts.checkpoint_known {
        return Decision::reject(
            Rule::CheckpointProvenance,
            format!(
                "checkpoint {} does not lead back to the base model through recorded run_sft actions",
                r.base
            ),
        );
    }
    if let Some(d) = size_limit(cfg, facts) {
        return d;
    }
    // The union of the datasets is what trains: parts each under the threshold can reproduce
    // an item together.
    if let Some(d) = contamination(facts, |h| {
        r.datasets
            .get(h.part)
            .map(|name| format!("dataset {name:?} row {}", h.row))
    }) {
        return d;
    }
    Decision::accept()
}

/// evaluate: job checks, provenance, the pinned evaluator and eval sets, evaluation budgets, the test-split limit.
fn check_evaluate(
    r: &EvaluateRequest,
    caller: &Caller,
    cfg: &StudyConfig,
    facts: &Facts,
) -> Decision {
    if let Some(d) = job_checks(cfg, facts) {
        return d;
    }
    if !facts.checkpoint_known {
        return Decision::reject(
            Rule::CheckpointProvenance,
            format!(
                "checkpoint {} does not lead back to the base model through recorded run_sft actions",
                r.checkpoint
            ),
        );
    }
    if let (Some(pin), Some(actual)) = (&facts.evaluator_pinned, &facts.evaluator_actual)
        && pin != actual
    {
        return Decision::reject(
            Rule::EvaluatorPinned,
            format!(
                "the evaluator changed: its fingerprint is {actual}, the study pins {pin} \
                         (after a deliberate rsim upgrade, the study owner pins the new fingerprint: \
                         jobs.evaluator_sha256 in rsim.toml, committed on main)"
            ),
        );
    }
    if let (Some(pin), Some(actual)) = (&facts.eval_set_pinned, &facts.eval_set_actual)
        && pin != actual
    {
        return Decision::reject(
            Rule::EvalSetPinned,
            format!(
                "the {} split of task {} changed: sha256 {actual}, pinned {pin}",
                r.split.as_str(),
                r.task
            ),
        );
    }
    if let (Some(pin), Some(actual)) = (&facts.hidden_set_pinned, &facts.hidden_set_actual)
        && pin != actual
    {
        return Decision::reject(
            Rule::EvalSetPinned,
            format!(
                "the {} split of task {} changed: sha256 {actual}, pinned {pin}",
                crate::config::hidden_split_name(r.split),
                r.task
            ),
        );
    }
    if let Some(d) = evaluation_budget(cfg, facts) {
        return d;
    }
    if let Some(max) = cfg.budgets.node_evaluations
        && facts.node_evaluations >= max
    {
        return Decision::reject(
            Rule::BudgetNodeEvaluations,
            format!("this node has used all {max} of its evaluations (budgets.node_evaluations)"),
        );
    }
    if let Some(max) = cfg.budgets.agent_evaluations
        && facts.agent_evaluations >= max
    {
        return Decision::reject(
            Rule::BudgetAgentEvaluations,
            format!(
                "agent {:?} has used all {max} of its evaluations (budgets.agent_evaluations)",
                caller.agent
            ),
        );
    }
    if r.split == Split::Test
        && let Some(max) = cfg.budgets.agent_test_evaluations
        && facts.agent_test_evaluations >= max
    {
        return Decision::reject(
            Rule::BudgetAgentTestEvaluations,
            format!(
                "agent {:?} has used all {max} of its test-split evaluations across nodes (budgets.agent_test_evaluations); use the dev split",
                caller.agent
            ),
        );
    }
    if r.split == Split::Test
        && facts.test_evaluations_on_node >= cfg.budgets.test_evaluations_per_node
    {
        return Decision::reject(
            Rule::TestEvaluationLimit,
            format!(
                "this node already has {} test-split evaluations (budgets.test_evaluations_per_node = {}); use the dev split",
                facts.test_evaluations_on_node, cfg.budgets.test_evaluations_per_node
            ),
        );
    }
    Decision::accept()
}

/// conclude: who may close the node, and the best checkpoint's provenance.
fn check_conclude(
    c: &ConcludeRequest,
    caller: &Caller,
    _cfg: &StudyConfig,
    facts: &Facts,
) -> Decision {
    // A worker closes its own directions, and those a reviewer or the owner opened for workers
    // (the orchestrator's proposals); never one another worker opened, which would lock that
    // worker out of its own work.
    if caller.role == Role::Worker
        && let Some((opener, Role::Worker)) = &facts.node_opened_by
        && *opener != caller.agent
    {
        return Decision::reject(
            Rule::NodeOwner,
            format!(
                "node {} was opened by worker {opener}: a worker concludes only the nodes it \
                 opened or that a reviewer or the owner opened (the owner or a reviewer may \
                 conclude any node)",
                c.node
            ),
        );
    }
    if c.best_checkpoint.is_some() && !facts.checkpoint_known {
        return Decision::reject(
            Rule::CheckpointProvenance,
            "best_checkpoint does not lead back to the base model through recorded run_sft actions",
        );
    }
    if c.best_checkpoint.is_some()
        && let Some(why) = &facts.checkpoint_corrupt
    {
        return Decision::reject(
            Rule::CheckpointIntegrity,
            format!("best_checkpoint's files changed after it was recorded: {why}"),
        );
    }
    Decision::accept()
}

/// cancel_job: a worker cancels only its own jobs.
fn check_cancel_job(
    c: &CancelJobRequest,
    caller: &Caller,
    _cfg: &StudyConfig,
    facts: &Facts,
) -> Decision {
    if caller.role != Role::Owner
        && facts
            .job_agent
            .as_deref()
            .is_some_and(|a| a != caller.agent)
    {
        return Decision::reject(
            Rule::JobOwner,
            format!(
                "job {} was started by another agent; a {} may cancel only its own jobs",
                c.job, caller.role
            ),
        );
    }
    Decision::accept()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::types::*;

    fn cfg() -> StudyConfig {
        StudyConfig::parse(
            "[study]\nname='t'\n[base_model]\nname='b'\npath='m'\n[jobs]\nsft=['true']\nevaluate=['true']\n[budgets]\nmax_nodes=3\nevaluations=5\n",
            "rsim.toml",
        )
        .expect("config")
    }

    fn eval_req(split: Split) -> EvaluateRequest {
        EvaluateRequest {
            node: "n1".into(),
            checkpoint: "base".into(),
            task: "t".into(),
            split,
        }
    }

    #[test]
    fn a_reproduction_in_another_environment_needs_allow_env_change() {
        let mut req = ReproduceRequest {
            node: "n1".into(),
            seq: 3,
            allow_env_change: false,
        };
        let facts = Facts {
            checkpoint_known: true,
            environment_changed: Some(("host:aaaa".into(), "host:bbbb".into())),
            ..Facts::default()
        };
        let d = check(Request::Reproduce(&req), &Caller::owner(), &cfg(), &facts);
        assert_eq!(d.rule, Some(Rule::EnvironmentChanged.to_string()));
        let why = d.reason.unwrap_or_default();
        assert!(
            why.contains("host:aaaa") && why.contains("--allow-env-change"),
            "{why}"
        );
        req.allow_env_change = true;
        assert!(check(Request::Reproduce(&req), &Caller::owner(), &cfg(), &facts).accepted());
        // Owner and reviewer, not a worker or an observer.
        let reviewer = Caller::new("r", Role::Reviewer);
        assert!(check(Request::Reproduce(&req), &reviewer, &cfg(), &facts).accepted());
        for role in [Role::Worker, Role::Observer] {
            let d = check(
                Request::Reproduce(&req),
                &Caller::new("x", role),
                &cfg(),
                &facts,
            );
            assert_eq!(d.rule, Some(Rule::Role.to_string()));
        }
        // Tampered or missing data is named.
        let bad = Facts {
            dataset_corrupt: vec!["plain: missing".into()],
            ..facts
        };
        let d = check(Request::Reproduce(&req), &Caller::owner(), &cfg(), &bad);
        assert_eq!(d.rule, Some(Rule::DatasetIntegrity.to_string()));
        // Data that reproduces a protected item now (the owner protected more since the run) is
        // refused like a new run's.
        let now_protected = Facts {
            contamination: vec![Hit {
                task: "add3".into(),
                split: "test".into(),
                part: 1,
                row: 7,
                overlap: 1.0,
                how: "normalized",
                detail: None,
            }],
            ..Facts {
                checkpoint_known: true,
                ..Facts::default()
            }
        };
        let d = check(
            Request::Reproduce(&req),
            &Caller::owner(),
            &cfg(),
            &now_protected,
        );
        assert_eq!(d.rule, Some(Rule::Contamination.to_string()), "{d:?}");
        assert!(
            d.reason.unwrap_or_default().contains("dataset #2 row 7"),
            "names where, never the text"
        );
    }

    #[test]
    fn observer_may_not_write_and_worker_may_not_review() {
        let b = BranchRequest {
            parents: vec!["n0".into()],
            title: "x".into(),
            hypothesis: String::new(),
        };
        let d = check(
            Request::Branch(&b),
            &Caller::new("o", Role::Observer),
            &cfg(),
            &Facts::default(),
        );
        assert_eq!(d.rule.as_deref(), Some("role"));
        let r = ReviewRequest {
            node: "n0".into(),
            summary: "s".into(),
            verdicts: vec![],
            proposals: vec![],
        };
        let d = check(
            Request::Review(&r),
            &Caller::new("w", Role::Worker),
            &cfg(),
            &Facts::default(),
        );
        assert_eq!(d.rule.as_deref(), Some("role"));
        let d = check(
            Request::Review(&r),
            &Caller::new("r", Role::Reviewer),
            &cfg(),
            &Facts::default(),
        );
        assert!(d.accepted());
    }

    #[test]
    fn a_job_that_cannot_be_sandboxed_is_refused_only_where_the_study_requires_it() {
        let facts = Facts {
            checkpoint_known: true,
            sandbox_unavailable: Some("the kernel has no Landlock".into()),
            ..Facts::default()
        };
        let req = eval_req(Split::Dev);
        let mut c = cfg();
        assert!(c.policy.sandbox == crate::config::SandboxMode::BestEffort);
        assert!(check(Request::Evaluate(&req), &Caller::owner(), &c, &facts).accepted());
        c.policy.sandbox = crate::config::SandboxMode::Required;
        let d = check(Request::Evaluate(&req), &Caller::owner(), &c, &facts);
        assert_eq!(d.rule.as_deref(), Some("sandbox"));
        assert!(
            d.reason
                .as_deref()
                .is_some_and(|r| r.contains("no Landlock")),
            "{d:?}"
        );
        let available = Facts {
            sandbox_unavailable: None,
            ..facts
        };
        assert!(check(Request::Evaluate(&req), &Caller::owner(), &c, &available).accepted());
    }

    #[test]
    fn a_job_whose_environment_cannot_be_pinned_is_refused_with_the_reason() {
        let facts = Facts {
            checkpoint_known: true,
            environment_unpinned: Some(
                "`nix flake metadata path:/s/env` failed: error: boom".into(),
            ),
            ..Facts::default()
        };
        let d = check(
            Request::Evaluate(&eval_req(Split::Dev)),
            &Caller::owner(),
            &cfg(),
            &facts,
        );
        assert_eq!(d.rule.as_deref(), Some("environment-pinned"));
        assert!(
            d.reason
                .as_deref()
                .is_some_and(|r| r.ends_with("error: boom")),
            "{d:?}"
        );
        let facts = Facts {
            environment_unpinned: None,
            ..facts
        };
        assert!(
            check(
                Request::Evaluate(&eval_req(Split::Dev)),
                &Caller::owner(),
                &cfg(),
                &facts,
            )
            .accepted()
        );
    }

    #[test]
    fn budgets_and_limits() {
        let b = BranchRequest {
            parents: vec!["n0".into()],
            title: "x".into(),
            hypothesis: String::new(),
        };
        let facts = Facts {
            node_count: 3,
            ..Facts::default()
        };
        assert_eq!(
            check(Request::Branch(&b), &Caller::owner(), &cfg(), &facts)
                .rule
                .as_deref(),
            Some("budget-nodes")
        );
        let facts = Facts {
            checkpoint_known: true,
            test_evaluations_on_node: 2,
            ..Facts::default()
        };
        let d = check(
            Request::Evaluate(&eval_req(Split::Test)),
            &Caller::owner(),
            &cfg(),
            &facts,
        );
        assert_eq!(d.rule.as_deref(), Some("test-evaluation-limit"));
        assert!(
            check(
                Request::Evaluate(&eval_req(Split::Dev)),
                &Caller::owner(),
                &cfg(),
                &facts
            )
            .accepted()
        );
        let facts = Facts {
            checkpoint_known: true,
            evaluations_total: 5,
            ..Facts::default()
        };
        let d = check(
            Request::Evaluate(&eval_req(Split::Dev)),
            &Caller::owner(),
            &cfg(),
            &facts,
        );
        assert_eq!(d.rule.as_deref(), Some("budget-evaluations"));
    }

    #[test]
    fn unknown_checkpoints_and_changed_evaluators_are_rejected() {
        let facts = Facts::default();
        let d = check(
            Request::Evaluate(&eval_req(Split::Dev)),
            &Caller::owner(),
            &cfg(),
            &facts,
        );
        assert_eq!(d.rule.as_deref(), Some("checkpoint-provenance"));
        let facts = Facts {
            checkpoint_known: true,
            evaluator_pinned: Some("a".into()),
            evaluator_actual: Some("b".into()),
            ..Facts::default()
        };
        let d = check(
            Request::Evaluate(&eval_req(Split::Dev)),
            &Caller::owner(),
            &cfg(),
            &facts,
        );
        assert_eq!(d.rule.as_deref(), Some("evaluator-pinned"));
    }

    #[test]
    fn concluded_nodes_take_no_more_experiments() {
        let r = RegisterDatasetRequest {
            node: "n1".into(),
            name: "d".into(),
            source: DatasetSource::Inline {
                rows: vec![Row {
                    prompt: "1+1=".into(),
                    answer: "2".into(),
                }],
            },
            description: String::new(),
        };
        let facts = Facts {
            node_status: Some(NodeStatus::Concluded),
            ..Facts::default()
        };
        let d = check(
            Request::RegisterDataset(&r),
            &Caller::owner(),
            &cfg(),
            &facts,
        );
        assert_eq!(d.rule.as_deref(), Some("node-concluded"));
    }

    /// The default budgets: three million-row datasets from one agent are refused at the third
    /// (per agent), and the study's own budget refuses past 5,000,000 rows whoever asks.
    #[test]
    fn default_dataset_budgets_refuse_the_third_million_row_dataset_of_an_agent() {
        let c = cfg();
        let req = RegisterDatasetRequest {
            node: "n1".into(),
            name: "big".into(),
            description: String::new(),
            source: DatasetSource::Arith(ArithParams {
                op: ArithOp::Add,
                digits: 3,
                format: AnswerFormat::Plain,
                n: 1_000_000,
                seed: 1,
            }),
        };
        let w = Caller::new("w", Role::Worker);
        let decide = |used: u64, agent_used: u64| {
            let facts = Facts {
                node_status: Some(NodeStatus::Open),
                dataset_storage: Some(StorageFact {
                    used_rows: used,
                    used_bytes: used * 20,
                    agent_used_rows: agent_used,
                    agent_used_bytes: agent_used * 20,
                    rows: 1_000_000,
                    bytes: 20_000_000,
                }),
                ..Facts::default()
            };
            check(Request::RegisterDataset(&req), &w, &c, &facts)
        };
        assert!(decide(1_000_000, 1_000_000).accepted());
        let d = decide(2_000_000, 2_000_000);
        assert_eq!(d.rule.as_deref(), Some("budget-agent-dataset-storage"));
        let why = d.reason.unwrap_or_default();
        assert!(
            why.contains("2000000 rows")
                && why.contains("would add 1000000")
                && why.contains("budgets.agent_dataset_rows"),
            "{why}"
        );
        let d = decide(4_500_000, 0);
        assert_eq!(d.rule.as_deref(), Some("budget-dataset-storage"));
    }
}
