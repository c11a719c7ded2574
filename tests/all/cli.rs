//! The CLI face, the schema files, and crash safety (kill -9 of real writer processes).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{example_study, fsck_clean, ok_json, rsim, run};

#[test]
fn schemas_directory_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
    let mut stale = Vec::new();
    for (rel, text) in rsi_master::os::schemas::all_schema_files() {
        if std::fs::read_to_string(dir.join(&rel)).ok().as_deref() != Some(text.as_str()) {
            stale.push(rel);
        }
    }
    assert!(
        stale.is_empty(),
        "schemas/ is stale ({stale:?}): run `cargo run -- schemas` and commit"
    );
    // And the CLI check agrees.
    let out = rsim()
        .args(["schemas", "--check", "--out"])
        .arg(&dir)
        .output()
        .expect("schemas");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn cli_commands_exit_codes_and_output() {
    let (_d, s) = example_study();
    let b = ok_json(&s, &["branch", "--from", "n0", "--title", "Plain data"]);
    assert_eq!(b["node"], "n1");
    // Human output goes to stdout, errors to stderr with a meaningful exit code.
    let out = run(&s, &["branch", "--from", "n0", "--title", "bad\u{1b}[31m"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("title"));
    let out = run(&s, &["show", "n9"]);
    assert_eq!(out.status.code(), Some(3), "unknown node");
    let out = run(
        &s,
        &[
            "evaluate",
            "--node",
            "n1",
            "--checkpoint",
            &"0".repeat(64),
            "--task",
            "add2",
        ],
    );
    assert_eq!(out.status.code(), Some(4), "policy rejection");
    assert!(String::from_utf8_lossy(&out.stderr).contains("checkpoint-provenance"));
    let out = run(&s, &["--role", "overlord", "log"]);
    assert_eq!(out.status.code(), Some(2));
    // `rsim call ACTION -` reads the same JSON an MCP client sends.
    let mut child = rsim()
        .arg("-C")
        .arg(&s)
        .args(["call", "register_dataset", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    {
        use std::io::Write;
        let req = json!({"node": "n1", "name": "plain", "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 2000, "seed": 1}});
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(req.to_string().as_bytes())
            .expect("write");
    }
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success());
    let reg: Value = serde_json::from_slice(&out.stdout).expect("json");
    // Exactly the rows asked for: draws that hit test items are replaced, and how many were is
    // never told (it would say which generated rows are test items).
    assert_eq!(reg["rows"].as_u64().expect("rows"), 2000);
    assert!(reg.get("decontaminated").is_none(), "{reg}");
    let sft = ok_json(
        &s,
        &[
            "run-sft",
            "--node",
            "n1",
            "--dataset",
            "plain",
            "--steps",
            "20",
            "--batch-size",
            "16",
        ],
    );
    assert_eq!(sft["job"]["state"], "succeeded");
    let ck = sft["checkpoint"].as_str().expect("ck").to_string();
    let ev = ok_json(
        &s,
        &[
            "evaluate",
            "--node",
            "n1",
            "--checkpoint",
            &ck,
            "--task",
            "add2",
        ],
    );
    assert!(ev["metrics"]["exact_match"].as_f64().is_some());
    // The GPU recipes take exactly the job specs the runner wrote for these jobs.
    let recipes = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/recipes");
    for (job, recipe) in [(&sft["job"]["id"], "sft.py"), (&ev["job"]["id"], "eval.py")] {
        let spec = s
            .join(".rsim/jobs")
            .join(job.as_str().expect("job id"))
            .join("spec.json");
        let out = Command::new("python3")
            .arg(recipes.join(recipe))
            .arg("--check-spec")
            .arg(&spec)
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{recipe}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "spec ok");
    }
    let sft_spec = s
        .join(".rsim/jobs")
        .join(sft["job"]["id"].as_str().expect("job id"))
        .join("spec.json");
    recipes_read_exactly_the_job_protocol(&recipes, &sft_spec);
    ok_json(&s, &["branch", "--from", "n0", "--title", "Other"]);
    let cmp = ok_json(
        &s,
        &["compare", "--node", "n0", "n1", "n2", "--task", "add2"],
    );
    assert_eq!(cmp["rows"].as_array().map(Vec::len), Some(2));
    ok_json(
        &s,
        &["branch", "--from", "n1", "--from", "n2", "--title", "Merge"],
    );
    // dag in three formats.
    let text = String::from_utf8(run(&s, &["dag"]).stdout).expect("utf8");
    assert!(
        text.contains("n3  [open]  Merge  (merge of n1 + n2)"),
        "{text}"
    );
    let dot = String::from_utf8(run(&s, &["dag", "--format", "dot"]).stdout).expect("utf8");
    assert!(dot.starts_with("digraph") && dot.contains("n1 -> n3;") && dot.contains("n2 -> n3;"));
    let dag: Value =
        serde_json::from_slice(&run(&s, &["dag", "--format", "json"]).stdout).expect("json");
    assert_eq!(dag["nodes"].as_array().map(Vec::len), Some(4));
    let fr = ok_json(&s, &["dag", "--view", "related", "--node", "n1"]);
    assert!(
        fr["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .any(|n| n["id"] == "n2" && n["relation"] == "sibling")
    );
    let log = ok_json(&s, &["log"]);
    assert!(
        log["actions"]
            .as_array()
            .expect("actions")
            .iter()
            .any(|a| a["rule"] == "checkpoint-provenance")
    );
    let show = String::from_utf8(run(&s, &["show", "n1"]).stdout).expect("utf8");
    assert!(
        show.contains("branch:     rsim/n/n1") && show.contains("exact_match"),
        "{show}"
    );
    // The record is plain git: trailers parse with git itself.
    let tr = Command::new("git")
        .arg("-C")
        .arg(&s)
        .args([
            "log",
            "-1",
            "--format=%(trailers:key=Rsim-Action,valueonly)",
            "rsim/n/n3",
        ])
        .output()
        .expect("git");
    assert_eq!(String::from_utf8_lossy(&tr.stdout).trim(), "branch");
    let out = run(&s, &["fsck"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Reindex gives the same DAG.
    let before = ok_json(&s, &["dag", "--format", "json"]);
    ok_json(&s, &["reindex"]);
    assert_eq!(ok_json(&s, &["dag", "--format", "json"]), before);
}

/// Tiny deterministic PRNG (xorshift) so a failing seed can be replayed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn answers(s: &Path) -> Vec<Value> {
    let mut v = vec![
        ok_json(s, &["dag", "--format", "json"]),
        ok_json(s, &["log", "--limit", "100000"]),
        ok_json(s, &["call", "list_nodes", r#"{"limit": 100000}"#]),
    ];
    let list = v[2]["nodes"].as_array().cloned().unwrap_or_default();
    for n in list {
        v.push(ok_json(s, &["show", n["id"].as_str().unwrap_or("n0")]));
    }
    v
}

#[test]
fn killing_writers_at_random_points_never_leaves_a_half_written_action() {
    let (_d, s) = example_study();
    let seed = std::env::var("RSIM_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_1234_u64);
    eprintln!("crash test seed {seed} (set RSIM_CRASH_SEED to replay)");
    let mut rng = Rng(seed);
    let mut nodes = vec!["n0".to_string()];
    let mut datasets: Vec<String> = Vec::new();
    let (mut killed, mut finished) = (0, 0);
    // Typical wall time of each action (learned from the runs we let finish), so that kill times
    // spread over the whole run of a writer — start-up, job, git write, index update — not just start-up.
    let mut typical: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for i in 0..100 {
        let node = nodes[rng.below(nodes.len() as u64) as usize].clone();
        let (action, args) = match i % 5 {
            0 | 3 => (
                "branch",
                json!({"parents": [node], "title": format!("direction {i}")}),
            ),
            1 => {
                let name = format!("d{i}");
                datasets.push(name.clone());
                (
                    "register_dataset",
                    json!({"node": node, "name": name, "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 300, "seed": i}}),
                )
            }
            2 if !datasets.is_empty() => {
                let d = datasets[rng.below(datasets.len() as u64) as usize].clone();
                (
                    "run_sft",
                    json!({"node": node, "base": "base", "datasets": [d], "learning_rate": 0.001, "steps": 3, "batch_size": 4, "seed": i}),
                )
            }
            _ => (
                "compare",
                json!({"node": node, "nodes": ["n0", node], "task": "add2"}),
            ),
        };
        let started = std::time::Instant::now();
        let mut child = rsim()
            .arg("-C")
            .arg(&s)
            .args(["call", action, &args.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let t = *typical.get(action).unwrap_or(&30_000);
        if rng.below(100) < 70 {
            std::thread::sleep(Duration::from_micros(t / 3 + rng.below(t)));
            if child.try_wait().expect("try_wait").is_none() {
                child.kill().expect("kill -9");
                killed += 1;
            }
            let _ = child.wait();
        } else {
            let out = child.wait_with_output().expect("wait");
            let us = started.elapsed().as_micros() as u64;
            typical
                .entry(action)
                .and_modify(|t| *t = (*t + us) / 2)
                .or_insert(us);
            if out.status.success() {
                finished += 1;
                if action == "branch"
                    && let Ok(v) = serde_json::from_slice::<Value>(&out.stdout)
                    && let Some(id) = v["node"].as_str()
                {
                    nodes.push(id.to_string());
                }
            }
        }
        if action == "branch" && i % 10 == 0 {
            // Learn about nodes created by killed-but-completed writers too.
            let list = ok_json(&s, &["call", "list_nodes", r#"{"limit": 100000}"#]);
            nodes = list["nodes"]
                .as_array()
                .expect("nodes")
                .iter()
                .filter_map(|n| n["id"].as_str().map(str::to_string))
                .collect();
        }
    }
    let recorded = ok_json(&s, &["log", "--limit", "100000"])["actions"]
        .as_array()
        .map_or(0, Vec::len);
    eprintln!("killed {killed} writers, {finished} finished unharmed, {recorded} actions recorded");
    assert!(
        killed >= 20,
        "the test must actually kill writers mid-flight"
    );
    assert!(
        recorded > finished + 1 + 5,
        "some killed writers must have got far enough to record"
    );
    // git's own check: no corruption, no missing objects.
    let fsck = Command::new("git")
        .arg("-C")
        .arg(&s)
        .args(["fsck", "--full", "--no-dangling"])
        .output()
        .expect("git fsck");
    assert!(
        fsck.status.success(),
        "git fsck: {}",
        String::from_utf8_lossy(&fsck.stderr)
    );
    let err = String::from_utf8_lossy(&fsck.stderr).to_lowercase();
    assert!(
        !err.contains("error") && !err.contains("missing") && !err.contains("broken"),
        "{err}"
    );
    // Our own check: every commit records exactly one whole action, the index agrees with git.
    let out = run(&s, &["fsck"]);
    assert!(
        out.status.success(),
        "rsim fsck: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The index rebuilt from git alone gives the same answers.
    let before = answers(&s);
    for f in ["index.sqlite", "index.sqlite-wal", "index.sqlite-shm"] {
        let _ = std::fs::remove_file(s.join(".rsim").join(f));
    }
    ok_json(&s, &["reindex"]);
    assert_eq!(answers(&s), before);
}

#[test]
fn a_job_whose_writer_dies_is_stopped_and_recorded_as_lost() {
    let (_d, s) = example_study();
    ok_json(&s, &["branch", "--from", "n0", "--title", "long job"]);
    ok_json(
        &s,
        &[
            "call",
            "register_dataset",
            r#"{"node":"n1","name":"d","source":{"kind":"arith","op":"add","digits":2,"format":"plain","n":500,"seed":1}}"#,
        ],
    );
    // A long job, then kill -9 the rsim process that runs it (not the job).
    let spawned = std::time::Instant::now();
    let mut writer = rsim()
        .arg("-C")
        .arg(&s)
        .args([
            "run-sft",
            "--node",
            "n1",
            "--dataset",
            "d",
            "--steps",
            "5000000",
            "--batch-size",
            "64",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let jobs = s.join(".rsim/jobs");
    let mut pid_file = None;
    for _ in 0..200 {
        pid_file = std::fs::read_dir(&jobs).ok().and_then(|mut d| {
            d.find_map(|e| e.ok().map(|e| e.path().join("pid")).filter(|p| p.is_file()))
        });
        if pid_file.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid_file = pid_file.expect("the job started");
    // The job dies with its writer at once, before anyone opens the study again (a study that is
    // never opened again, or is deleted, leaves nothing training on for ever).
    let (job_pid, gone) = kill_writer_and_wait_for_job(&mut writer, &pid_file);
    assert!(gone, "the job outlived the rsim that ran it");
    // Found only later (as after a night with the machine off): it is charged what it ran.
    std::thread::sleep(Duration::from_secs(3));
    // Reading records nothing; the next write (here `rsim recover`) records the action with the
    // job lost.
    ok_json(&s, &["recover"]);
    let log = ok_json(&s, &["log", "--node", "n1"]);
    let a = &log["actions"][0];
    assert_eq!(a["action"], "run_sft", "{log}");
    assert_eq!(
        a["summary"].as_str().map(|x| x.contains("lost")),
        Some(true),
        "{a}"
    );
    let job = ok_json(
        &s,
        &[
            "call",
            "get_job",
            &format!(r#"{{"job":"{}"}}"#, a["job"].as_str().expect("job")),
        ],
    );
    assert_eq!(job["job"]["state"], "lost");
    let charged = job["job"]["duration_s"].as_f64().expect("duration_s");
    let until_found = spawned.elapsed().as_secs_f64();
    // (A job killed within milliseconds of its start may be charged 0: file times are kept at
    // the kernel's tick, coarser than the clock its start was read from.)
    assert!(
        charged >= 0.0 && charged < until_found - 2.5,
        "a lost job is charged until its last sign of life, not until it was found: \
         {charged} s of {until_found} s"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(!alive(job_pid), "nothing left running");
    // Recorded once: opening again adds nothing.
    let again = ok_json(&s, &["log", "--node", "n1"]);
    assert_eq!(
        again["actions"].as_array().map(Vec::len),
        log["actions"].as_array().map(Vec::len)
    );
    let out = run(&s, &["fsck"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `rsim bench-train` runs real training ladders through the actions and reports what it measured:
/// the studies it leaves behind hold the runs and scores it reports, and bad settings are refused.
#[test]
fn bench_train_reports_what_the_recorded_runs_measured() {
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().join("bench");
    let out = rsim()
        .args([
            "--json",
            "bench-train",
            "--format",
            "plain",
            "--seeds",
            "1",
            "--budgets",
            "6,3",
            "--rows",
            "200",
            "--target",
            "0.99",
        ])
        .arg("--dir")
        .arg(&dir)
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let ladder = &v["ladders"][0];
    let runs = ladder["runs"].as_array().expect("runs");
    // Budgets are tried in increasing order; a 6-step model does not reach 99%, so both ran and
    // only the last one was scored on test.
    assert_eq!(runs.len(), 2, "{v}");
    assert_eq!(runs[0]["steps"], 3);
    assert_eq!(runs[1]["steps"], 6);
    assert!(runs[0].get("test").is_none());
    assert_eq!(ladder["to_target_s"], serde_json::Value::Null);
    assert_eq!(v["formats"][0]["reached"], 0);
    assert_eq!(v["job_start_s_runs"].as_array().map(Vec::len), Some(5));
    for r in runs {
        assert!(r["steps_per_s"].as_f64().is_some_and(|x| x > 0.0), "{r}");
        assert!(r["tokens_per_s"].as_f64().is_some_and(|x| x > 0.0), "{r}");
    }
    // The figures are the record's: the last run's test score is the one committed on its node.
    let study = dir.join("plain-0");
    let node = runs[1]["node"].as_str().expect("node");
    let shown = ok_json(&study, &["show", node]);
    let text = shown.to_string();
    let test = runs[1]["test"].as_f64().expect("test score");
    assert!(
        text.contains(&format!("{test}")),
        "node {node} does not show test {test}: {text}"
    );
    fsck_clean(&study);

    let bad = rsim()
        .args(["bench-train", "--budgets", "0", "--dir"])
        .arg(d.path().join("bad"))
        .output()
        .expect("spawn");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("budget"));
    let bad = rsim()
        .args(["bench-train", "--target", "1.5", "--dir"])
        .arg(d.path().join("bad"))
        .output()
        .expect("spawn");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--target 1.5"));
    assert!(
        !d.path().join("bad").exists(),
        "a refused benchmark created nothing"
    );
}

/// The recipes check a spec against exactly the fields of the published job protocol
/// (`schemas/jobs/spec.json`): the spec rsim wrote carries only those, and a spec with a field
/// more (an agent request's `node` in `hyper`) or less is refused before any training.
fn recipes_read_exactly_the_job_protocol(recipes: &Path, sft_spec: &Path) {
    let schema = rsi_master::os::schemas::all_schema_files()
        .into_iter()
        .find(|(rel, _)| rel == "jobs/spec.json")
        .map(|(_, text)| serde_json::from_str::<Value>(&text).expect("schema"))
        .expect("the job spec schema is published");
    let keys = |v: &Value| -> Vec<String> {
        let mut k: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
        k.sort();
        k
    };
    let props = |v: &Value| keys(&v["properties"]);
    let mut want = serde_json::Map::new();
    for variant in schema["oneOf"].as_array().expect("oneOf") {
        let kind = variant["properties"]["kind"]["const"]
            .as_str()
            .expect("kind");
        want.insert(kind.into(), json!(props(variant)));
    }
    for (key, def) in [
        ("hyper", "TrainHyper"),
        ("checkpoint", "CheckpointRef"),
        ("dataset", "DatasetRef"),
    ] {
        want.insert(key.into(), json!(props(&schema["$defs"][def])));
    }
    let out = Command::new("python3")
        .current_dir(recipes)
        .args([
            "-c",
            "import common, json; print(json.dumps({**{k: sorted(v) for k, v in common.SPEC_FIELDS.items()}, \
             'hyper': sorted(common.HYPER_FIELDS), 'checkpoint': sorted(common.CHECKPOINT_FIELDS), \
             'dataset': sorted(common.DATASET_FIELDS)}))",
        ])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        got,
        Value::Object(want),
        "common.py and schemas/jobs/spec.json disagree"
    );

    let spec: Value =
        serde_json::from_slice(&std::fs::read(sft_spec).expect("spec")).expect("json");
    assert_eq!(
        json!(keys(&spec)),
        got["sft"],
        "rsim writes exactly the protocol's fields"
    );
    assert_eq!(
        json!(keys(&spec["hyper"])),
        got["hyper"],
        "no request fields in hyper"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let check = |mutate: &dyn Fn(&mut Value), why: &str| {
        let mut bad = spec.clone();
        mutate(&mut bad);
        let p = dir.path().join("spec.json");
        std::fs::write(&p, bad.to_string()).expect("write");
        let out = Command::new("python3")
            .arg(recipes.join("sft.py"))
            .arg("--check-spec")
            .arg(&p)
            .output()
            .expect("python3");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{why}: accepted");
        assert!(err.contains(why), "{why}: {err}");
    };
    check(
        &|v| v["hyper"]["node"] = json!("n1"),
        "unknown field 'node'",
    );
    check(
        &|v| {
            v["hyper"].as_object_mut().expect("hyper").remove("seed");
        },
        "hyper has no 'seed'",
    );
    check(&|v| v["hyper"]["steps"] = json!(0), "hyper steps must be");
    check(
        &|v| v["kind"] = json!("evaluate"),
        "expected a 'sft' job spec",
    );
}

/// `rsim bench` (the record's benchmark) runs end to end at a small size and reports what it
/// measured, the commit signature's cost included.
#[test]
fn the_record_benchmark_runs_and_reports_its_figures() {
    let d = tempfile::tempdir().expect("tempdir");
    let out = rsim()
        .args([
            "bench",
            "--json",
            "--nodes",
            "30",
            "--actions",
            "9",
            "--repeat",
            "1",
            "--dir",
        ])
        .arg(d.path())
        .output()
        .expect("rsim bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["actions_timed"], 9);
    assert_eq!(v["nodes"], 30);
    for k in [
        "action_ms_median",
        "sign_us_median",
        "verify_us_median",
        "dag_ms_median",
    ] {
        assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k}: {v}");
    }
    // Where an action's time goes: the write phases, each with its own time per action.
    let phases = v["phases"].as_array().expect("phases");
    for name in ["git.pack", "index.sync", "git.sign", "validate"] {
        let p = phases.iter().find(|p| p["name"] == name);
        assert!(
            p.is_some_and(|p| p["us_per_action"].as_f64().is_some_and(|x| x > 0.0)),
            "{name} in {phases:?}"
        );
    }
    // Answer sizes an agent gets: bounded answers stay within the default bound.
    let answers = v["answers"].as_array().expect("answers");
    assert!(answers.len() >= 5, "{v}");
    for a in answers {
        if !a["query"].as_str().is_some_and(|q| q.contains("unbounded")) {
            assert!(a["tokens"].as_u64() <= Some(8000), "{a}");
        }
    }
}

/// `rsim bench --big-requests`: listing three actions of 15 MB inline rows each costs a query
/// process less memory than one of them (each record is read alone, its rows skipped): holding the
/// listed records whole, as before, costs at least all three.
#[test]
fn listing_actions_with_large_requests_holds_at_most_one_of_them() {
    let d = tempfile::tempdir().expect("tempdir");
    let out = rsim()
        .args([
            "bench",
            "--json",
            "--big-requests",
            "3",
            "--repeat",
            "1",
            "--dir",
        ])
        .arg(d.path())
        .output()
        .expect("rsim bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let size = v["request_mib"].as_f64().expect("request size");
    assert!(size > 14.0, "{v}");
    let peak = |q: &str| -> f64 {
        v["queries"]
            .as_array()
            .and_then(|qs| qs.iter().find(|x| x["query"] == q))
            .and_then(|x| x["peak_mib"].as_f64())
            .unwrap_or_else(|| panic!("{q} in {v}"))
    };
    let floor = peak("list_nodes");
    for q in ["log", "get_node"] {
        assert!(
            peak(q) - floor < 1.5 * size,
            "{q} held {:.1} MiB over a query that reads no action, for three requests of {size:.1} MiB: {v}",
            peak(q) - floor
        );
    }
}

#[test]
fn diff_reproduce_and_paged_answers_from_the_cli() {
    let (_d, s) = example_study();
    ok_json(&s, &["branch", "--from", "n0", "--title", "A"]);
    ok_json(&s, &["branch", "--from", "n0", "--title", "B"]);
    ok_json(
        &s,
        &[
            "call",
            "register_dataset",
            r#"{"node":"n1","name":"plain","source":{"kind":"arith","op":"add","digits":2,"format":"plain","n":500,"seed":1}}"#,
        ],
    );
    for (node, lr) in [("n1", "0.001"), ("n2", "0.002")] {
        ok_json(
            &s,
            &[
                "run-sft",
                "--node",
                node,
                "--base",
                "base",
                "--dataset",
                "plain",
                "--lr",
                lr,
                "--steps",
                "10",
                "--batch-size",
                "8",
                "--seed",
                "1",
            ],
        );
    }
    let d = ok_json(&s, &["diff", "n1", "n2"]);
    assert!(
        d["params"]
            .as_array()
            .expect("params")
            .iter()
            .any(|p| p["key"] == "learning_rate"),
        "{d}"
    );
    let out = run(&s, &["diff", "n1", "n2"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("learning_rate"));
    let out = run(&s, &["diff", "n1", "n1"]);
    assert_eq!(out.status.code(), Some(2), "diff of a node with itself");
    // reproduce: every run_sft of n1, the identical checkpoint; exit 0.
    let r = ok_json(&s, &["reproduce", "n1"]);
    assert_eq!(r[0]["identical"], true, "{r}");
    let out = run(&s, &["reproduce", "n1", "--action", "1"]);
    assert_eq!(out.status.code(), Some(2), "a branch is no run_sft");
    let out = run(&s, &["--role", "worker", "reproduce", "n1"]);
    assert_eq!(out.status.code(), Some(4), "workers may not reproduce");
    // Paged answers: a cursor for the next page, refused by another query.
    let page = ok_json(&s, &["log", "--max-tokens", "200"]);
    let c = page["next_cursor"].as_str().expect("cursor").to_string();
    let next = ok_json(&s, &["log", "--max-tokens", "200", "--cursor", &c]);
    assert_ne!(next["actions"][0], page["actions"][0]);
    let out = run(&s, &["dag", "--json", "--cursor", &c]);
    assert_eq!(out.status.code(), Some(2), "a log cursor given to dag");
    let sm = ok_json(&s, &["dag", "--view", "summary"]);
    assert_eq!(sm["summary"]["nodes"], 3);
    let out = run(&s, &["dag", "--view", "summary"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("frontier"));
}

/// After `rsim init` the work tree is clean in git's eyes, so the owner changes the config with
/// plain `git commit -am` — only `rsim.toml` changes on main, nothing else is removed (before,
/// git's index was empty and the commit removed every other file, and rsim then refused the
/// study) — and rsim serves with the new config.
#[test]
fn the_owner_commits_a_config_change_with_plain_git() {
    let (_d, study) = crate::common::example_study();
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(&study)
            .args([
                "-c",
                "user.name=owner",
                "-c",
                "user.email=owner@example.invalid",
            ])
            .args(args)
            .output()
            .expect("git");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(
        git(&["status", "--porcelain"]),
        "",
        "a fresh study is clean"
    );
    let text = std::fs::read_to_string(study.join("rsim.toml")).expect("config");
    std::fs::write(
        study.join("rsim.toml"),
        format!("{text}\n[server]\nmax_sessions = 7\n"),
    )
    .expect("write");
    git(&["commit", "-q", "-am", "fewer sessions"]);
    assert_eq!(
        git(&["show", "--name-status", "--format=", "HEAD"]).trim(),
        "M\trsim.toml"
    );
    // verify names it as the owner's word, with what it changed.
    let v = ok_json(&study, &["verify"]);
    assert_eq!(v["unsigned_owner_commits"], 1, "{v}");
    assert_eq!(
        v["owner_changes"],
        json!([["rsim.toml: server.max_sessions: (unset) → 7"]]),
        "{v}"
    );
    // A pushed change to an eval set and to the config's policy reads the same way.
    std::fs::write(study.join("extra.txt"), "x").expect("write");
    git(&["add", "extra.txt"]);
    let text = std::fs::read_to_string(study.join("rsim.toml")).expect("config");
    std::fs::write(
        study.join("rsim.toml"),
        text.replace("max_sessions = 7", "max_sessions = 9"),
    )
    .expect("write");
    git(&["commit", "-q", "-am", "more"]);
    let out = run(&study, &["verify"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("      extra.txt: added\n      rsim.toml: server.max_sessions: 7 → 9\n"),
        "{said}"
    );
    let out = rsim()
        .arg("-C")
        .arg(&study)
        .args(["serve", "--http", "127.0.0.1:0"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve");
    let mut child = out;
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stderr.take().expect("stderr")),
        &mut line,
    )
    .expect("read");
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.starts_with("rsim: listening on"), "{line}");
}

/// A reproduction is a job like any other: kill -9 the rsim that runs it, and the job dies with
/// it; the next rsim to open the study records the reproduce action once, its job lost, and says
/// nothing was reproduced.
#[test]
fn a_reproduction_whose_writer_dies_is_stopped_and_recorded_as_lost() {
    let (_d, s) = example_study();
    ok_json(&s, &["branch", "--from", "n0", "--title", "to reproduce"]);
    ok_json(
        &s,
        &[
            "call",
            "register_dataset",
            r#"{"node":"n1","name":"d","source":{"kind":"arith","op":"add","digits":2,"format":"plain","n":500,"seed":1}}"#,
        ],
    );
    // A run long enough (seconds: the n-gram model takes ~1 ms a step) that its reproduction is
    // killed part-way (within 25 ms of its job's start); it runs three times in this test.
    let sft = ok_json(
        &s,
        &[
            "run-sft",
            "--node",
            "n1",
            "--dataset",
            "d",
            "--steps",
            "5000",
            "--batch-size",
            "64",
        ],
    );
    assert!(sft["checkpoint"].is_string(), "{sft}");
    let jobs = s.join(".rsim/jobs");
    let before: Vec<_> = std::fs::read_dir(&jobs)
        .expect("jobs")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    let mut writer = rsim()
        .arg("-C")
        .arg(&s)
        .args(["reproduce", "n1", "--action", "3"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut pid_file = None;
    // A generous deadline: on two busy cores a fresh process takes a while to open, check and
    // admit the job; the test is about what happens after it started.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        pid_file = std::fs::read_dir(&jobs).ok().and_then(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| !before.contains(p))
                .map(|p| p.join("pid"))
                .find(|p| p.is_file())
        });
        if pid_file.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let pid_file = pid_file.expect("the reproduction's job started");
    let (_, gone) = kill_writer_and_wait_for_job(&mut writer, &pid_file);
    assert!(gone, "the reproduction's job outlived the rsim that ran it");
    // The next write records it: a reproduce action whose job was lost.
    ok_json(&s, &["recover"]);
    let log = ok_json(&s, &["log", "--node", "n1"]);
    let a = &log["actions"][0];
    assert_eq!(a["action"], "reproduce", "{log}");
    assert!(
        a["summary"].as_str().is_some_and(|x| x.contains("lost")),
        "{a}"
    );
    let job = ok_json(
        &s,
        &[
            "call",
            "get_job",
            &format!(r#"{{"job":"{}"}}"#, a["job"].as_str().expect("job")),
        ],
    );
    assert_eq!(job["job"]["state"], "lost", "{job}");
    let again = ok_json(&s, &["log", "--node", "n1"]);
    assert_eq!(
        again["actions"].as_array().map(Vec::len),
        log["actions"].as_array().map(Vec::len),
        "recorded once"
    );
    // The original run stands, and can still be reproduced.
    let r = ok_json(&s, &["reproduce", "n1", "--action", "3"]);
    assert_eq!(r[0]["identical"], true, "{r}");
    let out = run(&s, &["fsck"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// kill -9 a writing rsim, then wait up to 5 s for the job it ran (its pid in `pid_file`) to be
/// gone: the job's pid, and whether it went.
fn kill_writer_and_wait_for_job(writer: &mut std::process::Child, pid_file: &Path) -> (i32, bool) {
    writer.kill().expect("kill -9 the writer");
    writer.wait().expect("wait");
    // `pid boot start`: the job's process as this machine knows it.
    let job_pid: i32 = std::fs::read_to_string(pid_file)
        .expect("pid")
        .split_whitespace()
        .next()
        .unwrap_or("")
        .parse()
        .expect("pid");
    for _ in 0..100 {
        if !alive(job_pid) {
            return (job_pid, true);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (job_pid, false)
}

/// Whether a process runs (a zombie does not).
fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// `rsim init --generator-secret HEX` gives a new study that secret: two studies given one draw
/// the same rows for the same generator request (campaigns on them are paired on their data), a
/// study without it draws its own, and a malformed secret is refused before anything is written.
#[test]
fn studies_initialised_with_one_generator_secret_draw_the_same_rows() {
    let d = tempfile::tempdir().expect("tempdir");
    let secret = "00112233445566778899aabbccddeeff";
    let init = |name: &str, secret: Option<&str>| {
        let mut c = rsim();
        c.arg("init")
            .arg(d.path().join(name))
            .args(["--example", "tiny-arith-ngram"]);
        if let Some(s) = secret {
            c.args(["--generator-secret", s]);
        }
        c.output().expect("init")
    };
    for bad in ["xyz", "00112233445566778899aabbccddeefg", "00112233"] {
        let out = init("bad", Some(bad));
        assert!(!out.status.success(), "{bad} was taken");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("32 hexadecimal digits"), "{err}");
        assert!(
            !d.path().join("bad").exists(),
            "{bad}: a study was left behind"
        );
    }
    for (name, s) in [("a", Some(secret)), ("b", Some(secret)), ("c", None)] {
        let out = init(name, s);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let rows = |name: &str| {
        let v = ok_json(
            &d.path().join(name),
            &[
                "call",
                "register_dataset",
                r#"{"node": "n0", "name": "p", "source": {"kind": "arith", "op": "add",
                    "digits": 2, "format": "plain", "n": 300, "seed": 5}}"#,
            ],
        );
        v["sha256"].as_str().expect("sha256").to_string()
    };
    let (a, b, c) = (rows("a"), rows("b"), rows("c"));
    assert_eq!(a, b, "one secret, one request: the same rows");
    assert_ne!(a, c, "a study's own secret draws other rows");
}

/// `tools/trial-rule.py` applies a trial's rule as TRIAL-*.md write it: paired by seed against the
/// reference, the main job's bar count and every family's mean within the tolerance, and a mean
/// above the reference's on one of the named families; missing seeds leave it incomplete.
#[test]
fn the_trial_rule_reader_adopts_fails_and_waits_as_the_rule_says() {
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/trial-rule.py");
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, rows: &[(&str, [f64; 3])]| {
        let mut text = String::from("# family seed test\n");
        for (fam, tests) in rows {
            for (seed, t) in tests.iter().enumerate() {
                text.push_str(&format!("X {fam} {seed} {t} 120\n"));
            }
        }
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    };
    let reference = write(
        "ref.tsv",
        &[
            ("tiny-arith", [0.90, 0.95, 0.80]),
            ("tiny-sub4", [0.10, 0.50, 0.20]),
        ],
    );
    let verdict = |trial: &Path| {
        let out = Command::new("python3")
            .arg(&tool)
            .args([reference.as_os_str(), trial.as_os_str()])
            .args(["--main", "tiny-arith", "--families", "tiny-sub4"])
            .args(["--above", "tiny-sub4", "--seeds", "3"])
            .output()
            .expect("python3");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("verdict: "))
            .unwrap_or_else(|| panic!("no verdict: {text}{}", String::from_utf8_lossy(&out.stderr)))
            .to_string();
        (out.status.success(), line)
    };
    // Ahead on tiny-sub4, the main job as good: adopted.
    let better = write(
        "better.tsv",
        &[
            ("tiny-arith", [0.90, 0.95, 0.86]),
            ("tiny-sub4", [0.10, 0.90, 0.20]),
        ],
    );
    assert_eq!(verdict(&better), (true, "adopted".to_string()));
    // The main job 0.01 lower on average but one seed more under the bar: stage 1 fails.
    let fewer = write(
        "fewer.tsv",
        &[
            ("tiny-arith", [0.84, 0.97, 0.81]),
            ("tiny-sub4", [0.10, 0.90, 0.20]),
        ],
    );
    let (ok, v) = verdict(&fewer);
    assert!(!ok && v.contains("stage 1"), "{v}");
    // Level everywhere: nothing above the reference.
    let level = write(
        "level.tsv",
        &[
            ("tiny-arith", [0.90, 0.95, 0.80]),
            ("tiny-sub4", [0.10, 0.50, 0.20]),
        ],
    );
    let (ok, v) = verdict(&level);
    assert!(!ok && v.contains("above the reference's on none"), "{v}");
    // Half run: incomplete, not a verdict on the trial.
    let partial = dir.path().join("partial.tsv");
    std::fs::write(&partial, "tiny-arith 0 0.99\ntiny-arith 1 0.99\n").expect("write");
    let (ok, v) = verdict(&partial);
    assert!(!ok && v.starts_with("incomplete"), "{v}");
}
