//! What every backend shares: the op and its ring, timelines, points and
//! parking, the storage behind buffers and its stream-ordered reuse, kernels'
//! argument lists and block views, the graph plan and its runner, the data
//! effects (one place for copies, fills and host reads and writes), the clock
//! and the loom facade. This floor imports neither the public API (`api/`) nor
//! the backends.

pub(crate) mod async_op;
pub mod clock;
pub(crate) mod effects;
pub(crate) mod graph;
pub(crate) mod kernel;
pub(crate) mod loom;
pub(crate) mod managed;
pub(crate) mod op;
pub(crate) mod park;
pub(crate) mod point;
pub(crate) mod ring;
pub(crate) mod rows;
pub(crate) mod sched;
pub(crate) mod storage;
pub(crate) mod thread;
pub(crate) mod timeline;
pub(crate) mod transfer;

/// Asks the CPU to bring the `bytes` from `p` into its cache, for a use a
/// little later (a replay's next steps: memory the devices' work evicted).
/// Only a hint: it reads and writes nothing the program sees and faults on
/// no address, so any pointer will do.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, bytes: usize) {
    for off in (0..bytes).step_by(64) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch neither reads nor writes memory the program
        // sees and faults on no address (SSE is in the x86_64 baseline).
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                p.wrapping_add(off).cast(),
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (p, off);
    }
}
