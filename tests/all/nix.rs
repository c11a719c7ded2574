//! Jobs in a Nix environment, with real Nix: the job runs under `nix develop FLAKE --command`, and
//! the flake's narHash is recorded with the job and in the commit. `tools/test.sh` installs and
//! configures Nix (offline: no substituters, no sandbox, an empty registry); without `nix` on PATH
//! the test says so and does nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use rsi_master::{Study, faces::init, train::datasets};
use serde_json::json;

const FLAKE: &str = r#"{
  description = "rsim test environment: host tools, pinned by this flake's hash";
  outputs = { self }:
    let shell = system: derivation {
      name = "rsim-test-env";
      inherit system;
      builder = "/bin/bash";
      args = [ "-c" "echo ok > $out" ];
      outputs = [ "out" ];
      RSIM_ENV_MARKER = "inside-nix";
    };
    in {
      devShells.x86_64-linux.default = shell "x86_64-linux";
      devShells.aarch64-linux.default = shell "aarch64-linux";
    };
}
"#;

fn nix_works() -> bool {
    Command::new("nix")
        .args(["--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn study(flake_text: &str) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().expect("tempdir");
    let root = d.path().join("study");
    std::fs::create_dir_all(root.join("env")).expect("mkdir");
    std::fs::create_dir_all(root.join("jobs")).expect("mkdir");
    std::fs::create_dir_all(root.join("eval")).expect("mkdir");
    std::fs::write(root.join("env/flake.nix"), flake_text).expect("flake");
    rsi_master::train::write_base_model(&root.join("models/base")).expect("base");
    let rows = datasets::to_jsonl(&[rsi_master::api::types::Row {
        prompt: "1+1=".into(),
        answer: "2".into(),
    }])
    .expect("jsonl");
    std::fs::write(root.join("eval/dev.jsonl"), &rows).expect("dev");
    std::fs::write(root.join("eval/test.jsonl"), &rows).expect("test");
    let rsim = env!("CARGO_BIN_EXE_rsim");
    // The trainer refuses to run outside the flake's environment.
    std::fs::write(
        root.join("jobs/train.sh"),
        format!("#!/bin/sh\necho \"marker=$RSIM_ENV_MARKER\"\n[ \"$RSIM_ENV_MARKER\" = inside-nix ] || exit 7\nexec {rsim} job train \"$1\"\n"),
    )
    .expect("train.sh");
    std::fs::write(
        root.join("rsim.toml"),
        r#"[study]
name = "nix-env"
[base_model]
name = "base"
path = "models/base"
[tasks.add]
dev = { path = "eval/dev.jsonl" }
test = { path = "eval/test.jsonl" }
[environment]
kind = "nix"
flake = "env"
[jobs]
sft = ["sh", "jobs/train.sh"]
evaluate = ["@rsim", "job", "eval"]
"#,
    )
    .expect("config");
    init::init(&root, None).expect("init");
    (d, root)
}

fn open(root: &Path) -> Study {
    let mut s = Study::open(root).expect("open");
    s.set_rsim_bin(PathBuf::from(env!("CARGO_BIN_EXE_rsim")));
    s
}

#[test]
fn jobs_run_inside_the_flake_and_its_nar_hash_is_recorded() {
    if !nix_works() {
        eprintln!("skipped: nix is not installed here (tools/test.sh installs it)");
        return;
    }
    let (_d, root) = study(FLAKE);
    let s = open(&root);
    let owner = rsi_master::model::Caller::owner();
    s.call(&owner, "register_dataset", json!({"node": "n0", "name": "d", "source": {"kind": "inline", "rows": [{"prompt": "2+2=", "answer": "4"}]}})).expect("register");
    let sft = s
        .call(&owner, "run_sft", json!({"node": "n0", "base": "base", "datasets": ["d"], "learning_rate": 0.001, "steps": 2, "batch_size": 1}))
        .expect("sft");
    assert_eq!(sft["job"]["state"], "succeeded", "{sft}");
    let env = sft["job"]["env"].as_str().expect("env");
    assert!(
        env.starts_with("nix:path:") && env.contains("#sha256-"),
        "{env}"
    );
    let cmd: Vec<&str> = sft["job"]["command"]
        .as_array()
        .expect("cmd")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(&cmd[..2], &["nix", "develop"]);
    // The commit carries the environment as a trailer.
    let repo = git2::Repository::open(&root).expect("repo");
    let c = repo
        .find_commit(git2::Oid::from_str(sft["commit"].as_str().expect("commit")).expect("oid"))
        .expect("commit");
    assert!(
        c.message()
            .expect("msg")
            .contains(&format!("Rsim-Env: {env}"))
    );
    // Changing the flake changes the recorded hash.
    std::fs::write(
        root.join("env/flake.nix"),
        FLAKE.replace("inside-nix\";", "inside-nix\"; EXTRA = \"1\";"),
    )
    .expect("write");
    let again = s
        .call(&owner, "run_sft", json!({"node": "n0", "base": "base", "datasets": ["d"], "learning_rate": 0.001, "steps": 2, "batch_size": 1}))
        .expect("sft");
    assert_eq!(again["job"]["state"], "succeeded");
    assert_ne!(
        again["job"]["env"], sft["job"]["env"],
        "a changed flake is a different environment"
    );
}

#[test]
fn a_flake_that_fails_to_evaluate_is_refused_with_nixs_message() {
    if !nix_works() {
        eprintln!("skipped: nix is not installed here (tools/test.sh installs it)");
        return;
    }
    let (_d, root) = study("{ outputs = { self }: { devShells = this is not nix; }; }\n");
    let s = open(&root);
    let owner = rsi_master::model::Caller::owner();
    s.call(&owner, "register_dataset", json!({"node": "n0", "name": "d", "source": {"kind": "inline", "rows": [{"prompt": "2+2=", "answer": "4"}]}})).expect("register");
    let e = s
        .call(&owner, "run_sft", json!({"node": "n0", "base": "base", "datasets": ["d"], "learning_rate": 0.001, "steps": 2, "batch_size": 1}))
        .expect_err("refused");
    // The job never runs; the refusal is recorded with Nix's own message.
    assert_eq!(
        e.rule.as_deref(),
        Some("environment-pinned"),
        "{}",
        e.message
    );
    assert!(e.message.contains("undefined variable"), "{}", e.message);
    assert!(!e.message.contains("unresolved"), "{}", e.message);
}
