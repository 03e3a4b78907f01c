//! The report's Graphs section: per graph, its plan, its launches and what its
//! nodes did inside them.
//!
//! A launch is one `OpKind::Graph` record; its nodes are records with
//! `OpRecord::node` set and the launch's stream and `seq`, which is how they
//! are matched to it. [`Roles`] says which records the report's other totals
//! count, so a launch and its nodes are never counted twice.
//!
//! Definitions: a launch's *span* is its [start, end); a lane's *busy* time
//! in a launch is the union of its nodes' intervals clipped to the launch's
//! span, and its busy fraction that time over the span, summed over the
//! graph's launches; *parallelism* is the nodes' summed durations over the
//! launch spans (the mean number of nodes running at once).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use hetero_trace::{OpKind, OpRecord, Trace};
use serde::{Deserialize, Serialize};

use crate::stats::{busy, fmt_bytes, fmt_ns, merge, percentiles, span, Percentiles};

/// Which role each record plays in the report's totals.
///
/// - *Submitted* totals (the op count, streams, latency per kind, longest
///   ops) count what was put on a stream: a launch once, as an op of kind
///   Graph, and none of its nodes.
/// - *Work* totals (engines: ops, busy time, bytes, bandwidth, idle gaps)
///   count what an engine ran: the nodes, and not the launch that contains
///   them (its span covers the nodes' and its bytes are theirs). A launch none
///   of whose nodes was recorded counts as work itself.
pub(crate) struct Roles {
    /// (stream, seq) of every node record.
    node_at: HashSet<(u64, u64)>,
}

impl Roles {
    pub(crate) fn new(trace: &Trace) -> Roles {
        Roles {
            node_at: trace
                .ops
                .iter()
                .filter(|o| o.node.is_some())
                .map(|o| (o.stream, o.seq))
                .collect(),
        }
    }

    /// Counted by the submitted totals: every record but a node's.
    pub(crate) fn submitted(&self, op: &OpRecord) -> bool {
        op.node.is_none()
    }

    /// Counted by the work totals: every record but a launch whose nodes were recorded.
    pub(crate) fn work(&self, op: &OpRecord) -> bool {
        !(op.kind == OpKind::Graph
            && op.node.is_none()
            && self.node_at.contains(&(op.stream, op.seq)))
    }
}

/// What instantiate planned for a graph (from `Trace::graphs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphPlanSummary {
    /// Nodes.
    pub nodes: u64,
    /// Edges a launch keeps (each lane's chain, the forks and joins between lanes).
    pub edges: u64,
    /// Linear chains.
    pub chains: u64,
    /// Lanes the chains were assigned to.
    pub lanes: u64,
    /// Nodes on the longest dependency path.
    pub critical_path: u64,
    /// Most nodes on one dependency level.
    pub width: u64,
    /// Bytes of the buffers allocated inside the graph, each on its own.
    pub internal_bytes: u64,
    /// The arena the memory plan placed them in.
    pub arena_bytes: u64,
}

/// One graph's launches and nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphUsage {
    /// The graph's id (`NodeRef::graph`).
    pub graph: u32,
    /// Its plan, if the trace has it.
    pub plan: Option<GraphPlanSummary>,
    /// Launches: Graph records whose nodes name this graph.
    pub launches: u64,
    /// Launches that completed with an error.
    pub failed_launches: u64,
    /// Node records of those launches.
    pub nodes: u64,
    /// Node records naming this graph with no launch of their stream and
    /// `seq` (a recorder problem; not in any other figure of this graph).
    pub unmatched_nodes: u64,
    /// Node records outside their launch's span (clipped to it for busy time).
    pub nodes_outside_launch: u64,
    /// Per-launch time (start → end), over its launches.
    pub launch_time: Percentiles,
    /// Summed launch spans.
    pub launch_ns: u64,
    /// Summed node durations.
    pub node_ns: u64,
    /// Share of the launch spans during which any node ran.
    pub busy_fraction: f64,
    /// `node_ns / launch_ns`: nodes running at once, on average.
    pub parallelism: f64,
    /// Per plan lane, in lane order.
    pub lanes: Vec<LaneUsage>,
    /// Node time per kind of node, in `OpKind::ALL` order.
    pub kinds: Vec<NodeKindUsage>,
}

/// What one plan lane's nodes did in a graph's launches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LaneUsage {
    /// The lane (`NodeRef::lane`).
    pub lane: u32,
    /// Node records in it.
    pub nodes: u64,
    /// Union of its nodes' intervals within each launch, summed over launches.
    pub busy_ns: u64,
    /// `busy_ns` over the graph's `launch_ns`.
    pub busy_fraction: f64,
}

/// The nodes of one kind in a graph's launches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeKindUsage {
    /// The kind, e.g. "Kernel".
    pub kind: String,
    /// Node records of this kind.
    pub count: u64,
    /// Their summed durations.
    pub total_ns: u64,
    /// Bytes they moved or wrote.
    pub bytes: u64,
}

/// A graph's records while they are gathered.
#[derive(Default)]
struct Gathered<'t> {
    /// Launch, and its nodes.
    launches: Vec<(&'t OpRecord, Vec<&'t OpRecord>)>,
    unmatched: u64,
}

/// Builds the Graphs section: one entry per graph with a launch or a node in
/// the trace, by graph id. Also returns how many launches had no node record
/// (they belong to no graph the trace can name).
pub(crate) fn build(trace: &Trace) -> (Vec<GraphUsage>, u64) {
    let mut launch_at: HashMap<(u64, u64), usize> = HashMap::new();
    for (i, op) in trace.ops.iter().enumerate() {
        if op.kind == OpKind::Graph && op.node.is_none() {
            launch_at.entry((op.stream, op.seq)).or_insert(i);
        }
    }
    // Nodes of each launch, in trace order (by start).
    let mut nodes_of: BTreeMap<usize, Vec<&OpRecord>> = BTreeMap::new();
    let mut unmatched: BTreeMap<u32, u64> = BTreeMap::new();
    for op in &trace.ops {
        let Some(n) = op.node else { continue };
        match launch_at.get(&(op.stream, op.seq)) {
            Some(&l) => nodes_of.entry(l).or_default().push(op),
            None => *unmatched.entry(n.graph).or_default() += 1,
        }
    }
    let without_nodes = launch_at
        .values()
        .filter(|l| !nodes_of.contains_key(l))
        .count() as u64;

    // A launch belongs to the graph its first node names; a node naming
    // another graph under it is counted as unmatched there.
    let mut graphs: BTreeMap<u32, Gathered> = BTreeMap::new();
    for (l, nodes) in nodes_of {
        let graph = nodes[0].node.expect("a node record").graph;
        let (mine, other): (Vec<&OpRecord>, Vec<&OpRecord>) = nodes
            .into_iter()
            .partition(|o| o.node.is_some_and(|n| n.graph == graph));
        for o in other {
            let g = o.node.expect("a node record").graph;
            *unmatched.entry(g).or_default() += 1;
        }
        graphs
            .entry(graph)
            .or_default()
            .launches
            .push((&trace.ops[l], mine));
    }
    for (g, n) in unmatched {
        graphs.entry(g).or_default().unmatched += n;
    }

    let usage = graphs
        .into_iter()
        .map(|(graph, g)| usage(trace, graph, g))
        .collect();
    (usage, without_nodes)
}

fn usage(trace: &Trace, graph: u32, g: Gathered) -> GraphUsage {
    let plan = trace.graphs.get(&graph).map(|p| GraphPlanSummary {
        nodes: p.nodes,
        edges: p.edges,
        chains: p.chains,
        lanes: p.lanes,
        critical_path: p.critical_path,
        width: p.width,
        internal_bytes: p.internal_bytes,
        arena_bytes: p.arena_bytes,
    });
    let times: Vec<u64> = g.launches.iter().map(|(l, _)| l.duration_ns()).collect();
    let launch_ns: u64 = times.iter().sum();
    let ratio = |num: u64| {
        if launch_ns == 0 {
            0.0
        } else {
            num as f64 / launch_ns as f64
        }
    };

    let mut any_busy = 0;
    let mut node_ns = 0;
    let mut outside = 0;
    let mut lanes: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let mut kinds: BTreeMap<OpKind, (u64, u64, u64)> = BTreeMap::new();
    for (launch, nodes) in &g.launches {
        let (ls, le) = span(launch);
        let clip = |o: &OpRecord| {
            let (s, e) = span(o);
            (s.clamp(ls, le), e.clamp(ls, le))
        };
        any_busy += busy(&merge(nodes.iter().map(|o| clip(o)).collect()));
        let mut by_lane: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
        for o in nodes {
            let (s, e) = span(o);
            if s < ls || e > le {
                outside += 1;
            }
            node_ns += o.duration_ns();
            let lane = o.node.expect("a node record").lane;
            by_lane.entry(lane).or_default().push(clip(o));
            let k = kinds.entry(o.kind).or_default();
            k.0 += 1;
            k.1 += o.duration_ns();
            k.2 += o.bytes;
        }
        for (lane, spans) in by_lane {
            let entry = lanes.entry(lane).or_default();
            entry.0 += spans.len() as u64;
            entry.1 += busy(&merge(spans));
        }
    }

    GraphUsage {
        graph,
        plan,
        launches: g.launches.len() as u64,
        failed_launches: g.launches.iter().filter(|(l, _)| l.failed).count() as u64,
        nodes: g.launches.iter().map(|(_, n)| n.len() as u64).sum(),
        unmatched_nodes: g.unmatched,
        nodes_outside_launch: outside,
        launch_time: percentiles(&times),
        launch_ns,
        node_ns,
        busy_fraction: ratio(any_busy),
        parallelism: ratio(node_ns),
        lanes: lanes
            .into_iter()
            .map(|(lane, (nodes, busy_ns))| LaneUsage {
                lane,
                nodes,
                busy_ns,
                busy_fraction: ratio(busy_ns),
            })
            .collect(),
        kinds: OpKind::ALL
            .iter()
            .filter_map(|k| {
                kinds.get(k).map(|&(count, total_ns, bytes)| NodeKindUsage {
                    kind: k.as_str().to_string(),
                    count,
                    total_ns,
                    bytes,
                })
            })
            .collect(),
    }
}

/// The Graphs section in Markdown (nothing when the trace has no launch).
pub(crate) fn write_markdown(
    md: &mut String,
    graphs: &[GraphUsage],
    without_nodes: u64,
) -> std::fmt::Result {
    if graphs.is_empty() && without_nodes == 0 {
        return Ok(());
    }
    writeln!(md, "\n## Graphs\n")?;
    writeln!(
        md,
        "A launch is one op of kind Graph on its stream; its nodes are the work. \
         Engines count the nodes, not the launch; streams, latency and the longest \
         operations count the launch, not its nodes. Busy is the share of the launch \
         span during which nodes ran (per lane: that lane's nodes); parallelism is \
         node time over launch time."
    )?;
    if without_nodes > 0 {
        writeln!(
            md,
            "\n{} recorded no node (an empty graph, or recording turned on during the \
             launch): in no graph below; the engines count such a launch as work.",
            plural(without_nodes, "launch", "launches")
        )?;
    }
    for g in graphs {
        writeln!(md, "\n### Graph {}\n", g.graph)?;
        match &g.plan {
            Some(p) => writeln!(
                md,
                "Plan: {} nodes, {} edges, {} chains on {} lanes, critical path {}, \
                 width {}; internal buffers {} in an arena of {}.\n",
                p.nodes,
                p.edges,
                p.chains,
                p.lanes,
                p.critical_path,
                p.width,
                fmt_bytes(p.internal_bytes),
                fmt_bytes(p.arena_bytes)
            )?,
            None => writeln!(md, "Plan: not in the trace.\n")?,
        }
        let p99 = if g.launches > 1 {
            format!(", p99 {}", fmt_ns(g.launch_time.p99_ns))
        } else {
            String::new()
        };
        writeln!(
            md,
            "{} ({} failed), {}: launch time median {}{}; \
             nodes busy {:.1} % of the launch span, parallelism {:.2}.\n",
            plural(g.launches, "launch", "launches"),
            g.failed_launches,
            plural(g.nodes, "node record", "node records"),
            fmt_ns(g.launch_time.p50_ns),
            p99,
            g.busy_fraction * 100.0,
            g.parallelism
        )?;
        if g.unmatched_nodes > 0 || g.nodes_outside_launch > 0 {
            writeln!(
                md,
                "Recorder: {} with no launch of their stream and value, {} outside \
                 their launch's span.\n",
                plural(g.unmatched_nodes, "node record", "node records"),
                g.nodes_outside_launch
            )?;
        }
        writeln!(md, "| lane | nodes | busy | of launch span |")?;
        writeln!(md, "| ---: | ---: | ---: | ---: |")?;
        for l in &g.lanes {
            writeln!(
                md,
                "| {} | {} | {} | {:.1} % |",
                l.lane,
                l.nodes,
                fmt_ns(l.busy_ns),
                l.busy_fraction * 100.0
            )?;
        }
        writeln!(md, "\n| node kind | nodes | time | bytes |")?;
        writeln!(md, "| --- | ---: | ---: | ---: |")?;
        for k in &g.kinds {
            writeln!(
                md,
                "| {} | {} | {} | {} |",
                k.kind,
                k.count,
                fmt_ns(k.total_ns),
                fmt_bytes(k.bytes)
            )?;
        }
    }
    Ok(())
}

/// "1 launch", "2 launches".
fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
