//! `hetero bench …`: every benchmark puts hetero beside a peer in the same run and
//! reports the ratio. All commands share one JSON shape:
//! `{"bench": NAME, "results": [{"name", "unit", "median", "p99", "n"}], "ratios": {..}}`,
//! with `"context"` (the run's setting) and `"unavailable"` (figures that could
//! not be measured, each with why) where a benchmark has them.

pub mod alloc;
mod alloc_ahead;
pub mod events;
pub mod graph;
pub mod graph_arena;
mod graph_cholesky;
pub mod link;
pub mod managed;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod pipeline;
pub mod placement;
pub mod profile;
pub mod submit;
pub mod transfer;
pub mod vmm;
mod vmm_ipc;
pub mod vulkan;

use serde::Serialize;
use std::collections::BTreeMap;

/// One measured series, summarised.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    pub name: String,
    pub unit: String,
    pub median: f64,
    pub p99: f64,
    pub n: u64,
}

/// The shared report of every `hetero bench` command.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub bench: String,
    pub results: Vec<BenchResult>,
    pub ratios: BTreeMap<String, f64>,
    /// What the reader should know about the run (a reference's source, a size
    /// measured smaller than asked).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The run's setting: the device, a driver's knobs (`LP_NUM_THREADS`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub context: BTreeMap<String, String>,
    /// Figures that could not be measured in this run, each with why (never a
    /// made-up number in `results`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unavailable: BTreeMap<String, String>,
}

impl BenchReport {
    pub fn new(bench: &str) -> Self {
        BenchReport {
            bench: bench.to_string(),
            results: Vec::new(),
            ratios: BTreeMap::new(),
            notes: Vec::new(),
            context: BTreeMap::new(),
            unavailable: BTreeMap::new(),
        }
    }

    /// Summarises `samples` (any order) into a result named `name`.
    pub fn push_samples(&mut self, name: &str, unit: &str, samples: &mut [f64]) -> &BenchResult {
        self.results.push(summarize(name, unit, samples));
        self.results.last().expect("just pushed")
    }

    /// Adds a single-valued result (a ratio or a figure computed over a whole run).
    pub fn push_value(&mut self, name: &str, unit: &str, value: f64, n: u64) {
        self.results.push(BenchResult {
            name: name.to_string(),
            unit: unit.to_string(),
            median: value,
            p99: value,
            n,
        });
    }

    pub fn median_of(&self, name: &str) -> Option<f64> {
        self.results
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.median)
    }

    /// Records `numerator.median / denominator.median` under `key` when both exist.
    pub fn ratio(&mut self, key: &str, numerator: &str, denominator: &str) {
        if let (Some(a), Some(b)) = (self.median_of(numerator), self.median_of(denominator)) {
            if b != 0.0 {
                self.ratios.insert(key.to_string(), a / b);
            }
        }
    }

    /// [`Report::ratio`] under the key `"numerator / denominator"`.
    pub fn ratio_of(&mut self, numerator: &str, denominator: &str) {
        self.ratio(
            &format!("{numerator} / {denominator}"),
            numerator,
            denominator,
        );
    }

    /// Prints the report: JSON on one line, or an aligned table.
    pub fn print(&self, json: bool) {
        if json {
            println!(
                "{}",
                serde_json::to_string(self).expect("bench report serialises")
            );
            return;
        }
        println!("bench {}", self.bench);
        for (k, v) in &self.context {
            println!("  {k}: {v}");
        }
        println!(
            "  {:<40} {:>6} {:>14} {:>14} {:>10}",
            "name", "unit", "median", "p99", "n"
        );
        for r in &self.results {
            println!(
                "  {:<40} {:>6} {:>14.3} {:>14.3} {:>10}",
                r.name, r.unit, r.median, r.p99, r.n
            );
        }
        for (k, v) in &self.ratios {
            println!("  ratio {k:<34} {v:>10.3}");
        }
        for (name, why) in &self.unavailable {
            println!("  unavailable {name}: {why}");
        }
        for n in &self.notes {
            println!("  note: {n}");
        }
    }
}

/// Median and 99th percentile (nearest rank) of `samples`.
pub fn summarize(name: &str, unit: &str, samples: &mut [f64]) -> BenchResult {
    samples.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| -> f64 {
        if samples.is_empty() {
            return f64::NAN;
        }
        let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
        samples[rank - 1]
    };
    BenchResult {
        name: name.to_string(),
        unit: unit.to_string(),
        median: pick(0.5),
        p99: pick(0.99),
        n: samples.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarize_picks_nearest_rank() {
        let mut s: Vec<f64> = (1..=100).map(f64::from).collect();
        let r = summarize("x", "ns", &mut s);
        assert_eq!(r.median, 50.0);
        assert_eq!(r.p99, 99.0);
        assert_eq!(r.n, 100);
    }

    #[test]
    fn ratio_uses_medians() {
        let mut rep = BenchReport::new("t");
        rep.push_value("a", "ns", 10.0, 1);
        rep.push_value("b", "ns", 40.0, 1);
        rep.ratio("b/a", "b", "a");
        assert_eq!(rep.ratios["b/a"], 4.0);
    }
}
