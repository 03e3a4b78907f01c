//! The chunk and buffer levels and the slow path that grows them.
//!
//! - *chunk*: regions from a [`ChunkSource`](crate::ChunkSource) (the OS
//!   layer for the host backend). Requests up to 1 MiB are packed into 2 MiB
//!   chunks, 1–10 MiB share 20 MiB chunks, larger ones get a chunk of their
//!   size rounded up to 2 MiB and are never split. Before a new chunk is
//!   mapped, wholly free chunks are released, so reserved memory follows live
//!   memory when sizes grow.
//! - *buffer*: [`Tlsf`] sub-allocation inside chunks, one TLSF per [`Kind`],
//!   under the pool mutex.
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
//! fails; here the retry also comes before growing. Every such wait gives up
//! once the work behind it made no progress for [`GROW_WAIT`] ([`OOM_WAIT`]
//! before out of memory): the work may itself wait for this thread (a host
//! event it signals after allocating), and then the request grows, or fails,
//! instead of hanging.
//!
//! Invariant: a chunk is unmapped only when wholly free in the TLSF.

use super::allocation::Allocation;
use super::entry::{class_for_block, FRONT_MAX};
use super::segment::{Backing, GRANULE};
use super::{Shared, Slow, StreamId};
#[cfg(doc)]
use crate::config::PoolConfig;
use crate::config::ReusePolicy;
use crate::error::{Bytes, MemoryError};
use crate::os::{Chunk, HUGE_2M};
use crate::poison::{poison, unpoison};
use crate::thread_role;
use crate::tlsf::{Placement, Tlsf, GRAN};
use std::ptr::NonNull;

/// How long the work behind a queued free may make no progress before a
/// request that waits for it grows instead.
pub const GROW_WAIT: std::time::Duration = std::time::Duration::from_millis(250);
/// The same before a request reports out of memory.
pub const OOM_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Waits for every point while its work progresses (see
/// [`crate::StreamPoint::wait_progressing`]); whether all completed.
fn wait_all_progressing(
    points: &[std::sync::Arc<dyn crate::StreamPoint>],
    idle: std::time::Duration,
) -> bool {
    points.iter().all(|f| f.wait_progressing(idle))
}

const SMALL_CHUNK: usize = 2 << 20;
const LARGE_CHUNK: usize = 20 << 20;
const LARGE_MAX: usize = 10 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Kind {
    Small = 0,
    Large = 1,
    Huge = 2,
}

pub(super) const KIND_NAMES: [&str; 3] = ["small", "large", "huge"];

impl Kind {
    pub(super) fn name(self) -> &'static str {
        KIND_NAMES[self as usize]
    }
}

pub(super) struct ChunkRec {
    pub(super) chunk: Chunk,
    pub(super) kind: Kind,
    pub(super) head: u32,
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

impl Shared {
    #[cold]
    pub(super) fn alloc_slow(
        &self,
        size: usize,
        rounded: usize,
        align: usize,
        stream: StreamId,
    ) -> Result<Allocation, MemoryError> {
        let need = rounded + align.saturating_sub(GRAN as usize);
        let kind = kind_of(need, self.config.max_split_size);
        let mut waited = false;
        // Cleared when a wait before growing ran out: grow from then on.
        let mut may_wait = true;
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
            if let Some(a) = self.tlsf_alloc(&mut g, kind, rounded, align, stream, Backing::Mapped)
            {
                break a;
            }
            if self.config.reuse != ReusePolicy::Opportunistic {
                if let Some(a) = self.take_pending(&mut g, stream, rounded, align, true) {
                    break a;
                }
            }
            // Before growing, this stream's cached blocks go back so they can
            // coalesce (a batch that grows N -> N+1 needs no new chunks for
            // the sizes it just freed). In a segment, mapping a granule under
            // the block is growing too, even from spare physical memory: the
            // cached blocks are tried first, so that new blocks fill the
            // granules mapped already rather than spread over new ones.
            if self.flush_stream(&mut g, stream) {
                self.reap(&mut g);
                if let Some(a) =
                    self.tlsf_alloc(&mut g, kind, rounded, align, stream, Backing::Mapped)
                {
                    break a;
                }
                if let Some(a) = self.take_pending(&mut g, stream, rounded, align, false) {
                    break a;
                }
            }
            if g.segments.is_some() {
                if let Some(a) =
                    self.tlsf_alloc(&mut g, kind, rounded, align, stream, Backing::Spare)
                {
                    break a;
                }
            }
            // Growing past the ratio while frees are queued behind stream work:
            // that work finishes without us (it is already submitted), so wait
            // for the earliest of it and retry from what it freed, rather than
            // map memory that exists only because the host ran ahead.
            if may_wait && self.wait_before_grow(&g, kind, need, rounded) {
                if let Some(fences) = self.earliest_pending_points(&g) {
                    g.grow_waits += 1;
                    // Never under the lock: the engines we wait for free into it.
                    drop(g);
                    may_wait = wait_all_progressing(&fences, GROW_WAIT);
                }
                // Else every queued free's work completed since the reap
                // above (the engines run on): retry from what they freed, as
                // after a wait, rather than map beside it. (Mapping here made
                // a host that ran ahead reserve a chunk more than the ratio
                // allows, when its frees completed in that window.) The next
                // pass reaps them, so it comes back only for frees queued since.
                continue;
            }
            // A new chunk. Wholly free chunks could not serve (those of this kind
            // are too small, the others are of another kind): release them
            // first, so that reserved memory follows live memory as sizes grow.
            self.release_free_chunks(&mut g, None);
            let mut mapped = self.map_chunk(&mut g, kind, need);
            if let Ok(true) = mapped {
                if let Some(a) =
                    self.tlsf_alloc(&mut g, kind, rounded, align, stream, Backing::Cold)
                {
                    break a;
                }
            }
            // Out of memory: free cached blocks not in use, release unused chunks, retry.
            self.flush_slots(&mut g);
            self.reap(&mut g);
            if let Some(a) = self.tlsf_alloc(&mut g, kind, rounded, align, stream, Backing::Spare) {
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
                    if let Some(a) =
                        self.tlsf_alloc(&mut g, kind, rounded, align, stream, Backing::Cold)
                    {
                        break a;
                    }
                }
            }
            // Wait for pending stream-ordered frees, then retry once. Not on an
            // engine thread: the work it would wait for may be queued behind
            // the op it is running.
            if !waited && !g.pending.is_empty() && !thread_role::on_engine_thread() {
                let fences = self.all_pending_points(&mut g);
                drop(g);
                wait_all_progressing(&fences, OOM_WAIT);
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
        let grows_by = match g.segments {
            Some(_) => need.next_multiple_of(GRANULE),
            None => chunk_size(kind, need),
        };
        let grown = g.reserved + grows_by;
        grown as f64 > ratio * in_use as f64
    }

    fn tlsf_alloc(
        &self,
        g: &mut Slow,
        kind: Kind,
        rounded: usize,
        align: usize,
        stream: StreamId,
        allow: Backing,
    ) -> Option<Allocation> {
        // A chunk mapped for this request.
        let fresh = allow == Backing::Cold;
        // Huge blocks are never split: a freed one serves a later request only
        // when it wastes at most 1/8, otherwise it is released and a chunk of
        // the right size mapped (keeps reserved close to live as sizes grow).
        // In a segment, splitting costs no physical memory: always split.
        let no_split = if kind == Kind::Huge && !fresh && g.segments.is_none() {
            0
        } else {
            u64::MAX
        };
        let (node, addr) = match g.segments.as_ref() {
            // In a segment, the block goes where it maps the fewest new
            // granules.
            Some(segs) => {
                g.tlsf[kind as usize].alloc_scored(rounded as u64, align as u64, |start, end| {
                    segs.place(kind, start, end, rounded as u64, align as u64)
                })?
            }
            None => g.tlsf[kind as usize].alloc(
                rounded as u64,
                align as u64,
                Placement::Low,
                no_split,
            )?,
        };
        let t = &mut g.tlsf[kind as usize];
        t.set_tag(node, stream);
        let block = t.size_of(node) as usize;
        if let Some(segs) = g.segments.as_mut() {
            // Physical memory under the block: cached granules always, new
            // ones only when growing (`fresh`) within max_reserved.
            let limit = self.config.max_reserved;
            match segs.back(kind, addr as usize, block, allow, limit) {
                Ok(true) => {
                    g.reserved = segs.reserved();
                    g.peak_reserved = g.peak_reserved.max(g.reserved);
                }
                Ok(false) => {
                    g.tlsf[kind as usize].free(node);
                    return None;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "mapping granules under a block failed");
                    g.tlsf[kind as usize].free(node);
                    return None;
                }
            }
        }
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

    /// A chunk event for the profiler (one relaxed load when profiling is
    /// off), on the device's clock when the execution layer gave one.
    fn record_chunk(&self, kind: hetero_trace::MemKind, bytes: usize, g: &Slow) {
        if hetero_trace::enabled() {
            hetero_trace::record_mem(hetero_trace::MemRecord {
                kind,
                ts_ns: self
                    .points
                    .get()
                    .map_or_else(hetero_trace::now_ns, |p| p.now_ns()),
                bytes: bytes as u64,
                stream: 0,
                reserved: g.reserved as u64,
                allocated: g.out.saturating_sub(g.pending_bytes) as u64,
            });
        }
    }

    /// Unmaps wholly free chunks (of `kind`, or all); returns the bytes released.
    pub(super) fn release_free_chunks(&self, g: &mut Slow, kind: Option<Kind>) -> usize {
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
            self.record_chunk(hetero_trace::MemKind::ChunkUnmap, rec.chunk.size, g);
            unpoison(rec.chunk.ptr.as_ptr(), rec.chunk.size);
            self.source.unmap(rec.chunk);
        }
        while matches!(g.chunks.last(), Some(None)) {
            g.chunks.pop();
        }
        released
    }

    /// Returns cached granules of the segments to the system until reserved
    /// is at most `target`; the bytes released.
    pub(super) fn release_granules(&self, g: &mut Slow, target: usize) -> usize {
        let Some(segs) = g.segments.as_mut() else {
            return 0;
        };
        let released = segs.release(target);
        g.reserved = segs.reserved();
        if released > 0 {
            self.record_chunk(hetero_trace::MemKind::ChunkUnmap, released, g);
        }
        released
    }

    /// Maps a chunk for `kind`; `Ok(false)` when that would exceed `max_reserved`.
    fn map_chunk(&self, g: &mut Slow, kind: Kind, need: usize) -> Result<bool, MemoryError> {
        if let Some(segs) = g.segments.as_mut() {
            // The segment holds the whole range already: growing is mapping
            // granules under the block (`tlsf_alloc` with `fresh`).
            segs.ensure(kind, &mut g.tlsf[kind as usize])?;
            return Ok(true);
        }
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
        self.record_chunk(hetero_trace::MemKind::ChunkMap, chunk.size, g);
        let rec = ChunkRec { chunk, kind, head };
        match g.chunks.iter().position(Option::is_none) {
            Some(i) => g.chunks[i] = Some(rec),
            None => g.chunks.push(Some(rec)),
        }
        Ok(true)
    }

    fn oom(&self, g: &Slow, requested: usize) -> MemoryError {
        let (free, largest) = g.free_figures();
        let (free, largest) = (free as u64, largest as u64);
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
}

impl Slow {
    /// Bytes free and the largest request they could serve. In segments,
    /// physical memory is free when it backs no block handed out; cached and
    /// idle granules can back any address, so together they serve a request
    /// of their size, while the free bytes inside mapped granules serve only
    /// what fits beside the blocks there.
    pub(super) fn free_figures(&self) -> (usize, usize) {
        match &self.segments {
            Some(segs) => {
                let free = segs.reserved().saturating_sub(self.out);
                (free, (segs.cached_bytes() + segs.idle_bytes()).min(free))
            }
            None => (
                self.tlsf.iter().map(Tlsf::free_bytes).sum::<u64>() as usize,
                self.tlsf.iter().map(Tlsf::largest_free).max().unwrap_or(0) as usize,
            ),
        }
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
