//! What every backend shares: the op and its ring, timelines, points and
//! parking, the storage behind buffers and its stream-ordered reuse, kernels'
//! argument lists and block views, the graph plan and its runner, the data
//! effects (one place for copies, fills and host reads and writes), the clock
//! and the loom facade. This floor imports neither the public API (`api/`) nor
//! the backends.

pub(crate) mod async_op;
pub mod clock;
pub(crate) mod effects;
pub(crate) mod graph;
pub(crate) mod kernel;
pub(crate) mod loom;
pub(crate) mod managed;
pub(crate) mod op;
pub(crate) mod park;
pub(crate) mod point;
pub(crate) mod ring;
pub(crate) mod rows;
pub(crate) mod sched;
pub(crate) mod storage;
pub(crate) mod thread;
pub(crate) mod timeline;
pub(crate) mod transfer;
