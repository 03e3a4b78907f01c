//! Device memory: choosing a memory type for each use, and [`Chunk`], one
//! `VkDeviceMemory` with one `VkBuffer` over all of it (the "chunk" level of
//! hetero's pool: the region a pool carves blocks and buffers from).
//!
//! Invariants: a host-visible chunk is mapped once, for its whole life; host access
//! to non-coherent memory is flushed/invalidated over ranges widened to
//! `nonCoherentAtomSize`. A chunk is destroyed only when no pending command buffer
//! uses it (command buffers hold it by `Arc`).

use std::ptr::NonNull;
use std::sync::Arc;

use ash::vk;

use crate::device::{DeviceShared, Gpu};
use crate::error::{call, Result, VkError};

/// What a chunk of memory is for; decides the memory type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryUse {
    /// Fastest for the device; may not be host-visible.
    DeviceLocal,
    /// Host writes, device reads: HOST_VISIBLE | HOST_COHERENT.
    Upload,
    /// Device writes, host reads: HOST_VISIBLE, HOST_CACHED preferred (coherent or not).
    Readback,
}

impl MemoryUse {
    fn name(self) -> &'static str {
        match self {
            MemoryUse::DeviceLocal => "device-local",
            MemoryUse::Upload => "upload",
            MemoryUse::Readback => "readback",
        }
    }

    fn needs(self) -> &'static str {
        match self {
            MemoryUse::DeviceLocal => "any memory type",
            MemoryUse::Upload => "HOST_VISIBLE|HOST_COHERENT",
            MemoryUse::Readback => "HOST_VISIBLE",
        }
    }
}

/// Picks a memory type among `allowed` (a bitmask from memory requirements) for `use_`.
/// Returns the type index. Ranked by a preference score; ties go to the lower index
/// (drivers list their preferred types first).
pub fn choose_memory_type(
    types: &[crate::MemoryTypeInfo],
    allowed: u32,
    use_: MemoryUse,
) -> Option<u32> {
    use vk::MemoryPropertyFlags as F;
    let mut best: Option<(u32, i32)> = None;
    for (i, t) in types.iter().enumerate() {
        if i >= 32 || allowed & (1 << i) == 0 {
            continue;
        }
        let f = t.flags;
        let has = |x: F| f.contains(x);
        let score = match use_ {
            MemoryUse::DeviceLocal => {
                // VRAM that is not host-visible first, then any device-local, then anything.
                i32::from(has(F::DEVICE_LOCAL)) * 4 + i32::from(!has(F::HOST_VISIBLE)) * 2
            }
            MemoryUse::Upload => {
                if !has(F::HOST_VISIBLE | F::HOST_COHERENT) {
                    continue;
                }
                // System memory (not a BAR window) and write-combined preferred.
                i32::from(!has(F::DEVICE_LOCAL)) * 2 + i32::from(!has(F::HOST_CACHED))
            }
            MemoryUse::Readback => {
                if !has(F::HOST_VISIBLE) {
                    continue;
                }
                i32::from(has(F::HOST_CACHED)) * 4 + i32::from(has(F::HOST_COHERENT))
            }
        };
        if best.is_none_or(|(_, s)| score > s) {
            best = Some((i as u32, score));
        }
    }
    best.map(|(i, _)| i)
}

pub(crate) struct ChunkInner {
    pub(crate) shared: Arc<DeviceShared>,
    pub(crate) memory: vk::DeviceMemory,
    pub(crate) buffer: vk::Buffer,
    pub(crate) size: u64,
    pub(crate) use_: MemoryUse,
    pub(crate) memory_type: u32,
    pub(crate) flags: vk::MemoryPropertyFlags,
    mapped: Option<NonNull<u8>>,
    device_address: Option<u64>,
    imported: bool,
}

// SAFETY: the mapped pointer is the address of a device mapping owned by this struct;
// the struct only hands out copies through methods that take bounds-checked ranges,
// and Vulkan handles are plain values usable from any thread.
unsafe impl Send for ChunkInner {}
// SAFETY: as above; no method mutates the struct through `&self`.
unsafe impl Sync for ChunkInner {}

impl Drop for ChunkInner {
    fn drop(&mut self) {
        let d = &self.shared.device;
        // SAFETY: pending command buffers hold this struct by Arc, so the device no
        // longer uses the buffer or memory; unmapping before freeing is allowed
        // (freeing unmaps anyway).
        unsafe {
            d.destroy_buffer(self.buffer, None);
            if self.mapped.is_some() && !self.imported {
                d.unmap_memory(self.memory);
            }
            d.free_memory(self.memory, None);
        }
    }
}

/// One `VkDeviceMemory` with one storage `VkBuffer` over all of it; mapped for
/// its whole life when host-visible.
///
/// ```no_run
/// # use hetero_vulkan::{Instance, Gpu, Chunk, MemoryUse};
/// let gpu = Gpu::open(&Instance::load()?, 0)?;
/// let up = Chunk::new(&gpu, 1 << 20, MemoryUse::Upload)?;
/// up.write(0, &[1, 2, 3, 4])?;
/// # Ok::<(), hetero_vulkan::VkError>(())
/// ```
#[derive(Clone)]
pub struct Chunk {
    pub(crate) inner: Arc<ChunkInner>,
}

impl std::fmt::Debug for Chunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunk")
            .field("size", &self.inner.size)
            .field("use", &self.inner.use_)
            .field("memory_type", &self.inner.memory_type)
            .field("mapped", &self.inner.mapped.is_some())
            .finish()
    }
}

fn oom(shared: &DeviceShared, use_: MemoryUse, requested: u64, memory_type: u32) -> VkError {
    let heap = shared.info.memory_types[memory_type as usize].heap;
    VkError::OutOfMemory {
        usage: use_.name(),
        requested,
        heap,
        heap_size: shared.info.memory_heaps[heap as usize].size,
    }
}

impl Chunk {
    /// Allocates `size` bytes for `use_`. Sizes past the chosen heap, and driver
    /// out-of-memory results, are [`VkError::OutOfMemory`] with the heap's size.
    pub fn new(gpu: &Gpu, size: u64, use_: MemoryUse) -> Result<Chunk> {
        Self::create(gpu, size, use_, None)
    }

    /// Wraps `len` bytes of host memory at `ptr` as a chunk (VK_EXT_external_memory_host),
    /// so the device reads and writes them in place. `ptr` and `len` must be multiples
    /// of `Limits::min_imported_host_pointer_alignment`.
    ///
    /// # Safety
    /// The memory must stay allocated, and not be unmapped, for as long as the chunk
    /// and any command buffer using it live; the host must not access it while the
    /// device does.
    pub unsafe fn import_host(gpu: &Gpu, ptr: NonNull<u8>, len: u64) -> Result<Chunk> {
        Self::create(gpu, len, MemoryUse::Readback, Some(ptr))
    }

    fn create(gpu: &Gpu, size: u64, use_: MemoryUse, host: Option<NonNull<u8>>) -> Result<Chunk> {
        let shared = Arc::clone(&gpu.shared);
        let s = &*shared;
        if size == 0 {
            return Err(VkError::InvalidArgument(
                "a chunk of 0 bytes was requested; Vulkan has no empty buffers, ask for at least 1"
                    .into(),
            ));
        }
        let handle_type = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;
        let mut host_bits = u32::MAX;
        if let Some(ptr) = host {
            let Some(ext) = &s.external_host else {
                return Err(VkError::Unsupported {
                    device: s.name(),
                    what: "host memory import (VK_EXT_external_memory_host)",
                });
            };
            let align = s
                .info
                .limits
                .min_imported_host_pointer_alignment
                .unwrap_or(4096)
                .max(1);
            if !(ptr.as_ptr() as usize as u64).is_multiple_of(align) || !size.is_multiple_of(align)
            {
                return Err(VkError::InvalidArgument(format!(
                    "host import of {size} bytes at {ptr:p}: pointer and length must be multiples of {align} \
                     (minImportedHostPointerAlignment)"
                )));
            }
            let mut props = vk::MemoryHostPointerPropertiesEXT::default();
            // SAFETY: the extension is enabled; `ptr` is host memory the caller vouches for.
            unsafe {
                (ext.fp().get_memory_host_pointer_properties_ext)(
                    s.device.handle(),
                    handle_type,
                    ptr.as_ptr().cast(),
                    &mut props,
                )
            }
            .result()
            .map_err(call("vkGetMemoryHostPointerPropertiesEXT"))?;
            host_bits = props.memory_type_bits;
        }

        let mut usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        if s.buffer_device_address {
            usage |= vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS;
        }
        let families = s.plan.families();
        let mut external = vk::ExternalMemoryBufferCreateInfo::default().handle_types(handle_type);
        let mut info = vk::BufferCreateInfo::default().size(size).usage(usage);
        info = if families.len() > 1 {
            // Both lanes' families use the buffer without ownership transfers.
            info.sharing_mode(vk::SharingMode::CONCURRENT)
                .queue_family_indices(&families)
        } else {
            info.sharing_mode(vk::SharingMode::EXCLUSIVE)
        };
        if host.is_some() {
            info = info.push_next(&mut external);
        }

        // Check the size against the heap of the type we would pick before asking
        // the driver: buffers past maxBufferSize or the heap are invalid usage.
        let type_for = |bits: u32| {
            choose_memory_type(&s.info.memory_types, bits & host_bits, use_).ok_or_else(|| {
                VkError::NoMemoryType {
                    device: s.name(),
                    usage: use_.name(),
                    needs: use_.needs(),
                }
            })
        };
        let guess = type_for(u32::MAX)?;
        let heap = s.info.memory_types[guess as usize].heap as usize;
        if size > s.info.memory_heaps[heap].size {
            return Err(oom(s, use_, size, guess));
        }

        // SAFETY: valid create info for a live device.
        let buffer = unsafe { s.device.create_buffer(&info, None) }.map_err(|e| match e {
            vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
                oom(s, use_, size, guess)
            }
            e => call("vkCreateBuffer")(e),
        })?;
        let destroy_buffer = |e: VkError| {
            // SAFETY: the buffer was just created and is bound to nothing in use.
            unsafe { s.device.destroy_buffer(buffer, None) };
            e
        };
        // SAFETY: `buffer` is live.
        let req = unsafe { s.device.get_buffer_memory_requirements(buffer) };
        let memory_type = type_for(req.memory_type_bits).map_err(destroy_buffer)?;
        let heap = s.info.memory_types[memory_type as usize].heap as usize;
        if req.size > s.info.memory_heaps[heap].size {
            return Err(destroy_buffer(oom(s, use_, size, memory_type)));
        }

        let mut flags_info =
            vk::MemoryAllocateFlagsInfo::default().flags(vk::MemoryAllocateFlags::DEVICE_ADDRESS);
        let mut import = vk::ImportMemoryHostPointerInfoEXT::default().handle_type(handle_type);
        let mut alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(memory_type);
        if s.buffer_device_address {
            alloc = alloc.push_next(&mut flags_info);
        }
        if let Some(ptr) = host {
            import = import.host_pointer(ptr.as_ptr().cast());
            alloc = alloc.push_next(&mut import);
        }
        // SAFETY: valid allocate info; for imports the caller vouches for the pointer.
        let memory = unsafe { s.device.allocate_memory(&alloc, None) }.map_err(|e| {
            destroy_buffer(match e {
                vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
                    oom(s, use_, size, memory_type)
                }
                e => call("vkAllocateMemory")(e),
            })
        })?;
        let free_all = |e: VkError| {
            // SAFETY: both were just made and nothing uses them.
            unsafe {
                s.device.destroy_buffer(buffer, None);
                s.device.free_memory(memory, None);
            }
            e
        };
        // SAFETY: the memory fits the buffer's requirements (same size and type bits).
        unsafe { s.device.bind_buffer_memory(buffer, memory, 0) }
            .map_err(|e| free_all(call("vkBindBufferMemory")(e)))?;

        let flags = s.info.memory_types[memory_type as usize].flags;
        let mapped = if let Some(ptr) = host {
            Some(ptr)
        } else if flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE) {
            // SAFETY: the memory is host-visible and not mapped yet.
            let p = unsafe {
                s.device
                    .map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
            }
            .map_err(|e| free_all(call("vkMapMemory")(e)))?;
            NonNull::new(p.cast::<u8>())
        } else {
            None
        };
        let device_address = s.buffer_device_address.then(|| {
            let info = vk::BufferDeviceAddressInfo::default().buffer(buffer);
            // SAFETY: the buffer has SHADER_DEVICE_ADDRESS usage and memory allocated
            // with DEVICE_ADDRESS.
            unsafe { s.device.get_buffer_device_address(&info) }
        });
        let imported = host.is_some();
        Ok(Chunk {
            inner: Arc::new(ChunkInner {
                shared: Arc::clone(&shared),
                memory,
                buffer,
                size,
                use_,
                memory_type,
                flags,
                mapped,
                device_address,
                imported,
            }),
        })
    }

    /// Bytes in the chunk.
    pub fn size(&self) -> u64 {
        self.inner.size
    }

    /// What it was allocated for.
    pub fn memory_use(&self) -> MemoryUse {
        self.inner.use_
    }

    /// Index of the memory type it lives in.
    pub fn memory_type(&self) -> u32 {
        self.inner.memory_type
    }

    /// The memory type's property flags.
    pub fn memory_flags(&self) -> vk::MemoryPropertyFlags {
        self.inner.flags
    }

    /// The persistent mapping, when host-visible. Host access through it must be
    /// bracketed by [`Chunk::invalidate`]/[`Chunk::flush`] when not coherent, and must
    /// not race device access.
    pub fn mapped(&self) -> Option<NonNull<u8>> {
        self.inner.mapped
    }

    /// The buffer's device address (with buffer device address support).
    pub fn device_address(&self) -> Option<u64> {
        self.inner.device_address
    }

    /// The raw buffer handle, valid while this chunk lives.
    pub fn raw_buffer(&self) -> vk::Buffer {
        self.inner.buffer
    }

    pub(crate) fn check_range(&self, what: &'static str, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.inner.size => Ok(()),
            _ => Err(VkError::OutOfBounds {
                what,
                offset,
                len,
                size: self.inner.size,
            }),
        }
    }

    fn coherent(&self) -> bool {
        self.inner
            .flags
            .contains(vk::MemoryPropertyFlags::HOST_COHERENT)
    }

    /// `[offset, offset+len)` widened to whole non-coherent atoms, clamped to the chunk.
    fn atom_range(&self, offset: u64, len: u64) -> vk::MappedMemoryRange<'static> {
        let atom = self.inner.shared.info.limits.non_coherent_atom_size.max(1);
        let start = offset / atom * atom;
        let end = (offset + len).div_ceil(atom) * atom;
        let size = if end >= self.inner.size {
            vk::WHOLE_SIZE
        } else {
            end - start
        };
        vk::MappedMemoryRange::default()
            .memory(self.inner.memory)
            .offset(start)
            .size(size)
    }

    fn host_ptr(&self, what: &'static str, offset: u64, len: u64) -> Result<*mut u8> {
        self.check_range(what, offset, len)?;
        let base = self.inner.mapped.ok_or_else(|| {
            VkError::InvalidArgument(format!(
                "{what}: the chunk is {} memory, not host-visible; copy through an upload or readback chunk",
                self.inner.use_.name()
            ))
        })?;
        // SAFETY: `offset + len <= size` was checked and the mapping covers the chunk.
        Ok(unsafe { base.as_ptr().add(offset as usize) })
    }

    /// Makes host writes in the range visible to the device (no-op when coherent).
    pub fn flush(&self, offset: u64, len: u64) -> Result<()> {
        self.check_range("flush", offset, len)?;
        if self.coherent() || len == 0 || self.inner.mapped.is_none() {
            return Ok(());
        }
        let range = self.atom_range(offset, len);
        // SAFETY: the memory is mapped and the range lies inside the mapping.
        unsafe {
            self.inner
                .shared
                .device
                .flush_mapped_memory_ranges(&[range])
        }
        .map_err(call("vkFlushMappedMemoryRanges"))
    }

    /// Makes device writes in the range visible to the host (no-op when coherent).
    pub fn invalidate(&self, offset: u64, len: u64) -> Result<()> {
        self.check_range("invalidate", offset, len)?;
        if self.coherent() || len == 0 || self.inner.mapped.is_none() {
            return Ok(());
        }
        let range = self.atom_range(offset, len);
        // SAFETY: as for flush.
        unsafe {
            self.inner
                .shared
                .device
                .invalidate_mapped_memory_ranges(&[range])
        }
        .map_err(call("vkInvalidateMappedMemoryRanges"))
    }

    /// Copies `data` into the chunk at `offset` through the mapping, then flushes.
    /// The device must not be using the range (wait on its timeline first).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let dst = self.host_ptr("write", offset, data.len() as u64)?;
        // SAFETY: `dst..dst+len` lies in the live mapping (checked); `data` is a
        // separate Rust slice, so the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        self.flush(offset, data.len() as u64)
    }

    /// Invalidates, then copies `out.len()` bytes from the chunk at `offset` into `out`.
    /// The device must have finished writing the range (wait on its timeline first).
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let src = self.host_ptr("read", offset, out.len() as u64)?;
        self.invalidate(offset, out.len() as u64)?;
        // SAFETY: as for write, in the other direction.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    pub(crate) fn same_device(&self, shared: &Arc<DeviceShared>) -> Result<()> {
        if Arc::ptr_eq(&self.inner.shared, shared) {
            Ok(())
        } else {
            Err(VkError::ForeignObject { what: "a chunk" })
        }
    }
}
