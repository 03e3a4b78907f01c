//! The storage behind every buffer: its memory, its access lock, and what
//! stream-ordered reuse needs to know (`reuse.rs` holds the reuse itself).
//!
//! A buffer handle owns an `Arc<Storage>`; every pending operation that touches the
//! buffer holds another clone, so memory outlives the work that uses it.
//!
//! Invariants (who may touch the bytes):
//! - Operations touch a storage only while holding its `access` lock, taken at
//!   dispatch without blocking: many readers or one writer. Work from different
//!   streams that is not ordered by events therefore never races; it is serialised in
//!   some order instead of being undefined behaviour.
//! - Host code reads a pinned buffer only while no enqueued operation writes it
//!   (`pending_writes == 0`; enqueuing a writer needs `&mut`), and writes it only
//!   while no operation holds it at all (`Arc::get_mut`).

mod access;
mod reuse;

pub(crate) use access::GraphHold;

pub(crate) use reuse::release_warm;

use crate::exec::loom::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use crate::exec::timeline::Timeline;
use crate::Result;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// Where a buffer's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Device memory: reached only through operations on streams.
    Device,
    /// Pinned (page-locked) host memory: the host reads and writes it directly.
    Pinned,
}

/// The allocation behind a storage, returned when the storage drops.
pub(crate) enum Backing {
    /// Zero-sized: no memory.
    Empty,
    /// From the device pool (`Storage::pool`): returned to it, on the stream it
    /// was allocated for, when the storage drops (after every op that used it
    /// completed).
    Device {
        alloc: hetero_memory::Allocation,
        stream: hetero_memory::StreamId,
    },
    /// From the pinned pool (returned by the allocation's own Drop).
    Pinned(hetero_memory::PinnedAllocation),
    /// A user's host memory registered with the device (`Device::register_host`).
    Registered(Registration),
}

/// Host memory a user handed to `Device::register_host`: the memory itself and
/// what undoes the registration (unmap from the device's IOMMU, unlock). Its
/// drop unregisters first, then frees the memory.
pub(crate) struct Registration {
    pub(crate) _memory: Box<dyn std::any::Any + Send>,
    /// `None` once unregistered.
    pub(crate) undo: Option<Box<dyn FnOnce() + Send>>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(undo) = self.undo.take() {
            undo();
        }
    }
}

/// How a backend's engines reach device memory that host code may not touch:
/// the bytes at device address `a` are at host address `a + delta` in the
/// backend's own backing store (the emulated device's arena). A storage holds
/// only the device address of such memory; the backend that owns it passes
/// its `Reach` to the shared code that moves bytes for it (effects, kernel
/// views, graph plans). A device whose memory no host code reaches (a GPU)
/// never runs that code on its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reach {
    delta: usize,
}

impl Reach {
    /// Device addresses are host addresses (the host backend's memory, which
    /// is host-visible anyway).
    pub(crate) const HOST: Reach = Reach { delta: 0 };

    /// Device addresses from `device_base` are host addresses from `host_base`.
    pub(crate) fn linear(device_base: u64, host_base: *const u8) -> Reach {
        Reach {
            delta: (host_base as usize).wrapping_sub(device_base as usize),
        }
    }

    /// The device address at which this reach finds host address `host`:
    /// how memory the backend did not allocate itself (a managed buffer's
    /// device copy) is named so its engines find it.
    pub(crate) fn device_addr_of(self, host: *const u8) -> u64 {
        (host as usize).wrapping_sub(self.delta) as u64
    }

    #[inline]
    fn at(self, device_addr: u64) -> *mut u8 {
        (device_addr as usize).wrapping_add(self.delta) as *mut u8
    }
}

pub(crate) struct Storage {
    /// The bytes, for host code: meaningful only while `host_visible` (a
    /// dangling pointer, aligned to `ALIGN`, otherwise).
    host: NonNull<u8>,
    bytes: usize,
    /// The address the device knows the memory by: all that reaches memory
    /// which is not host-visible (through the backend's [`Reach`]).
    device_addr: u64,
    /// Whether host code may read and write the bytes directly.
    host_visible: bool,
    pub(crate) device: u64,
    pub(crate) kind: MemoryKind,
    access: AtomicU32,
    /// The host engine that last wrote the memory (unit + 1; 0: unknown, or
    /// written elsewhere): a placement hint, never needed for correctness.
    writer: AtomicU32,
    pending_writes: AtomicU32,
    /// How many [`GraphHold`]s of this storage exist (pinned memory only).
    graph_holds: AtomicU32,
    /// The device's model, for pinned memory of a device in virtual time: a
    /// host polling a refused access steps it, as `Stream::query` does.
    driver: Option<std::sync::Weak<dyn crate::exec::timeline::Driver>>,
    /// The stream the memory was allocated for (0: none).
    pub(crate) home: u64,
    /// Set once an op on a stream other than `home` was enqueued with it.
    shared: AtomicBool,
    /// Those other streams (0: a free entry), for an early free behind their fences.
    used_on: [AtomicU64; USED_ON],
    /// Used on more other streams than `used_on` holds.
    used_on_more: AtomicBool,
    /// Work on streams other than `home` waits for this point first.
    ready: Option<(Arc<Timeline>, u64)>,
    /// Taken early by [`Storage::release_in_stream_order`], else by `Drop`.
    backing: Mutex<Backing>,
    /// The pool device memory came from. Kept when the storage is recycled for
    /// memory of the same pool: no reference count changes per buffer.
    pool: Option<Arc<hetero_memory::DevicePool>>,
    /// Non-zero for a stand-in of a graph: a buffer allocated inside it or a
    /// slot bound at launch (`graph::GraphRef`). It has no memory; only a graph
    /// being recorded may take it, any other use is refused.
    pub(crate) graph_ref: u64,
    /// A pitched buffer's row pitch in bytes (0: flat): kernels split it
    /// between blocks by whole rows.
    pub(crate) row_bytes: usize,
    /// The memory came with stream-order obligations (it was reused in
    /// stream order, or other streams' work may still use it): its first
    /// user must order itself (see [`Storage::reused_in_stream_order`] and
    /// [`Storage::take_reuse_points`]). Set when the memory is taken, so the
    /// common case costs `Stream::alloc` one read.
    pub(crate) reuse_order: bool,
}

// SAFETY: the bytes are plain memory owned by this storage; concurrent access to them
// is governed by the `access` lock and the host-access rules in the module doc.
unsafe impl Send for Storage {}
// SAFETY: as above.
unsafe impl Sync for Storage {}

/// Other streams a storage remembers; a buffer used on more returns its memory
/// only when its last op completes.
const USED_ON: usize = 4;

impl Storage {
    pub(crate) const ALIGN: usize = 256;

    /// `Arc::get_mut` without its atomic read-modify-write (about 10 ns on the
    /// VMs this runs on, three of them per `Stream::alloc` + drop): the storage
    /// when `arc` is its only owner.
    ///
    /// Sound because no `Weak` of a storage is ever made (the type is private
    /// to this crate and nothing downgrades it), so one strong reference means
    /// one owner, and `&mut arc` keeps that owner from being cloned while the
    /// borrow lives.
    #[inline]
    pub(crate) fn unique(arc: &mut Arc<Storage>) -> Option<&mut Storage> {
        if Arc::strong_count(arc) != 1 {
            return None;
        }
        // Pairs with the Release decrement of the last other owner's drop: its
        // accesses happen before ours.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        // SAFETY: see above: this handle is the only reference to the storage.
        Some(unsafe { &mut *(Arc::as_ptr(arc) as *mut Storage) })
    }

    /// Whether the memory came back on its stream while work queued there could
    /// still use it (see the module doc).
    pub(crate) fn reused_in_stream_order(&mut self) -> bool {
        match self.backing.get_mut().unwrap_or_else(|p| p.into_inner()) {
            Backing::Device { alloc, .. } => alloc.reused_in_stream_order(),
            _ => false,
        }
    }

    /// Fences of other streams' work that may still use the memory: its first use
    /// must be ordered after them.
    /// Whether [`Storage::take_reuse_points`] would return any (the common case
    /// has none: no vector is built or dropped for it).
    #[inline]
    pub(crate) fn has_reuse_points(&mut self) -> bool {
        match self.backing.get_mut().unwrap_or_else(|p| p.into_inner()) {
            Backing::Device { alloc, .. } => !alloc.wait_for().is_empty(),
            _ => false,
        }
    }

    pub(crate) fn take_reuse_points(&mut self) -> Vec<Arc<dyn hetero_memory::StreamPoint>> {
        match self.backing.get_mut().unwrap_or_else(|p| p.into_inner()) {
            Backing::Device { alloc, .. } => alloc.take_wait_for(),
            _ => Vec::new(),
        }
    }

    /// Work on streams other than the home stream must wait for `value` on `timeline`.
    pub(crate) fn set_ready(&mut self, timeline: Arc<Timeline>, value: u64) {
        self.ready = Some((timeline, value));
    }

    /// The point an op enqueued on `stream` must wait for before touching this
    /// memory, if any; notes that the storage is used off its home stream (its
    /// memory then returns only when that op completed).
    #[inline]
    pub(crate) fn use_on(&self, stream: u64) -> Option<(&Arc<Timeline>, u64)> {
        if self.home == 0 || self.home == stream {
            return None;
        }
        if !self.shared.load(Ordering::Relaxed) {
            self.shared.store(true, Ordering::Relaxed);
        }
        self.note_used_on(stream);
        self.pending_ready()
    }

    /// Like [`Storage::use_on`] for an op on a stream of another device (a
    /// peer copy): stream ids name streams of one device only, so the memory
    /// is marked to return to its pool only once its last op completed.
    pub(crate) fn use_off_device(&self) -> Option<(&Arc<Timeline>, u64)> {
        // Stored once: a store to a line no other op wrote since would claim
        // it from the cache of every core that reads the storage.
        if !self.used_on_more.load(Ordering::Relaxed) {
            self.shared.store(true, Ordering::Relaxed);
            self.used_on_more.store(true, Ordering::Relaxed);
        }
        self.pending_ready()
    }

    pub(crate) fn set_driver(
        &mut self,
        driver: std::sync::Weak<dyn crate::exec::timeline::Driver>,
    ) {
        self.driver = Some(driver);
    }

    /// A host access was refused: on a device in virtual time, lets the model
    /// make a step, so that a host polling the access sees the work progress
    /// (the model runs only when the host waits or polls).
    #[cold]
    pub(crate) fn refused(&self) {
        if let Some(d) = self.driver.as_ref().and_then(std::sync::Weak::upgrade) {
            d.poll();
        }
    }

    /// Graph objects (drafts, plans, binding tables) that hold this storage
    /// now: what a refused host write names (`PinnedBuffer::as_mut_slice`).
    pub(crate) fn graph_holds(&self) -> u32 {
        self.graph_holds.load(Ordering::Relaxed)
    }

    /// Remembers that an op on `stream` (not `home`) holds this storage.
    #[inline]
    fn note_used_on(&self, stream: u64) {
        for e in &self.used_on {
            // Relaxed: read only when the handle drops, after every enqueue that
            // borrowed it (as for `shared`).
            match e.load(Ordering::Relaxed) {
                s if s == stream => return,
                0 => match e.compare_exchange(0, stream, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return,
                    Err(s) if s == stream => return,
                    Err(_) => {}
                },
                _ => {}
            }
        }
        self.used_on_more.store(true, Ordering::Relaxed);
    }

    /// `ready`, while not yet reached.
    #[inline]
    fn pending_ready(&self) -> Option<(&Arc<Timeline>, u64)> {
        match &self.ready {
            Some((t, v)) if !t.is_reached(*v) => Some((t, *v)),
            _ => None,
        }
    }

    /// Called when a buffer handle drops while ops still hold the storage: if every
    /// op that ever used it ran on its home stream, the memory goes back to the
    /// pool now, reusable at once by later work on that stream; if ops on a few
    /// other streams used it too, it goes back behind their fences.
    pub(crate) fn release_in_stream_order(&self) {
        // `shared` and `used_on` are written only while a handle is borrowed for
        // an enqueue; the handle is being dropped, so those writes happened before
        // (same thread, or published by whatever moved the handle here).
        let shared = self.shared.load(Ordering::Relaxed);
        if self.home == 0 || (shared && self.used_on_more.load(Ordering::Relaxed)) {
            return;
        }
        let mut b = self.backing.lock().unwrap_or_else(|p| p.into_inner());
        if let (Backing::Device { alloc, stream }, Some(pool)) =
            (std::mem::replace(&mut *b, Backing::Empty), &self.pool)
        {
            if crate::exec::clock::profiling() {
                record_mem(
                    hetero_trace::MemKind::Free,
                    self.device,
                    self.bytes,
                    stream,
                    pool,
                );
            }
            if shared {
                let others: Vec<u64> = self
                    .used_on
                    .iter()
                    .map(|e| e.load(Ordering::Relaxed))
                    .filter(|&s| s != 0)
                    .collect();
                pool.free_used_on(alloc, stream, &others);
            } else if crate::exec::thread::on_engine_thread() {
                pool.free_uncached(alloc, stream, Vec::new());
            } else {
                pool.free(alloc, stream, Vec::new());
            }
        }
    }

    /// [`Storage::pinned`], shared.
    pub(crate) fn pinned_arc(
        device: u64,
        pool: &hetero_memory::PinnedPool,
        bytes: usize,
    ) -> Result<Arc<Storage>> {
        Ok(Arc::new(Self::pinned(device, pool, bytes)?))
    }

    /// `bytes` of pinned host memory from `pool`; contents unspecified.
    pub(crate) fn pinned(
        device: u64,
        pool: &hetero_memory::PinnedPool,
        bytes: usize,
    ) -> Result<Storage> {
        if bytes == 0 {
            return Ok(Self::empty(device, MemoryKind::Pinned));
        }
        let alloc = pool.alloc(bytes, Self::ALIGN)?;
        let ptr = alloc.ptr();
        Ok(Storage::from_parts(
            device,
            MemoryKind::Pinned,
            ptr,
            bytes,
            Backing::Pinned(alloc),
        ))
    }

    /// No memory. The pointer is dangling but aligned to `ALIGN`, so the empty
    /// slices of any element type built from it are valid.
    fn empty(device: u64, kind: MemoryKind) -> Storage {
        Storage::from_parts(device, kind, Self::dangling(), 0, Backing::Empty)
    }

    /// A pointer nothing dereferences, aligned to `ALIGN`.
    fn dangling() -> NonNull<u8> {
        #[repr(align(256))]
        struct Aligned;
        const _: () = assert!(std::mem::align_of::<Aligned>() == Storage::ALIGN);
        NonNull::<Aligned>::dangling().cast::<u8>()
    }

    pub(crate) fn from_parts(
        device: u64,
        kind: MemoryKind,
        ptr: NonNull<u8>,
        bytes: usize,
        backing: Backing,
    ) -> Storage {
        Storage {
            host: ptr,
            device_addr: ptr.as_ptr() as u64,
            host_visible: true,
            bytes,
            device,
            kind,
            access: AtomicU32::new(0),
            writer: AtomicU32::new(0),
            pending_writes: AtomicU32::new(0),
            graph_holds: AtomicU32::new(0),
            driver: None,
            home: 0,
            shared: AtomicBool::new(false),
            used_on: std::array::from_fn(|_| AtomicU64::new(0)),
            used_on_more: AtomicBool::new(false),
            ready: None,
            backing: Mutex::new(backing),
            pool: None,
            graph_ref: 0,
            row_bytes: 0,
            reuse_order: false,
        }
    }

    /// A stand-in for a graph's buffer of `bytes` (see `graph_ref`): no memory,
    /// a pointer nothing dereferences.
    pub(crate) fn stand_in(device: u64, kind: MemoryKind, bytes: usize, graph_ref: u64) -> Storage {
        let mut s = Self::empty(device, kind);
        s.bytes = bytes;
        s.host_visible = false;
        s.device_addr = 0;
        s.graph_ref = graph_ref;
        s
    }

    /// Marks the memory as the device's own, known to it as `addr`: host code
    /// reaches it only through the backend, and the storage keeps no host
    /// pointer to it.
    pub(crate) fn set_device_memory(&mut self, addr: u64) {
        self.device_addr = addr;
        self.host_visible = false;
        self.host = Self::dangling();
    }

    /// Sets the address the device knows host-visible memory by (an I/O
    /// virtual address on a device behind an IOMMU).
    pub(crate) fn set_device_address(&mut self, addr: u64) {
        self.device_addr = addr;
    }

    /// The address the device knows the memory by.
    pub(crate) fn device_addr(&self) -> u64 {
        self.device_addr
    }

    /// Whether host code may touch the bytes directly.
    pub(crate) fn host_visible(&self) -> bool {
        self.host_visible
    }

    /// Elements of `size` bytes per partition unit: a row of a pitched
    /// buffer, else one.
    #[inline]
    pub(crate) fn unit_elems(&self, size: usize) -> usize {
        match self.row_bytes {
            0 => 1,
            r if size > 0 && r % size == 0 => r / size,
            _ => 1,
        }
    }

    #[inline]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The bytes for host code: host-visible memory only (debug builds check).
    #[inline]
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        debug_assert!(
            self.host_visible || self.bytes == 0 || self.graph_ref != 0,
            "host pointer of device memory"
        );
        self.host.as_ptr()
    }

    /// Where an engine of the owning backend finds the bytes: host-visible
    /// memory itself, else the device address through the backend's `reach`.
    #[inline]
    pub(crate) fn engine_ptr(&self, reach: Reach) -> *mut u8 {
        if self.host_visible || self.bytes == 0 {
            self.host.as_ptr()
        } else {
            reach.at(self.device_addr)
        }
    }

    /// Blocks until a synchronous host access in the order of `stream` may touch
    /// the memory. The access ends before the call returns, so unlike an op it
    /// does not keep the memory from returning early.
    pub(crate) fn wait_ready_for(&self, stream: u64) -> Result<()> {
        if self.home == 0 || self.home == stream {
            return Ok(());
        }
        match self.pending_ready() {
            // The earlier user's fault is not ours: only its end matters.
            Some((t, v)) => t.wait_for(v, t.host_wait, "a synchronous access"),
            None => Ok(()),
        }
    }

    /// Gives the memory back to the pool behind `fences`: the work they stand
    /// for may still use it, so no stream may reuse it before they complete.
    /// The pool holds it and reaps it later (its own completion path); no
    /// thread waits for it. Storage that is shared, or memory not from the
    /// device pool, is simply dropped: its last owner frees it.
    pub(crate) fn free_after(
        mut self: Arc<Self>,
        fences: Vec<Arc<dyn hetero_memory::StreamPoint>>,
    ) {
        if fences.iter().all(|f| f.is_complete()) {
            return;
        }
        let Some(s) = Storage::unique(&mut self) else {
            return;
        };
        let backing = s.backing.get_mut().unwrap_or_else(|p| p.into_inner());
        if !matches!(backing, Backing::Device { .. }) {
            return;
        }
        if let (Backing::Device { alloc, stream }, Some(pool)) =
            (std::mem::replace(backing, Backing::Empty), &s.pool)
        {
            if crate::exec::clock::profiling() {
                record_mem(hetero_trace::MemKind::Free, s.device, s.bytes, stream, pool);
            }
            pool.free_after(alloc, stream, fences);
        }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        self.release_backing();
    }
}

/// One pool event for the profiler, with the pool's totals after it.
pub(crate) fn record_mem(
    kind: hetero_trace::MemKind,
    device: u64,
    bytes: usize,
    stream: u64,
    pool: &hetero_memory::DevicePool,
) {
    let stats = pool.stats();
    hetero_trace::record_mem(hetero_trace::MemRecord {
        kind,
        ts_ns: crate::exec::clock::device_now_ns(device),
        bytes: bytes as u64,
        stream,
        reserved: stats.reserved as u64,
        allocated: stats.allocated as u64,
    });
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("bytes", &self.bytes)
            .field("device", &self.device)
            .field("kind", &self.kind)
            .finish()
    }
}
