//! User code on engine threads: kernel blocks and host callbacks, and what they
//! may do there.
//!
//! Anything a user can call from inside a kernel or callback either works or
//! returns a typed error; it never deadlocks. The rule, per blocking call made on
//! an engine thread while it runs the op at `(S, c)` (stream S, timeline value c):
//! - waiting for a point `(S, v)` with `v >= c` (its own stream at or after the
//!   running op: `Stream::synchronize`, `read_slice`, `Device::synchronize`, an
//!   event recorded later on S) is `Error::WouldDeadlock`, at once;
//! - so is waiting for a stream that shares S's hardware queue (the running op
//!   holds the queue, so nothing else on it can start), a full ring of S (only S's
//!   engine could drain it), and any wait whose chain of dependencies (streams
//!   blocked in a callback, heads waiting on events) leads back to the running op;
//! - any other wait works: while it waits, the engine runs other queues' ready
//!   work itself, so a wait on another stream completes even on a device with one
//!   compute unit.
//!
//! Invariants: a `Frame` lives on the stack of the engine thread that runs the
//! user code, linked from the thread-local `TOP` only while that code runs; only
//! that thread reads it. `HostStream::blocked_on`/`blocked_at` are written by the
//! thread running the stream's current op, and read by other engines as hints for
//! the cycle check.

use super::dispatch::LOOKING;
use super::engine::EngineThread;
use super::stream::{pack_hint, unpack_hint, HostStream};
use super::Shared;
use crate::exec::op;
use crate::exec::op::Op;
use crate::exec::timeline::Timeline;
use crate::{Error, Result};
#[allow(unused_imports)]
use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// An op running user code on this thread.
struct Frame {
    stream: *const HostStream,
    value: u64,
    op: *const Op,
    prev: *const Frame,
}

thread_local! {
    /// The innermost op running user code on this thread (null: none).
    static TOP: Cell<*const Frame> = const { Cell::new(std::ptr::null()) };
    /// The engine this thread is: its device's state and its index.
    static ENGINE: RefCell<Option<(Arc<Shared>, u32)>> = const { RefCell::new(None) };
}

/// Makes the calling thread engine `index` of `sh`: its host waits go through
/// [`engine_wait`].
pub(super) fn become_engine(sh: &Arc<Shared>, index: u32) {
    crate::exec::thread::mark_engine_thread();
    ENGINE.with(|e| *e.borrow_mut() = Some((sh.clone(), index)));
    crate::exec::timeline::set_engine_wait(engine_wait);
}

/// Forgets the engine state (the thread is about to exit).
pub(super) fn leave_engine() {
    let _ = ENGINE.try_with(|e| e.borrow_mut().take());
}

/// Runs user code `f` for the op at `value` of `stream`, catching a panic as the
/// op's failure message (`what` names the code in it).
pub(super) fn run_user(
    stream: &HostStream,
    value: u64,
    op: &Op,
    what: impl FnOnce() -> String,
    f: impl FnOnce(),
) -> Result<(), String> {
    in_frame(stream, value, op, || op::catch_user(what, f))
}

/// Runs `f`, which runs user code of the op at `value` of `stream` (catching
/// its panics itself), with the op's frame linked: the deadlock checks of
/// blocking calls made in that code see it.
pub(super) fn in_frame<R>(stream: &HostStream, value: u64, op: &Op, f: impl FnOnce() -> R) -> R {
    struct Unlink(*const Frame);
    impl Drop for Unlink {
        fn drop(&mut self) {
            TOP.with(|t| t.set(self.0));
        }
    }
    let frame = Frame {
        stream,
        value,
        op,
        prev: TOP.with(|t| t.get()),
    };
    TOP.with(|t| t.set(&frame));
    let _unlink = Unlink(frame.prev);
    op::in_user_code(f)
}

/// Calls `f` on every frame of this thread, innermost first, until it returns
/// `Some`.
fn find_frame<R>(mut f: impl FnMut(&HostStream, u64, &Op) -> Option<R>) -> Option<R> {
    let mut p = TOP.with(|t| t.get());
    while !p.is_null() {
        // SAFETY: frames are linked only while the user code of their op runs on
        // this thread, below this call on the same stack (`run_user`), so each one
        // and the stream and op it points to are alive.
        let frame = unsafe { &*p };
        // SAFETY: as above.
        let (stream, op) = unsafe { (&*frame.stream, &*frame.op) };
        if let Some(r) = f(stream, frame.value, op) {
            return Some(r);
        }
        p = frame.prev;
    }
    None
}

/// Whether an op running user code on this thread holds `storage` (a kernel's
/// buffer argument): waiting for its access lock here would never end.
pub(crate) fn storage_held_here(storage: &crate::exec::storage::Storage) -> bool {
    find_frame(|_, _, op| {
        let mut held = false;
        op.for_each_access(|s, _| {
            held |= std::ptr::eq(s, storage);
            true
        });
        held.then_some(())
    })
    .is_some()
}

/// Why waiting for `(timeline, value)` here could never end, judged from this
/// thread's own frames.
fn waits_for_itself(sh: &Shared, timeline: &Timeline, value: u64, what: &str) -> Option<Error> {
    let target_queue = (timeline.device == sh.device)
        .then(|| stream_by_id(sh, timeline.stream).map(|s| s.queue))
        .flatten();
    find_frame(|stream, running, _| {
        if std::ptr::eq(&*stream.timeline, timeline) && value >= running {
            return Some(Error::WouldDeadlock(format!(
                "{what} waits for operation {value} of stream {}, but this thread is running its \
                 operation {running} (a kernel or host callback); the wait could only end after \
                 the callback returns: wait outside the callback, or on an event recorded before it",
                stream.id
            )));
        }
        if target_queue == Some(stream.queue) && timeline.stream != stream.id {
            return Some(Error::WouldDeadlock(format!(
                "{what} waits for stream {}, which shares hardware queue {} with stream {}, whose \
                 operation {running} runs this callback and holds the queue; configure more \
                 hardware queues (DeviceConfig::hardware_queues) or wait outside the callback",
                timeline.stream, stream.queue, stream.id
            )));
        }
        None
    })
}

fn stream_by_id(sh: &Shared, id: u64) -> Option<Arc<HostStream>> {
    sh.streams.find_map(|s| (s.id == id).then(|| s.clone()))
}

/// Follows what `(stream, value)` waits for (a stream's op blocked in a callback,
/// or its head waiting on an event) for a few steps; whether the chain reaches an
/// op running user code on this thread, which cannot end before this wait does.
fn leads_back(sh: &Shared, mut stream: u64, mut value: u64) -> bool {
    for _ in 0..64 {
        let mine = find_frame(|s, running, _| (s.id == stream && value >= running).then_some(()));
        if mine.is_some() {
            return true;
        }
        let Some(s) = stream_by_id(sh, stream) else {
            return false;
        };
        if s.timeline.is_reached(value) {
            return false;
        }
        // The op blocked in a callback on `s`, if it is still the one running.
        let at = s.blocked_at.load(Ordering::Acquire);
        let next = match s.blocked_on.load(Ordering::Acquire) {
            hint if hint != 0 && !s.timeline.is_reached(at) => hint,
            _ => s.wait_hint.load(Ordering::Acquire),
        };
        if next == 0 {
            return false;
        }
        (stream, value) = unpack_hint(next);
    }
    false
}

/// The host wait of an engine thread (installed by `become_engine`): refuses a
/// wait that could never end, and runs other ready work while it waits.
fn engine_wait(
    timeline: &Timeline,
    value: u64,
    what: &'static str,
    ready: &mut dyn FnMut() -> bool,
) -> Result<()> {
    let Some((sh, index)) = ENGINE.with(|e| e.borrow().clone()) else {
        // Not an engine after all (its state is gone at thread exit): poll.
        while !ready() {
            std::thread::yield_now();
        }
        return Ok(());
    };
    if let Some(e) = waits_for_itself(&sh, timeline, value, what) {
        return Err(e);
    }
    // Tell other engines' cycle checks what the op running here waits for.
    let top = TOP.with(|t| t.get());
    // SAFETY: see `find_frame`; the innermost frame is alive below this call.
    let blocked = (!top.is_null()).then(|| unsafe { (&*(*top).stream, (*top).value) });
    // Hints name streams of this device only (a wait on another device of a
    // context is no step in a cycle of this device's engines).
    let hint = pack_hint(timeline.stream, value).filter(|_| timeline.device == sh.device);
    if let (Some((s, at)), Some(h)) = (blocked, hint) {
        s.blocked_at.store(at, Ordering::Relaxed);
        s.blocked_on.store(h, Ordering::Release);
    }
    let mut helper = EngineThread::new(index);
    let result = loop {
        if ready() {
            break Ok(());
        }
        let found = helper.claim(&sh);
        end_looking(&sh);
        if let Some(work) = found {
            helper.execute(&sh, work);
            end_looking(&sh);
            continue;
        }
        if timeline.device == sh.device && leads_back(&sh, timeline.stream, value) {
            break Err(Error::WouldDeadlock(format!(
                "{what} waits for operation {value} of stream {}, which (through the work it \
                 waits for) needs the kernel or host callback running on this thread to return \
                 first; wait outside the callback",
                timeline.stream
            )));
        }
        timeline.park_briefly(&mut *ready, Duration::from_micros(50));
    };
    if let Some((s, _)) = blocked {
        s.blocked_on.store(0, Ordering::Release);
    }
    result
}

/// Ends the "looking" state `Shared::finish` leaves on this thread (the engine
/// loop does the same after each look).
fn end_looking(sh: &Shared) {
    if LOOKING.with(|l| l.replace(false)) {
        sh.idle.end_search();
    }
}
