//! `rsim fsck`: verify the record's invariants — every commit is signed by the study's key, every
//! node's commits form a contiguous action sequence, each commit records exactly one action whose
//! file matches its trailers, a node's first commit has its parents' commits as git parents,
//! every referenced artifact is in the object store with the right hash, every recorded job names
//! a pinned environment (and ran sandboxed, where the study requires it), and the index agrees
//! with git.

use std::collections::BTreeSet;

use crate::os::Study;
use crate::record::{ACTIONS_DIR, Trailers};
use crate::util::error::Result;

#[derive(Debug, Default, serde::Serialize)]
pub struct FsckReport {
    pub nodes: usize,
    pub actions: usize,
    pub artifacts_checked: usize,
    /// Artifacts a read-only clone does not hold (the object store is not in git): not checked.
    pub artifacts_not_here: usize,
    /// Every problem found (what `rsim fsck` prints and fails on).
    pub problems: Vec<String>,
    /// How many of them are about the history itself (commits, trailers, nodes, index) rather
    /// than about stored artifacts: the audit counts these as something that got through.
    pub history_problems: usize,
}

pub fn fsck(study: &Study) -> Result<FsckReport> {
    let mut rep = FsckReport::default();
    let record = study.record();
    let repo = record.repo();
    let mut artifacts = BTreeSet::new();
    let mut unpinned = Vec::new();
    let sandbox_required = study.config().policy.sandbox == crate::config::SandboxMode::Required;
    let (tips, strays) = record.node_refs()?;
    rep.nodes = tips.len();
    rep.problems.extend(strays);
    rep.problems.extend(missing_node_numbers(&tips));
    // Node commits are checked as their history is read. `main` is the owner's (they commit
    // config changes with plain git), but its genesis commit is the study's.
    if record.key_fingerprint().is_none() {
        rep.problems.push(
            "the study has no signing key (made before rsim signed its record): no commit can be proven to be this study's".into(),
        );
    } else if let Ok(main) = record.main_tip() {
        // main's commits are sized before libgit2's walk parses them whole.
        crate::record::check_commit_sizes(repo, &[main], false)?;
        let mut walk = repo.revwalk()?;
        walk.push(main)?;
        if let Some(genesis) = walk.filter_map(|o| o.ok()).last()
            && let Err(why) = record.verify_commit(genesis)
        {
            rep.problems.push(format!("main (genesis): {why}"));
        }
    }
    for (id, tip) in &tips {
        // One node's unreadable tip is that node's problem, not the end of the check.
        let snap = match record.snapshot(*tip) {
            Ok(s) => s,
            Err(e) => {
                rep.problems.push(format!("{id}: {}", e.message));
                continue;
            }
        };
        if snap.meta.id != *id {
            rep.problems
                .push(format!("{id}: node.toml names {}", snap.meta.id));
        }
        let actions = match record.actions_since(id, *tip, 0) {
            Ok(a) => a,
            Err(e) => {
                rep.problems.push(format!("{id}: {}", e.message));
                continue;
            }
        };
        rep.actions += actions.len();
        if actions.len() as u32 != snap.action_count {
            rep.problems.push(format!(
                "{id}: {} commits record actions but the tree holds {} action files",
                actions.len(),
                snap.action_count
            ));
        }
        for (i, a) in actions.iter().enumerate() {
            if a.record.seq != i as u32 + 1 {
                rep.problems.push(format!(
                    "{id}: action {} is at position {}",
                    a.record.seq,
                    i + 1
                ));
            }
            let commit = repo.find_commit(a.commit)?;
            let t = Trailers::parse(commit.message_raw().unwrap_or(""));
            // The trailers rsim writes from the action file, read back as the commit's are.
            let want = Trailers::parse(&crate::record::commit_message(&a.record, "", &[]));
            let differ: Vec<&str> = [
                ("node", t.node == want.node),
                ("seq", t.seq == want.seq),
                ("decision", t.decision == want.decision),
                ("action", t.action == want.action),
                ("agent", t.agent == want.agent),
                ("role", t.role == want.role),
                ("rule", t.rule == want.rule),
                ("job", t.job == want.job),
                ("artifacts", t.artifacts == want.artifacts),
                ("metrics", t.metrics == want.metrics),
            ]
            .into_iter()
            .filter(|(_, same)| !same)
            .map(|(what, _)| what)
            .collect();
            if !differ.is_empty() {
                rep.problems.push(format!(
                    "{id}#{}: the commit's trailers ({}) disagree with the action file",
                    a.record.seq,
                    differ.join(", ")
                ));
            }
            // Exactly one new action file per commit.
            let parent_tree = if i == 0 {
                None
            } else {
                Some(commit.parent(0)?.tree()?)
            };
            let tree = commit.tree()?;
            let count = |t: &git2::Tree<'_>| -> Result<usize> {
                Ok(match t.get_name(ACTIONS_DIR) {
                    Some(e) => repo.find_tree(e.id())?.len(),
                    None => 0,
                })
            };
            let before = match &parent_tree {
                Some(pt) => count(pt)?,
                None => 0,
            };
            if count(&tree)? != before + 1 {
                rep.problems.push(format!(
                    "{id}#{}: commit {} does not add exactly one action",
                    a.record.seq, a.commit
                ));
            }
            // ...and leaves every earlier action file as it was: an action is recorded once, by
            // the commit that adds it (a later commit that edits an earlier file would show one
            // reader the old action and a fresh clone the new).
            if let Some(pt) = &parent_tree
                && let (Some(before), Some(after)) =
                    (pt.get_name(ACTIONS_DIR), tree.get_name(ACTIONS_DIR))
                && before.id() != after.id()
            {
                let after = repo.find_tree(after.id())?;
                for e in repo.find_tree(before.id())?.iter() {
                    let name = e.name_bytes();
                    if after.get_name_bytes(name).map(|x| x.id()) != Some(e.id()) {
                        rep.problems.push(format!(
                            "{id}#{}: commit {} changes or removes the earlier action file {}",
                            a.record.seq,
                            a.commit,
                            crate::util::text::sanitize_line(&String::from_utf8_lossy(name))
                        ));
                    }
                }
            }
            if i == 0 {
                let want = snap
                    .meta
                    .parents
                    .len()
                    .max(usize::from(*id == crate::os::ROOT_NODE));
                if commit.parent_count() != want {
                    rep.problems.push(format!(
                        "{id}: first commit has {} git parents, node.toml lists {}",
                        commit.parent_count(),
                        snap.meta.parents.len()
                    ));
                }
                // The node grew out of its parents: each git parent is a commit of that parent
                // node's own history (the root grows out of main).
                for (k, pid) in snap.meta.parents.iter().enumerate() {
                    let Ok(pc) = commit.parent(k) else { continue };
                    let on_parent = Trailers::parse(pc.message_raw().unwrap_or(""))
                        .node
                        .as_deref()
                        == Some(pid.as_str());
                    let parent_tip = tips.iter().find(|(n, _)| n == pid).map(|(_, t)| *t);
                    let in_history = parent_tip.is_some_and(|pt| {
                        pt == pc.id() || repo.graph_descendant_of(pt, pc.id()).unwrap_or(false)
                    });
                    if !on_parent || !in_history {
                        rep.problems.push(format!(
                            "{id}: does not descend from its parent {pid} (git parent {} is not a commit of {pid}'s history)",
                            pc.id()
                        ));
                    }
                }
                if *id == crate::os::ROOT_NODE
                    && let (Ok(pc), Ok(main)) = (commit.parent(0), record.main_tip())
                    && pc.id() != main
                    && !repo.graph_descendant_of(main, pc.id()).unwrap_or(false)
                {
                    rep.problems.push(format!(
                        "{id}: does not grow out of main (git parent {} is not in main's history)",
                        pc.id()
                    ));
                }
            }
            // Counted by the audit's own `pinned-environment` check, so kept apart from the
            // history problems.
            if let Some(job) = &a.record.job
                && !crate::jobs::is_pinned(&job.env)
            {
                unpinned.push(format!(
                    "{id}#{}: job {} is recorded without a pinned environment: {:?}",
                    a.record.seq, job.id, job.env
                ));
            }
            // Likewise counted by the audit's `sandbox` check, where the study requires one.
            if let Some(job) = &a.record.job
                && sandbox_required
                && let Some(why) = crate::jobs::sandbox::ran_unconfined(job)
            {
                unpinned.push(format!(
                    "{id}#{}: job {} ran without the sandbox the study requires: {why}",
                    a.record.seq, job.id
                ));
            }
            if a.record.decision.accepted() {
                for art in &a.record.artifacts {
                    artifacts.insert(art.sha256.clone());
                }
            }
        }
        match study.index().node(id)? {
            Some(row) if row.tip == tip.to_string() => {}
            Some(_) => rep.problems.push(format!(
                "{id}: the index is behind git (run `rsim reindex`)"
            )),
            None => rep
                .problems
                .push(format!("{id}: missing from the index (run `rsim reindex`)")),
        }
    }
    if study.index().node_count()? as usize != tips.len() {
        rep.problems
            .push("the index lists nodes that git does not have (run `rsim reindex`)".into());
    }
    rep.history_problems = rep.problems.len();
    rep.problems.append(&mut unpinned);
    for sha in &artifacts {
        if study.read_only().is_some() && !study.store().contains(sha) {
            rep.artifacts_not_here += 1;
            continue;
        }
        rep.artifacts_checked += 1;
        if let Err(e) = study.store().get(sha) {
            rep.problems.push(format!("artifact {sha}: {}", e.message));
        } else if let Ok(m) = study.store().manifest(sha) {
            for (name, f) in &m.files {
                if let Err(e) = study.store().get(f) {
                    rep.problems
                        .push(format!("artifact {sha} file {name}: {}", e.message));
                }
            }
        }
    }
    Ok(rep)
}

/// Node numbers are given out in order, each once: a number below the highest with no branch is a
/// node deleted from this copy (or never fetched). Names the first few and counts them all,
/// without walking the numbers one by one (a crafted `n999999999` costs nothing). What this cannot
/// see: the newest node deleted, or a leaf node's branch moved back (README, "What a copy proves").
fn missing_node_numbers(tips: &[(String, git2::Oid)]) -> Option<String> {
    let mut nums: Vec<i64> = tips
        .iter()
        .map(|(id, _)| crate::model::node_num(id))
        .collect();
    nums.sort_unstable();
    nums.dedup();
    let (mut missing, mut shown, mut next) = (0i64, Vec::new(), 0i64);
    for n in nums {
        if n > next {
            missing += n - next;
            shown.extend(
                (next..n)
                    .take(8 - shown.len().min(8))
                    .map(|k| format!("n{k}")),
            );
        }
        next = n + 1;
    }
    (missing > 0).then(|| {
        format!(
            "{missing} node number(s) below the highest have no branch in this copy ({}{}): \
             deleted, or not fetched (`git fetch origin '+refs/heads/rsim/*:refs/heads/rsim/*'`)",
            shown.join(", "),
            if missing > shown.len() as i64 {
                ", …"
            } else {
                ""
            }
        )
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn missing_node_numbers_are_named_and_counted_without_walking_them() {
        let oid = git2::Oid::ZERO_SHA1;
        let tips = |ids: &[&str]| -> Vec<(String, git2::Oid)> {
            ids.iter().map(|i| (i.to_string(), oid)).collect()
        };
        assert_eq!(
            super::missing_node_numbers(&tips(&["n0", "n2", "n1"])),
            None
        );
        let m = super::missing_node_numbers(&tips(&["n0", "n3", "n5"])).expect("gaps");
        assert!(
            m.starts_with("3 node number(s)") && m.contains("(n1, n2, n4)"),
            "{m}"
        );
        let m = super::missing_node_numbers(&tips(&["n0", "n999999999"])).expect("gap");
        assert!(
            m.starts_with("999999998 node number(s)") && m.contains("n8, …"),
            "{m}"
        );
    }
}
