//! Behaviour of the Experiment OS API against real studies: git record, index, DAG, policy.

use std::path::{Path, PathBuf};

use rsi_master::Study;
use rsi_master::api::types::*;
use rsi_master::model::{Caller, Role, Split};
use rsi_master::record::Trailers;
use rsi_master::{ErrorKind, faces::init};
use serde_json::{Value, json};

fn new_study() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("study");
    init::init(&root, Some("tiny-arith-ngram")).expect("init");
    (dir, root)
}

fn open(root: &Path) -> Study {
    let mut s = Study::open(root).expect("open");
    s.set_rsim_bin(PathBuf::from(env!("CARGO_BIN_EXE_rsim")));
    s
}

fn owner() -> Caller {
    Caller::owner()
}

/// Every ref and its target, plus the number of objects: "nothing written" means this is unchanged.
fn git_state(root: &Path) -> (Vec<(String, String)>, usize) {
    let repo = git2::Repository::open(root).expect("repo");
    let mut refs: Vec<(String, String)> = repo
        .references()
        .expect("refs")
        .filter_map(|r| r.ok())
        .map(|r| {
            (
                r.name().unwrap_or("").to_string(),
                r.target().map(|t| t.to_string()).unwrap_or_default(),
            )
        })
        .collect();
    refs.sort();
    let mut n = 0;
    repo.odb()
        .expect("odb")
        .foreach(|_| {
            n += 1;
            true
        })
        .expect("foreach");
    (refs, n)
}

fn branch(s: &Study, parents: &[&str], title: &str) -> String {
    s.call(
        &owner(),
        "branch",
        json!({"parents": parents, "title": title}),
    )
    .expect("branch")["node"]
        .as_str()
        .expect("node id")
        .to_string()
}

#[test]
fn each_action_is_one_commit_with_trailers_and_merges_are_merge_commits() {
    let (_d, root) = new_study();
    let s = open(&root);
    let a = branch(&s, &["n0"], "A");
    let b = branch(&s, &["n0"], "B");
    let m = branch(&s, &[&a, &b], "A+B");
    let repo = git2::Repository::open(&root).expect("repo");
    let tip = |id: &str| {
        repo.refname_to_id(&format!("refs/heads/rsim/n/{id}"))
            .expect("ref")
    };
    let merge = repo.find_commit(tip(&m)).expect("commit");
    assert_eq!(
        merge.parent_count(),
        2,
        "a node with two parents is a merge commit"
    );
    assert_eq!(merge.parent_id(0).expect("p0"), tip(&a));
    assert_eq!(merge.parent_id(1).expect("p1"), tip(&b));

    let before = tip(&a);
    s.call(
        &owner(),
        "register_dataset",
        json!({"node": a, "name": "rows", "source": {"kind": "inline", "rows": [{"prompt": "1+1=", "answer": "2"}]}}),
    )
    .expect("register");
    let after = repo.find_commit(tip(&a)).expect("commit");
    assert_eq!(after.parent_count(), 1);
    assert_eq!(
        after.parent_id(0).expect("parent"),
        before,
        "exactly one new commit"
    );
    let t = Trailers::parse(after.message().expect("msg"));
    assert_eq!(t.node.as_deref(), Some(a.as_str()));
    assert_eq!(t.seq, Some(2));
    assert_eq!(t.decision.as_deref(), Some("accepted"));
    assert_eq!(t.agent.as_deref(), Some("owner"));
    assert!(
        after
            .summary()
            .ok()
            .flatten()
            .expect("subject")
            .starts_with("register_dataset: ")
    );
    // The node's state is plain files in its tree.
    let tree = after.tree().expect("tree");
    assert!(tree.get_path(Path::new("node.toml")).is_ok());
    assert!(
        tree.get_path(Path::new("actions/0002-register_dataset.json"))
            .is_ok()
    );
    // No work tree was touched: the study's checkout still only has main's files.
    assert!(!root.join("actions").exists() && !root.join("node.toml").exists());
}

#[test]
fn full_experiment_trains_evaluates_and_records_real_numbers() {
    let (_d, root) = new_study();
    let s = open(&root);
    let n = branch(&s, &["n0"], "plain data");
    s.call(&owner(), "register_dataset", json!({"node": n, "name": "plain", "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 5000, "seed": 3}})).expect("register");
    let sft = s
        .call(&owner(), "run_sft", json!({"node": n, "base": "base", "datasets": ["plain"], "learning_rate": 0.001, "steps": 100, "batch_size": 32, "seed": 1}))
        .expect("sft");
    assert_eq!(sft["job"]["state"], "succeeded", "{sft}");
    let ck = sft["checkpoint"].as_str().expect("checkpoint").to_string();
    let dev = s
        .call(
            &owner(),
            "evaluate",
            json!({"node": n, "checkpoint": ck, "task": "add2", "split": "dev"}),
        )
        .expect("eval");
    let base = s
        .call(
            &owner(),
            "evaluate",
            json!({"node": n, "checkpoint": "base", "task": "add2", "split": "dev"}),
        )
        .expect("eval");
    let em = dev["metrics"]["exact_match"].as_f64().expect("em");
    let em0 = base["metrics"]["exact_match"].as_f64().expect("em");
    // The n-gram model memorises problems, and the generator draws no dev item (dev is evidence,
    // protected from training): it gains nothing on dev it never saw, and its dev score is not
    // above the hidden twin's. (Before dev was protected, the same run "helped" by +0.3 — by
    // training on dev items.)
    assert!(
        (em - em0).abs() < 0.05,
        "no dev item trained: base {em0}, trained {em}"
    );
    assert!(dev.get("evidence_suspect").is_none(), "{dev}");
    assert!(
        sft["metrics"]["final_loss"].as_f64().is_some() || sft["curve"].is_array(),
        "the run recorded its training: {sft}"
    );
    assert_eq!(
        dev["items"].as_array().map(Vec::len),
        Some(200),
        "dev split shows per-item results"
    );
    let test = s
        .call(
            &owner(),
            "evaluate",
            json!({"node": n, "checkpoint": ck, "task": "add2", "split": "test"}),
        )
        .expect("eval");
    assert!(
        test.get("items").is_none(),
        "test split returns aggregates only: {test}"
    );
    // The lineage leads from the checkpoint back to the base model.
    let lin = s
        .call(
            &owner(),
            "dag",
            json!({"view": "lineage", "checkpoint": ck}),
        )
        .expect("lineage");
    let steps = lin["lineage"].as_array().expect("lineage");
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0]["node"], json!(n));
    assert!(steps[1].get("node").is_none(), "ends at the base model");
    // Best view ranks the node by its metric.
    let best = s
        .call(&owner(), "dag", json!({"view": "best", "task": "add2"}))
        .expect("best");
    assert_eq!(best["nodes"][0]["id"], json!(n));
    // compare reports mean ± interval over the node's evaluations.
    let cmp = s
        .call(
            &owner(),
            "compare",
            json!({"node": "n0", "nodes": ["n0", n], "task": "add2"}),
        )
        .expect("compare");
    assert_eq!(cmp["rows"][1]["n"], json!(2));
    assert!(cmp["rows"][1]["ci95"].is_array());
    // get_job finds the recorded job.
    let job = s
        .call(&owner(), "get_job", json!({"job": sft["job"]["id"]}))
        .expect("job");
    assert_eq!(job["node"], json!(n));
}

#[test]
fn bad_input_is_a_clear_error_and_writes_nothing() {
    let (_d, root) = new_study();
    let s = open(&root);
    let before = git_state(&root);
    let cases: Vec<(&str, Value, &str, ErrorKind)> = vec![
        (
            "branch",
            json!({"parents": ["n0"], "title": "x", "colour": "red"}),
            "colour",
            ErrorKind::Invalid,
        ),
        (
            "branch",
            json!({"parents": ["n0"], "title": "line\nbreak"}),
            "title",
            ErrorKind::Invalid,
        ),
        (
            "branch",
            json!({"parents": ["n0"], "title": "up/../../etc"}),
            "title",
            ErrorKind::Invalid,
        ),
        (
            "branch",
            json!({"parents": ["n0"], "title": "bell\u{7}"}),
            "title",
            ErrorKind::Invalid,
        ),
        (
            "branch",
            json!({"parents": ["n0"], "title": ""}),
            "title",
            ErrorKind::Invalid,
        ),
        (
            "branch",
            json!({"parents": ["n0", "n0"], "title": "x"}),
            "parents",
            ErrorKind::Invalid,
        ),
        (
            "branch",
            json!({"parents": ["n0", "n1", "n2"], "title": "x"}),
            "parents",
            ErrorKind::Invalid,
        ),
        (
            "branch",
            json!({"parents": ["n42"], "title": "x"}),
            "n42",
            ErrorKind::NotFound,
        ),
        (
            "branch",
            json!({"parents": ["../main"], "title": "x"}),
            "parents.0",
            ErrorKind::Invalid,
        ),
        (
            "branch",
            json!({"title": "x"}),
            "parents",
            ErrorKind::Invalid,
        ),
        (
            "run_sft",
            json!({"node": "n0", "base": "base", "datasets": ["d"], "learning_rate": 2.0, "steps": 1, "batch_size": 1}),
            "learning_rate",
            ErrorKind::Invalid,
        ),
        (
            "run_sft",
            json!({"node": "n0", "base": "base", "datasets": ["d"], "learning_rate": 0.1, "steps": 1, "batch_size": 0}),
            "batch_size",
            ErrorKind::Invalid,
        ),
        (
            "run_sft",
            json!({"node": "n0", "base": "/etc/passwd", "datasets": ["d"], "learning_rate": 0.1, "steps": 1, "batch_size": 1}),
            "base",
            ErrorKind::Invalid,
        ),
        (
            "evaluate",
            json!({"node": "n0", "checkpoint": "base", "task": "add2", "split": "train"}),
            "split",
            ErrorKind::Invalid,
        ),
        (
            "evaluate",
            json!({"node": "n0", "checkpoint": "base", "task": "nosuch", "split": "dev"}),
            "task",
            ErrorKind::NotFound,
        ),
        (
            "register_dataset",
            json!({"node": "n0", "name": "../x", "source": {"kind": "inline", "rows": [{"prompt": "a", "answer": "b"}]}}),
            "name",
            ErrorKind::Invalid,
        ),
        (
            "register_dataset",
            json!({"node": "n0", "name": "x", "source": {"kind": "declared", "source": "nosuch"}}),
            "source",
            ErrorKind::NotFound,
        ),
        (
            "register_dataset",
            json!({"node": "n0", "name": "x", "source": {"kind": "url", "url": "http://x"}}),
            "source",
            ErrorKind::Invalid,
        ),
        (
            "conclude",
            json!({"node": "n7", "outcome": "positive", "findings": "x"}),
            "n7",
            ErrorKind::NotFound,
        ),
        ("get_node", json!({"node": "n7"}), "n7", ErrorKind::NotFound),
        (
            "nosuch_action",
            json!({}),
            "unknown action",
            ErrorKind::Invalid,
        ),
    ];
    for (action, args, needle, kind) in cases {
        let e = s
            .call(&owner(), action, args.clone())
            .expect_err(&format!("{action} {args} must fail"));
        assert_eq!(e.kind, kind, "{action} {args}: {}", e.message);
        assert!(
            e.message.contains(needle),
            "{action} {args}: message {:?} should name {needle:?}",
            e.message
        );
    }
    assert_eq!(
        git_state(&root),
        before,
        "invalid requests wrote nothing to git"
    );
}

#[test]
fn policy_rejections_are_recorded_and_counted() {
    let (_d, root) = new_study();
    let s = open(&root);
    let n = branch(&s, &["n0"], "x");
    let e = s
        .call(&owner(), "run_sft", json!({"node": n, "base": "base", "datasets": ["never-registered"], "learning_rate": 0.001, "steps": 1, "batch_size": 1}))
        .expect_err("unregistered dataset");
    assert_eq!(e.kind, ErrorKind::Rejected);
    assert_eq!(e.rule.as_deref(), Some("dataset-unregistered"));
    let commit = e.commit.clone().expect("rejection recorded");
    let repo = git2::Repository::open(&root).expect("repo");
    let c = repo
        .find_commit(git2::Oid::from_str(&commit).expect("oid"))
        .expect("commit");
    let t = Trailers::parse(c.message().expect("msg"));
    assert_eq!(t.decision.as_deref(), Some("rejected"));
    assert_eq!(t.rule.as_deref(), Some("dataset-unregistered"));
    // Roles: an observer cannot write, a worker cannot review; both tries are recorded.
    let obs = Caller::new("watcher", Role::Observer);
    let e = s
        .call(&obs, "branch", json!({"parents": [n], "title": "y"}))
        .expect_err("observer");
    assert_eq!(e.rule.as_deref(), Some("role"));
    let w = Caller::new("worker-1", Role::Worker);
    let e = s
        .call(&w, "review", json!({"node": n, "summary": "looks good"}))
        .expect_err("worker review");
    assert_eq!(e.rule.as_deref(), Some("role"));
    let r = Caller::new("reviewer-1", Role::Reviewer);
    s.call(&r, "review", json!({"node": n, "summary": "try a merge", "verdicts": [{"node": n, "verdict": "needs_more_seeds", "reason": "one seed"}], "proposals": [{"parents": ["n0", n], "title": "merge"}]})).expect("review");
    let log = s.call(&owner(), "log", json!({"node": n})).expect("log");
    let rejected = log["actions"]
        .as_array()
        .expect("actions")
        .iter()
        .filter(|a| a["decision"] == "rejected")
        .count();
    assert_eq!(rejected, 3);
    // Concluded nodes take no more experiments.
    s.call(
        &owner(),
        "conclude",
        json!({"node": n, "outcome": "inconclusive", "findings": "ran out of ideas"}),
    )
    .expect("conclude");
    let e = s
        .call(&owner(), "register_dataset", json!({"node": n, "name": "late", "source": {"kind": "inline", "rows": [{"prompt": "a", "answer": "b"}]}}))
        .expect_err("concluded");
    assert_eq!(e.rule.as_deref(), Some("node-concluded"));
    let node = s
        .call(&owner(), "get_node", json!({"node": n}))
        .expect("node");
    assert_eq!(node["status"], "concluded");
    assert!(
        node["notes"]
            .as_str()
            .expect("notes")
            .contains("ran out of ideas")
    );
}

#[test]
fn a_changed_evaluator_or_eval_set_is_rejected() {
    let (_d, root) = new_study();
    // Tamper with the protected test split: its pinned hash no longer matches.
    let p = root.join(".rsim/protected/add2/test.jsonl");
    let mut text = std::fs::read_to_string(&p).expect("read");
    text.push_str("{\"prompt\":\"1+1=\",\"answer\":\"2\"}\n");
    std::fs::write(&p, text).expect("write");
    let s = open(&root);
    let e = s
        .call(
            &owner(),
            "evaluate",
            json!({"node": "n0", "checkpoint": "base", "task": "add2", "split": "test"}),
        )
        .expect_err("tampered");
    assert_eq!(e.rule.as_deref(), Some("eval-set-pinned"), "{}", e.message);
}

/// Every query answer, for comparing an index with one rebuilt from git.
fn all_answers(s: &Study) -> Vec<Value> {
    let mut out = Vec::new();
    let o = owner();
    let list = s
        .call(&o, "list_nodes", json!({"limit": 1000}))
        .expect("list");
    for n in list["nodes"].as_array().expect("nodes") {
        let id = n["id"].clone();
        out.push(
            s.call(&o, "get_node", json!({"node": id}))
                .expect("get_node"),
        );
        for view in ["children", "ancestors", "related"] {
            out.push(
                s.call(&o, "dag", json!({"view": view, "node": id}))
                    .expect("dag"),
            );
        }
        out.push(
            s.call(&o, "log", json!({"node": id, "limit": 1000}))
                .expect("log"),
        );
    }
    out.push(list);
    for st in ["open", "concluded"] {
        out.push(
            s.call(&o, "list_nodes", json!({"status": st}))
                .expect("list"),
        );
    }
    for view in ["full", "frontier", "best"] {
        out.push(s.call(&o, "dag", json!({"view": view})).expect("dag"));
    }
    out.push(s.call(&o, "log", json!({"limit": 100000})).expect("log"));
    let jobs: Vec<String> = s
        .index()
        .conn()
        .prepare("SELECT id FROM jobs ORDER BY id")
        .expect("prep")
        .query_map([], |r| r.get(0))
        .expect("q")
        .map(|r| r.expect("row"))
        .collect();
    for j in jobs {
        out.push(s.call(&o, "get_job", json!({"job": j})).expect("job"));
    }
    let agents = s.index().agents().expect("agents");
    out.push(serde_json::to_value(agents).expect("json"));
    out
}

#[test]
fn deleting_the_index_and_reindexing_gives_the_same_answers() {
    let (_d, root) = new_study();
    let answers = {
        let s = open(&root);
        let a = branch(&s, &["n0"], "A");
        let b = branch(&s, &["n0"], "B");
        let c = branch(&s, &[&a], "A1");
        branch(&s, &[&c, &b], "A1+B");
        s.call(&owner(), "register_dataset", json!({"node": a, "name": "d", "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 500, "seed": 1}})).expect("reg");
        let sft = s.call(&Caller::new("worker-7", Role::Worker), "run_sft", json!({"node": a, "base": "base", "datasets": ["d"], "learning_rate": 0.001, "steps": 10, "batch_size": 8})).expect("sft");
        let ck = sft["checkpoint"].as_str().expect("ck").to_string();
        for split in ["dev", "test"] {
            s.call(
                &owner(),
                "evaluate",
                json!({"node": a, "checkpoint": ck, "task": "add2", "split": split}),
            )
            .expect("eval");
        }
        s.call(
            &owner(),
            "evaluate",
            json!({"node": b, "checkpoint": "base", "task": "add2", "split": "dev"}),
        )
        .expect("eval");
        let _ = s.call(
            &owner(),
            "evaluate",
            json!({"node": a, "checkpoint": "f".repeat(64), "task": "add2", "split": "dev"}),
        );
        s.call(
            &owner(),
            "compare",
            json!({"node": "n0", "nodes": [a, b], "task": "add2"}),
        )
        .expect("cmp");
        s.call(
            &owner(),
            "conclude",
            json!({"node": b, "outcome": "negative", "findings": "base is bad"}),
        )
        .expect("conclude");
        (all_answers(&s), crate::common::index_rows(&s))
    };
    let (answers, rows) = answers;
    assert!(answers.len() > 20);
    for f in ["index.sqlite", "index.sqlite-wal", "index.sqlite-shm"] {
        let _ = std::fs::remove_file(root.join(".rsim").join(f));
    }
    // A missing index is rebuilt from git on the next open (a fresh clone's first read)...
    let mut s = open(&root);
    assert_eq!(all_answers(&s), answers, "rebuilt on open");
    // ...and `rsim reindex` rebuilds it again to the same answers.
    s.reindex().expect("reindex");
    let again = all_answers(&s);
    assert_eq!(answers.len(), again.len());
    for (a, b) in answers.iter().zip(&again) {
        assert_eq!(a, b);
    }
    // Row for row: what writers indexed from their own writes is what git alone gives.
    let rebuilt = crate::common::index_rows(&s);
    assert!(rows.len() > 30, "{}", rows.len());
    for (a, b) in rows.iter().zip(&rebuilt) {
        assert_eq!(a, b);
    }
    assert_eq!(rows.len(), rebuilt.len());
    let rep = rsi_master::os::fsck::fsck(&s).expect("fsck");
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

#[test]
fn concurrent_writers_never_lose_a_commit() {
    let (_d, root) = new_study();
    let n = branch(&open(&root), &["n0"], "shared node");
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let root = root.clone();
            let n = n.clone();
            std::thread::spawn(move || {
                let s = open(&root);
                let who = Caller::new(format!("agent-{t}"), Role::Worker);
                for i in 0..10 {
                    s.call(
                        &who,
                        "compare",
                        json!({"node": n, "nodes": ["n0", n], "task": "add2"}),
                    )
                    .expect("compare");
                    if i % 3 == 0 {
                        s.call(
                            &who,
                            "branch",
                            json!({"parents": [n], "title": format!("child {t}.{i}")}),
                        )
                        .expect("branch");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    let s = open(&root);
    let node = s
        .call(&owner(), "get_node", json!({"node": n}))
        .expect("node");
    let actions = node["actions"].as_array().expect("actions");
    assert_eq!(
        actions.len(),
        1 + 40,
        "every compare is recorded exactly once"
    );
    for (i, a) in actions.iter().enumerate() {
        assert_eq!(a["seq"], json!(i + 1));
    }
    let git_nodes = s.record().node_tips().expect("tips").len();
    assert_eq!(git_nodes, 2 + 16, "git has every node");
    assert_eq!(
        node["children"].as_array().map(Vec::len),
        Some(16),
        "4 writers × 4 branches each, unique ids: {node}"
    );
    let rep = rsi_master::os::fsck::fsck(&s).expect("fsck");
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

#[test]
fn malformed_config_is_reported_with_file_and_key_and_nothing_is_created() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("s");
    std::fs::create_dir_all(&root).expect("mkdir");
    std::fs::write(root.join("rsim.toml"), "[study]\nname = \"x\"\n[base_model]\nname = \"b\"\npath = \"m\"\n[jobs]\nsft = \"train.sh\"\nevaluate = [\"e\"]\n").expect("write");
    let e = init::init(&root, None).expect_err("bad config");
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert!(
        e.message.contains("rsim.toml")
            && e.message.contains("jobs.sft")
            && e.message.contains("line 7"),
        "{}",
        e.message
    );
    assert!(!root.join(".git").exists(), "no repository was created");
    // A study that does not exist is a clear error too.
    let e = Study::open(&dir.path().join("nowhere"))
        .err()
        .expect("no study");
    assert!(e.message.contains("nowhere"));
}

#[test]
fn split_enum_round_trips() {
    assert_eq!(
        serde_json::to_value(Split::Test).expect("json"),
        json!("test")
    );
    let r: EvaluateRequest = serde_json::from_value(
        json!({"node": "n0", "checkpoint": "base", "task": "t", "split": "dev"}),
    )
    .expect("parse");
    assert_eq!(r.split, Split::Dev);
}

#[test]
fn a_writer_dying_between_commit_and_index_update_is_repaired_on_open() {
    let (_d, root) = new_study();
    let n = branch(&open(&root), &["n0"], "x");
    let s = open(&root);
    s.call(
        &owner(),
        "compare",
        json!({"node": n, "nodes": ["n0", n], "task": "add2"}),
    )
    .expect("compare");
    let full = s
        .call(&owner(), "get_node", json!({"node": n}))
        .expect("node");
    // Put the index back to where a writer killed after moving the branch would have left it:
    // the node's old tip, without the new action, and the writer's pending marker (a dead pid).
    let first_commit = full["actions"][0]["commit"]
        .as_str()
        .expect("commit")
        .to_string();
    let conn = s.index().conn();
    conn.execute("DELETE FROM actions WHERE node=?1 AND seq=2", [&n])
        .expect("delete");
    conn.execute(
        "UPDATE nodes SET tip=?1, action_count=1 WHERE id=?2",
        [&first_commit, &n],
    )
    .expect("update");
    conn.execute(
        "INSERT INTO pending(node,pid,writer) VALUES(?1, 2147483646, 'dead-writer')",
        [&n],
    )
    .expect("insert");
    drop(s);
    let s = open(&root);
    assert_eq!(
        s.call(&owner(), "get_node", json!({"node": n}))
            .expect("node"),
        full
    );
    assert!(s.index().pending().expect("pending").is_empty());
    // A live writer's marker is left alone (it will clear it itself).
    let pid = std::process::id();
    s.index()
        .conn()
        .execute(
            "INSERT INTO pending(node,pid,writer) VALUES(?1, ?2, 'other-live-writer')",
            rusqlite::params![n, pid],
        )
        .expect("insert");
    drop(s);
    let s = open(&root);
    assert_eq!(s.index().pending().expect("pending").len(), 1);
}

#[test]
fn the_transformer_example_trains_and_evaluates_through_the_actions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("study");
    init::init(&root, Some("tiny-arith")).expect("init");
    let s = open(&root);
    let n = branch(&s, &["n0"], "scratchpad");
    s.call(&owner(), "register_dataset", json!({"node": n, "name": "pad", "source": {"kind": "arith", "op": "add", "digits": 3, "format": "scratchpad", "n": 2000, "seed": 1}})).expect("register");
    let sft = s
        .call(&owner(), "run_sft", json!({"node": n, "base": "base", "datasets": ["pad"], "learning_rate": 0.003, "steps": 30, "batch_size": 16, "seed": 2}))
        .expect("sft");
    assert_eq!(sft["job"]["state"], "succeeded", "{sft}");
    assert!(sft["train_metrics"]["final_loss"].as_f64().expect("loss") > 0.0);
    // Its learning curve: the trainer logs the loss at its last step (and every 50).
    assert_eq!(sft["curve"][0]["step"], 30, "{sft}");
    assert!(sft["curve"][0]["loss"].as_f64().expect("loss") > 0.0);
    let env = sft["job"]["env"].as_str().expect("env");
    assert!(
        env.starts_with("host program=rsim@") && env.contains(" kernel="),
        "host fingerprint: {env}"
    );
    let ck = sft["checkpoint"].as_str().expect("checkpoint").to_string();
    let m = s.store().manifest(&ck).expect("manifest");
    assert!(m.files.contains_key("model.safetensors") && m.files.contains_key("config.json"));
    let cfg: Value =
        serde_json::from_slice(&s.store().get(&m.files["config.json"]).expect("config"))
            .expect("json");
    assert_eq!(cfg["model"], "tiny-gpt");
    assert_eq!(
        cfg["base"],
        json!(s.base_checkpoint().expect("base")),
        "the config records its parent"
    );
    let dev = s
        .call(
            &owner(),
            "evaluate",
            json!({"node": n, "checkpoint": ck, "task": "add3", "split": "dev"}),
        )
        .expect("eval");
    assert_eq!(dev["job"]["state"], "succeeded", "{dev}");
    assert_eq!(dev["n_items"], 200);
    let em = dev["metrics"]["exact_match"].as_f64().expect("em");
    assert!((0.0..=1.0).contains(&em));
    // LoRA on the tiny model: adapters train, are folded into the weights, and the checkpoint is
    // a plain tiny-gpt whose lineage leads back to the base.
    let lora = s
        .call(&owner(), "run_sft", json!({"node": n, "base": ck, "datasets": ["pad"], "learning_rate": 0.003, "steps": 5, "batch_size": 4, "adapter": {"kind": "lora", "rank": 4, "alpha": 8.0}}))
        .expect("recorded");
    assert_eq!(lora["job"]["state"], "succeeded", "{lora}");
    let trainable = lora["train_metrics"]["trainable_params"]
        .as_f64()
        .expect("trainable");
    assert!(trainable > 0.0 && trainable < 30_000.0, "{trainable}");
    let lck = lora["checkpoint"].as_str().expect("checkpoint");
    assert_ne!(lck, ck);
    let dev2 = s
        .call(
            &owner(),
            "evaluate",
            json!({"node": n, "checkpoint": lck, "task": "add3", "split": "dev"}),
        )
        .expect("eval lora");
    assert_eq!(dev2["job"]["state"], "succeeded", "{dev2}");
}

#[test]
fn diff_names_what_differs_and_pairs_metrics_over_matching_seeds() {
    let (_d, root) = new_study();
    let s = open(&root);
    let a = branch(&s, &["n0"], "lr 0.001");
    let b = branch(&s, &["n0"], "lr 0.003 with more data");
    s.call(&owner(), "register_dataset", json!({"node": a, "name": "plain", "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 2000, "seed": 3}})).expect("register");
    s.call(&owner(), "register_dataset", json!({"node": b, "name": "more", "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 1000, "seed": 4}})).expect("register");
    for (node, lr, datasets) in [
        (&a, 0.001, json!(["plain"])),
        (&b, 0.003, json!(["plain", "more"])),
    ] {
        for seed in [1, 2] {
            let sft = s
                .call(&owner(), "run_sft", json!({"node": node, "base": "base", "datasets": datasets, "learning_rate": lr, "steps": 20, "batch_size": 16, "seed": seed}))
                .expect("sft");
            let ck = sft["checkpoint"].as_str().expect("checkpoint");
            s.call(
                &owner(),
                "evaluate",
                json!({"node": node, "checkpoint": ck, "task": "add2", "split": "dev"}),
            )
            .expect("eval");
        }
    }
    let d = s
        .call(&owner(), "diff", json!({"a": a, "b": b}))
        .expect("diff");
    let params = d["params"].as_array().expect("params");
    let lr = params
        .iter()
        .find(|p| p["key"] == "learning_rate")
        .expect("learning_rate differs");
    assert_eq!(lr["side"], "changed");
    assert_eq!(
        (lr["a"].as_f64(), lr["b"].as_f64()),
        (Some(0.001), Some(0.003))
    );
    assert!(
        params
            .iter()
            .all(|p| p["key"] != "steps" && p["key"] != "seed"),
        "equal parameters and seeds are not differences: {d}"
    );
    assert!(d["params_same"].as_u64().expect("same") >= 4, "{d}");
    let ds = d["datasets"].as_array().expect("datasets");
    let side = |name: &str| {
        ds.iter()
            .find(|x| x["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {d}"))
    };
    assert_eq!(side("plain")["side"], "both");
    assert_eq!(side("more")["side"], "only_b");
    assert_eq!(side("more")["rows"], 1000);
    assert_eq!(side("more")["sha256"].as_str().map(str::len), Some(64));
    assert_eq!(d["env_same"], true, "{d}");
    let m = &d["metrics"][0];
    assert_eq!(
        (m["task"].as_str(), m["metric"].as_str()),
        (Some("add2"), Some("exact_match"))
    );
    assert_eq!(m["method"], "paired", "{d}");
    assert_eq!(m["matching_seeds"], json!([1, 2]));
    assert_eq!((m["n_a"].as_u64(), m["n_b"].as_u64()), (Some(2), Some(2)));
    let (diff, ma, mb) = (
        m["difference"].as_f64().expect("difference"),
        m["mean_a"].as_f64().expect("mean"),
        m["mean_b"].as_f64().expect("mean"),
    );
    assert!((diff - (mb - ma)).abs() < 1e-9, "{m}");
    let ci = m["ci95"].as_array().expect("interval");
    assert!(
        ci[0].as_f64() <= Some(diff) && Some(diff) <= ci[1].as_f64(),
        "{m}"
    );

    // Bad input: a clear error, and a query writes nothing.
    let before = git_state(&root);
    let e = s
        .call(&owner(), "diff", json!({"a": a, "b": a}))
        .expect_err("self");
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert!(e.message.contains("two different nodes"), "{}", e.message);
    let e = s
        .call(&owner(), "diff", json!({"a": a, "b": "n999"}))
        .expect_err("unknown");
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(e.message.contains("n999"), "{}", e.message);
    let e = s
        .call(&owner(), "diff", json!({"a": a}))
        .expect_err("missing b");
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert_eq!(git_state(&root), before);
}

#[test]
fn growing_answers_stop_at_their_token_bound_and_page_with_cursors() {
    let (_d, root) = new_study();
    let s = open(&root);
    let mut ids = vec!["n0".to_string()];
    for i in 0..190 {
        let p = ids[i / 3].clone();
        ids.push(branch(
            &s,
            &[&p],
            &format!("direction {i} with a title long enough to count"),
        ));
    }
    // Page through each query: every item exactly once, every page within its bound.
    let pages = |query: &str, args: Value, list: &str| -> (Vec<Value>, usize) {
        let mut items = Vec::new();
        let mut args = args;
        let mut n = 0;
        loop {
            let out = s.call(&owner(), query, args.clone()).expect(query);
            let bytes = serde_json::to_vec(&out).expect("json").len() as u64;
            let bound = args["max_tokens"].as_u64().unwrap_or(DEFAULT_MAX_TOKENS);
            assert!(
                bytes / 4 <= bound,
                "{query} page of {bytes} bytes past {bound} tokens"
            );
            assert_eq!(out["tokens"].as_u64(), Some(bytes.div_ceil(4)), "{query}");
            items.extend(out[list].as_array().expect("list").iter().cloned());
            n += 1;
            match out["next_cursor"].as_str() {
                Some(c) => args["cursor"] = json!(c),
                None => return (items, n),
            }
        }
    };
    let (nodes, n) = pages("list_nodes", json!({"max_tokens": 1000}), "nodes");
    let got: Vec<&str> = nodes.iter().filter_map(|x| x["id"].as_str()).collect();
    assert_eq!(got, ids.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(n > 5, "{n} pages");
    let (dag, n) = pages("dag", json!({"max_tokens": 1500}), "nodes");
    assert_eq!(dag.len(), ids.len());
    assert!(n > 3, "{n} pages");
    let (log, _) = pages("log", json!({"max_tokens": 800, "limit": 1000}), "actions");
    let all = s
        .call(
            &owner(),
            "log",
            json!({"limit": 1000, "max_tokens": 1_000_000}),
        )
        .expect("log");
    assert!(all.get("next_cursor").is_none());
    assert_eq!(&log, all["actions"].as_array().expect("actions"));
    // The default bound holds however much is asked for.
    let big = s
        .call(&owner(), "list_nodes", json!({"limit": 100000}))
        .expect("list");
    assert!(
        big["tokens"].as_u64() <= Some(DEFAULT_MAX_TOKENS),
        "{}",
        big["tokens"]
    );
    assert!(
        big["next_cursor"].is_string() || big["nodes"].as_array().map(Vec::len) == Some(ids.len())
    );
    // The summary view: the study in counts, the frontier paged.
    let sm = s
        .call(&owner(), "dag", json!({"view": "summary"}))
        .expect("summary");
    assert_eq!(sm["summary"]["nodes"], json!(ids.len()));
    assert_eq!(sm["summary"]["by_status"]["open"], json!(ids.len()));
    assert_eq!(sm["summary"]["edges"], json!(ids.len() - 1));
    assert!(sm["tokens"].as_u64() <= Some(1000), "{}", sm["tokens"]);
    assert!(sm["next_cursor"].is_string(), "the frontier pages");
    // A cursor only pages the query that returned it.
    let first = s
        .call(&owner(), "list_nodes", json!({"max_tokens": 1000}))
        .expect("list");
    let c = first["next_cursor"].as_str().expect("cursor");
    let before = git_state(&root);
    let e = s
        .call(&owner(), "log", json!({"cursor": c}))
        .expect_err("cursor of another query");
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert!(e.message.contains("not log"), "{}", e.message);
    let e = s
        .call(
            &owner(),
            "list_nodes",
            json!({"cursor": c, "status": "concluded"}),
        )
        .expect_err("cursor of another filter");
    assert!(e.message.contains("another query"), "{}", e.message);
    let e = s
        .call(&owner(), "dag", json!({"cursor": "nonsense"}))
        .expect_err("not a cursor");
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert!(e.message.contains("cursor"), "{}", e.message);
    assert_eq!(git_state(&root), before);
    // An action recorded between two pages of the log (newest first) neither repeats nor skips
    // one: the cursor holds the last action given, not a count.
    let first = s
        .call(&owner(), "log", json!({"max_tokens": 800, "limit": 1000}))
        .expect("log");
    let given = first["actions"].as_array().expect("actions").len();
    branch(&s, &["n0"], "recorded between two pages");
    let second = s
        .call(
            &owner(),
            "log",
            json!({"max_tokens": 800, "limit": 1000, "cursor": first["next_cursor"]}),
        )
        .expect("next page");
    assert_eq!(
        second["actions"][0], all["actions"][given],
        "the page after the first starts where it stopped"
    );
}

/// A job with two threads computes each batch in two pieces (the embedded trainer): the run says
/// so, and its reproduction on a machine that gives jobs one thread sums the same pieces to the
/// identical checkpoint.
#[test]
fn a_run_computed_in_pieces_reproduces_identically_with_fewer_threads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("study");
    init::init(&root, Some("tiny-arith")).expect("init");
    let config = std::fs::read_to_string(root.join("rsim.toml")).expect("config");
    let threads = |n: u32| {
        config.replace(
            "[backend]\n",
            &format!("[backend]\nthreads_per_job = {n}\n"),
        )
    };
    crate::common::commit_config(&root, &threads(2), "two threads a job");
    let s = open(&root);
    let n = branch(&s, &["n0"], "two pieces a batch");
    s.call(&owner(), "register_dataset", json!({"node": n, "name": "rev", "source": {"kind": "arith", "op": "add", "digits": 3, "format": "reversed", "n": 2000, "seed": 3}})).expect("register");
    let sft = s
        .call(&owner(), "run_sft", json!({"node": n, "base": "base", "datasets": ["rev"], "learning_rate": 0.003, "steps": 30, "batch_size": 16, "seed": 7}))
        .expect("sft");
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let pieces = if cores >= 2 { Some(2.0) } else { None };
    assert_eq!(sft["train_metrics"]["shards"].as_f64(), pieces, "{sft}");
    let ck = sft["checkpoint"].as_str().expect("checkpoint").to_string();
    let seq = s
        .call(&owner(), "get_job", json!({"job": sft["job"]["id"]}))
        .expect("job")["seq"]
        .as_u64()
        .expect("seq");
    drop(s);
    crate::common::commit_config(&root, &threads(1), "one thread a job");
    let s = open(&root);
    let r = s
        .call(&owner(), "reproduce", json!({"node": n, "seq": seq}))
        .expect("reproduce");
    assert_eq!(r["job"]["threads"], 1, "{r}");
    assert_eq!(r["identical"], true, "{r}");
    assert_eq!(r["checkpoint"].as_str(), Some(ck.as_str()));
}

#[test]
fn reproduce_re_runs_a_recorded_run_sft_to_the_identical_checkpoint() {
    let (_d, root) = new_study();
    let s = open(&root);
    let n = branch(&s, &["n0"], "plain data");
    let sha = s.call(&owner(), "register_dataset", json!({"node": n, "name": "plain", "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 2000, "seed": 3}})).expect("register")["sha256"].as_str().expect("sha").to_string();
    let sft = s
        .call(&owner(), "run_sft", json!({"node": n, "base": "base", "datasets": ["plain"], "learning_rate": 0.001, "steps": 30, "batch_size": 16, "seed": 7}))
        .expect("sft");
    let ck = sft["checkpoint"].as_str().expect("checkpoint").to_string();
    let seq = s
        .call(&owner(), "get_job", json!({"job": sft["job"]["id"]}))
        .expect("job")["seq"]
        .as_u64()
        .expect("seq");
    let dev = s
        .call(
            &owner(),
            "evaluate",
            json!({"node": n, "checkpoint": ck, "task": "add2", "split": "dev"}),
        )
        .expect("eval");

    // The owner and a reviewer reproduce it: the identical checkpoint, the same numbers.
    let reviewer = Caller::new("rev", Role::Reviewer);
    for who in [owner(), reviewer.clone()] {
        let r = s
            .call(&who, "reproduce", json!({"node": n, "seq": seq}))
            .expect("reproduce");
        assert_eq!(r["identical"], true, "{r}");
        assert_eq!(r["checkpoint"].as_str(), Some(ck.as_str()));
        assert_eq!(r["recorded_checkpoint"].as_str(), Some(ck.as_str()));
        assert_eq!(r["env_changed"], false);
        assert_eq!(r["job"]["state"], "succeeded");
        let metrics = r["train_metrics"].as_array().expect("metrics");
        assert!(!metrics.is_empty());
        for m in metrics {
            assert_eq!(m["difference"].as_f64(), Some(0.0), "{m}");
        }
    }
    // The dev evaluation reproduces too: every score identical, and not a second node metric.
    let eval_seq = s
        .call(&owner(), "get_job", json!({"job": dev["job"]["id"]}))
        .expect("job")["seq"]
        .as_u64()
        .expect("seq");
    let metrics_before = s
        .call(&owner(), "get_node", json!({"node": n}))
        .expect("node")["metrics"]
        .clone();
    let r = s
        .call(&reviewer, "reproduce", json!({"node": n, "seq": eval_seq}))
        .expect("reproduce the evaluation");
    assert_eq!(
        (r["identical"].as_bool(), r["action"].as_str()),
        (Some(true), Some("evaluate")),
        "{r}"
    );
    assert_eq!(r["recorded_checkpoint"].as_str(), Some(ck.as_str()));
    let em = r["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .find(|m| m["name"] == "exact_match")
        .expect("exact_match")
        .clone();
    assert_eq!(em["reproduced"], dev["metrics"]["exact_match"], "{r}");
    assert_eq!(em["difference"].as_f64(), Some(0.0));
    assert_eq!(
        s.call(&owner(), "get_node", json!({"node": n}))
            .expect("node")["metrics"],
        metrics_before
    );
    // A test evaluation is not re-run (it would spend the node's limited test evaluations).
    let test = s
        .call(
            &owner(),
            "evaluate",
            json!({"node": n, "checkpoint": ck, "task": "add2", "split": "test"}),
        )
        .expect("test eval");
    let test_seq = s
        .call(&owner(), "get_job", json!({"job": test["job"]["id"]}))
        .expect("job")["seq"]
        .as_u64()
        .expect("seq");
    let e = s
        .call(&owner(), "reproduce", json!({"node": n, "seq": test_seq}))
        .expect_err("test split");
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert!(e.message.contains("test"), "{}", e.message);
    // It is recorded as its own action, with its job (counted against budgets like any job).
    let log = s
        .call(&owner(), "log", json!({"node": n, "limit": 3}))
        .expect("log");
    assert!(
        log["actions"]
            .as_array()
            .expect("actions")
            .iter()
            .any(|a| a["action"] == "reproduce" && a["agent"] == "rev" && a["job"].is_string()),
        "{log}"
    );
    // A worker may not reproduce: a recorded refusal by rule role.
    let e = s
        .call(
            &Caller::new("w", Role::Worker),
            "reproduce",
            json!({"node": n, "seq": seq}),
        )
        .expect_err("worker");
    assert_eq!(e.rule.as_deref(), Some("role"), "{}", e.message);
    // A concluded node's runs can still be reproduced (the outcome is recorded on it).
    s.call(
        &owner(),
        "conclude",
        json!({"node": n, "outcome": "positive", "findings": "trained"}),
    )
    .expect("conclude");
    let r = s
        .call(&reviewer, "reproduce", json!({"node": n, "seq": seq}))
        .expect("reproduce a concluded node's run");
    assert_eq!(r["identical"], true, "{r}");

    // Bad input: clear errors, nothing written.
    let before = git_state(&root);
    for (args, kind, says) in [
        (
            json!({"node": n, "seq": 1}),
            ErrorKind::Invalid,
            "runs no training",
        ),
        (
            json!({"node": "n0", "seq": 1}),
            ErrorKind::Invalid,
            "runs no training",
        ),
        (
            json!({"node": n, "seq": 99}),
            ErrorKind::NotFound,
            "no action 99",
        ),
        (json!({"node": "n77", "seq": 1}), ErrorKind::NotFound, "n77"),
    ] {
        let e = s
            .call(&owner(), "reproduce", args.clone())
            .expect_err("bad input");
        assert_eq!(e.kind, kind, "{args}: {}", e.message);
        assert!(e.message.contains(says), "{args}: {}", e.message);
    }
    assert_eq!(git_state(&root), before);

    // Tampered input: the dataset's object changed after registration — refused and named.
    let obj = s.store().path(&sha);
    let mut perms = std::fs::metadata(&obj).expect("meta").permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&obj, perms).expect("chmod");
    std::fs::write(&obj, b"{\"prompt\":\"1+1=\",\"answer\":\"2\"}\n").expect("tamper");
    let e = s
        .call(&owner(), "reproduce", json!({"node": n, "seq": seq}))
        .expect_err("tampered");
    assert_eq!(
        e.rule.as_deref(),
        Some("dataset-integrity"),
        "{}",
        e.message
    );
    assert!(e.message.contains("plain"), "{}", e.message);
    // Garbage-collected: the object is gone.
    std::fs::remove_file(&obj).expect("gc");
    let e = s
        .call(&owner(), "reproduce", json!({"node": n, "seq": seq}))
        .expect_err("missing");
    assert_eq!(
        e.rule.as_deref(),
        Some("dataset-integrity"),
        "{}",
        e.message
    );
}

#[test]
fn the_second_task_family_is_two_digit_addition_on_the_same_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("study");
    init::init(&root, Some("tiny-add2")).expect("init");
    let s = open(&root);
    assert_eq!(
        s.config().tasks.keys().cloned().collect::<Vec<_>>(),
        ["add2"]
    );
    let base = s.base_checkpoint().expect("base");
    let dev = s
        .call(
            &owner(),
            "evaluate",
            json!({"node": "n0", "checkpoint": base, "task": "add2", "split": "dev"}),
        )
        .expect("eval");
    assert_eq!(dev["job"]["state"], "succeeded", "{dev}");
    assert_eq!(dev["n_items"], 200);
    // Two-digit problems, every one of them.
    let items = dev["items"].as_array().expect("items");
    assert!(
        items.iter().all(|i| {
            let p = i["prompt"].as_str().unwrap_or("");
            p.split(['+', '='])
                .filter(|x| !x.is_empty())
                .all(|x| x.len() <= 2)
        }),
        "{items:?}"
    );
    // The same base model as tiny-arith.
    let other = tempfile::tempdir().expect("tempdir");
    init::init(&other.path().join("s"), Some("tiny-arith")).expect("init");
    assert_eq!(
        open(&other.path().join("s"))
            .base_checkpoint()
            .expect("base"),
        base
    );
}

/// What the generator draws passes the gate its dataset gets: for every arithmetic family in
/// every answer format, a generated dataset is registered, not refused. The gate reads across
/// adjacent rows, so the generator must leave out a draw that reproduces a protected item beside
/// the row before it, not only on its own (tiny-diff2's reversed `…=r02-` then `98-0=…` reads as
/// the protected `2-98`, and such datasets were refused).
#[test]
fn every_familys_generated_data_in_every_format_passes_the_gate() {
    for &(family, op, digits) in init::ARITH_FAMILIES {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("study");
        init::init(&root, Some(family)).expect("init");
        let s = open(&root);
        let n = branch(&s, &["n0"], "generated data");
        for format in ["plain", "reversed", "scratchpad"] {
            let r = s.call(
                &owner(),
                "register_dataset",
                json!({"node": n, "name": format!("g-{format}"), "source": {"kind": "arith",
                    "op": op, "digits": digits, "format": format, "n": 2000, "seed": 1}}),
            );
            if let Err(e) = r {
                panic!("{family} {format}: {}", e.message);
            }
        }
    }
}
