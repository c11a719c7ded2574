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
    let mut rng = StdRng::seed_from_u64(p.seed);
    let max = 10u64.pow(p.digits);
    (0..p.n)
        .map(|_| {
            let a = rng.random_range(0..max);
            let b = rng.random_range(0..max);
            let sub = match p.op {
                ArithOp::Add => false,
                ArithOp::Sub => true,
                ArithOp::Mixed => rng.random_bool(0.5),
            };
            arith_row(a, b, sub, p.format)
        })
        .collect()
}

/// One problem in a format. Subtraction is ordered so the result is non-negative.
pub fn arith_row(a: u64, b: u64, sub: bool, format: AnswerFormat) -> Row {
    let (a, b) = if sub && b > a { (b, a) } else { (a, b) };
    let op = if sub { '-' } else { '+' };
    let result = if sub { a - b } else { a + b };
    let prompt = format!("{a}{op}{b}=");
    let answer = match format {
        AnswerFormat::Plain => result.to_string(),
        AnswerFormat::Reversed => {
            format!("r{}", result.to_string().chars().rev().collect::<String>())
        }
        AnswerFormat::Scratchpad => {
            let (mut x, mut y, mut carry) = (a, b, 0i64);
            let mut steps = Vec::new();
            while x > 0 || y > 0 {
                let (dx, dy) = ((x % 10) as i64, (y % 10) as i64);
                if sub {
                    let mut d = dx - dy - carry;
                    let borrow = if d < 0 {
                        d += 10;
                        1
                    } else {
                        0
                    };
                    steps.push(format!("{dx}-{dy}-{carry}={d}"));
                    carry = borrow;
                } else {
                    let s = dx + dy + carry;
                    steps.push(format!("{dx}+{dy}+{carry}={}", s % 10));
                    carry = s / 10;
                }
                x /= 10;
                y /= 10;
            }
            format!("{}|{result}", steps.join(","))
        }
    };
    Row { prompt, answer }
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

/// Parse JSON Lines rows, naming the line of the first bad row.
pub fn parse_jsonl(bytes: &[u8], what: &str) -> Result<Vec<Row>> {
    let text =
        std::str::from_utf8(bytes).map_err(|_| Error::invalid(format!("{what}: not UTF-8")))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row: Row = serde_json::from_str(line).map_err(|e| {
            Error::invalid(format!(
                "{what}: line {}: expected {{\"prompt\", \"answer\"}}: {e}",
                i + 1
            ))
        })?;
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(Error::invalid(format!("{what}: no rows")));
    }
    Ok(rows)
}

/// Draw `n` rows from each part (without replacement while rows last, then with replacement)
/// and shuffle them together, deterministically from `seed`.
pub fn mix(parts: &[(Vec<Row>, u64)], seed: u64) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    for (rows, n) in parts {
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
}
