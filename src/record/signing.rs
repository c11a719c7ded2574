//! Commits this study can prove it wrote: every commit of the record carries git's own SSH
//! signature (the `gpgsig` header, namespace `git`, SHA-512), made with the study's ed25519 key.
//! The private key lives outside git (`.rsim/keys/`, mode 0600); its public half is in the record:
//! `allowed_signers` on `main`, committed by genesis and changed only by a key rotation that the
//! key in force signs. Any clone can therefore prove every commit with no secret at all: rsim
//! reads the key history from `main` (`key_history`), and plain `git verify-commit` /
//! `git log --show-signature` read the keys it proved once `gpg.ssh.allowedSignersFile` names
//! their copy in the git directory (`Record::configure_git_verification`). A
//! commit that is unsigned, signed by any other key (another study's history fetched in, a commit
//! forged around rsim), or signed by a retired key after it was retired, is not this study's:
//! rsim refuses to index it, and `rsim verify`, fsck and the audit name it.

use std::fs;
use std::path::{Path, PathBuf};

use git2::{Oid, Repository};
use ssh_key::{Algorithm, HashAlg, LineEnding, PrivateKey, PublicKey, SshSig};

use crate::model::paths;
use crate::util::error::{Error, IoContext, Result};

/// The namespace git signs commits in (`git -c gpg.format=ssh commit -S`).
const NAMESPACE: &str = "git";
/// The principal the allowed-signers file names (git shows it in `--show-signature`).
const PRINCIPAL: &str = "rsim@study";
/// The committed public half of the study's key (on `main`, in git's allowed-signers format).
pub const SIGNERS_FILE: &str = "allowed_signers";
/// A rotation's new key, written before the rotation commit and renamed over the key once it
/// is recorded (an interrupted rotation is finished by the next opening).
const NEXT_KEY_SUFFIX: &str = "next";

/// The study's signing key.
pub struct StudyKey {
    key: PrivateKey,
    /// The same key expanded for signing, once (deriving it costs two scalar multiplications).
    signer: ed25519_dalek::SigningKey,
}

impl std::fmt::Debug for StudyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StudyKey({})", self.fingerprint())
    }
}

impl StudyKey {
    /// Make a new key for the study at `root` and write it under `.rsim/keys/`. Refuses to
    /// replace a key that is already there.
    pub fn create(root: &Path) -> Result<StudyKey> {
        Self::create_at(&paths::signing_key_path(root))
    }

    fn create_at(path: &Path) -> Result<StudyKey> {
        let path = path.to_path_buf();
        if path.exists() {
            return Err(Error::invalid(format!(
                "{} already exists: a study's signing key is never replaced",
                path.display()
            )));
        }
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).at("cannot create", dir)?;
        }
        let mut rng = ssh_key::rand_core::OsRng;
        let key = PrivateKey::random(&mut rng, Algorithm::Ed25519)
            .map_err(|e| Error::internal(format!("cannot make a signing key: {e}")))?;
        let pem = key
            .to_openssh(LineEnding::LF)
            .map_err(|e| Error::internal(format!("cannot encode the signing key: {e}")))?;
        write_private(&path, pem.as_bytes())?;
        StudyKey::new(key, &path)
    }

    /// The study's key, if it has one.
    pub fn load(root: &Path) -> Result<Option<StudyKey>> {
        Self::load_at(&paths::signing_key_path(root))
    }

    fn load_at(path: &Path) -> Result<Option<StudyKey>> {
        let path = path.to_path_buf();
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
        StudyKey::new(key, &path).map(Some)
    }

    fn new(key: PrivateKey, path: &Path) -> Result<StudyKey> {
        let signer = match key.key_data().ed25519() {
            Some(pair) => ed25519_dalek::SigningKey::try_from(pair).map_err(|e| {
                Error::invalid(format!("{}: not a usable ed25519 key: {e}", path.display()))
            })?,
            None => {
                return Err(Error::invalid(format!(
                    "{}: the study's signing key must be an ed25519 key",
                    path.display()
                )));
            }
        };
        Ok(StudyKey { key, signer })
    }

    pub fn fingerprint(&self) -> String {
        self.key.fingerprint(HashAlg::Sha256).to_string()
    }

    /// The armored signature of a commit buffer, for its `gpgsig` header.
    #[tracing::instrument(level = "trace", name = "git.sign", skip_all)]
    pub fn sign(&self, commit_buffer: &[u8]) -> Result<String> {
        use ed25519_dalek::Signer;
        let failed = |e: ssh_key::Error| Error::internal(format!("cannot sign a commit: {e}"));
        // What `PrivateKey::sign` does (an SSHSIG over the SHA-512 of the buffer), with the
        // key expanded once instead of at every signature.
        let data =
            SshSig::signed_data(NAMESPACE, HashAlg::Sha512, commit_buffer).map_err(failed)?;
        let raw = self.signer.sign(&data);
        let sig =
            ssh_key::Signature::new(Algorithm::Ed25519, raw.to_bytes().to_vec()).map_err(failed)?;
        let sig = SshSig::new(
            self.key.public_key().key_data().clone(),
            NAMESPACE,
            HashAlg::Sha512,
            sig,
        )
        .map_err(failed)?;
        sig.to_pem(LineEnding::LF)
            .map_err(|e| Error::internal(format!("cannot encode a signature: {e}")))
    }

    pub fn public_key(&self) -> PublicKey {
        self.key.public_key().clone()
    }

    /// A rotation's new key for the study at `root`, written beside the key in force (refused
    /// while one is pending).
    pub fn create_next(root: &Path) -> Result<StudyKey> {
        Self::create_at(&next_key_path(root))
    }

    /// The pending rotation's new key, if one was written.
    pub fn load_next(root: &Path) -> Result<Option<StudyKey>> {
        Self::load_at(&next_key_path(root))
    }

    /// Make the pending new key the key in force (its rotation is recorded).
    pub fn promote_next(root: &Path) -> Result<()> {
        let (next, key) = (next_key_path(root), paths::signing_key_path(root));
        fs::rename(&next, &key).at("cannot install the new key", &key)
    }

    /// Drop a pending new key whose rotation was never recorded.
    pub fn discard_next(root: &Path) -> Result<()> {
        let next = next_key_path(root);
        match fs::remove_file(&next) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::from(e).context(next.display()))
            }
            _ => Ok(()),
        }
    }
}

fn next_key_path(root: &Path) -> PathBuf {
    let key = paths::signing_key_path(root);
    key.with_extension(NEXT_KEY_SUFFIX)
}

/// One key of the study's allowed-signers file, with the window in which its signatures count
/// (seconds since the epoch, both ends included, as ssh-keygen and git read them).
#[derive(Debug, Clone, PartialEq)]
pub struct Signer {
    pub key: PublicKey,
    pub valid_after: Option<i64>,
    pub valid_before: Option<i64>,
}

impl Signer {
    pub fn fingerprint(&self) -> String {
        self.key.fingerprint(HashAlg::Sha256).to_string()
    }
}

/// The study's public keys: the committed `allowed_signers`. Every key but the one in force
/// carries the time it was retired (`valid-before`); a rotated-in key the time it took over.
#[derive(Debug, Clone, PartialEq)]
pub struct Signers {
    pub keys: Vec<Signer>,
}

impl Signers {
    pub fn single(key: PublicKey) -> Signers {
        Signers {
            keys: vec![Signer {
                key,
                valid_after: None,
                valid_before: None,
            }],
        }
    }

    /// The key in force: the one not retired (the last one listed).
    pub fn current(&self) -> Option<&Signer> {
        self.keys.iter().rev().find(|s| s.valid_before.is_none())
    }

    /// These signers with the key in force retired at `at` and `next` in force from `at`.
    pub fn rotated(&self, next: PublicKey, at: i64) -> Signers {
        let mut keys: Vec<Signer> = self
            .keys
            .iter()
            .cloned()
            .map(|mut s| {
                s.valid_before.get_or_insert(at);
                s
            })
            .collect();
        keys.push(Signer {
            key: next,
            valid_after: Some(at),
            valid_before: None,
        });
        Signers { keys }
    }

    /// Git's allowed-signers format, one key a line.
    pub fn render(&self) -> Result<String> {
        let mut out = String::new();
        for s in &self.keys {
            let public = s
                .key
                .to_openssh()
                .map_err(|e| Error::internal(format!("cannot encode a public key: {e}")))?;
            let mut opts = vec![format!("namespaces=\"{NAMESPACE}\"")];
            if let Some(t) = s.valid_after {
                opts.push(format!("valid-after=\"{}\"", ssh_time(t)?));
            }
            if let Some(t) = s.valid_before {
                opts.push(format!("valid-before=\"{}\"", ssh_time(t)?));
            }
            out.push_str(&format!("{PRINCIPAL} {} {public}\n", opts.join(",")));
        }
        Ok(out)
    }

    /// Read an allowed-signers file (the subset rsim writes: a principal, options, an ed25519
    /// key); `Err` names the line that is not one.
    pub fn parse(text: &str) -> std::result::Result<Signers, String> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| format!("{SIGNERS_FILE} line {}: {why}", i + 1);
            let mut words = line.split_whitespace();
            let _principal = words.next().ok_or_else(|| bad("no principal"))?;
            let mut next = words.next().ok_or_else(|| bad("no key"))?;
            let (mut valid_after, mut valid_before) = (None, None);
            if !next.starts_with("ssh-") {
                for opt in next.split(',') {
                    let (name, value) = opt.split_once('=').unwrap_or((opt, ""));
                    let value = value.trim_matches('"');
                    match name {
                        "namespaces" if value.split(',').any(|n| n == NAMESPACE) => {}
                        "namespaces" => return Err(bad("the key is not for git's namespace")),
                        "valid-after" => {
                            valid_after = Some(parse_ssh_time(value).map_err(|e| bad(&e))?)
                        }
                        "valid-before" => {
                            valid_before = Some(parse_ssh_time(value).map_err(|e| bad(&e))?)
                        }
                        other => {
                            return Err(bad(&format!("option {other:?} is not one rsim writes")));
                        }
                    }
                }
                next = words.next().ok_or_else(|| bad("no key"))?;
            }
            let data = words.next().ok_or_else(|| bad("no key data"))?;
            let key = PublicKey::from_openssh(&format!("{next} {data}"))
                .map_err(|e| bad(&format!("not an SSH public key ({e})")))?;
            if key.algorithm() != Algorithm::Ed25519 {
                return Err(bad("the study's keys are ed25519 keys"));
            }
            keys.push(Signer {
                key,
                valid_after,
                valid_before,
            });
        }
        if keys.is_empty() {
            return Err(format!("{SIGNERS_FILE} lists no key"));
        }
        Ok(Signers { keys })
    }

    /// Whether commit `oid` carries a valid signature by one of these keys, made while that key
    /// was in force (the commit's own time, as git checks it); `Err` says why not.
    pub fn verify(&self, repo: &Repository, oid: Oid) -> std::result::Result<(), String> {
        self.signer_of(repo, oid).map(|_| ())
    }

    /// The key that signed commit `oid`, if the signature holds (see `verify`).
    pub fn signer_of(&self, repo: &Repository, oid: Oid) -> std::result::Result<&Signer, String> {
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
        let Some(signer) = self
            .keys
            .iter()
            .find(|s| s.key.key_data() == sig.public_key())
        else {
            return Err(format!(
                "commit {oid} is signed by another key, not this study's"
            ));
        };
        let at = repo
            .find_commit(oid)
            .map_err(|e| format!("commit {oid}: {}", e.message()))?
            .committer()
            .when()
            .seconds();
        if let Some(t) = signer.valid_before
            && at > t
        {
            return Err(format!(
                "commit {oid} is signed by the study's retired key {} after it was retired ({})",
                signer.fingerprint(),
                ssh_time(t).unwrap_or_default()
            ));
        }
        if let Some(t) = signer.valid_after
            && at < t
        {
            return Err(format!(
                "commit {oid} is signed by the study's key {} dated before that key took over ({})",
                signer.fingerprint(),
                ssh_time(t).unwrap_or_default()
            ));
        }
        signer
            .key
            .verify(NAMESPACE, &data, &sig)
            .map_err(|e| format!("commit {oid} has a bad signature ({e})"))?;
        Ok(signer)
    }
}

/// `YYYYMMDDHHMMSSZ` (UTC), as allowed-signers files write times.
fn ssh_time(t: i64) -> Result<String> {
    let fmt = time::macros::format_description!("[year][month][day][hour][minute][second]Z");
    time::OffsetDateTime::from_unix_timestamp(t)
        .ok()
        .and_then(|d| d.format(&fmt).ok())
        .ok_or_else(|| Error::internal(format!("{t} is not a time")))
}

fn parse_ssh_time(s: &str) -> std::result::Result<i64, String> {
    let digits = s.strip_suffix('Z').unwrap_or(s);
    let fmt = time::macros::format_description!("[year][month][day][hour][minute][second]");
    time::PrimitiveDateTime::parse(digits, &fmt)
        .map(|d| d.assume_utc().unix_timestamp())
        .map_err(|_| format!("{s:?} is not a time (YYYYMMDDHHMMSSZ)"))
}

/// What `main` says about the study's keys: the allowed-signers in force, taken from the commits
/// of `main` (first parents, oldest first) that changed the file — each change counts only when
/// the key in force before it signed it (the first: when genesis is signed by a key it lists).
/// A change that does not is left out and named in `problems`.
#[derive(Debug, Clone)]
pub struct KeyHistory {
    pub signers: Signers,
    /// Commits of `main` that changed the keys without the study's authority.
    pub problems: Vec<String>,
}

/// The key history of `main` at `tip`; `None` when `main` never committed the file (a study made
/// before its public key was recorded).
pub fn key_history(repo: &Repository, tip: Oid) -> std::result::Result<Option<KeyHistory>, String> {
    let git = |e: git2::Error| e.message().to_string();
    // main's commits are sized before libgit2's walk parses them whole.
    crate::record::check_commit_sizes(repo, &[tip], true).map_err(|e| e.message)?;
    let mut walk = repo.revwalk().map_err(git)?;
    walk.push(tip).map_err(git)?;
    walk.simplify_first_parent().map_err(git)?;
    let mut chain: Vec<Oid> = walk.filter_map(|o| o.ok()).collect();
    chain.reverse();
    let Some(&genesis) = chain.first() else {
        return Ok(None);
    };
    let (mut signers, mut problems): (Option<Signers>, Vec<String>) = (None, Vec::new());
    let mut last_blob = None;
    for oid in chain {
        let commit = repo.find_commit(oid).map_err(git)?;
        let blob = commit
            .tree()
            .map_err(git)?
            .get_name(SIGNERS_FILE)
            .map(|e| e.id());
        if blob == last_blob {
            continue;
        }
        last_blob = blob;
        let Some(blob) = blob else {
            if signers.is_some() {
                problems.push(format!(
                    "main: commit {oid} removes {SIGNERS_FILE}; the study's keys stay as they were"
                ));
            }
            continue;
        };
        let text = match crate::record::blob_at_most(repo, blob, crate::record::MAX_OWNER_FILE) {
            Ok(t) => t,
            Err(e) => {
                problems.push(format!(
                    "main: commit {oid}: {SIGNERS_FILE}: {}; the change is ignored",
                    e.message
                ));
                continue;
            }
        };
        let parsed = std::str::from_utf8(text.content())
            .map_err(|_| format!("{SIGNERS_FILE} is not UTF-8"))
            .and_then(Signers::parse);
        let new = match parsed {
            Ok(n) => n,
            Err(why) => {
                problems.push(format!("main: commit {oid}: {why}; the change is ignored"));
                continue;
            }
        };
        // The first keys recorded are the study's when they sign genesis and the commit that
        // recorded them; every later change must be signed by the keys in force before it.
        let authority = signers.as_ref().unwrap_or(&new);
        let proven = authority.verify(repo, oid).and_then(|()| match signers {
            Some(_) => Ok(()),
            None => new.verify(repo, genesis),
        });
        match proven {
            Ok(()) => signers = Some(new),
            Err(why) => problems.push(format!(
                "main: commit {oid} changes the study's keys ({SIGNERS_FILE}) without the study's \
                 authority: {why}; the change is ignored"
            )),
        }
    }
    Ok(signers.map(|signers| KeyHistory { signers, problems }))
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
        let study = Signers::single(keys[0].public_key());
        for oid in &ours {
            study.verify(&repo, *oid).expect("our own commit verifies");
        }
        let theirs = repo
            .commit_signed(text, &keys[1].sign(&buf).expect("sign"), None)
            .expect("commit");
        let err = study.verify(&repo, theirs).expect_err("foreign");
        assert!(err.contains("another key"), "{err}");
        let plain = repo
            .commit(None, &sig, &sig, "m\n", &tree, &[])
            .expect("commit");
        let err = study.verify(&repo, plain).expect_err("unsigned");
        assert!(err.contains("not signed"), "{err}");
        // A signature over other bytes (the message edited after signing) is bad.
        let edited = text.replace("\nm\n", "\nn\n");
        let forged = repo
            .commit_signed(&edited, &keys[0].sign(&buf).expect("sign"), None)
            .expect("commit");
        let err = study.verify(&repo, forged).expect_err("edited");
        assert!(err.contains("bad signature"), "{err}");
        // The committed form reads back as written, and a rotation's windows hold: the old key
        // counts up to the rotation (inclusive), the new one from it.
        let text = study.render().expect("render");
        assert_eq!(Signers::parse(&text).expect("parse"), study);
        let t = repo
            .find_commit(ours[0])
            .expect("c")
            .committer()
            .when()
            .seconds();
        let rotated = study.rotated(keys[1].public_key(), t - 1);
        assert_eq!(
            Signers::parse(&rotated.render().expect("r")).expect("p"),
            rotated
        );
        let err = rotated.verify(&repo, ours[0]).expect_err("retired");
        assert!(err.contains("retired key"), "{err}");
        assert!(
            study
                .rotated(keys[1].public_key(), t)
                .verify(&repo, ours[0])
                .is_ok()
        );
        rotated
            .verify(&repo, theirs)
            .expect("the new key from the rotation on");
        let late = study.rotated(keys[1].public_key(), t + 3600);
        let err = late.verify(&repo, theirs).expect_err("before it took over");
        assert!(err.contains("before that key took over"), "{err}");
        assert!(Signers::parse("rsim@study ssh-ed25519 nope").is_err());
        assert!(Signers::parse("").is_err());
        let loaded = StudyKey::load(&a).expect("load").expect("present");
        assert_eq!(loaded.fingerprint(), keys[0].fingerprint());
        assert!(StudyKey::load(d.path()).expect("load").is_none());
    }
}
