//! Kernels with device code beside their host closure run on every backend:
//! the host and the emulated device run the closure, a Vulkan device the WGSL.
//! The results must agree. What only a device that compiles code can check
//! (compiler errors) runs where the device does.

mod common;

use hetero::{Arg, Error, Grid, Kernel};

const ADD: &str = r#"
@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> y: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i < arrayLength(&y)) {
        y[i] = y[i] + x[i];
    }
}
"#;

/// `y += x`, element by element; on the host, each block its part of `y`.
fn add() -> Kernel {
    Kernel::new("add", |b| {
        let x = b.read::<u32>(0);
        let off = b.write_offset(0);
        for (i, v) in b.write::<u32>(0).iter_mut().enumerate() {
            *v += x[off + i];
        }
    })
    .wgsl(ADD, "main")
}

#[test]
fn a_kernel_with_device_code_gives_the_same_result_everywhere() {
    let dev = common::device();
    let s = dev.create_stream().unwrap();
    let n = 10_000;
    let x = s.alloc::<u32>(n).unwrap();
    let y = s.alloc::<u32>(n).unwrap();
    s.write_slice(&x, 0, &(0..n as u32).collect::<Vec<_>>())
        .unwrap();
    s.fill(&y, 7).unwrap();
    let k = add();
    // Workgroups of 64 on a device, blocks on the host: enough of either.
    let grid = Grid::new(n.div_ceil(64) as u32);
    s.launch(&k, grid, &[Arg::read(&x), Arg::write(&y)])
        .unwrap();
    s.launch(&k, grid, &[Arg::read(&x), Arg::write(&y)])
        .unwrap();
    let out = s.read_to_vec(&y).unwrap();
    for (i, v) in out.iter().enumerate() {
        assert_eq!(*v, 7 + 2 * i as u32, "element {i}");
    }
}

#[test]
fn fills_of_every_pattern_width_and_alignment_land_exactly() {
    let dev = common::device();
    let s = dev.create_stream().unwrap();
    let b = s.alloc::<u8>(1000).unwrap();
    s.fill(&b, 0xAAu8).unwrap();
    let w16 = s.alloc::<u16>(333).unwrap();
    s.fill(&w16, 0x1234u16).unwrap();
    let w64 = s.alloc::<u64>(77).unwrap();
    s.fill(&w64, 0x0102_0304_0506_0708u64).unwrap();
    // Unaligned ranges of a byte buffer: 3 bytes at 1, 5 at 997 - 2.
    s.fill_range(&b, 1, 3, 0x11u8).unwrap();
    s.fill_range(&b, 995, 5, 0x22u8).unwrap();
    let bytes = s.read_to_vec(&b).unwrap();
    assert_eq!(bytes[0], 0xAA);
    assert_eq!(&bytes[1..4], &[0x11; 3]);
    assert!(bytes[4..995].iter().all(|&v| v == 0xAA));
    assert_eq!(&bytes[995..], &[0x22; 5]);
    assert!(s.read_to_vec(&w16).unwrap().iter().all(|&v| v == 0x1234));
    assert!(s
        .read_to_vec(&w64)
        .unwrap()
        .iter()
        .all(|&v| v == 0x0102_0304_0506_0708));
}

#[test]
fn wgsl_that_does_not_compile_fails_its_stream_with_the_line() {
    let dev = common::device();
    if !dev.properties().runs_device_code {
        return;
    }
    let s = dev.create_stream().unwrap();
    let y = s.alloc::<u32>(64).unwrap();
    let bad = Kernel::from_wgsl(
        "bad",
        "@group(0) @binding(0) var<storage, read_write> y: array<u32>;\n\
         @compute @workgroup_size(64)\n\
         fn main() { y[0] = undefined_thing; }\n",
        "main",
    );
    s.launch(&bad, Grid::new(1), &[Arg::write(&y)]).unwrap();
    let e = s.synchronize().unwrap_err();
    assert!(matches!(e, Error::StreamFault { .. }), "{e}");
    let m = e.to_string();
    assert!(m.contains("bad") && m.contains("line 3"), "{m}");
    // Another stream goes on.
    let t = dev.create_stream().unwrap();
    let z = t.alloc::<u32>(64).unwrap();
    t.fill(&z, 5).unwrap();
    assert_eq!(t.read_to_vec(&z).unwrap(), vec![5; 64]);
}

/// A graph launched again and again (on a Vulkan device its recorded command
/// buffer is resubmitted) with an unaligned fill staged through host memory,
/// a kernel, and a slot rebound between launches: every launch acts on what
/// is bound then, with its own fill.
#[test]
fn a_graph_replayed_with_rebinding_acts_on_each_launchs_buffers() {
    let dev = common::device();
    let s = dev.create_stream().unwrap();
    let n = 1000;
    let x = s.alloc::<u32>(n).unwrap();
    s.write_slice(&x, 0, &(0..n as u32).collect::<Vec<_>>())
        .unwrap();
    let bufs: Vec<_> = (0..3).map(|_| s.alloc::<u32>(n).unwrap()).collect();
    let bytes = s.alloc::<u8>(64).unwrap();
    s.fill(&bytes, 0u8).unwrap();
    let cb = hetero::CommandBuffer::new(&dev).unwrap();
    let y = cb.slot::<u32>(n).unwrap();
    cb.fill(&y, 7u32).unwrap();
    cb.fill_range(&bytes, 3, 5, 0xEEu8).unwrap();
    cb.launch(
        &add(),
        Grid::new(n.div_ceil(64) as u32),
        &[Arg::read(&x), Arg::write(&y)],
    )
    .unwrap();
    let exec = cb.finish().unwrap();
    for round in 0..6 {
        let mut b = exec.bindings();
        b.bind(&y, &bufs[round % 3]).unwrap();
        // Twice with the same binding: the second replays the first's recording.
        s.launch_graph_with(&exec, &b).unwrap();
        s.launch_graph_with(&exec, &b).unwrap();
        let out = s.read_to_vec(&bufs[round % 3]).unwrap();
        for (i, v) in out.iter().enumerate() {
            assert_eq!(*v, 7 + i as u32, "round {round}, element {i}");
        }
        let got = s.read_to_vec(&bytes).unwrap();
        assert_eq!(&got[3..8], &[0xEE; 5], "round {round}");
        s.fill(&bytes, 0u8).unwrap();
    }
}

/// What a device that compiles code refuses, as typed errors in the stream
/// that launched it (other streams go on): SPIR-V that is not SPIR-V, a
/// kernel whose code binds more buffers than the launch passes (the driver
/// would otherwise get a pipeline whose layout lacks a binding the shader
/// uses), and a buffer smaller than the shader's type for it.
#[test]
fn bad_device_code_fails_its_stream_with_a_typed_reason() {
    let dev = common::device();
    if !dev.properties().runs_device_code {
        return;
    }
    let s = dev.create_stream().unwrap();
    let y = s.alloc::<u32>(64).unwrap();
    let garbage = Kernel::from_wgsl("unused", "", "main").spirv(vec![0xdead_beef; 16], "main");
    s.launch(&garbage, Grid::new(1), &[Arg::write(&y)]).unwrap();
    let e = s.synchronize().unwrap_err().to_string();
    assert!(e.contains("SPIR-V"), "{e}");
    let t = dev.create_stream().unwrap();
    let two = Kernel::from_wgsl("two", ADD, "main");
    t.launch(&two, Grid::new(1), &[Arg::write(&y)]).unwrap();
    let e = t.synchronize().unwrap_err().to_string();
    assert!(e.contains("binds storage buffer 1"), "{e}");
    // A buffer smaller than the shader's fixed-size type: refused, not read
    // out of bounds.
    let fixed = Kernel::from_wgsl(
        "fixed",
        "@group(0) @binding(0) var<storage, read_write> t: array<u32, 64>;\n\
         @compute @workgroup_size(1) fn main() { t[63] = 1u; }\n",
        "main",
    );
    let w = dev.create_stream().unwrap();
    let small = w.alloc::<u32>(16).unwrap();
    w.launch(&fixed, Grid::new(1), &[Arg::write(&small)])
        .unwrap();
    let e = w.synchronize().unwrap_err().to_string();
    assert!(e.contains("at least 256 bytes"), "{e}");
    let u = dev.create_stream().unwrap();
    u.fill(&y, 3).unwrap();
    assert_eq!(u.read_to_vec(&y).unwrap(), vec![3; 64]);
}

/// Opening a Vulkan device that is not there is a typed error that says how
/// to see the ones that are (or what to install); asking any device for more
/// memory than it has is a typed error too.
#[test]
fn missing_devices_and_too_much_memory_are_typed_errors() {
    match hetero::Device::new(hetero::DeviceConfig::default().vulkan(99)) {
        Err(Error::Setup(m)) => assert!(m.contains("hetero info") || m.contains("install"), "{m}"),
        other => panic!("expected a setup error, got {other:?}"),
    }
    let dev = common::device();
    let e = dev.alloc::<u8>(1 << 50).unwrap_err();
    assert!(matches!(e, Error::Memory(_)), "{e}");
}

/// A device the driver loses (injected at its third submission, as a GPU
/// reset would) fails the work that had not completed, on every stream, with
/// a reason that says so; refuses new work, streams and memory with
/// `DeviceLost`; loses no host data; and hangs nobody. A new device works.
#[test]
fn a_lost_device_fails_its_pending_work_and_refuses_new_work() {
    if common::skipped("a_lost_device_fails_its_pending_work_and_refuses_new_work") {
        return;
    }
    let dev = common::device_with(|c| c.lose_device_at_submission(3));
    let a = dev.create_stream().unwrap();
    let b = dev.create_stream().unwrap();
    let host: Vec<u32> = (0..4096).collect();
    let pinned = dev.pinned_from_slice(&host).unwrap();
    let x = a.alloc::<u32>(host.len()).unwrap();
    // Stream b waits on the host, so its work is pending when the device goes.
    let go = dev.host_event();
    b.wait_event(go.event()).unwrap();
    let y = b.alloc::<u32>(16).unwrap();
    b.fill(&y, 7).unwrap();
    let mut failed = None;
    for round in 0..8u32 {
        // Refused at submission once the engine saw the loss, or failed in
        // the stream when it was pending.
        let r = a
            .copy_h2d(&pinned, &x)
            .and_then(|()| a.fill(&x, round))
            .and_then(|()| a.synchronize());
        if let Err(e) = r {
            failed = Some((round, e));
            break;
        }
    }
    let (round, e) = failed.expect("the device was lost at its third submission");
    assert!(round <= 2, "lost at round {round}");
    assert!(e.to_string().contains("lost"), "{e}");
    go.signal();
    let e = b.synchronize().unwrap_err();
    assert!(e.to_string().contains("lost"), "{e}");
    assert!(matches!(dev.synchronize(), Err(Error::DeviceLost { .. })));
    assert!(matches!(a.fill(&x, 1), Err(Error::DeviceLost { .. })));
    assert!(matches!(dev.create_stream(), Err(Error::DeviceLost { .. })));
    assert!(matches!(dev.alloc::<u8>(64), Err(Error::DeviceLost { .. })));
    assert_eq!(pinned.as_slice().unwrap(), &host[..]);
    drop((x, y, a, b, pinned));
    drop(dev);
    let fresh = common::device();
    let s = fresh.create_stream().unwrap();
    let z = s.alloc::<u32>(64).unwrap();
    s.fill(&z, 5).unwrap();
    assert_eq!(s.read_to_vec(&z).unwrap(), vec![5; 64]);
}

/// A queue priority among the device's programs is asked for; a driver
/// without global priorities (lavapipe), or one that refuses it, opens the
/// device at the default, and says which it granted; the device works.
#[test]
fn a_queue_priority_is_granted_or_left_at_the_default() {
    for p in [hetero::QueuePriority::Low, hetero::QueuePriority::Realtime] {
        let dev = common::device_with(|c| c.queue_priority(p));
        let granted = dev.properties().queue_priority;
        assert!(granted.is_none() || granted == Some(p), "{granted:?}");
        if let Some(Ok(info)) = (common::backend() == common::Backend::Vulkan)
            .then(hetero::vulkan::devices)
            .map(|r| r.map(|d| d[0].clone()))
        {
            if !info.features.global_priority {
                assert_eq!(granted, None, "{} has no global priorities", info.name);
            }
        } else {
            assert_eq!(granted, None, "only a Vulkan device has queue priorities");
        }
        let s = dev.create_stream().unwrap();
        let y = s.alloc::<u32>(256).unwrap();
        s.fill(&y, 9).unwrap();
        assert_eq!(s.read_to_vec(&y).unwrap(), vec![9; 256]);
    }
}
