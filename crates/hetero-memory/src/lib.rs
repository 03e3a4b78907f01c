//! hetero's memory layers, bottom up: the OS layer ([`os`]: mappings, huge
//! pages, mlock), the buffer level ([`tlsf`]: O(1) sub-allocation), the pinned
//! host pool ([`PinnedPool`]) and the three-level device pool ([`DevicePool`]:
//! chunk / block / buffer with stream-ordered reuse, or expandable segments).
//! Beside them: virtual memory management ([`vmm`]: reserved ranges, physical
//! handles, memory contexts with quotas) and memory shared between processes
//! ([`ipc`]).
//!
//! This crate sits below the execution layer and knows nothing of it: streams
//! are plain [`StreamId`]s and completion is the [`StreamPoint`] trait, which the
//! execution layer's events implement. The execution layer marks its engine
//! threads ([`thread_role`]) so the pool never blocks one on a fence.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod arena_plan;
mod config;
mod error;
pub mod ipc;
pub mod os;
mod sync;
pub mod thread_role;
pub mod tlsf;
pub mod vmm;

pub use config::{HugePagePolicy, PoolConfig, ReusePolicy, DEFAULT_WAIT_BEFORE_GROW_RATIO};
pub use error::{Bytes, MemoryError};
pub use os::{Chunk, ChunkSource, HostChunkSource, HostOptions, OsCalls, PageKind};
mod pinned;
mod poison;
mod pool;

pub use pinned::{PinnedAllocation, PinnedConfig, PinnedPool, PinnedStats};
pub use poison::is_poisoned;
pub use pool::{
    Allocation, BlockSnapshot, BlockState, ChunkSnapshot, DevicePool, PoolStats, Snapshot,
    StreamId, StreamPoint, StreamPoints, DEFAULT_ALIGN, MAX_ALIGN,
};
