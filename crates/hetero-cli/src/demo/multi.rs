//! `hetero demo --devices N`: the pipelined run with its tiles split over N
//! emulated devices of one context (contiguous shares, as even as the count
//! allows), each device running the three-stage pipeline on its share on its
//! own link, copy engines and compute units, against the same tiles on one of
//! those devices. The bound is the tiles over the largest share: nothing but
//! the split limits it (each device has its own link to the host in the
//! model; the host's memory bandwidth is not modelled). Times are each
//! device's own clock between an event before its work and the last of its
//! stages' end events (in virtual time the devices of a context share one
//! clock); the longest device is the run's time.

use super::pipeline::{
    clear_outputs, demo_kernel, median, stage_streams, submit_pipelined, verify, Buffers,
};
use super::report::DemoConfig;
use crate::device::DeviceSpec;
use hetero::{Context, Device, Error, Event, Kernel, Result, Stream};
use serde::Serialize;

/// What `demo --devices N` measured.
#[derive(Debug, Clone, Serialize)]
pub struct MultiReport {
    pub verified: bool,
    pub devices: usize,
    pub device: String,
    pub time: String,
    pub tiles: usize,
    pub tile_bytes: usize,
    /// Tiles per device.
    pub shares: Vec<usize>,
    /// The pipelined run of every tile on one device, ms (median).
    pub one_device_ms: f64,
    /// The same tiles split over the devices, ms (median).
    pub devices_ms: f64,
    pub speedup: f64,
    /// Tiles over the largest share.
    pub bound_speedup: f64,
    pub fraction_of_bound: f64,
    /// Per device, in virtual time.
    pub trace_hashes: Option<Vec<String>>,
}

impl MultiReport {
    pub fn print(&self) {
        println!(
            "hetero demo --devices {}: 3-stage pipeline over {} {} devices ({} time)",
            self.devices, self.devices, self.device, self.time
        );
        println!(
            "  {} tiles of {} KiB, split {:?}",
            self.tiles,
            self.tile_bytes / 1024,
            self.shares
        );
        println!("  one device    {:>10.3} ms", self.one_device_ms);
        println!(
            "  {} devices     {:>10.3} ms   speedup {:.2}x",
            self.devices, self.devices_ms, self.speedup
        );
        println!(
            "  bound         {:.2}x (tiles / largest share: each device has its own link, copy \
             engines and compute units; host memory bandwidth is not modelled); {:.0} % of it",
            self.bound_speedup,
            self.fraction_of_bound * 100.0
        );
        println!(
            "  output        {}",
            if self.verified {
                "verified against the CPU reference"
            } else {
                "WRONG"
            }
        );
    }
}

/// One device's part: its buffers, streams and kernel.
struct Part {
    dev: Device,
    b: Buffers,
    streams: [Stream; 3],
    k: Kernel,
    work: u32,
}

impl Part {
    fn new(
        dev: &Device,
        spec: &DeviceSpec,
        tiles: usize,
        n: usize,
        cfg: DemoConfig,
    ) -> Result<Part> {
        let mut b = Buffers::new(dev, tiles, n)?;
        let streams = stage_streams(dev)?;
        let (k, work, _, _) = demo_kernel(dev, spec, &mut b, cfg)?;
        Ok(Part {
            dev: dev.clone(),
            b,
            streams,
            k,
            work,
        })
    }
}

/// Submits every part's pipelined run, then waits for all: the run's time
/// (ms, the longest part) and whether every output matched.
fn run_parts(parts: &mut [Part]) -> Result<(f64, bool)> {
    for p in parts.iter_mut() {
        clear_outputs(&p.streams[0], &mut p.b)?;
    }
    let mut marks: Vec<(Event, Vec<Event>)> = Vec::new();
    for p in parts.iter_mut() {
        let start = p.streams[0].record_event()?;
        for s in &p.streams[1..] {
            s.wait_event(&start)?;
        }
        submit_pipelined(&p.streams, &mut p.b, &p.k)?;
        let ends = p
            .streams
            .iter()
            .map(Stream::record_event)
            .collect::<Result<Vec<_>>>()?;
        marks.push((start, ends));
    }
    let mut longest: f64 = 0.0;
    let mut verified = true;
    for (p, (start, ends)) in parts.iter().zip(&marks) {
        for s in &p.streams {
            s.synchronize()?;
        }
        for e in ends {
            longest = longest.max(start.elapsed_ms(e)?);
        }
        verified &= verify(&p.b, p.work)?;
    }
    Ok((longest, verified))
}

/// Runs the demo's pipelined run on one device of `spec` and split over
/// `devices` such devices of one context.
pub fn run_multi(
    spec: &DeviceSpec,
    devices: usize,
    cfg: DemoConfig,
    mut progress: impl FnMut(&str),
) -> Result<MultiReport> {
    if !matches!(spec, DeviceSpec::Emu(_)) {
        return Err(Error::InvalidArgument(
            "demo --devices N splits the tiles over N emulated devices: use --device \
             emu[:PRESET] (host devices of one process share its cores, and Vulkan devices \
             are reached only through the host, so their split would measure the host's copies)"
                .into(),
        ));
    }
    if devices < 1 || devices > cfg.tiles {
        return Err(Error::InvalidArgument(format!(
            "demo --devices {devices}: give between 1 and the number of tiles ({})",
            cfg.tiles
        )));
    }
    let n = (cfg.tile_bytes / 4).max(1);
    let devs = (0..devices)
        .map(|_| spec.open())
        .collect::<Result<Vec<_>>>()?;
    let _ctx = Context::new(&devs)?;
    let shares: Vec<usize> = (0..devices)
        .map(|i| (i + 1) * cfg.tiles / devices - i * cfg.tiles / devices)
        .collect();
    progress("preparing");
    let mut one = vec![Part::new(&devs[0], spec, cfg.tiles, n, cfg)?];
    let mut split = devs
        .iter()
        .zip(&shares)
        .map(|(d, &t)| Part::new(d, spec, t, n, cfg))
        .collect::<Result<Vec<_>>>()?;
    // A warm-up of each, then the reps taking turns.
    run_parts(&mut one)?;
    run_parts(&mut split)?;
    let (mut t1, mut tn, mut verified) = (Vec::new(), Vec::new(), true);
    let reps = cfg.reps.max(1);
    for r in 0..reps {
        progress(&format!("run {}/{reps}", r + 1));
        let (t, v) = run_parts(&mut one)?;
        t1.push(t);
        verified &= v;
        let (t, v) = run_parts(&mut split)?;
        tn.push(t);
        verified &= v;
    }
    let (one_device_ms, devices_ms) = (median(t1), median(tn));
    let speedup = one_device_ms / devices_ms;
    let bound = cfg.tiles as f64 / shares.iter().copied().max().unwrap_or(1) as f64;
    let hashes: Option<Vec<String>> = split
        .iter()
        .map(|p| p.dev.trace_hash().map(|h| format!("{h:016x}")))
        .collect();
    Ok(MultiReport {
        verified,
        devices,
        device: spec.name(),
        time: spec.time().into(),
        tiles: cfg.tiles,
        tile_bytes: n * 4,
        shares,
        one_device_ms,
        devices_ms,
        speedup,
        bound_speedup: bound,
        fraction_of_bound: speedup / bound,
        trace_hashes: hashes,
    })
}
