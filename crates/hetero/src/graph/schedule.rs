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
    /// Successors of node `v`: `succ[succ_start[v]..succ_start[v + 1]]`.
    pub(crate) succ_start: Vec<u32>,
    pub(crate) succ: Vec<u32>,
    /// Predecessor count per node.
    pub(crate) preds: Vec<u32>,
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

pub(crate) fn schedule(d: &Draft, compute_units: usize) -> Result<Schedule> {
    let n = d.nodes.len();
    let mut edges = d.edges.clone();
    sort_dedup(&mut edges);
    let explicit_order = topo(n, &edges)?;

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

    let mut preds = vec![0u32; n];
    let mut succ_start = vec![0u32; n + 1];
    for &(a, b) in &edges {
        succ_start[a as usize + 1] += 1;
        preds[b as usize] += 1;
    }
    for i in 0..n {
        succ_start[i + 1] += succ_start[i];
    }
    // `edges` is sorted by source: the successor lists are its targets.
    let succ: Vec<u32> = edges.iter().map(|&(_, b)| b).collect();
    // Predecessor lists, likewise flat.
    let mut pred_start = vec![0u32; n + 1];
    for (v, &p) in preds.iter().enumerate() {
        pred_start[v + 1] = pred_start[v] + p;
    }
    let mut fill = pred_start.clone();
    let mut pred_list = vec![0u32; edges.len()];
    for &(a, b) in &edges {
        pred_list[fill[b as usize] as usize] = a;
        fill[b as usize] += 1;
    }

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

    // Lanes: chains by the level they start at, each to the least loaded lane.
    let lanes = (chain_heads.len().min(compute_units.max(1))) as u32;
    let mut chain_len = vec![0u32; chain_heads.len()];
    for &c in &chain_of {
        chain_len[c as usize] += 1;
    }
    let mut by_level: Vec<u32> = (0..chain_heads.len() as u32).collect();
    by_level.sort_by_key(|&c| (level[chain_heads[c as usize] as usize], c));
    let mut load = vec![0u64; lanes as usize];
    let mut chain_lane = vec![0u32; chain_heads.len()];
    for c in by_level {
        let (lane, _) = load
            .iter()
            .enumerate()
            .min_by_key(|&(i, &l)| (l, i))
            .expect("at least one lane when there is a chain");
        chain_lane[c as usize] = lane as u32;
        load[lane] += u64::from(chain_len[c as usize]);
    }

    let node_lane = chain_of.iter().map(|&c| chain_lane[c as usize]).collect();
    let hot = (0..n)
        .map(|v| Hot {
            preds: preds[v],
            next: chain_next[v],
            succ_start: succ_start[v],
            succ_end: succ_start[v + 1],
        })
        .collect();
    Ok(Schedule {
        order,
        succ_start,
        succ,
        preds,
        hot,
        chain_heads,
        chain_lane,
        node_lane,
        lanes,
        critical_path,
        width,
        edges,
        hazard_edges,
    })
}

impl Schedule {
    pub(crate) fn successors(&self, v: u32) -> &[u32] {
        &self.succ[self.succ_start[v as usize] as usize..self.succ_start[v as usize + 1] as usize]
    }
}
