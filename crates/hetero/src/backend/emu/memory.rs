//! The emulated device's memory: one reserved range of `capacity` bytes (its
//! backing store), handed to the device pool chunk by chunk. Device addresses are
//! offsets into that range above `DEVICE_BASE`, not host pointers: host code
//! reaches device memory only through copies, and kernels through the views the
//! backend gives them.
//!
//! Invariants: chunks never overlap (a first-fit free list under one lock); a
//! chunk's pages are given back to the OS when it is unmapped (`MADV_DONTNEED`),
//! so device memory costs host RAM only while it is mapped in the pool. Past
//! `capacity` the pool's own limit (`max_reserved = capacity`) reports an
//! out-of-memory error with the figures: there is no fallback to host memory.

use hetero_memory::{Bytes, Chunk, ChunkSource, MemoryError, PageKind};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Mutex;

/// Where device addresses start: a non-canonical x86-64 address, so a device
/// address taken for a host pointer faults at once.
pub(crate) const DEVICE_BASE: u64 = 0x2000_0000_0000_0000;

#[derive(Debug)]
pub(crate) struct Arena {
    base: NonNull<u8>,
    capacity: usize,
    /// Free ranges: offset → length.
    free: Mutex<BTreeMap<usize, usize>>,
}

// SAFETY: the arena owns its mapping; chunk ranges are handed out exclusively
// under the `free` lock.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    /// Reserves `capacity` bytes of address space (pages are backed when touched).
    pub(crate) fn new(capacity: usize) -> Result<Arena, MemoryError> {
        use rustix::mm::{MapFlags, ProtFlags};
        let capacity = capacity.next_multiple_of(4096);
        // SAFETY: a fresh anonymous private mapping at an address of the kernel's
        // choosing aliases no existing memory.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                capacity,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .map_err(|e| MemoryError::Map {
            len: Bytes(capacity),
            source: e.into(),
            hint: "the emulated device reserves its capacity as address space; lower EmuConfig::capacity",
        })?;
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| MemoryError::InvalidRequest {
            what: "mmap returned a null mapping".into(),
            hint: "retry",
        })?;
        Ok(Arena {
            base,
            capacity,
            free: Mutex::new(BTreeMap::from([(0, capacity)])),
        })
    }

    /// The device address of host pointer `p` into the backing store.
    pub(crate) fn device_address(&self, p: *const u8) -> u64 {
        let base = self.base.as_ptr() as u64;
        match (p as u64).checked_sub(base) {
            Some(off) if off < self.capacity as u64 => DEVICE_BASE + off,
            // Not in the backing store (an empty buffer's dangling pointer).
            _ => DEVICE_BASE,
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: the range was mapped by `new` and every chunk of it has been
        // returned (the pool, which holds the chunks, is dropped first).
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.capacity) };
    }
}

/// The pool's chunk source for the emulated device.
#[derive(Debug)]
pub(crate) struct ArenaChunks(pub(crate) std::sync::Arc<Arena>);

impl ChunkSource for ArenaChunks {
    fn map(&self, size: usize) -> Result<Chunk, MemoryError> {
        let a = &self.0;
        let mut free = a.free.lock().unwrap_or_else(|p| p.into_inner());
        let found = free
            .iter()
            .find(|(_, &len)| len >= size)
            .map(|(&off, &len)| (off, len));
        let Some((off, len)) = found else {
            let free_bytes: usize = free.values().sum();
            return Err(MemoryError::OutOfMemory {
                requested: Bytes(size),
                reserved: Bytes(a.capacity - free_bytes),
                limit: Bytes(a.capacity),
                allocated: Bytes(a.capacity - free_bytes),
                free_fragmented: Bytes(free_bytes),
                largest_free: Bytes(free.values().copied().max().unwrap_or(0)),
                hint: "the emulated device's memory is full: free buffers, call Device::trim, or raise EmuConfig::capacity",
            });
        };
        free.remove(&off);
        if len > size {
            free.insert(off + size, len - size);
        }
        // SAFETY: `off + size <= capacity`: the range lies in the mapping.
        let ptr = unsafe { NonNull::new_unchecked(a.base.as_ptr().add(off)) };
        Ok(Chunk {
            ptr,
            size,
            page: PageKind::Normal,
            pinned: false,
            notes: Vec::new(),
        })
    }

    fn unmap(&self, chunk: Chunk) {
        let a = &self.0;
        let off = chunk.ptr.as_ptr() as usize - a.base.as_ptr() as usize;
        // SAFETY: the chunk's range lies in the mapping and nothing uses it any
        // more (the pool unmaps only free chunks); its pages read as zero after.
        let _ = unsafe {
            rustix::mm::madvise(
                chunk.ptr.as_ptr().cast(),
                chunk.size,
                rustix::mm::Advice::LinuxDontNeed,
            )
        };
        let mut free = a.free.lock().unwrap_or_else(|p| p.into_inner());
        let (mut start, mut len) = (off, chunk.size);
        // Merge with the neighbours.
        if let Some((&prev, &plen)) = free.range(..start).next_back() {
            if prev + plen == start {
                free.remove(&prev);
                start = prev;
                len += plen;
            }
        }
        if let Some(&nlen) = free.get(&(start + len)) {
            free.remove(&(start + len));
            len += nlen;
        }
        free.insert(start, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn chunks_do_not_overlap_and_merge_back() {
        let a = Arc::new(Arena::new(1 << 20).expect("arena"));
        let src = ArenaChunks(a.clone());
        let c1 = src.map(256 << 10).expect("c1");
        let c2 = src.map(256 << 10).expect("c2");
        assert_ne!(c1.ptr, c2.ptr);
        assert!(src.map(1 << 20).is_err(), "only half is free");
        src.unmap(c1);
        src.unmap(c2);
        let all = src.map(1 << 20).expect("merged back to one range");
        assert_eq!(a.device_address(all.ptr.as_ptr()), DEVICE_BASE);
        src.unmap(all);
    }
}
