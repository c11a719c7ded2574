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

/// Make the directory `root` (holding a filled-in `rsim.toml`, the base checkpoint and the eval
/// sets it names) a study. Refuses, changing nothing in git, when the config or a file it names
/// is wrong.
pub fn create_study(root: &Path) -> Result<InitReport> {
    let root = root.canonicalize().at("cannot resolve", root)?;
    if let Ok(r) = Record::open(&root)
        && r.main_tip().is_ok()
    {
        return Err(Error::invalid(format!(
            "{} is already a study (main has commits); nothing was changed",
            root.display()
        )));
    }
    let config_path = root.join(CONFIG_FILE);
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
                let actual = crate::util::hash::sha256_file(&p)?;
                if &actual != pin {
                    return Err(Error::invalid(format!(
                        "{CONFIG_FILE}: key `tasks.{name}.{split}.sha256`: pinned {pin}, but {} hashes to {actual}",
                        set.path
                    )));
                }
            }
        }
        refuse_overlapping_splits(&root, name, t)?;
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
    let index = Index::open(&paths::index_path(&root))?;
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

/// Per-item dev results are shown to agents: a dev item that is also a test item hands out a
/// protected item with its answer. The splits must be disjoint (prompts compared with case,
/// whitespace and Unicode compatibility forms folded).
fn refuse_overlapping_splits(root: &Path, name: &str, t: &crate::config::TaskConfig) -> Result<()> {
    let read = |rel: &str, split: &str| -> Result<Vec<crate::model::data::Row>> {
        let p = root.join(rel);
        let bytes = fs::read(&p).at("cannot read", &p)?;
        crate::train::datasets::parse_jsonl(&bytes, &format!("task {name} {split} split"))
    };
    let fold = |s: &str| -> String {
        s.chars()
            .flat_map(char::to_lowercase)
            .filter(|c| !c.is_whitespace())
            .collect()
    };
    let dev: std::collections::HashSet<String> = read(&t.dev.path, "dev")?
        .iter()
        .map(|r| fold(&r.prompt))
        .collect();
    let shared = read(&t.test.path, "test")?
        .iter()
        .filter(|r| dev.contains(&fold(&r.prompt)))
        .count();
    if shared > 0 {
        return Err(Error::invalid(format!(
            "{CONFIG_FILE}: task {name}: the dev and test splits share {shared} item(s); per-item dev results would reveal them, so the splits must be disjoint"
        )));
    }
    Ok(())
}

fn tempdir_in(dir: &Path) -> Result<PathBuf> {
    let p = dir.join(format!("tmp-{:016x}", rand::random::<u64>()));
    fs::create_dir_all(&p).at("cannot create", &p)?;
    Ok(p)
}
