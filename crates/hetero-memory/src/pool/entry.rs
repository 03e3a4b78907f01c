//! A cached block as the block caches hold it ([`Entry`], 16 bytes), and the
//! size classes those caches are kept per (blocks up to [`FRONT_MAX`]).
//!
//! Invariant: blocks are at least 256-byte aligned, so the low three bits of
//! an entry's address word are free to carry its kind and queued flag.

use super::allocation::Allocation;
use crate::tlsf::class_of;
use std::ptr::NonNull;

/// Largest block kept in the per-stream caches.
pub(super) const FRONT_MAX: usize = 1 << 20;
pub(super) const CLASS_BASE: usize = 64; // class_of(256)
pub(super) const NCLASS: usize = 20 * 8 + 1 - CLASS_BASE; // up to class_of(1 MiB)

/// A cached block in 16 bytes (the hot path copies it in and out of caches):
/// its address, with the kind in bits 0–1 and the queued flag (freed while its
/// stream's queued work could still use it, see `Pending::queued`) in bit 2, as
/// blocks are at least 256-byte aligned; its size and its TLSF node.
#[derive(Clone, Copy)]
pub(super) struct Entry {
    word: usize,
    pub(super) block: u32,
    pub(super) node: u32,
}

impl Entry {
    #[inline(always)]
    pub(super) fn of(a: &Allocation, queued: bool) -> Entry {
        Entry {
            word: a.ptr.as_ptr() as usize | a.kind as usize | usize::from(queued) << 2,
            block: a.block as u32,
            node: a.node,
        }
    }
    #[inline(always)]
    pub(super) fn addr(self) -> usize {
        self.word & !7
    }
    #[inline(always)]
    pub(super) fn kind(self) -> u8 {
        (self.word & 3) as u8
    }
    #[inline(always)]
    pub(super) fn queued(self) -> bool {
        self.word & 4 != 0
    }
}

pub(super) const BLANK: Entry = Entry {
    word: 0,
    block: 0,
    node: 0,
};

impl Allocation {
    /// A cached block of `class`, handed out for `size` bytes.
    #[inline(always)]
    pub(super) fn from_entry(e: Entry, size: usize, pool: u32, class: usize) -> Allocation {
        Allocation {
            // SAFETY: cached addresses come from chunks, which are never null.
            ptr: unsafe { NonNull::new_unchecked(e.addr() as *mut u8) },
            size,
            block: e.block as usize,
            node: e.node,
            kind: e.kind(),
            pool,
            wait_for: None,
            queued: e.queued(),
            class: class as u8,
        }
    }
}

/// The cache class of a block of `block` bytes (0 when too large to cache).
pub(super) fn class_for_block(block: usize) -> u8 {
    if block <= FRONT_MAX {
        class_of(block as u64) as u8
    } else {
        0
    }
}
