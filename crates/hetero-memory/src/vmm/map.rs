//! Map, unmap and set access on aligned sub-ranges of a [`VirtualRange`].
//!
//! Each call checks all of its input before it changes anything: offsets and
//! lengths are multiples of the range's granularity, the range and the handle
//! are large enough, a map lands on reserved pages only, an unmap or access
//! change covers mapped pages only, the handle belongs to the range's context
//! and the context's quota allows the bytes. A map of `len` bytes is one
//! `mmap` call however many granules it spans; the run table keeps neighbours
//! of one handle with contiguous offsets and one access as one run.
//!
//! A private handle (`private.rs`) is mapped whole, at one place, by moving
//! its pages in (`mremap`), and unmapped whole by moving them back out.

use super::physical::{check_aligned, Backing, PhysInner, PhysicalMemory};
use super::reserve::{reserve_raw, VirtualRange};
use crate::error::{Bytes, MemoryError};
use serde::Serialize;
use std::ffi::c_void;
use std::sync::Arc;

/// What the process may do with mapped pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Mapped, but any access faults.
    None,
    Read,
    ReadWrite,
}

impl Access {
    fn prot(self) -> rustix::mm::ProtFlags {
        use rustix::mm::ProtFlags;
        match self {
            Access::None => ProtFlags::empty(),
            Access::Read => ProtFlags::READ,
            Access::ReadWrite => ProtFlags::READ | ProtFlags::WRITE,
        }
    }

    fn mprotect(self) -> rustix::mm::MprotectFlags {
        use rustix::mm::MprotectFlags;
        match self {
            Access::None => MprotectFlags::empty(),
            Access::Read => MprotectFlags::READ,
            Access::ReadWrite => MprotectFlags::READ | MprotectFlags::WRITE,
        }
    }
}

/// One maximal mapped run of a range: `len` bytes of one handle from
/// `handle_offset`, with one access.
#[derive(Clone)]
pub struct Run {
    len: usize,
    phys: Arc<PhysInner>,
    phys_offset: usize,
    access: Access,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("len", &self.len)
            .field("handle", &self.phys.id)
            .field("handle_offset", &self.phys_offset)
            .field("access", &self.access)
            .finish()
    }
}

impl Run {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The [`PhysicalMemory::id`] of its handle.
    pub fn handle_id(&self) -> u64 {
        self.phys.id
    }
    pub fn handle_offset(&self) -> usize {
        self.phys_offset
    }
    pub fn access(&self) -> Access {
        self.access
    }
    /// Whether its handle is private.
    pub fn is_private(&self) -> bool {
        matches!(self.phys.backing, Backing::Private(_))
    }
    pub(super) fn forget_mapping(&self) {
        if let Backing::Private(p) = &self.phys.backing {
            p.forget_mapping();
        }
    }
}

impl VirtualRange {
    fn check_span(
        &self,
        what: &'static str,
        offset: usize,
        len: usize,
    ) -> Result<usize, MemoryError> {
        let g = self.granularity.bytes();
        check_aligned(
            if what == "map" {
                "map offset"
            } else {
                "offset"
            },
            offset,
            g,
        )?;
        check_aligned("length", len, g)?;
        if len == 0 {
            return Err(MemoryError::InvalidRequest {
                what: format!("{what} of 0 bytes at {offset:#x}"),
                hint: "give a length of at least one granule",
            });
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(end),
            _ => Err(MemoryError::OutOfRange {
                what,
                offset,
                len,
                size: Bytes(self.size),
            }),
        }
    }

    /// The first offset in `[offset, end)` no run covers.
    fn first_unmapped(&self, offset: usize, end: usize) -> Option<usize> {
        if offset >= end {
            return None; // an empty range has no unmapped page
        }
        let mut cur = offset;
        if let Some((&s, r)) = self.runs.range(..=offset).next_back() {
            if s + r.len > offset {
                cur = s + r.len;
            }
        }
        for (&s, r) in self.runs.range(offset + 1..end) {
            if s > cur {
                return Some(cur);
            }
            cur = cur.max(s + r.len);
        }
        (cur < end).then_some(cur)
    }

    /// The first run overlapping `[offset, end)`.
    fn overlapping(&self, offset: usize, end: usize) -> Option<(usize, usize)> {
        if let Some((&s, r)) = self.runs.range(..=offset).next_back() {
            if s + r.len > offset {
                return Some((s, r.len));
            }
        }
        self.runs
            .range(offset..end)
            .next()
            .map(|(&s, r)| (s, r.len))
    }

    /// Splits the run containing `at` (strictly inside it) in two.
    fn split_at(&mut self, at: usize) {
        let Some((&s, r)) = self.runs.range(..at).next_back() else {
            return;
        };
        if s + r.len <= at {
            return;
        }
        let mut tail = r.clone();
        let head_len = at - s;
        tail.len -= head_len;
        tail.phys_offset += head_len;
        self.runs.get_mut(&s).expect("found above").len = head_len;
        self.runs.insert(at, tail);
    }

    /// Joins neighbouring runs in `[lo, hi]` that continue one another.
    fn coalesce(&mut self, lo: usize, hi: usize) {
        let start = self.runs.range(..lo).next_back().map_or(lo, |(&s, _)| s);
        let keys: Vec<usize> = self.runs.range(start..=hi).map(|(&s, _)| s).collect();
        let mut cur = match keys.first() {
            Some(&k) => k,
            None => return,
        };
        for &k in &keys[1..] {
            let (a, b) = (&self.runs[&cur], &self.runs[&k]);
            if cur + a.len == k
                && Arc::ptr_eq(&a.phys, &b.phys)
                && a.phys_offset + a.len == b.phys_offset
                && a.access == b.access
            {
                let b = self.runs.remove(&k).expect("listed above");
                self.runs.get_mut(&cur).expect("listed above").len += b.len;
            } else {
                cur = k;
            }
        }
    }

    /// Maps `len` bytes of `handle` from `handle_offset` at `offset` with
    /// `access`: one `mmap` call. The pages must be reserved (not mapped).
    pub fn map(
        &mut self,
        offset: usize,
        handle: &PhysicalMemory,
        handle_offset: usize,
        len: usize,
        access: Access,
    ) -> Result<(), MemoryError> {
        let phys = &handle.inner;
        if phys.context != self.ctx.id {
            return Err(MemoryError::ForeignContext {
                what: "map",
                owner: format!("#{}", phys.context),
                caller: self.ctx.label(),
            });
        }
        let (pg, rg) = (phys.granularity.bytes(), self.granularity.bytes());
        if pg > rg {
            return Err(MemoryError::GranularityMismatch {
                physical: Bytes(pg),
                range: Bytes(rg),
            });
        }
        let end = self.check_span("map", offset, len)?;
        check_aligned("handle offset", handle_offset, rg)?;
        if handle_offset.checked_add(len).is_none_or(|e| e > phys.size) {
            return Err(MemoryError::OutOfRange {
                what: "map of handle bytes",
                offset: handle_offset,
                len,
                size: Bytes(phys.size),
            });
        }
        if let Some((existing, existing_len)) = self.overlapping(offset, end) {
            return Err(MemoryError::Overlap {
                offset,
                len,
                existing,
                existing_len,
            });
        }
        if let Backing::Private(_) = phys.backing {
            if handle_offset != 0 || len != phys.size {
                return Err(MemoryError::Private {
                    what: "map of part of a handle",
                    handle: phys.id,
                    hint: "map the whole handle (offset 0, its size), or create it shareable \
                           (create_physical) to map parts of it",
                });
            }
        }
        self.ctx.charge(len)?;
        self.calls += 1;
        // SAFETY: offset + len <= size (checked above): inside the range.
        let at = unsafe { self.base.as_ptr().add(offset) };
        let r = match &phys.backing {
            // SAFETY: [at, at + len) lies in this range and is only reserved
            // (checked above), so replacing it aliases no memory in use.
            Backing::Shared(fd) => unsafe {
                rustix::mm::mmap(
                    at.cast::<c_void>(),
                    len,
                    access.prot(),
                    rustix::mm::MapFlags::SHARED | rustix::mm::MapFlags::FIXED,
                    fd,
                    handle_offset as u64,
                )
            }
            .map(|_| ())
            .map_err(|e| MemoryError::Map {
                len: Bytes(len),
                source: e.into(),
                hint: "the kernel refused to map the handle; check the process's map count (vm.max_map_count)",
            }),
            // SAFETY: as for the memfd: [at, at + len) is only reserved, and
            // len is the handle's size (checked above).
            Backing::Private(p) => unsafe { p.move_in(at, phys.id) }.and_then(|()| {
                if access == Access::ReadWrite {
                    return Ok(());
                }
                // SAFETY: the handle's pages were moved to [at, at + len)
                // just now; changing their protection changes no memory.
                unsafe { rustix::mm::mprotect(at.cast(), len, access.mprotect()) }.map_err(
                    |e| MemoryError::Map {
                        len: Bytes(len),
                        source: e.into(),
                        hint: "the kernel refused the protection change",
                    },
                )
            }),
        };
        if let Err(e) = r {
            self.ctx.refund(len);
            return Err(e);
        }
        self.runs.insert(
            offset,
            Run {
                len,
                phys: phys.clone(),
                phys_offset: handle_offset,
                access,
            },
        );
        self.mapped += len;
        self.coalesce(offset, end);
        Ok(())
    }

    /// Unmaps `[offset, offset + len)`, every page of which must be mapped;
    /// the pages return to the reservation.
    pub fn unmap(&mut self, offset: usize, len: usize) -> Result<(), MemoryError> {
        let end = self.check_span("unmap", offset, len)?;
        if let Some(first_unmapped) = self.first_unmapped(offset, end) {
            return Err(MemoryError::NotMapped {
                what: "unmap",
                offset,
                len,
                first_unmapped,
            });
        }
        for start in self.private_handles(offset, end)? {
            self.park(start)?;
        }
        self.calls += 1;
        // SAFETY: the pages are mapped in this range (checked above); the
        // caller gives up their contents by unmapping.
        let at = unsafe { self.base.as_ptr().add(offset) }.cast::<c_void>();
        reserve_raw(Some(at), len).map_err(|source| MemoryError::Map {
            len: Bytes(len),
            source,
            hint: "the kernel refused to restore the reservation; check vm.max_map_count",
        })?;
        self.split_at(offset);
        self.split_at(end);
        let keys: Vec<usize> = self.runs.range(offset..end).map(|(&s, _)| s).collect();
        for k in keys {
            self.runs.remove(&k);
        }
        self.mapped -= len;
        self.ctx.refund(len);
        Ok(())
    }

    /// The private handles mapped in `[offset, end)`, as the offset of each
    /// one's first page; an error, before anything changes, if one lies only
    /// partly inside.
    fn private_handles(&self, offset: usize, end: usize) -> Result<Vec<usize>, MemoryError> {
        let from = self
            .runs
            .range(..offset)
            .next_back()
            .map_or(offset, |(&s, _)| s);
        let mut out: Vec<usize> = Vec::new();
        for (&s, r) in self.runs.range(from..end) {
            if s + r.len <= offset || !matches!(r.phys.backing, Backing::Private(_)) {
                continue;
            }
            let start = s - r.phys_offset;
            if start < offset || start + r.phys.size > end {
                return Err(MemoryError::Private {
                    what: "unmap of part of a handle",
                    handle: r.phys.id,
                    hint: "unmap the whole handle (it moves out as one), or create it shareable \
                           (create_physical) to unmap parts of it",
                });
            }
            if out.last() != Some(&start) {
                out.push(start);
            }
        }
        Ok(out)
    }

    /// Whether the private handle mapped from `start` is held outside this
    /// range's run table (a clone of the handle).
    pub(super) fn held_elsewhere(&self, start: usize) -> bool {
        let phys = &self.runs[&start].phys;
        let here = self
            .runs
            .range(start..start + phys.size)
            .filter(|(_, r)| Arc::ptr_eq(&r.phys, phys))
            .count();
        Arc::strong_count(phys) > here
    }

    /// Moves the pages of the private handle mapped from `start` back to its
    /// holding mapping, making them one read-write mapping first if
    /// `set_access` split them.
    pub(super) fn park(&mut self, start: usize) -> Result<(), MemoryError> {
        let r = self.runs.get(&start).expect("a private handle's first run");
        let Backing::Private(p) = &r.phys.backing else {
            unreachable!("private_handles lists private handles only")
        };
        let size = r.phys.size;
        self.calls += 1;
        if r.len == size && r.access == Access::ReadWrite {
            return p.park();
        }
        self.calls += 1;
        // SAFETY: [start, start + size) holds the handle's pages in this
        // range; a protection change alters no contents.
        unsafe {
            rustix::mm::mprotect(
                self.base.as_ptr().add(start).cast(),
                size,
                Access::ReadWrite.mprotect(),
            )
        }
        .map_err(|e| MemoryError::Map {
            len: Bytes(size),
            source: e.into(),
            hint: "the kernel refused the protection change",
        })?;
        p.park()
    }

    /// Sets the access of `[offset, offset + len)`, every page of which must
    /// be mapped.
    pub fn set_access(
        &mut self,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<(), MemoryError> {
        let end = self.check_span("set_access", offset, len)?;
        if let Some(first_unmapped) = self.first_unmapped(offset, end) {
            return Err(MemoryError::NotMapped {
                what: "set_access",
                offset,
                len,
                first_unmapped,
            });
        }
        self.calls += 1;
        // SAFETY: the pages are mapped in this range (checked above); changing
        // their protection changes no memory.
        unsafe {
            rustix::mm::mprotect(
                self.base.as_ptr().add(offset).cast::<c_void>(),
                len,
                access.mprotect(),
            )
        }
        .map_err(|e| MemoryError::Map {
            len: Bytes(len),
            source: e.into(),
            hint: "the kernel refused the protection change",
        })?;
        self.split_at(offset);
        self.split_at(end);
        for (_, r) in self.runs.range_mut(offset..end) {
            r.access = access;
        }
        self.coalesce(offset, end);
        Ok(())
    }

    /// Faults in every page of `[offset, offset + len)` now, in one call
    /// (`MADV_POPULATE_WRITE`), rather than page by page on first touch.
    /// Every page must be mapped read-write.
    pub fn populate(&mut self, offset: usize, len: usize) -> Result<(), MemoryError> {
        let end = self.check_span("populate", offset, len)?;
        if let Some(first_unmapped) = self.first_unmapped(offset, end) {
            return Err(MemoryError::NotMapped {
                what: "populate",
                offset,
                len,
                first_unmapped,
            });
        }
        if let Some((&at, _)) = self
            .runs
            .range(..end)
            .find(|(&s, r)| s + r.len > offset && r.access != Access::ReadWrite)
        {
            return Err(MemoryError::InvalidRequest {
                what: format!(
                    "populate of [{offset:#x}, {end:#x}): the run at {at:#x} is not read-write"
                ),
                hint: "set_access(…, Access::ReadWrite) first, or populate only read-write pages",
            });
        }
        self.calls += 1;
        // SAFETY: the pages are mapped read-write in this range (checked
        // above); populating them changes no contents.
        unsafe {
            rustix::mm::madvise(
                self.base.as_ptr().add(offset).cast::<c_void>(),
                len,
                rustix::mm::Advice::LinuxPopulateWrite,
            )
        }
        .map_err(|e| MemoryError::Os {
            what: "madvise(MADV_POPULATE_WRITE)".into(),
            source: e.into(),
            hint: "the kernel lacks MADV_POPULATE_WRITE (Linux 5.14+) or is out of memory",
        })
    }

    /// Whether every page of `[offset, offset + len)` is mapped. A zero
    /// length names no page: true wherever `offset` lies in the range (up to
    /// its end), whatever is mapped; past the end, false.
    pub fn is_mapped(&self, offset: usize, len: usize) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= self.size && self.first_unmapped(offset, end).is_none())
    }
}
