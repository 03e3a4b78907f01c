//! hetero: a runtime for heterogeneous computing.
//!
//! A [`Device`] owns memory and engines (compute units, copy engines, hardware
//! queues). Work goes onto [`Stream`]s — in-order sequences mapped onto hardware
//! queues — as copies, fills, kernel launches and host callbacks; [`Event`]s are
//! points on a stream's timeline that other streams and the host wait on.
//!
//! Invariants every part keeps (see docs/ARCHITECTURE.md):
//! - work on one stream takes effect in submission order;
//! - an event orders everything recorded before it before everything that waits on
//!   it, on any stream;
//! - safe code cannot reach freed memory nor memory pending work uses;
//! - bad input is a typed [`Error`], never a panic; a fault stays in its stream and
//!   the work that waits on it.
#![deny(unsafe_op_in_unsafe_fn)]

mod api;
mod backend;
mod config;
mod error;
mod exec;
mod system;

/// What the Vulkan backend finds on this machine.
#[cfg(feature = "vulkan")]
pub mod vulkan {
    pub use crate::backend::vulkan::devices;
    pub use hetero_vulkan::{DeviceInfo, QueuePlan};
}

pub use api::async_op::AsyncArg;
pub use api::batch::CopyBatch;
pub use api::buffer::{Arg, DeviceBuffer, PinnedBuffer};
pub use api::context::{Context, PeerPair, PeerPath, Topology, TopologyDevice};
pub use api::device::Device;
pub use api::event::{Event, HostEvent};
pub use api::graph::{Bindings, CommandBuffer, Graph, GraphExec, NodeId, PinnedSlot, Slot};
pub use api::kernel::Kernel;
pub use api::kernels;
pub use api::managed::{Attach, ManagedBuffer, ManagedRead, ManagedWrite};
pub use api::pitched::PitchedBuffer;
pub use api::stream::{Stream, PRIORITY_HIGHEST, PRIORITY_LOWEST};
pub use api::task::{
    DataArg, PlacedTaskGraph, PredictionError, Task, TaskBuilder, TaskData, TaskGraph,
    TaskGraphLaunch, TaskStats, MAX_TASK_STREAMS,
};
pub use backend::emu::{IommuStats, IotlbCounts};
pub use backend::DeviceProperties;
pub use config::emu::{
    ComputeClass, EmuConfig, TimeMode, DEFAULT_INLINE_COPY_MAX, DEFAULT_IOTLB_ENTRIES,
    DEFAULT_IOTLB_MISS_NS,
};
pub use config::link::LinkPreset;
pub use config::peer::PeerLink;
pub use config::{
    BackendKind, Coalescing, CompletionMode, DeviceConfig, QueuePriority, GRAPH_MEMORY_SLACK,
};
pub use error::{Error, RegionProblem, Result};
pub use exec::async_op::{AsyncContext, AsyncOp};
pub use exec::clock;
pub use exec::graph::plan::{PlanReport, MAX_SCALARS};
pub use exec::kernel::{Block, Grid, KernelCost, INLINE_KERNEL_ARGS, MAX_KERNEL_ARGS};
pub use exec::managed::fault::{mechanism as host_fault_mechanism, FaultMechanism};
pub use exec::managed::{
    Advice, DeviceFaultCost, Location, ManagedStats, MigrationReason, DEFAULT_PAGE_BYTES,
    PIN_AFTER, THROTTLE_AFTER,
};
pub use exec::op::CopyKind;
pub use exec::rows::{PitchedLayout, Region2D, Rows, RowsMut};
pub use exec::sched::{SchedPolicy, READY_SLACK, WS_WINDOW};
pub use exec::storage::MemoryKind;
pub use system::{SystemInfo, WakeLatency};

/// The README's examples, compiled and run as doctests (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// Virtual memory management and memory shared between processes
/// ([`Device::create_memory_context`]).
pub use hetero_memory::{ipc, vmm};

/// The memory layer's configuration and figures, as the device exposes them.
pub use hetero_memory::{
    HugePagePolicy, MemoryError, PinnedConfig, PinnedStats, PoolConfig, PoolStats, ReusePolicy,
    Snapshot,
};
