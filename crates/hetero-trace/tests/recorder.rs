//! The global recorder through its public API: several threads record and
//! one takes; threads that exit keep their records; off means nothing kept.
//!
//! The recorder is process-wide, so these tests serialize on a lock and each
//! uses its own stream ids.

use std::sync::Mutex;

use hetero_trace::{EngineKind, MemKind, MemRecord, OpKind, OpRecord, TraceClock};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn op(stream: u64, seq: u64) -> OpRecord {
    let t = hetero_trace::now_ns();
    OpRecord {
        kind: OpKind::Kernel,
        name: "k",
        stream,
        queue: 0,
        engine: EngineKind::Compute,
        engine_index: 0,
        seq,
        submit_ns: t,
        start_ns: t,
        end_ns: t + 1,
        bytes: 0,
        dep: None,
        failed: false,
        node: None,
    }
}

fn mem(stream: u64, bytes: u64) -> MemRecord {
    MemRecord {
        kind: MemKind::Alloc,
        ts_ns: hetero_trace::now_ns(),
        bytes,
        stream,
        reserved: 0,
        allocated: bytes,
    }
}

#[test]
fn recorder_multi_thread_record_and_take() {
    let _g = serial();
    hetero_trace::take();
    hetero_trace::set_enabled(true);
    const THREADS: u64 = 4;
    const PER: u64 = 2_000; // several chunks per thread
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..PER {
                    hetero_trace::record_op(op(100 + t, i));
                }
                hetero_trace::record_mem(mem(100 + t, 64));
            })
        })
        .collect();
    // Take concurrently with the writers, then again after they finish.
    let first = hetero_trace::take();
    let mut ops = first.ops;
    let mut mem_all = first.mem;
    for h in handles {
        h.join().expect("recording thread");
    }
    hetero_trace::set_enabled(false);
    let rest = hetero_trace::take();
    ops.extend(rest.ops.iter().copied());
    mem_all.extend(rest.mem.iter().copied());
    for t in 0..THREADS {
        let mut seqs: Vec<u64> = ops
            .iter()
            .filter(|o| o.stream == 100 + t)
            .map(|o| o.seq)
            .collect();
        seqs.sort_unstable();
        assert_eq!(
            seqs,
            (0..PER).collect::<Vec<_>>(),
            "thread {t}: each record exactly once"
        );
    }
    let mems = mem_all
        .iter()
        .filter(|m| (100..100 + THREADS).contains(&m.stream))
        .count();
    assert_eq!(mems as u64, THREADS);
    // The trace is sorted by time.
    assert!(rest.ops.windows(2).all(|w| w[0].start_ns <= w[1].start_ns));
}

#[test]
fn recorder_keeps_records_of_exited_threads() {
    let _g = serial();
    hetero_trace::take();
    hetero_trace::set_enabled(true);
    std::thread::spawn(|| {
        for i in 0..300 {
            hetero_trace::record_op(op(200, i));
        }
    })
    .join()
    .expect("recording thread");
    hetero_trace::set_enabled(false);
    let trace = hetero_trace::take();
    assert_eq!(trace.ops.iter().filter(|o| o.stream == 200).count(), 300);
    // Taken once: gone afterwards.
    let again = hetero_trace::take();
    assert_eq!(again.ops.iter().filter(|o| o.stream == 200).count(), 0);
}

#[test]
fn recorder_disabled_records_nothing() {
    let _g = serial();
    hetero_trace::set_enabled(false);
    hetero_trace::take();
    assert!(!hetero_trace::enabled());
    hetero_trace::record_op(op(300, 1));
    hetero_trace::record_mem(mem(300, 1));
    hetero_trace::set_enabled(true);
    assert!(hetero_trace::enabled());
    hetero_trace::record_op(op(300, 2));
    hetero_trace::set_enabled(false);
    hetero_trace::record_op(op(300, 3));
    let trace = hetero_trace::take();
    let seqs: Vec<u64> = trace
        .ops
        .iter()
        .filter(|o| o.stream == 300)
        .map(|o| o.seq)
        .collect();
    assert_eq!(seqs, vec![2]);
    assert!(trace.mem.iter().all(|m| m.stream != 300));
}

#[test]
fn recorder_names_and_clock() {
    let _g = serial();
    hetero_trace::set_device_name("host (test)");
    hetero_trace::set_stream_name(400, "copy-in".to_string());
    let a = hetero_trace::now_ns();
    let b = hetero_trace::now_ns();
    assert!(a <= b);
    let trace = hetero_trace::take();
    assert_eq!(trace.device_name, "host (test)");
    assert_eq!(
        trace.stream_names.get(&400).map(String::as_str),
        Some("copy-in")
    );
    assert_eq!(trace.stream_label(400), "stream 400 (copy-in)");
}

#[test]
fn recorder_clock_is_wall_until_set_and_kept_across_take() {
    let _g = serial();
    assert_eq!(hetero_trace::take().clock, TraceClock::Wall);
    hetero_trace::set_clock(TraceClock::Virtual);
    assert_eq!(hetero_trace::take().clock, TraceClock::Virtual);
    assert_eq!(hetero_trace::take().clock, TraceClock::Virtual, "kept");
    hetero_trace::set_clock(TraceClock::Wall);
    assert_eq!(hetero_trace::take().clock, TraceClock::Wall);
}

/// The recorder holds at most its bound of records until a take (a long
/// run with profiling on grew without bound until the process was killed):
/// past it records are dropped and counted, within a thread's budget of the
/// bound; a take starts the bound afresh.
#[test]
fn recorder_holds_its_bound_and_counts_what_it_drops() {
    let _g = serial();
    hetero_trace::take();
    const MAX: usize = 4_096;
    hetero_trace::set_max_records(MAX);
    hetero_trace::set_enabled(true);
    const THREADS: u64 = 3;
    const PER: u64 = 5_000;
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..PER {
                    hetero_trace::record_op(op(300 + t, i));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("recording thread");
    }
    let cut = hetero_trace::take();
    let kept = cut
        .ops
        .iter()
        .filter(|o| (300..300 + THREADS).contains(&o.stream))
        .count();
    assert!(
        kept <= MAX && kept >= MAX - 256 * THREADS as usize,
        "kept {kept} of a bound of {MAX}"
    );
    assert_eq!(
        kept as u64 + cut.dropped,
        THREADS * PER,
        "every record kept or counted"
    );
    // Afresh after the take: a new thread's records are kept again.
    std::thread::spawn(|| {
        for i in 0..100 {
            hetero_trace::record_op(op(400, i));
        }
    })
    .join()
    .expect("recording thread");
    hetero_trace::set_enabled(false);
    let again = hetero_trace::take();
    assert_eq!(again.ops.iter().filter(|o| o.stream == 400).count(), 100);
    assert_eq!(again.dropped, 0);
    hetero_trace::set_max_records(hetero_trace::DEFAULT_MAX_RECORDS);
}
