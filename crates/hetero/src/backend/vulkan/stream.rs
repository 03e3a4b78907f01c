//! The Vulkan device's backend stream: an op ring its engine thread consumes.
//!
//! Invariants: producers only push (any thread); only the engine thread pops,
//! and only it writes `in_flight`, `recorded`, `faulted` and `in_callback`.

use super::Shared;
use crate::backend::BackendStream;
use crate::config::CompletionMode;
use crate::exec::op::Op;
use crate::exec::ring::Ring;
use crate::exec::timeline::Timeline;
use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};

pub(crate) struct VulkanStream {
    pub(crate) id: u64,
    pub(crate) timeline: Arc<Timeline>,
    pub(crate) ring: Ring<Op>,
    pub(crate) priority: AtomicU8,
    pub(crate) closed: AtomicBool,
    /// Ops of the stream taken from the ring and not yet completed.
    pub(crate) in_flight: AtomicU32,
    /// The value of the stream's last op recorded for the device (what a
    /// wait of another stream on this device is ordered behind).
    pub(crate) recorded: AtomicU64,
    /// The value of the stream's first op that failed when it was recorded
    /// (`u64::MAX`: none): the ones after it fail without running, to the
    /// end of its fault scope (`Timeline::start_scope`).
    pub(crate) faulted_at: AtomicU64,
    /// Earlier such faults whose scope ended: (first, last value). Engine
    /// thread only.
    pub(crate) faulted_before: std::sync::Mutex<Vec<(u64, u64)>>,
    /// A host callback of the stream was taken and has not completed: the
    /// engine takes nothing more from it. Engine thread only.
    pub(crate) in_callback: AtomicBool,
    /// Per lane (compute, transfer): the last batch holding device work this
    /// stream's later ops must follow (its own recorded ops, and those of the
    /// events it waited on); 0: none. Engine thread only.
    pub(crate) deps: [AtomicU64; 2],
    /// The lane of its last op with device work (a record's timestamp goes
    /// there). Engine thread only.
    pub(crate) lane: AtomicU8,
    /// The engine's op count when it last took an op of this stream (or when
    /// the stream was made): how long it has waited (aging). Written by the
    /// engine thread only.
    pub(crate) last_served: AtomicU64,
    pub(crate) shared: Weak<Shared>,
    pub(crate) host_wait: CompletionMode,
}

impl VulkanStream {
    /// Whether the stream's op at `value`, not yet recorded, fails without
    /// running (an op before it in its fault scope failed). Where a scope
    /// starts at `value` the fault's ends before it (kept for
    /// `faulted_here`). Engine thread only, in the stream's order.
    pub(crate) fn faulted(&self, value: u64) -> bool {
        let at = self.faulted_at.load(Ordering::Relaxed);
        if at == u64::MAX || !self.timeline.starts_scope(value) {
            return at != u64::MAX;
        }
        let mut before = self
            .faulted_before
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        before.push((at, value - 1));
        self.faulted_at.store(u64::MAX, Ordering::Relaxed);
        false
    }

    /// Whether the op at `value` failed when it was recorded.
    pub(crate) fn faulted_through(&self, value: u64) -> bool {
        self.faulted_at.load(Ordering::Relaxed) <= value || {
            let before = self
                .faulted_before
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            before.iter().any(|&(a, b)| a <= value && value <= b)
        }
    }
}

impl BackendStream for VulkanStream {
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
        let Some(sh) = self.shared.upgrade() else {
            return Err(Error::StreamDestroyed { stream: self.id });
        };
        sh.check_lost()?;
        let pos = loop {
            match self.ring.try_push(op) {
                Ok(pos) => break pos,
                Err(back) => {
                    op = back;
                    // The engine takes what is there, then room appears.
                    sh.ring();
                    crate::backend::wait_for_room(&self.ring, &self.timeline, self.host_wait)?;
                }
            }
        };
        sh.ring();
        Ok(pos + 1)
    }

    fn submitted(&self) -> u64 {
        self.ring.tail()
    }

    fn priority(&self) -> u8 {
        self.priority.load(Ordering::Relaxed)
    }

    fn set_priority(&self, priority: u8) {
        self.priority.store(priority, Ordering::Relaxed);
    }

    fn hardware_queue(&self) -> usize {
        0
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    fn release(&self) {
        let _ = self.timeline.wait(self.submitted(), self.host_wait);
        if let Some(sh) = self.shared.upgrade() {
            sh.streams.remove(|s| s.id == self.id);
        }
    }
}
