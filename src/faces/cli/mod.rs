//! The command-line face: parses arguments into the same JSON requests an MCP client sends and
//! calls the Experiment OS API. Output to stdout (tables, or JSON with --json); errors to stderr
//! with an exit code per error kind.
//!
//! Laid out as ripgrep lays out its binary: the grammar (`args`), routing (here: `main`, `run`,
//! `run_on_study`), the JSON requests of action commands (`requests`), commands that are more
//! than one action (`ops`: queries with their own output, maintenance, keys, reproduce, clone,
//! schemas, init), the servers (`serve`: MCP over stdio and HTTP, the LSP, client configs),
//! campaigns and reports (`campaign`), the benchmarks' arguments (`bench`, over `crate::bench`),
//! and what a person reads (`print`). Invariant: no record, no policy — everything goes through
//! `os`.

mod args;
mod bench;
mod campaign;
mod names;
mod ops;
mod print;
mod requests;
mod serve;

use std::path::PathBuf;

use clap::Parser;
use serde_json::json;

pub use args::{Cli, Command, DagFormat, EnvCommand, JobCommand, KeyCommand, McpClient};

use crate::model::{Caller, Role};
use crate::os::Study;
use crate::util::error::{Error, Result};

/// Entry point: returns the process exit code.
pub fn main() -> i32 {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colours only for a terminal: a log kept in a file or read by a program has no escapes.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RSIM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = Cli::parse();
    let json = cli.json;
    let code = run_to_exit_code(cli, json);
    // What `rsim bench --big-requests` reads of each query process (`RSIM_LOG=rsim::memory=info`):
    // this process's own peak, which a parent's rusage cannot give (Linux counts a forked
    // parent's high-water mark in its child's).
    if tracing::enabled!(target: "rsim::memory", tracing::Level::INFO)
        && let Some(kib) = crate::bench::peak_resident_kib()
    {
        tracing::info!(target: "rsim::memory", "peak resident memory {kib} KiB");
    }
    code
}

fn run_to_exit_code(cli: Cli, json: bool) -> i32 {
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
                // An error may quote what a repository holds: no control character reaches the terminal.
                eprintln!("error: {}", crate::util::text::display(&e.message));
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

/// Route a command: those that open no study (or open it their own way) go to their module;
/// the rest run on the study opened here, as the caller --agent/--role names.
pub fn run(cli: Cli) -> Result<()> {
    let dir = study_dir(&cli);
    let json = cli.json;
    match &cli.command {
        Command::Init {
            dir: d,
            example,
            generator_secret,
        } => {
            let d = d
                .clone()
                .or(cli.study.clone())
                .unwrap_or_else(|| PathBuf::from("."));
            ops::init(&d, example.as_deref(), generator_secret.as_deref(), json)
        }
        Command::Job { kind } => ops::job(kind),
        Command::Env { cmd } => ops::env(&dir, cmd, json),
        Command::Schemas { out, check } => ops::schemas(out, *check),
        Command::Clone { url, dir: d } => ops::clone_study(url, d.as_deref(), json),
        Command::Mcp { job_wait } => serve::mcp_stdio(&cli, &dir, *job_wait),
        Command::Lsp { .. } => serve::lsp(&cli),
        Command::Serve {
            http,
            tokens,
            job_wait,
            agents,
        } => serve::http(&cli, &dir, http, tokens.as_deref(), *job_wait, agents),
        Command::McpConfig { client, name } => serve::mcp_config(&cli, &dir, *client, name),
        Command::Bench { .. }
        | Command::BenchCli { .. }
        | Command::BenchStrategies { .. }
        | Command::BenchTrain { .. }
        | Command::BenchStep { .. } => bench::run(&cli.command, json),
        Command::Run { .. } => campaign::run_campaign(&cli, json),
        Command::Report { html, task } => {
            campaign::report(&dir, html.as_deref(), task.as_deref(), json)
        }
        _ => {
            let who = caller(&cli)?;
            let mut study = Study::open(&dir)?;
            run_on_study(&mut study, &who, &cli.command, json)
        }
    }
}

/// Route a command on an open study: an action or query from its JSON request, printed as
/// JSON or for a person, or a command of `ops`.
fn run_on_study(study: &mut Study, who: &Caller, cmd: &Command, json: bool) -> Result<()> {
    match cmd {
        Command::Branch { .. }
        | Command::RunSft { .. }
        | Command::Evaluate { .. }
        | Command::Compare { .. }
        | Command::Log { .. }
        | Command::Show { .. }
        | Command::Diff { .. } => {
            let (action, args) = requests::action(cmd)
                .ok_or_else(|| Error::internal("a command without an action request"))?;
            let out = study.call(who, action, args)?;
            if json {
                print::json(&out)
            } else {
                print::actions::human(action, &out)
            }
        }
        Command::Dag { format, .. } => {
            let req = requests::dag(cmd)
                .ok_or_else(|| Error::internal("a command without a dag request"))?;
            ops::dag(study, req, *format, json)
        }
        Command::Reproduce {
            node,
            seq,
            allow_env_change,
        } => ops::reproduce(study, who, node, *seq, *allow_env_change, json),
        Command::Reindex => ops::reindex(study, json),
        Command::Cancel { job } => ops::cancel(study, who, job, json),
        Command::Recover { wait } => ops::recover(study, *wait, json),
        Command::Verify { key } => ops::verify(study, key.as_deref(), json),
        Command::Key { cmd } => ops::key(study, cmd, json),
        Command::Audit => ops::audit(study, json),
        Command::Storage => ops::storage(study, json),
        &Command::Gc { dry_run, grace } => ops::gc(study, dry_run, grace, json),
        Command::Fsck => ops::fsck(study, json),
        Command::Call { action, args } => ops::call(study, who, action, args.as_deref()),
        Command::Init { .. }
        | Command::Env { .. }
        | Command::Job { .. }
        | Command::Schemas { .. }
        | Command::Run { .. }
        | Command::Clone { .. }
        | Command::Report { .. }
        | Command::BenchStrategies { .. }
        | Command::BenchTrain { .. }
        | Command::BenchStep { .. }
        | Command::Mcp { .. }
        | Command::Lsp { .. }
        | Command::Serve { .. }
        | Command::McpConfig { .. }
        | Command::Bench { .. }
        | Command::BenchCli { .. } => Err(Error::internal("handled before opening the study")),
    }
}
