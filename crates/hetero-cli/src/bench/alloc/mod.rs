//! `hetero bench alloc`: hetero's pools beside glibc malloc, mimalloc, jemalloc,
//! the offset-allocator crate and posix_memalign+mlock (the seed's baseline),
//! in one run, plus two fragmentation replays (buffer-level churn at 60 %
//! occupancy; a whole-pool trace whose batch grows N → N+1). The churn replay
//! also runs three exact reference placement policies (first-fit, best-fit,
//! two-ended fit: an ideal free list, 256-byte granularity) on the same
//! sequence, as the yardstick for what non-moving placement can reach there.
//! The same growth trace with work queued and no synchronisation (the host
//! running ahead) is in `alloc_ahead.rs`.
//!
//! Files: `speed.rs` (the timed series against the peers), `replay.rs` (the
//! two fragmentation replays), `reference.rs` (the exact reference policies);
//! this file holds the shared random sequence and runs every series.

mod reference;
mod replay;
mod speed;

pub(super) use replay::{churn_sequence, growth_ratio, WEIGHTS};

use super::BenchReport;

/// xorshift64*: a reproducible sequence for every allocator alike.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Log-uniform in [lo, hi].
    pub(super) fn log_uniform(&mut self, lo: f64, hi: f64) -> usize {
        (lo * (hi / lo).powf(self.unit())) as usize
    }
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Runs every series; `quick` finishes in well under 20 s.
pub fn run(quick: bool) -> BenchReport {
    let mut rep = BenchReport::new("alloc");
    let samples = if quick { 4000 } else { 40_000 };
    speed::hit_path(&mut rep, samples);
    speed::stream_path(&mut rep, samples);
    speed::churn(&mut rep, quick);
    speed::pinned(&mut rep, if quick { 2000 } else { 20_000 });
    replay::fragmentation_churn(&mut rep, quick);
    replay::growth(&mut rep, quick);
    super::alloc_ahead::running_ahead(&mut rep, quick);
    rep
}
