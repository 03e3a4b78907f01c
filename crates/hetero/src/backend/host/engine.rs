//! Engines.

use super::callback::{in_frame, run_user};
use super::graph::{drive, find_graph_job, start_graph, GraphJob};
use super::hw_queue::Skipped;
use super::kernel_job::{find_job, run_blocks, start_job};
use super::stream::{blocked, wait_hint_of, HostStream, Left};
use super::Shared;
use crate::exec::async_op::AsyncPoll;
use crate::exec::op;
use crate::exec::op::{Body, Op};
use crate::{Block, CompletionMode};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy)]
pub(super) enum Engine {
    None,
    Copy(usize, u32),
    Compute,
    /// An async op, done: its access locks were taken when it started.
    Async,
}

/// Work a engine has claimed (moved, never boxed: claiming must not allocate).
#[allow(clippy::large_enum_variant)]
pub(super) enum Work {
    /// A stream's oldest op, popped with its queue claimed.
    Op {
        stream: Arc<HostStream>,
        taken: Taken,
    },
    /// Blocks of a running multi-block kernel.
    /// (The index of the hardware queue whose job slot holds it.)
    Help(usize),
    /// Ready chains of a running graph launch.
    Graph(Arc<GraphJob>),
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
        if stream.timeline.fault_at().is_some() {
            return Readiness::Skip;
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
        if stream.timeline.fault_at().is_some() {
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

/// The stream whose op this engine just completed has no next op published:
/// waits a moment for one with the queue held (`LINGER_POLLS` looks at the
/// next slot, pauses growing to 8 spin hints, about a microsecond). A
/// submitter that keeps pace with the engine then finds the queue still
/// `RUNNING`, as it does when it runs ahead, rather than a release and a claim
/// per op: each of those writes the queue's state, which every submission
/// reads, and moved its line between the cores at every op (`hetero/submit`
/// with a live consumer took 390 ns instead of 56 in two runs of three once
/// the engine's per-op path got faster than the submitter's).
fn linger(stream: &HostStream) -> bool {
    let mut pauses = 1;
    for _ in 0..LINGER_POLLS {
        for _ in 0..pauses {
            crate::exec::loom::spin_hint();
        }
        if stream.ring.has_next() {
            return true;
        }
        pauses = (pauses * 2).min(8);
    }
    false
}

/// Ops reading less than this from one buffer are not left to its writer.
const AFFINE_BYTES: usize = 64 * 1024;

/// Looks at the next slot while lingering (see `linger`).
const LINGER_POLLS: u32 = 6;

/// While polling a pending async op, one look in this many sees every stream.
const FULL_LOOK_EVERY: u32 = 8;

/// How often an engine running kernel blocks polls async ops in flight, ns.
const BLOCK_PROGRESS_NS: u64 = 5_000;

thread_local! {
    /// When this thread last polled async ops between kernel blocks.
    static LAST_PROGRESS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Set by `Shared::finish`: this engine counts as searching until its next look
    /// for work (`EngineThread::run`).
    pub(super) static LOOKING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Who ran an op and when it started; `start_ns` is 0 when profiling is off.
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
        Body::Host(_) | Body::Wait { .. } | Body::Record { .. } | Body::Async(_) => {
            (E::Host, ran.unit)
        }
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

pub(super) struct EngineThread {
    pub(super) index: u32,
    pub(super) streams: Vec<Arc<HostStream>>,
    pub(super) generation: u64,
    pub(super) candidates: Vec<(i64, u8, u64, usize)>,
    /// The stream of the last op this engine ran.
    pub(super) last_stream: u64,
    /// The last claim left other streams' ready work behind.
    pub(super) more: bool,
    /// The last claim skipped a non-empty stream whose queue another engine was
    /// claiming (its verdict may be stale).
    pub(super) contended: bool,
    /// This run of continued ops has already woken another engine for the ready
    /// work it leaves behind.
    pub(super) woke: bool,
    /// The stream whose oldest op, an async op, was not done at this engine's
    /// last look at it (`search` polls it alone between full looks).
    pub(super) async_head: Option<u64>,
    /// The last look left a ready op to the engine that produced its data
    /// (`defers`): look again rather than park.
    pub(super) deferred: bool,
}

impl EngineThread {
    pub(super) fn new(index: u32) -> Self {
        // Room for the usual number of streams up front: looking for work then
        // allocates nothing even the first time an engine sees them.
        EngineThread {
            index,
            streams: Vec::with_capacity(64),
            generation: u64::MAX,
            candidates: Vec::with_capacity(64),
            last_stream: 0,
            more: false,
            contended: false,
            woke: false,
            async_head: None,
            deferred: false,
        }
    }

    pub(super) fn run(mut self, sh: &Shared) {
        loop {
            let found = self.claim(sh);
            if LOOKING.with(|l| l.replace(false)) {
                sh.idle.end_search();
            }
            if let Some(work) = found {
                self.execute(sh, work);
                continue;
            }
            if sh.shutdown.load(Ordering::SeqCst) && self.all_drained(sh) {
                return;
            }
            let budget = match sh.config.engine_idle {
                CompletionMode::Spin | CompletionMode::Yield => None,
                CompletionMode::Block => Some(Duration::ZERO),
                CompletionMode::Auto { spin } => Some(spin),
            };
            if budget != Some(Duration::ZERO) {
                if let Some(work) = self.search(sh, budget) {
                    self.execute(sh, work);
                    continue;
                }
                if budget.is_none() {
                    continue; // only on shutdown
                }
            }
            self.park(sh);
        }
    }

    /// Polls for work for `budget` (forever if `None`) while counted as searching,
    /// so submitters skip the futex wake. Returns early on shutdown.
    pub(super) fn search(&mut self, sh: &Shared, budget: Option<Duration>) -> Option<Work> {
        // At most half the engines (at least one) poll at a time; the others park.
        // With Spin or Yield idling every engine polls, as configured.
        let max = match budget {
            Some(_) => (sh.config.compute_units as u32 / 2).max(1),
            None => u32::MAX,
        };
        if !sh.idle.try_begin_search(max) {
            return None;
        }
        let mut found = None;
        let mut polls = 0u32;
        let mut poll = || {
            // While a stream's head is an async op that was not done, most
            // polls look at that stream alone; every `FULL_LOOK_EVERY`th is a
            // full look, which also sees other streams' new work.
            polls = polls.wrapping_add(1);
            let full = polls.is_multiple_of(FULL_LOOK_EVERY);
            found = match self.async_head {
                Some(id) if !full => self.claim_stream(sh, id),
                _ => None,
            };
            if found.is_none() && (self.async_head.is_none() || full) {
                found = self.claim(sh);
            }
            found.is_some() || sh.shutdown.load(Ordering::SeqCst)
        };
        // While async ops are queued each poll may be the one that sees a
        // message arrive: keep the pauses between polls short.
        let pauses = if sh.async_queued.load(Ordering::Relaxed) > 0 {
            1
        } else {
            32
        };
        match (budget, sh.config.engine_idle) {
            // A searcher does not park while async ops are queued: their
            // completion wakes nobody, and a parked engine would see it only
            // at its next `async_poll` timeout (a 4 MiB transfer would lose a
            // quarter of its bandwidth). It keeps polling, yielding the core
            // between polls, in rounds of its budget.
            (Some(b), _) => {
                while !crate::exec::park::spin_for_pausing(b, pauses, &mut poll)
                    && sh.async_queued.load(Ordering::Relaxed) > 0
                {}
            }
            (None, CompletionMode::Yield) => {
                while !poll() {
                    std::thread::yield_now();
                }
            }
            (None, _) => {
                while !poll() {
                    crate::exec::loom::spin_hint();
                }
            }
        }
        sh.idle.end_search();
        found
    }

    /// Parks until work can be claimed (or shutdown). The thread counts as a sleeper
    /// only while it looks for work, never while it runs it: submitters and
    /// completers then pay the futex wake only when someone really sleeps.
    pub(super) fn park(&mut self, sh: &Shared) {
        // Async ops in flight complete without waking anyone: park for at most
        // `async_poll` at a time and poll them again (claim looks at them).
        let bound = || (sh.async_queued.load(Ordering::SeqCst) > 0).then_some(sh.config.async_poll);
        // `parked` says "asleep or about to be": set only once a look found
        // nothing and the futex wait comes next, cleared at every look. An
        // engine looking again and again (a contended queue, an op it left to
        // another) is awake, and others may leave ops to it.
        let parked = &sh.parked[self.index as usize];
        let claimed = sh.idle.park_for_polling(
            || loop {
                parked.store(false, Ordering::Relaxed);
                match self.claim(sh) {
                    Some(w) => return Some(Some(w)),
                    // Another engine was looking at a queue we skipped: it may have
                    // judged an op not ready just before the op it waits for completed
                    // (and the completer skipped that queue as held). Look again once
                    // it let go rather than sleep on a stale verdict.
                    None if self.contended || self.deferred => crate::exec::loom::spin_hint(),
                    None => {
                        parked.store(true, Ordering::Relaxed);
                        return sh.shutdown.load(Ordering::SeqCst).then_some(None);
                    }
                }
            },
            bound,
        );
        parked.store(false, Ordering::Relaxed);
        if let Some(work) = claimed {
            self.execute(sh, work);
        }
    }

    /// After claiming: if more work is ready than this thread takes, make sure
    /// another engine looks at it.
    pub(super) fn chain_wake(&self, sh: &Shared, more: bool) {
        if more {
            sh.idle.wake_one_if_idle();
        }
    }

    pub(super) fn all_drained(&mut self, sh: &Shared) -> bool {
        self.refresh(sh);
        self.streams.iter().all(|s| s.ring.is_empty())
            && sh.job_count.load(Ordering::SeqCst) == 0
            && sh.graph_count.load(Ordering::SeqCst) == 0
    }

    pub(super) fn refresh(&mut self, sh: &Shared) {
        sh.streams.refresh(&mut self.streams, &mut self.generation);
    }

    /// Finds and takes one unit of work: blocks of a running kernel, or the oldest op
    /// of the most urgent ready stream (its queue stays claimed until it completes).
    pub(super) fn claim(&mut self, sh: &Shared) -> Option<Work> {
        if sh.job_count.load(Ordering::Acquire) > 0 {
            if let Some(slot) = find_job(sh) {
                return Some(Work::Help(slot));
            }
        }
        if sh.graph_count.load(Ordering::Acquire) > 0 {
            if let Some(job) = find_graph_job(sh) {
                return Some(Work::Graph(job));
            }
        }
        self.refresh(sh);
        self.contended = false;
        self.deferred = false;
        let tick = sh.tick.load(Ordering::Relaxed);
        self.candidates.clear();
        for (i, s) in self.streams.iter().enumerate() {
            // The queue flag first: it changes once per op, while the ring's tail
            // changes at every submission (reading it costs the submitter a miss).
            if let Err(why) = sh.queues[s.queue].state.may_claim(!s.ring.is_empty()) {
                self.contended |= why == Skipped::Contended;
                continue;
            }
            let hint = s.wait_hint.load(Ordering::Acquire);
            if hint != 0 && blocked(&self.streams, hint) {
                continue;
            }
            let left = s.left(self.index);
            if left == Left::ToOther {
                self.deferred = true;
                continue;
            }
            let served = s.last_served.load(Ordering::Relaxed);
            // Within a priority level, first an op another engine left to this
            // one (it reads what this engine wrote: `defers`), then the stream
            // this engine just ran: its next op is often ready at once (a chain
            // of dependent ops on the critical path), and continuing costs no
            // wake-up anywhere.
            let affinity = if left == Left::ForMe {
                0
            } else {
                1 + u8::from(s.id != self.last_stream)
            };
            self.candidates
                .push((s.effective_priority(tick), affinity, served, i));
        }
        if self.candidates.is_empty() {
            return None;
        }
        self.candidates.sort_unstable();
        for k in 0..self.candidates.len() {
            let stream = self.streams[self.candidates[k].3].clone();
            match sh.queues[stream.queue]
                .state
                .claim_with(|| self.try_claim(sh, &stream))
            {
                Ok(taken) => {
                    self.more = k + 1 < self.candidates.len();
                    return Some(Work::Op { stream, taken });
                }
                Err(why) => self.contended |= why == Skipped::Contended,
            }
        }
        None
    }

    /// A look at one stream only (the one whose async head was not done at the
    /// last look): its oldest op if it is ready now. A message's arrival is
    /// then seen within a poll of that op, not a poll of every stream; the
    /// stream is forgotten once its head is no longer a pending async op.
    fn claim_stream(&mut self, sh: &Shared, id: u64) -> Option<Work> {
        self.async_head = None;
        let stream = self.streams.iter().find(|s| s.id == id)?.clone();
        let taken = sh.queues[stream.queue]
            .state
            .claim_with(|| self.try_claim(sh, &stream))
            .ok()?;
        // Work was taken; whether other streams have any is unknown here:
        // let the next look be a full one.
        self.more = false;
        Some(Work::Op { stream, taken })
    }

    /// With the stream's queue claimed: takes its oldest op if it is ready.
    pub(super) fn try_claim(&mut self, sh: &Shared, stream: &HostStream) -> Option<Taken> {
        // SAFETY: the caller holds the stream's hardware-queue claim, which makes this
        // thread the ring's only consumer.
        let decision = unsafe {
            stream.ring.peek_with(|op, pos| {
                if self.defers(sh, stream, op) {
                    return (Readiness::Deferred, None);
                }
                let ready = sh.readiness(stream, op, pos + 1);
                if matches!(ready, Readiness::NotReady) && matches!(op.body, Body::Async(_)) {
                    self.async_head = Some(stream.id);
                }
                (ready, wait_hint_of(op))
            })
        };
        let engine = match decision {
            None => return None,
            Some((Readiness::NotReady, hint)) => {
                // Tell other engines what the head waits for, so they skip this
                // stream without claiming its queue until that point is reached.
                if let Some(h) = hint {
                    stream.wait_hint.store(h, Ordering::Release);
                }
                return None;
            }
            Some((Readiness::Deferred, _)) => {
                self.deferred = true;
                return None;
            }
            Some((Readiness::Skip, _)) => None,
            Some((Readiness::Ready(e), _)) => Some(e),
        };
        // The op stays at the head; the queue's holder takes it (`execute`).
        stream.clear_wait_hint();
        stream.clear_left();
        Some(Taken {
            value: stream.ring.head() + 1,
            engine,
        })
    }

    /// With `stream`'s queue held: whether to leave its head `op` to the
    /// engine that last wrote the data it reads (`Op::writer`), whose cache
    /// holds that data, for `DeviceConfig::placement_wait` from the first time
    /// it was left. The writer takes such an op before any other of its
    /// priority (`claim`) and stops continuing its own stream for it
    /// (`continue_on`). Only ops reading at least `AFFINE_BYTES` from one
    /// buffer are left, and only to a writer that is not asleep in `park`: a
    /// sleeping writer would take a wake-up to come back, while a busy or
    /// searching one looks for work within an op. An engine that left an op
    /// does not park (`deferred`), so the op runs by the deadline at the
    /// latest.
    fn defers(&self, sh: &Shared, stream: &HostStream, op: &Op) -> bool {
        let writer = op.writer(AFFINE_BYTES);
        if sh.placement_wait_ns == 0
            || writer == 0
            || writer == self.index + 1
            || sh
                .parked
                .get(writer as usize - 1)
                .is_none_or(|parked| parked.load(Ordering::Relaxed))
        {
            return false;
        }
        let now = crate::exec::clock::now_ns();
        match stream.defer_until.load(Ordering::Relaxed) {
            0 => {
                stream.defer_unit.store(writer, Ordering::Relaxed);
                stream
                    .defer_until
                    .store(now + sh.placement_wait_ns, Ordering::Relaxed);
                true
            }
            until => now < until,
        }
    }

    /// With `stream`'s queue still held after completing its op: takes the stream's
    /// next op if it is ready and the dispatch rule would pick the stream again
    /// anyway (no other stream's effective priority is better; ties go to the stream
    /// just run). Continuing this way keeps the queue `RUNNING`, so the op costs no
    /// claim, no release and no search-token traffic, and submitters keep reading
    /// an unchanged queue state.
    fn continue_on(&mut self, sh: &Shared, stream: &HostStream) -> Option<Taken> {
        // Whether a next op is there shows in its slot: reading the ring's tail,
        // which every submission writes, would cost a miss per op here.
        if !stream.ring.has_next() && !linger(stream) {
            return None;
        }
        self.refresh(sh);
        let tick = sh.tick.load(Ordering::Relaxed);
        let mine = stream.effective_priority(tick);
        let mut others = false;
        for s in &self.streams {
            if s.id == stream.id || s.ring.is_empty() {
                continue;
            }
            // A stream on the held queue could run if the queue were let go.
            if s.queue != stream.queue && sh.queues[s.queue].state.may_claim(true).is_err() {
                continue;
            }
            let hint = s.wait_hint.load(Ordering::Acquire);
            if hint != 0 && blocked(&self.streams, hint) {
                continue;
            }
            // Another engine left this stream's op to this one: take it now.
            if s.left(self.index) == Left::ForMe {
                return None;
            }
            if s.effective_priority(tick) < mine {
                return None;
            }
            others |= s.queue != stream.queue;
        }
        let taken = self.try_claim(sh, stream)?;
        // Ready work elsewhere that this engine leaves for now: another engine
        // should look (once per run of continued ops).
        if others && !std::mem::replace(&mut self.woke, true) {
            sh.idle.wake_one_if_idle();
        }
        Some(taken)
    }

    pub(super) fn execute(&mut self, sh: &Shared, work: Work) {
        let more = std::mem::take(&mut self.more);
        self.chain_wake(sh, more);
        let (stream, taken) = match work {
            Work::Help(slot) => return run_blocks(sh, &sh.jobs[slot]),
            Work::Graph(job) => return drive(sh, &job, self.index),
            Work::Op { stream, taken } => (stream, taken),
        };
        let stream = &stream;
        self.last_stream = stream.id;
        self.woke = false;
        let mut next = Some(taken);
        while let Some(Taken { value, engine }) = next.take() {
            // SAFETY: this engine holds the stream's queue (claimed in `claim`, kept
            // by `continue_on`), so it is the ring's only consumer, and `try_claim`
            // saw this op published at the head.
            let op = unsafe { stream.ring.take_head() };
            if !self.run_op(sh, stream, op, value, engine) {
                // A multi-block kernel: its last block completes it and lets the
                // queue go.
                return;
            }
            next = self.continue_on(sh, stream);
        }
        sh.release_queue(stream);
    }

    /// After an async op of `stream` finished (its queue held, the op taken
    /// but not yet retired): starts the stream's next op if it is an async op,
    /// before this one's bookkeeping (access locks, drop, timeline). A chain of
    /// remote copies, as in a ping-pong, then issues its next MPI call one
    /// retirement earlier: the retirement (a free and several atomics) leaves
    /// each message's round trip. The next op sees everything before it
    /// finished; only the publication of the last one's end follows its start.
    /// If its access locks conflict with the finished op's, it is not started
    /// here, and starts at its usual poll after the retirement.
    fn start_next_async(&self, sh: &Shared, stream: &HostStream) {
        if !stream.ring.has_next() {
            return;
        }
        // SAFETY: the caller holds the stream's queue, which makes this thread the
        // ring's only consumer.
        unsafe {
            stream.ring.peek_with(|op, pos| {
                if let Body::Async(a) = &op.body {
                    if stream.timeline.fault_at().is_none() {
                        let _ = sh.async_readiness(stream, op, pos + 1, a);
                    }
                }
            });
        }
    }

    /// Runs one op of `stream` (the queue held) and completes it on the timeline;
    /// false when it became a multi-block kernel job, which completes later.
    /// Inlined into `execute`'s loop, so the op is never copied again after it
    /// left the ring.
    #[inline(always)]
    fn run_op(
        &mut self,
        sh: &Shared,
        stream: &Arc<HostStream>,
        mut op: Op,
        value: u64,
        engine: Option<Engine>,
    ) -> bool {
        let start_ns = if crate::exec::clock::profiling() {
            crate::exec::clock::now_ns()
        } else {
            0
        };
        let ran = Ran {
            unit: self.index,
            start_ns,
        };
        let Some(engine) = engine else {
            sh.complete(stream, op, value, Engine::None, Err(String::new()), ran);
            return true;
        };
        if let Body::Kernel { blocks, .. } = op.body {
            if blocks > 1 {
                start_job(sh, stream, op, value, blocks, ran);
                return false;
            }
        }
        if let Body::Graph(_) = op.body {
            start_graph(sh, stream, op, value, ran);
            return false;
        }
        let callback = match &mut op.body {
            Body::Host(f) => Some(f.take()),
            _ => None,
        };
        let result = match (&op.body, callback) {
            (_, Some(Some(f))) => run_user(stream, value, &op, || "host callback".into(), f),
            (_, Some(None)) | (Body::Host(_), None) => Ok(()),
            (
                Body::Copy { .. }
                | Body::Fill { .. }
                | Body::HostWrite { .. }
                | Body::HostRead { .. }
                | Body::CopyBatch(_)
                | Body::Copy2D(_),
                _,
            ) => {
                op::run_transfer(&op.body);
                Ok(())
            }
            (
                Body::Wait {
                    timeline,
                    value: v,
                    fault,
                },
                _,
            ) => match timeline.error_for(*v).filter(|_| *fault) {
                Some(e) => Err(format!(
                    "waited on an event of stream {}, which failed: {e}",
                    timeline.stream
                )),
                None => Ok(()),
            },
            (Body::Graph(_), _) => unreachable!("graph launches run as jobs"),
            (Body::Async(a), _) => {
                // SAFETY: this engine holds the stream's queue.
                let result = unsafe { a.take_result() };
                if result.is_ok() {
                    self.start_next_async(sh, stream);
                }
                result
            }
            (Body::Record { stamp }, _) => {
                stamp.store(crate::exec::clock::now_ns(), Ordering::Release);
                Ok(())
            }
            (Body::Kernel { kernel, args, .. }, _) => {
                let (name, f) = (kernel.name, &kernel.f);
                let mut block = Block::new(0, 1, args);
                run_user(
                    stream,
                    value,
                    &op,
                    || format!("kernel '{name}' in block 0"),
                    || f(&mut block),
                )
            }
        };
        sh.complete(stream, op, value, engine, result, ran);
        true
    }
}
