//! `rsim init`: create a study — a git repository with `rsim.toml` on `main`, the object store,
//! and the root node `n0` whose `init` action records the base model's checkpoint hash.

use std::fs;
use std::path::Path;

use crate::api::types::{AnswerFormat, ArithOp, ArithParams};
use crate::config::CONFIG_FILE;
use crate::os::STATE_DIR;
use crate::record::Record;
use crate::util::error::{Error, IoContext, Result};

pub const EXAMPLES: &[&str] = &["tiny-arith", "tiny-add2", "tiny-arith-ngram"];

const TEMPLATE: &str = r#"# rsim study config. Fill in the base model and tasks, then run `rsim init` again.

[study]
name = "my-study"
description = ""

[base_model]
name = "base"
# A file or directory (relative to the study root) holding the base checkpoint.
path = "models/base"

# [tasks.NAME]
# metric = "exact_match"
# dev = { path = "eval/NAME/dev.jsonl" }          # visible split
# test = { path = "eval/NAME/test.jsonl" }        # protected split (aggregate scores only)

[budgets]
compute_seconds = 36000
evaluations = 1000
test_evaluations_per_node = 2
max_nodes = 10000
# Registered datasets together (derived ones included): rows and stored bytes.
dataset_rows = 5000000
dataset_storage_bytes = 2147483648
# Per agent (one agent cannot take the study's whole budget).
agent_dataset_rows = 2000000
agent_dataset_storage_bytes = 536870912

[jobs]
# Commands; the job spec JSON path is appended as the last argument.
sft = ["python3", "recipes/sft.py"]
evaluate = ["python3", "recipes/eval.py"]
"#;

pub use crate::os::genesis::InitReport;

pub fn init(dir: &Path, example: Option<&str>) -> Result<InitReport> {
    if let Some(ex) = example
        && !EXAMPLES.contains(&ex)
    {
        return Err(Error::invalid(format!(
            "unknown example {ex:?}; examples: {}",
            EXAMPLES.join(", ")
        )));
    }
    if let Ok(r) = Record::open(dir)
        && r.main_tip().is_ok()
    {
        return Err(Error::invalid(format!(
            "{} is already a study (main has commits); nothing was changed",
            dir.display()
        )));
    }
    let config_path = dir.join(CONFIG_FILE);
    if example.is_some() && config_path.exists() {
        return Err(Error::invalid(format!(
            "{} already exists; an example needs an empty directory",
            config_path.display()
        )));
    }
    fs::create_dir_all(dir).at("cannot create", dir)?;
    let root = dir.canonicalize().at("cannot resolve", dir)?;
    if example.is_none() && !config_path.exists() {
        fs::write(&config_path, TEMPLATE).at("cannot write", &config_path)?;
        return Ok(InitReport {
            root: root.clone(),
            created: false,
            base_checkpoint: None,
            message: format!(
                "wrote a template {}: fill in the base model and tasks, then run `rsim init {}` again",
                config_path.display(),
                dir.display()
            ),
        });
    }
    match example {
        Some("tiny-arith") => materialize_tiny_gpt(
            &root,
            ("add3", 3),
            include_str!("../../examples/tiny-arith/rsim.toml"),
            include_str!("../../examples/tiny-arith/README.md"),
        )?,
        Some("tiny-add2") => materialize_tiny_gpt(
            &root,
            ("add2", 2),
            include_str!("../../examples/tiny-add2/rsim.toml"),
            include_str!("../../examples/tiny-add2/README.md"),
        )?,
        Some("tiny-arith-ngram") => materialize_tiny_arith_ngram(&root)?,
        _ => {}
    }
    crate::os::genesis::create_study(&root)
}

/// Generate a task's eval splits into `.rsim/protected/<task>/`: dev (visible), test (protected)
/// and sealed (the tripwire's: drawn from the test split's distribution, never shown to anyone);
/// returns their sha256 pins.
fn write_eval_sets(root: &Path, task: &str, digits: u32) -> Result<[String; 3]> {
    let prot = root.join(STATE_DIR).join("protected").join(task);
    fs::create_dir_all(&prot).at("cannot create", &prot)?;
    let mut pins = [String::new(), String::new(), String::new()];
    // Disjoint by construction: each split is drawn from what the earlier ones do not hold, so
    // per-item dev results reveal no test or sealed item.
    let mut seen = std::collections::HashSet::new();
    for (i, (split, n, seed)) in [
        ("dev", 200u64, 1001),
        ("test", 500, 2002),
        ("sealed", 500, 3003),
    ]
    .into_iter()
    .enumerate()
    {
        let rows: Vec<_> = crate::train::datasets::generate_arith(&ArithParams {
            op: ArithOp::Add,
            digits,
            format: AnswerFormat::Plain,
            n: n * 3,
            seed,
        })
        .into_iter()
        .filter(|r| seen.insert(r.prompt.clone()))
        .take(n as usize)
        .collect();
        let bytes = crate::train::datasets::to_jsonl(&rows)?;
        let p = prot.join(format!("{split}.jsonl"));
        fs::write(&p, &bytes).at("cannot write", &p)?;
        pins[i] = crate::util::hash::sha256_hex(&bytes);
    }
    Ok(pins)
}

fn write_example_config(root: &Path, toml: &str, readme: &str, pins: &[String; 3]) -> Result<()> {
    let evaluator =
        crate::os::evaluator_fingerprint(root, &["@rsim".into(), "job".into(), "eval".into()])?;
    let toml = toml
        .replace("@DEV_SHA256@", &pins[0])
        .replace("@TEST_SHA256@", &pins[1])
        .replace("@SEALED_SHA256@", &pins[2])
        .replace("@EVALUATOR_SHA256@", &evaluator);
    fs::write(root.join(CONFIG_FILE), toml).at("cannot write", root)?;
    fs::write(root.join("README.md"), readme).at("cannot write", root)?;
    Ok(())
}

/// The tiny-gpt examples (tiny-arith, tiny-add2): the shipped tiny-gpt base model (`rsim job
/// pretrain --seed 0` made it) and an addition task with a protected test split.
fn materialize_tiny_gpt(root: &Path, task: (&str, u32), toml: &str, readme: &str) -> Result<()> {
    let pins = write_eval_sets(root, task.0, task.1)?;
    let base = root.join("models").join("base");
    fs::create_dir_all(&base).at("cannot create", &base)?;
    fs::write(
        base.join(crate::train::CONFIG_FILE),
        include_bytes!("../../examples/tiny-arith/base/config.json"),
    )
    .at("cannot write", &base)?;
    fs::write(
        base.join(crate::train::gpt::WEIGHTS_FILE),
        include_bytes!("../../examples/tiny-arith/base/model.safetensors"),
    )
    .at("cannot write", &base)?;
    write_example_config(root, toml, readme, &pins)
}

/// The tiny-arith-ngram example: the fast placeholder model and two-digit addition.
fn materialize_tiny_arith_ngram(root: &Path) -> Result<()> {
    let pins = write_eval_sets(root, "add2", 2)?;
    crate::train::write_base_model(&root.join("models").join("base"))?;
    write_example_config(
        root,
        include_str!("../../examples/tiny-arith-ngram/rsim.toml"),
        include_str!("../../examples/tiny-arith-ngram/README.md"),
        &pins,
    )
}
