//! One clock per device in a trace: on an emulated device in virtual time
//! every record (ops, memory events, graph nodes) is stamped by the device's
//! modelled clock, never by the host's. The host spends a long time between
//! the steps (host time passes, modelled time does not), so a host timestamp
//! would lie far past the device clock's end.

use hetero::{Arg, DeviceConfig, EmuConfig, Graph, Grid, Kernel, LinkPreset, TimeMode};
use std::time::Duration;

#[test]
fn a_virtual_time_trace_holds_only_device_timestamps() {
    let emu = EmuConfig::new(LinkPreset::pcie4x16()).time(TimeMode::Virtual);
    let dev = hetero::Device::new(DeviceConfig::default().emu(emu)).expect("emu device");
    let _ = hetero_trace::take(); // start from an empty recorder
    hetero_trace::set_enabled(true);
    std::thread::sleep(Duration::from_millis(300));
    let s = dev.create_stream().unwrap();
    let x = s.alloc::<f32>(1 << 16).unwrap();
    let input = dev.pinned_from_slice(&vec![1.0f32; 1 << 16]).unwrap();
    s.copy_h2d(&input, &x).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let k = Kernel::new("double", |b| {
        for v in b.write::<f32>(0).iter_mut() {
            *v *= 2.0;
        }
    });
    s.launch(&k, Grid::new(2), &[Arg::write(&x)]).unwrap();
    let mut g = Graph::new(&dev).unwrap();
    let y = g.alloc::<f32>(1 << 10).unwrap();
    let f = g.fill(&y, 3.0, &[]).unwrap();
    g.kernel(&k, Grid::new(1), &[Arg::write(&y)], &[f]).unwrap();
    let exec = g.instantiate().unwrap();
    s.launch_graph(&exec).unwrap();
    s.synchronize().unwrap();
    drop(x); // a free, recorded while profiling
    std::thread::sleep(Duration::from_millis(100));
    s.synchronize().unwrap();
    let end = dev.now_ns();
    hetero_trace::set_enabled(false);
    let trace = hetero_trace::take();
    assert!(
        !trace.ops.is_empty() && !trace.mem.is_empty(),
        "ops and memory events recorded"
    );
    assert!(end < 300_000_000, "the device clock is modelled: {end} ns");
    for op in &trace.ops {
        for (what, t) in [
            ("submit", op.submit_ns),
            ("start", op.start_ns),
            ("end", op.end_ns),
        ] {
            assert!(
                t <= end,
                "{} {what} at {t} ns, past the device clock's {end} ns",
                op.name
            );
        }
    }
    for m in &trace.mem {
        assert!(
            m.ts_ns <= end,
            "{:?} at {} ns, past the device clock's {end} ns",
            m.kind,
            m.ts_ns
        );
    }
}
