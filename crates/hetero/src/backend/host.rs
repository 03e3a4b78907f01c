//! The host backend: the CPU as a device.
//!
//! Engines are logical. A small set of worker threads (one per compute unit) runs
//! every kind of operation; a copy occupies one of its direction's copy engines (a
//! slot in a bitmask) while a worker performs it, a kernel block occupies the
//! worker that runs it. On a 2-core machine this keeps the thread count at the core
//! count: idle engines cost no thread, and nothing spins against the work.
//!
//! Invariants (who owns what):
//! - A stream belongs to one hardware queue for its life. At most one operation per
//!   hardware queue is in flight; the worker that wins `HwQueue::busy` (CAS) is the
//!   only consumer of the rings of that queue's streams until it clears the flag.
//!   Hence each stream runs in submission order, one op at a time.
//! - A stream whose oldest op is not ready (an unmet event wait, a busy copy engine,
//!   a buffer another stream holds) is skipped: the flag is released at once and
//!   other streams, on the same queue or not, are dispatched. No head-of-line stall.
//! - The thread that completes an op releases its locks and engine, drops the op
//!   (its buffer clones), then advances the timeline, then clears `busy`, then wakes
//!   an idle worker if one sleeps (see `park` for why no wake-up is lost).
//! - Among ready streams the lowest effective priority wins; effective priority
//!   improves by one level per `AGING_TICKS` dispatches a stream waits, so low
//!   priority work always progresses.

use super::{Backend, DeviceProperties, StreamQueue};
use crate::buffer::{MemoryKind, Storage};
use crate::config::{CompletionMode, DeviceConfig};
use crate::kernel::Block;
use crate::op::{self, Body, Op};
use crate::park::{spin_for, Parker};
use crate::ring::Ring;
use crate::timeline::Timeline;
use crate::{Error, Result};
use crossbeam_utils::CachePadded;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// `HwQueue::busy`: no op of the queue is being claimed or run.
const IDLE: u8 = 0;
/// An engine holds the queue while it looks at its streams' oldest ops; it may find
/// none ready and release it without running anything (so a submitter that sees
/// this state must not count on it).
const CLAIMING: u8 = 1;
/// An op of the queue is in flight; the engine that completes it looks for work
/// right after (`Shared::finish`).
const RUNNING: u8 = 2;

/// Dispatches a waiting stream sits through before its priority improves a level.
/// A priority-7 stream facing continuous priority-0 work runs after (7 + 1) × this.
const AGING_TICKS: u64 = 16;

struct HwQueue {
    /// Shared with the queue's streams, whose submitters read it.
    busy: Arc<CachePadded<AtomicU8>>,
    streams: AtomicUsize,
}

struct Shared {
    device: u64,
    config: DeviceConfig,
    queues: Box<[HwQueue]>,
    streams: Mutex<Vec<Arc<HostStream>>>,
    generation: AtomicU64,
    /// Free copy engines per direction, one bit each.
    copy_free: [CachePadded<AtomicU32>; 3],
    idle: Arc<Parker>,
    shutdown: AtomicBool,
    tick: CachePadded<AtomicU64>,
    jobs: Mutex<Vec<Arc<KernelJob>>>,
    job_count: AtomicU32,
    next_stream: AtomicU64,
}

pub(crate) struct HostStream {
    id: u64,
    timeline: Arc<Timeline>,
    ring: Ring<Op>,
    priority: AtomicU8,
    queue: usize,
    closed: AtomicBool,
    /// What the oldest op waits for, packed by `wait_hint_of` (0: unknown). Set and
    /// cleared only by the engine holding the queue; a hint to skip the stream
    /// without claiming the queue (claiming a stream that cannot run, again and
    /// again, holds the queue: an engine preempted there stalls it for a time slice).
    wait_hint: AtomicU64,
    /// The hardware queue's in-flight flag.
    queue_busy: Arc<CachePadded<AtomicU8>>,
    /// Written by engines at every completion: on its own line, away from the
    /// fields submitters read.
    last_served: CachePadded<AtomicU64>,
    idle: Arc<Parker>,
    shared: Weak<Shared>,
    host_wait: CompletionMode,
}

/// A kernel with more than one block, published so idle workers can help.
struct KernelJob {
    /// Taken by the thread that finishes the last block.
    op: UnsafeCell<Option<Op>>,
    stream: Arc<HostStream>,
    value: u64,
    blocks: u32,
    next: AtomicU32,
    done: AtomicU32,
    panic: Mutex<Option<String>>,
    ran: Ran,
}

// SAFETY: `op` is read (shared) by block runners while `done < blocks`, and taken
// only by the thread whose `done.fetch_add` (AcqRel) finished the last block, after
// which no runner reads it: runners that claim an index `>= blocks` never touch it.
unsafe impl Sync for KernelJob {}
// SAFETY: every field is Send (Op is Send).
unsafe impl Send for KernelJob {}

#[derive(Clone, Copy)]
enum Engine {
    None,
    Copy(usize, u32),
    Compute,
}

/// Work a worker has claimed (moved, never boxed: claiming must not allocate).
#[allow(clippy::large_enum_variant)]
enum Work {
    /// A stream's oldest op, popped with its queue claimed; `engine` is `None` when
    /// the stream failed earlier and the op is to be skipped.
    Op {
        stream: Arc<HostStream>,
        op: Op,
        value: u64,
        engine: Option<Engine>,
    },
    /// Blocks of a running multi-block kernel.
    Help(Arc<KernelJob>),
}

/// The pool's [`hetero_memory::StreamFences`]: a fence at the current end of a
/// stream. Lock order: the pool's lock, then `streams` (nothing holding `streams`
/// calls into the pool).
#[derive(Debug)]
struct HostFences {
    shared: std::sync::Weak<Shared>,
}

impl hetero_memory::StreamFences for HostFences {
    fn record(&self, stream: u64) -> Arc<dyn hetero_memory::Fence> {
        let found = self.shared.upgrade().and_then(|sh| {
            let list = sh.streams.lock().unwrap_or_else(|p| p.into_inner());
            list.iter()
                .find(|s| s.id == stream)
                .map(|s| (s.timeline.clone(), s.submitted()))
        });
        // A stream no longer listed was released after its work completed.
        let (timeline, value) = found.unwrap_or_else(|| (Arc::new(Timeline::new(0, stream)), 0));
        Arc::new(crate::event::TimelineFence { timeline, value })
    }
}

enum Readiness {
    NotReady,
    /// The stream failed earlier: drop the op without running it.
    Skip,
    Ready(Engine),
}

pub(crate) struct HostBackend {
    shared: Arc<Shared>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    props: DeviceProperties,
    /// Device memory: the host backend's chunks come from the OS layer.
    pool: Arc<hetero_memory::DevicePool>,
    pinned: hetero_memory::PinnedPool,
}

impl HostBackend {
    pub(crate) fn new(device: u64, config: DeviceConfig) -> Result<Self> {
        config.validate()?;
        let pool_config = match &config.pool {
            Some(p) => p.clone(),
            None => hetero_memory::PoolConfig::from_env()?,
        };
        let pool = Arc::new(hetero_memory::DevicePool::new(pool_config)?);
        let pinned = hetero_memory::PinnedPool::new(config.pinned.clone())?;
        let mask = |n: usize| CachePadded::new(AtomicU32::new(((1u64 << n) - 1) as u32));
        let shared = Arc::new(Shared {
            device,
            queues: (0..config.hardware_queues)
                .map(|_| HwQueue {
                    busy: Arc::new(CachePadded::new(AtomicU8::new(IDLE))),
                    streams: AtomicUsize::new(0),
                })
                .collect(),
            streams: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            copy_free: [
                mask(config.copy_engines[0]),
                mask(config.copy_engines[1]),
                mask(config.copy_engines[2]),
            ],
            idle: Arc::new(Parker::new()),
            shutdown: AtomicBool::new(false),
            tick: CachePadded::new(AtomicU64::new(0)),
            jobs: Mutex::new(Vec::new()),
            job_count: AtomicU32::new(0),
            next_stream: AtomicU64::new(1),
            config: config.clone(),
        });
        // The pool learns where streams stand from their timelines; weakly, so
        // that the pool does not keep the engines' state alive.
        pool.set_stream_fences(Arc::new(HostFences {
            shared: Arc::downgrade(&shared),
        }));
        let props = DeviceProperties {
            name: format!("host ({} compute units)", config.compute_units),
            backend: "host",
            compute_units: config.compute_units,
            copy_engines: config.copy_engines,
            hardware_queues: config.hardware_queues,
        };
        let mut workers = Vec::with_capacity(config.compute_units);
        for index in 0..config.compute_units {
            let sh = shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("hetero-cu{index}"))
                .spawn(move || {
                    super::mark_engine_thread();
                    if sh.config.pin_engines {
                        pin_to_nth_allowed_cpu(index);
                    }
                    Worker::new(index as u32).run(&sh)
                })
                .map_err(|e| Error::Setup(format!("could not start worker thread: {e}")))?;
            workers.push(handle);
        }
        Ok(HostBackend {
            shared,
            workers: Mutex::new(workers),
            props,
            pool,
            pinned,
        })
    }
}

impl Backend for HostBackend {
    fn properties(&self) -> &DeviceProperties {
        &self.props
    }

    fn create_stream(&self, priority: u8) -> Result<Arc<dyn StreamQueue>> {
        let sh = &self.shared;
        let id = sh.next_stream.fetch_add(1, Ordering::Relaxed);
        // Least-loaded hardware queue, lowest index first.
        let queue = sh
            .queues
            .iter()
            .enumerate()
            .min_by_key(|(_, q)| q.streams.load(Ordering::Relaxed))
            .map(|(i, _)| i)
            .unwrap_or(0);
        sh.queues[queue].streams.fetch_add(1, Ordering::Relaxed);
        let stream = Arc::new(HostStream {
            id,
            timeline: Arc::new(Timeline::new(sh.device, id)),
            ring: Ring::with_capacity(sh.config.ring_capacity),
            priority: AtomicU8::new(priority),
            queue,
            closed: AtomicBool::new(false),
            queue_busy: sh.queues[queue].busy.clone(),
            wait_hint: AtomicU64::new(0),
            last_served: CachePadded::new(AtomicU64::new(sh.tick.load(Ordering::Relaxed))),
            idle: sh.idle.clone(),
            shared: Arc::downgrade(sh),
            host_wait: sh.config.host_wait,
        });
        let mut list = sh.streams.lock().unwrap_or_else(|p| p.into_inner());
        list.push(stream.clone());
        sh.generation.fetch_add(1, Ordering::Release);
        Ok(stream)
    }

    fn allocate(&self, kind: MemoryKind, bytes: usize, stream: u64) -> Result<Storage> {
        match kind {
            MemoryKind::Device => Storage::device(self.shared.device, &self.pool, bytes, stream),
            MemoryKind::Pinned => Storage::pinned(self.shared.device, &self.pinned, bytes),
        }
    }

    fn pool(&self) -> &Arc<hetero_memory::DevicePool> {
        &self.pool
    }

    fn pinned_pool(&self) -> &hetero_memory::PinnedPool {
        &self.pinned
    }

    fn synchronize(&self) -> Result<()> {
        let streams = self
            .shared
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut first = None;
        for s in streams {
            let target = s.submitted();
            if let Err(e) = s.timeline.wait(target, self.shared.config.host_wait) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn shutdown(&self) {
        let _ = self.synchronize();
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.idle.wake(u32::MAX);
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|p| p.into_inner()));
        for w in workers {
            let _ = w.join();
        }
    }

    fn host_wait(&self) -> CompletionMode {
        self.shared.config.host_wait
    }
}

impl StreamQueue for HostStream {
    fn id(&self) -> u64 {
        self.id
    }

    fn timeline(&self) -> &Arc<Timeline> {
        &self.timeline
    }

    #[inline]
    fn submit(&self, op: Op) -> Result<u64> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(Error::StreamDestroyed { stream: self.id });
        }
        // The first try moves `op` straight into the ring (no copy kept for a
        // retry); a full ring hands it back to the slow path.
        match self.ring.try_push(op) {
            Ok(pos) => Ok(self.published(pos)),
            Err(back) => self.submit_when_full(back),
        }
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
        if let Some(sh) = self.shared.upgrade() {
            let mut list = sh.streams.lock().unwrap_or_else(|p| p.into_inner());
            list.retain(|s| s.id != self.id);
            sh.generation.fetch_add(1, Ordering::Release);
            sh.queues[self.queue]
                .streams
                .fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl HostStream {
    /// After the op at ring position `pos` is published: wakes an engine if none
    /// is bound to look; returns the op's timeline value.
    #[inline(always)]
    fn published(&self, pos: u64) -> u64 {
        // While an op of this queue is in flight, the engine running it looks for
        // work when it completes and will see this op: waking another engine, a
        // syscall that costs tens of µs in a VM, would buy nothing. The fence
        // orders the op's publication (the slot's sequence store, after the tail
        // CAS) before our look at the queue state; it pairs with the fence in
        // `Shared::finish`. (Without it x86 may read the state before the store
        // drains from the store buffer: the wake-up hunt in tests/wakeups.rs
        // caught exactly that.)
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.queue_busy.load(Ordering::Relaxed) != RUNNING {
            self.idle.wake_one_if_idle_fenced();
        }
        pos + 1
    }

    /// Backpressure: waits for the oldest op to complete, then tries again.
    #[cold]
    fn submit_when_full(&self, mut op: Op) -> Result<u64> {
        loop {
            self.idle.wake_one_if_idle();
            let oldest = self.ring.head() + 1;
            let _ = self.timeline.wait(oldest, self.host_wait);
            match self.ring.try_push(op) {
                Ok(pos) => return Ok(self.published(pos)),
                Err(back) => op = back,
            }
        }
    }

    /// Base priority minus one level per `AGING_TICKS` dispatches waited. It may go
    /// below 0, so a starving stream eventually beats even priority-0 work that a
    /// worker would otherwise keep running (ties go to the stream just run).
    fn effective_priority(&self, tick: u64) -> i64 {
        let base = i64::from(self.priority.load(Ordering::Relaxed));
        let waited = tick.saturating_sub(self.last_served.load(Ordering::Relaxed)) / AGING_TICKS;
        base - waited.min(1 << 20) as i64
    }
}

impl Shared {
    fn acquire_copy_engine(&self, kind: usize) -> Option<u32> {
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

    fn release_engine(&self, engine: Engine) {
        if let Engine::Copy(kind, bit) = engine {
            self.copy_free[kind].fetch_or(1 << bit, Ordering::Release);
        }
    }

    /// Decides whether the stream's oldest op can start, taking its engine and buffer
    /// locks if so.
    fn readiness(&self, stream: &HostStream, op: &Op) -> Readiness {
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
            Body::Kernel { .. } => {
                if op.try_acquire_access() {
                    Readiness::Ready(Engine::Compute)
                } else {
                    Readiness::NotReady
                }
            }
            Body::Host(_) | Body::Marker { .. } => Readiness::Ready(Engine::None),
        }
    }

    fn ready_with_engine(&self, op: &Op, kind: usize) -> Readiness {
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

    /// Completes the op at `value` of `stream`; see the module invariants for order.
    fn finish(
        &self,
        stream: &HostStream,
        op: Op,
        value: u64,
        engine: Engine,
        result: Result<(), String>,
        ran: Ran,
    ) {
        if crate::clock::profiling() {
            record(stream, &op, value, engine, ran, result.is_err());
        }
        // Buffer locks are held exactly when an engine was taken (copies, fills, kernels).
        if !matches!(engine, Engine::None) {
            op.release_access();
        }
        self.release_engine(engine);
        drop(op);
        match result {
            Ok(()) => stream.timeline.complete(value),
            Err(m) => stream.timeline.fail(value, Arc::from(m)),
        }
        let t = self.tick.fetch_add(1, Ordering::Relaxed);
        stream.last_served.store(t + 1, Ordering::Relaxed);
        // No wake here: this worker looks for work next, and wakes another if it
        // finds more than it can take (`Worker::claim`). Until that look it counts
        // as searching, so a submitter that sees the queue idle in this gap does
        // not wake a sleeper for work this worker is about to take.
        self.idle.begin_search_unbounded();
        LOOKING.with(|l| l.set(true));
        self.queues[stream.queue]
            .busy
            .store(IDLE, Ordering::Release);
        // Pairs with the submitter's fence: either it sees the queue idle (and wakes
        // an engine if needed) or our next look for work sees its op.
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}

thread_local! {
    /// Set by `Shared::finish`: this engine counts as searching until its next look
    /// for work (`Worker::run`).
    static LOOKING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

const HINT_VALUE_BITS: u32 = 44;

/// `(stream, value)` of a wait op packed in one word (so it is read untorn), or
/// `None` when the op is not a wait or the numbers do not fit.
fn wait_hint_of(op: &Op) -> Option<u64> {
    match &op.body {
        Body::Wait {
            timeline, value, ..
        } if timeline.stream < (1 << (64 - HINT_VALUE_BITS))
            && *value < (1 << HINT_VALUE_BITS)
            && timeline.stream != 0 =>
        {
            Some(timeline.stream << HINT_VALUE_BITS | value)
        }
        _ => None,
    }
}

/// Whether the point a hint names is still ahead (a stream not in `streams` is
/// treated as reached: claim and look).
fn blocked(streams: &[Arc<HostStream>], hint: u64) -> bool {
    let (id, value) = (hint >> HINT_VALUE_BITS, hint & ((1 << HINT_VALUE_BITS) - 1));
    streams
        .iter()
        .find(|s| s.id == id)
        .is_some_and(|s| !s.timeline.is_reached(value))
}

/// Pins the calling thread to the `n`-th CPU (modulo) this process may run on, so
/// that compute units stay spread one per core: left to the OS, two engines of a
/// 2-core VM were seen queued on one vCPU while the other idled. Best effort: if
/// the affinity cannot be read or set, the thread floats as before.
fn pin_to_nth_allowed_cpu(n: usize) {
    let Ok(allowed) = rustix::thread::sched_getaffinity(None) else {
        return;
    };
    let cpus: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| allowed.is_set(c))
        .collect();
    if cpus.len() < 2 {
        return;
    }
    let mut one = rustix::thread::CpuSet::new();
    one.set(cpus[n % cpus.len()]);
    if let Err(e) = rustix::thread::sched_setaffinity(None, &one) {
        tracing::debug!("could not pin engine {n}: {e}");
    }
}

/// Who ran an op and when it started; `start_ns` is 0 when profiling is off.
#[derive(Clone, Copy)]
struct Ran {
    unit: u32,
    start_ns: u64,
}

fn record(stream: &HostStream, op: &Op, value: u64, engine: Engine, ran: Ran, failed: bool) {
    use hetero_trace::{EngineKind as E, OpKind as K};
    let copy_index = match engine {
        Engine::Copy(_, bit) => bit,
        _ => 0,
    };
    let (kind, eng, index, dep) = match &op.body {
        Body::Copy { kind, .. } => match kind {
            crate::CopyKind::H2D => (K::H2D, E::CopyH2D, copy_index, None),
            crate::CopyKind::D2H => (K::D2H, E::CopyD2H, copy_index, None),
            crate::CopyKind::D2D => (K::D2D, E::CopyD2D, copy_index, None),
        },
        Body::Fill { .. } => (K::Fill, E::CopyD2D, copy_index, None),
        Body::Kernel { .. } => (K::Kernel, E::Compute, ran.unit, None),
        Body::Host(_) => (K::HostFn, E::Host, ran.unit, None),
        Body::Wait {
            timeline, value, ..
        } => (K::Wait, E::Host, ran.unit, Some((timeline.stream, *value))),
        Body::Marker { .. } => (K::Marker, E::Host, ran.unit, None),
    };
    let end_ns = crate::clock::now_ns();
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
    });
}

struct Worker {
    index: u32,
    streams: Vec<Arc<HostStream>>,
    generation: u64,
    candidates: Vec<(i64, u8, u64, usize)>,
    /// The stream of the last op this worker ran.
    last_stream: u64,
    /// The last claim left other streams' ready work behind.
    more: bool,
    /// The last claim skipped a non-empty stream whose queue another engine was
    /// claiming (its verdict may be stale).
    contended: bool,
}

impl Worker {
    fn new(index: u32) -> Self {
        Worker {
            index,
            streams: Vec::new(),
            generation: u64::MAX,
            candidates: Vec::new(),
            last_stream: 0,
            more: false,
            contended: false,
        }
    }

    fn run(mut self, sh: &Shared) {
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
    fn search(&mut self, sh: &Shared, budget: Option<Duration>) -> Option<Work> {
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
        let mut poll = || {
            found = self.claim(sh);
            found.is_some() || sh.shutdown.load(Ordering::SeqCst)
        };
        match (budget, sh.config.engine_idle) {
            (Some(b), _) => {
                spin_for(b, &mut poll);
            }
            (None, CompletionMode::Yield) => {
                while !poll() {
                    std::thread::yield_now();
                }
            }
            (None, _) => {
                while !poll() {
                    std::hint::spin_loop();
                }
            }
        }
        sh.idle.end_search();
        found
    }

    /// Parks until work can be claimed (or shutdown). The thread counts as a sleeper
    /// only while it looks for work, never while it runs it: submitters and
    /// completers then pay the futex wake only when someone really sleeps.
    fn park(&mut self, sh: &Shared) {
        let claimed = sh.idle.park_for(|| loop {
            match self.claim(sh) {
                Some(w) => return Some(Some(w)),
                // Another engine was looking at a queue we skipped: it may have
                // judged an op not ready just before the op it waits for completed
                // (and the completer skipped that queue as held). Look again once
                // it let go rather than sleep on a stale verdict.
                None if self.contended => crate::loom::spin_hint(),
                None => return sh.shutdown.load(Ordering::SeqCst).then_some(None),
            }
        });
        if let Some(work) = claimed {
            self.execute(sh, work);
        }
    }

    /// After claiming: if more work is ready than this thread takes, make sure
    /// another engine looks at it.
    fn chain_wake(&self, sh: &Shared, more: bool) {
        if more {
            sh.idle.wake_one_if_idle();
        }
    }

    fn all_drained(&mut self, sh: &Shared) -> bool {
        self.refresh(sh);
        self.streams.iter().all(|s| s.ring.is_empty()) && sh.job_count.load(Ordering::SeqCst) == 0
    }

    fn refresh(&mut self, sh: &Shared) {
        let g = sh.generation.load(Ordering::Acquire);
        if g != self.generation {
            let list = sh.streams.lock().unwrap_or_else(|p| p.into_inner());
            self.streams.clear();
            self.streams.extend(list.iter().cloned());
            self.generation = g;
        }
    }

    /// Finds and takes one unit of work: blocks of a running kernel, or the oldest op
    /// of the most urgent ready stream (its queue stays claimed until it completes).
    fn claim(&mut self, sh: &Shared) -> Option<Work> {
        if sh.job_count.load(Ordering::Acquire) > 0 {
            if let Some(job) = self.find_kernel(sh) {
                return Some(Work::Help(job));
            }
        }
        self.refresh(sh);
        self.contended = false;
        let tick = sh.tick.load(Ordering::Relaxed);
        self.candidates.clear();
        for (i, s) in self.streams.iter().enumerate() {
            // The queue flag first: it changes once per op, while the ring's tail
            // changes at every submission (reading it costs the submitter a miss).
            let state = sh.queues[s.queue].busy.load(Ordering::Acquire);
            if state != IDLE || s.ring.is_empty() {
                self.contended |= state == CLAIMING && !s.ring.is_empty();
                continue;
            }
            let hint = s.wait_hint.load(Ordering::Acquire);
            if hint != 0 && blocked(&self.streams, hint) {
                continue;
            }
            let served = s.last_served.load(Ordering::Relaxed);
            // Within a priority level, keep running the stream this worker just ran:
            // its next op is often ready at once (a chain of dependent ops on the
            // critical path), and continuing costs no wake-up anywhere.
            let affinity = u8::from(s.id != self.last_stream);
            self.candidates
                .push((s.effective_priority(tick), affinity, served, i));
        }
        if self.candidates.is_empty() {
            return None;
        }
        self.candidates.sort_unstable();
        for k in 0..self.candidates.len() {
            let stream = self.streams[self.candidates[k].3].clone();
            let queue = &sh.queues[stream.queue];
            if let Err(state) =
                queue
                    .busy
                    .compare_exchange(IDLE, CLAIMING, Ordering::Acquire, Ordering::Relaxed)
            {
                self.contended |= state == CLAIMING;
                continue;
            }
            if let Some(work) = self.try_claim(sh, &stream) {
                queue.busy.store(RUNNING, Ordering::Relaxed);
                self.more = k + 1 < self.candidates.len();
                return Some(work);
            }
            queue.busy.store(IDLE, Ordering::Release);
        }
        None
    }

    /// With the stream's queue claimed: takes its oldest op if it is ready.
    fn try_claim(&mut self, sh: &Shared, stream: &Arc<HostStream>) -> Option<Work> {
        // SAFETY: the caller holds the stream's hardware-queue claim, which makes this
        // thread the ring's only consumer.
        let decision = unsafe {
            stream
                .ring
                .peek_with(|op, _| (sh.readiness(stream, op), wait_hint_of(op)))
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
            Some((Readiness::Skip, _)) => None,
            Some((Readiness::Ready(e), _)) => Some(e),
        };
        // SAFETY: as above; `peek_with` saw the value, so `pop` returns it.
        let (op, pos) = unsafe { stream.ring.pop() }.expect("peeked op is still there");
        stream.wait_hint.store(0, Ordering::Relaxed);
        Some(Work::Op {
            stream: stream.clone(),
            op,
            value: pos + 1,
            engine,
        })
    }

    fn execute(&mut self, sh: &Shared, work: Work) {
        let more = std::mem::take(&mut self.more);
        self.chain_wake(sh, more);
        let (stream, mut op, value, engine) = match work {
            Work::Help(job) => return run_blocks(sh, &job),
            Work::Op {
                stream,
                op,
                value,
                engine,
            } => (stream, op, value, engine),
        };
        let stream = &stream;
        self.last_stream = stream.id;
        let start_ns = if crate::clock::profiling() {
            crate::clock::now_ns()
        } else {
            0
        };
        let ran = Ran {
            unit: self.index,
            start_ns,
        };
        let Some(engine) = engine else {
            sh.finish(stream, op, value, Engine::None, Err(String::new()), ran);
            return;
        };
        let result = match &mut op.body {
            Body::Copy { .. } | Body::Fill { .. } => {
                op::run_transfer(&op.body);
                Ok(())
            }
            Body::Wait {
                timeline,
                value: v,
                fault,
            } => match timeline.error_for(*v).filter(|_| *fault) {
                Some(e) => Err(format!(
                    "waited on an event of stream {}, which failed: {e}",
                    timeline.stream
                )),
                None => Ok(()),
            },
            Body::Marker { stamp } => {
                stamp.store(crate::clock::now_ns(), Ordering::Release);
                Ok(())
            }
            Body::Host(f) => match f.take() {
                Some(f) => catch_unwind(AssertUnwindSafe(f))
                    .map_err(|p| format!("host callback panicked: {}", op::panic_message(&*p))),
                None => Ok(()),
            },
            Body::Kernel { blocks, .. } if *blocks > 1 => {
                let blocks = *blocks;
                self.start_job(sh, stream, op, value, blocks, ran);
                return;
            }
            Body::Kernel { kernel, args, .. } => {
                let (name, f) = (kernel.name, &kernel.f);
                let mut block = Block::new(0, 1, args);
                catch_unwind(AssertUnwindSafe(|| f(&mut block))).map_err(|p| {
                    format!(
                        "kernel '{name}' panicked in block 0: {}",
                        op::panic_message(&*p)
                    )
                })
            }
        };
        sh.finish(stream, op, value, engine, result, ran);
    }

    fn start_job(
        &mut self,
        sh: &Shared,
        stream: &Arc<HostStream>,
        op: Op,
        value: u64,
        blocks: u32,
        ran: Ran,
    ) {
        let job = Arc::new(KernelJob {
            op: UnsafeCell::new(Some(op)),
            stream: stream.clone(),
            value,
            blocks,
            next: AtomicU32::new(0),
            done: AtomicU32::new(0),
            panic: Mutex::new(None),
            ran,
        });
        sh.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(job.clone());
        sh.job_count.fetch_add(1, Ordering::Release);
        let helpers = (sh.config.compute_units as u32 - 1).min(blocks - 1);
        if helpers > 0 {
            sh.idle.wake(helpers);
        }
        run_blocks(sh, &job);
    }

    fn find_kernel(&mut self, sh: &Shared) -> Option<Arc<KernelJob>> {
        let jobs = sh.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.iter()
            .find(|j| j.next.load(Ordering::Relaxed) < j.blocks)
            .cloned()
    }
}

/// Claims and runs blocks of `job` until none are left; the thread that finishes the
/// last block completes the op.
fn run_blocks(sh: &Shared, job: &Arc<KernelJob>) {
    loop {
        let b = job.next.fetch_add(1, Ordering::Relaxed);
        if b >= job.blocks {
            return;
        }
        // SAFETY: `done < blocks` while this block runs (it is not counted yet), so
        // the op is still in place and only read (see `KernelJob`'s Sync note).
        let op = unsafe { (*job.op.get()).as_ref() }.expect("op present while blocks run");
        if let Body::Kernel { kernel, args, .. } = &op.body {
            let (name, f) = (kernel.name, &kernel.f);
            let mut block = Block::new(b, job.blocks, args);
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(&mut block))) {
                let msg = format!(
                    "kernel '{name}' panicked in block {b}: {}",
                    op::panic_message(&*p)
                );
                job.panic
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(msg);
            }
        }
        if job.done.fetch_add(1, Ordering::AcqRel) + 1 == job.blocks {
            complete_job(sh, job);
            return;
        }
    }
}

fn complete_job(sh: &Shared, job: &Arc<KernelJob>) {
    {
        let mut jobs = sh.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.retain(|j| !Arc::ptr_eq(j, job));
    }
    sh.job_count.fetch_sub(1, Ordering::Release);
    // SAFETY: every block has finished (`done == blocks`, AcqRel chain), so no
    // runner reads the op any more; this thread is the only one that got here.
    let op = unsafe { (*job.op.get()).take() }.expect("job op taken once");
    let result = match job.panic.lock().unwrap_or_else(|p| p.into_inner()).take() {
        Some(m) => Err(m),
        None => Ok(()),
    };
    sh.finish(&job.stream, op, job.value, Engine::Compute, result, job.ran);
}
