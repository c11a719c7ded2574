//! The research DAG as a petgraph graph, loaded from the index in one pass.

use std::collections::{BTreeSet, HashMap, VecDeque};

use petgraph::Direction;
use petgraph::graph::{DiGraph, NodeIndex};

use crate::model::NodeStatus;
use crate::record::index::{DagEntry, Index, node_num};
use crate::util::error::Result;

pub struct Dag {
    graph: DiGraph<DagEntry, ()>,
    /// Node number (`n12` → 12) → graph index.
    by_num: HashMap<i64, NodeIndex>,
}

impl Dag {
    pub fn load(index: &Index) -> Result<Dag> {
        let (nodes, edges) = index.dag_rows()?;
        Ok(Self::from_rows(nodes, edges))
    }

    /// Build from nodes (in id order) and (parent, child) edges given by node number.
    pub fn from_rows(nodes: Vec<DagEntry>, edges: Vec<(i64, i64)>) -> Dag {
        let mut graph = DiGraph::with_capacity(nodes.len(), edges.len());
        let mut by_num = HashMap::with_capacity(nodes.len());
        for n in nodes {
            let num = n.num;
            let ix = graph.add_node(n);
            by_num.insert(num, ix);
        }
        for (parent, child) in edges {
            if let (Some(&p), Some(&c)) = (by_num.get(&parent), by_num.get(&child)) {
                graph.add_edge(p, c, ());
                let pid = graph[p].id.clone();
                graph[c].parents.push(pid);
            }
        }
        Dag { graph, by_num }
    }

    fn ix(&self, id: &str) -> Option<NodeIndex> {
        self.by_num
            .get(&node_num(id))
            .copied()
            .filter(|&ix| self.graph[ix].id == id)
    }

    /// The nodes, moved out (id order).
    pub fn into_nodes(self) -> Vec<DagEntry> {
        self.graph
            .into_nodes_edges()
            .0
            .into_iter()
            .map(|n| n.weight)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.graph.node_count()
    }

    pub fn is_empty(&self) -> bool {
        self.graph.node_count() == 0
    }

    pub fn node(&self, id: &str) -> Option<&DagEntry> {
        self.ix(id).map(|ix| &self.graph[ix])
    }

    /// Nodes in id order.
    pub fn nodes(&self) -> impl Iterator<Item = &DagEntry> {
        self.graph.node_indices().map(|ix| &self.graph[ix])
    }

    /// Edges (parent, child).
    pub fn edges(&self) -> impl Iterator<Item = (&str, &str)> {
        self.graph.edge_indices().filter_map(|e| {
            let (a, b) = self.graph.edge_endpoints(e)?;
            Some((self.graph[a].id.as_str(), self.graph[b].id.as_str()))
        })
    }

    fn neighbors(&self, id: &str, dir: Direction) -> Vec<String> {
        let Some(ix) = self.ix(id) else {
            return Vec::new();
        };
        let mut v: Vec<NodeIndex> = self.graph.neighbors_directed(ix, dir).collect();
        v.sort();
        v.dedup();
        v.into_iter().map(|i| self.graph[i].id.clone()).collect()
    }

    pub fn children(&self, id: &str) -> Vec<String> {
        self.neighbors(id, Direction::Outgoing)
    }

    pub fn parents(&self, id: &str) -> Vec<String> {
        self.neighbors(id, Direction::Incoming)
    }

    /// Every ancestor of `id`, nearest first (breadth-first), without duplicates.
    pub fn ancestors(&self, id: &str) -> Vec<String> {
        let Some(start) = self.ix(id) else {
            return Vec::new();
        };
        let mut seen = BTreeSet::new();
        let mut queue = VecDeque::from([start]);
        let mut out = Vec::new();
        while let Some(ix) = queue.pop_front() {
            let mut ps: Vec<NodeIndex> = self
                .graph
                .neighbors_directed(ix, Direction::Incoming)
                .collect();
            ps.sort();
            for p in ps {
                if seen.insert(p) {
                    out.push(self.graph[p].id.clone());
                    queue.push_back(p);
                }
            }
        }
        out
    }

    /// Open nodes: where work can continue.
    pub fn frontier(&self) -> Vec<String> {
        self.nodes()
            .filter(|n| n.status == NodeStatus::Open)
            .map(|n| n.id.clone())
            .collect()
    }

    /// Nodes sharing a parent with `id` (not `id` itself).
    pub fn siblings(&self, id: &str) -> Vec<String> {
        let mut out = BTreeSet::new();
        for p in self.parents(id) {
            for c in self.children(&p) {
                if c != id {
                    out.insert(c);
                }
            }
        }
        self.sorted(out)
    }

    /// Children of the siblings of `id`'s parents.
    pub fn cousins(&self, id: &str) -> Vec<String> {
        let mut out = BTreeSet::new();
        for p in self.parents(id) {
            for uncle in self.siblings(&p) {
                for c in self.children(&uncle) {
                    if c != id {
                        out.insert(c);
                    }
                }
            }
        }
        self.sorted(out)
    }

    /// The evidence to compare a node with: its parents, siblings and cousins, each with the relation.
    pub fn related(&self, id: &str) -> Vec<(String, &'static str)> {
        let mut out: Vec<(String, &'static str)> = Vec::new();
        let mut seen = BTreeSet::from([id.to_string()]);
        for (ids, rel) in [
            (self.parents(id), "parent"),
            (self.siblings(id), "sibling"),
            (self.cousins(id), "cousin"),
        ] {
            for n in ids {
                if seen.insert(n.clone()) {
                    out.push((n, rel));
                }
            }
        }
        out
    }

    fn sorted(&self, ids: BTreeSet<String>) -> Vec<String> {
        let mut v: Vec<String> = ids.into_iter().collect();
        v.sort_by_key(|id| self.node(id).map_or(i64::MAX, |n| n.num));
        v
    }

    /// Render as Graphviz dot.
    pub fn to_dot(&self, only: Option<&BTreeSet<String>>) -> String {
        let mut s = String::from(
            "digraph rsim {\n  rankdir=TB;\n  node [shape=box, style=rounded, fontname=\"sans-serif\"];\n",
        );
        let keep = |id: &str| only.is_none_or(|o| o.contains(id));
        for n in self.nodes().filter(|n| keep(&n.id)) {
            let style = match n.status {
                NodeStatus::Open => "",
                NodeStatus::Concluded => ", style=\"rounded,filled\", fillcolor=\"#e8e8e8\"",
            };
            s.push_str(&format!(
                "  {} [label=\"{}\\n{}\"{}];\n",
                n.id,
                dot_escape(&n.id),
                dot_escape(&n.title),
                style
            ));
        }
        for (a, b) in self.edges().filter(|(a, b)| keep(a) && keep(b)) {
            s.push_str(&format!("  {a} -> {b};\n"));
        }
        s.push_str("}\n");
        s
    }

    /// Render as an indented tree; a merge node is drawn under its first parent and referenced
    /// under the others. The output is linear in the DAG's size: an only child is drawn in its
    /// parent's column (a chain is a column, not a staircase), and indentation deeper than
    /// `MAX_INDENT` levels starts again from the left margin behind a depth marker (`[+24] `), so
    /// no line's prefix grows with the DAG's depth.
    pub fn to_text(&self) -> String {
        self.to_text_marked(&std::collections::BTreeSet::new())
    }

    /// `to_text`, with the nodes in `suspect` (evidence the dev tripwire flagged) marked.
    pub fn to_text_marked(&self, suspect: &std::collections::BTreeSet<String>) -> String {
        enum Item {
            Node {
                ix: NodeIndex,
                /// What is printed before the glyph (bounded by MAX_INDENT levels + a marker).
                prefix: String,
                /// Indentation levels this line is in (for the marker when folded).
                level: usize,
                glyph: &'static str,
            },
            Line(String),
        }
        let mut out = String::new();
        let roots: Vec<NodeIndex> = self
            .graph
            .node_indices()
            .filter(|&ix| self.graph[ix].parents.is_empty())
            .collect();
        // Iterative depth-first walk (deep chains must not overflow the stack).
        let mut stack: Vec<Item> = roots
            .into_iter()
            .rev()
            .map(|ix| Item::Node {
                ix,
                prefix: String::new(),
                level: 0,
                glyph: "",
            })
            .collect();
        while let Some(item) = stack.pop() {
            let (ix, prefix, level, glyph) = match item {
                Item::Line(l) => {
                    out.push_str(&l);
                    continue;
                }
                Item::Node {
                    ix,
                    prefix,
                    level,
                    glyph,
                } => (ix, prefix, level, glyph),
            };
            let n = &self.graph[ix];
            let status = match (n.status, n.outcome.as_deref()) {
                (NodeStatus::Open, _) => "open".to_string(),
                (NodeStatus::Concluded, Some(o)) => format!("concluded: {o}"),
                (NodeStatus::Concluded, None) => "concluded".to_string(),
            };
            let status = if suspect.contains(&n.id) {
                format!("{status}, SUSPECT: dev above its hidden twin, not ranked")
            } else {
                status
            };
            let merge = if n.parents.len() > 1 {
                format!("  (merge of {})", n.parents.join(" + "))
            } else {
                String::new()
            };
            out.push_str(&format!(
                "{prefix}{glyph}{}  [{status}]  {}{merge}\n",
                n.id,
                crate::util::text::display(&n.title)
            ));
            let mut kids: Vec<NodeIndex> = self
                .graph
                .neighbors_directed(ix, Direction::Outgoing)
                .collect();
            kids.sort();
            kids.dedup();
            let count = kids.len();
            // An only child (drawn here, not a merge reference) continues this node's column.
            let only = count == 1 && self.graph[kids[0]].parents.first() == Some(&n.id);
            let (base, base_level) = match glyph {
                "" => (prefix, level),
                g => {
                    let level = level + 1;
                    if level % MAX_INDENT == 0 {
                        (format!("[+{level}] "), level)
                    } else {
                        let bar = if g == "└── " { "    " } else { "│   " };
                        (format!("{prefix}{bar}"), level)
                    }
                }
            };
            for (i, k) in kids.into_iter().enumerate().rev() {
                let last = i + 1 == count;
                let child = &self.graph[k];
                let b = if last { "└── " } else { "├── " };
                if child.parents.first() == Some(&n.id) {
                    stack.push(Item::Node {
                        ix: k,
                        prefix: base.clone(),
                        level: base_level,
                        glyph: if only { "" } else { b },
                    });
                } else {
                    let first = child.parents.first().map_or("", |s| s.as_str());
                    stack.push(Item::Line(format!(
                        "{base}{b}↳ {} (merge; drawn under {first})\n",
                        child.id
                    )));
                }
            }
        }
        out
    }
}

/// Indentation levels `Dag::to_text` draws before it starts again from the left margin.
pub const MAX_INDENT: usize = 24;

/// Text inside a DOT double-quoted string: quotes and backslashes escaped (a title ending in `\`
/// cannot leave its label open), control and deceptive characters replaced.
fn dot_escape(s: &str) -> String {
    let mut q = String::new();
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            c if c.is_control() || crate::util::text::is_deceptive(c) => q.push('\u{FFFD}'),
            c => q.push(c),
        }
    }
    q
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_dot_label_cannot_be_left_open_or_carry_overrides() {
        assert_eq!(dot_escape("ends with \\"), "ends with \\\\");
        assert_eq!(dot_escape("say \"hi\""), "say \\\"hi\\\"");
        assert_eq!(dot_escape("a\u{202E}b\nc"), "a\u{FFFD}b\u{FFFD}c");
    }

    use super::*;

    fn row(id: &str, status: NodeStatus) -> DagEntry {
        DagEntry {
            id: id.into(),
            num: node_num(id),
            title: format!("t{id}"),
            status,
            outcome: None,
            parents: Vec::new(),
        }
    }

    fn sample() -> Dag {
        // n0 → n1, n2; n1 → n3, n4; n2 → n5; (n3, n5) → n6
        let nodes = ["n0", "n1", "n2", "n3", "n4", "n5", "n6"]
            .iter()
            .map(|id| {
                row(
                    id,
                    if *id == "n1" {
                        NodeStatus::Concluded
                    } else {
                        NodeStatus::Open
                    },
                )
            })
            .collect();
        let e = |a: &str, b: &str| (node_num(a), node_num(b));
        Dag::from_rows(
            nodes,
            vec![
                e("n0", "n1"),
                e("n0", "n2"),
                e("n1", "n3"),
                e("n1", "n4"),
                e("n2", "n5"),
                e("n3", "n6"),
                e("n5", "n6"),
            ],
        )
    }

    #[test]
    fn relations() {
        let d = sample();
        assert_eq!(d.children("n1"), vec!["n3", "n4"]);
        assert_eq!(d.parents("n6"), vec!["n3", "n5"]);
        assert_eq!(d.ancestors("n6"), vec!["n3", "n5", "n1", "n2", "n0"]);
        assert_eq!(d.siblings("n3"), vec!["n4"]);
        assert_eq!(d.cousins("n3"), vec!["n5"]);
        assert!(!d.frontier().contains(&"n1".to_string()));
        let rel = d.related("n3");
        assert_eq!(
            rel,
            vec![
                ("n1".into(), "parent"),
                ("n4".into(), "sibling"),
                ("n5".into(), "cousin")
            ]
        );
    }

    #[test]
    fn text_and_dot_show_every_node_once_and_merges_as_references() {
        let d = sample();
        let t = d.to_text();
        assert_eq!(t.matches("n6  [").count(), 1, "{t}");
        assert!(t.contains("↳ n6 (merge; drawn under n3)"), "{t}");
        let dot = d.to_dot(None);
        assert!(dot.contains("n3 -> n6;") && dot.contains("n5 -> n6;"));
    }

    /// A chain n0 → n1 → … → n{depth}; with `comb`, every chain node also has a leaf child (the
    /// chain then branches at every level, so indentation alone would grow with depth).
    fn chain(depth: i64, comb: bool) -> Dag {
        let mut nodes = Vec::new();
        let mut edges = Vec::new();
        for i in 0..=depth {
            nodes.push(row(&format!("n{i}"), NodeStatus::Open));
            if i > 0 {
                edges.push((i - 1, i));
            }
        }
        if comb {
            for i in 0..depth {
                let leaf = depth + 1 + i;
                nodes.push(row(&format!("n{leaf}"), NodeStatus::Open));
                edges.push((i, leaf));
            }
        }
        Dag::from_rows(nodes, edges)
    }

    /// Bytes per line, at a depth ten times larger, stay the same: output linear in the size.
    #[test]
    fn text_output_is_linear_in_depth_for_chains_and_combs() {
        for comb in [false, true] {
            let per_line = |depth: i64| {
                let t = chain(depth, comb).to_text();
                let lines = t.lines().count();
                assert_eq!(lines as i64, if comb { 2 * depth + 1 } else { depth + 1 });
                let longest = t.lines().map(str::len).max().unwrap_or(0);
                (t.len() as f64 / lines as f64, longest)
            };
            let (small, small_longest) = per_line(500);
            let (big, big_longest) = per_line(5_000);
            assert!(
                big < small * 1.2,
                "comb={comb}: {big:.1} bytes per line at depth 5000 vs {small:.1} at 500"
            );
            // No line's prefix grows with depth: MAX_INDENT levels of 4 columns and a marker.
            assert!(
                big_longest <= small_longest.max(4 * MAX_INDENT * 3 + 40),
                "comb={comb}: longest line {big_longest} at depth 5000 vs {small_longest}"
            );
        }
        let t = chain(3, false).to_text();
        assert_eq!(
            t, "n0  [open]  tn0\nn1  [open]  tn1\nn2  [open]  tn2\nn3  [open]  tn3\n",
            "a chain is a column"
        );
        let t = chain(60, true).to_text();
        assert!(t.contains("[+24] "), "{t}");
    }
}
