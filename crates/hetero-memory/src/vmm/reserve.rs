//! Reserved address ranges: `mmap(PROT_NONE, MAP_NORESERVE)`, aligned to the
//! range's granularity, holding no memory until a handle is mapped into it.
//! Dropping the range unmaps all of it and refunds its context.

use super::context::ContextInner;
use super::map::Run;
use super::physical::Granularity;
use crate::error::{Bytes, MemoryError};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

/// A reserved virtual address range; see [`MemoryContext::reserve`](super::MemoryContext::reserve).
pub struct VirtualRange {
    pub(super) base: NonNull<u8>,
    pub(super) size: usize,
    pub(super) granularity: Granularity,
    pub(super) ctx: Arc<ContextInner>,
    /// Runs by offset: maximal, disjoint.
    pub(super) runs: BTreeMap<usize, Run>,
    pub(super) mapped: usize,
    /// mmap/mprotect calls made for maps, unmaps and access changes.
    pub(super) calls: u64,
}

// SAFETY: the range is an owned description of an address range; its run
// table is changed only through `&mut self`, and the memory it maps is reached
// only through raw pointers whose users synchronise.
unsafe impl Send for VirtualRange {}
// SAFETY: `&VirtualRange` only reads the description and the run table.
unsafe impl Sync for VirtualRange {}

impl std::fmt::Debug for VirtualRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtualRange")
            .field("base", &self.base)
            .field("size", &self.size)
            .field("granularity", &self.granularity)
            .field("mapped", &self.mapped)
            .field("runs", &self.runs.len())
            .finish()
    }
}

/// Reserves `len` bytes with nothing behind them, at `at` when given (over an
/// existing part of a reservation: `MAP_FIXED`).
pub(super) fn reserve_raw(at: Option<*mut c_void>, len: usize) -> std::io::Result<*mut c_void> {
    use rustix::mm::{MapFlags, ProtFlags};
    let mut flags = MapFlags::PRIVATE | MapFlags::NORESERVE;
    if at.is_some() {
        flags |= MapFlags::FIXED;
    }
    // SAFETY: without `at`, a fresh mapping at an address of the kernel's
    // choosing aliases nothing; with it, callers pass pages of a range they own
    // and whose mappings they are replacing.
    unsafe {
        rustix::mm::mmap_anonymous(
            at.unwrap_or(std::ptr::null_mut()),
            len,
            ProtFlags::empty(),
            flags,
        )
    }
    .map_err(std::io::Error::from)
}

/// Maps `len + align - 4096` bytes with `map` and keeps the `len` of them that
/// start at an `align`-aligned address, unmapping the rest: how ranges and
/// private handles get bases aligned to their granule. Returns that base.
///
/// # Safety
/// `map(over)` returns the address of a fresh mapping of `over` bytes that
/// nothing else uses.
pub(super) unsafe fn map_aligned<E>(
    len: usize,
    align: usize,
    map: impl FnOnce(usize) -> Result<usize, E>,
) -> Result<usize, E> {
    let over = len + align - 4096;
    let raw = map(over)?;
    let base = raw.next_multiple_of(align);
    let (head, tail) = (base - raw, raw + over - (base + len));
    // SAFETY: head and tail are the parts of the fresh mapping (the caller's
    // promise) outside the aligned window; nothing else uses them.
    unsafe {
        if head > 0 {
            let _ = rustix::mm::munmap(raw as *mut c_void, head);
        }
        if tail > 0 {
            let _ = rustix::mm::munmap((base + len) as *mut c_void, tail);
        }
    }
    Ok(base)
}

impl VirtualRange {
    pub(super) fn reserve(
        ctx: Arc<ContextInner>,
        size: usize,
        granularity: Granularity,
    ) -> Result<Self, MemoryError> {
        let g = granularity.bytes();
        let size = size
            .max(1)
            .checked_next_multiple_of(g)
            .filter(|s| *s <= 1 << 46)
            .ok_or(MemoryError::InvalidRequest {
                what: format!("reserve of {size} bytes"),
                hint: "a range holds 1 byte to 64 TiB",
            })?;
        // SAFETY: `reserve_raw` returns a fresh reservation of the size asked.
        let base = unsafe {
            map_aligned(size, g, |over| {
                reserve_raw(None, over)
                    .map(|p| p as usize)
                    .map_err(|source| MemoryError::Map {
                        len: Bytes(over),
                        source,
                        hint: "the process is out of address space; reserve less",
                    })
            })
        }?;
        Ok(VirtualRange {
            base: NonNull::new(base as *mut u8).expect("mmap never returns null"),
            size,
            granularity,
            ctx,
            runs: BTreeMap::new(),
            mapped: 0,
            calls: 0,
        })
    }

    /// The first byte of the range.
    pub fn ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Bytes of address space.
    pub fn size(&self) -> usize {
        self.size
    }

    pub fn granularity(&self) -> Granularity {
        self.granularity
    }

    /// Bytes mapped now.
    pub fn mapped_bytes(&self) -> usize {
        self.mapped
    }

    /// The id of the context that owns it.
    pub fn context_id(&self) -> u64 {
        self.ctx.id
    }

    /// The mapped runs, by offset: one per maximal run of one handle with
    /// contiguous handle offsets and one access.
    pub fn runs(&self) -> impl Iterator<Item = (usize, &Run)> + '_ {
        self.runs.iter().map(|(o, r)| (*o, r))
    }

    /// mmap and mprotect calls its maps, unmaps and access changes made.
    pub fn os_calls(&self) -> u64 {
        self.calls
    }
}

impl Drop for VirtualRange {
    fn drop(&mut self) {
        self.ctx.refund(self.mapped);
        // Private handles still held elsewhere keep their pages: move them
        // back out; the others go with the range.
        let private: Vec<(usize, bool)> = self
            .runs
            .iter()
            .filter(|(_, r)| r.is_private() && r.handle_offset() == 0)
            .map(|(&s, _)| (s, self.held_elsewhere(s)))
            .collect();
        for (start, keep) in private {
            if keep {
                if let Err(e) = self.park(start) {
                    tracing::error!(error = %e, "moving a private handle out of a dropped range failed; its pages are lost");
                    self.runs[&start].forget_mapping();
                }
            } else {
                self.runs[&start].forget_mapping();
            }
        }
        // SAFETY: the range is this value's own reservation and its mappings;
        // nothing refers to it past drop.
        if let Err(e) = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.size) } {
            tracing::error!(size = self.size, error = %e, "munmap of a virtual range failed; it leaks");
        }
    }
}
