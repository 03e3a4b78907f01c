//! Regression tests for what a hard user found: backpressure that lost a wake-up,
//! zero-sized buffers of wide types, blocking calls and drops from inside
//! callbacks, panics that kill engines, and inputs that are accepted but wrong.
//! Each would hang, abort or misbehave before its fix; a watchdog turns a hang
//! into a failure.

mod common;

use hetero::{Arg, CompletionMode, Device, DeviceConfig, Error, Event, Grid, Kernel, Stream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use common::within;

fn device(cfg: DeviceConfig) -> Device {
    Device::new(cfg).expect("device")
}

/// A host callback's result, sent back to the test.
struct Reply<R> {
    rx: mpsc::Receiver<R>,
    stream: Stream,
}

fn in_callback<R: Send + 'static>(s: &Stream, f: impl FnOnce() -> R + Send + 'static) -> Reply<R> {
    let (tx, rx) = mpsc::channel();
    s.host_fn(move || {
        let _ = tx.send(f());
    })
    .expect("host_fn");
    Reply {
        rx,
        stream: s.clone(),
    }
}

/// The callback's result. Polling the stream lets a device in virtual time
/// (which runs only when the host waits or polls) get to the callback.
fn recv<R>(reply: &Reply<R>) -> R {
    recv_from(&reply.rx, &reply.stream)
}

/// What `rx` gets from work on `stream`, polling the stream meanwhile.
fn recv_from<R>(rx: &mpsc::Receiver<R>, stream: &Stream) -> R {
    let start = std::time::Instant::now();
    loop {
        match rx.try_recv() {
            Ok(v) => return v,
            Err(mpsc::TryRecvError::Disconnected) => panic!("the callback never reported"),
            Err(mpsc::TryRecvError::Empty) => {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "the callback did not report (hung)"
                );
                let _ = stream.query();
                std::thread::yield_now();
            }
        }
    }
}

fn is_deadlock<T: std::fmt::Debug>(r: &hetero::Result<T>) -> bool {
    matches!(r, Err(Error::WouldDeadlock(_)))
}

// ---- 1. backpressure -------------------------------------------------------

/// A two-slot ring flooded with callbacks: the submitter must never wait for an
/// op that is not there (it used to wait for "the oldest op + 1" after the
/// engines had drained the ring).
#[test]
fn flooding_a_two_slot_ring_never_hangs_in_any_mode() {
    for mode in [
        CompletionMode::Spin,
        CompletionMode::Yield,
        CompletionMode::Block,
        CompletionMode::auto(),
    ] {
        let n = if mode == CompletionMode::Block {
            5_000
        } else {
            50_000
        };
        let ran = within(60, &format!("flood in {mode:?}"), move || {
            let dev = device(
                common::config()
                    .stream_capacity(2)
                    .host_wait(mode)
                    .engine_idle(mode),
            );
            let s = dev.create_stream().expect("stream");
            let count = Arc::new(AtomicU32::new(0));
            for _ in 0..n {
                let c = count.clone();
                s.host_fn(move || {
                    c.fetch_add(1, Ordering::Relaxed);
                })
                .expect("host_fn");
            }
            s.synchronize().expect("sync");
            count.load(Ordering::Relaxed)
        });
        assert_eq!(ran, n, "every callback ran once in {mode:?}");
    }
}

/// Several threads flood one small stream while others wait on its events.
#[test]
fn flood_with_cross_stream_waiters_completes() {
    within(60, "flood with waiters", || {
        let dev = device(common::config().stream_capacity(4));
        let src = dev.create_stream().expect("stream");
        let waiters: Vec<_> = (0..4).map(|_| dev.create_stream().expect("s")).collect();
        let producers: Vec<_> = (0..2)
            .map(|_| {
                let s = src.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        s.host_fn(|| {}).expect("host_fn");
                    }
                })
            })
            .collect();
        for round in 0..500 {
            let e = src.record_event().expect("record");
            waiters[round % 4].wait_event(&e).expect("wait");
            waiters[round % 4].host_fn(|| {}).expect("host_fn");
        }
        for p in producers {
            p.join().expect("producer");
        }
        dev.synchronize().expect("sync");
    });
}

// ---- 2. zero-sized buffers of wide types -----------------------------------

#[test]
fn zero_length_buffers_of_wide_types_are_sound() {
    let dev = Device::new(common::config()).expect("device");
    let s = dev.create_stream().expect("stream");
    let mut p = dev.pinned_from_slice::<u32>(&[]).expect("empty pinned");
    assert!(p.as_slice().expect("read").is_empty());
    assert!(p.as_mut_slice().expect("write").is_empty());
    let q = dev.alloc_pinned::<f64>(0).expect("empty pinned f64");
    assert!(q.as_slice().expect("read").is_empty());
    let a = s.alloc::<u32>(0).expect("empty device u32");
    let b = dev.alloc::<f32>(0).expect("empty device f32");
    let k = Kernel::new("empty-views", |blk| {
        assert!(blk.read::<u32>(0).is_empty());
        assert!(blk.write::<f32>(0).is_empty());
    })
    .wgsl(common::wgsl::nothing(2), "main");
    s.launch(&k, Grid::new(3), &[Arg::read(&a), Arg::write(&b)])
        .expect("launch");
    s.synchronize().expect("the kernel saw empty views");
    assert!(s.read_to_vec(&a).expect("read").is_empty());
}

#[test]
fn over_aligned_element_types_are_refused() {
    #[derive(Clone, Copy)]
    #[repr(C, align(512))]
    struct Wide([u8; 512]);
    // SAFETY: plain bytes, no padding (512 bytes of u8 at alignment 512).
    unsafe impl bytemuck::Zeroable for Wide {}
    // SAFETY: as above.
    unsafe impl bytemuck::Pod for Wide {}
    let dev = Device::new(common::config()).expect("device");
    assert!(matches!(
        dev.alloc::<Wide>(1),
        Err(Error::InvalidArgument(_))
    ));
}

// ---- 3. blocking calls from inside callbacks --------------------------------

#[test]
fn synchronize_own_stream_from_a_callback_is_an_error() {
    let dev = Device::new(common::config()).expect("device");
    let s = dev.create_stream().expect("stream");
    let s2 = s.clone();
    let got = recv(&in_callback(&s, move || s2.synchronize()));
    assert!(is_deadlock(&got), "{got:?}");
    s.synchronize().expect("the stream itself is fine");
}

#[test]
fn read_of_own_stream_from_a_callback_is_an_error() {
    let dev = Device::new(common::config()).expect("device");
    let s = dev.create_stream().expect("stream");
    let buf = s.alloc::<u32>(16).expect("alloc");
    s.fill(&buf, 7).expect("fill");
    let (s2, buf2) = (s.clone(), Arc::new(buf));
    let b = buf2.clone();
    let got = in_callback(&s, move || s2.read_to_vec(&b));
    assert!(is_deadlock(&recv(&got)));
    assert_eq!(s.read_to_vec(&buf2).expect("read"), vec![7; 16]);
}

#[test]
fn device_synchronize_from_a_callback_is_an_error() {
    let dev = Device::new(common::config()).expect("device");
    let s = dev.create_stream().expect("stream");
    let d = dev.clone();
    let got = in_callback(&s, move || d.synchronize());
    assert!(is_deadlock(&recv(&got)));
    dev.synchronize().expect("device fine");
}

#[test]
fn event_synchronize_from_a_callback_errs_only_for_later_events() {
    let dev = Device::new(common::config()).expect("device");
    let s = dev.create_stream().expect("stream");
    let before = s.record_event().expect("record");
    let later = Arc::new(std::sync::Mutex::new(None::<Event>));
    let l = later.clone();
    let gate = Arc::new(AtomicBool::new(false));
    let g = gate.clone();
    let got = in_callback(&s, move || {
        while !g.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        let later = l.lock().expect("lock").clone().expect("recorded");
        (before.synchronize(), later.synchronize())
    });
    *later.lock().expect("lock") = Some(s.record_event().expect("record"));
    gate.store(true, Ordering::Release);
    let (early, late) = recv(&got);
    assert!(
        early.is_ok(),
        "an earlier event of the own stream is complete"
    );
    assert!(
        is_deadlock(&late),
        "a later one could never complete: {late:?}"
    );
    s.synchronize().expect("sync");
}

/// With one compute unit the callback's engine is the only one: waiting on
/// another stream works because the waiting engine runs that stream's work.
#[test]
fn callback_waiting_on_another_stream_works_with_one_compute_unit() {
    if common::skipped("callback_waiting_on_another_stream_works_with_one_compute_unit") {
        return;
    }
    within(60, "one-unit wait", || {
        let dev = device(common::config().compute_units(1));
        let (a, b) = (
            dev.create_stream().expect("a"),
            dev.create_stream().expect("b"),
        );
        // b's work is held by a host event the callback on a signals.
        let go = dev.host_event();
        let buf = Arc::new(b.alloc::<u32>(64).expect("alloc"));
        b.wait_event(go.event()).expect("gate");
        b.fill(&buf, 5).expect("fill");
        let done = b.record_event().expect("record");
        let got = in_callback(&a, move || {
            go.signal();
            done.synchronize()
        });
        recv(&got).expect("the wait on b completes");
        assert_eq!(b.read_to_vec(&buf).expect("read"), vec![5; 64]);
    });
}

/// A callback waiting for a stream whose next op waits (through an event)
/// for work after the callback itself: the wait is refused, not hung, and
/// both streams complete once the callback returns.
#[test]
fn callback_waiting_for_a_stream_that_waits_for_it_is_an_error() {
    within(60, "chain back", || {
        let dev = device(common::config().compute_units(1));
        let (a, b) = (
            dev.create_stream().expect("a"),
            dev.create_stream().expect("b"),
        );
        // a is held until everything below is queued.
        let go = dev.host_event();
        a.wait_event(go.event()).expect("gate");
        let slot: Arc<std::sync::Mutex<Option<Event>>> = Arc::default();
        let wanted = slot.clone();
        let got = in_callback(&a, move || {
            let e = wanted.lock().expect("lock").clone().expect("set");
            e.synchronize()
        });
        let after = a.record_event().expect("after the callback");
        let buf = Arc::new(b.alloc::<u32>(64).expect("alloc"));
        b.wait_event(&after).expect("b waits for a");
        b.fill(&buf, 7).expect("fill");
        *slot.lock().expect("lock") = Some(b.record_event().expect("eb"));
        go.signal();
        let r = recv(&got);
        assert!(is_deadlock(&r), "{r:?}");
        dev.synchronize().expect("both streams complete");
        assert_eq!(b.read_to_vec(&buf).expect("read"), vec![7; 64]);
    });
}

/// A callback submitting more to its own stream than the ring holds: those that
/// fit are taken, the one that would wait for the callback itself is an error.
#[test]
fn callback_overfilling_its_own_ring_gets_an_error() {
    within(60, "overfill", || {
        let dev = device(common::config().stream_capacity(4));
        let s = dev.create_stream().expect("stream");
        let s2 = s.clone();
        let got = in_callback(&s, move || {
            let mut results = Vec::new();
            for _ in 0..16 {
                results.push(s2.host_fn(|| {}));
            }
            results
        });
        let results = recv(&got);
        assert!(results.iter().any(|r| r.is_ok()));
        assert!(results.iter().any(is_deadlock), "{results:?}");
        s.synchronize().expect("the stream completes");
    });
}

/// A kernel reading its own argument synchronously through another stream.
#[test]
fn kernel_reading_its_own_argument_synchronously_is_an_error() {
    if common::skipped("kernel_reading_its_own_argument_synchronously_is_an_error") {
        return;
    }
    within(60, "own argument", || {
        let dev = Device::new(common::config()).expect("device");
        let (s, t) = (
            dev.create_stream().expect("s"),
            dev.create_stream().expect("t"),
        );
        let buf = Arc::new(dev.alloc::<u32>(8).expect("alloc"));
        t.fill(&buf, 1).expect("fill");
        t.synchronize().expect("sync");
        let (tx, rx) = mpsc::channel();
        let (b, t2) = (buf.clone(), t.clone());
        let tx = std::sync::Mutex::new(tx);
        let k = Kernel::new("reads-itself", move |_| {
            let r = t2.read_to_vec(&b);
            let _ = tx.lock().expect("lock").send(r);
        });
        s.launch(&k, Grid::new(1), &[Arg::write(&buf)])
            .expect("launch");
        let r = recv_from(&rx, &s);
        assert!(is_deadlock(&r), "{r:?}");
        s.synchronize().expect("sync");
    });
}

/// Two callbacks that each wait for the other's stream: a cycle. Neither hangs;
/// at least one is told it would deadlock, and both streams complete.
#[test]
fn callbacks_waiting_on_each_other_do_not_hang() {
    for units in [1, 2] {
        within(60, "cycle", move || {
            let dev = device(common::config().compute_units(units));
            let (a, b) = (
                dev.create_stream().expect("a"),
                dev.create_stream().expect("b"),
            );
            let slots: Arc<[std::sync::Mutex<Option<Event>>; 2]> = Arc::new(Default::default());
            let gate = Arc::new(AtomicBool::new(false));
            let mut rxs = Vec::new();
            for (i, s) in [&a, &b].into_iter().enumerate() {
                let (slots, gate) = (slots.clone(), gate.clone());
                rxs.push(in_callback(s, move || {
                    while !gate.load(Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                    let other = slots[1 - i].lock().expect("lock").clone().expect("set");
                    other.synchronize()
                }));
            }
            *slots[0].lock().expect("lock") = Some(a.record_event().expect("ea"));
            *slots[1].lock().expect("lock") = Some(b.record_event().expect("eb"));
            gate.store(true, Ordering::Release);
            let results: Vec<_> = rxs.iter().map(recv).collect();
            assert!(results.iter().any(is_deadlock), "{results:?}");
            dev.synchronize().expect("both streams complete");
        });
    }
}

// ---- 4. dropping the last handle on an engine thread ------------------------

#[test]
fn dropping_the_last_stream_and_device_in_a_callback_does_not_hang() {
    within(60, "drop in callback", || {
        let dev = Device::new(common::config()).expect("device");
        let s = dev.create_stream().expect("stream");
        let (tx, rx) = mpsc::channel();
        let (s2, d2) = (s.clone(), dev.clone());
        s.host_fn(move || {
            drop(s2);
            drop(d2);
            let _ = tx.send(());
        })
        .expect("host_fn");
        // Held by no handle: it waits on the timeline only (and so drives a
        // device in virtual time to the callback).
        let after = s.record_event().expect("record");
        drop(s);
        drop(dev);
        after.synchronize().expect("the stream completes");
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the callback's drops returned");
    });
}

#[test]
fn dropping_the_last_stream_in_a_kernel_does_not_hang() {
    if common::skipped("dropping_the_last_stream_in_a_kernel_does_not_hang") {
        return;
    }
    within(60, "drop in kernel", || {
        let dev = Device::new(common::config()).expect("device");
        let other = dev.create_stream().expect("other");
        let s = dev.create_stream().expect("stream");
        let holder = Arc::new(std::sync::Mutex::new(Some(s.clone())));
        let h = holder.clone();
        let k = Kernel::new("drops-stream", move |_| {
            drop(h.lock().expect("lock").take());
        });
        s.launch(&k, Grid::new(1), &[]).expect("launch");
        drop(s);
        drop(k);
        other.host_fn(|| {}).expect("other works");
        other.synchronize().expect("other sync");
        dev.synchronize().expect("device sync after the drop");
    });
}

// ---- 6. smaller ones ---------------------------------------------------------

/// A panic payload whose own Drop panics: the engine survives, the stream fails
/// with a message, and other work goes on.
#[test]
fn a_panic_payload_that_panics_on_drop_does_not_kill_the_engine() {
    if common::skipped("a_panic_payload_that_panics_on_drop_does_not_kill_the_engine") {
        return;
    }
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("payload drop panics too");
        }
    }
    within(60, "bomb", || {
        let dev = device(common::config().compute_units(1));
        let (s, t) = (
            dev.create_stream().expect("s"),
            dev.create_stream().expect("t"),
        );
        s.host_fn(|| std::panic::panic_any(Bomb)).expect("host_fn");
        assert!(matches!(s.synchronize(), Err(Error::StreamFault { .. })));
        // Device code carries no payload: its twin fails to compile, so on a
        // device that runs compiled code the bomb is the callback's above (a
        // host callback runs on the engine thread there too) and the kernel
        // checks only that a failed launch leaves the engine running.
        let k = Kernel::new("bomb", |_| std::panic::panic_any(Bomb))
            .wgsl(common::wgsl::fails("bomb"), "main");
        t.launch(&k, Grid::new(4), &[]).expect("launch");
        assert!(matches!(t.synchronize(), Err(Error::StreamFault { .. })));
        let u = dev.create_stream().expect("u");
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        u.host_fn(move || r.store(true, Ordering::Release))
            .expect("host_fn");
        u.synchronize().expect("the engine still runs work");
        assert!(ran.load(Ordering::Acquire));
    });
}

#[test]
fn elapsed_between_events_of_two_devices_is_an_error() {
    let (d1, d2) = (
        Device::new(common::config()).expect("d1"),
        Device::new(common::config()).expect("d2"),
    );
    let (s1, s2) = (
        d1.create_stream().expect("s1"),
        d2.create_stream().expect("s2"),
    );
    let a = s1.record_event().expect("a");
    let b = s2.record_event().expect("b");
    a.synchronize().expect("a");
    b.synchronize().expect("b");
    assert!(matches!(a.elapsed_ms(&b), Err(Error::EventTiming { .. })));
}

#[test]
fn huge_stream_capacity_is_refused_with_the_limit() {
    let r = Device::new(common::config().stream_capacity(1 << 24));
    match r {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("65536"), "{m}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(
        Device::new(common::config().stream_capacity(DeviceConfig::MAX_STREAM_CAPACITY)).is_ok()
    );
}

/// A buffer freed behind work that waits for a host event the allocating
/// thread signals only afterwards: an allocation that would grow the pool
/// waits for that free a bounded time, then goes on; it never hangs.
#[test]
fn an_allocation_does_not_wait_for_frees_held_behind_this_thread() {
    within(30, "allocating past a free held behind this thread", || {
        allocate_past_a_held_free(common::device())
    });
}

fn allocate_past_a_held_free(dev: Device) {
    let held = dev.create_stream().unwrap();
    let other = dev.create_stream().unwrap();
    let go = dev.host_event();
    held.wait_event(go.event()).unwrap();
    let a = held.alloc::<u8>(3 << 20).unwrap();
    held.fill(&a, 1u8).unwrap();
    drop(a);
    // Does not fit beside the pending 3 MiB without growing.
    let b = other.alloc::<u8>(18 << 20).unwrap();
    other.fill(&b, 2u8).unwrap();
    go.signal();
    held.synchronize().unwrap();
    assert_eq!(other.read_to_vec(&b).unwrap()[(18 << 20) - 1], 2);
}

/// From inside a host callback: placing a stream graph (its own buffer
/// allocated then), binding its slot, launching it with those bindings
/// after an event of the callback's stream that comes later, and waiting
/// for that launch all return (a result or a typed error), never hang.
#[test]
fn placing_and_launching_a_graph_from_a_callback_does_not_hang() {
    let devs = [common::device(), common::device()];
    let ctx = hetero::Context::new(&devs).unwrap();
    ctx.set_perfmodel_dir(None);
    let s = devs[0].create_stream().unwrap();
    let x = Arc::new(devs[0].alloc::<u32>(64).unwrap());
    let mut g = hetero::Graph::new(&devs[0]).unwrap();
    let t = g.alloc::<u32>(64).unwrap();
    let fill = Kernel::new("fill", |b| b.write::<u32>(0).fill(3))
        .wgsl(common::wgsl::map("u32", 0, "3u"), "main");
    let copy = Kernel::new("copy", |b| {
        let v = b.read::<u32>(0).to_vec();
        b.write::<u32>(0).copy_from_slice(&v);
    })
    .wgsl(common::wgsl::map("u32", 1, "x0[i]"), "main");
    let a = g
        .kernel(&fill, Grid::new(1), &[Arg::write(&t)], &[])
        .unwrap();
    // The result goes to a slot, bound to `x` inside the callback.
    let out = g.slot::<u32>(64).unwrap();
    g.kernel(
        &copy,
        Grid::new(1),
        &[Arg::read(&t), Arg::write(&out)],
        &[a],
    )
    .unwrap();
    let bound_to = x.clone();
    let later = Arc::new(std::sync::Mutex::new(None::<Event>));
    let slot = later.clone();
    let gate = devs[0].host_event();
    s.wait_event(gate.event()).unwrap();
    let reply = in_callback(&s, move || {
        let placed = g.instantiate_on(&ctx)?;
        let after = slot
            .lock()
            .unwrap()
            .clone()
            .expect("recorded before the callback ran");
        let mut bindings = placed.bindings();
        bindings.bind(&out, &bound_to)?;
        let launch = placed.launch_with(&bindings, &[after])?;
        // The launch waits for work after this callback: waiting here could
        // never end.
        let waited = launch.wait();
        Ok::<_, Error>((placed, launch, waited))
    });
    // Recorded after the callback on its stream (the gate holds the
    // callback until the event exists).
    *later.lock().unwrap() = Some(s.record_event().unwrap());
    gate.signal();
    match recv(&reply) {
        Ok((_placed, launch, waited)) => {
            assert!(is_deadlock(&waited), "{waited:?}");
            launch.wait().unwrap();
            assert_eq!(s.read_to_vec(&x).unwrap(), vec![3; 64]);
        }
        Err(e) => panic!("placing and launching in a callback: {e}"),
    }
}
