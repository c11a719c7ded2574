//! Job environments, named so that the record says exactly what a job ran in (`JobRecord.env`, the
//! `Rsim-Env` trailer):
//!
//! - `host program=<name>@<sha256/16> kernel=<os>-<release> arch=<machine>`: the job program's
//!   hash, the kernel and the architecture (`host_fingerprint`);
//! - `nix:<flake>#sha256-…`: a Nix flake pinned to its `narHash` **before the job is admitted**
//!   (`pin_flake`); the job then runs against Nix's locked reference to that very content
//!   (`NixPin::wrap`).
//!
//! - `python lock=<path>@<sha256> python=<version> torch=… …`: a Python environment checked
//!   against its lock (`pyenv`).
//!
//! A job whose environment cannot be pinned does not run; `is_pinned` is the test the OS applies
//! before a job runs and `rsim audit` / `rsim fsck` apply to the record.

use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::error::{Error, IoContext, Result};

/// The `host` environment as recorded with a job: the program's sha256 (first 16 hex digits), the
/// kernel and the architecture, e.g. `host program=rsim@1a2b… kernel=Linux-6.1 arch=x86_64`.
/// Hashing a ~250 MB debug rsim takes about a second, so hashes are cached in `cache_dir` keyed by
/// the program's path, size and modification time (shared by every process of the study).
pub fn host_fingerprint(study_root: &Path, command: &[String], cache_dir: &Path) -> Result<String> {
    let mut out = String::from("host");
    if let Some(prog) = command
        .first()
        .and_then(|p| super::resolve_program(study_root, p))
    {
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

/// Whether an environment label names what a job ran in: a host fingerprint (`host` with the
/// program, kernel or architecture) or a Nix flake with its narHash (`nix:<flake>#sha256-…`).
/// A bare `host`, `nix:<flake>` without a hash or `nix:<flake>#unresolved` (what rsim recorded
/// before flakes were pinned ahead of their jobs) is not.
pub fn is_pinned(env: &str) -> bool {
    if let Some(fields) = env.strip_prefix("host ") {
        return fields.split(' ').any(|f| {
            ["program=", "kernel=", "arch="]
                .iter()
                .any(|k| f.len() > k.len() && f.starts_with(k))
        });
    }
    if super::pyenv::is_pinned_label(env) {
        return true;
    }
    env.strip_prefix("nix:")
        .and_then(|rest| rest.rsplit_once('#'))
        .is_some_and(|(flake, hash)| !flake.is_empty() && is_nar_hash(hash))
}

/// A Nix narHash in SRI form: `sha256-` and the base64 of 32 bytes.
fn is_nar_hash(h: &str) -> bool {
    h.strip_prefix("sha256-").is_some_and(|b| {
        b.len() == 44
            && b.ends_with('=')
            && b[..43]
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/')
    })
}

/// Nix's own variables that choose the store and the configuration it uses. When rsim runs with
/// any of them set, the job's `nix develop` gets the same values, so the job reads the flake from
/// the store it was pinned in. `NIX_CONFIG` is not passed: it may hold access tokens.
pub const NIX_STORE_VARS: &[&str] = &[
    "NIX_REMOTE",
    "NIX_STORE_DIR",
    "NIX_STATE_DIR",
    "NIX_LOG_DIR",
    "NIX_CONF_DIR",
];

/// A flake pinned to the content Nix hashed: what a job in a `nix` environment runs against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NixPin {
    /// The flake as configured, e.g. `path:/study/env`.
    pub reference: String,
    /// Nix's locked reference to the hashed content, e.g.
    /// `path:/study/env?lastModified=…&narHash=sha256-…`.
    pub locked: String,
    /// The flake's narHash, `sha256-…`.
    pub nar_hash: String,
    /// `NIX_STORE_VARS` as rsim saw them when it pinned the flake (the set ones only).
    pub nix_vars: Vec<(String, String)>,
}

impl NixPin {
    /// The environment as the record names it: `nix:<flake>#<narHash>`.
    pub fn label(&self) -> String {
        format!("nix:{}#{}", self.reference, self.nar_hash)
    }

    /// `command` in the flake's dev shell, from the locked reference: Nix serves the content it
    /// hashed from its store, or — when it must read the flake's files again and they changed —
    /// stops with "NAR hash mismatch". Either way nothing but the recorded content runs.
    pub fn wrap(&self, command: Vec<String>) -> Vec<String> {
        let mut out = Vec::new();
        if !self.nix_vars.is_empty() {
            out.push("env".to_string());
            out.extend(self.nix_vars.iter().map(|(k, v)| format!("{k}={v}")));
        }
        out.extend([
            "nix".to_string(),
            "develop".to_string(),
            self.locked.clone(),
            "--command".to_string(),
        ]);
        out.extend(command);
        out
    }
}

/// The flake reference Nix is given: a relative path is a folder inside the study (point it at a
/// folder holding flake.nix, not at the study root, or Nix copies the object store too).
pub fn flake_reference(study_root: &Path, flake: &str) -> Result<String> {
    if flake.contains(':') {
        return Ok(flake.to_string());
    }
    crate::config::check_relative_path(flake)
        .map_err(|m| Error::invalid(format!("environment.flake: {m}")))?;
    Ok(format!("path:{}", study_root.join(flake).display()))
}

/// Pauses before each retry of a `nix flake metadata` that failed transiently (±50% jitter,
/// about 6 s in all).
const RETRY_PAUSES_MS: &[u64] = &[200, 400, 800, 1600, 3200];

/// Failures that a retry cures. The first use of a Nix store by several processes at once — a
/// fresh machine whose first jobs start together — fails in some of them while another creates
/// the store, and Nix retries none of these: `SQLite database '…/db/db.sqlite' is busy` (its
/// schema is being created), `'…/db/schema' is corrupt` (the schema file exists but is not
/// written yet) and `creating symlink from '…/gcroots/profiles' … File exists` (its state
/// directories). The others are a busy cache, a restarting daemon and a network hiccup while
/// fetching a remote flake.
const TRANSIENT: &[&str] = &[
    "is busy",
    "database is locked",
    "schema' is corrupt",
    "File exists",
    "Resource temporarily unavailable",
    "cannot connect to socket",
    "Connection reset",
    "Timeout was reached",
    "unable to download",
];

fn is_transient(nix_error: &str) -> bool {
    TRANSIENT.iter().any(|p| nix_error.contains(p))
}

/// Pin the study's flake: its narHash and locked reference from `nix flake metadata --json`,
/// retrying failures that look transient. The error says why, in Nix's own words.
pub fn pin_flake(study_root: &Path, flake: &str) -> Result<NixPin> {
    let reference = flake_reference(study_root, flake)?;
    let pauses: Vec<Duration> = RETRY_PAUSES_MS
        .iter()
        .map(|ms| Duration::from_millis(*ms))
        .collect();
    pin_with(&[OsStr::new("nix")], &reference, &pauses, PIN_TIMEOUT)
}

/// How long one `nix flake metadata` may take (an unreachable substituter or a hung daemon
/// would otherwise hold the agent's action, and the study's write, for ever).
const PIN_TIMEOUT: Duration = Duration::from_secs(120);

/// `pin_flake` with `nix` as the program and arguments that run Nix (tests run a stand-in).
fn pin_with(
    nix: &[&OsStr],
    reference: &str,
    pauses: &[Duration],
    limit: Duration,
) -> Result<NixPin> {
    let (program, nix_args) = nix
        .split_first()
        .ok_or_else(|| Error::internal("no Nix program to run"))?;
    let nix_vars: Vec<(String, String)> = NIX_STORE_VARS
        .iter()
        .filter_map(|k| {
            std::env::var(k)
                .ok()
                .filter(|v| !v.is_empty())
                .map(|v| (k.to_string(), v))
        })
        .collect();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let out = crate::util::proc::output_within(
            Command::new(program)
                .args(nix_args)
                .args(["flake", "metadata", "--json", reference])
                .stdin(Stdio::null()),
            limit,
        )
        .map_err(|e| {
            Error::invalid(format!(
                "cannot run `nix flake metadata {reference}`: {e} (is Nix installed and on PATH?)"
            ))
        })?
        .ok_or_else(|| {
            Error::invalid(format!(
                "`nix flake metadata {reference}` did not answer within {} s (a substituter it cannot reach, or a busy Nix daemon?); nothing was started",
                limit.as_secs()
            ))
        })?;
        if out.status.success() {
            return parse_metadata(reference, &out.stdout, nix_vars);
        }
        let why = nix_error(&out.stderr, out.status);
        match pauses.get(attempts - 1) {
            Some(pause) if is_transient(&why) => {
                let pause = pause.mul_f64(0.5 + rand::random::<f64>());
                tracing::warn!(
                    flake = reference,
                    attempt = attempts,
                    "nix flake metadata failed transiently; retrying in {:.1} s: {why}",
                    pause.as_secs_f64()
                );
                std::thread::sleep(pause);
            }
            _ => {
                let tries = if attempts > 1 {
                    format!(" ({attempts} attempts)")
                } else {
                    String::new()
                };
                return Err(Error::invalid(format!(
                    "`nix flake metadata {reference}` failed{tries}: {why}"
                )));
            }
        }
    }
}

/// What Nix said on stderr, without colours, blank lines and the errors it ignored itself
/// (at most the last 2000 characters).
fn nix_error(stderr: &[u8], status: std::process::ExitStatus) -> String {
    let text = strip_ansi(&String::from_utf8_lossy(stderr));
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty() && !l.contains("(ignored)"))
        .collect();
    let joined = lines.join("\n");
    if joined.is_empty() {
        return format!("Nix printed nothing on stderr ({status})");
    }
    let mut cut = joined.len().saturating_sub(2000);
    while !joined.is_char_boundary(cut) {
        cut += 1;
    }
    joined[cut..].to_string()
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                // CSI: parameters and intermediates up to a final byte in @..~.
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The pin from `nix flake metadata --json` output: `locked.narHash` (older Nix: `narHash`) and
/// the locked reference (`lockedUrl`, older Nix: `url`; without either, the reference with the
/// narHash appended, which Nix checks the same way).
fn parse_metadata(
    reference: &str,
    stdout: &[u8],
    nix_vars: Vec<(String, String)>,
) -> Result<NixPin> {
    let v: serde_json::Value = serde_json::from_slice(stdout).map_err(|e| {
        Error::invalid(format!(
            "`nix flake metadata --json {reference}` printed no JSON ({e}): {}",
            crate::util::text::sanitize_line(&String::from_utf8_lossy(stdout))
        ))
    })?;
    let nar_hash = v["locked"]["narHash"]
        .as_str()
        .or(v["narHash"].as_str())
        .unwrap_or_default();
    if !is_nar_hash(nar_hash) {
        return Err(Error::invalid(format!(
            "`nix flake metadata --json {reference}` gave no narHash (got {nar_hash:?}); \
             the flake's content cannot be pinned"
        )));
    }
    let locked = match v["lockedUrl"].as_str().or(v["url"].as_str()) {
        Some(u) if !u.is_empty() => u.to_string(),
        _ => {
            let sep = if reference.contains('?') { '&' } else { '?' };
            format!("{reference}{sep}narHash={nar_hash}")
        }
    };
    Ok(NixPin {
        reference: reference.to_string(),
        locked,
        nar_hash: nar_hash.to_string(),
        nix_vars,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "sha256-8MzybuPbP9bXj2jTY+8+dnVCjpRSpf/o5vBL/Dncpoo=";

    #[test]
    fn pinned_environments_name_what_ran() {
        for ok in [
            "host program=rsim@0123456789abcdef kernel=Linux-6.1 arch=x86_64",
            "host kernel=Linux-6.1 arch=x86_64",
            &format!("nix:path:/s/env#{HASH}"),
            &format!("nix:github:o/r#{HASH}"),
        ] {
            assert!(is_pinned(ok), "{ok}");
        }
        for bad in [
            "",
            "host",
            "host ",
            "host kernel=",
            "nix:path:/s/env#unresolved",
            "nix:path:/s/env",
            &format!("nix:#{HASH}"),
            "nix:path:/s/env#sha256-short=",
            &format!("nix:path:/s/env#{HASH}x"),
            "conda:env",
        ] {
            assert!(!is_pinned(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_races_of_a_fresh_store_are_transient_and_a_broken_flake_is_not() {
        // What concurrent first uses of a fresh store printed (Nix 2.8).
        for race in [
            "error: SQLite database '/nix/var/nix/db/db.sqlite' is busy",
            "error: '/nix/var/nix/db/schema' is corrupt",
            "error: creating symlink from '/nix/var/nix/gcroots/profiles' to '/nix/var/nix/profiles': File exists",
        ] {
            assert!(is_transient(race), "{race}");
        }
        for lasting in [
            "error: undefined variable 'this'",
            "error: getting status of '/s/env': No such file or directory",
            "error: experimental Nix feature 'flakes' is disabled",
        ] {
            assert!(!is_transient(lasting), "{lasting}");
        }
    }

    /// A stand-in `nix` that fails the first `fail` calls with `message` and then prints
    /// `json`; it counts its calls in `calls`.
    /// (Run as `sh <script>`: executing a file just written races with other tests' forks, ETXTBSY.)
    fn fake_nix(dir: &Path, fail: u32, message: &str, json: &str) -> std::path::PathBuf {
        let p = dir.join("nix");
        fs::write(dir.join("message"), message).expect("write message");
        fs::write(dir.join("json"), json).expect("write json");
        fs::write(
            &p,
            format!(
                "#!/bin/sh\ncd '{d}'\nn=$(cat calls 2>/dev/null || echo 0); n=$((n+1)); echo $n > calls\n\
                 if [ $n -le {fail} ]; then printf '\\033[31;1merror:\\033[0m ' >&2; cat message >&2; echo >&2; exit 1; fi\n\
                 echo 'error (ignored): error: cannot find flake' >&2\ncat json\n",
                d = dir.display()
            ),
        )
        .expect("write fake nix");
        p
    }

    fn calls(dir: &Path) -> u32 {
        fs::read_to_string(dir.join("calls"))
            .expect("calls")
            .trim()
            .parse()
            .expect("count")
    }

    fn metadata(url: Option<&str>) -> String {
        let url = url.map_or(String::new(), |u| format!(r#""url":"{u}","#));
        format!(r#"{{{url}"locked":{{"narHash":"{HASH}","type":"path"}}}}"#)
    }

    const PAUSES: &[Duration] = &[Duration::from_millis(1); 5];
    const LIMIT: Duration = Duration::from_secs(30);

    #[test]
    fn a_nix_that_never_answers_is_stopped_at_the_time_limit() {
        let d = tempfile::tempdir().expect("tempdir");
        let nix = d.path().join("nix");
        // A Nix that hangs, with a child of its own holding the pipes.
        fs::write(&nix, "sleep 60 & sleep 60\n").expect("write");
        let t = std::time::Instant::now();
        let e = pin_with(
            &[OsStr::new("sh"), nix.as_os_str()],
            "path:/s/env",
            PAUSES,
            Duration::from_millis(300),
        )
        .expect_err("hung");
        assert!(e.message.contains("did not answer within"), "{}", e.message);
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    }

    #[test]
    fn transient_failures_are_retried_and_the_locked_reference_is_what_runs() {
        let d = tempfile::tempdir().expect("tempdir");
        let url = format!("path:/s/env?lastModified=1&narHash={HASH}");
        let nix = fake_nix(
            d.path(),
            2,
            "SQLite database '/nix/var/nix/db/db.sqlite' is busy",
            &metadata(Some(&url)),
        );
        let pin = pin_with(
            &[OsStr::new("sh"), nix.as_os_str()],
            "path:/s/env",
            PAUSES,
            LIMIT,
        )
        .expect("pinned");
        assert_eq!(calls(d.path()), 3, "two transient failures, then success");
        assert_eq!(pin.label(), format!("nix:path:/s/env#{HASH}"));
        assert!(is_pinned(&pin.label()));
        let cmd = NixPin {
            nix_vars: vec![],
            ..pin.clone()
        }
        .wrap(vec!["train".into()]);
        assert_eq!(cmd, ["nix", "develop", url.as_str(), "--command", "train"]);
        let with_store = NixPin {
            nix_vars: vec![("NIX_STORE_DIR".into(), "/s/store".into())],
            ..pin
        }
        .wrap(vec!["train".into()]);
        assert_eq!(&with_store[..3], ["env", "NIX_STORE_DIR=/s/store", "nix"]);
    }

    #[test]
    fn a_lasting_failure_is_nixs_own_message_after_the_retries_or_at_once() {
        let d = tempfile::tempdir().expect("tempdir");
        let nix = fake_nix(
            d.path(),
            99,
            "creating symlink from /nix/var/nix/gcroots/profiles: File exists",
            &metadata(None),
        );
        let e = pin_with(
            &[OsStr::new("sh"), nix.as_os_str()],
            "path:/s/env",
            PAUSES,
            LIMIT,
        )
        .expect_err("never pinned");
        assert_eq!(calls(d.path()), 6, "one attempt and five retries");
        assert!(e.message.contains("(6 attempts)"), "{}", e.message);
        assert!(
            e.message.ends_with(
                "error: creating symlink from /nix/var/nix/gcroots/profiles: File exists"
            ),
            "Nix's words, without colours: {}",
            e.message
        );
        // An error a retry cannot cure is not retried.
        let d = tempfile::tempdir().expect("tempdir");
        let nix = fake_nix(d.path(), 99, "undefined variable this", &metadata(None));
        let e = pin_with(
            &[OsStr::new("sh"), nix.as_os_str()],
            "path:/s/env",
            PAUSES,
            LIMIT,
        )
        .expect_err("never pinned");
        assert_eq!(calls(d.path()), 1);
        assert_eq!(
            e.message,
            "`nix flake metadata path:/s/env` failed: error: undefined variable this"
        );
        // No Nix at all.
        let e = pin_with(
            &[d.path().join("no-nix").as_os_str()],
            "path:/s/env",
            PAUSES,
            LIMIT,
        )
        .expect_err("no nix");
        assert!(e.message.contains("is Nix installed"), "{}", e.message);
    }

    #[test]
    fn metadata_without_a_narhash_pins_nothing_and_without_a_url_the_hash_locks_the_reference() {
        let d = tempfile::tempdir().expect("tempdir");
        let nix = fake_nix(d.path(), 0, "", r#"{"locked":{"type":"path"}}"#);
        let e = pin_with(
            &[OsStr::new("sh"), nix.as_os_str()],
            "path:/s/env",
            PAUSES,
            LIMIT,
        )
        .expect_err("no hash");
        assert!(e.message.contains("no narHash"), "{}", e.message);
        let d = tempfile::tempdir().expect("tempdir");
        let nix = fake_nix(d.path(), 0, "", &metadata(None));
        let pin = pin_with(
            &[OsStr::new("sh"), nix.as_os_str()],
            "path:/s/env",
            PAUSES,
            LIMIT,
        )
        .expect("pinned");
        assert_eq!(pin.locked, format!("path:/s/env?narHash={HASH}"));
    }
}
