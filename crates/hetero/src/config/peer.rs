//! Peer links between emulated devices of one context: how long a direct
//! device-to-device copy takes.
//!
//! The model is the host link's (`link.rs`): a copy pays a setup latency, then
//! its bytes on the wire (a packet header per `max_payload` bytes) at the
//! direction's raw rate, derived from the published effective rate. While both
//! directions carry data each runs at its both-at-once rate. The figures are
//! per device pair, one direction (out of the source, into the destination).

use super::link::Dir;

/// A peer link between two devices, with its published figures.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerLink {
    /// The preset's name (`pcie4-switch`, …).
    pub name: &'static str,
    /// Per-copy setup latency, ns (the copy call, the descriptor, the completion).
    pub setup_ns: u64,
    /// Effective bandwidth of a large copy alone, one direction, GB/s (1e9 B/s).
    pub gbps: f64,
    /// Effective bandwidth of each direction while the other carries data too, GB/s.
    pub bidir_gbps: f64,
    /// Largest payload of one packet, bytes.
    pub max_payload: u32,
    /// Per-packet overhead on the wire (headers, framing), bytes.
    pub header_bytes: u32,
    /// Where the figures come from.
    pub source: &'static str,
}

impl PeerLink {
    /// PCIe 4.0 x16 peer-to-peer through a PCIe switch (both devices below one
    /// switch: the traffic never reaches the root complex).
    pub fn pcie4_switch() -> Self {
        PeerLink {
            name: "pcie4-switch",
            // cudaMemcpyPeerAsync costs a few µs end to end, like a host copy.
            setup_ns: 5_000,
            // NVIDIA p2pBandwidthLatencyTest (cuda-samples) between two A100
            // PCIe boards under one PCIe 4.0 switch: about 24–25 GB/s one way
            // with P2P enabled, about 40–48 GB/s both ways together.
            gbps: 24.5,
            bidir_gbps: 21.0,
            max_payload: 256,
            header_bytes: 24,
            source: "NVIDIA p2pBandwidthLatencyTest (cuda-samples), A100 PCIe pairs under one PCIe 4.0 switch",
        }
    }

    /// PCIe 4.0 x16 peer-to-peer through the host bridge (root complex): both
    /// devices on root ports of one CPU socket, so every packet crosses it.
    pub fn pcie4_host_bridge() -> Self {
        PeerLink {
            name: "pcie4-host-bridge",
            setup_ns: 6_000,
            // p2pBandwidthLatencyTest between GPUs on root ports of one socket
            // reports well below a switch: root complexes forward P2P at a
            // fraction of link rate (about 10–14 GB/s one way on PCIe 4.0
            // servers; NVIDIA's GPUDirect docs warn that P2P across the root
            // complex may be slower than staging through host memory).
            gbps: 12.0,
            bidir_gbps: 9.0,
            max_payload: 256,
            header_bytes: 24,
            source: "NVIDIA p2pBandwidthLatencyTest reports for GPUs on one CPU root complex; NVIDIA GPUDirect P2P notes",
        }
    }

    /// An NVLink-class link (NVLink 3 between A100 SXM boards, 12 links).
    pub fn nvlink3() -> Self {
        PeerLink {
            name: "nvlink3",
            setup_ns: 3_000,
            // A100 SXM: 12 NVLink 3 links, 300 GB/s per direction (A100
            // datasheet); nvbandwidth and p2pBandwidthLatencyTest measure about
            // 260–280 GB/s one way and a little less per direction both ways.
            gbps: 270.0,
            bidir_gbps: 250.0,
            // NVLink flits: 256-byte payloads with 16 bytes of header and CRC.
            max_payload: 256,
            header_bytes: 16,
            source: "NVIDIA A100 datasheet (NVLink 3: 300 GB/s per direction); nvbandwidth / p2pBandwidthLatencyTest on DGX A100",
        }
    }

    /// Every preset.
    pub fn all() -> Vec<PeerLink> {
        vec![
            Self::pcie4_switch(),
            Self::pcie4_host_bridge(),
            Self::nvlink3(),
        ]
    }

    /// The preset called `name`.
    pub fn by_name(name: &str) -> Option<PeerLink> {
        Self::all().into_iter().find(|p| p.name == name)
    }

    /// Names of every preset.
    pub fn names() -> Vec<&'static str> {
        Self::all().iter().map(|p| p.name).collect()
    }

    /// Checks the figures a model divides by or adds to a clock
    /// (`link::check_figures`).
    pub(crate) fn validate(&self) -> Result<(), String> {
        super::link::check_packets(
            &format!("peer link {}", self.name),
            self.max_payload,
            self.header_bytes,
        )?;
        super::link::check_figures(
            &format!("peer link {}", self.name),
            self.setup_ns,
            &[("gbps", self.gbps), ("bidir_gbps", self.bidir_gbps)],
        )
    }

    fn efficiency(&self) -> f64 {
        let p = f64::from(self.max_payload.max(1));
        p / (p + f64::from(self.header_bytes))
    }

    /// Bytes on the wire for `bytes` of data (headers included).
    pub(crate) fn wire_bytes(&self, bytes: u64) -> f64 {
        let packets = bytes.div_ceil(u64::from(self.max_payload.max(1)));
        bytes as f64 + (packets * u64::from(self.header_bytes)) as f64
    }

    /// Raw wire rate (bytes per ns) of one direction, alone or while the
    /// other direction carries data too.
    pub(crate) fn wire_rate(&self, _dir: Dir, both: bool) -> f64 {
        let effective = if both { self.bidir_gbps } else { self.gbps };
        effective / self.efficiency()
    }

    /// Modelled time of one copy of `bytes` with nothing else on the link, ns.
    pub fn transfer_ns(&self, bytes: u64) -> f64 {
        self.setup_ns as f64 + self.wire_bytes(bytes) / self.wire_rate(Dir::H2D, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_copies_reach_the_cited_bandwidth() {
        for p in PeerLink::all() {
            let bytes = 1u64 << 30;
            let gbps = bytes as f64 / p.transfer_ns(bytes);
            assert!((gbps / p.gbps - 1.0).abs() < 0.01, "{}: {gbps}", p.name);
        }
    }

    #[test]
    fn presets_are_found_by_name() {
        assert_eq!(
            PeerLink::by_name("nvlink3").map(|p| p.name),
            Some("nvlink3")
        );
        assert!(PeerLink::by_name("pcie9").is_none());
    }
}
