//! The web face through its public inputs: a real `rsim serve` answered over raw HTTP (hostile
//! text, unknown and malformed node ids, path traversal in asset URLs, cross-origin and
//! oversized writes, a foreign Host, bad tokens), the static report's escaping and CSP, and the
//! bound on event streams (1,000 open, the next refused, all freed when their clients leave).
//! The browser's view of the same page is tools/web.sh (headless Chromium).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common::{example_study, rsim, run, run_ok};

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(study: &std::path::Path, extra: &[&str]) -> Server {
    let mut child = rsim()
        .arg("-C")
        .arg(study)
        .args(["serve", "--http", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rsim serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let line = lines.next().expect("serve exited").expect("stderr");
        if let Some(u) = line.strip_prefix("rsim: the web page is at http://") {
            break u.trim().trim_end_matches('/').to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Server { child, addr }
}

struct Resp {
    status: u16,
    head: String,
    body: String,
}

/// One request as raw bytes (Connection: close), the whole answer.
fn raw(addr: &str, req: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).ok();
    let _ = s.write_all(req);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Resp {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_string(),
    }
}

fn get(addr: &str, path: &str) -> Resp {
    raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
}

fn post(addr: &str, path: &str, headers: &str, body: &[u8]) -> Resp {
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n{headers}\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    raw(addr, &req)
}

fn json(r: &Resp) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.body))
}

const HOSTILE: &str =
    "\"><img src=x onerror=alert(1)><script>alert(2)</script> javascript:alert(3)";

#[test]
fn the_page_escapes_agent_text_and_answers_hostile_requests_clearly() {
    let (_d, study) = example_study();
    run_ok(
        &study,
        &[
            "--role",
            "worker",
            "branch",
            "--from",
            "n0",
            "--title",
            HOSTILE,
            "--hypothesis",
            "<script>alert(4)</script>",
        ],
    );
    // A study with no campaign yet: the page and every view answer.
    let srv = serve(&study, &[]);
    let a = srv.addr.as_str();
    let page = get(a, "/");
    assert_eq!(page.status, 200);
    assert!(
        page.head
            .contains("content-security-policy: default-src 'none'; script-src 'self'")
    );
    assert!(page.head.contains("x-frame-options: deny"));
    assert!(!page.body.contains("<script>"), "no inline script");
    for p in [
        "/api/dag",
        "/api/overview",
        "/api/me",
        "/api/node/n0",
        "/api/compare?nodes=n0",
    ] {
        assert_eq!(get(a, p).status, 200, "{p}");
    }
    let dag = json(&get(a, "/api/dag"));
    assert_eq!(dag["total"], 2);
    assert_eq!(
        dag["nodes"][1]["title"], HOSTILE,
        "stored and served verbatim as JSON"
    );
    let me = json(&get(a, "/api/me"));
    assert_eq!(me["role"], "observer");

    // Unknown, malformed and traversing ids and paths.
    let r = get(a, "/api/node/n999");
    assert_eq!(r.status, 404);
    assert!(
        json(&r)["error"]
            .as_str()
            .is_some_and(|e| e.contains("no node n999"))
    );
    for p in [
        "/api/node/..%2f..%2fetc%2fpasswd",
        "/api/node/n1%00",
        "/api/node/N1",
        "/api/dag?expand=n1,../x",
        "/api/compare?nodes=",
    ] {
        let r = get(a, p);
        assert!(r.status == 400, "{p}: {} {}", r.status, r.body);
    }
    let many: Vec<String> = (0..1001).map(|i| format!("n{i}")).collect();
    assert_eq!(
        get(a, &format!("/api/dag?expand={}", many.join(","))).status,
        400
    );
    for p in [
        "/assets/../Cargo.toml",
        "/assets/..%2f..%2fCargo.toml",
        "/assets/%2e%2e/Cargo.toml",
        "/assets/app.js/..",
        "/assets/",
        "/assets/app.js%00",
        "/../Cargo.toml",
        "/api/log/..%2f..%2fsecret",
    ] {
        let r = get(a, p);
        assert!(
            matches!(r.status, 400 | 404),
            "{p}: {} {}",
            r.status,
            r.body
        );
        assert!(!r.body.contains("[package]"), "{p} leaked a file");
    }
    assert_eq!(get(a, "/assets/dag.js").status, 200);

    // Writes: only from this page's origin, only JSON, bounded, through the policy.
    let origin = format!("Origin: http://{a}\r\n");
    let ct = "Content-Type: application/json\r\n";
    let body = br#"{"node":"n1","outcome":"positive","findings":"x"}"#;
    assert_eq!(
        post(a, "/api/call/conclude", ct, body).status,
        403,
        "no Origin"
    );
    assert_eq!(
        post(
            a,
            "/api/call/conclude",
            &format!("Origin: http://evil.example\r\n{ct}"),
            body
        )
        .status,
        403
    );
    assert_eq!(
        post(
            a,
            "/api/call/conclude",
            &format!("{origin}Content-Type: text/plain\r\n"),
            body
        )
        .status,
        415
    );
    let r = post(
        a,
        "/api/call/conclude",
        &format!("{origin}{ct}"),
        b"{not json",
    );
    assert_eq!(r.status, 400);
    let r = post(
        a,
        "/api/call/no_such_action",
        &format!("{origin}{ct}"),
        b"{}",
    );
    assert_eq!(r.status, 404);
    let huge = vec![b'x'; 2 << 20];
    let r = post(a, "/api/call/conclude", &format!("{origin}{ct}"), &huge);
    assert!(matches!(r.status, 413 | 0), "{}", r.status);
    let r = post(a, "/api/call/conclude", &format!("{origin}{ct}"), body);
    assert_eq!(r.status, 403, "an observer may not write: {}", r.body);
    assert_eq!(json(&r)["rule"], "role");
    // The refusal is recorded like any agent's.
    let audit = crate::common::ok_json(&study, &["audit"]);
    assert_eq!(audit["rejections_by_rule"]["role"], 1, "{audit}");

    // A foreign Host (DNS rebinding to a loopback server) and oversized headers.
    let r = raw(
        a,
        b"GET /api/dag HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 403);
    let big = format!(
        "GET / HTTP/1.1\r\nHost: {a}\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let r = raw(a, big.as_bytes());
    assert_ne!(r.status, 200);
    let r = raw(a, b"\x00\x01garbage\r\n\r\n");
    assert_ne!(r.status, 200);
    assert_eq!(get(a, "/api/me").status, 200, "the server keeps serving");

    // The static report: agent text only inside the JSON data block, escaped; hashed script.
    let out = study.join("..").join("report.html");
    run_ok(&study, &["report", "--html", out.to_str().expect("utf-8")]);
    let html = std::fs::read_to_string(&out).expect("report");
    assert!(!html.contains("<img src=x"));
    assert!(!html.contains("<script>alert"));
    assert_eq!(
        html.matches("<script").count(),
        2,
        "the data block and the module"
    );
    assert!(html.contains("script-src 'sha256-"));
    assert!(html.contains(r"\u003cimg src=x onerror=alert(1)\u003e"));
}

#[test]
fn tokens_sign_in_with_a_strict_cookie_and_refuse_everything_else() {
    let (d, study) = example_study();
    let tokens = d.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[agent]]\nname = \"lead\"\nrole = \"reviewer\"\ntoken = \"a-right-token-0123456789\"\n",
    )
    .expect("tokens");
    let srv = serve(&study, &["--tokens", tokens.to_str().expect("utf-8")]);
    let a = srv.addr.as_str();
    let r = get(a, "/");
    assert_eq!(r.status, 200);
    assert!(r.body.contains("name=\"token\""), "the sign-in form");
    assert_eq!(get(a, "/api/dag").status, 401);
    let origin =
        format!("Origin: http://{a}\r\nContent-Type: application/x-www-form-urlencoded\r\n");
    let r = post(a, "/login", &origin, b"token=wrong-token-0123456789");
    assert_eq!(r.status, 401);
    assert!(!r.head.contains("set-cookie"));
    let r = post(
        a,
        "/login",
        "Content-Type: application/x-www-form-urlencoded\r\n",
        b"token=a-right-token-0123456789",
    );
    assert_eq!(r.status, 403, "a sign-in must come from the page");
    let r = post(a, "/login", &origin, b"token=a-right-token-0123456789");
    assert_eq!(r.status, 303);
    let cookie = r
        .head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .expect("a cookie")
        .to_string();
    assert!(cookie.contains("httponly") && cookie.contains("samesite=strict"));
    let value = cookie.split(';').next().expect("value").to_string();
    let with = |p: &str| {
        raw(
            a,
            format!(
                "GET {p} HTTP/1.1\r\nHost: {a}\r\nCookie: {value}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
    };
    let me = with("/api/me");
    assert_eq!(me.status, 200);
    assert_eq!(json(&me)["role"], "reviewer");
    assert_eq!(json(&me)["agent"], "lead");
    // A forged or garbled cookie is no one.
    let r = raw(
        a,
        format!("GET /api/me HTTP/1.1\r\nHost: {a}\r\nCookie: rsim_token=zz%%\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    assert_eq!(r.status, 401);
    // The cookie alone does not write from another site.
    let r = raw(
        a,
        format!("POST /api/call/conclude HTTP/1.1\r\nHost: {a}\r\nCookie: {value}\r\nOrigin: http://evil.example\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}").as_bytes(),
    );
    assert_eq!(r.status, 403);
    // A bearer token works for scripts; a wrong one is refused.
    let r = raw(
        a,
        format!("GET /api/me HTTP/1.1\r\nHost: {a}\r\nAuthorization: Bearer nope-nope-nope-nope\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    assert_eq!(r.status, 401);
    let _ = run(&study, &["log"]);
}

#[test]
fn a_thousand_event_streams_are_served_the_next_refused_and_all_freed() {
    use rsi_master::faces::web::{MAX_EVENT_STREAMS, Web, WebAuth, router};
    let (_d, study) = example_study();
    rsi_master::faces::mcp::limits::raise_fd_limit();
    let session =
        std::sync::Arc::new(rsi_master::os::session::Session::open(&study).expect("session"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let web = Web::new(session, WebAuth::Observer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(axum::serve(listener, router(web.clone())).into_future());
        let open = |addr: String| async move {
            let mut s = tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect");
            let req = format!("GET /api/events HTTP/1.1\r\nHost: {addr}\r\n\r\n");
            s.write_all(req.as_bytes()).await.expect("write");
            let mut buf = vec![0u8; 1024];
            let mut got = String::new();
            while !got.contains("\r\n\r\n")
                || (got.contains(" 200 ") && !got.contains("event: change"))
            {
                let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf))
                    .await
                    .expect("answer in time")
                    .expect("read");
                if n == 0 {
                    break;
                }
                got.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            (s, got)
        };
        let mut streams = Vec::new();
        for _ in 0..MAX_EVENT_STREAMS {
            let (s, got) = open(addr.clone()).await;
            assert!(
                got.contains(" 200 ") && got.contains("text/event-stream"),
                "{got}"
            );
            streams.push(s);
        }
        assert_eq!(web.open_streams(), MAX_EVENT_STREAMS);
        let (_s, got) = open(addr.clone()).await;
        assert!(got.contains(" 503 "), "one past the bound: {got}");
        // Clients that go away free their places: no stream outlives its client.
        streams.clear();
        let t = std::time::Instant::now();
        while web.open_streams() > 0 {
            assert!(t.elapsed() < Duration::from_secs(20), "streams leak");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (_s, got) = open(addr.clone()).await;
        assert!(got.contains(" 200 "), "{got}");
    });
}

#[test]
fn a_flood_of_overview_requests_runs_the_audit_once_per_change_of_the_record() {
    use rsi_master::faces::web::{Web, WebAuth, router};
    let (_d, study) = example_study();
    let session =
        std::sync::Arc::new(rsi_master::os::session::Session::open(&study).expect("session"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let web = Web::new(session, WebAuth::Observer);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    rt.spawn(axum::serve(listener, router(web.clone())).into_future());
    let attempts = |r: &Resp| json(r)["audit"]["attempts"].as_u64().expect("attempts");
    // Forty requests at once, on one state of the record: one audit answers all of them.
    let answers: Vec<Resp> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..40)
            .map(|_| sc.spawn(|| get(&addr, "/api/overview")))
            .collect();
        hs.into_iter().map(|h| h.join().expect("request")).collect()
    });
    assert!(answers.iter().all(|r| r.status == 200));
    let before = attempts(&answers[0]);
    assert!(answers.iter().all(|r| attempts(r) == before));
    assert_eq!(web.overviews_made(), 1, "one audit for forty requests");
    // A recorded action moves the record: the next request sees it (the cache is not stale).
    run_ok(
        &study,
        &[
            "--role",
            "worker",
            "branch",
            "--from",
            "n0",
            "--title",
            "t",
            "--hypothesis",
            "h",
        ],
    );
    let t = std::time::Instant::now();
    loop {
        let r = get(&addr, "/api/overview");
        assert_eq!(r.status, 200);
        if attempts(&r) > before {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the overview never showed the new action"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(web.overviews_made() >= 2);
    rt.shutdown_background();
}
