//! Python environments pinned by a lockfile (`[environment] kind = "python"`): what most ML users
//! pin with instead of Nix.
//!
//! The lock is a requirements file in which every requirement is pinned exactly (`name==version`)
//! and carries at least one `--hash=sha256:…` (what `pip-compile --generate-hashes`, `uv pip
//! compile --generate-hashes` or `tools/recipes/lock.sh` write). rsim builds the environment from
//! it with `pip install --require-hashes --no-deps` into a virtual environment keyed by the lock's
//! hash and the interpreter (`build`), like a Nix store path: a changed lock is a new
//! environment, never an edit of the old one. Before each job is admitted the environment is
//! checked against the lock (`pin`): built from this very lock, and holding exactly the locked
//! distributions at the locked versions — one added, removed or changed since (a `pip install`
//! by hand) refuses the job (rule `environment-pinned`). The record names it as
//! `python lock=<path>@<sha256> python=<version> torch=… transformers=… peft=… cuda=… driver=…`
//! (`PythonPin::label`), in the job record and the `Rsim-Env` trailer.
//!
//! What a job may read of it is derived, not listed by hand: the environment's folder and the
//! interpreter's own prefix (its standard library), from the environment's `pyvenv.cfg`.
//!
//! Limits: the check reads the distributions' metadata, not every installed file (a file edited
//! in place inside site-packages is not seen per job; `pip install` never does that). Jobs in the
//! sandbox cannot write to the environment.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::util::error::{Error, IoContext, Result};

pub use crate::config::PythonEnvConfig;

/// The file in an environment that says which lock built it; written last, so an environment
/// without it is a build that did not finish.
const STAMP: &str = ".rsim-env.json";

/// Distributions `python -m venv` puts into every environment; not in the lock, they are let be.
const BOOTSTRAP: &[&str] = &["pip", "setuptools", "wheel"];

/// The distributions whose versions the record names (when the environment holds them).
const RECORDED: &[&str] = &["torch", "transformers", "peft"];

/// The largest lock read (a lock of 60 distributions with one hash each is 7 KiB; one with
/// every platform's wheels for a few hundred, some hundreds of KiB).
pub const MAX_LOCK_BYTES: u64 = 4 << 20;

/// A lock, read and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    /// As configured (relative to the study).
    pub rel: String,
    pub path: PathBuf,
    pub sha256: String,
    /// Normalized distribution name → version.
    pub pins: BTreeMap<String, String>,
}

/// A distribution name as PEP 503 compares them: lower case, runs of `-`, `_` and `.` as one `-`.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
            continue;
        }
        if sep && !out.is_empty() {
            out.push('-');
        }
        sep = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// Read the study's lock and check every requirement in it is pinned and hashed.
pub fn read_lock(study_root: &Path, rel: &str) -> Result<Lock> {
    crate::config::check_relative_path(rel)
        .map_err(|m| Error::invalid(format!("environment.lock: {m}")))?;
    let path = study_root.join(rel);
    // A lock is the study's own file: one that leads elsewhere (a symlink a shared repository
    // carries) is not read.
    if let (Ok(real), Ok(root)) = (path.canonicalize(), study_root.canonicalize())
        && !real.starts_with(&root)
    {
        return Err(Error::invalid(format!(
            "environment.lock: {rel} leads outside the study ({})",
            real.display()
        )));
    }
    // A lock is a list of pins, a regular file of the study's: read bounded, never through a
    // link (one to a pipe, `/proc/self/fd/1`, would be waited on for ever) or from a FIFO, and
    // one of megabytes (a cloned repository's, say) is not read.
    let text = crate::util::file::read_regular_text(&path, MAX_LOCK_BYTES).map_err(|e| {
        Error::invalid(format!(
            "environment.lock: cannot read {rel} (a regular UTF-8 file of at most {MAX_LOCK_BYTES} bytes): {e}"
        ))
    })?;
    let pins =
        parse_lock(&text).map_err(|m| Error::invalid(format!("environment.lock: {rel}: {m}")))?;
    Ok(Lock {
        rel: rel.to_string(),
        path,
        sha256: crate::util::hash::sha256_hex(text.as_bytes()),
        pins,
    })
}

/// The pins of a requirements file with hashes; an error names the first line that is not an
/// exactly pinned, hashed requirement.
fn parse_lock(text: &str) -> std::result::Result<BTreeMap<String, String>, String> {
    let mut pins = BTreeMap::new();
    // Logical lines: a trailing backslash continues a line.
    let mut logical: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = match raw.find(" #").or_else(|| raw.starts_with('#').then_some(0)) {
            Some(at) => &raw[..at],
            None => raw,
        };
        let (body, more) = match line.trim_end().strip_suffix('\\') {
            Some(b) => (b, true),
            None => (line, false),
        };
        let entry = pending.get_or_insert_with(|| (i + 1, String::new()));
        entry.1.push(' ');
        entry.1.push_str(body.trim());
        if !more && let Some(done) = pending.take() {
            logical.push(done);
        }
    }
    logical.extend(pending);
    for (line_no, line) in logical {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some((req, opts)) = words.split_first() else {
            continue;
        };
        let at = |m: String| format!("line {line_no}: {m}");
        if req.starts_with('-') {
            return Err(at(format!(
                "{req} is not allowed in a lock (only pinned requirements with their hashes; \
                 indexes and find-links belong to pip's configuration)"
            )));
        }
        if line.contains(';') {
            return Err(at(format!(
                "{req}: environment markers are not supported (lock for one platform)"
            )));
        }
        let Some((name, version)) = req.split_once("==") else {
            return Err(at(format!(
                "{req:?} is not pinned exactly (expected name==version)"
            )));
        };
        let name = name.split('[').next().unwrap_or(name);
        let valid_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        let valid_version = !version.is_empty()
            && !version.contains('*')
            && version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '!' | '-' | '_'));
        if !valid_name || !valid_version {
            return Err(at(format!(
                "{req:?} is not pinned exactly (expected name==version)"
            )));
        }
        let mut hashes = 0;
        for o in opts {
            match o.strip_prefix("--hash=sha256:") {
                Some(h) if crate::util::hash::is_sha256(h) => hashes += 1,
                _ => {
                    return Err(at(format!(
                        "{req}: unexpected {o:?} (expected --hash=sha256:<64 hex digits>)"
                    )));
                }
            }
        }
        if hashes == 0 {
            return Err(at(format!(
                "{req} has no --hash=sha256:… (every requirement of a lock carries its hashes)"
            )));
        }
        if pins.insert(normalize(name), version.to_string()).is_some() {
            return Err(at(format!("{name} is pinned twice")));
        }
    }
    if pins.is_empty() {
        return Err("pins no requirement".into());
    }
    Ok(pins)
}

/// An environment checked against its lock: what a job in a `python` environment runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonPin {
    pub lock: String,
    pub lock_sha256: String,
    /// The environment's folder.
    pub dir: PathBuf,
    /// The interpreter's own prefix (its standard library), from `pyvenv.cfg`.
    pub base_prefix: PathBuf,
    pub python_version: String,
    /// The recorded distributions' versions, then `cuda` (the CUDA runtime's) where present.
    pub versions: Vec<(String, String)>,
    /// The NVIDIA driver's version, where this machine has one.
    pub driver: Option<String>,
}

impl PythonPin {
    /// The environment as the record names it.
    pub fn label(&self) -> String {
        let mut out = format!(
            "python lock={}@{} python={}",
            self.lock, self.lock_sha256, self.python_version
        );
        for (k, v) in &self.versions {
            out.push_str(&format!(" {k}={v}"));
        }
        if let Some(d) = &self.driver {
            out.push_str(&format!(" driver={d}"));
        }
        out
    }

    /// The command with a bare program the environment provides (`python3`, `accelerate`) made
    /// the environment's own.
    pub fn resolve(&self, mut command: Vec<String>) -> Vec<String> {
        if let Some(first) = command.first_mut()
            && !first.contains('/')
        {
            let p = self.dir.join("bin").join(first.as_str());
            if p.is_file() {
                *first = p.to_string_lossy().into_owned();
            }
        }
        command
    }

    /// What a sandboxed job must read of the environment: its folder and the interpreter's prefix.
    pub fn read_paths(&self) -> Vec<PathBuf> {
        vec![self.dir.clone(), self.base_prefix.clone()]
    }
}

/// `command` to run in the environment by hand (`rsim env run`): its programs first on PATH,
/// `VIRTUAL_ENV` set, as `activate` would.
pub fn command_in(pin: &PythonPin, command: &[String]) -> Command {
    let command = pin.resolve(command.to_vec());
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..]);
    let bin = pin.dir.join("bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let joined = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&path)))
        .unwrap_or(path);
    cmd.env("PATH", joined).env("VIRTUAL_ENV", &pin.dir);
    cmd.env_remove("PYTHONHOME");
    cmd
}

/// Whether a label names a Python environment pinned by a lock's hash.
pub fn is_pinned_label(env: &str) -> bool {
    env.strip_prefix("python ").is_some_and(|fields| {
        fields.split(' ').any(|f| {
            f.strip_prefix("lock=")
                .and_then(|l| l.rsplit_once('@'))
                .is_some_and(|(p, h)| !p.is_empty() && crate::util::hash::is_sha256(h))
        })
    })
}

/// The folder environments are kept in.
fn envs_root(cfg: &PythonEnvConfig) -> Result<PathBuf> {
    if let Some(d) = cfg.envs {
        return Ok(d.to_path_buf());
    }
    if let Some(d) = std::env::var_os("RSIM_PYTHON_ENVS").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .ok_or_else(|| {
            Error::invalid(
                "no folder for Python environments: set [environment] envs, RSIM_PYTHON_ENVS or HOME",
            )
        })?;
    Ok(cache.join("rsim").join("python-envs"))
}

/// The interpreter as configured, resolved on PATH.
fn interpreter(cfg: &PythonEnvConfig) -> Result<PathBuf> {
    crate::jobs::resolve_program(Path::new("/"), cfg.python).ok_or_else(|| {
        Error::invalid(format!(
            "environment.python: no interpreter {:?} (on PATH or at that path)",
            cfg.python
        ))
    })
}

/// The environment's folder for this lock and interpreter (as configured: what `python3` finds
/// on PATH differs between callers — version managers put their own bin first in what they
/// start — while the environment must be the same one for all).
fn env_dir(cfg: &PythonEnvConfig, lock: &Lock) -> Result<PathBuf> {
    let key = crate::util::hash::sha256_hex(format!("{}\0{}", lock.sha256, cfg.python).as_bytes());
    Ok(envs_root(cfg)?.join(&key[..20]))
}

/// Check the study's environment against its lock, building nothing: the pin a job runs under,
/// or why it cannot run (and what to do).
pub fn pin(study_root: &Path, cfg: &PythonEnvConfig) -> Result<PythonPin> {
    let lock = read_lock(study_root, cfg.lock)?;
    let dir = env_dir(cfg, &lock)?;
    check(&dir, &lock)
}

/// Build the study's environment from its lock unless it is built already and matches it, one
/// builder at a time; `force` rebuilds it regardless. pip's output goes to stderr.
pub fn build(study_root: &Path, cfg: &PythonEnvConfig, force: bool) -> Result<PythonPin> {
    use nix::fcntl::{Flock, FlockArg};
    let lock = read_lock(study_root, cfg.lock)?;
    let python = interpreter(cfg)?;
    let dir = env_dir(cfg, &lock)?;
    let parent = dir
        .parent()
        .ok_or_else(|| Error::internal("an environment folder has no parent"))?;
    fs::create_dir_all(parent).at("cannot create", parent)?;
    let lock_file = dir.with_extension("lock");
    let f = fs::File::create(&lock_file).at("cannot create", &lock_file)?;
    let _held = Flock::lock(f, FlockArg::LockExclusive)
        .map_err(|(_, e)| Error::internal(format!("cannot lock {}: {e}", lock_file.display())))?;
    // Built and as the lock says: nothing to do. Built but drifted (a package installed by
    // hand, a build another tool touched): building means making it match, so it is rebuilt.
    if !force && dir.join(STAMP).is_file() {
        match check(&dir, &lock) {
            Ok(pin) => return Ok(pin),
            Err(e) => tracing::warn!("rebuilding: {}", e.message),
        }
    }
    if dir.exists() {
        fs::remove_dir_all(&dir).at("cannot remove", &dir)?;
    }
    tracing::info!(env = %dir.display(), lock = cfg.lock, "building the Python environment");
    let run = |what: &str, cmd: &mut Command| -> Result<()> {
        let status = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(std::io::stderr()))
            .status()
            .map_err(|e| Error::invalid(format!("cannot run {what}: {e}")))?;
        if status.success() {
            Ok(())
        } else {
            Err(Error::invalid(format!("{what} failed ({status})")))
        }
    };
    run(
        &format!("{} -m venv", python.display()),
        Command::new(&python).args(["-m", "venv"]).arg(&dir),
    )?;
    run(
        "pip install --require-hashes",
        Command::new(dir.join("bin").join("python"))
            .args([
                "-m",
                "pip",
                "install",
                "--no-input",
                "--disable-pip-version-check",
                "--require-hashes",
                "--no-deps",
                "--only-binary=:all:",
                "-r",
            ])
            .arg(&lock.path),
    )?;
    let stamp = serde_json::json!({"lock": lock.rel, "lock_sha256": lock.sha256});
    let tmp = dir.join(format!("{STAMP}.tmp"));
    fs::write(&tmp, stamp.to_string()).at("cannot write", &tmp)?;
    fs::rename(&tmp, dir.join(STAMP)).at("cannot write", &dir)?;
    check(&dir, &lock)
}

/// `pyvenv.cfg`'s `home` (the interpreter's bin folder) and version.
fn pyvenv(dir: &Path) -> Result<(PathBuf, String)> {
    let p = dir.join("pyvenv.cfg");
    let text = fs::read_to_string(&p).at("cannot read", &p)?;
    let mut home = None;
    let mut version = None;
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        match k.trim() {
            "home" => home = Some(PathBuf::from(v.trim())),
            "version" | "version_info" if version.is_none() => {
                let v = v.trim();
                // version_info is 3.11.7.final.0: the release is its first three parts.
                version = Some(v.split('.').take(3).collect::<Vec<_>>().join("."));
            }
            _ => {}
        }
    }
    match (home, version) {
        (Some(h), Some(v)) if !v.is_empty() => Ok((h, v)),
        _ => Err(Error::invalid(format!(
            "{} names no home and version",
            p.display()
        ))),
    }
}

/// The distributions installed in an environment: normalized name → version.
fn installed(dir: &Path, python_version: &str) -> Result<BTreeMap<String, String>> {
    let minor: Vec<&str> = python_version.split('.').take(2).collect();
    let site = dir
        .join("lib")
        .join(format!("python{}", minor.join(".")))
        .join("site-packages");
    let mut out = BTreeMap::new();
    for e in fs::read_dir(&site).at("cannot read", &site)? {
        let e = e.at("cannot read", &site)?;
        let name = e.file_name().to_string_lossy().into_owned();
        // `<name>-<version>.dist-info`: the name has its dashes escaped, the version none.
        if let Some(stem) = name.strip_suffix(".dist-info")
            && let Some((n, v)) = stem.split_once('-')
        {
            out.insert(normalize(n), v.to_string());
        }
    }
    Ok(out)
}

/// Check a built environment against its lock.
fn check(dir: &Path, lock: &Lock) -> Result<PythonPin> {
    let stamp_path = dir.join(STAMP);
    let stamp: serde_json::Value = match fs::read(&stamp_path) {
        Ok(b) => serde_json::from_slice(&b).unwrap_or_default(),
        Err(_) => {
            return Err(Error::invalid(format!(
                "the Python environment for {} is not built (looked in {}); build it with `rsim env build`",
                lock.rel,
                dir.display()
            )));
        }
    };
    let mismatch = |why: String| {
        Error::invalid(format!(
            "the Python environment {} does not match the study's lock ({why}); rebuild it with `rsim env build`",
            dir.display()
        ))
    };
    if stamp["lock_sha256"].as_str() != Some(lock.sha256.as_str()) {
        return Err(mismatch("it was built from another lock".into()));
    }
    let (home, python_version) = pyvenv(dir)?;
    let have = installed(dir, &python_version)?;
    let mut wrong = Vec::new();
    for (name, want) in &lock.pins {
        match have.get(name) {
            None => wrong.push(format!("{name} {want} is missing")),
            Some(v) if v != want => wrong.push(format!("{name} is {v}, the lock pins {want}")),
            _ => {}
        }
    }
    for (name, v) in &have {
        if !lock.pins.contains_key(name) && !BOOTSTRAP.contains(&name.as_str()) {
            wrong.push(format!("{name} {v} is installed but not in the lock"));
        }
    }
    if !wrong.is_empty() {
        let more = if wrong.len() > 3 {
            format!(" and {} more", wrong.len() - 3)
        } else {
            String::new()
        };
        wrong.truncate(3);
        return Err(mismatch(format!("{}{more}", wrong.join("; "))));
    }
    let base_prefix = home.parent().map(Path::to_path_buf).unwrap_or(home);
    let mut versions: Vec<(String, String)> = RECORDED
        .iter()
        .filter_map(|n| have.get(*n).map(|v| (n.to_string(), v.clone())))
        .collect();
    if let Some((_, v)) = have
        .iter()
        .find(|(n, _)| n.starts_with("nvidia-cuda-runtime"))
    {
        versions.push(("cuda".into(), v.clone()));
    }
    Ok(PythonPin {
        lock: lock.rel.clone(),
        lock_sha256: lock.sha256.clone(),
        dir: dir.to_path_buf(),
        base_prefix,
        python_version,
        versions,
        driver: nvidia_driver(),
    })
}

/// The NVIDIA kernel module's version, where one is loaded.
fn nvidia_driver() -> Option<String> {
    let text = fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    driver_version(&text)
}

fn driver_version(text: &str) -> Option<String> {
    let line = text.lines().next()?;
    line.split_whitespace()
        .find(|w| {
            w.contains('.')
                && w.chars().all(|c| c.is_ascii_digit() || c == '.')
                && w.starts_with(|c: char| c.is_ascii_digit())
        })
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H1: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_lock_pins_every_requirement_exactly_with_its_hashes() {
        let text = format!(
            "# made by pip-compile\ntorch==2.15.0 \\\n    --hash=sha256:{H1} \\\n    --hash=sha256:{H1}\n\
             Typing_Extensions==4.16.0 --hash=sha256:{H1}  # via torch\n\nsafetensors[numpy]==0.8.0 --hash=sha256:{H1}\n"
        );
        let pins = parse_lock(&text).expect("lock");
        assert_eq!(pins.get("torch").map(String::as_str), Some("2.15.0"));
        assert_eq!(
            pins.get("typing-extensions").map(String::as_str),
            Some("4.16.0")
        );
        assert_eq!(pins.len(), 3);
        for (bad, why) in [
            ("torch>=2.0 --hash=sha256:{H}", "not pinned exactly"),
            ("torch==2.* --hash=sha256:{H}", "not pinned exactly"),
            ("torch==2.15.0", "has no --hash"),
            ("torch==2.15.0 --hash=md5:abc", "unexpected"),
            ("-e ./src", "not allowed in a lock"),
            ("--index-url https://x/simple", "not allowed in a lock"),
            (
                "torch==2.15.0 ; sys_platform == 'linux' --hash=sha256:{H}",
                "markers",
            ),
            (
                "torch==2.15.0 --hash=sha256:{H}\ntorch==2.14.0 --hash=sha256:{H}",
                "pinned twice",
            ),
            ("# nothing\n", "pins no requirement"),
        ] {
            let e = parse_lock(&bad.replace("{H}", H1)).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    /// A lock that is a link (to a pipe, a FIFO, a file elsewhere) or a FIFO itself is refused
    /// at once, never waited on; a regular lock inside the study reads.
    #[test]
    fn a_lock_that_is_a_link_or_a_fifo_is_refused_unread() {
        let d = tempfile::tempdir().expect("tempdir");
        let pins = format!("six==1.16.0 --hash=sha256:{H1}\n");
        fs::write(d.path().join("real.lock"), &pins).expect("lock");
        assert!(read_lock(d.path(), "real.lock").is_ok());
        let fifo = d.path().join("fifo.lock");
        let c = std::ffi::CString::new(fifo.to_str().expect("utf8")).expect("cstr");
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        std::os::unix::fs::symlink("/proc/self/fd/1", d.path().join("out.lock")).expect("link");
        std::os::unix::fs::symlink(&fifo, d.path().join("to-fifo.lock")).expect("link");
        std::os::unix::fs::symlink("real.lock", d.path().join("to-real.lock")).expect("link");
        for rel in ["fifo.lock", "out.lock", "to-fifo.lock", "to-real.lock"] {
            let t = std::time::Instant::now();
            let err = read_lock(d.path(), rel).expect_err(rel).message;
            assert!(err.contains("environment.lock"), "{rel}: {err}");
            assert!(
                t.elapsed() < std::time::Duration::from_secs(5),
                "{rel} waited"
            );
        }
    }

    #[test]
    fn names_compare_as_pep_503_says() {
        assert_eq!(normalize("Typing_Extensions"), "typing-extensions");
        assert_eq!(normalize("zope.interface"), "zope-interface");
        assert_eq!(normalize("a--b__c"), "a-b-c");
    }

    #[test]
    fn labels_name_the_lock_hash() {
        let pin = PythonPin {
            lock: "env/requirements.lock".into(),
            lock_sha256: H1.into(),
            dir: "/e".into(),
            base_prefix: "/p".into(),
            python_version: "3.11.7".into(),
            versions: vec![("torch".into(), "2.15.0".into())],
            driver: Some("570.86.15".into()),
        };
        let l = pin.label();
        assert_eq!(
            l,
            format!(
                "python lock=env/requirements.lock@{H1} python=3.11.7 torch=2.15.0 driver=570.86.15"
            )
        );
        assert!(is_pinned_label(&l));
        assert!(crate::jobs::is_pinned(&l));
        for bad in [
            "python",
            "python lock=env/requirements.lock",
            "python lock=@0123",
            "python lock=x@short python=3.11",
        ] {
            assert!(!is_pinned_label(bad), "{bad}");
        }
        assert_eq!(
            driver_version(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Wed Jan 15 2026\nGCC version: 12\n"
            )
            .as_deref(),
            Some("570.86.15")
        );
    }

    /// A fake environment: pyvenv.cfg, a stamp and dist-info folders.
    fn fake_env(dir: &Path, lock: &Lock, dists: &[(&str, &str)]) {
        let site = dir.join("lib/python3.11/site-packages");
        fs::create_dir_all(&site).expect("site");
        fs::write(
            dir.join("pyvenv.cfg"),
            "home = /opt/py/bin\ninclude-system-site-packages = false\nversion = 3.11.7\n",
        )
        .expect("cfg");
        for (n, v) in dists {
            fs::create_dir_all(site.join(format!("{n}-{v}.dist-info"))).expect("dist");
        }
        fs::write(
            dir.join(STAMP),
            serde_json::json!({"lock_sha256": lock.sha256}).to_string(),
        )
        .expect("stamp");
    }

    #[test]
    fn an_environment_that_drifted_from_its_lock_is_refused_with_what_drifted() {
        let d = tempfile::tempdir().expect("tempdir");
        fs::write(
            d.path().join("req.lock"),
            format!(
                "torch==2.15.0 --hash=sha256:{H1}\ntyping-extensions==4.16.0 --hash=sha256:{H1}\n"
            ),
        )
        .expect("lock");
        let lock = read_lock(d.path(), "req.lock").expect("lock");
        let env = d.path().join("env");
        let e = check(&env, &lock).expect_err("not built");
        assert!(e.message.contains("rsim env build"), "{}", e.message);
        fake_env(
            &env,
            &lock,
            &[
                ("torch", "2.15.0"),
                ("typing_extensions", "4.16.0"),
                ("pip", "23.2.1"),
            ],
        );
        let pin = check(&env, &lock).expect("matches");
        assert_eq!(pin.base_prefix, Path::new("/opt/py"));
        assert_eq!(pin.python_version, "3.11.7");
        assert_eq!(pin.versions, [("torch".to_string(), "2.15.0".to_string())]);
        assert_eq!(pin.read_paths(), [env.clone(), PathBuf::from("/opt/py")]);
        // A package installed by hand, and one changed in version.
        fs::create_dir_all(env.join("lib/python3.11/site-packages/requests-2.0.dist-info"))
            .expect("extra");
        let e = check(&env, &lock).expect_err("extra");
        assert!(
            e.message
                .contains("requests 2.0 is installed but not in the lock"),
            "{}",
            e.message
        );
        fs::remove_dir_all(env.join("lib/python3.11/site-packages/requests-2.0.dist-info"))
            .expect("rm");
        fs::rename(
            env.join("lib/python3.11/site-packages/torch-2.15.0.dist-info"),
            env.join("lib/python3.11/site-packages/torch-2.14.0.dist-info"),
        )
        .expect("downgrade");
        let e = check(&env, &lock).expect_err("changed");
        assert!(
            e.message.contains("torch is 2.14.0, the lock pins 2.15.0"),
            "{}",
            e.message
        );
        // The lock changed under a built environment.
        fs::write(
            d.path().join("req.lock"),
            format!("torch==2.14.0 --hash=sha256:{H1}\n"),
        )
        .expect("lock");
        let lock2 = read_lock(d.path(), "req.lock").expect("lock");
        let e = check(&env, &lock2).expect_err("other lock");
        assert!(e.message.contains("another lock"), "{}", e.message);
        // A lock that is a symlink out of the study is not read.
        let study = d.path().join("study");
        fs::create_dir_all(&study).expect("study");
        std::os::unix::fs::symlink(d.path().join("req.lock"), study.join("req.lock"))
            .expect("symlink");
        let e = read_lock(&study, "req.lock").expect_err("outside");
        assert!(
            e.message.contains("leads outside the study"),
            "{}",
            e.message
        );
        let e = read_lock(&study, "../req.lock").expect_err("dotdot");
        assert!(e.message.contains("environment.lock"), "{}", e.message);
        // A lock too big to be one is not read.
        let f = fs::File::create(study.join("big.lock")).expect("big");
        f.set_len(MAX_LOCK_BYTES + 1).expect("size");
        let e = read_lock(&study, "big.lock").expect_err("big");
        assert!(e.message.contains("at most"), "{}", e.message);
    }
}
