//! hetero-vulkan: the thin, safe layer over `ash` that hetero's Vulkan backend sits
//! on. It knows nothing of hetero (it sits below it): discovery ([`Instance`],
//! [`DeviceInfo`]), a logical device with a queue plan ([`Gpu`], [`QueuePlan`]),
//! timeline semaphores ([`Timeline`]), memory ([`Chunk`]), kernels
//! ([`compile_wgsl`], [`Pipeline`], a disk pipeline cache), recording and
//! submission ([`Recorder`], [`CommandBuffer`], [`Gpu::submit`]) and timestamps
//! ([`QueryPool`], [`Gpu::calibrate`]).
//!
//! Files, one concept each: `instance.rs` discovery, `info.rs` what a device
//! offers, `device.rs` the logical device and submission, `queue.rs` the queue plan,
//! `timeline.rs`, `memory.rs`, `kernel.rs` WGSL and SPIR-V checks, `pipeline.rs`,
//! `cache.rs` the disk cache, `command.rs` recording and barriers, `bound.rs`
//! descriptor sets and parameters a recorded dispatch reads from outside it, `query.rs`
//! timestamps and calibration.
//!
//! Invariants: every Vulkan object is owned by a struct that holds an `Arc` of the
//! device it was made from (so the `VkDevice`, then the `VkInstance`, go last);
//! command buffers hold what they use; submissions hold their command buffers and
//! timelines until they complete. Each `VkQueue` is used under its own mutex.
//!
//! The loader is opened at run time (ash's `loaded` feature): the crate builds and
//! its tests pass on machines without Vulkan, where they skip (unless
//! `HETERO_REQUIRE_VULKAN=1`, see `tests/common`).

#![deny(unsafe_op_in_unsafe_fn)]

mod bound;
mod cache;
mod command;
mod device;
mod error;
mod info;
mod instance;
mod kernel;
mod memory;
mod pipeline;
mod query;
mod queue;
mod submit;
mod timeline;

pub use ash::vk;
pub use bound::{GraphSets, ParamBlock, SetId};
pub use cache::{cache_dir, CacheLocation, CacheStatus};
pub use command::{CommandBuffer, Recorder};
pub use device::{Gpu, OpenOptions, QueuePriority};
pub use error::{Result, VkError};
pub use info::{
    ApiVersion, DeviceInfo, DeviceType, Features, Limits, MemoryHeapInfo, MemoryTypeInfo,
    QueueFamilyInfo,
};
pub use instance::Instance;
pub use kernel::{
    check_spirv, compile_wgsl, params_from_memory, spirv_binding_sizes, spirv_bindings,
};
pub use memory::{choose_memory_type, Chunk, MemoryUse};
pub use pipeline::Pipeline;
pub use query::{host_now_ns, Calibration, CalibrationMethod, QueryPool};
pub use queue::{Lane, LaneQueue, QueuePlan};
pub use timeline::Timeline;
