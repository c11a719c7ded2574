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

    /// Render as an indented tree; a merge node is drawn under its first parent and referenced under the others.
    pub fn to_text(&self) -> String {
        enum Item {
            Node {
                ix: NodeIndex,
                prefix: String,
                last: bool,
                root: bool,
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
                last: true,
                root: true,
            })
            .collect();
        while let Some(item) = stack.pop() {
            let (ix, prefix, last, root) = match item {
                Item::Line(l) => {
                    out.push_str(&l);
                    continue;
                }
                Item::Node {
                    ix,
                    prefix,
                    last,
                    root,
                } => (ix, prefix, last, root),
            };
            let n = &self.graph[ix];
            let branch = match (root, last) {
                (true, _) => "",
                (false, true) => "└── ",
                (false, false) => "├── ",
            };
            let status = match (n.status, n.outcome.as_deref()) {
                (NodeStatus::Open, _) => "open".to_string(),
                (NodeStatus::Concluded, Some(o)) => format!("concluded: {o}"),
                (NodeStatus::Concluded, None) => "concluded".to_string(),
            };
            let merge = if n.parents.len() > 1 {
                format!("  (merge of {})", n.parents.join(" + "))
            } else {
                String::new()
            };
            out.push_str(&format!(
                "{prefix}{branch}{}  [{status}]  {}{merge}\n",
                n.id,
                crate::util::text::display(&n.title)
            ));
            let child_prefix = if root {
                String::new()
            } else {
                format!("{prefix}{}", if last { "    " } else { "│   " })
            };
            let mut kids: Vec<NodeIndex> = self
                .graph
                .neighbors_directed(ix, Direction::Outgoing)
                .collect();
            kids.sort();
            kids.dedup();
            let count = kids.len();
            for (i, k) in kids.into_iter().enumerate().rev() {
                let last = i + 1 == count;
                let child = &self.graph[k];
                if child.parents.first() == Some(&n.id) {
                    stack.push(Item::Node {
                        ix: k,
                        prefix: child_prefix.clone(),
                        last,
                        root: false,
                    });
                } else {
                    let b = if last { "└── " } else { "├── " };
                    let first = child.parents.first().map_or("", |s| s.as_str());
                    stack.push(Item::Line(format!(
                        "{child_prefix}{b}↳ {} (merge; drawn under {first})\n",
                        child.id
                    )));
                }
            }
        }
        out
    }
}

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
}
