//! The process-wide monotonic clock every timestamp uses (the profiler's clock, so
//! event times and trace times agree).

pub use hetero_trace::now_ns;

/// Whether operations record timestamps for the profiler (one Relaxed load).
#[inline]
pub(crate) fn profiling() -> bool {
    hetero_trace::enabled()
}
