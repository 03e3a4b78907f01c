//! Small measures the report and its graph section share: interval unions,
//! percentiles, and how times and sizes are written.

use hdrhistogram::Histogram;
use hetero_trace::OpRecord;
use serde::{Deserialize, Serialize};

/// Percentiles from an hdrhistogram (3 significant digits: within 0.1 %);
/// `max_ns` and `mean_ns` are exact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Median.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// Largest value.
    pub max_ns: u64,
    /// Arithmetic mean.
    pub mean_ns: f64,
}

/// Union of [start, end) intervals, merged and sorted.
pub(crate) fn merge(mut spans: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    spans.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for (s, e) in spans {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    merged
}

pub(crate) fn busy(merged: &[(u64, u64)]) -> u64 {
    merged.iter().map(|(s, e)| e - s).sum()
}

pub(crate) fn span(op: &OpRecord) -> (u64, u64) {
    (op.start_ns, op.end_ns.max(op.start_ns))
}

pub(crate) fn percentiles(values: &[u64]) -> Percentiles {
    let mut h = Histogram::<u64>::new(3).expect("3 significant digits is a valid precision");
    for &v in values {
        // `new` auto-resizes, so `record` only fails past u64 range limits.
        if h.record(v).is_err() {
            h.saturating_record(v);
        }
    }
    let max = values.iter().copied().max().unwrap_or(0);
    let mean = if values.is_empty() {
        0.0
    } else {
        values.iter().map(|&v| v as f64).sum::<f64>() / values.len() as f64
    };
    Percentiles {
        // hdrhistogram reports the top of a bucket; never above the true max.
        p50_ns: h.value_at_quantile(0.50).min(max),
        p90_ns: h.value_at_quantile(0.90).min(max),
        p99_ns: h.value_at_quantile(0.99).min(max),
        max_ns: max,
        mean_ns: mean,
    }
}

/// "1.234 ms", "56.7 µs", "890 ns".
pub(crate) fn fmt_ns(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.3} s", ns as f64 / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.3} ms", ns as f64 / 1e6)
    } else if ns >= 1_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else {
        format!("{ns} ns")
    }
}

/// "1.5 MiB", "512 B".
pub(crate) fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
