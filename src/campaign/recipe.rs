//! A research direction's experiment recipe for the built-in agents: the knobs of one SFT
//! experiment on a task family they can make data for (arithmetic, tiny-code), written as one
//! `recipe:` line in the node's hypothesis so the record itself says what a node tests (and any
//! agent, LLM or human, can read it).

use crate::api::types::{
    AnswerFormat, ArithOp, ArithParams, CodeParams, CodeStyle, DatasetSource,
    RegisterDatasetRequest, Schedule,
};
use crate::util::error::{Error, Result};
use rand::RngExt;
use rand::rngs::StdRng;
use std::fmt;

/// Where an experiment's weights start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    /// The study's base model.
    Base,
    /// The best dev checkpoint of the node's parent(s): continued training.
    Parent,
}

/// How the answers of a recipe's data are written: an arithmetic answer format, or a tiny-code
/// program style. Names are unique across both, so a recipe line reads without its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Answer(AnswerFormat),
    Code(CodeStyle),
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Answer(f) => f.name(),
            Format::Code(CodeStyle::Steps) => "steps",
            Format::Code(CodeStyle::Nested) => "nested",
            Format::Code(CodeStyle::Named) => "named",
        }
    }
}

/// The knobs the built-in agents search over.
#[derive(Debug, Clone, PartialEq)]
pub struct Recipe {
    pub format: Format,
    pub lr: f64,
    pub schedule: Schedule,
    /// Rows of task data.
    pub rows: u64,
    /// Mix in easier problems (one digit fewer; for code, single operations): a quarter as many
    /// rows.
    pub curriculum: bool,
    pub init: Init,
    /// Continued runs behind this one (0: trained from the base model): its rung in successive
    /// halving. The training budget behind its checkpoint is `(rung + 1) × steps`.
    pub rung: u32,
}

pub const LRS: [f64; 4] = [0.001, 0.003, 0.006, 0.012];
const ROWS: [u64; 2] = [5000, 20000];
/// The answer formats of arithmetic tasks.
pub const FORMATS: [Format; 3] = [
    Format::Answer(AnswerFormat::Plain),
    Format::Answer(AnswerFormat::Reversed),
    Format::Answer(AnswerFormat::Scratchpad),
];
/// The program styles of tiny-code tasks.
pub const CODE_FORMATS: [Format; 3] = [
    Format::Code(CodeStyle::Steps),
    Format::Code(CodeStyle::Nested),
    Format::Code(CodeStyle::Named),
];

fn schedule_name(s: Schedule) -> &'static str {
    match s {
        Schedule::Constant => "constant",
        Schedule::Linear => "linear",
        Schedule::Cosine => "cosine",
    }
}

impl fmt::Display for Recipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "recipe: format={} lr={} schedule={} rows={} curriculum={} init={}",
            self.format.name(),
            self.lr,
            schedule_name(self.schedule),
            self.rows,
            if self.curriculum { "yes" } else { "no" },
            match self.init {
                Init::Base => "base",
                Init::Parent => "parent",
            }
        )?;
        if self.rung > 0 {
            write!(f, " rung={}", self.rung)?;
        }
        Ok(())
    }
}

impl Recipe {
    /// The recipe line of a hypothesis, if it has one.
    pub fn find(hypothesis: &str) -> Option<Result<Recipe>> {
        hypothesis
            .lines()
            .find(|l| l.trim_start().starts_with("recipe:"))
            .map(Recipe::parse)
    }

    pub fn parse(line: &str) -> Result<Recipe> {
        let body = line.trim().strip_prefix("recipe:").ok_or_else(|| {
            Error::invalid(format!("recipe: expected `recipe: k=v ...`, got {line:?}"))
        })?;
        let mut r = Recipe::default();
        for kv in body.split_whitespace() {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| Error::invalid(format!("recipe: {kv:?} is not key=value")))?;
            let bad = || Error::invalid(format!("recipe: bad value {v:?} for {k}"));
            match k {
                "format" => {
                    r.format = *FORMATS
                        .iter()
                        .chain(&CODE_FORMATS)
                        .find(|f| f.name() == v)
                        .ok_or_else(bad)?
                }
                "lr" => {
                    r.lr = v.parse().map_err(|_| bad())?;
                    if !(r.lr > 0.0 && r.lr <= 1.0) {
                        return Err(bad());
                    }
                }
                "schedule" => {
                    r.schedule = match v {
                        "constant" => Schedule::Constant,
                        "linear" => Schedule::Linear,
                        "cosine" => Schedule::Cosine,
                        _ => return Err(bad()),
                    }
                }
                "rows" => {
                    r.rows = v.parse().map_err(|_| bad())?;
                    if !(1..=1_000_000).contains(&r.rows) {
                        return Err(bad());
                    }
                }
                "curriculum" => r.curriculum = v == "yes",
                "rung" => {
                    r.rung = v.parse().map_err(|_| bad())?;
                    if r.rung > 64 {
                        return Err(bad());
                    }
                }
                "init" => {
                    r.init = match v {
                        "base" => Init::Base,
                        "parent" => Init::Parent,
                        _ => return Err(bad()),
                    }
                }
                _ => return Err(Error::invalid(format!("recipe: unknown key {k:?}"))),
            }
        }
        Ok(r)
    }

    /// A uniformly random recipe in one of `formats` (always from the base model).
    pub fn random(rng: &mut StdRng, formats: &[Format]) -> Recipe {
        Recipe {
            format: formats[rng.random_range(0..formats.len())],
            lr: LRS[rng.random_range(0..LRS.len())],
            schedule: if rng.random_bool(0.5) {
                Schedule::Cosine
            } else {
                Schedule::Constant
            },
            rows: ROWS[rng.random_range(0..ROWS.len())],
            curriculum: rng.random_bool(0.5),
            init: Init::Base,
            rung: 0,
        }
    }

    /// The same recipe trained further: from this node's best checkpoint, one rung up.
    pub fn continued(&self) -> Recipe {
        Recipe {
            init: Init::Parent,
            rung: self.rung + 1,
            ..self.clone()
        }
    }

    /// The same settings in a different answer format: a new direction, from the base model.
    pub fn with_format(&self, format: Format) -> Recipe {
        Recipe {
            format,
            init: Init::Base,
            rung: 0,
            ..self.clone()
        }
    }

    /// One refinement: change one knob (never the format: a refinement stays in its direction),
    /// or continue training from the parent's best checkpoint (a recipe that already continues
    /// keeps doing so). Returns the change in words.
    pub fn mutate(&self, rng: &mut StdRng) -> (Recipe, String) {
        // A refinement builds on its parent: a parent that continued training is continued again.
        let mut r = self.clone();
        let what = match rng.random_range(0..5) {
            0 | 1 => {
                let i = LRS.iter().position(|x| *x == self.lr).unwrap_or(1);
                let j = if i == 0 {
                    1
                } else if i + 1 == LRS.len() || rng.random_bool(0.5) {
                    i - 1
                } else {
                    i + 1
                };
                r.lr = LRS[j];
                format!("learning rate {} -> {}", self.lr, r.lr)
            }
            2 => {
                let what;
                (r, what) = self.other_schedule();
                what
            }
            3 => {
                let what;
                (r, what) = self.other_curriculum();
                what
            }
            _ if self.init == Init::Base => {
                r.init = Init::Parent;
                "continue training from the parent's best checkpoint".to_string()
            }
            _ => {
                r.rows = if self.rows == ROWS[0] {
                    ROWS[1]
                } else {
                    ROWS[0]
                };
                format!("rows {} -> {}", self.rows, r.rows)
            }
        };
        // A child that starts from its parent's checkpoint sits one rung above it.
        r.rung = if r.init == Init::Parent {
            self.rung + 1
        } else {
            0
        };
        (r, what)
    }

    /// Refinements that train on from this recipe's checkpoint (one rung up), for a line that
    /// has levelled off: a lower learning rate first (annealing), then one other knob changed.
    /// The format and data stay. Each with the change in words.
    pub fn polishes(&self, rng: &mut StdRng) -> Vec<(Recipe, String)> {
        let on = |r: Recipe| Recipe {
            init: Init::Parent,
            rung: self.rung + 1,
            ..r
        };
        let mut out = Vec::new();
        if let Some(lower) = LRS.iter().rev().find(|x| **x < self.lr) {
            out.push((
                on(Recipe {
                    lr: *lower,
                    ..self.clone()
                }),
                format!("learning rate {} -> {lower}", self.lr),
            ));
        }
        let (other, what) = if rng.random_bool(0.5) {
            self.other_schedule()
        } else {
            self.other_curriculum()
        };
        out.push((on(other), what));
        out
    }

    /// This recipe with the other learning-rate schedule (cosine ↔ constant), and the change in words.
    fn other_schedule(&self) -> (Recipe, String) {
        let schedule = match self.schedule {
            Schedule::Cosine => Schedule::Constant,
            _ => Schedule::Cosine,
        };
        let what = format!("schedule -> {}", schedule_name(schedule));
        (
            Recipe {
                schedule,
                ..self.clone()
            },
            what,
        )
    }

    /// This recipe with its curriculum switched, and the change in words.
    fn other_curriculum(&self) -> (Recipe, String) {
        let curriculum = !self.curriculum;
        let what = format!("curriculum {}", if curriculum { "on" } else { "off" });
        (
            Recipe {
                curriculum,
                ..self.clone()
            },
            what,
        )
    }

    /// Combine two findings: `a`'s format and data with `b`'s optimiser settings, continuing
    /// from the better parent's checkpoint.
    pub fn merge(a: &Recipe, b: &Recipe) -> Recipe {
        Recipe {
            format: a.format,
            lr: b.lr,
            schedule: b.schedule,
            rows: a.rows.max(b.rows),
            curriculum: a.curriculum || b.curriculum,
            init: Init::Parent,
            rung: a.rung.max(b.rung) + 1,
        }
    }

    pub fn title(&self) -> String {
        format!(
            "{} format, lr {}, {}{}{}",
            self.format.name(),
            self.lr,
            schedule_name(self.schedule),
            if self.curriculum { ", curriculum" } else { "" },
            match (self.init, self.rung) {
                (Init::Parent, r) if r > 1 => format!(", continued ×{r}"),
                (Init::Parent, _) => ", continued".to_string(),
                _ => String::new(),
            }
        )
    }

    /// Names of the datasets this recipe trains on, with the request that registers each.
    pub fn datasets(
        &self,
        task: &TaskFamily,
        node: &str,
    ) -> Result<Vec<(String, RegisterDatasetRequest)>> {
        let fmt = self.format.name();
        let (op, digits, format) = match (task.kind, self.format) {
            (FamilyKind::Arith { op, digits }, Format::Answer(f)) => (op, digits, f),
            (FamilyKind::Code, Format::Code(style)) => {
                return Ok(self.code_datasets(task, node, style));
            }
            _ => {
                return Err(Error::invalid(format!(
                    "recipe format {fmt} is not a format of task {} (formats: {})",
                    task.name,
                    task.formats()
                        .iter()
                        .map(|f| f.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        };
        let main = format!("{}-{fmt}-{}", task.name, self.rows);
        let mut out = vec![(
            main.clone(),
            RegisterDatasetRequest {
                node: node.to_string(),
                name: main,
                source: DatasetSource::Arith(ArithParams {
                    op,
                    digits,
                    format,
                    n: self.rows,
                    seed: 1,
                }),
                description: format!(
                    "{} rows of the {} task in the {fmt} format",
                    self.rows, task.name
                ),
            },
        )];
        if self.curriculum && digits > 1 {
            let name = format!("{}-easy-{fmt}-{}", task.name, self.rows / 4);
            out.push((
                name.clone(),
                RegisterDatasetRequest {
                    node: node.to_string(),
                    name,
                    source: DatasetSource::Arith(ArithParams {
                        op,
                        digits: digits - 1,
                        format,
                        n: (self.rows / 4).max(1),
                        seed: 2,
                    }),
                    description: format!(
                        "curriculum: {}-digit problems in the {fmt} format",
                        digits - 1
                    ),
                },
            ));
        }
        Ok(out)
    }

    /// A tiny-code recipe's data: specifications of one to three operations in its style, and
    /// for the curriculum single operations (a quarter as many rows).
    fn code_datasets(
        &self,
        task: &TaskFamily,
        node: &str,
        style: CodeStyle,
    ) -> Vec<(String, RegisterDatasetRequest)> {
        let fmt = self.format.name();
        let req = |name: &str, max_ops: u32, n: u64, seed: u64, description: String| {
            (
                name.to_string(),
                RegisterDatasetRequest {
                    node: node.to_string(),
                    name: name.to_string(),
                    source: DatasetSource::Code(CodeParams {
                        style,
                        max_ops,
                        n,
                        seed,
                    }),
                    description,
                },
            )
        };
        let mut out = vec![req(
            &format!("{}-{fmt}-{}", task.name, self.rows),
            crate::train::code_tasks::MAX_OPS,
            self.rows,
            1,
            format!(
                "{} rows of the {} task in the {fmt} style",
                self.rows, task.name
            ),
        )];
        if self.curriculum {
            let n = (self.rows / 4).max(1);
            out.push(req(
                &format!("{}-single-{fmt}-{n}", task.name),
                1,
                n,
                2,
                format!("curriculum: single operations in the {fmt} style"),
            ));
        }
        out
    }
}

impl Default for Recipe {
    fn default() -> Self {
        Recipe {
            format: FORMATS[0],
            lr: 0.003,
            schedule: Schedule::Cosine,
            rows: 20000,
            curriculum: false,
            init: Init::Base,
            rung: 0,
        }
    }
}

/// A task family the built-in agents know how to make data for.
#[derive(Debug, Clone)]
pub struct TaskFamily {
    pub name: String,
    pub kind: FamilyKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FamilyKind {
    /// `addN`, `subN`, `mixedN`, `sumN` (three addends), `sortN` (the digits of an N-digit
    /// string in order): the arithmetic generator.
    Arith { op: ArithOp, digits: u32 },
    /// A `pass_at_1` task: the tiny-code generator.
    Code,
}

impl TaskFamily {
    /// A code task (metric `pass_at_1`) is the tiny-code family; otherwise `add3` → addition
    /// of 3-digit numbers, `sub2`, `mixed4`, ...
    pub fn from_task(name: &str, metric: &str) -> Result<TaskFamily> {
        if metric == crate::train::programs::METRIC {
            return Ok(TaskFamily {
                name: name.to_string(),
                kind: FamilyKind::Code,
            });
        }
        // No prefix is another's prefix, so at most one matches.
        let Some((op, rest)) = ArithOp::ALL
            .into_iter()
            .find_map(|op| Some((op, name.strip_prefix(op.task_prefix())?)))
        else {
            return Err(unknown_task(name));
        };
        let digits: u32 = rest.parse().map_err(|_| unknown_task(name))?;
        if !(1..=crate::model::data::MAX_ARITH_DIGITS).contains(&digits) {
            return Err(unknown_task(name));
        }
        Ok(TaskFamily {
            name: name.to_string(),
            kind: FamilyKind::Arith { op, digits },
        })
    }

    /// The formats a recipe for this family may use.
    pub fn formats(&self) -> &'static [Format] {
        match self.kind {
            FamilyKind::Arith { .. } => &FORMATS,
            FamilyKind::Code => &CODE_FORMATS,
        }
    }

    /// The default recipe in this family's first format.
    pub fn default_recipe(&self) -> Recipe {
        Recipe {
            format: self.formats()[0],
            ..Recipe::default()
        }
    }
}

fn unknown_task(name: &str) -> Error {
    Error::invalid(format!(
        "task {name:?}: the built-in agents make data for arithmetic tasks named addN, subN, \
         mixedN, sumN or sortN (N = digits, 1-6) and for tiny-code tasks (metric pass_at_1); use LLM or command \
         agents for other tasks"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn recipe_round_trips_through_its_line() {
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..50 {
            let formats: &[Format] = if rng.random_bool(0.5) {
                &FORMATS
            } else {
                &CODE_FORMATS
            };
            let r = Recipe::random(&mut rng, formats);
            let (m, _) = r.mutate(&mut rng);
            for x in [r, m] {
                let line = x.to_string();
                assert_eq!(Recipe::parse(&line).unwrap(), x, "{line}");
                let hyp = format!("Some words.\n{line}\nproposal: n0/3#1");
                assert_eq!(Recipe::find(&hyp).unwrap().unwrap(), x);
            }
        }
    }

    #[test]
    fn a_continued_recipe_climbs_a_rung_and_says_so() {
        let r = Recipe::default();
        let c = r.continued().continued();
        assert_eq!((c.init, c.rung), (Init::Parent, 2));
        assert!(c.to_string().ends_with("init=parent rung=2"), "{c}");
        assert_eq!(Recipe::parse(&c.to_string()).unwrap(), c);
        assert!(c.title().contains("continued"), "{}", c.title());
        // A rung-0 recipe's line is what it always was.
        assert!(!r.to_string().contains("rung"));
        assert!(Recipe::parse("recipe: rung=x").is_err());
        // A new format is a new direction: from the base model again.
        let f = c.with_format(FORMATS[2]);
        assert_eq!((f.init, f.rung), (Init::Base, 0));
    }

    #[test]
    fn bad_recipes_name_the_problem() {
        let e = Recipe::parse("recipe: format=octal")
            .unwrap_err()
            .to_string();
        assert!(e.contains("format"), "{e}");
        let e = Recipe::parse("recipe: lr=2").unwrap_err().to_string();
        assert!(e.contains("lr"), "{e}");
        let e = Recipe::parse("recipe: depth=3").unwrap_err().to_string();
        assert!(e.contains("depth"), "{e}");
        assert!(Recipe::find("no recipe here").is_none());
    }

    #[test]
    fn a_levelled_off_line_is_polished_from_its_checkpoint_with_a_lower_rate_first() {
        let mut rng = StdRng::seed_from_u64(5);
        let line = Recipe::default().continued().continued();
        let p = line.polishes(&mut rng);
        assert_eq!(p.len(), 2);
        let (first, what) = &p[0];
        assert!(first.lr < line.lr, "{what}");
        assert!(what.contains("learning rate"), "{what}");
        for (r, what) in &p {
            assert_eq!((r.init, r.rung), (Init::Parent, line.rung + 1), "{what}");
            assert_eq!((r.format, r.rows), (line.format, line.rows), "{what}");
            assert_ne!(r, &line.continued(), "a polish changes a knob: {what}");
        }
        // At the lowest rate there is nothing to anneal: only the other knob.
        let low = Recipe {
            lr: LRS[0],
            ..line.clone()
        };
        let p = low.polishes(&mut rng);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].0.lr, LRS[0]);
    }

    #[test]
    fn refinements_keep_the_direction() {
        let mut rng = StdRng::seed_from_u64(9);
        let r = Recipe::default();
        for _ in 0..30 {
            let (m, what) = r.mutate(&mut rng);
            assert_eq!(m.format, r.format);
            assert_ne!(m, r, "{what}");
        }
    }

    #[test]
    fn task_families() {
        let t = TaskFamily::from_task("add3", "exact_match").unwrap();
        assert_eq!(
            t.kind,
            FamilyKind::Arith {
                op: ArithOp::Add,
                digits: 3
            }
        );
        assert_eq!(
            TaskFamily::from_task("sum2", "exact_match").unwrap().kind,
            FamilyKind::Arith {
                op: ArithOp::Sum,
                digits: 2
            }
        );
        assert!(TaskFamily::from_task("gsm8k", "exact_match").is_err());
        assert!(TaskFamily::from_task("add9", "exact_match").is_err());
        let code = TaskFamily::from_task("strings", "pass_at_1").unwrap();
        assert_eq!(code.kind, FamilyKind::Code);
        assert_eq!(code.default_recipe().format.name(), "steps");
    }

    #[test]
    fn a_code_recipe_makes_code_data_and_an_arithmetic_format_is_refused() {
        let code = TaskFamily::from_task("strings", "pass_at_1").unwrap();
        let r = Recipe {
            curriculum: true,
            ..code.default_recipe()
        };
        let ds = r.datasets(&code, "n1").unwrap();
        assert_eq!(ds.len(), 2);
        match &ds[1].1.source {
            DatasetSource::Code(p) => assert_eq!((p.max_ops, p.n), (1, r.rows / 4)),
            other => panic!("{other:?}"),
        }
        let e = Recipe::default()
            .datasets(&code, "n1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("plain") && e.contains("steps"), "{e}");
        let line = r.to_string();
        assert!(line.contains("format=steps"), "{line}");
        assert_eq!(Recipe::parse(&line).unwrap(), r);
    }
}
