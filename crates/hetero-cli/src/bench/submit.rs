//! `hetero bench submit`: ns on the submitting thread to launch an already-built
//! empty kernel (grid of one block) on a stream, beside handing one item to another
//! thread with crossbeam-channel, std mpsc, and rayon::spawn; and ns per empty op
//! end to end (submitted, run, synchronized) over 10 000 ops, beside the same
//! number of prebuilt empty tasks run by a worker thread or a thread pool.

use super::BenchReport;
use hetero::{Device, DeviceConfig, Grid, Kernel};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Submissions timed together; a sample is the batch's mean.
const BATCH: usize = 64;

fn sample(batches: usize, mut submit_batch: impl FnMut(), mut drain: impl FnMut()) -> Vec<f64> {
    let mut out = Vec::with_capacity(batches);
    for _ in 0..batches / 10 {
        submit_batch();
        drain();
    }
    for _ in 0..batches {
        let t = Instant::now();
        submit_batch();
        out.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
        drain();
    }
    out
}

fn wait_count(done: &AtomicUsize, target: usize) {
    let b = crossbeam_utils::Backoff::new();
    while done.load(Ordering::Acquire) < target {
        b.snooze();
    }
}

/// Per-send ns of handing an item to a consumer thread: `send` on this thread,
/// `recv` on the consumer until it returns `None` (the sender dropped).
fn channel_samples(
    batches: usize,
    send: impl Fn(u64) -> bool,
    recv: impl FnMut() -> Option<u64> + Send + 'static,
) -> Vec<f64> {
    let done = Arc::new(AtomicUsize::new(0));
    let d2 = done.clone();
    let mut recv = recv;
    let consumer = std::thread::spawn(move || {
        while recv().is_some() {
            d2.fetch_add(1, Ordering::Release);
        }
    });
    let sent = std::cell::Cell::new(0usize);
    let v = sample(
        batches,
        || {
            for i in 0..BATCH {
                assert!(send(i as u64), "consumer alive");
            }
            sent.set(sent.get() + BATCH);
        },
        || wait_count(&done, sent.get()),
    );
    drop(send); // closes the channel: the consumer ends
    let _ = consumer.join();
    v
}

/// Per-launch ns of an empty one-block kernel, batch means, on a fresh device.
pub fn hetero_submit_samples(batches: usize) -> Vec<f64> {
    let dev = Device::host().expect("host device");
    let s = dev.create_stream().expect("stream");
    let k = Kernel::new("empty", |_| {});
    sample(
        batches,
        || {
            for _ in 0..BATCH {
                s.launch(&k, Grid::new(1), &[]).expect("launch");
            }
        },
        || s.synchronize().expect("synchronize"),
    )
}

/// The same launches while the stream is held by a gate (a host callback waiting on
/// a flag): no engine consumes during the timed batch, so this is the submitting
/// thread's own cost, without cache lines shared with a running consumer.
pub fn hetero_submit_queued_samples(batches: usize) -> Vec<f64> {
    use std::sync::atomic::AtomicBool;
    let dev = Device::host().expect("host device");
    let s = dev.create_stream().expect("stream");
    let k = Kernel::new("empty", |_| {});
    let gate = Arc::new(AtomicBool::new(false));
    let mut out = Vec::with_capacity(batches);
    for i in 0..batches + batches / 10 {
        gate.store(false, Ordering::Release);
        let g = gate.clone();
        s.host_fn(move || {
            while !g.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
        })
        .expect("host_fn");
        let t = Instant::now();
        for _ in 0..BATCH {
            s.launch(&k, Grid::new(1), &[]).expect("launch");
        }
        let ns = t.elapsed().as_nanos() as f64 / BATCH as f64;
        gate.store(true, Ordering::Release);
        s.synchronize().expect("synchronize");
        if i >= batches / 10 {
            out.push(ns);
        }
    }
    out
}

/// Empty ops per end-to-end sample.
const OPS: usize = 10_000;

/// Times `rounds` runs of `round` on what `prepare` built before the clock
/// started (after a tenth as many untimed rounds); ns per op.
fn end_to_end<T>(
    rounds: usize,
    mut prepare: impl FnMut() -> T,
    mut round: impl FnMut(T),
) -> Vec<f64> {
    for _ in 0..rounds / 10 + 1 {
        round(prepare());
    }
    (0..rounds)
        .map(|_| {
            let work = prepare();
            let t = Instant::now();
            round(work);
            t.elapsed().as_nanos() as f64 / OPS as f64
        })
        .collect()
}

/// ns per op of `OPS` empty one-block kernels launched round-robin over `streams`
/// fresh streams, then every stream synchronized: submission, dispatch, the
/// engines' run and completion, and the host wait, all included, on a device
/// with the default configuration. Its rings (1024 ops) are smaller than `OPS`,
/// so the submitter meets backpressure: a ring sized for all `OPS` (1.4 MB of
/// slots) measured slower here (its slots miss the caches), and the default is
/// what users run.
pub fn hetero_op_end_to_end_samples(rounds: usize, streams: usize) -> Vec<f64> {
    let dev = Device::new(DeviceConfig::default()).expect("host device");
    let streams: Vec<_> = (0..streams)
        .map(|_| dev.create_stream().expect("stream"))
        .collect();
    let k = Kernel::new("empty", |_| {});
    end_to_end(
        rounds,
        || (),
        |()| {
            for i in 0..OPS {
                streams[i % streams.len()]
                    .launch(&k, Grid::new(1), &[])
                    .expect("launch");
            }
            for s in &streams {
                s.synchronize().expect("synchronize");
            }
        },
    )
}

type Task = Box<dyn FnOnce() + Send>;

/// The peer of one stream: `OPS` prebuilt boxed empty closures handed one by one
/// over a crossbeam channel to one worker thread that runs them in order; the last
/// one tells the waiting thread it ran.
fn crossbeam_task_end_to_end_samples(rounds: usize) -> Vec<f64> {
    let (tx, rx) = crossbeam_channel::unbounded::<Task>();
    let worker = std::thread::spawn(move || {
        for task in rx {
            task();
        }
    });
    let done = Arc::new(AtomicUsize::new(0));
    let mut round_no = 0usize;
    let v = end_to_end(
        rounds,
        || {
            let mut tasks: Vec<Task> = (0..OPS - 1).map(|_| Box::new(|| {}) as Task).collect();
            let d = done.clone();
            tasks.push(Box::new(move || {
                d.fetch_add(1, Ordering::Release);
            }));
            tasks
        },
        |tasks| {
            round_no += 1;
            for task in tasks {
                tx.send(task).expect("worker alive");
            }
            wait_count(&done, round_no);
        },
    );
    drop(tx);
    let _ = worker.join();
    v
}

/// The peer of several streams: `OPS` empty tasks spawned into a rayon scope
/// (a pool of one thread per core, as hetero has one engine per core), which
/// returns when all ran.
fn rayon_scope_end_to_end_samples(rounds: usize) -> Vec<f64> {
    let pool = rayon::ThreadPoolBuilder::new().build().expect("rayon pool");
    end_to_end(
        rounds,
        || (),
        |()| {
            pool.scope(|s| {
                for _ in 0..OPS {
                    s.spawn(|_| {});
                }
            });
        },
    )
}

pub fn run(quick: bool) -> BenchReport {
    let batches = if quick { 3_000 } else { 30_000 };
    let mut rep = BenchReport::new("submit");

    let mut v = hetero_submit_samples(batches);
    rep.push_samples("hetero/submit", "ns", &mut v);
    let mut v = hetero_submit_queued_samples(batches);
    rep.push_samples("hetero/submit-queued", "ns", &mut v);

    // Channels: send to a consumer thread that drains them.
    let (tx, rx) = crossbeam_channel::unbounded::<u64>();
    let mut v = channel_samples(batches, move |i| tx.send(i).is_ok(), move || rx.recv().ok());
    rep.push_samples("crossbeam-channel/send", "ns", &mut v);
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    let mut v = channel_samples(batches, move |i| tx.send(i).is_ok(), move || rx.recv().ok());
    rep.push_samples("std-mpsc/send", "ns", &mut v);
    // rayon::spawn of an empty task.
    {
        let pool = rayon::ThreadPoolBuilder::new().build().expect("rayon pool");
        let done = Arc::new(AtomicUsize::new(0));
        let sent = std::cell::Cell::new(0usize);
        let mut v = sample(
            batches,
            || {
                for _ in 0..BATCH {
                    let d = done.clone();
                    pool.spawn(move || {
                        d.fetch_add(1, Ordering::Release);
                    });
                }
                sent.set(sent.get() + BATCH);
            },
            || wait_count(&done, sent.get()),
        );
        rep.push_samples("rayon/spawn", "ns", &mut v);
    }
    for peer in ["crossbeam-channel/send", "std-mpsc/send", "rayon/spawn"] {
        rep.ratio(&format!("{peer} / hetero/submit"), peer, "hetero/submit");
    }
    // hetero/submit has a live consumer (the engines run the batch while it is
    // submitted), as the channel peers do: the same ratio, hetero on top.
    rep.ratio_of("hetero/submit", "crossbeam-channel/send");

    // End to end: the work of a whole empty op, not only its submission.
    let rounds = if quick { 20 } else { 200 };
    let mut v = hetero_op_end_to_end_samples(rounds, 1);
    rep.push_samples("hetero/op-end-to-end", "ns", &mut v);
    let mut v = hetero_op_end_to_end_samples(rounds, 8);
    rep.push_samples("hetero/op-end-to-end-8-streams", "ns", &mut v);
    let mut v = crossbeam_task_end_to_end_samples(rounds);
    rep.push_samples("crossbeam/task-end-to-end", "ns", &mut v);
    let mut v = rayon_scope_end_to_end_samples(rounds);
    rep.push_samples("rayon/scope-end-to-end", "ns", &mut v);
    for (hetero, peer) in [
        ("hetero/op-end-to-end", "crossbeam/task-end-to-end"),
        (
            "hetero/op-end-to-end-8-streams",
            "crossbeam/task-end-to-end",
        ),
        ("hetero/op-end-to-end-8-streams", "rayon/scope-end-to-end"),
    ] {
        rep.ratio(&format!("{hetero} / {peer}"), hetero, peer);
    }
    rep
}
