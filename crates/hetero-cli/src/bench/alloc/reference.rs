//! The exact reference placement policies the churn replay runs beside hetero
//! and the offset-allocator crate: first-fit, best-fit and two-ended fit on an
//! ideal free list (256-byte granularity), the yardstick for what non-moving
//! placement can reach on a sequence.

/// Where the exact reference model puts a request among the holes that fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Policy {
    /// First fit: the lowest-address hole, at its bottom.
    First,
    /// Best fit: the smallest hole (lowest address on ties), at its bottom.
    Best,
    /// Two-ended fit: requests under [`TWO_ENDED_SPLIT`] first-fit from the
    /// bottom; larger ones take the highest-address hole, at its top end.
    TwoEnded,
}

/// The two-ended policy's small/large threshold (on the requested size).
const TWO_ENDED_SPLIT: u64 = 1 << 20;

/// Granularity of the reference model, the TLSF's alignment in the replay.
const REF_GRAIN: u64 = 256;

/// An exact free-list allocator over `[0, cap)`: a sorted list of coalesced
/// holes, sizes rounded up to [`REF_GRAIN`], O(holes) per operation. The
/// yardstick for what a non-moving placement policy can do on a sequence.
pub(super) struct RefModel {
    policy: Policy,
    /// `(start, len)`, sorted by start, never adjacent (always coalesced).
    pub(super) holes: Vec<(u64, u64)>,
}

impl RefModel {
    pub(super) fn new(policy: Policy, cap: u64) -> Self {
        RefModel {
            policy,
            holes: vec![(0, cap)],
        }
    }

    /// Places `size` bytes by the policy: `(start, len)` with `len` rounded up
    /// to [`REF_GRAIN`], or `None` when no hole fits.
    pub(super) fn alloc(&mut self, size: u64) -> Option<(u64, u64)> {
        let len = size.max(1).div_ceil(REF_GRAIN) * REF_GRAIN;
        let mut fits = self.holes.iter().enumerate().filter(|(_, h)| h.1 >= len);
        let (i, top) = match self.policy {
            Policy::TwoEnded if size >= TWO_ENDED_SPLIT => (fits.next_back()?.0, true),
            Policy::First | Policy::TwoEnded => (fits.next()?.0, false),
            Policy::Best => (fits.min_by_key(|(i, h)| (h.1, *i))?.0, false),
        };
        let (hs, hl) = self.holes[i];
        let start = if top { hs + hl - len } else { hs };
        if hl == len {
            self.holes.remove(i);
        } else if top {
            self.holes[i].1 = hl - len;
        } else {
            self.holes[i] = (hs + len, hl - len);
        }
        Some((start, len))
    }
    /// Frees a range `alloc` gave, coalescing it with the holes beside it.
    pub(super) fn free(&mut self, (start, len): (u64, u64)) {
        let i = self.holes.partition_point(|h| h.0 < start);
        let joins_prev = i > 0 && {
            let p = self.holes[i - 1];
            p.0 + p.1 == start
        };
        let joins_next = i < self.holes.len() && start + len == self.holes[i].0;
        match (joins_prev, joins_next) {
            (true, true) => {
                let next = self.holes.remove(i);
                self.holes[i - 1].1 += len + next.1;
            }
            (true, false) => self.holes[i - 1].1 += len,
            (false, true) => self.holes[i] = (start, len + self.holes[i].1),
            (false, false) => self.holes.insert(i, (start, len)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Panics if two live ranges overlap or one leaves `[0, cap)`.
    fn assert_disjoint(live: &[(u64, u64)], cap: u64) {
        let mut v = live.to_vec();
        v.sort_unstable();
        for w in v.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {w:?}");
        }
        if let Some(&(s, l)) = v.last() {
            assert!(s + l <= cap, "past the end: {s} + {l}");
        }
    }

    /// Lays out, in a 16 KiB region, three holes of 1, 2 and 4 KiB (at
    /// 1, 4 and 9 KiB) plus a 3 KiB tail hole at 13 KiB, live buffers around them.
    fn holed(policy: Policy) -> (RefModel, Vec<(u64, u64)>) {
        const K: u64 = 1024;
        let mut m = RefModel::new(policy, 16 * K);
        let mut live = Vec::new();
        // Fill [0, 13K) with 1K, 1K, 2K, 2K, 1K, 4K, 2K: bottom-up for all
        // policies while the region is one hole and every request is small.
        for s in [1, 1, 2, 2, 1, 4, 2] {
            live.push(m.alloc(s * K).expect("room"));
        }
        assert_eq!(
            live,
            [
                (0, K),
                (K, K),
                (2 * K, 2 * K),
                (4 * K, 2 * K),
                (6 * K, K),
                (7 * K, 4 * K),
                (11 * K, 2 * K)
            ]
        );
        // Free the 1K at 1K, the 2K at 4K, the 4K at 7K: holes 1K@1K,
        // 2K@4K, 4K@7K and the tail 3K@13K.
        for i in [5, 3, 1] {
            m.free(live.remove(i));
        }
        assert_eq!(
            m.holes,
            [(K, K), (4 * K, 2 * K), (7 * K, 4 * K), (13 * K, 3 * K)]
        );
        (m, live)
    }

    #[test]
    fn first_fit_takes_the_lowest_hole() {
        let (mut m, mut live) = holed(Policy::First);
        // 1.5 KiB (rounded to 256) skips the 1K hole, lands at 4K.
        let a = m.alloc(1536 - 100).expect("fits");
        assert_eq!(a, (4096, 1536));
        live.push(a);
        // 2.5 KiB: the lowest hole that fits is the 4K one at 7K.
        let b = m.alloc(2560).expect("fits");
        assert_eq!(b, (7 * 1024, 2560));
        live.push(b);
        assert_disjoint(&live, 16 * 1024);
    }

    #[test]
    fn best_fit_takes_the_smallest_hole() {
        let (mut m, mut live) = holed(Policy::Best);
        // 2.5 KiB: the 3K tail beats the lower 4K hole.
        let a = m.alloc(2560).expect("fits");
        assert_eq!(a, (13 * 1024, 2560));
        live.push(a);
        // 1 KiB: the exact 1K hole, which disappears.
        let b = m.alloc(1024).expect("fits");
        assert_eq!(b, (1024, 1024));
        live.push(b);
        assert!(m.holes.iter().all(|h| h.0 != 1024));
        // Holes now 2K@4K, 4K@7K, 512@15.5K: 2 KiB takes the exact 2K one.
        let c = m.alloc(2048).expect("fits");
        assert_eq!(c, (4096, 2048));
        live.push(c);
        assert_disjoint(&live, 16 * 1024);
    }

    #[test]
    fn best_fit_breaks_ties_low() {
        let mut m = RefModel::new(Policy::Best, 8192);
        let live: Vec<_> = (0..8).map(|_| m.alloc(1024).expect("room")).collect();
        m.free(live[5]);
        m.free(live[2]);
        assert_eq!(m.alloc(1000), Some((2048, 1024)));
        assert_eq!(m.alloc(1000), Some((5120, 1024)));
        assert_eq!(m.alloc(1), None);
    }

    #[test]
    fn two_ended_puts_large_requests_at_the_top() {
        const M: u64 = 1 << 20;
        let mut m = RefModel::new(Policy::TwoEnded, 8 * M);
        let mut live = Vec::new();
        // Large: the top of the only hole.
        let big = m.alloc(2 * M).expect("fits");
        assert_eq!(big, (6 * M, 2 * M));
        live.push(big);
        // Small: the bottom.
        let small = m.alloc(300).expect("fits");
        assert_eq!(small, (0, 512));
        live.push(small);
        // Large again: right below the first large one.
        let big2 = m.alloc(M + 1).expect("fits");
        assert_eq!(big2, (5 * M - 256, M + 256));
        live.push(big2);
        // A hole opens at the top; a large request goes back there.
        m.free(live.remove(0));
        let big3 = m.alloc(M).expect("fits");
        assert_eq!(big3, (7 * M, M));
        live.push(big3);
        // Small requests keep first-fitting from the bottom.
        let small2 = m.alloc(M - 1).expect("fits");
        assert_eq!(small2, (512, M));
        live.push(small2);
        assert_disjoint(&live, 8 * M);
        // Freeing everything coalesces back to one hole.
        for h in live {
            m.free(h);
        }
        assert_eq!(m.holes, [(0, 8 * M)]);
    }
}
