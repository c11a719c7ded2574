//! Fuzz the action inputs (a small run: 1,000 cases, a fresh seed each run, RSIM_FUZZ_CASES for
//! more; `cargo bench --bench fuzz` runs ≥ 100k cases):
//! whatever JSON arrives, the Experiment OS never panics and every error says what was wrong.

use crate::fuzz_support;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rsi_master::model::Caller;

#[test]
fn random_requests_never_panic_and_errors_are_clear() {
    let d = tempfile::tempdir().expect("tempdir");
    let root = d.path().join("study");
    rsi_master::faces::init::init(&root, Some("tiny-arith-ngram")).expect("init");
    let mut study = rsi_master::Study::open(&root).expect("open");
    study.set_rsim_bin(std::path::PathBuf::from(env!("CARGO_BIN_EXE_rsim")));
    let cases: u32 = std::env::var("RSIM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let (ok, err) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
    runner
        .run(&fuzz_support::arb_request(), |(action, args)| {
            match study.call(&Caller::owner(), &action, args) {
                Ok(_) => ok.set(ok.get() + 1),
                Err(e) => {
                    err.set(err.get() + 1);
                    prop_assert!(
                        !e.message.trim().is_empty(),
                        "empty error message for {action}"
                    );
                }
            }
            Ok(())
        })
        .expect("no failures");
    let (ok, err) = (ok.get(), err.get());
    eprintln!("fuzz: {cases} cases, {ok} accepted, {err} errors");
    assert!(
        ok > 0 && err > 0,
        "the generator must reach both outcomes ({ok} ok, {err} errors)"
    );
    let rep = rsi_master::os::fsck::fsck(&study).expect("fsck");
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    let _ = fuzz_support::empty_object();
}
