//! Every path inside a study that is not the record: the `.rsim/` state directory, in one place.
//! (The record itself is git; `rsim.toml` is `config::CONFIG_FILE`.)

use std::path::{Path, PathBuf};

/// Where the study keeps what is not in git (git-ignored).
pub const STATE_DIR: &str = ".rsim";
/// A job's intent, written before it runs (what to record if its writer dies).
pub const INTENT_FILE: &str = "intent.json";
/// Present once a job's action is recorded.
pub const RECORDED_FILE: &str = "recorded";
/// A job's combined stdout and stderr.
pub const JOB_LOG_FILE: &str = "job.log";
/// The model description inside every checkpoint directory.
pub const CHECKPOINT_CONFIG_FILE: &str = "config.json";

pub fn state_dir(root: &Path) -> PathBuf {
    root.join(STATE_DIR)
}
/// The SQLite index derived from git.
pub fn index_path(root: &Path) -> PathBuf {
    state_dir(root).join("index.sqlite")
}
/// The content-addressed object store.
pub fn objects_dir(root: &Path) -> PathBuf {
    state_dir(root).join("objects")
}
/// Every job's directory lives here.
pub fn jobs_dir(root: &Path) -> PathBuf {
    state_dir(root).join("jobs")
}
/// One job's directory (its spec, log, outputs, cancel file).
pub fn job_dir(root: &Path, job: &str) -> PathBuf {
    jobs_dir(root).join(job)
}
/// Lock files that bound how many jobs run at once across processes.
pub fn slots_dir(root: &Path) -> PathBuf {
    jobs_dir(root).join("slots")
}
/// Cached host fingerprints of job programs.
pub fn fingerprints_dir(root: &Path) -> PathBuf {
    state_dir(root).join("fingerprints")
}
/// Protected eval sets of the built-in examples.
pub fn protected_dir(root: &Path) -> PathBuf {
    state_dir(root).join("protected")
}
/// The study's record-signing key (never in git; every commit is signed with it).
pub fn signing_key_path(root: &Path) -> PathBuf {
    state_dir(root).join("keys").join("record-signing-key")
}
/// The study's secret salt (the generator's draws cannot be recomputed outside the study).
pub fn secret_path(root: &Path) -> PathBuf {
    state_dir(root).join("secret")
}

/// What the contamination gate read each program it ran as, on the study's probes
/// (`train::behaviour::Reader`): one JSON line a program.
pub fn gate_readings_path(root: &Path) -> PathBuf {
    state_dir(root).join("gate-readings.jsonl")
}
