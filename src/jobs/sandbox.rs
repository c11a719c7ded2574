//! Sandboxes: what a job, or a command agent, may touch on this machine — enforced by the kernel
//! with Landlock (unprivileged: no root, no user namespace), in a small wrapper that restricts
//! itself and then execs the program: `rsim job sandbox <sandbox.json> -- <argv…>`.
//!
//! One mechanism for every backend: the wrapper is part of the job's command, so it runs the same
//! way as a local child, inside `nix develop <locked ref> --command …` (Nix itself runs outside the
//! sandbox and may write its store and caches; only the job's program is confined) and in a Slurm
//! batch script on a node. The ruleset is built after the exec, in an ordinary process — nothing
//! is allocated between fork and exec — and it is inherited by everything the program starts.
//!
//! A sandbox is an allow-list (Landlock cannot deny below an allowed directory):
//! - a **job** ([`for_job`]) may read and execute the system's directories, the files its spec
//!   names (the checkpoint's objects, its datasets, the one eval split it scores) and the programs
//!   its command names, read its own job directory, and write only `out/`, a fresh `home/`
//!   (`HOME`) and `tmp/` (`TMPDIR`) in it. Nothing else of the study — the protected splits,
//!   other jobs, the record, the index, the store — and nothing of the user's home;
//! - a **command agent** ([`all_but`]) may use the whole machine except the study directory and
//!   the other agents' private directories: every ancestor of a denied path is replaced by its
//!   entries, minus the one leading to the denied path.
//!
//! What Landlock gives besides files: a sandboxed process cannot ptrace, or read the
//! ptrace-guarded `/proc/<pid>/` files (`environ`, `mem`, `cwd`, `root`, `fd/`) of, any process
//! outside its domain — its parents, rsim, other agents' processes — and (ABI 6, Linux 6.12)
//! cannot signal them or connect to their abstract UNIX sockets.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::jobs::protocol::JobParams;
use crate::util::error::{Error, IoContext, Result};

/// The sandbox's description in a job's directory (and an agent's private directory).
pub const SANDBOX_FILE: &str = "sandbox.json";
/// Where the wrapper notes the sandbox it applied (in a job directory: the job cannot write it).
pub const STATUS_FILE: &str = "sandbox";
/// A job's fresh `HOME` and `TMPDIR`, inside its directory.
pub const HOME_DIR: &str = "home";
pub const TMP_DIR: &str = "tmp";
/// The wrapper's exit status when the sandbox is required and cannot be applied.
pub const REFUSED_EXIT: i32 = 98;

/// Directories every job may read and execute (those that exist): the system's programs,
/// libraries and configuration, Nix's store, process and device information.
pub const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/nix/store",
    "/run/current-system",
    "/sys",
];

/// What of `/proc` a sandboxed program may read: its own process (`/proc/self`, resolved when
/// the sandbox is applied, so the wrapper's pid, which the exec keeps) and system-wide
/// information — never another process's directory. Landlock's ptrace rule alone does not
/// cover `/proc/<pid>/environ` (measured on Linux 6.18: a sandboxed process read its parent's
/// environment), so the other pids are left out by path; `/proc/kcore` and the like are too.
pub const PROC_READ: &[&str] = &[
    "self",
    "thread-self",
    "cpuinfo",
    "meminfo",
    "stat",
    "loadavg",
    "uptime",
    "version",
    "filesystems",
    "mounts",
    "net",
    "sys",
    "driver",
    "devices",
    "cgroups",
    "swaps",
    "vmstat",
    "pressure",
];

/// What of `/dev` a sandboxed program may read and write: the pseudo-devices, terminals, shared
/// memory and GPUs — never disks or memory (`/dev/vda`, `/dev/mem`), which root could read the
/// study from.
pub const DEV_WRITE: &[&str] = &[
    "null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm", "dri", "kfd",
];

/// The grants below `/proc` (read) and `/dev` (read and write) that exist here.
fn proc_and_dev() -> (Vec<PathBuf>, Vec<PathBuf>) {
    let proc = PROC_READ
        .iter()
        .map(|n| Path::new("/proc").join(n))
        .collect();
    let mut dev: Vec<PathBuf> = DEV_WRITE
        .iter()
        .map(|n| Path::new("/dev").join(n))
        .collect();
    if let Ok(entries) = fs::read_dir("/dev") {
        dev.extend(
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("nvidia"))
                .map(|e| e.path()),
        );
    }
    (proc, dev)
}

/// What the sandboxed program may touch. Paths that do not exist grant nothing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sandbox {
    /// Refuse to run the program when the kernel cannot enforce the sandbox (policy
    /// `sandbox = "required"`); otherwise run it unconfined and say so.
    pub required: bool,
    /// Files, or directories with everything beneath, it may read and execute.
    #[serde(default)]
    pub read: Vec<PathBuf>,
    /// Files, or directories with everything beneath, it may also write, create and remove.
    #[serde(default)]
    pub write: Vec<PathBuf>,
    /// Its `HOME`, created if missing (unset: the inherited one).
    #[serde(default)]
    pub home: Option<PathBuf>,
    /// Its `TMPDIR`, created if missing (unset: the inherited one).
    #[serde(default)]
    pub tmp: Option<PathBuf>,
    /// Where to note what was applied (`landlock-abiN`, `none: why`, `refused: why`).
    #[serde(default)]
    pub status: Option<PathBuf>,
    /// Deny every TCP connect and bind (Landlock's network rights, Linux 6.7).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deny_net: bool,
    /// Deny creating processes and reaching others (seccomp: fork, vfork and clone without
    /// `CLONE_THREAD` fail with EPERM — clone3 answers ENOSYS, so threads fall back to clone —
    /// as do signals to any process but itself, ptrace and cross-process memory access): a
    /// program cannot fork-bomb, start another program beside itself or touch another process.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_fork: bool,
    /// Resource limits set before the program starts (and inherited by what it execs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rlimits: Option<Rlimits>,
}

/// The resource limits of a sandboxed program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rlimits {
    /// CPU seconds (RLIMIT_CPU: SIGXCPU, then SIGKILL).
    pub cpu_s: u64,
    /// Address space, MiB (RLIMIT_AS: allocations beyond it fail).
    pub memory_mb: u64,
    /// Largest file it may write, KiB (RLIMIT_FSIZE).
    pub file_kb: u64,
    /// Open files (RLIMIT_NOFILE).
    pub open_files: u64,
}

/// Set `l` on this process (inherited across exec).
fn set_rlimits(l: &Rlimits) -> std::result::Result<(), String> {
    use nix::sys::resource::{Resource, setrlimit};
    // The CPU limit's hard value a second later: at the soft one the kernel sends SIGXCPU, so
    // the program's end says why (at the hard one, SIGKILL, which says nothing).
    for (r, soft, hard) in [
        (Resource::RLIMIT_CPU, l.cpu_s, l.cpu_s + 1),
        (Resource::RLIMIT_AS, l.memory_mb << 20, l.memory_mb << 20),
        (Resource::RLIMIT_FSIZE, l.file_kb << 10, l.file_kb << 10),
        (Resource::RLIMIT_NOFILE, l.open_files, l.open_files),
        (Resource::RLIMIT_CORE, 0, 0),
    ] {
        setrlimit(r, soft, hard).map_err(|e| format!("setrlimit {r:?}: {e}"))?;
    }
    // The rest set to fixed values too (at most what the caller allows), so that what a program
    // reads of its limits is the same whoever started it: an evaluation's job or the
    // contamination gate, which runs a dataset's programs as an evaluation does.
    for (r, v) in [
        (Resource::RLIMIT_STACK, 8 << 20),
        (Resource::RLIMIT_DATA, l.memory_mb << 20),
        (Resource::RLIMIT_MEMLOCK, 64 << 10),
        (Resource::RLIMIT_MSGQUEUE, 0),
        (Resource::RLIMIT_NICE, 0),
        (Resource::RLIMIT_RTPRIO, 0),
    ] {
        let (_, hard) =
            nix::sys::resource::getrlimit(r).map_err(|e| format!("getrlimit {r:?}: {e}"))?;
        let v = v.min(hard);
        setrlimit(r, v, v).map_err(|e| format!("setrlimit {r:?}: {e}"))?;
    }
    Ok(())
}

/// Forbid creating processes from now on (this process and what it execs): see `Sandbox::no_fork`.
fn forbid_processes() -> std::result::Result<(), String> {
    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| format!("seccomp: {e}"))?;
    let e = |e: seccompiler::BackendError| format!("seccomp: {e}");
    // clone(flags, …): a new thread carries CLONE_THREAD; a new process does not.
    let not_a_thread = SeccompRule::new(vec![
        SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(nix::libc::CLONE_THREAD as u64),
            0,
        )
        .map_err(e)?,
    ])
    .map_err(e)?;
    // Signals only to itself (the pid is this process's, which the exec keeps): no kill(1), no
    // kill(-1), whatever Landlock's scoping the kernel has; no tracing or reading another
    // process's memory.
    let me = u64::from(std::process::id());
    let not_me = |arg: u8| -> std::result::Result<SeccompRule, String> {
        SeccompRule::new(vec![
            SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, me).map_err(e)?,
        ])
        .map_err(e)
    };
    let mut deny: std::collections::BTreeMap<i64, Vec<SeccompRule>> = [
        (nix::libc::SYS_clone, vec![not_a_thread]),
        (nix::libc::SYS_kill, vec![not_me(0)?]),
        (nix::libc::SYS_tgkill, vec![not_me(0)?]),
        (nix::libc::SYS_tkill, vec![]),
        (nix::libc::SYS_ptrace, vec![]),
        (nix::libc::SYS_process_vm_readv, vec![]),
        (nix::libc::SYS_process_vm_writev, vec![]),
        (nix::libc::SYS_pidfd_open, vec![]),
        (nix::libc::SYS_pidfd_send_signal, vec![]),
    ]
    .into();
    #[cfg(target_arch = "x86_64")]
    {
        deny.insert(nix::libc::SYS_fork, vec![]);
        deny.insert(nix::libc::SYS_vfork, vec![]);
    }
    let clone3: std::collections::BTreeMap<i64, Vec<SeccompRule>> =
        [(nix::libc::SYS_clone3, vec![])].into();
    for (rules, errno) in [(deny, nix::libc::EPERM), (clone3, nix::libc::ENOSYS)] {
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(errno as u32),
            arch,
        )
        .map_err(e)?;
        let prog: BpfProgram = filter.try_into().map_err(e)?;
        seccompiler::apply_filter(&prog).map_err(|e| format!("seccomp: {e}"))?;
    }
    Ok(())
}

/// The Landlock ABI version of the running kernel, or why there is none. Probed once.
pub fn landlock_abi() -> std::result::Result<i32, String> {
    static ABI: std::sync::OnceLock<std::result::Result<i32, String>> = std::sync::OnceLock::new();
    ABI.get_or_init(|| {
        const LANDLOCK_CREATE_RULESET_VERSION: nix::libc::c_uint = 1;
        // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns the ABI version.
        let v = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_landlock_create_ruleset,
                std::ptr::null::<nix::libc::c_void>(),
                0usize,
                LANDLOCK_CREATE_RULESET_VERSION,
            )
        };
        if v > 0 {
            Ok(v as i32)
        } else {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(nix::libc::EOPNOTSUPP) => {
                    Err("the kernel has Landlock but it is disabled (boot option lsm=)".into())
                }
                _ => Err("the kernel has no Landlock (Linux 5.13 or newer with CONFIG_SECURITY_LANDLOCK)".into()),
            }
        }
    })
    .clone()
}

/// The label a job records when it ran under the sandbox this kernel enforces.
pub fn label(abi: i32) -> String {
    format!("landlock-abi{abi}")
}

/// Whether a recorded sandbox label says the job's program ran confined.
pub fn is_enforced(label: &str) -> bool {
    label.starts_with("landlock-")
}

/// Restrict this process (and everything it starts) to `sb`. Returns the label of what holds,
/// or why nothing does.
pub fn apply(sb: &Sandbox) -> std::result::Result<String, String> {
    use landlock::{
        ABI, Access, AccessFs, LandlockStatus, PathBeneath, PathFd, Ruleset, RulesetAttr,
        RulesetCreatedAttr, RulesetStatus, Scope,
    };
    let abi = landlock_abi()?;
    // The rights of ABI 6 (Linux 6.12); an older kernel enforces the subset it knows.
    let target = ABI::V6;
    let all = AccessFs::from_all(target);
    let read = AccessFs::from_read(target);
    let file = AccessFs::from_file(target);
    let e = |what: &str, err: landlock::RulesetError| format!("Landlock: {what}: {err}");
    let mut rs = Ruleset::default()
        .handle_access(all)
        .map_err(|err| e("handled rights", err))?;
    if sb.deny_net {
        // Handled with no rule allowing any port: every TCP connect and bind is denied.
        rs = rs
            .handle_access(landlock::AccessNet::from_all(target))
            .map_err(|err| e("network rights", err))?;
    }
    let mut rs = rs
        .scope(Scope::from_all(target))
        .map_err(|err| e("scopes", err))?
        .create()
        .map_err(|err| e("cannot create a ruleset", err))?;
    for (paths, access) in [(&sb.read, read), (&sb.write, all)] {
        for p in paths {
            // Only directories, files and devices: a link to a pipe or socket (`/dev/stdin`)
            // is no hierarchy to grant (the kernel refuses such a rule, EBADFD).
            use std::os::unix::fs::FileTypeExt;
            let Ok(meta) = fs::metadata(p) else { continue };
            let t = meta.file_type();
            if !(t.is_dir() || t.is_file() || t.is_char_device() || t.is_block_device()) {
                continue;
            }
            let Ok(fd) = PathFd::new(p) else { continue };
            let access = if meta.is_dir() { access } else { access & file };
            rs = rs
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|err| e(&format!("rule for {}", p.display()), err))?;
        }
    }
    let st = rs
        .restrict_self()
        .map_err(|err| e("cannot restrict", err))?;
    if sb.no_fork {
        forbid_processes()?;
    }
    match (st.ruleset, st.landlock) {
        (RulesetStatus::NotEnforced, _) => {
            Err("the kernel enforced none of the Landlock rules".into())
        }
        (_, LandlockStatus::Available { .. }) => Ok(label(abi)),
        (_, other) => Err(format!("Landlock is not available: {other:?}")),
    }
}

/// The wrapper (`rsim job sandbox FILE -- ARGV…`): read the sandbox, give the program a fresh
/// `HOME`/`TMPDIR` where asked, restrict this process, note what holds, and exec the program.
/// Returns only on failure (when the sandbox is required and cannot be applied, or the program
/// cannot be executed).
pub fn exec(file: &Path, argv: &[String]) -> Result<()> {
    use std::os::unix::process::CommandExt;
    // The program dies with whatever started the wrapper (rsim, `nix develop`, the batch step):
    // a job whose runner was killed does not train on for ever.
    let parent = nix::unistd::getppid();
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| Error::internal(format!("rsim job sandbox: prctl: {e}")))?;
    if nix::unistd::getppid() != parent {
        return Err(Error::internal(
            "rsim job sandbox: the process that started the job exited",
        ));
    }
    let bytes = fs::read(file).at("cannot read the sandbox", file)?;
    let sb: Sandbox = serde_json::from_slice(&bytes)
        .map_err(|e| Error::invalid(format!("{}: {e}", file.display())))?;
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| Error::invalid("rsim job sandbox: no command after --"))?;
    for d in [&sb.home, &sb.tmp].into_iter().flatten() {
        fs::create_dir_all(d).at("cannot create", d)?;
    }
    if let Some(l) = &sb.rlimits {
        set_rlimits(l).map_err(|why| Error::internal(format!("rsim job sandbox: {why}")))?;
    }
    // Opened before the sandbox closes the directory it is in (an open file stays writable).
    let mut status = match &sb.status {
        Some(p) => Some(fs::File::create(p).at("cannot write", p)?),
        None => None,
    };
    let mut note = |s: &str| {
        if let Some(f) = status.as_mut() {
            use std::io::Write;
            let _ = f.write_all(s.as_bytes());
        }
    };
    match apply(&sb) {
        Ok(label) => note(&label),
        Err(why) if sb.required => {
            note(&format!("refused: {why}"));
            eprintln!(
                "error: the sandbox is required (policy.sandbox = \"required\") and cannot be applied: {why}"
            );
            std::process::exit(REFUSED_EXIT);
        }
        Err(why) => {
            eprintln!("warning: running without a sandbox: {why}");
            note(&format!("none: {why}"));
        }
    }
    drop(status);
    let mut cmd = std::process::Command::new(program);
    cmd.args(args);
    if let Some(h) = &sb.home {
        cmd.env("HOME", h);
    }
    if let Some(t) = &sb.tmp {
        cmd.env("TMPDIR", t);
    }
    let err = cmd.exec();
    Err(Error::invalid(format!("cannot run {program:?}: {err}")))
}

/// What a recorded job's sandbox was, from its directory after it ran: the wrapper's note,
/// unless this machine cannot enforce Landlock at all (then an unconfined job could have
/// written anything there).
pub fn outcome(spec_sandbox: Option<&Sandbox>, job_dir: &Path, local: bool) -> Option<String> {
    if spec_sandbox.is_none() {
        return Some("off".into());
    }
    let note = fs::read_to_string(job_dir.join(STATUS_FILE))
        .ok()
        .map(|s| crate::util::text::sanitize_line(s.trim()));
    if local
        && let Err(why) = landlock_abi()
        && note.as_deref().is_some_and(is_enforced)
    {
        return Some(format!("none: {why}"));
    }
    note
}

/// Why a recorded job's program ran without the sandbox; None when it ran sandboxed or never
/// ran (refused by a required sandbox, cancelled in the queue, rejected at submission).
pub fn ran_unconfined(job: &crate::model::JobRecord) -> Option<String> {
    match job.sandbox.as_deref() {
        Some(l) if is_enforced(l) || l.starts_with("refused:") => None,
        Some(l) => Some(l.to_string()),
        None if job.duration_s == 0.0 && job.exit_code.is_none() => None,
        None => Some("no sandbox recorded".into()),
    }
}

/// Is `p` equal to or inside `dir`?
fn within(p: &Path, dir: &Path) -> bool {
    p.starts_with(dir)
}

/// The sandbox of one job: system directories, the rsim binary (job scripts call `rsim job …`),
/// the job's inputs and programs read-only, its own directory readable, and only `out/`,
/// `home/` and `tmp/` in it writable.
pub fn for_job(
    rsim: &Path,
    job_dir: &Path,
    params: &JobParams,
    command: &[String],
    study_root: &Path,
    extra_read: &[PathBuf],
    required: bool,
) -> Sandbox {
    let state = study_root.join(crate::model::paths::STATE_DIR);
    // Nothing the owner adds opens the study itself or its state directory.
    let opens_study = |c: &Path| within(study_root, c) || within(c, &state);
    let (proc, dev) = proc_and_dev();
    let mut read: Vec<PathBuf> = SYSTEM_READ.iter().map(PathBuf::from).collect();
    read.extend(proc);
    read.extend(
        extra_read
            .iter()
            .filter(|p| p.canonicalize().is_ok_and(|c| !opens_study(&c)))
            .cloned(),
    );
    read.push(job_dir.to_path_buf());
    read.push(rsim.to_path_buf());
    // The inputs its spec names, file by file: the checkpoint's objects, the datasets, the split.
    read.extend(params.checkpoint().files.values().cloned());
    match params {
        JobParams::Sft(s) => read.extend(s.datasets.iter().map(|d| d.path.clone())),
        JobParams::Evaluate(e) => read.push(e.eval_set.clone()),
    }
    // The programs and files its command names (the rsim binary, a recipe script and the
    // directory it sits in); never the study itself or anything of its state directory.
    let program = command
        .first()
        .and_then(|p| crate::jobs::resolve_program(study_root, p));
    let named = command
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    for p in program.into_iter().chain(named) {
        let Ok(c) = p.canonicalize() else { continue };
        if within(study_root, &c) {
            continue;
        }
        let grant = match c.parent() {
            // A file the owner's command names in the state directory (an evaluator kept beside
            // the protected splits): that file alone.
            _ if within(&c, &state) => c,
            // A recipe in the study: its directory, for the modules beside it.
            Some(dir) if c.is_file() && within(&c, study_root) && dir != study_root => {
                dir.to_path_buf()
            }
            _ => c,
        };
        read.push(grant);
    }
    let write = dev
        .into_iter()
        .chain([
            job_dir.join(crate::jobs::protocol::OUT_DIR),
            job_dir.join(HOME_DIR),
            job_dir.join(TMP_DIR),
        ])
        .collect();
    Sandbox {
        required,
        read,
        write,
        home: Some(job_dir.join(HOME_DIR)),
        tmp: Some(job_dir.join(TMP_DIR)),
        status: Some(job_dir.join(STATUS_FILE)),
        ..Sandbox::default()
    }
}

/// A sandbox that allows everything except `deny` (and what lies beneath): each ancestor of a
/// denied path is replaced by its entries, less the one leading to the denied path. Entries
/// created later in those ancestors are not allowed (Landlock rules name existing files); a
/// symbolic link that leads into a denied path, or to an ancestor of one, is left out.
pub fn all_but(deny: &[PathBuf], required: bool) -> Sandbox {
    let deny: BTreeSet<PathBuf> = deny.iter().filter_map(|d| d.canonicalize().ok()).collect();
    let mut ancestors = BTreeSet::new();
    for d in &deny {
        ancestors.extend(d.ancestors().skip(1).map(Path::to_path_buf));
    }
    let (mut read, mut write) = (Vec::new(), Vec::new());
    let (proc, dev) = proc_and_dev();
    let mut todo: Vec<PathBuf> = if deny.contains(Path::new("/")) {
        Vec::new()
    } else {
        vec![PathBuf::from("/")]
    };
    while let Some(dir) = todo.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if deny.contains(&p) {
                continue;
            }
            if ancestors.contains(&p) {
                todo.push(p);
                continue;
            }
            // Other processes' /proc entries, disks and memory devices are never granted whole.
            if p == Path::new("/proc") {
                read.extend(proc.iter().cloned());
                continue;
            }
            if p == Path::new("/dev") {
                write.extend(dev.iter().cloned());
                continue;
            }
            let Ok(c) = p.canonicalize() else { continue };
            if deny.iter().any(|d| within(&c, d) || within(d, &c)) {
                continue;
            }
            write.push(p);
        }
    }
    Sandbox {
        required,
        read,
        write,
        ..Sandbox::default()
    }
}

/// Write a sandbox description where the wrapper will read it.
pub fn write(sb: &Sandbox, path: &Path) -> Result<()> {
    fs::write(path, crate::util::hash::json_bytes(sb)?).at("cannot write", path)
}

/// The command that runs `command` in the sandbox described at `file`.
pub fn wrap(rsim: &Path, file: &Path, command: Vec<String>) -> Vec<String> {
    let mut out = vec![
        rsim.to_string_lossy().into_owned(),
        "job".into(),
        "sandbox".into(),
        file.to_string_lossy().into_owned(),
        "--".into(),
    ];
    out.extend(command);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_evaluation_job_may_read_its_split_and_nothing_else_of_the_study() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = d.path().canonicalize().expect("canon");
        let prot = root.join(".rsim/protected/add2");
        fs::create_dir_all(&prot).expect("mkdir");
        for f in ["dev.jsonl", "test.jsonl", "eval.sh"] {
            fs::write(prot.join(f), b"x").expect("write");
        }
        fs::create_dir_all(root.join("recipes")).expect("mkdir");
        fs::write(root.join("recipes/eval.py"), b"x").expect("write");
        let dir = root.join(".rsim/jobs/j-1");
        let params = JobParams::Evaluate(crate::jobs::protocol::EvalParams {
            eval_set: prot.join("dev.jsonl"),
            ..match crate::jobs::protocol::example_eval() {
                JobParams::Evaluate(e) => e,
                JobParams::Sft(_) => unreachable!("an evaluation spec"),
            }
        });
        let cmd = |args: &[PathBuf]| -> Vec<String> {
            args.iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect()
        };
        let command = cmd(&[
            PathBuf::from("sh"),
            prot.join("eval.sh"),
            root.join("recipes/eval.py"),
            root.clone(),
            root.join(".rsim"),
        ]);
        let extra = [root.clone(), PathBuf::from("/opt")];
        let sb = for_job(
            Path::new("/bin/rsim"),
            &dir,
            &params,
            &command,
            &root,
            &extra,
            true,
        );
        let read: BTreeSet<_> = sb.read.iter().cloned().collect();
        for want in [
            prot.join("dev.jsonl"),
            prot.join("eval.sh"),
            root.join("recipes"),
            dir.clone(),
        ] {
            assert!(read.contains(&want), "{want:?} in {read:?}");
        }
        for p in sb.read.iter().chain(&sb.write) {
            assert!(!root.starts_with(p), "the study or an ancestor: {p:?}");
            assert!(
                !p.starts_with(root.join(".rsim/protected")) || p.is_file(),
                "a protected directory: {p:?}"
            );
            assert_ne!(*p, prot.join("test.jsonl"));
        }
        assert_eq!(
            sb.write,
            [
                sb.write
                    .iter()
                    .filter(|p| p.starts_with("/dev"))
                    .cloned()
                    .collect::<Vec<_>>(),
                vec![dir.join("out"), dir.join("home"), dir.join("tmp")]
            ]
            .concat()
        );
        assert_eq!(sb.home, Some(dir.join("home")));
    }

    #[test]
    fn the_complement_of_a_path_leaves_out_its_ancestors_and_links_into_it() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = d.path().canonicalize().expect("canon");
        for p in ["a/study/.rsim", "a/other", "b"] {
            fs::create_dir_all(root.join(p)).expect("mkdir");
        }
        fs::write(root.join("a/file"), b"x").expect("write");
        std::os::unix::fs::symlink(root.join("a/study"), root.join("b/link")).expect("link");
        std::os::unix::fs::symlink(&root, root.join("a/up")).expect("link");
        let sb = all_but(&[root.join("a/study")], true);
        let w: BTreeSet<_> = sb.write.iter().cloned().collect();
        assert!(w.contains(&root.join("a/other")));
        assert!(w.contains(&root.join("a/file")));
        assert!(
            w.contains(&root.join("b")),
            "b holds a link into the study, but b itself is not one"
        );
        for never in ["a", "a/study", "a/up", ""] {
            assert!(
                !w.contains(&root.join(never)),
                "{never:?} must not be allowed"
            );
        }
        assert!(!w.contains(Path::new("/")));
        assert!(w.iter().all(|p| !root.starts_with(p)));
    }
}
