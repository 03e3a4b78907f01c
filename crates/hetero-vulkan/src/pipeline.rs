//! Compute pipelines: a shader module, a set layout of `n` storage buffers at set 0
//! (bindings 0..n), a push-constant range, built through the device's pipeline
//! cache. The set layout is a push-descriptor layout when VK_KHR_push_descriptor is
//! in use; otherwise recording allocates descriptor sets from pools.
//!
//! A *graph variant* ([`Pipeline::graph_variant`]) reads what would be its push
//! constants from memory instead: the shader's push-constant block becomes a
//! storage buffer at set 1, binding 0 ([`crate::params_from_memory`]), bound
//! as a dynamic storage buffer (one per parameter slot, [`crate::ParamBlock`]),
//! and set 0 is an update-after-bind layout ([`crate::GraphSets`]): a
//! recorded dispatch's buffers and scalars then change without recording it
//! again.

use std::sync::Arc;

use ash::vk;
use smallvec::SmallVec;

use crate::device::{DeviceShared, Gpu};
use crate::error::{call, Result, VkError};
use crate::kernel::check_spirv;
use crate::memory::Chunk;

pub(crate) struct PipelineInner {
    pub(crate) shared: Arc<DeviceShared>,
    pub(crate) pipeline: vk::Pipeline,
    pub(crate) layout: vk::PipelineLayout,
    pub(crate) set_layout: vk::DescriptorSetLayout,
    pub(crate) bindings: u32,
    pub(crate) push_constant_bytes: u32,
    /// A graph variant's parameter bytes (read from set 1); 0 for the others.
    pub(crate) param_bytes: u32,
    pub(crate) push_descriptors: bool,
    /// A graph variant whose shader reads its parameters (set 1).
    pub(crate) reads_params: bool,
    /// Set 0 is update-after-bind (a graph variant on a device with the feature).
    pub(crate) update_after_bind: bool,
    /// A graph variant's set 1 (its parameters); null for the others.
    pub(crate) params_layout: vk::DescriptorSetLayout,
    /// Per binding: the least bytes the shader's type spans (0: any).
    pub(crate) min_bytes: Vec<u64>,
}

impl Drop for PipelineInner {
    fn drop(&mut self) {
        let d = &self.shared.device;
        // SAFETY: pending command buffers hold this struct by Arc, so nothing uses
        // these objects any more; each was created from this device.
        unsafe {
            d.destroy_pipeline(self.pipeline, None);
            d.destroy_pipeline_layout(self.layout, None);
            d.destroy_descriptor_set_layout(self.set_layout, None);
            if self.params_layout != vk::DescriptorSetLayout::null() {
                d.destroy_descriptor_set_layout(self.params_layout, None);
            }
        }
    }
}

/// A compute pipeline for one entry point.
///
/// ```no_run
/// # use hetero_vulkan::{Instance, Gpu, Pipeline, compile_wgsl};
/// let gpu = Gpu::open(&Instance::load()?, 0)?;
/// let words = compile_wgsl("@group(0) @binding(0) var<storage, read_write> v: array<u32>;
///     @compute @workgroup_size(64) fn main(@builtin(global_invocation_id) i: vec3<u32>) { v[i.x] = 1u; }", "main")?;
/// let pipeline = Pipeline::new(&gpu, &words, "main", 1, 0)?;
/// # Ok::<(), hetero_vulkan::VkError>(())
/// ```
#[derive(Clone)]
pub struct Pipeline {
    pub(crate) inner: Arc<PipelineInner>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("bindings", &self.inner.bindings)
            .field("push_constant_bytes", &self.inner.push_constant_bytes)
            .field("push_descriptors", &self.inner.push_descriptors)
            .finish()
    }
}

impl Pipeline {
    /// Builds a compute pipeline from SPIR-V words. `bindings` storage buffers sit at
    /// set 0, bindings `0..bindings`; `push_constant_bytes` (a multiple of 4, at most
    /// `maxPushConstantsSize`) are pushed at offset 0.
    ///
    /// The words are checked structurally first ([`crate::check_spirv`]): garbage is
    /// [`VkError::InvalidSpirv`], never a driver crash.
    pub fn new(
        gpu: &Gpu,
        spirv: &[u32],
        entry: &str,
        bindings: u32,
        push_constant_bytes: u32,
    ) -> Result<Pipeline> {
        Self::build(gpu, spirv, entry, bindings, push_constant_bytes, false)
    }

    /// The graph variant of the pipeline [`Pipeline::new`] builds from the
    /// same arguments: its shader reads the `param_bytes` it would take as
    /// push constants from a storage buffer at set 1, binding 0 (a
    /// [`crate::ParamBlock`] slot). Where the device has
    /// `descriptorBindingStorageBufferUpdateAfterBind`
    /// ([`Gpu::supports_update_after_bind`]) its set 0 is bound from
    /// [`crate::GraphSets`], whose descriptors can be rewritten after a
    /// command buffer recorded them; elsewhere its buffers are recorded in
    /// the command buffer as [`Pipeline::new`]'s are.
    pub fn graph_variant(
        gpu: &Gpu,
        spirv: &[u32],
        entry: &str,
        bindings: u32,
        param_bytes: u32,
    ) -> Result<Pipeline> {
        check_spirv(spirv, entry)?;
        let words = crate::kernel::params_from_memory(spirv)?;
        // The rewrite adds two decorations exactly when the shader has
        // push constants: one without reads no parameters, and a dispatch of
        // it binds no parameter slot.
        let reads = words.len() != spirv.len();
        let mut p = Self::build(gpu, &words, entry, bindings, param_bytes, true)?;
        Arc::get_mut(&mut p.inner)
            .expect("just built, not shared")
            .reads_params = reads;
        Ok(p)
    }

    fn build(
        gpu: &Gpu,
        spirv: &[u32],
        entry: &str,
        bindings: u32,
        push_constant_bytes: u32,
        graph: bool,
    ) -> Result<Pipeline> {
        check_spirv(spirv, entry)?;
        if let Some(&past) = crate::kernel::spirv_bindings(spirv)
            .iter()
            .find(|&&b| b >= bindings)
        {
            return Err(VkError::InvalidArgument(format!(
                "the shader binds storage buffer {past} (set 0) but the pipeline has {bindings} \
                 binding(s): pass a buffer for every binding the shader declares"
            )));
        }
        let mut min_bytes = vec![0; bindings as usize];
        for (b, bytes) in crate::kernel::spirv_binding_sizes(spirv) {
            if let Some(m) = min_bytes.get_mut(b as usize) {
                *m = bytes;
            }
        }
        let shared = Arc::clone(&gpu.shared);
        let s = &*shared;
        let max_push = s.info.limits.max_push_constants_size;
        if !push_constant_bytes.is_multiple_of(4) || push_constant_bytes > max_push {
            return Err(VkError::InvalidArgument(format!(
                "{push_constant_bytes} push-constant bytes: must be a multiple of 4 and at most {max_push} \
                 (maxPushConstantsSize); pass larger parameters in a storage buffer"
            )));
        }
        let entry_c = std::ffi::CString::new(entry).map_err(|_| {
            VkError::InvalidArgument(format!("entry point name {entry:?} contains a NUL byte"))
        })?;
        let d = &s.device;
        let update_after_bind = graph && s.info.features.storage_buffer_update_after_bind;
        let push_descriptors = s.push_descriptor.is_some() && !update_after_bind;

        let binding_list: Vec<vk::DescriptorSetLayoutBinding<'_>> = (0..bindings)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let flags = if push_descriptors {
            vk::DescriptorSetLayoutCreateFlags::PUSH_DESCRIPTOR_KHR
        } else if update_after_bind {
            vk::DescriptorSetLayoutCreateFlags::UPDATE_AFTER_BIND_POOL
        } else {
            vk::DescriptorSetLayoutCreateFlags::empty()
        };
        let binding_flags = vec![vk::DescriptorBindingFlags::UPDATE_AFTER_BIND; binding_list.len()];
        let mut flags_info =
            vk::DescriptorSetLayoutBindingFlagsCreateInfo::default().binding_flags(&binding_flags);
        let mut set_info = vk::DescriptorSetLayoutCreateInfo::default()
            .flags(flags)
            .bindings(&binding_list);
        if update_after_bind {
            set_info = set_info.push_next(&mut flags_info);
        }
        // SAFETY: valid create info for a live device; the push-descriptor flag is set
        // only with the extension enabled, the update-after-bind flags only with
        // the feature (checked by `graph_variant`).
        let set_layout = unsafe { d.create_descriptor_set_layout(&set_info, None) }
            .map_err(call("vkCreateDescriptorSetLayout"))?;
        let params_layout = if graph {
            let b = [vk::DescriptorSetLayoutBinding::default()
                .binding(0)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER_DYNAMIC)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)];
            let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&b);
            // SAFETY: valid create info for a live device.
            match unsafe { d.create_descriptor_set_layout(&info, None) } {
                Ok(l) => l,
                Err(e) => {
                    // SAFETY: just created, unused.
                    unsafe { d.destroy_descriptor_set_layout(set_layout, None) };
                    return Err(call("vkCreateDescriptorSetLayout")(e));
                }
            }
        } else {
            vk::DescriptorSetLayout::null()
        };

        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(push_constant_bytes)];
        let set_layouts = [set_layout, params_layout];
        let layout_info = vk::PipelineLayoutCreateInfo::default()
            .set_layouts(&set_layouts[..if graph { 2 } else { 1 }])
            .push_constant_ranges(if push_constant_bytes > 0 && !graph {
                &ranges
            } else {
                &[]
            });
        let drop_sets = || {
            // SAFETY: just created, unused.
            unsafe {
                d.destroy_descriptor_set_layout(set_layout, None);
                if graph {
                    d.destroy_descriptor_set_layout(params_layout, None);
                }
            }
        };
        // SAFETY: as above.
        let layout = match unsafe { d.create_pipeline_layout(&layout_info, None) } {
            Ok(l) => l,
            Err(e) => {
                drop_sets();
                return Err(call("vkCreatePipelineLayout")(e));
            }
        };
        let cleanup = |e: VkError| {
            // SAFETY: just created, unused.
            unsafe { d.destroy_pipeline_layout(layout, None) };
            drop_sets();
            e
        };

        let module_info = vk::ShaderModuleCreateInfo::default().code(spirv);
        // SAFETY: the words passed the structural check (header, instruction
        // lengths, the entry point); the create info lives across the call.
        let module = unsafe { d.create_shader_module(&module_info, None) }
            .map_err(|e| cleanup(call("vkCreateShaderModule")(e)))?;
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(&entry_c);
        let info = vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(layout);
        // SAFETY: the module, layout and cache are live objects of this device; the
        // pipeline cache is internally synchronised for concurrent creation.
        let created = unsafe { d.create_compute_pipelines(s.cache.handle, &[info], None) };
        // SAFETY: the module is no longer needed once creation returned.
        unsafe { d.destroy_shader_module(module, None) };
        let pipeline = match created {
            Ok(p) => p[0],
            Err((_, e)) => return Err(cleanup(call("vkCreateComputePipelines")(e))),
        };
        Ok(Pipeline {
            inner: Arc::new(PipelineInner {
                shared: Arc::clone(&shared),
                pipeline,
                layout,
                set_layout,
                bindings,
                push_constant_bytes: if graph { 0 } else { push_constant_bytes },
                param_bytes: if graph { push_constant_bytes } else { 0 },
                push_descriptors,
                update_after_bind,
                reads_params: false,
                params_layout,
                min_bytes,
            }),
        })
    }

    /// Whether a recorded dispatch's buffers can be rebound without recording
    /// it again (a graph variant whose set 0 is update-after-bind).
    pub fn rebinds_after_recording(&self) -> bool {
        self.inner.update_after_bind
    }

    /// Whether this is a graph variant (bound with [`crate::Recorder::dispatch_bound`]).
    pub fn is_graph_variant(&self) -> bool {
        self.inner.params_layout != vk::DescriptorSetLayout::null()
    }

    /// Storage buffers the pipeline binds.
    pub fn bindings(&self) -> u32 {
        self.inner.bindings
    }

    /// Push-constant bytes a dispatch must supply.
    pub fn push_constant_bytes(&self) -> u32 {
        self.inner.push_constant_bytes
    }
}

/// Bindings a dispatch's per-binding lists hold inline (hetero's kernels take
/// at most 16 buffers); a dispatch with more spills them to the heap.
pub(crate) const INLINE_BINDINGS: usize = 16;

/// A list with one entry per binding of a dispatch.
pub(crate) type PerBinding<T> = SmallVec<[T; INLINE_BINDINGS]>;

/// Checks `buffers` (chunk, offset, range) against pipeline `p`'s bindings
/// (device, range, alignment, the shader's least sizes, the range limit);
/// the buffer ranges (buffer, start, end) a dispatch with them touches.
pub(crate) fn check_buffers(
    s: &Arc<DeviceShared>,
    p: &PipelineInner,
    buffers: &[(&Chunk, u64, u64)],
) -> Result<PerBinding<(vk::Buffer, u64, u64)>> {
    if buffers.len() != p.bindings as usize {
        return Err(VkError::InvalidArgument(format!(
            "dispatch with {} buffers, the pipeline binds {}",
            buffers.len(),
            p.bindings
        )));
    }
    let limits = &s.info.limits;
    let align = limits.min_storage_buffer_offset_alignment.max(1);
    let mut accesses = PerBinding::new();
    for (i, (chunk, offset, range)) in buffers.iter().enumerate() {
        chunk.same_device(s)?;
        chunk.check_range("dispatch binding", *offset, *range)?;
        if offset % align != 0 {
            return Err(VkError::InvalidArgument(format!(
                    "binding {i} at offset {offset}: must be a multiple of {align} (minStorageBufferOffsetAlignment)"
                )));
        }
        let least = p.min_bytes.get(i).copied().unwrap_or(0);
        if *range < least {
            return Err(VkError::InvalidArgument(format!(
                "binding {i} of {range} bytes: the shader's type for it spans at least \
                     {least} bytes; pass a buffer of at least that size"
            )));
        }
        if *range == 0 || *range > u64::from(limits.max_storage_buffer_range) {
            return Err(VkError::InvalidArgument(format!(
                "binding {i} of {range} bytes: a storage buffer binding takes 1..={} bytes \
                     (maxStorageBufferRange)",
                limits.max_storage_buffer_range
            )));
        }
        accesses.push((chunk.inner.buffer, *offset, offset + range));
    }
    Ok(accesses)
}

/// One storage-buffer descriptor per buffer, in binding order.
pub(crate) fn buffer_infos(
    buffers: &[(&Chunk, u64, u64)],
) -> PerBinding<[vk::DescriptorBufferInfo; 1]> {
    buffers
        .iter()
        .map(|(c, o, r)| {
            [vk::DescriptorBufferInfo::default()
                .buffer(c.inner.buffer)
                .offset(*o)
                .range(*r)]
        })
        .collect()
}

/// Writes of `infos` to bindings 0.. of `set` (null: pushed).
pub(crate) fn storage_writes(
    infos: &[[vk::DescriptorBufferInfo; 1]],
    set: vk::DescriptorSet,
) -> PerBinding<vk::WriteDescriptorSet<'_>> {
    infos
        .iter()
        .enumerate()
        .map(|(i, info)| {
            vk::WriteDescriptorSet::default()
                .dst_set(set)
                .dst_binding(i as u32)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .buffer_info(info)
        })
        .collect()
}
