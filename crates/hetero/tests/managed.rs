//! Managed buffers through the public API, on the backend `HETERO_BACKEND`
//! names: declared-access migration, host guards (waiting and `try_`),
//! prefetch and advice, eviction past the device's capacity, migration
//! records, and random programs against a sequential model.

mod common;

use common::managed::{affine, host_fill, kernel_at, plus_one, touch};

use hetero::{
    Advice, Arg, Attach, BackendKind, Device, DeviceConfig, Error, Kernel, Location, ManagedBuffer,
    Stream,
};
use proptest::prelude::*;

/// Whether the device under test has memory of its own (pages move).
fn moves() -> bool {
    matches!(
        common::backend(),
        common::Backend::EmuVirtual | common::Backend::EmuReal | common::Backend::Vulkan
    )
}

/// The device under test with `capacity` bytes of device memory (emu only).
fn device_of_capacity(capacity: usize) -> Device {
    let cfg = common::config();
    let emu = match cfg.backend_kind() {
        BackendKind::Emu(e) => e.clone().capacity(capacity),
        other => panic!("capacity is an emu setting, not {other:?}'s"),
    };
    Device::new(DeviceConfig::from_env().expect("config").emu(emu)).expect("device")
}

#[test]
fn alloc_managed_gives_a_zeroed_buffer_of_its_length() {
    let dev = common::device();
    let buf = dev.alloc_managed::<u32>(16).expect("managed");
    assert_eq!(buf.len(), 16);
    assert_eq!(&*buf.read(..).expect("read"), &[0u32; 16]);
}

/// Managed memory from a host callback is refused with `WouldDeadlock`,
/// never a hang (a thread holding the device's managed state may wait for
/// this very engine); a buffer dropped there is released elsewhere.
#[test]
fn managed_calls_from_a_host_callback_are_refused_not_hung() {
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let buf = std::sync::Arc::new(dev.alloc_managed::<u32>(1024).expect("managed"));
    let other = dev.alloc_managed::<u32>(8).expect("managed");
    // A graph over the buffer, and a stream to launch it and attach on.
    let s2 = dev.create_stream().expect("stream");
    s2.begin_capture().expect("capture");
    s2.launch(&affine(1, 1), 1.into(), &[Arg::managed_write(&buf)])
        .expect("recorded");
    let exec = s2
        .end_capture()
        .expect("graph")
        .instantiate()
        .expect("exec");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let attached = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (b, out, att) = (buf.clone(), seen.clone(), attached.clone());
    s.host_fn(move || {
        let mut out = out.lock().unwrap();
        out.push(b.read(..).map(|_| ()).err());
        out.push(b.write(..).map(|_| ()).err());
        out.push(b.advise(.., Advice::ReadMostly).err());
        out.push(s2.launch_graph(&exec).err());
        // Attaching to the host moves pages where they move (refused here
        // like any managed move); on the host device nothing moves: it works.
        let host = s2.attach(&b, Attach::Host).err();
        if moves() {
            out.push(host);
        } else {
            assert!(host.is_none(), "{host:?}");
        }
        // Changing which streams may use it needs no device work: it works.
        let mut att = att.lock().unwrap();
        att.push(s2.attach(&b, Attach::Single).err());
        att.push(s2.attach(&b, Attach::Global).err());
        drop(other);
    })
    .expect("callback");
    s.synchronize().expect("the callback ran");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), if moves() { 5 } else { 4 });
    let attached = attached.lock().unwrap();
    assert!(attached.iter().all(Option::is_none), "{attached:?}");
    for e in seen.iter() {
        assert!(matches!(e, Some(Error::WouldDeadlock(_))), "{e:?}");
    }
    // Outside the callback all is as before.
    assert_eq!(buf.read(..).expect("read")[0], 0);
}

#[test]
fn kernels_and_host_guards_see_each_others_writes() {
    if common::skipped("kernels_and_host_guards_see_each_others_writes") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let buf = dev.alloc_managed::<u32>(50_000).expect("managed");
    assert!(
        buf.read(..).expect("read").iter().all(|&x| x == 0),
        "starts zeroed"
    );
    host_fill(&buf, |i| i as u32);
    s.launch(&affine(2, 1), 4.into(), &[Arg::managed_write(&buf)])
        .expect("launch");
    // A sub-range: only its pages move, and the kernel's view starts there.
    s.launch(
        &affine(1, 10),
        1.into(),
        &[Arg::managed_write_range(&buf, 128..256)],
    )
    .expect("launch");
    let g = buf.read(..).expect("read");
    for (i, &x) in g.iter().enumerate() {
        let want = (i as u32) * 2 + 1 + if (128..256).contains(&i) { 10 } else { 0 };
        assert_eq!(x, want, "element {i}");
    }
}

#[test]
fn a_sub_range_argument_moves_only_its_pages() {
    if common::skipped("a_sub_range_argument_moves_only_its_pages") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let page = 4096;
    let buf = dev
        .alloc_managed_with_page::<u32>(16 * page / 4, page)
        .expect("managed");
    host_fill(&buf, |i| i as u32);
    let before = dev.managed_stats();
    // Elements 960..1060 lie in page 0 (bytes 3840..4240 cross into page 1).
    s.launch(
        &affine(1, 1),
        1.into(),
        &[Arg::managed_write_range(&buf, 960..1060)],
    )
    .expect("launch");
    s.synchronize().expect("sync");
    let after = dev.managed_stats();
    let moved = after.bytes_to_device - before.bytes_to_device;
    if moves() {
        assert_eq!(moved, 2 * page as u64, "two pages copied in, not sixteen");
        assert_eq!(after.declared_pages - before.declared_pages, 2);
    } else {
        assert_eq!(moved, 0, "one memory: nothing moves");
    }
    let g = buf.read(950..1070).expect("read");
    for (k, &x) in g.iter().enumerate() {
        let i = 950 + k;
        let want = i as u32 + u32::from((960..1060).contains(&i));
        assert_eq!(x, want, "element {i}");
    }
    drop(g);
    let back = dev.managed_stats().bytes_to_host - after.bytes_to_host;
    assert_eq!(
        back,
        if moves() { 2 * page as u64 } else { 0 },
        "dirty pages back"
    );
}

/// A range that ends before it starts is a typed error in every call that
/// takes one (it read as empty: the call did nothing and said nothing); an
/// empty range is a range, and past the end is out of bounds.
#[test]
#[allow(clippy::reversed_empty_ranges)]
fn a_reversed_range_is_refused_everywhere_a_range_is_taken() {
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let buf = dev.alloc_managed::<u32>(64).expect("managed");
    host_fill(&buf, |i| i as u32);
    let reversed = |r: hetero::Result<()>, what: &str| match r {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("10..5"), "{what}: {m}"),
        other => panic!("{what}: {other:?}"),
    };
    reversed(buf.read(10..5).map(drop), "read");
    reversed(buf.try_read(10..5).map(drop), "try_read");
    reversed(buf.write(10..5).map(drop), "write");
    reversed(buf.try_write(10..5).map(drop), "try_write");
    let here = Location::Device(dev.id());
    reversed(buf.prefetch(10..5, here, &s), "prefetch");
    reversed(buf.advise(10..5, Advice::ReadMostly), "advise");
    reversed(buf.unadvise(10..5, Advice::ReadMostly), "unadvise");
    let launch = s.launch(&touch(), 1.into(), &[Arg::managed_read_range(&buf, 10..5)]);
    reversed(launch, "launch");
    // Empty and past-the-end ranges keep their meaning.
    assert!(buf.read(5..5).expect("empty").is_empty());
    buf.prefetch(5..5, here, &s).expect("an empty prefetch");
    assert!(matches!(buf.read(60..70), Err(Error::OutOfBounds { .. })));
    s.synchronize().expect("nothing failed the stream");
    assert_eq!(buf.read(..).expect("read")[63], 63);
}

#[test]
fn kernels_on_several_streams_follow_submission_order_on_shared_pages() {
    if common::skipped("kernels_on_several_streams_follow_submission_order_on_shared_pages") {
        return;
    }
    let dev = common::device();
    let streams: Vec<Stream> = (0..3).map(|_| dev.create_stream().expect("s")).collect();
    let buf = dev.alloc_managed::<u32>(20_000).expect("managed");
    let out = dev.alloc_managed::<u32>(20_000).expect("managed");
    let mut model = vec![0u32; 20_000];
    for round in 0..12u32 {
        let s = &streams[round as usize % 3];
        s.launch(&affine(3, round), 2.into(), &[Arg::managed_write(&buf)])
            .expect("launch");
        for x in &mut model {
            *x = x.wrapping_mul(3).wrapping_add(round);
        }
    }
    // A reader on yet another stream, no event: it follows the writers.
    streams[1]
        .launch(
            &plus_one(),
            1.into(),
            &[Arg::managed_read(&buf), Arg::managed_write(&out)],
        )
        .expect("launch");
    assert_eq!(&*buf.read(..).expect("read"), &model[..]);
    let want: Vec<u32> = model.iter().map(|x| x.wrapping_add(1)).collect();
    assert_eq!(&*out.read(..).expect("read"), &want[..]);
}

#[test]
fn try_guards_refuse_while_queued_work_uses_the_pages_and_plain_guards_wait() {
    if common::skipped("try_guards_refuse_while_queued_work_uses_the_pages_and_plain_guards_wait") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let buf = std::sync::Arc::new(dev.alloc_managed::<u32>(4096).expect("managed"));
    let gate = common::Gate::hold(&s);
    s.launch(&affine(1, 7), 2.into(), &[Arg::managed_write(&buf)])
        .expect("launch");
    match buf.try_read(..) {
        Err(Error::BufferBusy { .. }) => {}
        other => panic!("expected BufferBusy, got {:?}", other.map(|g| g.len())),
    }
    match buf.try_write(0..10) {
        Err(Error::BufferBusy { .. }) => {}
        other => panic!("expected BufferBusy, got {:?}", other.map(|g| g.len())),
    }
    let reader = {
        let buf = buf.clone();
        std::thread::spawn(move || buf.read(..).expect("read").to_vec())
    };
    gate.open();
    let seen = reader.join().expect("reader");
    assert!(
        seen.iter().all(|&x| x == 7),
        "the waiting guard saw the kernel's result"
    );
    assert!(buf.try_read(..).is_ok(), "nothing queued any more");
}

#[test]
fn a_guard_holds_later_work_and_a_second_guard_on_its_thread_is_refused() {
    if common::skipped("a_guard_holds_later_work_and_a_second_guard_on_its_thread_is_refused") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let buf = dev.alloc_managed::<u32>(10_000).expect("managed");
    let mut g = buf.write(..).expect("write");
    // Submitted while the guard lives: runs after its drop, on its data.
    s.launch(&affine(2, 0), 1.into(), &[Arg::managed_write(&buf)])
        .expect("launch");
    g.iter_mut().for_each(|x| *x = 21);
    match buf.read(0..1) {
        Err(Error::WouldDeadlock(_)) => {}
        other => panic!("expected WouldDeadlock, got {:?}", other.map(|g| g.len())),
    }
    drop(g);
    assert!(buf.read(..).expect("read").iter().all(|&x| x == 42));
}

#[test]
fn a_failing_kernel_fails_its_stream_and_the_buffer_stays_usable() {
    if common::skipped("a_failing_kernel_fails_its_stream_and_the_buffer_stays_usable") {
        return;
    }
    let dev = common::device();
    let (bad, good) = (
        dev.create_stream().expect("s"),
        dev.create_stream().expect("s"),
    );
    let buf = dev.alloc_managed::<u32>(20_000).expect("managed");
    host_fill(&buf, |_| 5);
    let boom = Kernel::new("boom", |b| {
        let _ = b.write::<u32>(0);
        panic!("injected");
    })
    .wgsl(common::wgsl::fails("injected"), "main");
    bad.launch(&boom, 1.into(), &[Arg::managed_write_range(&buf, ..10_000)])
        .expect("launch");
    // Another stream's work on the same pages waits for it, and runs.
    good.launch(&affine(1, 1), 2.into(), &[Arg::managed_write(&buf)])
        .expect("launch");
    good.synchronize().expect("the other stream goes on");
    assert!(bad.synchronize().is_err(), "the fault stays on its stream");
    let g = buf.read(10_000..).expect("read after a fault elsewhere");
    assert!(g.iter().all(|&x| x == 6));
}

#[test]
fn host_threads_reading_while_kernels_write_never_see_torn_data() {
    if common::skipped("host_threads_reading_while_kernels_write_never_see_torn_data") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let n = 64 * 1024;
    let buf = std::sync::Arc::new(dev.alloc_managed::<u32>(n).expect("managed"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (buf, stop) = (buf.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut looks = 0;
                while !stop.load(std::sync::atomic::Ordering::Acquire) || looks == 0 {
                    let g = buf.read(..).expect("read");
                    let first = g[0];
                    assert!(g.iter().all(|&x| x == first), "torn: {first} and others");
                    looks += 1;
                }
                looks
            })
        })
        .collect();
    let set = |v: u32| {
        Kernel::new("set", move |b| b.write::<u32>(0).fill(v))
            .wgsl(common::wgsl::map("u32", 0, &format!("{v}u")), "main")
    };
    for v in 1..=20 {
        s.launch(&set(v), 4.into(), &[Arg::managed_write(&buf)])
            .expect("launch");
        if v % 5 == 0 {
            s.synchronize().expect("sync");
        }
    }
    s.synchronize().expect("sync");
    stop.store(true, std::sync::atomic::Ordering::Release);
    for r in readers {
        assert!(r.join().expect("reader") > 0);
    }
    assert!(buf.read(..).expect("read").iter().all(|&x| x == 20));
}

#[test]
fn prefetch_moves_pages_ahead_so_the_kernel_and_the_host_copy_nothing() {
    if common::skipped("prefetch_moves_pages_ahead_so_the_kernel_and_the_host_copy_nothing") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let buf = dev.alloc_managed::<u32>(100_000).expect("managed");
    host_fill(&buf, |i| i as u32);
    buf.prefetch(.., Location::Device(dev.id()), &s)
        .expect("prefetch");
    let st0 = dev.managed_stats();
    s.launch(&affine(1, 5), 2.into(), &[Arg::managed_write(&buf)])
        .expect("launch");
    buf.prefetch(.., Location::Host, &s).expect("prefetch");
    s.synchronize().expect("sync");
    let st1 = dev.managed_stats();
    assert_eq!(
        st1.declared_pages, st0.declared_pages,
        "the kernel found its pages resident"
    );
    let g = buf.read(..).expect("read");
    let st2 = dev.managed_stats();
    assert_eq!(
        st2.host_access_pages, st1.host_access_pages,
        "the guard found them home"
    );
    assert!(g.iter().enumerate().all(|(i, &x)| x == i as u32 + 5));
    if moves() {
        let pages = (100_000 * 4u64).div_ceil(64 << 10);
        assert_eq!(
            st1.prefetch_pages - st0.prefetch_pages,
            pages,
            "prefetched back"
        );
        assert_eq!(
            st2.resident_bytes, 0,
            "prefetched to the host without ReadMostly: moved"
        );
    }
    // Another device's id, and a stream of another device, are typed errors.
    let other = common::device();
    let so = other.create_stream().expect("stream");
    assert!(matches!(
        buf.prefetch(.., Location::Device(other.id()), &s),
        Err(Error::Managed { .. })
    ));
    assert!(matches!(
        buf.prefetch(.., Location::Host, &so),
        Err(Error::WrongDevice { .. })
    ));
}

#[test]
fn read_mostly_keeps_a_replica_and_preferred_host_pages_are_evicted_first() {
    if common::skipped("read_mostly_keeps_a_replica_and_preferred_host_pages_are_evicted_first") {
        return;
    }
    let dev = device_of_capacity(1 << 20);
    let s = dev.create_stream().expect("stream");
    let page = 64 << 10;
    let words = page / 4;
    let a = dev.alloc_managed::<u32>(8 * words).expect("a");
    let b = dev.alloc_managed::<u32>(8 * words).expect("b");
    let c = dev.alloc_managed::<u32>(8 * words).expect("c");
    host_fill(&a, |i| i as u32);
    host_fill(&b, |i| i as u32);
    a.advise(.., Advice::ReadMostly).expect("advise");
    let sum = touch();
    s.launch(&sum, 1.into(), &[Arg::managed_read(&a)])
        .expect("launch");
    a.prefetch(.., Location::Host, &s).expect("prefetch");
    s.synchronize().expect("sync");
    assert_eq!(
        dev.managed_stats().resident_bytes,
        8 * page as u64,
        "a's replica stays"
    );
    // b prefers the host: with a and b resident (16 pages = capacity), c's
    // pages push b's out, not a's.
    b.advise(.., Advice::PreferredLocation(Location::Host))
        .expect("advise");
    s.launch(&sum, 1.into(), &[Arg::managed_read(&b)])
        .expect("launch");
    let before = dev.managed_stats();
    s.launch(&affine(1, 1), 1.into(), &[Arg::managed_write(&c)])
        .expect("launch");
    s.synchronize().expect("sync");
    let after = dev.managed_stats();
    assert_eq!(
        after.clean_evictions - before.clean_evictions,
        8,
        "b's eight pages"
    );
    let before = dev.managed_stats();
    s.launch(&sum, 1.into(), &[Arg::managed_read(&a)])
        .expect("launch");
    s.synchronize().expect("sync");
    assert_eq!(
        dev.managed_stats().declared_pages,
        before.declared_pages,
        "a stayed resident"
    );
}

#[test]
fn accessed_by_pages_are_copied_back_to_the_device_when_a_write_guard_drops() {
    if common::skipped("accessed_by_pages_are_copied_back_to_the_device_when_a_write_guard_drops") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let buf = dev.alloc_managed::<u32>(64 * 1024).expect("managed");
    buf.advise(.., Advice::AccessedBy(Location::Device(dev.id())))
        .expect("advise");
    host_fill(&buf, |i| i as u32);
    let before = dev.managed_stats();
    s.launch(&affine(1, 1), 2.into(), &[Arg::managed_write(&buf)])
        .expect("launch");
    s.synchronize().expect("sync");
    let after = dev.managed_stats();
    assert_eq!(after.declared_pages, before.declared_pages, "already there");
    if moves() {
        assert_eq!(after.resident_bytes, 256 << 10);
        assert_eq!(after.prefetch_pages, 4, "the refresh after the guard");
    }
    assert!(buf
        .read(..)
        .expect("read")
        .iter()
        .enumerate()
        .all(|(i, &x)| x == i as u32 + 1));
}

#[test]
fn threads_with_their_own_streams_and_ranges_run_side_by_side() {
    if common::skipped("threads_with_their_own_streams_and_ranges_run_side_by_side") {
        return;
    }
    let dev = common::device();
    let n = 4 * 32 * 1024;
    let buf = std::sync::Arc::new(dev.alloc_managed::<u32>(n).expect("managed"));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (dev, buf) = (dev.clone(), buf.clone());
            std::thread::spawn(move || {
                let s = dev.create_stream().expect("stream");
                let r = w * n / 4..(w + 1) * n / 4;
                for round in 0..10u32 {
                    buf.write(r.clone()).expect("write").fill(round);
                    s.launch(
                        &affine(3, w as u32),
                        2.into(),
                        &[Arg::managed_write_range(&buf, r.clone())],
                    )
                    .expect("launch");
                    let want = round * 3 + w as u32;
                    assert!(buf
                        .read(r.clone())
                        .expect("read")
                        .iter()
                        .all(|&x| x == want));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
}

#[test]
fn eviction_copies_nothing_for_clean_pages_and_each_dirty_page_once() {
    if common::skipped("eviction_copies_nothing_for_clean_pages_and_each_dirty_page_once") {
        return;
    }
    let dev = device_of_capacity(1 << 20);
    let s = dev.create_stream().expect("stream");
    let page = 64 << 10;
    let half = 16 * page / 4; // 16 pages: the whole capacity
    let buf = dev.alloc_managed::<u32>(2 * half).expect("managed");
    host_fill(&buf, |i| i as u32);
    let touch = touch();
    s.launch(&touch, 1.into(), &[Arg::managed_read_range(&buf, ..half)])
        .expect("first half in");
    s.launch(
        &affine(1, 1),
        2.into(),
        &[Arg::managed_write_range(&buf, half..)],
    )
    .expect("second half in: the first goes, clean");
    s.synchronize().expect("sync");
    let st = dev.managed_stats();
    assert_eq!((st.clean_evictions, st.dirty_evictions), (16, 0));
    assert_eq!(st.bytes_to_host, 0, "a clean eviction copies nothing");
    s.launch(&touch, 1.into(), &[Arg::managed_read_range(&buf, ..half)])
        .expect("first half again: the second goes, dirty");
    s.synchronize().expect("sync");
    let st = dev.managed_stats();
    assert_eq!(st.dirty_evictions, 16);
    assert_eq!(
        st.dirty_eviction_bytes,
        16 * page as u64,
        "each dirty page once"
    );
    assert_eq!(st.bytes_to_host, 16 * page as u64);
    assert_eq!(st.resident_bytes, 16 * page as u64);
    let g = buf.read(..).expect("read");
    assert!(g
        .iter()
        .enumerate()
        .all(|(i, &x)| x == i as u32 + u32::from(i >= half)));
    drop(g);
    assert_eq!(
        dev.managed_stats().bytes_to_host,
        16 * page as u64,
        "the host read finds the written half home already"
    );
}

#[test]
fn a_working_set_past_capacity_is_a_typed_error_naming_the_figures() {
    if common::skipped("a_working_set_past_capacity_is_a_typed_error_naming_the_figures") {
        return;
    }
    let dev = device_of_capacity(1 << 20);
    let s = dev.create_stream().expect("stream");
    let buf = dev
        .alloc_managed::<u32>(1 << 19)
        .expect("2 MiB managed on a 1 MiB device");
    let err = s
        .launch(&affine(1, 1), 1.into(), &[Arg::managed_write(&buf)])
        .expect_err("past capacity");
    match &err {
        Error::ManagedWorkingSet {
            needed,
            budget,
            capacity,
            ..
        } => {
            assert_eq!(*needed, 2 << 20);
            assert_eq!(*capacity, 1 << 20);
            assert!(*budget <= 1 << 20);
        }
        other => panic!("expected ManagedWorkingSet, got {other}"),
    }
    assert!(err.to_string().contains("2097152"), "{err}");
    // Nothing was submitted; half of it works.
    s.launch(
        &affine(1, 1),
        1.into(),
        &[Arg::managed_write_range(&buf, ..1 << 17)],
    )
    .expect("a quarter fits");
    assert_eq!(buf.read(..4).expect("read")[0], 1);
}

#[test]
fn thrashing_pages_are_throttled_then_pinned() {
    if common::skipped("thrashing_pages_are_throttled_then_pinned") {
        return;
    }
    let dev = device_of_capacity(1 << 20);
    let s = dev.create_stream().expect("stream");
    let page = 64 << 10;
    let words = page / 4;
    let buf = dev.alloc_managed::<u32>(24 * words).expect("1.5x capacity");
    let touch = touch();
    for round in 0..40 {
        let r = if round % 2 == 0 {
            0..12 * words
        } else {
            12 * words..24 * words
        };
        s.launch(&touch, 1.into(), &[Arg::managed_read_range(&buf, r)])
            .expect("launch");
    }
    s.synchronize().expect("sync");
    let st = dev.managed_stats();
    assert!(st.thrash_events > 0, "{st:?}");
    assert!(st.throttled_pages > 0, "{st:?}");
    assert!(st.pinned_pages > 0, "{st:?}");
    // The same rounds with throttling off: the same thrash is seen, no page is
    // throttled or pinned.
    let dev = device_of_capacity(1 << 20);
    dev.set_managed_thrash_throttling(false);
    let s = dev.create_stream().expect("stream");
    let buf = dev.alloc_managed::<u32>(24 * words).expect("1.5x capacity");
    for round in 0..40 {
        let r = if round % 2 == 0 {
            0..12 * words
        } else {
            12 * words..24 * words
        };
        s.launch(&touch, 1.into(), &[Arg::managed_read_range(&buf, r)])
            .expect("launch");
    }
    s.synchronize().expect("sync");
    let off = dev.managed_stats();
    assert!(off.thrash_events > 0, "{off:?}");
    assert_eq!((off.throttled_pages, off.pinned_pages), (0, 0), "{off:?}");
}

#[test]
fn migrations_are_recorded_with_their_reason_and_sum_to_the_stats() {
    if common::skipped("migrations_are_recorded_with_their_reason_and_sum_to_the_stats") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    hetero_trace::set_enabled(true);
    let buf = dev.alloc_managed::<u32>(100_000).expect("managed");
    host_fill(&buf, |i| i as u32);
    s.launch(&affine(1, 1), 2.into(), &[Arg::managed_write(&buf)])
        .expect("launch");
    buf.prefetch(..50_000, Location::Host, &s)
        .expect("prefetch");
    let _ = buf.read(..).expect("read");
    let trace = hetero_trace::take();
    let mine: Vec<_> = trace
        .migrations
        .iter()
        .filter(|m| m.buffer == buf.id())
        .collect();
    let sum = |f: &dyn Fn(&&hetero_trace::MigrationRecord) -> bool| -> u64 {
        mine.iter().filter(|m| f(m)).map(|m| m.bytes).sum()
    };
    use hetero::MigrationReason as R;
    let bytes = 400_000u64;
    if moves() {
        assert_eq!(sum(&|m| m.reason == R::Declared && !m.to_host), bytes);
        // Elements 0..50_000 are bytes 0..200_000: pages 0..4 of 64 KiB.
        let prefetched = 4 * 65_536;
        assert_eq!(sum(&|m| m.reason == R::Prefetch && m.to_host), prefetched);
        assert_eq!(
            sum(&|m| m.reason == R::HostAccess && m.to_host),
            bytes - prefetched
        );
        let report = hetero_profile::Report::build(&trace, &Default::default());
        let md = report.to_markdown();
        assert!(md.contains("Migrations"), "{md}");
    } else {
        assert!(mine.is_empty(), "one memory: no migrations");
    }
}

#[test]
fn empty_huge_and_misused_buffers_are_inputs_not_crashes() {
    if common::skipped("empty_huge_and_misused_buffers_are_inputs_not_crashes") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let empty = dev.alloc_managed::<u64>(0).expect("empty");
    assert!(empty.read(..).expect("read").is_empty());
    let touch = Kernel::new("touch", |b| assert!(b.read::<u64>(0).is_empty()))
        .wgsl(common::wgsl::nothing(1), "main");
    s.launch(&touch, 1.into(), &[Arg::managed_read(&empty)])
        .expect("an empty argument");
    s.synchronize().expect("the kernel saw an empty slice");
    empty
        .prefetch(.., Location::Host, &s)
        .expect("prefetch nothing");
    assert!(matches!(
        dev.alloc_managed::<u64>(usize::MAX),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        dev.alloc_managed_with_page::<u8>(10, 1000),
        Err(Error::InvalidArgument(_))
    ));
    let buf = dev.alloc_managed::<u32>(100).expect("managed");
    assert!(matches!(buf.read(50..200), Err(Error::OutOfBounds { .. })));
    assert!(matches!(
        s.launch(
            &affine(1, 1),
            1.into(),
            &[Arg::managed_write_range(&buf, 90..101)]
        ),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        s.launch(
            &plus_one(),
            1.into(),
            &[
                Arg::managed_read_range(&buf, 0..50),
                Arg::managed_write_range(&buf, 40..90)
            ]
        ),
        Err(Error::Aliasing { .. })
    ));
    // Disjoint ranges of one buffer are fine (starting at multiples of 256
    // bytes: what a Vulkan device can bind a range at).
    let buf = dev.alloc_managed::<u32>(128).expect("managed");
    s.launch(
        &plus_one(),
        1.into(),
        &[
            Arg::managed_read_range(&buf, 0..64),
            Arg::managed_write_range(&buf, 64..128),
        ],
    )
    .expect("disjoint");
    assert_eq!(buf.read(64..65).expect("read")[0], 1);
    // On Vulkan a range elsewhere is a typed error, before anything runs.
    if common::backend() == common::Backend::Vulkan {
        let e = s
            .launch(
                &plus_one(),
                1.into(),
                &[Arg::managed_write_range(&buf, 50..60)],
            )
            .expect_err("a range at byte 200");
        assert!(matches!(e, Error::Managed { .. }), "{e}");
    }
    let other = common::device();
    let so = other.create_stream().expect("stream");
    assert!(matches!(
        so.launch(&affine(1, 1), 1.into(), &[Arg::managed_write(&buf)]),
        Err(Error::WrongDevice { .. })
    ));
    s.begin_capture().expect("capture");
    assert!(matches!(
        buf.prefetch(.., Location::Host, &s),
        Err(Error::Managed { .. })
    ));
    let _ = s.end_capture();
}

/// `x[i] = i * 2 + 1` written by the host, then read back after kernels.
fn host_pattern(buf: &ManagedBuffer<u32>, k: u32) {
    host_fill(buf, |i| i as u32 * 2 + k);
}

#[test]
fn a_captured_graph_makes_its_managed_pages_resident_at_each_launch() {
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let other = dev.create_stream().expect("stream");
    let n = 40_000;
    let a = dev.alloc_managed::<u32>(n).expect("a");
    let b = dev.alloc_managed::<u32>(n).expect("b");
    // Recorded: b = a + 1, then b = b * 3 + 2. Nothing runs or moves yet.
    s.begin_capture().expect("capture");
    s.launch(
        &plus_one(),
        1.into(),
        &[Arg::managed_read(&a), Arg::managed_write(&b)],
    )
    .expect("recorded");
    s.launch(&affine(3, 2), 4.into(), &[Arg::managed_write(&b)])
        .expect("recorded");
    let graph = s.end_capture().expect("graph");
    assert_eq!(
        dev.managed_stats().bytes_to_device,
        0,
        "recording moves nothing"
    );
    let exec = graph.instantiate().expect("instantiate");
    let before = dev.managed_stats();
    for round in 0..3u32 {
        // The host writes `a` between launches: each launch sees the latest.
        host_pattern(&a, round);
        // Launched on a stream other than the one that recorded it.
        other.launch_graph(&exec).expect("launch");
        // No synchronize: the host read waits for the graph on its pages.
        let g = b.read(..).expect("read");
        for (i, &x) in g.iter().enumerate() {
            let want = (i as u32 * 2 + round + 1) * 3 + 2;
            assert_eq!(x, want, "round {round}, element {i}");
        }
    }
    if moves() {
        let after = dev.managed_stats();
        let bytes = (n * 4) as u64;
        assert_eq!(
            after.bytes_to_device - before.bytes_to_device,
            3 * bytes,
            "each launch copied in the `a` the host rewrote, and only it (b's pages \
             stayed on the device: the host only read them)"
        );
        assert!(after.declared_pages > before.declared_pages);
    }
}

#[test]
fn attached_buffers_refuse_other_streams_and_host_attach_gives_back_device_memory() {
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let other = dev.create_stream().expect("stream");
    let n = 50_000;
    let buf = dev.alloc_managed::<u32>(n).expect("managed");
    // Single: only `s` may use it.
    s.attach(&buf, Attach::Single).expect("attach");
    s.launch(&affine(1, 3), 4.into(), &[Arg::managed_write(&buf)])
        .expect("the attached stream");
    let e = other
        .launch(&affine(1, 3), 4.into(), &[Arg::managed_write(&buf)])
        .expect_err("another stream");
    assert!(matches!(e, Error::Managed { .. }), "{e}");
    assert!(e.to_string().contains("Attach::Single"), "{e}");
    assert!(matches!(
        buf.prefetch(.., Location::Device(dev.id()), &other),
        Err(Error::Managed { .. })
    ));
    // Host: the pages come back, the device's copy goes.
    let resident = dev.managed_stats().resident_bytes;
    s.attach(&buf, Attach::Host).expect("attach to the host");
    s.synchronize().expect("sync");
    if moves() {
        assert!(resident >= (n * 4) as u64, "the kernel made it resident");
        assert_eq!(
            resident - dev.managed_stats().resident_bytes,
            (n * 4) as u64,
            "every page of the buffer left the device"
        );
    }
    for st in [&s, &other] {
        let e = st
            .launch(&affine(1, 3), 4.into(), &[Arg::managed_write(&buf)])
            .expect_err("attached to the host");
        assert!(e.to_string().contains("Attach::Host"), "{e}");
    }
    // The host reads without moving anything: it is all there.
    let back = dev.managed_stats().bytes_to_host;
    assert!(buf.read(..).expect("read").iter().all(|&x| x == 3));
    assert_eq!(dev.managed_stats().bytes_to_host, back);
    // Global again: any stream.
    other.attach(&buf, Attach::Global).expect("attach");
    other
        .launch(&affine(2, 0), 4.into(), &[Arg::managed_write(&buf)])
        .expect("any stream");
    assert!(buf.read(..).expect("read").iter().all(|&x| x == 6));
    // Attaching is not recordable, and a stream of another device is refused.
    s.begin_capture().expect("capture");
    assert!(matches!(
        s.attach(&buf, Attach::Single),
        Err(Error::Managed { .. })
    ));
    let _ = s.end_capture();
    let dev2 = common::device();
    let s2 = dev2.create_stream().expect("stream");
    assert!(matches!(
        s2.attach(&buf, Attach::Single),
        Err(Error::WrongDevice { .. })
    ));
}

#[test]
fn command_buffers_record_managed_copies_and_prefetches() {
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let n = 20_000;
    let m = dev.alloc_managed::<u32>(n).expect("managed");
    let d = dev.alloc::<u32>(n).expect("device");
    let back = dev.alloc_managed::<u32>(n).expect("managed");
    let cb = hetero::CommandBuffer::new(&dev).expect("command buffer");
    m.prefetch(.., Location::Device(dev.id()), &cb)
        .expect("prefetch recorded");
    cb.copy_from_managed(&m, 0, &d, 0, n).expect("recorded");
    cb.launch(&affine(1, 5), 4.into(), &[Arg::write(&d)])
        .expect("recorded");
    cb.copy_to_managed(&d, 0, &back, 0, n).expect("recorded");
    let exec = cb.finish().expect("finish");
    for round in 0..2u32 {
        host_pattern(&m, round);
        s.launch_graph(&exec).expect("launch");
        let g = back.read(..).expect("read");
        for (i, &x) in g.iter().enumerate() {
            assert_eq!(x, i as u32 * 2 + round + 5, "round {round}, element {i}");
        }
    }
}

#[test]
fn copies_between_managed_and_device_buffers_follow_the_pages() {
    if common::skipped("copies_between_managed_and_device_buffers_follow_the_pages") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let m = dev.alloc_managed::<u32>(30_000).expect("managed");
    let d = dev.alloc::<u32>(10_000).expect("device");
    host_fill(&m, |i| i as u32);
    s.copy_from_managed(&m, 5_000, &d, 0, 10_000).expect("from");
    s.copy_to_managed(&d, 0, &m, 20_000, 10_000).expect("to");
    let g = m.read(..).expect("read");
    for i in 0..30_000 {
        let want = if i >= 20_000 {
            (i - 15_000) as u32
        } else {
            i as u32
        };
        assert_eq!(g[i], want, "element {i}");
    }
}

/// One step of a random program.
#[derive(Clone, Debug)]
enum Step {
    HostWrite {
        buf: usize,
        start: usize,
        len: usize,
        value: u32,
    },
    HostRead {
        buf: usize,
        start: usize,
        len: usize,
    },
    Affine {
        stream: usize,
        buf: usize,
        start: usize,
        len: usize,
        a: u32,
        c: u32,
        blocks: u32,
    },
    PlusOne {
        stream: usize,
        src: usize,
        dst: usize,
        start: usize,
        len: usize,
        to: usize,
    },
    Prefetch {
        stream: usize,
        buf: usize,
        start: usize,
        len: usize,
        host: bool,
    },
    Advise {
        buf: usize,
        start: usize,
        len: usize,
        which: u8,
        on: bool,
    },
    /// A store through the host view (`as_mut_slice`).
    ViewWrite {
        buf: usize,
        start: usize,
        len: usize,
        value: u32,
    },
    /// A load through the host view (`as_slice`).
    ViewRead {
        buf: usize,
        start: usize,
        len: usize,
    },
}

/// Buffer length (elements), coherence page, longest range of a step.
#[derive(Clone, Copy)]
struct Shape {
    n: usize,
    page: usize,
    max_len: usize,
}

/// Two buffers of 3 pages and a bit, 4 KiB pages: ranges cross pages.
const SMALL: Shape = Shape {
    n: 3000,
    page: 4096,
    max_len: 2500,
};
/// Two buffers of 10 pages of 64 KiB on a device of 16: evictions throughout;
/// a step's pages (at most 2 x 5) always fit.
const PAST_CAPACITY: Shape = Shape {
    n: 160_000,
    page: 64 << 10,
    max_len: 60_000,
};

fn step(shape: Shape) -> impl Strategy<Value = Step> {
    let n = shape.n;
    let range = move || (0..n).prop_flat_map(move |s| (Just(s), 0..=(n - s).min(shape.max_len)));
    prop_oneof![
        (0..2usize, range(), any::<u32>()).prop_map(|(buf, (start, len), value)| Step::HostWrite {
            buf,
            start,
            len,
            value
        }),
        (0..2usize, range()).prop_map(|(buf, (start, len))| Step::HostRead { buf, start, len }),
        (
            0..3usize,
            0..2usize,
            range(),
            any::<u32>(),
            any::<u32>(),
            1..4u32
        )
            .prop_map(|(stream, buf, (start, len), a, c, blocks)| Step::Affine {
                stream,
                buf,
                start: kernel_at(start),
                len,
                a,
                c,
                blocks
            }),
        (0..3usize, 0..2usize, range(), 0..n).prop_map(move |(stream, src, (start, len), to)| {
            Step::PlusOne {
                stream,
                src,
                dst: 1 - src,
                start: kernel_at(start),
                len,
                to: kernel_at(to.min(n - len)),
            }
        }),
        (0..3usize, 0..2usize, range(), any::<bool>()).prop_map(
            |(stream, buf, (start, len), host)| Step::Prefetch {
                stream,
                buf,
                start,
                len,
                host
            }
        ),
        (0..2usize, range(), 0..3u8, any::<bool>()).prop_map(|(buf, (start, len), which, on)| {
            Step::Advise {
                buf,
                start,
                len,
                which,
                on,
            }
        }),
        (0..2usize, range(), any::<u32>()).prop_map(|(buf, (start, len), value)| Step::ViewWrite {
            buf,
            start,
            len,
            value
        }),
        (0..2usize, range()).prop_map(|(buf, (start, len))| Step::ViewRead { buf, start, len }),
    ]
}

fn run_program(dev: &Device, shape: Shape, steps: &[Step]) -> Result<(), TestCaseError> {
    let streams: Vec<Stream> = (0..3).map(|_| dev.create_stream().expect("s")).collect();
    let mut bufs: Vec<ManagedBuffer<u32>> = (0..2)
        .map(|_| {
            dev.alloc_managed_with_page::<u32>(shape.n, shape.page)
                .expect("managed")
        })
        .collect();
    let mut model = vec![vec![0u32; shape.n]; 2];
    // Both buffers to the device first: past capacity, the second pushes
    // pages of the first out.
    for b in &bufs {
        b.prefetch(.., Location::Device(dev.id()), &streams[0])
            .expect("prefetch");
    }
    for st in steps {
        match *st {
            Step::HostWrite {
                buf,
                start,
                len,
                value,
            } => {
                bufs[buf]
                    .write(start..start + len)
                    .expect("write")
                    .fill(value);
                model[buf][start..start + len].fill(value);
            }
            Step::HostRead { buf, start, len } => {
                let g = bufs[buf].read(start..start + len).expect("read");
                prop_assert_eq!(&*g, &model[buf][start..start + len]);
            }
            Step::Affine {
                stream,
                buf,
                start,
                len,
                a,
                c,
                blocks,
            } => {
                streams[stream]
                    .launch(
                        &affine(a, c),
                        blocks.into(),
                        &[Arg::managed_write_range(&bufs[buf], start..start + len)],
                    )
                    .expect("launch");
                for x in &mut model[buf][start..start + len] {
                    *x = x.wrapping_mul(a).wrapping_add(c);
                }
            }
            Step::PlusOne {
                stream,
                src,
                dst,
                start,
                len,
                to,
            } => {
                streams[stream]
                    .launch(
                        &plus_one(),
                        1.into(),
                        &[
                            Arg::managed_read_range(&bufs[src], start..start + len),
                            Arg::managed_write_range(&bufs[dst], to..to + len),
                        ],
                    )
                    .expect("launch");
                for i in 0..len {
                    model[dst][to + i] = model[src][start + i].wrapping_add(1);
                }
            }
            Step::Prefetch {
                stream,
                buf,
                start,
                len,
                host,
            } => {
                let to = if host {
                    Location::Host
                } else {
                    Location::Device(dev.id())
                };
                bufs[buf]
                    .prefetch(start..start + len, to, &streams[stream])
                    .expect("prefetch");
            }
            Step::Advise {
                buf,
                start,
                len,
                which,
                on,
            } => {
                let advice = match which {
                    0 => Advice::ReadMostly,
                    1 => Advice::PreferredLocation(Location::Host),
                    _ => Advice::AccessedBy(Location::Device(dev.id())),
                };
                let r = start..start + len;
                if on {
                    bufs[buf].advise(r, advice).expect("advise");
                } else {
                    bufs[buf].unadvise(r, advice).expect("unadvise");
                }
            }
            Step::ViewWrite {
                buf,
                start,
                len,
                value,
            } => {
                bufs[buf].as_mut_slice().expect("view")[start..start + len].fill(value);
                model[buf][start..start + len].fill(value);
            }
            Step::ViewRead { buf, start, len } => {
                let v = bufs[buf].as_slice().expect("view");
                prop_assert_eq!(&v[start..start + len], &model[buf][start..start + len]);
            }
        }
    }
    for (b, m) in bufs.iter().zip(&model) {
        prop_assert_eq!(&*b.read(..).expect("read"), &m[..]);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_programs_match_the_sequential_model(steps in prop::collection::vec(step(SMALL), 1..30)) {
        if common::skipped("random_programs_match_the_sequential_model") {
            return Ok(());
        }
        let dev = common::device();
        run_program(&dev, SMALL, &steps)?;
    }
}

#[test]
fn random_programs_past_capacity_match_the_sequential_model() {
    if common::skipped("random_programs_past_capacity_match_the_sequential_model") {
        return;
    }
    let dev = device_of_capacity(1 << 20);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 16,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &prop::collection::vec(step(PAST_CAPACITY), 1..30),
            |steps| run_program(&dev, PAST_CAPACITY, &steps),
        )
        .expect("every program matches the model");
    assert!(dev.managed_stats().clean_evictions + dev.managed_stats().dirty_evictions > 0);
}

/// Whether the device under test takes host faults (its own memory, on a
/// backend with host views: the emulated device, Vulkan where the driver
/// imports host memory, as lavapipe does).
fn faults() -> bool {
    matches!(
        common::backend(),
        common::Backend::EmuVirtual | common::Backend::EmuReal | common::Backend::Vulkan
    )
}

#[test]
fn the_host_view_sees_kernel_writes_and_kernels_see_host_view_writes() {
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let mut buf = dev.alloc_managed::<u32>(100_000).expect("managed");
    for (i, x) in buf.as_mut_slice().expect("view").iter_mut().enumerate() {
        *x = i as u32;
    }
    s.launch(&affine(3, 1), 4.into(), &[Arg::managed_write(&buf)])
        .expect("launch");
    let before = dev.managed_stats().host_fault_pages;
    // No synchronize: the touch itself waits for the kernel on its page.
    let v = buf.as_slice().expect("view");
    for (i, &x) in v.iter().enumerate() {
        assert_eq!(x, i as u32 * 3 + 1, "element {i}");
    }
    if faults() {
        let pages = (100_000 * 4usize).div_ceil(64 << 10) as u64;
        assert_eq!(
            dev.managed_stats().host_fault_pages - before,
            pages,
            "every page the kernel dirtied came back by a fault, once"
        );
        assert!(buf.host_faults() > 0);
    }
    // A host write to pages the device holds: the next kernel sees it.
    buf.as_mut_slice().expect("view")[70_000] = 7;
    s.launch(&affine(1, 1), 4.into(), &[Arg::managed_write(&buf)])
        .expect("launch");
    assert_eq!(buf.as_slice().expect("view")[70_000], 8);
    assert_eq!(buf.as_slice().expect("view")[5], 17);
}

#[test]
fn a_host_touch_waits_for_the_queued_kernel_on_its_page() {
    if common::skipped("a_host_touch_waits_for_the_queued_kernel_on_its_page") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let buf = dev.alloc_managed::<u32>(4096).expect("managed");
    let gate = common::Gate::hold(&s);
    s.launch(&affine(1, 5), 1.into(), &[Arg::managed_write(&buf)])
        .expect("launch");
    let ptr = buf.host_ptr() as usize;
    let reader = std::thread::spawn(move || {
        // SAFETY: the buffer outlives the thread (joined below) and nothing
        // submitted after this touch writes the element.
        unsafe { std::ptr::read_volatile((ptr as *const u32).add(100)) }
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(!reader.is_finished(), "the touch waits for the kernel");
    gate.open();
    assert_eq!(reader.join().expect("reader"), 5, "and then sees its write");
}

#[test]
fn host_faults_bring_the_rest_of_a_2mib_block_after_two_sequential_faults() {
    if common::skipped("host_faults_bring_the_rest_of_a_2mib_block_after_two_sequential_faults") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let page = 64 << 10;
    let per_block = (2 << 20) / page;
    let n = 2 * per_block * page / 4;
    for tree in [true, false] {
        let buf = dev.alloc_managed::<u32>(n).expect("managed");
        buf.set_host_fault_prefetch(tree);
        s.launch(&affine(1, 9), 4.into(), &[Arg::managed_write(&buf)])
            .expect("launch");
        s.synchronize().expect("sync");
        let before = dev.managed_stats().host_fault_pages;
        let at = |p: usize| {
            // SAFETY: inside the buffer, which outlives the read; nothing
            // else uses it meanwhile.
            unsafe { std::ptr::read_volatile(buf.host_ptr().add(p * page / 4)) }
        };
        assert_eq!(at(0), 9);
        assert_eq!(at(1), 9);
        let brought = dev.managed_stats().host_fault_pages - before;
        let want = if tree { per_block } else { 2 } as u64;
        assert_eq!(brought, want, "tree prefetch {tree}: pages copied back");
        // The next block starts over: one page.
        assert_eq!(at(per_block), 9);
        assert_eq!(
            dev.managed_stats().host_fault_pages - before,
            want + 1,
            "tree prefetch {tree}"
        );
    }
}

#[test]
fn a_host_write_to_a_page_the_device_holds_invalidates_the_device_copy() {
    if common::skipped("a_host_write_to_a_page_the_device_holds_invalidates_the_device_copy") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let mut buf = dev.alloc_managed::<u32>(1 << 16).expect("managed");
    buf.as_mut_slice().expect("view").fill(1);
    // Copies every page to the device: the host's copies stay (clean).
    buf.prefetch(.., Location::Device(dev.id()), &s)
        .expect("prefetch");
    s.synchronize().expect("sync");
    let taken = buf.host_faults();
    assert_eq!(buf.as_slice().expect("view")[3], 1, "reads need no fault");
    // SAFETY: inside the buffer; nothing else uses it meanwhile.
    unsafe { buf.host_ptr().add(20_000).write_volatile(41) };
    if faults() {
        assert_eq!(buf.host_faults(), taken + 1, "one fault: the write");
    }
    let out = dev.alloc::<u32>(1 << 16).expect("out");
    s.copy_from_managed(&buf, 0, &out, 0, 1 << 16)
        .expect("copy");
    let back = s.read_to_vec(&out).expect("read");
    assert_eq!(back[20_000], 41, "the device copy was refreshed");
    assert_eq!(back[3], 1);
}

#[test]
fn host_fault_mechanism_follows_the_environment() {
    let dev = common::device();
    let _buf = dev.alloc_managed::<u32>(16).expect("managed");
    if !faults() {
        return;
    }
    let m = hetero::host_fault_mechanism();
    match std::env::var("HETERO_MANAGED_FAULTS").as_deref() {
        Ok("mprotect") => assert!(
            matches!(&m, hetero::FaultMechanism::Mprotect { reason } if reason.contains("HETERO_MANAGED_FAULTS")),
            "{m:?}"
        ),
        // Root on a 6.x kernel here: userfaultfd is there.
        _ => assert_eq!(m, hetero::FaultMechanism::Userfaultfd),
    }
}

/// Runs this test binary again on `filter` with `env` set; its status.
fn rerun(filter: &str, env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([filter, "--test-threads=1", "--nocapture"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("the test binary runs again");
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut out);
            }
            out
        })
    };
    let stdout = drain(child.stdout.take().map(|r| Box::new(r) as _));
    let stderr = drain(child.stderr.take().map(|r| Box::new(r) as _));
    // A swallowed fault re-runs the access for ever: a hang is a failure.
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("child status") {
            break status;
        }
        if start.elapsed() > std::time::Duration::from_secs(120) {
            let _ = child.kill();
            panic!("{filter} with {env:?}: still running after 120 s (a swallowed fault loops)");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    std::process::Output {
        status,
        stdout: stdout.join().expect("stdout"),
        stderr: stderr.join().expect("stderr"),
    }
}

/// In a child (`HETERO_FAULT_CHILD` names what to touch): a fault outside
/// every managed buffer, with the fault handlers installed, must kill.
#[test]
fn child_touching_unmanaged_memory() {
    let Ok(what) = std::env::var("HETERO_FAULT_CHILD") else {
        return;
    };
    let dev = common::device();
    let buf = dev.alloc_managed::<u32>(1 << 14).expect("managed");
    // SAFETY: deliberately faults (the parent expects this child to die).
    unsafe {
        match what.as_str() {
            "segv" => {
                let p = rustix::mm::mmap_anonymous(
                    std::ptr::null_mut(),
                    4096,
                    rustix::mm::ProtFlags::empty(),
                    rustix::mm::MapFlags::PRIVATE,
                )
                .expect("mmap");
                std::ptr::read_volatile(p.cast::<u32>());
            }
            "bus" => {
                // A shared mapping past the end of its (empty) file: SIGBUS.
                let fd = rustix::fs::memfd_create("empty", rustix::fs::MemfdFlags::empty())
                    .expect("memfd");
                let p = rustix::mm::mmap(
                    std::ptr::null_mut(),
                    4096,
                    rustix::mm::ProtFlags::READ,
                    rustix::mm::MapFlags::SHARED,
                    &fd,
                    0,
                )
                .expect("mmap");
                std::ptr::read_volatile(p.cast::<u32>());
            }
            _ => {
                // A dropped buffer's view is no longer managed.
                let p = buf.host_ptr();
                drop(buf);
                std::ptr::read_volatile(p);
            }
        }
    }
    println!("survived");
}

#[test]
fn a_fault_outside_managed_memory_is_the_normal_crash() {
    use std::os::unix::process::ExitStatusExt;
    for (what, signals) in [
        ("segv", &[libc_sig::SEGV][..]),
        ("bus", &[libc_sig::BUS][..]),
        ("dropped", &[libc_sig::SEGV, libc_sig::BUS][..]),
    ] {
        if what == "dropped" && !faults() {
            // Without a view the pointer is pooled memory: no crash to expect.
            continue;
        }
        let out = rerun(
            "child_touching_unmanaged_memory",
            &[("HETERO_FAULT_CHILD", what)],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            !stdout.contains("survived"),
            "{what}: the fault was swallowed"
        );
        let sig = out.status.signal();
        // Under AddressSanitizer its report exits with status 1 instead.
        let asan = String::from_utf8_lossy(&out.stderr).contains("AddressSanitizer");
        assert!(
            asan || sig.is_some_and(|s| signals.contains(&s)),
            "{what}: died by {sig:?} ({}), expected one of {signals:?}",
            out.status
        );
    }
}

/// Signal numbers on Linux (x86_64 and aarch64).
mod libc_sig {
    pub const BUS: i32 = 7;
    pub const SEGV: i32 = 11;
}

#[test]
fn the_mprotect_fallback_passes_the_host_view_tests() {
    if !faults() || std::env::var("HETERO_MANAGED_FAULTS").is_ok() {
        return;
    }
    for filter in [
        "host_view",
        "host_touch",
        "host_fault",
        "host_write",
        "random_programs_match",
        "threads_faulting",
    ] {
        let out = rerun(filter, &[("HETERO_MANAGED_FAULTS", "mprotect")]);
        assert!(
            out.status.success(),
            "{filter} under mprotect: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(" passed;"),
            "{filter}: ran"
        );
    }
}

#[test]
fn threads_faulting_on_one_buffer_at_once_each_see_and_leave_the_right_data() {
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let page = 64 << 10;
    let pages = 64;
    let per_page = page / 4;
    let mut buf = dev.alloc_managed::<u32>(pages * per_page).expect("managed");
    buf.as_mut_slice().expect("view").fill(1);
    s.launch(&affine(1, 2), 4.into(), &[Arg::managed_write(&buf)])
        .expect("launch");
    // Drops the buffer's host copies, so every touch below faults (on emu),
    // several threads at once, interleaved pages (tree prefetches race too).
    s.synchronize().expect("sync");
    let threads = 8;
    // The mutable slice's pointer: on backends without faults it waits and
    // brings the pages back first; with faults it is the host view as it
    // stands.
    let ptr = buf.as_mut_slice().expect("view").as_mut_ptr() as usize;
    let before = dev.managed_stats().host_fault_pages;
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || {
                for p in (t..pages).step_by(threads) {
                    for i in (p * per_page..(p + 1) * per_page).step_by(97) {
                        // SAFETY: inside the buffer, which outlives the scope;
                        // each thread touches only its own pages, and no op is
                        // submitted meanwhile.
                        let x = unsafe { (ptr as *mut u32).add(i) };
                        // SAFETY: as above.
                        assert_eq!(unsafe { x.read_volatile() }, 3, "page {p}");
                        // SAFETY: as above.
                        unsafe { x.write_volatile(10 + t as u32) };
                    }
                }
            });
        }
    });
    if faults() {
        assert_eq!(
            dev.managed_stats().host_fault_pages - before,
            pages as u64,
            "each page came back once, whichever thread faulted first"
        );
    }
    s.launch(&affine(2, 0), 4.into(), &[Arg::managed_write(&buf)])
        .expect("launch");
    let v = buf.as_slice().expect("view");
    for p in 0..pages {
        let t = (p % threads) as u32;
        for i in (p * per_page..(p + 1) * per_page).step_by(97) {
            assert_eq!(v[i], 2 * (10 + t), "page {p} element {i}");
        }
        assert_eq!(
            v[p * per_page + 1],
            6,
            "page {p}: an element no thread wrote"
        );
    }
}
