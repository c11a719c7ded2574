//! Content-addressed artifact store: every file is named by its sha256 under `.rsim/objects/`.
//! Writes go to a temporary file in the store and are renamed into place, so a crash never
//! leaves a half-written object under its final name. Checkpoints (directories of files) are
//! stored as a manifest object listing each file's hash; the manifest's hash names the checkpoint.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::util::error::{Error, IoContext, Result};
use crate::util::hash::sha256_hex;

/// The manifest that names a checkpoint (or any directory artifact).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub kind: String,
    /// File name (relative, `/`-separated) → sha256.
    pub files: BTreeMap<String, String>,
}

pub const MANIFEST_KIND: &str = "rsim-manifest/v1";

#[derive(Debug, Clone)]
pub struct ObjectStore {
    root: PathBuf,
    /// Fsync each object before it is installed (`[record] fsync`, like the record's own git
    /// writes). Without it an object is written and renamed into place like the record's: a
    /// killed process loses nothing, a power loss can lose what the OS had not written back.
    durable: bool,
}

impl ObjectStore {
    /// A store that fsyncs every object (genesis, tests; `Study` follows `[record] fsync`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ObjectStore {
            root: root.into(),
            durable: true,
        }
    }

    /// Whether objects are fsynced before they are installed.
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    fn sync(&self, f: &File, path: &Path) -> Result<()> {
        if self.durable {
            f.sync_all().at("cannot sync", path)?;
        }
        Ok(())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the object with this hash lives (whether or not it exists). A string that is not a
    /// sha256 (a crafted record's artifact: `../x`, `a€`) names one path in the store that nothing
    /// is ever written to, so no caller reads outside the store or panics on it.
    pub fn path(&self, sha: &str) -> PathBuf {
        if !crate::util::hash::is_sha256(sha) {
            return self.root.join("not-a-sha256");
        }
        let (a, b) = sha.split_at(2);
        self.root.join("sha256").join(a).join(b)
    }

    pub fn contains(&self, sha: &str) -> bool {
        crate::util::hash::is_sha256(sha) && self.path(sha).is_file()
    }

    /// Store bytes; returns their sha256.
    #[tracing::instrument(level = "trace", name = "store.put", skip_all)]
    pub fn put_bytes(&self, bytes: &[u8]) -> Result<String> {
        let sha = sha256_hex(bytes);
        if self.contains(&sha) {
            self.touch(&sha);
            return Ok(sha);
        }
        let tmp = self.tmp_path()?;
        {
            let mut f = File::create(&tmp).at("cannot create", &tmp)?;
            f.write_all(bytes).at("cannot write", &tmp)?;
            self.sync(&f, &tmp)?;
        }
        self.install(&tmp, &sha)?;
        Ok(sha)
    }

    /// Store a file by streaming it; returns its sha256.
    pub fn put_file(&self, src: &Path) -> Result<String> {
        let tmp = self.tmp_path()?;
        let mut hasher = Sha256::new();
        {
            let mut input = File::open(src).at("cannot open", src)?;
            let mut out = File::create(&tmp).at("cannot create", &tmp)?;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = input.read(&mut buf).at("cannot read", src)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                out.write_all(&buf[..n]).at("cannot write", &tmp)?;
            }
            self.sync(&out, &tmp)?;
        }
        let sha = hex::encode(hasher.finalize());
        if self.contains(&sha) {
            fs::remove_file(&tmp).at("cannot remove", &tmp)?;
            self.touch(&sha);
        } else {
            self.install(&tmp, &sha)?;
        }
        Ok(sha)
    }

    /// Move a file a finished job wrote into the store; returns its sha256. The file leaves its
    /// place (renamed into the store's temporary directory first, so nothing can change it
    /// between its hash and its install), and its bytes are kept once: a job directory never
    /// holds a second copy of what the store holds.
    pub fn absorb_file(&self, src: &Path) -> Result<String> {
        use std::os::unix::fs::MetadataExt;
        let copy = |src: &Path| -> Result<String> {
            let sha = self.put_file(src)?;
            fs::remove_file(src).at("cannot remove", src)?;
            Ok(sha)
        };
        // A file with other names (a hard link a job made) is copied: the store's object must be
        // an inode no one else can reach.
        let meta = fs::symlink_metadata(src).at("cannot stat", src)?;
        if !meta.is_file() || meta.nlink() > 1 {
            return copy(src);
        }
        let tmp = self.tmp_path()?;
        if fs::rename(src, &tmp).is_err() {
            // Another file system: copy, then remove the job's copy.
            return copy(src);
        }
        let mut hasher = Sha256::new();
        {
            let mut input = File::open(&tmp).at("cannot open", &tmp)?;
            self.sync(&input, &tmp)?;
            // Stored now, whenever the job wrote it: `rsim gc` spares objects younger than its
            // grace period until their record lands.
            File::options()
                .write(true)
                .open(&tmp)
                .and_then(|f| f.set_modified(std::time::SystemTime::now()))
                .at("cannot touch", &tmp)?;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = input.read(&mut buf).at("cannot read", &tmp)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
            }
        }
        let sha = hex::encode(hasher.finalize());
        if self.contains(&sha) {
            fs::remove_file(&tmp).at("cannot remove", &tmp)?;
            self.touch(&sha);
        } else {
            self.install(&tmp, &sha)?;
        }
        Ok(sha)
    }

    /// Store every regular file under `dir` and a manifest naming them; returns the manifest's hash.
    /// Symlinks and other special files are refused (they could point outside the study).
    pub fn put_dir(&self, dir: &Path) -> Result<String> {
        self.store_dir(dir, false)
    }

    /// `put_dir` for what a finished job wrote: each file is moved into the store
    /// (`absorb_file`), so the job directory keeps no second copy of the checkpoint.
    pub fn absorb_dir(&self, dir: &Path) -> Result<String> {
        self.store_dir(dir, true)
    }

    fn store_dir(&self, dir: &Path, moving: bool) -> Result<String> {
        let mut files = BTreeMap::new();
        self.collect(dir, dir, moving, &mut files)?;
        if files.is_empty() {
            return Err(Error::invalid(format!("{} holds no files", dir.display())));
        }
        let manifest = Manifest {
            kind: MANIFEST_KIND.into(),
            files,
        };
        self.put_bytes(&serde_json::to_vec_pretty(&manifest)?)
    }

    fn collect(
        &self,
        base: &Path,
        dir: &Path,
        moving: bool,
        files: &mut BTreeMap<String, String>,
    ) -> Result<()> {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .at("cannot list", dir)?
            .collect::<std::io::Result<_>>()
            .at("cannot list", dir)?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = e.path();
            let ft = e.file_type().at("cannot stat", &path)?;
            if ft.is_dir() {
                self.collect(base, &path, moving, files)?;
            } else if ft.is_file() {
                let rel = path.strip_prefix(base).map_err(|_| {
                    Error::internal(format!("{} is outside {}", path.display(), base.display()))
                })?;
                let name = rel
                    .to_str()
                    .ok_or_else(|| {
                        Error::invalid(format!("{}: file name is not UTF-8", path.display()))
                    })?
                    .to_string();
                let sha = if moving {
                    self.absorb_file(&path)?
                } else {
                    self.put_file(&path)?
                };
                files.insert(name, sha);
            } else {
                return Err(Error::invalid(format!(
                    "{}: only regular files may be stored (symlinks and devices are refused)",
                    path.display()
                )));
            }
        }
        Ok(())
    }

    /// Read an object, verifying its hash.
    pub fn get(&self, sha: &str) -> Result<Vec<u8>> {
        if !crate::util::hash::is_sha256(sha) {
            return Err(Error::invalid(format!("{sha:?} is not a sha256")));
        }
        let path = self.path(sha);
        let bytes =
            fs::read(&path).map_err(|e| Error::not_found(format!("artifact {sha}: {e}")))?;
        let actual = sha256_hex(&bytes);
        if actual != sha {
            return Err(Error::internal(format!(
                "artifact {sha} is corrupt (its content hashes to {actual})"
            )));
        }
        Ok(bytes)
    }

    /// Why a plain object no longer matches its hash (None when intact).
    pub fn damage(&self, sha: &str) -> Option<String> {
        self.get(sha).err().map(|e| e.message)
    }

    /// Read and parse a manifest object.
    pub fn manifest(&self, sha: &str) -> Result<Manifest> {
        let bytes = self.get(sha)?;
        let m: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| Error::invalid(format!("artifact {sha} is not a manifest: {e}")))?;
        if m.kind != MANIFEST_KIND {
            return Err(Error::invalid(format!(
                "artifact {sha} is not a manifest (kind {:?})",
                m.kind
            )));
        }
        Ok(m)
    }

    /// Why a directory artifact (a checkpoint) no longer matches its hashes — the manifest or any file
    /// it lists is missing or changed — or None when it is intact.
    pub fn manifest_damage(&self, sha: &str) -> Option<String> {
        let m = match self.manifest(sha) {
            Ok(m) => m,
            Err(e) => return Some(e.message),
        };
        m.files
            .iter()
            .find_map(|(name, f)| self.get(f).err().map(|e| format!("{name}: {}", e.message)))
    }

    fn tmp_path(&self) -> Result<PathBuf> {
        let dir = self.root.join("tmp");
        fs::create_dir_all(&dir).at("cannot create", &dir)?;
        let name = format!("{}-{:016x}", std::process::id(), rand::random::<u64>());
        Ok(dir.join(name))
    }

    /// Mark an object as stored again now (best effort): `rsim gc` spares objects younger than
    /// its grace period, so one that an action is about to reference is never removed under it.
    fn touch(&self, sha: &str) {
        let _ =
            File::open(self.path(sha)).and_then(|f| f.set_modified(std::time::SystemTime::now()));
    }

    fn install(&self, tmp: &Path, sha: &str) -> Result<()> {
        let dest = self.path(sha);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).at("cannot create", parent)?;
        }
        let mut perms = fs::metadata(tmp).at("cannot stat", tmp)?.permissions();
        perms.set_readonly(true);
        fs::set_permissions(tmp, perms).at("cannot protect", tmp)?;
        fs::rename(tmp, &dest).at("cannot install", &dest)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crafted record's artifact "hash" can be anything: its path neither panics (a multi-byte
    /// character across the two-character prefix) nor leaves the store, and names nothing.
    #[test]
    fn a_string_that_is_not_a_hash_names_nothing_inside_the_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = ObjectStore::new(dir.path().join("objects"));
        let sha = store.put_bytes(b"x").expect("put");
        for bad in [
            "a€",
            "€",
            "",
            "../../../etc/passwd",
            "/etc/passwd",
            &sha.to_uppercase(),
        ] {
            let p = store.path(bad);
            assert!(p.starts_with(store.root()), "{bad:?} -> {}", p.display());
            assert!(!p.exists(), "{bad:?} -> {}", p.display());
            assert!(!store.contains(bad));
        }
        assert!(store.path(&sha).is_file());
    }

    #[test]
    fn objects_are_named_by_content_and_verified() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = ObjectStore::new(dir.path().join("objects"));
        let sha = store.put_bytes(b"hello").expect("put");
        assert_eq!(
            sha,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(store.get(&sha).expect("get"), b"hello");
        // Corrupt it behind the store's back: reading must notice.
        let p = store.path(&sha);
        let mut perms = fs::metadata(&p).expect("stat").permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perms.set_readonly(false);
        fs::set_permissions(&p, perms).expect("chmod");
        fs::write(&p, b"jello").expect("write");
        assert!(store.get(&sha).unwrap_err().message.contains("corrupt"));
    }

    #[test]
    fn directories_become_manifests() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ck = dir.path().join("ck");
        fs::create_dir_all(ck.join("sub")).expect("mkdir");
        fs::write(ck.join("config.json"), b"{}").expect("write");
        fs::write(ck.join("sub/w.bin"), b"weights").expect("write");
        let store = ObjectStore::new(dir.path().join("objects"));
        let m1 = store.put_dir(&ck).expect("put_dir");
        let man = store.manifest(&m1).expect("manifest");
        assert_eq!(man.files.len(), 2);
        assert!(man.files.contains_key("sub/w.bin"));
        // Changing the config changes the checkpoint's identity.
        fs::write(ck.join("config.json"), b"{\"a\":1}").expect("write");
        assert_ne!(store.put_dir(&ck).expect("put_dir"), m1);
    }

    #[test]
    fn a_job_output_is_moved_into_the_store_and_a_hard_link_is_copied() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = ObjectStore::new(dir.path().join("objects"));
        let out = dir.path().join("out");
        fs::create_dir_all(out.join("ck")).expect("out");
        fs::write(out.join("ck/model.bin"), b"weights").expect("write");
        let m = store.absorb_dir(&out.join("ck")).expect("absorb");
        assert!(!out.join("ck/model.bin").exists(), "moved, not copied");
        let file = &store.manifest(&m).expect("manifest").files["model.bin"];
        assert_eq!(store.get(file).expect("get"), b"weights");
        // A file with another name elsewhere (a job's hard link) is copied: the other name keeps
        // its own inode, untouched, and the store's object is an inode of its own.
        let elsewhere = dir.path().join("protected.txt");
        fs::write(&elsewhere, b"not the job's").expect("write");
        fs::hard_link(&elsewhere, out.join("link")).expect("link");
        let sha = store.absorb_file(&out.join("link")).expect("absorb");
        assert!(!out.join("link").exists());
        assert!(
            !fs::metadata(&elsewhere)
                .expect("meta")
                .permissions()
                .readonly()
        );
        assert_ne!(
            fs::metadata(store.path(&sha)).expect("meta").ino(),
            fs::metadata(&elsewhere).expect("meta").ino()
        );
    }
}
