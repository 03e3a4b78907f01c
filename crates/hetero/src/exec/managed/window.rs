//! A managed buffer's device copy on a device whose memory is modelled in
//! host memory (the emulated device): anonymous memory reserved without swap
//! accounting (`MAP_NORESERVE`), so a page costs host RAM only once a copy or
//! kernel touched it, and clean pages the device evicts with no work queued
//! on them are given back (`MADV_DONTNEED`) at once (others stay mapped
//! until they are copied in again or the buffer drops). The device's engines
//! reach it through their `Reach`, like their own arena; how much of it
//! counts as resident is the page table's business (`mod.rs`), not the
//! mapping's.

use std::ptr::NonNull;

/// Owns the mapping; unmapped on drop.
pub(crate) struct Window {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the window is plain memory owned by this value; who touches which
// bytes when is the page table's ordering (module doc of `mod.rs`).
unsafe impl Send for Window {}
// SAFETY: as above.
unsafe impl Sync for Window {}

const PAGE: usize = 4096;

impl Window {
    /// Reserves `bytes` (rounded up to whole 4 KiB pages, at least one).
    pub(crate) fn new(bytes: usize) -> Result<Window, String> {
        let len = bytes.max(1).next_multiple_of(PAGE);
        use rustix::mm::{MapFlags, ProtFlags};
        // SAFETY: a fresh anonymous mapping at an address the kernel chooses
        // aliases nothing.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .map_err(|e| format!("mapping {len} bytes for a managed buffer's device copy: {e}"))?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or("mmap returned null")?;
        Ok(Window { ptr, len })
    }

    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Gives the pages of `off..off + len` back to the OS (they read as zero
    /// afterwards). Whole 4 KiB pages inside the range only.
    pub(crate) fn release(&self, off: usize, len: usize) {
        let start = off.next_multiple_of(PAGE);
        let end = (off + len).min(self.len) / PAGE * PAGE;
        if end <= start {
            return;
        }
        // SAFETY: the range lies inside this mapping; the caller guarantees
        // no op touches it any more (its copy back completed and no queued
        // work names it), so dropping its contents is what it asks.
        let r = unsafe {
            rustix::mm::madvise(
                self.ptr.as_ptr().add(start).cast(),
                end - start,
                rustix::mm::Advice::LinuxDontNeed,
            )
        };
        if let Err(e) = r {
            tracing::debug!(error = %e, "releasing evicted managed pages failed; they stay mapped");
        }
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours, and dropping the window means nothing
        // holds a storage over it (storages keep it alive).
        let r = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
        if let Err(e) = r {
            tracing::error!(error = %e, "unmapping a managed buffer's device copy failed");
        }
    }
}
