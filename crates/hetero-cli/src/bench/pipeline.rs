//! `hetero bench pipeline`: the demo's speedup of three streams over one, repeated,
//! beside the same pipeline built from three OS threads joined by crossbeam channels
//! (a stage thread per engine, blocking hand-offs) against its own serial run.

use super::BenchReport;
use crate::demo::{self, reference, DemoConfig};
use hetero::Device;
use std::time::Instant;

/// Three threads, one per stage, chunks handed on through channels.
fn threads_pipeline(input: &[Vec<f32>], iters: u32) -> (f64, f64) {
    let n = input[0].len();
    let stage_in = |c: usize, dst: &mut Vec<f32>| dst.copy_from_slice(&input[c]);
    let kernel = |src: &[f32], dst: &mut [f32]| {
        for (o, x) in dst.iter_mut().zip(src) {
            *o = reference(*x, iters);
        }
    };
    // Serial: one thread does every stage of every chunk.
    let t = Instant::now();
    let mut a = vec![0f32; n];
    let mut b = vec![0f32; n];
    let mut out = vec![vec![0f32; n]; input.len()];
    for (c, o) in out.iter_mut().enumerate() {
        stage_in(c, &mut a);
        kernel(&a, &mut b);
        o.copy_from_slice(&b);
    }
    let serial = t.elapsed().as_secs_f64();
    // Pipelined.
    let (tx1, rx1) = crossbeam_channel::bounded::<(usize, Vec<f32>)>(4);
    let (tx2, rx2) = crossbeam_channel::bounded::<(usize, Vec<f32>)>(4);
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(move || {
            for c in 0..input.len() {
                let mut buf = vec![0f32; n];
                stage_in(c, &mut buf);
                let _ = tx1.send((c, buf));
            }
        });
        s.spawn(move || {
            for (c, buf) in rx1 {
                let mut o = vec![0f32; n];
                kernel(&buf, &mut o);
                let _ = tx2.send((c, o));
            }
        });
        let outr = &mut out;
        s.spawn(move || {
            for (c, buf) in rx2 {
                outr[c].copy_from_slice(&buf);
            }
        });
    });
    let piped = t.elapsed().as_secs_f64();
    (serial, piped)
}

pub fn run(quick: bool) -> BenchReport {
    let rounds = if quick { 5 } else { 15 };
    let mut rep = BenchReport::new("pipeline");
    let dev = Device::host().expect("host device");
    let mut cfg = DemoConfig {
        reps: 3,
        ..DemoConfig::default()
    };
    let mut speedups = Vec::new();
    let mut fractions = Vec::new();
    let mut bounds = Vec::new();
    let mut iters = 0;
    for _ in 0..rounds {
        let r = demo::run(&dev, cfg, |_| {}).expect("demo run");
        assert!(r.verified, "pipeline output differs from the CPU reference");
        cfg.iters = Some(r.kernel_iters);
        iters = r.kernel_iters;
        speedups.push(r.speedup);
        fractions.push(r.fraction_of_bound);
        bounds.push(r.bound_speedup);
    }
    rep.push_samples("hetero/pipeline-speedup", "x", &mut speedups);
    rep.push_samples("hetero/pipeline-fraction-of-bound", "ratio", &mut fractions);
    rep.push_samples("hetero/pipeline-bound", "x", &mut bounds);

    let n = cfg.chunk_bytes / 4;
    let input: Vec<Vec<f32>> = (0..cfg.chunks)
        .map(|c| (0..n).map(|i| ((c * n + i) % 1000) as f32).collect())
        .collect();
    let mut peer = Vec::new();
    for _ in 0..rounds {
        let (s, p) = threads_pipeline(&input, iters);
        peer.push(s / p);
    }
    rep.push_samples("threads-channels/pipeline-speedup", "x", &mut peer);
    rep.ratio(
        "hetero/pipeline-speedup / threads-channels/pipeline-speedup",
        "hetero/pipeline-speedup",
        "threads-channels/pipeline-speedup",
    );
    rep
}
