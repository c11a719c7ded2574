//! Scoring by running programs: the `pass_at_1` metric. Each item of a code task's eval set is
//! `{"prompt", "answer", "tests": [{"input", "output"}, …]}` (the answer is a reference solution,
//! what the contamination gate matches training data against). The model's completion is run as
//! a Python 3 program once per test case — the case's input on its stdin — and the item passes
//! when every case's stdout equals the expected output (trailing whitespace aside). The verdict
//! is computed here, outside the program: the test cases and expected outputs never enter its
//! sandbox.
//!
//! Each run is one process under `rsim job sandbox` (a sandbox inside the evaluation job's own):
//! - files: the system's directories to read, nothing to write but `/dev/null` (no file it
//!   could fill a disk with); nothing of the study, the job, the eval set or `/proc` of any
//!   process. The program is its `-c` argument, its working directory and `HOME` are `/`: where
//!   it runs — an evaluation's job or the contamination gate (`train::behaviour`), which reads a
//!   dataset's programs by running them so — shows nowhere it can look;
//! - no network (Landlock denies every TCP connect and bind; the job's network namespace, where
//!   the machine gives one, holds no interface but loopback);
//! - no new processes (seccomp: fork, vfork and clone without `CLONE_THREAD` fail), so no fork
//!   bomb and no second program; signals and abstract sockets only within its own domain;
//! - CPU seconds, address space, file size and open files limited (rlimits), the wall clock
//!   limited (its process group is killed), stdout read up to `Limits::output_bytes` (then it is
//!   killed).
//!
//! A run that crashes, times out, exceeds a limit or is denied something fails its item, and the
//! reason is counted in the result's metrics (`programs_blocked`, `programs_timed_out`, …), which
//! the record keeps and `rsim audit` sums: programs that tried something are counted even when
//! nothing came of it.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::jobs::sandbox::{Rlimits, Sandbox};
use crate::util::error::{Error, IoContext, Result};

/// The metric a code task names.
pub const METRIC: &str = "pass_at_1";

/// The interpreter programs run under: the system's, so that it lies under `/usr` (readable in
/// the sandbox) and not in a user's version manager.
pub const PYTHON: &str = "/usr/bin/python3";

/// One hidden test case.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestCase {
    pub input: String,
    pub output: String,
}

/// One item of a code task's eval set.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeItem {
    pub prompt: String,
    /// A reference solution.
    pub answer: String,
    pub tests: Vec<TestCase>,
}

/// Parse a code task's eval set; every item needs at least one test case.
pub fn parse_items(bytes: &[u8], what: &str) -> Result<Vec<CodeItem>> {
    let items = crate::train::datasets::parse_lines::<CodeItem>(
        bytes,
        what,
        "{\"prompt\", \"answer\", \"tests\": [{\"input\", \"output\"}]}",
    )?;
    if let Some((line, _)) = items.iter().find(|(_, i)| i.tests.is_empty()) {
        return Err(Error::invalid(format!(
            "{what}: line {line}: a code item needs at least one test case"
        )));
    }
    Ok(items.into_iter().map(|(_, i)| i).collect())
}

/// The limits of one run.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub wall: Duration,
    pub cpu_s: u64,
    pub memory_mb: u64,
    pub output_bytes: usize,
    pub file_kb: u64,
}

/// The longest program a run takes (its `-c` argument; an argument is at most 128 KiB).
pub const MAX_PROGRAM_BYTES: usize = 100 << 10;

pub const LIMITS: Limits = Limits {
    wall: Duration::from_secs(5),
    cpu_s: 3,
    memory_mb: 512,
    output_bytes: 64 << 10,
    file_kb: 1024,
};

/// How an item's program fared (the first test case it did not pass decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    Passed,
    /// It ran and printed something else.
    Wrong,
    /// It exited with an error (an exception, a non-zero status).
    Crashed,
    /// The wall-clock or CPU limit.
    TimedOut,
    /// Too much output or memory.
    OverLimit,
    /// The sandbox denied it something (a file, a socket, a process, a signal).
    Blocked,
    /// The model wrote no program.
    Empty,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::Passed,
        Outcome::Wrong,
        Outcome::Crashed,
        Outcome::TimedOut,
        Outcome::OverLimit,
        Outcome::Blocked,
        Outcome::Empty,
    ];

    /// The metric that counts it in an evaluation's result.
    pub fn metric(self) -> &'static str {
        match self {
            Outcome::Passed => "programs_passed",
            Outcome::Wrong => "programs_wrong",
            Outcome::Crashed => "programs_crashed",
            Outcome::TimedOut => "programs_timed_out",
            Outcome::OverLimit => "programs_over_limit",
            Outcome::Blocked => "programs_blocked",
            Outcome::Empty => "programs_empty",
        }
    }
}

/// What the sandbox's denials look like from inside Python (and from the C library).
const DENIED: &[&str] = &[
    "PermissionError",
    "Operation not permitted",
    "Permission denied",
];

/// Output as compared: trailing whitespace of each line and trailing blank lines dropped.
fn normal(s: &str) -> String {
    let lines: Vec<&str> = s.lines().map(str::trim_end).collect();
    lines.join("\n").trim_end_matches('\n').to_string()
}

/// How one run of `Runner::output` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran {
    /// It ended well (status 0, within every limit) having printed this (as outputs are
    /// compared: trailing white space dropped).
    Printed(String),
    /// It crashed, was denied something, or passed its output or memory limit: it would fail
    /// any test case so.
    Failed,
    /// It ran past the wall-clock or CPU limit, which depends on the machine's load as well.
    Stopped,
}

/// Runs programs for one evaluation, each in a fresh directory under `work`.
pub struct Runner {
    rsim: PathBuf,
    python: PathBuf,
    work: PathBuf,
    limits: Limits,
}

struct Run {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    status: Option<std::process::ExitStatus>,
    timed_out: bool,
    over_output: bool,
}

impl Runner {
    /// A runner whose programs run under `python` (`PYTHON`) and this rsim's sandbox wrapper.
    pub fn new(work: &Path, python: &Path, limits: Limits) -> Result<Runner> {
        let rsim = std::env::current_exe()
            .map_err(|e| Error::internal(format!("{METRIC}: cannot find this rsim binary: {e}")))?;
        Runner::with_rsim(work, python, limits, rsim)
    }

    /// A runner whose programs run under `python` and the sandbox wrapper of the rsim binary
    /// `rsim` (the contamination gate's, which may run in a process that is not rsim).
    pub fn with_rsim(work: &Path, python: &Path, limits: Limits, rsim: PathBuf) -> Result<Runner> {
        if !python.is_file() {
            return Err(Error::invalid(format!(
                "{METRIC}: no Python interpreter at {} (programs run under the system's python3)",
                python.display()
            )));
        }
        std::fs::create_dir_all(work).at("cannot create", work)?;
        Ok(Runner {
            rsim,
            python: python.to_path_buf(),
            work: work.to_path_buf(),
            limits,
        })
    }

    /// The interpreter, as the job log records it: its path, version and sha256.
    pub fn describe(&self) -> Result<String> {
        let sha = crate::util::hash::sha256_file(&self.python)?;
        let out = Command::new(&self.python)
            .args(["-I", "-c", "import sys; print(sys.version.split()[0])"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::invalid(format!("cannot run {}: {e}", self.python.display())))?;
        Ok(format!(
            "{} (Python {}, sha256 {sha})",
            self.python.display(),
            String::from_utf8_lossy(&out.stdout).trim()
        ))
    }

    /// Judge item `idx`'s program against its test cases.
    pub fn judge(&self, idx: usize, program: &str, tests: &[TestCase]) -> Result<Outcome> {
        if program.trim().is_empty() {
            return Ok(Outcome::Empty);
        }
        for t in tests {
            let run = self.run(idx, program, &t.input)?;
            let outcome = classify(&run, &t.output);
            if outcome != Outcome::Passed {
                return Ok(outcome);
            }
        }
        Ok(Outcome::Passed)
    }

    /// What a program prints for `input`, run exactly as an evaluation runs it (the same
    /// sandbox, interpreter, limits and environment, so that a program cannot tell the two
    /// apart by anything but its input): the contamination gate reads programs so
    /// (`policy::behaviour`). `idx` names the run's directory: concurrent runs need different ones.
    pub fn output(&self, idx: usize, program: &str, input: &str) -> Result<Ran> {
        let run = self.run(idx, program, input)?;
        let printed = String::from_utf8_lossy(&run.stdout).into_owned();
        Ok(match classify(&run, &printed) {
            Outcome::Passed => Ran::Printed(normal(&printed)),
            Outcome::TimedOut => Ran::Stopped,
            _ => Ran::Failed,
        })
    }

    fn run(&self, idx: usize, program: &str, input: &str) -> Result<Run> {
        if program.len() > MAX_PROGRAM_BYTES {
            return Err(Error::invalid(format!(
                "{METRIC}: a program of {} bytes is longer than the {} KiB a run takes",
                program.len(),
                MAX_PROGRAM_BYTES >> 10
            )));
        }
        let mut read: Vec<PathBuf> = crate::jobs::sandbox::SYSTEM_READ
            .iter()
            .map(PathBuf::from)
            .collect();
        read.extend([PathBuf::from("/dev/urandom"), self.python.clone()]);
        // It writes nowhere (stdout is a pipe): not even its own directory, so no program can
        // fill a disk one file-size limit at a time.
        let sb = Sandbox {
            required: true,
            read,
            write: vec![PathBuf::from("/dev/null")],
            deny_net: true,
            no_fork: true,
            rlimits: Some(Rlimits {
                cpu_s: self.limits.cpu_s,
                memory_mb: self.limits.memory_mb,
                file_kb: self.limits.file_kb,
                open_files: 64,
            }),
            ..Sandbox::default()
        };
        let sb_file = self.work.join(format!("p{idx}.json"));
        crate::jobs::sandbox::write(&sb, &sb_file)?;
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(&self.rsim);
        child
            .args(["job", "sandbox"])
            .arg(&sb_file)
            .arg("--")
            .arg(&self.python)
            .args(["-I", "-S", "-B", "-c", program])
            .current_dir("/")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", "/")
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // A network namespace of its own wherever one can be made, whoever runs it: an
        // evaluation's job has one, and a program that counted the interfaces it sees told the
        // gate's runs (in the caller's namespace) from the tests' (50 of 50 items through).
        if crate::jobs::network_isolation_available() {
            // SAFETY: unshare(2) is a single system call; the closure allocates nothing.
            unsafe {
                child.pre_exec(|| {
                    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(std::io::Error::from)
                });
            }
        }
        let mut child = child
            .spawn()
            .map_err(|e| Error::internal(format!("cannot start a program: {e}")))?;
        let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
        let kill = || {
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        };
        let (mut stdin, mut stdout, mut stderr) =
            match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
                (Some(i), Some(o), Some(e)) => (i, o, e),
                _ => {
                    kill();
                    let _ = child.wait();
                    return Err(Error::internal("a program's pipes were not opened"));
                }
            };
        let input = input.as_bytes().to_vec();
        let feeder = std::thread::spawn(move || {
            // A program that never reads its input closes the pipe: not an error.
            let _ = stdin.write_all(&input);
        });
        let cap = self.limits.output_bytes;
        let flooded = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let out_reader = {
            let flooded = flooded.clone();
            std::thread::spawn(move || read_capped(&mut stdout, cap, Some(&flooded)))
        };
        let err_reader = std::thread::spawn(move || read_capped(&mut stderr, 8 << 10, None));
        let start = Instant::now();
        let mut timed_out = false;
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                // Past its output limit it is stopped at once.
                Ok(None) if flooded.load(std::sync::atomic::Ordering::Relaxed) => {
                    kill();
                    break child.wait().ok();
                }
                Ok(None) if start.elapsed() >= self.limits.wall => {
                    timed_out = true;
                    kill();
                    break child.wait().ok();
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(_) => {
                    kill();
                    break None;
                }
            }
        };
        // Whatever it left behind goes with it (it cannot fork, but exec'd programs share its group).
        kill();
        let _ = feeder.join();
        let (stdout, over_output) = out_reader.join().unwrap_or_default();
        let (stderr, _) = err_reader.join().unwrap_or_default();
        let _ = std::fs::remove_file(&sb_file);
        if status.and_then(|s| s.code()) == Some(crate::jobs::sandbox::REFUSED_EXIT) {
            return Err(Error::invalid(format!(
                "{METRIC}: the programs' sandbox cannot be applied on this machine (Landlock and \
                 seccomp are required to run a model's programs): {}",
                crate::util::text::sanitize_line(&String::from_utf8_lossy(&stderr))
            )));
        }
        Ok(Run {
            stdout,
            stderr,
            status,
            timed_out,
            over_output,
        })
    }
}

/// Read up to `cap` bytes; past that, keep draining (so the writer is not blocked on a full
/// pipe while its group is killed) and say it overflowed.
fn read_capped(
    r: &mut impl Read,
    cap: usize,
    flag: Option<&std::sync::atomic::AtomicBool>,
) -> (Vec<u8>, bool) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut over = false;
    loop {
        match r.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if buf.len() + n > cap {
                    if let Some(f) = flag {
                        f.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    over = true;
                    let room = cap.saturating_sub(buf.len());
                    buf.extend_from_slice(&chunk[..room]);
                } else if !over {
                    buf.extend_from_slice(&chunk[..n]);
                }
            }
        }
    }
    (buf, over)
}

fn classify(run: &Run, expected: &str) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    let stderr = String::from_utf8_lossy(&run.stderr);
    let signal = run.status.and_then(|s| s.signal());
    if run.timed_out || signal == Some(nix::libc::SIGXCPU) {
        return Outcome::TimedOut;
    }
    if run.over_output || stderr.contains("MemoryError") || signal == Some(nix::libc::SIGXFSZ) {
        return Outcome::OverLimit;
    }
    if DENIED.iter().any(|d| stderr.contains(d)) {
        return Outcome::Blocked;
    }
    if run.status.and_then(|s| s.code()) != Some(0) {
        return Outcome::Crashed;
    }
    if normal(&String::from_utf8_lossy(&run.stdout)) == normal(expected) {
        Outcome::Passed
    } else {
        Outcome::Wrong
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_compare_without_trailing_whitespace() {
        assert_eq!(normal("a  \nb\n\n"), "a\nb");
        assert_ne!(normal("a b"), normal("ab"));
    }

    #[test]
    fn code_items_need_tests() {
        let ok = br#"{"prompt":"rev","answer":"print(input()[::-1])","tests":[{"input":"ab\n","output":"ba\n"}]}"#;
        assert_eq!(parse_items(ok, "t").expect("items")[0].tests.len(), 1);
        let e = parse_items(br#"{"prompt":"rev","answer":"x","tests":[]}"#, "t").expect_err("none");
        assert!(
            e.message.contains("at least one test case"),
            "{}",
            e.message
        );
        let e = parse_items(br#"{"prompt":"rev","answer":"x"}"#, "t").expect_err("missing");
        assert!(e.message.contains("tests"), "{}", e.message);
    }
}
