//! Graph launches on the host: the engine that takes the launch op runs its
//! nodes chain by chain; when a fork makes more chains ready than it runs, the
//! launch is published in its hardware queue's graph slot and idle engines take
//! chains from it (the run state's queue, `graph/run.rs`).
//!
//! Invariants:
//! - a job holds its launch op from start to completion; runners read the op
//!   (shared) only while the node they run is unfinished, so `remaining > 0`;
//!   the thread that finishes the last node takes the op and completes it — no
//!   one reads it after;
//! - the slot of a queue holds at most one job (one op per queue is in flight);
//!   the completer empties it before completing, so a later launch on the queue
//!   never meets a stale job; an engine that cloned the job just before sees an
//!   empty run queue (every node was taken) and lets it go; the run state
//!   returns to its plan only when the last clone drops.

#[allow(unused_imports)]
use crate::exec::graph::launch::NodeHooks;
use crate::exec::graph::run::RunState;

pub(super) struct GraphJob {
    stream: Arc<HostStream>,
    value: u64,
    ran: Ran,
    /// In its queue's graph slot (helpers can find it).
    published: AtomicBool,
    /// The blocks of one multi-block kernel node, for every engine to take.
    blocks: BlockJob,
    op: UnsafeCell<Option<Op>>,
    /// Weak: an engine that cloned the job may drop it after the launch
    /// completed, and the plan (with its buffers and callbacks) must not outlive
    /// the launch for that.
    exec: Weak<crate::exec::graph::Plan>,
    run: Option<Box<RunState>>,
}

// SAFETY: `op` is written before the job is shared, read (shared) by runners of
// unfinished nodes, and taken only by the thread that finished the last node
// (module invariants); every other field is Sync.
unsafe impl Sync for GraphJob {}
// SAFETY: every field is Send (Op and the run state are).
unsafe impl Send for GraphJob {}

impl Drop for GraphJob {
    fn drop(&mut self) {
        if let (Some(run), Some(exec)) = (self.run.take(), self.exec.upgrade()) {
            run.give_back(&exec);
        }
    }
}

use super::callback::in_frame;
use super::dispatch::{Engine, Ran};
use super::stream::HostStream;
use super::Shared;
use crate::exec::loom::{
    AtomicBool as LAtomicBool, AtomicU32 as LAtomicU32, AtomicU64 as LAtomicU64,
};
use crate::exec::op::{Body, Op};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// The blocks of a kernel node spread over engines.
///
/// Invariants: `claim` packs `(node + 1) << 32 | next block` (0: none). The
/// runner that takes `busy` stores `blocks` and `done`, then publishes `claim`
/// (Release); the others run their nodes' blocks themselves meanwhile;
/// a block is taken by a CAS `(v, b) -> (v, b + 1)` with `b < blocks`, and
/// read only after that CAS succeeded (Acquire). The runner waits until
/// `done == blocks` (AcqRel) before it clears `claim` and goes on, so a block is
/// run exactly once and never after its node finished; a stale CAS fails,
/// since each node of a launch is installed at most once.
#[derive(Default)]
struct BlockJob {
    /// Taken by the runner that installs a node (one node's blocks at a time).
    busy: LAtomicBool,
    claim: LAtomicU64,
    blocks: LAtomicU32,
    done: LAtomicU32,
    error: Mutex<Option<String>>,
}

const BLOCK_MASK: u64 = (1 << 32) - 1;

impl BlockJob {
    fn available(&self) -> bool {
        let c = self.claim.load(Ordering::Relaxed);
        c != 0 && (c & BLOCK_MASK) < u64::from(self.blocks.load(Ordering::Relaxed))
    }

    /// Installs node `v`'s `blocks` for every engine to take; false when
    /// another node's blocks are out (the caller runs its blocks itself).
    fn install(&self, v: u32, blocks: u32) -> bool {
        if self.busy.swap(true, Ordering::Acquire) {
            return false;
        }
        self.blocks.store(blocks, Ordering::Relaxed);
        self.done.store(0, Ordering::Relaxed);
        self.claim.store(u64::from(v + 1) << 32, Ordering::Release);
        true
    }

    /// Takes blocks of the installed node and runs each with `run(node,
    /// block)` until none is left to take.
    fn help(&self, mut run: impl FnMut(u32, u32) -> Result<(), String>) {
        loop {
            let c = self.claim.load(Ordering::Acquire);
            if c == 0 {
                return;
            }
            let (v, b) = ((c >> 32) as u32 - 1, (c & BLOCK_MASK) as u32);
            let blocks = self.blocks.load(Ordering::Acquire);
            if b >= blocks {
                return;
            }
            if self
                .claim
                .compare_exchange_weak(c, c + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            if let Err(m) = run(v, b) {
                self.error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(m);
            }
            self.done.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The installer, after its own `help`: waits until every block ran, then
    /// frees the job; returns the first block's failure.
    fn finish(&self) -> Result<(), String> {
        let blocks = self.blocks.load(Ordering::Relaxed);
        let backoff = crossbeam_utils::Backoff::new();
        while self.done.load(Ordering::Acquire) < blocks {
            // The blocks others took are running; nothing is left to run here.
            backoff.snooze();
            crate::exec::loom::model_yield();
        }
        self.claim.store(0, Ordering::Release);
        self.busy.store(false, Ordering::Release);
        match self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(m) => Err(m),
            None => Ok(()),
        }
    }
}

/// Runs block `b` of node `v` of `job`'s launch. The launch op is read only
/// with that block taken: its node is then unfinished (its runner waits for
/// the block), so the op is in place.
fn run_taken_block(job: &GraphJob, v: u32, b: u32) -> Result<(), String> {
    // SAFETY: the caller holds block `b` of an unfinished node (see above).
    let op = unsafe { (*job.op.get()).as_ref() }.expect("a running job has its op");
    match &op.body {
        Body::Graph(l) => in_frame(&job.stream, job.value, op, || {
            crate::exec::graph::launch::run_block(l, v, b)
        }),
        _ => Ok(()),
    }
}

impl GraphJob {
    fn run(&self) -> &RunState {
        self.run
            .as_deref()
            .expect("a job has its run state until dropped")
    }
}

/// A graph slot per hardware queue.
#[derive(Default)]
pub(super) struct GraphSlot {
    job: Mutex<Option<Arc<GraphJob>>>,
}

struct OnEngine<'a> {
    sh: &'a Shared,
    job: &'a Arc<GraphJob>,
    op: &'a Op,
    unit: u32,
}

impl NodeHooks for OnEngine<'_> {
    #[inline]
    fn run(&mut self, l: &crate::exec::graph::launch::GraphLaunch, v: u32) -> Result<(), String> {
        let p = &l.params.nodes[v as usize];
        if p.blocks < 2 {
            return crate::exec::graph::launch::run_node(l, v);
        }
        self.run_blocks(l, v)
    }

    fn record(
        &mut self,
        l: &crate::exec::graph::launch::GraphLaunch,
        v: u32,
        start_ns: u64,
        failed: bool,
    ) {
        let body = &l.exec.nodes[v as usize];
        let (kind, bytes) = crate::exec::graph::launch::node_kind(body);
        let stream = &self.job.stream;
        hetero_trace::record_op(hetero_trace::OpRecord {
            kind,
            name: body.name(),
            stream: stream.id,
            queue: stream.queue as u32,
            engine: hetero_trace::EngineKind::Compute,
            engine_index: self.unit,
            seq: self.job.value,
            submit_ns: self.op.submit_ns,
            start_ns,
            end_ns: crate::exec::clock::now_ns(),
            bytes,
            dep: None,
            failed,
            node: Some(crate::exec::graph::launch::node_ref(&l.exec, v)),
        });
    }
}

impl OnEngine<'_> {
    /// A kernel node of several blocks: spread over the engines when they can
    /// all make its views, else run here.
    #[cold]
    fn run_blocks(
        &mut self,
        l: &crate::exec::graph::launch::GraphLaunch,
        v: u32,
    ) -> Result<(), String> {
        let p = &l.params.nodes[v as usize];
        let units = self.sh.config.compute_units as u32;
        let bj = &self.job.blocks;
        // Blocks whose views every engine can make, on a device with engines
        // to spare, while no other node's blocks are out.
        if p.kernel.is_none() || p.slot_args || units < 2 || !bj.install(v, p.blocks) {
            return crate::exec::graph::launch::run_node(l, v);
        }
        publish(self.sh, self.job);
        self.sh.idle.wake((units - 1).min(p.blocks - 1));
        let job = self.job;
        bj.help(|v, b| run_taken_block(job, v, b));
        bj.finish()
    }
}

/// Starts the launch `op` of `stream`, its queue held; the job completes the
/// op and lets the queue go when its last node finishes.
pub(super) fn start_graph(sh: &Shared, stream: &Arc<HostStream>, op: Op, value: u64, ran: Ran) {
    let Body::Graph(l) = &op.body else {
        unreachable!("start_graph takes graph launches")
    };
    if l.nodes() == 0 {
        sh.finish(stream, op, value, Engine::Compute, Ok(()), ran);
        return;
    }
    let run = RunState::take(&l.exec);
    // A single lane needs no helpers (unless a kernel node spreads its
    // blocks, which publishes the job then).
    let published = l.exec.sched.lanes > 1;
    let sources = l.exec.sched.hot.iter().filter(|h| h.preds == 0).count();
    let job = Arc::new(GraphJob {
        stream: stream.clone(),
        value,
        ran,
        published: AtomicBool::new(false),
        blocks: BlockJob::default(),
        exec: Arc::downgrade(&l.exec),
        op: UnsafeCell::new(Some(op)),
        run: Some(run),
    });
    if published {
        publish(sh, &job);
        let helpers = (sh.config.compute_units - 1).min(sources.saturating_sub(1));
        if helpers > 0 {
            sh.idle.wake(helpers as u32);
        }
    }
    drive(sh, &job, ran.unit);
}

/// Puts `job` in its queue's graph slot (once), where idle engines find it.
fn publish(sh: &Shared, job: &Arc<GraphJob>) {
    if job.published.swap(true, Ordering::AcqRel) {
        return;
    }
    *lock(&sh.graph_slots[job.stream.queue].job) = Some(job.clone());
    sh.graph_count.fetch_add(1, Ordering::Release);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A published job with chains ready to take, if any.
pub(super) fn find_graph_job(sh: &Shared) -> Option<Arc<GraphJob>> {
    sh.graph_slots.iter().find_map(|slot| {
        let guard = slot.job.try_lock().ok()?;
        guard
            .as_ref()
            .filter(|j| j.run().has_ready() || j.blocks.available())
            .cloned()
    })
}

/// Runs ready chains of `job` until none is queued; the thread that finishes
/// the last node completes the launch.
pub(super) fn drive(sh: &Shared, job: &Arc<GraphJob>, unit: u32) {
    let run = job.run();
    job.blocks.help(|v, b| run_taken_block(job, v, b));
    while let Some(v) = run.pop() {
        // SAFETY: node `v` is unfinished, so the op is in place (module doc).
        let op = unsafe { (*job.op.get()).as_ref() }.expect("a running job has its op");
        let Body::Graph(l) = &op.body else {
            unreachable!("a graph job holds a graph launch")
        };
        let mut user = OnEngine { sh, job, op, unit };
        let wake = job.published.load(Ordering::Relaxed);
        // The launch's frame for the deadlock checks of blocking calls its
        // kernels and callbacks make.
        let k = in_frame(&job.stream, job.value, op, || {
            run.run_chain(l, v, &mut user, || {
                if wake {
                    sh.idle.wake_one_if_idle();
                }
            })
        });
        if run.finished(k) {
            complete_graph(sh, job);
            return;
        }
    }
}

fn complete_graph(sh: &Shared, job: &Arc<GraphJob>) {
    if job.published.load(Ordering::Acquire) {
        lock(&sh.graph_slots[job.stream.queue].job).take();
        sh.graph_count.fetch_sub(1, Ordering::Release);
    }
    // SAFETY: every node finished (`remaining` reached zero on this thread, AcqRel),
    // so no runner reads the op; this thread is the only one here.
    let op = unsafe { (*job.op.get()).take() }.expect("the launch is completed once");
    let result = job.run().result();
    // The run state goes back to the plan with the job's last clone.
    sh.finish(&job.stream, op, job.value, Engine::Compute, result, job.ran);
}

/// Loom model of the block job: a runner installs a node of three blocks and
/// helps while another engine helps; every block runs exactly once, and the
/// runner goes on only after all ran; a second node installed after reuses it.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    #[test]
    fn loom_graph_blocks_run_once_and_the_runner_waits_for_all() {
        loom::model(|| {
            let job = crate::exec::loom::Arc::new(BlockJob::default());
            let ran = crate::exec::loom::Arc::new([
                LAtomicU32::new(0),
                LAtomicU32::new(0),
                LAtomicU32::new(0),
            ]);
            assert!(job.install(7, 3));
            let (j2, r2) = (job.clone(), ran.clone());
            let helper = loom::thread::spawn(move || {
                j2.help(|v, b| {
                    assert_eq!(v, 7);
                    r2[b as usize].fetch_add(1, Ordering::Relaxed);
                    Ok(())
                })
            });
            job.help(|_, b| {
                ran[b as usize].fetch_add(1, Ordering::Relaxed);
                if b == 1 {
                    Err("block 1 failed".into())
                } else {
                    Ok(())
                }
            });
            let result = job.finish();
            for r in ran.iter() {
                assert_eq!(r.load(Ordering::Relaxed), 1);
            }
            helper.join().expect("helper");
            // Block 1 failed only if this thread ran it.
            assert!(result.is_ok() || result == Err("block 1 failed".into()));
            assert!(job.install(8, 2), "free again once the runner finished");
        });
    }
}
