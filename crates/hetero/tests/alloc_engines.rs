//! Running work allocates nothing either: a counting global allocator counts every
//! thread's allocations (engines included) while multi-block kernels with buffer
//! arguments are launched and run. This binary has its own `main` (no libtest
//! harness, see Cargo.toml), so no thread but the test's and the device's runs
//! meanwhile. Counts are deterministic; no timing is involved.

mod common;

use hetero::{Arg, Grid, Kernel};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: defers every request to `System` unchanged; the counter update neither
// allocates nor unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract; passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as in `alloc`; `ptr` came from this allocator, which is `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, which is `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() {
    multi_block_kernels_allocate_nothing_on_any_thread();
    println!("multi_block_kernels_allocate_nothing_on_any_thread ... ok");
}

fn multi_block_kernels_allocate_nothing_on_any_thread() {
    if common::skipped("multi_block_kernels_allocate_nothing_on_any_thread") {
        return;
    }
    let dev = common::device_with(|c| c.compute_units(2));
    let s = dev.create_stream().expect("stream");
    let a = dev.alloc::<u32>(1024).expect("alloc");
    let b = dev.alloc::<u32>(1024).expect("alloc");
    s.fill(&a, 3).expect("fill");
    let k = Kernel::new("blocks", |blk| {
        let x = blk.read::<u32>(0);
        let off = blk.write_offset(0);
        for (i, v) in blk.write::<u32>(0).iter_mut().enumerate() {
            *v = x[off + i] + 1;
        }
    })
    .wgsl(common::wgsl::map("u32", 1, "x0[i] + 1u"), "main");
    let round = || {
        for _ in 0..100 {
            s.launch(&k, Grid::new(8), &[Arg::read(&a), Arg::write(&b)])
                .expect("launch");
        }
        s.synchronize().expect("synchronize");
    };
    round();
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..10 {
        round();
    }
    let made = ALLOCS.load(Ordering::Relaxed) - before;
    assert_eq!(
        made, 0,
        "allocations while running 1000 multi-block kernels"
    );
    assert_eq!(s.read_to_vec(&b).expect("read"), vec![4; 1024]);
}
