//! Learning evidence for reviewers: how a node's training runs were still moving at their end —
//! the training loss's slope and the compared metric's gain per 1,000 steps over the last half
//! of each run, with their 95% intervals across runs — read from what the record holds (each
//! `run_sft`'s learning curve and intermediate checkpoints, and the scores recorded for them).

use crate::api::types::{Estimate, Trend};
use crate::os::*;

/// A loss falling slower than this (relative, per 1,000 steps) is no longer "still learning".
pub const STILL_LEARNING_SLOPE: f64 = -0.1;

/// What the record says of one accepted `run_sft` of a node.
#[derive(Debug, Clone)]
pub(in crate::os) struct RunFacts {
    pub steps: u64,
    /// The checkpoint it started from (resolved: the base model's sha256 for "base").
    pub start: Option<String>,
    pub checkpoint: Option<String>,
    pub intermediate: Vec<(u64, String)>,
    pub curve: Vec<(u64, f64)>,
}

impl Study {
    /// The node's accepted `run_sft` actions, as the record holds them.
    pub(in crate::os) fn run_facts(&self, node: &str) -> Result<Vec<RunFacts>> {
        let mut out = Vec::new();
        for a in self.index.node_accepted(node, ActionName::RunSft)? {
            let a = a.record;
            let Some(res) = &a.result else { continue };
            let steps = a.request.get("steps").and_then(Value::as_u64).unwrap_or(0);
            let start = match a.request.get("base").and_then(Value::as_str) {
                Some("base") => Some(self.base_checkpoint()?),
                Some(c) => Some(c.to_string()),
                None => None,
            };
            let list = |k: &str| {
                res.get(k)
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            };
            out.push(RunFacts {
                steps,
                start,
                checkpoint: res
                    .get("checkpoint")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                intermediate: list("intermediate")
                    .iter()
                    .filter_map(|p| {
                        Some((
                            p.get("step")?.as_u64()?,
                            p.get("checkpoint")?.as_str()?.to_string(),
                        ))
                    })
                    .collect(),
                curve: list("curve")
                    .iter()
                    .filter_map(|p| Some((p.get("step")?.as_u64()?, p.get("loss")?.as_f64()?)))
                    .filter(|p| p.1.is_finite())
                    .collect(),
            });
        }
        Ok(out)
    }

    /// Steps of training behind a checkpoint: the run that made it plus what was behind the
    /// checkpoint that run started from (the base model counts 0).
    pub(in crate::os) fn steps_behind(&self, checkpoint: &str) -> Result<u64> {
        let mut total = 0u64;
        let mut ck = checkpoint.to_string();
        // A lineage is acyclic (a checkpoint is made after the one it starts from); the bound only
        // guards against a record that says otherwise.
        for _ in 0..10_000 {
            let Some((node, seq, _)) = self.index.checkpoint_origin(&ck)? else {
                return Ok(total);
            };
            let a = match self.action(&node, seq) {
                Ok((a, _)) => a,
                Err(e) if e.kind == ErrorKind::NotFound => return Ok(total),
                Err(e) => return Err(e),
            };
            if a.action != ActionName::RunSft {
                return Ok(total);
            }
            let steps = a.request.get("steps").and_then(Value::as_u64).unwrap_or(0);
            // An intermediate checkpoint carries the steps up to where it was kept.
            let kept_at = a
                .result
                .as_ref()
                .and_then(|r| r.get("intermediate"))
                .and_then(Value::as_array)
                .and_then(|v| {
                    v.iter()
                        .find(|p| p.get("checkpoint").and_then(Value::as_str) == Some(&ck))
                })
                .and_then(|p| p.get("step")?.as_u64());
            total = total.saturating_add(kept_at.unwrap_or(steps));
            match a.request.get("base").and_then(Value::as_str) {
                Some(b) if b != "base" => ck = b.to_string(),
                _ => return Ok(total),
            }
        }
        Ok(total)
    }

    /// The trend of a node's runs on one task/split/metric (None without learning curves).
    pub(in crate::os) fn trend(
        &self,
        runs: &[RunFacts],
        task: &str,
        split: Split,
        metric: &str,
    ) -> Result<Option<Trend>> {
        let mut slopes = Vec::new();
        let mut ends = Vec::new();
        let mut gains = Vec::new();
        let mut trained = 0u64;
        for r in runs {
            if let Some(c) = &r.checkpoint {
                trained = trained.max(self.steps_behind(c)?);
            }
            if let Some(s) = relative_slope_last_half(&r.curve, r.steps) {
                slopes.push(s);
            }
            if let Some(l) = r.curve.last() {
                ends.push(l.1);
            }
            // The metric along the run: where it started, where it was kept, where it ended.
            let score = |c: &str| -> Result<Option<f64>> {
                let v = self
                    .index
                    .checkpoint_scores(c, task, split.as_str(), metric)?;
                Ok(crate::util::stats::mean_ci95(&v).0)
            };
            let mut points = Vec::new();
            if let Some(s) = &r.start
                && let Some(v) = score(s)?
            {
                points.push((0u64, v));
            }
            for (step, c) in &r.intermediate {
                if let Some(v) = score(c)? {
                    points.push((*step, v));
                }
            }
            if let Some(c) = &r.checkpoint
                && let Some(v) = score(c)?
            {
                points.push((r.steps, v));
            }
            if let Some(g) = gain_last_half(&points, r.steps) {
                gains.push(g);
            }
        }
        if slopes.is_empty() {
            return Ok(None);
        }
        let est = |v: &[f64]| -> Option<Estimate> {
            let (mean, ci95) = crate::util::stats::mean_ci95(v);
            Some(Estimate { mean: mean?, ci95 })
        };
        let slope = est(&slopes).ok_or_else(|| Error::internal("no slope"))?;
        // Every run agrees the loss still falls, and on average by more than 10% per 1k steps.
        // (A Student interval over two or three runs is too wide to decide on: t is 12.7 for two.)
        let still_learning = slope.mean < STILL_LEARNING_SLOPE && slopes.iter().all(|s| *s < 0.0);
        Ok(Some(Trend {
            runs: slopes.len() as u64,
            trained_steps: trained,
            loss_end: est(&ends).unwrap_or(Estimate {
                mean: f64::NAN,
                ci95: None,
            }),
            loss_slope_per_1k: slope,
            gain_per_1k: est(&gains),
            still_learning,
        }))
    }
}

/// Least-squares slope of `y` on `x` (None for fewer than two distinct x).
fn ls_slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    Some(sxy / sxx)
}

/// The loss's slope per 1,000 steps over the last half of a run, relative to its mean there.
pub fn relative_slope_last_half(curve: &[(u64, f64)], steps: u64) -> Option<f64> {
    let half = steps / 2;
    let tail: Vec<(f64, f64)> = curve
        .iter()
        .filter(|p| p.0 >= half)
        .map(|p| (p.0 as f64 / 1000.0, p.1))
        .collect();
    let slope = ls_slope(&tail)?;
    let level = tail.iter().map(|p| p.1).sum::<f64>() / tail.len() as f64;
    (level > 0.0)
        .then(|| slope / level)
        .filter(|s| s.is_finite())
}

/// The metric's gain per 1,000 steps over the last half of a run: the least-squares slope over
/// the points at or after half-way, or over the last two points when fewer are there (so two
/// scores — the start and the end — are enough).
pub fn gain_last_half(points: &[(u64, f64)], steps: u64) -> Option<f64> {
    let half = steps / 2;
    let mut pts: Vec<(u64, f64)> = points.to_vec();
    pts.sort_by_key(|p| p.0);
    let mut first = pts.iter().position(|p| p.0 >= half).unwrap_or(pts.len());
    if pts.len() - first < 2 {
        first = pts.len().saturating_sub(2);
    }
    let tail: Vec<(f64, f64)> = pts[first..]
        .iter()
        .map(|p| (p.0 as f64 / 1000.0, p.1))
        .collect();
    ls_slope(&tail).filter(|s| s.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_falling_loss_has_a_negative_relative_slope() {
        // Loss halves from 1.0 to 0.5 over the last 500 of 1,000 steps: slope -1.0 per 1k,
        // level 0.75 → -1.333 per 1k relative.
        let curve: Vec<(u64, f64)> = (0..=10)
            .map(|i| {
                (
                    i * 100,
                    if i < 5 {
                        1.0
                    } else {
                        1.0 - 0.1 * (i - 5) as f64
                    },
                )
            })
            .collect();
        let s = relative_slope_last_half(&curve, 1000).expect("slope");
        assert!((s - (-1.0 / 0.75)).abs() < 1e-9, "{s}");
        let flat: Vec<(u64, f64)> = (0..=10).map(|i| (i * 100, 0.3)).collect();
        assert_eq!(relative_slope_last_half(&flat, 1000), Some(0.0));
        assert_eq!(relative_slope_last_half(&curve[..1], 1000), None);
    }

    #[test]
    fn gain_uses_the_start_when_only_the_ends_are_scored() {
        // Start 0.1, end 0.4 after 600 steps: 0.5 per 1k.
        let g = gain_last_half(&[(0, 0.1), (600, 0.4)], 600).expect("gain");
        assert!((g - 0.5).abs() < 1e-9, "{g}");
        // With a midpoint only the last half counts: 0.3 → 0.4 over 300 steps.
        let g = gain_last_half(&[(0, 0.1), (300, 0.3), (600, 0.4)], 600).expect("gain");
        assert!((g - 1.0 / 3.0).abs() < 1e-9, "{g}");
        assert_eq!(gain_last_half(&[(600, 0.4)], 600), None);
    }
}
