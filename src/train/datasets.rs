//! Dataset rows and the built-in arithmetic generator (tiny-arith). A dataset is JSON Lines of
//! `{"prompt": ..., "answer": ...}`; its bytes are stored content-addressed.
//!
//! Answers are self-describing so one evaluator parses every format: plain `579`, reversed
//! `r975` (digits least-significant first), scratchpad `3+6+0=9,2+5+0=7,1+4+0=5|579`.

use rand::{RngExt, SeedableRng, rngs::StdRng};

use crate::model::data::{AnswerFormat, ArithOp, ArithParams, Row};
use crate::util::error::{Error, Result};

/// Generate arithmetic rows deterministically from the parameters (same params → same bytes).
pub fn generate_arith(p: &ArithParams) -> Vec<Row> {
    arith_stream(p, p.seed).take(p.n as usize).collect()
}

/// The generator's endless stream of rows for the parameters (all but `n`), drawn from `seed`:
/// `generate_arith` takes the first `n`; the Experiment OS draws from a salted seed and skips
/// protected items.
pub fn arith_stream(p: &ArithParams, seed: u64) -> impl Iterator<Item = Row> + use<> {
    let mut rng = StdRng::seed_from_u64(seed);
    let max = 10u64.pow(p.digits);
    let (op, format) = (p.op, p.format);
    let width = p.digits as usize;
    std::iter::repeat_with(move || {
        let a = rng.random_range(0..max);
        let b = rng.random_range(0..max);
        let sub = match op {
            ArithOp::Add => false,
            ArithOp::Sub => true,
            ArithOp::Mixed => rng.random_bool(0.5),
            ArithOp::Sum => return sum_row(&[a, b, rng.random_range(0..max)], format),
            // `a` with its leading zeros: every string of `digits` digits equally likely
            ArithOp::Sort => return sort_row(&format!("{a:0width$}"), format),
            ArithOp::Diff => return diff_row(a, b, format),
            ArithOp::DigitSum => return digit_sum_row(&format!("{a:0width$}"), format),
        };
        arith_row(a, b, sub, format)
    })
}

/// An upper bound on the bytes of one generated row's training text (prompt + answer), known
/// before anything is generated (the size bound is checked on it).
pub fn arith_max_row_bytes(p: &ArithParams) -> u64 {
    let d = u64::from(p.digits);
    if p.op == ArithOp::Sort {
        // `d` digits and `=`; the answer's `d` digits, `r` first when reversed; a scratchpad
        // counts each digit present (`v=c`, at most `d` of them, commas between) before `|`.
        let answer = match p.format {
            AnswerFormat::Plain => d,
            AnswerFormat::Reversed => d + 1,
            AnswerFormat::Scratchpad => 3 * d + d.saturating_sub(1) + 1 + d,
        };
        return d + 1 + answer;
    }
    if p.op == ArithOp::DigitSum {
        // `d` digits and `=`; a sum of at most 9d < 100 (`MAX_ARITH_DIGITS`), two digits; a
        // scratchpad's `d` running sums of two digits, `=` between them, then `|`.
        let answer = match p.format {
            AnswerFormat::Plain => 2,
            AnswerFormat::Reversed => 3,
            AnswerFormat::Scratchpad => 3 * d - 1 + 1 + 2,
        };
        return d + 1 + answer;
    }
    // Operands: a sum of three has a result of at most d + 1 digits too (3 × 999 = 2997).
    let k: u64 = if p.op == ArithOp::Sum { 3 } else { 2 };
    let prompt = k * d + k;
    let answer = match p.format {
        AnswerFormat::Plain => d + 1,
        AnswerFormat::Reversed => d + 2,
        // d steps of `x+y+c=z` (k digits, a carry, k `+`, `=`, a digit), d-1 commas, `|` and
        // the result
        AnswerFormat::Scratchpad => (2 * k + 3) * d + d.saturating_sub(1) + 1 + d + 1,
    };
    // A negative difference's sign (and in a scratchpad its step of its own, `,-`).
    let sign = match (p.op, p.format) {
        (ArithOp::Diff, AnswerFormat::Scratchpad) => 3,
        (ArithOp::Diff, _) => 1,
        _ => 0,
    };
    prompt + answer + sign
}

/// One problem in a format. Subtraction is ordered so the result is non-negative.
pub fn arith_row(a: u64, b: u64, sub: bool, format: AnswerFormat) -> Row {
    if !sub {
        return sum_row(&[a, b], format);
    }
    let (a, b) = if b > a { (b, a) } else { (a, b) };
    Row {
        prompt: format!("{a}-{b}="),
        answer: in_format(a - b, format, || sub_steps(a, b)),
    }
}

/// The scratchpad's columns of `a - b` (`a >= b`): each digit of `a` less that of `b` and the
/// borrow (`4-2-0=2`), least significant first.
fn sub_steps(a: u64, b: u64) -> Vec<String> {
    let (mut x, mut y, mut borrow) = (a, b, 0i64);
    let mut steps = Vec::new();
    while x > 0 || y > 0 {
        let (dx, dy) = ((x % 10) as i64, (y % 10) as i64);
        let mut d = dx - dy - borrow;
        let next = if d < 0 {
            d += 10;
            1
        } else {
            0
        };
        steps.push(format!("{dx}-{dy}-{borrow}={d}"));
        borrow = next;
        x /= 10;
        y /= 10;
    }
    steps
}

/// `a - b` in the operands' own order, in a format: a negative result is the difference the other
/// way with a sign — plain `12-34=-22`, reversed `r22-` (the signed answer last character first),
/// scratchpad the columns of `34 - 12`, the sign as a step of its own, then the answer:
/// `4-2-0=2,3-1-0=2,-|-22`. (Without that step the last column's digit would stand next to the
/// answer, `2|-22`, which the gate reads as the problem `2-22`: a protected one refused the row.)
pub fn diff_row(a: u64, b: u64, format: AnswerFormat) -> Row {
    let prompt = format!("{a}-{b}=");
    if a >= b {
        return Row {
            prompt,
            answer: in_format(a - b, format, || sub_steps(a, b)),
        };
    }
    let r = b - a;
    let answer = match format {
        AnswerFormat::Plain => format!("-{r}"),
        AnswerFormat::Reversed => format!("r{}-", r.to_string().chars().rev().collect::<String>()),
        AnswerFormat::Scratchpad => format!("{},-|-{r}", sub_steps(b, a).join(",")),
    };
    Row { prompt, answer }
}

/// A sum of two or more addends in a format; a scratchpad column adds their digits and the carry
/// (`3+6+0=9`; with three addends `3+6+9+0=8`, carrying up to 2).
pub fn sum_row(terms: &[u64], format: AnswerFormat) -> Row {
    let result: u64 = terms.iter().sum();
    let answer = in_format(result, format, || {
        let mut rest = terms.to_vec();
        let mut carry = 0u64;
        let mut steps = Vec::new();
        while rest.iter().any(|x| *x > 0) {
            let digits: Vec<u64> = rest.iter().map(|x| x % 10).collect();
            let s = digits.iter().sum::<u64>() + carry;
            let col: Vec<String> = digits.iter().map(u64::to_string).collect();
            steps.push(format!("{}+{carry}={}", col.join("+"), s % 10));
            carry = s / 10;
            for x in &mut rest {
                *x /= 10;
            }
        }
        steps
    });
    let prompt: Vec<String> = terms.iter().map(u64::to_string).collect();
    Row {
        prompt: format!("{}=", prompt.join("+")),
        answer,
    }
}

/// A digit-sorting problem in a format: `530912=` → plain `012359`, reversed `r953210` (the
/// answer's digits last first, as for arithmetic), scratchpad `0=1,1=1,2=1,3=1,5=1,9=1|012359`
/// (how many of each digit, in order, then the answer).
pub fn sort_row(digits: &str, format: AnswerFormat) -> Row {
    let mut sorted: Vec<char> = digits.chars().collect();
    sorted.sort_unstable();
    let result: String = sorted.iter().collect();
    let answer = match format {
        AnswerFormat::Plain => result,
        AnswerFormat::Reversed => format!("r{}", sorted.iter().rev().collect::<String>()),
        AnswerFormat::Scratchpad => {
            let mut counts = Vec::new();
            for d in '0'..='9' {
                let c = sorted.iter().filter(|x| **x == d).count();
                if c > 0 {
                    counts.push(format!("{d}={c}"));
                }
            }
            format!("{}|{result}", counts.join(","))
        }
    };
    Row {
        prompt: format!("{digits}="),
        answer,
    }
}

/// A digit-sum problem in a format: `530912=` → plain `20`, reversed `r02`, scratchpad
/// `05=08=08=17=18=20|20` (the sum after each digit, in order). The running sums are written with
/// two digits and `=` between them so the gate's digits form (`policy::normal_form`), which reads
/// any run of digit tokens not broken by `=` as a string whose multiset may be a protected item,
/// reads in a scratchpad only two-digit strings and the row's own prompt: with `,` between them,
/// `8,8,17,18` would read as the six digits `881718`, a protected string in some rows.
pub fn digit_sum_row(digits: &str, format: AnswerFormat) -> Row {
    let mut total = 0u32;
    let running: Vec<String> = digits
        .chars()
        .filter_map(|c| c.to_digit(10))
        .map(|d| {
            total += d;
            format!("{total:02}")
        })
        .collect();
    let answer = match format {
        AnswerFormat::Plain => total.to_string(),
        AnswerFormat::Reversed => {
            format!("r{}", total.to_string().chars().rev().collect::<String>())
        }
        AnswerFormat::Scratchpad => format!("{}|{total}", running.join("=")),
    };
    Row {
        prompt: format!("{digits}="),
        answer,
    }
}

/// A result in an answer format; `steps` gives a scratchpad's column steps.
fn in_format(result: u64, format: AnswerFormat, steps: impl FnOnce() -> Vec<String>) -> String {
    match format {
        AnswerFormat::Plain => result.to_string(),
        AnswerFormat::Reversed => {
            format!("r{}", result.to_string().chars().rev().collect::<String>())
        }
        AnswerFormat::Scratchpad => format!("{}|{result}", steps().join(",")),
    }
}

/// Extract the final answer from a model output in any of the formats above.
pub fn parse_answer(output: &str) -> String {
    let out = output.trim();
    if let Some((_, tail)) = out.rsplit_once('|') {
        return tail.trim().to_string();
    }
    if let Some(rev) = out.strip_prefix('r') {
        return rev.chars().rev().collect();
    }
    out.to_string()
}

/// Serialize rows as JSON Lines.
pub fn to_jsonl(rows: &[Row]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for r in rows {
        serde_json::to_writer(&mut out, r)?;
        out.push(b'\n');
    }
    Ok(out)
}

/// Parse JSON Lines into `T`s, naming the line of the first bad one (`shape` says what a line
/// should hold) and refusing a file with none.
pub fn parse_lines<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &str,
    shape: &str,
) -> Result<Vec<(usize, T)>> {
    let text =
        std::str::from_utf8(bytes).map_err(|_| Error::invalid(format!("{what}: not UTF-8")))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: T = serde_json::from_str(line).map_err(|e| {
            Error::invalid(format!("{what}: line {}: expected {shape}: {e}", i + 1))
        })?;
        out.push((i + 1, v));
    }
    if out.is_empty() {
        return Err(Error::invalid(format!("{what}: no rows")));
    }
    Ok(out)
}

/// Parse JSON Lines rows, naming the line of the first bad row.
pub fn parse_jsonl(bytes: &[u8], what: &str) -> Result<Vec<Row>> {
    let rows = parse_lines::<Row>(bytes, what, "{\"prompt\", \"answer\"}")?;
    Ok(rows.into_iter().map(|(_, r)| r).collect())
}

/// A task's eval split: `{prompt, answer}` rows, and for a code task (`pass_at_1`) each with its
/// hidden `tests` as well — what the contamination gate reads is the prompt and the answer (the
/// reference solution).
pub fn parse_eval_jsonl(bytes: &[u8], what: &str) -> Result<Vec<Row>> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Item {
        prompt: String,
        answer: String,
        #[serde(default)]
        #[allow(dead_code)]
        tests: Option<serde_json::Value>,
    }
    let items = parse_lines::<Item>(
        bytes,
        what,
        "{\"prompt\", \"answer\"} (and \"tests\" for a code task)",
    )?;
    Ok(items
        .into_iter()
        .map(|(_, it)| Row {
            prompt: it.prompt,
            answer: it.answer,
        })
        .collect())
}

/// Draw `n` rows from each part (without replacement while rows last, then with replacement)
/// and shuffle them together, deterministically from `seed`.
pub fn mix(parts: &[(&[Row], u64)], seed: u64) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    for &(rows, ref n) in parts {
        if rows.is_empty() {
            continue;
        }
        let mut order: Vec<usize> = (0..rows.len()).collect();
        shuffle(&mut order, &mut rng);
        for k in 0..*n as usize {
            let i = if k < order.len() {
                order[k]
            } else {
                rng.random_range(0..rows.len())
            };
            out.push(rows[i].clone());
        }
    }
    shuffle(&mut out, &mut rng);
    out
}

fn shuffle<T>(v: &mut [T], rng: &mut StdRng) {
    for i in (1..v.len()).rev() {
        let j = rng.random_range(0..=i);
        v.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_round_trip_through_the_parser() {
        for (sub, f) in [
            (false, AnswerFormat::Plain),
            (false, AnswerFormat::Reversed),
            (true, AnswerFormat::Scratchpad),
        ] {
            let r = arith_row(487, 968, sub, f);
            let want = if sub { "481" } else { "1455" };
            assert_eq!(parse_answer(&r.answer), want, "{r:?}");
        }
        assert_eq!(
            arith_row(123, 456, false, AnswerFormat::Scratchpad).answer,
            "3+6+0=9,2+5+0=7,1+4+0=5|579"
        );
        assert_eq!(
            arith_row(52, 187, true, AnswerFormat::Scratchpad),
            Row {
                prompt: "187-52=".into(),
                answer: "7-2-0=5,8-5-0=3,1-0-0=1|135".into()
            }
        );
        let three = sum_row(&[99, 98, 7], AnswerFormat::Scratchpad);
        assert_eq!(three.prompt, "99+98+7=");
        assert_eq!(three.answer, "9+8+7+0=4,9+9+0+2=0|204");
        assert_eq!(parse_answer(&three.answer), "204");
        for f in AnswerFormat::ALL {
            assert_eq!(
                parse_answer(&sum_row(&[12, 34, 56], f).answer),
                "102",
                "{f:?}"
            );
        }
    }

    #[test]
    fn a_sorting_problem_answers_its_digits_in_order_in_every_format() {
        let plain = sort_row("530912", AnswerFormat::Plain);
        assert_eq!(
            (plain.prompt.as_str(), plain.answer.as_str()),
            ("530912=", "012359")
        );
        assert_eq!(sort_row("530912", AnswerFormat::Reversed).answer, "r953210");
        assert_eq!(
            sort_row("300300", AnswerFormat::Scratchpad).answer,
            "0=4,3=2|000033"
        );
        for f in AnswerFormat::ALL {
            assert_eq!(
                parse_answer(&sort_row("070701", f).answer),
                "000177",
                "{f:?}"
            );
        }
        // The generator draws strings of exactly `digits` digits, leading zeros included.
        let rows = generate_arith(&ArithParams {
            op: ArithOp::Sort,
            digits: 6,
            format: AnswerFormat::Plain,
            n: 400,
            seed: 3,
        });
        assert!(rows.iter().all(|r| r.prompt.len() == 7
            && r.prompt.ends_with('=')
            && r.prompt[..6].bytes().all(|b| b.is_ascii_digit())));
        assert!(rows.iter().any(|r| r.prompt.starts_with('0')));
    }

    #[test]
    fn a_digit_sum_problem_answers_the_sum_of_its_digits_in_every_format() {
        let plain = digit_sum_row("530912", AnswerFormat::Plain);
        assert_eq!(
            (plain.prompt.as_str(), plain.answer.as_str()),
            ("530912=", "20")
        );
        assert_eq!(
            digit_sum_row("530912", AnswerFormat::Reversed).answer,
            "r02"
        );
        assert_eq!(
            digit_sum_row("530912", AnswerFormat::Scratchpad).answer,
            "05=08=08=17=18=20|20"
        );
        assert_eq!(digit_sum_row("0000000", AnswerFormat::Plain).answer, "0");
        for f in AnswerFormat::ALL {
            assert_eq!(
                parse_answer(&digit_sum_row("9999999", f).answer),
                "63",
                "{f:?}"
            );
        }
        // Strings of exactly `digits` digits, leading zeros included; sums spread over the range.
        let rows = generate_arith(&ArithParams {
            op: ArithOp::DigitSum,
            digits: 7,
            format: AnswerFormat::Plain,
            n: 400,
            seed: 3,
        });
        assert!(rows.iter().all(|r| r.prompt.len() == 8
            && r.prompt.ends_with('=')
            && r.prompt[..7].bytes().all(|b| b.is_ascii_digit())));
        assert!(rows.iter().any(|r| r.prompt.starts_with('0')));
        let sums: std::collections::HashSet<&str> =
            rows.iter().map(|r| r.answer.as_str()).collect();
        assert!(sums.len() > 25, "{} distinct sums", sums.len());
    }

    #[test]
    fn differences_in_either_order_carry_their_sign_in_every_format() {
        assert_eq!(diff_row(12, 34, AnswerFormat::Plain).answer, "-22");
        assert_eq!(diff_row(12, 34, AnswerFormat::Plain).prompt, "12-34=");
        assert_eq!(diff_row(12, 34, AnswerFormat::Reversed).answer, "r22-");
        assert_eq!(
            diff_row(12, 34, AnswerFormat::Scratchpad).answer,
            "4-2-0=2,3-1-0=2,-|-22"
        );
        assert_eq!(diff_row(305, 7, AnswerFormat::Reversed).answer, "r892");
        assert_eq!(diff_row(7, 7, AnswerFormat::Plain).answer, "0");
        for f in AnswerFormat::ALL {
            assert_eq!(parse_answer(&diff_row(7, 305, f).answer), "-298", "{f:?}");
            assert_eq!(parse_answer(&diff_row(305, 7, f).answer), "298", "{f:?}");
        }
        // The generator keeps the operands' order: about half the answers are negative.
        let rows = generate_arith(&ArithParams {
            op: ArithOp::Diff,
            digits: 3,
            format: AnswerFormat::Plain,
            n: 400,
            seed: 5,
        });
        let negative = rows.iter().filter(|r| r.answer.starts_with('-')).count();
        assert!((150..=250).contains(&negative), "{negative} of 400");
        // A row poses its own problem and no other, in every format and operation: the gate
        // refuses a row for any protected problem it poses, so a stray one would refuse honest
        // rows (and the generator, which skips what the gate would refuse, would skew its data).
        for (op, digits, format) in [
            ArithOp::Add,
            ArithOp::Sub,
            ArithOp::Mixed,
            ArithOp::Sum,
            ArithOp::Diff,
        ]
        .into_iter()
        .flat_map(|op| (1..=4).map(move |d| (op, d)))
        .flat_map(|(op, d)| AnswerFormat::ALL.into_iter().map(move |f| (op, d, f)))
        {
            {
                let p = ArithParams {
                    op,
                    digits,
                    format,
                    n: 1000,
                    seed: u64::from(digits),
                };
                for r in generate_arith(&p) {
                    let form = crate::config::NormalForm::Arithmetic;
                    let whole = crate::policy::normal_form::keys_of_text(
                        form,
                        &crate::model::data::training_text(&r),
                    );
                    let own = crate::policy::normal_form::keys_of_text(form, &r.prompt);
                    // Keys of the family's shape: as many operands as its problems (a one-digit
                    // column `9+6+0` is a sum of three, which no two-operand family protects)
                    // and an operator its problems use (the diff scratchpad's sign step
                    // `2,-|-22` reads as the sum `2+22`, which no difference family protects).
                    let operands = |k: &String| k.split(':').count();
                    let ops: &[&str] = match op {
                        ArithOp::Add | ArithOp::Sum => &["+"],
                        ArithOp::Sub | ArithOp::Diff => &["-"],
                        ArithOp::Mixed => &["+", "-"],
                        ArithOp::Sort | ArithOp::DigitSum => &[],
                    };
                    let whole: Vec<String> = whole
                        .into_iter()
                        .filter(|k| own.iter().any(|o| operands(o) == operands(k)))
                        .filter(|k| ops.iter().any(|o| k.starts_with(&format!("{o}:"))))
                        .collect();
                    assert_eq!(whole, own, "{r:?}");
                }
            }
        }
    }

    #[test]
    fn generator_is_deterministic() {
        let p = ArithParams {
            op: ArithOp::Mixed,
            digits: 3,
            format: AnswerFormat::Plain,
            n: 50,
            seed: 7,
        };
        assert_eq!(generate_arith(&p), generate_arith(&p));
        let q = ArithParams {
            seed: 8,
            ..p.clone()
        };
        assert_ne!(generate_arith(&p), generate_arith(&q));
    }

    #[test]
    fn generated_rows_stay_within_the_announced_size() {
        for digits in 1..=6 {
            for format in AnswerFormat::ALL {
                for op in [
                    ArithOp::Add,
                    ArithOp::Sub,
                    ArithOp::Sum,
                    ArithOp::Sort,
                    ArithOp::Diff,
                    ArithOp::DigitSum,
                ] {
                    let p = ArithParams {
                        op,
                        digits,
                        format,
                        n: 300,
                        seed: u64::from(digits),
                    };
                    let bound = arith_max_row_bytes(&p);
                    for r in generate_arith(&p) {
                        let len = (r.prompt.len() + r.answer.len()) as u64;
                        assert!(len <= bound, "{r:?} is {len} bytes, bound {bound}");
                    }
                    let top = 10u64.pow(digits) - 1;
                    let worst = if op == ArithOp::DigitSum {
                        digit_sum_row(&"9".repeat(digits as usize), format)
                    } else if op == ArithOp::Sort {
                        // every digit different as far as they go: the longest scratchpad
                        let all: String = "0123456789".chars().take(digits as usize).collect();
                        sort_row(&all, format)
                    } else if op == ArithOp::Sum {
                        sum_row(&[top, top, top], format)
                    } else if op == ArithOp::Diff {
                        // the longest: a negative difference of the most digits
                        diff_row(0, top, format)
                    } else {
                        arith_row(top, top, op == ArithOp::Sub, format)
                    };
                    assert!((worst.prompt.len() + worst.answer.len()) as u64 <= bound);
                }
            }
        }
    }
}
