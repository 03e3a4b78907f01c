//! The device a command runs on, from `--device host|emu[:PRESET][,time=…]` and
//! `--time real|virtual`. The CLI sets the emulated device's compute rate itself
//! (`EMU_FLOPS_PER_UNIT`), so the demo can size declared kernel costs from it.

use hetero::{BackendKind, Device, DeviceConfig, EmuConfig, TimeMode};

/// Floating-point rate of one emulated compute unit the CLI gives its devices,
/// FLOP/s (`EmuConfig::flops_per_unit`).
pub const EMU_FLOPS_PER_UNIT: f64 = 100e9;

/// Fixed cost of a kernel launch on the emulated device, ns (the model's
/// `KERNEL_LAUNCH_NS` in `hetero`'s `backend/emu/engine/mod.rs`, which the library does
/// not export; the demo checks it against the kernel time its events measure).
pub const EMU_KERNEL_LAUNCH_NS: f64 = 2_000.0;

/// Where a command runs.
#[derive(Debug, Clone)]
pub enum DeviceSpec {
    /// The CPU itself, configured as [`device_config`].
    Host,
    /// An emulated accelerator.
    Emu(EmuConfig),
    /// A Vulkan device (its index among those `hetero info` lists).
    Vulkan(usize),
}

impl DeviceSpec {
    /// Parses `--device` (`host`, `emu`, `emu:PRESET`, optionally with the
    /// `HETERO_BACKEND` options `,time=…,capacity=…`) and `--time`.
    pub fn parse(device: &str, time: Option<&str>) -> Result<DeviceSpec, String> {
        let kind = BackendKind::parse(device).map_err(|e| e.to_string())?;
        match kind {
            BackendKind::Host => match time {
                None => Ok(DeviceSpec::Host),
                Some(t) => Err(format!(
                    "--time {t} applies to an emulated device; the host device runs on the \
                     wall clock (use --device emu[:PRESET] --time {t})"
                )),
            },
            BackendKind::Vulkan { index, .. } => match time {
                None => Ok(DeviceSpec::Vulkan(index)),
                Some(t) => Err(format!(
                    "--time {t} applies to an emulated device; a Vulkan device runs on its own clock"
                )),
            },
            BackendKind::Emu(emu) => {
                let emu = match time {
                    None => emu,
                    Some("real") => emu.time(TimeMode::Real),
                    Some("virtual") => emu.time(TimeMode::Virtual),
                    Some(t) => {
                        return Err(format!("--time '{t}' is not valid; use real or virtual"))
                    }
                };
                Ok(DeviceSpec::Emu(emu.flops_per_unit(EMU_FLOPS_PER_UNIT)))
            }
        }
    }

    /// Parses a list of devices, `SPEC,SPEC,…` (each as `--device` takes it;
    /// an option such as `time=real` after a spec belongs to that spec:
    /// `emu:pcie4x16,time=real,emu:pcie4x16`).
    pub fn parse_list(list: &str) -> Result<Vec<DeviceSpec>, String> {
        let mut specs: Vec<String> = Vec::new();
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match specs.last_mut() {
                Some(last) if part.contains('=') => {
                    last.push(',');
                    last.push_str(part);
                }
                _ if part.contains('=') => {
                    return Err(format!(
                        "--devices: option {part:?} comes before any device; write it after \
                         the device it is for (emu:pcie4x16,time=real)"
                    ))
                }
                _ => specs.push(part.to_string()),
            }
        }
        if specs.is_empty() {
            return Err("--devices: no devices; list them, e.g. emu:pcie4x16,emu:pcie4x16".into());
        }
        specs.iter().map(|s| DeviceSpec::parse(s, None)).collect()
    }

    /// The device's configuration: the demo's host configuration, on this backend.
    pub fn config(&self) -> DeviceConfig {
        let base = device_config();
        match self {
            DeviceSpec::Host => base,
            DeviceSpec::Emu(emu) => base.emu(emu.clone()),
            DeviceSpec::Vulkan(index) => base.vulkan(*index),
        }
    }

    /// Creates the device.
    pub fn open(&self) -> hetero::Result<Device> {
        Device::new(self.config())
    }

    /// `host` or `emu:PRESET`.
    pub fn name(&self) -> String {
        match self {
            DeviceSpec::Host => "host".into(),
            DeviceSpec::Emu(emu) => format!("emu:{}", emu.link().name),
            DeviceSpec::Vulkan(index) => format!("vulkan:{index}"),
        }
    }

    /// The clock the figures are in: `wall` (host), `real` or `virtual` (emu).
    pub fn time(&self) -> &'static str {
        match self {
            DeviceSpec::Host | DeviceSpec::Vulkan(_) => "wall",
            DeviceSpec::Emu(emu) => match emu.time_mode() {
                TimeMode::Real => "real",
                TimeMode::Virtual => "virtual",
            },
        }
    }
}

/// The device the demo runs on: a host device with the default configuration.
/// (Parking the host thread and letting idle engines poll with yields raised the
/// printed speedup to ~1.6 here, but only by slowing the serial run by ~50 %;
/// the pipelined run got slower too, so the defaults stay.)
pub fn device_config() -> DeviceConfig {
    DeviceConfig::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices_and_times() {
        assert!(matches!(
            DeviceSpec::parse("host", None),
            Ok(DeviceSpec::Host)
        ));
        let d = DeviceSpec::parse("emu:pcie3x16", Some("real")).expect("emu");
        assert_eq!((d.name().as_str(), d.time()), ("emu:pcie3x16", "real"));
        let d = DeviceSpec::parse("emu", None).expect("emu");
        assert_eq!((d.name().as_str(), d.time()), ("emu:pcie4x16", "virtual"));
        assert!(DeviceSpec::parse("host", Some("real")).is_err());
        assert!(DeviceSpec::parse("emu", Some("fast")).is_err());
        let l = DeviceSpec::parse_list("emu:pcie4x16,time=real,emu,host").expect("list");
        let names: Vec<_> = l.iter().map(|d| (d.name(), d.time())).collect();
        assert_eq!(
            names,
            [
                ("emu:pcie4x16".to_string(), "real"),
                ("emu:pcie4x16".to_string(), "virtual"),
                ("host".to_string(), "wall")
            ]
        );
        assert!(DeviceSpec::parse_list("time=real,emu").is_err());
        assert!(DeviceSpec::parse_list("").is_err());
        assert!(DeviceSpec::parse("emu:nope", None)
            .unwrap_err()
            .contains("pcie4x16"));
    }
}
