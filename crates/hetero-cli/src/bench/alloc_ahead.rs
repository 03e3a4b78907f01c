//! `hetero bench alloc`, running-ahead replays: the inference-like growth trace
//! (weights stay; each step allocates activations for batch N, frees them, N
//! grows by one) through the public API, with a tiny fill on every buffer and
//! no synchronisation. The host then runs ahead of the engines, so buffers are
//! freed while work on them is still queued. Reported: the pool's peak reserved
//! bytes over the trace's own peak live bytes, with the pool configured from
//! `HETERO_ALLOC_CONF` (the defaults when unset), beside the same replay with
//! the wait before growth turned off (the peer: what the pool does without it).
//! The two-stream variant also fills every activation on a second stream, so
//! its memory returns only when that stream's work on it completes.

use super::BenchReport;
use hetero::{Device, DeviceConfig, PoolConfig};

/// The outcome of one replay.
struct Replay {
    /// Peak reserved over peak live.
    ratio: f64,
    /// Allocations that failed (the trace goes on without the buffer).
    failed: u64,
}

/// One replay of the growth trace on a fresh device.
fn replay(pool: PoolConfig, max_batch: usize, two_streams: bool) -> Replay {
    let dev = Device::new(DeviceConfig::default().memory(pool)).expect("host device");
    let s = dev.create_stream().expect("stream");
    let other = dev.create_stream().expect("second stream");
    let mut failed = 0u64;
    let fill = |b: &hetero::DeviceBuffer<u8>| {
        s.fill_range(b, 0, 1, 1u8).expect("fill");
        if two_streams {
            other
                .fill_range(b, 0, 1, 2u8)
                .expect("fill on the second stream");
        }
    };
    let weights: Vec<_> = super::alloc::WEIGHTS
        .iter()
        .map(|&n| s.alloc::<u8>(n).expect("weights"))
        .collect();
    for w in &weights {
        fill(w);
    }
    let base_live: usize = weights.iter().map(|w| w.len()).sum();
    let mut peak_live = base_live;
    for n in 1..=max_batch {
        let mut acts = Vec::new();
        let mut live = base_live;
        for layer in 0..12 {
            for (k, per_item) in [(0, 48usize << 10), (1, 192 << 10), (2, 640 << 10)] {
                let bytes = n * per_item + layer * 4096 + k * 256;
                match s.alloc::<u8>(bytes) {
                    Ok(b) => {
                        fill(&b);
                        live += bytes;
                        acts.push(b);
                    }
                    Err(_) => failed += 1,
                }
            }
            let bytes = n * (96 << 10);
            match s.alloc::<u8>(bytes) {
                Ok(tmp) => {
                    fill(&tmp);
                    peak_live = peak_live.max(live + bytes);
                }
                Err(_) => failed += 1,
            }
        }
        peak_live = peak_live.max(live);
        drop(acts);
    }
    dev.synchronize().expect("replay work");
    let ratio = dev.memory_stats().peak_reserved as f64 / peak_live as f64;
    drop(weights);
    Replay { ratio, failed }
}

/// Pushes the ratio of `runs` replays under `name`; the failed allocations.
fn series(
    rep: &mut BenchReport,
    name: &str,
    pool: &PoolConfig,
    runs: usize,
    max_batch: usize,
    two_streams: bool,
) -> u64 {
    let mut ratios = Vec::with_capacity(runs);
    let mut failed = 0;
    for _ in 0..runs {
        let r = replay(pool.clone(), max_batch, two_streams);
        ratios.push(r.ratio);
        failed += r.failed;
    }
    rep.push_samples(name, "ratio", &mut ratios);
    failed
}

/// The running-ahead series, each beside its no-wait peer.
pub(super) fn running_ahead(rep: &mut BenchReport, quick: bool) {
    let pool = PoolConfig::from_env().expect("HETERO_ALLOC_CONF");
    let no_wait = pool.clone().wait_before_grow_ratio(None);
    let (runs, max_batch) = if quick { (3, 32) } else { (7, 64) };
    let mut failed = 0;
    for (suffix, two) in [("", false), ("-2-streams", true)] {
        let name = format!("hetero/reserved-over-live-running-ahead{suffix}");
        let peer = format!("no-wait/reserved-over-live-running-ahead{suffix}");
        failed += series(rep, &name, &pool, runs, max_batch, two);
        series(rep, &peer, &no_wait, runs, max_batch, two);
        rep.ratio(
            &format!("running-ahead{suffix} no-wait/hetero"),
            &peer,
            &name,
        );
    }
    rep.push_value(
        "hetero/running-ahead-failed-allocs",
        "count",
        failed as f64,
        2 * runs as u64,
    );
}
