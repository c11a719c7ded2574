//! A study handed to a colleague, crafted: files planted in the work tree (a link to
//! `/dev/zero`, a FIFO, a link out of the study), history git reads rewritten (grafts, a shallow
//! copy), node refs that are not nodes, a node's meta made huge or full of terminal escapes, and
//! keys changed on `main` by a commit anyone could push. The reader's rsim reads nothing
//! unbounded, writes through no link, hangs on nothing, proves what it shows, names what it
//! refuses, and lets no control character reach the terminal.

use std::path::Path;

use serde_json::json;
use std::time::{Duration, Instant};

use crate::sharing::{Person, git, owners_study, signed_onto};

/// The owner's study with a few actions, and a reader with a home of its own, in one directory.
struct Shared {
    d: tempfile::TempDir,
    owner: Person,
    reader: Person,
    study: std::path::PathBuf,
    _s: tempfile::TempDir,
}

impl Shared {
    fn new() -> Shared {
        let d = tempfile::tempdir().expect("tempdir");
        let owner = Person::new(d.path(), "owner");
        let reader = Person::new(d.path(), "reader");
        let (_s, study) = owners_study(&owner);
        Shared {
            d,
            owner,
            reader,
            study,
            _s,
        }
    }
}

fn clone_to(src: &Path, dst: &Path) {
    git(
        src.parent().expect("parent"),
        &[
            "clone",
            "-q",
            src.to_str().expect("utf8"),
            dst.to_str().expect("utf8"),
        ],
    );
    git(
        dst,
        &[
            "fetch",
            "-q",
            "origin",
            "+refs/heads/rsim/*:refs/heads/rsim/*",
        ],
    );
}

/// Write `content` into `copy`'s object database (through a scratch file in `scratch`).
fn blob_in(copy: &Path, scratch: &Path, content: &[u8]) -> String {
    let f = scratch.join("blob");
    std::fs::write(&f, content).expect("blob");
    git(copy, &["hash-object", "-w", f.to_str().expect("utf8")])
}

/// An unsigned commit on `parent`, with message `msg`, whose tree holds only a `node.toml` of
/// `meta`: what a crafted repository puts under a node ref.
fn meta_commit(copy: &Path, scratch: &Path, parent: &str, meta: &[u8], msg: &str) -> String {
    let blob = blob_in(copy, scratch, meta);
    let tree_in = scratch.join("tree");
    std::fs::write(&tree_in, format!("100644 blob {blob}\tnode.toml\n")).expect("tree");
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(copy)
        .arg("mktree")
        .stdin(std::fs::File::open(&tree_in).expect("open"))
        .output()
        .expect("mktree");
    let tree = String::from_utf8_lossy(&out.stdout).trim().to_string();
    git(copy, &["commit-tree", &tree, "-p", parent, "-m", msg])
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn no_escape(out: &std::process::Output) {
    let all = [&out.stdout[..], &out.stderr[..]].concat();
    assert!(
        !all.iter().any(|b| *b == 0x1b || *b == 0x07),
        "a control character reached the terminal: {}",
        text(out)
    );
}

#[test]
fn planted_work_tree_files_are_read_bounded_never_waited_on_and_never_written_through() {
    let Shared {
        d,
        owner,
        reader,
        study,
        _s,
    } = Shared::new();

    // A committed rsim.toml that is a link to /dev/zero: a plain clone checks the link out.
    let work = d.path().join("crafted");
    clone_to(&study, &work);
    git(&work, &["rm", "-q", "--cached", "rsim.toml"]);
    std::fs::remove_file(work.join("rsim.toml")).expect("rm");
    std::os::unix::fs::symlink("/dev/zero", work.join("rsim.toml")).expect("symlink");
    git(&work, &["add", "rsim.toml"]);
    git(&work, &["commit", "-q", "-m", "config"]);
    let victim = d.path().join("victim");
    clone_to(&work, &victim);
    for args in [&["dag"][..], &["env", "check"][..]] {
        let t = Instant::now();
        let out = reader.run(&victim, args);
        assert!(!out.status.success(), "{args:?}: {}", text(&out));
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{args:?} took {:?}",
            t.elapsed()
        );
        let said = text(&out);
        assert!(
            said.contains("rsim.toml"),
            "{args:?} names the file: {said}"
        );
    }

    // A handed-over directory whose rsim.toml is a FIFO beside a good committed config: nothing
    // waits on it; the committed config applies.
    let handed = d.path().join("handed");
    clone_to(&study, &handed);
    std::fs::remove_file(handed.join("rsim.toml")).expect("rm");
    nix::unistd::mkfifo(&handed.join("rsim.toml"), nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let t = Instant::now();
    let out = reader.run(&handed, &["dag"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());

    // The owner's own work tree with `allowed_signers` made a link out of the study (as a pull
    // of someone's commit would leave it): a key rotation replaces the link, never writes
    // through it.
    let outside = d.path().join("outside-file");
    std::fs::write(&outside, "keep me").expect("write");
    std::fs::remove_file(study.join("allowed_signers")).expect("rm");
    std::os::unix::fs::symlink(&outside, study.join("allowed_signers")).expect("symlink");
    owner.ok(&study, &["key", "rotate"]);
    assert_eq!(
        std::fs::read_to_string(&outside).expect("outside"),
        "keep me"
    );
    let meta = std::fs::symlink_metadata(study.join("allowed_signers")).expect("meta");
    assert!(meta.file_type().is_file(), "the link was replaced");
    owner.ok(&study, &["verify"]);
}

#[test]
fn git_proves_signatures_with_the_keys_rsim_proved_not_the_work_trees_file() {
    let Shared {
        d,
        owner,
        reader,
        study,
        _s,
    } = Shared::new();
    let clone = d.path().join("clone");
    let out = reader
        .cmd()
        .arg("clone")
        .arg(&study)
        .arg(&clone)
        .output()
        .expect("clone");
    assert!(out.status.success(), "{}", text(&out));
    let file = git(&clone, &["config", "gpg.ssh.allowedSignersFile"]);
    let git_dir = std::fs::canonicalize(clone.join(".git")).expect("git dir");
    assert!(
        Path::new(&file).starts_with(&git_dir),
        "git reads keys from the git directory, not the work tree: {file}"
    );
    assert_eq!(
        std::fs::read(&file).expect("signers"),
        std::fs::read(clone.join("allowed_signers")).expect("committed"),
        "the keys rsim proved are the committed ones"
    );
    // Whatever a commit (or anyone) puts in the work tree's file, git's answer does not change.
    std::fs::write(
        clone.join("allowed_signers"),
        "rsim@study ssh-ed25519 AAAA\n",
    )
    .expect("w");
    git(&clone, &["verify-commit", "rsim/n/n1"]);
    // The owner's own repository too, and after a rotation git's copy follows the keys.
    owner.ok(&study, &["key", "rotate"]);
    owner.ok(
        &study,
        &[
            "branch",
            "--from",
            "n0",
            "--title",
            "after",
            "--hypothesis",
            "h",
        ],
    );
    let file = git(&study, &["config", "gpg.ssh.allowedSignersFile"]);
    assert!(file.ends_with("rsim-allowed-signers"), "{file}");
    git(&study, &["verify-commit", "rsim/n/n2"]);
    git(&study, &["verify-commit", "rsim/n/n1"]);
}

#[test]
fn history_git_reads_rewritten_is_refused_by_name() {
    let Shared {
        d,
        owner: _,
        reader,
        study,
        _s,
    } = Shared::new();

    // Grafts that drop n1's middle action: every read refuses, naming the file.
    let copy = d.path().join("grafted");
    clone_to(&study, &copy);
    let tip = git(&copy, &["rev-parse", "rsim/n/n1"]);
    let first = git(&copy, &["rev-parse", "rsim/n/n1~1"]);
    let before = git(&copy, &["rev-parse", "rsim/n/n1~1^"]);
    std::fs::create_dir_all(copy.join(".git/info")).expect("info");
    std::fs::write(copy.join(".git/info/grafts"), format!("{tip} {before}\n")).expect("grafts");
    assert_ne!(first, before);
    for args in [&["verify"][..], &["log"][..], &["dag"][..], &["fsck"][..]] {
        let out = reader.run(&copy, args);
        assert!(!out.status.success(), "{args:?}: {}", text(&out));
        assert!(text(&out).contains("grafts"), "{args:?}: {}", text(&out));
    }
    // A graft cycle: refused the same way, at once (no walk for ever).
    std::fs::write(
        copy.join(".git/info/grafts"),
        format!("{first} {tip}\n{tip} {first}\n"),
    )
    .expect("grafts");
    let t = Instant::now();
    let out = reader.run(&copy, &["dag"]);
    assert!(!out.status.success() && t.elapsed() < Duration::from_secs(20));

    // A shallow clone: its history is cut off, so it is refused with what to do.
    let shallow = d.path().join("shallow");
    git(
        d.path(),
        &[
            "clone",
            "-q",
            "--depth",
            "1",
            &format!("file://{}", study.display()),
            shallow.to_str().expect("utf8"),
        ],
    );
    let out = reader.run(&shallow, &["dag"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("shallow") && text(&out).contains("--unshallow"),
        "{}",
        text(&out)
    );
}

#[test]
fn node_refs_that_are_not_nodes_and_crafted_metas_are_named_without_escapes() {
    let Shared {
        d,
        owner: _,
        reader,
        study,
        _s,
    } = Shared::new();
    let copy = d.path().join("copy");
    clone_to(&study, &copy);
    let n1 = git(&copy, &["rev-parse", "rsim/n/n1"]);

    // A node meta of 2 MiB (1 KiB in git) and one full of terminal escapes, each on an unsigned
    // commit under a node ref; a ref with escapes in its name; a ref at a blob.
    let obj = |content: &[u8]| blob_in(&copy, d.path(), content);
    let node_commit = |meta: &[u8]| {
        meta_commit(
            &copy,
            d.path(),
            &n1,
            meta,
            "x\n\nRsim-Node: n7\nRsim-Seq: 1\n",
        )
    };
    let huge = node_commit(&vec![b'#'; 2 << 20]);
    let escapes = node_commit(b"id = \"n8\x1b]0;owned\x07\x1b[2J ok: verified\"\n[[[");
    git(&copy, &["update-ref", "refs/heads/rsim/n/n7", &huge]);
    git(&copy, &["update-ref", "refs/heads/rsim/n/n8", &escapes]);
    let blob = obj(b"not a commit");
    // git will not point a branch at a blob; a handed-over directory's ref file can.
    std::fs::write(copy.join(".git/refs/heads/rsim/n/n9"), format!("{blob}\n")).expect("ref");
    let mut packed = std::fs::read(copy.join(".git/packed-refs")).unwrap_or_default();
    packed.extend_from_slice(format!("{n1} refs/heads/rsim/n/n5\x1b]0;T\x07x\n").as_bytes());
    std::fs::write(copy.join(".git/packed-refs"), packed).expect("packed-refs");

    let t = Instant::now();
    let out = reader.run(&copy, &["fsck"]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    no_escape(&out);
    for want in [
        "n7: node.toml",
        "more than rsim reads there",
        "n8:",
        "rsim/n/n9: points at a blob",
        "not a node id",
        // n2–n6 were never made here: to fsck they are nodes deleted from this copy.
        "5 node number(s) below the highest have no branch in this copy (n2, n3, n4, n5, n6)",
    ] {
        assert!(said.contains(want), "fsck names {want:?}: {said}");
    }
    assert!(said.contains("n1") || said.contains("nodes"), "{said}");
    for args in [
        &["dag"][..],
        &["verify"][..],
        &["audit"][..],
        &["report"][..],
    ] {
        let out = reader.run(&copy, args);
        no_escape(&out);
    }
}

#[test]
fn files_on_main_that_pack_small_and_inflate_large_are_refused_unread() {
    let Shared {
        d,
        owner: _,
        reader,
        study,
        _s,
    } = Shared::new();
    // 32 MiB of one byte: 32 KiB in git. A pushed commit on main makes it the study's config in
    // one copy and its list of keys in another; the reader's rsim must not inflate either.
    let big = vec![b'#'; 32 << 20];
    for (file, want) in [
        ("rsim.toml", "rsim.toml on main: object"),
        ("allowed_signers", "allowed_signers: object"),
    ] {
        let copy = d.path().join(format!("copy-{file}"));
        clone_to(&study, &copy);
        std::fs::write(copy.join(file), &big).expect("write");
        git(&copy, &["commit", "-q", "-am", "pushed by anyone"]);
        let t = Instant::now();
        let out = reader.run(&copy, &["verify"]);
        let said = text(&out);
        assert!(!out.status.success(), "{file}: {said}");
        assert!(said.contains(want), "{file}: {said}");
        assert!(
            said.contains("33554432 bytes, more than rsim reads there (1048576 bytes)"),
            "{file}: {said}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{file}: {:?}",
            t.elapsed()
        );
    }
    // The same bytes as a commit's message, on main and at a node's tip.
    let msg = d.path().join("message");
    std::fs::write(&msg, &big).expect("message");
    for branch in ["main", "rsim/n/n1"] {
        let copy = d.path().join(format!("copy-{}", branch.replace('/', "-")));
        clone_to(&study, &copy);
        let (pushed, _) = huge_commit_on(&copy, branch, &msg);
        git(
            &copy,
            &["update-ref", &format!("refs/heads/{branch}"), &pushed],
        );
        for args in [&["verify"][..], &["dag"][..]] {
            let out = reader.run(&copy, args);
            let said = text(&out);
            // verify fails; the views leave a node whose history cannot be read out, named.
            assert!(
                !out.status.success() || args == ["dag"] && branch != "main",
                "{branch} {args:?}: {said}"
            );
            assert!(
                said.contains(&format!("commit {pushed} is 3355")),
                "{branch} {args:?}: {said}"
            );
            assert!(said.contains("more than rsim reads of a commit"), "{said}");
        }
    }
    // The next try: the huge commit hidden behind a merge's second parent on main, where a
    // first-parent walk never looks. fsck walks every parent, sized first, and names it.
    let copy = d.path().join("copy-merge");
    clone_to(&study, &copy);
    let (hidden, tip) = huge_commit_on(&copy, "main", &msg);
    let tree = git(&copy, &["rev-parse", "main^{tree}"]);
    let merge = git(
        &copy,
        &[
            "commit-tree",
            &tree,
            "-p",
            &tip,
            "-p",
            &hidden,
            "-m",
            "merge",
        ],
    );
    git(&copy, &["update-ref", "refs/heads/main", &merge]);
    let t = Instant::now();
    for args in [&["fsck"][..], &["verify"][..]] {
        let out = reader.run(&copy, args);
        let said = text(&out);
        assert!(!out.status.success(), "{args:?}: {said}");
        assert!(
            said.contains(&format!("commit {hidden} is 3355"))
                && said.contains("more than rsim reads of a commit"),
            "{args:?}: {said}"
        );
    }
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

/// A commit on `branch`'s tip and tree whose message is the file `msg` (the huge one), not yet
/// on any ref: its id, and the tip it extends.
fn huge_commit_on(copy: &Path, branch: &str, msg: &Path) -> (String, String) {
    let tip = git(copy, &["rev-parse", branch]);
    let tree = git(copy, &["rev-parse", &format!("{branch}^{{tree}}")]);
    let commit = git(
        copy,
        &[
            "commit-tree",
            &tree,
            "-p",
            &tip,
            "-F",
            msg.to_str().expect("utf8"),
        ],
    );
    (commit, tip)
}

/// A node's meta that names another node, or an id with escapes in it, parsed as TOML: the id is
/// what the index keys a node by and what `dag` prints bare (and DOT as an identifier), so such a
/// meta is refused by name, never indexed over the node it names and never printed.
#[test]
fn node_metas_naming_another_node_or_a_crafted_id_are_refused_unprinted() {
    let Shared {
        d,
        owner: _,
        reader,
        study,
        _s,
    } = Shared::new();
    let copy = d.path().join("copy");
    clone_to(&study, &copy);
    let n1 = git(&copy, &["rev-parse", "rsim/n/n1"]);
    let meta_at = |branch: &str, meta: &str| {
        let c = meta_commit(&copy, d.path(), &n1, meta.as_bytes(), "x\n\nRsim-Seq: 1\n");
        git(
            &copy,
            &["update-ref", &format!("refs/heads/rsim/n/{branch}"), &c],
        );
    };
    let rest = "title = \"t\"\nparents = [\"n0\"]\nstatus = \"open\"\ncreated_at = \"2026-01-01T00:00:00Z\"\ncreated_by = \"x\"\n";
    for (branch, id) in [
        ("n7", "n1"),
        ("n8", "n8\\u001b]0;owned\\u0007"),
        ("n9", "a [URL=\\\"javascript:x\\\"]"),
    ] {
        meta_at(branch, &format!("id = \"{id}\"\n{rest}"));
        for args in [
            &["dag"][..],
            &["dag", "--format", "dot"][..],
            &["show", "n1"][..],
        ] {
            let out = reader.run(&copy, args);
            let said = text(&out);
            no_escape(&out);
            assert!(!said.contains("javascript"), "{args:?}: {said}");
            // Left out of the views, by name of its branch.
            assert!(
                said.contains(&format!("{branch}: "))
                    && (said.contains("names another node") || said.contains("not a node id")),
                "{branch} ({id:?}), {args:?}: {said}"
            );
        }
        // The node it named keeps its own row.
        let out = reader.run(&copy, &["--json", "show", "n1"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["id"], "n1", "{v}");
        assert_ne!(
            v["title"], "t",
            "{branch}: n1 was indexed from a crafted meta: {v}"
        );
    }
}

/// `main` given a new first commit by anyone who can push, with the study's own `main` kept
/// behind a merge's second parent so that n0 still grows out of it: with no keys at all (which
/// read as a study made before signing: nothing proven, the copy writable) or with the study's
/// `allowed_signers` copied into it (keys read from a genesis that is not the study's). The
/// reader's rsim refuses to open either, naming both first commits — `rsim clone` fails, a
/// fresh clone and an existing one updated the documented way (`git pull --ff-only`, which
/// fast-forwards over the study's `main`) alike — and writes nothing. A node seq at the top of
/// its range is named, not a panic.
#[test]
fn main_given_a_new_first_commit_is_refused_and_nothing_is_written() {
    let Shared {
        d,
        owner: _,
        reader,
        study,
        _s,
    } = Shared::new();
    let updated = d.path().join("updated");
    reader.clone_ok(&study, &updated);
    // No keys; the study's allowed_signers copied; and n0 rooted anew as well (its new first
    // commit on the new genesis, the study's n0 kept behind a merge so n1 still grows from it).
    for (variant, keys, n0_too) in [
        ("nokeys", false, false),
        ("ownkeys", true, false),
        ("n0too", true, true),
    ] {
        let work = d.path().join(format!("reroot-{variant}"));
        clone_to(&study, &work);
        let old = git(&work, &["rev-parse", "main"]);
        if !keys {
            git(&work, &["rm", "-q", "--cached", "allowed_signers"]);
        }
        let tree = git(&work, &["write-tree"]);
        let root = git(&work, &["commit-tree", &tree, "-m", "init: study"]);
        let merge = git(
            &work,
            &["commit-tree", &tree, "-p", &root, "-p", &old, "-m", "merge"],
        );
        git(&work, &["update-ref", "refs/heads/main", &merge]);
        git(&work, &["reset", "-q", "--hard", "main"]);
        if n0_too {
            let n0 = git(&work, &["rev-parse", "rsim/n/n0"]);
            let n0_tree = git(&work, &["rev-parse", "rsim/n/n0^{tree}"]);
            let first = git(
                &work,
                &[
                    "commit-tree",
                    &n0_tree,
                    "-p",
                    &root,
                    "-m",
                    "init\n\nRsim-Node: n0\nRsim-Seq: 1\nRsim-Action: init",
                ],
            );
            let joined = git(
                &work,
                &[
                    "commit-tree",
                    &n0_tree,
                    "-p",
                    &first,
                    "-p",
                    &n0,
                    "-m",
                    "merge",
                ],
            );
            git(&work, &["update-ref", "refs/heads/rsim/n/n0", &joined]);
        }

        // A fresh clone: refused, and nothing of it is kept.
        let victim = d.path().join(format!("victim-{variant}"));
        let out = reader
            .cmd()
            .arg("clone")
            .arg(&work)
            .arg(&victim)
            .output()
            .expect("clone");
        assert!(!out.status.success(), "{variant}: {}", text(&out));
        assert!(
            text(&out).contains("nothing was kept"),
            "{variant}: {}",
            text(&out)
        );
        assert!(!victim.exists(), "{variant}: a refused clone was kept");
        // Copied with git instead: main replaced alone is refused at every command, and
        // nothing is written.
        if !n0_too {
            clone_to(&work, &victim);
            let refs = git(&victim, &["for-each-ref"]);
            for args in [
                &["dag"][..],
                &["verify"][..],
                &["fsck"][..],
                &[
                    "branch",
                    "--from",
                    "n1",
                    "--title",
                    "x",
                    "--hypothesis",
                    "h",
                ][..],
            ] {
                let out = reader.run(&victim, args);
                assert!(!out.status.success(), "{variant} {args:?}: {}", text(&out));
                let t = text(&out);
                assert!(
                    t.contains("main was replaced") && t.contains(&root),
                    "{variant} {args:?}: {t}"
                );
            }
            assert_eq!(git(&victim, &["for-each-ref"]), refs, "nothing written");
        }

        // An existing clone, updated as `rsim clone` says: its pinned genesis refuses it.
        git(
            &updated,
            &[
                "fetch",
                "-q",
                work.to_str().expect("utf8"),
                "+refs/heads/rsim/*:refs/heads/rsim/*",
                "+refs/heads/main:refs/remotes/crafted/main",
            ],
        );
        git(&updated, &["merge", "-q", "--ff-only", "crafted/main"]);
        let out = reader.run(&updated, &["dag"]);
        assert!(!out.status.success(), "{variant}: {}", text(&out));
        assert!(
            text(&out).contains("not at the genesis") && text(&out).contains(&root),
            "{variant}: {}",
            text(&out)
        );
        git(&updated, &["reset", "-q", "--hard", &old]);
        git(
            &updated,
            &[
                "fetch",
                "-q",
                study.to_str().expect("utf8"),
                "+refs/heads/rsim/*:refs/heads/rsim/*",
            ],
        );
    }

    // A node's action numbered at the top of its range, before one numbered after it.
    let copy = d.path().join("seq");
    clone_to(&study, &copy);
    let tip = git(&copy, &["rev-parse", "rsim/n/n1"]);
    let tree = git(&copy, &["rev-parse", "rsim/n/n1^{tree}"]);
    let top = git(
        &copy,
        &[
            "commit-tree",
            &tree,
            "-p",
            &tip,
            "-m",
            "x\n\nRsim-Node: n1\nRsim-Seq: 4294967295\nRsim-Action: compare",
        ],
    );
    let next = git(
        &copy,
        &[
            "commit-tree",
            &tree,
            "-p",
            &top,
            "-m",
            "x\n\nRsim-Node: n1\nRsim-Seq: 5\nRsim-Action: compare",
        ],
    );
    git(&copy, &["update-ref", "refs/heads/rsim/n/n1", &next]);
    for args in [&["dag"][..], &["fsck"][..], &["reindex"][..]] {
        let out = reader.run(&copy, args);
        assert!(!text(&out).contains("panicked"), "{args:?}: {}", text(&out));
    }
}

/// The owner rewrites a node's branch below what a reader's index holds — moved back one action
/// and grown again, to more actions than before, each signed with the study's key — and the
/// reader fetches it: the reader's index re-reads the node, so its answers are a fresh clone's
/// (the index is derived from git), not the old actions with the new ones numbered on after.
#[test]
fn a_node_rewritten_below_a_readers_index_is_read_again_from_git() {
    let Shared {
        d,
        owner,
        reader,
        study,
        _s,
    } = Shared::new();
    n2_with_datasets(&owner, &study, "data", &["first", "second"]);
    let early = d.path().join("early");
    reader.clone_ok(&study, &early);
    let log = |dir: &Path| reader.ok(dir, &["log", "--node", "n2"]);
    assert!(log(&early).contains("second"), "{}", log(&early));
    // Back one action, then two new ones: three datasets, `second` gone.
    let back = git(&study, &["rev-parse", "rsim/n/n2~1"]);
    git(&study, &["update-ref", "refs/heads/rsim/n/n2", &back]);
    for name in ["third", "fourth"] {
        let req = json!({"node": "n2", "name": name, "source": {"kind": "inline", "rows": [{"prompt": format!("{name} 1+1="), "answer": "2"}]}});
        owner.ok(&study, &["call", "register_dataset", &req.to_string()]);
    }
    git(
        &early,
        &[
            "fetch",
            "-q",
            "origin",
            "+refs/heads/rsim/*:refs/heads/rsim/*",
        ],
    );
    let fresh = d.path().join("fresh");
    reader.clone_ok(&study, &fresh);
    let (now, want) = (log(&early), log(&fresh));
    assert!(
        !want.contains("second") && want.contains("fourth"),
        "{want}"
    );
    assert_eq!(now, want, "the reader's index answers as a fresh clone's");
}

/// The owner's branch n2 (`title`) with one inline dataset registered per name.
fn n2_with_datasets(owner: &Person, study: &Path, title: &str, names: &[&str]) {
    owner.ok(
        study,
        &[
            "branch",
            "--from",
            "n0",
            "--title",
            title,
            "--hypothesis",
            "h",
        ],
    );
    for name in names {
        let req = json!({"node": "n2", "name": name, "source": {"kind": "inline", "rows": [{"prompt": format!("{name} 1+1="), "answer": "2"}]}});
        owner.ok(study, &["call", "register_dataset", &req.to_string()]);
    }
}

/// A key holder's later commit that also edits an earlier action's file (a reader who indexed
/// the earlier action keeps it, a fresh clone reads the edit): fsck names the commit and the
/// file it changed.
#[test]
fn a_later_commit_that_edits_an_earlier_action_is_named() {
    let Shared {
        d,
        owner,
        reader,
        study,
        _s,
    } = Shared::new();
    n2_with_datasets(&owner, &study, "edited", &["kept", "next"]);
    let file = "actions/0002-register_dataset.json";
    let first = git(&study, &["show", &format!("rsim/n/n2:{file}")]);
    let edited = first.replace("\"kept\"", "\"renamed\"");
    assert_ne!(first, edited, "{first}");
    let message = git(&study, &["log", "-1", "--format=%B", "rsim/n/n2"]);
    let forged = signed_onto(
        &study,
        d.path(),
        "rsim/n/n2",
        "rsim/n/n2~1",
        &[(file, edited.into_bytes())],
        &message,
    );
    git(&study, &["update-ref", "refs/heads/rsim/n/n2", &forged]);
    let clone = d.path().join("clone");
    reader.clone_ok(&study, &clone);
    let out = reader.run(&clone, &["fsck"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "n2#3: commit {forged} changes or removes the earlier action file 0002-register_dataset.json"
        )),
        "{}",
        text(&out)
    );
}

/// A record a key holder forged, signed with the study's key so every signature proves: an
/// accepted evaluate with no job, whose test score (0.99) is filed under a request on dev, of a
/// checkpoint no run produced under a request that scored the base model, and whose commit's
/// `Rsim-Metric` trailer says 0.12 where its action file says 0.99. A copy checks these against
/// each other: fsck names the trailers that disagree, and the audit counts the score filed under
/// another split, the checkpoint that is not the request's, and the score no job produced.
#[test]
fn a_forged_score_whose_record_contradicts_itself_is_named_and_counted() {
    let Shared {
        d,
        owner,
        reader,
        study,
        _s,
    } = Shared::new();
    n2_with_datasets(&owner, &study, "forged", &[]);
    let bought = "ab".repeat(32);
    let record = json!({
        "seq": 2,
        "action": "evaluate",
        "node": "n2",
        "agent": "owner",
        "role": "owner",
        "at": "2026-12-07T10:00:00.000Z",
        "summary": "base on add2/dev",
        "request": {"node": "n2", "checkpoint": "base", "task": "add2", "split": "dev"},
        "decision": {"decision": "accepted"},
        "result": {"evaluator": "x"},
        "metrics": [{"name": "exact_match", "value": 0.99, "task": "add2", "split": "test", "checkpoint": bought}],
    });
    let forged = signed_onto(
        &study,
        d.path(),
        "rsim/n/n2",
        "rsim/n/n2",
        &[(
            "actions/0002-evaluate.json",
            serde_json::to_vec(&record).expect("json"),
        )],
        "evaluate: base on add2/dev\n\nRsim-Node: n2\nRsim-Action: evaluate\nRsim-Seq: 2\nRsim-Agent: owner\nRsim-Role: owner\nRsim-Decision: accepted\nRsim-Metric: add2/test/exact_match=0.12\n",
    );
    git(&study, &["update-ref", "refs/heads/rsim/n/n2", &forged]);

    let clone = d.path().join("clone");
    reader.clone_ok(&study, &clone);
    let out = reader.run(&clone, &["fsck"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("n2#2: the commit's trailers (metrics) disagree with the action file"),
        "{}",
        text(&out)
    );
    let out = reader.run(&clone, &["--json", "audit"]);
    let audit: serde_json::Value = serde_json::from_slice(&out.stdout).expect("audit json");
    let said = |check: &str, what: &str| {
        let c = audit["checks"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == check))
            .unwrap_or_else(|| panic!("no check {check}: {audit}"));
        assert!(
            c["violations"].as_array().is_some_and(|v| v
                .iter()
                .any(|x| x.as_str().is_some_and(|x| x.contains(what)))),
            "{check}: {c}"
        );
    };
    said(
        "test-secrecy",
        "a add2/test score is recorded under a request on add2/dev",
    );
    said("provenance", &format!("a score of checkpoint {bought}"));
    said("evaluator", "with no job that produced them");
    assert!(audit["got_through"].as_u64().unwrap_or(0) >= 3, "{audit}");
}
