//! `rsim verify`: prove every commit of the study with the public keys committed on `main` — in
//! any clone, with no secret. Node commits (every action) must be signed by the study's key in
//! force when they were made; on `main`, genesis and each change of the keys must be too, while
//! the owner's own config commits (made with plain git) are counted as unsigned, not proven.
//! The first commit that does not verify (oldest first) is named.

use std::collections::HashSet;

use git2::{Oid, Sort};

use crate::os::Study;
use crate::record::signing::{SIGNERS_FILE, Signer};
use crate::util::error::Result;

#[derive(Debug, Default, serde::Serialize)]
pub struct VerifyReport {
    /// The study's keys, oldest first: fingerprint and the window each was in force.
    pub keys: Vec<KeyInfo>,
    /// The key that signed genesis: the study's identity (compare it with the one its owner
    /// published; `--key` does).
    pub genesis_key: Option<String>,
    /// Commits proven (signed by the study's key in force at the time).
    pub verified: usize,
    /// Commits on `main` the owner made with plain git (config changes): not signed, not proven.
    pub unsigned_owner_commits: usize,
    /// Those commits, oldest first (id and subject): what a reader takes on the owner's word.
    pub owner_commits: Vec<String>,
    /// What each of them changed, in the same order: each key of `rsim.toml` with its value
    /// before and after, and each other file or folder of `main` added, removed or changed.
    pub owner_changes: Vec<Vec<String>>,
    /// Every commit that does not verify, oldest first, and other problems.
    pub problems: Vec<String>,
    /// The oldest commit that does not verify.
    pub first_bad: Option<String>,
    /// Whether the history holds another study's beginning: a second first commit, or a signed
    /// commit where `main` holds no key. A copy of it is not kept (`clone`).
    pub foreign_history: bool,
    /// Whether this copy can write (it holds the study's private key).
    pub read_only: bool,
    /// The key in force now.
    pub in_force: Option<String>,
    /// Whether the public key is committed on main (`rsim key publish` otherwise).
    pub committed: bool,
    /// Node branches checked.
    pub nodes: usize,
}

/// `rsim clone`: `git clone` (any transport git has, the user's credentials), then every node
/// branch (`refs/heads/rsim/*`, which a plain clone leaves remote-tracking), git pointed at the
/// committed `allowed_signers`, and the study opened (read-only without its key) and verified.
pub fn clone(
    url: &str,
    dir: Option<&std::path::Path>,
) -> Result<(std::path::PathBuf, Study, VerifyReport)> {
    use std::path::PathBuf;
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => {
            let name = url
                .trim_end_matches('/')
                .rsplit(['/', ':'])
                .next()
                .unwrap_or("")
                .trim_end_matches(".git");
            if name.is_empty() || name == "." || name == ".." {
                return Err(crate::util::error::Error::invalid(format!(
                    "cannot tell a directory name from {url:?}; give one: rsim clone URL DIR"
                )));
            }
            PathBuf::from(name)
        }
    };
    if dir.exists() {
        return Err(crate::util::error::Error::invalid(format!(
            "{} already exists; nothing was cloned",
            dir.display()
        )));
    }
    let git = |args: &[&std::ffi::OsStr]| -> Result<()> {
        let out = std::process::Command::new("git")
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| {
                crate::util::error::Error::invalid(format!(
                    "cannot run git: {e} (is git installed?)"
                ))
            })?;
        if out.status.success() {
            return Ok(());
        }
        Err(crate::util::error::Error::invalid(format!(
            "git {} failed: {}",
            args.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    };
    let os = std::ffi::OsStr::new;
    git(&[
        os("clone"),
        os("--quiet"),
        os("--"),
        os(url),
        dir.as_os_str(),
    ])?;
    git(&[
        os("-C"),
        dir.as_os_str(),
        os("fetch"),
        os("--quiet"),
        os("origin"),
        os("+refs/heads/rsim/*:refs/heads/rsim/*"),
    ])?;
    // Read before anything of it is trusted: a copy that cannot be opened as a study, or whose
    // history holds another study's beginning, is removed (nothing is kept). Any other copy
    // gets git's signers file (the keys rsim proved) and its genesis pinned; one with a commit
    // not proven is kept for reading with care, and the command fails.
    let proven = Study::open(&dir).and_then(|study| {
        let rep = verify(&study, None)?;
        Ok((study, rep))
    });
    let refuse = |why: String| {
        let _ = std::fs::remove_dir_all(&dir);
        Err(crate::util::error::Error::invalid(format!(
            "{why}; nothing was kept ({} removed)",
            dir.display()
        )))
    };
    let (study, rep) = match proven {
        Ok(p) => p,
        Err(e) => return refuse(e.message),
    };
    if rep.foreign_history {
        let shown: Vec<&str> = rep.problems.iter().take(5).map(String::as_str).collect();
        return refuse(format!(
            "the copy's history holds another study's beginning: {}",
            shown.join("; ")
        ));
    }
    configure_git(&dir)?;
    study.record().pin_genesis()?;
    Ok((dir, study, rep))
}

/// Point git in the repository at `root` at the committed `allowed_signers` (what `rsim clone`
/// does, so that plain `git verify-commit` proves commits there too).
fn configure_git(root: &std::path::Path) -> Result<()> {
    crate::record::Record::open(root)?.configure_git_verification()
}

#[derive(Debug, serde::Serialize)]
pub struct KeyInfo {
    pub fingerprint: String,
    pub valid_after: Option<i64>,
    pub valid_before: Option<i64>,
}

impl From<&Signer> for KeyInfo {
    fn from(s: &Signer) -> Self {
        KeyInfo {
            fingerprint: s.fingerprint(),
            valid_after: s.valid_after,
            valid_before: s.valid_before,
        }
    }
}

/// Verify the study; `expect_key`: the genesis key's fingerprint must be this one.
pub fn verify(study: &Study, expect_key: Option<&str>) -> Result<VerifyReport> {
    let record = study.record();
    let repo = record.repo();
    let mut rep = VerifyReport {
        read_only: study.read_only().is_some(),
        in_force: record.key_fingerprint(),
        committed: record.key_committed(),
        ..Default::default()
    };
    rep.problems.extend(record.key_problems().iter().cloned());
    let Some(signers) = record.signers() else {
        rep.problems.push(
            "the study has no signing key (made before rsim signed its record): no commit can be proven".into(),
        );
        // A study made before signing holds no signed commit and one first commit: a signed
        // one, or a second root, means main's keys were taken away or its history replaced.
        let Some(tips) = sized_tips(record, &mut rep)? else {
            return Ok(rep);
        };
        let main = tips[0];
        let genesis = crate::record::first_parent_root(repo, main)?;
        let mut walk = repo.revwalk()?;
        for t in &tips {
            walk.push(*t)?;
        }
        for oid in walk {
            let oid = oid?;
            let signed = crate::record::signing::is_signed(repo, oid);
            let second_root = oid != genesis && repo.find_commit(oid)?.parent_count() == 0;
            if signed || second_root {
                rep.foreign_history = true;
                rep.first_bad = Some(oid.to_string());
                rep.problems.push(format!(
                    "{}: {} — a study made before signing holds neither; main's keys were taken \
                     away or its history replaced",
                    describe(repo, oid),
                    if signed {
                        "a signed commit"
                    } else {
                        "a second first commit"
                    }
                ));
                break;
            }
        }
        return Ok(rep);
    };
    rep.keys = signers.keys.iter().map(KeyInfo::from).collect();
    if !record.key_committed() {
        rep.problems.push(format!(
            "the study's public key is not committed on main ({SIGNERS_FILE}): clones cannot prove its commits; run `rsim key publish`"
        ));
    }
    let Some(tips) = sized_tips(record, &mut rep)? else {
        return Ok(rep);
    };
    let main = tips[0];
    // main's first-parent chain: genesis, key changes, and the owner's config commits.
    let mut first_parent = repo.revwalk()?;
    first_parent.push(main)?;
    first_parent.simplify_first_parent()?;
    let chain: Vec<Oid> = first_parent.filter_map(|o| o.ok()).collect();
    let genesis = chain.last().copied();
    let on_main: HashSet<Oid> = chain.iter().copied().collect();
    let mut walk = repo.revwalk()?;
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)?;
    walk.push(main)?;
    for (_, tip) in record.node_tips()? {
        walk.push(tip)?;
        rep.nodes += 1;
    }
    for oid in walk {
        let oid = oid?;
        // One study, one genesis: a second first commit anywhere (a node grown from another
        // history, main's own kept behind a merge) is not this study's, signed or not.
        if Some(oid) != genesis && repo.find_commit(oid)?.parent_count() == 0 {
            rep.foreign_history = true;
            if rep.first_bad.is_none() {
                rep.first_bad = Some(oid.to_string());
            }
            rep.problems.push(format!(
                "{}: a second first commit — the study's history starts at its genesis {}, and \
                 this commit starts another; what grows from it is not this study's",
                describe(repo, oid),
                genesis.map(|g| g.to_string()).unwrap_or_default()
            ));
            continue;
        }
        let must = !on_main.contains(&oid)
            || Some(oid) == genesis
            || changes_keys(repo, oid)?
            || crate::record::signing::is_signed(repo, oid);
        if !must {
            rep.unsigned_owner_commits += 1;
            rep.owner_commits.push(describe(repo, oid));
            rep.owner_changes.push(owner_changes(repo, oid));
            continue;
        }
        match signers.signer_of(repo, oid) {
            Ok(signer) => {
                rep.verified += 1;
                if Some(oid) == genesis {
                    rep.genesis_key = Some(signer.fingerprint());
                }
            }
            Err(why) => {
                let at = describe(repo, oid);
                if rep.first_bad.is_none() {
                    rep.first_bad = Some(oid.to_string());
                }
                rep.problems.push(format!("{at}: {why}"));
            }
        }
    }
    if let Some(want) = expect_key
        && rep.genesis_key.as_deref() != Some(want)
    {
        rep.problems.push(format!(
            "the study's genesis is signed by {}, not by the key you expect ({want})",
            rep.genesis_key.as_deref().unwrap_or("no key of its own")
        ));
    }
    Ok(rep)
}

/// `main`'s tip and every node's, once every commit reachable from them is sized (before
/// libgit2's walks parse them whole); `None`, with the commit too large named in `rep`, if not.
fn sized_tips(record: &crate::record::Record, rep: &mut VerifyReport) -> Result<Option<Vec<Oid>>> {
    let mut tips = vec![record.main_tip()?];
    tips.extend(record.node_tips()?.into_iter().map(|(_, t)| t));
    if let Err(e) = crate::record::check_commit_sizes(record.repo(), &tips, false) {
        rep.first_bad = e.message.split_whitespace().nth(1).map(str::to_string);
        rep.problems.push(e.message);
        return Ok(None);
    }
    Ok(Some(tips))
}

/// Changes listed per owner commit at most (then how many more).
const CHANGES_LISTED: usize = 24;

/// What an owner commit on `main` changed against its first parent, in words: each key of
/// `rsim.toml` (dotted path: value before → after, values cut short), then each other entry of
/// main's top folder added, removed or changed (a folder is named, not walked). Read through the
/// sized readers: a repository from elsewhere decides these files.
fn owner_changes(repo: &git2::Repository, oid: Oid) -> Vec<String> {
    use crate::config::CONFIG_FILE;
    use crate::record::{MAX_OWNER_FILE, blob_at_most, commit_at_most, tree_at_most};
    let tree_of = |c: Oid| -> Result<git2::Tree<'_>> {
        tree_at_most(repo, commit_at_most(repo, c)?.tree_id(), MAX_OWNER_FILE)
    };
    let (mine, parent) = match commit_at_most(repo, oid).and_then(|c| {
        let parent = match c.parent_id(0) {
            Ok(p) => Some(tree_of(p)?),
            Err(_) => None,
        };
        Ok((tree_of(oid)?, parent))
    }) {
        Ok(t) => t,
        Err(e) => return vec![format!("not read: {}", e.message)],
    };
    let entry = |t: Option<&git2::Tree<'_>>, name: &[u8]| {
        t.and_then(|t| t.get_name_bytes(name).map(|e| (e.id(), e.kind())))
    };
    let mut out = Vec::new();
    let mut names: Vec<Vec<u8>> = mine.iter().map(|e| e.name_bytes().to_vec()).collect();
    if let Some(p) = &parent {
        names.extend(p.iter().map(|e| e.name_bytes().to_vec()));
    }
    names.sort();
    names.dedup();
    for name in names {
        let (after, before) = (entry(Some(&mine), &name), entry(parent.as_ref(), &name));
        if after.map(|a| a.0) == before.map(|b| b.0) {
            continue;
        }
        let shown = crate::util::text::sanitize_line(&String::from_utf8_lossy(&name));
        if name == CONFIG_FILE.as_bytes() {
            let read = |id: Option<(Oid, Option<git2::ObjectType>)>| -> Result<toml::Table> {
                let Some((id, _)) = id else {
                    return Ok(toml::Table::new());
                };
                let blob = blob_at_most(repo, id, MAX_OWNER_FILE)?;
                let text = std::str::from_utf8(blob.content())
                    .map_err(|_| crate::util::error::Error::invalid("not UTF-8"))?;
                toml::from_str(text).map_err(|e| crate::util::error::Error::invalid(e.to_string()))
            };
            match (read(before), read(after)) {
                (Ok(b), Ok(a)) => {
                    let (b, a) = (flatten(&b), flatten(&a));
                    let keys: std::collections::BTreeSet<&String> =
                        b.keys().chain(a.keys()).collect();
                    for k in keys {
                        let (vb, va) = (b.get(k), a.get(k));
                        if vb != va {
                            let show =
                                |v: Option<&String>| v.map_or("(unset)".to_string(), |v| short(v));
                            out.push(format!("{shown}: {k}: {} → {}", show(vb), show(va)));
                        }
                    }
                }
                (b, a) => {
                    let why = b.err().or(a.err()).map(|e| e.message).unwrap_or_default();
                    out.push(format!(
                        "{shown}: changed (does not parse: {})",
                        short(&why)
                    ));
                }
            }
            continue;
        }
        let folder = |x: Option<(Oid, Option<git2::ObjectType>)>| {
            x.is_some_and(|(_, k)| k == Some(git2::ObjectType::Tree))
        };
        let what = match (before, after) {
            (None, _) => "added",
            (_, None) => "removed",
            _ => "changed",
        };
        let slash = if folder(before) || folder(after) {
            "/"
        } else {
            ""
        };
        out.push(format!("{shown}{slash}: {what}"));
    }
    if out.len() > CHANGES_LISTED {
        let more = out.len() - CHANGES_LISTED;
        out.truncate(CHANGES_LISTED);
        out.push(format!("… and {more} more change(s)"));
    }
    out
}

/// A TOML table's values by dotted key (tables walked, arrays and values as TOML writes them).
fn flatten(t: &toml::Table) -> std::collections::BTreeMap<String, String> {
    fn walk(prefix: &str, t: &toml::Table, out: &mut std::collections::BTreeMap<String, String>) {
        for (k, v) in t {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(sub) => walk(&key, sub, out),
                v => {
                    out.insert(key, v.to_string());
                }
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk("", t, &mut out);
    out
}

/// A value or reason cut to 60 characters, on one line.
fn short(v: &str) -> String {
    let line = crate::util::text::sanitize_line(v);
    match line.char_indices().nth(60) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line,
    }
}

/// Whether commit `oid` changes `allowed_signers` against its first parent.
fn changes_keys(repo: &git2::Repository, oid: Oid) -> Result<bool> {
    let c = repo.find_commit(oid)?;
    let mine = c.tree()?.get_name(SIGNERS_FILE).map(|e| e.id());
    let theirs = match c.parent(0) {
        Ok(p) => p.tree()?.get_name(SIGNERS_FILE).map(|e| e.id()),
        Err(_) => None,
    };
    Ok(mine != theirs)
}

/// Where a commit sits, in words: the node its trailers name (or main) and its subject.
fn describe(repo: &git2::Repository, oid: Oid) -> String {
    let Ok(c) = repo.find_commit(oid) else {
        return oid.to_string();
    };
    let msg = c.message_raw().unwrap_or("");
    let t = crate::record::Trailers::parse(msg);
    let subject = crate::util::text::sanitize_line(msg.lines().next().unwrap_or(""));
    match t.node {
        Some(n) => format!("node {n}, commit {oid} ({subject})"),
        None => format!("commit {oid} ({subject})"),
    }
}
