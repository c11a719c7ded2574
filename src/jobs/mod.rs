//! Jobs: the compute behind `run_sft` and `evaluate`. The Experiment OS hands a `JobSpec` to a
//! `JobRunner`; the runner executes the study's configured command as a child process and
//! reports what happened. `LocalRunner` runs it on this machine in its own process group, with a
//! scrubbed environment, its output captured to a log, and a wall-clock timeout.

pub mod slurm;

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::model::{JobKind, JobRecord, JobState, now_rfc3339};
use crate::util::error::{Error, IoContext, Result};
use crate::util::proc::process_alive;

/// Environment variables a job may inherit; everything else (API keys, tokens, credentials) is dropped.
pub const ENV_ALLOWLIST: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"];

/// What a runner needs to run one job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobSpec {
    pub id: String,
    pub kind: JobKind,
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
    /// The job's parameters, written to `spec.json` for the command to read.
    pub params: serde_json::Value,
}

impl JobSpec {
    pub fn out_dir(&self) -> PathBuf {
        self.dir.join("out")
    }
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("job.log")
    }
    pub fn spec_path(&self) -> PathBuf {
        self.dir.join("spec.json")
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
    if !job_dir.join("spec.json").is_file() {
        return Err(Error::not_found(format!("no job at {}", job_dir.display())));
    }
    fs::write(job_dir.join("cancel"), by.as_bytes()).at("cannot write", job_dir)
}

/// Ask a running or queued job to stop, on whichever backend runs it: every runner polls the
/// cancel file; a Slurm job is also cancelled at once, even when no rsim process waits for it.
pub fn cancel(job_dir: &Path, by: &str) -> Result<()> {
    request_cancel(job_dir, by)?;
    slurm::cancel(job_dir)
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

/// Runs jobs. Backends (`LocalRunner`, `crate::jobs::slurm::SlurmRunner`) implement this.
pub trait JobRunner: Send + Sync {
    /// Run the job to completion (or failure) and describe what happened. An `Err` means the
    /// runner itself failed; a job that ran and failed is `Ok` with a failed state.
    fn run(&self, spec: &JobSpec) -> Result<JobRecord>;
}

/// Runs each job as a child process on this machine.
#[derive(Debug, Clone, Default)]
pub struct LocalRunner;

pub fn new_job_id() -> String {
    format!("j-{:016x}", rand::random::<u64>())
}

impl JobRunner for LocalRunner {
    fn run(&self, spec: &JobSpec) -> Result<JobRecord> {
        fs::create_dir_all(spec.out_dir()).at("cannot create", &spec.out_dir())?;
        let spec_path = spec.spec_path();
        fs::write(&spec_path, crate::util::hash::json_bytes(&spec.params)?)
            .at("cannot write", &spec_path)?;
        let log_path = spec.log_path();
        let log = File::create(&log_path).at("cannot create", &log_path)?;
        let log2 = log.try_clone().at("cannot open", &log_path)?;

        let cancel_file = spec.dir.join("cancel");
        let queued = Instant::now();
        let _slot = match &spec.slots_dir {
            Some(d) => match acquire_slot(d, spec.limits.max_parallel, || cancel_file.exists())? {
                Some(slot) => Some(slot),
                None => {
                    let now = now_rfc3339();
                    return Ok(JobRecord {
                        id: spec.id.clone(),
                        kind: spec.kind,
                        state: JobState::Cancelled,
                        exit_code: None,
                        started_at: now.clone(),
                        finished_at: now,
                        duration_s: 0.0,
                        command: spec.command.clone(),
                        env: spec.env.clone(),
                        network: "shared".into(),
                        log: None,
                        error: Some(format!(
                            "cancelled while queued for {:.1} s",
                            queued.elapsed().as_secs_f64()
                        )),
                        compute_s: None,
                        slurm: None,
                    });
                }
            },
            None => None,
        };
        let started_at = now_rfc3339();
        let start = Instant::now();
        let (program, args) = spec
            .command
            .split_first()
            .ok_or_else(|| Error::invalid(format!("job {}: empty command", spec.id)))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .arg(&spec_path)
            .current_dir(&spec.dir)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        for k in ENV_ALLOWLIST {
            if let Ok(v) = std::env::var(k) {
                cmd.env(k, v);
            }
        }
        cmd.env("RSIM_JOB_ID", &spec.id)
            .env("RSIM_JOB_DIR", &spec.dir)
            .env("RSIM_JOB_SPEC", &spec_path)
            .env("RSIM_JOB_OUT", spec.out_dir());
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
            let (fsize, mem) = (spec.limits.max_file_bytes, spec.limits.max_memory_bytes);
            // SAFETY: setrlimit(2) is a system call; the closure allocates nothing.
            unsafe {
                cmd.pre_exec(move || {
                    use nix::sys::resource::{Resource, setrlimit};
                    setrlimit(Resource::RLIMIT_CORE, 0, 0).map_err(std::io::Error::from)?;
                    setrlimit(Resource::RLIMIT_FSIZE, fsize, fsize)
                        .map_err(std::io::Error::from)?;
                    if let Some(m) = mem {
                        setrlimit(Resource::RLIMIT_AS, m, m).map_err(std::io::Error::from)?;
                    }
                    Ok(())
                });
            }
            if spec.isolate_network {
                // SAFETY: unshare(2) is a single system call; the closure allocates nothing.
                unsafe {
                    cmd.pre_exec(|| {
                        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                            .map_err(std::io::Error::from)
                    });
                }
            }
        }
        let finish = |state: JobState, exit_code: Option<i32>, error: Option<String>| JobRecord {
            id: spec.id.clone(),
            kind: spec.kind,
            state,
            exit_code,
            started_at: started_at.clone(),
            finished_at: now_rfc3339(),
            duration_s: round3(start.elapsed().as_secs_f64()),
            command: spec.command.clone(),
            env: spec.env.clone(),
            network: if spec.isolate_network {
                "isolated"
            } else {
                "shared"
            }
            .to_string(),
            log: None,
            error,
            compute_s: None,
            slurm: None,
        };
        let spawned = cmd.spawn();
        if let Ok(c) = &spawned {
            let _ = fs::write(spec.dir.join("pid"), c.id().to_string());
        }
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                return Ok(finish(
                    JobState::Failed,
                    None,
                    Some(format!("cannot start {program:?}: {e}")),
                ));
            }
        };
        let deadline = Duration::from_secs(spec.timeout_s);
        let mut sleep = Duration::from_millis(1);
        loop {
            match child.try_wait().at("cannot wait for job", &spec.dir)? {
                Some(status) => {
                    let code = status.code();
                    return Ok(match code {
                        Some(0) => finish(JobState::Succeeded, code, None),
                        Some(c) => finish(JobState::Failed, code, Some(exit_reason(spec, c))),
                        None => {
                            use std::os::unix::process::ExitStatusExt;
                            let sig = status.signal().unwrap_or(0);
                            finish(JobState::Failed, None, Some(signal_reason(spec, sig)))
                        }
                    });
                }
                None if cancel_file.exists() => {
                    kill_group(child.id());
                    let _ = child.wait();
                    return Ok(finish(
                        JobState::Cancelled,
                        None,
                        Some(cancel_reason(&spec.dir)),
                    ));
                }
                None if start.elapsed() >= deadline => {
                    kill_group(child.id());
                    let _ = child.wait();
                    return Ok(finish(
                        JobState::TimedOut,
                        None,
                        Some(format!(
                            "exceeded the wall-clock limit of {} s",
                            spec.timeout_s
                        )),
                    ));
                }
                None => {
                    std::thread::sleep(sleep);
                    sleep = (sleep * 2).min(Duration::from_millis(50));
                }
            }
        }
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

/// Stop whatever is left of a job (its process group), given its directory.
pub fn stop_job(job_dir: &Path) {
    if let Some(pid) = fs::read_to_string(job_dir.join("pid"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        && process_alive(pid)
    {
        kill_group(pid);
    }
}

fn kill_group(pid: u32) {
    use nix::sys::signal::{Signal, killpg};
    use nix::unistd::Pid;
    if let Ok(pid) = i32::try_from(pid) {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The `host` environment as recorded with a job: the program's sha256 (first 16 hex digits), the
/// kernel and the architecture, e.g. `host program=rsim@1a2b… kernel=Linux-6.1 arch=x86_64`.
/// Hashing a ~250 MB debug rsim takes about a second, so hashes are cached in `cache_dir` keyed by
/// the program's path, size and modification time (shared by every process of the study).
pub fn host_fingerprint(study_root: &Path, command: &[String], cache_dir: &Path) -> Result<String> {
    let mut out = String::from("host");
    if let Some(prog) = command.first().and_then(|p| resolve_program(study_root, p)) {
        let meta = fs::metadata(&prog).at("cannot stat", &prog)?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        let key = crate::util::hash::sha256_hex(
            format!("{}\0{}\0{mtime}", prog.display(), meta.len()).as_bytes(),
        );
        let entry = cache_dir.join(&key[..32]);
        let sha = match fs::read_to_string(&entry) {
            Ok(s) if crate::util::hash::is_sha256(s.trim()) => s.trim().to_string(),
            _ => {
                let s = crate::util::hash::sha256_file(&prog)?;
                fs::create_dir_all(cache_dir).at("cannot create", cache_dir)?;
                let tmp = cache_dir.join(format!("{}.{}.tmp", &key[..32], std::process::id()));
                fs::write(&tmp, &s).at("cannot write", &tmp)?;
                fs::rename(&tmp, &entry).at("cannot write", &entry)?;
                s
            }
        };
        let name = prog
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        out.push_str(&format!(" program={name}@{}", &sha[..16]));
    }
    if let Ok(u) = nix::sys::utsname::uname() {
        out.push_str(&format!(
            " kernel={}-{} arch={}",
            u.sysname().to_string_lossy(),
            u.release().to_string_lossy(),
            u.machine().to_string_lossy()
        ));
    }
    Ok(out)
}

/// Run `command` inside a Nix flake's dev shell (`nix develop FLAKE --command ...`), and label the
/// environment with the flake's `narHash` from `nix flake metadata --json`, e.g.
/// `nix:path:/study/env#sha256-…`. A flake given as a relative path is taken inside the study
/// (point it at a folder holding flake.nix, not at the study root, or Nix copies the object store).
/// When the metadata cannot be read the label says `#unresolved` and the job itself fails with
/// Nix's error in its log.
pub fn nix_environment(
    study_root: &Path,
    flake: &str,
    command: Vec<String>,
) -> Result<(Vec<String>, String)> {
    let reference = if flake.contains(':') {
        flake.to_string()
    } else {
        crate::config::check_relative_path(flake)
            .map_err(|m| Error::invalid(format!("environment.flake: {m}")))?;
        format!("path:{}", study_root.join(flake).display())
    };
    let hash = Command::new("nix")
        .args(["flake", "metadata", "--json", &reference])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .and_then(|v| {
            v["locked"]["narHash"]
                .as_str()
                .or(v["narHash"].as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unresolved".to_string());
    let mut wrapped = vec![
        "nix".to_string(),
        "develop".to_string(),
        reference.clone(),
        "--command".to_string(),
    ];
    wrapped.extend(command);
    Ok((wrapped, format!("nix:{reference}#{hash}")))
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

/// What a running job's log says about its progress: the last `step k/n …` line the trainers
/// print (`pretrain step …` for pretraining).
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub step: u64,
    pub total: Option<u64>,
    pub line: String,
}

/// Parse the newest progress line out of a log's tail.
pub fn progress_in(log: &str) -> Option<Progress> {
    for line in log.lines().rev() {
        let l = line.trim();
        let rest = l
            .strip_prefix("step ")
            .or_else(|| l.strip_prefix("pretrain step "));
        if let Some(rest) = rest {
            let frac = rest.split_whitespace().next()?;
            let (step, total) = match frac.split_once('/') {
                Some((k, n)) => (k.parse().ok()?, n.parse().ok()),
                None => (frac.parse().ok()?, None),
            };
            return Some(Progress {
                step,
                total,
                line: l.to_string(),
            });
        }
    }
    None
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

    fn spec(dir: &Path, command: &[&str], timeout_s: u64) -> JobSpec {
        JobSpec {
            id: new_job_id(),
            kind: JobKind::Sft,
            command: command.iter().map(|s| s.to_string()).collect(),
            dir: dir.join("job"),
            timeout_s,
            env: "host".into(),
            isolate_network: false,
            require_isolation: false,
            limits: JobLimits::default(),
            slots_dir: None,
            params: serde_json::json!({"hello": 1}),
        }
    }

    #[test]
    fn runs_a_real_process_and_captures_output() {
        let d = tempfile::tempdir().expect("tempdir");
        let s = spec(
            d.path(),
            &[
                "sh",
                "-c",
                "cat \"$1\"; echo out > \"$RSIM_JOB_OUT/x\"",
                "sh",
            ],
            10,
        );
        let r = LocalRunner.run(&s).expect("run");
        assert_eq!(r.state, JobState::Succeeded, "{r:?}");
        assert_eq!(
            fs::read_to_string(s.out_dir().join("x")).expect("out"),
            "out\n"
        );
        assert!(
            fs::read_to_string(s.log_path())
                .expect("log")
                .contains("\"hello\": 1")
        );
    }

    #[test]
    fn failure_timeout_and_missing_program_are_reported() {
        let d = tempfile::tempdir().expect("tempdir");
        let r = LocalRunner
            .run(&spec(d.path(), &["sh", "-c", "exit 3", "sh"], 10))
            .expect("run");
        assert_eq!((r.state, r.exit_code), (JobState::Failed, Some(3)));
        let d = tempfile::tempdir().expect("tempdir");
        let t = Instant::now();
        let r = LocalRunner
            .run(&spec(
                d.path(),
                &["sh", "-c", "sleep 30 & sleep 30", "sh"],
                1,
            ))
            .expect("run");
        assert_eq!(r.state, JobState::TimedOut);
        assert!(t.elapsed() < Duration::from_secs(20));
        let d = tempfile::tempdir().expect("tempdir");
        let r = LocalRunner
            .run(&spec(d.path(), &["/nonexistent/prog"], 10))
            .expect("run");
        assert_eq!(r.state, JobState::Failed);
        assert!(r.error.unwrap_or_default().contains("cannot start"));
    }

    #[test]
    fn isolated_jobs_have_no_network() {
        if !network_isolation_available() {
            eprintln!("skipped: this machine cannot create network namespaces");
            return;
        }
        // A listener on loopback in our namespace: a shared job reaches it, an isolated one cannot.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let probe = format!(
            "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\""
        );
        let d = tempfile::tempdir().expect("tempdir");
        let mut s = spec(d.path(), &["sh", "-c", &probe, "sh"], 20);
        let shared = LocalRunner.run(&s).expect("run");
        assert_eq!(shared.state, JobState::Succeeded, "{shared:?}");
        s.isolate_network = true;
        s.dir = d.path().join("job2");
        let isolated = LocalRunner.run(&s).expect("run");
        assert_eq!(
            isolated.state,
            JobState::Failed,
            "no network in an isolated job"
        );
        assert_eq!(isolated.network, "isolated");
    }

    #[test]
    fn a_job_flooding_its_log_is_stopped_and_the_reason_recorded() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut s = spec(d.path(), &["sh", "-c", "yes flood", "sh"], 30);
        s.limits.max_file_bytes = 1 << 20;
        let r = LocalRunner.run(&s).expect("run");
        assert_eq!(r.state, JobState::Failed);
        assert!(r.error.unwrap_or_default().contains("SIGXFSZ"));
        assert!(fs::metadata(s.log_path()).expect("log").len() <= 1 << 20);
    }

    #[test]
    fn cancel_stops_a_running_job() {
        let d = tempfile::tempdir().expect("tempdir");
        let s = spec(d.path(), &["sh", "-c", "sleep 30", "sh"], 60);
        let dir = s.dir.clone();
        let t = std::thread::spawn(move || {
            for _ in 0..100 {
                if request_cancel(&dir, "test").is_ok() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let start = Instant::now();
        let r = LocalRunner.run(&s).expect("run");
        t.join().expect("thread");
        assert_eq!(r.state, JobState::Cancelled);
        assert!(start.elapsed() < Duration::from_secs(20));
    }

    #[test]
    fn at_most_n_jobs_run_at_once() {
        let d = tempfile::tempdir().expect("tempdir");
        let slots = d.path().join("slots");
        let handles: Vec<_> = (0..3)
            .map(|i| {
                let mut s = spec(
                    &d.path().join(format!("j{i}")),
                    &["sh", "-c", "date +%s.%N; sleep 0.4; date +%s.%N", "sh"],
                    30,
                );
                s.limits.max_parallel = 1;
                s.slots_dir = Some(slots.clone());
                std::thread::spawn(move || {
                    let r = LocalRunner.run(&s).expect("run");
                    assert_eq!(r.state, JobState::Succeeded);
                    let log = fs::read_to_string(s.log_path()).expect("log");
                    let ts: Vec<f64> = log.lines().filter_map(|l| l.trim().parse().ok()).collect();
                    (ts[0], ts[1])
                })
            })
            .collect();
        let mut spans: Vec<(f64, f64)> = handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect();
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in spans.windows(2) {
            assert!(
                w[1].0 >= w[0].1 - 0.01,
                "jobs overlapped with one slot: {spans:?}"
            );
        }
    }

    #[test]
    fn secrets_do_not_reach_jobs() {
        // SAFETY: test-only; no other thread of this test reads the variable concurrently.
        unsafe { std::env::set_var("OPENAI_API_KEY", "sk-secret") };
        let d = tempfile::tempdir().expect("tempdir");
        let s = spec(d.path(), &["sh", "-c", "env", "sh"], 10);
        LocalRunner.run(&s).expect("run");
        let log = fs::read_to_string(s.log_path()).expect("log");
        assert!(!log.contains("sk-secret"));
        assert!(log.contains("RSIM_JOB_ID="));
    }
}
