//! `cargo bench --bench gate`: what the contamination gate costs per registered row.
//!
//! On the tiny-arith example (1,400 protected three-digit items: dev, dev twin, test and sealed
//! splits, arithmetic normal form) it times the scan with and without the dev splits (what
//! protecting dev evidence adds),
//! the scan alone (`Study::scan_for_contamination`: canonical text, every pass, pairs of rows),
//! a whole `register_dataset` of inline rows (JSON Schema, scan, store, commit), and the
//! generator (every draw checked against the protected items), per row, there and on tiny-sort6
//! (the digits form's scratchpad); and the scan of long
//! rows (code-like, ~1 kB) per row and per kB; and on tiny-code (1,400 protected compositions)
//! the scan of generated programs with and without the `string_ops` normal form. `RSIM_GATE_ROWS`
//! sets the rows (default 100000).

use std::time::Instant;

use rsi_master::api::types::{AnswerFormat, Row};
use rsi_master::model::{Caller, Role};
use rsi_master::policy::contamination::{EvalSet, ScanConfig, Scanner};
use rsi_master::train::datasets;
use serde_json::json;

fn main() {
    let n: u64 = std::env::var("RSIM_GATE_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let d = std::env::temp_dir().join(format!("rsim-gate-{}", std::process::id()));
    let root = d.join("study");
    let who = Caller::new("bench", Role::Worker);
    let (s, node) = study_with_node(&root, "tiny-arith", &who);
    // Four-digit problems (both operands ≥ 1000): clean against three-digit test items.
    let mut x = 7u64;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        1000 + (x >> 33) % 9000
    };
    let rows: Vec<Row> = (0..n)
        .map(|i| datasets::arith_row(next(), next(), i % 2 == 0, AnswerFormat::Scratchpad))
        .collect();
    let per_row = |t: Instant, rows: u64| t.elapsed().as_secs_f64() * 1e6 / rows as f64;

    let t = Instant::now();
    let hits = s.scan_for_contamination(&rows).expect("scan");
    let scan_us = per_row(t, n);
    assert!(hits.is_empty(), "{hits:?}");
    // The baseline's items: the test split and the sealed split.
    let mut test_items = Vec::new();
    for split in ["test", "sealed"] {
        test_items.extend(
            datasets::parse_jsonl(
                &std::fs::read(root.join(format!(".rsim/protected/add3/{split}.jsonl")))
                    .expect("split"),
                split,
            )
            .expect("rows"),
        );
    }
    let t = Instant::now();
    assert_eq!(baseline::scan(&rows, &test_items, 8), 0);
    let baseline_us = per_row(t, n);

    // What protecting dev adds, in one run: the same scanner over the test and sealed splits
    // alone, and over those with the dev split and its twin (what the study scans now).
    let split_rows = |split: &str| {
        datasets::parse_jsonl(
            &std::fs::read(root.join(format!(".rsim/protected/add3/{split}.jsonl")))
                .expect("split"),
            split,
        )
        .expect("rows")
    };
    let cfg = ScanConfig {
        ngram: 8,
        threshold: 0.5,
    };
    let scan_with = |splits: &[&str]| {
        let sets: Vec<EvalSet> = splits
            .iter()
            .map(|sp| {
                EvalSet::new(
                    "add3",
                    sp,
                    &split_rows(sp),
                    cfg,
                    Some(rsi_master::config::NormalForm::Arithmetic),
                )
            })
            .collect();
        let t = Instant::now();
        let hits = Scanner::new(&sets, cfg).scan_parts(&[&rows], 50);
        assert!(hits.is_empty());
        per_row(t, n)
    };
    let (mut without_dev, mut with_dev) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        without_dev.push(scan_with(&["test", "sealed"]));
        with_dev.push(scan_with(&["dev", "dev_twin", "test", "sealed"]));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (without_dev, with_dev) = (median(&mut without_dev), median(&mut with_dev));

    let t = Instant::now();
    let rows_json: Vec<_> = rows
        .iter()
        .map(|r| json!({"prompt": r.prompt, "answer": r.answer}))
        .collect();
    s.call(
        &who,
        "register_dataset",
        json!({"node": node, "name": "inline", "source": {"kind": "inline", "rows": rows_json}}),
    )
    .expect("register");
    let register_us = per_row(t, n);

    let t = Instant::now();
    s.call(
        &who,
        "register_dataset",
        json!({"node": node, "name": "gen", "source": {"kind": "arith", "op": "add", "digits": 3, "format": "plain", "n": n, "seed": 1}}),
    )
    .expect("generate");
    let generate_us = per_row(t, n);

    let long: Vec<Row> = (0..n / 10)
        .map(|i| Row {
            prompt: format!(
                "def f_{i}(xs, k):\n    \"\"\"Return the {i} largest values of xs, in order.\"\"\"\n{}",
                "    total = sum(x * k for x in xs if x > 0)  # accumulate\n".repeat(12)
            ),
            answer: "    return sorted(xs)[-k:]\n".into(),
        })
        .collect();
    let kb = long
        .iter()
        .map(|r| r.prompt.len() + r.answer.len())
        .sum::<usize>() as f64
        / 1024.0;
    let t = Instant::now();
    s.scan_for_contamination(&long).expect("scan");
    let secs = t.elapsed().as_secs_f64();
    let long_us = secs * 1e6 / long.len() as f64;
    let kb_us = secs * 1e6 / kb;
    let t = Instant::now();
    baseline::scan(&long, &test_items, 8);
    let baseline_long_us = t.elapsed().as_secs_f64() * 1e6 / long.len() as f64;

    // Rows of `per_row` problems of two four-digit operands, each written by `write`, scanned:
    // µs per kB.
    let mut problems_kb_us = |per_row: usize, write: &dyn Fn(u64, u64) -> String| {
        let rows: Vec<Row> = (0..n / 10)
            .map(|_| Row {
                prompt: (0..per_row)
                    .map(|_| {
                        let (a, b) = (next(), next());
                        write(a, b)
                    })
                    .collect(),
                answer: String::new(),
            })
            .collect();
        let kb = rows.iter().map(|r| r.prompt.len()).sum::<usize>() as f64 / 1024.0;
        let t = Instant::now();
        s.scan_for_contamination(&rows).expect("scan");
        t.elapsed().as_secs_f64() * 1e6 / kb
    };
    // Chains `a + b{extras} = a+b`, extras summing to zero.
    let chain =
        |extras: &'static str| move |a: u64, b: u64| format!("{a} + {b}{extras} = {}; ", a + b);
    // A looping agent's costliest arithmetic: 16-term chains that keep their value, the longest
    // chains searched for three addends; ~1 kB a row.
    let chain_kb_us = problems_kb_us(
        12,
        &chain(" + 11 + 12 + 13 + 14 + 15 + 16 + 17 - 18 - 19 - 20 - 21 - 20"),
    );
    // The same with products among the extras, each read as its value (`Sym::Product`).
    let product_kb_us = problems_kb_us(
        10,
        &chain(" + 2 * 3 + 3 * 7 + 12 / 4 + 5 * 5 * 2 - 6 * 1 - 7 * 3 - 9 / 3 - 10 * 5"),
    );
    // The stream's costliest rows: each one ~1 kB chain with no `=`, read alone and then again
    // in the stream's open segment (`normal_form::Carry`).
    let open_chain_kb_us = problems_kb_us(70, &|a, b| format!("{a} + {b} - "));
    // Problems in other notations: names bound to decimals and scientific literals, a power
    // among the extras (`arithmetic::literal`, `binding`).
    let notation_kb_us = problems_kb_us(22, &|a, b| {
        format!(
            "x = {a}.0; y = {}.{:03}e3; x + y + 2**3 - 8 = {}; ",
            b / 1000,
            b % 1000,
            a + b
        )
    });

    // The digits form (tiny-sort6: strings of six digits to sort), where every draw is read as
    // one stream with the rows kept so far: chains and `digit=count` runs carried row to row
    // (`normal_form::Carry`, `digits::Stream`).
    let (sort, sort_node) = study_with_node(&d.join("sort6"), "tiny-sort6", &who);
    let t = Instant::now();
    sort.call(
        &who,
        "register_dataset",
        json!({"node": sort_node, "name": "gen", "source": {"kind": "arith", "op": "sort", "digits": 6, "format": "scratchpad", "n": n, "seed": 1}}),
    )
    .expect("generate sort6");
    let sort_generate_us = per_row(t, n);

    // The code family (tiny-code: 1,400 protected compositions): generated programs of every
    // style scanned with the `string_ops` form (specifications' words read as chains, programs
    // run symbolically) and without it, interleaved, median of 3 each.
    let code_root = d.join("code");
    rsi_master::faces::init::init(&code_root, Some("tiny-code")).expect("init tiny-code");
    let code_cfg = ScanConfig {
        ngram: 80,
        threshold: 0.5,
    };
    let code_sets = |form: Option<rsi_master::config::NormalForm>| -> Vec<EvalSet> {
        ["dev", "dev_twin", "test", "sealed"]
            .iter()
            .map(|sp| {
                let items = datasets::parse_eval_jsonl(
                    &std::fs::read(code_root.join(format!(".rsim/protected/strings/{sp}.jsonl")))
                        .expect("code split"),
                    sp,
                )
                .expect("code rows");
                EvalSet::new("strings", sp, &items, code_cfg, form)
            })
            .collect()
    };
    use rsi_master::model::data::{CodeParams, CodeStyle};
    let code_rows: Vec<Row> = [CodeStyle::Steps, CodeStyle::Nested, CodeStyle::Named]
        .into_iter()
        .flat_map(|style| {
            let p = CodeParams {
                style,
                max_ops: 3,
                n: n / 3,
                seed: 1,
            };
            rsi_master::train::code_tasks::code_stream(&p, 1).take((n / 3) as usize)
        })
        .collect();
    let (with_form, without_form) = (
        code_sets(Some(rsi_master::config::NormalForm::StringOps)),
        code_sets(None),
    );
    let code_scan = |sets: &[EvalSet]| {
        let t = Instant::now();
        Scanner::new(sets, code_cfg).scan_parts(&[&code_rows], 50);
        t.elapsed().as_secs_f64() * 1e6 / code_rows.len() as f64
    };
    let (mut code_with, mut code_without) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        code_without.push(code_scan(&without_form));
        code_with.push(code_scan(&with_form));
    }
    let (code_with, code_without) = (median(&mut code_with), median(&mut code_without));

    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "rows": n,
            "protected_items": test_items.len(),
            "scan_us_per_row (4-digit scratchpad rows, ~60 B)": (scan_us * 100.0).round() / 100.0,
            "baseline_scan_us_per_row (the gate before issue 13, same rows)": (baseline_us * 100.0).round() / 100.0,
            "scan_us_per_row test+sealed only (median of 3)": (without_dev * 100.0).round() / 100.0,
            "scan_us_per_row with dev and dev_twin (median of 3)": (with_dev * 100.0).round() / 100.0,
            "dev_protection_added_us_per_row": ((with_dev - without_dev) * 100.0).round() / 100.0,
            "register_dataset_us_per_row (inline, whole action)": (register_us * 100.0).round() / 100.0,
            "generator_us_per_row (3-digit, every draw checked)": (generate_us * 100.0).round() / 100.0,
            "generator_us_per_row (tiny-sort6 scratchpad, digits form)": (sort_generate_us * 100.0).round() / 100.0,
            "scan_us_per_row of tiny-code generated programs, string_ops form (median of 3)": (code_with * 100.0).round() / 100.0,
            "scan_us_per_row of tiny-code generated programs, no normal form (median of 3)": (code_without * 100.0).round() / 100.0,
            "scan_us_per_long_row (~1 kB code-like)": (long_us * 100.0).round() / 100.0,
            "baseline_scan_us_per_long_row": (baseline_long_us * 100.0).round() / 100.0,
            "scan_us_per_kb": (kb_us * 100.0).round() / 100.0,
            "scan_us_per_kb of 16-term chains (~1 kB rows)": (chain_kb_us * 100.0).round() / 100.0,
            "scan_us_per_kb of chains of products (~1 kB rows)": (product_kb_us * 100.0).round() / 100.0,
            "scan_us_per_kb of problems in other notations (~1 kB rows)": (notation_kb_us * 100.0).round() / 100.0,
            "scan_us_per_kb of one chain without `=` (~1 kB rows, each read again across its seam)": (open_chain_kb_us * 100.0).round() / 100.0,
        }))
        .expect("json")
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// A study of `example` at `root` and a node branched from its root to register datasets on.
fn study_with_node(
    root: &std::path::Path,
    example: &str,
    who: &Caller,
) -> (rsi_master::Study, String) {
    rsi_master::faces::init::init(root, Some(example)).expect("init");
    let s = rsi_master::Study::open(root).expect("open");
    let node = s
        .call(who, "branch", json!({"parents": ["n0"], "title": "gate"}))
        .expect("branch")["node"]
        .as_str()
        .expect("id")
        .to_string();
    (s, node)
}

/// The scan as it was before issue 13 (prompt and answer joined by a space, lowercase tokens,
/// every row window in a table, no pairs, no Unicode folding, no normal form), kept here only to
/// measure what the new gate adds.
mod baseline {
    use std::collections::HashMap;
    use std::hash::{DefaultHasher, Hash, Hasher};

    use rsi_master::api::types::Row;

    fn tokens(text: &str) -> Vec<String> {
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

    fn hash(ts: &[String]) -> u64 {
        let mut s = DefaultHasher::new();
        ts.hash(&mut s);
        s.finish()
    }

    fn grams(toks: &[String], n: usize) -> Vec<u64> {
        if toks.len() <= n {
            return vec![hash(toks)];
        }
        toks.windows(n).map(hash).collect()
    }

    /// Items hit (normalized and prompt passes; the skeleton pass is skipped: arithmetic items
    /// have none).
    pub fn scan(rows: &[Row], items: &[Row], n: usize) -> usize {
        let text = |r: &Row| format!("{} {}", r.prompt, r.answer);
        let prepared: Vec<(Vec<u64>, Vec<u64>, Vec<usize>)> = items
            .iter()
            .map(|r| {
                let (f, p) = (tokens(&text(r)), tokens(&r.prompt));
                let short = [f.len(), p.len()].into_iter().filter(|&l| l < n).collect();
                (grams(&f, n), grams(&p, n), short)
            })
            .collect();
        let mut lens: Vec<usize> = prepared.iter().flat_map(|i| i.2.clone()).collect();
        lens.push(n);
        lens.sort_unstable();
        lens.dedup();
        let mut table: HashMap<u64, usize> = HashMap::new();
        for (i, r) in rows.iter().enumerate() {
            let toks = tokens(&text(r));
            for &l in &lens {
                if toks.len() >= l {
                    for w in toks.windows(l) {
                        table.entry(hash(w)).or_insert(i);
                    }
                }
            }
        }
        prepared
            .iter()
            .filter(|(f, p, _)| {
                [f, p]
                    .iter()
                    .any(|g| g.iter().filter(|x| table.contains_key(x)).count() * 2 >= g.len())
            })
            .count()
    }
}
