//! Reading programs by what they do: the `string_ops` form's second reading. The first
//! (`string_ops::Programs`) reads a program's text symbolically, and fails open on any spelling
//! it does not know (`min(3,len(s))`, `ljust`, a function, a loop, `exec`). This one runs each
//! program a row holds, as an evaluation runs it, on probe inputs, and a program whose outputs
//! are those of a protected composition is that composition, however it is written.
//!
//! - **Which programs.** Every candidate a row offers a model to learn: the row's text, its
//!   answer, each of their lines, and each of these after every `>` and `:` (where a
//!   specification ends and an answer starts), trimmed — however many, up to `MAX_ROW_BYTES`
//!   of them (a row offering more is unread). A line that is exactly what the family's
//!   generator writes (`code_tasks::is_generated`: a program of one of its styles, after one
//!   of its specifications or none) is not run: its operations are known, and the symbolic
//!   reading keys it. Nor is a row the symbolic reading already matched. Candidates that do not
//!   compile are dropped by a batched `compile` in the same sandbox (compiling runs nothing).
//! - **How.** `programs::Runner::output`: the evaluation's own sandbox, interpreter, limits and
//!   environment, one process per run, the source as `-c` and `/` as directory and home in
//!   both, so a program cannot tell a probe's run from a test's by where it runs. Probes are
//!   drawn like the hidden tests' inputs (words of six to nine lowercase letters), afresh for
//!   each scan index (each process), and every letter stands early in one and late in another,
//!   so that a deleted letter shows (`draw_probes`).
//! - **Matching.** Every composition of up to `string_ops::MAX_OPS` of the generator's
//!   operations (each count, each letter: 92 of them, 787,749 compositions with none) is run on
//!   the probes in Rust (`code_tasks::Op::apply`, the hidden outputs' reference semantics). A
//!   program's outputs name the compositions that print them (its class), and `Table::verdict`
//!   decides: no match when a free composition of fewer operations is among them (`dup;take 3`
//!   prints what `take 3` prints) or when the row reads — by its specification or its program
//!   read symbolically — as a free one among them (`str up;rev>`, where `rev;up` is protected);
//!   else the protected ones of the fewest operations. One output on every probe is no
//!   evidence. A reading ends at the first probe whose outputs so far no protected composition
//!   that would match prints.
//! - **Fail closed.** A program stopped by a time limit (which depends on load: it might pass
//!   an evaluation), a scan past `MAX_RUNS` programs, `TIME` or its bytes, or a machine that
//!   cannot run programs in the sandbox leaves the row unread, and an unread row is refused,
//!   naming why (`Unread`).
//!
//! Not read: a program that prints a `del` item's outputs only for inputs holding its deleted
//! letters (as every test input does, and about a quarter of the probes), or only after telling
//! a probe from a test some other way (the time, the machine, chance).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng, rngs::StdRng};

use crate::model::data::Row;
use crate::policy::contamination::{At, ProgramReader, Unread};
use crate::train::code_tasks::{self, Op};
use crate::train::programs::{self, Ran};

/// Probe inputs each program runs on (see `draw_probes`). Four let `drop 5;rev;del i` pass as
/// `drop 5;rev` about half the time (the one probe holding `i` held it among its first five
/// letters).
pub const PROBES: usize = 16;

/// Distinct programs one scan runs at most; past them the rest are unread.
pub const MAX_RUNS: usize = 4096;

/// How long one scan runs programs at most; past it the rest are unread.
pub const TIME: Duration = Duration::from_secs(180);

/// Bytes of program text one row may offer (its text, answer and lines, each cut after every
/// `>` and `:`); a row offering more is unread. A cap on how many would let a row hide its
/// program behind more lines or cuts than the cap.
const MAX_ROW_BYTES: usize = 1 << 20;

/// Bytes of distinct program text one scan holds; past it the rest is unread.
const MAX_SCAN_BYTES: usize = 64 << 20;

/// Programs compiled in one batch, and their bytes.
const COMPILE_BATCH: usize = 2000;
const COMPILE_BYTES: usize = 4 << 20;

/// Readings remembered (by the program's text) for later scans with the same probes, in memory
/// and in the study's readings file (`Reader::new`).
const MAX_REMEMBERED: usize = 1 << 16;

/// The longest the readings file grows (past it, it starts over) and is read back.
const MAX_STORE_BYTES: u64 = 64 << 20;

/// The most compositions one kept reading names (a class holds fewer than the 5,219 ids).
const MAX_CLASS: usize = 6000;

/// The operation kinds with their counts, letters blanked: a composition's key is its kinds.
const KINDS: u32 = 17;

/// A composition id's high bit: an index into `Table::multi` (several keys print it).
const MULTI: u32 = 1 << 31;

/// An operation's kind (`take 3` and `take 4` differ; `del a` and `del b` do not).
fn kind(op: Op) -> u32 {
    match op {
        Op::Rev => 0,
        Op::Up => 1,
        Op::Dup => 2,
        Op::Sort => 3,
        Op::Take(n) => 3 + u32::from(n),
        Op::Drop(n) => 8 + u32::from(n),
        Op::Del(_) => 14,
        Op::Add(_) => 15,
        Op::Pre(_) => 16,
    }
}

/// An operation of a kind (the letter `a` for the letter kinds).
fn of_kind(k: u32) -> Op {
    match k {
        0 => Op::Rev,
        1 => Op::Up,
        2 => Op::Dup,
        3 => Op::Sort,
        4..=8 => Op::Take((k - 3) as u8),
        9..=13 => Op::Drop((k - 8) as u8),
        14 => Op::Del('a'),
        15 => Op::Add('a'),
        _ => Op::Pre('a'),
    }
}

/// A composition's id: its kinds in order (0 for none).
fn then(id: u32, op: Op) -> u32 {
    id * (KINDS + 1) + kind(op) + 1
}

/// Whether `id` names a composition of one to `MAX_OPS` operations (each digit a kind).
fn is_composition(id: u32) -> bool {
    let mut rest = id;
    let mut n = 0;
    while rest > 0 {
        if rest.is_multiple_of(KINDS + 1) {
            return false;
        }
        rest /= KINDS + 1;
        n += 1;
    }
    (1..=crate::policy::string_ops::MAX_OPS).contains(&n)
}

/// The kinds of a composition id, in order.
fn kinds(mut id: u32) -> Vec<u32> {
    let mut out = Vec::new();
    while id > 0 {
        out.push((id % (KINDS + 1)).saturating_sub(1));
        id /= KINDS + 1;
    }
    out.reverse();
    out
}

/// A composition id's name, as the `string_ops` form keys it (`ops:take 3;rev;del #`, `ops:`
/// for none).
fn name_of(id: u32) -> String {
    let names: Vec<String> = kinds(id)
        .into_iter()
        .map(|k| match k {
            0 => "rev".into(),
            1 => "up".into(),
            2 => "dup".into(),
            3 => "sort".into(),
            4..=8 => format!("take {}", k - 3),
            9..=13 => format!("drop {}", k - 8),
            14 => "del #".into(),
            15 => "add #".into(),
            _ => "pre #".into(),
        })
        .collect();
    format!("ops:{}", names.join(";"))
}

/// The keys of the outputs' hashes, random for this process: outputs are the caller's, and with
/// a known key a program's outputs could be made to collide with a composition's. (Programs'
/// texts are told apart by their sha256.)
fn keys() -> &'static std::collections::hash_map::RandomState {
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    KEYS.get_or_init(std::collections::hash_map::RandomState::new)
}

/// `op` applied to `from` (ASCII: the probes' letters, upper-cased by `up`) into `to`, as
/// `Op::apply` computes it on text.
fn apply_bytes(op: Op, from: &[u8], to: &mut Vec<u8>) {
    to.clear();
    match op {
        Op::Rev => to.extend(from.iter().rev()),
        Op::Up => to.extend(from.iter().map(u8::to_ascii_uppercase)),
        Op::Dup => {
            to.extend_from_slice(from);
            to.extend_from_slice(from);
        }
        Op::Sort => {
            to.extend_from_slice(from);
            to.sort_unstable();
        }
        Op::Take(n) => to.extend_from_slice(&from[..from.len().min(usize::from(n))]),
        Op::Drop(n) => to.extend_from_slice(&from[from.len().min(usize::from(n))..]),
        Op::Del(c) => to.extend(from.iter().filter(|&&b| char::from(b) != c)),
        Op::Add(c) => {
            to.extend_from_slice(from);
            to.push(c as u8);
        }
        Op::Pre(c) => {
            to.push(c as u8);
            to.extend_from_slice(from);
        }
    }
}

/// The hash of each probe's output and those before it (a reading's prefix), the last being
/// the hash of them all.
fn prefix_hashes<'a>(outs: impl Iterator<Item = &'a [u8]>) -> [u64; PROBES] {
    let mut h = keys().build_hasher();
    let mut out = [0u64; PROBES];
    for (slot, o) in out.iter_mut().zip(outs) {
        h.write(o);
        h.write_u8(0xff);
        *slot = h.finish();
    }
    out
}

/// What every composition prints on the probes.
struct Table {
    /// The outputs on all probes → the composition printing them, or `MULTI | i` for several.
    by_outputs: HashMap<u64, u32>,
    multi: Vec<Vec<u32>>,
    /// What some protected composition prints on the first k+1 probes, at k (a reading ends
    /// at any other).
    protected_prints: [HashSet<u64>; PROBES],
    /// The protected compositions, with their keys.
    protected: HashMap<u32, String>,
}

impl Table {
    fn build(probes: &[String; PROBES], wanted: &dyn Fn(&str) -> bool) -> Table {
        let mut protected = HashMap::new();
        let mut stack = vec![0u32];
        while let Some(id) = stack.pop() {
            let name = name_of(id);
            if kinds(id).len() >= 2 && wanted(&name) {
                protected.insert(id, name);
            }
            if kinds(id).len() < crate::policy::string_ops::MAX_OPS {
                stack.extend((0..KINDS).map(|k| then(id, of_kind(k))));
            }
        }
        let mut t = Table {
            by_outputs: HashMap::new(),
            multi: Vec::new(),
            protected_prints: Default::default(),
            protected,
        };
        let ops = code_tasks::every_op();
        // One buffer per depth and probe, reused: the walk allocates nothing per composition.
        let mut bufs: Vec<[Vec<u8>; PROBES]> = (0..=crate::policy::string_ops::MAX_OPS)
            .map(|_| std::array::from_fn(|_| Vec::with_capacity(96)))
            .collect();
        for (b, p) in bufs[0].iter_mut().zip(probes) {
            b.extend_from_slice(p.as_bytes());
        }
        let mut printed_by_protected = Vec::new();
        t.walk(&ops, 0, 0, &mut bufs, &mut printed_by_protected);
        // A reading goes on only while its outputs so far are those of a protected composition
        // that would match (no free one of fewer operations printing the same: `take 3`'s
        // outputs are `dup;take 3`'s, and a program printing them never matches).
        for hashes in printed_by_protected {
            let class = t.class_of(hashes[PROBES - 1]);
            if !t.verdict(&class, None).is_empty() {
                for (seen, h) in t.protected_prints.iter_mut().zip(hashes) {
                    seen.insert(h);
                }
            }
        }
        t
    }

    fn walk(
        &mut self,
        ops: &[Op],
        id: u32,
        depth: usize,
        bufs: &mut [[Vec<u8>; PROBES]],
        printed_by_protected: &mut Vec<[u64; PROBES]>,
    ) {
        let outs = &bufs[depth];
        let hashes = prefix_hashes(outs.iter().map(Vec::as_slice));
        // (One output on every probe is no evidence: `class`.)
        if self.protected.contains_key(&id) && outs.iter().any(|o| *o != outs[0]) {
            printed_by_protected.push(hashes);
        }
        let h = hashes[PROBES - 1];
        match self.by_outputs.get(&h).copied() {
            None => {
                self.by_outputs.insert(h, id);
            }
            Some(v) if v & MULTI != 0 => {
                let ids = &mut self.multi[(v & !MULTI) as usize];
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
            Some(v) if v != id => {
                self.multi.push(vec![v, id]);
                self.by_outputs
                    .insert(h, MULTI | (self.multi.len() - 1) as u32);
            }
            Some(_) => {}
        }
        if depth >= crate::policy::string_ops::MAX_OPS {
            return;
        }
        for &op in ops {
            let (done, rest) = bufs.split_at_mut(depth + 1);
            for (from, to) in done[depth].iter().zip(rest[0].iter_mut()) {
                apply_bytes(op, from, to);
            }
            self.walk(ops, then(id, op), depth + 1, bufs, printed_by_protected);
        }
    }

    /// Every composition printing `outs` on the probes; none for the same output on every
    /// probe (nothing, or a constant: `t=input()` alone prints what `take 1;drop 1` does on
    /// every input, and a program printing one string whatever it reads answers no
    /// specification).
    fn class(&self, outs: &[String; PROBES]) -> Vec<u32> {
        if outs.iter().all(|o| *o == outs[0]) {
            return Vec::new();
        }
        self.class_of(prefix_hashes(outs.iter().map(String::as_bytes))[PROBES - 1])
    }

    /// Every composition whose outputs on all probes hash to `h`.
    fn class_of(&self, h: u64) -> Vec<u32> {
        match self.by_outputs.get(&h) {
            None => Vec::new(),
            Some(v) if v & MULTI != 0 => self.multi[(v & !MULTI) as usize].clone(),
            Some(v) => vec![*v],
        }
    }

    /// The protected keys a program computing the compositions `class` reproduces, where its row
    /// reads (symbolically) as the compositions `read_as`:
    /// - none when a composition of fewer operations computes it and is free (`dup;take 3`
    ///   computes what `take 3` does: no honest program of `take 3` could avoid it);
    /// - none when the row reads as a free composition that computes it (`up;rev`, written so,
    ///   computes what a protected `rev;up` does: an honest row);
    /// - else the protected compositions of the fewest operations among them.
    fn verdict(&self, class: &[u32], read_as: Option<&HashSet<String>>) -> Vec<String> {
        let Some(fewest) = class.iter().map(|&id| kinds(id).len()).min() else {
            return Vec::new();
        };
        let simplest: Vec<u32> = class
            .iter()
            .copied()
            .filter(|&id| kinds(id).len() == fewest)
            .collect();
        let keys: Vec<String> = simplest
            .iter()
            .filter_map(|id| self.protected.get(id).cloned())
            .collect();
        let read_free = read_as.is_some_and(|r| {
            class
                .iter()
                .any(|id| !self.protected.contains_key(id) && r.contains(&name_of(*id)))
        });
        if keys.is_empty() || read_free {
            return Vec::new();
        }
        keys
    }
}

/// One program's reading.
#[derive(Debug, Clone, PartialEq)]
enum Reading {
    /// The compositions it computes (none, or a reading ended early: it computes no
    /// protected one).
    Class(Vec<u32>),
    /// Stopped by a time limit.
    Stopped,
}

/// The reader of one scan index: the rsim binary whose sandbox runs programs (or why there is
/// none), its probes, its table (built the first time a program is run), and what it read
/// before.
pub struct Reader {
    rsim: Result<std::path::PathBuf, String>,
    probes: [String; PROBES],
    table: OnceLock<Table>,
    remembered: Mutex<Remembered>,
    /// The study's readings file, the probes' tag its lines carry, and its bound in bytes.
    store: Option<std::path::PathBuf>,
    tag: String,
    store_cap: u64,
}

/// Readings by the sha256 of the program's text (its class), and whether the study's file was
/// read in.
#[derive(Default)]
struct Remembered {
    loaded: bool,
    classes: HashMap<String, Vec<u32>>,
}

/// One line of the readings file.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredReading {
    /// The probes' tag (`Reader::tag`): a line read on other probes is not this reader's.
    p: String,
    /// The program text's sha256.
    s: String,
    /// Its class.
    c: Vec<u32>,
}

/// Words like the hidden tests' inputs (six to nine lowercase letters, four of each length, each
/// place's letter uniform over the alphabet) in which every letter stands among some word's first
/// two and among some word's letters from the sixth on: a deleted letter shows after any `take`
/// of two or more and after any `drop` (a test input holds its item's deleted letters at random
/// places). The alphabet is dealt (shuffled, then letters at random to fill) into the 32 first
/// places and again into the 40 places from the sixth; the rest are drawn at random.
fn draw_probes(rng: &mut StdRng) -> [String; PROBES] {
    const LENGTHS: [usize; 4] = [6, 7, 8, 9];
    const EARLY: usize = 2;
    const LATE_FROM: usize = 5;
    let mut dealt = |slots: usize| -> Vec<u8> {
        let mut l: Vec<u8> = (b'a'..=b'z').collect();
        while l.len() < slots {
            l.push(b'a' + rng.random_range(0..26u8));
        }
        shuffle(&mut l, rng);
        l
    };
    let lengths: [usize; PROBES] = std::array::from_fn(|i| LENGTHS[i % 4]);
    let mut early = dealt(PROBES * EARLY).into_iter();
    let mut late = dealt(lengths.iter().map(|l| l - LATE_FROM).sum()).into_iter();
    let words: Vec<String> = lengths
        .iter()
        .map(|&len| {
            let w: Vec<u8> = (0..len)
                .map(|at| {
                    let from = if at < EARLY {
                        early.next()
                    } else if at >= LATE_FROM {
                        late.next()
                    } else {
                        None
                    };
                    from.unwrap_or_else(|| b'a' + rng.random_range(0..26u8))
                })
                .collect();
            String::from_utf8_lossy(&w).into_owned()
        })
        .collect();
    let mut order: Vec<u8> = (0..PROBES as u8).collect();
    shuffle(&mut order, rng);
    std::array::from_fn(|i| words[order[i] as usize].clone())
}

fn shuffle(v: &mut [u8], rng: &mut StdRng) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.random_range(0..=i));
    }
}

/// The candidates a row offers (see the module's notes), generated lines left out; `None`
/// when they come to more than `MAX_ROW_BYTES`.
pub fn candidates(row: &Row) -> Option<Vec<String>> {
    let text = crate::model::data::training_text(row);
    let mut out: Vec<String> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    let mut bytes = 0usize;
    for whole in [text.as_str(), row.answer.as_str()] {
        for piece in std::iter::once(whole).chain(whole.split('\n')) {
            // A line the generator writes, cut anywhere, is the generator's text.
            if code_tasks::is_generated(piece.trim()) {
                continue;
            }
            let cuts = piece.match_indices(['>', ':']).map(|(at, _)| at + 1);
            for at in std::iter::once(0).chain(cuts) {
                let c = piece[at..].trim();
                if c.is_empty() || !seen.insert(c) || code_tasks::is_generated(c) {
                    continue;
                }
                bytes += c.len();
                if bytes > MAX_ROW_BYTES {
                    return None;
                }
                out.push(c.to_string());
            }
        }
    }
    Some(out)
}

/// Compiles a JSON list of sources, printing `0` for each that is no Python (a syntax error, or
/// a NUL byte, which no argument can hold) and `1` for every other (one that stops this check's
/// compiler, past its recursion or memory, is run: `-c` compiles from a shallower stack, and a
/// red-team helper's 2,996 terms failed here and ran there); nothing of them runs.
const COMPILE: &str = r#"import sys, json
out = []
for src in json.loads(sys.stdin.read()):
    try:
        compile(src, '<string>', 'exec')
        out.append('1')
    except (SyntaxError, ValueError):
        out.append('0')
    except BaseException:
        out.append('1')
sys.stdout.write(''.join(out))
"#;

impl ProgramReader for Reader {
    fn read(
        &self,
        parts: &[&[Row]],
        skip: &HashSet<At>,
        read_as: &HashMap<At, HashSet<String>>,
        wanted: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<Vec<(String, At)>, Unread> {
        self.read_programs(parts, skip, read_as, wanted)
    }
}

impl Reader {
    /// A reader running programs under the sandbox of the rsim binary `rsim` (an error: why
    /// there is none, and every program that needs running is left unread).
    ///
    /// The probes are drawn from `seed` (the OS gives one from the study's secret, so a study
    /// keeps its probes and no one outside it knows them), and what each program read as is kept
    /// in `store` (in `.rsim/`, never in the record), so a `run_sft` or `rsim audit` in another
    /// process reads a union without running its programs again.
    pub fn new(
        rsim: Result<std::path::PathBuf, String>,
        seed: u64,
        store: Option<std::path::PathBuf>,
    ) -> Reader {
        let probes = draw_probes(&mut StdRng::seed_from_u64(seed));
        let tag = crate::util::hash::sha256_hex(probes.join(",").as_bytes())[..16].to_string();
        Reader {
            rsim,
            probes,
            table: OnceLock::new(),
            remembered: Mutex::new(Remembered::default()),
            store,
            tag,
            store_cap: MAX_STORE_BYTES,
        }
    }

    /// The table of what every composition prints on this reader's probes (built once, when
    /// first needed).
    fn table(&self, wanted: &(dyn Fn(&str) -> bool + Sync)) -> &Table {
        self.table
            .get_or_init(|| Table::build(&self.probes, wanted))
    }

    /// The readings file's lines for these probes (read once; a line that does not parse is
    /// skipped).
    fn load(&self, into: &mut Remembered) {
        into.loaded = true;
        let Some(path) = &self.store else {
            return;
        };
        let Ok(text) = crate::util::file::read_regular_text(path, self.store_cap) else {
            return;
        };
        for line in text.lines() {
            if into.classes.len() >= MAX_REMEMBERED {
                break;
            }
            // A line another hand wrote is taken only as a reading could be: this reader's
            // probes, a sha256, and composition ids (the study's own `.rsim/` is trusted as its
            // protected splits are, but a copied one must not make this reader panic or err).
            if let Ok(r) = serde_json::from_str::<StoredReading>(line)
                && r.p == self.tag
                && r.s.len() == 64
                && r.s.bytes().all(|b| b.is_ascii_hexdigit())
                && r.c.len() <= MAX_CLASS
                && r.c.iter().all(|&id| is_composition(id))
            {
                into.classes.insert(r.s, r.c);
            }
        }
    }

    /// Append readings to the study's file (one write; a file that cannot be written is left).
    fn keep(&self, readings: &[(String, Vec<u32>)]) {
        let Some(path) = &self.store else {
            return;
        };
        let mut buf = String::new();
        for (sha, class) in readings {
            let line = StoredReading {
                p: self.tag.clone(),
                s: sha.clone(),
                c: class.clone(),
            };
            if let Ok(l) = serde_json::to_string(&line) {
                buf.push_str(&l);
                buf.push('\n');
            }
        }
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        // Bounded: a file that would pass `store_cap` starts over with these readings (it is a
        // cache; an agent registering distinct programs in a loop cannot grow it past that).
        let size = std::fs::symlink_metadata(path).map_or(0, |m| m.len());
        let written = if size.saturating_add(buf.len() as u64) > self.store_cap {
            crate::util::file::write_replacing(path, buf.as_bytes())
        } else {
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)
                .and_then(|mut f| f.write_all(buf.as_bytes()))
        };
        if let Err(e) = written {
            eprintln!(
                "rsim: cannot keep the gate's readings in {}: {e}",
                path.display()
            );
        }
    }

    fn read_programs(
        &self,
        parts: &[&[Row]],
        skip: &HashSet<At>,
        read_as: &HashMap<At, HashSet<String>>,
        wanted: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<Vec<(String, At)>, Unread> {
        // Each distinct program once, with the first row offering it and its text's sha256 (the
        // key it is remembered and kept by).
        let mut firsts: Vec<(String, At)> = Vec::new();
        let mut shas: Vec<String> = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        let mut bytes = 0usize;
        for (p, rows) in parts.iter().enumerate() {
            for (i, row) in rows.iter().enumerate() {
                if skip.contains(&(p, i)) {
                    continue;
                }
                let Some(offered) = candidates(row) else {
                    return Err(Unread {
                        at: (p, i),
                        why: format!(
                            "it offers more than {} MiB of program text (its lines, each cut \
                             after every `>` and `:`)",
                            MAX_ROW_BYTES >> 20
                        ),
                    });
                };
                for c in offered {
                    let sha = crate::util::hash::sha256_hex(c.as_bytes());
                    if seen.insert(sha.clone()) {
                        shas.push(sha);
                        bytes += c.len();
                        if bytes > MAX_SCAN_BYTES {
                            return Err(Unread {
                                at: (p, i),
                                why: format!(
                                    "the scan holds more than {} MiB of distinct program text",
                                    MAX_SCAN_BYTES >> 20
                                ),
                            });
                        }
                        firsts.push((c, (p, i)));
                    }
                }
            }
        }
        let mut classes: Vec<(usize, Vec<u32>)> = Vec::new();
        let mut unread: Vec<usize> = Vec::new();
        {
            let mut remembered = self.remembered.lock().unwrap_or_else(|e| e.into_inner());
            if !remembered.loaded {
                self.load(&mut remembered);
            }
            for (n, sha) in shas.iter().enumerate() {
                match remembered.classes.get(sha) {
                    Some(class) => classes.push((n, class.clone())),
                    None => unread.push(n),
                }
            }
        }
        if !unread.is_empty() {
            let work =
                std::env::temp_dir().join(format!("rsim-gate-{:016x}", rand::random::<u64>()));
            let result = self.run_all(&work, &firsts, &shas, &unread, wanted);
            let _ = std::fs::remove_dir_all(&work);
            classes.extend(result?);
        }
        // Readings kept from before (another process's) are judged too: with no program run
        // here, the table is built for them (a kept class judged by no table matched nothing,
        // and a refused dataset registered again in a new process passed).
        let mut found = Vec::new();
        if classes.iter().any(|(_, class)| !class.is_empty()) {
            let table = self.table(wanted);
            for (n, class) in classes {
                let at = firsts[n].1;
                for k in table.verdict(&class, read_as.get(&at)) {
                    found.push((k, at));
                }
            }
        }
        Ok(found)
    }

    fn run_all(
        &self,
        work: &std::path::Path,
        firsts: &[(String, At)],
        shas: &[String],
        todo: &[usize],
        wanted: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<Vec<(usize, Vec<u32>)>, Unread> {
        let first_at = firsts[todo[0]].1;
        let rsim = self.rsim.as_ref().map_err(|e| Unread {
            at: first_at,
            why: format!("this machine cannot run its program to read it: {e}"),
        })?;
        let runner = programs::Runner::with_rsim(
            work,
            std::path::Path::new(programs::PYTHON),
            programs::LIMITS,
            rsim.to_path_buf(),
        )
        .map_err(|e| Unread {
            at: first_at,
            why: format!(
                "this machine cannot run its program to read it: {}",
                e.message
            ),
        })?;
        let compiles = self
            .compiling(&runner, firsts, todo)
            .map_err(|why| Unread { at: first_at, why })?;
        if compiles.len() > MAX_RUNS {
            return Err(Unread {
                at: firsts[compiles[MAX_RUNS]].1,
                why: format!(
                    "the scan holds more than {MAX_RUNS} programs the gate cannot read without \
                     running them"
                ),
            });
        }
        if compiles.is_empty() {
            return Ok(Vec::new());
        }
        let table = self.table(wanted);
        let deadline = Instant::now() + TIME;
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let results: Mutex<Vec<(usize, Result<Reading, String>)>> = Mutex::new(Vec::new());
        let workers = std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(1, 4);
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| {
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= compiles.len() || failed.load(Ordering::Relaxed) {
                            break;
                        }
                        let n = compiles[k];
                        let r = self.read_one(&runner, table, n, &firsts[n].0, deadline);
                        if r.is_err() {
                            failed.store(true, Ordering::Relaxed);
                        }
                        results
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((n, r));
                    }
                });
            }
        });
        let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
        results.sort_by_key(|(n, _)| *n);
        let mut found = Vec::new();
        let mut fresh: Vec<(String, Vec<u32>)> = Vec::new();
        let mut remembered = self.remembered.lock().unwrap_or_else(|e| e.into_inner());
        for (n, r) in results {
            let at = &firsts[n].1;
            match r {
                Ok(Reading::Class(class)) => {
                    if remembered.classes.len() >= MAX_REMEMBERED {
                        remembered.classes.clear();
                    }
                    remembered.classes.insert(shas[n].clone(), class.clone());
                    fresh.push((shas[n].clone(), class.clone()));
                    found.push((n, class));
                }
                Ok(Reading::Stopped) => {
                    self.keep(&fresh);
                    return Err(Unread {
                        at: *at,
                        why: "its program ran past the evaluation's time limit on a probe input, \
                              so what it prints is unknown"
                            .into(),
                    });
                }
                Err(why) => {
                    self.keep(&fresh);
                    return Err(Unread { at: *at, why });
                }
            }
        }
        self.keep(&fresh);
        Ok(found)
    }

    /// Which of `todo` compile (positions into `firsts`), checked in batches of at most
    /// `COMPILE_BATCH` programs and `COMPILE_BYTES` bytes.
    fn compiling(
        &self,
        runner: &programs::Runner,
        firsts: &[(String, At)],
        todo: &[usize],
    ) -> Result<Vec<usize>, String> {
        let mut out = Vec::new();
        let mut batch: Vec<usize> = Vec::new();
        let mut bytes = 0;
        for &n in todo {
            if !batch.is_empty()
                && (batch.len() >= COMPILE_BATCH || bytes + firsts[n].0.len() > COMPILE_BYTES)
            {
                self.check_batch(runner, firsts, &batch, &mut out)?;
                batch.clear();
                bytes = 0;
            }
            bytes += firsts[n].0.len();
            batch.push(n);
        }
        if !batch.is_empty() {
            self.check_batch(runner, firsts, &batch, &mut out)?;
        }
        Ok(out)
    }

    /// One batch of `compiling`: a batch whose check does not end well (a source that stops
    /// the compiler, past its memory or time) is checked again in halves, and one such
    /// source alone is run as if it compiled.
    fn check_batch(
        &self,
        runner: &programs::Runner,
        firsts: &[(String, At)],
        batch: &[usize],
        out: &mut Vec<usize>,
    ) -> Result<(), String> {
        let sources: Vec<&str> = batch.iter().map(|&n| firsts[n].0.as_str()).collect();
        let input = serde_json::to_string(&sources).map_err(|e| e.to_string())?;
        let ran = runner.output(0, COMPILE, &input).map_err(|e| {
            format!(
                "this machine cannot run its program to read it: {}",
                e.message
            )
        })?;
        match ran {
            Ran::Printed(mask) if mask.len() == batch.len() => {
                out.extend(
                    batch
                        .iter()
                        .zip(mask.bytes())
                        .filter(|(_, b)| *b == b'1')
                        .map(|(n, _)| *n),
                );
                Ok(())
            }
            _ if batch.len() == 1 => {
                out.push(batch[0]);
                Ok(())
            }
            _ => {
                let (a, b) = batch.split_at(batch.len() / 2);
                self.check_batch(runner, firsts, a, out)?;
                self.check_batch(runner, firsts, b, out)
            }
        }
    }

    /// Run one program on the probes, as far as its outputs could still be a protected
    /// composition's.
    fn read_one(
        &self,
        runner: &programs::Runner,
        table: &Table,
        n: usize,
        program: &str,
        deadline: Instant,
    ) -> Result<Reading, String> {
        let mut outs: Vec<String> = Vec::with_capacity(PROBES);
        for (i, probe) in self.probes.iter().enumerate() {
            if Instant::now() > deadline {
                return Err(format!(
                    "the gate ran programs for {} s and this one was not read to the end",
                    TIME.as_secs()
                ));
            }
            match runner
                .output(n + 1, program, &format!("{probe}\n"))
                .map_err(|e| format!("its program could not be run: {}", e.message))?
            {
                Ran::Printed(o) => outs.push(o),
                Ran::Failed => return Ok(Reading::Class(Vec::new())),
                Ran::Stopped => return Ok(Reading::Stopped),
            }
            let seen = prefix_hashes(outs.iter().map(String::as_bytes))[i];
            if !table.protected_prints[i].contains(&seen) {
                return Ok(Reading::Class(Vec::new()));
            }
        }
        let outs: [String; PROBES] = match outs.try_into() {
            Ok(o) => o,
            Err(_) => return Ok(Reading::Class(Vec::new())),
        };
        Ok(Reading::Class(table.class(&outs)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_composition_is_named_as_the_string_ops_form_keys_its_specification() {
        let mut all: Vec<Vec<u32>> = (0..KINDS).map(|k| vec![k]).collect();
        for _ in 1..3 {
            let longer: Vec<Vec<u32>> = all
                .iter()
                .filter(|ks| ks.len() == all.last().map_or(0, Vec::len))
                .flat_map(|ks| {
                    (0..KINDS).map(move |k| ks.iter().copied().chain([k]).collect::<Vec<u32>>())
                })
                .collect();
            all.extend(longer);
        }
        assert_eq!(all.len(), 17 + 17 * 17 + 17 * 17 * 17);
        for ks in all {
            let ops: Vec<Op> = ks.iter().map(|&k| of_kind(k)).collect();
            let id = ops.iter().fold(0, |id, &o| then(id, o));
            assert_eq!(kinds(id), ks);
            if ops.len() >= 2 {
                let spec = crate::policy::canon::canonical(&code_tasks::prompt(&ops));
                let key = crate::policy::string_ops::item_key(&spec);
                assert_eq!(key, Some(name_of(id)), "{spec}");
            }
        }
    }

    fn ops(spec: &str) -> Vec<Op> {
        let mut out = Vec::new();
        for w in spec.split(';') {
            let (name, arg) = w.split_once(' ').unwrap_or((w, ""));
            let c = arg.chars().next().unwrap_or('a');
            out.push(match name {
                "rev" => Op::Rev,
                "up" => Op::Up,
                "dup" => Op::Dup,
                "sort" => Op::Sort,
                "take" => Op::Take(arg.parse().expect("count")),
                "drop" => Op::Drop(arg.parse().expect("count")),
                "del" => Op::Del(c),
                "add" => Op::Add(c),
                _ => Op::Pre(c),
            });
        }
        out
    }

    fn outputs(probes: &[String; PROBES], spec: &str) -> [String; PROBES] {
        std::array::from_fn(|i| code_tasks::run(&ops(spec), &probes[i]))
    }

    #[test]
    fn readings_are_kept_for_the_same_probes_only() {
        let dir = tempfile::tempdir().expect("dir");
        let store = dir.path().join("gate-readings.jsonl");
        let reader = |seed| Reader::new(Err("none".into()), seed, Some(store.clone()));
        let a = reader(7);
        let (f00d, beef) = ("f00d".repeat(16), "beef".repeat(16));
        a.keep(&[(f00d.clone(), vec![3, 40]), (beef, vec![])]);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&store)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"not json\n"))
            .expect("append");
        let mut again = Remembered::default();
        reader(7).load(&mut again);
        assert_eq!(again.classes.get(&f00d), Some(&vec![3, 40]));
        assert_eq!(again.classes.len(), 2);
        // The same seed draws the same probes; another seed's readings are not these.
        assert_eq!(reader(7).probes, a.probes);
        let mut other = Remembered::default();
        reader(8).load(&mut other);
        assert!(other.classes.is_empty());
        // Lines another hand wrote that are no reading are skipped: ids naming no composition,
        // a key that is no sha256.
        let tag = a.tag.clone();
        let sha = "a".repeat(64);
        let lines = format!(
            "{{\"p\":\"{tag}\",\"s\":\"{sha}\",\"c\":[4294967295]}}\n\
             {{\"p\":\"{tag}\",\"s\":\"../x\",\"c\":[1]}}\n\
             {{\"p\":\"{tag}\",\"s\":\"{sha}\",\"c\":[18]}}\n"
        );
        std::fs::write(&store, lines).expect("write");
        let mut crafted = Remembered::default();
        reader(7).load(&mut crafted);
        assert!(crafted.classes.is_empty(), "{:?}", crafted.classes);
        // A link planted as the file is neither read nor written through.
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "").expect("target");
        std::fs::remove_file(&store).expect("rm");
        std::os::unix::fs::symlink(&target, &store).expect("link");
        a.keep(&[("ab".repeat(32), vec![1])]);
        assert_eq!(std::fs::read_to_string(&target).expect("target"), "");
    }

    /// The next attack on the readings file: an agent registering distinct programs in a loop
    /// (each run program adds a line) grew it without end. It starts over at its bound.
    #[test]
    fn a_loop_of_distinct_programs_cannot_grow_the_readings_file_past_its_bound() {
        let dir = tempfile::tempdir().expect("dir");
        let store = dir.path().join("gate-readings.jsonl");
        let mut r = Reader::new(Err("none".into()), 3, Some(store.clone()));
        r.store_cap = 64 << 10;
        for round in 0..200u32 {
            let readings: Vec<(String, Vec<u32>)> = (0..20u32)
                .map(|i| (format!("{:064x}", round * 20 + i), vec![1 + i % 17]))
                .collect();
            r.keep(&readings);
            let size = std::fs::metadata(&store).expect("file").len();
            assert!(size <= r.store_cap, "{size} after round {round}");
        }
        // The newest readings are still there to be read back.
        let mut back = Remembered::default();
        r.load(&mut back);
        assert!(
            back.classes
                .contains_key(&format!("{:064x}", 199 * 20 + 19))
        );
    }

    #[test]
    fn the_compile_check_names_exactly_the_sources_that_compile() {
        // Run directly (the sandbox's wrapper is rsim's, not a test harness's): the check is the
        // script's own logic. A check that failed would have every source run.
        let python = std::path::Path::new(programs::PYTHON);
        if !python.exists() {
            eprintln!("skipping: no {}", python.display());
            return;
        }
        let sources = [
            "print(input()[::-1])",
            "0 apples",
            "def f(s):\n    return s\nprint(f(input()))",
            "Q: what is 2 plus 2?",
            "x=1",
            "print(\u{0})",
            &"(".repeat(5000),
            &format!("x=1{}", "+1".repeat(100_000)),
        ];
        let mut child = std::process::Command::new(python)
            .args(["-I", "-S", "-B", "-c", COMPILE])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python runs");
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(serde_json::to_string(&sources).expect("json").as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("output");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "10101001");
    }

    #[test]
    fn operations_on_bytes_are_the_reference_semantics() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut to = Vec::new();
        for _ in 0..300 {
            let w: String = (0..rng.random_range(0..12usize))
                .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
                .collect();
            for op in code_tasks::every_op() {
                for s in [w.clone(), w.to_uppercase()] {
                    apply_bytes(op, s.as_bytes(), &mut to);
                    assert_eq!(String::from_utf8_lossy(&to), op.apply(&s), "{op:?} {s}");
                }
            }
        }
    }

    #[test]
    fn probes_are_words_like_the_tests_inputs_holding_every_letter() {
        let mut rng = StdRng::seed_from_u64(4);
        for _ in 0..200 {
            let p = draw_probes(&mut rng);
            for l in 'a'..='z' {
                let early = p.iter().any(|w| w.chars().take(2).any(|c| c == l));
                let late = p.iter().any(|w| w.chars().skip(5).any(|c| c == l));
                assert!(early && late, "{l} in {p:?}");
            }
            assert!(p.iter().all(|w| (6..=9).contains(&w.len())), "{p:?}");
        }
        // After `drop 5`, and after `take 2`, every letter is somewhere in what is left.
        let p = draw_probes(&mut rng);
        for l in 'a'..='z' {
            for op in [Op::Drop(5), Op::Take(2)] {
                assert!(p.iter().any(|w| op.apply(w).contains(l)), "{l} {op:?}");
            }
        }
    }

    #[test]
    fn a_composition_matches_when_only_protected_ones_print_its_outputs() {
        let probes = draw_probes(&mut StdRng::seed_from_u64(7));
        let protected = [
            "ops:del #;add #",
            "ops:rev;up",
            "ops:drop 2;drop 3",
            "ops:take 4;sort;pre #",
        ];
        let wanted = |k: &str| protected.contains(&k);
        let t = Table::build(&probes, &wanted);
        let none = Vec::<String>::new();
        let keys = |spec: &str, read_as: &[&str]| {
            let r: HashSet<String> = read_as.iter().map(|s| s.to_string()).collect();
            t.verdict(&t.class(&outputs(&probes, spec)), Some(&r))
        };
        // Any letters (the splits hold compositions apart with letters blanked), in a program
        // the symbolic reading could not read.
        assert_eq!(keys("del q;add r", &[]), ["ops:del #;add #"]);
        assert_eq!(keys("del a;add a", &[]), ["ops:del #;add #"]);
        assert_eq!(keys("take 4;sort;pre z", &[]), ["ops:take 4;sort;pre #"]);
        // `rev;up` prints what the free `up;rev` prints: a program read as `up;rev` is that.
        assert_eq!(keys("rev;up", &[]), ["ops:rev;up"]);
        assert_eq!(keys("up;rev", &["ops:up;rev"]), none);
        assert_eq!(keys("del q;add r", &["ops:add #;del #"]), none);
        // `drop 5`, free and shorter, prints what `drop 2;drop 3` does: nothing protects it.
        assert_eq!(keys("drop 2;drop 3", &[]), none);
        // Free compositions, and a protected one's outputs on all probes but one.
        assert_eq!(keys("del q;rev", &[]), none);
        // Nothing printed, or one string whatever the input: no evidence of any item.
        // `take 3` prints what the protected `dup;take 3` prints, and is free: a program printing
        // it is read no further than its first probe.
        let t3 = Table::build(&probes, &|k: &str| k == "ops:dup;take 3");
        let take3 = prefix_hashes(outputs(&probes, "take 3").iter().map(|o| o.as_bytes()));
        assert!(!t3.protected_prints[0].contains(&take3[0]));
        let protected = ["ops:take 1;drop 1", "ops:drop 5;drop 5;add #"];
        let t2 = Table::build(&probes, &|k: &str| protected.contains(&k));
        for spec in ["take 1;drop 1", "drop 5;drop 5;add x"] {
            assert!(t2.class(&outputs(&probes, spec)).is_empty(), "{spec}");
        }
        let mut mixed = outputs(&probes, "del q;add r");
        mixed[PROBES - 1] = outputs(&probes, "del q;add s")[PROBES - 1].clone();
        assert!(t.class(&mixed).is_empty());
        // A reading ends early at an output no protected composition prints.
        let prefixes =
            |spec: &str| prefix_hashes(outputs(&probes, spec).iter().map(|o| o.as_bytes()));
        assert!(!t.protected_prints[0].contains(&prefixes("sort;dup")[0]));
        let first = prefixes("take 4;sort;pre q");
        assert!(t.protected_prints[0].contains(&first[0]));
        assert!(t.protected_prints[PROBES - 1].contains(&first[PROBES - 1]));
    }

    #[test]
    fn a_generated_row_offers_no_candidate_and_anything_else_does() {
        use crate::model::data::{CodeParams, CodeStyle};
        for style in [CodeStyle::Steps, CodeStyle::Nested, CodeStyle::Named] {
            let p = CodeParams {
                style,
                max_ops: 3,
                n: 0,
                seed: 5,
            };
            for r in code_tasks::code_stream(&p, 5).take(3000) {
                assert_eq!(candidates(&r), Some(Vec::new()), "{r:?}");
            }
        }
        for r in code_tasks::pretraining_rows(600, 2) {
            assert_eq!(candidates(&r), Some(Vec::new()), "{r:?}");
        }
        let row = |p: &str, a: &str| Row {
            prompt: p.into(),
            answer: a.into(),
        };
        // One character off the generator's text, or another style: run.
        for (p, a) in [
            ("str rev;up>", "print(input()[::-1].upper());"),
            ("str rev;up>", "print(input()[::-1].upper())#"),
            ("str rev;up>", "s=input();print(s[::-1].upper())"),
            ("str rev;up>", "print(input()[::-1].upper())\nprint(1)"),
            ("str rev;take 6>", "print(input()[::-1][:6])"),
            ("Q: reverse it\nA:", "print(''.join(reversed(input())))"),
        ] {
            let c = candidates(&row(p, a)).expect("a short row");
            assert!(!c.is_empty(), "{p}{a}");
        }
        let c = candidates(&row(
            "Q: reverse it\nA:",
            "print(''.join(reversed(input())))",
        ))
        .expect("a short row");
        assert!(
            c.contains(&"print(''.join(reversed(input())))".to_string()),
            "{c:?}"
        );
        // A generated program after words of any kind: its operations are known.
        let c = candidates(&row("Q: reverse it\nA:", "print(input()[::-1])")).expect("short");
        assert!(!c.contains(&"print(input()[::-1])".to_string()), "{c:?}");
        // A program behind any number of lines or cuts is offered; a row offering more program
        // text than the gate reads is unread, not read in part.
        let p = "print(''.join(reversed(input())))";
        let hidden = format!("{}x>{p}", "a>b:".repeat(300));
        let c = candidates(&row(&"q\n".repeat(300), &hidden)).expect("under the bound");
        assert!(c.iter().any(|c| c == p), "{}", c.len());
        assert_eq!(candidates(&row(&">".repeat(4000), "")), None);
    }
}
