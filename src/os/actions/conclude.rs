//! The `conclude` action.

use crate::os::*;

impl Study {
    pub(in crate::os) fn exec_conclude(
        &self,
        caller: &Caller,
        req: ConcludeRequest,
    ) -> Result<ConcludeResult> {
        check_caller(caller)?;
        let snap = self.require_node(&req.node)?;
        let best = match &req.best_checkpoint {
            Some(c) => self.resolve_checkpoint(c)?,
            None => None,
        };
        let known = req.best_checkpoint.is_none() || best.is_some();
        let node_opened_by = self
            .index
            .node_opener(&req.node)?
            .and_then(|(agent, role)| Some((agent, Role::parse(&role)?)));
        let facts = Facts {
            node_status: Some(snap.meta.status),
            node_opened_by,
            checkpoint_known: known,
            // Re-hashed now: a checkpoint named as a node's result must still be what was trained.
            checkpoint_corrupt: best.as_deref().and_then(|c| self.store.manifest_damage(c)),
            ..Facts::default()
        };
        let request = serde_json::to_value(&req)?;
        let decision = policy::check(Request::Conclude(&req), caller, &self.config, &facts);
        if !decision.accepted() {
            return Err(self.record_rejection(
                &req.node,
                caller,
                ActionName::Conclude,
                request,
                decision,
            ));
        }
        let outcome = serde_json::to_value(req.outcome)?
            .as_str()
            .unwrap_or_default()
            .to_string();
        let (oid, _) =
            self.commit_on_open_node(&req.node, caller, ActionName::Conclude, request, |snap| {
                let mut meta = snap.meta.clone();
                meta.status = NodeStatus::Concluded;
                meta.outcome = Some(req.outcome);
                let mut p = Prepared::accepted(
                    format!("{outcome}: {}", first_line(&req.findings)),
                    serde_json::json!({ "node": req.node, "status": "concluded" }),
                );
                p.body = req.findings.clone();
                p.files.push(TreeFile::new(
                    "notes.md",
                    format!(
                        "# {}\n\nOutcome: {outcome}\n\n{}\n",
                        meta.title, req.findings
                    ),
                ));
                p.meta = Some(meta);
                Ok(p)
            })?;
        Ok(ConcludeResult {
            node: req.node,
            status: NodeStatus::Concluded,
            commit: oid,
        })
    }
}
