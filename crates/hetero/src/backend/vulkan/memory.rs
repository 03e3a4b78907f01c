//! The Vulkan device's memory, in the pools every backend uses: each pool
//! chunk is one `VkDeviceMemory` with one buffer over it (`hetero_vulkan::Chunk`).
//!
//! - Device memory: chunks of device-local memory, which the host may not be
//!   able to see. The pool works with addresses, so each chunk gets a range of
//!   a reserved, inaccessible stretch of this process's address space
//!   (`PROT_NONE`): a storage's device address is its place there, never a
//!   pointer into memory, and a stray host access faults at once.
//! - Pinned memory: chunks of host-visible, coherent memory, mapped; the
//!   mapping is the chunk's host address (the pinned pool hands out parts of
//!   it, which the host reads and writes directly). Two kinds: for uploads
//!   (host writes, device reads: uncached, write-combined where the device
//!   has it) and for readback (device writes, host reads: HOST_CACHED, so
//!   host reads run at cache speed instead of one bus read per access).
//!
//! [`Chunks::resolve`] leads an address of either kind back to its chunk and
//! offset, which is what a recorded copy or dispatch binds.
//!
//! Invariants: chunk ranges never overlap (a first-fit free list under one
//! lock); a chunk is in `table` from `map` until `unmap`, and the pool never
//! hands out an address of a chunk it returned, so a storage's address
//! resolves while the storage lives.

use hetero_memory::vmm::{Granularity, MemoryContext, VirtualRange};
use hetero_memory::{Bytes, Chunk, ChunkSource, MemoryError, PageKind};
use hetero_vulkan::{Gpu, MemoryUse};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

const PAGE: usize = 4096;

/// Where chunks live: `address → (chunk, bytes from the address, the
/// address's offset in the chunk)` (the offset is not 0 for imported host
/// memory, whose chunk starts at the page below it).
#[derive(Default)]
pub(crate) struct Table {
    chunks: BTreeMap<u64, (Arc<hetero_vulkan::Chunk>, u64, u64)>,
}

/// One kind of the device's memory (device-local or pinned), as the pool's
/// chunk source.
pub(crate) struct Chunks {
    gpu: Arc<Gpu>,
    kind: Kind,
    table: Mutex<Table>,
}

enum Kind {
    /// Device-local memory placed in a reserved range of addresses.
    Device {
        range: VirtualRange,
        capacity: usize,
        /// Free ranges of `range`: offset → length.
        free: Mutex<BTreeMap<usize, usize>>,
    },
    /// Host-visible, coherent memory at its mapping, of the type for `use_`.
    Pinned {
        use_: MemoryUse,
        /// The device has no coherent memory type for `use_`: chunks are of
        /// the upload type (coherent) instead, so no host access needs a
        /// flush or an invalidate.
        fallback: std::sync::atomic::AtomicBool,
    },
}

impl std::fmt::Debug for Chunks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            Kind::Device { .. } => "device-local",
            Kind::Pinned { .. } => "pinned",
        };
        f.debug_struct("vulkan::Chunks")
            .field("kind", &kind)
            .finish()
    }
}

impl Chunks {
    /// Device-local memory, at most `capacity` bytes in use at once.
    pub(crate) fn device(gpu: Arc<Gpu>, capacity: usize) -> Result<Chunks, MemoryError> {
        let capacity = capacity.max(PAGE).next_multiple_of(PAGE);
        let ctx = MemoryContext::unlimited("vulkan device addresses");
        let range = ctx.reserve(capacity, Granularity::Page4K)?;
        Ok(Chunks {
            gpu,
            kind: Kind::Device {
                range,
                capacity,
                free: Mutex::new(BTreeMap::from([(0, capacity)])),
            },
            table: Mutex::new(Table::default()),
        })
    }

    /// Host-visible memory for pinned buffers, of the type for `use_`
    /// (`Upload` or `Readback`).
    pub(crate) fn pinned(gpu: Arc<Gpu>, use_: MemoryUse) -> Chunks {
        Chunks {
            gpu,
            kind: Kind::Pinned {
                use_,
                fallback: Default::default(),
            },
            table: Mutex::new(Table::default()),
        }
    }

    /// A mapped chunk of `size` bytes for `use_`, coherent: a readback type
    /// that is not coherent (some mobile GPUs have cached memory only without
    /// coherence) gives way to the upload type, once and for good.
    fn pinned_chunk(
        &self,
        size: usize,
        use_: MemoryUse,
        fallback: &std::sync::atomic::AtomicBool,
    ) -> Result<hetero_vulkan::Chunk, MemoryError> {
        use std::sync::atomic::Ordering::Relaxed;
        let coherent = hetero_vulkan::vk::MemoryPropertyFlags::HOST_COHERENT;
        if use_ != MemoryUse::Upload && !fallback.load(Relaxed) {
            let c = hetero_vulkan::Chunk::new(&self.gpu, size as u64, use_)
                .map_err(|e| Self::memory_error(e, size))?;
            if c.memory_flags().contains(coherent) {
                return Ok(c);
            }
            tracing::info!(
                "Vulkan: no coherent {use_:?} memory type; pinned readback buffers use the \
                 upload type (uncached host reads)"
            );
            fallback.store(true, Relaxed);
        }
        hetero_vulkan::Chunk::new(&self.gpu, size as u64, MemoryUse::Upload)
            .map_err(|e| Self::memory_error(e, size))
    }

    /// Adds host memory the device imported (`Device::register_host`):
    /// `bytes` at `at`, which lies at `offset` in `chunk`, so `resolve` finds it.
    pub(crate) fn insert_imported(
        &self,
        at: u64,
        bytes: u64,
        chunk: hetero_vulkan::Chunk,
        offset: u64,
    ) {
        self.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .chunks
            .insert(at, (Arc::new(chunk), bytes, offset));
    }

    /// Forgets the imported memory at `at` (recorded commands keep their
    /// reference until they are done).
    pub(crate) fn forget_imported(&self, at: u64) {
        self.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .chunks
            .remove(&at);
    }

    /// The chunk holding `bytes` at `addr`, and the offset there; `None` when
    /// no chunk of this memory holds the whole range.
    pub(crate) fn resolve(
        &self,
        addr: u64,
        bytes: u64,
    ) -> Option<(Arc<hetero_vulkan::Chunk>, u64)> {
        let t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let (&at, (chunk, size, offset)) = t.chunks.range(..=addr).next_back()?;
        let off = addr - at;
        (off.checked_add(bytes)? <= *size).then(|| (chunk.clone(), offset + off))
    }

    fn memory_error(e: hetero_vulkan::VkError, requested: usize) -> MemoryError {
        match e {
            hetero_vulkan::VkError::OutOfMemory { heap_size, .. } => MemoryError::OutOfMemory {
                requested: Bytes(requested),
                reserved: Bytes(0),
                limit: Bytes(heap_size as usize),
                allocated: Bytes(0),
                free_fragmented: Bytes(0),
                largest_free: Bytes(0),
                hint: "the Vulkan device's memory heap is full: free buffers, or call Device::trim",
            },
            e => MemoryError::InvalidRequest {
                what: format!("a chunk of {requested} bytes of Vulkan memory: {e}"),
                hint: "see the Vulkan error",
            },
        }
    }
}

impl ChunkSource for Chunks {
    fn map(&self, size: usize) -> Result<Chunk, MemoryError> {
        let size = size.max(1).next_multiple_of(PAGE);
        match &self.kind {
            Kind::Device {
                range,
                capacity,
                free,
            } => {
                let mut free = free.lock().unwrap_or_else(|p| p.into_inner());
                let found = free
                    .iter()
                    .find(|(_, &len)| len >= size)
                    .map(|(&off, &len)| (off, len));
                let Some((off, len)) = found else {
                    let free_bytes: usize = free.values().sum();
                    return Err(MemoryError::OutOfMemory {
                        requested: Bytes(size),
                        reserved: Bytes(capacity - free_bytes),
                        limit: Bytes(*capacity),
                        allocated: Bytes(capacity - free_bytes),
                        free_fragmented: Bytes(free_bytes),
                        largest_free: Bytes(free.values().copied().max().unwrap_or(0)),
                        hint:
                            "the Vulkan device's memory is full: free buffers, or call Device::trim",
                    });
                };
                let chunk =
                    hetero_vulkan::Chunk::new(&self.gpu, size as u64, MemoryUse::DeviceLocal)
                        .map_err(|e| Self::memory_error(e, size))?;
                free.remove(&off);
                if len > size {
                    free.insert(off + size, len - size);
                }
                // SAFETY: `off + size <= capacity`: the address lies in the
                // reserved range (never dereferenced: it is `PROT_NONE`).
                let ptr = unsafe { std::ptr::NonNull::new_unchecked(range.ptr().add(off)) };
                self.table
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .chunks
                    .insert(ptr.as_ptr() as u64, (Arc::new(chunk), size as u64, 0));
                Ok(Chunk {
                    ptr,
                    size,
                    page: PageKind::Normal,
                    pinned: false,
                    notes: Vec::new(),
                })
            }
            Kind::Pinned { use_, fallback } => {
                let chunk = self.pinned_chunk(size, *use_, fallback)?;
                let ptr = chunk.mapped().ok_or_else(|| MemoryError::InvalidRequest {
                    what: "host-visible Vulkan memory that is not mapped".into(),
                    hint: "this is a bug in the Vulkan backend",
                })?;
                self.table
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .chunks
                    .insert(ptr.as_ptr() as u64, (Arc::new(chunk), size as u64, 0));
                Ok(Chunk {
                    ptr,
                    size,
                    page: PageKind::Normal,
                    pinned: true,
                    notes: Vec::new(),
                })
            }
        }
    }

    fn unmap(&self, chunk: Chunk) {
        let addr = chunk.ptr.as_ptr() as u64;
        // Dropping the last reference frees the `VkDeviceMemory` (a recorded
        // command that still uses it holds another).
        self.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .chunks
            .remove(&addr);
        if let Kind::Device { range, free, .. } = &self.kind {
            let off = addr as usize - range.ptr() as usize;
            let mut free = free.lock().unwrap_or_else(|p| p.into_inner());
            let (mut start, mut len) = (off, chunk.size);
            if let Some((&next, &nlen)) = free.range(start + len..).next() {
                if next == start + len {
                    free.remove(&next);
                    len += nlen;
                }
            }
            if let Some((&prev, &plen)) = free.range(..start).next_back() {
                if prev + plen == start {
                    free.remove(&prev);
                    start = prev;
                    len += plen;
                }
            }
            free.insert(start, len);
        }
    }
}
