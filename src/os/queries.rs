//! Queries: read-only answers from the index and git.

use super::*;

impl Study {
    pub(in crate::os) fn exec_get_node(&self, req: GetNodeRequest) -> Result<NodeInfo> {
        let n = self
            .index
            .node(&req.node)?
            .ok_or_else(|| Error::not_found(format!("node: no node {}", req.node)))?;
        let actions = self
            .index
            .node_actions(&req.node)?
            .into_iter()
            .map(summary_of)
            .collect();
        let metrics = self
            .index
            .node_metrics(&req.node)?
            .into_iter()
            .map(|(_, m)| m)
            .collect();
        let tip = git2::Oid::from_str(&n.tip)?;
        let notes = self
            .record
            .read_file(tip, "notes.md")?
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        let outcome = self.record.snapshot(tip)?.meta.outcome;
        Ok(NodeInfo {
            branch: record::node_ref(&n.id)
                .trim_start_matches("refs/heads/")
                .to_string(),
            children: self.index.children(&n.id)?,
            id: n.id,
            title: n.title,
            hypothesis: n.hypothesis,
            status: n.status,
            outcome,
            parents: n.parents,
            created_at: n.created_at,
            created_by: n.created_by,
            tip: n.tip,
            actions,
            metrics,
            notes,
        })
    }

    pub(in crate::os) fn exec_list_nodes(&self, req: ListNodesRequest) -> Result<ListNodesResult> {
        let nodes = self.index.nodes(req.status, req.limit, req.offset)?;
        let total = match req.status {
            None => self.index.node_count()?,
            Some(s) => self.index.nodes(Some(s), u64::MAX >> 2, 0)?.len() as u64,
        };
        Ok(ListNodesResult {
            total,
            nodes: nodes
                .into_iter()
                .map(|n| NodeSummary {
                    id: n.id,
                    title: n.title,
                    status: n.status,
                    parents: n.parents,
                    actions: n.action_count,
                    created_at: n.created_at,
                })
                .collect(),
        })
    }

    pub(in crate::os) fn exec_dag(&self, req: DagRequest) -> Result<DagResult> {
        let need_node = || -> Result<String> {
            let n = req.node.clone().ok_or_else(|| {
                Error::invalid(format!("node: the {:?} view needs a node", req.view))
            })?;
            if self.index.node(&n)?.is_none() {
                return Err(Error::not_found(format!("node: no node {n}")));
            }
            Ok(n)
        };
        let dag = self.dag_graph()?;
        let pick = |ids: Vec<String>| -> Vec<DagNode> {
            ids.iter()
                .filter_map(|id| dag.node(id))
                .map(dag_node)
                .collect()
        };
        let mut lineage = Vec::new();
        let nodes: Vec<DagNode> = match req.view {
            DagView::Full => {
                // The whole DAG: move the rows out instead of copying 100k titles.
                let edges = dag
                    .edges()
                    .map(|(a, b)| [a.to_string(), b.to_string()])
                    .collect();
                let nodes = dag
                    .into_nodes()
                    .into_iter()
                    .map(|n| DagNode {
                        id: n.id,
                        title: n.title,
                        status: n.status,
                        parents: n.parents,
                        value: None,
                        relation: None,
                    })
                    .collect();
                return Ok(DagResult {
                    view: req.view,
                    nodes,
                    edges,
                    lineage: Vec::new(),
                });
            }
            DagView::Frontier => pick(dag.frontier()),
            DagView::Children => pick(dag.children(&need_node()?)),
            DagView::Ancestors => pick(dag.ancestors(&need_node()?)),
            DagView::Related => {
                let n = need_node()?;
                dag.related(&n)
                    .into_iter()
                    .filter_map(|(id, rel)| {
                        dag.node(&id).map(|r| DagNode {
                            relation: Some(rel.to_string()),
                            ..dag_node(r)
                        })
                    })
                    .collect()
            }
            DagView::Best => {
                let task = match &req.task {
                    Some(t) => t.clone(),
                    None => self
                        .config
                        .tasks
                        .keys()
                        .next()
                        .cloned()
                        .ok_or_else(|| Error::invalid("task: the study has no tasks"))?,
                };
                let metric = match (&req.metric, self.config.tasks.get(&task)) {
                    (Some(m), _) => m.clone(),
                    (None, Some(t)) => t.metric.clone(),
                    (None, None) => {
                        return Err(Error::not_found(format!("task: no task {task:?}")));
                    }
                };
                let split = req.split.unwrap_or(Split::Dev);
                let mut best = self.index.best_per_node(&task, split.as_str(), &metric)?;
                best.sort_by(|a, b| {
                    b.1.total_cmp(&a.1).then_with(|| {
                        crate::record::index::node_num(&a.0)
                            .cmp(&crate::record::index::node_num(&b.0))
                    })
                });
                best.into_iter()
                    .filter_map(|(id, v)| {
                        dag.node(&id).map(|r| DagNode {
                            value: Some(v),
                            ..dag_node(r)
                        })
                    })
                    .collect()
            }
            DagView::Lineage => {
                let ck = req.checkpoint.clone().ok_or_else(|| {
                    Error::invalid("checkpoint: the lineage view needs a checkpoint")
                })?;
                let mut cur = self.resolve_checkpoint(&ck)?.ok_or_else(|| {
                    Error::not_found(format!("checkpoint: {ck} is not a recorded checkpoint"))
                })?;
                let mut ids = Vec::new();
                for _ in 0..100_000 {
                    let Some((node, seq, parent)) = self.index.checkpoint_origin(&cur)? else {
                        break;
                    };
                    let is_base = node == ROOT_NODE && seq == 1;
                    lineage.push(LineageStep {
                        checkpoint: cur.clone(),
                        node: (!is_base).then(|| node.clone()),
                        seq: (!is_base).then_some(seq),
                    });
                    if !ids.contains(&node) {
                        ids.push(node);
                    }
                    match parent {
                        Some(p) if !is_base => cur = p,
                        _ => break,
                    }
                }
                pick(ids)
            }
        };
        let ids: std::collections::HashSet<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
        let edges = dag
            .edges()
            .filter(|(a, b)| ids.contains(a) && ids.contains(b))
            .map(|(a, b)| [a.to_string(), b.to_string()])
            .collect();
        Ok(DagResult {
            view: req.view,
            nodes,
            edges,
            lineage,
        })
    }

    pub(in crate::os) fn exec_log(&self, req: LogRequest) -> Result<LogResult> {
        if let Some(n) = &req.node
            && self.index.node(n)?.is_none()
        {
            return Err(Error::not_found(format!("node: no node {n}")));
        }
        let rows = self
            .index
            .actions(req.node.as_deref(), req.include_rejected, req.limit)?;
        Ok(LogResult {
            actions: rows.into_iter().map(summary_of).collect(),
        })
    }

    pub(in crate::os) fn exec_get_job(&self, req: GetJobRequest) -> Result<JobInfo> {
        match self.index.job(&req.job)? {
            Some((node, seq, job)) => Ok(JobInfo { node, seq, job }),
            None => Err(Error::not_found(format!(
                "job: no recorded job {} (a job appears here once its action is recorded)",
                req.job
            ))),
        }
    }
}

pub(in crate::os) fn summary_of(r: crate::record::index::ActionRow) -> ActionSummary {
    ActionSummary {
        node: r.node,
        seq: r.seq,
        action: r.record.action,
        decision: r.record.decision.decision,
        rule: r.record.decision.rule,
        reason: r.record.decision.reason,
        agent: r.record.agent,
        role: r.record.role,
        at: r.record.at,
        summary: r.record.summary,
        commit: r.commit,
        job: r.record.job.map(|j| j.id),
    }
}

pub(in crate::os) fn dag_node(n: &crate::record::index::DagEntry) -> DagNode {
    DagNode {
        id: n.id.clone(),
        title: n.title.clone(),
        status: n.status,
        parents: n.parents.clone(),
        value: None,
        relation: None,
    }
}
