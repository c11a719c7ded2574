//! Data types that both the agent API and the job side use: rows, the arithmetic generator's
//! parameters, training schedules and adapters, evaluated items. Plain data, no behaviour beyond
//! names — and one function both sides must share: `training_text`, the exact text a trainer
//! learns from a row, which the contamination gate also scans (so the two can never disagree
//! about where a prompt ends and its answer begins).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One training example.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Row {
    #[schemars(length(min = 1, max = 20000))]
    pub prompt: String,
    #[schemars(length(max = 20000))]
    pub answer: String,
}

/// The text a trainer learns from a row: the prompt immediately followed by the answer, as one
/// sequence (the embedded trainers add only their end marker). Every trainer builds its input
/// with this function, and the contamination gate scans exactly this text — a test item cut at
/// another place between prompt and answer is the same text here.
pub fn training_text(row: &Row) -> String {
    let mut text = String::with_capacity(row.prompt.len() + row.answer.len());
    text.push_str(&row.prompt);
    text.push_str(&row.answer);
    text
}

/// How many characters of `training_text(row)` are the prompt (the context of answer-only loss).
pub fn prompt_chars(row: &Row) -> usize {
    row.prompt.chars().count()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArithOp {
    Add,
    Sub,
    Mixed,
    /// Three addends: `12+34+56=`.
    Sum,
    /// Subtraction in whichever order the operands come, so results may be negative: `12-34=` →
    /// `-22` (reversed `r22-`: the answer's characters last first, its sign too).
    Diff,
    /// Not arithmetic: a string of digits (leading zeros too) and its digits in ascending order,
    /// `530912=` → `012359` — a family with no carries, to hold the reviewer out on.
    Sort,
    /// Not binary arithmetic either: a string of digits (leading zeros too) and the sum of its
    /// digits, `530912=` → `20` (scratchpad: the running sums, two digits each, `05=08=…|20`).
    DigitSum,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AnswerFormat {
    /// `123+456=579`
    Plain,
    /// Answer digits least-significant first: `123+456=975`
    Reversed,
    /// Per-digit work with carries, then the answer.
    Scratchpad,
}

impl AnswerFormat {
    /// The name used in requests, recipes and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            AnswerFormat::Plain => "plain",
            AnswerFormat::Reversed => "reversed",
            AnswerFormat::Scratchpad => "scratchpad",
        }
    }
}

impl ArithOp {
    pub const ALL: [ArithOp; 7] = [
        ArithOp::Add,
        ArithOp::Sub,
        ArithOp::Mixed,
        ArithOp::Sum,
        ArithOp::Diff,
        ArithOp::Sort,
        ArithOp::DigitSum,
    ];

    /// The operation's name in task names (`sub2`, `dsum6`: the operation, then the digits).
    pub fn task_prefix(self) -> &'static str {
        match self {
            ArithOp::Add => "add",
            ArithOp::Sub => "sub",
            ArithOp::Mixed => "mixed",
            ArithOp::Sum => "sum",
            ArithOp::Sort => "sort",
            ArithOp::Diff => "diff",
            ArithOp::DigitSum => "dsum",
        }
    }
}

/// The most digits an operand (or a string to sort) of the arithmetic generator may have; task
/// names (`sort7`) are held to it too.
pub const MAX_ARITH_DIGITS: u32 = 7;

/// Parameters of the built-in arithmetic generator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArithParams {
    pub op: ArithOp,
    /// Digits per operand (per string, when sorting).
    #[schemars(range(min = 1, max = MAX_ARITH_DIGITS))]
    pub digits: u32,
    pub format: AnswerFormat,
    /// Number of rows.
    #[schemars(range(min = 1, max = 1000000))]
    pub n: u64,
    pub seed: u64,
}

/// How the code generator writes a program (tiny-code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CodeStyle {
    /// One statement per operation: `s=input();s=s[::-1];s=s[:3];print(s)`
    Steps,
    /// One nested expression: `print(input()[::-1][:3])`
    Nested,
    /// A fresh name per step: `a=input();b=a[::-1];c=b[:3];print(c)`
    Named,
}

/// Parameters of the built-in code generator (tiny-code): specifications of 1 to `max_ops`
/// string operations with a program for each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeParams {
    pub style: CodeStyle,
    /// The most operations a specification names (each row names 1 to this many).
    #[schemars(range(min = 1, max = 3))]
    pub max_ops: u32,
    /// Number of rows.
    #[schemars(range(min = 1, max = 1000000))]
    pub n: u64,
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    Constant,
    Linear,
    #[default]
    Cosine,
}

/// Which weights train.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Adapter {
    /// Every weight trains.
    #[default]
    Full,
    /// Low-rank adapters.
    Lora {
        #[schemars(range(min = 1, max = 256))]
        rank: u32,
        #[schemars(range(min = 0.0, max = 1024.0))]
        alpha: f64,
    },
}

/// One evaluated item (dev split only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalItem {
    pub prompt: String,
    pub expected: String,
    pub output: String,
    pub correct: bool,
}

impl AnswerFormat {
    pub const ALL: [AnswerFormat; 3] = [
        AnswerFormat::Plain,
        AnswerFormat::Reversed,
        AnswerFormat::Scratchpad,
    ];
}

impl std::str::FromStr for AnswerFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown answer format {s:?}; formats: {}",
                    Self::ALL.map(AnswerFormat::name).join(", ")
                )
            })
    }
}
