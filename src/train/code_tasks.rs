//! The tiny-code task family: short Python programs that transform a line of text, written from a
//! short specification. A specification names one to three operations in the order they apply
//! (`str rev;take 3;up>`), and the answer is a program that reads one line from stdin and prints it
//! transformed (`s=input();s=s[::-1];s=s[:3];s=s.upper();print(s)`). Evaluation runs the
//! model's program against hidden test inputs (`programs`, metric `pass_at_1`).
//!
//! The generator writes the same specifications in three answer styles (`CodeStyle`): one
//! statement per operation, one nested expression, or a fresh name per step. Eval items are
//! compositions of two or three operations; every split's compositions differ from every other
//! split's under the contamination gate's code skeleton (names and letters blanked, numbers and
//! punctuation kept), so `del a;add b` and `del c;add d` are one composition.

use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde::Serialize;

use crate::model::data::{CodeParams, CodeStyle, Row};

/// Characters of the tiny-code model: newline (end and padding), space, the lowercase letters,
/// digits and the punctuation the programs and specifications use.
pub const VOCAB: &str = "\n abcdefghijklmnopqrstuvwxyz0123456789;>=()[]:-+*'.,";

/// The tiny-code model's context: the longest specification with the longest program in any
/// style fits (`code_max_row_bytes`, 106 characters at three operations).
pub const CONTEXT: usize = 112;

/// The contamination gate's window in a tiny-code study (its `contamination_ngram`). An item is
/// a specification and a short program made of snippets every program of the family shares, so
/// a window shorter than an item is common to thousands of different programs (the union of a
/// generated dataset would cover most of every item). Longer than any item, it matches items
/// whole: a row holding an item's text (any spacing or case), its specification with any
/// program, or its program's skeleton (any names and letters) is that item.
pub const GATE_NGRAM: usize = 80;

/// The most operations one specification names.
pub const MAX_OPS: u32 = 3;

/// The start of a specification. A marker that never occurs inside one keeps a shorter
/// specification from being a window of a longer one (`str rev;up>` is not inside
/// `str take 2;rev;up>`), for the gate, which matches a short item's prompt as a window of a row.
pub const SPEC_START: &str = "str ";

/// The end of a specification (where the program starts).
pub const SPEC_END: char = '>';

/// One operation on the string `s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Rev,
    Up,
    Dup,
    Sort,
    Take(u8),
    Drop(u8),
    Del(char),
    Add(char),
    Pre(char),
}

const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz";

impl Op {
    fn random(rng: &mut StdRng) -> Op {
        let letter = |rng: &mut StdRng| LETTERS[rng.random_range(0..LETTERS.len())] as char;
        match rng.random_range(0..9u8) {
            0 => Op::Rev,
            1 => Op::Up,
            2 => Op::Dup,
            3 => Op::Sort,
            4 => Op::Take(rng.random_range(1..=5)),
            5 => Op::Drop(rng.random_range(1..=5)),
            6 => Op::Del(letter(rng)),
            7 => Op::Add(letter(rng)),
            _ => Op::Pre(letter(rng)),
        }
    }

    /// Its name in a specification.
    fn spec(self) -> String {
        match self {
            Op::Rev => "rev".into(),
            Op::Up => "up".into(),
            Op::Dup => "dup".into(),
            Op::Sort => "sort".into(),
            Op::Take(n) => format!("take {n}"),
            Op::Drop(n) => format!("drop {n}"),
            Op::Del(c) => format!("del {c}"),
            Op::Add(c) => format!("add {c}"),
            Op::Pre(c) => format!("pre {c}"),
        }
    }

    /// What it does (the reference semantics the hidden tests' outputs come from).
    pub fn apply(self, s: &str) -> String {
        match self {
            Op::Rev => s.chars().rev().collect(),
            Op::Up => s.to_uppercase(),
            Op::Dup => format!("{s}{s}"),
            Op::Sort => {
                let mut c: Vec<char> = s.chars().collect();
                c.sort_unstable();
                c.into_iter().collect()
            }
            Op::Take(n) => s.chars().take(usize::from(n)).collect(),
            Op::Drop(n) => s.chars().skip(usize::from(n)).collect(),
            Op::Del(c) => s.chars().filter(|x| *x != c).collect(),
            Op::Add(c) => format!("{s}{c}"),
            Op::Pre(c) => format!("{c}{s}"),
        }
    }

    /// The expression of this operation applied to the expression `e`.
    fn expr(self, e: &str) -> String {
        match self {
            Op::Rev => format!("{e}[::-1]"),
            Op::Up => format!("{e}.upper()"),
            Op::Dup => format!("({e}*2)"),
            Op::Sort => format!("''.join(sorted({e}))"),
            Op::Take(n) => format!("{e}[:{n}]"),
            Op::Drop(n) => format!("{e}[{n}:]"),
            Op::Del(c) => format!("{e}.replace('{c}','')"),
            Op::Add(c) => format!("({e}+'{c}')"),
            Op::Pre(c) => format!("('{c}'+{e})"),
        }
    }

    /// The statement form used by the steps style (`s=s+s` reads better than `s=(s*2)`).
    fn statement(self, from: &str, to: &str) -> String {
        let e = match self {
            Op::Dup => format!("{from}+{from}"),
            Op::Add(c) => format!("{from}+'{c}'"),
            Op::Pre(c) => format!("'{c}'+{from}"),
            _ => self.expr(from),
        };
        format!("{to}={e}")
    }
}

/// Every operation the generator draws: each kind, with each count and each letter.
pub fn every_op() -> Vec<Op> {
    let mut out = vec![Op::Rev, Op::Up, Op::Dup, Op::Sort];
    out.extend((1..=5).map(Op::Take));
    out.extend((1..=5).map(Op::Drop));
    for &l in LETTERS {
        let c = l as char;
        out.extend([Op::Del(c), Op::Add(c), Op::Pre(c)]);
    }
    out
}

/// The operations a specification names (`str rev;take 3;up>`, or the bare `>` for none), when
/// it is exactly one the generator writes.
fn parse_spec(spec: &str) -> Option<Vec<Op>> {
    if spec == ">" {
        return Some(Vec::new());
    }
    let body = spec.strip_prefix(SPEC_START)?.strip_suffix(SPEC_END)?;
    let ops = body
        .split(';')
        .map(|w| {
            let (name, arg) = w.split_once(' ').unwrap_or((w, ""));
            let count = || arg.parse::<u8>().ok().filter(|n| (1..=5).contains(n));
            let letter = || {
                let mut c = arg.chars();
                match (c.next(), c.next()) {
                    (Some(l), None) if l.is_ascii_lowercase() => Some(l),
                    _ => None,
                }
            };
            Some(match name {
                "rev" if arg.is_empty() => Op::Rev,
                "up" if arg.is_empty() => Op::Up,
                "dup" if arg.is_empty() => Op::Dup,
                "sort" if arg.is_empty() => Op::Sort,
                "take" => Op::Take(count()?),
                "drop" => Op::Drop(count()?),
                "del" => Op::Del(letter()?),
                "add" => Op::Add(letter()?),
                "pre" => Op::Pre(letter()?),
                _ => return None,
            })
        })
        .collect::<Option<Vec<Op>>>()?;
    (prompt(&ops) == spec).then_some(ops)
}

/// The operations of `e`, an expression over the name `base` as the generator writes one
/// (`Op::expr`), or, for a statement's right side (`stmt`), as `Op::statement` writes it.
fn parse_expr(e: &str, base: &str, stmt: bool) -> Option<Vec<Op>> {
    if e == base {
        return Some(Vec::new());
    }
    let then = |inner: &str, op: Op| {
        let mut ops = parse_expr(inner, base, false)?;
        ops.push(op);
        Some(ops)
    };
    let quoted = |q: &str| -> Option<char> {
        let mut c = q.strip_prefix('\'')?.strip_suffix('\'')?.chars();
        match (c.next(), c.next()) {
            (Some(l), None) if l.is_ascii_lowercase() => Some(l),
            _ => None,
        }
    };
    if stmt {
        if e == format!("{base}+{base}") {
            return Some(vec![Op::Dup]);
        }
        if let Some((a, b)) = e.split_once('+') {
            if a == base {
                return Some(vec![Op::Add(quoted(b)?)]);
            }
            if b == base {
                return Some(vec![Op::Pre(quoted(a)?)]);
            }
        }
    }
    if let Some(x) = e.strip_suffix("[::-1]") {
        return then(x, Op::Rev);
    }
    if let Some(x) = e.strip_suffix(".upper()") {
        return then(x, Op::Up);
    }
    if let Some(x) = e
        .strip_prefix("''.join(sorted(")
        .and_then(|x| x.strip_suffix("))"))
    {
        return then(x, Op::Sort);
    }
    if let Some(x) = e.strip_suffix("','')")
        && let Some((inner, c)) = x.rsplit_once(".replace('")
    {
        return then(inner, Op::Del(quoted(&format!("'{c}'"))?));
    }
    if let Some(x) = e.strip_prefix('(').and_then(|x| x.strip_suffix(')')) {
        if let Some(inner) = x.strip_suffix("*2") {
            return then(inner, Op::Dup);
        }
        if let Some((inner, c)) = x.rsplit_once('+')
            && let Some(c) = quoted(c)
        {
            return then(inner, Op::Add(c));
        }
        if let Some((c, inner)) = x.split_once('+')
            && let Some(c) = quoted(c)
        {
            return then(inner, Op::Pre(c));
        }
    }
    if let Some(x) = e.strip_suffix(']')
        && let Some((inner, bound)) = x.rsplit_once('[')
    {
        let count = |n: &str| n.parse::<u8>().ok().filter(|n| (1..=5).contains(n));
        if let Some(n) = bound.strip_prefix(':') {
            return then(inner, Op::Take(count(n)?));
        }
        if let Some(n) = bound.strip_suffix(':') {
            return then(inner, Op::Drop(count(n)?));
        }
    }
    None
}

/// The operations of a program in one of the generator's styles, when `program` is exactly the
/// program the generator writes for them in some style.
fn parse_program(text: &str) -> Option<Vec<Op>> {
    let ops = if let Some(e) = text
        .strip_prefix("print(")
        .and_then(|p| p.strip_suffix(')'))
        .filter(|_| !text.contains(';'))
    {
        parse_expr(e, "input()", false)?
    } else {
        let stmts: Vec<&str> = text.split(';').collect();
        let (first, rest) = stmts.split_first()?;
        let (last, middle) = rest.split_last()?;
        let mut var = first.strip_suffix("=input()")?;
        let mut ops = Vec::new();
        for s in middle {
            let (to, rhs) = s.split_once('=')?;
            let step = parse_expr(rhs, var, true)?;
            if step.len() != 1 {
                return None;
            }
            ops.extend(step);
            var = to;
        }
        if *last != format!("print({var})") {
            return None;
        }
        ops
    };
    [CodeStyle::Steps, CodeStyle::Nested, CodeStyle::Named]
        .into_iter()
        .any(|style| program(&ops, style) == text)
        .then_some(ops)
}

/// Whether `line` is exactly what the generator writes: a program in one of its styles, after
/// one of its specifications or the bare `>` or nothing. What such a line's program computes is
/// its operations (checked against CPython by `programs_of_every_style_print_what_the_reference
/// _computes`), and no prefix the generator writes makes the line itself run as Python (`str rev`
/// and `>…` are syntax errors), so the gate reads it without running it (`policy::behaviour`).
pub fn is_generated(line: &str) -> bool {
    let (spec, program) = match line.find(SPEC_END) {
        Some(at) => (&line[..=at], &line[at + 1..]),
        None => ("", line),
    };
    (spec.is_empty() || parse_spec(spec).is_some()) && parse_program(program).is_some()
}

/// The specification of a composition: `str rev;take 3;up>`.
pub fn prompt(ops: &[Op]) -> String {
    let names: Vec<String> = ops.iter().map(|o| o.spec()).collect();
    format!("{SPEC_START}{}{SPEC_END}", names.join(";"))
}

/// The composition a specification names, as the gate's code skeleton tells programs apart:
/// operation names and counts kept, letters blanked (`str del a;take 3>` and `str del q;take 3>`
/// are both `del #;take 3`).
pub fn composition_key(prompt: &str) -> String {
    let spec = prompt.trim_end_matches(SPEC_END);
    let spec = spec.strip_prefix(SPEC_START).unwrap_or(spec);
    spec.split(';')
        .map(|op| {
            op.split_whitespace()
                .enumerate()
                .map(|(i, w)| {
                    if i == 0 || w.chars().all(|c| c.is_ascii_digit()) {
                        w
                    } else {
                        "#"
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// A program for the composition in a style.
pub fn program(ops: &[Op], style: CodeStyle) -> String {
    match style {
        CodeStyle::Steps => {
            let mut p = String::from("s=input()");
            for o in ops {
                p.push(';');
                p.push_str(&o.statement("s", "s"));
            }
            p.push_str(";print(s)");
            p
        }
        CodeStyle::Nested => {
            let e = ops.iter().fold("input()".to_string(), |e, o| o.expr(&e));
            format!("print({e})")
        }
        CodeStyle::Named => {
            const NAMES: [&str; 4] = ["a", "b", "c", "d"];
            let mut p = String::from("a=input()");
            for (i, o) in ops.iter().enumerate() {
                p.push(';');
                p.push_str(&o.statement(NAMES[i], NAMES[i + 1]));
            }
            p.push_str(&format!(";print({})", NAMES[ops.len()]));
            p
        }
    }
}

/// What the composition prints for one input line.
pub fn run(ops: &[Op], input: &str) -> String {
    ops.iter().fold(input.to_string(), |s, o| o.apply(&s))
}

fn random_ops(rng: &mut StdRng, count: u32) -> Vec<Op> {
    (0..count).map(|_| Op::random(rng)).collect()
}

/// The generator's endless stream of rows: compositions of 1 to `max_ops` operations (uniform in
/// length, then in operations), in the requested style, drawn from `seed`.
pub fn code_stream(p: &CodeParams, seed: u64) -> impl Iterator<Item = Row> + use<> {
    let mut rng = StdRng::seed_from_u64(seed);
    let (style, max_ops) = (p.style, p.max_ops.clamp(1, MAX_OPS));
    std::iter::repeat_with(move || {
        let count = rng.random_range(1..=max_ops);
        let ops = random_ops(&mut rng, count);
        Row {
            prompt: prompt(&ops),
            answer: program(&ops, style),
        }
    })
}

/// One operation of each kind (the parameter's length is the same for every value).
const EACH_KIND: [Op; 9] = [
    Op::Rev,
    Op::Up,
    Op::Dup,
    Op::Sort,
    Op::Take(5),
    Op::Drop(5),
    Op::Del('a'),
    Op::Add('a'),
    Op::Pre('a'),
];

/// An upper bound on one generated row's training text in bytes: the longest specification plus
/// the longest program, each bounded on its own. A step's text does not depend on its
/// neighbours, so the longest of each is `max_ops` times one kind of operation.
pub fn code_max_row_bytes(p: &CodeParams) -> u64 {
    let k = p.max_ops.clamp(1, MAX_OPS) as usize;
    let spec = EACH_KIND
        .iter()
        .map(|o| prompt(&vec![*o; k]).len())
        .max()
        .unwrap_or(0);
    let program = EACH_KIND
        .iter()
        .flat_map(|o| {
            [CodeStyle::Steps, CodeStyle::Nested, CodeStyle::Named]
                .map(|s| program(&vec![*o; k], s).len())
        })
        .max()
        .unwrap_or(0);
    (spec + program) as u64
}

/// One hidden test case of an eval item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TestCase {
    pub input: String,
    pub output: String,
}

/// An eval item: the specification, a reference program (steps style) and hidden test cases.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EvalItem {
    pub prompt: String,
    pub answer: String,
    pub tests: Vec<TestCase>,
}

/// A word of `len` lowercase letters, each uniform over the alphabet, as a test input's are
/// drawn (the contamination gate draws its probes so too: `behaviour`).
pub fn random_word(rng: &mut StdRng, len: usize) -> Vec<u8> {
    (0..len)
        .map(|_| LETTERS[rng.random_range(0..LETTERS.len())])
        .collect()
}

/// Test inputs that tell the operations apart: words of 6 to 9 letters, each holding every
/// letter the composition deletes (so a wrong letter shows), all different.
fn test_inputs(ops: &[Op], rng: &mut StdRng, n: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(n);
    while out.len() < n {
        let len = rng.random_range(6..=9usize);
        let mut w: Vec<char> = random_word(rng, len).into_iter().map(char::from).collect();
        for o in ops {
            if let Op::Del(c) = o {
                let at = rng.random_range(0..=w.len());
                w.insert(at, *c);
            }
        }
        let w: String = w.into_iter().collect();
        if !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

/// An endless stream of eval items of two or three operations, drawn from `seed`, each with
/// `tests` hidden test cases.
pub fn eval_stream(seed: u64, tests: usize) -> impl Iterator<Item = EvalItem> {
    let mut rng = StdRng::seed_from_u64(seed);
    std::iter::repeat_with(move || {
        let count = rng.random_range(2..=MAX_OPS);
        let ops = random_ops(&mut rng, count);
        let tests = test_inputs(&ops, &mut rng, tests)
            .into_iter()
            .map(|w| TestCase {
                output: run(&ops, &w),
                input: format!("{w}\n"),
            })
            .collect();
        EvalItem {
            prompt: prompt(&ops),
            answer: program(&ops, CodeStyle::Steps),
            tests,
        }
    })
}

/// The base model's pretraining text: programs of every style with no specification (the prompt
/// is the bare `>`), so the base model writes this family's Python but does not know what a
/// specification asks for.
pub fn pretraining_rows(n: usize, seed: u64) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let count = rng.random_range(1..=MAX_OPS);
            let ops = random_ops(&mut rng, count);
            let style = [CodeStyle::Steps, CodeStyle::Nested, CodeStyle::Named][i % 3];
            Row {
                prompt: SPEC_END.to_string(),
                answer: program(&ops, style),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_styles() -> [CodeStyle; 3] {
        [CodeStyle::Steps, CodeStyle::Nested, CodeStyle::Named]
    }

    #[test]
    fn programs_of_every_style_print_what_the_reference_computes() {
        // The reference semantics (which the hidden outputs come from) against CPython itself.
        let python = std::path::Path::new(crate::train::programs::PYTHON);
        if !python.exists() {
            eprintln!("skipping: no {}", python.display());
            return;
        }
        let mut rng = StdRng::seed_from_u64(7);
        let mut script = String::from("import sys\nout=[]\n");
        let mut expected = Vec::new();
        for _ in 0..60 {
            let count = rng.random_range(1..=MAX_OPS);
            let ops = random_ops(&mut rng, count);
            let input = test_inputs(&ops, &mut rng, 1).remove(0);
            for style in all_styles() {
                let p = program(&ops, style).replace("input()", &format!("{input:?}"));
                let p = p.replace("print(", "out.append(");
                script.push_str(&format!("exec({p:?})\n"));
                expected.push(run(&ops, &input));
            }
        }
        script.push_str("sys.stdout.write('\\n'.join(out))\n");
        let out = std::process::Command::new(python)
            .args(["-c", &script])
            .output()
            .expect("python runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = String::from_utf8(out.stdout).expect("utf-8");
        assert_eq!(got.split('\n').collect::<Vec<_>>(), expected);
    }

    #[test]
    fn every_row_fits_the_model_and_its_bound() {
        for max_ops in 1..=MAX_OPS {
            for style in all_styles() {
                let p = CodeParams {
                    style,
                    max_ops,
                    n: 0,
                    seed: 3,
                };
                let bound = code_max_row_bytes(&p);
                // The bound itself fits the model: no generated row can be refused by the trainer.
                assert!(bound < CONTEXT as u64, "{bound}");
                for r in code_stream(&p, 3).take(5000) {
                    let text = crate::model::data::training_text(&r);
                    assert!(text.len() as u64 <= bound, "{text} over {bound}");
                    assert!(text.chars().count() < CONTEXT, "{text}");
                    assert!(text.chars().all(|c| VOCAB.contains(c)), "{text}");
                }
            }
        }
    }

    #[test]
    fn the_gate_matches_every_eval_item_whole() {
        use crate::policy::{canon, contamination};
        for item in eval_stream(9, 1).take(3000) {
            let text = canon::canonical(&format!("{}{}", item.prompt, item.answer));
            assert!(canon::tokens(&text).len() < GATE_NGRAM, "{text}");
            assert!(contamination::skeleton(&text).len() < GATE_NGRAM, "{text}");
        }
    }

    #[test]
    fn test_inputs_tell_a_wrong_letter_or_count_apart() {
        let mut rng = StdRng::seed_from_u64(1);
        for item in eval_stream(5, 3).take(300) {
            assert_eq!(item.tests.len(), 3);
            for t in &item.tests {
                assert!(t.input.ends_with('\n'));
            }
        }
        let ops = [Op::Del('q'), Op::Take(4)];
        let inputs = test_inputs(&ops, &mut rng, 3);
        assert!(inputs.iter().all(|w| w.contains('q') && w.len() >= 7));
        // Deleting the right letter changes every input; take and drop always cut something.
        assert!(inputs.iter().all(|w| Op::Del('q').apply(w) != *w));
        assert!(inputs.iter().all(|w| Op::Take(5).apply(w) != *w));
    }
}
