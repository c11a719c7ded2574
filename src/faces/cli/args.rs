//! The command line's grammar: every subcommand and flag (clap derive); the names it gives core
//! types are in `names`. Nothing here runs anything.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::api::types::AnswerFormat;

#[derive(Parser, Debug)]
#[command(
    name = "rsim",
    version,
    about = "RSI-Master: agents post-train a base model through recorded, policy-checked actions"
)]
pub struct Cli {
    /// The study directory (default: $RSIM_STUDY, else the current directory).
    #[arg(long, short = 'C', global = true, value_name = "DIR")]
    pub study: Option<PathBuf>,
    /// Agent identity recorded in commits (default: owner; for `mcp`, mcp-<pid>).
    #[arg(long, global = true)]
    pub agent: Option<String>,
    /// Role of the agent: owner, worker, reviewer or observer (default: owner; for `mcp` and `serve`, worker).
    #[arg(long, global = true)]
    pub role: Option<String>,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a study (a git repository with rsim.toml and the root node n0 = the base model).
    Init {
        /// Directory of the new study (default: current directory).
        dir: Option<PathBuf>,
        /// Start from a shipped example.
        #[arg(long)]
        example: Option<String>,
        /// The study's generator secret (32 hex digits), instead of a fresh random one: studies
        /// given one secret draw the same rows for the same data request, so campaigns run on
        /// them (two reviewers, two strategies) are paired on the same data.
        #[arg(long, value_name = "HEX")]
        generator_secret: Option<String>,
    },
    /// Open a new node under one parent (or two, to combine findings).
    Branch {
        /// Parent node (repeat for a merge node).
        #[arg(long = "from", required = true)]
        parents: Vec<String>,
        #[arg(long)]
        title: String,
        #[arg(long, default_value = "")]
        hypothesis: String,
    },
    /// Fine-tune a checkpoint on registered datasets (runs a job).
    RunSft {
        #[arg(long)]
        node: String,
        /// "base" or a checkpoint sha256.
        #[arg(long, default_value = "base")]
        base: String,
        /// Registered dataset name (repeatable).
        #[arg(long = "dataset", required = true)]
        datasets: Vec<String>,
        #[arg(long = "lr", default_value_t = 1e-3)]
        learning_rate: f64,
        #[arg(long, default_value_t = 100)]
        steps: u64,
        #[arg(long, default_value_t = 32)]
        batch_size: u32,
        #[arg(long, default_value_t = 0)]
        warmup_steps: u64,
        #[arg(long, default_value = "cosine")]
        schedule: String,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Keep a checkpoint every N steps and score each, and the final one, on the dev split of
        /// --eval-task (each an evaluate action of its own).
        #[arg(long, default_value_t = 0)]
        eval_every: u64,
        /// The task whose dev split --eval-every scores.
        #[arg(long)]
        eval_task: Option<String>,
    },
    /// Evaluate a checkpoint on a task split (runs the pinned evaluator as a job).
    Evaluate {
        #[arg(long)]
        node: String,
        #[arg(long, default_value = "base")]
        checkpoint: String,
        #[arg(long)]
        task: String,
        #[arg(long, default_value = "dev")]
        split: String,
    },
    /// Compare a metric across nodes (mean ± 95% interval), recorded on --node.
    Compare {
        #[arg(long)]
        node: String,
        /// Nodes to compare.
        #[arg(required = true, num_args = 2..)]
        nodes: Vec<String>,
        #[arg(long)]
        task: String,
        #[arg(long, default_value = "dev")]
        split: String,
        #[arg(long, default_value = "exact_match")]
        metric: String,
    },
    /// Show the research DAG.
    Dag {
        #[arg(long, value_enum, default_value_t = DagFormat::Text)]
        format: DagFormat,
        /// full, frontier, children, ancestors, related, best, lineage, summary.
        #[arg(long, default_value = "full")]
        view: String,
        #[arg(long)]
        node: Option<String>,
        #[arg(long)]
        task: Option<String>,
        #[arg(long)]
        metric: Option<String>,
        #[arg(long)]
        checkpoint: Option<String>,
        /// Bound of the JSON answer in tokens (bytes / 4; default 8000); `--format text` of the
        /// full view prints the whole DAG regardless.
        #[arg(long)]
        max_tokens: Option<u64>,
        /// The next_cursor of the previous page.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Recorded actions, newest first (rejections included).
    Log {
        #[arg(long)]
        node: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u64,
        /// Bound of the answer in tokens (bytes / 4; default 8000).
        #[arg(long)]
        max_tokens: Option<u64>,
        /// The next_cursor of the previous page.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// One node in full.
    Show { node: String },
    /// What differs between two nodes: parameters, datasets, environment, and each metric's
    /// difference B − A with its 95% interval (paired over matching seeds, else Welch).
    Diff { a: String, b: String },
    /// Re-run a node's recorded run_sft and dev evaluate jobs (or one, --action SEQ) from what the
    /// record holds and record whether each gives the identical checkpoint or scores (owner and
    /// reviewer; test evaluations are not re-run).
    Reproduce {
        node: String,
        /// The action's seq on the node (default: every run_sft and dev evaluate of the node).
        #[arg(long = "action")]
        seq: Option<u32>,
        /// Run even where the environment differs from the recorded one.
        #[arg(long)]
        allow_env_change: bool,
    },
    /// Rebuild the SQLite index from git alone.
    Reindex,
    /// Verify the record (commits, action files, artifacts, index).
    Fsck,
    /// What the study holds on disk — objects, job directories, record — per study and per agent,
    /// against budgets.storage_bytes and budgets.agent_storage_bytes.
    Storage,
    /// Remove what nothing in the record references: unreferenced store objects older than the
    /// grace period, and outputs recorded jobs still hold in their directories.
    Gc {
        /// Say what would be removed, remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Spare unreferenced objects younger than this many seconds.
        #[arg(long, default_value_t = 3600)]
        grace: u64,
    },
    /// Attempts, rejections by rule, and whether any hack got through (re-checked from the record).
    Audit,
    /// Stop a running or queued job (its action is recorded with the job cancelled).
    Cancel { job: String },
    /// Prove every commit with the study's public key committed on main (works in any clone);
    /// names the first commit that does not verify.
    Verify {
        /// The fingerprint the study's owner published (SHA256:…): the genesis must be signed by it.
        #[arg(long, value_name = "FINGERPRINT")]
        key: Option<String>,
    },
    /// The study's signing key: show it, publish its public half on main, or rotate it.
    Key {
        #[command(subcommand)]
        cmd: KeyCommand,
    },
    /// Clone a shared study with every node branch; it opens read-only (no private key).
    Clone {
        /// Anything `git clone` takes: a path, an ssh or https URL.
        url: String,
        /// Where to put it (default: the repository's name).
        dir: Option<PathBuf>,
    },
    /// Record jobs whose rsim process died (the first write after opening a study does this too);
    /// with --wait, also wait for their Slurm jobs still queued or running and record how they end.
    Recover {
        #[arg(long)]
        wait: bool,
    },
    /// Run any action from its JSON request (as an MCP client sends it); prints the JSON result.
    Call {
        action: String,
        /// JSON arguments, or "-" to read them from stdin (default: {}).
        args: Option<String>,
    },
    /// Write the JSON Schemas of every action and of rsim.toml (or check they are current).
    Schemas {
        #[arg(long, default_value = "schemas")]
        out: PathBuf,
        /// Fail if the files differ instead of writing them.
        #[arg(long)]
        check: bool,
    },
    /// Benchmarks of the record (action cost, dag query and reindex at scale).
    Bench {
        /// Nodes in the large-DAG benchmark.
        #[arg(long, default_value_t = 100_000)]
        nodes: usize,
        /// Actions timed in the action-cost benchmark.
        #[arg(long, default_value_t = 300)]
        actions: usize,
        /// Repetitions of the dag/reindex measurements.
        #[arg(long, default_value_t = 5)]
        repeat: usize,
        /// Where to build the benchmark studies (default: a temporary directory, removed after).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Reuse the large study already built in --dir instead of building it again.
        #[arg(long, requires = "dir")]
        reuse: bool,
        /// Instead, benchmark jobs: run the same tiny-arith run_sft N times on the local and on
        /// the Slurm backend (submit-to-start latency, overhead of Slurm over local).
        #[arg(long, value_name = "N")]
        slurm: Option<usize>,
        /// Slurm partition for --slurm (default: the cluster's default partition).
        #[arg(long, requires = "slurm")]
        partition: Option<String>,
        /// Instead, benchmark the size and time of views (dag text and DOT, report text and
        /// HTML) on a chain N nodes deep and a DAG N nodes wide, built through branch actions.
        #[arg(long, value_name = "N", conflicts_with = "slurm")]
        views: Option<usize>,
        /// Instead, benchmark one node given N distinct actions: its `.git` bytes per action
        /// and the write time at the start and the end.
        #[arg(long, value_name = "N", conflicts_with_all = ["slurm", "views"])]
        node_actions: Option<usize>,
        /// Instead, benchmark the queries that list actions (`log`, `get_node`) on one node
        /// given N register_dataset actions of about 15 MB of inline rows each: time and peak
        /// memory of each.
        #[arg(long, value_name = "N", conflicts_with_all = ["slurm", "views", "node_actions"])]
        big_requests: Option<usize>,
        /// Instead, serve the web page over a made-up DAG of N nodes (at --http) until
        /// interrupted, for tools/web-bench.sh to time its first paint in Chromium.
        #[arg(long, value_name = "N", conflicts_with_all = ["slurm", "views", "node_actions", "big_requests"])]
        web: Option<usize>,
        /// Address for --web.
        #[arg(
            long,
            value_name = "ADDR",
            default_value = "127.0.0.1:0",
            requires = "web"
        )]
        http: String,
    },
    /// The cost of one CLI call: times separate rsim processes (this binary) for a query
    /// (`show n0 --json`) and a write (`branch`) on a fresh tiny-arith-ngram study; median and
    /// p90 wall ms per process, with `[record] fsync` on and off.
    BenchCli {
        /// Timed processes per command.
        #[arg(long, default_value_t = 50)]
        runs: usize,
        /// Untimed processes per command first.
        #[arg(long, default_value_t = 5)]
        warmup: usize,
        /// Which `[record] fsync` settings to measure.
        #[arg(long, value_enum, default_value = "both")]
        fsync: crate::bench::cli_cost::FsyncChoice,
        /// Where to create the studies (default: a temporary directory, removed after).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Run a research campaign: Workers explore directions, Reviewers compare evidence and grow the
    /// DAG, a lock-in guard keeps exploration honest. Resumes a campaign already under way.
    Run {
        /// A study, or an example folder such as examples/tiny-arith (a study is created from it
        /// in --into, default ./<example>-study, and resumed there on the next run).
        path: Option<PathBuf>,
        /// Where to create the study when PATH is an example folder.
        #[arg(long)]
        into: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "orchestra")]
        strategy: crate::campaign::Strategy,
        /// Compute budget: training runs (experiments) the campaign may start.
        #[arg(long, default_value_t = 20)]
        experiments: u64,
        /// Training steps per experiment (equal compute per experiment).
        #[arg(long, default_value_t = 150)]
        steps: u64,
        #[arg(long, default_value_t = 32)]
        batch_size: u32,
        /// Runs (seeds) per node (default: 1; the reviewer asks for replicates where one result is
        /// uncertain).
        #[arg(long)]
        seeds_per_node: Option<u32>,
        /// Worker slots (default: 2; the greedy baseline is one agent).
        #[arg(long)]
        workers: Option<usize>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The task to improve (default: the study's first task).
        #[arg(long)]
        task: Option<String>,
        /// Worker agents: `builtin` or `llm:MODEL@URL` (an OpenAI-compatible endpoint; the key is
        /// read from $OPENAI_API_KEY, or the variable named by $RSIM_LLM_KEY_ENV), or
        /// `cmd:COMMAND` (an external agent such as Claude Code or Codex, run per task with
        /// RSIM_PROMPT, RSIM_MCP_URL, RSIM_MCP_TOKEN and RSIM_MCP_CONFIG in its environment).
        #[arg(long, default_value = "builtin")]
        worker: String,
        /// Reviewer agents: `builtin`, `llm:MODEL@URL` or `cmd:COMMAND`.
        #[arg(long, default_value = "builtin")]
        reviewer: String,
        /// Lock-in guard: largest share of experiments under one top-level direction.
        #[arg(long, default_value_t = 0.6)]
        max_share: f64,
        /// Lock-in guard: longest chain of refinements without a sibling.
        #[arg(long, default_value_t = 3)]
        max_depth: u32,
        /// Wall-clock limit of one agent turn (a worker's node, a review), seconds.
        #[arg(long, default_value_t = 1800)]
        agent_timeout: u64,
        /// The recipe `--strategy line` trains, as a node's hypothesis writes it
        /// ('recipe: format=reversed lr=0.003 schedule=cosine rows=20000 curriculum=no init=base').
        #[arg(long)]
        recipe: Option<String>,
        /// Review and branch only while no worker turn is in flight, so the campaign's course
        /// rests on its seed, its study's secret and what each run produced, not on which of two
        /// runs finished first (worker slots still run side by side between reviews).
        #[arg(long)]
        lockstep: bool,
        /// Also write the HTML report here.
        #[arg(long)]
        html: Option<PathBuf>,
        /// No progress display.
        #[arg(long, short)]
        quiet: bool,
    },
    /// What a campaign found: best node vs the base model, the DAG, lock-in, budget, audit.
    Report {
        /// Write a self-contained HTML page here.
        #[arg(long)]
        html: Option<PathBuf>,
        #[arg(long)]
        task: Option<String>,
    },
    /// The efficiency benchmark: orchestration vs a greedy agent vs random search at equal
    /// compute, several seeds each, on fresh studies of an example.
    BenchStrategies {
        #[arg(long, default_value = "tiny-arith")]
        example: String,
        #[arg(long, default_value_t = 5)]
        seeds: u64,
        #[arg(long, default_value_t = 20)]
        experiments: u64,
        #[arg(long, default_value_t = 150)]
        steps: u64,
        /// Strategies to run (default: all four).
        #[arg(long, value_enum)]
        strategy: Vec<crate::campaign::Strategy>,
        /// Also run, per seed, the oracle: the recipe of the best node (on dev) any strategy's
        /// campaign of that seed found, trained as one line with the same budget
        /// (`--strategy line`); every strategy's test score is then also given as a share of it.
        #[arg(long)]
        oracle: bool,
        /// Run every campaign with `rsim run --lockstep`: reviews wait until no worker turn is in
        /// flight, so a campaign's course rests on its seed and data alone.
        #[arg(long)]
        lockstep: bool,
        /// Keep the studies here (default: a temporary directory, removed after).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Training benchmark on tiny-arith: per answer format, the smallest training budget (one
    /// run_sft from the base model) that reaches the target test accuracy, through real actions.
    BenchTrain {
        /// Answer formats to train (default: plain, reversed, scratchpad).
        #[arg(long, value_enum)]
        format: Vec<AnswerFormat>,
        #[arg(long, default_value_t = 3)]
        seeds: u64,
        /// Training budgets in steps, tried in increasing order until one reaches the target.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "500,1000,1500,2000,3000,4000"
        )]
        budgets: Vec<u64>,
        /// Exact match to reach.
        #[arg(long, default_value_t = 0.9)]
        target: f64,
        #[arg(long, default_value_t = 0.003)]
        learning_rate: f64,
        #[arg(long, default_value_t = 32)]
        batch_size: u32,
        /// Training rows generated per format.
        #[arg(long, default_value_t = 20000)]
        rows: u64,
        /// Keep the studies here (default: a temporary directory, removed after).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// The embedded trainer's time per training step beside PyTorch's on the same model, weights
    /// and batches (tiny-gpt, three-digit addition), interleaved runs, one process per measurement.
    BenchStep {
        /// Steps per measurement, the warm-up included.
        #[arg(long, default_value_t = 600)]
        steps: u64,
        /// Steps before the clock starts (a multiple of 50).
        #[arg(long, default_value_t = 50)]
        warmup: u64,
        #[arg(long, default_value_t = 3)]
        runs: u32,
        /// Compute threads of each measurement.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        threads: Vec<usize>,
        #[arg(long, default_value_t = 32)]
        batch_size: usize,
        #[arg(long, default_value_t = 0.003)]
        learning_rate: f64,
        #[arg(long, default_value_t = 20000)]
        rows: u64,
        /// A Python interpreter with PyTorch (e.g. the hf-tiny environment's); without it only
        /// the embedded trainer is timed.
        #[arg(long)]
        python: Option<PathBuf>,
        /// Keep the spec, rows and weights here (default: a temporary directory, removed after).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Serve the study to one MCP client over stdio (what Claude Code, Codex and other clients spawn).
    Mcp {
        /// Seconds run_sft/evaluate wait for their job before answering {job, status: "running"}.
        #[arg(long, default_value_t = 5.0)]
        job_wait: f64,
    },
    /// Serve an editor over stdio as a language server (what the VS Code extension spawns):
    /// rsim.toml diagnostics, node hovers, the research DAG and owner commands as the editor's
    /// user (--agent/--role, default owner). The study: -C or $RSIM_STUDY, else the editor's
    /// workspace folder (or its nearest ancestor holding .rsim/).
    Lsp {
        /// Accepted for editors that pass it: stdio is the only transport.
        #[arg(long)]
        stdio: bool,
    },
    /// Serve the study to many MCP clients over streamable HTTP at /mcp.
    Serve {
        /// Address to listen on, e.g. 127.0.0.1:8765 (port 0 picks a free one; the address is printed on stderr).
        #[arg(long, value_name = "ADDR")]
        http: String,
        /// TOML file of [[agent]] name, role, token: required for non-loopback addresses.
        #[arg(long, value_name = "FILE")]
        tokens: Option<PathBuf>,
        /// Seconds run_sft/evaluate wait for their job before answering {job, status: "running"}.
        #[arg(long, default_value_t = 5.0)]
        job_wait: f64,
        /// Loopback without --tokens: agent names a connection may claim with the X-Rsim-Agent
        /// header (comma-separated). Without it every connection is --agent (default "http").
        #[arg(long, value_delimiter = ',', value_name = "NAMES")]
        agents: Vec<String>,
    },
    /// Print the MCP client configuration that connects a coding agent to this study.
    /// With the global --agent, the commits of that connection carry that name; --role picks
    /// its role (worker by default).
    McpConfig {
        #[arg(long, value_enum)]
        client: McpClient,
        /// The server's name in the client's configuration (tools appear as mcp__NAME__…): give a
        /// worker and a reviewer on one study different names.
        #[arg(long, default_value = "rsim")]
        name: String,
    },
    /// The study's job environment (read from rsim.toml; works before `rsim init`): build a
    /// Python environment from its lock, check it, or run a command in it.
    Env {
        #[command(subcommand)]
        cmd: EnvCommand,
    },
    /// Job programs run by the job runner (not for agents).
    #[command(hide = true)]
    Job {
        #[command(subcommand)]
        kind: JobCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum EnvCommand {
    /// Build the Python environment from the study's lock (nothing when it is built and matches
    /// the lock; one that drifted from it is rebuilt); prints what jobs record as their
    /// environment.
    Build {
        /// Rebuild it even when it is built.
        #[arg(long)]
        force: bool,
    },
    /// Check the environment as a job's admission does; prints what jobs record as their
    /// environment, or why a job would be refused (exit 1).
    Check,
    /// Run a command in the Python environment (its bin/ first on PATH), e.g. to make a base
    /// model: `rsim env run -- python3 recipes/init_model.py --out models/base`.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        command: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// The study's keys (fingerprints, when each was in force) and whether this copy holds the private key.
    Show,
    /// Commit the study's public key to main (studies made before rsim committed it at genesis).
    Publish,
    /// Make a new signing key: main records it in force from now and the old one retired (signed
    /// by the old key); the old private key is deleted.
    Rotate,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum McpClient {
    /// Claude Code (.mcp.json)
    Claude,
    /// Codex CLI (config.toml)
    Codex,
    /// Gemini CLI (.gemini/settings.json)
    Gemini,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DagFormat {
    Text,
    Dot,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum JobCommand {
    /// Fine-tune (a job spec from the runner).
    Train { spec: PathBuf },
    /// Evaluate (a job spec from the runner).
    Eval { spec: PathBuf },
    /// The embedded trainer's time per step on a spec of `rsim bench-step` (one JSON line).
    StepBench { spec: PathBuf },
    /// Run a command in a sandbox (Landlock): the wrapper a job's or an agent's command starts with.
    Sandbox {
        /// The sandbox's description (sandbox.json).
        file: PathBuf,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Build a tiny-gpt base model by a short seeded pretraining.
    Pretrain {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, default_value_t = 1500)]
        steps: u64,
        /// What the model is pretrained on: arithmetic text, or the tiny-code family's programs.
        #[arg(long, value_enum, default_value = "arith")]
        family: crate::train::Family,
    },
}
