//! The boundary between the public API (Device, Stream, Event, buffers) and the
//! backends that execute work. A backend receives validated `Op`s on stream queues
//! and completes them in order on the stream's timeline; everything above this
//! trait is backend-independent, so an emulated accelerator or a CUDA backend slots
//! in without changing the public API.

pub(crate) mod emu;
pub(crate) mod host;
mod streams;
#[cfg(feature = "vulkan")]
pub(crate) mod vulkan;

pub(crate) use streams::{HasStreams, Points, StreamList};

use crate::exec::op::Op;
use crate::exec::storage::{MemoryKind, Reach, Storage};
use crate::exec::timeline::Timeline;
use crate::Result;
use std::sync::Arc;

/// Waits until `ring` (whose ops complete on `timeline`) has room for a push.
///
/// The condition is room itself, not the completion of some op: the engines may
/// drain the whole ring between a failed push and this wait, and a completion
/// asked for then could belong to an op never submitted. Room appears when an
/// engine pops the oldest op, and every pop is followed by that op's completion,
/// which wakes this waiter: the completion's fence orders the pop before the
/// waker's look at the sleepers, and the sleeper's fence orders its registration
/// before its look at the ring (park.rs).
pub(crate) fn wait_for_room<T, K>(
    ring: &crate::exec::ring::Ring<T, K>,
    timeline: &Timeline,
    mode: crate::CompletionMode,
) -> Result<()> {
    // For an engine thread's deadlock check: what room depends on.
    let oldest = ring.head() + 1;
    timeline.wait_until(oldest, mode, "a submission to a full stream", || {
        ring.has_room()
    })
}

/// Waits for every `(timeline, value)` in turn (a device's synchronize): the
/// first stream fault is returned after all were waited for; a wait that would
/// never end is returned at once.
pub(crate) fn wait_all(
    points: impl IntoIterator<Item = (Arc<Timeline>, u64)>,
    mode: crate::CompletionMode,
) -> Result<()> {
    let mut first = None;
    for (timeline, value) in points {
        match timeline.wait(value, mode) {
            Err(e @ crate::Error::WouldDeadlock(_)) => return Err(e),
            Err(e) => {
                first.get_or_insert(e);
            }
            Ok(()) => {}
        }
    }
    first.map_or(Ok(()), Err)
}

/// The pool's point for the tail of `stream` (the timeline and its last
/// submitted value, if the stream is still listed): a stream no longer listed
/// was released after its work completed, so its point is already reached.
pub(crate) fn tail_point(
    stream: u64,
    found: Option<(Arc<Timeline>, u64)>,
) -> Arc<dyn hetero_memory::StreamPoint> {
    let (timeline, value) = found.unwrap_or_else(|| {
        let done = Timeline::new(0, stream, crate::CompletionMode::auto());
        (Arc::new(done), 0)
    });
    Arc::new(crate::exec::point::TimelinePoint { timeline, value })
}

/// What a device is made of.
#[derive(Debug, Clone)]
pub struct DeviceProperties {
    /// Human-readable device name.
    pub name: String,
    /// The backend ("host", "emu", later "cuda").
    pub backend: &'static str,
    /// Compute units (host: engine threads).
    pub compute_units: usize,
    /// Copy engines per direction: H2D, D2H, D2D.
    pub copy_engines: [usize; 3],
    /// Hardware queues streams are mapped onto.
    pub hardware_queues: usize,
    /// The link's peak bandwidth, GB/s, where the device sits behind one.
    pub link_peak_gbps: Option<f64>,
    /// Kernels run as device code (WGSL or SPIR-V), not host closures.
    pub runs_device_code: bool,
    /// The priority the device's queues have among every program's on the
    /// device, where one was asked for and the driver granted it (Vulkan's
    /// global priority; `None`: the default).
    pub queue_priority: Option<crate::config::QueuePriority>,
    /// A graph's slot rebound to another buffer reaches its recorded launch
    /// without recording any of it again (nothing is recorded on the host and
    /// the emulated device; on Vulkan, where the driver has update-after-bind
    /// storage-buffer descriptors). False on a Vulkan driver without them
    /// (lavapipe): a rebinding records again the segments whose nodes use
    /// the slot. New scalars never record again.
    pub graph_rebinds_in_place: bool,
}

pub(crate) trait Backend: Send + Sync {
    fn properties(&self) -> &DeviceProperties;
    /// A stream whose ring holds `capacity` ops (`None`: the device's
    /// configured `stream_capacity`).
    fn create_stream(
        &self,
        priority: u8,
        capacity: Option<usize>,
    ) -> Result<Arc<dyn BackendStream>>;
    /// `bytes` of `kind` memory; device memory is cached per `stream` (0: none).
    fn allocate(&self, kind: MemoryKind, bytes: usize, stream: u64) -> Result<Arc<Storage>>;
    /// The device pool (every backend's device memory goes through one).
    fn pool(&self) -> &Arc<hetero_memory::DevicePool>;
    /// The pinned host pool.
    fn pinned_pool(&self) -> &hetero_memory::PinnedPool;
    /// Pinned memory the device writes and the host reads (read back): a
    /// backend with a cached host-visible memory type gives it here; the
    /// others give plain pinned memory.
    fn allocate_readback(&self, bytes: usize) -> Result<Arc<Storage>> {
        self.allocate(MemoryKind::Pinned, bytes, 0)
    }
    /// Waits until every operation submitted so far on any stream has completed.
    fn synchronize(&self) -> Result<()>;
    /// Whether its engines end a fault's scope where a stream's submitter
    /// started a new one (`Timeline::start_scope`, `Timeline::recover_at`);
    /// else a fault fails every later op of its stream.
    fn fault_scopes(&self) -> bool {
        false
    }
    /// Stops the engines after all submitted work completed.
    fn shutdown(&self);
    fn host_wait(&self) -> crate::CompletionMode;
    /// The device clock, ns (virtual on a device in virtual time).
    fn now_ns(&self) -> u64 {
        crate::exec::clock::now_ns()
    }
    /// Something other than a submission made work ready (a host event was
    /// signalled): engines that sleep must look again.
    fn kick(&self);
    /// Whether `kick` does anything: false where the engines look at every
    /// stream at each step without being told (an emulated device in
    /// virtual time), and a wait on another device's work then registers
    /// no watcher for it.
    fn kicks(&self) -> bool {
        true
    }
    /// A digest of every completed op, on a device in virtual time.
    fn trace_hash(&self) -> Option<u64> {
        None
    }
    /// Registers `bytes` of host memory at `ptr` with the device (page-locks it,
    /// maps it where the device has an IOMMU): its device address and what
    /// undoes that. The caller keeps the memory alive until then.
    fn register_host(&self, ptr: *const u8, bytes: usize) -> (u64, Box<dyn FnOnce() + Send>) {
        let locked = lock_host(ptr, bytes);
        (ptr as u64, Box::new(move || unlock_host(locked)))
    }
    /// Makes `bytes` of host memory at `ptr` reachable by the device's
    /// copies without page-locking it (memory whose pages come and go: a
    /// managed buffer's host copy): maps it where the device reaches host
    /// memory through an IOMMU, imports it into a driver. Its device address
    /// and what undoes that, or `None` where the device cannot reach such
    /// memory. The caller keeps the memory alive until the undo ran.
    fn map_host(&self, ptr: *const u8, _bytes: usize) -> Option<(u64, Box<dyn FnOnce() + Send>)> {
        Some((ptr as u64, Box::new(|| {})))
    }
    /// Submissions to a driver so far, on a device that has one.
    fn driver_submissions(&self) -> Option<u64> {
        None
    }
    /// Command buffers recorded for kept graph launches so far, on a device
    /// that records them.
    fn graph_recordings(&self) -> Option<u64> {
        None
    }
    /// The IOMMU's state, on a device behind one.
    fn iommu_stats(&self) -> Option<crate::IommuStats> {
        None
    }
    /// Whether an op running user code on this thread holds `storage`'s
    /// access lock (a kernel's own argument): waiting for that lock here would
    /// never end. A backend that runs user code on threads of its own says.
    fn held_by_running_op(&self, _storage: &Storage) -> bool {
        false
    }
    /// H2D copies of at most this many bytes go inline in the command (0: none).
    fn inline_copy_max(&self) -> usize {
        0
    }
    /// How this backend's engines reach its device memory (see [`Reach`]):
    /// what graph plans resolve their buffers with.
    fn reach(&self) -> Reach {
        Reach::HOST
    }
    /// The backend itself, for a backend that joins others of its kind (the
    /// emulated devices of a context).
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

pub(crate) trait BackendStream: Send + Sync {
    fn id(&self) -> u64;
    fn timeline(&self) -> &Arc<Timeline>;
    /// Enqueues `op`; returns its value on the stream's timeline.
    fn submit(&self, op: Op) -> Result<u64>;
    /// Enqueues a launch of `kernel` (what `Stream::launch` submits): the op
    /// holds a counted reference unless the backend keeps the kernel alive
    /// another way (the host backend lends it from the ring slot).
    fn submit_launch(
        &self,
        kernel: &Arc<crate::exec::kernel::KernelInner>,
        blocks: u32,
        args: crate::exec::kernel::ArgList,
        span: Option<Arc<crate::exec::op::Span>>,
    ) -> Result<u64> {
        self.submit(Op::new(crate::exec::op::Body::Kernel {
            kernel: crate::exec::op::KernelRef::owned(kernel.clone()),
            blocks,
            args,
            span,
        }))
    }
    /// A hint that `n` ops will be submitted soon: the backend may bring
    /// the memory they are written to into the cache.
    fn prefetch_submit(&self, _n: u64) {}
    /// A hint that ops will be submitted a little later: the backend may
    /// bring its stream's state into the cache (what `prefetch_submit` and a
    /// submission read first).
    fn prefetch_stream(&self) {}
    /// Whether its engine takes a wait on several points as one op
    /// ([`Body::WaitAll`](crate::exec::op::Body::WaitAll)); else each point
    /// is an op of its own.
    fn waits_all(&self) -> bool {
        false
    }
    /// Whether its engine takes a memory wait folded into a copy
    /// (`Body::Copy::after`: the copy starts once the point is reached);
    /// else the wait is an op of its own before the copy.
    fn copies_wait(&self) -> bool {
        false
    }
    /// The value of the last operation submitted.
    fn submitted(&self) -> u64;
    fn priority(&self) -> u8;
    fn set_priority(&self, priority: u8);
    fn hardware_queue(&self) -> usize;
    /// Refuses further submissions; pending work still completes.
    fn close(&self);
    fn is_closed(&self) -> bool;
    /// Forgets the stream once its work has completed (the last handle dropped).
    fn release(&self);
    /// Lets the device merge consecutive small copies (`Stream::set_coalescing`);
    /// a backend with no per-transfer setup to save ignores it.
    fn set_coalescing(&self, _coalescing: Option<crate::Coalescing>) {}
}

/// Page-locks `bytes` at `ptr` (like `cudaHostRegister`); the range, if the
/// kernel agreed (a refusal, such as RLIMIT_MEMLOCK, leaves it pageable: the
/// copies stay correct, only not page-locked).
pub(crate) fn lock_host(ptr: *const u8, bytes: usize) -> Option<(usize, usize)> {
    // SAFETY: the range is the caller's live allocation; mlock changes only
    // whether its pages may be swapped out.
    let r = unsafe { rustix::mm::mlock(ptr as *mut std::ffi::c_void, bytes) };
    match r {
        Ok(()) => Some((ptr as usize, bytes)),
        Err(e) => {
            tracing::debug!("hetero: register_host could not mlock {bytes} bytes: {e}");
            None
        }
    }
}

/// Undoes [`lock_host`].
pub(crate) fn unlock_host(locked: Option<(usize, usize)>) {
    if let Some((p, n)) = locked {
        // SAFETY: the range was locked by `lock_host` and is still mapped (the
        // registration is undone before its memory is freed).
        let _ = unsafe { rustix::mm::munlock(p as *mut std::ffi::c_void, n) };
    }
}
