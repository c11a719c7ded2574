//! Every action and query, declared once. From the one table below come:
//! - the registry faces list tools from (`ACTIONS`: name, description, kind, roles, JSON Schemas);
//! - the role table (`ActionSpec::roles`, read by `policy::role_allows`);
//! - the parsed request (`AnyRequest`) and the borrowed view the policy decides on (`RequestRef`);
//! - the dispatch (`dispatch`) onto the `Execute` trait, which the Experiment OS implements — so
//!   the compiler refuses a declared action without a handler.
//!
//! Adding an action: its request/result types in `types.rs`, one line here, one file under
//! `os/actions/` with its handler, and its rule in `policy/`.

use schemars::{JsonSchema, Schema};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::schema::validate;
use super::types::*;
use crate::model::{ActionName, Caller, Role};
use crate::util::error::{Error, Result};

/// What running an action does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Reads the record only.
    Query,
    /// Writes one commit, quickly.
    Write,
    /// Runs a job (minutes to hours), then writes one commit.
    Job,
}

/// One entry of the registry.
pub struct ActionSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub kind: Kind,
    /// The roles that may perform it (a query: every role).
    pub roles: &'static [Role],
    pub input: fn() -> Schema,
    pub output: fn() -> Schema,
}

impl ActionSpec {
    /// Queries only read the record.
    pub fn read_only(&self) -> bool {
        self.kind == Kind::Query
    }
    /// The action as the record names it (None for a query, which is never recorded).
    pub fn action(&self) -> Option<ActionName> {
        ActionName::parse(self.name)
    }
    pub fn allows(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }
}

fn schema<T: JsonSchema>() -> Schema {
    crate::util::schema::schema_of::<T>()
}

fn parse_as<T: DeserializeOwned>(action: &str, args: Value) -> Result<T> {
    serde_json::from_value(args)
        .map_err(|e| Error::invalid(format!("invalid {action} request: {e}")))
}

fn to_value<T: Serialize>(r: Result<T>) -> Result<Value> {
    Ok(serde_json::to_value(r?)?)
}

const ALL_ROLES: &[Role] = &[Role::Owner, Role::Worker, Role::Reviewer, Role::Observer];

macro_rules! declare_actions {
    ($(
        $variant:ident: $name:literal, $kind:ident, [$($role:ident),*],
        $req:ty => $res:ty, $method:ident / $checked:ident,
        $desc:literal;
    )*) => {
        /// Every action and query, in the order faces list them.
        pub static ACTIONS: &[ActionSpec] = &[$(
            ActionSpec {
                name: $name,
                description: $desc,
                kind: Kind::$kind,
                roles: declare_actions!(@roles $kind [$($role),*]),
                input: schema::<$req>,
                output: schema::<$res>,
            },
        )*];

        /// A request to any action or query, validated and parsed.
        #[derive(Debug, Clone)]
        pub enum AnyRequest {
            $( $variant($req), )*
        }

        /// A request as the policy sees it (borrowed).
        #[derive(Debug, Clone, Copy)]
        pub enum RequestRef<'a> {
            $( $variant(&'a $req), )*
        }

        impl AnyRequest {
            /// Validate `args` against the input schema of `name` (errors name each field and
            /// rule), then parse them.
            pub fn parse(name: &str, args: Value) -> Result<AnyRequest> {
                validate(name, &args)?;
                match name {
                    $( $name => Ok(AnyRequest::$variant(parse_as(name, args)?)), )*
                    other => Err(Error::invalid(format!(
                        "unknown action {other:?}; actions are: {}",
                        super::schema::names()
                    ))),
                }
            }

            pub fn as_ref(&self) -> RequestRef<'_> {
                match self {
                    $( AnyRequest::$variant(r) => RequestRef::$variant(r), )*
                }
            }
        }

        impl RequestRef<'_> {
            pub fn name(&self) -> &'static str {
                match self {
                    $( RequestRef::$variant(_) => $name, )*
                }
            }
        }

        /// The handlers of every action and query. `*_checked` take a request that is already
        /// schema-valid; the typed methods validate it first (for callers that build requests
        /// in code).
        pub trait Execute {
            $(
                fn $checked(&self, caller: &Caller, req: $req) -> Result<$res>;

                fn $method(&self, caller: &Caller, req: $req) -> Result<$res> {
                    validate($name, &serde_json::to_value(&req)?)?;
                    self.$checked(caller, req).map_err(|e| self.explain(e))
                }
            )*

            /// Every handler's error passes here on its way out: an implementation may say more
            /// about an error than the layer that raised it could (the OS names damaged packs).
            fn explain(&self, e: Error) -> Error {
                e
            }
        }

        /// Run a parsed request on its handler and return its JSON result.
        pub fn dispatch<E: Execute + ?Sized>(e: &E, caller: &Caller, req: AnyRequest) -> Result<Value> {
            match req {
                $( AnyRequest::$variant(r) => to_value(e.$checked(caller, r).map_err(|x| e.explain(x))), )*
            }
        }
    };
    (@roles Query [$($role:ident),*]) => { ALL_ROLES };
    (@roles $kind:ident [$($role:ident),*]) => { &[$(Role::$role),*] };
}

declare_actions! {
    Branch: "branch", Write, [Owner, Worker, Reviewer],
        BranchRequest => BranchResult, branch / branch_checked,
        "Open a new research direction (node) under one parent node, or two parents to combine two findings. Returns the new node id.";
    RegisterDataset: "register_dataset", Write, [Owner, Worker],
        RegisterDatasetRequest => RegisterDatasetResult, register_dataset / register_dataset_checked,
        "Register a training dataset on a node under a study-wide unique name: inline rows, a source the study owner declared, or the built-in arithmetic generator. Only registered datasets can be trained on.";
    RunSft: "run_sft", Job, [Owner, Worker],
        RunSftRequest => RunSftResult, run_sft / run_sft_checked,
        "Fine-tune a checkpoint (\"base\" or one produced by a recorded run_sft) on registered datasets, as a job. Returns the job record and the new checkpoint's sha256.";
    Evaluate: "evaluate", Job, [Owner, Worker],
        EvaluateRequest => EvaluateResult, evaluate / evaluate_checked,
        "Evaluate a checkpoint on a task's dev split (per-item results) or protected test split (aggregate scores only, limited per node) with the study's pinned evaluator, as a job.";
    Compare: "compare", Write, [Owner, Worker, Reviewer],
        CompareRequest => CompareResult, compare / compare_checked,
        "Compare one metric across related nodes: per node the number of evaluations, mean, 95% interval and best value, and the trend at the end of its runs (training-loss slope and metric gain per 1,000 steps with 95% intervals across runs, steps trained, still learning or not). Recorded on `node`.";
    Review: "review", Write, [Owner, Reviewer],
        ReviewRequest => ReviewResult, review / review_checked,
        "Reviewers only: record verdicts (promising, dead_end, needs_more_seeds, still_learning) on related nodes and propose new directions, which may have two parents.";
    Conclude: "conclude", Write, [Owner, Worker, Reviewer],
        ConcludeRequest => ConcludeResult, conclude / conclude_checked,
        "Close a node with its findings (written to its notes.md) and outcome. A concluded node takes no more experiments; branch from it to continue.";
    Reproduce: "reproduce", Job, [Owner, Reviewer],
        ReproduceRequest => ReproduceResult, reproduce / reproduce_checked,
        "Re-run a recorded run_sft (node and action seq) from what the record holds: same base and datasets by hash, hyper-parameters, seed and environment (refused by rule environment-changed when the environment differs, unless allow_env_change). Records whether the checkpoint is identical and each trainer metric's difference. Counted against budgets like any job.";
    GetNode: "get_node", Query, [],
        GetNodeRequest => NodeInfo, get_node / get_node_checked,
        "One node: title, hypothesis, parents, children, status, every action and metric, and its findings.";
    ListNodes: "list_nodes", Query, [],
        ListNodesRequest => ListNodesResult, list_nodes / list_nodes_checked,
        "List nodes (optionally only open or concluded), oldest first, with paging.";
    Dag: "dag", Query, [],
        DagRequest => DagResult, dag / dag_checked,
        "Query the research DAG: full, frontier (open nodes), children or ancestors of a node, related nodes (parents, siblings, cousins) for comparison, best nodes by a metric, or the lineage of a checkpoint back to the base model.";
    Log: "log", Query, [],
        LogRequest => LogResult, log / log_checked,
        "Recorded actions, newest first, including rejected ones with the rule and reason.";
    Diff: "diff", Query, [],
        DiffRequest => DiffResult, diff / diff_checked,
        "What differs between two nodes: recipe and hyper-parameters (only in A, only in B, changed), datasets by name and hash with row counts, the environments their jobs ran in, and each metric's difference B - A with its 95% interval (paired over matching seeds, else Welch).";
    GetJob: "get_job", Query, [],
        GetJobRequest => JobInfo, get_job / get_job_checked,
        "A job's state, exit code, duration and log artifact.";
    CancelJob: "cancel_job", Write, [Owner, Worker],
        CancelJobRequest => CancelJobResult, cancel_job / cancel_job_checked,
        "Stop a running or queued job started by run_sft or evaluate. Its action is then recorded with the job cancelled (wait_job returns that result). A worker may cancel only the jobs it started.";
}

pub fn spec(name: &str) -> Option<&'static ActionSpec> {
    ACTIONS.iter().find(|a| a.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recorded_action_is_declared_and_every_declared_write_is_recordable() {
        for a in ActionName::ALL {
            // Genesis and the orchestrator's campaign start are the owner's, not agents' tools.
            if matches!(a, ActionName::Init | ActionName::Campaign) {
                assert!(spec(a.as_str()).is_none(), "{a} is not an agent action");
                continue;
            }
            let s = spec(a.as_str()).unwrap_or_else(|| panic!("{a} is not declared"));
            assert!(!s.read_only(), "{a} writes the record");
        }
        for s in ACTIONS {
            assert_eq!(s.read_only(), s.action().is_none(), "{}", s.name);
            assert!(s.allows(Role::Owner), "the owner may do {}", s.name);
            if !s.read_only() {
                assert!(!s.allows(Role::Observer), "observers may not {}", s.name);
            }
        }
    }

    #[test]
    fn parse_validates_before_it_parses() {
        let e = AnyRequest::parse(
            "branch",
            serde_json::json!({"parents": ["x"], "title": "t"}),
        )
        .expect_err("bad node id");
        assert!(e.message.contains("parents.0"), "{}", e.message);
        let e = AnyRequest::parse("nope", serde_json::json!({})).expect_err("unknown");
        assert!(e.message.contains("unknown action"), "{}", e.message);
        let r = AnyRequest::parse("get_job", serde_json::json!({"job": "j-0123456789abcdef"}))
            .expect("valid");
        assert_eq!(r.as_ref().name(), "get_job");
    }
}
