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
use std::collections::BinaryHeap;
use std::ops::RangeInclusive;

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

/// A plan with the order that produced it.
#[derive(Debug, Clone)]
struct Placement {
    strategy: &'static str,
    order: Vec<u32>,
    offsets: Vec<u64>,
    size: u64,
}

impl Placement {
    fn into_plan(self) -> ArenaPlan {
        ArenaPlan {
            offsets: self.offsets,
            size: self.size,
            strategy: self.strategy,
        }
    }

    fn end(&self, sizes: &[u64], i: usize) -> u64 {
        self.offsets[i].saturating_add(sizes[i])
    }
}

/// Marks a buffer not placed yet.
const UNPLACED: u64 = u64::MAX;

/// The most work one [`Placer::search`] may do, in placements of every buffer.
const SEARCH_PLACEMENTS: usize = 4;

/// Places buffers greedily in a given order; holds the conflict lists of the non-empty
/// buffers and scratch space reused across placements.
struct Placer<'a> {
    sizes: &'a [u64],
    align: u64,
    conflicts: Csr,
    /// The conflicting neighbours placed before the buffer being placed: (offset, end).
    taken: Vec<(u64, u64)>,
    /// Work done, all placements together: one per buffer placed plus one per
    /// conflict it checks, and the search's bookkeeping.
    work: usize,
}

impl<'a> Placer<'a> {
    fn new(sizes: &'a [u64], align: u64, conflicts: &Conflicts) -> Self {
        check_align(align);
        assert_eq!(sizes.len(), conflicts.len(), "one size per buffer");
        // Zero-sized buffers conflict with nothing.
        let mut non_empty = BitMatrix::zeros(1, sizes.len());
        for (i, _) in sizes.iter().enumerate().filter(|(_, &s)| s > 0) {
            non_empty.set(0, i);
        }
        Placer {
            sizes,
            align,
            conflicts: Csr::from_bits(&conflicts.bits, non_empty.row(0)),
            taken: Vec::new(),
            work: 0,
        }
    }

    /// Each buffer's size plus the sizes of the buffers it conflicts with.
    fn breadth(&self) -> Vec<u64> {
        (0..self.sizes.len())
            .map(|i| {
                self.conflicts.of(i).iter().fold(self.sizes[i], |w, &j| {
                    w.saturating_add(self.sizes[j as usize])
                })
            })
            .collect()
    }

    /// Places every buffer in `order`.
    fn place(&mut self, strategy: &'static str, order: Vec<u32>) -> Placement {
        let mut offsets = vec![UNPLACED; self.sizes.len()];
        let mut size = 0u64;
        for &i in &order {
            let i = i as usize;
            offsets[i] = self.fit(i, &offsets, |j| offsets[j] != UNPLACED);
            size = size.max(offsets[i].saturating_add(self.sizes[i]));
        }
        Placement {
            strategy,
            order,
            offsets,
            size,
        }
    }

    /// The lowest aligned offset for buffer `i` clear of its conflicting neighbours
    /// `j` for which `before(j)` holds (those placed before it).
    fn fit(&mut self, i: usize, offsets: &[u64], before: impl Fn(usize) -> bool) -> u64 {
        self.work += 1 + self.conflicts.of(i).len();
        let size = self.sizes[i];
        if size == 0 {
            return 0;
        }
        self.taken.clear();
        for &j in self.conflicts.of(i) {
            let j = j as usize;
            if before(j) {
                let off = offsets[j];
                self.taken.push((off, off.saturating_add(self.sizes[j])));
            }
        }
        self.taken.sort_unstable();
        lowest_fit(&self.taken, size, self.align)
    }

    /// Local search from `start`: move a buffer near the top — the one that sets it,
    /// or every other time one ending in the top eighth — to a random earlier place
    /// in the order, and place again the buffers that the move affects; keep the move
    /// unless a buffer ends above the current size. Stops at `floor` or after
    /// [`SEARCH_PLACEMENTS`] placements' worth of work. Names the result `searched`
    /// if it is smaller than `start`.
    fn search(&mut self, start: Placement, floor: u64, searched: &'static str) -> Placement {
        let n = self.sizes.len();
        let first = start.size;
        let mut p = start;
        let mut state = MoveState::new(&p.order);
        let mut rng = SplitMix(n as u64);
        let mut near_top = Vec::new();
        let mut stale = true;
        let budget = self.work + SEARCH_PLACEMENTS * (n + self.conflicts.items.len());
        while p.size > floor && self.work < budget {
            if stale {
                self.work += n;
                near_top = self.near_top(&p);
                stale = false;
            }
            let pick = if rng.below(2) == 0 {
                0
            } else {
                rng.below(near_top.len() as u64) as usize
            };
            let Some(&moved) = near_top.get(pick) else {
                break;
            };
            let from = state.rank[moved] as usize;
            self.work += 1;
            if from == 0 {
                continue;
            }
            let to = rng.below(from as u64) as usize;
            // A rotation costs about an eighth of a placement per buffer it shifts.
            self.work += (from - to) / 8;
            if self.try_move(&mut p, &mut state, to..=from) {
                p.size = (0..n).map(|i| p.end(self.sizes, i)).max().unwrap_or(0);
                stale = true;
            }
        }
        if p.size < first {
            p.strategy = searched;
        }
        p
    }

    /// The non-empty buffers ending in the top eighth of the arena, the one ending
    /// highest first.
    fn near_top(&self, p: &Placement) -> Vec<usize> {
        let band = p.size - p.size / 8;
        let mut near: Vec<usize> = (0..self.sizes.len())
            .filter(|&i| self.sizes[i] > 0 && p.end(self.sizes, i) > band)
            .collect();
        if let Some(top) =
            (0..near.len()).max_by_key(|&k| (p.end(self.sizes, near[k]), Reverse(near[k])))
        {
            near.swap(0, top);
        }
        near
    }

    /// Moves the buffer at the end of `range` to its start and places again every
    /// buffer whose set of earlier conflicting neighbours, or one of their offsets,
    /// changed — in order, so each sees its final predecessors. Undoes it all and
    /// returns false if a buffer would end above `p.size`; returns whether any offset
    /// changed otherwise.
    fn try_move(
        &mut self,
        p: &mut Placement,
        s: &mut MoveState,
        range: RangeInclusive<usize>,
    ) -> bool {
        let (to, from) = (*range.start(), *range.end());
        let moved = p.order[from] as usize;
        s.rotate(&mut p.order, range.clone(), true);
        // The moved buffer now sees fewer buffers before it, and those it jumped over
        // see one more.
        s.mark(moved);
        for &j in self.conflicts.of(moved) {
            if range.contains(&(s.rank[j as usize] as usize)) {
                s.mark(j as usize);
            }
        }
        s.undo.clear();
        let mut grew = false;
        while let Some(Reverse(at)) = s.dirty.pop() {
            let i = p.order[at as usize] as usize;
            s.queued[i] = false;
            let off = self.fit(i, &p.offsets, |j| s.rank[j] < at);
            if off == p.offsets[i] {
                continue;
            }
            s.undo.push((i, p.offsets[i]));
            p.offsets[i] = off;
            if off.saturating_add(self.sizes[i]) > p.size {
                grew = true;
                break;
            }
            for &j in self.conflicts.of(i) {
                if s.rank[j as usize] > at {
                    s.mark(j as usize);
                }
            }
        }
        if !grew {
            return !s.undo.is_empty();
        }
        while let Some(Reverse(at)) = s.dirty.pop() {
            s.queued[p.order[at as usize] as usize] = false;
        }
        for &(i, off) in s.undo.iter().rev() {
            p.offsets[i] = off;
        }
        s.rotate(&mut p.order, to..=from, false);
        false
    }
}

/// What [`Placer::search`] keeps between moves: each buffer's position in the order,
/// the buffers to place again (by position) and the offsets a move changed.
struct MoveState {
    rank: Vec<u32>,
    dirty: BinaryHeap<Reverse<u32>>,
    queued: Vec<bool>,
    undo: Vec<(usize, u64)>,
}

impl MoveState {
    fn new(order: &[u32]) -> Self {
        let mut rank = vec![0u32; order.len()];
        for (k, &i) in order.iter().enumerate() {
            rank[i as usize] = k as u32;
        }
        MoveState {
            rank,
            dirty: BinaryHeap::new(),
            queued: vec![false; order.len()],
            undo: Vec::new(),
        }
    }

    /// Queues buffer `i` to be placed again, once.
    fn mark(&mut self, i: usize) {
        if !self.queued[i] {
            self.queued[i] = true;
            self.dirty.push(Reverse(self.rank[i]));
        }
    }

    /// Rotates `order[range]` by one, right (the last to the front) or left.
    fn rotate(&mut self, order: &mut [u32], range: RangeInclusive<usize>, right: bool) {
        let part = &mut order[range.clone()];
        if right {
            part.rotate_right(1);
        } else {
            part.rotate_left(1);
        }
        for k in range {
            self.rank[order[k] as usize] = k as u32;
        }
    }
}

/// The lowest offset, a multiple of `align`, for a buffer of `size` bytes clear of
/// `taken` (offset, end) ranges sorted by offset, which may overlap each other.
fn lowest_fit(taken: &[(u64, u64)], size: u64, align: u64) -> u64 {
    let mut free = 0u64; // the lowest aligned offset past every range seen so far
    for &(start, end) in taken {
        if start >= free && start - free >= size {
            return free;
        }
        free = free.max(align_up(end, align));
    }
    free
}

/// Buffer indices by `key` descending, ties by index.
fn order_by(n: usize, key: impl Fn(usize) -> u64) -> Vec<u32> {
    let mut keyed: Vec<(Reverse<u64>, u32)> = (0..n).map(|i| (Reverse(key(i)), i as u32)).collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, i)| i).collect()
}

fn check_align(align: u64) {
    assert!(
        align.is_power_of_two(),
        "alignment {align} is not a power of two"
    );
}

/// `x` rounded up to `align` (a power of two); `u64::MAX` (unaligned, so the plan fails
/// `verify`) when that would overflow.
fn align_up(x: u64, align: u64) -> u64 {
    x.checked_add(align - 1)
        .map_or(u64::MAX, |v| v & !(align - 1))
}

/// Kahn's order of the nodes; nodes on a cycle are left out.
fn topological_order(nodes: usize, children: &Csr) -> Vec<u32> {
    let mut indegree = vec![0u32; nodes];
    for &c in &children.items {
        indegree[c as usize] += 1;
    }
    let mut order: Vec<u32> = (0..nodes as u32)
        .filter(|&v| indegree[v as usize] == 0)
        .collect();
    let mut next = 0;
    while next < order.len() {
        let v = order[next] as usize;
        next += 1;
        for &c in children.of(v) {
            indegree[c as usize] -= 1;
            if indegree[c as usize] == 0 {
                order.push(c);
            }
        }
    }
    order
}

/// Lists of u32 per index, packed (compressed sparse rows).
#[derive(Debug, Clone)]
struct Csr {
    start: Vec<usize>,
    items: Vec<u32>,
}

impl Csr {
    /// Panics if a pair's index is `>= n`.
    fn from_pairs(n: usize, pairs: impl Iterator<Item = (usize, u32)> + Clone) -> Csr {
        let mut start = vec![0usize; n + 1];
        for (i, _) in pairs.clone() {
            start[i + 1] += 1;
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut items = vec![0u32; start[n]];
        for (i, x) in pairs {
            items[fill[i]] = x;
            fill[i] += 1;
        }
        Csr { start, items }
    }

    /// The set columns of each row of `m` that are also set in `keep`; empty rows
    /// where `keep` is clear.
    fn from_bits(m: &BitMatrix, keep: &[u64]) -> Csr {
        let mut lists = Csr {
            start: Vec::with_capacity(m.rows + 1),
            items: Vec::new(),
        };
        lists.start.push(0);
        for r in 0..m.rows {
            if keep[r / 64] >> (r % 64) & 1 == 1 {
                for (w, (&x, &k)) in m.row(r).iter().zip(keep).enumerate() {
                    let mut bits = x & k;
                    while bits != 0 {
                        lists.items.push((w * 64) as u32 + bits.trailing_zeros());
                        bits &= bits - 1;
                    }
                }
            }
            lists.start.push(lists.items.len());
        }
        lists
    }

    fn of(&self, i: usize) -> &[u32] {
        &self.items[self.start[i]..self.start[i + 1]]
    }
}

/// A bit matrix, one row of `words` u64 per row; bits at columns `>= cols` are zero.
#[derive(Debug, Clone)]
struct BitMatrix {
    rows: usize,
    cols: usize,
    words: usize,
    data: Vec<u64>,
}

impl BitMatrix {
    fn zeros(rows: usize, cols: usize) -> Self {
        let words = cols.div_ceil(64);
        BitMatrix {
            rows,
            cols,
            words,
            data: vec![0; rows * words],
        }
    }

    fn ones(rows: usize, cols: usize) -> Self {
        let mut m = BitMatrix::zeros(rows, cols);
        m.data.fill(!0);
        for r in 0..rows {
            m.clear_tail(r);
        }
        m
    }

    fn row(&self, r: usize) -> &[u64] {
        &self.data[r * self.words..(r + 1) * self.words]
    }

    fn row_mut(&mut self, r: usize) -> &mut [u64] {
        &mut self.data[r * self.words..(r + 1) * self.words]
    }

    fn get(&self, r: usize, c: usize) -> bool {
        self.row(r)[c / 64] >> (c % 64) & 1 == 1
    }

    fn set(&mut self, r: usize, c: usize) {
        self.row_mut(r)[c / 64] |= 1 << (c % 64);
    }

    fn clear(&mut self, r: usize, c: usize) {
        self.row_mut(r)[c / 64] &= !(1 << (c % 64));
    }

    /// Zeroes the bits of row `r` past `cols`.
    fn clear_tail(&mut self, r: usize) {
        if !self.cols.is_multiple_of(64) {
            let last = self.words - 1;
            self.row_mut(r)[last] &= (1 << (self.cols % 64)) - 1;
        }
    }

    /// Row `dst` |= row `src` (distinct rows).
    fn or_row(&mut self, dst: usize, src: usize) {
        let w = self.words;
        let (d, s) = if dst < src {
            let (lo, hi) = self.data.split_at_mut(src * w);
            (&mut lo[dst * w..(dst + 1) * w], &hi[..w])
        } else {
            let (lo, hi) = self.data.split_at_mut(dst * w);
            (&mut hi[..w], &lo[src * w..(src + 1) * w])
        };
        for (x, y) in d.iter_mut().zip(s) {
            *x |= y;
        }
    }

    /// Row `dst` &= row `src` of `other` (same column count).
    fn and_row(&mut self, dst: usize, other: &BitMatrix, src: usize) {
        for (x, y) in self.row_mut(dst).iter_mut().zip(other.row(src)) {
            *x &= y;
        }
    }

    /// The transpose, 64×64 blocks at a time.
    fn transpose(&self) -> BitMatrix {
        let mut t = BitMatrix::zeros(self.cols, self.rows);
        let mut block = [0u64; 64];
        for br in 0..t.words {
            for bc in 0..self.words {
                for (k, x) in block.iter_mut().enumerate() {
                    let r = br * 64 + k;
                    *x = if r < self.rows { self.row(r)[bc] } else { 0 };
                }
                transpose64(&mut block);
                for (k, &x) in block.iter().enumerate() {
                    let r = bc * 64 + k;
                    if r < t.rows {
                        t.row_mut(r)[br] = x;
                    }
                }
            }
        }
        t
    }
}

/// Transposes a 64×64 bit block in place (row k is `a[k]`, column c is bit c):
/// swaps the off-diagonal halves, then quarters, down to single bits.
fn transpose64(a: &mut [u64; 64]) {
    let mut j = 32;
    let mut m: u64 = 0x0000_0000_FFFF_FFFF;
    while j != 0 {
        let mut k = 0;
        while k < 64 {
            let t = ((a[k] >> j) ^ a[k + j]) & m;
            a[k] ^= t << j;
            a[k + j] ^= t;
            k = (k + j + 1) & !j;
        }
        j >>= 1;
        m ^= m << j;
    }
}

/// The indices of the set bits of `words`, ascending.
fn ones(words: &[u64]) -> impl Iterator<Item = usize> + Clone + '_ {
    words.iter().enumerate().flat_map(|(w, &bits)| {
        let mut left = bits;
        std::iter::from_fn(move || {
            (left != 0).then(|| {
                let bit = left.trailing_zeros() as usize;
                left &= left - 1;
                w * 64 + bit
            })
        })
    })
}

/// A random graph shaped like an inference or training graph, for tests and
/// benchmarks: a trunk of operations with in-place operations, residual blocks,
/// parallel branches joined again and long skip connections.
#[derive(Debug, Clone)]
pub struct RandomCase {
    pub nodes: usize,
    /// Data and write-after-read dependencies (from, to).
    pub edges: Vec<(u32, u32)>,
    /// A topological order of the nodes; node labels are shuffled, so it is not `0..nodes`.
    pub order: Vec<u32>,
    /// For each buffer the nodes that use it, its producer first.
    pub uses: Vec<Vec<u32>>,
    pub sizes: Vec<u64>,
}

impl RandomCase {
    /// Each buffer's interval in `order`: position of its first use ..= of its last.
    pub fn intervals(&self) -> Vec<(u32, u32)> {
        let mut position = vec![0u32; self.nodes];
        for (k, &v) in self.order.iter().enumerate() {
            position[v as usize] = k as u32;
        }
        self.uses
            .iter()
            .map(|us| {
                let steps = us.iter().map(|&u| position[u as usize]);
                (steps.clone().min().unwrap_or(0), steps.max().unwrap_or(0))
            })
            .collect()
    }
}

/// A random case with exactly `buffers` buffers, deterministic in `seed`.
///
/// Every node produces at most one buffer, which 1–4 later nodes read (mostly the
/// next ones, sometimes far later: skip connections); about a quarter of the
/// operations write in place instead, so there are about 1.3 nodes per buffer. Sizes
/// run from 256 B to 64 MiB, log-uniform, mostly repeating the current stage's size
/// or a few common ones.
pub fn random_case(seed: u64, buffers: usize) -> RandomCase {
    let mut g = CaseBuilder {
        rng: SplitMix(seed),
        budget: buffers,
        nodes: 0,
        edges: Vec::new(),
        uses: Vec::new(),
        sizes: Vec::new(),
        writer: Vec::new(),
        readers: Vec::new(),
        keep: Vec::new(),
        palette: Vec::new(),
        stage: 0,
    };
    g.palette = (0..12).map(|_| log_uniform(&mut g.rng)).collect();
    g.stage = g.palette[0];
    if buffers > 0 {
        g.blocks();
    }
    g.finish()
}

const MIN_CASE_SIZE: u64 = 256;
const MAX_CASE_SIZE: u64 = 64 << 20;

/// 256 B … 64 MiB, log-uniform, from integers only (the same on every platform).
fn log_uniform(rng: &mut SplitMix) -> u64 {
    (MIN_CASE_SIZE + rng.below(MIN_CASE_SIZE)) << rng.below(18)
}

/// Builds a [`RandomCase`] in schedule order (node t is the t-th node run).
struct CaseBuilder {
    rng: SplitMix,
    budget: usize,
    nodes: u32,
    edges: Vec<(u32, u32)>,
    uses: Vec<Vec<u32>>,
    sizes: Vec<u64>,
    /// Each buffer's last writer, and its readers since.
    writer: Vec<u32>,
    readers: Vec<Vec<u32>>,
    /// Buffers that will be read again later, so no operation overwrites them in place.
    keep: Vec<bool>,
    palette: Vec<u64>,
    stage: u64,
}

impl CaseBuilder {
    fn blocks(&mut self) {
        let mut trunk = self.op(&[]);
        let mut skips: Vec<usize> = Vec::new();
        while self.sizes.len() < self.budget {
            match self.rng.below(100) {
                0..=54 => trunk = self.op(&[trunk]),
                // Residual block: a short chain, then its output added to its input.
                55..=69 => {
                    self.keep[trunk] = true;
                    let mut x = trunk;
                    for _ in 0..2 + self.rng.below(4) {
                        x = self.op(&[x]);
                    }
                    self.keep[trunk] = false;
                    trunk = self.op(&[x, trunk]);
                }
                // Parallel branches of 1–3 operations each, joined.
                70..=81 => {
                    self.keep[trunk] = true;
                    let mut outs = Vec::new();
                    for _ in 0..2 + self.rng.below(3) {
                        let mut x = trunk;
                        for _ in 0..1 + self.rng.below(3) {
                            x = self.op(&[x]);
                        }
                        outs.push(x);
                    }
                    self.keep[trunk] = false;
                    trunk = self.op(&outs);
                }
                // Long skip: keep this buffer for an operation much later (U-Net,
                // activations kept for a backward pass).
                82..=89 if skips.len() < 6 => {
                    self.keep[trunk] = true;
                    skips.push(trunk);
                    trunk = self.op(&[trunk]);
                }
                90..=95 if !skips.is_empty() => {
                    let s = skips.pop().expect("not empty");
                    self.keep[s] = false;
                    trunk = self.op(&[trunk, s]);
                }
                _ => {
                    self.stage = self.palette[self.rng.below(self.palette.len() as u64) as usize];
                    trunk = self.op(&[trunk]);
                }
            }
        }
        // The graph's output: read by a last node that writes outside the arena.
        let t = self.nodes;
        self.nodes += 1;
        self.read(t, trunk);
    }

    /// A node reading `inputs` and producing a new buffer, or writing in place over
    /// `inputs[0]` (by chance, or once every buffer is made). Returns its output.
    fn op(&mut self, inputs: &[usize]) -> usize {
        let t = self.nodes;
        self.nodes += 1;
        for &b in inputs {
            self.read(t, b);
        }
        let first = inputs.first().copied();
        let in_place = first.is_some_and(|x| !self.keep[x] && self.rng.below(100) < 25);
        match first {
            Some(x) if in_place || self.sizes.len() == self.budget => {
                self.overwrite(t, x);
                x
            }
            _ => self.produce(t),
        }
    }

    fn read(&mut self, t: u32, b: usize) {
        if self.writer[b] != t {
            self.edges.push((self.writer[b], t));
        }
        if self.uses[b].last() != Some(&t) {
            self.uses[b].push(t);
        }
        self.readers[b].push(t);
    }

    /// Node `t` writes `b` in place: after its last writer and all its readers since.
    fn overwrite(&mut self, t: u32, b: usize) {
        for r in self.readers[b].drain(..).filter(|&r| r != t) {
            self.edges.push((r, t));
        }
        if self.writer[b] != t {
            self.edges.push((self.writer[b], t));
        }
        if self.uses[b].last() != Some(&t) {
            self.uses[b].push(t);
        }
        self.writer[b] = t;
    }

    fn produce(&mut self, t: u32) -> usize {
        let size = match self.rng.below(100) {
            0..=54 => self.stage,
            55..=64 if self.rng.below(2) == 0 => self.stage * 2,
            55..=64 => self.stage / 2,
            65..=84 => self.palette[self.rng.below(self.palette.len() as u64) as usize],
            _ => log_uniform(&mut self.rng),
        };
        self.sizes.push(size.clamp(MIN_CASE_SIZE, MAX_CASE_SIZE));
        self.uses.push(vec![t]);
        self.writer.push(t);
        self.readers.push(Vec::new());
        self.keep.push(false);
        self.sizes.len() - 1
    }

    /// Shuffles the node labels, so that callers cannot rely on index order.
    fn finish(mut self) -> RandomCase {
        let n = self.nodes as usize;
        let mut label: Vec<u32> = (0..self.nodes).collect();
        for i in (1..n).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            label.swap(i, j);
        }
        let mut edges: Vec<(u32, u32)> = self
            .edges
            .iter()
            .map(|&(f, t)| (label[f as usize], label[t as usize]))
            .collect();
        edges.sort_unstable();
        edges.dedup();
        let uses = self
            .uses
            .iter()
            .map(|us| us.iter().map(|&u| label[u as usize]).collect())
            .collect();
        RandomCase {
            nodes: n,
            edges,
            order: label,
            uses,
            sizes: self.sizes,
        }
    }
}

/// splitmix64: a small, good-enough generator for test and benchmark cases.
#[derive(Debug, Clone)]
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when n is 0).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Strict reachability by depth-first search, for checking `from_dag`.
    fn reaches(nodes: usize, edges: &[(u32, u32)]) -> Vec<Vec<bool>> {
        let mut reach = vec![vec![false; nodes]; nodes];
        for (start, row) in reach.iter_mut().enumerate() {
            let mut stack = vec![start];
            while let Some(v) = stack.pop() {
                for &(f, t) in edges {
                    if f as usize == v && !row[t as usize] {
                        row[t as usize] = true;
                        stack.push(t as usize);
                    }
                }
            }
        }
        reach
    }

    fn check_all_plans(sizes: &[u64], align: u64, c: &Conflicts) -> (ArenaPlan, ArenaPlan) {
        let p = plan(sizes, align, c);
        let g = plan_greedy_by_size(sizes, align, c);
        let naive = plan_naive(sizes, align);
        for q in [&p, &g, &naive] {
            if let Err(e) = verify(sizes, align, c, q) {
                panic!("{}: {e}", q.strategy);
            }
        }
        assert!(p.size <= g.size, "plan {} above greedy {}", p.size, g.size);
        (p, g)
    }

    fn interval_case() -> impl Strategy<Value = (Vec<u64>, Vec<(u32, u32)>, u64)> {
        let buffer = (
            prop_oneof![Just(0u64), 1u64..5_000, 1u64..(1 << 26)],
            0u32..64,
            0u32..16,
        );
        (
            prop::collection::vec(buffer, 0..48),
            prop::sample::select(vec![1u64, 8, 256, 4096]),
        )
            .prop_map(|(bufs, align)| {
                let sizes = bufs.iter().map(|b| b.0).collect();
                let intervals = bufs.iter().map(|b| (b.1, b.1 + b.2)).collect();
                (sizes, intervals, align)
            })
    }

    /// A small DAG with shuffled labels, any uses and sizes.
    fn dag_case() -> impl Strategy<Value = RandomCase> {
        (1usize..24)
            .prop_flat_map(|nodes| {
                let labels = Just((0..nodes as u32).collect::<Vec<u32>>()).prop_shuffle();
                let pairs = prop::collection::vec((0..nodes, 0..nodes), 0..3 * nodes);
                let uses =
                    prop::collection::vec(prop::collection::vec(0..nodes as u32, 1..4), 0..20);
                let sizes = prop::collection::vec(prop_oneof![Just(0u64), 1u64..100_000], 20);
                (Just(nodes), labels, pairs, uses, sizes)
            })
            .prop_map(|(nodes, labels, pairs, uses, sizes)| {
                // Edges only go forward in a hidden order, so the graph is acyclic.
                let edges = pairs
                    .into_iter()
                    .filter(|(a, b)| a < b)
                    .map(|(a, b)| (labels[a], labels[b]))
                    .collect();
                let sizes = sizes[..uses.len()].to_vec();
                RandomCase {
                    nodes,
                    edges,
                    order: labels,
                    uses,
                    sizes,
                }
            })
    }

    proptest! {
        #[test]
        fn plans_are_valid_on_intervals((sizes, intervals, align) in interval_case()) {
            let c = Conflicts::from_intervals(&intervals);
            let (p, _) = check_all_plans(&sizes, align, &c);
            prop_assert!(p.size >= peak_live_intervals(&sizes, &intervals));
            for (i, &s) in sizes.iter().enumerate() {
                if s == 0 {
                    prop_assert_eq!(p.offsets[i], 0);
                }
            }
        }

        #[test]
        fn from_dag_matches_reachability(case in dag_case()) {
            let RandomCase { nodes, edges, uses, sizes, .. } = &case;
            let c = Conflicts::from_dag(*nodes, edges, uses);
            let reach = reaches(*nodes, edges);
            let before = |a: &[u32], b: &[u32]| {
                a.iter().all(|&u| b.iter().all(|&v| reach[u as usize][v as usize]))
            };
            for a in 0..uses.len() {
                for b in 0..uses.len() {
                    let apart = a == b || before(&uses[a], &uses[b]) || before(&uses[b], &uses[a]);
                    prop_assert_eq!(c.conflict(a, b), !apart, "buffers {} {}", a, b);
                }
            }
            let (p, _) = check_all_plans(sizes, 256, &c);
            prop_assert!(p.size >= heaviest_clique(sizes, &c));
            // The hidden order is one schedule of the DAG: a plan for any schedule
            // holds for it.
            let seq = Conflicts::from_intervals(&case.intervals());
            prop_assert_eq!(verify(sizes, 256, &seq, &p), Ok(()));
        }

        #[test]
        fn transpose_matches_bits(rows in 0usize..150, cols in 0usize..150, seed: u64) {
            let mut rng = SplitMix(seed);
            let mut m = BitMatrix::zeros(rows, cols);
            for r in 0..rows {
                for c in 0..cols {
                    if rng.below(3) == 0 {
                        m.set(r, c);
                    }
                }
            }
            let t = m.transpose();
            for r in 0..rows {
                for c in 0..cols {
                    prop_assert_eq!(m.get(r, c), t.get(c, r));
                }
            }
        }
    }

    #[test]
    fn random_cases_are_graphs() {
        for seed in 0..6 {
            let c = random_case(seed, 400);
            assert_eq!((c.sizes.len(), c.uses.len()), (400, 400));
            assert!((400..=800).contains(&c.nodes), "{} nodes", c.nodes);
            let mut position = vec![usize::MAX; c.nodes];
            for (k, &v) in c.order.iter().enumerate() {
                position[v as usize] = k;
            }
            assert!(
                position.iter().all(|&k| k != usize::MAX),
                "order is a permutation"
            );
            assert!(c
                .edges
                .iter()
                .all(|&(f, t)| position[f as usize] < position[t as usize]));
            assert!(c.uses.iter().all(|u| !u.is_empty()));
            assert!(c
                .sizes
                .iter()
                .all(|&s| (MIN_CASE_SIZE..=MAX_CASE_SIZE).contains(&s)));
            assert!(
                c.order != (0..c.nodes as u32).collect::<Vec<_>>(),
                "labels are shuffled"
            );
            // A sequential schedule is one of the DAG's: its conflicts are a subset.
            let seq = Conflicts::from_intervals(&c.intervals());
            let dag = Conflicts::from_dag(c.nodes, &c.edges, &c.uses);
            for a in 0..400 {
                for b in seq.neighbours(a) {
                    assert!(dag.conflict(a, b), "{a} and {b} overlap in the order only");
                }
            }
        }
    }

    #[test]
    fn plans_are_valid_on_random_cases() {
        for seed in 0..4 {
            let c = random_case(seed, 1000);
            let intervals = c.intervals();
            let seq = Conflicts::from_intervals(&intervals);
            let (p, _) = check_all_plans(&c.sizes, 256, &seq);
            assert!(p.size >= peak_live_intervals(&c.sizes, &intervals));
            let dag = Conflicts::from_dag(c.nodes, &c.edges, &c.uses);
            let (d, _) = check_all_plans(&c.sizes, 256, &dag);
            assert!(d.size >= heaviest_clique(&c.sizes, &dag));
            assert_eq!(plan(&c.sizes, 256, &dag), d, "deterministic");
        }
    }

    #[test]
    fn verify_rejects_bad_plans() {
        let sizes = [1024, 1024, 512];
        let c = Conflicts::from_intervals(&[(0, 2), (1, 3), (4, 5)]);
        let good = ArenaPlan {
            offsets: vec![0, 1024, 0],
            size: 2048,
            strategy: "hand-made",
        };
        assert_eq!(verify(&sizes, 256, &c, &good), Ok(()));
        let overlap = ArenaPlan {
            offsets: vec![0, 512, 0],
            ..good.clone()
        };
        let err = verify(&sizes, 256, &c, &overlap).expect_err("0 and 1 overlap");
        assert!(err.contains("buffers 0") && err.contains("and 1"), "{err}");
        let misaligned = ArenaPlan {
            offsets: vec![0, 1100, 0],
            size: 4096,
            ..good.clone()
        };
        assert!(verify(&sizes, 256, &c, &misaligned).is_err());
        let short = ArenaPlan {
            size: 2000,
            ..good.clone()
        };
        assert!(verify(&sizes, 256, &c, &short).is_err());
        let missing = ArenaPlan {
            offsets: vec![0, 1024],
            ..good
        };
        assert!(verify(&sizes, 256, &c, &missing).is_err());
    }

    #[test]
    fn no_buffers() {
        for c in [
            Conflicts::from_intervals(&[]),
            Conflicts::from_dag(0, &[], &[]),
        ] {
            assert!(c.is_empty());
            for p in [
                plan(&[], 64, &c),
                plan_greedy_by_size(&[], 64, &c),
                plan_naive(&[], 64),
            ] {
                assert_eq!((p.offsets.len(), p.size), (0, 0));
                assert_eq!(verify(&[], 64, &c, &p), Ok(()));
            }
        }
        assert_eq!(peak_live_intervals(&[], &[]), 0);
        assert_eq!(random_case(7, 0).nodes, 0);
    }

    #[test]
    fn zero_sized_buffers_take_no_room() {
        let sizes = [0, 100, 0, 50];
        let c = Conflicts::from_intervals(&[(0, 3); 4]);
        let (p, _) = check_all_plans(&sizes, 16, &c);
        assert_eq!((p.offsets[0], p.offsets[2]), (0, 0));
        assert_eq!(p.size, 112 + 50);
        assert_eq!(plan_naive(&sizes, 16).size, 112 + 50);
        // A buffer nobody uses conflicts with nothing.
        let d = Conflicts::from_dag(2, &[(0, 1)], &[vec![0], vec![], vec![0, 1]]);
        assert!(!d.conflict(1, 0) && !d.conflict(1, 2) && d.conflict(0, 2));
    }

    #[test]
    fn huge_buffers_do_not_overflow() {
        let half = u64::MAX / 2;
        let c = Conflicts::from_intervals(&[(0, 1), (1, 2), (2, 3)]);
        for align in [1, 4096] {
            // Two halves fit side by side; with a third on top the arena passes u64::MAX.
            let fits = [half, half - 5000];
            let c2 = Conflicts::from_intervals(&[(0, 1), (1, 2)]);
            let (p, _) = check_all_plans(&fits, align, &c2);
            assert!(p.size > half);
            let sizes = [half, half, half];
            let all = Conflicts::from_intervals(&[(0, 3); 3]);
            for q in [
                plan(&sizes, align, &all),
                plan_greedy_by_size(&sizes, align, &all),
                plan_naive(&sizes, align),
            ] {
                assert_eq!(q.size, u64::MAX);
                assert!(verify(&sizes, align, &all, &q).is_err());
            }
            // Sharing makes them fit where one after another cannot.
            let p = plan(&sizes, align, &c);
            assert_eq!(verify(&sizes, align, &c, &p), Ok(()));
            assert_eq!(p.offsets[0], p.offsets[2], "0 and 2 share bytes");
            assert!(verify(&sizes, align, &c, &plan_naive(&sizes, align)).is_err());
        }
        assert_eq!(
            peak_live_intervals(&[half, half, half], &[(0, 3); 3]),
            u64::MAX
        );
        assert_eq!(
            peak_live_intervals(&[half, half], &[(0, u32::MAX); 2]),
            2 * half
        );
    }

    #[test]
    fn offsets_follow_alignment() {
        let c = random_case(11, 200);
        let conflicts = Conflicts::from_intervals(&c.intervals());
        for align in [1, 4096] {
            let (p, g) = check_all_plans(&c.sizes, align, &conflicts);
            assert!(p.offsets.iter().chain(&g.offsets).all(|&o| o % align == 0));
        }
    }
}
