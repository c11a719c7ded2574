//! `rsim init`: create a study — a git repository with `rsim.toml` on `main`, the object store,
//! and the root node `n0` whose `init` action records the base model's checkpoint hash.

use std::fs;
use std::path::{Path, PathBuf};

use crate::api::STATE_DIR;
use crate::api::types::{AnswerFormat, ArithOp, ArithParams};
use crate::config::{CONFIG_FILE, StudyConfig};
use crate::error::{Error, IoContext, Result};
use crate::index::Index;
use crate::model::*;
use crate::record::{self, Record, TreeFile};
use crate::store::ObjectStore;

pub const EXAMPLES: &[&str] = &["tiny-arith", "tiny-arith-ngram"];

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

[jobs]
# Commands; the job spec JSON path is appended as the last argument.
sft = ["python3", "recipes/sft.py"]
evaluate = ["python3", "recipes/eval.py"]
"#;

#[derive(Debug, serde::Serialize)]
pub struct InitReport {
    pub root: PathBuf,
    /// False when only a template rsim.toml was written.
    pub created: bool,
    pub base_checkpoint: Option<String>,
    pub message: String,
}

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
        Some("tiny-arith") => materialize_tiny_arith(&root)?,
        Some("tiny-arith-ngram") => materialize_tiny_arith_ngram(&root)?,
        _ => {}
    }
    let text = fs::read_to_string(&config_path).at("cannot read", &config_path)?;
    let config = StudyConfig::parse(&text, CONFIG_FILE)?;
    let base_path = root.join(&config.base_model.path);
    if !base_path.exists() {
        return Err(Error::invalid(format!(
            "{CONFIG_FILE}: key `base_model.path`: {} does not exist; put the base checkpoint there",
            config.base_model.path
        )));
    }
    for (name, t) in &config.tasks {
        for (split, set) in [("dev", &t.dev), ("test", &t.test)] {
            let p = root.join(&set.path);
            if !p.is_file() {
                return Err(Error::invalid(format!(
                    "{CONFIG_FILE}: key `tasks.{name}.{split}.path`: {} does not exist",
                    set.path
                )));
            }
            if let Some(pin) = &set.sha256 {
                let actual = crate::store::sha256_file(&p)?;
                if &actual != pin {
                    return Err(Error::invalid(format!(
                        "{CONFIG_FILE}: key `tasks.{name}.{split}.sha256`: pinned {pin}, but {} hashes to {actual}",
                        set.path
                    )));
                }
            }
        }
    }

    // The object store and the base checkpoint.
    let state = root.join(STATE_DIR);
    fs::create_dir_all(&state).at("cannot create", &state)?;
    let store = ObjectStore::new(state.join("objects"));
    let base_sha = if base_path.is_dir() {
        store.put_dir(&base_path)?
    } else {
        let tmp = tempdir_in(&state)?;
        let name = base_path
            .file_name()
            .map_or("model".into(), |n| n.to_string_lossy().into_owned());
        fs::copy(&base_path, tmp.join(&name)).at("cannot copy", &base_path)?;
        let sha = store.put_dir(&tmp)?;
        fs::remove_dir_all(&tmp).at("cannot remove", &tmp)?;
        sha
    };

    // The record: main holds what the owner controls; n0 is the base model.
    let rec = Record::init(&root)?;
    let mut files = vec![
        TreeFile::new(CONFIG_FILE, text.clone()),
        TreeFile::new(
            ".gitignore",
            format!(
                "/{STATE_DIR}/\n/{}/\n",
                config.base_model.path.trim_matches('/')
            ),
        ),
    ];
    let readme = root.join("README.md");
    if readme.is_file() {
        files.push(TreeFile::new(
            "README.md",
            fs::read(&readme).at("cannot read", &readme)?,
        ));
    }
    let gitignore = root.join(".gitignore");
    if !gitignore.exists() {
        fs::write(
            &gitignore,
            format!(
                "/{STATE_DIR}/\n/{}/\n",
                config.base_model.path.trim_matches('/')
            ),
        )
        .at("cannot write", &gitignore)?;
    }
    let main = rec.commit_main(
        &files,
        &format!(
            "init: study {}\n\n{}\n",
            config.study.name, config.study.description
        ),
    )?;
    let at = now_rfc3339();
    let meta = NodeMeta {
        id: crate::api::ROOT_NODE.into(),
        title: format!("base: {}", config.base_model.name),
        hypothesis: config.study.description.clone(),
        parents: Vec::new(),
        status: NodeStatus::Open,
        created_at: at.clone(),
        created_by: "owner".into(),
        outcome: None,
    };
    let action = ActionRecord {
        seq: 1,
        action: ActionName::Init,
        node: meta.id.clone(),
        agent: "owner".into(),
        role: Role::Owner,
        at,
        summary: format!(
            "base model {} ({})",
            config.base_model.name,
            &base_sha[..12]
        ),
        request: serde_json::json!({ "base_model": config.base_model }),
        decision: Decision::accept(),
        result: Some(serde_json::json!({ "base_checkpoint": base_sha })),
        job: None,
        artifacts: vec![ArtifactRef {
            sha256: base_sha.clone(),
            kind: ArtifactKind::Checkpoint,
            name: "base".into(),
            parent: None,
        }],
        metrics: Vec::new(),
        refers_to: Vec::new(),
    };
    let msg = record::commit_message(&action, &format!("Base checkpoint {base_sha}."), &[]);
    let index = Index::open(&state.join("index.sqlite"))?;
    index.mark_pending(&meta.id)?;
    match rec.create_node(&meta, &action, &[main], &msg)? {
        record::Create::Created(_) => {}
        _ => return Err(Error::conflict("the root node already exists")),
    }
    index.sync_node(&rec, &meta.id)?;
    Ok(InitReport {
        root,
        created: true,
        base_checkpoint: Some(base_sha),
        message: format!(
            "study {:?} created; root node n0 is the base model",
            config.study.name
        ),
    })
}

fn tempdir_in(dir: &Path) -> Result<PathBuf> {
    let p = dir.join(format!("tmp-{:016x}", rand::random::<u64>()));
    fs::create_dir_all(&p).at("cannot create", &p)?;
    Ok(p)
}

/// Generate a task's eval splits into `.rsim/protected/<task>/`; returns their sha256 pins.
fn write_eval_sets(root: &Path, task: &str, digits: u32) -> Result<[String; 2]> {
    let prot = root.join(STATE_DIR).join("protected").join(task);
    fs::create_dir_all(&prot).at("cannot create", &prot)?;
    let mut pins = [String::new(), String::new()];
    for (i, (split, n, seed)) in [("dev", 200, 1001), ("test", 500, 2002)]
        .into_iter()
        .enumerate()
    {
        let rows = crate::datasets::generate_arith(&ArithParams {
            op: ArithOp::Add,
            digits,
            format: AnswerFormat::Plain,
            n,
            seed,
        });
        let bytes = crate::datasets::to_jsonl(&rows)?;
        let p = prot.join(format!("{split}.jsonl"));
        fs::write(&p, &bytes).at("cannot write", &p)?;
        pins[i] = crate::store::sha256_hex(&bytes);
    }
    Ok(pins)
}

fn write_example_config(root: &Path, toml: &str, readme: &str, pins: &[String; 2]) -> Result<()> {
    let evaluator =
        crate::api::evaluator_fingerprint(root, &["@rsim".into(), "job".into(), "eval".into()])?;
    let toml = toml
        .replace("@DEV_SHA256@", &pins[0])
        .replace("@TEST_SHA256@", &pins[1])
        .replace("@EVALUATOR_SHA256@", &evaluator);
    fs::write(root.join(CONFIG_FILE), toml).at("cannot write", root)?;
    fs::write(root.join("README.md"), readme).at("cannot write", root)?;
    Ok(())
}

/// The tiny-arith example: a tiny-gpt base model (shipped: `rsim job pretrain --seed 0` made it)
/// and three-digit addition with a protected test split.
fn materialize_tiny_arith(root: &Path) -> Result<()> {
    let pins = write_eval_sets(root, "add3", 3)?;
    let base = root.join("models").join("base");
    fs::create_dir_all(&base).at("cannot create", &base)?;
    fs::write(
        base.join(crate::trainer::CONFIG_FILE),
        include_bytes!("../examples/tiny-arith/base/config.json"),
    )
    .at("cannot write", &base)?;
    fs::write(
        base.join(crate::gpt::WEIGHTS_FILE),
        include_bytes!("../examples/tiny-arith/base/model.safetensors"),
    )
    .at("cannot write", &base)?;
    write_example_config(
        root,
        include_str!("../examples/tiny-arith/rsim.toml"),
        include_str!("../examples/tiny-arith/README.md"),
        &pins,
    )
}

/// The tiny-arith-ngram example: the fast placeholder model and two-digit addition.
fn materialize_tiny_arith_ngram(root: &Path) -> Result<()> {
    let pins = write_eval_sets(root, "add2", 2)?;
    crate::trainer::write_base_model(&root.join("models").join("base"))?;
    write_example_config(
        root,
        include_str!("../examples/tiny-arith-ngram/rsim.toml"),
        include_str!("../examples/tiny-arith-ngram/README.md"),
        &pins,
    )
}
