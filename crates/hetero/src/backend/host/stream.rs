//! The host backend's stream.
use super::hw_queue::QueueState;
use super::Shared;
use crate::backend::BackendStream;
use crate::exec::op::{Body, KernelRef, Op};
use crate::exec::park::Parker;
use crate::exec::ring::Ring;
use crate::exec::timeline::Timeline;
use crate::CompletionMode;
use crate::{Error, Result};
use crossbeam_utils::CachePadded;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicU8;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// Dispatches a waiting stream sits through before its priority improves a level.
/// A priority-7 stream facing continuous priority-0 work runs after (7 + 1) × this.
pub(super) const AGING_TICKS: u64 = 16;

/// What a ring slot keeps for the kernel ops pushed into it: the kernel they
/// borrow (`HostStream::submit_launch`).
pub(super) type KernelKeep = Option<Arc<crate::exec::kernel::KernelInner>>;

pub(crate) struct HostStream {
    pub(super) id: u64,
    pub(super) timeline: Arc<Timeline>,
    pub(super) ring: Ring<Op, KernelKeep>,
    pub(super) priority: AtomicU8,
    pub(super) queue: usize,
    pub(super) closed: AtomicBool,
    /// What the oldest op waits for, packed by `wait_hint_of` (0: unknown). Set and
    /// cleared only by the engine holding the queue; a hint to skip the stream
    /// without claiming the queue (claiming a stream that cannot run, again and
    /// again, holds the queue: an engine preempted there stalls it for a time slice).
    pub(super) wait_hint: AtomicU64,
    /// The oldest op is being left to the engine that wrote its data: that
    /// engine (unit + 1) and until when (ns; 0: not being left). Written only by
    /// the engine holding the queue (`EngineThread::defers`), read by all as a
    /// hint; beside `wait_hint`, which every look for work reads too.
    pub(super) defer_until: AtomicU64,
    pub(super) defer_unit: AtomicU32,
    /// What the op running user code (a callback) on this stream waits for, packed
    /// like `wait_hint` (0: nothing), and that op's value: hints for other
    /// engines' deadlock checks (`callback.rs`).
    pub(super) blocked_on: AtomicU64,
    pub(super) blocked_at: AtomicU64,
    /// The hardware queue's in-flight flag.
    pub(super) queue_state: Arc<QueueState>,
    /// Written by engines at every completion: on its own line, away from the
    /// fields submitters read.
    pub(super) last_served: CachePadded<AtomicU64>,
    pub(super) idle: Arc<Parker>,
    pub(super) shared: Weak<Shared>,
    pub(super) host_wait: CompletionMode,
}

impl BackendStream for HostStream {
    fn id(&self) -> u64 {
        self.id
    }

    fn timeline(&self) -> &Arc<Timeline> {
        &self.timeline
    }

    #[inline]
    fn submit(&self, op: Op) -> Result<u64> {
        self.check_open()?;
        // Counted before it is visible, so that its completion never sees the
        // count at zero (engines poll async ops while the count is not zero).
        let is_async = matches!(op.body, Body::Async(_));
        if is_async {
            self.count_async(true);
        }
        let r = self.push(op, |_, _, _| {});
        if is_async && r.is_err() {
            self.count_async(false);
        }
        r
    }

    /// A launch whose op borrows its kernel from the ring slot it goes into,
    /// so that no count changes per launch (two atomic read-modify-writes on a
    /// line the submitter and the engine would pass back and forth: about a
    /// fifth of an empty op). See [`HostStream::settle_kernel`].
    #[inline]
    fn submit_launch(
        &self,
        kernel: &Arc<crate::exec::kernel::KernelInner>,
        blocks: u32,
        args: crate::exec::kernel::ArgList,
        span: Option<Arc<crate::exec::op::Span>>,
    ) -> Result<u64> {
        self.check_open()?;
        let op = Op::new(Body::Kernel {
            // SAFETY: `kernel` lives for this call, and before the op can leave
            // it, `settle_kernel` (run once the op has its slot) either keeps
            // an `Arc` of the kernel in that slot until the op has completed or
            // makes the reference counted. An op that never gets a slot is
            // dropped within this call.
            kernel: unsafe { KernelRef::lent(kernel) },
            blocks,
            args,
            span,
        });
        self.push(op, |op: &mut Op, keep: &mut KernelKeep, pos: u64| {
            self.settle_kernel(op, keep, pos, kernel)
        })
    }

    fn prefetch_submit(&self, n: u64) {
        self.ring.prefetch(n);
    }

    fn prefetch_stream(&self) {
        self.ring.prefetch_header();
        crate::exec::ring::prefetch((&raw const self.closed).cast(), 1);
    }

    fn waits_all(&self) -> bool {
        true
    }

    fn copies_wait(&self) -> bool {
        true
    }

    fn submitted(&self) -> u64 {
        self.ring.tail()
    }

    fn priority(&self) -> u8 {
        self.priority.load(Ordering::Relaxed)
    }

    fn set_priority(&self, priority: u8) {
        self.priority.store(priority, Ordering::Relaxed);
    }

    fn hardware_queue(&self) -> usize {
        self.queue
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    fn release(&self) {
        let _ = self.timeline.wait(self.submitted(), self.host_wait);
        if self.timeline.completed() >= self.submitted() {
            // SAFETY: the last handle is gone, so nothing can push any more
            // (every submission goes through a handle), and every op that
            // could borrow a kept kernel has completed (Acquire, after the
            // engines' last use). The kernels go now, not when the last engine
            // drops its list of streams.
            unsafe { self.ring.clear_keeps() };
        }
        if let Some(sh) = self.shared.upgrade() {
            sh.streams.remove(|s| s.id == self.id);
            sh.queues[self.queue]
                .streams
                .fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl HostStream {
    /// Forgets what the oldest op waited for (it is taken). Stores only when a
    /// hint is set: `wait_hint` shares a line with fields every submission
    /// reads (`closed`, the queue's state), and a store per op would take that
    /// line from the submitter at each op.
    #[inline]
    pub(super) fn clear_wait_hint(&self) {
        if self.wait_hint.load(Ordering::Relaxed) != 0 {
            self.wait_hint.store(0, Ordering::Relaxed);
        }
    }

    /// The oldest op was taken: it is no longer left to anyone (a store only
    /// when it was, as `clear_wait_hint`).
    pub(super) fn clear_left(&self) {
        if self.defer_until.load(Ordering::Relaxed) != 0 {
            self.defer_until.store(0, Ordering::Relaxed);
        }
    }

    /// Whether the stream's oldest op is being left to an engine, as seen by
    /// engine `unit` (a hint, read without the queue).
    #[inline]
    pub(super) fn left(&self, unit: u32) -> Left {
        let until = self.defer_until.load(Ordering::Relaxed);
        if until == 0 {
            Left::No
        } else if self.defer_unit.load(Ordering::Relaxed) == unit + 1 {
            Left::ForMe
        } else if crate::exec::clock::now_ns() < until {
            Left::ToOther
        } else {
            Left::No
        }
    }

    /// One more (or one fewer) async op queued on the device.
    fn count_async(&self, more: bool) {
        if let Some(sh) = self.shared.upgrade() {
            if more {
                sh.async_queued.fetch_add(1, Ordering::SeqCst);
            } else {
                sh.async_queued.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// After the op at ring position `pos` is published: wakes an engine if none
    /// is bound to look; returns the op's timeline value.
    #[inline(always)]
    pub(super) fn published(&self, pos: u64) -> u64 {
        // While an op of this queue is in flight, the engine running it looks for
        // work when it completes and will see this op: waking another engine, a
        // syscall that costs tens of µs in a VM, would buy nothing (hw_queue.rs).
        if self.queue_state.submitter_must_wake() {
            self.idle.wake_one_if_idle_fenced();
        }
        pos + 1
    }

    #[inline]
    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(Error::StreamDestroyed { stream: self.id });
        }
        Ok(())
    }

    /// Pushes `op` (`settle` seeing it once it has its slot, see
    /// `Ring::try_push_with`) and returns its timeline value. The first try
    /// moves `op` straight into the ring (no copy kept for a retry); a full
    /// ring hands it back to the slow path.
    #[inline(always)]
    fn push(&self, op: Op, mut settle: impl FnMut(&mut Op, &mut KernelKeep, u64)) -> Result<u64> {
        match self.ring.try_push_with(op, &mut settle) {
            Ok(pos) => Ok(self.published(pos)),
            Err(back) => self.submit_when_full(back, settle),
        }
    }

    /// Backpressure: waits until the ring has room (`wait_for_room`), then tries
    /// again (with the same `settle` as the first try).
    #[cold]
    pub(super) fn submit_when_full(
        &self,
        mut op: Op,
        mut settle: impl FnMut(&mut Op, &mut KernelKeep, u64),
    ) -> Result<u64> {
        loop {
            self.idle.wake_one_if_idle();
            super::super::wait_for_room(&self.ring, &self.timeline, self.host_wait)?;
            match self.ring.try_push_with(op, &mut settle) {
                Ok(pos) => return Ok(self.published(pos)),
                Err(back) => op = back,
            }
        }
    }

    /// Decides, once a launch won ring position `pos`, how its op holds
    /// `kernel` (the op's reference is a loan valid for the launch call only):
    /// - the slot keeps this kernel already: the loan stands;
    /// - the slot keeps nothing, or a kernel whose last borrower has completed:
    ///   the slot now keeps `kernel` (one count), and the loan stands;
    /// - otherwise the op gets a counted reference of its own.
    ///
    /// Why a kept kernel outlives every op that borrows it: the ops of a slot
    /// are the positions `pos`, `pos − capacity`, … (each one's producer
    /// being the only user of the keep cell, ring.rs), the newest before `pos`
    /// is `pos − capacity`, and a stream's ops complete in order; so once that
    /// op has completed (its value `pos − capacity + 1` reached, read with
    /// Acquire after the engine's Release) no op borrows the old kernel, and
    /// the engine's last use of it happened before. A slot's kernel stays until
    /// another kernel takes its place or the stream is dropped (with its ring,
    /// after its work completed): a stream keeps at most one kernel per slot.
    #[inline]
    fn settle_kernel(
        &self,
        op: &mut Op,
        keep: &mut KernelKeep,
        pos: u64,
        kernel: &Arc<crate::exec::kernel::KernelInner>,
    ) {
        let Body::Kernel { kernel: held, .. } = &mut op.body else {
            return;
        };
        match keep {
            Some(k) if Arc::ptr_eq(k, kernel) => {}
            Some(_) => {
                let cap = self.ring.capacity();
                if pos >= cap && self.timeline.completed() > pos - cap {
                    *keep = Some(kernel.clone());
                } else {
                    *held = KernelRef::owned(kernel.clone());
                }
            }
            None => *keep = Some(kernel.clone()),
        }
    }

    /// Base priority minus one level per `AGING_TICKS` dispatches waited. It may go
    /// below 0, so a starving stream eventually beats even priority-0 work that a
    /// engine would otherwise keep running (ties go to the stream just run).
    pub(super) fn effective_priority(&self, tick: u64) -> i64 {
        let base = i64::from(self.priority.load(Ordering::Relaxed));
        let waited = tick.saturating_sub(self.last_served.load(Ordering::Relaxed)) / AGING_TICKS;
        base - waited.min(1 << 20) as i64
    }
}

const HINT_VALUE_BITS: u32 = 44;

/// `(stream, value)` packed in one word (so it is read untorn), or `None` when the
/// numbers do not fit (or the stream is 0, which means "no hint").
pub(super) fn pack_hint(stream: u64, value: u64) -> Option<u64> {
    (stream != 0 && stream < (1 << (64 - HINT_VALUE_BITS)) && value < (1 << HINT_VALUE_BITS))
        .then_some(stream << HINT_VALUE_BITS | value)
}

pub(super) fn unpack_hint(hint: u64) -> (u64, u64) {
    (hint >> HINT_VALUE_BITS, hint & ((1 << HINT_VALUE_BITS) - 1))
}

/// What a wait op (or a copy's folded wait) waits for, packed, or `None`
/// when the op is not a wait on a stream of `device` (hints name streams of
/// their own device only: a wait on another device of a context gives none).
pub(super) fn wait_hint_of(op: &Op, device: u64) -> Option<u64> {
    match &op.body {
        Body::Wait {
            timeline, value, ..
        } if timeline.device == device => pack_hint(timeline.stream, *value),
        // A copy's folded memory wait (reached: no hint holds it back).
        Body::Copy { after: Some(p), .. } if p.timeline.device == device => {
            pack_hint(p.timeline.stream, p.value)
        }
        // The first point not reached: the next look finds the one after.
        Body::WaitAll(w) => w
            .pending()
            .filter(|p| p.timeline.device == device)
            .and_then(|p| pack_hint(p.timeline.stream, p.value)),
        _ => None,
    }
}

/// Whether a stream's oldest op is being left to an engine (`EngineThread::defers`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Left {
    No,
    /// To the engine asking.
    ForMe,
    /// To another engine, and its time to wait has not run out.
    ToOther,
}

/// Whether the point a hint names is still ahead (a stream not in `streams` is
/// treated as reached: claim and look).
pub(super) fn blocked(streams: &[Arc<HostStream>], hint: u64) -> bool {
    let (id, value) = unpack_hint(hint);
    streams
        .iter()
        .find(|s| s.id == id)
        .is_some_and(|s| !s.timeline.is_reached(value))
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::exec::loom::Arc;

    /// A producer pushes three values into a two-slot ring, waiting for room
    /// (parked, Block mode) when it is full, while the consumer pops and completes
    /// each. However the consumer races ahead (it may drain the ring between the
    /// failed push and the wait), the producer is woken and all values arrive.
    /// Waiting for "the oldest op + 1" instead deadlocks this model.
    #[test]
    fn loom_backpressure_never_waits_for_an_op_not_submitted() {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(|| {
            let ring = Arc::new(Ring::<u32>::with_capacity(2));
            let timeline = Arc::new(Timeline::new(0, 1, CompletionMode::Block));
            let (r, t) = (ring.clone(), timeline.clone());
            let consumer = loom::thread::spawn(move || {
                let mut got = Vec::new();
                while got.len() < 3 {
                    // SAFETY: this thread is the ring's only consumer.
                    match unsafe { r.pop() } {
                        Some((v, pos)) => {
                            got.push(v);
                            t.complete(pos + 1);
                        }
                        None => loom::thread::yield_now(),
                    }
                }
                got
            });
            for v in 0..3u32 {
                let mut v = v;
                loop {
                    match ring.try_push(v) {
                        Ok(_) => break,
                        Err(back) => {
                            v = back;
                            crate::backend::wait_for_room(&ring, &timeline, CompletionMode::Block)
                                .expect("not an engine thread");
                        }
                    }
                }
            }
            assert_eq!(consumer.join().expect("consumer"), vec![0, 1, 2]);
        });
    }
}
