//! Submission allocates nothing: a counting global allocator shows how many heap
//! allocations the submitting thread makes while launching an already-built kernel.
//!
//! The count is per thread (a const-initialised thread-local `Cell`, which needs no
//! allocation and no destructor), so engine threads, which drop completed ops and
//! may allocate, do not disturb it. Counts are deterministic; no timing is involved.

mod common;

use hetero::{Arg, Device, Grid, Kernel};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn bump() {
    // `try_with`: the allocator can run while thread-locals are being torn down.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: defers every request to `System` unchanged; the counter update neither
// allocates nor unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract; passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
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

/// Allocations made by this thread so far.
fn allocs() -> u64 {
    ALLOCS.with(|c| c.get())
}

fn device() -> Device {
    Device::new(common::config().compute_units(2)).expect("host device")
}

#[test]
fn counter_sees_this_threads_allocations_only() {
    let before = allocs();
    let v = std::hint::black_box(vec![1u8; 64]);
    assert_eq!(allocs() - before, 1);
    drop(v);
    let before = allocs();
    std::thread::spawn(|| std::hint::black_box(vec![0u64; 1024]))
        .join()
        .expect("thread");
    // Spawning allocates here (thread handle, closure box); the other thread's
    // vector does not count here. Only check the counter stays bounded.
    assert!(allocs() - before < 64);
}

#[test]
fn launching_a_built_kernel_allocates_nothing() {
    let dev = device();
    let s = dev.create_stream().expect("stream");
    let k = Kernel::new("empty", |_| {}).wgsl(common::wgsl::nothing(0), "main");
    let grid = Grid::new(1);
    // Warm-up: first use of any lazily initialised state.
    for _ in 0..1000 {
        s.launch(&k, grid, &[]).expect("launch");
    }
    s.synchronize().expect("synchronize");

    let before = allocs();
    for round in 0..20 {
        for _ in 0..500 {
            s.launch(&k, grid, &[]).expect("launch");
        }
        s.synchronize().expect("synchronize");
        assert_eq!(
            allocs() - before,
            0,
            "allocations after {} launches",
            (round + 1) * 500
        );
    }
}

#[test]
fn launching_with_buffer_args_fills_and_copies_allocate_nothing() {
    let dev = device();
    let s = dev.create_stream().expect("stream");
    let a = dev.alloc::<u32>(64).expect("alloc");
    let b = dev.alloc::<u32>(64).expect("alloc");
    let k = Kernel::new("touch", |blk| {
        let x = blk.read::<u32>(0)[0];
        blk.write::<u32>(0)[0] = x;
    })
    .wgsl(
        common::wgsl::map("u32", 1, "select(y[i], x0[0], i == 0u)"),
        "main",
    );
    let grid = Grid::new(1);
    let round = || {
        for _ in 0..100 {
            s.launch(&k, grid, &[Arg::read(&a), Arg::write(&b)])
                .expect("launch");
            s.fill(&a, 7u32).expect("fill");
            s.copy_d2d_range(&a, 0, &b, 8, 8).expect("copy");
        }
        s.synchronize().expect("synchronize");
    };
    round();
    let before = allocs();
    for _ in 0..10 {
        round();
    }
    assert_eq!(allocs() - before, 0);
}

#[test]
fn re_recording_an_event_and_waiting_on_it_allocate_nothing() {
    let dev = device();
    let (s, t) = (
        dev.create_stream().expect("s"),
        dev.create_stream().expect("t"),
    );
    let k = Kernel::new("empty", |_| {}).wgsl(common::wgsl::nothing(0), "main");
    let mut e = hetero::Event::new();
    let round = |e: &mut hetero::Event| {
        for _ in 0..100 {
            s.launch(&k, Grid::new(1), &[]).expect("launch");
            s.record(e).expect("record");
            t.wait_event(e).expect("wait");
            t.launch(&k, Grid::new(1), &[]).expect("launch");
            // The marker op holds the stamp until it runs: completing it frees
            // the cell for the next record.
            e.synchronize().expect("event");
        }
        t.synchronize().expect("synchronize");
    };
    round(&mut e);
    let before = allocs();
    for _ in 0..10 {
        round(&mut e);
    }
    assert_eq!(allocs() - before, 0, "re-recording allocated");
}

/// A task's launch reuses the span (its start and end stamps) of a task seen
/// complete that nothing else holds: empty tasks whose handles are dropped
/// make fewer than one allocation per ten once the pools are full (each made
/// one span before).
#[test]
fn submitting_empty_tasks_allocates_less_than_once_per_task() {
    let devs = [device(), device()];
    let ctx = hetero::Context::new(&devs).expect("context");
    ctx.set_perfmodel_dir(None);
    let k = Kernel::new("empty", |_| {}).wgsl(common::wgsl::nothing(0), "main");
    // Task data keeps the context's task runtime (its streams) between
    // batches, as a program's data does.
    let _keep = ctx.data::<u8>(1).expect("data");
    // Warm-up. First each device's stream pool, to its bound: tasks held
    // behind a gate keep every stream busy, so each takes a stream of its
    // own. (A pool grows whenever the stream next in turn is still busy, so
    // without this how far it grew in the warm-up, and so how many streams
    // the measured tasks made, depended on how fast the devices ran.)
    for (d, dev) in devs.iter().enumerate() {
        let gate = dev.host_event();
        for _ in 0..hetero::MAX_TASK_STREAMS {
            ctx.task(&k)
                .on_device(d)
                .after(gate.event())
                .submit()
                .expect("task");
        }
        gate.signal();
    }
    // Then calibration and the lists the layer keeps.
    for _ in 0..2000 {
        ctx.task(&k).submit().expect("task");
    }
    ctx.wait_tasks().expect("tasks");
    let streams = ctx.task_stats().streams_made;
    assert_eq!(streams, (devs.len() * hetero::MAX_TASK_STREAMS) as u64);
    let n = 4000;
    let before = allocs();
    for i in 0..n {
        ctx.task(&k).submit().expect("task");
        if i % 500 == 499 {
            ctx.wait_tasks().expect("tasks");
        }
    }
    let made = allocs() - before;
    eprintln!("{made} allocations for {n} tasks");
    assert_eq!(
        ctx.task_stats().streams_made,
        streams,
        "a full pool made a stream"
    );
    assert!(made < n / 10, "{made} allocations for {n} tasks");
}

/// A placed graph's relaunch allocates a few lists per launch (the events
/// handed back, the events of copies back into start replicas), not one
/// span per stream it ends: each stream's last launch stamps a span that
/// the next launch reuses once nothing else holds it. (Where streams have
/// fault scopes the plan ends a stream per compute unit, a few; else one
/// per chain of tasks, one per task here.) Its tasks are bound to the data's
/// device: HEFT spread them over both devices in about one run in three on
/// two Vulkan devices, and a copy between devices with no direct path,
/// staged through pinned host memory, allocates about nine times per
/// launch (its staging buffers, events and callback), past this bound.
/// The copies' own allocations are not what this test counts.
#[test]
fn relaunching_a_placed_graph_allocates_less_than_once_per_stream() {
    let devs = [device(), device()];
    let ctx = hetero::Context::new(&devs).expect("context");
    ctx.set_perfmodel_dir(None);
    let k = Kernel::new("inc", |b| {
        b.write::<u32>(0).iter_mut().for_each(|v| *v += 1)
    })
    .wgsl(common::wgsl::map("u32", 0, "y[i] + 1u"), "main");
    // Independent tasks: each its own chain, so the plan ends many streams.
    let data: Vec<_> = (0..32)
        .map(|_| ctx.data_from(&[0u32; 4]).expect("data"))
        .collect();
    let mut g = hetero::TaskGraph::new();
    for d in &data {
        ctx.task(&k)
            .read_write(d)
            .on_device(0)
            .record(&mut g)
            .expect("record");
    }
    let placed = g.instantiate_on(&ctx).expect("instantiate");
    let streams = placed.launch().expect("launch").events().len() as u64;
    ctx.wait_tasks().expect("tasks");
    for _ in 0..3 {
        placed.launch().expect("launch");
        ctx.wait_tasks().expect("tasks");
    }
    // Launches only: in virtual time the waits run the device's work on
    // this thread.
    let (launches, mut made) = (20, 0);
    for _ in 0..launches {
        let before = allocs();
        placed.launch().expect("launch");
        made += allocs() - before;
        ctx.wait_tasks().expect("tasks");
    }
    eprintln!("{made} allocations for {launches} launches ending {streams} streams each");
    assert!(streams >= 2, "the plan ends {streams} streams");
    let tasks = data.len() as u64;
    assert!(
        made < launches * streams.max(tasks),
        "{made} allocations for {launches} launches of {tasks} tasks ending {streams} streams each"
    );
    for d in &data {
        assert_eq!(d.to_vec().expect("read"), vec![1 + 3 + launches as u32; 4]);
    }
}
