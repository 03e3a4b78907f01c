//! The emulated device's engines as a discrete-event model: which op starts when,
//! on which engine, and when it completes.
//!
//! One `Sim` per device, behind one lock; whoever holds the lock is the only
//! consumer of every stream's ring. It *dispatches* (starts every op that can
//! start at the current time: an op whose stream has nothing in flight, whose
//! waits are met and whose engine is free; streams in priority order, then the
//! one served longest ago, then by id, so the order is deterministic) and
//! *advances* (moves the clock to the next completion and completes what ends
//! then). Data effects happen when an op starts — the copy's bytes move, the
//! kernel's closure runs — so results are real; its completion comes at its
//! modelled time. In virtual time the clock only jumps; in real time it is the
//! wall clock and the driver thread sleeps between events.
//!
//! Copies in one direction share that direction's link rate; while both
//! directions carry data each runs at its both-at-once rate (`link.rs`). Between
//! two events rates are constant, so the remaining bytes of each transfer
//! decrease linearly and the next completion is exact. What each DMA costs
//! (batches, 2-D copies, inline writes, IOMMU translations, faults) is decided
//! in `dma.rs`; on a coalescing stream the small copies queued right behind a
//! starting one join its transfer (`merge_run`) and complete with it, in order.

use super::dma;
use super::graph::{model_graph, NodeTrace};
use super::stream::EmuStream;
use super::Shared;
use crate::config::link::Dir;
use crate::exec::kernel::{Block, KernelCost};
use crate::exec::op::{self, wait_fault, Body, CopyKind, Op};
use crate::exec::timeline::Timeline;
use record::{fnv, kind_code, record, record_merged, FNV_OFFSET};
use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod clock;
mod record;

/// Fixed cost of starting a kernel on the device, ns.
pub(crate) const KERNEL_LAUNCH_NS: u64 = 2_000;

thread_local! {
    /// Set while this thread runs the simulation (and the callbacks in it).
    static IN_SIM: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is inside the simulation of an emulated device.
pub(crate) fn in_sim() -> bool {
    IN_SIM.try_with(Cell::get).unwrap_or(false)
}

/// Marks the calling thread as inside the simulation until dropped. It then
/// acts as the device's engine: the pool never blocks it on a fence (the work
/// behind the fence may need this very thread).
pub(crate) struct InSim(bool, bool);

impl InSim {
    pub(crate) fn enter() -> InSim {
        let was_engine = hetero_memory::thread_role::set_engine_thread(true);
        InSim(IN_SIM.with(|c| c.replace(true)), was_engine)
    }
}

impl Drop for InSim {
    fn drop(&mut self) {
        IN_SIM.with(|c| c.set(self.0));
        hetero_memory::thread_role::set_engine_thread(self.1);
    }
}

/// The engine an op occupies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    None,
    Copy(usize, usize),
    Compute(usize, usize),
}

struct Transfer {
    dir: Dir,
    /// Until then the transfer is in its setup phase (no bytes on the wire).
    setup_until: u64,
    /// Bytes left on the wire.
    remaining: f64,
    /// It completes no earlier than this (a 2-D copy's device side).
    floor: u64,
    /// A peer copy: over this link, not the host's.
    peer: Option<super::group::PeerWire>,
}

struct Running {
    stream: Arc<EmuStream>,
    op: Op,
    value: u64,
    engine: Engine,
    start: u64,
    /// For fixed-duration ops.
    end: u64,
    transfer: Option<Transfer>,
    result: Result<(), String>,
    seq: u64,
    /// Copies merged into this one's descriptor chain (coalescing), with their
    /// values: they complete with it, in order.
    merged: Vec<(Op, u64)>,
    /// A peer copy's engine on the other device (its direction and index),
    /// freed with this op's.
    remote: Option<(Arc<Shared>, usize, usize)>,
}

pub(crate) struct Sim {
    pub(crate) now: u64,
    streams: Vec<Arc<EmuStream>>,
    generation: u64,
    compute_free: Vec<bool>,
    running: Vec<Running>,
    next_seq: u64,
    tick: u64,
    hash: u64,
    order: Vec<(u8, u64, u64, usize)>,
    /// Sequence numbers of the ops completing at the current event (kept: the
    /// sim allocates nothing in steady state).
    finished: Vec<u64>,
    /// The last dispatch polled an async op that is not done: whoever drives
    /// the model must poll again without being woken.
    polling: bool,
    /// An op completed the moment it started (a record, a wait, a host
    /// callback, a skip) in this dispatch pass: a stream waiting on it may
    /// start now. Ops that only took an engine unblock nobody.
    completed_at_start: bool,
}

impl Sim {
    pub(crate) fn new(compute_units: usize) -> Self {
        Sim {
            now: 0,
            streams: Vec::new(),
            generation: u64::MAX,
            compute_free: vec![true; compute_units],
            running: Vec::new(),
            next_seq: 0,
            tick: 0,
            hash: FNV_OFFSET,
            order: Vec::new(),
            finished: Vec::new(),
            polling: false,
            completed_at_start: false,
        }
    }

    /// Whether nothing is in flight.
    pub(crate) fn idle(&self) -> bool {
        self.running.is_empty()
    }

    /// Whether the last dispatch left an async op polled but not done.
    pub(crate) fn polling(&self) -> bool {
        self.polling
    }

    fn refresh(&mut self, sh: &Shared) {
        sh.streams.refresh(&mut self.streams, &mut self.generation);
    }

    /// Starts every op that can start now; zero-time ops (waits, records, host
    /// callbacks, skips) complete at once. Returns whether anything happened.
    pub(crate) fn dispatch(&mut self, sh: &Shared) -> bool {
        self.refresh(sh);
        self.polling = false;
        let mut any = false;
        // Out of `self` while ops start: borrowed, not cloned, per look (an
        // `Arc` clone is an atomic add on a line the submitters read).
        // (Should a panic unwind through here, the next `refresh` sees a stale
        // generation and lists the streams again.)
        let streams = std::mem::take(&mut self.streams);
        let generation = std::mem::replace(&mut self.generation, u64::MAX);
        loop {
            let mut progressed = false;
            self.completed_at_start = false;
            self.order.clear();
            for (i, s) in streams.iter().enumerate() {
                // A stream with an op in flight or nothing published starts
                // nothing (`try_start` would return at once): not ordered.
                // (The look is at the oldest slot, not at the ring's tail:
                // read here at every look, the tail's line would move to
                // this core, and each submission's claim of it back.)
                if s.served.in_flight.load(Ordering::Relaxed) || !s.ring.has_next() {
                    continue;
                }
                let served = s.served.last_served.load(Ordering::Relaxed);
                let prio = s.priority.load(Ordering::Relaxed);
                self.order.push((prio, served, s.id, i));
            }
            if self.order.len() > 1 {
                self.order.sort_unstable();
            }
            // A priority changed by an op that starts here (its user code)
            // reorders the streams before the next start.
            let priorities = sh.priorities.load(Ordering::Relaxed);
            let mut reorder = false;
            'streams: for k in 0..self.order.len() {
                let stream = &streams[self.order[k].3];
                while self.try_start(sh, stream) {
                    progressed = true;
                    if sh.priorities.load(Ordering::Relaxed) != priorities {
                        reorder = true;
                        break 'streams;
                    }
                }
            }
            any |= progressed;
            if reorder {
                continue;
            }
            // Another pass can start something only if an op completed in
            // this one (engines only got busier otherwise).
            if !progressed || !self.completed_at_start {
                self.streams = streams;
                self.generation = generation;
                return any;
            }
        }
    }

    /// Takes the stream's oldest op if it can start now; true if it did.
    fn try_start(&mut self, sh: &Shared, stream: &Arc<EmuStream>) -> bool {
        if stream.served.in_flight.load(Ordering::Relaxed) {
            return false;
        }
        enum Plan {
            Skip,
            Now(Result<(), String>),
            Engine(Engine),
            /// A peer copy: this device's engine and the other device's.
            Peer(Engine, Arc<Shared>, usize, usize),
            /// An async op that is done, completing at this device time or later.
            Async(u64),
        }
        let mut polling = false;
        // SAFETY: the holder of the sim lock is the only consumer of every ring,
        // and it holds every stream (as polling an async op requires).
        let plan = unsafe {
            stream.ring.peek_with(|op, pos| {
                if stream.timeline.failing() && !stream.timeline.recover_at(pos + 1) {
                    // Failed, but its waits still wait (`Op::failed_wait_done`).
                    return op.failed_wait_done().then_some(Plan::Skip);
                }
                if !op.after_reached() {
                    return None;
                }
                match &op.body {
                    Body::Wait {
                        timeline,
                        value,
                        fault,
                    } => timeline.is_reached(*value).then(|| {
                        Plan::Now(match timeline.error_for(*value).filter(|_| *fault) {
                            Some(e) => Err(wait_fault(timeline, e)),
                            None => Ok(()),
                        })
                    }),
                    Body::WaitAll(w) => w.is_reached().then(|| Plan::Now(w.fault())),
                    Body::Record { .. } | Body::Host(_) => Some(Plan::Now(Ok(()))),
                    // A peer copy takes a copy engine at both ends: out of
                    // the source (D2H), into the destination (H2D).
                    Body::Copy { src, dst, .. } if src.device != dst.device => {
                        let (kind, other, remote_kind) = if src.device == sh.device {
                            (CopyKind::D2H, dst.device, CopyKind::H2D)
                        } else {
                            (CopyKind::H2D, src.device, CopyKind::D2H)
                        };
                        let local = self.free_copy(sh, kind)?;
                        match sh.group.get().and_then(|g| g.member(other)) {
                            Some(remote) => {
                                let k = remote_kind as usize;
                                let i = remote.free_copy_engine(k)?;
                                Some(Plan::Peer(local, remote, k, i))
                            }
                            // (No group or the other device is gone: the
                            // start faults the copy.)
                            None => Some(Plan::Engine(local)),
                        }
                    }
                    Body::Copy { kind, .. } => self.free_copy(sh, *kind).map(Plan::Engine),
                    Body::HostWrite { .. } => self.free_copy(sh, CopyKind::H2D).map(Plan::Engine),
                    Body::HostRead { .. } => self.free_copy(sh, CopyKind::D2H).map(Plan::Engine),
                    Body::CopyBatch(b) => self.free_copy(sh, b.kind).map(Plan::Engine),
                    Body::Copy2D(c) => self.free_copy(sh, c.kind).map(Plan::Engine),
                    Body::Fill { .. } => self.free_copy(sh, CopyKind::D2D).map(Plan::Engine),
                    Body::Kernel { blocks, .. } => self.free_units(*blocks).map(Plan::Engine),
                    // A launch takes every compute unit free when it starts.
                    Body::Graph(_) => self.free_units(u32::MAX).map(Plan::Engine),
                    // (In the block's unsafe: the holder of the sim lock holds
                    // every stream, as `AsyncBody::poll` and `end_ns` require.)
                    Body::Async(a) => match a.poll(Some(sh.now_ns()), || true) {
                        crate::exec::async_op::AsyncPoll::Pending => {
                            polling = true;
                            None
                        }
                        crate::exec::async_op::AsyncPoll::Ready => Some(Plan::Async(a.end_ns())),
                    },
                }
            })
        };
        self.polling |= polling;
        let Some(Some(plan)) = plan else {
            return false;
        };
        // SAFETY: as above; `peek_with` saw the value.
        let (mut op, pos) = unsafe { stream.ring.pop() }.expect("peeked op is still there");
        let seq = self.next_seq;
        self.next_seq += 1;
        let now = self.now;
        let (mut result, mut engine) = (Ok(()), Engine::None);
        let mut remote = None;
        // In virtual time an async op that asked for a later device time
        // completes then (its stream in flight until), like a fixed-length op.
        let async_end = match &plan {
            Plan::Async(t) if !sh.real_time() && *t > now => Some(*t),
            _ => None,
        };
        match plan {
            Plan::Skip => result = Err(String::new()),
            Plan::Now(r) => {
                result = r;
                match &mut op.body {
                    // In real time the model's clock moves only between passes:
                    // a record stamps the wall clock it ran at.
                    Body::Record { stamp } => stamp.store(stamp_at(sh, now), Ordering::Release),
                    Body::Host(f) => {
                        if let Some(f) = f.take() {
                            result = op::catch_user(|| "host callback".into(), f);
                        }
                    }
                    _ => {}
                }
            }
            Plan::Engine(e) => {
                self.take(sh, e);
                engine = e;
            }
            Plan::Peer(e, other, k, i) => {
                self.take(sh, e);
                other.set_copy_busy(k, i, true);
                remote = Some((other, k, i));
                engine = e;
            }
            Plan::Async(_) => {
                if let Body::Async(a) = &op.body {
                    // SAFETY: the holder of the sim lock holds every stream.
                    result = unsafe { a.take_result() };
                }
            }
        }
        let (mut transfer, end) = match engine {
            Engine::None => (None, async_end.unwrap_or(now)),
            _ => {
                let at = (stream.id, stream.queue as u32, pos + 1);
                let (transfer, end, r) = self.start(sh, engine, &op, now, at);
                result = r;
                (transfer, end)
            }
        };
        if let Some(span) = op.span() {
            span.stamp_start(stamp_at(sh, now));
        }
        let mut merged = Vec::new();
        if let (Some(t), Engine::Copy(k, i), true) = (&mut transfer, engine, result.is_ok()) {
            merge_run(sh, stream, &op, (k, i), t, &mut merged);
        }
        let run = Running {
            stream: stream.clone(),
            op,
            value: pos + 1,
            engine,
            start: now,
            end,
            transfer,
            result,
            seq,
            merged,
            remote,
        };
        if engine == Engine::None && async_end.is_none() {
            self.completed_at_start = true;
            self.complete(sh, run);
        } else {
            stream.served.in_flight.store(true, Ordering::Relaxed);
            self.running.push(run);
        }
        true
    }

    fn free_copy(&self, sh: &Shared, kind: CopyKind) -> Option<Engine> {
        let k = kind as usize;
        sh.free_copy_engine(k).map(|i| Engine::Copy(k, i))
    }

    /// As many free compute units as the grid can use (at least one).
    fn free_units(&self, blocks: u32) -> Option<Engine> {
        let first = self.compute_free.iter().position(|&f| f)?;
        let run = self.compute_free[first..]
            .iter()
            .take_while(|&&f| f)
            .count()
            .min(blocks as usize)
            .max(1);
        Some(Engine::Compute(first, run))
    }

    fn take(&mut self, sh: &Shared, e: Engine) {
        self.mark(sh, e, false);
    }

    fn mark(&mut self, sh: &Shared, e: Engine, free: bool) {
        match e {
            Engine::Copy(k, i) => sh.set_copy_busy(k, i, !free),
            Engine::Compute(first, n) => {
                for f in &mut self.compute_free[first..first + n] {
                    *f = free;
                }
            }
            Engine::None => {}
        }
    }

    /// Starts `op` on `engine` at `now`: its data effect now; returns its
    /// transfer (for copies over the link), its end (for the others) and its
    /// result so far. `at` is the op's stream, queue and value (for the
    /// profile of a graph's nodes).
    fn start(
        &self,
        sh: &Shared,
        engine: Engine,
        op: &Op,
        now: u64,
        at: (u64, u32, u64),
    ) -> (Option<Transfer>, u64, Result<(), String>) {
        if let Some(peer) = dma::peer_copy(sh, op) {
            return match peer {
                Ok((dir, wire, bytes)) => {
                    let t = Transfer {
                        dir,
                        setup_until: now + wire.link.setup_ns,
                        remaining: bytes,
                        floor: now,
                        peer: Some(wire.enter()),
                    };
                    (Some(t), now, Ok(()))
                }
                Err(fault) => (None, now, Err(fault)),
            };
        }
        if let Engine::Copy(k, i) = engine {
            match dma::plan(sh, (k as u8, i as u32), op) {
                // A fault: refused before any byte moved.
                Some(Err(fault)) => return (None, now, Err(fault)),
                Some(Ok(p)) => {
                    dma::move_bytes(sh, op, p.host, &p.segment_hosts);
                    return match p.dir {
                        Some(dir) => {
                            let t = Transfer {
                                dir,
                                setup_until: now + p.setup_ns,
                                remaining: p.wire_bytes,
                                floor: now + p.floor_ns,
                                peer: None,
                            };
                            (Some(t), now, Ok(()))
                        }
                        None => (None, now + p.floor_ns, Ok(())),
                    };
                }
                None => {}
            }
        }
        match &op.body {
            Body::Kernel {
                kernel,
                blocks,
                args,
                ..
            } => {
                let units = match engine {
                    Engine::Compute(_, n) => n,
                    _ => 1,
                };
                let started = std::time::Instant::now();
                let (name, f) = (kernel.name, kernel.host());
                let mut result = Ok(());
                for b in 0..*blocks {
                    let mut block = Block::new(b, *blocks, args, sh.reach);
                    let r = op::catch_user(
                        || format!("kernel '{name}' in block {b}"),
                        || f(&mut block),
                    );
                    if result.is_ok() {
                        result = r;
                    }
                }
                let measured = started.elapsed().as_nanos() as u64;
                let modelled = match kernel.cost_for(sh.emu.class) {
                    Some(cost) => cost_ns(sh, cost(crate::Grid::new(*blocks)), units),
                    None if sh.real_time() => Ok(measured),
                    None => {
                        let bytes: usize = args.as_slice_iter().map(|a| a.storage.bytes()).sum();
                        let cost = KernelCost {
                            flops: 0.0,
                            bytes: bytes as f64,
                        };
                        cost_ns(sh, cost, units)
                    }
                };
                let modelled = modelled.map_err(|e| format!("kernel '{name}': {e}"));
                let (end, result) = modelled_end(now, modelled, result);
                (None, end, result)
            }
            Body::Graph(l) => {
                let (first, units) = match engine {
                    Engine::Compute(first, n) => (first, n),
                    _ => (0, 1),
                };
                let started = std::time::Instant::now();
                let run = crate::exec::graph::run::RunState::take(&l.exec);
                let result = run.run_all(l, &mut InSimUser);
                let traced = crate::exec::clock::profiling().then(|| NodeTrace {
                    at,
                    from: now + KERNEL_LAUNCH_NS,
                    submit_ns: op.submit_ns,
                    first_unit: first,
                });
                let mut modelled = model_graph(sh, l, units, traced, &run);
                run.give_back(&l.exec);
                if let (true, Ok(m)) = (sh.real_time(), &mut modelled) {
                    *m = (*m).max(started.elapsed().as_nanos() as u64);
                }
                let (end, result) = modelled_end(now, modelled, result);
                (None, end, result)
            }
            _ => (None, now, Ok(())),
        }
    }

    /// Completes an op: profile, digest, release its buffers, then the timeline.
    fn complete(&mut self, sh: &Shared, r: Running) {
        let end = self.now;
        let engine_code = match r.engine {
            Engine::None => 0,
            Engine::Copy(k, i) => 1 + (k as u64) * 64 + i as u64,
            Engine::Compute(first, n) => 1000 + (first as u64) * 64 + n as u64,
        };
        self.hash = fnv(
            self.hash,
            &[
                r.stream.id,
                r.value,
                kind_code(&r.op.body),
                engine_code,
                r.start,
                end,
                u64::from(r.result.is_err()),
            ],
        );
        sh.publish_hash(self.hash);
        if crate::exec::clock::profiling() {
            record(&r, end);
        }
        for (m, v) in &r.merged {
            if crate::exec::clock::profiling() {
                record_merged(&r, m, *v, end);
            }
        }
        if let (Some(span), Ok(())) = (r.op.span(), &r.result) {
            span.stamp_end(stamp_at(sh, end));
        }
        let Running {
            stream,
            op,
            value,
            result,
            merged,
            ..
        } = r;
        drop(op);
        complete_on(&stream.timeline, value, result);
        for (m, v) in merged {
            drop(m);
            stream.timeline.complete(v);
        }
        self.tick += 1;
        stream
            .served
            .last_served
            .store(self.tick, Ordering::Relaxed);
    }
}

/// What a record (or a stamped launch) at model time `now` stamps: `now` in
/// virtual time; in real time, where the model's clock moves only between
/// passes, the wall clock it ran at.
fn stamp_at(sh: &Shared, now: u64) -> u64 {
    if sh.real_time() {
        sh.now_ns().max(now)
    } else {
        now
    }
}

fn complete_on(timeline: &Timeline, value: u64, result: Result<(), String>) {
    match result {
        Ok(()) => timeline.complete(value),
        Err(m) => timeline.fail(value, Arc::from(m)),
    }
}

/// Coalescing: takes the copies queued right behind `first` on `stream` that
/// may join its descriptor chain (same direction, small, within the stream's
/// window), runs their effects in order and adds their bytes to `t`.
fn merge_run(
    sh: &Shared,
    stream: &EmuStream,
    first: &Op,
    (k, i): (usize, usize),
    t: &mut Transfer,
    merged: &mut Vec<(Op, u64)>,
) {
    let Some((max_bytes, window)) = stream.coalescing() else {
        return;
    };
    let kind = match &first.body {
        // (A peer copy is no host-link descriptor chain: it merges nothing.)
        Body::Copy {
            kind,
            bytes,
            src,
            dst,
            ..
        } if *bytes <= max_bytes && src.device == dst.device => *kind,
        _ => return,
    };
    while merged.len() + 1 < window {
        // SAFETY: the holder of the sim lock is the only consumer of every ring.
        let joins = unsafe {
            stream
                .ring
                .peek_with(|op, _| dma::joins_run(sh, (k as u8, i as u32), op, kind, max_bytes))
        };
        let Some(Some((wire, stall, host))) = joins else {
            return;
        };
        // SAFETY: as above; `peek_with` saw the op.
        let Some((op, pos)) = (unsafe { stream.ring.pop() }) else {
            return;
        };
        dma::move_bytes(sh, &op, Some(host), &[]);
        t.remaining += wire;
        t.setup_until += stall;
        merged.push((op, pos + 1));
    }
}

/// The longest a modelled kernel may take, ns (2^52: 52 days): past it the
/// kernel faults, where its time as a `u64` would have saturated and the
/// device's clock wrapped (the clock's reach is `CLOCK_MAX_NS`).
pub(super) const KERNEL_MAX_NS: u64 = 1 << 52;

/// The device clock's reach, ns (2^62: 146 years): an op that would end
/// past it faults instead, so the clock never wraps.
const CLOCK_MAX_NS: u64 = 1 << 62;

/// Modelled duration of a kernel on `units` compute units, ns; an error for
/// a cost that is not a number of at least zero, or whose time (the
/// device's slowdown included) is past `KERNEL_MAX_NS`.
pub(super) fn cost_ns(sh: &Shared, cost: KernelCost, units: usize) -> Result<u64, String> {
    let KernelCost { flops, bytes } = cost;
    // (Written so that NaN fails too.)
    if !(flops >= 0.0 && bytes >= 0.0) {
        return Err(format!(
            "its cost ({flops:e} flops, {bytes:e} bytes) is not a count; give finite counts of at \
             least zero (Kernel::with_cost)"
        ));
    }
    let compute = flops / (sh.emu.flops_per_unit * units.max(1) as f64) * 1e9;
    let memory = bytes / sh.emu.link.memory_gbps;
    let slowdown = f64::from_bits(sh.slowdown.load(std::sync::atomic::Ordering::Relaxed));
    let ns = (compute.max(memory) * slowdown).ceil();
    if ns <= KERNEL_MAX_NS as f64 {
        Ok(ns as u64)
    } else {
        Err(format!(
            "its cost ({flops:e} flops, {bytes:e} bytes) models {:.3e} s on this device (slowdown \
             {slowdown:e}), past the {} days a modelled kernel may take; give a smaller cost or \
             slowdown",
            ns / 1e9,
            KERNEL_MAX_NS / 86_400_000_000_000
        ))
    }
}

/// A kernel's (or graph's) end on the device clock from its modelled time,
/// and its result: a time not modelled (`modelled`'s error), or an end past
/// the clock's reach, faults the op at its launch instead.
fn modelled_end(
    now: u64,
    modelled: Result<u64, String>,
    result: Result<(), String>,
) -> (u64, Result<(), String>) {
    let launched = now + KERNEL_LAUNCH_NS;
    let end = modelled.and_then(|m| {
        launched
            .checked_add(m)
            .filter(|&end| end <= CLOCK_MAX_NS)
            .ok_or_else(|| {
                format!(
                    "the device's clock would pass {} years (it is at {now} ns, the op takes \
                     {m} ns); make a new device",
                    CLOCK_MAX_NS / 31_557_600_000_000_000
                )
            })
    });
    match end {
        Ok(end) => (end, result),
        // The kernel's own fault, if any, first.
        Err(e) => (launched, result.and(Err(e))),
    }
}

/// User code of a graph node in the simulation.
struct InSimUser;

/// (The model records the nodes, at their modelled times.)
impl crate::exec::graph::launch::NodeHooks for InSimUser {}
