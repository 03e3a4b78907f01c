//! Remote copies: a send or a receive of a buffer between ranks, enqueued on a
//! stream like any copy (an async op, `hetero::AsyncOp`).
//!
//! The op starts a non-blocking MPI call (`MPI_Isend` / `MPI_Irecv`) when it
//! reaches the front of its stream, and the device's engines complete it with
//! `MPI_Test` while they look for work: no progress thread. Pinned buffers,
//! and device buffers whose memory is host memory (the host backend), go to
//! MPI as they are; device memory the host cannot reach (emu) is staged
//! through a pinned buffer by a copy on the same stream (D2H before a send,
//! H2D after a receive).
//!
//! A receive checks the size that arrived against its buffer
//! ([`MpiError::SizeMismatch`]); a transfer pending longer than the cluster's
//! timeout fails with [`MpiError::PeerTimeout`] (a receive is cancelled; a send
//! cannot be, so its request is abandoned: MPI may still read the buffer if the
//! peer appears later). Either fault fails the stream with the error's message,
//! and the [`Transfer`] handle gives the typed error.
//!
//! On a device in virtual time each send also carries the time its data
//! arrives by the sender's clock (`ClusterConfig::network`); the receive
//! completes no earlier than that, so a distributed run's virtual time
//! includes its communication.

use crate::cluster::{error_string, Comm, Inner};
use crate::{Cluster, MpiError, Result};
use bytemuck::Pod;
use hetero::{AsyncArg, AsyncContext, DeviceBuffer, PinnedBuffer, Stream};
use mpi::ffi;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

/// The outcome of one remote copy or remote event wait: `None` while pending.
#[derive(Clone)]
pub struct Transfer {
    outcome: Arc<Mutex<Option<Result<()>>>>,
    peer: i32,
    tag: i32,
}

impl Transfer {
    pub(crate) fn new(peer: i32, tag: i32) -> Self {
        Transfer {
            outcome: Arc::new(Mutex::new(None)),
            peer,
            tag,
        }
    }

    /// `None` until the operation completed; then its result, with the typed
    /// error (naming the peer) if it failed.
    pub fn result(&self) -> Option<Result<()>> {
        self.outcome
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The peer rank.
    pub fn peer(&self) -> i32 {
        self.peer
    }

    /// The message tag.
    pub fn tag(&self) -> i32 {
        self.tag
    }

    /// Records that the operation never ran (dropped unfinished), unless it finished.
    pub(crate) fn not_run(&self) {
        let mut o = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        if o.is_none() {
            *o = Some(Err(MpiError::NotRun {
                peer: self.peer,
                tag: self.tag,
            }));
        }
    }

    /// Records the outcome; returns what the stream should see.
    pub(crate) fn finish(&self, r: Result<()>) -> Poll<std::result::Result<(), String>> {
        let seen = r.as_ref().map(|_| ()).map_err(|e| e.to_string());
        *self.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        Poll::Ready(seen)
    }
}

/// A request handle (a pointer in Open MPI).
pub(crate) struct Req(pub(crate) ffi::MPI_Request);

// SAFETY: with MPI_THREAD_MULTIPLE any thread may test a request; only the one
// thread polling the op (the stream's order guarantees one) touches it.
unsafe impl Send for Req {}

/// One non-blocking call's state.
pub(crate) enum Call {
    NotStarted,
    Pending(Req),
    Done(ffi::MPI_Status),
}

impl Call {
    /// Tests a pending call; `Err(code)` if MPI reports an error.
    pub(crate) fn test(&mut self) -> std::result::Result<bool, i32> {
        match self {
            Call::NotStarted => Ok(false),
            Call::Done(_) => Ok(true),
            Call::Pending(req) => {
                let mut flag = 0;
                // SAFETY: all fields of MPI_Status are plain integers.
                let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
                // SAFETY: `req` is an active request this op started; MPI
                // writes `flag` and `status`.
                let rc = unsafe { ffi::MPI_Test(&mut req.0, &mut flag, &mut status) };
                if rc != 0 {
                    return Err(rc);
                }
                if flag != 0 {
                    *self = Call::Done(status);
                    return Ok(true);
                }
                Ok(false)
            }
        }
    }

    /// Cancels a pending receive and completes it (a timed-out receive must not
    /// write its buffer after its op completed).
    pub(crate) fn cancel_recv(&mut self) {
        if let Call::Pending(req) = self {
            // SAFETY: an active receive request of this op.
            unsafe { ffi::MPI_Cancel(&mut req.0) };
            let mut flag = 0;
            let t0 = Instant::now();
            while flag == 0 && t0.elapsed() < Duration::from_secs(1) {
                // SAFETY: as above; a cancelled request completes at its next test.
                let rc = unsafe { ffi::MPI_Test(&mut req.0, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
                if rc != 0 {
                    break;
                }
            }
        }
        *self = Call::NotStarted;
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    Send,
    Recv,
}

/// A remote copy as an async op: buffer 0 of its context, from `offset` for
/// `bytes`.
struct Wire {
    inner: Arc<Inner>,
    dir: Dir,
    peer: i32,
    tag: i32,
    offset: usize,
    bytes: usize,
    data: Call,
    /// Virtual time only: the arrival time, sent or received beside the data.
    stamp: Option<(Box<u64>, Call)>,
    started: Option<Instant>,
    polls: u32,
    transfer: Transfer,
}

/// Tests at most this often for the timeout (reading the clock costs more
/// than `MPI_Test` on an idle request).
const TIMEOUT_EVERY: u32 = 64; // a power of two

pub(crate) fn start_raw(
    dir: Dir,
    ptr: *mut u8,
    bytes: usize,
    peer: i32,
    tag: i32,
    comm: Comm,
) -> std::result::Result<Req, i32> {
    let mut req = std::mem::MaybeUninit::<ffi::MPI_Request>::uninit();
    // SAFETY: `ptr..ptr+bytes` is host memory the op holds (read for a send,
    // written by a receive) until the request completes or is cancelled;
    // `bytes` fits a c_int (checked at enqueue).
    let rc = unsafe {
        match dir {
            Dir::Send => ffi::MPI_Isend(
                ptr as *const _,
                bytes as i32,
                ffi::RSMPI_UINT8_T,
                peer,
                tag,
                comm.0,
                req.as_mut_ptr(),
            ),
            Dir::Recv => ffi::MPI_Irecv(
                ptr as *mut _,
                bytes as i32,
                ffi::RSMPI_UINT8_T,
                peer,
                tag,
                comm.0,
                req.as_mut_ptr(),
            ),
        }
    };
    if rc != 0 {
        return Err(rc);
    }
    // SAFETY: the call succeeded and wrote the request.
    Ok(Req(unsafe { req.assume_init() }))
}

impl Wire {
    fn call_error(&self, call: &'static str, code: i32) -> MpiError {
        if code == ffi::MPI_ERR_TRUNCATE as i32 {
            return MpiError::SizeMismatch {
                peer: self.peer,
                tag: self.tag,
                expected: self.bytes,
                got: None,
            };
        }
        MpiError::Call {
            call,
            peer: self.peer,
            code,
            message: error_string(code),
        }
    }

    fn poll(&mut self, cx: &mut AsyncContext<'_>) -> Poll<std::result::Result<(), String>> {
        if self.started.is_none() {
            let Some(base) = cx.ptr(0) else {
                return self
                    .transfer
                    .finish(Err(MpiError::Init("remote copy without its buffer".into())));
            };
            // SAFETY: offset + bytes lies inside the buffer (checked at enqueue).
            let ptr = unsafe { base.add(self.offset) };
            let call = match self.dir {
                Dir::Send => "MPI_Isend",
                Dir::Recv => "MPI_Irecv",
            };
            match start_raw(
                self.dir,
                ptr,
                self.bytes,
                self.peer,
                self.tag,
                self.inner.data,
            ) {
                Ok(r) => self.data = Call::Pending(r),
                Err(code) => return self.transfer.finish(Err(self.call_error(call, code))),
            }
            // The timeout's clock starts once the call is out: reading the
            // clock first would put it on every message's round trip.
            self.started = Some(Instant::now());
            if let Some((stamp, c)) = &mut self.stamp {
                if self.dir == Dir::Send {
                    let arrive = cx.now_ns() + self.inner.config.wire_ns(self.bytes);
                    **stamp = arrive;
                    cx.complete_at_ns(arrive);
                }
                let p = &mut **stamp as *mut u64 as *mut u8;
                match start_raw(self.dir, p, 8, self.peer, self.tag, self.inner.stamps) {
                    Ok(r) => *c = Call::Pending(r),
                    Err(code) => return self.transfer.finish(Err(self.call_error(call, code))),
                }
            }
        }
        let data = match self.data.test() {
            Ok(done) => done,
            Err(code) => return self.transfer.finish(Err(self.call_error("MPI_Test", code))),
        };
        let stamp = match &mut self.stamp {
            None => true,
            Some((_, c)) => match c.test() {
                Ok(done) => done,
                Err(code) => return self.transfer.finish(Err(self.call_error("MPI_Test", code))),
            },
        };
        if data && stamp {
            return self.done(cx);
        }
        self.polls = self.polls.wrapping_add(1);
        if self.polls & (TIMEOUT_EVERY - 1) == 0 {
            let waited = self.started.map_or(Duration::ZERO, |t| t.elapsed());
            if waited > self.inner.config.timeout {
                if self.dir == Dir::Recv {
                    self.data.cancel_recv();
                    if let Some((_, c)) = &mut self.stamp {
                        c.cancel_recv();
                    }
                }
                return self.transfer.finish(Err(MpiError::PeerTimeout {
                    op: match self.dir {
                        Dir::Send => "send",
                        Dir::Recv => "recv",
                    },
                    peer: self.peer,
                    tag: self.tag,
                    waited,
                }));
            }
        }
        Poll::Pending
    }

    fn done(&mut self, cx: &mut AsyncContext<'_>) -> Poll<std::result::Result<(), String>> {
        if self.dir == Dir::Recv {
            if let Call::Done(status) = &self.data {
                let mut count = 0;
                // SAFETY: `status` is the completed receive's status.
                let rc = unsafe { ffi::MPI_Get_count(status, ffi::RSMPI_UINT8_T, &mut count) };
                if rc == 0 && count as usize != self.bytes {
                    return self.transfer.finish(Err(MpiError::SizeMismatch {
                        peer: self.peer,
                        tag: self.tag,
                        expected: self.bytes,
                        got: Some(count.max(0) as usize),
                    }));
                }
            }
            if let Some((stamp, _)) = &self.stamp {
                cx.complete_at_ns(**stamp);
            }
        }
        self.transfer.finish(Ok(()))
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.transfer.not_run();
    }
}

fn range_check(op: &'static str, len: usize, offset: usize, count: usize) -> Result<()> {
    match offset.checked_add(count) {
        Some(end) if end <= len => Ok(()),
        _ => Err(MpiError::Device(hetero::Error::OutOfBounds {
            op,
            offset,
            end: offset.saturating_add(count),
            len,
        })),
    }
}

impl Cluster {
    fn wire(
        &self,
        stream: &Stream,
        dir: Dir,
        peer: i32,
        tag: i32,
        offset: usize,
        bytes: usize,
    ) -> Result<Wire> {
        self.inner.check_peer(peer, tag)?;
        let op = match dir {
            Dir::Send => "send",
            Dir::Recv => "recv",
        };
        if bytes > i32::MAX as usize {
            return Err(MpiError::TooLarge { op, peer, bytes });
        }
        let virtual_time = stream.device().trace_hash().is_some();
        Ok(Wire {
            inner: self.inner.clone(),
            dir,
            peer,
            tag,
            offset,
            bytes,
            data: Call::NotStarted,
            stamp: virtual_time.then(|| (Box::new(0u64), Call::NotStarted)),
            started: None,
            polls: 0,
            transfer: Transfer::new(peer, tag),
        })
    }

    fn enqueue(
        stream: &Stream,
        name: &'static str,
        arg: AsyncArg<'_>,
        mut w: Wire,
    ) -> Result<Transfer> {
        let t = w.transfer.clone();
        stream.enqueue_async(name, &[arg], move |cx: &mut AsyncContext<'_>| w.poll(cx))?;
        Ok(t)
    }

    /// Sends all of `src` to rank `peer`, matched by its [`Cluster::recv`] (or
    /// `recv_pinned`) with the same `tag`, in stream order.
    pub fn send<T: Pod>(
        &self,
        stream: &Stream,
        src: &DeviceBuffer<T>,
        peer: i32,
        tag: i32,
    ) -> Result<Transfer> {
        self.send_range(stream, src, 0, src.len(), peer, tag)
    }

    /// Sends `count` elements of `src` from `offset`.
    pub fn send_range<T: Pod>(
        &self,
        stream: &Stream,
        src: &DeviceBuffer<T>,
        offset: usize,
        count: usize,
        peer: i32,
        tag: i32,
    ) -> Result<Transfer> {
        range_check("mpi send", src.len(), offset, count)?;
        let size = std::mem::size_of::<T>();
        if src.is_host_visible() {
            let w = self.wire(stream, Dir::Send, peer, tag, offset * size, count * size)?;
            return Self::enqueue(stream, "mpi_send", AsyncArg::read(src), w);
        }
        let w = self.wire(stream, Dir::Send, peer, tag, 0, count * size)?;
        let mut staging = stream.device().alloc_pinned::<T>(count)?;
        stream.copy_d2h_range(src, offset, &mut staging, 0, count)?;
        Self::enqueue(stream, "mpi_send", AsyncArg::read_pinned(&staging), w)
    }

    /// Sends all of pinned `src` (no staging on any backend).
    pub fn send_pinned<T: Pod>(
        &self,
        stream: &Stream,
        src: &PinnedBuffer<T>,
        peer: i32,
        tag: i32,
    ) -> Result<Transfer> {
        let w = self.wire(stream, Dir::Send, peer, tag, 0, src.size_bytes())?;
        Self::enqueue(stream, "mpi_send", AsyncArg::read_pinned(src), w)
    }

    /// Receives into all of `dst` what rank `peer` sends with `tag`; the sizes
    /// must agree ([`MpiError::SizeMismatch`] otherwise).
    pub fn recv<T: Pod>(
        &self,
        stream: &Stream,
        dst: &DeviceBuffer<T>,
        peer: i32,
        tag: i32,
    ) -> Result<Transfer> {
        self.recv_range(stream, dst, 0, dst.len(), peer, tag)
    }

    /// Receives `count` elements into `dst` from `offset`.
    pub fn recv_range<T: Pod>(
        &self,
        stream: &Stream,
        dst: &DeviceBuffer<T>,
        offset: usize,
        count: usize,
        peer: i32,
        tag: i32,
    ) -> Result<Transfer> {
        range_check("mpi recv", dst.len(), offset, count)?;
        let size = std::mem::size_of::<T>();
        if dst.is_host_visible() {
            let w = self.wire(stream, Dir::Recv, peer, tag, offset * size, count * size)?;
            return Self::enqueue(stream, "mpi_recv", AsyncArg::write(dst), w);
        }
        let w = self.wire(stream, Dir::Recv, peer, tag, 0, count * size)?;
        let mut staging = stream.device().alloc_pinned::<T>(count)?;
        let t = Self::enqueue(stream, "mpi_recv", AsyncArg::write_pinned(&mut staging), w)?;
        stream.copy_h2d_range(&staging, 0, dst, offset, count)?;
        Ok(t)
    }

    /// Receives into all of pinned `dst` (no staging on any backend).
    pub fn recv_pinned<T: Pod>(
        &self,
        stream: &Stream,
        dst: &mut PinnedBuffer<T>,
        peer: i32,
        tag: i32,
    ) -> Result<Transfer> {
        let w = self.wire(stream, Dir::Recv, peer, tag, 0, dst.size_bytes())?;
        Self::enqueue(stream, "mpi_recv", AsyncArg::write_pinned(dst), w)
    }
}
