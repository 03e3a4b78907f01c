//! What users hold: devices, streams, events, buffer handles, kernels, copy
//! batches and pitched buffers. This floor builds validated ops and hands
//! them to the backend; it imports the backends and `exec`, never the reverse.

pub(crate) mod async_op;
pub(crate) mod batch;
pub(crate) mod buffer;
pub(crate) mod context;
pub(crate) mod device;
pub(crate) mod event;
pub(crate) mod graph;
pub(crate) mod kernel;
pub mod kernels;
pub(crate) mod managed;
pub(crate) mod pitched;
pub(crate) mod stream;
pub(crate) mod task;
