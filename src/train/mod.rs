//! The embedded job programs behind the tiny-arith example: `rsim job train SPEC` and
//! `rsim job eval SPEC`. They run as separate processes, exactly like any other configured job
//! command, and read/write only the spec, the object-store files it names and `out/`.
//!
//! The model is a count-based character n-gram language model with back-off (orders 10, 6, 4,
//! 2, 1): small, deterministic and real — it learns only from the rows it is trained on (it
//! memorises problems rather than discovering carries). The embedded transformer trainer
//! replaces it as the default model.

pub mod behaviour;
pub mod code_tasks;
pub mod datasets;
pub mod gpt;
pub mod programs;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::Path;

use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};

use crate::jobs::protocol::{self, CheckpointRef, EvalParams, EvalResult, SftParams, TrainMetrics};
use crate::model::data::{Adapter, EvalItem, Row, Schedule, prompt_chars, training_text};
use crate::train::datasets::{parse_answer, parse_jsonl};
use crate::util::error::{Error, IoContext, Result};

const ORDERS: [usize; 5] = [10, 6, 4, 2, 1];
const END: char = '\n';
const MAX_OUTPUT: usize = 64;
pub const MODEL_FILE: &str = "ngram.json";
pub use crate::model::paths::CHECKPOINT_CONFIG_FILE as CONFIG_FILE;

/// The model: for each context (a suffix of the text so far), weighted next-character counts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NGram {
    pub counts: BTreeMap<String, BTreeMap<char, f64>>,
}

impl NGram {
    fn observe(&mut self, text: &[char], pos: usize, weight: f64) {
        for &k in &ORDERS {
            let start = pos.saturating_sub(k);
            let ctx: String = text[start..pos].iter().collect();
            *self
                .counts
                .entry(ctx)
                .or_default()
                .entry(text[pos])
                .or_insert(0.0) += weight;
        }
    }

    /// Learn one row; with `answer_only` only answer characters (and the end marker) are targets.
    pub fn learn(&mut self, row: &Row, weight: f64, answer_only: bool) {
        let text: Vec<char> = training_text(row).chars().chain([END]).collect();
        let first = if answer_only { prompt_chars(row) } else { 1 };
        for pos in first.max(1)..text.len() {
            self.observe(&text, pos, weight);
        }
    }

    /// The character it would predict after `text` (the longest known context), if any.
    fn predict(&self, text: &[char]) -> Option<char> {
        ORDERS.iter().find_map(|&k| {
            let ctx: String = text[text.len().saturating_sub(k)..].iter().collect();
            self.counts.get(&ctx).map(|c| {
                c.iter()
                    .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(a.0)))
                    .map(|(ch, _)| *ch)
            })
        })?
    }

    /// Share of a row's target characters it would get wrong before learning it (its
    /// prequential error): the n-gram trainer's loss.
    pub fn error_rate(&self, row: &Row, answer_only: bool) -> f64 {
        let text: Vec<char> = training_text(row).chars().chain([END]).collect();
        let first = if answer_only { prompt_chars(row) } else { 1 }.max(1);
        let targets = text.len().saturating_sub(first);
        if targets == 0 {
            return 0.0;
        }
        let wrong = (first..text.len())
            .filter(|&pos| self.predict(&text[..pos]) != Some(text[pos]))
            .count();
        wrong as f64 / targets as f64
    }

    /// Greedy decoding from a prompt, backing off to shorter contexts.
    pub fn generate(&self, prompt: &str) -> String {
        let mut text: Vec<char> = prompt.chars().collect();
        let mut out = String::new();
        for _ in 0..MAX_OUTPUT {
            let next = self.predict(&text);
            match next {
                Some(END) | None => break,
                Some(ch) => {
                    out.push(ch);
                    text.push(ch);
                }
            }
        }
        out
    }
}

fn load_model(ck: &CheckpointRef) -> Result<NGram> {
    let path = ck.file(MODEL_FILE)?;
    let bytes = fs::read(path).at("cannot read", path)?;
    serde_json::from_slice(&bytes).map_err(|e| Error::invalid(format!("{}: {e}", path.display())))
}

fn save_model(model: &NGram, dir: &Path, config: serde_json::Value) -> Result<()> {
    fs::create_dir_all(dir).at("cannot create", dir)?;
    fs::write(dir.join(MODEL_FILE), serde_json::to_vec(model)?).at("cannot write", dir)?;
    fs::write(
        dir.join(CONFIG_FILE),
        crate::util::hash::json_bytes(&config)?,
    )
    .at("cannot write", dir)?;
    Ok(())
}

/// The `model` field of a checkpoint's config.json: which embedded model it is.
fn model_kind(ck: &CheckpointRef) -> Result<String> {
    let path = ck.file(CONFIG_FILE)?;
    let v: serde_json::Value = serde_json::from_slice(&fs::read(path).at("cannot read", path)?)
        .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
    v["model"].as_str().map(str::to_string).ok_or_else(|| {
        Error::invalid(format!(
            "checkpoint {}: {CONFIG_FILE} names no model",
            ck.sha256
        ))
    })
}

/// The multiply-adds below which a matrix product runs on one thread even when the job has more
/// (gemm's own default is 48·48·256 ≈ 0.6 M). Measured on this project's 2-core machine (candle's
/// matmul, one thread against two, three interleaved runs): at 416×64×256 (6.8 M, the tiny-gpt's
/// largest product at batch 32) two threads took as long or longer (136–180 µs against 155–185);
/// at 1000×128×128 (16 M) they took 180–274 µs against 318–414, and at 2000×256×256 (131 M) half the
/// time. Waking a second thread for a product that small costs more than it saves: the tiny-gpt
/// trained slower on two threads than on one (`rsim bench-step`) until products this small
/// stayed on one.
pub const GEMM_THREADING_THRESHOLD: usize = 8 << 20;

/// What a job process sets first. Threads: the job's threads come from its backend
/// (`RAYON_NUM_THREADS`, which candle's matmuls use; see `jobs::THREAD_VARS`); the trainer uses
/// them by splitting each batch into as many pieces (`TrainHyper::shards`), so candle's own
/// element-wise pool (`CANDLE_NUM_THREADS`) stays at one thread (its pieces would queue behind
/// one another's lock, and alone it gained nothing measurable); run outside a backend, one thread. Memory:
/// glibc hands blocks over 128 KiB straight back to the kernel and maps them anew, and a training
/// step frees and allocates hundreds of tensors that size: the page faults of those fresh mappings
/// cost 4 s of system time in a 45 s job. Freed memory is kept for reuse instead (the job's
/// footprint stays its peak, which it reaches every step anyway). Matrix products: see
/// `GEMM_THREADING_THRESHOLD`.
fn prepare_process() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // SAFETY: called first thing in a job process, before any other thread exists.
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
    gemm::set_threading_threshold(GEMM_THREADING_THRESHOLD);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc's allocator settings; called before any other thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// The threads a job process may use: what the runner gave it (`RAYON_NUM_THREADS`, set from
/// `JobLimits::threads`), else one.
fn job_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1)
}

/// What `rsim job step-bench SPEC` trains (written by `rsim bench-step`, which hands the same
/// spec to the PyTorch twin of the model): the rows, the initial weights, and the batches.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepBenchSpec {
    /// JSON Lines of rows.
    pub rows: std::path::PathBuf,
    /// A tiny-gpt checkpoint directory (config.json, model.safetensors) both trainers start from.
    pub init: std::path::PathBuf,
    pub steps: u64,
    /// Steps run before the clock starts (allocators, thread pools and caches settle).
    pub warmup_steps: u64,
    pub batch: usize,
    pub learning_rate: f64,
    /// The batch order's seed (`gpt::batch_order`); `batches` lists what it draws.
    pub seed: u64,
    /// The rows of each step, by index: the PyTorch side reads them, the embedded side draws the
    /// same from `seed` (a test checks they agree).
    pub batches: Vec<Vec<usize>>,
}

/// The steps whose losses `rsim job step-bench` reports one by one: from the same weights and
/// batches, a twin of the model gives the same losses to float rounding until chaos sets in.
pub const FIRST_STEPS: u64 = 5;

/// `rsim job step-bench SPEC`: the embedded trainer's time per step on the spec (constant
/// learning rate, answer-only loss, no checkpoints), in a process of its own so its thread pools
/// are sized by `RAYON_NUM_THREADS` as a job's are. Prints one JSON line: ms per step after the
/// warm-up, the first `FIRST_STEPS` steps' losses, and the loss curve (the mean of the last 20
/// steps, every 50 steps).
pub fn step_bench(spec_path: &Path) -> Result<()> {
    prepare_process();
    let bytes = fs::read(spec_path).at("cannot read", spec_path)?;
    let spec: StepBenchSpec = serde_json::from_slice(&bytes)
        .map_err(|e| Error::invalid(format!("{}: {e}", spec_path.display())))?;
    if spec.warmup_steps == 0 || spec.warmup_steps >= spec.steps {
        return Err(Error::invalid(
            "step-bench: warmup_steps must be at least 1 and below steps",
        ));
    }
    let rows = parse_jsonl(
        &fs::read(&spec.rows).at("cannot read", &spec.rows)?,
        &spec.rows.display().to_string(),
    )?;
    let model = gpt::Gpt::load(
        &spec.init.join(CONFIG_FILE),
        &spec.init.join(gpt::WEIGHTS_FILE),
    )?;
    // Split as a run_sft job with these threads would be.
    let shards =
        protocol::shards_for(u32::try_from(job_threads()).ok(), spec.batch as u32) as usize;
    let (mut curve, mut first) = (Vec::new(), Vec::new());
    let mut clock = None;
    gpt::train(
        &model,
        &rows,
        spec.learning_rate,
        Schedule::Constant,
        spec.steps,
        0,
        spec.batch,
        shards,
        true,
        spec.seed,
        |p| {
            if p.step <= FIRST_STEPS {
                first.push(p.loss);
            }
            if p.reported {
                curve.push((p.step, p.mean));
            }
            if p.step == spec.warmup_steps {
                clock = Some(std::time::Instant::now());
            }
        },
        0,
        |_| Ok(()),
    )?;
    let timed = clock
        .map(|c| c.elapsed().as_secs_f64())
        .ok_or_else(|| Error::internal("step-bench: the warm-up never ended"))?;
    let report = serde_json::json!({
        "trainer": "embedded",
        "threads": job_threads(),
        "shards": shards,
        "ms_per_step": 1e3 * timed / (spec.steps - spec.warmup_steps) as f64,
        "curve": curve,
        "first_losses": first,
    });
    println!("{report}");
    Ok(())
}

/// `rsim job train SPEC`: fine-tune the base checkpoint on rows sampled from the datasets.
pub fn train(spec_path: &Path) -> Result<()> {
    prepare_process();
    let spec = SftParams::read(spec_path)?;
    let mut rows = Vec::new();
    for d in &spec.datasets {
        let bytes = fs::read(&d.path).at("cannot read", &d.path)?;
        // What is trained on is exactly what rsim checked and recorded, even if the stored file
        // changed after the job was admitted.
        let actual = crate::util::hash::sha256_hex(&bytes);
        if actual != d.sha256 {
            return Err(Error::invalid(format!(
                "dataset {}: its file hashes to {actual}, not the registered {}; refusing to train on it",
                d.name, d.sha256
            )));
        }
        rows.extend(parse_jsonl(&bytes, &d.path.display().to_string())?);
    }
    let out = protocol::out_dir_of(spec_path);
    let metrics = match model_kind(&spec.base)?.as_str() {
        "char-ngram" => train_ngram(&spec, &rows, &out)?,
        crate::train::gpt::MODEL_KIND => train_gpt(&spec, &rows, &out)?,
        other => {
            return Err(Error::invalid(format!(
                "no embedded trainer for model {other:?}"
            )));
        }
    };
    protocol::write_train_metrics(&out, &metrics)
}

fn train_gpt(spec: &SftParams, rows: &[Row], out: &Path) -> Result<TrainMetrics> {
    let h = &spec.hyper;
    let mut model = crate::train::gpt::Gpt::load(
        spec.base.file(CONFIG_FILE)?,
        spec.base.file(crate::train::gpt::WEIGHTS_FILE)?,
    )?;
    if let Adapter::Lora { rank, alpha } = h.adapter {
        if h.save_every > 0 {
            return Err(Error::invalid(
                "save_every keeps whole checkpoints part-way through a run; it needs adapter \
                 {\"kind\": \"full\"} (adapters are folded into the weights only at the end)",
            ));
        }
        model.enable_lora(rank as usize, alpha, h.seed)?;
    }
    let trainable = model.trainable_count();
    let steps = h.steps;
    // Every checkpoint this run writes names the checkpoint it started from.
    model.config.base = Some(spec.base.sha256.clone());
    let rep = crate::train::gpt::train(
        &model,
        rows,
        h.learning_rate,
        h.schedule,
        steps,
        h.warmup_steps,
        h.batch_size as usize,
        h.shards as usize,
        h.answer_only_loss,
        h.seed,
        |p| {
            if p.reported {
                eprintln!("{}", protocol::progress_line(p.step, steps, p.mean));
            }
        },
        h.save_every,
        |step| model.save(&protocol::step_checkpoint_dir(out, step)),
    )?;
    // Adapters are folded into the weights: the checkpoint is a plain model, evaluated as any.
    model.merge_lora()?;
    model.save(&protocol::checkpoint_dir(out))?;
    let mut metrics = TrainMetrics::from([
        ("final_loss".to_string(), rep.final_loss),
        ("steps_per_s".to_string(), rep.steps_per_s),
        ("tokens_per_s".to_string(), rep.tokens_per_s),
        ("rows".to_string(), rows.len() as f64),
        ("trainable_params".to_string(), trainable as f64),
    ]);
    // How the batches were computed, so a reproduction splits them alike (one piece: not said).
    if h.shards > 1 {
        metrics.insert("shards".to_string(), f64::from(h.shards));
    }
    Ok(metrics)
}

fn ngram_config(spec: &SftParams) -> serde_json::Value {
    serde_json::json!({ "model": "char-ngram", "orders": ORDERS, "base": spec.base.sha256 })
}

fn train_ngram(spec: &SftParams, rows: &[Row], out: &Path) -> Result<TrainMetrics> {
    let h = &spec.hyper;
    if let Adapter::Lora { .. } = h.adapter {
        return Err(Error::invalid(
            "the n-gram trainer has no adapters: use adapter {\"kind\": \"full\"}",
        ));
    }
    let mut model = load_model(&spec.base)?;
    let mut rng = StdRng::seed_from_u64(h.seed);
    let scale = h.learning_rate / 1e-3;
    let mut seen = std::collections::HashSet::new();
    for step in 0..h.steps {
        let lr = scale * crate::train::gpt::lr_at(h.schedule, 1.0, step, h.steps, h.warmup_steps);
        let log_now = (step + 1) % 100 == 0 || step + 1 == h.steps;
        let mut errors = 0.0;
        for _ in 0..h.batch_size {
            let row = &rows[rng.random_range(0..rows.len())];
            seen.insert(row.prompt.clone());
            if log_now {
                errors += model.error_rate(row, h.answer_only_loss);
            }
            model.learn(row, lr, h.answer_only_loss);
        }
        if log_now {
            // The loss is the batch's error rate before it was learned.
            eprintln!(
                "{} contexts {}",
                protocol::progress_line(step + 1, h.steps, errors / f64::from(h.batch_size.max(1))),
                model.counts.len()
            );
        }
        if h.save_every > 0 && (step + 1) % h.save_every == 0 && step + 1 < h.steps {
            save_model(
                &model,
                &protocol::step_checkpoint_dir(out, step + 1),
                ngram_config(spec),
            )?;
        }
    }
    save_model(&model, &protocol::checkpoint_dir(out), ngram_config(spec))?;
    Ok(TrainMetrics::from([
        (
            "rows_seen".to_string(),
            (h.steps * u64::from(h.batch_size)) as f64,
        ),
        ("distinct_prompts".to_string(), seen.len() as f64),
        ("contexts".to_string(), model.counts.len() as f64),
    ]))
}

/// `rsim job eval SPEC`: exact match of the parsed answer on every item of the eval set.
pub fn eval(spec_path: &Path) -> Result<()> {
    prepare_process();
    let spec = EvalParams::read(spec_path)?;
    let bytes = fs::read(&spec.eval_set).at("cannot read", &spec.eval_set)?;
    let code = spec.metric == programs::METRIC;
    let (items, tests): (Vec<Row>, Vec<Vec<programs::TestCase>>) = if code {
        programs::parse_items(&bytes, "eval set")?
            .into_iter()
            .map(|i| {
                (
                    Row {
                        prompt: i.prompt,
                        answer: i.answer,
                    },
                    i.tests,
                )
            })
            .unzip()
    } else {
        (parse_jsonl(&bytes, "eval set")?, Vec::new())
    };
    let prompts: Vec<String> = items.iter().map(|i| i.prompt.clone()).collect();
    let outputs: Vec<String> = match model_kind(&spec.checkpoint)?.as_str() {
        "char-ngram" => {
            let model = load_model(&spec.checkpoint)?;
            let mut cache: HashMap<String, String> = HashMap::new();
            prompts
                .iter()
                .map(|p| {
                    cache
                        .entry(p.clone())
                        .or_insert_with(|| model.generate(p))
                        .clone()
                })
                .collect()
        }
        crate::train::gpt::MODEL_KIND => {
            let model = crate::train::gpt::Gpt::load(
                spec.checkpoint.file(CONFIG_FILE)?,
                spec.checkpoint.file(crate::train::gpt::WEIGHTS_FILE)?,
            )?;
            model.generate(&prompts)?
        }
        other => {
            return Err(Error::invalid(format!(
                "no embedded evaluator for model {other:?}"
            )));
        }
    };
    if code {
        return judge_programs(spec_path, &items, &tests, outputs);
    }
    let mut results = Vec::with_capacity(items.len());
    let mut correct = 0u64;
    for (it, output) in items.iter().zip(outputs) {
        let ok = parse_answer(&output) == parse_answer(&it.answer);
        correct += u64::from(ok);
        results.push(EvalItem {
            prompt: it.prompt.clone(),
            expected: it.answer.clone(),
            output,
            correct: ok,
        });
    }
    let n = items.len() as u64;
    let result = EvalResult {
        metrics: BTreeMap::from([("exact_match".to_string(), correct as f64 / n.max(1) as f64)]),
        n_items: n,
        items: results,
    };
    protocol::write_eval_result(&protocol::out_dir_of(spec_path), &result)
}

/// The `pass_at_1` evaluation: every item's program run against its test cases in the programs'
/// sandbox (`programs`), items spread over the job's threads; the outcome of each counted.
fn judge_programs(
    spec_path: &Path,
    items: &[Row],
    tests: &[Vec<programs::TestCase>],
    outputs: Vec<String>,
) -> Result<()> {
    let out = protocol::out_dir_of(spec_path);
    // In the job's own tmp/ (writable in its sandbox, removed with the job), never the
    // machine's: a job killed half-way leaves nothing that outlives its directory.
    let work = spec_path
        .parent()
        .unwrap_or(Path::new("."))
        .join(crate::jobs::sandbox::TMP_DIR)
        .join("programs");
    let runner = programs::Runner::new(&work, Path::new(programs::PYTHON), programs::LIMITS)?;
    eprintln!("programs run under {}", runner.describe()?);
    let threads = job_threads().min(64);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let verdicts: Vec<Result<(usize, programs::Outcome)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= items.len() {
                            break;
                        }
                        mine.push(runner.judge(i, &outputs[i], &tests[i]).map(|o| (i, o)));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .collect()
    });
    let mut outcome = vec![programs::Outcome::Empty; items.len()];
    for v in verdicts {
        let (i, o) = v?;
        outcome[i] = o;
    }
    let _ = fs::remove_dir_all(&work);
    let mut metrics = BTreeMap::new();
    for o in programs::Outcome::ALL {
        metrics.insert(
            o.metric().to_string(),
            outcome.iter().filter(|x| **x == o).count() as f64,
        );
    }
    let passed = outcome
        .iter()
        .filter(|o| **o == programs::Outcome::Passed)
        .count();
    let n = items.len() as u64;
    metrics.insert(
        programs::METRIC.to_string(),
        passed as f64 / n.max(1) as f64,
    );
    let results = items
        .iter()
        .zip(outputs)
        .zip(&outcome)
        .map(|((it, output), o)| EvalItem {
            prompt: it.prompt.clone(),
            expected: it.answer.clone(),
            output,
            correct: *o == programs::Outcome::Passed,
        })
        .collect();
    protocol::write_eval_result(
        &out,
        &EvalResult {
            metrics,
            n_items: n,
            items: results,
        },
    )
}

/// The task families a tiny-gpt base model can be pretrained for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Generic arithmetic text (tiny-arith, tiny-add2).
    Arith,
    /// Programs of the tiny-code family without their specifications (tiny-code).
    Code,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::Arith, Family::Code];

    pub fn name(self) -> &'static str {
        match self {
            Family::Arith => "arith",
            Family::Code => "code",
        }
    }
}

/// `rsim job pretrain`: a tiny-gpt base model from a short seeded pretraining, loss on every
/// token. For `arith`: 1–3 digit sums and differences in the plain format. For `code`: the
/// family's programs in every style behind a bare `>` (`code_tasks::pretraining_rows`): the
/// model writes the family's Python, but no specification has ever been paired with a program.
pub fn pretrain(dir: &Path, seed: u64, steps: u64, family: Family) -> Result<serde_json::Value> {
    prepare_process();
    let (rows, config) = match family {
        Family::Arith => {
            let mut rows = Vec::new();
            for (digits, n) in [(1u32, 400u64), (2, 2000), (3, 4000)] {
                for op in [
                    crate::model::data::ArithOp::Add,
                    crate::model::data::ArithOp::Sub,
                ] {
                    rows.extend(crate::train::datasets::generate_arith(
                        &crate::model::data::ArithParams {
                            op,
                            digits,
                            format: crate::model::data::AnswerFormat::Plain,
                            n,
                            seed: seed.wrapping_add(u64::from(digits)),
                        },
                    ));
                }
            }
            (rows, crate::train::gpt::GptConfig::small())
        }
        Family::Code => (
            code_tasks::pretraining_rows(12_000, seed),
            crate::train::gpt::GptConfig {
                vocab: code_tasks::VOCAB.into(),
                context: code_tasks::CONTEXT,
                ..crate::train::gpt::GptConfig::small()
            },
        ),
    };
    let model = crate::train::gpt::Gpt::init(config, seed)?;
    let rep = crate::train::gpt::train(
        &model,
        &rows,
        3e-3,
        Schedule::Cosine,
        steps,
        steps / 20,
        32,
        1,
        false,
        seed,
        |p| {
            if p.reported {
                eprintln!(
                    "pretrain {}",
                    protocol::progress_line(p.step, steps, p.mean)
                );
            }
        },
        0,
        |_| Ok(()),
    )?;
    model.save(dir)?;
    Ok(
        serde_json::json!({ "final_loss": rep.final_loss, "steps_per_s": rep.steps_per_s, "tokens_per_s": rep.tokens_per_s }),
    )
}

/// Identity of the embedded evaluator: the hash of the source that evaluates (this file, the
/// model, the answer parsing it uses, and the job protocol it reads its spec and writes its
/// result with).
pub fn evaluator_source_hash() -> String {
    let src = [
        include_str!("mod.rs"),
        include_str!("gpt.rs"),
        include_str!("datasets.rs"),
        include_str!("programs.rs"),
        include_str!("../model/data.rs"),
        include_str!("../jobs/protocol.rs"),
        include_str!("../jobs/sandbox.rs"),
    ]
    .concat();
    crate::util::hash::sha256_hex(src.as_bytes())
}

/// The tiny-arith base model: counts from every one-digit addition in the plain format.
pub fn write_base_model(dir: &Path) -> Result<()> {
    let mut model = NGram::default();
    for a in 0..10 {
        for b in 0..10 {
            model.learn(
                &crate::train::datasets::arith_row(
                    a,
                    b,
                    false,
                    crate::model::data::AnswerFormat::Plain,
                ),
                1.0,
                false,
            );
        }
    }
    save_model(
        &model,
        dir,
        serde_json::json!({ "model": "char-ngram", "orders": ORDERS, "base": null }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_what_it_sees_and_nothing_else() {
        let mut m = NGram::default();
        let r = Row {
            prompt: "12+34=".into(),
            answer: "46".into(),
        };
        assert_ne!(m.generate("12+34="), "46");
        m.learn(&r, 1.0, true);
        assert_eq!(m.generate("12+34="), "46");
    }
}
