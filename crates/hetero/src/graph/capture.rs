//! Recording: stream capture, and the two builders on top of it (an explicit
//! [`Graph`] and a linear [`CommandBuffer`]).
//!
//! Invariants:
//! - a stream records into at most one capture at a time; its `CaptureSlot`
//!   holds that capture while `capturing` is set, and the capture's `lanes`
//!   list every stream recording into it (the origin first);
//! - all of a capture's state is behind its one lock: the draft, each lane's
//!   tail (the nodes the lane's next op depends on) and the events recorded in
//!   it (each a set of nodes);
//! - an event recorded during a capture points at the capture's own timeline
//!   (stream id `CAPTURE_STREAM | graph id`), which never advances: it can be
//!   waited on only by streams recording into that capture (or joining it).

use super::{Draft, GraphRef, NodeBody, SlotInfo};
use crate::backend::BackendStream;
use crate::buffer::{MemoryKind, Storage};
use crate::event::{Event, EventPoint};
use crate::op::{Body, Op};
use crate::timeline::Timeline;
use crate::{DeviceBuffer, Error, PinnedBuffer, Result, Stream};
use bytemuck::Pod;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Stream ids of capture timelines and recording streams have this bit.
pub(crate) const CAPTURE_STREAM: u64 = 1 << 62;

static NEXT_GRAPH: AtomicU32 = AtomicU32::new(1);
static NEXT_CAPTURE: AtomicU64 = AtomicU64::new(1);
static CAPTURES: Mutex<Vec<Weak<Capture>>> = Mutex::new(Vec::new());

/// A stream's view of the capture it records into.
#[derive(Default)]
pub(crate) struct CaptureSlot {
    pub(crate) capturing: AtomicBool,
    capture: Mutex<Option<Arc<Capture>>>,
    /// A recording stream's (a command buffer's, a graph's) own capture: set
    /// once when it starts, and the stream never records into another, so
    /// its ops reach the capture without taking `capture`'s lock.
    own: std::sync::OnceLock<Arc<Capture>>,
}

pub(crate) struct Capture {
    state: Mutex<CaptureState>,
    timeline: Arc<Timeline>,
    id: u64,
}

struct CaptureState {
    draft: Draft,
    lanes: Vec<Lane>,
    /// Events recorded in the capture: the nodes each stands for.
    events: Vec<Vec<u32>>,
    active: bool,
}

struct Lane {
    stream: u64,
    /// Weak: the slot holds the capture, so a strong reference here would be
    /// a cycle that keeps both (and every buffer recorded) alive forever.
    slot: Weak<CaptureSlot>,
    tail: Vec<u32>,
    /// Explicit building: the next op depends on exactly these (not the tail).
    explicit: Option<Vec<u32>>,
    /// Whether the explicit call added its node.
    added: Option<u32>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn capture_error(op: &'static str, detail: impl Into<String>) -> Error {
    Error::Graph {
        op,
        detail: detail.into(),
    }
}

impl Capture {
    fn start(draft: Draft, host_wait: crate::CompletionMode) -> Arc<Capture> {
        // Its own serial, not the graph's id: a graph records again after a
        // capture ends, and that capture's events must not name the new one.
        let id = NEXT_CAPTURE.fetch_add(1, Ordering::Relaxed);
        let timeline = Arc::new(Timeline::new(draft.device, CAPTURE_STREAM | id, host_wait));
        let cap = Arc::new(Capture {
            state: Mutex::new(CaptureState {
                draft,
                lanes: Vec::new(),
                events: Vec::new(),
                active: true,
            }),
            timeline,
            id,
        });
        let mut all = lock(&CAPTURES);
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&cap));
        cap
    }

    fn find(id: u64) -> Option<Arc<Capture>> {
        lock(&CAPTURES)
            .iter()
            .filter_map(Weak::upgrade)
            .find(|c| c.id == id)
    }
}

fn new_graph_id() -> u32 {
    NEXT_GRAPH.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff
}

/// Whether `timeline` is a capture's (its events exist only while recording).
pub(crate) fn is_capture_timeline(timeline: &Timeline) -> bool {
    timeline.stream & CAPTURE_STREAM != 0
}

/// The capture `slot` records into, locked.
#[inline]
fn with_capture<R>(
    slot: &CaptureSlot,
    op: &'static str,
    f: impl FnOnce(&Capture, &mut CaptureState) -> Result<R>,
) -> Result<R> {
    if let Some(cap) = slot.own.get() {
        let mut st = lock(&cap.state);
        if !st.active {
            return Err(capture_error(op, "the stream is not recording"));
        }
        return f(cap, &mut st);
    }
    // Lock order: a stream's slot, then its capture's state (as in `wait`).
    let guard = lock(&slot.capture);
    let cap = guard
        .as_ref()
        .ok_or_else(|| capture_error(op, "the stream is not recording"))?;
    let mut st = lock(&cap.state);
    f(cap, &mut st)
}

/// Records a kernel launch (validated by the stream) straight from its
/// arguments: the common op of a recording, without building an op first.
pub(crate) fn kernel(
    slot: &CaptureSlot,
    stream: u64,
    kernel: &Arc<crate::kernel::KernelInner>,
    blocks: u32,
    args: &[crate::Arg<'_>],
) -> Result<()> {
    with_capture(slot, "launch", |_, st| {
        let d = &mut st.draft;
        let start = d.args.len();
        for a in args {
            match d.operand("launch", a.storage) {
                Ok(operand) => d.args.push(super::NodeArg {
                    operand,
                    elem: a.elem,
                    write: a.write,
                    len: a.storage.bytes() / a.elem.size.max(1),
                }),
                Err(e) => {
                    d.args.truncate(start);
                    return Err(e);
                }
            }
        }
        let n = (d.args.len() - start) as u32;
        st.add(
            stream,
            NodeBody::Kernel {
                kernel: kernel.clone(),
                blocks,
                args: (start as u32, n),
            },
        );
        Ok(())
    })
}

impl CaptureState {
    fn lane(&mut self, stream: u64) -> &mut Lane {
        let i = self
            .lanes
            .iter()
            .position(|l| l.stream == stream)
            .expect("a capturing stream has its lane");
        &mut self.lanes[i]
    }

    /// Adds a node for `stream`'s next op; returns its timeline-like value.
    #[inline]
    fn add(&mut self, stream: u64, body: NodeBody) -> u64 {
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
            } => {
                let start = d.args.len();
                for a in args.as_slice_iter() {
                    match d.operand("launch", &a.storage) {
                        Ok(operand) => d.args.push(super::NodeArg {
                            operand,
                            elem: a.elem,
                            write: a.write,
                            len: a.len(),
                        }),
                        Err(e) => {
                            d.args.truncate(start);
                            return Err(e);
                        }
                    }
                }
                let n = (d.args.len() - start) as u32;
                NodeBody::Kernel {
                    kernel,
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
            Body::HostWrite { .. } | Body::HostRead { .. } => {
                return Err(capture_error(
                    "write_slice/read_slice",
                    "a synchronous host copy cannot be recorded (it would wait for work \
                     that does not run while recording); record a copy from or into a \
                     pinned buffer instead",
                ))
            }
            Body::Record { .. } | Body::Graph(_) => {
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
        let index = d.internal.len() as u32;
        d.internal.push(bytes);
        let tag = GraphRef {
            graph: d.id,
            index,
            slot: false,
        };
        Ok(Arc::new(Storage::stand_in(
            d.device,
            MemoryKind::Device,
            bytes,
            tag.pack(),
        )))
    })
}

/// A slot: a stand-in bound to a real buffer at launch.
fn new_slot(slot: &CaptureSlot, info: SlotInfo) -> Result<(Arc<Storage>, u32, u32)> {
    with_capture(slot, "slot", |_, st| {
        let d = &mut st.draft;
        let index = d.slots.len() as u32;
        d.slots.push(info);
        let tag = GraphRef {
            graph: d.id,
            index,
            slot: true,
        };
        let bytes = info.len * info.elem.size;
        let s = Storage::stand_in(d.device, info.kind, bytes, tag.pack());
        Ok((Arc::new(s), d.id, index))
    })
}

/// Records an event at the capturing stream's current end.
pub(crate) fn record(slot: &CaptureSlot, stream: u64, event: &mut Event) -> Result<()> {
    with_capture(slot, "record", |cap, st| {
        let tail = st.lane(stream).tail.clone();
        st.events.push(tail);
        event.point = Some(EventPoint {
            timeline: cap.timeline.clone(),
            value: st.events.len() as u64,
            stamp: Arc::new(AtomicU64::new(0)),
        });
        Ok(())
    })
}

/// A stream waits on an event recorded in a capture: it depends on the
/// event's nodes, joining the capture if it was not recording.
pub(crate) fn wait(slot: &Arc<CaptureSlot>, stream: u64, point: &EventPoint) -> Result<()> {
    let id = point.timeline.stream & !CAPTURE_STREAM;
    let ended = || {
        capture_error(
            "wait_event",
            "the event was recorded during a stream capture that has ended; record it again \
             outside the capture",
        )
    };
    let cap = Capture::find(id).ok_or_else(ended)?;
    let mut slot_cap = lock(&slot.capture);
    let mut st = lock(&cap.state);
    if !st.active {
        return Err(ended());
    }
    let Some(nodes) = st.events.get(point.value as usize - 1).cloned() else {
        return Err(ended());
    };
    match &*slot_cap {
        Some(c) if Arc::ptr_eq(c, &cap) => {
            let lane = st.lane(stream);
            let deps = lane.explicit.as_mut().unwrap_or(&mut lane.tail);
            for n in nodes {
                if !deps.contains(&n) {
                    deps.push(n);
                }
            }
        }
        Some(_) => {
            return Err(capture_error(
                "wait_event",
                "the stream records into another capture; an event of one capture cannot \
                 be waited on in another",
            ))
        }
        None => {
            st.lanes.push(Lane {
                stream,
                slot: Arc::downgrade(slot),
                tail: nodes,
                explicit: None,
                added: None,
            });
            *slot_cap = Some(cap.clone());
            slot.capturing.store(true, Ordering::Release);
        }
    }
    Ok(())
}

/// Starts recording on `stream`.
pub(crate) fn begin(
    slot: &Arc<CaptureSlot>,
    stream: u64,
    device: u64,
    host_wait: crate::CompletionMode,
) -> Result<()> {
    begin_with(
        slot,
        stream,
        Draft::new(new_graph_id(), device),
        host_wait,
        None,
        false,
    )
}

fn begin_with(
    slot: &Arc<CaptureSlot>,
    stream: u64,
    draft: Draft,
    host_wait: crate::CompletionMode,
    explicit: Option<Vec<u32>>,
    recorder: bool,
) -> Result<()> {
    let mut slot_cap = lock(&slot.capture);
    if slot_cap.is_some() {
        return Err(capture_error(
            "begin_capture",
            "the stream is already recording into a capture; end that capture first",
        ));
    }
    let cap = Capture::start(draft, host_wait);
    lock(&cap.state).lanes.push(Lane {
        stream,
        slot: Arc::downgrade(slot),
        tail: Vec::new(),
        explicit,
        added: None,
    });
    if recorder {
        // A fresh recorder's slot: nothing set it before.
        let _ = slot.own.set(cap.clone());
    }
    *slot_cap = Some(cap);
    slot.capturing.store(true, Ordering::Release);
    Ok(())
}

/// Ends the capture started on `stream`: every stream that joined it must have
/// been joined back (its last node an ancestor of the origin's end).
pub(crate) fn end(slot: &CaptureSlot, stream: u64) -> Result<Draft> {
    let cap = lock(&slot.capture).clone().ok_or_else(|| {
        capture_error(
            "end_capture",
            "the stream is not recording; call begin_capture first",
        )
    })?;
    let mut st = lock(&cap.state);
    if st.lanes[0].stream != stream {
        return Err(capture_error(
            "end_capture",
            format!(
                "stream {stream} joined a capture begun on stream {}; end it there",
                st.lanes[0].stream
            ),
        ));
    }
    let ancestors = if st.lanes.len() > 1 {
        st.draft.ancestors(&st.lanes[0].tail)
    } else {
        Vec::new()
    };
    for lane in &st.lanes[1..] {
        if let Some(&n) = lane.tail.iter().find(|&&n| !ancestors[n as usize]) {
            return Err(capture_error(
                "end_capture",
                format!(
                    "stream {} joined the capture and its work (node {n}) was not joined back: \
                     record an event on it and make stream {stream} wait on that event before \
                     end_capture",
                    lane.stream
                ),
            ));
        }
    }
    st.active = false;
    for lane in &st.lanes {
        let Some(other) = lane.slot.upgrade() else {
            continue; // that stream is gone
        };
        other.capturing.store(false, Ordering::Release);
        if !std::ptr::eq(&*other, slot) {
            *lock(&other.capture) = None;
        }
    }
    *lock(&slot.capture) = None;
    let id = st.draft.id;
    let device = st.draft.device;
    Ok(std::mem::replace(&mut st.draft, Draft::new(id, device)))
}

impl Draft {
    /// Which nodes are `tail` or come before one of them.
    pub(crate) fn ancestors(&self, tail: &[u32]) -> Vec<bool> {
        let n = self.nodes.len();
        let mut preds: Vec<Vec<u32>> = vec![Vec::new(); n];
        for &(a, b) in &self.edges {
            preds[b as usize].push(a);
        }
        let mut seen = vec![false; n];
        let mut stack: Vec<u32> = tail.to_vec();
        while let Some(v) = stack.pop() {
            if std::mem::replace(&mut seen[v as usize], true) {
                continue;
            }
            stack.extend(&preds[v as usize]);
        }
        seen
    }
}

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
        elem: crate::kernel::ElemInfo::of::<T>(),
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
        self.with_draft(|d| super::exec::instantiate(&device, d))
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
