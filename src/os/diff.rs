//! The `diff` query: what differs between two nodes — recipe and hyper-parameters (from their
//! accepted `run_sft` requests), datasets (name, hash, rows), the environments their jobs ran in,
//! and every metric with B − A and its 95% interval (paired over matching seeds, else Welch).

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::util::stats;

/// A metric's key: task, split, name.
type MetricKey = (String, Split, String);
/// A metric's values: the seed of the checkpoint (when a run_sft of the node made it), the value.
type Seeded = Vec<(Option<u64>, f64)>;

/// What one node's record says, gathered for a diff.
#[derive(Default)]
struct Side {
    /// Flattened parameter → distinct values over the node's runs.
    params: BTreeMap<String, Vec<Value>>,
    datasets: BTreeSet<String>,
    envs: BTreeSet<String>,
    /// (task, split, metric) → (seed of the checkpoint, if a run_sft of this node made it; value).
    metrics: BTreeMap<MetricKey, Seeded>,
}

fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, x, out);
            }
        }
        other => out.push((prefix.to_string(), other.clone())),
    }
}

impl Study {
    fn diff_side(&self, node: &str) -> Result<Side> {
        let row = self
            .index
            .node(node)?
            .ok_or_else(|| Error::not_found(format!("node: no node {node}")))?;
        let mut side = Side::default();
        if let Some(recipe) = row
            .hypothesis
            .lines()
            .find_map(|l| l.trim().strip_prefix("recipe:"))
        {
            side.params
                .entry("recipe".into())
                .or_default()
                .push(Value::String(recipe.trim().to_string()));
        }
        let mut seed_of: BTreeMap<String, u64> = BTreeMap::new();
        for a in self.index.node_actions(node)? {
            let r = a.record;
            if !r.decision.accepted() {
                continue;
            }
            if let Some(j) = &r.job {
                side.envs.insert(j.env.clone());
            }
            if r.action != ActionName::RunSft {
                continue;
            }
            let Ok(req) = serde_json::from_value::<RunSftRequest>(r.request.clone()) else {
                continue;
            };
            if let Some(ck) = r.result.as_ref().and_then(|v| v["checkpoint"].as_str()) {
                seed_of.insert(ck.to_string(), req.seed);
            }
            side.datasets.extend(req.datasets.iter().cloned());
            let mut flat = Vec::new();
            flatten("", &serde_json::to_value(&req)?, &mut flat);
            for (k, v) in flat {
                if matches!(k.as_str(), "node" | "seed" | "datasets") {
                    continue;
                }
                let vals = side.params.entry(k).or_default();
                if !vals.contains(&v) {
                    vals.push(v);
                }
            }
        }
        // Results only: scores of checkpoints kept part-way through a run are its trend.
        for (_, m) in self.index.node_results(node)? {
            side.metrics
                .entry((m.task.clone(), m.split, m.name.clone()))
                .or_default()
                .push((seed_of.get(&m.checkpoint).copied(), m.value));
        }
        Ok(side)
    }

    pub(in crate::os) fn exec_diff(&self, req: DiffRequest) -> Result<DiffResult> {
        if req.a == req.b {
            return Err(Error::invalid(format!(
                "b: a diff needs two different nodes ({} against itself has nothing to compare)",
                req.a
            )));
        }
        let a = self.diff_side(&req.a)?;
        let b = self.diff_side(&req.b)?;
        let one = |v: &Vec<Value>| {
            if v.len() == 1 {
                v[0].clone()
            } else {
                Value::Array(v.clone())
            }
        };
        let mut params = Vec::new();
        let mut params_same = 0;
        let keys: BTreeSet<&String> = a.params.keys().chain(b.params.keys()).collect();
        for k in keys {
            let (va, vb) = (a.params.get(k).map(one), b.params.get(k).map(one));
            let side = match (&va, &vb) {
                (Some(x), Some(y)) if x == y => {
                    params_same += 1;
                    continue;
                }
                (Some(_), Some(_)) => DiffSide::Changed,
                (Some(_), None) => DiffSide::OnlyA,
                _ => DiffSide::OnlyB,
            };
            params.push(ParamDiff {
                key: k.clone(),
                side,
                a: va,
                b: vb,
            });
        }
        let mut datasets = Vec::new();
        for name in a.datasets.union(&b.datasets) {
            let side = match (a.datasets.contains(name), b.datasets.contains(name)) {
                (true, true) => DiffSide::Both,
                (true, false) => DiffSide::OnlyA,
                _ => DiffSide::OnlyB,
            };
            let (sha256, _, rows) = self.index.dataset(name)?.unwrap_or_default();
            datasets.push(DatasetDiff {
                name: name.clone(),
                sha256,
                rows,
                side,
            });
        }
        let mut metrics = Vec::new();
        let keys: BTreeSet<&MetricKey> = a.metrics.keys().chain(b.metrics.keys()).collect();
        let empty = Vec::new();
        for k in keys {
            let (xa, xb) = (
                a.metrics.get(k).unwrap_or(&empty),
                b.metrics.get(k).unwrap_or(&empty),
            );
            metrics.push(metric_diff(k, xa, xb));
        }
        Ok(DiffResult {
            env_same: a.envs == b.envs,
            env_a: a.envs.into_iter().collect(),
            env_b: b.envs.into_iter().collect(),
            a: req.a,
            b: req.b,
            params,
            params_same,
            datasets,
            metrics,
        })
    }
}

/// B − A for one metric: paired over the seeds both nodes evaluated (a seed's value is the mean
/// of its evaluations) when there are at least two, else Welch's interval.
fn metric_diff(
    (task, split, metric): &MetricKey,
    a: &[(Option<u64>, f64)],
    b: &[(Option<u64>, f64)],
) -> MetricDiff {
    let values = |x: &[(Option<u64>, f64)]| x.iter().map(|(_, v)| *v).collect::<Vec<_>>();
    let (va, vb) = (values(a), values(b));
    let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let by_seed = |x: &[(Option<u64>, f64)]| {
        let mut m: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        for (s, v) in x {
            if let Some(s) = s {
                m.entry(*s).or_default().push(*v);
            }
        }
        m.into_iter()
            .map(|(s, v)| (s, v.iter().sum::<f64>() / v.len() as f64))
            .collect::<BTreeMap<_, _>>()
    };
    let (sa, sb) = (by_seed(a), by_seed(b));
    let matching: Vec<u64> = sa.keys().filter(|s| sb.contains_key(s)).copied().collect();
    let (mean_a, mean_b) = (mean(&va), mean(&vb));
    let (difference, ci95, method) = if matching.len() >= 2 {
        let d: Vec<f64> = matching.iter().map(|s| sb[s] - sa[s]).collect();
        let (m, ci) = stats::mean_ci95(&d);
        (m, ci, "paired")
    } else if let Some((d, ci)) = stats::welch_ci95(&va, &vb) {
        (Some(d), Some(ci), "welch")
    } else {
        (mean_a.zip(mean_b).map(|(x, y)| y - x), None, "none")
    };
    MetricDiff {
        task: task.clone(),
        split: *split,
        metric: metric.clone(),
        n_a: va.len() as u64,
        n_b: vb.len() as u64,
        mean_a,
        mean_b,
        difference,
        ci95,
        method: method.into(),
        matching_seeds: if method == "paired" {
            matching
        } else {
            Vec::new()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> (String, Split, String) {
        ("arith".into(), Split::Dev, "exact_match".into())
    }

    #[test]
    fn seeds_that_match_are_paired_and_others_fall_back_to_welch() {
        // Paired: B beats A by 0.1 on each of three seeds, whatever the seeds' spread.
        let a = [(Some(1), 0.2), (Some(2), 0.5), (Some(3), 0.8)];
        let b = [(Some(1), 0.3), (Some(2), 0.6), (Some(3), 0.9)];
        let d = metric_diff(&key(), &a, &b);
        assert_eq!(d.method, "paired");
        assert_eq!(d.matching_seeds, vec![1, 2, 3]);
        let ci = d.ci95.expect("interval");
        assert!((d.difference.unwrap() - 0.1).abs() < 1e-9);
        assert!(ci[1] - ci[0] < 1e-9, "no spread in the differences: {ci:?}");
        // Unpaired seeds: Welch's interval is wide (the seeds' spread counts).
        let b2 = [(Some(7), 0.3), (Some(8), 0.6), (Some(9), 0.9)];
        let d = metric_diff(&key(), &a, &b2);
        assert_eq!(d.method, "welch");
        assert!(d.matching_seeds.is_empty());
        let ci = d.ci95.expect("interval");
        assert!(ci[0] < 0.0 && ci[1] > 0.2, "{ci:?}");
        // One value each: a difference, no interval.
        let d = metric_diff(&key(), &[(None, 0.5)], &[(None, 0.7)]);
        assert_eq!(d.method, "none");
        assert!((d.difference.unwrap() - 0.2).abs() < 1e-12 && d.ci95.is_none());
        // Only on one side: nothing to subtract.
        let d = metric_diff(&key(), &[(None, 0.5)], &[]);
        assert!(d.difference.is_none() && d.n_b == 0);
    }
}
