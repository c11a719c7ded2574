//! `cargo bench --bench flood`: one agent stuck in a loop — RSIM_FLOOD_CALLS (3,000) identical
//! refused calls (a Worker asking for a Reviewer's `review`, with an 8,000-character summary) —
//! over MCP stdio and over HTTP, while an honest Worker keeps branching. For each transport:
//! record growth (bytes of `.git`, commits), the honest Worker's `branch` latency p50 before and
//! during the flood, and `audit`, `log` and `get_node` (each a CLI process, median of 5) after
//! the flood against a control study that got the same honest writes and no flood (so the views'
//! ratio is the flood's cost alone). Then the compute loop: a Worker that loops run_sft +
//! cancel_job on a budget its one job claims whole, while an honest Worker submits small runs:
//! the share of them admitted, and whether the store and the job directories hold any checkpoint
//! twice. Each figure is the median of RSIM_FLOOD_RUNS (3) runs. Targets (issue 30): growth ≤
//! 1 MB, the honest p50 ≤ 1.5× quiet, the views ≤ 1.5×, ≥ 90% admitted, no checkpoint twice.

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
        StdioAgent::start_with(study, agent, &[])
    }

    fn start_with(study: &Path, agent: &str, extra: &[&str]) -> StdioAgent {
        let mut child = rsim(study)
            .args(["mcp", "--agent", agent, "--role", "worker"])
            .args(extra)
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

/// The honest Worker branches for as long as the flood lasts: room for its nodes.
fn study(base: &Path, name: &str) -> std::path::PathBuf {
    support::example_study(
        base,
        name,
        |c| c.replace("max_nodes = 200", "max_nodes = 100000"),
        "room for the honest Worker's nodes",
    )
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
        before: control(base, "stdio-control", 20 + honest_writes),
        after: views(&s),
        secs,
    }
}

/// The views on a control study: the same honest writes (`writes` branches), no flood.
fn control(base: &Path, name: &str, writes: usize) -> [f64; 3] {
    let c = study(base, name);
    let mut honest = StdioAgent::start(&c, "honest");
    for _ in 0..writes {
        let r = honest.tool("branch", json!({"parents": ["n0"], "title": "honest"}));
        assert_ne!(r["result"]["isError"], true, "{r}");
    }
    drop(honest);
    views(&c)
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
        (quiet, during, grown, commits, secs)
    });
    let _ = child.kill();
    let _ = child.wait();
    let (quiet, during, grown, commits, secs) = out;
    let before = control(base, "http-control", quiet.len() + during.len());
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

/// Field-wise median of several runs' outcomes.
fn median_outcome(runs: &[Outcome]) -> Outcome {
    let m = |f: &dyn Fn(&Outcome) -> f64| median(runs.iter().map(f).collect());
    let view =
        |k: usize, after: bool| m(&|o: &Outcome| if after { o.after[k] } else { o.before[k] });
    Outcome {
        grown: m(&|o| o.grown as f64) as u64,
        commits: m(&|o| o.commits as f64) as u64,
        quiet_p50: m(&|o| o.quiet_p50),
        flood_p50: m(&|o| o.flood_p50),
        honest_writes: m(&|o| o.honest_writes as f64) as usize,
        before: [view(0, false), view(1, false), view(2, false)],
        after: [view(0, true), view(1, true), view(2, true)],
        secs: m(&|o| o.secs),
    }
}

/// The compute loop's figures.
struct Fairness {
    tries: usize,
    admitted: usize,
    queued: usize,
    loops: usize,
    /// The honest Worker's time from submitting to its job's end, p50 (ms).
    turn_p50: f64,
    /// Bytes of job-directory files that are also in the store, and the store's bytes.
    twice: u64,
    store: u64,
}

fn answer(r: &Value) -> Value {
    let text = r["result"]["content"][0]["text"].as_str().unwrap_or("");
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn sha256_of(p: &Path) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(std::fs::read(p).unwrap_or_default()))
}

/// A Worker loops run_sft + cancel_job on a budget one of its jobs claims whole (600 s, the
/// backend's limit), while an honest Worker submits `tries` small runs one after another.
fn compute_loop(base: &Path, tries: usize) -> Fairness {
    let s = support::example_study(
        base,
        "compute",
        |c| {
            c.replace("compute_seconds = 3600", "compute_seconds = 600")
                .replace(
                    "[policy]\n",
                    "[policy]\nmax_writes_per_agent_per_minute = 0\n",
                )
        },
        "one job claims the whole budget",
    );
    let mut honest = StdioAgent::start_with(&s, "honest", &["--job-wait", "0"]);
    let r = honest.tool("branch", json!({"parents": ["n0"], "title": "sft"}));
    assert_ne!(r["result"]["isError"], true, "{r}");
    let r = honest.tool("register_dataset", json!({"node": "n1", "name": "d", "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 200, "seed": 1}}));
    assert_ne!(r["result"]["isError"], true, "{r}");
    let stop = Arc::new(AtomicBool::new(false));
    let looper = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut lp = StdioAgent::start_with(&s, "looper", &["--job-wait", "0"]);
            let mut loops = 0;
            while !stop.load(Ordering::SeqCst) {
                let r = lp.tool("run_sft", json!({"node": "n1", "base": "base", "datasets": ["d"], "learning_rate": 0.01, "steps": 5_000_000, "batch_size": 64}));
                if let Some(job) = answer(&r)["job"].as_str() {
                    lp.tool("cancel_job", json!({"job": job}));
                    loops += 1;
                }
            }
            loops
        })
    };
    std::thread::sleep(std::time::Duration::from_secs(2));
    let (mut admitted, mut queued, mut turns) = (0, 0, Vec::new());
    for _ in 0..tries {
        let t = Instant::now();
        let r = honest.tool("run_sft", json!({"node": "n1", "base": "base", "datasets": ["d"], "learning_rate": 0.01, "steps": 20, "batch_size": 8}));
        let a = answer(&r);
        queued += usize::from(a["status"] == "queued");
        let done = match a["job"].as_str() {
            Some(job) if a["status"] == "running" || a["status"] == "queued" => {
                honest.tool("wait_job", json!({"job": job, "timeout_s": 600}))
            }
            _ => r,
        };
        turns.push(t.elapsed().as_secs_f64() * 1e3);
        if done["result"]["isError"] != true {
            admitted += 1;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let loops = looper.join().expect("looper");
    let stored: std::collections::HashMap<String, u64> = files(&s.join(".rsim/objects/sha256"))
        .iter()
        .map(|p| (sha256_of(p), std::fs::metadata(p).map_or(0, |m| m.len())))
        .collect();
    let twice = files(&s.join(".rsim/jobs"))
        .iter()
        .filter(|p| std::fs::metadata(p).map_or(0, |m| m.len()) > 64)
        .filter_map(|p| stored.get(&sha256_of(p)))
        .sum();
    Fairness {
        tries,
        admitted,
        queued,
        loops,
        turn_p50: median(turns),
        twice,
        store: stored.values().sum(),
    }
}

fn main() {
    let calls: usize = std::env::var("RSIM_FLOOD_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let runs: usize = std::env::var("RSIM_FLOOD_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let base = tempfile::tempdir().expect("tempdir");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "machine: {cores} cores; release build; the studies are tiny-arith-ngram; median of {runs} run(s)"
    );
    let dir = |i: usize| {
        let d = base.path().join(format!("run{i}"));
        std::fs::create_dir_all(&d).expect("run dir");
        d
    };
    let stdio: Vec<Outcome> = (0..runs).map(|i| over_stdio(&dir(i), calls)).collect();
    report("MCP stdio", calls, &median_outcome(&stdio));
    let http: Vec<Outcome> = (0..runs).map(|i| over_http(&dir(i), calls)).collect();
    report(
        "MCP HTTP (8 calls in flight)",
        calls,
        &median_outcome(&http),
    );
    let fair: Vec<Fairness> = (0..runs).map(|i| compute_loop(&dir(i), 10)).collect();
    let share = median(
        fair.iter()
            .map(|f| f.admitted as f64 / f.tries as f64)
            .collect(),
    );
    println!("compute loop: a Worker loops run_sft + cancel_job on a budget one job claims whole");
    for f in &fair {
        println!(
            "  honest Worker: {}/{} small runs admitted ({} waited their turn in the queue), p50 {:.0} ms from submit to end; the looper looped {} times",
            f.admitted, f.tries, f.queued, f.turn_p50, f.loops
        );
        println!(
            "  store {:.1} KB; bytes in job directories also in the store: {}",
            f.store as f64 / 1024.0,
            f.twice
        );
    }
    println!("  admitted (median): {:.0}% (target >= 90%)", share * 100.0);
}
