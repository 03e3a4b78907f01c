//! The peer of `hetero bench vulkan`: what a hand-written runtime does with raw
//! `ash` calls on the same device, with nothing of hetero or hetero-vulkan in
//! its path (only the SPIR-V words come from `hetero_vulkan::compile_wgsl`, so
//! both sides run the same shader).
//!
//! One instance, one device with one compute queue, one timeline semaphore that
//! every submission signals with the next value (`vkQueueSubmit2`) and the host
//! waits for (`vkWaitSemaphores`, no timeout). Recorded command buffers come
//! from one pool; an op recorded afresh (`record_and_submit`) reuses one buffer
//! of a second pool, reset before each recording.
//!
//! Invariant: every handle made here is destroyed in `Drop`, after
//! `vkDeviceWaitIdle`, before the device and the instance.

use ash::vk;
use std::ffi::CStr;

type Result<T> = std::result::Result<T, String>;

/// Push-constant bytes of every kernel's layout (hetero's 8 scalar slots).
const PUSH_BYTES: u32 = 64;

fn call(what: &'static str) -> impl Fn(vk::Result) -> String {
    move |e| format!("{what} failed: {e}")
}

/// A device-local buffer and its memory.
#[derive(Clone, Copy)]
pub struct Buffer {
    pub buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    pub bytes: u64,
}

/// A compute pipeline and, when it has a storage buffer, its descriptor set.
#[derive(Clone, Copy)]
pub struct Kernel {
    pipeline: vk::Pipeline,
    layout: vk::PipelineLayout,
    set: Option<vk::DescriptorSet>,
}

pub struct Peer {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: ash::Device,
    queue: vk::Queue,
    family: u32,
    /// The memory type of device-local buffers.
    device_local: u32,
    /// What the driver calls the device.
    pub name: String,
    timeline: vk::Semaphore,
    value: u64,
    submissions: u64,
    /// Command buffers recorded once and resubmitted.
    recorded_pool: vk::CommandPool,
    /// The one command buffer re-recorded for every op, and its pool.
    op_pool: vk::CommandPool,
    op_cb: vk::CommandBuffer,
    buffers: Vec<Buffer>,
    modules: Vec<vk::ShaderModule>,
    layouts: Vec<vk::PipelineLayout>,
    pipelines: Vec<vk::Pipeline>,
    set_layouts: Vec<vk::DescriptorSetLayout>,
    descriptor_pools: Vec<vk::DescriptorPool>,
}

impl Peer {
    /// Opens physical device `index` (in the loader's order, as hetero's
    /// `DeviceConfig::vulkan(index)` does) with its first compute queue.
    pub fn open(index: usize) -> Result<Peer> {
        // SAFETY: loading the Vulkan loader runs its initialisers; nothing else
        // in this process depends on it being loaded once.
        let entry = unsafe { ash::Entry::load() }.map_err(|e| format!("loading Vulkan: {e}"))?;
        let app = vk::ApplicationInfo::default()
            .application_name(c"hetero-bench-ash-peer")
            .api_version(vk::API_VERSION_1_3);
        let info = vk::InstanceCreateInfo::default().application_info(&app);
        // SAFETY: a valid create info with no extensions or layers.
        let instance =
            unsafe { entry.create_instance(&info, None) }.map_err(call("vkCreateInstance"))?;
        let mut peer = match Self::open_device(entry, instance.clone(), index) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: nothing made from the instance is alive (open_device
                // fails only before it creates the device).
                unsafe { instance.destroy_instance(None) };
                return Err(e);
            }
        };
        // From here Drop destroys what was made (null handles are skipped).
        peer.init()?;
        Ok(peer)
    }

    fn open_device(entry: ash::Entry, instance: ash::Instance, index: usize) -> Result<Peer> {
        // SAFETY: the instance is live.
        let pds = unsafe { instance.enumerate_physical_devices() }
            .map_err(call("vkEnumeratePhysicalDevices"))?;
        let pd = *pds
            .get(index)
            .ok_or_else(|| format!("no Vulkan device {index}: {} present", pds.len()))?;
        // SAFETY: `pd` came from this instance.
        let props = unsafe { instance.get_physical_device_properties(pd) };
        let name = props
            .device_name_as_c_str()
            .map_or_else(|_| "?".into(), |n: &CStr| n.to_string_lossy().into_owned());
        if props.api_version < vk::API_VERSION_1_3 {
            return Err(format!(
                "the ash peer needs Vulkan 1.3 (vkQueueSubmit2 in core); `{name}` offers {}.{}",
                vk::api_version_major(props.api_version),
                vk::api_version_minor(props.api_version)
            ));
        }
        // SAFETY: as above.
        let families = unsafe { instance.get_physical_device_queue_family_properties(pd) };
        let family = families
            .iter()
            .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .ok_or_else(|| format!("`{name}` has no compute queue"))? as u32;
        // SAFETY: as above.
        let mem = unsafe { instance.get_physical_device_memory_properties(pd) };
        let device_local = (0..mem.memory_type_count)
            .find(|&i| {
                mem.memory_types[i as usize]
                    .property_flags
                    .contains(vk::MemoryPropertyFlags::DEVICE_LOCAL)
            })
            .ok_or_else(|| format!("`{name}` has no device-local memory type"))?;
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(family)
            .queue_priorities(&priorities)];
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default().timeline_semaphore(true);
        let mut f13 = vk::PhysicalDeviceVulkan13Features::default().synchronization2(true);
        let create = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .push_next(&mut f12)
            .push_next(&mut f13);
        // SAFETY: `pd` belongs to the instance; both features are core in 1.3,
        // checked above; the chain outlives the call.
        let device =
            unsafe { instance.create_device(pd, &create, None) }.map_err(call("vkCreateDevice"))?;
        // SAFETY: queue 0 of `family` was requested above.
        let queue = unsafe { device.get_device_queue(family, 0) };
        Ok(Peer {
            _entry: entry,
            instance,
            device,
            queue,
            family,
            device_local,
            name,
            timeline: vk::Semaphore::null(),
            value: 0,
            submissions: 0,
            recorded_pool: vk::CommandPool::null(),
            op_pool: vk::CommandPool::null(),
            op_cb: vk::CommandBuffer::null(),
            buffers: Vec::new(),
            modules: Vec::new(),
            set_layouts: Vec::new(),
            descriptor_pools: Vec::new(),
            layouts: Vec::new(),
            pipelines: Vec::new(),
        })
    }

    /// The timeline, the two command pools and the op buffer.
    fn init(&mut self) -> Result<()> {
        let family = self.family;
        let mut ty = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let sci = vk::SemaphoreCreateInfo::default().push_next(&mut ty);
        let d = &self.device;
        // SAFETY: valid create infos for a live device and one of its families.
        unsafe {
            self.timeline = d
                .create_semaphore(&sci, None)
                .map_err(call("vkCreateSemaphore"))?;
            let pool = vk::CommandPoolCreateInfo::default().queue_family_index(family);
            self.recorded_pool = d
                .create_command_pool(&pool, None)
                .map_err(call("vkCreateCommandPool"))?;
            let pool = pool.flags(vk::CommandPoolCreateFlags::TRANSIENT);
            self.op_pool = d
                .create_command_pool(&pool, None)
                .map_err(call("vkCreateCommandPool"))?;
        }
        self.op_cb = self.allocate(self.op_pool)?;
        Ok(())
    }

    fn allocate(&self, pool: vk::CommandPool) -> Result<vk::CommandBuffer> {
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool is live and used by this thread only.
        Ok(unsafe { self.device.allocate_command_buffers(&info) }
            .map_err(call("vkAllocateCommandBuffers"))?[0])
    }

    /// vkQueueSubmit2 calls so far.
    pub fn submissions(&self) -> u64 {
        self.submissions
    }

    /// A device-local buffer of `bytes`, usable as storage and copy source and
    /// destination; freed when the peer drops.
    pub fn buffer(&mut self, bytes: u64) -> Result<Buffer> {
        let (buffer, memory) = self.make_buffer(bytes)?;
        let b = Buffer {
            buffer,
            memory,
            bytes,
        };
        self.buffers.push(b);
        Ok(b)
    }

    fn make_buffer(&self, bytes: u64) -> Result<(vk::Buffer, vk::DeviceMemory)> {
        let d = &self.device;
        let info = vk::BufferCreateInfo::default().size(bytes).usage(
            vk::BufferUsageFlags::STORAGE_BUFFER
                | vk::BufferUsageFlags::TRANSFER_SRC
                | vk::BufferUsageFlags::TRANSFER_DST,
        );
        // SAFETY: valid create info for a live device.
        let buffer = unsafe { d.create_buffer(&info, None) }.map_err(call("vkCreateBuffer"))?;
        // SAFETY: `buffer` is live.
        let req = unsafe { d.get_buffer_memory_requirements(buffer) };
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(self.device_local);
        // SAFETY: a device-local type of this device; `buffer` is destroyed on failure.
        unsafe {
            let memory = match d.allocate_memory(&alloc, None) {
                Ok(m) => m,
                Err(e) => {
                    d.destroy_buffer(buffer, None);
                    return Err(call("vkAllocateMemory")(e));
                }
            };
            if let Err(e) = d.bind_buffer_memory(buffer, memory, 0) {
                d.destroy_buffer(buffer, None);
                d.free_memory(memory, None);
                return Err(call("vkBindBufferMemory")(e));
            }
            Ok((buffer, memory))
        }
    }

    /// The figure `ash/allocate-bind-free-ns` times: vkAllocateMemory,
    /// vkCreateBuffer, vkBindBufferMemory, vkDestroyBuffer, vkFreeMemory of
    /// `bytes` (the memory type is known beforehand, as a runtime caches it, so
    /// no vkGetBufferMemoryRequirements in the loop).
    pub fn allocate_bind_free(&self, bytes: u64) -> Result<()> {
        let d = &self.device;
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(bytes)
            .memory_type_index(self.device_local);
        let info = vk::BufferCreateInfo::default().size(bytes).usage(
            vk::BufferUsageFlags::STORAGE_BUFFER
                | vk::BufferUsageFlags::TRANSFER_SRC
                | vk::BufferUsageFlags::TRANSFER_DST,
        );
        // SAFETY: valid create infos; the buffer is bound at offset 0 to memory
        // of its full size and a type it accepts (device-local, as for every
        // buffer made here), and both are destroyed before returning.
        unsafe {
            let memory = d
                .allocate_memory(&alloc, None)
                .map_err(call("vkAllocateMemory"))?;
            let buffer = match d.create_buffer(&info, None) {
                Ok(b) => b,
                Err(e) => {
                    d.free_memory(memory, None);
                    return Err(call("vkCreateBuffer")(e));
                }
            };
            let bound = d.bind_buffer_memory(buffer, memory, 0);
            d.destroy_buffer(buffer, None);
            d.free_memory(memory, None);
            bound.map_err(call("vkBindBufferMemory"))
        }
    }

    /// A compute pipeline of `spirv` (entry `main`) with `storage` bound at
    /// `@group(0) @binding(0)` when given.
    pub fn kernel(&mut self, spirv: &[u32], storage: Option<&Buffer>) -> Result<Kernel> {
        let d = &self.device;
        let bindings: Vec<_> = storage
            .iter()
            .map(|_| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(0)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        // SAFETY: valid create infos for a live device; every handle made is
        // pushed to a list that Drop destroys.
        unsafe {
            let set_layout = d
                .create_descriptor_set_layout(
                    &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                    None,
                )
                .map_err(call("vkCreateDescriptorSetLayout"))?;
            self.set_layouts.push(set_layout);
            let layouts = [set_layout];
            // 64 bytes of push constants, as hetero gives every kernel.
            let push = [vk::PushConstantRange::default()
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
                .size(PUSH_BYTES)];
            let layout = d
                .create_pipeline_layout(
                    &vk::PipelineLayoutCreateInfo::default()
                        .set_layouts(&layouts)
                        .push_constant_ranges(&push),
                    None,
                )
                .map_err(call("vkCreatePipelineLayout"))?;
            self.layouts.push(layout);
            let module = d
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(spirv), None)
                .map_err(call("vkCreateShaderModule"))?;
            self.modules.push(module);
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(module)
                .name(c"main");
            let info = vk::ComputePipelineCreateInfo::default()
                .stage(stage)
                .layout(layout);
            let pipeline =
                match d.create_compute_pipelines(vk::PipelineCache::null(), &[info], None) {
                    Ok(p) => p[0],
                    Err((_, e)) => return Err(call("vkCreateComputePipelines")(e)),
                };
            self.pipelines.push(pipeline);
            let mut k = Kernel {
                pipeline,
                layout,
                set: None,
            };
            if let Some(buf) = storage {
                let sizes = [vk::DescriptorPoolSize::default()
                    .ty(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)];
                let pool = d
                    .create_descriptor_pool(
                        &vk::DescriptorPoolCreateInfo::default()
                            .max_sets(1)
                            .pool_sizes(&sizes),
                        None,
                    )
                    .map_err(call("vkCreateDescriptorPool"))?;
                self.descriptor_pools.push(pool);
                let set = d
                    .allocate_descriptor_sets(
                        &vk::DescriptorSetAllocateInfo::default()
                            .descriptor_pool(pool)
                            .set_layouts(&layouts),
                    )
                    .map_err(call("vkAllocateDescriptorSets"))?[0];
                let info = [vk::DescriptorBufferInfo::default()
                    .buffer(buf.buffer)
                    .offset(0)
                    .range(buf.bytes)];
                let write = vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(0)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(&info);
                d.update_descriptor_sets(&[write], &[]);
                k.set = Some(set);
            }
            Ok(k)
        }
    }

    /// The full barrier hetero records between ops: compute and transfer
    /// writes before compute and transfer reads and writes.
    fn barrier(&self, cb: vk::CommandBuffer) {
        let stages = vk::PipelineStageFlags2::COMPUTE_SHADER | vk::PipelineStageFlags2::TRANSFER;
        let writes = vk::AccessFlags2::SHADER_STORAGE_WRITE | vk::AccessFlags2::TRANSFER_WRITE;
        let reads = vk::AccessFlags2::SHADER_STORAGE_READ | vk::AccessFlags2::TRANSFER_READ;
        let barrier = [vk::MemoryBarrier2::default()
            .src_stage_mask(stages)
            .src_access_mask(writes)
            .dst_stage_mask(stages)
            .dst_access_mask(reads | writes)];
        // SAFETY: `cb` is in the recording state, recorded by this thread only.
        unsafe {
            self.device
                .cmd_pipeline_barrier2(cb, &vk::DependencyInfo::default().memory_barriers(&barrier))
        };
    }

    fn bind(&self, cb: vk::CommandBuffer, k: &Kernel) {
        // SAFETY: as for `barrier`; the pipeline and set are live.
        unsafe {
            self.device
                .cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, k.pipeline);
            if let Some(set) = k.set {
                self.device.cmd_bind_descriptor_sets(
                    cb,
                    vk::PipelineBindPoint::COMPUTE,
                    k.layout,
                    0,
                    &[set],
                    &[],
                );
            }
        }
    }

    /// Records `f` into `cb` between begin and end.
    fn record_into(
        &self,
        cb: vk::CommandBuffer,
        flags: vk::CommandBufferUsageFlags,
        f: impl FnOnce(&Self, vk::CommandBuffer),
    ) -> Result<()> {
        // SAFETY: `cb` is in the initial state (new or its pool reset) and
        // only this thread records it.
        unsafe {
            self.device
                .begin_command_buffer(cb, &vk::CommandBufferBeginInfo::default().flags(flags))
                .map_err(call("vkBeginCommandBuffer"))?;
            f(self, cb);
            self.device
                .end_command_buffer(cb)
                .map_err(call("vkEndCommandBuffer"))
        }
    }

    /// A command buffer of `n` dispatches of `k` (one workgroup each), a
    /// barrier before each; the pipeline and set bound once, as a hand-written
    /// runtime recording one kernel `n` times would.
    pub fn record_dispatches(&self, k: &Kernel, n: usize) -> Result<vk::CommandBuffer> {
        let cb = self.allocate(self.recorded_pool)?;
        self.record_into(cb, vk::CommandBufferUsageFlags::empty(), |p, cb| {
            p.bind(cb, k);
            for _ in 0..n {
                p.barrier(cb);
                // SAFETY: recording, a compute pipeline bound.
                unsafe { p.device.cmd_dispatch(cb, 1, 1, 1) };
            }
        })?;
        Ok(cb)
    }

    /// A command buffer that fills all of `dst` with `value` (so its memory is
    /// written, as a copy's source in use is: an untouched buffer's pages are
    /// the kernel's one zero page, which a CPU driver reads from cache).
    pub fn record_fill(&self, dst: &Buffer, value: u32) -> Result<vk::CommandBuffer> {
        let cb = self.allocate(self.recorded_pool)?;
        self.record_into(cb, vk::CommandBufferUsageFlags::empty(), |p, cb| {
            p.barrier(cb);
            // SAFETY: recording; the buffer is live and its size a multiple of 4.
            unsafe {
                p.device
                    .cmd_fill_buffer(cb, dst.buffer, 0, dst.bytes, value)
            };
        })?;
        Ok(cb)
    }

    /// A command buffer of one barrier and a copy of all of `src` into `dst`.
    pub fn record_copy(&self, src: &Buffer, dst: &Buffer) -> Result<vk::CommandBuffer> {
        let cb = self.allocate(self.recorded_pool)?;
        let region = [vk::BufferCopy::default().size(src.bytes.min(dst.bytes))];
        self.record_into(cb, vk::CommandBufferUsageFlags::empty(), |p, cb| {
            p.barrier(cb);
            // SAFETY: recording; both buffers are live and large enough.
            unsafe {
                p.device
                    .cmd_copy_buffer(cb, src.buffer, dst.buffer, &region)
            };
        })?;
        Ok(cb)
    }

    /// Submits `cb` signalling the timeline's next value, then waits for it.
    pub fn submit_wait(&mut self, cb: vk::CommandBuffer) -> Result<()> {
        self.value += 1;
        let cbs = [vk::CommandBufferSubmitInfo::default().command_buffer(cb)];
        let signal = [vk::SemaphoreSubmitInfo::default()
            .semaphore(self.timeline)
            .value(self.value)
            .stage_mask(vk::PipelineStageFlags2::ALL_COMMANDS)];
        let submit = vk::SubmitInfo2::default()
            .command_buffer_infos(&cbs)
            .signal_semaphore_infos(&signal);
        let sems = [self.timeline];
        let values = [self.value];
        let wait = vk::SemaphoreWaitInfo::default()
            .semaphores(&sems)
            .values(&values);
        // SAFETY: the queue is used by this thread only; `cb` is executable and
        // not pending (every submission is waited for before the next); the
        // timeline's value only grows.
        unsafe {
            self.device
                .queue_submit2(self.queue, &[submit], vk::Fence::null())
                .map_err(call("vkQueueSubmit2"))?;
            self.submissions += 1;
            self.device
                .wait_semaphores(&wait, u64::MAX)
                .map_err(call("vkWaitSemaphores"))
        }
    }

    /// One op as a runtime that records every op does it: reset the op pool,
    /// record a barrier and one dispatch of `k`, submit, wait.
    pub fn record_and_submit(&mut self, k: &Kernel) -> Result<()> {
        // SAFETY: the op buffer's last submission was waited for: not pending.
        unsafe {
            self.device
                .reset_command_pool(self.op_pool, vk::CommandPoolResetFlags::empty())
                .map_err(call("vkResetCommandPool"))?;
        }
        let cb = self.op_cb;
        self.record_into(cb, vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT, |p, cb| {
            p.barrier(cb);
            p.bind(cb, k);
            // SAFETY: recording, a compute pipeline bound.
            unsafe { p.device.cmd_dispatch(cb, 1, 1, 1) };
        })?;
        self.submit_wait(cb)
    }

    /// What a program on raw Vulkan does to change one dispatch's push
    /// constant in a recorded command buffer: reset its pool, record the `n`
    /// dispatches of `k` again (each with its barrier and its constants, the
    /// one at `changed` given `value`), submit, wait.
    pub fn rerecord_and_submit(
        &mut self,
        k: &Kernel,
        n: usize,
        changed: usize,
        value: u32,
    ) -> Result<()> {
        // SAFETY: the op buffer's last submission was waited for: not pending.
        unsafe {
            self.device
                .reset_command_pool(self.op_pool, vk::CommandPoolResetFlags::empty())
                .map_err(call("vkResetCommandPool"))?;
        }
        let cb = self.op_cb;
        self.record_into(cb, vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT, |p, cb| {
            p.bind(cb, k);
            for i in 0..n {
                p.barrier(cb);
                let mut words = [0u8; PUSH_BYTES as usize];
                let v = if i == changed { value } else { 1 };
                words[..4].copy_from_slice(&v.to_ne_bytes());
                // SAFETY: recording, a compute pipeline bound whose layout
                // has PUSH_BYTES of push constants.
                unsafe {
                    p.device.cmd_push_constants(
                        cb,
                        k.layout,
                        vk::ShaderStageFlags::COMPUTE,
                        0,
                        &words,
                    );
                    p.device.cmd_dispatch(cb, 1, 1, 1)
                };
            }
        })?;
        self.submit_wait(cb)
    }

    /// One empty op recorded once, for `submit_wait` again and again.
    pub fn record_one(&self, k: &Kernel) -> Result<vk::CommandBuffer> {
        let cb = self.allocate(self.recorded_pool)?;
        self.record_into(cb, vk::CommandBufferUsageFlags::empty(), |p, cb| {
            p.barrier(cb);
            p.bind(cb, k);
            // SAFETY: recording, a compute pipeline bound.
            unsafe { p.device.cmd_dispatch(cb, 1, 1, 1) };
        })?;
        Ok(cb)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let d = &self.device;
        // SAFETY: the device is idle after the wait; every handle below was made
        // from it and is destroyed once (pools free their command buffers and
        // sets); null handles are ignored by the destroy calls.
        unsafe {
            let _ = d.device_wait_idle();
            for p in &self.pipelines {
                d.destroy_pipeline(*p, None);
            }
            for l in &self.layouts {
                d.destroy_pipeline_layout(*l, None);
            }
            for m in &self.modules {
                d.destroy_shader_module(*m, None);
            }
            for p in &self.descriptor_pools {
                d.destroy_descriptor_pool(*p, None);
            }
            for l in &self.set_layouts {
                d.destroy_descriptor_set_layout(*l, None);
            }
            for b in &self.buffers {
                d.destroy_buffer(b.buffer, None);
                d.free_memory(b.memory, None);
            }
            d.destroy_command_pool(self.op_pool, None);
            d.destroy_command_pool(self.recorded_pool, None);
            d.destroy_semaphore(self.timeline, None);
            d.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}
