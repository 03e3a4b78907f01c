//! Configuration of the emulated device: link, time mode, memory, compute.

use super::link::LinkPreset;

/// How the emulated device's clock runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeMode {
    /// Wall clock: an operation completes no earlier than its modelled time; the
    /// device's driver thread sleeps until then (it burns no core).
    Real,
    /// A discrete-event simulation: the clock jumps to the next completion,
    /// every duration comes from the models, and host waits drive the
    /// simulation. The same program and configuration give the same trace
    /// (`Device::trace_hash`).
    Virtual,
}

/// An emulated discrete accelerator: its own memory of fixed capacity, DMA copy
/// engines over a modelled link, compute units with rates.
///
/// ```
/// use hetero::{Device, DeviceConfig, EmuConfig, LinkPreset, TimeMode};
/// let emu = EmuConfig::new(LinkPreset::pcie4x16()).time(TimeMode::Virtual);
/// let dev = Device::new(DeviceConfig::default().emu(emu)).unwrap();
/// assert_eq!(dev.properties().backend, "emu");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct EmuConfig {
    pub(crate) link: LinkPreset,
    pub(crate) time: TimeMode,
    pub(crate) capacity: usize,
    pub(crate) flops_per_unit: f64,
}

impl EmuConfig {
    /// A device behind `link`, in virtual time, with 16 GiB of memory and
    /// 100 GFLOP/s per compute unit.
    pub fn new(link: LinkPreset) -> Self {
        EmuConfig {
            link,
            time: TimeMode::Virtual,
            capacity: 16 << 30,
            flops_per_unit: 100e9,
        }
    }

    /// Real or virtual time.
    pub fn time(mut self, time: TimeMode) -> Self {
        self.time = time;
        self
    }

    /// Device memory capacity in bytes (reserved address space; pages are backed
    /// as they are used).
    pub fn capacity(mut self, bytes: usize) -> Self {
        self.capacity = bytes;
        self
    }

    /// Floating-point rate of one compute unit, FLOP/s.
    pub fn flops_per_unit(mut self, flops: f64) -> Self {
        self.flops_per_unit = flops;
        self
    }

    /// The link.
    pub fn link(&self) -> &LinkPreset {
        &self.link
    }

    /// The time mode.
    pub fn time_mode(&self) -> TimeMode {
        self.time
    }

    /// Parses `emu`, `emu:PRESET`, optionally followed by `,time=real|virtual`
    /// and `,capacity=BYTES` (the `HETERO_BACKEND` syntax after `emu`).
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut parts = spec.split(',');
        let head = parts.next().unwrap_or("");
        let preset = match head.strip_prefix("emu") {
            Some("") => "pcie4x16",
            Some(rest) => rest.strip_prefix(':').ok_or_else(|| bad_spec(spec))?,
            None => return Err(bad_spec(spec)),
        };
        let link = LinkPreset::by_name(preset).ok_or_else(|| {
            format!(
                "unknown emu preset '{preset}'; presets: {}",
                LinkPreset::names().join(", ")
            )
        })?;
        let mut cfg = EmuConfig::new(link);
        for p in parts {
            match p.split_once('=') {
                Some(("time", "real")) => cfg.time = TimeMode::Real,
                Some(("time", "virtual")) => cfg.time = TimeMode::Virtual,
                Some(("capacity", n)) => {
                    cfg.capacity = n
                        .parse()
                        .map_err(|_| format!("capacity '{n}' is not a byte count"))?
                }
                _ => {
                    return Err(format!(
                        "unknown emu option '{p}'; use time=real|virtual or capacity=BYTES"
                    ))
                }
            }
        }
        Ok(cfg)
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.capacity < (1 << 20) {
            return Err(format!(
                "emu capacity is {} bytes; give it at least 1 MiB",
                self.capacity
            ));
        }
        if !self.flops_per_unit.is_finite() || self.flops_per_unit <= 0.0 {
            return Err(format!(
                "emu flops_per_unit is {}; use a positive rate",
                self.flops_per_unit
            ));
        }
        Ok(())
    }
}

fn bad_spec(spec: &str) -> String {
    format!(
        "backend '{spec}' is not valid; use host, emu or emu:PRESET (presets: {})",
        LinkPreset::names().join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_backend_specs() {
        let c = EmuConfig::parse("emu").expect("emu");
        assert_eq!(c.link.name, "pcie4x16");
        let c = EmuConfig::parse("emu:pcie3x16,time=real,capacity=1048576").expect("full");
        assert_eq!(
            (c.link.name, c.time, c.capacity),
            ("pcie3x16", TimeMode::Real, 1 << 20)
        );
        assert!(EmuConfig::parse("emu:nope")
            .unwrap_err()
            .contains("pcie4x16"));
        assert!(EmuConfig::parse("emu,speed=9").is_err());
        assert!(EmuConfig::parse("emux").is_err());
    }
}
