//! Operations: what a stream holds, in the form every backend receives. An `Op` owns
//! clones of the storages it touches, which keeps them alive until it completes.

use crate::exec::kernel::{ArgList, KernelInner};
use crate::exec::point::TimelinePoint;
use crate::exec::storage::Storage;
use crate::exec::timeline::Timeline;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Direction of a copy; each has its own copy engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// Host (pinned) to device.
    H2D = 0,
    /// Device to host (pinned).
    D2H = 1,
    /// Device to device (and fills).
    D2D = 2,
}

impl CopyKind {
    /// The profile's kind of a copy in this direction.
    pub(crate) fn trace_kind(self) -> hetero_trace::OpKind {
        use hetero_trace::OpKind as K;
        match self {
            CopyKind::H2D => K::H2D,
            CopyKind::D2H => K::D2H,
            CopyKind::D2D => K::D2D,
        }
    }
}

/// `DeviceConfig`'s figure for a ring slot follows the op's size.
const _: () = assert!(std::mem::size_of::<Op>() + 16 == crate::config::OP_SLOT_BYTES);

pub(crate) struct Op {
    pub(crate) body: Body,
    pub(crate) submit_ns: u64,
}

/// What a kernel op holds of its kernel: a counted reference (an `Arc`), or
/// one lent by the host stream, which keeps the kernel in the op's ring slot
/// until the op has completed (`HostStream::submit_launch`), so that a launch
/// changes no count. One word: the low bit of the (128-byte aligned) pointer
/// says "lent".
pub(crate) struct KernelRef(NonNull<KernelInner>);

// SAFETY: a `KernelRef` is an `Arc<KernelInner>` or a loan of one, and
// `KernelInner` is `Send + Sync` (its closures are).
unsafe impl Send for KernelRef {}
// SAFETY: as above; only `&KernelInner` is reachable through `&KernelRef`.
unsafe impl Sync for KernelRef {}

const LENT: usize = 1;
const _: () = assert!(std::mem::align_of::<KernelInner>() > LENT);

impl KernelRef {
    /// A counted reference.
    pub(crate) fn owned(kernel: Arc<KernelInner>) -> Self {
        // SAFETY: `Arc::into_raw` never returns null.
        KernelRef(unsafe { NonNull::new_unchecked(Arc::into_raw(kernel).cast_mut()) })
    }

    /// A reference that counts nothing.
    ///
    /// # Safety
    /// An `Arc` of the same kernel must stay alive until the op holding this
    /// reference has completed and been dropped.
    pub(crate) unsafe fn lent(kernel: &Arc<KernelInner>) -> Self {
        // `Arc::as_ptr`, not a pointer from `&KernelInner`: `to_arc` steps back
        // to the counts, which only the `Arc`'s own pointer may reach.
        // SAFETY: an `Arc`'s pointer is never null.
        let p = unsafe { NonNull::new_unchecked(Arc::as_ptr(kernel).cast_mut()) };
        KernelRef(p.map_addr(|a| a | LENT))
    }

    fn ptr(&self) -> NonNull<KernelInner> {
        self.0.map_addr(|a| {
            std::num::NonZeroUsize::new(a.get() & !LENT).expect("an aligned pointer is not null")
        })
    }

    pub(crate) fn is_lent(&self) -> bool {
        self.0.addr().get() & LENT != 0
    }

    /// A counted reference to the same kernel (for what outlives the op: a
    /// graph node recorded from it).
    pub(crate) fn to_arc(&self) -> Arc<KernelInner> {
        let p = self.ptr().as_ptr().cast_const();
        // SAFETY: the pointer came from an `Arc` (`owned`), or from one kept
        // alive for as long as this reference lives (`lent`); one more count
        // for the new `Arc`.
        unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        }
    }
}

impl std::ops::Deref for KernelRef {
    type Target = KernelInner;
    #[inline]
    fn deref(&self) -> &KernelInner {
        // SAFETY: owned: this reference holds a count; lent: the lender keeps
        // the kernel alive while the op (and so this reference) lives.
        unsafe { self.ptr().as_ref() }
    }
}

impl Drop for KernelRef {
    #[inline]
    fn drop(&mut self) {
        if !self.is_lent() {
            // SAFETY: an owned reference holds the count `Arc::into_raw` kept.
            drop(unsafe { Arc::from_raw(self.ptr().as_ptr().cast_const()) });
        }
    }
}

// Kernel arguments are kept inline on purpose: a launch must not allocate.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Body {
    Copy {
        kind: CopyKind,
        src: Arc<Storage>,
        src_off: usize,
        dst: Arc<Storage>,
        dst_off: usize,
        bytes: usize,
        /// Set when the destination is pinned: host reads wait for it.
        _pending: Option<PendingWrite>,
        /// A memory wait folded into the copy (where the backend takes it:
        /// `BackendStream::copies_wait`): it starts once this point is
        /// reached, faulted or not, and takes on no fault from it.
        after: Option<TimelinePoint>,
    },
    Fill {
        dst: Arc<Storage>,
        off: usize,
        bytes: usize,
        pattern: [u8; 16],
        pattern_len: u8,
        _pending: Option<PendingWrite>,
    },
    Kernel {
        kernel: KernelRef,
        blocks: u32,
        args: ArgList,
        /// Where the launch stamps its own start and end (a task's launch:
        /// its time and its end event's timestamp without two record ops).
        span: Option<Arc<Span>>,
    },
    /// Taken (`Option::take`) when it runs.
    Host(Option<Box<dyn FnOnce() + Send>>),
    /// Waits until `value` on `timeline`. An event wait (`fault`) takes on the
    /// other stream's fault; a memory wait (before reusing memory that stream's
    /// work used) only needs its end.
    Wait {
        timeline: Arc<Timeline>,
        value: u64,
        fault: bool,
    },
    Record {
        stamp: Arc<AtomicU64>,
    },
    /// A synchronous write from a host slice into memory the host cannot reach,
    /// staged through this bounce buffer (`Stream::write_slice` on a device with
    /// its own memory).
    HostWrite {
        dst: Arc<Storage>,
        off: usize,
        data: Box<[u8]>,
        /// A tiny H2D copy whose payload was read at submit and rides in the
        /// command (no DMA setup on a device behind a link), not a staged write.
        inline: bool,
    },
    /// A synchronous read into a bounce buffer the caller then copies out.
    HostRead {
        src: Arc<Storage>,
        off: usize,
        out: Arc<std::sync::Mutex<Vec<u8>>>,
    },
    /// A launch of an executable graph: all its nodes, one op.
    Graph(crate::exec::graph::launch::GraphLaunch),
    /// Many copies of one direction, one op (`Stream::copy_batch`).
    CopyBatch(Box<crate::exec::transfer::BatchOp>),
    /// A 2-D copy: rows at a pitch, one op (`Stream::copy_2d_*`).
    Copy2D(Box<crate::exec::transfer::Copy2DOp>),
    /// Work outside the device, started and then polled (`async_op.rs`).
    Async(Box<crate::exec::async_op::AsyncBody>),
    /// Event waits on several points, one op: an [`Body::Wait`] with `fault`
    /// on each (a placed graph's step after the steps it follows, where the
    /// backend takes it: `BackendStream::waits_all`).
    WaitAll(WaitAll),
}

/// The most points one [`Body::WaitAll`] names.
pub(crate) const WAIT_ALL: usize = 4;

/// The points of a [`Body::WaitAll`]: two to [`WAIT_ALL`], the set ones first.
pub(crate) struct WaitAll {
    points: [Option<TimelinePoint>; WAIT_ALL],
}

impl WaitAll {
    /// An op over `points` (two to [`WAIT_ALL`] of them).
    pub(crate) fn new(points: &[(&Arc<Timeline>, u64)]) -> Self {
        debug_assert!((2..=WAIT_ALL).contains(&points.len()));
        WaitAll {
            points: std::array::from_fn(|i| {
                points.get(i).map(|&(timeline, value)| TimelinePoint {
                    timeline: timeline.clone(),
                    value,
                })
            }),
        }
    }

    pub(crate) fn points(&self) -> impl Iterator<Item = &TimelinePoint> {
        self.points.iter().map_while(Option::as_ref)
    }

    /// Whether every point is reached (completed or failed).
    pub(crate) fn is_reached(&self) -> bool {
        self.points().all(|p| p.timeline.is_reached(p.value))
    }

    /// Once reached: the op's fault, the first point's that failed.
    pub(crate) fn fault(&self) -> Result<(), String> {
        self.points()
            .find_map(|p| p.timeline.error_for(p.value).map(|e| (p, e)))
            .map_or(Ok(()), |(p, e)| Err(wait_fault(&p.timeline, e)))
    }

    /// The first point not yet reached.
    pub(crate) fn pending(&self) -> Option<&TimelinePoint> {
        self.points().find(|p| !p.timeline.is_reached(p.value))
    }
}

/// What an event wait takes on from the stream it waited on.
pub(crate) fn wait_fault(timeline: &Timeline, fault: impl std::fmt::Display) -> String {
    let (stream, device) = (timeline.stream, timeline.device);
    format!("waited on an event of stream {stream} of device {device}, which failed: {fault}")
}

/// The device times a stamped launch writes, on the clock a record op of its
/// device stamps with: its start once it starts, its end before its value
/// completes (a failed launch writes no end). One allocation holds both, and
/// the events that name them share it ([`Stamp`](crate::api::event::Stamp)).
/// A task's launch keeps there too the time the task layer observed for it
/// (written once the launch is done, by whoever looks): no cell of its own.
pub(crate) struct Span {
    start: AtomicU64,
    end: AtomicU64,
    /// `f64` bits, NaN until observed.
    observed: AtomicU64,
}

impl Default for Span {
    fn default() -> Self {
        Span {
            start: AtomicU64::new(0),
            end: AtomicU64::new(0),
            observed: AtomicU64::new(f64::NAN.to_bits()),
        }
    }
}

impl Span {
    /// As new, for another launch (its only holder reuses it: no allocation
    /// per launch).
    pub(crate) fn reset(&mut self) {
        *self = Span::default();
    }

    /// The cell for the time observed for this launch (`f64` bits).
    pub(crate) fn observed(&self) -> &AtomicU64 {
        &self.observed
    }

    pub(crate) fn stamp_start(&self, at: u64) {
        self.start.store(at, std::sync::atomic::Ordering::Release);
    }

    pub(crate) fn stamp_end(&self, at: u64) {
        self.end.store(at, std::sync::atomic::Ordering::Release);
    }

    pub(crate) fn stamp(&self, start: u64, end: u64) {
        self.stamp_start(start);
        self.stamp_end(end);
    }

    pub(crate) fn start_ns(&self) -> u64 {
        self.start.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn end_ns(&self) -> u64 {
        self.end.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Op {
    /// On a stream that failed (every op from its fault on fails without
    /// running), whether this op may now complete: a wait only once what it
    /// waits for is reached, everything else at once. So the stream's
    /// points keep their order: work that follows one of them with a memory
    /// wait (a task that only follows a failed task) still comes after what
    /// that op was ordered after, as it would had the stream not failed. (A
    /// copy's folded wait counts as a wait.)
    pub(crate) fn failed_wait_done(&self) -> bool {
        match &self.body {
            Body::Wait {
                timeline, value, ..
            } => timeline.is_reached(*value),
            Body::WaitAll(w) => w.is_reached(),
            _ => self.after_reached(),
        }
    }

    /// Whether what the op waits for before it starts (a copy's folded
    /// memory wait, `Body::Copy::after`) is reached.
    #[inline]
    pub(crate) fn after_reached(&self) -> bool {
        match &self.body {
            Body::Copy { after: Some(p), .. } => p.timeline.is_reached(p.value),
            _ => true,
        }
    }

    /// The stamps of a launch that writes its own start and end.
    #[inline(always)]
    pub(crate) fn span(&self) -> Option<&Span> {
        match &self.body {
            Body::Kernel { span, .. } => span.as_deref(),
            _ => None,
        }
    }

    /// The profile's kind of this op, and the event it waits on (a wait's
    /// stream and value, or a copy's folded wait's): the one op → trace
    /// mapping every backend records.
    pub(crate) fn trace_kind(&self) -> (hetero_trace::OpKind, Option<(u64, u64)>) {
        use hetero_trace::OpKind as K;
        let kind = match &self.body {
            // (A folded wait's point is the copy's dependency.)
            Body::Copy { kind, after, .. } => {
                let dep = after.as_ref().map(|p| (p.timeline.stream, p.value));
                return (kind.trace_kind(), dep);
            }
            Body::HostWrite { .. } => K::H2D,
            Body::HostRead { .. } => K::D2H,
            Body::CopyBatch(b) => b.kind.trace_kind(),
            Body::Copy2D(c) => c.kind.trace_kind(),
            Body::Fill { .. } => K::Fill,
            Body::Kernel { .. } => K::Kernel,
            Body::Graph(_) => K::Graph,
            Body::Host(_) | Body::Async(_) => K::HostFn,
            Body::Record { .. } => K::Record,
            Body::Wait {
                timeline, value, ..
            } => return (K::Wait, Some((timeline.stream, *value))),
            // (A trace's op names one event: the first point's.)
            Body::WaitAll(w) => {
                return (
                    K::Wait,
                    w.points().next().map(|p| (p.timeline.stream, p.value)),
                )
            }
        };
        (kind, None)
    }

    #[inline(always)]
    pub(crate) fn new(body: Body) -> Self {
        Op {
            body,
            submit_ns: if crate::exec::clock::profiling() {
                crate::exec::clock::now_ns()
            } else {
                0
            },
        }
    }

    /// Whether the op is a kernel launch without buffers (the common empty
    /// launch then takes and releases no access locks in a few instructions).
    #[inline(always)]
    fn touches_nothing(&self) -> bool {
        matches!(&self.body, Body::Kernel { args, .. } if args.is_empty())
    }

    /// The engine (unit + 1) that last wrote the largest storage this op
    /// reads, if that storage holds at least `min_bytes`; 0 when none is known.
    pub(crate) fn writer(&self, min_bytes: usize) -> u32 {
        let (mut best, mut writer) = (min_bytes.saturating_sub(1), 0);
        self.for_each_access(|s, write| {
            if !write && s.bytes() > best {
                best = s.bytes();
                writer = s.writer();
            }
            true
        });
        writer
    }

    /// The storages this op touches, with whether it writes them.
    pub(crate) fn for_each_access(&self, mut f: impl FnMut(&Storage, bool) -> bool) -> bool {
        match &self.body {
            Body::Copy { src, dst, .. } => f(src, false) && f(dst, true),
            Body::Fill { dst, .. } => f(dst, true),
            Body::Kernel { args, .. } => args.as_slice_iter().all(|a| f(&a.storage, a.write)),
            Body::HostWrite { dst, .. } => f(dst, true),
            Body::HostRead { src, .. } => f(src, false),
            Body::Graph(l) => l.for_each_access(&mut f),
            Body::CopyBatch(b) => b.storages.iter().all(|(s, w)| f(s, *w)),
            Body::Copy2D(c) => f(&c.src, false) && f(&c.dst, true),
            Body::Async(a) => a.args.iter().all(|(s, w)| f(s, *w)),
            Body::Host(_) | Body::Wait { .. } | Body::WaitAll(_) | Body::Record { .. } => true,
        }
    }

    /// Takes every access lock the op needs, or none.
    pub(crate) fn try_acquire_access(&self) -> bool {
        if self.touches_nothing() {
            return true;
        }
        let mut taken = 0usize;
        let ok = self.for_each_access(|s, w| {
            if s.try_acquire(w) {
                taken += 1;
                true
            } else {
                false
            }
        });
        if !ok {
            let mut n = 0usize;
            self.for_each_access(|s, w| {
                if n < taken {
                    s.release(w);
                    n += 1;
                    true
                } else {
                    false
                }
            });
        }
        ok
    }

    /// Lets the op's buffers go; the engine `unit` ran it, so it is the last
    /// writer of what it wrote (`Op::writer`).
    pub(crate) fn release_access(&self, unit: u32) {
        if self.touches_nothing() {
            return;
        }
        self.for_each_access(|s, w| {
            if w {
                s.set_writer(unit);
            }
            s.release(w);
            true
        });
    }

    pub(crate) fn name(&self) -> &'static str {
        match &self.body {
            Body::Copy { kind, .. } => match kind {
                CopyKind::H2D => "copy_h2d",
                CopyKind::D2H => "copy_d2h",
                CopyKind::D2D => "copy_d2d",
            },
            Body::Fill { .. } => "fill",
            Body::Kernel { kernel, .. } => kernel.name,
            Body::Host(_) => "host_fn",
            Body::Wait { fault: true, .. } => "wait_event",
            Body::Wait { fault: false, .. } => "wait_memory",
            Body::WaitAll(_) => "wait_events",
            Body::Record { .. } => "record_event",
            Body::HostWrite { inline: true, .. } => "copy_h2d_inline",
            Body::HostWrite { .. } => "write_slice",
            Body::HostRead { .. } => "read_slice",
            Body::Graph(_) => "graph",
            Body::CopyBatch(b) => match b.kind {
                CopyKind::H2D => "copy_batch_h2d",
                CopyKind::D2H => "copy_batch_d2h",
                CopyKind::D2D => "copy_batch_d2d",
            },
            Body::Copy2D(c) => match c.kind {
                CopyKind::H2D => "copy_2d_h2d",
                CopyKind::D2H => "copy_2d_d2h",
                CopyKind::D2D => "copy_2d_d2d",
            },
            Body::Async(a) => a.name,
        }
    }

    pub(crate) fn bytes(&self) -> u64 {
        match &self.body {
            Body::Copy { bytes, .. } | Body::Fill { bytes, .. } => *bytes as u64,
            Body::HostWrite { data, .. } => data.len() as u64,
            Body::HostRead { out, .. } => out.lock().map_or(0, |o| o.len() as u64),
            Body::Graph(l) => l.bytes(),
            Body::CopyBatch(b) => b.bytes,
            Body::Copy2D(c) => c.bytes(),
            Body::Async(a) => a.args.iter().map(|(s, _)| s.bytes() as u64).sum(),
            _ => 0,
        }
    }
}

/// A pending write into pinned memory, counted from enqueue until the op is dropped
/// (run or skipped), so host reads of the buffer can tell it is in flight.
pub(crate) struct PendingWrite(Arc<Storage>);

impl PendingWrite {
    pub(crate) fn new(storage: &Arc<Storage>) -> Self {
        storage.add_pending_write();
        PendingWrite(storage.clone())
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        self.0.finish_pending_write();
    }
}

/// Runs user code `f`, catching a panic as a failure message that names the
/// code (`what`). The payload is dropped so that a panic in its own `Drop`
/// cannot unwind into the runtime (that payload is leaked instead).
#[inline]
pub(crate) fn catch_user(what: impl FnOnce() -> String, f: impl FnOnce()) -> Result<(), String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| in_user_code(f)))
        .map_err(|payload| format!("{} panicked: {}", what(), drop_payload(payload)))
}

thread_local! {
    /// How deep this thread is in device user code (a kernel, host
    /// callback, graph host node or async op's poll) that a backend runs.
    static USER_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Runs `f`, device user code, counted in this thread's depth
/// ([`running_user_code`]); the count is restored however `f` ends.
#[inline]
pub(crate) fn in_user_code<R>(f: impl FnOnce() -> R) -> R {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            let _ = USER_DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
        }
    }
    let _ = USER_DEPTH.try_with(|d| d.set(d.get() + 1));
    let _leave = Leave;
    f()
}

/// Whether this thread runs device user code now: a call from it that
/// waits for devices' progress may wait for work behind that code.
pub(crate) fn running_user_code() -> bool {
    USER_DEPTH.try_with(|d| d.get() > 0).unwrap_or(false)
}

/// The message of a caught panic; the payload is dropped without letting a
/// second panic out. A payload whose drop panics leaves that panic's payload,
/// which is dropped the same way, up to `PAYLOAD_DROPS` deep: past that (a
/// payload built to panic on every drop) the last one is leaked, the one
/// thing left to do that neither unwinds out nor loops for ever.
pub(crate) fn drop_payload(payload: Box<dyn std::any::Any + Send>) -> String {
    const PAYLOAD_DROPS: usize = 8;
    let message = panic_message(&*payload);
    let mut next = Some(payload);
    for _ in 0..PAYLOAD_DROPS {
        let Some(p) = next.take() else {
            return message;
        };
        next = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(p))).err();
    }
    std::mem::forget(next);
    message
}

/// The message of a caught panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}
