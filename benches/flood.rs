//! `cargo bench --bench flood`: one agent stuck in a loop — RSIM_FLOOD_CALLS (3,000) identical
//! refused calls (a Worker asking for a Reviewer's `review`, with an 8,000-character summary) —
//! over MCP stdio and over HTTP, while an honest Worker keeps branching. For each transport:
//! record growth (bytes of `.git`, commits), the honest Worker's `branch` latency p50 before and
//! during the flood, and `audit`, `log` and `get_node` (each a CLI process, median of 5) before
//! and after. Targets (issue 30): growth ≤ 1 MB, the honest p50 ≤ 1.5× quiet, the views ≤ 1.5×.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

#[path = "support.rs"]
mod support;

const RSIM: &str = env!("CARGO_BIN_EXE_rsim");
/// The honest Worker's pace: one write every 100 ms (well within its write rate for the seconds
/// a flood lasts).
const PACE: std::time::Duration = std::time::Duration::from_millis(100);

fn rsim(study: &Path) -> Command {
    let mut c = Command::new(RSIM);
    c.arg("-C").arg(study).env_remove("RSIM_STUDY");
    c
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn git_bytes(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .map(|r| {
            r.flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => git_bytes(&e.path()),
                    _ => e.metadata().map_or(0, |m| m.len()),
                })
                .sum()
        })
        .unwrap_or(0)
}

fn commits(study: &Path) -> u64 {
    let out = Command::new("git")
        .arg("-C")
        .arg(study)
        .args(["rev-list", "--all", "--count"])
        .output()
        .expect("git");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// ms of each view as a CLI process, median of 5.
fn views(study: &Path) -> [f64; 3] {
    let time = |args: &[&str]| {
        median(
            (0..5)
                .map(|_| {
                    let t = Instant::now();
                    let out = rsim(study).args(args).output().expect("rsim");
                    assert!(
                        out.status.success(),
                        "{}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    t.elapsed().as_secs_f64() * 1e3
                })
                .collect(),
        )
    };
    [
        time(&["--json", "audit"]),
        time(&["--json", "log", "--node", "n0"]),
        time(&["call", "get_node", r#"{"node":"n0"}"#]),
    ]
}

/// `rsim mcp` over raw stdio lines.
struct StdioAgent {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    next: u64,
}

impl StdioAgent {
    fn start(study: &Path, agent: &str) -> StdioAgent {
        let mut child = rsim(study)
            .args(["mcp", "--agent", agent, "--role", "worker"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("rsim mcp");
        let stdin = child.stdin.take().expect("stdin");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut a = StdioAgent {
            child,
            stdin,
            out,
            next: 1,
        };
        a.request("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}));
        let _ = writeln!(
            a.stdin,
            "{}",
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
        );
        a
    }
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let _ = writeln!(
            self.stdin,
            "{}",
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
        );
        let _ = self.stdin.flush();
        loop {
            let mut l = String::new();
            if self.out.read_line(&mut l).unwrap_or(0) == 0 {
                panic!("rsim mcp exited");
            }
            let v: Value = serde_json::from_str(&l).unwrap_or(Value::Null);
            if v["id"] == id {
                return v;
            }
        }
    }
    fn tool(&mut self, name: &str, args: Value) -> Value {
        self.request("tools/call", json!({"name": name, "arguments": args}))
    }
}

impl Drop for StdioAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn flood_args() -> Value {
    json!({"node": "n0", "summary": "x".repeat(8000)})
}

struct Outcome {
    grown: u64,
    commits: u64,
    quiet_p50: f64,
    flood_p50: f64,
    honest_writes: usize,
    before: [f64; 3],
    after: [f64; 3],
    secs: f64,
}

fn report(name: &str, calls: usize, o: &Outcome) {
    println!("{name}: {calls} identical refused calls in {:.1} s", o.secs);
    println!(
        "  record growth: {:.1} KB, {} commits (target <= 1 MB)",
        o.grown as f64 / 1024.0,
        o.commits
    );
    println!(
        "  honest Worker's branch p50: quiet {:.1} ms, during the flood {:.1} ms ({:.2}x; {} writes)",
        o.quiet_p50,
        o.flood_p50,
        o.flood_p50 / o.quiet_p50,
        o.honest_writes
    );
    for (i, v) in ["audit", "log", "get_node"].iter().enumerate() {
        println!(
            "  {v}: {:.1} ms before, {:.1} ms after ({:.2}x)",
            o.before[i],
            o.after[i],
            o.after[i] / o.before[i]
        );
    }
}

fn study(base: &Path, name: &str) -> std::path::PathBuf {
    let s = base.join(name);
    let out = Command::new(RSIM)
        .arg("init")
        .arg(&s)
        .args(["--example", "tiny-arith-ngram"])
        .output()
        .expect("init");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The honest Worker branches for as long as the flood lasts: room for its nodes.
    let config = std::fs::read_to_string(s.join("rsim.toml")).expect("config");
    std::fs::write(
        s.join("rsim.toml"),
        config.replace("max_nodes = 200", "max_nodes = 100000"),
    )
    .expect("config");
    let git = Command::new("git")
        .arg("-C")
        .arg(&s)
        .args([
            "-c",
            "user.name=owner",
            "-c",
            "user.email=owner@example.invalid",
        ])
        .args(["commit", "-qam", "room for the honest Worker's nodes"])
        .status()
        .expect("git");
    assert!(git.success());
    s
}

fn over_stdio(base: &Path, calls: usize) -> Outcome {
    let s = study(base, "stdio");
    let mut honest = StdioAgent::start(&s, "honest");
    let branch = |h: &mut StdioAgent| {
        let t = Instant::now();
        let r = h.tool("branch", json!({"parents": ["n0"], "title": "honest"}));
        assert_ne!(r["result"]["isError"], true, "{r}");
        t.elapsed().as_secs_f64() * 1e3
    };
    let quiet_p50 = median(
        (0..20)
            .map(|_| {
                std::thread::sleep(PACE);
                branch(&mut honest)
            })
            .collect(),
    );
    // The views before: on the study as the flood finds it (the honest nodes included).
    let before = views(&s);
    let (bytes0, commits0) = (git_bytes(&s.join(".git")), commits(&s));
    let done = Arc::new(AtomicBool::new(false));
    let t = Instant::now();
    let flood = {
        let (s, done) = (s.clone(), done.clone());
        std::thread::spawn(move || {
            let mut lp = StdioAgent::start(&s, "looper");
            let args = flood_args();
            for _ in 0..calls {
                let r = lp.tool("review", args.clone());
                assert_eq!(r["result"]["isError"], true, "{r}");
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let mut during = Vec::new();
    while !done.load(Ordering::SeqCst) {
        std::thread::sleep(PACE);
        during.push(branch(&mut honest));
    }
    flood.join().expect("flood");
    let secs = t.elapsed().as_secs_f64();
    let honest_writes = during.len();
    let grown = git_bytes(&s.join(".git")).saturating_sub(bytes0);
    // The honest writes are not the flood's growth: count the flood's commits only.
    let commits = commits(&s) - commits0 - honest_writes as u64;
    drop(honest);
    Outcome {
        grown,
        commits,
        quiet_p50,
        flood_p50: median(during),
        honest_writes,
        before,
        after: views(&s),
        secs,
    }
}

async fn connect(url: &str, agent: &str) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    let mut h = std::collections::HashMap::new();
    h.insert(
        reqwest::header::HeaderName::from_static("x-rsim-agent"),
        reqwest::header::HeaderValue::from_str(agent).expect("agent"),
    );
    let cfg = StreamableHttpClientTransportConfig::with_uri(url.to_string()).custom_headers(h);
    ().serve(StreamableHttpClientTransport::from_config(cfg))
        .await
        .expect("connect")
}

fn over_http(base: &Path, calls: usize) -> Outcome {
    let s = study(base, "http");
    let (mut child, url) = support::serve(&s, "honest,looper");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let out = rt.block_on(async {
        let honest = connect(&url, "honest").await;
        async fn branch(h: &rmcp::service::RunningService<rmcp::RoleClient, ()>) -> f64 {
            let Value::Object(m) = json!({"parents": ["n0"], "title": "honest"}) else {
                unreachable!()
            };
            let t = Instant::now();
            let r = h
                .call_tool(CallToolRequestParams::new("branch").with_arguments(m))
                .await
                .expect("branch");
            assert_ne!(r.is_error, Some(true), "{:?}", r.content);
            t.elapsed().as_secs_f64() * 1e3
        }
        let mut quiet = Vec::new();
        for _ in 0..20 {
            tokio::time::sleep(PACE).await;
            quiet.push(branch(&honest).await);
        }
        let before = views(&s);
        let (bytes0, commits0) = (git_bytes(&s.join(".git")), commits(&s));
        let looper = Arc::new(connect(&url, "looper").await);
        let t = Instant::now();
        // Eight calls of the loop in flight at once.
        let mut tasks = Vec::new();
        for k in 0..8 {
            let lp = looper.clone();
            tasks.push(tokio::spawn(async move {
                let Value::Object(m) = flood_args() else {
                    unreachable!()
                };
                for _ in (k..calls).step_by(8) {
                    let r = lp
                        .call_tool(CallToolRequestParams::new("review").with_arguments(m.clone()))
                        .await
                        .expect("review");
                    assert_eq!(r.is_error, Some(true));
                }
            }));
        }
        let mut during = Vec::new();
        while tasks.iter().any(|t| !t.is_finished()) {
            tokio::time::sleep(PACE).await;
            during.push(branch(&honest).await);
        }
        for t in tasks {
            t.await.expect("flood");
        }
        let secs = t.elapsed().as_secs_f64();
        let grown = git_bytes(&s.join(".git")).saturating_sub(bytes0);
        let commits = commits(&s) - commits0 - during.len() as u64;
        (quiet, during, grown, commits, secs, before)
    });
    let _ = child.kill();
    let _ = child.wait();
    let (quiet, during, grown, commits, secs, before) = out;
    Outcome {
        grown,
        commits,
        quiet_p50: median(quiet),
        honest_writes: during.len(),
        flood_p50: median(during),
        before,
        after: views(&s),
        secs,
    }
}

fn main() {
    let calls: usize = std::env::var("RSIM_FLOOD_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let base = tempfile::tempdir().expect("tempdir");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("machine: {cores} cores; release build; the studies are tiny-arith-ngram");
    report("MCP stdio", calls, &over_stdio(base.path(), calls));
    report(
        "MCP HTTP (8 calls in flight)",
        calls,
        &over_http(base.path(), calls),
    );
}
