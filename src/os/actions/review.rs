//! The `review` action.

use crate::os::*;

impl Study {
    pub(in crate::os) fn exec_review(
        &self,
        caller: &Caller,
        req: ReviewRequest,
    ) -> Result<ReviewResult> {
        check_caller(caller)?;
        let snap = self.require_node(&req.node)?;
        for (i, v) in req.verdicts.iter().enumerate() {
            if self.index.node(&v.node)?.is_none() {
                return Err(Error::not_found(format!(
                    "verdicts.{i}.node: no node {}",
                    v.node
                )));
            }
        }
        for (i, p) in req.proposals.iter().enumerate() {
            for (j, parent) in p.parents.iter().enumerate() {
                if self.index.node(parent)?.is_none() {
                    return Err(Error::not_found(format!(
                        "proposals.{i}.parents.{j}: no node {parent}"
                    )));
                }
            }
        }
        let facts = Facts {
            node_status: Some(snap.meta.status),
            ..Facts::default()
        };
        let request = serde_json::to_value(&req)?;
        let decision = policy::check(Request::Review(&req), caller, &self.config, &facts);
        if !decision.accepted() {
            return Err(self.record_rejection(
                &req.node,
                caller,
                ActionName::Review,
                request,
                decision,
            ));
        }
        let mut md = format!(
            "# Review by {} ({})\n\n{}\n",
            caller.agent, caller.role, req.summary
        );
        if !req.verdicts.is_empty() {
            md.push_str("\n## Verdicts\n\n");
            for v in &req.verdicts {
                let verdict = serde_json::to_value(v.verdict)?
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                md.push_str(&format!("- **{}**: {verdict} — {}\n", v.node, v.reason));
            }
        }
        if !req.proposals.is_empty() {
            md.push_str("\n## Proposed directions\n\n");
            for p in &req.proposals {
                md.push_str(&format!(
                    "- {} (from {}): {}\n",
                    p.title,
                    p.parents.join(" + "),
                    p.hypothesis
                ));
            }
        }
        let mut path = String::new();
        let (oid, _) =
            self.commit_action(&req.node, caller, ActionName::Review, request, |snap| {
                path = format!("reviews/{:04}.md", snap.action_count + 1);
                let mut p = Prepared::accepted(
                    format!(
                        "{} verdicts, {} proposals",
                        req.verdicts.len(),
                        req.proposals.len()
                    ),
                    serde_json::json!({ "review": path }),
                );
                p.body = req.summary.clone();
                p.files.push(TreeFile::new(path.clone(), md.clone()));
                p.refers_to = req.verdicts.iter().map(|v| v.node.clone()).collect();
                Ok(p)
            })?;
        Ok(ReviewResult {
            review: path,
            commit: oid,
        })
    }
}
