//! The emulated device's backend stream: an op ring the simulation consumes.
//!
//! Invariants: producers only push (any thread); only the holder of the sim lock
//! pops; `served` (`in_flight`, `last_served`) is written only by that holder.

use super::{Doorbell, Shared};
use crate::backend::BackendStream;
use crate::config::CompletionMode;
use crate::exec::op::Op;
use crate::exec::ring::Ring;
use crate::exec::timeline::Timeline;
use crate::{Error, Result};
use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};

pub(crate) struct EmuStream {
    pub(crate) id: u64,
    pub(crate) timeline: Arc<Timeline>,
    pub(crate) ring: Ring<Op>,
    pub(crate) priority: AtomicU8,
    pub(crate) queue: usize,
    pub(crate) closed: AtomicBool,
    /// What the sim writes as the stream's ops start and complete, on a line
    /// of its own: beside the fields a submission reads (`closed`, the
    /// ring's slots), each start and completion cost the next submission a
    /// miss.
    pub(crate) served: CachePadded<Served>,
    pub(crate) shared: Weak<Shared>,
    /// The device clock and the driver's doorbell: all a submission touches.
    pub(crate) bell: Arc<Doorbell>,
    pub(crate) host_wait: CompletionMode,
    /// Coalescing (`Stream::set_coalescing`): the largest copy merged (0: off)
    /// and the most copies in one chain.
    pub(crate) coalesce_max: AtomicU64,
    pub(crate) coalesce_window: AtomicU64,
}

/// The sim's per-stream state; written only by the holder of the sim lock.
#[derive(Default)]
pub(crate) struct Served {
    /// An op of the stream is on an engine.
    pub(crate) in_flight: AtomicBool,
    /// The sim's completion count when the stream last completed an op.
    pub(crate) last_served: AtomicU64,
}

impl EmuStream {
    /// `(max_bytes, window)` while coalescing is on.
    pub(crate) fn coalescing(&self) -> Option<(usize, usize)> {
        match self.coalesce_max.load(Ordering::Relaxed) {
            0 => None,
            max => Some((
                max as usize,
                self.coalesce_window.load(Ordering::Relaxed) as usize,
            )),
        }
    }
}

impl BackendStream for EmuStream {
    fn id(&self) -> u64 {
        self.id
    }

    fn timeline(&self) -> &Arc<Timeline> {
        &self.timeline
    }

    fn submit(&self, mut op: Op) -> Result<u64> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(Error::StreamDestroyed { stream: self.id });
        }
        // Only the profiler reads it (on the device's clock, as the op's
        // other times): no clock read per op otherwise.
        if crate::exec::clock::profiling() {
            op.submit_ns = self.bell.now_ns();
        }
        let pos = loop {
            match self.ring.try_push(op) {
                Ok(pos) => break pos,
                Err(back) => {
                    op = back;
                    // Wait until a quarter of the ring is free, not one slot: in
                    // virtual time each wait runs the model, and pushing one op
                    // per run of it would cost a whole model step per op.
                    let want = (self.ring.capacity() / 4).max(1);
                    let oldest = self.ring.head() + 1;
                    self.timeline.wait_until(
                        oldest,
                        self.host_wait,
                        "a submission to a full stream",
                        || {
                            // Saturating: a producer may fill a slot the consumer
                            // freed before it moved `head`, so `tail - head` can be
                            // one past the capacity for a moment.
                            let used = self.ring.tail().saturating_sub(self.ring.head());
                            self.ring.capacity().saturating_sub(used) >= want
                        },
                    )?;
                }
            }
        };
        self.bell.ring();
        Ok(pos + 1)
    }

    fn prefetch_submit(&self, n: u64) {
        self.ring.prefetch(n);
    }

    fn prefetch_stream(&self) {
        self.ring.prefetch_header();
        crate::exec::ring::prefetch((&raw const self.closed).cast(), 1);
    }

    fn waits_all(&self) -> bool {
        true
    }

    fn copies_wait(&self) -> bool {
        true
    }

    fn submitted(&self) -> u64 {
        self.ring.tail()
    }

    fn priority(&self) -> u8 {
        self.priority.load(Ordering::Relaxed)
    }

    fn set_priority(&self, priority: u8) {
        self.priority.store(priority, Ordering::Relaxed);
        if let Some(sh) = self.shared.upgrade() {
            sh.priorities.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn hardware_queue(&self) -> usize {
        self.queue
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    fn set_coalescing(&self, c: Option<crate::Coalescing>) {
        let (max, window) = c.map_or((0, 0), |c| (c.max_bytes as u64, c.window as u64));
        self.coalesce_window.store(window, Ordering::Relaxed);
        self.coalesce_max.store(max, Ordering::Relaxed);
    }

    fn release(&self) {
        let _ = self.timeline.wait(self.submitted(), self.host_wait);
        if let Some(sh) = self.shared.upgrade() {
            sh.streams.remove(|s| s.id == self.id);
        }
    }
}
