//! The execution core beside its peers, in the same run.
//!
//! - `submit`: time on the submitting thread per operation handed to another
//!   thread: hetero launching an already-built empty kernel (grid of one block) on a
//!   stream, vs crossbeam-channel and std mpsc sends to a consumer thread, vs
//!   `rayon::spawn` of an empty closure. Work is submitted in batches of `BATCH`;
//!   only the submissions are timed, draining between batches is not.
//! - `event_wait`: from the moment work completes on one thread to the moment the
//!   waiter on another thread runs: a hetero stream synchronize (spinning waiter,
//!   and parked waiter) vs a bare atomic flag between two threads (and std
//!   park/unpark). Timestamps on both sides come from `hetero::clock::now_ns`.
//!
//! `cargo bench -p hetero --bench exec` takes about a minute.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use hetero::clock::now_ns;
use hetero::{CompletionMode, Device, DeviceConfig, Grid, Kernel};

/// Submissions timed back to back before an untimed drain.
const BATCH: u64 = 256;

/// Times `submit` over `iters` submissions in batches, running `drain` (untimed)
/// after each batch so queues stay short and memory bounded.
fn batched(iters: u64, mut submit: impl FnMut(), mut drain: impl FnMut(u64)) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(BATCH);
        let t = std::time::Instant::now();
        for _ in 0..n {
            submit();
        }
        total += t.elapsed();
        drain(n);
        left -= n;
    }
    total
}

/// Spins (yielding) until `counter` reaches `target`.
fn wait_for(counter: &AtomicU64, target: u64) {
    while counter.load(Ordering::Acquire) < target {
        std::thread::yield_now();
    }
}

/// Time on the sending thread to hand one item to a consumer thread that drains the
/// channel (`recv` returns `None` once `send` is dropped).
fn channel_bench(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    send: impl Fn(u64) -> bool,
    mut recv: impl FnMut() -> Option<u64> + Send + 'static,
) {
    let got = Arc::new(AtomicU64::new(0));
    let g2 = got.clone();
    let consumer = std::thread::spawn(move || {
        while let Some(v) = recv() {
            black_box(v);
            g2.fetch_add(1, Ordering::Release);
        }
    });
    let mut sent = 0u64;
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            batched(
                iters,
                || assert!(send(black_box(1)), "consumer alive"),
                |n| {
                    sent += n;
                    wait_for(&got, sent)
                },
            )
        })
    });
    drop(send);
    consumer.join().expect("consumer");
}

fn submit(c: &mut Criterion) {
    let mut g = c.benchmark_group("submit");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_millis(2500));

    {
        let dev = Device::new(DeviceConfig::default()).expect("host device");
        let s = dev.create_stream().expect("stream");
        let k = Kernel::new("empty", |_| {});
        g.bench_function("hetero/launch-empty-kernel", |b| {
            b.iter_custom(|iters| {
                batched(
                    iters,
                    || s.launch(&k, Grid::new(1), &[]).expect("launch"),
                    |_| s.synchronize().expect("synchronize"),
                )
            })
        });
    }

    let (tx, rx) = crossbeam_channel::unbounded::<u64>();
    channel_bench(
        &mut g,
        "crossbeam-channel/send",
        move |v| tx.send(v).is_ok(),
        move || rx.recv().ok(),
    );
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    channel_bench(
        &mut g,
        "std-mpsc/send",
        move |v| tx.send(v).is_ok(),
        move || rx.recv().ok(),
    );

    {
        static RAN: AtomicU64 = AtomicU64::new(0);
        let mut spawned = RAN.load(Ordering::Acquire);
        g.bench_function("rayon/spawn-empty", |b| {
            b.iter_custom(|iters| {
                batched(
                    iters,
                    || {
                        rayon::spawn(|| {
                            RAN.fetch_add(1, Ordering::Release);
                        })
                    },
                    |n| {
                        spawned += n;
                        wait_for(&RAN, spawned)
                    },
                )
            })
        });
    }
    g.finish();
}

/// Sums `t1 - t0` over `iters` rounds of `round`, which returns both stamps.
fn latency(iters: u64, mut round: impl FnMut() -> (u64, u64)) -> Duration {
    let mut total = 0u64;
    for _ in 0..iters {
        let (t0, t1) = round();
        total += t1.saturating_sub(t0);
    }
    Duration::from_nanos(total)
}

/// hetero: a host callback stamps the time as the last thing it does; the waiter,
/// already waiting in `Stream::synchronize` with `mode`, stamps when it returns.
fn hetero_wait(c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    for (name, mode) in [
        ("hetero/spin-waiter", CompletionMode::Spin),
        ("hetero/block-waiter", CompletionMode::Block),
    ] {
        let dev = Device::new(DeviceConfig::default().compute_units(1).host_wait(mode))
            .expect("host device");
        let s = dev.create_stream().expect("stream");
        let stamp = Arc::new(AtomicU64::new(0));
        c.bench_function(name, |b| {
            b.iter_custom(|iters| {
                latency(iters, || {
                    let st = stamp.clone();
                    s.host_fn(move || st.store(now_ns(), Ordering::Release))
                        .expect("host_fn");
                    s.synchronize().expect("synchronize");
                    let t1 = now_ns();
                    (stamp.load(Ordering::Acquire), t1)
                })
            })
        });
    }
}

/// The peers: a helper thread answers each request by stamping the time and then
/// setting a flag (spinning waiter) or unparking the waiter (parked waiter).
fn flag_wait(c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    for (name, park) in [("atomic-flag/spin", false), ("std/park-unpark", true)] {
        let req = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicU64::new(0));
        let stamp = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let waiter = std::thread::current();
        let helper = {
            let (req, done, stamp, stop) = (req.clone(), done.clone(), stamp.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut round = 0u64;
                loop {
                    round += 1;
                    while req.load(Ordering::Acquire) < round {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        std::hint::spin_loop();
                    }
                    stamp.store(now_ns(), Ordering::Relaxed);
                    done.store(round, Ordering::Release);
                    if park {
                        waiter.unpark();
                    }
                }
            })
        };
        let mut round = 0u64;
        c.bench_function(name, |b| {
            b.iter_custom(|iters| {
                latency(iters, || {
                    round += 1;
                    req.store(round, Ordering::Release);
                    while done.load(Ordering::Acquire) < round {
                        if park {
                            std::thread::park();
                        } else {
                            std::hint::spin_loop();
                        }
                    }
                    let t1 = now_ns();
                    (stamp.load(Ordering::Relaxed), t1)
                })
            })
        });
        stop.store(true, Ordering::Relaxed);
        helper.join().expect("helper");
    }
}

fn event_wait(c: &mut Criterion) {
    let mut g = c.benchmark_group("event_wait");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_millis(2500))
        .sample_size(50);
    hetero_wait(&mut g);
    flag_wait(&mut g);
    g.finish();
}

criterion_group!(benches, submit, event_wait);
criterion_main!(benches);
