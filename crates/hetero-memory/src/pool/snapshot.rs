//! What a pool reports about itself: [`PoolStats`] (counters and figures) and
//! [`Snapshot`] (every chunk and block with its state and stream, serialisable
//! to JSON like PyTorch's memory snapshot).

use super::{Shared, StreamId};
use crate::config::PoolConfig;
use crate::os::{OsCalls, PageKind};
use serde::Serialize;
use std::sync::atomic::Ordering;

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
    /// Whether the pool maps granules under expandable segments
    /// ([`PoolConfig::expandable_segments`]) rather than chunks.
    pub expandable: bool,
    /// Physical bytes mapped: with segments, the granules under blocks handed
    /// out; with chunks, every chunk.
    pub mapped: usize,
    /// With segments: bytes of `mapped` under no block handed out (idle
    /// granules, kept mapped so reuse makes no system call).
    pub mapped_idle: usize,
    /// With segments: physical bytes kept unmapped for the next growth
    /// (part of `reserved`).
    pub physical_cached: usize,
    /// With segments: granules mapped from cached physical memory, from new
    /// physical memory, granules unmapped, granules returned to the system.
    pub granule_maps_cached: u64,
    pub granule_maps_cold: u64,
    pub granule_unmaps: u64,
    pub granule_releases: u64,
    /// With segments: `mmap`/`mprotect` calls made to map and unmap granules
    /// (a run of granules maps or unmaps in one).
    pub granule_os_calls: u64,
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

impl Shared {
    pub(super) fn stats(&self) -> PoolStats {
        let (mut cached_slots, mut hits) = self.own_tls_figures();
        hits += self.tls_hits.load(Ordering::Relaxed);
        let (slot_bytes, slot_hits) = self.slot_figures();
        cached_slots += slot_bytes;
        hits += slot_hits;
        let g = self.lock();
        let (free, largest) = g.free_figures();
        let (free, largest) = (free as u64, largest as u64);
        let segs = g.segments.as_ref();
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
            chunks: g.chunks.iter().flatten().count()
                + segs.map_or(0, |s| s.segs.iter().flatten().count()),
            os_calls: self.source.os_calls(),
            grow_waits: g.grow_waits,
            expandable: segs.is_some(),
            mapped: segs.map_or(g.reserved, |s| s.mapped),
            mapped_idle: segs.map_or(0, |s| s.idle_bytes()),
            physical_cached: segs.map_or(0, |s| s.cached_bytes()),
            granule_maps_cached: segs.map_or(0, |s| s.cached_maps),
            granule_maps_cold: segs.map_or(0, |s| s.cold_maps),
            granule_unmaps: segs.map_or(0, |s| s.unmaps),
            granule_releases: segs.map_or(0, |s| s.releases),
            granule_os_calls: segs.map_or(0, |s| s.os_calls()),
        }
    }

    pub(super) fn snapshot(&self) -> Snapshot {
        let stats = self.stats();
        let mut owner_of: std::collections::HashMap<u64, (BlockState, StreamId)> =
            std::collections::HashMap::new();
        self.for_each_slot_block(|addr, o| {
            owner_of.insert(addr as u64, (BlockState::StreamCached, o));
        });
        let own = self.own_tls_blocks();
        for (addr, stream) in own {
            owner_of.insert(addr, (BlockState::StreamCached, stream));
        }
        let g = self.lock();
        for (addr, home) in g.pending_blocks() {
            owner_of.insert(addr as u64, (BlockState::PendingFree, home));
        }
        let block_of = |(address, size, free, tag): (u64, u64, bool, u64)| {
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
        };
        let mut chunks: Vec<ChunkSnapshot> = g
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
                    .map(block_of)
                    .collect(),
            })
            .collect();
        if let Some(segs) = &g.segments {
            for (kind, seg) in segs.segs.iter().enumerate() {
                let Some(seg) = seg else { continue };
                let (page, store_notes) = segs.backing();
                let mut notes = vec![format!(
                    "expandable segment: {} of {} mapped in 2 MiB granules",
                    crate::error::Bytes(seg.range.mapped_bytes()),
                    crate::error::Bytes(seg.range.size())
                )];
                notes.extend(store_notes.iter().cloned());
                chunks.push(ChunkSnapshot {
                    address: seg.range.ptr() as u64,
                    size: seg.range.size(),
                    kind: super::chunks::KIND_NAMES[kind],
                    page,
                    pinned: false,
                    notes,
                    blocks: g.tlsf[kind].region_blocks(seg.head).map(block_of).collect(),
                });
            }
        }
        Snapshot {
            config: self.config.clone(),
            stats,
            chunks,
        }
    }
}
