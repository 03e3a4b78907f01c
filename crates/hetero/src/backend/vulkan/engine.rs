//! The Vulkan device's engine thread: takes ops from the streams' rings,
//! records them into one command buffer per flush, submits it, and completes
//! the ops when the device has run them.
//!
//! One thread owns everything here (`Engine`): the flights in submission
//! order, the pipelines, and the streams' engine-side fields. Streams only push.
//!
//! Steady state allocates nothing: the command buffer of a flush is one the
//! engine submitted before, recorded again once its submission completed
//! (`spares`, `rec_or_new`), and the lists of flights and batches are emptied
//! and kept (`spare_ops`, `spare_segments`).
//!
//! Lanes: kernels and graphs run on the compute lane; copies, fills and
//! host reads and writes on the transfer lane when the device has one of
//! its own (a copy engine's queue, or `split_lanes`), else on the compute
//! lane too. On one lane a recorded op waits for everything recorded on it
//! before (a full barrier between ops, and queue order between
//! submissions), so a wait on an event of another stream costs nothing on
//! the device once that stream's op is recorded on the same lane.
//!
//! Across lanes, ordering is by batches: a flush records into numbered
//! batches (the number is global and only grows), each batch one submission
//! per lane that has work in it, signalling that lane's timeline
//! (`Shared::lanes`) with the batch's number. Each stream knows, per lane,
//! the last batch its later ops must follow (`VulkanStream::deps`: its own
//! ops and those of the events it waited on). An op for lane L that must
//! follow batch b of the other lane goes in a later batch than b (the open
//! batch is closed when b is the open one), and its batch's submission on L
//! waits for the other lane's timeline to reach b: a semaphore wait in the
//! submission, only where a stream crosses lanes. Waits only point to lower
//! batches, so they never form a cycle.
//!
//! Completion: the ops of a flush complete in recorded order, each once its
//! lane's timeline reached its batch (an op with no device work once those
//! before it did), and flushes in order: each stream's timeline completes in
//! value order. A host callback is taken when
//! its stream has nothing in flight and ends the look: what the look took is
//! submitted, then the callback runs on this thread between looks
//! (`callback.rs`: a wait inside it makes looks itself, its own stream
//! takes nothing until it returns), and the next op is chosen by the
//! streams' priorities as they are then, not as they were before it ran. An async op starts when its stream and
//! the device have nothing in flight (it reaches its buffers' bytes
//! directly) and its buffers' access locks are free; it takes them, is
//! polled at each look until it is done, and gives them back when it
//! completes. Meanwhile other streams go on: an op is recorded only while
//! nobody holds a lock it conflicts with (an async op's, or the host's in a
//! synchronous access). Recorded ops hold no locks (the barrier between ops
//! orders them among themselves), so a host access that starts after an op
//! of another stream was recorded is not ordered against it: order them by
//! an event, as on every backend.

use super::complete::{complete, Stamps};
use super::record::rec_or_new;
use super::{Shared, VulkanStream};
use crate::exec::kernel::DeviceCode;
use crate::exec::op::{Body, Op};
use hetero_vulkan::{CommandBuffer, Lane, Pipeline, Recorder};
use smallvec::SmallVec;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Ops one pass of a flush takes from one stream at most (so a long stream
/// does not hold back the others' first submission).
const TAKE_PER_STREAM: usize = 256;

/// How long an engine whose completion mode is `Spin` or `Yield` polls the
/// device before it looks at its streams again.
const SPIN_ROUND: Duration = Duration::from_millis(20);

/// Ops taken from other streams per level a waiting stream's priority
/// improves (the host scheduler's figure, `backend/host/stream.rs`).
const AGING_TICKS: u64 = 16;

/// Passes over the streams in one flush at most.
const PASSES: usize = 8;

/// How long a look made inside a host callback's wait parks at most when
/// there is nothing to do (what it waits for may come from another thread).
const NESTED_PARK: Duration = Duration::from_millis(1);

/// What one look of the engine did.
pub(super) enum Step {
    /// It took work or waited for the device: look again.
    Again,
    /// Nothing was ready and nothing is in flight; it parked a while.
    Idle,
    /// A host callback is ready: the caller runs it (with the engine free,
    /// so a wait inside it can make more looks: `callback.rs`).
    Callback(Box<Taken>),
    /// The device is dropped and every stream is empty.
    Shutdown,
}

/// What an op needs when the device has run it.
pub(super) enum After {
    Nothing,
    /// Keep these bytes until the op completes (staging buffers the device reads).
    Keep(#[allow(dead_code)] Vec<hetero_memory::PinnedAllocation>),
    /// The same, shared with a recorded graph that reads them at every launch.
    KeepShared(#[allow(dead_code)] Vec<Arc<Vec<hetero_memory::PinnedAllocation>>>),
    /// Copy the staging buffer into the host read's output.
    ReadBack {
        staging: hetero_memory::PinnedAllocation,
        out: Arc<Mutex<Vec<u8>>>,
    },
    /// A record: stamp it with the time it completed.
    Stamp,
}

/// An op taken from its stream, completed with its flight.
pub(super) struct Taken {
    pub(super) stream: Arc<VulkanStream>,
    pub(super) value: u64,
    pub(super) op: Op,
    pub(super) result: Result<(), String>,
    pub(super) after: After,
    pub(super) times: Times,
    /// The lane and batch its device work is in (batch 0: none).
    pub(super) at: (usize, u64),
}

/// The timestamp queries an op's commands write (see `Engine::stamp`).
#[derive(Default)]
pub(super) struct Times {
    /// Queries it holds, released when it completes (flights complete in the
    /// order their queries were taken).
    pub(super) held: u32,
    /// Its start and end, while profiling.
    pub(super) span: Option<(u32, u32)>,
    /// A record's point.
    pub(super) stamp: Option<u32>,
    /// A graph launch's nodes (node, start, end), while profiling.
    pub(super) nodes: Vec<(u32, u32, u32)>,
}

/// One flush: its ops in recorded order, each with the (lane, batch) its
/// device work is in (batch 0: none), completed from the front.
struct Flight {
    ops: VecDeque<Taken>,
}

/// A batch closed and not yet submitted: per lane, its command buffers and
/// the other lane's batch it waits for (0: none).
struct Closed {
    batch: u64,
    lanes: [(Segments, u64); 2],
}

/// A lane's command buffers in a batch, each with whether this engine
/// recorded it (and recycles it once submitted) or it is a recorded
/// graph's, which keeps it.
type Segments = Vec<(CommandBuffer, bool)>;

/// Submitted command buffers kept per lane for recording again
/// (`rec_or_new`), at most this many (the device running further ahead
/// than that makes new ones).
const SPARES: usize = 64;

pub(super) struct Engine {
    streams: Vec<Arc<VulkanStream>>,
    seen: u64,
    flights: VecDeque<Flight>,
    /// The open batch: what is recorded now goes in it.
    batch: u64,
    /// Per lane: command buffers of the open batch finished before the
    /// lane's open recorder (a recorded graph's between them), and the other
    /// lane's batch the open batch must wait for.
    segments: [Segments; 2],
    waits: [u64; 2],
    /// Batches of this flush closed before the open one.
    closed: Vec<Closed>,
    /// Per lane: the batch it has completed, as last read.
    done: [u64; 2],
    /// Per lane: the last batch closed with work on it (what a wait for the
    /// lane may name: a batch without work there signals nothing).
    signalled: [u64; 2],
    /// Compiled pipelines by device code, bindings and whether it is the
    /// graph variant (scalars from memory, `Pipeline::graph_variant`).
    pub(super) pipelines: HashMap<(usize, u32, bool), (Arc<DeviceCode>, Pipeline)>,
    /// An async op is pending: look again soon.
    polling: bool,
    /// The streams whose oldest op is an async op that has started (it holds
    /// its buffers' access locks until it completes).
    started: Vec<u64>,
    /// A host callback was taken in this look: take nothing more, submit
    /// what was taken and run it.
    rescan: bool,
    /// The host callback taken in this look (its stream's `in_callback` is
    /// set until it completes).
    callback: Option<Box<Taken>>,
    /// The doorbell's value this engine knows it reached or will reach.
    doorbell: u64,
    /// Timestamp queries taken and given back so far (a ring over the pool).
    queries_taken: u64,
    queries_freed: u64,
    /// Graphs recorded once, resubmitted while they stay the same.
    pub(super) graphs: super::graph::Recorded,
    /// Per lane: command buffers this engine recorded and submitted, oldest
    /// first, recorded into again once their submissions complete.
    pub(super) spares: [VecDeque<CommandBuffer>; 2],
    /// Emptied lists, reused: the ops of a flight, a batch's command buffers.
    spare_ops: Vec<VecDeque<Taken>>,
    spare_segments: Vec<Segments>,
}

/// The flush's open recorder of each lane (compute, transfer).
pub(super) type Recs = [Option<Recorder>; 2];

const LANES: [Lane; 2] = [Lane::Compute, Lane::Transfer];

impl Engine {
    pub(super) fn new() -> Self {
        Engine {
            streams: Vec::with_capacity(16),
            seen: u64::MAX,
            // Room up front for the flights and batches of a device a few
            // flushes behind, so that how far ahead a run first gets does
            // not decide whether it allocates (the lists keep what they grow to).
            flights: VecDeque::with_capacity(16),
            batch: 1,
            segments: [Vec::with_capacity(4), Vec::with_capacity(4)],
            waits: [0, 0],
            closed: Vec::with_capacity(4),
            done: [0, 0],
            signalled: [0, 0],
            pipelines: HashMap::new(),
            polling: false,
            started: Vec::new(),
            rescan: false,
            callback: None,
            doorbell: 0,
            queries_taken: 0,
            queries_freed: 0,
            graphs: super::graph::Recorded::default(),
            // Room for what a steady run of flushes circulates, so that
            // the first flushes that run ahead of the device grow nothing.
            spares: [
                VecDeque::with_capacity(SPARES),
                VecDeque::with_capacity(SPARES),
            ],
            spare_ops: {
                let mut v = Vec::with_capacity(SPARES);
                v.extend((0..2).map(|_| VecDeque::with_capacity(TAKE_PER_STREAM)));
                v
            },
            spare_segments: (0..4).map(|_| Vec::with_capacity(4)).collect(),
        }
    }

    /// One look of the engine thread's loop (`callback::run`): completes
    /// what the device ran, takes and submits what is ready, else waits a
    /// while for the device or a submission. `nested`: the look is made
    /// inside a host callback's wait, which ends when it holds (so waits
    /// here are short and end when it does).
    pub(super) fn step(
        &mut self,
        sh: &Arc<Shared>,
        nested: Option<&mut dyn FnMut() -> bool>,
    ) -> Step {
        let seen = sh.pending.load(Ordering::Acquire);
        self.retire(sh);
        sh.streams.refresh(&mut self.streams, &mut self.seen);
        // Priority order, aged as the host scheduler ages it: a stream's
        // priority improves by one level per `AGING_TICKS` ops taken
        // since it was last served (or made), so a low-priority stream
        // never starves behind continuous high-priority callbacks, each
        // of which ends a look.
        let tick = sh.tick.load(Ordering::Relaxed);
        self.streams.sort_by_key(|s| {
            let waited = tick.saturating_sub(s.last_served.load(Ordering::Relaxed)) / AGING_TICKS;
            let base = i64::from(s.priority.load(Ordering::Relaxed));
            // Ties go to the stream served last, as on the host.
            let served = std::cmp::Reverse(s.last_served.load(Ordering::Relaxed));
            (
                base - i64::try_from(waited).unwrap_or(i64::MAX),
                served,
                s.id,
            )
        });
        self.polling = false;
        let took = self.flush(sh);
        if let Some(cb) = self.callback.take() {
            return Step::Callback(cb);
        }
        if took {
            return Step::Again;
        }
        if let Some(at) = self
            .flights
            .front()
            .and_then(|f| f.ops.front())
            .map(|t| t.at)
        {
            // The device is busy: wait for the oldest op's batch or for
            // the next submission, whichever comes first.
            self.wait_device(sh, at, seen);
            return Step::Again;
        }
        let nested_wait = nested.is_some();
        if !nested_wait
            && sh.shutdown.load(Ordering::Acquire)
            && self.streams.iter().all(|s| s.ring.is_empty())
        {
            return Step::Shutdown;
        }
        let timeout = if self.polling {
            sh.config.async_poll
        } else if nested_wait {
            NESTED_PARK
        } else {
            Duration::from_millis(50)
        };
        let mut ready = nested;
        sh.bell.park_until(
            || {
                sh.pending.load(Ordering::Acquire) != seen
                    || sh.shutdown.load(Ordering::Acquire)
                    || ready.as_mut().is_some_and(|r| r())
            },
            Some(timeout),
        );
        Step::Idle
    }

    /// Waits until lane `lane` completes batch `batch` or a submission comes
    /// after `seen` (it signals the doorbell, see `Shared::ring`).
    ///
    /// It polls the lane's counter first, as the engine's completion mode
    /// says (`DeviceConfig::engine_idle`: for the spin budget under `Auto`),
    /// then blocks in `vkWaitSemaphores`.
    fn wait_device(&mut self, sh: &Shared, (lane, batch): (usize, u64), seen: u64) {
        let spin = match sh.config.engine_idle {
            crate::CompletionMode::Block => None,
            crate::CompletionMode::Auto { spin } => Some(spin),
            crate::CompletionMode::Spin | crate::CompletionMode::Yield => Some(SPIN_ROUND),
        };
        if let Some(budget) = spin.filter(|b| !b.is_zero()) {
            let mut ready = || {
                sh.lanes[lane].value().map_or(true, |v| v >= batch)
                    || sh.pending.load(Ordering::Acquire) != seen
            };
            if crate::exec::park::spin_for(budget, &mut ready) {
                return;
            }
        }
        let target = self.doorbell + 1;
        sh.doorbell_at.store(target, Ordering::SeqCst);
        sh.device_wait.store(true, Ordering::SeqCst);
        if sh.pending.load(Ordering::SeqCst) == seen {
            let waits = [(&sh.lanes[lane], batch), (&sh.doorbell, target)];
            if let Err(e) = hetero_vulkan::Timeline::wait_any(&waits, Duration::from_millis(50)) {
                sh.lose(format!("waiting for the device: {e}"));
            }
        }
        sh.device_wait.store(false, Ordering::SeqCst);
        // Where the doorbell is now (a submitter that took an earlier wait may
        // signal late, to the value it reads then): the next wait is past it.
        self.doorbell = sh.doorbell.value().unwrap_or(target).max(self.doorbell);
    }

    /// A timestamp query written into `rec` when the work recorded before it
    /// is done; `None` when the device has none or every query is in use
    /// (the caller counts it in `held`, released when its op completes).
    pub(super) fn stamp(&mut self, sh: &Shared, rec: &mut Recorder, held: &mut u32) -> Option<u32> {
        let pool = sh.queries.as_ref()?;
        let count = u64::from(pool.count());
        if self.queries_taken - self.queries_freed >= count {
            return None;
        }
        let q = (self.queries_taken % count) as u32;
        rec.timestamp(pool, q).ok()?;
        self.queries_taken += 1;
        *held += 1;
        Some(q)
    }

    /// Completes the ops the device has run, in order.
    fn retire(&mut self, sh: &Shared) {
        let lanes = if sh.two_lanes { 2 } else { 1 };
        for (l, done) in self.done.iter_mut().enumerate().take(lanes) {
            match sh.lanes[l].value() {
                Ok(v) => *done = v,
                Err(e) => sh.lose(format!("reading the device's progress: {e}")),
            }
        }
        let lost = sh.lost();
        while let Some(f) = self.flights.front_mut() {
            // The ready prefix of the oldest flush.
            let ready = f
                .ops
                .iter()
                .take_while(|t| lost.is_some() || t.at.1 <= self.done[t.at.0])
                .count();
            // Its timestamps, read at once (one driver call per run of
            // queries: a read can cost tens of µs on a CPU driver).
            let held: u64 = f
                .ops
                .iter()
                .take(ready)
                .map(|t| u64::from(t.times.held))
                .sum();
            let stamps = Stamps::read(sh, self.queries_freed, held);
            self.queries_freed += held;
            for t in f.ops.drain(..ready) {
                let failed = (t.at.1 > self.done[t.at.0]).then(|| lost.clone()).flatten();
                complete(sh, t, failed, &stamps);
            }
            if !f.ops.is_empty() {
                return;
            }
            if let Some(f) = self.flights.pop_front() {
                self.spare_ops.push(f.ops);
            }
        }
    }

    /// Takes what is ready from every stream into one flush (a submission
    /// per lane and batch); whether anything was taken.
    fn flush(&mut self, sh: &Shared) -> bool {
        let mut recs: Recs = [None, None];
        let mut ops = self.spare_ops.pop().unwrap_or_default();
        self.rescan = false;
        // Again while a pass took something: a stream whose wait was met by
        // an op another stream recorded later in the pass goes on in this
        // flush too (a pipeline of streams hands each tile on in one
        // submission, not one per stage). `self.streams` stays in place:
        // `recorded_here` looks at it.
        for _ in 0..PASSES {
            let before = ops.len();
            for i in 0..self.streams.len() {
                let s = self.streams[i].clone();
                self.take_from(sh, &s, &mut recs, &mut ops);
            }
            if ops.len() == before || self.rescan {
                break;
            }
        }
        if ops.is_empty() {
            self.spare_ops.push(ops);
            // A callback that ran may have made more ready: look again now.
            return self.rescan;
        }
        if let Err((from, m)) = self.submit_batches(sh, &mut recs) {
            // What was not submitted did not run: its ops fail.
            for t in &mut ops {
                if t.at.1 >= from {
                    t.at.1 = 0;
                    if t.result.is_ok() {
                        t.result = Err(m.clone());
                    }
                }
            }
        }
        self.flights.push_back(Flight { ops });
        true
    }

    /// Closes the open batch and submits every closed one, in order: per
    /// lane with work in it, one `vkQueueSubmit2` that waits for the other
    /// lane where the batch must, and signals the lane's timeline with the
    /// batch's number. A failed submission loses the device (a later batch
    /// waiting for it would never start): the batch it failed at is the error.
    pub(super) fn submit_batches(
        &mut self,
        sh: &Shared,
        recs: &mut Recs,
    ) -> Result<(), (u64, String)> {
        let first = self.closed.first().map_or(self.batch, |c| c.batch);
        let closing = self.close_batch(recs);
        if let Err(m) = closing {
            self.closed.clear();
            sh.lose(m.clone());
            return Err((first, m));
        }
        // Taken out and put back, to keep its capacity.
        let mut closed = std::mem::take(&mut self.closed);
        let submitted = self.submit_closed(sh, &mut closed);
        closed.clear();
        self.closed = closed;
        submitted
    }

    /// Submits the closed batches `closed` in order (see `submit_batches`),
    /// then keeps their lists and the command buffers this engine recorded
    /// for reuse.
    fn submit_closed(&mut self, sh: &Shared, closed: &mut [Closed]) -> Result<(), (u64, String)> {
        for c in closed.iter_mut() {
            // The two lanes' parts of a batch are independent (what one
            // needs of the other is in earlier batches): they go in either
            // order, alternating, so that on one queue (`lanes=split`) a
            // dependency wrongly left inside a batch breaks results in
            // either direction instead of hiding behind queue order.
            let order = if c.batch % 2 == 0 { [0, 1] } else { [1, 0] };
            for l in order {
                let (cmds, wait) = &mut c.lanes[l];
                if cmds.is_empty() {
                    continue;
                }
                let other = 1 - l;
                let wait_for = [(&sh.lanes[other], *wait)];
                let waits = if *wait > self.done[other] {
                    &wait_for[..]
                } else {
                    &[]
                };
                let refs: SmallVec<[&CommandBuffer; 4]> = cmds.iter().map(|(c, _)| c).collect();
                let result = sh
                    .gpu
                    .submit(LANES[l], &refs, waits, &[(&sh.lanes[l], c.batch)]);
                drop(refs);
                // Submitted or not, what this engine recorded is kept for
                // recording again (a failed submission left it idle).
                for (cmd, own) in cmds.drain(..) {
                    if own && self.spares[l].len() < SPARES {
                        self.spares[l].push_back(cmd);
                    }
                }
                self.spare_segments.push(std::mem::take(cmds));
                if let Err(e) = result {
                    // Nothing of this batch on ran, and a later batch
                    // waiting for it would never start: the device is
                    // gone for what comes after.
                    let m = format!("submitting to the Vulkan device failed: {e}");
                    sh.lose(m.clone());
                    return Err((c.batch, m));
                }
            }
        }
        Ok(())
    }

    /// Closes the open batch: its recorders finish into its lanes' command
    /// buffers; the next batch opens.
    pub(super) fn close_batch(&mut self, recs: &mut Recs) -> Result<(), String> {
        let mut closed = Closed {
            batch: self.batch,
            lanes: [(Vec::new(), 0), (Vec::new(), 0)],
        };
        let mut result = Ok(());
        for (l, rec) in recs.iter_mut().enumerate() {
            if let Err(m) = self.close_segment(l, rec) {
                result = Err(m);
            }
            // An empty list stays (it holds no memory); one with buffers
            // goes with the batch and a spare one takes its place.
            let segments = if self.segments[l].is_empty() {
                Vec::new()
            } else {
                let spare = self.spare_segments.pop().unwrap_or_default();
                std::mem::replace(&mut self.segments[l], spare)
            };
            closed.lanes[l] = (segments, self.waits[l]);
            self.waits[l] = 0;
        }
        if closed.lanes.iter().any(|(c, _)| !c.is_empty()) {
            for (l, (cmds, _)) in closed.lanes.iter().enumerate() {
                if !cmds.is_empty() {
                    self.signalled[l] = self.batch;
                }
            }
            self.closed.push(closed);
            self.batch += 1;
        }
        result
    }

    /// Finishes lane `l`'s open recorder, if any, as the batch's next segment.
    pub(super) fn close_segment(
        &mut self,
        l: usize,
        rec: &mut Option<Recorder>,
    ) -> Result<(), String> {
        if let Some(r) = rec.take() {
            let cmd = r
                .finish()
                .map_err(|e| format!("finishing a command buffer failed: {e}"))?;
            self.segments[l].push((cmd, true));
        }
        Ok(())
    }

    /// The open batch: what is recorded now goes in it.
    pub(super) fn open_batch(&self) -> u64 {
        self.batch
    }

    /// Whether the compute lane has run batch `b` (reading the device's
    /// progress when the last reading says it has not).
    pub(super) fn compute_ran(&mut self, sh: &Shared, b: u64) -> bool {
        if b > self.done[0] && b < self.batch {
            if let Ok(v) = sh.lanes[0].value() {
                self.done[0] = self.done[0].max(v);
            }
        }
        b <= self.done[0]
    }

    /// Appends an already recorded command buffer to the compute lane's
    /// part of the open batch, after what was recorded there so far.
    pub(super) fn append_segment(
        &mut self,
        rec: &mut Option<Recorder>,
        cmd: CommandBuffer,
    ) -> Result<(), String> {
        self.close_segment(0, rec)?;
        self.segments[0].push((cmd, false));
        Ok(())
    }

    /// Nothing is recorded or in flight: the device is idle.
    fn device_idle(&self, recs: &Recs) -> bool {
        self.flights.is_empty()
            && recs.iter().all(|r| r.is_none())
            && self.segments.iter().all(|s| s.is_empty())
            && self.closed.is_empty()
    }

    /// Prepares the open batch for device work of stream `s` on lane `l`:
    /// past the other lane's batch the stream must follow when that is the
    /// open one, and waiting for it. The batch the work goes in.
    fn enter(&mut self, s: &VulkanStream, l: usize, recs: &mut Recs) -> Result<u64, String> {
        let other = 1 - l;
        let need = s.deps[other].load(Ordering::Relaxed);
        let open_there = recs[other].is_some() || !self.segments[other].is_empty();
        if need >= self.batch && open_there {
            self.close_batch(recs)?;
        }
        let need = need.min(self.signalled[other]);
        if need > self.done[other] {
            self.waits[l] = self.waits[l].max(need);
        }
        s.deps[l].store(self.batch, Ordering::Relaxed);
        s.lane.store(l as u8, Ordering::Relaxed);
        Ok(self.batch)
    }

    /// Takes the ops of `s` that are ready, recording device work into
    /// the lanes' recorders.
    fn take_from(
        &mut self,
        sh: &Shared,
        s: &Arc<VulkanStream>,
        recs: &mut Recs,
        ops: &mut VecDeque<Taken>,
    ) {
        for _ in 0..TAKE_PER_STREAM {
            // A stream whose callback runs (or is about to) takes nothing
            // until it returns.
            if self.rescan || s.in_callback.load(Ordering::Relaxed) {
                return;
            }
            let in_flight = s.in_flight.load(Ordering::Relaxed);
            let device_idle = self.device_idle(recs);
            let started = self.started.contains(&s.id);
            let mut polling = false;
            let mut starts = false;
            // SAFETY: the engine thread is the ring's only consumer (and holds
            // every stream, as polling an async op requires).
            let ready = unsafe {
                s.ring.peek_with(|op, pos| {
                    if sh.lost().is_some() {
                        return true;
                    }
                    if s.faulted(pos + 1) {
                        // Failed, but its waits still wait (`Op::failed_wait_done`).
                        return op.failed_wait_done();
                    }
                    match &op.body {
                        Body::Wait {
                            timeline, value, ..
                        } => {
                            timeline.is_reached(*value)
                                || (timeline.device == sh.device
                                    && self.recorded_here(timeline.stream, *value))
                        }
                        // (Not given to this backend, `waits_all`; waits for
                        // completion if it were.)
                        Body::WaitAll(w) => w.is_reached(),
                        Body::Host(_) => in_flight == 0,
                        Body::Async(a) if in_flight == 0 && (device_idle || started) => {
                            // It starts with its buffers' locks (released
                            // when it completes, `complete_async`).
                            let start = || {
                                starts = op.try_acquire_access();
                                starts
                            };
                            match a.poll(None, start) {
                                crate::exec::async_op::AsyncPoll::Ready => true,
                                crate::exec::async_op::AsyncPoll::Pending => {
                                    polling = true;
                                    false
                                }
                            }
                        }
                        Body::Async(_) => false,
                        // A launch with host nodes runs them on this thread,
                        // between its device nodes, when the device is idle
                        // (graph.rs).
                        Body::Graph(l)
                            if super::graph::has_host_nodes(l)
                                && !(in_flight == 0 && device_idle) =>
                        {
                            false
                        }
                        // Nobody (a started async op, a host access) may hold
                        // a lock it conflicts with: take them and give them
                        // back (recorded ops are ordered by barriers).
                        _ => {
                            let free = op.try_acquire_access();
                            if free {
                                op.release_access(0);
                            }
                            free
                        }
                    }
                })
            };
            self.polling |= polling;
            if starts {
                self.started.push(s.id);
            }
            if ready != Some(true) {
                return;
            }
            // SAFETY: as above; `peek_with` saw the op.
            let Some((mut op, pos)) = (unsafe { s.ring.pop() }) else {
                return;
            };
            let value = pos + 1;
            let tick = sh.tick.load(Ordering::Relaxed) + 1;
            sh.tick.store(tick, Ordering::Relaxed);
            s.last_served.store(tick, Ordering::Relaxed);
            if let Body::Async(_) = &op.body {
                // A started async op gives its locks back, however it ends.
                if let Some(i) = self.started.iter().position(|&id| id == s.id) {
                    self.started.swap_remove(i);
                    op.release_access(0);
                }
            }
            let mut taken = Taken {
                stream: s.clone(),
                value,
                op: Op::new(Body::Host(None)),
                result: Ok(()),
                after: After::Nothing,
                times: Times::default(),
                at: (0, 0),
            };
            if let Some(lost) = sh.lost() {
                taken.result = Err(lost);
            } else if s.faulted(value) {
                taken.result = Err(String::new());
            } else {
                match &mut op.body {
                    Body::Host(_) => {
                        // It runs once what this look took is submitted,
                        // and the look ends: after it, the streams are
                        // looked at again (priorities may have changed,
                        // or more come).
                        taken.op = op;
                        s.in_flight.fetch_add(1, Ordering::Relaxed);
                        s.in_callback.store(true, Ordering::Relaxed);
                        self.callback = Some(Box::new(taken));
                        self.rescan = true;
                        return;
                    }
                    Body::Async(a) => {
                        // Polled to done in `peek_with` above.
                        // SAFETY: the engine thread holds every stream.
                        taken.result = unsafe { a.take_result() };
                        taken.op = op;
                        s.in_flight.fetch_add(1, Ordering::Relaxed);
                        complete(sh, taken, None, &Stamps::default());
                        continue;
                    }
                    Body::Wait {
                        timeline,
                        value: v,
                        fault,
                    } => {
                        // Its fault once it completed (before, a fault of
                        // an earlier op may still seem to last: its scope
                        // ends when the next scope's start completes).
                        let error = timeline
                            .is_reached(*v)
                            .then(|| timeline.error_for(*v))
                            .flatten()
                            .filter(|_| *fault);
                        // An op of this device that failed when it was
                        // recorded has not failed its timeline yet.
                        let failed_here = *fault
                            && timeline.device == sh.device
                            && self.faulted_here(timeline.stream, *v);
                        if let Some(e) = error {
                            taken.result = Err(crate::exec::op::wait_fault(timeline, e));
                        } else if failed_here {
                            taken.result = Err(format!(
                                "waited on an event of stream {} of device {}, which failed",
                                timeline.stream, timeline.device
                            ));
                        } else if timeline.device == sh.device {
                            self.follow(s, timeline.stream);
                        }
                    }
                    Body::WaitAll(w) => taken.result = w.fault(),
                    Body::Record { .. } => {
                        taken.after = After::Stamp;
                        // The device's time when the work before it is done,
                        // where the device has timestamps: on the lane of
                        // the stream's last device work.
                        if sh.queries.is_some() {
                            let l = usize::from(s.lane.load(Ordering::Relaxed));
                            if let Ok(b) = self.enter(s, l, recs) {
                                if let Ok(r) = rec_or_new(sh, &mut self.spares[l], &mut recs[l], l)
                                {
                                    taken.times.stamp = self.stamp(sh, r, &mut taken.times.held);
                                    taken.at = (l, b);
                                }
                            }
                        }
                    }
                    Body::Graph(l) => {
                        // On the compute lane. While profiling, the launch's
                        // span around its nodes'.
                        let batch = match self.enter(s, 0, recs) {
                            Ok(b) => b,
                            Err(m) => {
                                taken.result = Err(m);
                                0
                            }
                        };
                        taken.at = (0, batch);
                        let rec = &mut recs[0];
                        let profiling = crate::exec::clock::profiling();
                        let mut held = 0;
                        let start = profiling
                            .then(|| rec_or_new(sh, &mut self.spares[0], rec, 0).ok())
                            .flatten()
                            .and_then(|r| self.stamp(sh, r, &mut held));
                        taken.times.held += held;
                        let (result, staging) = if batch == 0 {
                            (taken.result.clone(), super::graph::Staging::Own(Vec::new()))
                        } else {
                            super::graph::launch(self, sh, rec, l, &mut taken.times)
                        };
                        if let (Some(a), Ok(r)) =
                            (start, rec_or_new(sh, &mut self.spares[0], rec, 0))
                        {
                            let mut held = 0;
                            if let Some(b) = self.stamp(sh, r, &mut held) {
                                taken.times.span = Some((a, b));
                            }
                            taken.times.held += held;
                        }
                        taken.result = result;
                        // It completes with the batch its last nodes are in
                        // (a host node submits and waits: the open batch may
                        // have moved on, or have nothing of it).
                        if batch != 0 {
                            let open = recs[0].is_some() || !self.segments[0].is_empty();
                            taken.at = (0, if open { self.batch } else { self.signalled[0] });
                        }
                        taken.after = match staging {
                            super::graph::Staging::Own(v) => After::Keep(v),
                            super::graph::Staging::Shared(a) => After::KeepShared(a),
                        };
                        s.recorded.store(value, Ordering::Relaxed);
                    }
                    _ => {
                        let l = Self::lane_of(sh, &op.body);
                        // Timestamps around it while profiling, and around a
                        // launch that stamps its own span.
                        let timed = crate::exec::clock::profiling() || op.span().is_some();
                        let r = self.enter(s, l, recs).and_then(|b| {
                            taken.at = (l, b);
                            rec_or_new(sh, &mut self.spares[l], &mut recs[l], l)
                        });
                        let times = &mut taken.times;
                        let r = r.and_then(|r| {
                            let start = timed.then(|| self.stamp(sh, r, &mut times.held));
                            let after = self.record(sh, r, &op)?;
                            if let Some(Some(start)) = start {
                                if let Some(end) = self.stamp(sh, r, &mut times.held) {
                                    times.span = Some((start, end));
                                }
                            }
                            Ok(after)
                        });
                        match r {
                            Ok(after) => {
                                taken.after = after;
                                s.recorded.store(value, Ordering::Relaxed);
                            }
                            Err(m) => {
                                // Nothing of it will run (its lane's batch
                                // may get no submission): it completes, failed,
                                // in its turn.
                                taken.at = (0, 0);
                                taken.result = Err(m)
                            }
                        }
                    }
                }
            }
            if taken.result.is_err() {
                s.faulted_at.fetch_min(value, Ordering::Relaxed);
            } else {
                // Taken in order: whatever is recorded from now on runs
                // after this op and everything before it on its stream (a
                // wait, a record: ordered by what was recorded before them).
                s.recorded.store(value, Ordering::Relaxed);
            }
            taken.op = op;
            s.in_flight.fetch_add(1, Ordering::Relaxed);
            ops.push_back(taken);
        }
    }

    /// The lane an op with device work runs on: copies, fills and host reads
    /// and writes on the transfer lane where there are two, the rest on the
    /// compute lane.
    fn lane_of(sh: &Shared, body: &Body) -> usize {
        let copies = matches!(
            body,
            Body::Copy { .. }
                | Body::Fill { .. }
                | Body::HostWrite { .. }
                | Body::HostRead { .. }
                | Body::CopyBatch(_)
                | Body::Copy2D(_)
        );
        usize::from(copies && sh.two_lanes)
    }

    /// Stream `s` waited on an event of stream `of` of this device: what
    /// follows in `s` follows what `of` recorded, on both lanes.
    fn follow(&self, s: &VulkanStream, of: u64) {
        if let Some(t) = self.streams.iter().find(|t| t.id == of) {
            for l in 0..2 {
                s.deps[l].fetch_max(t.deps[l].load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
    }

    /// Whether `value` of stream `stream` of this device has been recorded
    /// for the device (so whatever is recorded after it runs after it).
    fn recorded_here(&self, stream: u64, value: u64) -> bool {
        self.streams
            .iter()
            .any(|s| s.id == stream && s.recorded.load(Ordering::Relaxed) >= value)
    }

    /// The stream `id` of this device, as the engine last saw the list.
    pub(super) fn stream(&self, id: u64) -> Option<&Arc<VulkanStream>> {
        self.streams.iter().find(|s| s.id == id)
    }

    /// Whether `stream` of this device failed at or before `value` (an op
    /// that failed when it was recorded has not failed its timeline yet).
    fn faulted_here(&self, stream: u64, value: u64) -> bool {
        self.streams
            .iter()
            .any(|s| s.id == stream && s.faulted_through(value))
    }
}

impl Engine {
    /// Submits what the flush recorded so far and waits until the device ran
    /// it (and everything before it): a graph's host node runs after the
    /// device nodes recorded before it. A launch with host nodes is taken
    /// only when the device is idle, so all there is is on the compute lane.
    pub(super) fn submit_and_wait(
        &mut self,
        sh: &Shared,
        rec: &mut Option<Recorder>,
    ) -> Result<(), String> {
        debug_assert!(self.segments[1].is_empty());
        let mut recs: Recs = [rec.take(), None];
        self.submit_batches(sh, &mut recs).map_err(|(_, m)| m)?;
        for l in 0..2 {
            let target = self.signalled[l];
            loop {
                match sh.lanes[l].wait(target, Duration::from_millis(100)) {
                    Ok(()) => break,
                    Err(hetero_vulkan::VkError::Timeout { .. }) => {}
                    Err(e) => {
                        sh.lose(format!("waiting for the device: {e}"));
                        return Err(format!("waiting for the Vulkan device failed: {e}"));
                    }
                }
            }
            self.done[l] = self.done[l].max(target);
        }
        Ok(())
    }
}
