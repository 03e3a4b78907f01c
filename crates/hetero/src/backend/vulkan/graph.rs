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
//! A launch without host nodes is recorded once (`Recorded`) into one
//! command buffer, which the launches after it resubmit. An update
//! (`GraphExec::set_scalars`, `set_kernel`: the parameters are copied on
//! write, so `Arc` identity says whether any changed, and
//! `Params::same_node` which) or a rebinding that moves a slot (chunk and
//! offset) splits it, the first time, into segments of `segment_nodes`
//! consecutive nodes, each its own command buffer (all resubmitted in the
//! one submission of their flush), and from then on re-records only the
//! segments holding a node it changed: a node's push constants and
//! descriptors live in its command buffer, so its segment is recorded again,
//! never the whole graph. A launch whose recording failed is not kept.
//!
//! Invariants: a node is recorded only after every node it depends on was
//! (the runner's order) and behind a full barrier, so it runs after them on
//! the device; staging buffers of fills live until the launch completes
//! (`Nodes::into_staging`).

use super::engine::{Engine, Times};
use super::record::{fill_word, rec_or_new};
use super::Shared;
use crate::exec::graph::launch::{run_node, GraphLaunch, NodeHooks};
use crate::exec::graph::plan::{Params, Plan};
use crate::exec::graph::run::RunState;
use crate::exec::graph::{NodeBody, Operand};
use hetero_memory::PinnedAllocation;
use hetero_vulkan::{Chunk, CommandBuffer, Recorder};
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// Recorded graphs kept at most (the oldest plan's goes first).
const KEEP_RECORDED: usize = 64;

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
}

/// A graph launch recorded once, with what it was recorded for.
struct Kept {
    plan: Weak<Plan>,
    /// The parameters it was recorded with (held, so their address stays theirs).
    params: Arc<Params>,
    /// Where each slot's buffer lay: chunk address, offset, bytes.
    slots: Vec<SlotPlace>,
    segments: Vec<Segment>,
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
        .map(|(i, s)| match s.as_ref().filter(|_| l.exec.slot_used[i]) {
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
    if let Some(mut k) = engine.graphs.kept.remove(&key) {
        if k.plan.strong_count() > 0 && refresh(engine, sh, l, &mut k, slots.clone()).is_ok() {
            k.used = tick;
            let result = append(engine, rec, &k.segments);
            let staging = k.segments.iter().map(|g| g.staging.clone()).collect();
            engine.graphs.kept.insert(key, k);
            return (result, Staging::Shared(staging));
        }
        // A segment failed to record again: record the launch whole (its
        // result says which node failed, and skips its dependents).
    }
    let mut own: Option<Recorder> = None;
    let mut seg = Segmenting {
        nodes: Nodes::new(engine, sh, &mut own),
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
    let g = &mut engine.graphs;
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
            params: l.params.clone(),
            slots,
            segments,
            used: tick,
        },
    );
    (Ok(()), Staging::Shared(staging))
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

/// Brings kept recording `k` up to date with launch `l` (whose slots lie at
/// `slots`): re-records the segments holding a node whose parameters
/// changed or a slot that moved. A recording still pending on the device
/// stays valid: a re-recorded segment is a new command buffer, and the old
/// one lives while a flight holds it.
fn refresh(
    engine: &mut Engine,
    sh: &Shared,
    l: &GraphLaunch,
    k: &mut Kept,
    slots: Vec<SlotPlace>,
) -> Result<(), String> {
    let same_params = Arc::ptr_eq(&k.params, &l.params);
    if same_params && k.slots == slots {
        return Ok(());
    }
    let moved = |i: &u32| k.slots.get(*i as usize) != slots.get(*i as usize);
    let size = segment_nodes(l.exec.nodes.len());
    if k.segments.len() == 1 && k.segments[0].nodes.len() > size {
        // The first update: split the recording, recording every segment.
        let order = std::mem::take(&mut k.segments[0].nodes);
        k.segments = order
            .chunks(size)
            .map(|c| {
                let mut slots = Vec::new();
                c.iter().for_each(|&v| node_slots(l, v, &mut slots));
                Segment {
                    nodes: c.to_vec(),
                    slots,
                    cmd: None,
                    staging: Arc::default(),
                }
            })
            .collect();
        for g in &mut k.segments {
            record_segment(engine, sh, l, g)?;
        }
        k.params = l.params.clone();
        k.slots = slots;
        return Ok(());
    }
    for g in &mut k.segments {
        let changed = (!same_params
            && g.nodes
                .iter()
                .any(|&v| !l.params.same_node(&k.params, v as usize)))
            || g.slots.iter().any(moved);
        if changed {
            record_segment(engine, sh, l, g)?;
        }
    }
    k.params = l.params.clone();
    k.slots = slots;
    Ok(())
}

/// Records segment `g`'s nodes of launch `l` into a new command buffer.
fn record_segment(
    engine: &mut Engine,
    sh: &Shared,
    l: &GraphLaunch,
    g: &mut Segment,
) -> Result<(), String> {
    let mut own: Option<Recorder> = None;
    let mut nodes = Nodes::new(engine, sh, &mut own);
    for &v in &g.nodes {
        nodes.record(l, v)?;
    }
    let staging = nodes.into_staging();
    g.cmd = own
        .map(|r| r.finish())
        .transpose()
        .map_err(|e| format!("finishing a graph's command buffer failed: {e}"))?;
    g.staging = Arc::new(staging);
    Ok(())
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
        let staging = Arc::new(std::mem::take(&mut self.nodes.staging));
        self.segments.push(Segment {
            nodes,
            slots,
            cmd,
            staging,
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
        }
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
        match o {
            Operand::Fixed(s) => self.sh.place(s),
            Operand::Slot(i) => {
                let bound = l.table.as_ref().and_then(|t| t[*i as usize].as_ref());
                match bound {
                    Some(s) => self.sh.place(s),
                    None => Err(format!(
                        "slot {i} is not bound; bind a buffer to it (Bindings::bind) and \
                         launch with launch_graph_with"
                    )),
                }
            }
            Operand::Internal(i) => match &l.exec.arena {
                Some(a) => {
                    let (c, o) = self.sh.place(a)?;
                    Ok((c, o + l.exec.offsets[*i as usize] as u64))
                }
                None => Err(format!(
                    "the graph's buffer {i} has no place: the plan has no arena"
                )),
            },
        }
    }

    /// What a dispatch binds for `bytes` of operand `o` from `off`: chunk,
    /// offset, range.
    fn place(
        &self,
        l: &GraphLaunch,
        o: &Operand,
        off: usize,
        bytes: usize,
    ) -> Result<(Arc<Chunk>, u64, u64), String> {
        if bytes == 0 {
            return Ok(self.sh.empty_binding());
        }
        let (c, b) = self.base(l, o)?;
        Ok((c, b + off as u64, bytes as u64))
    }

    /// Records node `v`'s device work (a barrier first).
    fn record(&mut self, l: &GraphLaunch, v: u32) -> Result<(), String> {
        let vk = |e: hetero_vulkan::VkError| e.to_string();
        let e = &*l.exec;
        let p = &l.params.nodes[v as usize];
        if let Some(kernel) = &p.kernel {
            let args = &e.args[p.args.0 as usize..p.args.1 as usize];
            let mut places = Vec::with_capacity(args.len());
            for a in args {
                places.push(self.place(l, &a.operand, 0, a.len * a.elem.size)?);
            }
            let scalars = l.params.scalars_of(p);
            let rec = rec_or_new(self.sh, self.rec, 0)?;
            rec.barrier();
            return self
                .engine
                .dispatch(self.sh, rec, kernel, p.blocks, &places, scalars);
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
                let rec = rec_or_new(self.sh, self.rec, 0)?;
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
                    let rec = rec_or_new(self.sh, self.rec, 0)?;
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
                let rec = rec_or_new(self.sh, self.rec, 0)?;
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
                let rec = rec_or_new(self.sh, self.rec, 0)?;
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
        let start = rec_or_new(self.sh, self.rec, 0)
            .ok()
            .and_then(|r| self.engine.stamp(self.sh, r, &mut held));
        times.held += held;
        let result = self.record(l, v);
        let times = self.times.as_deref_mut().expect("set above");
        if let (Some(a), Ok(r)) = (start, rec_or_new(self.sh, self.rec, 0)) {
            let mut held = 0;
            if let Some(b) = self.engine.stamp(self.sh, r, &mut held) {
                times.nodes.push((v, a, b));
            }
            times.held += held;
        }
        result
    }
}
