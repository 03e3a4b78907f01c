//! The per-thread cache, the front of the block level ([`ThreadCache`]): the
//! last blocks a thread freed on one (pool, stream) pair, reused with no
//! atomics on a hit. Only this file touches the thread-local (`TCACHE`); hits
//! reach the pool's counter in batches (`PUBLISH_EVERY`).
//!
//! Known limit: a thread cache can be emptied only by its own thread. Other
//! threads ask for its blocks back by bumping the pool's epoch (trim, memory
//! pressure); an idle thread keeps at most 8 MiB until its next call or exit.

use super::allocation::Allocation;
use super::entry::{Entry, BLANK, CLASS_BASE, FRONT_MAX, NCLASS};
use super::{DevicePool, Shared, StreamId, DEFAULT_ALIGN};
use crate::poison::{poison, unpoison};
use crate::tlsf::{class_of, round_size};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Blocks per size class in a thread cache.
const T_PER_CLASS: usize = 4;
/// Most bytes one thread cache holds.
const T_MAX_BYTES: usize = 8 << 20;
/// Thread-cache hits are added to the pool's counter in batches of this many.
const PUBLISH_EVERY: u32 = 1024;

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

impl DevicePool {
    /// The hot path of [`DevicePool::alloc`], for a valid request of at most
    /// `FRONT_MAX` bytes: a block from the calling thread's cache.
    #[inline(always)]
    pub(super) fn alloc_cached(
        &self,
        size: usize,
        align: usize,
        stream: StreamId,
    ) -> Option<Allocation> {
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
        let (e, publish) = hit?;
        if publish {
            self.s
                .tls_hits
                .fetch_add(u64::from(PUBLISH_EVERY), Ordering::Relaxed);
        }
        unpoison(e.addr() as *const u8, size);
        Some(Allocation::from_entry(e, size, id, class))
    }

    /// The hot path of both frees: into the calling thread's cache.
    #[inline(always)]
    pub(super) fn free_cached(&self, a: Allocation, stream: StreamId, queued: bool) {
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
}

impl Shared {
    /// Gives blocks from a thread cache back, as pending frees of `stream`.
    #[cold]
    pub(super) fn return_entries(&self, stream: StreamId, v: Vec<Entry>, hits: u64) {
        self.tls_hits.fetch_add(hits, Ordering::Relaxed);
        if v.is_empty() {
            return;
        }
        let mut g = self.lock();
        self.push_pending(&mut g, stream, v);
        self.reap(&mut g);
    }

    /// Empties the calling thread's cache if it holds blocks of this pool.
    pub(super) fn take_own_tls(&self) -> Option<(StreamId, Vec<Entry>, u64)> {
        TCACHE
            .try_with(|c| {
                let mut tc = c.try_borrow_mut().ok()?;
                (tc.pool == self.id && tc.count > 0).then(|| tc.take_all())
            })
            .ok()
            .flatten()
    }

    /// Empties the calling thread's cache if it holds blocks of this pool for `stream`.
    pub(super) fn take_own_tls_of(&self, stream: StreamId) -> Option<(StreamId, Vec<Entry>, u64)> {
        TCACHE
            .try_with(|c| {
                let mut tc = c.try_borrow_mut().ok()?;
                (tc.pool == self.id && tc.stream == stream && tc.count > 0).then(|| tc.take_all())
            })
            .ok()
            .flatten()
    }

    /// (bytes cached, unpublished hits) of the calling thread's cache for this pool.
    pub(super) fn own_tls_figures(&self) -> (usize, u64) {
        TCACHE
            .try_with(|c| {
                let tc = c.try_borrow().ok()?;
                (tc.pool == self.id).then(|| (tc.bytes, u64::from(tc.unpublished_hits)))
            })
            .ok()
            .flatten()
            .unwrap_or((0, 0))
    }

    /// (address, stream) of every block in the calling thread's cache for this pool.
    pub(super) fn own_tls_blocks(&self) -> Vec<(u64, StreamId)> {
        TCACHE
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
            .unwrap_or_default()
    }
}
