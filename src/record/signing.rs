//! Commits this study can prove it wrote: every commit of the record carries git's own SSH
//! signature (the `gpgsig` header, namespace `git`, SHA-512), made with the study's ed25519 key.
//! The key lives outside git (`.rsim/keys/`, mode 0600); `git verify-commit` and
//! `git log --show-signature` check it against the study's allowed-signers file, which the
//! repository's config names. A commit that is unsigned, or signed by any other key (another
//! study's history fetched in, or a commit forged around rsim), is not this study's: rsim refuses
//! to index it, and fsck and the audit report it.

use std::fs;
use std::path::{Path, PathBuf};

use git2::{Oid, Repository};
use ssh_key::{Algorithm, HashAlg, LineEnding, PrivateKey, SshSig};

use crate::model::paths;
use crate::util::error::{Error, IoContext, Result};

/// The namespace git signs commits in (`git -c gpg.format=ssh commit -S`).
const NAMESPACE: &str = "git";
/// The principal the allowed-signers file names (git shows it in `--show-signature`).
const PRINCIPAL: &str = "rsim@study";

/// The study's signing key.
pub struct StudyKey {
    key: PrivateKey,
}

impl std::fmt::Debug for StudyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StudyKey({})", self.fingerprint())
    }
}

impl StudyKey {
    /// Make a new key for the study at `root` and write it (and the allowed-signers file) under
    /// `.rsim/keys/`. Refuses to replace a key that is already there.
    pub fn create(root: &Path) -> Result<StudyKey> {
        let path = paths::signing_key_path(root);
        if path.exists() {
            return Err(Error::invalid(format!(
                "{} already exists: a study's signing key is never replaced",
                path.display()
            )));
        }
        let dir = path.parent().unwrap_or(root).to_path_buf();
        fs::create_dir_all(&dir).at("cannot create", &dir)?;
        let mut rng = ssh_key::rand_core::OsRng;
        let key = PrivateKey::random(&mut rng, Algorithm::Ed25519)
            .map_err(|e| Error::internal(format!("cannot make a signing key: {e}")))?;
        let pem = key
            .to_openssh(LineEnding::LF)
            .map_err(|e| Error::internal(format!("cannot encode the signing key: {e}")))?;
        write_private(&path, pem.as_bytes())?;
        let k = StudyKey { key };
        k.write_allowed_signers(root)?;
        Ok(k)
    }

    /// The study's key, if it has one.
    pub fn load(root: &Path) -> Result<Option<StudyKey>> {
        let path = paths::signing_key_path(root);
        if !path.exists() {
            return Ok(None);
        }
        let pem = fs::read_to_string(&path).at("cannot read", &path)?;
        let key = PrivateKey::from_openssh(pem).map_err(|e| {
            Error::invalid(format!(
                "{}: not an OpenSSH private key: {e}",
                path.display()
            ))
        })?;
        if key.algorithm() != Algorithm::Ed25519 || key.is_encrypted() {
            return Err(Error::invalid(format!(
                "{}: the study's signing key must be an unencrypted ed25519 key",
                path.display()
            )));
        }
        Ok(Some(StudyKey { key }))
    }

    pub fn fingerprint(&self) -> String {
        self.key.fingerprint(HashAlg::Sha256).to_string()
    }

    /// The armored signature of a commit buffer, for its `gpgsig` header.
    pub fn sign(&self, commit_buffer: &[u8]) -> Result<String> {
        let sig = self
            .key
            .sign(NAMESPACE, HashAlg::Sha512, commit_buffer)
            .map_err(|e| Error::internal(format!("cannot sign a commit: {e}")))?;
        sig.to_pem(LineEnding::LF)
            .map_err(|e| Error::internal(format!("cannot encode a signature: {e}")))
    }

    /// Whether commit `oid` carries a valid signature by this key; `Err` says why not.
    pub fn verify(&self, repo: &Repository, oid: Oid) -> std::result::Result<(), String> {
        let (sig, data) = match repo.extract_signature(&oid, None) {
            Ok(x) => x,
            Err(e) if e.code() == git2::ErrorCode::NotFound => {
                return Err(format!("commit {oid} is not signed"));
            }
            Err(e) => return Err(format!("commit {oid}: {}", e.message())),
        };
        let sig = std::str::from_utf8(&sig)
            .ok()
            .and_then(|s| SshSig::from_pem(s).ok())
            .ok_or_else(|| format!("commit {oid} has a signature that is not an SSH signature"))?;
        self.key
            .public_key()
            .verify(NAMESPACE, &data, &sig)
            .map_err(|e| match e {
                ssh_key::Error::PublicKey => {
                    format!("commit {oid} is signed by another key, not this study's")
                }
                e => format!("commit {oid} has a bad signature ({e})"),
            })
    }

    /// Write `.rsim/keys/allowed_signers` and point the repository's config at it, so
    /// `git verify-commit` and `git log --show-signature` check commits against this key.
    pub fn write_allowed_signers(&self, root: &Path) -> Result<()> {
        let path = allowed_signers_path(root);
        let public = self
            .key
            .public_key()
            .to_openssh()
            .map_err(|e| Error::internal(format!("cannot encode the public key: {e}")))?;
        let line = format!("{PRINCIPAL} namespaces=\"{NAMESPACE}\" {public}\n");
        if fs::read_to_string(&path).ok().as_deref() != Some(line.as_str()) {
            fs::write(&path, line).at("cannot write", &path)?;
        }
        let repo = Repository::open(root)?;
        let mut cfg = repo.config()?;
        let want = path.to_string_lossy().into_owned();
        if cfg.get_string("gpg.ssh.allowedSignersFile").ok().as_deref() != Some(want.as_str()) {
            cfg.set_str("gpg.format", "ssh")?;
            cfg.set_str("gpg.ssh.allowedSignersFile", &want)?;
        }
        Ok(())
    }
}

fn allowed_signers_path(root: &Path) -> PathBuf {
    paths::signing_key_path(root).with_file_name("allowed_signers")
}

/// Write `bytes` to a new file only its owner can read.
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .at("cannot create", path)?;
    f.write_all(bytes).at("cannot write", path)?;
    f.sync_all().at("cannot sync", path)
}

/// Whether commit `oid` carries any signature header (a study whose genesis is signed must
/// never be written or read without its key).
pub fn is_signed(repo: &Repository, oid: Oid) -> bool {
    repo.extract_signature(&oid, None).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_is_signed_verified_and_a_foreign_key_refused() {
        let d = tempfile::tempdir().expect("tempdir");
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        let mut keys = Vec::new();
        for root in [&a, &b] {
            Repository::init(root).expect("init");
            keys.push(StudyKey::create(root).expect("key"));
        }
        assert!(StudyKey::create(&a).is_err(), "a key is never replaced");
        let repo = Repository::open(&a).expect("repo");
        let sig = git2::Signature::now("rsim", "rsim@rsim.invalid").expect("sig");
        let tree = repo
            .find_tree(repo.treebuilder(None).expect("tb").write().expect("tree"))
            .expect("tree");
        let buf = repo
            .commit_create_buffer(&sig, &sig, "m\n", &tree, &[])
            .expect("buffer");
        let text = std::str::from_utf8(&buf).expect("utf8");
        let mut ours = Vec::new();
        for _ in 0..3 {
            ours.push(
                repo.commit_signed(text, &keys[0].sign(&buf).expect("sign"), None)
                    .expect("commit"),
            );
        }
        for oid in &ours {
            keys[0]
                .verify(&repo, *oid)
                .expect("our own commit verifies");
        }
        let theirs = repo
            .commit_signed(text, &keys[1].sign(&buf).expect("sign"), None)
            .expect("commit");
        let err = keys[0].verify(&repo, theirs).expect_err("foreign");
        assert!(err.contains("another key"), "{err}");
        let plain = repo
            .commit(None, &sig, &sig, "m\n", &tree, &[])
            .expect("commit");
        let err = keys[0].verify(&repo, plain).expect_err("unsigned");
        assert!(err.contains("not signed"), "{err}");
        // A signature over other bytes (the message edited after signing) is bad.
        let edited = text.replace("\nm\n", "\nn\n");
        let forged = repo
            .commit_signed(&edited, &keys[0].sign(&buf).expect("sign"), None)
            .expect("commit");
        let err = keys[0].verify(&repo, forged).expect_err("edited");
        assert!(err.contains("bad signature"), "{err}");
        let loaded = StudyKey::load(&a).expect("load").expect("present");
        assert_eq!(loaded.fingerprint(), keys[0].fingerprint());
        assert!(StudyKey::load(d.path()).expect("load").is_none());
    }
}
