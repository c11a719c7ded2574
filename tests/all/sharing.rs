//! A study shared as a git repository, through the programs a reader runs: the owner and a
//! reader are two identities (two HOMEs, so two machine keys and one private study key). A clone
//! opens read-only and proves every commit with the public key committed on main; a forged or
//! foreign commit is named; a key rotation keeps every earlier commit proven; and a hostile
//! repository — job state, pid and Slurm files, symlinks out of it, a crafted index — read through
//! every read path (CLI views, `verify`, `report --html`, the MCP server over stdio and HTTP, the
//! language server) kills, cancels, deletes, creates and commits nothing.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{example_study, rsim};

/// One identity: its own HOME (machine key, nothing else).
pub(crate) struct Person {
    home: PathBuf,
    /// Extra PATH entries first (fake Slurm clients that log their calls).
    path: Option<String>,
}

impl Person {
    pub(crate) fn new(d: &Path, name: &str) -> Person {
        let home = d.join(name);
        std::fs::create_dir_all(&home).expect("home");
        Person { home, path: None }
    }
    pub(crate) fn cmd(&self) -> Command {
        let mut c = rsim();
        c.env("HOME", &self.home).env_remove("XDG_STATE_HOME");
        if let Some(p) = &self.path {
            c.env("PATH", p);
        }
        c
    }
    pub(crate) fn run(&self, study: &Path, args: &[&str]) -> Output {
        self.cmd()
            .arg("-C")
            .arg(study)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("spawn rsim")
    }
    /// `rsim clone FROM TO` as this person; it must succeed.
    pub(crate) fn clone_ok(&self, from: &Path, to: &Path) {
        let out = self
            .cmd()
            .arg("clone")
            .arg(from)
            .arg(to)
            .output()
            .expect("clone");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    pub(crate) fn ok(&self, study: &Path, args: &[&str]) -> String {
        let out = self.run(study, args);
        assert!(
            out.status.success(),
            "rsim {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "x")
        .env("GIT_AUTHOR_EMAIL", "x@x.invalid")
        .env("GIT_COMMITTER_NAME", "x")
        .env("GIT_COMMITTER_EMAIL", "x@x.invalid")
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A commit on `parent` whose tree is `tree_from`'s with `files` written into it, signed with
/// the study's own key (what a key holder can forge): its id.
pub(crate) fn signed_onto(
    study: &Path,
    scratch: &Path,
    tree_from: &str,
    parent: &str,
    files: &[(&str, Vec<u8>)],
    message: &str,
) -> String {
    let index = scratch.join("forging-index");
    let with_index = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(study)
            .args(args)
            .env("GIT_INDEX_FILE", &index)
            .output()
            .expect("git");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    with_index(&["read-tree", tree_from]);
    for (path, bytes) in files {
        let file = scratch.join("forged-file");
        std::fs::write(&file, bytes).expect("write");
        let blob = git(study, &["hash-object", "-w", file.to_str().expect("utf8")]);
        with_index(&[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("100644,{blob},{path}"),
        ]);
    }
    let tree = with_index(&["write-tree"]);
    let tip = git(study, &["rev-parse", parent]);
    let key = study.join(".rsim/keys/record-signing-key");
    git(
        study,
        &[
            "-c",
            "gpg.format=ssh",
            "-c",
            &format!("user.signingkey={}", key.display()),
            "commit-tree",
            "-S",
            "-p",
            &tip,
            "-m",
            message,
            &tree,
        ],
    )
}

/// The owner's study with a few recorded actions on two nodes.
pub(crate) fn owners_study(owner: &Person) -> (tempfile::TempDir, PathBuf) {
    let (d, study) = example_study();
    owner.ok(
        &study,
        &[
            "branch",
            "--from",
            "n0",
            "--title",
            "more data",
            "--hypothesis",
            "h",
        ],
    );
    owner.ok(
        &study,
        &[
            "call",
            "conclude",
            r#"{"node":"n1","findings":"nothing yet","outcome":"inconclusive"}"#,
        ],
    );
    (d, study)
}

#[test]
fn a_clone_is_read_only_and_proves_every_commit_with_the_committed_public_key() {
    let d = tempfile::tempdir().expect("tempdir");
    let owner = Person::new(d.path(), "owner");
    let reader = Person::new(d.path(), "reader");
    let (_s, study) = owners_study(&owner);
    // The public half is on main; the private half never is.
    let tracked = git(&study, &["ls-tree", "-r", "--name-only", "main"]);
    assert!(tracked.lines().any(|l| l == "allowed_signers"), "{tracked}");
    assert!(!tracked.contains("record-signing-key"), "{tracked}");

    let clone = d.path().join("clone");
    let out = reader
        .cmd()
        .args(["clone"])
        .arg(&study)
        .arg(&clone)
        .output()
        .expect("clone");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("read-only") && said.contains("ok: every action"),
        "{said}"
    );
    assert!(!clone.join(".rsim/keys/record-signing-key").exists());

    // Every view works, built from the clone's git alone, and every commit is proven.
    let dag = reader.ok(&clone, &["--json", "dag"]);
    assert!(dag.contains("more data"), "{dag}");
    reader.ok(&clone, &["log"]);
    reader.ok(&clone, &["show", "n1"]);
    reader.ok(&clone, &["fsck"]);
    reader.ok(&clone, &["audit"]);
    let html = clone.join("report.html");
    reader.ok(&clone, &["report", "--html", html.to_str().expect("utf8")]);
    assert!(std::fs::metadata(&html).expect("report").len() > 1000);
    let v: Value = serde_json::from_str(&reader.ok(&clone, &["--json", "verify"])).expect("json");
    assert_eq!(
        v["verified"], 4,
        "genesis, n0 init, n1 branch and conclude: {v}"
    );
    assert_eq!(v["read_only"], true);
    let fp = v["genesis_key"].as_str().expect("genesis key").to_string();
    reader.ok(&clone, &["verify", "--key", &fp]);
    let wrong = reader.run(&clone, &["verify", "--key", "SHA256:not-the-studys"]);
    assert!(!wrong.status.success());
    // Plain git proves them too: `rsim clone` set the one config line the README documents.
    git(&clone, &["verify-commit", "rsim/n/n1"]);
    let shown = git(&clone, &["log", "--show-signature", "-1", "rsim/n/n1"]);
    assert!(
        shown.contains("Good \"git\" signature for rsim@study"),
        "{shown}"
    );

    // The servers serve it as an observer and say it is read-only.
    let (_, ok, said) = http_serve(&reader, &clone);
    assert!(ok && said.contains("\"read_only\""), "{said}");
    let (_, ok, said) = mcp_stdio(&reader, &clone);
    assert!(ok && said.contains("read-only clone"), "{said}");
    let tools: Vec<String> = said
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["id"] == 2)
        .flat_map(|v| {
            v["result"]["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["name"].as_str().map(str::to_string))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(tools.iter().any(|t| t == "dag"), "{tools:?}");
    for write in [
        "branch",
        "run_sft",
        "evaluate",
        "conclude",
        "register_dataset",
    ] {
        assert!(
            !tools.iter().any(|t| t == write),
            "{write} listed: {tools:?}"
        );
    }
    let (_, ok, said) = lsp(&reader, &clone);
    assert!(
        ok && said.contains("\"read_only\":\"the study's private"),
        "{said}"
    );

    // Every write is refused with one clear error, and nothing is recorded.
    let refs = git(&clone, &["for-each-ref"]);
    let dataset = crate::common::inline("n0", "d", &[("1+1=".into(), "2".into())]).to_string();
    for args in [
        vec![
            "branch",
            "--from",
            "n0",
            "--title",
            "t",
            "--hypothesis",
            "h",
        ],
        vec![
            "call",
            "conclude",
            r#"{"node":"n0","findings":"f","outcome":"negative"}"#,
        ],
        vec!["recover"],
        vec!["key", "rotate"],
        vec!["call", "register_dataset", dataset.as_str()],
    ] {
        let out = reader.run(&clone, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{args:?} succeeded in a read-only clone"
        );
        assert!(err.contains("read-only clone:"), "{args:?}: {err}");
    }
    assert_eq!(
        git(&clone, &["for-each-ref"]),
        refs,
        "nothing was committed"
    );

    // The owner's copy is unaffected: it still writes, and a reader fetching it proves the new
    // commit too.
    owner.ok(
        &study,
        &[
            "branch",
            "--from",
            "n1",
            "--title",
            "next",
            "--hypothesis",
            "h",
        ],
    );
    git(
        &clone,
        &[
            "fetch",
            "-q",
            "origin",
            "+refs/heads/rsim/*:refs/heads/rsim/*",
        ],
    );
    let v: Value = serde_json::from_str(&reader.ok(&clone, &["--json", "verify"])).expect("json");
    assert_eq!(v["verified"], 5, "{v}");
    assert!(reader.ok(&clone, &["dag"]).contains("next"));
}

#[test]
fn a_forged_or_foreign_commit_in_a_clone_is_named_and_a_rotation_keeps_the_past_proven() {
    let d = tempfile::tempdir().expect("tempdir");
    let owner = Person::new(d.path(), "owner");
    let reader = Person::new(d.path(), "reader");
    let (_s, study) = owners_study(&owner);
    // Rotate: main records the new key in force and the old one retired, signed by the old key.
    let old_key = d.path().join("old-key");
    std::fs::copy(study.join(".rsim/keys/record-signing-key"), &old_key).expect("keep old key");
    let r: Value =
        serde_json::from_str(&owner.ok(&study, &["--json", "key", "rotate"])).expect("json");
    assert_ne!(r["retired"], r["in_force"]);
    std::thread::sleep(Duration::from_millis(1100));
    owner.ok(
        &study,
        &[
            "branch",
            "--from",
            "n0",
            "--title",
            "after rotation",
            "--hypothesis",
            "h",
        ],
    );
    let v: Value = serde_json::from_str(&owner.ok(&study, &["--json", "verify"])).expect("json");
    assert_eq!(v["keys"].as_array().map(Vec::len), Some(2), "{v}");
    assert!(
        v["problems"].as_array().expect("problems").is_empty(),
        "{v}"
    );

    let clone = d.path().join("clone");
    reader
        .cmd()
        .arg("clone")
        .arg(&study)
        .arg(&clone)
        .output()
        .expect("clone");
    reader.ok(&clone, &["verify"]);
    git(&clone, &["verify-commit", "rsim/n/n2"]);
    git(&clone, &["verify-commit", "rsim/n/n1"]);

    // A commit forged onto a node: one signed with the retired key after its retirement, one
    // signed with the reader's own key, one unsigned. Each is named, oldest first.
    let tip = git(&clone, &["rev-parse", "rsim/n/n2"]);
    let tree = git(&clone, &["rev-parse", "rsim/n/n2^{tree}"]);
    std::fs::set_permissions(
        &old_key,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod");
    let forged = git(
        &clone,
        &[
            "-c",
            "gpg.format=ssh",
            "-c",
            &format!("user.signingkey={}", old_key.display()),
            "commit-tree",
            "-S",
            "-p",
            &tip,
            "-m",
            "evaluate: a score nobody measured\n\nRsim-Node: n2\nRsim-Seq: 2\nRsim-Action: evaluate\n",
            &tree,
        ],
    );
    git(&clone, &["update-ref", "refs/heads/rsim/n/n2", &forged]);
    let out = reader.run(&clone, &["verify"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&forged) && said.contains("retired key"),
        "{said}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains(&forged));

    // A commit on main that swaps in the reader's own key is not the study's authority: the
    // study's keys stay, and the change is named.
    let theirs = d.path().join("their-key");
    let kg = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&theirs)
        .output()
        .expect("ssh-keygen");
    assert!(kg.status.success());
    let public = std::fs::read_to_string(theirs.with_extension("pub")).expect("pub");
    let work = d.path().join("work");
    git(
        d.path(),
        &[
            "clone",
            "-q",
            clone.to_str().expect("utf8"),
            work.to_str().expect("utf8"),
        ],
    );
    std::fs::write(
        work.join("allowed_signers"),
        format!("rsim@study namespaces=\"git\" {public}"),
    )
    .expect("write");
    git(
        &work,
        &[
            "-c",
            "gpg.format=ssh",
            "-c",
            &format!("user.signingkey={}", theirs.display()),
            "commit",
            "-q",
            "-S",
            "-am",
            "key: mine now",
        ],
    );
    let swap = git(&work, &["rev-parse", "HEAD"]);
    git(
        &clone,
        &[
            "fetch",
            "-q",
            "--update-head-ok",
            work.to_str().expect("utf8"),
            "main:main",
        ],
    );
    let out = reader.run(&clone, &["--json", "verify"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let problems = v["problems"].to_string();
    assert!(
        problems.contains(&swap) && problems.contains("without the study's authority"),
        "{v}"
    );
    assert_eq!(
        v["keys"].as_array().map(Vec::len),
        Some(2),
        "the study's keys stay: {v}"
    );
    // The views refuse the forged node history rather than show it as the study's, and say so
    // on every read, not only the first.
    let dag = reader.ok(&clone, &["--json", "dag"]);
    assert!(!dag.contains("a score nobody measured"), "{dag}");
    for _ in 0..2 {
        let out = reader.run(&clone, &["dag"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(
            err.contains("not this study's history")
                && err.contains("n2: ")
                && err.contains(&forged),
            "{err}"
        );
    }
}

/// A process the hostile repository names: it must outlive every read.
struct Victim(Child);

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn victim() -> Victim {
    use std::os::unix::process::CommandExt;
    Victim(
        Command::new("sleep")
            .arg("600")
            .process_group(0)
            .spawn()
            .expect("sleep"),
    )
}

fn alive(v: &mut Victim) -> bool {
    matches!(v.0.try_wait(), Ok(None))
}

/// `pid boot start` of a live process, as rsim's pid files hold it.
fn stamp_line(pid: u32) -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = &stat[stat.rfind(')').expect(")") + 1..];
    let start = rest.split_whitespace().nth(19).expect("start");
    format!("{pid} {} {start}", boot.trim())
}

/// Fake Slurm clients that log every call to `log` (and answer as if the job ran for ever).
fn fake_slurm(dir: &Path, log: &Path) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    for name in ["scancel", "squeue", "sacct", "sbatch"] {
        let p = bin.join(name);
        std::fs::write(
            &p,
            format!("#!/bin/sh\necho {name} \"$@\" >> {}\n", log.display()),
        )
        .expect("fake");
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Job state as a hostile repository carries it: a job whose writer is dead (recovery would
/// record it lost and kill its process group), whose pid file names `victim` exactly (pid, this
/// boot, its start time), with a Slurm submission and an open intent, and a forged origin stamp.
fn plant_job_state(state: &Path, id: &str, victim_pid: u32) {
    let jd = state.join("jobs").join(id);
    std::fs::create_dir_all(jd.join("out")).expect("job dir");
    std::fs::create_dir_all(state.join("jobs/open")).expect("open");
    std::fs::write(state.join("jobs/open").join(id), "1 not-a-boot 1").expect("registry");
    std::fs::write(jd.join("origin"), "0".repeat(64)).expect("origin");
    std::fs::write(jd.join("pid"), stamp_line(victim_pid)).expect("pid");
    let intent = json!({
        "job": id, "kind": "sft", "action": "run_sft", "node": "n0", "agent": "w",
        "role": "worker", "request": {}, "command": ["true"], "env": "host",
        "started_at": "2026-01-01T00:00:00Z", "started": 0.0, "writer_pid": 2147483646u32,
    });
    std::fs::write(jd.join("intent.json"), intent.to_string()).expect("intent");
    std::fs::write(jd.join("spec.json"), "{}").expect("spec");
    std::fs::write(jd.join("batch.sh"), "#!/bin/sh\n").expect("script");
    let sub = json!({"job_id": "4242", "submitted": 0.0, "cpus": 1, "gpus": 0, "units": 1.0,
        "spec": {"id": id, "dir": jd, "command": ["true"], "env": "host"}});
    std::fs::write(jd.join("submitted.json"), sub.to_string()).expect("submitted");
}

/// Every read path a reader (or an editor opening the folder) takes, none of which may act.
fn read_everything(who: &Person, study: &Path) -> Vec<(String, bool, String)> {
    let mut seen = Vec::new();
    let html = study.join("r.html");
    let html = html.to_str().expect("utf8").to_string();
    for args in [
        vec!["dag"],
        vec!["log"],
        vec!["show", "n0"],
        vec!["fsck"],
        vec!["audit"],
        vec!["report"],
        vec!["report", "--html", html.as_str()],
        vec!["verify"],
        vec!["key", "show"],
        vec!["call", "list_nodes"],
    ] {
        let out = who.run(study, &args);
        seen.push((
            args.join(" "),
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    seen.push(mcp_stdio(who, study));
    seen.push(lsp(who, study));
    seen.push(http_serve(who, study));
    seen
}

/// `rsim -C study FACE` with its stdio piped, as a host or an editor starts it.
fn spawn_face(who: &Person, study: &Path, face: &str) -> Child {
    who.cmd()
        .arg("-C")
        .arg(study)
        .arg(face)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect(face)
}

/// `rsim mcp` as a host starts it: initialize, list tools, call a query.
fn mcp_stdio(who: &Person, study: &Path) -> (String, bool, String) {
    let mut child = spawn_face(who, study, "mcp");
    let mut stdin = child.stdin.take().expect("stdin");
    let msgs = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "dag", "arguments": {}}}),
    ];
    for m in msgs {
        let _ = writeln!(stdin, "{m}");
    }
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut answers = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut line = String::new();
    while Instant::now() < deadline && !answers.contains("\"id\":3") {
        line.clear();
        if out.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        answers.push_str(&line);
    }
    drop(stdin);
    let _ = child.wait();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    (
        "mcp".into(),
        answers.contains("\"id\":3"),
        format!("{err}{answers}"),
    )
}

/// `rsim lsp` as an editor starts it on folder open: initialize, the summary the extension asks.
fn lsp(who: &Person, study: &Path) -> (String, bool, String) {
    let mut child = spawn_face(who, study, "lsp");
    let mut stdin = child.stdin.take().expect("stdin");
    let uri = format!("file://{}", study.display());
    let send = |stdin: &mut std::process::ChildStdin, m: Value| {
        let body = m.to_string();
        let _ = write!(stdin, "Content-Length: {}\r\n\r\n{body}", body.len());
        let _ = stdin.flush();
    };
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut answers = String::new();
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"processId": null, "rootUri": uri, "capabilities": {}, "workspaceFolders": [{"uri": uri, "name": "s"}]}}),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut sent = false;
    while Instant::now() < deadline && !answers.contains("\"id\":3") {
        let mut len = 0usize;
        let mut header = String::new();
        loop {
            header.clear();
            if out.read_line(&mut header).unwrap_or(0) == 0 || header.trim().is_empty() {
                break;
            }
            if let Some(n) = header.trim().strip_prefix("Content-Length: ") {
                len = n.parse().unwrap_or(0);
            }
        }
        if len == 0 {
            break;
        }
        let mut body = vec![0; len];
        if out.read_exact(&mut body).is_err() {
            break;
        }
        answers.push_str(&String::from_utf8_lossy(&body));
        answers.push('\n');
        if !sent && answers.contains("\"id\":1") {
            sent = true;
            send(
                &mut stdin,
                json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}),
            );
            send(
                &mut stdin,
                json!({"jsonrpc": "2.0", "id": 2, "method": "rsim/summary", "params": {}}),
            );
            send(
                &mut stdin,
                json!({"jsonrpc": "2.0", "id": 3, "method": "rsim/dag", "params": {}}),
            );
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    ("lsp".into(), answers.contains("\"id\":3"), answers)
}

/// `rsim serve` (MCP over HTTP and the web page): start it, fetch the page and the DAG.
fn http_serve(who: &Person, study: &Path) -> (String, bool, String) {
    let mut child = who
        .cmd()
        .arg("-C")
        .arg(study)
        .args(["serve", "--http", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut said = String::new();
    let addr = loop {
        let Some(Ok(line)) = lines.next() else {
            break None;
        };
        said.push_str(&line);
        said.push('\n');
        if let Some(u) = line.strip_prefix("rsim: the web page is at http://") {
            break Some(u.trim().trim_end_matches('/').to_string());
        }
    };
    let mut ok = false;
    if let Some(addr) = addr {
        for path in ["/", "/api/dag"] {
            if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
                s.set_read_timeout(Some(Duration::from_secs(20))).ok();
                let _ = write!(
                    s,
                    "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
                );
                let mut buf = String::new();
                let _ = s.read_to_string(&mut buf);
                ok = buf.starts_with("HTTP/1.1 200");
                said.push_str(buf.lines().next().unwrap_or(""));
                if path == "/api/dag" {
                    said.push_str(buf.split("\r\n\r\n").nth(1).unwrap_or(""));
                }
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    ("serve".into(), ok, said)
}

/// Everything outside the study a hostile repository could reach: its listing.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_hostile_repository_acts_on_nothing_through_any_read_path() {
    let d = tempfile::tempdir().expect("tempdir");
    let owner = Person::new(d.path(), "owner");
    let mut reader = Person::new(d.path(), "reader");
    let slurm_log = d.path().join("slurm-calls.log");
    reader.path = Some(fake_slurm(d.path(), &slurm_log));
    let outside = d.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("keep"), "the reader's file").expect("keep");
    let mut v = victim();
    let (_s, study) = owners_study(&owner);

    // 1. Tracked job state and a tracked symlink out of the repository: a crafted commit on main.
    let work = d.path().join("crafted");
    git(
        d.path(),
        &[
            "clone",
            "-q",
            study.to_str().expect("utf8"),
            work.to_str().expect("utf8"),
        ],
    );
    let state = work.join(".rsim");
    plant_job_state(&state, "j-evil", v.0.id());
    std::os::unix::fs::symlink(&outside, state.join("objects")).expect("symlink");
    git(&work, &["add", "-f", ".rsim"]);
    git(&work, &["commit", "-q", "-m", "results"]);
    let clone = d.path().join("tracked");
    git(
        d.path(),
        &[
            "clone",
            "-q",
            work.to_str().expect("utf8"),
            clone.to_str().expect("utf8"),
        ],
    );
    git(
        &clone,
        &[
            "fetch",
            "-q",
            "origin",
            "+refs/heads/rsim/*:refs/heads/rsim/*",
        ],
    );
    let refs = git(&clone, &["for-each-ref"]);
    for (what, ok, said) in read_everything(&reader, &clone) {
        // The language server stays up (an editor shows why), answering with the refusal.
        assert!(
            what == "lsp" || !ok,
            "{what} read a repository that tracks .rsim/: {said}"
        );
        assert!(said.contains("tracks .rsim/"), "{what}: {said}");
    }
    assert_eq!(git(&clone, &["for-each-ref"]), refs, "nothing committed");
    assert!(
        clone.join(".rsim/jobs/j-evil/intent.json").exists(),
        "nothing deleted"
    );
    assert!(
        clone.join(".rsim/jobs/open/j-evil").exists(),
        "nothing deleted"
    );

    // 2. A study directory handed over whole (untracked .rsim/ with forged job state, a crafted
    // index from another study): it opens, every view works from git, and nothing acts.
    let handed = d.path().join("handed");
    let copied = Command::new("cp")
        .args(["-a"])
        .arg(&study)
        .arg(&handed)
        .status()
        .expect("cp");
    assert!(copied.success());
    plant_job_state(&handed.join(".rsim"), "j-evil", v.0.id());
    // Its committed config names programs of its own: only the actions that start jobs run them.
    let evil = handed.join("evil.sh");
    std::fs::write(
        &evil,
        format!("#!/bin/sh\ntouch {}/ran\n", outside.display()),
    )
    .expect("evil");
    std::fs::set_permissions(&evil, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let config = std::fs::read_to_string(handed.join("rsim.toml")).expect("config");
    let config = config
        .replace(
            r#"sft = ["@rsim", "job", "train"]"#,
            r#"sft = ["./evil.sh"]"#,
        )
        .replace(
            r#"evaluate = ["@rsim", "job", "eval"]"#,
            r#"evaluate = ["./evil.sh"]"#,
        );
    assert!(config.contains("evil.sh"));
    crate::common::commit_config(&handed, &config, "jobs");
    let (_o, other) = example_study();
    for n in 0..3 {
        owner.ok(
            &other,
            &[
                "branch",
                "--from",
                "n0",
                "--title",
                &format!("crafted {n}"),
                "--hypothesis",
                "h",
            ],
        );
    }
    for f in [
        "index.sqlite",
        "index.sqlite-wal",
        "index.sqlite-shm",
        "index.origin",
    ] {
        let _ = std::fs::copy(other.join(".rsim").join(f), handed.join(".rsim").join(f));
    }
    let refs = git(&handed, &["for-each-ref"]);
    for (what, ok, said) in read_everything(&reader, &handed) {
        if what == "fsck" || what == "audit" || what == "verify" || what == "key show" {
            continue; // they may report problems with the copy; they must not act
        }
        assert!(ok, "{what} failed on a handed-over study: {said}");
        assert!(
            !said.contains("crafted 1"),
            "{what} showed the crafted index: {said}"
        );
    }
    let dag = reader.ok(&handed, &["--json", "dag"]);
    assert!(
        dag.contains("more data") && !dag.contains("crafted"),
        "{dag}"
    );
    assert_eq!(git(&handed, &["for-each-ref"]), refs, "nothing committed");
    // The copy holds the owner's key, so a write works here — and still acts on no job state
    // the copy carried: the forged job is neither recorded lost nor killed nor cancelled.
    owner.ok(
        &handed,
        &[
            "branch",
            "--from",
            "n0",
            "--title",
            "w",
            "--hypothesis",
            "h",
        ],
    );
    owner.ok(&handed, &["recover"]);
    let log = owner.ok(&handed, &["--json", "log", "--limit", "100"]);
    assert!(!log.contains("j-evil"), "{log}");
    let cancel = owner.run(&handed, &["cancel", "j-evil"]);
    assert!(!cancel.status.success());
    assert!(handed.join(".rsim/jobs/j-evil/intent.json").exists());
    assert!(handed.join(".rsim/jobs/open/j-evil").exists());

    // 3. A symlink under .rsim/ of a handed-over directory is refused, not followed.
    let linked = d.path().join("linked");
    let copied = Command::new("cp")
        .args(["-a"])
        .arg(&study)
        .arg(&linked)
        .status()
        .expect("cp");
    assert!(copied.success());
    std::fs::create_dir_all(linked.join(".rsim/jobs")).expect("jobs");
    std::os::unix::fs::symlink(&outside, linked.join(".rsim/jobs/open")).expect("symlink");
    std::os::unix::fs::symlink(&outside, linked.join(".rsim/tripwire")).expect("symlink");
    for (what, ok, said) in read_everything(&reader, &linked) {
        assert!(
            what == "lsp" || !ok,
            "{what} opened a study with a symlink under .rsim/: {said}"
        );
        assert!(said.contains("is a symlink"), "{what}: {said}");
    }
    let w = owner.run(
        &linked,
        &[
            "branch",
            "--from",
            "n0",
            "--title",
            "w",
            "--hypothesis",
            "h",
        ],
    );
    assert!(
        !w.status.success(),
        "a write through a symlinked .rsim/ entry"
    );

    // 4. A symlink deep inside the handed-over state (here in the object store): refused too.
    let deep = d.path().join("deep");
    let copied = Command::new("cp")
        .args(["-a"])
        .arg(&study)
        .arg(&deep)
        .status()
        .expect("cp");
    assert!(copied.success());
    let objects = deep.join(".rsim/objects");
    std::fs::create_dir_all(&objects).expect("objects");
    std::os::unix::fs::symlink(&outside, objects.join("ff")).expect("symlink");
    for who in [&reader, &owner] {
        let out = who.run(&deep, &["dag"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a deep symlink was followed");
        assert!(err.contains(".rsim/objects/ff is a symlink"), "{err}");
    }

    // Nothing was killed, cancelled, created or deleted outside, through any of it.
    assert!(alive(&mut v), "the process the repository named was killed");
    assert!(
        !slurm_log.exists(),
        "Slurm was called: {:?}",
        std::fs::read_to_string(&slurm_log)
    );
    assert_eq!(
        listing(&outside),
        vec!["keep".to_string()],
        "files outside the study changed"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("keep")).expect("keep"),
        "the reader's file"
    );
}

/// The next thing a crafted repository tries: files rsim reads from `main` made huge. An
/// `allowed_signers` of 2 MiB is never read whole — the change is named and ignored, the study's
/// keys stay — and an `rsim.toml` of 2 MiB is refused with a clear error before it is parsed.
#[test]
fn oversized_files_on_a_cloned_main_are_refused_before_they_are_read() {
    let d = tempfile::tempdir().expect("tempdir");
    let owner = Person::new(d.path(), "owner");
    let reader = Person::new(d.path(), "reader");
    let (_s, study) = owners_study(&owner);
    let work = d.path().join("crafted");
    git(
        d.path(),
        &[
            "clone",
            "-q",
            study.to_str().expect("utf8"),
            work.to_str().expect("utf8"),
        ],
    );
    let huge = format!("# {}\n", "x".repeat(2 << 20));
    let mut signers = std::fs::read_to_string(work.join("allowed_signers")).expect("signers");
    signers.push_str(&huge);
    std::fs::write(work.join("allowed_signers"), signers).expect("write");
    git(&work, &["commit", "-q", "-am", "keys"]);
    let swap = git(&work, &["rev-parse", "HEAD"]);
    let clone = d.path().join("clone");
    let out = reader
        .cmd()
        .arg("clone")
        .arg(&work)
        .arg(&clone)
        .output()
        .expect("clone");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&swap) && said.contains("more than rsim reads"),
        "{said}"
    );
    let v: Value =
        serde_json::from_str(&reader.ok(&clone, &["--json", "key", "show"])).expect("json");
    assert_eq!(
        v["keys"].as_array().map(Vec::len),
        Some(1),
        "the study's key stays: {v}"
    );

    let mut config = std::fs::read_to_string(work.join("rsim.toml")).expect("config");
    config.push_str(&huge);
    std::fs::write(work.join("rsim.toml"), config).expect("write");
    git(&work, &["commit", "-q", "-am", "config"]);
    git(&clone, &["pull", "-q", "--ff-only"]);
    let t = Instant::now();
    let out = reader.run(&clone, &["dag"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a 2 MiB rsim.toml was read");
    assert!(
        err.contains("rsim.toml on main") && err.contains("more than rsim reads there"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(20));
}

/// A shared repository whose rsim.toml names a Python environment built by a program of its
/// choosing into a folder of its choosing: in the reader's clone, `rsim env build` and `rsim env
/// run` run nothing and write nothing (`rsim env check` only reads, and says what is missing).
#[test]
fn a_clones_python_environment_is_never_built_nor_run() {
    let d = tempfile::tempdir().expect("tempdir");
    let owner = Person::new(d.path(), "owner");
    let reader = Person::new(d.path(), "reader");
    let (_s, study) = owners_study(&owner);
    let planted = d.path().join("reader-envs");
    let config = std::fs::read_to_string(study.join("rsim.toml"))
        .expect("config")
        .replace(
            "[environment]\nkind = \"host\"",
            &format!(
                "[environment]\nkind = \"python\"\nlock = \"env.lock\"\npython = \"/usr/bin/touch\"\nenvs = \"{}\"",
                planted.display()
            ),
        );
    assert!(config.contains("kind = \"python\""), "{config}");
    crate::common::commit_config(&study, &config, "a Python environment");
    let clone = d.path().join("clone");
    reader.clone_ok(&study, &clone);
    std::fs::write(
        clone.join("env.lock"),
        format!("six==1.16.0 --hash=sha256:{}\n", "a".repeat(64)),
    )
    .expect("lock");
    // Checking runs programs too (nix fetches what a flake reference names): refused as well.
    for args in [
        &["env", "build"][..],
        &["env", "run", "--", "true"],
        &["env", "check"],
    ] {
        let out = reader.run(&clone, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} ran in a clone");
        assert!(err.contains("read-only clone"), "{args:?}: {err}");
    }
    assert!(
        !planted.exists(),
        "a clone's config made {}",
        planted.display()
    );
}

/// A colleague's repository whose record carries megabytes of text in an action's summary, agent,
/// rule and reason — signed with the study's own key, so it is proven, not refused — is listed by
/// `log` and `show` with that text cut (rule and agent at 200 characters, summary at 1,000, reason
/// at 4,000, `…` marking a cut), and the reader's answer stays small.
#[test]
fn a_cloned_record_carrying_megabytes_of_text_is_listed_with_that_text_cut() {
    let d = tempfile::tempdir().expect("tempdir");
    let owner = Person::new(d.path(), "owner");
    let reader = Person::new(d.path(), "reader");
    let (_s, study) = owners_study(&owner);
    // The owner's n1 holds branch (1) and conclude (2); action 3 is crafted: a refused run_sft
    // whose text fields hold 1 MiB each (JSON the index reads, not the commit's trailers).
    let mib = "é".repeat(1 << 19);
    let record = json!({
        "seq": 3,
        "action": "run_sft",
        "node": "n1",
        "agent": format!("agent{mib}"),
        "role": "worker",
        "at": "2100-01-01T00:00:00.000Z",
        "summary": format!("summary{mib}"),
        "request": {},
        "decision": {"decision": "rejected", "rule": format!("rule{mib}"), "reason": format!("reason{mib}")},
    });
    let crafted = signed_onto(
        &study,
        d.path(),
        "rsim/n/n1",
        "rsim/n/n1",
        &[(
            "actions/0003-run_sft.json",
            serde_json::to_vec(&record).expect("json"),
        )],
        "run_sft: refused\n\nRsim-Node: n1\nRsim-Seq: 3\nRsim-Action: run_sft\nRsim-Agent: w\nRsim-Role: worker\nRsim-Decision: rejected\n",
    );
    git(&study, &["update-ref", "refs/heads/rsim/n/n1", &crafted]);

    let clone = d.path().join("clone");
    reader.clone_ok(&study, &clone);
    // The crafted action is the study's own (signed with its key): proven, not refused.
    reader.ok(&clone, &["verify"]);
    let cut = |h: &Value, field: &str, prefix: &str, chars: usize| {
        let text = h[field].as_str().unwrap_or_default();
        assert!(
            text.starts_with(prefix) && text.ends_with('…') && text.chars().count() == chars + 1,
            "{field}: {} characters",
            text.chars().count()
        );
    };
    for args in [
        &["--json", "log", "--limit", "1"][..],
        &["--json", "log", "--node", "n1"][..],
        &["--json", "show", "n1"][..],
    ] {
        let out = reader.ok(&clone, args);
        assert!(
            out.len() < 64 << 10,
            "rsim {args:?} answered {} bytes",
            out.len()
        );
        let v: Value = serde_json::from_str(&out).expect("json");
        let heads = v["actions"].as_array().expect("actions");
        let h = heads
            .iter()
            .find(|h| h["seq"] == 3 && h["node"] == "n1")
            .unwrap_or_else(|| panic!("rsim {args:?} lists the crafted action: {v}"));
        cut(h, "summary", "summary", 1000);
        cut(h, "agent", "agent", 200);
        cut(h, "rule", "rule", 200);
        cut(h, "reason", "reason", 4000);
        // What rsim wrote itself is whole.
        assert!(
            heads
                .iter()
                .all(|h| h["seq"] == 3 || !h.to_string().contains('…')),
            "{v}"
        );
    }
}
