//! Red-team: limits and uniqueness checks attacked by concurrent callers, and views an agent can
//! make grow. Several agents' rsim processes share one study, so every race here runs between
//! separate processes started at once (within one process quick writes run one at a time and
//! would never race). Each test asserts the refusal, what is recorded, and the audit's count.

use std::path::Path;
use std::process::Output;

use rsi_master::model::{ActionName, Caller, Role};
use rsi_master::{Study, os::audit};
use serde_json::{Value, json};

use crate::common::{commit_config, example_study, rsim, run_ok};

/// The example's committed rsim.toml with `edits` applied (each `from` must be in it).
fn configure(root: &Path, edits: &[(&str, &str)]) {
    let mut text = std::fs::read_to_string(root.join("rsim.toml")).expect("config");
    for (from, to) in edits {
        assert!(text.contains(from), "{from:?} is not in rsim.toml");
        text = text.replacen(from, to, 1);
    }
    commit_config(root, &text, "owner: limits for the red team");
}

/// Start every call at once, each in its own `rsim` process (`agent`, action, JSON arguments);
/// wait for all.
fn race(root: &Path, calls: &[(String, &str, Value)]) -> Vec<Output> {
    let children: Vec<_> = calls
        .iter()
        .map(|(agent, action, args)| {
            rsim()
                .arg("-C")
                .arg(root)
                .args(["--agent", agent, "--role", "worker", "call", action])
                .arg(args.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn rsim")
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .collect()
}

/// (accepted, refused by `rule`), and every other outcome is a failure.
fn tally(outs: &[Output], rule: &str) -> (usize, usize) {
    let (mut ok, mut refused) = (0, 0);
    for o in outs {
        let err = String::from_utf8_lossy(&o.stderr);
        if o.status.success() {
            ok += 1;
        } else if err.contains(&format!("rejected by policy rule {rule}")) {
            refused += 1;
        } else {
            panic!("neither accepted nor refused by {rule}: {err}");
        }
    }
    (ok, refused)
}

fn open(root: &Path) -> Study {
    let mut s = Study::open(root).expect("open");
    s.set_rsim_bin(std::path::PathBuf::from(env!("CARGO_BIN_EXE_rsim")));
    s
}

fn limits(s: &Study) -> (Vec<String>, u64) {
    let rep = audit::audit(s).expect("audit");
    let check = rep
        .checks
        .iter()
        .find(|c| c.name == "limits")
        .expect("limits check");
    (check.violations.clone(), rep.got_through)
}

use crate::common::inline;

fn clean_rows(tag: usize, n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|j| (format!("say hello {tag} {j}"), format!("hello {tag} {j}")))
        .collect()
}

/// Rows registered in the study, from the index.
fn registered_rows(s: &Study) -> u64 {
    s.index()
        .datasets_registered()
        .expect("datasets")
        .iter()
        .map(|d| d.2)
        .sum()
}

/// Eight agents race to register three rows each against a study budget of ten rows: exactly
/// three registrations fit, and exactly three are accepted (old code: the count was read before
/// the write, so all eight passed). Then the limit's message, a derived dataset (a filter) that
/// would pass it, the per-agent budget, and the audit counting data over a lowered budget.
#[test]
fn racing_registrations_cannot_pass_the_dataset_budgets() {
    let (_d, root) = example_study();
    run_ok(&root, &["branch", "--from", "n0", "--title", "data"]);
    configure(
        &root,
        &[(
            "max_nodes = 200",
            "max_nodes = 200\ndataset_rows = 10\nagent_dataset_rows = 7",
        )],
    );
    let calls: Vec<_> = (0..8)
        .map(|i| {
            (
                format!("racer-{i}"),
                "register_dataset",
                inline("n1", &format!("d{i}"), &clean_rows(i, 3)),
            )
        })
        .collect();
    let outs = race(&root, &calls);
    assert_eq!(tally(&outs, "budget-dataset-storage"), (3, 5));
    let s = open(&root);
    assert_eq!(registered_rows(&s), 9);
    let refusals = s
        .index()
        .node_actions("n1")
        .expect("actions")
        .iter()
        .filter(|a| a.record.decision.rule.as_deref() == Some("budget-dataset-storage"))
        .count();
    assert_eq!(refusals, 5, "every refusal is recorded");
    let (violations, got_through) = limits(&s);
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(got_through, 0);

    // The refusal says what is used, what was asked and the limit.
    let mallory = Caller::new("mallory", Role::Worker);
    let e = s
        .call(
            &mallory,
            "register_dataset",
            inline("n1", "two", &clean_rows(90, 2)),
        )
        .expect_err("past the budget");
    assert_eq!(e.rule.as_deref(), Some("budget-dataset-storage"));
    assert!(
        e.message.contains("hold 9 rows")
            && e.message.contains("would add 2")
            && e.message.contains("budgets.dataset_rows")
            && e.message.contains("10"),
        "{}",
        e.message
    );
    s.call(
        &mallory,
        "register_dataset",
        inline("n1", "one", &clean_rows(91, 1)),
    )
    .expect("the last row fits");
    // A derived dataset is stored like any other: a filter keeping its input's row is refused.
    let filter =
        json!({"node": "n1", "name": "copy", "source": {"kind": "filter", "dataset": "one"}});
    let e = s
        .call(&mallory, "register_dataset", filter)
        .expect_err("a derived dataset counts");
    assert_eq!(
        e.rule.as_deref(),
        Some("budget-dataset-storage"),
        "{}",
        e.message
    );

    // The per-agent budget: raise the study's, keep the agent's at 7.
    let text = std::fs::read_to_string(root.join("rsim.toml")).expect("config");
    commit_config(
        &root,
        &text.replace("dataset_rows = 10\n", "dataset_rows = 1000\n"),
        "owner: more room",
    );
    let s = open(&root);
    s.call(
        &mallory,
        "register_dataset",
        inline("n1", "six", &clean_rows(92, 6)),
    )
    .expect("mallory has 1 + 6 rows");
    let e = s
        .call(
            &mallory,
            "register_dataset",
            inline("n1", "more", &clean_rows(93, 1)),
        )
        .expect_err("past the agent's budget");
    assert_eq!(e.rule.as_deref(), Some("budget-agent-dataset-storage"));
    assert!(
        e.message.contains("\"mallory\"") && e.message.contains("budgets.agent_dataset_rows"),
        "{}",
        e.message
    );
    // Past the budgets, a million generated rows are refused on the request's size, before any
    // row is generated or scanned.
    let generated = json!({"node": "n1", "name": "million", "source": {"kind": "arith", "op": "add", "digits": 3, "format": "plain", "n": 1_000_000, "seed": 7}});
    let e = s
        .call(&mallory, "register_dataset", generated)
        .expect_err("past the budgets");
    // The study's budget (1,000 rows now) is checked before the agent's.
    assert_eq!(e.rule.as_deref(), Some("budget-dataset-storage"));
    assert!(e.message.contains("would add 1000000"), "{}", e.message);
    assert!(e.commit.is_some(), "the refusal is recorded");

    // What the policy cannot prevent, the audit counts: the owner lowers the budget below what is
    // registered, and every dataset past it is reported.
    let text = std::fs::read_to_string(root.join("rsim.toml")).expect("config");
    commit_config(
        &root,
        &text.replace("dataset_rows = 1000\n", "dataset_rows = 12\n"),
        "owner: less room",
    );
    let s = open(&root);
    let (violations, got_through) = limits(&s);
    assert!(
        !violations.is_empty()
            && violations
                .iter()
                .all(|v| v.contains("past budgets.dataset_rows = 12")),
        "{violations:#?}"
    );
    assert!(got_through >= violations.len() as u64);
}

/// The study's storage budget in bytes, raced the same way: stored bytes (JSON Lines) of all
/// registrations never pass it.
#[test]
fn racing_registrations_cannot_pass_the_storage_bytes_budget() {
    let (_d, root) = example_study();
    run_ok(&root, &["branch", "--from", "n0", "--title", "data"]);
    // One registration of 3 rows stores ~150 bytes; 400 bytes hold two of them.
    configure(
        &root,
        &[(
            "max_nodes = 200",
            "max_nodes = 200\ndataset_storage_bytes = 400",
        )],
    );
    let calls: Vec<_> = (0..6)
        .map(|i| {
            (
                format!("racer-{i}"),
                "register_dataset",
                inline("n1", &format!("d{i}"), &clean_rows(i, 3)),
            )
        })
        .collect();
    let outs = race(&root, &calls);
    let (ok, refused) = tally(&outs, "budget-dataset-storage");
    assert_eq!((ok, refused), (2, 4));
    let s = open(&root);
    let stored: u64 = s
        .index()
        .datasets_registered()
        .expect("datasets")
        .iter()
        .map(|d| {
            std::fs::metadata(s.store().path(&d.1))
                .expect("object")
                .len()
        })
        .sum();
    assert!(stored <= 400, "{stored} bytes stored");
    assert!(limits(&s).0.is_empty());
}

/// An agent allowed two contamination answers fires six contaminated registrations at once to
/// learn more about the test split: exactly two are answered (`contamination`, with evidence),
/// the other four are refused by `contamination-probing` (old code: the rejection count was read
/// before the earlier rejections were recorded, so all six were answered).
#[test]
fn racing_probes_get_no_more_contamination_answers_than_the_limit() {
    let (_d, root) = example_study();
    run_ok(&root, &["branch", "--from", "n0", "--title", "probe"]);
    configure(
        &root,
        &[(
            "max_contamination_rejections_per_agent = 5",
            "max_contamination_rejections_per_agent = 2",
        )],
    );
    let test = std::fs::read_to_string(root.join(".rsim/protected/add2/test.jsonl")).expect("test");
    let items: Vec<Value> = test
        .lines()
        .take(6)
        .map(|l| serde_json::from_str(l).expect("row"))
        .collect();
    let calls: Vec<_> = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let rows = vec![(
                item["prompt"].as_str().expect("prompt").to_string(),
                item["answer"].as_str().expect("answer").to_string(),
            )];
            (
                "prober".to_string(),
                "register_dataset",
                inline("n1", &format!("p{i}"), &rows),
            )
        })
        .collect();
    let outs = race(&root, &calls);
    let answered = outs
        .iter()
        .filter(|o| {
            String::from_utf8_lossy(&o.stderr).contains("rejected by policy rule contamination:")
        })
        .count();
    let probing = outs
        .iter()
        .filter(|o| {
            String::from_utf8_lossy(&o.stderr)
                .contains("rejected by policy rule contamination-probing")
        })
        .count();
    assert_eq!((answered, probing), (2, 4));
    let s = open(&root);
    let recorded = |rule: &str| s.index().rejection_count("prober", rule).expect("count");
    assert_eq!(recorded("contamination"), 2);
    assert_eq!(recorded("contamination-probing"), 4);
    let (violations, got_through) = limits(&s);
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(got_through, 0);
}

/// Six agents branch at once with room for two more nodes: exactly two nodes are created, four
/// branches are refused by `budget-nodes` and recorded (old code: all six counted the same
/// number of nodes and were created).
#[test]
fn racing_branches_cannot_pass_the_node_budget() {
    let (_d, root) = example_study();
    run_ok(&root, &["branch", "--from", "n0", "--title", "first"]);
    configure(&root, &[("max_nodes = 200", "max_nodes = 4")]);
    let calls: Vec<_> = (0..6)
        .map(|i| {
            (
                format!("racer-{i}"),
                "branch",
                json!({"parents": ["n0"], "title": format!("race {i}")}),
            )
        })
        .collect();
    let outs = race(&root, &calls);
    assert_eq!(tally(&outs, "budget-nodes"), (2, 4));
    let s = open(&root);
    assert_eq!(s.index().node_count().expect("count"), 4);
    assert_eq!(
        s.index()
            .node_actions("n0")
            .expect("actions")
            .iter()
            .filter(|a| a.record.decision.rule.as_deref() == Some("budget-nodes"))
            .count(),
        4
    );
    let (violations, _) = limits(&s);
    assert!(violations.is_empty(), "{violations:#?}");
}

/// Four agents conclude one node at once (each with its own outcome) while two register datasets
/// on it: the node is concluded exactly once, and nothing is recorded on it after its
/// conclusion — a conclude or registration that lost the race is recorded as a `node-concluded`
/// rejection (old code: the status was read before the write, so several concludes landed, each
/// rewriting the outcome, and registrations landed on the concluded node).
#[test]
fn racing_concludes_conclude_a_node_once_and_nothing_lands_after() {
    let (_d, root) = example_study();
    run_ok(&root, &["branch", "--from", "n0", "--title", "contested"]);
    let outcomes = ["positive", "negative", "inconclusive", "positive"];
    let mut calls: Vec<_> = outcomes
        .iter()
        .enumerate()
        .map(|(i, o)| {
            (
                format!("racer-{i}"),
                "conclude",
                json!({"node": "n1", "outcome": o, "findings": format!("finding {i}")}),
            )
        })
        .collect();
    for i in 0..2 {
        calls.push((
            format!("writer-{i}"),
            "register_dataset",
            inline("n1", &format!("late{i}"), &clean_rows(i, 1)),
        ));
    }
    let outs = race(&root, &calls);
    let (ok, refused) = tally(&outs[..4], "node-concluded");
    assert_eq!((ok, refused), (1, 3));
    let s = open(&root);
    let actions = s.index().node_actions("n1").expect("actions");
    let concluded_at = actions
        .iter()
        .filter(|a| a.record.action == ActionName::Conclude && a.record.decision.accepted())
        .map(|a| a.seq)
        .collect::<Vec<_>>();
    assert_eq!(concluded_at.len(), 1, "concluded once");
    assert!(
        actions
            .iter()
            .filter(|a| a.seq > concluded_at[0])
            .all(|a| !a.record.decision.accepted()
                && a.record.decision.rule.as_deref() == Some("node-concluded")),
        "nothing lands after the conclusion"
    );
    let (violations, got_through) = limits(&s);
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(got_through, 0);
}

/// A deep chain's `dag` text and report stay linear: bytes per node at depth 400 are within 20%
/// of those at depth 40 (old code: the tree indented every child, so the text grew with the
/// square of the depth — 48 MB at depth 5,000).
#[test]
fn a_deep_chain_does_not_blow_up_dag_and_report_output() {
    let size = |depth: usize| {
        let (_d, root) = example_study();
        configure(
            &root,
            &[
                ("max_nodes = 200", "max_nodes = 10000"),
                (
                    "[policy]\n",
                    "[policy]\nmax_writes_per_agent_per_minute = 0\n",
                ),
            ],
        );
        let s = open(&root);
        let w = Caller::new("deep-agent", Role::Worker);
        let mut parent = "n0".to_string();
        for i in 0..depth {
            let r = s
                .call(
                    &w,
                    "branch",
                    json!({"parents": [parent], "title": format!("step {i}")}),
                )
                .expect("branch");
            parent = r["node"].as_str().expect("node").to_string();
        }
        let dag = rsim()
            .arg("-C")
            .arg(&root)
            .args(["dag"])
            .output()
            .expect("dag");
        assert!(dag.status.success());
        let dot = rsim()
            .arg("-C")
            .arg(&root)
            .args(["dag", "--format", "dot"])
            .output()
            .expect("dag --format dot");
        assert!(dot.status.success());
        let rep = rsi_master::campaign::report::build(&s, None).expect("report");
        assert_eq!(
            rep.nodes.len(),
            depth,
            "the chain is the campaign's (a -agent author)"
        );
        let text = rsi_master::campaign::report::text(&rep);
        let html = rsi_master::faces::web::page::static_page(&s).expect("html");
        let nodes = (depth + 1) as f64;
        [
            dag.stdout.len() as f64 / nodes,
            dot.stdout.len() as f64 / nodes,
            text.len() as f64 / nodes,
            html.len() as f64 / nodes,
        ]
    };
    let small = size(40);
    let big = size(400);
    for (i, what) in ["dag", "dag --format dot", "report", "report --html"]
        .iter()
        .enumerate()
    {
        let (small, big) = (small[i], big[i]);
        assert!(
            big < small * 1.2,
            "{what}: {big:.0} bytes per node at depth 400 vs {small:.0} at depth 40"
        );
    }
}

/// An agent pipes thousands of requests down one `rsim mcp` connection without reading the
/// answers. Each used to open a study of its own: 15,000 such requests held 544 open files and
/// 1.5 GB, and a process out of file descriptors misread its own record (nodes left out of the
/// index, the node budget passed). Now the server's open files stay bounded while it is
/// flooded, every request gets exactly one answer — served, or refused at once past what one
/// connection may have waiting — and the record stays whole.
#[test]
fn a_flood_of_requests_down_one_connection_keeps_the_servers_open_files_bounded() {
    use std::io::{BufRead, Write};
    const N: u64 = 4000;
    let (_d, root) = example_study();
    run_ok(&root, &["branch", "--from", "n0", "--title", "flooded"]);
    let (mut child, mut stdin, mut out) = initialized_mcp(&root, "flooder");
    let pid = child.id();
    let line = |v: Value| format!("{v}\n");
    let fds = || std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let before = fds();
    let writer = std::thread::spawn(move || {
        let mut all = line(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        for id in 1..=N {
            all.push_str(&line(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "get_node", "arguments": {"node": "n1"}}})));
        }
        stdin.write_all(all.as_bytes()).expect("flood");
        stdin
    });
    let mut seen = std::collections::HashSet::new();
    let (mut served, mut refused, mut most) = (0, 0, 0);
    let mut l = String::new();
    while seen.len() < N as usize {
        l.clear();
        if out.read_line(&mut l).expect("answer") == 0 {
            break;
        }
        most = most.max(fds());
        let v: Value = serde_json::from_str(&l).expect("JSON-RPC");
        let id = v["id"].as_u64().expect("an answer to a request");
        assert!(seen.insert(id), "request {id} answered twice");
        if l.contains("too many requests in flight") {
            refused += 1;
        } else {
            assert!(
                l.contains("n1") && v["result"]["isError"] != json!(true),
                "{l}"
            );
            served += 1;
        }
    }
    drop(writer.join().expect("writer"));
    assert_eq!(seen.len(), N as usize, "every request is answered once");
    assert!(served > 0, "the server served none");
    assert!(
        most <= before + 48,
        "open files grew with the flood: {before} before, {most} at most ({served} served, {refused} refused)"
    );
    let _ = child.kill();
    let _ = child.wait();
    crate::common::fsck_clean(&root);
}

/// The next try at the flood: writes instead of queries, `branch` piped down two connections at
/// once against a node budget of 12. Every request is answered once (created, refused by the
/// budget, throttled, or refused as in flight), the nodes git holds never pass the budget, and
/// the record stays whole: the bound on studies held, and the node count read from git as well
/// as the index, keep a flood of writes from passing a budget.
#[test]
fn a_flood_of_branches_down_two_connections_cannot_pass_the_node_budget() {
    use std::io::{BufRead, Write};
    const N: u64 = 400;
    let (_d, root) = example_study();
    configure(&root, &[("max_nodes = 200", "max_nodes = 12")]);
    let flood = |agent: &str| {
        let root = root.clone();
        let agent = agent.to_string();
        std::thread::spawn(move || {
            let (mut child, mut stdin, out) = spawned_mcp(&root, &agent);
            let mut all = format!(
                "{}\n{}\n",
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "flood", "version": "0"}}}),
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
            );
            for id in 1..=N {
                all.push_str(&format!("{}\n", json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "branch", "arguments": {"parents": ["n0"], "title": format!("p{id}")}}})));
            }
            let writer = std::thread::spawn(move || {
                stdin.write_all(all.as_bytes()).expect("flood");
                stdin
            });
            let mut seen = std::collections::HashSet::new();
            for l in out.lines() {
                let v: Value = serde_json::from_str(&l.expect("line")).expect("JSON-RPC");
                if let Some(id) = v["id"].as_u64() {
                    assert!(seen.insert(id), "request {id} answered twice");
                }
                if seen.len() as u64 == N + 1 {
                    break;
                }
            }
            drop(writer.join().expect("writer"));
            let _ = child.kill();
            let _ = child.wait();
            seen.len() as u64
        })
    };
    let (a, b) = (flood("flood-a"), flood("flood-b"));
    assert_eq!(
        a.join().expect("a"),
        N + 1,
        "every request of a is answered"
    );
    assert_eq!(
        b.join().expect("b"),
        N + 1,
        "every request of b is answered"
    );
    let branches = crate::common::git_ok(
        &root,
        &["for-each-ref", "--format=%(refname)", "refs/heads/rsim/n/"],
    );
    let nodes = branches.lines().count();
    assert!(
        nodes <= 12,
        "{nodes} nodes in git past budgets.max_nodes = 12"
    );
    assert!(nodes > 1, "the flood created no node at all");
    crate::common::fsck_clean(&root);
}

/// Cancel notifications naming no request in flight, each with an id of 256 KiB, sent down one
/// connection without end: the server keeps none of them (it kept every id it was told of, a
/// gigabyte and a half for 1,500 ids of a MiB), and still answers.
#[test]
fn a_flood_of_cancels_naming_nothing_in_flight_keeps_nothing() {
    use std::io::{BufRead, Write};
    const N: usize = 600;
    let (_d, root) = example_study();
    let (mut child, mut stdin, mut out) = initialized_mcp(&root, "canceller");
    let pid = child.id();
    let line = |v: Value| format!("{v}\n");
    let rss_kib = || {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            })
            .unwrap_or(0)
    };
    stdin
        .write_all(
            line(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).as_bytes(),
        )
        .expect("initialized");
    let ask = |stdin: &mut std::process::ChildStdin, id: u64| {
        stdin
            .write_all(line(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "get_node", "arguments": {"node": "n0"}}})).as_bytes())
            .expect("get_node");
    };
    ask(&mut stdin, 1);
    let mut l = String::new();
    out.read_line(&mut l).expect("answer");
    let before = rss_kib();
    for i in 0..N {
        let id = format!("{i}-{}", "x".repeat(256 << 10));
        stdin
            .write_all(line(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": id}})).as_bytes())
            .expect("cancel");
    }
    ask(&mut stdin, 2);
    l.clear();
    out.read_line(&mut l).expect("answer after the flood");
    assert!(l.contains("\"id\":2") && l.contains("n0"), "{l}");
    let after = rss_kib();
    let _ = child.kill();
    let _ = child.wait();
    // 600 ids of 256 KiB are 150 MiB: kept, they would all be there.
    assert!(
        after < before + 64 * 1024,
        "the server kept what the cancels named: {before} KiB before, {after} KiB after"
    );
}

/// `rsim mcp` as `agent` on `root`, initialized: the process, its stdin, and its stdout read
/// by lines.
fn initialized_mcp(
    root: &Path,
    agent: &str,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::io::BufReader<std::process::ChildStdout>,
) {
    use std::io::{BufRead, Write};
    let (child, mut stdin, mut out) = spawned_mcp(root, agent);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": agent, "version": "0"}}});
    stdin
        .write_all(format!("{init}\n").as_bytes())
        .expect("initialize");
    let mut first = String::new();
    out.read_line(&mut first).expect("initialize answer");
    assert!(first.contains("\"result\""), "{first}");
    (child, stdin, out)
}

/// `rsim mcp` as `agent` on `root`, not yet initialized: the process, its stdin, and its
/// stdout read by lines.
fn spawned_mcp(
    root: &Path,
    agent: &str,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::io::BufReader<std::process::ChildStdout>,
) {
    let mut child = rsim()
        .current_dir(root)
        .args(["mcp", "--agent", agent])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("rsim mcp");
    let stdin = child.stdin.take().expect("stdin");
    let out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    (child, stdin, out)
}
