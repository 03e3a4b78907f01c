//! Per-stream block caches: the block level's second tier, after the thread
//! cache and before the pending frees. Each [`Slot`] is one stream's block
//! cache (owned by the first stream that hashes to it) behind a
//! [`TryLock`](crate::sync::TryLock): a thread that finds it held takes the
//! slow path instead of waiting.
//!
//! Flushing moves cached blocks (the slots' and the calling thread's) to the
//! pending frees: one stream's before the pool grows, every stream's on trim
//! and when out of memory.

use super::entry::{Entry, BLANK, CLASS_BASE, NCLASS};
use super::{Shared, Slow, StreamId};
use std::sync::atomic::Ordering;

const PER_CLASS: usize = 8;
pub(super) const SLOT_BITS: u32 = 6;

#[inline(always)]
pub(super) fn slot_index(stream: StreamId) -> usize {
    (stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOT_BITS)) as usize
}

/// One stream's block cache (a slot is owned by the first stream that hashes to it).
pub(super) struct Slot {
    owner: Option<StreamId>,
    lens: [u8; NCLASS],
    entries: Vec<Entry>,
    cached_bytes: usize,
    cached_count: usize,
    hits: u64,
}

impl Slot {
    pub(super) fn new() -> Self {
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
    pub(super) fn pop(&mut self, stream: StreamId, class: usize, align: usize) -> Option<Entry> {
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
    pub(super) fn push(
        &mut self,
        stream: StreamId,
        class: usize,
        e: Entry,
        cap_bytes: usize,
    ) -> bool {
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

impl Shared {
    /// Moves the blocks `stream` has cached (in its slot and in this thread's
    /// cache) to the pending list; whether there were any.
    pub(super) fn flush_stream(&self, g: &mut Slow, stream: StreamId) -> bool {
        let mut any = false;
        let own = self.take_own_tls_of(stream);
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
    pub(super) fn flush_slots(&self, g: &mut Slow) {
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

    pub(super) fn cached_in_slots(&self) -> usize {
        self.own_tls_figures().0
            + self
                .slots
                .iter()
                .map(|s| s.with(|s| s.cached_bytes))
                .sum::<usize>()
    }

    /// (bytes cached, hits) summed over the stream slots.
    pub(super) fn slot_figures(&self) -> (usize, u64) {
        let (mut cached, mut hits) = (0, 0);
        for s in self.slots.iter() {
            s.with(|s| {
                cached += s.cached_bytes;
                hits += s.hits;
            });
        }
        (cached, hits)
    }

    /// Calls `f(address, owner)` for every block the stream slots hold.
    pub(super) fn for_each_slot_block(&self, mut f: impl FnMut(usize, StreamId)) {
        for s in self.slots.iter() {
            s.with(|s| {
                if let Some(o) = s.owner {
                    for c in 0..NCLASS {
                        for i in 0..s.lens[c] as usize {
                            f(s.entries[c * PER_CLASS + i].addr(), o);
                        }
                    }
                }
            });
        }
    }
}
