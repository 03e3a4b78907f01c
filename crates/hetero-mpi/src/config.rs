//! How a cluster behaves: how long a transfer may wait for its peer, and the
//! network a device in virtual time models between ranks.

use std::time::Duration;

/// Settings of a [`Cluster`](crate::Cluster).
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub(crate) timeout: Duration,
    pub(crate) latency_ns: u64,
    pub(crate) gbps: f64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            timeout: Duration::from_secs(60),
            latency_ns: 1_500,
            gbps: 12.5,
        }
    }
}

impl ClusterConfig {
    /// The defaults, with `HETERO_MPI_TIMEOUT_MS` (if set) as the timeout.
    pub fn from_env() -> std::result::Result<Self, crate::MpiError> {
        let mut c = ClusterConfig::default();
        if let Ok(v) = std::env::var("HETERO_MPI_TIMEOUT_MS") {
            let ms: u64 = v.trim().parse().map_err(|_| {
                crate::MpiError::Init(format!(
                    "HETERO_MPI_TIMEOUT_MS is {v:?}; give a whole number of milliseconds"
                ))
            })?;
            c.timeout = Duration::from_millis(ms);
        }
        Ok(c)
    }

    /// How long a remote copy or a remote event wait may stay pending before
    /// its stream fails with [`MpiError::PeerTimeout`](crate::MpiError::PeerTimeout)
    /// naming the peer (a rank that died or hangs). Default 60 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The network between ranks as a device in virtual time models it: a
    /// message of `n` bytes arrives `latency_ns + n / gbps` after it was sent
    /// (by the sender's device clock). Default 1.5 µs and 12.5 GB/s (100 Gb/s
    /// InfiniBand). Devices in real time take the time the transfer takes.
    pub fn network(mut self, latency_ns: u64, gbps: f64) -> Self {
        self.latency_ns = latency_ns;
        self.gbps = gbps;
        self
    }

    /// The modelled time a message of `bytes` takes, ns.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn wire_ns(&self, bytes: usize) -> u64 {
        self.latency_ns + (bytes as f64 / self.gbps.max(1e-9)).ceil() as u64
    }
}
