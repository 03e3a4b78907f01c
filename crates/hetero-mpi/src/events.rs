//! Events across ranks: a stream on rank B waits for an event recorded on
//! rank A.
//!
//! A calls [`Cluster::send_event`]: an async op on the cluster's signal
//! stream polls the event and, once it completed (or failed), sends a small
//! message (status, the device time, the fault's text) on the events
//! communicator. B calls [`Cluster::wait_event`]: an async op on B's stream
//! receives that message; B's later work runs after it, and fails with
//! [`MpiError::RemoteEventFailed`] if A's work failed. Signals of one rank are
//! sent in the order they were asked for.

use crate::transfer::{Call, Dir, Transfer};
use crate::{Cluster, MpiError, Result};
use hetero::{AsyncContext, Event, Stream};
use std::task::Poll;
use std::time::{Duration, Instant};

/// The signal: status (8 bytes: 0 done, 1 failed), device time (8), fault
/// text (length, then bytes).
const SIGNAL: usize = 256;

struct Signal {
    msg: Box<[u8; SIGNAL]>,
    call: Call,
    started: Option<Instant>,
    polls: u32,
}

impl Signal {
    fn new() -> Self {
        Signal {
            msg: Box::new([0u8; SIGNAL]),
            call: Call::NotStarted,
            started: None,
            polls: 0,
        }
    }

    fn timed_out(&mut self, timeout: Duration) -> Option<Duration> {
        self.polls = self.polls.wrapping_add(1);
        if self.polls & 63 != 0 {
            return None;
        }
        let waited = self.started.map_or(Duration::ZERO, |t| t.elapsed());
        (waited > timeout).then_some(waited)
    }
}

/// Records [`MpiError::NotRun`] if the op is dropped unfinished (its stream
/// failed before it).
struct Finish(Transfer);

impl Drop for Finish {
    fn drop(&mut self) {
        self.0.not_run();
    }
}

fn call_error(call: &'static str, peer: i32, code: i32) -> MpiError {
    MpiError::Call {
        call,
        peer,
        code,
        message: crate::cluster::error_string(code),
    }
}

fn start_signal(
    s: &mut Signal,
    dir: Dir,
    peer: i32,
    tag: i32,
    comm: crate::cluster::Comm,
) -> std::result::Result<(), MpiError> {
    let ptr = s.msg.as_mut_ptr();
    match crate::transfer::start_raw(dir, ptr, SIGNAL, peer, tag, comm) {
        Ok(r) => {
            s.call = Call::Pending(r);
            Ok(())
        }
        Err(code) => Err(call_error(
            if dir == Dir::Send {
                "MPI_Isend"
            } else {
                "MPI_Irecv"
            },
            peer,
            code,
        )),
    }
}

impl Cluster {
    /// Tells rank `peer` when `event` completes: its [`Cluster::wait_event`]
    /// with the same `tag` then lets its stream go on. If the work before the
    /// event fails, the peer's stream fails with that fault.
    pub fn send_event(&self, event: &Event, peer: i32, tag: i32) -> Result<Transfer> {
        self.inner.check_peer(peer, tag)?;
        if !event.is_recorded() {
            return Err(MpiError::Device(hetero::Error::EventNotRecorded {
                op: "Cluster::send_event",
            }));
        }
        let (inner, event) = (self.inner.clone(), event.clone());
        let transfer = Transfer::new(peer, tag);
        let t = Finish(transfer.clone());
        let mut s = Signal::new();
        self.signal
            .enqueue_async("mpi_send_event", &[], move |cx: &mut AsyncContext<'_>| {
                if s.started.is_none() {
                    let fault = match event.query() {
                        Ok(false) => return Poll::Pending,
                        Ok(true) => None,
                        Err(e) => Some(e.to_string()),
                    };
                    s.msg[0..8].copy_from_slice(&u64::from(fault.is_some()).to_le_bytes());
                    s.msg[8..16].copy_from_slice(&cx.now_ns().to_le_bytes());
                    if let Some(f) = fault {
                        let b = f.as_bytes();
                        let n = b.len().min(SIGNAL - 18);
                        s.msg[16..18].copy_from_slice(&(n as u16).to_le_bytes());
                        s.msg[18..18 + n].copy_from_slice(&b[..n]);
                    }
                    s.started = Some(Instant::now());
                    if let Err(e) = start_signal(&mut s, Dir::Send, peer, tag, inner.events) {
                        return t.0.finish(Err(e));
                    }
                }
                match s.call.test() {
                    Ok(true) => t.0.finish(Ok(())),
                    Ok(false) => match s.timed_out(inner.config.timeout) {
                        Some(waited) => t.0.finish(Err(MpiError::PeerTimeout {
                            op: "send_event",
                            peer,
                            tag,
                            waited,
                        })),
                        None => Poll::Pending,
                    },
                    Err(code) => t.0.finish(Err(call_error("MPI_Test", peer, code))),
                }
            })?;
        Ok(transfer)
    }

    /// Makes work submitted to `stream` after this call wait until the event
    /// rank `peer` sends with `tag` ([`Cluster::send_event`]) completed there.
    /// Does not block the host.
    pub fn wait_event(&self, stream: &Stream, peer: i32, tag: i32) -> Result<Transfer> {
        self.inner.check_peer(peer, tag)?;
        let inner = self.inner.clone();
        let transfer = Transfer::new(peer, tag);
        let t = Finish(transfer.clone());
        let mut s = Signal::new();
        stream.enqueue_async("mpi_wait_event", &[], move |cx: &mut AsyncContext<'_>| {
            if s.started.is_none() {
                s.started = Some(Instant::now());
                if let Err(e) = start_signal(&mut s, Dir::Recv, peer, tag, inner.events) {
                    return t.0.finish(Err(e));
                }
            }
            match s.call.test() {
                Ok(true) => {
                    let word = |at: usize| {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(&s.msg[at..at + 8]);
                        u64::from_le_bytes(b)
                    };
                    if word(0) != 0 {
                        let n = u16::from_le_bytes([s.msg[16], s.msg[17]]) as usize;
                        let n = n.min(SIGNAL - 18);
                        let message = String::from_utf8_lossy(&s.msg[18..18 + n]).into_owned();
                        return t
                            .0
                            .finish(Err(MpiError::RemoteEventFailed { peer, tag, message }));
                    }
                    // (Honoured in virtual time: the peer's clock when it signalled.)
                    cx.complete_at_ns(word(8) + inner.config.wire_ns(SIGNAL));
                    t.0.finish(Ok(()))
                }
                Ok(false) => match s.timed_out(inner.config.timeout) {
                    Some(waited) => {
                        s.call.cancel_recv();
                        t.0.finish(Err(MpiError::PeerTimeout {
                            op: "wait_event",
                            peer,
                            tag,
                            waited,
                        }))
                    }
                    None => Poll::Pending,
                },
                Err(code) => t.0.finish(Err(call_error("MPI_Test", peer, code))),
            }
        })?;
        Ok(transfer)
    }
}
