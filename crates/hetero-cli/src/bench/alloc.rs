//! `hetero bench alloc`: hetero's pools beside glibc malloc, mimalloc, jemalloc,
//! the offset-allocator crate and posix_memalign+mlock (the seed's baseline),
//! in one run, plus two fragmentation replays (buffer-level churn at 60 %
//! occupancy; a whole-pool trace whose batch grows N → N+1). The churn replay
//! also runs three exact reference placement policies (first-fit, best-fit,
//! two-ended fit: an ideal free list, 256-byte granularity) on the same
//! sequence, as the yardstick for what non-moving placement can reach there.
//! The same growth trace with work queued and no synchronisation (the host
//! running ahead) is in `alloc_ahead.rs`.

use super::BenchReport;
use hetero_memory::tlsf::{Placement, Tlsf};
use hetero_memory::{DevicePool, PinnedConfig, PinnedPool, PoolConfig};
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::Instant;

/// xorshift64*: a reproducible sequence for every allocator alike.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Log-uniform in [lo, hi].
    fn log_uniform(&mut self, lo: f64, hi: f64) -> usize {
        (lo * (hi / lo).powf(self.unit())) as usize
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Times `samples` batches of `batch` calls of `f`; ns per call.
fn time_batches(samples: usize, batch: usize, mut f: impl FnMut()) -> Vec<f64> {
    for _ in 0..batch * 10 {
        f();
    }
    (0..samples)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..batch {
                f();
            }
            t.elapsed().as_nanos() as f64 / batch as f64
        })
        .collect()
}

/// The peers that implement `GlobalAlloc`, called directly (not installed as
/// the global allocator).
fn peers() -> Vec<(&'static str, &'static dyn GlobalAlloc)> {
    static MI: mimalloc::MiMalloc = mimalloc::MiMalloc;
    static JE: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
    vec![("glibc", &System), ("mimalloc", &MI), ("jemalloc", &JE)]
}

fn hit_path(rep: &mut BenchReport, samples: usize) {
    const SIZE: usize = 4096;
    let pool = DevicePool::new(PoolConfig::default()).expect("host pool");
    let mut s = time_batches(samples, 32, || {
        let a = pool.alloc(black_box(SIZE), 256, 0).expect("alloc");
        black_box(a.ptr());
        pool.free(a, 0, Vec::new());
    });
    rep.push_samples("hetero/alloc-free-hit", "ns", &mut s);
    for (name, a) in peers() {
        let layout = Layout::from_size_align(SIZE, 16).expect("layout");
        let mut s = time_batches(samples, 32, || {
            // SAFETY: a non-zero layout; the pointer is freed with the same layout.
            unsafe {
                let p = a.alloc(black_box(layout));
                black_box(p);
                a.dealloc(p, layout);
            }
        });
        rep.push_samples(&format!("{name}/alloc-free"), "ns", &mut s);
    }
    let mut oa = offset_allocator::Allocator::<u32>::new(1 << 30);
    let mut s = time_batches(samples, 32, || {
        let x = oa.allocate(black_box(SIZE as u32)).expect("room");
        black_box(x.offset);
        oa.free(x);
    });
    rep.push_samples("offset-allocator/alloc-free", "ns", &mut s);
    for peer in [
        "offset-allocator/alloc-free",
        "glibc/alloc-free",
        "mimalloc/alloc-free",
        "jemalloc/alloc-free",
    ] {
        let key = format!(
            "alloc-free-hit {}/hetero",
            peer.split('/').next().unwrap_or(peer)
        );
        rep.ratio(&key, peer, "hetero/alloc-free-hit");
    }
}

/// The same 4 KiB through the public API: `Stream::alloc` and drop on an idle
/// stream, beside malloc+free of the same size and the pool's own hit. In this
/// loop the buffer dropped idle is taken back whole (the thread keeps it, with
/// its memory, in front of the pool: `buffer.rs`, `Spares`).
fn stream_path(rep: &mut BenchReport, samples: usize) {
    let dev = hetero::Device::new(hetero::DeviceConfig::default()).expect("host device");
    let s = dev.create_stream().expect("stream");
    let mut v = time_batches(samples, 32, || {
        let b = s.alloc::<u8>(black_box(4096)).expect("alloc");
        black_box(&b);
    });
    rep.push_samples("hetero/stream-alloc-free", "ns", &mut v);
    rep.ratio(
        "stream-alloc-free glibc/hetero",
        "glibc/alloc-free",
        "hetero/stream-alloc-free",
    );
    rep.ratio(
        "stream-alloc-free hetero/alloc-free-hit",
        "hetero/stream-alloc-free",
        "hetero/alloc-free-hit",
    );
}

/// One churn sequence: `Some(size)` allocates, `None` frees a random live slot.
fn churn_ops(n: usize, live_target: usize, lo: f64, hi: f64) -> Vec<(usize, usize)> {
    let mut rng = Rng(0x5EED_CAFE);
    let mut ops = Vec::with_capacity(n);
    let mut live = 0usize;
    for _ in 0..n {
        if live < live_target || rng.below(2) == 0 {
            ops.push((rng.log_uniform(lo, hi), 0));
            live += 1;
        } else {
            ops.push((0, rng.below(live)));
            live -= 1;
        }
    }
    ops
}

fn churn(rep: &mut BenchReport, quick: bool) {
    let ops = churn_ops(
        if quick { 200_000 } else { 2_000_000 },
        1000,
        64.0,
        1048576.0,
    );
    let chunk = 4096;
    let run = |alloc: &mut dyn FnMut(usize) -> usize, free: &mut dyn FnMut(usize)| -> Vec<f64> {
        let mut live: Vec<usize> = Vec::with_capacity(4096);
        let mut out = Vec::new();
        for piece in ops.chunks(chunk) {
            let t = Instant::now();
            for &(size, idx) in piece {
                if size > 0 {
                    live.push(alloc(size));
                } else {
                    let h = live.swap_remove(idx);
                    free(h);
                }
            }
            out.push(t.elapsed().as_nanos() as f64 / piece.len() as f64);
        }
        for h in live {
            free(h);
        }
        out
    };
    // hetero: handles are indices into a slab of allocations.
    let pool = DevicePool::new(PoolConfig::default()).expect("host pool");
    let mut slab: Vec<Option<hetero_memory::Allocation>> = Vec::new();
    let mut spare: Vec<usize> = Vec::new();
    let slab_cell = std::cell::RefCell::new((&mut slab, &mut spare));
    let mut s = run(
        &mut |size| {
            let a = pool.alloc(size, 256, 0).expect("alloc");
            let mut g = slab_cell.borrow_mut();
            let (slab, spare) = &mut *g;
            match spare.pop() {
                Some(i) => {
                    slab[i] = Some(a);
                    i
                }
                None => {
                    slab.push(Some(a));
                    slab.len() - 1
                }
            }
        },
        &mut |h| {
            let mut g = slab_cell.borrow_mut();
            let (slab, spare) = &mut *g;
            if let Some(a) = slab[h].take() {
                pool.free(a, 0, Vec::new());
            }
            spare.push(h);
        },
    );
    rep.push_samples("hetero/churn-alloc", "ns", &mut s);
    for (name, a) in peers() {
        let sizes = std::cell::RefCell::new(std::collections::HashMap::<usize, usize>::new());
        let mut s = run(
            &mut |size| {
                let l = Layout::from_size_align(size, 16).expect("layout");
                // SAFETY: non-zero layout; freed below with the same layout.
                let p = unsafe { a.alloc(l) } as usize;
                sizes.borrow_mut().insert(p, size);
                p
            },
            &mut |p| {
                let size = sizes.borrow_mut().remove(&p).expect("live");
                let l = Layout::from_size_align(size, 16).expect("layout");
                // SAFETY: `p` came from `a.alloc` with this layout.
                unsafe { a.dealloc(p as *mut u8, l) };
            },
        );
        rep.push_samples(&format!("{name}/churn-alloc"), "ns", &mut s);
    }
    let oa = std::cell::RefCell::new(offset_allocator::Allocator::<u32>::new(u32::MAX));
    let handles = std::cell::RefCell::new(Vec::<offset_allocator::Allocation<u32>>::new());
    let mut s = run(
        &mut |size| {
            let x = oa.borrow_mut().allocate(size as u32).expect("room");
            let mut h = handles.borrow_mut();
            h.push(x);
            h.len() - 1
        },
        &mut |i| {
            let x = handles.borrow()[i];
            oa.borrow_mut().free(x);
        },
    );
    rep.push_samples("offset-allocator/churn-alloc", "ns", &mut s);
    rep.ratio(
        "churn-alloc offset-allocator/hetero",
        "offset-allocator/churn-alloc",
        "hetero/churn-alloc",
    );
    rep.ratio(
        "churn-alloc glibc/hetero",
        "glibc/churn-alloc",
        "hetero/churn-alloc",
    );
}

fn pinned(rep: &mut BenchReport, samples: usize) {
    let pool = PinnedPool::new(PinnedConfig::default()).expect("pinned pool");
    for (label, size) in [("64k", 64usize << 10), ("1m", 1 << 20)] {
        drop(pool.alloc(size, 4096).expect("warm-up"));
        let mut s = time_batches(samples, 32, || {
            let a = pool.alloc(black_box(size), 4096).expect("pinned");
            black_box(a.ptr());
        });
        rep.push_samples(&format!("hetero/pinned-alloc-{label}"), "ns", &mut s);
        let layout = Layout::from_size_align(size, 4096).expect("layout");
        let mut s = time_batches(samples.min(400), 1, || {
            // SAFETY: the seed's baseline: posix_memalign, mlock, munlock, free of
            // the same block; nothing else touches it.
            unsafe {
                let p = System.alloc(layout);
                let _ = rustix::mm::mlock(p.cast(), size);
                let _ = rustix::mm::munlock(p.cast(), size);
                System.dealloc(p, layout);
            }
        });
        rep.push_samples(&format!("memalign-mlock/alloc-{label}"), "ns", &mut s);
        rep.ratio(
            &format!("pinned-{label} memalign-mlock/hetero"),
            &format!("memalign-mlock/alloc-{label}"),
            &format!("hetero/pinned-alloc-{label}"),
        );
    }
}

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

/// Where the exact reference model puts a request among the holes that fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
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
struct RefModel {
    policy: Policy,
    /// `(start, len)`, sorted by start, never adjacent (always coalesced).
    holes: Vec<(u64, u64)>,
}

impl RefModel {
    fn new(policy: Policy, cap: u64) -> Self {
        RefModel {
            policy,
            holes: vec![(0, cap)],
        }
    }
}

impl Replayed for RefModel {
    type Handle = (u64, u64);
    fn alloc(&mut self, size: u64) -> Option<Self::Handle> {
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
    fn free(&mut self, (start, len): Self::Handle) {
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
pub(super) fn churn_sequence(quick: bool) -> Vec<(usize, Vec<u64>)> {
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
fn fragmentation_churn(rep: &mut BenchReport, quick: bool) {
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
pub(super) const WEIGHTS: [usize; 6] = [96 << 20, 48 << 20, 7 << 20, 7 << 20, 300 << 10, 300 << 10];

/// Replay (b): an inference-like trace on the whole pool. Weights stay; each
/// step allocates activations for batch N, frees them, and N grows by one.
fn growth(rep: &mut BenchReport, quick: bool) {
    let ratio = growth_ratio(PoolConfig::default(), quick);
    rep.push_value(
        "hetero/reserved-over-live-growth",
        "ratio",
        ratio,
        if quick { 32 } else { 64 },
    );
}

/// Peak reserved over peak live bytes of the growth trace on a pool of `config`.
pub(super) fn growth_ratio(config: PoolConfig, quick: bool) -> f64 {
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

/// Runs every series; `quick` finishes in well under 20 s.
pub fn run(quick: bool) -> BenchReport {
    let mut rep = BenchReport::new("alloc");
    let samples = if quick { 4000 } else { 40_000 };
    hit_path(&mut rep, samples);
    stream_path(&mut rep, samples);
    churn(&mut rep, quick);
    pinned(&mut rep, if quick { 2000 } else { 20_000 });
    fragmentation_churn(&mut rep, quick);
    growth(&mut rep, quick);
    super::alloc_ahead::running_ahead(&mut rep, quick);
    rep
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
