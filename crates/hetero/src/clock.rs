//! The process-wide monotonic clock all timestamps use (ns since first use).

use std::sync::OnceLock;
use std::time::Instant;

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since the first call in this process.
#[inline]
pub fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

static PROFILING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether operations record timestamps for the profiler (one Relaxed load).
#[inline]
pub(crate) fn profiling() -> bool {
    PROFILING.load(std::sync::atomic::Ordering::Relaxed)
}
