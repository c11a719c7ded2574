//! What the benchmarks share: a tiny-arith-ngram study with the owner's settings committed, and
//! an `rsim serve` on a free loopback port.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// `rsim -C study serve --http 127.0.0.1:0 --agents AGENTS`, and its MCP URL once it listens
/// (its stderr is drained after that).
#[allow(dead_code)]
pub fn serve(study: &Path, agents: &str) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rsim"))
        .arg("-C")
        .arg(study)
        .env_remove("RSIM_STUDY")
        .args(["serve", "--http", "127.0.0.1:0", "--agents", agents])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rsim serve");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let url = loop {
        let l = lines.next().expect("server exited").expect("stderr");
        if let Some(u) = l.strip_prefix("rsim: listening on ") {
            break u.trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, url)
}

/// `rsim init NAME --example tiny-arith-ngram` under `base`, then `edit` applied to its
/// `rsim.toml` and committed by the owner with `why` as the message.
#[allow(dead_code)]
pub fn example_study(
    base: &Path,
    name: &str,
    edit: impl FnOnce(String) -> String,
    why: &str,
) -> std::path::PathBuf {
    let s = base.join(name);
    let out = Command::new(env!("CARGO_BIN_EXE_rsim"))
        .arg("init")
        .arg(&s)
        .args(["--example", "tiny-arith-ngram"])
        .env_remove("RSIM_STUDY")
        .output()
        .expect("init");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = std::fs::read_to_string(s.join("rsim.toml")).expect("config");
    std::fs::write(s.join("rsim.toml"), edit(config)).expect("config");
    let git = Command::new("git")
        .arg("-C")
        .arg(&s)
        .args([
            "-c",
            "user.name=owner",
            "-c",
            "user.email=owner@example.invalid",
        ])
        .args(["commit", "-qam", why])
        .status()
        .expect("git");
    assert!(git.success());
    s
}
