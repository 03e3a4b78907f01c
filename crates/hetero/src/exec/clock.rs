//! Clocks. `now_ns` is the process-wide monotonic clock (the profiler's, so
//! event times and trace times agree on the host). A device whose clock is its
//! own (the emulated device: modelled time, virtual or from its start)
//! registers it here, and every record about that device's memory is stamped
//! with it (`device_now_ns`): one trace, one clock per device.

pub use hetero_trace::now_ns;
use std::sync::{RwLock, Weak};

/// A device's own clock, ns.
pub(crate) trait DeviceClock: Send + Sync {
    fn now_ns(&self) -> u64;
}

/// Devices with a clock of their own (few: one per emulated device alive).
static DEVICE_CLOCKS: RwLock<Vec<(u64, Weak<dyn DeviceClock>)>> = RwLock::new(Vec::new());

/// Stamps records about `device` with `clock` from now on (while it lives).
pub(crate) fn set_device_clock(device: u64, clock: Weak<dyn DeviceClock>) {
    let mut clocks = DEVICE_CLOCKS.write().unwrap_or_else(|p| p.into_inner());
    clocks.retain(|(d, c)| *d != device && c.strong_count() > 0);
    clocks.push((device, clock));
}

/// `device`'s clock, ns: its own if it registered one, else the host's. For
/// records made while profiling (a read lock; never on a path that runs
/// without the profiler).
pub(crate) fn device_now_ns(device: u64) -> u64 {
    let clocks = DEVICE_CLOCKS.read().unwrap_or_else(|p| p.into_inner());
    clocks
        .iter()
        .find(|(d, _)| *d == device)
        .and_then(|(_, c)| c.upgrade())
        .map_or_else(now_ns, |c| c.now_ns())
}

/// Whether operations record timestamps for the profiler (one Relaxed load).
#[inline]
pub(crate) fn profiling() -> bool {
    hetero_trace::enabled()
}
