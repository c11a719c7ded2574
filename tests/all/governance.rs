//! An agent that loops or floods, through the public interfaces: identical refusals are coalesced
//! (the record grows by a logarithmic number of small commits, and the audit still counts every
//! attempt), a flood of distinct calls is throttled per agent (recorded once a minute), what a
//! refusal records is bounded, and the small faults on the way — undecodable lines over MCP
//! stdio, non-UTF-8 input to the CLI, agent names git cannot hold — get clear answers. Over
//! `rsim serve --http`, an agent token holding slow requests and event streams, a crowd of
//! agents, and slow-header sockets from one remote address leave another agent and the study
//! owner's page served.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{commit_config, example_study, ok_json, rsim, run};

/// `rsim mcp` over raw stdio lines.
struct Stdio_ {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    next: u64,
}

impl Drop for Stdio_ {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Stdio_ {
    fn start(study: &Path, agent: &str, role: &str) -> Stdio_ {
        Stdio_::start_with(study, agent, role, &[])
    }

    fn start_with(study: &Path, agent: &str, role: &str, extra: &[&str]) -> Stdio_ {
        let mut child = rsim()
            .arg("-C")
            .arg(study)
            .args(["mcp", "--agent", agent, "--role", role])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("rsim mcp");
        let stdin = child.stdin.take().expect("stdin");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut s = Stdio_ {
            child,
            stdin,
            out,
            next: 1,
        };
        s.request("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}));
        s.raw(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
                .to_string()
                .as_bytes(),
        );
        s
    }

    fn raw(&mut self, line: &[u8]) {
        self.stdin.write_all(line).expect("write");
        self.stdin.write_all(b"\n").expect("write");
        self.stdin.flush().expect("flush");
    }

    /// The next line the server writes, within `limit`.
    fn line(&mut self) -> Value {
        let mut l = String::new();
        self.out.read_line(&mut l).expect("read");
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"))
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.raw(
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
                .to_string()
                .as_bytes(),
        );
        loop {
            let v = self.line();
            if v["id"] == id {
                return v;
            }
        }
    }

    fn tool(&mut self, name: &str, args: Value) -> Value {
        self.request("tools/call", json!({"name": name, "arguments": args}))
    }
}

fn git_bytes(study: &Path) -> u64 {
    fn walk(p: &Path) -> u64 {
        std::fs::read_dir(p)
            .map(|r| {
                r.flatten()
                    .map(|e| match e.file_type() {
                        Ok(t) if t.is_dir() => walk(&e.path()),
                        _ => e.metadata().map_or(0, |m| m.len()),
                    })
                    .sum()
            })
            .unwrap_or(0)
    }
    walk(&study.join(".git"))
}

fn commits(study: &Path) -> usize {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(study)
        .args(["rev-list", "--all", "--count"])
        .output()
        .expect("git");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("count")
}

#[test]
fn a_loop_of_identical_refusals_is_coalesced_and_still_counted() {
    let (_d, study) = example_study();
    // No rate limit here: coalescing alone bounds the record.
    let config = std::fs::read_to_string(study.join("rsim.toml")).expect("config");
    let config = config.replace(
        "[policy]\n",
        "[policy]\nmax_writes_per_agent_per_minute = 0\n",
    );
    commit_config(&study, &config, "no write rate");
    let (bytes0, commits0) = (git_bytes(&study), commits(&study));
    let mut lp = Stdio_::start(&study, "looper", "observer");
    // An observer may not review: each call is refused by rule role, with a maximum-size summary.
    let big = json!({"node": "n0", "summary": "x".repeat(8000)});
    let calls = 600;
    for _ in 0..calls {
        let r = lp.tool("review", big.clone());
        assert_eq!(r["result"]["isError"], true, "{r}");
        let text = r["result"]["content"][0]["text"].as_str().unwrap_or("");
        assert!(text.contains("rule role"), "{text}");
    }
    drop(lp);
    // 600 identical refusals: recorded the 1st, 2nd, 4th … 512th time (10 commits), each small.
    let added = commits(&study) - commits0;
    assert!(
        added <= 11,
        "{added} commits for {calls} identical refusals"
    );
    let grown = git_bytes(&study).saturating_sub(bytes0);
    assert!(grown < 200_000, "the record grew {grown} bytes");
    let log = ok_json(&study, &["log", "--node", "n0", "--limit", "100"]);
    let recorded = log["actions"].as_array().expect("actions").len();
    assert!(recorded <= 12, "{log}");
    // Nothing of the summary's 8,000 characters beyond a bounded cut is in the record.
    let node = ok_json(&study, &["call", "get_node", r#"{"node":"n0"}"#]);
    assert!(node.to_string().len() < 20_000, "get_node grew");
    // The audit counts every attempt: the records' repeats plus those not recorded yet.
    let audit = ok_json(&study, &["audit"]);
    assert_eq!(audit["rejected"], calls, "{audit}");
    assert_eq!(audit["attempts"], calls, "{audit}");
    // By rule, the recorded ones (the 512 the records stand for; the last 88 are counted in the
    // index until the next record of the same refusal).
    let role = audit["rejections_by_rule"]["role"].as_u64().unwrap_or(0);
    assert_eq!(role, 512, "{audit}");
}

#[test]
fn a_flood_of_distinct_calls_is_throttled_per_agent_and_recorded_once_a_minute() {
    let (_d, study) = example_study();
    let config = std::fs::read_to_string(study.join("rsim.toml")).expect("config");
    let config = config.replace(
        "[policy]\n",
        "[policy]\nmax_writes_per_agent_per_minute = 20\n",
    );
    commit_config(&study, &config, "a tight write rate");
    let commits0 = commits(&study);
    let mut fl = Stdio_::start(&study, "flooder", "observer");
    let mut throttled = 0;
    for i in 0..100 {
        let r = fl.tool(
            "review",
            json!({"node": "n0", "summary": format!("attempt {i}")}),
        );
        let text = r["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if text.contains("rule throttled") {
            throttled += 1;
        } else {
            assert!(text.contains("rule role"), "{text}");
        }
    }
    assert_eq!(throttled, 80, "20 calls a minute, then throttled");
    // 20 distinct refusals and one throttled decision are recorded; the other 79 only refused.
    assert_eq!(commits(&study) - commits0, 21);
    let log = ok_json(&study, &["log", "--node", "n0", "--limit", "100"]);
    let rules: Vec<&str> = log["actions"]
        .as_array()
        .expect("actions")
        .iter()
        .filter_map(|a| a["rule"].as_str())
        .collect();
    assert_eq!(
        rules.iter().filter(|r| **r == "throttled").count(),
        1,
        "{log}"
    );
    // Another agent is not throttled by the flooder's rate, and the owner never is.
    let mut other = Stdio_::start(&study, "honest", "worker");
    let r = other.tool("branch", json!({"parents": ["n0"], "title": "t"}));
    assert_ne!(r["result"]["isError"], true, "{r}");
    for _ in 0..30 {
        let out = run(
            &study,
            &["call", "review", r#"{"node":"n0","summary":"s"}"#],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The text of a tool call's answer (its structured result or its error).
fn answer(r: &Value) -> Value {
    let text = r["result"]["content"][0]["text"].as_str().unwrap_or("");
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

#[test]
fn a_cancel_and_resubmit_loop_cannot_keep_another_workers_small_job_out() {
    let (_d, study) = example_study();
    // The looper's job (cut to the backend's 600 s) claims the study's whole compute budget.
    let config = std::fs::read_to_string(study.join("rsim.toml")).expect("config");
    let config = config
        .replace("compute_seconds = 3600", "compute_seconds = 600")
        .replace(
            "[policy]\n",
            "[policy]\nmax_writes_per_agent_per_minute = 0\n",
        );
    commit_config(&study, &config, "600 s of compute");
    let mut honest = Stdio_::start_with(&study, "honest", "worker", &["--job-wait", "0"]);
    let r = honest.tool("branch", json!({"parents": ["n0"], "title": "sft"}));
    assert_ne!(r["result"]["isError"], true, "{r}");
    let r = honest.tool("register_dataset", json!({"node": "n1", "name": "d", "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 200, "seed": 1}}));
    assert_ne!(r["result"]["isError"], true, "{r}");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let looper = {
        let (study, stop) = (study.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut lp = Stdio_::start_with(&study, "looper", "worker", &["--job-wait", "0"]);
            let mut loops = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let r = lp.tool("run_sft", json!({"node": "n1", "base": "base", "datasets": ["d"], "learning_rate": 0.01, "steps": 5_000_000, "batch_size": 64}));
                let a = answer(&r);
                if let Some(job) = a["job"].as_str() {
                    let c = lp.tool("cancel_job", json!({"job": job}));
                    assert_ne!(c["result"]["isError"], true, "{c}");
                    loops += 1;
                }
            }
            loops
        })
    };
    // The looper holds the budget before each try of the honest Worker.
    std::thread::sleep(Duration::from_secs(2));
    let tries = 4;
    let (mut admitted, mut queued) = (0, 0);
    for _ in 0..tries {
        let r = honest.tool("run_sft", json!({"node": "n1", "base": "base", "datasets": ["d"], "learning_rate": 0.01, "steps": 20, "batch_size": 8}));
        let a = answer(&r);
        queued += usize::from(a["status"] == "queued");
        let done = match a["job"].as_str() {
            Some(job) if a["status"] == "running" || a["status"] == "queued" => {
                honest.tool("wait_job", json!({"job": job, "timeout_s": 120}))
            }
            _ => r,
        };
        let text = done["result"]["content"][0]["text"].as_str().unwrap_or("");
        if done["result"]["isError"] != true {
            admitted += 1;
        } else {
            assert!(text.contains("budget-compute"), "{text}");
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let loops = looper.join().expect("looper");
    assert!(loops >= 2, "the looper looped ({loops} times)");
    assert_eq!(admitted, tries, "every small job was admitted, in its turn");
    // It had to wait for its turn: the looper held the budget when it asked.
    assert!(
        queued >= 1,
        "no try of the honest Worker found the budget claimed"
    );
}

#[test]
fn undecodable_lines_over_stdio_get_a_parse_error_and_the_server_keeps_serving() {
    let (_d, study) = example_study();
    let mut s = Stdio_::start(&study, "w", "worker");
    for bad in [
        &b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/list\xff\"}"[..],
        br#"{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"x":"\ud800"}}"#,
        br#"{"jsonrpc":"2.0","id":1e400,"method":"tools/list"}"#,
        br#"{"jsonrpc":"2.0","id":7,"method":"tools/list","method":"ping"}"#,
    ] {
        let t = Instant::now();
        s.raw(bad);
        let v = s.line();
        assert_eq!(v["error"]["code"], -32700, "{v}");
        assert!(v["id"].is_null(), "{v}");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the reply took {:?}",
            t.elapsed()
        );
    }
    let r = s.request("tools/list", json!({}));
    assert!(
        r["result"]["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "{r}"
    );
}

#[test]
fn non_utf8_input_and_names_git_cannot_hold_are_clear_errors() {
    let (_d, study) = example_study();
    let mut child = rsim()
        .arg("-C")
        .arg(&study)
        .args(["call", "branch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("rsim call");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"{\"parents\":[\"n0\"],\"title\":\"\xff\"}")
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("not UTF-8"));
    for name in ["a<b", "a>b", "<x@y>"] {
        let out = run(
            &study,
            &["--agent", name, "branch", "--from", "n0", "--title", "t"],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains("not a valid agent name"), "{name}: {err}");
    }
}

/// Every file under `dir` (recursively).
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn sha256_of(p: &Path) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(std::fs::read(p).expect("read")))
}

#[test]
fn storage_is_counted_checkpoints_are_held_once_and_gc_removes_only_what_nothing_references() {
    let (_d, study) = example_study();
    let w = |args: &[&str]| {
        let mut full = vec!["--agent", "w", "--role", "worker"];
        full.extend_from_slice(args);
        ok_json(&study, &full)
    };
    w(&["call", "branch", r#"{"parents":["n0"],"title":"sft"}"#]);
    w(&[
        "call",
        "register_dataset",
        r#"{"node":"n1","name":"d","source":{"kind":"arith","op":"add","digits":2,"format":"plain","n":200,"seed":1}}"#,
    ]);
    let sft = w(&[
        "call",
        "run_sft",
        r#"{"node":"n1","base":"base","datasets":["d"],"learning_rate":0.01,"steps":40,"batch_size":8,"eval_every":20,"eval_task":"add2"}"#,
    ]);
    let job = sft["job"]["id"].as_str().expect("job id").to_string();
    assert_eq!(
        sft["intermediate"].as_array().map(Vec::len),
        Some(1),
        "{sft}"
    );
    // The store and the job directories hold each checkpoint (and log) once.
    let objects = study.join(".rsim/objects/sha256");
    let stored: std::collections::HashSet<String> =
        files_under(&objects).iter().map(|p| sha256_of(p)).collect();
    for f in files_under(&study.join(".rsim/jobs")) {
        if std::fs::metadata(&f).map_or(0, |m| m.len()) > 64 {
            assert!(
                !stored.contains(&sha256_of(&f)),
                "{} is also in the store",
                f.display()
            );
        }
    }
    // One count per study and per agent.
    let u = ok_json(&study, &["storage"]);
    let total = |v: &Value| v["total"].as_u64().expect("total");
    assert!(total(&u["study"]) > 0, "{u}");
    let wb = &u["agents"]["w"];
    assert!(
        wb["objects"].as_u64() > Some(0)
            && wb["jobs"].as_u64() > Some(0)
            && wb["record"].as_u64() > Some(0),
        "{u}"
    );
    assert!(total(wb) < total(&u["study"]), "{u}");
    assert_eq!(u["unreferenced_objects"], 0, "{u}");
    // Garbage: an object nothing references (stored a day ago), and outputs an older rsim left
    // in a recorded job's directory.
    let junk = b"left by a job that failed after storing";
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(junk))
    };
    let junk_path = objects.join(&sha[..2]).join(&sha[2..]);
    std::fs::create_dir_all(junk_path.parent().expect("dir")).expect("dir");
    std::fs::write(&junk_path, junk).expect("junk");
    let day_ago = std::time::SystemTime::now() - Duration::from_secs(86_400);
    std::fs::File::options()
        .write(true)
        .open(&junk_path)
        .and_then(|f| f.set_modified(day_ago))
        .expect("age");
    let leftover = study.join(".rsim/jobs").join(&job).join("out/checkpoint");
    std::fs::create_dir_all(&leftover).expect("leftover");
    std::fs::write(leftover.join("model.bin"), vec![7u8; 4096]).expect("leftover");
    let u = ok_json(&study, &["storage"]);
    assert_eq!(u["unreferenced_objects"], 1, "{u}");
    let dry = ok_json(&study, &["gc", "--dry-run"]);
    assert_eq!(dry["objects"], 1, "{dry}");
    assert!(dry["job_bytes"].as_u64() >= Some(4096), "{dry}");
    assert!(
        junk_path.exists() && leftover.exists(),
        "a dry run removes nothing"
    );
    let done = ok_json(&study, &["gc"]);
    assert_eq!(done["objects"], 1, "{done}");
    assert!(done["job_bytes"].as_u64() >= Some(4096), "{done}");
    assert!(!junk_path.exists() && !leftover.exists());
    // Everything the record references is still there.
    crate::common::fsck_clean(&study);
    // Past the agent's storage budget, a job is refused, saying which budget.
    let config = std::fs::read_to_string(study.join("rsim.toml")).expect("config");
    commit_config(
        &study,
        &config.replace("[budgets]\n", "[budgets]\nagent_storage_bytes = 1000\n"),
        "a tiny storage budget per agent",
    );
    let out = run(
        &study,
        &[
            "--agent",
            "w",
            "--role",
            "worker",
            "call",
            "run_sft",
            r#"{"node":"n1","base":"base","datasets":["d"],"learning_rate":0.01,"steps":5,"batch_size":8}"#,
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("budget-storage")
            && err.contains("agent_storage_bytes"),
        "{err}"
    );
    // Another agent still has room.
    let ok = ok_json(
        &study,
        &[
            "--agent",
            "v",
            "--role",
            "worker",
            "call",
            "run_sft",
            r#"{"node":"n1","base":"base","datasets":["d"],"learning_rate":0.01,"steps":5,"batch_size":8}"#,
        ],
    );
    assert_eq!(ok["job"]["state"], "succeeded", "{ok}");
}

/// The token the tests' tokens file gives `name` (the owner's for `owner`).
fn token(name: &str) -> String {
    format!("token-of-{name}-0123456789")
}

/// A tokens file with a worker per name and the `[owner]` token.
fn tokens_file(dir: &Path, agents: &[&str]) -> std::path::PathBuf {
    let mut text = String::new();
    for a in agents {
        text.push_str(&format!(
            "[[agent]]\nname = \"{a}\"\nrole = \"worker\"\ntoken = \"{}\"\n\n",
            token(a)
        ));
    }
    text.push_str(&format!("[owner]\ntoken = \"{}\"\n", token("owner")));
    let p = dir.join("tokens.toml");
    std::fs::write(&p, text).expect("tokens file");
    p
}

/// `rsim serve --http LISTEN --tokens FILE`, killed when dropped.
struct Http {
    child: Child,
    port: u16,
}

impl Drop for Http {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_http(study: &Path, listen: &str, tokens: &Path) -> Http {
    let mut child = rsim()
        .arg("-C")
        .arg(study)
        .args(["serve", "--http", listen, "--tokens"])
        .arg(tokens)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("rsim serve");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let port = loop {
        let line = lines.next().expect("serve exited").expect("stderr");
        if let Some(u) = line.strip_prefix("rsim: the web page is at http://") {
            let port = u.trim().trim_end_matches('/').rsplit(':').next();
            break port.and_then(|p| p.parse().ok()).expect("port");
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Http { child, port }
}

/// What a new connection sending `req` got: the answer's status and text, or `None` when the
/// server holds it unanswered for 400 ms. The connection is returned to keep it open.
fn attempt(addr: &str, req: &str) -> (std::net::TcpStream, Option<(u16, String)>) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_millis(400)))
        .expect("timeout");
    s.write_all(req.as_bytes()).expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got);
                // A live stream's head and first event, or a whole answer, is enough.
                if text.contains("event: change") {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    if got.is_empty() {
        return (s, None);
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (s, Some((status, text)))
}

/// A request of `who` (a bearer token) the server holds: the headers of a POST to /mcp whose
/// body never comes.
fn slow_post(addr: &str, who: &str) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{{",
        token(who)
    )
}

fn get(addr: &str, path: &str, who: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\r\n",
        token(who)
    )
}

/// One GET of `who` on a connection of its own, closed after the answer.
fn once(addr: &str, path: &str, who: &str) -> (u16, String) {
    let req = get(addr, path, who).replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n");
    let got = attempt(addr, &req).1.expect("answered");
    // The server closes it: let it count the place free before the next step.
    std::thread::sleep(Duration::from_millis(100));
    got
}

/// An agent token that opens more than its share — slow requests it never finishes and live
/// event streams — is refused past `max_connections_per_agent` and `max_streams_per_agent`,
/// and another agent and the owner's page are still served; a crowd of agents filling every
/// other place still leaves the owner's reserve to the owner.
#[test]
fn a_flooding_agent_token_leaves_room_for_another_agent_and_the_owner() {
    let (d, study) = example_study();
    let text = std::fs::read_to_string(study.join("rsim.toml")).expect("config");
    commit_config(
        &study,
        &format!(
            "{text}\n[server]\nmax_connections = 24\nmax_connections_per_agent = 4\nmax_streams_per_agent = 2\nowner_reserve = 4\nheader_timeout_s = 60\n"
        ),
        "server limits",
    );
    let flooders = ["flood", "f1", "f2", "f3", "f4"];
    let mut names = flooders.to_vec();
    names.push("honest");
    let tokens = tokens_file(d.path(), &names);
    let server = serve_http(&study, "127.0.0.1:0", &tokens);
    let addr = format!("127.0.0.1:{}", server.port);
    let mut held = Vec::new();

    // Two live streams, then the third is refused naming the key.
    for _ in 0..2 {
        let (s, got) = attempt(&addr, &get(&addr, "/api/events", "flood"));
        let (status, text) = got.expect("a stream answers");
        assert_eq!(status, 200, "{text}");
        held.push(s);
    }
    let (status, text) = once(&addr, "/api/events", "flood");
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("server.max_streams_per_agent"), "{text}");

    // Slow requests: two more connections are held (four with the streams), the rest refused.
    let (mut kept, mut refused) = (0, 0);
    for _ in 0..10 {
        let (s, got) = attempt(&addr, &slow_post(&addr, "flood"));
        match got {
            None => {
                kept += 1;
                held.push(s);
            }
            Some((status, text)) => {
                assert_eq!(status, 503, "{text}");
                assert!(text.contains("server.max_connections_per_agent"), "{text}");
                assert!(text.contains("agent \\\"flood\\\""), "{text}");
                refused += 1;
            }
        }
    }
    assert_eq!((kept, refused), (2, 8));

    // Another agent and the owner are served.
    let (status, text) = once(&addr, "/api/me", "honest");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"honest\""), "{text}");
    let (s, got) = attempt(&addr, &get(&addr, "/api/events", "honest"));
    assert_eq!(got.expect("a stream").0, 200);
    held.push(s);
    let (status, text) = once(&addr, "/api/me", "owner");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"role\":\"owner\""), "{text}");
    let (s, got) = attempt(&addr, &get(&addr, "/api/events", "owner"));
    assert_eq!(got.expect("a stream").0, 200);
    held.push(s);
    // The owner token is the web page's, never an agent's at /mcp.
    let (s, got) = attempt(&addr, &slow_post(&addr, "owner"));
    let (status, text) = got.expect("answered");
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("web page"), "{text}");
    drop(s);
    std::thread::sleep(Duration::from_millis(200));

    // A crowd of agents holds every place but the owner's reserve (20 of 24; 6 held above).
    let mut reserve_refusals = 0;
    for f in &flooders[1..] {
        for _ in 0..4 {
            let (s, got) = attempt(&addr, &slow_post(&addr, f));
            match got {
                None => held.push(s),
                Some((status, text)) => {
                    assert_eq!(status, 503, "{text}");
                    assert!(text.contains("server.owner_reserve"), "{text}");
                    reserve_refusals += 1;
                }
            }
        }
    }
    assert_eq!(
        reserve_refusals, 2,
        "14 of the crowd's 16 fill the agents' places"
    );
    // Every agent is now refused, naming the reserve; the owner's page is served, stream
    // included.
    let (status, text) = once(&addr, "/api/me", "honest");
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("server.owner_reserve"), "{text}");
    let page = format!(
        "GET / HTTP/1.1\r\nHost: {addr}\r\nCookie: rsim_token={}\r\nConnection: close\r\n\r\n",
        hex::encode(token("owner"))
    );
    let (status, text) = attempt(&addr, &page).1.expect("answered");
    assert_eq!(status, 200, "{text}");
    assert!(
        !text.contains("name=\"token\""),
        "the page, not the sign-in form"
    );
    std::thread::sleep(Duration::from_millis(200));
    let (_s2, got) = attempt(&addr, &get(&addr, "/api/events", "owner"));
    assert_eq!(got.expect("a stream").0, 200);
    drop(held);
}

/// A non-loopback address of this machine (the one its default route leaves from), if any.
fn non_loopback_address() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    // No packet is sent: connecting a UDP socket only picks the route.
    s.connect("192.0.2.1:9")
        .or_else(|_| s.connect("8.8.8.8:53"))
        .ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// Slow-header sockets from one remote address are refused at accept past
/// `max_connections_per_address`, before any byte is read; loopback peers are exempt.
#[test]
fn slow_header_sockets_from_one_remote_address_are_capped_and_loopback_is_not() {
    let Some(remote) = non_loopback_address() else {
        eprintln!(
            "skipped: this machine has no non-loopback address (the unit test faces::mcp::limits::tests::a_remote_address_is_capped_at_accept_and_loopback_is_not covers the count)"
        );
        return;
    };
    let (d, study) = example_study();
    let text = std::fs::read_to_string(study.join("rsim.toml")).expect("config");
    commit_config(
        &study,
        &format!(
            "{text}\n[server]\nmax_connections = 64\nmax_connections_per_address = 3\nheader_timeout_s = 60\n"
        ),
        "server limits",
    );
    let tokens = tokens_file(d.path(), &["honest"]);
    let server = serve_http(&study, "0.0.0.0:0", &tokens);
    let far = std::net::SocketAddr::new(remote, server.port).to_string();
    let near = format!("127.0.0.1:{}", server.port);
    let partial = |addr: &str| format!("GET /api/me HTTP/1.1\r\nHost: {addr}\r\n");
    let mut held = Vec::new();
    for _ in 0..3 {
        let (s, got) = attempt(&far, &partial(&far));
        assert!(got.is_none(), "held until its headers end: {got:?}");
        held.push(s);
    }
    let (_s, got) = attempt(&far, &partial(&far));
    let (status, text) = got.expect("refused at once");
    assert_eq!(status, 503, "{text}");
    assert!(
        text.contains("server.max_connections_per_address"),
        "{text}"
    );
    assert!(text.contains(&remote.to_string()), "{text}");
    // Loopback peers are not counted per address: more than three of them are held.
    for _ in 0..5 {
        let (s, got) = attempt(&near, &partial(&near));
        assert!(got.is_none(), "loopback is exempt: {got:?}");
        held.push(s);
    }
    assert_eq!(once(&near, "/api/me", "honest").0, 200);
    // A remote socket that closes frees its place.
    held.remove(0);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(once(&far, "/api/me", "honest").0, 200);
}

/// One worker cannot close a rival's direction (and lock the rival out of its own node): a
/// worker concludes only the nodes it opened or that a reviewer or the owner opened; the refusal
/// is recorded and counted under `node-owner`, and the rival, a reviewer and the owner still can.
#[test]
fn a_worker_cannot_conclude_a_node_another_worker_opened() {
    let (_d, study) = example_study();
    let as_ = |agent: &str, role: &str, args: &[&str]| {
        let mut full = vec!["--agent", agent, "--role", role];
        full.extend_from_slice(args);
        run(&study, &full)
    };
    let conclude =
        |node: &str| format!(r#"{{"node":"{node}","findings":"closed","outcome":"negative"}}"#);
    for (who, role) in [
        ("alice", "worker"),
        ("alice", "worker"),
        ("rita", "reviewer"),
    ] {
        let out = as_(
            who,
            role,
            &["call", "branch", r#"{"parents":["n0"],"title":"t"}"#],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // n1, n2: alice's; n3: the reviewer's.
    let out = as_("mallory", "worker", &["call", "conclude", &conclude("n1")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a rival's node was concluded");
    assert!(
        err.contains("node-owner") && err.contains("opened by worker alice"),
        "{err}"
    );
    assert!(
        err.contains("recorded as commit"),
        "the refusal is recorded: {err}"
    );
    // Still open: its opener concludes it; a reviewer and the owner may conclude any node; a
    // worker may conclude a node a reviewer opened for workers.
    for (who, role, node) in [
        ("alice", "worker", "n1"),
        ("rita", "reviewer", "n2"),
        ("mallory", "worker", "n3"),
    ] {
        let out = as_(who, role, &["call", "conclude", &conclude(node)]);
        assert!(
            out.status.success(),
            "{who} on {node}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let audit = ok_json(&study, &["audit"]);
    assert_eq!(audit["rejections_by_rule"]["node-owner"], 1, "{audit}");
}

/// The next attack on `node-owner`: a rival that is refused does not stop, it loops the same
/// conclude on the victim's node over MCP, to bury the node's record or wear it shut. Identical
/// refusals are coalesced (recorded the 1st, 2nd, 4th … time, every attempt counted), so the
/// victim's node grows by a handful of commits, and the victim still concludes its own node.
#[test]
fn a_rival_looping_on_a_node_it_may_not_close_grows_it_by_a_few_commits_and_never_closes_it() {
    let (_d, study) = example_study();
    let config = std::fs::read_to_string(study.join("rsim.toml")).expect("config");
    let config = config.replace(
        "[policy]\n",
        "[policy]\nmax_writes_per_agent_per_minute = 0\n",
    );
    commit_config(&study, &config, "no write rate");
    let out = run(
        &study,
        &[
            "--agent",
            "alice",
            "--role",
            "worker",
            "call",
            "branch",
            r#"{"parents":["n0"],"title":"alice's direction"}"#,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let commits0 = commits(&study);
    let mut rival = Stdio_::start(&study, "mallory", "worker");
    let calls = 200;
    let close = json!({"node": "n1", "findings": "closed under you", "outcome": "negative"});
    for _ in 0..calls {
        let r = rival.tool("conclude", close.clone());
        assert_eq!(r["result"]["isError"], true, "{r}");
        let text = r["result"]["content"][0]["text"].as_str().unwrap_or("");
        assert!(text.contains("node-owner"), "{text}");
    }
    drop(rival);
    let added = commits(&study) - commits0;
    assert!(added <= 9, "{added} commits for {calls} identical refusals");
    let audit = ok_json(&study, &["audit"]);
    assert_eq!(
        audit["rejected"], calls,
        "every attempt is counted: {audit}"
    );
    let out = run(
        &study,
        &[
            "--agent",
            "alice",
            "--role",
            "worker",
            "call",
            "conclude",
            r#"{"node":"n1","findings":"mine","outcome":"inconclusive"}"#,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Bytes of the regular files under `dir`.
fn bytes_under(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("dir")
        .flatten()
        .map(|e| {
            let t = e.file_type().expect("type");
            if t.is_dir() {
                bytes_under(&e.path())
            } else if t.is_file() {
                e.metadata().expect("meta").len()
            } else {
                0
            }
        })
        .sum()
}

#[test]
fn a_rival_flooding_a_node_with_distinct_refusals_grows_its_record_linearly() {
    // Distinct refusals are not coalesced: each is a commit that adds a file to the node's flat
    // `actions/` tree, whose copies once grew the record with the square of the flood.
    let (_d, study) = example_study();
    let config = std::fs::read_to_string(study.join("rsim.toml")).expect("config");
    let config = config.replace(
        "[policy]\n",
        "[policy]\nmax_writes_per_agent_per_minute = 0\n",
    );
    commit_config(&study, &config, "no write rate");
    let out = run(
        &study,
        &[
            "--agent",
            "alice",
            "--role",
            "worker",
            "call",
            "branch",
            r#"{"parents":["n0"],"title":"alice's direction"}"#,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let git = study.join(".git");
    let (bytes0, commits0) = (bytes_under(&git), commits(&study));
    let mut rival = Stdio_::start(&study, "mallory", "worker");
    let calls = 500;
    for i in 0..calls {
        let close = json!({"node": "n1", "findings": format!("closed under you, take {i}"), "outcome": "negative"});
        let r = rival.tool("conclude", close);
        assert_eq!(r["result"]["isError"], true, "{r}");
    }
    drop(rival);
    assert_eq!(
        commits(&study) - commits0,
        calls,
        "one commit per distinct refusal"
    );
    let per_refusal = (bytes_under(&git) - bytes0) / calls as u64;
    // Whole copies of `actions/` came to about 8 KiB a refusal at this count, and grow with it.
    assert!(
        per_refusal < 3000,
        "{per_refusal} bytes of .git per refusal"
    );
    // git and rsim read all of it back: every object, every signature.
    let fsck = std::process::Command::new("git")
        .arg("-C")
        .arg(&study)
        .args(["fsck", "--full", "--strict", "--no-dangling"])
        .output()
        .expect("git");
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stderr)
    );
    ok_json(&study, &["verify"]);
    let audit = ok_json(&study, &["audit"]);
    assert_eq!(audit["rejected"], calls, "{audit}");
}
