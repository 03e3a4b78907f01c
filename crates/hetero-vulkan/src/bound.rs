//! What a recorded dispatch reads from outside its command buffer, so that it
//! can change without recording again: [`GraphSets`], descriptor sets of
//! storage buffers from update-after-bind pools, rewritten with
//! `vkUpdateDescriptorSets` (on devices with Vulkan 1.2's
//! `descriptorBindingStorageBufferUpdateAfterBind`; lavapipe has none);
//! [`ParamBlock`], host-visible memory with one
//! parameter slot per dispatch, rewritten with a memcpy, which a graph
//! variant pipeline ([`crate::Pipeline::graph_variant`]) reads where the
//! plain one takes push constants.
//!
//! Invariant, the caller's: neither is written while a submitted command
//! buffer that reads the set or slot is pending (the spec forbids it even
//! for update-after-bind descriptors that the pending work uses); command
//! buffers hold both by `Arc`, so they live while any is pending.

use std::sync::{Arc, Mutex};

use ash::vk;

use crate::device::{lock, DeviceShared, Gpu};
use crate::error::{call, Result, VkError};
use crate::memory::{Chunk, MemoryUse};
use crate::pipeline::Pipeline;

/// Descriptor sets per update-after-bind pool.
const SETS_PER_POOL: u32 = 64;

/// A set allocated from a [`GraphSets`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetId(usize);

/// A set, with the chunks its descriptors name now (kept alive with it).
type Named = (vk::DescriptorSet, Vec<Arc<dyn Send + Sync>>);

pub(crate) struct GraphSetsInner {
    pub(crate) shared: Arc<DeviceShared>,
    pools: Mutex<Vec<vk::DescriptorPool>>,
    /// Each set with the chunks its descriptors name now.
    sets: Mutex<Vec<Named>>,
}

impl Drop for GraphSetsInner {
    fn drop(&mut self) {
        let d = &self.shared.device;
        // SAFETY: command buffers that bind these sets hold this struct by
        // Arc, so none is pending; destroying a pool frees its sets.
        unsafe {
            for p in lock(&self.pools).iter() {
                d.destroy_descriptor_pool(*p, None);
            }
        }
    }
}

/// Descriptor sets for graph variant pipelines, from update-after-bind pools.
#[derive(Clone)]
pub struct GraphSets {
    pub(crate) inner: Arc<GraphSetsInner>,
}

impl GraphSets {
    /// An empty set of sets (pools are made as sets are allocated).
    pub fn new(gpu: &Gpu) -> GraphSets {
        GraphSets {
            inner: Arc::new(GraphSetsInner {
                shared: Arc::clone(&gpu.shared),
                pools: Mutex::new(Vec::new()),
                sets: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Sets allocated so far.
    pub fn len(&self) -> usize {
        lock(&self.inner.sets).len()
    }

    /// Whether none was allocated.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn handle(&self, id: SetId) -> vk::DescriptorSet {
        lock(&self.inner.sets)[id.0].0
    }

    /// A set for `pipeline`'s set 0 (an update-after-bind one).
    pub(crate) fn allocate(&self, pipeline: &Pipeline) -> Result<SetId> {
        if !pipeline.inner.update_after_bind {
            return Err(VkError::InvalidArgument(
                "the pipeline's set 0 is not update-after-bind (Pipeline::rebinds_after_recording)"
                    .into(),
            ));
        }
        let s = &self.inner.shared;
        let d = &s.device;
        let layouts = [pipeline.inner.set_layout];
        let mut pools = lock(&self.inner.pools);
        let mut got = None;
        if let Some(&pool) = pools.last() {
            let info = vk::DescriptorSetAllocateInfo::default()
                .descriptor_pool(pool)
                .set_layouts(&layouts);
            // SAFETY: the pool is ours, used under its mutex.
            match unsafe { d.allocate_descriptor_sets(&info) } {
                Ok(sets) => got = Some(sets[0]),
                Err(vk::Result::ERROR_OUT_OF_POOL_MEMORY | vk::Result::ERROR_FRAGMENTED_POOL) => {}
                Err(e) => return Err(call("vkAllocateDescriptorSets")(e)),
            }
        }
        let set = match got {
            Some(set) => set,
            None => {
                let sizes = [vk::DescriptorPoolSize::default()
                    .ty(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(SETS_PER_POOL * pipeline.inner.bindings.max(8))];
                let info = vk::DescriptorPoolCreateInfo::default()
                    .flags(vk::DescriptorPoolCreateFlags::UPDATE_AFTER_BIND)
                    .max_sets(SETS_PER_POOL)
                    .pool_sizes(&sizes);
                // SAFETY: valid create info for a live device that has the
                // update-after-bind feature enabled (a graph variant exists).
                let pool = unsafe { d.create_descriptor_pool(&info, None) }
                    .map_err(call("vkCreateDescriptorPool"))?;
                pools.push(pool);
                let info = vk::DescriptorSetAllocateInfo::default()
                    .descriptor_pool(pool)
                    .set_layouts(&layouts);
                // SAFETY: a fresh pool sized for at least one set of this layout.
                unsafe { d.allocate_descriptor_sets(&info) }
                    .map_err(call("vkAllocateDescriptorSets"))?[0]
            }
        };
        let mut sets = lock(&self.inner.sets);
        sets.push((set, Vec::new()));
        Ok(SetId(sets.len() - 1))
    }

    /// Points set `id` (allocated for `pipeline`) at `buffers` (chunk,
    /// offset, range), checked as a dispatch checks them. The caller makes
    /// sure no pending command buffer reads the set.
    pub fn write(
        &self,
        id: SetId,
        pipeline: &Pipeline,
        buffers: &[(&Chunk, u64, u64)],
    ) -> Result<()> {
        let s = &self.inner.shared;
        if !Arc::ptr_eq(&pipeline.inner.shared, s) {
            return Err(VkError::ForeignObject { what: "a pipeline" });
        }
        if !pipeline.inner.update_after_bind {
            return Err(VkError::InvalidArgument(
                "the pipeline's set 0 is not update-after-bind (Pipeline::rebinds_after_recording)"
                    .into(),
            ));
        }
        crate::pipeline::check_buffers(s, &pipeline.inner, buffers)?;
        let mut sets = lock(&self.inner.sets);
        let Some((set, keep)) = sets.get_mut(id.0) else {
            return Err(VkError::InvalidArgument(format!(
                "set {} of a pool that allocated {}",
                id.0,
                sets.len()
            )));
        };
        let infos = crate::pipeline::buffer_infos(buffers);
        let writes = crate::pipeline::storage_writes(&infos, *set);
        // SAFETY: the set is live and ours (under its mutex); its bindings
        // are update-after-bind, so rewriting them leaves the command buffers
        // that bind it valid; the caller guarantees none is pending; the
        // buffers are live and kept alive with the set (below).
        unsafe { s.device.update_descriptor_sets(&writes, &[]) };
        keep.clear();
        keep.extend(
            buffers
                .iter()
                .map(|(c, _, _)| Arc::clone(&c.inner) as Arc<dyn Send + Sync>),
        );
        Ok(())
    }
}

pub(crate) struct ParamBlockInner {
    pub(crate) shared: Arc<DeviceShared>,
    chunk: Chunk,
    layout: vk::DescriptorSetLayout,
    pool: vk::DescriptorPool,
    pub(crate) set: vk::DescriptorSet,
    /// Bytes each slot holds, and the distance between slots (a multiple of
    /// minStorageBufferOffsetAlignment, as a dynamic offset must be).
    pub(crate) bytes: u32,
    stride: u64,
    slots: u32,
}

impl Drop for ParamBlockInner {
    fn drop(&mut self) {
        let d = &self.shared.device;
        // SAFETY: command buffers that read the block hold this struct by
        // Arc, so none is pending; the pool frees its set.
        unsafe {
            d.destroy_descriptor_pool(self.pool, None);
            d.destroy_descriptor_set_layout(self.layout, None);
        }
    }
}

/// Host-visible parameter slots that graph variant dispatches read (set 1).
#[derive(Clone)]
pub struct ParamBlock {
    pub(crate) inner: Arc<ParamBlockInner>,
}

impl ParamBlock {
    /// `slots` slots of `bytes` bytes each, zeroed.
    pub fn new(gpu: &Gpu, slots: u32, bytes: u32) -> Result<ParamBlock> {
        let shared = Arc::clone(&gpu.shared);
        let align = shared
            .info
            .limits
            .min_storage_buffer_offset_alignment
            .max(4);
        let bytes = bytes.max(4);
        let stride = u64::from(bytes).div_ceil(align) * align;
        let chunk = Chunk::new(gpu, stride * u64::from(slots.max(1)), MemoryUse::Upload)?;
        chunk.write(0, &vec![0; chunk.size() as usize])?;
        let d = &shared.device;
        let b = [vk::DescriptorSetLayoutBinding::default()
            .binding(0)
            .descriptor_type(vk::DescriptorType::STORAGE_BUFFER_DYNAMIC)
            .descriptor_count(1)
            .stage_flags(vk::ShaderStageFlags::COMPUTE)];
        let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&b);
        // SAFETY: valid create info for a live device.
        let layout = unsafe { d.create_descriptor_set_layout(&info, None) }
            .map_err(call("vkCreateDescriptorSetLayout"))?;
        let sizes = [vk::DescriptorPoolSize::default()
            .ty(vk::DescriptorType::STORAGE_BUFFER_DYNAMIC)
            .descriptor_count(1)];
        let info = vk::DescriptorPoolCreateInfo::default()
            .max_sets(1)
            .pool_sizes(&sizes);
        // SAFETY: valid create info for a live device.
        let pool = match unsafe { d.create_descriptor_pool(&info, None) } {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: just created, unused.
                unsafe { d.destroy_descriptor_set_layout(layout, None) };
                return Err(call("vkCreateDescriptorPool")(e));
            }
        };
        // From here, Drop cleans up.
        let mut inner = ParamBlockInner {
            shared: Arc::clone(&shared),
            chunk,
            layout,
            pool,
            set: vk::DescriptorSet::null(),
            bytes,
            stride,
            slots,
        };
        let layouts = [layout];
        let info = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(pool)
            .set_layouts(&layouts);
        // SAFETY: a fresh pool sized for this one set.
        inner.set = unsafe { d.allocate_descriptor_sets(&info) }
            .map_err(call("vkAllocateDescriptorSets"))?[0];
        let buffer = [vk::DescriptorBufferInfo::default()
            .buffer(inner.chunk.inner.buffer)
            .offset(0)
            .range(u64::from(bytes))];
        let write = [vk::WriteDescriptorSet::default()
            .dst_set(inner.set)
            .dst_binding(0)
            .descriptor_type(vk::DescriptorType::STORAGE_BUFFER_DYNAMIC)
            .buffer_info(&buffer)];
        // SAFETY: the set was just allocated and is bound by no command buffer;
        // the chunk lives with it.
        unsafe { d.update_descriptor_sets(&write, &[]) };
        Ok(ParamBlock {
            inner: Arc::new(inner),
        })
    }

    /// The dynamic offset of slot `slot`.
    pub(crate) fn offset(&self, slot: u32) -> Result<u32> {
        let i = &self.inner;
        if slot >= i.slots {
            return Err(VkError::InvalidArgument(format!(
                "parameter slot {slot} of a block of {}",
                i.slots
            )));
        }
        u32::try_from(u64::from(slot) * i.stride).map_err(|_| {
            VkError::InvalidArgument(format!("parameter slot {slot}: its offset passes 4 GiB"))
        })
    }

    /// Writes `data` (at most the slot's bytes) at the start of slot
    /// `slot`. The caller makes sure no pending command buffer reads it.
    pub fn write(&self, slot: u32, data: &[u8]) -> Result<()> {
        let at = self.offset(slot)?;
        if data.len() > self.inner.bytes as usize {
            return Err(VkError::InvalidArgument(format!(
                "{} parameter bytes, a slot holds {}",
                data.len(),
                self.inner.bytes
            )));
        }
        self.inner.chunk.write(u64::from(at), data)
    }
}
