//! Async ops (`Stream::enqueue_async`): work outside the device, started when it
//! reaches the front of its stream and polled by the device's own engines until
//! another thread finishes it. Runs on every backend (`HETERO_BACKEND`).

mod common;

use hetero::{AsyncArg, AsyncContext, CompletionMode, Device, Error};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

/// An op whose work another thread does: the first poll hands the buffer's
/// address to a thread that waits at `go` (a gate the test opens), writes
/// `value` into every byte and then says it is done; later polls report that.
fn by_thread(
    go: impl Fn() + Send + 'static,
    value: u8,
    started_after: Arc<AtomicBool>,
    before: Arc<AtomicBool>,
) -> impl FnMut(&mut AsyncContext<'_>) -> Poll<Result<(), String>> + Send + 'static {
    let done = Arc::new(AtomicBool::new(false));
    let mut go = Some(go);
    let mut worker = None;
    move |cx| {
        if worker.is_none() {
            started_after.store(before.load(Ordering::Acquire), Ordering::Release);
            let (ptr, len) = (
                cx.ptr(0).expect("one buffer") as usize,
                cx.len(0).expect("one buffer"),
            );
            let (go, done) = (go.take().expect("the first poll"), done.clone());
            worker = Some(std::thread::spawn(move || {
                go();
                // SAFETY: the buffer stays alive and untouched by anyone else
                // until the op completes, which waits for `done`.
                unsafe { std::ptr::write_bytes(ptr as *mut u8, value, len) };
                done.store(true, Ordering::Release);
            }));
        }
        if done.load(Ordering::Acquire) {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }
}

#[test]
fn another_thread_completes_an_async_op_in_stream_order() {
    let dev = common::device();
    let s = dev.create_stream().unwrap();
    let mut pinned = dev.alloc_pinned::<u8>(4096).unwrap();
    let before = Arc::new(AtomicBool::new(false));
    let started_after = Arc::new(AtomicBool::new(false));
    let go = common::Gate::new();
    let b = before.clone();
    s.host_fn(move || b.store(true, Ordering::Release)).unwrap();
    s.enqueue_async(
        "by-thread",
        &[AsyncArg::write_pinned(&mut pinned)],
        by_thread(go.waiter(), 7, started_after.clone(), before.clone()),
    )
    .unwrap();
    // Later work waits for it: a copy of what the thread wrote, and a stream
    // that waits on an event recorded after it.
    let dst = dev.alloc::<u8>(4096).unwrap();
    s.copy_h2d(&pinned, &dst).unwrap();
    let after = s.record_event().unwrap();
    let other = dev.create_stream().unwrap();
    other.wait_event(&after).unwrap();
    let mut out = dev.alloc_pinned::<u8>(4096).unwrap();
    other.copy_d2h(&dst, &mut out).unwrap();
    // The op was polled (its thread waits at the gate), and the device had
    // turns to run whatever is ready: nothing after the op may be done.
    go.wait_reached_polling(&s);
    common::settle(&dev);
    assert!(!s.query().unwrap(), "done before the thread was let go");
    assert!(
        !other.query().unwrap(),
        "the other stream ran past its wait"
    );
    assert!(
        pinned.as_slice().is_err(),
        "host reads of a buffer an async op writes wait for it"
    );
    go.open();
    other.synchronize().unwrap();
    s.synchronize().unwrap();
    assert!(
        started_after.load(Ordering::Acquire),
        "polled before earlier work completed"
    );
    assert!(out.as_slice().unwrap().iter().all(|&b| b == 7));
    assert!(pinned.as_slice().unwrap().iter().all(|&b| b == 7));
}

/// While an async op works on a buffer, other streams go on with other work,
/// but an op of another stream that touches that buffer (not ordered by an
/// event) waits until the async op completes, never racing it.
#[test]
fn other_streams_run_beside_an_async_op_but_not_on_its_buffer() {
    if common::skipped("other_streams_run_beside_an_async_op_but_not_on_its_buffer") {
        return;
    }
    let dev = common::device();
    let (s, t, u) = (
        dev.create_stream().unwrap(),
        dev.create_stream().unwrap(),
        dev.create_stream().unwrap(),
    );
    let mut pinned = dev.alloc_pinned::<u8>(4096).unwrap();
    let go = common::Gate::new();
    let unused = Arc::new(AtomicBool::new(false));
    s.enqueue_async(
        "by-thread",
        &[AsyncArg::write_pinned(&mut pinned)],
        by_thread(go.waiter(), 9, unused.clone(), unused),
    )
    .unwrap();
    go.wait_reached_polling(&s);
    // Unrelated work on another stream completes while the op is pending.
    let other = dev.alloc::<u8>(4096).unwrap();
    u.fill(&other, 3u8).unwrap();
    u.synchronize().unwrap();
    assert_eq!(u.read_to_vec(&other).unwrap(), vec![3u8; 4096]);
    // A copy from the buffer the op writes waits for it.
    let dst = dev.alloc::<u8>(4096).unwrap();
    t.copy_h2d(&pinned, &dst).unwrap();
    common::settle(&dev);
    assert!(!s.query().unwrap(), "done before the thread was let go");
    assert!(
        !t.query().unwrap(),
        "a copy of the buffer ran while the async op was writing it"
    );
    go.open();
    t.synchronize().unwrap();
    s.synchronize().unwrap();
    assert_eq!(t.read_to_vec(&dst).unwrap(), vec![9u8; 4096]);
}

#[test]
fn parked_engines_still_poll_async_ops() {
    // Engines that park at once (Block) wake every `async_poll` while an async
    // op is in flight: the op completes though nobody wakes them.
    let dev = common::device_with(|c| {
        c.engine_idle(CompletionMode::Block)
            .async_poll(Duration::from_micros(200))
    });
    let s = dev.create_stream().unwrap();
    let polls = Arc::new(AtomicU32::new(0));
    let (p, t0) = (polls.clone(), std::time::Instant::now());
    s.enqueue_async("timer", &[], move |_: &mut AsyncContext<'_>| {
        p.fetch_add(1, Ordering::Relaxed);
        if t0.elapsed() >= Duration::from_millis(20) {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    })
    .unwrap();
    let e = s.record_event().unwrap();
    e.synchronize().unwrap();
    assert!(polls.load(Ordering::Relaxed) >= 2);
}

/// The poll interval is bounded: an emulated device in real time polled an
/// async op once per `async_poll`, so `Duration::MAX` left it pending for
/// ever. Zero and past one second are refused, naming the bound.
#[test]
fn the_async_poll_interval_is_bounded() {
    for poll in [Duration::ZERO, Duration::from_secs(2), Duration::MAX] {
        let Err(err) = Device::new(common::config().async_poll(poll)) else {
            panic!("async_poll {poll:?} is refused");
        };
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains("1 µs to 1 s"), "{err}");
    }
    Device::new(common::config().async_poll(Duration::from_secs(1))).expect("1 s is allowed");
}

#[test]
fn a_failed_async_op_faults_its_stream_and_skips_later_work() {
    let dev = common::device();
    let s = dev.create_stream().unwrap();
    let mut n = 0;
    s.enqueue_async("remote", &[], move |_: &mut AsyncContext<'_>| {
        n += 1;
        if n < 3 {
            Poll::Pending
        } else {
            Poll::Ready(Err("peer rank 3 went away".into()))
        }
    })
    .unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    s.host_fn(move || r.store(true, Ordering::Release)).unwrap();
    match s.synchronize() {
        Err(Error::StreamFault { message, .. }) => {
            assert!(message.contains("peer rank 3"), "{message}")
        }
        other => panic!("expected a stream fault, got {other:?}"),
    }
    assert!(!ran.load(Ordering::Acquire), "work after the fault ran");

    let s2 = dev.create_stream().unwrap();
    s2.enqueue_async(
        "panics",
        &[],
        |_: &mut AsyncContext<'_>| -> Poll<Result<(), String>> { panic!("poll blew up") },
    )
    .unwrap();
    let err = s2.synchronize().unwrap_err().to_string();
    assert!(
        err.contains("async op 'panics'") && err.contains("poll blew up"),
        "{err}"
    );
}

#[test]
fn async_ops_refuse_unreachable_memory_and_capture() {
    let dev = common::device();
    let s = dev.create_stream().unwrap();
    let buf = dev.alloc::<u32>(16).unwrap();
    let ready = |_: &mut AsyncContext<'_>| Poll::Ready(Ok(()));
    let r = s.enqueue_async("dev", &[AsyncArg::read(&buf)], ready);
    if buf.is_host_visible() {
        r.unwrap();
    } else {
        assert!(
            matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("pinned")),
            "{r:?}"
        );
    }
    let p = dev.alloc_pinned::<u32>(16).unwrap();
    let r = s.enqueue_async(
        "twice",
        &[AsyncArg::read_pinned(&p), AsyncArg::read_pinned(&p)],
        ready,
    );
    r.unwrap();
    s.synchronize().unwrap();
    s.begin_capture().unwrap();
    assert!(matches!(
        s.enqueue_async("captured", &[], ready),
        Err(Error::Graph { .. })
    ));
    s.end_capture().unwrap();
}

#[test]
fn in_virtual_time_an_async_op_completes_at_the_time_it_asks() {
    if common::skipped("in_virtual_time_an_async_op_completes_at_the_time_it_asks") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().unwrap();
    let start = s.record_event().unwrap();
    s.enqueue_async("arrives-later", &[], |cx: &mut AsyncContext<'_>| {
        let t = cx.now_ns() + 3_000_000;
        cx.complete_at_ns(t);
        Poll::Ready(Ok(()))
    })
    .unwrap();
    let end = s.record_event().unwrap();
    end.synchronize().unwrap();
    let ms = start.elapsed_ms(&end).unwrap();
    assert!((3.0..3.1).contains(&ms), "{ms} ms");
}

#[test]
fn async_ops_progress_between_the_blocks_of_a_running_kernel() {
    // One engine, busy with a long kernel of many blocks: the async ops of
    // another stream still start and complete between its blocks.
    if common::skipped("async_ops_progress_between_the_blocks_of_a_running_kernel") {
        return;
    }
    let dev = common::device_with(|c| c.compute_units(1));
    let (busy, other) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let first_done = Arc::new(AtomicBool::new(false));
    let second_started = Arc::new(AtomicBool::new(false));
    let seen_in_kernel = Arc::new(AtomicBool::new(false));
    let d = first_done.clone();
    other
        .enqueue_async("first", &[], move |_: &mut AsyncContext<'_>| {
            if d.load(Ordering::Acquire) {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        })
        .unwrap();
    let st = second_started.clone();
    other
        .enqueue_async("second", &[], move |_: &mut AsyncContext<'_>| {
            st.store(true, Ordering::Release);
            Poll::Ready(Ok(()))
        })
        .unwrap();
    // The first async op becomes done in the kernel's first block to run (no
    // timer: the machine's load cannot move it past the kernel); the block
    // that runs last looks whether the second has started meanwhile.
    let (st, seen, done) = (
        second_started.clone(),
        seen_in_kernel.clone(),
        first_done.clone(),
    );
    let blocks_run = Arc::new(AtomicU32::new(0));
    let k = hetero::Kernel::new("long", move |b| {
        let n = blocks_run.fetch_add(1, Ordering::AcqRel);
        if n == 0 {
            done.store(true, Ordering::Release);
        }
        // The block's work (not a window): the engine polls async ops between
        // blocks at most once per 5 µs (host engine.rs BLOCK_PROGRESS_NS), so
        // blocks take longer than that; a slower machine only takes longer.
        std::thread::sleep(Duration::from_micros(300));
        if n + 1 == b.grid() {
            seen.store(st.load(Ordering::Acquire), Ordering::Release);
        }
    });
    let buf = dev.alloc::<u8>(64).unwrap();
    busy.launch(&k, hetero::Grid::new(64), &[hetero::Arg::write(&buf)])
        .unwrap();
    busy.synchronize().unwrap();
    other.synchronize().unwrap();
    assert!(
        seen_in_kernel.load(Ordering::Acquire),
        "the second async op started only after the kernel"
    );
}

/// From inside a host callback (on an engine), an async op and a copy batch
/// enqueue on another stream like any submission; waiting there on the
/// callback's own stream is a typed error, never a hang.
#[test]
fn async_ops_and_copy_batches_enqueue_from_a_host_callback() {
    let dev = common::device();
    let (a, b) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let src = Arc::new(dev.pinned_from_slice(&[7u32; 16]).unwrap());
    let dst = Arc::new(dev.alloc::<u32>(16).unwrap());
    let polled = Arc::new(AtomicBool::new(false));
    let (b2, a2, p) = (b.clone(), a.clone(), polled.clone());
    let (src2, dst2) = (src.clone(), dst.clone());
    let seen = Arc::new(std::sync::Mutex::new(None));
    let seen2 = seen.clone();
    a.host_fn(move || {
        let r = (|| {
            let mut batch = hetero::CopyBatch::new(hetero::CopyKind::H2D);
            batch.h2d(&src2, 0, &dst2, 0, 16)?;
            b2.copy_batch(batch)?;
            b2.enqueue_async("from a callback", &[], move |_: &mut AsyncContext<'_>| {
                p.store(true, Ordering::Release);
                Poll::Ready(Ok(()))
            })?;
            Ok::<_, Error>(a2.synchronize().err())
        })();
        *seen2.lock().unwrap() = Some(r);
    })
    .unwrap();
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    let r = seen.lock().unwrap().take().expect("the callback ran");
    let waited = r.expect("submissions from the callback");
    assert!(
        matches!(waited, Some(Error::WouldDeadlock { .. })),
        "a wait on the callback's own stream: {waited:?}"
    );
    assert!(polled.load(Ordering::Acquire));
    assert_eq!(b.read_to_vec(&dst).unwrap(), vec![7; 16]);
}

/// A chain of async ops, as a ping-pong of remote copies is: each one's first
/// poll sees every op before it finished (the engine may start an op before it
/// retires the one before, never before that one reported done), ops that
/// write the same buffer still run one after another, and a failed op's
/// successor is never polled.
#[test]
fn chained_async_ops_start_only_after_the_op_before_finished() {
    let dev = common::device();
    let s = dev.create_stream().unwrap();
    let mut own = [
        dev.alloc_pinned::<u8>(64).unwrap(),
        dev.alloc_pinned::<u8>(64).unwrap(),
    ];
    let mut shared = dev.alloc_pinned::<u8>(64).unwrap();
    let finished = Arc::new(AtomicU32::new(0));
    let misordered = Arc::new(AtomicU32::new(0));
    const N: u32 = 2_000;
    for i in 0..N {
        // Every third op writes the shared buffer (its locks conflict with the
        // op before whenever that one wrote it too); the others alternate.
        let arg = if i % 3 == 0 {
            AsyncArg::write_pinned(&mut shared)
        } else {
            AsyncArg::write_pinned(&mut own[(i % 2) as usize])
        };
        let (finished, misordered) = (finished.clone(), misordered.clone());
        let mut polls = 0u32;
        s.enqueue_async("chain", &[arg], move |cx: &mut AsyncContext<'_>| {
            if polls == 0 && finished.load(Ordering::Acquire) != i {
                misordered.fetch_add(1, Ordering::Relaxed);
            }
            polls += 1;
            // Some finish at their first poll, some after a few.
            if polls <= i % 4 {
                return Poll::Pending;
            }
            let (ptr, len) = (cx.ptr(0).expect("one buffer"), cx.len(0).expect("len"));
            // SAFETY: the op holds the buffer, written by no one else, until it
            // completes.
            unsafe { std::ptr::write_bytes(ptr, i as u8, len) };
            finished.fetch_add(1, Ordering::Release);
            Poll::Ready(Ok(()))
        })
        .unwrap();
    }
    s.synchronize().unwrap();
    assert_eq!(finished.load(Ordering::Acquire), N);
    assert_eq!(misordered.load(Ordering::Relaxed), 0, "an op started early");
    let last = |pred: &dyn Fn(u32) -> bool| (0..N).rev().find(|&i| pred(i)).unwrap() as u8;
    assert!(shared
        .as_slice()
        .unwrap()
        .iter()
        .all(|&b| b == last(&|i| i % 3 == 0)));
    for (k, buf) in own.iter().enumerate() {
        let want = last(&|i| i % 3 != 0 && i % 2 == k as u32);
        assert!(buf.as_slice().unwrap().iter().all(|&b| b == want));
    }

    // A failed op: the one after it is never polled.
    let polled_after = Arc::new(AtomicBool::new(false));
    s.enqueue_async("fails", &[], |_: &mut AsyncContext<'_>| {
        Poll::Ready(Err("refused".to_string()))
    })
    .unwrap();
    let p = polled_after.clone();
    s.enqueue_async("after", &[], move |_: &mut AsyncContext<'_>| {
        p.store(true, Ordering::Release);
        Poll::Ready(Ok(()))
    })
    .unwrap();
    assert!(matches!(s.synchronize(), Err(Error::StreamFault { .. })));
    assert!(!polled_after.load(Ordering::Acquire));
}

/// An async op's poll is user code on the device: a wait there for its own
/// stream is refused with `WouldDeadlock` (it could only end after the poll
/// returns), while a wait for another stream's finished work succeeds. Before
/// the host backend ran polls in the op's frame, the first wait hung.
#[test]
fn a_wait_inside_an_async_poll_on_its_own_stream_is_refused_not_hung() {
    let dev = common::device();
    let s = dev.create_stream().unwrap();
    let other = dev.create_stream().unwrap();
    other.synchronize().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (me, o, sn) = (s.clone(), other.clone(), seen.clone());
    s.enqueue_async("waits", &[], move |_: &mut AsyncContext<'_>| {
        let own = me.synchronize();
        let theirs = o.synchronize();
        sn.lock().unwrap().push((own, theirs));
        Poll::Ready(Ok(()))
    })
    .unwrap();
    let s2 = s.clone();
    common::within(30, "the stream of a poll that waits", move || {
        s2.synchronize()
    })
    .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert!(
        matches!(seen[0].0, Err(Error::WouldDeadlock(_))),
        "own stream: {:?}",
        seen[0].0
    );
    assert!(seen[0].1.is_ok(), "other stream: {:?}", seen[0].1);
}
