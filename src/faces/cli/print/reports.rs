//! Human output of the study's maintenance and proofs: `init`, `reindex`, `verify`, `key show`,
//! `clone`, `audit`, `storage`, `gc`, `fsck`.

use std::path::Path;

use super::table;
// Problems and refusals quote what a repository holds (ref names, file text, commit messages):
// shown with control and deceptive characters replaced, so none reaches the reader's terminal.
use crate::util::text::display;

/// What `rsim init` did, and where to look next.
pub fn init(rep: &crate::os::genesis::InitReport, dir: &Path) {
    println!("{}", rep.message);
    if let Some(b) = &rep.base_checkpoint {
        println!("study:           {}", rep.root.display());
        println!("base checkpoint: {b}");
        println!("next:            rsim -C {} dag", dir.display());
    }
}

/// Nodes reindexed from git, and the branches refused.
pub fn reindex(nodes: usize, refused: &[String], seconds: f64) {
    println!("reindexed {nodes} nodes from git in {seconds:.2} s");
    for why in refused {
        println!("refused {}", display(why));
    }
}

/// The study's keys, the genesis key, what was proven, and every problem.
pub fn verify(rep: &crate::os::verify::VerifyReport) {
    for k in &rep.keys {
        let when =
            |t: Option<i64>| t.map_or_else(String::new, |t| crate::model::rfc3339_at(t as f64));
        let window = match (k.valid_after, k.valid_before) {
            (None, None) => "in force".to_string(),
            (a, None) => format!("in force since {}", when(a)),
            (None, b) => format!("retired {}", when(b)),
            (a, b) => format!("in force {} to {}", when(a), when(b)),
        };
        println!("key {}  {window}", k.fingerprint);
    }
    if let Some(g) = &rep.genesis_key {
        println!("genesis signed by {g}");
    }
    println!(
        "{} commit(s) proven; {} owner commit(s) on main unsigned (config changes made with git){}",
        rep.verified,
        rep.unsigned_owner_commits,
        if rep.read_only {
            "; this copy is read-only"
        } else {
            ""
        }
    );
    for (i, c) in rep.owner_commits.iter().enumerate() {
        println!("  owner commit (unsigned): {}", display(c));
        for change in rep.owner_changes.get(i).into_iter().flatten() {
            println!("      {}", display(change));
        }
    }
    for p in &rep.problems {
        println!("  - {}", display(p));
    }
    if rep.problems.is_empty() {
        println!("ok: every action of this study is signed by its key");
    }
}

/// `rsim key show`: the keys' fingerprints and whether this copy can sign.
pub fn key_show(rep: &crate::os::verify::VerifyReport, read_only: Option<&str>) {
    for k in &rep.keys {
        println!("{}", k.fingerprint);
    }
    match read_only {
        Some(why) => println!("read-only: {why}"),
        None => println!("this copy holds the study's private key"),
    }
    if !rep.committed {
        println!("the public key is not committed on main yet: run `rsim key publish`");
    }
}

/// What `rsim clone` cloned, how it verified, and how to update it.
pub fn cloned(url: &str, dir: &Path, rep: &crate::os::verify::VerifyReport) {
    println!("cloned {url} into {} ({} nodes)", dir.display(), rep.nodes);
    verify(rep);
    println!(
        "update it with: git -C {} fetch origin '+refs/heads/rsim/*:refs/heads/rsim/*' && git -C {} pull --ff-only",
        dir.display(),
        dir.display()
    );
}

/// Attempts, rejections by rule, agents, the re-checks and their violations.
pub fn audit(rep: &crate::os::audit::AuditReport) {
    println!(
        "attempts {}: {} accepted, {} rejected",
        rep.attempts, rep.accepted, rep.rejected
    );
    let mut t = table(&["rejected by rule", "count"]);
    for (rule, n) in &rep.rejections_by_rule {
        t.add_row(vec![rule.clone(), n.to_string()]);
    }
    println!("{t}");
    let mut t = table(&["agent", "role", "actions", "rejected"]);
    for a in &rep.agents {
        t.add_row(vec![
            a.id.clone(),
            a.role.clone(),
            a.actions.to_string(),
            a.rejected.to_string(),
        ]);
    }
    println!("{t}");
    let mut t = table(&["check", "checked", "violations", "what"]);
    for c in &rep.checks {
        t.add_row(vec![
            c.name.to_string(),
            c.checked.to_string(),
            c.violations.len().to_string(),
            c.what.to_string(),
        ]);
    }
    println!("{t}");
    for c in &rep.checks {
        for v in &c.violations {
            println!("  {}: {}", c.name, display(v));
        }
    }
    println!("got through: {}", rep.got_through);
    if rep.not_in_this_copy > 0 {
        println!(
            "not re-checked here: {} artifact(s) this read-only clone does not hold (the object store stays with the study's owner)",
            rep.not_in_this_copy
        );
    }
}

/// Bytes per study and per agent against the budgets, and what `rsim gc` would remove.
pub fn storage(u: &crate::os::storage::StorageUse) {
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20));
    let mut t = table(&["who", "objects", "job dirs", "record", "total", "budget"]);
    let row = |who: String, b: &crate::os::storage::Bytes, budget: u64| {
        vec![
            who,
            mib(b.objects),
            mib(b.jobs),
            mib(b.record),
            mib(b.total),
            mib(budget),
        ]
    };
    t.add_row(row("study".into(), &u.study, u.budget));
    for (agent, b) in &u.agents {
        t.add_row(row(agent.clone(), b, u.agent_budget));
    }
    println!("{t}");
    println!(
        "unreferenced: {} object(s), {} (rsim gc removes them)",
        u.unreferenced_objects,
        mib(u.unreferenced_bytes)
    );
}

/// What `rsim gc` removed (or, with --dry-run, would remove) and kept.
pub fn gc(rep: &crate::os::storage::GcReport, dry_run: bool, grace: u64) {
    let verb = if dry_run { "would remove" } else { "removed" };
    println!(
        "{verb} {} unreferenced object(s) ({} bytes) and the leftover outputs of {} recorded job(s) ({} bytes); {} unreferenced object(s) younger than {grace} s kept",
        rep.objects, rep.object_bytes, rep.job_dirs, rep.job_bytes, rep.kept_recent
    );
}

/// What `rsim fsck` checked and every problem.
pub fn fsck(rep: &crate::os::fsck::FsckReport) {
    println!(
        "{} nodes, {} actions, {} artifacts checked: {}",
        rep.nodes,
        rep.actions,
        rep.artifacts_checked,
        if rep.problems.is_empty() {
            "ok".to_string()
        } else {
            format!("{} problems", rep.problems.len())
        }
    );
    for p in &rep.problems {
        println!("  - {}", display(p));
    }
    if rep.artifacts_not_here > 0 {
        println!(
            "{} artifact(s) not checked: this read-only clone does not hold them",
            rep.artifacts_not_here
        );
    }
}
