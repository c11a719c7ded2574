//! What the benchmarks share: an `rsim serve` on a free loopback port.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// `rsim -C study serve --http 127.0.0.1:0 --agents AGENTS`, and its MCP URL once it listens
/// (its stderr is drained after that).
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
