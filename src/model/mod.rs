//! Domain types of the record: what a node is, what one recorded action holds.
//! These are the files in a node's git tree (`node.toml`, `actions/NNNN-<action>.json`) and
//! the rows of the index, so they are shared by the record, the index and the API.

pub mod data;
pub mod paths;
pub mod rule;

/// The root node: the base model, written by the study's genesis.
pub const ROOT_NODE: &str = "n0";

/// Numeric part of a node id (`n12` → 12), the order nodes are created in; -1 for an id that is
/// not `n` and a number.
pub fn node_num(id: &str) -> i64 {
    id.strip_prefix('n')
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1)
}

/// `n0`, `n12`: `n` and 1 to 9 digits, no leading zero but `n0` itself.
pub fn is_node_id(w: &str) -> bool {
    match w.strip_prefix('n') {
        Some(d) => {
            !d.is_empty()
                && d.len() <= 9
                && d.bytes().all(|b| b.is_ascii_digit())
                && (d == "0" || !d.starts_with('0'))
        }
        None => false,
    }
}

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The actions of the Experiment OS (those that write the record).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ActionName {
    /// Written once by `rsim init` for the root node (the base model).
    Init,
    Branch,
    RegisterDataset,
    RunSft,
    Evaluate,
    Compare,
    Review,
    Conclude,
    /// Ask a running job to stop (recorded when refused; the job's own action records the cancel).
    CancelJob,
    /// The owner's orchestrator starts or resumes a campaign (`rsim run`) on the root node, with
    /// its settings; refused while a study-wide budget is spent.
    Campaign,
    /// Re-run a recorded `run_sft` from what the record holds and record whether it came out the same.
    Reproduce,
}

impl ActionName {
    pub const ALL: [ActionName; 11] = [
        ActionName::Init,
        ActionName::Branch,
        ActionName::RegisterDataset,
        ActionName::RunSft,
        ActionName::Evaluate,
        ActionName::Compare,
        ActionName::Review,
        ActionName::Conclude,
        ActionName::CancelJob,
        ActionName::Campaign,
        ActionName::Reproduce,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ActionName::Init => "init",
            ActionName::Branch => "branch",
            ActionName::RegisterDataset => "register_dataset",
            ActionName::RunSft => "run_sft",
            ActionName::Evaluate => "evaluate",
            ActionName::Compare => "compare",
            ActionName::Review => "review",
            ActionName::Conclude => "conclude",
            ActionName::CancelJob => "cancel_job",
            ActionName::Campaign => "campaign",
            ActionName::Reproduce => "reproduce",
        }
    }

    pub fn parse(s: &str) -> Option<ActionName> {
        Self::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

impl fmt::Display for ActionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who is acting: recorded in every commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The study owner (the person at the CLI): every action.
    Owner,
    /// Runs experiments on a direction.
    Worker,
    /// Compares evidence and decides where the DAG grows.
    Reviewer,
    /// Read-only.
    Observer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Worker => "worker",
            Role::Reviewer => "reviewer",
            Role::Observer => "observer",
        }
    }
    pub fn parse(s: &str) -> Option<Role> {
        [Role::Owner, Role::Worker, Role::Reviewer, Role::Observer]
            .into_iter()
            .find(|r| r.as_str() == s)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The caller of an action: an agent identity and its role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub agent: String,
    pub role: Role,
}

impl Caller {
    pub fn new(agent: impl Into<String>, role: Role) -> Self {
        Caller {
            agent: agent.into(),
            role,
        }
    }
    pub fn owner() -> Self {
        Caller::new("owner", Role::Owner)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    /// On the frontier: more experiments may run here.
    Open,
    /// Concluded with findings; only compare/review may still refer to it.
    Concluded,
}

impl NodeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Open => "open",
            NodeStatus::Concluded => "concluded",
        }
    }
    pub fn parse(s: &str) -> Option<NodeStatus> {
        match s {
            "open" => Some(NodeStatus::Open),
            "concluded" => Some(NodeStatus::Concluded),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Positive,
    Negative,
    Inconclusive,
}

/// `node.toml`: the node's own state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeMeta {
    pub id: String,
    pub title: String,
    #[serde(default)]
    pub hypothesis: String,
    /// Parent node ids (empty only for the root).
    #[serde(default)]
    pub parents: Vec<String>,
    pub status: NodeStatus,
    pub created_at: String,
    pub created_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Accepted,
    Rejected,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Accepted => "accepted",
            Verdict::Rejected => "rejected",
        }
    }
}

/// The policy guard's decision on one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    pub decision: Verdict,
    /// The rule that rejected the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Why, in words a person understands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Decision {
    pub fn accept() -> Self {
        Decision {
            decision: Verdict::Accepted,
            rule: None,
            reason: None,
        }
    }
    pub fn reject(rule: rule::Rule, reason: impl Into<String>) -> Self {
        Decision {
            decision: Verdict::Rejected,
            rule: Some(rule.as_str().into()),
            reason: Some(reason.into()),
        }
    }
    pub fn accepted(&self) -> bool {
        self.decision == Verdict::Accepted
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Running,
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
    Lost,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::TimedOut => "timed_out",
            JobState::Cancelled => "cancelled",
            JobState::Lost => "lost",
        }
    }
    pub fn parse(s: &str) -> Option<JobState> {
        [
            JobState::Queued,
            JobState::Running,
            JobState::Succeeded,
            JobState::Failed,
            JobState::TimedOut,
            JobState::Cancelled,
            JobState::Lost,
        ]
        .into_iter()
        .find(|j| j.as_str() == s)
    }
    pub fn is_final(self) -> bool {
        !matches!(self, JobState::Queued | JobState::Running)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    Sft,
    Evaluate,
}

impl JobKind {
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Sft => "sft",
            JobKind::Evaluate => "evaluate",
        }
    }
}

/// A job as recorded with its action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobRecord {
    pub id: String,
    pub kind: JobKind,
    pub state: JobState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    pub started_at: String,
    pub finished_at: String,
    /// Wall-clock seconds the job ran (counts against compute budgets).
    pub duration_s: f64,
    /// The command that ran (the spec path is its last argument).
    pub command: Vec<String>,
    /// Environment description, e.g. `host` or `nix:<flake>#narHash`.
    pub env: String,
    /// `isolated` (own network namespace: no network) or `shared`.
    #[serde(default = "shared")]
    pub network: String,
    /// Combined stdout/stderr log (artifact sha256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// Why the job did not succeed, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Compute charged to budgets, seconds × units: a Slurm job's elapsed time × its GPUs (or
    /// CPUs when it has none). Unset: `duration_s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_s: Option<f64>,
    /// The Slurm job behind this job, for jobs run by the `slurm` backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmJob>,
    /// The sandbox the job's program ran under, as it happened: `landlock-abiN` (Landlock ABI N
    /// enforced), `none: <why>` (it ran unconfined), `refused: <why>` (the sandbox was required
    /// and could not be applied, so the program never ran), `off` (the study turned it off).
    /// Unset: the program never started, or the job predates sandboxes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// Compute threads the job was given (`RAYON_NUM_THREADS`, `OMP_NUM_THREADS`, …): the
    /// backend's cores per job. Unset: left to the job (records before threads were sized).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
}

impl JobRecord {
    /// What the job counts against compute budgets.
    pub fn charged_s(&self) -> f64 {
        self.compute_s.unwrap_or(self.duration_s)
    }
}

/// A Slurm job as recorded: its id and what the cluster reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SlurmJob {
    /// Slurm's job id (from `sbatch --parsable`).
    pub job_id: String,
    /// Slurm's final state, e.g. `COMPLETED`, `FAILED`, `CANCELLED`, `TIMEOUT` (empty if unknown).
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<String>,
    pub cpus: u32,
    pub gpus: u32,
    /// Seconds from submission until the job started running (unset if it never ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_s: Option<f64>,
    /// Elapsed time Slurm reports for the job, seconds.
    pub elapsed_s: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactKind {
    Checkpoint,
    Dataset,
    Log,
    Evaluation,
}

impl ArtifactKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ArtifactKind::Checkpoint => "checkpoint",
            ArtifactKind::Dataset => "dataset",
            ArtifactKind::Log => "log",
            ArtifactKind::Evaluation => "evaluation",
        }
    }
}

fn shared() -> String {
    "shared".into()
}

/// A content-addressed artifact referenced by an action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArtifactRef {
    pub sha256: String,
    pub kind: ArtifactKind,
    pub name: String,
    /// For checkpoints: the checkpoint it was trained from (`base` chain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Visible: per-item results are returned.
    Dev,
    /// Protected: aggregate scores only.
    Test,
}

impl Split {
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Dev => "dev",
            Split::Test => "test",
        }
    }
    pub fn parse(s: &str) -> Option<Split> {
        match s {
            "dev" => Some(Split::Dev),
            "test" => Some(Split::Test),
            _ => None,
        }
    }
}

/// One measured number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricRecord {
    pub name: String,
    pub value: f64,
    pub task: String,
    pub split: Split,
    pub checkpoint: String,
}

/// `actions/NNNN-<action>.json`: one action, complete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionRecord {
    /// 1-based position of the action on its node.
    pub seq: u32,
    pub action: ActionName,
    pub node: String,
    pub agent: String,
    pub role: Role,
    pub at: String,
    /// One-line summary (the commit subject without the action prefix).
    pub summary: String,
    /// The full validated request.
    pub request: serde_json::Value,
    pub decision: Decision,
    /// The action's result as returned to the caller (absent when rejected).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<ArtifactRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricRecord>,
    /// Nodes this action refers to (compared, reviewed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refers_to: Vec<String>,
}

impl ActionRecord {
    /// File name of this action inside the node tree's `actions/` directory.
    pub fn file_name(&self) -> String {
        action_file_name(self.seq, self.action)
    }
}

pub fn action_file_name(seq: u32, action: ActionName) -> String {
    format!("{seq:04}-{}.json", action.as_str())
}

/// Latest metrics of a node, `metrics.json` in its tree: `task/split/metric` → value and where it came from.
pub type NodeMetrics = BTreeMap<String, MetricRecord>;

/// Current time as RFC 3339 UTC with millisecond precision (orders actions within a second).
pub fn now_rfc3339() -> String {
    rfc3339(time::OffsetDateTime::now_utc())
}

/// A time given as seconds since the epoch (e.g. from another process), in RFC 3339.
pub fn rfc3339_at(epoch_s: f64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos((epoch_s * 1e9) as i128)
        .map_or_else(|_| now_rfc3339(), rfc3339)
}

fn rfc3339(t: time::OffsetDateTime) -> String {
    let fmt = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    t.format(&fmt)
        .unwrap_or_else(|_| t.unix_timestamp().to_string())
}
