//! Jobs: the compute behind `run_sft` and `evaluate`, behind one seam.
//!
//! The Experiment OS builds a `JobSpec` (command wrapped for its environment, limits, the typed
//! parameters of `protocol`) and hands it to a `JobRunner`, a job backend: `local::LocalRunner`
//! (child processes here) or `slurm::SlurmRunner` (batch jobs on a Slurm cluster). The backend is
//! chosen here only: for new jobs from the study's config (`runner_for`), for a job that already
//! has a directory from what the directory holds (`runner_of_job`), so the core never names a
//! backend. `protocol` is what a job program reads and writes.

pub mod environment;
pub mod local;
pub mod protocol;
pub mod pyenv;
pub mod sandbox;
pub mod slurm;

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use environment::{NixPin, host_fingerprint, is_pinned, pin_flake};
pub use pyenv::PythonPin;

/// A study's job environment pinned before a job is admitted (`host` needs none: it is
/// fingerprinted per command).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvPin {
    /// A Nix flake pinned to its narHash.
    Nix(NixPin),
    /// A Python environment checked against its lock.
    Python(PythonPin),
}

/// Pin a study's job environment before a job is admitted (building nothing): `None` for `host`
/// (fingerprinted per command), a Nix flake pinned to its narHash, or a Python environment
/// checked against its lock; an error — Nix's own words, or what drifted — when it cannot be.
pub fn pin_environment(
    study_root: &Path,
    env: &crate::config::Environment,
) -> Result<Option<EnvPin>> {
    use crate::config::Environment;
    Ok(match env {
        Environment::Host => None,
        Environment::Nix { flake } => Some(EnvPin::Nix(pin_flake(study_root, flake)?)),
        Environment::Python { .. } => match env.python() {
            Some(cfg) => Some(EnvPin::Python(pyenv::pin(study_root, &cfg)?)),
            None => None,
        },
    })
}

impl EnvPin {
    /// The environment as the record names it (`JobRecord.env`, `Rsim-Env`).
    pub fn label(&self) -> String {
        match self {
            EnvPin::Nix(p) => p.label(),
            EnvPin::Python(p) => p.label(),
        }
    }
}
pub use local::LocalRunner;
pub use protocol::{JobParams, Progress, progress_in};

use crate::model::{JobKind, JobRecord};
use crate::util::error::{Error, IoContext, Result};

/// Environment variables a job may inherit; everything else (API keys, tokens, credentials) is dropped.
pub const ENV_ALLOWLIST: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"];

/// The variables the compute libraries a job may use read for their thread pools: rayon and
/// candle, OpenMP (PyTorch's intra-op pool), MKL, OpenBLAS. Each is set to the job's threads
/// (`JobLimits::threads`), so jobs side by side do not oversubscribe the cores.
pub const THREAD_VARS: &[&str] = &[
    "RAYON_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
];

/// The thread variables of a job and their value (none when its threads are left to it).
pub fn thread_env(limits: &crate::config::JobLimits) -> Vec<(&'static str, String)> {
    limits
        .threads
        .map(|n| THREAD_VARS.iter().map(|k| (*k, n.to_string())).collect())
        .unwrap_or_default()
}

/// What a runner needs to run one job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobSpec {
    pub id: String,
    /// argv; the spec file path is appended.
    pub command: Vec<String>,
    /// Working directory of the job (holds spec.json, out/, log).
    pub dir: PathBuf,
    pub timeout_s: u64,
    /// Environment label recorded with the job.
    pub env: String,
    /// Run the job in its own network namespace (no network at all).
    #[serde(default)]
    pub isolate_network: bool,
    /// The study requires isolation (`policy.require_network_isolation`): a backend that finds it
    /// cannot isolate the job where it runs (a Slurm node) fails the job instead of running it.
    #[serde(default)]
    pub require_isolation: bool,
    #[serde(default)]
    pub limits: JobLimits,
    /// Where the job slots (lock files) live: at most `limits.max_parallel` jobs run at once,
    /// across every process of the study.
    #[serde(default)]
    pub slots_dir: Option<PathBuf>,
    /// What the job reads, written to `spec.json` for the command to read.
    pub params: JobParams,
    /// What the job's program may touch, written to `sandbox.json` for the wrapper its command
    /// starts with (`rsim job sandbox`); none when the study turned the sandbox off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<sandbox::Sandbox>,
}

impl JobSpec {
    pub fn kind(&self) -> JobKind {
        self.params.kind()
    }
    pub fn out_dir(&self) -> PathBuf {
        self.dir.join(protocol::OUT_DIR)
    }
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(crate::model::paths::JOB_LOG_FILE)
    }
    pub fn spec_path(&self) -> PathBuf {
        self.dir.join(protocol::SPEC_FILE)
    }

    /// Make the job's directory: `out/`, `spec.json` and, for a sandboxed job, `sandbox.json`.
    pub fn prepare_dir(&self) -> Result<()> {
        fs::create_dir_all(self.out_dir()).at("cannot create", &self.out_dir())?;
        mark_ours(&self.dir)?;
        self.params.write(&self.spec_path())?;
        if let Some(sb) = &self.sandbox {
            sandbox::write(sb, &self.dir.join(sandbox::SANDBOX_FILE))?;
        }
        Ok(())
    }
}

pub use crate::config::JobLimits;

/// A held job slot: an exclusive lock on one of `max_parallel` lock files, released on drop.
pub struct Slot {
    _lock: nix::fcntl::Flock<File>,
}

/// Wait for a free slot (polling), or give up when `cancelled()` says so.
pub fn acquire_slot(dir: &Path, max: u32, cancelled: impl Fn() -> bool) -> Result<Option<Slot>> {
    use nix::fcntl::{Flock, FlockArg};
    fs::create_dir_all(dir).at("cannot create", dir)?;
    loop {
        for k in 0..max.max(1) {
            let p = dir.join(format!("{k}.lock"));
            let f = fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&p)
                .at("cannot open", &p)?;
            if let Ok(lock) = Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                return Ok(Some(Slot { _lock: lock }));
            }
        }
        if cancelled() {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Ask a running or queued job to stop (the runner polls for this file, which names who asked).
pub fn request_cancel(job_dir: &Path, by: &str) -> Result<()> {
    if !job_dir.join(protocol::SPEC_FILE).is_file() {
        return Err(Error::not_found(format!("no job at {}", job_dir.display())));
    }
    // Written aside and renamed into place: the runner polls for the file and reads who asked
    // the moment it appears, so it must never see it created but not yet written (the record
    // then said "cancelled on request" without the name).
    let tmp = job_dir.join(format!(".cancel-{:016x}", rand::random::<u64>()));
    fs::write(&tmp, by.as_bytes()).at("cannot write", &tmp)?;
    fs::rename(&tmp, job_dir.join("cancel")).at("cannot write", job_dir)
}

/// Ask the job of `job_dir` to stop, on whichever backend runs it. Only a job this machine
/// started is acted on: a job directory that came with a repository names processes and Slurm
/// jobs that are not its own.
pub fn cancel(job_dir: &Path, by: &str) -> Result<()> {
    if !is_ours(job_dir) {
        return Err(Error::not_found(format!(
            "no job at {} that this machine started (job state rsim did not write here is never acted on)",
            job_dir.display()
        )));
    }
    runner_of_job(job_dir).cancel(job_dir, by)
}

/// The file in a job directory that marks it as started by this user on this machine.
pub const ORIGIN_FILE: &str = "origin";

/// Mark a job directory as this machine's (once, when it is made).
pub fn mark_ours(job_dir: &Path) -> Result<()> {
    let stamp = job_dir.join(ORIGIN_FILE);
    if is_ours(job_dir) {
        return Ok(());
    }
    crate::util::origin::stamp("job", job_dir, &stamp).at("cannot write", &stamp)
}

/// Whether this user started the job of `job_dir` on this machine: the only job state rsim acts
/// on (kills, cancels, re-attaches, records). Never true through a symlink.
pub fn is_ours(job_dir: &Path) -> bool {
    crate::util::origin::is_ours("job", job_dir, &job_dir.join(ORIGIN_FILE))
}

/// A job backend. It runs jobs, and acts on a job it ran from the job's directory alone, so that
/// any rsim process (a later one, after the writer died) can cancel, re-attach or clean up.
pub trait JobRunner: Send + Sync {
    /// Run the job to completion (or failure) and describe what happened. An `Err` means the
    /// runner itself failed; a job that ran and failed is `Ok` with a failed state.
    fn run(&self, spec: &JobSpec) -> Result<JobRecord>;

    /// Ask the queued or running job of `job_dir` to stop, naming who asked (`by`); the process
    /// running it then records it cancelled. Errors with kind `not_found` when there is no job.
    fn cancel(&self, job_dir: &Path, by: &str) -> Result<()>;

    /// Re-attach to the job of `job_dir` whose writing rsim process died: what became of it.
    /// With `block`, wait until it has ended; without, answer `Running` while it is queued or
    /// running (after acting on a cancel request or a passed time limit).
    fn reattach(&self, job_dir: &Path, block: bool) -> Result<Reattach>;

    /// Stop whatever is left of an orphaned job that could not be re-attached (`Reattach::Lost`):
    /// its processes, a submission nobody noted. `job` is its id. Best effort, never fails.
    fn stop_orphan(&self, job_dir: &Path, job: &str);
}

/// What re-attaching to an orphaned job found.
#[derive(Debug)]
pub enum Reattach {
    /// Nothing of the job can be followed any more (a local job dies with its writer; a Slurm
    /// job whose id was never noted): stop its leftovers and record it lost.
    Lost,
    /// Still queued or running; look again later.
    Running,
    /// It has ended: the spec it ran and what happened, to record as its writer would have.
    Ended {
        spec: Box<JobSpec>,
        job: Box<JobRecord>,
    },
}

/// The backend the study's config asks for, to run new jobs.
pub fn runner_for(backend: &crate::config::Backend) -> Box<dyn JobRunner> {
    match backend {
        crate::config::Backend::Local { .. } => Box::new(LocalRunner),
        crate::config::Backend::Slurm(s) => Box::new(slurm::SlurmRunner::new(s.clone())),
    }
}

/// The backend that ran the job of an existing directory, from what the directory holds (a Slurm
/// job's batch script or submitted file), whatever the config says now.
pub fn runner_of_job(job_dir: &Path) -> Box<dyn JobRunner> {
    if slurm::is_slurm_job(job_dir) {
        Box::new(slurm::SlurmRunner::for_submitted())
    } else {
        Box::new(LocalRunner)
    }
}

/// The record of an orphaned job that could not be re-attached (`Reattach::Lost`): it died
/// with the rsim process that ran it, and what was left of it was stopped.
pub fn lost_record(
    id: &str,
    kind: JobKind,
    started_at: &str,
    duration_s: f64,
    command: &[String],
    env: &str,
) -> JobRecord {
    JobRecord {
        id: id.to_string(),
        kind,
        state: crate::model::JobState::Lost,
        exit_code: None,
        started_at: started_at.to_string(),
        finished_at: crate::model::now_rfc3339(),
        duration_s,
        command: command.to_vec(),
        env: env.to_string(),
        network: "shared".into(),
        log: None,
        error: Some(
            "the rsim process that ran this job died before recording it; the job was stopped"
                .into(),
        ),
        compute_s: None,
        slurm: None,
        sandbox: None,
        threads: None,
    }
}

pub fn new_job_id() -> String {
    format!("j-{:016x}", rand::random::<u64>())
}

/// Why a job was cancelled, as its record says it ("cancelled on request by alice").
pub fn cancel_reason(job_dir: &Path) -> String {
    match fs::read_to_string(job_dir.join("cancel")) {
        Ok(by) if !by.trim().is_empty() => format!(
            "cancelled on request by {}",
            crate::util::text::sanitize_line(by.trim())
        ),
        _ => "cancelled on request".into(),
    }
}

/// Whether jobs can be given their own network namespace here (needs CAP_SYS_ADMIN). Probed once.
pub fn network_isolation_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "exit 0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: as in `LocalRunner::run`.
        unsafe {
            cmd.pre_exec(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)
            });
        }
        cmd.status().map(|s| s.success()).unwrap_or(false)
    })
}

/// Why a job that exited with status `c` failed: the status and the end of its log.
pub(crate) fn exit_reason(spec: &JobSpec, c: i32) -> String {
    let tail = log_tail(&spec.log_path());
    if tail.is_empty() {
        format!("exited with status {c}")
    } else {
        format!("exited with status {c}: {tail}")
    }
}

/// Why a job killed by `sig` died, in words.
pub(crate) fn signal_reason(spec: &JobSpec, sig: i32) -> String {
    match nix::sys::signal::Signal::try_from(sig) {
        Ok(nix::sys::signal::Signal::SIGXFSZ) => format!(
            "killed by SIGXFSZ: it wrote a file larger than {} MiB (backend.max_file_mb)",
            spec.limits.max_file_bytes >> 20
        ),
        Ok(s) => format!("killed by signal {s}"),
        Err(_) => format!("killed by signal {sig}"),
    }
}

pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The last `max` bytes of a file (a job's log), as text; None if it cannot be read.
pub fn tail(path: &Path, max: u64) -> Option<String> {
    use std::io::{Seek, SeekFrom};
    let mut f = File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    if len > max {
        f.seek(SeekFrom::Start(len - max)).ok()?;
    }
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// The last few lines of a job's log, to say in the record why it failed.
pub(crate) fn log_tail(path: &Path) -> String {
    let text = tail(path, 2048).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    // Prefer the last line that says "error" (tools print context after it), then the final line.
    let last = lines.last().copied().unwrap_or("");
    match lines
        .iter()
        .rev()
        .find(|l| l.to_lowercase().contains("error") && !l.contains("(ignored)"))
    {
        Some(e) if *e != last => format!("{e} | {last}"),
        Some(e) => e.to_string(),
        None => lines[lines.len().saturating_sub(3)..].join(" | "),
    }
}

/// Resolve a command's program: a path with `/` is taken relative to the study root, a bare name
/// is looked up on PATH. Used to pin the evaluator by hashing its program.
pub fn resolve_program(study_root: &Path, program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = Path::new(program);
        let p = if p.is_absolute() {
            p.to_path_buf()
        } else {
            study_root.join(p)
        };
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// The command with a study-relative program made absolute (jobs run in their own directory).
pub fn absolute_command(study_root: &Path, command: &[String]) -> Vec<String> {
    let mut out = command.to_vec();
    if let Some(first) = out.first_mut()
        && first.contains('/')
        && !Path::new(first.as_str()).is_absolute()
    {
        *first = study_root
            .join(first.as_str())
            .to_string_lossy()
            .into_owned();
    }
    // Arguments that name files in the study (e.g. `python3 jobs/train.py`) are made absolute too.
    for a in out.iter_mut().skip(1) {
        if !a.starts_with('-')
            && a.contains('/')
            && !Path::new(a.as_str()).is_absolute()
            && study_root.join(a.as_str()).exists()
        {
            *a = study_root.join(a.as_str()).to_string_lossy().into_owned();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::error::ErrorKind;

    #[test]
    fn the_backend_of_a_job_directory_is_what_the_directory_holds() {
        let d = tempfile::tempdir().expect("tempdir");
        let dir = d.path();
        // A plain directory is a local job's: nothing outlives its writer.
        assert!(matches!(
            runner_of_job(dir).reattach(dir, false),
            Ok(Reattach::Lost)
        ));
        // A Slurm job's submitted file is read (here: unreadable, so an error, not "lost").
        fs::write(dir.join(slurm::SUBMITTED_FILE), b"{not json").expect("write");
        assert!(runner_of_job(dir).reattach(dir, false).is_err());
        assert!(matches!(
            LocalRunner.reattach(dir, false),
            Ok(Reattach::Lost)
        ));
    }

    #[test]
    fn cancel_needs_a_job_and_leaves_the_request_for_its_runner() {
        let d = tempfile::tempdir().expect("tempdir");
        let dir = d.path();
        let e = cancel(dir, "alice").expect_err("no job here");
        assert_eq!(e.kind, ErrorKind::NotFound);
        fs::write(dir.join(protocol::SPEC_FILE), b"{}").expect("write");
        // A job directory this machine did not make is never acted on.
        let e = cancel(dir, "alice").expect_err("not ours");
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(!dir.join("cancel").exists());
        mark_ours(dir).expect("ours");
        cancel(dir, "alice").expect("cancel");
        assert_eq!(cancel_reason(dir), "cancelled on request by alice");
    }

    #[test]
    fn an_attach_only_slurm_runner_submits_nothing() {
        let d = tempfile::tempdir().expect("tempdir");
        let spec = JobSpec {
            id: new_job_id(),
            command: vec!["true".into()],
            dir: d.path().join("job"),
            timeout_s: 10,
            env: "host".into(),
            isolate_network: false,
            require_isolation: false,
            limits: JobLimits::default(),
            slots_dir: None,
            params: protocol::example_eval(),
            sandbox: None,
        };
        let e = slurm::SlurmRunner::for_submitted()
            .run(&spec)
            .expect_err("no resources to submit with");
        assert!(
            e.message.contains("only acts on submitted jobs"),
            "{}",
            e.message
        );
        assert!(!spec.dir.exists(), "nothing was written");
    }
}
