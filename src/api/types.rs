//! Request and result types of every action and query. Each is `deny_unknown_fields` and derives
//! a JSON Schema; incoming JSON is validated against that schema before serde sees it.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::{ActionName, JobRecord, MetricRecord, NodeStatus, Outcome, Role, Split};

/// Node id pattern (`n0` is the root: the base model).
pub const NODE_ID_PATTERN: &str = r"^n(0|[1-9][0-9]{0,8})$";
/// One line of text: no control characters, no bidirectional overrides or isolates and no line or
/// paragraph separators (which make what a person reads differ from what was written), no `..`.
pub const LINE_PATTERN: &str =
    r"^(?!.*\.\.)[^\x00-\x1F\x7F-\x9F\u061C\u200E\u200F\u2028-\u202E\u2066-\u2069]*$";
/// Free text: the same, except that newlines and tabs are fine.
pub const TEXT_PATTERN: &str =
    r"^[^\x00-\x08\x0B-\x1F\x7F-\x9F\u061C\u200E\u200F\u2028-\u202E\u2066-\u2069]*$";
/// A name: lowercase letters, digits, `-`, `_`.
pub const NAME_PATTERN: &str = r"^[a-z0-9][a-z0-9_-]{0,63}$";
/// A checkpoint: `base` or a sha256.
pub const CHECKPOINT_PATTERN: &str = r"^(base|[0-9a-f]{64})$";
/// A job id.
pub const JOB_ID_PATTERN: &str = r"^j-[0-9a-f]{16}$";
/// A page cursor: `c1.<query>.<fingerprint of the query's other fields>.<position>`, the position
/// a count of items given or (`log`) `k` and the hex of the last item's sort key.
pub const CURSOR_PATTERN: &str =
    r"^c1\.(list_nodes|log|dag)\.[0-9a-f]{8}\.([0-9]{1,10}|k[0-9a-f]{2,512})$";
/// Default bound of a growing answer (`list_nodes`, `log`, `dag`), in tokens estimated as the
/// answer's JSON bytes / 4: well under the 25,000 tokens an agent host keeps of a tool's output.
pub const DEFAULT_MAX_TOKENS: u64 = 8000;

/// Human wording of each pattern, used in validation errors.
pub fn describe_pattern(p: &str) -> Option<&'static str> {
    Some(match p {
        NODE_ID_PATTERN => "a node id such as \"n3\"",
        LINE_PATTERN => {
            "one line of text without control characters, bidirectional overrides or line separators, and without \"..\""
        }
        TEXT_PATTERN => {
            "text without control characters, bidirectional overrides or line separators (newlines and tabs are fine)"
        }
        NAME_PATTERN => {
            "a name of lowercase letters, digits, '-' and '_' (1-64, starting with a letter or digit)"
        }
        CHECKPOINT_PATTERN => "\"base\" or the sha256 of a checkpoint (64 lowercase hex digits)",
        JOB_ID_PATTERN => "a job id such as \"j-0123456789abcdef\"",
        CURSOR_PATTERN => "the next_cursor of a previous answer to the same query",
        _ => return None,
    })
}

// ---------------------------------------------------------------- branch

/// Open a new research direction (node) under one parent, or two parents to combine findings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchRequest {
    /// Parent node ids: one, or two for a merge node that combines two findings.
    #[schemars(length(min = 1, max = 2), inner(pattern(NODE_ID_PATTERN)))]
    pub parents: Vec<String>,
    /// Short title of the direction.
    #[schemars(length(min = 1, max = 200), pattern(LINE_PATTERN))]
    pub title: String,
    /// What this direction tests and why it might work.
    #[serde(default)]
    #[schemars(length(max = 4000), pattern(TEXT_PATTERN))]
    pub hypothesis: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchResult {
    /// The new node's id.
    pub node: String,
    /// Its git branch.
    pub branch: String,
    pub commit: String,
}

// ---------------------------------------------------------------- register_dataset

// Data types jobs read too live in `model::data`; they are part of this contract.
pub use crate::model::data::{
    Adapter, AnswerFormat, ArithOp, ArithParams, CodeParams, CodeStyle, EvalItem, Row, Schedule,
};

/// Where a dataset's rows come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DatasetSource {
    /// Rows written by the agent.
    Inline {
        #[schemars(length(min = 1))]
        rows: Vec<Row>,
    },
    /// A source the study owner declared in rsim.toml `[datasets.<name>]`.
    Declared {
        #[schemars(pattern(NAME_PATTERN))]
        source: String,
    },
    /// The built-in arithmetic generator: exactly `n` rows, none of which reproduces a protected
    /// test item (such draws are skipped, silently: how many is never reported).
    Arith(ArithParams),
    /// The built-in code generator (tiny-code): exactly `n` rows of specifications and programs,
    /// none of which reproduces a protected item (skipped silently, like the arithmetic ones).
    Code(CodeParams),
    /// Rows sampled from registered datasets, shuffled together.
    Mixture {
        #[schemars(length(min = 1, max = 16))]
        parts: Vec<MixturePart>,
        #[serde(default)]
        seed: u64,
    },
    /// The rows of a registered dataset that pass every given condition.
    Filter {
        #[schemars(pattern(NAME_PATTERN))]
        dataset: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1))]
        max_prompt_chars: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1))]
        max_answer_chars: Option<u64>,
        /// Keep rows whose prompt contains this text.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(length(min = 1, max = 200))]
        prompt_contains: Option<String>,
    },
}

/// One part of a mixture: `rows` rows drawn from a registered dataset (without replacement while
/// it lasts, then with replacement).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MixturePart {
    #[schemars(pattern(NAME_PATTERN))]
    pub dataset: String,
    #[schemars(range(min = 1, max = 1000000))]
    pub rows: u64,
}

/// Register a training dataset under a name (stored content-addressed; only registered datasets can be trained on).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterDatasetRequest {
    #[schemars(pattern(NODE_ID_PATTERN))]
    pub node: String,
    /// Study-wide unique dataset name.
    #[schemars(pattern(NAME_PATTERN))]
    pub name: String,
    pub source: DatasetSource,
    #[serde(default)]
    #[schemars(length(max = 4000), pattern(TEXT_PATTERN))]
    pub description: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterDatasetResult {
    pub dataset: String,
    pub sha256: String,
    pub rows: u64,
    pub commit: String,
}

// ---------------------------------------------------------------- run_sft

/// Supervised fine-tuning of a checkpoint on registered datasets, run as a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunSftRequest {
    #[schemars(pattern(NODE_ID_PATTERN))]
    pub node: String,
    /// Checkpoint to start from: "base" (the study's base model) or a checkpoint sha256 from a recorded run_sft.
    #[schemars(pattern(CHECKPOINT_PATTERN))]
    pub base: String,
    /// Registered dataset names; rows are mixed.
    #[schemars(length(min = 1, max = 16), inner(pattern(NAME_PATTERN)))]
    pub datasets: Vec<String>,
    #[schemars(range(min = 0.0000001, max = 1.0))]
    pub learning_rate: f64,
    #[schemars(range(min = 1, max = 10000000))]
    pub steps: u64,
    #[schemars(range(min = 1, max = 4096))]
    pub batch_size: u32,
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000000))]
    pub warmup_steps: u64,
    #[serde(default)]
    pub schedule: Schedule,
    #[serde(default)]
    pub adapter: Adapter,
    /// Compute the loss on answer tokens only (prompt tokens are context).
    #[serde(default = "yes")]
    pub answer_only_loss: bool,
    #[serde(default)]
    pub seed: u64,
    /// Keep a checkpoint every this many steps and score each, and the final one, on the dev
    /// split of `eval_task` with the pinned evaluator (0, the default: no intermediate
    /// checkpoints). Each score is an `evaluate` action of its own, recorded after this run and
    /// counted against the evaluation budget; never the test split.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 10000000))]
    pub eval_every: u64,
    /// The task whose dev split `eval_every` scores (required with `eval_every`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(NAME_PATTERN))]
    pub eval_task: Option<String>,
}

fn yes() -> bool {
    true
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// One point of a training run's learning curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LossPoint {
    pub step: u64,
    /// Training loss the trainer logged at that step.
    pub loss: f64,
}

/// A checkpoint kept part-way through a run (`eval_every`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StepCheckpoint {
    pub step: u64,
    pub checkpoint: String,
}

/// One dev score of a run's checkpoint at a step (`eval_every`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DevPoint {
    pub step: u64,
    pub checkpoint: String,
    /// The evaluation's scores (empty when it was refused or its job failed).
    pub metrics: BTreeMap<String, f64>,
    /// Why there is no score: the policy's refusal or the job's failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunSftResult {
    pub job: JobRecord,
    /// The trained checkpoint (present when the job succeeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// Numbers the trainer reported (e.g. final loss).
    pub train_metrics: BTreeMap<String, f64>,
    /// The learning curve: the training loss at each step the trainer logged (its progress
    /// lines), at most 200 points.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub curve: Vec<LossPoint>,
    /// Checkpoints kept part-way through the run (`eval_every`), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub intermediate: Vec<StepCheckpoint>,
    /// Dev scores of the intermediate checkpoints and the final one (`eval_every`), each recorded
    /// as its own `evaluate` action after this run's commit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dev_curve: Vec<DevPoint>,
    pub commit: String,
}

// ---------------------------------------------------------------- evaluate

/// Evaluate a checkpoint on a task split with the study's pinned evaluator, run as a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvaluateRequest {
    #[schemars(pattern(NODE_ID_PATTERN))]
    pub node: String,
    #[schemars(pattern(CHECKPOINT_PATTERN))]
    pub checkpoint: String,
    #[schemars(pattern(NAME_PATTERN))]
    pub task: String,
    pub split: Split,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvaluateResult {
    pub job: JobRecord,
    pub task: String,
    pub split: Split,
    /// Aggregate scores.
    pub metrics: BTreeMap<String, f64>,
    pub n_items: u64,
    /// sha256 of the evaluator command's program, pinned by the study.
    pub evaluator: String,
    /// Per-item results, only for the visible dev split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<EvalItem>>,
    /// Test split only: the score was significantly above the task's sealed split (the
    /// contamination tripwire), so it is withheld (`metrics` is empty) and the audit counts it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspected_contamination: bool,
    /// Dev split only: the dev score was significantly above the task's hidden dev twin (the dev
    /// tripwire): the node's evidence is suspect — left out of every ranking (compare's means,
    /// the leaderboard, the best path, the summary, halving, promotion) — and the audit counts it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub evidence_suspect: bool,
    /// Dev split with `policy.train_on_dev`: the recorded `metrics` are the hidden dev twin's
    /// (what reviewers rank on, since agents may train on dev); `items` are the dev split's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranked_on: Option<String>,
    pub commit: String,
}

// ---------------------------------------------------------------- compare

/// Compare a metric across related nodes (mean ± 95% interval over their evaluations, e.g. seeds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompareRequest {
    /// Node on which the comparison is recorded.
    #[schemars(pattern(NODE_ID_PATTERN))]
    pub node: String,
    /// Nodes to compare.
    #[schemars(length(min = 2, max = 64), inner(pattern(NODE_ID_PATTERN)))]
    pub nodes: Vec<String>,
    #[schemars(pattern(NAME_PATTERN))]
    pub task: String,
    #[serde(default = "dev")]
    pub split: Split,
    #[serde(default = "default_metric")]
    #[schemars(pattern(NAME_PATTERN))]
    pub metric: String,
}

fn dev() -> Split {
    Split::Dev
}
fn default_metric() -> String {
    "exact_match".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompareRow {
    pub node: String,
    pub title: String,
    /// Number of evaluations of this metric on the node.
    pub n: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<f64>,
    /// 95% interval of the mean (Student t); absent when n < 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci95: Option<[f64; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<f64>,
    /// The scores the mean is over, oldest first: evaluations of the node's checkpoints, except
    /// those kept part-way through a run (`eval_every`), which go into `trend.gain_per_1k`. At
    /// most the last 50 are listed (the answer stays bounded); `n` counts them all.
    pub values: Vec<f64>,
    /// How the node's runs were still moving at their end (absent when no run recorded a
    /// learning curve).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trend: Option<Trend>,
    /// The node's evidence is suspect (a dev score significantly above the hidden dev twin's):
    /// its scores are listed in `values` but it is not ranked — no mean, interval, best or trend.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspect: bool,
}

/// A mean over a node's runs with its 95% interval (Student t; absent from a single run).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Estimate {
    pub mean: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci95: Option<[f64; 2]>,
}

/// The trend of a node's training runs over the last half of each run: is it still learning?
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Trend {
    /// Runs with a learning curve.
    pub runs: u64,
    /// Training steps behind the node's checkpoints: a run's steps plus those behind the
    /// checkpoint it started from (the most over its runs).
    pub trained_steps: u64,
    /// The last logged training loss.
    pub loss_end: Estimate,
    /// Relative change of the training loss per 1,000 steps over the last half of each run
    /// (least-squares slope over the mean loss there): -0.5 is falling by half per 1,000 steps.
    pub loss_slope_per_1k: Estimate,
    /// Gain of the compared metric per 1,000 steps over the last half of each run, from the
    /// scores of its intermediate checkpoints (`eval_every`), its final one and the checkpoint it
    /// started from (absent when fewer than two of them were scored on this task and split).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gain_per_1k: Option<Estimate>,
    /// The training loss is still falling: its slope is below -0.1 (10% per 1,000 steps) on
    /// average and below 0 in every run.
    pub still_learning: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompareResult {
    pub task: String,
    pub split: Split,
    pub metric: String,
    pub rows: Vec<CompareRow>,
    pub commit: String,
}

// ---------------------------------------------------------------- review

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReviewVerdict {
    Promising,
    DeadEnd,
    NeedsMoreSeeds,
    /// Not yet, rather than no: still learning at the budget it had, and worth a larger one
    /// (continued training from its checkpoint).
    StillLearning,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeVerdict {
    #[schemars(pattern(NODE_ID_PATTERN))]
    pub node: String,
    pub verdict: ReviewVerdict,
    #[schemars(length(min = 1, max = 4000), pattern(TEXT_PATTERN))]
    pub reason: String,
}

/// A new direction the reviewer proposes (one parent, or two to combine findings).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Proposal {
    #[schemars(length(min = 1, max = 2), inner(pattern(NODE_ID_PATTERN)))]
    pub parents: Vec<String>,
    #[schemars(length(min = 1, max = 200), pattern(LINE_PATTERN))]
    pub title: String,
    #[serde(default)]
    #[schemars(length(max = 4000), pattern(TEXT_PATTERN))]
    pub hypothesis: String,
}

/// A reviewer's verdicts on related nodes and proposed new directions (reviewers only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReviewRequest {
    /// Node on which the review is recorded (usually the common parent).
    #[schemars(pattern(NODE_ID_PATTERN))]
    pub node: String,
    #[schemars(length(min = 1, max = 8000), pattern(TEXT_PATTERN))]
    pub summary: String,
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub verdicts: Vec<NodeVerdict>,
    #[serde(default)]
    #[schemars(length(max = 16))]
    pub proposals: Vec<Proposal>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReviewResult {
    /// Path of the review in the node's tree.
    pub review: String,
    pub commit: String,
}

// ---------------------------------------------------------------- conclude

/// Close a direction with its findings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConcludeRequest {
    #[schemars(pattern(NODE_ID_PATTERN))]
    pub node: String,
    pub outcome: Outcome,
    /// What was learned (Markdown), written to the node's notes.md.
    #[schemars(length(min = 1, max = 20000), pattern(TEXT_PATTERN))]
    pub findings: String,
    /// The node's best checkpoint, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(CHECKPOINT_PATTERN))]
    pub best_checkpoint: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConcludeResult {
    pub node: String,
    pub status: NodeStatus,
    pub commit: String,
}

// ---------------------------------------------------------------- queries

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetNodeRequest {
    #[schemars(pattern(NODE_ID_PATTERN))]
    pub node: String,
    /// Bound on the answer's size in tokens, estimated as its JSON bytes / 4 (default 8000). A
    /// node past it answers its newest actions and metrics and its first children that fit,
    /// with their totals; `log` pages through every action, `list_nodes` and `dag` the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 200, max = 10000000))]
    pub max_tokens: Option<u64>,
}

impl GetNodeRequest {
    /// The node within the default bound.
    pub fn new(node: impl Into<String>) -> GetNodeRequest {
        GetNodeRequest {
            node: node.into(),
            max_tokens: None,
        }
    }

    /// The whole node, for the orchestrator's own reads (not for an agent's context).
    pub fn whole(node: impl Into<String>) -> GetNodeRequest {
        GetNodeRequest {
            node: node.into(),
            max_tokens: Some(10_000_000),
        }
    }
}

/// A node with its place in the DAG, its actions and metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeInfo {
    pub id: String,
    pub branch: String,
    pub title: String,
    pub hypothesis: String,
    pub status: NodeStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    pub parents: Vec<String>,
    pub children: Vec<String>,
    pub created_at: String,
    pub created_by: String,
    pub tip: String,
    pub actions: Vec<ActionSummary>,
    /// Every metric recorded on the node.
    pub metrics: Vec<MetricRecord>,
    /// notes.md (findings), when concluded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    /// How many actions, metrics and children the node has (the lists above may hold fewer:
    /// see `more`).
    #[serde(default)]
    pub actions_total: u64,
    #[serde(default)]
    pub metrics_total: u64,
    #[serde(default)]
    pub children_total: u64,
    /// Set when the lists were cut to the size bound: what was left out and where to read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub more: Option<String>,
    /// The answer's size in tokens (its JSON bytes / 4).
    #[serde(default)]
    pub tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListNodesRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<NodeStatus>,
    #[serde(default = "default_limit")]
    #[schemars(range(min = 1, max = 100000))]
    pub limit: u64,
    /// First node to list (a `cursor` takes its place).
    #[serde(default)]
    #[schemars(range(max = 9999999999u64))]
    pub offset: u64,
    /// Bound on the answer's size in tokens, estimated as its JSON bytes / 4 (default 8000). The
    /// answer ends before the item that would pass it (one item at least) and gives `next_cursor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 200, max = 10000000))]
    pub max_tokens: Option<u64>,
    /// The `next_cursor` of the previous page of this same query (its other fields unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(CURSOR_PATTERN))]
    pub cursor: Option<String>,
}

fn default_limit() -> u64 {
    100
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeSummary {
    pub id: String,
    pub title: String,
    pub status: NodeStatus,
    pub parents: Vec<String>,
    pub actions: u32,
    pub created_at: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListNodesResult {
    pub total: u64,
    pub nodes: Vec<NodeSummary>,
    /// Pass this back as `cursor` (same query) for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// Estimated tokens of this answer (its JSON bytes / 4).
    pub tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DagView {
    /// Every node and edge.
    #[default]
    Full,
    /// Open nodes only (where work can continue).
    Frontier,
    /// Direct children of `node`.
    Children,
    /// Every ancestor of `node`.
    Ancestors,
    /// Parents, siblings and cousins of `node`: the evidence to compare it with.
    Related,
    /// Nodes ranked by their best value of `metric` on `task`/`split`.
    Best,
    /// The chain of checkpoints and run_sft actions from `checkpoint` back to the base model.
    Lineage,
    /// Counts by status, outcome and latest review verdict, the best node and the path to it,
    /// and the frontier (open nodes, paged): a whole study in a few hundred tokens.
    Summary,
}

/// Query the research DAG.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DagRequest {
    #[serde(default)]
    pub view: DagView,
    /// Focus node (children, ancestors, related).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(NODE_ID_PATTERN))]
    pub node: Option<String>,
    /// Task for `best` (defaults to the study's first task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(NAME_PATTERN))]
    pub task: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<Split>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(NAME_PATTERN))]
    pub metric: Option<String>,
    /// Checkpoint for `lineage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(CHECKPOINT_PATTERN))]
    pub checkpoint: Option<String>,
    /// Bound on the answer's size in tokens, estimated as its JSON bytes / 4 (default 8000; 1000
    /// for `summary`). The answer ends before the node that would pass it (one node at least) and
    /// gives `next_cursor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 200, max = 10000000))]
    pub max_tokens: Option<u64>,
    /// The `next_cursor` of the previous page of this same query (its other fields unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(CURSOR_PATTERN))]
    pub cursor: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DagNode {
    pub id: String,
    pub title: String,
    pub status: NodeStatus,
    pub parents: Vec<String>,
    /// For `best`: the node's best value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// For `related`: how it relates to the focus node (parent, sibling, cousin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relation: Option<String>,
    /// The node's evidence is suspect: a dev score significantly above the hidden dev twin's.
    /// It is left out of every ranking (so never in the `best` view).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspect: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LineageStep {
    pub checkpoint: String,
    /// Node and action seq of the run_sft that produced it (absent for the base model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DagResult {
    pub view: DagView,
    pub nodes: Vec<DagNode>,
    /// Edges parent → child among the returned nodes.
    pub edges: Vec<[String; 2]>,
    /// For `lineage`: newest first, ending at the base model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lineage: Vec<LineageStep>,
    /// For `summary`: the study in counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<DagSummary>,
    /// Nodes in the view (all pages).
    pub total: u64,
    /// Pass this back as `cursor` (same query) for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// Estimated tokens of this answer (its JSON bytes / 4).
    pub tokens: u64,
}

/// The `summary` view of the DAG.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DagSummary {
    pub nodes: u64,
    pub edges: u64,
    /// open / concluded → count.
    pub by_status: BTreeMap<String, u64>,
    /// Concluded nodes' outcomes (positive, negative, inconclusive) → count.
    pub by_outcome: BTreeMap<String, u64>,
    /// Each reviewed node's latest verdict (promising, dead_end, needs_more_seeds) → count.
    pub by_verdict: BTreeMap<String, u64>,
    /// Open nodes (the frontier; the page's `nodes` list them).
    pub frontier: u64,
    /// The node with the best dev value of the first task's metric, and its value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<DagNode>,
    /// The path to `best` through first parents, ending at it: from the root, or its last 64
    /// nodes when it is longer.
    pub best_path: Vec<String>,
    /// Nodes on the whole path from the root to `best` (0 without a best node).
    pub best_depth: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogRequest {
    /// Only this node's actions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(NODE_ID_PATTERN))]
    pub node: Option<String>,
    #[serde(default = "default_log_limit")]
    #[schemars(range(min = 1, max = 100000))]
    pub limit: u64,
    /// Include rejected actions (default true: the audit trail).
    #[serde(default = "yes")]
    pub include_rejected: bool,
    /// Bound on the answer's size in tokens, estimated as its JSON bytes / 4 (default 8000). The
    /// answer ends before the item that would pass it (one item at least) and gives `next_cursor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 200, max = 10000000))]
    pub max_tokens: Option<u64>,
    /// The `next_cursor` of the previous page of this same query (its other fields unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(CURSOR_PATTERN))]
    pub cursor: Option<String>,
}

fn default_log_limit() -> u64 {
    50
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionSummary {
    pub node: String,
    pub seq: u32,
    pub action: ActionName,
    pub decision: crate::model::Verdict,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub agent: String,
    pub role: Role,
    pub at: String,
    pub summary: String,
    pub commit: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogResult {
    pub actions: Vec<ActionSummary>,
    /// Pass this back as `cursor` (same query) for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// Estimated tokens of this answer (its JSON bytes / 4).
    pub tokens: u64,
}

/// Stop a running or queued job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelJobRequest {
    #[schemars(pattern(JOB_ID_PATTERN))]
    pub job: String,
}

/// `cancel_job` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelJobResult {
    pub job: String,
    /// Always true: the job was asked to stop; its action is recorded with the job cancelled.
    pub cancel_requested: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetJobRequest {
    #[schemars(pattern(JOB_ID_PATTERN))]
    pub job: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobInfo {
    pub node: String,
    /// Seq of the action that recorded the job.
    pub seq: u32,
    pub job: JobRecord,
}

// ---------------------------------------------------------------- diff

/// What differs between two nodes: recipe and hyper-parameters, datasets, environment, metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiffRequest {
    #[schemars(pattern(NODE_ID_PATTERN))]
    pub a: String,
    #[schemars(pattern(NODE_ID_PATTERN))]
    pub b: String,
}

/// Where a parameter or dataset is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DiffSide {
    OnlyA,
    OnlyB,
    Changed,
    Both,
}

/// A recipe or training parameter (the node's accepted run_sft requests, flattened with dotted
/// keys; a parameter that varies across a node's runs is the list of its distinct values).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParamDiff {
    pub key: String,
    pub side: DiffSide,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b: Option<serde_json::Value>,
}

/// A dataset one of the nodes trained on, by name and content hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DatasetDiff {
    pub name: String,
    pub sha256: String,
    pub rows: u64,
    /// only_a, only_b or both.
    pub side: DiffSide,
}

/// One metric on both nodes: B − A with its 95% interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricDiff {
    pub task: String,
    pub split: Split,
    pub metric: String,
    pub n_a: u64,
    pub n_b: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_a: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_b: Option<f64>,
    /// mean B − mean A (paired: the mean of the per-seed differences).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub difference: Option<f64>,
    /// 95% interval of the difference; absent when there is too little to estimate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci95: Option<[f64; 2]>,
    /// `paired` (Student t over the seeds both nodes ran, at least two), `welch` (unpaired,
    /// Welch–Satterthwaite degrees of freedom, at least two values each), or `none`.
    pub method: String,
    /// Seeds evaluated on both nodes (the pairs of a paired interval).
    pub matching_seeds: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiffResult {
    pub a: String,
    pub b: String,
    /// Parameters that differ (only in A, only in B, changed).
    pub params: Vec<ParamDiff>,
    /// Number of parameters equal on both.
    pub params_same: u64,
    pub datasets: Vec<DatasetDiff>,
    /// Environments the nodes' jobs ran in (`host:…`, `nix:<flake>#<narHash>`).
    pub env_a: Vec<String>,
    pub env_b: Vec<String>,
    pub env_same: bool,
    pub metrics: Vec<MetricDiff>,
}

// ---------------------------------------------------------------- reproduce

/// Re-run a recorded `run_sft` from what the record holds — the same base and datasets (by hash),
/// hyper-parameters and seed, in the same environment — and record whether it came out the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReproduceRequest {
    /// The node holding the action; the reproduction is recorded there.
    #[schemars(pattern(NODE_ID_PATTERN))]
    pub node: String,
    /// The action's seq on the node: a run_sft that made a checkpoint, or an evaluate on dev.
    #[schemars(range(min = 1, max = 1000000))]
    pub seq: u32,
    /// Run even if the environment (host fingerprint or pinned flake) differs from the recorded
    /// one; the result says it changed.
    #[serde(default)]
    pub allow_env_change: bool,
}

/// One number the job reported, recorded and reproduced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricDelta {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reproduced: Option<f64>,
    /// reproduced − recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub difference: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReproduceResult {
    pub job: JobRecord,
    /// The action reproduced.
    pub action: ActionName,
    pub seq: u32,
    /// The checkpoint the record holds: the one the run_sft made, or the one evaluated.
    pub recorded_checkpoint: String,
    /// run_sft: the checkpoint the re-run made (absent when the job failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// run_sft: the re-run made the identical checkpoint (every file, byte for byte); evaluate:
    /// every score is equal.
    pub identical: bool,
    /// evaluate: the task and split scored again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<Split>,
    /// evaluate: each score, recorded against reproduced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricDelta>,
    /// The environment the original job ran in, and whether the re-run's differs.
    pub recorded_env: String,
    pub env_changed: bool,
    /// run_sft: the trainer's numbers (final loss, …), recorded against reproduced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub train_metrics: Vec<MetricDelta>,
    /// What to make of it, in words (the embedded trainers are bit-for-bit repeatable, so a
    /// different checkpoint in the same environment is a finding).
    pub verdict: String,
    pub commit: String,
}
