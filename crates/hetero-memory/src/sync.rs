//! [`TryLock`] guards a per-stream block cache. It never blocks: a thread that
//! finds it held takes the pool's slow path instead, so the hot path costs one
//! compare-exchange and one release store.
//!
//! Its atomics and cell come from the workspace's loom facade ([`hetero_sync`]),
//! so under `cfg(loom)` the model checker explores every interleaving of it.

use hetero_sync::{AtomicBool, Ordering, UnsafeCell};

/// A lock that is only ever tried, never waited for.
#[derive(Debug)]
pub(crate) struct TryLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through `try_with`, which holds the lock,
// so at most one thread touches it at a time; moving the lock moves the value.
unsafe impl<T: Send> Sync for TryLock<T> {}
// SAFETY: as above; the lock owns its value.
unsafe impl<T: Send> Send for TryLock<T> {}

impl<T> TryLock<T> {
    pub(crate) fn new(value: T) -> Self {
        TryLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Runs `f` on the value if the lock is free; `None` when another thread holds it.
    #[inline(always)]
    pub(crate) fn try_with<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        if self
            .locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        struct Unlock<'a>(&'a AtomicBool);
        impl Drop for Unlock<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _unlock = Unlock(&self.locked);
        // SAFETY: the successful compare-exchange above gives this thread the lock
        // until `_unlock` drops, so no other reference to the value exists.
        Some(self.value.with_mut(|p| f(unsafe { &mut *p })))
    }

    /// Like `try_with`, but spins until the lock is free; for cold paths only
    /// (stats, trim, flushing caches under memory pressure).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let backoff = crossbeam_utils::Backoff::new();
        let mut f = Some(f);
        loop {
            if let Some(r) = self.try_with(|v| (f.take().expect("called once"))(v)) {
                return r;
            }
            backoff.snooze();
            hetero_sync::model_yield();
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// Two threads racing for the cache lock never both reach the value, and
    /// every update made under the lock is seen by the next holder.
    #[test]
    fn try_lock_excludes_and_publishes() {
        loom::model(|| {
            let lock = Arc::new(TryLock::new(0u32));
            let l2 = lock.clone();
            let t = loom::thread::spawn(move || l2.try_with(|v| *v += 1).is_some());
            let mine = lock.try_with(|v| *v += 1).is_some();
            let theirs = t.join().expect("thread");
            let total = lock.try_with(|v| *v).expect("uncontended");
            assert_eq!(total, u32::from(mine) + u32::from(theirs));
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn held_lock_is_not_reentered() {
        let l = TryLock::new(1);
        let inner = l.try_with(|_| l.try_with(|v| *v));
        assert_eq!(inner, Some(None));
        assert_eq!(l.with(|v| *v), 1);
    }
}
