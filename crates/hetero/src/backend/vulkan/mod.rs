//! The Vulkan backend: a real device API, through `hetero-vulkan` (a thin
//! layer over `ash`, which loads `libvulkan.so.1` at run time). Kernels run
//! as device code (WGSL or SPIR-V); memory is the device's own; completions
//! are the device's timeline semaphore.
//!
//! Files (twins of the other backends where roles match): `mod.rs` the device
//! and its `Shared` state, `stream.rs` the backend stream, `engine.rs` the
//! thread that takes ops, flushes and submits (`record.rs` an op's device work,
//! `complete.rs` a flight's completion), `graph.rs` graph launches (their
//! nodes recorded into the engine's flight), `memory.rs` the pools' chunk
//! sources (the pool's stream points are every backend's `backend::Points`).
//!
//! Invariants: only the engine thread records, submits, and completes ops;
//! streams only push to their rings and ring the bell. Every `Chunk` and
//! command buffer holds the `Gpu` it came from, so the device is destroyed
//! last.

mod callback;
mod complete;
mod engine;
mod graph;
mod memory;
mod record;
mod stream;

use crate::backend::{Backend, BackendStream, DeviceProperties};
use crate::config::{CompletionMode, DeviceConfig};
use crate::exec::park::Parker;
use crate::exec::ring::Ring;
use crate::exec::storage::{MemoryKind, Storage};
use crate::exec::timeline::Timeline;
use crate::{Error, Result};
use memory::Chunks;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
pub(crate) use stream::VulkanStream;

/// Device memory a pool may take by default: this share of the largest
/// device-local heap (the rest is left to the driver and other programs).
const HEAP_SHARE: f64 = 0.75;

pub(crate) struct Shared {
    device: u64,
    config: DeviceConfig,
    pub(crate) gpu: Arc<hetero_vulkan::Gpu>,
    pub(crate) streams: super::StreamList<VulkanStream>,
    next_stream: AtomicU64,
    /// Submissions so far: the engine parks until it moves.
    pending: AtomicU64,
    bell: Parker,
    /// While the engine waits for the device it also waits for this timeline
    /// to reach `doorbell_at`: the first submission meanwhile signals it
    /// (`device_wait` taken from true to false: one signal per wait).
    doorbell: hetero_vulkan::Timeline,
    doorbell_at: AtomicU64,
    device_wait: AtomicBool,
    shutdown: AtomicBool,
    /// Per lane (compute, transfer): signalled with each batch's number when
    /// the device has run that lane's part of it (engine.rs).
    lanes: [hetero_vulkan::Timeline; 2],
    /// Copies go on the transfer lane (its own queue, or `split_lanes`).
    two_lanes: bool,
    /// Ops the engine has taken (the aging clock; written by the engine only).
    tick: AtomicU64,
    /// Command buffers recorded for graph launches that are kept for the
    /// launches after them (graph.rs; `Device::graph_recordings`).
    pub(crate) graph_recordings: AtomicU64,
    device_mem: Arc<Chunks>,
    pinned_mem: Arc<Chunks>,
    pinned: Arc<hetero_memory::PinnedPool>,
    /// Pinned memory of the readback type (HOST_CACHED where there is one):
    /// staging for reads from the device, and `Device::alloc_pinned_readback`.
    readback_mem: Arc<Chunks>,
    readback: Arc<hetero_memory::PinnedPool>,
    /// A few bytes an empty kernel argument binds.
    empty: Arc<hetero_vulkan::Chunk>,
    /// Why the device is lost, once it is.
    lost: OnceLock<String>,
    /// Timestamp queries (`None` where the compute queue writes none).
    pub(crate) queries: Option<hetero_vulkan::QueryPool>,
    /// The device clock against this process's (see `query_ns`).
    clock: Mutex<DeviceClock>,
}

/// A calibration of the device's timestamps against the host clock, and the
/// offset of that clock (`CLOCK_MONOTONIC`) from the profiler's.
struct DeviceClock {
    at: std::time::Instant,
    calibration: Option<hetero_vulkan::Calibration>,
    /// `CLOCK_MONOTONIC` minus `crate::exec::clock::now_ns`, ns.
    offset: i128,
}

impl DeviceClock {
    fn measure(gpu: &hetero_vulkan::Gpu) -> DeviceClock {
        let offset =
            i128::from(hetero_vulkan::host_now_ns()) - i128::from(crate::exec::clock::now_ns());
        DeviceClock {
            at: std::time::Instant::now(),
            calibration: gpu.calibrate().ok(),
            offset,
        }
    }
}

/// Timestamp queries in the device's pool: at most this many ops' worth in
/// flight at once (past it, ops go without and records take their
/// completion time).
const QUERIES: u32 = 8192;

/// How old a calibration may get before the next timestamp read makes a new one.
const RECALIBRATE: std::time::Duration = std::time::Duration::from_secs(1);

impl super::HasStreams for Shared {
    type Stream = VulkanStream;
    fn stream_list(&self) -> &super::StreamList<VulkanStream> {
        &self.streams
    }
}

impl Shared {
    /// A submission came: the engine looks again.
    pub(crate) fn ring(&self) {
        // SeqCst with the engine's store of `device_wait` then its look at
        // `pending`: either it sees this submission, or this sees it waiting.
        self.pending.fetch_add(1, Ordering::SeqCst);
        self.bell.wake(1);
        if self.device_wait.load(Ordering::SeqCst) && self.device_wait.swap(false, Ordering::SeqCst)
        {
            // The one signal of this wait, to the value the engine waits for.
            let _ = self
                .doorbell
                .signal(self.doorbell_at.load(Ordering::SeqCst));
        }
    }

    pub(crate) fn now_ns(&self) -> u64 {
        crate::exec::clock::now_ns()
    }

    /// Imports `bytes` of host memory at `ptr` (the whole pages around it);
    /// the address it is found at. `any_device`: for a managed buffer's host
    /// copy, which only copies reach (any device with
    /// `VK_EXT_external_memory_host` can copy to and from it); otherwise only
    /// where the device shares the host's memory (IREE's rule for user
    /// memory, which kernels may bind).
    fn import_host(&self, ptr: *const u8, bytes: usize, any_device: bool) -> Option<u64> {
        use hetero_vulkan::DeviceType;
        let info = self.gpu.info();
        let shares = matches!(
            info.device_type,
            DeviceType::Cpu | DeviceType::IntegratedGpu
        );
        if !(shares || any_device) || !info.features.external_memory_host {
            return None;
        }
        let align = info.limits.min_imported_host_pointer_alignment?.max(1);
        let base = (ptr as u64) / align * align;
        let end = (ptr as u64 + bytes as u64).div_ceil(align) * align;
        let start = std::ptr::NonNull::new(base as *mut u8)?;
        // SAFETY: the pages lie in the caller's live allocation (or share its
        // first and last page with it, mapped as long as it is); the
        // registration keeps it alive until its undo ran, and the undo waits
        // until the device is idle and has let go of the chunk before the
        // memory is freed.
        let chunk =
            unsafe { hetero_vulkan::Chunk::import_host(&self.gpu, start, end - base) }.ok()?;
        let at = ptr as u64;
        self.pinned_mem
            .insert_imported(at, bytes as u64, chunk, at - base);
        Some(at)
    }

    /// What undoes an import made by `import_host` (nothing for `None`).
    fn forget_import(self: &Arc<Self>, imported: Option<u64>) -> Box<dyn FnOnce() + Send> {
        let shared = Arc::downgrade(self);
        Box::new(move || {
            if let (Some(base), Some(sh)) = (imported, shared.upgrade()) {
                sh.pinned_mem.forget_imported(base);
                // No command may use imported memory once it is gone: wait
                // until the device is idle (and has let go of the chunk).
                let _ = sh.gpu.wait_idle();
            }
        })
    }

    fn lose(&self, why: String) {
        let _ = self.lost.set(format!("the Vulkan device was lost: {why}"));
    }

    fn lost(&self) -> Option<String> {
        self.lost.get().cloned()
    }

    /// `Err(DeviceLost)` once the device is lost.
    pub(crate) fn check_lost(&self) -> Result<()> {
        match self.lost.get() {
            None => Ok(()),
            Some(why) => Err(Error::DeviceLost {
                device: self.device,
                reason: why.clone(),
            }),
        }
    }

    /// Device timestamps (ns) on the profiler's clock (`None` where the
    /// device wrote none, or there is no calibration).
    pub(crate) fn to_host_ns(&self, device: &[Option<u64>]) -> Vec<Option<u64>> {
        let mut c = self.clock.lock().unwrap_or_else(|p| p.into_inner());
        if c.at.elapsed() > RECALIBRATE {
            *c = DeviceClock::measure(&self.gpu);
        }
        device
            .iter()
            .map(|d| {
                let host = i128::from(c.calibration.as_ref()?.to_host_ns((*d)?));
                u64::try_from(host - c.offset).ok()
            })
            .collect()
    }
}

pub(crate) struct VulkanBackend {
    shared: Arc<Shared>,
    props: DeviceProperties,
    pool: Arc<hetero_memory::DevicePool>,
    engine: Mutex<Option<JoinHandle<()>>>,
}

/// The Vulkan devices present (what `hetero info` prints), or the typed
/// error that says what to install.
pub fn devices() -> Result<Vec<hetero_vulkan::DeviceInfo>> {
    instance()?.list_devices().map_err(setup)
}

/// The process's one Vulkan instance (IREE keeps one too): made at the first
/// need and kept, so devices come and go without creating and destroying
/// instances beside each other (which layers handle badly at exit). A failed
/// load is not kept: a later call tries again.
fn instance() -> Result<hetero_vulkan::Instance> {
    static INSTANCE: Mutex<Option<hetero_vulkan::Instance>> = Mutex::new(None);
    let mut held = INSTANCE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = held.as_ref() {
        return Ok(i.clone());
    }
    let i = hetero_vulkan::Instance::load().map_err(setup)?;
    *held = Some(i.clone());
    Ok(i)
}

fn setup(e: hetero_vulkan::VkError) -> Error {
    Error::Setup(format!("Vulkan: {e}"))
}

impl VulkanBackend {
    pub(crate) fn new(
        device: u64,
        config: DeviceConfig,
        index: usize,
        split_lanes: bool,
    ) -> Result<Self> {
        config.validate()?;
        let instance = instance()?;
        let gpu = Arc::new(
            hetero_vulkan::Gpu::open_with(
                &instance,
                index,
                &hetero_vulkan::OpenOptions {
                    lose_at_submission: config.lose_device_at,
                    ..Default::default()
                },
            )
            .map_err(setup)?,
        );
        let info = gpu.info().clone();
        // Every buffer starts at a multiple of `Storage::ALIGN` in its chunk:
        // a binding's offset must be a multiple of the device's alignment.
        let align = info.limits.min_storage_buffer_offset_alignment;
        if align > Storage::ALIGN as u64 || !(Storage::ALIGN as u64).is_multiple_of(align.max(1)) {
            return Err(Error::Setup(format!(
                "Vulkan device {}: storage buffers must start at multiples of {align} bytes, \
                 hetero places buffers at multiples of {}; this device is not supported",
                info.name,
                Storage::ALIGN
            )));
        }
        let heap = info
            .memory_heaps
            .iter()
            .filter(|h| {
                h.flags
                    .contains(hetero_vulkan::vk::MemoryHeapFlags::DEVICE_LOCAL)
            })
            .map(|h| h.size)
            .max()
            .or_else(|| info.memory_heaps.iter().map(|h| h.size).max())
            .unwrap_or(1 << 30);
        let capacity = (heap as f64 * HEAP_SHARE) as usize;
        let pool_config = match &config.pool {
            Some(p) => p.clone(),
            None => hetero_memory::PoolConfig::from_env()?,
        };
        let limit = pool_config.max_reserved.min(capacity);
        let device_mem = Arc::new(Chunks::device(gpu.clone(), capacity)?);
        let pool = Arc::new(hetero_memory::DevicePool::with_source(
            pool_config.max_reserved(limit),
            device_mem.clone(),
        )?);
        let pinned_mem = Arc::new(Chunks::pinned(
            gpu.clone(),
            hetero_vulkan::MemoryUse::Upload,
        ));
        let pinned = Arc::new(hetero_memory::PinnedPool::with_source(
            config.pinned.clone(),
            pinned_mem.clone(),
        )?);
        let readback_mem = Arc::new(Chunks::pinned(
            gpu.clone(),
            hetero_vulkan::MemoryUse::Readback,
        ));
        let readback = Arc::new(hetero_memory::PinnedPool::with_source(
            config.pinned.clone(),
            readback_mem.clone(),
        )?);
        let empty = Arc::new(
            hetero_vulkan::Chunk::new(&gpu, 256, hetero_vulkan::MemoryUse::DeviceLocal)
                .map_err(setup)?,
        );
        let lanes = [
            hetero_vulkan::Timeline::new(&gpu, 0).map_err(setup)?,
            hetero_vulkan::Timeline::new(&gpu, 0).map_err(setup)?,
        ];
        let two_lanes = split_lanes || !gpu.queue_plan().transfer.aliased;
        let doorbell = hetero_vulkan::Timeline::new(&gpu, 0).map_err(setup)?;
        let shared = Arc::new(Shared {
            device,
            config: config.clone(),
            gpu: gpu.clone(),
            streams: super::StreamList::new(),
            next_stream: AtomicU64::new(1),
            pending: AtomicU64::new(0),
            bell: Parker::new(),
            doorbell,
            doorbell_at: AtomicU64::new(0),
            device_wait: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            lanes,
            two_lanes,
            graph_recordings: AtomicU64::new(0),
            tick: AtomicU64::new(0),
            device_mem,
            pinned_mem,
            pinned,
            readback_mem,
            readback,
            empty,
            lost: OnceLock::new(),
            queries: hetero_vulkan::QueryPool::new(&gpu, QUERIES).ok(),
            clock: Mutex::new(DeviceClock::measure(&gpu)),
        });
        pool.set_stream_points(super::Points::new(&shared));
        let plan = gpu.queue_plan();
        let props = DeviceProperties {
            name: format!("vulkan {} ({})", info.name, info.driver_name),
            backend: "vulkan",
            compute_units: 1,
            copy_engines: [1, 1, 1],
            hardware_queues: if plan.transfer.aliased { 1 } else { 2 },
            link_peak_gbps: None,
            runs_device_code: true,
            queue_priority: config
                .queue_priority
                .filter(|_| gpu.queue_priority().is_some()),
            graph_rebinds_in_place: gpu.supports_update_after_bind(),
        };
        tracing::debug!("vulkan device {index}: {plan}");
        let sh = shared.clone();
        let engine = std::thread::Builder::new()
            .name("hetero-vk-engine".into())
            .spawn(move || callback::run(engine::Engine::new(), &sh))
            .map_err(|e| Error::Setup(format!("could not start the Vulkan engine thread: {e}")))?;
        Ok(VulkanBackend {
            shared,
            props,
            pool,
            engine: Mutex::new(Some(engine)),
        })
    }
}

impl Backend for VulkanBackend {
    fn properties(&self) -> &DeviceProperties {
        &self.props
    }

    fn create_stream(
        &self,
        priority: u8,
        capacity: Option<usize>,
    ) -> Result<Arc<dyn BackendStream>> {
        let sh = &self.shared;
        sh.check_lost()?;
        let id = sh.next_stream.fetch_add(1, Ordering::Relaxed);
        let stream = Arc::new(VulkanStream {
            id,
            timeline: Arc::new(Timeline::new(sh.device, id, sh.config.host_wait)),
            ring: Ring::with_capacity(capacity.unwrap_or(sh.config.ring_capacity)),
            priority: AtomicU8::new(priority),
            closed: AtomicBool::new(false),
            in_flight: AtomicU32::new(0),
            recorded: AtomicU64::new(0),
            faulted_at: AtomicU64::new(u64::MAX),
            faulted_before: std::sync::Mutex::new(Vec::new()),
            in_callback: AtomicBool::new(false),
            deps: [AtomicU64::new(0), AtomicU64::new(0)],
            lane: AtomicU8::new(0),
            last_served: AtomicU64::new(sh.tick.load(Ordering::Relaxed)),
            shared: Arc::downgrade(sh),
            host_wait: sh.config.host_wait,
        });
        sh.streams.add(stream.clone());
        sh.ring();
        Ok(stream)
    }

    fn allocate(&self, kind: MemoryKind, bytes: usize, stream: u64) -> Result<Arc<Storage>> {
        self.shared.check_lost()?;
        match kind {
            MemoryKind::Device => {
                let mut s = Storage::device_arc(self.shared.device, &self.pool, bytes, stream)?;
                // Fresh from the pool, the storage holds the chunk's address
                // as if it were host memory; it is the device's own.
                if let Some(st) = Storage::unique(&mut s).filter(|st| st.host_visible()) {
                    let addr = st.host_ptr() as u64;
                    st.set_device_memory(addr);
                }
                Ok(s)
            }
            MemoryKind::Pinned => {
                Storage::pinned_arc(self.shared.device, &self.shared.pinned, bytes)
            }
        }
    }

    fn pool(&self) -> &Arc<hetero_memory::DevicePool> {
        &self.pool
    }

    fn pinned_pool(&self) -> &hetero_memory::PinnedPool {
        &self.shared.pinned
    }

    fn allocate_readback(&self, bytes: usize) -> Result<Arc<Storage>> {
        self.shared.check_lost()?;
        Storage::pinned_arc(self.shared.device, &self.shared.readback, bytes)
    }

    fn fault_scopes(&self) -> bool {
        true
    }

    fn synchronize(&self) -> Result<()> {
        let points = self
            .shared
            .streams
            .map(|s| (s.timeline.clone(), s.submitted()));
        let r = super::wait_all(points, self.shared.config.host_wait);
        self.shared.check_lost()?;
        r
    }

    fn shutdown(&self) {
        let _ = self.synchronize();
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.ring();
        let engine = self.engine.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(e) = engine {
            let _ = e.join();
        }
        let _ = self.shared.gpu.wait_idle();
        self.pool.trim();
        let _ = self.shared.gpu.save_pipeline_cache();
    }

    fn host_wait(&self) -> CompletionMode {
        self.shared.config.host_wait
    }

    fn driver_submissions(&self) -> Option<u64> {
        Some(self.shared.gpu.submissions())
    }

    fn graph_recordings(&self) -> Option<u64> {
        Some(self.shared.graph_recordings.load(Ordering::Relaxed))
    }

    fn kick(&self) {
        self.shared.ring();
    }

    /// Page-locks the memory and, on a device that shares the host's memory
    /// (a CPU or integrated GPU with `VK_EXT_external_memory_host`, IREE's
    /// rule), imports it so copies reach it in place. On a discrete GPU the
    /// device cannot reach it: a copy with it fails its stream, saying so.
    fn register_host(&self, ptr: *const u8, bytes: usize) -> (u64, Box<dyn FnOnce() + Send>) {
        let locked = super::lock_host(ptr, bytes);
        let imported = self.shared.import_host(ptr, bytes, false);
        let forget = self.shared.forget_import(imported);
        let undo = move || {
            forget();
            super::unlock_host(locked)
        };
        (ptr as u64, Box::new(undo))
    }

    /// Imports the memory (not page-locked: a managed buffer's host copy,
    /// whose pages the kernel allocates as they are first written) so the
    /// device's copies reach it in place. `None` without
    /// `VK_EXT_external_memory_host` or where the import is refused.
    fn map_host(&self, ptr: *const u8, bytes: usize) -> Option<(u64, Box<dyn FnOnce() + Send>)> {
        let imported = self.shared.import_host(ptr, bytes, true)?;
        Some((ptr as u64, self.shared.forget_import(Some(imported))))
    }
}
