//! Bytes live over the unit times of a lane schedule, for holding lanes to a
//! memory budget (`schedule.rs`): a buffer adds its bytes from the start of
//! its first use on, and takes them away from the finish of its last; the
//! schedule asks for the most bytes live at or after a time.

/// A segment tree over times `0..len` with "add to every time from `t` on"
/// and "most at any time from `t` on", both O(log len).
pub(crate) struct LiveBytes {
    len: usize,
    /// Per node: the most of its range, its own pending add included.
    max: Vec<i64>,
    /// Per node: what was added to its whole range.
    add: Vec<i64>,
}

impl LiveBytes {
    pub(crate) fn new(len: usize) -> Self {
        let len = len.max(1);
        let size = 2 * len.next_power_of_two();
        LiveBytes {
            len,
            max: vec![0; size],
            add: vec![0; size],
        }
    }

    /// Adds `delta` to every time `>= from`.
    pub(crate) fn add_from(&mut self, from: usize, delta: i64) {
        if from < self.len && delta != 0 {
            self.update(1, 0, self.len, from, delta);
        }
    }

    /// The most bytes live at any time `>= from` (0 past the end).
    pub(crate) fn max_from(&self, from: usize) -> i64 {
        if from >= self.len {
            return 0;
        }
        self.query(1, 0, self.len, from)
    }

    fn update(&mut self, node: usize, lo: usize, hi: usize, from: usize, delta: i64) {
        if from <= lo {
            self.max[node] += delta;
            self.add[node] += delta;
            return;
        }
        let mid = (lo + hi) / 2;
        if from < mid {
            self.update(2 * node, lo, mid, from, delta);
        }
        self.update(2 * node + 1, mid, hi, from, delta);
        self.max[node] = self.add[node] + self.max[2 * node].max(self.max[2 * node + 1]);
    }

    fn query(&self, node: usize, lo: usize, hi: usize, from: usize) -> i64 {
        if from <= lo {
            return self.max[node];
        }
        let mid = (lo + hi) / 2;
        let right = self.query(2 * node + 1, mid, hi, from);
        let best = if from < mid {
            self.query(2 * node, lo, mid, from).max(right)
        } else {
            right
        };
        self.add[node] + best
    }
}

#[cfg(test)]
mod tests {
    use super::LiveBytes;

    #[test]
    fn suffix_adds_and_maxima_match_a_plain_array() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for len in [1usize, 2, 3, 7, 64, 100] {
            let mut tree = LiveBytes::new(len);
            let mut plain = vec![0i64; len];
            for _ in 0..500 {
                let t = (next() % (len as u64 + 2)) as usize;
                if next() % 2 == 0 {
                    let delta = (next() % 200) as i64 - 100;
                    tree.add_from(t, delta);
                    for x in plain.iter_mut().skip(t) {
                        *x += delta;
                    }
                } else {
                    let want = plain.iter().skip(t).copied().max().unwrap_or(0);
                    assert_eq!(tree.max_from(t), want, "len {len}, from {t}");
                }
            }
        }
    }
}
