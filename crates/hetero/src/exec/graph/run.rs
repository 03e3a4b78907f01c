//! Launching and running an executable graph.
//!
//! A launch is one op (`Body::Graph`) in one ring slot. The engine that takes
//! it runs the graph's nodes directly, chain by chain; on the host backend idle
//! engines help with chains that became ready (`backend/host/graph.rs`),
//! the emulated device runs them in topological order and models the time.
//!
//! Run-state invariants (one `RunState` per running launch, reused after):
//! - a node runs once its predecessors completed: the next node of a chain
//!   right after its predecessor on the same thread; a node with two or more
//!   predecessors (a join) when its counter, decremented once by each
//!   predecessor (AcqRel), reaches zero — the thread that brings it there runs
//!   it or queues it;
//! - a node that became ready and is not run at once by the thread that made it
//!   ready goes into `ready` exactly once: slots are taken by `fetch_add` on
//!   `tail`, written with Release, and popped by a CAS on `head`; a popper that
//!   sees a taken but unwritten slot treats the queue as empty — the pusher
//!   itself pops until the queue is empty before it stops, so nothing is left;
//! - `remaining` counts nodes not yet finished; the thread that brings it to
//!   zero completes the launch, after every node's effects (AcqRel);
//! - a failed node poisons the nodes that depend on it (the graph's own
//!   edges, `Schedule::dependents`, not the run's edges, which also chain
//!   nodes that only share a lane) before making its run successors ready
//!   (Relaxed store, published by the counter or queue release, or by the
//!   same thread; a dependent is reachable along run edges, so every path to
//!   it passes through that release): a poisoned node is skipped and poisons
//!   its own dependents, so a fault fails exactly the nodes that depend on it.

use super::launch::{GraphLaunch, NodeHooks};
use super::plan::Plan;
use super::schedule::{Dependents, Hot, NONE};
use crate::exec::loom::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use crate::Result;
use crossbeam_utils::CachePadded;

const SKIPPED: u8 = 1;
const FAILED: u8 = 2;
use std::sync::Mutex;

/// The state of one running launch (see the module doc).
pub(crate) struct RunState {
    counters: Box<[AtomicU32]>,
    /// Per node: 0 ran or is to run, `SKIPPED` (a predecessor failed),
    /// `FAILED` (it failed itself).
    poisoned: Box<[AtomicU8]>,
    ready: Box<[AtomicU32]>,
    head: CachePadded<AtomicUsize>,
    tail: CachePadded<AtomicUsize>,
    remaining: CachePadded<AtomicUsize>,
    any_poison: AtomicBool,
    error: Mutex<Option<String>>,
}

impl RunState {
    fn new(n: usize) -> Box<RunState> {
        Box::new(RunState {
            counters: (0..n).map(|_| AtomicU32::new(0)).collect(),
            poisoned: (0..n).map(|_| AtomicU8::new(0)).collect(),
            ready: (0..n).map(|_| AtomicU32::new(0)).collect(),
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
            remaining: CachePadded::new(AtomicUsize::new(0)),
            any_poison: AtomicBool::new(false),
            error: Mutex::new(None),
        })
    }

    /// A run state for a launch of `e`, its sources queued. The caller owns it
    /// alone until it publishes it.
    pub(crate) fn take(e: &Plan) -> Box<RunState> {
        let n = e.nodes.len();
        let mut r = e
            .runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .unwrap_or_else(|| RunState::new(n));
        r.reset(&e.sched.hot, &e.sched.sources, &e.sched.joins);
        r
    }

    /// Readies a run state (owned alone) for a launch: counters of the joins,
    /// sources queued. Stores, not `get_mut`: the loom atomics have none.
    /// `sources` and `joins` are the nodes without and with two or more
    /// predecessors (`Schedule::sources`, `Schedule::joins`).
    fn reset(&mut self, hot: &[Hot], sources: &[u32], joins: &[u32]) {
        let tail = self.tail.load(Ordering::Relaxed);
        for slot in &self.ready[..tail] {
            slot.store(0, Ordering::Relaxed);
        }
        if self.any_poison.swap(false, Ordering::Relaxed) {
            for p in self.poisoned.iter() {
                p.store(0, Ordering::Relaxed);
            }
        }
        *self.error.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
        for &v in joins {
            self.counters[v as usize].store(hot[v as usize].preds, Ordering::Relaxed);
        }
        self.head.store(0, Ordering::Relaxed);
        self.tail.store(0, Ordering::Relaxed);
        self.remaining.store(hot.len(), Ordering::Relaxed);
        for &v in sources {
            self.push(v);
        }
    }

    /// Gives a run state back for the next launch.
    pub(crate) fn give_back(self: Box<Self>, e: &Plan) {
        e.runs.lock().unwrap_or_else(|p| p.into_inner()).push(self);
    }

    fn push(&self, v: u32) {
        let i = self.tail.fetch_add(1, Ordering::AcqRel);
        self.ready[i].store(v + 1, Ordering::Release);
    }

    /// A queued node, if one is there to take.
    pub(crate) fn pop(&self) -> Option<u32> {
        loop {
            let h = self.head.load(Ordering::Acquire);
            if h >= self.tail.load(Ordering::Acquire) {
                return None;
            }
            let x = self.ready[h].load(Ordering::Acquire);
            if x == 0 {
                return None; // its pusher pops it (module doc)
            }
            if self
                .head
                .compare_exchange(h, h + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some(x - 1);
            }
        }
    }

    /// Whether node `v` failed or was skipped, once the launch ran.
    pub(crate) fn node_failed(&self, v: usize) -> bool {
        self.poisoned[v].load(Ordering::Relaxed) != 0
    }

    /// Whether queued nodes may be there to take (a hint).
    pub(crate) fn has_ready(&self) -> bool {
        self.head.load(Ordering::Relaxed) < self.tail.load(Ordering::Relaxed)
    }

    /// Counts `k` more nodes finished; true for the thread that finished the last.
    pub(crate) fn finished(&self, k: usize) -> bool {
        k > 0 && self.remaining.fetch_sub(k, Ordering::AcqRel) == k
    }

    /// The launch's result once every node finished.
    pub(crate) fn result(&self) -> Result<(), String> {
        match self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(m) => Err(m),
            None => Ok(()),
        }
    }

    fn fail(&self, l: &GraphLaunch, v: u32, message: String) {
        self.fail_with(v, l.exec.nodes[v as usize].name(), message)
    }

    fn fail_with(&self, v: u32, name: &str, message: String) {
        self.error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(|| format!("graph node {v} ({name}): {message}"));
    }

    /// Runs `v` and then its chain as far as it is ready; queues successors in
    /// other chains that became ready (calling `pushed` for each). Returns the
    /// nodes run.
    ///
    /// `pushed` is called once, at the first node this queues: one more
    /// engine is enough to take what a run of a chain leaves, since every
    /// runner keeps taking queued nodes until none is left.
    pub(crate) fn run_chain(
        &self,
        l: &GraphLaunch,
        v: u32,
        hooks: &mut impl NodeHooks,
        pushed: impl FnOnce(),
    ) -> usize {
        let s = &l.exec.sched;
        let profiling = crate::exec::clock::profiling();
        self.walk(&s.hot, &s.succ, &s.dependents, v, pushed, |v| {
            let start_ns = if profiling {
                crate::exec::clock::now_ns()
            } else {
                0
            };
            let result = hooks.run(l, v).map_err(|m| self.fail(l, v, m));
            if profiling {
                hooks.record(l, v, start_ns, result.is_err());
            }
            result
        })
    }

    /// `run_chain` over any schedule (`hot`, `succ`, and the graph's
    /// `dependents`): `run(v)` runs node `v` and says whether it failed (it
    /// has recorded why).
    fn walk(
        &self,
        hot: &[Hot],
        succ: &[u32],
        dependents: &Dependents,
        mut v: u32,
        pushed: impl FnOnce(),
        mut run: impl FnMut(u32) -> Result<(), ()>,
    ) -> usize {
        let mut ran = 0;
        let mut pushed = Some(pushed);
        loop {
            let failed = if self.poisoned[v as usize].load(Ordering::Relaxed) != 0 {
                true
            } else if run(v).is_err() {
                self.any_poison.store(true, Ordering::Relaxed);
                self.poisoned[v as usize].store(FAILED, Ordering::Relaxed);
                true
            } else {
                false
            };
            ran += 1;
            if failed {
                // Before any successor is made ready below (see the module doc).
                self.any_poison.store(true, Ordering::Relaxed);
                for w in dependents.of(v) {
                    self.poisoned[w as usize].store(SKIPPED, Ordering::Relaxed);
                }
            }
            let h = hot[v as usize];
            // Successors other than the chain's next node (none, in a chain).
            if h.succ_end - h.succ_start > u32::from(h.next != NONE) {
                for &w in &succ[h.succ_start as usize..h.succ_end as usize] {
                    if w != h.next && self.arrive(hot[w as usize].preds, w) {
                        self.push(w);
                        if let Some(p) = pushed.take() {
                            p();
                        }
                    }
                }
            }
            if h.next == NONE || !self.arrive(hot[h.next as usize].preds, h.next) {
                return ran;
            }
            v = h.next;
        }
    }

    /// One predecessor of `w` finished: whether `w` is now ready.
    #[inline]
    fn arrive(&self, preds: u32, w: u32) -> bool {
        preds < 2 || self.counters[w as usize].fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Runs every node on this thread, in queue order (a device that runs a
    /// launch alone: the emulated one).
    pub(crate) fn run_all(
        &self,
        l: &GraphLaunch,
        hooks: &mut impl NodeHooks,
    ) -> Result<(), String> {
        let mut done = 0;
        while let Some(v) = self.pop() {
            done += self.run_chain(l, v, hooks, || {});
        }
        debug_assert_eq!(done, l.nodes());
        self.finished(done);
        self.result()
    }
}

/// Loom models of the run protocol (`RunState::walk` with the real queue,
/// counters and `remaining`): on a fork/join graph run by two threads every
/// node runs exactly once, after its predecessors, and exactly one thread sees
/// the last node finish; a failure skips exactly the nodes after it.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::exec::loom::Arc;

    /// The run's edges of a graph, and its own dependency edges.
    struct Graph {
        hot: Vec<Hot>,
        succ: Vec<u32>,
        deps: Dependents,
    }

    /// 0 -> {1, 2} -> 3, lanes: 0 -> 1 -> 3 and 2 alone.
    fn diamond() -> Graph {
        let hot = vec![
            Hot {
                preds: 0,
                next: 1,
                succ_start: 0,
                succ_end: 2,
            },
            Hot {
                preds: 1,
                next: 3,
                succ_start: 2,
                succ_end: 3,
            },
            Hot {
                preds: 1,
                next: NONE,
                succ_start: 3,
                succ_end: 4,
            },
            Hot {
                preds: 2,
                next: NONE,
                succ_start: 4,
                succ_end: 4,
            },
        ];
        Graph {
            hot,
            succ: vec![1, 2, 3, 3],
            deps: Dependents::new(&[(0, 1), (0, 2), (1, 3), (2, 3)]),
        }
    }

    /// Two chains of the graph, 0 -> 2 and 1 -> 3, on one lane in the order
    /// 0, 1, 2, 3: the run's edges chain nodes the graph keeps independent.
    fn one_lane() -> Graph {
        let hot = (0..4u32)
            .map(|v| Hot {
                preds: u32::from(v > 0),
                next: if v < 3 { v + 1 } else { NONE },
                succ_start: v.min(3),
                succ_end: (v + 1).min(3),
            })
            .collect();
        Graph {
            hot,
            succ: vec![1, 2, 3],
            deps: Dependents::new(&[(0, 2), (1, 3)]),
        }
    }

    fn runner(r: &RunState, g: &Graph, done: &[AtomicU32], fail: Option<u32>) -> bool {
        let (hot, succ) = (&g.hot, &g.succ);
        let mut last = false;
        while let Some(v) = r.pop() {
            let k = r.walk(
                hot,
                succ,
                &g.deps,
                v,
                || {},
                |v| {
                    // Every predecessor finished (ran, or was skipped)
                    // before this node runs.
                    for (u, h) in hot.iter().enumerate() {
                        let s = &succ[h.succ_start as usize..h.succ_end as usize];
                        if s.contains(&v) {
                            let ran = done[u].load(Ordering::Acquire) == 1;
                            assert!(ran || r.node_failed(u), "{u} before {v}");
                        }
                    }
                    assert_eq!(done[v as usize].fetch_add(1, Ordering::AcqRel), 0);
                    if fail == Some(v) {
                        r.fail_with(v, "test", "failed on purpose".into());
                        return Err(());
                    }
                    Ok(())
                },
            );
            last |= r.finished(k);
        }
        last
    }

    /// Runs `graph()` on two threads, node `fail` failing; `expected` is how
    /// many times each node ran.
    fn model(graph: fn() -> Graph, fail: Option<u32>, expected: [u32; 4]) {
        loom::model(move || {
            let g = Arc::new(graph());
            let hot = &g.hot;
            let mut r = RunState::new(4);
            let of = |keep: fn(u32) -> bool| -> Vec<u32> {
                (0..hot.len() as u32)
                    .filter(|&v| keep(hot[v as usize].preds))
                    .collect()
            };
            r.reset(hot, &of(|p| p == 0), &of(|p| p >= 2));
            let r = Arc::new(*r);
            let done: Arc<Vec<AtomicU32>> = Arc::new((0..4).map(|_| AtomicU32::new(0)).collect());
            let (r2, d2, g2) = (r.clone(), done.clone(), g.clone());
            let helper = loom::thread::spawn(move || runner(&r2, &g2, &d2, fail));
            let mine = runner(&r, &g, &done, fail);
            let theirs = helper.join().expect("helper");
            // Nothing is left queued: the pusher pops what it queued itself.
            assert_eq!(
                r.remaining.load(Ordering::Acquire),
                0,
                "every node finished"
            );
            assert_eq!(u8::from(mine) + u8::from(theirs), 1, "one thread completes");
            for (v, &want) in expected.iter().enumerate() {
                assert_eq!(done[v].load(Ordering::Acquire), want, "node {v}");
            }
            assert_eq!(r.result().is_err(), fail.is_some());
        });
    }

    #[test]
    fn loom_graph_run_runs_every_node_once_after_its_predecessors() {
        model(diamond, None, [1, 1, 1, 1]);
    }

    #[test]
    fn loom_graph_run_skips_exactly_what_follows_a_failure() {
        // Node 1 runs and fails; 3 (after it) is skipped, 2 is not.
        model(diamond, Some(1), [1, 1, 1, 0]);
    }

    #[test]
    fn loom_graph_run_fault_skips_no_node_that_only_shares_its_lane() {
        // Node 0 fails: 2 depends on it and is skipped; 1 and 3 follow it on
        // the lane only, and run.
        model(one_lane, Some(0), [1, 1, 0, 1]);
    }
}
