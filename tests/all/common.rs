//! Helpers shared by the integration tests that drive the real `rsim` binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The rsim binary under test, without a study from the environment.
pub fn rsim() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rsim"));
    c.env_remove("RSIM_STUDY");
    c
}

/// `rsim -C study ARGS...`
pub fn run(study: &Path, args: &[&str]) -> Output {
    rsim()
        .arg("-C")
        .arg(study)
        .args(args)
        .output()
        .expect("spawn rsim")
}

/// `rsim -C study ARGS...`, which must succeed.
pub fn run_ok(study: &Path, args: &[&str]) -> Output {
    let out = run(study, args);
    assert!(
        out.status.success(),
        "rsim {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `rsim -C study --json ARGS...`, which must succeed; its JSON output.
pub fn ok_json(study: &Path, args: &[&str]) -> Value {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    let out = run(study, &full);
    assert!(
        out.status.success(),
        "rsim {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json output")
}

/// A fresh study of the fast tiny-arith-ngram example in a temporary directory.
pub fn example_study() -> (tempfile::TempDir, PathBuf) {
    study_of("tiny-arith-ngram")
}

/// A fresh study of an example in a temporary directory (`rsim init DIR --example NAME`).
pub fn study_of(example: &str) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().expect("tempdir");
    let root = d.path().join("study");
    let out = rsim()
        .args(["init"])
        .arg(&root)
        .args(["--example", example])
        .output()
        .expect("init");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (d, root)
}

/// `rsim -C study call ACTION REQUEST`, which must succeed; its JSON result.
pub fn call(study: &Path, action: &str, req: &Value) -> Value {
    let out = run(study, &["call", action, &req.to_string()]);
    assert!(
        out.status.success(),
        "{action} {req}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

/// Write `text` as the study's rsim.toml and commit it on main, as the study owner would.
pub fn commit_config(root: &Path, text: &str, message: &str) {
    std::fs::write(root.join("rsim.toml"), text).expect("write config");
    let repo = git2::Repository::open(root).expect("repo");
    let head = repo.head().expect("head").peel_to_commit().expect("commit");
    let mut index = repo.index().expect("index");
    index
        .read_tree(&head.tree().expect("tree"))
        .expect("read tree");
    index.add_path(Path::new("rsim.toml")).expect("add");
    let tree = repo
        .find_tree(index.write_tree().expect("write tree"))
        .expect("tree");
    let sig = git2::Signature::now("owner", "owner@example.invalid").expect("sig");
    repo.commit(Some("HEAD"), &sig, &sig, message, &tree, &[&head])
        .expect("commit");
}

/// `git -C dir ARGS`, which must succeed; its standard output.
pub fn git_ok(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `rsim fsck` must pass.
pub fn fsck_clean(study: &Path) {
    let out = run(study, &["fsck"]);
    assert!(
        out.status.success(),
        "fsck: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `register_dataset` request for inline (prompt, answer) rows.
pub fn inline(node: &str, name: &str, rows: &[(String, String)]) -> Value {
    let rows: Vec<Value> = rows
        .iter()
        .map(|(p, a)| serde_json::json!({"prompt": p, "answer": a}))
        .collect();
    serde_json::json!({"node": node, "name": name, "source": {"kind": "inline", "rows": rows}})
}

/// Every row of the index's record tables, as text, sorted (the index's own bookkeeping —
/// pending markers, holds, claims, rates — is left out).
pub fn index_rows(s: &rsi_master::Study) -> Vec<String> {
    let conn = s.index().conn();
    let mut out = Vec::new();
    for t in rsi_master::record::index::RECORD_TABLES {
        let mut st = conn.prepare(&format!("SELECT * FROM {t}")).expect("select");
        let n = st.column_count();
        let rows = st
            .query_map([], |r| {
                let cols: Vec<String> = (0..n)
                    .map(|i| format!("{:?}", r.get_ref(i).map(|v| v.to_owned())))
                    .collect();
                Ok(format!("{t}: {}", cols.join(" | ")))
            })
            .expect("query")
            .collect::<rusqlite::Result<Vec<_>>>()
            .expect("rows");
        out.extend(rows);
    }
    out.sort();
    out
}

/// Whether this machine can sandbox jobs (Landlock); without it a sandbox test skips, unless
/// `RSIM_REQUIRE_SANDBOX` is set (CI), where it fails.
pub fn sandbox_available() -> bool {
    match rsi_master::jobs::sandbox::landlock_abi() {
        Ok(_) => true,
        Err(why) => {
            assert!(
                std::env::var_os("RSIM_REQUIRE_SANDBOX").is_none(),
                "RSIM_REQUIRE_SANDBOX is set but this machine cannot sandbox jobs: {why}"
            );
            eprintln!("skipped: no sandbox here: {why}");
            false
        }
    }
}
