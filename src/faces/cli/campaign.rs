//! Campaigns and their reports: `rsim run` (a study from an example folder if asked, the
//! campaign run or resumed, the report) and `rsim report` (text, JSON, or the web page as one
//! HTML file).

use std::path::{Path, PathBuf};

use serde_json::json;

use super::{Cli, Command, print};
use crate::os::Study;
use crate::util::error::{Error, Result};

/// `rsim report`: what a campaign found, and with --html the page as one file.
pub fn report(dir: &Path, html: Option<&Path>, task: Option<&str>, json: bool) -> Result<()> {
    let study = Study::open(dir)?;
    let rep = crate::campaign::report::build(&study, task)?;
    if let Some(h) = html {
        write_html(h, &study)?;
    }
    if json {
        print::json(&serde_json::to_value(&rep)?)
    } else {
        print!("{}", crate::campaign::report::text(&rep));
        Ok(())
    }
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
pub fn run_campaign(cli: &Cli, json: bool) -> Result<()> {
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
        recipe,
        lockstep,
        html,
        quiet,
    } = &cli.command
    else {
        return Err(Error::internal("run_campaign called for another command"));
    };
    let path = path.clone().unwrap_or_else(|| super::study_dir(cli));
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
    o.recipe = recipe.clone();
    o.lockstep = *lockstep;
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
        print::json(&json!({ "summary": summary, "report": rep }))
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
