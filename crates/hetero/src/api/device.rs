//! Devices: something that owns memory and engines. `Device` is backend-independent;
//! the host backend is the default and always available.

use crate::api::buffer::{DeviceBuffer, PinnedBuffer};
use crate::api::stream::{Stream, PRIORITY_LOWEST};
use crate::backend::{emu::EmuBackend, host::HostBackend, Backend, DeviceProperties};
use crate::exec::storage::MemoryKind;
use crate::exec::storage::Storage;
use crate::{CompletionMode, DeviceConfig, Error, Result};
use bytemuck::Pod;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static NEXT_DEVICE: AtomicU64 = AtomicU64::new(1);

/// A device held weakly (a context's list of its devices: the devices hold
/// the context).
#[derive(Clone)]
pub(crate) struct WeakDevice(std::sync::Weak<DeviceInner>);

impl WeakDevice {
    pub(crate) fn upgrade(&self) -> Option<Device> {
        self.0.upgrade().map(|inner| Device { inner })
    }

    /// Whether the device still has a handle (no count taken to know).
    pub(crate) fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }
}

/// A device: compute units, copy engines, hardware queues and memory. Cloning gives
/// another handle to the same device.
///
/// Dropping the last handle (streams and buffers hold one too) waits for all
/// pending work, then stops the engines.
///
/// ```
/// use hetero::Device;
/// let dev = Device::host().unwrap();
/// let s = dev.create_stream().unwrap();
/// let mut h = dev.pinned_from_slice(&[1u32, 2, 3]).unwrap();
/// let d = dev.alloc::<u32>(3).unwrap();
/// s.copy_h2d(&h, &d).unwrap();
/// s.fill_range(&d, 1, 1, 7).unwrap();
/// s.copy_d2h(&d, &mut h).unwrap();
/// s.synchronize().unwrap();
/// assert_eq!(h.as_slice().unwrap(), &[1, 7, 3]);
/// ```
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    id: u64,
    /// Taken only by `Drop`.
    backend: Option<Box<dyn Backend>>,
    /// `HETERO_PROFILE=PATH`: where to write the trace when the device drops
    /// (`HETERO_PROFILE_MAX_RECORDS`: the recorder's bound).
    profile_to: Option<std::path::PathBuf>,
    /// Pitched buffers' (pitch alignment in bytes, height alignment in rows).
    pitch_rules: (usize, usize),
    /// [`DeviceConfig::graph_memory_slack`].
    graph_memory_slack: f64,
    /// [`DeviceProperties::runs_device_code`], read at every launch.
    runs_device_code: bool,
    /// An emulated device in virtual time (its clock runs only when driven).
    virtual_time: bool,
    /// The context the device joined (once; it stays in it for its life).
    context: std::sync::OnceLock<Arc<crate::api::context::ContextShared>>,
    /// The streams staged peer copies use on this device (`api/stream/peer.rs`).
    staging: std::sync::Mutex<Staging>,
    /// [`Device::kicker`], made once (every wait on another device's event
    /// hands one over).
    kick: std::sync::OnceLock<crate::exec::timeline::Kick>,
}

/// Staging streams: one per staged copy in flight. A copy takes one whose
/// work is complete and did not fail (so no fault it waited on can still
/// reach it), or a new one, and gives it back when its ops are submitted.
/// One that failed is retired: a fault it took on from a waited stream stays
/// with the copy that waited.
#[derive(Default)]
struct Staging {
    idle: Vec<Arc<dyn crate::backend::BackendStream>>,
    /// Failed staging streams, released when the device drops.
    retired: Vec<Arc<dyn crate::backend::BackendStream>>,
}

/// A staging stream lent to one staged copy (`Device::staging_stream`):
/// back to the device's idle list when dropped.
pub(crate) struct StagingStream {
    stream: Stream,
    queue: Arc<dyn crate::backend::BackendStream>,
    device: Device,
}

impl std::ops::Deref for StagingStream {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        &self.stream
    }
}

impl Drop for StagingStream {
    fn drop(&mut self) {
        let mut st = self
            .device
            .inner
            .staging
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        st.idle.push(self.queue.clone());
    }
}

impl DeviceInner {
    fn backend(&self) -> &dyn Backend {
        self.backend
            .as_deref()
            .expect("the backend is taken only when the device drops")
    }
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        let (Some(backend), profile_to) = (self.backend.take(), self.profile_to.take()) else {
            return;
        };
        let staging = std::mem::take(&mut *self.staging.lock().unwrap_or_else(|p| p.into_inner()));
        // This thread's recycled buffers of the device give their memory back
        // now (other threads' when newer ones push them out, or at exit).
        crate::exec::storage::release_warm(backend.pool());
        // Shutting down waits for all work and joins the engines: on an engine
        // thread (a callback holding the last handle) that is done elsewhere.
        crate::exec::thread::off_engine("shut the device down", move || {
            for q in staging.idle.into_iter().chain(staging.retired) {
                q.release();
            }
            shutdown(backend, profile_to)
        });
    }
}

fn shutdown(backend: Box<dyn Backend>, profile_to: Option<std::path::PathBuf>) {
    {
        backend.shutdown();
        if let Some(path) = profile_to {
            let trace = hetero_trace::take();
            if trace.dropped > 0 {
                eprintln!(
                    "hetero: the HETERO_PROFILE trace in {} lacks {} records, dropped past the \
                     recorder's bound (HETERO_PROFILE_MAX_RECORDS, default {}); raise it to \
                     keep them",
                    path.display(),
                    trace.dropped,
                    hetero_trace::DEFAULT_MAX_RECORDS
                );
            }
            let written = std::fs::File::create(&path).and_then(|f| {
                let mut w = std::io::BufWriter::new(f);
                hetero_trace::write_chrome_trace(&trace, &mut w)?;
                std::io::Write::flush(&mut w)
            });
            match written {
                Ok(()) => tracing::info!("hetero: wrote trace to {}", path.display()),
                Err(e) => eprintln!(
                    "hetero: could not write HETERO_PROFILE trace to {}: {e}",
                    path.display()
                ),
            }
        }
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("id", &self.inner.id)
            .field("name", &self.properties().name)
            .finish()
    }
}

impl Device {
    /// The host device with the default configuration.
    pub fn host() -> Result<Device> {
        Device::new(DeviceConfig::default())
    }

    /// The device `HETERO_BACKEND` names (`host`, `emu`, `emu:PRESET`, …), with
    /// the default configuration; the host device when it is unset.
    pub fn from_env() -> Result<Device> {
        Device::new(DeviceConfig::from_env()?)
    }

    /// A device configured by `config`, on the backend it names.
    pub fn new(config: DeviceConfig) -> Result<Device> {
        let id = NEXT_DEVICE.fetch_add(1, Ordering::Relaxed);
        let pitch_rules = (config.pitch_alignment, config.height_alignment);
        let graph_memory_slack = config.graph_memory_slack;
        let clock = match &config.backend {
            crate::BackendKind::Emu(emu) if emu.time_mode() == crate::TimeMode::Virtual => {
                hetero_trace::TraceClock::Virtual
            }
            _ => hetero_trace::TraceClock::Wall,
        };
        let backend: Box<dyn Backend> = match config.backend.clone() {
            crate::BackendKind::Host => Box::new(HostBackend::new(id, config)?),
            crate::BackendKind::Emu(emu) => Box::new(EmuBackend::new(id, config, emu)?),
            #[cfg(feature = "vulkan")]
            crate::BackendKind::Vulkan { index, split_lanes } => Box::new(
                crate::backend::vulkan::VulkanBackend::new(id, config, index, split_lanes)?,
            ),
            #[cfg(not(feature = "vulkan"))]
            crate::BackendKind::Vulkan { .. } => return Err(Error::Setup(
                "this build of hetero has no Vulkan backend: build it with the `vulkan` feature"
                    .into(),
            )),
        };
        let profile_to = std::env::var_os("HETERO_PROFILE")
            .filter(|p| !p.is_empty())
            .map(std::path::PathBuf::from);
        if profile_to.is_some() {
            if let Some(v) = std::env::var_os("HETERO_PROFILE_MAX_RECORDS") {
                match v.to_str().and_then(|s| s.trim().parse::<usize>().ok()) {
                    Some(n) => hetero_trace::set_max_records(n),
                    None => tracing::warn!(
                        "HETERO_PROFILE_MAX_RECORDS is {v:?}, not a count of records; the \
                         recorder keeps its bound"
                    ),
                }
            }
            hetero_trace::set_device_name(backend.properties().name.clone());
            hetero_trace::set_clock(clock);
            hetero_trace::set_enabled(true);
        }
        let runs_device_code = backend.properties().runs_device_code;
        Ok(Device {
            inner: Arc::new(DeviceInner {
                id,
                backend: Some(backend),
                profile_to,
                pitch_rules,
                graph_memory_slack,
                runs_device_code,
                virtual_time: clock == hetero_trace::TraceClock::Virtual,
                context: std::sync::OnceLock::new(),
                staging: std::sync::Mutex::new(Staging::default()),
                kick: std::sync::OnceLock::new(),
            }),
        })
    }

    /// The context the device belongs to ([`Context::new`](crate::Context::new)), if any.
    pub fn context(&self) -> Option<crate::Context> {
        self.inner
            .context
            .get()
            .map(|c| crate::Context::from_shared(c.clone()))
    }

    pub(crate) fn context_shared(&self) -> Option<&Arc<crate::api::context::ContextShared>> {
        self.inner.context.get()
    }

    /// Joins `ctx` (once); false if the device is in a context already.
    pub(crate) fn join_context(&self, ctx: &Arc<crate::api::context::ContextShared>) -> bool {
        self.inner.context.set(ctx.clone()).is_ok()
    }

    /// Whether device `other` is this device or in this device's context.
    pub(crate) fn shares_context(&self, other: u64) -> bool {
        other == self.id() || self.context_shared().is_some_and(|c| c.contains(other))
    }

    pub(crate) fn is_virtual_time(&self) -> bool {
        self.inner.virtual_time
    }

    pub(crate) fn backend(&self) -> &dyn Backend {
        self.inner.backend()
    }

    pub(crate) fn downgrade(&self) -> WeakDevice {
        WeakDevice(Arc::downgrade(&self.inner))
    }

    /// What makes this device look at its streams' waits again, for another
    /// device's timeline to call when a value this device waits for is
    /// reached (it holds the device weakly).
    pub(crate) fn kicker(&self) -> crate::exec::timeline::Kick {
        self.inner
            .kick
            .get_or_init(|| {
                // Weak: the device holds its own kicker.
                let weak = Arc::downgrade(&self.inner);
                Arc::new(move || {
                    if let Some(d) = weak.upgrade() {
                        if let Some(b) = d.backend.as_deref() {
                            b.kick();
                        }
                    }
                })
            })
            .clone()
    }

    /// A staging stream for one peer copy (see [`Staging`]): an idle one
    /// whose work completed without a fault, else a new one.
    pub(crate) fn staging_stream(&self) -> Result<StagingStream> {
        let mut st = self.inner.staging.lock().unwrap_or_else(|p| p.into_inner());
        let mut found = None;
        let mut pending = Vec::new();
        for q in std::mem::take(&mut st.idle) {
            match q.timeline().status(q.submitted()) {
                Some(Ok(())) if found.is_none() => found = Some(q),
                Some(Err(_)) => st.retired.push(q),
                _ => pending.push(q),
            }
        }
        st.idle = pending;
        let queue = match found {
            Some(q) => q,
            None => self.inner.backend().create_stream(PRIORITY_LOWEST, None)?,
        };
        Ok(StagingStream {
            stream: Stream::internal(queue.clone(), self.clone()),
            queue,
            device: self.clone(),
        })
    }

    /// The device's id (unique in the process).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// What the device is made of.
    pub fn properties(&self) -> &DeviceProperties {
        self.inner.backend().properties()
    }

    /// The device clock, ns: wall time on the host, the model's time on an
    /// emulated device (virtual in virtual time).
    pub fn now_ns(&self) -> u64 {
        self.inner.backend().now_ns()
    }

    /// On a device in virtual time, a digest of every operation completed so far
    /// (what ran where, when): the same program and configuration give the same
    /// hash. `None` elsewhere.
    pub fn trace_hash(&self) -> Option<u64> {
        self.inner.backend().trace_hash()
    }

    /// A new event the host signals ([`HostEvent`](crate::HostEvent)): a way to hold back work on
    /// streams until the host says so.
    pub fn host_event(&self) -> crate::HostEvent {
        // Its own timeline, of no stream (0): no stream's order elides a wait on
        // it, and engines look it up as a point, not a stream.
        let timeline = Arc::new(crate::exec::timeline::Timeline::new(
            self.id(),
            0,
            self.host_wait(),
        ));
        crate::HostEvent::new(self.clone(), timeline)
    }

    /// Registers a user's existing host memory with the device (like
    /// `cudaHostRegister`): it is page-locked and, on a device behind an IOMMU,
    /// mapped into the device's I/O address space, and comes back as a
    /// [`PinnedBuffer`] that async copies take. Dropping the buffer unregisters
    /// it and frees the memory.
    ///
    /// ```
    /// use hetero::Device;
    /// let dev = Device::host().unwrap();
    /// let s = dev.create_stream().unwrap();
    /// let host = dev.register_host(vec![5u32; 1024]).unwrap();
    /// let d = dev.alloc::<u32>(1024).unwrap();
    /// s.copy_h2d(&host, &d).unwrap();
    /// assert_eq!(s.read_to_vec(&d).unwrap(), vec![5; 1024]);
    /// ```
    pub fn register_host<T: Pod + Send>(&self, data: Vec<T>) -> Result<PinnedBuffer<T>> {
        let len = data.len();
        let bytes = Self::bytes_for::<T>(len)?;
        if bytes == 0 {
            return Err(Error::InvalidArgument(
                "register_host: the range is empty; register at least one element".into(),
            ));
        }
        let mut data = data.into_boxed_slice();
        let ptr = std::ptr::NonNull::new(data.as_mut_ptr().cast::<u8>())
            .expect("a non-empty boxed slice has a non-null pointer");
        let (addr, undo) = self.inner.backend().register_host(ptr.as_ptr(), bytes);
        let registration = crate::exec::storage::Registration {
            _memory: Box::new(data),
            undo: Some(undo),
        };
        let s = Storage::registered(self.id(), ptr, bytes, addr, registration);
        Ok(PinnedBuffer::from_storage(Arc::new(s), len))
    }

    /// Undoes [`Device::register_host`] for `buf` now: the device no longer
    /// reaches the memory (on the emulated device a DMA to it then faults its
    /// stream, touching nothing), while the host still may. An error if `buf`
    /// is not registered memory of this device, or was unregistered already.
    pub fn unregister_host<T: Pod>(&self, buf: &PinnedBuffer<T>) -> Result<()> {
        if buf.device_id() != self.id() {
            return Err(Error::WrongDevice {
                op: "unregister_host",
                buffer_device: buf.device_id(),
                stream_device: self.id(),
            });
        }
        if buf.storage.unregister() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(
                "unregister_host: the buffer is not registered host memory (it comes from the \
                pinned pool, or was unregistered already); only buffers from \
                Device::register_host can be unregistered"
                    .into(),
            ))
        }
    }

    /// The IOMMU's mappings and I/O TLB figures (per copy engine), on a device
    /// that reaches host memory through one (the emulated device); `None` on
    /// the host.
    pub fn iommu_stats(&self) -> Option<crate::IommuStats> {
        self.inner.backend().iommu_stats()
    }

    /// Submissions to the device's driver so far (`vkQueueSubmit2` calls on a
    /// Vulkan device), on a device that submits to one; `None` on the host and
    /// the emulated device. With the ops submitted, the batching figure.
    pub fn driver_submissions(&self) -> Option<u64> {
        self.inner.backend().driver_submissions()
    }

    /// Command buffers recorded so far for graph launches that the device
    /// keeps and resubmits (a Vulkan device: the first launch of a graph
    /// records it; an update re-records only where a node's shape changed,
    /// or, on a device without update-after-bind descriptors, where a slot it
    /// uses moved); `None` on devices that record none.
    pub fn graph_recordings(&self) -> Option<u64> {
        self.inner.backend().graph_recordings()
    }

    /// Whether this device still exists, without keeping it alive (per-device
    /// state kept elsewhere, such as managed memory's, is dropped with it).
    pub(crate) fn weak(&self) -> std::sync::Weak<dyn std::any::Any + Send + Sync> {
        let a: Arc<dyn std::any::Any + Send + Sync> = self.inner.clone();
        Arc::downgrade(&a)
    }

    /// The device pool (managed memory's budget is what it leaves).
    pub(crate) fn pool(&self) -> &Arc<hetero_memory::DevicePool> {
        self.inner.backend().pool()
    }

    pub(crate) fn reach(&self) -> crate::exec::storage::Reach {
        self.inner.backend().reach()
    }

    /// A kernel's typed error when it has no code this device runs.
    #[inline]
    pub(crate) fn check_code(&self, kernel: &crate::exec::kernel::KernelInner) -> Result<()> {
        let device_code = self.inner.runs_device_code;
        let has = if device_code {
            kernel.code.is_some()
        } else {
            kernel.f.is_some()
        };
        if has {
            return Ok(());
        }
        self.no_code(kernel)
    }

    #[cold]
    fn no_code(&self, kernel: &crate::exec::kernel::KernelInner) -> Result<()> {
        kernel.runs_on(self.inner.runs_device_code, &self.properties().name)
    }

    pub(crate) fn graph_memory_slack(&self) -> f64 {
        self.inner.graph_memory_slack
    }

    pub(crate) fn pitch_rules(&self) -> (usize, usize) {
        self.inner.pitch_rules
    }

    pub(crate) fn inline_copy_max(&self) -> usize {
        self.inner.backend().inline_copy_max()
    }

    pub(crate) fn held_by_running_op(&self, storage: &crate::exec::storage::Storage) -> bool {
        self.inner.backend().held_by_running_op(storage)
    }

    pub(crate) fn kick(&self) {
        self.inner.backend().kick();
    }

    /// Kicks this device when `timeline` (another device's) reaches `value`,
    /// which a wait of this device's work is for: its engines look at the
    /// wait again then (nothing else tells them). Nothing where the device
    /// needs no kick (`Backend::kicks`).
    pub(crate) fn watch(&self, timeline: &crate::exec::timeline::Timeline, value: u64) {
        if self.inner.backend().kicks() {
            timeline.watch(value, self.kicker());
        }
    }

    pub(crate) fn host_wait(&self) -> CompletionMode {
        self.inner.backend().host_wait()
    }

    /// A new stream of the lowest priority.
    pub fn create_stream(&self) -> Result<Stream> {
        self.create_stream_with_priority(PRIORITY_LOWEST)
    }

    /// A new stream with `priority` (0 highest … 7 lowest).
    pub fn create_stream_with_priority(&self, priority: u8) -> Result<Stream> {
        self.create_stream_sized(priority, None)
    }

    /// A new stream with `priority` whose ring holds `capacity` ops (rounded
    /// up to a power of two; `None`: the device's `stream_capacity`).
    pub(crate) fn create_stream_sized(
        &self,
        priority: u8,
        capacity: Option<usize>,
    ) -> Result<Stream> {
        if priority > PRIORITY_LOWEST {
            return Err(Error::InvalidArgument(format!(
                "priority {priority} is out of range; use 0 (highest) ..= 7 (lowest)"
            )));
        }
        let q = self.inner.backend().create_stream(priority, capacity)?;
        Ok(Stream::new(q, self.clone()))
    }

    pub(crate) fn bytes_for<T: Pod>(len: usize) -> Result<usize> {
        if std::mem::align_of::<T>() > Storage::ALIGN {
            return Err(Error::InvalidArgument(format!(
                "{} needs {}-byte alignment; buffers are aligned to {} bytes: use a type with \
                 smaller alignment",
                std::any::type_name::<T>(),
                std::mem::align_of::<T>(),
                Storage::ALIGN
            )));
        }
        len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{len} elements of {} overflow the address space",
                std::any::type_name::<T>()
            ))
        })
    }

    /// A device buffer of `len` elements from the device pool, not tied to a stream.
    /// Its contents are unspecified (like `cudaMalloc`): fill or copy before reading.
    /// For stream-ordered allocation use [`Stream::alloc`].
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let mut s = self.device_storage::<T>(len, 0)?;
        // Memory that a stream's queued work may still use: no stream orders this
        // buffer's first use, so wait for that work here.
        let fences = crate::exec::storage::Storage::unique(&mut s)
            .expect("a new storage has no other owner")
            .take_reuse_points();
        let mut fences = fences.into_iter();
        while let Some(f) = fences.next() {
            if let Err(e) = crate::exec::point::wait_point(&f) {
                s.free_after(std::iter::once(f).chain(fences).collect());
                return Err(e);
            }
        }
        Ok(DeviceBuffer::from_storage(s, len))
    }

    /// Device memory for `len` elements of `T`, cached per `stream` (0: none).
    pub(crate) fn device_storage<T: Pod>(&self, len: usize, stream: u64) -> Result<Arc<Storage>> {
        let bytes = Self::bytes_for::<T>(len)?;
        self.inner
            .backend()
            .allocate(MemoryKind::Device, bytes, stream)
    }

    /// A pinned host buffer of `len` elements from the pinned pool (pinned once per
    /// chunk, sub-allocated after); contents unspecified.
    pub fn alloc_pinned<T: Pod>(&self, len: usize) -> Result<PinnedBuffer<T>> {
        let bytes = Self::bytes_for::<T>(len)?;
        let s = self
            .inner
            .backend()
            .allocate(MemoryKind::Pinned, bytes, 0)?;
        Ok(PinnedBuffer::from_storage(s, len))
    }

    /// A pinned host buffer for data the device writes and the host reads
    /// (the destination of `copy_d2h`): on Vulkan, memory of a HOST_CACHED
    /// type where the device has a coherent one, so host reads run at cache
    /// speed (`alloc_pinned` gives write-combined memory where the device
    /// has it: fast for the host to write, slow to read). Elsewhere the same
    /// as `alloc_pinned`. Contents unspecified.
    pub fn alloc_pinned_readback<T: Pod>(&self, len: usize) -> Result<PinnedBuffer<T>> {
        let bytes = Self::bytes_for::<T>(len)?;
        let s = self.inner.backend().allocate_readback(bytes)?;
        Ok(PinnedBuffer::from_storage(s, len))
    }

    /// The device pool's counters: allocated, reserved, peak, cache hit rate,
    /// fragmentation, OS calls.
    pub fn memory_stats(&self) -> hetero_memory::PoolStats {
        let pool = self.inner.backend().pool();
        // What this thread keeps of dropped buffers counts as cached, as the
        // pool's own thread cache does: give it back first.
        crate::exec::storage::release_warm(pool);
        pool.stats()
    }

    /// Every chunk, block and buffer of the device pool with its stream and state
    /// (serialisable, like PyTorch's memory snapshot).
    pub fn memory_snapshot(&self) -> hetero_memory::Snapshot {
        let pool = self.inner.backend().pool();
        crate::exec::storage::release_warm(pool);
        pool.snapshot()
    }

    /// Returns cached, unused device memory to the OS; the bytes released.
    pub fn trim(&self) -> usize {
        let pool = self.inner.backend().pool();
        crate::exec::storage::release_warm(pool);
        pool.trim()
    }

    /// A memory context for virtual memory management on this device: reserve
    /// address ranges, create physical handles of 4 KiB / 2 MiB / 1 GiB
    /// granularity and map them, at most `quota` bytes mapped at once (see
    /// [`vmm`](crate::vmm); share them with other processes through
    /// [`ipc`](crate::ipc)). The memory is host memory (the emulated device
    /// maps its own device memory through the same API, in its own context).
    ///
    /// ```
    /// use hetero::vmm::{Access, Granularity};
    /// let d = hetero::Device::host().unwrap();
    /// let ctx = d.create_memory_context("weights", 64 << 20);
    /// let mut range = ctx.reserve(1 << 30, Granularity::Huge2M).unwrap();
    /// let phys = ctx.create_physical(4 << 20, Granularity::Huge2M).unwrap();
    /// range.map(0, &phys, 0, 4 << 20, Access::ReadWrite).unwrap();
    /// assert!(d.memory_contexts().iter().any(|c| c.id == ctx.id() && c.mapped == 4 << 20));
    /// ```
    pub fn create_memory_context(&self, name: &str, quota: usize) -> crate::vmm::MemoryContext {
        crate::vmm::MemoryContext::new(&format!("device {}: {name}", self.id()), quota)
    }

    /// The figures of every live memory context of this process.
    pub fn memory_contexts(&self) -> Vec<crate::vmm::ContextStats> {
        crate::vmm::contexts()
    }

    /// The pinned pool's counters.
    pub fn pinned_stats(&self) -> hetero_memory::PinnedStats {
        self.inner.backend().pinned_pool().stats()
    }

    /// A pinned host buffer holding a copy of `data`.
    pub fn pinned_from_slice<T: Pod>(&self, data: &[T]) -> Result<PinnedBuffer<T>> {
        let mut b = self.alloc_pinned::<T>(data.len())?;
        b.as_mut_slice()?.copy_from_slice(data);
        Ok(b)
    }

    /// Blocks until all work submitted so far on every stream completed. Returns the
    /// first fault among the streams, if any failed.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.backend().synchronize()
    }
}
