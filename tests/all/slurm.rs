//! The Slurm backend against a real single-node Slurm cluster (munged, slurmctld, slurmd), driven
//! through the real `rsim` binary. `tools/test.sh` brings the cluster up (`tools/setup-slurm.sh`)
//! and sets `RSIM_REQUIRE_SLURM=1`, so these tests cannot skip silently there; elsewhere they skip
//! with a message when `sbatch` is not on PATH.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{commit_config, example_study, ok_json, rsim, run};

fn slurm_here() -> bool {
    let found = Command::new("sbatch")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("RSIM_REQUIRE_SLURM").is_none(),
            "RSIM_REQUIRE_SLURM is set but sbatch is not on PATH: run tools/setup-slurm.sh"
        );
        eprintln!("skipped: sbatch is not on PATH (tools/setup-slurm.sh sets up a test cluster)");
    }
    found
}

/// The tiny-arith-ngram example with `[backend]` replaced by `backend` (and, if given, the
/// trainer command replaced), committed on main by the study owner.
fn slurm_study(backend: &str, sft: Option<&str>) -> (tempfile::TempDir, PathBuf) {
    let (d, root) = example_study();
    set_config(&root, backend, sft);
    ok_json(
        &root,
        &[
            "call",
            "register_dataset",
            r#"{"node":"n0","name":"d","source":{"kind":"arith","op":"add","digits":2,"format":"plain","n":400,"seed":1}}"#,
        ],
    );
    (d, root)
}

/// Rewrite `[backend]` (and the trainer command) in rsim.toml and commit it on main.
fn set_config(root: &Path, backend: &str, sft: Option<&str>) {
    let text = std::fs::read_to_string(root.join("rsim.toml")).expect("read config");
    let start = text.find("[backend]").expect("[backend]");
    let end = start
        + text[start..]
            .find("\n[jobs]")
            .expect("[jobs] after [backend]");
    let mut text = format!("{}[backend]\n{backend}\n{}", &text[..start], &text[end..]);
    if let Some(cmd) = sft {
        let line = text
            .lines()
            .find(|l| l.starts_with("sft = "))
            .expect("sft line")
            .to_string();
        text = text.replace(&line, &format!("sft = {cmd}"));
    }
    commit_config(root, &text, "owner: slurm backend");
}

const SLURM: &str = "kind = \"slurm\"\npartition = \"debug\"\ntimeout_s = 300";

fn sft(root: &Path, steps: &str) -> Value {
    ok_json(
        root,
        &[
            "run-sft",
            "--node",
            "n0",
            "--dataset",
            "d",
            "--steps",
            steps,
        ],
    )
}

/// The bytes of a stored artifact.
fn artifact(root: &Path, sha: &str) -> String {
    std::fs::read_to_string(
        root.join(".rsim/objects/sha256")
            .join(&sha[..2])
            .join(&sha[2..]),
    )
    .expect("artifact")
}

/// Wait for the job of a running action to be submitted; its rsim job id and Slurm job id.
fn submitted_job(root: &Path) -> (String, String) {
    let jobs = root.join(".rsim/jobs");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        for e in std::fs::read_dir(&jobs).into_iter().flatten().flatten() {
            if let Ok(b) = std::fs::read(e.path().join("slurm.json")) {
                let v: Value = serde_json::from_slice(&b).expect("slurm.json");
                return (
                    e.file_name().to_string_lossy().into_owned(),
                    v["job_id"].as_str().expect("job_id").to_string(),
                );
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no job was submitted within 60 s");
}

/// The state squeue shows for a Slurm job, or None once it is no longer listed.
fn squeue_state(id: &str) -> Option<String> {
    let out = Command::new("squeue")
        .args(["-h", "-j", id, "-o", "%T"])
        .output()
        .expect("squeue");
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn wait_until_running(id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while squeue_state(id).as_deref() != Some("RUNNING") {
        assert!(Instant::now() < deadline, "Slurm job {id} never ran");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The job of an action result ended in `state`, its recorded error naming `needle`.
fn assert_job_ended(r: &Value, state: &str, needle: &str) {
    assert_eq!(r["job"]["state"], state, "{r}");
    assert!(
        r["job"]["error"]
            .as_str()
            .is_some_and(|e| e.contains(needle)),
        "{r}"
    );
}

#[test]
fn sft_and_evaluate_run_through_slurm_with_a_real_checkpoint_and_score() {
    if !slurm_here() {
        return;
    }
    let (_d, root) = slurm_study(SLURM, None);
    let r = sft(&root, "200");
    let job = &r["job"];
    assert_eq!(job["state"], "succeeded", "{r}");
    assert_eq!(job["slurm"]["state"], "COMPLETED", "{job}");
    assert_eq!(job["slurm"]["partition"], "debug");
    assert!(
        job["slurm"]["job_id"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
    assert!(job["slurm"]["queued_s"].as_f64().is_some(), "{job}");
    assert!(job["compute_s"].as_f64().is_some(), "{job}");
    if rsi_master::jobs::network_isolation_available() {
        assert_eq!(
            job["network"], "isolated",
            "cut off from the network on the node too"
        );
    }
    // Sandboxed on the node as locally (the node's own note, from the wrapper).
    if rsi_master::jobs::sandbox::landlock_abi().is_ok() {
        let sandbox = job["sandbox"].as_str().unwrap_or_default();
        assert!(sandbox.starts_with("landlock-abi"), "{job}");
    }
    let ck = r["checkpoint"].as_str().expect("a checkpoint");
    assert_eq!(ck.len(), 64);
    // The job's output went into its log, stored as an artifact like a local job's.
    let log = artifact(&root, job["log"].as_str().expect("log"));
    assert!(!log.is_empty());

    let e = ok_json(
        &root,
        &[
            "evaluate",
            "--node",
            "n0",
            "--checkpoint",
            ck,
            "--task",
            "add2",
            "--split",
            "dev",
        ],
    );
    assert_eq!(e["job"]["state"], "succeeded", "{e}");
    assert_eq!(e["job"]["slurm"]["state"], "COMPLETED");
    let score = e["metrics"]["exact_match"].as_f64().expect("a score");
    assert!((0.0..=1.0).contains(&score));
    // The record says which Slurm job ran it, and the budget counts it.
    let got = ok_json(
        &root,
        &[
            "call",
            "get_job",
            &format!(r#"{{"job":"{}"}}"#, e["job"]["id"].as_str().expect("id")),
        ],
    );
    assert_eq!(got["job"]["slurm"], e["job"]["slurm"]);
    let out = run(&root, &["fsck"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_failing_job_is_recorded_with_its_exit_code_log_and_no_secrets() {
    if !slurm_here() {
        return;
    }
    let (_d, root) = slurm_study(
        SLURM,
        Some(r#"["sh", "-c", "env; echo 'error: the trainer broke' >&2; exit 3", "sh"]"#),
    );
    let out = rsim()
        .arg("-C")
        .arg(&root)
        .args(["--json", "run-sft", "--node", "n0", "--dataset", "d"])
        .env("OPENAI_API_KEY", "sk-do-not-leak")
        .output()
        .expect("rsim");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("json");
    let job = &r["job"];
    assert_eq!(job["state"], "failed", "{r}");
    assert_eq!(job["exit_code"], 3);
    assert_eq!(job["slurm"]["state"], "FAILED");
    let err = job["error"].as_str().expect("error");
    assert!(
        err.contains("exited with status 3") && err.contains("the trainer broke"),
        "{err}"
    );
    assert!(r["checkpoint"].is_null());
    let log = artifact(&root, job["log"].as_str().expect("log"));
    assert!(log.contains("RSIM_JOB_ID="), "{log}");
    assert!(log.contains("SLURM_JOB_ID="), "{log}");
    assert!(
        !log.contains("sk-do-not-leak"),
        "secrets stay out of Slurm jobs"
    );
}

#[test]
fn a_cancelled_job_is_scancelled_and_recorded_cancelled() {
    if !slurm_here() {
        return;
    }
    let (_d, root) = slurm_study(SLURM, Some(r#"["sh", "-c", "sleep 120", "sh"]"#));
    let writer = rsim()
        .arg("-C")
        .arg(&root)
        .args(["--json", "run-sft", "--node", "n0", "--dataset", "d"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let (job, slurm_id) = submitted_job(&root);
    wait_until_running(&slurm_id);
    let t = Instant::now();
    ok_json(&root, &["cancel", &job]);
    let out = writer.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    let r: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(r["job"]["state"], "cancelled", "{r}");
    assert_eq!(r["job"]["error"], "cancelled on request by owner");
    assert!(
        r["job"]["slurm"]["state"]
            .as_str()
            .is_some_and(|s| s.starts_with("CANCELLED")),
        "{r}"
    );
    assert_eq!(squeue_state(&slurm_id), None, "nothing left in the queue");
}

#[test]
fn a_job_past_its_time_limit_is_stopped_and_recorded_timed_out() {
    if !slurm_here() {
        return;
    }
    let (_d, root) = slurm_study(
        "kind = \"slurm\"\ntimeout_s = 3",
        Some(r#"["sh", "-c", "sleep 120", "sh"]"#),
    );
    let t = Instant::now();
    let r = sft(&root, "1");
    assert!(t.elapsed() < Duration::from_secs(40), "{:?}", t.elapsed());
    assert_job_ended(&r, "timed_out", "wall-clock limit of 3 s");
    let d = r["job"]["duration_s"].as_f64().expect("duration");
    assert!((3.0..20.0).contains(&d), "{d}");
    let id = r["job"]["slurm"]["job_id"].as_str().expect("id");
    assert_eq!(squeue_state(id), None);
}

#[test]
fn an_impossible_gpu_request_is_rejected_at_submit_with_a_clear_error() {
    if !slurm_here() {
        return;
    }
    let (_d, root) = slurm_study("kind = \"slurm\"\ngpus_per_job = 1", None);
    let r = sft(&root, "1");
    assert_eq!(r["job"]["state"], "failed", "{r}");
    let err = r["job"]["error"].as_str().expect("error");
    assert!(
        err.contains("rejected the job at submission") && err.contains("gres"),
        "{err}"
    );
    assert!(r["job"]["slurm"].is_null(), "no Slurm job was created");
    assert_eq!(r["job"]["compute_s"], 0.0);
    // The same as `--gres`.
    set_config(
        &root,
        "kind = \"slurm\"\ngpus_per_job = 2\ngpu_request = \"gres\"",
        None,
    );
    let r = sft(&root, "1");
    assert_job_ended(&r, "failed", "rejected the job at submission");
}

#[test]
fn a_job_that_can_never_start_is_cancelled_with_slurms_reason() {
    if !slurm_here() {
        return;
    }
    // A dependency on a failed job can never be satisfied: Slurm keeps it pending forever.
    let out = Command::new("sbatch")
        .args(["--parsable", "--output=/dev/null", "--wrap", "false"])
        .output()
        .expect("sbatch");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let failed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    while squeue_state(&failed).is_some() {
        assert!(Instant::now() < deadline, "job {failed} never ended");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_d, root) = slurm_study(
        &format!("kind = \"slurm\"\nextra_sbatch = [\"--dependency=afterok:{failed}\"]"),
        None,
    );
    let t = Instant::now();
    let r = sft(&root, "1");
    assert!(t.elapsed() < Duration::from_secs(40), "{:?}", t.elapsed());
    assert_job_ended(&r, "failed", "DependencyNeverSatisfied");
}

#[test]
fn a_restarted_rsim_reattaches_to_its_slurm_job_and_records_the_real_outcome() {
    if !slurm_here() {
        return;
    }
    // The trainer waits a little first, so the job is still running when its writer dies.
    let (_d, root) = slurm_study(
        SLURM,
        Some(r#"["sh", "-c", "sleep 4; exec \"$0\" job train \"$1\"", "@rsim"]"#),
    );
    let mut writer = rsim()
        .arg("-C")
        .arg(&root)
        .args([
            "run-sft",
            "--node",
            "n0",
            "--dataset",
            "d",
            "--steps",
            "100",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let (job, slurm_id) = submitted_job(&root);
    writer.kill().expect("kill -9 the writer");
    writer.wait().expect("wait");
    assert!(
        squeue_state(&slurm_id).is_some(),
        "the Slurm job outlives its writer"
    );
    // Opening the study while the job runs neither stops it nor records it as lost.
    let log = ok_json(&root, &["log", "--node", "n0"]);
    assert!(
        !log["actions"]
            .as_array()
            .expect("actions")
            .iter()
            .any(|a| a["action"] == "run_sft"),
        "{log}"
    );
    assert!(squeue_state(&slurm_id).is_some(), "still queued or running");
    // A restarted rsim waits for it and records what really happened.
    let rec = ok_json(&root, &["recover", "--wait"]);
    assert_eq!(rec["recorded"], 1, "{rec}");
    let got = ok_json(
        &root,
        &["call", "get_job", &format!(r#"{{"job":"{job}"}}"#)],
    );
    assert_eq!(got["job"]["state"], "succeeded", "{got}");
    assert_eq!(got["job"]["slurm"]["job_id"], slurm_id.as_str());
    let log = ok_json(&root, &["log", "--node", "n0"]);
    let a = &log["actions"][0];
    assert_eq!(a["action"], "run_sft", "{log}");
    assert!(
        a["summary"]
            .as_str()
            .is_some_and(|s| s.contains("checkpoint")),
        "{a}"
    );
    // Recorded once: opening again adds nothing, and the record is sound.
    assert_eq!(ok_json(&root, &["recover"])["recorded"], 0);
    let out = run(&root, &["fsck"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn an_orphaned_job_can_be_cancelled_and_is_recorded_by_the_next_write() {
    if !slurm_here() {
        return;
    }
    let (_d, root) = slurm_study(SLURM, Some(r#"["sh", "-c", "sleep 120", "sh"]"#));
    let mut writer = rsim()
        .arg("-C")
        .arg(&root)
        .args(["run-sft", "--node", "n0", "--dataset", "d"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let (job, slurm_id) = submitted_job(&root);
    wait_until_running(&slurm_id);
    writer.kill().expect("kill -9 the writer");
    writer.wait().expect("wait");
    // No rsim process waits for the job now: cancel still reaches Slurm at once.
    ok_json(&root, &["cancel", &job]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while squeue_state(&slurm_id).is_some() {
        assert!(Instant::now() < deadline, "scancel did not stop the job");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Reading records nothing (it never acts); the next write — here `rsim recover` — records the
    // ended job with its real outcome.
    let log = ok_json(&root, &["log", "--node", "n0"]);
    assert_eq!(log["actions"][0]["action"], "register_dataset", "{log}");
    ok_json(&root, &["recover"]);
    let log = ok_json(&root, &["log", "--node", "n0"]);
    assert_eq!(log["actions"][0]["action"], "run_sft", "{log}");
    let got = ok_json(
        &root,
        &["call", "get_job", &format!(r#"{{"job":"{job}"}}"#)],
    );
    assert_eq!(got["job"]["state"], "cancelled", "{got}");
    assert_eq!(got["job"]["error"], "cancelled on request by owner");
}
