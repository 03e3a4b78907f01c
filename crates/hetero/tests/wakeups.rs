//! Lost wake-up hunt: many small ops across streams joined by events, with engines
//! that park at once when idle (Block) and with the default (Auto), so every
//! hand-off goes through the futex path. A lost wake-up shows as a run that never
//! finishes; a watchdog turns that into a failure instead of a hung test. On
//! every backend (`HETERO_BACKEND`): the emulated device's hand-offs go through
//! its own driver and timelines.

mod common;

use hetero::CompletionMode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

const ROUNDS: u64 = 3000;

fn run(idle: CompletionMode, host: CompletionMode, units: usize, queues: usize) -> u64 {
    let dev = common::device_with(|c| {
        c.compute_units(units)
            .hardware_queues(queues)
            .engine_idle(idle)
            .host_wait(host)
    });
    let streams: Vec<_> = (0..4)
        .map(|_| dev.create_stream().expect("stream"))
        .collect();
    let counter = Arc::new(AtomicU64::new(0));
    for round in 0..ROUNDS {
        let s = &streams[(round % 4) as usize];
        let c = counter.clone();
        s.host_fn(move || {
            c.fetch_add(1, Ordering::Relaxed);
        })
        .expect("host_fn");
        let e = s.record_event().expect("record");
        let next = &streams[((round + 1) % 4) as usize];
        next.wait_event(&e).expect("wait");
        if round % 37 == 0 {
            s.synchronize().expect("synchronize");
        }
    }
    dev.synchronize().expect("device synchronize");
    counter.load(Ordering::Relaxed)
}

fn with_watchdog(name: &str, f: impl FnOnce() -> u64 + Send + 'static) -> u64 {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{name}: no progress for 60 s (a lost wake-up?)"))
}

#[test]
fn block_idle_engines_never_lose_a_wakeup() {
    for (units, queues) in [(1, 1), (2, 1), (2, 8), (3, 2)] {
        let n = with_watchdog("block", move || {
            run(CompletionMode::Block, CompletionMode::Block, units, queues)
        });
        assert_eq!(n, ROUNDS);
    }
}

#[test]
fn auto_idle_engines_never_lose_a_wakeup() {
    for (units, queues) in [(2, 1), (2, 8)] {
        let n = with_watchdog("auto", move || {
            run(
                CompletionMode::auto(),
                CompletionMode::auto(),
                units,
                queues,
            )
        });
        assert_eq!(n, ROUNDS);
    }
}
