//! The `branch` action.

use std::collections::BTreeSet;

use crate::os::jobrun::ClaimGuard;
use crate::os::*;
use crate::record::claims::{Hold, HoldKind};
use crate::record::commit::{FirstAction, NodeId};

impl Study {
    pub(in crate::os) fn exec_branch(
        &self,
        caller: &Caller,
        req: BranchRequest,
    ) -> Result<BranchResult> {
        check_caller(caller)?;
        let mut seen = BTreeSet::new();
        for p in &req.parents {
            if !seen.insert(p) {
                return Err(Error::invalid(format!("parents: {p} is listed twice")));
            }
        }
        let mut parent_tips = Vec::new();
        for (i, p) in req.parents.iter().enumerate() {
            parent_tips.push(
                self.require_node_tip(p)
                    .map_err(|e| e.context(format!("parents.{i}")))?,
            );
        }
        let first = req.parents[0].clone();
        let node_status = Some(self.record.snapshot(parent_tips[0])?.meta.status);
        let request = serde_json::to_value(&req)?;
        // The node budget counts the nodes indexed plus the nodes other writers (this process or
        // another) are creating, and holds this one's place until it is created and indexed, all
        // in one write transaction of the index: racing branches cannot together pass the budget.
        let in_git = self.nodes_in_git()?;
        let (token, decision) = self.index.with_holds(|index| {
            let facts = Facts {
                node_status,
                node_count: index.node_count()?.max(in_git) + index.held(&caller.agent)?.nodes,
                ..Facts::default()
            };
            let decision = policy::check(Request::Branch(&req), caller, &self.config, &facts);
            let hold = decision
                .accepted()
                .then(|| Hold::one(HoldKind::Node, &caller.agent));
            Ok((hold, decision))
        })?;
        let _held = token.map(|t| ClaimGuard::hold_until_recorded(&self.index, t));
        if !decision.accepted() {
            return Err(self.record_rejection(
                &first,
                caller,
                ActionName::Branch,
                request,
                decision,
            ));
        }
        let num = u64::try_from(self.index.max_node_num()? + 1).unwrap_or(0);
        let body = if req.hypothesis.is_empty() {
            format!("Parents: {}", req.parents.join(", "))
        } else {
            format!(
                "Hypothesis: {}\n\nParents: {}",
                req.hypothesis,
                req.parents.join(", ")
            )
        };
        let (id, commit) =
            self.writer()
                .create(NodeId::Allocate(num), &parent_tips, &req.parents, |id| {
                    let at = now_rfc3339();
                    Ok(FirstAction {
                        meta: NodeMeta {
                            id: id.to_string(),
                            title: req.title.clone(),
                            hypothesis: req.hypothesis.clone(),
                            parents: req.parents.clone(),
                            status: NodeStatus::Open,
                            created_at: at.clone(),
                            created_by: caller.agent.clone(),
                            outcome: None,
                        },
                        record: ActionRecord {
                            seq: 1,
                            action: ActionName::Branch,
                            node: id.to_string(),
                            agent: caller.agent.clone(),
                            role: caller.role,
                            at,
                            summary: format!("open {id} {:?}", req.title),
                            request: request.clone(),
                            decision: Decision::accept(),
                            result: Some(
                                serde_json::json!({ "node": id, "branch": branch_name(id) }),
                            ),
                            job: None,
                            artifacts: Vec::new(),
                            metrics: Vec::new(),
                            refers_to: req.parents.clone(),
                        },
                        body: body.clone(),
                    })
                })?;
        Ok(BranchResult {
            branch: branch_name(&id),
            node: id,
            commit: commit.to_string(),
        })
    }
}

/// A node's branch as people name it (`rsim/n/n12`).
pub(crate) fn branch_name(id: &str) -> String {
    record::node_ref(id)
        .trim_start_matches("refs/heads/")
        .to_string()
}
