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
mod engine;
mod graph;
mod iommu;
mod memory;
mod points;
mod stream;

pub use iommu::{IommuStats, IotlbCounts};

use super::{Backend, BackendStream, DeviceProperties};
use crate::config::emu::{EmuConfig, TimeMode};
use crate::config::{CompletionMode, DeviceConfig};
use crate::exec::park::Parker;
use crate::exec::ring::Ring;
use crate::exec::storage::{MemoryKind, Storage};
use crate::exec::timeline::{Driver, Timeline};
use crate::{Error, Result};
use crossbeam_utils::CachePadded;
use engine::Sim;
use memory::{Arena, ArenaChunks};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use stream::EmuStream;

/// Real time: the driver waits for a modelled completion nearer than this
/// awake (spinning, then yielding its core), not parked. Waking a parked
/// thread costs about 100 µs on a busy 2-core VM (scheduler latency; timer
/// slack without `set_current_timer_slack`), more than a whole pipeline stage
/// of a small transfer; a spin hand-off costs well under a microsecond. A
/// farther completion is slept for until `SPIN_NS / 2` before it.
const SPIN_NS: u64 = 200_000;
/// The first part of such a wait only spins (see `spin_until`).
const SPIN_ONLY_NS: u64 = 50_000;
/// Real time: an idle driver waits awake this long for the next submission
/// before it parks (the host backend's engines and waits do the same with
/// `CompletionMode::DEFAULT_SPIN`): a program that waits and then submits its
/// next step finds the device awake.
const IDLE_SPIN_NS: u64 = 200_000;

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
    pub(crate) emu: EmuConfig,
    config: DeviceConfig,
    sim: Mutex<Sim>,
    pub(crate) streams: super::StreamList<EmuStream>,
    next_stream: AtomicU64,
    /// The device clock and the driver's doorbell (see `Doorbell`).
    pub(crate) bell: Arc<Doorbell>,
    hash: AtomicU64,
    shutdown: AtomicBool,
    /// This device context's page table and I/O TLB.
    pub(crate) iommu: Arc<iommu::Iommu>,
}

impl Shared {
    /// Copy engines per direction (H2D, D2H, D2D).
    pub(crate) fn copy_engines(&self) -> [usize; 3] {
        self.config.copy_engines
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

    /// Runs the model (virtual time) until `ready()` or nothing more can happen.
    fn run_virtual(&self, ready: &mut dyn FnMut() -> bool) -> Result<bool> {
        if engine::in_sim() {
            return Err(Error::WouldDeadlock(
                "a kernel or host callback on the emulated device waits for that device's \
                 work, which cannot run before the callback returns; wait outside the callback"
                    .into(),
            ));
        }
        let mut sim = self.sim.lock().unwrap_or_else(|p| p.into_inner());
        let _inside = engine::InSim::enter();
        loop {
            let progressed = sim.dispatch(self);
            if ready() {
                return Ok(true);
            }
            match sim.next_event(&self.emu.link) {
                Some(t) => sim.advance_to(self, t),
                None if progressed => {}
                None => return Ok(false),
            }
        }
    }

    /// One event of progress (a host poll in virtual time).
    fn step_virtual(&self) {
        if engine::in_sim() {
            return;
        }
        let Ok(mut sim) = self.sim.try_lock() else {
            return;
        };
        let _inside = engine::InSim::enter();
        if !sim.dispatch(self) {
            if let Some(t) = sim.next_event(&self.emu.link) {
                sim.advance_to(self, t);
                sim.dispatch(self);
            }
        }
    }

    /// The real-time driver thread's loop.
    fn run_real(self: &Arc<Self>) {
        // The device's engine: what runs here must not wait for the device.
        crate::exec::thread::mark_engine_thread();
        let _inside = engine::InSim::enter();
        crate::exec::timeline::set_engine_wait(refuse_wait);
        // Its long waits end close to their deadline: without this a timed
        // park may oversleep by the default 50 µs of timer slack.
        let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1_000));
        // When the model last had work or a submission came: an idle driver
        // stays awake `IDLE_SPIN_NS` after it, so the next op submitted right
        // after a wait (a program's next step) does not wait for a wake-up.
        let (mut busy_at, mut last_seen) = (0u64, u64::MAX);
        loop {
            let seen = self.bell.pending.load(Ordering::Acquire);
            let next = {
                let mut sim = self.sim.lock().unwrap_or_else(|p| p.into_inner());
                // Catch the model up with the wall clock, event by event (rates
                // change only at events), starting what became ready on the way.
                let wall = self.now_ns();
                let mut dispatched = false;
                while let Some(t) = sim.next_event(&self.emu.link) {
                    if t > wall {
                        break;
                    }
                    sim.advance_to(self, t);
                    sim.dispatch(self);
                    dispatched = true;
                }
                // Ops submitted since the last look start now (the ones that
                // became ready at an event started then, above).
                if !dispatched || self.bell.pending.load(Ordering::Acquire) != seen {
                    sim.advance_to(self, wall);
                    sim.dispatch(self);
                }
                if self.shutdown.load(Ordering::Acquire) && sim.idle() && self.drained() {
                    return;
                }
                (sim.next_event(&self.emu.link), sim.polling())
            };
            let now = self.now_ns();
            if next.0.is_some() || seen != last_seen {
                (busy_at, last_seen) = (now, seen);
            }
            match next {
                (Some(t), _) if t <= now => continue,
                (None, false) if now - busy_at < IDLE_SPIN_NS => {
                    self.spin_until(busy_at + IDLE_SPIN_NS, seen)
                }
                // A modelled completion soon: wait for it awake (see `SPIN_NS`).
                (Some(t), _) if t - now <= SPIN_NS => self.spin_until(t, seen),
                // A far one: sleep until shortly before it, then wait awake. An
                // async op polled and not done completes without a submission:
                // look again after at most `async_poll`.
                (next, polling) => {
                    let far = next.map(|t| t - now - SPIN_NS / 2);
                    let poll = polling.then(|| self.config.async_poll.as_nanos() as u64);
                    match far.into_iter().chain(poll).min() {
                        Some(ns) => self.bell.wake.park_until(
                            || self.bell.pending.load(Ordering::Acquire) != seen,
                            Some(Duration::from_nanos(ns)),
                        ),
                        None => self.bell.wake.park_until(
                            || {
                                self.bell.pending.load(Ordering::Acquire) != seen
                                    || self.shutdown.load(Ordering::Acquire)
                            },
                            Some(Duration::from_millis(50)),
                        ),
                    }
                }
            }
        }
    }

    /// Waits awake until the wall clock reaches `t` or a submission comes:
    /// spins for up to `SPIN_ONLY_NS`, then yields the core between looks (a
    /// yield on a busy machine may hand the core away for a whole time slice,
    /// longer than a short wait itself).
    fn spin_until(&self, t: u64, seen: u64) {
        let from = self.now_ns();
        loop {
            let now = self.now_ns();
            if now >= t
                || self.bell.pending.load(Ordering::Acquire) != seen
                || self.shutdown.load(Ordering::Acquire)
            {
                return;
            }
            if now - from < SPIN_ONLY_NS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    fn drained(&self) -> bool {
        self.streams.all(|s| s.ring.is_empty())
    }
}

/// A wait made by the real-time driver thread (a callback inside the model):
/// the device cannot progress while it waits, so it is refused unless already met.
fn refuse_wait(
    _timeline: &Timeline,
    _value: u64,
    what: &'static str,
    ready: &mut dyn FnMut() -> bool,
) -> Result<()> {
    if ready() {
        return Ok(());
    }
    Err(Error::WouldDeadlock(format!(
        "{what} from a kernel or host callback on the emulated device: the device cannot \
         progress until the callback returns; wait outside the callback"
    )))
}

impl crate::exec::clock::DeviceClock for Shared {
    fn now_ns(&self) -> u64 {
        Shared::now_ns(self)
    }
}

impl Driver for Shared {
    fn drive(&self, ready: &mut dyn FnMut() -> bool) -> Result<bool> {
        self.run_virtual(ready)
    }

    fn poll(&self) {
        self.step_virtual();
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
            sim: Mutex::new(Sim::new(config.copy_engines, config.compute_units)),
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
            shutdown: AtomicBool::new(false),
            iommu,
            emu: emu.clone(),
            config: config.clone(),
        });
        pool.set_stream_points(Arc::new(points::Points {
            shared: Arc::downgrade(&shared),
        }));
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

    fn create_stream(&self, priority: u8) -> Result<Arc<dyn BackendStream>> {
        let sh = &self.shared;
        let id = sh.next_stream.fetch_add(1, Ordering::Relaxed);
        let timeline = Arc::new(Timeline::new(sh.device, id, sh.config.host_wait));
        if let Some(driver) = self.virtual_driver() {
            timeline.set_driver(driver);
        }
        let stream = Arc::new(EmuStream {
            id,
            timeline,
            ring: Ring::with_capacity(sh.config.ring_capacity),
            priority: AtomicU8::new(priority),
            queue: (id as usize - 1) % sh.config.hardware_queues,
            closed: AtomicBool::new(false),
            in_flight: AtomicBool::new(false),
            last_served: AtomicU64::new(0),
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
                if let Some(st) = Storage::unique(&mut s) {
                    let addr = self.arena.device_address(st.ptr());
                    st.set_device_memory(addr);
                }
                Ok(s)
            }
            MemoryKind::Pinned => {
                let mut s = Storage::pinned(self.shared.device, &self.pinned, bytes)?;
                // The device reaches it by its I/O virtual address (its chunk
                // was mapped when pinned); an empty buffer is never reached.
                if let Some(iova) = self.shared.iommu.iova_of(s.ptr()) {
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

    fn iommu_stats(&self) -> Option<crate::IommuStats> {
        Some(self.shared.iommu.stats())
    }

    fn inline_copy_max(&self) -> usize {
        self.shared.emu.inline_copy_max
    }
}
