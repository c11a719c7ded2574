//! The source tree's layers, checked from the code itself: every module imports only the layers
//! below it (ARCHITECTURE.md, "Layers"), job-side code never names the agent API, only faces use
//! protocol crates, nothing above the OS reaches the record around it, and no two modules of one
//! layer import each other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first. A module may import its own layer and any layer before it.
const LAYERS: &[&str] = &[
    "util", "model", "api", "config", "policy", "record", "jobs", "train", "os", "campaign",
    "bench", "faces",
];

/// The layers above the Experiment OS: they act and read only through `os`.
const ABOVE_OS: &[&str] = &["campaign", "bench", "faces"];

/// Crates only the record (and the OS over it) may use: git and the SQLite index.
const RECORD_CRATES: &[&str] = &["git2", "rusqlite"];

/// Crates only a face may use (protocols and the command line).
const FACE_CRATES: &[&str] = &["clap", "rmcp", "axum", "tower_lsp_server", "lsp_types"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without comments and string literals (so prose and messages that mention
/// `crate::x` do not count as imports).
fn code_only(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i + 1 < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'r' && (b[i + 1..].starts_with(b"#\"") || b[i + 1..].starts_with(b"\""))
        {
            // A raw string: r"…", r#"…"#, r##"…"##.
            let mut j = i + 1;
            let mut hashes = 0;
            while b[j] == b'#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            i = j + close.len();
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('x', '\n', '\''); lifetimes ('a) are left alone.
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The top-level modules a piece of code names: `crate::x…` paths, and the heads of
/// `use crate::{x::…, y}` groups.
fn crate_modules(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the group, at brace depth 0.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.insert(ident(item.trim()));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 || c != '{' {
                    item.push(c);
                }
            }
            found.insert(ident(item.trim()));
        } else {
            found.insert(ident(rest));
        }
    }
    found.remove("");
    found
}

/// What a file of `layer` does around the Experiment OS: above it, reads go through its queries
/// and read methods and writes through its actions and functions, never the study's insides, the
/// record (`crate::record`, e.g. `Record::open`) or the record's crates.
fn around_the_os(layer: &str, code: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if !ABOVE_OS.contains(&layer) {
        return problems;
    }
    for inside in [".record()", ".index()", ".store()"] {
        if code.contains(inside) {
            problems.push(format!(
                "reads the study's {inside} below the Experiment OS API (add a query or a read method in os/)"
            ));
        }
    }
    if crate_modules(code).contains("record") {
        problems.push(format!(
            "the {layer} layer names crate::record: reach the record through os (a query, an action or a documented os function)"
        ));
    }
    for c in RECORD_CRATES {
        if code.contains(&format!("{c}::")) || code.contains(&format!("use {c}")) {
            problems.push(format!(
                "the {layer} layer uses {c}, the record's own crate: go through os"
            ));
        }
    }
    problems
}

fn layer_of(rel: &Path) -> Option<&'static str> {
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    LAYERS.iter().copied().find(|l| *l == name)
}

fn rank(layer: &str) -> usize {
    LAYERS
        .iter()
        .position(|l| *l == layer)
        .unwrap_or(usize::MAX)
}

#[test]
fn lower_layers_never_import_higher_ones() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut problems = Vec::new();
    // Module-level import graph inside each layer (second path component), for cycles.
    let mut inner: BTreeMap<&str, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let mut checked = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src");
        let code = code_only(&std::fs::read_to_string(f).expect("read"));
        let Some(layer) = layer_of(rel) else {
            // lib.rs and main.rs sit above every layer.
            assert!(
                matches!(rel.to_str(), Some("lib.rs" | "main.rs")),
                "{} is in no layer: put it under one of {LAYERS:?} (and in ARCHITECTURE.md)",
                rel.display()
            );
            continue;
        };
        checked += 1;
        for m in crate_modules(&code) {
            if !LAYERS.contains(&m.as_str()) {
                problems.push(format!(
                    "{}: names crate::{m}, which is no layer (re-exports at the crate root hide the layers)",
                    rel.display()
                ));
            } else if rank(&m) > rank(layer) {
                problems.push(format!(
                    "{}: the {layer} layer imports crate::{m}, a higher layer",
                    rel.display()
                ));
            }
        }
        // Job-side code reads job protocol and data types, never the agent's request types.
        if matches!(layer, "jobs" | "train") && crate_modules(&code).contains("api") {
            problems.push(format!(
                "{}: job-side code names crate::api (use model::data and jobs::protocol)",
                rel.display()
            ));
        }
        problems.extend(
            around_the_os(layer, &code)
                .into_iter()
                .map(|p| format!("{}: {p}", rel.display())),
        );
        if layer != "faces" {
            for c in FACE_CRATES {
                if code.contains(&format!("{c}::")) || code.contains(&format!("use {c}")) {
                    problems.push(format!(
                        "{}: only faces use {c} (the {layer} layer must not know a protocol)",
                        rel.display()
                    ));
                }
            }
        }
        // Sub-modules of this layer that this file imports.
        let comps: Vec<String> = rel
            .components()
            .map(|c| {
                c.as_os_str()
                    .to_string_lossy()
                    .trim_end_matches(".rs")
                    .to_string()
            })
            .collect();
        if comps.len() >= 2 {
            let me = comps[1].clone();
            let prefix = format!("crate::{layer}::");
            let deps = inner
                .entry(layer)
                .or_default()
                .entry(me.clone())
                .or_default();
            for (i, _) in code.match_indices(&prefix) {
                let sub: String = code[i + prefix.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let is_module = src.join(layer).join(format!("{sub}.rs")).is_file()
                    || src.join(layer).join(&sub).is_dir();
                if is_module && sub != me && me != "mod" {
                    deps.insert(sub);
                }
            }
        }
    }
    assert!(checked > 40, "the walk found only {checked} files");
    // No two sibling modules of one layer import each other (directly or through others).
    for (layer, graph) in &inner {
        for start in graph.keys() {
            let mut stack: Vec<&String> = graph[start].iter().collect();
            let mut seen = BTreeSet::new();
            while let Some(n) = stack.pop() {
                if n == start {
                    problems.push(format!("{layer}: {start} imports itself through {seen:?}"));
                    break;
                }
                if seen.insert(n.clone())
                    && let Some(next) = graph.get(n)
                {
                    stack.extend(next.iter());
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "layering broken:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_checker_sees_what_it_must_refuse() {
    // A test of the test: these must be found, or the check above proves nothing.
    let code = code_only(
        "use crate::{util::error::Error, faces::cli};\n// crate::os in a comment\nlet s = \"crate::campaign\";\nfn f() { crate::os::Study::open(p) }\n",
    );
    let m = crate_modules(&code);
    assert!(
        m.contains("util") && m.contains("faces") && m.contains("os"),
        "{m:?}"
    );
    assert!(!m.contains("campaign"), "strings are not imports: {m:?}");
    assert_eq!(layer_of(Path::new("record/index.rs")), Some("record"));
    assert_eq!(layer_of(Path::new("config.rs")), Some("config"));
    assert!(rank("faces") > rank("os") && rank("util") < rank("model"));
    // Above the OS nothing reaches the record: a campaign sorting by the index's helper, a face
    // or a benchmark opening the record or committing with git itself.
    assert!(
        !around_the_os(
            "campaign",
            "ids.sort_by_key(|id| crate::record::index::node_num(id));"
        )
        .is_empty()
    );
    assert!(
        !around_the_os(
            "faces",
            "use crate::record::Record;\nif let Ok(r) = Record::open(dir) {}"
        )
        .is_empty()
    );
    assert!(
        !around_the_os("bench", "let record = crate::record::Record::open(study)?;").is_empty()
    );
    assert!(!around_the_os("bench", "let sig = git2::Signature::now(a, b)?;").is_empty());
    assert!(
        around_the_os(
            "campaign",
            "ids.sort_by_key(|id| crate::model::node_num(id));"
        )
        .is_empty()
    );
    // Below the OS the record is fair game.
    assert!(around_the_os("os", "let r = crate::record::Record::open(root)?;").is_empty());
    assert!(rank("bench") > rank("campaign") && rank("bench") < rank("faces"));
}

/// The command line stays a folder a newcomer can read: no file of it reaches 600 lines (the
/// grammar, the routing, the printers and the commands each in their own).
#[test]
fn no_file_of_the_command_line_reaches_600_lines() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/faces/cli");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    assert!(files.len() >= 5, "src/faces/cli holds its files: {files:?}");
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).expect("read").lines().count();
            (n >= 600).then(|| format!("{} ({n} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these: {long:?}");
    assert!(
        !Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/faces/cli.rs")
            .exists(),
        "faces/cli.rs is a folder now"
    );
}
