//! Greedy placement in a given order, and the local search over orders.

use super::dag::{BitMatrix, Csr};
use super::random::SplitMix;
use super::{ArenaPlan, Conflicts};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::RangeInclusive;

/// A plan with the order that produced it.
#[derive(Debug, Clone)]
pub(super) struct Placement {
    pub(super) strategy: &'static str,
    pub(super) order: Vec<u32>,
    pub(super) offsets: Vec<u64>,
    pub(super) size: u64,
}

impl Placement {
    pub(super) fn into_plan(self) -> ArenaPlan {
        ArenaPlan {
            offsets: self.offsets,
            size: self.size,
            strategy: self.strategy,
        }
    }

    pub(super) fn end(&self, sizes: &[u64], i: usize) -> u64 {
        self.offsets[i].saturating_add(sizes[i])
    }
}

/// Marks a buffer not placed yet.
pub(super) const UNPLACED: u64 = u64::MAX;

/// The most work one [`Placer::search`] may do, in placements of every buffer.
pub(super) const SEARCH_PLACEMENTS: usize = 4;

/// Places buffers greedily in a given order; holds the conflict lists of the non-empty
/// buffers and scratch space reused across placements.
pub(super) struct Placer<'a> {
    pub(super) sizes: &'a [u64],
    pub(super) align: u64,
    pub(super) conflicts: Csr,
    /// The conflicting neighbours placed before the buffer being placed: (offset, end).
    pub(super) taken: Vec<(u64, u64)>,
    /// Work done, all placements together: one per buffer placed plus one per
    /// conflict it checks, and the search's bookkeeping.
    pub(super) work: usize,
}

impl<'a> Placer<'a> {
    pub(super) fn new(sizes: &'a [u64], align: u64, conflicts: &Conflicts) -> Self {
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
    pub(super) fn breadth(&self) -> Vec<u64> {
        (0..self.sizes.len())
            .map(|i| {
                self.conflicts.of(i).iter().fold(self.sizes[i], |w, &j| {
                    w.saturating_add(self.sizes[j as usize])
                })
            })
            .collect()
    }

    /// Places every buffer in `order`.
    pub(super) fn place(&mut self, strategy: &'static str, order: Vec<u32>) -> Placement {
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
    pub(super) fn fit(&mut self, i: usize, offsets: &[u64], before: impl Fn(usize) -> bool) -> u64 {
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
    pub(super) fn search(
        &mut self,
        start: Placement,
        floor: u64,
        searched: &'static str,
    ) -> Placement {
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
    pub(super) fn near_top(&self, p: &Placement) -> Vec<usize> {
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
    pub(super) fn try_move(
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
pub(super) struct MoveState {
    pub(super) rank: Vec<u32>,
    pub(super) dirty: BinaryHeap<Reverse<u32>>,
    pub(super) queued: Vec<bool>,
    pub(super) undo: Vec<(usize, u64)>,
}

impl MoveState {
    pub(super) fn new(order: &[u32]) -> Self {
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
    pub(super) fn mark(&mut self, i: usize) {
        if !self.queued[i] {
            self.queued[i] = true;
            self.dirty.push(Reverse(self.rank[i]));
        }
    }

    /// Rotates `order[range]` by one, right (the last to the front) or left.
    pub(super) fn rotate(&mut self, order: &mut [u32], range: RangeInclusive<usize>, right: bool) {
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
pub(super) fn lowest_fit(taken: &[(u64, u64)], size: u64, align: u64) -> u64 {
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
pub(super) fn order_by(n: usize, key: impl Fn(usize) -> u64) -> Vec<u32> {
    let mut keyed: Vec<(Reverse<u64>, u32)> = (0..n).map(|i| (Reverse(key(i)), i as u32)).collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, i)| i).collect()
}

pub(super) fn check_align(align: u64) {
    assert!(
        align.is_power_of_two(),
        "alignment {align} is not a power of two"
    );
}

/// `x` rounded up to `align` (a power of two); `u64::MAX` (unaligned, so the plan fails
/// `verify`) when that would overflow.
pub(super) fn align_up(x: u64, align: u64) -> u64 {
    x.checked_add(align - 1)
        .map_or(u64::MAX, |v| v & !(align - 1))
}
