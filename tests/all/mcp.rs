//! The MCP face with rmcp's own client: many agents writing at once over streamable HTTP and over
//! separate stdio processes (nothing lost, nothing duplicated, `rsim fsck` clean), long jobs with
//! progress and wait_job, roles, resources, prompts, and bad input (each a clear error; the server
//! keeps serving).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rmcp::model::*;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::common::{example_study, fsck_clean, rsim};

/// A running `rsim serve`, killed on drop.
struct ServerProc {
    child: Child,
    url: String,
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent names the tests' loopback connections claim (the owner allows them with --agents).
fn allowed_agents() -> String {
    let mut names: Vec<String> = (0..16).map(|i| format!("agent-{i}")).collect();
    names.extend(["checker", "w1", "obs", "survivor"].map(String::from));
    names.join(",")
}

fn serve(study: &Path, extra: &[&str]) -> ServerProc {
    let mut child = rsim()
        .arg("-C")
        .arg(study)
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--agents",
            &allowed_agents(),
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rsim serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("rsim serve exited before listening")
            .expect("read stderr");
        if let Some(u) = line.strip_prefix("rsim: listening on ") {
            break u.trim().to_string();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    ServerProc { child, url }
}

/// Counts progress notifications.
#[derive(Clone, Default)]
struct Client {
    progress: Arc<AtomicUsize>,
}

impl ClientHandler for Client {
    async fn on_progress(
        &self,
        _params: ProgressNotificationParam,
        _ctx: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.progress.fetch_add(1, Ordering::SeqCst);
    }
}

type Session = RunningService<RoleClient, Client>;

async fn connect(url: &str, headers: &[(&'static str, String)], auth: Option<&str>) -> Session {
    let mut h = HashMap::new();
    for (k, v) in headers {
        h.insert(
            reqwest::header::HeaderName::from_static(k),
            reqwest::header::HeaderValue::from_str(v).expect("header"),
        );
    }
    let mut cfg = StreamableHttpClientTransportConfig::with_uri(url.to_string()).custom_headers(h);
    if let Some(t) = auth {
        cfg = cfg.auth_header(t.to_string());
    }
    let transport = StreamableHttpClientTransport::from_config(cfg);
    Client::default().serve(transport).await.expect("connect")
}

async fn agent(url: &str, name: &str) -> Session {
    connect(url, &[("x-rsim-agent", name.to_string())], None).await
}

async fn call(s: &Session, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(m) = args else {
        panic!("arguments must be an object")
    };
    s.call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(m))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

fn ok(r: &CallToolResult) -> &Value {
    assert_ne!(r.is_error, Some(true), "tool error: {:?}", r.content);
    r.structured_content.as_ref().expect("structured content")
}

fn err_text(r: &CallToolResult) -> String {
    assert_eq!(r.is_error, Some(true), "expected an error, got {r:?}");
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn many_agents_write_at_once_over_http_and_stdio_without_losing_or_duplicating_a_record() {
    const AGENTS: usize = 16;
    const EACH: usize = 4;
    const STDIO: usize = 2;
    let (_d, study) = example_study();
    let server = serve(&study, &[]);
    rt().block_on(async {
        let mut tasks = Vec::new();
        for i in 0..AGENTS {
            let url = server.url.clone();
            tasks.push(tokio::spawn(async move {
                let s = agent(&url, &format!("agent-{i}")).await;
                for k in 0..EACH {
                    let r = call(
                        &s,
                        "branch",
                        json!({"parents": ["n0"], "title": format!("a{i}-{k}")}),
                    )
                    .await;
                    ok(&r);
                }
                s.cancel().await.expect("close");
            }));
        }
        // Separate stdio processes write to the same study at the same time.
        for p in 0..STDIO {
            let study = study.clone();
            tasks.push(tokio::spawn(async move {
                let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_rsim"));
                cmd.arg("-C")
                    .arg(&study)
                    .args(["mcp", "--agent", &format!("stdio-{p}")]);
                let transport = TokioChildProcess::new(cmd).expect("spawn rsim mcp");
                let s = Client::default()
                    .serve(transport)
                    .await
                    .expect("stdio connect");
                for k in 0..EACH {
                    let r = call(
                        &s,
                        "branch",
                        json!({"parents": ["n0"], "title": format!("s{p}-{k}")}),
                    )
                    .await;
                    ok(&r);
                }
                s.cancel().await.expect("close");
            }));
        }
        for t in tasks {
            t.await.expect("agent task");
        }
        let s = agent(&server.url, "checker").await;
        let list = call(&s, "list_nodes", json!({"limit": 1000})).await;
        let list = ok(&list);
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for n in list["nodes"].as_array().expect("nodes") {
            *seen
                .entry(n["title"].as_str().expect("title").to_string())
                .or_default() += 1;
        }
        for i in 0..AGENTS {
            for k in 0..EACH {
                assert_eq!(seen.get(&format!("a{i}-{k}")), Some(&1), "a{i}-{k}");
            }
        }
        for p in 0..STDIO {
            for k in 0..EACH {
                assert_eq!(seen.get(&format!("s{p}-{k}")), Some(&1), "s{p}-{k}");
            }
        }
        assert_eq!(
            list["total"].as_u64(),
            Some((1 + (AGENTS + STDIO) * EACH) as u64),
            "every action exactly once"
        );
        // Identity and role reach the record.
        let n1 = call(&s, "log", json!({"limit": 200})).await;
        let agents: Vec<String> = ok(&n1)["actions"]
            .as_array()
            .expect("actions")
            .iter()
            .filter_map(|a| a["agent"].as_str().map(str::to_string))
            .collect();
        assert!(agents.iter().any(|a| a == "agent-7"), "{agents:?}");
        assert!(agents.iter().any(|a| a == "stdio-1"), "{agents:?}");
        s.cancel().await.expect("close");
    });
    drop(server);
    fsck_clean(&study);
}

#[test]
fn tools_resources_prompts_roles_and_long_jobs() {
    let (_d, study) = example_study();
    let server = serve(&study, &["--job-wait", "0"]);
    rt().block_on(async {
        let w = agent(&server.url, "w1").await;
        let tools = w.list_all_tools().await.expect("tools");
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        for n in ["branch", "register_dataset", "run_sft", "evaluate", "compare", "conclude", "get_node", "list_nodes", "dag", "log", "get_job", "wait_job", "cancel_job"] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
        assert!(!names.contains(&"review"), "a worker is not offered review");
        // The conformance suite's fixtures are the `rsim-conformance` test binary's alone.
        assert!(
            !names.iter().any(|n| n.starts_with("test_") || *n == "json_schema_2020_12_tool" || *n == "greet"),
            "rsim serves none of the conformance fixtures: {names:?}"
        );
        let fixture = w
            .call_tool(CallToolRequestParams::new("test_simple_text".to_string()))
            .await;
        assert!(
            fixture.as_ref().is_err_and(|e| e.to_string().contains("unknown tool")),
            "a fixture tool is unknown to rsim: {fixture:?}"
        );
        let dag = tools.iter().find(|t| t.name == "dag").expect("dag");
        let ann = dag.annotations.as_ref().expect("annotations");
        assert_eq!(ann.read_only_hint, Some(true));
        let conclude = tools.iter().find(|t| t.name == "conclude").expect("conclude");
        assert_eq!(conclude.annotations.as_ref().and_then(|a| a.destructive_hint), Some(true));
        assert!(conclude.output_schema.is_some());

        // A long job: run_sft answers "running" at once (job wait 0), progress while wait_job follows it.
        ok(&call(&w, "branch", json!({"parents": ["n0"], "title": "sft"})).await);
        ok(&call(&w, "register_dataset", json!({"node": "n1", "name": "d", "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 300, "seed": 1}})).await);
        let r = call(&w, "run_sft", json!({"node": "n1", "base": "base", "datasets": ["d"], "learning_rate": 0.01, "steps": 200, "batch_size": 8})).await;
        let v = ok(&r).clone();
        assert_eq!(v["status"], "running", "--job-wait 0 answers at once: {v}");
        let job = v["job"]
            .as_str()
            .map(str::to_string)
            .or_else(|| v["job"]["id"].as_str().map(str::to_string))
            .expect("job id");
        let mut result = v.clone();
        for _ in 0..60 {
            if result["status"] != "running" {
                break;
            }
            let mut req = CallToolRequestParams::new("wait_job");
            req = req.with_arguments(json!({"job": job, "timeout_s": 10}).as_object().cloned().expect("obj"));
            let h = w
                .send_cancellable_request(
                    ClientRequest::CallToolRequest(Request::new(req)),
                    rmcp::service::PeerRequestOptions::no_options(),
                )
                .await
                .expect("send");
            let resp = h.await_response().await.expect("wait_job");
            let ServerResult::CallToolResult(r) = resp else {
                panic!("unexpected {resp:?}")
            };
            result = ok(&r).clone();
        }
        assert_eq!(result["job"]["state"], "succeeded", "{result}");
        assert!(result["checkpoint"].is_string(), "{result}");
        assert!(result["commit"].is_string(), "{result}");
        let info = ok(&call(&w, "get_job", json!({"job": job})).await).clone();
        assert_eq!(info["node"], "n1");

        // Resources.
        let res = w.list_resources(None).await.expect("resources");
        assert!(res.resources.iter().any(|r| r.uri == "rsim://dag"));
        let tpl = w.list_resource_templates(None).await.expect("templates");
        assert_eq!(tpl.resource_templates.len(), 3);
        for uri in ["rsim://dag", "rsim://node/n1", "rsim://node/n1/actions/1", &format!("rsim://job/{job}/log")] {
            let r = w
                .read_resource(ReadResourceRequestParams::new(uri.to_string()))
                .await
                .unwrap_or_else(|e| panic!("{uri}: {e}"));
            assert!(!r.contents.is_empty(), "{uri}");
        }
        assert!(
            w.read_resource(ReadResourceRequestParams::new("rsim://node/n99".to_string()))
                .await
                .is_err()
        );
        // Prompts.
        let p = w.list_prompts(None).await.expect("prompts");
        let pn: Vec<&str> = p.prompts.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(pn, ["worker", "reviewer"]);
        let g = w
            .get_prompt(GetPromptRequestParams::new("reviewer"))
            .await
            .expect("prompt");
        assert!(!g.messages.is_empty());

        // A policy rejection of a long tool names the rule (no job ever starts).
        let e = err_text(&call(&w, "evaluate", json!({"node": "n1", "checkpoint": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "task": "add2", "split": "dev"})).await);
        assert!(e.contains("checkpoint-provenance"), "{e}");
        // Roles: a worker calling review is refused by the rule `role` (and the attempt recorded).
        let e = err_text(&call(&w, "review", json!({"node": "n1", "summary": "x"})).await);
        assert!(e.contains("role"), "{e}");
        w.cancel().await.expect("close");
    });
    drop(server);

    // An observer server: only read-only tools; writers refused.
    let server = serve(&study, &["--role", "observer"]);
    rt().block_on(async {
        let o = agent(&server.url, "obs").await;
        let tools = o.list_all_tools().await.expect("tools");
        for t in &tools {
            assert_eq!(
                t.annotations.as_ref().and_then(|a| a.read_only_hint),
                Some(true),
                "observer offered {}",
                t.name
            );
        }
        let e = err_text(&call(&o, "branch", json!({"parents": ["n0"], "title": "x"})).await);
        assert!(e.contains("role"), "{e}");
        ok(&call(&o, "dag", json!({"view": "frontier"})).await);
        o.cancel().await.expect("close");
    });
    drop(server);
    fsck_clean(&study);
}

#[test]
fn bad_input_gets_a_clear_error_and_the_server_keeps_serving() {
    let (d, study) = example_study();
    let tokens = d.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[agent]]\nname = \"alice\"\nrole = \"worker\"\ntoken = \"alice-secret-token-0001\"\n\n[[agent]]\nname = \"rita\"\nrole = \"reviewer\"\ntoken = \"rita-secret-token-00002\"\n",
    )
    .expect("tokens");
    let server = serve(&study, &["--tokens", tokens.to_str().expect("utf8")]);
    rt().block_on(async {
        let http = reqwest::Client::new();
        let post = |body: Vec<u8>, token: Option<&str>| {
            let mut r = http
                .post(&server.url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(body);
            if let Some(t) = token {
                r = r.header("authorization", format!("Bearer {t}"));
            }
            r.send()
        };
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}).to_string();
        // No token, bad token: 401 with a message.
        let r = post(init.clone().into_bytes(), None).await.expect("post");
        assert_eq!(r.status(), 401);
        assert!(r.text().await.expect("body").contains("bearer token"));
        let r = post(init.clone().into_bytes(), Some("wrong-token-wrong-token")).await.expect("post");
        assert_eq!(r.status(), 401);
        assert!(r.text().await.expect("body").contains("invalid bearer token"));
        // OAuth discovery is a plain 404 that says to use a bearer token (hosts probe it after
        // a 401 and would report a JSON-RPC 401 body as broken OAuth metadata).
        let base = server.url.trim_end_matches("/mcp");
        for path in ["/.well-known/oauth-protected-resource", "/.well-known/oauth-authorization-server", "/register"] {
            let r = http.get(format!("{base}{path}")).send().await.expect("get");
            assert_eq!(r.status(), 404, "{path}");
            assert!(r.text().await.expect("body").contains("bearer token"), "{path}");
        }
        // Malformed JSON-RPC.
        let r = post(b"{this is not json".to_vec(), Some("alice-secret-token-0001")).await.expect("post");
        let status = r.status();
        let body = r.text().await.expect("body");
        assert!(status.is_client_error() || body.contains("-32700"), "{status} {body}");
        // Oversized body: 413.
        let big = vec![b' '; 17 << 20];
        let r = post(big, Some("alice-secret-token-0001")).await.expect("post");
        assert_eq!(r.status(), 413);

        // Tool-level errors through a real client.
        let alice = connect(&server.url, &[], Some("alice-secret-token-0001")).await;
        let e = alice
            .call_tool(CallToolRequestParams::new("nope"))
            .await
            .expect_err("unknown tool is a protocol error");
        assert!(e.to_string().contains("unknown tool"), "{e}");
        let e = err_text(&call(&alice, "branch", json!({"parents": "n0", "title": 5})).await);
        assert!(e.contains("parents") && e.contains("title"), "{e}");
        let e = err_text(&call(&alice, "branch", json!({"parents": ["n0"], "title": "t", "sneaky": 1})).await);
        assert!(e.contains("sneaky"), "{e}");
        let e = err_text(&call(&alice, "get_node", json!({"node": "n42"})).await);
        assert!(e.contains("n42"), "{e}");
        let e = err_text(&call(&alice, "review", json!({"node": "n0", "summary": "mine"})).await);
        assert!(e.contains("role"), "{e}");
        let e = err_text(&call(&alice, "wait_job", json!({"job": "j-0000000000000000", "timeout_s": 1})).await);
        assert!(e.contains("no job"), "{e}");
        // Identity comes from the token.
        let b = ok(&call(&alice, "branch", json!({"parents": ["n0"], "title": "by alice"})).await).clone();
        let node = b["node"].as_str().expect("node").to_string();
        let n = ok(&call(&alice, "get_node", json!({"node": node})).await).clone();
        assert_eq!(n["created_by"], "alice", "{n}");
        // A reviewer may review.
        let rita = connect(&server.url, &[], Some("rita-secret-token-00002")).await;
        ok(&call(&rita, "review", json!({"node": "n0", "summary": "fine"})).await);
        rita.cancel().await.expect("close");
        // Still serving.
        ok(&call(&alice, "list_nodes", json!({})).await);
        alice.cancel().await.expect("close");
    });
    drop(server);
    fsck_clean(&study);
    // A non-loopback address refuses to start without tokens.
    let out = rsim()
        .arg("-C")
        .arg(&study)
        .args(["serve", "--http", "0.0.0.0:0"])
        .output()
        .expect("serve");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tokens"));
}

#[test]
fn mcp_config_prints_working_client_configs() {
    let (_d, study) = example_study();
    let out = rsim()
        .arg("-C")
        .arg(&study)
        .args(["mcp-config", "--client", "claude"])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let args = v["mcpServers"]["rsim"]["args"].as_array().expect("args");
    assert_eq!(args[0], "mcp");
    let out = rsim()
        .arg("-C")
        .arg(&study)
        .args(["mcp-config", "--client", "codex"])
        .output()
        .expect("run");
    assert!(out.status.success());
    let t: toml::Value = toml::from_str(&String::from_utf8_lossy(&out.stdout)).expect("toml");
    assert!(t["mcp_servers"]["rsim"]["command"].is_str());
    // A worker and a reviewer side by side in one Codex config: two names, each its identity.
    let reviewer = rsim()
        .arg("-C")
        .arg(&study)
        .args([
            "--agent",
            "rita",
            "--role",
            "reviewer",
            "mcp-config",
            "--client",
            "codex",
            "--name",
            "rsim-reviewer",
        ])
        .output()
        .expect("run");
    assert!(
        reviewer.status.success(),
        "{}",
        String::from_utf8_lossy(&reviewer.stderr)
    );
    let both = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&reviewer.stdout)
    );
    let t: toml::Value = toml::from_str(&both).expect("two servers in one config");
    let args: Vec<&str> = t["mcp_servers"]["rsim-reviewer"]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(
        args.windows(2).any(|w| w == ["--role", "reviewer"]),
        "{args:?}"
    );
    assert!(
        args.windows(2).any(|w| w == ["--agent", "rita"]),
        "{args:?}"
    );
    // Gemini CLI's settings, and the refusals.
    let out = rsim()
        .arg("-C")
        .arg(&study)
        .args(["mcp-config", "--client", "gemini", "--name", "lab"])
        .output()
        .expect("run");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["mcpServers"]["lab"]["args"][0], "mcp");
    for bad in [
        &["--json", "mcp-config", "--client", "codex"][..],
        &["mcp-config", "--client", "claude", "--name", "a b"][..],
    ] {
        let out = rsim()
            .arg("-C")
            .arg(&study)
            .args(bad)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(!String::from_utf8_lossy(&out.stderr).is_empty());
    }
}

/// Gemini CLI's `wait_for_previous` (a boolean it adds to every call) is dropped before
/// validation; any other unknown field, or that name with another type, is still refused.
#[test]
fn a_hosts_scheduling_argument_is_dropped_and_other_unknown_fields_refused() {
    let (_d, study) = example_study();
    let server = serve(&study, &[]);
    rt().block_on(async {
        let s = connect(&server.url, &[], None).await;
        let r = call(
            &s,
            "branch",
            json!({"parents": ["n0"], "title": "from gemini", "wait_for_previous": true}),
        )
        .await;
        assert_eq!(ok(&r)["node"], "n1");
        for extra in [json!({"wait_for_previous": "yes"}), json!({"bogus": true})] {
            let mut args = json!({"parents": ["n0"], "title": "typo"});
            for (k, v) in extra.as_object().expect("obj") {
                args[k] = v.clone();
            }
            let e = err_text(&call(&s, "branch", args).await);
            assert!(
                e.contains("wait_for_previous") || e.contains("bogus"),
                "{e}"
            );
        }
    });
}

#[test]
fn a_cancelled_request_stops_its_job_and_the_job_is_recorded_cancelled() {
    let (_d, study) = example_study();
    let server = serve(&study, &["--job-wait", "600"]);
    rt().block_on(async {
        let progress = Arc::new(AtomicUsize::new(0));
        let client = Client {
            progress: progress.clone(),
        };
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(server.url.clone()),
        );
        let w = client.serve(transport).await.expect("connect");
        ok(&call(&w, "branch", json!({"parents": ["n0"], "title": "long"})).await);
        ok(&call(&w, "register_dataset", json!({"node": "n1", "name": "d", "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 300, "seed": 1}})).await);
        let req = CallToolRequestParams::new("run_sft").with_arguments(
            json!({"node": "n1", "base": "base", "datasets": ["d"], "learning_rate": 0.01, "steps": 5_000_000, "batch_size": 64})
                .as_object()
                .cloned()
                .expect("obj"),
        );
        let h = w
            .send_cancellable_request(
                ClientRequest::CallToolRequest(Request::new(req)),
                rmcp::service::PeerRequestOptions::no_options(),
            )
            .await
            .expect("send");
        // Progress arrives while the job runs (at least the elapsed-seconds heartbeat).
        let t0 = std::time::Instant::now();
        while progress.load(Ordering::SeqCst) == 0 && t0.elapsed().as_secs() < 120 {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        assert!(progress.load(Ordering::SeqCst) > 0, "no progress notification");
        let cancel: CancelledNotificationParam =
            serde_json::from_value(json!({"requestId": h.id, "reason": "changed my mind"}))
                .expect("cancel params");
        w.notify_cancelled(cancel).await.expect("cancel");
        // The job stops and its action is recorded with the job cancelled.
        let mut job = None;
        for _ in 0..600 {
            let log = ok(&call(&w, "log", json!({"node": "n1"})).await).clone();
            job = log["actions"]
                .as_array()
                .and_then(|a| a.iter().find(|a| a["action"] == "run_sft"))
                .and_then(|a| a["job"].as_str().map(str::to_string));
            if job.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        let job = job.expect("run_sft recorded after the cancel");
        let info = ok(&call(&w, "get_job", json!({"job": job})).await).clone();
        assert_eq!(info["job"]["state"], "cancelled", "{info}");
        w.cancel().await.expect("close");
    });
    drop(server);
    fsck_clean(&study);
}

#[test]
fn wait_job_on_a_job_lost_with_its_stdio_server_names_the_state() {
    let (_d, study) = example_study();
    rt().block_on(async {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_rsim"));
        cmd.arg("-C")
            .arg(&study)
            .args(["mcp", "--agent", "doomed", "--job-wait", "0"]);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("spawn rsim mcp");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let s = Client::default()
            .serve((stdout, stdin))
            .await
            .expect("stdio connect");
        ok(&call(&s, "branch", json!({"parents": ["n0"], "title": "lost"})).await);
        ok(&call(&s, "register_dataset", json!({"node": "n1", "name": "d", "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 300, "seed": 1}})).await);
        let r = ok(&call(&s, "run_sft", json!({"node": "n1", "base": "base", "datasets": ["d"], "learning_rate": 0.01, "steps": 5_000_000, "batch_size": 64})).await).clone();
        let job = r["job"].as_str().expect("running job id").to_string();
        // The server dies (as clients kill theirs); the job is stopped and recorded lost by the next opener.
        child.kill().await.expect("kill rsim mcp");
        drop(s);
        let server = serve(&study, &[]);
        let w = agent(&server.url, "survivor").await;
        let e = err_text(&call(&w, "wait_job", json!({"job": job, "timeout_s": 60})).await);
        assert!(e.contains("lost"), "{e}");
        let info = ok(&call(&w, "get_job", json!({"job": job})).await).clone();
        assert_eq!(info["job"]["state"], "lost", "{info}");
        w.cancel().await.expect("close");
        drop(server);
    });
    fsck_clean(&study);
}

/// On loopback without tokens, a connection is the server's one identity, or a name the owner
/// listed with --agents: it cannot rename itself to start its per-agent allowances again.
#[test]
fn a_loopback_connection_cannot_name_itself_beyond_what_the_owner_allowed() {
    let (_d, study) = example_study();
    let server = serve(&study, &[]);
    rt().block_on(async {
        let client = reqwest::Client::new();
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}).to_string();
        let post = |agent: Option<&str>| {
            let mut r = client
                .post(&server.url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(init.clone());
            if let Some(a) = agent {
                r = r.header("x-rsim-agent", a);
            }
            r.send()
        };
        let r = post(Some("mallory-2")).await.expect("post");
        assert_eq!(r.status(), 401);
        let body = r.text().await.expect("body");
        assert!(body.contains("--agents"), "{body}");
        let r = post(Some("agent-3")).await.expect("post");
        assert!(r.status().is_success(), "{}", r.status());
        let r = post(None).await.expect("post");
        assert!(r.status().is_success(), "{}", r.status());
    });
    // Without the header, the connection is the server's own identity in the record.
    rt().block_on(async {
        let s = connect(&server.url, &[], None).await;
        let r = call(&s, "branch", json!({"parents": ["n0"], "title": "anon"})).await;
        let node = ok(&r)["node"].as_str().expect("node").to_string();
        let r = call(&s, "get_node", json!({"node": node})).await;
        assert_eq!(ok(&r)["created_by"], "http");
    });
}

/// The server's limits hold against a crowd: one agent's concurrent `initialize`s cannot pass
/// its session limit together, the server's session limit holds across agents and frees up when
/// a session is deleted, clients that open sockets and send nothing are answered 503 past the
/// connection limit and cut off at the header timeout, after which real clients get in again.
#[test]
fn the_server_holds_its_limits_against_crowds_and_slow_clients() {
    use std::io::{Read, Write};
    let (_d, study) = example_study();
    let text = std::fs::read_to_string(study.join("rsim.toml")).expect("config");
    crate::common::commit_config(
        &study,
        &format!(
            "{text}\n[server]\nmax_connections = 12\nmax_sessions = 3\nmax_sessions_per_agent = 2\nheader_timeout_s = 1\nowner_reserve = 2\n"
        ),
        "server limits",
    );
    let server = serve(&study, &[]);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}).to_string();
    rt().block_on(async {
        let client = reqwest::Client::new();
        let post = |agent: &str| {
            client
                .post(&server.url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("x-rsim-agent", agent)
                .body(init.clone())
                .send()
        };
        // Eight at once from one agent: exactly its two sessions.
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let (client, url, init) = (client.clone(), server.url.clone(), init.clone());
            tasks.spawn(async move {
                client
                    .post(&url)
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .header("x-rsim-agent", "agent-1")
                    .body(init)
                    .send()
                    .await
            });
        }
        let mut sessions = Vec::new();
        let mut refused = 0;
        while let Some(r) = tasks.join_next().await {
            let r = r.expect("task").expect("post");
            if r.status().is_success() {
                sessions.push(
                    r.headers()["mcp-session-id"]
                        .to_str()
                        .expect("id")
                        .to_string(),
                );
            } else {
                assert_eq!(r.status(), 503);
                let body = r.text().await.expect("body");
                assert!(body.contains("server.max_sessions_per_agent"), "{body}");
                refused += 1;
            }
        }
        assert_eq!((sessions.len(), refused), (2, 6));
        // The server's limit (3) across agents.
        assert!(post("agent-2").await.expect("post").status().is_success());
        let r = post("agent-3").await.expect("post");
        assert_eq!(r.status(), 503);
        assert!(
            r.text()
                .await
                .expect("body")
                .contains("server.max_sessions")
        );
        // Deleting a session frees its place.
        let del = client
            .delete(&server.url)
            .header("x-rsim-agent", "agent-1")
            .header("mcp-session-id", &sessions[0])
            .send()
            .await
            .expect("delete");
        assert!(del.status().is_success(), "{}", del.status());
        let mut ok = false;
        for _ in 0..50 {
            if post("agent-3").await.expect("post").status().is_success() {
                ok = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(ok, "a deleted session's place was not freed");
    });

    // Slow clients: sockets that never send a request.
    let addr = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_string();
    // Thirteen silent sockets against a limit of 12 (the clients above may still hold a few
    // places while the server notices they closed): past the limit a connection is answered 503
    // at once, or a silent one gives its place to it (closed unanswered), so never more than 12
    // are held.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut silent: Vec<std::net::TcpStream> = (0..13)
        .map(|_| std::net::TcpStream::connect(&addr).expect("connect"))
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut gone = 0;
    for s in &mut silent {
        s.set_read_timeout(Some(std::time::Duration::from_millis(300)))
            .expect("timeout");
        let mut buf = [0u8; 512];
        match s.read(&mut buf) {
            Ok(0) => gone += 1,
            Ok(n) => {
                let text = String::from_utf8_lossy(&buf[..n]);
                assert!(
                    text.starts_with("HTTP/1.1 503") && text.contains("server.max_connections"),
                    "{text:?}"
                );
                gone += 1;
            }
            Err(_) => {}
        }
    }
    assert!(gone >= 1, "13 connections were held with a limit of 12");
    // The header timeout (1 s) closes the silent ones.
    for s in &mut silent {
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .expect("timeout");
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        assert!(
            buf.is_empty() || String::from_utf8_lossy(&buf).contains("408"),
            "{:?}",
            String::from_utf8_lossy(&buf)
        );
    }
    // A real client gets in again.
    let mut s = std::net::TcpStream::connect(&addr).expect("connect");
    s.write_all(b"GET /nothing HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .expect("write");
    let mut got = String::new();
    s.read_to_string(&mut got).expect("read");
    assert!(got.starts_with("HTTP/1.1 404"), "{got}");
}

/// SSE priming events (empty data, SEP-1699) reach only clients of protocol 2025-11-25 or later,
/// which resume from them; an earlier client (Gemini CLI's bundled SDK parses every event's data
/// as JSON) gets its streams without them, from `initialize` on.
#[test]
fn priming_events_only_reach_clients_that_expect_them() {
    let (_d, study) = example_study();
    let server = serve(&study, &[]);
    rt().block_on(async {
        let http = reqwest::Client::new();
        for (version, wants) in [("2025-03-26", false), ("2025-06-18", false), ("2025-11-25", true)] {
            let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}).to_string();
            let r = http
                .post(&server.url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(init)
                .send()
                .await
                .expect("post");
            assert!(r.status().is_success(), "{version}: {}", r.status());
            let session = r.headers()["mcp-session-id"].to_str().expect("id").to_string();
            let body = r.text().await.expect("body");
            let events: Vec<&str> = body.split("\n\n").filter(|e| !e.trim().is_empty()).collect();
            let empty = events
                .iter()
                .filter(|e| e.lines().any(|l| l.trim_end() == "data:"))
                .count();
            assert!(body.contains("\"protocolVersion\""), "{version}: {body}");
            assert_eq!(empty > 0, wants, "{version}: {body:?}");
            // A later request of the same session (with the version header) as well.
            let r = http
                .post(&server.url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-session-id", &session)
                .header("mcp-protocol-version", version)
                .body(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string())
                .send()
                .await
                .expect("post");
            let body = r.text().await.expect("body");
            assert!(body.contains("branch"), "{version}: {body}");
            assert_eq!(
                body.lines().any(|l| l.trim_end() == "data:"),
                wants,
                "{version}: {body:?}"
            );
        }
    });
}

/// `diff` and `reproduce` over MCP, as a reviewer connection: the same actions as the CLI's, the
/// structured answers the schemas promise, a worker refused `reproduce` by its role.
#[test]
fn diff_and_reproduce_over_mcp() {
    let (_d, study) = example_study();
    let cli = |args: &[&str]| crate::common::ok_json(&study, args);
    cli(&["branch", "--from", "n0", "--title", "A"]);
    cli(&["branch", "--from", "n0", "--title", "B"]);
    cli(&[
        "call",
        "register_dataset",
        r#"{"node":"n1","name":"plain","source":{"kind":"arith","op":"add","digits":2,"format":"plain","n":300,"seed":1}}"#,
    ]);
    for (node, lr) in [("n1", "0.001"), ("n2", "0.002")] {
        cli(&[
            "run-sft",
            "--node",
            node,
            "--base",
            "base",
            "--dataset",
            "plain",
            "--lr",
            lr,
            "--steps",
            "10",
            "--batch-size",
            "8",
            "--seed",
            "1",
        ]);
    }
    let reviewer = serve(&study, &["--role", "reviewer"]);
    let worker = serve(&study, &[]);
    rt().block_on(async {
        let r = connect(&reviewer.url, &[], None).await;
        let d = call(&r, "diff", json!({"a": "n1", "b": "n2"})).await;
        let d = ok(&d);
        assert!(
            d["params"]
                .as_array()
                .expect("params")
                .iter()
                .any(|p| p["key"] == "learning_rate"),
            "{d}"
        );
        let e = err_text(&call(&r, "diff", json!({"a": "n1", "b": "n1"})).await);
        assert!(e.contains("n1"), "{e}");
        let rep = call(&r, "reproduce", json!({"node": "n1", "seq": 3})).await;
        let rep = ok(&rep);
        assert_eq!(rep["identical"], true, "{rep}");
        let w = connect(&worker.url, &[], None).await;
        let e = err_text(&call(&w, "reproduce", json!({"node": "n1", "seq": 3})).await);
        assert!(e.contains("role"), "{e}");
    });
    fsck_clean(&study);
}

/// The conformance suite's fixtures live in the library (switched on only by the
/// `rsim-conformance` test binary). An agent paid to find a way in asks the real server for every
/// surface they add — prompts, resources and templates, completion, logging levels, the fixture
/// tools that make the server ask the client to sample or elicit — and gets none of them.
#[test]
#[allow(deprecated)]
fn the_real_server_offers_no_conformance_fixture_by_any_route() {
    let (_d, study) = example_study();
    let server = serve(&study, &[]);
    rt().block_on(async {
        let w = agent(&server.url, "w1").await;
        let caps = &w.peer_info().expect("server info").capabilities;
        assert!(
            caps.completions.is_none() && caps.logging.is_none(),
            "{caps:?}"
        );
        let prompts: Vec<String> = w
            .list_all_prompts()
            .await
            .expect("prompts")
            .into_iter()
            .map(|p| p.name.to_string())
            .collect();
        assert_eq!(prompts, ["worker", "reviewer"]);
        let e = w
            .get_prompt(GetPromptRequestParams::new("test_simple_prompt"))
            .await;
        assert!(e.is_err(), "a fixture prompt: {e:?}");
        let uris: Vec<String> = w
            .list_all_resources()
            .await
            .expect("resources")
            .into_iter()
            .map(|r| r.uri.to_string())
            .collect();
        assert!(uris.iter().all(|u| u.starts_with("rsim://")), "{uris:?}");
        for uri in [
            "test://static-text",
            "test://template/1/data",
            "test://watched-resource",
        ] {
            let r = w.read_resource(ReadResourceRequestParams::new(uri)).await;
            assert!(r.is_err(), "{uri}: {r:?}");
        }
        let c = w
            .complete_prompt_simple("test_prompt_with_arguments", "arg1", "a")
            .await;
        assert!(c.is_err(), "completion: {c:?}");
        let l = w
            .set_level(SetLevelRequestParams::new(LoggingLevel::Debug))
            .await;
        assert!(l.is_err(), "logging level: {l:?}");
        for tool in ["test_sampling", "test_elicitation", "greet", "slow_compute"] {
            let r = w
                .call_tool(CallToolRequestParams::new(tool.to_string()))
                .await;
            assert!(
                r.as_ref()
                    .is_err_and(|e| e.to_string().contains("unknown tool")),
                "{tool}: {r:?}"
            );
        }
        // The server still serves its own after all that.
        ok(&call(&w, "dag", json!({})).await);
    });
}

/// An MCP session is its opener's: another identity's request naming it (a DELETE to close it,
/// a call, a cancel of its requests) is answered as if it did not exist, and the opener's
/// session goes on serving.
#[test]
fn a_session_is_its_openers_and_no_other_identity_can_close_or_use_it() {
    let (_d, study) = example_study();
    let server = serve(&study, &[]);
    rt().block_on(async {
        let client = reqwest::Client::new();
        let post = |agent: &str, session: Option<&str>, body: String| {
            let mut r = client
                .post(&server.url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("x-rsim-agent", agent)
                .header("mcp-protocol-version", "2025-06-18")
                .body(body);
            if let Some(s) = session {
                r = r.header("mcp-session-id", s);
            }
            r.send()
        };
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}).to_string();
        let r = post("agent-1", None, init).await.expect("initialize");
        assert!(r.status().is_success(), "{}", r.status());
        let session = r
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .expect("a session id")
            .to_string();
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
        let r = post("agent-1", Some(&session), initialized).await.expect("initialized");
        assert!(r.status().is_success(), "{}", r.status());
        // Another identity: a DELETE, a call and a cancel naming the session are all refused.
        let r = client
            .delete(&server.url)
            .header("x-rsim-agent", "agent-2")
            .header("mcp-session-id", &session)
            .send()
            .await
            .expect("delete");
        assert_eq!(r.status(), 404);
        let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string();
        let r = post("agent-2", Some(&session), list.clone()).await.expect("list");
        assert_eq!(r.status(), 404);
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}).to_string();
        let r = post("agent-2", Some(&session), cancel).await.expect("cancel");
        assert_eq!(r.status(), 404);
        // The opener's session still serves.
        let r = post("agent-1", Some(&session), list).await.expect("list");
        assert!(r.status().is_success(), "{}", r.status());
        let body = r.text().await.expect("body");
        assert!(body.contains("get_node"), "{body}");
    });
}

/// A body of many tiny values (a request's arguments padded with a million zeros, each some
/// hundred bytes once decoded) is refused before it is decoded, with a parse error naming why;
/// the server serves on.
#[test]
fn a_request_of_too_many_values_is_refused_before_it_is_decoded() {
    let (_d, study) = example_study();
    let server = serve(&study, &[]);
    rt().block_on(async {
        let client = reqwest::Client::new();
        let zeros = vec!["0"; 1 << 20].join(",");
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"raw","version":"0"}},"x":[{zeros}]}}}}"#
        );
        let r = client
            .post(&server.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("x-rsim-agent", "agent-1")
            .body(body)
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), 400);
        let said = r.text().await.expect("body");
        assert!(said.contains("JSON values") && said.contains("-32700"), "{said}");
        let s = agent(&server.url, "agent-2").await;
        let r = call(&s, "get_node", json!({"node": "n0"})).await;
        assert_eq!(ok(&r)["id"], "n0");
    });
}

/// A local process with no token opens sockets that never send a request, more than the
/// server's connections (loopback is exempt from the per-address limit): the owner's page and an
/// agent still get in — a full server gives a new connection the place of the oldest that has
/// said nothing. And one that claims to be the owner (on loopback without tokens anyone local
/// is) on every connection holds at most the owner's share: an agent still gets in.
#[test]
fn sockets_that_say_nothing_cannot_lock_the_owner_and_agents_out() {
    use std::io::{Read, Write};
    let (_d, study) = example_study();
    let text = std::fs::read_to_string(study.join("rsim.toml")).expect("config");
    crate::common::commit_config(
        &study,
        &format!(
            "{text}\n[server]\nmax_connections = 16\nheader_timeout_s = 30\nowner_reserve = 2\n"
        ),
        "server limits",
    );
    let server = serve(&study, &[]);
    let addr = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_string();
    let silent: Vec<std::net::TcpStream> = (0..40)
        .filter_map(|_| std::net::TcpStream::connect(&addr).ok())
        .collect();
    assert_eq!(silent.len(), 40);
    std::thread::sleep(std::time::Duration::from_millis(400));
    let get = |path: &str, agent: Option<&str>| {
        let mut s = std::net::TcpStream::connect(&addr).expect("connect");
        let who = agent.map_or(String::new(), |a| format!("X-Rsim-Agent: {a}\r\n"));
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{who}Connection: close\r\n\r\n")
                .as_bytes(),
        )
        .expect("write");
        let mut got = String::new();
        let _ = s.read_to_string(&mut got);
        got
    };
    let page = get("/", None);
    assert!(
        page.starts_with("HTTP/1.1 200"),
        "{}",
        &page[..page.len().min(300)]
    );
    rt().block_on(async {
        let s = agent(&server.url, "agent-1").await;
        let r = call(&s, "get_node", json!({"node": "n0"})).await;
        assert_eq!(ok(&r)["id"], "n0");
    });
    drop(silent);
    // On loopback without tokens anyone local is the owner: twenty connections kept open after
    // one owner's request each hold at most the owner's share, and an agent still gets in.
    let claims: Vec<std::net::TcpStream> = (0..20)
        .filter_map(|_| {
            let mut s = std::net::TcpStream::connect(&addr).ok()?;
            s.write_all(b"GET /nope HTTP/1.1\r\nHost: localhost\r\n\r\n")
                .ok()?;
            s.set_read_timeout(Some(std::time::Duration::from_millis(500)))
                .ok()?;
            let mut buf = [0u8; 256];
            let _ = s.read(&mut buf);
            Some(s)
        })
        .collect();
    assert_eq!(claims.len(), 20);
    rt().block_on(async {
        let s = agent(&server.url, "agent-2").await;
        let r = call(&s, "get_node", json!({"node": "n0"})).await;
        assert_eq!(ok(&r)["id"], "n0");
    });
    drop(claims);
}

/// The next try once a full server gives silent connections' places away: use the eviction to
/// cut honest clients off. An agent's keep-alive connection, idle between its requests, has said
/// whose it is, so a flood of fresh silent sockets never takes its place: its next request on
/// the same connection is answered.
#[test]
fn a_flood_of_silent_sockets_never_takes_an_identified_connections_place() {
    use std::io::{Read, Write};
    let (_d, study) = example_study();
    let text = std::fs::read_to_string(study.join("rsim.toml")).expect("config");
    crate::common::commit_config(
        &study,
        &format!(
            "{text}\n[server]\nmax_connections = 16\nheader_timeout_s = 30\nowner_reserve = 2\n"
        ),
        "server limits",
    );
    let server = serve(&study, &[]);
    let addr = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_string();
    let mut kept = std::net::TcpStream::connect(&addr).expect("connect");
    kept.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    let ask = |s: &mut std::net::TcpStream| {
        s.write_all(b"GET /mcp HTTP/1.1\r\nHost: localhost\r\nX-Rsim-Agent: agent-1\r\n\r\n")
            .expect("write");
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).to_string()
    };
    let first = ask(&mut kept);
    assert!(first.starts_with("HTTP/1.1 "), "{first:?}");
    // Three rounds of forty fresh silent sockets, each past the server's 16 places.
    for _ in 0..3 {
        let flood: Vec<std::net::TcpStream> = (0..40)
            .filter_map(|_| std::net::TcpStream::connect(&addr).ok())
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(flood);
    }
    let again = ask(&mut kept);
    assert!(
        again.starts_with("HTTP/1.1 ") && !again.contains("503"),
        "the agent's connection lost its place: {again:?}"
    );
}
