//! `cargo bench --bench fuzz`: ≥ 100k fuzz cases against the action API (see tests/fuzz.rs).
//! Cases run in rounds of 5,000 on a fresh study each, so the record stays the size a real study
//! has and the run measures input handling rather than one node collecting tens of thousands of actions.

#[path = "../tests/all/fuzz_support.rs"]
mod fuzz_support;

use std::cell::Cell;

use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use rsi_master::model::Caller;

fn main() {
    let cases: u32 = std::env::var("RSIM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let round = 5_000u32;
    let d = std::env::temp_dir().join(format!("rsim-fuzz-{}", std::process::id()));
    let t = std::time::Instant::now();
    let (ok, err, empty) = (Cell::new(0u64), Cell::new(0u64), Cell::new(0u64));
    let mut problems = 0usize;
    let mut done = 0u32;
    let mut r = 0u64;
    while done < cases {
        let n = round.min(cases - done);
        let root = d.join(format!("study-{r}"));
        rsi_master::faces::init::init(&root, Some("tiny-arith-ngram")).expect("init");
        let mut study = rsi_master::Study::open(&root).expect("open");
        if let Ok(exe) = std::env::current_exe()
            && let Some(dir) = exe.parent().and_then(|p| p.parent())
        {
            study.set_rsim_bin(dir.join("rsim"));
        }
        let config = Config {
            cases: n,
            failure_persistence: None,
            ..Config::default()
        };
        let seed: [u8; 32] =
            std::array::from_fn(|i| (r as u8).wrapping_mul(31).wrapping_add(i as u8));
        let mut runner =
            TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
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
        problems += rsi_master::os::fsck::fsck(&study)
            .expect("fsck")
            .problems
            .len();
        drop(study);
        let _ = std::fs::remove_dir_all(&root);
        done += n;
        r += 1;
    }
    println!(
        "fuzz: {cases} cases in {:.1} s ({r} studies): {} accepted, {} clear errors, {} empty errors, {problems} record problems",
        t.elapsed().as_secs_f64(),
        ok.get(),
        err.get(),
        empty.get()
    );
    let _ = std::fs::remove_dir_all(&d);
    let _ = fuzz_support::empty_object();
    assert!(empty.get() == 0 && problems == 0);
}
