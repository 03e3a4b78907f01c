//! Offline memory planning for a graph's internal buffers: given each buffer's size
//! and which buffers may be live at the same time ([`Conflicts`]), [`plan`] gives every
//! buffer an offset in one arena so that conflicting buffers never share a byte.
//!
//! Invariants: every offset is a multiple of the alignment; two conflicting non-empty
//! buffers never overlap ([`verify`] checks both); a zero-sized buffer gets offset 0
//! and conflicts with nothing; [`plan`] is never larger than [`plan_greedy_by_size`]
//! on the same input, because greedy-by-size is one of the heuristics it runs and it
//! keeps the smallest result. Arithmetic saturates: an arena that would pass
//! `u64::MAX` bytes comes back with `size == u64::MAX` and fails [`verify`], never
//! panics.

use std::cmp::Reverse;

/// Which buffers may be live at the same time: a symmetric relation over buffer
/// indices, stored as one bit row per buffer (n² bits: 1.1 MiB for 3 000 buffers). A
/// buffer never conflicts with itself.
#[derive(Debug, Clone)]
pub struct Conflicts {
    bits: BitMatrix,
    /// The intervals the conflicts came from, if they did: they give [`plan`] an exact
    /// lower bound to stop at.
    intervals: Option<Vec<(u32, u32)>>,
}

impl Conflicts {
    /// Sequential schedule: buffer `i` is live over steps `intervals[i].0 ..= intervals[i].1`
    /// (a reversed pair is read as its swap); two buffers conflict iff their intervals
    /// intersect.
    pub fn from_intervals(intervals: &[(u32, u32)]) -> Conflicts {
        let n = intervals.len();
        let span = |i: usize| {
            let (a, b) = intervals[i];
            (a.min(b), a.max(b))
        };
        let mut by_start: Vec<usize> = (0..n).collect();
        by_start.sort_by_key(|&i| span(i).0);
        let mut bits = BitMatrix::zeros(n, n);
        for (k, &i) in by_start.iter().enumerate() {
            let end = span(i).1;
            // Later starts are ≥ this one's, so they intersect it iff they start by its end.
            for &j in by_start[k + 1..].iter().take_while(|&&j| span(j).0 <= end) {
                bits.set(i, j);
                bits.set(j, i);
            }
        }
        Conflicts {
            bits,
            intervals: Some(intervals.to_vec()),
        }
    }

    /// Any schedule consistent with a DAG of `nodes` nodes and `edges` (from, to): for
    /// each buffer, `uses[b]` lists the nodes that use it. Buffers a and b may share
    /// bytes iff every use of a is a strict ancestor of every use of b, or vice versa;
    /// otherwise they conflict. A buffer with no uses conflicts with nothing.
    ///
    /// The caller guarantees the graph is acyclic (node indices need not be in
    /// topological order); with a cycle the result is unspecified but nothing panics.
    /// Panics if an edge or a use names a node `>= nodes`.
    ///
    /// Cost: reachability bit rows over nodes, then two bit-matrix transposes; about
    /// `(edges + Σ uses) · nodes / 64` word operations.
    pub fn from_dag(nodes: usize, edges: &[(u32, u32)], uses: &[Vec<u32>]) -> Conflicts {
        let n = uses.len();
        let children = Csr::from_pairs(nodes, edges.iter().map(|&(f, t)| (f as usize, t)));
        // below[v]: the strict descendants of node v.
        let mut below = BitMatrix::zeros(nodes, nodes);
        for &v in topological_order(nodes, &children).iter().rev() {
            let v = v as usize;
            for &c in children.of(v) {
                below.or_row(v, c as usize);
                below.set(v, c as usize);
            }
        }
        // after[a]: the nodes below every use of a.
        let mut after = BitMatrix::ones(n, nodes);
        for (a, us) in uses.iter().enumerate() {
            for &u in us {
                after.and_row(a, &below, u as usize);
            }
        }
        // followers[u]: the buffers every use of which is above node u.
        let followers = after.transpose();
        // before[b]: the buffers that happen entirely before b (every use of b is below
        // every use of them).
        let mut before = BitMatrix::ones(n, n);
        for (b, us) in uses.iter().enumerate() {
            for &u in us {
                before.and_row(b, &followers, u as usize);
            }
        }
        let later = before.transpose();
        let mut bits = BitMatrix::zeros(n, n);
        for b in 0..n {
            let row = bits.row_mut(b);
            for (w, x) in row.iter_mut().enumerate() {
                *x = !(before.row(b)[w] | later.row(b)[w]);
            }
            bits.clear_tail(b);
            bits.clear(b, b);
        }
        Conflicts {
            bits,
            intervals: None,
        }
    }

    /// Whether buffers `a` and `b` may be live at the same time. Panics if either is
    /// `>= len()`.
    pub fn conflict(&self, a: usize, b: usize) -> bool {
        assert!(
            a < self.len() && b < self.len(),
            "buffers {a}, {b} out of {}",
            self.len()
        );
        self.bits.get(a, b)
    }

    /// The number of buffers.
    pub fn len(&self) -> usize {
        self.bits.rows
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffers that conflict with `a`, ascending.
    fn neighbours(&self, a: usize) -> impl Iterator<Item = usize> + Clone + '_ {
        ones(self.bits.row(a))
    }
}

/// Where each buffer lives in the arena, and the arena's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArenaPlan {
    /// Byte offset of each buffer, a multiple of the alignment asked.
    pub offsets: Vec<u64>,
    /// `max(offset + size)` over the buffers; 0 when every buffer is empty.
    pub size: u64,
    /// Which heuristic produced the plan.
    pub strategy: &'static str,
}

/// The planner: offsets (multiples of `align`, a power of two) such that conflicting
/// buffers never overlap.
///
/// Places the buffers greedily — each at the lowest aligned offset clear of the
/// conflicting buffers placed before it — in three orders: by size (the
/// [`plan_greedy_by_size`] peer), by breadth (its size plus the sizes it conflicts
/// with) and by size × √(conflicts). From each it searches locally — moves a buffer
/// ending near the top to an earlier place in the order and places again what that
/// changes, keeping the move unless the arena grows — and keeps the smallest plan. It
/// stops as soon as a plan reaches the lower bound: the exact peak for
/// [`Conflicts::from_intervals`], else [`heaviest_clique`]. A search never returns a
/// plan larger than its start and the first start is greedy-by-size, so the result is
/// never above [`plan_greedy_by_size`]. Deterministic.
///
/// Cost: O(n²/64) to read the conflicts, then O(n·d·log d) per placement for n
/// buffers of d conflicts on average; each of the three searches is bounded at four
/// placements' worth of work.
///
/// Panics if `align` is not a power of two or `sizes` and `conflicts` differ in length.
///
/// ```
/// use hetero_memory::arena_plan::{plan, verify, Conflicts};
/// let sizes = [1000, 3000, 2000];
/// // 0 and 1 live together, then 1 and 2: 0 and 2 can share bytes.
/// let c = Conflicts::from_intervals(&[(0, 1), (1, 2), (2, 3)]);
/// let p = plan(&sizes, 256, &c);
/// assert!(verify(&sizes, 256, &c, &p).is_ok());
/// // 0 and 2 at offset 0, 1 above the larger of them.
/// assert_eq!(p.size, 2048 + 3000);
/// ```
pub fn plan(sizes: &[u64], align: u64, conflicts: &Conflicts) -> ArenaPlan {
    let mut placer = Placer::new(sizes, align, conflicts);
    let floor = match &conflicts.intervals {
        Some(intervals) => peak_live_intervals(sizes, intervals),
        None => heaviest_clique(sizes, conflicts),
    };
    let n = sizes.len();
    let breadth = placer.breadth();
    let size_and_degree = |i: usize| {
        let degree = placer.conflicts.of(i).len() as f64 + 1.0;
        (sizes[i] as f64 * degree.sqrt()) as u64
    };
    let starts = [
        (
            ["greedy-by-size", "greedy-by-size, searched"],
            order_by(n, |i| sizes[i]),
        ),
        (
            ["greedy-by-breadth", "greedy-by-breadth, searched"],
            order_by(n, |i| breadth[i]),
        ),
        (
            [
                "greedy-by-size-and-degree",
                "greedy-by-size-and-degree, searched",
            ],
            order_by(n, size_and_degree),
        ),
    ];
    let mut best: Option<Placement> = None;
    for ([placed, searched], order) in starts {
        if best.as_ref().is_some_and(|b| b.size <= floor) {
            break;
        }
        let start = placer.place(placed, order);
        let p = placer.search(start, floor, searched);
        if best.as_ref().is_none_or(|b| p.size < b.size) {
            best = Some(p);
        }
    }
    best.expect("the first start is always placed").into_plan()
}

/// One buffer after another in index order, no sharing.
pub fn plan_naive(sizes: &[u64], align: u64) -> ArenaPlan {
    check_align(align);
    let mut top = 0u64;
    let offsets = sizes
        .iter()
        .map(|&s| {
            if s == 0 {
                return 0;
            }
            let off = align_up(top, align);
            top = off.saturating_add(s);
            off
        })
        .collect();
    ArenaPlan {
        offsets,
        size: top,
        strategy: "naive",
    }
}

/// The classic peer: sort by size descending (ties by index), place each buffer at the
/// lowest aligned offset that overlaps no already-placed conflicting buffer.
pub fn plan_greedy_by_size(sizes: &[u64], align: u64, conflicts: &Conflicts) -> ArenaPlan {
    let order = order_by(sizes.len(), |i| sizes[i]);
    Placer::new(sizes, align, conflicts)
        .place("greedy-by-size", order)
        .into_plan()
}

/// The exact lower bound for interval conflicts: the most bytes live at one step.
/// Panics if `sizes` and `intervals` differ in length.
pub fn peak_live_intervals(sizes: &[u64], intervals: &[(u32, u32)]) -> u64 {
    assert_eq!(sizes.len(), intervals.len(), "one interval per buffer");
    // (step, bytes entering at it, bytes leaving after it), swept in step order.
    let mut events: Vec<(u64, bool, u64)> = Vec::with_capacity(2 * sizes.len());
    for (&s, &(a, b)) in sizes.iter().zip(intervals) {
        events.push((u64::from(a.min(b)), true, s));
        events.push((u64::from(a.max(b)) + 1, false, s));
    }
    // At one step, leaving (false) sorts before entering (true).
    events.sort_unstable();
    let (mut live, mut peak) = (0u128, 0u128);
    for (_, enters, s) in events {
        if enters {
            live += u128::from(s);
            peak = peak.max(live);
        } else {
            live -= u128::from(s);
        }
    }
    u64::try_from(peak).unwrap_or(u64::MAX)
}

/// A lower bound for any conflicts: the weight of a heavy clique (buffers that all
/// conflict pairwise must all be disjoint), found greedily from the heaviest seeds.
/// Heuristic: any valid plan is at least this large, but the true heaviest clique may
/// be heavier. For interval conflicts use [`peak_live_intervals`], which is exact.
pub fn heaviest_clique(sizes: &[u64], conflicts: &Conflicts) -> u64 {
    const SEEDS: usize = 128;
    assert_eq!(sizes.len(), conflicts.len(), "one size per buffer");
    let mut best = 0u64;
    for seed in order_by(sizes.len(), |i| sizes[i]).into_iter().take(SEEDS) {
        let seed = seed as usize;
        let mut weight = sizes[seed];
        let mut candidates = conflicts.bits.row(seed).to_vec();
        while let Some(c) = ones(&candidates).max_by_key(|&c| (sizes[c], Reverse(c))) {
            weight = weight.saturating_add(sizes[c]);
            for (x, y) in candidates.iter_mut().zip(conflicts.bits.row(c)) {
                *x &= y;
            }
        }
        best = best.max(weight);
    }
    best
}

/// Checks a plan: one offset per buffer, every offset aligned, every buffer inside
/// `size`, and no two conflicting non-empty buffers overlapping. The error names the
/// first offending buffer or pair.
pub fn verify(
    sizes: &[u64],
    align: u64,
    conflicts: &Conflicts,
    plan: &ArenaPlan,
) -> Result<(), String> {
    let n = sizes.len();
    if plan.offsets.len() != n || conflicts.len() != n {
        return Err(format!(
            "{n} sizes, {} offsets, {} buffers in the conflicts: give one of each per buffer",
            plan.offsets.len(),
            conflicts.len()
        ));
    }
    if !align.is_power_of_two() {
        return Err(format!("alignment {align} is not a power of two"));
    }
    let mut ends = Vec::with_capacity(n);
    for (i, (&off, &s)) in plan.offsets.iter().zip(sizes).enumerate() {
        if off % align != 0 {
            return Err(format!("buffer {i} at offset {off} is not {align}-aligned"));
        }
        let end = off
            .checked_add(s)
            .ok_or_else(|| format!("buffer {i} ({s} B at offset {off}) passes u64::MAX"))?;
        if s > 0 && end > plan.size {
            return Err(format!(
                "buffer {i} ({s} B at offset {off}) ends past the arena's {} B",
                plan.size
            ));
        }
        ends.push(end);
    }
    for a in (0..n).filter(|&a| sizes[a] > 0) {
        for b in conflicts.neighbours(a).filter(|&b| b > a && sizes[b] > 0) {
            let (oa, ob) = (plan.offsets[a], plan.offsets[b]);
            if oa < ends[b] && ob < ends[a] {
                return Err(format!(
                    "buffers {a} ({} B at {oa}) and {b} ({} B at {ob}) conflict and overlap",
                    sizes[a], sizes[b]
                ));
            }
        }
    }
    Ok(())
}

mod dag;
mod place;
mod random;
mod sweep;
#[cfg(test)]
mod tests;

use dag::{ones, topological_order, BitMatrix, Csr};
use place::{align_up, check_align, order_by, Placement, Placer};
pub use random::{random_case, RandomCase};
pub use sweep::{merge_free, plan_intervals};
