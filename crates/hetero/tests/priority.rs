//! Stream priorities through the public API, on one compute unit so dispatch order is
//! the only thing that decides the order of the log.
//!
//! What the scheduler guarantees (backend/host.rs): at each operation boundary the
//! ready stream with the lowest *effective* priority runs; a stream's effective
//! priority improves by one level per `AGING_TICKS` (16) completed dispatches it
//! waits, and at equal effective priority the stream served longest ago wins. A
//! running op is never preempted. So a priority-7 stream behind a busy priority-0
//! stream waits 7 × 16 = 112 dispatches, no fewer, then runs one op, and so on. The
//! tests assert these counts with a little slack, never a duration.
//!
//! The device is the one `HETERO_BACKEND` names. The emulated device orders
//! ready streams by priority too, but has no aging: what it cannot run is in
//! its skip tables (`tests/common`).

mod common;

use hetero::{Device, Stream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Dispatches a stream waits per level of priority it gains (backend/host.rs).
const AGING_TICKS: usize = 16;
/// Dispatches a priority-7 stream waits behind priority-0 work before it runs.
// A priority-7 stream ties with priority-0 work after 7 levels of aging; ties go to
// the stream a worker just ran, so it wins one level later.
const FULL_AGING: usize = (7 + 1) * AGING_TICKS;

fn one_unit() -> Device {
    common::device_with(|c| c.compute_units(1).stream_capacity(4096))
}

type Log = Arc<Mutex<Vec<char>>>;

fn log_op(s: &Stream, log: &Log, tag: char) {
    let log = log.clone();
    s.host_fn(move || log.lock().expect("log").push(tag))
        .expect("host_fn");
}

/// Holds the device's only worker (host: the one engine; emu: the thread running
/// the model) inside a callback on `s` until [`Blocker::release`], so nothing else
/// is dispatched meanwhile. Returns once the callback runs.
struct Blocker {
    release: Arc<AtomicBool>,
    /// Waits for the callback's stream. In virtual time nothing runs until a host
    /// thread waits: this wait is what starts the callback (and the thread runs the
    /// model, callback included); elsewhere it just waits.
    driver: std::thread::JoinHandle<()>,
}

impl Blocker {
    fn release(self) {
        self.release.store(true, Ordering::SeqCst);
        self.driver.join().expect("the blocker's stream completes");
    }
}

fn block_worker(s: &Stream, log: &Log) -> Blocker {
    let started = Arc::new(AtomicBool::new(false));
    let release = Arc::new(AtomicBool::new(false));
    let (st, rel, log) = (started.clone(), release.clone(), log.clone());
    s.host_fn(move || {
        st.store(true, Ordering::SeqCst);
        while !rel.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        log.lock().expect("log").push('B');
    })
    .expect("blocker");
    let s = s.clone();
    let driver = std::thread::spawn(move || s.synchronize().expect("blocker"));
    while !started.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    Blocker { release, driver }
}

fn positions(log: &[char], tag: char) -> Vec<usize> {
    log.iter()
        .enumerate()
        .filter(|(_, c)| **c == tag)
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn high_priority_runs_first_without_preempting() {
    let dev = one_unit();
    let log: Log = Arc::default();
    // The blocker is the lowest priority: priority is a hint, it is not preempted.
    let blocker = dev.create_stream_with_priority(7).expect("stream");
    let low = dev.create_stream_with_priority(7).expect("stream");
    let high = dev.create_stream_with_priority(0).expect("stream");
    let release = block_worker(&blocker, &log);
    // Well below FULL_AGING: the low stream cannot age enough to run before the
    // high work is done.
    const N: usize = FULL_AGING / 2;
    // Low work is submitted first, so FIFO dispatch would run it first.
    for _ in 0..N {
        log_op(&low, &log, 'l');
    }
    for _ in 0..N {
        log_op(&high, &log, 'h');
    }
    release.release();
    dev.synchronize().expect("synchronize");
    let log = log.lock().expect("log").clone();
    let expected = [vec!['B'], vec!['h'; N], vec!['l'; N]].concat();
    assert_eq!(log, expected);
}

#[test]
fn low_priority_progresses_under_continuous_high_priority_work() {
    if common::skipped("low_priority_progresses_under_continuous_high_priority_work") {
        return;
    }
    let dev = one_unit();
    let log: Log = Arc::default();
    let blocker = dev.create_stream_with_priority(0).expect("stream");
    let low = dev.create_stream_with_priority(7).expect("stream");
    let high = dev.create_stream_with_priority(0).expect("stream");
    let release = block_worker(&blocker, &log);
    const LOW: usize = 5;
    // Enough high work queued that it cannot run dry before the low stream is done
    // (LOW low ops need at most LOW × FULL_AGING high dispatches), plus a submitter
    // that keeps adding more while it runs.
    let prefill = LOW * (FULL_AGING + 2) + 200;
    for _ in 0..LOW {
        log_op(&low, &log, 'l');
    }
    for _ in 0..prefill {
        log_op(&high, &log, 'h');
    }
    let low_done = Arc::new(AtomicUsize::new(0));
    let ld = low_done.clone();
    low.host_fn(move || ld.store(1, Ordering::SeqCst))
        .expect("host_fn");
    let extra = std::thread::scope(|scope| {
        let submitter = scope.spawn(|| {
            let mut n = 0usize;
            // Bounded: stops once the low stream finished, or after a cap that a
            // starving scheduler would hit (the log check below then fails).
            while low_done.load(Ordering::SeqCst) == 0 && n < 20 * prefill {
                log_op(&high, &log, 'h');
                n += 1;
            }
            n
        });
        release.release();
        low.synchronize().expect("low stream completes");
        submitter.join().expect("submitter")
    });
    dev.synchronize().expect("synchronize");
    let log = log.lock().expect("log").clone();
    let lows = positions(&log, 'l');
    assert_eq!(lows.len(), LOW);
    assert_eq!(low_done.load(Ordering::SeqCst), 1);
    // High work kept coming: the low stream finished with high work still queued.
    let highs_after = log[lows[LOW - 1]..].iter().filter(|c| **c == 'h').count();
    assert!(
        highs_after > 0,
        "the low stream only ran once high work ran dry"
    );
    // Each low op waited for aging (high priority first) but no longer (no
    // starvation): between low ops, about FULL_AGING high ops ran.
    let mut prev = positions(&log, 'B')[0];
    for (k, &p) in lows.iter().enumerate() {
        let highs = log[prev + 1..p].iter().filter(|c| **c == 'h').count();
        assert!(
            (FULL_AGING - 2..=FULL_AGING + 1).contains(&highs),
            "low op {k} ran after {highs} high ops (extra submitted: {extra}); log: {log:?}"
        );
        prev = p;
    }
}

#[test]
fn set_priority_at_run_time_changes_the_order() {
    if common::skipped("set_priority_at_run_time_changes_the_order") {
        return;
    }
    let dev = one_unit();
    let log: Log = Arc::default();
    let blocker = dev.create_stream_with_priority(0).expect("stream");
    let a = dev.create_stream_with_priority(7).expect("stream");
    let b = dev.create_stream_with_priority(0).expect("stream");
    let release = block_worker(&blocker, &log);
    const N: usize = 30;
    const SWAP_AT: usize = 10;
    for _ in 0..N {
        log_op(&a, &log, 'a');
    }
    for i in 0..N {
        if i == SWAP_AT {
            // The SWAP_AT-th op of `b` swaps the priorities while it runs; the
            // change takes effect at the next operation boundary.
            let (a2, b2, log2) = (a.clone(), b.clone(), log.clone());
            b.host_fn(move || {
                a2.set_priority(0).expect("priority");
                b2.set_priority(7).expect("priority");
                log2.lock().expect("log").push('S');
            })
            .expect("host_fn");
        }
        log_op(&b, &log, 'b');
    }
    release.release();
    dev.synchronize().expect("synchronize");
    assert_eq!(a.priority(), 0);
    assert_eq!(b.priority(), 7);
    let log = log.lock().expect("log").clone();
    let expected = [
        vec!['B'],
        vec!['b'; SWAP_AT],
        vec!['S'],
        vec!['a'; N],
        vec!['b'; N - SWAP_AT],
    ]
    .concat();
    assert_eq!(log, expected);
}
