//! A lock that serves its waiters round-robin by name: one caller's flood of requests waits its
//! turn behind each other caller's next one instead of ahead of it (a std `Mutex` wakes waiters
//! in no particular order, so a loop with many calls in flight starved a colleague's one call).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};

struct State {
    busy: bool,
    /// Waiting tickets per name, oldest first.
    waiting: BTreeMap<String, VecDeque<u64>>,
    /// The name served last: the next turn goes to the first name after it.
    last: Option<String>,
    /// The ticket allowed in now (it takes the lock when it wakes).
    granted: Option<u64>,
    next: u64,
}

pub struct FairGate {
    state: Mutex<State>,
    cv: Condvar,
}

/// Held while the caller is inside; the next turn is given when it drops.
pub struct Turn<'a> {
    gate: &'a FairGate,
}

impl Default for FairGate {
    fn default() -> Self {
        Self::new()
    }
}

impl FairGate {
    pub const fn new() -> FairGate {
        FairGate {
            state: Mutex::new(State {
                busy: false,
                waiting: BTreeMap::new(),
                last: None,
                granted: None,
                next: 0,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait for `name`'s turn.
    pub fn enter(&self, name: &str) -> Turn<'_> {
        let mut st = self.lock();
        if !st.busy && st.waiting.is_empty() {
            st.busy = true;
            st.last = Some(name.to_string());
            return Turn { gate: self };
        }
        let ticket = st.next;
        st.next += 1;
        st.waiting
            .entry(name.to_string())
            .or_default()
            .push_back(ticket);
        if !st.busy {
            grant_next(&mut st);
            self.cv.notify_all();
        }
        while st.granted != Some(ticket) {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.granted = None;
        Turn { gate: self }
    }
}

/// Give the next turn: the oldest ticket of the first waiting name after the one served last.
fn grant_next(st: &mut State) {
    let name = st
        .last
        .as_ref()
        .and_then(|last| {
            st.waiting
                .range::<String, _>((
                    std::ops::Bound::Excluded(last.clone()),
                    std::ops::Bound::Unbounded,
                ))
                .next()
                .map(|(k, _)| k.clone())
        })
        .or_else(|| st.waiting.keys().next().cloned());
    let Some(name) = name else {
        st.busy = false;
        return;
    };
    let ticket = st.waiting.get_mut(&name).and_then(VecDeque::pop_front);
    if st.waiting.get(&name).is_some_and(VecDeque::is_empty) {
        st.waiting.remove(&name);
    }
    st.busy = true;
    st.granted = ticket;
    st.last = Some(name);
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut st = self.gate.lock();
        st.busy = false;
        if !st.waiting.is_empty() {
            grant_next(&mut st);
            self.gate.cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_flood_from_one_name_does_not_keep_another_waiting() {
        let gate = Arc::new(FairGate::new());
        let held = gate.enter("loop");
        // Twenty calls of a loop queue up, then one call of a colleague.
        let order = Arc::new(Mutex::new(Vec::new()));
        let started = Arc::new(AtomicUsize::new(0));
        let mut threads = Vec::new();
        for i in 0..21 {
            let (g, order, started) = (gate.clone(), order.clone(), started.clone());
            let name = if i == 20 { "honest" } else { "loop" };
            threads.push(std::thread::spawn(move || {
                started.fetch_add(1, Ordering::SeqCst);
                let _t = g.enter(name);
                order.lock().expect("order").push(name);
            }));
            // Each waiter queues before the next starts (the colleague comes last).
            while gate
                .lock()
                .waiting
                .values()
                .map(VecDeque::len)
                .sum::<usize>()
                < i + 1
            {
                std::thread::yield_now();
            }
        }
        drop(held);
        for t in threads {
            t.join().expect("join");
        }
        let order = order.lock().expect("order");
        let honest = order.iter().position(|n| *n == "honest").expect("served");
        assert!(
            honest <= 1,
            "the colleague waited behind {honest} calls: {order:?}"
        );
        assert_eq!(order.len(), 21);
    }
}
