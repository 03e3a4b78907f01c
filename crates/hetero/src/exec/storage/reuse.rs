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

use super::{record_mem, Backing, MemoryKind, Registration, Storage};
use crate::exec::loom::Ordering;
use crate::Result;
use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::Arc;

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
        if crate::exec::clock::profiling() {
            record_mem(hetero_trace::MemKind::Alloc, device, bytes, stream, pool);
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
            _ => Self::dangling(),
        };
        self.host = ptr;
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
            && !crate::exec::clock::profiling()
            && !crate::exec::thread::on_engine_thread()
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
    pub(crate) fn recycle(mut arc: Arc<Storage>) {
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
    pub(super) fn release_backing(&mut self) {
        let b = self.backing.get_mut().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(b, Backing::Empty) {
            Backing::Empty => {}
            Backing::Device { alloc, stream } => {
                let Some(pool) = &self.pool else {
                    return; // device memory always comes with its pool
                };
                if crate::exec::clock::profiling() {
                    record_mem(
                        hetero_trace::MemKind::Free,
                        self.device,
                        self.bytes,
                        stream,
                        pool,
                    );
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
                if crate::exec::thread::on_engine_thread() {
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
