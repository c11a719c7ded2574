//! One file per action: each adds its `*_checked` method to `Study` (validate the semantics,
//! gather facts, ask the policy, run, record through the commit protocol).

mod branch;
mod compare;
mod conclude;
mod evaluate;
pub use evaluate::FreshEvidence;
mod register_dataset;
pub(in crate::os) use register_dataset::DatasetTotals;
mod reproduce;
mod review;
mod run_sft;

use crate::api::actions::Execute;
use crate::api::types::*;
use crate::model::Caller;
use crate::os::Study;
use crate::util::error::Result;

/// Every declared action and query, onto the handler in its own file.
impl Execute for Study {
    fn branch_checked(&self, caller: &Caller, req: BranchRequest) -> Result<BranchResult> {
        self.exec_branch(caller, req)
    }
    fn register_dataset_checked(
        &self,
        caller: &Caller,
        req: RegisterDatasetRequest,
    ) -> Result<RegisterDatasetResult> {
        self.exec_register_dataset(caller, req)
    }
    fn run_sft_checked(&self, caller: &Caller, req: RunSftRequest) -> Result<RunSftResult> {
        self.exec_run_sft(caller, req)
    }
    fn evaluate_checked(&self, caller: &Caller, req: EvaluateRequest) -> Result<EvaluateResult> {
        self.exec_evaluate(caller, req)
    }
    fn compare_checked(&self, caller: &Caller, req: CompareRequest) -> Result<CompareResult> {
        self.exec_compare(caller, req)
    }
    fn review_checked(&self, caller: &Caller, req: ReviewRequest) -> Result<ReviewResult> {
        self.exec_review(caller, req)
    }
    fn conclude_checked(&self, caller: &Caller, req: ConcludeRequest) -> Result<ConcludeResult> {
        self.exec_conclude(caller, req)
    }
    fn cancel_job_checked(
        &self,
        caller: &Caller,
        req: CancelJobRequest,
    ) -> Result<CancelJobResult> {
        self.exec_cancel_job(caller, req)
    }
    fn reproduce_checked(&self, caller: &Caller, req: ReproduceRequest) -> Result<ReproduceResult> {
        self.exec_reproduce(caller, req)
    }
    fn get_node_checked(&self, _: &Caller, req: GetNodeRequest) -> Result<NodeInfo> {
        self.exec_get_node(req)
    }
    fn list_nodes_checked(&self, _: &Caller, req: ListNodesRequest) -> Result<ListNodesResult> {
        self.exec_list_nodes(req)
    }
    fn dag_checked(&self, _: &Caller, req: DagRequest) -> Result<DagResult> {
        self.exec_dag(req)
    }
    fn log_checked(&self, _: &Caller, req: LogRequest) -> Result<LogResult> {
        self.exec_log(req)
    }
    fn diff_checked(&self, _: &Caller, req: DiffRequest) -> Result<DiffResult> {
        self.exec_diff(req)
    }
    fn get_job_checked(&self, _: &Caller, req: GetJobRequest) -> Result<JobInfo> {
        self.exec_get_job(req)
    }
    /// A git error that comes from a damaged pack names the pack (`record::explain_damage`).
    fn explain(&self, e: crate::util::error::Error) -> crate::util::error::Error {
        self.record.explain_damage(e)
    }
}
