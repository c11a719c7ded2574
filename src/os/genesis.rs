//! Genesis: the study's first two commits — `main` with the owner's `rsim.toml` (and README,
//! .gitignore), then the root node `n0` whose `init` action records the base model's checkpoint —
//! written through the same commit protocol as every other action. The `rsim init` face only
//! writes templates and copies examples before calling this.

use std::fs;
use std::path::{Path, PathBuf};

use crate::config::{CONFIG_FILE, StudyConfig};
use crate::model::paths::{self, STATE_DIR};
use crate::model::*;
use crate::record::Record;
use crate::record::TreeFile;
use crate::record::commit::{FirstAction, NodeId, Writer};
use crate::record::index::Index;
use crate::record::store::ObjectStore;
use crate::util::error::{Error, IoContext, Result};

#[derive(Debug, serde::Serialize)]
pub struct InitReport {
    pub root: PathBuf,
    pub created: bool,
    pub base_checkpoint: Option<String>,
    pub message: String,
}

/// Whether `dir` holds a study already: a git repository whose `main` has commits (`rsim init`
/// changes nothing there).
pub fn is_study(dir: &Path) -> bool {
    Record::open(dir).is_ok_and(|r| r.main_tip().is_ok())
}

/// Make the directory `root` (holding a filled-in `rsim.toml`, the base checkpoint and the eval
/// sets it names) a study. Refuses, changing nothing in git, when the config or a file it names
/// is wrong.
pub fn create_study(root: &Path) -> Result<InitReport> {
    let root = root.canonicalize().at("cannot resolve", root)?;
    if is_study(&root) {
        return Err(Error::invalid(format!(
            "{} is already a study (main has commits); nothing was changed",
            root.display()
        )));
    }
    let config_path = root.join(CONFIG_FILE);
    let text = fs::read_to_string(&config_path).at("cannot read", &config_path)?;
    let config = StudyConfig::parse(&text, CONFIG_FILE)?;
    // A Python environment is built from its lock now (or found built and checked), so the
    // study's first job does not wait for pip, and a lock that cannot be built stops here.
    if let Some(cfg) = config.environment.python() {
        crate::jobs::pyenv::build(&root, &cfg, false)?;
    }
    let base_path = root.join(&config.base_model.path);
    if !base_path.exists() {
        return Err(Error::invalid(format!(
            "{CONFIG_FILE}: key `base_model.path`: {} does not exist; put the base checkpoint there",
            config.base_model.path
        )));
    }
    for (name, t) in &config.tasks {
        for (split, set) in t.splits() {
            let p = root.join(&set.path);
            if !p.is_file() {
                return Err(Error::invalid(format!(
                    "{CONFIG_FILE}: key `tasks.{name}.{split}.path`: {} does not exist",
                    set.path
                )));
            }
            if let Some(pin) = &set.sha256 {
                let actual = crate::util::hash::sha256_file(&p)?;
                if &actual != pin {
                    return Err(Error::invalid(format!(
                        "{CONFIG_FILE}: key `tasks.{name}.{split}.sha256`: pinned {pin}, but {} hashes to {actual}",
                        set.path
                    )));
                }
            }
        }
        refuse_overlapping_splits(&root, name, t, &config.policy)?;
    }

    // The object store and the base checkpoint.
    let state = paths::state_dir(&root);
    fs::create_dir_all(&state).at("cannot create", &state)?;
    let store = ObjectStore::new(paths::objects_dir(&root));
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
    // The public half of the study's key: any clone proves every commit with it.
    if let Some(text) = rec.signers_text()? {
        let path = root.join(crate::record::signing::SIGNERS_FILE);
        fs::write(&path, &text).at("cannot write", &path)?;
        files.push(TreeFile::new(crate::record::signing::SIGNERS_FILE, text));
        rec.configure_git_verification()?;
    }
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
    rec.pin_genesis()?;
    let index = Index::open(&paths::index_path(&root))?;
    crate::os::mark_index_ours(&paths::index_path(&root));
    let writer = Writer::new(&rec, &index);
    let owner = Caller::new("owner", Role::Owner);
    let request = serde_json::json!({ "base_model": config.base_model });
    writer.create(NodeId::Exactly(ROOT_NODE.into()), &[main], &[], |id| {
        let at = now_rfc3339();
        Ok(FirstAction {
            meta: NodeMeta {
                id: id.to_string(),
                title: format!("base: {}", config.base_model.name),
                hypothesis: config.study.description.clone(),
                parents: Vec::new(),
                status: NodeStatus::Open,
                created_at: at.clone(),
                created_by: owner.agent.clone(),
                outcome: None,
            },
            record: ActionRecord {
                seq: 1,
                action: ActionName::Init,
                node: id.to_string(),
                agent: owner.agent.clone(),
                role: owner.role,
                at,
                summary: format!(
                    "base model {} ({})",
                    config.base_model.name,
                    &base_sha[..12]
                ),
                request: request.clone(),
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
            },
            body: format!("Base checkpoint {base_sha}."),
        })
    })?;
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

/// The splits of a task must be disjoint in the task's own sense of "the same item" — the gate's
/// (canonical text, n-grams, the task's normal form: `12+34` is `34+12`): per-item dev results
/// would otherwise show protected items with their answers, and each tripwire would compare two
/// splits that share items. Every pair is checked; the refusal gives each pair's count.
fn refuse_overlapping_splits(
    root: &Path,
    name: &str,
    t: &crate::config::TaskConfig,
    policy: &crate::config::PolicyConfig,
) -> Result<()> {
    let mut splits = Vec::new();
    for (split, set) in t.splits() {
        let p = root.join(&set.path);
        let bytes = fs::read(&p).at("cannot read", &p)?;
        let what = format!("task {name} {split} split");
        // A code task's items carry their hidden tests: checked now, not at its first evaluation.
        if t.metric == crate::train::programs::METRIC {
            crate::train::programs::parse_items(&bytes, &what)?;
        }
        let rows = crate::train::datasets::parse_eval_jsonl(&bytes, &what)?;
        splits.push((split, rows));
    }
    let cfg = crate::policy::contamination::ScanConfig {
        ngram: policy.contamination_ngram as usize,
        threshold: policy.contamination_threshold,
    };
    let mut shared = Vec::new();
    for (i, (a, rows_a)) in splits.iter().enumerate() {
        for (b, rows_b) in &splits[i + 1..] {
            let n = crate::policy::contamination::shared_items(rows_a, rows_b, cfg, t.normal_form);
            if n > 0 {
                shared.push(format!("{a} and {b} share {n} item(s)"));
            }
        }
    }
    if !shared.is_empty() {
        return Err(Error::invalid(format!(
            "{CONFIG_FILE}: task {name}: its splits must be disjoint (items compared as the \
             contamination gate compares them{}), but {}; regenerate them apart",
            if t.normal_form.is_some() {
                ", in the task's normal form"
            } else {
                ""
            },
            shared.join(", ")
        )));
    }
    Ok(())
}

fn tempdir_in(dir: &Path) -> Result<PathBuf> {
    let p = dir.join(format!("tmp-{:016x}", rand::random::<u64>()));
    fs::create_dir_all(&p).at("cannot create", &p)?;
    Ok(p)
}

/// What runs the programs and writes the folders a study's rsim.toml names outside any action
/// (`rsim env build`, `rsim env run`) is refused in a read-only clone: there that file is
/// someone else's, and nothing of a cloned repository acts on this machine until it is one's own
/// study. A directory that is no study yet (before `rsim init`) is the caller's own.
pub fn refuse_in_clone(root: &Path, what: &str) -> Result<()> {
    if !is_study(root) {
        return Ok(());
    }
    match crate::os::Study::open(root)?.read_only() {
        Some(why) => Err(Error::invalid(format!(
            "{what} is refused in a read-only clone ({why}): it would run the programs and write the folders \
             this clone's rsim.toml names, which are not yours"
        ))),
        None => Ok(()),
    }
}
