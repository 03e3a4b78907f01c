//! The Vulkan device's engine thread: takes ops from the streams' rings,
//! records them into one command buffer per flush, submits it, and completes
//! the ops when the device has run them.
//!
//! One thread owns everything here (`Engine`): the flights in submission
//! order, the pipelines, and the streams' engine-side fields. Streams only push.
//!
//! Ordering: every op runs on the compute lane's queue, and a recorded op
//! waits for everything recorded before it (a full barrier between ops). So
//! work from different streams is serialised in the order it was recorded,
//! never raced, and a wait on an event of another stream of this device
//! costs nothing on the device once that stream's op is recorded: it was
//! recorded, so it runs first. (A real GPU could overlap more; the lanes are
//! there for it, see docs/ARCHITECTURE.md.)
//!
//! Flights complete in submission order (one device timeline, `flights`,
//! signalled with each flight's number), and their ops in recorded order:
//! each stream's timeline completes in value order. A host callback runs when
//! its stream has nothing in flight, on this thread, and ends the look (so
//! the next op is chosen by the streams' priorities as they are then, not as
//! they were before the callback ran). An async op starts when its stream and
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
use crate::exec::op::{self, Body, Op};
use hetero_vulkan::{CommandBuffer, Lane, Pipeline, Recorder};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Ops one pass of a flush takes from one stream at most (so a long stream
/// does not hold back the others' first submission).
const TAKE_PER_STREAM: usize = 256;

/// Passes over the streams in one flush at most.
const PASSES: usize = 8;

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

/// One submission (or, with no device work, a group of ops that complete
/// once the flights before them have).
struct Flight {
    /// The value of `flights` that says it ran (0: no device work).
    seq: u64,
    _cmds: Vec<CommandBuffer>,
    ops: Vec<Taken>,
}

pub(super) struct Engine {
    streams: Vec<Arc<VulkanStream>>,
    seen: u64,
    flights: VecDeque<Flight>,
    next_seq: u64,
    pub(super) pipelines: HashMap<(usize, u32), (Arc<DeviceCode>, Pipeline)>,
    /// An async op is pending: look again soon.
    polling: bool,
    /// The streams whose oldest op is an async op that has started (it holds
    /// its buffers' access locks until it completes).
    started: Vec<u64>,
    /// A host callback ran in this look: take nothing more, look again.
    rescan: bool,
    /// The doorbell's value this engine knows it reached or will reach.
    doorbell: u64,
    /// Timestamp queries taken and given back so far (a ring over the pool).
    queries_taken: u64,
    queries_freed: u64,
    /// Command buffers of this flush finished before the open recorder (a
    /// recorded graph's between them): submitted together, in order.
    segments: Vec<CommandBuffer>,
    /// Graphs recorded once, resubmitted while they stay the same.
    pub(super) graphs: super::graph::Recorded,
}

impl Engine {
    pub(super) fn new() -> Self {
        Engine {
            streams: Vec::with_capacity(16),
            seen: u64::MAX,
            flights: VecDeque::new(),
            next_seq: 1,
            pipelines: HashMap::new(),
            polling: false,
            started: Vec::new(),
            rescan: false,
            doorbell: 0,
            queries_taken: 0,
            queries_freed: 0,
            segments: Vec::new(),
            graphs: super::graph::Recorded::default(),
        }
    }

    /// The engine thread's loop.
    pub(super) fn run(mut self, sh: &Arc<Shared>) {
        crate::exec::thread::mark_engine_thread();
        crate::exec::timeline::set_engine_wait(refuse_wait);
        loop {
            let seen = sh.pending.load(Ordering::Acquire);
            self.retire(sh);
            sh.streams.refresh(&mut self.streams, &mut self.seen);
            self.streams
                .sort_by_key(|s| (s.priority.load(Ordering::Relaxed), s.id));
            self.polling = false;
            let took = self.flush(sh);
            if took {
                continue;
            }
            if let Some(f) = self.flights.front() {
                // The device is busy: wait for its next flight or for the
                // next submission, whichever comes first.
                if f.seq != 0 {
                    self.wait_device(sh, f.seq, seen);
                }
                continue;
            }
            if sh.shutdown.load(Ordering::Acquire) && self.streams.iter().all(|s| s.ring.is_empty())
            {
                return;
            }
            let timeout = if self.polling {
                sh.config.async_poll
            } else {
                Duration::from_millis(50)
            };
            sh.bell.park_until(
                || {
                    sh.pending.load(Ordering::Acquire) != seen
                        || sh.shutdown.load(Ordering::Acquire)
                },
                Some(timeout),
            );
        }
    }

    /// Waits until the device completes flight `seq` or a submission comes
    /// after `seen` (it signals the doorbell, see `Shared::ring`).
    fn wait_device(&mut self, sh: &Shared, seq: u64, seen: u64) {
        let target = self.doorbell + 1;
        sh.doorbell_at.store(target, Ordering::SeqCst);
        sh.device_wait.store(true, Ordering::SeqCst);
        if sh.pending.load(Ordering::SeqCst) == seen {
            let waits = [(&sh.flights, seq), (&sh.doorbell, target)];
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

    /// Completes the flights the device has run, in order.
    fn retire(&mut self, sh: &Shared) {
        let done = match sh.flights.value() {
            Ok(v) => v,
            Err(e) => {
                sh.lose(format!("reading the device's progress: {e}"));
                u64::MAX
            }
        };
        while self
            .flights
            .front()
            .is_some_and(|f| f.seq <= done || sh.lost().is_some())
        {
            let Some(f) = self.flights.pop_front() else {
                break;
            };
            let lost = (f.seq != 0 && f.seq > done).then(|| sh.lost()).flatten();
            // The flight's timestamps, read at once (one driver call per
            // run of queries: a read can cost tens of µs on a CPU driver).
            let held: u64 = f.ops.iter().map(|t| u64::from(t.times.held)).sum();
            let stamps = Stamps::read(sh, self.queries_freed, held);
            self.queries_freed += held;
            for t in f.ops {
                complete(sh, t, lost.clone(), &stamps);
            }
        }
    }

    /// Takes what is ready from every stream into one submission; whether
    /// anything was taken.
    fn flush(&mut self, sh: &Shared) -> bool {
        let mut rec: Option<Recorder> = None;
        let mut ops: Vec<Taken> = Vec::new();
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
                self.take_from(sh, &s, &mut rec, &mut ops);
            }
            if ops.len() == before || self.rescan {
                break;
            }
        }
        if ops.is_empty() {
            // A callback that ran may have made more ready: look again now.
            return self.rescan;
        }
        let seq = match self.close_segment(&mut rec) {
            Err(e) => {
                for t in &mut ops {
                    if t.result.is_ok() {
                        t.result = Err(e.clone());
                    }
                }
                0
            }
            Ok(()) if self.segments.is_empty() => 0,
            Ok(()) => {
                let seq = self.next_seq;
                let cmds = std::mem::take(&mut self.segments);
                let refs: Vec<&CommandBuffer> = cmds.iter().collect();
                match sh
                    .gpu
                    .submit(Lane::Compute, &refs, &[], &[(&sh.flights, seq)])
                {
                    Ok(()) => {
                        self.next_seq += 1;
                        self.flights.push_back(Flight {
                            seq,
                            _cmds: cmds,
                            ops,
                        });
                        return true;
                    }
                    Err(e) => {
                        // Nothing of this flush ran: its ops fail, the device
                        // is gone for what comes after if it was lost.
                        if matches!(e, hetero_vulkan::VkError::DeviceLost { .. }) {
                            sh.lose(e.to_string());
                        }
                        let message = format!("submitting to the Vulkan device failed: {e}");
                        for t in &mut ops {
                            if t.result.is_ok() {
                                t.result = Err(message.clone());
                            }
                        }
                        0
                    }
                }
            }
        };
        self.flights.push_back(Flight {
            seq,
            _cmds: Vec::new(),
            ops,
        });
        true
    }

    /// Finishes the open recorder, if any, as the flush's next segment.
    pub(super) fn close_segment(&mut self, rec: &mut Option<Recorder>) -> Result<(), String> {
        if let Some(r) = rec.take() {
            let cmd = r
                .finish()
                .map_err(|e| format!("finishing a command buffer failed: {e}"))?;
            self.segments.push(cmd);
        }
        Ok(())
    }

    /// Appends an already recorded command buffer to the flush, after what
    /// was recorded so far.
    pub(super) fn append_segment(
        &mut self,
        rec: &mut Option<Recorder>,
        cmd: CommandBuffer,
    ) -> Result<(), String> {
        self.close_segment(rec)?;
        self.segments.push(cmd);
        Ok(())
    }

    /// Takes the ops of `s` that are ready, recording device work into `rec`.
    fn take_from(
        &mut self,
        sh: &Shared,
        s: &Arc<VulkanStream>,
        rec: &mut Option<Recorder>,
        ops: &mut Vec<Taken>,
    ) {
        for _ in 0..TAKE_PER_STREAM {
            if self.rescan {
                return;
            }
            let in_flight = s.in_flight.load(Ordering::Relaxed);
            let device_idle = self.flights.is_empty() && rec.is_none() && self.segments.is_empty();
            let started = self.started.contains(&s.id);
            let mut polling = false;
            let mut starts = false;
            // SAFETY: the engine thread is the ring's only consumer (and holds
            // every stream, as polling an async op requires).
            let ready = unsafe {
                s.ring.peek_with(|op, _| {
                    if s.faulted.load(Ordering::Relaxed) || sh.lost().is_some() {
                        return true;
                    }
                    match &op.body {
                        Body::Wait {
                            timeline, value, ..
                        } => {
                            timeline.is_reached(*value)
                                || self.recorded_here(timeline.stream, *value)
                        }
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
            };
            if let Some(lost) = sh.lost() {
                taken.result = Err(lost);
            } else if s.faulted.load(Ordering::Relaxed) {
                taken.result = Err(String::new());
            } else {
                match &mut op.body {
                    Body::Host(f) => {
                        if let Some(f) = f.take() {
                            taken.result = op::catch_user(|| "host callback".into(), f);
                        }
                        taken.op = op;
                        s.in_flight.fetch_add(1, Ordering::Relaxed);
                        complete(sh, taken, None, &Stamps::default());
                        // The callback took time: look at the streams again
                        // (priorities may have changed, or more come).
                        self.rescan = true;
                        continue;
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
                        let failed = *fault
                            && (timeline.error_for(*v).is_some()
                                || self.faulted_here(timeline.stream));
                        if failed {
                            taken.result = Err(format!(
                                "waited on an event of stream {}, which failed",
                                timeline.stream
                            ));
                        }
                    }
                    Body::Record { .. } => {
                        taken.after = After::Stamp;
                        // The device's time when the work before it is done,
                        // where the device has timestamps.
                        if sh.queries.is_some() {
                            if let Ok(r) = rec_or_new(sh, rec) {
                                taken.times.stamp = self.stamp(sh, r, &mut taken.times.held);
                            }
                        }
                    }
                    Body::Graph(l) => {
                        // While profiling, the launch's span around its nodes'.
                        let profiling = crate::exec::clock::profiling();
                        let mut held = 0;
                        let start = profiling
                            .then(|| rec_or_new(sh, rec).ok())
                            .flatten()
                            .and_then(|r| self.stamp(sh, r, &mut held));
                        taken.times.held += held;
                        let (result, staging) =
                            super::graph::launch(self, sh, rec, l, &mut taken.times);
                        if let (Some(a), Ok(r)) = (start, rec_or_new(sh, rec)) {
                            let mut held = 0;
                            if let Some(b) = self.stamp(sh, r, &mut held) {
                                taken.times.span = Some((a, b));
                            }
                            taken.times.held += held;
                        }
                        taken.result = result;
                        taken.after = match staging {
                            super::graph::Staging::Own(v) => After::Keep(v),
                            super::graph::Staging::Shared(a) => After::KeepShared(a),
                        };
                        s.recorded.store(value, Ordering::Relaxed);
                    }
                    _ => {
                        let profiling = crate::exec::clock::profiling();
                        let times = &mut taken.times;
                        let r = rec_or_new(sh, rec).and_then(|r| {
                            let start = profiling.then(|| self.stamp(sh, r, &mut times.held));
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
                            Err(m) => taken.result = Err(m),
                        }
                    }
                }
            }
            if taken.result.is_err() {
                s.faulted.store(true, Ordering::Relaxed);
            } else {
                // Taken in order: whatever is recorded from now on runs
                // after this op and everything before it on its stream (a
                // wait, a record: ordered by what was recorded before them).
                s.recorded.store(value, Ordering::Relaxed);
            }
            taken.op = op;
            s.in_flight.fetch_add(1, Ordering::Relaxed);
            ops.push(taken);
        }
    }

    /// Whether `value` of stream `stream` of this device has been recorded
    /// for the device (so whatever is recorded after it runs after it).
    fn recorded_here(&self, stream: u64, value: u64) -> bool {
        self.streams
            .iter()
            .any(|s| s.id == stream && s.recorded.load(Ordering::Relaxed) >= value)
    }

    fn faulted_here(&self, stream: u64) -> bool {
        self.streams
            .iter()
            .any(|s| s.id == stream && s.faulted.load(Ordering::Relaxed))
    }
}

impl Engine {
    /// Submits what `rec` holds and waits until the device ran it (and every
    /// flight before it): a graph's host node runs after the device nodes
    /// recorded before it.
    pub(super) fn submit_and_wait(
        &mut self,
        sh: &Shared,
        rec: &mut Option<Recorder>,
    ) -> Result<(), String> {
        self.close_segment(rec)?;
        if self.segments.is_empty() {
            return Ok(());
        }
        let seq = self.next_seq;
        let cmds = std::mem::take(&mut self.segments);
        let refs: Vec<&CommandBuffer> = cmds.iter().collect();
        sh.gpu
            .submit(Lane::Compute, &refs, &[], &[(&sh.flights, seq)])
            .map_err(|e| {
                if matches!(e, hetero_vulkan::VkError::DeviceLost { .. }) {
                    sh.lose(e.to_string());
                }
                format!("submitting to the Vulkan device failed: {e}")
            })?;
        self.next_seq += 1;
        self.flights.push_back(Flight {
            seq,
            _cmds: cmds,
            ops: Vec::new(),
        });
        loop {
            match sh.flights.wait(seq, Duration::from_millis(100)) {
                Ok(()) => return Ok(()),
                Err(hetero_vulkan::VkError::Timeout { .. }) => {}
                Err(e) => {
                    sh.lose(format!("waiting for the device: {e}"));
                    return Err(format!("waiting for the Vulkan device failed: {e}"));
                }
            }
        }
    }
}

/// A wait made inside a host callback on the engine thread: it would wait for
/// the engine itself, so it is refused unless already satisfied.
fn refuse_wait(
    _timeline: &crate::exec::timeline::Timeline,
    _value: u64,
    what: &'static str,
    ready: &mut dyn FnMut() -> bool,
) -> crate::Result<()> {
    if ready() {
        return Ok(());
    }
    Err(crate::Error::WouldDeadlock(format!(
        "{what} from a host callback on a Vulkan device: its engine cannot progress until \
         the callback returns; wait outside the callback"
    )))
}
