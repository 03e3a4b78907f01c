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
use super::*;
use crate::graph::run::{NodeHooks, RunState};

pub(super) struct GraphJob {
    stream: Arc<HostStream>,
    value: u64,
    ran: Ran,
    published: bool,
    op: UnsafeCell<Option<Op>>,
    /// Weak: an engine that cloned the job may drop it after the launch
    /// completed, and the plan (with its buffers and callbacks) must not outlive
    /// the launch for that.
    exec: Weak<crate::graph::ExecInner>,
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
    job: &'a GraphJob,
    op: &'a Op,
    unit: u32,
}

impl NodeHooks for OnEngine<'_> {
    fn record(&mut self, l: &crate::graph::run::GraphLaunch, v: u32, start_ns: u64, failed: bool) {
        let body = &l.exec.nodes[v as usize];
        let (kind, bytes) = crate::graph::run::node_kind(body);
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
            end_ns: crate::clock::now_ns(),
            bytes,
            dep: None,
            failed,
            node: Some(crate::graph::run::node_ref(&l.exec, v)),
        });
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
    // A single chain needs no helpers, so it is not published.
    let published = l.exec.sched.chain_heads.len() > 1;
    let sources = l.exec.sched.preds.iter().filter(|&&p| p == 0).count();
    let job = Arc::new(GraphJob {
        stream: stream.clone(),
        value,
        ran,
        published,
        exec: Arc::downgrade(&l.exec),
        op: UnsafeCell::new(Some(op)),
        run: Some(run),
    });
    if published {
        *lock(&sh.graph_slots[stream.queue].job) = Some(job.clone());
        sh.graph_count.fetch_add(1, Ordering::Release);
        let helpers = (sh.config.compute_units - 1).min(sources.saturating_sub(1));
        if helpers > 0 {
            sh.idle.wake(helpers as u32);
        }
    }
    drive(sh, &job, ran.unit);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A published job with chains ready to take, if any.
pub(super) fn find_graph_job(sh: &Shared) -> Option<Arc<GraphJob>> {
    sh.graph_slots.iter().find_map(|slot| {
        let guard = slot.job.try_lock().ok()?;
        guard.as_ref().filter(|j| j.run().has_ready()).cloned()
    })
}

/// Runs ready chains of `job` until none is queued; the thread that finishes
/// the last node completes the launch.
pub(super) fn drive(sh: &Shared, job: &Arc<GraphJob>, unit: u32) {
    let run = job.run();
    while let Some(v) = run.pop() {
        // SAFETY: node `v` is unfinished, so the op is in place (module doc).
        let op = unsafe { (*job.op.get()).as_ref() }.expect("a running job has its op");
        let Body::Graph(l) = &op.body else {
            unreachable!("a graph job holds a graph launch")
        };
        let mut user = OnEngine { job, op, unit };
        let wake = job.published;
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
    if job.published {
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
