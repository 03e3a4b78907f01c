//! The device pool, three levels:
//!
//! - *chunk*: regions from a [`ChunkSource`] (the OS layer for the host backend).
//!   Requests up to 1 MiB are packed into 2 MiB chunks, 1–10 MiB share 20 MiB
//!   chunks, larger ones get a chunk of their size rounded up to 2 MiB and are
//!   never split. Before a new chunk is mapped, wholly free chunks are released,
//!   so reserved memory follows live memory when sizes grow.
//! - *block*: stream-ordered caches of freed buffers, per size class: first a
//!   per-thread cache for one (pool, stream) pair (no atomics on a hit), then a
//!   per-stream slot behind a try-lock, then pending frees under the pool
//!   mutex. A block freed on stream S is reused at once by later work on S; it
//!   reaches another stream only after a fence shows S's work on it finished
//!   (or, under [`ReusePolicy::FollowEventDependencies`], with that fence in
//!   [`Allocation::wait_for`]). Fences of S come from the installed
//!   [`StreamFences`]; without one, streams are treated as host-synchronous.
//!   A free of memory whose last use already completed
//!   ([`DevicePool::free_completed`]) needs no fence: such blocks reach other
//!   streams at once. Memory a queued free handed back to its own stream is
//!   flagged ([`Allocation::reused_in_stream_order`]) so the execution layer
//!   can order its uses on other streams.
//! - *buffer*: [`Tlsf`] sub-allocation inside chunks, under one mutex (the slow path).
//!
//! Running ahead: a host that submits faster than its streams run frees memory
//! its queued work still uses; those pending frees return to the chunks only
//! when their fences complete. Before mapping a chunk that would take reserved
//! past [`PoolConfig::wait_before_grow_ratio`] times the bytes in use, a host
//! thread waits (without the pool lock) for the fences of the oldest pending
//! free and retries from what it freed, until none is left; only then does it
//! map. Engine threads never wait (the work may be queued behind the op they
//! run, [`crate::thread_role`]); they map, as does every thread when the ratio
//! is off. PyTorch's caching allocator likewise frees and retries before it
//! fails; here the retry also comes before growing.
//!
//! Invariants: a byte is in exactly one of {live allocation, thread cache,
//! stream slot, pending free, TLSF free}; a block never reaches a stream other
//! than its home stream before its fences are complete or handed to the new
//! user; a chunk is unmapped only when wholly free in the TLSF.
//!
//! Known limit: a thread cache can be emptied only by its own thread. Other
//! threads ask for its blocks back by bumping the pool's epoch (trim, memory
//! pressure); an idle thread keeps at most 8 MiB until its next call or exit.

use crate::config::{PoolConfig, ReusePolicy};
use crate::error::{Bytes, MemoryError};
use crate::os::{Chunk, ChunkSource, HostChunkSource, HostOptions, OsCalls, PageKind, HUGE_2M};
use crate::poison::{poison, unpoison};
use crate::sync::TryLock;
use crate::thread_role;
use crate::tlsf::{class_of, round_size, Placement, Tlsf, GRAN};
use crossbeam_utils::CachePadded;
use serde::Serialize;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A stream, as the execution layer numbers them.
pub type StreamId = u64;

/// Completion of some stream work (hetero's `Event` implements this).
pub trait Fence: Send + Sync + fmt::Debug {
    fn is_complete(&self) -> bool;
    fn wait(&self);
    /// The concrete fence, for an execution layer that turns its own fences
    /// into device-side waits instead of host waits.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

/// Records a fence at the current end of a stream: the execution layer
/// implements it so the pool can learn when a stream's work on a freed block
/// is done before handing the block to another stream. Without one, the pool
/// treats streams as host-synchronous (their work is done when `free` is called).
pub trait StreamFences: Send + Sync + fmt::Debug {
    fn record(&self, stream: StreamId) -> Arc<dyn Fence>;
}

/// Default and minimum alignment.
pub const DEFAULT_ALIGN: usize = 256;
/// Largest alignment a pool honours.
pub const MAX_ALIGN: usize = 2 << 20;
/// Largest block kept in the per-stream caches.
const FRONT_MAX: usize = 1 << 20;
const CLASS_BASE: usize = 64; // class_of(256)
const NCLASS: usize = 20 * 8 + 1 - CLASS_BASE; // up to class_of(1 MiB)
const PER_CLASS: usize = 8;
const SLOT_BITS: u32 = 6;
const SMALL_CHUNK: usize = 2 << 20;
const LARGE_CHUNK: usize = 20 << 20;
const LARGE_MAX: usize = 10 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    Small = 0,
    Large = 1,
    Huge = 2,
}

impl Kind {
    fn name(self) -> &'static str {
        ["small", "large", "huge"][self as usize]
    }
}

static NEXT_POOL_ID: AtomicU32 = AtomicU32::new(1);

/// Memory from a [`DevicePool`]. It does not free itself: return it with
/// [`DevicePool::free`] (the execution layer's buffers do so stream-ordered on drop).
#[must_use = "an Allocation leaks unless given back with DevicePool::free"]
pub struct Allocation {
    ptr: NonNull<u8>,
    size: usize,
    block: usize,
    node: u32,
    /// A `Kind` as its discriminant (the hot path copies it without converting).
    kind: u8,
    pool: u32,
    // One pointer, not a 24-byte Vec: the hot path returns an Allocation
    // through memory, and at 64 bytes the copy cost 33 ns per alloc+free
    // against 19 ns at 48 (examples/hit_loop.rs).
    #[allow(clippy::box_collection)]
    wait_for: Option<Box<Vec<Arc<dyn Fence>>>>,
    /// Freed on the allocating stream while work queued there could still use it.
    queued: bool,
    /// `class_of(block)` for cacheable blocks (saves recomputing it on free).
    class: u8,
}

// SAFETY: an Allocation is a unique handle to a byte range; nothing in it is tied
// to a thread, and the fences it carries are Send + Sync.
unsafe impl Send for Allocation {}
// SAFETY: `&Allocation` only exposes the address, sizes and fences (all read-only).
unsafe impl Sync for Allocation {}

impl Allocation {
    /// The first byte, aligned as requested.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }
    /// The size requested.
    pub fn size(&self) -> usize {
        self.size
    }
    /// Fences the first use of this memory must wait for on a stream other than
    /// the one it was allocated on (cross-stream reuse under the "follow event
    /// dependencies" policy); empty when none.
    pub fn wait_for(&self) -> &[Arc<dyn Fence>] {
        self.wait_for.as_deref().map_or(&[], Vec::as_slice)
    }

    /// Takes the fences out of [`Allocation::wait_for`] (once the caller has
    /// ordered the first use after them).
    pub fn take_wait_for(&mut self) -> Vec<Arc<dyn Fence>> {
        self.wait_for.take().map_or_else(Vec::new, |b| *b)
    }

    /// Whether this memory was freed (with [`DevicePool::free`]) on the stream it
    /// is now allocated for while work queued on that stream could still use it.
    /// Later work on that stream is ordered after that work; work on any other
    /// stream must first wait for the allocating stream to reach this point.
    pub fn reused_in_stream_order(&self) -> bool {
        self.queued
    }
}

impl fmt::Debug for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocation")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .field("block", &self.block)
            .field("wait_for", &self.wait_for().len())
            .finish()
    }
}

/// A cached block in 16 bytes (the hot path copies it in and out of caches):
/// its address, with the kind in bits 0–1 and the queued flag (freed while its
/// stream's queued work could still use it, see `Pending::queued`) in bit 2, as
/// blocks are at least 256-byte aligned; its size and its TLSF node.
#[derive(Clone, Copy)]
struct Entry {
    word: usize,
    block: u32,
    node: u32,
}

impl Entry {
    #[inline(always)]
    fn of(a: &Allocation, queued: bool) -> Entry {
        Entry {
            word: a.ptr.as_ptr() as usize | a.kind as usize | usize::from(queued) << 2,
            block: a.block as u32,
            node: a.node,
        }
    }
    #[inline(always)]
    fn addr(self) -> usize {
        self.word & !7
    }
    #[inline(always)]
    fn kind(self) -> u8 {
        (self.word & 3) as u8
    }
    #[inline(always)]
    fn queued(self) -> bool {
        self.word & 4 != 0
    }
}

impl Allocation {
    /// A cached block of `class`, handed out for `size` bytes.
    #[inline(always)]
    fn from_entry(e: Entry, size: usize, pool: u32, class: usize) -> Allocation {
        Allocation {
            // SAFETY: cached addresses come from chunks, which are never null.
            ptr: unsafe { NonNull::new_unchecked(e.addr() as *mut u8) },
            size,
            block: e.block as usize,
            node: e.node,
            kind: e.kind(),
            pool,
            wait_for: None,
            queued: e.queued(),
            class: class as u8,
        }
    }
}

/// The cache class of a block of `block` bytes (0 when too large to cache).
fn class_for_block(block: usize) -> u8 {
    if block <= FRONT_MAX {
        class_of(block as u64) as u8
    } else {
        0
    }
}

/// Blocks per size class in a thread cache.
const T_PER_CLASS: usize = 4;
/// Most bytes one thread cache holds.
const T_MAX_BYTES: usize = 8 << 20;
/// Thread-cache hits are added to the pool's counter in batches of this many.
const PUBLISH_EVERY: u32 = 1024;

const BLANK: Entry = Entry {
    word: 0,
    block: 0,
    node: 0,
};

/// The front of the block level: each thread keeps the last blocks it freed on
/// one (pool, stream) pair, so a same-stream reuse on the same thread touches
/// no shared cache line at all. Other threads cannot reach these blocks; they
/// ask for them back by bumping the pool's epoch (trim, memory pressure), and
/// the thread returns them on its next free or when it exits. The cache is
/// small (4 blocks per class, 8 MiB) to bound what an idle thread can hold.
struct ThreadCache {
    pool: u32,
    stream: StreamId,
    epoch: u64,
    count: u32,
    bytes: usize,
    unpublished_hits: u32,
    owner: std::sync::Weak<Shared>,
    lens: [u8; NCLASS],
    entries: [[Entry; T_PER_CLASS]; NCLASS],
}

enum Push {
    Done,
    No,
    Stale(StreamId, Vec<Entry>, u64),
}

impl ThreadCache {
    const EMPTY: ThreadCache = ThreadCache {
        pool: 0,
        stream: 0,
        epoch: 0,
        count: 0,
        bytes: 0,
        unpublished_hits: 0,
        owner: std::sync::Weak::new(),
        lens: [0; NCLASS],
        entries: [[BLANK; T_PER_CLASS]; NCLASS],
    };

    /// A cached block for (pool, stream) of `class`, and whether a batch of
    /// hits is due to be published.
    #[inline(always)]
    fn pop(
        &mut self,
        pool: u32,
        stream: StreamId,
        epoch: u64,
        class: usize,
        align: usize,
    ) -> Option<(Entry, bool)> {
        if self.pool != pool || self.stream != stream || self.epoch != epoch {
            return None;
        }
        let c = class - CLASS_BASE;
        let len = self.lens[c] as usize;
        if len == 0 {
            return None;
        }
        let e = self.entries[c][len - 1];
        if e.addr() & (align - 1) != 0 {
            return None;
        }
        self.lens[c] -= 1;
        self.count -= 1;
        self.bytes -= e.block as usize;
        self.unpublished_hits += 1;
        let publish = self.unpublished_hits == PUBLISH_EVERY;
        if publish {
            self.unpublished_hits = 0;
        }
        Some((e, publish))
    }

    #[inline(always)]
    fn push(
        &mut self,
        shared: &Arc<Shared>,
        stream: StreamId,
        epoch: u64,
        class: usize,
        e: Entry,
    ) -> Push {
        if self.count > 0 && self.pool != shared.id && self.owner.strong_count() == 0 {
            // The pool these blocks came from is gone, and its memory with it.
            let _ = self.take_all();
            self.pool = 0;
        }
        if self.count > 0 {
            if self.pool != shared.id || self.stream != stream {
                return Push::No;
            }
            if self.epoch != epoch {
                let (st, v, h) = self.take_all();
                return Push::Stale(st, v, h);
            }
        } else if self.pool != shared.id {
            if let Some(old) = self.owner.upgrade() {
                old.tls_hits
                    .fetch_add(u64::from(self.unpublished_hits), Ordering::Relaxed);
            }
            self.owner = Arc::downgrade(shared);
            self.pool = shared.id;
            self.unpublished_hits = 0;
        }
        self.stream = stream;
        self.epoch = epoch;
        let c = class - CLASS_BASE;
        let len = self.lens[c] as usize;
        if len == T_PER_CLASS || self.bytes + e.block as usize > T_MAX_BYTES {
            return Push::No;
        }
        self.entries[c][len] = e;
        self.lens[c] += 1;
        self.count += 1;
        self.bytes += e.block as usize;
        Push::Done
    }

    /// Empties the cache: its stream, blocks and unpublished hits.
    #[cold]
    fn take_all(&mut self) -> (StreamId, Vec<Entry>, u64) {
        let mut v = Vec::with_capacity(self.count as usize);
        for c in 0..NCLASS {
            v.extend_from_slice(&self.entries[c][..self.lens[c] as usize]);
        }
        self.lens = [0; NCLASS];
        self.count = 0;
        self.bytes = 0;
        let hits = u64::from(std::mem::take(&mut self.unpublished_hits));
        (self.stream, v, hits)
    }
}

impl Drop for ThreadCache {
    fn drop(&mut self) {
        if let Some(shared) = self.owner.upgrade() {
            let (stream, v, hits) = self.take_all();
            shared.return_entries(stream, v, hits);
        }
    }
}

thread_local! {
    static TCACHE: std::cell::RefCell<ThreadCache> = const { std::cell::RefCell::new(ThreadCache::EMPTY) };
}

/// One stream's block cache (a slot is owned by the first stream that hashes to it).
struct Slot {
    owner: Option<StreamId>,
    lens: [u8; NCLASS],
    entries: Vec<Entry>,
    cached_bytes: usize,
    cached_count: usize,
    hits: u64,
}

impl Slot {
    fn new() -> Self {
        Slot {
            owner: None,
            lens: [0; NCLASS],
            entries: Vec::new(),
            cached_bytes: 0,
            cached_count: 0,
            hits: 0,
        }
    }

    #[inline(always)]
    fn pop(&mut self, stream: StreamId, class: usize, align: usize) -> Option<Entry> {
        if self.owner != Some(stream) {
            return None;
        }
        let c = class - CLASS_BASE;
        let len = self.lens[c] as usize;
        if len == 0 {
            return None;
        }
        let e = self.entries[c * PER_CLASS + len - 1];
        if e.addr() & (align - 1) != 0 {
            return None;
        }
        self.lens[c] -= 1;
        self.cached_bytes -= e.block as usize;
        self.cached_count -= 1;
        self.hits += 1;
        Some(e)
    }

    #[inline(always)]
    fn push(&mut self, stream: StreamId, class: usize, e: Entry, cap_bytes: usize) -> bool {
        if self.owner != Some(stream) {
            if self.cached_count != 0 {
                return false;
            }
            self.owner = Some(stream);
            if self.entries.is_empty() {
                self.entries = vec![BLANK; NCLASS * PER_CLASS];
            }
        }
        let c = class - CLASS_BASE;
        let len = self.lens[c] as usize;
        if len == PER_CLASS || self.cached_bytes + e.block as usize > cap_bytes {
            return false;
        }
        self.entries[c * PER_CLASS + len] = e;
        self.lens[c] += 1;
        self.cached_bytes += e.block as usize;
        self.cached_count += 1;
        true
    }

    fn drain(&mut self) -> impl Iterator<Item = Entry> + '_ {
        let owner_entries = &self.entries;
        let lens = std::mem::replace(&mut self.lens, [0; NCLASS]);
        self.cached_bytes = 0;
        self.cached_count = 0;
        self.owner = None;
        (0..NCLASS)
            .flat_map(move |c| (0..lens[c] as usize).map(move |i| owner_entries[c * PER_CLASS + i]))
    }
}

struct Pending {
    addr: usize,
    block: usize,
    node: u32,
    /// A `Kind` as its discriminant.
    kind: u8,
    home: StreamId,
    /// Work on `home` may still use the block: it reaches another stream only
    /// after `home_fence` (recorded when first needed) completes. False for
    /// blocks freed after their last use completed.
    queued: bool,
    home_fence: Option<Arc<dyn Fence>>,
    uses: Vec<Arc<dyn Fence>>,
    /// Reused by no stream, its home included, before every fence completed
    /// ([`DevicePool::free_used_on`]).
    hold: bool,
    /// Order of arrival in the pending list: the fences of an older entry were
    /// recorded no later than a newer one's, so its work finishes first.
    seq: u64,
}

struct ChunkRec {
    chunk: Chunk,
    kind: Kind,
    head: u32,
}

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
}

/// Counters and figures of a pool.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PoolStats {
    /// Bytes in live allocations (whole blocks).
    pub allocated: usize,
    /// Bytes held in chunks.
    pub reserved: usize,
    pub peak_reserved: usize,
    /// Peak of live + cached bytes, updated on the slow path.
    pub peak_active: usize,
    /// Bytes in stream caches and pending stream-ordered frees.
    pub cached: usize,
    /// Bytes free in chunks.
    pub free: usize,
    pub largest_free: usize,
    /// 1 − largest_free / free.
    pub fragmentation: f64,
    pub allocations: u64,
    pub cache_hits: u64,
    pub hit_rate: f64,
    pub chunks: usize,
    pub os_calls: OsCalls,
    /// Times a host thread waited for queued frees instead of mapping a chunk
    /// ([`PoolConfig::wait_before_grow_ratio`]).
    pub grow_waits: u64,
}

/// State of one block in a [`Snapshot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    Free,
    Live,
    StreamCached,
    PendingFree,
}

#[derive(Debug, Clone, Serialize)]
pub struct BlockSnapshot {
    pub address: u64,
    pub size: u64,
    pub state: BlockState,
    /// The stream that last allocated it (live) or owns it (cached, pending).
    pub stream: Option<StreamId>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChunkSnapshot {
    pub address: u64,
    pub size: usize,
    pub kind: &'static str,
    pub page: PageKind,
    pub pinned: bool,
    pub notes: Vec<String>,
    pub blocks: Vec<BlockSnapshot>,
}

/// Every chunk and block of a pool, like PyTorch's memory snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    pub config: PoolConfig,
    pub stats: PoolStats,
    pub chunks: Vec<ChunkSnapshot>,
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
    fences: std::sync::OnceLock<Arc<dyn StreamFences>>,
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

#[inline(always)]
fn slot_index(stream: StreamId) -> usize {
    (stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOT_BITS)) as usize
}

/// The chunk mapped for a request of `need` bytes of `kind`.
fn chunk_size(kind: Kind, need: usize) -> usize {
    match kind {
        Kind::Small => SMALL_CHUNK,
        Kind::Large => LARGE_CHUNK,
        Kind::Huge => need.div_ceil(HUGE_2M) * HUGE_2M,
    }
}

fn kind_of(need: usize, max_split: usize) -> Kind {
    if need > LARGE_MAX || need > max_split {
        Kind::Huge
    } else if need > FRONT_MAX {
        Kind::Large
    } else {
        Kind::Small
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
        Self::with_source(config, Arc::new(source))
    }

    /// A pool over another chunk source (another backend, or fault injection).
    pub fn with_source(
        config: PoolConfig,
        source: Arc<dyn ChunkSource>,
    ) -> Result<Self, MemoryError> {
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
                fences: std::sync::OnceLock::new(),
                slots,
                slow: Mutex::new(Slow {
                    // Small buffers favour speed (plain good fit inside 2 MiB
                    // chunks); large ones favour packing (bounded address order).
                    tlsf: [
                        {
                            let mut t = Tlsf::new();
                            t.set_address_bins(0);
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
                }),
            }),
        })
    }

    /// Installs the execution layer's fence recorder (once; later calls are
    /// ignored and return false).
    pub fn set_stream_fences(&self, fences: Arc<dyn StreamFences>) -> bool {
        self.s.fences.set(fences).is_ok()
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
            let align = align.max(DEFAULT_ALIGN);
            let class = class_of(round_size(size as u64));
            let (id, epoch) = (self.s.id, self.s.epoch.load(Ordering::Relaxed));
            let hit = TCACHE
                .try_with(|c| {
                    c.try_borrow_mut()
                        .ok()?
                        .pop(id, stream, epoch, class, align)
                })
                .ok()
                .flatten();
            if let Some((e, publish)) = hit {
                if publish {
                    self.s
                        .tls_hits
                        .fetch_add(u64::from(PUBLISH_EVERY), Ordering::Relaxed);
                }
                unpoison(e.addr() as *const u8, size);
                return Ok(Allocation::from_entry(e, size, id, class));
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
    pub fn free_shared(&self, a: Allocation, stream: StreamId, uses: Vec<Arc<dyn Fence>>) {
        self.s.free(a, stream, uses, true)
    }

    /// Stream-ordered free: `stream` is where the memory was last used in order;
    /// `uses` are fences of its last use on other streams (like PyTorch's
    /// recordStream). The memory is reused on `stream` at once, elsewhere only
    /// after those fences (and a fence of `stream`'s work) complete.
    ///
    /// Work queued on `stream` may still use the memory: it is not poisoned,
    /// and it returns to the chunks only after a fence of `stream` completes.
    /// That fence comes from the installed [`StreamFences`]; without one, the
    /// caller promises that the stream's work on it has completed.
    #[inline]
    pub fn free(&self, a: Allocation, stream: StreamId, uses: Vec<Arc<dyn Fence>>) {
        if uses.is_empty() {
            self.free_cached(a, stream, true);
        } else {
            self.s.free(a, stream, uses, true)
        }
    }

    /// Stream-ordered free of memory that work queued on `stream` and on each of
    /// `others` may still use (a buffer used on several streams, dropped before
    /// that work completed). The pool records a fence at the current end of
    /// each of those streams (with the installed [`StreamFences`]) and gives the
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
        let uses: Vec<Arc<dyn Fence>> = match self.s.fences.get() {
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
    /// [`DevicePool::free_shared`]).
    pub fn free_completed_shared(&self, a: Allocation, stream: StreamId) {
        self.s.free(a, stream, Vec::new(), false)
    }

    /// The hot path of both frees: into the calling thread's cache.
    #[inline(always)]
    fn free_cached(&self, a: Allocation, stream: StreamId, queued: bool) {
        if a.pool == self.s.id && a.block <= FRONT_MAX {
            if self.s.may_poison(queued) {
                poison(a.ptr.as_ptr(), a.block);
            }
            let e = Entry::of(&a, queued);
            let class = usize::from(a.class);
            let epoch = self.s.epoch.load(Ordering::Relaxed);
            let pushed = TCACHE.try_with(|c| match c.try_borrow_mut() {
                Ok(mut tc) => tc.push(&self.s, stream, epoch, class, e),
                Err(_) => Push::No,
            });
            match pushed {
                Ok(Push::Done) => return,
                Ok(Push::Stale(st, v, hits)) => self.s.return_entries(st, v, hits),
                Ok(Push::No) | Err(_) => {}
            }
        }
        self.s.free(a, stream, Vec::new(), queued)
    }

    /// Returns cached blocks and completed frees to the chunks and unmaps every
    /// wholly free chunk; the bytes released to the backend. Other threads'
    /// caches give their blocks back on their next call.
    pub fn trim(&self) -> usize {
        self.s.trim()
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
    fn free(&self, a: Allocation, stream: StreamId, uses: Vec<Arc<dyn Fence>>, queued: bool) {
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
        cfg!(hetero_asan) && (!queued || self.fences.get().is_none())
    }

    fn lock(&self) -> MutexGuard<'_, Slow> {
        // A panic while holding the lock cannot leave the TLSF half-updated in a
        // way later calls rely on more than on the lock itself; keep serving.
        self.slow.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cold]
    fn free_slow(
        &self,
        a: Allocation,
        stream: StreamId,
        uses: Vec<Arc<dyn Fence>>,
        queued: bool,
        hold: bool,
    ) {
        let mut g = self.lock();
        let seq = g.next_seq;
        g.next_seq += 1;
        g.pending.push(Pending {
            addr: a.ptr.as_ptr() as usize,
            block: a.block,
            node: a.node,
            kind: a.kind,
            home: stream,
            queued: queued || !uses.is_empty(),
            home_fence: None,
            uses,
            hold,
            seq,
        });
        g.pending_bytes += a.block;
        self.reap(&mut g);
        if g.reserved > self.config.release_threshold {
            self.release_free_chunks(&mut g, None);
        }
    }

    /// Returns completed pending frees to the TLSF.
    fn reap(&self, g: &mut Slow) {
        if g.pending.is_empty() {
            return;
        }
        let recorder = self.fences.get();
        let mut recorded: Vec<(StreamId, Arc<dyn Fence>)> = Vec::new();
        let mut i = 0;
        while i < g.pending.len() {
            let p = &mut g.pending[i];
            if p.queued && p.home_fence.is_none() {
                if let Some(r) = recorder {
                    let f = match recorded.iter().find(|(s, _)| *s == p.home) {
                        Some((_, f)) => f.clone(),
                        None => {
                            let f = r.record(p.home);
                            recorded.push((p.home, f.clone()));
                            f
                        }
                    };
                    p.home_fence = Some(f);
                }
            }
            let done = p.home_fence.as_ref().is_none_or(|f| f.is_complete())
                && p.uses.iter().all(|f| f.is_complete());
            if done {
                let p = g.pending.swap_remove(i);
                g.pending_bytes -= p.block;
                g.out -= p.block;
                poison(p.addr as *const u8, p.block);
                g.tlsf[p.kind as usize].free(p.node);
            } else {
                i += 1;
            }
        }
    }

    /// Takes a pending block of the right size for `stream`: its home stream's
    /// own blocks when `cross` is false, other streams' when true.
    fn take_pending(
        &self,
        g: &mut Slow,
        stream: StreamId,
        rounded: usize,
        align: usize,
        cross: bool,
    ) -> Option<Allocation> {
        let policy = self.config.reuse;
        let recorder = self.fences.get();
        for i in 0..g.pending.len() {
            let p = &mut g.pending[i];
            if (p.home == stream) == cross
                || p.block < rounded
                || p.block - rounded > rounded / 8
                || p.addr & (align - 1) != 0
            {
                continue;
            }
            if cross && p.queued && p.home_fence.is_none() {
                if let Some(r) = recorder {
                    p.home_fence = Some(r.record(p.home));
                }
            }
            let mut wait: Vec<Arc<dyn Fence>> = p
                .uses
                .iter()
                .filter(|f| !f.is_complete())
                .cloned()
                .collect();
            if cross {
                if let Some(f) = p.home_fence.as_ref().filter(|f| !f.is_complete()) {
                    wait.push(f.clone());
                }
            }
            if !wait.is_empty() && (policy == ReusePolicy::Opportunistic || p.hold) {
                continue;
            }
            let p = g.pending.swap_remove(i);
            g.pending_bytes -= p.block;
            g.pending_hits += 1;
            g.tlsf[p.kind as usize].set_tag(p.node, stream);
            return Some(Allocation {
                // SAFETY: pending addresses come from chunks, which are never null.
                ptr: unsafe { NonNull::new_unchecked(p.addr as *mut u8) },
                size: 0,
                block: p.block,
                node: p.node,
                kind: p.kind,
                pool: self.id,
                wait_for: (!wait.is_empty()).then(|| Box::new(wait)),
                // On its home stream, queued work there orders the reuse.
                queued: p.queued && !cross,
                class: class_for_block(p.block),
            });
        }
        None
    }

    fn tlsf_alloc(
        &self,
        g: &mut Slow,
        kind: Kind,
        rounded: usize,
        align: usize,
        stream: StreamId,
        fresh: bool,
    ) -> Option<Allocation> {
        // Huge blocks are never split: a freed one serves a later request only
        // when it wastes at most 1/8, otherwise it is released and a chunk of
        // the right size mapped (keeps reserved close to live as sizes grow).
        let no_split = if kind == Kind::Huge && !fresh {
            0
        } else {
            u64::MAX
        };
        let (node, addr) =
            g.tlsf[kind as usize].alloc(rounded as u64, align as u64, Placement::Low, no_split)?;
        let t = &mut g.tlsf[kind as usize];
        t.set_tag(node, stream);
        let block = t.size_of(node) as usize;
        g.out += block;
        g.peak_active = g.peak_active.max(g.out - g.pending_bytes);
        Some(Allocation {
            // SAFETY: TLSF addresses lie inside chunks, which are never null.
            ptr: unsafe { NonNull::new_unchecked(addr as usize as *mut u8) },
            size: 0,
            block,
            node,
            kind: kind as u8,
            pool: self.id,
            wait_for: None,
            queued: false,
            class: class_for_block(block),
        })
    }

    /// Gives blocks from a thread cache back, as pending frees of `stream`.
    #[cold]
    fn return_entries(&self, stream: StreamId, v: Vec<Entry>, hits: u64) {
        self.tls_hits.fetch_add(hits, Ordering::Relaxed);
        if v.is_empty() {
            return;
        }
        let mut g = self.lock();
        self.push_pending(&mut g, stream, v);
        self.reap(&mut g);
    }

    fn push_pending(&self, g: &mut Slow, home: StreamId, v: impl IntoIterator<Item = Entry>) {
        for e in v {
            g.pending_bytes += e.block as usize;
            g.pending.push(Pending {
                addr: e.addr(),
                block: e.block as usize,
                node: e.node,
                kind: e.kind(),
                home,
                queued: e.queued(),
                home_fence: None,
                uses: Vec::new(),
                hold: false,
                seq: g.next_seq,
            });
            g.next_seq += 1;
        }
    }

    /// Empties the calling thread's cache if it holds blocks of this pool.
    fn take_own_tls(&self) -> Option<(StreamId, Vec<Entry>, u64)> {
        TCACHE
            .try_with(|c| {
                let mut tc = c.try_borrow_mut().ok()?;
                (tc.pool == self.id && tc.count > 0).then(|| tc.take_all())
            })
            .ok()
            .flatten()
    }

    /// (bytes cached, unpublished hits) of the calling thread's cache for this pool.
    fn own_tls_figures(&self) -> (usize, u64) {
        TCACHE
            .try_with(|c| {
                let tc = c.try_borrow().ok()?;
                (tc.pool == self.id).then(|| (tc.bytes, u64::from(tc.unpublished_hits)))
            })
            .ok()
            .flatten()
            .unwrap_or((0, 0))
    }

    /// Moves the blocks `stream` has cached (in its slot and in this thread's
    /// cache) to the pending list; whether there were any.
    fn flush_stream(&self, g: &mut Slow, stream: StreamId) -> bool {
        let mut any = false;
        let own = TCACHE
            .try_with(|c| {
                let mut tc = c.try_borrow_mut().ok()?;
                (tc.pool == self.id && tc.stream == stream && tc.count > 0).then(|| tc.take_all())
            })
            .ok()
            .flatten();
        if let Some((st, v, hits)) = own {
            self.tls_hits.fetch_add(hits, Ordering::Relaxed);
            any = true;
            self.push_pending(g, st, v);
        }
        let entries: Vec<Entry> = self.slots[slot_index(stream)].with(|s| {
            if s.owner == Some(stream) {
                s.drain().collect()
            } else {
                Vec::new()
            }
        });
        any |= !entries.is_empty();
        self.push_pending(g, stream, entries);
        any
    }

    /// Moves every stream cache's blocks (and the calling thread's) to the
    /// pending list, and asks other threads to return theirs.
    fn flush_slots(&self, g: &mut Slow) {
        self.epoch.fetch_add(1, Ordering::Relaxed);
        if let Some((stream, v, hits)) = self.take_own_tls() {
            self.tls_hits.fetch_add(hits, Ordering::Relaxed);
            self.push_pending(g, stream, v);
        }
        for slot in self.slots.iter() {
            slot.with(|s| {
                let Some(home) = s.owner else { return };
                self.push_pending(g, home, s.drain());
            });
        }
    }

    /// Unmaps wholly free chunks (of `kind`, or all); returns the bytes released.
    fn release_free_chunks(&self, g: &mut Slow, kind: Option<Kind>) -> usize {
        let mut released = 0;
        for i in 0..g.chunks.len() {
            let Some(rec) = &g.chunks[i] else { continue };
            if kind.is_some_and(|k| k != rec.kind)
                || !g.tlsf[rec.kind as usize].remove_region(rec.head)
            {
                continue;
            }
            let rec = g.chunks[i].take().expect("checked above");
            g.reserved -= rec.chunk.size;
            released += rec.chunk.size;
            record_chunk(hetero_trace::MemKind::ChunkUnmap, rec.chunk.size, g);
            unpoison(rec.chunk.ptr.as_ptr(), rec.chunk.size);
            self.source.unmap(rec.chunk);
        }
        while matches!(g.chunks.last(), Some(None)) {
            g.chunks.pop();
        }
        released
    }

    /// Maps a chunk for `kind`; `Ok(false)` when that would exceed `max_reserved`.
    fn map_chunk(&self, g: &mut Slow, kind: Kind, need: usize) -> Result<bool, MemoryError> {
        let size = chunk_size(kind, need);
        if g.reserved.saturating_add(size) > self.config.max_reserved {
            return Ok(false);
        }
        let chunk = self.source.map(size)?;
        if chunk.notes.iter().any(|n| n.contains("hugetlb")) {
            tracing::debug!(notes = ?chunk.notes, "chunk fell back from hugetlb pages");
        }
        poison(chunk.ptr.as_ptr(), chunk.size);
        let head = g.tlsf[kind as usize].add_region(chunk.ptr.as_ptr() as u64, chunk.size as u64);
        g.reserved += chunk.size;
        g.peak_reserved = g.peak_reserved.max(g.reserved);
        record_chunk(hetero_trace::MemKind::ChunkMap, chunk.size, g);
        let rec = ChunkRec { chunk, kind, head };
        match g.chunks.iter().position(Option::is_none) {
            Some(i) => g.chunks[i] = Some(rec),
            None => g.chunks.push(Some(rec)),
        }
        Ok(true)
    }

    fn oom(&self, g: &Slow, requested: usize) -> MemoryError {
        let free: u64 = g.tlsf.iter().map(Tlsf::free_bytes).sum();
        let largest = g.tlsf.iter().map(Tlsf::largest_free).max().unwrap_or(0);
        let hint = if free as usize >= requested {
            "enough bytes are free but fragmented: call trim(), allocate long-lived buffers first, or set max_split_size_mb"
        } else if g.pending_bytes > 0 {
            "pending stream-ordered frees hold memory: synchronize the streams that use it, or raise max_reserved_mb"
        } else {
            "free buffers, call trim(), or raise max_reserved_mb in HETERO_ALLOC_CONF"
        };
        MemoryError::OutOfMemory {
            requested: Bytes(requested),
            reserved: Bytes(g.reserved),
            limit: Bytes(self.config.max_reserved),
            allocated: Bytes(g.out - g.pending_bytes - self.cached_in_slots()),
            free_fragmented: Bytes(free as usize),
            largest_free: Bytes(largest as usize),
            hint,
        }
    }

    fn cached_in_slots(&self) -> usize {
        self.own_tls_figures().0
            + self
                .slots
                .iter()
                .map(|s| s.with(|s| s.cached_bytes))
                .sum::<usize>()
    }

    /// Whether mapping a chunk for this request should wait first: it would
    /// take reserved bytes past `wait_before_grow_ratio` times the bytes in use
    /// (live and cached, plus the request), some frees are still queued, and
    /// the caller is not an engine thread.
    fn wait_before_grow(&self, g: &Slow, kind: Kind, need: usize, rounded: usize) -> bool {
        let Some(ratio) = self.config.wait_before_grow_ratio else {
            return false;
        };
        if g.pending.is_empty() || thread_role::on_engine_thread() {
            return false;
        }
        let in_use = g.out - g.pending_bytes + rounded;
        let grown = g.reserved + chunk_size(kind, need);
        grown as f64 > ratio * in_use as f64
    }

    /// The incomplete fences of the oldest pending free still waiting for any
    /// (its stream work was queued first, so it is the next to finish); `None`
    /// when every pending free is ready. Call after `reap`, which records the
    /// fence of every queued free.
    fn earliest_pending_fences(&self, g: &Slow) -> Option<Vec<Arc<dyn Fence>>> {
        let mut best: Option<(u64, Vec<Arc<dyn Fence>>)> = None;
        for p in &g.pending {
            if best.as_ref().is_some_and(|(seq, _)| *seq < p.seq) {
                continue;
            }
            let open: Vec<Arc<dyn Fence>> = p
                .home_fence
                .iter()
                .chain(p.uses.iter())
                .filter(|f| !f.is_complete())
                .cloned()
                .collect();
            if !open.is_empty() {
                best = Some((p.seq, open));
            }
        }
        best.map(|(_, f)| f)
    }

    #[cold]
    fn alloc_slow(
        &self,
        size: usize,
        rounded: usize,
        align: usize,
        stream: StreamId,
    ) -> Result<Allocation, MemoryError> {
        let need = rounded + align.saturating_sub(GRAN as usize);
        let kind = kind_of(need, self.config.max_split_size);
        let mut waited = false;
        let mut counted = false;
        let found = loop {
            let mut g = self.lock();
            if !counted {
                g.slow_allocs += 1;
                counted = true;
            }
            if let Some(a) = self.take_pending(&mut g, stream, rounded, align, false) {
                break a;
            }
            self.reap(&mut g);
            if let Some(a) = self.tlsf_alloc(&mut g, kind, rounded, align, stream, false) {
                break a;
            }
            if self.config.reuse != ReusePolicy::Opportunistic {
                if let Some(a) = self.take_pending(&mut g, stream, rounded, align, true) {
                    break a;
                }
            }
            // Before growing, this stream's cached blocks go back so they can
            // coalesce (a batch that grows N -> N+1 needs no new chunks for
            // the sizes it just freed).
            if self.flush_stream(&mut g, stream) {
                self.reap(&mut g);
                if let Some(a) = self.tlsf_alloc(&mut g, kind, rounded, align, stream, false) {
                    break a;
                }
                if let Some(a) = self.take_pending(&mut g, stream, rounded, align, false) {
                    break a;
                }
            }
            // Growing past the ratio while frees are queued behind stream work:
            // that work finishes without us (it is already submitted), so wait
            // for the earliest of it and retry from what it freed, rather than
            // map memory that exists only because the host ran ahead.
            if self.wait_before_grow(&g, kind, need, rounded) {
                if let Some(fences) = self.earliest_pending_fences(&g) {
                    g.grow_waits += 1;
                    // Never under the lock: the engines we wait for free into it.
                    drop(g);
                    for f in fences {
                        f.wait();
                    }
                    continue;
                }
            }
            // A new chunk. Wholly free chunks could not serve (those of this kind
            // are too small, the others are of another kind): release them
            // first, so that reserved memory follows live memory as sizes grow.
            self.release_free_chunks(&mut g, None);
            let mut mapped = self.map_chunk(&mut g, kind, need);
            if let Ok(true) = mapped {
                if let Some(a) = self.tlsf_alloc(&mut g, kind, rounded, align, stream, true) {
                    break a;
                }
            }
            // Out of memory: free cached blocks not in use, release unused chunks, retry.
            self.flush_slots(&mut g);
            self.reap(&mut g);
            if let Some(a) = self.tlsf_alloc(&mut g, kind, rounded, align, stream, false) {
                break a;
            }
            if let Some(a) = self.take_pending(&mut g, stream, rounded, align, false) {
                break a;
            }
            if self.config.reuse != ReusePolicy::Opportunistic {
                if let Some(a) = self.take_pending(&mut g, stream, rounded, align, true) {
                    break a;
                }
            }
            self.release_free_chunks(&mut g, None);
            if !matches!(mapped, Err(MemoryError::HugePagesUnavailable { .. })) {
                mapped = self.map_chunk(&mut g, kind, need);
                if let Ok(true) = mapped {
                    if let Some(a) = self.tlsf_alloc(&mut g, kind, rounded, align, stream, true) {
                        break a;
                    }
                }
            }
            // Wait for pending stream-ordered frees, then retry once. Not on an
            // engine thread: the work it would wait for may be queued behind
            // the op it is running.
            if !waited && !g.pending.is_empty() && !thread_role::on_engine_thread() {
                let mut fences: Vec<Arc<dyn Fence>> = Vec::new();
                let recorder = self.fences.get();
                for p in g.pending.iter_mut() {
                    if p.queued && p.home_fence.is_none() {
                        p.home_fence = recorder.map(|r| r.record(p.home));
                    }
                    fences.extend(p.home_fence.iter().cloned());
                    fences.extend(p.uses.iter().cloned());
                }
                drop(g);
                for f in fences {
                    f.wait();
                }
                waited = true;
                continue;
            }
            return Err(match mapped {
                Err(e @ MemoryError::HugePagesUnavailable { .. }) => e,
                _ => self.oom(&g, size),
            });
        };
        let mut a = found;
        a.size = size;
        if self.config.reuse == ReusePolicy::InternalDependencies {
            for f in a.wait_for.take().into_iter().flat_map(|v| *v) {
                f.wait();
            }
        }
        unpoison(a.ptr.as_ptr(), size);
        Ok(a)
    }

    fn trim(&self) -> usize {
        let mut g = self.lock();
        self.flush_slots(&mut g);
        self.reap(&mut g);
        self.release_free_chunks(&mut g, None)
    }

    fn stats(&self) -> PoolStats {
        let (mut cached_slots, mut hits) = self.own_tls_figures();
        hits += self.tls_hits.load(Ordering::Relaxed);
        for s in self.slots.iter() {
            s.with(|s| {
                cached_slots += s.cached_bytes;
                hits += s.hits;
            });
        }
        let g = self.lock();
        let free: u64 = g.tlsf.iter().map(Tlsf::free_bytes).sum();
        let largest = g.tlsf.iter().map(Tlsf::largest_free).max().unwrap_or(0);
        let allocations = g.slow_allocs + hits;
        let cache_hits = hits + g.pending_hits;
        PoolStats {
            allocated: g.out - g.pending_bytes - cached_slots,
            reserved: g.reserved,
            peak_reserved: g.peak_reserved,
            peak_active: g.peak_active,
            cached: cached_slots + g.pending_bytes,
            free: free as usize,
            largest_free: largest as usize,
            fragmentation: if free == 0 {
                0.0
            } else {
                1.0 - largest as f64 / free as f64
            },
            allocations,
            cache_hits,
            hit_rate: if allocations == 0 {
                0.0
            } else {
                cache_hits as f64 / allocations as f64
            },
            chunks: g.chunks.iter().flatten().count(),
            os_calls: self.source.os_calls(),
            grow_waits: g.grow_waits,
        }
    }

    fn snapshot(&self) -> Snapshot {
        let stats = self.stats();
        let mut owner_of: std::collections::HashMap<u64, (BlockState, StreamId)> =
            std::collections::HashMap::new();
        for s in self.slots.iter() {
            s.with(|s| {
                if let Some(o) = s.owner {
                    for c in 0..NCLASS {
                        for i in 0..s.lens[c] as usize {
                            owner_of.insert(
                                s.entries[c * PER_CLASS + i].addr() as u64,
                                (BlockState::StreamCached, o),
                            );
                        }
                    }
                }
            });
        }
        let own = TCACHE
            .try_with(|c| {
                let tc = c.try_borrow().ok()?;
                (tc.pool == self.id).then(|| {
                    let stream = tc.stream;
                    (0..NCLASS)
                        .flat_map(|c| tc.entries[c][..tc.lens[c] as usize].to_vec())
                        .map(|e| (e.addr() as u64, stream))
                        .collect::<Vec<_>>()
                })
            })
            .ok()
            .flatten()
            .unwrap_or_default();
        for (addr, stream) in own {
            owner_of.insert(addr, (BlockState::StreamCached, stream));
        }
        let g = self.lock();
        for p in &g.pending {
            owner_of.insert(p.addr as u64, (BlockState::PendingFree, p.home));
        }
        let chunks = g
            .chunks
            .iter()
            .flatten()
            .map(|rec| ChunkSnapshot {
                address: rec.chunk.ptr.as_ptr() as u64,
                size: rec.chunk.size,
                kind: rec.kind.name(),
                page: rec.chunk.page,
                pinned: rec.chunk.pinned,
                notes: rec.chunk.notes.clone(),
                blocks: g.tlsf[rec.kind as usize]
                    .region_blocks(rec.head)
                    .map(|(address, size, free, tag)| {
                        let (state, stream) = if free {
                            (BlockState::Free, None)
                        } else if let Some(&(st, s)) = owner_of.get(&address) {
                            (st, Some(s))
                        } else {
                            (BlockState::Live, Some(tag))
                        };
                        BlockSnapshot {
                            address,
                            size,
                            state,
                            stream,
                        }
                    })
                    .collect(),
            })
            .collect();
        Snapshot {
            config: self.config.clone(),
            stats,
            chunks,
        }
    }
}

/// A chunk event for the profiler (one relaxed load when profiling is off).
fn record_chunk(kind: hetero_trace::MemKind, bytes: usize, g: &Slow) {
    if hetero_trace::enabled() {
        hetero_trace::record_mem(hetero_trace::MemRecord {
            kind,
            ts_ns: hetero_trace::now_ns(),
            bytes: bytes as u64,
            stream: 0,
            reserved: g.reserved as u64,
            allocated: g.out.saturating_sub(g.pending_bytes) as u64,
        });
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let g = self.slow.get_mut().unwrap_or_else(|e| e.into_inner());
        for rec in g.chunks.drain(..).flatten() {
            unpoison(rec.chunk.ptr.as_ptr(), rec.chunk.size);
            self.source.unmap(rec.chunk);
        }
    }
}
