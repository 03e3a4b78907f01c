//! The emulated device's memory: one range of `capacity` bytes reserved
//! through hetero-memory's virtual memory API, with a physical handle of the
//! same size (a sealed memfd, its pages allocated when touched) mapped under
//! each chunk the device pool takes, at the chunk's own offset. Device
//! addresses are offsets into that range above `DEVICE_BASE`, not host
//! pointers: host code reaches device memory only through copies, and kernels
//! through the views the backend gives them.
//!
//! Invariants: chunks never overlap (a first-fit free list under one lock);
//! only chunks are mapped (the rest of the range is `PROT_NONE`, so a stray
//! access faults); a chunk's pages are given back to the OS when it is
//! unmapped (unmap, then `fallocate(PUNCH_HOLE)` on the handle), so device
//! memory costs host RAM only while it is mapped in the pool. Past `capacity`
//! the pool's own limit (`max_reserved = capacity`) reports an out-of-memory
//! error with the figures: there is no fallback to host memory.

use crate::exec::storage::Reach;
use hetero_memory::vmm::{Access, Granularity, MemoryContext, PhysicalMemory, VirtualRange};
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
    /// The reserved range; chunks are mapped into it from `store`.
    range: Mutex<VirtualRange>,
    store: PhysicalMemory,
}

// SAFETY: the arena owns its range; chunk ranges are handed out exclusively
// under the `free` lock, and the range's table changes under its own lock.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

const PAGE: usize = 4096;

impl Arena {
    /// Reserves `capacity` bytes of address space and a physical handle of
    /// that size (pages are allocated when touched).
    pub(crate) fn new(capacity: usize) -> Result<Arena, MemoryError> {
        let capacity = capacity.max(1).next_multiple_of(PAGE);
        let ctx = MemoryContext::unlimited("emulated device memory");
        let range = ctx.reserve(capacity, Granularity::Page4K)?;
        let store = ctx.create_physical(capacity, Granularity::Page4K)?;
        let base = NonNull::new(range.ptr()).ok_or_else(|| MemoryError::InvalidRequest {
            what: "the reserved range starts at null".into(),
            hint: "retry",
        })?;
        Ok(Arena {
            base,
            capacity,
            free: Mutex::new(BTreeMap::from([(0, capacity)])),
            range: Mutex::new(range),
            store,
        })
    }

    /// How engines reach device addresses: in the backing store.
    pub(crate) fn reach(&self) -> Reach {
        Reach::linear(DEVICE_BASE, self.base.as_ptr())
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

/// The pool's chunk source for the emulated device.
#[derive(Debug)]
pub(crate) struct ArenaChunks(pub(crate) std::sync::Arc<Arena>);

impl ChunkSource for ArenaChunks {
    fn map(&self, size: usize) -> Result<Chunk, MemoryError> {
        let a = &self.0;
        let size = size.max(1).next_multiple_of(PAGE);
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
        a.range.lock().unwrap_or_else(|p| p.into_inner()).map(
            off,
            &a.store,
            off,
            size,
            Access::ReadWrite,
        )?;
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
        // Nothing uses the chunk any more (the pool unmaps only free chunks):
        // unmap it and give its pages back; they read as zero when mapped again.
        let unmapped = a
            .range
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unmap(off, chunk.size)
            .and_then(|()| a.store.release(off, chunk.size));
        if let Err(e) = unmapped {
            tracing::error!(error = %e, "returning an emulated device chunk failed");
        }
        let mut free = a.free.lock().unwrap_or_else(|p| p.into_inner());
        // Merged with the neighbours.
        let (start, len) = hetero_memory::arena_plan::merge_free(&mut free, off, chunk.size);
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

    /// A device buffer's storage keeps its device address only; the
    /// device's reach leads that address back to the arena's bytes.
    #[test]
    fn device_storage_holds_a_device_address_and_no_host_pointer() {
        use crate::backend::Backend;
        use crate::exec::storage::MemoryKind;
        let emu = crate::EmuConfig::new(crate::LinkPreset::pcie4x16());
        let b = crate::backend::emu::EmuBackend::new(1, crate::DeviceConfig::default(), emu)
            .expect("emu backend");
        for _ in 0..2 {
            // The second round takes the storage this thread kept warm.
            let s = b.allocate(MemoryKind::Device, 4096, 0).expect("alloc");
            assert!(!s.host_visible());
            assert!(s.device_addr() >= DEVICE_BASE, "{:#x}", s.device_addr());
            let at = s.engine_ptr(b.reach()) as usize;
            let base = b.arena.base.as_ptr() as usize;
            assert!((base..base + b.arena.capacity).contains(&at));
            assert_eq!(b.arena.device_address(at as *const u8), s.device_addr());
        }
        b.shutdown();
    }

    #[test]
    fn chunks_are_mapped_through_the_vmm_and_released() {
        let a = Arc::new(Arena::new(4 << 20).expect("arena"));
        let src = ArenaChunks(a.clone());
        let c = src.map(1 << 20).expect("chunk");
        // SAFETY: the chunk is 1 MiB of mapped, writable device memory.
        unsafe { c.ptr.as_ptr().add(100).write(7) };
        {
            let r = a.range.lock().expect("lock");
            assert!(r.is_mapped(0, 1 << 20));
            assert!(!r.is_mapped(1 << 20, 4096), "only chunks are mapped");
        }
        src.unmap(c);
        assert_eq!(a.range.lock().expect("lock").mapped_bytes(), 0);
        let again = src.map(1 << 20).expect("chunk");
        // SAFETY: mapped again; the released pages read as zero.
        assert_eq!(unsafe { again.ptr.as_ptr().add(100).read() }, 0);
        src.unmap(again);
    }
}
