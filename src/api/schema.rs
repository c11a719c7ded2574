//! The action registry: every action and query with its description and JSON Schemas, and the
//! validator that checks incoming JSON against the input schema before serde sees it.

use std::sync::OnceLock;

use schemars::{JsonSchema, Schema};
use serde_json::Value;

use super::types::*;
use crate::model::ActionRecord;
use crate::util::error::{Error, Result};

/// One entry of the registry.
pub struct ActionSpec {
    pub name: &'static str,
    pub description: &'static str,
    /// Queries only read the record.
    pub read_only: bool,
    pub input: fn() -> Schema,
    pub output: fn() -> Schema,
}

fn schema<T: JsonSchema>() -> Schema {
    schemars::schema_for!(T)
}

/// Every action and query, in the order faces list them.
pub static ACTIONS: &[ActionSpec] = &[
    ActionSpec {
        name: "branch",
        description: "Open a new research direction (node) under one parent node, or two parents to combine two findings. Returns the new node id.",
        read_only: false,
        input: schema::<BranchRequest>,
        output: schema::<BranchResult>,
    },
    ActionSpec {
        name: "register_dataset",
        description: "Register a training dataset on a node under a study-wide unique name: inline rows, a source the study owner declared, or the built-in arithmetic generator. Only registered datasets can be trained on.",
        read_only: false,
        input: schema::<RegisterDatasetRequest>,
        output: schema::<RegisterDatasetResult>,
    },
    ActionSpec {
        name: "run_sft",
        description: "Fine-tune a checkpoint (\"base\" or one produced by a recorded run_sft) on registered datasets, as a job. Returns the job record and the new checkpoint's sha256.",
        read_only: false,
        input: schema::<RunSftRequest>,
        output: schema::<RunSftResult>,
    },
    ActionSpec {
        name: "evaluate",
        description: "Evaluate a checkpoint on a task's dev split (per-item results) or protected test split (aggregate scores only, limited per node) with the study's pinned evaluator, as a job.",
        read_only: false,
        input: schema::<EvaluateRequest>,
        output: schema::<EvaluateResult>,
    },
    ActionSpec {
        name: "compare",
        description: "Compare one metric across related nodes: per node the number of evaluations, mean, 95% interval and best value. Recorded on `node`.",
        read_only: false,
        input: schema::<CompareRequest>,
        output: schema::<CompareResult>,
    },
    ActionSpec {
        name: "review",
        description: "Reviewers only: record verdicts (promising, dead_end, needs_more_seeds) on related nodes and propose new directions, which may have two parents.",
        read_only: false,
        input: schema::<ReviewRequest>,
        output: schema::<ReviewResult>,
    },
    ActionSpec {
        name: "conclude",
        description: "Close a node with its findings (written to its notes.md) and outcome. A concluded node takes no more experiments; branch from it to continue.",
        read_only: false,
        input: schema::<ConcludeRequest>,
        output: schema::<ConcludeResult>,
    },
    ActionSpec {
        name: "get_node",
        description: "One node: title, hypothesis, parents, children, status, every action and metric, and its findings.",
        read_only: true,
        input: schema::<GetNodeRequest>,
        output: schema::<NodeInfo>,
    },
    ActionSpec {
        name: "list_nodes",
        description: "List nodes (optionally only open or concluded), oldest first, with paging.",
        read_only: true,
        input: schema::<ListNodesRequest>,
        output: schema::<ListNodesResult>,
    },
    ActionSpec {
        name: "dag",
        description: "Query the research DAG: full, frontier (open nodes), children or ancestors of a node, related nodes (parents, siblings, cousins) for comparison, best nodes by a metric, or the lineage of a checkpoint back to the base model.",
        read_only: true,
        input: schema::<DagRequest>,
        output: schema::<DagResult>,
    },
    ActionSpec {
        name: "log",
        description: "Recorded actions, newest first, including rejected ones with the rule and reason.",
        read_only: true,
        input: schema::<LogRequest>,
        output: schema::<LogResult>,
    },
    ActionSpec {
        name: "get_job",
        description: "A job's state, exit code, duration and log artifact.",
        read_only: true,
        input: schema::<GetJobRequest>,
        output: schema::<JobInfo>,
    },
];

pub fn spec(name: &str) -> Option<&'static ActionSpec> {
    ACTIONS.iter().find(|a| a.name == name)
}

/// The compiled input validator of `action`, built the first time that action is validated in
/// this process (a CLI process runs one action: it compiles one schema, not every action's).
fn validator(action: &str) -> Result<&'static jsonschema::Validator> {
    type Compiled = OnceLock<std::result::Result<jsonschema::Validator, String>>;
    static V: OnceLock<Vec<Compiled>> = OnceLock::new();
    let cells = V.get_or_init(|| ACTIONS.iter().map(|_| OnceLock::new()).collect());
    let i = ACTIONS
        .iter()
        .position(|a| a.name == action)
        .ok_or_else(|| {
            Error::invalid(format!(
                "unknown action {action:?}; actions are: {}",
                names()
            ))
        })?;
    let a = &ACTIONS[i];
    cells[i]
        .get_or_init(|| {
            jsonschema::validator_for(&(a.input)().to_value()).map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| {
            Error::internal(format!(
                "the input schema of {action} does not compile: {e}"
            ))
        })
}

/// Validate `args` against the input schema of `action`; the error names each field and the rule it broke.
pub fn validate(action: &str, args: &Value) -> Result<()> {
    validate_with(action, validator(action)?, args)
}

/// Compile the JSON Schema of a request type that is not an action (e.g. a face's own tool).
pub fn validator_for<T: JsonSchema>() -> Result<jsonschema::Validator> {
    jsonschema::validator_for(&schema::<T>().to_value())
        .map_err(|e| Error::internal(format!("schema does not compile: {e}")))
}

/// Validate `args` of request `what` against a compiled schema, with the same readable errors as actions.
pub fn validate_with(what: &str, v: &jsonschema::Validator, args: &Value) -> Result<()> {
    let action = what;
    let mut problems: Vec<String> = Vec::new();
    for e in v.iter_errors(args) {
        let path = e.instance_path().to_string();
        let field = if path.is_empty() {
            "(request)".to_string()
        } else {
            path.trim_start_matches('/').replace('/', ".")
        };
        let msg = match e.kind() {
            jsonschema::error::ValidationErrorKind::Pattern { pattern } => {
                match describe_pattern(pattern) {
                    Some(d) => format!("{} is not {d}", short(e.instance())),
                    None => e.to_string(),
                }
            }
            _ => e.to_string(),
        };
        problems.push(format!("{field}: {msg}"));
        if problems.len() >= 8 {
            break;
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "invalid {action} request: {}",
            problems.join("; ")
        )))
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        let mut cut = 80;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}…", &s[..cut])
    } else {
        s
    }
}

pub fn names() -> String {
    ACTIONS
        .iter()
        .map(|a| a.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every schema file under `schemas/`: (relative path, pretty JSON).
pub fn all_schema_files() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let pretty = |s: Schema| serde_json::to_string_pretty(&s.to_value()).unwrap_or_default() + "\n";
    for a in ACTIONS {
        out.push((
            format!("actions/{}.input.json", a.name),
            pretty((a.input)()),
        ));
        out.push((
            format!("actions/{}.output.json", a.name),
            pretty((a.output)()),
        ));
    }
    out.push((
        "rsim.toml.json".to_string(),
        pretty(schema::<crate::config::StudyConfig>()),
    ));
    out.push((
        "action-record.json".to_string(),
        pretty(schema::<ActionRecord>()),
    ));
    out.push((
        "node.toml.json".to_string(),
        pretty(schema::<crate::model::NodeMeta>()),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Validators compile lazily, one per action: make sure every one of them compiles.
    #[test]
    fn every_action_input_schema_compiles() {
        for a in ACTIONS {
            assert!(validator(a.name).is_ok(), "{}", a.name);
        }
        assert!(validator("no_such_action").is_err());
    }
}
