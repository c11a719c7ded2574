//! Commands that are more than one action's request and result: queries with output of their
//! own (`dag`), maintenance of the record (`reindex`, `recover`, `fsck`, `gc`, `storage`,
//! `audit`), keys and proofs (`verify`, `key`, `clone`), `reproduce` (one action per job),
//! `cancel`, `call`, `init`, `schemas` and the job programs. Each calls the OS, prints through
//! `print`, and turns what failed into the error (and exit code) of the command.

use std::io::Read;
use std::path::Path;

use serde_json::{Value, json};

use super::print::{self, actions, reports};
use super::{DagFormat, EnvCommand, JobCommand, KeyCommand};
use crate::model::{Caller, Role};
use crate::os::{Execute, Study};
use crate::util::error::{Error, Result};

/// `rsim init`: a template, an example, or the study's genesis (`faces::init`).
pub fn init(dir: &Path, example: Option<&str>, secret: Option<&str>, json: bool) -> Result<()> {
    // A malformed secret is refused before anything is written.
    if let Some(s) = secret {
        crate::os::owner::check_generator_secret(s)?;
    }
    let rep = crate::faces::init::init(dir, example)?;
    if let Some(s) = secret {
        crate::os::owner::share_generator_secret(dir, s)?;
    }
    if json {
        print::json(&serde_json::to_value(&rep)?)
    } else {
        reports::init(&rep, dir);
        Ok(())
    }
}

/// `rsim job …`: the job programs the runner starts.
pub fn job(kind: &JobCommand) -> Result<()> {
    match kind {
        JobCommand::Train { spec } => crate::train::train(spec),
        JobCommand::Eval { spec } => crate::train::eval(spec),
        JobCommand::StepBench { spec } => crate::train::step_bench(spec),
        JobCommand::Sandbox { file, command } => crate::jobs::sandbox::exec(file, command),
        JobCommand::Pretrain {
            out,
            seed,
            steps,
            family,
        } => {
            let report = crate::train::pretrain(out, *seed, *steps, *family)?;
            print::json(&report)
        }
    }
}

/// `rsim env …`: the study's job environment, from its rsim.toml alone.
pub fn env(dir: &Path, cmd: &EnvCommand, json: bool) -> Result<()> {
    let root = dir
        .canonicalize()
        .map_err(|e| Error::invalid(format!("{}: {e}", dir.display())))?;
    let config = crate::config::StudyConfig::load(&root)?;
    // Checking runs programs too (`nix flake metadata` fetches and copies into the store what
    // the clone's flake reference names, a folder outside the study or a remote flake), so it
    // is refused in a read-only clone like building and running; a clone's jobs record the
    // environment each ran in.
    crate::os::genesis::refuse_in_clone(
        &root,
        "`rsim env check` / `rsim env build` / `rsim env run`",
    )?;
    let label = match (cmd, config.environment.python()) {
        (EnvCommand::Run { command }, Some(cfg)) => {
            let pin = crate::jobs::pyenv::pin(&root, &cfg)?;
            let status = crate::jobs::pyenv::command_in(&pin, command)
                .current_dir(&root)
                .status()
                .map_err(|e| Error::invalid(format!("cannot run {:?}: {e}", command[0])))?;
            return match status.code() {
                Some(0) => Ok(()),
                _ => Err(Error::invalid(format!(
                    "{:?} failed ({status})",
                    command[0]
                ))),
            };
        }
        (EnvCommand::Run { .. }, None) => {
            return Err(Error::invalid(
                "rsim.toml: `rsim env run` needs [environment] kind = \"python\"",
            ));
        }
        (EnvCommand::Build { force }, Some(cfg)) => {
            crate::jobs::pyenv::build(&root, &cfg, *force)?.label()
        }
        // What a job's admission would pin (a Nix flake, a Python environment) or fingerprint.
        _ => crate::jobs::pin_environment(&root, &config.environment)?.map_or_else(
            || "host (fingerprinted per job program)".to_string(),
            |p| p.label(),
        ),
    };
    if json {
        print::json(&json!({ "env": label }))
    } else {
        println!("{label}");
        Ok(())
    }
}

/// `rsim dag`: the query's JSON, or the graph as DOT or text.
pub fn dag(study: &Study, req: Value, format: DagFormat, json: bool) -> Result<()> {
    let view = req["view"].as_str().unwrap_or("full").to_string();
    let out = study.call(&Caller::new("cli", Role::Observer), "dag", req)?;
    match (format, json) {
        (DagFormat::Json, _) | (_, true) => print::json(&out),
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
            print::dag::listing(&out);
            Ok(())
        }
    }
}

/// `rsim reindex`: rebuild the index from git; branches that are not this study's fail it.
pub fn reindex(study: &mut Study, json: bool) -> Result<()> {
    let t = std::time::Instant::now();
    let r = study.reindex()?;
    if json {
        print::json(
            &json!({ "nodes": r.nodes, "refused": r.refused, "seconds": t.elapsed().as_secs_f64() }),
        )?;
    } else {
        reports::reindex(r.nodes, &r.refused, t.elapsed().as_secs_f64());
    }
    if !r.refused.is_empty() {
        return Err(Error::internal(format!(
            "{} node branch(es) are not this study's history and were left out of the index (see above; `rsim fsck` and `rsim audit` report them)",
            r.refused.len()
        )));
    }
    Ok(())
}

/// `rsim cancel`: the `cancel_job` action.
pub fn cancel(study: &Study, who: &Caller, job: &str, json: bool) -> Result<()> {
    study.cancel_job(
        who,
        crate::api::types::CancelJobRequest {
            job: job.to_string(),
        },
    )?;
    if json {
        print::json(&json!({ "job": job, "cancel": "requested" }))?;
    } else {
        println!("cancel requested for {job}");
    }
    Ok(())
}

/// `rsim recover`: record orphaned jobs (with `--wait`, also those still queued or running).
pub fn recover(study: &Study, wait: bool, json: bool) -> Result<()> {
    // Opening the study recorded every orphaned job that has ended already.
    let n = if wait {
        study.wait_for_orphaned_jobs()?
    } else {
        study.recover_orphaned_jobs()?
    };
    if json {
        print::json(&json!({ "recorded": n }))?;
    } else {
        println!("recorded {n} orphaned job(s)");
    }
    Ok(())
}

/// `rsim verify`: every commit proven with the study's key; a problem fails the command.
pub fn verify(study: &Study, key: Option<&str>, json: bool) -> Result<()> {
    let rep = crate::os::verify::verify(study, key)?;
    if json {
        print::json(&serde_json::to_value(&rep)?)?;
    } else {
        reports::verify(&rep);
    }
    match &rep.first_bad {
        None if rep.problems.is_empty() => Ok(()),
        Some(c) => Err(Error::internal(format!(
            "commit {c} is not proven to be this study's ({} problem(s) above)",
            rep.problems.len()
        ))),
        None => Err(Error::internal(format!(
            "{} problem(s) above",
            rep.problems.len()
        ))),
    }
}

/// `rsim key show|publish|rotate`.
pub fn key(study: &mut Study, cmd: &KeyCommand, json: bool) -> Result<()> {
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
                return print::json(&v);
            }
            reports::key_show(&rep, study.read_only());
            Ok(())
        }
        KeyCommand::Publish => {
            let oid = study.publish_key()?;
            if json {
                return print::json(&json!({ "commit": oid.to_string() }));
            }
            println!(
                "published the study's public key on main ({oid}); clones prove commits with `rsim verify`"
            );
            Ok(())
        }
        KeyCommand::Rotate => {
            let (oid, old, new) = study.rotate_key()?;
            if json {
                return print::json(
                    &json!({ "commit": oid.to_string(), "retired": old, "in_force": new }),
                );
            }
            println!("rotated the study's key on main ({oid}): {old} retired, {new} in force");
            Ok(())
        }
    }
}

/// `rsim clone` (the work is `os::verify::clone`): what was cloned and how it verified.
pub fn clone_study(url: &str, dir: Option<&Path>, json: bool) -> Result<()> {
    let (dir, study, rep) = crate::os::verify::clone(url, dir)?;
    let nodes = rep.nodes;
    if json {
        print::json(&json!({
            "dir": dir, "nodes": nodes, "verify": rep, "read_only": study.read_only(),
        }))?;
    } else {
        reports::cloned(url, &dir, &rep);
    }
    // As `rsim verify`: a problem fails the command (the copy stays, for reading with care).
    match rep.first_bad {
        Some(c) => Err(Error::internal(format!(
            "the clone holds commit {c}, which is not proven to be this study's (see above)"
        ))),
        None if !rep.problems.is_empty() => Err(Error::internal(format!(
            "the clone at {} is not proven whole: {} problem(s) above",
            dir.display(),
            rep.problems.len()
        ))),
        None => Ok(()),
    }
}

/// `rsim audit`: attempts, rejections, and whether a hack got through.
pub fn audit(study: &Study, json: bool) -> Result<()> {
    let rep = crate::os::audit::audit(study)?;
    if json {
        print::json(&serde_json::to_value(&rep)?)
    } else {
        reports::audit(&rep);
        Ok(())
    }
}

/// `rsim storage`: bytes per study and per agent against the budgets.
pub fn storage(study: &Study, json: bool) -> Result<()> {
    let u = study.storage_use()?;
    if json {
        print::json(&serde_json::to_value(&u)?)
    } else {
        reports::storage(&u);
        Ok(())
    }
}

/// `rsim gc`: remove what nothing references (or say what would go, with --dry-run).
pub fn gc(study: &Study, dry_run: bool, grace: u64, json: bool) -> Result<()> {
    let rep = study.gc(dry_run, std::time::Duration::from_secs(grace))?;
    if json {
        print::json(&serde_json::to_value(&rep)?)
    } else {
        reports::gc(&rep, dry_run, grace);
        Ok(())
    }
}

/// `rsim fsck`: check the record; a problem fails the command.
pub fn fsck(study: &Study, json: bool) -> Result<()> {
    let rep = crate::os::fsck::fsck(study)?;
    if json {
        print::json(&serde_json::to_value(&rep)?)?;
    } else {
        reports::fsck(&rep);
    }
    if rep.problems.is_empty() {
        Ok(())
    } else {
        Err(Error::internal(format!(
            "the record has {} problems",
            rep.problems.len()
        )))
    }
}

/// `rsim call ACTION [ARGS|-]`: any action from its JSON request; prints the JSON result.
pub fn call(study: &Study, who: &Caller, action: &str, args: Option<&str>) -> Result<()> {
    let text = match args {
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
    print::json(&out)
}

/// `rsim reproduce`: one reproduce action per run_sft (each its own job and commit).
pub fn reproduce(
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
            actions::reproduced(node, seq, &r);
        }
        out.push(r);
    }
    if json {
        print::json(&Value::Array(out))?;
    }
    if all_identical {
        Ok(())
    } else {
        Err(Error::internal(
            "a reproduction did not give the identical checkpoint (see above; recorded with reproduce)",
        ))
    }
}

/// `rsim schemas`: write the JSON Schemas (or, with --check, fail when they are stale).
pub fn schemas(out: &Path, check: bool) -> Result<()> {
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
