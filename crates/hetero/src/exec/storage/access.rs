//! A storage's access lock (many readers or one writer, taken by ops at
//! dispatch without blocking, and by the host through `with_host_access`), its
//! count of pending writers (what a host read of pinned memory checks), and the
//! holds graphs keep on it.
use super::{MemoryKind, Storage};
use crate::exec::loom::Ordering;
use std::sync::Arc;

const WRITER: u32 = 1 << 31;

impl Storage {
    /// Takes the access lock without blocking: shared for readers, exclusive for a
    /// writer. Returns whether it was taken.
    #[inline]
    pub(crate) fn try_acquire(&self, write: bool) -> bool {
        if write {
            self.access
                .compare_exchange(0, WRITER, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        } else {
            let mut cur = self.access.load(Ordering::Relaxed);
            loop {
                if cur & WRITER != 0 {
                    return false;
                }
                match self.access.compare_exchange_weak(
                    cur,
                    cur + 1,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return true,
                    Err(now) => cur = now,
                }
            }
        }
    }

    /// The host engine that last wrote the memory (unit + 1; 0: unknown).
    pub(crate) fn writer(&self) -> u32 {
        self.writer.load(Ordering::Relaxed)
    }

    /// Notes that host engine `unit` wrote the memory. Only a store when it
    /// changes: a line other engines read.
    pub(crate) fn set_writer(&self, unit: u32) {
        if self.writer.load(Ordering::Relaxed) != unit + 1 {
            self.writer.store(unit + 1, Ordering::Relaxed);
        }
    }

    /// Gives the access lock back. Engines release this way after an op: the
    /// releasing engine looks for work itself right after, so nobody needs a
    /// wake. A thread that is not an engine uses [`Storage::with_host_access`].
    #[inline]
    pub(crate) fn release(&self, write: bool) {
        if write {
            self.access.store(0, Ordering::Release);
        } else {
            self.access.fetch_sub(1, Ordering::Release);
        }
    }

    /// Runs `f` with the access lock held by this (host, non-engine) thread,
    /// then gives the lock back and calls `wake` (the device's `kick`).
    ///
    /// Protocol (no lost wake-up between the host and an engine): an engine
    /// takes access locks only with [`Storage::try_acquire`], in its look for
    /// work; a look that finds a lock taken leaves the op queued, and the
    /// engine sleeps only through `Parker::park_for*`, which counts it as a
    /// sleeper and fences (SeqCst) before its last look. The host takes the
    /// lock by spinning (its holder is an op, which completes without the
    /// host), releases it, then `wake` fences and looks at the sleepers.
    /// Either the engine's last look sees the lock free, or the host sees the
    /// engine asleep and wakes it. Without the wake, a kernel that found its
    /// buffer taken by the host slept until some unrelated submission.
    /// Checked by `loom_host_access` below, on this code.
    pub(crate) fn with_host_access<R>(
        &self,
        write: bool,
        wake: impl FnOnce(),
        f: impl FnOnce() -> R,
    ) -> R {
        self.acquire_blocking(write);
        let r = f();
        self.release(write);
        wake();
        r
    }

    /// Blocks (spinning, then yielding) until the access lock is taken.
    fn acquire_blocking(&self, write: bool) {
        let backoff = crossbeam_utils::Backoff::new();
        while !self.try_acquire(write) {
            // Under loom a yield of the model, so the holder can run.
            crate::exec::loom::model_yield();
            backoff.snooze();
        }
    }

    pub(crate) fn add_pending_write(&self) {
        self.pending_writes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn finish_pending_write(&self) {
        self.pending_writes.fetch_sub(1, Ordering::Release);
    }

    pub(crate) fn has_pending_writes(&self) -> bool {
        self.pending_writes.load(Ordering::Acquire) != 0
    }
}

/// A graph's hold on a buffer it names (a node's operand, a plan's fixed
/// buffer, a bound slot): counted in the storage while it exists, so a host
/// access the hold refuses can say so, and marking device memory as shared —
/// when the handle drops, the memory must not go back to its stream's cache at
/// once, as if only queued work still used it: a launch may come any time
/// later. It returns when the last holder lets go.
pub(crate) struct GraphHold(Arc<Storage>);

impl GraphHold {
    /// Made while the handle is borrowed for the recording or the binding (the
    /// `shared` flags are written under the same rule as by `use_on`).
    pub(crate) fn new(storage: &Arc<Storage>) -> Self {
        if storage.home != 0 {
            storage.shared.store(true, Ordering::Relaxed);
            storage.used_on_more.store(true, Ordering::Relaxed);
        }
        Self::count(storage, 1);
        GraphHold(storage.clone())
    }

    /// Counts holds of pinned memory only: a host write to a pinned buffer is
    /// the one access a hold refuses (device memory is reached through ops,
    /// which a hold does not stop), so other memory pays no atomic.
    #[inline]
    fn count(storage: &Storage, delta: i32) {
        if storage.kind == MemoryKind::Pinned {
            match delta {
                1 => storage.graph_holds.fetch_add(1, Ordering::Relaxed),
                _ => storage.graph_holds.fetch_sub(1, Ordering::Relaxed),
            };
        }
    }
}

impl Clone for GraphHold {
    fn clone(&self) -> Self {
        Self::count(&self.0, 1);
        GraphHold(self.0.clone())
    }
}

impl Drop for GraphHold {
    fn drop(&mut self) {
        Self::count(&self.0, -1);
    }
}

impl std::ops::Deref for GraphHold {
    type Target = Arc<Storage>;
    fn deref(&self) -> &Arc<Storage> {
        &self.0
    }
}

/// Loom model of the hand-off in [`Storage::with_host_access`]: the host holds a
/// buffer's write lock while an engine looks for the op that needs it, finds
/// it taken and parks on the real `Parker`; the host's release must wake it.
/// A lost wake-up shows as a loom deadlock.
#[cfg(all(test, loom))]
mod loom_host_access {
    use crate::exec::loom::{Arc, AtomicU32, Ordering};
    use crate::exec::park::Parker;
    use crate::exec::storage::{MemoryKind, Storage};

    fn model(host_writes: bool, op_writes: bool) {
        loom::model(move || {
            let storage = Arc::new(Storage::empty(1, MemoryKind::Device));
            let idle = Arc::new(Parker::new());
            let ran = Arc::new(AtomicU32::new(0));
            let (s2, p2, r2) = (storage.clone(), idle.clone(), ran.clone());
            // The engine: looks for the op (its look takes the lock or not),
            // parks while it cannot, runs it, releases as engines do.
            let engine = loom::thread::spawn(move || {
                p2.park_for(|| s2.try_acquire(op_writes).then_some(()));
                r2.fetch_add(1, Ordering::Relaxed);
                s2.release(op_writes);
            });
            storage.with_host_access(host_writes, || idle.wake(u32::MAX), || ());
            engine.join().expect("engine");
            assert_eq!(ran.load(Ordering::Relaxed), 1);
        });
    }

    #[test]
    fn loom_host_write_then_kernel_write_is_not_lost() {
        model(true, true);
    }

    #[test]
    fn loom_host_write_then_kernel_read_is_not_lost() {
        model(true, false);
    }

    #[test]
    fn loom_host_read_then_kernel_write_is_not_lost() {
        model(false, true);
    }
}
