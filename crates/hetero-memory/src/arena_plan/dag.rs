//! Reachability of a DAG as bit rows, for DAG conflicts.

/// Kahn's order of the nodes; nodes on a cycle are left out.
pub(super) fn topological_order(nodes: usize, children: &Csr) -> Vec<u32> {
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
pub(super) struct Csr {
    pub(super) start: Vec<usize>,
    pub(super) items: Vec<u32>,
}

impl Csr {
    /// Panics if a pair's index is `>= n`.
    pub(super) fn from_pairs(n: usize, pairs: impl Iterator<Item = (usize, u32)> + Clone) -> Csr {
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
    pub(super) fn from_bits(m: &BitMatrix, keep: &[u64]) -> Csr {
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

    pub(super) fn of(&self, i: usize) -> &[u32] {
        &self.items[self.start[i]..self.start[i + 1]]
    }
}

/// A bit matrix, one row of `words` u64 per row; bits at columns `>= cols` are zero.
#[derive(Debug, Clone)]
pub(super) struct BitMatrix {
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) words: usize,
    pub(super) data: Vec<u64>,
}

impl BitMatrix {
    pub(super) fn zeros(rows: usize, cols: usize) -> Self {
        let words = cols.div_ceil(64);
        BitMatrix {
            rows,
            cols,
            words,
            data: vec![0; rows * words],
        }
    }

    pub(super) fn ones(rows: usize, cols: usize) -> Self {
        let mut m = BitMatrix::zeros(rows, cols);
        m.data.fill(!0);
        for r in 0..rows {
            m.clear_tail(r);
        }
        m
    }

    pub(super) fn row(&self, r: usize) -> &[u64] {
        &self.data[r * self.words..(r + 1) * self.words]
    }

    pub(super) fn row_mut(&mut self, r: usize) -> &mut [u64] {
        &mut self.data[r * self.words..(r + 1) * self.words]
    }

    pub(super) fn get(&self, r: usize, c: usize) -> bool {
        self.row(r)[c / 64] >> (c % 64) & 1 == 1
    }

    pub(super) fn set(&mut self, r: usize, c: usize) {
        self.row_mut(r)[c / 64] |= 1 << (c % 64);
    }

    pub(super) fn clear(&mut self, r: usize, c: usize) {
        self.row_mut(r)[c / 64] &= !(1 << (c % 64));
    }

    /// Zeroes the bits of row `r` past `cols`.
    pub(super) fn clear_tail(&mut self, r: usize) {
        if !self.cols.is_multiple_of(64) {
            let last = self.words - 1;
            self.row_mut(r)[last] &= (1 << (self.cols % 64)) - 1;
        }
    }

    /// Row `dst` |= row `src` (distinct rows).
    pub(super) fn or_row(&mut self, dst: usize, src: usize) {
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
    pub(super) fn and_row(&mut self, dst: usize, other: &BitMatrix, src: usize) {
        for (x, y) in self.row_mut(dst).iter_mut().zip(other.row(src)) {
            *x &= y;
        }
    }

    /// The transpose, 64×64 blocks at a time.
    pub(super) fn transpose(&self) -> BitMatrix {
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
pub(super) fn transpose64(a: &mut [u64; 64]) {
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
pub(super) fn ones(words: &[u64]) -> impl Iterator<Item = usize> + Clone + '_ {
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
