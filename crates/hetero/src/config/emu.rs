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

/// What an emulated device's compute units are like, for kernels that
/// declare a cost per class ([`Kernel::cost_on`](crate::Kernel::cost_on)):
/// the same launch may cost a CPU's cores and an accelerator's units
/// differently (a panel factorization runs near a CPU's peak and far from
/// a GPU's; a matrix product the other way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ComputeClass {
    /// A discrete accelerator's units (the default).
    #[default]
    Accelerator,
    /// A CPU's cores.
    Cpu,
}

impl ComputeClass {
    /// `"accelerator"` or `"cpu"`.
    pub fn name(self) -> &'static str {
        match self {
            ComputeClass::Accelerator => "accelerator",
            ComputeClass::Cpu => "cpu",
        }
    }
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
    pub(crate) class: ComputeClass,
    pub(crate) inline_copy_max: usize,
    pub(crate) iotlb_entries: usize,
    pub(crate) iotlb_miss_ns: u64,
    pub(crate) iommu_page_max: usize,
}

/// Default I/O TLB size: 64 entries, the reach pcie-bench (Neugebauer et al.,
/// SIGCOMM 2018) measured on Intel Xeon IOMMUs (throughput drops past a
/// 256 KiB window of 4 KiB pages).
pub const DEFAULT_IOTLB_ENTRIES: usize = 64;
/// Default stall per I/O TLB miss, ns: a page walk is about four dependent
/// memory reads (≈ 320 ns), and a DMA engine keeps several translations in
/// flight ahead of its data, so a miss stalls the stream of bytes by about an
/// eighth of a walk.
pub const DEFAULT_IOTLB_MISS_NS: u64 = 40;
/// The largest emulated memory: its address space is reserved up front (a
/// reservation holds at most 64 TiB).
const MAX_CAPACITY: usize = 1 << 46;
/// Default inline threshold: H2D copies of at most 2 KiB ride in the command.
pub const DEFAULT_INLINE_COPY_MAX: usize = 2048;

impl EmuConfig {
    /// A device behind `link`, in virtual time, with 16 GiB of memory and
    /// 100 GFLOP/s per compute unit.
    pub fn new(link: LinkPreset) -> Self {
        EmuConfig {
            link,
            time: TimeMode::Virtual,
            capacity: 16 << 30,
            flops_per_unit: 100e9,
            class: ComputeClass::Accelerator,
            inline_copy_max: DEFAULT_INLINE_COPY_MAX,
            iotlb_entries: DEFAULT_IOTLB_ENTRIES,
            iotlb_miss_ns: DEFAULT_IOTLB_MISS_NS,
            iommu_page_max: 1 << 30,
        }
    }

    /// H2D copies of at most `bytes` from pinned memory no queued op writes take
    /// the inline path: the payload is read at submit and written into the
    /// command (no DMA setup). 0 turns it off; default
    /// [`DEFAULT_INLINE_COPY_MAX`].
    pub fn inline_copy_max(mut self, bytes: usize) -> Self {
        self.inline_copy_max = bytes;
        self
    }

    /// I/O TLB entries (default [`DEFAULT_IOTLB_ENTRIES`]).
    pub fn iotlb_entries(mut self, entries: usize) -> Self {
        self.iotlb_entries = entries;
        self
    }

    /// Stall per I/O TLB miss, ns (default [`DEFAULT_IOTLB_MISS_NS`]).
    pub fn iotlb_miss_ns(mut self, ns: u64) -> Self {
        self.iotlb_miss_ns = ns;
        self
    }

    /// The largest IOMMU page the device maps host memory with (4096 maps
    /// everything with 4 KiB pages, as an IOMMU without superpages does;
    /// default 1 GiB: each chunk's own page size).
    pub fn iommu_page_max(mut self, bytes: usize) -> Self {
        self.iommu_page_max = bytes;
        self
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

    /// What its compute units are like (default
    /// [`ComputeClass::Accelerator`]): a kernel's launch costs what the
    /// kernel declares for this class ([`Kernel::cost_on`](crate::Kernel::cost_on)),
    /// else its one cost.
    pub fn class(mut self, class: ComputeClass) -> Self {
        self.class = class;
        self
    }

    /// The class of its compute units.
    pub fn compute_class(&self) -> ComputeClass {
        self.class
    }

    /// The link.
    pub fn link(&self) -> &LinkPreset {
        &self.link
    }

    /// The time mode.
    pub fn time_mode(&self) -> TimeMode {
        self.time
    }

    /// Parses `emu`, `emu:PRESET`, optionally followed by `,time=real|virtual`,
    /// `,capacity=BYTES` and `,class=accelerator|cpu` (the `HETERO_BACKEND`
    /// syntax after `emu`).
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
                Some(("class", "accelerator")) => cfg.class = ComputeClass::Accelerator,
                Some(("class", "cpu")) => cfg.class = ComputeClass::Cpu,
                Some(("capacity", n)) => {
                    cfg.capacity = n
                        .parse()
                        .map_err(|_| format!("capacity '{n}' is not a byte count"))?
                }
                _ => {
                    return Err(format!(
                        "unknown emu option '{p}'; use time=real|virtual, capacity=BYTES or \
                         class=accelerator|cpu"
                    ))
                }
            }
        }
        Ok(cfg)
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.capacity < (1 << 20) || self.capacity > MAX_CAPACITY {
            return Err(format!(
                "emu capacity is {} bytes; give it from 1 MiB to 2^46 bytes (64 TiB: its \
                 address space is reserved up front)",
                self.capacity
            ));
        }
        if self.iotlb_entries == 0 || self.iotlb_entries > 1 << 20 {
            return Err(format!(
                "emu iotlb_entries is {}; give the I/O TLB 1 to 1048576 entries (its table is \
                 allocated whole; real ones hold hundreds to thousands)",
                self.iotlb_entries
            ));
        }
        if self.iotlb_miss_ns > 1_000_000 {
            // (A transfer's stall is its misses times this: past 1 ms a
            // miss, it could wrap the clock.)
            return Err(format!(
                "emu iotlb_miss_ns is {}; give at most 1000000 ns (1 ms; a real miss costs \
                 about 1 µs)",
                self.iotlb_miss_ns
            ));
        }
        if !self.iommu_page_max.is_power_of_two()
            || !(4096..=1 << 30).contains(&self.iommu_page_max)
        {
            return Err(format!(
                "emu iommu_page_max is {}; use a power of two from 4096 to 1 GiB",
                self.iommu_page_max
            ));
        }
        self.link.validate()?;
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
