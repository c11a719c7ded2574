//! The start of a campaign (`rsim run`), recorded on the root node like any action: the
//! orchestrator's settings when accepted; the budget rule that refused it otherwise.

use serde_json::Value;

use crate::model::{ActionName, Caller, ROOT_NODE};
use crate::os::Study;
use crate::policy::{self, Facts};
use crate::record::claims::{Hold, HoldKind};
use crate::record::commit::Prepared;
use crate::util::error::Result;

/// A study's campaign held by this orchestrator (`Study::lease_campaign`): released when dropped.
pub struct CampaignLease<'a> {
    _held: crate::os::jobrun::ClaimGuard<'a>,
}

impl Study {
    /// Hold the study's campaign for this orchestrator until the lease is dropped, atomically
    /// with the check that no other orchestrator (in this process or another) holds it. A refusal
    /// (`campaign-running`, or `role`) is recorded on the root node and returned as `rejected`.
    pub fn lease_campaign(&self, caller: &Caller, settings: &Value) -> Result<CampaignLease<'_>> {
        let (token, decision) = self.index.with_holds(|index| {
            let facts = Facts {
                campaigns_running: index.held(&caller.agent)?.campaigns,
                ..Facts::default()
            };
            let decision = policy::check_campaign_lease(caller, &facts);
            let hold = decision
                .accepted()
                .then(|| Hold::one(HoldKind::Campaign, &caller.agent));
            Ok((hold, decision))
        })?;
        match token {
            Some(t) => Ok(CampaignLease {
                _held: crate::os::jobrun::ClaimGuard::hold(&self.index, t),
            }),
            None => Err(self.record_rejection(
                ROOT_NODE,
                caller,
                ActionName::Campaign,
                settings.clone(),
                decision,
            )),
        }
    }

    /// Record that `caller` starts (or resumes) a campaign with `settings`, if the policy lets it:
    /// only the owner, and only while the study's compute, evaluation and node budgets all have
    /// something left. A refusal is recorded with its rule and returned as a `rejected` error.
    pub fn start_campaign(&self, caller: &Caller, settings: Value) -> Result<String> {
        let facts = Facts {
            compute_seconds_used: self.index.compute_seconds_used()?,
            evaluations_total: self.index.evaluation_count(None, None)?,
            node_count: self.index.node_count()?.max(self.nodes_in_git()?),
            ..Facts::default()
        };
        let decision = policy::check_campaign(caller, &self.config, &facts);
        if !decision.accepted() {
            return Err(self.record_rejection(
                ROOT_NODE,
                caller,
                ActionName::Campaign,
                settings,
                decision,
            ));
        }
        let summary = match settings.get("strategy").and_then(Value::as_str) {
            Some(s) => format!("{s} campaign"),
            None => "campaign".to_string(),
        };
        let (commit, _) = self.commit_action(
            ROOT_NODE,
            caller,
            ActionName::Campaign,
            settings.clone(),
            |_| {
                let mut p = Prepared::accepted(summary.clone(), Value::Null);
                p.result = None;
                p.body = format!(
                    "Settings: {}",
                    serde_json::to_string(&settings).unwrap_or_default()
                );
                Ok(p)
            },
        )?;
        Ok(commit)
    }
}
