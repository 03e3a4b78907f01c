//! The demo's parameters ([`DemoConfig`]) and what it measured ([`DemoReport`],
//! with the peer's and the models' parts), serialized for `--json` and printed
//! as the human-readable summary.

use super::kernel::PASS;
use crate::device::DeviceSpec;
use serde::Serialize;

/// The demo's tile size on `spec`'s device: 256 KiB, except 4 KiB on an
/// emulated device in real time. There the emulator's driver thread moves every
/// byte itself at host memory speed (one core copies 13–16 GB/s from cache
/// here, less than pcie4x16's modelled 25 GB/s), so large tiles measure the
/// host's memcpy, not the modelled device; a 4 KiB tile's stages are mostly
/// the link's 4 µs setup, during which the host has nothing to copy, so the
/// emulator keeps pace with the models it is measured against.
pub fn default_tile_bytes(spec: &DeviceSpec) -> usize {
    match spec {
        DeviceSpec::Emu(emu) if emu.time_mode() == hetero::TimeMode::Real => 4 * 1024,
        _ => DemoConfig::default().tile_bytes,
    }
}

/// Demo parameters.
#[derive(Debug, Clone, Copy)]
pub struct DemoConfig {
    pub tiles: usize,
    pub tile_bytes: usize,
    /// Timed repetitions of each mode; the median is reported.
    pub reps: usize,
    /// Kernel work per tile in eighths of a pass over it ([`PASS`]); `None`
    /// calibrates it on the host (see `calibrate`).
    pub work: Option<u32>,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            tiles: 64,
            tile_bytes: 256 * 1024,
            reps: 7,
            work: None,
        }
    }
}

/// What the demo measured.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    pub verified: bool,
    pub tiles: usize,
    pub tile_bytes: usize,
    /// Kernel work per tile, in eighths of a pass ([`PASS`]).
    pub kernel_work: u32,
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
    /// `host` or `emu:PRESET`.
    pub device: String,
    /// The clock the times are in: `wall` (host), `real` or `virtual` (emu).
    pub time: String,
    /// The emulated device's digest of everything it ran (virtual time only), hex.
    pub trace_hash: Option<String>,
    /// Emulated device: the per-tile stage times its models give (µs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<StageModel>,
    /// Emulated device: the bound with the link's duplex share.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_bound_speedup: Option<f64>,
    /// Emulated device: the wall-clock time of the serial and pipelined runs (ms),
    /// beside the device clock's `serial_ms` and `pipelined_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial_wall_ms: Option<f64>,
    /// Emulated device: the serial run's time on the models (tiles × the three
    /// modelled stages, ms), and the pipelined run's speedup over it. In real
    /// time a serial run the host delayed makes `speedup` look better; this one
    /// it cannot flatter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial_model_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speedup_over_model_serial: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipelined_wall_ms: Option<f64>,
    /// Host: the same work on a hand-written pair of spinning threads
    /// ([`spin_pair`](super::spin_pair)), run after hetero's reps in the same process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spin_pair: Option<PeerRun>,
}

/// A peer's medians over the demo's reps.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PeerRun {
    pub serial_ms: f64,
    pub pipelined_ms: f64,
    pub speedup: f64,
    /// Its last pipelined run matched the CPU reference.
    pub verified: bool,
}

/// An emulated device's per-tile stage times from its models, µs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct StageModel {
    pub h2d_us: f64,
    pub kernel_us: f64,
    pub d2h_us: f64,
    /// The shortest tile period the link allows with one tile each way per
    /// period (`link_period_ns`).
    pub link_period_us: f64,
    /// The kernel's declared cost.
    pub kernel_flops: f64,
    pub kernel_bytes: f64,
}

impl DemoReport {
    /// The human-readable summary.
    pub fn print(&self) {
        println!("hetero demo: 3-stage pipeline (H2D -> kernel -> D2H)");
        if self.device != "host" {
            println!(
                "  device {}, {} time (times on the device clock)",
                self.device, self.time
            );
        }
        println!(
            "  {} tiles of {} KiB, kernel {} passes/element, {} compute units",
            self.tiles,
            self.tile_bytes / 1024,
            f64::from(self.kernel_work) / f64::from(PASS),
            self.cores
        );
        println!(
            "  stage times per tile (serial run): h2d {:.1} us, kernel {:.1} us, d2h {:.1} us",
            self.h2d_us, self.kernel_us, self.d2h_us
        );
        if let Some(m) = &self.model {
            println!(
                "  stage times per tile (models):     h2d {:.1} us, kernel {:.1} us, d2h {:.1} us; \
                 link period both ways {:.1} us",
                m.h2d_us, m.kernel_us, m.d2h_us, m.link_period_us
            );
        }
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
        if let Some(p) = &self.spin_pair {
            println!(
                "  peer, same work and memory: a hand-written pair of threads (copies on one, \
                 kernels on the other, tiles handed over by spinning)"
            );
            println!(
                "        serial {:.2} ms, pipelined {:.2} ms, speedup {:.2}x{}; hetero's \
                 pipelined run takes {:.2}x its time",
                p.serial_ms,
                p.pipelined_ms,
                p.speedup,
                if p.verified {
                    ""
                } else {
                    " (its output FAILED the check)"
                },
                self.pipelined_ms / p.pipelined_ms
            );
        }
        if let Some(l) = self.link_bound_speedup {
            println!(
                "  bound with the link's duplex share {:.2}x, reached {:.0}% of it",
                l,
                self.speedup / l * 100.0
            );
        }
        if let (Some(s), Some(x)) = (self.serial_model_ms, self.speedup_over_model_serial) {
            println!(
                "  serial on the models {s:.2} ms: pipelined {x:.2}x faster, {:.0}% of the bound",
                x / self.bound_speedup * 100.0
            );
        }
        if let (Some(s), Some(p)) = (self.serial_wall_ms, self.pipelined_wall_ms) {
            println!("  wall clock: serial {s:.2} ms, pipelined {p:.2} ms");
        }
        if let Some(h) = &self.trace_hash {
            println!("  trace hash {h}");
        }
        println!(
            "  check against the CPU reference: {}",
            if self.verified { "PASSED" } else { "FAILED" }
        );
    }
}
