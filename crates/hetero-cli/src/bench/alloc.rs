//! `hetero bench alloc`: hetero's pools beside glibc malloc, mimalloc, jemalloc,
//! the offset-allocator crate and posix_memalign+mlock (the seed's baseline),
//! in one run, plus two fragmentation replays (buffer-level churn at 60 %
//! occupancy; a whole-pool trace whose batch grows N → N+1).

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

/// Replay (a): one 1 GiB region, sizes log-uniform 256 B–64 MiB, held at 60 %
/// occupancy: free a random live buffer, refill to 60 %, measure. Both
/// allocators get the same sequence; a failed allocation is skipped by both
/// model and allocator alike (its slot frees as a no-op).
fn fragmentation_churn(rep: &mut BenchReport, quick: bool) {
    const CAP: u64 = 1 << 30;
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

    // hetero's buffer level.
    let mut t = Tlsf::new();
    t.add_region(0, CAP);
    let mut live: Vec<Option<(u32, u64, u64)>> = Vec::new();
    let (mut fr, mut failures) = (Vec::new(), 0u64);
    for (victim, add) in &seq {
        if *victim != usize::MAX {
            if let Some((n, _, _)) = live.swap_remove(*victim) {
                t.free(n);
            }
        }
        for &s in add {
            let a = t
                .alloc(s, 256, Placement::Low, u64::MAX)
                .map(|(n, addr)| (n, addr, t.size_of(n)));
            failures += u64::from(a.is_none());
            live.push(a);
        }
        let mut ranges: Vec<(u64, u64)> = live.iter().flatten().map(|&(_, a, l)| (a, l)).collect();
        fr.push(fragmentation(&mut ranges, CAP));
    }
    let mean = fr.iter().sum::<f64>() / fr.len() as f64;
    rep.push_samples("hetero/fragmentation-churn-samples", "ratio", &mut fr);
    rep.push_value(
        "hetero/fragmentation-churn",
        "ratio",
        mean,
        seq.len() as u64,
    );
    rep.push_value(
        "hetero/fragmentation-churn-failures",
        "count",
        failures as f64,
        1,
    );

    // offset-allocator, same sequence, exact figures from the live ranges.
    let mut oa = offset_allocator::Allocator::<u32>::new(CAP as u32);
    let mut live: Vec<Option<offset_allocator::Allocation<u32>>> = Vec::new();
    let (mut fr, mut failures) = (Vec::new(), 0u64);
    for (victim, add) in &seq {
        if *victim != usize::MAX {
            if let Some(x) = live.swap_remove(*victim) {
                oa.free(x);
            }
        }
        for &s in add {
            let a = oa.allocate(s as u32);
            failures += u64::from(a.is_none());
            live.push(a);
        }
        let mut ranges: Vec<(u64, u64)> = live
            .iter()
            .flatten()
            .map(|x| (u64::from(x.offset), u64::from(oa.allocation_size(*x))))
            .collect();
        fr.push(fragmentation(&mut ranges, CAP));
    }
    let mean = fr.iter().sum::<f64>() / fr.len() as f64;
    rep.push_samples(
        "offset-allocator/fragmentation-churn-samples",
        "ratio",
        &mut fr,
    );
    rep.push_value(
        "offset-allocator/fragmentation-churn",
        "ratio",
        mean,
        seq.len() as u64,
    );
    rep.push_value(
        "offset-allocator/fragmentation-churn-failures",
        "count",
        failures as f64,
        1,
    );
    rep.ratio(
        "fragmentation-churn hetero/offset-allocator",
        "hetero/fragmentation-churn",
        "offset-allocator/fragmentation-churn",
    );
}

/// Replay (b): an inference-like trace on the whole pool. Weights stay; each
/// step allocates activations for batch N, frees them, and N grows by one.
fn growth(rep: &mut BenchReport, quick: bool) {
    let pool = DevicePool::new(PoolConfig::default()).expect("host pool");
    let weights: Vec<_> = [
        96usize << 20,
        48 << 20,
        7 << 20,
        7 << 20,
        300 << 10,
        300 << 10,
    ]
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
    let ratio = st.peak_reserved as f64 / peak_live as f64;
    rep.push_value(
        "hetero/reserved-over-live-growth",
        "ratio",
        ratio,
        max_batch as u64,
    );
    for a in weights {
        pool.free(a, 0, Vec::new());
    }
}

/// Runs every series; `quick` finishes in well under 20 s.
pub fn run(quick: bool) -> BenchReport {
    let mut rep = BenchReport::new("alloc");
    let samples = if quick { 4000 } else { 40_000 };
    hit_path(&mut rep, samples);
    churn(&mut rep, quick);
    pinned(&mut rep, if quick { 2000 } else { 20_000 });
    fragmentation_churn(&mut rep, quick);
    growth(&mut rep, quick);
    rep
}
