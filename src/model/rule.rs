//! The policy's rules by name. A rejection names exactly one; the record stores its name
//! (`Rsim-Rule`), and the audit counts rejections per rule.

use std::fmt;

macro_rules! rules {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, )*) => {
        /// One rule of the policy guard.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Rule {
            $( $(#[$doc])* $variant, )*
        }

        impl Rule {
            pub const ALL: &'static [Rule] = &[$(Rule::$variant,)*];

            /// The rule's name as the record writes it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( Rule::$variant => $name, )*
                }
            }

            /// Rejections that answer something about the protected items — which rows the
            /// gate matched, or that data lacks what a filter asked for — and so count toward an
            /// agent's probing limit (`policy.max_contamination_rejections_per_agent`).
            pub const PROBES: [Rule; 3] =
                [Rule::Contamination, Rule::DevContamination, Rule::EmptyDataset];

            pub fn parse(s: &str) -> Option<Rule> {
                Self::ALL.iter().copied().find(|r| r.as_str() == s)
            }
        }
    };
}

rules! {
    /// The caller's role may not perform the action.
    Role = "role",
    /// More experiments on a concluded node.
    NodeConcluded = "node-concluded",
    MaxParents = "max-parents",
    BudgetNodes = "budget-nodes",
    DatasetNameTaken = "dataset-name-taken",
    /// Registered datasets past the study's row or storage budget (`budgets.dataset_rows`,
    /// `budgets.dataset_storage_bytes`), counting registrations in flight.
    BudgetDatasetStorage = "budget-dataset-storage",
    /// One agent's registered datasets past its row or storage budget.
    BudgetAgentDatasetStorage = "budget-agent-dataset-storage",
    InlineRowsLimit = "inline-rows-limit",
    /// A dataset (or the union one run_sft trains on) larger than the study's bounds, refused on
    /// its projected size before anything is allocated.
    DatasetSizeLimit = "dataset-size-limit",
    /// Data that reproduces protected eval items (registered, or the union one run_sft trains on).
    Contamination = "contamination",
    /// Data that reproduces dev items (the evidence reviewers rank on) or the dev split's hidden
    /// twin, unless the owner lets agents train on dev (`policy.train_on_dev`).
    DevContamination = "dev-contamination",
    /// A dataset that keeps no row (a filter that matched nothing): an answer about which
    /// problems generated data lacks, counted with contamination rejections by the probing limit.
    EmptyDataset = "empty-dataset",
    /// Using the contamination gate as an oracle for test membership.
    ContaminationProbing = "contamination-probing",
    /// An agent past its write calls per minute (`policy.max_writes_per_agent_per_minute`): a
    /// loop or a flood. Recorded once a minute per agent; the calls in between are only refused.
    Throttled = "throttled",
    DatasetUnregistered = "dataset-unregistered",
    CheckpointProvenance = "checkpoint-provenance",
    CheckpointIntegrity = "checkpoint-integrity",
    /// Training on a registered dataset whose stored object changed after registration.
    DatasetIntegrity = "dataset-integrity",
    EvaluatorPinned = "evaluator-pinned",
    EvalSetPinned = "eval-set-pinned",
    TestEvaluationLimit = "test-evaluation-limit",
    BudgetCompute = "budget-compute",
    /// What the study, or one agent, holds on disk (`budgets.storage_bytes`,
    /// `budgets.agent_storage_bytes`).
    BudgetStorage = "budget-storage",
    BudgetNodeCompute = "budget-node-compute",
    BudgetAgentCompute = "budget-agent-compute",
    BudgetEvaluations = "budget-evaluations",
    BudgetNodeEvaluations = "budget-node-evaluations",
    BudgetAgentEvaluations = "budget-agent-evaluations",
    /// An agent's test-split evaluations across all nodes.
    BudgetAgentTestEvaluations = "budget-agent-test-evaluations",
    NetworkIsolation = "network-isolation",
    /// Running a job whose environment could not be pinned (a Nix flake without its narHash).
    EnvironmentPinned = "environment-pinned",
    /// Starting a campaign while another orchestrator (another `rsim run`) runs one on the study.
    CampaignRunning = "campaign-running",
    /// Cancelling a job that another agent started (owners may cancel any job).
    JobOwner = "job-owner",
    /// A worker concluding a node another worker opened (its opener, reviewers and the owner
    /// may): a rival's direction cannot be closed under it.
    NodeOwner = "node-owner",
    /// Running a job without its sandbox when the study requires one (`policy.sandbox`).
    Sandbox = "sandbox",
    /// Reproducing a job in another environment than the one it ran in, unless asked to.
    EnvironmentChanged = "environment-changed",
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_parse_back() {
        let mut seen = std::collections::BTreeSet::new();
        for r in Rule::ALL {
            assert!(seen.insert(r.as_str()), "duplicate rule name {r}");
            assert_eq!(Rule::parse(r.as_str()), Some(*r));
        }
        assert_eq!(Rule::parse("no-such-rule"), None);
    }
}
