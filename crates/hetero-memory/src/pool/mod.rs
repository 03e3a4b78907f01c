//! The device pool, three levels:
//!
//! - *chunk*: regions from a [`ChunkSource`] (the OS layer for the host
//!   backend), mapped as requests need and released when wholly free
//!   (`chunks.rs`).
//! - *block*: stream-ordered caches of freed buffers, per size class
//!   (`entry.rs`): first a per-thread cache for one (pool, stream) pair (no
//!   atomics on a hit, `thread_cache.rs`), then a per-stream slot behind a
//!   try-lock (`stream_cache.rs`), then pending frees under the pool mutex
//!   (`pending.rs`). A block freed on stream S is reused at once by later work
//!   on S; it reaches another stream only after a fence shows S's work on it
//!   finished (or, under [`ReusePolicy::FollowEventDependencies`], with that
//!   fence in [`Allocation::wait_for`]). Fences of S come from the installed
//!   [`StreamPoints`] (`point.rs`); without one, streams are treated as
//!   host-synchronous. A free of memory whose last use already completed
//!   ([`DevicePool::free_completed`]) needs no fence: such blocks reach other
//!   streams at once. Memory a queued free handed back to its own stream is
//!   flagged ([`Allocation::reused_in_stream_order`]) so the execution layer
//!   can order its uses on other streams.
//! - *buffer*: [`Tlsf`] sub-allocation inside chunks, under one mutex (the
//!   slow path, `chunks.rs`; before it grows, a host thread that ran ahead of
//!   its streams waits for queued frees).
//!
//! Stats and snapshots are in `snapshot.rs`.
//!
//! Invariants: a byte is in exactly one of {live allocation, thread cache,
//! stream slot, pending free, TLSF free}; a block never reaches a stream other
//! than its home stream before its fences are complete or handed to the new
//! user; a chunk is unmapped only when wholly free in the TLSF.

mod allocation;
mod chunks;
mod entry;
mod pending;
mod point;
mod segment;
mod snapshot;
mod stream_cache;
mod thread_cache;

pub use allocation::Allocation;
pub use point::{StreamPoint, StreamPoints};
pub use snapshot::{BlockSnapshot, BlockState, ChunkSnapshot, PoolStats, Snapshot};

use crate::config::PoolConfig;
#[cfg(doc)]
use crate::config::ReusePolicy;
use crate::error::MemoryError;
use crate::os::{ChunkSource, HostChunkSource, HostOptions};
use crate::poison::{poison, unpoison};
use crate::sync::TryLock;
use crate::tlsf::{class_of, round_size, Tlsf, GRAN};
use chunks::ChunkRec;
use crossbeam_utils::CachePadded;
use entry::{Entry, FRONT_MAX};
use pending::Pending;
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use stream_cache::{slot_index, Slot, SLOT_BITS};

/// A stream, as the execution layer numbers them.
pub type StreamId = u64;

/// Default and minimum alignment.
pub const DEFAULT_ALIGN: usize = 256;
/// Largest alignment a pool honours.
pub const MAX_ALIGN: usize = 2 << 20;

static NEXT_POOL_ID: AtomicU32 = AtomicU32::new(1);

/// What the pool mutex guards: the TLSFs, the chunks, the pending frees and
/// the slow path's counters.
struct Slow {
    tlsf: [Tlsf; 3],
    chunks: Vec<Option<ChunkRec>>,
    pending: Vec<Pending>,
    pending_bytes: usize,
    /// `seq` of the next pending entry.
    next_seq: u64,
    reserved: usize,
    peak_reserved: usize,
    /// Bytes handed out by the TLSF: live + stream-cached + pending.
    out: usize,
    peak_active: usize,
    slow_allocs: u64,
    pending_hits: u64,
    grow_waits: u64,
    /// The expandable segments, when the pool maps granules rather than chunks.
    segments: Option<segment::Segments>,
}

/// The three-level device pool. `Send + Sync`; share it with `Arc`.
///
/// Dropping the pool unmaps its chunks: keep it alive (the execution layer
/// holds an `Arc`) while any [`Allocation`] from it is in use.
///
/// ```
/// use hetero_memory::{DevicePool, PoolConfig};
/// let pool = DevicePool::new(PoolConfig::default()).unwrap();
/// let a = pool.alloc(1000, 256, 0).unwrap();
/// assert_eq!(a.ptr().as_ptr() as usize % 256, 0);
/// pool.free(a, 0, Vec::new());
/// let b = pool.alloc(1000, 256, 0).unwrap(); // a cache hit on stream 0
/// pool.free(b, 0, Vec::new());
/// assert_eq!(pool.stats().cache_hits, 1);
/// ```
pub struct DevicePool {
    s: Arc<Shared>,
}

struct Shared {
    id: u32,
    /// Bumped whenever thread caches must give their blocks back (trim, memory
    /// pressure); each thread checks it on its next call.
    epoch: AtomicU64,
    /// Thread-cache hits published so far.
    tls_hits: AtomicU64,
    config: PoolConfig,
    source: Arc<dyn ChunkSource>,
    points: std::sync::OnceLock<Arc<dyn StreamPoints>>,
    slots: Box<[CachePadded<TryLock<Slot>>]>,
    slow: Mutex<Slow>,
}

impl fmt::Debug for DevicePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevicePool")
            .field("id", &self.s.id)
            .field("config", &self.s.config)
            .field("source", &self.s.source)
            .finish_non_exhaustive()
    }
}

fn invalid(what: String) -> MemoryError {
    MemoryError::InvalidRequest {
        what,
        hint: "sizes must be 1 byte to 2^48 bytes, alignments a power of two up to 2 MiB (0 means 256)",
    }
}

impl DevicePool {
    /// A pool over the host backend: chunks come from the OS layer.
    pub fn new(config: PoolConfig) -> Result<Self, MemoryError> {
        let source = HostChunkSource::new(HostOptions {
            huge_pages: config.huge_pages,
            prefault: config.prefault,
            ..HostOptions::default()
        });
        let expandable = config.expandable_segments;
        Self::build(config, Arc::new(source), expandable)
    }

    /// A pool over another chunk source (another backend, or fault injection).
    /// Such a pool maps chunks even with
    /// [`PoolConfig::expandable_segments`] set (the source hands out chunks,
    /// not granules); [`PoolStats::expandable`] says which a pool does.
    pub fn with_source(
        config: PoolConfig,
        source: Arc<dyn ChunkSource>,
    ) -> Result<Self, MemoryError> {
        if config.expandable_segments {
            tracing::info!(
                ?source,
                "expandable_segments applies to host memory; this pool's source maps chunks"
            );
        }
        Self::build(config, source, false)
    }

    fn build(
        config: PoolConfig,
        source: Arc<dyn ChunkSource>,
        expandable: bool,
    ) -> Result<Self, MemoryError> {
        let segments = expandable.then(|| segment::Segments::new(&config));
        let slots = (0..1usize << SLOT_BITS)
            .map(|_| CachePadded::new(TryLock::new(Slot::new())))
            .collect();
        Ok(DevicePool {
            s: Arc::new(Shared {
                id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
                epoch: AtomicU64::new(0),
                tls_hits: AtomicU64::new(0),
                config,
                source,
                points: std::sync::OnceLock::new(),
                slots,
                slow: Mutex::new(Slow {
                    // Small buffers favour speed (plain good fit inside 2 MiB
                    // chunks); large ones favour packing (bounded address order).
                    tlsf: [
                        {
                            // With segments every kind packs low: mapped
                            // granules follow the buffers handed out.
                            let mut t = Tlsf::new();
                            t.set_address_bins(if expandable { 8 } else { 0 });
                            t
                        },
                        Tlsf::new(),
                        Tlsf::new(),
                    ],
                    chunks: Vec::new(),
                    pending: Vec::new(),
                    pending_bytes: 0,
                    next_seq: 0,
                    reserved: 0,
                    peak_reserved: 0,
                    out: 0,
                    peak_active: 0,
                    slow_allocs: 0,
                    pending_hits: 0,
                    grow_waits: 0,
                    segments,
                }),
            }),
        })
    }

    /// Installs the execution layer's fence recorder (once; later calls are
    /// ignored and return false).
    pub fn set_stream_points(&self, fences: Arc<dyn StreamPoints>) -> bool {
        self.s.points.set(fences).is_ok()
    }

    pub fn config(&self) -> &PoolConfig {
        &self.s.config
    }

    /// Stream-ordered allocation of `size` bytes aligned to `align` (a power of
    /// two up to 2 MiB; 0 means 256) for use on `stream`.
    #[inline]
    pub fn alloc(
        &self,
        size: usize,
        align: usize,
        stream: StreamId,
    ) -> Result<Allocation, MemoryError> {
        if size.wrapping_sub(1) < FRONT_MAX
            && (align == 0 || align.is_power_of_two())
            && align <= MAX_ALIGN
        {
            if let Some(a) = self.alloc_cached(size, align, stream) {
                return Ok(a);
            }
        }
        self.s.alloc(size, align, stream)
    }

    /// A 2-D allocation of `height` rows of `width` bytes, each row starting at
    /// a multiple of `row_align` (a power of two; 0 means 256). Returns the
    /// allocation and the pitch (bytes from one row to the next).
    ///
    /// ```
    /// use hetero_memory::{DevicePool, PoolConfig};
    /// let pool = DevicePool::new(PoolConfig::default()).unwrap();
    /// let (a, pitch) = pool.alloc_pitched(1000, 4, 512, 0).unwrap();
    /// assert_eq!(pitch, 1024);
    /// assert_eq!(a.size(), 4 * 1024);
    /// pool.free(a, 0, Vec::new());
    /// ```
    pub fn alloc_pitched(
        &self,
        width: usize,
        height: usize,
        row_align: usize,
        stream: StreamId,
    ) -> Result<(Allocation, usize), MemoryError> {
        let valid = (row_align == 0 || row_align.is_power_of_two()) && row_align <= MAX_ALIGN;
        let row_align = row_align.max(DEFAULT_ALIGN);
        let pitch = valid
            .then(|| width.checked_next_multiple_of(row_align))
            .flatten();
        let bytes = pitch.and_then(|p| p.checked_mul(height)).filter(|b| *b > 0);
        match (pitch, bytes) {
            (Some(pitch), Some(bytes)) => Ok((self.alloc(bytes, row_align, stream)?, pitch)),
            _ => Err(invalid(format!(
                "pitched alloc of {height} rows of {width} bytes aligned to {row_align}"
            ))),
        }
    }

    /// Stream-ordered free, like [`DevicePool::free`], that skips the calling
    /// thread's cache: for threads that free what other threads allocate (an
    /// engine completing the last use of a buffer). Their cache would hide the
    /// block from the allocating thread; the stream's shared cache does not.
    pub fn free_uncached(&self, a: Allocation, stream: StreamId, uses: Vec<Arc<dyn StreamPoint>>) {
        self.s.free(a, stream, uses, true)
    }

    /// Stream-ordered free: `stream` is where the memory was last used in order;
    /// `uses` are fences of its last use on other streams (like PyTorch's
    /// recordStream). The memory is reused on `stream` at once, elsewhere only
    /// after those fences (and a fence of `stream`'s work) complete.
    ///
    /// Work queued on `stream` may still use the memory: it is not poisoned,
    /// and it returns to the chunks only after a fence of `stream` completes.
    /// That fence comes from the installed [`StreamPoints`]; without one, the
    /// caller promises that the stream's work on it has completed.
    #[inline]
    pub fn free(&self, a: Allocation, stream: StreamId, uses: Vec<Arc<dyn StreamPoint>>) {
        if uses.is_empty() {
            self.free_cached(a, stream, true);
        } else {
            self.s.free(a, stream, uses, true)
        }
    }

    /// Free of memory that the work behind `uses` may still use, and that no
    /// stream ordered itself after (its new owner could not wait for them):
    /// held back from every stream, `stream` included, until they all
    /// complete, as [`DevicePool::free_used_on`] holds its fences. The pool
    /// reaps it on a later call; no thread waits for it.
    pub fn free_after(&self, a: Allocation, stream: StreamId, uses: Vec<Arc<dyn StreamPoint>>) {
        if a.pool != self.s.id {
            tracing::error!(?a, "free of an allocation from another pool; it is leaked");
            return;
        }
        self.s.free_slow(a, stream, uses, true, true);
    }

    /// Stream-ordered free of memory that work queued on `stream` and on each of
    /// `others` may still use (a buffer used on several streams, dropped before
    /// that work completed). The pool records a fence at the current end of
    /// each of those streams (with the installed [`StreamPoints`]) and gives the
    /// memory to no stream, `stream` included, before they all complete, so no
    /// stream is made to wait for one it never waited for. Unlike memory kept
    /// alive by the work itself, the pool knows these bytes are free soon: a
    /// host thread about to map more waits for them first
    /// ([`PoolConfig::wait_before_grow_ratio`]). Without an installed recorder
    /// the caller promises every stream's work on it completed.
    pub fn free_used_on(&self, a: Allocation, stream: StreamId, others: &[StreamId]) {
        if a.pool != self.s.id {
            tracing::error!(?a, "free of an allocation from another pool; it is leaked");
            return;
        }
        let uses: Vec<Arc<dyn StreamPoint>> = match self.s.points.get() {
            Some(r) => others
                .iter()
                .filter(|&&o| o != stream)
                .map(|&o| r.record(o))
                .collect(),
            None => Vec::new(),
        };
        self.s.free_slow(a, stream, uses, true, true);
    }

    /// Free of memory whose last use, on every stream, has completed: reused
    /// on `stream` first, and by other streams without any fence.
    #[inline]
    pub fn free_completed(&self, a: Allocation, stream: StreamId) {
        self.free_cached(a, stream, false)
    }

    /// [`DevicePool::free_completed`] past the calling thread's cache (see
    /// [`DevicePool::free_uncached`]).
    pub fn free_completed_uncached(&self, a: Allocation, stream: StreamId) {
        self.s.free(a, stream, Vec::new(), false)
    }

    /// Returns cached blocks and completed frees to the chunks and unmaps every
    /// wholly free chunk; the bytes released to the backend. Other threads'
    /// caches give their blocks back on their next call.
    pub fn trim(&self) -> usize {
        self.s.trim()
    }

    /// A number that changes whenever the pool asks threads to give back the
    /// memory they hold in caches of their own (trim, memory pressure). A
    /// caller that keeps freed-but-held memory in front of the pool (the
    /// execution layer's recycled buffers) gives it back when it changed.
    #[inline]
    pub fn epoch(&self) -> u64 {
        self.s.epoch.load(Ordering::Relaxed)
    }

    /// Counts `n` allocations served in front of the pool from memory it
    /// handed out before (the execution layer's recycled buffers) as cache
    /// hits, so `allocations`, `cache_hits` and `hit_rate` include them.
    pub fn note_front_hits(&self, n: u64) {
        self.s.tls_hits.fetch_add(n, Ordering::Relaxed);
    }

    pub fn stats(&self) -> PoolStats {
        self.s.stats()
    }

    /// Every chunk and block with its state and stream.
    pub fn snapshot(&self) -> Snapshot {
        self.s.snapshot()
    }

    /// The snapshot as JSON.
    pub fn snapshot_json(&self) -> serde_json::Value {
        serde_json::to_value(self.s.snapshot()).unwrap_or(serde_json::Value::Null)
    }
}

impl Shared {
    #[inline(always)]
    fn alloc(
        &self,
        size: usize,
        align: usize,
        stream: StreamId,
    ) -> Result<Allocation, MemoryError> {
        if size == 0
            || size > 1 << 48
            || !(align == 0 || align.is_power_of_two())
            || align > MAX_ALIGN
        {
            return Err(invalid(format!("alloc of {size} bytes aligned to {align}")));
        }
        let align = align.max(DEFAULT_ALIGN);
        let rounded = round_size(size as u64) as usize;
        if rounded <= FRONT_MAX {
            let class = class_of(rounded as u64);
            let slot = &self.slots[slot_index(stream)];
            if let Some(Some(e)) = slot.try_with(|s| s.pop(stream, class, align)) {
                unpoison(e.addr() as *const u8, size);
                return Ok(Allocation::from_entry(e, size, self.id, class));
            }
            return self.alloc_slow(size, rounded, align, stream);
        }
        // Above the cached sizes, blocks are cut to the byte granularity, not to
        // the size class: no per-class cache needs them uniform, and class
        // rounding would waste up to 1/8 of every large buffer.
        let exact = size.next_multiple_of(GRAN as usize);
        self.alloc_slow(size, exact, align, stream)
    }

    #[inline(always)]
    fn free(&self, a: Allocation, stream: StreamId, uses: Vec<Arc<dyn StreamPoint>>, queued: bool) {
        if a.pool != self.id {
            tracing::error!(?a, "free of an allocation from another pool; it is leaked");
            return;
        }
        if uses.is_empty() && self.may_poison(queued) {
            poison(a.ptr.as_ptr(), a.block);
        }
        if uses.is_empty() && a.block <= FRONT_MAX {
            let e = Entry::of(&a, queued);
            let class = usize::from(a.class);
            let cap = self.config.stream_cache_bytes;
            let slot = &self.slots[slot_index(stream)];
            if slot.try_with(|s| s.push(stream, class, e, cap)) == Some(true) {
                return;
            }
        }
        self.free_slow(a, stream, uses, queued, false);
    }

    /// Whether a freed block may be poisoned now (AddressSanitizer builds only):
    /// memory that queued work may still touch is poisoned when it returns to
    /// the chunks. Without a fence recorder the caller promised that the
    /// stream's work on it completed.
    #[inline(always)]
    fn may_poison(&self, queued: bool) -> bool {
        cfg!(hetero_asan) && (!queued || self.points.get().is_none())
    }

    fn lock(&self) -> MutexGuard<'_, Slow> {
        // A panic while holding the lock cannot leave the TLSF half-updated in a
        // way later calls rely on more than on the lock itself; keep serving.
        self.slow.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn trim(&self) -> usize {
        let mut g = self.lock();
        self.flush_slots(&mut g);
        self.reap(&mut g);
        let chunks = self.release_free_chunks(&mut g, None);
        chunks + self.release_granules(&mut g, 0)
    }
}
