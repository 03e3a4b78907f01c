//! The `emu` backend: an emulated discrete accelerator. It has its own memory
//! (`memory.rs`: a reserved range of fixed capacity, device addresses that are
//! not host pointers), DMA copy engines over a modelled link (`link.rs`: setup
//! latency, per-direction bandwidth, packet efficiency, duplex share; what each
//! DMA costs in `dma.rs`), an IOMMU through which it reaches host memory
//! (`iommu.rs`: a page table per device, an I/O TLB), compute units with rates,
//! and one discrete-event engine model (`engine.rs`).
//!
//! Two drivers run that model:
//! - **virtual time**: nothing runs until a host thread waits. The wait drives
//!   the simulation on the waiting thread (`Driver`): dispatch, jump the clock to
//!   the next completion, complete, repeat, until the point waited for is
//!   reached. The same program gives the same trace (`trace_hash`).
//! - **real time**: a driver thread runs the model against the wall clock. It
//!   waits for a modelled completion less than `SPIN_NS` away awake (spinning,
//!   then yielding), for a farther one parked until shortly before it, and for
//!   a submission parked (burning no core). Host waits park on the timelines as
//!   on the host backend.
//!
//! Data moves and kernels run in both modes (on the driving thread), so results
//! are checked as on any device. Invariants: only the holder of the `sim` lock
//! consumes the streams' rings; a callback running inside the simulation that
//! would wait for the device gets `Error::WouldDeadlock`, never a hang.

mod dma;
mod driver;
mod engine;
mod graph;
mod group;
mod iommu;
mod memory;
mod stream;

pub(crate) use group::join;
pub use iommu::{IommuStats, IotlbCounts};

use super::{Backend, BackendStream, DeviceProperties};
use crate::config::emu::{EmuConfig, TimeMode};
use crate::config::{CompletionMode, DeviceConfig};
use crate::exec::park::Parker;
use crate::exec::ring::Ring;
use crate::exec::storage::{MemoryKind, Reach, Storage};
use crate::exec::timeline::{Driver, Timeline};
use crate::{Error, Result};
use crossbeam_utils::CachePadded;
use engine::Sim;
use memory::{Arena, ArenaChunks};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;
use stream::EmuStream;

/// What a submitting thread touches of its device: the device clock and the
/// driver's doorbell. Kept apart from `Shared` (and its `Arc` counts), whose
/// fields the simulation reads on every step, so that a submitter on another
/// core never writes a cache line the driver reads.
pub(crate) struct Doorbell {
    time: TimeMode,
    start: Instant,
    /// The device clock in virtual time, ns.
    clock: CachePadded<AtomicU64>,
    /// Submissions so far (real time: the driver looks when it changes).
    pending: CachePadded<AtomicU64>,
    /// The real-time driver parks here between events.
    wake: Parker,
}

impl Doorbell {
    /// The device clock, ns: virtual, or wall ns since the device started.
    pub(crate) fn now_ns(&self) -> u64 {
        match self.time {
            TimeMode::Virtual => self.clock.load(Ordering::Acquire),
            TimeMode::Real => self.start.elapsed().as_nanos() as u64,
        }
    }

    /// A submission happened: the real-time driver looks.
    pub(crate) fn ring(&self) {
        if self.time == TimeMode::Real {
            self.pending.fetch_add(1, Ordering::Release);
            self.wake.wake(1);
        }
    }
}

pub(crate) struct Shared {
    device: u64,
    /// How the engines reach the device's memory: its arena.
    pub(crate) reach: Reach,
    pub(crate) emu: EmuConfig,
    config: DeviceConfig,
    sim: Mutex<Sim>,
    pub(crate) streams: super::StreamList<EmuStream>,
    next_stream: AtomicU64,
    /// The device clock and the driver's doorbell (see `Doorbell`).
    pub(crate) bell: Arc<Doorbell>,
    hash: AtomicU64,
    /// A factor on kernels' modelled time (f64 bits; 1.0): a device that
    /// slows down or speeds up while it runs (`Device::set_emu_slowdown`).
    pub(crate) slowdown: AtomicU64,
    /// Moves whenever a stream's priority changes: dispatch orders the
    /// streams again before its next start (a priority set by an op's user
    /// code takes effect at the next operation boundary).
    pub(crate) priorities: AtomicU64,
    shutdown: AtomicBool,
    /// This device context's page table and I/O TLB.
    pub(crate) iommu: Arc<iommu::Iommu>,
    /// The emulated devices of this device's context, once it joined one.
    pub(crate) group: std::sync::OnceLock<Arc<group::Group>>,
    /// Per direction (H2D, D2H, D2D), which copy engines are busy (bit per
    /// engine). Here, not in the model, because a peer copy started in the
    /// model of another device of the context takes one of this device's
    /// engines too; written only by whoever runs a model (the model's lock,
    /// and in a context the group's lock, make that one thread at a time).
    pub(crate) copy_busy: [std::sync::atomic::AtomicU64; 3],
}

impl super::HasStreams for Shared {
    type Stream = EmuStream;
    fn stream_list(&self) -> &super::StreamList<EmuStream> {
        &self.streams
    }
    fn clock_ns(&self) -> u64 {
        self.now_ns()
    }
}

impl Shared {
    /// Copy engines per direction (H2D, D2H, D2D).
    pub(crate) fn copy_engines(&self) -> [usize; 3] {
        self.config.copy_engines
    }

    /// The first free copy engine of direction `k`, if any.
    pub(crate) fn free_copy_engine(&self, k: usize) -> Option<usize> {
        let busy = self.copy_busy[k].load(Ordering::Relaxed);
        (0..self.config.copy_engines[k].min(64)).find(|i| busy & (1 << i) == 0)
    }

    /// Marks copy engine `i` of direction `k` busy or free.
    pub(crate) fn set_copy_busy(&self, k: usize, i: usize, busy: bool) {
        if busy {
            self.copy_busy[k].fetch_or(1 << i, Ordering::Relaxed);
        } else {
            self.copy_busy[k].fetch_and(!(1 << i), Ordering::Relaxed);
        }
    }

    pub(crate) fn real_time(&self) -> bool {
        self.emu.time == TimeMode::Real
    }

    /// The device clock, ns.
    pub(crate) fn now_ns(&self) -> u64 {
        self.bell.now_ns()
    }

    pub(crate) fn publish_now(&self, now: u64) {
        if self.bell.time == TimeMode::Virtual {
            self.bell.clock.store(now, Ordering::Release);
        }
    }

    pub(crate) fn publish_hash(&self, h: u64) {
        self.hash.store(h, Ordering::Release);
    }

    /// A submission happened: the real-time driver looks.
    pub(crate) fn submitted(&self) {
        self.bell.ring();
    }
}

/// The emulated device's configuration, if `backend` is one (the task
/// layer's link and rate figures).
pub(crate) fn config_of(backend: &dyn Backend) -> Option<EmuConfig> {
    let emu = backend.as_any()?.downcast_ref::<EmuBackend>()?;
    Some(emu.shared.emu.clone())
}

/// Sets the factor on the modelled time of `backend`'s kernels from the
/// next kernel to start; false if it is not an emulated device.
pub(crate) fn set_slowdown(backend: &dyn Backend, factor: f64) -> bool {
    match backend
        .as_any()
        .and_then(|a| a.downcast_ref::<EmuBackend>())
    {
        Some(emu) => {
            emu.shared
                .slowdown
                .store(factor.to_bits(), Ordering::Relaxed);
            true
        }
        None => false,
    }
}

pub(crate) struct EmuBackend {
    shared: Arc<Shared>,
    props: DeviceProperties,
    arena: Arc<Arena>,
    pool: Arc<hetero_memory::DevicePool>,
    pinned: hetero_memory::PinnedPool,
    driver: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl EmuBackend {
    /// The device as a `Driver`, in virtual time: what a host that waits or
    /// polls runs the model through.
    fn virtual_driver(&self) -> Option<Weak<dyn Driver>> {
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        (self.shared.emu.time == TimeMode::Virtual).then_some(weak as Weak<dyn Driver>)
    }

    pub(crate) fn new(device: u64, config: DeviceConfig, emu: EmuConfig) -> Result<Self> {
        config.validate()?;
        emu.validate().map_err(Error::InvalidArgument)?;
        let arena = Arc::new(Arena::new(emu.capacity)?);
        let pool_config = match &config.pool {
            Some(p) => p.clone(),
            None => hetero_memory::PoolConfig::from_env()?,
        };
        // The device's memory ends at its capacity: the pool reports out of
        // memory with its figures there, and never falls back to host memory.
        let limit = pool_config.max_reserved.min(emu.capacity);
        let pool = Arc::new(hetero_memory::DevicePool::with_source(
            pool_config.max_reserved(limit),
            Arc::new(ArenaChunks(arena.clone())),
        )?);
        // Pinned chunks are mapped into the device's IOMMU once, when pinned.
        let iommu = Arc::new(iommu::Iommu::new(emu.iotlb_entries, emu.iommu_page_max));
        let os = hetero_memory::HostChunkSource::new(hetero_memory::HostOptions {
            huge_pages: config.pinned.huge_pages,
            pin: true,
            refuse_mlock: config.pinned.refuse_mlock,
            ..hetero_memory::HostOptions::default()
        });
        let pinned = hetero_memory::PinnedPool::with_source(
            config.pinned.clone(),
            Arc::new(iommu::IommuChunks {
                os: Arc::new(os),
                iommu: iommu.clone(),
            }),
        )?;
        let shared = Arc::new(Shared {
            device,
            sim: Mutex::new(Sim::new(config.compute_units)),
            streams: super::StreamList::new(),
            next_stream: AtomicU64::new(1),
            bell: Arc::new(Doorbell {
                time: emu.time,
                start: Instant::now(),
                clock: CachePadded::new(AtomicU64::new(0)),
                pending: CachePadded::new(AtomicU64::new(0)),
                wake: Parker::new(),
            }),
            hash: AtomicU64::new(0),
            slowdown: AtomicU64::new(1.0f64.to_bits()),
            priorities: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            iommu,
            group: std::sync::OnceLock::new(),
            copy_busy: Default::default(),
            reach: arena.reach(),
            emu: emu.clone(),
            config: config.clone(),
        });
        pool.set_stream_points(super::Points::new(&shared));
        // Records about this device's memory are stamped with its clock.
        let weak: Weak<Shared> = Arc::downgrade(&shared);
        let clock: Weak<dyn crate::exec::clock::DeviceClock> = weak;
        crate::exec::clock::set_device_clock(device, clock);
        let time = match emu.time {
            TimeMode::Real => "real time",
            TimeMode::Virtual => "virtual time",
        };
        let props = DeviceProperties {
            name: format!(
                "emu {} ({time}, {} compute units, {} GiB)",
                emu.link.name,
                config.compute_units,
                emu.capacity >> 30
            ),
            backend: "emu",
            compute_units: config.compute_units,
            copy_engines: config.copy_engines,
            hardware_queues: config.hardware_queues,
            link_peak_gbps: Some(emu.link.peak_gbps()),
            runs_device_code: false,
            queue_priority: None,
            graph_rebinds_in_place: true,
        };
        let driver = match emu.time {
            TimeMode::Virtual => None,
            TimeMode::Real => {
                let sh = shared.clone();
                Some(
                    std::thread::Builder::new()
                        .name("hetero-emu-driver".into())
                        .spawn(move || sh.run_real())
                        .map_err(|e| {
                            Error::Setup(format!("could not start the emu driver thread: {e}"))
                        })?,
                )
            }
        };
        Ok(EmuBackend {
            shared,
            props,
            arena,
            pool,
            pinned,
            driver: Mutex::new(driver),
        })
    }
}

impl Backend for EmuBackend {
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
        let timeline = Arc::new(Timeline::new(sh.device, id, sh.config.host_wait));
        if let Some(driver) = self.virtual_driver() {
            timeline.set_driver(driver);
        }
        let stream = Arc::new(EmuStream {
            id,
            timeline,
            ring: Ring::with_capacity(capacity.unwrap_or(sh.config.ring_capacity)),
            priority: AtomicU8::new(priority),
            queue: (id as usize - 1) % sh.config.hardware_queues,
            closed: AtomicBool::new(false),
            served: CachePadded::default(),
            shared: Arc::downgrade(sh),
            bell: sh.bell.clone(),
            host_wait: sh.config.host_wait,
            coalesce_max: AtomicU64::new(0),
            coalesce_window: AtomicU64::new(0),
        });
        sh.streams.add(stream.clone());
        Ok(stream)
    }

    fn allocate(&self, kind: MemoryKind, bytes: usize, stream: u64) -> Result<Arc<Storage>> {
        match kind {
            MemoryKind::Device => {
                let mut s = Storage::device_arc(self.shared.device, &self.pool, bytes, stream)?;
                // Fresh from the pool, the storage holds the arena's host
                // address; it keeps the device address only (a warm
                // storage this thread kept already does).
                if let Some(st) = Storage::unique(&mut s).filter(|st| st.host_visible()) {
                    let addr = self.arena.device_address(st.host_ptr());
                    st.set_device_memory(addr);
                }
                Ok(s)
            }
            MemoryKind::Pinned => {
                let mut s = Storage::pinned(self.shared.device, &self.pinned, bytes)?;
                // The device reaches it by its I/O virtual address (its chunk
                // was mapped when pinned); an empty buffer is never reached.
                if let Some(iova) = self.shared.iommu.iova_of(s.host_ptr()) {
                    s.set_device_address(iova);
                }
                // A host polling the buffer (`as_slice` refused) steps the model.
                if let Some(driver) = self.virtual_driver() {
                    s.set_driver(driver);
                }
                Ok(Arc::new(s))
            }
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
            .map(|s| (s.timeline.clone(), s.ring.tail()));
        super::wait_all(points, self.shared.config.host_wait)
    }

    fn shutdown(&self) {
        let _ = self.synchronize();
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.bell.wake.wake(u32::MAX);
        let driver = self.driver.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(d) = driver {
            let _ = d.join();
        }
        self.pool.trim();
    }

    fn host_wait(&self) -> CompletionMode {
        self.shared.config.host_wait
    }

    fn now_ns(&self) -> u64 {
        self.shared.now_ns()
    }

    fn kick(&self) {
        self.shared.submitted();
    }

    fn kicks(&self) -> bool {
        // (`Doorbell::ring` does nothing in virtual time.)
        self.shared.emu.time == TimeMode::Real
    }

    fn trace_hash(&self) -> Option<u64> {
        (self.shared.emu.time == TimeMode::Virtual)
            .then(|| self.shared.hash.load(Ordering::Acquire))
    }

    fn register_host(&self, ptr: *const u8, bytes: usize) -> (u64, Box<dyn FnOnce() + Send>) {
        let locked = super::lock_host(ptr, bytes);
        // Nothing says what backs a user's memory: 4 KiB pages.
        let iova = self.shared.iommu.map(ptr, bytes, 4096);
        let iommu = self.shared.iommu.clone();
        let host = ptr as usize;
        let undo = move || {
            iommu.unmap(host as *const u8);
            super::unlock_host(locked);
        };
        (iova, Box::new(undo))
    }

    fn map_host(&self, ptr: *const u8, bytes: usize) -> Option<(u64, Box<dyn FnOnce() + Send>)> {
        let iova = self.shared.iommu.map(ptr, bytes, 4096);
        let iommu = self.shared.iommu.clone();
        let host = ptr as usize;
        Some((
            iova,
            Box::new(move || {
                iommu.unmap(host as *const u8);
            }),
        ))
    }

    fn iommu_stats(&self) -> Option<crate::IommuStats> {
        Some(self.shared.iommu.stats())
    }

    fn inline_copy_max(&self) -> usize {
        self.shared.emu.inline_copy_max
    }

    fn reach(&self) -> Reach {
        self.shared.reach
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}
