//! The pinned host pool: chunks are mlocked once when mapped and then
//! sub-allocated with the TLSF, so a warm pinned allocation costs a mutex and
//! two bit scans instead of an mmap and an mlock. [`PinnedAllocation`] returns
//! its memory on drop. Typed views are the execution layer's
//! (`hetero::PinnedBuffer`).
//!
//! Invariant: a chunk is unmapped only when no allocation from it is alive (the
//! allocations hold an `Arc` to the pool's internals).

use crate::config::HugePagePolicy;
use crate::error::MemoryError;
use crate::os::{Chunk, ChunkSource, HostChunkSource, HostOptions, OsCalls, HUGE_2M};
use crate::poison::{poison, unpoison};
use crate::tlsf::{class_of, round_size, Placement, Tlsf};
use serde::Serialize;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

/// Pinned pool configuration.
#[derive(Debug, Clone)]
pub struct PinnedConfig {
    /// Size of each pinned chunk (larger requests get a chunk of their own).
    pub chunk_size: usize,
    pub huge_pages: HugePagePolicy,
    /// Fault injection: behave as if the kernel refused every mlock.
    pub refuse_mlock: bool,
}

impl Default for PinnedConfig {
    fn default() -> Self {
        PinnedConfig {
            chunk_size: 4 * HUGE_2M,
            huge_pages: HugePagePolicy::HugeFirst,
            refuse_mlock: false,
        }
    }
}

/// Figures of a pinned pool.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PinnedStats {
    pub allocated: usize,
    /// Freed blocks kept for reuse.
    pub cached: usize,
    pub reserved: usize,
    pub chunks: usize,
    /// Chunks the kernel refused to lock (they are pageable).
    pub unpinned_chunks: usize,
    pub allocations: u64,
    pub os_calls: OsCalls,
    /// Why chunks got less than asked, once per distinct reason.
    pub notes: Vec<String>,
}

/// Freed blocks kept per size class, so a warm alloc/free pair skips the
/// TLSF's split and merge.
const CACHE_PER_CLASS: usize = 8;

struct State {
    tlsf: Tlsf,
    cache: Vec<Vec<(u64, u32)>>,
    chunks: Vec<(Chunk, u32)>,
    allocated: usize,
    allocations: u64,
}

struct Inner {
    config: PinnedConfig,
    source: Arc<dyn ChunkSource>,
    state: Mutex<State>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for (c, _) in s.chunks.drain(..) {
            unpoison(c.ptr.as_ptr(), c.size);
            self.source.unmap(c);
        }
    }
}

/// A pool of page-locked host memory.
///
/// ```
/// use hetero_memory::{PinnedPool, PinnedConfig};
/// let pool = PinnedPool::new(PinnedConfig::default()).unwrap();
/// let a = pool.alloc(64 << 10, 4096).unwrap();
/// assert_eq!(a.size(), 64 << 10);
/// drop(a); // back to the pool, still pinned
/// ```
#[derive(Clone)]
pub struct PinnedPool {
    inner: Arc<Inner>,
}

impl fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedPool")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl PinnedPool {
    pub fn new(config: PinnedConfig) -> Result<Self, MemoryError> {
        let source = HostChunkSource::new(HostOptions {
            huge_pages: config.huge_pages,
            pin: true,
            refuse_mlock: config.refuse_mlock,
            ..HostOptions::default()
        });
        Self::with_source(config, Arc::new(source))
    }

    pub fn with_source(
        config: PinnedConfig,
        source: Arc<dyn ChunkSource>,
    ) -> Result<Self, MemoryError> {
        Ok(PinnedPool {
            inner: Arc::new(Inner {
                config,
                source,
                state: Mutex::new(State {
                    tlsf: {
                        // Plain good fit: pinned buffers are few and their latency is the point.
                        let mut t = Tlsf::new();
                        t.set_address_bins(0);
                        t
                    },
                    cache: (0..64 * 8).map(|_| Vec::new()).collect(),
                    chunks: Vec::new(),
                    allocated: 0,
                    allocations: 0,
                }),
            }),
        })
    }

    /// `size` pinned bytes aligned to `align` (a power of two up to 2 MiB; 0 means 256).
    pub fn alloc(&self, size: usize, align: usize) -> Result<PinnedAllocation, MemoryError> {
        if size == 0
            || size > 1 << 48
            || !(align == 0 || align.is_power_of_two())
            || align > crate::MAX_ALIGN
        {
            return Err(MemoryError::InvalidRequest {
                what: format!("pinned alloc of {size} bytes aligned to {align}"),
                hint: "sizes must be 1 byte to 2^48 bytes, alignments a power of two up to 2 MiB",
            });
        }
        let align = align.max(crate::DEFAULT_ALIGN);
        let rounded = round_size(size as u64);
        let class = class_of(rounded);
        let mut s = self.inner.lock();
        s.allocations += 1;
        let cached = match s.cache[class].last() {
            Some(&(addr, node)) if addr % align as u64 == 0 => {
                s.cache[class].pop();
                Some((node, addr))
            }
            _ => None,
        };
        let placed = match cached {
            Some(x) => Some(x),
            None => s
                .tlsf
                .alloc(rounded, align as u64, Placement::Low, u64::MAX),
        };
        let (node, addr) = match placed {
            Some(x) => x,
            None => {
                let need = rounded as usize + align;
                let csize = need.max(self.inner.config.chunk_size).div_ceil(HUGE_2M) * HUGE_2M;
                let chunk = self.inner.source.map(csize)?;
                poison(chunk.ptr.as_ptr(), chunk.size);
                let head = s
                    .tlsf
                    .add_region(chunk.ptr.as_ptr() as u64, chunk.size as u64);
                s.chunks.push((chunk, head));
                s.tlsf
                    .alloc(rounded, align as u64, Placement::Low, u64::MAX)
                    .expect("a fresh chunk larger than size + align fits the request")
            }
        };
        let block = s.tlsf.size_of(node) as usize;
        s.allocated += block;
        drop(s);
        unpoison(addr as usize as *const u8, size);
        Ok(PinnedAllocation {
            // SAFETY: TLSF addresses lie inside mapped chunks, never null.
            ptr: unsafe { NonNull::new_unchecked(addr as usize as *mut u8) },
            size,
            block,
            node,
            pool: self.inner.clone(),
        })
    }

    /// Releases wholly free chunks; the bytes released.
    pub fn trim(&self) -> usize {
        let mut s = self.inner.lock();
        let s = &mut *s;
        for list in s.cache.iter_mut() {
            for (_, node) in list.drain(..) {
                s.tlsf.free(node);
            }
        }
        let mut released = 0;
        let mut i = 0;
        while i < s.chunks.len() {
            let head = s.chunks[i].1;
            if s.tlsf.remove_region(head) {
                let (c, _) = s.chunks.swap_remove(i);
                released += c.size;
                unpoison(c.ptr.as_ptr(), c.size);
                self.inner.source.unmap(c);
            } else {
                i += 1;
            }
        }
        released
    }

    pub fn stats(&self) -> PinnedStats {
        let s = self.inner.lock();
        let mut notes: Vec<String> = Vec::new();
        for (c, _) in &s.chunks {
            for n in &c.notes {
                if !notes.contains(n) {
                    notes.push(n.clone());
                }
            }
        }
        PinnedStats {
            allocated: s.allocated,
            cached: s
                .cache
                .iter()
                .flatten()
                .map(|&(_, n)| s.tlsf.size_of(n) as usize)
                .sum(),
            reserved: s.chunks.iter().map(|(c, _)| c.size).sum(),
            chunks: s.chunks.len(),
            unpinned_chunks: s.chunks.iter().filter(|(c, _)| !c.pinned).count(),
            allocations: s.allocations,
            os_calls: self.inner.source.os_calls(),
            notes,
        }
    }
}

/// Pinned memory from a [`PinnedPool`]; returned to the pool on drop.
pub struct PinnedAllocation {
    ptr: NonNull<u8>,
    size: usize,
    block: usize,
    node: u32,
    pool: Arc<Inner>,
}

// SAFETY: the allocation uniquely owns its byte range; the pool internals it
// points to are behind a Mutex.
unsafe impl Send for PinnedAllocation {}
// SAFETY: `&PinnedAllocation` exposes only the address and size.
unsafe impl Sync for PinnedAllocation {}

impl PinnedAllocation {
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }
    pub fn size(&self) -> usize {
        self.size
    }
}

impl fmt::Debug for PinnedAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedAllocation")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .finish()
    }
}

impl Drop for PinnedAllocation {
    fn drop(&mut self) {
        poison(self.ptr.as_ptr(), self.block);
        let mut s = self.pool.lock();
        s.allocated -= self.block;
        let class = class_of(self.block as u64);
        if s.cache[class].len() < CACHE_PER_CLASS {
            s.cache[class].push((self.ptr.as_ptr() as u64, self.node));
        } else {
            s.tlsf.free(self.node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_writable() {
        let pool = PinnedPool::new(PinnedConfig::default()).expect("pool");
        let a = pool.alloc(4000, 0).expect("allocation");
        // SAFETY: the allocation owns 4000 writable bytes.
        let b = unsafe { std::slice::from_raw_parts_mut(a.ptr().as_ptr(), 4000) };
        b[3999] = 15;
        assert_eq!(b[3999], 15);
        assert_eq!(pool.stats().chunks, 1);
    }

    #[test]
    fn warm_allocations_make_no_syscalls() {
        let pool = PinnedPool::new(PinnedConfig::default()).expect("pool");
        drop(pool.alloc(64 << 10, 0).expect("warm-up"));
        let before = pool.stats().os_calls;
        for i in 0..1000 {
            let a = pool.alloc(4096 << (i % 6), 4096).expect("alloc");
            assert_eq!(a.ptr().as_ptr() as usize % 4096, 0);
        }
        assert_eq!(pool.stats().os_calls, before);
        assert_eq!(pool.stats().allocated, 0);
    }

    #[test]
    fn refused_mlock_is_reported_and_memory_still_works() {
        let pool = PinnedPool::new(PinnedConfig {
            refuse_mlock: true,
            ..PinnedConfig::default()
        })
        .expect("pool");
        let a = pool.alloc(100, 0).expect("pageable fallback");
        // SAFETY: the allocation owns 100 writable bytes.
        unsafe { a.ptr().as_ptr().write(1) };
        let s = pool.stats();
        assert_eq!(s.unpinned_chunks, 1);
        assert_eq!(s.os_calls.mlock_refused, 1);
        assert!(
            s.notes.iter().any(|n| n.contains("mlock refused")),
            "{:?}",
            s.notes
        );
    }

    #[test]
    fn large_requests_get_their_own_chunk_and_trim_releases_it() {
        let pool = PinnedPool::new(PinnedConfig::default()).expect("pool");
        let a = pool.alloc(20 << 20, 0).expect("big");
        assert!(pool.stats().reserved >= 20 << 20);
        drop(a);
        assert!(pool.trim() >= 20 << 20);
        assert_eq!(pool.stats().reserved, 0);
    }
}
