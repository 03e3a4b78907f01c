//! Which role the calling thread plays for the execution layer: an engine
//! thread (it runs kernels and host callbacks and completes stream work) or
//! any other thread.
//!
//! The pool needs to know because a host thread that would grow the pool may
//! instead wait for queued work to finish and free memory; an engine thread
//! must never do that, since the work it would wait for may be queued behind
//! the very op it is running (a host callback that allocates). The flag lives
//! here, below the execution layer, so the pool can read it; the execution
//! layer sets it once when it starts each engine thread.

use std::cell::Cell;

thread_local! {
    static ENGINE_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as one of a backend's engine threads, for the rest
/// of its life.
pub fn mark_engine_thread() {
    ENGINE_THREAD.with(|c| c.set(true));
}

/// Sets or clears the calling thread's engine role; returns the previous one.
/// For a thread that acts as an engine for a while (it runs a device's work
/// inside a host wait, as an emulated device in virtual time does).
pub fn set_engine_thread(on: bool) -> bool {
    ENGINE_THREAD.with(|c| c.replace(on))
}

/// Whether the calling thread was marked as an engine thread. False during
/// thread teardown (the flag is gone by then; nothing waits at that point).
#[inline]
pub fn on_engine_thread() -> bool {
    ENGINE_THREAD.try_with(Cell::get).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marking_is_per_thread() {
        let marked = std::thread::spawn(|| {
            mark_engine_thread();
            on_engine_thread()
        })
        .join()
        .expect("thread");
        assert!(marked);
        assert!(!on_engine_thread(), "another thread's mark leaked here");
    }
}
