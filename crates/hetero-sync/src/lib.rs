//! Concurrency primitives routed through one place so that `cfg(loom)` can swap in
//! loom's model-checked versions (the tokio pattern). Code that loom checks (the op
//! ring, the timeline, the chunked trace log, the pool's try-lock) imports atomics,
//! cells, `Arc` and `Mutex` from here, never from std.
//!
//! `cfg(loom)` is set through `RUSTFLAGS="--cfg loom"` (see `ci/loom.sh`); every
//! crate that uses this facade then builds against loom.
//!
//! ```
//! use hetero_sync::{Arc, AtomicUsize, Ordering, UnsafeCell};
//! let hits = Arc::new(AtomicUsize::new(0));
//! hits.fetch_add(1, Ordering::Relaxed);
//! let cell = UnsafeCell::new(1u32);
//! // SAFETY: no other reference to the cell's value exists.
//! cell.with_mut(|p| unsafe { *p += 1 });
//! assert_eq!(cell.with(|p| unsafe { *p }), 2);
//! assert_eq!(hits.load(Ordering::Relaxed), 1);
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(loom)]
pub use loom::{
    cell::UnsafeCell,
    sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    },
    sync::{Arc, Mutex, MutexGuard},
};

#[cfg(not(loom))]
pub use std::sync::{
    atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering},
    Arc, Mutex, MutexGuard,
};

/// `std`'s `UnsafeCell` with loom's closure-based access API (`with`, `with_mut`),
/// so the same code compiles under both std and loom.
#[cfg(not(loom))]
#[derive(Debug, Default)]
pub struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// A cell holding `data`.
    pub const fn new(data: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(data))
    }

    /// Runs `f` on a shared pointer to the value.
    #[inline(always)]
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` on a mutable pointer to the value.
    #[inline(always)]
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Gives up the core; under loom a yield of the model, so a polling loop lets the
/// model run the thread it waits for.
#[inline(always)]
pub fn yield_now() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
}

/// Nothing in a normal build; under loom a yield, so a retry loop that re-reads a
/// possibly stale value lets the model run the thread that makes progress.
#[inline(always)]
pub fn model_yield() {
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Spin hint; under loom a yield so the model explores other threads.
#[inline(always)]
pub fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn cell_reads_what_it_wrote() {
        let cell = UnsafeCell::new(vec![1u8]);
        // SAFETY: the test holds the only reference to the cell.
        cell.with_mut(|p| unsafe { (*p).push(2) });
        // SAFETY: as above.
        assert_eq!(cell.with(|p| unsafe { (*p).clone() }), [1, 2]);
        // SAFETY: a fresh cell, read only here.
        assert_eq!(UnsafeCell::<u32>::default().with(|p| unsafe { *p }), 0);
    }

    #[test]
    fn hints_return() {
        yield_now();
        model_yield();
        spin_hint();
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    /// The facade is loom's under `cfg(loom)`: its types work inside a model, and
    /// the model sees every interleaving of two increments.
    #[test]
    fn loom_facade_models_two_threads() {
        loom::model(|| {
            let n = Arc::new(AtomicUsize::new(0));
            let guarded = Arc::new(Mutex::new(0u32));
            let (n2, g2) = (n.clone(), guarded.clone());
            let t = loom::thread::spawn(move || {
                n2.fetch_add(1, Ordering::Relaxed);
                *g2.lock().expect("lock") += 1;
                spin_hint();
            });
            n.fetch_add(1, Ordering::Relaxed);
            *guarded.lock().expect("lock") += 1;
            t.join().expect("thread");
            assert_eq!(n.load(Ordering::Relaxed), 2);
            assert_eq!(*guarded.lock().expect("lock"), 2);
        });
    }
}
