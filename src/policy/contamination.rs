//! The contamination gate: before a dataset is registered, every row is scanned against every
//! protected eval set by normalized n-gram overlap. Normalization lowercases, drops punctuation and
//! whitespace differences, and (in a second, "skeleton" pass) replaces identifier-like tokens with a
//! placeholder, so verbatim copies and light disguises (renamed identifiers, changed whitespace,
//! case or punctuation) are caught. Paraphrases that share no n-grams are not (a known limit).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use serde::Serialize;

use crate::model::data::Row;

/// Scan settings (from `rsim.toml` `[policy]`).
#[derive(Debug, Clone, Copy)]
pub struct ScanConfig {
    /// n-gram length in tokens; items shorter than this are matched whole.
    pub ngram: usize,
    /// An eval item is contaminated when at least this share of its n-grams occurs in the dataset.
    pub threshold: f64,
}

/// One piece of evidence: a dataset row that reproduces a protected eval item.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hit {
    /// Task and split of the protected item (never its text).
    pub task: String,
    pub split: String,
    /// 0-based index of the offending dataset row, and its prompt (the caller's own text).
    pub row: usize,
    pub row_prompt: String,
    /// Share of the item's n-grams found in the dataset.
    pub overlap: f64,
    /// Which normalization matched: `normalized` or `skeleton` (identifiers renamed).
    pub how: &'static str,
}

/// Lowercase word/number tokens; punctuation and whitespace only separate tokens.
/// Operators that carry meaning in arithmetic and code (`+ - * / = < > %`) are kept as tokens.
pub fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        if c.is_alphanumeric() || c == '_' {
            cur.extend(c.to_lowercase());
        } else {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            if matches!(c, '+' | '-' | '*' | '/' | '=' | '<' | '>' | '%') {
                out.push(c.to_string());
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Words that carry a program's structure; every other word counts as a renameable identifier.
const KEYWORDS: &[&str] = &[
    "def", "return", "for", "in", "if", "elif", "else", "while", "class", "import", "from", "as",
    "with", "try", "except", "finally", "raise", "yield", "lambda", "pass", "break", "continue",
    "and", "or", "not", "is", "true", "false", "none", "null", "function", "let", "const", "var",
    "fn", "pub", "struct", "impl", "match", "int", "float", "str", "bool", "void", "new", "this",
    "self", "print", "len", "range",
];

/// The skeleton of a text: punctuation kept as tokens, numbers and keywords kept, every other word
/// replaced by `#` — so renaming identifiers does not change it.
pub fn skeleton(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let push_word = |cur: &mut String, out: &mut Vec<String>| {
        if cur.is_empty() {
            return;
        }
        let w = cur.to_lowercase();
        let keep = w.chars().all(|c| c.is_ascii_digit()) || KEYWORDS.contains(&w.as_str());
        out.push(if keep { w } else { "#".to_string() });
        cur.clear();
    };
    for c in text.chars() {
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

/// A skeleton says something only when it has structure: enough tokens that are not placeholders.
fn structured(skel: &[String], n: usize) -> bool {
    let kept = skel.iter().filter(|t| t.as_str() != "#").count();
    skel.len() >= n && kept * 2 >= skel.len() && skel.iter().any(|t| t == "#")
}

fn hash(ts: &[String]) -> u64 {
    let mut s = DefaultHasher::new();
    ts.hash(&mut s);
    s.finish()
}

/// The n-grams of a token list; a list shorter than `n` is one gram (matched whole).
fn grams(toks: &[String], n: usize) -> Vec<u64> {
    if toks.is_empty() {
        return Vec::new();
    }
    if toks.len() <= n {
        return vec![hash(toks)];
    }
    toks.windows(n).map(hash).collect()
}

fn row_text(r: &Row) -> String {
    format!("{} {}", r.prompt, r.answer)
}

/// One protected item, prepared: normalized grams of prompt+answer and of the prompt alone, and
/// skeleton grams (empty when the item has too little structure for a skeleton to mean anything).
struct Item {
    full: Vec<u64>,
    prompt: Vec<u64>,
    skeleton: Vec<u64>,
    /// Token counts of `full`/`prompt` when shorter than n (rows are windowed at these lengths too).
    short_lens: Vec<usize>,
}

/// A protected eval set prepared for scanning.
pub struct EvalSet {
    pub task: String,
    pub split: String,
    items: Vec<Item>,
}

impl EvalSet {
    pub fn new(task: &str, split: &str, items: &[Row], cfg: ScanConfig) -> EvalSet {
        let n = cfg.ngram;
        let items = items
            .iter()
            .map(|r| {
                let full_t = tokens(&row_text(r));
                let prompt_t = tokens(&r.prompt);
                let skel = skeleton(&row_text(r));
                let short_lens = [full_t.len(), prompt_t.len()]
                    .into_iter()
                    .filter(|&l| l > 0 && l < n)
                    .collect();
                Item {
                    full: grams(&full_t, n),
                    prompt: grams(&prompt_t, n),
                    skeleton: if structured(&skel, n) {
                        grams(&skel, n)
                    } else {
                        Vec::new()
                    },
                    short_lens,
                }
            })
            .collect();
        EvalSet {
            task: task.into(),
            split: split.into(),
            items,
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// Scan `rows` against protected eval sets; one hit per contaminated eval item (at most `limit`).
pub fn scan(rows: &[Row], sets: &[EvalSet], cfg: ScanConfig, limit: usize) -> Vec<Hit> {
    let n = cfg.ngram;
    // Rows are windowed at n and at every length of a short item, so a short item embedded in a
    // longer row (`Q: 12+34= A: 46`) is found too.
    let mut lens: Vec<usize> = sets
        .iter()
        .flat_map(|s| s.items.iter().flat_map(|i| i.short_lens.iter().copied()))
        .collect();
    lens.push(n);
    lens.sort_unstable();
    lens.dedup();
    // gram → first row that has it, for each normalization.
    let mut norm: HashMap<u64, usize> = HashMap::new();
    let mut skel: HashMap<u64, usize> = HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        let toks = tokens(&row_text(r));
        for &l in &lens {
            if toks.len() < l {
                continue;
            }
            for w in toks.windows(l) {
                norm.entry(hash(w)).or_insert(i);
            }
        }
        if !toks.is_empty() && toks.len() < n {
            norm.entry(hash(&toks)).or_insert(i);
        }
        let sk = skeleton(&row_text(r));
        for g in grams(&sk, n) {
            skel.entry(g).or_insert(i);
        }
    }
    let mut hits = Vec::new();
    for set in sets {
        for item in &set.items {
            let checks = [
                (&item.full, &norm, "normalized"),
                (&item.prompt, &norm, "prompt"),
                (&item.skeleton, &skel, "skeleton"),
            ];
            for (grams, table, how) in checks {
                if grams.is_empty() {
                    continue;
                }
                let found: Vec<usize> =
                    grams.iter().filter_map(|g| table.get(g).copied()).collect();
                let overlap = found.len() as f64 / grams.len() as f64;
                if overlap >= cfg.threshold {
                    let row = found.iter().copied().min().unwrap_or(0);
                    hits.push(Hit {
                        task: set.task.clone(),
                        split: set.split.clone(),
                        row,
                        row_prompt: rows.get(row).map(|r| r.prompt.clone()).unwrap_or_default(),
                        overlap: (overlap * 1000.0).round() / 1000.0,
                        how,
                    });
                    break;
                }
            }
            if hits.len() >= limit {
                return hits;
            }
        }
    }
    hits
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn normalization_ignores_case_whitespace_and_punctuation() {
        assert_eq!(tokens("Hello,  World!"), tokens("hello world"));
        assert_eq!(tokens("12+34="), vec!["12", "+", "34", "="]);
        assert_eq!(tokens("12 + 34 ="), tokens("12+34="));
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
        let set = EvalSet::new("t", "test", &eval, CFG);
        // verbatim
        assert_eq!(
            scan(&[eval[1].clone()], std::slice::from_ref(&set), CFG, 10).len(),
            1
        );
        // whitespace / case / punctuation
        let hits = scan(
            &[row("12 + 34 =", " 46 ")],
            std::slice::from_ref(&set),
            CFG,
            10,
        );
        assert_eq!(hits.len(), 1);
        let hits = scan(
            &[row(
                "DEF HAS_CLOSE_ELEMENTS( numbers ,threshold ) :  for idx,elem in enumerate( numbers ):",
                "return true",
            )],
            std::slice::from_ref(&set),
            CFG,
            10,
        );
        assert_eq!(hits.len(), 1);
        // renamed identifiers
        let hits = scan(
            &[row(
                "def f(xs, eps):\n    for i, e in enumerate(xs):",
                "return True",
            )],
            std::slice::from_ref(&set),
            CFG,
            10,
        );
        assert_eq!(hits.len(), 1, "skeleton match");
        assert_eq!(hits[0].how, "skeleton");
        // a short item embedded in a longer row, and the problem with another answer format
        assert_eq!(
            scan(
                &[row("Q: 12 + 34 = ? A:", "46")],
                std::slice::from_ref(&set),
                CFG,
                10
            )
            .len(),
            1
        );
        let hits = scan(
            &[row("12+34=", "4+6+0=0,1+3+1=5|50")],
            std::slice::from_ref(&set),
            CFG,
            10,
        );
        assert_eq!(hits.len(), 1, "the test problem itself, with any answer");
        assert_eq!(hits[0].how, "prompt");
        // unrelated rows pass
        assert!(
            scan(
                &[
                    row("12+35=", "47"),
                    row("112+34=", "146"),
                    row("def other(a):", "pass")
                ],
                std::slice::from_ref(&set),
                CFG,
                10
            )
            .is_empty()
        );
    }
}
