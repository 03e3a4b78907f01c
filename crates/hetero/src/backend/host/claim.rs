//! How an engine chooses its next op: streams in order of effective priority
//! (aging lifts a waiting stream), the stream it just ran first while it keeps
//! up, and placement by data (an op left a moment to the engine that wrote its
//! input, `defers`).

use super::dispatch::{Readiness, Taken};
use super::graph::find_graph_job;
use super::hw_queue::Skipped;
use super::kernel_job::find_job;
use super::stream::{blocked, wait_hint_of, HostStream, Left};
use super::Shared;
use crate::backend::host::engine::Work;
use crate::backend::host::EngineThread;
use crate::exec::op::{Body, Op};
use std::sync::atomic::Ordering;

impl EngineThread {
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
        // The most urgent first (keys are unique: the index ends them). It is
        // nearly always taken, so one pass finds it; the rest are sorted only
        // when it is not (a sort of every stream per op cost the engine more
        // than the op on a pool of task streams).
        let best = (0..self.candidates.len()).min_by_key(|&k| self.candidates[k])?;
        self.candidates.swap(0, best);
        for k in 0..self.candidates.len() {
            if k == 1 {
                self.candidates[1..].sort_unstable();
            }
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
    pub(super) fn claim_stream(&mut self, sh: &Shared, id: u64) -> Option<Work> {
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
                (ready, wait_hint_of(op, stream.timeline.device))
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
    pub(super) fn continue_on(&mut self, sh: &Shared, stream: &HostStream) -> Option<Taken> {
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
