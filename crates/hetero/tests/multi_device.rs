//! Several devices in one context, through the public API: peer copies (direct
//! and staged) move the values, a stream waits on another device's event and
//! sees its writes, faults cross devices only to what waits on them, devices
//! outside a common context are refused, and two emulated devices in virtual
//! time run deterministically with peer copies at the link model's time.
//!
//! The pair under test is two devices of the backend `HETERO_BACKEND` names;
//! tests that need a particular kind build their devices explicitly.

mod common;

use common::{settle, Gate};
use hetero::{
    Arg, Context, Device, DeviceBuffer, DeviceConfig, EmuConfig, Error, Grid, Kernel, LinkPreset,
    PeerLink, PeerPath, TimeMode,
};

fn emu(time: TimeMode) -> Device {
    let cfg = EmuConfig::new(LinkPreset::pcie4x16())
        .time(time)
        .capacity(1 << 30);
    Device::new(DeviceConfig::default().emu(cfg)).expect("emu device")
}

/// Two devices of the backend under test, in one context.
fn pair() -> (Device, Device, Context) {
    let (a, b) = (common::device(), common::device());
    let ctx = Context::new(&[a.clone(), b.clone()]).expect("context of two devices");
    (a, b, ctx)
}

fn values(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ seed)
        .collect()
}

/// `dst = src + 1`, elementwise (a kernel of the device it runs on).
fn plus_one() -> Kernel {
    Kernel::new("plus_one", |b| {
        let x = b.read::<u32>(0).to_vec();
        let off = b.write_offset(0);
        for (i, v) in b.write::<u32>(0).iter_mut().enumerate() {
            *v = x[off + i].wrapping_add(1);
        }
    })
    .wgsl(common::wgsl::map("u32", 1, "x0[i] + 1u"), "main")
}

/// Copies `data` from `a` to `b` with `copy_peer` on a stream of `on`; what `b` holds after.
fn peer_round(a: &Device, b: &Device, on: &Device, data: &[u32]) -> Vec<u32> {
    let (sa, sb, s) = (
        a.create_stream().expect("stream a"),
        b.create_stream().expect("stream b"),
        on.create_stream().expect("stream"),
    );
    let src = a.alloc::<u32>(data.len()).expect("src");
    let dst = b.alloc::<u32>(data.len()).expect("dst");
    sa.write_slice(&src, 0, data).expect("write src");
    sb.fill(&dst, 0).expect("clear dst");
    sb.synchronize().expect("cleared");
    s.copy_peer(&src, &dst).expect("copy_peer");
    s.synchronize().expect("copied");
    sb.read_to_vec(&dst).expect("read dst")
}

#[test]
fn peer_copies_move_the_values_both_ways_from_either_end() {
    if common::skipped("peer_copies_move_the_values_both_ways_from_either_end") {
        return;
    }
    let (a, b, ctx) = pair();
    let path = ctx.topology().path(a.id(), b.id()).expect("a path").clone();
    match a.properties().backend {
        "emu" => assert!(matches!(path, PeerPath::Link(_)), "{path:?}"),
        "vulkan" => assert!(matches!(path, PeerPath::Staged { .. }), "{path:?}"),
        _ => assert_eq!(path, PeerPath::SharedMemory),
    }
    let data = values(100_003, 7);
    assert_eq!(peer_round(&a, &b, &a, &data), data, "a → b issued on a");
    assert_eq!(peer_round(&a, &b, &b, &data), data, "a → b issued on b");
    assert_eq!(peer_round(&b, &a, &a, &data), data, "b → a issued on a");
    // A range, into the middle of a buffer.
    let s = b.create_stream().expect("stream");
    let src = a.alloc::<u32>(64).expect("src");
    let dst = b.alloc::<u32>(64).expect("dst");
    s.write_slice(&dst, 0, &[9u32; 64]).expect("dst");
    a.create_stream()
        .expect("sa")
        .write_slice(&src, 0, &values(64, 3))
        .expect("src");
    s.copy_peer_range(&src, 8, &dst, 40, 16).expect("range");
    let got = s.read_to_vec(&dst).expect("read");
    let mut want = vec![9u32; 64];
    want[40..56].copy_from_slice(&values(64, 3)[8..24]);
    assert_eq!(got, want);
}

/// Staged copies: where the topology has no direct path. Two emulated
/// devices of a context made without a peer link, and (not in virtual time,
/// which a host device cannot share) a host device with an emulated one.
#[test]
fn staged_peer_copies_move_the_values() {
    if common::skipped("staged_peer_copies_move_the_values") {
        return;
    }
    let time = match common::backend() {
        common::Backend::EmuVirtual => TimeMode::Virtual,
        _ => TimeMode::Real,
    };
    let (a, b) = (emu(time), emu(time));
    let ctx = Context::with_peer_link(&[a.clone(), b.clone()], None).expect("context");
    assert!(matches!(
        ctx.topology().path(a.id(), b.id()),
        Some(PeerPath::Staged { .. })
    ));
    let data = values(50_001, 11);
    assert_eq!(
        peer_round(&a, &b, &a, &data),
        data,
        "emu → emu issued on the source"
    );
    assert_eq!(
        peer_round(&a, &b, &b, &data),
        data,
        "emu → emu issued on the destination"
    );
    if time == TimeMode::Real {
        let (h, e) = (common::device(), emu(TimeMode::Real));
        if h.properties().backend == "host" {
            let ctx = Context::new(&[h.clone(), e.clone()]).expect("host + emu");
            assert!(matches!(
                ctx.topology().path(h.id(), e.id()),
                Some(PeerPath::Staged { .. })
            ));
            assert_eq!(
                peer_round(&h, &e, &h, &data),
                data,
                "host → emu issued on host"
            );
            assert_eq!(
                peer_round(&h, &e, &e, &data),
                data,
                "host → emu issued on emu"
            );
            assert_eq!(
                peer_round(&e, &h, &h, &data),
                data,
                "emu → host issued on host"
            );
            assert_eq!(
                peer_round(&e, &h, &e, &data),
                data,
                "emu → host issued on emu"
            );
        }
    }
}

/// A kernel on device b, behind a wait on an event of device a, sees what a
/// wrote before the event: a's stream is held by a gate while b's work is
/// queued, so a b that ignored the wait would read the old bytes.
#[test]
fn a_kernel_waiting_on_another_devices_event_sees_its_writes() {
    if common::skipped("a_kernel_waiting_on_another_devices_event_sees_its_writes") {
        return;
    }
    let (a, b, _ctx) = pair();
    let n = 4096;
    let (sa, sb) = (
        a.create_stream().expect("sa"),
        b.create_stream().expect("sb"),
    );
    let src = a.alloc::<u32>(n).expect("src");
    let dst = b.alloc::<u32>(n).expect("dst");
    let out = b.alloc::<u32>(n).expect("out");
    sb.fill(&dst, 0).expect("clear");
    sb.synchronize().expect("cleared");
    let gate = Gate::hold(&sa);
    sa.fill(&src, 41).expect("a writes");
    sa.copy_peer(&src, &dst).expect("to b");
    let done = sa.record_event().expect("event on a");
    sb.wait_event(&done).expect("b waits on a's event");
    sb.launch(
        &plus_one(),
        Grid::new(4),
        &[Arg::read(&dst), Arg::write(&out)],
    )
    .expect("kernel on b");
    settle(&b);
    gate.open();
    assert_eq!(sb.read_to_vec(&out).expect("read"), vec![42u32; n]);
}

/// A fault on a's stream reaches a stream of b that waits on it (its later
/// work is skipped, its synchronize names the fault); another stream of b
/// goes on, and a staged copy after the fault still works.
#[test]
fn a_fault_on_one_device_reaches_what_waits_on_it_on_another() {
    if common::skipped("a_fault_on_one_device_reaches_what_waits_on_it_on_another") {
        return;
    }
    let (a, b, _ctx) = pair();
    let (sa, sb, other) = (
        a.create_stream().expect("sa"),
        b.create_stream().expect("sb"),
        b.create_stream().expect("other"),
    );
    let buf = a.alloc::<u32>(16).expect("buf");
    let x = b.alloc::<u32>(16).expect("x");
    sb.fill(&x, 5).expect("fill");
    sb.synchronize().expect("filled");
    let boom = Kernel::new("boom", |_| panic!("injected fault on device a"))
        .wgsl(common::wgsl::fails("injected fault on device a"), "main");
    sa.launch(&boom, Grid::new(1), &[Arg::write(&buf)])
        .expect("launch");
    let e = sa.record_event().expect("event");
    sb.wait_event(&e).expect("wait");
    sb.fill(&x, 6).expect("skipped fill");
    let err = sb.synchronize().expect_err("the waiter fails");
    assert!(
        format!("{err}").contains("injected fault on device a"),
        "the message names the fault: {err}"
    );
    // Stream numbers are per device: the message names both streams'
    // devices, the waiter's in the error too.
    let (ia, ib) = (a.id(), b.id());
    assert!(
        format!("{err}").contains(&format!(
            "stream {} of device {ia}, which failed: stream {} of device {ia} failed",
            sa.id(),
            sa.id()
        )),
        "{err}"
    );
    assert!(
        matches!(err, hetero::Error::StreamFault { device, stream, .. } if device == ib && stream == sb.id()),
        "{err:?}"
    );
    // b's other stream is untouched; x kept its old value.
    assert_eq!(other.read_to_vec(&x).expect("read"), vec![5u32; 16]);
    // A copy whose stream took on the fault fails; a fresh stream's works.
    assert!(sa.copy_peer(&buf, &x).is_err() || sa.synchronize().is_err());
    let s2 = a.create_stream().expect("fresh");
    s2.fill(&buf, 8).expect("fill");
    s2.copy_peer(&buf, &x).expect("copy");
    s2.synchronize().expect("the fresh stream is fine");
    assert_eq!(other.read_to_vec(&x).expect("read"), vec![8u32; 16]);
}

/// The same over a staged path: the fault of the source's stream reaches the
/// copy's stream through the staging stream, and the staging stream (failed
/// with it) is replaced for the next copy.
#[test]
fn a_fault_before_a_staged_copy_stays_with_that_copy() {
    let (a, b) = (emu(TimeMode::Virtual), emu(TimeMode::Virtual));
    let _ctx = Context::with_peer_link(&[a.clone(), b.clone()], None).expect("context");
    let (sa, sb) = (
        a.create_stream().expect("sa"),
        b.create_stream().expect("sb"),
    );
    let src = a.alloc::<u32>(256).expect("src");
    let dst = b.alloc::<u32>(256).expect("dst");
    sa.fill(&src, 3).expect("fill");
    let boom = Kernel::new("boom", |_| panic!("injected fault"));
    sb.launch(&boom, Grid::new(1), &[Arg::write(&dst)])
        .expect("launch");
    // Issued on b (faulted): a's staging stream waits on b, takes the fault.
    sb.copy_peer(&src, &dst).expect("enqueued");
    assert!(sb.synchronize().is_err());
    let sb2 = b.create_stream().expect("fresh");
    sb2.copy_peer(&src, &dst).expect("enqueued");
    sb2.synchronize()
        .expect("a new staging stream serves the next copy");
    assert_eq!(sb2.read_to_vec(&dst).expect("read"), vec![3u32; 256]);
}

#[test]
fn devices_in_no_common_context_are_refused_with_typed_errors() {
    let (a, b) = (emu(TimeMode::Virtual), emu(TimeMode::Virtual));
    let (sa, sb) = (
        a.create_stream().expect("sa"),
        b.create_stream().expect("sb"),
    );
    let (x, y) = (a.alloc::<u32>(8).expect("x"), b.alloc::<u32>(8).expect("y"));
    let e = sa.record_event().expect("event");
    assert!(matches!(
        sb.wait_event(&e),
        Err(Error::EventWrongDevice { .. })
    ));
    assert!(matches!(
        sa.copy_peer(&x, &y),
        Err(Error::DeviceContext { .. })
    ));
    // In two different contexts: still refused.
    let c = emu(TimeMode::Virtual);
    let d = emu(TimeMode::Virtual);
    let _c1 = Context::new(&[a.clone(), c.clone()]).expect("a + c");
    let _c2 = Context::new(&[b.clone(), d.clone()]).expect("b + d");
    assert!(matches!(
        sb.wait_event(&e),
        Err(Error::EventWrongDevice { .. })
    ));
    assert!(matches!(
        sa.copy_peer(&x, &y),
        Err(Error::DeviceContext { .. })
    ));
    // A device joins one context.
    assert!(matches!(
        Context::new(&[a.clone(), b.clone()]),
        Err(Error::DeviceContext { .. })
    ));
    assert!(Context::new(&[]).is_err());
    // Virtual time and the host do not mix.
    let h = Device::host().expect("host");
    let v = emu(TimeMode::Virtual);
    let err = Context::new(&[h, v]).expect_err("virtual + host");
    assert!(format!("{err}").contains("time=real"), "{err}");
    // Bad copies within a context.
    let z = c.alloc::<u32>(9).expect("z");
    assert!(matches!(
        sa.copy_peer(&x, &z),
        Err(Error::SizeMismatch { .. })
    ));
    assert!(matches!(
        sa.copy_peer_range(&x, 0, &z, 0, 0),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        sa.copy_peer_range(&x, 4, &z, 0, 5),
        Err(Error::OutOfBounds { .. })
    ));
    // A stream on neither end (e2's, in a context of its own), and a copy
    // within one device on a stream of another.
    let w = c.alloc::<u32>(8).expect("w");
    let e2 = emu(TimeMode::Virtual);
    let _c3 = Context::new(std::slice::from_ref(&e2)).expect("alone");
    let s_e2 = e2.create_stream().expect("s");
    assert!(matches!(
        s_e2.copy_peer(&x, &w),
        Err(Error::DeviceContext { .. })
    ));
    let w2 = c.alloc::<u32>(8).expect("w2");
    assert!(matches!(
        sa.copy_peer(&w2, &w),
        Err(Error::WrongDevice { .. })
    ));
}

/// One program over two emulated devices in virtual time: peer copies both
/// ways, kernels on each, waits across them. Returns both trace hashes and
/// the result.
fn two_device_program() -> (u64, u64, Vec<u32>) {
    let (a, b) = (emu(TimeMode::Virtual), emu(TimeMode::Virtual));
    let _ctx = Context::new(&[a.clone(), b.clone()]).expect("context");
    let n = 1 << 16;
    let (sa, sb, sa2) = (
        a.create_stream().expect("sa"),
        b.create_stream().expect("sb"),
        a.create_stream().expect("sa2"),
    );
    let (x, y) = (a.alloc::<u32>(n).expect("x"), a.alloc::<u32>(n).expect("y"));
    let (u, v) = (b.alloc::<u32>(n).expect("u"), b.alloc::<u32>(n).expect("v"));
    sa.write_slice(&x, 0, &values(n, 1)).expect("x");
    let k = plus_one();
    for _ in 0..3 {
        sa.launch(&k, Grid::new(4), &[Arg::read(&x), Arg::write(&y)])
            .expect("a");
        sa.copy_peer(&y, &u).expect("a → b");
        let e = sa.record_event().expect("e");
        sb.wait_event(&e).expect("wait");
        sb.launch(&k, Grid::new(4), &[Arg::read(&u), Arg::write(&v)])
            .expect("b");
        sb.copy_peer(&v, &x).expect("b → a");
        let f = sb.record_event().expect("f");
        sa.wait_event(&f).expect("wait back");
        sa2.wait_event(&f).expect("other stream waits too");
    }
    sa.synchronize().expect("a");
    sa2.synchronize().expect("a2");
    let out = sa.read_to_vec(&x).expect("x");
    (
        a.trace_hash().expect("virtual time"),
        b.trace_hash().expect("virtual time"),
        out,
    )
}

#[test]
fn a_two_device_virtual_time_run_is_deterministic() {
    let (ha, hb, out) = two_device_program();
    let want: Vec<u32> = values(1 << 16, 1)
        .iter()
        .map(|v| v.wrapping_add(6))
        .collect();
    assert_eq!(out, want, "three round trips add six");
    for _ in 0..2 {
        assert_eq!(two_device_program(), (ha, hb, want.clone()));
    }
}

/// A peer copy's modelled time is the peer link's: setup, then the bytes on
/// its wire; a copy through the host link costs the host link's.
#[test]
fn peer_copy_modelled_time_matches_the_link_model() {
    for link in PeerLink::all() {
        let (a, b) = (emu(TimeMode::Virtual), emu(TimeMode::Virtual));
        let _ctx =
            Context::with_peer_link(&[a.clone(), b.clone()], Some(link.clone())).expect("ctx");
        let n = (64 << 20) / 4;
        let (x, y): (DeviceBuffer<u32>, DeviceBuffer<u32>) =
            (a.alloc(n).expect("x"), b.alloc(n).expect("y"));
        let out = common::modelled(&a, |s| s.copy_peer(&x, &y).expect("copy"));
        let want = link.transfer_ns(64 << 20);
        assert!(
            (out as f64 - want).abs() <= 2.0,
            "{}: modelled {out} ns, the link model says {want} ns",
            link.name
        );
        // Issued on the destination: the same link, the same time.
        let back = common::modelled(&b, |s| s.copy_peer(&x, &y).expect("copy"));
        assert!(
            (back as f64 - want).abs() <= 2.0,
            "{}: {back} vs {want}",
            link.name
        );
    }
}

/// Copies on one link share it, whichever end issued them, and a peer copy
/// takes a copy engine at both ends: modelled times (virtual time).
#[test]
fn peer_copies_share_their_link_and_take_an_engine_at_both_ends() {
    // Two copy engines per direction: two copies into b can run at once.
    let emu_with = |engines: usize| {
        let cfg = EmuConfig::new(LinkPreset::pcie4x16()).capacity(1 << 30);
        let cfg = DeviceConfig::default()
            .emu(cfg)
            .copy_engines(engines, engines, 1);
        Device::new(cfg).expect("emu")
    };
    let (a, b) = (emu_with(2), emu_with(2));
    let link = PeerLink::pcie4_switch();
    let _ctx = Context::with_peer_link(&[a.clone(), b.clone()], Some(link.clone())).expect("ctx");
    let n = (16 << 20) / 4;
    let bytes = 16u64 << 20;
    let buf = |d: &Device| d.alloc::<u32>(n).expect("buffer");
    let (xa, ya, xb, yb) = (buf(&a), buf(&a), buf(&b), buf(&b));
    let (sa, sb) = (
        a.create_stream().expect("sa"),
        b.create_stream().expect("sb"),
    );
    // Time of a's and b's work after one start, in device ns.
    let run = |fa: &dyn Fn(), fb: &dyn Fn()| -> (f64, f64) {
        sa.synchronize().expect("idle");
        sb.synchronize().expect("idle");
        let start = sa.record_event().expect("start");
        sb.wait_event(&start).expect("wait");
        let start_b = sb.record_event().expect("start b");
        fa();
        fb();
        let (ea, eb) = (sa.record_event().expect("a"), sb.record_event().expect("b"));
        sa.synchronize().expect("a");
        sb.synchronize().expect("b");
        (
            start.elapsed_ms(&ea).expect("t") * 1e6,
            start_b.elapsed_ms(&eb).expect("t") * 1e6,
        )
    };
    let alone = link.transfer_ns(bytes);
    let wire = alone - link.setup_ns as f64;
    // Two copies a → b, one issued on each end: one lane, half the rate each.
    let (ta, tb) = run(&|| sa.copy_peer(&xa, &xb).expect("a→b on a"), &|| {
        sb.copy_peer(&ya, &yb).expect("a→b on b")
    });
    let shared = link.setup_ns as f64 + 2.0 * wire;
    for t in [ta, tb] {
        assert!(
            (t - shared).abs() < 10.0,
            "one lane shared: {t} vs {shared}"
        );
    }
    // a → b on a, b → a on b: both lanes, each at the both-at-once rate.
    let (ta, tb) = run(&|| sa.copy_peer(&xa, &xb).expect("a→b"), &|| {
        sb.copy_peer(&yb, &ya).expect("b→a")
    });
    let both = link.setup_ns as f64 + wire * link.gbps / link.bidir_gbps;
    for t in [ta, tb] {
        assert!((t - both).abs() < 10.0, "both lanes: {t} vs {both}");
    }
    // With one engine per direction, b's only H2D engine carries a's copy
    // into b: b's own H2D copy waits for it, then takes the host link's time;
    // and a second copy a → b issued on b waits too.
    let (a, b) = (emu_with(1), emu_with(1));
    let _ctx = Context::with_peer_link(&[a.clone(), b.clone()], Some(link.clone())).expect("ctx");
    let (xa, ya, xb, yb) = (buf(&a), buf(&a), buf(&b), buf(&b));
    let (sa, sb) = (
        a.create_stream().expect("sa"),
        b.create_stream().expect("sb"),
    );
    let run = |fa: &dyn Fn(), fb: &dyn Fn()| -> (f64, f64) {
        sa.synchronize().expect("idle");
        sb.synchronize().expect("idle");
        let start = sa.record_event().expect("start");
        sb.wait_event(&start).expect("wait");
        let start_b = sb.record_event().expect("start b");
        fa();
        fb();
        let (ea, eb) = (sa.record_event().expect("a"), sb.record_event().expect("b"));
        sa.synchronize().expect("a");
        sb.synchronize().expect("b");
        (
            start.elapsed_ms(&ea).expect("t") * 1e6,
            start_b.elapsed_ms(&eb).expect("t") * 1e6,
        )
    };
    let (ta, tb) = run(&|| sa.copy_peer(&xa, &xb).expect("a→b on a"), &|| {
        sb.copy_peer(&ya, &yb).expect("a→b on b")
    });
    assert!((ta - alone).abs() < 10.0, "{ta} vs {alone}");
    assert!((tb - 2.0 * alone).abs() < 10.0, "{tb} vs 2 x {alone}");
    let h = b.alloc_pinned::<u32>(n).expect("pinned");
    let (ta, tb) = run(&|| sa.copy_peer(&xa, &xb).expect("a→b"), &|| {
        sb.copy_h2d(&h, &yb).expect("h2d on b")
    });
    let h2d = LinkPreset::pcie4x16().transfer_ns(bytes, false);
    assert!((ta - alone).abs() < 10.0, "{ta} vs {alone}");
    assert!(
        tb >= ta + h2d - 10.0,
        "b's H2D waited for its engine: {tb} vs {ta} + {h2d}"
    );
}
