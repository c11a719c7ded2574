//! What this user wrote on this machine, told apart from what a repository carries in.
//!
//! A study's `.rsim/` holds state rsim acts on: job directories (pids it kills, Slurm ids it
//! cancels, intents it records) and the index views are read from. A copied, moved or handed-over
//! directory carries all of that too. So rsim marks what it writes with an origin stamp — an
//! HMAC-SHA256, under a key only this user on this machine holds (`machine-key` in rsim's state
//! directory, mode 0600), of the path and the inode of what it marks — and acts only on what
//! bears a stamp that verifies here. A crafted stamp needs the key; a copied one names another
//! inode. Processes are named by `ProcessStamp` (pid, boot, start time), so a recycled pid or a
//! pid from another boot or machine is never signalled.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The per-user key, under `$XDG_STATE_HOME/rsim/` (default `~/.local/state/rsim/`).
const KEY_FILE: &str = "machine-key";

fn key_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".local").join("state"))
        })?;
    Some(base.join("rsim").join(KEY_FILE))
}

/// This user's machine key, made on first use; `None` when there is no home to keep it in (then
/// nothing is stamped, and nothing stamped elsewhere is trusted).
fn machine_key() -> Option<&'static [u8; 32]> {
    static KEY: OnceLock<Option<[u8; 32]>> = OnceLock::new();
    KEY.get_or_init(|| {
        let path = key_path()?;
        match load_or_make(&path) {
            Ok(k) => Some(k),
            Err(e) => {
                tracing::warn!(
                    "cannot keep rsim's machine key at {}: {e}; job state and the index are not marked as this machine's",
                    path.display()
                );
                None
            }
        }
    })
    .as_ref()
}

fn load_or_make(path: &Path) -> std::io::Result<[u8; 32]> {
    let read = |p: &Path| -> std::io::Result<Option<[u8; 32]>> {
        match fs::read(p) {
            Ok(b) => <[u8; 32]>::try_from(b.as_slice())
                .map(Some)
                .map_err(|_| std::io::Error::other(format!("{} is not 32 bytes", p.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    };
    if let Some(k) = read(path)? {
        return Ok(k);
    }
    if let Some(dir) = path.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let key: [u8; 32] = rand::random();
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&key)?;
    f.sync_all()?;
    // Another process may have made one meanwhile: the first one linked in wins.
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(key),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            read(path)?.ok_or_else(|| std::io::Error::other("the machine key vanished"))
        }
        Err(e) => Err(e),
    }
}

/// The stamp of `target` (a directory or file, never followed through a symlink) as `kind`.
fn tag(kind: &str, target: &Path) -> Option<String> {
    let key = machine_key()?;
    let m = fs::symlink_metadata(target).ok()?;
    if m.file_type().is_symlink() {
        return None;
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(key).ok()?;
    mac.update(
        format!(
            "rsim-origin\0{kind}\0{}\0{}\0{}",
            target.display(),
            m.dev(),
            m.ino()
        )
        .as_bytes(),
    );
    Some(hex::encode(mac.finalize().into_bytes()))
}

/// Mark `target` as written by this user on this machine, in the file `stamp` (written aside
/// and renamed into place). Without a machine key nothing is marked.
pub fn stamp(kind: &str, target: &Path, stamp: &Path) -> std::io::Result<()> {
    let Some(t) = tag(kind, target) else {
        return Ok(());
    };
    let tmp = stamp.with_extension(format!("tmp-{:016x}", rand::random::<u64>()));
    fs::write(&tmp, t.as_bytes())?;
    fs::rename(&tmp, stamp)
}

/// Whether `target` bears a stamp (in the file `stamp`) this user wrote on this machine for it.
/// Neither `target` nor `stamp` may be a symlink.
pub fn is_ours(kind: &str, target: &Path, stamp: &Path) -> bool {
    let Some(want) = tag(kind, target) else {
        return false;
    };
    match fs::symlink_metadata(stamp) {
        Ok(m) if m.is_file() => {}
        _ => return false,
    }
    fs::read(stamp).is_ok_and(|got| constant_time_eq(&got, want.as_bytes()))
}

/// Whether this machine can stamp at all (a machine key could be kept).
pub fn can_stamp() -> bool {
    machine_key().is_some()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// A process as this machine knows it: a pid means nothing without the boot it belongs to and
/// the time it started (pids are recycled).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessStamp {
    pub pid: u32,
    /// `/proc/sys/kernel/random/boot_id` when it ran.
    pub boot: String,
    /// Its start time, in clock ticks since boot (`/proc/<pid>/stat`, field 22).
    pub start: u64,
}

fn boot_id() -> Option<String> {
    static BOOT: OnceLock<Option<String>> = OnceLock::new();
    BOOT.get_or_init(|| {
        fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    })
    .clone()
}

fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

impl ProcessStamp {
    /// The process `pid` as it is now, if it exists.
    pub fn of(pid: u32) -> Option<ProcessStamp> {
        Some(ProcessStamp {
            pid,
            boot: boot_id()?,
            start: start_time(pid)?,
        })
    }

    /// This process.
    pub fn current() -> Option<ProcessStamp> {
        Self::of(std::process::id())
    }

    /// Whether this very process is still running here (same boot, same start time).
    pub fn alive(&self) -> bool {
        boot_id().as_deref() == Some(self.boot.as_str()) && start_time(self.pid) == Some(self.start)
    }

    /// One line: `pid boot start`.
    pub fn line(&self) -> String {
        format!("{} {} {}", self.pid, self.boot, self.start)
    }

    pub fn parse_line(s: &str) -> Option<ProcessStamp> {
        let mut w = s.split_whitespace();
        let pid = w.next()?.parse().ok()?;
        let boot = w.next()?.to_string();
        let start = w.next()?.parse().ok()?;
        Some(ProcessStamp { pid, boot, start })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_holds_for_what_it_marked_only() {
        let d = tempfile::tempdir().expect("tempdir");
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        fs::create_dir(&a).expect("a");
        fs::create_dir(&b).expect("b");
        if !can_stamp() {
            return;
        }
        stamp("job", &a, &a.join("origin")).expect("stamp");
        assert!(is_ours("job", &a, &a.join("origin")));
        assert!(!is_ours("index", &a, &a.join("origin")), "another kind");
        // The same stamp copied beside another directory marks nothing.
        fs::copy(a.join("origin"), b.join("origin")).expect("copy");
        assert!(!is_ours("job", &b, &b.join("origin")));
        // A directory replaced by a copy of itself (another inode) is no longer ours.
        let c = d.path().join("c");
        fs::create_dir(&c).expect("c");
        fs::copy(a.join("origin"), c.join("origin")).expect("copy");
        fs::remove_dir_all(&a).expect("rm");
        fs::rename(&c, &a).expect("mv");
        assert!(!is_ours("job", &a, &a.join("origin")));
        // A symlink to a stamped directory is not the directory.
        stamp("job", &b, &b.join("origin")).expect("stamp");
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&b, &link).expect("symlink");
        assert!(!is_ours("job", &link, &link.join("origin")));
    }

    #[test]
    fn a_process_is_its_pid_boot_and_start_time() {
        let me = ProcessStamp::current().expect("this process");
        assert!(me.alive());
        assert_eq!(ProcessStamp::parse_line(&me.line()), Some(me.clone()));
        let recycled = ProcessStamp {
            start: me.start + 1,
            ..me.clone()
        };
        assert!(!recycled.alive(), "the same pid started at another time");
        let other_boot = ProcessStamp {
            boot: "another-boot".into(),
            ..me
        };
        assert!(!other_boot.alive());
    }
}
