//! The calling thread's role: an engine (it runs device work: an engine
//! thread, or a host thread driving an emulated device in virtual time) or
//! any other. The flag is `hetero_memory`'s, so that the pool never blocks an
//! engine on a fence.

pub(crate) use hetero_memory::thread_role::{mark_engine_thread, on_engine_thread};

/// Runs `f` now, or, on an engine thread, on a new thread of its own: `f` waits
/// for work (a drop that synchronizes), and that work may include the op this
/// engine is running. `what` names it if no thread can be started.
pub(crate) fn off_engine(what: &'static str, f: impl FnOnce() + Send + 'static) {
    if !on_engine_thread() {
        return f();
    }
    let spawned = std::thread::Builder::new()
        .name("hetero-release".into())
        .spawn(f);
    if let Err(e) = spawned {
        // The closure (and what it owns) is gone with the failed spawn's error:
        // its resources are released without waiting, which is all that can be
        // done here short of deadlocking.
        tracing::error!("hetero: could not start a thread to {what} off the engine: {e}");
    }
}
