//! `cargo bench --bench mcp`: the MCP face over loopback HTTP, driven by rmcp's own client.
//!
//! 1. query round trip (`get_node`), one client, sequential: p50 / p99 (targets ≤ 2 ms / ≤ 10 ms);
//! 2. 64 concurrent clients calling queries for a few seconds: calls/s and errors (≥ 2,000/s, 0 errors);
//! 3. 16 agents × 200 writing actions (`branch`) at once: lost and duplicated records (0 / 0),
//!    then `fsck` on the study;
//! 4. server memory per MCP session (RSS over 100 new sessions), then sessions opened until the
//!    server's limit answers 503, and whether a session opened before still answers.
//!
//! Sizes: RSIM_BENCH_CLIENTS (64), RSIM_BENCH_SECS (5), RSIM_BENCH_AGENTS (16), RSIM_BENCH_WRITES (200),
//! RSIM_BENCH_CALLS (2000). Run the release build (`cargo bench` does).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

#[path = "support.rs"]
mod support;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

type Session = rmcp::service::RunningService<rmcp::RoleClient, ()>;

/// The names the benchmark's connections claim (the owner allows them with --agents).
fn bench_agents() -> String {
    let mut names = vec!["bench-latency".to_string()];
    names.extend((0..256).map(|i| format!("bench-q{i}")));
    names.extend((0..256).map(|i| format!("bench-w{i}")));
    names.join(",")
}

async fn connect(url: &str, agent: &str) -> Session {
    let mut h = std::collections::HashMap::new();
    h.insert(
        reqwest::header::HeaderName::from_static("x-rsim-agent"),
        reqwest::header::HeaderValue::from_str(agent).expect("agent header"),
    );
    let cfg = StreamableHttpClientTransportConfig::with_uri(url.to_string()).custom_headers(h);
    ().serve(StreamableHttpClientTransport::from_config(cfg))
        .await
        .expect("connect")
}

async fn call(s: &Session, tool: &str, args: Value) -> Result<Value, String> {
    let Value::Object(m) = args else {
        return Err("arguments must be an object".into());
    };
    let r = s
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(m))
        .await
        .map_err(|e| e.to_string())?;
    if r.is_error == Some(true) {
        return Err(format!("{:?}", r.content));
    }
    r.structured_content
        .ok_or_else(|| "no structured content".into())
}

/// Resident memory of process `pid` in KB.
fn rss_kb(pid: u32) -> i64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let clients = env("RSIM_BENCH_CLIENTS", 64) as usize;
    let secs = env("RSIM_BENCH_SECS", 5);
    let agents = env("RSIM_BENCH_AGENTS", 16) as usize;
    let writes = env("RSIM_BENCH_WRITES", 200) as usize;
    let calls = env("RSIM_BENCH_CALLS", 2000) as usize;

    let base = std::env::temp_dir().join(format!("rsim-bench-mcp-{}", std::process::id()));
    let study = base.join("study");
    rsi_master::bench::bench_study(&study, agents * writes + 100).expect("bench study");
    let (mut child, url) = support::serve(&study, &bench_agents());
    let pid = child.id();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let report = rt.block_on(async {
        // 1. Round trip.
        let s = connect(&url, "bench-latency").await;
        for _ in 0..50 {
            call(&s, "get_node", json!({"node": "n0"})).await.expect("warm-up");
        }
        let mut ms = Vec::with_capacity(calls);
        for _ in 0..calls {
            let t = Instant::now();
            call(&s, "get_node", json!({"node": "n0"})).await.expect("get_node");
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        ms.sort_by(f64::total_cmp);
        let (p50, p99) = (pct(&ms, 0.50), pct(&ms, 0.99));
        println!("query round trip ({calls} sequential get_node): p50 {p50:.3} ms, p99 {p99:.3} ms");
        let _ = s.cancel().await;

        // 2. Throughput.
        let done = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let mut sessions = Vec::new();
        for i in 0..clients {
            sessions.push(connect(&url, &format!("bench-q{i}")).await);
        }
        let start = Instant::now();
        let until = start + Duration::from_secs(secs);
        let mut tasks = Vec::new();
        for (i, s) in sessions.into_iter().enumerate() {
            let (done, errors) = (done.clone(), errors.clone());
            tasks.push(tokio::spawn(async move {
                let mut k = 0u64;
                while Instant::now() < until {
                    let r = if k.is_multiple_of(2) {
                        call(&s, "get_node", json!({"node": "n0"})).await
                    } else {
                        call(&s, "list_nodes", json!({"limit": 10})).await
                    };
                    match r {
                        Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            if errors.fetch_add(1, Ordering::Relaxed) < 3 {
                                eprintln!("client {i}: {e}");
                            }
                            0
                        }
                    };
                    k += 1;
                }
                let _ = s.cancel().await;
            }));
        }
        for t in tasks {
            t.await.expect("client task");
        }
        let elapsed = start.elapsed().as_secs_f64();
        let rate = done.load(Ordering::Relaxed) as f64 / elapsed;
        let errs = errors.load(Ordering::Relaxed);
        println!("{clients} concurrent clients for {secs} s: {rate:.0} query calls/s, {errs} errors");

        // 3. Writers.
        let start = Instant::now();
        let werrs = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for a in 0..agents {
            let url = url.clone();
            let werrs = werrs.clone();
            tasks.push(tokio::spawn(async move {
                let s = connect(&url, &format!("bench-w{a}")).await;
                for k in 0..writes {
                    let r = call(&s, "branch", json!({"parents": ["n0"], "title": format!("w{a}-{k}")})).await;
                    if let Err(e) = r
                        && werrs.fetch_add(1, Ordering::Relaxed) < 3
                    {
                        eprintln!("agent {a}: {e}");
                    }
                }
                let _ = s.cancel().await;
            }));
        }
        for t in tasks {
            t.await.expect("writer task");
        }
        let wsecs = start.elapsed().as_secs_f64();

        // 4. Sessions: memory per session, and the server at its session limit.
        let keeper = connect(&url, "bench-latency").await;
        let http = reqwest::Client::new();
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}).to_string();
        let rss0 = rss_kb(pid);
        let (mut opened, mut at_100, mut refusal) = (0u64, None, String::new());
        for i in 0..512 {
            let r = http
                .post(&url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("x-rsim-agent", format!("bench-q{}", i % 256))
                .body(init.clone())
                .send()
                .await
                .expect("post");
            if r.status().is_success() {
                opened += 1;
                if opened == 100 {
                    at_100 = Some(rss_kb(pid));
                }
            } else {
                refusal = format!("{} {}", r.status(), r.text().await.unwrap_or_default());
                break;
            }
        }
        let per_session_kb = at_100.map(|r| (r - rss0) as f64 / 100.0);
        let kept = call(&keeper, "get_node", json!({"node": "n0"})).await.is_ok();
        println!(
            "sessions: {} KB of server memory per session (RSS over 100 new sessions); {opened} more opened, then: {refusal}; a session opened before the limit still answers: {kept}",
            per_session_kb.map_or("n/a".into(), |k| format!("{k:.0}"))
        );
        json!({
            "session_kb": per_session_kb, "sessions_opened_to_limit": opened, "at_limit": refusal,
            "kept_session_answers": kept,
            "p50_ms": p50, "p99_ms": p99, "clients": clients, "calls_per_s": rate, "query_errors": errs,
            "agents": agents, "writes_each": writes, "write_errors": werrs.load(Ordering::Relaxed),
            "write_s": wsecs,
        })
    });
    let _ = child.kill();
    let _ = child.wait();

    // Count every title in the record: each write exactly once.
    let st = rsi_master::Study::open(&study).expect("open study");
    let list = st
        .call(
            &rsi_master::model::Caller::owner(),
            "list_nodes",
            json!({"limit": 100000}),
        )
        .expect("list_nodes");
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for n in list["nodes"].as_array().expect("nodes") {
        *seen
            .entry(n["title"].as_str().unwrap_or_default().to_string())
            .or_default() += 1;
    }
    let (mut lost, mut dup) = (0, 0);
    for a in 0..agents {
        for k in 0..writes {
            match seen.get(&format!("w{a}-{k}")).copied().unwrap_or(0) {
                0 => lost += 1,
                1 => {}
                n => dup += n - 1,
            }
        }
    }
    let fsck = rsi_master::os::fsck::fsck(&st).expect("fsck");
    let total = (agents * writes) as f64;
    println!(
        "{agents} agents x {writes} writing actions in {:.1} s ({:.0} actions/s): {lost} lost, {dup} duplicated, {} write errors; fsck: {} problems",
        report["write_s"].as_f64().unwrap_or(0.0),
        total / report["write_s"].as_f64().unwrap_or(1.0),
        report["write_errors"],
        fsck.problems.len()
    );
    let mut out = report;
    out["lost"] = json!(lost);
    out["duplicated"] = json!(dup);
    out["fsck_problems"] = json!(fsck.problems.len());
    println!("{}", serde_json::to_string(&out).unwrap_or_default());
    let _ = std::fs::remove_dir_all(&base);
}
