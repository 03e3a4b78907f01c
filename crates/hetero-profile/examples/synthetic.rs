//! Writes the profiler's four outputs for a synthetic 3-stage pipeline
//! (H2D → kernel → D2H over three streams), recorded through the real
//! recorder from three threads. Run:
//! `cargo run -p hetero-profile --example synthetic -- OUT_DIR`

use std::path::PathBuf;

use hetero_trace::{EngineKind, MemKind, MemRecord, OpKind, OpRecord};

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "profile-synthetic".into()),
    );
    hetero_trace::set_enabled(true);
    hetero_trace::set_device_name("host (synthetic link: PCIe 4 x16)");
    hetero_trace::set_stream_name(1, "copy-in");
    hetero_trace::set_stream_name(2, "compute");
    hetero_trace::set_stream_name(3, "copy-out");
    let base = hetero_trace::now_ns();
    const US: u64 = 1_000;
    let stage =
        move |stream: u64, kind: OpKind, engine: EngineKind, batch: u64, offset: u64, len: u64| {
            let start = base + batch * 120 * US + offset;
            OpRecord {
                kind,
                name: match kind {
                    OpKind::Kernel => "resize+normalize",
                    OpKind::Wait => "wait",
                    _ => kind.as_str(),
                },
                stream,
                queue: stream as u32,
                engine,
                engine_index: (batch % 2) as u32 * u32::from(kind == OpKind::Kernel),
                seq: 2 * batch + 2,
                submit_ns: start - 5 * US,
                start_ns: start,
                end_ns: start + len,
                bytes: if matches!(kind, OpKind::H2D | OpKind::D2H) {
                    1 << 20
                } else {
                    0
                },
                dep: None,
                failed: false,
                node: None,
            }
        };
    let threads: Vec<_> = (0..3u64)
        .map(|s| {
            std::thread::spawn(move || {
                for b in 0..8u64 {
                    match s {
                        0 => hetero_trace::record_op(stage(
                            1,
                            OpKind::H2D,
                            EngineKind::CopyH2D,
                            b,
                            0,
                            100 * US,
                        )),
                        1 => {
                            let mut w = stage(2, OpKind::Wait, EngineKind::Host, b, 0, 101 * US);
                            w.seq -= 1;
                            w.dep = Some((1, 2 * b + 2));
                            hetero_trace::record_op(w);
                            hetero_trace::record_op(stage(
                                2,
                                OpKind::Kernel,
                                EngineKind::Compute,
                                b,
                                102 * US,
                                90 * US,
                            ));
                        }
                        _ => {
                            let mut w =
                                stage(3, OpKind::Wait, EngineKind::Host, b, 102 * US, 91 * US);
                            w.seq -= 1;
                            w.dep = Some((2, 2 * b + 2));
                            hetero_trace::record_op(w);
                            hetero_trace::record_op(stage(
                                3,
                                OpKind::D2H,
                                EngineKind::CopyD2H,
                                b,
                                194 * US,
                                60 * US,
                            ));
                            hetero_trace::record_mem(MemRecord {
                                kind: MemKind::Alloc,
                                ts_ns: base + b * 120 * US,
                                bytes: 1 << 20,
                                stream: 1,
                                reserved: 8 << 20,
                                allocated: (b + 1) * (1 << 20),
                            });
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("recording thread");
    }
    hetero_trace::set_enabled(false);
    let trace = hetero_trace::take();
    let options = hetero_profile::ReportOptions {
        link_peak_gbps: Some(25.0),
        ..Default::default()
    };
    let paths = hetero_profile::write_all_with(&trace, &dir, &options)?;
    println!("{paths:#?}");
    Ok(())
}
