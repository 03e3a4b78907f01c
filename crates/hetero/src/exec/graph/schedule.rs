//! The schedule of an instantiated graph: a topological order, the edges that
//! keep buffer accesses ordered, and the split into linear chains.
//!
//! A chain is a path whose nodes run one after another on one engine with no
//! synchronisation between them; only edges between chains (forks and joins)
//! cost an atomic operation at run time. Chains are built in topological order:
//! a node continues the chain of the predecessor with the highest dependency
//! level whose chain still ends at it, else it starts a new chain. Chains are
//! then assigned to lanes (at most one per compute unit) by the level of their
//! first node, each to the lane with the least work so far; the run itself is
//! dynamic (a chain starts wherever an engine is free), and the lanes are the
//! plan the profile report shows.

use super::{Draft, Operand};
use crate::{Error, Result};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

pub(crate) const NONE: u32 = u32::MAX;

/// What running a node needs of the schedule, in one place per node.
#[derive(Clone, Copy)]
pub(crate) struct Hot {
    pub(crate) preds: u32,
    /// The next node of its chain (`NONE` at the end).
    pub(crate) next: u32,
    /// Its successors: `succ[succ_start..succ_end]`.
    pub(crate) succ_start: u32,
    pub(crate) succ_end: u32,
}

pub(crate) struct Schedule {
    /// Nodes in a topological order (recording order where edges allow).
    pub(crate) order: Vec<u32>,
    /// Successors, in ranges `Hot::succ_start..succ_end`.
    pub(crate) succ: Vec<u32>,
    /// Per node: predecessors, chain successor, successor range.
    pub(crate) hot: Vec<Hot>,
    /// The first node of each chain.
    pub(crate) chain_heads: Vec<u32>,
    /// The lane of each chain.
    pub(crate) chain_lane: Vec<u32>,
    /// The lane of each node's chain.
    pub(crate) node_lane: Vec<u32>,
    pub(crate) lanes: u32,
    /// Nodes on the longest path.
    pub(crate) critical_path: u32,
    /// Most nodes on one level.
    pub(crate) width: u32,
    /// Every edge, explicit and added for buffer order, deduplicated.
    pub(crate) edges: Vec<(u32, u32)>,
    /// Edges added to order buffer accesses.
    pub(crate) hazard_edges: usize,
    /// The lane schedule's length in unit steps (one per node on one lane).
    pub(crate) steps: u32,
    /// Nodes without predecessors, in node order (queued at each launch).
    pub(crate) sources: Vec<u32>,
    /// Nodes with two or more predecessors (their counters are reset at each
    /// launch): a launch readies its run state in O(sources + joins), not O(nodes).
    pub(crate) joins: Vec<u32>,
    /// The graph's own dependency edges (explicit and captured, not those
    /// added for buffer order, lanes or memory): what a fault follows.
    pub(crate) dependents: Dependents,
}

/// The graph's dependency edges: a fault in a node
/// skips exactly its descendants along these, while the run's edges (`succ`)
/// also chain nodes that merely share a lane.
#[derive(Clone, Default)]
pub(crate) struct Dependents {
    /// The graph's own edges, sorted by source.
    edges: Vec<(u32, u32)>,
}

impl Dependents {
    /// From `edges` sorted by source (as `schedule` keeps them).
    pub(crate) fn new(edges: &[(u32, u32)]) -> Self {
        debug_assert!(edges.windows(2).all(|w| w[0] <= w[1]));
        Dependents {
            edges: edges.to_vec(),
        }
    }

    /// The nodes that depend on `v` directly (looked up only after a fault).
    pub(crate) fn of(&self, v: u32) -> impl Iterator<Item = u32> + '_ {
        let first = self.edges.partition_point(|&(a, _)| a < v);
        self.edges[first..]
            .iter()
            .take_while(move |&&(a, _)| a == v)
            .map(|&(_, b)| b)
    }
}

fn graph_error(detail: String) -> Error {
    Error::Graph {
        op: "instantiate",
        detail,
    }
}

/// A buffer's identity for ordering accesses.
fn key(o: &Operand) -> (u8, usize) {
    match o {
        Operand::Fixed(s) => (0, Arc::as_ptr(s) as usize),
        Operand::Slot(i) => (1, *i as usize),
        Operand::Internal(i) => (2, *i as usize),
    }
}

/// Kahn's algorithm, lowest index first among ready nodes (recording order
/// itself when every edge points forward, as in every capture).
fn topo(n: usize, edges: &[(u32, u32)]) -> Result<Vec<u32>> {
    if edges.iter().all(|&(a, b)| a < b) {
        return Ok((0..n as u32).collect());
    }
    let mut indeg = vec![0u32; n];
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); n];
    for &(a, b) in edges {
        indeg[b as usize] += 1;
        out[a as usize].push(b);
    }
    let mut ready: BinaryHeap<Reverse<u32>> = (0..n as u32)
        .filter(|&v| indeg[v as usize] == 0)
        .map(Reverse)
        .collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(v)) = ready.pop() {
        order.push(v);
        for &s in &out[v as usize] {
            indeg[s as usize] -= 1;
            if indeg[s as usize] == 0 {
                ready.push(Reverse(s));
            }
        }
    }
    if order.len() < n {
        let stuck: Vec<String> = (0..n)
            .filter(|&v| indeg[v] > 0)
            .take(8)
            .map(|v| v.to_string())
            .collect();
        return Err(graph_error(format!(
            "the dependencies form a cycle (nodes {} are on or behind it); remove an edge",
            stuck.join(", ")
        )));
    }
    Ok(order)
}

/// Sorts and deduplicates edges; a list already in order (a capture's) is
/// only checked.
fn sort_dedup(edges: &mut Vec<(u32, u32)>) {
    if !edges.windows(2).all(|w| w[0] < w[1]) {
        edges.sort_unstable();
        edges.dedup();
    }
}

/// How the schedule treats the graph's own buffers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemoryOrder {
    /// Lanes run as freely as the graph's edges allow.
    Free,
    /// At most this many bytes of the graph's buffers live at once in the
    /// unit-time lane schedule. A node that is the first to use one of them
    /// (it brings the buffer to life) also waits for the nodes the schedule
    /// finished before it starts, the latest on each other lane: those edges
    /// agree with the schedule, so its length is unchanged, and a buffer whose
    /// uses all ended by then may share bytes with the new one (the memory plan
    /// sees the schedule's own overlap, not every overlap the lanes allow).
    /// Where the new bytes would pass the budget, the node starts after
    /// everything placed before it instead (a fence): what is live then is
    /// what the one-lane order has live there.
    Budget(u64),
}

pub(crate) fn schedule(d: &Draft, compute_units: usize, memory: MemoryOrder) -> Result<Schedule> {
    let n = d.nodes.len();
    let mut edges = d.edges.clone();
    sort_dedup(&mut edges);
    let explicit_order = topo(n, &edges)?;
    let dependents = Dependents::new(&edges);

    // Buffer order: readers after the last writer, a writer after the readers
    // since the last write (or after that writer).
    #[derive(Default)]
    struct Hazard {
        writer: Option<u32>,
        readers: Vec<u32>,
    }
    let mut hazards: HashMap<(u8, usize), Hazard> = HashMap::with_capacity(d.args.len().min(n) + 8);
    let explicit = edges.len();
    for &v in &explicit_order {
        d.accesses(v as usize, |o, write| {
            let h = hazards.entry(key(o)).or_default();
            if write {
                if h.readers.is_empty() {
                    edges.extend(h.writer.map(|w| (w, v)));
                } else {
                    edges.extend(h.readers.drain(..).filter(|&r| r != v).map(|r| (r, v)));
                }
                h.writer = Some(v);
            } else {
                edges.extend(h.writer.filter(|&w| w != v).map(|w| (w, v)));
                h.readers.push(v);
            }
        });
    }
    if edges.len() > explicit {
        sort_dedup(&mut edges);
    }
    let hazard_edges = edges.len().saturating_sub(explicit);
    // Hazard edges follow `explicit_order`, so it stays a topological order.
    let order = explicit_order;

    let (mut pred_start, mut pred_list) = predecessors_of(n, &edges);

    let mut level = vec![0u32; n];
    let mut chain_next = vec![NONE; n];
    let mut chain_of = vec![0u32; n];
    let mut chain_heads = Vec::new();
    for &v in &order {
        let ps = &pred_list[pred_start[v as usize] as usize..pred_start[v as usize + 1] as usize];
        level[v as usize] = ps.iter().map(|&p| level[p as usize] + 1).max().unwrap_or(0);
        let cont = ps
            .iter()
            .copied()
            .filter(|&p| chain_next[p as usize] == NONE)
            .max_by_key(|&p| (level[p as usize], Reverse(p)));
        match cont {
            Some(p) => {
                chain_next[p as usize] = v;
                chain_of[v as usize] = chain_of[p as usize];
            }
            None => {
                chain_of[v as usize] = chain_heads.len() as u32;
                chain_heads.push(v);
            }
        }
    }
    let critical_path = level.iter().map(|&l| l + 1).max().unwrap_or(0);
    let mut per_level = vec![0u32; critical_path as usize];
    for &l in &level {
        per_level[l as usize] += 1;
    }
    let width = per_level.iter().copied().max().unwrap_or(0);

    // Lanes, the plan's hardware queues: at most one per compute unit, each a
    // sequence of nodes run in order. Nodes are placed in topological order,
    // each on the lane where it can start first under unit cost (ties: the
    // lane of a predecessor that ends just then, so chains stay together;
    // then the lowest lane). A lane's nodes start in increasing (unit) time,
    // as do the two ends of every edge, so the edges that chain each lane
    // cannot close a cycle. Only edges between lanes cost an atomic at run
    // time, and the memory plan sees at most `lanes` nodes at once.
    let lanes = (chain_heads.len().min(compute_units.max(1))) as u32;
    let mut lane_free = vec![0u64; lanes as usize];
    let mut lane_last = vec![NONE; lanes as usize];
    // Unit times: at most one node per step, so they fit the node count.
    let mut finish = vec![0u32; if lanes > 1 { n } else { 0 }];
    let mut node_lane = vec![0u32; n];
    let mut lane_edges = Vec::new();
    // Under a budget: the bytes each node brings to life (first uses, in
    // `order`) and ends (last uses), each lane's nodes in placement order
    // (their finish times increase), and the bytes live over unit time.
    let budget = match memory {
        MemoryOrder::Budget(b) if lanes > 1 && !d.internal.is_empty() => Some(b as i64),
        _ => None,
    };
    let (born, ended) = match budget {
        Some(_) => life_bytes(d, &order),
        None => (Vec::new(), Vec::new()),
    };
    let mut live = super::live::LiveBytes::new(if budget.is_some() { n + 1 } else { 0 });
    let mut on_lane: Vec<Vec<u32>> =
        vec![Vec::new(); if budget.is_some() { lanes as usize } else { 0 }];
    let mut barrier_edges: Vec<(u32, u32)> = Vec::new();
    for &v in order.iter().filter(|_| lanes > 1) {
        let ps = &pred_list[pred_start[v as usize] as usize..pred_start[v as usize + 1] as usize];
        let ready = u64::from(ps.iter().map(|&p| finish[p as usize]).max().unwrap_or(0));
        let (mut lane, mut start) = (0..lanes as usize)
            .map(|l| {
                let start = lane_free[l].max(ready);
                let continues = lane_last[l] != NONE && ps.contains(&lane_last[l]);
                (l, start, !continues)
            })
            .min_by_key(|&(l, start, other)| (start, other, l))
            .map(|(l, start, _)| (l, start))
            .expect("at least one lane");
        if let Some(budget) = budget.filter(|_| born[v as usize] > 0) {
            let new = born[v as usize];
            if live.max_from(start as usize) + new > budget {
                // A fence: after every node placed so far, on the lane that
                // frees last (its chain edge is one of the fence's edges).
                (lane, start) = (0..lanes as usize)
                    .map(|l| (l, lane_free[l]))
                    .max_by_key(|&(l, free)| (free, Reverse(l)))
                    .expect("at least one lane");
                start = start.max(ready);
            }
            for (_, nodes) in on_lane.iter().enumerate().filter(|&(l, _)| l != lane) {
                let k = nodes.partition_point(|&u| u64::from(finish[u as usize]) <= start);
                if k > 0 {
                    barrier_edges.push((nodes[k - 1], v));
                }
            }
            live.add_from(start as usize, new);
        }
        if budget.is_some() {
            on_lane[lane].push(v);
            live.add_from(start as usize + 1, -ended[v as usize]);
        }
        finish[v as usize] = (start + 1) as u32;
        lane_free[lane] = start + 1;
        if lane_last[lane] != NONE {
            lane_edges.push((lane_last[lane], v));
        }
        lane_last[lane] = v;
        node_lane[v as usize] = lane as u32;
    }
    if lanes <= 1 {
        // One lane: the topological order itself.
        lane_edges.extend(order.windows(2).map(|w| (w[0], w[1])));
    }
    if !barrier_edges.is_empty() {
        // Each goes from a node placed earlier, so `order` stays topological.
        edges.extend(barrier_edges);
        sort_dedup(&mut edges);
        (pred_start, pred_list) = predecessors_of(n, &edges);
    }
    let chain_lane: Vec<u32> = chain_heads.iter().map(|&h| node_lane[h as usize]).collect();
    let mut lane_next = vec![NONE; n];
    let mut lane_prev = vec![NONE; if lanes > 1 { n } else { 0 }];
    for &(a, b) in &lane_edges {
        lane_next[a as usize] = b;
        if lanes > 1 {
            lane_prev[b as usize] = a;
        }
    }
    let edges = reduce(
        &order,
        &pred_start,
        &pred_list,
        &node_lane,
        &lane_prev,
        lanes as usize,
    );
    let (preds, succ_start, succ) = successors_of(n, &edges);
    let hot: Vec<Hot> = (0..n)
        .map(|v| Hot {
            preds: preds[v],
            next: lane_next[v],
            succ_start: succ_start[v],
            succ_end: succ_start[v + 1],
        })
        .collect();
    let sources = (0..n as u32)
        .filter(|&v| hot[v as usize].preds == 0)
        .collect();
    let joins = (0..n as u32)
        .filter(|&v| hot[v as usize].preds >= 2)
        .collect();
    Ok(Schedule {
        sources,
        joins,
        dependents,
        order,
        succ,
        hot,
        chain_heads,
        chain_lane,
        node_lane,
        lanes,
        critical_path,
        width,
        edges,
        hazard_edges,
        steps: if lanes > 1 {
            finish.iter().copied().max().unwrap_or(0)
        } else {
            n as u32
        },
    })
}

/// The edges a run needs: each lane's chain, and of the other edges only those
/// the chain does not already imply. A vector clock per node records, for
/// every lane, the last position on it known to come before the node; an edge
/// from position `p` of lane `M` is dropped when the clock already reaches `p`
/// on `M` (always, when both ends share a lane). Reachability is unchanged, so
/// is every order the graph promises; what remains between lanes is the forks
/// and joins.
fn reduce(
    order: &[u32],
    pred_start: &[u32],
    pred_list: &[u32],
    node_lane: &[u32],
    lane_prev: &[u32],
    lanes: usize,
) -> Vec<(u32, u32)> {
    let n = node_lane.len();
    if lanes <= 1 {
        // Every other edge is implied by the one lane's chain.
        let mut edges: Vec<(u32, u32)> = order.windows(2).map(|w| (w[0], w[1])).collect();
        edges.sort_unstable();
        return edges;
    }
    let mut pos = vec![0u32; n];
    let mut next_pos = vec![0u32; lanes];
    for &v in order {
        let l = node_lane[v as usize] as usize;
        next_pos[l] += 1;
        pos[v as usize] = next_pos[l];
    }
    let mut clock = vec![0u32; n * lanes];
    let mut edges = Vec::with_capacity(n + 8);
    let mut candidates: Vec<u32> = Vec::new();
    let mut c = vec![0u32; lanes];
    for &v in order {
        let vi = v as usize;
        let l = node_lane[vi] as usize;
        let u = lane_prev[vi];
        c.fill(0);
        if u != NONE {
            c.copy_from_slice(&clock[u as usize * lanes..(u as usize + 1) * lanes]);
            edges.push((u, v));
        }
        c[l] = pos[vi];
        // Latest first: a later predecessor on a lane implies the earlier ones.
        candidates.clear();
        candidates.extend(
            pred_list[pred_start[vi] as usize..pred_start[vi + 1] as usize]
                .iter()
                .copied()
                .filter(|&p| p != u && node_lane[p as usize] as usize != l),
        );
        candidates.sort_unstable_by_key(|&p| Reverse(pos[p as usize]));
        for &p in &candidates {
            let m = node_lane[p as usize] as usize;
            if c[m] >= pos[p as usize] {
                continue;
            }
            edges.push((p, v));
            for (k, ck) in c.iter_mut().enumerate() {
                *ck = (*ck).max(clock[p as usize * lanes + k]);
            }
        }
        clock[vi * lanes..(vi + 1) * lanes].copy_from_slice(&c);
    }
    edges.sort_unstable();
    edges
}

/// Per node, the bytes of the graph's buffers it is the first to use and the
/// last to use, in `order`.
fn life_bytes(d: &Draft, order: &[u32]) -> (Vec<i64>, Vec<i64>) {
    let n = d.nodes.len();
    let mut first = vec![NONE; d.internal.len()];
    let mut last = vec![NONE; d.internal.len()];
    for &v in order {
        d.accesses(v as usize, |o, _| {
            if let Operand::Internal(i) = o {
                let i = *i as usize;
                if first[i] == NONE {
                    first[i] = v;
                }
                last[i] = v;
            }
        });
    }
    let (mut born, mut ended) = (vec![0i64; n], vec![0i64; n]);
    for (i, &bytes) in d.internal.iter().enumerate() {
        if first[i] != NONE {
            born[first[i] as usize] += bytes as i64;
            ended[last[i] as usize] += bytes as i64;
        }
    }
    (born, ended)
}

/// Predecessor lists, flat: node `v`'s are `list[start[v]..start[v + 1]]`.
fn predecessors_of(n: usize, edges: &[(u32, u32)]) -> (Vec<u32>, Vec<u32>) {
    let mut start = vec![0u32; n + 1];
    for &(_, b) in edges {
        start[b as usize + 1] += 1;
    }
    for v in 0..n {
        start[v + 1] += start[v];
    }
    let mut fill = start.clone();
    let mut list = vec![0u32; edges.len()];
    for &(a, b) in edges {
        list[fill[b as usize] as usize] = a;
        fill[b as usize] += 1;
    }
    (start, list)
}

/// Predecessor counts and successor lists (flat) of sorted `edges`.
fn successors_of(n: usize, edges: &[(u32, u32)]) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let mut preds = vec![0u32; n];
    let mut succ_start = vec![0u32; n + 1];
    for &(a, b) in edges {
        succ_start[a as usize + 1] += 1;
        preds[b as usize] += 1;
    }
    for i in 0..n {
        succ_start[i + 1] += succ_start[i];
    }
    // `edges` is sorted by source: the successor lists are its targets.
    let succ = edges.iter().map(|&(_, b)| b).collect();
    (preds, succ_start, succ)
}

impl Schedule {
    pub(crate) fn successors(&self, v: u32) -> &[u32] {
        let h = &self.hot[v as usize];
        &self.succ[h.succ_start as usize..h.succ_end as usize]
    }
}
