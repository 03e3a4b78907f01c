//! `hetero bench submit`: ns on the submitting thread to launch an already-built
//! empty kernel (grid of one block) on a stream, beside handing one item to another
//! thread with crossbeam-channel, std mpsc, and rayon::spawn.

use super::BenchReport;
use hetero::{Device, Grid, Kernel};
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
    rep
}
