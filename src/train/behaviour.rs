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
//!   drawn as the hidden tests' inputs are (`code_tasks::random_word`: six to nine lowercase
//!   letters, each uniform), from the seed the OS gives (the study's secret: a study keeps its
//!   probes); then only the letters some places miss are dealt in, so that the longer words of
//!   the first `COVER` hold every letter between them and every letter stands early in a longer
//!   word and late in one, and a deleted letter shows; every letter stands in four probes to
//!   `PROBES - NEAR_AGREE` (`draw_probes`).
//! - **Matching.** Every composition of up to `string_ops::MAX_OPS` of the generator's
//!   operations (each count, each letter: 92 of them, 787,749 compositions with none) is run on
//!   the probes in Rust (`code_tasks::Op::apply`, the hidden outputs' reference semantics). A
//!   program's outputs name the compositions that print them (its class), and `Table::verdict`
//!   decides: no match when a free composition of fewer operations is among them (`dup;take 3`
//!   prints what `take 3` prints) or when the row reads — by its specification or its program
//!   read symbolically — as a free one among them (`str up;rev>`, where `rev;up` is protected);
//!   else the protected ones of the fewest operations. One output on every probe is no
//!   evidence. A protected composition with one `del` is also read on the probes holding its
//!   letter alone (`Single`): every test input of its item holds the letter, and a program may
//!   print anything elsewhere. A reading ends at the first probe whose outputs so far no
//!   protected composition that would match prints, on every probe or on those holding some
//!   letter; the longer of the first `COVER` probes hold every letter, so an honest program has
//!   seen every letter by the time its reading could end (a failed run is an output no
//!   composition prints: the reading goes on).
//! - **Most probes.** Where no composition prints a program's outputs on every probe, a protected
//!   one that would match and prints them on `NEAR_AGREE` of the probes matches, unless a free
//!   composition printed on that many probes prints them on more, or on as many with fewer
//!   operations (`Near`): a program failing on a rare kind of input that a probe happens to be is
//!   its item. One with `del`s is also read on the probes as long as its item's tests' inputs.
//!   A simpler reading printed on one probe fewer explains the program (`NEAR_MARGIN`). A
//!   reading goes on while some protected composition could still be printed on that many
//!   probes, so every program is read on `PROBES - NEAR_AGREE + 1` probes at least.
//! - **Fail closed.** A program stopped by a time limit (which depends on load: it might pass
//!   an evaluation), a scan past `MAX_RUNS` programs, `TIME` or its bytes, or a machine that
//!   cannot run programs in the sandbox leaves the row unread, and an unread row is refused,
//!   naming why (`Unread`).
//!
//! Not read: a program that prints an item's outputs only for inputs holding its two or three
//! deleted letters (as every test input does, and few probes), that fails on a kind of input
//! common enough to catch nine probes (and fails its item's tests about as often), that fails on
//! a rare kind among the few probes holding its one `del`'s letter and prints anything elsewhere,
//! or that prints an item only after telling a probe from a test some other way (the time, the
//! machine, chance).

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

/// Probe inputs each program runs on (see `draw_probes`): words like the tests' inputs, the
/// longer words of the first `COVER` holding every letter between them.
pub const PROBES: usize = 20;

/// The first probes, whose words of seven letters or more hold every letter between them: as many
/// as every program is read on (a protected composition could be printed on `NEAR_AGREE` probes
/// until then), so an honest program's reading has seen every letter by the time it could end.
pub const COVER: usize = PROBES - NEAR_AGREE + 1;

/// The probes' lengths (drawn in a random order): four, five, five and six of the lengths the
/// tests' words have.
const LENGTHS: [usize; PROBES] = [9, 9, 8, 7, 6, 7, 8, 9, 6, 7, 8, 9, 6, 7, 8, 9, 6, 7, 8, 9];

/// How many probes each letter stands in (`spread_letters`): from about its mean in random words
/// to `PROBES - NEAR_AGREE`.
const LETTER_PROBES: std::ops::RangeInclusive<usize> = 4..=PROBES - NEAR_AGREE;

/// The shortest test input of an item with one `del`: a word of six letters or more with the
/// deleted letter put in.
const SINGLE_MIN_LEN: usize = 7;

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

/// A class's mark on a protected composition with one `del` that a program computes on the
/// probes holding its letter only (`Single`).
const BY_LETTER: u32 = 1 << 30;

/// A class's mark on a protected composition a program computes on most probes but not all
/// (`Near`).
const NEAR: u32 = 1 << 29;

/// The probes a program must print a protected composition's outputs on to be read as it, where
/// it prints them on fewer than all (`Near`): 12 of 20.
const NEAR_AGREE: usize = 12;

/// The reading's rule, in the readings file's tag (`Reader::new`): a reading made by another
/// rule is not taken.
const READING_RULE: &str = "near-12-of-20-unchanged-by-2";

/// How many probes fewer a simpler reading may be printed on and still explain a program read on
/// most probes: on every probe and on the probes of seven letters or more (an item of one `del`),
/// a free composition of fewer operations; on the probes of eight or nine letters (items of two
/// `del`s or more), the word unchanged (no operation). A program printing the word unchanged except
/// where some letter is (`s.partition('z')[0]`) is printed unchanged on most probes, and a
/// composition of `del`s of that letter and of letters standing only after it on a probe or two
/// prints it there too, by chance: one probe more. "The first half of the word" is `take 4` on
/// longer words and `take 3` on shorter ones, where `take 4;del z` prints it too on the shorter
/// words holding `z` fourth; "the part before the first `o`, four letters of it" is `take 4` but
/// where `o` is among the first four, and `take 4;del o` prints it where `o` is fourth. (120 honest
/// programs that are no composition, on six draws of random probes: two to four refused a draw
/// without it, one to three with it, "no vowels" in every draw. An item's program prints its item
/// where any of its letters shows, on several probes more than such a reading; where on one alone,
/// the item is that simpler reading on all probes but one. Two `del`s are read on the eight
/// longer probes or so, where a simpler reading one probe fewer is still most of them: the word
/// unchanged alone is held to it.)
const NEAR_MARGIN: usize = 1;

/// What a failed run counts as printing: no composition prints a control character.
const FAILED: &str = "\u{1}failed";

/// `Table::walk`'s mark for a composition with more than one `del`.
const MANY_DELS: u8 = u8::MAX;

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

/// One probe's output, with its place, fed to a reading's hash on some of the probes (a
/// `Single`'s); the hash after it.
fn masked_step(h: &mut std::hash::DefaultHasher, at: usize, out: &[u8]) -> u64 {
    h.write_usize(at);
    h.write(out);
    h.write_u8(0xff);
    h.finish()
}

/// The hashes of `outs` on the probes of `mask`, after each of them (the last: of them all).
fn on_mask<O: AsRef<[u8]>>(mask: u32, outs: &[O]) -> impl Iterator<Item = u64> + '_ {
    let mut h = keys().build_hasher();
    outs.iter()
        .enumerate()
        .filter(move |(k, _)| mask & 1 << k != 0)
        .map(move |(k, o)| masked_step(&mut h, k, o.as_ref()))
}

/// The protected compositions with one `del` of a letter, read on the probes holding it.
///
/// Every test input of such an item holds its letter, and a program need print the item's
/// outputs only there: on the other probes it may print anything, and read on all probes it
/// would be no composition (a red-team helper's: 24 of 24 `del` items through). It is read on
/// `mask` alone, and matches where it prints what the item prints there.
#[derive(Default)]
struct Single {
    /// The probes (bits) of seven letters or more holding the letter.
    mask: u32,
    /// The hashes of what some protected composition prints on the mask's probes, after each.
    prints: HashSet<u64>,
    /// Its outputs on all of them → the compositions printing them.
    by_final: HashMap<u64, Vec<u32>>,
}

/// What `Table::walk` gathers for `Table::build` to judge once every composition is walked.
#[derive(Default)]
struct Walked {
    /// The prefix hashes of protected compositions' outputs (one output on every probe left out),
    /// with their id, `del`s and outputs on each probe (`Near`).
    printed_by_protected: Vec<([u64; PROBES], u32, u8, [u32; PROBES])>,
    /// By letter: what free compositions of fewer than the most operations print on the probes
    /// holding it (the last of their hashes), with the fewest operations printing it.
    free_on_mask: Vec<HashMap<u64, usize>>,
    /// Protected compositions with one `del`: its letter, the id, its operations, and where in
    /// `hashes` its hashes on the probes holding the letter are.
    singles: Vec<(u8, u32, usize, std::ops::Range<usize>)>,
    hashes: Vec<u64>,
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
    /// By letter (`a` first): protected compositions with one `del`, of that letter.
    single: Vec<Single>,
    /// What every composition prints on each probe, for a program printing a protected one's
    /// outputs on most probes.
    near: Near,
}

/// Each composition's output on each probe (a 32-bit hash), in the walk's order: a program that
/// prints a protected composition's outputs on `NEAR_AGREE` probes or more, and on more than any
/// free composition, is read as it.
///
/// Read on all probes alone, a program need differ from its item on one probe only to be no
/// composition: one that fails (or prints anything else) on some rare kind of input that one
/// probe happens to be passes its item's hidden tests about as often as the item's own program
/// (a red-team helper's crashed on nine-letter words with no repeated letter: 323 of 378 items
/// without a `del` through, 85% of them passing their hidden tests). Read on most probes, it must
/// fail on a kind of input common enough to catch nine of twenty probes, and then fails its
/// item's hidden tests about as often.
///
/// A protected composition with `del`s is also read on the probes as long as its item's test
/// inputs alone (six letters and one more for each `del`, `Near::reads`), and matches on either:
/// an item of two `del`s is tested on words of eight letters or more, eleven of the twenty
/// probes, and a program printing it only there was read on all twenty as no composition (a
/// red-team helper's guard `len(s)<8`: 22 of 25 such items through, all passing their hidden
/// tests). The free composition that would explain better is sought on the same probes.
#[derive(Default)]
struct Near {
    /// Each free composition's outputs, and its operations.
    free: Vec<[u32; PROBES]>,
    free_ops: Vec<u8>,
    /// The protected compositions that would match where they print a program's outputs on every
    /// probe (no free composition of fewer operations prints theirs): by probe, each one's output
    /// (read down a probe's column as a reading goes on), and each one's id and `del`s.
    cols: Vec<Vec<u32>>,
    ids: Vec<u32>,
    dels: Vec<u8>,
    /// Each probe's length less six: the most `del`s of an item whose tests' inputs are as long.
    longest_dels: [u8; PROBES],
    /// By `del`s (three for more): the probes as long as such an item's tests' inputs, and how
    /// many of them it must be printed on (`NEAR_AGREE` in `PROBES`, rounded up).
    reads: [(u32, usize); 4],
}

impl Near {
    fn new(probes: &[String; PROBES]) -> Near {
        let longest_dels = std::array::from_fn(|k| probes[k].len().saturating_sub(6) as u8);
        let reads = std::array::from_fn(|d| {
            let mask = (0..PROBES)
                .filter(|&k| usize::from(longest_dels[k]) >= d)
                .fold(0u32, |m, k| m | 1 << k);
            let n = mask.count_ones() as usize;
            (mask, (n * NEAR_AGREE).div_ceil(PROBES))
        });
        Near {
            longest_dels,
            reads,
            ..Near::default()
        }
    }
}

/// A probe's output, hashed for `Near`.
fn probe_hash(out: &[u8]) -> u32 {
    let h = keys().hash_one(out);
    (h ^ h >> 32) as u32
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
        let single = (b'a'..=b'z')
            .map(|c| Single {
                mask: probes
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.len() >= SINGLE_MIN_LEN && p.as_bytes().contains(&c))
                    .fold(0, |m, (k, _)| m | 1 << k),
                ..Single::default()
            })
            .collect();
        let mut t = Table {
            by_outputs: HashMap::new(),
            multi: Vec::new(),
            protected_prints: Default::default(),
            protected,
            single,
            near: Near::new(probes),
        };
        let ops = code_tasks::every_op();
        // One buffer per depth and probe, reused: the walk allocates nothing per composition.
        let mut bufs: Vec<[Vec<u8>; PROBES]> = (0..=crate::policy::string_ops::MAX_OPS)
            .map(|_| std::array::from_fn(|_| Vec::with_capacity(96)))
            .collect();
        for (b, p) in bufs[0].iter_mut().zip(probes) {
            b.extend_from_slice(p.as_bytes());
        }
        let mut walked = Walked {
            free_on_mask: vec![HashMap::new(); 26],
            ..Walked::default()
        };
        t.walk(&ops, 0, 0, 0, &mut bufs, &mut walked);
        // A reading goes on only while its outputs so far are those of a protected composition
        // that would match (no free one of fewer operations printing the same: `take 3`'s
        // outputs are `dup;take 3`'s, and a program printing them never matches).
        t.near.cols = vec![Vec::new(); PROBES];
        for (hashes, id, dels, each) in walked.printed_by_protected {
            let class = t.class_of(hashes[PROBES - 1]);
            if !t.verdict(&class, None).is_empty() {
                for (seen, h) in t.protected_prints.iter_mut().zip(hashes) {
                    seen.insert(h);
                }
                for (col, h) in t.near.cols.iter_mut().zip(each) {
                    col.push(h);
                }
                t.near.ids.push(id);
                t.near.dels.push(dels);
            }
        }
        // So on the probes holding a letter: `up;del c` prints what `up` prints, and `take 3;del
        // c` what `take 3` prints where `c` is never among the first three.
        for (letter, id, ops, at) in walked.singles {
            let prefixes = &walked.hashes[at];
            let Some(&last) = prefixes.last() else {
                continue;
            };
            let single = usize::from(letter);
            if walked.free_on_mask[single]
                .get(&last)
                .is_some_and(|&fewer| fewer < ops)
            {
                continue;
            }
            let single = &mut t.single[single];
            single.prints.extend(prefixes.iter().copied());
            let ids = single.by_final.entry(last).or_default();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        t
    }

    /// The compositions from `id` on (its outputs in `bufs[depth]`); `del` is 0 without a
    /// `del`, its letter's place in the alphabet (from 1) with one, `MANY_DELS` with more.
    fn walk(
        &mut self,
        ops: &[Op],
        id: u32,
        depth: usize,
        del: u8,
        bufs: &mut [[Vec<u8>; PROBES]],
        walked: &mut Walked,
    ) {
        let outs = &bufs[depth];
        let hashes = prefix_hashes(outs.iter().map(Vec::as_slice));
        let is_protected = self.protected.contains_key(&id);
        let each: [u32; PROBES] = std::array::from_fn(|k| probe_hash(&outs[k]));
        if !is_protected {
            self.near.free.push(each);
            self.near.free_ops.push(depth as u8);
        }
        // (One output on every probe is no evidence: `class`.)
        if is_protected && outs.iter().any(|o| *o != outs[0]) {
            let dels = kinds(id)
                .iter()
                .filter(|&&k| k == kind(Op::Del('a')))
                .count() as u8;
            walked.printed_by_protected.push((hashes, id, dels, each));
        }
        let ops_here = depth;
        if (1..=26).contains(&del) && self.protected.contains_key(&id) {
            let letter = del - 1;
            let mask = self.single[usize::from(letter)].mask;
            // (The same output on every probe of the mask is no evidence, as one output on
            // every probe is none: `class`.)
            let mut shown = outs
                .iter()
                .enumerate()
                .filter(|(k, _)| mask & 1 << k != 0)
                .map(|(_, o)| o);
            if shown.next().is_some_and(|first| shown.any(|o| o != first)) {
                let start = walked.hashes.len();
                walked.hashes.extend(on_mask(mask, outs));
                let at = start..walked.hashes.len();
                walked.singles.push((letter, id, ops_here, at));
            }
        } else if !self.protected.contains_key(&id) && ops_here < crate::policy::string_ops::MAX_OPS
        {
            for (single, fewest) in self.single.iter().zip(walked.free_on_mask.iter_mut()) {
                if let Some(last) = on_mask(single.mask, outs).last() {
                    let f = fewest.entry(last).or_insert(ops_here);
                    *f = (*f).min(ops_here);
                }
            }
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
            let del = match op {
                Op::Del(c) if del == 0 => (c as u8).wrapping_sub(b'a').wrapping_add(1),
                Op::Del(_) => MANY_DELS,
                _ => del,
            };
            self.walk(ops, then(id, op), depth + 1, del, bufs, walked);
        }
    }

    /// Every composition printing `outs` on the probes; none for the same output on every
    /// probe (nothing, or a constant: `t=input()` alone prints what `take 1;drop 1` does on
    /// every input, and a program printing one string whatever it reads answers no
    /// specification).
    ///
    /// With them, the protected compositions with one `del` that print `outs` on the probes
    /// holding its letter (`Single`).
    fn class(&self, outs: &[String; PROBES]) -> Vec<u32> {
        if outs.iter().all(|o| *o == outs[0]) {
            return Vec::new();
        }
        let mut class = self.class_of(prefix_hashes(outs.iter().map(String::as_bytes))[PROBES - 1]);
        for single in &self.single {
            if let Some(ids) = on_mask(single.mask, outs)
                .last()
                .and_then(|l| single.by_final.get(&l))
            {
                for id in ids {
                    if !class.contains(id) && !class.contains(&(id | BY_LETTER)) {
                        class.push(id | BY_LETTER);
                    }
                }
            }
        }
        if class.iter().all(|id| id & BY_LETTER != 0) {
            for id in self.near(outs) {
                if !class.contains(&(id | NEAR)) {
                    class.push(id | NEAR);
                }
            }
        }
        class
    }

    /// The protected compositions whose outputs `outs` holds on most of their probes
    /// (`Near::reads`), where no free composition's it holds on more of them (or on as many, with
    /// fewer operations: as on every probe, `dup;take 3`'s outputs are `take 3`'s). A failed run
    /// prints what none does.
    ///
    /// Probes where it prints them must not all be printed one output (as one output on every
    /// probe is no evidence: `class`).
    fn near(&self, outs: &[String; PROBES]) -> Vec<u32> {
        let hashes: [u32; PROBES] = std::array::from_fn(|k| probe_hash(outs[k].as_bytes()));
        let n = self.near.ids.len();
        // (Plain loops down each probe's column: this runs over half the compositions, and
        // unoptimised builds test it.)
        // On every probe, and on those as long as its item's tests' inputs.
        let (mut on_all, mut on_long) = (vec![0u8; n], vec![0u8; n]);
        for (k, col) in self.near.cols.iter().enumerate() {
            let longest_dels = self.near.longest_dels[k];
            for j in 0..n {
                if col[j] == hashes[k] {
                    on_all[j] += 1;
                    if self.near.dels[j] <= longest_dels {
                        on_long[j] += 1;
                    }
                }
            }
        }
        // Each found: its id, the `del`s whose probes it is read on (0: every probe), and how
        // many of them it is printed on.
        let mut found: Vec<(u32, usize, usize)> = Vec::new();
        for j in 0..n {
            let dels = usize::from(self.near.dels[j]).min(3);
            let long = (dels > 0).then_some((dels, on_long[j]));
            for (read_as, agree) in std::iter::once((0, on_all[j])).chain(long) {
                let (mask, need) = self.near.reads[read_as];
                if usize::from(agree) < need {
                    continue;
                }
                let mut shown = (0..PROBES)
                    .filter(|&k| mask & 1 << k != 0 && self.near.cols[k][j] == hashes[k])
                    .map(|k| &outs[k]);
                if shown.next().is_some_and(|first| shown.any(|o| o != first)) {
                    found.push((self.near.ids[j], read_as, usize::from(agree)));
                }
            }
        }
        if found.is_empty() {
            return Vec::new();
        }
        // By the probes read on (`Near::reads`): the fewest operations of a free composition
        // whose outputs `outs` holds on k of them, among those it holds on `NEAR_AGREE` probes of
        // all at least. A free composition must explain the program on every probe: an honest
        // program of it prints it on every input, and one failing on the words shorter than a
        // two-`del` item's tests is not the free composition that prints what the item prints
        // on the eleven longer probes where one of its letters is missing.
        // (And of any free composition, however many probes of all: one of fewer operations is
        // a simpler reading wherever it is printed on as many of the probes the protected one is
        // read on, as `take 4` is of "the first half of the word" beside `del x;take 4`; and the
        // word unchanged, no operation, wherever it is printed on one probe fewer: `NEAR_MARGIN`.)
        let mut fewest = [[u8::MAX; PROBES + 1]; 4];
        let mut fewest_any = [[u8::MAX; PROBES + 1]; 4];
        for (row, &ops) in self.near.free.iter().zip(&self.near.free_ops) {
            let mut on = 0u32;
            for k in 0..PROBES {
                if row[k] == hashes[k] {
                    on |= 1 << k;
                }
            }
            let explains = on.count_ones() as usize >= NEAR_AGREE;
            for (d, (mask, _)) in self.near.reads.iter().enumerate() {
                let k = (on & mask).count_ones() as usize;
                fewest_any[d][k] = fewest_any[d][k].min(ops);
                if explains {
                    fewest[d][k] = fewest[d][k].min(ops);
                }
            }
        }
        // Beaten by such a free composition printed on more of the probes the protected one is
        // read on, or by any of fewer operations printed on as many.
        let mut ids: Vec<u32> = found
            .into_iter()
            .filter(|&(id, read_as, agree)| {
                let ops = kinds(id).len();
                // How many probes fewer a free composition of `f` operations may be printed on
                // (on every probe and on the probes of seven letters or more, any of fewer
                // operations; on the longer ones, the word unchanged alone: `NEAR_MARGIN`).
                let margin = |f: u8| {
                    if read_as <= 1 || f == 0 {
                        NEAR_MARGIN
                    } else {
                        0
                    }
                };
                fewest[read_as][agree + 1..].iter().all(|&f| f == u8::MAX)
                    && fewest_any[read_as]
                        .iter()
                        .enumerate()
                        .all(|(k, &f)| usize::from(f) >= ops || k + margin(f) < agree)
            })
            .map(|(id, _, _)| id)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// A reading's progress before its first probe.
    fn start(&self) -> Progress {
        Progress {
            whole: true,
            misses: vec![(0, 0); self.near.ids.len()],
            near: !self.near.ids.is_empty(),
            singles: self
                .single
                .iter()
                .map(|s| (keys().build_hasher(), s.mask != 0))
                .collect(),
        }
    }

    /// Whether a reading goes on after the outputs `outs` (one more than before): whether some
    /// protected composition that would match prints them, on every probe or on those holding
    /// its `del`'s letter.
    fn goes_on(&self, p: &mut Progress, outs: &[String]) -> bool {
        let Some(i) = outs.len().checked_sub(1) else {
            return true;
        };
        if p.whole {
            let seen = prefix_hashes(outs.iter().map(String::as_bytes))[i];
            p.whole = self.protected_prints[i].contains(&seen);
        }
        for (single, (h, alive)) in self.single.iter().zip(p.singles.iter_mut()) {
            if *alive && single.mask & 1 << i != 0 {
                *alive = single
                    .prints
                    .contains(&masked_step(h, i, outs[i].as_bytes()));
            }
        }
        if p.near {
            let h = probe_hash(outs[i].as_bytes());
            let col = &self.near.cols[i];
            let longest_dels = self.near.longest_dels[i];
            // The most misses each `del` count may have on its probes.
            let most: [u8; 4] = self
                .near
                .reads
                .map(|(mask, need)| (mask.count_ones() as usize - need) as u8);
            let mut any = false;
            for (j, (all, long)) in p.misses.iter_mut().enumerate() {
                let dels = usize::from(self.near.dels[j]).min(3);
                if *all <= most[0] || *long <= most[dels] {
                    if col[j] != h {
                        *all += 1;
                        if self.near.dels[j] <= longest_dels {
                            *long += 1;
                        }
                    }
                    any |= *all <= most[0] || *long <= most[dels];
                }
            }
            p.near = any;
        }
        p.whole || p.near || p.singles.iter().any(|(_, alive)| *alive)
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
    /// - else the protected compositions of the fewest operations among them;
    /// - and where no composition computes it on every probe, of those it computes on the probes
    ///   holding their letter alone (`BY_LETTER`), the ones of the fewest operations. (Where a
    ///   free one computes it everywhere, it is that: `del b;take 2` prints what a protected
    ///   `take 2;del e` prints wherever `e` is not among a word's first two letters. Where a
    ///   protected one does, that one is the evidence, and a test item's program is not also
    ///   read as every dev item it prints on a letter's probes.)
    fn verdict(&self, class: &[u32], read_as: Option<&HashSet<String>>) -> Vec<String> {
        let (by_letter, whole): (Vec<u32>, Vec<u32>) =
            class.iter().partition(|&&id| id & (BY_LETTER | NEAR) != 0);
        let free = |id: &u32| !self.protected.contains_key(id);
        let read_free =
            read_as.is_some_and(|r| whole.iter().any(|id| free(id) && r.contains(&name_of(*id))));
        if read_free {
            return Vec::new();
        }
        let simplest = |ids: &[u32]| -> Vec<String> {
            let fewest = ids.iter().map(|&id| kinds(id).len()).min();
            ids.iter()
                .filter(|&&id| Some(kinds(id).len()) == fewest)
                .filter_map(|id| self.protected.get(id).cloned())
                .collect()
        };
        if !whole.is_empty() {
            return simplest(&whole);
        }
        let (near, by_letter): (Vec<u32>, Vec<u32>) =
            by_letter.iter().partition(|&&id| id & NEAR != 0);
        let by_letter: Vec<u32> = by_letter.iter().map(|id| id & !BY_LETTER).collect();
        if !by_letter.is_empty() {
            return simplest(&by_letter);
        }
        let near: Vec<u32> = near.iter().map(|id| id & !NEAR).collect();
        simplest(&near)
    }
}

/// Where a reading stands (`Table::goes_on`): whether its outputs so far could still be a
/// protected composition's on every probe, and for each letter, its hash on the probes holding
/// it and whether they could still be a one-`del` composition's there.
struct Progress {
    whole: bool,
    /// By protected composition (`Near::ids`): the probes so far where the reading printed else,
    /// of all and of those it is read on by its `del`s (`Near::reads`).
    misses: Vec<(u8, u8)>,
    /// Whether some protected composition could still be printed on most of its probes.
    near: bool,
    singles: Vec<(std::hash::DefaultHasher, bool)>,
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

/// Words like the hidden tests' inputs: six to nine lowercase letters, each place's letter drawn
/// uniformly over the alphabet, as a test input's are. Then only what must be dealt is dealt:
/// where a set of places misses a letter, the letter is put in at one of the set's places whose
/// letter the set holds elsewhere too (in every set it belongs to, where one is). The sets:
/// - the places of the first `COVER` probes of seven letters or more: every letter is among
///   them, so that an honest program has been read on every letter, on every probe and on the
///   probes a one-`del` item is read on, by the time its reading could end;
/// - the first two places of the probes of seven letters or more (those a one-`del` item is read
///   on, `Single`): a deleted letter shows after any `take` of two or more;
/// - the first four places of the probes of eight letters or more (those a two-`del` item is read
///   on, `Near::reads`): and after a `take` of four there (the first half of a longer word);
/// - the places from the sixth on of those probes: and after any `drop`.
///
/// (A test input holds its item's deleted letters at random places. Dealt among six-letter words
/// too, a letter could show only there, and a program printing the item on longer words and its
/// steps without the `del` on six letters read as those steps: a red-team helper's
/// `take 3;del q`.)
///
/// Dealing the whole alphabet into those places, as the probes once were drawn, made probes
/// repeat letters less than test inputs do: nine probes or more had all their letters distinct in
/// about half the draws (a fifth of random words' draws), so a program printing its item except
/// on such words was read as no composition about half the time (a red-team helper's). A letter
/// dealt now takes the place of one that stands once in its word, in a word without it, where
/// there is one: each word keeps which of its places hold the same letter, as drawn
/// (`probes_repeat_letters_about_as_often_as_the_tests_inputs`).
fn draw_probes(rng: &mut StdRng) -> [String; PROBES] {
    const EARLY: usize = 2;
    const HALF: usize = 4;
    const LATE_FROM: usize = 5;
    let mut lengths = LENGTHS;
    shuffle(&mut lengths, rng);
    let mut words: Vec<Vec<u8>> = lengths
        .iter()
        .map(|&len| code_tasks::random_word(rng, len))
        .collect();
    let places = |keep: &dyn Fn(usize, usize) -> bool| -> Vec<Place> {
        (0..PROBES)
            .flat_map(|i| (0..lengths[i]).map(move |at| (i, at)))
            .filter(|&(i, at)| keep(i, at))
            .collect()
    };
    let long = |i: usize| lengths[i] >= SINGLE_MIN_LEN;
    let sets = [
        places(&|i, _| i < COVER && long(i)),
        places(&|i, at| long(i) && at < EARLY),
        places(&|i, at| lengths[i] > SINGLE_MIN_LEN && at < HALF),
        places(&|i, at| long(i) && at >= LATE_FROM),
    ];
    deal_missing(&mut words, &sets, rng);
    spread_letters(&mut words, &sets, rng);
    std::array::from_fn(|i| String::from_utf8_lossy(&words[i]).into_owned())
}

/// A probe's place: the probe, and a place in its word.
type Place = (usize, usize);

/// How many of `set`'s places hold `c`.
fn held(words: &[Vec<u8>], set: &[Place], c: u8) -> usize {
    set.iter().filter(|&&(i, at)| words[i][at] == c).count()
}

/// Whether the letter at `place` stands once in its word.
fn alone(words: &[Vec<u8>], (i, at): Place) -> bool {
    words[i].iter().filter(|&&b| b == words[i][at]).count() == 1
}

/// Whether the letter at `place` may give way with no set losing it: every set the place belongs
/// to (or the set `only`) holds the letter elsewhere too.
fn may_go(words: &[Vec<u8>], sets: &[Vec<Place>], only: Option<usize>, place: Place) -> bool {
    let c = words[place.0][place.1];
    sets.iter()
        .enumerate()
        .filter(|(k, s)| only.is_none_or(|o| o == *k) && s.contains(&place))
        .all(|(_, s)| held(words, s, c) >= 2)
}

/// Puts every letter a set of places misses in at one of its places (see `draw_probes`). A place
/// whose letter every set it belongs to holds elsewhere is taken, so a set already whole stays
/// whole, and among those first one whose word keeps its pattern of repeated letters; where there
/// is none (there is always a place whose letter this set holds twice: it has more places than
/// letters), another set may lose a letter, and the next pass deals it.
fn deal_missing(words: &mut [Vec<u8>], sets: &[Vec<Place>], rng: &mut StdRng) {
    const PASSES: usize = 16;
    for _ in 0..PASSES {
        let mut whole = true;
        for (k, set) in sets.iter().enumerate() {
            let mut missing: Vec<u8> = (b'a'..=b'z')
                .filter(|&c| held(words, set, c) == 0)
                .collect();
            shuffle(&mut missing, rng);
            for c in missing {
                whole = false;
                // First a place whose letter stands once in its word, in a word without `c`: the
                // word keeps which of its places hold the same letter, and so repeats letters as
                // a random word does.
                let spare = |words: &[Vec<u8>], every: bool, keeps: bool| -> Vec<Place> {
                    set.iter()
                        .copied()
                        .filter(|&place| {
                            !keeps || (alone(words, place) && !words[place.0].contains(&c))
                        })
                        .filter(|&place| may_go(words, sets, (!every).then_some(k), place))
                        .collect()
                };
                let Some(from) = [(true, true), (true, false), (false, false)]
                    .into_iter()
                    .map(|(every, keeps)| spare(words, every, keeps))
                    .find(|from| !from.is_empty())
                else {
                    continue;
                };
                let (i, at) = from[rng.random_range(0..from.len())];
                words[i][at] = c;
            }
        }
        if whole {
            return;
        }
    }
}

/// Every letter in `LETTER_PROBES` probes: not far below the five it stands in on average, so
/// that a `del` of it changes enough words (a program printing the word unchanged except where
/// `z` is was read as `del z;del b` where `b` stood in two probes, both holding `z`), and no more
/// than `PROBES - NEAR_AGREE`, so that a program printing its item except on words holding some
/// letter (a quarter of the tests' inputs hold `j`) is still printed on `NEAR_AGREE` probes.
/// Drawn at random, some letter stands in two probes or fewer in nine draws of ten, and some in
/// nine or more in four of five (a given letter, one draw in twenty).
///
/// A letter in too few probes takes, in a word without it, the place of a letter standing once in
/// its word and in more probes than the least; one in too many gives way, in a word holding it
/// once, to a letter in fewer probes that the word does not hold. Either way the word keeps its
/// pattern of repeated letters, and a place is taken only where every set it belongs to holds its
/// letter elsewhere too, so every set stays whole.
fn spread_letters(words: &mut [Vec<u8>], sets: &[Vec<Place>], rng: &mut StdRng) {
    let (least, most) = (*LETTER_PROBES.start(), *LETTER_PROBES.end());
    let holding = |words: &[Vec<u8>], c: u8| words.iter().filter(|w| w.contains(&c)).count();
    // (Each step moves one letter's count one nearer the range, never another's out of it.)
    for _ in 0..26 * PROBES {
        let counts: Vec<usize> = (b'a'..=b'z').map(|c| holding(words, c)).collect();
        let count = |c: u8| counts[usize::from(c - b'a')];
        let Some(c) = (b'a'..=b'z').find(|&c| !LETTER_PROBES.contains(&count(c))) else {
            return;
        };
        let w: &[Vec<u8>] = words;
        let places = (0..w.len()).flat_map(|i| (0..w[i].len()).map(move |at| (i, at)));
        let moves: Vec<(usize, usize, u8)> = if count(c) < least {
            places
                .filter(|&(i, at)| !w[i].contains(&c) && count(w[i][at]) > least)
                .filter(|&place| alone(w, place) && may_go(w, sets, None, place))
                .map(|(i, at)| (i, at, c))
                .collect()
        } else {
            places
                .filter(|&(i, at)| {
                    w[i][at] == c && alone(w, (i, at)) && may_go(w, sets, None, (i, at))
                })
                .flat_map(|(i, at)| {
                    (b'a'..=b'z')
                        .filter(move |&d| !w[i].contains(&d) && count(d) < most)
                        .map(move |d| (i, at, d))
                })
                .collect()
        };
        if moves.is_empty() {
            return;
        }
        let (i, at, d) = moves[rng.random_range(0..moves.len())];
        words[i][at] = d;
    }
}

fn shuffle<T>(v: &mut [T], rng: &mut StdRng) {
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
        // The rule a reading was made by is in its tag: a class read before the `Near` reading
        // (by the match on every probe alone) is no reading of this one, and is not taken.
        let tag = crate::util::hash::sha256_hex(
            format!("{READING_RULE}:{}", probes.join(",")).as_bytes(),
        )[..16]
            .to_string();
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
                && r.c.iter().all(|&id| {
                    id & (BY_LETTER | NEAR) != BY_LETTER | NEAR
                        && is_composition(id & !(BY_LETTER | NEAR))
                })
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
        let mut progress = table.start();
        for probe in &self.probes {
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
                // A run that failed (an exit status, a crash, a limit) printed what no composition
                // prints, and the reading goes on: it is a mismatch where the probe counts and
                // nothing where it does not (a red-team helper's program exited wherever its
                // item's letter was missing, and a failure used to end the reading unmatched:
                // 114 of 114 one-`del` items through).
                Ran::Failed => outs.push(FAILED.to_string()),
                Ran::Stopped => return Ok(Reading::Stopped),
            }
            if !table.goes_on(&mut progress, &outs) {
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
        // (A class may name a composition matched on its letter's probes only.)
        a.keep(&[
            (f00d.clone(), vec![3, 40 | BY_LETTER, 41 | NEAR]),
            (beef, vec![]),
        ]);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&store)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"not json\n"))
            .expect("append");
        let mut again = Remembered::default();
        reader(7).load(&mut again);
        assert_eq!(
            again.classes.get(&f00d),
            Some(&vec![3, 40 | BY_LETTER, 41 | NEAR])
        );
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
             {{\"p\":\"{tag}\",\"s\":\"{sha}\",\"c\":[18]}}\n\
             {{\"p\":\"{tag}\",\"s\":\"{sha}\",\"c\":[{}]}}\n\
             {{\"p\":\"{tag}\",\"s\":\"{sha}\",\"c\":[{}]}}\n\
             {{\"p\":\"{tag}\",\"s\":\"{sha}\",\"c\":[{}]}}\n\
             {{\"p\":\"{tag}\",\"s\":\"{sha}\",\"c\":[{}]}}\n",
            BY_LETTER | 18,
            BY_LETTER | MULTI | 3,
            NEAR | 18,
            NEAR | BY_LETTER | 40,
        );
        std::fs::write(&store, lines).expect("write");
        let mut crafted = Remembered::default();
        reader(7).load(&mut crafted);
        assert!(crafted.classes.is_empty(), "{:?}", crafted.classes);
        // A reading made on the same probes before `Near` (matched on every probe alone) is no
        // reading now: its tag named the probes only.
        let before = &crate::util::hash::sha256_hex(a.probes.join(",").as_bytes())[..16];
        std::fs::write(
            &store,
            format!("{{\"p\":\"{before}\",\"s\":\"{sha}\",\"c\":[]}}\n"),
        )
        .expect("write");
        let mut old = Remembered::default();
        reader(7).load(&mut old);
        assert!(old.classes.is_empty(), "{:?}", old.classes);
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
                let long = || p.iter().filter(|w| w.len() >= SINGLE_MIN_LEN);
                let early = long().any(|w| w.chars().take(2).any(|c| c == l));
                let late = long().any(|w| w.chars().skip(5).any(|c| c == l));
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
    fn the_cover_probes_hold_every_letter_in_words_a_one_del_items_tests_could_be() {
        let mut rng = StdRng::seed_from_u64(5);
        for _ in 0..200 {
            let p = draw_probes(&mut rng);
            for l in 'a'..='z' {
                let long = |w: &&String| w.len() >= SINGLE_MIN_LEN;
                assert!(
                    p[..COVER].iter().filter(long).any(|w| w.contains(l)),
                    "{l} in {p:?}"
                );
            }
        }
    }

    #[test]
    fn every_letter_stands_in_a_few_probes_and_none_in_more_than_a_near_match_may_miss() {
        let mut rng = StdRng::seed_from_u64(8);
        let (mut least, mut most) = (PROBES, 0);
        for _ in 0..2000 {
            let p = draw_probes(&mut rng);
            for l in 'a'..='z' {
                let n = p.iter().filter(|w| w.contains(l)).count();
                assert!(LETTER_PROBES.contains(&n), "{l} in {n}: {p:?}");
                (least, most) = (least.min(n), most.max(n));
            }
        }
        assert_eq!((least, most), (4, PROBES - NEAR_AGREE));
    }

    /// A red-team helper's (stop 71): a program printing its item except on words whose letters
    /// are all distinct passes its three hidden tests a quarter of the time, and where nine
    /// probes or more are such words it is printed on fewer than `NEAR_AGREE`, so read as no
    /// composition. Probes once dealt the whole alphabet had that in about half the draws.
    #[test]
    fn probes_repeat_letters_about_as_often_as_the_tests_inputs() {
        const DRAWS: usize = 2000;
        let distinct = |w: &str| w.bytes().collect::<HashSet<u8>>().len() == w.len();
        let escapes = |counts: &[usize]| {
            counts.iter().filter(|&&n| n > PROBES - NEAR_AGREE).count() as f64 / DRAWS as f64
        };
        let mean = |counts: &[usize]| counts.iter().sum::<usize>() as f64 / DRAWS as f64;
        let mut rng = StdRng::seed_from_u64(6);
        let probes: Vec<usize> = (0..DRAWS)
            .map(|_| draw_probes(&mut rng).iter().filter(|w| distinct(w)).count())
            .collect();
        // Words as the tests draw them, of the probes' lengths.
        let random: Vec<usize> = (0..DRAWS)
            .map(|_| {
                LENGTHS
                    .iter()
                    .map(|&n| code_tasks::random_word(&mut rng, n))
                    .filter(|w| distinct(&String::from_utf8_lossy(w)))
                    .count()
            })
            .collect();
        let (p, r) = (escapes(&probes), escapes(&random));
        eprintln!(
            "all letters distinct: {:.2} probes a draw ({:.2} random words); {} or more in {p:.3} of draws ({r:.3})",
            mean(&probes),
            mean(&random),
            PROBES - NEAR_AGREE + 1
        );
        // Dealing the whole alphabet: 8.65 a draw, 0.51 of draws; random words 6.93 and 0.21.
        assert!(mean(&probes) < mean(&random) + 0.25, "{}", mean(&probes));
        assert!(p < r + 0.05, "{p} against {r}");
    }

    /// How many probes a program printing `outs` is read on.
    fn read_on(t: &Table, outs: &[String; PROBES]) -> usize {
        let mut p = t.start();
        (1..=PROBES)
            .find(|&n| !t.goes_on(&mut p, &outs[..n]))
            .unwrap_or(PROBES)
    }

    /// A red-team helper's: a program printing a one-`del` item's outputs only on inputs holding
    /// its letter (every test input of the item does; a probe may not) was no composition, read
    /// on all probes: 24 of 24 such items through. It is read on the probes holding the letter.
    #[test]
    fn a_one_del_item_printed_only_where_its_letter_is_is_matched() {
        let probes = draw_probes(&mut StdRng::seed_from_u64(7));
        let protected = [
            "ops:rev;del #",
            "ops:take 2;del #",
            "ops:del #;add #",
            "ops:dup;del #;up",
        ];
        let t = Table::build(&probes, &|k: &str| protected.contains(&k));
        let item_where = |spec: &str, holds: &dyn Fn(&str) -> bool| -> [String; PROBES] {
            std::array::from_fn(|i| {
                let w = &probes[i];
                if holds(w) {
                    code_tasks::run(&ops(spec), w)
                } else if w.len().is_multiple_of(2) {
                    format!("{w}zz")
                } else {
                    // (A failed run, elsewhere.)
                    FAILED.to_string()
                }
            })
        };
        for (spec, c, key) in [
            ("rev;del q", 'q', "ops:rev;del #"),
            ("take 2;del e", 'e', "ops:take 2;del #"),
            ("del x;add y", 'x', "ops:del #;add #"),
            ("dup;del k;up", 'k', "ops:dup;del #;up"),
        ] {
            for outs in [
                item_where(spec, &|w| w.contains(c)),
                item_where(spec, &|w| w.contains(c) && w.len() >= SINGLE_MIN_LEN),
            ] {
                assert_eq!(t.verdict(&t.class(&outs), None), [key], "{spec}");
                assert_eq!(read_on(&t, &outs), PROBES, "{spec}");
            }
        }
        // Honest programs are read until no protected composition could be printed on most
        // probes (`Near`: nine probes at least) and little more, and match nothing: `take 2`
        // prints what `take 2;del e` prints where `e` is not among the first two letters, and is
        // free and shorter.
        for spec in [
            "rev;up",
            "del q",
            "add y;rev",
            "sort;take 3",
            "rev;del q;rev",
        ] {
            let outs = outputs(&probes, spec);
            // (Or some probes past it, where a letter's words in the cover happen to read as an
            // item: `del j;add j` prints a word ending in `j` unchanged, and a program printing
            // words unchanged is read on until a later word holds `j`.)
            let n = read_on(&t, &outs);
            assert!(n <= PROBES - NEAR_AGREE + 5, "{spec}: {n}");
            assert!(t.verdict(&t.class(&outs), None).is_empty(), "{spec}");
        }
        assert!(
            t.verdict(&t.class(&outputs(&probes, "take 2")), None)
                .is_empty()
        );
        // Printing the item on the probes holding another letter is no match.
        let wrong = item_where("rev;del q", &|w| w.contains('j'));
        assert!(t.verdict(&t.class(&wrong), None).is_empty());
    }

    type Program = Box<dyn Fn(&str) -> String>;

    /// Honest programs that are no composition (118): lengths, slices, halves, vowels, the part
    /// after or before the first of each letter, ...
    fn free_form_programs() -> Vec<(String, Program)> {
        let mut programs: Vec<(String, Program)> = vec![
            ("its length".into(), Box::new(|w: &str| w.len().to_string())),
            (
                "every other letter".into(),
                Box::new(|w: &str| w.chars().step_by(2).collect()),
            ),
            (
                "the other letters".into(),
                Box::new(|w: &str| w.chars().skip(1).step_by(2).collect()),
            ),
            (
                "halves swapped".into(),
                Box::new(|w: &str| format!("{}{}", &w[w.len() / 2..], &w[..w.len() / 2])),
            ),
            (
                "turned by one".into(),
                Box::new(|w: &str| format!("{}{}", &w[1..], &w[..1])),
            ),
            (
                "first letter up".into(),
                Box::new(|w: &str| format!("{}{}", w[..1].to_uppercase(), &w[1..])),
            ),
            (
                "vowels".into(),
                Box::new(|w: &str| w.chars().filter(|c| "aeiou".contains(*c)).collect()),
            ),
            (
                "no vowels".into(),
                Box::new(|w: &str| w.chars().filter(|c| !"aeiou".contains(*c)).collect()),
            ),
            (
                "letters once".into(),
                Box::new(|w: &str| {
                    let mut seen = HashSet::new();
                    w.chars().filter(|c| seen.insert(*c)).collect()
                }),
            ),
            (
                "middle three".into(),
                Box::new(|w: &str| w[w.len() / 2 - 1..w.len() / 2 + 2].to_string()),
            ),
            (
                "last three".into(),
                Box::new(|w: &str| w[w.len() - 3..].to_string()),
            ),
            // (Two a red-team helper found refused by a first form of this reading.)
            (
                "its first half".into(),
                Box::new(|w: &str| w[..w.len() / 2].to_string()),
            ),
            (
                "its second half".into(),
                Box::new(|w: &str| w[w.len() / 2..].to_string()),
            ),
            (
                "without its last letter".into(),
                Box::new(|w: &str| w[..w.len() - 1].to_string()),
            ),
            // (Two a red-team helper found refused on random probes, stop 72.)
            (
                "the part before the first o, four letters of it".into(),
                Box::new(|w: &str| w.split('o').next().unwrap_or("").chars().take(4).collect()),
            ),
            (
                "the part before the first e, reversed".into(),
                Box::new(|w: &str| w.split('e').next().unwrap_or("").chars().rev().collect()),
            ),
        ];
        for c in b'a'..=b'z' {
            let c = char::from(c);
            programs.push((
                format!("the part after the first {c}"),
                Box::new(move |w: &str| w.split_once(c).map_or(String::new(), |(_, r)| r.into())),
            ));
            programs.push((
                format!("the part before the first {c}"),
                Box::new(move |w: &str| w.split_once(c).map_or(w.into(), |(l, _)| l.into())),
            ));
            programs.push((
                format!("its first {c} gone"),
                Box::new(move |w: &str| w.replacen(c, "", 1)),
            ));
            programs.push((
                format!("where {c} first is"),
                Box::new(move |w: &str| w.find(c).map_or("-1".into(), |i| i.to_string())),
            ));
        }
        programs
    }

    /// A study's splits' size of protected items (1,400 drawn as the test split is), their
    /// keys, and the table on probes of seed 11: built once for the tests that measure on it.
    struct SplitSized {
        probes: [String; PROBES],
        items: Vec<String>,
        held: HashSet<String>,
        table: Table,
    }

    fn split_sized() -> &'static SplitSized {
        static IT: OnceLock<SplitSized> = OnceLock::new();
        IT.get_or_init(|| {
            let probes = draw_probes(&mut StdRng::seed_from_u64(11));
            let items: Vec<String> = code_tasks::eval_stream(3, 1)
                .map(|it| it.prompt)
                .take(1400)
                .collect();
            let held: HashSet<String> = items
                .iter()
                .map(|p| format!("ops:{}", code_tasks::composition_key(p)))
                .collect();
            let table = Table::build(&probes, &|k: &str| held.contains(k));
            SplitSized {
                probes,
                items,
                held,
                table,
            }
        })
    }

    /// Honest programs on `SplitSized`: 1,000 random free compositions, how many are refused with
    /// the whole table and without the matches marked `mark` (and the reading that finds them),
    /// and the probes the first 200 are read on, both ways (each probe costs a pass over the
    /// compositions `Near` reads, in the unoptimised build tests run).
    fn honest_figures(mark: u32) -> (usize, usize, usize, usize) {
        let SplitSized {
            probes,
            held,
            table,
            ..
        } = split_sized();
        let t = table;
        let params = crate::model::data::CodeParams {
            style: crate::model::data::CodeStyle::Steps,
            max_ops: 3,
            n: 0,
            seed: 4,
        };
        let free: Vec<String> = code_tasks::code_stream(&params, 4)
            .map(|r| r.prompt)
            .filter(|p| !held.contains(&format!("ops:{}", code_tasks::composition_key(p))))
            .take(1000)
            .collect();
        let (mut refused, mut refused_before, mut runs, mut runs_before) = (0, 0, 0, 0);
        for (n, p) in free.iter().enumerate() {
            let spec = p.trim_start_matches("str ").trim_end_matches('>');
            let outs = outputs(probes, spec);
            refused += usize::from(matched_without(t, &outs, 0));
            refused_before += usize::from(matched_without(t, &outs, mark));
            if n < 200 {
                runs += read_on(t, &outs);
                let mut p = t.start();
                if mark == NEAR {
                    p.near = false;
                } else {
                    p.singles.iter_mut().for_each(|(_, alive)| *alive = false);
                }
                runs_before += (1..=PROBES)
                    .find(|&n| !t.goes_on(&mut p, &outs[..n]))
                    .unwrap_or(PROBES);
            }
        }
        (refused, refused_before, runs, runs_before)
    }

    /// Whether `outs` matches on `t` without the matches marked `mark` (0: with all).
    fn matched_without(t: &Table, outs: &[String; PROBES], mark: u32) -> bool {
        let mut class = t.class(outs);
        class.retain(|id| id & mark == 0);
        !t.verdict(&class, None).is_empty()
    }

    /// Reading one-`del` items on their letters' probes, against a study's splits' size of
    /// protected items: the items printed only where their letter is, matched; and free
    /// compositions refused and read on how many probes, with and without it.
    #[test]
    fn reading_one_del_items_on_their_letters_catches_them_and_costs_honest_programs_little() {
        let SplitSized {
            probes,
            items,
            table: t,
            ..
        } = split_sized();
        let matched = |outs: &[String; PROBES]| matched_without(t, outs, 0);
        let (refused, refused_before, runs, runs_before) = honest_figures(BY_LETTER);
        eprintln!(
            "1000 free compositions: {refused} refused ({refused_before} without); 200 of them: \
             {runs} probe runs ({runs_before} without)"
        );
        assert!(
            refused <= refused_before + 1000 / 200,
            "{refused} {refused_before}"
        );
        // Each one-`del` item, printed only on inputs holding its letter (anything elsewhere).
        let (mut singles, mut caught, mut caught_before) = (0, 0, 0);
        let mut rng = StdRng::seed_from_u64(12);
        for p in items {
            let spec = p.trim_start_matches("str ").trim_end_matches('>');
            let dels: Vec<char> = ops(spec)
                .iter()
                .filter_map(|o| if let Op::Del(c) = o { Some(*c) } else { None })
                .collect();
            let [c] = dels[..] else {
                continue;
            };
            // Left out: an item some of its own steps compute on words holding its letter (`up;del
            // f` is `up`, `pre h;del h` is `del h`): every program of them computes it.
            let all = ops(spec);
            let words: Vec<String> = (0..40)
                .map(|_| {
                    let mut w: Vec<u8> = (0..rng.random_range(6..=9usize))
                        .map(|_| b'a' + rng.random_range(0..26u8))
                        .collect();
                    w.insert(rng.random_range(0..=w.len()), c as u8);
                    String::from_utf8_lossy(&w).into_owned()
                })
                .collect();
            let reducible = (1..(1u32 << all.len()) - 1).any(|keep| {
                let fewer: Vec<Op> = (0..all.len())
                    .filter(|i| keep & 1 << i != 0)
                    .map(|i| all[i])
                    .collect();
                words
                    .iter()
                    .all(|w| code_tasks::run(&all, w) == code_tasks::run(&fewer, w))
            });
            if reducible {
                continue;
            }
            singles += 1;
            let outs: [String; PROBES] = std::array::from_fn(|i| {
                let w = &probes[i];
                if w.contains(c) && w.len() >= SINGLE_MIN_LEN {
                    code_tasks::run(&ops(spec), w)
                } else {
                    format!("{w}!")
                }
            });
            caught += usize::from(matched(&outs));
            caught_before += usize::from(matched_without(t, &outs, BY_LETTER));
        }
        eprintln!("{singles} one-del items: {caught} matched ({caught_before} without)");
        // (Not all: `take 1;del q` shows only on a probe of seven letters or more starting
        // with `q`, and twenty probes cannot start with every letter.)
        assert!(caught * 100 >= singles * 95, "{caught} of {singles}");
        assert!(runs < 2 * runs_before, "{runs} {runs_before}");
    }

    /// A red-team helper's: a program printing its item's outputs except on a rare kind of input
    /// (it crashed on nine-letter words with no repeated letter, as the cover words are and one
    /// random nine-letter word in four) differed from the item on a probe or two and was no
    /// composition: 323 of 378 items without a `del` through. Read on most probes, it is its item;
    /// honest programs, compositions or not, are read as before.
    #[test]
    fn an_item_printed_but_on_rare_inputs_is_read_on_most_probes_and_honest_programs_are_not() {
        let SplitSized {
            probes,
            items,
            table: t,
            ..
        } = split_sized();
        // Read on most probes, and on every probe alone (as before `Near`).
        let matched = |outs: &[String; PROBES]| matched_without(t, outs, 0);
        let matched_before = |outs: &[String; PROBES]| matched_without(t, outs, NEAR);
        let distinct = |w: &str| w.bytes().collect::<HashSet<u8>>().len() == w.len();
        // The attack, on each item that is a composition of the fewest operations computing it
        // (no program of it could be told from a simpler free one's) and that the match on
        // every probe catches: fail on the rare kind of input.
        type Kind<'a> = &'a dyn Fn(&str) -> bool;
        let rare: [(&str, Kind); 3] = [
            ("nine letters, none repeated", &|w: &str| {
                w.len() == 9 && distinct(w)
            }),
            ("seven letters or more, none repeated", &|w: &str| {
                w.len() >= 7 && distinct(w)
            }),
            ("a word ending in a vowel", &|w: &str| {
                w.ends_with(['a', 'e', 'i', 'o', 'u'])
            }),
        ];
        for (what, fails) in rare {
            let (mut tried, mut caught, mut caught_before, mut hit) = (0, 0, 0, 0);
            for p in items.iter().take(56) {
                let spec = p.trim_start_matches("str ").trim_end_matches('>');
                let honest = outputs(probes, spec);
                if !matched(&honest) {
                    continue;
                }
                tried += 1;
                let outs: [String; PROBES] = std::array::from_fn(|i| {
                    if fails(&probes[i]) {
                        FAILED.to_string()
                    } else {
                        honest[i].clone()
                    }
                });
                hit += probes.iter().filter(|w| fails(w)).count();
                caught += usize::from(matched(&outs));
                caught_before += usize::from(matched_before(&outs));
            }
            eprintln!(
                "failing on {what} ({} of {PROBES} probes): {caught} of {tried} items matched \
                 ({caught_before} on every probe alone)",
                hit / tried.max(1)
            );
            assert!(tried >= 40, "{tried}");
            if hit / tried <= PROBES - NEAR_AGREE {
                assert!(caught * 100 >= tried * 98, "{what}: {caught} of {tried}");
            }
        }
        // A red-team helper's (stop 71): an item of two `del`s is tested on words of eight letters
        // or more, eleven of the twenty probes, and a program printing it only there (`len(s)<8`:
        // fail) was no composition, read on all twenty: 22 of 25 such items through, all passing
        // their hidden tests. Each protected composition is read on the probes as long as its
        // tests' inputs.
        let (mut tried, mut caught, mut caught_before) = (0, 0, 0);
        for p in items {
            let spec = p.trim_start_matches("str ").trim_end_matches('>');
            let dels = ops(spec).iter().filter(|o| matches!(o, Op::Del(_))).count();
            let honest = outputs(probes, spec);
            if dels < 2 || !matched(&honest) {
                continue;
            }
            tried += 1;
            let outs: [String; PROBES] = std::array::from_fn(|i| {
                if probes[i].len() < 6 + dels {
                    FAILED.to_string()
                } else {
                    honest[i].clone()
                }
            });
            caught += usize::from(matched(&outs));
            caught_before += usize::from(matched_before(&outs));
        }
        eprintln!(
            "items of two `del`s or more failing on words shorter than their tests': {caught} of \
             {tried} matched ({caught_before} on every probe alone)"
        );
        // (Not all: where a letter of the item shows on none of its longer probes, a free
        // composition of fewer operations is printed there as often.)
        assert!(
            tried >= 10 && caught * 100 >= tried * 94,
            "{caught} of {tried}"
        );
        // A second helper's (stop 72): a one-`del` item printed except where it differs from its
        // steps without the `del` and its letter is among the first two places (a crash there),
        // the next attack on `NEAR_MARGIN`.
        let (mut tried, mut caught) = (0, 0);
        for p in items {
            let spec = p.trim_start_matches("str ").trim_end_matches('>');
            let steps = ops(spec);
            let Some(c) = steps.iter().find_map(|o| match o {
                Op::Del(c) => Some(*c),
                _ => None,
            }) else {
                continue;
            };
            let without: Vec<Op> = steps
                .iter()
                .copied()
                .filter(|o| !matches!(o, Op::Del(_)))
                .collect();
            if steps.iter().filter(|o| matches!(o, Op::Del(_))).count() != 1 || without.is_empty() {
                continue;
            }
            let honest = outputs(probes, spec);
            if !matched(&honest) {
                continue;
            }
            tried += 1;
            let outs: [String; PROBES] = std::array::from_fn(|i| {
                let w = &probes[i];
                if honest[i] != code_tasks::run(&without, w) && w[..2].contains(c) {
                    FAILED.to_string()
                } else {
                    honest[i].clone()
                }
            });
            caught += usize::from(matched(&outs));
        }
        eprintln!(
            "one-`del` items failing where they differ from their steps without it and the letter \
             is early: {caught} of {tried} matched"
        );
        // (Not all: where the item and its steps without the `del` differ on one probe more
        // than those, the steps are the simpler reading, `NEAR_MARGIN`: 262 of 284 on seed 11,
        // 268 with the word unchanged alone held to it, which refuses two more of the 120 honest
        // programs below.)
        assert!(
            tried >= 200 && caught * 100 >= tried * 90,
            "{caught} of {tried}"
        );
        // Honest: free compositions (1,000), and programs that are no composition, printing a
        // protected one's outputs on most probes only by chance.
        let (refused, refused_before, runs, runs_before) = honest_figures(NEAR);
        eprintln!(
            "1000 free compositions: {refused} refused ({refused_before} on every probe alone); \
             200 of them: {runs} probe runs ({runs_before})"
        );
        assert_eq!(refused, refused_before);
        let programs = free_form_programs();
        let mut refused_free_form = Vec::new();
        for (name, f) in &programs {
            let outs: [String; PROBES] = std::array::from_fn(|i| f(&probes[i]));
            if matched(&outs) && !matched_before(&outs) {
                refused_free_form.push(format!("{name}: {:?}", t.verdict(&t.class(&outs), None)));
            }
        }
        eprintln!(
            "{} programs that are no composition: refused on most probes only {:?}",
            programs.len(),
            refused_free_form
        );
        assert!(
            refused_free_form.len() * 20 <= programs.len(),
            "{refused_free_form:?}"
        );
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
        // One output off is no composition on every probe. Off on a probe without `q`, the
        // program is read on the probes holding `q` (`Single`): it prints the item there. Off on
        // one holding it, it prints the item on most probes (`Near`). Off on nine (one holding `q`),
        // it is no item.
        let holds_q = |w: &String| w.contains('q') && w.len() >= SINGLE_MIN_LEN;
        for (off, mark) in [
            (probes.iter().position(holds_q), NEAR),
            (probes.iter().position(|w| !holds_q(w)), BY_LETTER),
        ] {
            let off = off.expect("a probe holding q and one without");
            let mut mixed = outputs(&probes, "del q;add r");
            mixed[off] = outputs(&probes, "del q;add s")[off].clone();
            let class = t.class(&mixed);
            assert!(
                class.iter().all(|id| id & (BY_LETTER | NEAR) != 0),
                "{off}: {class:?}"
            );
            assert!(class.iter().any(|id| id & mark != 0), "{off}: {class:?}");
            assert_eq!(t.verdict(&class, None), ["ops:del #;add #"], "{off}");
        }
        let mut off = outputs(&probes, "del q;add r");
        let q_first = (0..PROBES).filter(|&k| holds_q(&probes[k]));
        for k in q_first
            .chain((0..PROBES).filter(|&k| !holds_q(&probes[k])))
            .take(PROBES - NEAR_AGREE + 1)
        {
            off[k] = FAILED.into();
        }
        assert_eq!(t.verdict(&t.class(&off), None), none);
        // A failed run on a probe is printing else there.
        let mut failing = outputs(&probes, "rev;up");
        failing[3] = FAILED.into();
        assert_eq!(t.verdict(&t.class(&failing), None), ["ops:rev;up"]);
        // A free composition printed off on one probe is no protected one.
        let mut near_free = outputs(&probes, "del q;rev");
        near_free[0] = FAILED.into();
        assert_eq!(t.verdict(&t.class(&near_free), None), none);
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
