//! The workspace's loom facade ([`hetero_sync`]) under this crate's name: code
//! that loom checks (the op ring, the timeline) imports atomics and cells from
//! here, never from std, so `cfg(loom)` swaps in loom's model-checked versions.

// `Arc` only for the loom tests.
#[allow(unused_imports)]
pub(crate) use hetero_sync::{
    fence, model_yield, spin_hint, yield_now, Arc, AtomicBool, AtomicU32, AtomicU64, AtomicU8,
    AtomicUsize, Mutex, MutexGuard, Ordering, UnsafeCell,
};
