//! What a graph is to the engines: the recorded draft (nodes, operands,
//! edges), the schedule (`schedule.rs`, `live.rs`), the plan an instantiate
//! makes (`plan.rs`), and the run of a launch (`run.rs`). How users record
//! graphs is `api/graph`.
//!
//! Invariants of an instantiated graph (`plan.rs`, `run.rs`):
//! - nodes that touch the same buffer, at least one writing, are ordered (in
//!   recording order, among orders the explicit edges allow): every buffer has
//!   one writer at a time inside a launch, as on a stream;
//! - a launch holds the access locks of every buffer it touches, for its whole
//!   run (one acquire per buffer, not per node), so other streams' work on those
//!   buffers is ordered around it as around any op;
//! - buffers allocated inside share bytes only when every use of one
//!   happens-before every use of the other (the memory plan); the arena is held
//!   with a write lock by each launch, so launches of one plan never overlap.

pub(crate) mod launch;
mod live;
pub(crate) mod plan;
pub(crate) mod run;
pub(crate) mod schedule;

pub(crate) use plan::Plan;

use crate::exec::kernel::{ElemInfo, KernelInner};
use crate::exec::op::CopyKind;
use crate::exec::storage::{GraphHold, MemoryKind, Storage};
use crate::exec::timeline::Timeline;
use crate::Error;
use std::sync::Arc;

const SLOT_BIT: u64 = 1 << 63;

/// What a stand-in storage stands for, packed into `Storage::graph_ref`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GraphRef {
    pub(crate) graph: u32,
    pub(crate) index: u32,
    pub(crate) slot: bool,
}

impl GraphRef {
    pub(crate) fn pack(self) -> u64 {
        (u64::from(self.slot) << 63) | (u64::from(self.graph) << 32) | u64::from(self.index)
    }

    pub(crate) fn unpack(tag: u64) -> Option<GraphRef> {
        (tag != 0).then_some(GraphRef {
            graph: ((tag & !SLOT_BIT) >> 32) as u32,
            index: tag as u32,
            slot: tag & SLOT_BIT != 0,
        })
    }
}

/// A buffer as a node names it.
#[derive(Clone)]
pub(crate) enum Operand {
    /// A buffer that existed when the graph was recorded.
    Fixed(GraphHold),
    /// A slot, bound at launch.
    Slot(u32),
    /// A buffer allocated inside the graph: a range of the arena.
    Internal(u32),
}

/// A kernel node's buffer argument.
#[derive(Clone)]
pub(crate) struct NodeArg {
    pub(crate) operand: Operand,
    pub(crate) elem: &'static ElemInfo,
    pub(crate) write: bool,
    /// Elements.
    pub(crate) len: usize,
    /// Elements per partition unit between blocks (a pitched buffer's row).
    pub(crate) unit: usize,
}

/// A 2-D copy node's operands and regions (`NodeBody::Copy2D`).
#[derive(Clone)]
pub(crate) struct Copy2DNode {
    pub(crate) kind: CopyKind,
    pub(crate) src: Operand,
    pub(crate) src_r: crate::exec::transfer::ByteRegion,
    pub(crate) dst: Operand,
    pub(crate) dst_r: crate::exec::transfer::ByteRegion,
}

#[derive(Clone)]
pub(crate) enum NodeBody {
    Kernel {
        /// Index in `Draft::kernels` (a recording takes a reference on each
        /// kernel once, not once per launch of it).
        kernel: u32,
        name: &'static str,
        blocks: u32,
        /// `Draft::args` from the first, and how many.
        args: (u32, u32),
    },
    Copy {
        kind: CopyKind,
        src: Operand,
        src_off: usize,
        dst: Operand,
        dst_off: usize,
        bytes: usize,
    },
    Fill {
        dst: Operand,
        off: usize,
        bytes: usize,
        pattern: [u8; 16],
        pattern_len: u8,
    },
    /// A 2-D copy (`Stream::copy_2d_*` while capturing): byte regions checked
    /// against the buffers' lengths when recorded. Boxed: its two regions would
    /// make every node (the kernels of a capture above all) half again larger.
    Copy2D(Box<Copy2DNode>),
    Host(Arc<dyn Fn() + Send + Sync>),
    /// A wait on an event recorded outside the graph (the launch takes on its
    /// stream's fault). A launch waits for these before it starts.
    Wait {
        timeline: Arc<Timeline>,
        value: u64,
    },
    /// Orders only (a join, or a wait on a capture event with nothing before it).
    Empty,
}

impl NodeBody {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            NodeBody::Kernel { name, .. } => name,
            NodeBody::Copy { kind, .. } => match kind {
                CopyKind::H2D => "copy_h2d",
                CopyKind::D2H => "copy_d2h",
                CopyKind::D2D => "copy_d2d",
            },
            NodeBody::Fill { .. } => "fill",
            NodeBody::Copy2D(c) => match c.kind {
                CopyKind::H2D => "copy_2d_h2d",
                CopyKind::D2H => "copy_2d_d2h",
                CopyKind::D2D => "copy_2d_d2d",
            },
            NodeBody::Host(_) => "host_fn",
            NodeBody::Wait { .. } => "wait_event",
            NodeBody::Empty => "empty",
        }
    }
}

/// A slot: a buffer the launch supplies.
#[derive(Clone, Copy)]
pub(crate) struct SlotInfo {
    pub(crate) elem: &'static ElemInfo,
    pub(crate) len: usize,
    pub(crate) kind: MemoryKind,
}

/// A list a recording appends to, shared with the plans instantiated from it:
/// a plan takes it without copying (`freeze`), and recording more after that
/// copies it once (unless no plan holds it any more). Appending to it costs a
/// plain `Vec` push.
pub(crate) struct Recorded<T> {
    vec: Vec<T>,
    frozen: Option<Arc<Vec<T>>>,
}

impl<T: Clone> Recorded<T> {
    fn new() -> Self {
        Recorded {
            vec: Vec::with_capacity(64),
            frozen: None,
        }
    }

    fn thaw(&mut self) {
        if let Some(f) = self.frozen.take() {
            self.vec = Arc::try_unwrap(f).unwrap_or_else(|a| (*a).clone());
        }
    }

    #[inline]
    pub(crate) fn push(&mut self, x: T) {
        if self.frozen.is_some() {
            self.thaw();
        }
        self.vec.push(x);
    }

    pub(crate) fn truncate(&mut self, len: usize) {
        self.thaw();
        self.vec.truncate(len);
    }

    /// The list, for a plan to share.
    pub(crate) fn freeze(&mut self) -> Arc<Vec<T>> {
        if self.frozen.is_none() {
            self.frozen = Some(Arc::new(std::mem::take(&mut self.vec)));
        }
        self.frozen.clone().expect("just frozen")
    }
}

impl<T> std::ops::Deref for Recorded<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.frozen {
            Some(f) => f,
            None => &self.vec,
        }
    }
}

/// A graph being recorded: nodes in recording order, explicit edges, the
/// buffers allocated inside (bytes) and the slots.
pub(crate) struct Draft {
    pub(crate) id: u32,
    pub(crate) device: u64,
    pub(crate) nodes: Recorded<NodeBody>,
    pub(crate) args: Recorded<NodeArg>,
    pub(crate) edges: Vec<(u32, u32)>,
    pub(crate) internal: Vec<usize>,
    pub(crate) slots: Vec<SlotInfo>,
    /// The kernels kernel nodes run, each once.
    pub(crate) kernels: Vec<Arc<KernelInner>>,
    /// The managed pages the nodes declared (the managed layer's records,
    /// opaque here): each launch makes them resident first.
    pub(crate) managed: Vec<Arc<dyn std::any::Any + Send + Sync>>,
}

impl Draft {
    pub(crate) fn new(id: u32, device: u64) -> Self {
        Draft {
            id,
            device,
            nodes: Recorded::new(),
            args: Recorded::new(),
            edges: Vec::with_capacity(64),
            internal: Vec::new(),
            slots: Vec::new(),
            kernels: Vec::new(),
            managed: Vec::new(),
        }
    }

    /// `kernel`'s index in `kernels`: the last one's when it is the same (a
    /// recording mostly launches one kernel again and again), else a new one.
    #[inline]
    pub(crate) fn kernel_index(&mut self, kernel: &Arc<KernelInner>) -> u32 {
        match self.kernels.last() {
            Some(k) if Arc::ptr_eq(k, kernel) => {}
            _ => self.kernels.push(kernel.clone()),
        }
        (self.kernels.len() - 1) as u32
    }

    /// The operand for `storage` in this graph, or an error when it stands in
    /// for a buffer of another graph.
    pub(crate) fn operand(
        &self,
        op: &'static str,
        storage: &Arc<Storage>,
    ) -> crate::Result<Operand> {
        match GraphRef::unpack(storage.graph_ref) {
            None => Ok(Operand::Fixed(GraphHold::new(storage))),
            Some(r) if r.graph != self.id => Err(Error::Graph {
                op,
                detail: format!(
                    "the buffer belongs to another graph (graph {}, this is graph {}); \
                     buffers allocated while recording a graph exist only in it",
                    r.graph, self.id
                ),
            }),
            Some(r) if r.slot => Ok(Operand::Slot(r.index)),
            Some(r) => Ok(Operand::Internal(r.index)),
        }
    }

    /// Adds a node after `deps`; returns its index.
    pub(crate) fn push(&mut self, body: NodeBody, deps: &[u32]) -> u32 {
        let v = self.nodes.len() as u32;
        self.nodes.push(body);
        for &d in deps {
            self.edges.push((d, v));
        }
        v
    }

    /// The buffers node `v` touches, with whether it writes them.
    pub(crate) fn accesses(&self, v: usize, mut f: impl FnMut(&Operand, bool)) {
        accesses_of(&self.nodes[v], &self.args, &mut f);
    }
}

pub(crate) fn accesses_of(body: &NodeBody, args: &[NodeArg], f: &mut impl FnMut(&Operand, bool)) {
    match body {
        NodeBody::Kernel { args: (a, n), .. } => {
            for arg in &args[*a as usize..(*a + *n) as usize] {
                f(&arg.operand, arg.write);
            }
        }
        NodeBody::Copy { src, dst, .. } => {
            f(src, false);
            f(dst, true);
        }
        NodeBody::Copy2D(c) => {
            f(&c.src, false);
            f(&c.dst, true);
        }
        NodeBody::Fill { dst, .. } => f(dst, true),
        NodeBody::Host(_) | NodeBody::Wait { .. } | NodeBody::Empty => {}
    }
}
