//! Stream graphs placed across the devices of a context
//! ([`Graph::instantiate_on`](crate::Graph::instantiate_on)): each kernel node
//! becomes a task over the buffers its arguments name, ordered by the
//! graph's edges and by its buffers' accesses, and the whole is placed with
//! HEFT and planned as a task graph is (`graph.rs`). Each buffer is task
//! data whose replica on the graph's device is the buffer itself; a launch
//! ends with every buffer the graph writes holding its result there, so the
//! graph's user reads its buffers as after a launch on one device.
//!
//! Placed: every node over buffers that existed when the graph was
//! recorded. Kernel nodes (host closure or device code) go where HEFT puts
//! them; copies between the graph's buffers and fills too (a task over the
//! buffers they touch, run as the same op on the chosen device's replicas:
//! `NodeOp`); copies to or from host memory, host callbacks and waits on
//! outside events run on the graph's device (whose engines reach that host
//! memory), ordered with the rest through the graph's edges and buffers;
//! nodes that only order add edges. A 2-D copy is placed as a copy is
//! (between the graph's buffers wherever HEFT puts it, to or from host
//! memory on the graph's device). A buffer the graph allocates is a device buffer of the
//! graph's device made at instantiate for the placed graph's life, task data
//! like the others but never copied back. A slot is task data whose replica
//! on the graph's device is the buffer each launch binds to it
//! ([`PlacedTaskGraph::launch_with`]); its replicas elsewhere are the placed
//! graph's own. The host memory of a copy is task data on the graph's device.

use super::data::Bound;
use super::data::{DataAny, DataState};
use super::graph::{place, PlacedTaskGraph};
use super::{Mode, Spec};
use crate::api::buffer::{Arg, DeviceBuffer};
use crate::exec::graph::plan::SlotSpec;
use crate::exec::graph::{Draft, NodeBody, Operand};
use crate::exec::op::CopyKind;
use crate::exec::storage::{GraphHold, Storage};
use crate::exec::transfer::ByteRegion;
use crate::{Context, Device, Error, Event, Grid, Kernel, Result, Stream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// A stream graph's buffer as task data: `home` is the graph's device (its
/// index in the context), where the replica is the user's buffer (a slot's:
/// the buffer each launch binds to it).
struct GraphData {
    id: u64,
    bytes: usize,
    home: usize,
    /// A buffer the graph allocates (nothing outside reads it).
    scratch: bool,
    /// Its replica on the graph's device.
    at_home: AtHome,
    replicas: Vec<OnceLock<DeviceBuffer<u8>>>,
    state: Mutex<DataState>,
}

/// A stream graph's buffer on its device: one the graph names, or the one
/// each launch binds to a slot.
enum AtHome {
    Buffer(GraphHold),
    Slot(u32),
}

impl DataAny for GraphData {
    fn id(&self) -> u64 {
        self.id
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
    fn state(&self) -> &Mutex<DataState> {
        &self.state
    }
    fn is_scratch(&self) -> bool {
        self.scratch
    }
    fn slot(&self) -> Option<u32> {
        match self.at_home {
            AtHome::Slot(k) => Some(k),
            AtHome::Buffer(_) => None,
        }
    }
    fn replica(&self, at: usize, device: &Device) -> Result<()> {
        if at != self.home && self.replicas[at].get().is_none() {
            let b = device.alloc::<u8>(self.bytes)?;
            let _ = self.replicas[at].set(b);
        }
        Ok(())
    }
    fn arg<'a>(&'a self, at: usize, write: bool, bound: Bound<'a>) -> Arg<'a> {
        Arg {
            // (A launch checks first that every slot it uses is bound.)
            storage: self
                .storage(at, bound)
                .expect("replica made, slot bound, before its use"),
            elem: crate::exec::kernel::ElemInfo::of::<u8>(),
            write,
            managed: None,
        }
    }
    fn storage<'a>(&'a self, at: usize, bound: Bound<'a>) -> Option<&'a Arc<Storage>> {
        if at != self.home {
            return self.replicas[at].get().map(|b| &*b.storage);
        }
        match &self.at_home {
            AtHome::Buffer(h) => Some(h),
            AtHome::Slot(k) => bound.get(*k as usize)?.as_ref().map(|h| &**h),
        }
    }
}

/// A stream graph's node that is not a kernel, as its placed task runs it
/// on the stream of its device, over the replicas there of its task's data
/// (`args`, in the order of its access list).
pub(crate) enum NodeOp {
    /// A copy from `args[0]` into `args[1]` (two of the graph's buffers).
    Copy {
        src_off: usize,
        dst_off: usize,
        bytes: usize,
    },
    /// A copy between host memory `args[1]` and `args[0]` (`to_host`:
    /// from it), on the graph's device `home`, whose engines reach the host
    /// memory.
    Host {
        host_off: usize,
        dev_off: usize,
        bytes: usize,
        to_host: bool,
        home: usize,
    },
    /// A pattern over a byte range of `args[0]`.
    Fill {
        off: usize,
        bytes: usize,
        pattern: [u8; 16],
        len: u8,
    },
    /// A 2-D copy: from `args[0]` into `args[1]` (two of the graph's
    /// buffers), or between host memory `args[1]` and `args[0]` on the
    /// graph's device `home` (`kind` says which way).
    Copy2D {
        kind: CopyKind,
        src_r: ByteRegion,
        dst_r: ByteRegion,
        home: usize,
    },
    /// A host callback, on `home`.
    Callback {
        f: Arc<dyn Fn() + Send + Sync>,
        home: usize,
    },
    /// A wait on an event recorded outside the graph, on `home`.
    Wait { event: Event, home: usize },
}

impl NodeOp {
    /// Its modelled time on device `d`, ns; `None` where it cannot run. A
    /// copy or fill in a device's memory counts a memory copy's 10 GB/s
    /// (the task layer's figure for one), a copy to or from the host its
    /// device's leg of the bus.
    pub(crate) fn cost_ns(&self, rt: &super::Runtime, d: usize) -> Option<f64> {
        match self {
            NodeOp::Copy { bytes, .. } | NodeOp::Fill { bytes, .. } => Some(*bytes as f64 / 10.0),
            NodeOp::Host {
                bytes,
                to_host,
                home,
                ..
            } => (d == *home).then(|| rt.host_leg_ns(d, *bytes as u64, *to_host)),
            NodeOp::Copy2D {
                kind, src_r, home, ..
            } => {
                let bytes = (src_r.width * src_r.height) as u64;
                match kind {
                    CopyKind::D2D => Some(bytes as f64 / 10.0),
                    _ => (d == *home).then(|| rt.host_leg_ns(d, bytes, *kind == CopyKind::D2H)),
                }
            }
            NodeOp::Callback { home, .. } | NodeOp::Wait { home, .. } => {
                (d == *home).then_some(0.0)
            }
        }
    }

    /// Submits it on `stream`.
    pub(crate) fn run(&self, stream: &Stream, args: &[Arg<'_>]) -> Result<()> {
        match self {
            NodeOp::Copy {
                src_off,
                dst_off,
                bytes,
            } => {
                let (a, b) = (args[0].storage, args[1].storage);
                stream.copy_op::<u8>(
                    "copy_d2d",
                    CopyKind::D2D,
                    a,
                    a.bytes(),
                    *src_off,
                    b,
                    b.bytes(),
                    *dst_off,
                    *bytes,
                )
            }
            NodeOp::Host {
                host_off,
                dev_off,
                bytes,
                to_host,
                ..
            } => {
                let (dev, host) = (args[0].storage, args[1].storage);
                if *to_host {
                    stream.copy_op::<u8>(
                        "copy_d2h",
                        CopyKind::D2H,
                        dev,
                        dev.bytes(),
                        *dev_off,
                        host,
                        host.bytes(),
                        *host_off,
                        *bytes,
                    )
                } else {
                    stream.copy_op::<u8>(
                        "copy_h2d",
                        CopyKind::H2D,
                        host,
                        host.bytes(),
                        *host_off,
                        dev,
                        dev.bytes(),
                        *dev_off,
                        *bytes,
                    )
                }
            }
            NodeOp::Fill {
                off,
                bytes,
                pattern,
                len,
            } => fill(stream, args[0].storage, *off, *bytes, pattern, *len),
            NodeOp::Copy2D {
                kind, src_r, dst_r, ..
            } => {
                let (src, dst, op) = match kind {
                    CopyKind::H2D => (args[1].storage, args[0].storage, "copy_2d_h2d"),
                    CopyKind::D2H => (args[0].storage, args[1].storage, "copy_2d_d2h"),
                    CopyKind::D2D => (args[0].storage, args[1].storage, "copy_2d_d2d"),
                };
                stream.copy_2d_bytes(op, *kind, src, *src_r, dst, *dst_r)
            }
            NodeOp::Callback { f, .. } => {
                let f = f.clone();
                stream.host_callback(move || f())
            }
            NodeOp::Wait { event, .. } => stream.wait_event(event),
        }
    }
}

/// A fill of `bytes` at `off` with the first `len` bytes of `pattern` (as
/// the node recorded it: a range of whole elements of that size).
fn fill(
    stream: &Stream,
    storage: &Arc<Storage>,
    off: usize,
    bytes: usize,
    pattern: &[u8; 16],
    len: u8,
) -> Result<()> {
    macro_rules! fill_as {
        ($($n:literal)*) => {
            match len as usize {
                $($n => {
                    let mut v = [0u8; $n];
                    v.copy_from_slice(&pattern[..$n]);
                    stream.fill_op(storage, storage.bytes() / $n, off / $n, bytes / $n, v)
                })*
                other => Err(Error::Graph {
                    op: "Graph::instantiate_on",
                    detail: format!("a fill node with a {other}-byte pattern"),
                }),
            }
        };
    }
    fill_as!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
}

/// Places the graph `draft` of `device` across `ctx`'s devices.
pub(crate) fn place_graph(
    draft: &Draft,
    device: &Device,
    ctx: &Context,
) -> Result<PlacedTaskGraph> {
    let rt = ctx.task_runtime()?;
    let home = rt
        .devices
        .iter()
        .position(|d| d.id() == device.id())
        .ok_or_else(|| Error::DeviceContext {
            op: "Graph::instantiate_on",
            detail: format!(
                "the graph's device {} is not a device of the context; place it on a context \
                 of its device",
                device.id()
            ),
        })?;
    if !draft.managed.is_empty() {
        return Err(Error::Graph {
            op: "Graph::instantiate_on",
            detail: "the graph has managed arguments, whose pages follow their one buffer \
                     across the context already; instantiate it on one device (a launch makes \
                     its pages resident there)"
                .into(),
        });
    }
    let n = draft.nodes.len();
    // Explicit edges: successors and the count of predecessors.
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut indeg = vec![0usize; n];
    for &(a, b) in &draft.edges {
        succ[a as usize].push(b as usize);
        indeg[b as usize] += 1;
    }
    // A topological order (Kahn, smallest index first: the recording order
    // when every edge points forward).
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = (0..n)
        .filter(|&i| indeg[i] == 0)
        .map(std::cmp::Reverse)
        .collect();
    let mut order = Vec::with_capacity(n);
    while let Some(std::cmp::Reverse(i)) = ready.pop() {
        order.push(i);
        for &s in &succ[i] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.push(std::cmp::Reverse(s));
            }
        }
    }
    if order.len() != n {
        return Err(Error::Graph {
            op: "Graph::instantiate_on",
            detail: "the graph's dependencies form a cycle".into(),
        });
    }
    // The buffers the graph allocates: one device buffer each on the graph's
    // device for the placed graph's life (the arena's reuse of one range by
    // buffers whose lives do not overlap is not kept).
    let internal: Vec<GraphHold> = draft
        .internal
        .iter()
        .map(|&bytes| Ok(GraphHold::new(&device.alloc::<u8>(bytes)?.storage)))
        .collect::<Result<_>>()?;
    let scratch: Vec<usize> = internal.iter().map(|h| Arc::as_ptr(h) as usize).collect();
    let n_dev = rt.devices.len();
    let new_datum = |bytes: usize, at_home: AtHome| {
        let mut valid = vec![None; n_dev];
        valid[home] = Some(crate::Event::new());
        let scratch = matches!(&at_home, AtHome::Buffer(h)
            if scratch.contains(&(Arc::as_ptr(h) as usize)));
        Arc::new(GraphData {
            id: super::data::next_data_id(),
            bytes,
            home,
            scratch,
            at_home,
            replicas: (0..n_dev).map(|_| OnceLock::new()).collect(),
            state: Mutex::new(DataState {
                valid,
                writer: None,
                readers: Vec::new(),
                mark: None,
            }),
        })
    };
    // Task data per buffer (by address) and per slot, each made once.
    let mut by_buffer: HashMap<usize, Arc<GraphData>> = HashMap::new();
    let mut by_slot: HashMap<u32, Arc<GraphData>> = HashMap::new();
    let mut datum_of = |o: &Operand| -> Arc<dyn DataAny> {
        let hold = match o {
            Operand::Fixed(hold) => hold,
            Operand::Internal(k) => &internal[*k as usize],
            Operand::Slot(k) => {
                let info = draft.slots[*k as usize];
                return by_slot
                    .entry(*k)
                    .or_insert_with(|| new_datum(info.len * info.elem.size, AtHome::Slot(*k)))
                    .clone();
            }
        };
        by_buffer
            .entry(Arc::as_ptr(hold) as usize)
            .or_insert_with(|| new_datum(hold.bytes(), AtHome::Buffer(hold.clone())))
            .clone()
    };
    let mut specs: Vec<Spec> = Vec::new();
    // Per node: the tasks it stands for (a kernel: itself; an ordering
    // node: the tasks before it), through which its successors follow.
    let mut tasks_of: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut explicit: Vec<Vec<usize>> = Vec::new();
    let mut preds_of: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in &draft.edges {
        preds_of[b as usize].push(a as usize);
    }
    for &i in &order {
        let before: Vec<usize> = {
            let mut v: Vec<usize> = preds_of[i]
                .iter()
                .flat_map(|&p| tasks_of[p].iter().copied())
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        match &draft.nodes[i] {
            NodeBody::Empty => tasks_of[i] = before,
            NodeBody::Kernel {
                kernel,
                blocks,
                args,
                ..
            } => {
                let mut access = Vec::new();
                let mut elems = Vec::new();
                for a in &draft.args[args.0 as usize..(args.0 + args.1) as usize] {
                    let mode = if a.write { Mode::ReadWrite } else { Mode::Read };
                    access.push((datum_of(&a.operand), mode));
                    elems.push(a.elem);
                }
                let k = Kernel {
                    inner: draft.kernels[*kernel as usize].clone(),
                };
                explicit.push(before);
                tasks_of[i] = vec![specs.len()];
                specs.push(Spec {
                    kernel: k,
                    access,
                    grid: Grid::new(*blocks),
                    priority: None,
                    elems,
                    after: Vec::new(),
                    op: None,
                    on: None,
                });
            }
            body => {
                // A written range that is not the whole buffer keeps the
                // rest: the task reads it too.
                let written = |data: &Arc<dyn DataAny>, off: usize, bytes: usize| {
                    if off == 0 && bytes == data.bytes() {
                        Mode::Write
                    } else {
                        Mode::ReadWrite
                    }
                };
                let (access, op) = match body {
                    NodeBody::Copy {
                        kind,
                        src,
                        src_off,
                        dst,
                        dst_off,
                        bytes,
                    } => {
                        let (src, dst) = (datum_of(src), datum_of(dst));
                        let (src_off, dst_off, bytes) = (*src_off, *dst_off, *bytes);
                        let dst_mode = written(&dst, dst_off, bytes);
                        match kind {
                            CopyKind::D2D => (
                                vec![(src, Mode::Read), (dst, dst_mode)],
                                NodeOp::Copy {
                                    src_off,
                                    dst_off,
                                    bytes,
                                },
                            ),
                            // The host memory is task data too (on the
                            // graph's device): copies over it keep their
                            // order across launches.
                            CopyKind::H2D => (
                                vec![(dst, dst_mode), (src, Mode::Read)],
                                NodeOp::Host {
                                    host_off: src_off,
                                    dev_off: dst_off,
                                    bytes,
                                    to_host: false,
                                    home,
                                },
                            ),
                            CopyKind::D2H => (
                                vec![(src, Mode::Read), (dst, dst_mode)],
                                NodeOp::Host {
                                    host_off: dst_off,
                                    dev_off: src_off,
                                    bytes,
                                    to_host: true,
                                    home,
                                },
                            ),
                        }
                    }
                    NodeBody::Fill {
                        dst,
                        off,
                        bytes,
                        pattern,
                        pattern_len,
                    } => {
                        let dst = datum_of(dst);
                        let mode = written(&dst, *off, *bytes);
                        (
                            vec![(dst, mode)],
                            NodeOp::Fill {
                                off: *off,
                                bytes: *bytes,
                                pattern: *pattern,
                                len: *pattern_len,
                            },
                        )
                    }
                    NodeBody::Copy2D(c) => {
                        let (src, dst) = (datum_of(&c.src), datum_of(&c.dst));
                        // Rows with gaps between them keep the gaps.
                        let dst_mode = if c.dst_r.contiguous() {
                            written(&dst, c.dst_r.offset, c.dst_r.width * c.dst_r.height)
                        } else {
                            Mode::ReadWrite
                        };
                        // The device end first (`NodeOp::Copy2D`).
                        let access = match c.kind {
                            CopyKind::D2D | CopyKind::D2H => {
                                vec![(src, Mode::Read), (dst, dst_mode)]
                            }
                            CopyKind::H2D => vec![(dst, dst_mode), (src, Mode::Read)],
                        };
                        let op = NodeOp::Copy2D {
                            kind: c.kind,
                            src_r: c.src_r,
                            dst_r: c.dst_r,
                            home,
                        };
                        (access, op)
                    }
                    NodeBody::Host(f) => (Vec::new(), NodeOp::Callback { f: f.clone(), home }),
                    NodeBody::Wait { timeline, value } => (
                        Vec::new(),
                        NodeOp::Wait {
                            event: Event::at(timeline.clone(), *value),
                            home,
                        },
                    ),
                    NodeBody::Kernel { .. } | NodeBody::Empty => {
                        unreachable!("matched above")
                    }
                };
                let name = body.name();
                explicit.push(before);
                tasks_of[i] = vec![specs.len()];
                specs.push(Spec {
                    kernel: Kernel::new(name, |_| {}),
                    elems: access
                        .iter()
                        .map(|_| crate::exec::kernel::ElemInfo::of::<u8>())
                        .collect(),
                    access,
                    grid: Grid::new(1),
                    priority: None,
                    after: Vec::new(),
                    op: Some(Arc::new(op)),
                    on: None,
                });
            }
        }
    }
    if specs.is_empty() {
        return Err(Error::Graph {
            op: "Graph::instantiate_on",
            detail: "the graph has no node to place (only nodes that order)".into(),
        });
    }
    // Dependencies: the buffers' access order (RAW, WAR, WAW), and the
    // graph's own edges (order only).
    let mut deps = super::dependencies_in(&specs);
    for (t, before) in explicit.into_iter().enumerate() {
        for p in before {
            if !deps[t].iter().any(|&(q, _)| q == p) {
                deps[t].push((p, 0));
            }
        }
    }
    let mut placed = place(rt, specs, deps, true)?;
    placed.slots = Arc::new(SlotSpec::of(draft));
    Ok(placed)
}
