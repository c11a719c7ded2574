//! The language server in memory: JSON-RPC frames over a pipe, as an editor sends them.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, DuplexStream};

use super::*;

struct Editor {
    to: DuplexStream,
    from: BufReader<DuplexStream>,
    next: i64,
    /// Notifications received while waiting for responses.
    notes: Vec<Value>,
}

impl Editor {
    fn start(root: Option<PathBuf>) -> Editor {
        let (client_to, server_in) = tokio::io::duplex(1 << 20);
        let (server_out, client_from) = tokio::io::duplex(1 << 20);
        tokio::spawn(serve(
            server_in,
            server_out,
            Options {
                root,
                caller: Caller::owner(),
            },
        ));
        Editor {
            to: client_to,
            from: BufReader::new(client_from),
            next: 1,
            notes: Vec::new(),
        }
    }

    async fn raw(&mut self, body: &[u8]) {
        let head = format!("Content-Length: {}\r\n\r\n", body.len());
        self.to.write_all(head.as_bytes()).await.expect("write");
        self.to.write_all(body).await.expect("write");
    }

    async fn send(&mut self, v: Value) {
        self.raw(v.to_string().as_bytes()).await;
    }

    async fn read(&mut self) -> Value {
        let mut len = 0usize;
        loop {
            let mut line = String::new();
            self.from.read_line(&mut line).await.expect("read");
            let l = line.trim();
            if l.is_empty() {
                break;
            }
            if let Some(n) = l.strip_prefix("Content-Length:") {
                len = n.trim().parse().expect("length");
            }
        }
        let mut body = vec![0; len];
        self.from.read_exact(&mut body).await.expect("body");
        serde_json::from_slice(&body).expect("json")
    }

    /// Read until `pred` holds for a message (answering the server's own requests).
    async fn until(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.notes.iter().position(&pred) {
            return self.notes.remove(i);
        }
        let fut = async {
            loop {
                let m = self.read().await;
                if pred(&m) {
                    return m;
                }
                if m.get("method").is_some() && m.get("id").is_some() {
                    let id = m["id"].clone();
                    self.send(json!({"jsonrpc": "2.0", "id": id, "result": null}))
                        .await;
                } else if m.get("method").is_some() {
                    self.notes.push(m);
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), fut)
            .await
            .expect("no answer within 60 s")
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        self.until(|m| m["id"] == id && m.get("method").is_none())
            .await
    }

    async fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}))
            .await;
    }

    async fn initialize(&mut self, folder: Option<&Path>) {
        let folders = folder.map(
            |f| json!([{ "uri": Uri::from_file_path(f).expect("uri").as_str(), "name": "study" }]),
        );
        let r = self
            .request(
                "initialize",
                json!({ "processId": null, "capabilities": {}, "workspaceFolders": folders }),
            )
            .await;
        assert!(r["result"]["capabilities"]["hoverProvider"] == true, "{r}");
        self.notify("initialized", json!({})).await;
    }

    async fn open(&mut self, uri: &str, text: &str) {
        self.notify(
            "textDocument/didOpen",
            json!({"textDocument": {"uri": uri, "languageId": "x", "version": 1, "text": text}}),
        )
        .await;
    }
}

fn example_study() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().expect("tempdir");
    let root = d.path().join("study");
    crate::faces::init::init(&root, Some("tiny-arith-ngram")).expect("init");
    (d, root)
}

const BAD_TOML: &str = "[study]\nname = \"t\"\ncolour = 3\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_study_the_config_is_still_checked_and_requests_get_a_clear_error() {
    let d = tempfile::tempdir().expect("tempdir");
    let mut e = Editor::start(None);
    e.initialize(Some(d.path())).await;
    // The editor is told why there is no study, and the setting that fixes it.
    let msg = e.until(|m| m["method"] == "window/showMessage").await;
    assert!(
        msg["params"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no rsim study") && m.contains("rsim.studyFolder")),
        "{msg}"
    );
    let uri = Uri::from_file_path(d.path().join("rsim.toml")).expect("uri");
    e.open(uri.as_str(), BAD_TOML).await;
    let diags = e
        .until(|m| m["method"] == "textDocument/publishDiagnostics")
        .await;
    let d0 = &diags["params"]["diagnostics"][0];
    assert_eq!(d0["range"]["start"], json!({"line": 2, "character": 0}));
    assert_eq!(d0["range"]["end"], json!({"line": 2, "character": 6}));
    assert!(
        d0["message"]
            .as_str()
            .is_some_and(|m| m.contains("unknown field `colour`"))
    );
    // Hover and completion in rsim.toml need no study.
    let h = e
        .request(
            "textDocument/hover",
            json!({"textDocument": {"uri": uri.as_str()}, "position": {"line": 1, "character": 1}}),
        )
        .await;
    assert!(
        h["result"]["contents"]["value"]
            .as_str()
            .is_some_and(|v| v.contains("study.name")),
        "{h}"
    );
    let r = e.request("rsim/dag", json!({})).await;
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no rsim study")),
        "{r}"
    );
    // A document larger than the bound is not kept, and says so.
    let big = "#".repeat(MAX_DOCUMENT_BYTES + 1);
    e.open(uri.as_str(), &big).await;
    let diags = e
        .until(|m| m["method"] == "textDocument/publishDiagnostics")
        .await;
    assert!(
        diags["params"]["diagnostics"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("larger than"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_and_unknown_requests_get_errors_and_the_server_keeps_serving() {
    let mut e = Editor::start(None);
    e.initialize(None).await;
    e.raw(b"{not json").await;
    let parse = e.until(|m| m.get("error").is_some()).await;
    assert_eq!(parse["error"]["code"], -32700, "{parse}");
    let r = e.request("rsim/nonesuch", json!({})).await;
    assert_eq!(r["error"]["code"], -32601, "{r}");
    let r = e.request("rsim/node", json!([1, 2])).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    for uri in [
        "rsim://node/../..",
        "file:///etc/passwd",
        "rsim://node/n1/../../x",
    ] {
        let r = e.request("rsim/nodeDocument", json!({ "uri": uri })).await;
        assert_eq!(r["error"]["code"], -32602, "{uri}: {r}");
    }
    let r = e
        .request(
            "workspace/executeCommand",
            json!({"command": "rsim.delete_everything", "arguments": [{}]}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let r = e
        .request(
            "workspace/executeCommand",
            json!({"command": "rsim.branch", "arguments": ["n0", "x"]}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    // Still serving.
    let r = e.request("shutdown", Value::Null).await;
    assert!(r.get("error").is_none(), "{r}");
}

/// VS Code sends `initialized` and its first queries at once, and they run concurrently: each
/// once opened a session of its own, the last replaced the others, and the watcher started on a
/// replaced one died with it, so a change written by another process was never notified
/// (a CI run caught it). One session, watched from the moment it opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_by_another_writer_are_notified_when_the_first_requests_race_the_open() {
    let (_d, root) = example_study();
    let mut e = Editor::start(None);
    e.initialize(Some(&root)).await;
    let first = e.next;
    for i in 0..8 {
        let id = first + i;
        e.send(json!({"jsonrpc": "2.0", "id": id, "method": "rsim/summary", "params": {}}))
            .await;
    }
    e.next += 8;
    // The answers come in any order.
    let mut answered = 0;
    while answered < 8 {
        let r = e
            .until(|m| m.get("id").is_some() && m.get("method").is_none())
            .await;
        assert!(r["result"]["nodes"].is_array(), "{r}");
        answered += 1;
    }
    e.notes.clear();
    // Another writer (another process, in effect: a session of its own) branches a node.
    let other = root.clone();
    let r = tokio::task::spawn_blocking(move || {
        Session::open(&other)?.call(
            &Caller::owner(),
            "branch",
            json!({"parents": ["n0"], "title": "written elsewhere"}),
        )
    })
    .await
    .expect("join")
    .expect("branch");
    assert_eq!(r["node"], "n1", "{r}");
    e.until(|m| m["method"] == "rsim/recordChanged").await;
    let s = e.request("rsim/summary", json!({})).await;
    assert_eq!(
        s["result"]["nodes"].as_array().map(Vec::len),
        Some(2),
        "{s}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_hover_resolve_and_change_through_the_session_and_changes_are_notified() {
    let (_d, root) = example_study();
    let mut e = Editor::start(None);
    e.initialize(Some(&root)).await;
    let notes = Uri::from_file_path(root.join("NOTES.md")).expect("uri");
    e.open(notes.as_str(), "Start from n0, not n77.\n").await;
    let h = e
        .request(
            "textDocument/hover",
            json!({"textDocument": {"uri": notes.as_str()}, "position": {"line": 0, "character": 12}}),
        )
        .await;
    let v = h["result"]["contents"]["value"]
        .as_str()
        .unwrap_or_default();
    assert!(v.contains("**n0**") && v.contains("runs: 0"), "{h}");
    assert_eq!(h["result"]["range"]["start"]["character"], 11);
    // A node id that names no node: no hover, no definition.
    let h = e
        .request(
            "textDocument/hover",
            json!({"textDocument": {"uri": notes.as_str()}, "position": {"line": 0, "character": 20}}),
        )
        .await;
    assert_eq!(h["result"], Value::Null, "{h}");
    let d = e
        .request(
            "textDocument/definition",
            json!({"textDocument": {"uri": notes.as_str()}, "position": {"line": 0, "character": 12}}),
        )
        .await;
    assert_eq!(d["result"]["uri"], "rsim://node/n0", "{d}");
    let doc = e
        .request("rsim/nodeDocument", json!({ "uri": "rsim://node/n0" }))
        .await;
    assert!(
        doc["result"]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("# n0")),
        "{doc}"
    );
    // An owner command is an action like any other: recorded, and the change is notified.
    let r = e
        .request(
            "workspace/executeCommand",
            json!({"command": "rsim.branch", "arguments": [{"parents": ["n0"], "title": "from the editor"}]}),
        )
        .await;
    assert_eq!(r["result"]["node"], "n1", "{r}");
    e.until(|m| m["method"] == "rsim/recordChanged").await;
    let log = e.request("rsim/log", json!({ "node": "n1" })).await;
    assert_eq!(log["result"]["actions"][0]["action"], "branch", "{log}");
    // Validation is the core's: an unknown field is refused and nothing is written.
    let r = e
        .request(
            "workspace/executeCommand",
            json!({"command": "rsim.branch", "arguments": [{"parents": ["n0"], "title": "x", "force": true}]}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let sym = e
        .request("workspace/symbol", json!({ "query": "editor" }))
        .await;
    assert_eq!(sym["result"].as_array().map(Vec::len), Some(1), "{sym}");
    let s = e.request("rsim/summary", json!({})).await;
    assert_eq!(
        s["result"]["nodes"].as_array().map(Vec::len),
        Some(2),
        "{s}"
    );
    let c = e
        .request("rsim/compare", json!({ "nodes": ["n0", "n1"] }))
        .await;
    assert_eq!(
        c["result"]["nodes"].as_array().map(Vec::len),
        Some(2),
        "{c}"
    );
    let d = e.request("rsim/dag", json!({ "expand": ["n0"] })).await;
    assert_eq!(d["result"]["total"], 2, "{d}");
    let d = e.request("rsim/dag", json!({ "expand": ["../x"] })).await;
    assert_eq!(d["error"]["code"], -32602, "{d}");
    let j = e
        .request("rsim/jobLog", json!({ "job": "../../etc" }))
        .await;
    assert!(j.get("error").is_some(), "{j}");
}
