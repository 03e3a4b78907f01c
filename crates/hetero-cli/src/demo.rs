//! The demo workload: a 3-stage pipeline (H2D → kernel → D2H) over many tiles, run
//! once on one stream (serial) and once on three streams joined by events.
//!
//! Sizing: each tile's kernel is one block (one compute unit) and is calibrated to
//! take about twice one tile's copy (the mean of its H2D and D2H), so the stages map one-to-one onto engines as
//! on an accelerator. The ideal speedup follows from the stage times measured in the
//! serial run: `bound = (h2d + kernel + d2h) / max(h2d, kernel, d2h, (h2d + kernel + d2h) / cores)`.

use hetero::{
    Arg, CompletionMode, Device, DeviceBuffer, DeviceConfig, Event, Grid, Kernel, PinnedBuffer,
    Result, Stream, PRIORITY_HIGHEST,
};
use serde::Serialize;
use std::time::{Duration, Instant};

/// The device the demo runs on: a host device configured for a dedicated
/// pipeline. The host thread has nothing to do while the pipeline runs, so it
/// parks (`Block`) instead of polling; idle engines poll with yields and never
/// park. On 2 vCPUs a polling host thread is a third busy thread on two cores,
/// and an engine that parks between tiles pays a ~100 µs wake-up on the
/// pipeline's critical path (a tile's stage takes 4–16 µs).
pub fn device_config() -> DeviceConfig {
    DeviceConfig::default()
        .host_wait(CompletionMode::Block)
        .engine_idle(CompletionMode::Yield)
}

/// Demo parameters.
#[derive(Debug, Clone, Copy)]
pub struct DemoConfig {
    pub tiles: usize,
    pub tile_bytes: usize,
    /// Timed repetitions of each mode; the median is reported.
    pub reps: usize,
    /// Kernel iterations per element; `None` calibrates to 2× a tile's copy.
    pub iters: Option<u32>,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            tiles: 64,
            tile_bytes: 256 * 1024,
            reps: 7,
            iters: None,
        }
    }
}

/// What the demo measured.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    pub verified: bool,
    pub tiles: usize,
    pub tile_bytes: usize,
    pub kernel_iters: u32,
    pub cores: usize,
    pub serial_ms: f64,
    pub pipelined_ms: f64,
    pub speedup: f64,
    /// Stage times per tile measured with events in the serial run (µs).
    pub h2d_us: f64,
    pub kernel_us: f64,
    pub d2h_us: f64,
    pub bound_speedup: f64,
    pub fraction_of_bound: f64,
    pub serial_gbps: f64,
    pub pipelined_gbps: f64,
}

fn scale_kernel(iters: u32) -> Kernel {
    Kernel::new("scale", move |b| {
        let x = b.read::<f32>(0);
        let off = b.write_offset(0);
        let y = b.write::<f32>(0);
        y.copy_from_slice(&x[off..off + y.len()]);
        scale_in_place(y, iters);
    })
}

/// The kernel's body after its copy: `iters` passes over the whole tile (the
/// inner loop vectorises); each element sees the same sequence of operations as
/// `reference`. Peers that do the demo's work call it too.
pub fn scale_in_place(y: &mut [f32], iters: u32) {
    for _ in 0..iters {
        for v in y.iter_mut() {
            *v = step(*v);
        }
    }
}

#[inline(always)]
fn step(v: f32) -> f32 {
    v * 0.999_9 + 0.5
}

/// The per-element computation, shared by the kernel and the CPU check.
pub fn reference(x: f32, iters: u32) -> f32 {
    (0..iters).fold(x, |v, _| step(v))
}

struct Buffers {
    input: Vec<PinnedBuffer<f32>>,
    output: Vec<PinnedBuffer<f32>>,
    dev_in: Vec<DeviceBuffer<f32>>,
    dev_out: Vec<DeviceBuffer<f32>>,
}

impl Buffers {
    fn new(dev: &Device, tiles: usize, n: usize) -> Result<Self> {
        let mut b = Buffers {
            input: Vec::new(),
            output: Vec::new(),
            dev_in: Vec::new(),
            dev_out: Vec::new(),
        };
        for c in 0..tiles {
            let data: Vec<f32> = (0..n).map(|i| ((c * n + i) % 1000) as f32).collect();
            b.input.push(dev.pinned_from_slice(&data)?);
            b.output.push(dev.alloc_pinned(n)?);
            b.dev_in.push(dev.alloc(n)?);
            b.dev_out.push(dev.alloc(n)?);
        }
        Ok(b)
    }
}

/// Serial run on one stream; with `stages`, events around each stage give each
/// tile's stage times (ns), per stage.
fn run_serial(
    s: &Stream,
    b: &mut Buffers,
    k: &Kernel,
    stages: bool,
) -> Result<(Duration, [Vec<f64>; 3])> {
    let t0 = Instant::now();
    let mut marks: Vec<[Event; 4]> = Vec::new();
    for c in 0..b.input.len() {
        let mut ev: [Event; 4] = Default::default();
        if stages {
            s.record(&mut ev[0])?;
        }
        s.copy_h2d(&b.input[c], &b.dev_in[c])?;
        if stages {
            s.record(&mut ev[1])?;
        }
        s.launch(
            k,
            Grid::new(1),
            &[Arg::read(&b.dev_in[c]), Arg::write(&b.dev_out[c])],
        )?;
        if stages {
            s.record(&mut ev[2])?;
        }
        s.copy_d2h(&b.dev_out[c], &mut b.output[c])?;
        if stages {
            s.record(&mut ev[3])?;
            marks.push(ev);
        }
    }
    s.synchronize()?;
    let wall = t0.elapsed();
    let mut times: [Vec<f64>; 3] = Default::default();
    for ev in &marks {
        for (st, t) in times.iter_mut().enumerate() {
            t.push(ev[st].elapsed_ms(&ev[st + 1])? * 1e6);
        }
    }
    Ok((wall, times))
}

/// Pipelined run: one stream per stage, tile `c` handed from stage to stage by events.
fn run_pipelined(streams: &[Stream; 3], b: &mut Buffers, k: &Kernel) -> Result<Duration> {
    let [h2d, compute, d2h] = streams;
    let t0 = Instant::now();
    for c in 0..b.input.len() {
        h2d.copy_h2d(&b.input[c], &b.dev_in[c])?;
        let copied = h2d.record_event()?;
        compute.wait_event(&copied)?;
        compute.launch(
            k,
            Grid::new(1),
            &[Arg::read(&b.dev_in[c]), Arg::write(&b.dev_out[c])],
        )?;
        let computed = compute.record_event()?;
        d2h.wait_event(&computed)?;
        d2h.copy_d2h(&b.dev_out[c], &mut b.output[c])?;
    }
    for s in streams {
        s.synchronize()?;
    }
    Ok(t0.elapsed())
}

/// One stream per stage. The kernel stage is the pipeline's critical path (it is the
/// longest stage and one stream runs its kernels in order), so it gets the highest
/// priority: when an engine frees up and the next kernel is ready, it runs before a
/// copy that is far ahead of it. The copy stages keep progressing (aging).
fn stage_streams(dev: &Device) -> Result<[Stream; 3]> {
    let streams = [
        dev.create_stream_with_priority(4)?,
        dev.create_stream_with_priority(PRIORITY_HIGHEST)?,
        dev.create_stream_with_priority(4)?,
    ];
    for (s, name) in streams
        .iter()
        .zip(["h2d stage", "kernel stage", "d2h stage"])
    {
        s.set_name(name);
    }
    Ok(streams)
}

/// Only the pipelined run, `reps` times after one warm-up, with the kernel sized by
/// `cfg.iters` (or calibrated): the `pipeline` workload. Returns the median time
/// (ms) and whether every run matched the CPU reference.
pub fn pipeline(dev: &Device, cfg: DemoConfig) -> Result<(f64, bool)> {
    let n = (cfg.tile_bytes / 4).max(1);
    let mut b = Buffers::new(dev, cfg.tiles, n)?;
    let iters = match cfg.iters {
        Some(i) => i,
        None => calibrate(dev, &mut b)?,
    };
    let k = scale_kernel(iters);
    let streams = stage_streams(dev)?;
    run_pipelined(&streams, &mut b, &k)?;
    let mut times = Vec::new();
    let mut verified = true;
    for _ in 0..cfg.reps.max(1) {
        clear_outputs(&streams[0], &mut b)?;
        times.push(run_pipelined(&streams, &mut b, &k)?.as_secs_f64() * 1e3);
        verified &= verify(&b, iters)?;
    }
    Ok((median(times), verified))
}

fn verify(b: &Buffers, iters: u32) -> Result<bool> {
    for (inp, out) in b.input.iter().zip(&b.output) {
        let (i, o) = (inp.as_slice()?, out.as_slice()?);
        if !i
            .iter()
            .zip(o)
            .all(|(x, y)| reference(*x, iters).to_bits() == y.to_bits())
        {
            return Ok(false);
        }
    }
    Ok(true)
}

fn clear_outputs(s: &Stream, b: &mut Buffers) -> Result<()> {
    for o in &mut b.output {
        s.fill_pinned(o, f32::NAN)?;
    }
    s.synchronize()
}

/// Picks kernel passes so one tile's kernel takes about twice one tile's copy (the
/// mean of its H2D and D2H, so `kernel ≈ h2d + d2h`: the two stages then balance on
/// two engines), from
/// serial runs with stage events over the demo's own buffers (the conditions the
/// demo then measures): kernel time is about `fixed + per_pass * passes`, so two
/// probes give the line, and one more run corrects the estimate.
fn calibrate(dev: &Device, b: &mut Buffers) -> Result<u32> {
    let s = dev.create_stream()?;
    s.set_name("calibration");
    let mut stage = |passes: u32| -> Result<(f64, f64)> {
        // Medians per tile: one preempted tile must not skew the sizing.
        let [h2d, kernel, d2h] = run_serial(&s, b, &scale_kernel(passes), true)?.1;
        Ok(((median(h2d) + median(d2h)) / 2.0, median(kernel)))
    };
    stage(0)?; // warm the buffers
    let (h0, k0) = stage(0)?;
    let (h1, k1) = stage(16)?;
    let per_pass = ((k1 - k0) / 16.0).max(1.0);
    let solve = |h: f64, k_at: f64, at: u32| -> u32 {
        (f64::from(at) + (2.0 * h - k_at) / per_pass)
            .round()
            .clamp(0.0, 100_000.0) as u32
    };
    let guess = solve((h0 + h1) / 2.0, k0, 0);
    let (h2, k2) = stage(guess)?;
    Ok(solve(h2, k2, guess))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the demo on `dev`.
pub fn run(dev: &Device, cfg: DemoConfig, mut progress: impl FnMut(&str)) -> Result<DemoReport> {
    let n = (cfg.tile_bytes / 4).max(1);
    let cores = dev.properties().compute_units;
    let mut b = Buffers::new(dev, cfg.tiles, n)?;
    progress("calibrating the kernel");
    let iters = match cfg.iters {
        Some(i) => i,
        None => calibrate(dev, &mut b)?,
    };
    let k = scale_kernel(iters);
    let serial = dev.create_stream()?;
    serial.set_name("serial");
    let streams = stage_streams(dev)?;

    // Warm up both modes once (page faults, caches), then measure.
    run_serial(&serial, &mut b, &k, false)?;
    run_pipelined(&streams, &mut b, &k)?;

    let reps = cfg.reps.max(1);
    let mut serial_ms = Vec::new();
    let mut stage_times: [Vec<f64>; 3] = Default::default();
    let mut verified = true;
    for r in 0..reps {
        progress(&format!("serial run {}/{reps}", r + 1));
        clear_outputs(&serial, &mut b)?;
        let (wall, _) = run_serial(&serial, &mut b, &k, false)?;
        serial_ms.push(wall.as_secs_f64() * 1e3);
        verified &= verify(&b, iters)?;
        // Stage times come from a separate run with events between stages, so the
        // markers do not slow the timed run.
        let (_, times) = run_serial(&serial, &mut b, &k, true)?;
        for (all, t) in stage_times.iter_mut().zip(times) {
            all.extend(t);
        }
    }
    let mut pipe_ms = Vec::new();
    for r in 0..reps {
        progress(&format!("pipelined run {}/{reps}", r + 1));
        clear_outputs(&serial, &mut b)?;
        pipe_ms.push(run_pipelined(&streams, &mut b, &k)?.as_secs_f64() * 1e3);
        verified &= verify(&b, iters)?;
    }
    let stage = |i: usize| median(stage_times[i].clone());
    let (h2d_ns, k_ns, d2h_ns) = (stage(0), stage(1), stage(2));
    let total = h2d_ns + k_ns + d2h_ns;
    let bound = total / h2d_ns.max(k_ns).max(d2h_ns).max(total / cores as f64);
    let serial_ms = median(serial_ms);
    let pipelined_ms = median(pipe_ms);
    let speedup = serial_ms / pipelined_ms;
    let bytes = (cfg.tiles * n * 4) as f64;
    Ok(DemoReport {
        verified,
        tiles: cfg.tiles,
        tile_bytes: n * 4,
        kernel_iters: iters,
        cores,
        serial_ms,
        pipelined_ms,
        speedup,
        h2d_us: h2d_ns / 1e3,
        kernel_us: k_ns / 1e3,
        d2h_us: d2h_ns / 1e3,
        bound_speedup: bound,
        fraction_of_bound: speedup / bound,
        serial_gbps: bytes / (serial_ms * 1e6),
        pipelined_gbps: bytes / (pipelined_ms * 1e6),
    })
}

impl DemoReport {
    /// The human-readable summary.
    pub fn print(&self) {
        println!("hetero demo: 3-stage pipeline (H2D -> kernel -> D2H)");
        println!(
            "  {} tiles of {} KiB, kernel {} iterations/element, {} compute units",
            self.tiles,
            self.tile_bytes / 1024,
            self.kernel_iters,
            self.cores
        );
        println!(
            "  stage times per tile (serial run): h2d {:.1} us, kernel {:.1} us, d2h {:.1} us",
            self.h2d_us, self.kernel_us, self.d2h_us
        );
        println!(
            "  serial    (1 stream):  {:8.2} ms  {:6.2} GB/s",
            self.serial_ms, self.serial_gbps
        );
        println!(
            "  pipelined (3 streams): {:8.2} ms  {:6.2} GB/s",
            self.pipelined_ms, self.pipelined_gbps
        );
        println!(
            "  speedup {:.2}x, ideal bound {:.2}x, reached {:.0}% of the bound",
            self.speedup,
            self.bound_speedup,
            self.fraction_of_bound * 100.0
        );
        println!(
            "  check against the CPU reference: {}",
            if self.verified { "PASSED" } else { "FAILED" }
        );
    }
}
