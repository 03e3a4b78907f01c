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

use super::plan::{ExecInner, Params};
use super::schedule::{Dependents, Hot, NONE};
use super::{NodeBody, Operand};
use crate::exec::kernel::{Args, Block, KView, MAX_KERNEL_ARGS};
use crate::exec::loom::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use crate::exec::storage::{GraphHold, Storage};
use crate::Result;
use crossbeam_utils::CachePadded;

const SKIPPED: u8 = 1;
const FAILED: u8 = 2;
use std::sync::{Arc, Mutex};

/// What a launch op carries.
pub(crate) struct GraphLaunch {
    pub(crate) exec: Arc<ExecInner>,
    pub(crate) params: Arc<Params>,
    pub(crate) table: Option<Arc<Vec<Option<GraphHold>>>>,
}

impl GraphLaunch {
    /// Every buffer the launch touches, once, with whether it writes it.
    pub(crate) fn for_each_access(&self, f: &mut impl FnMut(&Storage, bool) -> bool) -> bool {
        let e = &*self.exec;
        if !e.fixed.iter().all(|(s, w)| f(s, *w)) {
            return false;
        }
        if let Some(t) = &self.table {
            for (i, s) in t.iter().enumerate() {
                if let Some(s) = s.as_ref().filter(|_| e.slot_used[i]) {
                    if !f(s, e.slot_write[i]) {
                        return false;
                    }
                }
            }
        }
        e.arena.as_ref().is_none_or(|a| f(a, true))
    }

    /// Pinned buffers the launch writes: host reads wait for it.
    pub(crate) fn for_each_pinned_written(&self, mut f: impl FnMut(&Storage)) {
        self.for_each_access(&mut |s, w| {
            if w && s.kind == crate::MemoryKind::Pinned {
                f(s);
            }
            true
        });
    }

    fn operand(&self, o: &Operand) -> *mut u8 {
        match o {
            Operand::Fixed(s) => s.ptr(),
            Operand::Slot(i) => self
                .table
                .as_ref()
                .and_then(|t| t[*i as usize].as_ref())
                .map_or(std::ptr::null_mut(), |s| s.ptr()),
            Operand::Internal(i) => match &self.exec.arena {
                // SAFETY: the memory plan placed buffer `i` inside the arena.
                Some(a) => unsafe { a.ptr().add(self.exec.offsets[*i as usize]) },
                None => std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
            },
        }
    }

    pub(crate) fn nodes(&self) -> usize {
        self.exec.nodes.len()
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.exec
            .nodes
            .iter()
            .map(|n| match n {
                NodeBody::Copy { bytes, .. } | NodeBody::Fill { bytes, .. } => *bytes as u64,
                NodeBody::Copy2D(c) => (c.src_r.width * c.src_r.height) as u64,
                _ => 0,
            })
            .sum()
    }
}

impl Drop for GraphLaunch {
    fn drop(&mut self) {
        self.for_each_pinned_written(|s| s.finish_pending_write());
    }
}

/// What a backend does around the nodes it runs.
pub(crate) trait NodeHooks {
    /// Node `v` ran from `start_ns` to now (called only while profiling).
    fn record(&mut self, _l: &GraphLaunch, _v: u32, _start_ns: u64, _failed: bool) {}

    /// Runs node `v` (a backend may spread a kernel's blocks over its engines).
    fn run(&mut self, l: &GraphLaunch, v: u32) -> Result<(), String> {
        run_node(l, v)
    }
}

/// Runs block `b` of kernel node `v`, whose arguments are all known at
/// instantiate (no slot among them): what another engine can run without the
/// node's runner.
pub(crate) fn run_block(l: &GraphLaunch, v: u32, b: u32) -> Result<(), String> {
    let e = &*l.exec;
    let p = &l.params.nodes[v as usize];
    let Some(kernel) = &p.kernel else {
        return Ok(());
    };
    let views = &e.views[p.args.0 as usize..p.args.1 as usize];
    let scalars = l.params.scalars_of(p);
    let (name, f, blocks) = (kernel.name, &kernel.f, p.blocks);
    let mut block = Block::with(b, blocks, Args::Views(views), scalars);
    crate::exec::op::catch_user(|| format!("kernel '{name}' in block {b}"), || f(&mut block))
}

/// The trace kind and engine of a node run on a compute unit.
pub(crate) fn node_kind(body: &NodeBody) -> (hetero_trace::OpKind, u64) {
    use hetero_trace::OpKind as K;
    match body {
        NodeBody::Kernel { .. } => (K::Kernel, 0),
        NodeBody::Copy { kind, bytes, .. } => (kind.trace_kind(), *bytes as u64),
        NodeBody::Fill { bytes, .. } => (K::Fill, *bytes as u64),
        NodeBody::Copy2D(c) => (c.kind.trace_kind(), (c.src_r.width * c.src_r.height) as u64),
        NodeBody::Host(_) => (K::HostFn, 0),
        NodeBody::Wait { .. } | NodeBody::Empty => (K::Record, 0),
    }
}

/// The node's place for the trace.
pub(crate) fn node_ref(e: &ExecInner, v: u32) -> hetero_trace::NodeRef {
    hetero_trace::NodeRef {
        graph: e.graph,
        node: v,
        lane: e.sched.node_lane[v as usize],
    }
}

/// Runs node `v` of `l`: its data effect, or its user code (a panic is the
/// node's failure).
#[inline]
pub(crate) fn run_node(l: &GraphLaunch, v: u32) -> Result<(), String> {
    let e = &*l.exec;
    let p = &l.params.nodes[v as usize];
    if let Some(kernel) = &p.kernel {
        let range = p.args.0 as usize..p.args.1 as usize;
        let mut resolved = [std::mem::MaybeUninit::<KView>::uninit(); MAX_KERNEL_ARGS];
        let views: &[KView] = if p.slot_args {
            let args = &e.args[range];
            for (view, arg) in resolved.iter_mut().zip(args) {
                view.write(KView {
                    ptr: l.operand(&arg.operand),
                    len: arg.len,
                    unit: arg.unit,
                    elem: arg.elem,
                    write: arg.write,
                });
            }
            // SAFETY: the loop initialised the first `args.len()` entries
            // (a launch has at most MAX_KERNEL_ARGS arguments).
            unsafe { std::slice::from_raw_parts(resolved.as_ptr().cast::<KView>(), args.len()) }
        } else {
            // Fixed buffers and the arena: resolved at instantiate.
            &e.views[range]
        };
        let scalars = l.params.scalars_of(p);
        let (name, f, blocks) = (kernel.name, &kernel.f, p.blocks);
        if blocks == 1 {
            let mut block = Block::with(0, 1, Args::Views(views), scalars);
            return crate::exec::op::catch_user(
                || format!("kernel '{name}' in block 0"),
                || f(&mut block),
            );
        }
        let mut result = Ok(());
        for b in 0..blocks {
            let mut block = Block::with(b, blocks, Args::Views(views), scalars);
            let r = crate::exec::op::catch_user(
                || format!("kernel '{name}' in block {b}"),
                || f(&mut block),
            );
            if result.is_ok() {
                result = r;
            }
        }
        return result;
    }
    match &e.nodes[v as usize] {
        // Kernel nodes always have their kernel in the parameters.
        NodeBody::Kernel { .. } => Ok(()),
        NodeBody::Copy {
            src,
            src_off,
            dst,
            dst_off,
            bytes,
            ..
        } => {
            // SAFETY: ranges were checked when the node was recorded against
            // buffers of the same lengths (slots are bound only to buffers of
            // their length); source and destination are different buffers, and
            // the node's order against every other node that touches them
            // (hazard edges) plus the launch's access locks exclude every other
            // writer.
            unsafe {
                crate::exec::effects::copy_bytes(
                    l.operand(src),
                    *src_off,
                    l.operand(dst),
                    *dst_off,
                    *bytes,
                )
            };
            Ok(())
        }
        NodeBody::Fill {
            dst,
            off,
            bytes,
            pattern,
            pattern_len,
        } => {
            let pattern = &pattern[..*pattern_len as usize];
            // SAFETY: as for copies: checked range, sole writer.
            unsafe { crate::exec::effects::fill_bytes(l.operand(dst), *off, *bytes, pattern) };
            Ok(())
        }
        NodeBody::Copy2D(c) => {
            // SAFETY: as for copies: both regions were checked against buffers
            // of these lengths when recorded, they are different buffers, and
            // the node is the sole writer of dst.
            unsafe {
                crate::exec::effects::copy_rows(
                    l.operand(&c.src),
                    c.src_r,
                    l.operand(&c.dst),
                    c.dst_r,
                )
            };
            Ok(())
        }
        NodeBody::Host(f) => crate::exec::op::catch_user(|| "host callback".into(), || f()),
        // Waited for before the launch started.
        NodeBody::Wait { .. } | NodeBody::Empty => Ok(()),
    }
}

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
    pub(crate) fn take(e: &ExecInner) -> Box<RunState> {
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
    pub(crate) fn give_back(self: Box<Self>, e: &ExecInner) {
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
                for &w in dependents.of(v) {
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
            deps: Dependents::new(4, &[(0, 1), (0, 2), (1, 3), (2, 3)]),
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
            deps: Dependents::new(4, &[(0, 2), (1, 3)]),
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
