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
/// indices, stored as one bit row per buffer (n² bits). A buffer never conflicts with
/// itself.
#[derive(Debug, Clone)]
pub struct Conflicts {
    bits: BitMatrix,
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
        Conflicts { bits }
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
        Conflicts { bits }
    }

    /// Whether buffers `a` and `b` may be live at the same time. Panics if either is
    /// `>= len()`.
    pub fn conflict(&self, a: usize, b: usize) -> bool {
        assert!(b < self.len(), "buffer {b} out of {}", self.len());
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
/// buffers never overlap. Runs several greedy heuristics — greedy-by-size itself,
/// best-fit by size, and orders by conflict breadth — then improves the best order by
/// moving the buffers that set the arena's top earlier; keeps the smallest plan, so the
/// result is never above [`plan_greedy_by_size`].
///
/// Cost: O(n²/64 + n·d·log d) per heuristic for n buffers of at most d conflicts each,
/// a bounded number of heuristics.
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
/// assert_eq!(p.size, 3072 + 2048);
/// ```
pub fn plan(sizes: &[u64], align: u64, conflicts: &Conflicts) -> ArenaPlan {
    let mut placer = Placer::new(sizes, align, conflicts);
    let by_size = order_by(sizes.len(), |i| sizes[i]);
    let mut best = placer.run("greedy-by-size", &by_size, Fit::Lowest);
    let breadth = placer.breadth();
    let by_breadth = order_by(sizes.len(), |i| breadth[i]);
    let tries: [(&'static str, &[u32], Fit); 3] = [
        ("best-fit-by-size", &by_size, Fit::Tightest),
        ("greedy-by-breadth", &by_breadth, Fit::Lowest),
        ("best-fit-by-breadth", &by_breadth, Fit::Tightest),
    ];
    let mut start = (by_size.clone(), Fit::Lowest);
    for (name, order, fit) in tries {
        let p = placer.run(name, order, fit);
        if p.size < best.size {
            best = p;
            start = (order.to_vec(), fit);
        }
    }
    let passes: usize = std::env::var("PASSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    placer.promote_tops(best, start.0, start.1, passes)
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
    Placer::new(sizes, align, conflicts).run("greedy-by-size", &order, Fit::Lowest)
}

/// The exact lower bound for interval conflicts: the most bytes live at one step.
pub fn peak_live_intervals(sizes: &[u64], intervals: &[(u32, u32)]) -> u64 {
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

/// How a buffer picks among the gaps that fit it.
#[derive(Debug, Clone, Copy)]
enum Fit {
    /// The lowest offset.
    Lowest,
    /// The smallest gap between placed conflicting buffers; the top if none fits.
    Tightest,
}

/// Places buffers one by one in a given order; holds the conflict lists of the
/// non-empty buffers and scratch space reused across runs.
struct Placer<'a> {
    sizes: &'a [u64],
    align: u64,
    conflicts: Csr,
    /// The placed conflicting neighbours of the buffer being placed: (offset, end).
    taken: Vec<(u64, u64)>,
}

impl<'a> Placer<'a> {
    fn new(sizes: &'a [u64], align: u64, conflicts: &Conflicts) -> Self {
        check_align(align);
        assert_eq!(sizes.len(), conflicts.len(), "one size per buffer");
        let pairs = (0..sizes.len()).filter(|&a| sizes[a] > 0).flat_map(|a| {
            conflicts
                .neighbours(a)
                .filter(|&b| sizes[b] > 0)
                .map(move |b| (a, b as u32))
        });
        Placer {
            sizes,
            align,
            conflicts: Csr::from_pairs(sizes.len(), pairs),
            taken: Vec::new(),
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

    /// Moves the buffer that sets the arena's top to the front of `order` and places
    /// again, `passes` times, walking on from each result; keeps the smallest plan.
    fn promote_tops(
        &mut self,
        mut best: ArenaPlan,
        mut order: Vec<u32>,
        fit: Fit,
        passes: usize,
    ) -> ArenaPlan {
        let mut current = best.clone();
        for _ in 0..passes {
            let top = (0..self.sizes.len())
                .max_by_key(|&i| (current.offsets[i].saturating_add(self.sizes[i]), Reverse(i)));
            let Some(top) = top else { break };
            let Some(pos) = order.iter().position(|&i| i as usize == top) else {
                break;
            };
            if pos == 0 {
                break;
            }
            order[..=pos].rotate_right(1);
            current = self.run("promoted-tops", &order, fit);
            if current.size < best.size {
                best = current.clone();
            }
        }
        best
    }

    fn run(&mut self, strategy: &'static str, order: &[u32], fit: Fit) -> ArenaPlan {
        const UNPLACED: u64 = u64::MAX;
        let mut offsets = vec![UNPLACED; self.sizes.len()];
        let mut size = 0u64;
        for &i in order {
            let i = i as usize;
            let s = self.sizes[i];
            if s == 0 {
                offsets[i] = 0;
                continue;
            }
            self.taken.clear();
            for &j in self.conflicts.of(i) {
                let off = offsets[j as usize];
                if off != UNPLACED {
                    self.taken
                        .push((off, off.saturating_add(self.sizes[j as usize])));
                }
            }
            self.taken.sort_unstable();
            let off = gap(&self.taken, s, self.align, fit);
            offsets[i] = off;
            size = size.max(off.saturating_add(s));
        }
        ArenaPlan {
            offsets,
            size,
            strategy,
        }
    }
}

/// The offset for a buffer of `size` bytes among `taken` (offset, end) ranges sorted
/// by offset, which may overlap each other.
fn gap(taken: &[(u64, u64)], size: u64, align: u64, fit: Fit) -> u64 {
    let mut free = 0u64; // the lowest aligned offset past every range seen so far
    let mut tightest: Option<(u64, u64)> = None; // (gap length, offset)
    for &(start, end) in taken {
        if start >= free && start - free >= size {
            let len = start - free;
            match fit {
                Fit::Lowest => return free,
                Fit::Tightest if tightest.map_or(true, |(l, _)| len < l) => {
                    tightest = Some((len, free))
                }
                Fit::Tightest => {}
            }
        }
        free = free.max(align_up(end, align));
    }
    tightest.map_or(free, |(_, off)| off)
}

/// Buffer indices by `key` descending, ties by index.
fn order_by(n: usize, key: impl Fn(usize) -> u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by_key(|&i| Reverse(key(i as usize)));
    order
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
        if self.cols % 64 != 0 {
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

    #[test]
    #[ignore]
    fn orders() {
        let names = [
            "size",
            "breadth",
            "size*deg",
            "size*sqrtdeg",
            "deg",
            "size*log2deg",
            "tflite-breadth",
        ];
        let mut worst = vec![0f64; names.len() + 1];
        let mut sum = vec![0f64; names.len() + 1];
        let mut cnt = 0;
        for buffers in [1000, 1500, 2000, 3000] {
            for seed in 0..40 {
                let c = random_case(seed * 7919 + buffers as u64, buffers);
                let iv = c.intervals();
                let ci = Conflicts::from_intervals(&iv);
                let peak = peak_live_intervals(&c.sizes, &iv) as f64;
                let mut pl = Placer::new(&c.sizes, 256, &ci);
                let br = pl.breadth();
                let deg: Vec<u64> = (0..c.sizes.len())
                    .map(|i| pl.conflicts.of(i).len() as u64 + 1)
                    .collect();
                let keys: Vec<Vec<u64>> = vec![
                    c.sizes.clone(),
                    br,
                    (0..c.sizes.len()).map(|i| c.sizes[i] * deg[i]).collect(),
                    (0..c.sizes.len())
                        .map(|i| ((c.sizes[i] as f64) * (deg[i] as f64).sqrt()) as u64)
                        .collect(),
                    (0..c.sizes.len())
                        .map(|i| deg[i] << 32 | c.sizes[i] >> 10)
                        .collect(),
                    (0..c.sizes.len())
                        .map(|i| ((c.sizes[i] as f64) * (1.0 + (deg[i] as f64).log2())) as u64)
                        .collect(),
                ];
                // exact TFLite breadth: each buffer's heaviest step
                let steps = iv.iter().map(|x| x.1).max().unwrap() as usize + 1;
                let mut live = vec![0u64; steps];
                for (i, x) in iv.iter().enumerate() {
                    for t in x.0..=x.1 {
                        live[t as usize] += c.sizes[i];
                    }
                }
                let mut st: Vec<usize> = (0..steps).collect();
                st.sort_by_key(|&t| Reverse(live[t]));
                let mut rank = vec![0usize; steps];
                for (r, &t) in st.iter().enumerate() {
                    rank[t] = r;
                }
                let hb: Vec<u64> = (0..c.sizes.len())
                    .map(|i| {
                        let r = (iv[i].0..=iv[i].1).map(|t| rank[t as usize]).min().unwrap();
                        ((steps - r) as u64) << 40 | c.sizes[i] >> 8
                    })
                    .collect();
                let mut keys = keys;
                keys.push(hb);
                let mut best = f64::MAX;
                for (k, key) in keys.iter().enumerate() {
                    let o = order_by(c.sizes.len(), |i| key[i]);
                    let r = pl.run("x", &o, Fit::Lowest).size as f64 / peak;
                    worst[k] = worst[k].max(r);
                    sum[k] += r;
                    best = best.min(r);
                }
                worst[names.len()] = worst[names.len()].max(best);
                sum[names.len()] += best;
                if best > 1.0 {
                    // long local search from greedy by size
                    let mut rng = SplitMix(seed);
                    let mut order = order_by(c.sizes.len(), |i| c.sizes[i]);
                    let mut bp = pl.run("x", &order, Fit::Lowest);
                    let mut hit = [usize::MAX; 3];
                    for it in 0..3000 {
                        let top = (0..c.sizes.len())
                            .max_by_key(|&i| bp.offsets[i] + c.sizes[i])
                            .unwrap();
                        // choose top-ish buffer: random among those whose end > 0.9*size
                        let cands: Vec<usize> = (0..c.sizes.len())
                            .filter(|&i| {
                                c.sizes[i] > 0 && bp.offsets[i] + c.sizes[i] > bp.size - bp.size / 8
                            })
                            .collect();
                        let t = if rng.below(2) == 0 {
                            top
                        } else {
                            cands[rng.below(cands.len() as u64) as usize]
                        };
                        let pos = order.iter().position(|&i| i as usize == t).unwrap();
                        if pos == 0 {
                            continue;
                        }
                        let to = rng.below(pos as u64) as usize;
                        let mut o2 = order.clone();
                        o2[to..=pos].rotate_right(1);
                        let p2 = pl.run("x", &o2, Fit::Lowest);
                        if p2.size <= bp.size {
                            bp = p2;
                            order = o2;
                        }
                        let r = bp.size as f64 / peak;
                        for (k, th) in [1.05, 1.02, 1.001].iter().enumerate() {
                            if r <= *th && hit[k] == usize::MAX {
                                hit[k] = it;
                            }
                        }
                    }
                    println!("hits {hit:?}");
                    println!(
                        "bad case n={buffers} seed={seed} min-order {best:.4} local-search {:.4}",
                        bp.size as f64 / peak
                    );
                }
                cnt += 1;
            }
        }
        for (k, n) in names.iter().chain(["min"].iter()).enumerate() {
            println!("{n}: mean {:.4} worst {:.4}", sum[k] / cnt as f64, worst[k]);
        }
    }

    #[test]
    #[ignore]
    fn debug12() {
        let c = random_case(12, 1000);
        let iv = c.intervals();
        let ci = Conflicts::from_intervals(&iv);
        let peak = peak_live_intervals(&c.sizes, &iv);
        let p = plan(&c.sizes, 256, &ci);
        println!("peak {peak} plan {}", p.size);
        let mut big: Vec<usize> = (0..c.sizes.len())
            .filter(|&i| c.sizes[i] >= 8 << 20)
            .collect();
        big.sort_by_key(|&i| iv[i]);
        for i in big {
            println!(
                "buf {i} size {} MiB iv {:?} off {:.1} MiB",
                c.sizes[i] as f64 / (1 << 20) as f64,
                iv[i],
                p.offsets[i] as f64 / (1 << 20) as f64
            );
        }
    }

    #[test]
    #[ignore = "prints figures; run with --release -- --ignored --nocapture"]
    fn figures() {
        let mut worst = (0.0f64, 0u64, 0usize);
        let mut wins = std::collections::BTreeMap::new();
        let mut ratios = Vec::new();
        let mut dag = Vec::new();
        let mut tmax = std::time::Duration::ZERO;
        for buffers in [1000, 1500, 2000, 3000] {
            for seed in 0..40 {
                let c = random_case(seed, buffers);
                let iv = c.intervals();
                let ci = Conflicts::from_intervals(&iv);
                let peak = peak_live_intervals(&c.sizes, &iv);
                let t0 = std::time::Instant::now();
                let p = plan(&c.sizes, 256, &ci);
                if buffers == 1000 {
                    tmax = tmax.max(t0.elapsed());
                }
                let r = p.size as f64 / peak as f64;
                ratios.push(r);
                *wins.entry(p.strategy).or_insert(0) += 1;
                if r > worst.0 {
                    worst = (r, seed, buffers);
                }
                if r > 1.001 {
                    println!(
                        "over: n={buffers} seed={seed} r={r:.4} greedy={:.4} {}",
                        plan_greedy_by_size(&c.sizes, 256, &ci).size as f64 / peak as f64,
                        p.strategy
                    );
                }
                if seed < 10 {
                    let cd = Conflicts::from_dag(c.nodes, &c.edges, &c.uses);
                    let pd = plan(&c.sizes, 256, &cd);
                    dag.push((
                        pd.size as f64 / p.size as f64,
                        pd.size as f64 / heaviest_clique(&c.sizes, &cd) as f64,
                    ));
                }
            }
        }
        ratios.sort_by(f64::total_cmp);
        println!(
            "plan/peak median {:.4} p90 {:.4} worst {:?} wins {:?} tmax(1000) {:?}",
            ratios[ratios.len() / 2],
            ratios[ratios.len() * 9 / 10],
            worst,
            wins,
            tmax
        );
        dag.sort_by(|a, b| a.0.total_cmp(&b.0));
        println!(
            "dag/seq {:?}",
            dag.iter()
                .map(|d| format!("{:.3}/{:.3}", d.0, d.1))
                .collect::<Vec<_>>()
        );
    }
}
