//! The learning policy: online estimates of each kernel's execution time on
//! each device, learned from what the task layer observes, weighting recent
//! observations over old ones, and a bounded exploration.
//!
//! Method:
//! - **Execution**: per (kernel, device, footprint) an exponentially weighted
//!   moving average of observed execution times, `e ← e + α (x − e)` with
//!   [`ALPHA`]; an observation `k` steps old weighs `(1 − α)^k`, so after a
//!   device changes speed the estimate is within 10 % of the new time after
//!   about `ln 0.1 / ln (1 − α)` ≈ 7 observations. A sample more than
//!   [`CLIP`] times the estimate counts as `CLIP` times it (one 300× outlier
//!   moves the estimate by at most `α (CLIP − 1)`).
//! - **Footprints new to a device**: scaled from a device that has observed
//!   the footprint, its estimate times the ratio of the two devices'
//!   estimates on a footprint both have (the one nearest in size), as if a
//!   device were a speed; without such a pair, the kernel's time per byte
//!   there (a moving average of observed ns per byte, as above) times the
//!   task's data size. A time per byte alone assumes time grows with the
//!   data: after one observation of a compute-bound kernel reading four
//!   tiles it takes the same kernel reading one tile for four times faster
//!   than it is.
//! - **Transfers**: the link models' time, as dmda. (A learned factor of
//!   observed over modelled copy time was tried: a task's copies wait behind
//!   other streams' copies and for their sources, so the factor learned the
//!   queues, not the links, and inflated the data term: 1.029× HEFT's
//!   Cholesky makespan against 1.003× without it.)
//! - **Choice**: the device with the earliest estimated completion
//!   `max(free, predecessors' end + transfers) + e`, as dmda does, on these
//!   estimates.
//! - **Exploration**: a device without an estimate for the task is tried
//!   first (at most [`WARMUP`] times per kernel and device). Then, with
//!   probability [`EPSILON`] (a seeded xorshift, so runs are deterministic),
//!   the task goes to the device whose estimate is the oldest, but only if
//!   that estimate was last observed at least [`STALE_AFTER`] decisions ago
//!   and its estimated completion is at most [`EXPLORE_SPAN`] of the best
//!   device's execution estimate later than the best completion:
//!   exploration is bounded in rate and in cost (half a task), spends
//!   nothing on estimates the policy's own choices keep fresh, and keeps
//!   estimates of devices the policy stopped using fresh (a device that
//!   slowed and recovered is seen again).

use super::{argmin, Candidate, Choice};
use crate::exec::kernel::KernelName;
use rustc_hash::FxHashMap as HashMap;

/// Weight of a new observation.
pub const ALPHA: f64 = 0.3;
/// Largest factor of the estimate a sample may count as.
pub const CLIP: f64 = 8.0;
/// Tries of a device without an estimate for a kernel.
pub const WARMUP: u64 = 1;
/// Probability of an exploring choice.
pub const EPSILON: f64 = 0.05;
/// Decisions since a device's estimate was last observed before it may be
/// explored: an estimate its tasks keep refreshing needs no exploration (on
/// a steady workload exploring cost a few percent of makespan), one the
/// policy stopped using goes stale and is tried again.
pub const STALE_AFTER: u64 = 256;
/// An exploring choice completes at most this fraction of the best
/// device's execution estimate after the best completion.
pub const EXPLORE_SPAN: f64 = 0.5;

#[derive(Clone, Copy, Debug)]
struct Estimate {
    ns: f64,
    seen: u64,
    /// The decision count when last observed.
    at: u64,
}

/// What the policy knows of a kernel on a device, beside its estimates.
#[derive(Debug, Default)]
struct PerDevice {
    /// The footprints observed there and their data sizes, in the order
    /// first observed.
    footprints: Vec<(u64, u64)>,
    /// ns per byte of the task's data, for footprints no device pair can
    /// scale (`None` before the first observation).
    per_byte: Option<f64>,
    /// Tries without an estimate.
    tries: u64,
}

/// The learning policy's state (one per context).
#[derive(Debug)]
pub(crate) struct Learner {
    exec: HashMap<(KernelName, usize, u64), Estimate>,
    /// Per (kernel, device).
    per: HashMap<(KernelName, usize), PerDevice>,
    decisions: u64,
    rng: u64,
    /// Exploring choices made.
    pub(crate) explored: u64,
    /// The task being placed: its kernel and footprint (set by `prepare`).
    current: Option<(KernelName, u64)>,
}

impl Default for Learner {
    fn default() -> Self {
        Learner {
            exec: HashMap::default(),
            per: HashMap::default(),
            decisions: 0,
            rng: 0x9e37_79b9_7f4a_7c15,
            explored: 0,
            current: None,
        }
    }
}

impl Learner {
    /// The estimate of `kernel` with `footprint` (`size` bytes of data) on
    /// device `index`: the footprint's own; else, scaled from a device that
    /// has it, that device's estimate times this device's over that
    /// device's on a footprint both have (the one nearest in size); else
    /// the kernel's time per byte here times `size`.
    pub(crate) fn estimate(
        &self,
        kernel: KernelName,
        index: usize,
        footprint: u64,
        size: u64,
    ) -> Option<f64> {
        if let Some(e) = self.exec.get(&(kernel, index, footprint)) {
            return Some(e.ns);
        }
        self.scaled(kernel, index, footprint, size).or_else(|| {
            let b = self.per.get(&(kernel, index))?.per_byte?;
            Some(b * size.max(1) as f64)
        })
    }

    /// `footprint` on device `index` from another device's estimate of it and
    /// the two devices' estimates of a footprint both have: a kernel's time
    /// depends on its data's size the same way on every device (a device is
    /// a speed), which a time per byte does not assume (a compute-bound
    /// kernel's time does not grow with the data it reads).
    fn scaled(&self, kernel: KernelName, index: usize, footprint: u64, size: u64) -> Option<f64> {
        let mine = &self.per.get(&(kernel, index))?.footprints;
        // The pair nearest in size wins; device and footprint break ties,
        // so the answer does not depend on the maps' order.
        let mut best: Option<((u64, usize, u64), f64)> = None;
        for &(k, other) in self.per.keys() {
            if k != kernel || other == index {
                continue;
            }
            let Some(there) = self.exec.get(&(kernel, other, footprint)) else {
                continue;
            };
            for &(common, common_size) in mine {
                let base_there = self.exec.get(&(kernel, other, common));
                let base_here = self.exec.get(&(kernel, index, common));
                if let (Some(b), Some(h)) = (base_there, base_here) {
                    let key = (common_size.abs_diff(size), other, common);
                    if b.ns > 0.0 && best.is_none_or(|(k, _)| key < k) {
                        best = Some((key, there.ns * h.ns / b.ns));
                    }
                }
            }
        }
        best.map(|(_, ns)| ns)
    }

    /// Names the task the next `choose` places.
    pub(crate) fn prepare(&mut self, kernel: KernelName, footprint: u64) {
        self.current = Some((kernel, footprint));
    }

    /// An observed execution of a task with `size` bytes of data.
    pub(crate) fn observe(
        &mut self,
        kernel: KernelName,
        index: usize,
        footprint: u64,
        size: u64,
        ns: f64,
    ) {
        let at = self.decisions;
        let b = ns / size.max(1) as f64;
        let per = self.per.entry((kernel, index)).or_default();
        per.per_byte = Some(match per.per_byte {
            Some(e) => e + ALPHA * (b.min(e * CLIP) - e),
            None => b,
        });
        if !per.footprints.iter().any(|&(fp, _)| fp == footprint) {
            per.footprints.push((footprint, size));
        }
        self.exec
            .entry((kernel, index, footprint))
            .and_modify(|e| {
                let x = ns.min(e.ns * CLIP);
                e.ns += ALPHA * (x - e.ns);
                e.seen += 1;
                e.at = at;
            })
            .or_insert(Estimate { ns, seen: 1, at });
    }

    fn next_unit(&mut self) -> f64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    pub(crate) fn choose(&mut self, c: &[Candidate]) -> Choice {
        self.decisions += 1;
        let (kernel, fp) = self.current.unwrap_or((KernelName::NONE, 0));
        // Warm-up: a device without an estimate is tried first.
        for (i, x) in c.iter().enumerate() {
            if x.learned_ns.is_none() {
                let t = &mut self.per.entry((kernel, x.index)).or_default().tries;
                if *t < WARMUP {
                    *t += 1;
                    return Choice {
                        at: i,
                        calibrating: true,
                    };
                }
            }
        }
        let known: Vec<usize> = (0..c.len())
            .filter(|&i| c[i].learned_ns.is_some())
            .collect();
        if known.is_empty() {
            return Choice {
                at: 0,
                calibrating: true,
            };
        }
        let end = |x: &Candidate| x.free_ns.max(x.data_ready()) + x.learned_ns.unwrap_or(f64::MAX);
        let ends: Vec<f64> = c.iter().map(end).collect();
        let best = known[argmin(&known, |&i| ends[i])];
        if known.len() > 1 && self.next_unit() < EPSILON {
            let span = ends[best] + EXPLORE_SPAN * c[best].learned_ns.unwrap_or(0.0);
            let age = |i: usize| {
                self.exec
                    .get(&(kernel, c[i].index, fp))
                    .map_or(u64::MAX, |e| self.decisions - e.at)
            };
            let stale = known
                .iter()
                .copied()
                .filter(|&i| i != best && ends[i] <= span && age(i) >= STALE_AFTER)
                .max_by_key(|&i| age(i));
            if let Some(i) = stale {
                self.explored += 1;
                return Choice {
                    at: i,
                    calibrating: false,
                };
            }
        }
        Choice {
            at: best,
            calibrating: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: KernelName = KernelName { id: 0, text: "k" };

    fn cand(index: usize, learned: Option<f64>) -> Candidate {
        Candidate {
            index,
            lanes: 1,
            learned_ns: learned,
            ..Candidate::default()
        }
    }

    #[test]
    fn recent_observations_outweigh_old_ones() {
        let mut l = Learner::default();
        for _ in 0..50 {
            l.observe(K, 0, 1, 10, 100.0);
        }
        for _ in 0..7 {
            l.observe(K, 0, 1, 10, 400.0);
        }
        let e = l.estimate(K, 0, 1, 10).unwrap();
        assert!(e > 360.0 && e < 400.0, "{e}");
        let other = l.estimate(K, 0, 2, 20).unwrap();
        assert!(other > 720.0 && other < 800.0, "{other}");
    }

    #[test]
    fn unseen_footprints_scale_from_a_device_that_has_them() {
        let mut l = Learner::default();
        // Device 1 ran the kernel on 10 and 40 bytes in the same time (it is
        // compute bound); device 0, 16 times slower, only on 40 bytes.
        l.observe(K, 1, 1, 10, 100.0);
        l.observe(K, 1, 4, 40, 100.0);
        l.observe(K, 0, 4, 40, 1600.0);
        assert_eq!(l.estimate(K, 0, 1, 10), Some(1600.0));
        // No device has the footprint: time per byte.
        assert_eq!(l.estimate(K, 0, 9, 20), Some(800.0));
        // No observation of the kernel on the device: none.
        assert_eq!(l.estimate(K, 2, 1, 10), None);
    }

    #[test]
    fn estimates_kept_fresh_are_not_explored() {
        let mut l = Learner::default();
        l.prepare(K, 1);
        let c = [cand(0, Some(100.0)), cand(1, Some(140.0))];
        let mut explored = 0;
        for _ in 0..2000 {
            // Both devices observed at every decision: nothing goes stale.
            l.observe(K, 0, 1, 10, 100.0);
            l.observe(K, 1, 1, 10, 140.0);
            explored += usize::from(l.choose(&c).at == 1);
        }
        assert_eq!(explored, 0);
        // Device 1 no longer observed: after `STALE_AFTER` decisions it is
        // explored again.
        for _ in 0..STALE_AFTER + 2000 {
            l.observe(K, 0, 1, 10, 100.0);
            explored += usize::from(l.choose(&c).at == 1);
        }
        assert!(explored > 0);
    }

    #[test]
    fn exploration_is_bounded() {
        let mut l = Learner::default();
        l.prepare(K, 1);
        let c = [
            cand(0, Some(100.0)),
            cand(1, Some(140.0)),
            cand(2, Some(10_000.0)),
        ];
        let mut picks = [0u32; 3];
        for _ in 0..10_000 {
            picks[l.choose(&c).at] += 1;
        }
        assert_eq!(picks[2], 0, "too costly to explore");
        assert!(picks[1] > 100 && picks[1] < 1000, "{picks:?}");
    }
}
