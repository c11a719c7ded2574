//! Deltas for pack merges: what keeps a node's record linear in its actions.
//!
//! A node's `actions/` is one flat tree (DESIGN: `actions/NNNN-<action>.json`), so each commit
//! writes it whole: after n actions the node holds n copies of a tree of up to n entries, and a
//! node flooded with thousands of actions (distinct refusals from many agents, say) grew its
//! `.git` with the square of its actions. Each copy differs from the newest only by the entries
//! appended since, so stored as a delta against the newest it is a few bytes.
//!
//! `plan` decides, for the entries a merge moves, which trees to store that way: for each commit
//! among them, newest first along first parents, each subtree of its root tree (a node's
//! `actions/`) becomes a delta against the same subtree of its newest descendant in the merge,
//! which is kept whole. Every new delta's base is a whole object in the same pack (git requires
//! a pack to hold the bases of its deltas), so a delta written here is one step from its base;
//! a tree already stored as a delta by an earlier merge keeps its delta, whose base may in turn
//! become a delta here (a chain grows by one per merge a node's trees go through, O(log n) under
//! the geometric merging of `packs`). A delta is kept only when it is under half the tree.
//!
//! The delta is git's own format (as `git index-pack` and libgit2 apply it): the common prefix
//! and suffix of the two trees copied from the base, what lies between inserted. Entries are
//! sorted by name and an action's number only grows, so what differs is one run of entries.

use std::collections::{HashMap, HashSet};
use std::io::Read;

use git2::Oid;

/// A tree smaller than this is kept whole (its delta would save little).
const MIN_TREE: usize = 1024;

/// Trees larger than this are not read for a delta (no node's `actions/` comes near it).
const MAX_TREE: usize = 16 << 20;

/// At most this many bytes of base trees are held in memory while planning one merge.
const BASES_HELD: usize = 256 << 20;

/// A pack entry's type and size from its header; with the header's length.
fn header(stored: &[u8]) -> Option<(u8, u64, usize)> {
    let mut b = *stored.first()?;
    let code = (b >> 4) & 7;
    let mut size = u64::from(b & 0x0f);
    let mut shift = 4;
    let mut at = 0;
    while b & 0x80 != 0 {
        at += 1;
        b = *stored.get(at)?;
        if shift > 57 {
            return None;
        }
        size |= u64::from(b & 0x7f) << shift;
        shift += 7;
    }
    Some((code, size, at + 1))
}

/// The content of a whole (not delta) entry of at most `limit` bytes, with its type code
/// (1 commit, 2 tree, 3 blob, 4 tag). None for a delta, a larger object, or bytes that do not
/// inflate to the size the header says.
pub(super) fn inflate(stored: &[u8], limit: usize) -> Option<(u8, Vec<u8>)> {
    let (code, size, at) = header(stored)?;
    if !(1..=4).contains(&code) || size > limit as u64 {
        return None;
    }
    let mut out = Vec::with_capacity(size as usize);
    flate2::read::ZlibDecoder::new(stored.get(at..)?)
        .take(size + 1)
        .read_to_end(&mut out)
        .ok()?;
    (out.len() as u64 == size).then_some((code, out))
}

/// A commit's tree and first parent, from its content.
fn commit_links(content: &[u8]) -> Option<(Oid, Option<Oid>)> {
    let mut lines = content.split(|&b| b == b'\n');
    let hex = |line: &[u8], key: &[u8]| {
        line.strip_prefix(key)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| Oid::from_str(h).ok())
    };
    let tree = hex(lines.next()?, b"tree ")?;
    let parent = lines.next().and_then(|l| hex(l, b"parent "));
    Some((tree, parent))
}

/// The subtrees a tree names: (name, id) of each entry of mode 40000.
fn subtrees(content: &[u8]) -> Vec<(Vec<u8>, Oid)> {
    let mut out = Vec::new();
    let mut rest = content;
    while !rest.is_empty() {
        let Some(space) = rest.iter().position(|&b| b == b' ') else {
            break;
        };
        let Some(nul) = rest[space..]
            .iter()
            .position(|&b| b == 0)
            .map(|n| space + n)
        else {
            break;
        };
        let Some(id) = rest
            .get(nul + 1..nul + 21)
            .and_then(|b| Oid::from_bytes(b).ok())
        else {
            break;
        };
        if &rest[..space] == b"40000" {
            out.push((rest[space + 1..nul].to_vec(), id));
        }
        rest = &rest[nul + 21..];
    }
    out
}

/// Git's variable-length size, as a delta's header writes it.
fn put_size(out: &mut Vec<u8>, mut n: usize) {
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// Copy `len` bytes from `offset` of the base (in pieces of at most 64 KiB, as git writes them).
fn put_copy(out: &mut Vec<u8>, mut offset: usize, mut len: usize) {
    while len > 0 {
        let n = len.min(0x10000);
        let mut op = 0x80u8;
        let at = out.len();
        out.push(0);
        for i in 0..4 {
            let b = (offset >> (8 * i)) as u8;
            if b != 0 {
                op |= 1 << i;
                out.push(b);
            }
        }
        for i in 0..3 {
            let b = (n >> (8 * i)) as u8;
            if b != 0 {
                op |= 0x10 << i;
                out.push(b);
            }
        }
        out[at] = op;
        offset += n;
        len -= n;
    }
}

/// `target` as a git delta against `base`: their common prefix and suffix copied from the base,
/// what lies between inserted.
pub(super) fn encode(base: &[u8], target: &[u8]) -> Vec<u8> {
    let prefix = base.iter().zip(target).take_while(|(a, b)| a == b).count();
    let room = base.len().min(target.len()) - prefix;
    let suffix = base
        .iter()
        .rev()
        .zip(target.iter().rev())
        .take(room)
        .take_while(|(a, b)| a == b)
        .count();
    let middle = &target[prefix..target.len() - suffix];
    let mut out = Vec::with_capacity(32 + middle.len() + middle.len() / 127);
    put_size(&mut out, base.len());
    put_size(&mut out, target.len());
    put_copy(&mut out, 0, prefix);
    for chunk in middle.chunks(127) {
        out.push(chunk.len() as u8);
        out.extend_from_slice(chunk);
    }
    put_copy(&mut out, base.len() - suffix, suffix);
    out
}

/// How one tree of the merge is stored.
#[derive(Clone, Copy)]
enum Stored {
    Whole,
    DeltaOf(Oid),
}

/// For the entries a merge moves (id and stored bytes), the trees to store as deltas: each id
/// with its base's id and the delta (uncompressed). Every base is one of `entries`, stored whole.
pub(super) fn plan(entries: &[(Oid, &[u8])]) -> Vec<(Oid, Oid, Vec<u8>)> {
    let whole: HashMap<Oid, &[u8]> = entries
        .iter()
        .filter(|(_, s)| header(s).is_some_and(|(code, _, _)| (1..=4).contains(&code)))
        .map(|&(id, s)| (id, s))
        .collect();
    // The commits among them: tree and first parent.
    let mut links: HashMap<Oid, (Oid, Option<Oid>)> = HashMap::new();
    for (&id, stored) in &whole {
        if let Some((1, content)) = inflate(stored, 1 << 20)
            && let Some(l) = commit_links(&content)
        {
            links.insert(id, l);
        }
    }
    // Newest first: a commit after all of its children here (first parents only).
    let mut waiting: HashMap<Oid, usize> = HashMap::new();
    for (_, parent) in links.values() {
        if let Some(p) = parent.filter(|p| links.contains_key(p)) {
            *waiting.entry(p).or_default() += 1;
        }
    }
    let mut ready: Vec<Oid> = links
        .keys()
        .filter(|c| !waiting.contains_key(c))
        .copied()
        .collect();
    ready.sort();
    let mut inherited: HashMap<Oid, HashMap<Vec<u8>, Oid>> = HashMap::new();
    let mut decided: HashMap<Oid, Stored> = HashMap::new();
    let mut bases: HashMap<Oid, Vec<u8>> = HashMap::new();
    let mut held = 0usize;
    let mut out = Vec::new();
    let mut done = HashSet::new();
    while let Some(c) = ready.pop() {
        if !done.insert(c) {
            continue;
        }
        let (tree, parent) = links[&c];
        let parent = parent.filter(|p| links.contains_key(p));
        let from_child = inherited.remove(&c).unwrap_or_default();
        let root = whole
            .get(&tree)
            .and_then(|s| inflate(s, MAX_TREE))
            .filter(|(code, _)| *code == 2);
        let mut pass: Vec<(Vec<u8>, Oid)> = Vec::new();
        for (name, sub) in root.map(|(_, t)| subtrees(&t)).unwrap_or_default() {
            let above = from_child.get(&name).copied();
            let chosen = match (decided.get(&sub), whole.get(&sub)) {
                (Some(Stored::Whole), _) => Some(sub),
                (Some(Stored::DeltaOf(b)), _) => Some(*b),
                // Not whole here (a delta already, or in another pack): the chain goes on past it.
                (None, None) => above,
                (None, Some(stored)) => {
                    // Inflated only when it has a newer copy to be a delta against.
                    let delta = match above.filter(|b| *b != sub) {
                        Some(b) => match inflate(stored, MAX_TREE) {
                            Some((2, content)) if content.len() >= MIN_TREE => {
                                base_content(b, &whole, &mut bases, &mut held)
                                    .map(|base| encode(base, &content))
                                    .filter(|d| d.len() < content.len() / 2)
                            }
                            _ => None,
                        },
                        None => None,
                    };
                    match (delta, above) {
                        (Some(d), Some(b)) => {
                            decided.insert(sub, Stored::DeltaOf(b));
                            out.push((sub, b, d));
                            Some(b)
                        }
                        _ => {
                            decided.insert(sub, Stored::Whole);
                            Some(sub)
                        }
                    }
                }
            };
            if let Some(b) = chosen {
                pass.push((name, b));
            }
        }
        if let Some(p) = parent {
            let slot = inherited.entry(p).or_default();
            for (name, b) in pass {
                slot.entry(name).or_insert(b);
            }
            if let Some(n) = waiting.get_mut(&p) {
                *n -= 1;
                if *n == 0 {
                    ready.push(p);
                }
            }
        }
    }
    out
}

/// A base tree's content, read once per merge (None past `BASES_HELD`, or if it is no tree).
fn base_content<'a>(
    id: Oid,
    whole: &HashMap<Oid, &[u8]>,
    bases: &'a mut HashMap<Oid, Vec<u8>>,
    held: &mut usize,
) -> Option<&'a [u8]> {
    match bases.entry(id) {
        std::collections::hash_map::Entry::Occupied(e) => Some(e.into_mut().as_slice()),
        std::collections::hash_map::Entry::Vacant(slot) => {
            let (code, content) = inflate(whole.get(&id)?, MAX_TREE)?;
            if code != 2 || *held + content.len() > BASES_HELD {
                return None;
            }
            *held += content.len();
            Some(slot.insert(content).as_slice())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Git's own delta application (`patch_delta`), written out here to check `encode`.
    fn apply(base: &[u8], delta: &[u8]) -> Vec<u8> {
        let mut at = 0;
        let mut size = || {
            let (mut n, mut shift) = (0usize, 0);
            loop {
                let b = delta[at];
                at += 1;
                n |= usize::from(b & 0x7f) << shift;
                shift += 7;
                if b & 0x80 == 0 {
                    return n;
                }
            }
        };
        assert_eq!(size(), base.len());
        let want = size();
        let mut out = Vec::new();
        while at < delta.len() {
            let op = delta[at];
            at += 1;
            if op & 0x80 != 0 {
                let (mut off, mut len) = (0usize, 0usize);
                for i in 0..4 {
                    if op & (1 << i) != 0 {
                        off |= usize::from(delta[at]) << (8 * i);
                        at += 1;
                    }
                }
                for i in 0..3 {
                    if op & (0x10 << i) != 0 {
                        len |= usize::from(delta[at]) << (8 * i);
                        at += 1;
                    }
                }
                if len == 0 {
                    len = 0x10000;
                }
                out.extend_from_slice(&base[off..off + len]);
            } else {
                let n = usize::from(op);
                assert!(n > 0);
                out.extend_from_slice(&delta[at..at + n]);
                at += n;
            }
        }
        assert_eq!(out.len(), want);
        out
    }

    #[test]
    fn deltas_rebuild_their_target() {
        let long: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let cases: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (b"abc".to_vec(), b"abc".to_vec()),
            (b"".to_vec(), b"something new".to_vec()),
            (b"something old".to_vec(), b"".to_vec()),
            (b"aaaa".to_vec(), b"aaaaaa".to_vec()),
            (b"head tail".to_vec(), b"head middle tail".to_vec()),
            (long.clone(), long[..150_000].to_vec()),
            (long[..70_000].to_vec(), long.clone()),
            (
                long.clone(),
                [&long[..65_536], &b"x"[..], &long[65_536..]].concat(),
            ),
        ];
        for (base, target) in cases {
            let d = encode(&base, &target);
            assert_eq!(apply(&base, &d), target);
        }
        // An older tree (a prefix of the newest) costs a few bytes.
        assert!(encode(&long, &long[..150_000]).len() < 16);
    }

    #[test]
    fn tree_entries_are_read_by_mode() {
        let id = Oid::from_str("0123456789abcdef0123456789abcdef01234567").expect("oid");
        let mut t = Vec::new();
        for (mode, name) in [("100644", "node.toml"), ("40000", "actions")] {
            t.extend_from_slice(format!("{mode} {name}\0").as_bytes());
            t.extend_from_slice(id.as_bytes());
        }
        assert_eq!(subtrees(&t), vec![(b"actions".to_vec(), id)]);
        // A truncated entry ends the reading, never panics.
        assert_eq!(subtrees(&t[..t.len() - 3]), Vec::new());
    }
}
