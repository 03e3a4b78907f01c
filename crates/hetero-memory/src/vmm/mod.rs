//! Virtual memory management: address ranges reserved apart from the physical
//! memory that backs them, like CUDA's and CANN's VMM (`cuMemAddressReserve`,
//! `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`).
//!
//! - [`MemoryContext`] (`context.rs`): who owns ranges and handles, with a
//!   quota of mapped bytes checked at map time and per-context figures.
//! - [`PhysicalMemory`] (`physical.rs`): a handle to physical memory of a
//!   granularity (4 KiB, 2 MiB, 1 GiB), a sealed memfd: hugetlb where pages are
//!   reserved, else a normal memfd (the handle says why).
//!   [`MemoryContext::create_private`] makes a private handle instead:
//!   anonymous memory (transparent huge pages where anonymous memory has
//!   them) that moves into the range it is mapped in (`private.rs`), one
//!   place at a time, not exportable.
//! - [`VirtualRange`] (`reserve.rs`): `mmap(PROT_NONE, MAP_NORESERVE)`, aligned
//!   to its granularity; map / unmap / set access (`map.rs`) on aligned
//!   sub-ranges, each call checked.
//!
//! Invariants: every page of a range is either reserved (`PROT_NONE`,
//! anonymous) or mapped from exactly one handle, as the range's run table says;
//! a run table entry is one maximal run of one handle with contiguous handle
//! offsets and one access; a context's mapped bytes never exceed its quota.
//! Memory shared between processes is in `crate::ipc`.

mod context;
mod map;
pub(crate) mod physical;
mod private;
mod reserve;

pub use context::{contexts, ContextStats, MemoryContext};
pub use map::{Access, Run};
pub use physical::{Granularity, PhysicalMemory};
pub use reserve::VirtualRange;

#[cfg(test)]
mod private_tests;
#[cfg(test)]
mod tests;
