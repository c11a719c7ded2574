//! `rsim run`: campaigns of built-in agents (orchestration, greedy, random), the lock-in guard,
//! resuming a killed run, the report, and LLM agents against a scripted chat-completions server
//! on loopback.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{commit_config, example_study, fsck_clean, ok_json, rsim, run, run_ok};

/// Every accepted action of the study, from the log query.
fn actions(root: &Path) -> Vec<Value> {
    ok_json(root, &["log", "--limit", "100000"])["actions"]
        .as_array()
        .expect("actions")
        .clone()
}

fn node(root: &Path, id: &str) -> Value {
    ok_json(root, &["show", id])
}

#[test]
fn orchestrated_campaign_reviews_grows_the_dag_and_tests_only_the_promoted_node() {
    let (_d, root) = example_study();
    // One generator secret every run: the campaign draws the same data each time, so what it
    // learns (and whether any node ends promising, which promotion needs) does not vary by run.
    // With a fresh random secret, a CI run once ended with no promising node to test.
    rsi_master::os::owner::share_generator_secret(&root, "0123456789abcdef0123456789abcdef")
        .expect("secret");
    let html = root.join("report.html");
    // A tight lock-in limit so the guard fires within a short campaign.
    let v = ok_json(
        &root,
        &[
            "run",
            "--experiments",
            "10",
            "--max-share",
            "0.3",
            "--quiet",
            "--html",
            html.to_str().expect("utf8"),
        ],
    );
    let s = &v["summary"];
    assert_eq!(s["experiments"], 10, "{s}");
    let acts = actions(&root);
    let accepted = |name: &str| -> Vec<&Value> {
        acts.iter()
            .filter(|a| a["action"] == name && a["decision"] == "accepted")
            .collect()
    };
    assert_eq!(accepted("run_sft").len(), 10);
    // Reviews by the reviewer role, with verdicts on every campaign node.
    let reviews = accepted("review");
    assert!(reviews.len() >= 2, "{reviews:?}");
    assert!(reviews.iter().all(|r| r["role"] == "reviewer"));
    let report = &v["report"];
    let nodes = report["nodes"].as_array().expect("nodes");
    assert!(nodes.len() >= 4, "{nodes:?}");
    for n in nodes {
        assert_eq!(n["status"], "concluded", "{n}");
        if n["runs"].as_u64() > Some(0) {
            assert!(!n["verdict"].is_null(), "unreviewed: {n}");
        }
    }
    // Nodes beyond the opening ones were branched from review proposals, and say so.
    let n4 = node(&root, "n4");
    assert!(
        n4["hypothesis"]
            .as_str()
            .unwrap_or("")
            .contains("proposal: "),
        "{n4}"
    );
    assert!(
        n4["hypothesis"].as_str().unwrap_or("").contains("recipe: "),
        "{n4}"
    );
    // The lock-in guard fired: a review opened a new top-level direction because of it.
    let guard_node = nodes.iter().find(|n| {
        n["parents"] == json!(["n0"])
            && node(&root, n["id"].as_str().unwrap_or(""))["hypothesis"]
                .as_str()
                .unwrap_or("")
                .contains("Lock-in guard")
    });
    assert!(guard_node.is_some(), "no guard direction in {nodes:?}");
    // Test split: only the orchestrator, only on the root, only the base and the promoted node.
    let tests: Vec<&Value> = accepted("evaluate")
        .into_iter()
        .filter(|a| a["summary"].as_str().unwrap_or("").contains("/test"))
        .collect();
    assert_eq!(
        tests.len(),
        2,
        "{tests:?}\nsummary: {s}\nverdicts: {:?}",
        nodes
            .iter()
            .map(|n| (n["id"].clone(), n["verdict"].clone(), n["dev_mean"].clone()))
            .collect::<Vec<_>>()
    );
    assert!(
        tests
            .iter()
            .all(|a| a["agent"] == "orchestrator" && a["node"] == "n0")
    );
    let best = &report["best"];
    assert!(best["test"].is_number(), "{best}");
    // Before its test evaluation, the promoted checkpoint was re-scored on evidence it was not
    // selected on: the dev twin score of the owner's tripwire note of its dev evaluation.
    let fresh = &s["fresh"];
    assert_eq!(fresh["split"], "dev_twin", "{s}");
    assert_eq!(fresh["dev"], best["dev"], "{s}");
    assert_eq!(best["fresh"], *fresh, "{best}");
    let notes_dir = root.join(".rsim/tripwire");
    let note = std::fs::read_dir(&notes_dir)
        .expect("tripwire notes")
        .map(|e| e.expect("entry").path())
        .find(|p| {
            let n: Value =
                serde_json::from_slice(&std::fs::read(p).expect("note")).expect("note json");
            n["checkpoint"] == best["checkpoint"] && n.get("dev_twin").is_some()
        })
        .expect("the promoted checkpoint's dev twin note");
    let n: Value = serde_json::from_slice(&std::fs::read(&note).expect("note")).expect("json");
    assert_eq!(n["dev"]["score"], fresh["dev"], "{n}");
    assert_eq!(n["dev_twin"]["score"], fresh["score"], "{n}");
    assert_eq!(n["dev_twin"]["n"], fresh["n"], "{n}");
    let best_row = nodes
        .iter()
        .find(|n| n["id"] == best["node"])
        .expect("best row");
    assert_eq!(best_row["verdict"], "promising");
    // Workers never evaluated on test; agents only used their own roles.
    assert!(
        acts.iter()
            .filter(|a| a["agent"].as_str().unwrap_or("").starts_with("worker"))
            .all(|a| a["role"] == "worker")
    );
    let page = std::fs::read_to_string(&html).expect("html");
    // The web page's static snapshot: the DAG laid out with its best path, the views.
    assert!(page.contains("id=\"rsim-data\"") && page.contains("\"best_path\":[\"n0\""));
    assert!(page.contains("Learning curves") && page.contains("script-src 'sha256-"));
    fsck_clean(&root);

    // The dev twin changes no decision of an honest campaign: every dev evaluation was checked
    // against it, none was suspect, and the audit finds nothing.
    let audit = ok_json(&root, &["audit"]);
    let dev_tripwire = audit["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "dev-tripwire")
        .expect("dev-tripwire check")
        .clone();
    assert!(
        dev_tripwire["checked"].as_u64() >= Some(10),
        "{dev_tripwire}"
    );
    assert_eq!(dev_tripwire["violations"], json!([]), "{dev_tripwire}");
    assert_eq!(audit["got_through"], 0, "{audit}");
    // Running again on a finished campaign repeats nothing.
    let again = ok_json(&root, &["run", "--quiet"]);
    assert_eq!(again["summary"]["experiments"], 10);
    assert_eq!(actions(&root).len(), acts.len());

    // The text report names the parts a person looks for.
    let out = run(&root, &["report"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for part in [
        "Best node:",
        "Base model:",
        "Lock-in index:",
        "Budget:",
        "Audit:",
        "on evidence it was not selected on: dev_twin",
    ] {
        assert!(text.contains(part), "{part} missing in\n{text}");
    }
    // A note that disagrees with the others on the same checkpoint (written beside no evaluation
    // of this study) is no evidence: the report gives none rather than either score.
    let mut forged = n.clone();
    forged["dev_twin"]["score"] = json!(1.0);
    std::fs::write(
        notes_dir.join("forged.json"),
        serde_json::to_vec(&forged).expect("json"),
    )
    .expect("write");
    let r = ok_json(&root, &["report"]);
    assert!(r["best"]["fresh"].is_null(), "{}", r["best"]);
}

#[test]
fn baselines_greedy_refines_its_best_and_random_starts_from_the_root() {
    let (_d, root) = example_study();
    let v = ok_json(
        &root,
        &[
            "run",
            "--strategy",
            "greedy",
            "--experiments",
            "4",
            "--quiet",
        ],
    );
    assert_eq!(v["summary"]["experiments"], 4);
    let nodes = v["report"]["nodes"].as_array().expect("nodes").clone();
    assert_eq!(nodes.len(), 4);
    assert_eq!(nodes[0]["parents"], json!(["n0"]));
    // Every later node refines an earlier one: never a second top-level direction.
    for n in &nodes[1..] {
        assert_ne!(n["parents"], json!(["n0"]), "{n}");
    }
    assert_eq!(v["summary"]["lock_in"]["top_share"], 1.0);
    assert!(actions(&root).iter().all(|a| a["action"] != "review"));

    let (_d2, root2) = example_study();
    let v = ok_json(
        &root2,
        &[
            "run",
            "--strategy",
            "random",
            "--experiments",
            "4",
            "--quiet",
        ],
    );
    let nodes = v["report"]["nodes"].as_array().expect("nodes").clone();
    // On failure, the nodes (their runs and status), what was refused and the DAG.
    assert_eq!(
        nodes.len(),
        4,
        "{}\nrefused: {}\n{}",
        serde_json::to_string_pretty(&nodes).unwrap_or_default(),
        v["report"]["rejections_by_rule"],
        v["report"]["dag_text"].as_str().unwrap_or_default()
    );
    assert!(nodes.iter().all(|n| n["parents"] == json!(["n0"])));
    fsck_clean(&root2);
}

/// A study whose compute budget runs out during the campaign (one second: a run or two fit): from
/// then on every `run_sft` is refused. The campaign must stop, naming the refusal, instead of
/// branching and concluding empty nodes until the study's node budget runs out (a refused run
/// frees its claim on the campaign's budget, so the campaign's own count never ends it); its
/// report still comes out, the refused test score said in the summary.
#[test]
fn a_campaign_whose_runs_are_refused_stops_and_names_the_rule() {
    for strategy in ["greedy", "orchestra"] {
        let (_d, root) = example_study();
        let text = std::fs::read_to_string(root.join("rsim.toml")).expect("config");
        assert!(
            text.contains("compute_seconds = 3600"),
            "the example's budget moved"
        );
        commit_config(
            &root,
            &text.replace("compute_seconds = 3600", "compute_seconds = 1"),
            "one second of compute",
        );
        let v = ok_json(
            &root,
            &[
                "run",
                "--strategy",
                strategy,
                "--experiments",
                "40",
                "--quiet",
            ],
        );
        let s = &v["summary"];
        let ran = s["experiments"].as_u64().expect("experiments");
        assert!(ran < 40, "{strategy}: {s}");
        let stopped = s["stopped"].as_str().unwrap_or_default();
        assert!(
            stopped.contains("started no training run") && stopped.contains("budget-compute"),
            "{strategy}: {s}"
        );
        let refused = actions(&root)
            .iter()
            .filter(|a| a["action"] == "run_sft" && a["decision"] == "rejected")
            .count();
        assert!(
            (3..=6).contains(&refused),
            "{strategy}: {refused} refused runs before it stopped"
        );
        let nodes = v["report"]["nodes"].as_array().expect("nodes").len() as u64;
        assert!(nodes <= ran + 8, "{strategy}: {nodes} nodes for {ran} runs");
        fsck_clean(&root);
    }
}

#[test]
fn a_killed_run_resumes_without_repeating_finished_work() {
    let (_d, root) = example_study();
    let mut child = rsim()
        .arg("-C")
        .arg(&root)
        .args(["run", "--experiments", "8", "--quiet"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    // Kill it once a few experiments are in the record.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let n = actions(&root)
            .iter()
            .filter(|a| a["action"] == "run_sft")
            .count();
        if n >= 3 || std::time::Instant::now() > deadline {
            break;
        }
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    let before: Vec<Value> = actions(&root)
        .into_iter()
        .filter(|a| a["action"] == "run_sft")
        .collect();
    assert!(!before.is_empty());

    let v = ok_json(&root, &["run", "--quiet"]);
    assert_eq!(v["summary"]["experiments"], 8, "{}", v["summary"]);
    let after: Vec<Value> = actions(&root)
        .into_iter()
        .filter(|a| a["action"] == "run_sft" && a["decision"] == "accepted")
        .collect();
    assert_eq!(after.len(), 8, "the budget holds across the restart");
    // Every run of the first process is still there, once.
    for b in &before {
        let same = after.iter().filter(|a| a["commit"] == b["commit"]).count();
        assert_eq!(same, 1, "{b}");
    }
    // No (node, seed) trained twice: read each run's full request from git.
    let mut seen = std::collections::BTreeSet::new();
    for a in &after {
        let id = a["node"].as_str().unwrap_or("");
        let seq = a["seq"].as_u64().unwrap_or(0);
        let out = Command::new("git")
            .arg("-C")
            .arg(&root)
            .args([
                "show",
                &format!("rsim/n/{id}:actions/{seq:04}-run_sft.json"),
            ])
            .output()
            .expect("git show");
        let rec: Value = serde_json::from_slice(&out.stdout).expect("action json");
        let seed = rec["request"]["seed"].as_u64().expect("seed");
        assert!(
            seen.insert((id.to_string(), seed)),
            "{id} seed {seed} ran twice"
        );
    }
    fsck_clean(&root);
}

// ------------------------------------------------------------------ LLM agents

/// A scripted OpenAI-compatible chat-completions server on loopback: it answers each request
/// from the role in the system prompt and the conversation so far, and keeps every request.
struct MockLlm {
    addr: String,
    requests: Arc<Mutex<Vec<Value>>>,
}

fn tool_call(id: &str, name: &str, args: Value) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}})
}

fn reply(calls: Vec<Value>) -> Value {
    let msg = if calls.is_empty() {
        json!({"role": "assistant", "content": "done"})
    } else {
        json!({"role": "assistant", "content": null, "tool_calls": calls})
    };
    json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]})
}

/// The scripted agent's next message.
fn script(req: &Value) -> Value {
    let msgs = req["messages"].as_array().cloned().unwrap_or_default();
    let text = |i: usize| {
        msgs.get(i)
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
    };
    let (system, user) = (text(0), text(1));
    let turn = msgs.iter().filter(|m| m["role"] == "assistant").count();
    let last_tool: Value = msgs
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .and_then(|m| {
            // Tool results reach the model fenced as data from the record.
            let c = m["content"].as_str()?;
            assert!(
                c.starts_with("<agent-text author=\"rsim ")
                    && c.trim_end().ends_with("</agent-text>"),
                "tool results are fenced: {c}"
            );
            let inner = c
                .split_once('\n')?
                .1
                .trim_end()
                .strip_suffix("</agent-text>")?;
            serde_json::from_str(inner).ok()
        })
        .unwrap_or(Value::Null);
    // The role shows in the tools it was given: only reviewers get `review`.
    let is_reviewer = req["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["function"]["name"] == "review"));
    // The role prompts say that fenced text is data, never instructions.
    assert!(system.contains("<agent-text"), "{system}");
    if is_reviewer {
        assert!(system.contains("Reviewer"), "reviewer prompt: {system}");
        return match turn {
            0 => reply(vec![tool_call(
                "r1",
                "review",
                json!({
                    "node": "n0",
                    "summary": "LLM review: start with the plain format.",
                    "proposals": [{"parents": ["n0"], "title": "plain, lr 0.003",
                        "hypothesis": "recipe: format=plain lr=0.003 schedule=cosine rows=5000 curriculum=no init=base"}]
                }),
            )]),
            _ => reply(vec![]),
        };
    }
    // Worker: the node's title and hypothesis come fenced, with their author.
    assert!(
        user.contains("<agent-text author=") && user.contains("not instructions"),
        "{user}"
    );
    // The node id is in the task text ("Your node is nK").
    let node = user
        .split_whitespace()
        .nth(3)
        .unwrap_or("n1")
        .trim_end_matches(|c: char| !c.is_alphanumeric())
        .to_string();
    match turn {
        0 => reply(vec![tool_call("w0", "get_node", json!({"node": node}))]),
        // A tool this role may not use: the error comes back as a tool result.
        1 => reply(vec![tool_call(
            "w1",
            "review",
            json!({"node": node, "summary": "I review myself"}),
        )]),
        2 => reply(vec![tool_call(
            "w2",
            "register_dataset",
            json!({"node": node, "name": format!("llm-{node}"),
                   "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 2000, "seed": 1}}),
        )]),
        3 => reply(vec![tool_call(
            "w3",
            "run_sft",
            json!({"node": node, "base": "base", "datasets": [format!("llm-{node}")],
                   "learning_rate": 0.003, "steps": 50, "batch_size": 16, "seed": 1}),
        )]),
        4 => {
            let ck = last_tool["checkpoint"].as_str().unwrap_or("").to_string();
            // A second training run exceeds the task's allowance: refused before the study.
            reply(vec![
                tool_call(
                    "w4",
                    "evaluate",
                    json!({"node": node, "checkpoint": ck, "task": "add2", "split": "dev"}),
                ),
                tool_call(
                    "w5",
                    "run_sft",
                    json!({"node": node, "base": "base", "datasets": [format!("llm-{node}")],
                           "learning_rate": 0.003, "steps": 50, "batch_size": 16, "seed": 2}),
                ),
            ])
        }
        5 => reply(vec![tool_call(
            "w6",
            "conclude",
            json!({"node": node, "outcome": "positive", "findings": "LLM worker: trained and scored."}),
        )]),
        _ => reply(vec![]),
    }
}

fn mock_llm() -> MockLlm {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let keep = requests.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut len = 0usize;
            let mut line = String::new();
            loop {
                line.clear();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                let l = line.trim_end();
                if l.is_empty() {
                    break;
                }
                if let Some(v) = l.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0u8; len];
            // The orchestrator's reachability check connects and sends nothing.
            if len == 0 || reader.read_exact(&mut body).is_err() {
                continue;
            }
            let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let answer = script(&req).to_string();
            keep.lock().expect("lock").push(req);
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    MockLlm { addr, requests }
}

#[test]
fn llm_agents_act_through_the_same_tools_and_rules() {
    let (_d, root) = example_study();
    let mock = mock_llm();
    let spec = format!("llm:scripted@http://{}/v1", mock.addr);
    let v = ok_json(
        &root,
        &[
            "run",
            "--experiments",
            "1",
            "--seeds-per-node",
            "1",
            "--workers",
            "1",
            "--worker",
            &spec,
            "--reviewer",
            &spec,
            "--quiet",
        ],
    );
    assert_eq!(v["summary"]["experiments"], 1, "{}", v["summary"]);
    let acts = actions(&root);
    // The LLM reviewer's review, the branch from its proposal, the LLM worker's actions.
    let by = |agent: &str, action: &str| {
        acts.iter()
            .filter(|a| a["agent"] == agent && a["action"] == action)
            .count()
    };
    assert!(by("reviewer-llm", "review") >= 1, "{acts:?}");
    assert_eq!(by("worker-1", "run_sft"), 1);
    assert_eq!(by("worker-1", "evaluate"), 1);
    assert_eq!(by("worker-1", "conclude"), 1);
    let n1 = node(&root, "n1");
    assert_eq!(n1["status"], "concluded");
    assert!(
        n1["hypothesis"]
            .as_str()
            .unwrap_or("")
            .contains("proposal: n0/")
    );

    let reqs = mock.requests.lock().expect("lock").clone();
    // Tools are the action schemas, filtered by role.
    let worker_req = reqs
        .iter()
        .find(|r| {
            r["messages"][0]["content"]
                .as_str()
                .unwrap_or("")
                .contains("You are a Worker")
        })
        .expect("a worker request");
    let names: Vec<&str> = worker_req["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(names.contains(&"run_sft") && names.contains(&"get_node"));
    assert!(!names.contains(&"review"), "{names:?}");
    assert!(worker_req["tools"][0]["function"]["parameters"]["properties"].is_object());
    // The forbidden call and the over-budget call came back to the model as tool errors.
    let tool_msgs: Vec<String> = reqs
        .iter()
        .flat_map(|r| r["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str().map(str::to_string))
        .collect();
    assert!(
        tool_msgs
            .iter()
            .any(|m| m.contains("rejected") && m.contains("rule role")),
        "{tool_msgs:?}"
    );
    assert!(
        tool_msgs
            .iter()
            .any(|m| m.contains("allows 1 training run")),
        "{tool_msgs:?}"
    );
    fsck_clean(&root);
}

#[test]
fn unreachable_llm_endpoint_and_bad_agents_are_clear_errors() {
    let (_d, root) = example_study();
    // A port nothing listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let out = run(
        &root,
        &[
            "run",
            "--worker",
            &format!("llm:m@http://127.0.0.1:{port}/v1"),
            "--quiet",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unreachable"), "{err}");
    let out = run(&root, &["run", "--worker", "gpt-9", "--quiet"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("builtin"));
    // Nothing was recorded by the failed starts beyond the root.
    assert_eq!(actions(&root).len(), 1);
    let out = run(&root, &["run", "--experiments", "0"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_study_with_no_budget_left_is_a_clear_refusal() {
    let (_d, root) = example_study();
    let text = std::fs::read_to_string(root.join("rsim.toml")).expect("config");
    let line = text
        .lines()
        .find(|l| l.starts_with("max_nodes"))
        .expect("max_nodes line")
        .to_string();
    commit_config(
        &root,
        &text.replace(&line, "max_nodes = 1"),
        "owner: no room for new nodes",
    );
    let out = run(&root, &["run", "--quiet"]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("budget-nodes") && err.contains("max_nodes = 1"),
        "{err}"
    );
    // The refusal is the only thing recorded, as a rejected campaign naming the rule.
    let acts = actions(&root);
    assert_eq!(acts.len(), 2, "{acts:?}");
    let refused = acts
        .iter()
        .find(|a| a["action"] == "campaign")
        .expect("the refused campaign is recorded");
    assert_eq!(refused["decision"], "rejected");
    assert_eq!(refused["rule"], "budget-nodes");
    assert_eq!(refused["node"], "n0");
    fsck_clean(&root);
}

// ------------------------------------------------------------------ external command agents

/// The Python MCP SDK the client harness installs (tools/mcp-clients.sh); `tools/test.sh` installs
/// it before the tests and sets RSIM_REQUIRE_MCP_CLIENTS so these tests cannot skip there.
pub(crate) fn mcp_python() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/.venv/bin/python");
    if p.is_file() {
        return Some(p);
    }
    assert!(
        std::env::var_os("RSIM_REQUIRE_MCP_CLIENTS").is_none(),
        "RSIM_REQUIRE_MCP_CLIENTS is set but {} is missing",
        p.display()
    );
    eprintln!(
        "skipping: no Python MCP client at {} (run tools/mcp-clients.sh)",
        p.display()
    );
    None
}

pub(crate) fn standin(python: &Path) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/standin_agent.py");
    format!("cmd:{} {}", python.display(), script.display())
}

/// A campaign of one worker slot, one seed per node, whose worker is the stand-in MCP agent in
/// `mode`; it must finish.
pub(crate) fn standin_campaign(root: &Path, py: &Path, experiments: &str, mode: &str) {
    // Command agents inherit only what the owner names: the stand-in reads its mode from it.
    let text = std::fs::read_to_string(root.join("rsim.toml")).expect("config");
    if !text.contains("[agents]") {
        commit_config(
            root,
            &format!("{text}\n[agents]\nenv = [\"PATH\", \"HOME\", \"STANDIN_MODE\"]\n"),
            "owner: the stand-in agent's mode reaches it",
        );
    }
    let out = rsim()
        .arg("-C")
        .arg(root)
        .args(["run", "--experiments", experiments])
        .args(["--seeds-per-node", "1", "--workers", "1"])
        .args(["--worker", &standin(py), "--quiet"])
        .env("STANDIN_MODE", mode)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn command_agents_work_through_mcp_and_are_stopped_past_their_limits() {
    let Some(py) = mcp_python() else { return };
    let (_d, root) = example_study();
    standin_campaign(&root, &py, "1", "forbidden");
    let acts = actions(&root);
    let by = |action: &str| {
        acts.iter()
            .filter(|a| a["agent"] == "worker-1" && a["action"] == action)
            .collect::<Vec<_>>()
    };
    // Everything the external agent did went through MCP under its own token's identity.
    assert_eq!(by("register_dataset").len(), 1, "{acts:?}");
    assert_eq!(by("run_sft").len(), 1);
    assert_eq!(by("evaluate").len(), 1);
    assert_eq!(by("conclude").len(), 1);
    let refused = by("review");
    assert_eq!(
        refused.len(),
        1,
        "the worker's review attempt is recorded as rejected"
    );
    assert_eq!(refused[0]["decision"], "rejected");
    let n1 = node(&root, "n1");
    assert!(
        n1["notes"]
            .as_str()
            .unwrap_or("")
            .contains("stand-in agent"),
        "{n1}"
    );

    // An agent that starts more training runs than its task allows is stopped.
    let (_d2, root2) = example_study();
    standin_campaign(&root2, &py, "2", "greedy");
    let n1 = node(&root2, "n1");
    assert_eq!(n1["status"], "concluded");
    let notes = n1["notes"].as_str().unwrap_or("");
    assert!(
        notes.contains("was stopped") && notes.contains("allows 1"),
        "{notes}"
    );
    fsck_clean(&root2);

    // An agent that hangs is stopped after its turn; the record stays consistent.
    let (_d3, root3) = example_study();
    let out = run(
        &root3,
        &[
            "run",
            "--experiments",
            "1",
            "--seeds-per-node",
            "1",
            "--workers",
            "1",
            "--worker",
            "cmd:sleep 600",
            "--agent-timeout",
            "2",
            "--quiet",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let notes = node(&root3, "n1")["notes"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(notes.contains("ran past its 2 s turn"), "{notes}");
    fsck_clean(&root3);

    // An agent that is not installed is refused before anything is recorded.
    let (_d4, root4) = example_study();
    let out = run(
        &root4,
        &[
            "run",
            "--worker",
            "cmd:rsim-no-such-agent --flag",
            "--quiet",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not installed"));
    assert_eq!(actions(&root4).len(), 1);
}

/// A command agent sees only what the owner passes it: no inherited secrets, a working directory
/// outside the study holding only its own MCP config, no token file of other agents.
#[test]
fn command_agents_get_only_their_own_token_and_the_environment_the_owner_names() {
    let (d, root) = example_study();
    let out_dir = d.path().join("seen");
    std::fs::create_dir_all(&out_dir).expect("mkdir");
    let o = out_dir.display();
    let spy = format!(
        "cmd:sh -c 'env > {o}/env; pwd > {o}/pwd; ls -a . > {o}/ls; ls -a \"$0\" > {o}/state 2>&1; exit 1' {}",
        root.join(".rsim").display()
    );
    let out = rsim()
        .arg("-C")
        .arg(&root)
        .args([
            "run",
            "--experiments",
            "1",
            "--seeds-per-node",
            "1",
            "--workers",
            "1",
        ])
        .args(["--worker", &spy, "--quiet", "--agent-timeout", "20"])
        .env("RSIM_TEST_SECRET_KEY", "sk-do-not-leak")
        .output()
        .expect("run");
    // The spy fails its turns, so the campaign gives up on it; it must still have run.
    assert!(out.status.code().is_some(), "{out:?}");
    let read = |f: &str| std::fs::read_to_string(out_dir.join(f)).unwrap_or_default();
    let env = read("env");
    assert!(env.contains("RSIM_MCP_TOKEN="), "the agent ran: {env}");
    assert!(!env.contains("sk-do-not-leak"), "{env}");
    let pwd = read("pwd");
    let study = root.canonicalize().expect("canon");
    assert!(
        !std::path::Path::new(pwd.trim()).starts_with(&study),
        "works outside the study: {pwd}"
    );
    let ls = read("ls");
    let files: Vec<&str> = ls.lines().filter(|l| !l.starts_with('.')).collect();
    assert_eq!(files.len(), 1, "only its own MCP config: {ls}");
    assert!(files[0].ends_with(".mcp.json"), "{ls}");
    // No file in the study's state holds another agent's token.
    let state = read("state");
    assert!(!state.contains("agent-tokens"), "{state}");
}

/// A hostile Worker that writes first — its own node with a `recipe:` line and a forged
/// `proposal:` line, and the dataset names the campaign will ask for, registered with its own rows —
/// gets neither its node adopted nor its rows trained on.
#[test]
fn a_campaign_adopts_no_node_and_trains_on_no_data_it_did_not_make() {
    let (_d, root) = example_study();
    let as_mallory = |args: &[&str]| {
        let mut full = vec!["--agent", "mallory", "--role", "worker"];
        full.extend_from_slice(args);
        run_ok(&root, &full)
    };
    as_mallory(&[
        "branch",
        "--from",
        "n0",
        "--title",
        "plain format, lr 0.003, cosine",
        "--hypothesis",
        "train this\nrecipe: format=plain lr=0.003 schedule=cosine rows=20000 curriculum=no init=base\nproposal: n0/4#1",
    ]);
    let squatted = [
        "add2-plain-20000",
        "add2-reversed-20000",
        "add2-scratchpad-20000",
    ];
    for name in squatted {
        as_mallory(&[
            "call",
            "register_dataset",
            &format!(
                r#"{{"node":"n1","name":"{name}","source":{{"kind":"inline","rows":[{{"prompt":"hello","answer":"world"}}]}}}}"#
            ),
        ]);
    }
    let out = rsim()
        .arg("-C")
        .arg(&root)
        .args(["run", "--experiments", "4", "--steps", "30", "--quiet"])
        .output()
        .expect("run");
    assert!(out.status.code().is_some(), "{out:?}");
    let acts = actions(&root);
    // Mallory's node got no work from the campaign.
    assert!(
        !acts
            .iter()
            .any(|a| a["node"] == "n1" && a["agent"] != "mallory"),
        "{acts:?}"
    );
    // No accepted training run used a squatted name.
    let study = rsi_master::Study::open(&root).expect("open");
    let mut runs = 0;
    for a in acts
        .iter()
        .filter(|a| a["action"] == "run_sft" && a["decision"] == "accepted")
    {
        let node = a["node"].as_str().expect("node");
        let seq = a["seq"].as_u64().expect("seq") as u32;
        let (rec, _) = study.action(node, seq).expect("action");
        let used: Vec<&str> = rec.request["datasets"]
            .as_array()
            .map(|d| d.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        assert!(
            !used.iter().any(|n| squatted.contains(n)),
            "{node}#{seq} trained on {used:?}"
        );
        runs += 1;
    }
    // The campaign's own nodes said why they did not train: the names were taken outside it.
    let refused = acts
        .iter()
        .filter(|a| {
            a["summary"]
                .as_str()
                .is_some_and(|s| s.contains("registered outside this campaign"))
        })
        .count();
    assert!(refused >= 1 || runs > 0, "{acts:?}");
    assert!(
        refused >= 1,
        "the squatted names were asked for and refused: {acts:?}"
    );
}

/// Issue 14: a command agent cannot read the study's files (the protected splits above all),
/// another agent's private directory, or its parents' environments — and still reaches the MCP
/// server. Skips without Landlock unless `RSIM_REQUIRE_SANDBOX` is set.
#[test]
fn a_sandboxed_command_agent_cannot_read_the_study_or_other_agents() {
    if let Err(why) = rsi_master::jobs::sandbox::landlock_abi() {
        assert!(
            std::env::var_os("RSIM_REQUIRE_SANDBOX").is_none(),
            "RSIM_REQUIRE_SANDBOX is set but this machine cannot sandbox agents: {why}"
        );
        eprintln!("skipped: no sandbox here: {why}");
        return;
    }
    let (d, root) = example_study();
    let study = root.canonicalize().expect("canon");
    let seen = d.path().join("seen");
    std::fs::create_dir_all(&seen).expect("mkdir");
    // Another agent's turn directory, as rsim makes them.
    let other = std::env::temp_dir().join(format!("rsim-agent-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&other).expect("mkdir");
    std::fs::write(
        other.join("reviewer-1.mcp.json"),
        "Bearer planted-other-token",
    )
    .expect("write");
    let spy = d.path().join("spy.sh");
    std::fs::write(
        &spy,
        format!(
            r#"#!/bin/sh
try() {{
  if out=$(sh -c "$2" 2>/dev/null) && [ -n "$out" ]; then echo "GOT $1 $out"; else echo "DENIED $1"; fi
}}
{{
try protected "cat {study}/.rsim/protected/add2/test.jsonl"
try study-list "ls {study}"
try config "cat {study}/rsim.toml"
try index "exec 3< {study}/.rsim/index.sqlite && echo opened"
try git "ls {study}/.git"
try other-agent "cat {other}/reviewer-1.mcp.json"
i=0; while [ ! -s {seen}/rsim-pid ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
try rsim-environ "tr '\0' '\n' < /proc/$(cat {seen}/rsim-pid)/environ"
try own-dir "echo ok > ./probe && cat ./probe"
try mcp "python3 -c 'import os, socket, urllib.parse as u; p = u.urlparse(os.environ[\"RSIM_MCP_URL\"]); socket.create_connection((p.hostname, p.port), timeout=5); print(\"reached\")'"
}} > {seen}/report
exit 1
"#,
            study = study.display(),
            other = other.display(),
            seen = seen.display(),
        ),
    )
    .expect("spy");
    let child = rsim()
        .arg("-C")
        .arg(&root)
        .args([
            "run",
            "--experiments",
            "1",
            "--seeds-per-node",
            "1",
            "--workers",
            "1",
        ])
        .args(["--worker", &format!("cmd:sh {}", spy.display())])
        .args(["--quiet", "--agent-timeout", "20"])
        .env("RSIM_TEST_SECRET_KEY", "sk-do-not-leak")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    // The agent aims at the environment of the rsim process that runs it.
    std::fs::write(seen.join("rsim-pid"), child.id().to_string()).expect("pid");
    let out = child.wait_with_output().expect("run");
    let _ = std::fs::remove_dir_all(&other);
    assert!(out.status.code().is_some(), "{out:?}");
    let report = std::fs::read_to_string(seen.join("report")).expect("the agent ran");
    let lines: Vec<&str> = report.lines().collect();
    assert_eq!(lines.len(), 9, "{report}");
    for what in [
        "protected",
        "study-list",
        "config",
        "index",
        "git",
        "other-agent",
        "rsim-environ",
    ] {
        assert!(
            lines.contains(&format!("DENIED {what}").as_str()),
            "{what}: {report}"
        );
    }
    assert!(lines.contains(&"GOT own-dir ok"), "{report}");
    assert!(lines.contains(&"GOT mcp reached"), "{report}");
    assert!(!report.contains("sk-do-not-leak") && !report.contains("planted-other-token"));
}

/// Every run of a campaign can be re-made from the record: `rsim reproduce` of every node gives
/// the identical checkpoints (so the same metrics), and the summary view counts its verdicts.
#[test]
fn every_node_of_a_campaign_reproduces_to_identical_checkpoints() {
    let (_d, root) = example_study();
    let v = ok_json(&root, &["run", "--experiments", "6", "--quiet"]);
    assert_eq!(v["summary"]["experiments"], 6, "{}", v["summary"]);
    let list = ok_json(&root, &["call", "list_nodes", r#"{"limit": 1000}"#]);
    let mut reproduced = 0;
    let mut evaluations = 0;
    for n in list["nodes"].as_array().expect("nodes") {
        let id = n["id"].as_str().expect("id");
        let info = node(&root, id);
        let runs = info["actions"]
            .as_array()
            .expect("actions")
            .iter()
            .filter(|a| {
                (a["action"] == "run_sft" || a["action"] == "evaluate")
                    && a["decision"] == "accepted"
            })
            .count();
        if runs == 0 {
            continue;
        }
        let r = ok_json(&root, &["--role", "reviewer", "reproduce", id]);
        for x in r.as_array().expect("reproductions") {
            assert_eq!(x["identical"], true, "{id}: {x}");
            if x["action"] == "evaluate" {
                for m in x["metrics"].as_array().expect("scores") {
                    assert_eq!(m["difference"].as_f64(), Some(0.0), "{id}: {m}");
                }
                evaluations += 1;
                continue;
            }
            for m in x["train_metrics"].as_array().expect("metrics") {
                if m["name"] == "final_loss" {
                    assert_eq!(m["difference"].as_f64(), Some(0.0), "{id}: {m}");
                }
            }
            reproduced += 1;
        }
    }
    assert_eq!(reproduced, 6, "every experiment reproduced");
    assert!(
        evaluations >= 6,
        "every dev evaluation reproduced: {evaluations}"
    );
    let sm = ok_json(&root, &["dag", "--view", "summary"]);
    let verdicts: u64 = sm["summary"]["by_verdict"]
        .as_object()
        .expect("verdicts")
        .values()
        .filter_map(Value::as_u64)
        .sum();
    assert!(verdicts > 0, "{sm}");
    assert!(sm["summary"]["best"]["id"].is_string(), "{sm}");
    assert!(sm["tokens"].as_u64() <= Some(1000), "{sm}");
    fsck_clean(&root);
}

/// `rsim --json call ACTION ARGS` on a study.
fn call(root: &Path, action: &str, args: Value) -> std::process::Output {
    run(root, &["--json", "call", action, &args.to_string()])
}

#[test]
fn a_run_records_its_learning_curve_and_scores_its_kept_checkpoints_on_dev() {
    let (_d, root) = example_study();
    ok_json(
        &root,
        &[
            "branch",
            "--from",
            "n0",
            "--title",
            "t",
            "--hypothesis",
            "h",
        ],
    );
    let out = call(
        &root,
        "register_dataset",
        json!({"node": "n1", "name": "plain", "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 2000, "seed": 1}}),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sft = |extra: Value| -> Value {
        let mut req = json!({"node": "n1", "base": "base", "datasets": ["plain"],
                             "learning_rate": 0.001, "steps": 300, "batch_size": 16, "seed": 1});
        for (k, v) in extra.as_object().expect("object") {
            req[k] = v.clone();
        }
        req
    };

    // Bad eval_every requests are refused before anything is written.
    let before = actions(&root).len();
    for (extra, names) in [
        (json!({"eval_every": 100}), "eval_task"),
        (json!({"eval_every": 100, "eval_task": "nope"}), "nope"),
        (json!({"eval_task": "add2"}), "eval_every"),
        (json!({"eval_every": 1, "eval_task": "add2"}), "at most 50"),
        (
            json!({"eval_every": 100, "eval_task": "add2", "adapter": {"kind": "lora", "rank": 2, "alpha": 4.0}}),
            "adapter",
        ),
    ] {
        let out = call(&root, "run_sft", sft(extra.clone()));
        assert_eq!(out.status.code(), Some(2), "{extra}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(names), "{extra}: {err}");
    }
    assert_eq!(
        actions(&root).len(),
        before,
        "a refused request wrote nothing"
    );

    // A run with eval_every: its curve, its kept checkpoints, each scored on dev by an evaluate
    // action of its own.
    let out = call(
        &root,
        "run_sft",
        sft(json!({"eval_every": 100, "eval_task": "add2"})),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("json");
    let curve = r["curve"].as_array().expect("curve");
    let steps: Vec<u64> = curve.iter().filter_map(|p| p["step"].as_u64()).collect();
    assert_eq!(steps, [100, 200, 300], "{r}");
    assert!(
        curve
            .iter()
            .all(|p| p["loss"].as_f64().is_some_and(|l| (0.0..=1.0).contains(&l))),
        "{r}"
    );
    let kept: Vec<u64> = r["intermediate"]
        .as_array()
        .expect("intermediate")
        .iter()
        .filter_map(|p| p["step"].as_u64())
        .collect();
    assert_eq!(kept, [100, 200]);
    let dev = r["dev_curve"].as_array().expect("dev_curve");
    assert_eq!(dev.len(), 3, "{r}");
    assert!(
        dev.iter().all(|p| p["metrics"]["exact_match"].is_number()),
        "{r}"
    );
    assert_eq!(dev[2]["checkpoint"], r["checkpoint"]);
    let final_ck = r["checkpoint"].as_str().expect("checkpoint").to_string();
    // The record: the run_sft (with its curve), then three evaluate actions on the dev split.
    let mine: Vec<Value> = actions(&root)
        .into_iter()
        .filter(|a| a["node"] == "n1" && a["decision"] == "accepted")
        .collect();
    let evals: Vec<&Value> = mine.iter().filter(|a| a["action"] == "evaluate").collect();
    assert_eq!(evals.len(), 3, "{mine:?}");
    assert!(
        evals
            .iter()
            .all(|a| a["summary"].as_str().unwrap_or("").contains("add2/dev"))
    );
    // A kept checkpoint is a checkpoint of the record: it can be trained on further.
    let mid = r["intermediate"][0]["checkpoint"].as_str().expect("ck");
    let out = call(
        &root,
        "run_sft",
        json!({"node": "n1", "base": mid, "datasets": ["plain"], "learning_rate": 0.001, "steps": 300, "batch_size": 16, "seed": 2}),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = call(
        &root,
        "evaluate",
        json!({"node": "n1", "checkpoint": serde_json::from_slice::<Value>(&out.stdout).expect("json")["checkpoint"], "task": "add2", "split": "dev"}),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // compare: the mean is over final checkpoints only; the trend says how the runs moved.
    let out = call(
        &root,
        "compare",
        json!({"node": "n1", "nodes": ["n0", "n1"], "task": "add2", "split": "dev", "metric": "exact_match"}),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c: Value = serde_json::from_slice(&out.stdout).expect("json");
    let row = &c["rows"][1];
    assert_eq!(row["node"], "n1");
    assert_eq!(
        row["n"], 2,
        "two runs' final checkpoints, not the kept ones: {row}"
    );
    let t = &row["trend"];
    // Runs whose loss has a slope over their last half (an n-gram run that has memorised its rows
    // logs an error of 0 there, and a flat zero has no relative slope).
    assert!((1..=2).contains(&t["runs"].as_u64().unwrap_or(0)), "{t}");
    // The continued run started from the checkpoint kept at step 100: 100 + 300 steps behind
    // its checkpoint (the first run's are 300).
    assert_eq!(t["trained_steps"], 400, "{t}");
    assert!(t["loss_slope_per_1k"]["mean"].is_number(), "{t}");
    // (Its interval needs two runs with a slope; see the count above.)
    assert!(t["gain_per_1k"]["mean"].is_number(), "{t}");
    assert!(t["still_learning"].is_boolean(), "{t}");
    assert!(c["rows"][0]["trend"].is_null(), "the root trained nothing");

    // Every face counts results the same way: the DAG overview (editor, web), the leaderboard
    // and the summary's best see the two final checkpoints' scores, not the kept ones'.
    let finals: Vec<f64> = row["values"]
        .as_array()
        .expect("values")
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    assert_eq!(finals.len(), 2, "{row}");
    let best_final = finals.iter().copied().fold(f64::MIN, f64::max);
    let study = rsi_master::Study::open(&root).expect("open");
    let ov = study.dag_overview(None).expect("overview");
    let n1 = ov.nodes.iter().find(|n| n.id == "n1").expect("n1");
    assert_eq!(n1.evals, 2, "the overview counts final checkpoints only");
    assert!(
        (n1.score.expect("score") - row["mean"].as_f64().expect("mean")).abs() < 1e-9,
        "overview {:?} vs compare {}",
        n1.score,
        row["mean"]
    );
    let out = call(
        &root,
        "dag",
        json!({"view": "best", "task": "add2", "split": "dev", "metric": "exact_match"}),
    );
    let best: Value = serde_json::from_slice(&out.stdout).expect("json");
    let ranked = best["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["id"] == "n1")
        .expect("n1 ranked");
    assert_eq!(ranked["value"].as_f64(), Some(best_final), "{best}");
    // A node that scores another node's kept checkpoint as its own evidence: that score is
    // its result, in compare and in the overview alike (the rule is per node, not per checkpoint).
    let call_ok = |action: &str, args: Value| -> Value {
        ok_json(&root, &["call", action, &args.to_string()])
    };
    let other = call_ok(
        "branch",
        json!({"parents": ["n1"], "title": "mid-run checkpoint", "hypothesis": "the step-100 checkpoint holds up"}),
    )["node"]
        .as_str()
        .expect("node")
        .to_string();
    call_ok(
        "evaluate",
        json!({"node": other, "checkpoint": mid, "task": "add2", "split": "dev"}),
    );
    let c2 = call_ok(
        "compare",
        json!({"node": other, "nodes": [other, "n1"], "task": "add2", "split": "dev", "metric": "exact_match"}),
    );
    assert_eq!(c2["rows"][0]["n"], 1, "{c2}");
    let study = rsi_master::Study::open(&root).expect("open");
    let ov = study.dag_overview(None).expect("overview");
    let o = ov.nodes.iter().find(|n| n.id == other).expect("other");
    assert_eq!(o.evals, 1, "the overview agrees with compare");
    // The commit's body says it in words too.
    let body = String::from_utf8_lossy(
        &Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(["log", "-1", "--format=%b", "rsim/n/n1"])
            .output()
            .expect("git")
            .stdout,
    )
    .to_string();
    assert!(body.contains("steps, loss"), "{body}");

    // A spent evaluation budget ends the dev curve with the policy's reason; the run stands.
    let used = actions(&root)
        .iter()
        .filter(|a| a["action"] == "evaluate" && a["decision"] == "accepted")
        .count();
    let cfg = std::fs::read_to_string(root.join("rsim.toml")).expect("config");
    let cfg = cfg.replace("evaluations = 500", &format!("evaluations = {}", used + 1));
    commit_config(&root, &cfg, "one evaluation left");
    let out = call(
        &root,
        "run_sft",
        sft(json!({"eval_every": 100, "eval_task": "add2", "seed": 3})),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(r["checkpoint"].is_string());
    let dev = r["dev_curve"].as_array().expect("dev_curve");
    assert_eq!(dev.len(), 2, "stops at the first refusal: {r}");
    assert!(dev[0]["metrics"]["exact_match"].is_number());
    assert!(
        dev[1]["error"]
            .as_str()
            .unwrap_or("")
            .contains("evaluation"),
        "{r}"
    );
    assert_ne!(final_ck, r["checkpoint"].as_str().unwrap_or(""));
    fsck_clean(&root);
}

#[test]
fn halving_runs_a_rung_of_random_recipes_then_continues_its_best() {
    let (_d, root) = example_study();
    // One generator secret every run (as the orchestration test): the same data each time, so a
    // run's outcome does not vary with the draw. The campaign's progress (stderr) goes into every
    // assertion's message: a worker turn that fails is returned to the frontier and retried, which
    // spends a run, and the log says why it failed.
    rsi_master::os::owner::share_generator_secret(&root, "0123456789abcdef0123456789abcdef")
        .expect("secret");
    let out = run(
        &root,
        &[
            "--json",
            "run",
            "--strategy",
            "halving",
            "--experiments",
            "5",
            "--steps",
            "40",
        ],
    );
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "rsim run failed: {log}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json output");
    assert_eq!(v["summary"]["experiments"], 5, "{v}\n{log}");
    let nodes = v["report"]["nodes"].as_array().expect("nodes").clone();
    assert_eq!(nodes.len(), 5, "{nodes:?}\n{log}");
    let (first, second): (Vec<&Value>, Vec<&Value>) =
        nodes.iter().partition(|n| n["parents"] == json!(["n0"]));
    assert_eq!(first.len(), 4, "{nodes:?}\n{log}");
    assert_eq!(second.len(), 1, "{nodes:?}\n{log}");
    // The continued node is the best of the first rung by dev, and trains from its checkpoint.
    let best = first
        .iter()
        .max_by(|a, b| {
            let (x, y) = (a["dev_mean"].as_f64(), b["dev_mean"].as_f64());
            x.unwrap_or(-1.0)
                .total_cmp(&y.unwrap_or(-1.0))
                .then_with(|| b["id"].as_str().cmp(&a["id"].as_str()))
        })
        .expect("best");
    assert_eq!(second[0]["parents"], json!([best["id"]]), "{nodes:?}");
    let id = second[0]["id"].as_str().expect("id");
    let hyp = node(&root, id)["hypothesis"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(hyp.contains("init=parent rung=1"), "{hyp}");
    assert!(actions(&root).iter().all(|a| a["action"] != "review"));
    fsck_clean(&root);
}

/// `rsim bench-strategies` pairs strategies by campaign seed on the same data: every strategy's
/// study of one seed holds one generator secret (so one data request draws the same rows in
/// each), each seed its own; it reports each promoted checkpoint's dev twin score beside its dev
/// and test scores, and the estimates' gaps to test per strategy.
#[test]
fn the_strategy_benchmark_pairs_seeds_on_the_same_data_and_reports_fresh_evidence() {
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().join("bench");
    let out = rsim()
        .args([
            "bench-strategies",
            "--example",
            "tiny-arith-ngram",
            "--seeds",
            "2",
            "--experiments",
            "2",
            "--steps",
            "10",
            "--strategy",
            "orchestra",
            "--strategy",
            "random",
            "--oracle",
            "--json",
            "--dir",
        ])
        .arg(&dir)
        .output()
        .expect("bench-strategies");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let secret = |study: &str| std::fs::read(dir.join(study).join(".rsim/secret")).expect("secret");
    for seed in 0..2 {
        assert_eq!(
            secret(&format!("orchestra-{seed}")),
            secret(&format!("random-{seed}")),
            "seed {seed}: the strategies' studies draw data with different secrets"
        );
    }
    assert_ne!(secret("orchestra-0"), secret("orchestra-1"));
    // One request, the same rows in both studies of a seed.
    let request = r#"{"node":"n0","name":"probe","source":{"kind":"arith","op":"add","digits":3,"format":"plain","n":300,"seed":11}}"#;
    let sha: Vec<Value> = ["orchestra-0", "random-0", "random-1"]
        .iter()
        .map(|s| {
            let r = ok_json(&dir.join(s), &["call", "register_dataset", request]);
            r["sha256"].clone()
        })
        .collect();
    assert_eq!(sha[0], sha[1], "{sha:?}");
    assert_ne!(sha[0], sha[2], "{sha:?}");
    // The oracle of each seed: the best recipe on dev among that seed's campaigns, trained as one
    // line (each run continuing the last) on the same data, and every strategy as a share of it.
    for seed in 0..2 {
        assert_eq!(
            secret(&format!("line-{seed}")),
            secret(&format!("orchestra-{seed}"))
        );
        let best_dev = ["orchestra", "random"]
            .iter()
            .flat_map(|s| {
                let r = ok_json(&dir.join(format!("{s}-{seed}")), &["report"]);
                r["nodes"]
                    .as_array()
                    .expect("nodes")
                    .iter()
                    .flat_map(|n| n["dev"].as_array().cloned().unwrap_or_default())
                    .filter_map(|x| x.as_f64())
                    .collect::<Vec<_>>()
            })
            .fold(f64::MIN, f64::max);
        let line = dir.join(format!("line-{seed}"));
        let hyp = |n: &str| {
            node(&line, n)["hypothesis"]
                .as_str()
                .unwrap_or("")
                .to_string()
        };
        assert_eq!(node(&line, "n1")["parents"], json!(["n0"]));
        assert_eq!(node(&line, "n2")["parents"], json!(["n1"]));
        assert!(hyp("n2").contains("init=parent rung=1"), "{}", hyp("n2"));
        // n1's recipe is one a campaign of this seed reached its best dev score with.
        let recipe = hyp("n1")
            .lines()
            .find(|l| l.starts_with("recipe:"))
            .expect("recipe")
            .to_string();
        let found = ["orchestra", "random"].iter().any(|s| {
            let r = ok_json(&dir.join(format!("{s}-{seed}")), &["report"]);
            r["nodes"].as_array().expect("nodes").iter().any(|n| {
                n["dev"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|x| x.as_f64() == Some(best_dev)))
                    && node(
                        &dir.join(format!("{s}-{seed}")),
                        n["id"].as_str().unwrap_or(""),
                    )["hypothesis"]
                        .as_str()
                        .unwrap_or("")
                        .contains(recipe.trim_end_matches(" init=base"))
            })
        });
        assert!(
            found,
            "seed {seed}: {recipe} is not the recipe of a best node (dev {best_dev})"
        );
    }
    // Fresh evidence beside every promoted checkpoint, and the gaps per strategy.
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 6, "{v}");
    for r in runs {
        let s = &r["summary"];
        assert_eq!(s["fresh"]["split"], "dev_twin", "{s}");
        assert_eq!(s["fresh"]["dev"], s["best_dev"], "{s}");
        assert!(s["fresh"]["n"].as_u64() > Some(0), "{s}");
    }
    for row in v["strategies"].as_array().expect("strategies") {
        for k in ["dev_minus_test", "fresh_minus_test"] {
            assert_eq!(row[k]["campaigns"], 2, "{row}");
            assert!(row[k]["mean"].is_number(), "{row}");
        }
    }
    let random = &v["strategies"][1];
    assert_eq!(random["orchestra_minus_this"]["seeds"], 2, "{random}");
    let line = &v["strategies"][2];
    assert_eq!(line["strategy"], "line", "{v}");
    assert_eq!(line["share_of_oracle"]["mean"], 1.0, "{line}");
}

/// `--strategy line` trains the recipe it is given, and says clearly when it is not given one or
/// is given one the task has no format for.
#[test]
fn a_line_campaign_needs_a_recipe_of_the_tasks_formats() {
    let (_d, root) = example_study();
    let out = run(
        &root,
        &["run", "--strategy", "line", "--experiments", "2", "--quiet"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--recipe"),
        "{out:?}"
    );
    let code = "recipe: format=nested lr=0.003 schedule=cosine rows=5000 curriculum=no init=base";
    let out = run(
        &root,
        &[
            "run",
            "--strategy",
            "line",
            "--experiments",
            "2",
            "--quiet",
            "--recipe",
            code,
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("nested"), "{err}");
    assert!(
        actions(&root).iter().all(|a| a["action"] != "run_sft"),
        "a refused line ran"
    );
}

/// `rsim run --lockstep`: the reviewer acts only while no worker turn is in flight, so two
/// campaigns of one seed on one data draw take the same course whichever of two runs finishes
/// first (without it, a review reads whatever had concluded by then).
#[test]
fn a_lockstep_campaign_reviews_with_no_run_in_flight_and_repeats_its_course() {
    let campaign = || {
        let (d, root) = example_study();
        rsi_master::os::owner::share_generator_secret(&root, "00112233445566778899aabbccddeeff")
            .expect("secret");
        let v = ok_json(
            &root,
            &[
                "run",
                "--experiments",
                "8",
                "--workers",
                "2",
                "--lockstep",
                "--quiet",
            ],
        );
        (d, root, v)
    };
    let (_d1, root, first) = campaign();
    let mut acts = actions(&root);
    assert!(!acts.is_empty());
    // Oldest first; at one instant a worker's conclude goes before a review.
    acts.sort_by(|a, b| {
        let key = |x: &Value| {
            (
                x["at"].as_str().unwrap_or("").to_string(),
                x["role"] == "reviewer",
            )
        };
        key(a).cmp(&key(b))
    });
    let mut in_flight = std::collections::BTreeSet::new();
    let (mut reviews, mut overlapped) = (0, 0);
    for a in &acts {
        let node = a["node"].as_str().unwrap_or("").to_string();
        match (a["role"].as_str(), a["action"].as_str()) {
            (Some("worker"), Some("conclude")) => {
                in_flight.remove(&node);
            }
            (Some("worker"), _) => {
                in_flight.insert(node);
            }
            (Some("reviewer"), Some("review")) => {
                reviews += 1;
                assert!(
                    in_flight.is_empty(),
                    "a review of {node} at {} while {in_flight:?} ran",
                    a["at"]
                );
            }
            _ => {}
        }
        overlapped = overlapped.max(in_flight.len());
    }
    assert!(reviews >= 2, "{acts:?}");
    // The two slots still ran side by side between reviews.
    assert_eq!(overlapped, 2, "{acts:?}");
    // The same seed on the same data: the same nodes, recipes, verdicts and promoted score.
    let (_d2, _root2, second) = campaign();
    let course = |v: &Value| -> Vec<(Value, Value, Value)> {
        v["report"]["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .map(|n| (n["id"].clone(), n["title"].clone(), n["verdict"].clone()))
            .collect()
    };
    assert_eq!(course(&first), course(&second));
    assert_eq!(first["summary"]["test"], second["summary"]["test"]);
    assert!(first["summary"]["test"].is_number(), "{first}");
}

/// `bench-strategies --lockstep` runs every campaign in lockstep (kept in each study's settings),
/// and a kept directory of lockstep campaigns is not resumed without it.
#[test]
fn the_strategy_benchmark_runs_its_campaigns_in_lockstep_when_asked() {
    let d = tempfile::tempdir().expect("tempdir");
    let dir = d.path().join("bench");
    let bench = |lockstep: bool| {
        let mut c = rsim();
        c.args([
            "bench-strategies",
            "--example",
            "tiny-arith-ngram",
            "--seeds",
            "1",
            "--experiments",
            "2",
            "--steps",
            "10",
            "--strategy",
            "orchestra",
            "--json",
            "--dir",
        ])
        .arg(&dir);
        if lockstep {
            c.arg("--lockstep");
        }
        c.output().expect("bench-strategies")
    };
    let out = bench(true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let saved: Value = serde_json::from_slice(
        &std::fs::read(dir.join("orchestra-0/.rsim/campaign.json")).expect("campaign.json"),
    )
    .expect("json");
    assert_eq!(saved["lockstep"], true, "{saved}");
    // The same directory without --lockstep is another benchmark: refused, not mixed in.
    let out = bench(false);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("other settings"),
        "{err}"
    );
}
