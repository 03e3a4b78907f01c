//! The workspace's loom facade ([`hetero_sync`]) under this crate's name:
//! everything the chunked log shares between its writer and its reader comes
//! from here, so `cfg(loom)` swaps in loom's model-checked versions.

pub(crate) use hetero_sync::{
    Arc, AtomicBool, AtomicPtr, AtomicUsize, Mutex, MutexGuard, Ordering, UnsafeCell,
};

/// Locks a mutex, recovering the data if a panicking thread poisoned it: the
/// data guarded here is only ever updated in ways a panic cannot tear.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
