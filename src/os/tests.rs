//! Unit tests of the OS's own logic on a minimal study built by hand (no example, no face).

use serde_json::json;

use super::*;

const CONFIG: &str = r#"
[study]
name = "unit"
[base_model]
name = "base"
path = "models/base"
[tasks.t]
dev = { path = "eval/dev.jsonl" }
test = { path = "eval/test.jsonl" }
[budgets]
compute_seconds = 90
# A job that does not fit is refused at once here; the admission queue has its own tests.
queue_wait_seconds = 0
evaluations = 10
test_evaluations_per_node = 1
max_nodes = 3
[jobs]
sft = ["true"]
evaluate = ["true"]
# The job sandbox's wrapper is `rsim job sandbox`, and a unit test's "rsim" is the test harness
# itself (which would run its tests again, filtered by "job sandbox"); the integration tests run
# the sandbox with the real binary.
[policy]
sandbox = "off"
"#;

/// A study with a one-file base checkpoint, created through genesis.
fn study() -> (tempfile::TempDir, Study) {
    study_with(CONFIG)
}

fn study_with(config: &str) -> (tempfile::TempDir, Study) {
    let d = tempfile::tempdir().expect("tempdir");
    let root = d.path();
    std::fs::create_dir_all(root.join("models/base")).expect("base dir");
    std::fs::write(root.join("models/base/config.json"), "{}").expect("base");
    std::fs::create_dir_all(root.join("eval")).expect("eval dir");
    for (split, item) in [("dev", "1+1="), ("test", "2+2=")] {
        std::fs::write(
            root.join(format!("eval/{split}.jsonl")),
            format!("{{\"prompt\":\"{item}\",\"answer\":\"x\"}}\n"),
        )
        .expect("eval set");
    }
    std::fs::write(root.join(CONFIG_FILE), config).expect("config");
    genesis::create_study(root).expect("genesis");
    let s = Study::open(root).expect("open");
    (d, s)
}

fn worker(name: &str) -> Caller {
    Caller::new(name, Role::Worker)
}

fn history(s: &Study, node: &str) -> Vec<ActionRecord> {
    s.node_history(node).expect("history").1
}

#[test]
fn genesis_records_the_base_through_the_commit_protocol() {
    let (_d, s) = study();
    let h = history(&s, ROOT_NODE);
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].action, ActionName::Init);
    assert_eq!(h[0].artifacts[0].sha256, s.base_checkpoint().expect("base"));
    assert!(
        genesis::create_study(s.root()).is_err(),
        "a study is created once"
    );
}

#[test]
fn a_study_whose_dev_and_test_splits_share_items_is_refused() {
    let d = tempfile::tempdir().expect("tempdir");
    let root = d.path();
    std::fs::create_dir_all(root.join("models/base")).expect("base dir");
    std::fs::write(root.join("models/base/config.json"), "{}").expect("base");
    std::fs::create_dir_all(root.join("eval")).expect("eval dir");
    std::fs::write(
        root.join("eval/dev.jsonl"),
        "{\"prompt\":\"1 + 1 =\",\"answer\":\"2\"}\n",
    )
    .expect("dev");
    std::fs::write(
        root.join("eval/test.jsonl"),
        "{\"prompt\":\"1+1=\",\"answer\":\"2\"}\n{\"prompt\":\"2+2=\",\"answer\":\"4\"}\n",
    )
    .expect("test");
    std::fs::write(root.join(CONFIG_FILE), CONFIG).expect("config");
    let e = genesis::create_study(root).expect_err("overlap");
    assert!(e.message.contains("share 1 item"), "{}", e.message);
    assert!(
        Record::open(root).map_or(true, |r| r.main_tip().is_err()),
        "nothing committed"
    );
    // In the task's own sense of "the same item": operands in either order, any pair of the four
    // splits (dev, dev twin, test, sealed), each pair's count named.
    let write = |name: &str, items: &[&str]| {
        let text: String = items
            .iter()
            .map(|p| format!("{{\"prompt\":\"{p}\",\"answer\":\"x\"}}\n"))
            .collect();
        std::fs::write(root.join(format!("eval/{name}.jsonl")), text).expect("split");
    };
    write("dev", &["12+34=", "5+6="]);
    write("twin", &["6+5=", "70+8="]);
    write("test", &["1+2=", "8+70="]);
    write("sealed", &["34 + 12 =", "2+1="]);
    let config = CONFIG.replace(
        "test = { path = \"eval/test.jsonl\" }",
        "test = { path = \"eval/test.jsonl\" }\nsealed = { path = \"eval/sealed.jsonl\" }\n\
         dev_twin = { path = \"eval/twin.jsonl\" }\nnormal_form = \"arithmetic\"",
    );
    std::fs::write(root.join(CONFIG_FILE), &config).expect("config");
    let e = genesis::create_study(root).expect_err("overlap under the normal form");
    for pair in [
        "dev and dev_twin share 1 item",
        "dev and sealed share 1 item",
        "dev_twin and test share 1 item",
        "test and sealed share 1 item",
    ] {
        assert!(e.message.contains(pair), "{pair}: {}", e.message);
    }
    assert!(!e.message.contains("dev and test"), "{}", e.message);
    // Apart, the same study is created.
    write("sealed", &["9+9=", "3+4="]);
    write("twin", &["60+5=", "71+8="]);
    write("test", &["1+2=", "8+72="]);
    genesis::create_study(root).expect("disjoint splits");
}

#[test]
fn agent_names_that_could_forge_a_record_are_refused_before_anything_is_written() {
    let (_d, s) = study();
    for bad in ["", "a b", "a\nRsim-Role: owner", "..", &"x".repeat(65)] {
        let e = s
            .call(
                &worker(bad),
                "branch",
                json!({"parents": ["n0"], "title": "t"}),
            )
            .expect_err(bad);
        assert_eq!(e.kind, ErrorKind::Invalid, "{bad:?}: {}", e.message);
    }
    assert_eq!(history(&s, ROOT_NODE).len(), 1, "nothing recorded");
}

fn admit(s: &Study, job: &str, split: Option<Split>) -> std::result::Result<u64, Decision> {
    admit_as(s, "w", job, split)
}

fn admit_as(
    s: &Study,
    agent: &str,
    job: &str,
    split: Option<Split>,
) -> std::result::Result<u64, Decision> {
    let w = worker(agent);
    s.admit(&w, ROOT_NODE, job, split, Facts::default(), |f| {
        let req = EvaluateRequest {
            node: ROOT_NODE.into(),
            checkpoint: "base".into(),
            task: "t".into(),
            split: split.unwrap_or(Split::Dev),
        };
        let mut f = f.clone();
        f.checkpoint_known = true;
        policy::check(Request::Evaluate(&req), &w, &s.config, &f)
    })
    .expect("admission runs")
}

#[test]
fn running_jobs_claim_their_share_so_concurrent_jobs_cannot_all_pass_a_cap() {
    let (_d, s) = study();
    // The study's 90 s compute and the backend's limit: the first job may take all 90 s...
    assert_eq!(admit(&s, "j-0000000000000001", Some(Split::Dev)), Ok(90));
    // ...so a second one admitted while it runs finds nothing left.
    let refused = admit(&s, "j-0000000000000002", Some(Split::Dev)).expect_err("no compute left");
    assert_eq!(refused.rule.as_deref(), Some("budget-compute"));
    // Once the first is recorded (its claim released), the budget is what was really used.
    s.index
        .release_claim("j-0000000000000001")
        .expect("release");
    assert_eq!(admit(&s, "j-0000000000000003", Some(Split::Test)), Ok(90));
    s.index
        .release_claim("j-0000000000000003")
        .expect("release");
    // The per-node test cap (1) holds against a test evaluation still running.
    let _ = admit(&s, "j-0000000000000004", Some(Split::Test)).expect("first test eval");
    s.index
        .conn()
        .execute(
            "UPDATE claims SET compute_s=0 WHERE job='j-0000000000000004'",
            [],
        )
        .expect("let compute pass");
    let refused = admit(&s, "j-0000000000000005", Some(Split::Test)).expect_err("cap");
    assert_eq!(refused.rule.as_deref(), Some("test-evaluation-limit"));
}

/// Waits (a bounded while) until `n` jobs wait in the admission queue.
fn queue_holds(s: &Study, n: usize) -> Vec<String> {
    for _ in 0..500 {
        let q = s.index.queue().expect("queue");
        if q.len() >= n {
            return q.into_iter().map(|(job, ..)| job).collect();
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("{n} jobs never waited in the admission queue");
}

#[test]
fn a_job_that_does_not_fit_waits_its_turn_and_waiting_agents_share_what_is_left() {
    let (d, s) = study_with(&CONFIG.replace("queue_wait_seconds = 0", "queue_wait_seconds = 60"));
    // Alone, agent a may claim the study's whole 90 s.
    assert_eq!(admit_as(&s, "a", "j-00000000000000a1", None), Ok(90));
    std::thread::scope(|sc| {
        // b's job does not fit in what a's claim leaves: it waits instead of being refused.
        let b = sc.spawn(|| {
            let s = Study::open(d.path()).expect("open");
            admit_as(&s, "b", "j-00000000000000b1", None)
        });
        assert_eq!(queue_holds(&s, 1), ["j-00000000000000b1"]);
        // a cancels and resubmits: its new job waits behind b's.
        let a2 = sc.spawn(|| {
            let s = Study::open(d.path()).expect("open");
            admit_as(&s, "a", "j-00000000000000a2", None)
        });
        assert_eq!(
            queue_holds(&s, 2),
            ["j-00000000000000b1", "j-00000000000000a2"]
        );
        s.index.release_claim("j-00000000000000a1").expect("cancel");
        // b goes first, with an equal share of the 90 s (two agents want it), then a.
        assert_eq!(b.join().expect("b"), Ok(45));
        assert_eq!(a2.join().expect("a"), Ok(45));
    });
    assert!(
        s.index.queue().expect("queue").is_empty(),
        "both left the queue"
    );
}

#[test]
fn a_queued_job_that_waits_too_long_is_refused_saying_what_is_claimed_and_what_is_used() {
    let (_d, s) = study_with(&CONFIG.replace("queue_wait_seconds = 0", "queue_wait_seconds = 1"));
    assert_eq!(admit_as(&s, "a", "j-00000000000000a1", None), Ok(90));
    let refused = admit_as(&s, "b", "j-00000000000000b1", None).expect_err("no room");
    assert_eq!(refused.rule.as_deref(), Some("budget-compute"));
    let why = refused.reason.unwrap_or_default();
    assert!(
        why.contains("waited 1 s in the admission queue")
            && why.contains("running jobs claim 90 s")
            && why.contains("finished jobs used 0 s"),
        "{why}"
    );
    assert!(
        s.index.queue().expect("queue").is_empty(),
        "it left the queue"
    );
}

#[test]
fn a_job_cancelled_while_it_waits_never_runs_and_only_its_agent_may_cancel_it() {
    let (d, s) = study_with(&CONFIG.replace("queue_wait_seconds = 0", "queue_wait_seconds = 60"));
    assert_eq!(admit_as(&s, "a", "j-00000000000000a1", None), Ok(90));
    std::thread::scope(|sc| {
        let b = sc.spawn(|| {
            let s = Study::open(d.path()).expect("open");
            s.admit(
                &worker("b"),
                ROOT_NODE,
                "j-00000000000000b1",
                None,
                Facts::default(),
                |_| Decision::accept(),
            )
        });
        queue_holds(&s, 1);
        let other = s
            .call(
                &worker("a"),
                "cancel_job",
                json!({"job": "j-00000000000000b1"}),
            )
            .expect_err("not a's job");
        assert!(other.message.contains("job-owner"), "{}", other.message);
        s.call(
            &worker("b"),
            "cancel_job",
            json!({"job": "j-00000000000000b1"}),
        )
        .expect("b cancels its own queued job");
        let e = b.join().expect("b").expect_err("cancelled");
        assert!(
            e.message.contains("cancelled by b while it waited"),
            "{}",
            e.message
        );
    });
}

#[test]
fn cancelling_an_unknown_job_as_an_observer_is_a_recorded_role_refusal() {
    let (_d, s) = study();
    let observer = Caller::new("olga", Role::Observer);
    let e = s
        .call(
            &observer,
            "cancel_job",
            json!({"job": "j-0123456789abcdef"}),
        )
        .expect_err("refused");
    assert_eq!(e.kind, ErrorKind::Rejected);
    assert_eq!(e.rule.as_deref(), Some("role"));
    let h = history(&s, ROOT_NODE);
    assert_eq!(h.last().map(|a| a.action), Some(ActionName::CancelJob));
    // A worker asking about a job that does not exist is told so, and nothing is recorded.
    let e = s
        .call(
            &worker("w"),
            "cancel_job",
            json!({"job": "j-0123456789abcdef"}),
        )
        .expect_err("no such job");
    assert_eq!(e.kind, ErrorKind::NotFound, "{}", e.message);
    assert_eq!(history(&s, ROOT_NODE).len(), h.len());
}

/// Two orchestrators on one study would each count the experiments left and spend them again:
/// the campaign is held by one at a time (a hold in the index, across processes), the second is
/// refused by `campaign-running` and the refusal recorded; once the first ends, it can start.
#[test]
fn one_orchestrator_at_a_time_holds_a_campaign() {
    let (_d, s) = study();
    let owner = Caller::new("orchestrator", Role::Owner);
    let lease = s.lease_campaign(&owner, &json!({})).expect("first");
    let e = s
        .lease_campaign(&owner, &json!({"strategy": "orchestra"}))
        .err()
        .expect("a second orchestrator is refused");
    assert_eq!(e.rule.as_deref(), Some("campaign-running"), "{}", e.message);
    assert!(e.commit.is_some(), "the refusal is recorded");
    let e = s
        .lease_campaign(&worker("w"), &json!({}))
        .err()
        .expect("only the owner");
    assert_eq!(e.rule.as_deref(), Some("role"));
    drop(lease);
    let _again = s.lease_campaign(&owner, &json!({})).expect("free again");
}

#[test]
fn a_campaign_start_is_recorded_and_refused_once_a_budget_is_spent() {
    let (_d, s) = study();
    let owner = Caller::new("orchestrator", Role::Owner);
    s.start_campaign(&owner, json!({"strategy": "orchestra"}))
        .expect("accepted");
    let e = s
        .start_campaign(&worker("w"), json!({}))
        .expect_err("only the owner");
    assert_eq!(e.rule.as_deref(), Some("role"));
    // Spend the node budget (3 nodes), then the start is refused by its rule.
    for _ in 0..2 {
        s.call(&owner, "branch", json!({"parents": ["n0"], "title": "t"}))
            .expect("branch");
    }
    let e = s
        .start_campaign(&owner, json!({}))
        .expect_err("no nodes left");
    assert_eq!(e.rule.as_deref(), Some("budget-nodes"), "{}", e.message);
    let h: Vec<_> = history(&s, ROOT_NODE)
        .into_iter()
        .filter(|a| a.action == ActionName::Campaign)
        .collect();
    assert_eq!(h.len(), 3);
    assert!(h[0].decision.accepted());
    assert_eq!(h[0].request, json!({"strategy": "orchestra"}));
    assert!(!h[2].decision.accepted());
}

#[test]
fn typed_calls_are_validated_like_json_calls() {
    let (_d, s) = study();
    let e = s
        .branch(
            &worker("w"),
            BranchRequest {
                parents: vec!["not-a-node".into()],
                title: "t".into(),
                hypothesis: String::new(),
            },
        )
        .expect_err("bad id");
    assert!(e.message.contains("parents.0"), "{}", e.message);
}

#[test]
fn a_job_whose_nix_environment_cannot_be_pinned_is_refused_and_never_runs() {
    // Without Nix here, `nix` cannot be run; with it, the flake does not parse: either way Nix
    // gives no narHash, and what it said is the refusal's reason.
    let config = format!("{CONFIG}[environment]\nkind = \"nix\"\nflake = \"env\"\n");
    let (_d, s) = study_with(&config);
    std::fs::create_dir_all(s.root().join("env")).expect("env dir");
    std::fs::write(
        s.root().join("env/flake.nix"),
        "{ outputs = this is not nix; }",
    )
    .expect("flake");
    let w = worker("w");
    s.call(&w, "register_dataset", json!({"node": "n0", "name": "d", "source": {"kind": "inline", "rows": [{"prompt": "3+3=", "answer": "6"}]}}))
        .expect("register");
    let e = s
        .call(&w, "run_sft", json!({"node": "n0", "base": "base", "datasets": ["d"], "learning_rate": 0.001, "steps": 2, "batch_size": 1}))
        .expect_err("refused");
    assert_eq!(e.kind, ErrorKind::Rejected, "{}", e.message);
    assert_eq!(e.rule.as_deref(), Some("environment-pinned"));
    assert!(e.message.contains("nix flake metadata"), "{}", e.message);
    let last = history(&s, ROOT_NODE).pop().expect("recorded");
    assert_eq!(last.action, ActionName::RunSft);
    assert!(!last.decision.accepted());
    assert!(last.job.is_none(), "no job is recorded");
    let reason = last.decision.reason.unwrap_or_default();
    assert!(
        reason.contains("error") || reason.contains("cannot run"),
        "{reason}"
    );
    let jobs = s.root().join(STATE_DIR).join("jobs");
    let ran: Vec<_> = std::fs::read_dir(&jobs)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name())
                .filter(|n| n != "slots")
                .collect()
        })
        .unwrap_or_default();
    assert!(ran.is_empty(), "no job directory: {ran:?}");
}

#[test]
fn audit_and_fsck_report_a_recorded_job_whose_environment_is_not_pinned() {
    let (_d, s) = study();
    let w = worker("w");
    s.call(&w, "register_dataset", json!({"node": "n0", "name": "d", "source": {"kind": "inline", "rows": [{"prompt": "3+3=", "answer": "6"}]}}))
        .expect("register");
    // A job of this rsim: a host fingerprint (the trainer `true` writes no checkpoint, so it failed).
    let r = s
        .call(&w, "run_sft", json!({"node": "n0", "base": "base", "datasets": ["d"], "learning_rate": 0.001, "steps": 2, "batch_size": 1}))
        .expect("recorded");
    assert!(
        crate::jobs::is_pinned(r["job"]["env"].as_str().unwrap_or_default()),
        "{r}"
    );
    let clean = audit::audit(&s).expect("audit");
    assert_eq!(clean.got_through, 0);
    assert!(fsck::fsck(&s).expect("fsck").problems.is_empty());
    // A job as an older rsim recorded it when `nix flake metadata` failed.
    let job = crate::jobs::lost_record(
        "j-0000000000000001",
        JobKind::Sft,
        &now_rfc3339(),
        1.0,
        &["nix".to_string(), "develop".to_string()],
        "nix:path:/study/env#unresolved",
    );
    let request = json!({"node": "n0", "base": "base", "datasets": ["d"], "learning_rate": 0.001, "steps": 2, "batch_size": 1});
    s.commit_action(ROOT_NODE, &w, ActionName::RunSft, request, |_| {
        let mut p = Prepared::accepted("old job".into(), json!({"job": job}));
        p.attach_job(&job);
        Ok(p)
    })
    .expect("commit");
    let a = audit::audit(&s).expect("audit");
    let check = a
        .checks
        .iter()
        .find(|c| c.name == "pinned-environment")
        .expect("check");
    assert_eq!(check.checked, 2);
    assert_eq!(check.violations.len(), 1, "{:?}", check.violations);
    assert!(
        check.violations[0].contains("#unresolved"),
        "{:?}",
        check.violations
    );
    assert_eq!(a.got_through, 1);
    let f = fsck::fsck(&s).expect("fsck");
    assert_eq!(f.problems.len(), 1, "{:?}", f.problems);
    assert!(
        f.problems[0].contains("not pinned")
            || f.problems[0].contains("without a pinned environment"),
        "{:?}",
        f.problems
    );
}

#[test]
fn get_node_answers_within_its_bound_the_newest_actions_and_the_totals() {
    let (_d, s) = study_with(&CONFIG.replace(
        "[policy]\n",
        "[policy]\nmax_writes_per_agent_per_minute = 0\n",
    ));
    let observer = Caller::new("olga", Role::Observer);
    // 300 distinct refusals, each recorded on the root node.
    for i in 0..300u64 {
        let _ = s.call(
            &observer,
            "cancel_job",
            json!({"job": format!("j-{i:016x}")}),
        );
    }
    let whole = s
        .call(
            &observer,
            "get_node",
            json!({"node": ROOT_NODE, "max_tokens": 10_000_000}),
        )
        .expect("whole");
    let total = whole["actions"].as_array().expect("actions").len();
    assert!(total > 300, "{total}");
    assert_eq!(whole["actions_total"], total);
    assert!(whole.get("more").is_none());
    let cut = s
        .call(
            &observer,
            "get_node",
            json!({"node": ROOT_NODE, "max_tokens": 2000}),
        )
        .expect("cut");
    let bytes = serde_json::to_vec(&cut).expect("json").len();
    assert!(bytes <= 2000 * 4, "{bytes} bytes");
    assert_eq!(cut["tokens"].as_u64(), Some(bytes.div_ceil(4) as u64));
    let actions = cut["actions"].as_array().expect("actions");
    assert!(
        !actions.is_empty() && actions.len() < total,
        "{}",
        actions.len()
    );
    assert_eq!(cut["actions_total"], total);
    // The newest ones, in order.
    assert_eq!(
        actions.last(),
        whole["actions"].as_array().and_then(|a| a.last())
    );
    assert!(
        cut["more"].as_str().is_some_and(|m| m.contains("log")),
        "{cut}"
    );
    // The default bound holds too.
    let default = s
        .call(&observer, "get_node", json!({"node": ROOT_NODE}))
        .expect("default");
    assert!(serde_json::to_vec(&default).expect("json").len() <= 8000 * 4);
}

#[test]
fn a_quick_actions_hold_ends_with_its_record_and_with_a_failure() {
    let (_d, s) = study();
    let holds = |s: &Study| -> i64 {
        s.index
            .conn()
            .query_row("SELECT COUNT(*) FROM holds", [], |r| r.get(0))
            .expect("holds")
    };
    let w = worker("w");
    s.call(&w, "branch", json!({"parents": ["n0"], "title": "t"}))
        .expect("branch");
    assert_eq!(holds(&s), 0, "released with the branch's record");
    s.call(
        &w,
        "register_dataset",
        json!({"node": "n1", "name": "d", "source": {"kind": "inline", "rows": [{"prompt": "say ok", "answer": "ok"}]}}),
    )
    .expect("register");
    assert_eq!(holds(&s), 0, "released with the registration's record");
    // The same name again: refused (recorded); nothing stays held.
    let _ = s.call(
        &w,
        "register_dataset",
        json!({"node": "n1", "name": "d", "source": {"kind": "inline", "rows": [{"prompt": "say no", "answer": "no"}]}}),
    );
    assert_eq!(holds(&s), 0);
    // Up to the node budget (3), and one more is refused: the holds counted right.
    s.call(&w, "branch", json!({"parents": ["n0"], "title": "t2"}))
        .expect("branch");
    let e = s
        .call(&w, "branch", json!({"parents": ["n0"], "title": "t3"}))
        .expect_err("node budget");
    assert!(e.message.contains("budget-nodes"), "{}", e.message);
    assert_eq!(holds(&s), 0);
}

#[test]
fn an_agent_that_floods_the_queue_waits_with_one_job_and_the_rest_are_refused() {
    let (d, s) = study_with(&CONFIG.replace("queue_wait_seconds = 0", "queue_wait_seconds = 60"));
    // Another agent's job claims the whole budget.
    assert_eq!(admit_as(&s, "a", "j-00000000000000a1", None), Ok(90));
    std::thread::scope(|sc| {
        let first = sc.spawn(|| {
            let s = Study::open(d.path()).expect("open");
            admit_as(&s, "looper", "j-00000000000000f1", None)
        });
        queue_holds(&s, 1);
        // Its next jobs do not queue behind (and ahead of everyone after) the first.
        for k in 2..6 {
            let refused = admit_as(&s, "looper", &format!("j-00000000000000f{k}"), None)
                .expect_err("one waiting job per agent");
            assert!(
                refused
                    .reason
                    .as_deref()
                    .unwrap_or("")
                    .contains("already has a job waiting"),
                "{refused:?}"
            );
        }
        assert_eq!(s.index.queue().expect("queue").len(), 1);
        // Another agent still takes its place in the queue, right behind.
        let other = sc.spawn(|| {
            let s = Study::open(d.path()).expect("open");
            admit_as(&s, "honest", "j-00000000000000b1", None)
        });
        queue_holds(&s, 2);
        s.index
            .release_claim("j-00000000000000a1")
            .expect("release");
        assert!(first.join().expect("looper").is_ok());
        assert!(other.join().expect("honest").is_ok());
    });
}

/// The dev twin's scores are hidden from agents (it is the dev tripwire): only the owner reads
/// a checkpoint's score on it, and a task without a twin has none to give.
#[test]
fn only_the_owner_reads_a_checkpoints_dev_twin_score() {
    let (_d, s) = study();
    for role in [Role::Worker, Role::Reviewer, Role::Observer] {
        let e = s
            .dev_twin_evidence(&Caller::new("a", role), "arith", "base", 0.5)
            .expect_err("the owner's");
        assert_eq!(e.kind, ErrorKind::Forbidden, "{}", e.message);
    }
    let task = s.config.tasks.keys().next().expect("a task").clone();
    assert_eq!(
        s.dev_twin_evidence(&Caller::owner(), &task, "base", 0.5)
            .expect("owner"),
        None
    );
}

/// Two studies given one generator secret draw the same rows for the same generator request
/// (what `bench-strategies` pairs strategies on); a study that holds another secret keeps it.
#[test]
fn studies_sharing_a_generator_secret_draw_the_same_data() {
    let secret = "0123456789abcdef0123456789abcdef";
    let sha = |s: &Study| {
        let r = s
            .call(
                &Caller::owner(),
                "register_dataset",
                json!({"node": "n0", "name": "plain", "source": {"kind": "arith", "op": "add",
                       "digits": 2, "format": "plain", "n": 500, "seed": 3}}),
            )
            .expect("register");
        r["sha256"].as_str().expect("sha256").to_string()
    };
    let (_a, a) = study();
    let (_b, b) = study();
    let (_c, c) = study();
    for s in [&a, &b] {
        crate::os::owner::share_generator_secret(&s.root, secret).expect("share");
        // Again with the same secret: nothing changes.
        crate::os::owner::share_generator_secret(&s.root, secret).expect("idempotent");
    }
    let (sa, sb, sc) = (sha(&a), sha(&b), sha(&c));
    assert_eq!(sa, sb, "one secret, one request: the same rows");
    assert_ne!(sa, sc, "a study's own secret draws other rows");
    let e = crate::os::owner::share_generator_secret(&c.root, secret)
        .expect_err("c drew data with its own secret");
    assert!(e.message.contains("of its own"), "{}", e.message);
    for bad in ["", "xyz", "0123456789abcdef0123456789abcdeg"] {
        assert!(crate::os::owner::share_generator_secret(&a.root, bad).is_err());
    }
}

#[test]
fn dataset_budgets_count_what_other_handles_register_while_totals_are_kept() {
    let (d, a) = study_with(&CONFIG.replace("max_nodes = 3", "max_nodes = 3\ndataset_rows = 3"));
    let b = Study::open(d.path()).expect("second handle");
    let w = worker("w");
    let register = |s: &Study, name: &str| {
        s.call(
            &w,
            "register_dataset",
            json!({"node": "n0", "name": name, "source": {"kind": "inline", "rows": [{"prompt": format!("say {name}"), "answer": "ok"}]}}),
        )
    };
    let agrees = |s: &Study| {
        let kept = s.registered_totals(&s.index, "w").expect("totals");
        let fresh = s.count_registered(&s.index).expect("count");
        assert_eq!(kept[0], fresh.rows(), "kept rows = a fresh count");
        assert_eq!(kept[1], fresh.bytes(), "kept bytes = a fresh count");
        kept
    };
    register(&a, "d1").expect("d1");
    assert_eq!(agrees(&a)[0], 1);
    // Registered through another handle: the first handle's kept totals take it in.
    register(&b, "d2").expect("d2");
    let t = agrees(&a);
    assert_eq!((t[0], t[2]), (2, 2));
    assert!(t[1] > 0 && t[1] == t[3], "stored bytes counted: {t:?}");
    register(&a, "d3").expect("d3: the third row fits");
    let e = register(&a, "d4").expect_err("the budget counts the other handle's row");
    assert!(
        e.message.contains("budget-dataset-storage"),
        "{}",
        e.message
    );
    let e = register(&b, "d5").expect_err("and so does the other handle");
    assert!(
        e.message.contains("budget-dataset-storage"),
        "{}",
        e.message
    );
    assert_eq!(agrees(&b)[0], 3);
}

#[test]
fn a_study_keeps_no_reflogs() {
    let (d, s) = study();
    s.call(
        &worker("w"),
        "branch",
        json!({"parents": ["n0"], "title": "t"}),
    )
    .expect("branch");
    let cfg = s.record().repo().config().expect("config");
    assert_eq!(cfg.get_bool("core.logAllRefUpdates").ok(), Some(false));
    let logs = d.path().join(".git/logs/refs/heads/rsim");
    assert!(
        !logs.exists(),
        "no reflog for node branches: {}",
        logs.display()
    );
}

#[test]
fn a_protected_set_changed_after_the_handle_prepared_it_is_read_again() {
    let (d, s) = study();
    let w = worker("w");
    let register = |name: &str| {
        s.call(
            &w,
            "register_dataset",
            json!({"node": "n0", "name": name, "source": {"kind": "inline", "rows": [{"prompt": "7+8=", "answer": "x"}]}}),
        )
    };
    register("before").expect("not protected yet");
    // The owner protects that very item, in a file of the same size (its change time moves).
    let test = d.path().join("eval/test.jsonl");
    let old = std::fs::read(&test).expect("read");
    let new = b"{\"prompt\":\"7+8=\",\"answer\":\"x\"}\n".to_vec();
    assert_eq!(
        old.len(),
        new.len(),
        "same size: only the bytes and times differ"
    );
    std::fs::write(&test, new).expect("rewrite");
    let e = register("after").expect_err("the item is protected now");
    assert!(e.message.contains("contamination"), "{}", e.message);
}

/// What an agent sends is never sent back whole: an unexpected property named by 100,000
/// characters and an escape sequence is refused with a short, clean message; an offset past
/// any position is refused by name instead of overflowing the next position.
#[test]
fn refusals_quote_crafted_keys_short_and_clean_and_offsets_stay_in_range() {
    let (_d, s) = study();
    let key = format!("\u{1b}]0;pwned\u{7}{}", "k".repeat(100_000));
    let e = s
        .call(
            &worker("w"),
            "list_nodes",
            json!({ key: 1, "also\u{1b}[2J": 2 }),
        )
        .expect_err("unknown keys");
    assert!(e.message.len() < 2_000, "{} bytes", e.message.len());
    assert!(!e.message.chars().any(char::is_control), "{:?}", e.message);
    assert!(e.message.contains("list_nodes"), "{}", e.message);
    // The next try: the key one level down, where the field path and a oneOf's message carry
    // it, and in many keys at once (eight problems are reported at most).
    let mut source = serde_json::Map::new();
    source.insert("kind".into(), json!("arith"));
    for i in 0..40 {
        source.insert(format!("{i}\u{1b}[2J{}", "q".repeat(50_000)), json!(i));
    }
    let e = s
        .call(
            &worker("w"),
            "register_dataset",
            json!({"node": "n0", "name": "x", "source": source}),
        )
        .expect_err("unknown nested keys");
    assert!(e.message.len() < 8_000, "{} bytes", e.message.len());
    assert!(!e.message.chars().any(char::is_control), "{:?}", e.message);
    for offset in [u64::MAX, crate::os::paging::MAX_POSITION + 1] {
        let e = s
            .call(&worker("w"), "list_nodes", json!({ "offset": offset }))
            .expect_err("offset past any position");
        assert!(e.message.contains("offset"), "{}", e.message);
    }
    let last = s
        .call(
            &worker("w"),
            "list_nodes",
            json!({ "offset": crate::os::paging::MAX_POSITION }),
        )
        .expect("the largest position is a position");
    assert_eq!(last["nodes"], json!([]), "{last}");
    assert!(last["next_cursor"].is_null(), "{last}");
}

#[test]
fn readers_of_many_actions_leave_an_inline_datasets_rows_in_the_store() {
    let (_d, s) = study();
    let w = worker("w");
    let rows: Vec<Value> = (0..500)
        .map(|i| json!({"prompt": format!("say ok, line {i}"), "answer": "ok"}))
        .collect();
    let reg = s
        .call(
            &w,
            "register_dataset",
            json!({"node": "n0", "name": "d", "source": {"kind": "inline", "rows": rows}}),
        )
        .expect("register");
    // git keeps the request whole.
    let (_, history) = s.node_history("n0").expect("history");
    let in_git = history
        .iter()
        .find(|a| a.action == ActionName::RegisterDataset)
        .expect("recorded");
    assert_eq!(
        in_git.request["source"]["rows"].as_array().map(Vec::len),
        Some(500)
    );
    // The index's readers get the record less its rows; the rest is as recorded.
    let indexed = s.node_actions("n0").expect("index");
    let a = indexed
        .iter()
        .find(|a| a.action == ActionName::RegisterDataset)
        .expect("indexed");
    assert!(a.request["source"].get("rows").is_none(), "{}", a.request);
    assert_eq!(a.request["source"]["kind"], "inline");
    assert_eq!(a.request["name"], "d");
    assert_eq!(
        a.result.as_ref().map(|r| &r["sha256"]),
        Some(&reg["sha256"])
    );
    // log and get_node still show it, and the audit still finds the rows (in the store).
    let log = s.call(&w, "log", json!({})).expect("log");
    assert!(
        log["actions"]
            .as_array()
            .expect("actions")
            .iter()
            .any(|a| a["action"] == "register_dataset")
    );
    let node = s
        .call(&w, "get_node", json!({"node": "n0"}))
        .expect("get_node");
    assert!(
        node["actions"]
            .as_array()
            .expect("actions")
            .iter()
            .any(|a| a["action"] == "register_dataset")
    );
    let audit = crate::os::audit::audit(&s).expect("audit");
    assert!(
        audit.checks.iter().all(|c| c.violations.is_empty()),
        "{:?}",
        audit
            .checks
            .iter()
            .map(|c| (c.name, c.violations.len()))
            .collect::<Vec<_>>()
    );
}

/// A flood of concurrent callers on one session (a client piping requests without reading the
/// answers) holds at most `MAX_QUICK` studies at once, every caller is served, and a call made
/// from inside a held study does not wait on the bound it is part of.
#[test]
fn a_session_serves_a_flood_of_callers_a_bounded_number_at_a_time() {
    use crate::os::session::{MAX_QUICK, Session};
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let (d, _s) = study();
    let session = std::sync::Arc::new(Session::open(d.path()).expect("session"));
    let (inside, most, served) = (
        std::sync::Arc::new(AtomicUsize::new(0)),
        std::sync::Arc::new(AtomicUsize::new(0)),
        std::sync::Arc::new(AtomicUsize::new(0)),
    );
    let threads: Vec<_> = (0..MAX_QUICK * 4)
        .map(|_| {
            let (session, inside, most, served) = (
                session.clone(),
                inside.clone(),
                most.clone(),
                served.clone(),
            );
            std::thread::spawn(move || {
                session
                    .with(|st| {
                        let now = inside.fetch_add(1, SeqCst) + 1;
                        most.fetch_max(now, SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(30));
                        // nested: served at once, though every place may be taken
                        let nested = session.with(|st2| Ok(st2.root().to_path_buf()))?;
                        assert_eq!(nested, st.root());
                        inside.fetch_sub(1, SeqCst);
                        Ok(())
                    })
                    .expect("served");
                served.fetch_add(1, SeqCst);
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    assert_eq!(served.load(SeqCst), MAX_QUICK * 4);
    let most = most.load(SeqCst);
    assert!(most <= MAX_QUICK, "{most} callers held a study at once");
    assert!(most > 1, "callers were served one at a time");
}
