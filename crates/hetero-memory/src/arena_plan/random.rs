//! Random DAG cases shaped like inference graphs, for tests and benchmarks.

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

pub(super) const MIN_CASE_SIZE: u64 = 256;
pub(super) const MAX_CASE_SIZE: u64 = 64 << 20;

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
pub(super) struct SplitMix(pub(super) u64);

impl SplitMix {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when n is 0).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}
