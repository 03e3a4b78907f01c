//! Device pool behaviour through the public API.

mod common;

use common::{CompleteOnDrop, ManualFence, Streams};
use hetero_memory::{
    BlockState, ChunkSource, DevicePool, HostChunkSource, HostOptions, MemoryError, PoolConfig,
    ReusePolicy, StreamPoint,
};
use std::sync::Arc;

const S: u64 = 1;
const T: u64 = 2;

fn pool(c: PoolConfig) -> DevicePool {
    DevicePool::new(c).expect("pool")
}

#[test]
fn same_stream_reuse_is_immediate() {
    let p = pool(PoolConfig::default());
    let a = p.alloc(1000, 0, S).expect("a");
    let addr = a.ptr();
    p.free(a, S, Vec::new());
    let b = p.alloc(900, 256, S).expect("b");
    assert_eq!(b.ptr(), addr, "a block freed on S serves S at once");
    assert!(b.wait_for().is_empty());
    p.free(b, S, Vec::new());
    let st = p.stats();
    assert_eq!(st.allocations, 2);
    assert_eq!(st.cache_hits, 1);
}

#[test]
fn other_stream_does_not_get_a_block_before_its_fence() {
    let p = pool(PoolConfig::default());
    let streams = Arc::new(Streams::default());
    p.set_stream_points(streams.clone());
    let a = p.alloc(4096, 0, S).expect("a");
    let addr = a.ptr();
    p.free(a, S, Vec::new()); // S's kernel on it has not finished
    let b = p.alloc(4096, 0, T).expect("b");
    assert_ne!(b.ptr(), addr);
    p.free(b, T, Vec::new());
}

/// Pool of one 2 MiB chunk: T can only get memory by reusing S's block.
fn tight(policy: ReusePolicy) -> (DevicePool, Arc<Streams>) {
    let p = pool(PoolConfig::default().max_reserved(2 << 20).reuse(policy));
    let streams = Arc::new(Streams::default());
    p.set_stream_points(streams.clone());
    (p, streams)
}

#[test]
fn follow_event_dependencies_hands_the_fence_over() {
    let (p, streams) = tight(ReusePolicy::FollowEventDependencies);
    let a = p.alloc(1 << 20, 0, S).expect("a");
    let keep = p.alloc(1 << 20, 0, S).expect("fills the chunk");
    let addr = a.ptr();
    p.free(a, S, Vec::new());
    let b = p.alloc(1 << 20, 0, T).expect("reuse with a dependency");
    assert_eq!(b.ptr(), addr);
    assert_eq!(b.wait_for().len(), 1, "T must wait for S's work");
    assert!(!b.wait_for()[0].is_complete());
    streams.tail(S).complete();
    assert!(b.wait_for()[0].is_complete());
    p.free(b, T, Vec::new());
    p.free(keep, S, Vec::new());
}

#[test]
fn a_queued_free_is_flagged_on_its_stream_and_fenced_elsewhere() {
    let (p, streams) = tight(ReusePolicy::FollowEventDependencies);
    let a = p.alloc(1 << 20, 0, S).expect("a");
    let keep = p.alloc(1 << 20, 0, S).expect("fills the chunk");
    let addr = a.ptr();
    assert!(!a.reused_in_stream_order(), "fresh memory");
    p.free(a, S, Vec::new());
    let b = p.alloc(1 << 20, 0, S).expect("b");
    assert_eq!(b.ptr(), addr);
    assert!(
        b.reused_in_stream_order(),
        "S's queued work may still use it: later users elsewhere must wait"
    );
    assert!(b.wait_for().is_empty(), "on S itself stream order suffices");
    p.free(b, S, Vec::new());
    let c = p.alloc(1 << 20, 0, T).expect("c");
    assert_eq!(c.ptr(), addr);
    assert_eq!(c.wait_for().len(), 1);
    assert!(!c.reused_in_stream_order());
    streams.tail(S).complete();
    p.free_completed(c, T);
    p.free(keep, S, Vec::new());
}

#[test]
fn a_completed_free_reaches_other_streams_without_a_fence() {
    let (p, streams) = tight(ReusePolicy::Opportunistic);
    let a = p.alloc(1 << 20, 0, S).expect("a");
    let keep = p.alloc(1 << 20, 0, S).expect("fills the chunk");
    let addr = a.ptr();
    p.free_completed(a, S);
    // S's tail never completes: a completed free must not wait for it.
    let b = p.alloc(1 << 20, 0, T).expect("no fence to wait for");
    assert_eq!(b.ptr(), addr);
    assert!(b.wait_for().is_empty());
    assert!(!b.reused_in_stream_order());
    assert!(!streams.tail(S).is_complete());
    p.free_completed_uncached(b, T);
    p.free_completed(keep, S);
    assert_eq!(p.stats().allocated, 0);
}

#[test]
fn opportunistic_and_internal_never_reuse_before_the_fence() {
    for policy in [
        ReusePolicy::Opportunistic,
        ReusePolicy::InternalDependencies,
    ] {
        let (p, streams) = tight(policy);
        let a = p.alloc(1 << 20, 0, S).expect("a");
        let keep = p.alloc(1 << 20, 0, S).expect("fills the chunk");
        p.free(a, S, Vec::new());
        let fence = streams.tail(S);
        let _release = CompleteOnDrop(fence.clone());
        let f2 = fence.clone();
        // S's work ends only once the allocation below blocks on its fence.
        let slow_kernel = std::thread::spawn(move || {
            f2.wait_for_waiter();
            f2.complete();
        });
        let b = p.alloc(1 << 20, 0, T).expect("after the fence");
        assert!(
            fence.is_complete(),
            "{policy:?}: handed out before S's work finished"
        );
        assert!(b.wait_for().is_empty());
        slow_kernel.join().expect("thread");
        p.free(b, T, Vec::new());
        p.free(keep, S, Vec::new());
    }
}

#[test]
fn record_stream_uses_hold_the_block() {
    let p = pool(PoolConfig::default().reuse(ReusePolicy::Opportunistic));
    let a = p.alloc(3 << 20, 0, S).expect("a");
    let addr = a.ptr();
    let use_on_t = ManualFence::new();
    p.free(a, S, vec![use_on_t.clone() as Arc<dyn StreamPoint>]);
    let b = p.alloc(3 << 20, 0, S).expect("b");
    assert_ne!(b.ptr(), addr, "still in use on T");
    use_on_t.complete();
    let c = p.alloc(3 << 20, 0, S).expect("c");
    assert_eq!(c.ptr(), addr, "reused once T's use completed");
    p.free(b, S, Vec::new());
    p.free(c, S, Vec::new());
}

#[test]
fn out_of_memory_recovers_what_it_can_then_names_the_figures() {
    let p = pool(PoolConfig::default().max_reserved(20 << 20));
    let mut live = Vec::new();
    while let Ok(a) = p.alloc(512 << 10, 0, S) {
        live.push(a);
    }
    assert_eq!(live.len(), 40);
    let e = p.alloc(512 << 10, 0, S).unwrap_err();
    let msg = e.to_string();
    match e {
        MemoryError::OutOfMemory {
            requested,
            reserved,
            allocated,
            ..
        } => {
            assert_eq!(requested.0, 512 << 10);
            assert_eq!(reserved.0, 20 << 20);
            assert_eq!(allocated.0, 20 << 20);
        }
        other => panic!("{other}"),
    }
    assert!(msg.contains("max_reserved_mb"), "{msg}");
    // Blocks cached on another stream are recovered and their chunks released
    // so a 20 MiB chunk for a large request fits under the limit.
    for a in live.drain(..) {
        p.free(a, T, Vec::new());
    }
    assert!(p.stats().cached > 0);
    let big = p
        .alloc(3 << 20, 0, S)
        .expect("cached small blocks released for a large request");
    assert_eq!(p.stats().reserved, 20 << 20);
    p.free(big, S, Vec::new());
    // Fragmented: every other buffer live.
    let p = pool(PoolConfig::default().max_reserved(2 << 20));
    let all: Vec<_> = (0..8)
        .map(|_| p.alloc(256 << 10, 0, S).expect("fill"))
        .collect();
    for (i, a) in all.into_iter().enumerate() {
        if i % 2 == 0 {
            p.free(a, S, Vec::new());
        } else {
            live.push(a);
        }
    }
    let e = p.alloc(512 << 10, 0, S).unwrap_err();
    match &e {
        MemoryError::OutOfMemory {
            free_fragmented,
            largest_free,
            ..
        } => {
            assert_eq!(free_fragmented.0, 1 << 20);
            assert_eq!(largest_free.0, 256 << 10);
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("fragmented"), "{e}");
    for a in live {
        p.free(a, S, Vec::new());
    }
}

#[test]
fn no_os_calls_after_warm_up() {
    let p = pool(PoolConfig::default());
    let sizes = [
        256usize,
        4000,
        65536,
        300_000,
        1 << 20,
        3 << 20,
        9 << 20,
        24 << 20,
    ];
    let round = |p: &DevicePool| {
        let v: Vec<_> = sizes
            .iter()
            .map(|&s| p.alloc(s, 0, S).expect("alloc"))
            .collect();
        for a in v {
            p.free(a, S, Vec::new());
        }
    };
    round(&p);
    let warm = p.stats().os_calls;
    assert!(warm.mmap > 0);
    for _ in 0..200 {
        round(&p);
    }
    assert_eq!(p.stats().os_calls, warm, "hot path made syscalls");
    assert!(p.stats().hit_rate > 0.5, "{}", p.stats().hit_rate);
}

#[test]
fn trim_returns_every_byte() {
    let p = pool(PoolConfig::default());
    let v: Vec<_> = (0..50)
        .map(|i| p.alloc(1000 + i * 50_000, 0, i as u64 % 3).expect("alloc"))
        .collect();
    assert!(p.stats().allocated >= v.iter().map(|a| a.size()).sum::<usize>());
    for a in v {
        p.free(a, 0, Vec::new());
    }
    let reserved = p.stats().reserved;
    assert_eq!(p.trim(), reserved);
    let s = p.stats();
    assert_eq!((s.allocated, s.reserved, s.cached, s.chunks), (0, 0, 0, 0));
    let calls = s.os_calls;
    assert_eq!(
        calls.mmap - calls.munmap,
        0,
        "every mapping unmapped (THP trims count as munmaps)"
    );
}

#[test]
fn snapshot_lists_chunks_blocks_and_states() {
    let p = pool(PoolConfig::default());
    let live = p.alloc(1000, 0, S).expect("live");
    let cached = p.alloc(5000, 0, T).expect("cached");
    p.free(cached, T, Vec::new());
    let held = p.alloc(2 << 20, 0, S).expect("held");
    p.free(held, S, vec![ManualFence::new() as Arc<dyn StreamPoint>]);
    let snap = p.snapshot();
    let blocks: Vec<_> = snap.chunks.iter().flat_map(|c| c.blocks.iter()).collect();
    let find = |st: BlockState| blocks.iter().find(|b| b.state == st).copied();
    assert_eq!(find(BlockState::Live).expect("live").stream, Some(S));
    assert_eq!(
        find(BlockState::StreamCached).expect("cached").stream,
        Some(T)
    );
    assert_eq!(
        find(BlockState::PendingFree).expect("pending").stream,
        Some(S)
    );
    assert!(find(BlockState::Free).is_some());
    let json = p.snapshot_json();
    assert!(json["chunks"][0]["blocks"].is_array());
    assert!(json["stats"]["os_calls"]["mmap"].as_u64().expect("mmap") > 0);
    p.free(live, S, Vec::new());
}

#[test]
fn bad_requests_are_typed_errors() {
    let p = pool(PoolConfig::default());
    for (size, align) in [(0, 0), (10, 3), (10, 4 << 20), (usize::MAX, 0)] {
        assert!(matches!(
            p.alloc(size, align, S),
            Err(MemoryError::InvalidRequest { .. })
        ));
    }
}

#[test]
fn alignment_up_to_two_mib() {
    let p = pool(PoolConfig::default());
    let mut v = Vec::new();
    for shift in 8..=21 {
        let align = 1usize << shift;
        let a = p.alloc(1000 + shift, align, S).expect("aligned");
        assert_eq!(a.ptr().as_ptr() as usize % align, 0);
        v.push(a);
    }
    for a in v {
        p.free(a, S, Vec::new());
    }
}

#[test]
fn growth_trace_keeps_reserved_close_to_live() {
    let p = pool(PoolConfig::default());
    let mut peak_live = 0usize;
    for n in 1..=24usize {
        let sizes = [n * (384 << 10), n * (1536 << 10), n * (5 << 20)];
        let v: Vec<_> = sizes
            .iter()
            .map(|&s| p.alloc(s, 0, S).expect("alloc"))
            .collect();
        peak_live = peak_live.max(sizes.iter().sum());
        for a in v {
            p.free(a, S, Vec::new());
        }
    }
    let ratio = p.stats().peak_reserved as f64 / peak_live as f64;
    eprintln!("peak reserved / peak live = {ratio:.3}");
    assert!(ratio <= 1.10, "peak reserved / peak live = {ratio}");
}

#[test]
fn huge_only_policy_without_reserved_pages_errors() {
    let src = Arc::new(HostChunkSource::new(HostOptions {
        huge_pages: hetero_memory::HugePagePolicy::HugeOnly,
        refuse_hugetlb: true,
        ..HostOptions::default()
    }));
    let p = DevicePool::with_source(PoolConfig::default(), src.clone()).expect("pool");
    let e = p.alloc(100, 0, S).unwrap_err();
    assert!(matches!(e, MemoryError::HugePagesUnavailable { .. }), "{e}");
    assert_eq!(src.os_calls().munmap, 0);
}

#[test]
fn streams_on_threads_never_share_bytes() {
    let p = Arc::new(pool(PoolConfig::default()));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut live = Vec::new();
                for i in 0..2000usize {
                    let size = 64 + (i * 7919 + t as usize * 104_729) % 200_000;
                    let a = p.alloc(size, 0, t).expect("alloc");
                    // SAFETY: the allocation owns `size` writable bytes.
                    unsafe { std::ptr::write_bytes(a.ptr().as_ptr(), t as u8, a.size()) };
                    live.push(a);
                    if i % 3 != 0 {
                        let a = live.swap_remove(i % live.len());
                        // SAFETY: as above; nobody else wrote into it.
                        let bytes =
                            unsafe { std::slice::from_raw_parts(a.ptr().as_ptr(), a.size()) };
                        assert!(
                            bytes.iter().all(|b| *b == t as u8),
                            "another stream wrote into our buffer"
                        );
                        p.free(a, t, Vec::new());
                    }
                }
                for a in live {
                    p.free(a, t, Vec::new());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    p.trim();
    assert_eq!(p.stats().reserved, 0);
}

#[test]
fn config_from_env() {
    std::env::set_var(
        "HETERO_ALLOC_CONF",
        "max_reserved_mb:16,reuse:opportunistic",
    );
    let c = PoolConfig::from_env().expect("valid");
    std::env::remove_var("HETERO_ALLOC_CONF");
    assert_eq!(c.max_reserved, 16 << 20);
    assert_eq!(c.reuse, ReusePolicy::Opportunistic);
}

#[cfg(hetero_asan)]
#[test]
fn freed_buffers_are_poisoned() {
    let p = pool(PoolConfig::default());
    let a = p.alloc(1000, 0, S).expect("a");
    let ptr = a.ptr().as_ptr();
    assert!(!hetero_memory::is_poisoned(ptr));
    p.free(a, S, Vec::new());
    assert!(
        hetero_memory::is_poisoned(ptr),
        "a stale view would not be caught"
    );
    let b = p.alloc(1000, 0, S).expect("b");
    assert!(!hetero_memory::is_poisoned(b.ptr().as_ptr()));
    p.free_completed(b, S);
    assert!(hetero_memory::is_poisoned(ptr));
}

#[cfg(hetero_asan)]
#[test]
fn queued_frees_are_poisoned_when_their_fence_completes() {
    let (p, streams) = tight(ReusePolicy::FollowEventDependencies);
    let a = p.alloc(1 << 20, 0, S).expect("a");
    let keep = p.alloc(1 << 20, 0, S).expect("keeps the chunk mapped");
    let ptr = a.ptr().as_ptr();
    p.free(a, S, Vec::new());
    assert!(
        !hetero_memory::is_poisoned(ptr),
        "S's queued work may still touch it"
    );
    streams.tail(S).complete();
    p.trim();
    assert!(hetero_memory::is_poisoned(ptr), "back in the chunks");
    p.free_completed(keep, S);
}

/// Run in a child process by `stale_read_is_reported`: reads a freed buffer.
#[cfg(hetero_asan)]
#[test]
#[ignore = "run by stale_read_is_reported in a child process"]
fn stale_read_child() {
    if std::env::var_os("HETERO_ASAN_CHILD").is_none() {
        return;
    }
    let p = pool(PoolConfig::default());
    let a = p.alloc(1000, 0, S).expect("a");
    let stale = a.ptr().as_ptr();
    p.free(a, S, Vec::new());
    // SAFETY: deliberately not: this read is the use-after-free ASan must report.
    let v = unsafe { std::ptr::read_volatile(stale) };
    println!("read {v} without a report");
}

#[cfg(hetero_asan)]
#[test]
fn stale_read_is_reported() {
    let out = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args(["--exact", "stale_read_child", "--ignored", "--nocapture"])
        .env("HETERO_ASAN_CHILD", "1")
        .output()
        .expect("child");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the stale read went unnoticed");
    assert!(err.contains("use-after-poison"), "{err}");
}

#[test]
fn pitched_rows_are_aligned() {
    let p = pool(PoolConfig::default());
    let (a, pitch) = p.alloc_pitched(1920 * 3, 1080, 512, S).expect("image");
    assert_eq!(pitch % 512, 0);
    assert!((1920 * 3..1920 * 3 + 512).contains(&pitch));
    assert_eq!(a.ptr().as_ptr() as usize % 512, 0);
    assert_eq!(a.size(), pitch * 1080);
    p.free(a, S, Vec::new());
    assert!(p.alloc_pitched(0, 10, 0, S).is_err());
    assert!(p.alloc_pitched(10, 10, 3, S).is_err());
}

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<DevicePool>();
    check::<hetero_memory::Allocation>();
    check::<hetero_memory::PinnedPool>();
    check::<hetero_memory::PinnedAllocation>();
}

#[test]
fn idle_thread_returns_its_cache_on_next_call_after_trim() {
    use std::sync::mpsc;
    let p = Arc::new(pool(PoolConfig::default()));
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let p2 = p.clone();
    let worker = std::thread::spawn(move || {
        let a = p2.alloc(4096, 0, 7).expect("a");
        p2.free(a, 7, Vec::new()); // into this thread's cache
        done_tx.send(()).expect("send");
        go_rx.recv().expect("recv");
        let b = p2.alloc(8192, 0, 7).expect("b");
        p2.free(b, 7, Vec::new()); // sees the new epoch: returns the stale block, b goes to the slot
        done_tx.send(()).expect("send");
        go_rx.recv().expect("recv");
        let c = p2.alloc(4096, 0, 7).expect("c");
        p2.free(c, 7, Vec::new()); // held by this thread's cache until it exits
    });
    done_rx.recv().expect("first round");
    p.trim();
    assert!(
        p.stats().reserved > 0,
        "the idle worker still holds a block"
    );
    go_tx.send(()).expect("go");
    done_rx.recv().expect("second round");
    p.trim();
    assert_eq!(
        p.stats().reserved,
        0,
        "the worker gave its stale block back"
    );
    go_tx.send(()).expect("exit");
    worker.join().expect("worker");
    assert_eq!(
        p.stats().allocated,
        0,
        "thread exit returned its cache to the pool"
    );
    p.trim();
    assert_eq!(p.stats().reserved, 0);
}

#[test]
fn release_threshold_unmaps_idle_chunks_on_free() {
    let p = pool(PoolConfig::default().release_threshold(0));
    let a = p.alloc(3 << 20, 0, S).expect("large");
    assert_eq!(p.stats().reserved, 20 << 20);
    p.free(a, S, Vec::new());
    assert_eq!(p.stats().reserved, 0);
}

#[test]
fn a_dropped_pool_does_not_pin_the_thread_cache() {
    let a = pool(PoolConfig::default());
    let x = a.alloc(4096, 0, S).expect("x");
    a.free(x, S, Vec::new());
    drop(a);
    let b = pool(PoolConfig::default());
    for _ in 0..3 {
        let y = b.alloc(4096, 0, S).expect("y");
        b.free(y, S, Vec::new());
    }
    assert_eq!(b.stats().cache_hits, 2);
    b.trim();
    assert_eq!(b.stats().reserved, 0);
}

/// The work behind a queued free may wait for the allocating thread itself (a
/// host event it signals after allocating): a request past the grow ratio
/// waits for that free only a bounded time, then grows, in both pool layouts.
#[test]
fn a_free_that_never_comes_does_not_hold_a_growing_request() {
    // Chunks: 18 MiB do not fit beside the pending 3 MiB in its 20 MiB chunk.
    // Segments: 3 MiB more granules. Either way growing takes reserved past
    // 1.25x what is in use, so the pool first waits for the free, in vain.
    for (expandable, second) in [(false, 18 << 20), (true, 3 << 20)] {
        let p = pool(
            PoolConfig::default()
                .reuse(ReusePolicy::Opportunistic)
                .expandable_segments(expandable),
        );
        let a = p.alloc(3 << 20, 0, S).expect("a");
        let never = ManualFence::new();
        p.free(a, S, vec![never.clone() as Arc<dyn StreamPoint>]);
        let b = p.alloc(second, 0, S).expect("grows after a bounded wait");
        assert!(
            p.stats().grow_waits >= 1,
            "expandable {expandable}: it waited first"
        );
        never.complete();
        p.free(b, S, Vec::new());
    }
}
