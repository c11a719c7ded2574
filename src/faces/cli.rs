//! The command-line face: parses arguments into the same JSON requests an MCP client sends and
//! calls the Experiment OS API. Output to stdout (tables, or JSON with --json); errors to stderr
//! with an exit code per error kind.

use std::io::Read;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use serde_json::{Value, json};

use crate::api::types::AnswerFormat;
use crate::model::{Caller, Role};
use crate::os::Execute;
use crate::os::Study;
use crate::util::error::{Error, Result};

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
        /// Instead, serve the web page over a made-up DAG of N nodes (at --http) until
        /// interrupted, for tools/web-bench.sh to time its first paint in Chromium.
        #[arg(long, value_name = "N", conflicts_with_all = ["slurm", "views"])]
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
    /// Job programs run by the job runner (not for agents).
    #[command(hide = true)]
    Job {
        #[command(subcommand)]
        kind: JobCommand,
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
    },
}

/// Entry point: returns the process exit code.
pub fn main() -> i32 {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RSIM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = Cli::parse();
    let json = cli.json;
    match run(cli) {
        Ok(()) => 0,
        Err(e) => {
            if json {
                eprintln!(
                    "{}",
                    serde_json::to_string(&json!({ "error": e }))
                        .unwrap_or_else(|_| e.message.clone())
                );
            } else {
                eprintln!("error: {}", e.message);
                if let Some(c) = &e.commit {
                    eprintln!("(the rejection is recorded as commit {c})");
                }
            }
            e.kind.exit_code()
        }
    }
}

fn study_dir(cli: &Cli) -> PathBuf {
    cli.study
        .clone()
        .or_else(|| std::env::var_os("RSIM_STUDY").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("."))
}

fn caller(cli: &Cli) -> Result<Caller> {
    let r = cli.role.as_deref().unwrap_or("owner");
    let role = Role::parse(r).ok_or_else(|| {
        Error::invalid(format!(
            "--role: {r:?} is not a role (owner, worker, reviewer, observer)"
        ))
    })?;
    Ok(Caller::new(
        cli.agent.clone().unwrap_or_else(|| "owner".to_string()),
        role,
    ))
}

/// The role of an MCP connection: --role, default worker (the owner works at the terminal).
fn agent_role(cli: &Cli) -> Result<Role> {
    crate::faces::mcp::http::agent_role(cli.role.as_deref().unwrap_or("worker"))
        .map_err(|e| e.context("--role"))
}

fn mcp_options(job_wait: f64) -> Result<crate::faces::mcp::Options> {
    if !(0.0..=3600.0).contains(&job_wait) {
        return Err(Error::invalid("--job-wait: 0 to 3600 seconds"));
    }
    Ok(crate::faces::mcp::Options {
        job_wait: std::time::Duration::from_secs_f64(job_wait),
    })
}

fn print_json(v: &Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub fn run(cli: Cli) -> Result<()> {
    let dir = study_dir(&cli);
    let json = cli.json;
    match &cli.command {
        Command::Init { dir: d, example } => {
            let d = d
                .clone()
                .or(cli.study.clone())
                .unwrap_or_else(|| PathBuf::from("."));
            let rep = crate::faces::init::init(&d, example.as_deref())?;
            if json {
                print_json(&serde_json::to_value(&rep)?)?;
            } else {
                println!("{}", rep.message);
                if let Some(b) = &rep.base_checkpoint {
                    println!("study:           {}", rep.root.display());
                    println!("base checkpoint: {b}");
                    println!("next:            rsim -C {} dag", d.display());
                }
            }
            Ok(())
        }
        Command::Job { kind } => match kind {
            JobCommand::Train { spec } => crate::train::train(spec),
            JobCommand::Eval { spec } => crate::train::eval(spec),
            JobCommand::Sandbox { file, command } => crate::jobs::sandbox::exec(file, command),
            JobCommand::Pretrain { out, seed, steps } => {
                let report = crate::train::pretrain(out, *seed, *steps)?;
                print_json(&report)
            }
        },
        Command::Schemas { out, check } => schemas(out, *check),
        Command::Clone { url, dir: d } => clone_study(url, d.as_deref(), json),
        Command::Mcp { job_wait } => {
            let who = Caller::new(
                cli.agent
                    .clone()
                    .unwrap_or_else(|| format!("mcp-{}", std::process::id())),
                agent_role(&cli)?,
            );
            crate::faces::mcp::serve_stdio(&dir, who, mcp_options(*job_wait)?)
        }
        Command::Lsp { .. } => {
            let root = cli
                .study
                .clone()
                .or_else(|| std::env::var_os("RSIM_STUDY").map(PathBuf::from));
            crate::faces::lsp::serve_stdio(crate::faces::lsp::Options {
                root,
                caller: caller(&cli)?,
            })
        }
        Command::Serve {
            http,
            tokens,
            job_wait,
            agents,
        } => crate::faces::mcp::http::serve(
            &dir,
            crate::faces::mcp::http::HttpOptions {
                addr: http.clone(),
                tokens: tokens.clone(),
                role: agent_role(&cli)?,
                agent: cli.agent.clone().unwrap_or_else(|| "http".to_string()),
                agents: agents.clone(),
            },
            mcp_options(*job_wait)?,
        ),
        Command::McpConfig { client, name } => {
            use crate::faces::mcp::config::{Client, Connection, snippet};
            let c = match client {
                McpClient::Claude => Client::Claude,
                McpClient::Codex => Client::Codex,
                McpClient::Gemini => Client::Gemini,
            };
            if cli.json && c == Client::Codex {
                return Err(Error::invalid(
                    "--json: Codex's configuration is TOML; run without --json (Claude Code's and Gemini CLI's are JSON already)",
                ));
            }
            let role = agent_role(&cli)?;
            let conn = Connection {
                name,
                role: role.as_str(),
                agent: cli.agent.as_deref(),
            };
            print!("{}", snippet(c, &dir, &conn)?);
            Ok(())
        }
        Command::Bench {
            nodes,
            actions,
            repeat,
            dir: bdir,
            reuse,
            slurm,
            partition,
            views,
            web,
            http,
        } => match (web, slurm, views) {
            (Some(n), None, None) => crate::bench::views::web(bdir.as_deref(), |root| {
                crate::faces::web::serve_made_up(root, *n, http)
            }),
            (_, _, Some(n)) => shown(crate::bench::views::views(
                BENCH_FACES,
                *n,
                bdir.as_deref(),
                json,
            )),
            (_, Some(n), None) => shown(crate::bench::slurm::run_jobs(
                *n,
                partition.as_deref(),
                bdir.as_deref(),
                json,
            )),
            (None, None, None) => shown(crate::bench::actions::run(
                *nodes,
                *actions,
                *repeat,
                bdir.as_deref(),
                *reuse,
                json,
            )),
        },
        Command::BenchCli {
            runs,
            warmup,
            fsync,
            dir: bdir,
        } => shown(crate::bench::cli_cost::cli(
            *runs,
            *warmup,
            *fsync,
            bdir.as_deref(),
            json,
        )),
        Command::Run { .. } => run_campaign(&cli, json),
        Command::BenchStrategies {
            example,
            seeds,
            experiments,
            steps,
            strategy,
            dir: bdir,
        } => shown(crate::bench::strategies::strategies(
            BENCH_FACES,
            example,
            *seeds,
            *experiments,
            *steps,
            strategy,
            bdir.as_deref(),
            json,
        )),
        Command::BenchTrain {
            format,
            seeds,
            budgets,
            target,
            learning_rate,
            batch_size,
            rows,
            dir: bdir,
        } => {
            let formats = if format.is_empty() {
                vec![
                    AnswerFormat::Plain,
                    AnswerFormat::Reversed,
                    AnswerFormat::Scratchpad,
                ]
            } else {
                format.clone()
            };
            let o = crate::bench::train::TrainBenchOptions {
                formats,
                seeds: *seeds,
                budgets: budgets.clone(),
                target: *target,
                learning_rate: *learning_rate,
                batch_size: *batch_size,
                rows: *rows,
            };
            shown(crate::bench::train::training(
                BENCH_FACES,
                &o,
                bdir.as_deref(),
                json,
            ))
        }
        Command::Report { html, task } => {
            let study = Study::open(&dir)?;
            let rep = crate::campaign::report::build(&study, task.as_deref())?;
            if let Some(h) = html {
                write_html(h, &study)?;
            }
            if json {
                print_json(&serde_json::to_value(&rep)?)
            } else {
                print!("{}", crate::campaign::report::text(&rep));
                Ok(())
            }
        }
        _ => {
            let who = caller(&cli)?;
            let mut study = Study::open(&dir)?;
            run_on_study(&mut study, &who, &cli.command, json)
        }
    }
}

/// What the benchmarks need from the faces: `rsim init --example` and `rsim report --html`.
const BENCH_FACES: crate::bench::Faces = crate::bench::Faces {
    init_example: |dir, example| crate::faces::init::init(dir, Some(example)).map(drop),
    static_page: crate::faces::web::page::static_page,
};

/// Print a benchmark's report.
fn shown(report: Result<String>) -> Result<()> {
    print!("{}", report?);
    Ok(())
}

fn run_on_study(study: &mut Study, who: &Caller, cmd: &Command, json: bool) -> Result<()> {
    let (action, args): (&str, Value) = match cmd {
        Command::Branch {
            parents,
            title,
            hypothesis,
        } => (
            "branch",
            json!({ "parents": parents, "title": title, "hypothesis": hypothesis }),
        ),
        Command::RunSft {
            node,
            base,
            datasets,
            learning_rate,
            steps,
            batch_size,
            warmup_steps,
            schedule,
            seed,
            eval_every,
            eval_task,
        } => {
            let mut req = json!({
                "node": node, "base": base, "datasets": datasets, "learning_rate": learning_rate,
                "steps": steps, "batch_size": batch_size, "warmup_steps": warmup_steps,
                "schedule": schedule, "seed": seed,
            });
            if *eval_every > 0 {
                req["eval_every"] = json!(eval_every);
            }
            if let Some(t) = eval_task {
                req["eval_task"] = json!(t);
            }
            ("run_sft", req)
        }
        Command::Evaluate {
            node,
            checkpoint,
            task,
            split,
        } => (
            "evaluate",
            json!({ "node": node, "checkpoint": checkpoint, "task": task, "split": split }),
        ),
        Command::Compare {
            node,
            nodes,
            task,
            split,
            metric,
        } => (
            "compare",
            json!({ "node": node, "nodes": nodes, "task": task, "split": split, "metric": metric }),
        ),
        Command::Dag {
            format,
            view,
            node,
            task,
            metric,
            checkpoint,
            max_tokens,
            cursor,
        } => {
            let mut req = json!({ "view": view });
            for (k, v) in [
                ("node", node),
                ("task", task),
                ("metric", metric),
                ("checkpoint", checkpoint),
                ("cursor", cursor),
            ] {
                if let Some(v) = v {
                    req[k] = json!(v);
                }
            }
            if let Some(m) = max_tokens {
                req["max_tokens"] = json!(m);
            }
            return dag(study, req, *format, json);
        }
        Command::Log {
            node,
            limit,
            max_tokens,
            cursor,
        } => {
            let mut req = json!({ "limit": limit });
            if let Some(n) = node {
                req["node"] = json!(n);
            }
            if let Some(m) = max_tokens {
                req["max_tokens"] = json!(m);
            }
            if let Some(c) = cursor {
                req["cursor"] = json!(c);
            }
            ("log", req)
        }
        Command::Show { node } => ("get_node", json!({ "node": node })),
        Command::Diff { a, b } => ("diff", json!({ "a": a, "b": b })),
        Command::Reproduce {
            node,
            seq,
            allow_env_change,
        } => return reproduce(study, who, node, *seq, *allow_env_change, json),
        Command::Reindex => {
            let t = std::time::Instant::now();
            let r = study.reindex()?;
            if json {
                print_json(
                    &json!({ "nodes": r.nodes, "refused": r.refused, "seconds": t.elapsed().as_secs_f64() }),
                )?;
            } else {
                println!(
                    "reindexed {} nodes from git in {:.2} s",
                    r.nodes,
                    t.elapsed().as_secs_f64()
                );
                for why in &r.refused {
                    println!("refused {why}");
                }
            }
            if !r.refused.is_empty() {
                return Err(Error::internal(format!(
                    "{} node branch(es) are not this study's history and were left out of the index (see above; `rsim fsck` and `rsim audit` report them)",
                    r.refused.len()
                )));
            }
            return Ok(());
        }
        Command::Cancel { job } => {
            study.cancel_job(
                who,
                crate::api::types::CancelJobRequest { job: job.clone() },
            )?;
            if json {
                print_json(&json!({ "job": job, "cancel": "requested" }))?;
            } else {
                println!("cancel requested for {job}");
            }
            return Ok(());
        }
        Command::Recover { wait } => {
            // Opening the study recorded every orphaned job that has ended already.
            let n = if *wait {
                study.wait_for_orphaned_jobs()?
            } else {
                study.recover_orphaned_jobs()?
            };
            if json {
                print_json(&json!({ "recorded": n }))?;
            } else {
                println!("recorded {n} orphaned job(s)");
            }
            return Ok(());
        }
        Command::Verify { key } => {
            let rep = crate::os::verify::verify(study, key.as_deref())?;
            if json {
                print_json(&serde_json::to_value(&rep)?)?;
            } else {
                print_verify(&rep);
            }
            return match &rep.first_bad {
                None if rep.problems.is_empty() => Ok(()),
                Some(c) => Err(Error::internal(format!(
                    "commit {c} is not proven to be this study's ({} problem(s) above)",
                    rep.problems.len()
                ))),
                None => Err(Error::internal(format!(
                    "{} problem(s) above",
                    rep.problems.len()
                ))),
            };
        }
        Command::Key { cmd } => return key_command(study, cmd, json),
        Command::Audit => {
            let rep = crate::os::audit::audit(study)?;
            if json {
                print_json(&serde_json::to_value(&rep)?)?;
            } else {
                println!(
                    "attempts {}: {} accepted, {} rejected",
                    rep.attempts, rep.accepted, rep.rejected
                );
                let mut t = table(&["rejected by rule", "count"]);
                for (rule, n) in &rep.rejections_by_rule {
                    t.add_row(vec![rule.clone(), n.to_string()]);
                }
                println!("{t}");
                let mut t = table(&["agent", "role", "actions", "rejected"]);
                for a in &rep.agents {
                    t.add_row(vec![
                        a.id.clone(),
                        a.role.clone(),
                        a.actions.to_string(),
                        a.rejected.to_string(),
                    ]);
                }
                println!("{t}");
                let mut t = table(&["check", "checked", "violations", "what"]);
                for c in &rep.checks {
                    t.add_row(vec![
                        c.name.to_string(),
                        c.checked.to_string(),
                        c.violations.len().to_string(),
                        c.what.to_string(),
                    ]);
                }
                println!("{t}");
                for c in &rep.checks {
                    for v in &c.violations {
                        println!("  {}: {v}", c.name);
                    }
                }
                println!("got through: {}", rep.got_through);
                if rep.not_in_this_copy > 0 {
                    println!(
                        "not re-checked here: {} artifact(s) this read-only clone does not hold (the object store stays with the study's owner)",
                        rep.not_in_this_copy
                    );
                }
            }
            return Ok(());
        }
        Command::Storage => {
            let u = study.storage_use()?;
            if json {
                print_json(&serde_json::to_value(&u)?)?;
            } else {
                let mib = |b: u64| format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20));
                let mut t = table(&["who", "objects", "job dirs", "record", "total", "budget"]);
                let row = |who: String, b: &crate::os::storage::Bytes, budget: u64| {
                    vec![
                        who,
                        mib(b.objects),
                        mib(b.jobs),
                        mib(b.record),
                        mib(b.total),
                        mib(budget),
                    ]
                };
                t.add_row(row("study".into(), &u.study, u.budget));
                for (agent, b) in &u.agents {
                    t.add_row(row(agent.clone(), b, u.agent_budget));
                }
                println!("{t}");
                println!(
                    "unreferenced: {} object(s), {} (rsim gc removes them)",
                    u.unreferenced_objects,
                    mib(u.unreferenced_bytes)
                );
            }
            return Ok(());
        }
        &Command::Gc { dry_run, grace } => {
            let rep = study.gc(dry_run, std::time::Duration::from_secs(grace))?;
            if json {
                print_json(&serde_json::to_value(&rep)?)?;
            } else {
                let verb = if dry_run { "would remove" } else { "removed" };
                println!(
                    "{verb} {} unreferenced object(s) ({} bytes) and the leftover outputs of {} recorded job(s) ({} bytes); {} unreferenced object(s) younger than {grace} s kept",
                    rep.objects, rep.object_bytes, rep.job_dirs, rep.job_bytes, rep.kept_recent
                );
            }
            return Ok(());
        }
        Command::Fsck => {
            let rep = crate::os::fsck::fsck(study)?;
            if json {
                print_json(&serde_json::to_value(&rep)?)?;
            } else {
                println!(
                    "{} nodes, {} actions, {} artifacts checked: {}",
                    rep.nodes,
                    rep.actions,
                    rep.artifacts_checked,
                    if rep.problems.is_empty() {
                        "ok".to_string()
                    } else {
                        format!("{} problems", rep.problems.len())
                    }
                );
                for p in &rep.problems {
                    println!("  - {p}");
                }
                if rep.artifacts_not_here > 0 {
                    println!(
                        "{} artifact(s) not checked: this read-only clone does not hold them",
                        rep.artifacts_not_here
                    );
                }
            }
            return if rep.problems.is_empty() {
                Ok(())
            } else {
                Err(Error::internal(format!(
                    "the record has {} problems",
                    rep.problems.len()
                )))
            };
        }
        Command::Call { action, args } => {
            let text = match args.as_deref() {
                None => "{}".to_string(),
                Some("-") => {
                    let mut bytes = Vec::new();
                    std::io::stdin().read_to_end(&mut bytes)?;
                    String::from_utf8(bytes).map_err(|e| {
                        Error::invalid(format!(
                            "arguments on stdin are not UTF-8 (byte {} is not): send JSON text",
                            e.utf8_error().valid_up_to()
                        ))
                    })?
                }
                Some(s) => s.to_string(),
            };
            let v: Value = serde_json::from_str(&text)
                .map_err(|e| Error::invalid(format!("arguments are not valid JSON: {e}")))?;
            let out = study.call(who, action, v)?;
            return print_json(&out);
        }
        Command::Init { .. }
        | Command::Job { .. }
        | Command::Schemas { .. }
        | Command::Run { .. }
        | Command::Clone { .. }
        | Command::Report { .. }
        | Command::BenchStrategies { .. }
        | Command::BenchTrain { .. }
        | Command::Mcp { .. }
        | Command::Lsp { .. }
        | Command::Serve { .. }
        | Command::McpConfig { .. }
        | Command::Bench { .. }
        | Command::BenchCli { .. } => {
            return Err(Error::internal("handled before opening the study"));
        }
    };
    let out = study.call(who, action, args)?;
    if json {
        return print_json(&out);
    }
    print_human(action, &out)
}

fn print_verify(rep: &crate::os::verify::VerifyReport) {
    for k in &rep.keys {
        let when =
            |t: Option<i64>| t.map_or_else(String::new, |t| crate::model::rfc3339_at(t as f64));
        let window = match (k.valid_after, k.valid_before) {
            (None, None) => "in force".to_string(),
            (a, None) => format!("in force since {}", when(a)),
            (None, b) => format!("retired {}", when(b)),
            (a, b) => format!("in force {} to {}", when(a), when(b)),
        };
        println!("key {}  {window}", k.fingerprint);
    }
    if let Some(g) = &rep.genesis_key {
        println!("genesis signed by {g}");
    }
    println!(
        "{} commit(s) proven; {} owner commit(s) on main unsigned (config changes made with git){}",
        rep.verified,
        rep.unsigned_owner_commits,
        if rep.read_only {
            "; this copy is read-only"
        } else {
            ""
        }
    );
    for c in &rep.owner_commits {
        println!("  owner commit (unsigned): {c}");
    }
    for p in &rep.problems {
        println!("  - {p}");
    }
    if rep.problems.is_empty() {
        println!("ok: every action of this study is signed by its key");
    }
}

fn key_command(study: &mut Study, cmd: &KeyCommand, json: bool) -> Result<()> {
    match cmd {
        KeyCommand::Show => {
            let rep = crate::os::verify::verify(study, None)?;
            let v = json!({
                "keys": rep.keys,
                "in_force": rep.in_force,
                "committed": rep.committed,
                "read_only": study.read_only(),
            });
            if json {
                return print_json(&v);
            }
            for k in &rep.keys {
                println!("{}", k.fingerprint);
            }
            match study.read_only() {
                Some(why) => println!("read-only: {why}"),
                None => println!("this copy holds the study's private key"),
            }
            if !rep.committed {
                println!("the public key is not committed on main yet: run `rsim key publish`");
            }
            Ok(())
        }
        KeyCommand::Publish => {
            let oid = study.publish_key()?;
            if json {
                return print_json(&json!({ "commit": oid.to_string() }));
            }
            println!(
                "published the study's public key on main ({oid}); clones prove commits with `rsim verify`"
            );
            Ok(())
        }
        KeyCommand::Rotate => {
            let (oid, old, new) = study.rotate_key()?;
            if json {
                return print_json(
                    &json!({ "commit": oid.to_string(), "retired": old, "in_force": new }),
                );
            }
            println!("rotated the study's key on main ({oid}): {old} retired, {new} in force");
            Ok(())
        }
    }
}

/// `rsim clone` (the work is `os::verify::clone`): what was cloned and how it verified.
fn clone_study(url: &str, dir: Option<&Path>, json: bool) -> Result<()> {
    let (dir, study, rep) = crate::os::verify::clone(url, dir)?;
    let nodes = rep.nodes;
    if json {
        print_json(&json!({
            "dir": dir, "nodes": nodes, "verify": rep, "read_only": study.read_only(),
        }))?;
    } else {
        println!("cloned {url} into {} ({nodes} nodes)", dir.display());
        print_verify(&rep);
        println!(
            "update it with: git -C {} fetch origin '+refs/heads/rsim/*:refs/heads/rsim/*' && git -C {} pull --ff-only",
            dir.display(),
            dir.display()
        );
    }
    if let Some(c) = rep.first_bad {
        return Err(Error::internal(format!(
            "the clone holds commit {c}, which is not proven to be this study's (see above)"
        )));
    }
    Ok(())
}

/// `rsim reproduce`: one reproduce action per run_sft (each its own job and commit).
fn reproduce(
    study: &Study,
    who: &Caller,
    node: &str,
    seq: Option<u32>,
    allow_env_change: bool,
    json: bool,
) -> Result<()> {
    let seq_given = seq;
    let seqs: Vec<u32> = match seq {
        Some(s) => vec![s],
        None => {
            let info = study.call(who, "get_node", json!({ "node": node }))?;
            let seqs: Vec<u32> = info["actions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|a| {
                    (a["action"] == "run_sft" || a["action"] == "evaluate")
                        && a["decision"] == "accepted"
                        && a["job"].is_string()
                })
                .filter_map(|a| a["seq"].as_u64().map(|s| s as u32))
                .collect();
            if seqs.is_empty() {
                return Err(Error::invalid(format!(
                    "node: {node} has no run_sft or evaluate job to reproduce"
                )));
            }
            seqs
        }
    };
    let mut out = Vec::new();
    let mut all_identical = true;
    for seq in seqs {
        let r = match study.call(
            who,
            "reproduce",
            json!({ "node": node, "seq": seq, "allow_env_change": allow_env_change }),
        ) {
            Ok(r) => r,
            // A node's own test evaluations and failed jobs are named, not fatal, when every
            // action of the node is reproduced.
            Err(e) if seq_given.is_none() && e.kind == crate::util::error::ErrorKind::Invalid => {
                if !json {
                    println!("{node} #{seq}: skipped: {}", e.message);
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        all_identical &= r["identical"] == true;
        if !json {
            println!(
                "{node} #{seq} {}: {} ({}; job {} in {:.1} s)",
                s(&r["action"]),
                s(&r["verdict"]),
                match r["checkpoint"].as_str() {
                    Some(c) => format!(
                        "recorded {}, reproduced {}",
                        short(&r["recorded_checkpoint"]),
                        &c[..12.min(c.len())]
                    ),
                    None if r["action"] == "evaluate" => format!(
                        "checkpoint {} on {}/{}",
                        short(&r["recorded_checkpoint"]),
                        s(&r["task"]),
                        s(&r["split"])
                    ),
                    None => format!("recorded {}, none made", short(&r["recorded_checkpoint"])),
                },
                s(&r["job"]["id"]),
                r["job"]["duration_s"].as_f64().unwrap_or(0.0)
            );
            let metrics = r["train_metrics"]
                .as_array()
                .into_iter()
                .chain(r["metrics"].as_array())
                .flatten();
            for m in metrics {
                println!(
                    "  {} recorded {} reproduced {} difference {}",
                    s(&m["name"]),
                    m["recorded"],
                    m["reproduced"],
                    m["difference"]
                );
            }
        }
        out.push(r);
    }
    if json {
        print_json(&Value::Array(out))?;
    }
    if all_identical {
        Ok(())
    } else {
        Err(Error::internal(
            "a reproduction did not give the identical checkpoint (see above; recorded with reproduce)",
        ))
    }
}

/// The first 12 characters of a hash.
fn short(v: &Value) -> String {
    s(v).chars().take(12).collect()
}

fn dag(study: &Study, req: Value, format: DagFormat, json: bool) -> Result<()> {
    let view = req["view"].as_str().unwrap_or("full").to_string();
    let out = study.call(&Caller::new("cli", Role::Observer), "dag", req)?;
    match (format, json) {
        (DagFormat::Json, _) | (_, true) => print_json(&out),
        (DagFormat::Dot, _) => {
            let ids = out["nodes"].as_array().map(|a| {
                a.iter()
                    .filter_map(|n| n["id"].as_str().map(str::to_string))
                    .collect::<std::collections::BTreeSet<_>>()
            });
            let g = study.dag_graph()?;
            print!(
                "{}",
                g.to_dot(if view == "full" { None } else { ids.as_ref() })
            );
            Ok(())
        }
        (DagFormat::Text, _) if view == "full" => {
            print!(
                "{}",
                study.dag_graph()?.to_text_marked(&study.suspect_nodes()?)
            );
            Ok(())
        }
        (DagFormat::Text, _) => {
            if let Some(sm) = out.get("summary") {
                println!(
                    "{} nodes, {} edges; frontier {} open node(s)",
                    sm["nodes"], sm["edges"], sm["frontier"]
                );
                for (what, key) in [
                    ("status", "by_status"),
                    ("outcome", "by_outcome"),
                    ("verdict", "by_verdict"),
                ] {
                    let counts: Vec<String> = sm[key]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| format!("{k} {v}"))
                        .collect();
                    println!("by {what}: {}", counts.join(", "));
                }
                if let Some(b) = sm.get("best") {
                    println!(
                        "best: {} ({}) via {}",
                        s(&b["id"]),
                        b["value"],
                        sm["best_path"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(s)
                            .collect::<Vec<_>>()
                            .join(" → ")
                    );
                }
                println!("frontier:");
            }
            let mut t = table(&["node", "status", "title", "value / relation"]);
            for n in out["nodes"].as_array().into_iter().flatten() {
                let extra = n["value"]
                    .as_f64()
                    .map(|v| format!("{v:.4}"))
                    .or_else(|| n["relation"].as_str().map(str::to_string))
                    .map(|e| {
                        if n["suspect"] == true {
                            format!("{e}, SUSPECT")
                        } else {
                            e
                        }
                    })
                    .or_else(|| (n["suspect"] == true).then(|| "SUSPECT".to_string()));
                t.add_row(vec![
                    s(&n["id"]),
                    s(&n["status"]),
                    s(&n["title"]),
                    extra.unwrap_or_default(),
                ]);
            }
            println!("{t}");
            for step in out["lineage"].as_array().into_iter().flatten() {
                println!(
                    "{}  {}",
                    s(&step["checkpoint"]),
                    step["node"]
                        .as_str()
                        .map_or("base model".to_string(), |n| format!(
                            "run_sft on {n} #{}",
                            step["seq"]
                        ))
                );
            }
            if let Some(c) = out["next_cursor"].as_str() {
                println!(
                    "{} of {} node(s) shown; next page: --cursor {c}",
                    out["nodes"].as_array().map_or(0, Vec::len),
                    out["total"]
                );
            }
            Ok(())
        }
    }
}

/// A field as a person reads it in a table or a listing (agent text made safe to display).
fn s(v: &Value) -> String {
    match v {
        Value::String(s) => crate::util::text::display(s),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn print_diff(out: &Value) {
    let (a, b) = (s(&out["a"]), s(&out["b"]));
    let f = |v: &Value| {
        v.as_f64()
            .map(|x| format!("{x:.4}"))
            .unwrap_or_else(|| "-".into())
    };
    println!(
        "diff {a} → {b}: {} parameter(s) differ, {} equal",
        out["params"].as_array().map_or(0, Vec::len),
        out["params_same"]
    );
    let mut t = table(&["parameter", "where", &a, &b]);
    for p in out["params"].as_array().into_iter().flatten() {
        t.add_row(vec![s(&p["key"]), s(&p["side"]), s(&p["a"]), s(&p["b"])]);
    }
    println!("{t}");
    let mut t = table(&["dataset", "where", "rows", "sha256"]);
    for d in out["datasets"].as_array().into_iter().flatten() {
        let sha = s(&d["sha256"]);
        t.add_row(vec![
            s(&d["name"]),
            s(&d["side"]),
            s(&d["rows"]),
            sha[..12.min(sha.len())].to_string(),
        ]);
    }
    println!("{t}");
    println!(
        "environment: {} ({a}: {}; {b}: {})",
        if out["env_same"].as_bool() == Some(true) {
            "same"
        } else {
            "differs"
        },
        out["env_a"].as_array().map_or(0, Vec::len),
        out["env_b"].as_array().map_or(0, Vec::len)
    );
    let mut t = table(&[
        "task/split/metric",
        "n A",
        "n B",
        "mean A",
        "mean B",
        "B − A",
        "95% interval",
        "method",
    ]);
    for m in out["metrics"].as_array().into_iter().flatten() {
        let ci = m["ci95"]
            .as_array()
            .map(|c| format!("[{}, {}]", f(&c[0]), f(&c[1])))
            .unwrap_or_else(|| "-".into());
        t.add_row(vec![
            format!("{}/{}/{}", s(&m["task"]), s(&m["split"]), s(&m["metric"])),
            s(&m["n_a"]),
            s(&m["n_b"]),
            f(&m["mean_a"]),
            f(&m["mean_b"]),
            f(&m["difference"]),
            ci,
            s(&m["method"]),
        ]);
    }
    println!("{t}");
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED);
    t.set_header(header.to_vec());
    t
}

fn print_human(action: &str, out: &Value) -> Result<()> {
    match action {
        "branch" => println!(
            "created {} (branch {}, commit {})",
            s(&out["node"]),
            s(&out["branch"]),
            &s(&out["commit"])[..12.min(s(&out["commit"]).len())]
        ),
        "run_sft" => {
            println!(
                "job {}: {} in {:.1} s",
                s(&out["job"]["id"]),
                s(&out["job"]["state"]),
                out["job"]["duration_s"].as_f64().unwrap_or(0.0)
            );
            if let Some(e) = out["job"]["error"].as_str() {
                println!("error: {e}");
            }
            if let Some(c) = out["checkpoint"].as_str() {
                println!("checkpoint {c}");
            }
            for (k, v) in out["train_metrics"].as_object().into_iter().flatten() {
                println!("  {k} = {v}");
            }
        }
        "evaluate" => {
            println!(
                "job {}: {} — {}/{} on {} items",
                s(&out["job"]["id"]),
                s(&out["job"]["state"]),
                s(&out["task"]),
                s(&out["split"]),
                out["n_items"]
            );
            if let Some(e) = out["job"]["error"].as_str() {
                println!("error: {e}");
            }
            for (k, v) in out["metrics"].as_object().into_iter().flatten() {
                println!("  {k} = {:.4}", v.as_f64().unwrap_or(f64::NAN));
            }
        }
        "diff" => print_diff(out),
        "compare" => {
            let mut t = table(&["node", "title", "n", "mean", "95% interval", "best"]);
            for r in out["rows"].as_array().into_iter().flatten() {
                let f = |v: &Value| {
                    v.as_f64()
                        .map(|x| format!("{x:.4}"))
                        .unwrap_or_else(|| "-".into())
                };
                let ci = r["ci95"]
                    .as_array()
                    .map(|a| format!("[{}, {}]", f(&a[0]), f(&a[1])))
                    .unwrap_or_else(|| "-".into());
                t.add_row(vec![
                    s(&r["node"]),
                    s(&r["title"]),
                    s(&r["n"]),
                    f(&r["mean"]),
                    ci,
                    f(&r["best"]),
                ]);
            }
            println!(
                "{} on {}/{}",
                s(&out["metric"]),
                s(&out["task"]),
                s(&out["split"])
            );
            println!("{t}");
        }
        "log" => {
            let mut t = table(&[
                "when", "node", "#", "action", "decision", "agent", "summary",
            ]);
            for a in out["actions"].as_array().into_iter().flatten() {
                let dec = match a["rule"].as_str() {
                    Some(r) => format!("rejected ({r})"),
                    None => s(&a["decision"]),
                };
                t.add_row(vec![
                    s(&a["at"]),
                    s(&a["node"]),
                    s(&a["seq"]),
                    s(&a["action"]),
                    dec,
                    s(&a["agent"]),
                    s(&a["summary"]),
                ]);
            }
            println!("{t}");
            if let Some(c) = out["next_cursor"].as_str() {
                println!("next page: --cursor {c}");
            }
        }
        "get_node" => {
            println!("{}  {}", s(&out["id"]), s(&out["title"]));
            println!("branch:     {}", s(&out["branch"]));
            println!(
                "status:     {}{}",
                s(&out["status"]),
                out["outcome"]
                    .as_str()
                    .map(|o| format!(" ({o})"))
                    .unwrap_or_default()
            );
            println!(
                "parents:    {}",
                out["parents"]
                    .as_array()
                    .map(|a| a.iter().map(s).collect::<Vec<_>>().join(", "))
                    .unwrap_or_default()
            );
            println!(
                "children:   {}",
                out["children"]
                    .as_array()
                    .map(|a| a.iter().map(s).collect::<Vec<_>>().join(", "))
                    .unwrap_or_default()
            );
            println!(
                "created:    {} by {}",
                s(&out["created_at"]),
                s(&out["created_by"])
            );
            if !s(&out["hypothesis"]).is_empty() {
                println!("hypothesis: {}", s(&out["hypothesis"]));
            }
            let mut t = table(&["#", "action", "decision", "agent", "summary"]);
            for a in out["actions"].as_array().into_iter().flatten() {
                let dec = match a["rule"].as_str() {
                    Some(r) => format!("rejected ({r})"),
                    None => s(&a["decision"]),
                };
                t.add_row(vec![
                    s(&a["seq"]),
                    s(&a["action"]),
                    dec,
                    s(&a["agent"]),
                    s(&a["summary"]),
                ]);
            }
            println!("{t}");
            let metrics = out["metrics"].as_array().cloned().unwrap_or_default();
            if !metrics.is_empty() {
                let mut t = table(&["task", "split", "metric", "value", "checkpoint"]);
                for m in metrics {
                    t.add_row(vec![
                        s(&m["task"]),
                        s(&m["split"]),
                        s(&m["name"]),
                        format!("{:.4}", m["value"].as_f64().unwrap_or(f64::NAN)),
                        s(&m["checkpoint"]).chars().take(12).collect(),
                    ]);
                }
                println!("{t}");
            }
            if let Some(n) = out["notes"].as_str() {
                println!("{}", crate::util::text::display(n));
            }
        }
        _ => print_json(out)?,
    }
    Ok(())
}

fn schemas(out: &Path, check: bool) -> Result<()> {
    let files = crate::os::schemas::all_schema_files();
    let mut stale = Vec::new();
    for (rel, text) in &files {
        let p = out.join(rel);
        let current = std::fs::read_to_string(&p).ok();
        if current.as_deref() != Some(text.as_str()) {
            if check {
                stale.push(rel.clone());
            } else {
                if let Some(parent) = p.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(&p, text)?;
            }
        }
    }
    if !stale.is_empty() {
        return Err(Error::invalid(format!(
            "{} is stale ({}): run `cargo run -- schemas` and commit the result",
            out.display(),
            stale.join(", ")
        )));
    }
    if !check {
        eprintln!("wrote {} schema files under {}", files.len(), out.display());
    }
    Ok(())
}

/// The web page as one self-contained file (what `rsim serve` shows, as of now).
fn write_html(path: &Path, study: &Study) -> Result<()> {
    std::fs::write(path, crate::faces::web::page::static_page(study)?)
        .map_err(|e| Error::invalid(format!("--html {}: {e}", path.display())))?;
    eprintln!("HTML report: {}", path.display());
    Ok(())
}

/// `rsim run`: resolve the study (creating it from an example folder if asked), run or resume
/// the campaign, print the report.
fn run_campaign(cli: &Cli, json: bool) -> Result<()> {
    let Command::Run {
        path,
        into,
        strategy,
        experiments,
        steps,
        batch_size,
        seeds_per_node,
        workers,
        seed,
        task,
        worker,
        reviewer,
        max_share,
        max_depth,
        agent_timeout,
        html,
        quiet,
    } = &cli.command
    else {
        return Err(Error::internal("run_campaign called for another command"));
    };
    let path = path.clone().unwrap_or_else(|| study_dir(cli));
    let root = if path.join(".git").exists() {
        path
    } else {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if !(path.join("rsim.toml").is_file()
            && crate::faces::init::EXAMPLES.contains(&name.as_str()))
        {
            return Err(Error::invalid(format!(
                "{}: not a study (no .git) and not an example folder ({}); create one with `rsim init`",
                path.display(),
                crate::faces::init::EXAMPLES.join(", ")
            )));
        }
        let target = into
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("{name}-study")));
        if target.join(".git").exists() {
            eprintln!("using the study in {} (made from {name})", target.display());
        } else {
            eprintln!("creating a study from {name} in {}", target.display());
            crate::faces::init::init(&target, Some(&name))?;
        }
        target
    };
    if *experiments == 0 {
        return Err(Error::invalid(
            "--experiments: the budget must be at least 1",
        ));
    }
    if !(*max_share > 0.0 && *max_share <= 1.0) {
        return Err(Error::invalid("--max-share: expected a share in (0, 1]"));
    }
    let study = Study::open(&root)?;
    let task = match task {
        Some(t) => t.clone(),
        None => study
            .config()
            .tasks
            .keys()
            .next()
            .cloned()
            .ok_or_else(|| Error::invalid("the study has no task"))?,
    };
    drop(study);
    let mut o = crate::campaign::RunOptions::new(*strategy, &task);
    o.experiments = *experiments;
    o.steps = *steps;
    o.batch_size = *batch_size;
    o.seed = *seed;
    if let Some(k) = seeds_per_node {
        o.seeds_per_node = (*k).max(1);
    }
    if let Some(w) = workers {
        o.workers = (*w).max(1);
    }
    o.worker = crate::campaign::AgentSpec::parse(worker)?;
    o.reviewer = crate::campaign::AgentSpec::parse(reviewer)?;
    o.lock_in.max_share = *max_share;
    o.lock_in.max_depth = *max_depth;
    o.agent_timeout_s = (*agent_timeout).max(1);
    let summary = crate::campaign::run(&root, o, *quiet)?;
    if let Some(why) = &summary.stopped {
        eprintln!("warning: {why}");
    }
    let study = Study::open(&root)?;
    let rep = crate::campaign::report::build(&study, None)?;
    if let Some(h) = html {
        write_html(h, &study)?;
    }
    if json {
        print_json(&json!({ "summary": summary, "report": rep }))
    } else {
        print!("{}", crate::campaign::report::text(&rep));
        println!(
            "campaign: {} experiments in {:.0} s; the record: git -C {} log --graph --all --oneline",
            summary.experiments,
            summary.seconds,
            root.display()
        );
        Ok(())
    }
}

// The command line names answer formats and strategies by their own names (the core types stay
// free of clap).
impl clap::ValueEnum for AnswerFormat {
    fn value_variants<'a>() -> &'a [Self] {
        &AnswerFormat::ALL
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

impl clap::ValueEnum for crate::bench::cli_cost::FsyncChoice {
    fn value_variants<'a>() -> &'a [Self] {
        use crate::bench::cli_cost::FsyncChoice;
        &[FsyncChoice::On, FsyncChoice::Off, FsyncChoice::Both]
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        use crate::bench::cli_cost::FsyncChoice;
        Some(clap::builder::PossibleValue::new(match self {
            FsyncChoice::On => "on",
            FsyncChoice::Off => "off",
            FsyncChoice::Both => "both",
        }))
    }
}

impl clap::ValueEnum for crate::campaign::Strategy {
    fn value_variants<'a>() -> &'a [Self] {
        &crate::campaign::Strategy::ALL
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}
