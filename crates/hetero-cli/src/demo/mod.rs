//! The demo workload: a 3-stage pipeline (H2D → kernel → D2H) over many tiles, run
//! once on one stream (serial) and once on three streams joined by events.
//!
//! Sizing: each tile's kernel is one block (one compute unit) and is calibrated to
//! take about twice one tile's copy (the mean of its H2D and D2H), so the stages map one-to-one onto engines as
//! on an accelerator. The ideal speedup follows from the stage times measured in the
//! serial run: `bound = (h2d + kernel + d2h) / max(h2d, kernel, d2h, (h2d + kernel + d2h) / cores)`.
//!
//! On an emulated device the stages are balanced by its models instead: the
//! kernel declares a cost (`Kernel::with_cost`) whose modelled time equals a
//! tile's modelled H2D, while its host work stays the same computation (so the
//! output is checked the same way). Times come from the device clock
//! (`Device::now_ns`), the bound from the models: three engines (H2D DMA, D2H
//! DMA, compute) give `bound = (h2d + kernel + d2h) / max(h2d, kernel, d2h)`, and
//! `link_bound` adds the link's duplex share (both directions at once run at
//! their both-at-once rates, see `link_period_ns`).
//!
//! Files: `report.rs` (the config and the report), `kernel.rs` (the scale
//! kernel and its CPU reference), `model.rs` (the emulated device's stage
//! models and the clock), `pipeline.rs` (the serial and pipelined runs),
//! `spin_pair.rs` (the host peer), `multi.rs` (`--devices N`: the tiles split
//! over N emulated devices of one context); this file runs the whole demo.

mod kernel;
mod model;
mod multi;
mod pipeline;
mod report;
pub mod spin_pair;

pub use kernel::{reference, scale_in_place, scale_into, EMU_KERNEL_WORK, PASS};
pub use model::link_period_ns;
pub use multi::{run_multi, MultiReport};
pub use pipeline::{pipeline, pipeline_on};
pub use report::{default_tile_bytes, DemoConfig, DemoReport, PeerRun, StageModel};

use crate::device::DeviceSpec;
use hetero::{Device, Result};
use model::EmuModel;
use pipeline::{
    clear_outputs, demo_kernel, median, run_pipelined, run_serial, run_spin_pair, settle,
    stage_streams, verify, Buffers,
};

/// Runs the demo on the host device `dev`.
pub fn run(dev: &Device, cfg: DemoConfig, progress: impl FnMut(&str)) -> Result<DemoReport> {
    run_on(dev, &DeviceSpec::Host, cfg, progress)
}

/// Runs the demo on `dev`, opened from `spec`.
pub fn run_on(
    dev: &Device,
    spec: &DeviceSpec,
    cfg: DemoConfig,
    mut progress: impl FnMut(&str),
) -> Result<DemoReport> {
    let n = (cfg.tile_bytes / 4).max(1);
    let cores = dev.properties().compute_units;
    let mut b = Buffers::new(dev, cfg.tiles, n)?;
    let serial = dev.create_stream()?;
    serial.set_name("serial");
    let streams = stage_streams(dev)?;
    // Host only: the settling time, the calibration and the peer.
    let host = matches!(spec, DeviceSpec::Host);
    if host {
        progress("settling");
        settle(&serial, &streams, &mut b)?;
    }
    progress("calibrating the kernel");
    let (k, work, clock, model) = demo_kernel(dev, spec, &mut b, cfg)?;

    // Warm up both modes once (page faults, caches), then measure.
    run_serial(clock, &serial, &mut b, &k, false)?;
    run_pipelined(clock, &streams, &mut b, &k)?;

    // The modes take turns, rep by rep: the machine's state drifts (on a shared
    // VM by tens of percent within a minute), and a drift between a block of
    // serial runs and a block of pipelined ones moved the speedup by as much.
    let reps = cfg.reps.max(1);
    let (mut serial_ms, mut serial_wall) = (Vec::new(), Vec::new());
    let mut stage_times: [Vec<f64>; 3] = Default::default();
    let mut verified = true;
    let (mut pipe_ms, mut pipe_wall) = (Vec::new(), Vec::new());
    for r in 0..reps {
        progress(&format!("serial run {}/{reps}", r + 1));
        clear_outputs(&serial, &mut b)?;
        let ((t, wall), _) = run_serial(clock, &serial, &mut b, &k, false)?;
        serial_ms.push(t.as_secs_f64() * 1e3);
        serial_wall.push(wall.as_secs_f64() * 1e3);
        verified &= verify(&b, work)?;
        // Stage times come from a separate run with events between stages, so the
        // markers do not slow the timed run.
        let (_, times) = run_serial(clock, &serial, &mut b, &k, true)?;
        for (all, t) in stage_times.iter_mut().zip(times) {
            all.extend(t);
        }
        progress(&format!("pipelined run {}/{reps}", r + 1));
        clear_outputs(&serial, &mut b)?;
        let (t, wall) = run_pipelined(clock, &streams, &mut b, &k)?;
        pipe_ms.push(t.as_secs_f64() * 1e3);
        pipe_wall.push(wall.as_secs_f64() * 1e3);
        verified &= verify(&b, work)?;
    }
    let spin_pair = if host {
        progress("the peer's runs");
        Some(run_spin_pair(dev, &b, work, reps)?)
    } else {
        None
    };
    let stage = |i: usize| median(stage_times[i].clone());
    let (h2d_ns, k_ns, d2h_ns) = (stage(0), stage(1), stage(2));
    let (bound, link_bound) = match &model {
        // Three engines of their own (H2D DMA, D2H DMA, compute), from the models.
        Some(m) => {
            let total = m.h2d + m.kernel + m.d2h;
            (
                total / m.h2d.max(m.kernel).max(m.d2h),
                Some(total / m.link_period.max(m.kernel)),
            )
        }
        None => {
            let total = h2d_ns + k_ns + d2h_ns;
            let bound = total / h2d_ns.max(k_ns).max(d2h_ns).max(total / cores as f64);
            (bound, None)
        }
    };
    let serial_ms = median(serial_ms);
    let pipelined_ms = median(pipe_ms);
    let serial_model_ms = model
        .as_ref()
        .map(|m| cfg.tiles as f64 * (m.h2d + m.kernel + m.d2h) / 1e6);
    let speedup = serial_ms / pipelined_ms;
    let bytes = (cfg.tiles * n * 4) as f64;
    let emu = model.is_some();
    Ok(DemoReport {
        verified,
        tiles: cfg.tiles,
        tile_bytes: n * 4,
        kernel_work: work,
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
        device: spec.name(),
        time: spec.time().into(),
        trace_hash: dev.trace_hash().map(|h| format!("{h:016x}")),
        model: model.as_ref().map(EmuModel::stages),
        link_bound_speedup: link_bound,
        serial_wall_ms: emu.then(|| median(serial_wall)),
        pipelined_wall_ms: emu.then(|| median(pipe_wall)),
        serial_model_ms,
        speedup_over_model_serial: serial_model_ms.map(|s| s / pipelined_ms),
        spin_pair,
    })
}
