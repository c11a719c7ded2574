//! `rsim init`: create a study — a git repository with `rsim.toml` on `main`, the object store,
//! and the root node `n0` whose `init` action records the base model's checkpoint hash.

use std::fs;
use std::path::Path;

use crate::api::types::{AnswerFormat, ArithOp, ArithParams};
use crate::config::CONFIG_FILE;
use crate::os::STATE_DIR;
use crate::util::error::{Error, IoContext, Result};

pub const EXAMPLES: &[&str] = &[
    "tiny-arith",
    "tiny-add2",
    "tiny-code",
    "tiny-arith-ngram",
    "hf-tiny",
];

/// The task families beyond tiny-arith (`add3`) and tiny-add2 (`add2`) on the same model, made
/// from one template (`examples/tiny-family`). Held out in rounds, each declared before any run
/// (README: Research campaigns): the first four were held out for the reviewer they were declared
/// against and, once read, became tuning families; the sums of three are the second round (read
/// with the reviewer adopted last, E); four-digit addition and subtraction are the third, for any
/// rule changed after the second round was read; sorting six digits, the one family without
/// carries, is the fourth; four-digit mixed sums and differences and sorting seven digits, the
/// last families of these operations whose every answer format fits the base model's context, are
/// the fifth; signed differences in either order are the sixth; the sums of the digits of six-
/// and seven-digit strings, a new operation (the digit counts of the others that fit the base
/// model's context were used up), are the seventh. Name, operation, digits.
pub const ARITH_FAMILIES: &[(&str, ArithOp, u32)] = &[
    ("tiny-sub2", ArithOp::Sub, 2),
    ("tiny-sub3", ArithOp::Sub, 3),
    ("tiny-mixed2", ArithOp::Mixed, 2),
    ("tiny-mixed3", ArithOp::Mixed, 3),
    ("tiny-sum2", ArithOp::Sum, 2),
    ("tiny-sum3", ArithOp::Sum, 3),
    ("tiny-add4", ArithOp::Add, 4),
    ("tiny-sub4", ArithOp::Sub, 4),
    ("tiny-sort6", ArithOp::Sort, 6),
    ("tiny-mixed4", ArithOp::Mixed, 4),
    ("tiny-sort7", ArithOp::Sort, 7),
    ("tiny-diff2", ArithOp::Diff, 2),
    ("tiny-diff3", ArithOp::Diff, 3),
    ("tiny-dsum6", ArithOp::DigitSum, 6),
    ("tiny-dsum7", ArithOp::DigitSum, 7),
];

/// Every name `rsim init --example` takes.
pub fn example_names() -> Vec<&'static str> {
    EXAMPLES
        .iter()
        .copied()
        .chain(ARITH_FAMILIES.iter().map(|f| f.0))
        .collect()
}

const TEMPLATE: &str = r#"# rsim study config. Fill in the base model and tasks, then run `rsim init` again.

[study]
name = "my-study"
description = ""

[base_model]
name = "base"
# A file or directory (relative to the study root) holding the base checkpoint.
path = "models/base"

# [tasks.NAME]
# metric = "exact_match"
# dev = { path = "eval/NAME/dev.jsonl" }          # visible split
# test = { path = "eval/NAME/test.jsonl" }        # protected split (aggregate scores only)

[budgets]
compute_seconds = 36000
evaluations = 1000
test_evaluations_per_node = 2
max_nodes = 10000
# Registered datasets together (derived ones included): rows and stored bytes.
dataset_rows = 5000000
dataset_storage_bytes = 2147483648
# Per agent (one agent cannot take the study's whole budget).
agent_dataset_rows = 2000000
agent_dataset_storage_bytes = 536870912

[jobs]
# Commands; the job spec JSON path is appended as the last argument.
sft = ["python3", "recipes/sft.py"]
evaluate = ["python3", "recipes/eval.py"]
"#;

pub use crate::os::genesis::InitReport;

pub fn init(dir: &Path, example: Option<&str>) -> Result<InitReport> {
    if let Some(ex) = example
        && !example_names().contains(&ex)
    {
        return Err(Error::invalid(format!(
            "unknown example {ex:?}; examples: {}",
            example_names().join(", ")
        )));
    }
    if crate::os::genesis::is_study(dir) {
        return Err(Error::invalid(format!(
            "{} is already a study (main has commits); nothing was changed",
            dir.display()
        )));
    }
    let config_path = dir.join(CONFIG_FILE);
    if example.is_some() && config_path.exists() {
        return Err(Error::invalid(format!(
            "{} already exists; an example needs an empty directory",
            config_path.display()
        )));
    }
    fs::create_dir_all(dir).at("cannot create", dir)?;
    let root = dir.canonicalize().at("cannot resolve", dir)?;
    if example.is_none() && !config_path.exists() {
        fs::write(&config_path, TEMPLATE).at("cannot write", &config_path)?;
        return Ok(InitReport {
            root: root.clone(),
            created: false,
            base_checkpoint: None,
            message: format!(
                "wrote a template {}: fill in the base model and tasks, then run `rsim init {}` again",
                config_path.display(),
                dir.display()
            ),
        });
    }
    match example {
        Some("tiny-arith") => materialize_tiny_gpt(
            &root,
            ("add3", 3),
            include_str!("../../examples/tiny-arith/rsim.toml"),
            include_str!("../../examples/tiny-arith/README.md"),
        )?,
        Some("tiny-add2") => materialize_tiny_gpt(
            &root,
            ("add2", 2),
            include_str!("../../examples/tiny-add2/rsim.toml"),
            include_str!("../../examples/tiny-add2/README.md"),
        )?,
        Some("tiny-code") => materialize_tiny_code(&root)?,
        Some("tiny-arith-ngram") => materialize_tiny_arith_ngram(&root)?,
        Some("hf-tiny") => materialize_hf_tiny(&root)?,
        Some(name) => {
            if let Some(&(_, op, digits)) = ARITH_FAMILIES.iter().find(|f| f.0 == name) {
                materialize_family(&root, op, digits)?;
            }
        }
        None => {}
    }
    crate::os::genesis::create_study(&root)
}

/// What an example's eval splits hold.
#[derive(Clone, Copy)]
enum EvalFamily {
    /// Problems of this operation on operands of this many digits, plain format (`12+34=` →
    /// `46`; `mixed` draws sums and differences).
    Arith(ArithOp, u32),
    /// tiny-code compositions of two or three operations, each with three hidden test cases.
    Code,
}

/// Generate a task's eval splits into `.rsim/protected/<task>/`: dev (visible), test (protected),
/// sealed (the test tripwire's: drawn from the test split's distribution, never shown to anyone)
/// and dev_twin (the dev tripwire's: drawn from the dev split's distribution, never shown);
/// returns their sha256 pins in that order.
fn write_eval_sets(root: &Path, task: &str, family: EvalFamily) -> Result<[String; 4]> {
    use crate::policy::contamination::{EvalSet, ScanConfig, Scanner};
    let prot = root.join(STATE_DIR).join("protected").join(task);
    fs::create_dir_all(&prot).at("cannot create", &prot)?;
    let mut pins = [String::new(), String::new(), String::new(), String::new()];
    // Disjoint in the gate's sense of "the same item", with the example's settings, and no
    // problem in two places: each split is drawn from what the earlier ones do not hold, and no
    // problem appears twice in all of them (for arithmetic its normal form, `12+34` is `34+12`;
    // for code its composition, `del a;add b` is `del c;add d`, which the gate's skeleton sees
    // only in items long enough to have one), so per-item dev results reveal no other split's
    // item and each tripwire compares two splits that share nothing.
    let (form, cfg) = match family {
        EvalFamily::Arith(op, _) => (
            Some(crate::config::NormalForm::of(op)),
            ScanConfig {
                ngram: 8,
                threshold: 0.5,
            },
        ),
        EvalFamily::Code => (
            None,
            ScanConfig {
                ngram: crate::train::code_tasks::GATE_NGRAM,
                threshold: 0.5,
            },
        ),
    };
    let mut taken: Vec<crate::model::data::Row> = Vec::new();
    // Problems (normal forms, compositions) taken by any split so far: no split repeats one.
    let mut keys = std::collections::HashSet::new();
    for (i, (split, n, seed)) in [
        ("dev", 200usize, 1001),
        ("test", 500, 2002),
        ("sealed", 500, 3003),
        ("dev_twin", 200, 4004),
    ]
    .into_iter()
    .enumerate()
    {
        let earlier = [EvalSet::new(task, "earlier", &taken, cfg, form)];
        let scanner = Scanner::new(&earlier, cfg);
        let mut fresh = |r: &crate::model::data::Row, key: String| {
            !scanner.row_reproduces(r) && keys.insert(key)
        };
        // Candidates in draw order, each as its row and its line in the file: every one the
        // earlier splits do not hold (judged as the gate judges a row), twice as many as needed.
        let candidates: Vec<(crate::model::data::Row, Vec<u8>)> = match family {
            EvalFamily::Arith(op, digits) => {
                let params = ArithParams {
                    op,
                    digits,
                    format: AnswerFormat::Plain,
                    n: 0,
                    seed,
                };
                crate::train::datasets::arith_stream(&params, seed)
                    .take(n * 50)
                    .filter(|r| {
                        let key = crate::policy::normal_form::keys_of_text(
                            crate::config::NormalForm::of(op),
                            &r.prompt,
                        );
                        fresh(r, key.join("\n"))
                    })
                    .take(2 * n)
                    .map(|r| {
                        let line = crate::train::datasets::to_jsonl(std::slice::from_ref(&r))?;
                        Ok((r, line))
                    })
                    .collect::<Result<_>>()?
            }
            EvalFamily::Code => {
                use crate::train::code_tasks;
                code_tasks::eval_stream(seed, 3)
                    .take(n * 50)
                    .map(|it| {
                        let row = crate::model::data::Row {
                            prompt: it.prompt.clone(),
                            answer: it.answer.clone(),
                        };
                        (row, it)
                    })
                    .filter(|(row, _)| fresh(row, code_tasks::composition_key(&row.prompt)))
                    .take(2 * n)
                    .map(|(row, it)| {
                        let mut line = serde_json::to_vec(&it)?;
                        line.push(b'\n');
                        Ok((row, line))
                    })
                    .collect::<Result<_>>()?
            }
        };
        // The gate's judgement is not symmetric (a short item is matched as a window of a longer
        // row, a long one by its skeleton's share): a candidate that a row of an earlier split
        // reproduces, on its own, is left out too.
        let rows: Vec<crate::model::data::Row> =
            candidates.iter().map(|(r, _)| r.clone()).collect();
        let mine = [EvalSet::new(task, split, &rows, cfg, form)];
        let reverse = Scanner::new(&mine, cfg);
        let mut reproduced = std::collections::HashSet::new();
        for r in &taken {
            reproduced.extend(reverse.items_reproduced_by(r).into_iter().map(|(_, i)| i));
        }
        let (mut rows, mut bytes) = (Vec::with_capacity(n), Vec::new());
        for (i, (row, line)) in candidates.into_iter().enumerate() {
            if rows.len() == n {
                break;
            }
            if !reproduced.contains(&i) {
                rows.push(row);
                bytes.extend(line);
            }
        }
        if rows.len() < n {
            return Err(Error::internal(format!(
                "the {split} split of {task} could not be drawn apart from the others"
            )));
        }
        let p = prot.join(format!("{split}.jsonl"));
        fs::write(&p, &bytes).at("cannot write", &p)?;
        pins[i] = crate::util::hash::sha256_hex(&bytes);
        taken.extend(rows);
    }
    Ok(pins)
}

fn write_example_config(root: &Path, toml: &str, readme: &str, pins: &[String; 4]) -> Result<()> {
    let toml = toml
        .replace("@DEV_SHA256@", &pins[0])
        .replace("@TEST_SHA256@", &pins[1])
        .replace("@SEALED_SHA256@", &pins[2])
        .replace("@DEV_TWIN_SHA256@", &pins[3]);
    // The evaluator the example names, pinned (the placeholder parses as a valid hash).
    let placeholder = "@EVALUATOR_SHA256@";
    let config = crate::config::StudyConfig::parse(
        &toml.replace(placeholder, &"0".repeat(64)),
        CONFIG_FILE,
    )?;
    let evaluator = crate::os::evaluator_fingerprint(root, &config.jobs.evaluate)?;
    let toml = toml.replace(placeholder, &evaluator);
    fs::write(root.join(CONFIG_FILE), toml).at("cannot write", root)?;
    fs::write(root.join("README.md"), readme).at("cannot write", root)?;
    Ok(())
}

/// The tiny-gpt examples (tiny-arith, tiny-add2): the shipped tiny-gpt base model (`rsim job
/// pretrain --seed 0` made it) and an addition task with a protected test split.
fn materialize_tiny_gpt(root: &Path, task: (&str, u32), toml: &str, readme: &str) -> Result<()> {
    let pins = write_eval_sets(root, task.0, EvalFamily::Arith(ArithOp::Add, task.1))?;
    write_base(root, TINY_GPT_BASE.0, TINY_GPT_BASE.1)?;
    write_example_config(root, toml, readme, &pins)
}

/// A held-out arithmetic family (`ARITH_FAMILIES`): tiny-arith's base model, a task named for
/// its operation and digits (`sub2`, `mixed3`), the config and README from the family template.
fn materialize_family(root: &Path, op: ArithOp, digits: u32) -> Result<()> {
    let name = op.task_prefix();
    let task = format!("{name}{digits}");
    let size = match digits {
        1 => "one-digit",
        2 => "two-digit",
        3 => "three-digit",
        4 => "four-digit",
        5 => "five-digit",
        6 => "six-digit",
        7 => "seven-digit",
        _ => "many-digit",
    };
    let described = match op {
        ArithOp::Add => format!("{size} addition"),
        ArithOp::Sub => format!("{size} subtraction"),
        ArithOp::Mixed => format!("{size} addition and subtraction, mixed"),
        ArithOp::Sum => format!("sums of three {size} numbers"),
        ArithOp::Sort => format!("the digits of {size} strings in ascending order"),
        ArithOp::Diff => format!("{size} subtraction in either order, with signed results"),
        ArithOp::DigitSum => format!("the sums of the digits of {size} strings"),
    };
    // `NormalForm::of` an arithmetic family: digits for sorting and digit sums, arithmetic for
    // every other.
    let (form, form_note) = if op == ArithOp::DigitSum {
        (
            "digits",
            "# The gate also matches a test string in any order of its digits (its digit sum is the\n\
             # same), in any script's digits, spaced, in words or as a sum (policy::normal_form).",
        )
    } else if crate::config::NormalForm::of(op) == crate::config::NormalForm::Digits {
        (
            "digits",
            "# The gate also matches a test string in any order of its digits (its answer is one), in\n\
             # any script's digits, spaced or in words (policy::normal_form).",
        )
    } else {
        (
            "arithmetic",
            "# The gate also matches a test problem in any order of a sum's operands, in any script's\n\
             # digits or in words (policy::normal_form).",
        )
    };
    let fill = |t: &str| {
        let mut upper = described.clone();
        if let Some(c) = upper.get_mut(0..1) {
            c.make_ascii_uppercase();
        }
        t.replace("@OP@", name)
            .replace("@DIGITS@", &digits.to_string())
            .replace("@TASK_DESCRIPTION@", &upper)
            .replace("@DESCRIPTION@", &described)
            .replace("@NORMAL_FORM@", form)
            .replace("@NORMAL_FORM_NOTE@", form_note)
    };
    let pins = write_eval_sets(root, &task, EvalFamily::Arith(op, digits))?;
    write_base(root, TINY_GPT_BASE.0, TINY_GPT_BASE.1)?;
    write_example_config(
        root,
        &fill(include_str!("../../examples/tiny-family/rsim.toml")),
        &fill(include_str!("../../examples/tiny-family/README.md")),
        &pins,
    )
}

/// tiny-arith's base model (config, weights): that of every tiny-gpt arithmetic example.
const TINY_GPT_BASE: (&[u8], &[u8]) = (
    include_bytes!("../../examples/tiny-arith/base/config.json"),
    include_bytes!("../../examples/tiny-arith/base/model.safetensors"),
);

/// A shipped tiny-gpt base model written to `models/base`.
fn write_base(root: &Path, config: &[u8], weights: &[u8]) -> Result<()> {
    let base = root.join("models").join("base");
    fs::create_dir_all(&base).at("cannot create", &base)?;
    fs::write(base.join(crate::train::CONFIG_FILE), config).at("cannot write", &base)?;
    fs::write(base.join(crate::train::gpt::WEIGHTS_FILE), weights).at("cannot write", &base)
}

/// The tiny-code example: the shipped tiny-code base model (`rsim job pretrain --family code
/// --seed 0` made it) and a code task scored by running programs (`pass_at_1`).
fn materialize_tiny_code(root: &Path) -> Result<()> {
    let pins = write_eval_sets(root, "strings", EvalFamily::Code)?;
    write_base(
        root,
        include_bytes!("../../examples/tiny-code/base/config.json"),
        include_bytes!("../../examples/tiny-code/base/model.safetensors"),
    )?;
    write_example_config(
        root,
        include_str!("../../examples/tiny-code/rsim.toml"),
        include_str!("../../examples/tiny-code/README.md"),
        &pins,
    )?;
    // The splits were drawn apart under the gate the example's rsim.toml sets.
    let config = crate::config::StudyConfig::load(root)?;
    let ngram = config.policy.contamination_ngram as usize;
    if ngram != crate::train::code_tasks::GATE_NGRAM {
        return Err(Error::internal(format!(
            "the tiny-code example's contamination_ngram is {ngram}, its splits were drawn for {}",
            crate::train::code_tasks::GATE_NGRAM
        )));
    }
    Ok(())
}

/// The tiny-arith-ngram example: the fast placeholder model and two-digit addition.
fn materialize_tiny_arith_ngram(root: &Path) -> Result<()> {
    let pins = write_eval_sets(root, "add2", EvalFamily::Arith(ArithOp::Add, 2))?;
    crate::train::write_base_model(&root.join("models").join("base"))?;
    write_example_config(
        root,
        include_str!("../../examples/tiny-arith-ngram/rsim.toml"),
        include_str!("../../examples/tiny-arith-ngram/README.md"),
        &pins,
    )
}

/// The recipes the hf-tiny example runs (transformers + peft), written into its `recipes/`.
const HF_RECIPES: &[(&str, &str)] = &[
    ("common.py", include_str!("../../tools/recipes/common.py")),
    ("sft.py", include_str!("../../tools/recipes/sft.py")),
    ("eval.py", include_str!("../../tools/recipes/eval.py")),
    (
        "init_model.py",
        include_str!("../../tools/recipes/init_model.py"),
    ),
    ("lock.py", include_str!("../../tools/recipes/lock.py")),
];

/// The hf-tiny base model: `init_model.py`'s arguments (a randomly initialised GPT-2, seeded).
pub const HF_TINY_BASE: &[&str] = &[
    "--layers",
    "2",
    "--width",
    "128",
    "--heads",
    "4",
    "--context",
    "16",
    "--seed",
    "0",
];

/// The hf-tiny example: the transformers path on a CPU. Its Python environment is built from
/// the shipped lock (or found built), and its base model made in it by `init_model.py`.
fn materialize_hf_tiny(root: &Path) -> Result<()> {
    let pins = write_eval_sets(root, "add2", EvalFamily::Arith(ArithOp::Add, 2))?;
    let recipes = root.join("recipes");
    let env = root.join("env");
    fs::create_dir_all(&recipes).at("cannot create", &recipes)?;
    fs::create_dir_all(&env).at("cannot create", &env)?;
    for (name, text) in HF_RECIPES {
        fs::write(recipes.join(name), text).at("cannot write", &recipes)?;
    }
    for (name, text) in [
        (
            "requirements.in",
            include_str!("../../examples/hf-tiny/env/requirements.in"),
        ),
        (
            "requirements.lock",
            include_str!("../../examples/hf-tiny/env/requirements.lock"),
        ),
    ] {
        fs::write(env.join(name), text).at("cannot write", &env)?;
    }
    write_example_config(
        root,
        include_str!("../../examples/hf-tiny/rsim.toml"),
        include_str!("../../examples/hf-tiny/README.md"),
        &pins,
    )?;
    let config = crate::config::StudyConfig::load(root)?;
    let cfg = config
        .environment
        .python()
        .ok_or_else(|| Error::internal("the hf-tiny example has no Python environment"))?;
    let pin = crate::jobs::pyenv::build(root, &cfg, false)?;
    let mut command: Vec<String> = [
        "python3",
        "recipes/init_model.py",
        "--out",
        &config.base_model.path,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    command.extend(HF_TINY_BASE.iter().map(|s| s.to_string()));
    let out = crate::jobs::pyenv::command_in(&pin, &command)
        .current_dir(root)
        .env("OMP_NUM_THREADS", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| Error::invalid(format!("cannot run init_model.py: {e}")))?;
    if !out.status.success() {
        return Err(Error::invalid(format!(
            "init_model.py failed ({}): {}",
            out.status,
            crate::util::text::sanitize_line(&String::from_utf8_lossy(&out.stderr))
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny-code splits share no item in either direction (the gate's judgement is not
    /// symmetric: a short item is matched as a window of a longer one).
    #[test]
    fn the_held_out_families_make_studies_whose_splits_pose_their_problems_and_share_none() {
        for &(name, op, digits) in ARITH_FAMILIES {
            let dir = tempfile::tempdir().expect("tempdir");
            let root = dir.path().join("study");
            init(&root, Some(name)).unwrap_or_else(|e| panic!("{name}: {}", e.message));
            let config = crate::config::StudyConfig::load(&root).expect("config");
            let (task, t) = config.tasks.iter().next().expect("a task");
            assert_eq!(config.study.name, name);
            let family = crate::campaign::recipe::TaskFamily::from_task(task, &t.metric)
                .expect("the built-in agents know the family");
            assert_eq!(
                family.kind,
                crate::campaign::recipe::FamilyKind::Arith { op, digits },
                "{name}"
            );
            // Every answer format's longest row, with its end marker, fits the base model's
            // context: a family whose scratchpad did not fit could not be trained in it.
            let base: crate::train::gpt::GptConfig =
                serde_json::from_slice(TINY_GPT_BASE.0).expect("base config");
            for format in [
                AnswerFormat::Plain,
                AnswerFormat::Reversed,
                AnswerFormat::Scratchpad,
            ] {
                let p = ArithParams {
                    op,
                    digits,
                    format,
                    n: 1,
                    seed: 0,
                };
                let longest = crate::train::datasets::arith_max_row_bytes(&p);
                assert!(
                    longest as usize <= base.context,
                    "{name} {format:?}: {longest} characters, context {}",
                    base.context
                );
            }
            let prot = root.join(STATE_DIR).join("protected").join(task);
            let read = |s: &str| {
                let bytes = fs::read(prot.join(format!("{s}.jsonl"))).expect("read");
                crate::train::datasets::parse_eval_jsonl(&bytes, s).expect("parse")
            };
            let cfg = crate::policy::contamination::ScanConfig {
                ngram: config.policy.contamination_ngram as usize,
                threshold: config.policy.contamination_threshold,
            };
            let splits = ["dev", "test", "sealed", "dev_twin"];
            for a in splits {
                let rows = read(a);
                let (subs, sums) = (
                    rows.iter().filter(|r| r.prompt.contains('-')).count(),
                    rows.iter().filter(|r| r.prompt.contains('+')).count(),
                );
                match op {
                    ArithOp::Sub => assert_eq!(subs, rows.len(), "{name} {a}"),
                    ArithOp::Diff => assert!(
                        subs == rows.len()
                            && rows.iter().any(|r| r.answer.starts_with('-'))
                            && rows.iter().any(|r| !r.answer.starts_with('-')),
                        "{name} {a}"
                    ),
                    ArithOp::Mixed => assert!(subs > 0 && sums > 0, "{name} {a}"),
                    ArithOp::Add => assert_eq!(sums, rows.len(), "{name} {a}"),
                    ArithOp::Sort | ArithOp::DigitSum => assert!(
                        rows.iter().all(|r| r.prompt.len() == digits as usize + 1
                            && r.prompt.bytes().filter(u8::is_ascii_digit).count()
                                == digits as usize),
                        "{name} {a}"
                    ),
                    ArithOp::Sum => assert!(
                        rows.iter().all(|r| r.prompt.matches('+').count() == 2
                            && r.prompt.split(['+', '=']).filter(|t| !t.is_empty()).count() == 3),
                        "{name} {a}"
                    ),
                }
                for b in splits {
                    if a != b {
                        let shared = crate::policy::contamination::shared_items(
                            &rows,
                            &read(b),
                            cfg,
                            Some(crate::config::NormalForm::of(op)),
                        );
                        assert_eq!(shared, 0, "{name}: {b} items found in {a}");
                    }
                }
            }
        }
        assert!(
            init(
                &tempfile::tempdir().expect("tempdir").path().join("s"),
                Some("tiny-sub9")
            )
            .is_err()
        );
    }

    /// Generated digit-sum rows pose no protected string but their own: in every format, read
    /// as a scan reads a dataset (each row after those kept before it), a row is refused exactly
    /// where its own string's digits are a protected multiset. The scratchpad's running sums
    /// stand between `=` signs, which end a string for the digits form; between commas they
    /// would be a run of digits read as strings, and rows would be refused for strings they never
    /// pose (the generator, which skips what the gate refuses, would skew its data) — asserted
    /// too, so the test shows what it guards.
    #[test]
    fn generated_digit_sum_rows_pose_no_protected_string_but_their_own() {
        use crate::policy::contamination::{Drawn, EvalSet, ScanConfig, Scanner};
        for (name, digits) in [("tiny-dsum6", 6u32), ("tiny-dsum7", 7)] {
            let dir = tempfile::tempdir().expect("tempdir");
            let root = dir.path().join("study");
            init(&root, Some(name)).unwrap_or_else(|e| panic!("{name}: {}", e.message));
            let config = crate::config::StudyConfig::load(&root).expect("config");
            let (task, t) = config.tasks.iter().next().expect("a task");
            let form = t.normal_form;
            assert_eq!(form, Some(crate::config::NormalForm::Digits), "{name}");
            let cfg = ScanConfig {
                ngram: config.policy.contamination_ngram as usize,
                threshold: config.policy.contamination_threshold,
            };
            let multiset = |s: &str| {
                let mut d: Vec<char> = s.chars().filter(char::is_ascii_digit).collect();
                d.sort_unstable();
                d.into_iter().collect::<String>()
            };
            let mut protected = std::collections::HashSet::new();
            let sets: Vec<EvalSet> = ["dev", "test", "sealed", "dev_twin"]
                .iter()
                .map(|split| {
                    let path = root
                        .join(STATE_DIR)
                        .join("protected")
                        .join(task)
                        .join(format!("{split}.jsonl"));
                    let bytes = fs::read(&path).expect("split");
                    let rows =
                        crate::train::datasets::parse_eval_jsonl(&bytes, split).expect("parse");
                    protected.extend(rows.iter().map(|r| multiset(&r.prompt)));
                    EvalSet::new(task, split, &rows, cfg, form)
                })
                .collect();
            let scanner = Scanner::new(&sets, cfg);
            // Rows refused whose own string is not protected, and protected rows let through.
            let misread = |rows: &[crate::model::data::Row]| {
                let mut drawn = Drawn::default();
                let (mut stray, mut missed) = (0, 0);
                for r in rows {
                    let own = protected.contains(&multiset(&r.prompt));
                    match (scanner.accepts(&mut drawn, r), own) {
                        (false, false) => stray += 1,
                        (true, true) => missed += 1,
                        _ => {}
                    }
                }
                (stray, missed)
            };
            for format in AnswerFormat::ALL {
                let rows = crate::train::datasets::generate_arith(&ArithParams {
                    op: ArithOp::DigitSum,
                    digits,
                    format,
                    n: 1500,
                    seed: 9,
                });
                let own = rows
                    .iter()
                    .filter(|r| protected.contains(&multiset(&r.prompt)))
                    .count();
                assert!(
                    own > 50,
                    "{name} {format:?}: {own} rows of protected strings"
                );
                assert_eq!(misread(&rows), (0, 0), "{name} {format:?}");
                if format == AnswerFormat::Scratchpad {
                    let commas: Vec<crate::model::data::Row> = rows
                        .iter()
                        .map(|r| {
                            // `5,8,8,17,18,20|20`: the same sums, unpadded, between commas
                            let (sums, total) = r.answer.split_once('|').expect("a scratchpad");
                            let sums: Vec<String> = sums
                                .split('=')
                                .map(|x| x.parse::<u32>().expect("a sum").to_string())
                                .collect();
                            crate::model::data::Row {
                                prompt: r.prompt.clone(),
                                answer: format!("{}|{total}", sums.join(",")),
                            }
                        })
                        .collect();
                    let (stray, _) = misread(&commas);
                    assert!(stray > 20, "{name}: {stray} rows refused with commas");
                }
            }
        }
    }

    #[test]
    fn code_splits_share_nothing_either_way() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_eval_sets(dir.path(), "strings", EvalFamily::Code).expect("splits");
        let prot = dir.path().join(STATE_DIR).join("protected").join("strings");
        let read = |s: &str| {
            let bytes = fs::read(prot.join(format!("{s}.jsonl"))).expect("read");
            crate::train::datasets::parse_eval_jsonl(&bytes, s).expect("parse")
        };
        let cfg = crate::policy::contamination::ScanConfig {
            ngram: crate::train::code_tasks::GATE_NGRAM,
            threshold: 0.5,
        };
        let splits = ["dev", "test", "sealed", "dev_twin"];
        for a in splits {
            for b in splits {
                if a == b {
                    continue;
                }
                let (ra, rb) = (read(a), read(b));
                let shared = crate::policy::contamination::shared_items(&ra, &rb, cfg, None);
                assert_eq!(shared, 0, "{b} items found in {a}");
            }
        }
    }
}
