//! The DAG view's layout, computed here (not in the browser: a JavaScript layered layout costs
//! seconds at 1,000 nodes) and drawn by `editors/dag/dag.js`, the one renderer the web page and
//! the VS Code webview share.
//!
//! `layout(overview, options)` is pure: it reads a `DagOverview` (the core's query, `Study::
//! dag_overview`) and returns a `DagLayout` (serde JSON). The layout is layered left to right:
//! a node's column is its longest path from a root (so every edge points right), its row comes
//! from the leaf order of the first-parent tree (a subtree keeps a band of rows of its own, so
//! tree edges never cross), and a parent sits in the middle of its children. Linear time: 100,000
//! nodes in well under a second.
//!
//! Past `max_nodes` the view summarises: subtrees that hold no open node, no node of the best
//! path and no node the reader expanded are collapsed into their root (which then carries
//! `collapsed`: how many nodes it hides), concluded dead ends (a `dead_end` verdict or a negative
//! outcome) first, the largest first, until the view fits; if the nodes kept visible are still
//! too many, each of them folds in its concluded children (drawn with `+N`). The best path and
//! the frontier (open nodes) and their ancestors are never hidden (they are the floor of the
//! summary); asking again with a node in `LayoutOptions::expand` opens it a level.
//!
//! Invariant: no IO, no protocol; reads only the overview it is given.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::model::NodeStatus;
use crate::os::{DagOverview, OverviewNode};

/// Column width and row height of the layout's units (the renderer scales them).
pub const COLUMN: f64 = 160.0;
pub const ROW: f64 = 28.0;

/// How many nodes a view shows before it summarises: at this size a first paint in Chromium
/// stays well within two seconds (README, "Web page": benchmark figures).
pub const DEFAULT_MAX_NODES: usize = 12_000;

#[derive(Debug, Clone)]
pub struct LayoutOptions {
    /// Summarise (collapse subtrees) when the DAG has more nodes than this.
    pub max_nodes: usize,
    /// Nodes the reader opened: never collapsed (and so neither are their ancestors).
    pub expand: HashSet<String>,
}

impl Default for LayoutOptions {
    fn default() -> Self {
        LayoutOptions {
            max_nodes: DEFAULT_MAX_NODES,
            expand: HashSet::new(),
        }
    }
}

/// One drawn node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaidNode {
    pub id: String,
    pub title: String,
    pub status: NodeStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// Mean dev score of the task's metric.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// Dev evaluations behind `score`.
    pub evals: u64,
    /// The node's evidence is suspect (a dev score significantly above the hidden dev twin's):
    /// drawn marked, never on the best path.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub suspect: bool,
    pub x: f64,
    pub y: f64,
    /// Nodes hidden under this one (0: not collapsed).
    pub collapsed: u64,
    /// For a node hiding others: the id to add to `LayoutOptions::expand` to open it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expand: Option<String>,
    /// On the path from the root to the best node.
    pub best: bool,
}

/// A laid-out DAG: what `dag.js` draws.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DagLayout {
    /// Nodes in the record.
    pub total: u64,
    /// Nodes drawn (`nodes.len()`).
    pub shown: u64,
    /// Some subtrees are collapsed.
    pub summarised: bool,
    pub task: Option<String>,
    pub metric: Option<String>,
    pub nodes: Vec<LaidNode>,
    /// Parent → child, as indices into `nodes` (an edge into or out of a collapsed subtree is
    /// drawn from or to its root).
    pub edges: Vec<[u32; 2]>,
    /// Best node by mean dev score.
    pub best: Option<String>,
    /// Root → best node, through first parents.
    pub best_path: Vec<String>,
    /// Open nodes (all drawn).
    pub frontier: Vec<String>,
    /// Extent of the coordinates.
    pub width: f64,
    pub height: f64,
    /// Why the study is read-only here (a clone without its key), if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<String>,
}

fn dead_end(n: &OverviewNode) -> bool {
    n.status == NodeStatus::Concluded
        && (n.verdict.as_deref() == Some("dead_end") || n.outcome.as_deref() == Some("negative"))
}

/// Lay out `ov` (see the module's note).
pub fn layout(ov: &DagOverview, opts: &LayoutOptions) -> DagLayout {
    let nodes = &ov.nodes;
    let n = nodes.len();
    let pos: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, x)| (x.id.as_str(), i))
        .collect();
    let parent_ix = |i: usize| -> Vec<usize> {
        nodes[i]
            .parents
            .iter()
            .filter_map(|p| pos.get(p.as_str()).copied())
            .filter(|&p| p < i)
            .collect()
    };
    // The first-parent forest: a parent always comes before its child, so this is a forest even
    // when the input is not in order (a parent listed later is ignored for the tree).
    let first: Vec<Option<usize>> = (0..n)
        .map(|i| {
            nodes[i]
                .parents
                .first()
                .and_then(|p| pos.get(p.as_str()).copied())
                .filter(|&p| p < i)
        })
        .collect();
    let mut kids: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, f) in first.iter().enumerate() {
        if let Some(p) = f {
            kids[*p].push(i);
        }
    }
    // The best path through first parents.
    let mut on_best = vec![false; n];
    let mut best_path = Vec::new();
    let mut cur = ov.best.as_deref().and_then(|b| pos.get(b).copied());
    while let Some(i) = cur {
        if on_best[i] {
            break;
        }
        on_best[i] = true;
        best_path.push(nodes[i].id.clone());
        cur = first[i];
    }
    best_path.reverse();
    // Subtree sizes and whether a subtree holds something that must stay visible.
    let mut size = vec![1u64; n];
    let mut keep: Vec<bool> = (0..n)
        .map(|i| {
            nodes[i].status == NodeStatus::Open || on_best[i] || opts.expand.contains(&nodes[i].id)
        })
        .collect();
    for i in (0..n).rev() {
        if let Some(p) = first[i] {
            size[p] += size[i];
            if keep[i] {
                keep[p] = true;
            }
        }
    }
    // An expanded node shows its children even when they hold nothing to keep.
    let expanded: Vec<bool> = (0..n).map(|i| opts.expand.contains(&nodes[i].id)).collect();
    let mut collapsed = vec![false; n];
    let mut shown = n as u64;
    // Nodes a subtree shows under the collapses so far.
    let visible_in = |collapsed: &[bool]| -> Vec<u64> {
        let mut vis = vec![1u64; n];
        for i in (0..n).rev() {
            if collapsed[i] {
                vis[i] = 1;
            }
            if let Some(p) = first[i] {
                vis[p] += vis[i];
            }
        }
        vis
    };
    if n > opts.max_nodes {
        for dead_only in [true, false] {
            if shown <= opts.max_nodes as u64 {
                break;
            }
            let vis = visible_in(&collapsed);
            // The highest collapsible subtrees not already inside a collapsed one.
            let mut cands: Vec<usize> = Vec::new();
            let mut stack: Vec<usize> = (0..n).filter(|&i| first[i].is_none()).collect();
            while let Some(i) = stack.pop() {
                if collapsed[i] {
                    continue;
                }
                let can = !keep[i]
                    && size[i] > 1
                    && !first[i].is_some_and(|p| expanded[p])
                    && (!dead_only || dead_end(&nodes[i]));
                if can {
                    cands.push(i);
                } else {
                    stack.extend(kids[i].iter().copied());
                }
            }
            cands.sort_by(|a, b| size[*b].cmp(&size[*a]).then(a.cmp(b)));
            for c in cands {
                if shown <= opts.max_nodes as u64 {
                    break;
                }
                collapsed[c] = true;
                shown -= vis[c] - 1;
            }
        }
    }
    let mut hidden: Vec<u64> = (0..n)
        .map(|i| if collapsed[i] { size[i] - 1 } else { 0 })
        .collect();
    // Still too many: the nodes kept visible (open ones, their ancestors, the best path) have
    // concluded children beside them; a kept node folds those in (drawn with `+N`, expanded by
    // its own id), the nodes with the most first.
    let mut folded_into: Vec<Option<usize>> = vec![None; n];
    if shown > opts.max_nodes as u64 {
        let vis = visible_in(&collapsed);
        let mut folds: Vec<(usize, Vec<usize>)> = Vec::new();
        let mut stack: Vec<usize> = (0..n).filter(|&i| first[i].is_none()).collect();
        while let Some(i) = stack.pop() {
            if collapsed[i] {
                continue;
            }
            let members: Vec<usize> = kids[i].iter().copied().filter(|&k| !keep[k]).collect();
            let folding = keep[i] && !expanded[i] && !members.is_empty();
            if folding {
                folds.push((i, members));
            }
            stack.extend(kids[i].iter().copied().filter(|&k| keep[k] || !folding));
        }
        folds.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        for (p, members) in folds {
            if shown <= opts.max_nodes as u64 {
                break;
            }
            shown -= members.iter().map(|&m| vis[m]).sum::<u64>();
            hidden[p] += members.iter().map(|&m| size[m]).sum::<u64>();
            for m in members {
                folded_into[m] = Some(p);
            }
        }
    }
    // Each node's visible representative: itself, or the node that stands for the collapsed
    // subtree or group it is in.
    let mut rep: Vec<usize> = (0..n).collect();
    for i in 0..n {
        if let Some(h) = folded_into[i] {
            rep[i] = h;
        } else if let Some(p) = first[i]
            && (collapsed[p] || rep[p] != p)
        {
            rep[i] = rep[p];
        }
    }
    let visible = |i: usize| rep[i] == i;
    // Columns: the longest path from a root among visible nodes.
    let mut depth = vec![0u32; n];
    for i in 0..n {
        if !visible(i) {
            continue;
        }
        depth[i] = parent_ix(i)
            .into_iter()
            .map(|p| rep[p])
            .filter(|&r| r != i)
            .map(|r| depth[r] + 1)
            .max()
            .unwrap_or(0);
    }
    // Rows: leaves of the visible first-parent tree in order; a parent in the middle of its
    // children. Iterative post-order.
    let mut row = vec![0f64; n];
    let mut next_row = 0f64;
    for root in (0..n).filter(|&i| first[i].is_none()) {
        let mut stack: Vec<(usize, bool)> = vec![(root, false)];
        while let Some((i, done)) = stack.pop() {
            let vis_kids: Vec<usize> = if collapsed[i] {
                Vec::new()
            } else {
                kids[i].iter().copied().filter(|&k| visible(k)).collect()
            };
            if vis_kids.is_empty() {
                row[i] = next_row;
                next_row += 1.0;
            } else if done {
                let (a, b) = (vis_kids[0], vis_kids[vis_kids.len() - 1]);
                row[i] = (row[a] + row[b]) / 2.0;
            } else {
                stack.push((i, true));
                for &k in vis_kids.iter().rev() {
                    stack.push((k, false));
                }
            }
        }
    }
    let mut out_ix = vec![u32::MAX; n];
    let mut out = Vec::with_capacity(shown as usize);
    let mut max_depth = 0u32;
    for i in (0..n).filter(|&i| visible(i)) {
        out_ix[i] = out.len() as u32;
        max_depth = max_depth.max(depth[i]);
        let nd = &nodes[i];
        let (x, y) = (f64::from(depth[i]) * COLUMN, row[i] * ROW);
        out.push(LaidNode {
            id: nd.id.clone(),
            title: nd.title.clone(),
            status: nd.status,
            outcome: nd.outcome.clone(),
            verdict: nd.verdict.clone(),
            score: nd.score.filter(|s| s.is_finite()),
            evals: nd.evals,
            suspect: nd.suspect,
            x,
            y,
            collapsed: hidden[i],
            expand: (hidden[i] > 0).then(|| nd.id.clone()),
            best: on_best[i],
        });
    }
    let mut edges: Vec<[u32; 2]> = Vec::new();
    let mut seen: HashSet<[u32; 2]> = HashSet::new();
    for i in 0..n {
        for p in parent_ix(i) {
            let (a, b) = (rep[p], rep[i]);
            if a == b {
                continue;
            }
            let e = [out_ix[a], out_ix[b]];
            // Edges between two visible nodes are unique already; only redirected ones repeat.
            if (visible(i) && visible(p)) || seen.insert(e) {
                edges.push(e);
            }
        }
    }
    DagLayout {
        total: n as u64,
        shown: out.len() as u64,
        summarised: collapsed.iter().any(|&c| c),
        task: ov.task.clone(),
        metric: ov.metric.clone(),
        frontier: nodes
            .iter()
            .filter(|x| x.status == NodeStatus::Open)
            .map(|x| x.id.clone())
            .collect(),
        nodes: out,
        edges,
        best: ov.best.clone(),
        best_path,
        read_only: ov.read_only.clone(),
        width: f64::from(max_depth) * COLUMN,
        height: (next_row - 1.0).max(0.0) * ROW,
    }
}

/// A made-up research DAG of `n` nodes for benchmarks and tests: a tree that mostly deepens the
/// recent nodes, some merges, most nodes concluded (a fifth of them dead ends), the last ones
/// open, scores that drift upwards. Deterministic in `seed`.
pub fn synthetic(n: usize, seed: u64) -> DagOverview {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut rnd = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as f64 / (1u64 << 31) as f64
    };
    let mut nodes: Vec<OverviewNode> = Vec::with_capacity(n);
    let mut best: Option<(f64, usize)> = None;
    for i in 0..n {
        let parents = if i == 0 {
            Vec::new()
        } else {
            let span = (i as f64).sqrt().max(1.0) * 3.0;
            let p = i - 1 - ((rnd() * span) as usize).min(i - 1);
            let mut ps = vec![format!("n{p}")];
            if i > 10 && rnd() < 0.02 {
                let q = (rnd() * i as f64) as usize;
                if q != p && q < i {
                    ps.push(format!("n{q}"));
                }
            }
            ps
        };
        let open = i == 0 || i + (n / 100).max(5) >= n || rnd() < 0.005;
        let r = rnd();
        let verdict = (!open && r < 0.6).then(|| {
            if r < 0.2 {
                "dead_end"
            } else if r < 0.5 {
                "promising"
            } else {
                "needs_more_seeds"
            }
            .to_string()
        });
        let score = (i > 0).then(|| (0.2 + 0.5 * (i as f64 / n as f64) + 0.2 * rnd()).min(1.0));
        if let Some(sc) = score
            && best.is_none_or(|(b, _)| sc > b)
        {
            best = Some((sc, i));
        }
        nodes.push(OverviewNode {
            id: format!("n{i}"),
            title: format!("experiment {i}: lr x{:.2}", 0.5 + rnd()),
            status: if open {
                NodeStatus::Open
            } else {
                NodeStatus::Concluded
            },
            outcome: (!open).then(|| {
                if verdict.as_deref() == Some("dead_end") {
                    "negative"
                } else {
                    "inconclusive"
                }
                .to_string()
            }),
            parents,
            verdict,
            score,
            evals: u64::from(score.is_some()) * 3,
            suspect: false,
        });
    }
    DagOverview {
        task: Some("arith".into()),
        metric: Some("exact_match".into()),
        best: best.map(|(_, i)| format!("n{i}")),
        nodes,
        read_only: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, parents: &[&str], status: NodeStatus, verdict: Option<&str>) -> OverviewNode {
        OverviewNode {
            id: id.into(),
            title: format!("title of {id}"),
            status,
            outcome: None,
            parents: parents.iter().map(|p| p.to_string()).collect(),
            verdict: verdict.map(str::to_string),
            score: None,
            evals: 0,
            suspect: false,
        }
    }

    fn ov(nodes: Vec<OverviewNode>, best: Option<&str>) -> DagOverview {
        DagOverview {
            task: None,
            metric: None,
            nodes,
            best: best.map(str::to_string),
            read_only: None,
        }
    }

    fn by_id<'a>(l: &'a DagLayout, id: &str) -> &'a LaidNode {
        l.nodes.iter().find(|n| n.id == id).expect("node in layout")
    }

    use NodeStatus::{Concluded as C, Open as O};

    #[test]
    fn edges_point_right_and_a_parent_sits_between_its_children() {
        // n0 → n1, n2; n1 → n3; n2, n3 → n4 (a merge).
        let l = layout(
            &ov(
                vec![
                    node("n0", &[], O, None),
                    node("n1", &["n0"], C, None),
                    node("n2", &["n0"], O, None),
                    node("n3", &["n1"], O, None),
                    node("n4", &["n2", "n3"], O, None),
                ],
                None,
            ),
            &LayoutOptions::default(),
        );
        assert_eq!(l.shown, 5);
        assert!(!l.summarised);
        for [a, b] in &l.edges {
            assert!(l.nodes[*a as usize].x < l.nodes[*b as usize].x, "{a}->{b}");
        }
        assert_eq!(l.edges.len(), 5);
        // The merge child's column is after its deepest parent.
        assert_eq!(by_id(&l, "n4").x, 3.0 * COLUMN);
        let (y0, y1, y2) = (by_id(&l, "n0").y, by_id(&l, "n1").y, by_id(&l, "n2").y);
        assert!(y1 < y2 && y0 > y1 && y0 < y2);
        // No two nodes on one spot.
        let mut spots: Vec<(i64, i64)> = l.nodes.iter().map(|n| (n.x as i64, n.y as i64)).collect();
        spots.sort_unstable();
        spots.dedup();
        assert_eq!(spots.len(), 5);
    }

    #[test]
    fn best_path_and_frontier_are_reported() {
        let mut nodes = vec![
            node("n0", &[], C, None),
            node("n1", &["n0"], C, None),
            node("n2", &["n1"], C, None),
            node("n3", &["n0"], O, None),
        ];
        nodes[2].score = Some(0.9);
        let l = layout(&ov(nodes, Some("n2")), &LayoutOptions::default());
        assert_eq!(l.best_path, vec!["n0", "n1", "n2"]);
        assert_eq!(l.frontier, vec!["n3"]);
        assert!(by_id(&l, "n1").best && !by_id(&l, "n3").best);
        assert_eq!(by_id(&l, "n2").score, Some(0.9));
    }

    #[test]
    fn over_the_bound_dead_ends_collapse_first_and_can_be_expanded() {
        // n0 (open) → a (dead end, 3 below), b (concluded, 3 below), c (open).
        let mut nodes = vec![node("n0", &[], O, None)];
        nodes.push(node("n1", &["n0"], C, Some("dead_end")));
        for i in 2..5 {
            nodes.push(node(&format!("n{i}"), &["n1"], C, None));
        }
        nodes.push(node("n5", &["n0"], C, Some("promising")));
        for i in 6..9 {
            nodes.push(node(&format!("n{i}"), &["n5"], C, None));
        }
        nodes.push(node("n9", &["n0"], O, None));
        let o = ov(nodes, None);
        // 10 nodes, bound 8: collapsing the dead end (hides 3) is enough.
        let l = layout(
            &o,
            &LayoutOptions {
                max_nodes: 8,
                ..Default::default()
            },
        );
        assert!(l.summarised);
        assert_eq!(l.shown, 7);
        assert_eq!(by_id(&l, "n1").collapsed, 3);
        assert_eq!(by_id(&l, "n5").collapsed, 0);
        assert!(l.nodes.iter().all(|n| n.id != "n2"));
        // Bound 4: the promising subtree goes too; the frontier stays.
        let l = layout(
            &o,
            &LayoutOptions {
                max_nodes: 4,
                ..Default::default()
            },
        );
        assert_eq!(l.shown, 4);
        assert_eq!(by_id(&l, "n5").collapsed, 3);
        assert!(
            l.frontier
                .iter()
                .all(|f| l.nodes.iter().any(|n| &n.id == f))
        );
        // Expanding n1 shows its children again (the other subtree stays collapsed).
        let l = layout(
            &o,
            &LayoutOptions {
                max_nodes: 4,
                expand: ["n1".to_string()].into_iter().collect(),
            },
        );
        assert_eq!(by_id(&l, "n1").collapsed, 0);
        assert_eq!(by_id(&l, "n2").collapsed, 0);
        // Still over the bound: n0, kept as n1's ancestor, folds in its concluded child n5.
        assert!(l.nodes.iter().all(|n| n.id != "n5"));
        assert_eq!(by_id(&l, "n0").collapsed, 4);
        assert_eq!(by_id(&l, "n0").expand.as_deref(), Some("n0"));
    }

    #[test]
    fn a_merge_into_a_collapsed_subtree_is_drawn_to_its_root() {
        let nodes = vec![
            node("n0", &[], O, None),
            node("n1", &["n0"], C, Some("dead_end")),
            node("n2", &["n1"], C, None),
            node("n3", &["n0"], O, None),
            node("n4", &["n3", "n2"], O, None),
        ];
        let l = layout(
            &ov(nodes, None),
            &LayoutOptions {
                max_nodes: 4,
                ..Default::default()
            },
        );
        assert_eq!(l.shown, 4);
        let ix = |id: &str| l.nodes.iter().position(|n| n.id == id).expect("shown") as u32;
        assert!(l.edges.contains(&[ix("n1"), ix("n4")]));
        assert!(l.edges.iter().all(|e| e[0] != e[1]));
    }

    #[test]
    fn a_hundred_thousand_nodes_summarise_with_best_path_and_frontier_visible() {
        let o = synthetic(100_000, 7);
        let l = layout(&o, &LayoutOptions::default());
        assert_eq!(l.total, 100_000);
        assert!(l.summarised);
        // The floor: open nodes, their ancestors and the best path (12.6k of this DAG).
        let mut kept = vec![false; o.nodes.len()];
        for b in &l.best_path {
            kept[b[1..].parse::<usize>().expect("id")] = true;
        }
        for i in (0..o.nodes.len()).rev() {
            kept[i] |= o.nodes[i].status == NodeStatus::Open;
            if kept[i]
                && let Some(p) = o.nodes[i].parents.first()
            {
                kept[p[1..].parse::<usize>().expect("id")] = true;
            }
        }
        let floor = kept.iter().filter(|k| **k).count();
        assert!(
            l.shown as usize <= DEFAULT_MAX_NODES.max(floor),
            "{} shown, floor {floor}",
            l.shown
        );
        let shown: HashSet<&str> = l.nodes.iter().map(|n| n.id.as_str()).collect();
        assert!(l.best_path.len() > 1);
        assert!(l.best_path.iter().all(|b| shown.contains(b.as_str())));
        assert!(l.frontier.iter().all(|f| shown.contains(f.as_str())));
        let hidden: u64 = l.nodes.iter().map(|n| n.collapsed).sum();
        assert_eq!(hidden + l.shown, l.total);
        for [a, b] in &l.edges {
            let (a, b) = (&l.nodes[*a as usize], &l.nodes[*b as usize]);
            // A merge into a node folded away is drawn to the node that hides it, wherever
            // that is; every other edge points right.
            assert!(a.x < b.x || b.collapsed > 0, "{} -> {}", a.id, b.id);
        }
    }

    #[test]
    fn ten_thousand_nodes_are_all_drawn() {
        let l = layout(&synthetic(10_000, 3), &LayoutOptions::default());
        assert_eq!(l.shown, 10_000);
        assert!(!l.summarised);
        assert!(l.edges.len() >= 9_999);
        for [a, b] in &l.edges {
            assert!(l.nodes[*a as usize].x < l.nodes[*b as usize].x);
        }
    }

    #[test]
    fn parents_out_of_order_or_missing_do_not_break_it() {
        let nodes = vec![
            node("n0", &["n2"], O, None),
            node("n1", &["n0", "nX"], O, None),
            node("n2", &["n1"], O, None),
        ];
        let l = layout(&ov(nodes, Some("nX")), &LayoutOptions::default());
        assert_eq!(l.shown, 3);
        assert!(l.best_path.is_empty());
        assert!(
            layout(&ov(Vec::new(), None), &LayoutOptions::default())
                .nodes
                .is_empty()
        );
    }
}
