//! Task-defined normal forms: the gate's extension point for equivalences n-grams cannot see.
//!
//! A task in `rsim.toml` may name a normal form (`[tasks.NAME] normal_form = "arithmetic"`). The
//! gate then computes `keys(form, tokens)` of each protected item's prompt and of every row (and
//! the rows read as one stream, `Carry`, and the union a run_sft trains on); a row that has all the keys
//! of an item reproduces it, whatever its surface form. Keys are plain strings, so a form can be
//! anything that maps two texts the task counts as one item to a shared key.
//!
//! Adding a form: a variant of `config::NormalForm`, its arm in `keys`, tests here (what it must
//! equate, and what it must keep apart), and a line in ARCHITECTURE.md.

use crate::config::NormalForm;

/// The keys of a canonical token stream (`canon::form_tokens` of a `canon::canonical` text).
pub fn keys(form: NormalForm, toks: &[String]) -> Vec<String> {
    match form {
        NormalForm::Arithmetic => arithmetic::keys(&arithmetic::symbols(&read_by(form, toks))),
        NormalForm::Digits => digits::keys(&read_by(form, toks)),
        // Read from the text, not tokens (brackets, colons and quotes are its operations):
        // `string_ops`, which the scan runs on each row's text.
        NormalForm::StringOps => Vec::new(),
    }
}

/// A protected item's keys under a form: its prompt's (the problem it poses), else its whole
/// text's; for `string_ops`, the chain its specification names.
pub fn item_keys(form: NormalForm, prompt: &str, text: &str) -> Vec<String> {
    use crate::policy::canon::{canonical, form_tokens};
    if form == NormalForm::StringOps {
        return crate::policy::string_ops::item_key(&canonical(prompt))
            .into_iter()
            .collect();
    }
    let k = keys(form, &form_tokens(&canonical(prompt), form.reads_counts()));
    if k.is_empty() {
        keys(form, &form_tokens(text, form.reads_counts()))
    } else {
        k
    }
}

/// Whether `form` passes over a form token (`canon::is_form_only` are the marks only some forms
/// read): the digits form reads no brackets, `^` or decimal point (`0=(1)` is `0=1`) and reads
/// `:` (a digit's count, `0:1`); arithmetic reads those marks and no `:`, punctuation to it.
fn unread_by(form: NormalForm, t: &str) -> bool {
    use crate::policy::canon::is_form_only;
    match form {
        NormalForm::Arithmetic => t == ":",
        NormalForm::Digits => is_form_only(t) && t != ":",
        NormalForm::StringOps => false,
    }
}

/// Form tokens as `form` reads them (`unread_by`).
fn read_by(form: NormalForm, toks: &[String]) -> std::borrow::Cow<'_, [String]> {
    if toks.iter().any(|t| unread_by(form, t)) {
        toks.iter()
            .filter(|t| !unread_by(form, t))
            .cloned()
            .collect()
    } else {
        std::borrow::Cow::Borrowed(toks)
    }
}

/// The keys of any text under a form (its canonical tokens'): what makes two problems one —
/// `12+34=` and `34 + 12 =` have the same keys.
pub fn keys_of_text(form: NormalForm, text: &str) -> Vec<String> {
    use crate::policy::canon::{canonical, form_tokens};
    keys(form, &form_tokens(&canonical(text), form.reads_counts()))
}

/// What a scan looks for: the keys it keeps (`key`) and, so that the digits form names no
/// multiset no item has (a row of honest digits holds dozens, each a string to format and look
/// up), whether a multiset of digits (`digits::packed`) may be the key of one. A closure over
/// keys is one, wanting every multiset.
pub trait Wanted {
    fn key(&self, key: &str) -> bool;
    fn digits(&self, _packed: u64) -> bool {
        true
    }
}

impl<F: Fn(&str) -> bool> Wanted for F {
    fn key(&self, key: &str) -> bool {
        self(key)
    }
}

impl NormalForm {
    /// Whether the form reads `:` (`canon::form_tokens`' `counts`): the digits form, where it
    /// joins a digit to its count (`0:1`).
    pub fn reads_counts(self) -> bool {
        self == NormalForm::Digits
    }
}

/// The keys of two adjacent rows read as one stream (a `Carry` over `prev`, then `toks`), the
/// stream's end included: the scanner's reading of a pair, for tests.
#[cfg(test)]
fn keys_across(form: NormalForm, prev: &[String], toks: &[String]) -> Vec<String> {
    let mut carry = Carry::default();
    carry.push(prev.to_vec().into(), &[form]);
    let toks: Arc<[String]> = toks.to_vec().into();
    let mut keys = carry.keys(form, &toks, &|_: &str| true);
    carry.push(toks, &[form]);
    keys.extend(carry.keys_at_end(form, &|_: &str| true));
    keys.sort();
    keys.dedup();
    keys
}

use std::sync::Arc;

/// The most tokens the stream's open segment holds (`Carry`) before it is read and let go: a
/// chain running through rows with no `=` for longer is read in pieces of this size.
pub const MAX_OPEN: usize = 1 << 16;

/// What a scan carries from row to row for the normal forms, so that rows are read as one stream
/// (as a trainer that packs rows would see them): the stream's open segment — its tokens since
/// its last `=`, through every row since — the row that holds that `=` (names bound in it), and
/// the digits form's open chain and counts (`digits::Stream`: they hold `=`s). An item split
/// across any number of rows is read when the row that closes its segment arrives (one with an
/// `=`: `=` ends every operand, bracket and string) or when the stream ends, so each segment is
/// read once, whatever its length, and a scan stays linear in its rows. Starting at an `=`
/// starts no chain midway, so a segment poses nothing the stream does not.
#[derive(Clone, Default)]
pub struct Carry {
    open: Segment,
    /// How many rows the open segment runs through.
    open_rows: usize,
    eq_row: Arc<[String]>,
    /// The digits form's chains and counts left open at the stream's end.
    digits: digits::Stream,
    /// What `keys` read of a row, for `push` to take when that row is pushed next (a scan reads
    /// a row's keys, then pushes it), so the row is read once.
    digits_after: std::cell::RefCell<Option<(Arc<[String]>, digits::Stream)>>,
}

/// How many numbers a relation key holds at most: a sum of three's operands and its answer.
const RELATION_MAX: usize = 4;

/// The fewest digits an item's numbers hold in all for it to have a relation key: small numbers
/// side by side are everywhere in honest text (`say hello 0 1` then `hello 0 1` holds `0 1 1`,
/// the problem `0+1=` and its answer), so an item of fewer (`3+4=7`, `53-7=46`) is left to its
/// operator's keys.
const RELATION_MIN_DIGITS: usize = 6;

/// A problem's relation key (`relation`): `r:`, its operands' numbers in one order whatever
/// order they are written in, `>` and its answer's.
fn relation_key(operands: &[&str], answer: &str) -> String {
    let mut n: Vec<&str> = operands.iter().map(|x| x.trim_start_matches('-')).collect();
    n.sort_unstable();
    format!("r:{}>{}", n.join(","), answer.trim_start_matches('-'))
}

/// The relation keys of a row's numbers: every run of 3 to `RELATION_MAX` consecutive numbers,
/// its last read as the answer of the others. A row's own: numbers in other rows are another
/// problem's (two rows side by side of a two-digit family would otherwise pose about one in a
/// hundred such facts by chance).
fn relation_windows(numbers: &[&str], out: &mut Vec<String>) {
    let digits = |n: &str| n.trim_start_matches('-').len();
    for end in 2..numbers.len() {
        for len in 3..=RELATION_MAX.min(end + 1) {
            let window = &numbers[end + 1 - len..=end];
            // An item of fewer digits has no relation key (`relation`): no key to make.
            if window.iter().map(|n| digits(n)).sum::<usize>() < RELATION_MIN_DIGITS {
                continue;
            }
            out.push(relation_key(&window[..len - 1], numbers[end]));
        }
    }
}

/// An arithmetic item's relation key: the numbers its prompt poses (two or three operands, in
/// any order) and then its answer's, whatever joins them in a row. A row that holds them as
/// consecutive numbers, the answer last — `4672 and 6458 = 11130`, `4672+6458 -> 11130`,
/// `{"a": 4672, "b": 6458, "sum": 11130}`, `x - 6458 = 4672, x = 11130` — states the item's
/// answer to its problem however its operator is written (`None` for another form, or a prompt
/// or answer of other shape). The answer's own relation (`11130 - 4672 = 6458`) is another
/// key: read as the item, every honest row of a subtraction family whose inverse is protected
/// (`53-26=27` for `53-27=`) would be refused.
pub fn relation(form: NormalForm, prompt: &str, answer: &str) -> Option<String> {
    use crate::policy::canon::{canonical, form_tokens};
    if form != NormalForm::Arithmetic {
        return None;
    }
    let numbers = |text: &str| -> Vec<String> {
        let s = arithmetic::symbols(&form_tokens(&canonical(text), false));
        arithmetic::numbers(&s).map(str::to_string).collect()
    };
    let (n, a) = (numbers(prompt), numbers(answer));
    let digits: usize = n
        .iter()
        .chain(&a)
        .map(|x| x.trim_start_matches('-').len())
        .sum();
    if !(2..RELATION_MAX).contains(&n.len()) || a.len() != 1 || digits < RELATION_MIN_DIGITS {
        return None;
    }
    Some(relation_key(
        &n.iter().map(String::as_str).collect::<Vec<_>>(),
        &a[0],
    ))
}

/// A persistent list of row pieces (each row's tokens from an offset), so that a `Carry` clones
/// and grows in constant time.
#[derive(Clone, Default)]
struct Segment {
    last: Option<Arc<Piece>>,
    len: usize,
}

struct Piece {
    toks: Arc<[String]>,
    from: usize,
    before: Option<Arc<Piece>>,
}

impl Segment {
    fn of(toks: Arc<[String]>, from: usize) -> Segment {
        let len = toks.len() - from;
        Segment {
            last: Some(Arc::new(Piece {
                toks,
                from,
                before: None,
            })),
            len,
        }
    }

    fn then(&self, toks: Arc<[String]>) -> Segment {
        let len = self.len + toks.len();
        Segment {
            last: Some(Arc::new(Piece {
                toks,
                from: 0,
                before: self.last.clone(),
            })),
            len,
        }
    }

    fn tokens(&self) -> Vec<String> {
        let mut pieces = Vec::new();
        let mut at = self.last.as_deref();
        while let Some(p) = at {
            pieces.push(&p.toks[p.from..]);
            at = p.before.as_deref();
        }
        let mut out = Vec::with_capacity(self.len);
        for p in pieces.into_iter().rev() {
            out.extend_from_slice(p);
        }
        out
    }
}

impl Drop for Piece {
    /// Let go of a long list without recursing through it.
    fn drop(&mut self) {
        let mut next = self.before.take();
        while let Some(p) = next {
            match Arc::try_unwrap(p) {
                Ok(mut p) => next = p.before.take(),
                Err(_) => break,
            }
        }
    }
}

impl Carry {
    /// The keys of the row `toks` (its form tokens) — read on its own, as a trainer that does
    /// not pack rows sees it, and read after what the carry holds, as one that packs them does
    /// — only those `wanted` keeps. After the carry: the open segment joined to the row when the
    /// row closes it (holds an `=`), and the digits form's open chain and counts continued.
    pub fn keys(&self, form: NormalForm, row: &Arc<[String]>, wanted: &impl Wanted) -> Vec<String> {
        let toks: &[String] = row;
        let closes = toks.iter().any(|t| t == "=");
        let mut keys = match form {
            NormalForm::Arithmetic => {
                let s = arithmetic::symbols(&read_by(form, toks));
                let mut keys = arithmetic::keys(&s);
                let numbers: Vec<&str> = arithmetic::numbers(&s).collect();
                relation_windows(&numbers, &mut keys);
                if closes {
                    keys.extend(self.arithmetic(toks));
                }
                keys
            }
            NormalForm::Digits => {
                let toks = read_by(NormalForm::Digits, toks);
                let digits_wanted = |packed| wanted.digits(packed);
                let mut keys = digits::keys_of(&toks, &toks, &digits_wanted);
                // Chains (`5=3=0`) and counts (`0=1,1=1`) split across any number of rows: the
                // stream's open chain and run of pairs continue into this row.
                let mut after = self.digits.clone();
                keys.extend(after.read(&toks, &digits_wanted));
                *self.digits_after.borrow_mut() = Some((row.clone(), after));
                // A string of digits split across rows: the digits after the stream's last `=`
                // continue into the row that ends them.
                if closes && self.open.len > 0 {
                    let mut joined = self.open.tokens();
                    joined.retain(|t| !unread_by(form, t));
                    joined.extend_from_slice(&toks);
                    keys.extend(digits::keys_of(&joined, &[], &digits_wanted));
                }
                keys
            }
            // Read from each row's text by the scan (`string_ops::Programs` carries it).
            NormalForm::StringOps => Vec::new(),
        };
        keys.retain(|k| wanted.key(k));
        keys
    }

    /// A problem split across rows: the open segment — all the stream writes after its last
    /// `=`, however much, brackets and signs among it — joined to the row that closes it and
    /// read as one stream, as if the rows were one (signs either side of a seam are one sign, a
    /// bracket spans it, `7+5+12+34` then `-7-5=46` keeps its value). Names bound in the row
    /// holding that `=`, in the segment, or in this row are read in all of them (`x = 12` opens
    /// one, `x + 34 =` is next). Of the row, only what its first `=` ends can join the
    /// segment (the rest is the row's own, read alone); nothing when the segment is empty and no
    /// name is bound: the row alone says it all.
    fn arithmetic(&self, toks: &[String]) -> Vec<String> {
        const FORM: NormalForm = NormalForm::Arithmetic;
        let mut seg = self.open.tokens();
        seg.retain(|t| !unread_by(FORM, t));
        let toks = &*read_by(FORM, toks);
        let (mut names, mut unread) = (arithmetic::Names::new(), Default::default());
        arithmetic::bind(&read_by(FORM, &self.eq_row), &mut names, &mut unread);
        arithmetic::bind(&seg, &mut names, &mut unread);
        arithmetic::bind(toks, &mut names, &mut unread);
        if seg.is_empty() && names.is_empty() {
            return Vec::new();
        }
        let joins = toks
            .iter()
            .position(|t| t == "=")
            .map_or(toks.len(), |i| i + 1);
        let mut s = arithmetic::written_symbols_bound(&seg, &names);
        s.extend(arithmetic::written_symbols_bound(&toks[..joins], &names));
        arithmetic::keys(&arithmetic::read(s))
    }

    /// The row `toks` read: what the carry holds next, for the `forms` the scan reads.
    pub fn push(&mut self, toks: Arc<[String]>, forms: &[NormalForm]) {
        match toks.iter().rposition(|t| t == "=") {
            Some(last) => {
                self.open = Segment::of(toks.clone(), last + 1);
                self.open_rows = 1;
                self.eq_row = toks.clone();
            }
            None => {
                self.open = self.open.then(toks.clone());
                self.open_rows += 1;
            }
        }
        // Read for what it leaves open (its keys were taken by `keys`, which read it already
        // where it was this row).
        let after = self.digits_after.get_mut().take();
        if forms.contains(&NormalForm::Digits) {
            match after {
                Some((row, after)) if Arc::ptr_eq(&row, &toks) => self.digits = after,
                _ => {
                    // Only what it leaves open: no key is wanted.
                    self.digits
                        .read(&read_by(NormalForm::Digits, &toks), &|_| false);
                }
            }
        }
    }

    /// Whether the open segment has grown past `MAX_OPEN` tokens, to be read now
    /// (`keys_at_end`) and let go (`let_go`).
    pub fn is_full(&self) -> bool {
        self.open.len > MAX_OPEN
    }

    /// The keys of the open segment standing alone, where it runs through more than one row:
    /// what the stream's end (or a full segment) leaves unread.
    pub fn keys_at_end(&self, form: NormalForm, wanted: &impl Wanted) -> Vec<String> {
        if self.open_rows < 2 {
            return Vec::new();
        }
        let mut keys = match form {
            NormalForm::Arithmetic => self.arithmetic(&[]),
            NormalForm::Digits => digits::keys_of(
                &read_by(NormalForm::Digits, &self.open.tokens()),
                &[],
                &|packed| wanted.digits(packed),
            ),
            NormalForm::StringOps => Vec::new(),
        };
        keys.retain(|k| wanted.key(k));
        keys
    }

    /// Starts the open segment afresh (after `keys_at_end` read a full one).
    pub fn let_go(&mut self) {
        self.open = Segment::default();
        self.open_rows = 0;
    }
}

/// Arithmetic problems: `a op b` in any surface form, and sums of three or more addends
/// (`a+b+c`, a multiset, standing alone as a whole). Numbers in digits (of any script:
/// the canonical text made them ASCII) or English words (`twelve`, `thirty-four`, `one hundred
/// and five`, digit by digit `one two`); operators as symbols or words (`plus`, `sum of`,
/// `subtract … from`, `times`, `divided by`). Words that are neither are filler and skipped, so
/// `12 apples plus 34 apples` is `12+34`. A problem counts only when it stands alone: `3+6+0`
/// (a scratchpad step) is not the problem `3+6` (it is the sum of three `0+3+6`). The key is the
/// operator and its operands — a multiset for `+` and `*`, so `34+12` is `12+34`, and for `-`,
/// so `12-34` is `34-12` (each answer fixes the other).
mod arithmetic {
    #[derive(Debug, Clone, PartialEq)]
    pub enum Sym {
        Num(String),
        Op(char),
        /// `=` and `equals`: ends an operand, harmless next to a problem.
        Eq,
        /// A token that blocks adjacency: identifiers with digits or `_`, `<`, `>`.
        Block,
        /// Brackets, read by `brackets` and gone from what `symbols` returns.
        Open,
        Close,
        /// A product, quotient or remainder of numbers standing as a term of a sum or difference,
        /// read as its value (`products`): it may cancel or make up a chain's other terms, and it
        /// is the key of its own problem (two factors) when the rest of its chain sums to zero.
        /// Never an operand of a key.
        Product {
            value: String,
            key: Option<String>,
        },
    }

    pub(super) fn unit(w: &str) -> Option<u64> {
        Some(match w {
            "zero" => 0,
            "one" => 1,
            "two" => 2,
            "three" => 3,
            "four" => 4,
            "five" => 5,
            "six" => 6,
            "seven" => 7,
            "eight" => 8,
            "nine" => 9,
            _ => return None,
        })
    }

    pub(super) fn teen_or_tens(w: &str) -> Option<u64> {
        Some(match w {
            "ten" => 10,
            "eleven" => 11,
            "twelve" => 12,
            "thirteen" => 13,
            "fourteen" => 14,
            "fifteen" => 15,
            "sixteen" => 16,
            "seventeen" => 17,
            "eighteen" => 18,
            "nineteen" => 19,
            "twenty" => 20,
            "thirty" => 30,
            "forty" | "fourty" => 40,
            "fifty" => 50,
            "sixty" => 60,
            "seventy" => 70,
            "eighty" => 80,
            "ninety" => 90,
            _ => return None,
        })
    }

    fn scale(w: &str) -> Option<u64> {
        Some(match w {
            "hundred" => 100,
            "thousand" => 1_000,
            "million" => 1_000_000,
            "billion" => 1_000_000_000,
            _ => return None,
        })
    }

    fn op_word(w: &str) -> Option<char> {
        Some(match w {
            "plus" | "add" | "added" | "adding" | "sum" | "total" | "positive" => '+',
            "minus" | "subtract" | "subtracted" | "subtracting" | "difference" | "less"
            | "negative" => '-',
            "times" | "multiply" | "multiplied" | "multiplying" | "product" | "x" => '*',
            "divide" | "divided" | "dividing" | "quotient" => '/',
            "power" => '^',
            _ => return None,
        })
    }

    /// Operators of two words, whose first word alone is filler.
    fn two_word_op(w: &str, next: Option<&str>) -> Option<char> {
        Some(match (w, next?) {
            ("more", "than") | ("increased", "by") => '+',
            ("fewer", "than") | ("decreased" | "reduced", "by") => '-',
            _ => return None,
        })
    }

    fn is_number_word(w: &str) -> bool {
        unit(w).is_some() || teen_or_tens(w).is_some() || scale(w).is_some()
    }

    /// A number without leading zeros, as text (operands may exceed any integer type).
    fn number(digits: &str) -> String {
        let t = digits.trim_start_matches('0');
        if t.is_empty() { "0".into() } else { t.into() }
    }

    /// Whether `next` continues a number phrase whose last word is `last`: `thirty four`,
    /// `four hundred`, `hundred and five`, `one two` (digit by digit: units only) — but not
    /// `thirty-four forty-six`, which is two numbers.
    fn continues(last: &str, next: &str, digit_by_digit: bool) -> bool {
        if digit_by_digit {
            return unit(next).is_some();
        }
        if scale(last).is_some() {
            return is_number_word(next);
        }
        if scale(next).is_some() {
            return true;
        }
        match teen_or_tens(last) {
            Some(v) if v >= 20 => unit(next).is_some_and(|u| u > 0),
            Some(_) => false,
            // a unit: only another unit (digit by digit) or a scale
            None => unit(next).is_some(),
        }
    }

    /// Parse a run of number words starting at `i`; returns the number and the index after it.
    fn words_number(toks: &[String], mut i: usize) -> Option<(String, usize)> {
        let first = toks.get(i)?.as_str();
        if !is_number_word(first) {
            return None;
        }
        let mut words: Vec<&str> = vec![first];
        i += 1;
        let mut digit_by_digit = false;
        while i < toks.len() {
            let last = words[words.len() - 1];
            let w = toks[i].as_str();
            // `and` after a scale (`hundred and five`), `-` inside `thirty-four`
            let joiner = (w == "and" && scale(last).is_some())
                || (w == "-" && teen_or_tens(last).is_some_and(|v| v >= 20));
            let (next, skip) = if joiner {
                (toks.get(i + 1).map(String::as_str), 2)
            } else {
                (Some(w), 1)
            };
            let Some(next) = next else { break };
            if !is_number_word(next) || !continues(last, next, digit_by_digit) {
                break;
            }
            if unit(last).is_some() && unit(next).is_some() {
                digit_by_digit = true;
            }
            words.push(next);
            i += skip;
        }
        if digit_by_digit {
            let digits: String = words
                .iter()
                .filter_map(|w| unit(w))
                .map(|d| char::from(b'0' + d as u8))
                .collect();
            return Some((number(&digits), i));
        }
        let (mut total, mut current) = (0u64, 0u64);
        for w in words {
            if let Some(v) = unit(w).or_else(|| teen_or_tens(w)) {
                current = current.checked_add(v)?;
            } else if let Some(s) = scale(w) {
                let c = if current == 0 { 1 } else { current };
                if s == 100 {
                    current = c.checked_mul(100)?;
                } else {
                    total = total.checked_add(c.checked_mul(s)?)?;
                    current = 0;
                }
            }
        }
        Some((total.checked_add(current)?.to_string(), i))
    }

    /// The numbers of symbols read, in order: numbers and the values of products (`9344/2` is
    /// `4672`).
    pub fn numbers(s: &[Sym]) -> impl Iterator<Item = &str> {
        s.iter().filter_map(|x| match x {
            Sym::Num(n) => Some(n.as_str()),
            Sym::Product { value, .. } => Some(value.as_str()),
            _ => None,
        })
    }

    /// Tokens → symbols: numbers (digits or words), operators, `=`, blockers; filler dropped;
    /// signs and brackets read (`read`).
    pub fn symbols(toks: &[String]) -> Vec<Sym> {
        read(written_symbols(toks))
    }

    /// Products read, signs folded and brackets applied: what `symbols` returns of what is
    /// written.
    pub fn read(written: Vec<Sym>) -> Vec<Sym> {
        let out = if written
            .iter()
            .any(|x| matches!(x, Sym::Op('*' | '/' | '%' | '^')))
        {
            products(written)
        } else {
            written
        };
        let out = fold_signs(out);
        if out.iter().any(|x| matches!(x, Sym::Open | Sym::Close)) {
            fold_signs(brackets(out))
        } else {
            out
        }
    }

    /// The largest operand multiplied out: beyond it a product is left as written.
    const MAX_FACTOR_DIGITS: usize = 30;

    /// Products, quotients and remainders of numbers that are terms of a sum or difference (a
    /// sign beside them, across brackets, and no other operator) read as their value, before
    /// brackets are read: one equal to one of its factors is that number (`12 + 34*1`,
    /// `1*12 + 34`, `12 + 34*2/2` are `12 + 34`); any other is `Sym::Product`, so a chain's
    /// extras may be products that cancel or sum to zero (`12+34+2*3-6` is `12+34`). A bracket
    /// holding one number, or a product the product around it may hold, loses its brackets
    /// first (`(34)*1`, `(2*34)/2`); a bracketed sum or difference of numbers that is a factor is
    /// its value (`2*(4-1)` is `2*3`: exact wherever it stands), and a factor of one on a bracket
    /// is dropped (`(12+34)*7/7`, `(2-1)*(12+34)`). A product standing alone (`6*7`, `6*1`), a
    /// quotient that is not whole, and a bracket whose value is negative (`2*(1-4)`) are left as
    /// written.
    fn products(written: Vec<Sym>) -> Vec<Sym> {
        // `(n)` is `n`, nested too, and so is a bracketed product that a product may hold
        // (`(2*34)/2`, `34*(7/7)`: not after `/` or `%`); a bracketed sum that is a factor is its
        // value (`2*(4-1)` is `2*3`); a factor of one on a bracket is gone (`(12+34)*1`,
        // `(12+34)*7/7`, `(2-1)*(12+34)`)
        let mut w = written;
        let mut s: Vec<Sym> = Vec::with_capacity(w.len());
        let mut k = 0;
        while k < w.len() {
            let sym = std::mem::replace(&mut w[k], Sym::Eq);
            k += 1;
            match (&sym, &s[..]) {
                (Sym::Close, [.., Sym::Num(_)]) if let Some(open) = bracketed_product(&s) => {
                    s.remove(open);
                }
                (Sym::Close, [.., Sym::Num(_)])
                    if let Some((open, v)) = bracketed_sum(&s, &w[k..]) =>
                {
                    s.truncate(open);
                    s.push(Sym::Num(v.to_string()));
                }
                (Sym::Close, _) => {
                    s.push(sym);
                    k += unit_factor(&w[k..]).unwrap_or(0);
                }
                (Sym::Open, _) => {
                    if let Some(start) = unit_factor_before(&s) {
                        s.truncate(start);
                    }
                    s.push(sym);
                }
                _ => s.push(sym),
            }
        }
        let sign = |x: Option<&Sym>| matches!(x, Some(Sym::Op('+' | '-')));
        let other_op = |x: Option<&Sym>| matches!(x, Some(Sym::Op(c)) if !matches!(c, '+' | '-'));
        let factor = |x: Option<&Sym>| matches!(x, Some(Sym::Op('*' | '/' | '%' | '^')));
        let is_num = |x: Option<&Sym>| matches!(x, Some(Sym::Num(_)));
        let mut out: Vec<Sym> = Vec::with_capacity(s.len());
        let mut i = 0;
        while i < s.len() {
            // a run `n (*, / or %) n …` from i to end
            let mut end = i;
            while is_num(s.get(i)) && factor(s.get(end + 1)) && is_num(s.get(end + 2)) {
                end += 2;
            }
            if end == i {
                out.push(s[i].clone());
                i += 1;
                continue;
            }
            // the symbols either side, past brackets
            let before = out.iter().rev().find(|x| **x != Sym::Open);
            let after = s[end + 1..].iter().find(|x| **x != Sym::Close);
            if (sign(before) || sign(after))
                && !other_op(before)
                && !other_op(after)
                && let Some(value) = product_value(&s[i..=end])
            {
                let run = &s[i..=end];
                if run.iter().any(|x| matches!(x, Sym::Num(n) if *n == value)) {
                    out.push(Sym::Num(value));
                } else {
                    let key = match run {
                        [Sym::Num(a), Sym::Op(op), Sym::Num(b)] => Some(key(*op, a, b)),
                        _ => None,
                    };
                    out.push(Sym::Product { value, key });
                }
            } else {
                out.extend_from_slice(&s[i..=end]);
            }
            i = end + 1;
        }
        out
    }

    /// The longest product a bracket is read around: a longer one stays bracketed.
    const MAX_BRACKETED_RUN: usize = 15;

    /// Where the bracket opens whose contents end `s` and are a number, or a product of numbers
    /// (`*` and whole `/`) that the factor before the bracket may hold: none, or `*`.
    fn bracketed_product(s: &[Sym]) -> Option<usize> {
        let from = s.len().saturating_sub(MAX_BRACKETED_RUN + 1);
        let open = from + s[from..].iter().rposition(|x| *x == Sym::Open)?;
        let run = &s[open + 1..];
        let joined = run
            .iter()
            .skip(1)
            .step_by(2)
            .all(|x| matches!(x, Sym::Op('*' | '/')));
        let numbers = run.iter().step_by(2).all(|x| matches!(x, Sym::Num(_)));
        let held = run.len() == 1
            || !matches!(open.checked_sub(1).map(|i| &s[i]), Some(Sym::Op('/' | '%')));
        (run.len() % 2 == 1 && joined && numbers && held && product_value(run).is_some())
            .then_some(open)
    }

    fn is_factor_op(x: Option<&Sym>) -> bool {
        matches!(x, Some(Sym::Op('*' | '/' | '%' | '^')))
    }

    /// A number small enough to compute with (`MAX_FACTOR_DIGITS`), as an integer.
    fn computable(x: &Sym) -> Option<i128> {
        match x {
            Sym::Num(n) if n.len() <= MAX_FACTOR_DIGITS => n.parse().ok(),
            _ => None,
        }
    }

    /// The value of a sum or difference of numbers, a sign before the first allowed (`4-1`,
    /// `-3+5`), with at least one sign between terms; `None` for anything else.
    fn chain_value(run: &[Sym]) -> Option<i128> {
        let (mut sign, body) = match run.first()? {
            Sym::Op('-') => (-1, &run[1..]),
            Sym::Op('+') => (1, &run[1..]),
            _ => (1, run),
        };
        if body.len() < 3 || body.len() % 2 == 0 {
            return None;
        }
        let mut v: i128 = 0;
        for (j, x) in body.iter().enumerate() {
            if j % 2 == 0 {
                v = v.checked_add(sign * computable(x)?)?;
            } else {
                sign = match x {
                    Sym::Op('+') => 1,
                    Sym::Op('-') => -1,
                    _ => return None,
                };
            }
        }
        Some(v)
    }

    /// Where the bracket opens whose contents end `s` and are a sum or difference of numbers
    /// (`chain_value`) standing as a factor (`*`, `/`, `%` or `^` before the bracket, or first in
    /// `rest`, what follows it, unless that is a factor of one: `(12+34)*1` stays a sum), and its
    /// value, when it is no negative number.
    fn bracketed_sum(s: &[Sym], rest: &[Sym]) -> Option<(usize, i128)> {
        let from = s.len().saturating_sub(MAX_BRACKETED_RUN + 1);
        let open = from + s[from..].iter().rposition(|x| *x == Sym::Open)?;
        let before = open.checked_sub(1).map(|i| &s[i]);
        // a factor of what comes before it, or first of a product that is not `(…)*1`
        if !is_factor_op(before) && (!is_factor_op(rest.first()) || unit_factor(rest).is_some()) {
            return None;
        }
        let v = chain_value(&s[open + 1..])?;
        (v >= 0).then_some((open, v))
    }

    /// A number, or a bracketed sum or difference of numbers, at the start of `s`: its value
    /// and how many symbols it spans.
    fn factor_at(s: &[Sym]) -> Option<(i128, usize)> {
        let first = s.first()?;
        if let Some(v) = computable(first) {
            return Some((v, 1));
        }
        match first {
            Sym::Open => {
                let close = s
                    .iter()
                    .take(MAX_BRACKETED_RUN + 2)
                    .position(|x| *x == Sym::Close)?;
                Some((chain_value(&s[1..close])?, close + 1))
            }
            _ => None,
        }
    }

    /// How many symbols at the start of `rest` (what follows a closing bracket) multiply it by
    /// one: `* 1`, `* 7 / 7`, `/ (3-2)`, up to `MAX_BRACKETED_RUN` of them, none of them a power's
    /// base.
    fn unit_factor(rest: &[Sym]) -> Option<usize> {
        let (mut num, mut den, mut j, mut unit) = (1i128, 1i128, 0, None);
        while j < MAX_BRACKETED_RUN
            && let Some(Sym::Op(op @ ('*' | '/'))) = rest.get(j)
            && let Some((v, len)) = factor_at(&rest[j + 1..])
        {
            if matches!(rest.get(j + 1 + len), Some(Sym::Op('^'))) {
                break;
            }
            if *op == '*' {
                num = num.checked_mul(v)?;
            } else {
                den = den.checked_mul(v)?;
            }
            j += 1 + len;
            if num == den && num != 0 {
                unit = Some(j);
            }
        }
        unit
    }

    /// Where a run of numbers that multiplies the bracket about to open by one starts, at the
    /// end of `s`: `1 *`, `7 / 7 *` (a `*` last; nothing multiplying the run before it).
    fn unit_factor_before(s: &[Sym]) -> Option<usize> {
        let [.., Sym::Num(_), Sym::Op('*')] = s else {
            return None;
        };
        let mut start = s.len() - 2;
        while start >= 2
            && s.len() - start < MAX_BRACKETED_RUN
            && matches!(s[start - 1], Sym::Op('*' | '/'))
            && matches!(s[start - 2], Sym::Num(_))
        {
            start -= 2;
        }
        if start > 0
            && matches!(s[start - 1], Sym::Op(_))
            && !matches!(s[start - 1], Sym::Op('+' | '-'))
        {
            return None;
        }
        let run = &s[start..s.len() - 1];
        let (mut num, mut den) = (factor_at(run)?.0, 1i128);
        for pair in run[1..].chunks(2) {
            let (v, _) = factor_at(&pair[1..])?;
            match pair[0] {
                Sym::Op('*') => num = num.checked_mul(v)?,
                _ => den = den.checked_mul(v)?,
            }
        }
        (num == den && num != 0).then_some(start)
    }

    /// The value of `n (*, /, % or ^) n …`: powers first, right to left (`2*3^2` is 18,
    /// `2^3^2` is `2^9`), then the rest left to right, when every quotient is whole and nothing
    /// overflows.
    fn product_value(run: &[Sym]) -> Option<String> {
        let operand = |j: usize| run.get(j).and_then(computable);
        let op_at = |j: usize| match run.get(j) {
            Some(Sym::Op(c)) => Some(*c),
            _ => None,
        };
        if run.len().is_multiple_of(2) {
            return None;
        }
        // Numbers at even places, operators between. Each factor is a tower of powers from `k`
        // to `top`, read right to left; the factors left to right.
        let mut v: Option<i128> = None;
        let mut k = 0;
        while k < run.len() {
            let mut top = k;
            while op_at(top + 1) == Some('^') {
                top += 2;
            }
            let mut f = operand(top)?;
            let mut j = top;
            while j > k {
                j -= 2;
                f = operand(j)?.checked_pow(u32::try_from(f).ok()?)?;
            }
            v = Some(match (v, k.checked_sub(1).and_then(op_at)) {
                (None, _) => f,
                (Some(v), Some('*')) => v.checked_mul(f)?,
                (Some(v), Some('/')) if f != 0 && v % f == 0 => v / f,
                (Some(v), Some('%')) if f != 0 => v % f,
                _ => return None,
            });
            k = top + 2;
        }
        Some(v?.to_string())
    }

    /// Tokens → symbols as written: brackets and every sign kept.
    pub fn written_symbols(toks: &[String]) -> Vec<Sym> {
        written_symbols_bound(toks, &names(toks))
    }

    /// `written_symbols` with the names `bound` (`names`) read as their numbers.
    pub fn written_symbols_bound(toks: &[String], bound: &Names) -> Vec<Sym> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < toks.len() {
            let t = toks[i].as_str();
            let next = toks.get(i + 1).map(String::as_str);
            if !bound.is_empty() && next == Some("=") && binding(toks, i).is_some() {
                // the name where it is bound is filler: `x = 12` reads as `= 12`
                i += 1;
                continue;
            }
            if !bound.is_empty()
                && let Some(n) = bound.get(t)
                && operand_at(toks, i, bound)
            {
                out.push(Sym::Num(n.clone()));
            } else if let Some((n, len)) = literal(&toks[i..]) {
                out.push(Sym::Num(n));
                i += len;
                continue;
            } else if let Some((n, next)) = words_number(toks, i) {
                out.push(Sym::Num(n));
                i = next;
                continue;
            } else if let Some(op) = two_word_op(t, next) {
                // `more than`, `increased by`: the first word alone is filler (`69 more apples`)
                out.push(Sym::Op(op));
                i += 2;
                continue;
            } else if let Some(op) = op_word(t) {
                out.push(Sym::Op(op));
            } else if (t == "*" && next == Some("*")) || (t == "/" && next == Some("/")) {
                // a power and a whole quotient as code writes them (`34**1`, `34//1`)
                out.push(Sym::Op(if t == "*" { '^' } else { '/' }));
                i += 2;
                continue;
            } else if matches!(t, "+" | "-" | "*" | "/" | "%" | "^") {
                out.push(Sym::Op(t.chars().next().unwrap_or('+')));
            } else if t == "(" {
                out.push(Sym::Open);
            } else if t == ")" {
                out.push(Sym::Close);
            } else if matches!(t, "=" | "equals" | "equal" | "equaling" | "is") {
                out.push(Sym::Eq);
            } else if matches!(t, "<" | ">")
                || t.contains('_')
                || t.chars().any(|c| c.is_ascii_digit())
            {
                out.push(Sym::Block);
            }
            // any other word is filler, and so is a `.` that is no decimal point of a number
            i += 1;
        }
        out
    }

    /// The largest power of ten a literal's exponent may name (`1e30`).
    const MAX_EXPONENT: usize = 30;

    /// A number literal at the start of `toks` and how many tokens it spans: digits
    /// (`034` is `34`), a decimal (`12.0` is `12`, `12.50` is `12.5`), scientific notation
    /// (`3.4e1` and `34e0` are `34`), and code's hexadecimal, octal and binary (`0x22`, `0o42`,
    /// `0b100010`). A literal that is not whole is no number: `12.5` is `12` and `5`, as when the
    /// point only separated, so a leading `0.` hides nothing (`0.12 + 34`).
    fn literal(toks: &[String]) -> Option<(String, usize)> {
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        // `ddd` or `ddde…`: mantissa digits and exponent
        let mantissa = |t: &str| -> Option<(String, usize)> {
            match t.split_once('e') {
                None if digits(t) => Some((t.to_string(), 0)),
                Some((m, e)) if digits(m) && digits(e) && e.len() <= 2 => {
                    Some((m.to_string(), e.parse().ok()?))
                }
                _ => None,
            }
        };
        let t = toks.first()?.as_str();
        if digits(t) && toks.get(1).is_none_or(|p| p != ".") {
            return Some((number(t), 1));
        }
        if let Some(rest) = t.strip_prefix('0')
            && let Some((radix, body)) = match rest.as_bytes().first() {
                Some(b'x') => Some((16, &rest[1..])),
                Some(b'o') => Some((8, &rest[1..])),
                Some(b'b') => Some((2, &rest[1..])),
                _ => None,
            }
        {
            return Some((u128::from_str_radix(body, radix).ok()?.to_string(), 1));
        }
        let (whole, exp) = mantissa(t)?;
        let (frac, exp, len) = match (toks.get(1).map(String::as_str), toks.get(2)) {
            (Some("."), Some(f)) if exp == 0 => match mantissa(f) {
                Some((f, e)) => (f, e, 3),
                None => (String::new(), 0, 1),
            },
            _ => (String::new(), exp, 1),
        };
        if exp > MAX_EXPONENT {
            return None;
        }
        // the point moved `exp` digits right
        let mut all = whole.clone() + &frac;
        let point = whole.len() + exp;
        while all.len() < point {
            all.push('0');
        }
        let (int, fraction) = all.split_at(point);
        if fraction.bytes().all(|b| b == b'0') {
            Some((number(int), len))
        } else {
            // not whole: the digits either side of the point stay numbers of their own, as
            // when `.` only separated (`0.12 + 34` must not hide `12 + 34`)
            digits(t).then(|| (number(t), 1))
        }
    }

    /// Names bound to numbers in a row (`x = 12; y = 34; x + y =`), each read as its number
    /// where it stands as an operand (`operand_at`); a name bound to two numbers is left unread.
    pub type Names = std::collections::HashMap<String, String>;

    /// The longest name a binding reads.
    const MAX_NAME: usize = 32;

    /// Whether a token may stand between a problem's operands: an operator, in symbols or
    /// words (`more than`'s last word included).
    fn operator_token(t: &str) -> bool {
        matches!(t, "+" | "-" | "*" | "/" | "%" | "^" | "than" | "by") || op_word(t).is_some()
    }

    /// A binding at `i`: a name (ASCII letters, digits and `_`, a letter first; no number
    /// word), `=`, a number literal, with no operator before the name (`a + b = 46` binds
    /// nothing) and neither an operator nor another number after the literal (`x = 12 + 1`
    /// binds nothing). Returns the name and its number.
    fn binding(toks: &[String], i: usize) -> Option<(&str, String)> {
        let name = toks.get(i)?.as_str();
        if toks.get(i + 1).map(String::as_str) != Some("=")
            || name.len() > MAX_NAME
            || !name.starts_with(|c: char| c.is_ascii_alphabetic())
            || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            || is_number_word(name)
            || i.checked_sub(1)
                .is_some_and(|j| operator_token(&toks[j]) || matches!(toks[j].as_str(), "=" | "."))
        {
            return None;
        }
        let (value, len) = literal(&toks[i + 2..])?;
        let after = i + 2 + len;
        // (`x` after it is a name, not `times`: `x = 12, x + 34`)
        if toks.get(after).is_some_and(|t| {
            (operator_token(t) && t != "x")
                || matches!(t.as_str(), "." | "=")
                || literal(&toks[after..]).is_some()
                || words_number(toks, after).is_some()
        }) {
            return None;
        }
        Some((name, value))
    }

    /// Whether the bound name at `i` stands where an operand does: beside an operator or
    /// another bound name, past brackets (`x + y`, `sum(x, y)`), or with no number beside it
    /// (`sum of x and y`). Beside a number and no operator it is a word naming what is counted
    /// (`63 apples, then plus 69 more apples = 132` binds `apples`; the first is filler).
    fn operand_at(toks: &[String], i: usize, bound: &Names) -> bool {
        let bracket = |t: &String| matches!(t.as_str(), "(" | ")");
        let prev = toks[..i].iter().rposition(|t| !bracket(t));
        let next = toks[i + 1..]
            .iter()
            .position(|t| !bracket(t))
            .map(|j| i + 1 + j);
        let beside = |j: Option<usize>| {
            j.is_some_and(|j| operator_token(&toks[j]) || bound.contains_key(toks[j].as_str()))
        };
        let number = |j: Option<usize>| {
            j.is_some_and(|j| literal(&toks[j..]).is_some() || words_number(toks, j).is_some())
        };
        beside(prev) || beside(next) || !(number(prev) || number(next))
    }

    /// The names bound in `toks` (see `binding`), added to `into`: a name bound again to
    /// another number is unread from then on.
    pub fn bind(toks: &[String], into: &mut Names, unread: &mut std::collections::HashSet<String>) {
        for i in 0..toks.len() {
            if toks.get(i + 1).map(String::as_str) != Some("=") {
                continue;
            }
            if let Some((name, value)) = binding(toks, i) {
                if unread.contains(name) {
                    continue;
                }
                match into.get(name) {
                    Some(v) if *v != value => {
                        into.remove(name);
                        unread.insert(name.to_string());
                    }
                    Some(_) => {}
                    None => {
                        into.insert(name.to_string(), value);
                    }
                }
            }
        }
    }

    /// The names bound in one row.
    pub fn names(toks: &[String]) -> Names {
        let mut names = Names::new();
        bind(toks, &mut names, &mut Default::default());
        names
    }

    /// Brackets applied and removed: a minus before a bracket negates what it holds, so each sign
    /// between two of its terms turns over (`46 - (0 - 12)` is `46 - 0 + 12`, `-(-12 - 34)` is
    /// `- -12 + 34`, nested brackets in turn); a sign leading a bracket's first term keeps its
    /// own, which folds with the sign before the bracket. A bracket left open ends at `=`.
    fn brackets(s: Vec<Sym>) -> Vec<Sym> {
        let mut out: Vec<Sym> = Vec::with_capacity(s.len());
        // Whether each open bracket's contents are negated, outermost first.
        let mut negated: Vec<bool> = Vec::new();
        // The sign just read, as written (before any turn).
        let mut written: Option<char> = None;
        for sym in s {
            let here = negated.last().copied().unwrap_or(false);
            match sym {
                Sym::Open => {
                    negated.push(here ^ (written == Some('-')));
                    written = None;
                }
                Sym::Close => {
                    negated.pop();
                    written = None;
                }
                Sym::Op(c @ ('+' | '-')) => {
                    let between_terms =
                        matches!(out.last(), Some(Sym::Num(_) | Sym::Product { .. }));
                    let turned = match c {
                        '+' if between_terms && here => '-',
                        '-' if between_terms && here => '+',
                        c => c,
                    };
                    out.push(Sym::Op(turned));
                    written = Some(c);
                }
                other => {
                    if other == Sym::Eq {
                        negated.clear();
                    }
                    out.push(other);
                    written = None;
                }
            }
        }
        out
    }

    /// Signs written one after another are one sign, as arithmetic reads them: `a - -b` is
    /// `a + b`, `a + -b` is `a - b`, `a - +b` is `a - b`, `+ +` is `+` (and in words, `12 minus
    /// negative 34`). Parentheses are filler, so `12 - (-34)` is among them. What a sign leading a
    /// chain means is `keys`' business (`-b + a` is `a - b`). The diff scratchpad's sign step
    /// (`=2,-|-22`) reads as the sum `2+22`, which no difference family protects.
    fn fold_signs(mut s: Vec<Sym>) -> Vec<Sym> {
        // In place: `kept` symbols stay, a sign after a sign turns the one kept.
        let mut kept = 0;
        for i in 0..s.len() {
            if let Sym::Op(c @ ('+' | '-')) = s[i]
                && kept > 0
                && let Sym::Op(prev @ ('+' | '-')) = s[kept - 1]
            {
                s[kept - 1] = Sym::Op(if prev == c { '+' } else { '-' });
                continue;
            }
            s.swap(kept, i);
            kept += 1;
        }
        s.truncate(kept);
        s
    }

    /// A binary problem's key: its operator and operands, as a multiset for `+` and `*`, which
    /// commute, and for `-`, whose swapped problem fixes the answer (`12-34` is `-(34-12)`: a row
    /// that teaches one teaches the other, so they are one item).
    fn key(op: char, a: &str, b: &str) -> String {
        let (a, b) = if matches!(op, '+' | '*' | '-') && (b.len(), b) < (a.len(), a) {
            (b, a)
        } else {
            (a, b)
        };
        format!("{op}:{a}:{b}")
    }

    /// The key of a sum of three or more addends: their multiset, in numeric order.
    fn sum_key(mut ops: Vec<&str>) -> String {
        ops.sort_by(|a, b| (a.len(), a).cmp(&(b.len(), b)));
        format!("+:{}", ops.join(":"))
    }

    /// A term of a chain of sums and differences: its sign, its operand as written (a product's
    /// value), and for a product (`Sym::Product`) its own key, if it has one.
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Term<'a> {
        sign: char,
        n: &'a str,
        product: Option<&'a Option<String>>,
    }

    /// A chain's terms without the pairs that cancel (`+x` and `-x`, a product's value among
    /// them), in their order.
    fn cancelled(mut t: Vec<Term<'_>>) -> Vec<Term<'_>> {
        // Nothing cancels in a chain of one sign (every sum the generator writes).
        if t.iter().all(|x| x.sign == t[0].sign) {
            return t;
        }
        // Terms grouped by operand; in each group, pluses and minuses cancel one for one.
        let mut order: Vec<usize> = (0..t.len()).collect();
        order.sort_by(|&i, &j| t[i].n.cmp(t[j].n));
        let mut gone = vec![false; t.len()];
        let terms = &t;
        for group in order.chunk_by(|&i, &j| terms[i].n == terms[j].n) {
            let of = |sign: char| {
                group
                    .iter()
                    .copied()
                    .filter(move |&i| terms[i].sign == sign)
            };
            for (p, m) in of('+').zip(of('-')) {
                gone[p] = true;
                gone[m] = true;
            }
        }
        let mut i = 0;
        t.retain(|_| {
            i += 1;
            !gone[i - 1]
        });
        t
    }

    /// The longest chain searched for three addends among its terms: beyond it only the pairs
    /// that cancel are read (`cancelled`).
    const MAX_TRIPLE_TERMS: usize = 16;

    /// The problems hidden in a chain that keeps their value: terms whose value is the whole
    /// chain's, the others summing to zero (`12+34+3-1-2` is `12+34`, `46+5-12-5` is `46-12`,
    /// `12+34+56+9-4-5` is `12+34+56`, `6*7+3-3` is `6*7`) — two addends, a difference, or (in
    /// chains of at most `MAX_TRIPLE_TERMS` terms) three addends, all written as numbers; or a
    /// product of two. A negative chain is read negated (`-12-34+1-1` is `-(12+34)`). Never
    /// terms all of one digit (scratchpad columns, as elsewhere); chains of fewer than three
    /// terms have none. Keys: at most three per term and one per pair of terms of the searched
    /// chains.
    fn keeping_value(t: &[Term<'_>], out: &mut Vec<String>) {
        if t.len() < 3 {
            return;
        }
        // (plus, value, operand, written as a number)
        let mut v: Vec<(bool, i128, &str, bool)> = Vec::with_capacity(t.len());
        let mut total: i128 = 0;
        for term in t {
            // Operands past 30 digits are left to the n-gram checks.
            let Some(x) = (term.n.len() <= MAX_FACTOR_DIGITS)
                .then(|| term.n.parse::<i128>().ok())
                .flatten()
            else {
                return;
            };
            let Some(sum) = total.checked_add(if term.sign == '+' { x } else { -x }) else {
                return;
            };
            total = sum;
            v.push((term.sign == '+', x, term.n, term.product.is_none()));
        }
        if total < 0 {
            let Some(negated) = total.checked_neg() else {
                return;
            };
            total = negated;
            for term in &mut v {
                term.0 = !term.0;
            }
        }
        // A product of two whose value is the chain's
        for (term, &(plus, x, ..)) in t.iter().zip(&v) {
            if let Some(Some(key)) = term.product
                && plus
                && x == total
            {
                out.push(key.clone());
            }
        }
        let small = |ns: &[&str]| ns.iter().all(|n| n.len() == 1);
        // The terms written as numbers, sorted by sign and value, for the pairs: another term
        // than `not` of that sign and value.
        let mut sorted: Vec<(bool, i128, usize)> = v
            .iter()
            .enumerate()
            .filter(|(_, t)| t.3)
            .map(|(i, t)| (t.0, t.1, i))
            .collect();
        sorted.sort_unstable();
        let other = |sign: bool, x: i128, not: usize| {
            let from = sorted.partition_point(|t| (t.0, t.1) < (sign, x));
            sorted[from..]
                .iter()
                .take_while(|t| (t.0, t.1) == (sign, x))
                .map(|t| t.2)
                .find(|&j| j != not)
        };
        for (i, &(plus, x, a, number)) in v.iter().enumerate() {
            if !plus || !number {
                continue;
            }
            // a + b is the chain's value
            if let Some(j) = other(true, total - x, i)
                && !small(&[a, v[j].2])
            {
                out.push(key('+', a, v[j].2));
            }
            // a - b is the chain's value
            if let Some(j) = other(false, x - total, i)
                && !small(&[a, v[j].2])
            {
                out.push(key('-', a, v[j].2));
            }
        }
        if v.len() > MAX_TRIPLE_TERMS {
            return;
        }
        let plus: Vec<(i128, &str)> = v
            .iter()
            .filter(|t| t.0 && t.3)
            .map(|t| (t.1, t.2))
            .collect();
        for i in 0..plus.len() {
            for j in i + 1..plus.len() {
                for k in j + 1..plus.len() {
                    let ops = [plus[i].1, plus[j].1, plus[k].1];
                    if plus[i].0 + plus[j].0 + plus[k].0 == total && !small(&ops) {
                        out.push(sum_key(ops.to_vec()));
                    }
                }
            }
        }
    }

    /// Keys of the stand-alone binary problems in a symbol stream.
    pub fn keys(s: &[Sym]) -> Vec<String> {
        let num = |i: Option<usize>| -> Option<&str> {
            match i.and_then(|i| s.get(i)) {
                Some(Sym::Num(n)) => Some(n.as_str()),
                _ => None,
            }
        };
        let is_op = |i: Option<usize>| matches!(i.and_then(|i| s.get(i)), Some(Sym::Op(_)));
        let mut out = Vec::new();
        for (i, sym) in s.iter().enumerate() {
            let Sym::Op(op) = *sym else { continue };
            let mut push = |a: &str, b: &str, both: bool| {
                out.push(key(op, a, b));
                if both {
                    out.push(key(op, b, a));
                }
            };
            // infix: a op b, standing alone (no operator on either side)
            if let (Some(a), Some(b)) = (num(i.checked_sub(1)), num(Some(i + 1))) {
                if !is_op(i.checked_sub(2)) && !is_op(Some(i + 2)) {
                    push(a, b, false);
                }
                continue;
            }
            // prefix: op a b (`sum of 12 and 34`, `subtract 12 from 46`: either order)
            if num(i.checked_sub(1)).is_none()
                && let (Some(a), Some(b)) = (num(Some(i + 1)), num(Some(i + 2)))
                && !is_op(Some(i + 3))
            {
                push(a, b, true);
            }
            // postfix: a b op (`12 and 34 added together`, `12 34 +`: either order), alone
            if num(Some(i + 1)).is_none()
                && !is_op(Some(i + 1))
                && let (Some(a), Some(b)) = (num(i.checked_sub(2)), num(i.checked_sub(1)))
                && num(i.checked_sub(3)).is_none()
                && !is_op(i.checked_sub(3))
            {
                push(a, b, true);
            }
        }
        // Chains of sums and differences standing alone (no operator on either side), their first
        // term signed or not: two terms are a sum when their signs agree (`+12+34`, `-12-34` is
        // `-(12+34)`) and a difference when they do not (`-46+12` is `12-46`); three or more
        // of one sign are keyed by their multiset. Any chain is also keyed without its zero
        // terms, which only disguise the problem without them (`34+12+0` is `12+34`, `46-0-12`
        // is `46-12`, `0-46+12` is `12-46`; `0-12` alone is no `12`). Not when what is left is
        // single digits: `3+6+0` and `7-2-0` are scratchpad columns, and every scratchpad row
        // teaches one-digit sums and differences whatever the protected items hold.
        let sign_at = |i: usize| match s.get(i) {
            Some(Sym::Op(c @ ('+' | '-'))) => Some(*c),
            _ => None,
        };
        // A term: a number, or a product read as its value.
        let term = |i: usize| match s.get(i) {
            Some(Sym::Num(n)) => Some((n.as_str(), None)),
            Some(Sym::Product { value, key }) => Some((value.as_str(), Some(key))),
            _ => None,
        };
        let mut i = 0;
        while i < s.len() {
            // A chain starts at a term with no operator before it, or at a sign before a term
            // with neither a term nor an operator before the sign.
            let (mut sign, start) = match sign_at(i) {
                Some(c)
                    if term(i + 1).is_some()
                        && !i
                            .checked_sub(1)
                            .is_some_and(|j| term(j).is_some() || is_op(Some(j))) =>
                {
                    (c, i + 1)
                }
                _ if term(i).is_some() && !is_op(i.checked_sub(1)) => ('+', i),
                _ => {
                    i += 1;
                    continue;
                }
            };
            let led_by_minus = sign == '-';
            let mut terms: Vec<Term> = Vec::new();
            let mut at = start;
            while let Some((n, product)) = term(at) {
                terms.push(Term { sign, n, product });
                match sign_at(at + 1) {
                    Some(c) if term(at + 2).is_some() => {
                        sign = c;
                        at += 2;
                    }
                    _ => break,
                }
            }
            i = at + 1;
            if terms.len() < 2 || is_op(Some(at + 1)) {
                continue;
            }
            // A minus written before the first term may be its own or the whole chain's
            // (brackets are filler: `-(34-12)` reads as `-34-12`), so two terms led by a minus
            // are keyed both ways; a zero term dropped leaves no such doubt. Only chains of
            // numbers as written: a product is no operand.
            let push_chain = |t: &[Term], led_by_minus: bool, out: &mut Vec<String>| match t {
                _ if t.iter().any(|x| x.product.is_some()) => {}
                [x, y] => {
                    out.push(key(if x.sign == y.sign { '+' } else { '-' }, x.n, y.n));
                    if led_by_minus {
                        out.push(key(if x.sign == y.sign { '-' } else { '+' }, x.n, y.n));
                    }
                }
                [first, ..] if t.iter().all(|x| x.sign == first.sign) => {
                    out.push(sum_key(t.iter().map(|x| x.n).collect()));
                }
                _ => {}
            };
            push_chain(&terms, led_by_minus, &mut out);
            // Without its zero terms and its terms that cancel (`+7 … -7`): what is left keeps
            // the chain's value, so `12+34+0` and `12+7+34-7` are `12+34`.
            let nonzero: Vec<Term> = terms.iter().filter(|x| x.n != "0").copied().collect();
            // Dropping terms leaves digits digits: a scratchpad column costs no more here.
            if nonzero.iter().all(|x| x.n.len() == 1) {
                continue;
            }
            let rest = cancelled(nonzero);
            // A product of two is its own problem when the rest of its chain cancels
            // (`6*7+5-5` is `6*7`).
            if let [
                Term {
                    product: Some(Some(k)),
                    ..
                },
            ] = rest[..]
            {
                out.push(k.clone());
            }
            if rest.len() < 2 || rest.iter().all(|x| x.n.len() == 1) {
                continue;
            }
            if rest.len() != terms.len() {
                let first_kept = rest.first() == terms.first();
                push_chain(&rest, led_by_minus && first_kept, &mut out);
            }
            keeping_value(&rest, &mut out);
        }
        out.sort();
        out.dedup();
        out
    }
}

/// Strings of digits as multisets: the problem `530912=` (sort its digits) is the same in any
/// order of its digits, and its answer `012359` is one of those orders, so both have the key
/// `d:012359`. A string's digits may be written apart (`5 3 0 9 1 2`, `5,3,0`), in any script
/// (the canonical text made them ASCII), as unit words (`five three`), or glued to letters
/// (`r953210`, `x530912y`: a token's digits are its digits); words without digits are filler and
/// skipped, and so are operator signs (`5+3+0`: a sorting task has no arithmetic). `=` ends a
/// string, except in a chain of three or more single digits (`5=3=0`). Every run of consecutive digit tokens of 2 to
/// `MAX_DIGITS` digits in all is a key — a row's digits next to a problem's (`7 530912`) do not
/// hide it, and keys grow linearly with the row (at most `MAX_DIGITS` from each token).
pub mod digits {
    use std::collections::HashSet;

    /// The multisets a reading found, those `wanted` may be a key of (`super::Wanted::digits`).
    struct Found<'a> {
        set: HashSet<u64>,
        wanted: &'a dyn Fn(u64) -> bool,
    }

    impl Found<'_> {
        fn insert(&mut self, packed: u64) {
            if (self.wanted)(packed) {
                self.set.insert(packed);
            }
        }
    }

    /// A key's multiset packed as `digits_of` packs one (`d:0123` is one each of 0–3); `None`
    /// for a key of another form or of more than `MAX_DIGITS` digits.
    pub fn packed(key: &str) -> Option<u64> {
        let digits = key.strip_prefix("d:")?;
        if digits.is_empty() || digits.len() > MAX_DIGITS {
            return None;
        }
        digits.bytes().try_fold(0u64, |packed, b| {
            b.is_ascii_digit()
                .then(|| packed + (1 << (4 * u32::from(b - b'0'))))
        })
    }

    /// The longest string of digits keyed: an item of more digits is left to the n-gram checks.
    pub const MAX_DIGITS: usize = 12;

    /// What ends a string of digits: `=` alone, the sorting formats' own sign (between a string
    /// and its answer, and between a digit and its count in the scratchpad). Other signs are
    /// filler, as operator words are: a sorting task has no arithmetic, so `5+3+0` is `530`.
    pub fn breaks(t: &str) -> bool {
        t == "="
    }

    /// A token's digits as a multiset — each digit's count in a nibble of a `u64` (a key covers
    /// at most `MAX_DIGITS` < 16 digits, so sums of keys never carry) — and how many digits it
    /// has: its ASCII digits, or a unit word's; `None` for a word without any (filler).
    fn digits_of(t: &str) -> Option<(u64, usize)> {
        let mut packed = 0u64;
        let mut n = 0usize;
        for b in t.bytes().filter(u8::is_ascii_digit) {
            n += 1;
            if n <= MAX_DIGITS {
                packed += 1 << (4 * u32::from(b - b'0'));
            }
        }
        if n > 0 {
            return Some((packed, n));
        }
        super::arithmetic::unit(t).map(|u| (1 << (4 * u), 1))
    }

    /// Single digits joined by `=` alone, three or more (`5=3=0=9`), as strings of their own
    /// (`None` between two): the scratchpad's `digit=count` pairs are two, so they stay apart.
    fn chains(pieces: &[Option<(u64, usize)>]) -> Vec<Option<(u64, usize)>> {
        let mut out = Vec::new();
        let mut chain: Vec<Option<(u64, usize)>> = Vec::new();
        let mut after_sign = false;
        for p in pieces {
            match *p {
                None => after_sign = !chain.is_empty(),
                Some((d, 1)) if after_sign || chain.is_empty() => {
                    chain.push(Some((d, 1)));
                    after_sign = false;
                }
                // Digits side by side, or a token of several: the chain ends here.
                Some((d, n)) => {
                    if chain.len() >= 3 {
                        out.append(&mut chain);
                        out.push(None);
                    }
                    chain = if n == 1 {
                        vec![Some((d, 1))]
                    } else {
                        Vec::new()
                    };
                    after_sign = false;
                }
            }
        }
        if chain.len() >= 3 {
            out.append(&mut chain);
        }
        out
    }

    /// A digit or its count: a number of at most two ASCII digits or a unit word (`3`, `three`).
    fn small(t: &str) -> Option<u64> {
        if (1..=2).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_digit()) {
            return t.parse().ok();
        }
        super::arithmetic::unit(t)
    }

    /// A string written as its digits' counts, the sorting scratchpad's form without the string:
    /// `digit = count` pairs (`0=1,1=1,2=1,3=1,5=1,9=1` is `012359`, in any order, `5=2` is
    /// `55`; any sign a count is written with, `0:1`, `0*1`, `0->1` (`Signs`), or an `x` glued
    /// between, `0x1`), with filler between them, are the multiset they count, keyed like a
    /// string's digits (`runs`): every run of consecutive pairs of 2 to `MAX_DIGITS` digits in
    /// all. A pair counting none (`4=0`) adds nothing and does not end a run; anything else that
    /// is not filler (a digit, `=`, a count above `MAX_DIGITS`) does; other signs alone are
    /// filler. A run is also read count first (`1=0,1=1,1=2,…`),
    /// unless its digits ascend as a scratchpad's do: an honest scratchpad is never read backwards,
    /// so its other reading cannot refuse it.
    fn counts(toks: &[String], found: &mut Found) {
        let mut stream = Stream::default();
        for t in toks {
            stream.pair_token(t, found);
        }
        stream.pair_left_alone(found);
        stream.end_run(found, true);
    }

    /// Whether a token may stand between a digit and its count (`Signs`).
    fn count_sign(t: &str) -> bool {
        matches!(t, "=" | ":" | "*" | "x" | "-" | ">")
    }

    /// The signs read so far between a small number and the next (`count_sign`), and whether
    /// they make a count of it: `=`, the scratchpad's own sign, or one a count is written with,
    /// `:` (`0:1`, and `0:=1`), `*` (`0*1`, `0×1`), `x` apart (`0 x 1`), or an arrow (`0->1`,
    /// `0=>1`). A dash or `>` alone does not: `5-3-0` and `9>5>3` are strings.
    #[derive(Clone, Copy, Default)]
    struct Signs {
        pairs: bool,
        dash: bool,
    }

    impl Signs {
        fn then(self, t: &str) -> Signs {
            Signs {
                pairs: self.pairs || matches!(t, "=" | ":" | "*" | "x") || (self.dash && t == ">"),
                dash: t == "-",
            }
        }
    }

    /// A token that is a pair on its own, a digit and its count glued by `x` (`0x1`, `3x2`).
    fn glued_pair(t: &str) -> Option<(u64, u64)> {
        let (a, b) = t.split_once('x')?;
        let digits = |s: &str| (1..=2).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit());
        (digits(a) && digits(b)).then(|| Some((a.parse().ok()?, b.parse().ok()?)))?
    }

    /// Where a pair being read stands: after a small number (`0`), or after it and a run of
    /// signs (`0 =`, `0 - >`). Where it cannot end, its number is a digit read alone, which ends
    /// the run of pairs (an `=` among its signs would too).
    #[derive(Clone, Copy, Default)]
    enum Partial {
        #[default]
        Nothing,
        Number(u64),
        Signs(u64, Signs),
    }

    /// A run of pairs as `runs` pieces, digit first or (`flip`) count first: `c` of digit `d` in
    /// `d`'s nibble (at most `MAX_DIGITS` < 16); `None` where a pair counts no digit.
    fn counted(run: &[(u64, u64)], flip: bool) -> Vec<Option<(u64, usize)>> {
        run.iter()
            .filter_map(|&(x, y)| {
                let (d, c) = if flip { (y, x) } else { (x, y) };
                if d > 9 || c as usize > MAX_DIGITS {
                    Some(None)
                } else if c == 0 {
                    None
                } else {
                    Some(Some((c << (4 * d), c as usize)))
                }
            })
            .collect()
    }

    /// Every run of consecutive pieces (`None` ends one) of 2 to `MAX_DIGITS` digits in all, as
    /// its multiset: at most `MAX_DIGITS` from each piece.
    fn runs(pieces: &[Option<(u64, usize)>], found: &mut Found) {
        for i in 0..pieces.len() {
            let (mut packed, mut len) = (0u64, 0usize);
            for p in &pieces[i..] {
                let Some((d, n)) = *p else { break };
                if len + n > MAX_DIGITS {
                    break;
                }
                packed += d;
                len += n;
                if len >= 2 {
                    found.insert(packed);
                }
            }
        }
    }

    /// An item's keys (its prompt's): each string whole — the problem `530912=` has one key,
    /// and `7530912=` is another problem.
    pub fn keys(toks: &[String]) -> Vec<String> {
        read(toks, toks, false, &|_| true)
    }

    /// The keys a scan reads in `strings` (one row's tokens, or the stream's joined) and in the
    /// counts of `counted_toks`: runs of whole tokens, and runs inside a token
    /// (`inside_tokens`), so an item is found inside a longer string of digits too — those of
    /// them `wanted`.
    pub fn keys_of(
        strings: &[String],
        counted_toks: &[String],
        wanted: &dyn Fn(u64) -> bool,
    ) -> Vec<String> {
        read(strings, counted_toks, true, wanted)
    }

    /// The keys of the strings and chains in `strings` — runs of whole tokens, and (`inside`)
    /// runs inside tokens — and of the counts in `counted_toks`.
    fn read(
        strings: &[String],
        counted_toks: &[String],
        inside: bool,
        wanted: &dyn Fn(u64) -> bool,
    ) -> Vec<String> {
        // Distinct multisets only: however long the row, at most one key per multiset of 2 to
        // `MAX_DIGITS` digits (about 650,000), each found in at most `MAX_DIGITS` steps per digit
        // (in runs) or token (in chains, and in counts read each way).
        let mut found = Found {
            set: HashSet::new(),
            wanted,
        };
        let working = own_working(strings);
        for strings in regrouped(&working) {
            // Digit tokens, with `None` where a string ends; filler dropped.
            let pieces: Vec<Option<(u64, usize)>> = strings
                .iter()
                .filter_map(|t| {
                    if breaks(t) {
                        Some(None)
                    } else {
                        digits_of(t).map(Some)
                    }
                })
                .collect();
            runs(&pieces, &mut found);
            if inside {
                runs(&inside_tokens(&strings), &mut found);
            }
            runs(&chains(&pieces), &mut found);
        }
        counts(counted_toks, &mut found);
        named(found)
    }

    /// How many digits a token is as a group of a string: its ASCII digits (glued to letters
    /// too, `q467`), one for a unit word; `None` for a token without any.
    fn group_len(t: &str) -> Option<usize> {
        match t.bytes().filter(u8::is_ascii_digit).count() {
            0 => super::arithmetic::unit(t).map(|_| 1),
            n => Some(n),
        }
    }

    /// The tokens with tens and teens words as their digits (`forty-six` is `46`, `forty` `40`,
    /// `twelve` `12`), and a digit string's running sums after it, two digits each between `=`
    /// signs (`530912=05=08=08=17=18=20`, the digit-sum scratchpad), each an `=`: they are that
    /// string's own working, and joined (`regrouped`, `Stream`) they would be strings of digits
    /// the row never poses.
    pub(super) fn own_working(strings: &[String]) -> std::borrow::Cow<'_, [String]> {
        use std::borrow::Cow;
        let worded = strings
            .iter()
            .any(|t| super::arithmetic::teen_or_tens(t).is_some());
        // (A string's first running sum is its first digit, padded: `530912=05`.)
        let summed = strings.windows(3).any(|w| {
            w[1] == "="
                && w[0].len() >= 2
                && w[0].bytes().all(|b| b.is_ascii_digit())
                && w[2].as_bytes() == [b'0', w[0].as_bytes()[0]]
        });
        if !worded && !summed {
            return Cow::Borrowed(strings);
        }
        let mut toks: Vec<String> = Vec::with_capacity(strings.len());
        let mut i = 0;
        while i < strings.len() {
            let t = &strings[i];
            match super::arithmetic::teen_or_tens(t) {
                Some(v) if v >= 20 => {
                    // `forty-six`, `forty six`: the unit after it is its second digit
                    let at = if strings.get(i + 1).is_some_and(|x| x == "-") {
                        i + 2
                    } else {
                        i + 1
                    };
                    match strings.get(at).and_then(|u| super::arithmetic::unit(u)) {
                        Some(u) if u > 0 => {
                            toks.push((v + u).to_string());
                            i = at + 1;
                        }
                        _ => {
                            toks.push(v.to_string());
                            i += 1;
                        }
                    }
                }
                Some(v) => {
                    toks.push(v.to_string());
                    i += 1;
                }
                None => {
                    toks.push(t.clone());
                    i += 1;
                }
            }
        }
        let mut i = 0;
        while i < toks.len() {
            let k = toks[i].len();
            if (2..=MAX_DIGITS).contains(&k) && toks[i].bytes().all(|b| b.is_ascii_digit()) {
                let mut sum = 0u32;
                let sums: Vec<String> = toks[i]
                    .bytes()
                    .map(|b| {
                        sum += u32::from(b - b'0');
                        format!("{sum:02}")
                    })
                    .collect();
                let holds = sums.iter().enumerate().all(|(j, x)| {
                    toks.get(i + 2 * j + 1).is_some_and(|e| e == "=")
                        && toks.get(i + 2 * j + 2).is_some_and(|t| t == x)
                });
                if holds {
                    for j in 0..k {
                        toks[i + 2 * j + 2] = "=".to_string();
                    }
                    i += 2 * k + 1;
                    continue;
                }
            }
            i += 1;
        }
        Cow::Owned(toks)
    }

    /// The strings as they are read, once or twice. `=` ends a string (`breaks`), but a string
    /// may be written in groups joined by `=` (`467=297`, `4=6=7=2=97`), and only single digits
    /// so joined are a chain (`chains`): groups with an `=` among what stands between them
    /// (`467=297`, `467=x=297`), one of two digits or more, are one string (the sorting form's `digit=count` pairs are single digits, and a string
    /// and its sorted answer, `530912=012359`, joined are a string of twelve, no item's), after
    /// `own_working`. Where a group is a digit padded with zeros (`04=06=07`, `007`), the strings
    /// are read a second time with each such group its digit, so that padded digits joined by `=`
    /// are a chain too.
    fn regrouped(toks: &[String]) -> Vec<Vec<&str>> {
        // Groups joined by `=` alone, one of them of two digits or more: the `=`s go.
        fn join(toks: Vec<&str>) -> Vec<&str> {
            let mut gone = vec![false; toks.len()];
            let mut i = 0;
            while i < toks.len() {
                let Some(first) = group_len(toks[i]) else {
                    i += 1;
                    continue;
                };
                // The next group, where an `=` stands among what comes before it (`467=297`,
                // `467=x=297`, `467 = - 297`): its `=`s.
                let (mut end, mut widest, mut signs) = (i, first, Vec::new());
                loop {
                    let mut j = end + 1;
                    let mut between = Vec::new();
                    while j < toks.len() && group_len(toks[j]).is_none() {
                        if toks[j] == "=" {
                            between.push(j);
                        }
                        j += 1;
                    }
                    match toks.get(j).and_then(|t| group_len(t)) {
                        Some(n) if !between.is_empty() => {
                            widest = widest.max(n);
                            signs.extend(between);
                            end = j;
                        }
                        _ => break,
                    }
                }
                if end > i && widest >= 2 {
                    signs.into_iter().for_each(|e| gone[e] = true);
                }
                i = end + 1;
            }
            if !gone.contains(&true) {
                return toks;
            }
            toks.into_iter()
                .zip(gone)
                .filter(|(_, gone)| !gone)
                .map(|(t, _)| t)
                .collect()
        }
        // A digit padded with zeros (`04`, `007`).
        let padded = |t: &str| {
            t.len() >= 2
                && t.starts_with('0')
                && t.bytes().all(|b| b.is_ascii_digit())
                && t.bytes().filter(|&b| b != b'0').count() <= 1
        };
        let mut out = vec![join(toks.iter().map(String::as_str).collect())];
        if toks.iter().any(|t| padded(t)) {
            out.push(join(
                toks.iter()
                    .map(|t| {
                        if padded(t) {
                            &t[t.len() - 1..]
                        } else {
                            t.as_str()
                        }
                    })
                    .collect(),
            ));
        }
        out
    }

    /// Each token's digits one piece each, `None` after each token: runs inside a token, so a
    /// string written straight into another (`467297246779`: a prompt and its answer with no
    /// `=`, a digit before a problem, `1467297`, two items back to back) holds the item it joins.
    /// Across tokens runs stay whole tokens: a string that starts inside one token and ends
    /// inside the next is not read, or every two rows of honest strings side by side in a
    /// stream (`012359` then `467297=`) would hold strings of their digits that no row poses.
    fn inside_tokens<S: AsRef<str>>(strings: &[S]) -> Vec<Option<(u64, usize)>> {
        let mut out = Vec::new();
        for t in strings {
            let digits = t.as_ref().bytes().filter(u8::is_ascii_digit);
            if digits.clone().count() > 2 {
                out.extend(digits.map(|b| Some((1u64 << (4 * u32::from(b - b'0')), 1))));
                out.push(None);
            }
        }
        out
    }

    /// A stream's digits readings that span rows (`Carry`): the chain (`5=3=0`) and the run of
    /// `digit=count` pairs left open at its end, so that either, split across any number of rows,
    /// is read as in one row. Rows are read token by token, as `chains` and `pair_runs` read one:
    /// a chain or run is read when it ends and, as it stands, at each row's end; what then stays
    /// open keeps only what a key can still reach (its last `MAX_DIGITS` digits; a run whose
    /// digits ascend, read one way only, all of its count-first reading, at most 100 pairs), so
    /// the state is bounded and a stream is read in time linear in its rows.
    #[derive(Clone)]
    pub struct Stream {
        /// The open chain's last digits (single digits, packed), how many it has in all, and
        /// whether an `=` follows its last.
        chain: Vec<u64>,
        chain_len: usize,
        after_sign: bool,
        /// The pair the stream's last tokens began (a number, and signs after it): the next
        /// row's first tokens may end it.
        partial: Partial,
        /// The open run of pairs, read digit first and count first (`counted`'s pieces), whether
        /// its digits ascend, and its last digit.
        fwd: Vec<Option<(u64, usize)>>,
        flip: Vec<Option<(u64, usize)>>,
        ascending: bool,
        last: Option<u64>,
        /// The open chain of groups joined by `=` alone (`regrouped`), its last pieces (at most
        /// `MAX_DIGITS` digits), and whether an `=` follows its last.
        groups: Vec<(u64, usize)>,
        groups_sign: bool,
    }

    impl Default for Stream {
        fn default() -> Stream {
            Stream {
                groups: Vec::new(),
                groups_sign: false,
                chain: Vec::new(),
                chain_len: 0,
                after_sign: false,
                partial: Partial::Nothing,
                fwd: Vec::new(),
                flip: Vec::new(),
                ascending: true,
                last: None,
            }
        }
    }

    impl Stream {
        /// Reads the row `toks` after what the stream holds: the keys of its chains and runs of
        /// pairs, those the stream's open ones run into included.
        pub fn read(&mut self, toks: &[String], wanted: &dyn Fn(u64) -> bool) -> Vec<String> {
            let mut found = Found {
                set: HashSet::new(),
                wanted,
            };
            for t in toks {
                self.chain_token(t, &mut found);
            }
            for t in own_working(toks).iter() {
                self.group_token(t, &mut found);
            }
            // Pairs, read on from the one the stream left partly read.
            for t in toks {
                self.pair_token(t, &mut found);
            }
            // What stays open is read as it stands, then cut to what a key can still reach.
            self.end_chain(&mut found, false);
            self.end_groups(&mut found, false);
            self.end_run(&mut found, false);
            named(found)
        }

        /// `regrouped`'s groups joined by `=`, one token at a time: a string split across rows in
        /// groups (`530=` then `912=`) is read as in one row.
        fn group_token(&mut self, t: &str, found: &mut Found) {
            if t == "=" {
                self.groups_sign = !self.groups.is_empty();
                return;
            }
            // Filler between groups (`467=x=297`) neither ends the chain nor joins it.
            if let (Some(_), Some(piece)) = (group_len(t), digits_of(t)) {
                if !self.groups_sign {
                    self.end_groups(found, true);
                }
                self.groups.push(piece);
                self.groups_sign = false;
            }
        }

        /// Reads the open chain of groups (two or more, one of two digits or more) and either
        /// ends it or (`ends` false) keeps its last pieces of at most `MAX_DIGITS` digits.
        fn end_groups(&mut self, found: &mut Found, ends: bool) {
            if self.groups.len() >= 2 && self.groups.iter().any(|&(_, n)| n >= 2) {
                let pieces: Vec<_> = self.groups.iter().map(|&p| Some(p)).collect();
                runs(&pieces, found);
            }
            if ends {
                self.groups.clear();
                self.groups_sign = false;
            } else {
                let mut digits = 0;
                let keep = self
                    .groups
                    .iter()
                    .rev()
                    .take_while(|&&(_, n)| {
                        digits += n;
                        digits <= MAX_DIGITS
                    })
                    .count();
                let cut = self.groups.len() - keep;
                self.groups.drain(..cut);
            }
        }

        /// `chains`, one token at a time.
        fn chain_token(&mut self, t: &str, found: &mut Found) {
            if breaks(t) {
                self.after_sign = self.chain_len > 0;
                return;
            }
            let Some((d, n)) = digits_of(t) else { return };
            if n == 1 && (self.after_sign || self.chain_len == 0) {
                self.chain.push(d);
                self.chain_len += 1;
            } else {
                self.end_chain(found, true);
                if n == 1 {
                    self.chain.push(d);
                    self.chain_len = 1;
                }
            }
            self.after_sign = false;
        }

        /// Reads the open chain (three digits or more) and either ends it or (`ends` false)
        /// keeps its last `MAX_DIGITS` digits.
        fn end_chain(&mut self, found: &mut Found, ends: bool) {
            if self.chain_len >= 3 {
                let pieces: Vec<_> = self.chain.iter().map(|&d| Some((d, 1))).collect();
                runs(&pieces, found);
            }
            if ends {
                self.chain.clear();
                self.chain_len = 0;
            } else {
                let cut = self.chain.len().saturating_sub(MAX_DIGITS);
                self.chain.drain(..cut);
            }
        }

        /// Reads the next token as part of a pair (`counts`): it ends the pair begun, goes on
        /// with it (a count sign), or begins one; where a pair cannot end, its number and signs
        /// are read alone (`pair_left_alone`).
        fn pair_token(&mut self, t: &str, found: &mut Found) {
            match self.partial {
                Partial::Signs(x, signs)
                    if signs.pairs
                        && let Some(y) = small(t) =>
                {
                    self.partial = Partial::Nothing;
                    return self.pair(x, y);
                }
                Partial::Number(x) if count_sign(t) => {
                    self.partial = Partial::Signs(x, Signs::default().then(t));
                    return;
                }
                Partial::Signs(x, signs) if count_sign(t) => {
                    self.partial = Partial::Signs(x, signs.then(t));
                    return;
                }
                Partial::Nothing => {}
                _ => self.pair_left_alone(found),
            }
            if let Some((x, y)) = glued_pair(t) {
                self.pair(x, y);
            } else if let Some(x) = small(t) {
                self.partial = Partial::Number(x);
            } else if breaks(t) || digits_of(t).is_some() {
                self.end_run(found, true);
            }
        }

        /// The pair begun cannot end: its number (a digit) ends the run.
        fn pair_left_alone(&mut self, found: &mut Found) {
            if !matches!(self.partial, Partial::Nothing) {
                self.partial = Partial::Nothing;
                self.end_run(found, true);
            }
        }

        /// A pair read: it joins the open run.
        fn pair(&mut self, x: u64, y: u64) {
            self.fwd.extend(counted(&[(x, y)], false));
            self.flip.extend(counted(&[(x, y)], true));
            self.ascending &= self.last.is_none_or(|l| l < x);
            self.last = Some(x);
        }

        /// Reads the open run of pairs (count first too, unless its digits ascend) and either
        /// ends it or (`ends` false) keeps what a key can still reach.
        fn end_run(&mut self, found: &mut Found, ends: bool) {
            runs(&self.fwd, found);
            if !self.ascending {
                runs(&self.flip, found);
            }
            if ends {
                self.fwd.clear();
                self.flip.clear();
                self.ascending = true;
                self.last = None;
            } else {
                keep_reachable(&mut self.fwd);
                // A run whose digits ascend is read count first only if a later pair breaks
                // the ascent; it holds at most 100 pairs (digits are below 100).
                if !self.ascending {
                    keep_reachable(&mut self.flip);
                }
            }
        }
    }

    /// The pieces a key that runs on past them can still take: those after the last that ends
    /// every key (`None`), at most `MAX_DIGITS` digits' worth.
    fn keep_reachable(pieces: &mut Vec<Option<(u64, usize)>>) {
        let after_end = pieces
            .iter()
            .rposition(Option::is_none)
            .map_or(0, |i| i + 1);
        let (mut digits, mut from) = (0, pieces.len());
        while from > after_end {
            let Some(Some((_, n))) = pieces.get(from - 1) else {
                break;
            };
            if digits + n > MAX_DIGITS {
                break;
            }
            digits += n;
            from -= 1;
        }
        pieces.drain(..from);
    }

    /// Multisets as keys: `d:` and the digits in ascending order.
    fn named(found: Found) -> Vec<String> {
        let mut out: Vec<String> = found
            .set
            .into_iter()
            .map(|packed| {
                let mut key = String::from("d:");
                for digit in 0..10u32 {
                    let count = (packed >> (4 * digit)) & 0xF;
                    for _ in 0..count {
                        key.push(char::from(b'0' + digit as u8));
                    }
                }
                key
            })
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::canon::{canonical, form_tokens};

    fn k(text: &str) -> Vec<String> {
        keys(
            NormalForm::Arithmetic,
            &form_tokens(&canonical(text), false),
        )
    }

    #[test]
    fn arithmetic_equates_surface_forms_of_one_problem() {
        let want = vec!["+:12:34".to_string()];
        for text in [
            "12+34=",
            "12+34=46",
            "34+12=",
            "34 + 12 = 46",
            "What is twelve plus thirty-four?",
            "thirty four plus twelve equals forty-six",
            "one two + three four =",
            "the sum of 12 and 34",
            "add 34 to 12",
            "12 apples plus 34 apples",
            "１２＋３４＝",
            "١٢ + ٣٤",
            "1\u{200B}2+3\u{2060}4=",
            "Q: 12+34=? A:",
        ] {
            assert_eq!(k(text), want, "{text:?}");
        }
        assert_eq!(k("46-12="), vec!["-:12:46"]);
        assert_eq!(k("46 minus 12"), vec!["-:12:46"]);
        assert!(k("subtract 12 from 46").contains(&"-:12:46".to_string()));
        // A difference and its swap are one item: each answer fixes the other (`12-46=-34`).
        assert_eq!(k("12-46=-34"), vec!["-:12:46"]);
        assert_eq!(k("twelve minus forty-six"), vec!["-:12:46"]);
        // A negative operand is the difference it writes.
        for text in [
            "12 + -46 = -34",
            "12 + (-46)",
            "twelve plus minus forty-six",
        ] {
            assert_eq!(k(text), vec!["-:12:46"], "{text:?}");
        }
        for text in ["-46 + 12 = -34", "= -46+12"] {
            assert!(k(text).contains(&"-:12:46".to_string()), "{text:?}");
        }
        // ...but not inside a longer chain, nor after a number.
        assert!(k("-46+12+7=").iter().all(|k| k != "-:12:46"));
        assert_eq!(k("5 -46+12"), Vec::<String>::new());
        // Signs one after another are one sign, and a signed first term is read with its sign:
        // a sum written with negatives is the sum, a negated sum too.
        for text in [
            "12 - -46 = 58",
            "12 - (-46)",
            "12--46",
            "twelve minus negative forty-six",
            "12 + +46",
            "+12 + 46 = 58",
            "- -12 + 46",
        ] {
            assert_eq!(k(text), vec!["+:12:46"], "{text:?}");
        }
        for text in [
            "-12 - 46 = -58",
            "-(12) - (46)",
            "negative twelve minus 46 is negative 58",
        ] {
            assert!(k(text).contains(&"+:12:46".to_string()), "{text:?}");
        }
        for text in ["12 - +46", "+12 - 46", "46 + - + 12"] {
            assert_eq!(k(text), vec!["-:12:46"], "{text:?}");
        }
        // A leading minus may be the whole chain's (brackets are filler), so both readings:
        // `-(46-12)` is the difference, `-(12+46)` the sum.
        for text in [
            "-(46-12) = -34",
            "-(12 + 46) = -58",
            "-12 - -46 = 34",
            "-46+12",
        ] {
            assert_eq!(k(text), vec!["+:12:46", "-:12:46"], "{text:?}");
        }
        assert_eq!(k("-12-34-56="), vec!["+:12:34:56"]);
        // A minus before a bracket negates what it holds, nested in turn; other brackets change
        // nothing. Each reads as one problem and never as the other.
        let sums = [
            "46 - (0 - 12) =",
            "-(-12 - 46) = 58",
            "12 - (-(46))",
            "(12) + (46)",
            "12 + (0 + 46)",
            "0 - (-12 - 46)",
            "-(0 - 12 - 46)",
            "-(-(12 - -46))",
        ];
        let differences = [
            "46 - (12)",
            "0 - (12 - 46)",
            "-(0 - (12 - 46)) =",
            "- -(46 - 12)",
        ];
        for (texts, want, not) in [
            (&sums[..], "+:12:46", "-:12:46"),
            (&differences[..], "-:12:46", "+:12:46"),
        ] {
            for text in texts {
                let got = k(text);
                assert!(
                    got.contains(&want.into()) && !got.contains(&not.into()),
                    "{text:?}: {got:?}"
                );
            }
        }
        // A bracket left open ends at `=`: what follows reads as written.
        assert_eq!(k("-(7 = 12 + 46"), vec!["+:12:46"]);
        assert_eq!(k("12 minus 46 is negative 34"), vec!["-:12:46"]);
        // The diff scratchpad's sign step is a sum no difference family protects.
        assert_eq!(k("4-2-0=2,3-1-0=2,-|-22"), vec!["+:2:22"]);
        assert_eq!(k("one hundred and five plus 7"), vec!["+:7:105"]);
        assert_eq!(
            k("what is twelve plus thirty-four?forty-six"),
            vec!["+:12:34"],
            "two numbers in words side by side stay two"
        );
        assert_eq!(k("two thousand three hundred four + 1"), vec!["+:1:2304"]);
        assert_eq!(k("6 × 7"), vec!["*:6:7"]);
        // Sums of three: any order, any surface form, one key.
        for text in [
            "12+34+56=",
            "56 + 12 + 34 = 102",
            "twelve plus fifty-six plus 34",
        ] {
            assert_eq!(k(text), vec!["+:12:34:56"], "{text:?}");
        }
    }

    /// A looping agent's longest chain (one row of a hundred thousand zero terms around a problem)
    /// yields one key per chain form, not one per term: keys grow with the row, never beyond it.
    #[test]
    fn a_chain_of_any_length_gives_at_most_two_keys() {
        let row = format!("12+34{}=46", "+0".repeat(100_000));
        let keys = k(&row);
        assert_eq!(keys.len(), 2, "{}", keys.len());
        assert!(keys.contains(&"+:12:34".to_string()));
    }

    /// A problem in a longer chain that keeps its value: the other terms cancel in pairs, in
    /// any number, or sum to zero some other way; a difference and a sum of three too.
    #[test]
    fn a_problem_in_a_chain_that_keeps_its_value_is_read() {
        let long = format!("12+34{}=46", "+1-1".repeat(50_000));
        for (text, want) in [
            ("12+34+1-1=46", "+:12:34"),
            ("12+7+34-7=46", "+:12:34"),
            ("-7+12+34+7", "+:12:34"),
            ("12+34+3-1-2=46", "+:12:34"),
            ("12 + 34 - 5 + 2 + 3 = 46", "+:12:34"),
            ("12 - (1 - 34) + 1 = 46", "+:12:34"),
            ("-12-34+1-1=-46", "+:12:34"),
            ("46+5-12-5=34", "-:12:46"),
            ("46-12+9-9", "-:12:46"),
            ("12-46+3-3=-34", "-:12:46"),
            ("12+34+56+9-4-5=102", "+:12:34:56"),
            ("12+34+56+7-7=102", "+:12:34:56"),
            ("12 + 34*1 = 46", "+:12:34"),
            ("1*12 + 34", "+:12:34"),
            ("12 + 34/1*1 = 46", "+:12:34"),
            ("34*1*1 + 12", "+:12:34"),
            ("46 - 1*12", "-:12:46"),
            ("12+34+2*3-6=46", "+:12:34"),
            ("12 + 3*7 + 34 - 7*3", "+:12:34"),
            ("-2*3 + 12 + 34 + 6", "+:12:34"),
            ("12+34+12/4-3=46", "+:12:34"),
            ("12 + 34 - (2*3) + 6 = 46", "+:12:34"),
            ("12+34+2*3-4-2=46", "+:12:34"),
            ("46+2*3-12-6=34", "-:12:46"),
            ("6*7+5-5=42", "*:6:7"),
            ("1 + 6*7 - 1", "*:6:7"),
            ("6*7 - 0", "*:6:7"),
            ("84/2 + 3 - 3", "/:84:2"),
            ("12 + 34*2/2 = 46", "+:12:34"),
            ("2*12/2 + 34", "+:12:34"),
            ("12 + (34)*1", "+:12:34"),
            ("12 + ((34))*3/3", "+:12:34"),
            ("12 + 34 - (5 - 2*3) - 1 = 46", "+:12:34"),
            ("12 + 34 - (2*3 - 5) + 1 = 46", "+:12:34"),
            ("12 + 34 + 7 % 7 = 46", "+:12:34"),
            ("12 + 34 % 100 = 46", "+:12:34"),
            ("12 + 34 + 9 % 5 - 4 = 46", "+:12:34"),
            ("(12 + 34)*1 = 46", "+:12:34"),
            ("1*(12 + 34)/1 = 46", "+:12:34"),
            ("12 + (2*34)/2 = 46", "+:12:34"),
            ("12 + 34*(7/7) = 46", "+:12:34"),
            ("12 + (3*(34*2))/6", "+:12:34"),
            (long.as_str(), "+:12:34"),
        ] {
            assert!(
                k(text).contains(&want.to_string()),
                "{text:?}: {:?}",
                k(text)
            );
        }
        found_across("12+5+34-5=46", &[2, 3, 4, 5, 7, 8, 9], "+:12:34");
        // Chains whose other terms do not sum to zero are other problems, and so are scratchpad
        // columns whose value a pair of digits keeps.
        for (text, not) in [
            ("12+34+2-1=47", "+:12:34"),
            ("12+34-5=41", "+:12:34"),
            ("12+34+56+1=103", "+:12:34:56"),
            ("3+6+1-1=9", "+:3:6"),
            ("12 + 34*2 = 80", "+:12:34"),
            ("12 + 1*34*2", "+:12:34"),
            ("12+34+2*3-5=47", "+:12:34"),
            // a bracket beside a factor is not read as a product (`2*(3+1)` is 8, not 6+1)
            ("12+34+2*(3+1)-7=47", "+:12:34"),
            ("12+34+7/2-3", "+:12:34"),
            ("12+34+5%3*2-3", "+:12:34"),
            ("12+34+7%0-0", "+:12:34"),
            ("6*7+1=43", "*:6:7"),
            ("6*7+2*3", "*:6:7"),
            ("12 + 2*17 = 46", "+:12:34"),
            ("(12 + 34)*2", "+:12:34"),
            // a bracket after a divisor is its divisor (`68/(2*1)` is not `68/2*1`)
            ("12 + 68/(4*2) + 0", "+:12:34"),
        ] {
            assert!(
                !k(text).contains(&not.to_string()),
                "{text:?}: {:?}",
                k(text)
            );
        }
        // A product standing alone keeps its factor of one.
        assert_eq!(k("6*1 = 6"), vec!["*:1:6"]);
        assert_eq!(k("1 * 6"), vec!["*:1:6"]);
        assert_eq!(k("6*7 = 42"), vec!["*:6:7"]);
        assert_eq!(k("(6*7) = 42"), vec!["*:6:7"]);
        assert_eq!(k("6*(7) = 42"), vec!["*:6:7"]);
        found_across("12+34+2*3-6=46", &[5, 6, 7, 8, 9], "+:12:34");
        // A long chain gives keys bounded by its terms: pairs at most two per term, threes
        // searched only in short chains.
        let many: String = (1..=40)
            .map(|i| format!("+{}-{}", 100 + i, 50 + i))
            .collect();
        assert!(k(&many).len() <= 2 * 80 + 2, "{}", k(&many).len());
        assert!(k(&long).len() <= 3, "{:?}", k(&long).len());
    }

    /// Whether `text`, cut into two adjacent rows at each of `cuts`, is still keyed `want`.
    fn found_across(text: &str, cuts: &[usize], want: &str) {
        use crate::policy::canon::{canonical, form_tokens};
        for &cut in cuts {
            let (a, b) = text.split_at(cut);
            let keys = keys_across(
                NormalForm::Arithmetic,
                &form_tokens(&canonical(a), false),
                &form_tokens(&canonical(b), false),
            );
            assert!(keys.contains(&want.to_string()), "{a:?} | {b:?}: {keys:?}");
        }
    }

    /// A sum of three split across two adjacent rows is still found, wherever the split falls
    /// (rows end between tokens: at each side of an operator).
    #[test]
    fn a_sum_of_three_split_across_rows_is_found() {
        found_across("12+34+56=", &[2, 3, 5, 6, 8], "+:12:34:56");
    }

    /// A row's last chain is read across the seam whole, however long: terms that cancel, or
    /// zeros, before the operands (`7+5+6+12+34` then `-7-5-6=46`) keep the chain's value, and
    /// the pair is `12+34` as it would be in one row.
    #[test]
    fn a_chain_longer_than_any_cut_is_read_across_rows() {
        found_across(
            "7 + 5 + 6 + 12 + 34 - 7 - 5 - 6 = 46",
            &[4, 8, 12, 17, 19, 22, 26],
            "+:12:34",
        );
        found_across(
            "9 + 0 + 0 + 0 + 0 + 0 + 12 + 34 - 9 =",
            &[27, 29, 32],
            "+:12:34",
        );
    }

    /// A tail cut midway across a seam (as it was, at eight symbols) posed what the whole row
    /// does not — a scratchpad column whose first addend was cut off — and every row after it
    /// was read as reproducing that problem. The seam reads the row's last chain from its last
    /// `=`, and its counts whole, so nothing starts midway.
    #[test]
    fn a_problem_made_by_cutting_the_tail_is_not_read_across_rows() {
        use crate::policy::canon::{canonical, form_tokens};
        let t = |s: &str| form_tokens(&canonical(s), false);
        let prev = t("3+92+37=3+2+7+0=2,0+9+3+1=3|132");
        for next in ["40+79+72=", "4+11+22=", "x"] {
            let keys = keys_across(NormalForm::Arithmetic, &prev, &t(next));
            assert!(!keys.contains(&"+:1:3:9".to_string()), "{next}: {keys:?}");
        }
        // What the seam joins is still read: the row ends `…=3|1 + 3 +`, the next `9 =`.
        let keys = keys_across(NormalForm::Arithmetic, &t("0+9+3+1=3|1 + 3 +"), &t("9 ="));
        assert!(keys.contains(&"+:1:3:9".to_string()), "{keys:?}");
        // Digits: a string whose counts were cut is no other string.
        let prev = t("5501234=0=1,1=1,2=1,3=1,4=1,5=2|0123455");
        let cut = keys_across(NormalForm::Digits, &prev, &t("x"));
        let whole = digits::keys_of(&prev, &prev, &|_| true);
        assert!(
            cut.iter().all(|k| whole.contains(k)),
            "{cut:?} vs {whole:?}"
        );
    }

    /// Signs and brackets split across two rows are read as one stream: `12 -` then `-34 = 46`
    /// is `12 + 34`, and so is `12 - (0 -` then `34) = 46`.
    #[test]
    fn signs_and_brackets_split_across_rows_are_read() {
        found_across("12 - -34 = 46", &[4, 5, 6], "+:12:34");
        found_across(
            "12 - (0 - 34) = 46",
            &[3, 4, 5, 6, 7, 8, 9, 10, 12, 13],
            "+:12:34",
        );
    }

    #[test]
    fn arithmetic_keeps_other_problems_apart() {
        assert_eq!(k("12+35="), vec!["+:12:35"]);
        assert_eq!(k("112+34="), vec!["+:34:112"]);
        assert_eq!(k("12-35="), vec!["-:12:35"]);
        assert_ne!(k("12-34="), k("12+34="), "a difference is not a sum");
        // Scratchpad steps are chains, not the problem `3+6`.
        assert!(
            !k("123+456=3+6+0=9,2+5+0=7,1+4+0=5|579")
                .iter()
                .any(|k| k.split(':').count() == 3 && k != "+:123:456")
        );
        assert!(k("123+456=3+6+0=9,2+5+0=7,1+4+0=5|579").contains(&"+:123:456".to_string()));
        // A chain with another operator in it is no sum of three.
        assert!(k("12+34-56=").is_empty());
        assert!(k("12+34+56*2=").is_empty());
        assert_eq!(k("12+34+56="), vec!["+:12:34:56"]);
        // A zero addend is no other problem: `12+34+0` is `12+34`, wherever the zero stands.
        for text in [
            "12+34+0=46",
            "0 + 34 + 12 =",
            "12 plus zero plus thirty-four",
        ] {
            assert!(
                k(text).contains(&"+:12:34".to_string()),
                "{text:?}: {:?}",
                k(text)
            );
        }
        assert!(k("12+34+56+0=").contains(&"+:12:34:56".to_string()));
        // A zero subtracted too, and a zero added to a difference.
        for text in ["46-0-12=", "46-12-0=", "46+0-12=", "0+46-12="] {
            assert_eq!(k(text), vec!["-:12:46"], "{text:?}");
        }
        // A leading zero before a minus makes the next term negative: `0-46+12` is `12-46`, never
        // the sum `46+12`; `0-12` alone is the problem `0-12`, nothing else.
        assert_eq!(k("0-46+12="), vec!["-:12:46"], "0-46 is not 46");
        assert_eq!(k("0-12="), vec!["-:0:12"]);
        // ...but a column of digits stays a column.
        assert_eq!(k("3+6+0=9"), vec!["+:0:3:6"]);
        assert!(k("7-2-0=5").is_empty());
        assert!(k("7+0+0=7").iter().all(|k| k.split(':').count() > 3));
        assert_ne!(k("12+34+57="), k("12+34+56="));
        assert!(k("x_1 + 2").is_empty());
        assert!(k("no numbers here").is_empty());
    }

    /// The next tries once products were read: the same problem in another notation — powers and
    /// whole quotients as code writes them, number literals (decimals, scientific, hexadecimal),
    /// operators in other words, the operator after its operands, and names bound to numbers.
    #[test]
    fn a_problem_in_another_notation_is_read() {
        for text in [
            "12 + 34**1 =",
            "12 + 34^1 =",
            "12 + 34 to the power of 1",
            "12 + 34 + 2**2 - 4 =",
            "12 + 34 + 2*3^2 - 18 =",
            "12 + 34 + 2^3^1 - 8 =",
            "12 + 34 // 1 =",
            "12 + 34 + 9 // 3 - 3 =",
            "12.0 + 34.0 = 46.0",
            "12.00 + 34 =",
            "12 + 3.4e1 =",
            "1.2e1 + 34e0 =",
            "0x0c + 0x22 =",
            "0b1100 + 0o42 =",
            "what is 12 more than 34?",
            "12 plus 34 more",
            "34 increased by 12",
            "12 and 34 added together",
            "12 34 + = 46",
            "x = 12; y = 34; x + y =",
            "let n = 12; n + 34 =",
            "a + b = 46 where a = 12, b = 34",
            "x = 12.0, x = 12, x + 34",
            "sum(x, y) where x = 12, y = 34",
            "the sum of x and y, where x = 12 and y = 34",
            // a name that is a word stays one where no operator is beside it, and a binding
            // hides none of its numbers
            "12 apples, then plus 34 more apples = 46",
            "c = 12 plus 34",
            "c = 12 34 +",
        ] {
            assert!(
                k(text).contains(&"+:12:34".to_string()),
                "{text:?}: {:?}",
                k(text)
            );
        }
        assert_eq!(k("46 decreased by 12"), vec!["-:12:46"]);
        assert_eq!(k("12 fewer than 46"), vec!["-:12:46"]);
        // ...and keeps other problems apart.
        for (text, other) in [
            ("12.5 + 34 =", "a decimal that is not whole"),
            ("12 + 34**2 =", "a power that is not its base"),
            ("12 + 34 // 2 =", "a quotient that is not its dividend"),
            ("x = 12, x = 13, x + 34 =", "a name bound to two numbers"),
            ("x = 12 + 1; x + 34 =", "a name bound to a sum"),
            ("1 = 12; 1 + 34 =", "a number is no name"),
            ("12 + 3.4e2 =", "another power of ten"),
            ("1 12 34 + =", "three operands before the operator"),
        ] {
            assert!(
                !k(text).contains(&"+:12:34".to_string()),
                "{other}: {text:?} {:?}",
                k(text)
            );
        }
        assert_eq!(k("12.5 + 34 ="), vec!["+:5:34"]);
        assert!(
            k("0.12 + 34 + 0 =").contains(&"+:12:34".to_string()),
            "`0.` hides nothing"
        );
        assert_eq!(
            k("a + b = 46"),
            Vec::<String>::new(),
            "`b = 46` binds nothing"
        );
        // A tower of powers, a long literal and many names cost time linear in the row.
        let tower = format!("12 + 34{} =", "^1".repeat(20_000));
        assert!(k(&tower).contains(&"+:12:34".to_string()));
        assert!(
            k(&format!("12 + 34 + 0.{} =", "0".repeat(20_000))).contains(&"+:12:34".to_string())
        );
        let twice: String = (0..20_000)
            .map(|i| format!("v{i} = 1; v{i} = 2; "))
            .collect();
        assert!(k(&format!("{twice} 12 + 34 =")).contains(&"+:12:34".to_string()));
        let names: String = (0..5_000).map(|i| format!("v{i} = {i}; ")).collect();
        assert!(k(&format!("{names} v12 + v34 =")).contains(&"+:12:34".to_string()));
    }

    /// The next try once products were read: the extras' factor a bracketed sum (`2*(4-1)`), and
    /// a factor of one on the item's bracket written as a quotient or a sum (`(12+34)*7/7`,
    /// `(2-1)*(12+34)`).
    #[test]
    fn a_bracketed_sum_that_is_a_factor_is_read_as_its_value() {
        for text in [
            "12+34+2*(4-1)-6 =",
            "12 + 34 + 5*(1-1) =",
            "12 + 34 + (2+1)*(5-3) - 6 =",
            "12 + 34 - 18/(4+5) + 2 =",
            "12 + 34 + (1+1)^2 - 4 =",
            "(12+34)*7/7 =",
            "7/7*(12+34) =",
            "(12+34)*(2-1) =",
            "(12 + 34) / (3 - 2) =",
            "(2-1)*(12+34) =",
            "(12+34)*1 =",
            "1*(12+34) =",
        ] {
            assert!(
                k(text).contains(&"+:12:34".to_string()),
                "{text:?}: {:?}",
                k(text)
            );
        }
        for text in [
            "(12 + 34)*2 =",
            "2*(12+34) =",
            "(12+34)*7/5 =",
            "(12+34)*2/2^1 =",
            "2*3*(12+34)/6 - 1 =",
            "12 + 34 + 2*(1-4) + 6 =",
        ] {
            assert!(
                !k(text).contains(&"+:12:34".to_string()),
                "{text:?}: {:?}",
                k(text)
            );
        }
        // Long runs of brackets and factors cost time linear in the row.
        let many = format!("12 + 34{} =", "*(2-1)".repeat(20_000));
        assert!(k(&many).contains(&"+:12:34".to_string()));
        let deep = format!("{}12 + 34{} =", "(".repeat(20_000), ")*7/7".repeat(20_000));
        assert!(!k(&deep).is_empty());
    }

    fn dk(text: &str) -> Vec<String> {
        keys(NormalForm::Digits, &form_tokens(&canonical(text), true))
    }

    /// The digits keys of two adjacent rows together.
    fn dk_across(a: &str, b: &str) -> Vec<String> {
        keys_across(
            NormalForm::Digits,
            &form_tokens(&canonical(a), true),
            &form_tokens(&canonical(b), true),
        )
    }

    #[test]
    fn digits_equate_a_sorting_problem_in_any_order_and_surface_form() {
        let key = "d:012359".to_string();
        for text in [
            "530912=",
            "219035=",
            "=012359",
            "r953210",
            "x530912y",
            "5 3 0 9 1 2",
            "5,3,0,9,1,2",
            "five three zero nine one two",
            "sort 530 please 912",
            "\u{FF15}\u{FF13}\u{FF10}912",
            "7 530912",
            "530912 → 012359",
            "0=1,1=1,2=1,3=1,5=1,9=1|012359",
            "530+912",
            "5+3+0+9+1+2",
            "5-3*0/9<1>2%",
            "5 = 3 = 0 = 9 = 1 = 2",
        ] {
            assert!(dk(text).contains(&key), "{text:?}: {:?}", dk(text));
        }
        // An item's prompt has one key.
        assert_eq!(dk("530912="), vec![key.clone()]);
        // Other strings are other problems: another multiset, a longer string that holds the
        // digits and more in one token, or `digit=count` pairs (two single digits joined by `=`
        // are no chain).
        for text in ["530913=", "7530912=", "5=3,0=9,1=2"] {
            assert!(!dk(text).contains(&key), "{text:?}: {:?}", dk(text));
        }
        // Groups joined by `=`, one of two digits or more, are one string (a red-team helper's
        // `467=297=` taught a digit-sum item, whose answer holds none of its digits), padded
        // digits so joined too, and tens words are their digits; a string's own running sums
        // after it (the digit-sum scratchpad) join nothing.
        for text in [
            "530=912",
            "5309=12",
            "5=3=0=9=12",
            "53 = 09 = 12 = 20",
            "05=03=00=09=01=02=",
            "q530=912z=",
            "530=x=912=",
            "53 = - 09 = + 12",
            "005 003 000 009 001 002 =",
            "fifty-three, zero, nine, twelve",
            "fifty three zero nine twelve",
            "\u{4E94}\u{4E09}\u{3007}\u{4E5D}\u{4E00}\u{4E8C}=",
        ] {
            assert!(dk(text).contains(&key), "{text:?}: {:?}", dk(text));
        }
        // (Of six or seven digits, as the digit-sum families' items have.)
        let scratch = "467297=04=10=17=19=28=35|35";
        let long: Vec<String> = dk(scratch)
            .into_iter()
            .filter(|k| (8..=9).contains(&k.len()))
            .collect();
        assert_eq!(long, vec!["d:246779".to_string()], "{scratch}");
        assert!(
            dk("530912=012359").iter().all(|k| k == &key || k.len() > 8),
            "{:?}",
            dk("530912=012359")
        );
        // Split across two rows, wherever the cut falls between tokens.
        for (a, b) in [("5 3 0", "9 1 2"), ("x=530", "912=")] {
            let keys = dk_across(a, b);
            assert!(keys.contains(&key), "{a:?} | {b:?}: {keys:?}");
        }
        // And in groups joined by `=` across the seam.
        for (a, b) in [("530=", "912"), ("53=09=", "12="), ("x 5309=", "12")] {
            let keys = dk_across(a, b);
            assert!(keys.contains(&key), "{a:?} | {b:?}: {keys:?}");
        }
    }

    #[test]
    fn digits_read_a_string_written_as_its_digits_counts() {
        let key = "d:012359".to_string();
        // The scratchpad's counts without the string or its answer, in any order, in words,
        // with filler and with pairs counting none between them.
        for text in [
            "0=1,1=1,2=1,3=1,5=1,9=1",
            "9=1 5=1 3=1 2=1 1=1 0=1",
            "zero=one, one=one, two=one, three=one, five=one, nine=one",
            "counts 0=1 and 4=0 then 1=1,2=1,3=1,5=1,9=1 done",
            "\u{FF10}=\u{FF11},1=1,2=1,3=1,5=1,9=1",
            "(0)=(1),(1)=(1),(2)=(1),(3)=(1),(5)=(1),(9)=(1)",
        ] {
            assert!(dk(text).contains(&key), "{text:?}: {:?}", dk(text));
        }
        assert!(dk("5=2,0=1").contains(&"d:055".to_string()));
        // Count first, digit second, in digits or in words.
        for text in [
            "1=0, 1=1, 1=2, 1=3, 1=5, 1=9",
            "one=nine one=five one=three one=two one=one one=zero",
        ] {
            assert!(dk(text).contains(&key), "{text:?}: {:?}", dk(text));
        }
        assert!(dk("2=5, 1=0").contains(&"d:055".to_string()));
        // A scratchpad (its digits ascending) is read one way only: `0=1,1=2,5=3` is `011555`,
        // never six digits counted the other way (`233333`), which could be a protected item.
        let pad = dk("0=1,1=2,5=3");
        assert!(pad.contains(&"d:011555".to_string()), "{pad:?}");
        assert!(!pad.contains(&"d:233333".to_string()), "{pad:?}");
        // Other multisets, or counts cut apart by a digit or an `=` of their own, are others.
        for text in [
            "0=1,1=1,2=1,3=1,5=1,9=2",
            "0=1,1=1,2=1,7,3=1,5=1,9=1",
            "0=1,1=1,2=1 = 3=1,5=1,9=1",
            "0=1,1=1,2=1,3=1,5=13,9=1",
        ] {
            assert!(!dk(text).contains(&key), "{text:?}: {:?}", dk(text));
        }
        // Split across two rows, the first's counts running into the second's.
        for (a, b) in [
            ("0=1,1=1,2=1", "3=1,5=1,9=1"),
            ("sorting: 0=1", "1=1,2=1,3=1,5=1,9=1|"),
        ] {
            let keys = dk_across(a, b);
            assert!(keys.contains(&key), "{a:?} | {b:?}: {keys:?}");
        }
        // However many pairs a row holds, each starts at most `MAX_DIGITS` keys.
        let row = "1=1,".repeat(20_000);
        assert!(dk(&row).len() <= digits::MAX_DIGITS, "{}", dk(&row).len());
        // Pairs of every digit and count, read both ways (not ascending): still at most
        // `MAX_DIGITS` keys from each pair in each reading.
        let spread: String = (0..20_000)
            .map(|i| format!("{}={}, ", i % 10, i % 7 + 1))
            .collect();
        assert!(dk(&spread).len() <= 2 * 20_000 * digits::MAX_DIGITS);
    }

    /// The keys of rows read as one stream (`Carry`) under `form`, its end included.
    fn rows_keys(form: NormalForm, rows: &[&str]) -> Vec<String> {
        let mut carry = Carry::default();
        let mut keys = Vec::new();
        for row in rows {
            let toks: Arc<[String]> = form_tokens(&canonical(row), form.reads_counts()).into();
            keys.extend(carry.keys(form, &toks, &|_: &str| true));
            carry.push(toks, &[form]);
        }
        keys.extend(carry.keys_at_end(form, &|_: &str| true));
        keys.sort();
        keys.dedup();
        keys
    }

    fn dk_rows(rows: &[&str]) -> Vec<String> {
        rows_keys(NormalForm::Digits, rows)
    }

    /// A scan that wants some multisets (`Wanted::digits`) reads what one wanting every key
    /// reads, of those: the packed filter drops no key the scan looks for, in any reading
    /// (runs, inside a token, chains, counts either way, a stream's open string and pairs).
    #[test]
    fn a_scan_wanting_some_multisets_finds_exactly_those() {
        struct Want(HashSet<String>, HashSet<u64>);
        impl Wanted for Want {
            fn key(&self, key: &str) -> bool {
                self.0.contains(key)
            }
            fn digits(&self, packed: u64) -> bool {
                self.1.contains(&packed)
            }
        }
        use std::collections::HashSet;
        let streams: [&[&str]; 6] = [
            &["467297=2=1,4=1,6=1,7=2,9=1|246779", "530912=012359"],
            &["x467297246779y", "4 6 7", "297 ="],
            &["7=2,9=1", "2=1,4=1", "6=1=", "1=9,1=5 1=3"],
            &["5=3=0", "=9=1=2", "7530912=", "0:1 1:1 2:1 3:1 5:1 9:1"],
            &["four six seven two nine seven =", "2x1 4x1 6x1 7x2 9x1"],
            &["46 72 97", "12 34 =", "530912"],
        ];
        for rows in streams {
            let all = dk_rows(rows);
            assert!(all.len() > 4, "{rows:?}: {all:?}");
            // Every other key wanted, then each alone.
            let every_other: Vec<&String> = all.iter().step_by(2).collect();
            for wanted in std::iter::once(every_other).chain(all.iter().map(|k| vec![k])) {
                let want = Want(
                    wanted.iter().map(|k| k.to_string()).collect(),
                    wanted.iter().filter_map(|k| digits::packed(k)).collect(),
                );
                assert_eq!(want.1.len(), want.0.len(), "every digits key packs");
                let mut carry = Carry::default();
                let mut got = Vec::new();
                for row in rows {
                    let toks: Arc<[String]> = form_tokens(&canonical(row), true).into();
                    got.extend(carry.keys(NormalForm::Digits, &toks, &want));
                    carry.push(toks, &[NormalForm::Digits]);
                }
                got.extend(carry.keys_at_end(NormalForm::Digits, &want));
                got.sort();
                got.dedup();
                let mut expected: Vec<String> = wanted.into_iter().cloned().collect();
                expected.sort();
                assert_eq!(got, expected, "{rows:?}");
            }
        }
        assert_eq!(digits::packed("d:0011"), Some(2 + (2 << 4)));
        for bad in ["d:", "d:12a", "ops:rev", "d:0123456789012"] {
            assert_eq!(digits::packed(bad), None, "{bad}");
        }
    }

    /// A string written as a chain (`5=3=0`) or as its digits' counts runs through any number of
    /// rows, split at a sign, inside a pair, with filler rows and pairs counting none between:
    /// read as in one row. A digit of its own between the pieces ends it there as in one row.
    #[test]
    fn digits_chains_and_counts_run_through_any_number_of_rows() {
        let key = "d:012359".to_string();
        let zeros = vec!["4=0, 6=0, 7=0"; 40];
        let mut padded = vec!["0=1", "1=1"];
        padded.extend(zeros.iter().copied());
        padded.extend(["plain words", "2=1,3=1", "5=1", "9=1"]);
        // Count first, with pairs counting none that way (`0=9`: nine 0s digit first) between.
        let mut flipped = vec!["1=0", "1=1"];
        flipped.extend(vec!["0=7, 0=8"; 40]);
        flipped.extend(["1=2", "1=3", "1=5", "1=9"]);
        let cases: Vec<Vec<&str>> = vec![
            vec!["5=3=0", "=9=1=2"],
            vec!["5=3", "=0=9", "=1=", "2"],
            vec!["5 =", "3", "= 0 = 9 = 1 = 2 then more"],
            vec!["0=1,1=1", "2=1", "3=1,5=1", "9=1"],
            vec!["0=1,1=1,2", "=1,3=1,5=1,9=1"],
            vec!["0=1,1=1,2 =", "1,3=1,5=1,9=1"],
            padded,
            flipped,
        ];
        for rows in &cases {
            let keys = dk_rows(rows);
            assert!(keys.contains(&key), "{rows:?}: {keys:?}");
        }
        for rows in [
            vec!["5=3=0", "7", "=9=1=2"],
            vec!["0=1,1=1,2=1", "7", "3=1,5=1,9=1"],
            vec!["0=1,1=1,2=1", "=", "3=1,5=1,9=1"],
        ] {
            let keys = dk_rows(&rows);
            assert!(!keys.contains(&key), "{rows:?}: {keys:?}");
        }
        // A scratchpad's ascending counts, spread over rows, are still read one way only.
        let pad = dk_rows(&["0=1,", "1=2,", "5=3"]);
        assert!(pad.contains(&"d:011555".to_string()), "{pad:?}");
        assert!(!pad.contains(&"d:233333".to_string()), "{pad:?}");
        // A flood of rows holding one chain: what stays open is cut, so its keys are its
        // windows' (ten places to start, `MAX_DIGITS` lengths), however many rows it runs through.
        let chain = vec!["=1=2=3=4=5=6=7=8=9=0"; 5_000];
        assert!(dk_rows(&chain).len() <= 10 * digits::MAX_DIGITS);
    }

    #[test]
    fn digits_counts_with_any_count_sign_are_read() {
        let key = "d:012359".to_string();
        // Any sign the tokens keep, `:` (and its look-alike), a run of signs, `x` apart or
        // glued: in one row, count first, and across rows split at the sign.
        for text in [
            "0:1 1:1 2:1 3:1 5:1 9:1",
            "0\u{2236}1, 1\u{2236}1, 2\u{2236}1, 3\u{2236}1, 5\u{2236}1, 9\u{2236}1",
            "0*1,1*1,2*1,3*1,5*1,9*1",
            "0->1, 1->1, 2->1, 3->1, 5->1, 9->1",
            "0 := 1; 1 := 1; 2 := 1; 3 := 1; 5 := 1; 9 := 1",
            "0 x 1, 1 x 1, 2 x 1, 3 x 1, 5 x 1, 9 x 1",
            "0x1 1x1 2x1 3x1 5x1 9x1",
            "1:0 1:1 1:2 1:3 1:5 1:9",
            "0:1, 4:0, 1:1, 2=1, 3->1, 5x1, 9*1",
            "0=>1 1:=1 2 x 1 3:1 5:1 9:1",
        ] {
            assert!(dk(text).contains(&key), "{text:?}: {:?}", dk(text));
        }
        for rows in [
            vec!["0:1 1:1 2:", "1 3:1 5:1 9:1"],
            vec!["0 -", ">", "1 1->1 2->1 3->1 5->1 9->1"],
            vec!["0x1", "1x1", "2x1", "3x1", "5x1", "9x1"],
        ] {
            let keys = dk_rows(&rows);
            assert!(keys.contains(&key), "{rows:?}: {keys:?}");
        }
        // Cut by a digit or an `=` of its own, or a pair that is no count (`13`): another.
        for text in [
            "0:1 1:1 2:1 7 3:1 5:1 9:1",
            "0:1 1:1 2:1 = 3:1 5:1 9:1",
            "0:1 1:1 2:1 3:1 5:13 9:1",
        ] {
            assert!(!dk(text).contains(&key), "{text:?}: {:?}", dk(text));
        }
        // A string written with signs between its digits is still the string; `:` is no sign
        // to arithmetic (`12:34` is `12 34`, no problem).
        assert!(dk("0-1-2-3-5-9").contains(&key));
        // A dash or `>` alone is no count's sign: `5-3-0-9-1-2` and `9>5>3>2>1>0` are strings,
        // never five 9s or three 5s.
        let dashed = dk("5-3-0-9-1-2");
        assert!(
            dashed.contains(&key) && !dashed.contains(&"d:555".to_string()),
            "{dashed:?}"
        );
        let descending = dk("9>5>3>2>1>0");
        assert!(descending.contains(&key), "{descending:?}");
        assert!(
            !descending.contains(&"d:99999".to_string()),
            "{descending:?}"
        );
        assert!(k("12:34").is_empty(), "{:?}", k("12:34"));
        assert_eq!(k("12 : + 34 ="), k("12 + 34 ="));
    }

    #[test]
    fn a_scan_reads_digits_side_by_side_inside_a_token() {
        let key = "d:246779".to_string();
        // A prompt and its answer with no `=` between, a digit before the string, two items
        // back to back: one token each, read digit by digit.
        for row in ["467297246779", "1467297", "467297041308", "x467297246779y"] {
            let keys = dk_rows(&[row]);
            assert!(keys.contains(&key), "{row:?}: {keys:?}");
        }
        // An item is its whole string: `7530912=` is not the problem `530912=`.
        assert!(!dk("7530912=").contains(&"d:012359".to_string()));
        // A run inside tokens stays inside one (two rows of honest strings side by side hold no
        // string of their digits that straddles them); groups joined by `=` are one string.
        assert!(dk_rows(&["467=297"]).contains(&key));
        assert!(!dk_rows(&["46 7297"]).contains(&"d:2679".to_string()));
        assert!(!dk_rows(&["530912=012359", "467297=246779"]).contains(&"d:123459".to_string()));
    }

    fn ak_rows(rows: &[&str]) -> Vec<String> {
        rows_keys(NormalForm::Arithmetic, rows)
    }

    #[test]
    fn a_problems_numbers_and_its_answer_side_by_side_are_its_relation() {
        let key = relation(NormalForm::Arithmetic, "4672+6458=", "11130").expect("a relation");
        assert_eq!(key, "r:4672,6458>11130");
        let sum3 = relation(NormalForm::Arithmetic, "467+645+41=", "1153");
        assert_eq!(sum3.as_deref(), Some("r:41,467,645>1153"));
        let diff = relation(NormalForm::Arithmetic, "467-645=", "-178");
        assert_eq!(diff.as_deref(), Some("r:467,645>178"));
        assert_eq!(relation(NormalForm::Digits, "530912=", "012359"), None);
        assert_eq!(relation(NormalForm::Arithmetic, "53-7=", "46"), None);
        assert!(relation(NormalForm::Arithmetic, "53-27=", "26").is_some());
        for row in [
            "4672+6458 -> 11130",
            "4672 and 6458 = 11130",
            "6458 & 4672 = 11130",
            "{\"a\": 4672, \"b\": 6458, \"sum\": 11130}",
            "x - 6458 = 4672, x = 11130",
            "  4672\n+ 6458\n------\n 11130",
            "9344/2 + 6458 = 11130",
        ] {
            let keys = ak_rows(&[row]);
            assert!(keys.contains(&key), "{row:?}: {keys:?}");
        }
        // Another answer, a number between, the answer first, or numbers in other rows: other
        // relations. An honest row of a subtraction family is never its inverse's item.
        for rows in [
            vec!["4672 and 6458 = 11131"],
            vec!["4672 and 6458 and 7 = 11130"],
            vec!["11130 - 4672 = 6458"],
            vec!["4672 + 6458 =", "11130"],
        ] {
            let keys = ak_rows(&rows);
            assert!(!keys.contains(&key), "{rows:?}: {keys:?}");
        }
        let sub = relation(NormalForm::Arithmetic, "53-27=", "26").expect("a relation");
        assert!(!ak_rows(&["53-26=27"]).contains(&sub));
        // However many numbers a row holds, each ends at most two runs.
        let flood: String = (0..10_000).map(|i| format!("{i} ")).collect();
        let keys = ak_rows(&[&flood]).len();
        assert!((10_000..=2 * 10_000).contains(&keys), "{keys}");
    }

    /// A flood of digits gives keys linear in the row: at most `MAX_DIGITS` per token.
    #[test]
    fn a_row_of_many_digits_gives_keys_linear_in_its_tokens() {
        let row = "1 ".repeat(50_000);
        let keys = dk(&row);
        assert!(keys.len() <= digits::MAX_DIGITS, "{}", keys.len());
        let spread: String = (0..20_000).map(|i| format!("{} ", i % 10)).collect();
        assert!(dk(&spread).len() <= 20_000 * digits::MAX_DIGITS);
    }
}
