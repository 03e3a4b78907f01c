//! A point on a stream's timeline: what an event records, and what the
//! memory pool waits on (memory freed there may be reused elsewhere once the
//! point is reached).

use crate::exec::timeline::Timeline;
use crate::Result;
use std::sync::Arc;

/// A point on a stream's timeline. As the pool sees it, memory freed there may
/// be reused elsewhere once it is reached; stream allocation turns it back into
/// a device-side wait (through `as_any`) instead of a host wait.
#[derive(Debug, Clone)]
pub(crate) struct TimelinePoint {
    pub(crate) timeline: Arc<Timeline>,
    pub(crate) value: u64,
}

impl TimelinePoint {
    /// Waits for the point on this thread; on an engine thread a wait that could
    /// never end is an error and the point may still be ahead. A fault of the
    /// stream that used the memory is not the waiter's.
    pub(crate) fn wait_here(&self) -> Result<()> {
        self.timeline
            .wait_for(self.value, self.timeline.host_wait, "reusing memory")
    }
}

impl hetero_memory::StreamPoint for TimelinePoint {
    fn is_complete(&self) -> bool {
        self.timeline.is_reached(self.value)
    }
    /// The pool waits only on threads that are not engines; hetero's own callers
    /// use `wait_here`.
    fn wait(&self) {
        let _ = self.wait_here();
    }
    /// Waits while the stream completes work, giving up after `idle` without
    /// a completion on it.
    fn wait_progressing(&self, idle: std::time::Duration) -> bool {
        let t = &self.timeline;
        let mut seen = t.completed();
        loop {
            if t.reached_within(self.value, t.host_wait, idle) {
                return true;
            }
            let now = t.completed();
            if now == seen {
                return false;
            }
            seen = now;
        }
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

/// Waits for a pool fence on this thread (see `TimelinePoint::wait_here`).
pub(crate) fn wait_point(f: &Arc<dyn hetero_memory::StreamPoint>) -> Result<()> {
    if f.is_complete() {
        return Ok(());
    }
    match f.as_any().and_then(|a| a.downcast_ref::<TimelinePoint>()) {
        Some(point) => point.wait_here(),
        None => {
            f.wait();
            Ok(())
        }
    }
}
