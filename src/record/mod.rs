//! The record: a study's git repository. Each research-DAG node is the branch `rsim/n/<id>`;
//! each action is one commit on it, written straight into the object database (no work tree),
//! and branch updates are compare-and-swap on the old tip, so concurrent writers never lose a
//! commit: the loser sees `Stale` and retries on the new tip.

pub mod claims;
pub mod commit;
pub mod dag;
mod delta;
pub mod index;
pub mod packs;
pub mod signing;
pub mod store;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use git2::{
    ErrorCode, FileMode, ObjectType, Oid, Repository, RepositoryInitOptions, Signature,
    build::TreeUpdateBuilder,
};

use crate::model::{ActionName, ActionRecord, NodeMeta};
use crate::util::error::{Error, Result};
use crate::util::hash::{json_bytes, toml_string};
use crate::util::text::sanitize_line;

/// The most bytes rsim reads of a file the owner commits on `main` (`rsim.toml`,
/// `allowed_signers`): a cloned repository decides their size, and none of them is near this.
pub const MAX_OWNER_FILE: usize = crate::config::MAX_CONFIG_BYTES as usize;
/// The most bytes rsim reads of one action file (`actions/NNNN-<action>.json`): its request
/// arrived in at most 16 MiB (an MCP line), its result beside it is far smaller.
pub const MAX_ACTION_FILE: usize = 64 << 20;

/// Times an object's header is looked for again after git said it is missing.
const MISSING_RETRIES: u32 = 3;

/// An object's size and kind from its header. Another process's pack merge can hide an object
/// from one scan of the pack directory (the merged pack is renamed in and the packs it replaces
/// removed while the scan runs; a directory listing may miss an entry added during it, so the scan
/// sees neither), and libgit2 scans only once more on a miss: a missing object is looked for
/// again after a short pause and a rescan, a few times, before git's answer stands.
fn header(repo: &git2::Repository, id: Oid) -> Result<(usize, git2::ObjectType)> {
    let odb = repo.odb()?;
    let mut tries = 0;
    loop {
        match odb.read_header(id) {
            Err(e) if e.code() == ErrorCode::NotFound && tries < MISSING_RETRIES => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(
                    2 + rand::random::<u64>() % 8,
                ));
                let _ = odb.refresh();
            }
            r => return Ok(r?),
        }
    }
}

/// A blob of the study's git, read only if it holds at most `max` bytes. Its size comes from the
/// object's header first (a pack entry's header, or a delta's target size), never from inflating
/// it: a repository from elsewhere decides what its blobs hold, and a few KB in a pack can
/// inflate to gigabytes. Every blob rsim reads from git comes through here.
pub fn blob_at_most<'r>(repo: &'r git2::Repository, id: Oid, max: usize) -> Result<git2::Blob<'r>> {
    sized(repo, id, git2::ObjectType::Blob, max, "object")?;
    Ok(repo.find_blob(id)?)
}

/// The one check under `blob_at_most`, `tree_at_most` and `commit_at_most`: the object's kind and
/// size from its header (`header`), refused past `max` bytes, named by `noun` and its id.
fn sized(
    repo: &git2::Repository,
    id: Oid,
    want: git2::ObjectType,
    max: usize,
    noun: &str,
) -> Result<()> {
    let (size, kind) = header(repo, id)?;
    if kind != want {
        let what = if want == git2::ObjectType::Blob {
            "file"
        } else {
            want.str()
        };
        return Err(Error::invalid(format!(
            "object {id} is a {kind}, not a {what}"
        )));
    }
    if size > max {
        let there = if want == git2::ObjectType::Commit {
            "of a commit"
        } else {
            "there"
        };
        return Err(Error::invalid(format!(
            "{noun} {id} is {size} bytes, more than rsim reads {there} ({max} bytes); it is not read"
        )));
    }
    Ok(())
}

/// The most bytes rsim reads of one commit (a summary line, the action's body, trailers and a
/// signature: a few KB).
pub const MAX_COMMIT: usize = 16 << 20;

/// A commit of the study's git, read only if it holds at most `MAX_COMMIT` bytes (see
/// `blob_at_most`: a message of one repeated byte packs small and inflates large).
pub fn commit_at_most(repo: &git2::Repository, id: Oid) -> Result<git2::Commit<'_>> {
    sized(repo, id, git2::ObjectType::Commit, MAX_COMMIT, "commit")?;
    Ok(repo.find_commit(id)?)
}

/// The file in `.git` that holds the genesis commit a copy proved or made.
const GENESIS_PIN: &str = "rsim-genesis";

/// The first commit of `tip`'s first-parent history (each commit sized before it is read).
pub fn first_parent_root(repo: &git2::Repository, tip: Oid) -> Result<Oid> {
    let mut c = commit_at_most(repo, tip)?;
    while let Ok(p) = c.parent_id(0) {
        c = commit_at_most(repo, p)?;
    }
    Ok(c.id())
}

/// Check, through `commit_at_most`, every commit reachable from `tips` (by first parents only,
/// or by all), before a libgit2 walk parses them whole.
pub fn check_commit_sizes(repo: &git2::Repository, tips: &[Oid], first_parent: bool) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    let mut todo = tips.to_vec();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        let c = commit_at_most(repo, id)?;
        if first_parent {
            todo.extend(c.parent_id(0).ok());
        } else {
            todo.extend(c.parent_ids());
        }
    }
    Ok(())
}

/// The most bytes rsim reads of a node's `actions/` tree (about 50 bytes an action: a million
/// actions on one node).
pub const MAX_ACTIONS_TREE: usize = 64 << 20;

/// A tree of the study's git, read only if it holds at most `max` bytes (see `blob_at_most`: a
/// tree of many entries that name the same object packs small and inflates large).
pub fn tree_at_most<'r>(repo: &'r git2::Repository, id: Oid, max: usize) -> Result<git2::Tree<'r>> {
    sized(repo, id, git2::ObjectType::Tree, max, "tree")?;
    Ok(repo.find_tree(id)?)
}

/// The study's keys as rsim proved them, where git's `gpg.ssh.allowedSignersFile` points (in the
/// git directory: no commit can change it).
pub const GIT_SIGNERS_FILE: &str = "rsim-allowed-signers";

/// The node branches (id, tip) and the refs under the node prefix that are not one, described.
pub type NodeRefs = (Vec<(String, Oid)>, Vec<String>);
/// The longest `Rsim-Env` trailer, bytes (other trailers: 200): a Python environment's label —
/// the lock's path and hash, the interpreter, torch, transformers, peft, CUDA and the driver —
/// runs past 200.
pub const ENV_TRAILER_MAX: usize = 512;

/// Prefix of node branches.
pub const NODE_REF_PREFIX: &str = "refs/heads/rsim/n/";
pub const MAIN_REF: &str = "refs/heads/main";
pub const NODE_FILE: &str = "node.toml";
pub const ACTIONS_DIR: &str = "actions";

pub fn node_ref(id: &str) -> String {
    format!("{NODE_REF_PREFIX}{id}")
}

/// A file to write into a node's tree alongside the action.
pub struct TreeFile {
    pub path: String,
    pub bytes: Vec<u8>,
}

impl TreeFile {
    pub fn new(path: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Self {
        TreeFile {
            path: path.into(),
            bytes: bytes.into(),
        }
    }
}

/// What a node looks like at one tip (cheap to read: two blobs and a tree).
#[derive(Debug, Clone)]
pub struct NodeSnapshot {
    pub tip: Oid,
    pub meta: NodeMeta,
    /// Number of actions recorded on the node (the next action's seq is this + 1).
    pub action_count: u32,
}

/// One recorded action with the commit that recorded it.
#[derive(Debug, Clone)]
pub struct CommittedAction {
    pub commit: Oid,
    pub record: ActionRecord,
}

/// Outcome of creating a node branch.
pub enum Create {
    Created(Oid),
    /// The id is taken (another writer created it first).
    Taken,
    /// Another writer holds the ref's lock right now; retry.
    Busy,
}

/// Outcome of a compare-and-swap append.
pub enum Append {
    Committed(Oid),
    /// Another writer moved the branch first; re-read and retry.
    Stale,
}

pub struct Record {
    repo: Repository,
    /// The study's private signing key, when it is on this machine and is the key in force: every
    /// commit this process writes is signed with it.
    key: Option<signing::StudyKey>,
    /// The study's public keys (from `main`'s `allowed_signers`): only commits they signed are
    /// the study's. `None` only for a study made before signing (its genesis is unsigned).
    signers: Option<signing::Signers>,
    /// Why nothing can be written here (a clone without the study's private key), if so.
    read_only: Option<String>,
    /// Commits of `main` that changed the keys without the study's authority (`rsim verify`).
    key_problems: Vec<String>,
    /// Whether the public key is committed on `main` (studies made before it was are not).
    key_committed: bool,
    /// The private key file's inode when it was loaded: another process's rotation replaces it,
    /// and this process then signs nothing more with the retired key.
    key_stamp: Option<u64>,
    /// Whether libgit2 fsynced git writes when this repository was opened (its reference
    /// database reads the switch once, when it is first used).
    fsync_at_open: bool,
    /// Commits proven under the signers in force: those this handle signed and those it
    /// verified. A commit id names its content and signature, so a proof holds for that id for
    /// as long as the signers do; the set is emptied when they change (a rotation). Every write
    /// verifies its tip and every index sync the commits it reads — a commit this process just
    /// signed, or the tip it proved on the previous write, is not verified again.
    proven: std::sync::Mutex<std::collections::HashSet<Oid>>,
    /// Node snapshots read, by tip (a tip's tree never changes): the write path reads a node's
    /// tip several times per action (the action's checks, the commit protocol, the index sync).
    snapshots: std::sync::Mutex<std::collections::HashMap<Oid, NodeSnapshot>>,
    /// Where writes build their objects before they reach the disk as one pack (`packs`).
    staging: std::sync::Mutex<Option<packs::Staging>>,
    /// Pack merges the study had seen when this handle opened it (`packs_merged_since_open`).
    merges_at_open: u64,
}

/// Most snapshots a handle remembers (then it forgets them all).
const SNAPSHOTS_MAX: usize = 4096;

/// Most commit ids a handle remembers as proven (then it forgets them all and proves again).
const PROVEN_MAX: usize = 1 << 16;

/// The inode of the study's private key file, if there is one.
fn key_stamp(root: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(crate::model::paths::signing_key_path(root))
        .ok()
        .map(|m| m.ino())
}

fn now_epoch() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// libgit2's process-wide switch that fsyncs git objects and reference updates (with their
/// directories). It is only ever turned on: a process that opened a study asking for fsync keeps
/// fsyncing every study it writes.
static FSYNC_GITDIR: AtomicBool = AtomicBool::new(false);

fn enable_fsync_gitdir() -> Result<()> {
    if FSYNC_GITDIR.load(Ordering::SeqCst) {
        return Ok(());
    }
    // SAFETY: libgit2 is initialised (a repository was opened, which runs git2's init first), and
    // GIT_OPT_ENABLE_FSYNC_GITDIR takes exactly one int argument. git2 0.21 has no wrapper for it.
    let rc = unsafe {
        libgit2_sys::git_libgit2_opts(
            libgit2_sys::GIT_OPT_ENABLE_FSYNC_GITDIR as std::ffi::c_int,
            1 as std::ffi::c_int,
        )
    };
    if rc != 0 {
        return Err(Error::internal(format!(
            "libgit2 refused to fsync git writes (error {rc})"
        )));
    }
    FSYNC_GITDIR.store(true, Ordering::SeqCst);
    Ok(())
}

/// libgit2 checks, by default, that every object a new commit or tree names exists and has the
/// right type, reading each one back from disk (`GIT_OPT_ENABLE_STRICT_OBJECT_CREATION`). rsim
/// only ever names objects it just wrote or looked up itself, so the check re-reads what this
/// process holds on every write; it is turned off process-wide. Reading is unchanged: every
/// object read is still hashed and checked against its id (strict hash verification stays on).
fn trust_own_object_ids() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        git2::opts::strict_object_creation(false);
        // A long-lived handle loads each pack written after it opened (`packs`); libgit2 keeps
        // at most this many pack files open, closing the least recently used (0: no bound).
        // SAFETY: a plain libgit2 option, set once before any pack is read.
        if let Err(e) = unsafe { git2::opts::set_mwindow_file_limit(256) } {
            tracing::warn!("cannot bound libgit2's open pack files: {}", e.message());
        }
    });
}

/// Refuse a repository whose history git reads rewritten: `info/grafts` (parents replaced) or a
/// shallow file (history cut off). Both come with a copy handed over, and both can hide signed
/// actions or loop a walk over history; the error says what to remove or fetch.
fn refuse_rewritten_history(repo: &Repository) -> Result<()> {
    let grafts = repo.commondir().join("info").join("grafts");
    if std::fs::symlink_metadata(&grafts).is_ok() {
        return Err(Error::invalid(format!(
            "{} exists: grafts rewrite this repository's history as git reads it, so its record \
             cannot be proven whole; refusing to open it (remove that file to read the study)",
            grafts.display()
        )));
    }
    if repo.is_shallow() {
        return Err(Error::invalid(
            "this repository is a shallow clone: its history is cut off, so its record cannot be \
             proven whole; fetch all of it (`git fetch --unshallow`) or clone it without --depth",
        ));
    }
    Ok(())
}

impl Record {
    /// Create the study repository (branch `main`).
    pub fn init(root: &Path) -> Result<Record> {
        trust_own_object_ids();
        let mut opts = RepositoryInitOptions::new();
        opts.initial_head("main").no_reinit(true).mkdir(true);
        let repo = Repository::init_opts(root, &opts).map_err(|e| {
            Error::invalid(format!(
                "cannot create a git repository at {}: {}",
                root.display(),
                e.message()
            ))
        })?;
        no_reflogs(&repo)?;
        // A genesis that failed before `main` was written left its key: the retry keeps it.
        let key = match signing::StudyKey::load(root)? {
            Some(k) if repo.refname_to_id(MAIN_REF).is_err() => k,
            _ => signing::StudyKey::create(root)?,
        };
        Ok(Record {
            repo,
            signers: Some(signing::Signers::single(key.public_key())),
            key: Some(key),
            read_only: None,
            key_problems: Vec::new(),
            key_committed: false,
            key_stamp: key_stamp(root),
            fsync_at_open: FSYNC_GITDIR.load(Ordering::SeqCst),
            proven: Default::default(),
            snapshots: Default::default(),
            staging: Default::default(),
            merges_at_open: 0,
        })
    }

    /// Open the record at `root`. Its public keys come from `main` (the committed
    /// `allowed_signers`); the private key in `.rsim/keys/` makes it writable only when it is
    /// the key in force. Without it the record opens read-only: every commit is still proven.
    pub fn open(root: &Path) -> Result<Record> {
        trust_own_object_ids();
        let fsync_at_open = FSYNC_GITDIR.load(Ordering::SeqCst);
        let repo = Repository::open(root).map_err(|e| {
            Error::invalid(format!(
                "{} is not a study (no git repository: {})",
                root.display(),
                e.message()
            ))
        })?;
        refuse_rewritten_history(&repo)?;
        let mut record = Record {
            repo,
            key: None,
            signers: None,
            read_only: None,
            key_problems: Vec::new(),
            key_committed: false,
            key_stamp: key_stamp(root),
            fsync_at_open,
            proven: Default::default(),
            snapshots: Default::default(),
            staging: Default::default(),
            merges_at_open: 0,
        };
        record.merges_at_open = packs::merges_seen(record.repo.path());
        let Ok(main) = record.main_tip() else {
            // Not a study yet (genesis pending): whatever key is there is the one genesis uses.
            record.key = signing::StudyKey::load(root)?;
            return Ok(record);
        };
        record.refuse_replaced_main(root, main)?;
        let history = signing::key_history(&record.repo, main).map_err(|why| {
            Error::invalid(format!(
                "{}: cannot read the study's keys: {why}",
                root.display()
            ))
        })?;
        let private = signing::StudyKey::load(root)?;
        match history {
            Some(h) => {
                record.key_committed = true;
                record.key_problems = h.problems;
                let current = h.signers.current().map(|s| s.key.clone());
                record.signers = Some(h.signers);
                record.key = match private {
                    Some(k) if Some(k.public_key()) == current => Some(k),
                    other => {
                        // A rotation recorded but not finished: its new key takes over now.
                        match signing::StudyKey::load_next(root)? {
                            Some(n) if Some(n.public_key()) == current => {
                                signing::StudyKey::promote_next(root)?;
                                Some(n)
                            }
                            _ => {
                                record.read_only = Some(match other {
                                    None => "the study's private signing key is not on this machine (a clone); views and queries work, and every commit is proven with the public key committed on main".to_string(),
                                    Some(k) => format!(
                                        "the key in .rsim/keys ({}) is not the study's key in force ({}); nothing is signed with it",
                                        k.fingerprint(),
                                        record.key_fingerprint().unwrap_or_default()
                                    ),
                                });
                                None
                            }
                        }
                    }
                };
                if record.key.is_some() {
                    signing::StudyKey::discard_next(root)?;
                }
            }
            None if record.genesis_signed(main) => match private {
                // Signed before the public key was committed: the key proves it (`rsim key
                // publish` commits it, so that clones can too).
                Some(k) => {
                    record.signers = Some(signing::Signers::single(k.public_key()));
                    record.key = Some(k);
                }
                None => {
                    return Err(Error::invalid(format!(
                        "{}: the study's record is signed, but neither its signing key ({}) nor its public key (`{}` on main) is here, so nothing in it can be proven: restore the key from a backup of .rsim/, or ask the study's owner to run `rsim key publish` and fetch main again",
                        root.display(),
                        crate::model::paths::signing_key_path(root).display(),
                        signing::SIGNERS_FILE,
                    )));
                }
            },
            // A study made before signing: nothing to prove with, nothing to sign with.
            None => {}
        }
        Ok(record)
    }

    /// Why nothing can be written to this record, if so (`read-only clone: …` errors say it).
    pub fn read_only(&self) -> Option<&str> {
        self.read_only.as_deref()
    }

    /// The error every write to a read-only record gets.
    pub fn refuse_write(&self) -> Result<()> {
        match &self.read_only {
            Some(why) => Err(Error::forbidden(format!(
                "read-only clone: {why}; nothing was recorded (only the study's owner, with its key, writes)"
            ))),
            None => Ok(()),
        }
    }

    /// The study's public keys (`None`: a study made before signing).
    pub fn signers(&self) -> Option<&signing::Signers> {
        self.signers.as_ref()
    }

    /// Commits of `main` that changed the keys without the study's authority.
    pub fn key_problems(&self) -> &[String] {
        &self.key_problems
    }

    /// Whether the public key is committed on `main`.
    pub fn key_committed(&self) -> bool {
        self.key_committed
    }

    /// The genesis commit this copy recorded (`pin_genesis`), if it did.
    fn pinned_genesis(&self) -> Result<Option<Oid>> {
        let path = self.repo.path().join(GENESIS_PIN);
        if std::fs::symlink_metadata(&path).is_err() {
            return Ok(None);
        }
        let text = crate::util::file::read_regular_text(&path, 256)
            .map_err(|e| Error::invalid(format!("the copy's genesis pin: {e}")))?;
        Oid::from_str(text.trim())
            .map(Some)
            .map_err(|_| Error::invalid(format!("{}: not a commit id", path.display())))
    }

    /// Record `main`'s first commit as this copy's genesis (`.git/rsim-genesis`): from now on a
    /// `main` that starts elsewhere is refused at open. `rsim clone` pins what it proved, and
    /// `rsim init` what it made.
    pub fn pin_genesis(&self) -> Result<Oid> {
        let genesis = first_parent_root(&self.repo, self.main_tip()?)?;
        crate::util::file::write_replacing(
            &self.repo.path().join(GENESIS_PIN),
            format!("{genesis}\n").as_bytes(),
        )?;
        Ok(genesis)
    }

    /// Whether the first commit of `main` (the study's genesis) is signed.
    fn genesis_signed(&self, main: Oid) -> bool {
        first_parent_root(&self.repo, main).is_ok_and(|g| signing::is_signed(&self.repo, g))
    }

    /// A study's genesis is the commit its root node grows from: n0's first commit, signed with
    /// the study's key, names it as its parent. `main`'s history must start there — a `main`
    /// given a new first commit (unsigned, or signed by another key whose `allowed_signers`
    /// lists the study's key beside its own), with the study's history kept behind a merge's
    /// second parent, would have its keys read from a genesis that is not the study's, and its
    /// forged actions proven or nothing proven at all. Such a repository is refused, naming both
    /// commits. Before n0 exists (a genesis that stopped part-way) there is nothing to hold to.
    fn refuse_replaced_main(&self, root: &Path, main: Oid) -> Result<()> {
        let genesis = first_parent_root(&self.repo, main)?;
        // The genesis this copy proved (`rsim clone`) or made (`rsim init`): whoever can push
        // may root `main` and n0 anew together, each signed with a key of their own listing the
        // study's beside it, and only what this copy already knows tells that apart.
        if let Some(pinned) = self.pinned_genesis()?
            && pinned != genesis
        {
            return Err(Error::invalid(format!(
                "{}: main's history starts at commit {genesis}, not at the genesis {pinned} this \
                 copy proved when it was cloned (or made): the study's history was replaced by \
                 whoever could push to where it came from; refusing to open it (clone the \
                 study again from its owner, and compare `rsim key show` with the owner's)",
                root.display()
            )));
        }
        let Some(n0) = self.node_tip(crate::model::ROOT_NODE)? else {
            return Ok(());
        };
        let grows_from = first_parent_root(&self.repo, n0)?;
        if genesis == grows_from {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "{}: main's history starts at commit {genesis}, but the study's root node {} grows \
             from commit {grows_from}: main was replaced by another history (the study's kept \
             behind it, or none), so the study's keys cannot be read from it; refusing to open \
             the repository (fetch main again from the study's owner)",
            root.display(),
            crate::model::ROOT_NODE,
        )))
    }

    /// The fingerprint of the study's key in force (`None`: a study made before signing).
    pub fn key_fingerprint(&self) -> Option<String> {
        self.signers
            .as_ref()
            .and_then(|s| s.current())
            .map(|s| s.fingerprint())
    }

    /// Whether commit `oid` is this study's: signed by one of its keys while that key was in
    /// force. A study made before signing proves nothing, and says so in fsck.
    #[tracing::instrument(level = "trace", name = "git.verify", skip_all)]
    pub fn verify_commit(&self, oid: Oid) -> std::result::Result<(), String> {
        let Some(s) = &self.signers else {
            return Ok(());
        };
        if self.proven_set().contains(&oid) {
            return Ok(());
        }
        // Sized first (and looked for again if a pack merge hid it for a moment).
        commit_at_most(&self.repo, oid).map_err(|e| e.message)?;
        s.verify(&self.repo, oid)?;
        self.proved(oid);
        Ok(())
    }

    fn proven_set(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<Oid>> {
        self.proven.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `oid` is proven under the signers in force (verified, or signed here with the key in force).
    fn proved(&self, oid: Oid) {
        let mut set = self.proven_set();
        if set.len() >= PROVEN_MAX {
            set.clear();
        }
        set.insert(oid);
    }

    /// What signing costs: `n` signatures of the bytes of `node`'s tip commit and `n`
    /// verifications of that commit, each timed in µs (for `rsim bench`).
    pub fn signing_cost(&self, node: &str, n: usize) -> Result<(Vec<f64>, Vec<f64>)> {
        let key = self
            .key
            .as_ref()
            .ok_or_else(|| Error::invalid("the study has no signing key"))?;
        let tip = self
            .node_tip(node)?
            .ok_or_else(|| Error::not_found(format!("node: no node {node} in this study")))?;
        let (_, data) = self.repo.extract_signature(&tip, None)?;
        let (mut sign, mut verify) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let t = std::time::Instant::now();
            key.sign(&data)?;
            sign.push(t.elapsed().as_secs_f64() * 1e6);
            let t = std::time::Instant::now();
            // The signature itself, not the handle's memory of having proven it.
            if let Some(s) = &self.signers {
                s.verify(&self.repo, tip).map_err(Error::internal)?;
            }
            verify.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok((sign, verify))
    }

    /// Write a commit object (signed with the study's key), moving no reference.
    #[tracing::instrument(level = "trace", name = "git.sign_write", skip_all)]
    fn write_commit(
        &self,
        repo: &Repository,
        sig: &Signature<'_>,
        message: &str,
        tree: &git2::Tree<'_>,
        parents: &[&git2::Commit<'_>],
    ) -> Result<Oid> {
        self.refuse_write()?;
        if let (Some(_), Some(dir)) = (&self.key, self.repo.workdir())
            && key_stamp(dir) != self.key_stamp
        {
            return Err(Error::conflict(
                "the study's signing key was rotated by another rsim process since this one opened the study; nothing was recorded: open the study again",
            ));
        }
        let Some(key) = &self.key else {
            if self.signers.is_some() {
                return Err(Error::internal(
                    "the study's record is signed, but no signing key is loaded",
                ));
            }
            return Ok(repo.commit(None, sig, sig, message, tree, parents)?);
        };
        let buf = repo.commit_create_buffer(sig, sig, message, tree, parents)?;
        let signature = key.sign(&buf)?;
        let text = std::str::from_utf8(&buf)
            .map_err(|_| Error::internal("a commit buffer is not UTF-8"))?;
        let oid = repo.commit_signed(text, &signature, None)?;
        // Signed just now with the key in force (checked above): proven without reading it back.
        self.proved(oid);
        Ok(oid)
    }

    /// Fsync git writes from now on (`[record] fsync`): objects before the branch that names them
    /// moves, and the branch update itself. Without it the OS writes them back when it chooses:
    /// a killed process loses nothing, a power loss can lose or truncate recent objects.
    pub fn enable_fsync(&mut self) -> Result<()> {
        if self.fsync_at_open {
            return Ok(());
        }
        enable_fsync_gitdir()?;
        // The reference database took the switch's old value when it was first used: reopen.
        let dir = self
            .repo
            .workdir()
            .unwrap_or(self.repo.path())
            .to_path_buf();
        self.repo = Repository::open(dir)?;
        self.fsync_at_open = true;
        Ok(())
    }

    pub fn repo(&self) -> &Repository {
        &self.repo
    }

    fn signature(agent: &str) -> Result<Signature<'static>> {
        let name = sanitize_line(agent);
        let email: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        Ok(Signature::now(&name, &format!("{email}@rsim.invalid"))?)
    }

    /// Write the study's first commit on `main` (the files the owner controls: rsim.toml, .gitignore, README).
    pub fn commit_main(&self, files: &[TreeFile], message: &str) -> Result<Oid> {
        let tree = self.fresh_tree(&self.repo, files)?;
        let sig = Self::signature("rsim")?;
        let tree = self.repo.find_tree(tree)?;
        let oid = self.write_commit(&self.repo, &sig, message, &tree, &[])?;
        self.repo.reference(MAIN_REF, oid, false, "rsim init")?;
        // The work tree's git index matches main, so the owner's own `git commit -am` (or
        // `git add rsim.toml`) changes the config instead of committing every other file's
        // removal from an empty index.
        if !self.repo.is_bare() {
            let mut index = self.repo.index()?;
            index.read_tree(&tree)?;
            index.write()?;
        }
        Ok(oid)
    }

    /// The committed form of the study's public keys (`allowed_signers`), for genesis.
    pub fn signers_text(&self) -> Result<Option<String>> {
        self.signers.as_ref().map(|s| s.render()).transpose()
    }

    /// Point git at the study's keys as rsim proved them from `main` (written to
    /// `GIT_SIGNERS_FILE` in the git directory), so that `git verify-commit` and
    /// `git log --show-signature` prove commits in this repository as `rsim verify` does. Not at
    /// the work tree's `allowed_signers`: a commit anyone can push may change that file, and git
    /// would then call their signatures good. Run again (`rsim verify` does) after fetching a key
    /// rotation.
    pub fn configure_git_verification(&self) -> Result<()> {
        if let Some(text) = self.signers_text()? {
            let path = self.repo.path().join(GIT_SIGNERS_FILE);
            let stale = crate::util::file::read_regular(&path, MAX_OWNER_FILE as u64)
                .map_or(true, |have| have != text.as_bytes());
            if stale {
                crate::util::file::write_replacing(&path, text.as_bytes()).map_err(|e| {
                    Error::internal(format!("cannot write {}: {e}", path.display()))
                })?;
            }
            let mut cfg = self.repo.config()?;
            let want = path.to_string_lossy();
            if cfg.get_string("gpg.ssh.allowedSignersFile").ok().as_deref() != Some(&*want) {
                cfg.set_str("gpg.format", "ssh")?;
                cfg.set_str("gpg.ssh.allowedSignersFile", &want)?;
            }
        }
        no_reflogs(&self.repo)
    }

    /// After the keys changed: git's copy of them follows (the change itself is already done, so
    /// a failure here is a warning, not an error).
    fn refresh_git_verification(&self) {
        if let Err(e) = self.configure_git_verification() {
            tracing::warn!("the keys changed, but git's copy of them was not updated: {e}");
        }
    }

    /// Commit the study's public key to `main` (a study signed before rsim recorded it), so that
    /// any clone can prove its commits. Signed by the key itself.
    pub fn publish_key(&self) -> Result<Oid> {
        self.refuse_write()?;
        if self.key_committed {
            return Err(Error::invalid(format!(
                "the study's public key is already on main ({}); nothing was changed",
                signing::SIGNERS_FILE
            )));
        }
        let signers = self.signers.as_ref().ok_or_else(|| {
            Error::invalid(
                "the study was made before rsim signed its record: it has no key to publish",
            )
        })?;
        let oid = self.commit_signers(
            signers,
            &format!(
                "key: publish the study's public key {}\n\nEvery commit of this study is signed with it; `rsim verify` (or git with gpg.ssh.allowedSignersFile = {}) proves them.\n",
                self.key_fingerprint().unwrap_or_default(),
                signing::SIGNERS_FILE
            ),
            now_epoch(),
        )?;
        self.refresh_git_verification();
        Ok(oid)
    }

    /// Replace the study's key: a new key is made, and main records it in force from now, the
    /// old one retired from now (both in `allowed_signers`, signed by the old key — the study's
    /// authority passes from one to the other). The old private key is deleted. Returns the
    /// commit and the old and new fingerprints.
    pub fn rotate_key(&mut self, root: &Path) -> Result<(Oid, String, String)> {
        self.refuse_write()?;
        if !self.key_committed {
            return Err(Error::invalid(
                "the study's public key is not on main yet: run `rsim key publish` first",
            ));
        }
        let (Some(signers), Some(old)) = (self.signers.clone(), self.key.as_ref()) else {
            return Err(Error::invalid("the study has no signing key to rotate"));
        };
        let old_fp = old.fingerprint();
        let next = signing::StudyKey::create_next(root)?;
        let at = now_epoch();
        let rotated = signers.rotated(next.public_key(), at);
        let commit = self.commit_signers(
            &rotated,
            &format!(
                "key: rotate the study's key {old_fp} -> {}\n\nCommits from now on are signed with the new key; the old one is retired (valid until this commit).\n",
                next.fingerprint()
            ),
            at,
        );
        let oid = match commit {
            Ok(oid) => oid,
            Err(e) => {
                signing::StudyKey::discard_next(root)?;
                return Err(e);
            }
        };
        signing::StudyKey::promote_next(root)?;
        let new_fp = next.fingerprint();
        self.key_stamp = key_stamp(root);
        self.key = Some(next);
        self.signers = Some(rotated);
        self.proven_set().clear();
        self.refresh_git_verification();
        Ok((oid, old_fp, new_fp))
    }

    /// Append to `main` a commit that sets `allowed_signers`, dated `at` and signed by the key in
    /// force (compare-and-swap on main's tip); the work tree follows when it has main out.
    fn commit_signers(&self, signers: &signing::Signers, message: &str, at: i64) -> Result<Oid> {
        let tip = self.main_tip()?;
        let parent = self.repo.find_commit(tip)?;
        let text = signers.render()?;
        let blob = self.repo.blob(text.as_bytes())?;
        let mut update = TreeUpdateBuilder::new();
        update.upsert(signing::SIGNERS_FILE, blob, FileMode::Blob);
        let tree = update.create_updated(&self.repo, &parent.tree()?)?;
        let tree = self.repo.find_tree(tree)?;
        let sig = Signature::new("owner", "owner@rsim.invalid", &git2::Time::new(at, 0))?;
        let oid = self.write_commit(&self.repo, &sig, message, &tree, &[&parent])?;
        self.repo
            .reference_matching(MAIN_REF, oid, true, tip, "rsim key")
            .map_err(|e| {
                Error::conflict(format!(
                    "main moved while the key change was being written ({}); nothing was changed, run it again",
                    e.message()
                ))
            })?;
        let on_main = self
            .repo
            .head()
            .ok()
            .and_then(|h| h.name().ok().map(|n| n == MAIN_REF))
            .unwrap_or(false);
        if on_main && let Some(dir) = self.repo.workdir() {
            let path = dir.join(signing::SIGNERS_FILE);
            // Replaced, not written through: the work tree may hold a symlink a commit put there.
            crate::util::file::write_replacing(&path, text.as_bytes())
                .map_err(|e| Error::internal(format!("cannot write {}: {e}", path.display())))?;
            let mut index = self.repo.index()?;
            index.add_path(Path::new(signing::SIGNERS_FILE))?;
            index.write()?;
        }
        Ok(oid)
    }

    pub fn main_tip(&self) -> Result<Oid> {
        Ok(self.repo.refname_to_id(MAIN_REF)?)
    }

    /// Write a tree holding exactly `files` (paths may have directories), writing no other objects.
    fn fresh_tree(&self, repo: &Repository, files: &[TreeFile]) -> Result<Oid> {
        let mut here = repo.treebuilder(None)?;
        let mut dirs: std::collections::BTreeMap<&str, Vec<TreeFile>> =
            std::collections::BTreeMap::new();
        for f in files {
            match f.path.split_once('/') {
                Some((dir, rest)) => dirs
                    .entry(dir)
                    .or_default()
                    .push(TreeFile::new(rest, f.bytes.clone())),
                None => {
                    let blob = repo.blob(&f.bytes)?;
                    here.insert(f.path.as_str(), blob, i32::from(FileMode::Blob))?;
                }
            }
        }
        for (dir, sub) in dirs {
            let oid = self.fresh_tree(repo, &sub)?;
            here.insert(dir, oid, i32::from(FileMode::Tree))?;
        }
        Ok(here.write()?)
    }

    fn build_tree(repo: &Repository, base: &git2::Tree<'_>, files: &[TreeFile]) -> Result<Oid> {
        let mut up = TreeUpdateBuilder::new();
        for f in files {
            let blob = repo.blob(&f.bytes)?;
            up.upsert(f.path.as_str(), blob, FileMode::Blob);
        }
        Ok(up.create_updated(repo, base)?)
    }

    /// Build a commit with `build` in the staging repository (`packs::Staging`: objects in memory
    /// only; `build` copies in what it builds on), which returns the commit and the tree it builds
    /// on (its first parent's, if any); the objects the commit adds to that tree then reach the
    /// study as one pack: two files (fsynced with `[record] fsync`) instead of one per object.
    /// Returns the commit's id.
    fn build_packed(
        &self,
        build: impl FnOnce(&packs::Staging) -> Result<(Oid, Option<Oid>)>,
    ) -> Result<Oid> {
        self.refuse_write()?;
        let mut staging = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        if staging.is_none() {
            *staging = Some(packs::Staging::new()?);
        }
        let Some(staging) = staging.as_ref() else {
            return Err(Error::internal("no staging repository"));
        };
        let (oid, base) = build(staging)?;
        let objects = packs::new_objects(staging.repo(), oid, base)?;
        packs::write_pack(
            &self.repo.path().join("objects").join("pack"),
            &objects,
            FSYNC_GITDIR.load(Ordering::SeqCst),
        )?;
        staging.written(objects.len());
        Ok(oid)
    }

    /// After a read found a git object missing (`commit::missing_object`): pause briefly and
    /// scan the pack directory again, so the next attempt sees a pack merged meanwhile.
    pub(crate) fn rescan_objects(&self, why: &Error) {
        tracing::info!(
            "{}; looking again (a pack merge may have hidden it)",
            why.message
        );
        std::thread::sleep(std::time::Duration::from_millis(
            2 + rand::random::<u64>() % 8,
        ));
        if let Err(e) = self.repo.odb().and_then(|o| o.refresh()) {
            tracing::warn!("cannot rescan the study's packs: {}", e.message());
        }
    }

    /// Keep the study's packs few (`packs::tidy`) after a write landed. A failure is logged:
    /// the write itself is recorded either way.
    fn tidy_packs(&self) {
        if let Err(e) = packs::tidy(self.repo.path(), FSYNC_GITDIR.load(Ordering::SeqCst)) {
            tracing::warn!("cannot merge the study's packs: {}", e.message);
        }
    }

    /// How many times packs were merged since this handle opened the repository: libgit2 keeps
    /// every pack it ever loaded, so a long-lived holder opens the study again after a few.
    pub fn packs_merged_since_open(&self) -> u64 {
        packs::merges_seen(self.repo.path()).saturating_sub(self.merges_at_open)
    }

    /// `explain_damage` for this record's repository.
    pub fn explain_damage(&self, e: Error) -> Error {
        explain_damage(self.repo.path(), e)
    }

    /// The tip of a node's branch, if the node exists.
    pub fn node_tip(&self, id: &str) -> Result<Option<Oid>> {
        match self.repo.refname_to_id(&node_ref(id)) {
            Ok(oid) => Ok(Some(oid)),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
            Err(e) if e.code() == ErrorCode::InvalidSpec => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Every node branch with its tip.
    pub fn node_tips(&self) -> Result<Vec<(String, Oid)>> {
        Ok(self.node_refs()?.0)
    }

    /// The node branches (`node_tips`), and the refs under the node prefix that are not one: a
    /// name that is not a node id (`n0`, `n12`), or a ref that does not point at a commit. A
    /// repository from elsewhere decides both, so the strays are described for display (no
    /// control character of a ref name survives) and never read as nodes.
    pub fn node_refs(&self) -> Result<NodeRefs> {
        let mut out = Vec::new();
        let mut strays = Vec::new();
        for r in self.repo.references_glob(&format!("{NODE_REF_PREFIX}*"))? {
            let r = r?;
            let name = String::from_utf8_lossy(r.name_bytes()).into_owned();
            let Some(id) = name.strip_prefix(NODE_REF_PREFIX) else {
                continue;
            };
            let shown = crate::util::text::sanitize_line(&name);
            if !crate::model::is_node_id(id) {
                strays.push(format!("ref {shown}: not a node branch (not a node id)"));
                continue;
            }
            let Some(oid) = r.target() else {
                strays.push(format!("ref {shown}: a symbolic ref, not a node branch"));
                continue;
            };
            match header(&self.repo, oid) {
                Ok((_, ObjectType::Commit)) => out.push((id.to_string(), oid)),
                Ok((_, kind)) => strays.push(format!(
                    "ref {shown}: points at a {kind} ({oid}), not a commit"
                )),
                Err(e) => strays.push(format!(
                    "ref {shown}: points at {oid}, which cannot be read: {}",
                    e.message
                )),
            }
        }
        Ok((out, strays))
    }

    /// Read a node's state at a tip.
    #[tracing::instrument(level = "trace", name = "git.snapshot", skip_all)]
    pub fn snapshot(&self, tip: Oid) -> Result<NodeSnapshot> {
        // A commit id names its tree: a snapshot read once holds for as long as the commit.
        if let Some(s) = self.snapshots_seen().get(&tip) {
            return Ok(s.clone());
        }
        let snap = self.read_snapshot(tip)?;
        let mut seen = self.snapshots_seen();
        if seen.len() >= SNAPSHOTS_MAX {
            seen.clear();
        }
        seen.insert(tip, snap.clone());
        Ok(snap)
    }

    /// Remember the snapshot of a commit this process just wrote (its meta and action count
    /// are what it wrote), so the next action on the node does not read them back from git.
    pub(crate) fn remember_snapshot(&self, snap: NodeSnapshot) {
        let mut seen = self.snapshots_seen();
        if seen.len() >= SNAPSHOTS_MAX {
            seen.clear();
        }
        seen.insert(snap.tip, snap);
    }

    fn snapshots_seen(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<Oid, NodeSnapshot>> {
        self.snapshots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn read_snapshot(&self, tip: Oid) -> Result<NodeSnapshot> {
        let commit = commit_at_most(&self.repo, tip)?;
        let tree = tree_at_most(&self.repo, commit.tree_id(), MAX_OWNER_FILE)
            .map_err(|e| e.context(format!("commit {tip}")))?;
        let meta = self.read_meta(&tree)?;
        let action_count = match tree.get_name(ACTIONS_DIR) {
            Some(e) => tree_at_most(&self.repo, e.id(), MAX_ACTIONS_TREE)
                .map_err(|e| e.context(format!("{ACTIONS_DIR} at commit {tip}")))?
                .len() as u32,
            None => 0,
        };
        Ok(NodeSnapshot {
            tip,
            meta,
            action_count,
        })
    }

    fn read_meta(&self, tree: &git2::Tree<'_>) -> Result<NodeMeta> {
        let entry = tree.get_name(NODE_FILE).ok_or_else(|| {
            Error::internal(format!("commit tree {} has no {NODE_FILE}", tree.id()))
        })?;
        // Read before the node's history is proven (the index reads a tip's meta first), so a
        // repository from elsewhere decides its size: refused before it is inflated.
        let blob = blob_at_most(&self.repo, entry.id(), MAX_OWNER_FILE)
            .map_err(|e| e.context(format!("{NODE_FILE} in tree {}", tree.id())))?;
        let text = std::str::from_utf8(blob.content()).map_err(|_| {
            Error::internal(format!("{NODE_FILE} in tree {} is not UTF-8", tree.id()))
        })?;
        let meta: NodeMeta = toml::from_str(text)
            .map_err(|e| Error::internal(format!("{NODE_FILE} in tree {}: {e}", tree.id())))?;
        // The ids are printed and indexed as they stand (the DAG, DOT output, the index's key):
        // a repository from elsewhere may name anything there, so anything but node ids is
        // refused here, and named without being quoted.
        if !crate::model::is_node_id(&meta.id)
            || !meta.parents.iter().all(|p| crate::model::is_node_id(p))
        {
            return Err(Error::internal(format!(
                "{NODE_FILE} in tree {}: its id or a parent is not a node id",
                tree.id()
            )));
        }
        Ok(meta)
    }

    /// Read a text file from a node's tip tree (e.g. `notes.md`), if present.
    pub fn read_file(&self, tip: Oid, path: &str) -> Result<Option<Vec<u8>>> {
        let tree = commit_at_most(&self.repo, tip)?.tree_id();
        let tree = tree_at_most(&self.repo, tree, MAX_OWNER_FILE)?;
        match tree.get_path(Path::new(path)) {
            Ok(e) => Ok(Some(
                blob_at_most(&self.repo, e.id(), MAX_OWNER_FILE)
                    .map_err(|err| err.context(format!("{path} at commit {tip}")))?
                    .content()
                    .to_vec(),
            )),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The actions of node `id` at `tip` with seq greater than `after`, oldest first, each with its commit.
    /// Walks first parents from the tip while commits belong to this node.
    pub fn actions_since(&self, id: &str, tip: Oid, after: u32) -> Result<Vec<CommittedAction>> {
        let tip_commit = commit_at_most(&self.repo, tip)?;
        let tree = tree_at_most(&self.repo, tip_commit.tree_id(), MAX_OWNER_FILE)
            .map_err(|e| e.context(format!("node {id}: commit {tip}")))?;
        let actions_tree = match tree.get_name(ACTIONS_DIR) {
            Some(e) => tree_at_most(&self.repo, e.id(), MAX_ACTIONS_TREE)
                .map_err(|e| e.context(format!("node {id}: {ACTIONS_DIR} at commit {tip}")))?,
            None => return Ok(Vec::new()),
        };
        let mut out = Vec::new();
        let mut cur = Some(tip_commit);
        while let Some(c) = cur {
            let msg = c.message_raw().unwrap_or("");
            let t = Trailers::parse(msg);
            if t.node.as_deref() != Some(id) {
                break;
            }
            if let Err(why) = self.verify_commit(c.id()) {
                return Err(Error::internal(format!(
                    "node {id}: {why}: history this study did not write is refused"
                )));
            }
            let (Some(seq), Some(action)) = (t.seq, t.action) else {
                return Err(Error::internal(format!(
                    "commit {} on node {id} lacks Rsim-Seq/Rsim-Action",
                    c.id()
                )));
            };
            if seq <= after {
                break;
            }
            // Each commit of a node records the action after its parent's: a history whose
            // sequence skips or repeats (grafts, a shallow copy, a rewritten chain) is not the
            // one this study wrote, and a cycle cannot be walked for ever.
            if let Some(prev) = out.last().map(|a: &CommittedAction| a.record.seq)
                && seq.checked_add(1) != Some(prev)
            {
                return Err(Error::internal(format!(
                    "node {id}: commit {} records action {seq} right before action {prev}: \
                     actions are missing from this history (grafts, a shallow copy or a rewritten \
                     chain); history this study did not write is refused",
                    c.id()
                )));
            }
            let name = crate::model::action_file_name(seq, action);
            let entry = actions_tree.get_name(&name).ok_or_else(|| {
                Error::internal(format!(
                    "node {id}: commit {} names {name}, which is missing from the tree",
                    c.id()
                ))
            })?;
            let blob = blob_at_most(&self.repo, entry.id(), MAX_ACTION_FILE)
                .map_err(|e| e.context(format!("node {id}: {ACTIONS_DIR}/{name}")))?;
            let record: ActionRecord = serde_json::from_slice(blob.content())
                .map_err(|e| Error::internal(format!("node {id}: {ACTIONS_DIR}/{name}: {e}")))?;
            if record.seq != seq || record.node != id {
                return Err(Error::internal(format!(
                    "node {id}: {ACTIONS_DIR}/{name} disagrees with commit {} (seq {} node {})",
                    c.id(),
                    record.seq,
                    record.node
                )));
            }
            out.push(CommittedAction {
                commit: c.id(),
                record,
            });
            if seq == 1 {
                break;
            }
            cur = if c.parent_count() > 0 {
                Some(commit_at_most(&self.repo, c.parent_id(0)?)?)
            } else {
                None
            };
        }
        // The walk ended at the node's first action or at the one after `after`, or history is
        // cut short (a parent missing from this copy, another node's commit in its place).
        if let Some(first) = out.last()
            && first.record.seq != after + 1
        {
            return Err(Error::internal(format!(
                "node {id}: its history in this copy starts at action {} (commit {}): actions \
                 {}–{} are missing; history this study did not write is refused",
                first.record.seq,
                first.commit,
                after + 1,
                first.record.seq - 1
            )));
        }
        out.reverse();
        Ok(out)
    }

    /// Create a new node: its first commit has the parents' tips as git parents.
    #[tracing::instrument(level = "trace", name = "git.create_node", skip_all)]
    pub fn create_node(
        &self,
        meta: &NodeMeta,
        first: &ActionRecord,
        parent_tips: &[Oid],
        message: &str,
    ) -> Result<Create> {
        let files = vec![
            TreeFile::new(NODE_FILE, toml_string(meta)?),
            TreeFile::new(
                format!("{ACTIONS_DIR}/{}", first.file_name()),
                json_bytes(first)?,
            ),
        ];
        let sig = Self::signature(&first.agent)?;
        let oid = self.build_packed(|staging| {
            for p in parent_tips {
                staging.import(&self.repo, *p)?;
            }
            let repo = staging.repo();
            let tree = repo.find_tree(self.fresh_tree(repo, &files)?)?;
            let parents: Vec<git2::Commit<'_>> = parent_tips
                .iter()
                .map(|p| repo.find_commit(*p))
                .collect::<std::result::Result<_, _>>()?;
            let parent_refs: Vec<&git2::Commit<'_>> = parents.iter().collect();
            Ok((
                self.write_commit(repo, &sig, message, &tree, &parent_refs)?,
                None,
            ))
        })?;
        // Compare-and-swap against "absent" (the zero id), checked under the ref's lock: a plain
        // non-forced create checks existence before locking and can overwrite a racing writer.
        let log = format!("rsim: create node {}", meta.id);
        match self
            .repo
            .reference_matching(&node_ref(&meta.id), oid, true, Oid::ZERO_SHA1, &log)
        {
            Ok(_) => {
                self.tidy_packs();
                Ok(Create::Created(oid))
            }
            Err(e) if matches!(e.code(), ErrorCode::Exists | ErrorCode::Modified) => {
                Ok(Create::Taken)
            }
            Err(e) if e.code() == ErrorCode::Locked => {
                self.break_stale_ref_lock(&node_ref(&meta.id));
                Ok(Create::Busy)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Append one action to a node whose branch is at `expected_tip`, optionally rewriting `node.toml`
    /// and other state files. Atomic: the branch moves only if it still points at `expected_tip`.
    #[tracing::instrument(level = "trace", name = "git.append", skip_all)]
    pub fn append(
        &self,
        id: &str,
        expected_tip: Oid,
        action: &ActionRecord,
        meta: Option<&NodeMeta>,
        extra: &[TreeFile],
        message: &str,
    ) -> Result<Append> {
        let mut files = vec![TreeFile::new(
            format!("{ACTIONS_DIR}/{}", action.file_name()),
            json_bytes(action)?,
        )];
        if let Some(m) = meta {
            files.push(TreeFile::new(NODE_FILE, toml_string(m)?));
        }
        for f in extra {
            files.push(TreeFile::new(f.path.clone(), f.bytes.clone()));
        }
        let sig = Self::signature(&action.agent)?;
        let oid = self.build_packed(|staging| {
            let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
            staging.import_base(&self.repo, expected_tip, &paths)?;
            let repo = staging.repo();
            let parent = repo.find_commit(expected_tip)?;
            let base = parent.tree()?;
            let tree = repo.find_tree(Self::build_tree(repo, &base, &files)?)?;
            let oid = self.write_commit(repo, &sig, message, &tree, &[&parent])?;
            Ok((oid, Some(base.id())))
        })?;
        let log = format!("rsim: {} on {id}", action.action);
        match self
            .repo
            .reference_matching(&node_ref(id), oid, true, expected_tip, &log)
        {
            Ok(_) => {
                self.tidy_packs();
                Ok(Append::Committed(oid))
            }
            Err(e)
                if matches!(
                    e.code(),
                    ErrorCode::Modified | ErrorCode::Locked | ErrorCode::Exists
                ) =>
            {
                if e.code() == ErrorCode::Locked {
                    self.break_stale_ref_lock(&node_ref(id));
                }
                Ok(Append::Stale)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Remove the lock file of `refname` when it is older than `STALE_REF_LOCK`: a writer killed
    /// while updating the ref left it, and otherwise every later write to the node would wait for
    /// the conflict deadline and fail. The ref itself is intact (it moves by a rename of the lock
    /// file). The lock is renamed aside first and removed only if it is still the file judged
    /// stale; a fresh lock taken meanwhile is put back.
    fn break_stale_ref_lock(&self, refname: &str) {
        use std::os::unix::fs::MetadataExt;
        let lock = self.repo.path().join(format!("{refname}.lock"));
        let Ok(seen) = std::fs::symlink_metadata(&lock) else {
            return;
        };
        let age = seen.modified().ok().and_then(|t| t.elapsed().ok());
        if age.is_none_or(|a| a < STALE_REF_LOCK) {
            return;
        }
        let mut aside = lock.clone().into_os_string();
        aside.push(format!(
            ".stale-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let aside = std::path::PathBuf::from(aside);
        if std::fs::rename(&lock, &aside).is_err() {
            return;
        }
        match std::fs::symlink_metadata(&aside) {
            Ok(m) if m.ino() == seen.ino() && m.dev() == seen.dev() => {
                tracing::warn!(
                    "removed {} left by a writer killed while updating {refname}",
                    lock.display()
                );
                let _ = std::fs::remove_file(&aside);
            }
            _ => {
                let _ = std::fs::rename(&aside, &lock);
            }
        }
    }
}

/// No reflogs in a study's repository: a node branch's history is its signed commits, and
/// nothing reads a reflog (a local, unsigned file anyone with the directory can edit). Writing
/// them cost every action a file append, and every new node one more file.
fn no_reflogs(repo: &Repository) -> Result<()> {
    let mut cfg = repo.config()?;
    if cfg.get_bool("core.logAllRefUpdates").ok() != Some(false) {
        cfg.set_bool("core.logAllRefUpdates", false)?;
    }
    Ok(())
}

/// A ref lock older than this was left by a killed writer: a live writer holds it only for the
/// few small writes of one ref update.
const STALE_REF_LOCK: std::time::Duration = std::time::Duration::from_secs(10);

/// The `Rsim-*` trailers of a commit message.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Trailers {
    pub node: Option<String>,
    pub action: Option<ActionName>,
    pub seq: Option<u32>,
    pub agent: Option<String>,
    pub role: Option<String>,
    pub decision: Option<String>,
    pub rule: Option<String>,
    pub job: Option<String>,
    pub artifacts: Vec<String>,
    pub metrics: Vec<(String, String)>,
    pub parents: Vec<String>,
}

impl Trailers {
    /// The trailers of a message rsim wrote: its last paragraph, line by line. Not git's trailer
    /// heuristics (which stop at a `---` line and take any `Key: value` paragraph): agent text
    /// never reaches the last paragraph (`commit_message` indents it), so nothing an agent writes
    /// can add, hide or replace a trailer.
    pub fn parse(message: &str) -> Trailers {
        let mut t = Trailers::default();
        let message = message.trim_end();
        let block = match message.rfind("\n\n") {
            Some(i) => &message[i + 2..],
            None => return t,
        };
        for line in block.lines() {
            let Some((k, v)) = line.split_once(": ") else {
                continue;
            };
            if !k.starts_with("Rsim-") || k.contains(char::is_whitespace) {
                continue;
            }
            let v = v.trim();
            match k {
                "Rsim-Node" => t.node = Some(v.to_string()),
                "Rsim-Action" => t.action = ActionName::parse(v),
                "Rsim-Seq" => t.seq = v.parse().ok(),
                "Rsim-Agent" => t.agent = Some(v.to_string()),
                "Rsim-Role" => t.role = Some(v.to_string()),
                "Rsim-Decision" => t.decision = Some(v.to_string()),
                "Rsim-Rule" => t.rule = Some(v.to_string()),
                "Rsim-Job" => t.job = Some(v.to_string()),
                "Rsim-Artifact" => t.artifacts.push(v.to_string()),
                "Rsim-Parent-Node" => t.parents.push(v.to_string()),
                "Rsim-Metric" => {
                    if let Some((name, value)) = v.split_once('=') {
                        t.metrics.push((name.to_string(), value.to_string()));
                    }
                }
                _ => {}
            }
        }
        t
    }
}

/// Build the commit message of an action: `<action>: <summary>`, a body, then `Rsim-*` trailers.
///
/// The summary and body may hold agent text (titles, hypotheses, findings, reasons). The summary
/// is one sanitised line; every body line is indented by four spaces (control characters
/// replaced), so no line of it can be read as a trailer, a trailer's continuation or a `---`
/// divider, and the trailer block — generated last, from the structured record — is always the
/// message's last paragraph.
pub fn commit_message(record: &ActionRecord, body: &str, parents: &[String]) -> String {
    let mut msg = format!("{}: {}\n\n", record.action, sanitize_line(&record.summary));
    let body = body.trim();
    if !body.is_empty() {
        for line in body.lines() {
            let line: String = line
                .chars()
                .map(|c| if c.is_control() && c != '\t' { ' ' } else { c })
                .collect();
            let line = line.trim_end();
            if !line.is_empty() {
                msg.push_str("    ");
                msg.push_str(line);
            }
            msg.push('\n');
        }
        msg.push('\n');
    }
    let mut tr = vec![
        ("Rsim-Node", record.node.clone()),
        ("Rsim-Action", record.action.to_string()),
        ("Rsim-Seq", record.seq.to_string()),
        ("Rsim-Agent", record.agent.clone()),
        ("Rsim-Role", record.role.to_string()),
        (
            "Rsim-Decision",
            record.decision.decision.as_str().to_string(),
        ),
    ];
    if let Some(rule) = &record.decision.rule {
        tr.push(("Rsim-Rule", rule.clone()));
    }
    for p in parents {
        tr.push(("Rsim-Parent-Node", p.clone()));
    }
    if let Some(job) = &record.job {
        tr.push(("Rsim-Job", format!("{} {}", job.id, job.state.as_str())));
        tr.push(("Rsim-Env", job.env.clone()));
    }
    for a in &record.artifacts {
        tr.push((
            "Rsim-Artifact",
            format!("{} {} {}", a.kind.as_str(), a.sha256, a.name),
        ));
    }
    for m in &record.metrics {
        tr.push((
            "Rsim-Metric",
            format!("{}/{}/{}={}", m.task, m.split.as_str(), m.name, m.value),
        ));
    }
    for (k, v) in tr {
        msg.push_str(k);
        msg.push_str(": ");
        // An environment is named in full (a Python one: the lock's hash and the versions).
        let max = if k == "Rsim-Env" {
            ENV_TRAILER_MAX
        } else {
            200
        };
        msg.push_str(&crate::util::text::sanitize_line_within(&v, max));
        msg.push('\n');
    }
    msg
}

/// An error that came from reading the study's git objects (a damaged pack: libgit2 reports a
/// zlib or object error, and does not fall back to a good copy of the pack as git does) names the
/// packs that do not read back and what to do, instead of git's bare message; any other error is
/// returned as it is. Nothing was written either way: the commit protocol moves no ref before its
/// objects are built.
pub fn explain_damage(git_dir: &Path, e: Error) -> Error {
    let m = e.message.to_ascii_lowercase();
    let damage = [
        "data check",
        "corrupt",
        "inflate",
        "zlib",
        "packfile",
        "bad object",
    ];
    if e.kind != crate::util::error::ErrorKind::Internal
        // A git error, perhaps with where it was met in front ("commit …: git: …").
        || !(m.starts_with("git:") || m.contains(": git:"))
        || !damage.iter().any(|w| m.contains(w))
    {
        return e;
    }
    let damaged = damaged_packs_once(git_dir);
    if damaged.is_empty() {
        return e;
    }
    Error::invalid(format!(
        "the study's git objects do not read back ({}); nothing was written. Damaged pack(s): \
         {}. A pack handed over with the study may be a damaged copy: move it out of \
         .git/objects/pack (if the other packs hold its objects, `git fsck` then passes) or \
         restore it from the study's source.",
        e.message,
        damaged.join("; ")
    ))
}

/// `packs::damaged_packs`, read once per state of the pack directory (each pack's name, size and
/// mtime) in this process: an agent that loops on a refused write gets the same answer without
/// the packs being read again (up to 64 × 64 MiB each time).
fn damaged_packs_once(git_dir: &Path) -> Vec<String> {
    type Seen =
        std::collections::HashMap<std::path::PathBuf, (Vec<(String, u64, i64)>, Vec<String>)>;
    static SEEN: std::sync::Mutex<Option<Seen>> = std::sync::Mutex::new(None);
    let mut state: Vec<(String, u64, i64)> =
        std::fs::read_dir(git_dir.join("objects").join("pack"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| {
                        use std::os::unix::fs::MetadataExt;
                        let m = e.metadata().ok()?;
                        Some((
                            e.file_name().to_string_lossy().into_owned(),
                            m.len(),
                            m.mtime(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
    state.sort();
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let seen = seen.get_or_insert_with(Default::default);
    if let Some((was, found)) = seen.get(git_dir)
        && *was == state
    {
        return found.clone();
    }
    let found = packs::damaged_packs(git_dir);
    seen.insert(git_dir.to_path_buf(), (state, found.clone()));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ref_lock_left_by_a_killed_writer_is_broken_and_a_fresh_one_kept() {
        let d = tempfile::tempdir().expect("tempdir");
        let record = Record::init(d.path()).expect("init");
        let refname = node_ref("n0");
        let lock = record.repo().path().join(format!("{refname}.lock"));
        std::fs::create_dir_all(lock.parent().expect("dir")).expect("mkdir");
        std::fs::write(&lock, b"").expect("lock");
        record.break_stale_ref_lock(&refname);
        assert!(lock.exists(), "a fresh lock belongs to a live writer");
        let old = std::time::SystemTime::now() - STALE_REF_LOCK * 2;
        std::fs::File::options()
            .write(true)
            .open(&lock)
            .and_then(|f| f.set_modified(old))
            .expect("age the lock");
        record.break_stale_ref_lock(&refname);
        assert!(!lock.exists(), "a stale lock is removed");
        let left: Vec<_> = std::fs::read_dir(lock.parent().expect("dir"))
            .expect("read")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "nothing left aside: {left:?}");
    }
}
