//! Typed buffers and the storage behind them.
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
//!
//! Stream-ordered reuse (PyTorch's caching allocator, `cudaFreeAsync`): a buffer
//! allocated on stream S whose handle drops while only work on S still uses it
//! gives its memory back to the pool at once, and later work on S may get the
//! same bytes while that work is still queued. Two storages then share bytes, and
//! their access locks no longer keep them apart, so:
//! - memory used only on S goes back to S's cache; memory an op on another
//!   stream was enqueued with (`shared`) goes back held behind a fence of each
//!   stream that used it (`used_on`), reused by no stream before they all
//!   complete, so the pool can wait for them rather than grow; used on more
//!   streams than `used_on` holds, it returns when its last op completes;
//! - a storage built from such memory carries `ready`, a point on its stream's
//!   timeline: work on S is ordered after it by the stream itself, and every use
//!   on another stream (an op, or a synchronous read or write) first waits for
//!   that point. Stream order does the rest: on S the old work comes first.

use crate::loom::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use crate::timeline::Timeline;
use crate::{Error, Result};
use bytemuck::Pod;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
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

pub(crate) struct Storage {
    /// Where the bytes are for this process: the memory itself when it is
    /// host-visible, else the backend's backing store (reached only through the
    /// backend: copies, and the views it gives kernels).
    ptr: NonNull<u8>,
    bytes: usize,
    /// The address the device knows the memory by.
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
    /// How many [`GraphHold`]s of this storage exist.
    graph_holds: AtomicU32,
    /// The device's model, for pinned memory of a device in virtual time: a
    /// host polling a refused access steps it, as `Stream::query` does.
    driver: Option<std::sync::Weak<dyn crate::timeline::Driver>>,
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

const WRITER: u32 = 1 << 31;
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

    pub(crate) fn set_driver(&mut self, driver: std::sync::Weak<dyn crate::timeline::Driver>) {
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
            if crate::clock::profiling() {
                record_mem(hetero_trace::MemKind::Free, self.bytes, stream, pool);
            }
            if shared {
                let others: Vec<u64> = self
                    .used_on
                    .iter()
                    .map(|e| e.load(Ordering::Relaxed))
                    .filter(|&s| s != 0)
                    .collect();
                pool.free_used_on(alloc, stream, &others);
            } else if crate::backend::on_engine_thread() {
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
        #[repr(align(256))]
        struct Aligned;
        const _: () = assert!(std::mem::align_of::<Aligned>() == Storage::ALIGN);
        let ptr = NonNull::<Aligned>::dangling().cast::<u8>();
        Storage::from_parts(device, kind, ptr, 0, Backing::Empty)
    }

    pub(crate) fn from_parts(
        device: u64,
        kind: MemoryKind,
        ptr: NonNull<u8>,
        bytes: usize,
        backing: Backing,
    ) -> Storage {
        Storage {
            ptr,
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
    /// reaches it only through the backend.
    pub(crate) fn set_device_memory(&mut self, addr: u64) {
        self.device_addr = addr;
        self.host_visible = false;
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

    #[inline]
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Takes the access lock without blocking: shared for readers, exclusive for a
    /// writer. Returns whether it was taken.
    #[inline]
    pub(crate) fn try_acquire(&self, write: bool) -> bool {
        if write {
            self.access
                .compare_exchange(0, WRITER, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        } else {
            let mut cur = self.access.load(Ordering::Relaxed);
            loop {
                if cur & WRITER != 0 {
                    return false;
                }
                match self.access.compare_exchange_weak(
                    cur,
                    cur + 1,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return true,
                    Err(now) => cur = now,
                }
            }
        }
    }

    /// The host engine that last wrote the memory (unit + 1; 0: unknown).
    pub(crate) fn writer(&self) -> u32 {
        self.writer.load(Ordering::Relaxed)
    }

    /// Notes that host engine `unit` wrote the memory. Only a store when it
    /// changes: a line other engines read.
    pub(crate) fn set_writer(&self, unit: u32) {
        if self.writer.load(Ordering::Relaxed) != unit + 1 {
            self.writer.store(unit + 1, Ordering::Relaxed);
        }
    }

    /// Gives the access lock back. Engines release this way after an op: the
    /// releasing engine looks for work itself right after, so nobody needs a
    /// wake. A thread that is not an engine uses [`Storage::with_host_access`].
    #[inline]
    pub(crate) fn release(&self, write: bool) {
        if write {
            self.access.store(0, Ordering::Release);
        } else {
            self.access.fetch_sub(1, Ordering::Release);
        }
    }

    /// Runs `f` with the access lock held by this (host, non-engine) thread,
    /// then gives the lock back and calls `wake` (the device's `kick`).
    ///
    /// Protocol (no lost wake-up between the host and an engine): an engine
    /// takes access locks only with [`Storage::try_acquire`], in its look for
    /// work; a look that finds a lock taken leaves the op queued, and the
    /// engine sleeps only through `Parker::park_for*`, which counts it as a
    /// sleeper and fences (SeqCst) before its last look. The host takes the
    /// lock by spinning (its holder is an op, which completes without the
    /// host), releases it, then `wake` fences and looks at the sleepers.
    /// Either the engine's last look sees the lock free, or the host sees the
    /// engine asleep and wakes it. Without the wake, a kernel that found its
    /// buffer taken by the host slept until some unrelated submission.
    /// Checked by `loom_host_access` below, on this code.
    pub(crate) fn with_host_access<R>(
        &self,
        write: bool,
        wake: impl FnOnce(),
        f: impl FnOnce() -> R,
    ) -> R {
        self.acquire_blocking(write);
        let r = f();
        self.release(write);
        wake();
        r
    }

    /// Blocks (spinning, then yielding) until the access lock is taken.
    fn acquire_blocking(&self, write: bool) {
        let backoff = crossbeam_utils::Backoff::new();
        while !self.try_acquire(write) {
            // Under loom a yield of the model, so the holder can run.
            crate::loom::model_yield();
            backoff.snooze();
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

    /// Drops the storage once `fences` completed: its memory may still be used by
    /// the work they stand for, so it must not return to the pool before.
    pub(crate) fn drop_after(self: Arc<Self>, fences: Vec<Arc<dyn hetero_memory::StreamPoint>>) {
        if fences.iter().all(|f| f.is_complete()) {
            return;
        }
        let wait = move || {
            for f in &fences {
                f.wait();
            }
            drop(self);
        };
        // Not on an engine: its wait may need the work this engine runs.
        let spawned = std::thread::Builder::new()
            .name("hetero-release".into())
            .spawn(wait);
        if let Err(e) = spawned {
            tracing::error!("hetero: could not start a thread to free memory later: {e}");
        }
    }

    pub(crate) fn add_pending_write(&self) {
        self.pending_writes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn finish_pending_write(&self) {
        self.pending_writes.fetch_sub(1, Ordering::Release);
    }

    pub(crate) fn has_pending_writes(&self) -> bool {
        self.pending_writes.load(Ordering::Acquire) != 0
    }
}

/// A graph's hold on a buffer it names (a node's operand, a plan's fixed
/// buffer, a bound slot): counted in the storage while it exists, so a host
/// access the hold refuses can say so, and marking device memory as shared —
/// when the handle drops, the memory must not go back to its stream's cache at
/// once, as if only queued work still used it: a launch may come any time
/// later. It returns when the last holder lets go.
pub(crate) struct GraphHold(Arc<Storage>);

impl GraphHold {
    /// Made while the handle is borrowed for the recording or the binding (the
    /// `shared` flags are written under the same rule as by `use_on`).
    pub(crate) fn new(storage: &Arc<Storage>) -> Self {
        if storage.home != 0 {
            storage.shared.store(true, Ordering::Relaxed);
            storage.used_on_more.store(true, Ordering::Relaxed);
        }
        storage.graph_holds.fetch_add(1, Ordering::Relaxed);
        GraphHold(storage.clone())
    }
}

impl Clone for GraphHold {
    fn clone(&self) -> Self {
        self.0.graph_holds.fetch_add(1, Ordering::Relaxed);
        GraphHold(self.0.clone())
    }
}

impl Drop for GraphHold {
    fn drop(&mut self) {
        self.0.graph_holds.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::ops::Deref for GraphHold {
    type Target = Arc<Storage>;
    fn deref(&self) -> &Arc<Storage> {
        &self.0
    }
}

/// What this thread keeps of the device buffers that dropped on it with no op
/// holding them, for its next `Stream::alloc`:
/// - `cold`: emptied storages (their memory went back to the pool), so that a
///   buffer's bookkeeping costs no heap allocation;
/// - `warm`: storages that still hold their memory, idle (every op that used
///   it completed), each with the pool's epoch when kept. A request of the
///   same size on the same stream takes one back whole, without a trip
///   through the pool (an alloc and a free, about half of the cost of
///   `Stream::alloc` + drop). Bounded (`WARM_MAX`, `WARM_BYTES_MAX`), given
///   back when the pool's epoch moves (trim, memory pressure), on this
///   thread's `Device::trim`, `memory_stats` and `memory_snapshot`, when an
///   allocation on this thread fails, and at thread exit. Like the pool's own
///   thread caches, what an idle thread keeps waits for its next call.
struct Spares {
    cold: Vec<Arc<Storage>>,
    warm: Vec<(Arc<Storage>, u64)>,
    warm_bytes: usize,
    /// Warm reuses not yet counted in `hits_pool`'s statistics.
    hits: u64,
    hits_pool: Option<Arc<hetero_memory::DevicePool>>,
}

impl Spares {
    /// Counts the warm reuses so far in their pool's statistics.
    fn publish_hits(&mut self) {
        if let Some(p) = &self.hits_pool {
            if self.hits > 0 {
                p.note_front_hits(std::mem::take(&mut self.hits));
            }
        }
    }

    /// One more warm reuse from `pool`.
    #[inline]
    fn count_hit(&mut self, pool: &Arc<hetero_memory::DevicePool>) {
        if !self
            .hits_pool
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(p, pool))
        {
            self.publish_hits();
            self.hits_pool = Some(pool.clone());
        }
        self.hits += 1;
        if self.hits == 256 {
            self.publish_hits();
        }
    }

    /// Keeps `arc` (`bytes` of idle memory, kept at the pool's `epoch`) warm,
    /// giving the oldest warm storages' memory back to make room: so what a
    /// thread keeps is always its latest buffers, and those of a device that is
    /// gone age out.
    fn keep_warm(&mut self, arc: Arc<Storage>, bytes: usize, epoch: u64) {
        while !self.warm.is_empty()
            && (self.warm.len() >= WARM_MAX || self.warm_bytes + bytes > WARM_BYTES_MAX)
        {
            let (mut old, _) = self.warm.remove(0);
            self.warm_bytes -= old.bytes;
            if let Some(s) = Storage::unique(&mut old) {
                s.release_backing();
            }
            if self.cold.len() < SPARE_MAX {
                self.cold.push(old);
            }
        }
        self.warm_bytes += bytes;
        self.warm.push((arc, epoch));
    }

    /// Gives the memory of every warm storage from `pool` (every pool: `None`)
    /// back to it, keeping the emptied storages; how many there were.
    fn release_warm(&mut self, pool: Option<&Arc<hetero_memory::DevicePool>>) -> usize {
        self.publish_hits();
        if pool.is_none_or(|pool| {
            self.hits_pool
                .as_ref()
                .is_some_and(|p| Arc::ptr_eq(p, pool))
        }) {
            self.hits_pool = None; // it would keep the pool alive
        }
        let mut n = 0;
        let mut i = 0;
        while i < self.warm.len() {
            let (s, _) = &self.warm[i];
            let ours = match pool {
                Some(pool) => s.pool.as_ref().is_some_and(|p| Arc::ptr_eq(p, pool)),
                None => true,
            };
            if !ours {
                i += 1;
                continue;
            }
            // `remove`, not `swap_remove`: the others keep their age order.
            let (mut arc, _) = self.warm.remove(i);
            self.warm_bytes -= arc.bytes;
            if let Some(s) = Storage::unique(&mut arc) {
                s.release_backing();
            }
            if self.cold.len() < SPARE_MAX {
                self.cold.push(arc);
            }
            n += 1;
        }
        n
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        self.release_warm(None);
    }
}

thread_local! {
    static SPARE: RefCell<Spares> = const {
        RefCell::new(Spares {
            cold: Vec::new(),
            warm: Vec::new(),
            warm_bytes: 0,
            hits: 0,
            hits_pool: None,
        })
    };
}

/// Emptied storages kept per thread.
const SPARE_MAX: usize = 32;
/// Warm storages kept per thread, and the most bytes they hold, and the
/// largest buffer kept warm.
const WARM_MAX: usize = 8;
const WARM_BYTES_MAX: usize = 2 << 20;
const WARM_BUFFER_MAX: usize = 1 << 20;

/// Gives the device memory this thread keeps in front of `pool` back to it
/// (see `Spares`); how many buffers' memory that was.
pub(crate) fn release_warm(pool: &Arc<hetero_memory::DevicePool>) -> usize {
    SPARE
        .try_with(|sp| sp.borrow_mut().release_warm(Some(pool)))
        .unwrap_or(0)
}

impl Storage {
    /// `bytes` of device memory for `stream` (0: none), in a storage of its own:
    /// a warm one this thread kept if one fits, else memory from the pool in a
    /// storage this thread recycled or a new one.
    #[inline]
    pub(crate) fn device_arc(
        device: u64,
        pool: &Arc<hetero_memory::DevicePool>,
        bytes: usize,
        stream: u64,
    ) -> Result<Arc<Storage>> {
        if bytes == 0 {
            return Ok(Arc::new(Self::empty(device, MemoryKind::Device)));
        }
        if let Some(arc) = Self::take_warm(device, pool, bytes, stream) {
            return Ok(arc);
        }
        let alloc = match pool.alloc(bytes, Self::ALIGN, stream) {
            Ok(a) => a,
            // What this thread keeps in front of the pool may be what it lacks.
            Err(e) if release_warm(pool) == 0 => return Err(e.into()),
            Err(_) => pool.alloc(bytes, Self::ALIGN, stream)?,
        };
        if crate::clock::profiling() {
            record_mem(hetero_trace::MemKind::Alloc, bytes, stream, pool);
        }
        let reuse_order = alloc.reused_in_stream_order() || !alloc.wait_for().is_empty();
        let backing = Backing::Device { alloc, stream };
        let spare = SPARE.try_with(|s| s.borrow_mut().cold.pop()).ok().flatten();
        let mut arc = spare.unwrap_or_else(|| Arc::new(Self::empty(device, MemoryKind::Device)));
        let s = Storage::unique(&mut arc).expect("a spare storage has no other owner");
        s.refill(device, bytes, backing, stream);
        s.reuse_order = reuse_order;
        if !s.pool.as_ref().is_some_and(|p| Arc::ptr_eq(p, pool)) {
            s.pool = Some(pool.clone());
        }
        Ok(arc)
    }

    /// The newest warm storage, when it holds `bytes` for `stream` of `pool`
    /// on `device` and the pool has not asked for its memory back since.
    #[inline]
    fn take_warm(
        device: u64,
        pool: &Arc<hetero_memory::DevicePool>,
        bytes: usize,
        stream: u64,
    ) -> Option<Arc<Storage>> {
        SPARE
            .try_with(|sp| {
                let mut sp = sp.borrow_mut();
                let (s, epoch) = sp.warm.last()?;
                if s.bytes != bytes
                    || s.home != stream
                    || s.device != device
                    || !s.pool.as_ref().is_some_and(|p| Arc::ptr_eq(p, pool))
                {
                    return None;
                }
                if *epoch != pool.epoch() {
                    sp.release_warm(Some(pool));
                    return None;
                }
                let (arc, _) = sp.warm.pop()?;
                sp.warm_bytes -= bytes;
                sp.count_hit(pool);
                Some(arc)
            })
            .ok()
            .flatten()
    }

    /// Makes an emptied storage hold `backing` (device memory) for `stream`.
    fn refill(&mut self, device: u64, bytes: usize, backing: Backing, stream: u64) {
        let ptr = match &backing {
            Backing::Device { alloc, .. } => alloc.ptr(),
            _ => Self::empty(device, MemoryKind::Device).ptr,
        };
        self.ptr = ptr;
        self.device_addr = ptr.as_ptr() as u64;
        self.host_visible = true;
        self.bytes = bytes;
        self.device = device;
        self.kind = MemoryKind::Device;
        self.home = stream;
        self.graph_ref = 0;
        self.row_bytes = 0;
        let b = self.backing.get_mut().unwrap_or_else(|p| p.into_inner());
        // A spare storage was emptied by `recycle`: nothing to drop (and were
        // it not, forgetting a backing leaks memory, it is never unsound).
        debug_assert!(matches!(b, Backing::Empty));
        std::mem::forget(std::mem::replace(b, backing));
    }

    /// Whether the memory of this storage, whose last owner is letting it go,
    /// is idle and plain enough to hand out again whole (see `Spares`): device
    /// memory from a pool, no op and no stream's queued work using it (every
    /// op that held the storage completed; `ready`, if any, was reached), not
    /// pitched or a graph's stand-in, on a host thread (engines free what host
    /// threads allocate), with no profiler recording pool events.
    fn may_stay_warm(&mut self) -> bool {
        self.kind == MemoryKind::Device
            && self.bytes <= WARM_BUFFER_MAX
            && self.graph_ref == 0
            && self.row_bytes == 0
            && self.pool.is_some()
            && self.ready.as_ref().is_none_or(|(t, v)| t.completed() >= *v)
            && matches!(
                self.backing.get_mut().unwrap_or_else(|p| p.into_inner()),
                Backing::Device { .. }
            )
            && !crate::clock::profiling()
            && !crate::backend::on_engine_thread()
    }

    /// Clears what an op, a use elsewhere or a reuse left behind.
    /// (Stores, not `get_mut`: the loom atomics have no `get_mut`.)
    fn reset_uses(&mut self) {
        self.access.store(0, Ordering::Relaxed);
        self.pending_writes.store(0, Ordering::Relaxed);
        self.shared.store(false, Ordering::Relaxed);
        for e in &self.used_on {
            e.store(0, Ordering::Relaxed);
        }
        self.used_on_more.store(false, Ordering::Relaxed);
        self.ready = None;
        self.reuse_order = false;
    }

    /// The last owner of a device storage lets it go: kept warm with its memory
    /// when it may be (`may_stay_warm`) and this thread has room, else its
    /// memory returns to the pool and the emptied storage is kept.
    fn recycle(mut arc: Arc<Storage>) {
        let Some(s) = Storage::unique(&mut arc) else {
            return; // another owner appeared (a clone in flight): it drops it
        };
        if s.may_stay_warm() {
            s.reset_uses();
            let bytes = s.bytes;
            let epoch = s.pool.as_ref().map_or(0, |p| p.epoch());
            // Kept (the oldest warm ones making room), or the thread is exiting
            // (the storage dropped with the closure, its memory back in the pool).
            let _ = SPARE.try_with(move |sp| sp.borrow_mut().keep_warm(arc, bytes, epoch));
            return;
        }
        let Some(s) = Storage::unique(&mut arc) else {
            return;
        };
        s.release_backing();
        s.reset_uses();
        let _ = SPARE.try_with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.cold.len() < SPARE_MAX {
                spare.cold.push(arc);
            }
        });
    }

    /// Returns the memory to its pool; every op that used it has completed.
    fn release_backing(&mut self) {
        let b = self.backing.get_mut().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(b, Backing::Empty) {
            Backing::Empty => {}
            Backing::Device { alloc, stream } => {
                let Some(pool) = &self.pool else {
                    return; // device memory always comes with its pool
                };
                if crate::clock::profiling() {
                    record_mem(hetero_trace::MemKind::Free, self.bytes, stream, pool);
                }
                // Memory this storage took over in stream order may still be used
                // by work queued on its stream before the storage's `ready` point
                // (the storage itself went unused): it goes back as it came, a
                // queued free on that stream, so the next buffer made of it is
                // still ordered after that work.
                if self.ready.as_ref().is_some_and(|(t, v)| t.completed() < *v) {
                    pool.free(alloc, stream, Vec::new());
                    return;
                }
                // Otherwise every op that used the memory has completed (ops hold
                // the Arc, and work elsewhere waited for `ready`): no fences to
                // pass. An engine frees what host threads allocate: past its own
                // thread cache.
                if crate::backend::on_engine_thread() {
                    pool.free_completed_uncached(alloc, stream);
                } else {
                    pool.free_completed(alloc, stream);
                }
            }
            Backing::Pinned(alloc) => drop(alloc),
            Backing::Registered(r) => drop(r),
        }
    }

    /// A storage over registered host memory at `ptr` (`bytes` long, owned by
    /// `registration`), known to the device as `device_addr`.
    pub(crate) fn registered(
        device: u64,
        ptr: NonNull<u8>,
        bytes: usize,
        device_addr: u64,
        registration: Registration,
    ) -> Storage {
        let mut s = Storage::from_parts(
            device,
            MemoryKind::Pinned,
            ptr,
            bytes,
            Backing::Registered(registration),
        );
        s.device_addr = device_addr;
        s
    }

    /// Undoes the registration of registered host memory; whether it was
    /// registered (and not yet unregistered).
    pub(crate) fn unregister(&self) -> bool {
        let mut b = self.backing.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *b {
            Backing::Registered(r) => match r.undo.take() {
                Some(undo) => {
                    undo();
                    true
                }
                None => false,
            },
            _ => false,
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
    bytes: usize,
    stream: u64,
    pool: &hetero_memory::DevicePool,
) {
    let stats = pool.stats();
    hetero_trace::record_mem(hetero_trace::MemRecord {
        kind,
        ts_ns: crate::clock::now_ns(),
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

/// A typed buffer in device memory, reached only through stream operations.
///
/// Dropping the handle while work still uses the buffer is fine: the work keeps the
/// memory alive until it completes. For a buffer from [`Stream::alloc`] used only
/// on that stream, the memory returns to the stream's cache at once, and later
/// work on the stream may reuse it (stream-ordered, like `cudaFreeAsync`).
///
/// [`Stream::alloc`]: crate::Stream::alloc
pub struct DeviceBuffer<T: Pod> {
    /// Taken only by `Drop` (which recycles it when it is the last owner).
    pub(crate) storage: ManuallyDrop<Arc<Storage>>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Pod> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: `storage` is not touched again: this is the buffer's drop.
        let storage = unsafe { ManuallyDrop::take(&mut self.storage) };
        if Arc::strong_count(&storage) > 1 {
            storage.release_in_stream_order();
        } else {
            Storage::recycle(storage);
        }
    }
}

/// A typed buffer of pinned host memory: the source and destination of async copies.
pub struct PinnedBuffer<T: Pod> {
    pub(crate) storage: Arc<Storage>,
    len: usize,
    _t: PhantomData<T>,
}

macro_rules! buffer_common {
    ($ty:ident, $wrap:path) => {
        impl<T: Pod> $ty<T> {
            pub(crate) fn from_storage(storage: Arc<Storage>, len: usize) -> Self {
                debug_assert_eq!(storage.bytes(), len * std::mem::size_of::<T>());
                $ty {
                    storage: $wrap(storage),
                    len,
                    _t: PhantomData,
                }
            }

            /// Number of elements.
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether the buffer holds no elements.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// Size in bytes.
            pub fn size_bytes(&self) -> usize {
                self.len * std::mem::size_of::<T>()
            }

            /// The address the device knows the buffer by (on a device with its own
            /// memory, not a host pointer).
            pub fn device_address(&self) -> u64 {
                self.storage.device_addr()
            }

            /// The id of the device that owns the buffer.
            pub fn device_id(&self) -> u64 {
                self.storage.device
            }
        }

        impl<T: Pod> std::fmt::Debug for $ty<T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("len", &self.len)
                    .field("elem", &std::any::type_name::<T>())
                    .field("device", &self.storage.device)
                    .finish()
            }
        }
    };
}

buffer_common!(DeviceBuffer, ManuallyDrop::new);
buffer_common!(PinnedBuffer, std::convert::identity);

impl<T: Pod> PinnedBuffer<T> {
    fn check_not_stand_in(&self, op: &'static str) -> Result<()> {
        if self.storage.graph_ref != 0 {
            return Err(crate::graph::stand_in_error(op));
        }
        Ok(())
    }

    /// The contents, for reading on the host. Fails while an enqueued operation still
    /// writes into the buffer (synchronize its stream first).
    pub fn as_slice(&self) -> Result<&[T]> {
        self.check_not_stand_in("PinnedBuffer::as_slice")?;
        if self.storage.has_pending_writes() {
            self.storage.refused();
            return Err(Error::BufferBusy {
                op: "PinnedBuffer::as_slice",
                detail: "a copy or fill into it has not completed",
            });
        }
        // SAFETY: the storage holds at least `len` initialised (zeroed at allocation)
        // `T`s, aligned to 256 B; no writer is pending and none can be enqueued while
        // `&self` is borrowed (writers need `&mut`).
        Ok(unsafe { std::slice::from_raw_parts(self.storage.ptr() as *const T, self.len) })
    }

    /// The contents, for writing on the host. Fails while any enqueued operation still
    /// uses the buffer ([`Error::BufferBusy`]), and while a graph that copies
    /// from or into it exists ([`Error::HeldByGraph`]: a `Graph`, its
    /// `GraphExec` and their `Bindings` hold the buffers they name, launched or
    /// not; record such copies on a pinned slot and bind the buffer per launch
    /// to write it between launches).
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.check_not_stand_in("PinnedBuffer::as_mut_slice")?;
        let len = self.len;
        match Arc::get_mut(&mut self.storage) {
            // SAFETY: `get_mut` proved no operation holds the storage, and `&mut self`
            // keeps new ones from being enqueued while the slice lives.
            Some(s) => Ok(unsafe { std::slice::from_raw_parts_mut(s.ptr() as *mut T, len) }),
            None => {
                self.storage.refused();
                let op = "PinnedBuffer::as_mut_slice";
                match self.storage.graph_holds() {
                    0 => Err(Error::BufferBusy {
                        op,
                        detail: "an operation that reads or writes it has not completed",
                    }),
                    holds => Err(Error::HeldByGraph { op, holds }),
                }
            }
        }
    }
}

/// A buffer passed to a kernel launch, with how the kernel uses it.
#[derive(Clone, Copy)]
pub struct Arg<'a> {
    pub(crate) storage: &'a Arc<Storage>,
    pub(crate) elem: &'static crate::kernel::ElemInfo,
    pub(crate) write: bool,
}

impl<'a> Arg<'a> {
    /// The kernel reads the whole buffer; every block sees all of it.
    pub fn read<T: Pod>(buf: &'a DeviceBuffer<T>) -> Self {
        Arg {
            storage: &buf.storage,
            elem: crate::kernel::ElemInfo::of::<T>(),
            write: false,
        }
    }

    /// The kernel writes the buffer, split across blocks: with `n` blocks, block `b`
    /// gets elements `b*ceil(len/n) ..` up to the next block's start.
    pub fn write<T: Pod>(buf: &'a DeviceBuffer<T>) -> Self {
        Arg {
            write: true,
            ..Arg::read(buf)
        }
    }
}

/// Loom model of the hand-off in [`Storage::with_host_access`]: the host holds a
/// buffer's write lock while an engine looks for the op that needs it, finds
/// it taken and parks on the real `Parker`; the host's release must wake it.
/// A lost wake-up shows as a loom deadlock.
#[cfg(all(test, loom))]
mod loom_host_access {
    use super::{MemoryKind, Storage};
    use crate::loom::{Arc, AtomicU32, Ordering};
    use crate::park::Parker;

    fn model(host_writes: bool, op_writes: bool) {
        loom::model(move || {
            let storage = Arc::new(Storage::empty(1, MemoryKind::Device));
            let idle = Arc::new(Parker::new());
            let ran = Arc::new(AtomicU32::new(0));
            let (s2, p2, r2) = (storage.clone(), idle.clone(), ran.clone());
            // The engine: looks for the op (its look takes the lock or not),
            // parks while it cannot, runs it, releases as engines do.
            let engine = loom::thread::spawn(move || {
                p2.park_for(|| s2.try_acquire(op_writes).then_some(()));
                r2.fetch_add(1, Ordering::Relaxed);
                s2.release(op_writes);
            });
            storage.with_host_access(host_writes, || idle.wake(u32::MAX), || ());
            engine.join().expect("engine");
            assert_eq!(ran.load(Ordering::Relaxed), 1);
        });
    }

    #[test]
    fn loom_host_write_then_kernel_write_is_not_lost() {
        model(true, true);
    }

    #[test]
    fn loom_host_write_then_kernel_read_is_not_lost() {
        model(true, false);
    }

    #[test]
    fn loom_host_read_then_kernel_write_is_not_lost() {
        model(false, true);
    }
}
