//! The `string_ops` normal form: what makes two of the tiny-code family's items one. An item is
//! a composition of string operations (`str drop 5;rev;del i>` asks for a program that drops five
//! characters, reverses, deletes every `i`), and the splits hold compositions out of each other
//! with letters blanked (`del a;add b` is `del c;add d`). So an item is its composition, and a row
//! that poses it — in any words around its operations, or as a program that computes it in any
//! style — reproduces it, whatever its specification looks like:
//!
//! - **Specifications** (`spec_keys`): a row's words are read as operations (`rev`, `up`, `dup`,
//!   `sort`, `take N`, `drop N`, `del C`, `add C`, `pre C`, an argument glued on or not, a letter
//!   step's any one character or, after a step, none; steps glued together read apart,
//!   `5revdel`, `jpre`), and each maximal run of them —
//!   punctuation, list numbers and a few sequence words between, any word glued before the
//!   first — is a chain: `xstr drop 5;rev;del 7:`, `drop 5 then rev then del i`, `1. drop5 2. rev
//!   3. deli`.
//! - **Programs** (`Programs`): the statements of a row are run symbolically over the one input
//!   string: what `print` shows is a chain of operations applied to `input()`, however it was
//!   written (`s=s[::-1]`, `print(input()[::-1])`, `b=a[::-1]`, `''.join(reversed(s))`,
//!   `s[-1::-1]`, `s[99::-1]`, `s*2`, `s+=s`, `str.upper(s)`, `s[5:][:3]`, `''.join(s.split(c))`,
//!   `print(s,end='')`, variables renamed, statements split over rows; the input read from
//!   `open(0)` or `sys.stdin`, bound by a tuple or a walrus, printed as `print(*s,sep='')`;
//!   bounds that are sums (`s[:3+0]`, `s[len(s)-1::-1]`), `slice(…)`, two steps in one slice
//!   (`s[:4:-1]`, `s[2:5]` either order of its steps), the dunder methods (`s.__mul__(2)`),
//!   f-strings and `%` formatting, `translate`, `sorted(…, reverse=…)`, `list(s)`, and case
//!   changed then `upper()` again). The variables are
//!   carried from row to row, as a trainer that packs rows reads them; a fresh `x=input()`
//!   starts over, and a target glued to a word before it (`hellos=input()`, a prompt ending in a
//!   letter) binds its shorter names too.
//!
//! A chain of two to `MAX_OPS` operations is keyed whole (`ops:drop 5;rev;del #`). No honest row
//! holds a longer one, so a longer chain — an item padded with operations, or with operations
//! that undo each other (`rev;rev`), or with a no-op step put in — is keyed after cancelling
//! reversals in pairs, and by every subsequence of two to `MAX_OPS` of its operations (every
//! window, past `MAX_SUBSEQUENCES`). Shorter chains are never cut: an honest three-operation row
//! holds two-operation compositions the splits may hold.
//!
//! What it does not read: a specification in words it does not know (`skip 5;reverse`) with a
//! program it cannot run (a function, a loop, a comprehension, `[s][0]`); operations spelled out
//! letter by letter; a statement cut inside across rows; a two-step item with a step put in (a
//! three-step composition, which an honest row may be).

use std::collections::HashMap;

/// The family's longest composition: no honest row holds a longer chain.
pub const MAX_OPS: usize = 3;

/// Operations a chain holds at most (a longer one is no program of this family: unknown).
const MAX_CHAIN: usize = 64;

/// Variables a program's reading keeps at most (more: all are forgotten and reading starts over).
const MAX_VARS: usize = 256;

/// The longest assignment target whose shorter names are bound too (`hellos=` binds `s`).
const MAX_GLUED: usize = 24;

/// How deep brackets nest before an expression is read as unknown.
const MAX_DEPTH: usize = 32;

/// A slice bound at least this far is past the end of every string of the family (words of at
/// most nine letters through at most three steps: `dup;dup;add` makes 37).
const PAST_END: i64 = 40;

/// Longest string literal read (a longer one is no letter to add).
const MAX_LITERAL: usize = 16;

/// One operation, letters blanked (the splits hold compositions apart in any letters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Rev,
    Up,
    Dup,
    Sort,
    Take(u32),
    Drop(u32),
    Del,
    Add,
    Pre,
}

impl Op {
    fn name(self) -> String {
        match self {
            Op::Rev => "rev".into(),
            Op::Up => "up".into(),
            Op::Dup => "dup".into(),
            Op::Sort => "sort".into(),
            Op::Take(n) => format!("take {n}"),
            Op::Drop(n) => format!("drop {n}"),
            Op::Del => "del #".into(),
            Op::Add => "add #".into(),
            Op::Pre => "pre #".into(),
        }
    }
}

fn key(ops: &[Op]) -> String {
    let names: Vec<String> = ops.iter().map(|o| o.name()).collect();
    format!("ops:{}", names.join(";"))
}

/// A chain with reversals that undo each other cancelled (`rev;rev` is nothing). Nothing else is
/// merged: an item may itself hold `take 4;take 2`, and its key keeps both.
fn reduced(ops: &[Op]) -> Vec<Op> {
    let mut out: Vec<Op> = Vec::with_capacity(ops.len());
    for &o in ops {
        if o == Op::Rev && out.last() == Some(&Op::Rev) {
            out.pop();
        } else {
            out.push(o);
        }
    }
    out
}

/// The keys of one chain (see the module's notes).
fn chain_keys(ops: &[Op], out: &mut Vec<String>) {
    if ops.len() <= MAX_OPS {
        if ops.len() >= 2 {
            out.push(key(ops));
        }
        return;
    }
    let r = reduced(ops);
    if (2..=MAX_OPS).contains(&r.len()) {
        out.push(key(&r));
    }
    for chain in [ops, &r[..]] {
        if chain.len() <= MAX_SUBSEQUENCES {
            // An item with steps put in (a no-op `del 7` between two of its steps) is one of
            // the chain's subsequences: a short chain is keyed by all of them.
            subsequences(chain, out);
            continue;
        }
        for len in 2..=MAX_OPS {
            for w in chain.windows(len) {
                out.push(key(w));
            }
        }
    }
}

/// The chain written the other ways that compute the same string: a slice with both bounds is
/// `drop a;take b` and `take a+b;drop a` alike (`s[2:5]`), so a program that slices so keys both
/// — every `drop;take` pair turned round, and every `take;drop` pair (the take the longer).
/// Items are keyed as their specifications write them, and steps written apart as written (the
/// generator's rows, whose turned forms may be protected items: measured, 1% of honest rows).
fn equivalents(ops: &[Op]) -> Vec<Vec<Op>> {
    let turned = |to_take_first: bool| -> Vec<Op> {
        let mut out = ops.to_vec();
        for i in 0..out.len().saturating_sub(1) {
            match (out[i], out[i + 1]) {
                (Op::Drop(a), Op::Take(b)) if to_take_first => {
                    if let Some(m) = a.checked_add(b) {
                        out[i] = Op::Take(m);
                        out[i + 1] = Op::Drop(a);
                    }
                }
                (Op::Take(m), Op::Drop(n)) if !to_take_first && m > n => {
                    out[i] = Op::Drop(n);
                    out[i + 1] = Op::Take(m - n);
                }
                _ => {}
            }
        }
        out
    };
    let mut out = Vec::new();
    for alt in [turned(true), turned(false)] {
        if alt != ops && !out.contains(&alt) {
            out.push(alt);
        }
    }
    out
}

/// The longest over-long chain keyed by every subsequence of two to `MAX_OPS` of its steps (at
/// most 41 of them); a longer one is keyed by its windows.
const MAX_SUBSEQUENCES: usize = 6;

fn subsequences(chain: &[Op], out: &mut Vec<String>) {
    let n = chain.len();
    for i in 0..n {
        for j in i + 1..n {
            out.push(key(&[chain[i], chain[j]]));
            for k in j + 1..n {
                out.push(key(&[chain[i], chain[j], chain[k]]));
            }
        }
    }
}

/// What a specification's letters name: a step, a counted step whose count is the number that
/// follows (`take`, `drop`), or a letter step whose argument may follow (`del`, `add`, `pre`).
#[derive(Debug, Clone, Copy)]
enum Piece {
    Step(Op),
    Counted(fn(u32) -> Op),
    Lettered(Op),
}

const NAMES: [(&str, Piece); 9] = [
    ("rev", Piece::Step(Op::Rev)),
    ("up", Piece::Step(Op::Up)),
    ("dup", Piece::Step(Op::Dup)),
    ("sort", Piece::Step(Op::Sort)),
    ("take", Piece::Counted(Op::Take)),
    ("drop", Piece::Counted(Op::Drop)),
    ("del", Piece::Lettered(Op::Del)),
    ("add", Piece::Lettered(Op::Add)),
    ("pre", Piece::Lettered(Op::Pre)),
];

/// The longest run of letters read as steps glued together (`revdeli`, `xstrdrop`).
const MAX_GLUED_RUN: usize = 24;

/// A run of letters read whole as steps glued together (`revdel`, `deli`, `drop`), or `None`.
/// A letter step takes the next letter as its argument or none (`delup` is `del;up`); a counted
/// step only at the run's end (its count is the next run, of digits).
fn segment(run: &[u8]) -> Option<Vec<Piece>> {
    fn go(r: &[u8], out: &mut Vec<Piece>) -> bool {
        if r.is_empty() {
            return true;
        }
        for (name, piece) in NAMES {
            let Some(rest) = r.strip_prefix(name.as_bytes()) else {
                continue;
            };
            match piece {
                Piece::Step(_) => {
                    out.push(piece);
                    if go(rest, out) {
                        return true;
                    }
                    out.pop();
                }
                Piece::Counted(_) if rest.is_empty() => {
                    out.push(piece);
                    return true;
                }
                Piece::Counted(_) => {}
                Piece::Lettered(op) => {
                    if let Some((_, after)) = rest.split_first() {
                        out.push(Piece::Step(op));
                        if go(after, out) {
                            return true;
                        }
                        out.pop();
                    }
                    out.push(piece);
                    if go(rest, out) {
                        return true;
                    }
                    out.pop();
                }
            }
        }
        false
    }
    if run.len() > MAX_GLUED_RUN {
        return None;
    }
    let mut out = Vec::new();
    go(run, &mut out).then_some(out)
}

/// Words a specification may put between its operations (not `and`: English joins verbs with
/// it, `take it up and sort it`).
fn connector(w: &str) -> bool {
    matches!(w, "then" | "next" | "finally" | "after")
}

/// The keys of the operation chains a canonical text's words name (see the module's notes).
/// Words are read as runs of letters and runs of digits (`drop5` is `drop 5`, `5revdel` is `5 rev
/// del`), so steps glued together with their separators deleted are read as written apart.
pub fn spec_keys(text: &str) -> Vec<String> {
    let mut runs: Vec<&str> = Vec::new();
    for word in text
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let b = word.as_bytes();
        let mut start = 0;
        for i in 1..=b.len() {
            if i == b.len() || b[i].is_ascii_digit() != b[start].is_ascii_digit() {
                runs.push(&word[start..i]);
                start = i;
            }
        }
    }
    let digits = |r: &str| r.bytes().all(|b| b.is_ascii_digit());
    let mut out = Vec::new();
    let mut chain: Vec<Op> = Vec::new();
    let mut i = 0;
    while i < runs.len() {
        let run = runs[i];
        let next = runs.get(i + 1).copied();
        if digits(run) {
            // a list's number between steps, else the end of a chain
            if chain.is_empty() || run.len() > 3 {
                chain_keys(&chain, &mut out);
                chain.clear();
            }
            i += 1;
            continue;
        }
        if !chain.is_empty() && connector(run) {
            i += 1;
            continue;
        }
        // A chain's first step may have any word glued before it (`xstrdrop`).
        let pieces = segment(run.as_bytes()).or_else(|| {
            if !chain.is_empty() || run.len() > MAX_GLUED_RUN {
                return None;
            }
            (1..run.len()).find_map(|k| segment(&run.as_bytes()[k..]))
        });
        let Some(pieces) = pieces else {
            chain_keys(&chain, &mut out);
            chain.clear();
            i += 1;
            continue;
        };
        let mut took_next = false;
        for (j, piece) in pieces.iter().enumerate() {
            let last = j + 1 == pieces.len();
            let op = match *piece {
                Piece::Step(op) => Some(op),
                Piece::Counted(f) => next
                    .filter(|n| digits(n) && n.len() <= 3)
                    .and_then(|n| n.parse().ok())
                    .map(|n| {
                        took_next = true;
                        f(n)
                    }),
                // Its argument: the next run if it is one character; without one only after a
                // step, so English starts no chain (`add up`).
                Piece::Lettered(op) => {
                    let arg = last && next.is_some_and(|n| n.len() == 1);
                    took_next |= arg;
                    // or the first letter of steps glued to it (`add jpre jsort`: `add j;pre j;sort`)
                    let glued = last
                        && !arg
                        && next.is_some_and(|n| {
                            n.len() > 1 && !digits(n) && segment(&n.as_bytes()[1..]).is_some()
                        });
                    if glued {
                        runs[i + 1] = &runs[i + 1][1..];
                    }
                    (arg || glued || !chain.is_empty()).then_some(op)
                }
            };
            match op {
                Some(op) if chain.len() < MAX_CHAIN => chain.push(op),
                Some(_) => {}
                None => {
                    chain_keys(&chain, &mut out);
                    chain.clear();
                }
            }
        }
        i += 1 + usize::from(took_next);
    }
    chain_keys(&chain, &mut out);
    out.sort();
    out.dedup();
    out
}

/// One token of a program.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Num(u32),
    Str(String),
    Punct(char),
    /// Anything else: ends what is being read.
    Other,
}

fn lex(text: &str) -> Vec<Tok> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        // Names: Python's identifiers hold letters of any script (`é=input()`).
        let ident = |x: u8| x.is_ascii_alphanumeric() || x == b'_' || x >= 0x80;
        if c.is_ascii_lowercase() || c == b'_' || c >= 0x80 {
            let s = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            // `i` moved past whole UTF-8 sequences only (bytes >= 0x80 are never split).
            out.push(match text.get(s..i) {
                Some(name) => Tok::Name(name.to_string()),
                None => Tok::Other,
            });
        } else if c == b'\\' {
            // outside a string, only a line continued (`s=\⏎s[5:]`)
            i += 1;
        } else if c == b'0' && b.get(i + 1) == Some(&b'x') {
            let s = i + 2;
            i = s;
            while i < b.len() && b[i].is_ascii_hexdigit() {
                i += 1;
            }
            out.push(
                u32::from_str_radix(&text[s..i], 16)
                    .ok()
                    .map_or(Tok::Other, Tok::Num),
            );
        } else if c.is_ascii_digit() {
            let s = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            out.push(text[s..i].parse().map_or(Tok::Other, Tok::Num));
        } else if c == b'\'' || c == b'"' {
            let end = b[i + 1..]
                .iter()
                .take(MAX_LITERAL + 1)
                .position(|&x| x == c);
            match end {
                Some(len) => {
                    out.push(Tok::Str(text[i + 1..i + 1 + len].to_string()));
                    i += len + 2;
                }
                None => {
                    out.push(Tok::Other);
                    i += 1;
                }
            }
        } else if c == b' ' {
            i += 1;
        } else {
            out.push(if b"=;()[]:+*.,-{}%~".contains(&c) {
                Tok::Punct(c as char)
            } else {
                Tok::Other
            });
            i += 1;
        }
    }
    out
}

/// What an expression is, as far as this reading goes.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    /// The input string with these operations applied.
    Ops(Vec<Op>),
    Text(String),
    Num(i64),
    /// `sorted(x)` and `reversed(x)` of the input: lists `''.join` makes strings again.
    Sorted(Vec<Op>),
    Reversed(Vec<Op>),
    /// `x.split(c)` of the input: `''.join` makes it `x` without `c`.
    Split(Vec<Op>),
    /// The name `str` (`str.upper(s)`).
    StrType,
    /// `input` itself, not called (`r=input;s=r()`).
    InputFn,
    /// The input as a file (`open(0)`, `sys.stdin`): `read()` or `readline()` is the input.
    File,
    /// The module `sys` (`sys.stdin`, `__import__('sys')`).
    Sys,
    /// The input with these operations applied and its letters' case changed some way
    /// (`title()`, `capitalize()`): `upper()` makes it the family's `up` again.
    Case(Vec<Op>),
    /// `list(x)` of the input: its characters, which `sorted`, `reversed` and `''.join` read as
    /// they read the string.
    Chars(Vec<Op>),
    /// A tuple of values (`%`'s arguments, a tuple assignment's right side).
    Tuple(Vec<Val>),
    /// A table `translate` deletes one character with (`{ord('i'): None}`,
    /// `str.maketrans('', '', 'i')`).
    DelTable,
    /// `None`, and the booleans (`sorted(…, reverse=False)`).
    Nothing,
    Bool(bool),
    /// A function passed by name: `ord` (`sorted(s, key=ord)`), `str.upper` (`map(str.upper, s)`).
    Func(&'static str),
    /// The module `re` (`re.sub`).
    Re,
    /// `slice(…)`'s operations, passed to `__getitem__`.
    Slice(Vec<Op>),
    /// `x.split()` of the input: one word (the family's strings have no white space).
    Words(Vec<Op>),
    Unknown,
}

/// The parts of a string put together (`a+b`, an f-string, `%` formatting): one operand with
/// letters before and after is `pre` and `add` (`'m'+s+'f'`, `f'm{s}f'`, `'m%s' % s`), the same
/// operand twice is `dup` (`f'{s}{s}'`, `'%s%s' % (s, s)`), letters alone are letters.
fn concat(parts: &[Val]) -> Val {
    let mut ops: Option<&Vec<Op>> = None;
    let (mut before, mut after, mut operands) = (0usize, 0usize, 0usize);
    for part in parts {
        match part {
            Val::Text(t) if operands == 0 => before += t.chars().count(),
            Val::Text(t) => after += t.chars().count(),
            Val::Ops(o) => {
                if ops.is_some_and(|x| x != o) || after > 0 {
                    return Val::Unknown;
                }
                ops = Some(o);
                operands += 1;
            }
            _ => return Val::Unknown,
        }
    }
    match (ops, operands) {
        (None, _) => Val::Text(
            parts
                .iter()
                .filter_map(|p| match p {
                    Val::Text(t) => Some(t.as_str()),
                    _ => None,
                })
                .collect(),
        ),
        (Some(o), 1) => {
            let steps: Vec<Op> = std::iter::repeat_n(Op::Pre, before)
                .chain(std::iter::repeat_n(Op::Add, after))
                .collect();
            then(o, &steps)
        }
        (Some(o), 2) if before == 0 && after == 0 => then(o, &[Op::Dup]),
        _ => Val::Unknown,
    }
}

/// `str.format` of `fmt` with `args`: each `{}` takes the next argument, `{N}` the Nth.
fn format_text(fmt: &str, args: &[Val]) -> Val {
    let mut parts = Vec::new();
    let (mut rest, mut next) = (fmt, 0usize);
    while let Some(open) = rest.find('{') {
        parts.push(Val::Text(rest[..open].to_string()));
        let Some(close) = rest[open..].find('}') else {
            return Val::Unknown;
        };
        let field = &rest[open + 1..open + close];
        let i = if field.is_empty() {
            next += 1;
            next - 1
        } else {
            match field.parse::<usize>() {
                Ok(i) => i,
                Err(_) => return Val::Unknown,
            }
        };
        match args.get(i) {
            Some(a) => parts.push(a.clone()),
            None => return Val::Unknown,
        }
        rest = &rest[open + close + 1..];
    }
    parts.push(Val::Text(rest.to_string()));
    concat(&parts)
}

/// `%` formatting of `fmt` with `args`: each `%s` takes the next argument.
fn percent(fmt: &str, args: Val) -> Val {
    let args = match args {
        Val::Tuple(v) => v,
        v => vec![v],
    };
    let mut args = args.into_iter();
    let mut parts = Vec::new();
    let mut rest = fmt;
    while let Some(i) = rest.find('%') {
        parts.push(Val::Text(rest[..i].to_string()));
        if !rest[i..].starts_with("%s") {
            return Val::Unknown;
        }
        match args.next() {
            Some(a) => parts.push(a),
            None => return Val::Unknown,
        }
        rest = &rest[i + 2..];
    }
    parts.push(Val::Text(rest.to_string()));
    if args.next().is_some() {
        return Val::Unknown;
    }
    concat(&parts)
}

fn then(ops: &[Op], more: &[Op]) -> Val {
    if ops.len() + more.len() > MAX_CHAIN {
        return Val::Unknown;
    }
    Val::Ops(ops.iter().chain(more).copied().collect())
}

/// A program's variables as the rows so far left them: what a scan carries from row to row.
#[derive(Debug, Clone, Default)]
pub struct Programs {
    vars: HashMap<String, Val>,
    /// What the last row read printed: each chain of up to `MAX_OPS` operations as its key
    /// (`ops:take 3`, `ops:` for the input itself), whatever its length — the compositions the
    /// row reads as (`policy::behaviour` tells a free composition's program by them).
    pub printed: Vec<String>,
}

impl Programs {
    /// Read a row's statements (after the rows before), returning the keys of what it prints.
    pub fn read(&mut self, text: &str) -> Vec<String> {
        let toks = lex(text);
        let mut p = Parser {
            toks: &toks,
            at: 0,
            vars: &mut self.vars,
            out: Vec::new(),
            merged: false,
            printed: Vec::new(),
        };
        p.statements();
        self.printed = p.printed;
        let mut out = p.out;
        out.sort();
        out.dedup();
        out
    }
}

struct Parser<'a> {
    toks: &'a [Tok],
    at: usize,
    vars: &'a mut HashMap<String, Val>,
    out: Vec<String>,
    /// Whether the row slices with both bounds (`s[2:5]`, two steps in one): its prints are
    /// keyed in either order of those steps too (`equivalents`). Steps written apart, as the
    /// generator writes them, are keyed as written.
    merged: bool,
    /// The chains printed (`Programs::printed`).
    printed: Vec<String>,
}

impl Parser<'_> {
    fn peek(&self, k: usize) -> Option<&Tok> {
        self.toks.get(self.at + k)
    }

    fn punct(&self, k: usize, c: char) -> bool {
        self.peek(k) == Some(&Tok::Punct(c))
    }

    fn eat(&mut self, c: char) -> bool {
        let yes = self.punct(0, c);
        if yes {
            self.at += 1;
        }
        yes
    }

    fn set(&mut self, name: String, v: Val) {
        if self.vars.len() >= MAX_VARS && !self.vars.contains_key(&name) {
            self.vars.clear();
        }
        self.vars.insert(name, v);
    }

    /// Every statement of the tokens; what is not one is stepped over, a token at a time, so a
    /// reading is linear in the row (an expression never backtracks).
    fn statements(&mut self) {
        while self.at < self.toks.len() {
            let start = self.at;
            self.statement();
            if self.at == start {
                self.at += 1;
            }
        }
    }

    /// A target written `(x)` or `x:str` (`x` and how many tokens it takes), or a plain name.
    fn target(&self, k: usize) -> Option<(String, usize)> {
        match (self.peek(k), self.peek(k + 1), self.peek(k + 2)) {
            (Some(Tok::Punct('(')), Some(Tok::Name(n)), Some(Tok::Punct(')'))) => {
                Some((n.clone(), 3))
            }
            // annotated with the one type a string has (`i:s=…` after a specification's `del i:`
            // is no annotation: reading it so left `s` unbound, and the stream's last `s` ran on)
            (Some(Tok::Name(n)), Some(Tok::Punct(':')), Some(Tok::Name(t))) if t == "str" => {
                Some((n.clone(), 3))
            }
            (Some(Tok::Name(n)), _, _) => Some((n.clone(), 1)),
            _ => None,
        }
    }

    fn statement(&mut self) {
        let Some((name, width)) = self.target(0) else {
            return;
        };
        // `print(…)`, also glued to a word before it (a prompt ending in a letter, joined to the
        // answer as the trainer joins them: `helloprint(…)`).
        if name.ends_with("print") && self.punct(1, '(') {
            self.at += 2;
            self.print_call();
            return;
        }
        // `sys.stdout.write(x)` prints `x`
        if name == "sys"
            && self.punct(1, '.')
            && matches!(self.peek(2), Some(Tok::Name(n)) if n == "stdout")
            && self.punct(3, '.')
            && matches!(self.peek(4), Some(Tok::Name(n)) if n == "write")
            && self.punct(5, '(')
        {
            self.at += 6;
            let v = self.expr(0);
            if self.eat(')') {
                self.key_printed(v);
            }
            return;
        }
        // `from sys import stdin`: the input as a file
        if name == "from"
            && matches!(self.peek(1), Some(Tok::Name(m)) if m == "sys")
            && matches!(self.peek(2), Some(Tok::Name(i)) if i == "import")
        {
            self.at += 3;
            while let Some(Tok::Name(n)) = self.peek(0).cloned() {
                self.at += 1;
                if n == "stdin" {
                    self.set(n, Val::File);
                }
                if !self.eat(',') {
                    break;
                }
            }
            return;
        }
        // `s, n = input(), 0`: each target its value.
        if width == 1 && self.punct(1, ',') {
            let mut names = vec![name];
            let mut k = 1;
            while self.punct(k, ',')
                && let Some(Tok::Name(n)) = self.peek(k + 1)
                && names.len() < MAX_VARS
            {
                names.push(n.clone());
                k += 2;
            }
            if !self.punct(k, '=') || self.punct(k + 1, '=') {
                return;
            }
            self.at += k + 1;
            let mut vals = vec![self.expr(0)];
            while self.eat(',') && vals.len() < names.len() {
                vals.push(self.expr(0));
            }
            if let [Val::Tuple(t)] = vals.as_slice() {
                vals = t.clone();
            }
            if vals.len() == names.len() {
                for (n, v) in names.into_iter().zip(vals) {
                    self.set(n, v);
                }
            } else {
                for n in names {
                    self.set(n, Val::Unknown);
                }
            }
            return;
        }
        // `x=…`, `x+=…`, `x*=…` (not `x==…`), and chained, `x=y=…`
        let assigns = |p: &Self, k: usize| {
            p.punct(k, '=') && p.peek(k + 1).is_some_and(|t| *t != Tok::Punct('='))
        };
        let op = if assigns(self, width) {
            None
        } else if let (Some(Tok::Punct(c @ ('+' | '*'))), true) =
            (self.peek(width), self.punct(width + 1, '='))
        {
            Some(*c)
        } else {
            return;
        };
        self.at += width + if op.is_some() { 2 } else { 1 };
        let mut also = Vec::new();
        while op.is_none()
            && let Some((more, w)) = self.target(0)
            && assigns(self, w)
            && also.len() < MAX_VARS
        {
            also.push(more);
            self.at += w + 1;
        }
        let v = self.expr(0);
        for more in also {
            self.set(more, v.clone());
        }
        let v = match op {
            None => v,
            Some(c) => {
                let old = self.vars.get(&name).cloned().unwrap_or(Val::Unknown);
                binary(c, old, v)
            }
        };
        // A target glued to a word before it (`hellos=input()`: a prompt ending in a letter
        // joined to its answer) binds each of its shorter names too: the model that learns the
        // row writes `s=input()`. Only the input itself: a name that ends in another's
        // (`rs=s[::-1]` beside `s`) is a variable of its own.
        if v == Val::Ops(Vec::new()) && name.len() > 1 && name.len() <= MAX_GLUED {
            for k in 1..name.len() {
                if name.is_char_boundary(k) {
                    self.set(name[k..].to_string(), v.clone());
                }
            }
        }
        self.set(name, v);
    }

    /// `print(…)`'s arguments, after `print(`: what it shows (trailing white space aside, as
    /// a checker compares) is its positional arguments joined by `sep` (a space unless given;
    /// `*s` is a string's characters), then `end`.
    fn print_call(&mut self) {
        let mut parts: Vec<(bool, Val)> = Vec::new();
        let (mut sep, mut end) = (None, None);
        if !self.punct(0, ')') {
            loop {
                if let Some(Tok::Name(k)) = self.peek(0).cloned()
                    && self.punct(1, '=')
                    && !self.punct(2, '=')
                {
                    self.at += 2;
                    let v = self.expr(1);
                    match k.as_str() {
                        "sep" => sep = Some(v),
                        "end" => end = Some(v),
                        _ => {}
                    }
                } else {
                    let star = self.eat('*');
                    let v = self.expr(0);
                    if parts.len() < MAX_VARS {
                        parts.push((star, v));
                    }
                }
                if !self.eat(',') {
                    break;
                }
            }
        }
        if !self.eat(')') {
            return;
        }
        let joined = matches!(&sep, Some(Val::Text(t)) if t.is_empty());
        let mut shown: Vec<Val> = Vec::new();
        for (star, v) in parts {
            shown.push(match (star, v) {
                (false, v) => v,
                (true, Val::Ops(o) | Val::Chars(o)) if joined => Val::Ops(o),
                (true, Val::Sorted(o)) if joined => then(&o, &[Op::Sort]),
                (true, Val::Reversed(o)) if joined => then(&o, &[Op::Rev]),
                _ => Val::Unknown,
            });
        }
        let body = match shown.len() {
            0 => Val::Text(String::new()),
            1 => shown.pop().unwrap_or(Val::Unknown),
            _ if joined => concat(&shown),
            // a space between: another string than any operation makes
            _ => Val::Unknown,
        };
        // then `end`, unless it is white space (a checker's trailing white space)
        let v = match end {
            None => body,
            Some(Val::Text(t)) if t.trim().is_empty() => body,
            Some(e) => concat(&[body, e]),
        };
        self.key_printed(v);
    }

    /// Key what a program prints.
    fn key_printed(&mut self, v: Val) {
        if let Val::Ops(ops) = v {
            let r = reduced(&ops);
            for chain in [&ops, &r] {
                if chain.len() <= MAX_OPS && self.printed.len() < MAX_VARS {
                    self.printed.push(key(chain));
                }
            }
            chain_keys(&ops, &mut self.out);
            if self.merged {
                for same in equivalents(&ops) {
                    chain_keys(&same, &mut self.out);
                }
            }
        }
    }

    fn expr(&mut self, depth: usize) -> Val {
        // `t := input()` (a walrus, bare inside a call's arguments or in brackets)
        if let Some(Tok::Name(n)) = self.peek(0).cloned()
            && self.punct(1, ':')
            && self.punct(2, '=')
        {
            self.at += 3;
            let v = self.expr(depth + 1);
            self.set(n, v.clone());
            return v;
        }
        let mut v = self.product(depth);
        // `s or ''`: where `s` is empty, `''` is the same nothing
        if matches!(self.peek(0), Some(Tok::Name(n)) if n == "or") {
            self.at += 1;
            let alt = self.product(depth);
            return match (v, alt) {
                (Val::Ops(o), Val::Text(t)) if t.is_empty() => Val::Ops(o),
                _ => Val::Unknown,
            };
        }
        loop {
            let c = if self.eat('+') {
                '+'
            } else if self.punct(0, '-') && !self.punct(1, '=') {
                self.at += 1;
                '-'
            } else {
                return v;
            };
            let r = self.product(depth);
            v = binary(c, v, r);
        }
    }

    fn product(&mut self, depth: usize) -> Val {
        let mut v = self.postfix(depth);
        loop {
            let c = match self.peek(0) {
                Some(Tok::Punct(c @ ('*' | '%'))) if !self.punct(1, '=') => *c,
                _ => return v,
            };
            self.at += 1;
            let r = self.postfix(depth);
            v = binary(c, v, r);
        }
    }

    fn postfix(&mut self, depth: usize) -> Val {
        let mut v = self.primary(depth);
        loop {
            if self.eat('[') {
                // the one word of `input().split()`: `[0]`
                if let Val::Words(o) = &v
                    && self.peek(0) == Some(&Tok::Num(0))
                    && self.punct(1, ']')
                {
                    self.at += 2;
                    v = Val::Ops(o.clone());
                    continue;
                }
                let s = if matches!(self.peek(0), Some(Tok::Name(n)) if n == "slice")
                    && self.punct(1, '(')
                {
                    self.at += 2;
                    let s = self.slice_call();
                    if !self.eat(')') {
                        return Val::Unknown;
                    }
                    s
                } else {
                    self.slice()
                };
                if !self.eat(']') {
                    return Val::Unknown;
                }
                if let Some(ops) = &s
                    && ops.iter().any(|o| matches!(o, Op::Take(_)))
                    && ops.iter().any(|o| matches!(o, Op::Drop(_)))
                {
                    self.merged = true;
                }
                v = match (v, s) {
                    (Val::Ops(ops), Some(more)) => then(&ops, &more),
                    _ => Val::Unknown,
                };
            } else if self.punct(0, '.')
                && let Some(Tok::Name(m)) = self.peek(1).cloned()
            {
                self.at += 2;
                if !self.eat('(') {
                    // an attribute: `sys.stdin`
                    v = match (v, m.as_str()) {
                        (Val::Sys, "stdin") => Val::File,
                        (Val::StrType, "upper") => Val::Func("upper"),
                        _ => return Val::Unknown,
                    };
                    continue;
                }
                let (args, kw) = self.call_args(depth);
                if !self.eat(')') {
                    return Val::Unknown;
                }
                v = method(v, &m, args, &kw);
            } else {
                return v;
            }
        }
    }

    /// A call's arguments: positional, and keyword (`reverse=False`) by name.
    fn call_args(&mut self, depth: usize) -> (Vec<Val>, Vec<(String, Val)>) {
        let (mut out, mut kw) = (Vec::new(), Vec::new());
        if self.punct(0, ')') {
            return (out, kw);
        }
        loop {
            if let Some(Tok::Name(k)) = self.peek(0).cloned()
                && self.punct(1, '=')
                && !self.punct(2, '=')
            {
                self.at += 2;
                let v = self.expr(depth + 1);
                if kw.len() < MAX_VARS {
                    kw.push((k, v));
                }
            } else {
                out.push(self.expr(depth + 1));
            }
            if !self.eat(',') {
                return (out, kw);
            }
        }
    }

    /// `slice(stop)`, `slice(start, stop)`, `slice(start, stop, step)`: the slice's operations.
    fn slice_call(&mut self) -> Option<Vec<Op>> {
        let mut b = Vec::new();
        loop {
            b.push(self.bound()?);
            if b.len() > 3 || !self.eat(',') {
                break;
            }
        }
        match b.as_slice() {
            [stop] => slice_ops(None, *stop, None),
            [a, stop] => slice_ops(*a, *stop, None),
            [a, stop, c] => slice_ops(*a, *stop, *c),
            _ => None,
        }
    }

    /// A slice bound: a number (signed), `len(…)` (past every string's end), nothing, or `None`
    /// where it is none of these.
    /// A slice bound: a sum of numbers and `len(…)` (`3+0`, `len(s)-1`), `None`, nothing — or
    /// `None` where it is none of these. `len(s)+k` is past the end for `k >= 0` and the index
    /// `k` from the end otherwise (`len(s)-1` is `-1`).
    fn bound(&mut self) -> Option<Option<i64>> {
        if let Some(Tok::Name(n)) = self.peek(0)
            && n == "none"
        {
            self.at += 1;
            return Some(None);
        }
        let (mut total, mut lens, mut terms) = (0i64, 0i64, 0usize);
        loop {
            // `~n` is `-n-1` (`s[::~0]` steps back)
            if self.punct(0, '~')
                && let Some(Tok::Num(n)) = self.peek(1).cloned()
            {
                self.at += 2;
                total = total.checked_sub(i64::from(n) + 1)?;
                terms += 1;
                if terms > 8 || !(self.punct(0, '+') || self.punct(0, '-')) {
                    break;
                }
                continue;
            }
            let neg = self.eat('-');
            let pos = !neg && self.eat('+');
            let sign = if neg { -1 } else { 1 };
            match self.peek(0).cloned() {
                Some(Tok::Num(n)) => {
                    self.at += 1;
                    total = total.checked_add(sign * i64::from(n))?;
                }
                // a count held in a variable (`n=5;s[n:]`)
                Some(Tok::Name(v))
                    if !self.punct(1, '(')
                        && let Some(Val::Num(n)) = self.vars.get(&v).cloned() =>
                {
                    self.at += 1;
                    total = total.checked_add(sign.checked_mul(n)?)?;
                }
                // `int(5)`
                Some(Tok::Name(f))
                    if f == "int"
                        && self.punct(1, '(')
                        && matches!(self.peek(2), Some(Tok::Num(_)))
                        && self.punct(3, ')') =>
                {
                    let Some(Tok::Num(n)) = self.peek(2).cloned() else {
                        return None;
                    };
                    self.at += 4;
                    total = total.checked_add(sign * i64::from(n))?;
                }
                Some(Tok::Name(f)) if f == "len" && self.punct(1, '(') => {
                    self.at += 2;
                    self.expr(MAX_DEPTH);
                    if !self.eat(')') {
                        return None;
                    }
                    lens += sign;
                }
                _ if neg || pos || terms > 0 => return None,
                _ => return Some(None),
            }
            terms += 1;
            if terms > 8 || !(self.punct(0, '+') || self.punct(0, '-')) {
                break;
            }
        }
        match lens {
            0 => Some(Some(total)),
            1 if total >= 0 => Some(Some(PAST_END)),
            1 => Some(Some(total)),
            _ => None,
        }
    }

    /// `[a:b:c]`'s operations (`None`: not one of the family's). A bound past every string of
    /// the family (`PAST_END`, `len(s)`) is its end: `s[99::-1]` reverses, `s[5:99]` drops five.
    fn slice(&mut self) -> Option<Vec<Op>> {
        let a = self.bound()?;
        if !self.eat(':') {
            return None;
        }
        let b = self.bound()?;
        let c = if self.eat(':') { self.bound()? } else { None };
        slice_ops(a, b, c)
    }

    fn primary(&mut self, depth: usize) -> Val {
        if depth > MAX_DEPTH {
            return Val::Unknown;
        }
        let Some(t) = self.peek(0).cloned() else {
            return Val::Unknown;
        };
        self.at += 1;
        match t {
            Tok::Num(n) => Val::Num(i64::from(n)),
            Tok::Str(s) => Val::Text(s),
            Tok::Punct('-') => match self.primary(depth + 1) {
                Val::Num(n) => Val::Num(-n),
                _ => Val::Unknown,
            },
            Tok::Punct('(') => {
                let v = self.expr(depth + 1);
                if !self.eat(',') {
                    return if self.eat(')') { v } else { Val::Unknown };
                }
                // a tuple
                let mut items = vec![v];
                while !self.punct(0, ')') && items.len() < MAX_VARS {
                    items.push(self.expr(depth + 1));
                    if !self.eat(',') {
                        break;
                    }
                }
                if self.eat(')') {
                    Val::Tuple(items)
                } else {
                    Val::Unknown
                }
            }
            // `{ord('i'): None}`, a table `translate` deletes one character with
            Tok::Punct('{') => {
                let key = self.expr(depth + 1);
                let table = self.eat(':')
                    && self.expr(depth + 1) == Val::Nothing
                    && self.eat('}')
                    && matches!(key, Val::Num(_));
                if table { Val::DelTable } else { Val::Unknown }
            }
            // an f-string: its `{name}` parts are the names' values
            Tok::Name(f) if f == "f" && matches!(self.peek(0), Some(Tok::Str(_))) => {
                let Some(Tok::Str(body)) = self.peek(0).cloned() else {
                    return Val::Unknown;
                };
                self.at += 1;
                let mut parts = Vec::new();
                let mut rest = body.as_str();
                while let Some(open) = rest.find('{') {
                    parts.push(Val::Text(rest[..open].to_string()));
                    let Some(close) = rest[open..].find('}') else {
                        return Val::Unknown;
                    };
                    let field = &rest[open + 1..open + close];
                    // `{s!s}` is `str(s)`: the same string
                    let name = field.strip_suffix("!s").unwrap_or(field);
                    parts.push(self.vars.get(name).cloned().unwrap_or(Val::Unknown));
                    rest = &rest[open + close + 1..];
                }
                parts.push(Val::Text(rest.to_string()));
                concat(&parts)
            }
            Tok::Name(name) => {
                if !self.punct(0, '(') {
                    return match name.as_str() {
                        "str" => Val::StrType,
                        "input" => Val::InputFn,
                        "sys" => Val::Sys,
                        "none" => Val::Nothing,
                        "true" => Val::Bool(true),
                        "false" => Val::Bool(false),
                        "ord" => Val::Func("ord"),
                        "re" => Val::Re,
                        _ => self.vars.get(&name).cloned().unwrap_or(Val::Unknown),
                    };
                }
                self.at += 1;
                let (args, kw) = self.call_args(depth);
                if !self.eat(')') {
                    return Val::Unknown;
                }
                let input = name == "input" || self.vars.get(&name) == Some(&Val::InputFn);
                // `reverse=` says which way; `key=ord` sorts as without one
                let mut reverse = Some(false);
                for (k, v) in &kw {
                    match (k.as_str(), v) {
                        ("reverse", Val::Bool(r)) => reverse = reverse.map(|_| *r),
                        ("key", Val::Func("ord")) => {}
                        _ => reverse = None,
                    }
                }
                match (name.as_str(), args.as_slice(), reverse) {
                    (_, [], Some(false)) if input => Val::Ops(Vec::new()),
                    // a prompt of nothing prints nothing
                    (_, [Val::Text(t)], Some(false)) if input && t.is_empty() => {
                        Val::Ops(Vec::new())
                    }
                    ("sorted", [Val::Ops(o) | Val::Chars(o)], Some(false)) => {
                        Val::Sorted(o.clone())
                    }
                    ("sorted", [Val::Ops(o) | Val::Chars(o)], Some(true)) => {
                        match then(o, &[Op::Sort, Op::Rev]) {
                            Val::Ops(o) => Val::Chars(o),
                            _ => Val::Unknown,
                        }
                    }
                    ("reversed", [Val::Ops(o) | Val::Chars(o)], Some(false)) => {
                        Val::Reversed(o.clone())
                    }
                    ("list", [Val::Ops(o)], Some(false)) => Val::Chars(o.clone()),
                    (
                        "list",
                        [v @ (Val::Sorted(_) | Val::Reversed(_) | Val::Chars(_))],
                        Some(false),
                    ) => v.clone(),
                    ("map", [Val::Func("upper"), Val::Ops(o) | Val::Chars(o)], Some(false)) => {
                        match then(o, &[Op::Up]) {
                            Val::Ops(o) => Val::Chars(o),
                            _ => Val::Unknown,
                        }
                    }
                    ("slice", args, Some(false)) if (1..=3).contains(&args.len()) => {
                        let bound = |v: &Val| match v {
                            Val::Num(n) => Some(Some(*n)),
                            Val::Nothing => Some(None),
                            _ => None,
                        };
                        let b: Option<Vec<Option<i64>>> = args.iter().map(bound).collect();
                        let ops = match b.as_deref() {
                            Some([stop]) => slice_ops(None, *stop, None),
                            Some([a, stop]) => slice_ops(*a, *stop, None),
                            Some([a, stop, c]) => slice_ops(*a, *stop, *c),
                            _ => None,
                        };
                        ops.map_or(Val::Unknown, Val::Slice)
                    }
                    ("str", [v @ Val::Ops(_)], Some(false)) => v.clone(),
                    ("str", [], Some(false)) => Val::Text(String::new()),
                    ("ord", [Val::Text(c)], Some(false)) if c.chars().count() == 1 => {
                        Val::Num(i64::from(u32::from(c.chars().next().unwrap_or('0'))))
                    }
                    ("open", [Val::Num(0)], Some(false)) => Val::File,
                    ("__import__", [Val::Text(m)], Some(false)) if m == "sys" => Val::Sys,
                    _ => Val::Unknown,
                }
            }
            _ => {
                self.at -= 1;
                Val::Unknown
            }
        }
    }
}

/// `[a:b:c]`'s operations (`None`: not one of the family's). A bound past every string of the
/// family (`PAST_END`, `len(s)`) is its end: `s[99::-1]` reverses, `s[5:99]` drops five. A
/// reversed slice with a bound is two steps (`s[:4:-1]` is `drop 5;rev`, `s[2::-1]` is `take
/// 3;rev`, `s[:-3:-1]` is `rev;take 2`, `s[-3::-1]` is `rev;drop 2`).
fn slice_ops(a: Option<i64>, b: Option<i64>, c: Option<i64>) -> Option<Vec<Op>> {
    let count = |n: i64| u32::try_from(n).ok().filter(|&n| n > 0);
    let end = |x: Option<i64>| x.is_none_or(|n| n >= PAST_END);
    match c {
        Some(-1) => {
            let from_end = a.is_none_or(|n| n == -1 || n >= PAST_END);
            let to_start = b.is_none_or(|n| n <= -PAST_END);
            match (a, b) {
                _ if from_end && to_start => Some(vec![Op::Rev]),
                (_, Some(k)) if from_end && (0..PAST_END).contains(&k) => {
                    Some(vec![Op::Drop(count(k + 1)?), Op::Rev])
                }
                (_, Some(k)) if from_end && k < -1 => Some(vec![Op::Rev, Op::Take(count(-k - 1)?)]),
                (Some(n), _) if to_start && (0..PAST_END).contains(&n) => {
                    Some(vec![Op::Take(count(n + 1)?), Op::Rev])
                }
                (Some(n), _) if to_start && n < -1 && n > -PAST_END => {
                    Some(vec![Op::Rev, Op::Drop(count(-n - 1)?)])
                }
                _ => None,
            }
        }
        None | Some(1) => {
            let from = a.unwrap_or(0);
            // the last n (`s[-3:]`) or all but the last n (`s[:-3]`): read from the end, as
            // `rev;take 3;rev` and `rev;drop 3;rev` (a reversal after cancels one of them)
            match (a, b) {
                (Some(n), None) if n < 0 && n > -PAST_END => {
                    return Some(vec![Op::Rev, Op::Take(count(-n)?), Op::Rev]);
                }
                (None | Some(0), Some(n)) if n < 0 && n > -PAST_END => {
                    return Some(vec![Op::Rev, Op::Drop(count(-n)?), Op::Rev]);
                }
                _ => {}
            }
            let mut ops = Vec::new();
            if from < 0 {
                return None;
            }
            if let Some(stop) = b
                && from > 0
                && stop > 0
                && stop <= from
            {
                // `s[5:3]`: nothing is left, as `take 3;drop 5` leaves nothing
                return Some(vec![Op::Take(count(stop)?), Op::Drop(count(from)?)]);
            }
            if from != 0 {
                ops.push(Op::Drop(count(from)?));
            }
            if !end(b) {
                ops.push(Op::Take(count(b? - from)?));
            }
            Some(ops)
        }
        _ => None,
    }
}

/// A method call's value: the family's operations as Python writes them.
fn method(v: Val, m: &str, args: Vec<Val>, kw: &[(String, Val)]) -> Val {
    if !kw.is_empty() {
        return Val::Unknown;
    }
    match (v, m, args.as_slice()) {
        // the input read from a file (`open(0).read()`, `sys.stdin.readline()`)
        (Val::File, "read" | "readline", [] | [Val::Num(_)]) => Val::Ops(Vec::new()),
        (Val::Ops(o), "swapcase", []) if !o.contains(&Op::Up) => then(&o, &[Op::Up]),
        (Val::Ops(o), "title" | "capitalize" | "swapcase" | "casefold", []) => Val::Case(o),
        // the case changed, then upper again: `up` once (after an `up`, no more)
        (Val::Case(o), "upper", []) if o.last() == Some(&Op::Up) => Val::Ops(o),
        (Val::Case(o), "upper", []) => then(&o, &[Op::Up]),
        (Val::Case(o), "title" | "capitalize" | "swapcase" | "casefold" | "lower", []) => {
            Val::Case(o)
        }
        // the dunder methods the operators call
        (Val::Ops(o), "__mul__" | "__rmul__", [n]) => binary('*', Val::Ops(o), n.clone()),
        (Val::Ops(o), "__add__", [b]) => binary('+', Val::Ops(o), b.clone()),
        (Val::Text(t), "__add__", [b]) => binary('+', Val::Text(t), b.clone()),
        (Val::Ops(o), "__radd__", [b]) => binary('+', b.clone(), Val::Ops(o)),
        (Val::Ops(o), "translate", [Val::DelTable]) => then(&o, &[Op::Del]),
        (Val::Re, "sub", [Val::Text(c), Val::Text(e), Val::Ops(o)])
            if c.chars().count() == 1 && c.chars().all(char::is_alphanumeric) && e.is_empty() =>
        {
            then(o, &[Op::Del])
        }
        (Val::Ops(o), "__getitem__", [Val::Slice(more)]) => then(&o, more),
        (Val::Ops(o), "split", []) => Val::Words(o),
        // `'{}f'.format(s)`, `'{0}{0}'.format(s)`: the arguments put into the text
        (Val::Text(fmt), "format", args) if !args.is_empty() => format_text(&fmt, args),
        (Val::StrType, "join", [Val::Text(sep), a]) if sep.is_empty() => {
            method(Val::Text(String::new()), "join", vec![a.clone()], &[])
        }
        (Val::StrType, "maketrans", [Val::Text(a), Val::Text(b), Val::Text(c)])
            if a.is_empty() && b.is_empty() && c.chars().count() == 1 =>
        {
            Val::DelTable
        }
        (Val::Ops(o), "upper", []) => then(&o, &[Op::Up]),
        // the family's words are lower-case: `lower` changes them only after `up`
        (Val::Ops(o), "lower", []) if !o.contains(&Op::Up) => Val::Ops(o),
        (Val::StrType, "upper", [Val::Ops(o)]) => then(o, &[Op::Up]),
        // with a count or without (`replace('i','',9)`)
        (Val::Ops(o), "replace", [Val::Text(c), Val::Text(e), ..])
            if c.chars().count() == 1 && e.is_empty() =>
        {
            then(&o, &[Op::Del])
        }
        (Val::Ops(o), "replace", [Val::Text(c), Val::Text(e)]) if c.is_empty() && e.is_empty() => {
            Val::Ops(o)
        }
        // no family string has white space to strip
        (Val::Ops(o), "strip" | "lstrip" | "rstrip", [] | [Val::Text(_)]) => Val::Ops(o),
        (Val::Ops(o), "split", [Val::Text(c)]) if c.chars().count() == 1 => Val::Split(o),
        (Val::Text(sep), "join", [a]) if sep.is_empty() => match a {
            Val::Sorted(o) => then(o, &[Op::Sort]),
            Val::Reversed(o) => then(o, &[Op::Rev]),
            Val::Split(o) => then(o, &[Op::Del]),
            Val::Ops(o) | Val::Chars(o) => Val::Ops(o.clone()),
            // `''.join((s, 'f'))`: the parts put together
            Val::Tuple(parts) => concat(parts),
            _ => Val::Unknown,
        },
        _ => Val::Unknown,
    }
}

/// `a+b` and `a*b` where they are the family's operations (`s+s`, `s*2`, `s+'c'`, `'c'+s`).
fn binary(c: char, a: Val, b: Val) -> Val {
    match (c, a, b) {
        ('+', Val::Num(x), Val::Num(y)) => x.checked_add(y).map_or(Val::Unknown, Val::Num),
        ('-', Val::Num(x), Val::Num(y)) => x.checked_sub(y).map_or(Val::Unknown, Val::Num),
        ('*', Val::Num(x), Val::Num(y)) => x.checked_mul(y).map_or(Val::Unknown, Val::Num),
        ('%', Val::Text(fmt), args) => percent(&fmt, args),
        ('+', Val::Ops(x), Val::Ops(y)) if x == y => then(&x, &[Op::Dup]),
        ('+', Val::Ops(x), Val::Text(t)) => then(&x, &vec![Op::Add; t.chars().count()]),
        ('+', Val::Text(t), Val::Ops(x)) => then(&x, &vec![Op::Pre; t.chars().count()]),
        ('+', Val::Text(a), Val::Text(b)) => Val::Text(a + &b),
        ('*', Val::Ops(x), Val::Num(2)) | ('*', Val::Num(2), Val::Ops(x)) => then(&x, &[Op::Dup]),
        ('*', Val::Ops(x), Val::Num(1)) | ('*', Val::Num(1), Val::Ops(x)) => Val::Ops(x),
        _ => Val::Unknown,
    }
}

/// A protected item's key: the chain its specification names (`None` where it names none, or
/// more than one).
pub fn item_key(canonical_prompt: &str) -> Option<String> {
    let keys = spec_keys(canonical_prompt);
    match keys.as_slice() {
        [k] => Some(k.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::canon::canonical;

    const ITEM: &str = "ops:drop 5;rev;del #";

    fn read(rows: &[&str]) -> Vec<String> {
        let mut p = Programs::default();
        let mut keys = Vec::new();
        for r in rows {
            let text = canonical(r);
            keys.extend(spec_keys(&text));
            keys.extend(p.read(&text));
        }
        keys.sort();
        keys.dedup();
        keys
    }

    #[test]
    fn an_items_composition_is_read_from_any_specification() {
        assert_eq!(
            item_key(&canonical("str drop 5;rev;del i>")),
            Some(ITEM.into())
        );
        for spec in [
            "str drop 5;rev;del q>",
            "xstr drop 5;rev;del i>",
            "xtr drop 5;rev;del i:",
            "drop 5;rev;del i",
            "strdrop 5;rev;del i>",
            "string drop 5 then rev then del i",
            "1. drop 5 2. rev 3. del i >",
            "STR DROP5; REV; DELI",
            "str drop 5 | rev | del i =>",
            // a letter step's argument any one character, or none
            "str drop 5;rev;del 7>",
            // separators deleted, steps glued
            "str drop 5revdel i>",
            "strdrop5revdeli>",
            "str drop 5;rev;del .>",
            "str drop 5;rev;del>",
            // a no-op step put in between
            "str drop 5;del 7;rev;del i>",
            // a longer chain than the family's holds it as a window
            "str drop 5;rev;del i;up>",
        ] {
            assert!(read(&[spec]).contains(&ITEM.to_string()), "{spec}");
        }
        // Another composition, another order, a longer chain of the family's length: not it.
        for other in [
            "str drop 4;rev;del i>",
            "str rev;drop 5;del i>",
            "str drop 5;rev>",
            "we drop 5 boxes, then rev up",
        ] {
            assert!(!read(&[other]).contains(&ITEM.to_string()), "{other}");
        }
    }

    #[test]
    fn steps_glued_together_are_read_apart() {
        for (spec, key) in [
            ("str add jpre jsort>", "ops:add #;pre #;sort"),
            ("strdrop5revdeli>", "ops:drop 5;rev;del #"),
            ("str take 3dupup>", "ops:take 3;dup;up"),
            ("str rev delup>", "ops:rev;del #;up"),
        ] {
            assert_eq!(spec_keys(&canonical(spec)), [key], "{spec}");
        }
    }

    #[test]
    fn english_around_the_operations_names_no_chain() {
        for prose in [
            "add up the model and sort it out",
            "we take the model up and sort it, then add them",
            "predelivery: drop everything",
        ] {
            assert!(spec_keys(&canonical(prose)).is_empty(), "{prose}");
        }
    }

    #[test]
    fn a_program_is_read_as_the_composition_it_computes() {
        for program in [
            "s=input();s=s[5:];s=s[::-1];s=s.replace('i','');print(s)",
            "print(input()[5:][::-1].replace('i',''))",
            "a=input();b=a[5:];c=b[::-1];d=c.replace('i','');print(d)",
            "x=input()\nx=x[5:]\nx=''.join(reversed(x))\nx=x.replace('q','')\nprint(x)",
            "s=input();s=s[5:][-1::-1];s=s.replace('i',\"\");print(s)",
            // padded with what undoes itself, or run on past the item
            "s=input();s=s[5:];s=s[::-1];s=s[::-1];s=s[::-1];s=s.replace('i','');print(s)",
            "print(input()[5:][::-1].replace('i','').upper())",
            // spec words it does not know, the program it can run
            "str skip 5;reverse;remove i>print(input()[5:][::-1].replace('i',''))",
            // keyword arguments to print, a prompt ending in a letter glued on
            "s=input();s=s[5:];s=s[::-1];s=s.replace('7','');print(s,end='')",
            "hellos=input();s=s[5:];s=s[::-1];s=s.replace('i','');print(s)",
            "hello print(input()[5:][::-1].replace('i',''),sep='')",
            // other Python for the same steps
            "s=input().strip();s=s[+5:len(s)];s=s[len(s)::-1];s=s.replace('i','',9);print(s)",
            "s=input();s=s[5:99][:-99:-1]*1;s=''.join(s.split('i'));print(s.strip(''))",
            "s=input();s=s[5:];s=s[99::-1];s=s.replace('i',str()).replace('','');print(s)",
            // other ways to bind the input
            "s=t=input();s=s[5:];s=s[::-1];s=s.replace('i','');print(s)",
            "s:str=input().lower();s=s[5:];s=s[::-1];s=s.replace('i','');print(s)",
            "r=input;(s)=r();s=s[5:];s=s[::-1];s=s.replace('i','');print(s)",
        ] {
            assert!(read(&[program]).contains(&ITEM.to_string()), "{program}");
        }
        // Split over rows at statements: the variables carry.
        let rows = [
            "s=input();s=s[5:];",
            "s=s[::-1]",
            ";s=s.replace('i','');print(s)",
        ];
        assert!(read(&rows).contains(&ITEM.to_string()));
        // A specification ending `del i:` before the program is no annotation of `i`: each row's
        // `s=input()` starts over, and two such rows pose their own two items, nothing longer.
        let rows = [
            "xtr drop 5;rev;del i:s=input();s=s[5:];s=s[::-1];s=s.replace('i','');print(s)",
            "xtr take 5;take 4;rev:s=input();s=s[:5];s=s[:4];s=s[::-1];print(s)",
        ];
        assert_eq!(read(&rows), [ITEM, "ops:take 5;take 4;rev"]);
        // A fresh input starts over; what is never printed is no program's output.
        let fresh = [
            "s=input();s=s[5:];",
            "s=input();s=s[::-1];s=s.replace('i','');print(s)",
        ];
        assert!(!read(&fresh).contains(&ITEM.to_string()));
        assert!(!read(&["s=input();s=s[5:];s=s[::-1];s=s.replace('i','')"]).contains(&ITEM.into()));
        // Other compositions are other keys.
        for other in [
            "print(input()[4:][::-1].replace('i',''))",
            "print(input()[::-1][5:].replace('i',''))",
            "print(input()[5:][::-1].replace('ii',''))",
            "print(input()[5:].replace('i',''))",
        ] {
            assert!(!read(&[other]).contains(&ITEM.to_string()), "{other}");
        }
    }

    #[test]
    fn the_familys_operations_in_python_are_read() {
        let one = |p: &str| Programs::default().read(&canonical(p));
        assert_eq!(one("s=input();s=s+s;s=s.upper();print(s)"), ["ops:dup;up"]);
        assert_eq!(
            one("s=input();s*=2;s=str.upper(s);print(s)"),
            ["ops:dup;up"]
        );
        assert_eq!(one("print(('a'+(input()*2)))"), ["ops:dup;pre #"]);
        assert_eq!(
            one("s=input();s+='b';s=''.join(sorted(s));print(s)"),
            ["ops:add #;sort"]
        );
        assert_eq!(
            one("print(input()[2:5].upper())"),
            ["ops:drop 2;take 3;up", "ops:take 5;drop 2;up"]
        );
        assert_eq!(
            one("print(input()[0:3][::1][:].upper())"),
            ["ops:take 3;up"]
        );
        // The input read another way, bound by a walrus or a tuple, printed by characters.
        for (program, key) in [
            (
                "s=open(0).read().strip();s=s[5:];s=s[::-1];s=s.replace('i','');print(s)",
                ITEM,
            ),
            (
                "import sys;s=sys.stdin.readline().strip();s=s[5:][::-1];print(s.replace('i',''))",
                ITEM,
            ),
            (
                "s=__import__('sys').stdin.read();print(s[5:][::-1].replace('i',''))",
                ITEM,
            ),
            ("print((t:=input())[5:][::-1].replace('i',''))", ITEM),
            (
                "s,n=input(),0;s=s[5:];s=s[::-1];s=s.replace('i','');print(s)",
                ITEM,
            ),
            (
                "s=input();s=s[5:];s=s[::-1];s=s.replace('i','');print(*s,sep='')",
                ITEM,
            ),
            // each step spelled another plain way
            (
                "s=input();s=s[slice(5,none)];s=s[len(s)-1::-1];s=s.replace('i','',-1);print(s)",
                ITEM,
            ),
            (
                "s=input();s=s[5+0:];s=s[slice(none,none,-1)];s=s.translate({ord('i'):none});print(s)",
                ITEM,
            ),
            (
                "s=input();s=s[:4:-1];s=s.translate(str.maketrans('','','i'));print(s)",
                ITEM,
            ),
            (
                "s=input();s=s*(1+1);s=s.upper().title().upper();print(s)",
                "ops:dup;up",
            ),
            (
                "s=input();s=s.__mul__(2);s=s.swapcase();print(s)",
                "ops:dup;up",
            ),
            (
                "s=input();s='%s%s'%(s,s);s=''.join(sorted(list(s),reverse=false));print(s)",
                "ops:dup;sort",
            ),
            (
                "s=input();s=f'{s}f';s=f'm{s}';s=s[slice(3)];print(s)",
                "ops:add #;pre #;take 3",
            ),
            (
                "s=input();s=s.__add__('f');s='m'.__add__(s);print(s)",
                "ops:add #;pre #",
            ),
            ("s=input();s=s[2::-1];print(s.upper())", "ops:take 3;rev;up"),
            (
                "s=input();s=s[:-3:-1];print(s.upper())",
                "ops:rev;take 2;up",
            ),
            (
                "s=input();s=s[-3::-1];print(s.upper())",
                "ops:rev;drop 2;up",
            ),
            ("print(*sorted(input()[2:]),sep='')", "ops:drop 2;sort"),
            // a slice with both bounds is either order of its two steps
            (
                "s=input();s=s[2:5];print(s.upper())",
                "ops:take 5;drop 2;up",
            ),
            (
                "s=input();s=s[2:5];print(s.upper())",
                "ops:drop 2;take 3;up",
            ),
        ] {
            assert!(
                one(program).contains(&key.to_string()),
                "{program}: {:?}",
                one(program)
            );
        }
        // Helper five's: print's other arguments and `end`, another output, input and lexing.
        for (program, key) in [
            (
                "s=input('');s=s[5:];s=s[::-1];s=s.replace('i','');print(s)",
                ITEM,
            ),
            (
                "from sys import stdin;s=stdin.readline().strip();print(s[5:][::-1].replace('i',''))",
                ITEM,
            ),
            (
                "import sys;s=input();s=s[5:][::-1];sys.stdout.write(s.replace('i',''))",
                ITEM,
            ),
            (
                "s=input();s=s[5:];s=s[::-1];s=s.replace('i','');print(end=s)",
                ITEM,
            ),
            (
                "é=input();é=é[5:];é=é[::-1];é=é.replace('i','');print(é)",
                ITEM,
            ),
            (
                "s=input();s=\\ s[5:];s=s[::-1];s=s.replace('i','');print(s)",
                ITEM,
            ),
            (
                "s=input();s=s[0x5:];s=s[::-1];s=s.replace('i','');print(s)",
                ITEM,
            ),
            (
                "s=input();s=s[2:];s=s.upper();print(s,'v',sep='')",
                "ops:drop 2;up;add #",
            ),
            (
                "s=input();s=s[2:];s=s.upper();print(s,end='v')",
                "ops:drop 2;up;add #",
            ),
            (
                "s=input();s=s[2:];print('m',s.upper(),sep='')",
                "ops:drop 2;up;pre #",
            ),
        ] {
            assert!(
                one(program).contains(&key.to_string()),
                "{program}: {:?}",
                one(program)
            );
        }
        for (program, key) in [
            (
                "s=input();n=5;s=s[n:];s=s[::-1];s=s.replace('i','');print(s)",
                ITEM,
            ),
            (
                "s=input();s=s[int(5):];s=s[::-1];s=s.replace('i','');print(s or '')",
                ITEM,
            ),
            (
                "s=input();s=s[5:];s=s[::-1];s=s.replace('i','');print('{}'.format(s))",
                ITEM,
            ),
            (
                "s=input();s='{0}{0}'.format(s);s='{}f'.format(s);print(s)",
                "ops:dup;add #",
            ),
            (
                "s=input();s=str.join('',sorted(s[2:]));print(s)",
                "ops:drop 2;sort",
            ),
        ] {
            assert!(
                one(program).contains(&key.to_string()),
                "{program}: {:?}",
                one(program)
            );
        }
        for (program, key) in [
            (
                "s=input();s=s[5:];s=s[::-1];import re;print(re.sub('i','',s))",
                ITEM,
            ),
            (
                "s=input().split()[0];s=s[5:];s=s[::~0];s=s.replace('i','');print(f'{s!s}')",
                ITEM,
            ),
            (
                "s=input();s=s.__getitem__(slice(5,none));s=''.join(list(reversed(s)));print(s.replace('i',''))",
                ITEM,
            ),
            (
                "s=input();s=''.join((s,s));s=''.join(map(str.upper,s));print(s)",
                "ops:dup;up",
            ),
            (
                "s=input();s=''.join(sorted(s,key=ord));s=''.join(('m',s));print(s)",
                "ops:sort;pre #",
            ),
            (
                "s=input();s=s[-3:][::-1];print(s.upper())",
                "ops:rev;take 3;up",
            ),
            (
                "s=input();s=s[:-3][::-1];print(s.upper())",
                "ops:rev;drop 3;up",
            ),
        ] {
            assert!(
                one(program).contains(&key.to_string()),
                "{program}: {:?}",
                one(program)
            );
        }
        // A name ending in another's binds only itself, unless it is the input (`hellos=`).
        assert!(one("s=input();rs=s[::-1];print(s+rs)").is_empty());
        // Printed with spaces between its characters, it is another string.
        assert!(one("s=input();s=s[5:];s=s[::-1];print(*s)").is_empty());
        assert!(one("print(sorted(input()[2:]))").is_empty());
        // Deeply nested or unbalanced text reads as nothing, and ends.
        let deep = format!("print({}input(){})", "(".repeat(5000), ")".repeat(5000));
        assert!(one(&deep).is_empty());
        assert!(one("print(input()[5:][::-1]").is_empty());
    }
}
