//! Where an accepted action's time goes: each write phase's own time (its time minus the phases
//! inside it), summed per phase. The phases are the trace-level spans the record and the OS mark
//! (`tracing::instrument(level = "trace", name = "git.pack")` and the like): disabled, and
//! costing nothing, unless this layer listens. `rsim bench` and `cargo bench --bench record`
//! print the breakdown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tracing::span;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Each phase's own time (µs) and calls, summed while listening.
#[derive(Clone, Default)]
pub struct Phases(Arc<Mutex<HashMap<&'static str, (f64, u64)>>>);

struct Timing {
    start: Instant,
    children: f64,
}

/// One phase's share of an action.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Phase {
    pub name: String,
    /// Own time per action, µs.
    pub us_per_action: f64,
    pub calls_per_action: f64,
}

impl<S> Layer<S> for Phases
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_enter(&self, id: &span::Id, ctx: Context<'_, S>) {
        if let Some(s) = ctx.span(id) {
            s.extensions_mut().insert(Timing {
                start: Instant::now(),
                children: 0.0,
            });
        }
    }

    fn on_exit(&self, id: &span::Id, ctx: Context<'_, S>) {
        let Some(s) = ctx.span(id) else { return };
        let Some(t) = s.extensions_mut().remove::<Timing>() else {
            return;
        };
        let total = t.start.elapsed().as_secs_f64() * 1e6;
        if let Some(parent) = s.parent()
            && let Some(pt) = parent.extensions_mut().get_mut::<Timing>()
        {
            pt.children += total;
        }
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let e = m.entry(s.name()).or_default();
        e.0 += total - t.children;
        e.1 += 1;
    }
}

impl Phases {
    /// This layer over rsim's own spans only, to install as a subscriber.
    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        tracing_subscriber::registry().with(self.clone().with_filter(
            tracing_subscriber::filter::filter_fn(|m| m.target().starts_with("rsi_master")),
        ))
    }

    /// Run `f` with this layer listening on the current thread (other threads keep the
    /// process's own subscriber).
    pub fn listen<T>(&self, f: impl FnOnce() -> T) -> T {
        tracing::subscriber::with_default(self.subscriber(), f)
    }

    pub fn clear(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Each phase's own time and calls per action over `actions` actions, largest first.
    pub fn per_action(&self, actions: usize) -> Vec<Phase> {
        let n = actions.max(1) as f64;
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut rows: Vec<Phase> = m
            .iter()
            .map(|(name, (us, calls))| Phase {
                name: name.to_string(),
                us_per_action: us / n,
                calls_per_action: *calls as f64 / n,
            })
            .collect();
        rows.sort_by(|a, b| {
            b.us_per_action
                .total_cmp(&a.us_per_action)
                .then_with(|| a.name.cmp(&b.name))
        });
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_is_timed_without_the_phases_inside_it() {
        let phases = Phases::default();
        phases.listen(|| {
            for _ in 0..2 {
                let _outer = tracing::trace_span!("outer").entered();
                std::thread::sleep(std::time::Duration::from_millis(2));
                let _inner = tracing::trace_span!("inner").entered();
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        });
        let rows = phases.per_action(2);
        let get = |n: &str| rows.iter().find(|r| r.name == n).cloned().expect(n);
        let (outer, inner) = (get("outer"), get("inner"));
        assert_eq!((outer.calls_per_action, inner.calls_per_action), (1.0, 1.0));
        // The outer phase's own time leaves out the 20 ms inside it.
        assert!(inner.us_per_action >= 20_000.0, "{inner:?}");
        assert!(
            outer.us_per_action < inner.us_per_action,
            "{outer:?} {inner:?}"
        );
        assert_eq!(rows[0].name, "inner", "largest first: {rows:?}");
        // Nothing is counted once the layer no longer listens.
        let _outside = tracing::trace_span!("outside").entered();
        assert!(phases.per_action(1).iter().all(|r| r.name != "outside"));
    }
}
