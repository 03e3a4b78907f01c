//! The host backend: the CPU as a device.
//!
//! Engines are logical. A small set of engine threads (one per compute unit) runs
//! every kind of operation; a copy occupies one of its direction's copy engines (a
//! slot in a bitmask) while an engine thread performs it, a kernel block occupies the
//! engine that runs it. On a 2-core machine this keeps the thread count at the core
//! count: idle engines cost no thread, and nothing spins against the work.
//!
//! Invariants (who owns what):
//! - A stream belongs to one hardware queue for its life. At most one operation per
//!   hardware queue is in flight; the engine that wins `QueueState` (CAS) is the
//!   only consumer of the rings of that queue's streams until it clears the flag.
//!   Hence each stream runs in submission order, one op at a time.
//! - A stream whose oldest op is not ready (an unmet event wait, a busy copy engine,
//!   a buffer another stream holds) is skipped: the flag is released at once and
//!   other streams, on the same queue or not, are dispatched. No head-of-line stall.
//! - The thread that completes an op releases its locks and engine, drops the op
//!   (its buffer clones), then advances the timeline, then clears `busy`, then wakes
//!   an idle engine if one sleeps (see `park` for why no wake-up is lost).
//! - Among ready streams the lowest effective priority wins; effective priority
//!   improves by one level per `AGING_TICKS` dispatches a stream waits, so low
//!   priority work always progresses.

mod callback;
mod claim;
mod dispatch;
mod engine;
mod graph;
mod hw_queue;
mod kernel_job;
mod stream;

use super::{Backend, BackendStream, DeviceProperties};
use crate::config::{CompletionMode, DeviceConfig};
use crate::exec::park::Parker;
use crate::exec::ring::Ring;
use crate::exec::storage::{MemoryKind, Storage};
use crate::exec::timeline::Timeline;
use crate::{Error, Result};
use callback::{become_engine, leave_engine};
use crossbeam_utils::CachePadded;
use engine::EngineThread;
use graph::GraphSlot;
use hw_queue::{HwQueue, QueueState};
use kernel_job::JobSlot;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use stream::HostStream;

struct Shared {
    device: u64,
    config: DeviceConfig,
    queues: Box<[HwQueue]>,
    streams: super::StreamList<HostStream>,
    /// Free copy engines per direction, one bit each.
    copy_free: [CachePadded<AtomicU32>; 3],
    idle: Arc<Parker>,
    shutdown: AtomicBool,
    tick: CachePadded<AtomicU64>,
    /// One multi-block kernel slot per hardware queue (kernel_job.rs).
    jobs: Box<[JobSlot]>,
    job_count: AtomicU32,
    /// One graph-launch slot per hardware queue (backend/host/graph.rs), and how many
    /// hold a job.
    graph_slots: Box<[GraphSlot]>,
    graph_count: AtomicU32,
    next_stream: AtomicU64,
    /// Engines that finished starting up (`HostBackend::new` waits for all).
    started: AtomicUsize,
    /// Async ops submitted and not yet completed: while any are, parked engines
    /// wake every `async_poll` to poll them, and engines running kernel blocks
    /// poll them between blocks (engine.rs).
    async_queued: AtomicUsize,
    /// `config.placement_wait` in ns (engine.rs, `EngineThread::defers`).
    placement_wait_ns: u64,
    /// Per engine: asleep in `park`, or about to be. Written only by that
    /// engine, read by others deciding whether to leave it an op (`defers`).
    parked: Box<[CachePadded<AtomicBool>]>,
}

impl super::HasStreams for Shared {
    type Stream = HostStream;
    fn stream_list(&self) -> &super::StreamList<HostStream> {
        &self.streams
    }
}

pub(crate) struct HostBackend {
    shared: Arc<Shared>,
    engines: Mutex<Vec<JoinHandle<()>>>,
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
                    state: Arc::new(QueueState::new()),
                    streams: AtomicUsize::new(0),
                })
                .collect(),
            streams: super::StreamList::new(),
            copy_free: [
                mask(config.copy_engines[0]),
                mask(config.copy_engines[1]),
                mask(config.copy_engines[2]),
            ],
            idle: Arc::new(Parker::new()),
            shutdown: AtomicBool::new(false),
            tick: CachePadded::new(AtomicU64::new(0)),
            jobs: (0..config.hardware_queues)
                .map(|_| JobSlot::new())
                .collect(),
            job_count: AtomicU32::new(0),
            graph_slots: (0..config.hardware_queues)
                .map(|_| GraphSlot::default())
                .collect(),
            graph_count: AtomicU32::new(0),
            next_stream: AtomicU64::new(1),
            started: AtomicUsize::new(0),
            async_queued: AtomicUsize::new(0),
            placement_wait_ns: config.placement_wait.as_nanos() as u64,
            parked: (0..config.compute_units)
                .map(|_| CachePadded::new(AtomicBool::new(false)))
                .collect(),
            config: config.clone(),
        });
        // The pool learns where streams stand from their timelines; weakly, so
        // that the pool does not keep the engines' state alive.
        pool.set_stream_points(super::Points::new(&shared));
        let props = DeviceProperties {
            name: format!("host ({} compute units)", config.compute_units),
            backend: "host",
            compute_units: config.compute_units,
            copy_engines: config.copy_engines,
            hardware_queues: config.hardware_queues,
            link_peak_gbps: None,
            runs_device_code: false,
            queue_priority: None,
            graph_rebinds_in_place: true,
        };
        let mut engines = Vec::with_capacity(config.compute_units);
        for index in 0..config.compute_units {
            let sh = shared.clone();
            // Built here, so that whatever it allocates is allocated before the
            // device is handed out, not whenever the thread first runs.
            let engine = EngineThread::new(index as u32);
            let handle = std::thread::Builder::new()
                .name(format!("hetero-engine{index}"))
                .spawn(move || {
                    become_engine(&sh, index as u32);
                    if sh.config.pin_engines {
                        crate::system::pin_to_nth_allowed_cpu(index);
                    }
                    sh.started.fetch_add(1, Ordering::Release);
                    engine.run(&sh);
                    leave_engine();
                })
                .map_err(|e| Error::Setup(format!("could not start an engine thread: {e}")))?;
            engines.push(handle);
        }
        // A device is ready when its engines are: their start-up (pinning, thread
        // state) is then over before any work, and never lands inside it.
        let backoff = crossbeam_utils::Backoff::new();
        while shared.started.load(Ordering::Acquire) < config.compute_units {
            backoff.snooze();
        }
        Ok(HostBackend {
            shared,
            engines: Mutex::new(engines),
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

    fn create_stream(
        &self,
        priority: u8,
        capacity: Option<usize>,
    ) -> Result<Arc<dyn BackendStream>> {
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
            timeline: Arc::new(Timeline::new(sh.device, id, sh.config.host_wait)),
            ring: Ring::with_capacity(capacity.unwrap_or(sh.config.ring_capacity)),
            priority: AtomicU8::new(priority),
            queue,
            closed: AtomicBool::new(false),
            queue_state: sh.queues[queue].state.clone(),
            wait_hint: AtomicU64::new(0),
            defer_until: AtomicU64::new(0),
            defer_unit: AtomicU32::new(0),
            blocked_on: AtomicU64::new(0),
            blocked_at: AtomicU64::new(0),
            last_served: CachePadded::new(AtomicU64::new(sh.tick.load(Ordering::Relaxed))),
            idle: sh.idle.clone(),
            shared: Arc::downgrade(sh),
            host_wait: sh.config.host_wait,
        });
        sh.streams.add(stream.clone());
        Ok(stream)
    }

    fn allocate(&self, kind: MemoryKind, bytes: usize, stream: u64) -> Result<Arc<Storage>> {
        match kind {
            MemoryKind::Device => {
                Storage::device_arc(self.shared.device, &self.pool, bytes, stream)
            }
            MemoryKind::Pinned => Storage::pinned_arc(self.shared.device, &self.pinned, bytes),
        }
    }

    fn pool(&self) -> &Arc<hetero_memory::DevicePool> {
        &self.pool
    }

    fn pinned_pool(&self) -> &hetero_memory::PinnedPool {
        &self.pinned
    }

    fn fault_scopes(&self) -> bool {
        true
    }

    fn synchronize(&self) -> Result<()> {
        let points = self
            .shared
            .streams
            .map(|s| (s.timeline.clone(), s.submitted()));
        super::wait_all(points, self.shared.config.host_wait)
    }

    fn shutdown(&self) {
        let _ = self.synchronize();
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.idle.wake(u32::MAX);
        let engines = std::mem::take(&mut *self.engines.lock().unwrap_or_else(|p| p.into_inner()));
        for w in engines {
            let _ = w.join();
        }
        // Recycled storages may keep the pool itself alive (exec/storage/reuse.rs); what it
        // caches goes back to the OS now.
        self.pool.trim();
    }

    fn kick(&self) {
        self.shared.idle.wake(u32::MAX);
    }

    fn held_by_running_op(&self, storage: &Storage) -> bool {
        callback::storage_held_here(storage)
    }

    fn host_wait(&self) -> CompletionMode {
        self.shared.config.host_wait
    }
}
