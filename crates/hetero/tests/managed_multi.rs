//! Managed buffers of a context of two devices, through the public API, on
//! the backend `HETERO_BACKEND` names (two devices of it in one context): a
//! page written on one device moves to the other (over the peer link between
//! emulated devices, staged through the host on Vulkan), ReadMostly keeps
//! replicas on both and a write invalidates the other, prefetch to either
//! device from a stream of either, the host reads what either device wrote,
//! each device evicts past its own capacity, and random programs over both
//! devices match a sequential model.

mod common;

use common::managed::{affine, host_fill, kernel_at, plus_one, touch};

use hetero::{
    Advice, Arg, BackendKind, Context, Device, DeviceConfig, Error, Location, ManagedBuffer,
    PeerPath, Stream,
};
use proptest::prelude::*;

/// Whether the devices under test have memory of their own (pages move).
fn moves() -> bool {
    common::backend() != common::Backend::Host
}

/// Whether pages move straight between the two devices (the emulated peer
/// link); elsewhere they are staged through the host (Vulkan) or never move
/// (host).
fn direct() -> bool {
    matches!(
        common::backend(),
        common::Backend::EmuVirtual | common::Backend::EmuReal
    )
}

/// Two devices of the backend under test, in one context.
fn pair() -> (Device, Device, Context) {
    let (a, b) = (common::device(), common::device());
    let ctx = Context::new(&[a.clone(), b.clone()]).expect("context of two devices");
    (a, b, ctx)
}

/// Two devices of the backend under test with `capacity` bytes of device
/// memory each (emu only), in one context.
fn pair_of_capacity(capacity: usize) -> (Device, Device, Context) {
    let dev = || {
        let emu = match common::config().backend_kind() {
            BackendKind::Emu(e) => e.clone().capacity(capacity),
            other => panic!("capacity is an emu setting, not {other:?}'s"),
        };
        Device::new(DeviceConfig::from_env().expect("config").emu(emu)).expect("device")
    };
    let (a, b) = (dev(), dev());
    let ctx = Context::new(&[a.clone(), b.clone()]).expect("context of two devices");
    (a, b, ctx)
}

fn pages_of(elems: usize) -> u64 {
    (elems * 4).div_ceil(64 << 10) as u64
}

#[test]
fn a_kernel_on_one_device_writes_and_a_kernel_on_the_other_reads_it() {
    if common::skipped("a_kernel_on_one_device_writes_and_a_kernel_on_the_other_reads_it") {
        return;
    }
    let (a, b, ctx) = pair();
    let (sa, sb) = (
        a.create_stream().expect("stream a"),
        b.create_stream().expect("stream b"),
    );
    let n = 100_000;
    let buf = ctx.alloc_managed::<u32>(n).expect("context buffer");
    let out = ctx.alloc_managed::<u32>(n).expect("context buffer");
    assert_eq!(buf.device_ids(), vec![a.id(), b.id()]);
    host_fill(&buf, |i| i as u32);
    sa.launch(&affine(2, 1), 4.into(), &[Arg::managed_write(&buf)])
        .expect("write on a");
    let (a0, b0) = (a.managed_stats(), b.managed_stats());
    // No event between the streams: b's kernel follows a's through the pages.
    sb.launch(
        &plus_one(),
        1.into(),
        &[Arg::managed_read(&buf), Arg::managed_write(&out)],
    )
    .expect("read on b");
    sb.synchronize().expect("b's kernel ran");
    let (a1, b1) = (a.managed_stats(), b.managed_stats());
    let bytes = (n * 4) as u64;
    let path = ctx.topology().path(a.id(), b.id()).expect("a path").clone();
    if direct() {
        assert!(matches!(path, PeerPath::Link(_)), "{path:?}");
        assert_eq!(
            b1.bytes_from_peer - b0.bytes_from_peer,
            bytes,
            "every page came from a over the peer link"
        );
        assert_eq!(a1.bytes_to_peer - a0.bytes_to_peer, bytes);
        assert_eq!(a1.bytes_to_host, a0.bytes_to_host, "none went by the host");
    } else if moves() {
        assert!(matches!(path, PeerPath::Staged { .. }), "{path:?}");
        assert_eq!(b1.bytes_from_peer, 0, "no direct path");
        assert_eq!(
            a1.bytes_to_host - a0.bytes_to_host,
            bytes,
            "staged: back to the host from a"
        );
        assert!(
            b1.bytes_to_device - b0.bytes_to_device >= bytes,
            "then in to b"
        );
    } else {
        assert_eq!(b1, b0, "one memory: nothing moves");
    }
    if moves() {
        assert_eq!(
            a1.resident_bytes, 0,
            "without ReadMostly the page moved: a's copy went"
        );
        // (out's pages were never written: making them resident copies
        // nothing, and only copies count.)
        assert_eq!(b1.declared_pages - b0.declared_pages, pages_of(n));
    }
    let g = out.read(..).expect("read");
    for (i, &x) in g.iter().enumerate() {
        assert_eq!(x, (i as u32) * 2 + 2, "element {i}");
    }
    let g = buf.read(..).expect("read");
    assert!(g.iter().enumerate().all(|(i, &x)| x == (i as u32) * 2 + 1));
}

/// `copy_to_managed` / `copy_from_managed` on a stream of either device move
/// the pages they name there, as kernels do.
#[test]
fn a_graph_on_one_device_reads_what_the_other_wrote_at_each_launch() {
    let (a, b, ctx) = pair();
    let (sa, sb) = (
        a.create_stream().expect("stream"),
        b.create_stream().expect("stream"),
    );
    let n = 30_000;
    let x = ctx.alloc_managed::<u32>(n).expect("x");
    let y = ctx.alloc_managed::<u32>(n).expect("y");
    // Recorded on a: y = x + 1. Nothing moves while recording.
    sa.begin_capture().expect("capture");
    sa.launch(
        &plus_one(),
        1.into(),
        &[Arg::managed_read(&x), Arg::managed_write(&y)],
    )
    .expect("recorded");
    let exec = sa
        .end_capture()
        .expect("graph")
        .instantiate()
        .expect("exec");
    for round in 1..=3u32 {
        // b writes x, then a's graph reads it: no event between them.
        sb.launch(&affine(0, round), 4.into(), &[Arg::managed_write(&x)])
            .expect("launch on b");
        sa.launch_graph(&exec).expect("graph on a");
        assert!(
            y.read(..).expect("read").iter().all(|&v| v == round + 1),
            "round {round}"
        );
    }
    if direct() {
        assert!(a.managed_stats().bytes_from_peer >= 3 * (n * 4) as u64);
    }
}

#[test]
fn copies_between_a_context_buffer_and_device_buffers_on_either_device() {
    if common::skipped("copies_between_a_context_buffer_and_device_buffers_on_either_device") {
        return;
    }
    let (a, b, ctx) = pair();
    let (sa, sb) = (
        a.create_stream().expect("stream a"),
        b.create_stream().expect("stream b"),
    );
    let n = 40_000;
    let buf = ctx.alloc_managed::<u32>(n).expect("context buffer");
    host_fill(&buf, |i| i as u32);
    let on_b = b.alloc::<u32>(1000).expect("b's buffer");
    sb.write_slice(&on_b, 0, &[7u32; 1000]).expect("fill");
    sb.copy_to_managed(&on_b, 0, &buf, 30_000, 1000)
        .expect("into the context buffer on b");
    let on_a = a.alloc::<u32>(n).expect("a's buffer");
    // No event: a's copy follows b's through the pages.
    sa.copy_from_managed(&buf, 0, &on_a, 0, n)
        .expect("out of the context buffer on a");
    let got = sa.read_to_vec(&on_a).expect("read a's buffer");
    for (i, &x) in got.iter().enumerate() {
        let want = if (30_000..31_000).contains(&i) {
            7
        } else {
            i as u32
        };
        assert_eq!(x, want, "element {i}");
    }
    if direct() {
        assert_eq!(
            a.managed_stats().bytes_from_peer,
            64 << 10,
            "the one page b wrote came from b"
        );
    }
}

/// A device's own managed buffers and its context's share one state (one
/// capacity): buffers made before the device joined its context keep working
/// on it, its context makes none until they drop, and its figures carry over.
#[test]
fn buffers_from_before_a_context_keep_working_and_hold_off_context_buffers() {
    if common::skipped("buffers_from_before_a_context_keep_working_and_hold_off_context_buffers") {
        return;
    }
    let (a, b) = (common::device(), common::device());
    let sa = a.create_stream().expect("stream a");
    let old = a.alloc_managed::<u32>(20_000).expect("a's own buffer");
    host_fill(&old, |i| i as u32);
    sa.launch(&affine(1, 1), 2.into(), &[Arg::managed_write(&old)])
        .expect("launch");
    sa.synchronize().expect("sync");
    let figures = a.managed_stats();
    let ctx = Context::new(&[a.clone(), b.clone()]).expect("context");
    let refused = ctx.alloc_managed::<u32>(16);
    match &refused {
        Err(Error::Managed { detail, .. }) => {
            assert!(detail.contains("drop them first"), "{detail}")
        }
        other => panic!("expected Error::Managed, got {other:?}"),
    }
    sa.launch(&affine(1, 1), 2.into(), &[Arg::managed_write(&old)])
        .expect("the old buffer still works on a");
    assert!(old
        .read(..)
        .expect("read")
        .iter()
        .enumerate()
        .all(|(i, &x)| x == i as u32 + 2));
    drop(old);
    let buf = ctx.alloc_managed::<u32>(16).expect("context buffers now");
    assert!(
        a.managed_stats().bytes_to_device >= figures.bytes_to_device,
        "a's figures carried over"
    );
    let own = a
        .alloc_managed::<u32>(16)
        .expect("a's own buffer, in the context's state");
    sa.launch(
        &plus_one(),
        1.into(),
        &[Arg::managed_read(&buf), Arg::managed_write(&own)],
    )
    .expect("a context buffer and a's own in one launch");
    assert_eq!(&*own.read(..).expect("read"), &[1u32; 16]);
}

/// Without a direct path (a context made without a peer link) a page only
/// another device holds is staged: copied back to the host on a stream of
/// that device, then in. A context of devices of two backends has no
/// context buffers (its devices share no one host copy).
#[test]
fn without_a_peer_link_pages_are_staged_through_the_host() {
    if common::skipped("without_a_peer_link_pages_are_staged_through_the_host") {
        return;
    }
    let (a, b) = (common::device(), common::device());
    let ctx = Context::with_peer_link(&[a.clone(), b.clone()], None).expect("context");
    let (sa, sb) = (
        a.create_stream().expect("stream a"),
        b.create_stream().expect("stream b"),
    );
    let n = 100_000;
    let bytes = (n * 4) as u64;
    let buf = ctx.alloc_managed::<u32>(n).expect("context buffer");
    let out = ctx.alloc_managed::<u32>(n).expect("context buffer");
    host_fill(&buf, |i| i as u32);
    sa.launch(&affine(5, 2), 3.into(), &[Arg::managed_write(&buf)])
        .expect("write on a");
    let (a0, b0) = (a.managed_stats(), b.managed_stats());
    sb.launch(
        &plus_one(),
        1.into(),
        &[Arg::managed_read(&buf), Arg::managed_write(&out)],
    )
    .expect("read on b");
    sb.synchronize().expect("sync b");
    let (a1, b1) = (a.managed_stats(), b.managed_stats());
    if moves() {
        assert_eq!(b1.bytes_from_peer, b0.bytes_from_peer, "no direct path");
        assert_eq!(a1.bytes_to_host - a0.bytes_to_host, bytes, "back from a");
        assert_eq!(b1.bytes_to_device - b0.bytes_to_device, bytes, "in to b");
    }
    // The staged copy back left the host's copy current: the guard copies
    // nothing.
    let g = out.read(..).expect("read");
    assert!(g.iter().enumerate().all(|(i, &x)| x == (i as u32) * 5 + 3));
    let g = buf.read(..).expect("read");
    assert!(g.iter().enumerate().all(|(i, &x)| x == (i as u32) * 5 + 2));
    assert_eq!(a.managed_stats().bytes_to_host, a1.bytes_to_host);
    if common::backend() == common::Backend::EmuReal {
        let (h, e) = (Device::host().expect("host device"), common::device());
        let mixed = Context::new(&[h, e]).expect("host + emu in real time");
        assert!(matches!(
            mixed.alloc_managed::<u32>(16),
            Err(Error::Managed { .. })
        ));
    }
}

#[test]
fn read_mostly_keeps_replicas_on_both_devices_and_a_write_invalidates_the_other() {
    if common::skipped(
        "read_mostly_keeps_replicas_on_both_devices_and_a_write_invalidates_the_other",
    ) {
        return;
    }
    let (a, b, ctx) = pair();
    let (sa, sb) = (
        a.create_stream().expect("stream a"),
        b.create_stream().expect("stream b"),
    );
    let n = 64 * 1024;
    let bytes = (n * 4) as u64;
    let buf = ctx.alloc_managed::<u32>(n).expect("context buffer");
    host_fill(&buf, |i| i as u32);
    buf.advise(.., Advice::ReadMostly).expect("advise");
    sa.launch(&touch(), 1.into(), &[Arg::managed_read(&buf)])
        .expect("read on a");
    sb.launch(&touch(), 1.into(), &[Arg::managed_read(&buf)])
        .expect("read on b");
    sa.synchronize().expect("sync a");
    sb.synchronize().expect("sync b");
    if moves() {
        assert_eq!(a.managed_stats().resident_bytes, bytes, "a keeps a replica");
        assert_eq!(b.managed_stats().resident_bytes, bytes, "b keeps a replica");
    }
    let (a0, b0) = (a.managed_stats(), b.managed_stats());
    sa.launch(&touch(), 1.into(), &[Arg::managed_read(&buf)])
        .expect("read on a again");
    sb.launch(&touch(), 1.into(), &[Arg::managed_read(&buf)])
        .expect("read on b again");
    sa.synchronize().expect("sync a");
    sb.synchronize().expect("sync b");
    assert_eq!(
        (
            a.managed_stats().declared_pages,
            b.managed_stats().declared_pages
        ),
        (a0.declared_pages, b0.declared_pages),
        "both replicas stayed"
    );
    // A write on b invalidates a's replica: a's next read copies again.
    sb.launch(&affine(1, 5), 2.into(), &[Arg::managed_write(&buf)])
        .expect("write on b");
    sb.synchronize().expect("sync b");
    if moves() {
        assert_eq!(a.managed_stats().resident_bytes, 0, "a's replica went");
        assert_eq!(b.managed_stats().resident_bytes, bytes);
    }
    let a1 = a.managed_stats();
    let out = ctx.alloc_managed::<u32>(n).expect("context buffer");
    sa.launch(
        &plus_one(),
        1.into(),
        &[Arg::managed_read(&buf), Arg::managed_write(&out)],
    )
    .expect("read on a after b's write");
    sa.synchronize().expect("sync a");
    let a2 = a.managed_stats();
    if moves() {
        assert_eq!(
            a2.declared_pages - a1.declared_pages,
            pages_of(n),
            "buf's pages again (out's, never written, copy nothing)"
        );
        if direct() {
            assert_eq!(a2.bytes_from_peer - a1.bytes_from_peer, bytes);
        }
        assert_eq!(
            b.managed_stats().resident_bytes,
            bytes,
            "ReadMostly: b keeps its copy while a reads"
        );
    }
    let g = out.read(..).expect("read");
    assert!(g.iter().enumerate().all(|(i, &x)| x == i as u32 + 6));
}

#[test]
fn prefetch_to_either_device_from_a_stream_of_either() {
    if common::skipped("prefetch_to_either_device_from_a_stream_of_either") {
        return;
    }
    let (a, b, ctx) = pair();
    let (sa, sb) = (
        a.create_stream().expect("stream a"),
        b.create_stream().expect("stream b"),
    );
    let n = 100_000;
    let pages = pages_of(n);
    let buf = ctx.alloc_managed::<u32>(n).expect("context buffer");
    host_fill(&buf, |i| i as u32);
    // To b, from a stream of a: b's kernel then finds its pages there.
    buf.prefetch(.., Location::Device(b.id()), &sa)
        .expect("prefetch to b on a's stream");
    sa.synchronize().expect("sa waits for the prefetch");
    let b0 = b.managed_stats();
    if moves() {
        assert_eq!(b0.prefetch_pages, pages, "the prefetch moved b's pages");
    }
    sb.launch(&affine(1, 3), 2.into(), &[Arg::managed_write(&buf)])
        .expect("write on b");
    sb.synchronize().expect("sync b");
    assert_eq!(
        b.managed_stats().declared_pages,
        b0.declared_pages,
        "b's kernel found its pages resident"
    );
    // To a, from a stream of b: the pages b dirtied move to a.
    buf.prefetch(.., Location::Device(a.id()), &sb)
        .expect("prefetch to a on b's stream");
    let a0 = a.managed_stats();
    sa.launch(&affine(2, 0), 2.into(), &[Arg::managed_write(&buf)])
        .expect("write on a");
    sa.synchronize().expect("sync a");
    assert_eq!(
        a.managed_stats().declared_pages,
        a0.declared_pages,
        "a's kernel found its pages resident"
    );
    if moves() {
        assert_eq!(a0.prefetch_pages, pages);
        assert_eq!(b.managed_stats().resident_bytes, 0, "moved, not copied");
    }
    // To the host, from b's stream, while the pages are dirty on a: copied
    // back from a; the guard then copies nothing.
    buf.prefetch(.., Location::Host, &sb)
        .expect("prefetch to the host on b's stream");
    sb.synchronize().expect("sync b");
    let a1 = a.managed_stats();
    if moves() {
        assert_eq!(a1.bytes_to_host - a0.bytes_to_host, (n * 4) as u64);
        assert_eq!(a1.resident_bytes, 0, "without ReadMostly: moved home");
    }
    let g = buf.read(..).expect("read");
    assert_eq!(
        a.managed_stats().host_access_pages,
        a1.host_access_pages,
        "home already"
    );
    assert!(g.iter().enumerate().all(|(i, &x)| x == (i as u32 + 3) * 2));
    drop(g);
    // A device outside the context, or a stream of one, is a typed error.
    let other = common::device();
    let so = other.create_stream().expect("stream");
    assert!(matches!(
        buf.prefetch(.., Location::Device(other.id()), &sa),
        Err(Error::Managed { .. })
    ));
    assert!(matches!(
        buf.prefetch(.., Location::Host, &so),
        Err(Error::Managed { .. })
    ));
    assert!(matches!(
        so.launch(&touch(), 1.into(), &[Arg::managed_read(&buf)]),
        Err(Error::Managed { .. })
    ));
    assert!(matches!(
        buf.advise(.., Advice::PreferredLocation(Location::Device(other.id()))),
        Err(Error::Managed { .. })
    ));
}

#[test]
fn the_host_reads_what_the_second_device_wrote_and_the_first_sees_host_writes() {
    if common::skipped("the_host_reads_what_the_second_device_wrote_and_the_first_sees_host_writes")
    {
        return;
    }
    let (a, b, ctx) = pair();
    let (sa, sb) = (
        a.create_stream().expect("stream a"),
        b.create_stream().expect("stream b"),
    );
    let n = 100_000;
    let mut buf = ctx.alloc_managed::<u32>(n).expect("context buffer");
    for (i, x) in buf.as_mut_slice().expect("view").iter_mut().enumerate() {
        *x = i as u32;
    }
    sb.launch(&affine(3, 1), 4.into(), &[Arg::managed_write(&buf)])
        .expect("write on b");
    // No synchronize: the host's touch (a fault on the emulated devices, a
    // wait elsewhere) follows b's kernel and brings the pages back from b.
    let v = buf.as_slice().expect("view");
    for (i, &x) in v.iter().enumerate() {
        assert_eq!(x, i as u32 * 3 + 1, "element {i}");
    }
    if matches!(
        common::backend(),
        common::Backend::EmuVirtual | common::Backend::EmuReal
    ) {
        assert_eq!(
            b.managed_stats().host_fault_pages,
            pages_of(n),
            "every page b dirtied came back by a host fault, from b"
        );
        assert!(buf.host_faults() > 0);
    }
    // A guard sees it too.
    assert_eq!(buf.read(5..6).expect("read")[0], 16);
    // A host write to pages b holds: a's kernel sees it, and b's copy went.
    buf.as_mut_slice().expect("view")[70_000] = 7;
    buf.write(10..11).expect("write")[0] = 9;
    sa.launch(&affine(1, 1), 4.into(), &[Arg::managed_write(&buf)])
        .expect("write on a");
    let v = buf.as_slice().expect("view");
    assert_eq!(v[70_000], 8);
    assert_eq!(v[10], 10);
    assert_eq!(v[5], 17);
    if moves() {
        assert_eq!(
            b.managed_stats().resident_bytes,
            0,
            "the host write and a's write invalidated b's copy"
        );
    }
}

#[test]
fn each_device_evicts_past_its_own_capacity_while_the_other_keeps_its_pages() {
    if common::skipped("each_device_evicts_past_its_own_capacity_while_the_other_keeps_its_pages") {
        return;
    }
    let (a, b, ctx) = pair_of_capacity(1 << 20);
    let (sa, sb) = (
        a.create_stream().expect("stream a"),
        b.create_stream().expect("stream b"),
    );
    let page = 64 << 10;
    let words = page / 4;
    // 8 pages dirty on b; 24 pages (1.5x a's capacity) written on a.
    let p = ctx.alloc_managed::<u32>(8 * words).expect("p");
    let q = ctx.alloc_managed::<u32>(24 * words).expect("q");
    host_fill(&p, |i| i as u32);
    host_fill(&q, |i| i as u32);
    sb.launch(&affine(1, 1), 2.into(), &[Arg::managed_write(&p)])
        .expect("p on b");
    sb.synchronize().expect("sync b");
    let b0 = b.managed_stats();
    sa.launch(
        &affine(1, 2),
        2.into(),
        &[Arg::managed_write_range(&q, ..12 * words)],
    )
    .expect("first 12 pages of q on a");
    sa.launch(
        &affine(1, 3),
        2.into(),
        &[Arg::managed_write_range(&q, 12 * words..)],
    )
    .expect("last 12 pages of q on a: 8 of the first go");
    sa.synchronize().expect("sync a");
    let a1 = a.managed_stats();
    assert_eq!(a1.dirty_evictions, 8, "a's budget is its own: 16 pages");
    assert_eq!(a1.dirty_eviction_bytes, 8 * page as u64, "each once");
    assert_eq!(a1.resident_bytes, 16 * page as u64);
    let b1 = b.managed_stats();
    assert_eq!(
        (b1.clean_evictions, b1.dirty_evictions),
        (b0.clean_evictions, b0.dirty_evictions),
        "b evicted nothing"
    );
    assert_eq!(b1.resident_bytes, 8 * page as u64, "b keeps p");
    // p's pages to a: from b over the link, and a evicts for them.
    let out = a.alloc_managed::<u32>(8 * words).expect("a's own buffer");
    sa.launch(
        &plus_one(),
        1.into(),
        &[Arg::managed_read(&p), Arg::managed_write(&out)],
    )
    .expect("p on a");
    sa.synchronize().expect("sync a");
    let a2 = a.managed_stats();
    assert_eq!(a2.resident_bytes, 16 * page as u64, "a stays at capacity");
    assert!(
        a2.clean_evictions + a2.dirty_evictions >= a1.clean_evictions + a1.dirty_evictions + 16,
        "room for p and out"
    );
    assert_eq!(a2.bytes_from_peer - a1.bytes_from_peer, 8 * page as u64);
    let g = out.read(..).expect("out");
    assert!(g.iter().enumerate().all(|(i, &x)| x == i as u32 + 2));
    let g = q.read(..).expect("q");
    assert!(g
        .iter()
        .enumerate()
        .all(|(i, &x)| x == i as u32 + if i < 12 * words { 2 } else { 3 }));
}

// Random programs over two devices: host reads and writes (guards and the
// host view), kernels on two streams of each device, prefetches to the host
// and to either device from any stream, and advice naming either device,
// against a sequential model.

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
    /// `to`: 0 the host, 1 device a, 2 device b.
    Prefetch {
        stream: usize,
        buf: usize,
        start: usize,
        len: usize,
        to: u8,
    },
    /// `which`: ReadMostly, PreferredLocation, AccessedBy; `at` as
    /// `Prefetch::to` (AccessedBy names a device).
    Advise {
        buf: usize,
        start: usize,
        len: usize,
        which: u8,
        at: u8,
        on: bool,
    },
    ViewWrite {
        buf: usize,
        start: usize,
        len: usize,
        value: u32,
    },
    ViewRead {
        buf: usize,
        start: usize,
        len: usize,
    },
}

#[derive(Clone, Copy)]
struct Shape {
    n: usize,
    page: usize,
    max_len: usize,
    /// Elements of buffer `i` prefetched to device `i` before the steps.
    warm: usize,
}

/// Two buffers of 3000 `u32` in 4 KiB pages: steps overlap pages often.
const SMALL: Shape = Shape {
    n: 3000,
    page: 4096,
    max_len: 2500,
    warm: 3000,
};
/// Two buffers of 20 pages of 64 KiB on devices of 16 each (`CAPACITY`),
/// 15 pages of each resident on one device first: evictions on both
/// devices; a step's pages (at most 2 x 5) always fit.
const PAST_CAPACITY: Shape = Shape {
    n: 320_000,
    page: 64 << 10,
    max_len: 60_000,
    warm: 15 * (64 << 10) / 4,
};
const CAPACITY: usize = 1 << 20;

/// Streams: 0 and 1 on device a, 2 and 3 on device b.
const STREAMS: usize = 4;

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
            0..STREAMS,
            0..2usize,
            range(),
            any::<u32>(),
            any::<u32>(),
            1..4u32
        )
            .prop_map(move |(stream, buf, (start, len), a, c, blocks)| {
                let start = kernel_at(start);
                Step::Affine {
                    stream,
                    buf,
                    start,
                    len: len.min(n - start),
                    a,
                    c,
                    blocks,
                }
            }),
        (0..STREAMS, 0..2usize, range(), 0..n).prop_map(move |(stream, src, (start, len), to)| {
            Step::PlusOne {
                stream,
                src,
                dst: 1 - src,
                start: kernel_at(start),
                len,
                to: kernel_at(to.min(n - len)),
            }
        }),
        (0..STREAMS, 0..2usize, range(), 0..3u8).prop_map(|(stream, buf, (start, len), to)| {
            Step::Prefetch {
                stream,
                buf,
                start,
                len,
                to,
            }
        }),
        (0..2usize, range(), 0..3u8, 0..3u8, any::<bool>()).prop_map(
            |(buf, (start, len), which, at, on)| Step::Advise {
                buf,
                start,
                len,
                which,
                at,
                on,
            }
        ),
        (0..2usize, range(), any::<u32>()).prop_map(|(buf, (start, len), value)| Step::ViewWrite {
            buf,
            start,
            len,
            value
        }),
        (0..2usize, range()).prop_map(|(buf, (start, len))| Step::ViewRead { buf, start, len }),
    ]
}

fn run_program(
    devices: &[Device; 2],
    ctx: &Context,
    shape: Shape,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let streams: Vec<Stream> = (0..STREAMS)
        .map(|i| devices[i / 2].create_stream().expect("s"))
        .collect();
    let mut bufs: Vec<ManagedBuffer<u32>> = (0..2)
        .map(|_| {
            ctx.alloc_managed_with_page::<u32>(shape.n, shape.page)
                .expect("managed")
        })
        .collect();
    let mut model = vec![vec![0u32; shape.n]; 2];
    let location = |at: u8| match at {
        0 => Location::Host,
        d => Location::Device(devices[usize::from(d) - 1].id()),
    };
    // Part of one buffer to each device first: past capacity, later steps
    // push pages out on both.
    for (i, b) in bufs.iter().enumerate() {
        b.prefetch(
            ..shape.warm,
            Location::Device(devices[i].id()),
            &streams[2 * i],
        )
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
                to,
            } => {
                bufs[buf]
                    .prefetch(start..start + len, location(to), &streams[stream])
                    .expect("prefetch");
            }
            Step::Advise {
                buf,
                start,
                len,
                which,
                at,
                on,
            } => {
                let advice = match which {
                    0 => Advice::ReadMostly,
                    1 => Advice::PreferredLocation(location(at)),
                    _ => Advice::AccessedBy(location(at.max(1))),
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
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn random_programs_over_two_devices_match_the_sequential_model(
        steps in prop::collection::vec(step(SMALL), 1..30)
    ) {
        if common::skipped("random_programs_over_two_devices_match_the_sequential_model") {
            return Ok(());
        }
        let (a, b, ctx) = pair();
        run_program(&[a, b], &ctx, SMALL, &steps)?;
    }
}

#[test]
fn random_programs_over_two_devices_past_capacity_match_the_sequential_model() {
    if common::skipped("random_programs_over_two_devices_past_capacity_match_the_sequential_model")
    {
        return;
    }
    let (a, b, ctx) = pair_of_capacity(CAPACITY);
    let devices = [a.clone(), b.clone()];
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 12,
        ..ProptestConfig::default()
    });
    let evictions =
        |d: &Device| d.managed_stats().clean_evictions + d.managed_stats().dirty_evictions;
    // Random programs evict on both devices almost always within 12; a few
    // more rounds where they did not, so the check is of eviction, not luck.
    for round in 1.. {
        runner
            .run(
                &prop::collection::vec(step(PAST_CAPACITY), 1..30),
                |steps| run_program(&devices, &ctx, PAST_CAPACITY, &steps),
            )
            .expect("every program matches the model");
        if evictions(&a) > 0 && evictions(&b) > 0 {
            break;
        }
        assert!(round < 4, "both devices evicted within 48 random programs");
    }
}
