//! Device memory through the public API: stream-ordered allocation, reuse, stats,
//! configuration errors, out-of-memory errors.

mod common;

use common::Gate;
use hetero::{Arg, Device, Error, Grid, Kernel, PoolConfig};

fn dev() -> Device {
    Device::new(common::config().compute_units(2)).expect("host device")
}

#[test]
fn memory_a_slow_kernel_uses_is_not_reused_by_another_stream() {
    if common::skipped("memory_a_slow_kernel_uses_is_not_reused_by_another_stream") {
        return;
    }
    let d = dev();
    let s = d.create_stream().unwrap();
    let t = d.create_stream().unwrap();
    let n = 64 * 1024;
    let x = s.alloc::<u32>(n).unwrap();
    let seen = d.alloc::<u32>(2).unwrap();
    // The kernel writes its buffer, waits at the gate while t allocates and
    // fills, then looks whether anybody else wrote it: it writes x[0] and how
    // many elements are not 1 into `seen`.
    let running = Gate::new();
    let wait = running.waiter();
    let k = Kernel::new("slow-owner", move |b| {
        let out = b.write::<u32>(0);
        out.fill(1);
        wait();
        let differ = out.iter().filter(|v| **v != 1).count() as u32;
        b.write::<u32>(1).copy_from_slice(&[out[0], differ]);
    })
    .wgsl(SLOW_OWNER, "main");
    s.launch(&k, Grid::new(1), &[Arg::write(&x), Arg::write(&seen)])
        .unwrap();
    // Device code has no gate: its twin is slow instead, reading its buffer
    // 40 times over, and t's work starts while it is in flight (or still
    // queued: the drop below comes right after the launch either way). The
    // Vulkan device orders t's fills after the recorded kernel on its one
    // queue, so there this checks the pool's side (t's buffers while the
    // kernel's memory is pending, and the kernel's result after) rather than
    // a race the gate makes certain.
    if !d.properties().runs_device_code {
        running.wait_reached();
    }
    drop(x); // stream-ordered free while the kernel runs
    for _ in 0..8 {
        let y = t.alloc::<u32>(n).unwrap();
        t.fill(&y, 2).unwrap();
        t.synchronize().unwrap();
    }
    running.open();
    s.synchronize().expect("the kernel ran");
    assert_eq!(
        s.read_to_vec(&seen).unwrap(),
        vec![1, 0],
        "memory was reused under a running kernel"
    );
}

/// The WGSL twin of `slow-owner`: one workgroup writes 1s, reads them back
/// 40 times (each invocation its own elements: 41 000 loop iterations, under
/// lavapipe's limit), and writes what it saw.
const SLOW_OWNER: &str = "
@group(0) @binding(0) var<storage, read_write> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> seen: array<u32>;
var<workgroup> differ: atomic<u32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lane: u32) {
    if (lane == 0u) { atomicStore(&differ, 0u); }
    var i = lane;
    loop {
        if (i >= arrayLength(&x)) { break; }
        x[i] = 1u;
        i = i + 64u;
    }
    workgroupBarrier();
    for (var round = 0u; round < 40u; round = round + 1u) {
        i = lane;
        loop {
            if (i >= arrayLength(&x)) { break; }
            if (x[i] != 1u) { atomicAdd(&differ, 1u); }
            i = i + 64u;
        }
    }
    workgroupBarrier();
    if (lane == 0u) { seen[0] = x[0]; seen[1] = atomicLoad(&differ); }
}
";

#[test]
fn memory_same_stream_reuse_hits_the_cache_without_os_calls() {
    let d = dev();
    let s = d.create_stream().unwrap();
    // Each round keeps up to 8 buffers in flight; memory returns to the pool when
    // their last use completes, so after a warm-up round the pool has what it needs.
    let round = || {
        for _ in 0..8 {
            let b = s.alloc::<u8>(64 * 1024).unwrap();
            s.fill(&b, 7).unwrap();
        }
        s.synchronize().unwrap();
    };
    for _ in 0..4 {
        round();
    }
    let before = d.memory_stats();
    for _ in 0..125 {
        round();
    }
    let after = d.memory_stats();
    assert_eq!(
        before.os_calls.total(),
        after.os_calls.total(),
        "OS calls on the hot path after warm-up"
    );
    assert!(after.cache_hits > before.cache_hits);
    assert!(after.allocations >= before.allocations + 1000);
}

#[test]
fn memory_snapshot_and_trim() {
    let d = dev();
    let s = d.create_stream().unwrap();
    let keep = s.alloc::<f32>(1000).unwrap();
    {
        let _tmp = s.alloc::<f32>(300_000).unwrap();
    }
    let snap = d.memory_snapshot();
    assert!(!snap.chunks.is_empty());
    let stats = d.memory_stats();
    assert!(stats.reserved >= stats.allocated);
    assert!(stats.allocated >= 4000);
    let _ = d.trim();
    s.fill(&keep, 1.0).unwrap();
    assert_eq!(s.read_to_vec(&keep).unwrap()[999], 1.0);
}

#[test]
fn memory_out_of_memory_is_a_typed_error_with_figures() {
    let d =
        Device::new(common::config().memory(PoolConfig::default().max_reserved(24 << 20))).unwrap();
    let s = d.create_stream().unwrap();
    let _a = s.alloc::<u8>(16 << 20).unwrap();
    let err = s.alloc::<u8>(16 << 20).unwrap_err();
    assert!(matches!(err, Error::Memory(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("requested"), "{msg}");
}

#[test]
fn memory_bad_pool_config_is_an_error_listing_keys() {
    let err = PoolConfig::parse("no_such_key:1").unwrap_err().to_string();
    assert!(err.contains("no_such_key"), "{err}");
    assert!(
        err.contains("max_split_size") || err.contains("valid"),
        "{err}"
    );
}

#[test]
fn memory_pinned_buffers_come_from_the_pinned_pool() {
    let d = dev();
    let before = d.pinned_stats();
    let bufs: Vec<_> = (0..8)
        .map(|_| d.alloc_pinned::<u8>(64 * 1024).unwrap())
        .collect();
    drop(bufs);
    let again: Vec<_> = (0..8)
        .map(|_| d.alloc_pinned::<u8>(64 * 1024).unwrap())
        .collect();
    let after = d.pinned_stats();
    assert!(format!("{after:?}") != format!("{before:?}"));
    drop(again);
}

/// Readback pinned memory (HOST_CACHED on Vulkan) receives what the device
/// wrote, byte for byte, also at an offset and after reuse; it serves as a
/// copy source too, and a read from the device into pageable memory (staged
/// through readback memory on Vulkan) agrees.
#[test]
fn memory_readback_pinned_buffers_receive_device_writes() {
    let d = dev();
    let s = d.create_stream().unwrap();
    for round in 0..3u32 {
        let n = 1000 + 4096 * round as usize;
        let host: Vec<u32> = (0..n as u32).map(|i| i ^ round).collect();
        let src = d.pinned_from_slice(&host).unwrap();
        let x = s.alloc::<u32>(n).unwrap();
        s.copy_h2d(&src, &x).unwrap();
        let mut back = d.alloc_pinned_readback::<u32>(n).unwrap();
        back.as_mut_slice().unwrap().fill(0);
        s.copy_d2h(&x, &mut back).unwrap();
        s.synchronize().unwrap();
        assert_eq!(back.as_slice().unwrap(), &host[..]);
        let y = s.alloc::<u32>(n).unwrap();
        s.copy_h2d(&back, &y).unwrap();
        assert_eq!(s.read_to_vec(&y).unwrap(), host);
    }
    assert_eq!(d.alloc_pinned_readback::<u32>(0).unwrap().len(), 0);
}

/// A buffer dropped with no work on it may stay with this thread, memory and
/// all, for the next allocation of its size on its stream (no trip through
/// the pool). The pool's figures must not see that as memory in use: on this
/// thread it counts as cached, its reuse as a cache hit, and trim returns it.
#[test]
fn memory_a_dropped_idle_buffer_counts_as_free_and_trim_returns_it() {
    let d = dev();
    let s = d.create_stream().unwrap();
    let base = d.memory_stats();
    for _ in 0..8 {
        drop(s.alloc::<u8>(4096).unwrap());
    }
    let st = d.memory_stats();
    assert_eq!(
        st.allocated, base.allocated,
        "an idle dropped buffer counted as in use"
    );
    assert_eq!(st.allocations, base.allocations + 8);
    assert!(st.cache_hits >= base.cache_hits + 7, "{st:?}");
    drop(s.alloc::<u8>(4096).unwrap());
    d.trim();
    assert_eq!(
        d.memory_stats().reserved,
        0,
        "trim kept memory of a dropped buffer"
    );
}

/// What this thread keeps of dropped buffers goes back to the pool before an
/// allocation it would otherwise fail for lack of memory.
#[test]
fn memory_kept_buffers_give_way_to_an_allocation_that_needs_their_memory() {
    let d =
        Device::new(common::config().memory(PoolConfig::default().max_reserved(2 << 20))).unwrap();
    let (s, t) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    // One 2 MiB chunk fits two of these: after the first is dropped on `s`,
    // the second on `t` needs its memory.
    const N: usize = 900 << 10;
    drop(s.alloc::<u8>(N).unwrap());
    let a = t.alloc::<u8>(N).unwrap();
    let b = t.alloc::<u8>(N);
    assert!(b.is_ok(), "{:?}", b.err());
    drop((a, b));
}
