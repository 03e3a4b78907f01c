//! A logical device ([`Gpu`]): the features this layer requires (timeline
//! semaphores, synchronization2), the optional ones it turns on when present (push
//! descriptors, calibrated timestamps, buffer device address, host-memory import),
//! the queue plan, the disk pipeline cache, and submission.
//!
//! Invariants: every object made from a `Gpu` (chunks, pipelines, timelines, command
//! buffers, query pools) holds an `Arc<DeviceShared>`, so the `VkDevice` is destroyed
//! last, after `vkDeviceWaitIdle`. Objects a pending submission uses are kept alive
//! by the queue's keep-alive list until its progress timeline passes them.

use std::ffi::{c_char, CStr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ash::vk;

use crate::cache::{CacheLocation, CacheStatus, PipelineCacheStore};
use crate::error::{call, Result, VkError};
use crate::info::{ApiVersion, DeviceInfo};
use crate::instance::{Instance, InstanceShared};
use crate::queue::{Lane, QueuePlan, QueueSlot, QueueState};

/// Choices for [`Gpu::open_with`]; `Default` turns on everything the device offers.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Bind storage buffers through descriptor sets from a pool even when
    /// VK_KHR_push_descriptor is there (tests the fallback path).
    pub disable_push_descriptors: bool,
    /// Calibrate by a submission round trip even when VK_EXT_calibrated_timestamps is there.
    pub disable_calibrated_timestamps: bool,
    /// Where the pipeline cache is loaded from and saved to.
    pub cache: CacheLocation,
    /// Fault injection, for testing how a program handles a lost device: the
    /// device reports `VK_ERROR_DEVICE_LOST` at this submission (1: the
    /// first) and from every call that can report it after that, as a driver
    /// does after a crash or a reset. Work submitted before still runs.
    pub lose_at_submission: Option<u64>,
    /// The priority of this device's queues among every program's queues on
    /// the device (VK_KHR_global_priority / VK_EXT_global_priority), where
    /// the driver has it; see [`Gpu::queue_priority`] for what was granted.
    pub queue_priority: Option<QueuePriority>,
}

/// A queue's priority among all queues of the device, every process's
/// (`VkQueueGlobalPriorityKHR`). Above `Medium` a driver may ask for
/// privileges (`VK_ERROR_NOT_PERMITTED`); the device then opens at the
/// default priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueuePriority {
    Low,
    Medium,
    High,
    Realtime,
}

impl QueuePriority {
    fn raw(self) -> vk::QueueGlobalPriorityKHR {
        match self {
            QueuePriority::Low => vk::QueueGlobalPriorityKHR::LOW,
            QueuePriority::Medium => vk::QueueGlobalPriorityKHR::MEDIUM,
            QueuePriority::High => vk::QueueGlobalPriorityKHR::HIGH,
            QueuePriority::Realtime => vk::QueueGlobalPriorityKHR::REALTIME,
        }
    }
}

/// Which entry points synchronization2 comes from.
pub(crate) enum Sync2 {
    /// Vulkan 1.3 core.
    Core,
    /// VK_KHR_synchronization2 on a 1.2 device.
    Khr(ash::khr::synchronization2::Device),
}

pub(crate) struct DeviceShared {
    pub(crate) instance: Arc<InstanceShared>,
    pub(crate) physical: vk::PhysicalDevice,
    pub(crate) device: ash::Device,
    pub(crate) info: DeviceInfo,
    pub(crate) plan: QueuePlan,
    /// Distinct queues (one or two); `lanes[lane.index()]` indexes into it.
    pub(crate) queues: Vec<QueueSlot>,
    pub(crate) lanes: [usize; 2],
    pub(crate) sync2: Sync2,
    pub(crate) push_descriptor: Option<ash::khr::push_descriptor::Device>,
    pub(crate) calibrated: Option<ash::ext::calibrated_timestamps::Device>,
    pub(crate) external_host: Option<ash::ext::external_memory_host::Device>,
    pub(crate) buffer_device_address: bool,
    pub(crate) host_query_reset: bool,
    pub(crate) cache: PipelineCacheStore,
    pub(crate) submissions: AtomicU64,
    /// The device was lost (the driver said so, or the injected fault fired):
    /// every call that can report it does from then on.
    pub(crate) lost: AtomicBool,
    /// The submission the injected loss fires at (`u64::MAX`: none).
    pub(crate) lose_at: u64,
    /// The global priority the queues were created with, where one was asked
    /// for and granted.
    pub(crate) priority: Option<QueuePriority>,
}

impl DeviceShared {
    pub(crate) fn slot(&self, lane: Lane) -> &QueueSlot {
        &self.queues[self.lanes[lane.index()]]
    }

    /// `Err(DeviceLost)` once the device is lost.
    pub(crate) fn check_lost(&self, call: &'static str) -> Result<()> {
        if self.lost.load(Ordering::Acquire) {
            return Err(VkError::DeviceLost { call });
        }
        Ok(())
    }

    /// Notes a driver's answer: a lost device stays lost.
    pub(crate) fn note<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(VkError::DeviceLost { .. }) = &r {
            self.lost.store(true, Ordering::Release);
        }
        r
    }

    pub(crate) fn name(&self) -> String {
        self.info.name.clone()
    }

    pub(crate) fn cmd_pipeline_barrier2(
        &self,
        cb: vk::CommandBuffer,
        dep: &vk::DependencyInfo<'_>,
    ) {
        // SAFETY: callers pass a command buffer of this device in the recording
        // state, held exclusively by the recorder; `dep` lives across the call.
        unsafe {
            match &self.sync2 {
                Sync2::Core => self.device.cmd_pipeline_barrier2(cb, dep),
                Sync2::Khr(k) => k.cmd_pipeline_barrier2(cb, dep),
            }
        }
    }

    pub(crate) fn cmd_write_timestamp2(
        &self,
        cb: vk::CommandBuffer,
        pool: vk::QueryPool,
        query: u32,
    ) {
        let stage = vk::PipelineStageFlags2::ALL_COMMANDS;
        // SAFETY: as for barriers; `pool` is a live timestamp pool of this device and
        // `query` was bounds-checked by the caller.
        unsafe {
            match &self.sync2 {
                Sync2::Core => self.device.cmd_write_timestamp2(cb, stage, pool, query),
                Sync2::Khr(k) => k.cmd_write_timestamp2(cb, stage, pool, query),
            }
        }
    }

    pub(crate) fn progress(&self, slot: usize) -> Result<u64> {
        // SAFETY: as above.
        unsafe {
            self.device
                .get_semaphore_counter_value(self.queues[slot].progress)
        }
        .map_err(call("vkGetSemaphoreCounterValue"))
    }

    /// Drops the keep-alive lists of every completed submission.
    pub(crate) fn sweep_all(&self) {
        for slot in 0..self.queues.len() {
            self.sweep(slot);
        }
    }

    /// Drops keep-alive lists whose submissions completed.
    pub(crate) fn sweep(&self, slot: usize) {
        let Ok(done) = self.progress(slot) else {
            return;
        };
        let mut keep = lock(&self.queues[slot].keep);
        keep.retain(|(value, _)| *value > done);
    }

    /// Locks every queue (vkDeviceWaitIdle needs them all externally synchronised) and waits.
    pub(crate) fn wait_idle(&self) -> Result<()> {
        let guards: Vec<MutexGuard<'_, QueueState>> =
            self.queues.iter().map(|q| lock(&q.state)).collect();
        // SAFETY: every queue of the device is locked for the duration of the call.
        unsafe { self.device.device_wait_idle() }.map_err(call("vkDeviceWaitIdle"))?;
        drop(guards);
        self.sweep_all();
        Ok(())
    }
}

/// Locks a mutex; a panic while holding one of ours leaves no broken invariant
/// (the guarded data is a handle and a counter), so a poisoned lock is taken as is.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for DeviceShared {
    fn drop(&mut self) {
        // Nothing else holds the device (this is the last Arc), so waiting idle and
        // destroying is safe; errors here can only be reported.
        if let Err(e) = self.wait_idle() {
            tracing::warn!(error = %e, "vkDeviceWaitIdle failed while closing the device");
        }
        for q in &self.queues {
            lock(&q.keep).clear();
        }
        self.cache.save(&self.device);
        // SAFETY: the device is idle and no object made from it is left (each holds
        // an Arc to this struct); the cache and semaphores are ours.
        unsafe {
            self.cache.destroy(&self.device);
            for q in &self.queues {
                self.device.destroy_semaphore(q.progress, None);
            }
            self.device.destroy_device(None);
        }
    }
}

/// An open Vulkan device with its queue plan. Not `Clone`: dropping it waits for
/// the device to go idle and releases what pending submissions held.
pub struct Gpu {
    pub(crate) shared: Arc<DeviceShared>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("device", &self.shared.info.name)
            .field("plan", &self.shared.plan)
            .finish()
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // Keep-alive lists hold objects that hold the device: release them once the
        // device is idle, or the device would never be destroyed.
        if let Err(e) = self.shared.wait_idle() {
            tracing::warn!(error = %e, "vkDeviceWaitIdle failed while dropping the Gpu");
        }
        for q in &self.shared.queues {
            lock(&q.keep).clear();
        }
    }
}

impl Gpu {
    /// Opens device `index` of [`Instance::list_devices`] with default options.
    pub fn open(instance: &Instance, index: usize) -> Result<Gpu> {
        Self::open_with(instance, index, &OpenOptions::default())
    }

    /// Opens device `index` with `options`.
    pub fn open_with(instance: &Instance, index: usize, options: &OpenOptions) -> Result<Gpu> {
        let info = instance.device_info(index)?;
        let ishared = &instance.shared;
        let pd = ishared.physical[index];
        let effective: ApiVersion = info.api_version.min(ishared.api);
        if !effective.at_least(1, 2) {
            return Err(VkError::Version {
                what: format!("device `{}`", info.name),
                found: info.api_version.to_string(),
                needed: "1.2",
            });
        }
        let missing = |feature| VkError::MissingFeature {
            device: info.name.clone(),
            feature,
        };
        if !info.features.timeline_semaphore {
            return Err(missing("timeline semaphores"));
        }
        if !info.features.synchronization2 {
            return Err(missing("synchronization2"));
        }
        let plan =
            QueuePlan::choose(&info.queue_families).ok_or_else(|| missing("a compute queue"))?;

        // Queues: one create-info per family, counting the queues the plan uses.
        let mut family_counts: Vec<(u32, u32)> = Vec::new();
        for q in [plan.compute, plan.transfer] {
            match family_counts.iter_mut().find(|(f, _)| *f == q.family) {
                Some((_, n)) => *n = (*n).max(q.index + 1),
                None => family_counts.push((q.family, q.index + 1)),
            }
        }
        let priorities = [1.0f32; 2];

        let core13 = effective.at_least(1, 3);
        let f = info.features;
        let push = f.push_descriptor && !options.disable_push_descriptors;
        let calibrated = f.calibrated_timestamps && !options.disable_calibrated_timestamps;
        let mut extensions: Vec<*const c_char> = Vec::new();
        let mut enable = |on: bool, name: &'static CStr| {
            if on {
                extensions.push(name.as_ptr());
            }
        };
        enable(push, ash::khr::push_descriptor::NAME);
        enable(calibrated, ash::ext::calibrated_timestamps::NAME);
        enable(f.external_memory_host, ash::ext::external_memory_host::NAME);
        enable(f.external_memory_host, ash::khr::external_memory::NAME);
        enable(!core13, ash::khr::synchronization2::NAME);

        // The device, its queues at `priority` (global priority) when given.
        let create_device = |priority: Option<QueuePriority>| {
            let mut global: Vec<vk::DeviceQueueGlobalPriorityCreateInfoKHR<'_>> = family_counts
                .iter()
                .map(|_| {
                    vk::DeviceQueueGlobalPriorityCreateInfoKHR::default().global_priority(
                        priority.map_or(vk::QueueGlobalPriorityKHR::MEDIUM, QueuePriority::raw),
                    )
                })
                .collect();
            let queue_infos: Vec<vk::DeviceQueueCreateInfo<'_>> = family_counts
                .iter()
                .zip(global.iter_mut())
                .map(|(&(family, n), g)| {
                    let q = vk::DeviceQueueCreateInfo::default()
                        .queue_family_index(family)
                        .queue_priorities(&priorities[..n as usize]);
                    if priority.is_some() {
                        q.push_next(g)
                    } else {
                        q
                    }
                })
                .collect();
            let mut extensions = extensions.clone();
            if priority.is_some() {
                extensions.push(if f.global_priority_khr {
                    ash::khr::global_priority::NAME.as_ptr()
                } else {
                    ash::ext::global_priority::NAME.as_ptr()
                });
            }
            let mut f12 = vk::PhysicalDeviceVulkan12Features::default()
                .timeline_semaphore(true)
                .buffer_device_address(f.buffer_device_address)
                .host_query_reset(f.host_query_reset)
                .descriptor_binding_storage_buffer_update_after_bind(
                    f.storage_buffer_update_after_bind,
                );
            let mut s2 =
                vk::PhysicalDeviceSynchronization2Features::default().synchronization2(true);
            let create = vk::DeviceCreateInfo::default()
                .queue_create_infos(&queue_infos)
                .enabled_extension_names(&extensions)
                .push_next(&mut f12)
                .push_next(&mut s2);
            // SAFETY: `pd` belongs to the live instance; every extension and
            // feature enabled was reported by the device (global priority
            // only where it has the extension); the create-info chain lives
            // across the call.
            unsafe { ishared.instance.create_device(pd, &create, None) }
        };
        let wanted = options.queue_priority.filter(|_| f.global_priority);
        let (device, priority) = match wanted.map(|p| (p, create_device(Some(p)))) {
            Some((p, Ok(d))) => (d, Some(p)),
            // A priority the process may not take: the default one.
            Some((_, Err(vk::Result::ERROR_NOT_PERMITTED_KHR))) | None => {
                (create_device(None).map_err(call("vkCreateDevice"))?, None)
            }
            Some((_, Err(e))) => return Err(call("vkCreateDevice")(e)),
        };

        // From here on, a failure must destroy what was made: build the shared
        // struct early so its Drop does it.
        let make_slot = |family: u32, index: u32| -> Result<QueueSlot> {
            // SAFETY: the plan only names queues that were requested above.
            let queue = unsafe { device.get_device_queue(family, index) };
            let mut ty = vk::SemaphoreTypeCreateInfo::default()
                .semaphore_type(vk::SemaphoreType::TIMELINE)
                .initial_value(0);
            let sci = vk::SemaphoreCreateInfo::default().push_next(&mut ty);
            // SAFETY: valid create info for a live device.
            let progress = unsafe { device.create_semaphore(&sci, None) }
                .map_err(call("vkCreateSemaphore"))?;
            Ok(QueueSlot {
                family,
                state: Mutex::new(QueueState { queue, last: 0 }),
                progress,
                keep: Mutex::new(Vec::new()),
                submitted: AtomicU64::new(0),
            })
        };
        let mut queues = Vec::new();
        let mut lanes = [0usize; 2];
        let mut failure = None;
        for (lane, q) in [(0, plan.compute), (1, plan.transfer)] {
            if lane == 1 && q.family == plan.compute.family && q.index == plan.compute.index {
                lanes[1] = lanes[0];
                continue;
            }
            match make_slot(q.family, q.index) {
                Ok(s) => {
                    lanes[lane] = queues.len();
                    queues.push(s);
                }
                Err(e) => failure = Some(e),
            }
        }
        if let Some(e) = failure {
            // SAFETY: the device is new and idle; only these semaphores were made.
            unsafe {
                for q in &queues {
                    device.destroy_semaphore(q.progress, None);
                }
                device.destroy_device(None);
            }
            return Err(e);
        }

        let cache = PipelineCacheStore::open(&device, &info, &options.cache);
        let shared = DeviceShared {
            instance: Arc::clone(ishared),
            physical: pd,
            sync2: if core13 {
                Sync2::Core
            } else {
                Sync2::Khr(ash::khr::synchronization2::Device::new(
                    &ishared.instance,
                    &device,
                ))
            },
            push_descriptor: push
                .then(|| ash::khr::push_descriptor::Device::new(&ishared.instance, &device)),
            calibrated: calibrated
                .then(|| ash::ext::calibrated_timestamps::Device::new(&ishared.instance, &device)),
            external_host: f
                .external_memory_host
                .then(|| ash::ext::external_memory_host::Device::new(&ishared.instance, &device)),
            buffer_device_address: f.buffer_device_address,
            host_query_reset: f.host_query_reset,
            device,
            info,
            plan,
            queues,
            lanes,
            cache,
            submissions: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            lose_at: options.lose_at_submission.unwrap_or(u64::MAX),
            priority,
        };
        Ok(Gpu {
            shared: Arc::new(shared),
        })
    }

    /// What discovery reported for this device.
    pub fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    /// Which hardware queue each lane uses.
    pub fn queue_plan(&self) -> QueuePlan {
        self.shared.plan
    }

    /// True when storage-buffer descriptors can be rewritten while a recorded
    /// command buffer binds them (Vulkan 1.2's
    /// `descriptorBindingStorageBufferUpdateAfterBind`, enabled at creation
    /// where the device has it): what [`crate::Pipeline::graph_variant`] needs.
    pub fn supports_update_after_bind(&self) -> bool {
        self.shared.info.features.storage_buffer_update_after_bind
    }

    /// True when storage buffers are bound by VK_KHR_push_descriptor (else from a pool).
    pub fn uses_push_descriptors(&self) -> bool {
        self.shared.push_descriptor.is_some()
    }

    /// Submissions made so far on all lanes.
    /// The global priority its queues were created with: the one asked for
    /// in [`OpenOptions::queue_priority`] where the driver has global
    /// priorities and granted it, else `None` (the default priority).
    pub fn queue_priority(&self) -> Option<QueuePriority> {
        self.shared.priority
    }

    /// Whether the device was lost (see [`VkError::DeviceLost`]): nothing
    /// submitted to it runs any more.
    pub fn is_lost(&self) -> bool {
        self.shared.lost.load(Ordering::Acquire)
    }

    pub fn submissions(&self) -> u64 {
        self.shared.submissions.load(Ordering::Relaxed)
    }

    /// Submissions made so far on one lane's hardware queue (aliased lanes share a count).
    pub fn lane_submissions(&self, lane: Lane) -> u64 {
        self.shared.slot(lane).submitted()
    }

    /// Where the pipeline cache came from and how much it held at open.
    pub fn pipeline_cache_status(&self) -> CacheStatus {
        self.shared.cache.status()
    }

    /// Writes the pipeline cache to its file now (it is also written when the device closes).
    pub fn save_pipeline_cache(&self) -> Result<Option<PathBuf>> {
        self.shared.cache.save_checked(&self.shared.device)
    }

    /// Waits until every queue is idle, then releases what completed submissions held.
    pub fn wait_idle(&self) -> Result<()> {
        self.shared.wait_idle()
    }
}
