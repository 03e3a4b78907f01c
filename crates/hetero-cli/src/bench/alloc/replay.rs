//! The fragmentation replays: (a) buffer-level churn at 60 % occupancy of one
//! 1 GiB region, replayed on hetero's TLSF, the offset-allocator crate and the
//! reference policies (`reference.rs`) with the exact fragmentation measured
//! after each step; (b) a whole-pool trace whose batch grows N → N+1, reported
//! as peak reserved over peak live bytes. `hetero bench vmm` and the running-ahead
//! trace (`alloc_ahead.rs`) reuse the sequences.

use super::reference::{Policy, RefModel};
use super::Rng;
use crate::bench::BenchReport;
use hetero_memory::tlsf::{Placement, Tlsf};
use hetero_memory::{DevicePool, PoolConfig};

/// Exact 1 − largest free / total free of `[0, cap)` given the live ranges.
fn fragmentation(live: &mut [(u64, u64)], cap: u64) -> f64 {
    live.sort_unstable();
    let (mut cursor, mut largest, mut total) = (0u64, 0u64, 0u64);
    for &(start, len) in live.iter() {
        let gap = start - cursor;
        largest = largest.max(gap);
        total += gap;
        cursor = start + len;
    }
    let gap = cap - cursor;
    largest = largest.max(gap);
    total += gap;
    if total == 0 {
        0.0
    } else {
        1.0 - largest as f64 / total as f64
    }
}

/// An allocator under the fragmentation replay: places a buffer (`None` when
/// it does not fit), frees one, and says which range of the region it holds.
trait Replayed {
    type Handle: Copy;
    fn alloc(&mut self, size: u64) -> Option<Self::Handle>;
    fn free(&mut self, h: Self::Handle);
    /// `(start, len)` of a live allocation, padding included.
    fn range(&self, h: Self::Handle) -> (u64, u64);
}

/// hetero's buffer level; the handle keeps the node, its address and size.
struct TlsfReplay(Tlsf);

impl Replayed for TlsfReplay {
    type Handle = (u32, u64, u64);
    fn alloc(&mut self, size: u64) -> Option<Self::Handle> {
        let t = &mut self.0;
        t.alloc(size, 256, Placement::Low, u64::MAX)
            .map(|(n, addr)| (n, addr, t.size_of(n)))
    }
    fn free(&mut self, (n, _, _): Self::Handle) {
        self.0.free(n);
    }
    fn range(&self, (_, addr, len): Self::Handle) -> (u64, u64) {
        (addr, len)
    }
}

impl Replayed for offset_allocator::Allocator<u32> {
    type Handle = offset_allocator::Allocation<u32>;
    fn alloc(&mut self, size: u64) -> Option<Self::Handle> {
        self.allocate(u32::try_from(size).ok()?)
    }
    fn free(&mut self, h: Self::Handle) {
        offset_allocator::Allocator::free(self, h);
    }
    fn range(&self, h: Self::Handle) -> (u64, u64) {
        (u64::from(h.offset), u64::from(self.allocation_size(h)))
    }
}

impl Replayed for RefModel {
    type Handle = (u64, u64);
    fn alloc(&mut self, size: u64) -> Option<Self::Handle> {
        // The inherent method (reference.rs), not this one.
        RefModel::alloc(self, size)
    }
    fn free(&mut self, h: Self::Handle) {
        RefModel::free(self, h);
    }
    fn range(&self, h: Self::Handle) -> (u64, u64) {
        h
    }
}

/// Replays `seq` (free the victim slot, then push the allocations) on `a` and
/// measures the exact fragmentation of `[0, cap)` after each step. A failed
/// allocation is counted and keeps its slot, which frees as a no-op.
fn replay<A: Replayed>(seq: &[(usize, Vec<u64>)], a: &mut A, cap: u64) -> (Vec<f64>, u64) {
    let mut live: Vec<Option<A::Handle>> = Vec::new();
    let (mut fr, mut failures) = (Vec::with_capacity(seq.len()), 0u64);
    let mut ranges = Vec::new();
    for (victim, add) in seq {
        if *victim != usize::MAX {
            if let Some(h) = live.swap_remove(*victim) {
                a.free(h);
            }
        }
        for &s in add {
            let h = a.alloc(s);
            failures += u64::from(h.is_none());
            live.push(h);
        }
        ranges.clear();
        ranges.extend(live.iter().flatten().map(|&h| a.range(h)));
        fr.push(fragmentation(&mut ranges, cap));
    }
    (fr, failures)
}

/// Replays `seq` on `a` and reports `{name}/fragmentation-churn` (the mean),
/// its per-step samples and its failure count.
fn report_replay<A: Replayed>(
    rep: &mut BenchReport,
    name: &str,
    seq: &[(usize, Vec<u64>)],
    a: &mut A,
    cap: u64,
) {
    let (mut fr, failures) = replay(seq, a, cap);
    let mean = fr.iter().sum::<f64>() / fr.len() as f64;
    rep.push_samples(
        &format!("{name}/fragmentation-churn-samples"),
        "ratio",
        &mut fr,
    );
    rep.push_value(
        &format!("{name}/fragmentation-churn"),
        "ratio",
        mean,
        seq.len() as u64,
    );
    rep.push_value(
        &format!("{name}/fragmentation-churn-failures"),
        "count",
        failures as f64,
        1,
    );
}

/// The capacity the churn replay holds 60 % of.
pub(super) const CHURN_CAP: u64 = 1 << 30;

/// The churn replay's sequence: (slot to free first, or `usize::MAX`; sizes
/// to allocate after it). Sizes are log-uniform 256 B–64 MiB, refilled to
/// 60 % of [`CHURN_CAP`] after each free. `hetero bench vmm` replays it on
/// the whole pool.
pub(in crate::bench) fn churn_sequence(quick: bool) -> Vec<(usize, Vec<u64>)> {
    const CAP: u64 = CHURN_CAP;
    let steps = if quick { 3000 } else { 20_000 };
    let mut rng = Rng(0xF4A6_0001);
    // The driver's sequence: (alloc sizes to push after freeing index).
    let target = CAP * 6 / 10;
    let mut seq: Vec<(usize, Vec<u64>)> = Vec::new();
    let mut model: Vec<u64> = Vec::new();
    let mut live_bytes = 0u64;
    let mut fill = Vec::new();
    while live_bytes < target {
        let s = rng.log_uniform(256.0, 64.0 * 1048576.0) as u64;
        fill.push(s);
        model.push(s);
        live_bytes += s;
    }
    seq.push((usize::MAX, fill));
    for _ in 0..steps {
        let victim = rng.below(model.len());
        live_bytes -= model.swap_remove(victim);
        let mut add = Vec::new();
        while live_bytes < target {
            let s = rng.log_uniform(256.0, 64.0 * 1048576.0) as u64;
            add.push(s);
            model.push(s);
            live_bytes += s;
        }
        seq.push((victim, add));
    }
    seq
}

/// Replay (a): one 1 GiB region, sizes log-uniform 256 B–64 MiB, held at 60 %
/// occupancy: free a random live buffer, refill to 60 %, measure. hetero, the
/// offset-allocator crate and three exact reference policies (first-fit,
/// best-fit, two-ended fit) get the same sequence; a failed allocation is
/// skipped by model and allocator alike (its slot frees as a no-op).
pub(super) fn fragmentation_churn(rep: &mut BenchReport, quick: bool) {
    let seq = churn_sequence(quick);
    const CAP: u64 = CHURN_CAP;
    let mut t = Tlsf::new();
    t.add_region(0, CAP);
    report_replay(rep, "hetero", &seq, &mut TlsfReplay(t), CAP);
    let mut oa = offset_allocator::Allocator::<u32>::new(CAP as u32);
    report_replay(rep, "offset-allocator", &seq, &mut oa, CAP);
    for (name, policy) in [
        ("reference-first-fit", Policy::First),
        ("reference-best-fit", Policy::Best),
        ("reference-two-ended-fit", Policy::TwoEnded),
    ] {
        report_replay(rep, name, &seq, &mut RefModel::new(policy, CAP), CAP);
    }
    rep.ratio(
        "fragmentation-churn hetero/offset-allocator",
        "hetero/fragmentation-churn",
        "offset-allocator/fragmentation-churn",
    );
    rep.ratio(
        "fragmentation-churn hetero/reference-first-fit",
        "hetero/fragmentation-churn",
        "reference-first-fit/fragmentation-churn",
    );
}

/// The growth trace's weights (bytes): allocated first, kept to the end.
pub(in crate::bench) const WEIGHTS: [usize; 6] =
    [96 << 20, 48 << 20, 7 << 20, 7 << 20, 300 << 10, 300 << 10];

/// Replay (b): an inference-like trace on the whole pool. Weights stay; each
/// step allocates activations for batch N, frees them, and N grows by one.
pub(super) fn growth(rep: &mut BenchReport, quick: bool) {
    let ratio = growth_ratio(PoolConfig::default(), quick);
    rep.push_value(
        "hetero/reserved-over-live-growth",
        "ratio",
        ratio,
        if quick { 32 } else { 64 },
    );
}

/// Peak reserved over peak live bytes of the growth trace on a pool of `config`.
pub(in crate::bench) fn growth_ratio(config: PoolConfig, quick: bool) -> f64 {
    let pool = DevicePool::new(config).expect("host pool");
    let weights: Vec<_> = WEIGHTS
        .iter()
        .map(|&s| pool.alloc(s, 256, 0).expect("weights"))
        .collect();
    let base_live: usize = weights.iter().map(|a| a.size()).sum();
    let mut peak_live = base_live;
    let max_batch = if quick { 32 } else { 64 };
    for n in 1..=max_batch {
        let mut acts = Vec::new();
        let mut live = base_live;
        for layer in 0..12 {
            for (k, per_item) in [(0, 48usize << 10), (1, 192 << 10), (2, 640 << 10)] {
                let s = n * per_item + layer * 4096 + k * 256;
                acts.push(pool.alloc(s, 256, 0).expect("activation"));
                live += s;
            }
            let tmp = pool.alloc(n * (96 << 10), 256, 0).expect("workspace");
            peak_live = peak_live.max(live + tmp.size());
            pool.free(tmp, 0, Vec::new());
        }
        peak_live = peak_live.max(live);
        for a in acts {
            pool.free(a, 0, Vec::new());
        }
    }
    let st = pool.stats();
    for a in weights {
        pool.free(a, 0, Vec::new());
    }
    st.peak_reserved as f64 / peak_live as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_counts_failures_and_frees_failed_slots_as_no_ops() {
        // A 4 KiB region.
        let seq = vec![
            (usize::MAX, vec![1024, 1024, 1024]),
            (1, vec![2048]),
            (0, vec![1024, 512]),
            (0, vec![]),
        ];
        let mut m = RefModel::new(Policy::First, 4096);
        let (fr, failures) = replay(&seq, &mut m, 4096);
        assert_eq!(failures, 1);
        assert_eq!(fr.len(), 4);
        // Step 0: live [0, 3K); the one hole is the 1K tail.
        assert_eq!(fr[0], 0.0);
        // Step 1: [1K, 2K) freed; holes 1K@1K and 1K@3K, so 2K fails (its
        // slot becomes the empty last one).
        assert_eq!(fr[1], 0.5);
        // Step 2: slot 0 ([0, 1K)) freed, the failed slot moves to 0; 1K
        // lands at 0 and 512 at 1K. Holes 512@1.5K and 1K@3K.
        assert_eq!(fr[2], 1.0 - 1024.0 / 1536.0);
        // Step 3: slot 0 is the failed one: nothing is freed.
        assert_eq!(fr[3], fr[2]);
        assert_eq!(m.holes, [(1536, 512), (3072, 1024)]);
    }

    #[test]
    fn fragmentation_is_exact() {
        // Holes of 2, 1, 1 and 12 units (given unsorted): 1 − 12/16.
        let mut live = [(8, 4), (2, 3), (6, 1)];
        assert_eq!(fragmentation(&mut live, 24), 0.25);
        // One hole, or none at all: no fragmentation.
        assert_eq!(fragmentation(&mut [], 24), 0.0);
        assert_eq!(fragmentation(&mut [(0, 24)], 24), 0.0);
        assert_eq!(fragmentation(&mut [(4, 20)], 24), 0.0);
        // Two equal holes: half the free space is unusable for one request.
        assert_eq!(fragmentation(&mut [(4, 4)], 12), 0.5);
    }
}
