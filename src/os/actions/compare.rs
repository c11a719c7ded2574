//! The `compare` action.

use crate::os::*;

/// Scores listed per row of a comparison (all of them count in its mean and interval).
const MAX_LISTED_VALUES: usize = 50;

impl Study {
    pub(in crate::os) fn exec_compare(
        &self,
        caller: &Caller,
        req: CompareRequest,
    ) -> Result<CompareResult> {
        check_caller(caller)?;
        let snap = self.require_node(&req.node)?;
        let mut rows = Vec::new();
        // Scores of a checkpoint the dev tripwire found suspect are not ranked on any node.
        let suspect_cks = self.index.suspect_checkpoints()?;
        for n in &req.nodes {
            let node = self
                .index
                .node(n)?
                .ok_or_else(|| Error::not_found(format!("nodes: no node {n}")))?;
            let runs = self.run_facts(n)?;
            let values: Vec<f64> = self
                .index
                .node_results(n)?
                .into_iter()
                .filter(|(_, m)| {
                    m.task == req.task
                        && m.split == req.split
                        && m.name == req.metric
                        && !suspect_cks.contains(&m.checkpoint)
                })
                .map(|(_, m)| m.value)
                .collect();
            // A node whose evidence is suspect (it produced a suspect checkpoint) is listed, not
            // ranked.
            let suspect = self.index.is_suspect(n)?;
            let trend = if suspect {
                None
            } else {
                self.trend(&runs, &req.task, req.split, &req.metric)?
            };
            let (mean, ci95) = if suspect {
                (None, None)
            } else {
                crate::util::stats::mean_ci95(&values)
            };
            let best = values
                .iter()
                .copied()
                .filter(|_| !suspect)
                .fold(None, |b: Option<f64>, v| Some(b.map_or(v, |b| b.max(v))));
            let n_values = values.len() as u64;
            let listed = values[values.len().saturating_sub(MAX_LISTED_VALUES)..].to_vec();
            rows.push(CompareRow {
                node: n.clone(),
                title: node.title,
                n: n_values,
                mean,
                ci95,
                best,
                values: listed,
                trend,
                suspect,
            });
        }
        let facts = Facts {
            node_status: Some(snap.meta.status),
            ..Facts::default()
        };
        let request = serde_json::to_value(&req)?;
        let decision = policy::check(Request::Compare(&req), caller, &self.config, &facts);
        if !decision.accepted() {
            return Err(self.record_rejection(
                &req.node,
                caller,
                ActionName::Compare,
                request,
                decision,
            ));
        }
        let stored = serde_json::json!({ "task": req.task, "split": req.split, "metric": req.metric, "rows": rows });
        let (oid, _) =
            self.commit_action(&req.node, caller, ActionName::Compare, request, |_| {
                let mut p = Prepared::accepted(
                    format!(
                        "{} on {}/{} across {}",
                        req.metric,
                        req.task,
                        req.split.as_str(),
                        req.nodes.join(", ")
                    ),
                    stored.clone(),
                );
                p.body = rows
                    .iter()
                    .map(|r| {
                        let ci = r
                            .ci95
                            .map(|[a, b]| format!(" [{a:.4}, {b:.4}]"))
                            .unwrap_or_default();
                        let mean = r
                            .mean
                            .map(|m| format!("{m:.4}"))
                            .unwrap_or_else(|| "-".into());
                        let trend = r.trend.map(|t| {
                            format!(
                                "; {} steps, loss {:.3} ({:+.2}/1k steps{}){}",
                                t.trained_steps,
                                t.loss_end.mean,
                                t.loss_slope_per_1k.mean,
                                if t.still_learning {
                                    ", still learning"
                                } else {
                                    ""
                                },
                                t.gain_per_1k
                                    .map(|g| format!(", {} {:+.3}/1k steps", req.metric, g.mean))
                                    .unwrap_or_default()
                            )
                        });
                        format!(
                            "{}: n={} mean={mean}{ci}{}{}",
                            r.node,
                            r.n,
                            trend.unwrap_or_default(),
                            if r.suspect {
                                " SUSPECT: a dev score significantly above the hidden dev twin's; not ranked"
                            } else {
                                ""
                            }
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                p.refers_to = req.nodes.clone();
                Ok(p)
            })?;
        Ok(CompareResult {
            task: req.task,
            split: req.split,
            metric: req.metric,
            rows,
            commit: oid,
        })
    }
}
