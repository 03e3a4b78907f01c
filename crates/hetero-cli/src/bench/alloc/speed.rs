//! Allocation speed: hetero's pools beside glibc malloc, mimalloc, jemalloc,
//! the offset-allocator crate and posix_memalign+mlock (the seed's baseline),
//! in one run: the pool's hit path, `Stream::alloc` and drop, a churn of
//! log-uniform sizes, and pinned allocations.

use super::Rng;
use crate::bench::BenchReport;
use hetero_memory::{DevicePool, PinnedConfig, PinnedPool, PoolConfig};
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::Instant;

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

pub(super) fn hit_path(rep: &mut BenchReport, samples: usize) {
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
pub(super) fn stream_path(rep: &mut BenchReport, samples: usize) {
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

pub(super) fn churn(rep: &mut BenchReport, quick: bool) {
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

pub(super) fn pinned(rep: &mut BenchReport, samples: usize) {
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
