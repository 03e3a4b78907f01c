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
}
