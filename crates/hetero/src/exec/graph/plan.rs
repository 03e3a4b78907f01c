//! The plan an instantiate makes of a graph (schedule, memory plan, the
//! buffers a launch locks) and the per-node parameters that change in place
//! (the handles users hold, `GraphExec` and `Bindings`, are `api/graph`).
//!
//! Invariants:
//! - `Plan` never changes after instantiate; what an update may change
//!   (each kernel node's kernel, grid and scalars) is in `Params`, shared
//!   copy-on-write with the launches in flight: an update never touches what a
//!   queued or running launch reads;
//! - a `Bindings` table is shared the same way; it never binds one buffer to
//!   two places of a launch (two slots, or a slot and a buffer the graph names)
//!   unless neither is written, so a launch's access set has no writer twice.

use super::run::RunState;
use super::schedule::{schedule, MemoryOrder, Schedule};
use super::{Draft, NodeArg, NodeBody, Operand, SlotInfo};
use crate::exec::kernel::{KView, KernelInner};
use crate::exec::storage::{GraphHold, Reach, Storage};
use crate::exec::timeline::Timeline;
use crate::{Error, Result};
use hetero_memory::arena_plan::ArenaPlan;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes a storage's address (a `usize` key) with one multiply: the keys are
/// distinct pointers, not attacker-chosen input, so SipHash's cost buys nothing
/// on the binding path.
#[derive(Default)]
pub(crate) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, x: usize) {
        // Addresses are 256-aligned: move the varying bits up before mixing.
        self.0 = ((x as u64) >> 8 ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by storage address.
pub(crate) type AddressMap<V> = HashMap<usize, V, BuildHasherDefault<AddressHasher>>;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

// SAFETY: the raw pointers in `views` point into storages the plan itself
// holds (`fixed`, `arena`); reaching them is governed by the launch's access
// locks and the graph's order, like any op's buffers.
unsafe impl Send for Plan {}
// SAFETY: as above; nothing in the plan changes after instantiate.
unsafe impl Sync for Plan {}

/// Scalars a kernel node carries ([`crate::Block::scalars`]).
pub const MAX_SCALARS: usize = 8;

/// What instantiate made of a graph, fixed from then on: its schedule, the
/// buffers a launch locks, the arena and the nodes' views. (The handle users
/// hold is `GraphExec`; what an update changes is `Params`.)
pub(crate) struct Plan {
    pub(crate) device: u64,
    pub(crate) graph: u32,
    pub(crate) nodes: Arc<Vec<NodeBody>>,
    pub(crate) args: Arc<Vec<NodeArg>>,
    pub(crate) sched: Schedule,
    /// Buffers the graph names, each once, with whether any node writes it.
    pub(crate) fixed: Box<[(GraphHold, bool)]>,
    /// Its slots, for bindings.
    pub(crate) slots: Arc<SlotSpec>,
    pub(crate) arena: Option<Arc<Storage>>,
    pub(crate) offsets: Box<[usize]>,
    /// How the device's engines reach its memory.
    pub(crate) reach: Reach,
    /// Each kernel argument as its blocks see it, where that is known at
    /// instantiate (fixed buffers and the arena; a slot's view is made at run time).
    pub(crate) views: Box<[KView]>,
    /// Events recorded outside the graph that its nodes wait on: a launch waits
    /// for them before it starts.
    pub(crate) waits: Box<[(Arc<Timeline>, u64)]>,
    /// The managed pages the nodes declared (`Draft::managed`).
    pub(crate) managed: Box<[Arc<dyn std::any::Any + Send + Sync>]>,
    /// Run states, reused from launch to launch (boxed: a launch holds its
    /// own while the list changes).
    #[allow(clippy::vec_box)]
    pub(crate) runs: Mutex<Vec<Box<RunState>>>,
    pub(crate) report: PlanReport,
    /// The plan was given to the profiler.
    pub(crate) plan_traced: AtomicBool,
}

impl Plan {
    /// Gives the plan to the profiler, for its report.
    pub(crate) fn trace_plan(&self) {
        let r = &self.report;
        hetero_trace::set_graph_plan(
            self.graph,
            hetero_trace::GraphPlan {
                nodes: r.nodes as u64,
                edges: r.edges as u64,
                chains: r.chains as u64,
                lanes: r.lanes as u64,
                critical_path: r.critical_path as u64,
                width: r.width as u64,
                internal_bytes: r.internal_bytes,
                arena_bytes: r.arena_bytes,
            },
        );
    }
}

/// A graph's slots as its bindings check them (`Bindings`): shared by the
/// graph's plan on its device and a plan that places it across a context.
pub(crate) struct SlotSpec {
    pub(crate) device: u64,
    pub(crate) graph: u32,
    pub(crate) info: Box<[SlotInfo]>,
    /// Per slot: whether a node writes it, whether any node uses it.
    pub(crate) write: Box<[bool]>,
    pub(crate) used: Box<[bool]>,
    /// The buffers the graph names, by address, with whether a node writes
    /// each (a binding must not alias a written one).
    pub(crate) fixed: AddressMap<bool>,
}

impl SlotSpec {
    /// The slots of draft `d`.
    pub(crate) fn of(d: &Draft) -> SlotSpec {
        let mut write = vec![false; d.slots.len()];
        let mut used = vec![false; d.slots.len()];
        let mut fixed: AddressMap<bool> = AddressMap::default();
        for v in 0..d.nodes.len() {
            d.accesses(v, |o, w| match o {
                Operand::Fixed(s) => *fixed.entry(Arc::as_ptr(s) as usize).or_default() |= w,
                Operand::Slot(i) => {
                    used[*i as usize] = true;
                    write[*i as usize] |= w;
                }
                Operand::Internal(_) => {}
            });
        }
        SlotSpec {
            device: d.device,
            graph: d.id,
            info: d.slots.clone().into_boxed_slice(),
            write: write.into_boxed_slice(),
            used: used.into_boxed_slice(),
            fixed,
        }
    }

    /// A spec without slots (a task graph's).
    pub(crate) fn none() -> SlotSpec {
        SlotSpec {
            device: u64::MAX,
            graph: u32::MAX,
            info: Box::new([]),
            write: Box::new([]),
            used: Box::new([]),
            fixed: AddressMap::default(),
        }
    }
}

/// What kernel nodes run with; changed in place by updates. Scalars are kept
/// only for nodes that were given some: most nodes never are, and a plan's
/// per-node footprint stays small.
#[derive(Clone, Default)]
pub(crate) struct Params {
    /// Per node: what running it needs, in one place.
    pub(crate) nodes: Vec<NodeParams>,
    scalars: Vec<(u8, [u64; MAX_SCALARS])>,
}

/// What running a node needs, kernel nodes in full (the others are `None`
/// kernels and run from the plan's node list).
#[derive(Clone)]
pub(crate) struct NodeParams {
    pub(crate) kernel: Option<Arc<KernelInner>>,
    pub(crate) blocks: u32,
    /// Its entry in `scalars` plus one (0: none).
    scalar_slot: u32,
    /// Its arguments: `Plan::views` (and `args`) in this range.
    pub(crate) args: (u32, u32),
    /// Whether a slot is among them (their views are made at run time).
    pub(crate) slot_args: bool,
}

impl Params {
    /// Sets kernel node `v`'s scalars (at most `MAX_SCALARS`, checked by the caller).
    #[inline]
    pub(crate) fn set_scalars(&mut self, v: usize, scalars: &[u64]) {
        let slot = match self.nodes[v].scalar_slot {
            0 => {
                self.scalars.push((0, [0; MAX_SCALARS]));
                self.nodes[v].scalar_slot = self.scalars.len() as u32;
                self.scalars.len() - 1
            }
            i => i as usize - 1,
        };
        let (n, words) = &mut self.scalars[slot];
        words[..scalars.len()].copy_from_slice(scalars);
        *n = scalars.len() as u8;
    }

    /// Node `v`'s kernel and number of blocks.
    #[inline]
    pub(crate) fn kernel(&self, v: usize) -> (Option<&Arc<KernelInner>>, u32) {
        let p = &self.nodes[v];
        (p.kernel.as_ref(), p.blocks)
    }

    /// The scalars of a node with these parameters.
    #[inline]
    pub(crate) fn scalars_of(&self, p: &NodeParams) -> &[u64] {
        match p.scalar_slot {
            0 => &[],
            i => {
                let (n, words) = &self.scalars[i as usize - 1];
                &words[..*n as usize]
            }
        }
    }

    /// Node `v`'s scalars.
    #[inline]
    pub(crate) fn scalars(&self, v: usize) -> &[u64] {
        self.scalars_of(&self.nodes[v])
    }

    /// Whether node `v` runs the same in `self` and `other` (parameters of
    /// one plan): the same kernel, blocks, arguments and scalars.
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
    pub(crate) fn same_node(&self, other: &Params, v: usize) -> bool {
        let (a, b) = (&self.nodes[v], &other.nodes[v]);
        let kernel = match (&a.kernel, &b.kernel) {
            (Some(x), Some(y)) => Arc::ptr_eq(x, y),
            (None, None) => true,
            _ => false,
        };
        kernel
            && a.blocks == b.blocks
            && a.args == b.args
            && self.scalars_of(a) == other.scalars_of(b)
    }
}

/// What instantiate made of a graph.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanReport {
    /// Nodes.
    pub nodes: usize,
    /// Edges a launch keeps: each lane's chain and the forks and joins between
    /// lanes (explicit and buffer-order edges that those imply are dropped).
    pub edges: usize,
    /// Edges added because two nodes touch the same buffer, one writing.
    pub ordering_edges: usize,
    /// Linear chains the nodes were split into (synchronisation only between them).
    pub chains: usize,
    /// Lanes the chains were assigned to (at most the compute units).
    pub lanes: usize,
    /// The lane of each chain, in order of the chains' first nodes.
    pub chain_lanes: Vec<u32>,
    /// Nodes on the longest dependency path.
    pub critical_path: usize,
    /// Most nodes on one dependency level.
    pub width: usize,
    /// Buffers allocated inside the graph.
    pub internal_buffers: usize,
    /// Their bytes, each on its own.
    pub internal_bytes: u64,
    /// The arena the memory plan placed them in.
    pub arena_bytes: u64,
    /// Which of the planner's strategies gave the arena.
    pub arena_strategy: &'static str,
    /// How the lanes were held to the memory budget
    /// ([`DeviceConfig::graph_memory_slack`](crate::DeviceConfig::graph_memory_slack) over the
    /// one-lane plan): `"free"` (within it as scheduled), `"budget"` (the lane
    /// schedule was made again under the budget: a first use of one of the
    /// graph's buffers waits for what the schedule finished before it, or for
    /// everything before it where its bytes would pass the budget),
    /// `"one lane"` (neither was within it) or `"large"` (past 8 192 internal
    /// buffers or 16 384 nodes: one lane, the arena planned by a sweep of the
    /// buffers' intervals, without the n² conflict matrices).
    pub memory_order: &'static str,
    /// The lane schedule's length in unit steps (a node a step on each lane),
    /// and what it would be with the lanes free: their ratio is what holding
    /// the lanes to the memory budget costs in concurrency.
    pub lane_steps: usize,
    pub free_lane_steps: usize,
}

/// Past this many internal buffers (or twice as many nodes) a graph with
/// internal buffers runs on one lane, its arena planned by a sweep of their
/// intervals (`plan_intervals`, `memory_order` "large"): the conflict
/// matrices of a plan with lanes take n² bits (8 192 buffers: 8 MiB;
/// 100 000: 1.2 GiB, and seconds to build: 40 000 took 1.8 s).
const LARGE_GRAPH: usize = 8192;

/// The schedule and memory plan to run with. Lanes may raise the arena over
/// the one-lane plan (nodes on two lanes can overlap in any way the edges
/// allow, and their buffers then cannot share bytes) by at most
/// the device's `graph_memory_slack`: past it, the schedule is made again under a budget
/// (`MemoryOrder::Budget`), and past it still, with one lane (the one-lane
/// plan itself).
fn plan_memory(
    d: &Draft,
    units: usize,
    slack: f64,
    sched: Schedule,
    sizes: &[u64],
    uses: &[Vec<u32>],
) -> Result<(Schedule, ArenaPlan, &'static str)> {
    use hetero_memory::arena_plan::{plan, Conflicts};
    let align = Storage::ALIGN as u64;
    let n = d.nodes.len();
    if sizes.is_empty() {
        let none = ArenaPlan {
            offsets: Vec::new(),
            size: 0,
            strategy: "none",
        };
        return Ok((sched, none, "free"));
    }
    // Each buffer live from its first use to its last in a schedule's order.
    let intervals = |sched: &Schedule| -> Vec<(u32, u32)> {
        let mut pos = vec![0u32; n];
        for (i, &v) in sched.order.iter().enumerate() {
            pos[v as usize] = i as u32;
        }
        uses.iter()
            .map(|us| {
                let p = us.iter().map(|&u| pos[u as usize]);
                (p.clone().min().unwrap_or(0), p.max().unwrap_or(0))
            })
            .collect()
    };
    if sizes.len() > LARGE_GRAPH || n > 2 * LARGE_GRAPH {
        let one = schedule(d, 1, MemoryOrder::Free)?;
        let arena = hetero_memory::arena_plan::plan_intervals(sizes, align, &intervals(&one));
        return Ok((one, arena, "large"));
    }
    let free = plan(sizes, align, &Conflicts::from_dag(n, &sched.edges, uses));
    if sched.lanes <= 1 {
        return Ok((sched, free, "free"));
    }
    // The one-lane plan.
    let one_lane = plan(sizes, align, &Conflicts::from_intervals(&intervals(&sched)));
    let budget = (one_lane.size as f64 * (1.0 + slack)).min(u64::MAX as f64) as u64;
    if slack.is_infinite() || free.size <= budget {
        return Ok((sched, free, "free"));
    }
    let held = schedule(d, units, MemoryOrder::Budget(one_lane.size))?;
    let barriers = plan(sizes, align, &Conflicts::from_dag(n, &held.edges, uses));
    if barriers.size <= budget {
        return Ok((held, barriers, "budget"));
    }
    Ok((schedule(d, 1, MemoryOrder::Free)?, one_lane, "one lane"))
}

/// Turns a draft into an executable plan (see the module doc of `graph`).
/// Makes the plan of draft `d` for a device of `units` compute units whose
/// lanes may raise the arena by `slack` (see `plan_memory`) and whose engines
/// reach its memory through `reach`; `arena` allocates the arena's device
/// memory.
pub(crate) fn instantiate(
    d: &mut Draft,
    units: usize,
    slack: f64,
    reach: Reach,
    arena: impl FnOnce(usize) -> Result<Arc<Storage>>,
) -> Result<(Plan, Params)> {
    let sched = schedule(d, units, MemoryOrder::Free)?;
    let n = d.nodes.len();

    // Buffers: fixed ones once each; slots and internal ones by use.
    let mut fixed: Vec<(GraphHold, bool)> = Vec::new();
    let mut fixed_index: AddressMap<usize> = AddressMap::default();
    let mut uses: Vec<Vec<u32>> = vec![Vec::new(); d.internal.len()];
    let mut waits = Vec::new();
    for v in 0..n {
        d.accesses(v, |o, write| match o {
            Operand::Fixed(s) => {
                let key = Arc::as_ptr(s) as usize;
                match fixed_index.get(&key) {
                    Some(&i) => fixed[i].1 |= write,
                    None => {
                        fixed_index.insert(key, fixed.len());
                        fixed.push((s.clone(), write));
                    }
                }
            }
            Operand::Slot(_) => {}
            Operand::Internal(i) => uses[*i as usize].push(v as u32),
        });
        if let NodeBody::Wait {
            timeline, value, ..
        } = &d.nodes[v]
        {
            waits.push((timeline.clone(), *value));
        }
    }
    for (s, _) in &fixed {
        if s.device != d.device {
            return Err(Error::Graph {
                op: "instantiate",
                detail: format!(
                    "a node uses a buffer of device {} in a graph of device {}; copy it to this \
                     device first",
                    s.device, d.device
                ),
            });
        }
    }

    // The memory plan: buffers used by nodes that may run at the same time
    // never share bytes.
    let placed: Vec<usize> = (0..d.internal.len())
        .filter(|&i| !uses[i].is_empty())
        .collect();
    let sizes: Vec<u64> = placed.iter().map(|&i| d.internal[i] as u64).collect();
    let place_uses: Vec<Vec<u32>> = placed.iter().map(|&i| uses[i].clone()).collect();
    let free_lane_steps = sched.steps as usize;
    let (sched, plan, memory_order) = plan_memory(d, units, slack, sched, &sizes, &place_uses)?;
    let mut offsets = vec![0usize; d.internal.len()];
    for (k, &i) in placed.iter().enumerate() {
        offsets[i] = plan.offsets[k] as usize;
    }
    let arena_bytes = usize::try_from(plan.size).map_err(|_| {
        Error::InvalidArgument(
            "the graph's buffers need an arena larger than the address space".into(),
        )
    })?;
    let arena = if arena_bytes > 0 {
        Some(arena(arena_bytes)?)
    } else {
        None
    };

    let params = Params {
        nodes: d
            .nodes
            .iter()
            .map(|b| match b {
                NodeBody::Kernel {
                    kernel,
                    blocks,
                    args: (a, k),
                    ..
                } => NodeParams {
                    kernel: Some(d.kernels[*kernel as usize].clone()),
                    blocks: *blocks,
                    scalar_slot: 0,
                    args: (*a, *a + *k),
                    slot_args: d.args[*a as usize..(*a + *k) as usize]
                        .iter()
                        .any(|arg| matches!(arg.operand, Operand::Slot(_))),
                },
                _ => NodeParams {
                    kernel: None,
                    blocks: 0,
                    scalar_slot: 0,
                    args: (0, 0),
                    slot_args: false,
                },
            })
            .collect(),
        scalars: Vec::new(),
    };

    let report = PlanReport {
        nodes: n,
        edges: sched.edges.len(),
        ordering_edges: sched.hazard_edges,
        chains: sched.chain_heads.len(),
        lanes: sched.lanes as usize,
        chain_lanes: sched.chain_lane.clone(),
        critical_path: sched.critical_path as usize,
        width: sched.width as usize,
        internal_buffers: d.internal.len(),
        internal_bytes: d.internal.iter().map(|&b| b as u64).sum(),
        arena_bytes: plan.size,
        arena_strategy: plan.strategy,
        memory_order,
        lane_steps: sched.steps as usize,
        free_lane_steps,
    };
    let views: Box<[KView]> = d
        .args
        .iter()
        .map(|arg| KView {
            ptr: match &arg.operand {
                Operand::Fixed(s) => s.engine_ptr(reach),
                Operand::Internal(i) => match &arena {
                    // SAFETY: the memory plan placed buffer `i` inside the arena.
                    Some(a) => unsafe { a.engine_ptr(reach).add(offsets[*i as usize]) },
                    None => std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
                },
                Operand::Slot(_) => std::ptr::null_mut(),
            },
            len: arg.len,
            unit: arg.unit,
            elem: arg.elem,
            write: arg.write,
        })
        .collect();

    let inner = Plan {
        device: d.device,
        graph: d.id,
        nodes: d.nodes.freeze(),
        args: d.args.freeze(),
        sched,
        fixed: fixed.into_boxed_slice(),
        slots: Arc::new(SlotSpec::of(d)),
        arena,
        offsets: offsets.into_boxed_slice(),
        reach,
        views,
        waits: waits.into_boxed_slice(),
        managed: d.managed.clone().into_boxed_slice(),
        runs: Mutex::new(Vec::new()),
        report,
        plan_traced: AtomicBool::new(hetero_trace::enabled()),
    };
    if inner.plan_traced.load(std::sync::atomic::Ordering::Relaxed) {
        inner.trace_plan();
    }
    Ok((inner, params))
}
