//! The emulated device's side of the demo: the per-tile stage times its models
//! give (H2D, kernel, D2H and the link's both-ways period), and the clock a run
//! is timed by (the wall clock on the host, the device clock or device events on
//! an emulated device).

use super::report::StageModel;
use crate::device::{EMU_FLOPS_PER_UNIT, EMU_KERNEL_LAUNCH_NS};
use hetero::{Device, EmuConfig, Event, KernelCost, LinkPreset, Result, Stream};
use std::time::{Duration, Instant};

/// The emulated device's models for one tile, ns.
pub(super) struct EmuModel {
    pub(super) h2d: f64,
    pub(super) kernel: f64,
    pub(super) d2h: f64,
    pub(super) link_period: f64,
    pub(super) cost: KernelCost,
}

impl EmuModel {
    pub(super) fn new(emu: &EmuConfig, tile_bytes: usize) -> Self {
        let link = emu.link();
        let h2d = link.transfer_ns(tile_bytes as u64, false);
        let d2h = link.transfer_ns(tile_bytes as u64, true);
        // One compute unit (a one-block grid) runs it for
        // max(flops / rate, bytes / memory bandwidth) + the launch: size the
        // flops so that equals the H2D. Bytes: the tile read and written.
        let bytes = 2.0 * tile_bytes as f64;
        let flops = (h2d - EMU_KERNEL_LAUNCH_NS).max(0.0) * 1e-9 * EMU_FLOPS_PER_UNIT;
        let kernel =
            (flops / EMU_FLOPS_PER_UNIT * 1e9).max(bytes / link.memory_gbps) + EMU_KERNEL_LAUNCH_NS;
        EmuModel {
            h2d,
            kernel,
            d2h,
            link_period: link_period_ns(link, tile_bytes as u64),
            cost: KernelCost { flops, bytes },
        }
    }

    pub(super) fn stages(&self) -> StageModel {
        StageModel {
            h2d_us: self.h2d / 1e3,
            kernel_us: self.kernel / 1e3,
            d2h_us: self.d2h / 1e3,
            link_period_us: self.link_period / 1e3,
            kernel_flops: self.cost.flops,
            kernel_bytes: self.cost.bytes,
        }
    }
}

/// The shortest period in which the link moves one tile of `bytes` each way,
/// as the emulated device models it: each direction's copy engine spends its
/// setup, then its data phase; while both directions carry data each runs at its
/// both-at-once rate, otherwise at its own. With `o` ns of both-at-once, the
/// period is at least each engine's busy time and at least the time the wire
/// is busy (overlap plus each direction alone); minimised over `o`. On
/// pcie4x16 the both-at-once rates (13.5 + 14.0 GB/s) carry little more than one
/// direction alone (25 GB/s), so this period, not one copy, limits a pipeline.
pub fn link_period_ns(link: &LinkPreset, bytes: u64) -> f64 {
    let setup = link.setup_ns as f64;
    let h = link.transfer_ns(bytes, false) - setup; // data phase alone
    let d = link.transfer_ns(bytes, true) - setup;
    let (rh, rd) = (
        link.bidir_h2d_gbps / link.h2d_gbps,
        link.bidir_d2h_gbps / link.d2h_gbps,
    );
    let o_max = (h / rh).min(d / rd);
    let period = |o: f64| {
        let (ha, da) = ((h - rh * o).max(0.0), (d - rd * o).max(0.0));
        (setup + o + ha).max(setup + o + da).max(o + ha + da)
    };
    // A maximum of linear functions: convex, so a fine sampling finds the minimum.
    (0..=1000)
        .map(|i| period(o_max * f64::from(i) / 1000.0))
        .fold(f64::INFINITY, f64::min)
}

/// A run's time on the demo's clock, and on the wall clock.
pub(super) type Times = (Duration, Duration);

/// Where the demo reads time: the wall clock on the host; the device clock on an
/// emulated device (virtual ns in virtual time), with the wall clock beside it.
/// In real time a run is timed by events recorded on the device before its
/// first op and after each stream's last (as `cudaEventElapsedTime` times GPU
/// work): the device clock read after `synchronize` would add the host's own
/// wake-up from its wait (~100 µs here once it parks) to the device's time.
#[derive(Clone, Copy)]
pub(super) struct Clock<'a> {
    device: Option<&'a Device>,
    events: bool,
}

pub(super) struct Mark {
    wall: Instant,
    device: u64,
    /// In real time: recorded before the run's first op.
    start: Option<Event>,
}

impl<'a> Clock<'a> {
    pub(super) fn wall() -> Self {
        Clock {
            device: None,
            events: false,
        }
    }

    pub(super) fn device(dev: &'a Device, real_time: bool) -> Self {
        Clock {
            device: Some(dev),
            events: real_time,
        }
    }

    /// Marks the start of a run whose first op goes to `first`.
    pub(super) fn mark(&self, first: &Stream) -> Result<Mark> {
        Ok(Mark {
            wall: Instant::now(),
            device: self.device.map_or(0, Device::now_ns),
            start: if self.events {
                Some(first.record_event()?)
            } else {
                None
            },
        })
    }

    /// Events after the last op of each of `streams` (real time), before the
    /// caller synchronizes them.
    pub(super) fn ends(&self, streams: &[&Stream]) -> Result<Vec<Event>> {
        if !self.events {
            return Ok(Vec::new());
        }
        streams.iter().map(|s| s.record_event()).collect()
    }

    /// Time since `m` on the demo's clock (to the last of `ends`, once they
    /// completed), and on the wall clock.
    pub(super) fn since(&self, m: &Mark, ends: &[Event]) -> Result<Times> {
        let wall = m.wall.elapsed();
        Ok(match (self.device, &m.start) {
            (None, _) => (wall, wall),
            (Some(_), Some(start)) => {
                let mut ms = 0.0f64;
                for end in ends {
                    ms = ms.max(start.elapsed_ms(end)?);
                }
                (Duration::from_secs_f64(ms / 1e3), wall)
            }
            (Some(d), None) => (
                Duration::from_nanos(d.now_ns().saturating_sub(m.device)),
                wall,
            ),
        })
    }
}
