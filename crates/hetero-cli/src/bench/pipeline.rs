//! `hetero bench pipeline`: the demo's work (H2D → kernel → D2H over its tiles:
//! each tile's own input and output, a few buffers between the stages recycled)
//! on hetero's three streams beside the same work on three OS threads joined by
//! crossbeam channels, in absolute time: `hetero/pipeline-ms` vs
//! `threads-channels/pipeline-ms` is the head-to-head. The demo's own peer, a
//! pair of threads spinning on counters (`crate::demo::spin_pair`), runs inside each
//! demo run, after hetero's reps: `spin-pair/pipeline-ms`.
//!
//! Each side's speedup over its own serial run is reported too, but the two
//! speedups do not compare the runtimes: each divides by a different serial time
//! (hetero's is three ops per tile on one stream, the threads' a plain loop on
//! one thread; both recycle their buffers), so a pipeline can win on speedup and
//! lose on time. The `*-serial-ms` results show the two denominators.

use super::BenchReport;
use crate::demo::{self, reference, DemoConfig};
use crossbeam_channel::{bounded, Receiver, Sender};
use hetero::Device;
use std::time::Instant;

/// Buffers in flight between two threads' stages (the channels' bound).
const IN_FLIGHT: usize = 4;

/// A serial loop on one thread: every stage of every tile, two scratch buffers.
fn threads_serial_ms(input: &[Vec<f32>], out: &mut [Vec<f32>], iters: u32) -> f64 {
    let n = input[0].len();
    let t = Instant::now();
    let mut a = vec![0f32; n];
    let mut b = vec![0f32; n];
    for (c, o) in out.iter_mut().enumerate() {
        a.copy_from_slice(&input[c]);
        demo::scale_into(&a, &mut b, iters);
        o.copy_from_slice(&b);
    }
    t.elapsed().as_secs_f64() * 1e3
}

/// A tile's index and its buffer, handed from stage to stage.
type Tile = (usize, Vec<f32>);

/// The three stage threads, started once and fed round after round, so a
/// round's time holds no thread start. Buffers travel back to the stage that
/// fills them: nothing is allocated after the first round.
struct ThreadsPipeline {
    start: Sender<()>,
    done: Receiver<Vec<Vec<f32>>>,
    give_out: Sender<Vec<Vec<f32>>>,
}

impl ThreadsPipeline {
    /// Runs a round; returns its time (ms) and the outputs, which the next
    /// round takes back.
    fn round(&self, out: Vec<Vec<f32>>) -> (f64, Vec<Vec<f32>>) {
        self.give_out.send(out).expect("stage 3 alive");
        let t = Instant::now();
        self.start.send(()).expect("stage 1 alive");
        let out = self.done.recv().expect("stage 3 alive");
        (t.elapsed().as_secs_f64() * 1e3, out)
    }
}

/// Starts the stage threads in `scope`; they end when the pipeline drops.
fn threads_pipeline<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    input: &'s [Vec<f32>],
    iters: u32,
) -> ThreadsPipeline {
    let n = input[0].len();
    let tiles = input.len();
    let (start, start_rx) = bounded::<()>(1);
    let (done_tx, done) = bounded(1);
    let (give_out, out_rx) = bounded::<Vec<Vec<f32>>>(1);
    let (to_kernel, kernel_rx) = bounded::<Tile>(IN_FLIGHT);
    let (to_d2h, d2h_rx) = bounded::<Tile>(IN_FLIGHT);
    let (free_in_tx, free_in) = bounded::<Vec<f32>>(IN_FLIGHT);
    let (free_mid_tx, free_mid) = bounded::<Vec<f32>>(IN_FLIGHT);
    for _ in 0..IN_FLIGHT {
        free_in_tx.send(vec![0f32; n]).expect("room");
        free_mid_tx.send(vec![0f32; n]).expect("room");
    }
    // Stage 1 ("H2D"): fills a free buffer with the tile's input.
    scope.spawn(move || {
        for () in start_rx {
            for (c, src) in input.iter().enumerate() {
                let mut buf = free_in.recv().expect("buffers come back");
                buf.copy_from_slice(src);
                if to_kernel.send((c, buf)).is_err() {
                    return;
                }
            }
        }
    });
    // Stage 2 (kernel): reads one buffer, writes another, returns the first.
    scope.spawn(move || {
        for (c, buf) in kernel_rx {
            let mut o = free_mid.recv().expect("buffers come back");
            demo::scale_into(&buf, &mut o, iters);
            let _ = free_in_tx.send(buf);
            if to_d2h.send((c, o)).is_err() {
                return;
            }
        }
    });
    // Stage 3 ("D2H"): copies into the round's outputs, returns the buffer.
    scope.spawn(move || {
        for mut out in out_rx {
            for _ in 0..tiles {
                let Ok((c, buf)) = d2h_rx.recv() else { return };
                out[c].copy_from_slice(&buf);
                let _ = free_mid_tx.send(buf);
            }
            if done_tx.send(out).is_err() {
                return;
            }
        }
    });
    ThreadsPipeline {
        start,
        done,
        give_out,
    }
}

pub fn run(quick: bool) -> BenchReport {
    let rounds = if quick { 5 } else { 15 };
    let mut rep = BenchReport::new("pipeline");
    let dev = Device::new(crate::device::device_config()).expect("host device");
    let mut cfg = DemoConfig {
        reps: 3,
        ..DemoConfig::default()
    };
    let mut speedups = Vec::new();
    let mut fractions = Vec::new();
    let mut bounds = Vec::new();
    let (mut pipe_ms, mut serial_ms) = (Vec::new(), Vec::new());
    let (mut pair_pipe, mut pair_serial, mut pair_speedup) = (Vec::new(), Vec::new(), Vec::new());
    let mut iters = 0;
    for _ in 0..rounds {
        let r = demo::run(&dev, cfg, |_| {}).expect("demo run");
        assert!(r.verified, "pipeline output differs from the CPU reference");
        cfg.work = Some(r.kernel_work);
        iters = r.kernel_work;
        speedups.push(r.speedup);
        fractions.push(r.fraction_of_bound);
        bounds.push(r.bound_speedup);
        pipe_ms.push(r.pipelined_ms);
        serial_ms.push(r.serial_ms);
        let pair = r.spin_pair.expect("the host demo runs the spin-pair peer");
        assert!(
            pair.verified,
            "spin-pair output differs from the CPU reference"
        );
        pair_pipe.push(pair.pipelined_ms);
        pair_serial.push(pair.serial_ms);
        pair_speedup.push(pair.speedup);
    }

    let n = cfg.tile_bytes / 4;
    let input: Vec<Vec<f32>> = (0..cfg.tiles)
        .map(|c| (0..n).map(|i| ((c * n + i) % 1000) as f32).collect())
        .collect();
    let (mut peer_pipe, mut peer_serial, mut peer_speedup) = (Vec::new(), Vec::new(), Vec::new());
    let mut out = vec![vec![0f32; n]; cfg.tiles];
    std::thread::scope(|s| {
        let p = threads_pipeline(s, &input, iters);
        // As the demo: a warm-up round, then the median of three per round.
        out = p.round(std::mem::take(&mut out)).1;
        for _ in 0..rounds {
            let (mut piped, mut serial) = (Vec::new(), Vec::new());
            for _ in 0..cfg.reps {
                serial.push(threads_serial_ms(&input, &mut out, iters));
                let (ms, o) = p.round(std::mem::take(&mut out));
                out = o;
                piped.push(ms);
            }
            let (piped, serial) = (median(piped), median(serial));
            peer_pipe.push(piped);
            peer_serial.push(serial);
            peer_speedup.push(serial / piped);
        }
    });
    let ok = out.iter().zip(&input).all(|(o, i)| {
        let n = i.len();
        o.iter()
            .zip(i)
            .enumerate()
            .all(|(k, (y, x))| y.to_bits() == reference(*x, iters, k, n).to_bits())
    });
    assert!(ok, "threads pipeline output differs from the CPU reference");

    // Head to head: the same work, absolute time.
    rep.push_samples("hetero/pipeline-ms", "ms", &mut pipe_ms);
    rep.push_samples("threads-channels/pipeline-ms", "ms", &mut peer_pipe);
    rep.push_samples("hetero/serial-ms", "ms", &mut serial_ms);
    rep.push_samples("threads-channels/serial-ms", "ms", &mut peer_serial);
    rep.ratio_of("hetero/pipeline-ms", "threads-channels/pipeline-ms");
    rep.ratio_of("hetero/serial-ms", "threads-channels/serial-ms");
    rep.push_samples("spin-pair/pipeline-ms", "ms", &mut pair_pipe);
    rep.push_samples("spin-pair/serial-ms", "ms", &mut pair_serial);
    rep.ratio_of("hetero/pipeline-ms", "spin-pair/pipeline-ms");
    // Each against its own serial run (see the module header: not a head-to-head).
    rep.push_samples("hetero/pipeline-speedup", "x", &mut speedups);
    rep.push_samples("hetero/pipeline-fraction-of-bound", "ratio", &mut fractions);
    rep.push_samples("hetero/pipeline-bound", "x", &mut bounds);
    rep.push_samples("threads-channels/pipeline-speedup", "x", &mut peer_speedup);
    rep.push_samples("spin-pair/pipeline-speedup", "x", &mut pair_speedup);
    rep.ratio_of(
        "hetero/pipeline-speedup",
        "threads-channels/pipeline-speedup",
    );
    rep
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
