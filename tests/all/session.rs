//! The session layer's rules hold on every face: cancel goes through the policy (refusals recorded
//! with their rule), a CLI write rides out a compare-and-swap conflict, a spent budget refuses a
//! campaign with a recorded rule, and command output survives a reader that goes away.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{commit_config, example_study, fsck_clean, ok_json, rsim, run, run_ok};

fn actions(root: &Path) -> Vec<Value> {
    ok_json(root, &["log", "--limit", "100000"])["actions"]
        .as_array()
        .expect("actions")
        .clone()
}

/// A study whose training job sleeps until cancelled (the spec path is appended as `$0`).
fn study_with_a_slow_trainer() -> (tempfile::TempDir, PathBuf) {
    let (d, root) = example_study();
    let text = std::fs::read_to_string(root.join("rsim.toml")).expect("config");
    let line = text
        .lines()
        .find(|l| l.starts_with("sft ="))
        .expect("sft line")
        .to_string();
    commit_config(
        &root,
        &text.replace(&line, r#"sft = ["sh", "-c", "sleep 60", "sh"]"#),
        "owner: a trainer that takes its time",
    );
    run_ok(
        &root,
        &[
            "--agent", "alice", "--role", "worker", "branch", "--from", "n0", "--title", "slow",
        ],
    );
    run_ok(
        &root,
        &[
            "--agent",
            "alice",
            "--role",
            "worker",
            "call",
            "register_dataset",
            r#"{"node":"n1","name":"d","source":{"kind":"inline","rows":[{"prompt":"1+1=","answer":"2"}]}}"#,
        ],
    );
    (d, root)
}

/// Start `run-sft` as alice in the background and wait until its job exists.
// The caller waits for the returned child.
#[allow(clippy::zombie_processes)]
fn start_slow_job(root: &Path) -> (Child, String) {
    let mut child = rsim()
        .arg("-C")
        .arg(root)
        .args([
            "--agent",
            "alice",
            "--role",
            "worker",
            "--json",
            "run-sft",
            "--node",
            "n1",
            "--dataset",
            "d",
            "--steps",
            "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn run-sft");
    let jobs = root.join(".rsim/jobs");
    let start = Instant::now();
    loop {
        let found = std::fs::read_dir(&jobs).ok().and_then(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|n| n.starts_with("j-") && jobs.join(n).join("job.log").is_file())
        });
        if let Some(j) = found {
            return (child, j);
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let out = child.wait_with_output().expect("run-sft");
            panic!(
                "the job never started: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn rejected_with(out: &std::process::Output, rule: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(4),
        "expected a policy rejection: {err}"
    );
    assert!(err.contains(rule), "expected rule {rule}: {err}");
    assert!(
        err.contains("recorded as commit"),
        "the refusal is recorded: {err}"
    );
    err
}

#[test]
fn cancel_goes_through_the_policy_on_every_face_and_refusals_are_recorded() {
    let (_d, root) = study_with_a_slow_trainer();
    let (child, job) = start_slow_job(&root);

    // An observer may not cancel; a reviewer runs no jobs; a worker may cancel only its own jobs.
    for (agent, role, rule) in [
        ("olga", "observer", "role"),
        ("rita", "reviewer", "role"),
        ("bob", "worker", "job-owner"),
    ] {
        let out = run(&root, &["--agent", agent, "--role", role, "cancel", &job]);
        rejected_with(&out, rule);
    }
    // The same through the JSON face every agent uses.
    let out = run(
        &root,
        &[
            "--agent",
            "olga",
            "--role",
            "observer",
            "call",
            "cancel_job",
            &format!(r#"{{"job":"{job}"}}"#),
        ],
    );
    rejected_with(&out, "role");
    // None of them stopped the job.
    assert!(!root.join(".rsim/jobs").join(&job).join("cancel").exists());

    // Each refusal sits on the job's node with its rule, agent and role.
    let refused: Vec<Value> = actions(&root)
        .into_iter()
        .filter(|a| a["action"] == "cancel_job")
        .collect();
    assert_eq!(refused.len(), 4, "{refused:?}");
    for a in &refused {
        assert_eq!(a["node"], "n1");
        assert_eq!(a["decision"], "rejected");
    }
    let rules: Vec<&str> = refused.iter().filter_map(|a| a["rule"].as_str()).collect();
    assert_eq!(
        rules.iter().filter(|r| **r == "role").count(),
        3,
        "{rules:?}"
    );
    assert_eq!(
        rules.iter().filter(|r| **r == "job-owner").count(),
        1,
        "{rules:?}"
    );

    // The job's own agent may cancel it; the record says who asked.
    run_ok(
        &root,
        &["--agent", "alice", "--role", "worker", "cancel", &job],
    );
    let out = child.wait_with_output().expect("run-sft ends");
    let res: Value = serde_json::from_slice(&out.stdout).expect("run-sft json");
    assert_eq!(res["job"]["state"], "cancelled", "{res}");
    let why = res["job"]["error"].as_str().unwrap_or_default();
    assert!(why.contains("by alice"), "{why}");
    fsck_clean(&root);
}

#[test]
fn a_cli_write_rides_out_a_compare_and_swap_conflict() {
    let (_d, root) = example_study();
    let out = run(&root, &["branch", "--from", "n0", "--title", "t"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = actions(&root).len();

    // Another writer holds the node's branch (git's own ref lock) for a while.
    let lock = root.join(".git/refs/heads/rsim/n/n1.lock");
    std::fs::write(&lock, b"").expect("take the ref lock");
    let writer = rsim()
        .arg("-C")
        .arg(&root)
        .args([
            "--json",
            "call",
            "conclude",
            r#"{"node":"n1","outcome":"negative","findings":"f"}"#,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn conclude");
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::remove_file(&lock).expect("release the ref lock");
    let out = writer.wait_with_output().expect("conclude ends");
    assert!(
        out.status.success(),
        "the write waits out the conflict: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Exactly one commit was added, on top of the tip the lock holder left.
    let after = actions(&root);
    assert_eq!(after.len(), before + 1);
    assert_eq!(
        after.iter().filter(|a| a["action"] == "conclude").count(),
        1
    );
    fsck_clean(&root);
}

#[test]
fn a_campaign_on_a_spent_budget_is_refused_with_a_recorded_rule() {
    let (_d, root) = example_study();
    let text = std::fs::read_to_string(root.join("rsim.toml")).expect("config");
    let line = text
        .lines()
        .find(|l| l.starts_with("evaluations"))
        .expect("evaluations line")
        .to_string();
    commit_config(
        &root,
        &text.replace(&line, "evaluations = 0"),
        "owner: no evaluations left",
    );
    let out = run(&root, &["run", "--quiet", "--experiments", "2"]);
    rejected_with(&out, "budget-evaluations");
    let acts = actions(&root);
    let campaign: Vec<&Value> = acts.iter().filter(|a| a["action"] == "campaign").collect();
    assert_eq!(campaign.len(), 1, "{acts:?}");
    assert_eq!(campaign[0]["rule"], "budget-evaluations");
    assert_eq!(campaign[0]["agent"], "orchestrator");
    // Nothing else was started.
    assert_eq!(acts.len(), 2, "{acts:?}");
    fsck_clean(&root);
}

#[test]
fn output_to_a_reader_that_went_away_ends_quietly() {
    let (_d, root) = example_study();
    for args in [
        &["audit", "--json"][..],
        &["log"][..],
        &["dag", "--format", "json"][..],
    ] {
        let mut child = rsim()
            .arg("-C")
            .arg(&root)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // The reader closes its end before rsim writes (what `| head -0` does at once).
        drop(child.stdout.take());
        let mut err = String::new();
        child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut err)
            .expect("stderr");
        let status = child.wait().expect("wait");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(status.code(), Some(0), "{args:?}: {err}");
    }
}

/// Start `n` copies of an rsim command at once; their outputs.
fn at_once(root: &Path, n: usize, args: &[&str]) -> Vec<std::process::Output> {
    let children: Vec<Child> = (0..n)
        .map(|_| {
            rsim()
                .arg("-C")
                .arg(root)
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .collect()
}

#[test]
fn concurrent_jobs_cannot_all_pass_a_cap_they_share() {
    let (_d, root) = example_study();
    run_ok(
        &root,
        &[
            "--agent", "mallory", "--role", "worker", "branch", "--from", "n0", "--title", "t",
        ],
    );
    const TEST_EVALUATION: &[&str] = &[
        "--agent",
        "mallory",
        "--role",
        "worker",
        "call",
        "evaluate",
        r#"{"node":"n1","checkpoint":"base","task":"add2","split":"test"}"#,
    ];
    // Five test evaluations at once against a per-node cap of two.
    let outs = at_once(&root, 5, TEST_EVALUATION);
    let ok = outs.iter().filter(|o| o.status.success()).count();
    // Each of the others is refused by a policy rule: the cap, or — when one of the two
    // accepted jobs still waits in the admission queue as they arrive (a loaded machine) — the
    // one-waiting-job rule, which refuses them first.
    let refused = outs
        .iter()
        .filter(|o| {
            let e = String::from_utf8_lossy(&o.stderr);
            e.contains("test-evaluation-limit") || e.contains("rule budget-compute")
        })
        .count();
    assert_eq!(
        (ok, refused),
        (2, 3),
        "{:?}",
        outs.iter()
            .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
            .collect::<Vec<_>>()
    );
    // Once they are done, the cap holds: a sixth is refused by it, and two were recorded.
    let sixth = at_once(&root, 1, TEST_EVALUATION);
    let e = String::from_utf8_lossy(&sixth[0].stderr);
    assert!(
        !sixth[0].status.success() && e.contains("test-evaluation-limit"),
        "{e}"
    );
    fsck_clean(&root);
}

#[test]
fn concurrent_jobs_share_the_compute_left_instead_of_each_getting_all_of_it() {
    let (_d, root) = study_with_a_slow_trainer();
    let text = std::fs::read_to_string(root.join("rsim.toml")).expect("config");
    let line = text
        .lines()
        .find(|l| l.starts_with("compute_seconds"))
        .expect("compute line")
        .to_string();
    commit_config(
        &root,
        &text.replace(&line, "compute_seconds = 3"),
        "owner: 3 s of compute",
    );
    let outs = at_once(
        &root,
        3,
        &[
            "--agent",
            "alice",
            "--role",
            "worker",
            "--json",
            "run-sft",
            "--node",
            "n1",
            "--dataset",
            "d",
            "--steps",
            "1",
        ],
    );
    let ran: Vec<Value> = outs
        .iter()
        .filter(|o| o.status.success())
        .map(|o| serde_json::from_slice(&o.stdout).expect("json"))
        .collect();
    let refused = outs
        .iter()
        .filter(|o| String::from_utf8_lossy(&o.stderr).contains("budget-compute"))
        .count();
    assert_eq!((ran.len(), refused), (1, 2), "{ran:?}");
    // The one admitted job was cut to the 3 s the study had, and charged no more.
    assert_eq!(ran[0]["job"]["state"], "timed_out", "{}", ran[0]);
    let used: f64 = ran[0]["job"]["duration_s"].as_f64().expect("duration");
    assert!(used < 6.0, "{used}");
    fsck_clean(&root);
}

/// Wait until the watcher's value moves past `seen`, for at most `within`.
fn ticked(rx: &mut tokio::sync::watch::Receiver<u64>, seen: u64, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if *rx.borrow_and_update() != seen {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn the_session_watcher_ticks_when_another_process_writes_the_record_and_not_when_it_reads() {
    let (_d, root) = example_study();
    let session = rsi_master::os::session::Session::open(&root).expect("session");
    let mut rx = session.watch();
    let seen = *rx.borrow_and_update();
    // Another process reads: nothing is written, nothing ticks.
    ok_json(&root, &["dag"]);
    ok_json(&root, &["show", "n0"]);
    assert!(
        !ticked(&mut rx, seen, rsi_master::os::session::WATCH_POLL * 4),
        "a read ticked"
    );
    // Another process writes: the watcher ticks.
    ok_json(&root, &["branch", "--from", "n0", "--title", "watched"]);
    assert!(
        ticked(&mut rx, seen, Duration::from_secs(10)),
        "no tick after another process recorded a branch"
    );
    let seen = *rx.borrow_and_update();
    // A second subscriber shares the same watcher, and a write through this session ticks too.
    let mut rx2 = session.watch();
    let seen2 = *rx2.borrow_and_update();
    session
        .call(
            &rsi_master::model::Caller::owner(),
            "branch",
            serde_json::json!({"parents": ["n0"], "title": "in process"}),
        )
        .expect("branch");
    assert!(ticked(&mut rx, seen, Duration::from_secs(10)));
    assert!(ticked(&mut rx2, seen2, Duration::from_secs(10)));
}
