//! Concurrency primitives routed through one place so that `cfg(loom)` can swap in
//! loom's model-checked versions (the tokio pattern). Code that is checked by loom
//! (the op ring, the timeline) imports atomics and cells from here, never from std.

#[cfg(loom)]
#[allow(unused_imports)]
pub(crate) use loom::{
    cell::UnsafeCell,
    sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering},
    sync::Arc,
};

#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::sync::{
    atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering},
    Arc,
};

/// `UnsafeCell` with loom's closure-based access API, so the same code compiles
/// under both std and loom.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(data: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(data))
    }

    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Gives up the core; under loom a yield of the model, so a polling loop lets the
/// model run the thread it waits for.
#[inline(always)]
pub(crate) fn yield_now() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
}

/// Nothing in a normal build; under loom a yield, so a retry loop that re-reads a
/// possibly stale value lets the model run the thread that makes progress.
#[inline(always)]
pub(crate) fn model_yield() {
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Spin hint; under loom a yield so the model explores other threads.
#[inline(always)]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}
