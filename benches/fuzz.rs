//! `cargo bench --bench fuzz`: ≥ 100k fuzz cases against the action API (see tests/fuzz.rs).

#[path = "../tests/fuzz_support.rs"]
mod fuzz_support;

use proptest::test_runner::{Config, TestRunner};
use rsi_master::model::Caller;

fn main() {
    let cases: u32 = std::env::var("RSIM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let d = std::env::temp_dir().join(format!("rsim-fuzz-{}", std::process::id()));
    let root = d.join("study");
    rsi_master::init::init(&root, Some("tiny-arith")).expect("init");
    let mut study = rsi_master::Study::open(&root).expect("open");
    // Jobs run the rsim binary next to this bench (cargo builds it for benches too).
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent().and_then(|p| p.parent())
    {
        study.set_rsim_bin(dir.join("rsim"));
    }
    let t = std::time::Instant::now();
    let (ok, err, empty) = (
        std::cell::Cell::new(0u64),
        std::cell::Cell::new(0u64),
        std::cell::Cell::new(0u64),
    );
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&fuzz_support::arb_request(), |(action, args)| {
            match study.call(&Caller::owner(), &action, args) {
                Ok(_) => ok.set(ok.get() + 1),
                Err(e) if e.message.trim().is_empty() => empty.set(empty.get() + 1),
                Err(_) => err.set(err.get() + 1),
            }
            Ok(())
        })
        .expect("no panics");
    let (ok, err, empty) = (ok.get(), err.get(), empty.get());
    let rep = rsi_master::fsck::fsck(&study).expect("fsck");
    println!(
        "fuzz: {cases} cases in {:.1} s: {ok} accepted, {err} clear errors, {empty} empty errors, {} record problems",
        t.elapsed().as_secs_f64(),
        rep.problems.len()
    );
    let _ = std::fs::remove_dir_all(&d);
    let _ = fuzz_support::empty_object();
    assert!(empty == 0 && rep.problems.is_empty());
}
