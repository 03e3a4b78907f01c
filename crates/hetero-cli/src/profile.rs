//! `hetero profile WORKLOAD --out DIR`: runs a built-in workload with the recorder
//! on and writes trace.json (Perfetto / chrome://tracing), report.md, report.json
//! and timeline.svg.

use crate::demo::{self, DemoConfig};
use crate::device::DeviceSpec;
use std::path::Path;

/// The built-in workloads.
pub const WORKLOADS: &[&str] = &["demo", "pipeline"];

/// What a profile run wrote.
pub struct ProfileOutput {
    pub paths: hetero_profile::Paths,
    pub ops: usize,
    pub verified: bool,
}

/// Runs `workload` on a fresh host device with the recorder on and writes the
/// outputs into `out`.
pub fn run(
    workload: &str,
    out: &Path,
    cfg: DemoConfig,
    progress: impl FnMut(&str),
) -> Result<ProfileOutput, String> {
    run_on(workload, out, &DeviceSpec::Host, cfg, progress)
}

/// [`run`] on a fresh device from `spec`; a device behind a link model fills the
/// report's "of link peak" (H2D and D2H engines), and one in virtual time makes
/// it report device time.
pub fn run_on(
    workload: &str,
    out: &Path,
    spec: &DeviceSpec,
    cfg: DemoConfig,
    progress: impl FnMut(&str),
) -> Result<ProfileOutput, String> {
    if !WORKLOADS.contains(&workload) {
        return Err(format!(
            "unknown workload '{workload}'; built-in workloads: {}",
            WORKLOADS.join(", ")
        ));
    }
    let _ = hetero_trace::take(); // start from an empty recorder
    hetero_trace::set_enabled(true);
    let mut allocator = None;
    let mut link_peak_gbps = None;
    let result = (|| -> hetero::Result<bool> {
        let dev = spec.open()?;
        hetero_trace::set_device_name(dev.properties().name.clone());
        hetero_trace::set_clock(match spec.time() {
            "virtual" => hetero_trace::TraceClock::Virtual,
            _ => hetero_trace::TraceClock::Wall,
        });
        link_peak_gbps = dev.properties().link_peak_gbps;
        let mut progress = progress;
        let verified = match workload {
            "demo" => demo::run_on(&dev, spec, cfg, &mut progress)?.verified,
            _ => {
                progress("pipelined runs");
                demo::pipeline_on(&dev, spec, cfg)?.1
            }
        };
        let m = dev.memory_stats();
        allocator = Some(hetero_profile::AllocatorStats {
            cache_hits: m.cache_hits,
            cache_misses: m.allocations.saturating_sub(m.cache_hits),
            fragmentation: m.fragmentation,
            reserved_bytes: m.reserved as u64,
            allocated_bytes: m.allocated as u64,
        });
        Ok(verified)
    })();
    hetero_trace::set_enabled(false);
    let verified = result.map_err(|e| format!("{workload} failed: {e}"))?;
    let trace = hetero_trace::take();
    let options = hetero_profile::ReportOptions {
        allocator,
        link_peak_gbps,
        ..Default::default()
    };
    let paths = hetero_profile::write_all_with(&trace, out, &options)
        .map_err(|e| format!("could not write the profile into {}: {e}", out.display()))?;
    Ok(ProfileOutput {
        paths,
        ops: trace.ops.len(),
        verified,
    })
}
