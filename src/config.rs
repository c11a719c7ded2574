//! `rsim.toml`: the study owner's configuration, parsed into typed config with errors naming
//! the file, the key and what was expected. Its JSON Schema is generated into `schemas/`.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::util::error::{Error, Result};
use crate::util::hash::is_sha256;

pub const CONFIG_FILE: &str = "rsim.toml";
/// The most bytes rsim reads of a file the owner keeps on `main` (`rsim.toml`, `allowed_signers`),
/// from git or from a work tree: a clone decides its size (`record::MAX_OWNER_FILE` is this).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// A whole study's configuration (`rsim.toml` at the study root).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StudyConfig {
    pub study: StudySection,
    pub base_model: BaseModel,
    /// Tasks (benchmarks) by name; each has a visible dev split and a protected test split.
    #[serde(default)]
    pub tasks: BTreeMap<String, TaskConfig>,
    #[serde(default)]
    pub budgets: Budgets,
    #[serde(default)]
    pub environment: Environment,
    #[serde(default)]
    pub backend: Backend,
    /// Commands that run jobs. The job spec path is appended as the last argument.
    pub jobs: JobsConfig,
    #[serde(default)]
    pub policy: PolicyConfig,
    /// Dataset sources the study owner declares (agents may register them by name).
    #[serde(default)]
    pub datasets: BTreeMap<String, DeclaredSource>,
    /// External command agents (`rsim run --worker cmd:…`).
    #[serde(default)]
    pub agents: AgentsConfig,
    /// How the record is written to disk.
    #[serde(default)]
    pub record: RecordConfig,
    /// Limits of `rsim serve --http` that no client can exceed.
    #[serde(default)]
    pub server: ServerConfig,
}

/// Resource limits of the HTTP server (`rsim serve --http`): what one agent, or a crowd of slow
/// clients, can hold at once. Defaults suit a study with a few dozen agents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Open TCP connections at once. Further connections are answered 503 and closed. Lowered
    /// at start to what the process's file-descriptor limit leaves after a reserve for the study
    /// (git, the index, job logs), so agents already connected keep working.
    pub max_connections: usize,
    /// MCP sessions alive at once (each holds ~50 KB); an `initialize` past it is answered 503.
    pub max_sessions: usize,
    /// MCP sessions one agent identity may hold at once.
    pub max_sessions_per_agent: usize,
    /// A session with no request for this long is closed (the client starts a new one).
    pub session_idle_s: u64,
    /// A connection that moves no byte either way for this long is closed (SSE streams send a
    /// keep-alive every 15 s, so a live stream never idles).
    pub idle_timeout_s: u64,
    /// A client must send a request's headers within this many seconds of starting it.
    pub header_timeout_s: u64,
    /// Open TCP connections from one remote address, counted when the connection is accepted
    /// (before a byte is read), so one client's slow or silent sockets cannot take every place.
    /// Loopback peers are exempt: every local agent shares 127.0.0.1 (the per-agent limits
    /// still hold them).
    pub max_connections_per_address: usize,
    /// Connections one agent identity may hold: a connection counts for the identity of its
    /// latest request from the moment that request's headers are read, idle or not. Over
    /// HTTP/1.1 a connection carries one request at a time, so this also bounds the identity's
    /// requests in flight and open streams. The study owner is exempt.
    pub max_connections_per_agent: usize,
    /// Live event streams of the web page (`/api/events`) one identity may hold; the study
    /// owner is exempt.
    pub max_streams_per_agent: usize,
    /// Connections (of `max_connections`) and web event streams only the study owner may use,
    /// so agents holding everything else never make the owner's page answer 503. The owner is
    /// the web page on loopback without `--tokens`, or the `[owner]` token of the tokens file.
    pub owner_reserve: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: 256,
            max_sessions: 128,
            max_sessions_per_agent: 16,
            session_idle_s: 300,
            idle_timeout_s: 120,
            header_timeout_s: 10,
            max_connections_per_address: 32,
            max_connections_per_agent: 32,
            max_streams_per_agent: 8,
            owner_reserve: 8,
        }
    }
}

/// How the record (git) and its index are written to disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordConfig {
    /// Fsync what an action writes before it returns: git objects, branch updates, the index's
    /// transactions and the artifacts it stores (datasets, checkpoints, logs). `false` (the default, libgit2's own): the OS writes them back when
    /// it chooses; a killed or crashed rsim process loses nothing, but a power loss or an OS
    /// crash can lose the last actions or leave their git objects empty. `true`: a recorded action survives a power loss, at the price of
    /// about 16 fsyncs per write action (measured: a `branch` from 7.5 to 12 ms per process on
    /// an idle virtual disk, far more on a busy one). Within one process, once a study asks for
    /// fsync, every study that process writes is fsynced.
    #[serde(default = "default_fsync")]
    pub fsync: bool,
}

fn default_fsync() -> bool {
    false
}

impl Default for RecordConfig {
    fn default() -> Self {
        RecordConfig {
            fsync: default_fsync(),
        }
    }
}

/// What external command agents get from the machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsConfig {
    /// The only environment variables a command agent inherits (besides the `RSIM_*` ones rsim
    /// sets for its turn): name here what the agent needs, e.g. its model API key.
    #[serde(default = "default_agent_env")]
    pub env: Vec<String>,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        AgentsConfig {
            env: default_agent_env(),
        }
    }
}

fn default_agent_env() -> Vec<String> {
    ["PATH", "HOME", "LANG", "LC_ALL", "TERM", "TZ"]
        .map(String::from)
        .to_vec()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StudySection {
    /// Short name of the study.
    pub name: String,
    #[serde(default)]
    pub description: String,
}

/// The base model every checkpoint must descend from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BaseModel {
    pub name: String,
    /// Path (relative to the study root) of the base checkpoint: a file or a directory of files.
    /// It is hashed into the object store by `rsim init`.
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskConfig {
    #[serde(default)]
    pub description: String,
    /// Name of the metric the evaluator reports as the task's headline: `exact_match` (the
    /// parsed answer) or, for a code task, `pass_at_1` (the model's program run against each
    /// item's hidden `tests`, in a sandbox; see the README's "Code tasks").
    #[serde(default = "default_metric")]
    pub metric: String,
    /// Visible split: agents may see per-item results.
    pub dev: EvalSet,
    /// Protected split: agents see aggregate scores only.
    pub test: EvalSet,
    /// The task's own equivalence of items for the contamination gate, used beside n-gram
    /// overlap: `arithmetic` matches a problem written in any order of a commutative operator's
    /// operands, in any script's digits or in English number words, with filler words inside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normal_form: Option<NormalForm>,
    /// A sealed split drawn from the test split's distribution, never shown to anyone: every test
    /// evaluation also scores it with the same evaluator, and a test score significantly above
    /// the sealed score (`policy.tripwire_alpha`) is recorded as suspected contamination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<EvalSet>,
    /// The dev split's hidden twin: drawn from the dev split's distribution, disjoint from every
    /// other split, never shown and never trainable. Every dev evaluation also scores it with the
    /// same evaluator; a dev score significantly above the twin's (`policy.dev_tripwire_alpha`)
    /// marks the node's evidence as suspect, and it is left out of every ranking. With
    /// `policy.train_on_dev` the twin's score is the dev score reviewers rank on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_twin: Option<EvalSet>,
}

impl TaskConfig {
    /// The hidden split scored beside an evaluation of `split` (the sealed split beside test,
    /// the dev twin beside dev), where the task has one, with its name.
    pub fn hidden_twin(&self, split: crate::model::Split) -> Option<(&'static str, &EvalSet)> {
        let name = hidden_split_name(split);
        match split {
            crate::model::Split::Test => self.sealed.as_ref(),
            crate::model::Split::Dev => self.dev_twin.as_ref(),
        }
        .map(|s| (name, s))
    }

    /// Every split of the task with its name: dev, the dev twin, test and sealed (those it has).
    pub fn splits(&self) -> Vec<(&'static str, &EvalSet)> {
        let mut out = vec![("dev", &self.dev)];
        out.extend(self.dev_twin.iter().map(|s| ("dev_twin", s)));
        out.push(("test", &self.test));
        out.extend(self.sealed.iter().map(|s| ("sealed", s)));
        out
    }
}

/// The name of the hidden split scored beside an evaluation of `split`: `sealed` beside test,
/// `dev_twin` beside dev.
pub fn hidden_split_name(split: crate::model::Split) -> &'static str {
    match split {
        crate::model::Split::Test => "sealed",
        crate::model::Split::Dev => "dev_twin",
    }
}

/// A task-defined normal form of items (the gate's extension point: a variant here and its key
/// function in `policy::normal_form`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NormalForm {
    /// Binary arithmetic problems: operator and operands (a multiset for `+` and `*`).
    Arithmetic,
    /// Strings of digits as multisets: a digit-sorting problem is its digits in any order, and
    /// its answer is one of those orders.
    Digits,
    /// Compositions of the tiny-code family's string operations, letters blanked: an item is the
    /// chain of operations its specification names, read from any specification's words or
    /// from any program that computes it (`policy::string_ops`).
    StringOps,
}

impl NormalForm {
    /// What makes two of an arithmetic family's problems one (the gate's and the generator's
    /// key): for arithmetic the operator and operands (`12+34` is `34+12`), for sorting and digit
    /// sums the multiset of digits (`530912` is `219035`: both sort to `012359`, both sum to 20).
    pub fn of(op: crate::model::data::ArithOp) -> NormalForm {
        match op {
            crate::model::data::ArithOp::Sort | crate::model::data::ArithOp::DigitSum => {
                NormalForm::Digits
            }
            _ => NormalForm::Arithmetic,
        }
    }
}

fn default_metric() -> String {
    "exact_match".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalSet {
    /// Path relative to the study root (JSON Lines, one item a line).
    pub path: String,
    /// sha256 of the file, pinned by the study owner; checked before every evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Budgets {
    /// Total job wall-clock seconds for the whole study.
    #[serde(default = "default_compute_seconds")]
    pub compute_seconds: u64,
    /// Total number of evaluations for the whole study.
    #[serde(default = "default_evaluations")]
    pub evaluations: u64,
    /// Evaluations on a protected test split allowed per node.
    #[serde(default = "default_test_evals")]
    pub test_evaluations_per_node: u64,
    /// Maximum number of nodes in the research DAG.
    #[serde(default = "default_max_nodes")]
    pub max_nodes: u64,
    /// How long a job that does not fit in what running jobs leave (their claims: each its whole
    /// wall-clock limit) waits in the first-come-first-served admission queue before it is
    /// refused. While several agents hold or wait for compute, each may claim at most an equal
    /// share of what the study has left.
    #[serde(default = "default_queue_wait_seconds")]
    pub queue_wait_seconds: u64,
    /// Bytes the study may hold on disk — stored objects (checkpoints, kept checkpoints, logs,
    /// datasets), job directories and the record — before jobs and registrations are refused
    /// (rule `budget-storage`; `rsim storage` shows the count, `rsim gc` frees what nothing
    /// references). Raise it for large models: a 7B checkpoint in bf16 is about 14 GB.
    #[serde(default = "default_storage_bytes")]
    pub storage_bytes: u64,
    /// Bytes one agent's checkpoints, logs, datasets, job directories and records may take.
    #[serde(default = "default_agent_storage_bytes")]
    pub agent_storage_bytes: u64,
    /// Job seconds one node may use (unset: no per-node limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_compute_seconds: Option<u64>,
    /// Job seconds one agent may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_compute_seconds: Option<u64>,
    /// Evaluations one node may run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_evaluations: Option<u64>,
    /// Evaluations one agent may run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_evaluations: Option<u64>,
    /// Evaluations on the protected test split one agent may run, across all nodes (the per-node
    /// limit alone lets an agent probe the test split through many nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_test_evaluations: Option<u64>,
    /// Rows all registered datasets of the study may hold together (derived ones — mixtures,
    /// filters — included). Reserved at registration, so racing registrations cannot together
    /// pass it.
    #[serde(default = "default_dataset_rows")]
    pub dataset_rows: u64,
    /// Bytes the stored objects of all registered datasets may take together (JSON Lines, as
    /// stored), reserved likewise.
    #[serde(default = "default_dataset_storage_bytes")]
    pub dataset_storage_bytes: u64,
    /// Rows the datasets one agent registers may hold together (so one agent cannot take the
    /// study's whole budget).
    #[serde(default = "default_agent_dataset_rows")]
    pub agent_dataset_rows: u64,
    /// Stored bytes of the datasets one agent registers, together.
    #[serde(default = "default_agent_dataset_storage_bytes")]
    pub agent_dataset_storage_bytes: u64,
}

fn default_agent_dataset_rows() -> u64 {
    2_000_000
}
fn default_agent_dataset_storage_bytes() -> u64 {
    512 << 20
}

fn default_dataset_rows() -> u64 {
    5_000_000
}
fn default_dataset_storage_bytes() -> u64 {
    2 << 30
}
fn default_compute_seconds() -> u64 {
    36_000
}
fn default_storage_bytes() -> u64 {
    256 << 30
}
fn default_agent_storage_bytes() -> u64 {
    64 << 30
}
fn default_queue_wait_seconds() -> u64 {
    3_600
}
fn default_evaluations() -> u64 {
    1_000
}
fn default_test_evals() -> u64 {
    2
}
fn default_max_nodes() -> u64 {
    10_000
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            compute_seconds: default_compute_seconds(),
            queue_wait_seconds: default_queue_wait_seconds(),
            storage_bytes: default_storage_bytes(),
            agent_storage_bytes: default_agent_storage_bytes(),
            evaluations: default_evaluations(),
            test_evaluations_per_node: default_test_evals(),
            max_nodes: default_max_nodes(),
            node_compute_seconds: None,
            agent_compute_seconds: None,
            agent_test_evaluations: None,
            node_evaluations: None,
            agent_evaluations: None,
            dataset_rows: default_dataset_rows(),
            dataset_storage_bytes: default_dataset_storage_bytes(),
            agent_dataset_rows: default_agent_dataset_rows(),
            agent_dataset_storage_bytes: default_agent_dataset_storage_bytes(),
        }
    }
}

/// Where jobs run their commands.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Environment {
    /// The host's own tools; a fingerprint (binary hash, tool versions) is recorded.
    #[default]
    Host,
    /// A Nix flake; its narHash is recorded with every job.
    Nix { flake: String },
    /// A Python virtual environment built from a lock (a requirements file in which every
    /// requirement is pinned `name==version` with its `--hash=sha256:…`s) by `rsim env build`
    /// (and `rsim init`); checked against the lock before every job, which it must match
    /// exactly. The lock's hash, the interpreter and the versions of torch, transformers, peft,
    /// CUDA and the driver are recorded with every job.
    Python {
        /// The lock, relative to the study.
        lock: String,
        /// The interpreter that builds the environment (a command on PATH or an absolute path).
        #[serde(default = "default_python")]
        python: String,
        /// Where environments are kept, one folder per lock and interpreter (absolute; outside
        /// the study). Unset: `$RSIM_PYTHON_ENVS`, else `~/.cache/rsim/python-envs`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        envs: Option<PathBuf>,
    },
}

fn default_python() -> String {
    "python3".into()
}

/// What `[environment] kind = "python"` says, borrowed (what `jobs::pyenv` builds and checks).
#[derive(Debug, Clone, Copy)]
pub struct PythonEnvConfig<'a> {
    /// The lock, relative to the study.
    pub lock: &'a str,
    /// The interpreter that builds the environment (a command on PATH or an absolute path).
    pub python: &'a str,
    /// Where environments are kept (absolute); `None`: `$RSIM_PYTHON_ENVS`, else
    /// `$XDG_CACHE_HOME/rsim/python-envs`, else `~/.cache/rsim/python-envs`.
    pub envs: Option<&'a Path>,
}

impl Environment {
    /// The Python environment's settings, for `kind = "python"`.
    pub fn python(&self) -> Option<PythonEnvConfig<'_>> {
        match self {
            Environment::Python { lock, python, envs } => Some(PythonEnvConfig {
                lock,
                python,
                envs: envs.as_deref(),
            }),
            _ => None,
        }
    }
}

/// Which job backend runs jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Backend {
    /// Child processes on this machine.
    Local {
        /// Jobs running at once.
        #[serde(default = "default_parallel")]
        max_parallel_jobs: u32,
        /// Wall-clock limit of one job, seconds.
        #[serde(default = "default_timeout")]
        timeout_s: u64,
        /// Largest file a job may write, MiB (RLIMIT_FSIZE: a job flooding its log is stopped).
        #[serde(default = "default_max_file_mb")]
        max_file_mb: u64,
        /// Address-space limit of a job, MiB (RLIMIT_AS); unset: no limit.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_memory_mb: Option<u64>,
        /// Compute threads of one job (`RAYON_NUM_THREADS`, `OMP_NUM_THREADS` and the like, set
        /// before the job's compute library starts its pools), 1 to 1024, and never more than
        /// this machine's cores; unset: the cores shared among `max_parallel_jobs`, at least
        /// one, so jobs side by side never ask for more threads than there are cores.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        threads_per_job: Option<u32>,
    },
    /// Jobs submitted to a Slurm cluster with `sbatch` (a generated batch script runs the same
    /// job command in the same environment); rsim polls `squeue` and reads the outcome from `sacct`.
    Slurm(SlurmBackend),
}

/// The `slurm` backend: what every job asks the cluster for. Only the study owner sets these
/// (in `rsim.toml`); agents' requests cannot name resources or sbatch options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SlurmBackend {
    /// Partition (`--partition`); unset: the cluster's default partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Account charged for the jobs (`--account`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Quality of service (`--qos`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// CPUs per job (`--cpus-per-task`).
    #[serde(default = "default_cpus")]
    pub cpus_per_job: u32,
    /// GPUs per job (0: none).
    #[serde(default)]
    pub gpus_per_job: u32,
    /// How GPUs are requested: `gpus` (`--gpus=N`) or `gres` (`--gres=gpu:N`).
    #[serde(default)]
    pub gpu_request: GpuRequest,
    /// GPU type, e.g. `a100` (`--gpus=a100:N` or `--gres=gpu:a100:N`); unset: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Memory per job, MiB (`--mem`); unset: the partition's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_mb: Option<u64>,
    /// Wall-clock limit of one job once it runs, seconds. rsim stops the job at this limit (or
    /// sooner when a budget runs out); Slurm's `--time` is set to it rounded up to minutes.
    #[serde(default = "default_timeout")]
    pub timeout_s: u64,
    /// Largest file a job may write, MiB (`ulimit -f` in the batch script).
    #[serde(default = "default_max_file_mb")]
    pub max_file_mb: u64,
    /// Extra `#SBATCH` lines, each one sbatch option, e.g. `--constraint=a100`. Options rsim
    /// controls (output, working directory, environment, job name, array, wrap) are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_sbatch: Vec<String>,
}

/// How a Slurm job asks for GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GpuRequest {
    /// `--gpus=[type:]N`
    #[default]
    Gpus,
    /// `--gres=gpu:[type:]N`
    Gres,
}

impl SlurmBackend {
    /// How many units of compute a job holds: its GPUs if it has any, else its CPUs. A job's
    /// charge against compute budgets is its elapsed time × these units.
    pub fn charge_units(&self) -> u32 {
        if self.gpus_per_job > 0 {
            self.gpus_per_job
        } else {
            self.cpus_per_job.max(1)
        }
    }
}

/// sbatch options rsim sets itself; `extra_sbatch` may not override them.
const RESERVED_SBATCH: &[&str] = &[
    "-o",
    "--output",
    "-e",
    "--error",
    "-D",
    "--chdir",
    "--export",
    "--export-file",
    "-J",
    "--job-name",
    "-a",
    "--array",
    "--wrap",
    "--parsable",
    "-W",
    "--wait",
    "--open-mode",
    "-i",
    "--input",
];

fn default_cpus() -> u32 {
    1
}

fn default_max_file_mb() -> u64 {
    4096
}

fn default_parallel() -> u32 {
    2
}
/// The most threads `backend.threads_per_job` may ask for (a job is also held to the cores of
/// the machine it runs on).
const MAX_THREADS_PER_JOB: u32 = 1024;

fn default_timeout() -> u64 {
    3_600
}

impl Default for Backend {
    fn default() -> Self {
        Backend::Local {
            max_parallel_jobs: default_parallel(),
            timeout_s: default_timeout(),
            max_file_mb: default_max_file_mb(),
            max_memory_mb: None,
            threads_per_job: None,
        }
    }
}

impl Backend {
    pub fn timeout_s(&self) -> u64 {
        match self {
            Backend::Local { timeout_s, .. } => *timeout_s,
            Backend::Slurm(s) => s.timeout_s,
        }
    }

    /// Compute units a job holds (budgets charge elapsed time × units): 1 for a local job.
    pub fn charge_units(&self) -> u32 {
        match self {
            Backend::Local { .. } => 1,
            Backend::Slurm(s) => s.charge_units(),
        }
    }

    /// Resource limits for each job.
    pub fn limits(&self) -> JobLimits {
        match self {
            Backend::Local {
                max_parallel_jobs,
                max_file_mb,
                max_memory_mb,
                threads_per_job,
                ..
            } => JobLimits {
                max_parallel: *max_parallel_jobs,
                max_file_bytes: max_file_mb.saturating_mul(1 << 20),
                max_memory_bytes: max_memory_mb.map(|m| m.saturating_mul(1 << 20)),
                threads: Some({
                    let cores = std::thread::available_parallelism()
                        .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX));
                    // A configured count (a cloned study's, too) never exceeds this machine's cores.
                    threads_per_job
                        .unwrap_or(cores / (*max_parallel_jobs).max(1))
                        .clamp(1, cores)
                }),
            },
            // The cluster schedules Slurm jobs; memory is a Slurm request (`--mem`), not an rlimit.
            Backend::Slurm(s) => JobLimits {
                max_parallel: u32::MAX,
                max_file_bytes: s.max_file_mb.saturating_mul(1 << 20),
                max_memory_bytes: None,
                threads: Some(s.cpus_per_job.max(1)),
            },
        }
    }
}

/// Job commands (argv). The job-spec JSON path is appended as the last argument.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobsConfig {
    /// Trainer command for `run_sft`.
    pub sft: Vec<String>,
    /// Pinned evaluator command for `evaluate`.
    pub evaluate: Vec<String>,
    /// Fingerprint of the evaluator (its argv and the files it names), pinned by the study owner;
    /// `evaluate` is rejected when the evaluator no longer matches. `rsim init` fills it in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluator_sha256: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Most parents a node may have (2 allows merge nodes that combine two findings).
    #[serde(default = "default_max_parents")]
    pub max_parents: u32,
    /// Most rows an agent may register inline in one dataset.
    #[serde(default = "default_inline_rows")]
    pub max_inline_rows: u64,
    /// Contamination gate: n-gram length (tokens, 1 to 128) of the overlap scan against protected
    /// eval sets; items shorter than it are matched whole.
    #[serde(default = "default_ngram")]
    pub contamination_ngram: u32,
    /// Contamination gate: share of an eval item's n-grams found in a dataset that makes it contaminated.
    #[serde(default = "default_threshold")]
    pub contamination_threshold: f64,
    /// Contamination rejections an agent may collect before it may register no more datasets
    /// (stops using the gate as an oracle for which items are in the test set).
    #[serde(default = "default_probes")]
    pub max_contamination_rejections_per_agent: u64,
    /// Write calls (actions, accepted or refused) one agent may make in a minute; past it, calls
    /// are refused with rule `throttled` (recorded once a minute) until the minute is over. The
    /// owner is not throttled. 0: no limit.
    #[serde(default = "default_writes_per_minute")]
    pub max_writes_per_agent_per_minute: u64,
    /// Refuse to run jobs when they cannot be cut off from the network.
    #[serde(default)]
    pub require_network_isolation: bool,
    /// Most rows a dataset may have (registered, or the union one run_sft trains on); checked
    /// on the request's projected size before any row is materialised.
    #[serde(default = "default_max_dataset_rows")]
    pub max_dataset_rows: u64,
    /// Most bytes of training text (prompt + answer) a dataset may have, likewise.
    #[serde(default = "default_max_dataset_bytes")]
    pub max_dataset_bytes: u64,
    /// Significance level of the sealed-split tripwire's one-sided two-proportion test: a test
    /// score above the sealed score with a p-value below this is suspected contamination.
    #[serde(default = "default_tripwire_alpha")]
    pub tripwire_alpha: f64,
    /// Significance level of the dev tripwire (a dev score above the dev twin's, one-sided
    /// two-proportion test): below it the evaluation is suspect and its node leaves every ranking.
    #[serde(default = "default_dev_tripwire_alpha")]
    pub dev_tripwire_alpha: f64,
    /// Let agents train on the dev split (off by default: dev is evidence, protected from
    /// training like the test split by rule `dev-contamination`). With it on, every task needs a
    /// `dev_twin`, whose score is then what a dev evaluation records and reviewers rank on.
    #[serde(default)]
    pub train_on_dev: bool,
    /// The sandbox of jobs and command agents (Landlock): `required` refuses to run a job (rule
    /// `sandbox`) or an agent where it cannot be applied, `best-effort` runs them unconfined there
    /// and records so, `off` runs them without one.
    #[serde(default)]
    pub sandbox: SandboxMode,
    /// Absolute paths jobs may also read and execute inside the sandbox (a Python environment,
    /// a CUDA toolkit outside `/usr` and `/opt`, a model cache).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sandbox_read: Vec<PathBuf>,
}

/// `[policy] sandbox`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// Refuse what cannot be sandboxed.
    Required,
    /// Sandbox where the kernel can, run unconfined (and record it) where it cannot.
    #[default]
    BestEffort,
    /// No sandbox.
    Off,
}

impl SandboxMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Required => "required",
            SandboxMode::BestEffort => "best-effort",
            SandboxMode::Off => "off",
        }
    }
}

fn default_max_dataset_rows() -> u64 {
    1_000_000
}
fn default_max_dataset_bytes() -> u64 {
    256 << 20
}
fn default_tripwire_alpha() -> f64 {
    0.001
}
fn default_dev_tripwire_alpha() -> f64 {
    0.0001
}

fn default_ngram() -> u32 {
    8
}
fn default_threshold() -> f64 {
    0.5
}
fn default_probes() -> u64 {
    5
}

fn default_writes_per_minute() -> u64 {
    240
}

fn default_max_parents() -> u32 {
    2
}
fn default_inline_rows() -> u64 {
    100_000
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            max_parents: default_max_parents(),
            max_inline_rows: default_inline_rows(),
            contamination_ngram: default_ngram(),
            contamination_threshold: default_threshold(),
            max_contamination_rejections_per_agent: default_probes(),
            max_writes_per_agent_per_minute: default_writes_per_minute(),
            require_network_isolation: false,
            max_dataset_rows: default_max_dataset_rows(),
            max_dataset_bytes: default_max_dataset_bytes(),
            tripwire_alpha: default_tripwire_alpha(),
            dev_tripwire_alpha: default_dev_tripwire_alpha(),
            train_on_dev: false,
            sandbox: SandboxMode::default(),
            sandbox_read: Vec::new(),
        }
    }
}

/// A dataset file the study owner provides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeclaredSource {
    /// Path relative to the study root (JSON Lines with `prompt` and `answer`).
    pub path: String,
    #[serde(default)]
    pub description: String,
}

impl StudyConfig {
    /// Parse `text` (the contents of `file`) with errors naming the file, key and expectation.
    pub fn parse(text: &str, file: &str) -> Result<StudyConfig> {
        let de = toml::Deserializer::parse(text)
            .map_err(|e| Error::invalid(format!("{file}: {}", describe_toml_error(text, &e))))?;
        let cfg: StudyConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let what = describe_toml_error(text, &inner);
            if key == "." || key.is_empty() {
                Error::invalid(format!("{file}: {what}"))
            } else {
                Error::invalid(format!("{file}: key `{key}`: {what}"))
            }
        })?;
        cfg.check(file)?;
        Ok(cfg)
    }

    /// Load `rsim.toml` from a study root (a regular file of at most `MAX_CONFIG_BYTES`).
    pub fn load(root: &Path) -> Result<StudyConfig> {
        let path = root.join(CONFIG_FILE);
        // A clone's work tree decides what this file is: bounded, a regular file, no links.
        let text = crate::util::file::read_regular_text(&path, MAX_CONFIG_BYTES)
            .map_err(|e| Error::invalid(format!("cannot read the study config: {e}")))?;
        Self::parse(&text, CONFIG_FILE)
    }

    /// Checks serde cannot express: names, ranges, paths confined to the study.
    fn check(&self, file: &str) -> Result<()> {
        self.check_keys()
            .map_err(|(key, msg)| Error::invalid(format!("{file}: key `{key}`: {msg}")))
    }

    /// `check`'s finding as (key path, what is wrong), for callers that place it in the text.
    fn check_keys(&self) -> std::result::Result<(), (String, String)> {
        let bad = |key: &str, msg: String| Err((key.to_string(), msg));
        if self.study.name.trim().is_empty() {
            return bad("study.name", "expected a non-empty name".into());
        }
        if let Err(m) = check_relative_path(&self.base_model.path) {
            return bad("base_model.path", m);
        }
        for (name, task) in &self.tasks {
            if let Err(m) = check_slug(name) {
                return bad(&format!("tasks.{name}"), m);
            }
            for (split, set) in task.splits() {
                if let Err(m) = check_relative_path(&set.path) {
                    return bad(&format!("tasks.{name}.{split}.path"), m);
                }
                if let Some(h) = &set.sha256
                    && !is_sha256(h)
                {
                    return bad(
                        &format!("tasks.{name}.{split}.sha256"),
                        format!("expected 64 lowercase hex digits, got {h:?}"),
                    );
                }
            }
        }
        for (name, src) in &self.datasets {
            if let Err(m) = check_slug(name) {
                return bad(&format!("datasets.{name}"), m);
            }
            if let Err(m) = check_relative_path(&src.path) {
                return bad(&format!("datasets.{name}.path"), m);
            }
        }
        let sv = &self.server;
        for (key, v) in [
            ("server.max_connections", sv.max_connections as u64),
            ("server.max_sessions", sv.max_sessions as u64),
            (
                "server.max_sessions_per_agent",
                sv.max_sessions_per_agent as u64,
            ),
            ("server.session_idle_s", sv.session_idle_s),
            ("server.idle_timeout_s", sv.idle_timeout_s),
            ("server.header_timeout_s", sv.header_timeout_s),
            (
                "server.max_connections_per_address",
                sv.max_connections_per_address as u64,
            ),
            (
                "server.max_connections_per_agent",
                sv.max_connections_per_agent as u64,
            ),
            (
                "server.max_streams_per_agent",
                sv.max_streams_per_agent as u64,
            ),
        ] {
            if v == 0 {
                return bad(key, "expected at least 1".into());
            }
        }
        if sv.owner_reserve >= sv.max_connections {
            return bad(
                "server.owner_reserve",
                format!(
                    "{} would leave agents no connection of server.max_connections = {}; use less",
                    sv.owner_reserve, sv.max_connections
                ),
            );
        }
        if sv.idle_timeout_s <= 15 {
            return bad(
                "server.idle_timeout_s",
                format!(
                    "{} s would close live SSE streams between their 15 s keep-alives; use more than 15",
                    sv.idle_timeout_s
                ),
            );
        }
        if self.jobs.sft.is_empty() {
            return bad(
                "jobs.sft",
                "expected a command: a non-empty list of strings".into(),
            );
        }
        if self.jobs.evaluate.is_empty() {
            return bad(
                "jobs.evaluate",
                "expected a command: a non-empty list of strings".into(),
            );
        }
        if let Some(h) = &self.jobs.evaluator_sha256
            && !is_sha256(h)
        {
            return bad(
                "jobs.evaluator_sha256",
                format!("expected 64 lowercase hex digits, got {h:?}"),
            );
        }
        match &self.backend {
            Backend::Local {
                max_parallel_jobs,
                timeout_s,
                max_file_mb,
                threads_per_job,
                ..
            } => {
                if *max_file_mb == 0 {
                    return bad("backend.max_file_mb", "expected at least 1".into());
                }
                if *max_parallel_jobs == 0 {
                    return bad("backend.max_parallel_jobs", "expected at least 1".into());
                }
                if let Some(t) = threads_per_job
                    && !(1..=MAX_THREADS_PER_JOB).contains(t)
                {
                    return bad(
                        "backend.threads_per_job",
                        format!("expected 1 to {MAX_THREADS_PER_JOB}, got {t}"),
                    );
                }
                if *timeout_s == 0 {
                    return bad("backend.timeout_s", "expected at least 1 second".into());
                }
            }
            Backend::Slurm(s) => {
                for (key, value) in [
                    ("backend.partition", &s.partition),
                    ("backend.account", &s.account),
                    ("backend.qos", &s.qos),
                    ("backend.gpu_type", &s.gpu_type),
                ] {
                    if let Some(v) = value
                        && let Err(m) = check_slurm_name(v)
                    {
                        return bad(key, m);
                    }
                }
                if s.cpus_per_job == 0 {
                    return bad("backend.cpus_per_job", "expected at least 1".into());
                }
                if s.timeout_s == 0 {
                    return bad("backend.timeout_s", "expected at least 1 second".into());
                }
                if s.max_file_mb == 0 {
                    return bad("backend.max_file_mb", "expected at least 1".into());
                }
                if s.mem_mb == Some(0) {
                    return bad("backend.mem_mb", "expected at least 1".into());
                }
                for (i, line) in s.extra_sbatch.iter().enumerate() {
                    if let Err(m) = check_sbatch_option(line) {
                        return bad(&format!("backend.extra_sbatch[{i}]"), m);
                    }
                }
            }
        }
        if let Environment::Nix { flake } = &self.environment
            && flake.trim().is_empty()
        {
            return bad("environment.flake", "expected a flake reference".into());
        }
        if let Environment::Python { lock, python, envs } = &self.environment {
            if let Err(m) = check_relative_path(lock) {
                return bad("environment.lock", m);
            }
            // The lock's path is a field of the recorded label (`python lock=<path>@<sha256> …`),
            // whose fields are separated by spaces.
            if lock.chars().any(char::is_whitespace) {
                return bad(
                    "environment.lock",
                    format!("expected a path without spaces, got {lock:?}"),
                );
            }
            if python.trim().is_empty() {
                return bad("environment.python", "expected an interpreter".into());
            }
            if let Some(d) = envs.as_ref().filter(|d| !d.is_absolute()) {
                return bad(
                    "environment.envs",
                    format!("expected an absolute path, got {}", d.display()),
                );
            }
        }
        if !(1..=128).contains(&self.policy.contamination_ngram) {
            return bad(
                "policy.contamination_ngram",
                format!("expected 1 to 128, got {}", self.policy.contamination_ngram),
            );
        }
        let t = self.policy.contamination_threshold;
        if !(t > 0.0 && t <= 1.0) {
            return bad(
                "policy.contamination_threshold",
                format!("expected a share in (0, 1], got {t}"),
            );
        }
        if self.policy.max_parents == 0 {
            return bad("policy.max_parents", "expected at least 1".into());
        }
        let a = self.policy.tripwire_alpha;
        if !(a > 0.0 && a < 0.5) {
            return bad(
                "policy.tripwire_alpha",
                format!("expected a significance level in (0, 0.5), got {a}"),
            );
        }
        let a = self.policy.dev_tripwire_alpha;
        if !(a > 0.0 && a < 0.5) {
            return bad(
                "policy.dev_tripwire_alpha",
                format!("expected a significance level in (0, 0.5), got {a}"),
            );
        }
        if self.policy.train_on_dev
            && let Some((name, _)) = self.tasks.iter().find(|(_, t)| t.dev_twin.is_none())
        {
            return bad(
                "policy.train_on_dev",
                format!(
                    "agents may train on dev only where reviewers rank on a split no agent can \
                     train on: task {name} has no dev_twin"
                ),
            );
        }
        if let Some(p) = self.policy.sandbox_read.iter().find(|p| !p.is_absolute()) {
            return bad(
                "policy.sandbox_read",
                format!("expected absolute paths, got {:?}", p.display().to_string()),
            );
        }
        if self.policy.max_dataset_rows == 0 || self.policy.max_dataset_bytes == 0 {
            return bad(
                "policy.max_dataset_rows",
                "expected positive dataset bounds (max_dataset_rows, max_dataset_bytes)".into(),
            );
        }
        Ok(())
    }
}

/// What is wrong with an `rsim.toml` text, placed in it: the first problem the parser, the typed
/// deserialisation or the semantic checks find — the same ones, in the same order, as `parse`.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigProblem {
    /// Byte range in the text (empty at the start of the file when nothing narrower is known).
    pub span: std::ops::Range<usize>,
    /// The key path (`tasks.arith.dev.path`), when the problem is one key's.
    pub key: Option<String>,
    /// What `parse` says, without the file name.
    pub message: String,
}

/// The problem `StudyConfig::parse` would report for `text`, with its place; `None` when it parses.
pub fn diagnose(text: &str) -> Option<ConfigProblem> {
    let de = match toml::Deserializer::parse(text) {
        Ok(de) => de,
        Err(e) => {
            return Some(ConfigProblem {
                span: e.span().unwrap_or(0..0),
                key: None,
                message: describe_toml_error(text, &e),
            });
        }
    };
    let cfg: StudyConfig = match serde_path_to_error::deserialize(de) {
        Ok(cfg) => cfg,
        Err(e) => {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let key = (key != "." && !key.is_empty()).then_some(key);
            let span = inner
                .span()
                .or_else(|| key.as_deref().and_then(|k| key_span(text, k)))
                .unwrap_or(0..0);
            let what = describe_toml_error(text, &inner);
            let message = match &key {
                Some(k) => format!("key `{k}`: {what}"),
                None => what,
            };
            return Some(ConfigProblem { span, key, message });
        }
    };
    let (key, msg) = cfg.check_keys().err()?;
    Some(ConfigProblem {
        span: key_span(text, &key).unwrap_or(0..0),
        message: format!("key `{key}`: {msg}"),
        key: Some(key),
    })
}

/// The byte range of the value at a key path (`a.b.c`, `a.list[2]`) in a TOML text: the deepest
/// part of the path that exists (a table whose entry is missing: the table's key).
pub fn key_span(text: &str, path: &str) -> Option<std::ops::Range<usize>> {
    use toml::de::{DeTable, DeValue};
    let root = DeTable::parse(text).ok()?;
    let mut parts: Vec<(String, Option<usize>)> = Vec::new();
    for seg in path.split('.') {
        match seg.split_once('[') {
            Some((name, rest)) => {
                let i = rest.trim_end_matches(']').parse().ok();
                parts.push((name.to_string(), i));
            }
            None => parts.push((seg.to_string(), None)),
        }
    }
    let mut table = root.get_ref();
    let mut best: Option<std::ops::Range<usize>> = None;
    for (name, index) in parts {
        let Some((k, v)) = table.iter().find(|(k, _)| k.get_ref().as_ref() == name) else {
            return best;
        };
        best = Some(match v.get_ref() {
            DeValue::Table(_) => k.span(),
            _ => v.span(),
        });
        let mut value = v.get_ref();
        if let (Some(i), DeValue::Array(items)) = (index, value) {
            let Some(item) = items.get(i) else {
                return best;
            };
            best = Some(item.span());
            value = item.get_ref();
        }
        match value {
            DeValue::Table(t) => table = t,
            _ => return best,
        }
    }
    best
}

fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().trim_end().to_string();
    match e.span() {
        Some(span) => {
            let (line, col) = line_col(text, span.start);
            format!("{msg} (line {line}, column {col})")
        }
        None => msg,
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// A name usable as a key, file name and identifier: `[a-z0-9][a-z0-9_-]{0,63}`.
pub fn check_slug(name: &str) -> std::result::Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "expected a name of lowercase letters, digits, '-' or '_' (at most 64, starting with a letter or digit), got {name:?}"
        ))
    }
}

/// A path that stays inside the study: relative, no `..`, no empty components.
pub fn check_relative_path(p: &str) -> std::result::Result<(), String> {
    if p.is_empty() {
        return Err("expected a path relative to the study root, got an empty string".into());
    }
    if p.chars().any(char::is_control) {
        return Err(format!("path {p:?} contains control characters"));
    }
    for c in Path::new(p).components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => {
                return Err(format!("path {p:?} leaves the study ('..' is not allowed)"));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "path {p:?} is absolute; expected a path relative to the study root"
                ));
            }
        }
    }
    Ok(())
}

/// A Slurm name (partition, account, QoS, GPU type): no spaces, control characters or leading `-`.
fn check_slurm_name(v: &str) -> std::result::Result<(), String> {
    if v.is_empty() || v.starts_with('-') || v.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        Err(format!(
            "expected a Slurm name without spaces or control characters, not starting with '-', got {v:?}"
        ))
    } else {
        Ok(())
    }
}

/// One extra sbatch option for an `#SBATCH` line: starts with `-`, one line, not an option rsim sets.
fn check_sbatch_option(line: &str) -> std::result::Result<(), String> {
    let line = line.trim();
    if !line.starts_with('-') || line.chars().any(char::is_control) {
        return Err(format!(
            "expected one sbatch option on one line, e.g. \"--constraint=a100\", got {line:?}"
        ));
    }
    let name = line
        .split(|c: char| c == '=' || c.is_whitespace())
        .next()
        .unwrap_or(line);
    let short = |o: &str| o.len() == 2 && !o.starts_with("--") && line.starts_with(o);
    if let Some(o) = RESERVED_SBATCH.iter().find(|o| **o == name || short(o)) {
        return Err(format!(
            "{o} is set by rsim for every job and cannot be overridden (got {line:?})"
        ));
    }
    Ok(())
}

/// Resource limits of a job.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct JobLimits {
    pub max_parallel: u32,
    pub max_file_bytes: u64,
    pub max_memory_bytes: Option<u64>,
    /// Compute threads the job is given (`jobs::THREAD_VARS`); None: left to the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
}

impl Default for JobLimits {
    fn default() -> Self {
        JobLimits {
            max_parallel: 2,
            max_file_bytes: 4 << 30,
            max_memory_bytes: None,
            threads: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[study]
name = "t"
[base_model]
name = "base"
path = "models/base"
[tasks.add]
dev = { path = "eval/dev.jsonl" }
test = { path = "eval/test.jsonl" }
[jobs]
sft = ["true"]
evaluate = ["true"]
"#;

    /// The text `diagnose` places its problem on.
    fn placed(text: &str) -> (String, String) {
        let p = diagnose(text).expect("a problem");
        (text[p.span.clone()].to_string(), p.message)
    }

    #[test]
    fn diagnose_places_each_kind_of_problem_on_its_key_or_value_with_parses_message() {
        assert_eq!(diagnose(GOOD), None);
        // Unknown key: the key itself.
        let (at, msg) = placed(&GOOD.replace("name = \"base\"", "name = \"base\"\nflavour = 1"));
        assert_eq!(at, "flavour");
        assert!(msg.contains("unknown field `flavour`"), "{msg}");
        // Wrong type: the value.
        let (at, msg) = placed(&GOOD.replace("name = \"t\"", "name = 7"));
        assert_eq!(at, "7");
        assert!(
            msg.contains("study.name") && msg.contains("string"),
            "{msg}"
        );
        // The hidden splits are confined like the others: a crafted config cannot point the
        // dev twin (or the sealed split) at a file outside the study.
        for key in ["dev_twin", "sealed"] {
            let text = GOOD.replace(
                "test = { path = \"eval/test.jsonl\" }",
                &format!("test = {{ path = \"eval/test.jsonl\" }}\n{key} = {{ path = \"../../etc/passwd\" }}"),
            );
            let (at, msg) = placed(&text);
            assert_eq!(at, "\"../../etc/passwd\"");
            assert!(
                msg.starts_with(&format!("key `tasks.add.{key}.path`")),
                "{msg}"
            );
        }
        // With train_on_dev, every task needs a twin to rank on.
        let text = format!("{GOOD}[policy]\ntrain_on_dev = true\n");
        let (_, msg) = placed(&text);
        assert!(
            msg.contains("policy.train_on_dev") && msg.contains("dev_twin"),
            "{msg}"
        );
        // A path outside the study (a semantic check): the value.
        let text = GOOD.replace("path = \"eval/dev.jsonl\"", "path = \"../../etc/passwd\"");
        let (at, msg) = placed(&text);
        assert_eq!(at, "\"../../etc/passwd\"");
        assert!(msg.starts_with("key `tasks.add.dev.path`"), "{msg}");
        let whole = StudyConfig::parse(&text, "rsim.toml")
            .expect_err("invalid")
            .to_string();
        assert!(whole.contains(&msg), "{whole} vs {msg}");
        // A bad hash.
        let (at, msg) = placed(&GOOD.replace(
            "{ path = \"eval/test.jsonl\" }",
            "{ path = \"eval/test.jsonl\", sha256 = \"abc\" }",
        ));
        assert_eq!(at, "\"abc\"");
        assert!(msg.contains("64 lowercase hex"), "{msg}");
        // A syntax error: where the parser stopped.
        let p = diagnose("[study\nname = 1").expect("problem");
        assert!(p.span.start <= 7, "{p:?}");
        // An element of a list.
        assert_eq!(
            key_span(
                "[backend]\nextra_sbatch = [\"a\", \"b\"]\n",
                "backend.extra_sbatch[1]"
            )
            .map(|r| r.start),
            Some(31)
        );
    }

    #[test]
    fn parses_minimal_config_with_defaults() {
        let c = StudyConfig::parse(GOOD, "rsim.toml").expect("valid");
        assert_eq!(c.budgets.test_evaluations_per_node, 2);
        assert_eq!(c.tasks["add"].metric, "exact_match");
        assert_eq!(c.environment, Environment::Host);
    }

    #[test]
    fn a_python_environment_names_a_lock_in_the_study() {
        let with =
            |env: &str| StudyConfig::parse(&format!("{GOOD}[environment]\n{env}\n"), "rsim.toml");
        let c = with("kind = \"python\"\nlock = \"env/requirements.lock\"").expect("valid");
        let cfg = c.environment.python().expect("python");
        assert_eq!(
            (cfg.lock, cfg.python, cfg.envs),
            ("env/requirements.lock", "python3", None)
        );
        for (bad, key) in [
            ("kind = \"python\"", "lock"),
            (
                "kind = \"python\"\nlock = \"../x.lock\"",
                "environment.lock",
            ),
            (
                "kind = \"python\"\nlock = \"/etc/x.lock\"",
                "environment.lock",
            ),
            (
                "kind = \"python\"\nlock = \"x\"\npython = \" \"",
                "environment.python",
            ),
            (
                "kind = \"python\"\nlock = \"x\"\nenvs = \"rel\"",
                "environment.envs",
            ),
            ("kind = \"python\"\nlock = \"x\"\nflake = \"env\"", "flake"),
            (
                "kind = \"python\"\nlock = \"env/my lock.txt\"",
                "without spaces",
            ),
        ] {
            let e = with(bad).expect_err(bad);
            assert!(e.message.contains(key), "{bad}: {}", e.message);
        }
        assert!(
            StudyConfig::parse(GOOD, "rsim.toml")
                .expect("valid")
                .environment
                .python()
                .is_none()
        );
    }

    #[test]
    fn the_sandbox_is_best_effort_by_default_and_its_extra_paths_are_absolute() {
        let c = StudyConfig::parse(GOOD, "rsim.toml").expect("valid");
        assert_eq!(c.policy.sandbox, SandboxMode::BestEffort);
        let with =
            |policy: &str| StudyConfig::parse(&format!("{GOOD}[policy]\n{policy}\n"), "rsim.toml");
        let c = with("sandbox = \"required\"\nsandbox_read = [\"/opt/venv\"]").expect("valid");
        assert_eq!(c.policy.sandbox, SandboxMode::Required);
        assert_eq!(c.policy.sandbox_read, [PathBuf::from("/opt/venv")]);
        assert_eq!(
            with("sandbox = \"off\"").expect("valid").policy.sandbox,
            SandboxMode::Off
        );
        let e = with("sandbox = \"maybe\"").expect_err("unknown mode");
        assert!(e.message.contains("sandbox"), "{}", e.message);
        let e = with("sandbox_read = [\"venv\"]").expect_err("relative");
        assert!(e.message.contains("policy.sandbox_read"), "{}", e.message);
    }

    #[test]
    fn the_connection_limits_have_defaults_and_the_owner_reserve_leaves_agents_room() {
        let c = StudyConfig::parse(GOOD, "rsim.toml").expect("valid");
        assert_eq!(
            (
                c.server.max_connections_per_address,
                c.server.max_connections_per_agent,
                c.server.max_streams_per_agent,
                c.server.owner_reserve
            ),
            (32, 32, 8, 8)
        );
        let with =
            |server: &str| StudyConfig::parse(&format!("{GOOD}[server]\n{server}\n"), "rsim.toml");
        assert_eq!(
            with("owner_reserve = 0")
                .expect("no reserve")
                .server
                .owner_reserve,
            0
        );
        let e = with("max_connections = 8\nowner_reserve = 8").expect_err("no room for agents");
        assert!(e.message.contains("server.owner_reserve"), "{}", e.message);
        for key in [
            "max_connections_per_address",
            "max_connections_per_agent",
            "max_streams_per_agent",
        ] {
            let e = with(&format!("{key} = 0")).expect_err("zero");
            assert!(
                e.message.contains(&format!("server.{key}")),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn wrong_type_names_file_key_and_expectation() {
        let text = GOOD.replace("[jobs]", "[budgets]\ncompute_seconds = \"lots\"\n[jobs]");
        let e = StudyConfig::parse(&text, "rsim.toml").unwrap_err();
        assert!(e.message.contains("rsim.toml"), "{}", e.message);
        assert!(
            e.message.contains("budgets.compute_seconds"),
            "{}",
            e.message
        );
        assert!(e.message.contains("line 11, column 19"), "{}", e.message);
    }

    #[test]
    fn unknown_key_is_rejected() {
        let text = GOOD.replace("name = \"t\"", "name = \"t\"\ncolour = \"red\"");
        let e = StudyConfig::parse(&text, "rsim.toml").unwrap_err();
        assert!(e.message.contains("colour"), "{}", e.message);
    }

    #[test]
    fn escaping_paths_are_rejected() {
        let text = GOOD.replace("eval/test.jsonl", "../secret/test.jsonl");
        let e = StudyConfig::parse(&text, "rsim.toml").unwrap_err();
        assert!(e.message.contains("tasks.add.test.path"), "{}", e.message);
        let text = GOOD.replace("models/base", "/etc/passwd");
        let e = StudyConfig::parse(&text, "rsim.toml").unwrap_err();
        assert!(e.message.contains("absolute"), "{}", e.message);
    }

    #[test]
    fn slurm_backend_parses_and_bad_settings_name_the_key() {
        let with = |b: &str| GOOD.replace("[jobs]", &format!("[backend]\n{b}\n[jobs]"));
        let c = StudyConfig::parse(
            &with("kind = \"slurm\"\npartition = \"gpu\"\ngpus_per_job = 2\ngpu_request = \"gres\"\nextra_sbatch = [\"--constraint=a100\"]"),
            "rsim.toml",
        )
        .expect("valid");
        let Backend::Slurm(s) = &c.backend else {
            panic!("not slurm: {:?}", c.backend)
        };
        assert_eq!(
            (s.partition.as_deref(), s.gpus_per_job, s.gpu_request),
            (Some("gpu"), 2, GpuRequest::Gres)
        );
        assert_eq!((c.backend.charge_units(), c.backend.timeout_s()), (2, 3600));
        for (b, key) in [
            ("kind = \"slurm\"\npartition = \"a b\"", "backend.partition"),
            ("kind = \"slurm\"\ncpus_per_job = 0", "backend.cpus_per_job"),
            (
                "kind = \"slurm\"\nextra_sbatch = [\"--output=/tmp/x\"]",
                "backend.extra_sbatch[0]",
            ),
            (
                "kind = \"slurm\"\nextra_sbatch = [\"--constraint=a\\n#SBATCH --wrap=x\"]",
                "backend.extra_sbatch[0]",
            ),
            (
                "kind = \"slurm\"\nextra_sbatch = [\"-D /tmp\"]",
                "backend.extra_sbatch[0]",
            ),
            ("kind = \"slurm\"\nnodes = 4", "nodes"),
        ] {
            let e = StudyConfig::parse(&with(b), "rsim.toml").unwrap_err();
            assert!(e.message.contains(key), "{b}: {}", e.message);
        }
        assert!(check_sbatch_option("--exclusive").is_ok());
        assert!(check_sbatch_option("--error=x").is_err());
    }

    #[test]
    fn record_fsync_defaults_off_parses_and_bad_values_name_the_key() {
        let c = StudyConfig::parse(GOOD, "rsim.toml").expect("valid");
        assert!(!c.record.fsync);
        let with = |r: &str| GOOD.replace("[jobs]", &format!("[record]\n{r}\n[jobs]"));
        let c = StudyConfig::parse(&with("fsync = true"), "rsim.toml").expect("valid");
        assert!(c.record.fsync);
        for (r, key) in [
            ("fsync = \"no\"", "record.fsync"),
            ("fsync = 0", "record.fsync"),
            ("fsnyc = true", "fsnyc"),
        ] {
            let e = StudyConfig::parse(&with(r), "rsim.toml").unwrap_err();
            assert!(e.message.contains(key), "{r}: {}", e.message);
        }
    }

    #[test]
    fn threads_per_job_is_bounded_and_a_bad_value_names_the_key() {
        let with = |t: &str| {
            GOOD.replace(
                "[jobs]",
                &format!("[backend]\nkind = \"local\"\nthreads_per_job = {t}\n[jobs]"),
            )
        };
        let c = StudyConfig::parse(&with("1"), "rsim.toml").expect("valid");
        assert_eq!(c.backend.limits().threads, Some(1));
        for t in ["0", "1025", "4000000000"] {
            let e = StudyConfig::parse(&with(t), "rsim.toml").unwrap_err();
            assert!(
                e.message.contains("backend.threads_per_job"),
                "{t}: {}",
                e.message
            );
        }
    }

    #[test]
    fn syntax_error_has_line() {
        let e = StudyConfig::parse("[study\nname=1", "rsim.toml").unwrap_err();
        assert!(e.message.starts_with("rsim.toml: "), "{}", e.message);
        assert!(e.message.contains("line 1"), "{}", e.message);
    }
}
