//! Ops recorded while capturing: each becomes a node of the draft after the
//! stream's lane (its last node) and the events it waits on; buffers allocated
//! and slots made while recording are stand-ins of the graph.

use super::{capture_error, with_capture, CaptureSlot, CaptureState, Lane};
use crate::exec::graph::{Draft, GraphRef, NodeBody, SlotInfo};
use crate::exec::op::Body;
use crate::exec::storage::{MemoryKind, Storage};
use crate::Result;
use std::sync::Arc;

/// Records a kernel launch (validated by the stream) straight from its
/// arguments: the common op of a recording, without building an op first.
pub(crate) fn kernel(
    slot: &CaptureSlot,
    stream: u64,
    kernel: &Arc<crate::exec::kernel::KernelInner>,
    blocks: u32,
    args: &[crate::Arg<'_>],
) -> Result<()> {
    with_capture(slot, "launch", |_, st| {
        let d = &mut st.draft;
        let start = d.args.len();
        for a in args {
            match d.operand("launch", a.storage) {
                Ok(operand) => d.args.push(crate::exec::graph::NodeArg {
                    operand,
                    elem: a.elem,
                    write: a.write,
                    len: a.storage.bytes() / a.elem.size.max(1),
                    unit: a.storage.unit_elems(a.elem.size),
                }),
                Err(e) => {
                    d.args.truncate(start);
                    return Err(e);
                }
            }
        }
        let n = (d.args.len() - start) as u32;
        let node = NodeBody::Kernel {
            kernel: d.kernel_index(kernel),
            name: kernel.name,
            blocks,
            args: (start as u32, n),
        };
        st.add(stream, node);
        Ok(())
    })
}

/// Adds the managed pages an op just recorded declared (the managed layer's
/// records): each launch of the graph makes them resident first.
pub(crate) fn managed(
    slot: &CaptureSlot,
    uses: impl IntoIterator<Item = Arc<dyn std::any::Any + Send + Sync>>,
) -> Result<()> {
    with_capture(slot, "record", |_, st| {
        st.draft.managed.extend(uses);
        Ok(())
    })
}

impl CaptureState {
    pub(super) fn lane(&mut self, stream: u64) -> &mut Lane {
        let i = self
            .lanes
            .iter()
            .position(|l| l.stream == stream)
            .expect("a capturing stream has its lane");
        &mut self.lanes[i]
    }

    /// Adds a node for `stream`'s next op; returns its timeline-like value.
    #[inline]
    pub(super) fn add(&mut self, stream: u64, body: NodeBody) -> u64 {
        // The origin first: most recordings have one lane.
        let lane_index = if self.lanes[0].stream == stream {
            0
        } else {
            self.lanes
                .iter()
                .position(|l| l.stream == stream)
                .expect("a capturing stream has its lane")
        };
        let lane = &mut self.lanes[lane_index];
        let d = &mut self.draft;
        let v = d.nodes.len() as u32;
        d.nodes.push(body);
        match &lane.explicit {
            Some(deps) => {
                d.edges.extend(deps.iter().map(|&p| (p, v)));
                lane.added = Some(v);
            }
            // The common case: one op after the previous one.
            None if lane.tail.len() == 1 => {
                d.edges.push((lane.tail[0], v));
                lane.tail[0] = v;
            }
            None => {
                d.edges.extend(lane.tail.iter().map(|&p| (p, v)));
                lane.tail.clear();
                lane.tail.push(v);
            }
        }
        u64::from(v) + 1
    }
}

/// Records `body` (validated by the stream) into the capture of `slot`.
pub(crate) fn submit(slot: &CaptureSlot, stream: u64, body: Body) -> Result<u64> {
    with_capture(slot, "record", |_, st| {
        let d = &mut st.draft;
        let node = match body {
            Body::Copy {
                kind,
                src,
                src_off,
                dst,
                dst_off,
                bytes,
                ..
            } => NodeBody::Copy {
                kind,
                src: d.operand("copy", &src)?,
                src_off,
                dst: d.operand("copy", &dst)?,
                dst_off,
                bytes,
            },
            Body::Fill {
                dst,
                off,
                bytes,
                pattern,
                pattern_len,
                ..
            } => NodeBody::Fill {
                dst: d.operand("fill", &dst)?,
                off,
                bytes,
                pattern,
                pattern_len,
            },
            Body::Kernel {
                kernel,
                blocks,
                args,
                ..
            } => {
                let start = d.args.len();
                for a in args.as_slice_iter() {
                    match d.operand("launch", &a.storage) {
                        Ok(operand) => d.args.push(crate::exec::graph::NodeArg {
                            operand,
                            elem: a.elem,
                            write: a.write,
                            len: a.len(),
                            unit: a.storage.unit_elems(a.elem.size),
                        }),
                        Err(e) => {
                            d.args.truncate(start);
                            return Err(e);
                        }
                    }
                }
                let n = (d.args.len() - start) as u32;
                NodeBody::Kernel {
                    kernel: d.kernel_index(&kernel.to_arc()),
                    name: kernel.name,
                    blocks,
                    args: (start as u32, n),
                }
            }
            Body::Host(_) => {
                return Err(capture_error(
                    "host_fn",
                    "host_fn takes a FnOnce, which a replay could not run twice; record \
                     Stream::host_callback (an Fn) instead",
                ))
            }
            // A memory-order wait is decided again at each launch (the memory's
            // users then are what matter, not those at recording).
            Body::Wait { fault: false, .. } => return Ok(0),
            Body::Wait {
                timeline, value, ..
            } => NodeBody::Wait { timeline, value },
            // (A stream that is capturing is given one wait per event:
            // `Stream::wait_points`.)
            Body::WaitAll(_) => {
                return Err(capture_error(
                    "wait_events",
                    "a wait on several events is not recorded as one node; wait on each \
                     event instead",
                ))
            }
            Body::HostWrite { .. } | Body::HostRead { .. } => {
                return Err(capture_error(
                    "write_slice/read_slice",
                    "a synchronous host copy cannot be recorded (it would wait for work \
                     that does not run while recording); record a copy from or into a \
                     pinned buffer instead",
                ))
            }
            Body::Copy2D(c) => NodeBody::Copy2D(Box::new(crate::exec::graph::Copy2DNode {
                kind: c.kind,
                src: d.operand("copy_2d", &c.src)?,
                src_r: c.src_r,
                dst: d.operand("copy_2d", &c.dst)?,
                dst_r: c.dst_r,
            })),
            // `Stream::copy_batch` records each of its copies as a copy node.
            Body::CopyBatch(_) | Body::Record { .. } | Body::Graph(_) | Body::Async(_) => {
                return Err(capture_error("record", "not an operation a graph records"))
            }
        };
        Ok(st.add(stream, node))
    })
}

/// Records a host callback that runs at every launch.
pub(crate) fn host(slot: &CaptureSlot, stream: u64, f: Arc<dyn Fn() + Send + Sync>) -> Result<()> {
    with_capture(slot, "host_callback", |_, st| {
        st.add(stream, NodeBody::Host(f));
        Ok(())
    })
}

/// A buffer allocated inside the graph: a stand-in placed in the arena at
/// instantiate.
pub(crate) fn alloc(slot: &CaptureSlot, bytes: usize) -> Result<Arc<Storage>> {
    with_capture(slot, "alloc", |_, st| {
        let d = &mut st.draft;
        d.internal.push(bytes);
        Ok(stand_in(
            d,
            d.internal.len() - 1,
            false,
            MemoryKind::Device,
            bytes,
        ))
    })
}

/// A slot: a stand-in bound to a real buffer at launch. Returns it with its
/// graph and index.
pub(crate) fn new_slot(slot: &CaptureSlot, info: SlotInfo) -> Result<(Arc<Storage>, u32, u32)> {
    with_capture(slot, "slot", |_, st| {
        let d = &mut st.draft;
        d.slots.push(info);
        let index = d.slots.len() - 1;
        let s = stand_in(d, index, true, info.kind, info.len * info.elem.size);
        Ok((s, d.id, index as u32))
    })
}

/// The stand-in for buffer or slot `index` of draft `d`.
fn stand_in(d: &Draft, index: usize, slot: bool, kind: MemoryKind, bytes: usize) -> Arc<Storage> {
    let tag = GraphRef {
        graph: d.id,
        index: index as u32,
        slot,
    };
    Arc::new(Storage::stand_in(d.device, kind, bytes, tag.pack()))
}
