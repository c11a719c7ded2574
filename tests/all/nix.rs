//! Jobs in a Nix environment, with real Nix: the flake is pinned to its narHash before the job is
//! admitted, the job runs under `nix develop <locked reference> --command`, and the narHash is
//! recorded with the job and in the commit; a flake that cannot be pinned is refused with Nix's
//! own message and its job never runs. `tools/test.sh` installs and configures Nix (offline: no
//! substituters, no sandbox, an empty registry); without `nix` on PATH the tests say so and do
//! nothing.
//!
//! Every test drives the `rsim` binary against a fresh Nix — its own HOME, XDG_CACHE_HOME and
//! store (`NIX_STORE_DIR`, `NIX_STATE_DIR`, `NIX_LOG_DIR` in a temporary directory) — so it meets
//! a fresh machine every time, not only on its first run: there, two Nix processes using a store
//! for the first time at once fail now and then (`SQLite database '…/db.sqlite' is busy`,
//! `'…/db/schema' is corrupt`, `creating symlink from '…/gcroots/profiles' …: File exists`),
//! which once recorded a job with the environment `#unresolved`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rsi_master::{faces::init, train::datasets};
use serde_json::{Value, json};

use crate::common;

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

const SFT: &str = r#"{"node": "n0", "base": "base", "datasets": ["d"], "learning_rate": 0.001, "steps": 2, "batch_size": 1}"#;

fn nix_works() -> bool {
    let ok = Command::new("nix")
        .args(["--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("skipped: nix is not installed here (tools/test.sh installs it)");
    }
    ok
}

/// A Nix nobody has used yet: a HOME, a cache and a store of its own.
struct FreshNix {
    dir: tempfile::TempDir,
}

impl FreshNix {
    fn new() -> FreshNix {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("home")).expect("home");
        FreshNix { dir }
    }

    /// `rsim -C study --json ARGS...` under this Nix; `path_first` goes before PATH.
    fn rsim(&self, study: &Path, args: &[&str], path_first: Option<&Path>) -> Command {
        let d = self.dir.path();
        let mut c = common::rsim();
        c.arg("-C")
            .arg(study)
            .arg("--json")
            .args(args)
            .env("HOME", d.join("home"))
            .env("XDG_CACHE_HOME", d.join("home/.cache"))
            .env("NIX_STORE_DIR", d.join("nix/store"))
            .env("NIX_STATE_DIR", d.join("nix/var"))
            .env("NIX_LOG_DIR", d.join("nix/log"))
            .env_remove("NIX_REMOTE")
            .env_remove("NIX_CONF_DIR")
            .env_remove("XDG_CONFIG_HOME");
        if let Some(p) = path_first {
            let path = std::env::var("PATH").unwrap_or_default();
            c.env("PATH", format!("{}:{path}", p.display()));
        }
        c
    }

    fn run_sft(&self, study: &Path, path_first: Option<&Path>) -> Output {
        self.rsim(study, &["call", "run_sft", SFT], path_first)
            .output()
            .expect("spawn rsim")
    }
}

impl Drop for FreshNix {
    /// Nix leaves its store read-only; make it removable.
    fn drop(&mut self) {
        let _ = Command::new("chmod")
            .args(["-R", "u+w"])
            .arg(self.dir.path())
            .status();
    }
}

/// A study whose jobs run in the flake `env/` (holding `flake_text`). Its trainer notes that it
/// ran (the file `ran` in its `out/`: the sandbox lets it write nowhere else), then refuses to run outside the flake's environment.
fn study(flake_text: &str, extra_config: &str) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().expect("tempdir");
    let root = d.path().join("study");
    std::fs::create_dir_all(root.join("env")).expect("mkdir");
    std::fs::create_dir_all(root.join("jobs")).expect("mkdir");
    std::fs::create_dir_all(root.join("eval")).expect("mkdir");
    std::fs::write(root.join("env/flake.nix"), flake_text).expect("flake");
    rsi_master::train::write_base_model(&root.join("models/base")).expect("base");
    // Disjoint splits (a study whose dev and test share items is refused).
    for (split, prompt, answer) in [("dev", "1+1=", "2"), ("test", "5+3=", "8")] {
        let rows = datasets::to_jsonl(&[rsi_master::api::types::Row {
            prompt: prompt.into(),
            answer: answer.into(),
        }])
        .expect("jsonl");
        std::fs::write(root.join(format!("eval/{split}.jsonl")), &rows).expect(split);
    }
    let rsim = env!("CARGO_BIN_EXE_rsim");
    std::fs::write(
        root.join("jobs/train.sh"),
        format!(
            "#!/bin/sh\ntouch \"$RSIM_JOB_OUT/ran\"\necho \"marker=$RSIM_ENV_MARKER\"\n[ \"$RSIM_ENV_MARKER\" = inside-nix ] || exit 7\nexec {rsim} job train \"$1\"\n"
        ),
    )
    .expect("train.sh");
    std::fs::write(
        root.join("rsim.toml"),
        format!(
            r#"[study]
name = "nix-env"
[base_model]
name = "base"
path = "models/base"
[tasks.add]
dev = {{ path = "eval/dev.jsonl" }}
test = {{ path = "eval/test.jsonl" }}
[environment]
kind = "nix"
flake = "env"
[jobs]
sft = ["sh", "jobs/train.sh"]
evaluate = ["@rsim", "job", "eval"]
{extra_config}"#
        ),
    )
    .expect("config");
    init::init(&root, None).expect("init");
    let out = common::run(
        &root,
        &[
            "call",
            "register_dataset",
            r#"{"node": "n0", "name": "d", "source": {"kind": "inline", "rows": [{"prompt": "2+2=", "answer": "4"}]}}"#,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (d, root)
}

/// The JSON result of a call that must have succeeded.
fn result(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "rsim failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json result")
}

/// The JSON error (`{"error": …}`, the last line on stderr) of a call that must have failed.
fn error(out: &Output) -> Value {
    assert!(!out.status.success(), "rsim succeeded");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
    let v: Value = serde_json::from_str(last.unwrap_or_default()).expect("json error");
    v["error"].clone()
}

/// Asserts that `sft` ran in the study's flake, pinned: the recorded environment names the
/// flake's narHash, the command runs the locked reference with that hash, the commit carries
/// the environment as its `Rsim-Env` trailer. Returns the environment.
fn assert_pinned(root: &Path, sft: &Value) -> String {
    assert_eq!(sft["job"]["state"], "succeeded", "{sft}");
    let env = sft["job"]["env"].as_str().expect("env").to_string();
    let flake = format!("nix:path:{}#sha256-", root.join("env").display());
    assert!(env.starts_with(&flake), "{env}");
    assert!(rsi_master::jobs::is_pinned(&env), "{env}");
    let hash = env.rsplit_once('#').map(|(_, h)| h).unwrap_or_default();
    let cmd: Vec<&str> = sft["job"]["command"]
        .as_array()
        .expect("cmd")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    let develop = cmd
        .iter()
        .position(|a| *a == "develop")
        .expect("nix develop");
    assert_eq!(cmd[develop - 1], "nix", "{cmd:?}");
    let locked = cmd[develop + 1];
    // Nix percent-encodes some of the hash's characters in the locked reference.
    let decoded = ["2f", "2F", "2b", "2B", "3d", "3D"]
        .iter()
        .zip(["/", "/", "+", "+", "=", "="])
        .fold(locked.to_string(), |s, (code, c)| {
            s.replace(&format!("%{code}"), c)
        });
    assert!(
        locked.starts_with(&format!("path:{}?", root.join("env").display()))
            && decoded.contains(&format!("narHash={hash}")),
        "the job runs the locked reference that was hashed: {locked} vs {hash}"
    );
    assert_eq!(cmd[develop + 2], "--command");
    let repo = git2::Repository::open(root).expect("repo");
    let c = repo
        .find_commit(git2::Oid::from_str(sft["commit"].as_str().expect("commit")).expect("oid"))
        .expect("commit");
    assert!(
        c.message()
            .expect("msg")
            .contains(&format!("Rsim-Env: {env}"))
    );
    let job = sft["job"]["id"].as_str().expect("job id");
    assert!(root.join(format!(".rsim/jobs/{job}/out/ran")).exists());
    // Nix runs outside the sandbox; the job's own program inside it.
    if rsi_master::jobs::sandbox::landlock_abi().is_ok() {
        let sandbox = sft["job"]["sandbox"].as_str().unwrap_or_default();
        assert!(sandbox.starts_with("landlock-abi"), "{sft}");
        let develop = cmd
            .iter()
            .position(|a| *a == "--command")
            .expect("--command");
        assert_eq!(cmd[develop + 2..develop + 4], ["job", "sandbox"], "{cmd:?}");
    }
    env
}

/// `rsim fsck` and `rsim audit` find nothing wrong, and the audit checked `jobs` environments.
fn assert_record_clean(nix: &FreshNix, root: &Path, jobs: u64) {
    let fsck = result(&nix.rsim(root, &["fsck"], None).output().expect("fsck"));
    assert_eq!(fsck["problems"], json!([]), "{fsck}");
    let audit = result(&nix.rsim(root, &["audit"], None).output().expect("audit"));
    assert_eq!(audit["got_through"], 0, "{audit}");
    let check = audit["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "pinned-environment")
        .cloned()
        .expect("the audit checks environments");
    assert_eq!(check["checked"], jobs, "{check}");
}

/// The record of a refused job: the last action on n0 is `run_sft`, rejected by
/// `environment-pinned`, with no job; the trainer never ran and no job directory exists.
fn assert_refused_and_not_run(root: &Path, err: &Value) -> String {
    assert_eq!(err["kind"], "rejected", "{err}");
    assert_eq!(err["rule"], "environment-pinned", "{err}");
    let repo = git2::Repository::open(root).expect("repo");
    let tip = repo
        .find_reference("refs/heads/rsim/n/n0")
        .expect("n0")
        .peel_to_commit()
        .expect("tip");
    let msg = tip.message().expect("msg").to_string();
    assert!(
        msg.starts_with("run_sft: rejected by environment-pinned"),
        "{msg}"
    );
    assert!(msg.contains("Rsim-Decision: rejected"), "{msg}");
    assert!(
        !msg.contains("Rsim-Env"),
        "no environment is recorded: {msg}"
    );
    assert!(!msg.contains("Rsim-Job"), "no job is recorded: {msg}");
    let jobs: Vec<_> = std::fs::read_dir(root.join(".rsim/jobs"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name())
                .filter(|n| n != "slots")
                .collect()
        })
        .unwrap_or_default();
    assert!(jobs.is_empty(), "no job directory: {jobs:?}");
    err["message"].as_str().unwrap_or_default().to_string()
}

#[test]
fn studies_starting_at_once_on_a_fresh_nix_run_in_their_flakes_pinned_by_nar_hash() {
    if !nix_works() {
        return;
    }
    let nix = FreshNix::new();
    // Two flakes, each in two studies: four first uses of the fresh store at once, the race
    // that made `nix flake metadata` fail (without its retries, one run in ten failed here).
    let studies: Vec<_> = (0..4)
        .map(|i| {
            let flake = if i % 2 == 0 {
                FLAKE.to_string()
            } else {
                FLAKE.replace("inside-nix\";", "inside-nix\"; OTHER = \"b\";")
            };
            study(&flake, "")
        })
        .collect();
    let runs: Vec<_> = studies
        .iter()
        .map(|(_, root)| {
            nix.rsim(root, &["call", "run_sft", SFT], None)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn rsim")
        })
        .collect();
    let envs: Vec<String> = runs
        .into_iter()
        .zip(&studies)
        .map(|(c, (_, root))| {
            let out = c.wait_with_output().expect("wait");
            let env = assert_pinned(root, &result(&out));
            assert_record_clean(&nix, root, 1);
            env
        })
        .collect();
    let hash = |e: &String| e.rsplit_once('#').map(|(_, h)| h.to_string());
    assert_eq!(hash(&envs[0]), hash(&envs[2]), "one flake, one hash");
    assert_ne!(
        hash(&envs[0]),
        hash(&envs[1]),
        "different flakes, different hashes"
    );
}

#[test]
fn a_job_runs_the_flake_that_was_hashed_even_when_its_files_change_before_it_starts() {
    if !nix_works() {
        return;
    }
    let nix = FreshNix::new();
    let (_d, root) = study(
        FLAKE,
        "[backend]\nkind = \"local\"\nmax_parallel_jobs = 1\n",
    );
    // Hold the study's only job slot: the job is pinned and admitted, then waits for it.
    let slot = rsi_master::jobs::acquire_slot(&root.join(".rsim/jobs/slots"), 1, || false)
        .expect("slot")
        .expect("held");
    let child = nix
        .rsim(&root, &["call", "run_sft", SFT], None)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn rsim");
    let jobs = root.join(".rsim/jobs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let admitted = || {
        std::fs::read_dir(&jobs)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .any(|e| e.file_name().to_string_lossy().starts_with("j-"))
            })
            .unwrap_or(false)
    };
    while !admitted() {
        assert!(
            std::time::Instant::now() < deadline,
            "the job was never admitted"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The flake changes between the pin and `nix develop`: the changed shell would fail the
    // trainer (its marker is no longer `inside-nix`).
    std::fs::write(
        root.join("env/flake.nix"),
        FLAKE.replace("\"inside-nix\"", "\"changed-after-pinning\""),
    )
    .expect("write");
    drop(slot);
    let first = result(&child.wait_with_output().expect("wait"));
    let env = assert_pinned(&root, &first);
    // The next job pins the changed flake: another hash, and its trainer sees the change.
    let again = result(&nix.run_sft(&root, None));
    assert_ne!(again["job"]["env"].as_str(), Some(env.as_str()), "{again}");
    assert!(rsi_master::jobs::is_pinned(
        again["job"]["env"].as_str().unwrap_or_default()
    ));
    assert_eq!(again["job"]["state"], "failed", "{again}");
    assert_eq!(again["job"]["exit_code"], 7, "{again}");
    assert_record_clean(&nix, &root, 2);
}

#[test]
fn a_flake_nix_cannot_read_is_refused_with_nixs_message_and_its_job_never_runs() {
    if !nix_works() {
        return;
    }
    let nix = FreshNix::new();
    let (_d, root) = study(
        "{ outputs = { self }: { devShells = this is not nix; }; }\n",
        "",
    );
    let err = error(&nix.run_sft(&root, None));
    let message = assert_refused_and_not_run(&root, &err);
    assert!(
        message.contains("undefined variable 'this'"),
        "Nix's own message: {message}"
    );
    assert!(!message.contains("unresolved"), "{message}");
    assert_record_clean(&nix, &root, 0);
}

/// A `nix` before the real one on PATH: `nix flake metadata` fails with `message` the first
/// `fail` times (counted in `dir/calls`); everything else, and later calls, run the real Nix.
fn nix_shim(dir: &Path, fail: u32, message: &str) -> PathBuf {
    let real = std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("nix"))
                .find(|p| p.is_file())
        })
        .expect("nix on PATH");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    std::fs::write(dir.join("message"), message).expect("message");
    let script = format!(
        "#!/bin/sh\nif [ \"$1 $2\" = \"flake metadata\" ]; then\n  n=$(cat '{d}/calls' 2>/dev/null || echo 0); n=$((n+1)); echo $n > '{d}/calls'\n  if [ $n -le {fail} ]; then printf 'error: ' >&2; cat '{d}/message' >&2; echo >&2; exit 1; fi\nfi\nexec '{real}' \"$@\"\n",
        d = dir.display(),
        real = real.display()
    );
    let tmp = bin.join("nix.tmp");
    std::fs::write(&tmp, script).expect("shim");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::rename(&tmp, bin.join("nix")).expect("rename");
    bin
}

fn metadata_calls(dir: &Path) -> u32 {
    std::fs::read_to_string(dir.join("calls"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn when_nix_flake_metadata_fails_the_job_does_not_run_though_nix_develop_would() {
    if !nix_works() {
        return;
    }
    let nix = FreshNix::new();
    let shim = tempfile::tempdir().expect("tempdir");
    let bin = nix_shim(
        shim.path(),
        u32::MAX,
        "forced failure of nix flake metadata",
    );
    let (_d, root) = study(FLAKE, "");
    let err = error(&nix.run_sft(&root, Some(&bin)));
    let message = assert_refused_and_not_run(&root, &err);
    assert!(
        message.contains("error: forced failure of nix flake metadata"),
        "{message}"
    );
    assert_eq!(
        metadata_calls(shim.path()),
        1,
        "a failure a retry cannot cure is not retried"
    );
    assert_record_clean(&nix, &root, 0);
}

#[test]
fn a_transient_nix_failure_is_retried_and_the_job_runs_pinned() {
    if !nix_works() {
        return;
    }
    let nix = FreshNix::new();
    let shim = tempfile::tempdir().expect("tempdir");
    let bin = nix_shim(
        shim.path(),
        2,
        "SQLite database '/nix/var/nix/db/db.sqlite' is busy",
    );
    let (_d, root) = study(FLAKE, "");
    let sft = result(&nix.run_sft(&root, Some(&bin)));
    assert_pinned(&root, &sft);
    assert_eq!(metadata_calls(shim.path()), 3, "two failures, then pinned");
    assert_record_clean(&nix, &root, 1);
}
