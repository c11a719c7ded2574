//! The tiny-code example end to end through the public actions: a base model that writes the
//! family's Python but scores nothing, SFT on generated programs that raises pass@1 on held-out
//! compositions, generated data that holds no composition of any split, and a dev item's
//! specification or renamed program refused by the gate.

use std::collections::HashSet;
use std::fs;
use std::path::Path;

use serde_json::{Value, json};

use crate::common::{call, fsck_clean, inline, ok_json, run, sandbox_available, study_of};
use rsi_master::train::code_tasks::composition_key;

fn refused(root: &Path, action: &str, req: &Value) -> String {
    let out = run(root, &["call", action, &req.to_string()]);
    assert!(!out.status.success(), "{action} {req} was accepted");
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn split_keys(root: &Path, split: &str) -> HashSet<String> {
    let p = root.join(format!(".rsim/protected/strings/{split}.jsonl"));
    fs::read_to_string(&p)
        .expect("split")
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("item");
            composition_key(v["prompt"].as_str().expect("prompt"))
        })
        .collect()
}

#[test]
fn sft_on_generated_programs_raises_pass_at_1_on_held_out_compositions() {
    if !sandbox_available() {
        return;
    }
    let (_d, root) = study_of("tiny-code");

    // Every split holds its own compositions (letters aside, as the gate's skeleton sees them).
    let splits = ["dev", "test", "sealed", "dev_twin"].map(|s| (s, split_keys(&root, s)));
    for (i, (a, ka)) in splits.iter().enumerate() {
        for (b, kb) in &splits[i + 1..] {
            assert!(ka.is_disjoint(kb), "{a} and {b} share a composition");
        }
    }

    let base_dev = call(
        &root,
        "evaluate",
        &json!({"node": "n0", "checkpoint": "base", "task": "strings", "split": "dev"}),
    );
    let base_pass = base_dev["metrics"]["pass_at_1"]
        .as_f64()
        .expect("pass_at_1");
    assert!(
        base_pass <= 0.05,
        "the base model already solves the task: {base_pass}"
    );

    let b = ok_json(&root, &["branch", "--from", "n0", "--title", "steps style"]);
    let node = b["node"].as_str().expect("node").to_string();
    let reg = call(
        &root,
        "register_dataset",
        &json!({"node": node, "name": "steps", "source": {"kind": "code", "style": "steps", "max_ops": 3, "n": 20000, "seed": 1}}),
    );
    assert_eq!(reg["rows"], 20000, "{reg}");

    // The generated rows pose no composition any split holds, in any letters.
    // (the registered bytes, from the content-addressed store)
    let sha = reg["sha256"].as_str().expect("sha256");
    let stored = root
        .join(".rsim/objects/sha256")
        .join(&sha[..2])
        .join(&sha[2..]);
    let held: HashSet<String> = splits.iter().flat_map(|(_, k)| k.iter().cloned()).collect();
    let generated: Vec<String> = fs::read_to_string(&stored)
        .expect("dataset object")
        .lines()
        .map(|l| {
            let r: Value = serde_json::from_str(l).expect("row");
            composition_key(r["prompt"].as_str().expect("prompt"))
        })
        .collect();
    assert_eq!(generated.len(), 20000);
    assert!(
        generated.iter().all(|k| !held.contains(k)),
        "generated data holds a held-out composition"
    );

    let sft = call(
        &root,
        "run_sft",
        &json!({"node": node, "base": "base", "datasets": ["steps"], "learning_rate": 0.003,
                "steps": SFT_STEPS, "batch_size": 32, "warmup_steps": 30, "schedule": "cosine"}),
    );
    assert_eq!(sft["job"]["state"], "succeeded", "{sft}");
    let dev = call(
        &root,
        "evaluate",
        &json!({"node": node, "checkpoint": sft["checkpoint"], "task": "strings", "split": "dev"}),
    );
    let pass = dev["metrics"]["pass_at_1"].as_f64().expect("pass_at_1");
    assert!(
        pass >= base_pass + MIN_GAIN,
        "SFT did not move pass@1 clearly: {base_pass} -> {pass}: {}",
        dev["metrics"]
    );
    // Every item's program ran and was judged: passed, wrong or crashed, nothing else here.
    let m = &dev["metrics"];
    let judged: f64 = ["programs_passed", "programs_wrong", "programs_crashed"]
        .iter()
        .map(|k| m[k].as_f64().unwrap_or(0.0))
        .sum();
    assert_eq!(judged, 200.0, "{m}");

    // A dev item's specification with another program, and the item with other names and
    // letters (its skeleton: every word but `str`, `print` and numbers blanked), are both that
    // item to the gate.
    let item = &dev["items"][0];
    let (prompt, expected) = (
        item["prompt"].as_str().expect("prompt"),
        item["expected"].as_str().expect("expected"),
    );
    let e = refused(
        &root,
        "register_dataset",
        &inline(
            &node,
            "spec",
            &[(prompt.to_string(), "s=input();print(s)".to_string())],
        ),
    );
    assert!(e.contains("contamination"), "{e}");
    let spec: Vec<String> = prompt
        .trim_start_matches("str ")
        .trim_end_matches('>')
        .split(';')
        .map(|op| match op.split_once(' ') {
            Some((_, arg)) => format!("op {arg}"),
            None => "op".to_string(),
        })
        .collect();
    let disguised = (
        format!("str {}>", spec.join(";")),
        expected.replace('s', "q"),
    );
    let e = refused(
        &root,
        "register_dataset",
        &inline(&node, "renamed", std::slice::from_ref(&disguised)),
    );
    assert!(e.contains("contamination"), "{disguised:?}: {e}");
    fsck_clean(&root);
}

/// Training steps of the test's SFT run and the least gain over the base model it must show
/// (measured: see the README of examples/tiny-code for what longer runs reach).
const SFT_STEPS: u64 = 600;
const MIN_GAIN: f64 = 0.15;

#[test]
fn built_in_agents_run_a_campaign_on_the_code_family_and_rank_by_pass_at_1() {
    if !sandbox_available() {
        return;
    }
    let (_d, root) = study_of("tiny-code");
    let v = ok_json(
        &root,
        &["run", "--experiments", "3", "--steps", "30", "--quiet"],
    );
    assert_eq!(v["summary"]["experiments"], 3, "{v}");
    // The opening directions are the family's program styles, each with the code generator's
    // data; every score the campaign ranked on is pass@1.
    let log = ok_json(&root, &["log", "--max-tokens", "1000000"]);
    let acts = log["actions"].as_array().expect("actions");
    let styles: HashSet<&str> = acts
        .iter()
        .filter(|a| a["action"] == "register_dataset" && a["decision"] == "accepted")
        .filter_map(|a| a["summary"].as_str())
        .flat_map(|s| {
            ["steps", "nested", "named"]
                .into_iter()
                .filter(move |f| s.contains(f))
        })
        .collect();
    assert!(styles.len() >= 2, "{acts:?}");
    for n in ["n1", "n2", "n3"] {
        let node = ok_json(&root, &["show", n]);
        let hyp = node["hypothesis"].as_str().unwrap_or("");
        assert!(
            ["format=steps", "format=nested", "format=named"]
                .iter()
                .any(|f| hyp.contains(f)),
            "{hyp}"
        );
    }
    let report = &v["report"];
    assert_eq!(report["metric"], "pass_at_1", "{report}");
    // Every dev score the campaign ranked on is a pass rate (an evaluation records the counts of
    // programs passed, wrong, crashed beside it, which are not), and the promoted node is the
    // best of them.
    let devs: Vec<f64> = report["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["dev_mean"].as_f64())
        .collect();
    assert!(!devs.is_empty(), "{report}");
    assert!(devs.iter().all(|d| (0.0..=1.0).contains(d)), "{devs:?}");
    let best = report["best"]["dev_mean"].as_f64().expect("best");
    assert!(devs.iter().all(|d| *d <= best), "{best} vs {devs:?}");
    fsck_clean(&root);
}
