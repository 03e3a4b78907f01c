//! Whether a stream's oldest op can start (its engine and access locks taken),
//! and its completion: locks and engines given back, the profile record, the
//! timeline advanced, the queue let go. Async ops are polled from here too.

use super::callback::in_frame;
use super::stream::HostStream;
use super::Shared;
use crate::exec::async_op::AsyncPoll;
use crate::exec::op::{Body, Op};
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[derive(Clone, Copy)]
pub(super) enum Engine {
    None,
    Copy(usize, u32),
    Compute,
    /// An async op, done: its access locks were taken when it started.
    Async,
}

/// The oldest op of a stream, judged ready (its engine and access locks taken)
/// but still in the ring: the holder of the stream's queue moves it out once,
/// into the frame that runs it (`EngineThread::execute`), rather than carrying
/// its 120 bytes through every return on the way. `value` is what it completes
/// on the timeline; `engine` is `None` when the stream failed earlier and the
/// op is to be skipped.
pub(super) struct Taken {
    pub(super) value: u64,
    pub(super) engine: Option<Engine>,
}

pub(super) enum Readiness {
    NotReady,
    /// The stream failed earlier: drop the op without running it.
    Skip,
    Ready(Engine),
    /// Ready, but left for the engine that produced its data a moment longer
    /// (`EngineThread::defers`).
    Deferred,
}

impl Shared {
    pub(super) fn acquire_copy_engine(&self, kind: usize) -> Option<u32> {
        let word = &self.copy_free[kind];
        let mut m = word.load(Ordering::Relaxed);
        loop {
            if m == 0 {
                return None;
            }
            let bit = m.trailing_zeros();
            match word.compare_exchange_weak(
                m,
                m & !(1 << bit),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(bit),
                Err(now) => m = now,
            }
        }
    }

    pub(super) fn release_engine(&self, engine: Engine) {
        if let Engine::Copy(kind, bit) = engine {
            self.copy_free[kind].fetch_or(1 << bit, Ordering::Release);
        }
    }

    /// Decides whether the stream's oldest op (at timeline `value`) can start,
    /// taking its engine and buffer locks if so.
    pub(super) fn readiness(&self, stream: &HostStream, op: &Op, value: u64) -> Readiness {
        if stream.timeline.failing() && !stream.timeline.recover_at(value) {
            // Failed, but its waits still wait (`Op::failed_wait_done`).
            return if op.failed_wait_done() {
                Readiness::Skip
            } else {
                Readiness::NotReady
            };
        }
        match &op.body {
            Body::Wait {
                timeline, value, ..
            } => {
                if timeline.is_reached(*value) {
                    Readiness::Ready(Engine::None)
                } else {
                    Readiness::NotReady
                }
            }
            Body::WaitAll(w) => {
                if w.is_reached() {
                    Readiness::Ready(Engine::None)
                } else {
                    Readiness::NotReady
                }
            }
            Body::Copy { .. } if !op.after_reached() => Readiness::NotReady,
            Body::Copy { kind, .. } => self.ready_with_engine(op, *kind as usize),
            Body::Fill { .. } => self.ready_with_engine(op, crate::CopyKind::D2D as usize),
            Body::HostWrite { .. } => self.ready_with_engine(op, crate::CopyKind::H2D as usize),
            Body::HostRead { .. } => self.ready_with_engine(op, crate::CopyKind::D2H as usize),
            Body::CopyBatch(b) => self.ready_with_engine(op, b.kind as usize),
            Body::Copy2D(c) => self.ready_with_engine(op, c.kind as usize),
            Body::Kernel { .. } | Body::Graph(_) => {
                if op.try_acquire_access() {
                    Readiness::Ready(Engine::Compute)
                } else {
                    Readiness::NotReady
                }
            }
            Body::Host(_) | Body::Record { .. } => Readiness::Ready(Engine::None),
            Body::Async(a) => self.async_readiness(stream, op, value, a),
        }
    }

    /// Polls the async op at the head of a stream, at timeline `value`
    /// (started by its first poll, its access locks taken then and kept until
    /// it completes). The poll is user code: it runs in the op's frame, so a
    /// blocking call it makes on its own stream is refused (`WouldDeadlock`)
    /// as it is from a callback, not waited on forever.
    pub(super) fn async_readiness(
        &self,
        stream: &HostStream,
        op: &Op,
        value: u64,
        a: &crate::exec::async_op::AsyncBody,
    ) -> Readiness {
        // SAFETY: every caller holds the op's stream's hardware queue (claimed
        // for `try_claim` / `take_done_async`, kept for `start_next_async`).
        let polled = in_frame(stream, value, op, || unsafe {
            a.poll(None, || op.try_acquire_access())
        });
        match polled {
            AsyncPoll::Pending => Readiness::NotReady,
            AsyncPoll::Ready => Readiness::Ready(Engine::Async),
        }
    }

    /// Between the blocks of a kernel: starts or polls the async ops at the
    /// heads of their streams, at most once per `BLOCK_PROGRESS_NS` on this
    /// thread and only while any are queued, and completes those that are
    /// done. This is how a transfer progresses while every engine computes.
    pub(super) fn progress_async(&self) {
        if self.async_queued.load(Ordering::Relaxed) == 0 {
            return;
        }
        let now = crate::exec::clock::now_ns();
        if LAST_PROGRESS.with(|l| now.saturating_sub(l.replace(now)) < BLOCK_PROGRESS_NS) {
            return;
        }
        self.streams.find_map(|stream| {
            let q = &self.queues[stream.queue].state;
            if q.may_claim(!stream.ring.is_empty()).is_err() {
                return None::<()>;
            }
            let Ok((op, value)) = q.claim_with(|| self.take_done_async(stream)) else {
                return None;
            };
            let ran = Ran {
                unit: 0,
                start_ns: 0,
            };
            let result = match &op.body {
                // SAFETY: the queue is held (claimed above, let go below).
                Body::Async(a) => unsafe { a.take_result() },
                _ => Ok(()),
            };
            self.complete(stream, op, value, Engine::Async, result, ran);
            self.queues[stream.queue].state.finish();
            // This thread goes back to its kernel: if the stream has more work,
            // an idle engine should look (a submitter may have skipped the wake
            // while the queue was held).
            self.idle.wake_one_if_idle();
            None
        });
    }

    /// With the stream's queue claimed: polls its head if it is an async op
    /// (starting it on the first poll) and takes it if it is done.
    fn take_done_async(&self, stream: &HostStream) -> Option<(Op, u64)> {
        if stream.timeline.failing() {
            return None;
        }
        // SAFETY: the caller holds the stream's hardware-queue claim, which makes
        // this thread the ring's only consumer.
        let ready = unsafe {
            stream.ring.peek_with(|op, pos| match &op.body {
                Body::Async(a) => {
                    matches!(
                        self.async_readiness(stream, op, pos + 1, a),
                        Readiness::Ready(_)
                    )
                }
                _ => false,
            })
        };
        if ready != Some(true) {
            return None;
        }
        // SAFETY: as above; `peek_with` saw the op.
        let (op, pos) = unsafe { stream.ring.pop() }.expect("peeked op is still there");
        stream.clear_wait_hint();
        Some((op, pos + 1))
    }

    pub(super) fn ready_with_engine(&self, op: &Op, kind: usize) -> Readiness {
        let Some(bit) = self.acquire_copy_engine(kind) else {
            return Readiness::NotReady;
        };
        if op.try_acquire_access() {
            Readiness::Ready(Engine::Copy(kind, bit))
        } else {
            self.release_engine(Engine::Copy(kind, bit));
            Readiness::NotReady
        }
    }

    /// Completes the op at `value` of `stream`, then lets its queue go.
    pub(super) fn finish(
        &self,
        stream: &HostStream,
        op: Op,
        value: u64,
        engine: Engine,
        result: Result<(), String>,
        ran: Ran,
    ) {
        self.complete(stream, op, value, engine, result, ran);
        self.release_queue(stream);
    }

    /// Completes the op at `value` of `stream`, its queue still held; see the
    /// module invariants for order. Inlined: the op is dropped where its caller
    /// holds it, not copied into this frame first.
    #[inline(always)]
    pub(super) fn complete(
        &self,
        stream: &HostStream,
        op: Op,
        value: u64,
        engine: Engine,
        result: Result<(), String>,
        ran: Ran,
    ) {
        if crate::exec::clock::profiling() {
            record(stream, &op, value, engine, ran, result.is_err());
        }
        if let (Some(span), Ok(())) = (op.span(), &result) {
            span.stamp(ran.start_ns, crate::exec::clock::now_ns());
        }
        // Buffer locks are held exactly when an engine was taken (copies, fills, kernels).
        if !matches!(engine, Engine::None) {
            op.release_access(ran.unit);
        }
        self.release_engine(engine);
        if let Body::Async(_) = op.body {
            self.async_queued.fetch_sub(1, Ordering::SeqCst);
        }
        drop(op);
        match result {
            Ok(()) => stream.timeline.complete(value),
            Err(m) => stream.timeline.fail(value, Arc::from(m)),
        }
        // A load and a store, not a `fetch_add`: the locked instruction cost
        // about a tenth of an empty op. Engines completing at once may lose
        // an increment (or briefly move the clock back by one), which only
        // slows aging by a dispatch; the clock still grows with every round
        // of dispatches, so a waiting stream still ages (`effective_priority`
        // saturates when `last_served` is ahead).
        let t = self.tick.load(Ordering::Relaxed) + 1;
        self.tick.store(t, Ordering::Relaxed);
        stream.last_served.store(t, Ordering::Relaxed);
    }

    /// Lets the queue of `stream` go after its op completed.
    pub(super) fn release_queue(&self, stream: &HostStream) {
        // No wake here: this engine looks for work next, and wakes another if it
        // finds more than it can take (`EngineThread::claim`). Until that look it counts
        // as searching, so a submitter that sees the queue idle in this gap does
        // not wake a sleeper for work this engine is about to take.
        self.idle.begin_search_unbounded();
        LOOKING.with(|l| l.set(true));
        // Pairs with the submitter's fence: either it sees the queue idle (and wakes
        // an engine if needed) or our next look for work sees its op.
        self.queues[stream.queue].state.finish();
    }
}

/// How often an engine running kernel blocks polls async ops in flight, ns.
const BLOCK_PROGRESS_NS: u64 = 5_000;

thread_local! {
    /// When this thread last polled async ops between kernel blocks.
    static LAST_PROGRESS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Set by `Shared::finish`: this engine counts as searching until its next look
    /// for work (`EngineThread::run`).
    pub(super) static LOOKING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Who ran an op and when it started; `start_ns` is 0 when profiling is off
/// and the op stamps no span.
#[derive(Clone, Copy)]
pub(super) struct Ran {
    pub(super) unit: u32,
    pub(super) start_ns: u64,
}

/// The copy engine of direction `kind`.
fn copy_engine(kind: crate::CopyKind) -> hetero_trace::EngineKind {
    use hetero_trace::EngineKind as E;
    match kind {
        crate::CopyKind::H2D => E::CopyH2D,
        crate::CopyKind::D2H => E::CopyD2H,
        crate::CopyKind::D2D => E::CopyD2D,
    }
}

pub(super) fn record(
    stream: &HostStream,
    op: &Op,
    value: u64,
    engine: Engine,
    ran: Ran,
    failed: bool,
) {
    use crate::CopyKind as C;
    use hetero_trace::EngineKind as E;
    let copy_index = match engine {
        Engine::Copy(_, bit) => bit,
        _ => 0,
    };
    let (eng, index) = match &op.body {
        Body::Copy { kind, .. } => (copy_engine(*kind), copy_index),
        Body::Fill { .. } => (copy_engine(C::D2D), copy_index),
        Body::HostWrite { .. } => (copy_engine(C::H2D), copy_index),
        Body::HostRead { .. } => (copy_engine(C::D2H), copy_index),
        Body::CopyBatch(b) => (copy_engine(b.kind), copy_index),
        Body::Copy2D(c) => (copy_engine(c.kind), copy_index),
        Body::Kernel { .. } | Body::Graph(_) => (E::Compute, ran.unit),
        Body::Host(_)
        | Body::Wait { .. }
        | Body::WaitAll(_)
        | Body::Record { .. }
        | Body::Async(_) => (E::Host, ran.unit),
    };
    let (kind, dep) = op.trace_kind();
    let end_ns = crate::exec::clock::now_ns();
    hetero_trace::record_op(hetero_trace::OpRecord {
        kind,
        name: op.name(),
        stream: stream.id,
        queue: stream.queue as u32,
        engine: eng,
        engine_index: index,
        seq: value,
        submit_ns: op.submit_ns,
        start_ns: if ran.start_ns == 0 {
            end_ns
        } else {
            ran.start_ns
        },
        end_ns,
        bytes: op.bytes(),
        dep,
        failed,
        node: None,
    });
}
