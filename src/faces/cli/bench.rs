//! The benchmarks' command lines (`rsim bench`, `bench-cli`, `bench-strategies`, `bench-train`):
//! arguments to the calls of `crate::bench`, whose reports this prints. What a benchmark needs
//! from the faces is handed in here (`FACES`), and `bench --web` is served by the web face.

use super::Command;
use crate::api::types::AnswerFormat;
use crate::util::error::{Error, Result};

/// What the benchmarks need from the faces: `rsim init --example` and `rsim report --html`.
const FACES: crate::bench::Faces = crate::bench::Faces {
    init_example: |dir, example| crate::faces::init::init(dir, Some(example)).map(drop),
    static_page: crate::faces::web::page::static_page,
};

/// Run the benchmark a command names and print its report.
pub fn run(cmd: &Command, json: bool) -> Result<()> {
    let report = match cmd {
        Command::Bench {
            nodes,
            actions,
            repeat,
            dir,
            reuse,
            slurm,
            partition,
            views,
            node_actions,
            big_requests,
            web,
            http,
        } => {
            let dir = dir.as_deref();
            match (web, slurm, views) {
                (None, None, None) if big_requests.is_some() => {
                    crate::bench::actions::big_requests(
                        big_requests.unwrap_or_default(),
                        *repeat,
                        dir,
                        json,
                    )
                }
                (None, None, None) if node_actions.is_some() => {
                    crate::bench::actions::node_actions(node_actions.unwrap_or_default(), dir, json)
                }
                (Some(n), None, None) => {
                    return crate::bench::views::web(dir, |root| {
                        crate::faces::web::serve_made_up(root, *n, http)
                    });
                }
                (_, _, Some(n)) => crate::bench::views::views(FACES, *n, dir, json),
                (_, Some(n), None) => {
                    crate::bench::slurm::run_jobs(*n, partition.as_deref(), dir, json)
                }
                (None, None, None) => {
                    crate::bench::actions::run(*nodes, *actions, *repeat, dir, *reuse, json)
                }
            }
        }
        Command::BenchCli {
            runs,
            warmup,
            fsync,
            dir,
        } => crate::bench::cli_cost::cli(*runs, *warmup, *fsync, dir.as_deref(), json),
        Command::BenchStrategies {
            example,
            seeds,
            experiments,
            steps,
            strategy,
            oracle,
            lockstep,
            dir,
        } => crate::bench::strategies::strategies(
            FACES,
            crate::bench::strategies::StrategiesOptions {
                example,
                seeds: *seeds,
                experiments: *experiments,
                steps: *steps,
                which: strategy,
                oracle: *oracle,
                lockstep: *lockstep,
            },
            dir.as_deref(),
            json,
        ),
        Command::BenchTrain {
            format,
            seeds,
            budgets,
            target,
            learning_rate,
            batch_size,
            rows,
            dir,
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
            crate::bench::train::training(FACES, &o, dir.as_deref(), json)
        }
        Command::BenchStep {
            steps,
            warmup,
            runs,
            threads,
            batch_size,
            learning_rate,
            rows,
            python,
            dir,
        } => crate::bench::step::per_step(
            &crate::bench::step::StepBenchOptions {
                steps: *steps,
                warmup_steps: *warmup,
                runs: *runs,
                threads: threads.clone(),
                batch: *batch_size,
                learning_rate: *learning_rate,
                rows: *rows,
                python: python.clone(),
            },
            dir.as_deref(),
            json,
        ),
        _ => return Err(Error::internal("not a benchmark command")),
    }?;
    print!("{report}");
    Ok(())
}
