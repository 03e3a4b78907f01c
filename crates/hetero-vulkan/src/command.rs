//! Recording: a [`Recorder`] builds one command buffer for a lane (dispatches,
//! copies, fills, timestamps) and inserts the barriers its commands need;
//! [`Recorder::finish`] gives a [`CommandBuffer`] that can be submitted any number
//! of times (graphs record once and replay).
//!
//! Barriers: the recorder tracks the byte ranges each command reads and writes
//! since the last barrier; a command that overlaps an earlier one where either
//! writes (RAW, WAR, WAW) gets one global memory barrier over both lanes' stages
//! (compute and transfer) first. A global barrier is what drivers implement anyway,
//! and a full one keeps the chain simple: every command before it is ordered and
//! visible to every command after. Dispatch bindings count as writes (the layer
//! does not know which ones a shader only reads). `finish` adds a barrier to the
//! host stage when anything was written, so host reads after a timeline wait see
//! the results.
//!
//! Each command buffer has its own command pool: pools are externally
//! synchronised, and one per buffer lets recorders on many threads run free.
//!
//! Reuse: [`Gpu::recorder_reusing`] records into a finished command buffer
//! again once nothing holds it any more (its submissions completed and were
//! released): its pool is reset, and its lists (keep-alive, barrier tracking,
//! what is bound) keep their capacity, so steady-state recording allocates
//! nothing on the Rust heap.

use std::collections::VecDeque;
use std::sync::Arc;

use ash::vk;

use crate::bound::{GraphSets, ParamBlock, SetId};
use crate::device::{DeviceShared, Gpu};
use crate::error::{call, Result, VkError};
use crate::memory::Chunk;
use crate::pipeline::{
    buffer_infos, check_buffers, storage_writes, PerBinding, Pipeline, INLINE_BINDINGS,
};
use crate::query::QueryPool;
use crate::queue::Lane;

/// Descriptor sets per fallback pool.
const SETS_PER_POOL: u32 = 64;

/// Empty command buffers `Gpu::recorder_reusing` adds to a caller's spares
/// at most at once.
const SPARES_GROWTH: usize = 32;

/// Objects a new recorder's keep-alive list has room for (a few dozen
/// commands on the same buffers need no more).
const KEEP_ROOM: usize = 32;

/// Push-constant bytes a recorder has room for without growing: the least
/// `maxPushConstantsSize` Vulkan guarantees.
const PUSH_ROOM: usize = 128;

pub(crate) struct CommandBufferInner {
    pub(crate) shared: Arc<DeviceShared>,
    pub(crate) family: u32,
    pub(crate) pool: vk::CommandPool,
    pub(crate) cb: vk::CommandBuffer,
    descriptor_pools: Vec<vk::DescriptorPool>,
    /// Chunks, pipelines and query pools the commands use.
    keep: Vec<Arc<dyn Send + Sync>>,
    /// The recorder's lists, empty, kept for the next recording into it.
    scratch: Scratch,
}

/// A recorder's working lists, handed back and forth with its command buffer
/// so that recording into it again reuses their capacity.
#[derive(Default)]
struct Scratch {
    since_barrier: Vec<Access>,
    bound: Bound,
}

impl Drop for CommandBufferInner {
    fn drop(&mut self) {
        if self.pool == vk::CommandPool::null() {
            return; // its pool is a recorder's, which records into it again
        }
        let d = &self.shared.device;
        // SAFETY: submissions hold this struct by Arc until they complete, so the
        // command buffer is not pending; destroying the pool frees the buffer.
        unsafe {
            for p in &self.descriptor_pools {
                d.destroy_descriptor_pool(*p, None);
            }
            d.destroy_command_pool(self.pool, None);
        }
    }
}

/// A finished command buffer, submittable any number of times with [`Gpu::submit`].
#[derive(Clone)]
pub struct CommandBuffer {
    pub(crate) inner: Arc<CommandBufferInner>,
}

impl CommandBuffer {
    /// Whether nothing but this handle holds the buffer (no clone, no
    /// submission that has not been released), so it can be recorded again.
    pub fn is_idle(&self) -> bool {
        Arc::strong_count(&self.inner) == 1 && Arc::weak_count(&self.inner) == 0
    }
}

impl std::fmt::Debug for CommandBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandBuffer")
            .field("family", &self.inner.family)
            .finish()
    }
}

/// One buffer range a command touches.
#[derive(Clone, Copy)]
struct Access {
    buffer: vk::Buffer,
    start: u64,
    end: u64,
    write: bool,
}

impl Access {
    fn conflicts(&self, other: &Access) -> bool {
        self.buffer == other.buffer
            && self.start < other.end
            && other.start < self.end
            && (self.write || other.write)
    }
}

/// Records commands for one lane. See the module docs for barriers.
///
/// ```no_run
/// # use hetero_vulkan::{Instance, Gpu, Chunk, MemoryUse, Lane, Timeline};
/// # use std::time::Duration;
/// let gpu = Gpu::open(&Instance::load()?, 0)?;
/// let a = Chunk::new(&gpu, 4096, MemoryUse::Upload)?;
/// let b = Chunk::new(&gpu, 4096, MemoryUse::Readback)?;
/// let mut r = gpu.recorder(Lane::Transfer)?;
/// r.fill(&a, 0, 4096, 7)?;
/// r.copy(&a, 0, &b, 0, 4096)?;
/// let cmd = r.finish()?;
/// let done = Timeline::new(&gpu, 0)?;
/// gpu.submit(Lane::Transfer, &[&cmd], &[], &[(&done, 1)])?;
/// done.wait(1, Duration::from_secs(5))?;
/// # Ok::<(), hetero_vulkan::VkError>(())
/// ```
pub struct Recorder {
    shared: Arc<DeviceShared>,
    lane: Lane,
    family: u32,
    computes: bool,
    timestamp_bits: u32,
    pool: vk::CommandPool,
    cb: vk::CommandBuffer,
    descriptor_pools: Vec<vk::DescriptorPool>,
    /// Descriptor pools in use (those past it were reset when the buffer
    /// was recorded again, and are used before a new one is made).
    pools_used: usize,
    keep: Vec<Arc<dyn Send + Sync>>,
    since_barrier: Vec<Access>,
    wrote: bool,
    /// What the last dispatch bound (pipeline, storage buffers, push
    /// constants): bindings persist in a command buffer, so a dispatch that
    /// binds the same records only itself.
    bound: Bound,
    /// The command buffer recorded into again: `finish` fills it in place
    /// (its pool is null meanwhile; this recorder owns the pool).
    shell: Option<Arc<CommandBufferInner>>,
}

#[derive(Default)]
struct Bound {
    pipeline: vk::Pipeline,
    buffers: Vec<(vk::Buffer, u64, u64)>,
    push: Vec<u8>,
}

impl Bound {
    /// Nothing bound (a new command buffer), capacity kept.
    fn clear(&mut self) {
        self.pipeline = vk::Pipeline::null();
        self.buffers.clear();
        self.push.clear();
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if self.pool == vk::CommandPool::null() {
            return; // moved into a CommandBuffer by finish()
        }
        let d = &self.shared.device;
        // SAFETY: an unfinished recorder's buffer was never submitted.
        unsafe {
            for p in &self.descriptor_pools {
                d.destroy_descriptor_pool(*p, None);
            }
            d.destroy_command_pool(self.pool, None);
        }
    }
}

impl Gpu {
    /// Starts recording a command buffer for `lane`.
    pub fn recorder(&self, lane: Lane) -> Result<Recorder> {
        Recorder::new(self, lane)
    }

    /// Starts recording for `lane` into a command buffer of `spares` that
    /// nothing else holds any more ([`CommandBuffer::is_idle`]: its
    /// submissions completed and were released), taken from the front (the
    /// oldest first). `spares` is the caller's recycling list of finished
    /// buffers of this device and lane, in the order submitted.
    ///
    /// When none of the first few is idle, it makes a new one, as
    /// [`Gpu::recorder`] does, and adds as many empty buffers to `spares` as
    /// it holds (at least one, at most `SPARES_GROWTH`): the list doubles, as
    /// a `Vec`'s capacity does, so a caller that runs further ahead of the
    /// device than before makes new buffers rarely, not at each recording.
    ///
    /// Reusing resets the buffer's command pool and descriptor pools and
    /// keeps its lists' capacity: recording into it allocates nothing on the
    /// Rust heap once the lists have grown to what a recording needs.
    pub fn recorder_reusing(
        &self,
        lane: Lane,
        spares: &mut VecDeque<CommandBuffer>,
    ) -> Result<Recorder> {
        let family = self.shared.plan.lane(lane).family;
        let mut swept = false;
        // A buffer held elsewhere (a graph's, appended to a batch) is moved
        // to the back, so it does not hold up the ones behind it.
        for _ in 0..spares.len().min(4) {
            let Some(front) = spares.front() else { break };
            if !front.is_idle() && !swept {
                // Its submission may have completed without being released yet.
                self.shared.sweep(self.shared.lanes[lane.index()]);
                swept = true;
            }
            let Some(cmd) = spares.pop_front() else { break };
            if !Arc::ptr_eq(&cmd.inner.shared, &self.shared) || cmd.inner.family != family {
                continue; // not this lane's: dropped
            }
            if cmd.is_idle() {
                return Recorder::reuse(self, lane, cmd);
            }
            spares.push_back(cmd);
        }
        for _ in 0..spares.len().clamp(1, SPARES_GROWTH) {
            spares.push_back(Recorder::new(self, lane)?.finish()?);
        }
        Recorder::new(self, lane)
    }
}

impl Recorder {
    fn new(gpu: &Gpu, lane: Lane) -> Result<Recorder> {
        let shared = Arc::clone(&gpu.shared);
        let family = shared.plan.lane(lane).family;
        let info = vk::CommandPoolCreateInfo::default().queue_family_index(family);
        // SAFETY: valid create info for a live device and one of its queue families.
        let pool = unsafe { shared.device.create_command_pool(&info, None) }
            .map_err(call("vkCreateCommandPool"))?;
        // Room for a typical recording, so that one into a spare made ahead
        // of need (`recorder_reusing`) does not grow its lists.
        let scratch = Scratch {
            since_barrier: Vec::with_capacity(2 * INLINE_BINDINGS),
            bound: Bound {
                pipeline: vk::Pipeline::null(),
                buffers: Vec::with_capacity(INLINE_BINDINGS),
                push: Vec::with_capacity(PUSH_ROOM),
            },
        };
        // From here, Drop cleans up the pool.
        let mut r = Recorder::assemble(
            shared,
            lane,
            pool,
            Vec::new(),
            Vec::with_capacity(KEEP_ROOM),
            scratch,
        );
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool is ours and not used by any other thread.
        r.cb = unsafe { r.shared.device.allocate_command_buffers(&alloc) }
            .map_err(call("vkAllocateCommandBuffers"))?[0];
        r.begin()?;
        Ok(r)
    }

    /// Records into `cmd` again (idle, of this device and `lane`'s family:
    /// `Gpu::recorder_reusing` checks): its pools are reset, its lists kept.
    fn reuse(gpu: &Gpu, lane: Lane, cmd: CommandBuffer) -> Result<Recorder> {
        let mut shell = cmd.inner;
        let inner = Arc::get_mut(&mut shell).ok_or_else(|| {
            VkError::InvalidArgument("a command buffer still held elsewhere".into())
        })?;
        let pool = std::mem::replace(&mut inner.pool, vk::CommandPool::null());
        let cb = inner.cb;
        let descriptor_pools = std::mem::take(&mut inner.descriptor_pools);
        let mut keep = std::mem::take(&mut inner.keep);
        keep.clear();
        let scratch = std::mem::take(&mut inner.scratch);
        // From here, Drop cleans up the pool (and the descriptor pools).
        let mut r = Recorder::assemble(
            Arc::clone(&gpu.shared),
            lane,
            pool,
            descriptor_pools,
            keep,
            scratch,
        );
        r.cb = cb;
        r.since_barrier.clear();
        r.bound.clear();
        r.shell = Some(shell);
        let d = &r.shared.device;
        // SAFETY: nothing else holds the buffer (checked above), so none of
        // its submissions is pending; the pools are ours alone. Resetting the
        // command pool returns its buffer to the initial state, resetting a
        // descriptor pool frees its sets, which no buffer uses any more.
        unsafe {
            d.reset_command_pool(r.pool, vk::CommandPoolResetFlags::empty())
                .map_err(call("vkResetCommandPool"))?;
            for p in &r.descriptor_pools {
                d.reset_descriptor_pool(*p, vk::DescriptorPoolResetFlags::empty())
                    .map_err(call("vkResetDescriptorPool"))?;
            }
        }
        r.begin()?;
        Ok(r)
    }

    /// A recorder for `lane` over `pool` (its command buffer still to be
    /// set), with the descriptor pools, keep-alive list and working lists
    /// given (their capacity reused).
    fn assemble(
        shared: Arc<DeviceShared>,
        lane: Lane,
        pool: vk::CommandPool,
        descriptor_pools: Vec<vk::DescriptorPool>,
        keep: Vec<Arc<dyn Send + Sync>>,
        scratch: Scratch,
    ) -> Recorder {
        let q = shared.plan.lane(lane);
        let (family, computes, timestamp_bits) = (
            q.family,
            q.flags.contains(vk::QueueFlags::COMPUTE),
            q.timestamp_valid_bits,
        );
        Recorder {
            shared,
            lane,
            family,
            computes,
            timestamp_bits,
            pool,
            cb: vk::CommandBuffer::null(),
            descriptor_pools,
            pools_used: 0,
            bound: scratch.bound,
            keep,
            since_barrier: scratch.since_barrier,
            wrote: false,
            shell: None,
        }
    }

    /// Begins recording into the command buffer (in the initial state).
    fn begin(&self) -> Result<()> {
        // SIMULTANEOUS_USE: a buffer may be resubmitted while a previous submission
        // of it is still pending (graph replay).
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::SIMULTANEOUS_USE);
        // SAFETY: the buffer is in the initial state (freshly allocated, or its
        // pool was reset) and ours alone.
        unsafe { self.shared.device.begin_command_buffer(self.cb, &begin) }
            .map_err(call("vkBeginCommandBuffer"))
    }

    /// The lane this buffer is recorded for (submit it there).
    pub fn lane(&self) -> Lane {
        self.lane
    }

    fn stages(&self) -> (vk::PipelineStageFlags2, vk::AccessFlags2) {
        if self.computes {
            (
                vk::PipelineStageFlags2::COMPUTE_SHADER | vk::PipelineStageFlags2::TRANSFER,
                vk::AccessFlags2::SHADER_STORAGE_WRITE | vk::AccessFlags2::TRANSFER_WRITE,
            )
        } else {
            (
                vk::PipelineStageFlags2::TRANSFER,
                vk::AccessFlags2::TRANSFER_WRITE,
            )
        }
    }

    /// Inserts a full barrier: every command recorded so far completes, and its
    /// writes are visible, before any command recorded after.
    pub fn barrier(&mut self) {
        let (stages, writes) = self.stages();
        let reads = if self.computes {
            vk::AccessFlags2::SHADER_STORAGE_READ | vk::AccessFlags2::TRANSFER_READ
        } else {
            vk::AccessFlags2::TRANSFER_READ
        };
        let barrier = [vk::MemoryBarrier2::default()
            .src_stage_mask(stages)
            .src_access_mask(writes)
            .dst_stage_mask(stages)
            .dst_access_mask(reads | writes)];
        let dep = vk::DependencyInfo::default().memory_barriers(&barrier);
        self.shared.cmd_pipeline_barrier2(self.cb, &dep);
        self.since_barrier.clear();
    }

    /// Orders `accesses` after every conflicting access recorded since the last barrier.
    fn hazard(&mut self, accesses: &[Access]) {
        let conflict = accesses
            .iter()
            .any(|a| self.since_barrier.iter().any(|b| a.conflicts(b)));
        if conflict {
            self.barrier();
        }
        self.since_barrier.extend_from_slice(accesses);
        self.wrote |= accesses.iter().any(|a| a.write);
    }

    fn own(&self, chunk: &Chunk) -> Result<()> {
        chunk.same_device(&self.shared)
    }

    /// Records a dispatch of `groups` workgroups. `buffers[i]` = (chunk, offset,
    /// range) binds storage buffer `i`; offsets must be multiples of
    /// `minStorageBufferOffsetAlignment`. `push_constants` must be exactly the
    /// pipeline's push-constant size.
    ///
    /// A dispatch with a zero group count records nothing (Vulkan runs no
    /// invocations for it) after its arguments are checked.
    pub fn dispatch(
        &mut self,
        pipeline: &Pipeline,
        buffers: &[(&Chunk, u64, u64)],
        push_constants: &[u8],
        groups: [u32; 3],
    ) -> Result<()> {
        let s = Arc::clone(&self.shared);
        if !self.computes {
            return Err(VkError::InvalidArgument(format!(
                "dispatch on the {:?} lane, whose queue family cannot run compute work; record it on Lane::Compute",
                self.lane
            )));
        }
        let p = &pipeline.inner;
        if !Arc::ptr_eq(&p.shared, &s) {
            return Err(VkError::ForeignObject { what: "a pipeline" });
        }
        if p.params_layout != vk::DescriptorSetLayout::null() {
            return Err(VkError::InvalidArgument(
                "a graph variant pipeline: record it with dispatch_bound".into(),
            ));
        }
        if push_constants.len() != p.push_constant_bytes as usize {
            return Err(VkError::InvalidArgument(format!(
                "dispatch with {} push-constant bytes, the pipeline takes {}",
                push_constants.len(),
                p.push_constant_bytes
            )));
        }
        let accesses = dispatch_accesses(&s, p, groups, buffers)?;
        if groups.contains(&0) {
            return Ok(());
        }
        self.hazard(&accesses);

        let d = &s.device;
        // What this dispatch binds that the last one did not.
        let new_pipeline = self.bound.pipeline != p.pipeline;
        let same_buffers = !new_pipeline && self.binds_the_same(buffers);
        let same_push = !new_pipeline && self.bound.push == push_constants;
        if new_pipeline {
            self.bind_pipeline(pipeline);
        }
        if !same_buffers {
            self.bound.buffers.clear();
            self.bound
                .buffers
                .extend(buffers.iter().map(|(c, o, r)| (c.inner.buffer, *o, *r)));
            for (c, _, _) in buffers {
                self.keep.push(Arc::clone(&c.inner) as Arc<dyn Send + Sync>);
            }
        }
        if !same_push {
            self.bound.push.clear();
            self.bound.push.extend_from_slice(push_constants);
        }
        let infos = buffer_infos(buffers);
        let set = if same_buffers || p.push_descriptors || p.bindings == 0 {
            vk::DescriptorSet::null()
        } else {
            self.allocate_set(p.set_layout, p.bindings)?
        };
        let writes = storage_writes(&infos, set);
        // SAFETY: the buffer is recording and ours; the pipeline, layout, set and
        // buffers are live objects of this device, kept alive with this buffer; the
        // bindings and push-constant size match the layout (checked above).
        unsafe {
            if p.bindings > 0 && !same_buffers {
                match (&s.push_descriptor, p.push_descriptors) {
                    (Some(push), true) => push.cmd_push_descriptor_set(
                        self.cb,
                        vk::PipelineBindPoint::COMPUTE,
                        p.layout,
                        0,
                        &writes,
                    ),
                    _ => {
                        d.update_descriptor_sets(&writes, &[]);
                        d.cmd_bind_descriptor_sets(
                            self.cb,
                            vk::PipelineBindPoint::COMPUTE,
                            p.layout,
                            0,
                            &[set],
                            &[],
                        );
                    }
                }
            }
            if !push_constants.is_empty() && !same_push {
                d.cmd_push_constants(
                    self.cb,
                    p.layout,
                    vk::ShaderStageFlags::COMPUTE,
                    0,
                    push_constants,
                );
            }
            d.cmd_dispatch(self.cb, groups[0], groups[1], groups[2]);
        }
        Ok(())
    }

    /// Records a dispatch of graph variant `pipeline` (see
    /// [`Pipeline::graph_variant`]) over `groups` workgroups, its parameters
    /// read from slot `slot` of `params`, which stays outside the command
    /// buffer: [`ParamBlock::write`] changes what the recorded dispatch reads
    /// without recording it again.
    ///
    /// Its buffers: where the pipeline's set 0 is update-after-bind
    /// ([`Pipeline::rebinds_after_recording`]), through a set allocated from
    /// `sets` (required then), which [`GraphSets::write`] can later point at
    /// other buffers, again without recording; else as [`Recorder::dispatch`]
    /// binds them, in the command buffer. The set allocated (`None` when the
    /// buffers are in the command buffer or a zero group count recorded
    /// nothing).
    pub fn dispatch_bound(
        &mut self,
        pipeline: &Pipeline,
        sets: Option<&GraphSets>,
        buffers: &[(&Chunk, u64, u64)],
        params: &ParamBlock,
        slot: u32,
        groups: [u32; 3],
    ) -> Result<Option<SetId>> {
        let s = Arc::clone(&self.shared);
        if !self.computes {
            return Err(VkError::InvalidArgument(format!(
                "dispatch on the {:?} lane, whose queue family cannot run compute work; record it on Lane::Compute",
                self.lane
            )));
        }
        let p = &pipeline.inner;
        if !Arc::ptr_eq(&p.shared, &s)
            || !Arc::ptr_eq(&params.inner.shared, &s)
            || sets.is_some_and(|g| !Arc::ptr_eq(&g.inner.shared, &s))
        {
            return Err(VkError::ForeignObject {
                what: "a pipeline, set pool or parameter block",
            });
        }
        if p.params_layout == vk::DescriptorSetLayout::null() {
            return Err(VkError::InvalidArgument(
                "dispatch_bound needs a graph variant pipeline (Pipeline::graph_variant)".into(),
            ));
        }
        if p.update_after_bind && sets.is_none() {
            return Err(VkError::InvalidArgument(
                "the pipeline binds its buffers from update-after-bind sets: pass a GraphSets"
                    .into(),
            ));
        }
        if p.param_bytes > params.inner.bytes {
            return Err(VkError::InvalidArgument(format!(
                "the pipeline reads {} parameter bytes, the block's slots hold {}",
                p.param_bytes, params.inner.bytes
            )));
        }
        let offset = params.offset(slot)?;
        let accesses = dispatch_accesses(&s, p, groups, buffers)?;
        if groups.contains(&0) {
            return Ok(None);
        }
        let d = &s.device;
        // Set 0: from `sets`, or recorded here unless the last dispatch bound
        // the same pipeline and buffers (a graph's nodes often do: then only
        // set 1's offset is bound again).
        let new_pipeline = self.bound.pipeline != p.pipeline;
        let same_buffers = !new_pipeline && self.binds_the_same(buffers);
        let (set, set0) = match sets.filter(|_| p.update_after_bind) {
            Some(g) => {
                let id = g.allocate(pipeline)?;
                g.write(id, pipeline, buffers)?;
                self.keep.push(Arc::clone(&g.inner) as Arc<dyn Send + Sync>);
                (Some(id), g.handle(id))
            }
            None if same_buffers || p.push_descriptors || p.bindings == 0 => {
                (None, vk::DescriptorSet::null())
            }
            None => (None, self.allocate_set(p.set_layout, p.bindings)?),
        };
        self.hazard(&accesses);
        if new_pipeline {
            self.bind_pipeline(pipeline);
        }
        // Push constants an ordinary dispatch bound are gone; set 0's buffers
        // are what an unchanged next node may skip binding (not a set of
        // `sets`: each node binds its own).
        self.bound.push.clear();
        self.bound.buffers.clear();
        if set.is_none() {
            self.bound
                .buffers
                .extend(buffers.iter().map(|(c, o, r)| (c.inner.buffer, *o, *r)));
            if !same_buffers {
                for (c, _, _) in buffers {
                    self.keep.push(Arc::clone(&c.inner) as Arc<dyn Send + Sync>);
                }
            }
        }
        if p.reads_params {
            self.keep
                .push(Arc::clone(&params.inner) as Arc<dyn Send + Sync>);
        }
        let infos = buffer_infos(buffers);
        let writes = storage_writes(&infos, set0);
        // SAFETY: the buffer is recording and ours; the pipeline, its layout,
        // the sets and buffers are live objects of this device kept alive with
        // this buffer (a `GraphSets` keeps the buffers its sets name); set 0
        // was allocated with the pipeline's set layout (or is pushed, with the
        // extension enabled), set 1 with one identically defined to its set 1
        // (one dynamic storage buffer), whose dynamic offset is a multiple of
        // the alignment within the block (`ParamBlock::offset`).
        unsafe {
            if set.is_none() && p.bindings > 0 && !same_buffers {
                match (&s.push_descriptor, p.push_descriptors) {
                    (Some(push), true) => push.cmd_push_descriptor_set(
                        self.cb,
                        vk::PipelineBindPoint::COMPUTE,
                        p.layout,
                        0,
                        &writes,
                    ),
                    _ => d.update_descriptor_sets(&writes, &[]),
                }
            }
            // Set 1 only where the shader reads it (binding a set costs on
            // some drivers: about 0.1 µs a dispatch on lavapipe).
            match (set0 != vk::DescriptorSet::null(), p.reads_params) {
                (true, true) => d.cmd_bind_descriptor_sets(
                    self.cb,
                    vk::PipelineBindPoint::COMPUTE,
                    p.layout,
                    0,
                    &[set0, params.inner.set],
                    &[offset],
                ),
                (false, true) => d.cmd_bind_descriptor_sets(
                    self.cb,
                    vk::PipelineBindPoint::COMPUTE,
                    p.layout,
                    1,
                    &[params.inner.set],
                    &[offset],
                ),
                (true, false) => d.cmd_bind_descriptor_sets(
                    self.cb,
                    vk::PipelineBindPoint::COMPUTE,
                    p.layout,
                    0,
                    &[set0],
                    &[],
                ),
                (false, false) => {}
            }
            d.cmd_dispatch(self.cb, groups[0], groups[1], groups[2]);
        }
        Ok(set)
    }

    /// A descriptor set from this buffer's pools (the path without push descriptors).
    fn allocate_set(
        &mut self,
        layout: vk::DescriptorSetLayout,
        bindings: u32,
    ) -> Result<vk::DescriptorSet> {
        let d = &self.shared.device;
        let layouts = [layout];
        // The pool in use, then those reset for reuse, in order.
        loop {
            if let Some(&pool) = self
                .pools_used
                .checked_sub(1)
                .and_then(|i| self.descriptor_pools.get(i))
            {
                let info = vk::DescriptorSetAllocateInfo::default()
                    .descriptor_pool(pool)
                    .set_layouts(&layouts);
                // SAFETY: the pool is ours (externally synchronised by &mut self).
                match unsafe { d.allocate_descriptor_sets(&info) } {
                    Ok(sets) => return Ok(sets[0]),
                    Err(
                        vk::Result::ERROR_OUT_OF_POOL_MEMORY | vk::Result::ERROR_FRAGMENTED_POOL,
                    ) => {}
                    Err(e) => return Err(call("vkAllocateDescriptorSets")(e)),
                }
            }
            if self.pools_used == self.descriptor_pools.len() {
                break;
            }
            self.pools_used += 1;
        }
        let sizes = [vk::DescriptorPoolSize::default()
            .ty(vk::DescriptorType::STORAGE_BUFFER)
            .descriptor_count(SETS_PER_POOL * bindings.max(8))];
        let info = vk::DescriptorPoolCreateInfo::default()
            .max_sets(SETS_PER_POOL)
            .pool_sizes(&sizes);
        // SAFETY: valid create info for a live device.
        let pool = unsafe { d.create_descriptor_pool(&info, None) }
            .map_err(call("vkCreateDescriptorPool"))?;
        self.descriptor_pools.push(pool);
        self.pools_used = self.descriptor_pools.len();
        let info = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(pool)
            .set_layouts(&layouts);
        // SAFETY: a fresh pool sized for at least one set of this layout.
        let sets = unsafe { d.allocate_descriptor_sets(&info) }
            .map_err(call("vkAllocateDescriptorSets"))?;
        Ok(sets[0])
    }

    /// Records a copy of `len` bytes from `src` at `src_offset` to `dst` at
    /// `dst_offset`. A zero-length copy records nothing; overlapping ranges of one
    /// chunk are an error (Vulkan forbids them).
    pub fn copy(
        &mut self,
        src: &Chunk,
        src_offset: u64,
        dst: &Chunk,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        self.own(src)?;
        self.own(dst)?;
        src.check_range("copy source", src_offset, len)?;
        dst.check_range("copy destination", dst_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        if src.inner.buffer == dst.inner.buffer
            && src_offset < dst_offset + len
            && dst_offset < src_offset + len
        {
            return Err(VkError::InvalidArgument(format!(
                "copy within one chunk from {src_offset} to {dst_offset} of {len} bytes overlaps; \
                 copy through a second chunk"
            )));
        }
        self.hazard(&[
            Access {
                buffer: src.inner.buffer,
                start: src_offset,
                end: src_offset + len,
                write: false,
            },
            Access {
                buffer: dst.inner.buffer,
                start: dst_offset,
                end: dst_offset + len,
                write: true,
            },
        ]);
        let region = [vk::BufferCopy::default()
            .src_offset(src_offset)
            .dst_offset(dst_offset)
            .size(len)];
        // SAFETY: recording buffer of ours; both buffers are live, kept alive with
        // this command buffer, and the ranges are in bounds and disjoint (checked).
        unsafe {
            self.shared
                .device
                .cmd_copy_buffer(self.cb, src.inner.buffer, dst.inner.buffer, &region)
        };
        self.keep
            .push(Arc::clone(&src.inner) as Arc<dyn Send + Sync>);
        self.keep
            .push(Arc::clone(&dst.inner) as Arc<dyn Send + Sync>);
        Ok(())
    }

    /// Records a fill of `len` bytes of `dst` at `offset` with the 32-bit `value`
    /// repeated. Offset and length must be multiples of 4; a zero length records nothing.
    pub fn fill(&mut self, dst: &Chunk, offset: u64, len: u64, value: u32) -> Result<()> {
        self.own(dst)?;
        dst.check_range("fill", offset, len)?;
        if !offset.is_multiple_of(4) || !len.is_multiple_of(4) {
            return Err(VkError::InvalidArgument(format!(
                "fill of {len} bytes at {offset}: offset and length must be multiples of 4 (it writes u32 words)"
            )));
        }
        if len == 0 {
            return Ok(());
        }
        self.hazard(&[Access {
            buffer: dst.inner.buffer,
            start: offset,
            end: offset + len,
            write: true,
        }]);
        // SAFETY: recording buffer of ours; the buffer is live, kept alive with this
        // command buffer; the range is in bounds and 4-aligned (checked).
        unsafe {
            self.shared
                .device
                .cmd_fill_buffer(self.cb, dst.inner.buffer, offset, len, value)
        };
        self.keep
            .push(Arc::clone(&dst.inner) as Arc<dyn Send + Sync>);
        Ok(())
    }

    /// Records a timestamp into `pool` at `query`, written when every earlier command
    /// completes. The query is reset in the command buffer first, so a buffer with
    /// timestamps can be resubmitted (each run overwrites them).
    pub fn timestamp(&mut self, pool: &QueryPool, query: u32) -> Result<()> {
        if !Arc::ptr_eq(&pool.inner.shared, &self.shared) {
            return Err(VkError::ForeignObject {
                what: "a query pool",
            });
        }
        if self.timestamp_bits == 0 {
            return Err(VkError::Unsupported {
                device: self.shared.name(),
                what: "timestamps on this lane's queue family (timestampValidBits is 0)",
            });
        }
        if !self.computes {
            return Err(VkError::Unsupported {
                device: self.shared.name(),
                what: "timestamps on a transfer-only queue (vkCmdResetQueryPool needs a compute queue)",
            });
        }
        if query >= pool.inner.count {
            return Err(VkError::InvalidArgument(format!(
                "timestamp query {query} of a pool of {}",
                pool.inner.count
            )));
        }
        // SAFETY: recording buffer of ours; the pool is live, kept alive with this
        // command buffer, and `query` is in range.
        unsafe {
            self.shared
                .device
                .cmd_reset_query_pool(self.cb, pool.inner.pool, query, 1)
        };
        self.shared
            .cmd_write_timestamp2(self.cb, pool.inner.pool, query);
        self.keep
            .push(Arc::clone(&pool.inner) as Arc<dyn Send + Sync>);
        Ok(())
    }

    /// Ends recording. The buffer makes its writes visible to the host when it completes.
    pub fn finish(mut self) -> Result<CommandBuffer> {
        if self.wrote {
            let (stages, writes) = self.stages();
            let barrier = [vk::MemoryBarrier2::default()
                .src_stage_mask(stages)
                .src_access_mask(writes)
                .dst_stage_mask(vk::PipelineStageFlags2::HOST)
                .dst_access_mask(vk::AccessFlags2::HOST_READ)];
            let dep = vk::DependencyInfo::default().memory_barriers(&barrier);
            self.shared.cmd_pipeline_barrier2(self.cb, &dep);
        }
        // SAFETY: the buffer is in the recording state and ours.
        unsafe { self.shared.device.end_command_buffer(self.cb) }
            .map_err(call("vkEndCommandBuffer"))?;
        let mut scratch = Scratch {
            since_barrier: std::mem::take(&mut self.since_barrier),
            bound: std::mem::take(&mut self.bound),
        };
        scratch.since_barrier.clear();
        scratch.bound.clear();
        let inner = CommandBufferInner {
            shared: Arc::clone(&self.shared),
            family: self.family,
            pool: std::mem::replace(&mut self.pool, vk::CommandPool::null()),
            cb: self.cb,
            descriptor_pools: std::mem::take(&mut self.descriptor_pools),
            keep: std::mem::take(&mut self.keep),
            scratch,
        };
        let inner = match self.shell.take() {
            Some(mut shell) => {
                // The old contents (a null pool, empty lists) drop here.
                *Arc::get_mut(&mut shell).expect("a recorder holds its shell alone") = inner;
                shell
            }
            None => Arc::new(inner),
        };
        Ok(CommandBuffer { inner })
    }
}

impl Recorder {
    /// Whether the last dispatch bound exactly `buffers` (same buffers,
    /// offsets and ranges, in order).
    fn binds_the_same(&self, buffers: &[(&Chunk, u64, u64)]) -> bool {
        self.bound.buffers.len() == buffers.len()
            && self
                .bound
                .buffers
                .iter()
                .zip(buffers)
                .all(|(b, (c, o, r))| *b == (c.inner.buffer, *o, *r))
    }

    /// Binds `pipeline` and keeps it alive with this buffer.
    fn bind_pipeline(&mut self, pipeline: &Pipeline) {
        let p = &pipeline.inner;
        // SAFETY: the buffer is recording and ours; the pipeline is live and
        // kept alive with this buffer (below).
        unsafe {
            p.shared
                .device
                .cmd_bind_pipeline(self.cb, vk::PipelineBindPoint::COMPUTE, p.pipeline)
        };
        self.bound.pipeline = p.pipeline;
        self.keep
            .push(Arc::clone(&pipeline.inner) as Arc<dyn Send + Sync>);
    }
}

/// The checks every dispatch makes: `groups` within the device's limits and
/// `buffers` matching the pipeline's bindings; what the dispatch touches.
fn dispatch_accesses(
    s: &Arc<DeviceShared>,
    p: &crate::pipeline::PipelineInner,
    groups: [u32; 3],
    buffers: &[(&Chunk, u64, u64)],
) -> Result<PerBinding<Access>, VkError> {
    let limits = &s.info.limits;
    for (i, (g, max)) in groups
        .iter()
        .zip(limits.max_compute_work_group_count)
        .enumerate()
    {
        if *g > max {
            return Err(VkError::InvalidArgument(format!(
                "dispatch of {groups:?} groups: dimension {i} exceeds maxComputeWorkGroupCount {:?}; \
                 split the dispatch",
                limits.max_compute_work_group_count
            )));
        }
    }
    Ok(check_buffers(s, p, buffers)?
        .into_iter()
        .map(|(buffer, start, end)| Access {
            buffer,
            start,
            end,
            write: true,
        })
        .collect())
}
