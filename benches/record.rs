//! `cargo bench --bench record`: what recording one accepted action costs, against the floor of
//! the engines under it, measured side by side in one run.
//!
//! - **rsim**: RSIM_RECORD_ACTIONS (300) accepted actions through `Study::call` in-process, as
//!   the owner, on a fresh tiny-arith-ngram study: `branch`, `compare`, `register_dataset`
//!   (inline, one row that is no arithmetic item) in turn — validated, policy-checked, signed, verified, indexed.
//! - **floor**: the least a git-backed record with a SQL index can do per action: write one JSON
//!   blob, a tree holding it (and the files before it), one commit on a branch moved with
//!   compare-and-swap (`reference_matching`), no reflog (rsim keeps none either), and one row
//!   inserted in an indexed SQLite table (WAL) — libgit2 and SQLite, nothing else.
//!
//! The two alternate in blocks of 10 actions, RSIM_RECORD_RUNS (3) times, without and then with
//! fsync (libgit2's fsync switch and SQLite's `synchronous = FULL` for the floor;
//! `[record] fsync = true` for rsim). Reported: the median per action of each run and their
//! ratio, and where rsim's time goes (each phase's own time, without the phases inside it,
//! measured with tracing spans at trace level, which cost nothing when no one listens).
//! RSIM_RECORD_FSYNC=off|on runs one of the two only. Targets (issue 35): rsim ≤ 1.0× the floor, ≤ 1.2× with fsync.

use std::path::Path;
use std::time::Instant;

use rsi_master::bench::phases::Phases;
use rsi_master::model::Caller;
use rsi_master::os::Study;
use serde_json::json;

#[path = "support.rs"]
mod support;

const BLOCK: usize = 10;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn study(base: &Path, name: &str, fsync: bool) -> std::path::PathBuf {
    support::example_study(
        base,
        name,
        |c| {
            let c = c.replace("max_nodes = 200", "max_nodes = 100000");
            if fsync {
                format!("{c}\n[record]\nfsync = true\n")
            } else {
                c
            }
        },
        "bench settings",
    )
}

/// rsim's side: one accepted action at a time, as `rsim bench` does.
struct Rsim {
    study: Study,
    last: String,
    i: usize,
}

impl Rsim {
    fn action(&mut self) -> f64 {
        let owner = Caller::owner();
        let i = self.i;
        self.i += 1;
        let t = Instant::now();
        let r = match i % 3 {
            0 => self.study.call(
                &owner,
                "branch",
                json!({"parents": [self.last], "title": format!("direction {i}"), "hypothesis": "bench"}),
            ),
            1 => self.study.call(
                &owner,
                "compare",
                json!({"node": self.last, "nodes": ["n0", self.last], "task": "add2"}),
            ),
            _ => self.study.call(
                &owner,
                "register_dataset",
                json!({"node": self.last, "name": format!("d{i}"), "source": {"kind": "inline", "rows": [{"prompt": format!("bench row {i}: say ok"), "answer": "ok"}]}}),
            ),
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let v = r.unwrap_or_else(|e| panic!("action {i}: {}", e.message));
        if i.is_multiple_of(3) {
            self.last = v["node"].as_str().expect("node").to_string();
        }
        ms
    }
}

/// The floor: a git commit on a branch (compare-and-swap) and one indexed SQLite row.
struct Floor {
    repo: git2::Repository,
    db: rusqlite::Connection,
    tip: git2::Oid,
    i: usize,
}

impl Floor {
    fn new(dir: &Path, fsync: bool) -> Floor {
        std::fs::create_dir_all(dir).expect("dir");
        let repo = git2::Repository::init(dir).expect("git init");
        // No reflog, as rsim's studies keep none: the floor is the least a record can write.
        repo.config()
            .and_then(|mut c| c.set_bool("core.logAllRefUpdates", false))
            .expect("config");
        let db = rusqlite::Connection::open(dir.join("index.sqlite")).expect("sqlite");
        db.execute_batch(&format!(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous={};
             CREATE TABLE actions(node TEXT NOT NULL, seq INTEGER NOT NULL, record TEXT NOT NULL,
               commit_oid TEXT NOT NULL, PRIMARY KEY(node, seq));",
            if fsync { "FULL" } else { "NORMAL" }
        ))
        .expect("schema");
        let sig = git2::Signature::now("floor", "floor@example.invalid").expect("sig");
        let tree = repo
            .find_tree(repo.treebuilder(None).expect("tb").write().expect("tree"))
            .expect("tree");
        let tip = repo
            .commit(Some("refs/heads/n0"), &sig, &sig, "genesis", &tree, &[])
            .expect("genesis");
        drop(tree);
        Floor {
            repo,
            db,
            tip,
            i: 0,
        }
    }

    fn action(&mut self) -> f64 {
        let i = self.i;
        self.i += 1;
        let t = Instant::now();
        let record = json!({"seq": i + 1, "action": "compare", "agent": "owner", "request": {"node": "n0", "nodes": ["n0", "n1"], "task": "add2"}, "decision": "accepted"}).to_string();
        let blob = self.repo.blob(record.as_bytes()).expect("blob");
        let parent = self.repo.find_commit(self.tip).expect("parent");
        let mut tb = self
            .repo
            .treebuilder(Some(&parent.tree().expect("tree")))
            .expect("tb");
        tb.insert(format!("{:06}-compare.json", i + 1), blob, 0o100644)
            .expect("insert");
        let tree = self
            .repo
            .find_tree(tb.write().expect("tree"))
            .expect("tree");
        let sig = git2::Signature::now("owner", "owner@example.invalid").expect("sig");
        let msg = format!("compare\n\nRsim-Node: n0\nRsim-Seq: {}\n", i + 1);
        let oid = self
            .repo
            .commit(None, &sig, &sig, &msg, &tree, &[&parent])
            .expect("commit");
        self.repo
            .reference_matching("refs/heads/n0", oid, true, self.tip, "append")
            .expect("compare-and-swap");
        self.tip = oid;
        self.db
            .execute(
                "INSERT INTO actions(node,seq,record,commit_oid) VALUES('n0',?1,?2,?3)",
                rusqlite::params![i as i64 + 1, record, oid.to_string()],
            )
            .expect("insert");
        t.elapsed().as_secs_f64() * 1e3
    }
}

fn main() {
    let actions: usize = std::env::var("RSIM_RECORD_ACTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let runs: usize = std::env::var("RSIM_RECORD_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let phases = Phases::default();
    tracing::subscriber::set_global_default(phases.subscriber()).expect("subscriber");
    let base = tempfile::tempdir().expect("tempdir");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "machine: {cores} cores; release build; {actions} actions a run, rsim and the floor alternating every {BLOCK}; {runs} run(s)"
    );
    // Without fsync first: libgit2's fsync switch is process-wide and only ever turned on.
    // RSIM_RECORD_FSYNC=off|on runs only one of the two (for profiling one).
    let modes: &[bool] = match std::env::var("RSIM_RECORD_FSYNC").as_deref() {
        Ok("off") => &[false],
        Ok("on") => &[true],
        _ => &[false, true],
    };
    for &fsync in modes {
        let mut ratios = Vec::new();
        let (mut rs, mut fs) = (Vec::new(), Vec::new());
        phases.clear();
        for run in 0..runs {
            let s = study(base.path(), &format!("study-{fsync}-{run}"), fsync);
            let mut rsim = Rsim {
                study: Study::open(&s).expect("open"),
                last: "n0".into(),
                i: 0,
            };
            let mut floor = Floor::new(&base.path().join(format!("floor-{fsync}-{run}")), fsync);
            let (mut r, mut f) = (Vec::new(), Vec::new());
            while r.len() < actions {
                for _ in 0..BLOCK {
                    r.push(rsim.action());
                }
                for _ in 0..BLOCK {
                    f.push(floor.action());
                }
            }
            let (rm, fm) = (median(r), median(f));
            println!(
                "fsync={fsync} run {}: rsim {rm:.3} ms, floor {fm:.3} ms per action ({:.2}x)",
                run + 1,
                rm / fm
            );
            ratios.push(rm / fm);
            rs.push(rm);
            fs.push(fm);
        }
        println!(
            "fsync={fsync}: median rsim {:.3} ms, floor {:.3} ms, ratio {:.2}x (target {})",
            median(rs),
            median(fs),
            median(ratios),
            if fsync { "<= 1.2x" } else { "<= 1.0x" }
        );
        println!("  where rsim's time goes (own time per action, µs; calls per action):");
        for p in phases.per_action(actions * runs) {
            println!(
                "    {:<28} {:>8.1}  {:>5.2}",
                p.name, p.us_per_action, p.calls_per_action
            );
        }
    }
}
