//! What the pool needs from the execution layer to know when stream work is
//! done: [`StreamPoint`] (completion of some stream work) and [`StreamPoints`] (a
//! point recorded at the current end of a stream: its tail). Without an installed
//! [`StreamPoints`], the pool treats streams as host-synchronous: their work is
//! done when `free` is called.

use super::StreamId;
use std::fmt;
use std::sync::Arc;

/// Completion of some stream work (hetero's `Event` implements this).
pub trait StreamPoint: Send + Sync + fmt::Debug {
    fn is_complete(&self) -> bool;
    fn wait(&self);
    /// Waits for completion while the work behind the point makes progress,
    /// giving up once it made none for `idle`; whether it completed. The pool
    /// waits this way only: the work behind a point may itself wait for
    /// something the waiting thread would do after the allocation (signal a
    /// host event), and an allocation must then go on without it, not hang,
    /// while slow work that keeps completing is still waited for. The default
    /// knows no progress: it polls [`StreamPoint::is_complete`] with short
    /// sleeps for `idle` in all. An execution layer overrides it (hetero's
    /// points watch their stream's timeline, and drive a simulation in
    /// virtual time).
    fn wait_progressing(&self, idle: std::time::Duration) -> bool {
        let limit = idle;
        let start = std::time::Instant::now();
        while !self.is_complete() {
            if start.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        true
    }
    /// The concrete point, for an execution layer that turns its own points
    /// into device-side waits instead of host waits.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

/// Records the point at the current end of a stream (its tail): the execution layer
/// implements it so the pool can learn when a stream's work on a freed block
/// is done before handing the block to another stream. Without one, the pool
/// treats streams as host-synchronous (their work is done when `free` is called).
pub trait StreamPoints: Send + Sync + fmt::Debug {
    fn record(&self, stream: StreamId) -> Arc<dyn StreamPoint>;
    /// The device's clock, ns, for the pool's profile records (chunk maps and
    /// unmaps): a device with a clock of its own (modelled time) stamps its
    /// records with it, so a trace holds one clock per device.
    fn now_ns(&self) -> u64 {
        hetero_trace::now_ns()
    }
}
