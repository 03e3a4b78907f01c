//! Timestamps for profiling: a pool of timestamp queries, read back in
//! nanoseconds, and the calibration that maps device time to the host clock.
//!
//! Calibration: with VK_EXT_calibrated_timestamps, one `vkGetCalibratedTimestampsEXT`
//! call samples the device clock and CLOCK_MONOTONIC together (the driver reports
//! the maximum deviation). Without it, a submission that writes one timestamp is
//! bracketed by two host clock reads: the device sample lies between them, so the
//! midpoint is the estimate and half the round trip the deviation.

use std::sync::Arc;
use std::time::Duration;

use ash::vk;

use crate::device::{DeviceShared, Gpu};
use crate::error::{call, Result, VkError};
use crate::queue::Lane;
use crate::timeline::Timeline;

pub(crate) struct QueryInner {
    pub(crate) shared: Arc<DeviceShared>,
    pub(crate) pool: vk::QueryPool,
    pub(crate) count: u32,
}

impl Drop for QueryInner {
    fn drop(&mut self) {
        // SAFETY: command buffers that write the pool hold this struct by Arc, so
        // none is pending.
        unsafe { self.shared.device.destroy_query_pool(self.pool, None) };
    }
}

/// A pool of `count` timestamp queries.
#[derive(Clone)]
pub struct QueryPool {
    pub(crate) inner: Arc<QueryInner>,
}

impl std::fmt::Debug for QueryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryPool")
            .field("count", &self.inner.count)
            .finish()
    }
}

impl QueryPool {
    /// A pool of `count` timestamp queries (at least 1).
    pub fn new(gpu: &Gpu, count: u32) -> Result<QueryPool> {
        if count == 0 {
            return Err(VkError::InvalidArgument(
                "a query pool of 0 queries; ask for at least 1".into(),
            ));
        }
        let shared = Arc::clone(&gpu.shared);
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(count);
        // SAFETY: valid create info for a live device.
        let pool = unsafe { shared.device.create_query_pool(&info, None) }
            .map_err(call("vkCreateQueryPool"))?;
        if shared.host_query_reset {
            // Reset now so reading a query nobody wrote reports "unavailable"
            // instead of being invalid.
            // SAFETY: the pool is new, so no command uses it; hostQueryReset is enabled.
            unsafe { shared.device.reset_query_pool(pool, 0, count) };
        }
        Ok(QueryPool {
            inner: Arc::new(QueryInner {
                shared,
                pool,
                count,
            }),
        })
    }

    /// Queries in the pool.
    pub fn count(&self) -> u32 {
        self.inner.count
    }

    /// Reads queries `first..first+count` in nanoseconds of the device clock
    /// (ticks x timestampPeriod); None for a query not written yet. Read only after
    /// the submission that writes them completed (wait on its timeline).
    pub fn read_ns(&self, first: u32, count: u32) -> Result<Vec<Option<u64>>> {
        let end = first.checked_add(count).filter(|e| *e <= self.inner.count);
        if end.is_none() {
            return Err(VkError::InvalidArgument(format!(
                "queries {first}..{first}+{count} of a pool of {}",
                self.inner.count
            )));
        }
        if count == 0 {
            return Ok(Vec::new());
        }
        let s = &self.inner.shared;
        let mut data = vec![[0u64; 2]; count as usize];
        let flags = vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WITH_AVAILABILITY;
        // SAFETY: the pool is live; `data` holds `count` (value, availability) pairs
        // of u64, as TYPE_64 | WITH_AVAILABILITY writes them.
        match unsafe {
            s.device
                .get_query_pool_results(self.inner.pool, first, &mut data, flags)
        } {
            Ok(()) | Err(vk::Result::NOT_READY) => {}
            Err(e) => return Err(call("vkGetQueryPoolResults")(e)),
        }
        let period = f64::from(s.info.limits.timestamp_period_ns);
        let mask = tick_mask(s.plan.compute.timestamp_valid_bits);
        Ok(data
            .iter()
            .map(|[ticks, available]| {
                (*available != 0).then(|| ((ticks & mask) as f64 * period) as u64)
            })
            .collect())
    }
}

fn tick_mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// The host clock calibration uses: CLOCK_MONOTONIC in nanoseconds on Unix (the
/// domain VK_EXT_calibrated_timestamps samples); elsewhere nanoseconds since the
/// first call.
pub fn host_now_ns() -> u64 {
    #[cfg(unix)]
    {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        (t.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec as u64)
    }
    #[cfg(not(unix))]
    {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_nanos() as u64
    }
}

/// How a calibration was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CalibrationMethod {
    /// VK_EXT_calibrated_timestamps.
    CalibratedTimestamps,
    /// A submission bracketed by host clock reads.
    SubmissionRoundTrip,
}

/// A device time and a host time ([`host_now_ns`]) taken at the same moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calibration {
    /// Device clock, ns (the scale of [`QueryPool::read_ns`]).
    pub device_ns: u64,
    /// Host clock, ns.
    pub host_ns: u64,
    /// Bound on how far apart the two samples may be, ns.
    pub max_deviation_ns: u64,
    pub method: CalibrationMethod,
}

impl Calibration {
    /// Converts a device time (from [`QueryPool::read_ns`]) to host time.
    pub fn to_host_ns(&self, device_ns: u64) -> u64 {
        let delta = i128::from(device_ns) - i128::from(self.device_ns);
        (i128::from(self.host_ns) + delta).clamp(0, i128::from(u64::MAX)) as u64
    }
}

impl Gpu {
    /// Samples device and host clocks together: through VK_EXT_calibrated_timestamps
    /// when enabled and it offers CLOCK_MONOTONIC, else by a submission round trip.
    pub fn calibrate(&self) -> Result<Calibration> {
        let s = &self.shared;
        if let (Some(dev), Some(inst), true) = (&s.calibrated, &s.instance.calibrated, cfg!(unix)) {
            // SAFETY: the extension is enabled on this device, and the instance-level
            // function was loaded from the same instance.
            let domains =
                unsafe { inst.get_physical_device_calibrateable_time_domains(s.physical) }
                    .map_err(call("vkGetPhysicalDeviceCalibrateableTimeDomainsEXT"))?;
            let want = [
                vk::TimeDomainEXT::DEVICE,
                vk::TimeDomainEXT::CLOCK_MONOTONIC,
            ];
            if want.iter().all(|d| domains.contains(d)) {
                let infos = want.map(|d| vk::CalibratedTimestampInfoEXT::default().time_domain(d));
                // SAFETY: both domains are supported (checked) and the extension enabled.
                let (ts, deviation) = unsafe { dev.get_calibrated_timestamps(&infos) }
                    .map_err(call("vkGetCalibratedTimestampsEXT"))?;
                let period = f64::from(s.info.limits.timestamp_period_ns);
                let mask = tick_mask(s.plan.compute.timestamp_valid_bits);
                return Ok(Calibration {
                    device_ns: ((ts[0] & mask) as f64 * period) as u64,
                    host_ns: ts[1],
                    max_deviation_ns: deviation,
                    method: CalibrationMethod::CalibratedTimestamps,
                });
            }
        }
        self.calibrate_by_submission()
    }

    /// The fallback calibration (see the module docs); public so it can be compared.
    pub fn calibrate_by_submission(&self) -> Result<Calibration> {
        let pool = QueryPool::new(self, 1)?;
        let mut r = self.recorder(Lane::Compute)?;
        r.timestamp(&pool, 0)?;
        let cmd = r.finish()?;
        let done = Timeline::new(self, 0)?;
        let before = host_now_ns();
        self.submit(Lane::Compute, &[&cmd], &[], &[(&done, 1)])?;
        done.wait(1, Duration::from_secs(10))?;
        let after = host_now_ns();
        let device_ns = pool.read_ns(0, 1)?[0].ok_or_else(|| {
            VkError::InvalidArgument(
                "the calibration timestamp was not available after its submission completed".into(),
            )
        })?;
        Ok(Calibration {
            device_ns,
            host_ns: before + (after - before) / 2,
            max_deviation_ns: (after - before).div_ceil(2),
            method: CalibrationMethod::SubmissionRoundTrip,
        })
    }
}
