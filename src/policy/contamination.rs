//! The contamination gate: rows are scanned against every protected eval set before they are
//! registered, and the union of datasets one run_sft trains on is scanned again before it runs.
//!
//! What is scanned is the canonical scan text (`canon`): the trainer's own input text
//! (`model::data::training_text`, prompt immediately followed by answer) after Unicode NFKC,
//! with invisible characters removed, digits of every script made ASCII, look-alikes folded,
//! case and whitespace folded. Each item is then matched three ways, plus a fourth where its task
//! names a normal form:
//!
//! - `normalized`: the share of the item's token n-grams (prompt + answer) found in the rows;
//! - `prompt`: the same for the item's prompt alone (the test problem with any answer);
//! - `skeleton`: n-grams with identifier-like words replaced by a placeholder (renamed code); a
//!   skeleton shorter than n (and at least `SKELETON_MIN_TOKENS`) is matched whole;
//! - `normal-form`: the task's own equivalence (`normal_form`), e.g. for arithmetic the operator
//!   and its operands as a multiset, numbers in any script or in words, filler words skipped.
//!
//! Windows run over each row and reach back through the rows before it (the stream's last tokens
//! followed by the next row), so an item split across rows is found, and one scan can run over several
//! datasets in the order a run_sft reads them (`scan_parts`). Items shorter than n tokens are
//! matched whole, at their own length. Items are indexed, rows streamed: memory is the eval sets',
//! not the dataset's.
//!
//! A `Hit` names the row (its dataset's position and row number), the share and the method —
//! never the text of the row or of the item: evidence must not print a protected item, and the
//! rows of a declared source or a mixture are protected items when they match.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use serde::Serialize;

use crate::config::NormalForm;
use crate::model::data::Row;
use crate::policy::canon::{self, canonical, form_tokens, tokens};
use crate::policy::normal_form;
use crate::policy::string_ops;

/// Scan settings (from `rsim.toml` `[policy]`).
#[derive(Debug, Clone, Copy)]
pub struct ScanConfig {
    /// n-gram length in tokens; items shorter than this are matched whole.
    pub ngram: usize,
    /// An eval item is contaminated when at least this share of its n-grams occurs in the dataset.
    pub threshold: f64,
}

/// One piece of evidence: where a protected eval item is reproduced. No text of either side.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hit {
    /// Task and split of the protected item (never its text).
    pub task: String,
    pub split: String,
    /// Position of the dataset in the scanned list (0 for a single dataset) and the 0-based row
    /// in it where the match was completed.
    pub part: usize,
    pub row: usize,
    /// Share of the item's n-grams (or normal-form keys) found.
    pub overlap: f64,
    /// Which method matched: `normalized`, `prompt`, `skeleton`, `normal-form`, `behaviour`
    /// (a program run, `ProgramReader`), or `unread` (a program the gate could not read).
    pub how: &'static str,
    /// Why an `unread` row could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Words that carry a program's structure; every other word counts as a renameable identifier.
const KEYWORDS: &[&str] = &[
    "def", "return", "for", "in", "if", "elif", "else", "while", "class", "import", "from", "as",
    "with", "try", "except", "finally", "raise", "yield", "lambda", "pass", "break", "continue",
    "and", "or", "not", "is", "true", "false", "none", "null", "function", "let", "const", "var",
    "fn", "pub", "struct", "impl", "match", "int", "float", "str", "bool", "void", "new", "this",
    "self", "print", "len", "range",
];

/// The skeleton of a canonical text: punctuation kept as tokens, numbers and keywords kept, every
/// other word replaced by `#` — so renaming identifiers does not change it.
pub fn skeleton(canonical_text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let push_word = |cur: &mut String, out: &mut Vec<String>| {
        if cur.is_empty() {
            return;
        }
        let keep = cur.chars().all(|c| c.is_ascii_digit()) || KEYWORDS.contains(&cur.as_str());
        out.push(if keep { cur.clone() } else { "#".to_string() });
        cur.clear();
    };
    for c in canonical_text.chars() {
        if c.is_alphanumeric() || c == '_' {
            cur.push(c);
        } else {
            push_word(&mut cur, &mut out);
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
        }
    }
    push_word(&mut cur, &mut out);
    out
}

/// The fewest tokens a skeleton shorter than the window needs to be matched whole.
const SKELETON_MIN_TOKENS: usize = 8;

/// A skeleton says something only when it has structure: enough tokens (the window's length, or
/// `SKELETON_MIN_TOKENS` where the window is longer: such an item is matched whole, like a short
/// item's text), and enough of them not placeholders.
fn structured(skel: &[String], n: usize) -> bool {
    let kept = skel.iter().filter(|t| t.as_str() != "#").count();
    skel.len() >= n.min(SKELETON_MIN_TOKENS)
        && kept * 2 >= skel.len()
        && skel.iter().any(|t| t == "#")
}

fn token_ids(toks: &[String]) -> Vec<u64> {
    toks.iter().map(|t| token_id(t)).collect()
}

fn token_id(t: &str) -> u64 {
    let mut s = DefaultHasher::new();
    t.hash(&mut s);
    s.finish()
}

/// A window's hash: a polynomial over the token hashes (the token hashes are SipHash already),
/// its length, then a final mix. Polynomial so that a scan gets every window of a row from the
/// row's prefix sums in constant time a window (`Prefix`): rows are windowed at every short
/// item's length, which made hashing each window afresh the gate's whole cost.
fn hash(ids: &[u64]) -> u64 {
    let p = ids
        .iter()
        .fold(0u64, |h, &x| h.wrapping_mul(POLY_BASE).wrapping_add(x));
    finish(p, ids.len())
}

/// The polynomial's base (odd, so its powers never vanish modulo 2^64).
const POLY_BASE: u64 = 0x9e37_79b9_7f4a_7c15;

fn finish(poly: u64, len: usize) -> u64 {
    let mut h = poly ^ (len as u64).wrapping_mul(0xcbf2_9ce4_8422_2325);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// A token list's polynomial prefix sums and the base's powers: `window(a, l)` is
/// `hash(&ids[a..a + l])`, in constant time.
struct Prefix {
    sums: Vec<u64>,
    pows: Vec<u64>,
}

impl Prefix {
    fn new(ids: &[u64]) -> Prefix {
        let mut sums = Vec::with_capacity(ids.len() + 1);
        let mut pows = Vec::with_capacity(ids.len() + 1);
        let (mut h, mut p) = (0u64, 1u64);
        sums.push(h);
        pows.push(p);
        for &x in ids {
            h = h.wrapping_mul(POLY_BASE).wrapping_add(x);
            p = p.wrapping_mul(POLY_BASE);
            sums.push(h);
            pows.push(p);
        }
        Prefix { sums, pows }
    }

    fn window(&self, a: usize, l: usize) -> u64 {
        finish(
            self.sums[a + l].wrapping_sub(self.sums[a].wrapping_mul(self.pows[l])),
            l,
        )
    }
}

/// Maps keyed by gram hashes, which are mixed already: hashed again with a fast hash, not SipHash.
type GramMap<V> = HashMap<u64, V, foldhash::fast::RandomState>;

/// The grams a scan looks for. Every window of every row is looked up, and nearly none is
/// wanted: a bitmap indexed by the gram's low bits answers most lookups before the set is asked.
#[derive(Default)]
struct GramSet {
    set: std::collections::HashSet<u64, foldhash::fast::RandomState>,
    bits: Vec<u64>,
}

/// The bitmap's size: 2^20 bits (128 KiB), a fraction of a percent full for thousands of items.
const GRAM_BITS: u32 = 20;

impl GramSet {
    fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    fn slot(h: u64) -> (usize, u64) {
        let i = h & ((1 << GRAM_BITS) - 1);
        ((i >> 6) as usize, 1 << (i & 63))
    }

    fn contains(&self, h: &u64) -> bool {
        let (w, b) = GramSet::slot(*h);
        self.bits.get(w).is_some_and(|x| x & b != 0) && self.set.contains(h)
    }
}

impl FromIterator<u64> for GramSet {
    fn from_iter<I: IntoIterator<Item = u64>>(it: I) -> GramSet {
        let mut g = GramSet {
            set: Default::default(),
            bits: vec![0; 1 << (GRAM_BITS - 6)],
        };
        for h in it {
            let (w, b) = GramSet::slot(h);
            g.bits[w] |= b;
            g.set.insert(h);
        }
        g
    }
}

/// The n-grams of a token list; a list shorter than `n` is one gram (matched whole).
fn grams(ids: &[u64], n: usize) -> Vec<u64> {
    if ids.is_empty() {
        return Vec::new();
    }
    if ids.len() <= n {
        return vec![hash(ids)];
    }
    let mut g: Vec<u64> = ids.windows(n).map(hash).collect();
    g.sort_unstable();
    g.dedup();
    g
}

/// One protected item, prepared: normalized grams of its training text and of its prompt,
/// skeleton grams (empty when the item has too little structure for a skeleton to mean anything),
/// and its normal-form keys (empty without a form) and relation key.
struct Item {
    full: Vec<u64>,
    prompt: Vec<u64>,
    skeleton: Vec<u64>,
    keys: Vec<String>,
    /// Its relation key (`normal_form::relation`): found alone, it reproduces the item.
    relation: Option<String>,
}

/// A protected eval set prepared for scanning.
pub struct EvalSet {
    pub task: String,
    pub split: String,
    form: Option<NormalForm>,
    items: Vec<Item>,
    /// The items' prompts (a generator skips the problems they pose, `os::data`).
    prompts: Vec<String>,
    /// Token counts of short items (rows are windowed at these lengths too).
    short_lens: Vec<usize>,
    /// Token counts of skeletons shorter than the window (matched whole, at their length).
    skel_lens: Vec<usize>,
}

impl EvalSet {
    pub fn new(
        task: &str,
        split: &str,
        items_in: &[Row],
        cfg: ScanConfig,
        form: Option<NormalForm>,
    ) -> EvalSet {
        let n = cfg.ngram;
        let mut short_lens = Vec::new();
        let mut skel_lens = Vec::new();
        let items = items_in
            .iter()
            .map(|r| {
                let text = canon::row_text(r);
                let full_t = tokens(&text);
                let prompt_t = tokens(&canonical(&r.prompt));
                let skel = skeleton(&text);
                for l in [full_t.len(), prompt_t.len()] {
                    if l > 0 && l < n {
                        short_lens.push(l);
                    }
                }
                let keys = form
                    .map(|f| normal_form::item_keys(f, &r.prompt, &text))
                    .unwrap_or_default();
                let relation = form.and_then(|f| normal_form::relation(f, &r.prompt, &r.answer));
                Item {
                    full: grams(&token_ids(&full_t), n),
                    prompt: grams(&token_ids(&prompt_t), n),
                    skeleton: if structured(&skel, n) {
                        if skel.len() < n {
                            skel_lens.push(skel.len());
                        }
                        grams(&token_ids(&skel), n)
                    } else {
                        Vec::new()
                    },
                    keys,
                    relation,
                }
            })
            .collect();
        short_lens.sort_unstable();
        short_lens.dedup();
        skel_lens.sort_unstable();
        skel_lens.dedup();
        EvalSet {
            task: task.into(),
            split: split.into(),
            form,
            items,
            prompts: items_in.iter().map(|r| r.prompt.clone()).collect(),
            short_lens,
            skel_lens,
        }
    }

    /// The prompts of the set's items.
    pub fn prompts(&self) -> impl Iterator<Item = &str> {
        self.prompts.iter().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// Where a gram or key was first seen: (dataset position, row).
pub type At = (usize, usize);

/// The protected sets, indexed for streaming rows past them.
pub struct Scanner<'a> {
    sets: &'a [EvalSet],
    cfg: ScanConfig,
    ix: std::sync::Arc<ScanIndex>,
    /// The `string_ops` form's second reading, of programs by running them
    /// (`train::behaviour`); without one, programs are read symbolically only.
    programs: Option<std::sync::Arc<dyn ProgramReader>>,
}

/// A row a `ProgramReader` could not read, and why: a scan refuses it.
#[derive(Debug, Clone, PartialEq)]
pub struct Unread {
    pub at: At,
    pub why: String,
}

/// Reads the programs rows hold by running them (`train::behaviour::Reader`, which the OS
/// gives a scan: the policy itself runs nothing).
pub trait ProgramReader: Send + Sync {
    /// The protected keys (those `wanted` says) that the programs of `parts` compute, each with
    /// the first row computing it, leaving out the rows at `skip` (matched already); `read_as`
    /// holds what each row reads as symbolically (`string_ops::Programs::printed`). Or the first
    /// row left unread.
    fn read(
        &self,
        parts: &[&[Row]],
        skip: &HashSet<At>,
        read_as: &HashMap<At, HashSet<String>>,
        wanted: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<Vec<(String, At)>, Unread>;
}

/// What a scan looks up, built from the eval sets once: a study keeps it for as long as its
/// eval sets and scan settings are unchanged, so a registration does not rebuild it.
pub struct ScanIndex {
    /// Window lengths of the normalized pass: n and every short item's length.
    lens: Vec<usize>,
    /// Window lengths of the skeleton pass: n and every skeleton shorter than it.
    skel_lens: Vec<usize>,
    norm: GramSet,
    skel: GramSet,
    keys: HashSet<String>,
    /// The digits form's keys among `keys`, packed (`normal_form::digits::packed`): a scan
    /// names only the multisets of these.
    digit_keys: HashSet<u64>,
    forms: Vec<NormalForm>,
}

impl normal_form::Wanted for ScanIndex {
    fn key(&self, key: &str) -> bool {
        self.keys.contains(key)
    }
    fn digits(&self, packed: u64) -> bool {
        self.digit_keys.contains(&packed)
    }
}

impl ScanIndex {
    pub fn new(sets: &[EvalSet], cfg: ScanConfig) -> ScanIndex {
        // Window lengths: n, and every shorter item's own length (matched whole).
        let windows = |short: fn(&EvalSet) -> &[usize]| {
            let mut l: Vec<usize> = sets.iter().flat_map(|s| short(s).iter().copied()).collect();
            l.push(cfg.ngram);
            l.sort_unstable();
            l.dedup();
            l
        };
        let lens = windows(|s| &s.short_lens);
        let skel_lens = windows(|s| &s.skel_lens);
        let mut forms: Vec<NormalForm> = sets.iter().filter_map(|s| s.form).collect();
        forms.dedup();
        let items = || sets.iter().flat_map(|s| s.items.iter());
        let keys: HashSet<String> = items()
            .flat_map(|i| i.keys.iter().chain(&i.relation).cloned())
            .collect();
        ScanIndex {
            lens,
            skel_lens,
            norm: items()
                .flat_map(|i| i.full.iter().chain(&i.prompt).copied())
                .collect(),
            skel: items().flat_map(|i| i.skeleton.iter().copied()).collect(),
            digit_keys: keys
                .iter()
                .filter_map(|k| normal_form::digits::packed(k))
                .collect(),
            keys,
            forms,
        }
    }
}

/// What one pass over rows found: the first place each wanted gram or key occurred.
#[derive(Default)]
struct Found {
    norm: GramMap<At>,
    skel: GramMap<At>,
    keys: HashMap<String, At>,
    /// Rows in which the `string_ops` form's symbolic reading found a protected key (the
    /// behavioural reading leaves them out: they are matched already).
    keyed: HashSet<At>,
    /// Where a key was found by running a program rather than reading it.
    by_running: HashSet<String>,
    /// The compositions each row's programs read as, symbolically (`Programs::printed`).
    read_as: HashMap<At, HashSet<String>>,
}

/// The previous row's tokens in each reading.
type Tails = [Tail; canon::READINGS];

/// What a reading carries from the rows before, for windows and keys across rows: the stream's
/// last tokens (as many as the longest window reaches back), and the normal forms' `Carry`.
#[derive(Default, Clone)]
struct Tail {
    carry: normal_form::Carry,
    /// The `string_ops` form's reading of the stream's programs (their variables).
    programs: string_ops::Programs,
    ids: Vec<u64>,
    skel: Vec<u64>,
}

/// The rows a generator has kept so far, as a scan carries them (`Scanner::accepts`).
#[derive(Default)]
pub struct Drawn {
    tails: Tails,
    rows: usize,
}

/// The stream's last `keep` tokens after `cur`: `cur`'s, and before them the stream's before it
/// (`prev`), so a window reaches through rows shorter than it.
fn carried(prev: &[u64], cur: Vec<u64>, keep: usize) -> Vec<u64> {
    if cur.len() >= keep {
        return cur[cur.len() - keep..].to_vec();
    }
    let mut out = prev[prev.len().saturating_sub(keep - cur.len())..].to_vec();
    out.extend(cur);
    out
}

impl<'a> Scanner<'a> {
    pub fn new(sets: &'a [EvalSet], cfg: ScanConfig) -> Scanner<'a> {
        Scanner::with_index(sets, cfg, std::sync::Arc::new(ScanIndex::new(sets, cfg)))
    }

    /// A scanner over `sets` with their index built before (`ScanIndex::new` of the same sets
    /// and settings).
    pub fn with_index(
        sets: &'a [EvalSet],
        cfg: ScanConfig,
        ix: std::sync::Arc<ScanIndex>,
    ) -> Scanner<'a> {
        Scanner {
            sets,
            cfg,
            ix,
            programs: None,
        }
    }

    /// Read the programs of a scan's rows by running them too, with `reader`.
    pub fn running_programs(mut self, reader: std::sync::Arc<dyn ProgramReader>) -> Scanner<'a> {
        self.programs = Some(reader);
        self
    }

    /// Look at one row (and the pair it forms with the previous one, if any), in each reading.
    fn visit(&self, row: &Row, at: At, tails: &mut Tails, found: &mut Found) {
        let readings = canon::row_readings(row);
        for (k, reading) in readings.iter().enumerate() {
            match reading {
                canon::Reading::Text(text) => self.visit_text(text, at, &mut tails[k], found),
                // The same text as an earlier reading (j < k): the same tokens end the pair.
                canon::Reading::Same(j) => tails[k] = tails[*j].clone(),
            }
        }
    }

    fn visit_text(&self, text: &str, at: At, tail: &mut Tail, found: &mut Found) {
        // One tokenization: with the marks only a form reads (brackets, `^`, decimal points)
        // when the study names a normal form (its keys read them, the n-grams do not), without
        // when it does not.
        let (ids, toks) = if self.ix.keys.is_empty() {
            (token_ids(&tokens(text)), Vec::new())
        } else {
            let toks = form_tokens(text, self.ix.forms.iter().any(|f| f.reads_counts()));
            let ids = toks
                .iter()
                .filter(|t| !canon::is_form_only(t))
                .map(|t| token_id(t))
                .collect();
            (ids, toks)
        };
        let skel = if self.ix.skel.is_empty() {
            Vec::new()
        } else {
            token_ids(&skeleton(text))
        };
        let n = self.cfg.ngram;
        let longest = self.ix.lens.last().copied().unwrap_or(n).max(n);
        // Windows of length l that end in this row: over the previous row's last l-1 tokens and
        // this row's.
        let scan =
            |wanted: &GramSet, map: &mut GramMap<At>, prev: &[u64], cur: &[u64], lens: &[usize]| {
                if wanted.is_empty() {
                    return;
                }
                let keep = prev.len().min(longest.saturating_sub(1));
                let mut joined: Vec<u64> = prev[prev.len() - keep..].to_vec();
                joined.extend_from_slice(cur);
                let prefix = Prefix::new(&joined);
                for &l in lens {
                    if l == 0 || joined.len() < l {
                        continue;
                    }
                    // first window start that still reaches into this row
                    let start = keep.saturating_sub(l - 1);
                    for a in start..=joined.len() - l {
                        let h = prefix.window(a, l);
                        if wanted.contains(&h) {
                            map.entry(h).or_insert(at);
                        }
                    }
                }
            };
        scan(
            &self.ix.norm,
            &mut found.norm,
            &tail.ids,
            &ids,
            &self.ix.lens,
        );
        scan(
            &self.ix.skel,
            &mut found.skel,
            &tail.skel,
            &skel,
            &self.ix.skel_lens,
        );
        if !self.ix.keys.is_empty() {
            // The rows before, read with this one as one stream (`normal_form::Carry`).
            let toks: std::sync::Arc<[String]> = toks.into();
            for &f in &self.ix.forms {
                for k in tail.carry.keys(f, &toks, &*self.ix) {
                    found.keys.entry(k).or_insert(at);
                }
            }
            tail.carry.push(toks, &self.ix.forms);
            if tail.carry.is_full() {
                self.read_to_end(tail, at, found);
                tail.carry.let_go();
            }
            if self.ix.forms.contains(&NormalForm::StringOps) {
                // Read from the text: its brackets, colons and quotes are the operations.
                let mut keys = string_ops::spec_keys(text);
                // What the row reads as: the compositions its specification names and its
                // programs print (an honest `str up;rev>` row computes what a protected `rev;up`
                // computes, in whatever spelling).
                // Kept only where programs are run (`ProgramReader`): a generator's draws and the
                // split checks read symbolically and pay nothing for it.
                let mut read_as = if self.programs.is_some() {
                    keys.clone()
                } else {
                    Vec::new()
                };
                keys.extend(tail.programs.read(text));
                let printed = std::mem::take(&mut tail.programs.printed);
                if self.programs.is_some() {
                    read_as.extend(printed);
                    if !read_as.is_empty() {
                        found.read_as.entry(at).or_default().extend(read_as);
                    }
                }
                for k in keys {
                    if self.ix.keys.contains(&k) {
                        found.keyed.insert(at);
                        found.keys.entry(k).or_insert(at);
                    }
                }
            }
        }
        let keep = longest.saturating_sub(1);
        tail.ids = carried(&tail.ids, ids, keep);
        tail.skel = carried(&tail.skel, skel, keep);
    }

    /// What the stream's end leaves unread in each reading: its open segments (`Carry`).
    fn finish(&self, tails: &Tails, at: At, found: &mut Found) {
        for tail in tails {
            self.read_to_end(tail, at, found);
        }
    }

    fn read_to_end(&self, tail: &Tail, at: At, found: &mut Found) {
        for &f in &self.ix.forms {
            for k in tail.carry.keys_at_end(f, &*self.ix) {
                found.keys.entry(k).or_insert(at);
            }
        }
    }

    /// The hits of what was found: one per contaminated item, at most `limit`.
    fn judge(&self, found: &Found, limit: usize) -> Vec<Hit> {
        self.judge_items(found, limit)
            .into_iter()
            .map(|(_, hit)| hit)
            .collect()
    }

    /// `judge`, with each hit's item as (set, item) positions.
    fn judge_items(&self, found: &Found, limit: usize) -> Vec<((usize, usize), Hit)> {
        let mut hits = Vec::new();
        // Test and sealed items first: the limit keeps the hits that decide the rule (a dataset
        // of test items whose first hits in the sets' order were dev items' was refused as dev
        // contamination, its test items uncounted).
        let mut order: Vec<usize> = (0..self.sets.len()).collect();
        order.sort_by_key(|&si| is_dev_split(&self.sets[si].split));
        for si in order {
            let set = &self.sets[si];
            for (ii, item) in set.items.iter().enumerate() {
                if hits.len() >= limit {
                    return hits;
                }
                let checks: [(&[u64], &GramMap<At>, &'static str); 3] = [
                    (&item.full, &found.norm, "normalized"),
                    (&item.prompt, &found.norm, "prompt"),
                    (&item.skeleton, &found.skel, "skeleton"),
                ];
                let mut hit = None;
                for (grams, table, how) in checks {
                    if grams.is_empty() {
                        continue;
                    }
                    let at: Vec<At> = grams.iter().filter_map(|g| table.get(g).copied()).collect();
                    let overlap = at.len() as f64 / grams.len() as f64;
                    if overlap >= self.cfg.threshold {
                        hit = Some((at.into_iter().max(), overlap, how));
                        break;
                    }
                }
                if hit.is_none() && !item.keys.is_empty() {
                    let at: Vec<At> = item
                        .keys
                        .iter()
                        .filter_map(|k| found.keys.get(k).copied())
                        .collect();
                    if at.len() == item.keys.len() {
                        let ran = item.keys.iter().any(|k| found.by_running.contains(k));
                        let how = if ran { "behaviour" } else { "normal-form" };
                        hit = Some((at.into_iter().max(), 1.0, how));
                    }
                }
                if hit.is_none()
                    && let Some(at) = item.relation.as_ref().and_then(|k| found.keys.get(k))
                {
                    hit = Some((Some(*at), 1.0, "normal-form"));
                }
                if let Some((at, overlap, how)) = hit {
                    let (part, row) = at.unwrap_or((0, 0));
                    hits.push((
                        (si, ii),
                        Hit {
                            task: set.task.clone(),
                            split: set.split.clone(),
                            part,
                            row,
                            overlap: (overlap * 1000.0).round() / 1000.0,
                            how,
                            detail: None,
                        },
                    ));
                }
            }
        }
        hits
    }

    /// Scan datasets as one sequence, in order (the union a run_sft trains on): each row, each
    /// window reaching back through the rows, and the share of every item's grams over all of them.
    pub fn scan_parts(&self, parts: &[&[Row]], limit: usize) -> Vec<Hit> {
        let mut found = Found::default();
        let mut tails = Tails::default();
        let mut last = None;
        for (p, rows) in parts.iter().enumerate() {
            for (i, r) in rows.iter().enumerate() {
                self.visit(r, (p, i), &mut tails, &mut found);
                last = Some((p, i));
            }
        }
        if let Some(at) = last {
            self.finish(&tails, at, &mut found);
        }
        let unread = self.run_programs(parts, &mut found).err();
        let mut hits = self.judge(&found, limit);
        if let Some(u) = unread
            && hits.len() < limit
        {
            hits.push(self.unread_hit(u));
        }
        hits
    }

    /// The `string_ops` form's second reading: the programs of rows the first did not match,
    /// run on probe inputs (`ProgramReader`).
    fn run_programs(&self, parts: &[&[Row]], found: &mut Found) -> Result<(), Unread> {
        let Some(reader) = self.programs.as_ref() else {
            return Ok(());
        };
        if !self.ix.forms.contains(&NormalForm::StringOps) {
            return Ok(());
        }
        let wanted = |k: &str| self.ix.keys.contains(k);
        let ran = reader.read(parts, &found.keyed, &found.read_as, &wanted)?;
        for (k, at) in ran {
            let first = found.keys.entry(k.clone()).or_insert(at);
            if at < *first {
                *first = at;
            }
            found.by_running.insert(k);
        }
        Ok(())
    }

    /// The evidence a row the gate could not read gives: refused, under the first protected
    /// set the form reads (a test split before a dev one).
    fn unread_hit(&self, u: Unread) -> Hit {
        let set = self
            .sets
            .iter()
            .filter(|s| s.form == Some(NormalForm::StringOps))
            .min_by_key(|s| is_dev_split(&s.split));
        Hit {
            task: set.map(|s| s.task.clone()).unwrap_or_default(),
            split: set
                .map(|s| s.split.clone())
                .unwrap_or_else(|| "test".into()),
            part: u.at.0,
            row: u.at.1,
            overlap: 0.0,
            how: "unread",
            detail: Some(u.why),
        }
    }

    /// Whether one row on its own reproduces a protected item (the generator leaves such rows
    /// out). The same matching as a scan of a one-row dataset.
    pub fn row_reproduces(&self, row: &Row) -> bool {
        let mut found = Found::default();
        self.visit(row, (0, 0), &mut Tails::default(), &mut found);
        if found.norm.is_empty() && found.skel.is_empty() && found.keys.is_empty() {
            return false;
        }
        !self.judge(&found, 1).is_empty()
    }

    /// Whether `row`, read after the rows `drawn` holds (each of which passed), reproduces no
    /// protected item — on its own, or across rows, as a scan of the dataset reads it — and if
    /// so, `drawn` takes it. The generator draws through this, so what it draws passes the scan
    /// its dataset gets, not only row by row.
    pub fn accepts(&self, drawn: &mut Drawn, row: &Row) -> bool {
        let mut found = Found::default();
        let mut tails = drawn.tails.clone();
        self.visit(row, (0, drawn.rows), &mut tails, &mut found);
        let clean = found.norm.is_empty() && found.skel.is_empty() && found.keys.is_empty()
            || self.judge(&found, 1).is_empty();
        if clean {
            drawn.tails = tails;
            drawn.rows += 1;
        }
        clean
    }

    /// The protected items (as set and item positions) that one row on its own reproduces.
    pub fn items_reproduced_by(&self, row: &Row) -> Vec<(usize, usize)> {
        let mut found = Found::default();
        self.visit(row, (0, 0), &mut Tails::default(), &mut found);
        if found.norm.is_empty() && found.skel.is_empty() && found.keys.is_empty() {
            return Vec::new();
        }
        self.judge_items(&found, usize::MAX)
            .into_iter()
            .map(|(at, _)| at)
            .collect()
    }
}

/// Whether a protected split is dev evidence (the dev split or its hidden twin) rather than the
/// test split or the tripwire's sealed split.
pub fn is_dev_split(split: &str) -> bool {
    matches!(split, "dev" | "dev_twin")
}

/// How many items of `b` are, in the gate's sense, items of `a`: each of `b`'s items is read as a
/// row and judged alone against `a` (canonical text, n-grams, the prompt, the skeleton, the
/// task's normal form) — the one notion of "the same item" the gate, the split checks at study
/// creation and the example generator share.
pub fn shared_items(a: &[Row], b: &[Row], cfg: ScanConfig, form: Option<NormalForm>) -> usize {
    let set = [EvalSet::new("", "", a, cfg, form)];
    let scanner = Scanner::new(&set, cfg);
    b.iter().filter(|r| scanner.row_reproduces(r)).count()
}

/// Scan one dataset's rows against protected eval sets; one hit per contaminated item (at most
/// `limit`).
pub fn scan(rows: &[Row], sets: &[EvalSet], cfg: ScanConfig, limit: usize) -> Vec<Hit> {
    Scanner::new(sets, cfg).scan_parts(&[rows], limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_from_prefix_sums_is_the_window_hashed_afresh() {
        let ids = token_ids(&tokens(
            "def f(s): return s[::-1].upper() + str(len(s)) # 12 x",
        ));
        let prefix = Prefix::new(&ids);
        for l in 1..=ids.len() {
            for a in 0..=ids.len() - l {
                assert_eq!(prefix.window(a, l), hash(&ids[a..a + l]), "window {a}+{l}");
            }
        }
        // Same tokens at another length, or in another order, hash apart.
        assert_ne!(hash(&ids[..3]), hash(&ids[..4]));
        assert_ne!(hash(&[ids[0], ids[1]]), hash(&[ids[1], ids[0]]));
    }

    fn row(p: &str, a: &str) -> Row {
        Row {
            prompt: p.into(),
            answer: a.into(),
        }
    }

    const CFG: ScanConfig = ScanConfig {
        ngram: 8,
        threshold: 0.5,
    };

    fn hits(rows: &[Row], set: &EvalSet) -> Vec<Hit> {
        scan(rows, std::slice::from_ref(set), CFG, 10)
    }

    #[test]
    fn a_skeleton_shorter_than_the_window_is_matched_whole() {
        // A window longer than the item (as a code study sets it, to match items whole): the
        // renamed program is still its item, and a program of another shape is not.
        let cfg = ScanConfig {
            ngram: 80,
            threshold: 0.5,
        };
        let item = row("f>", "s=input();s=s[::-1];s=s[:3];print(s)");
        let set = EvalSet::new("t", "test", std::slice::from_ref(&item), cfg, None);
        let scan = |r: Row| super::scan(&[r], std::slice::from_ref(&set), cfg, 10);
        let renamed = scan(row("g>", "q=input();q=q[::-1];q=q[:3];print(q)"));
        assert_eq!(renamed.len(), 1, "renamed program");
        assert_eq!(renamed[0].how, "skeleton");
        assert!(scan(row("g>", "q=input();q=q[::-1];q=q[4:];print(q)")).is_empty());
        assert!(scan(row("g>", "q=input();q=q[:3];q=q[::-1];print(q)")).is_empty());
    }

    #[test]
    fn a_renamed_item_split_across_two_rows_is_still_matched_whole() {
        // The attack on whole-item matching: the specification ends one row, the renamed
        // program starts the next, so neither row holds the item's skeleton alone.
        let cfg = ScanConfig {
            ngram: 80,
            threshold: 0.5,
        };
        let item = row(
            "str del a;take 3>",
            "s=input();s=s.replace('a','');s=s[:3];print(s)",
        );
        let set = EvalSet::new("t", "test", std::slice::from_ref(&item), cfg, None);
        let rows = [
            row("notes: ", "str op b;op 3>"),
            row("q=input();q=q.replace('b','');q=q[:3];print(q)", ""),
        ];
        let hits = super::scan(&rows, std::slice::from_ref(&set), cfg, 10);
        assert_eq!(hits.len(), 1, "split across rows");
        assert_eq!((hits[0].how, hits[0].row), ("skeleton", 1));
    }

    #[test]
    fn normalization_ignores_case_whitespace_and_punctuation() {
        let t = |s: &str| tokens(&canonical(s));
        assert_eq!(t("Hello,  World!"), t("hello world"));
        assert_eq!(t("12+34="), vec!["12", "+", "34", "="]);
        assert_eq!(t("12 + 34 ="), t("12+34="));
    }

    #[test]
    fn verbatim_and_disguised_items_are_caught() {
        let eval = vec![
            row(
                "def has_close_elements(numbers, threshold):\n    for idx, elem in enumerate(numbers):",
                "return True",
            ),
            row("12+34=", "46"),
        ];
        let set = EvalSet::new("t", "test", &eval, CFG, None);
        // verbatim
        assert_eq!(hits(&[eval[1].clone()], &set).len(), 1);
        // whitespace / case / punctuation
        assert_eq!(hits(&[row("12 + 34 =", " 46 ")], &set).len(), 1);
        let h = hits(
            &[row(
                "DEF HAS_CLOSE_ELEMENTS( numbers ,threshold ) :  for idx,elem in enumerate( numbers ):",
                "return true",
            )],
            &set,
        );
        assert_eq!(h.len(), 1);
        // renamed identifiers
        let h = hits(
            &[row(
                "def f(xs, eps):\n    for i, e in enumerate(xs):",
                "return True",
            )],
            &set,
        );
        assert_eq!(h.len(), 1, "skeleton match");
        assert_eq!(h[0].how, "skeleton");
        // a short item embedded in a longer row, and the problem with another answer format
        assert_eq!(hits(&[row("Q: 12 + 34 = ? A:", "46")], &set).len(), 1);
        let h = hits(&[row("12+34=", "4+6+0=0,1+3+1=5|50")], &set);
        assert_eq!(h.len(), 1, "the test problem itself, with any answer");
        assert_eq!(h[0].how, "prompt");
        // unrelated rows pass
        assert!(
            hits(
                &[
                    row("12+35=", "47"),
                    row("112+34=", "146"),
                    row("def other(a):", "pass")
                ],
                &set
            )
            .is_empty()
        );
    }

    #[test]
    fn letters_glued_to_an_items_numbers_do_not_hide_it() {
        let eval = vec![row("467+645=", "1112"), row("3+58=", "61")];
        let set = EvalSet::new("t", "test", &eval, CFG, None);
        let arith = EvalSet::new(
            "t",
            "test",
            &eval,
            CFG,
            Some(crate::config::NormalForm::Arithmetic),
        );
        for (p, a) in [
            ("r467+645=", "1112"),
            ("1r467+645=", "1112"),
            ("r467", "+645=1112"),
            ("x467+645=1112y", ""),
            ("_467+645=", "1112"),
            ("中467+645=", "1112"),
            ("r4 67+645=", "1112"),
            ("r3+58=61r", ""),
        ] {
            assert!(!hits(&[row(p, a)], &set).is_empty(), "{p:?} {a:?}");
            assert!(!hits(&[row(p, a)], &arith).is_empty(), "{p:?} {a:?}");
        }
        // The generator's judgement of one row is the same scan.
        let sets = [set];
        let scanner = Scanner::new(&sets, CFG);
        assert!(scanner.row_reproduces(&row("r467+645=", "1112")));
        // Other problems with letters beside them still pass; a digit glued on makes another
        // number (another problem), as before.
        for (p, a) in [
            ("r467+646=", "1113"),
            ("1467+645=", "2112"),
            ("r12+3=", "15"),
        ] {
            assert!(hits(&[row(p, a)], &sets[0]).is_empty(), "{p:?} {a:?}");
        }
    }

    #[test]
    fn the_cut_between_prompt_and_answer_does_not_matter() {
        let set = EvalSet::new("t", "test", &[row("12+34=", "46")], CFG, None);
        for (p, a) in [("12+3", "4=46"), ("1", "2+34=46"), ("12+34=46", "")] {
            assert_eq!(hits(&[row(p, a)], &set).len(), 1, "{p:?} {a:?}");
        }
    }

    /// The hit limit keeps test items' hits before dev items': a dataset holding more dev items
    /// than the limit, and one test item, is refused for the test item (it was refused as dev
    /// contamination, the test item uncounted, when the dev split came first).
    #[test]
    fn the_hit_limit_keeps_test_items_before_dev_items() {
        let dev_items: Vec<Row> = (10..40)
            .map(|a| row(&format!("{a}+{}=", a + 7), &format!("{}", 2 * a + 7)))
            .collect();
        let test_item = row("55+66=", "121");
        let sets = [
            EvalSet::new("t", "dev", &dev_items, CFG, None),
            EvalSet::new("t", "test", std::slice::from_ref(&test_item), CFG, None),
        ];
        let mut rows = dev_items.clone();
        rows.push(test_item);
        let h = Scanner::new(&sets, CFG).scan_parts(&[&rows], 5);
        assert_eq!(h.len(), 5);
        assert_eq!(h[0].split, "test", "{h:?}");
        assert!(h[1..].iter().all(|h| h.split == "dev"));
    }

    #[test]
    fn items_split_across_adjacent_rows_and_datasets_are_found() {
        // A completion item (empty answer), long enough for n-grams.
        let long = row(
            "def has_close_elements(numbers, threshold):\n    for idx, elem in enumerate(numbers):\n        for idx2, elem2 in enumerate(numbers):\n            if idx != idx2 and abs(elem - elem2) < threshold:\n                return True\n    return False",
            "",
        );
        let set = EvalSet::new("t", "test", std::slice::from_ref(&long), CFG, None);
        let text = crate::model::data::training_text(&long);
        // A cut where each half alone is under the threshold …
        let (a, b) = text
            .match_indices(' ')
            .map(|(i, _)| text.split_at(i))
            .find(|(a, b)| {
                hits(&[row(a, "")], &set).is_empty() && hits(&[row(b, "")], &set).is_empty()
            })
            .expect("a cut that hides the item from a per-row scan");
        let first = [row(a, "")];
        let second = [row(b, "")];
        // … as adjacent rows, or as two datasets trained together, the item is there.
        assert_eq!(hits(&[row(a, ""), row(b, "")], &set).len(), 1);
        let scanner = Scanner::new(std::slice::from_ref(&set), CFG);
        let h = scanner.scan_parts(&[&first, &second], 10);
        assert_eq!(h.len(), 1);
        assert_eq!(
            (h[0].part, h[0].row),
            (1, 0),
            "completed in the second dataset"
        );
        // A short item split across a row boundary too.
        let short = EvalSet::new("t", "test", &[row("12+34=", "46")], CFG, None);
        assert_eq!(
            hits(&[row("7+1=", "8; 12+"), row("34=", "46")], &short).len(),
            1
        );
        // And across three rows, the middle one shorter than the item: a window reaches back
        // through the stream, not only into the row before.
        let three = [row("7+1=", "8; 12"), row("+", ""), row("34=", "46")];
        assert_eq!(hits(&three, &short).len(), 1);
        // So does a normal form's reading (`normal_form::Carry`): the chain runs through a row
        // with no `=` into the row that ends it, and the stream's end reads one left open.
        let form = arith_12_34();
        let through = [
            row("7+1=", "8; 12 +"),
            row("0 + 0", " +"),
            row("34 =", "46"),
        ];
        assert_eq!(hits(&through, &form).len(), 1, "through a middle row");
        let open = [
            row("7+1=", "8; 34 +"),
            row("0 + 0", " +"),
            row("12 apples", ""),
        ];
        assert_eq!(hits(&open, &form).len(), 1, "left open at the end");
        let apart = [
            row("7+1=", "8; 34 +"),
            row("0 + 0", " +"),
            row("12 +", " 5"),
        ];
        assert!(hits(&apart, &form).is_empty(), "a longer chain is no item");
    }

    /// The item `12+34=46` under the arithmetic normal form.
    fn arith_12_34() -> EvalSet {
        EvalSet::new(
            "t",
            "test",
            &[row("12+34=", "46")],
            CFG,
            Some(NormalForm::Arithmetic),
        )
    }

    /// A flood of rows with no `=`: the open segment is read once when it fills (`MAX_OPEN`),
    /// not at every row, and a list of that many pieces is let go without recursing through it.
    #[test]
    fn a_long_stream_with_no_equals_is_read_in_pieces() {
        use crate::policy::normal_form::MAX_OPEN;
        let form = arith_12_34();
        let mut rows: Vec<Row> = (0..MAX_OPEN + 10).map(|_| row("0 +", "")).collect();
        rows.push(row("12 +", ""));
        rows.push(row("34 apples", ""));
        assert_eq!(hits(&rows, &form).len(), 1, "read at the stream's end");
        let filler: Vec<Row> = (0..MAX_OPEN / 2 + 10).map(|_| row("0 +", " 0 +")).collect();
        assert!(hits(&filler, &form).is_empty());
    }

    #[test]
    fn task_normal_forms_catch_what_n_grams_miss() {
        // Each item, with forms of it only its normal form sees (an n-gram scan misses them).
        let cases = [
            (
                row("12+34=", "46"),
                vec![
                    row("34+12=", "46"),
                    row("What is twelve plus thirty-four?", "forty-six"),
                    row("12 apples plus 34 apples", "46"),
                    row("34+12+0=", "46"),
                    row("0+34+12=", "46"),
                ],
            ),
            // A sum of three (tiny-sum2's items) in another order or in words.
            (
                row("12+34+56=", "102"),
                vec![
                    row("56+12+34=", "102"),
                    row("thirty-four plus fifty-six plus twelve", "102"),
                ],
            ),
        ];
        for (item, forms) in &cases {
            let items = std::slice::from_ref(item);
            let plain = EvalSet::new("t", "test", items, CFG, None);
            let arith = EvalSet::new("t", "test", items, CFG, Some(NormalForm::Arithmetic));
            for r in forms {
                assert!(hits(std::slice::from_ref(r), &plain).is_empty(), "{r:?}");
                let h = hits(std::slice::from_ref(r), &arith);
                assert_eq!(h.len(), 1, "{r:?}");
                assert_eq!(h[0].how, "normal-form");
            }
        }
        let set = |item| EvalSet::new("t", "test", &[item], CFG, Some(NormalForm::Arithmetic));
        let arith = set(row("12+34=", "46"));
        assert!(hits(&[row("12+35=", "47"), row("34-12=", "22")], &arith).is_empty());
        let scanner = Scanner::new(std::slice::from_ref(&arith), CFG);
        assert!(scanner.row_reproduces(&row("34 + 12 =", "46")));
        assert!(!scanner.row_reproduces(&row("34 + 13 =", "47")));
        // Not a sum of three's binary parts, nor a neighbour.
        let three = set(row("12+34+56=", "102"));
        assert!(hits(&[row("12+34=", "46"), row("12+34+57=", "103")], &three).is_empty());
    }

    #[test]
    fn unicode_disguises_are_caught() {
        let set = EvalSet::new("t", "test", &[row("12+34=", "46")], CFG, None);
        for p in [
            "１２＋３４＝",
            "١٢+٣٤=",
            "1\u{200B}2+3\u{2060}4\u{00AD}=",
            "𝟏𝟐 ➕ 𝟑𝟒 =",
            "1 2 + 3 4 =",
            "9 12+34=",
        ] {
            assert_eq!(hits(&[row(p, "46")], &set).len(), 1, "{p:?}");
        }
    }
}
