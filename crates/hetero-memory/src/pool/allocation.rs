//! [`Allocation`]: the handle to memory handed out by a [`DevicePool`].
//!
//! Invariants: an allocation is a unique handle to a byte range, tied to no
//! thread; it does not free itself: return it with [`DevicePool::free`].

use super::point::StreamPoint;
#[cfg(doc)]
use super::DevicePool;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// Memory from a [`DevicePool`]. It does not free itself: return it with
/// [`DevicePool::free`] (the execution layer's buffers do so stream-ordered on drop).
#[must_use = "an Allocation leaks unless given back with DevicePool::free"]
pub struct Allocation {
    pub(super) ptr: NonNull<u8>,
    pub(super) size: usize,
    pub(super) block: usize,
    pub(super) node: u32,
    /// A `Kind` as its discriminant (the hot path copies it without converting).
    pub(super) kind: u8,
    pub(super) pool: u32,
    // One pointer, not a 24-byte Vec: the hot path returns an Allocation
    // through memory, and at 64 bytes the copy cost 33 ns per alloc+free
    // against 19 ns at 48 (examples/hit_loop.rs).
    #[allow(clippy::box_collection)]
    pub(super) wait_for: Option<Box<Vec<Arc<dyn StreamPoint>>>>,
    /// Freed on the allocating stream while work queued there could still use it.
    pub(super) queued: bool,
    /// `class_of(block)` for cacheable blocks (saves recomputing it on free).
    pub(super) class: u8,
}

// SAFETY: an Allocation is a unique handle to a byte range; nothing in it is tied
// to a thread, and the fences it carries are Send + Sync.
unsafe impl Send for Allocation {}
// SAFETY: `&Allocation` only exposes the address, sizes and fences (all read-only).
unsafe impl Sync for Allocation {}

impl Allocation {
    /// The first byte, aligned as requested.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }
    /// The size requested.
    pub fn size(&self) -> usize {
        self.size
    }
    /// Fences the first use of this memory must wait for on a stream other than
    /// the one it was allocated on (cross-stream reuse under the "follow event
    /// dependencies" policy); empty when none.
    pub fn wait_for(&self) -> &[Arc<dyn StreamPoint>] {
        self.wait_for.as_deref().map_or(&[], Vec::as_slice)
    }

    /// Takes the fences out of [`Allocation::wait_for`] (once the caller has
    /// ordered the first use after them).
    pub fn take_wait_for(&mut self) -> Vec<Arc<dyn StreamPoint>> {
        self.wait_for.take().map_or_else(Vec::new, |b| *b)
    }

    /// Whether this memory was freed (with [`DevicePool::free`]) on the stream it
    /// is now allocated for while work queued on that stream could still use it.
    /// Later work on that stream is ordered after that work; work on any other
    /// stream must first wait for the allocating stream to reach this point.
    pub fn reused_in_stream_order(&self) -> bool {
        self.queued
    }
}

impl fmt::Debug for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocation")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .field("block", &self.block)
            .field("wait_for", &self.wait_for().len())
            .finish()
    }
}
