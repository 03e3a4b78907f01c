//! Graph launches on the Vulkan device: the engine thread walks the plan's
//! nodes in a dependency order (`RunState::run_all`, the runner every
//! backend shares, so a failed node fails the launch and skips exactly its
//! dependents) and records each device node into the flush's command buffer,
//! a full barrier before each: kernels with device code (their scalars as
//! push constants), copies, fills and 2-D copies. The launch completes with
//! its flight, like any other op.
//!
//! Host nodes run on the engine thread, between the device nodes: a launch
//! with any is taken only when its stream and the device have nothing in
//! flight, and before each host node the engine submits what it recorded and
//! waits until the device ran it (so the host node sees its predecessors'
//! effects). Waits on events outside the graph were ops before the launch;
//! wait and empty nodes record nothing.
//!
//! Operands resolve at launch: fixed buffers and bound slots to their chunk,
//! the graph's own buffers to their place in the plan's arena.
//!
//! A launch without host nodes is recorded once (`Recorded`) and its command
//! buffers resubmitted by the launches after it. Its kernel nodes are
//! recorded through their pipeline's graph variant (`Engine::dispatch_node`):
//! scalars read from the node's slot of a host-visible parameter block, not
//! push constants; buffers bound from update-after-bind descriptor sets
//! where the driver has them, else in the command buffer. So an update
//! (`GraphExec::set_scalars`: the parameters are copied on write, so `Arc`
//! identity says whether any changed, and `Params::same_node` which) that
//! keeps a node's kernel, grid and arguments is a write of its slot, and a
//! rebinding that moves a slot (chunk and offset) rewrites the sets of the
//! nodes that use it: nothing is recorded.
//!
//! Slots and sets must not change while a launch that reads them is pending
//! (the spec forbids it even for update-after-bind descriptors), and a
//! launch queued before an update must see the old values. Waiting for the
//! pending launch would stall the engine thread and end running ahead (and
//! the launch may still sit unsubmitted in the open batch); so a recording
//! is kept in up to `COPIES` (two) copies, each with its own slots and sets,
//! and a launch takes a copy that holds its values already, else the least
//! recently used one the device has run (`Engine::compute_ran` on the batch
//! it last went in), brought up to date (`refresh`). A loop of update and
//! launch thus alternates between the two for the cost of one more
//! recording; when both are pending (a third launch queued with other
//! values) a copy is recorded anew in place of the older, whose pending
//! launches hold what they read (command buffers hold the block and sets).
//!
//! What still records again: a change of shape (another kernel, grid or
//! arguments), a kernel without a graph variant (its scalars are push
//! constants), a moved slot of a copy or fill node, or of any node on a
//! driver without update-after-bind (lavapipe). The first such change splits
//! the copy into segments of `segment_nodes` consecutive nodes, each its own
//! command buffer (all resubmitted in the one submission of their flush),
//! and from then on only the segments holding such a change are recorded
//! again, never the whole graph. Every command buffer recorded for a kept
//! recording counts in `Device::graph_recordings`. A launch whose recording
//! failed is not kept.
//!
//! Invariants: a node is recorded only after every node it depends on was
//! (the runner's order) and behind a full barrier, so it runs after them on
//! the device; staging buffers of fills live until the launch completes
//! (`Nodes::into_staging`).

use super::engine::{Engine, Times};
use super::record::{fill_word, param_bytes, rec_or_new, NodeDispatch, PUSH_BYTES};
use super::Shared;
use crate::exec::graph::launch::{run_node, GraphLaunch, NodeHooks};
use crate::exec::graph::plan::{Params, Plan};
use crate::exec::graph::run::RunState;
use crate::exec::graph::{NodeBody, Operand};
use hetero_memory::PinnedAllocation;
use hetero_vulkan::{Chunk, CommandBuffer, GraphSets, ParamBlock, Recorder, SetId};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// Recorded graphs kept at most (the oldest plan's goes first).
const KEEP_RECORDED: usize = 64;

/// Copies of a recording kept at most. An update writes a copy no pending
/// launch reads; with two, a loop of update-then-launch finds the copy
/// before last free as soon as the device ran the launch before last, and
/// never waits (see the module docs). A third launch queued with a third
/// set of values while both are pending records a copy anew (as a first
/// launch does) in place of the least recently used one.
const COPIES: usize = 2;

/// The nodes per segment once a kept recording is split for updates: about
/// √(16·n) for n nodes, at least 32. Each segment is its own command buffer:
/// more segments make an update cheaper (it re-records one, at about 0.5 µs
/// per dispatch on lavapipe) and every launch dearer (about 9 µs per command
/// buffer there; about 1 µs on a GPU); √(16·n) is near the least of the two
/// summed on lavapipe (√(2·9/0.5 · n) ≈ 4.2·√n) and on a GPU (√(5n)).
fn segment_nodes(n: usize) -> usize {
    (((16 * n) as f64).sqrt().ceil() as usize).max(32)
}

/// Where a slot's buffer lay when a graph was recorded: chunk address,
/// offset, bytes (`None`: unbound or unused).
type SlotPlace = Option<(usize, u64, u64)>;

/// A run of consecutive nodes (in the order the launch recorded them) in one
/// command buffer.
struct Segment {
    nodes: Vec<u32>,
    /// The slots its nodes use.
    slots: Vec<u32>,
    /// `None` when its nodes record nothing (waits, empty nodes, empty copies).
    cmd: Option<CommandBuffer>,
    /// Staging buffers its fills copy from: kept with it, and by each launch
    /// until it completes.
    staging: Arc<Vec<PinnedAllocation>>,
    /// Kernel nodes whose scalars are push constants in `cmd` (their kernel
    /// has no graph variant): a new scalar records the segment again.
    pushed: Vec<u32>,
    /// Kernel nodes whose buffers are bound from `sets` (a device with
    /// update-after-bind descriptors): a moved slot rewrites the set.
    bound: Vec<(u32, SetId)>,
    sets: GraphSets,
}

/// One copy of a recording: its command buffers and what they read outside
/// them, the nodes' parameter slots and (in the segments) descriptor sets.
struct Copy {
    /// The parameters it holds (held, so their address stays theirs).
    params: Arc<Params>,
    /// Where each slot's buffer lay: chunk address, offset, bytes.
    slots: Vec<SlotPlace>,
    segments: Vec<Segment>,
    /// One slot per node, read by its kernel's graph variant.
    block: ParamBlock,
    /// The compute lane's batch its last launch went in (0: none to wait for).
    batch: u64,
    /// When it was last used (`Recorded::tick`).
    used: u64,
}

/// A graph launch recorded once, in one or two copies.
struct Kept {
    plan: Weak<Plan>,
    copies: Vec<Copy>,
    /// When it was last used (`Recorded::tick`).
    used: u64,
}

/// The engine's recorded graphs, by plan address.
#[derive(Default)]
pub(super) struct Recorded {
    kept: HashMap<usize, Kept>,
    tick: u64,
}

/// Where the slots of `l` lie now (`None`: unbound or unused).
fn slot_places(sh: &Shared, l: &GraphLaunch) -> Result<Vec<SlotPlace>, String> {
    let Some(t) = &l.table else {
        return Ok(Vec::new());
    };
    t.iter()
        .enumerate()
        .map(|(i, s)| match s.as_ref().filter(|_| l.exec.slots.used[i]) {
            Some(s) => {
                let (c, o) = sh.place(s)?;
                Ok(Some((Arc::as_ptr(&c) as usize, o, s.bytes() as u64)))
            }
            None => Ok(None),
        })
        .collect()
}

/// The slots node `v` of `l` uses.
fn node_slots(l: &GraphLaunch, v: u32, out: &mut Vec<u32>) {
    let e = &*l.exec;
    let mut add = |o: &Operand| {
        if let Operand::Slot(i) = o {
            if !out.contains(i) {
                out.push(*i);
            }
        }
    };
    let p = &l.params.nodes[v as usize];
    if p.kernel.is_some() {
        e.args[p.args.0 as usize..p.args.1 as usize]
            .iter()
            .for_each(|a| add(&a.operand));
        return;
    }
    match &e.nodes[v as usize] {
        NodeBody::Copy { src, dst, .. } => {
            add(src);
            add(dst);
        }
        NodeBody::Fill { dst, .. } => add(dst),
        NodeBody::Copy2D(c) => {
            add(&c.src);
            add(&c.dst);
        }
        _ => {}
    }
}

/// The staging buffers a launch reads until it completes.
pub(super) enum Staging {
    Own(Vec<PinnedAllocation>),
    Shared(Vec<Arc<Vec<PinnedAllocation>>>),
}

/// Runs graph launch `l` into the engine's flush: resubmits its recorded
/// segments when they still fit (re-recording the segments an update or a
/// rebinding changed), else records it (and keeps it when it has no host
/// nodes and recorded without a fault). The launch's result and the staging
/// buffers it needs until it completes.
pub(super) fn launch(
    engine: &mut Engine,
    sh: &Shared,
    rec: &mut Option<Recorder>,
    l: &GraphLaunch,
    times: &mut Times,
) -> (Result<(), String>, Staging) {
    // While profiling each launch is recorded with its nodes' timestamps. A
    // kept recording means the plan has no host nodes: they are looked for
    // only when there is none.
    let profiling = crate::exec::clock::profiling();
    let key = Arc::as_ptr(&l.exec) as usize;
    let kept = engine.graphs.kept.contains_key(&key);
    if profiling || (!kept && has_host_nodes(l)) {
        let mut nodes = Nodes::new(engine, sh, rec);
        nodes.times = profiling.then_some(times);
        let result = nodes.run(l);
        return (result, Staging::Own(nodes.into_staging()));
    }
    let slots = match slot_places(sh, l) {
        Ok(s) => s,
        Err(m) => return (Err(m), Staging::Own(Vec::new())),
    };
    engine.graphs.tick += 1;
    let tick = engine.graphs.tick;
    let mut kept = engine
        .graphs
        .kept
        .remove(&key)
        .filter(|k| k.plan.strong_count() > 0);
    if let Some(k) = &mut kept {
        match pick(engine, sh, l, k, &slots) {
            Ok(Some(i)) => {
                let c = &mut k.copies[i];
                let result = append(engine, rec, &c.segments);
                c.batch = batch_of(engine, &c.segments);
                c.used = tick;
                k.used = tick;
                let staging = c.segments.iter().map(|g| g.staging.clone()).collect();
                engine.graphs.kept.insert(key, kept.expect("matched above"));
                return (result, Staging::Shared(staging));
            }
            // Every copy is pending and holds other values: record another.
            Ok(None) => {}
            // A segment failed to record again: record the launch whole (its
            // result says which node failed, and skips its dependents).
            Err(_) => kept = None,
        }
    }
    let block = match ParamBlock::new(&sh.gpu, l.exec.nodes.len() as u32, PUSH_BYTES) {
        Ok(b) => b,
        Err(e) => {
            return (
                Err(format!("a graph's parameter memory: {e}")),
                Staging::Own(Vec::new()),
            )
        }
    };
    let mut own: Option<Recorder> = None;
    let mut seg = Segmenting {
        nodes: Nodes::new(engine, sh, &mut own).with_params(block.clone()),
        segments: Vec::new(),
        current: Vec::new(),
    };
    let result = seg.run(l);
    let segments = match seg.finish(l) {
        Ok(s) => s,
        Err(m) => return (Err(m), Staging::Own(Vec::new())),
    };
    let appended = append(engine, rec, &segments);
    let staging: Vec<_> = segments.iter().map(|g| g.staging.clone()).collect();
    if let Err(m) = appended {
        return (Err(m), Staging::Shared(staging));
    }
    if result.is_err() {
        return (result, Staging::Shared(staging));
    }
    let copy = Copy {
        params: l.params.clone(),
        slots,
        batch: batch_of(engine, &segments),
        segments,
        block,
        used: tick,
    };
    let g = &mut engine.graphs;
    match kept {
        Some(mut k) => {
            if k.copies.len() >= COPIES {
                // The least recently used goes; the launches pending with it
                // hold its command buffers, and they what those read.
                if let Some(i) = (0..k.copies.len()).min_by_key(|&i| k.copies[i].used) {
                    k.copies.swap_remove(i);
                }
            }
            k.copies.push(copy);
            k.used = tick;
            g.kept.insert(key, k);
        }
        None => {
            g.kept.retain(|_, k| k.plan.strong_count() > 0);
            if g.kept.len() >= KEEP_RECORDED {
                if let Some(oldest) = g.kept.iter().min_by_key(|(_, k)| k.used).map(|(a, _)| *a) {
                    g.kept.remove(&oldest);
                }
            }
            g.kept.insert(
                key,
                Kept {
                    plan: Arc::downgrade(&l.exec),
                    copies: vec![copy],
                    used: tick,
                },
            );
        }
    }
    (Ok(()), Staging::Shared(staging))
}

/// The batch a launch of `segments` appended now runs in (0: they record
/// nothing, so nothing reads their copy).
fn batch_of(engine: &Engine, segments: &[Segment]) -> u64 {
    if segments.iter().any(|g| g.cmd.is_some()) {
        engine.open_batch()
    } else {
        0
    }
}

/// The copy of `k` launch `l` (whose slots lie at `slots`) runs: one that
/// holds its values already, else the least recently used one that no
/// pending launch reads, brought up to date (`refresh`); `None` when every
/// copy is pending and holds other values.
fn pick(
    engine: &mut Engine,
    sh: &Shared,
    l: &GraphLaunch,
    k: &mut Kept,
    slots: &[SlotPlace],
) -> Result<Option<usize>, String> {
    let current = |c: &Copy| Arc::ptr_eq(&c.params, &l.params) && c.slots == slots;
    if let Some(i) = k.copies.iter().position(current) {
        return Ok(Some(i));
    }
    let mut order: Vec<usize> = (0..k.copies.len()).collect();
    order.sort_by_key(|&i| k.copies[i].used);
    for i in order {
        let b = k.copies[i].batch;
        if b == 0 || engine.compute_ran(sh, b) {
            refresh(engine, sh, l, &mut k.copies[i], slots.to_vec())?;
            return Ok(Some(i));
        }
    }
    Ok(None)
}

/// Appends the segments' command buffers to the flush, in order.
fn append(
    engine: &mut Engine,
    rec: &mut Option<Recorder>,
    segments: &[Segment],
) -> Result<(), String> {
    for cmd in segments.iter().filter_map(|g| g.cmd.as_ref()) {
        engine.append_segment(rec, cmd.clone())?;
    }
    Ok(())
}

/// Brings copy `c` (which no pending launch reads) up to date with launch
/// `l`, whose slots lie at `slots`: a node whose scalars alone changed gets
/// them written to its parameter slot, a kernel node bound from a set whose
/// slot moved gets the set rewritten; the segments holding any other change
/// (a new kernel or grid, scalars in the command buffer, a copy's or fill's
/// moved slot, a slot moved on a device without update-after-bind) are
/// recorded again.
fn refresh(
    engine: &mut Engine,
    sh: &Shared,
    l: &GraphLaunch,
    c: &mut Copy,
    slots: Vec<SlotPlace>,
) -> Result<(), String> {
    let same_params = Arc::ptr_eq(&c.params, &l.params);
    if same_params && c.slots == slots {
        return Ok(());
    }
    let moved = |i: &u32| c.slots.get(*i as usize) != slots.get(*i as usize);
    let mut dirty = vec![false; c.segments.len()];
    let mut writes: Vec<u32> = Vec::new();
    let mut rebinds: Vec<(usize, u32, SetId)> = Vec::new();
    let mut used = Vec::new();
    for (gi, g) in c.segments.iter().enumerate() {
        let any_moved = g.slots.iter().any(moved);
        for &v in &g.nodes {
            let i = v as usize;
            if !same_params && !l.params.same_node(&c.params, i) {
                let (a, b) = (&l.params.nodes[i], &c.params.nodes[i]);
                let same_kernel =
                    matches!((&a.kernel, &b.kernel), (Some(x), Some(y)) if Arc::ptr_eq(x, y));
                if same_kernel && a.blocks == b.blocks && a.args == b.args && !g.pushed.contains(&v)
                {
                    writes.push(v);
                } else {
                    dirty[gi] = true;
                }
            }
            if any_moved {
                used.clear();
                node_slots(l, v, &mut used);
                if used.iter().any(moved) {
                    match g.bound.iter().find(|(n, _)| *n == v) {
                        Some(&(_, id)) => rebinds.push((gi, v, id)),
                        None => dirty[gi] = true,
                    }
                }
            }
        }
    }
    let size = segment_nodes(l.exec.nodes.len());
    if dirty.iter().any(|d| *d) && c.segments.len() == 1 && c.segments[0].nodes.len() > size {
        // The first re-recording: split the recording, recording every segment.
        let order = std::mem::take(&mut c.segments[0].nodes);
        c.segments = order
            .chunks(size)
            .map(|n| {
                let mut slots = Vec::new();
                n.iter().for_each(|&v| node_slots(l, v, &mut slots));
                Segment {
                    nodes: n.to_vec(),
                    slots,
                    cmd: None,
                    staging: Arc::default(),
                    pushed: Vec::new(),
                    bound: Vec::new(),
                    sets: GraphSets::new(&sh.gpu),
                }
            })
            .collect();
        for g in &mut c.segments {
            record_segment(engine, sh, l, g, &c.block)?;
        }
        c.params = l.params.clone();
        c.slots = slots;
        return Ok(());
    }
    for (g, _) in c.segments.iter_mut().zip(&dirty).filter(|(_, d)| **d) {
        record_segment(engine, sh, l, g, &c.block)?;
    }
    let segment_of = |v: u32| c.segments.iter().position(|g| g.nodes.contains(&v));
    for v in writes {
        if segment_of(v).is_some_and(|gi| dirty[gi]) {
            continue; // recorded again, with its parameters
        }
        c.block
            .write(v, &param_bytes(l.params.scalars(v as usize)))
            .map_err(|e| format!("writing graph node {v}'s parameters: {e}"))?;
    }
    for (gi, v, id) in rebinds {
        if dirty[gi] {
            continue;
        }
        let p = &l.params.nodes[v as usize];
        let Some(kernel) = &p.kernel else { continue };
        let mut places = super::record::Places::new();
        for a in &l.exec.args[p.args.0 as usize..p.args.1 as usize] {
            places.push(place(sh, l, &a.operand, 0, a.len * a.elem.size)?);
        }
        engine.rebind_node(sh, kernel, &places, &c.segments[gi].sets, id)?;
    }
    c.params = l.params.clone();
    c.slots = slots;
    Ok(())
}

/// Records segment `g`'s nodes of launch `l` into a new command buffer.
fn record_segment(
    engine: &mut Engine,
    sh: &Shared,
    l: &GraphLaunch,
    g: &mut Segment,
    block: &ParamBlock,
) -> Result<(), String> {
    let mut own: Option<Recorder> = None;
    let mut nodes = Nodes::new(engine, sh, &mut own).with_params(block.clone());
    for &v in &g.nodes {
        nodes.record(l, v)?;
    }
    g.pushed = std::mem::take(&mut nodes.pushed);
    g.bound = std::mem::take(&mut nodes.bound);
    g.sets = nodes.sets.take().expect("set by with_params");
    let staging = nodes.into_staging();
    if own.is_some() {
        sh.graph_recordings.fetch_add(1, Ordering::Relaxed);
    }
    g.cmd = own
        .map(|r| r.finish())
        .transpose()
        .map_err(|e| format!("finishing a graph's command buffer failed: {e}"))?;
    g.staging = Arc::new(staging);
    Ok(())
}

/// The chunk and offset where operand `o` of launch `l` starts.
fn base(sh: &Shared, l: &GraphLaunch, o: &Operand) -> Result<(Arc<Chunk>, u64), String> {
    match o {
        Operand::Fixed(s) => sh.place(s),
        Operand::Slot(i) => {
            let bound = l.table.as_ref().and_then(|t| t[*i as usize].as_ref());
            match bound {
                Some(s) => sh.place(s),
                None => Err(format!(
                    "slot {i} is not bound; bind a buffer to it (Bindings::bind) and \
                     launch with launch_graph_with"
                )),
            }
        }
        Operand::Internal(i) => match &l.exec.arena {
            Some(a) => {
                let (c, o) = sh.place(a)?;
                Ok((c, o + l.exec.offsets[*i as usize] as u64))
            }
            None => Err(format!(
                "the graph's buffer {i} has no place: the plan has no arena"
            )),
        },
    }
}

/// What a dispatch binds for `bytes` of operand `o` of launch `l` from
/// `off`: chunk, offset, range.
fn place(
    sh: &Shared,
    l: &GraphLaunch,
    o: &Operand,
    off: usize,
    bytes: usize,
) -> Result<(Arc<Chunk>, u64, u64), String> {
    if bytes == 0 {
        return Ok(sh.empty_binding());
    }
    let (c, b) = base(sh, l, o)?;
    Ok((c, b + off as u64, bytes as u64))
}

/// Records a launch into one segment (the runner's hooks around `Nodes`,
/// noting the order it recorded the nodes in).
struct Segmenting<'a> {
    nodes: Nodes<'a>,
    segments: Vec<Segment>,
    current: Vec<u32>,
}

impl Segmenting<'_> {
    fn run(&mut self, l: &GraphLaunch) -> Result<(), String> {
        let run = RunState::take(&l.exec);
        let result = run.run_all(l, self);
        run.give_back(&l.exec);
        result
    }

    /// Closes the open segment, if it has nodes.
    fn close(&mut self, l: &GraphLaunch) -> Result<(), String> {
        if self.current.is_empty() {
            return Ok(());
        }
        let nodes = std::mem::take(&mut self.current);
        let mut slots = Vec::new();
        for &v in &nodes {
            node_slots(l, v, &mut slots);
        }
        let cmd = self
            .nodes
            .rec
            .take()
            .map(|r| r.finish())
            .transpose()
            .map_err(|e| format!("finishing a graph's command buffer failed: {e}"))?;
        if cmd.is_some() {
            self.nodes
                .sh
                .graph_recordings
                .fetch_add(1, Ordering::Relaxed);
        }
        let staging = Arc::new(std::mem::take(&mut self.nodes.staging));
        let sets = self.nodes.sets.replace(GraphSets::new(&self.nodes.sh.gpu));
        self.segments.push(Segment {
            nodes,
            slots,
            cmd,
            staging,
            pushed: std::mem::take(&mut self.nodes.pushed),
            bound: std::mem::take(&mut self.nodes.bound),
            sets: sets.expect("set by with_params"),
        });
        Ok(())
    }

    /// The segments recorded.
    fn finish(mut self, l: &GraphLaunch) -> Result<Vec<Segment>, String> {
        self.close(l)?;
        Ok(self.segments)
    }
}

impl NodeHooks for Segmenting<'_> {
    fn run(&mut self, l: &GraphLaunch, v: u32) -> Result<(), String> {
        let result = self.nodes.record(l, v);
        self.current.push(v);
        result
    }
}

/// Whether `l`'s plan has host nodes (its launch runs them on the engine
/// thread, with the device idle, and is recorded at every launch).
pub(super) fn has_host_nodes(l: &GraphLaunch) -> bool {
    l.exec.nodes.iter().any(|n| matches!(n, NodeBody::Host(_)))
}

/// One launch being recorded: the runner's hooks.
pub(super) struct Nodes<'a> {
    engine: &'a mut Engine,
    sh: &'a Shared,
    rec: &'a mut Option<Recorder>,
    staging: Vec<hetero_memory::PinnedAllocation>,
    /// Where the nodes' timestamps go, while profiling.
    times: Option<&'a mut Times>,
    /// For a kept recording: the nodes' parameter slots, and the sets of
    /// the segment being recorded; kernel nodes are recorded through their
    /// graph variant (`Engine::dispatch_node`).
    block: Option<ParamBlock>,
    sets: Option<GraphSets>,
    /// Kernel nodes recorded with push constants, and with sets.
    pushed: Vec<u32>,
    bound: Vec<(u32, SetId)>,
}

impl<'a> Nodes<'a> {
    pub(super) fn new(
        engine: &'a mut Engine,
        sh: &'a Shared,
        rec: &'a mut Option<Recorder>,
    ) -> Self {
        Nodes {
            engine,
            sh,
            rec,
            staging: Vec::new(),
            times: None,
            block: None,
            sets: None,
            pushed: Vec::new(),
            bound: Vec::new(),
        }
    }

    /// Records kernel nodes through their graph variants, their scalars in
    /// `block`'s slots (a kept recording).
    fn with_params(mut self, block: ParamBlock) -> Self {
        self.sets = Some(GraphSets::new(&self.sh.gpu));
        self.block = Some(block);
        self
    }

    /// Records (and runs the host nodes of) the launch `l`; its result: the
    /// first failed node's message.
    pub(super) fn run(&mut self, l: &GraphLaunch) -> Result<(), String> {
        let run = RunState::take(&l.exec);
        let result = run.run_all(l, self);
        run.give_back(&l.exec);
        result
    }

    /// The staging buffers the recorded nodes read: kept until the launch
    /// completes.
    pub(super) fn into_staging(self) -> Vec<hetero_memory::PinnedAllocation> {
        self.staging
    }

    /// The chunk and offset where operand `o`'s buffer starts.
    fn base(&self, l: &GraphLaunch, o: &Operand) -> Result<(Arc<Chunk>, u64), String> {
        base(self.sh, l, o)
    }

    fn place(
        &self,
        l: &GraphLaunch,
        o: &Operand,
        off: usize,
        bytes: usize,
    ) -> Result<(Arc<Chunk>, u64, u64), String> {
        place(self.sh, l, o, off, bytes)
    }

    /// Records node `v`'s device work (a barrier first).
    fn record(&mut self, l: &GraphLaunch, v: u32) -> Result<(), String> {
        let vk = |e: hetero_vulkan::VkError| e.to_string();
        let e = &*l.exec;
        let p = &l.params.nodes[v as usize];
        if let Some(kernel) = &p.kernel {
            let args = &e.args[p.args.0 as usize..p.args.1 as usize];
            let mut places = super::record::Places::new();
            for a in args {
                places.push(self.place(l, &a.operand, 0, a.len * a.elem.size)?);
            }
            let scalars = l.params.scalars_of(p);
            let rec = rec_or_new(self.sh, &mut self.engine.spares[0], self.rec, 0)?;
            rec.barrier();
            let (Some(block), Some(sets)) = (&self.block, &self.sets) else {
                return self
                    .engine
                    .dispatch(self.sh, rec, kernel, p.blocks, &places, scalars);
            };
            let how = self.engine.dispatch_node(
                self.sh, rec, kernel, p.blocks, &places, scalars, block, v, sets,
            )?;
            match how {
                NodeDispatch::Pushed => self.pushed.push(v),
                NodeDispatch::Params(Some(id)) => self.bound.push((v, id)),
                NodeDispatch::Params(None) => {}
            }
            return Ok(());
        }
        match &e.nodes[v as usize] {
            NodeBody::Copy {
                src,
                src_off,
                dst,
                dst_off,
                bytes,
                ..
            } => {
                if *bytes == 0 {
                    return Ok(());
                }
                let (sc, so, _) = self.place(l, src, *src_off, *bytes)?;
                let (dc, d, _) = self.place(l, dst, *dst_off, *bytes)?;
                let rec = rec_or_new(self.sh, &mut self.engine.spares[0], self.rec, 0)?;
                rec.barrier();
                rec.copy(&sc, so, &dc, d, *bytes as u64).map_err(vk)
            }
            NodeBody::Fill {
                dst,
                off,
                bytes,
                pattern,
                pattern_len,
            } => {
                if *bytes == 0 {
                    return Ok(());
                }
                let pattern = &pattern[..*pattern_len as usize];
                let (dc, d, _) = self.place(l, dst, *off, *bytes)?;
                // The word rule is about the device offset (`d`), which is
                // the operand's offset plus a multiple of 4.
                if let Some(word) = fill_word(pattern, d as usize, *bytes) {
                    let rec = rec_or_new(self.sh, &mut self.engine.spares[0], self.rec, 0)?;
                    rec.barrier();
                    return rec.fill(&dc, d, *bytes as u64, word).map_err(vk);
                }
                let staging = self.sh.staging(*bytes)?;
                // SAFETY: the staging allocation holds `bytes` bytes of
                // host-visible memory that only this node uses.
                unsafe {
                    crate::exec::effects::fill_bytes(staging.ptr().as_ptr(), 0, *bytes, pattern)
                };
                let (sc, so) = self.sh.place_pinned(&staging, *bytes)?;
                self.staging.push(staging);
                let rec = rec_or_new(self.sh, &mut self.engine.spares[0], self.rec, 0)?;
                rec.barrier();
                rec.copy(&sc, so, &dc, d, *bytes as u64).map_err(vk)
            }
            NodeBody::Copy2D(c) => {
                let (s, t) = (c.src_r, c.dst_r);
                if s.height == 0 || s.width == 0 {
                    return Ok(());
                }
                let (sc, so) = self.base(l, &c.src)?;
                let (dc, d) = self.base(l, &c.dst)?;
                let rec = rec_or_new(self.sh, &mut self.engine.spares[0], self.rec, 0)?;
                rec.barrier();
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
                Ok(())
            }
            NodeBody::Host(_) => {
                // After what the device nodes before it did.
                self.engine.submit_and_wait(self.sh, self.rec)?;
                run_node(l, v)
            }
            // A kernel node always has its kernel in the parameters; waits
            // were ops before the launch.
            NodeBody::Kernel { .. } | NodeBody::Wait { .. } | NodeBody::Empty => Ok(()),
        }
    }
}

impl NodeHooks for Nodes<'_> {
    fn run(&mut self, l: &GraphLaunch, v: u32) -> Result<(), String> {
        let Some(times) = self.times.as_deref_mut() else {
            return self.record(l, v);
        };
        // Timestamps around the node's commands (a host node submits and
        // waits before it runs: its span is on the host's side of that).
        let mut held = 0;
        let start = rec_or_new(self.sh, &mut self.engine.spares[0], self.rec, 0)
            .ok()
            .and_then(|r| self.engine.stamp(self.sh, r, &mut held));
        times.held += held;
        let result = self.record(l, v);
        let times = self.times.as_deref_mut().expect("set above");
        if let (Some(a), Ok(r)) = (
            start,
            rec_or_new(self.sh, &mut self.engine.spares[0], self.rec, 0),
        ) {
            let mut held = 0;
            if let Some(b) = self.engine.stamp(self.sh, r, &mut held) {
                times.nodes.push((v, a, b));
            }
            times.held += held;
        }
        result
    }
}
