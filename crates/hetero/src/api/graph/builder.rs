//! Building graphs on top of recording: an explicit [`Graph`] and a linear
//! [`CommandBuffer`], each a recorder stream (a backend stream that runs
//! nothing) in capture mode, and the slots a launch binds.

use crate::api::event::Event;
use crate::api::graph::capture::{
    begin_with, capture_error, end, lock, new_graph_id, new_slot, with_capture, CAPTURE_STREAM,
};
use crate::backend::BackendStream;
use crate::exec::graph::{Draft, NodeBody, SlotInfo};
use crate::exec::op::Op;
use crate::exec::storage::MemoryKind;
use crate::exec::timeline::Timeline;
use crate::{DeviceBuffer, Error, PinnedBuffer, Result, Stream};
use bytemuck::Pod;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The backend stream of a recorder: it never runs anything (its ops go into
/// the graph it records).
struct Recorder {
    id: u64,
    timeline: Arc<Timeline>,
}

static NEXT_RECORDER: AtomicU64 = AtomicU64::new(1);

impl BackendStream for Recorder {
    fn id(&self) -> u64 {
        self.id
    }
    fn timeline(&self) -> &Arc<Timeline> {
        &self.timeline
    }
    fn submit(&self, _op: Op) -> Result<u64> {
        Err(capture_error("submit", "a recording stream runs nothing"))
    }
    fn submitted(&self) -> u64 {
        0
    }
    fn priority(&self) -> u8 {
        0
    }
    fn set_priority(&self, _priority: u8) {}
    fn hardware_queue(&self) -> usize {
        0
    }
    fn close(&self) {}
    fn is_closed(&self) -> bool {
        false
    }
    fn release(&self) {}
}

fn recorder(device: &crate::Device) -> Stream {
    let id = CAPTURE_STREAM | (1 << 61) | NEXT_RECORDER.fetch_add(1, Ordering::Relaxed);
    let timeline = Arc::new(Timeline::new(device.id(), id, device.host_wait()));
    Stream::new(Arc::new(Recorder { id, timeline }), device.clone())
}

/// A node of a [`Graph`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId {
    pub(crate) graph: u32,
    pub(crate) index: u32,
}

impl NodeId {
    /// The node's position in recording order.
    pub fn index(&self) -> usize {
        self.index as usize
    }
}

/// A buffer a graph's launch supplies: record work on it like on any device
/// buffer (it derefs to one), then bind a real buffer of the same length at
/// each launch ([`Bindings::bind`](crate::Bindings::bind)). Changing a binding
/// costs nothing at instantiate and O(1) per slot at launch.
pub struct Slot<T: Pod> {
    buffer: DeviceBuffer<T>,
    pub(crate) graph: u32,
    pub(crate) index: u32,
}

/// A pinned host buffer a graph's launch supplies (the source or destination of
/// its host copies); see [`Slot`].
pub struct PinnedSlot<T: Pod> {
    buffer: PinnedBuffer<T>,
    pub(crate) graph: u32,
    pub(crate) index: u32,
}

impl<T: Pod> std::ops::Deref for Slot<T> {
    type Target = DeviceBuffer<T>;
    fn deref(&self) -> &DeviceBuffer<T> {
        &self.buffer
    }
}

impl<T: Pod> std::ops::Deref for PinnedSlot<T> {
    type Target = PinnedBuffer<T>;
    fn deref(&self) -> &PinnedBuffer<T> {
        &self.buffer
    }
}

impl<T: Pod> std::ops::DerefMut for PinnedSlot<T> {
    fn deref_mut(&mut self) -> &mut PinnedBuffer<T> {
        &mut self.buffer
    }
}

fn slot_info<T: Pod>(len: usize, kind: MemoryKind) -> Result<SlotInfo> {
    len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "slot of {len} elements overflows the address space"
        ))
    })?;
    Ok(SlotInfo {
        elem: crate::exec::kernel::ElemInfo::of::<T>(),
        len,
        kind,
    })
}

/// What [`Graph`] and [`CommandBuffer`] share: a recording stream and the
/// buffers and slots made for it.
fn make_slot<T: Pod>(rec: &Stream, len: usize) -> Result<Slot<T>> {
    let (s, graph, index) = new_slot(rec.capture_slot(), slot_info::<T>(len, MemoryKind::Device)?)?;
    Ok(Slot {
        buffer: DeviceBuffer::from_storage(s, len),
        graph,
        index,
    })
}

fn make_pinned_slot<T: Pod>(rec: &Stream, len: usize) -> Result<PinnedSlot<T>> {
    let (s, graph, index) = new_slot(rec.capture_slot(), slot_info::<T>(len, MemoryKind::Pinned)?)?;
    Ok(PinnedSlot {
        buffer: PinnedBuffer::from_storage(s, len),
        graph,
        index,
    })
}

/// A graph built explicitly: nodes and the edges between them.
///
/// Every node method takes the nodes it depends on and validates like the
/// stream operation of the same name. Nodes that touch the same buffer, one of
/// them writing, are also ordered in the order they were added (so a graph is
/// never a data race). Buffers from [`Graph::alloc`] exist only inside the
/// graph: the memory plan places them in one arena at instantiate.
///
/// ```
/// use hetero::{Arg, Device, Graph, Grid, Kernel};
/// let dev = Device::host().unwrap();
/// let mut g = Graph::new(&dev).unwrap();
/// let out = dev.alloc::<u32>(4).unwrap();
/// let k = Kernel::new("ones", |b| b.write::<u32>(0).fill(1));
/// let a = g.kernel(&k, Grid::new(1), &[Arg::write(&out)], &[]).unwrap();
/// let tmp = g.alloc::<u32>(4).unwrap();
/// let c = g.copy_d2d(&out, &tmp, &[a]).unwrap();
/// let exec = g.instantiate().unwrap();
/// let s = dev.create_stream().unwrap();
/// s.launch_graph(&exec).unwrap();
/// assert_eq!(s.read_to_vec(&out).unwrap(), vec![1; 4]);
/// # let _ = c;
/// ```
pub struct Graph {
    rec: Stream,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph").field("nodes", &self.len()).finish()
    }
}

impl Graph {
    /// An empty graph of `device`.
    pub fn new(device: &crate::Device) -> Result<Graph> {
        Self::from_draft(device, Draft::new(new_graph_id(), device.id()))
    }

    pub(crate) fn from_draft(device: &crate::Device, draft: Draft) -> Result<Graph> {
        let rec = recorder(device);
        begin_with(
            rec.capture_slot(),
            rec.id(),
            draft,
            device.host_wait(),
            Some(Vec::new()),
            true,
        )?;
        Ok(Graph { rec })
    }

    fn with_draft<R>(&self, f: impl FnOnce(&mut Draft) -> R) -> R {
        let cap = lock(&self.rec.capture_slot().capture)
            .clone()
            .expect("a graph always records");
        let mut st = lock(&cap.state);
        f(&mut st.draft)
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.with_draft(|d| d.nodes.len())
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every node, in recording order.
    pub fn nodes(&self) -> Vec<NodeId> {
        self.with_draft(|d| {
            (0..d.nodes.len() as u32)
                .map(|index| NodeId { graph: d.id, index })
                .collect()
        })
    }

    /// The name of a node's operation (a kernel's name, "copy_h2d", …).
    pub fn node_name(&self, node: NodeId) -> Result<&'static str> {
        self.with_draft(|d| {
            check_node(d, node, "node_name")?;
            Ok(d.nodes[node.index as usize].name())
        })
    }

    /// Adds one node after `deps`, made by `f` on the recording stream.
    fn add(&mut self, deps: &[NodeId], f: impl FnOnce(&Stream) -> Result<()>) -> Result<NodeId> {
        let graph = {
            let slot = self.rec.capture_slot();
            with_capture(slot, "add node", |_, st| {
                for &n in deps {
                    check_node(&st.draft, n, "add node")?;
                }
                let lane = &mut st.lanes[0];
                lane.explicit = Some(deps.iter().map(|n| n.index).collect());
                lane.added = None;
                Ok(st.draft.id)
            })?
        };
        let result = f(&self.rec);
        with_capture(self.rec.capture_slot(), "add node", |_, st| {
            let lane = &mut st.lanes[0];
            let added = lane.added.take();
            let deps = lane.explicit.replace(Vec::new()).unwrap_or_default();
            result?;
            let index = match added {
                Some(v) => v,
                None => st.draft.push(NodeBody::Empty, &deps),
            };
            Ok(NodeId { graph, index })
        })
    }

    /// A kernel launch after `deps` (see [`Stream::launch`]).
    pub fn kernel(
        &mut self,
        kernel: &crate::Kernel,
        grid: crate::Grid,
        args: &[crate::Arg<'_>],
        deps: &[NodeId],
    ) -> Result<NodeId> {
        self.add(deps, |s| s.launch(kernel, grid, args))
    }

    /// A copy of pinned `src` into `dst` after `deps` (see [`Stream::copy_h2d`]).
    pub fn copy_h2d<T: Pod>(
        &mut self,
        src: &PinnedBuffer<T>,
        dst: &DeviceBuffer<T>,
        deps: &[NodeId],
    ) -> Result<NodeId> {
        self.add(deps, |s| s.copy_h2d(src, dst))
    }

    /// A copy of `src` into pinned `dst` after `deps` (see [`Stream::copy_d2h`]).
    pub fn copy_d2h<T: Pod>(
        &mut self,
        src: &DeviceBuffer<T>,
        dst: &mut PinnedBuffer<T>,
        deps: &[NodeId],
    ) -> Result<NodeId> {
        self.add(deps, |s| s.copy_d2h(src, dst))
    }

    /// A device-to-device copy after `deps` (see [`Stream::copy_d2d`]).
    pub fn copy_d2d<T: Pod>(
        &mut self,
        src: &DeviceBuffer<T>,
        dst: &DeviceBuffer<T>,
        deps: &[NodeId],
    ) -> Result<NodeId> {
        self.add(deps, |s| s.copy_d2d(src, dst))
    }

    /// Sets every element of `dst` to `value` after `deps`.
    pub fn fill<T: Pod>(
        &mut self,
        dst: &DeviceBuffer<T>,
        value: T,
        deps: &[NodeId],
    ) -> Result<NodeId> {
        self.add(deps, |s| s.fill(dst, value))
    }

    /// A host callback after `deps`, run at every launch.
    pub fn host(
        &mut self,
        f: impl Fn() + Send + Sync + 'static,
        deps: &[NodeId],
    ) -> Result<NodeId> {
        self.add(deps, |s| s.host_callback(f))
    }

    /// A node that only orders: it completes when `deps` have.
    pub fn empty(&mut self, deps: &[NodeId]) -> Result<NodeId> {
        self.add(deps, |_| Ok(()))
    }

    /// Waits for `event` (recorded outside the graph, on this device) after
    /// `deps`; each launch waits on the record the event held when the node was
    /// added.
    pub fn wait_event(&mut self, event: &Event, deps: &[NodeId]) -> Result<NodeId> {
        self.add(deps, |s| s.wait_event(event))
    }

    /// Makes `to` depend on `from`.
    pub fn add_dependency(&mut self, from: NodeId, to: NodeId) -> Result<()> {
        with_capture(self.rec.capture_slot(), "add_dependency", |_, st| {
            check_node(&st.draft, from, "add_dependency")?;
            check_node(&st.draft, to, "add_dependency")?;
            if from == to {
                return Err(capture_error(
                    "add_dependency",
                    format!("node {} cannot depend on itself", from.index),
                ));
            }
            st.draft.edges.push((from.index, to.index));
            Ok(())
        })
    }

    /// A device buffer of `len` elements that exists only inside the graph
    /// (contents unspecified at each launch). The memory plan places it.
    pub fn alloc<T: Pod>(&mut self, len: usize) -> Result<DeviceBuffer<T>> {
        self.rec.alloc(len)
    }

    /// A device buffer slot bound at launch.
    pub fn slot<T: Pod>(&mut self, len: usize) -> Result<Slot<T>> {
        make_slot(&self.rec, len)
    }

    /// A pinned buffer slot bound at launch.
    pub fn pinned_slot<T: Pod>(&mut self, len: usize) -> Result<PinnedSlot<T>> {
        make_pinned_slot(&self.rec, len)
    }

    /// Validates the graph and turns it into an executable plan: a schedule of
    /// chains over the device's compute units and a memory plan (its arena is
    /// allocated now and reused by every launch).
    pub fn instantiate(&self) -> Result<crate::GraphExec> {
        let device = self.rec.device().clone();
        self.with_draft(|d| {
            let (inner, params) = crate::exec::graph::plan::instantiate(
                d,
                device.properties().compute_units,
                device.graph_memory_slack(),
                device.reach(),
                |bytes| device.device_storage::<u8>(bytes, 0),
            )?;
            Ok(crate::GraphExec {
                inner: Arc::new(inner),
                params: Arc::new(params),
            })
        })
    }
}

impl Graph {
    /// Places the graph's nodes across the devices of `ctx` (which holds
    /// the graph's device) with HEFT, as
    /// [`TaskGraph::instantiate_on`](crate::TaskGraph::instantiate_on) does
    /// tasks: each node a task over the buffers it names (ordered by the
    /// graph's edges and the buffers' accesses), execution times from the
    /// context's performance models, transfers from its link models. The
    /// plan is made now; a launch replays it with no scheduling decision and
    /// ends with the buffers the graph writes holding their results on the
    /// graph's device (wait for the launch, then read them as after a launch
    /// on one stream).
    ///
    /// Kernels, copies (flat or 2-D) and fills between the graph's buffers
    /// go where HEFT puts them; copies to or from host memory, host
    /// callbacks and waits on outside events run on the graph's device;
    /// nodes that only order add edges. A buffer the graph allocates is a
    /// buffer of the graph's device made now, for the placed graph's life.
    /// A slot is bound at each launch
    /// ([`PlacedTaskGraph::launch_with`](crate::PlacedTaskGraph::launch_with));
    /// a managed argument is an [`Error::Graph`].
    ///
    /// ```
    /// use hetero::{Arg, Context, Device, Graph, Grid, Kernel};
    /// let devices = [Device::host().unwrap(), Device::host().unwrap()];
    /// let ctx = Context::new(&devices).unwrap();
    /// # ctx.set_perfmodel_dir(None); // the doctest writes no model file
    /// let x = devices[0].alloc::<u32>(4).unwrap();
    /// let ones = Kernel::new("ones", |b| b.write::<u32>(0).fill(1));
    /// let mut g = Graph::new(&devices[0]).unwrap();
    /// g.kernel(&ones, Grid::new(1), &[Arg::write(&x)], &[]).unwrap();
    /// let placed = g.instantiate_on(&ctx).unwrap();
    /// placed.launch().unwrap().wait().unwrap();
    /// let s = devices[0].create_stream().unwrap();
    /// assert_eq!(s.read_to_vec(&x).unwrap(), vec![1; 4]);
    /// ```
    pub fn instantiate_on(&self, ctx: &crate::Context) -> Result<crate::PlacedTaskGraph> {
        let device = self.rec.device().clone();
        self.with_draft(|d| crate::api::task::stream_graph::place_graph(d, &device, ctx))
    }
}

fn check_node(d: &Draft, n: NodeId, op: &'static str) -> Result<()> {
    if n.graph != d.id {
        return Err(capture_error(
            op,
            format!("node {} belongs to another graph", n.index),
        ));
    }
    if n.index as usize >= d.nodes.len() {
        return Err(capture_error(
            op,
            format!("node {} does not exist", n.index),
        ));
    }
    Ok(())
}

/// A linear recording of stream operations, replayed with one submission.
///
/// It derefs to a [`Stream`] in recording mode: every stream operation records
/// a command after the previous one (host callbacks through
/// [`Stream::host_callback`], which takes an `Fn`: a replay runs it again).
/// [`CommandBuffer::finish`] instantiates it.
///
/// ```
/// use hetero::{Device, CommandBuffer};
/// let dev = Device::host().unwrap();
/// let cb = CommandBuffer::new(&dev).unwrap();
/// let buf = dev.alloc::<f32>(16).unwrap();
/// cb.fill(&buf, 2.0).unwrap();
/// let exec = cb.finish().unwrap();
/// let s = dev.create_stream().unwrap();
/// for _ in 0..3 {
///     s.launch_graph(&exec).unwrap();
/// }
/// assert_eq!(s.read_to_vec(&buf).unwrap(), vec![2.0; 16]);
/// ```
pub struct CommandBuffer {
    rec: Stream,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

impl std::ops::Deref for CommandBuffer {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        &self.rec
    }
}

impl CommandBuffer {
    /// An empty command buffer of `device`.
    pub fn new(device: &crate::Device) -> Result<CommandBuffer> {
        let rec = recorder(device);
        begin_with(
            rec.capture_slot(),
            rec.id(),
            Draft::new(new_graph_id(), device.id()),
            device.host_wait(),
            None,
            true,
        )?;
        Ok(CommandBuffer {
            rec,
            _not_sync: PhantomData,
        })
    }

    /// A device buffer slot bound at launch.
    pub fn slot<T: Pod>(&self, len: usize) -> Result<Slot<T>> {
        make_slot(&self.rec, len)
    }

    /// A pinned buffer slot bound at launch.
    pub fn pinned_slot<T: Pod>(&self, len: usize) -> Result<PinnedSlot<T>> {
        make_pinned_slot(&self.rec, len)
    }

    /// The last command recorded, as a node of the graph (for
    /// [`GraphExec::set_scalars`](crate::GraphExec::set_scalars)).
    pub fn last_node(&self) -> Option<NodeId> {
        with_capture(self.rec.capture_slot(), "last_node", |_, st| {
            Ok(st.lanes[0].tail.last().map(|&index| NodeId {
                graph: st.draft.id,
                index,
            }))
        })
        .ok()
        .flatten()
    }

    /// The recording as a graph (to add nodes or dependencies).
    pub fn into_graph(self) -> Result<Graph> {
        let draft = end(self.rec.capture_slot(), self.rec.id())?;
        Graph::from_draft(self.rec.device(), draft)
    }

    /// Instantiates the recording.
    pub fn finish(self) -> Result<crate::GraphExec> {
        self.into_graph()?.instantiate()
    }
}
