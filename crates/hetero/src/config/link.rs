//! The link model of the emulated device: how long a DMA transfer takes.
//!
//! A transfer of `n` bytes in one direction costs a setup latency α, then its
//! bytes on the wire at the direction's raw rate. On the wire every `max_payload`
//! bytes carry a packet header, so small transfers pay proportionally more, and the
//! effective rate of a large one tends to `payload / (payload + header)` of the raw
//! rate: the presets give that effective (published, measured) rate and the model
//! derives the raw rate from it. While both directions carry data, each runs at its
//! *both-at-once* rate instead (the duplex share: on real PCIe, credits, the root
//! complex and DRAM are shared). Transfers in the same direction share its rate
//! equally.

/// A link between host and an emulated device, with its published figures.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkPreset {
    /// The preset's name (`pcie4x16`, …).
    pub name: &'static str,
    /// Per-transfer setup latency, ns (the copy call, the DMA descriptor, the
    /// completion).
    pub setup_ns: u64,
    /// Effective host-to-device bandwidth of a large transfer alone, GB/s (1e9 B/s).
    pub h2d_gbps: f64,
    /// Effective device-to-host bandwidth of a large transfer alone, GB/s.
    pub d2h_gbps: f64,
    /// Host-to-device bandwidth while device-to-host data flows too, GB/s.
    pub bidir_h2d_gbps: f64,
    /// Device-to-host bandwidth while host-to-device data flows too, GB/s.
    pub bidir_d2h_gbps: f64,
    /// Device-memory copy bandwidth (D2D, fills), GB/s of bytes copied.
    pub d2d_gbps: f64,
    /// Device memory bandwidth seen by kernels, GB/s (read + write).
    pub memory_gbps: f64,
    /// Largest payload of one packet, bytes.
    pub max_payload: u32,
    /// Per-packet overhead on the wire (headers, framing), bytes.
    pub header_bytes: u32,
    /// Where the figures come from.
    pub source: &'static str,
}

/// A direction on the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Dir {
    H2D = 0,
    D2H = 1,
}

impl LinkPreset {
    /// PCIe 3.0 x16 (8 GT/s, 128b/130b: 15.75 GB/s raw per direction).
    pub fn pcie3x16() -> Self {
        LinkPreset {
            name: "pcie3x16",
            // cudaMemcpyAsync of a few bytes costs 2–7 µs end to end.
            setup_ns: 5_000,
            // NVIDIA bandwidthTest, pinned memory, V100 on PCIe 3.0 x16: about
            // 12–13 GB/s each way; both at once about 10 GB/s each.
            h2d_gbps: 12.3,
            d2h_gbps: 13.1,
            bidir_h2d_gbps: 10.2,
            bidir_d2h_gbps: 10.6,
            // V100 HBM2: 900 GB/s; a copy reads and writes each byte.
            d2d_gbps: 380.0,
            memory_gbps: 900.0,
            max_payload: 256,
            header_bytes: 24,
            source: "NVIDIA bandwidthTest on V100 (PCIe 3.0 x16), pinned; V100 datasheet",
        }
    }

    /// PCIe 4.0 x16 (16 GT/s: 31.5 GB/s raw per direction).
    pub fn pcie4x16() -> Self {
        LinkPreset {
            name: "pcie4x16",
            setup_ns: 4_000,
            // A100 on PCIe 4.0 x16: one direction 24–27 GB/s; both at once
            // 11–16 GB/s each (bandwidthTest and nvbandwidth reports).
            h2d_gbps: 25.0,
            d2h_gbps: 26.3,
            bidir_h2d_gbps: 13.5,
            bidir_d2h_gbps: 14.0,
            // A100 40 GB HBM2: 1555 GB/s.
            d2d_gbps: 700.0,
            memory_gbps: 1555.0,
            max_payload: 256,
            header_bytes: 24,
            source: "NVIDIA bandwidthTest / nvbandwidth on A100 (PCIe 4.0 x16); A100 datasheet",
        }
    }

    /// PCIe 5.0 x16 (32 GT/s: 63 GB/s raw per direction).
    pub fn pcie5x16() -> Self {
        LinkPreset {
            name: "pcie5x16",
            setup_ns: 3_000,
            // H100 PCIe: 35 GB/s host-to-device, 52.8 GB/s device-to-host
            // (published bandwidthTest figures); both at once about 30 / 40.
            h2d_gbps: 35.0,
            d2h_gbps: 52.8,
            bidir_h2d_gbps: 30.0,
            bidir_d2h_gbps: 40.0,
            // H100 PCIe HBM2e: 2000 GB/s.
            d2d_gbps: 900.0,
            memory_gbps: 2000.0,
            max_payload: 256,
            header_bytes: 24,
            source: "published H100 PCIe bandwidthTest results; H100 PCIe datasheet",
        }
    }

    /// Every preset.
    pub fn all() -> Vec<LinkPreset> {
        vec![Self::pcie3x16(), Self::pcie4x16(), Self::pcie5x16()]
    }

    /// The preset called `name`.
    pub fn by_name(name: &str) -> Option<LinkPreset> {
        Self::all().into_iter().find(|p| p.name == name)
    }

    /// Names of every preset.
    pub fn names() -> Vec<&'static str> {
        Self::all().iter().map(|p| p.name).collect()
    }

    /// The share of the wire that carries data for large transfers.
    pub(crate) fn efficiency(&self) -> f64 {
        let p = f64::from(self.max_payload.max(1));
        p / (p + f64::from(self.header_bytes))
    }

    /// Bytes on the wire for `bytes` of data (headers included).
    pub(crate) fn wire_bytes(&self, bytes: u64) -> f64 {
        let packets = bytes.div_ceil(u64::from(self.max_payload.max(1)));
        bytes as f64 + (packets * u64::from(self.header_bytes)) as f64
    }

    /// Raw wire rate (bytes per ns) of `dir`, alone or while both directions
    /// carry data.
    pub(crate) fn wire_rate(&self, dir: Dir, both: bool) -> f64 {
        let effective = match (dir, both) {
            (Dir::H2D, false) => self.h2d_gbps,
            (Dir::D2H, false) => self.d2h_gbps,
            (Dir::H2D, true) => self.bidir_h2d_gbps,
            (Dir::D2H, true) => self.bidir_d2h_gbps,
        };
        effective / self.efficiency()
    }

    /// Checks the figures a model divides by or adds to a clock
    /// ([`check_figures`]).
    pub(crate) fn validate(&self) -> Result<(), String> {
        check_packets(
            &format!("link {}", self.name),
            self.max_payload,
            self.header_bytes,
        )?;
        check_figures(
            &format!("link {}", self.name),
            self.setup_ns,
            &[
                ("h2d_gbps", self.h2d_gbps),
                ("d2h_gbps", self.d2h_gbps),
                ("bidir_h2d_gbps", self.bidir_h2d_gbps),
                ("bidir_d2h_gbps", self.bidir_d2h_gbps),
                ("d2d_gbps", self.d2d_gbps),
                ("memory_gbps", self.memory_gbps),
            ],
        )
    }

    /// Peak effective bandwidth over both directions, GB/s (the profiler's
    /// "of link peak").
    pub fn peak_gbps(&self) -> f64 {
        self.h2d_gbps.max(self.d2h_gbps)
    }

    /// Modelled time of one transfer of `bytes` in `dir` with nothing else on
    /// the link, ns.
    pub fn transfer_ns(&self, bytes: u64, d2h: bool) -> f64 {
        let dir = if d2h { Dir::D2H } else { Dir::H2D };
        self.setup_ns as f64 + self.wire_bytes(bytes) / self.wire_rate(dir, false)
    }
}

/// The rates a link may give, GB/s: a rate of zero or NaN left a copy
/// waiting for ever, and one so small that a copy's time saturated a `u64`
/// wrapped the device's clock. (1 MB/s moves a 256 TiB memory in 9 years of
/// modelled time, within the clock's reach.)
pub(crate) const RATE_GBPS: std::ops::RangeInclusive<f64> = 1e-3..=1e6;

/// The longest setup latency a link may give, ns (1 s).
pub(crate) const SETUP_MAX_NS: u64 = 1_000_000_000;

/// Checks a link's (`what`) setup latency and named rates against
/// `SETUP_MAX_NS` and `RATE_GBPS`: the message names the first figure out.
pub(crate) fn check_figures(
    what: &str,
    setup_ns: u64,
    rates: &[(&str, f64)],
) -> Result<(), String> {
    if setup_ns > SETUP_MAX_NS {
        return Err(format!(
            "{what}: setup_ns is {setup_ns}; give at most {SETUP_MAX_NS} ns (1 s)"
        ));
    }
    match rates.iter().find(|(_, r)| !RATE_GBPS.contains(r)) {
        Some((name, r)) => Err(format!(
            "{what}: {name} is {r}; give a rate from {} to {} GB/s",
            RATE_GBPS.start(),
            RATE_GBPS.end()
        )),
        None => Ok(()),
    }
}

/// Checks a link's packets: a payload of 1 byte to 1 MiB, a header of at
/// most 64 KiB (a copy's wire bytes, its packets times its header, then stay
/// within a `u64` for any memory).
pub(crate) fn check_packets(what: &str, max_payload: u32, header_bytes: u32) -> Result<(), String> {
    if !(1..=1 << 20).contains(&max_payload) {
        return Err(format!(
            "{what}: max_payload is {max_payload}; give 1 to 1048576 bytes"
        ));
    }
    if header_bytes > 1 << 16 {
        return Err(format!(
            "{what}: header_bytes is {header_bytes}; give at most 65536"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_transfers_reach_the_cited_bandwidth() {
        for p in LinkPreset::all() {
            let bytes = 1u64 << 30;
            let gbps = bytes as f64 / p.transfer_ns(bytes, false);
            assert!((gbps / p.h2d_gbps - 1.0).abs() < 0.01, "{}: {gbps}", p.name);
        }
    }

    #[test]
    fn small_transfers_are_dominated_by_setup() {
        let p = LinkPreset::pcie4x16();
        let t = p.transfer_ns(4096, false);
        assert!(t > p.setup_ns as f64 && t < p.setup_ns as f64 * 1.2, "{t}");
    }

    #[test]
    fn presets_are_found_by_name() {
        assert_eq!(
            LinkPreset::by_name("pcie5x16").map(|p| p.name),
            Some("pcie5x16")
        );
        assert!(LinkPreset::by_name("pcie9").is_none());
    }
}
