//! The emulated device through the public API: its own memory, modelled copies
//! and kernels, virtual and real time. Figures asserted here are modelled
//! (virtual) times, which are deterministic; no wall-clock time is asserted.

use hetero::{
    Arg, ComputeClass, Device, DeviceConfig, EmuConfig, Error, Grid, Kernel, KernelCost,
    LinkPreset, TimeMode,
};
use std::sync::mpsc;
use std::time::Duration;

fn emu(time: TimeMode) -> Device {
    let cfg = EmuConfig::new(LinkPreset::pcie4x16())
        .time(time)
        .capacity(1 << 30);
    Device::new(DeviceConfig::default().emu(cfg)).expect("emu device")
}

/// H2D → kernel → D2H on one stream; returns the output and the device clock.
fn roundtrip(dev: &Device, n: usize) -> (Vec<f32>, u64) {
    let s = dev.create_stream().expect("stream");
    let input: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let h = dev.pinned_from_slice(&input).expect("pinned");
    let x = dev.alloc::<f32>(n).expect("x");
    let y = dev.alloc::<f32>(n).expect("y");
    let mut out = dev.alloc_pinned::<f32>(n).expect("out");
    let k = Kernel::with_cost(
        "double",
        move |_| KernelCost {
            flops: n as f64,
            bytes: 8.0 * n as f64,
        },
        |b| {
            let x = b.read::<f32>(0);
            let off = b.write_offset(0);
            for (i, v) in b.write::<f32>(0).iter_mut().enumerate() {
                *v = 2.0 * x[off + i];
            }
        },
    );
    s.copy_h2d(&h, &x).expect("h2d");
    s.launch(&k, Grid::new(4), &[Arg::read(&x), Arg::write(&y)])
        .expect("launch");
    s.copy_d2h(&y, &mut out).expect("d2h");
    s.synchronize().expect("sync");
    (out.as_slice().expect("read").to_vec(), dev.now_ns())
}

#[test]
fn virtual_time_moves_data_and_models_time() {
    let dev = emu(TimeMode::Virtual);
    let n = 1 << 20;
    let (out, now) = roundtrip(&dev, n);
    assert!(out.iter().enumerate().all(|(i, v)| *v == 2.0 * i as f32));
    // Two 4 MiB transfers at ~25 GB/s are ~0.34 ms of modelled time.
    let link = LinkPreset::pcie4x16();
    let copies = link.transfer_ns(4 << 20, false) + link.transfer_ns(4 << 20, true);
    assert!(
        now as f64 >= copies,
        "clock {now} ns, copies alone {copies} ns"
    );
    assert!((now as f64) < copies * 1.5, "clock {now} ns");
}

#[test]
fn the_same_virtual_run_gives_the_same_trace_hash() {
    let run = || {
        let dev = emu(TimeMode::Virtual);
        let (_, now) = roundtrip(&dev, 1 << 16);
        (dev.trace_hash().expect("virtual"), now)
    };
    let (a, b) = (run(), run());
    assert_eq!(a, b);
    assert!(emu(TimeMode::Real).trace_hash().is_none());
}

#[test]
fn real_time_moves_data() {
    let dev = emu(TimeMode::Real);
    let (out, _) = roundtrip(&dev, 1 << 16);
    assert!(out.iter().enumerate().all(|(i, v)| *v == 2.0 * i as f32));
}

#[test]
fn device_addresses_are_not_host_pointers() {
    let dev = emu(TimeMode::Virtual);
    let b = dev.alloc::<u8>(4096).expect("alloc");
    assert!(
        b.device_address() >= 0x2000_0000_0000_0000,
        "{:#x}",
        b.device_address()
    );
    let host = Device::host().expect("host");
    let h = host.alloc::<u8>(4096).expect("alloc");
    assert!(h.device_address() < 0x0000_8000_0000_0000);
}

#[test]
fn allocation_past_capacity_is_out_of_memory() {
    let cfg = EmuConfig::new(LinkPreset::pcie4x16()).capacity(64 << 20);
    let dev = Device::new(DeviceConfig::default().emu(cfg)).expect("emu");
    let keep = dev.alloc::<u8>(32 << 20).expect("fits");
    match dev.alloc::<u8>(48 << 20) {
        Err(Error::Memory(m)) => assert!(m.to_string().contains("out of memory"), "{m}"),
        other => panic!("expected out of memory, got {other:?}"),
    }
    drop(keep);
}

#[test]
fn large_copies_reach_the_presets_bandwidth_alone_and_both_at_once() {
    let dev = emu(TimeMode::Virtual);
    let link = LinkPreset::pcie4x16();
    let n = 64 << 20;
    let (a, b) = (
        dev.create_stream().expect("a"),
        dev.create_stream().expect("b"),
    );
    let h = dev.alloc_pinned::<u8>(n).expect("h");
    let mut g = dev.alloc_pinned::<u8>(n).expect("g");
    let (x, y) = (
        dev.alloc::<u8>(n).expect("x"),
        dev.alloc::<u8>(n).expect("y"),
    );
    let t0 = dev.now_ns();
    a.copy_h2d(&h, &x).expect("h2d");
    a.synchronize().expect("sync");
    let alone = n as f64 / (dev.now_ns() - t0) as f64;
    assert!(
        (alone / link.h2d_gbps - 1.0).abs() < 0.05,
        "alone {alone} GB/s"
    );
    let t1 = dev.now_ns();
    a.copy_h2d(&h, &x).expect("h2d");
    b.copy_d2h(&y, &mut g).expect("d2h");
    dev.synchronize().expect("sync");
    let both = 2.0 * n as f64 / (dev.now_ns() - t1) as f64;
    let expect = link.bidir_h2d_gbps + link.bidir_d2h_gbps;
    // The faster direction finishes first and the other then runs alone.
    assert!(
        both > expect * 0.95 && both < expect * 1.2,
        "both {both} GB/s"
    );
}

#[test]
fn a_callback_waiting_for_its_own_emulated_device_is_an_error() {
    for time in [TimeMode::Virtual, TimeMode::Real] {
        let dev = emu(time);
        let s = dev.create_stream().expect("s");
        let d = dev.clone();
        let (tx, rx) = mpsc::channel();
        s.host_fn(move || {
            let _ = tx.send(d.synchronize());
        })
        .expect("host_fn");
        s.synchronize().expect("sync");
        let r = rx.recv_timeout(Duration::from_secs(20)).expect("reported");
        assert!(matches!(r, Err(Error::WouldDeadlock(_))), "{time:?}: {r:?}");
    }
}

#[test]
fn write_and_read_slice_stage_through_bounce_buffers() {
    let dev = emu(TimeMode::Virtual);
    let s = dev.create_stream().expect("s");
    let b = s.alloc::<u32>(1000).expect("alloc");
    s.write_slice(&b, 10, &[7u32; 20]).expect("write");
    s.fill_range(&b, 0, 10, 3).expect("fill");
    let mut out = vec![0u32; 30];
    s.read_slice(&b, 0, &mut out).expect("read");
    assert_eq!(&out[..10], &[3; 10]);
    assert_eq!(&out[10..], &[7; 20]);
}

/// In virtual time a host wait for work that only another thread can release (a
/// host event it signals later) keeps driving until it can run, rather than
/// failing or hanging. The other thread signals once the wait has begun: a
/// callback ahead of the held work says so, and in virtual time it runs only
/// inside a host wait (the synchronize below).
#[test]
fn a_virtual_wait_for_work_another_thread_releases_completes() {
    let dev = emu(TimeMode::Virtual);
    let s = dev.create_stream().expect("stream");
    let go = std::sync::Arc::new(dev.host_event());
    let b = s.alloc::<u32>(16).expect("alloc");
    let (began, wait_began) = mpsc::channel();
    s.host_fn(move || {
        let _ = began.send(());
    })
    .expect("host_fn");
    s.wait_event(go.event()).expect("wait");
    s.fill(&b, 9).expect("fill");
    let g = go.clone();
    let signaller = std::thread::spawn(move || {
        wait_began.recv().expect("the wait began");
        g.signal();
    });
    s.synchronize().expect("released by the other thread");
    assert_eq!(s.read_to_vec(&b).expect("read"), vec![9; 16]);
    signaller.join().expect("signaller");
}

/// A kernel whose declared cost has no modelled time on the device (not a
/// count, or past the 52 days a modelled kernel may take, the device's
/// slowdown included) faults with a message naming it, alone on its stream
/// or as a graph node; the device's clock never goes back (a time that
/// saturated a `u64` once wrapped it), and other streams go on.
#[test]
fn a_kernel_cost_past_the_clock_faults_and_the_clock_goes_on() {
    for time in [TimeMode::Virtual, TimeMode::Real] {
        let dev = emu(time);
        let flops = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let f = flops.clone();
        let k = Kernel::with_cost(
            "costly",
            move |_| KernelCost {
                flops: f64::from_bits(f.load(std::sync::atomic::Ordering::Relaxed)),
                bytes: 0.0,
            },
            |b| {
                for x in b.write::<u32>(0) {
                    *x += 1;
                }
            },
        );
        let x = dev.alloc::<u32>(4).expect("x");
        let run = |cost: f64| {
            flops.store(cost.to_bits(), std::sync::atomic::Ordering::Relaxed);
            let s = dev.create_stream().expect("stream");
            s.fill(&x, 0u32).expect("fill");
            s.launch(&k, Grid::new(1), &[Arg::write(&x)])
                .expect("launch");
            let before = dev.now_ns();
            let r = s.synchronize();
            assert!(dev.now_ns() >= before, "{time:?}: the clock went back");
            (r, s)
        };
        for cost in [1e30, f64::INFINITY, f64::NAN, -1.0] {
            let (r, _) = run(cost);
            match r {
                Err(Error::StreamFault { message, .. }) => {
                    assert!(message.contains("kernel 'costly'"), "{message}")
                }
                other => panic!("{time:?}, {cost} flops: {other:?}"),
            }
        }
        // A sane cost runs, and a slowdown that takes it past the bound faults it.
        let (r, s) = run(1e6);
        r.expect("a kernel of 1e6 flops");
        assert_eq!(s.read_to_vec(&x).expect("read"), vec![1; 4]);
        dev.set_emu_slowdown(1e300).expect("a finite slowdown");
        let (r, _) = run(1e6);
        assert!(
            matches!(&r, Err(Error::StreamFault { message, .. }) if message.contains("slowdown")),
            "{r:?}"
        );
        dev.set_emu_slowdown(1.0).expect("slowdown");
        // As a graph node: the launch faults, with the kernel named.
        flops.store(1e30f64.to_bits(), std::sync::atomic::Ordering::Relaxed);
        let s = dev.create_stream().expect("stream");
        s.begin_capture().expect("capture");
        s.launch(&k, Grid::new(1), &[Arg::write(&x)])
            .expect("launch");
        let exec = s.end_capture().expect("graph").instantiate().expect("exec");
        let g = dev.create_stream().expect("stream");
        g.launch_graph(&exec).expect("launch graph");
        match g.synchronize() {
            Err(Error::StreamFault { message, .. }) => {
                assert!(message.contains("kernel 'costly'"), "{message}")
            }
            other => panic!("{time:?}, graph: {other:?}"),
        }
    }
}

/// A kernel's cost declared per class of compute unit: a device of that
/// class times a launch by it, one of another class by the kernel's one
/// cost; alone or in a graph, and whichever order the costs were given.
#[test]
fn a_kernel_costs_what_it_declares_for_its_devices_class() {
    let flops = |f: f64| {
        move |_: Grid| KernelCost {
            flops: f,
            bytes: 0.0,
        }
    };
    let touch = |b: &mut hetero::Block<'_>| b.write::<u32>(0).iter_mut().for_each(|x| *x += 1);
    // 100 GFLOP/s per unit: 1e8 flops model 1 ms, 1e9 model 10 ms.
    let panel =
        Kernel::with_cost("panel", flops(1e8), touch).cost_on(ComputeClass::Cpu, flops(1e9));
    let only_cpu = Kernel::new("only-cpu", touch).cost_on(ComputeClass::Cpu, flops(1e9));
    // Declared for a class before a shared handle gets another: each keeps its own.
    let shared = panel.clone().cost_on(ComputeClass::Accelerator, flops(2e8));
    let time = |class: ComputeClass, k: &Kernel, graph: bool| {
        let cfg = EmuConfig::new(LinkPreset::pcie4x16())
            .time(TimeMode::Virtual)
            .capacity(1 << 30)
            .class(class);
        assert_eq!(cfg.compute_class(), class);
        let dev = Device::new(DeviceConfig::default().compute_units(1).emu(cfg)).expect("emu");
        let x = dev.alloc::<u32>(4).expect("x");
        let s = dev.create_stream().expect("stream");
        s.fill(&x, 0u32).expect("fill");
        s.synchronize().expect("fill");
        let t0 = dev.now_ns();
        if graph {
            let c = dev.create_stream().expect("stream");
            c.begin_capture().expect("capture");
            c.launch(k, Grid::new(1), &[Arg::write(&x)])
                .expect("launch");
            let exec = c.end_capture().expect("graph").instantiate().expect("exec");
            s.launch_graph(&exec).expect("launch graph");
        } else {
            s.launch(k, Grid::new(1), &[Arg::write(&x)])
                .expect("launch");
        }
        s.synchronize().expect("kernel");
        assert_eq!(s.read_to_vec(&x).expect("read"), vec![1; 4]);
        (dev.now_ns() - t0) as f64 / 1e6
    };
    for graph in [false, true] {
        let ms = |class, k: &Kernel| time(class, k, graph);
        let (cpu, acc) = (ComputeClass::Cpu, ComputeClass::Accelerator);
        let near = |got: f64, want: f64| (got - want).abs() < 0.05 * want + 0.1;
        let got = [
            ms(cpu, &panel),
            ms(acc, &panel),
            ms(acc, &shared),
            ms(cpu, &shared),
        ];
        assert!(
            near(got[0], 10.0) && near(got[1], 1.0),
            "graph {graph}: {got:?}"
        );
        assert!(
            near(got[2], 2.0) && near(got[3], 10.0),
            "graph {graph}: {got:?}"
        );
        // Declared for one class only: elsewhere as a kernel without a cost
        // (its buffers' bytes at memory bandwidth: far under a millisecond).
        let (c, a) = (ms(cpu, &only_cpu), ms(acc, &only_cpu));
        assert!(near(c, 10.0) && a < 0.1, "graph {graph}: {c} {a}");
    }
    assert_eq!(
        EmuConfig::parse("emu:pcie4x16,class=cpu").map(|c| c.compute_class()),
        Ok(ComputeClass::Cpu)
    );
    let e = EmuConfig::parse("emu,class=gpu").unwrap_err();
    assert!(e.contains("class=accelerator|cpu"), "{e}");
}

/// A link whose figures the model cannot run (a rate of zero, NaN, negative
/// or so small that a copy's time would wrap the clock; a setup latency past
/// 1 s), or an I/O TLB miss past 1 ms, is refused when the device or context
/// is made, naming the figure:
/// a rate of zero left the first copy waiting for ever.
#[test]
fn a_link_whose_figures_would_stall_or_wrap_the_clock_is_refused() {
    type Set = fn(&mut LinkPreset);
    let bad: [(&str, Set); 8] = [
        ("max_payload", |l| l.max_payload = 0),
        ("header_bytes", |l| l.header_bytes = u32::MAX),
        ("h2d_gbps", |l| l.h2d_gbps = 0.0),
        ("d2h_gbps", |l| l.d2h_gbps = f64::NAN),
        ("bidir_h2d_gbps", |l| l.bidir_h2d_gbps = -3.0),
        ("d2d_gbps", |l| l.d2d_gbps = 1e-12),
        ("memory_gbps", |l| l.memory_gbps = f64::INFINITY),
        ("setup_ns", |l| l.setup_ns = u64::MAX),
    ];
    for (field, set) in bad {
        let mut link = LinkPreset::pcie4x16();
        set(&mut link);
        let cfg = EmuConfig::new(link).time(TimeMode::Virtual);
        match Device::new(DeviceConfig::default().emu(cfg)) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(field), "{field}: {m}"),
            other => panic!("{field}: {:?}", other.map(|_| ())),
        }
    }
    let cfg = EmuConfig::new(LinkPreset::pcie4x16()).iotlb_miss_ns(u64::MAX);
    match Device::new(DeviceConfig::default().emu(cfg)) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("iotlb_miss_ns"), "{m}"),
        other => panic!("iotlb_miss_ns: {:?}", other.map(|_| ())),
    }
    let devs = [emu(TimeMode::Virtual), emu(TimeMode::Virtual)];
    let mut peer = hetero::PeerLink::nvlink3();
    peer.gbps = 0.0;
    match hetero::Context::with_peer_link(&devs, Some(peer)) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("gbps"), "{m}"),
        other => panic!("peer link: {:?}", other.map(|_| ())),
    }
    // The devices join a context with a sound link after the refusal.
    hetero::Context::with_peer_link(&devs, Some(hetero::PeerLink::nvlink3())).expect("context");
}

/// Emulated-device settings past what can be built are refused, naming the
/// setting: a capacity past the 64 TiB a reservation holds (`usize::MAX`
/// overflowed its rounding), an I/O TLB past 2^20 entries (its table is
/// allocated whole: `usize::MAX` overflowed, large ones exhausted memory),
/// and IOMMU pages past 1 GiB.
#[test]
fn emulated_settings_past_what_can_be_built_are_refused() {
    let base = || EmuConfig::new(LinkPreset::pcie4x16()).time(TimeMode::Virtual);
    let cases: [(&str, EmuConfig); 4] = [
        ("capacity", base().capacity(usize::MAX)),
        ("capacity", base().capacity(1 << 47)),
        ("iotlb_entries", base().iotlb_entries(usize::MAX)),
        ("iommu_page_max", base().iommu_page_max(1 << 62)),
    ];
    for (field, cfg) in cases {
        match Device::new(DeviceConfig::default().emu(cfg)) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(field), "{field}: {m}"),
            other => panic!("{field}: {:?}", other.map(|_| ())),
        }
    }
    let large = base().capacity(1 << 40).iotlb_entries(1 << 20);
    Device::new(DeviceConfig::default().emu(large)).expect("1 TiB, 2^20 entries");
}
