//! The owner's `rsim.toml` on `main` outside actions. An owner changes the study's config by
//! committing `rsim.toml` on `main` with git; these functions do the same through the record's
//! repository, for tools that set a config before they measure (`rsim bench-cli` commits
//! `[record] fsync` and a node budget). The commit is an owner commit like one made with git:
//! unsigned, and listed as such by `rsim verify`.

use std::path::Path;

use crate::config::{CONFIG_FILE, StudyConfig};
use crate::record::{MAIN_REF, Record};
use crate::util::error::{Error, Result};

/// The text of `rsim.toml` as committed on `main` of the study at `root`.
pub fn committed_config_text(root: &Path) -> Result<String> {
    let record = Record::open(root)?;
    let repo = record.repo();
    let main = repo.find_commit(record.main_tip()?)?;
    let entry = main
        .tree()?
        .get_name(CONFIG_FILE)
        .ok_or_else(|| Error::internal(format!("{CONFIG_FILE} is not committed on main")))?
        .id();
    let blob = crate::record::blob_at_most(repo, entry, crate::record::MAX_OWNER_FILE)
        .map_err(|e| e.context(format!("{CONFIG_FILE} on main")))?;
    Ok(String::from_utf8_lossy(blob.content()).into_owned())
}

/// Commit `text` as `rsim.toml` on `main` (one commit by `author` — name and email — with
/// `message`, on the tip of `main`) and write it to the work tree, after checking that it is a
/// valid study config; a config that is not changes nothing. The committed config applies to
/// every study opened after. Returns the commit's id.
pub fn commit_config(
    root: &Path,
    text: &str,
    author: (&str, &str),
    message: &str,
) -> Result<String> {
    let record = Record::open(root)?;
    StudyConfig::parse(text, CONFIG_FILE)?;
    std::fs::write(root.join(CONFIG_FILE), text)?;
    let repo = record.repo();
    let main = repo.find_commit(record.main_tip()?)?;
    let blob = repo.blob(text.as_bytes())?;
    let mut tb = repo.treebuilder(Some(&main.tree()?))?;
    tb.insert(CONFIG_FILE, blob, i32::from(git2::FileMode::Blob))?;
    let tree = repo.find_tree(tb.write()?)?;
    let sig = git2::Signature::now(author.0, author.1)?;
    let oid = repo.commit(Some(MAIN_REF), &sig, &sig, message, &tree, &[&main])?;
    Ok(oid.to_string())
}

/// A generator secret is 32 hexadecimal digits.
pub fn check_generator_secret(secret: &str) -> Result<()> {
    if secret.len() != 32 || !secret.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::invalid(
            "a generator secret is 32 hexadecimal digits",
        ));
    }
    Ok(())
}

/// Give the study at `root` the generator secret `secret` (32 hex digits) before it draws any
/// generated data, so that studies given one secret draw the same rows for the same generator
/// request: `rsim bench-strategies` gives every strategy's study of one seed the same secret, so
/// strategies are compared on the same data. Without effect when the study holds that secret
/// already; refused when it holds another (its data was drawn from that one).
pub fn share_generator_secret(root: &Path, secret: &str) -> Result<()> {
    check_generator_secret(secret)?;
    let path = crate::model::paths::secret_path(root);
    let held = |path: &Path| -> Result<()> {
        let have = std::fs::read(path).map_err(|e| {
            Error::internal(format!(
                "cannot read the study secret {}: {e}",
                path.display()
            ))
        })?;
        if have == secret.as_bytes() {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "{}: the study has a generator secret of its own already (its data was drawn \
                 with it)",
                root.display()
            )))
        }
    };
    if path.exists() {
        return held(&path);
    }
    use std::io::Write;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(mut f) => f.write_all(secret.as_bytes()).map_err(|e| {
            Error::internal(format!(
                "cannot write the study secret {}: {e}",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => held(&path),
        Err(e) => Err(Error::internal(format!(
            "cannot create the study secret {}: {e}",
            path.display()
        ))),
    }
}
