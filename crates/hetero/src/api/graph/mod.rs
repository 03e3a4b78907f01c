//! Graphs and command buffers: work recorded once, instantiated into a plan
//! (a schedule of chains and a memory plan for the buffers allocated inside),
//! then launched any number of times with one submission each.
//!
//! Three ways to record, one representation (`Draft`):
//! - [`Graph`]: nodes and dependency edges, built explicitly;
//! - [`CommandBuffer`]: a linear recording with the whole [`Stream`] API;
//! - stream capture ([`Stream::begin_capture`] … [`Stream::end_capture`]): work
//!   submitted to a stream goes into a graph instead of running; streams that
//!   wait on an event recorded in the capture join it, as in CUDA.
//!
//! All three record through a stream in capture mode, so every operation is
//! validated by the same code as on a stream. Buffers allocated while recording
//! and slots bound at launch are *stand-ins*: storages without memory, tagged
//! with their graph (`Storage::graph_ref`); any use outside that graph's
//! recording is refused.
//!
//! [`Stream`]: crate::Stream
//! [`Stream::begin_capture`]: crate::Stream::begin_capture
//! [`Stream::end_capture`]: crate::Stream::end_capture

mod builder;
pub(crate) mod capture;
pub(crate) mod exec;

pub use builder::{CommandBuffer, Graph, NodeId, PinnedSlot, Slot};
pub use exec::{Bindings, GraphExec};
