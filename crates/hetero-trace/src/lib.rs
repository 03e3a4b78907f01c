//! The recorder: every hetero layer reports what it did here, at a cost of
//! one predictable branch when profiling is off.
//!
//! Each thread appends [`OpRecord`]s and [`MemRecord`]s to its own chunked
//! buffer (single writer, no lock, no allocation except when a chunk fills);
//! [`take`] drains every thread's buffer, including those of threads that
//! have exited, into a [`Trace`]. [`write_chrome_trace`] turns a trace into
//! Chrome Trace Event JSON for ui.perfetto.dev or chrome://tracing.
//!
//! ```
//! use hetero_trace::{EngineKind, OpKind, OpRecord};
//! hetero_trace::set_enabled(true);
//! let start = hetero_trace::now_ns();
//! hetero_trace::record_op(OpRecord {
//!     kind: OpKind::Kernel, name: "saxpy", stream: 1, queue: 0,
//!     engine: EngineKind::Compute, engine_index: 0, seq: 1,
//!     submit_ns: start, start_ns: start, end_ns: hetero_trace::now_ns(),
//!     bytes: 0, dep: None, failed: false, node: None,
//! });
//! hetero_trace::set_enabled(false);
//! let trace = hetero_trace::take();
//! assert!(trace.ops.iter().any(|op| op.name == "saxpy"));
//! let mut json = Vec::new();
//! hetero_trace::write_chrome_trace(&trace, &mut json).unwrap();
//! ```
//!
//! Invariants: records of one thread come out of [`take`] in the order that
//! thread recorded them (then [`Trace`] sorts them by time); a record is
//! returned by exactly one [`take`].

#![deny(unsafe_op_in_unsafe_fn)]

mod chrome;
mod log;
mod loom;
mod record;
mod recorder;

pub use chrome::write_chrome_trace;
pub use record::{
    EngineKind, GraphPlan, IotlbRecord, LinkRecord, MemKind, MemRecord, MigrationReason,
    MigrationRecord, NodeRef, OpKind, OpRecord, TaskRecord, Trace, TraceClock,
};
pub use recorder::{
    enabled, now_ns, record_iotlb, record_link, record_mem, record_migration, record_op,
    record_task, set_clock, set_device_name, set_enabled, set_graph_plan, set_max_records,
    set_stream_name, take, DEFAULT_MAX_RECORDS,
};
