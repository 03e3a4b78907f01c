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
        self.latency_ns + (bytes as f64 / self.gbps).ceil() as u64
    }

    /// Checks the network's figures (`Cluster::init` does): a bandwidth
    /// from 1 MB/s to 1 PB/s and a latency of at most 1 s, so that a
    /// message's modelled time never saturates a `u64` and wraps a device's
    /// clock (a bandwidth of zero or NaN was once read as 1 B/s).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn validate(&self) -> std::result::Result<(), crate::MpiError> {
        const GBPS: std::ops::RangeInclusive<f64> = 1e-3..=1e6;
        const LATENCY_MAX_NS: u64 = 1_000_000_000;
        if !GBPS.contains(&self.gbps) {
            return Err(crate::MpiError::Init(format!(
                "the modelled network bandwidth is {} GB/s; give a figure from {} to {} \
                 (ClusterConfig::network)",
                self.gbps,
                GBPS.start(),
                GBPS.end()
            )));
        }
        if self.latency_ns > LATENCY_MAX_NS {
            return Err(crate::MpiError::Init(format!(
                "the modelled network latency is {} ns; give at most {LATENCY_MAX_NS} (1 s) \
                 (ClusterConfig::network)",
                self.latency_ns
            )));
        }
        Ok(())
    }
}

/// A device configuration for one of several ranks on a node, on the backend
/// `HETERO_BACKEND` names. On the host backend the node's cores are shared
/// among its ranks (`OMPI_COMM_WORLD_LOCAL_SIZE`) as compute units, and
/// engines stay unpinned when ranks share the node (their engine 0s would all
/// be pinned to the first CPU). An emulated device models an accelerator of
/// the rank's own and keeps its defaults.
pub fn rank_device_config() -> hetero::Result<hetero::DeviceConfig> {
    let config = hetero::DeviceConfig::from_env()?;
    if !matches!(config.backend_kind(), hetero::BackendKind::Host) {
        // Its compute units are a model's, the same whatever CPUs mpirun
        // bound this rank to: the node's online CPUs.
        return Ok(config.compute_units(online_cpus()));
    }
    let local: usize = std::env::var("OMPI_COMM_WORLD_LOCAL_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    // Under a binding (mpirun binds each of up to 2 ranks to a core) this is
    // the rank's own share already.
    let avail = std::thread::available_parallelism().map_or(1, |n| n.get());
    let units = if local > 1 && avail > 1 {
        (avail / local).max(1)
    } else {
        avail
    };
    Ok(config.compute_units(units).pin_engines(local == 1))
}

/// The node's online CPUs (`/sys/devices/system/cpu/online`, e.g. `0-3,6`),
/// whatever this process is bound to; the CPUs it may use if that is unreadable.
fn online_cpus() -> usize {
    let parsed = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|text| {
            text.trim().split(',').try_fold(0usize, |n, part| {
                let mut ends = part.splitn(2, '-').map(|x| x.parse::<usize>().ok());
                match (ends.next().flatten(), ends.next()) {
                    (Some(_), None) => Some(n + 1),
                    (Some(a), Some(Some(b))) if b >= a => Some(n + b - a + 1),
                    _ => None,
                }
            })
        });
    parsed
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

#[cfg(test)]
mod tests {
    use super::ClusterConfig;

    #[test]
    fn a_network_whose_times_would_wrap_a_clock_is_refused() {
        assert!(ClusterConfig::default().validate().is_ok());
        for (latency, gbps) in [
            (1_500, 0.0),
            (1_500, f64::NAN),
            (1_500, -2.0),
            (1_500, 1e-300),
            (1_500, f64::INFINITY),
            (u64::MAX, 12.5),
        ] {
            let c = ClusterConfig::default().network(latency, gbps);
            let e = c.validate().expect_err("refused").to_string();
            assert!(
                e.contains("ClusterConfig::network"),
                "{latency} ns, {gbps} GB/s: {e}"
            );
        }
    }
}
