//! The `local` job backend: each job is a child process on this machine, in its own process group
//! (and network namespace where the platform allows it), with a scrubbed environment, rlimits,
//! its output captured to its log, a wall-clock timeout, a cancel file, and at most N jobs at
//! once across every process of the study (flock'd slot files). Nothing outlives the rsim process
//! that ran it: an orphan's processes are stopped and its job recorded lost.

use std::fs::{self, File};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::jobs::{
    ENV_ALLOWLIST, JobRunner, JobSpec, Reattach, acquire_slot, cancel_reason, exit_reason,
    request_cancel, round3, signal_reason,
};
use crate::model::{JobRecord, JobState, now_rfc3339};
use crate::util::error::{Error, IoContext, Result};

/// The child's process id, written when it starts (to stop an orphan's process group).
const PID_FILE: &str = "pid";

/// Runs each job as a child process on this machine.
#[derive(Debug, Clone, Default)]
pub struct LocalRunner;

impl JobRunner for LocalRunner {
    fn run(&self, spec: &JobSpec) -> Result<JobRecord> {
        spec.prepare_dir()?;
        let spec_path = spec.spec_path();
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
                        kind: spec.kind(),
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
                        sandbox: None,
                        threads: None,
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
        for (k, v) in crate::jobs::thread_env(&spec.limits) {
            cmd.env(k, v);
        }
        cmd.env("RSIM_JOB_ID", &spec.id)
            .env("RSIM_JOB_DIR", &spec.dir)
            .env("RSIM_JOB_SPEC", &spec_path)
            .env("RSIM_JOB_OUT", spec.out_dir());
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
            let (fsize, mem) = (spec.limits.max_file_bytes, spec.limits.max_memory_bytes);
            let runner = nix::unistd::getpid();
            // SAFETY: prctl(2), getppid(2) and setrlimit(2) are system calls; the closure
            // allocates nothing.
            unsafe {
                cmd.pre_exec(move || {
                    // The job dies with the thread that runs it (which waits for it to the end):
                    // a killed rsim leaves no job training on for ever, also when nobody opens
                    // the study again to stop its orphans (the study may be gone).
                    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                        .map_err(std::io::Error::from)?;
                    if nix::unistd::getppid() != runner {
                        return Err(std::io::Error::other("the rsim that ran the job exited"));
                    }
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
            kind: spec.kind(),
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
            sandbox: crate::jobs::sandbox::outcome(spec.sandbox.as_ref(), &spec.dir, true),
            threads: spec.limits.threads,
        };
        let spawned = cmd.spawn();
        if let Ok(c) = &spawned {
            // The process group is named by its leader's pid, boot and start time: a recycled
            // pid is never killed for it.
            if let Some(me) = crate::util::origin::ProcessStamp::of(c.id()) {
                let _ = fs::write(spec.dir.join(PID_FILE), me.line());
            }
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

    fn cancel(&self, job_dir: &Path, by: &str) -> Result<()> {
        request_cancel(job_dir, by)
    }

    fn reattach(&self, _job_dir: &Path, _block: bool) -> Result<Reattach> {
        Ok(Reattach::Lost)
    }

    fn stop_orphan(&self, job_dir: &Path, _job: &str) {
        if !crate::jobs::is_ours(job_dir) {
            return;
        }
        if let Some(leader) = fs::read_to_string(job_dir.join(PID_FILE))
            .ok()
            .and_then(|s| crate::util::origin::ProcessStamp::parse_line(&s))
            && leader.alive()
        {
            kill_group(leader.pid);
        }
    }
}

fn kill_group(pid: u32) {
    use nix::sys::signal::{Signal, killpg};
    use nix::unistd::Pid;
    if let Ok(pid) = i32::try_from(pid) {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::{JobLimits, network_isolation_available, new_job_id};

    fn spec(dir: &Path, command: &[&str], timeout_s: u64) -> JobSpec {
        JobSpec {
            id: new_job_id(),
            command: command.iter().map(|s| s.to_string()).collect(),
            dir: dir.join("job"),
            timeout_s,
            env: "host".into(),
            isolate_network: false,
            require_isolation: false,
            limits: JobLimits::default(),
            slots_dir: None,
            params: crate::jobs::protocol::example_eval(),
            sandbox: None,
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
                .contains("\"kind\": \"evaluate\"")
        );
    }

    #[test]
    fn a_job_gets_its_threads_in_every_pool_variable_and_its_record_says_so() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut s = spec(
            d.path(),
            &[
                "sh",
                "-c",
                "echo \"$RAYON_NUM_THREADS $OMP_NUM_THREADS $MKL_NUM_THREADS $OPENBLAS_NUM_THREADS\" > \"$RSIM_JOB_OUT/t\"",
                "sh",
            ],
            10,
        );
        s.limits.threads = Some(3);
        let r = LocalRunner.run(&s).expect("run");
        assert_eq!(r.state, JobState::Succeeded, "{r:?}");
        assert_eq!(r.threads, Some(3));
        assert_eq!(
            fs::read_to_string(s.out_dir().join("t")).expect("out"),
            "3 3 3 3\n"
        );
        // Sized by the backend: the cores shared among the jobs that may run at once.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let local = |parallel: u32, threads: Option<u32>| crate::config::Backend::Local {
            max_parallel_jobs: parallel,
            timeout_s: 60,
            max_file_mb: 1,
            max_memory_mb: None,
            threads_per_job: threads,
        };
        assert_eq!(local(1, None).limits().threads, Some(cores));
        assert_eq!(local(cores, None).limits().threads, Some(1));
        assert_eq!(local(4 * cores, None).limits().threads, Some(1));
        assert_eq!(local(2, Some(1)).limits().threads, Some(1));
        // Never more than the cores, whatever the (possibly cloned) config asks.
        assert_eq!(local(1, Some(1024)).limits().threads, Some(cores));
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
    fn an_orphans_processes_are_stopped_and_it_cannot_be_reattached() {
        let d = tempfile::tempdir().expect("tempdir");
        let s = spec(d.path(), &["sh", "-c", "sleep 30 & sleep 30", "sh"], 60);
        let dir = s.dir.clone();
        let job = s.id.clone();
        let runner = std::thread::spawn(move || LocalRunner.run(&s));
        let pid = (0..200)
            .find_map(|_| {
                std::thread::sleep(Duration::from_millis(25));
                fs::read_to_string(dir.join(PID_FILE))
                    .ok()
                    .and_then(|p| crate::util::origin::ProcessStamp::parse_line(&p))
                    .map(|p| p.pid)
            })
            .expect("the job started");
        assert!(matches!(
            LocalRunner.reattach(&dir, true),
            Ok(Reattach::Lost)
        ));
        let start = Instant::now();
        LocalRunner.stop_orphan(&dir, &job);
        let r = runner.join().expect("thread").expect("run");
        assert_eq!(r.state, JobState::Failed, "killed: {r:?}");
        assert!(start.elapsed() < Duration::from_secs(20));
        assert!(!crate::util::proc::process_alive(pid));
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
