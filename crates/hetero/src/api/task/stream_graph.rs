//! Stream graphs placed across the devices of a context
//! ([`Graph::instantiate_on`](crate::Graph::instantiate_on)): each kernel node
//! becomes a task over the buffers its arguments name, ordered by the
//! graph's edges and by its buffers' accesses, and the whole is placed with
//! HEFT and planned as a task graph is (`graph.rs`). Each buffer is task
//! data whose replica on the graph's device is the buffer itself; a launch
//! ends with every buffer the graph writes holding its result there, so the
//! graph's user reads its buffers as after a launch on one device.
//!
//! Placed: kernel nodes (host closure or device code) over buffers that
//! existed when the graph was recorded, and nodes that only order. Other
//! nodes (copies, fills, host callbacks, waits on outside events) and
//! buffers the graph allocates or binds at launch are a typed error.

use super::data::{DataAny, DataState};
use super::graph::{place, PlacedTaskGraph};
use super::{Mode, Spec};
use crate::api::buffer::{Arg, DeviceBuffer};
use crate::exec::graph::{Draft, NodeBody, Operand};
use crate::exec::storage::{GraphHold, Storage};
use crate::{Context, Device, Error, Grid, Kernel, Result, Stream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// A stream graph's buffer as task data: `home` is the graph's device (its
/// index in the context), where the replica is the user's buffer.
struct GraphData {
    id: u64,
    bytes: usize,
    home: usize,
    hold: GraphHold,
    replicas: Vec<OnceLock<DeviceBuffer<u8>>>,
    state: Mutex<DataState>,
}

impl GraphData {
    fn storage(&self, at: usize) -> Option<&Arc<Storage>> {
        if at == self.home {
            Some(&self.hold)
        } else {
            self.replicas[at].get().map(|b| &*b.storage)
        }
    }
}

/// Runs `f` on a buffer handle over `storage` that gives it back unreleased.
fn as_buffer<R>(storage: &Arc<Storage>, f: impl FnOnce(&DeviceBuffer<u8>) -> R) -> R {
    let b = DeviceBuffer::<u8>::from_storage(storage.clone(), storage.bytes());
    let r = f(&b);
    drop(b.into_storage());
    r
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
    fn replica(&self, at: usize, device: &Device) -> Result<()> {
        if at != self.home && self.replicas[at].get().is_none() {
            let b = device.alloc::<u8>(self.bytes)?;
            let _ = self.replicas[at].set(b);
        }
        Ok(())
    }
    fn arg(&self, at: usize, write: bool) -> Arg<'_> {
        Arg {
            storage: self.storage(at).expect("replica made before its use"),
            elem: crate::exec::kernel::ElemInfo::of::<u8>(),
            write,
            managed: None,
        }
    }
    fn copy(&self, stream: &Stream, from: usize, to: usize) -> Result<()> {
        let (Some(a), Some(b)) = (self.storage(from), self.storage(to)) else {
            return Err(Error::InvalidArgument(
                "placed graph: a copy between replicas that do not exist".into(),
            ));
        };
        as_buffer(a, |a| as_buffer(b, |b| stream.copy_peer(a, b)))
    }
}

fn refuse(node: usize, what: &str) -> Error {
    Error::Graph {
        op: "Graph::instantiate_on",
        detail: format!(
            "node {node} {what}; a graph placed across devices holds kernel nodes over buffers \
             allocated outside it (and nodes that only order): instantiate it on its device \
             instead, or record the rest outside"
        ),
    }
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
    let mut datum: HashMap<usize, Arc<GraphData>> = HashMap::new();
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
                    let Operand::Fixed(hold) = &a.operand else {
                        return Err(refuse(i, "uses a buffer allocated in the graph or a slot"));
                    };
                    let key = Arc::as_ptr(hold) as usize;
                    let d = datum
                        .entry(key)
                        .or_insert_with(|| {
                            let mut valid = vec![None; rt.devices.len()];
                            valid[home] = Some(crate::Event::new());
                            Arc::new(GraphData {
                                id: super::data::next_data_id(),
                                bytes: hold.bytes(),
                                home,
                                hold: hold.clone(),
                                replicas: (0..rt.devices.len()).map(|_| OnceLock::new()).collect(),
                                state: Mutex::new(DataState {
                                    valid,
                                    writer: None,
                                    readers: Vec::new(),
                                }),
                            })
                        })
                        .clone();
                    let mode = if a.write { Mode::ReadWrite } else { Mode::Read };
                    access.push((d as Arc<dyn DataAny>, mode));
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
                });
            }
            NodeBody::Copy { .. } | NodeBody::Copy2D(_) => return Err(refuse(i, "is a copy")),
            NodeBody::Fill { .. } => return Err(refuse(i, "is a fill")),
            NodeBody::Host(_) => return Err(refuse(i, "is a host callback")),
            NodeBody::Wait { .. } => return Err(refuse(i, "waits on an outside event")),
        }
    }
    if specs.is_empty() {
        return Err(Error::Graph {
            op: "Graph::instantiate_on",
            detail: "the graph has no kernel node to place".into(),
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
    place(rt, specs, deps, true)
}
