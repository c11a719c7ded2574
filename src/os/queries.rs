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
            .node_action_heads(&req.node)?
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
        let info = NodeInfo {
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
            actions_total: 0,
            metrics_total: 0,
            children_total: 0,
            more: None,
            tokens: 0,
        };
        bound_node(info, req.max_tokens)
    }

    pub(in crate::os) fn exec_list_nodes(&self, req: ListNodesRequest) -> Result<ListNodesResult> {
        let request = serde_json::to_value(&req)?;
        let start = paging::start("list_nodes", &request, req.cursor.as_deref(), req.offset)?;
        let nodes = self.index.nodes(req.status, req.limit, start)?;
        let total = match req.status {
            None => self.index.node_count()?,
            Some(s) => self.index.nodes(Some(s), u64::MAX >> 2, 0)?.len() as u64,
        };
        let mut out = ListNodesResult {
            total,
            nodes: Vec::new(),
            next_cursor: None,
            tokens: 0,
        };
        let overhead = serde_json::to_vec(&out)?.len() + paging::PAGE_FIELDS;
        let mut nodes: Vec<NodeSummary> = nodes
            .into_iter()
            .map(|n| NodeSummary {
                id: n.id,
                title: n.title,
                status: n.status,
                parents: n.parents,
                actions: n.action_count,
                created_at: n.created_at,
            })
            .collect();
        nodes.truncate(paging::fit(&nodes, req.max_tokens, overhead)?);
        let next = start.saturating_add(nodes.len() as u64);
        out.next_cursor = (next < total).then(|| paging::cursor("list_nodes", &request, next));
        out.nodes = nodes;
        out.tokens = paging::tokens_field(serde_json::to_vec(&out)?.len());
        Ok(out)
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
                        suspect: false,
                    })
                    .collect();
                return self.dag_page(&req, nodes, None, Vec::new(), None);
            }
            DagView::Summary => {
                let summary = self.dag_summary(&dag)?;
                let frontier = pick(dag.frontier());
                return self.dag_page(&req, frontier, None, Vec::new(), Some(summary));
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
                        crate::model::node_num(&a.0).cmp(&crate::model::node_num(&b.0))
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
        let ids: std::collections::HashSet<String> = nodes.iter().map(|n| n.id.clone()).collect();
        self.dag_page(&req, nodes, Some(&ids), lineage, None)
    }

    /// One page of a DAG view: the nodes that fit the bound from the cursor on, and the edges into
    /// them (from any node for `full`, from the view's own nodes otherwise).
    fn dag_page(
        &self,
        req: &DagRequest,
        mut nodes: Vec<DagNode>,
        view_ids: Option<&std::collections::HashSet<String>>,
        lineage: Vec<LineageStep>,
        summary: Option<DagSummary>,
    ) -> Result<DagResult> {
        let request = serde_json::to_value(req)?;
        let start = paging::start("dag", &request, req.cursor.as_deref(), 0)?;
        let total = nodes.len() as u64;
        let suspects = self.index.suspect_nodes()?;
        if !suspects.is_empty() {
            for n in &mut nodes {
                n.suspect = suspects.contains(&n.id);
            }
        }
        let mut out = DagResult {
            view: req.view,
            nodes: Vec::new(),
            edges: Vec::new(),
            lineage,
            summary,
            total,
            next_cursor: None,
            tokens: 0,
        };
        let overhead = serde_json::to_vec(&out)?.len() + paging::PAGE_FIELDS;
        let from = (start as usize).min(nodes.len());
        nodes.drain(..from);
        // A node costs its row and its edges ([p, id] ≈ the two ids and 8 bytes each).
        let cost: Vec<usize> = nodes
            .iter()
            .map(|n| {
                Ok::<usize, Error>(
                    serde_json::to_vec(n)?.len()
                        + n.parents
                            .iter()
                            .map(|p| p.len() + n.id.len() + 8)
                            .sum::<usize>(),
                )
            })
            .collect::<Result<_>>()?;
        let default = if req.view == DagView::Summary {
            SUMMARY_MAX_TOKENS
        } else {
            DEFAULT_MAX_TOKENS
        };
        let budget = req.max_tokens.unwrap_or(default) as usize * 4;
        let mut used = overhead;
        let mut k = 0;
        for c in &cost {
            used += c + 1;
            if used > budget && k > 0 {
                break;
            }
            k += 1;
        }
        nodes.truncate(k);
        let next = start.max(from as u64) + k as u64;
        out.edges = nodes
            .iter()
            .flat_map(|n| {
                n.parents
                    .iter()
                    .filter(|p| view_ids.is_none_or(|ids| ids.contains(*p)))
                    .map(|p| [p.clone(), n.id.clone()])
            })
            .collect();
        out.nodes = nodes;
        out.next_cursor = (next < total).then(|| paging::cursor("dag", &request, next));
        out.tokens = paging::tokens_field(serde_json::to_vec(&out)?.len());
        Ok(out)
    }

    /// The `summary` view: counts, the best node and its path, the frontier's size.
    fn dag_summary(&self, dag: &Dag) -> Result<DagSummary> {
        let mut s = DagSummary {
            nodes: 0,
            edges: dag.edges().count() as u64,
            by_status: Default::default(),
            by_outcome: Default::default(),
            by_verdict: Default::default(),
            frontier: dag.frontier().len() as u64,
            best: None,
            best_path: Vec::new(),
            best_depth: 0,
        };
        for n in dag.nodes() {
            s.nodes += 1;
            *s.by_status.entry(n.status.as_str().into()).or_default() += 1;
            if let Some(o) = &n.outcome {
                *s.by_outcome.entry(o.clone()).or_default() += 1;
            }
        }
        for v in self.latest_verdicts()?.into_values() {
            *s.by_verdict.entry(v).or_default() += 1;
        }
        if let Some((task, t)) = self.config.tasks.iter().next() {
            let best = self
                .index
                .best_per_node(task, Split::Dev.as_str(), &t.metric)?
                .into_iter()
                .max_by(|a, b| {
                    a.1.total_cmp(&b.1).then_with(|| {
                        crate::model::node_num(&b.0).cmp(&crate::model::node_num(&a.0))
                    })
                });
            if let Some((id, v)) = best
                && let Some(n) = dag.node(&id)
            {
                s.best = Some(DagNode {
                    value: Some(v),
                    ..dag_node(n)
                });
                let mut cur = Some(n);
                while let Some(c) = cur {
                    s.best_depth += 1;
                    if s.best_path.len() < BEST_PATH_MAX {
                        s.best_path.push(c.id.clone());
                    }
                    cur = c.parents.first().and_then(|p| dag.node(p));
                }
                s.best_path.reverse();
            }
        }
        Ok(s)
    }

    pub(in crate::os) fn exec_log(&self, req: LogRequest) -> Result<LogResult> {
        if let Some(n) = &req.node
            && self.index.node(n)?.is_none()
        {
            return Err(Error::not_found(format!("node: no node {n}")));
        }
        let request = serde_json::to_value(&req)?;
        let after = paging::start_after("log", &request, req.cursor.as_deref())?;
        let after = match &after {
            Some(k) => Some(match (k[0].as_str(), k[1].as_str(), k[2].as_u64()) {
                (Some(at), Some(node), Some(seq)) => (at, node, seq as u32),
                _ => {
                    return Err(Error::invalid(
                        "cursor: it does not hold a log position; pass back the next_cursor log returned",
                    ));
                }
            }),
            None => None,
        };
        let mut rows = self.index.action_heads_page(
            req.node.as_deref(),
            req.include_rejected,
            req.limit + 1,
            after,
        )?;
        let more = rows.len() as u64 > req.limit;
        rows.truncate(req.limit as usize);
        let mut out = LogResult {
            actions: Vec::new(),
            next_cursor: None,
            tokens: 0,
        };
        let overhead = serde_json::to_vec(&out)?.len() + paging::PAGE_FIELDS;
        let mut actions: Vec<ActionSummary> = rows.into_iter().map(summary_of).collect();
        let fetched = actions.len();
        actions.truncate(paging::fit(&actions, req.max_tokens, overhead)?);
        if (more || actions.len() < fetched)
            && let Some(last) = actions.last()
        {
            let key = serde_json::json!([last.at, last.node, last.seq]);
            out.next_cursor = Some(paging::key_cursor("log", &request, &key));
        }
        out.actions = actions;
        out.tokens = paging::tokens_field(serde_json::to_vec(&out)?.len());
        Ok(out)
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

/// The summary view's default bound: counts and a short frontier.
const SUMMARY_MAX_TOKENS: u64 = 1000;
/// The summary's path to the best node keeps the nodes nearest it.
const BEST_PATH_MAX: usize = 64;

pub(in crate::os) fn summary_of(r: crate::record::index::ActionHeadRow) -> ActionSummary {
    ActionSummary {
        node: r.node,
        seq: r.seq,
        action: r.action,
        decision: r.decision,
        rule: r.rule,
        reason: r.reason,
        agent: r.agent,
        role: r.role,
        at: r.at,
        summary: r.summary,
        commit: r.commit,
        job: r.job,
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
        suspect: false,
    }
}

/// Cut a node's answer to `max_tokens`: its header whole; then its first children, its newest
/// actions and its newest metrics, each list within a share of what is left, in their order.
fn bound_node(mut info: NodeInfo, max_tokens: Option<u64>) -> Result<NodeInfo> {
    info.actions_total = info.actions.len() as u64;
    info.metrics_total = info.metrics.len() as u64;
    info.children_total = info.children.len() as u64;
    let budget = max_tokens.unwrap_or(crate::api::types::DEFAULT_MAX_TOKENS) as usize * 4;
    let whole = serde_json::to_vec(&info)?.len();
    if whole + paging::PAGE_FIELDS <= budget {
        info.tokens = paging::tokens_field(whole);
        return Ok(info);
    }
    let (children, mut actions, mut metrics) = (
        std::mem::take(&mut info.children),
        std::mem::take(&mut info.actions),
        std::mem::take(&mut info.metrics),
    );
    // Room for the hint `more` adds.
    let overhead = serde_json::to_vec(&info)?.len() + paging::PAGE_FIELDS + 400;
    let left = budget.saturating_sub(overhead);
    // Children first (a quarter), then the newest actions (half of the rest), then metrics.
    let keep_children = fit_bytes(&children, left / 4)?;
    let used: usize = bytes_of(&children[..keep_children])?;
    let left = left.saturating_sub(used);
    actions.reverse();
    let keep_actions = fit_bytes(&actions, left / 2)?;
    let used = bytes_of(&actions[..keep_actions])?;
    let left = left.saturating_sub(used);
    metrics.reverse();
    let keep_metrics = fit_bytes(&metrics, left)?;
    actions.truncate(keep_actions);
    actions.reverse();
    metrics.truncate(keep_metrics);
    metrics.reverse();
    info.children = children.into_iter().take(keep_children).collect();
    info.more = Some(format!(
        "cut to max_tokens: the newest {} of {} actions (log {{\"node\": \"{id}\"}} pages through all), \
         the newest {} of {} metrics, the first {} of {} children (list_nodes or dag for the rest)",
        actions.len(),
        info.actions_total,
        metrics.len(),
        info.metrics_total,
        info.children.len(),
        info.children_total,
        id = info.id,
    ));
    info.actions = actions;
    info.metrics = metrics;
    info.tokens = paging::tokens_field(serde_json::to_vec(&info)?.len());
    Ok(info)
}

/// How many of `items`, from the first, fit in `room` bytes of JSON.
fn fit_bytes<T: serde::Serialize>(items: &[T], room: usize) -> Result<usize> {
    let mut used = 0;
    for (i, it) in items.iter().enumerate() {
        used += serde_json::to_vec(it)?.len() + 1;
        if used > room {
            return Ok(i);
        }
    }
    Ok(items.len())
}

fn bytes_of<T: serde::Serialize>(items: &[T]) -> Result<usize> {
    items
        .iter()
        .map(|it| Ok(serde_json::to_vec(it)?.len() + 1))
        .sum()
}
