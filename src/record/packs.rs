//! An action's git objects reach the disk as one pack, not one file each.
//!
//! What a write costs on a Linux filesystem is mostly making files (ext4's inode allocation: over
//! half the time of a recorded action went there), not writing bytes. Written loose, an append
//! makes four object files (the action's blob, the node's `actions/` tree, its root tree, the
//! commit) and a new node five; a bare libgit2 commit makes three. Here the objects are built in
//! a repository that lives in memory (libgit2's mempack: `Staging`, into which what the commit
//! builds on is copied from the study), and the objects the new commit adds are written as one
//! pack with its index: two files (`write_pack`), fsynced with their directory under `[record]
//! fsync`, however many objects. The pack is complete and indexed before the branch that names
//! its commit moves, so a crash leaves at most an unreferenced pack, as it left unreferenced
//! loose objects before. The pack and index are git's own formats (version 2, as `git
//! index-pack` writes them): git, libgit2 and every clone read them as any other pack.
//!
//! Packs are kept few (`tidy`): past `MAX_PACKS`, the smallest are merged into one until each pack
//! left is at least twice all smaller ones together (a geometric progression, as `git repack
//! --geometric=2` keeps), so a study of n actions holds O(log n) packs and an object is copied
//! O(log n) times in its life. Merging copies each object's stored bytes as they are (a delta
//! against an offset becomes a delta against its base's id, which stays valid wherever the entry
//! lands); nothing is searched for deltas, and each object is read back from its own pack with
//! its hash checked before its pack is merged. The merged pack is complete and indexed before any
//! pack it replaces is removed, index first, so every object stays readable throughout: a reader
//! whose pack vanished finds the object again in the merged pack (libgit2 and git both rescan the
//! pack directory when an object is missing). A pack whose checksum does not match its content,
//! or that names an object it does not hold, is set aside with a `.keep` saying why (so it is read
//! once, not at every write); one that is kept (`.keep`, `.promisor`), a cruft pack (`.mtimes`),
//! not a regular file, large, or covered by a multi-pack index, is left alone; a merge reads at
//! most `MERGE_BUDGET` bytes of packs. One process merges at a time (a lock file beside the packs; one left by a process that
//! died is broken after `STALE_LOCK`), and each merge is counted in `MERGES_FILE`, so that a
//! long-lived handle knows to reopen the repository and let go of the packs that are gone.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use git2::{ObjectType, Odb, Oid, Repository};
use sha1::{Digest, Sha1};

use crate::util::error::{Error, Result};

/// More packs than this in a study and the smallest are merged (`tidy`).
pub const MAX_PACKS: usize = 16;

/// Packs larger than this are not merged (a `git gc`'s, or merged many times already).
const MERGE_LIMIT: u64 = 32 << 20;

/// At most this many bytes of packs go into one merge (a study handed over with many packs is
/// merged a part at a time, each in bounded memory).
const MERGE_BUDGET: u64 = 64 << 20;

/// An object larger than this in a pack another process wrote stops that pack from being merged:
/// checking it would inflate it whole (a small delta can describe a huge object).
const OBJECT_LIMIT: usize = 64 << 20;

/// A merge lock older than this was left by a process that died while merging.
const STALE_LOCK: std::time::Duration = std::time::Duration::from_secs(120);

/// A temporary pack file older than this was left by a writer that died.
const STALE_TEMPORARY: std::time::Duration = std::time::Duration::from_secs(3600);

/// The lock file beside the packs while one process merges them.
const LOCK_FILE: &str = "rsim-merge.lock";

/// In the git directory: one byte appended per merge (its size is the number of merges).
pub const MERGES_FILE: &str = "rsim-pack-merges";

/// Objects held in memory before the staging repository forgets them (they are on disk by then).
const STAGED_MAX: usize = 4096;

/// A repository whose objects live in memory only (libgit2's mempack): a write builds its objects
/// here, after `import` copied in what it builds on (the parent commit, its tree and the trees on
/// the way to the files it changes) from the study. No disk backend: libgit2 looks for every object
/// it is asked to write in each backend first and rereads the pack directory when it is missing
/// (so once per object written, with the study's packs as a backend), and keeps each pack it ever
/// loaded. The objects of the last writes stay in memory (until `STAGED_MAX`), so the next write
/// to a node finds its parent here.
pub struct Staging {
    repo: Repository,
    /// The in-memory backend of `repo`'s object database (owned by it).
    memory: *mut libgit2_sys::git_odb_backend,
    staged: std::cell::Cell<usize>,
}

// SAFETY: `memory` points into `repo`'s object database, which owns it and frees it with the
// repository; the two move together, and a `Repository` may move between threads.
unsafe impl Send for Staging {}

impl Staging {
    pub fn new() -> Result<Staging> {
        let odb = Odb::new()?;
        let memory = git2::Binding::raw(&odb.add_new_mempack_backend(1000)?);
        // The repository takes its own reference to the object database (and so its backends).
        let repo = Repository::from_odb(odb)?;
        Ok(Staging {
            repo,
            memory,
            staged: std::cell::Cell::new(0),
        })
    }

    /// Copy object `id` from `from` into memory, unless it is there already.
    pub fn import(&self, from: &Repository, id: Oid) -> Result<()> {
        let odb = self.repo.odb()?;
        if odb.exists(id) {
            return Ok(());
        }
        let from = from.odb()?;
        let o = from.read(id)?;
        odb.write(o.kind(), o.data())?;
        self.staged.set(self.staged.get() + 1);
        Ok(())
    }

    /// Copy in what a commit on `parent` that writes `paths` builds on: the parent commit, its
    /// tree, and each tree of it on the way to a path (the directories the builder rewrites).
    /// What memory holds already is not read from the study again.
    pub fn import_base(&self, from: &Repository, parent: Oid, paths: &[&str]) -> Result<()> {
        self.import(from, parent)?;
        let root = self.repo.find_commit(parent)?.tree_id();
        self.import(from, root)?;
        for path in paths {
            let mut tree = self.repo.find_tree(root)?;
            let mut dirs: Vec<&str> = path.split('/').collect();
            dirs.pop();
            for dir in dirs {
                let id = match tree.get_name(dir) {
                    Some(e) if e.kind() == Some(ObjectType::Tree) => e.id(),
                    _ => break,
                };
                self.import(from, id)?;
                tree = self.repo.find_tree(id)?;
            }
        }
        Ok(())
    }

    pub fn repo(&self) -> &Repository {
        &self.repo
    }

    /// `n` objects were written to disk from memory: past `STAGED_MAX`, memory is emptied.
    pub fn written(&self, n: usize) {
        let staged = self.staged.get() + n;
        if staged > STAGED_MAX {
            // SAFETY: `memory` is alive as long as `self.repo` (see the type's text).
            unsafe {
                libgit2_sys::git_mempack_reset(self.memory);
            }
            self.staged.set(0);
        } else {
            self.staged.set(staged);
        }
    }
}

/// One object to pack: its id, kind and content.
pub struct Object {
    pub id: Oid,
    pub kind: ObjectType,
    pub data: Vec<u8>,
}

/// The objects commit `commit` adds to what the tree `base` (its first parent's) holds: the
/// commit, and each tree and blob of its tree whose id `base` does not hold at the same path.
pub fn new_objects(repo: &Repository, commit: Oid, base: Option<Oid>) -> Result<Vec<Object>> {
    let odb = repo.odb()?;
    let read = |id: Oid| -> Result<Object> {
        let o = odb.read(id)?;
        Ok(Object {
            id,
            kind: o.kind(),
            data: o.data().to_vec(),
        })
    };
    let mut out = vec![read(commit)?];
    let tree = repo.find_commit(commit)?.tree_id();
    let base = match base {
        Some(b) => Some(repo.find_tree(b)?),
        None => None,
    };
    fn walk(
        repo: &Repository,
        tree: Oid,
        base: Option<&git2::Tree<'_>>,
        read: &dyn Fn(Oid) -> Result<Object>,
        out: &mut Vec<Object>,
    ) -> Result<()> {
        if base.is_some_and(|b| b.id() == tree) {
            return Ok(());
        }
        out.push(read(tree)?);
        let t = repo.find_tree(tree)?;
        for e in t.iter() {
            let before = base.and_then(|b| b.get_name_bytes(e.name_bytes()));
            if before.as_ref().is_some_and(|b| b.id() == e.id()) {
                continue;
            }
            match e.kind() {
                Some(ObjectType::Tree) => {
                    let sub = match &before {
                        Some(b) if b.kind() == Some(ObjectType::Tree) => {
                            Some(repo.find_tree(b.id())?)
                        }
                        _ => None,
                    };
                    walk(repo, e.id(), sub.as_ref(), read, out)?;
                }
                Some(ObjectType::Blob) => out.push(read(e.id())?),
                // A submodule's commit lives in another repository.
                _ => {}
            }
        }
        Ok(())
    }
    walk(repo, tree, base.as_ref(), &read, &mut out)?;
    Ok(out)
}

fn type_code(kind: ObjectType) -> Result<u8> {
    Ok(match kind {
        ObjectType::Commit => 1,
        ObjectType::Tree => 2,
        ObjectType::Blob => 3,
        ObjectType::Tag => 4,
        other => {
            return Err(Error::internal(format!(
                "cannot pack an object of kind {other}"
            )));
        }
    })
}

/// An entry's header: its type and its (uncompressed) size, in git's variable-length encoding.
fn entry_header(out: &mut Vec<u8>, code: u8, size: u64) {
    let mut b = (code << 4) | (size & 0x0f) as u8;
    let mut rest = size >> 4;
    while rest > 0 {
        out.push(b | 0x80);
        b = (rest & 0x7f) as u8;
        rest >>= 7;
    }
    out.push(b);
}

/// One entry of a pack: its object's id, the CRC-32 of its stored bytes and its offset.
#[derive(Clone, Copy)]
struct Entry {
    id: Oid,
    crc: u32,
    offset: u64,
}

/// A pack's bytes (header, entries, checksum) from entries already encoded.
struct PackBuf {
    bytes: Vec<u8>,
    entries: Vec<Entry>,
}

impl PackBuf {
    fn new(count: usize) -> PackBuf {
        let mut bytes = Vec::with_capacity(64 + count * 256);
        bytes.extend_from_slice(b"PACK");
        bytes.extend_from_slice(&2u32.to_be_bytes());
        bytes.extend_from_slice(&(count as u32).to_be_bytes());
        PackBuf {
            bytes,
            entries: Vec::with_capacity(count),
        }
    }

    /// Add an entry whose stored bytes are `stored`, with their CRC-32 if known.
    fn push_stored(&mut self, id: Oid, stored: &[u8], crc: Option<u32>) {
        let offset = self.bytes.len() as u64;
        self.bytes.extend_from_slice(stored);
        let crc = crc.unwrap_or_else(|| crc32fast::hash(stored));
        self.entries.push(Entry { id, crc, offset });
    }

    /// Write the pack and its index into `dir` (see `write_pack`).
    fn finish(mut self, dir: &Path, fsync: bool) -> Result<String> {
        let count =
            u32::from_be_bytes([self.bytes[8], self.bytes[9], self.bytes[10], self.bytes[11]]);
        if count as usize != self.entries.len() {
            // Fewer entries than announced (duplicates dropped): the header says what is there.
            self.bytes[8..12].copy_from_slice(&(self.entries.len() as u32).to_be_bytes());
        }
        let sum = Sha1::digest(&self.bytes);
        self.bytes.extend_from_slice(&sum);
        let idx = index_bytes(&mut self.entries, &sum);
        let name = format!("pack-{}", hex(&sum));
        put_file(
            dir,
            "tmp_pack_",
            &dir.join(format!("{name}.pack")),
            &self.bytes,
            fsync,
        )?;
        // The index last: a pack is not read before its index exists.
        put_file(
            dir,
            "tmp_idx_",
            &dir.join(format!("{name}.idx")),
            &idx,
            fsync,
        )?;
        if fsync {
            sync_dir(dir)?;
        }
        written_here(&name);
        Ok(name)
    }
}

/// Packs this process wrote, by name (`pack-<checksum>`): built from objects whose ids libgit2
/// computed from their content, or merged from packs checked or written here, so merging them
/// again needs no check of their objects.
static WRITTEN_HERE: std::sync::Mutex<Option<HashSet<String>>> = std::sync::Mutex::new(None);

fn written_here(name: &str) {
    let mut set = WRITTEN_HERE.lock().unwrap_or_else(|e| e.into_inner());
    let set = set.get_or_insert_with(HashSet::new);
    // Bounded: forgetting one only costs a check when it is merged.
    if set.len() >= 1 << 14 {
        set.clear();
    }
    set.insert(name.to_string());
}

fn was_written_here(stem: &Path) -> bool {
    let Some(name) = stem.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    WRITTEN_HERE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|s| s.contains(name))
}

/// How many packs `dir` holds, by name alone (no file is looked at).
fn pack_names(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|e| e.file_name().as_encoded_bytes().ends_with(b".pack"))
            .count()
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Write `objects` into `dir` (a repository's `objects/pack`) as one pack and its index (both
/// through a temporary file renamed into place; the index after the pack; with `fsync`, each
/// file and then the directory are fsynced). Returns the pack's name (`pack-<checksum>`), or
/// None when there was nothing to write.
#[tracing::instrument(level = "trace", name = "git.pack", skip_all)]
pub fn write_pack(dir: &Path, objects: &[Object], fsync: bool) -> Result<Option<String>> {
    if objects.is_empty() {
        return Ok(None);
    }
    let mut pack = PackBuf::new(objects.len());
    let mut seen = HashSet::with_capacity(objects.len());
    let mut stored = Vec::with_capacity(256);
    // One compressor for all the objects (its state is large to set up).
    let mut z = flate2::Compress::new(flate2::Compression::fast(), true);
    for o in objects {
        if !seen.insert(o.id) {
            continue;
        }
        stored.clear();
        entry_header(&mut stored, type_code(o.kind)?, o.data.len() as u64);
        deflate(&mut z, &o.data, &mut stored)?;
        pack.push_stored(o.id, &stored, None);
    }
    pack.finish(dir, fsync).map(Some)
}

/// Append `data` to `out` as one zlib stream, with `z` (reset for the next stream after).
fn deflate(z: &mut flate2::Compress, data: &[u8], out: &mut Vec<u8>) -> Result<()> {
    let start = z.total_in();
    loop {
        out.reserve(data.len() / 2 + 64);
        let done = (z.total_in() - start) as usize;
        let status = z
            .compress_vec(&data[done..], out, flate2::FlushCompress::Finish)
            .map_err(|e| Error::internal(format!("cannot compress an object: {e}")))?;
        if status == flate2::Status::StreamEnd {
            break;
        }
    }
    z.reset();
    Ok(())
}

/// A version 2 pack index for `entries` of the pack whose checksum is `pack_sum`.
fn index_bytes(entries: &mut [Entry], pack_sum: &[u8]) -> Vec<u8> {
    entries.sort_by(|a, b| a.id.as_bytes().cmp(b.id.as_bytes()));
    let n = entries.len();
    let mut out = Vec::with_capacity(8 + 1024 + n * 28 + 40);
    out.extend_from_slice(&[0xff, b't', b'O', b'c', 0, 0, 0, 2]);
    let mut fan = [0u32; 256];
    for e in entries.iter() {
        fan[e.id.as_bytes()[0] as usize] += 1;
    }
    let mut total = 0u32;
    for f in fan {
        total += f;
        out.extend_from_slice(&total.to_be_bytes());
    }
    for e in entries.iter() {
        out.extend_from_slice(e.id.as_bytes());
    }
    for e in entries.iter() {
        out.extend_from_slice(&e.crc.to_be_bytes());
    }
    let mut large = Vec::new();
    for e in entries.iter() {
        if e.offset < 0x8000_0000 {
            out.extend_from_slice(&(e.offset as u32).to_be_bytes());
        } else {
            out.extend_from_slice(&(0x8000_0000u32 | large.len() as u32).to_be_bytes());
            large.push(e.offset);
        }
    }
    for o in large {
        out.extend_from_slice(&o.to_be_bytes());
    }
    out.extend_from_slice(pack_sum);
    let sum = Sha1::digest(&out);
    out.extend_from_slice(&sum);
    out
}

/// Write `bytes` to `path` through a temporary file in `dir` renamed into place (read-only, as
/// git keeps its packs), fsynced first with `fsync`.
fn put_file(dir: &Path, prefix: &str, path: &Path, bytes: &[u8], fsync: bool) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |e: std::io::Error| Error::internal(format!("cannot write {}: {e}", path.display()));
    let tmp = dir.join(format!("{prefix}{:016x}", rand::random::<u64>()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            if fsync {
                f.sync_all()?;
            }
            Ok(())
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::internal(format!("cannot fsync {}: {e}", dir.display())))
}

/// The packs in `dir` that may be merged, smallest first: (path without extension, bytes). None
/// under a multi-pack index.
fn packs(dir: &Path) -> Vec<(PathBuf, u64)> {
    // A multi-pack index (`git maintenance`, `git repack --write-midx`) names the packs it
    // covers: removing one under it is git's to do, not ours.
    if dir.join("multi-pack-index").exists() {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().and_then(|x| x.to_str()) != Some("pack") {
            continue;
        }
        let stem = path.with_extension("");
        // A pack still being written has no index yet; a kept one (`.keep`, `.promisor`) or a
        // cruft pack of unreachable objects (`.mtimes`) is the owner's to repack.
        // Regular files only: a symlink or a FIFO handed over in a repository is not followed.
        let regular = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file());
        if !e.file_type().is_ok_and(|t| t.is_file())
            || !regular(&stem.with_extension("idx"))
            || ["keep", "promisor", "mtimes"]
                .iter()
                .any(|x| stem.with_extension(x).exists())
        {
            continue;
        }
        if let Ok(m) = e.metadata()
            && m.len() <= MERGE_LIMIT
        {
            out.push((stem, m.len()));
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// How many of `sizes` (ascending) to merge so that each pack left is at least twice all the
/// packs below it together; at least two.
fn merge_count(sizes: &[u64]) -> usize {
    let mut below = 0u64;
    let mut last_short = 0;
    for (i, &s) in sizes.iter().enumerate() {
        if i > 0 && s < below.saturating_mul(2) {
            last_short = i;
        }
        below = below.saturating_add(s);
    }
    (last_short + 1).max(2).min(sizes.len())
}

/// A pack read whole, with its index's entries, checked: the index is version 2 and names the
/// pack's checksum, the checksum matches the pack's bytes, and the counts agree.
struct ReadPack {
    bytes: Vec<u8>,
    /// By offset.
    entries: Vec<Entry>,
}

/// The bytes of `path` if it is a regular file (not through a symlink, never waiting on a FIFO)
/// of at most `MERGE_LIMIT` bytes.
fn read_regular(path: &Path) -> std::result::Result<Vec<u8>, String> {
    crate::util::file::read_regular(path, MERGE_LIMIT).map_err(|e| e.to_string())
}

fn read_pack(stem: &Path) -> std::result::Result<ReadPack, String> {
    let idx_path = stem.with_extension("idx");
    let idx = read_regular(&idx_path)?;
    let bad = |why: &str| format!("{}: {why}", idx_path.display());
    let be32 = |b: &[u8], at: usize| -> std::result::Result<u32, String> {
        b.get(at..at + 4)
            .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
            .ok_or_else(|| bad("truncated"))
    };
    if idx.len() < 8 + 1024 + 40 || idx[..8] != [0xff, b't', b'O', b'c', 0, 0, 0, 2] {
        return Err(bad("not a version 2 pack index"));
    }
    let n = be32(&idx, 8 + 255 * 4)? as usize;
    let ids_at = 8 + 1024;
    let crcs_at = ids_at + n * 20;
    let offs_at = crcs_at + n * 4;
    let large_at = offs_at + n * 4;
    if idx.len() < large_at + 40 {
        return Err(bad("truncated"));
    }
    let (body, sum) = idx.split_at(idx.len() - 20);
    if Sha1::digest(body).as_slice() != sum {
        return Err(bad("its checksum does not match its content"));
    }
    let pack_sum = &idx[idx.len() - 40..idx.len() - 20];
    let large_n = (idx.len() - 40 - large_at) / 8;
    let mut entries = Vec::with_capacity(n);
    for i in 0..n {
        let id = Oid::from_bytes(&idx[ids_at + i * 20..ids_at + i * 20 + 20])
            .map_err(|e| bad(e.message()))?;
        let crc = be32(&idx, crcs_at + i * 4)?;
        let off = be32(&idx, offs_at + i * 4)?;
        let offset = if off & 0x8000_0000 == 0 {
            u64::from(off)
        } else {
            let k = (off & 0x7fff_ffff) as usize;
            if k >= large_n {
                return Err(bad("a large offset out of its table"));
            }
            let at = large_at + k * 8;
            u64::from_be_bytes(idx[at..at + 8].try_into().map_err(|_| bad("truncated"))?)
        };
        entries.push(Entry { id, crc, offset });
    }
    let pack_path = stem.with_extension("pack");
    let bytes = read_regular(&pack_path)?;
    let bad = |why: &str| format!("{}: {why}", pack_path.display());
    if bytes.len() < 32
        || &bytes[..4] != b"PACK"
        || !matches!(be32(&bytes, 4), Ok(2 | 3))
        || be32(&bytes, 8).ok() != Some(n as u32)
    {
        return Err(bad("not a pack of the index's objects"));
    }
    let (content, trailer) = bytes.split_at(bytes.len() - 20);
    if trailer != pack_sum || Sha1::digest(content).as_slice() != trailer {
        return Err(bad("its checksum does not match its content or its index"));
    }
    entries.sort_by_key(|e| e.offset);
    let end = (bytes.len() - 20) as u64;
    if entries.iter().any(|e| e.offset < 12 || e.offset >= end)
        || entries.windows(2).any(|w| w[0].offset == w[1].offset)
    {
        return Err(bad("an entry outside the pack"));
    }
    Ok(ReadPack { bytes, entries })
}

/// Read every object of `pack` back through libgit2 from that pack alone, which checks each
/// object's content against its id (deltas applied): a pack that names an object it does not
/// hold is not merged (merging keeps one copy of each id, and would otherwise drop a good copy
/// for a bad one).
fn verify_objects(stem: &Path, pack: &ReadPack) -> std::result::Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let idx = stem.with_extension("idx");
    let name = std::ffi::CString::new(idx.as_os_str().as_bytes())
        .map_err(|_| format!("{}: a NUL in the path", idx.display()))?;
    let odb = Odb::new().map_err(|e| e.message().to_string())?;
    let mut backend: *mut libgit2_sys::git_odb_backend = std::ptr::null_mut();
    // SAFETY: `name` is a NUL-terminated path; on success libgit2 hands back a backend that the
    // object database owns once added (and frees with it).
    let rc = unsafe { libgit2_sys::git_odb_backend_one_pack(&mut backend, name.as_ptr()) };
    if rc != 0 || backend.is_null() {
        return Err(format!("{}: libgit2 cannot open it ({rc})", idx.display()));
    }
    // SAFETY: `odb` is a live object database and `backend` a fresh backend no one else owns.
    let rc = unsafe { libgit2_sys::git_odb_add_backend(git2::Binding::raw(&odb), backend, 1) };
    if rc != 0 {
        // SAFETY: not added, so still ours to free, through its own `free`.
        unsafe {
            if let Some(free) = (*backend).free {
                free(backend);
            }
        }
        return Err(format!("{}: libgit2 cannot read it ({rc})", idx.display()));
    }
    for e in &pack.entries {
        let (size, _) = odb
            .read_header(e.id)
            .map_err(|err| format!("{}: object {}: {}", idx.display(), e.id, err.message()))?;
        if size > OBJECT_LIMIT {
            return Err(format!(
                "{}: object {} is {size} bytes, over the {OBJECT_LIMIT} a merge checks",
                idx.display(),
                e.id
            ));
        }
        odb.read(e.id).map_err(|err| {
            format!(
                "{}: object {} does not read back: {}",
                idx.display(),
                e.id,
                err.message()
            )
        })?;
    }
    Ok(())
}

/// The bytes of `entries[i]` of `pack` as they go into another pack: copied as they are, except
/// that a delta against an offset (which would point elsewhere in the new pack) becomes a delta
/// against its base's id. None for an entry that cannot be read (the pack is then not merged).
fn moved_entry(
    pack: &ReadPack,
    i: usize,
    by_offset: &HashMap<u64, Oid>,
) -> Option<(Vec<u8>, Option<u32>)> {
    let e = pack.entries[i];
    let end = pack
        .entries
        .get(i + 1)
        .map_or((pack.bytes.len() - 20) as u64, |n| n.offset);
    let stored = pack.bytes.get(e.offset as usize..end as usize)?;
    if crc32fast::hash(stored) != e.crc {
        return None;
    }
    let code = (stored[0] >> 4) & 7;
    let mut at = 0;
    while stored.get(at)? & 0x80 != 0 {
        at += 1;
    }
    let header_len = at + 1;
    match code {
        1..=4 | 7 => Some((stored.to_vec(), Some(e.crc))),
        6 => {
            // The base's distance back, in git's offset encoding.
            let mut at = header_len;
            let mut b = *stored.get(at)?;
            let mut rel = u64::from(b & 0x7f);
            while b & 0x80 != 0 {
                at += 1;
                b = *stored.get(at)?;
                rel = ((rel + 1) << 7) | u64::from(b & 0x7f);
            }
            let base = by_offset.get(&e.offset.checked_sub(rel)?)?;
            let mut out = Vec::with_capacity(stored.len() + 20);
            out.push((stored[0] & 0x8f) | (7 << 4));
            out.extend_from_slice(&stored[1..header_len]);
            out.extend_from_slice(base.as_bytes());
            out.extend_from_slice(&stored[at + 1..]);
            Some((out, None))
        }
        _ => None,
    }
}

/// Keep the study's packs few: with more than `MAX_PACKS` in `git_dir`, merge the smallest (see
/// the module's text). Returns how many packs were merged into one (0: nothing to do, or another
/// process is merging).
#[tracing::instrument(level = "trace", name = "git.tidy", skip_all)]
pub fn tidy(git_dir: &Path, fsync: bool) -> Result<usize> {
    tidy_above(git_dir, MAX_PACKS, fsync)
}

pub(crate) fn tidy_above(git_dir: &Path, max: usize, fsync: bool) -> Result<usize> {
    let dir = git_dir.join("objects").join("pack");
    // Each write asks: one directory listing, nothing more, until there are too many.
    if pack_names(&dir) <= max || packs(&dir).len() <= max {
        return Ok(0);
    }
    let Some(_lock) = MergeLock::take(&dir) else {
        return Ok(0);
    };
    remove_stale_temporaries(&dir);
    // Listed again under the lock: another process may have merged meanwhile.
    let all = packs(&dir);
    if all.len() <= max {
        return Ok(0);
    }
    let sizes: Vec<u64> = all.iter().map(|p| p.1).collect();
    let mut merged = Vec::new();
    let mut entries: Vec<(Oid, Vec<u8>, Option<u32>)> = Vec::new();
    let mut seen = HashSet::new();
    let mut budget = MERGE_BUDGET;
    for (stem, size) in &all[..merge_count(&sizes)] {
        if *size > budget && merged.len() >= 2 {
            break;
        }
        budget = budget.saturating_sub(*size);
        let checked = |p: ReadPack| {
            if was_written_here(stem) {
                Ok(p)
            } else {
                verify_objects(stem, &p).map(|()| p)
            }
        };
        let pack = match read_pack(stem).and_then(checked) {
            Ok(p) => p,
            Err(why) => {
                set_aside(stem, &why);
                continue;
            }
        };
        let by_offset: HashMap<u64, Oid> = pack.entries.iter().map(|e| (e.offset, e.id)).collect();
        let moved: Option<Vec<_>> = (0..pack.entries.len())
            .map(|i| moved_entry(&pack, i, &by_offset).map(|m| (pack.entries[i].id, m)))
            .collect();
        let Some(moved) = moved else {
            set_aside(stem, "an entry that cannot be moved");
            continue;
        };
        for (id, (stored, crc)) in moved {
            if seen.insert(id) {
                entries.push((id, stored, crc));
            }
        }
        merged.push(stem.clone());
    }
    if merged.len() < 2 {
        return Ok(0);
    }
    // The trees that are older copies of another tree here go in as deltas against it
    // (`delta`: what keeps a node's record linear in its actions).
    let listed: Vec<(Oid, &[u8])> = entries
        .iter()
        .map(|(id, s, _)| (*id, s.as_slice()))
        .collect();
    let mut deltas: HashMap<Oid, Vec<u8>> = HashMap::new();
    let mut z = flate2::Compress::new(flate2::Compression::fast(), true);
    for (id, base, delta) in super::delta::plan(&listed) {
        let mut stored = Vec::with_capacity(32 + delta.len());
        entry_header(&mut stored, 7, delta.len() as u64);
        stored.extend_from_slice(base.as_bytes());
        deflate(&mut z, &delta, &mut stored)?;
        deltas.insert(id, stored);
    }
    let mut out = PackBuf::new(entries.len());
    for (id, stored, crc) in &entries {
        match deltas.get(id) {
            Some(d) => out.push_stored(*id, d, None),
            None => out.push_stored(*id, stored, *crc),
        }
    }
    let fresh = out.finish(&dir, fsync)?;
    // Every object of the merged packs is in the new one, written and indexed: the merged ones
    // go, index first (no reader finds an index without its pack).
    for stem in &merged {
        if stem.file_name().and_then(|n| n.to_str()) == Some(fresh.as_str()) {
            continue;
        }
        for ext in ["idx", "rev", "bitmap", "mtimes", "pack"] {
            let _ = std::fs::remove_file(stem.with_extension(ext));
        }
    }
    count_merge(git_dir);
    Ok(merged.len())
}

/// Leave a pack that cannot be merged as it is, for good: a `.keep` beside it (git's own mark for
/// a pack not to repack, so no later merge reads it again), saying why. Made with O_EXCL, so an
/// existing file or link there is never written through.
fn set_aside(stem: &Path, why: &str) {
    tracing::warn!("a pack is left as it is, not merged: {why}");
    let keep = stem.with_extension("keep");
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&keep)
        .and_then(|mut f| f.write_all(format!("rsim: not merged: {why}\n").as_bytes()));
    if let Err(e) = made {
        tracing::warn!("cannot mark {}: {e}", keep.display());
    }
}

/// Remove the temporary files of pack writes that died (a killed writer's `tmp_pack_*` and
/// `tmp_idx_*`), once they are an hour old: a live write renames its own within moments.
fn remove_stale_temporaries(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("tmp_pack_") || name.starts_with("tmp_idx_")) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_TEMPORARY);
        if old {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Count one merge in `MERGES_FILE` (a byte appended): handles opened before it reopen the
/// repository (`merges_seen`).
fn count_merge(git_dir: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let path = git_dir.join(MERGES_FILE);
    // Not through a symlink: a repository handed over could point it at any file of the user's.
    let done = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .and_then(|mut f| f.write_all(b"m"));
    if let Err(e) = done {
        tracing::warn!("cannot count a pack merge in {}: {e}", path.display());
    }
}

/// The packs of `git_dir` whose objects do not read back (a handed-over repository with a
/// damaged copy of a pack: libgit2 reads from it and does not fall back to a good copy), each
/// with why, checked as a merge checks a pack another process wrote. Packs with no index,
/// anything not a regular file, and packs over the size a merge checks are left out.
pub fn damaged_packs(git_dir: &Path) -> Vec<String> {
    let dir = git_dir.join("objects").join("pack");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut stems: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pack"))
        .map(|p| p.with_extension(""))
        .filter(|s| std::fs::symlink_metadata(s.with_extension("idx")).is_ok_and(|m| m.is_file()))
        .filter(|s| {
            std::fs::symlink_metadata(s.with_extension("pack"))
                .is_ok_and(|m| m.is_file() && m.len() <= MERGE_LIMIT)
        })
        .collect();
    stems.sort();
    // The error path of a write, not a repair tool: a repository handed over with thousands of
    // packs gets the first ones checked (and says so), not an hour of reading.
    let more = stems.len().saturating_sub(DAMAGE_CHECKS);
    let mut found: Vec<String> = stems
        .iter()
        .take(DAMAGE_CHECKS)
        .filter_map(|stem| {
            read_pack(stem)
                .and_then(|pack| verify_objects(stem, &pack))
                .err()
        })
        .collect();
    if more > 0 && !found.is_empty() {
        found.push(format!("{more} more pack(s) not checked"));
    }
    found
}

/// Packs `damaged_packs` checks at most.
const DAMAGE_CHECKS: usize = 64;

/// How many merges `git_dir` has seen (see `count_merge`).
pub fn merges_seen(git_dir: &Path) -> u64 {
    std::fs::symlink_metadata(git_dir.join(MERGES_FILE))
        .ok()
        .filter(|m| m.is_file())
        .map_or(0, |m| m.len())
}

/// The merge lock: a file made with O_EXCL beside the packs, removed when dropped.
struct MergeLock(PathBuf);

impl MergeLock {
    fn take(dir: &Path) -> Option<MergeLock> {
        let path = dir.join(LOCK_FILE);
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(_) => return Some(MergeLock(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let stale = std::fs::metadata(&path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > STALE_LOCK);
                    if !stale {
                        return None;
                    }
                    tracing::warn!(
                        "removed {} left by a process that died while merging packs",
                        path.display()
                    );
                    let _ = std::fs::remove_file(&path);
                }
                Err(_) => return None,
            }
        }
        None
    }
}

impl Drop for MergeLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_leaves_a_geometric_progression() {
        // Equal small packs: all merge.
        assert_eq!(merge_count(&[5, 5, 5, 5]), 4);
        // A big pack at the top that is more than twice the rest stays.
        assert_eq!(merge_count(&[5, 5, 5, 100]), 3);
        // Already geometric: the two smallest still merge (the caller only asks above the bound).
        assert_eq!(merge_count(&[1, 3, 9, 27]), 2);
        // Doubling is not enough: each must be twice all below it together.
        assert_eq!(merge_count(&[1, 2, 4, 8, 16]), 5);
        // A middle pack too small for what lies below it goes too.
        assert_eq!(merge_count(&[5, 5, 12, 30, 200]), 4);
    }

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .expect("git");
        assert!(
            out.status.success(),
            "git {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Commit `n` files (each a long, similar text: git's repack makes deltas of them) on `main`
    /// through the staging repository, one pack per commit, as the record writes.
    fn packed_commits(dir: &Path, n: usize) -> Vec<Oid> {
        Repository::init(dir).expect("init");
        packed_commits_on(dir, n)
    }

    fn packed_commits_on(dir: &Path, n: usize) -> Vec<Oid> {
        let repo = Repository::open(dir).expect("open");
        let staging = Staging::new().expect("staging");
        let sig = git2::Signature::now("t", "t@example.invalid").expect("sig");
        let pack_dir = repo.path().join("objects").join("pack");
        let mut tip: Option<Oid> = repo.refname_to_id("refs/heads/main").ok();
        let start = tip.map_or(0, |_| 100);
        let mut commits = Vec::new();
        for i in start..start + n {
            let s = staging.repo();
            if let Some(t) = tip {
                staging.import_base(&repo, t, &[]).expect("import");
            }
            let parent = tip.map(|t| s.find_commit(t).expect("parent"));
            let base = parent.as_ref().map(|p| p.tree().expect("tree"));
            let mut tb = s.treebuilder(base.as_ref()).expect("tb");
            let text = format!(
                "{}line {i}\n",
                "the same long line of text, again and again\n".repeat(40)
            );
            tb.insert(
                format!("f{i}.txt"),
                s.blob(text.as_bytes()).expect("blob"),
                0o100644,
            )
            .expect("insert");
            let tree = s.find_tree(tb.write().expect("tree")).expect("tree");
            let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
            let c = s
                .commit(None, &sig, &sig, &format!("c{i}"), &tree, &parents)
                .expect("commit");
            let objects = new_objects(s, c, base.as_ref().map(|b| b.id())).expect("objects");
            // A new file: the commit, the root tree and the blob, nothing the parent holds.
            assert_eq!(objects.len(), 3);
            write_pack(&pack_dir, &objects, i % 2 == 0).expect("pack");
            staging.written(objects.len());
            repo.reference("refs/heads/main", c, true, "t")
                .expect("ref");
            tip = Some(c);
            commits.push(c);
        }
        commits
    }

    fn pack_count(dir: &Path) -> usize {
        std::fs::read_dir(dir.join(".git/objects/pack"))
            .expect("pack dir")
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "pack"))
            .count()
    }

    #[test]
    fn written_packs_are_gits_own_format() {
        let d = tempfile::tempdir().expect("tempdir");
        let commits = packed_commits(d.path(), 5);
        assert_eq!(pack_count(d.path()), 5);
        for e in std::fs::read_dir(d.path().join(".git/objects/pack"))
            .expect("dir")
            .flatten()
        {
            if e.path().extension().is_some_and(|x| x == "idx") {
                git(
                    d.path(),
                    &["verify-pack", "-v", e.path().to_str().expect("utf-8")],
                );
            }
        }
        git(d.path(), &["fsck", "--full", "--strict", "--no-dangling"]);
        // Nothing loose: every object went into a pack.
        assert!(git(d.path(), &["count-objects", "-v"]).contains("count: 0\n"));
        let log = git(d.path(), &["log", "--format=%H", "main"]);
        assert_eq!(log.lines().count(), commits.len());
        // A fresh libgit2 handle reads every commit back, hashes checked.
        let repo = Repository::open(d.path()).expect("open");
        for c in &commits {
            repo.find_commit(*c).expect("commit");
        }
    }

    #[test]
    fn merging_keeps_every_object_and_moves_deltas_against_offsets() {
        let d = tempfile::tempdir().expect("tempdir");
        packed_commits(d.path(), 6);
        // git's own repack of everything so far: a pack of deltas against offsets.
        git(d.path(), &["repack", "-a", "-d", "-q"]);
        let packs = pack_count(d.path());
        assert_eq!(packs, 1);
        let verify = |d: &Path| {
            std::fs::read_dir(d.join(".git/objects/pack"))
                .expect("dir")
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "idx"))
                .map(|p| git(d, &["verify-pack", "-v", p.to_str().expect("utf-8")]))
                .collect::<String>()
        };
        assert!(
            verify(d.path()).contains("chain length"),
            "git made no deltas"
        );
        // More commits on top, one pack each, then merge everything.
        let before = git(d.path(), &["rev-list", "--objects", "--all"]);
        let more = packed_commits_on(d.path(), 4);
        assert_eq!(pack_count(d.path()), 5);
        let merged = tidy_above(&d.path().join(".git"), 1, false).expect("tidy");
        assert_eq!(merged, 5);
        assert_eq!(pack_count(d.path()), 1);
        assert_eq!(merges_seen(&d.path().join(".git")), 1);
        let v = verify(d.path());
        // The deltas survived the move (as deltas against their base's id).
        assert!(v.contains("chain length"), "{v}");
        git(d.path(), &["fsck", "--full", "--strict", "--no-dangling"]);
        let after = git(d.path(), &["rev-list", "--objects", "--all"]);
        for line in before.lines() {
            assert!(after.contains(line), "{line} lost");
        }
        let repo = Repository::open(d.path()).expect("open");
        for c in more {
            repo.find_commit(c).expect("commit");
        }
        // Nothing to do below the bound.
        assert_eq!(
            tidy_above(&d.path().join(".git"), 1, false).expect("tidy"),
            0
        );
    }

    /// Commit `n` actions as the record does: each adds one file to `actions/` (a tree that
    /// grows by one entry a commit) and rewrites `node.toml`, one pack per commit.
    fn action_commits(dir: &Path, n: usize) -> Vec<Oid> {
        let repo = Repository::open(dir).expect("open");
        let staging = Staging::new().expect("staging");
        let sig = git2::Signature::now("t", "t@example.invalid").expect("sig");
        let pack_dir = repo.path().join("objects").join("pack");
        let mut tip: Option<Oid> = repo.refname_to_id("refs/heads/n0").ok();
        let start = git(dir, &["rev-list", "--all"]).lines().count();
        let mut commits = Vec::new();
        for i in start..start + n {
            let s = staging.repo();
            if let Some(t) = tip {
                staging
                    .import_base(&repo, t, &["actions/new"])
                    .expect("import");
            }
            let parent = tip.map(|t| s.find_commit(t).expect("parent"));
            let base = parent.as_ref().map(|p| p.tree().expect("tree"));
            let actions = base
                .as_ref()
                .and_then(|b| b.get_name("actions").map(|e| e.id()))
                .map(|id| s.find_tree(id).expect("actions"));
            let mut ab = s.treebuilder(actions.as_ref()).expect("tb");
            let action = format!("{{\"seq\": {i}, \"request\": \"distinct refusal {i}\"}}");
            ab.insert(
                format!("{:04}-compare.json", i + 1),
                s.blob(action.as_bytes()).expect("blob"),
                0o100644,
            )
            .expect("insert");
            let mut tb = s.treebuilder(base.as_ref()).expect("tb");
            tb.insert("actions", ab.write().expect("actions"), 0o040000)
                .expect("insert");
            let meta = format!("id = \"n0\"\nactions = {}\n", i + 1);
            tb.insert(
                "node.toml",
                s.blob(meta.as_bytes()).expect("blob"),
                0o100644,
            )
            .expect("insert");
            let tree = s.find_tree(tb.write().expect("tree")).expect("tree");
            let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
            let c = s
                .commit(None, &sig, &sig, &format!("a{i}"), &tree, &parents)
                .expect("commit");
            let objects = new_objects(s, c, base.as_ref().map(|b| b.id())).expect("objects");
            write_pack(&pack_dir, &objects, false).expect("pack");
            staging.written(objects.len());
            repo.reference("refs/heads/n0", c, true, "t").expect("ref");
            tip = Some(c);
            commits.push(c);
        }
        commits
    }

    fn pack_bytes(dir: &Path) -> u64 {
        std::fs::read_dir(dir.join(".git/objects/pack"))
            .expect("pack dir")
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "pack"))
            .map(|e| e.metadata().expect("meta").len())
            .sum()
    }

    #[test]
    fn merging_stores_older_copies_of_a_growing_tree_as_deltas() {
        let d = tempfile::tempdir().expect("tempdir");
        Repository::init(d.path()).expect("init");
        let git_dir = d.path().join(".git");
        // Two merges a node's trees go through: the second finds the first one's whole tree
        // older than its own newest, and the first one's deltas against it.
        let mut commits = Vec::new();
        // Bytes of the packs as each commit wrote them.
        let mut written = 0;
        let mut after = 0;
        for _ in 0..2 {
            commits.extend(action_commits(d.path(), 150));
            written += pack_bytes(d.path()) - after;
            assert!(tidy_above(&git_dir, 1, false).expect("tidy") >= 2);
            assert_eq!(pack_count(d.path()), 1);
            after = pack_bytes(d.path());
        }
        // Whole, the 300 copies of `actions/` (up to 300 entries of 50 bytes) took megabytes.
        assert!(written > 1_000_000, "{written}");
        assert!(after * 10 < written, "merged {written} bytes into {after}");
        // git reads and checks it all: every object's hash, every delta's base in the pack.
        git(d.path(), &["fsck", "--full", "--strict", "--no-dangling"]);
        let idx = std::fs::read_dir(git_dir.join("objects/pack"))
            .expect("dir")
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "idx"))
            .expect("idx");
        let v = git(
            d.path(),
            &["verify-pack", "-v", idx.to_str().expect("utf-8")],
        );
        assert!(v.contains("chain length = 1:"), "{v}");
        // A fresh libgit2 handle reads every tree, whole or through its delta.
        let repo = Repository::open(d.path()).expect("open");
        for (k, c) in commits.iter().enumerate() {
            let tree = repo.find_commit(*c).expect("commit").tree().expect("tree");
            let actions = tree.get_name("actions").expect("actions").to_object(&repo);
            let actions = actions.expect("read").peel_to_tree().expect("tree");
            assert_eq!(actions.len(), k + 1);
        }
    }

    #[test]
    fn a_pack_that_does_not_match_its_checksum_is_not_merged() {
        let d = tempfile::tempdir().expect("tempdir");
        packed_commits(d.path(), 3);
        let dir = d.path().join(".git/objects/pack");
        let victim = packs(&dir).remove(0).0.with_extension("pack");
        let mut bytes = std::fs::read(&victim).expect("read");
        let at = bytes.len() - 30;
        bytes[at] ^= 0xff;
        let mut perms = std::fs::metadata(&victim).expect("meta").permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perms.set_readonly(false);
        std::fs::set_permissions(&victim, perms).expect("chmod");
        std::fs::write(&victim, &bytes).expect("write");
        assert_eq!(
            tidy_above(&d.path().join(".git"), 1, false).expect("tidy"),
            2
        );
        // The damaged pack is still there, as it was; the two others are one.
        assert!(victim.exists());
        assert_eq!(std::fs::read(&victim).expect("read"), bytes);
        assert_eq!(pack_count(d.path()), 2);
        // Set aside with git's own mark, saying why: no later merge reads it again.
        let keep = std::fs::read_to_string(victim.with_extension("keep")).expect("keep");
        assert!(keep.contains("checksum"), "{keep}");
        assert_eq!(
            tidy_above(&d.path().join(".git"), 1, false).expect("tidy"),
            0
        );
    }

    #[test]
    fn a_pack_naming_an_object_it_does_not_hold_is_not_merged() {
        let d = tempfile::tempdir().expect("tempdir");
        let commits = packed_commits(d.path(), 3);
        let dir = d.path().join(".git/objects/pack");
        // A well-formed pack (checksums right) whose entry for the last commit holds another
        // object's bytes: merged first (it is the smallest), it would shadow the good copy.
        let mut stored = Vec::new();
        entry_header(&mut stored, 3, 5);
        let mut z = flate2::write::ZlibEncoder::new(&mut stored, flate2::Compression::fast());
        z.write_all(b"bogus").expect("zlib");
        z.finish().expect("zlib");
        let mut bad = PackBuf::new(1);
        bad.push_stored(commits[2], &stored, None);
        let name = bad.finish(&dir, false).expect("write");
        // As if another process (or a crafted repository) had put it there.
        if let Some(set) = WRITTEN_HERE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            set.remove(&name);
        }
        assert_eq!(pack_count(d.path()), 4);
        assert_eq!(
            tidy_above(&d.path().join(".git"), 1, false).expect("tidy"),
            3
        );
        assert_eq!(pack_count(d.path()), 2);
        // The good copy survived the merge.
        let merged = packs(&dir)
            .into_iter()
            .map(|(stem, _)| stem)
            .find(|stem| read_pack(stem).is_ok_and(|p| p.entries.len() > 1))
            .expect("merged pack");
        verify_objects(&merged, &read_pack(&merged).expect("read")).expect("verified");
    }

    #[test]
    fn entry_headers_use_gits_size_encoding() {
        let mut b = Vec::new();
        entry_header(&mut b, 3, 10);
        assert_eq!(b, [0x3a]);
        b.clear();
        // 300 = 0b1_0010_1100: low four bits 0xc, then 0b10010 = 18.
        entry_header(&mut b, 1, 300);
        assert_eq!(b, [0x80 | 0x10 | 0x0c, 18]);
    }
}
