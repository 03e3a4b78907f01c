//! Asynchronous operations: work that runs outside the device's engines (a
//! network transfer, a job of another thread), started when it reaches the
//! front of its stream and then polled by the device until it is done.
//!
//! The device's own engines poll, while they look for work: no thread of its
//! own makes progress. On the host backend an engine that looks for work
//! polls the async op at the head of each stream it considers; while any async
//! op is queued, the searching engine (at most half of them search) keeps
//! polling, yielding its core between polls, instead of parking; an engine
//! that parks wakes after at most `DeviceConfig::async_poll` to look again,
//! and an engine running the blocks
//! of a kernel polls them between blocks (at most every 5 µs), so a transfer
//! progresses even while every engine computes. The polling rate is bounded by
//! those paces. The emulated device polls them in its model's dispatch (on the
//! driving thread, or its real-time driver thread, which then sleeps at most
//! `async_poll`).
//!
//! Invariants:
//! - An async op is polled only when everything before it on its stream has
//!   finished, by one thread at a time (the holder of the stream's hardware
//!   queue on the host, of the model's lock on emu); its first poll starts it.
//!   On the host an op that follows a finished async op is started before
//!   that one is retired (its locks released, its end published on the
//!   timeline), which takes the retirement off a chain of remote copies' round
//!   trips; an op whose buffers conflict with it waits for the retirement, and
//!   a failed op's successor is never started.
//! - Its buffers stay alive, and their access locks held (host backend), from
//!   its first poll until it completes.
//! - Only host-visible memory is handed out (pinned buffers; device buffers of
//!   a device whose memory is host memory): on a device with its own memory,
//!   stage through a pinned buffer with a copy first.

use crate::exec::op::PendingWrite;
use crate::exec::storage::Storage;
use std::cell::UnsafeCell;
use std::sync::Arc;
use std::task::Poll;

/// Work a device starts and then polls until it completes (see the module
/// docs). Implemented for closures `FnMut(&mut AsyncContext) -> Poll<Result<(), String>>`.
///
/// ```
/// use std::task::Poll;
/// let dev = hetero::Device::from_env()?;
/// let s = dev.create_stream()?;
/// let mut polls = 0;
/// s.enqueue_async("count-to-3", &[], move |_: &mut hetero::AsyncContext<'_>| {
///     polls += 1;
///     if polls < 3 { Poll::Pending } else { Poll::Ready(Ok(())) }
/// })?;
/// s.synchronize()?;
/// # Ok::<(), hetero::Error>(())
/// ```
pub trait AsyncOp: Send + 'static {
    /// Called when everything before it on the stream completed (the first
    /// call starts the work), then again until it returns `Ready`. It must not
    /// block: it runs on the device's engines. A wait it makes on its own
    /// stream's work (`synchronize`, an event recorded after it) returns
    /// `Error::WouldDeadlock`, as from a host callback. `Ready(Err(message))`
    /// fails the stream with that message.
    fn poll(&mut self, cx: &mut AsyncContext<'_>) -> Poll<std::result::Result<(), String>>;
}

impl<F> AsyncOp for F
where
    F: FnMut(&mut AsyncContext<'_>) -> Poll<std::result::Result<(), String>> + Send + 'static,
{
    fn poll(&mut self, cx: &mut AsyncContext<'_>) -> Poll<std::result::Result<(), String>> {
        self(cx)
    }
}

/// What an async op sees when it is polled: its buffers' host memory and the
/// device's clock.
pub struct AsyncContext<'a> {
    args: &'a Few<(Arc<Storage>, bool)>,
    /// The device clock, when the backend has one of its own (emu); else the
    /// host clock, read only if asked.
    now_ns: Option<u64>,
    end_ns: &'a mut u64,
}

impl AsyncContext<'_> {
    /// The host address of buffer `i` (in the order enqueued), valid until the
    /// op completes. Writing through it is allowed only for a buffer enqueued
    /// as written. `None` past the last buffer.
    pub fn ptr(&self, i: usize) -> Option<*mut u8> {
        self.args.get(i).map(|(s, _)| s.host_ptr())
    }

    /// The size of buffer `i` in bytes.
    pub fn len(&self, i: usize) -> Option<usize> {
        self.args.get(i).map(|(s, _)| s.bytes())
    }

    /// The number of buffers.
    pub fn buffers(&self) -> usize {
        self.args.len()
    }

    /// The device clock when polled (virtual ns on a device in virtual time).
    pub fn now_ns(&self) -> u64 {
        self.now_ns.unwrap_or_else(crate::exec::clock::now_ns)
    }

    /// Asks that the op complete no earlier than device time `t` ns. A device
    /// in virtual time honours it (a remote copy arriving at the time its
    /// sender's clock says); devices in real time complete when the op is done.
    pub fn complete_at_ns(&mut self, t: u64) {
        *self.end_ns = (*self.end_ns).max(t);
    }
}

/// What a backend learns from polling an async op.
pub(crate) enum AsyncPoll {
    /// Not done.
    Pending,
    /// Done; the result is kept for `take_result`.
    Ready,
}

/// Up to two values inline, the rest on the heap: an async op's buffers and
/// pending writes (a remote copy has one of each) then take no allocation of
/// their own.
pub(crate) struct Few<T> {
    first: [Option<T>; 2],
    more: Vec<T>,
}

impl<T> Few<T> {
    fn collect(items: impl IntoIterator<Item = T>) -> Self {
        let mut few = Few {
            first: [None, None],
            more: Vec::new(),
        };
        for item in items {
            match few.first.iter_mut().find(|slot| slot.is_none()) {
                Some(slot) => *slot = Some(item),
                None => few.more.push(item),
            }
        }
        few
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.first.iter().flatten().chain(self.more.iter())
    }

    fn get(&self, i: usize) -> Option<&T> {
        match self.first.get(i) {
            Some(slot) => slot.as_ref(),
            None => self.more.get(i - self.first.len()),
        }
    }

    fn len(&self) -> usize {
        self.first.iter().flatten().count() + self.more.len()
    }
}

/// The polled part of an async op; the op itself is its last field, unsized
/// in a stream's `AsyncBody`, so the whole body is one allocation.
struct AsyncState<O: ?Sized> {
    polls: u64,
    result: Option<std::result::Result<(), String>>,
    end_ns: u64,
    op: O,
}

/// An async op inside a stream (`Body::Async`): one allocation holding the
/// op, its buffers and its pending writes.
pub(crate) struct AsyncBody<O: ?Sized = dyn AsyncOp> {
    pub(crate) args: Few<(Arc<Storage>, bool)>,
    pub(crate) name: &'static str,
    _pending: Few<PendingWrite>,
    /// Reached only by the thread that holds the op's stream (see the module
    /// invariants): the holder of its hardware queue on the host, of the
    /// model's lock on emu. Those hand-offs (the queue's claiming CAS and
    /// releasing store; the lock) order one holder's accesses before the
    /// next's, so the state needs no lock of its own: a lock here cost three
    /// lock/unlock pairs on every hop of a remote-copy ping-pong.
    state: UnsafeCell<AsyncState<O>>,
}

// SAFETY: `state` is reached only through `poll`, `take_result` and `end_ns`,
// whose callers hold the op's stream: one thread at a time, each holder's
// accesses ordered before the next's by the hand-off. The op itself moves
// between threads with its stream's holder (`AsyncOp: Send`); the other
// fields are read-only.
unsafe impl<O: ?Sized + Send> Sync for AsyncBody<O> {}

impl AsyncBody {
    /// The op `op` named `name` over `args` (storage, written): its pinned
    /// buffers count as written until it completes.
    pub(crate) fn new(
        name: &'static str,
        args: impl Iterator<Item = (Arc<Storage>, bool)>,
        op: impl AsyncOp,
    ) -> Box<AsyncBody> {
        let args = Few::collect(args);
        let pending = Few::collect(
            args.iter()
                .filter(|(s, write)| *write && s.kind == crate::exec::storage::MemoryKind::Pinned)
                .map(|(s, _)| PendingWrite::new(s)),
        );
        Box::new(AsyncBody {
            state: UnsafeCell::new(AsyncState {
                polls: 0,
                result: None,
                end_ns: 0,
                op,
            }),
            args,
            name,
            _pending: pending,
        })
    }

    /// Polls the op once (see `AsyncOp::poll`); a panic in it is its failure.
    /// Before the first poll `start()` must agree (the backend takes the op's
    /// access locks there), else the op stays not started. `now_ns` is the
    /// device clock for a device with its own (`None`: the host clock).
    ///
    /// # Safety
    /// The caller holds the op's stream (its hardware queue on the host, the
    /// model's lock on emu) for the whole call.
    pub(crate) unsafe fn poll(
        &self,
        now_ns: Option<u64>,
        start: impl FnOnce() -> bool,
    ) -> AsyncPoll {
        // SAFETY: the caller holds the stream, so no other reference to the
        // state exists (the user's poll cannot reach this op again: its stream
        // stays held, and a held stream is never polled by anyone else).
        let st = unsafe { &mut *self.state.get() };
        if st.result.is_some() {
            return AsyncPoll::Ready;
        }
        if st.polls == 0 && !start() {
            return AsyncPoll::Pending;
        }
        st.polls += 1;
        let (op, end_ns) = (&mut st.op, &mut st.end_ns);
        let mut cx = AsyncContext {
            args: &self.args,
            now_ns,
            end_ns,
        };
        let name = self.name;
        let mut polled = Poll::Pending;
        let caught = crate::exec::op::catch_user(
            || format!("async op '{name}'"),
            || polled = op.poll(&mut cx),
        );
        let outcome = match (caught, polled) {
            (Err(m), _) => Some(Err(m)),
            (Ok(()), Poll::Ready(r)) => Some(r),
            (Ok(()), Poll::Pending) => None,
        };
        match outcome {
            None => AsyncPoll::Pending,
            Some(r) => {
                st.result = Some(r);
                AsyncPoll::Ready
            }
        }
    }

    /// The result of a completed op (once).
    ///
    /// # Safety
    /// As [`AsyncBody::poll`].
    pub(crate) unsafe fn take_result(&self) -> std::result::Result<(), String> {
        // SAFETY: the caller holds the stream (see `poll`).
        unsafe { (*self.state.get()).result.take() }.unwrap_or(Ok(()))
    }

    /// The device time the op asked to complete no earlier than (0: none).
    ///
    /// # Safety
    /// As [`AsyncBody::poll`].
    pub(crate) unsafe fn end_ns(&self) -> u64 {
        // SAFETY: the caller holds the stream (see `poll`).
        unsafe { (*self.state.get()).end_ns }
    }
}
