//! Recording an op's device work into the flush's command buffer: copies,
//! fills, staged host reads and writes, batches, 2-D copies and dispatches
//! (with their pipelines), and where a storage's bytes are on the device.

use super::engine::{After, Engine};
use super::Shared;
use crate::exec::kernel::MAX_KERNEL_ARGS;
use crate::exec::kernel::{DeviceCode, KernelInner};
use crate::exec::op::{Body, Op};
use crate::exec::storage::Storage;
use hetero_vulkan::{Chunk, CommandBuffer, Lane, Pipeline, Recorder};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::Arc;

/// Where a dispatch's buffers are: (chunk, offset, range) per argument, in
/// order, on the stack (a launch has at most `MAX_KERNEL_ARGS`).
pub(super) type Places = SmallVec<[(Arc<Chunk>, u64, u64); MAX_KERNEL_ARGS]>;

/// `places` as the layer binds them.
fn bindings_of(
    places: &[(Arc<Chunk>, u64, u64)],
) -> SmallVec<[(&Chunk, u64, u64); MAX_KERNEL_ARGS]> {
    places.iter().map(|(c, o, r)| (&**c, *o, *r)).collect()
}

/// Push-constant bytes of every pipeline: a graph kernel node's scalars, one
/// 8-byte slot each (`Block::scalars`), `MAX_SCALARS` of them. A graph
/// variant reads as many from its parameter slot.
pub(super) const PUSH_BYTES: u32 = (crate::exec::graph::plan::MAX_SCALARS * 8) as u32;

/// How a graph node's dispatch was recorded.
pub(super) enum NodeDispatch {
    /// Scalars as push constants, buffers in the command buffer: a change of
    /// either records it again.
    Pushed,
    /// Scalars read from its parameter slot; buffers from the set given
    /// (update-after-bind: rebound with `GraphSets::write`) or, `None`, in
    /// the command buffer.
    Params(Option<hetero_vulkan::SetId>),
}

/// `scalars` as a node's parameter bytes: one 8-byte slot each, zeros past
/// them, `PUSH_BYTES` in all.
pub(super) fn param_bytes(scalars: &[u64]) -> [u8; PUSH_BYTES as usize] {
    let mut push = [0u8; PUSH_BYTES as usize];
    for (slot, v) in push.chunks_exact_mut(8).zip(scalars) {
        slot.copy_from_slice(&v.to_le_bytes());
    }
    push
}

impl Engine {
    /// Records `op`'s device work; what it needs when it completes.
    pub(super) fn record(
        &mut self,
        sh: &Shared,
        rec: &mut Recorder,
        op: &Op,
    ) -> Result<After, String> {
        let vk = |e: hetero_vulkan::VkError| e.to_string();
        rec.barrier();
        // Nothing to move (an empty buffer has no chunk to name).
        let empty = match &op.body {
            Body::Copy { bytes, .. } | Body::Fill { bytes, .. } => *bytes == 0,
            Body::HostWrite { data, .. } => data.is_empty(),
            Body::HostRead { out, .. } => out.lock().unwrap_or_else(|p| p.into_inner()).is_empty(),
            _ => false,
        };
        if empty {
            return Ok(After::Nothing);
        }
        match &op.body {
            Body::Copy {
                src,
                src_off,
                dst,
                dst_off,
                bytes,
                ..
            } => {
                let (sc, so) = sh.place(src)?;
                let (dc, d) = sh.place(dst)?;
                rec.copy(
                    &sc,
                    so + *src_off as u64,
                    &dc,
                    d + *dst_off as u64,
                    *bytes as u64,
                )
                .map_err(vk)?;
                Ok(After::Nothing)
            }
            Body::Fill {
                dst,
                off,
                bytes,
                pattern,
                pattern_len,
                ..
            } => {
                let (dc, d) = sh.place(dst)?;
                let pattern = &pattern[..*pattern_len as usize];
                if let Some(word) = fill_word(pattern, *off, *bytes) {
                    rec.fill(&dc, d + *off as u64, *bytes as u64, word)
                        .map_err(vk)?;
                    return Ok(After::Nothing);
                }
                // Another pattern, or an unaligned range: fill a staging buffer
                // on the host and copy it.
                let staging = sh.staging(*bytes)?;
                // SAFETY: the staging allocation holds `bytes` bytes of
                // host-visible memory that only this op uses.
                unsafe {
                    crate::exec::effects::fill_bytes(staging.ptr().as_ptr(), 0, *bytes, pattern)
                };
                let (sc, so) = sh.place_pinned(&staging, *bytes)?;
                rec.copy(&sc, so, &dc, d + *off as u64, *bytes as u64)
                    .map_err(vk)?;
                Ok(After::Keep(vec![staging]))
            }
            Body::HostWrite { dst, off, data, .. } => {
                let (dc, d) = sh.place(dst)?;
                let staging = sh.staging(data.len())?;
                // SAFETY: as for a fill's staging buffer, `data.len()` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(data.as_ptr(), staging.ptr().as_ptr(), data.len())
                };
                let (sc, so) = sh.place_pinned(&staging, data.len())?;
                rec.copy(&sc, so, &dc, d + *off as u64, data.len() as u64)
                    .map_err(vk)?;
                Ok(After::Keep(vec![staging]))
            }
            Body::HostRead { src, off, out } => {
                let len = out.lock().unwrap_or_else(|p| p.into_inner()).len();
                let (sc, so) = sh.place(src)?;
                let staging = sh.readback_staging(len)?;
                let (dc, d) = sh.place_pinned(&staging, len)?;
                rec.copy(&sc, so + *off as u64, &dc, d, len as u64)
                    .map_err(vk)?;
                Ok(After::ReadBack {
                    staging,
                    out: out.clone(),
                })
            }
            Body::CopyBatch(b) => {
                for g in &b.segs {
                    let (sc, so) = sh.place(&b.storages[g.src as usize].0)?;
                    let (dc, d) = sh.place(&b.storages[g.dst as usize].0)?;
                    rec.copy(
                        &sc,
                        so + g.src_off as u64,
                        &dc,
                        d + g.dst_off as u64,
                        g.len as u64,
                    )
                    .map_err(vk)?;
                }
                Ok(After::Nothing)
            }
            Body::Copy2D(c) => {
                let (sc, so) = sh.place(&c.src)?;
                let (dc, d) = sh.place(&c.dst)?;
                let (s, t) = (c.src_r, c.dst_r);
                for row in 0..s.height {
                    rec.copy(
                        &sc,
                        so + (s.offset + row * s.pitch) as u64,
                        &dc,
                        d + (t.offset + row * t.pitch) as u64,
                        s.width as u64,
                    )
                    .map_err(vk)?;
                }
                Ok(After::Nothing)
            }
            Body::Kernel {
                kernel,
                blocks,
                args,
                ..
            } => {
                let mut places = Places::new();
                for a in args.as_slice_iter() {
                    places.push(sh.binding(&a.storage, 0, a.storage.bytes())?);
                }
                self.dispatch(sh, rec, kernel, *blocks, &places, &[])?;
                Ok(After::Nothing)
            }
            _ => Ok(After::Nothing),
        }
    }

    /// Records a dispatch of `kernel`'s device code over `blocks` workgroups,
    /// binding `places` (chunk, offset, bytes) in order, with `scalars` as
    /// push constants (zeros past them, up to `PUSH_BYTES`).
    pub(super) fn dispatch(
        &mut self,
        sh: &Shared,
        rec: &mut Recorder,
        kernel: &KernelInner,
        blocks: u32,
        places: &[(Arc<hetero_vulkan::Chunk>, u64, u64)],
        scalars: &[u64],
    ) -> Result<(), String> {
        let Some(code) = &kernel.code else {
            return Err(format!(
                "kernel '{}' has no device code; give it some with Kernel::wgsl or Kernel::spirv",
                kernel.name
            ));
        };
        let max = sh.gpu.info().limits.max_compute_work_group_count[0];
        if blocks > max {
            return Err(format!(
                "kernel '{}': a grid of {blocks} blocks, this device dispatches at most {max} workgroups along x",
                kernel.name
            ));
        }
        let pipeline = self.pipeline(sh, kernel.name, code, places.len() as u32, false)?;
        let push = param_bytes(scalars);
        let buffers = bindings_of(places);
        rec.dispatch(&pipeline, &buffers, &push, [blocks, 1, 1])
            .map_err(|e| format!("kernel '{}': {e}", kernel.name))
    }

    /// Records graph node `slot`'s dispatch of `kernel` for a kept
    /// recording: through the kernel's graph variant, its scalars written to
    /// slot `slot` of `params` (the caller makes sure no pending launch reads
    /// it) and its buffers bound from `sets` where the device rebinds after
    /// recording; as `dispatch` does, when the kernel has no graph variant.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch_node(
        &mut self,
        sh: &Shared,
        rec: &mut Recorder,
        kernel: &KernelInner,
        blocks: u32,
        places: &[(Arc<hetero_vulkan::Chunk>, u64, u64)],
        scalars: &[u64],
        params: &hetero_vulkan::ParamBlock,
        slot: u32,
        sets: &hetero_vulkan::GraphSets,
    ) -> Result<NodeDispatch, String> {
        let variant = kernel.code.as_ref().and_then(|code| {
            self.pipeline(sh, kernel.name, code, places.len() as u32, true)
                .ok()
        });
        let Some(pipeline) =
            variant.filter(|_| blocks <= sh.gpu.info().limits.max_compute_work_group_count[0])
        else {
            // No code, no variant (a module it cannot rewrite), or a grid too
            // large: as on a stream (which says what is wrong, if anything).
            self.dispatch(sh, rec, kernel, blocks, places, scalars)?;
            return Ok(NodeDispatch::Pushed);
        };
        params
            .write(slot, &param_bytes(scalars))
            .map_err(|e| format!("kernel '{}': writing its parameters: {e}", kernel.name))?;
        let buffers = bindings_of(places);
        let set = rec
            .dispatch_bound(
                &pipeline,
                Some(sets),
                &buffers,
                params,
                slot,
                [blocks, 1, 1],
            )
            .map_err(|e| format!("kernel '{}': {e}", kernel.name))?;
        Ok(NodeDispatch::Params(set))
    }

    /// Points graph node set `set` (recorded by `dispatch_node` for
    /// `kernel`) at `places`.
    pub(super) fn rebind_node(
        &mut self,
        sh: &Shared,
        kernel: &KernelInner,
        places: &[(Arc<hetero_vulkan::Chunk>, u64, u64)],
        sets: &hetero_vulkan::GraphSets,
        set: hetero_vulkan::SetId,
    ) -> Result<(), String> {
        let code = kernel
            .code
            .as_ref()
            .ok_or_else(|| format!("kernel '{}' has no device code", kernel.name))?;
        let pipeline = self.pipeline(sh, kernel.name, code, places.len() as u32, true)?;
        let buffers = bindings_of(places);
        sets.write(set, &pipeline, &buffers)
            .map_err(|e| format!("kernel '{}': rebinding: {e}", kernel.name))
    }

    /// The compiled pipeline of `code` with `bindings` buffers (compiled at
    /// its first use, through the device's pipeline cache); `graph`: its
    /// graph variant, which reads `PUSH_BYTES` of scalars from a parameter
    /// slot. Every other pipeline takes `PUSH_BYTES` of push constants (a
    /// graph node's scalars; zeros for a launch on a stream), so one pipeline
    /// serves both.
    fn pipeline(
        &mut self,
        sh: &Shared,
        name: &str,
        code: &Arc<DeviceCode>,
        bindings: u32,
        graph: bool,
    ) -> Result<Pipeline, String> {
        let key = (Arc::as_ptr(code) as usize, bindings, graph);
        if let Some((_, p)) = self.pipelines.get(&key) {
            return Ok(p.clone());
        }
        let build = |words: &[u32], entry: &str| {
            if graph {
                Pipeline::graph_variant(&sh.gpu, words, entry, bindings, PUSH_BYTES)
            } else {
                Pipeline::new(&sh.gpu, words, entry, bindings, PUSH_BYTES)
            }
        };
        let built = match &**code {
            DeviceCode::Wgsl { source, entry } => {
                hetero_vulkan::compile_wgsl(source, entry).and_then(|words| build(&words, entry))
            }
            DeviceCode::Spirv { words, entry } => build(words, entry),
        }
        .map_err(|e| format!("kernel '{name}': {e}"))?;
        self.pipelines.insert(key, (code.clone(), built.clone()));
        Ok(built)
    }
}

/// The open recorder of lane `lane` (0: compute, 1: transfer), begun if none
/// is: into a command buffer of `spares` (the engine's submitted buffers of
/// that lane) whose submissions completed, else a new one.
pub(super) fn rec_or_new<'a>(
    sh: &Shared,
    spares: &mut VecDeque<CommandBuffer>,
    rec: &'a mut Option<Recorder>,
    lane: usize,
) -> Result<&'a mut Recorder, String> {
    if rec.is_none() {
        let lane = [Lane::Compute, Lane::Transfer][lane];
        let r = sh.gpu.recorder_reusing(lane, spares);
        *rec = Some(r.map_err(|e| e.to_string())?);
    }
    Ok(rec.as_mut().expect("made above"))
}

/// The 32-bit word `vkCmdFillBuffer` repeats for `pattern`, when the range
/// allows it (offset and length multiples of 4, a pattern of 1, 2 or 4 bytes).
pub(super) fn fill_word(pattern: &[u8], off: usize, bytes: usize) -> Option<u32> {
    if !off.is_multiple_of(4) || !bytes.is_multiple_of(4) {
        return None;
    }
    let mut w = [0u8; 4];
    match pattern.len() {
        1 | 2 | 4 => {
            for (i, b) in w.iter_mut().enumerate() {
                *b = pattern[i % pattern.len()];
            }
            Some(u32::from_ne_bytes(w))
        }
        _ => None,
    }
}

impl Shared {
    /// What a dispatch binds for `bytes` of `s` from `off`: chunk, offset,
    /// range (an empty range binds a few bytes nothing else uses).
    pub(super) fn binding(
        &self,
        s: &Storage,
        off: usize,
        bytes: usize,
    ) -> Result<(Arc<hetero_vulkan::Chunk>, u64, u64), String> {
        if bytes == 0 {
            return Ok(self.empty_binding());
        }
        let (c, o) = self.place(s)?;
        Ok((c, o + off as u64, bytes as u64))
    }

    /// A few bytes nothing else uses, for an empty buffer argument.
    pub(super) fn empty_binding(&self) -> (Arc<hetero_vulkan::Chunk>, u64, u64) {
        (self.empty.clone(), 0, 4)
    }

    /// The chunk and offset of `s`'s memory.
    pub(super) fn place(&self, s: &Storage) -> Result<(Arc<hetero_vulkan::Chunk>, u64), String> {
        let bytes = s.bytes() as u64;
        let found = if s.host_visible() {
            self.resolve_pinned(s.host_ptr() as u64, bytes)
        } else {
            self.device_mem.resolve(s.device_addr(), bytes)
        };
        found.ok_or_else(|| {
            if s.host_visible() {
                "host memory the Vulkan device cannot reach (registered host memory is not \
                 supported on Vulkan yet: use pinned buffers from Device::alloc_pinned)"
                    .to_string()
            } else {
                format!(
                    "a buffer at {:#x} that is not this Vulkan device's memory",
                    s.device_addr()
                )
            }
        })
    }

    pub(super) fn place_pinned(
        &self,
        a: &hetero_memory::PinnedAllocation,
        bytes: usize,
    ) -> Result<(Arc<hetero_vulkan::Chunk>, u64), String> {
        self.resolve_pinned(a.ptr().as_ptr() as u64, bytes as u64)
            .ok_or_else(|| "a staging buffer outside the device's pinned memory".to_string())
    }

    /// The chunk and offset of pinned memory of either type.
    fn resolve_pinned(&self, addr: u64, bytes: u64) -> Option<(Arc<hetero_vulkan::Chunk>, u64)> {
        self.pinned_mem
            .resolve(addr, bytes)
            .or_else(|| self.readback_mem.resolve(addr, bytes))
    }

    /// `bytes` of readback memory for the device to write and the host to read.
    pub(super) fn readback_staging(
        &self,
        bytes: usize,
    ) -> Result<hetero_memory::PinnedAllocation, String> {
        stage_from(&self.readback, bytes)
    }

    /// `bytes` of pinned memory to stage through.
    pub(super) fn staging(&self, bytes: usize) -> Result<hetero_memory::PinnedAllocation, String> {
        stage_from(&self.pinned, bytes)
    }
}

/// `bytes` of `pool`'s pinned memory to stage through.
fn stage_from(
    pool: &hetero_memory::PinnedPool,
    bytes: usize,
) -> Result<hetero_memory::PinnedAllocation, String> {
    pool.alloc(bytes.max(1), Storage::ALIGN)
        .map_err(|e| format!("staging {bytes} bytes: {e}"))
}
