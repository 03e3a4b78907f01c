//! `hetero bench events`: ns from the completion of work on one thread to the waiter
//! running on another — a spinning waiter and a parked waiter — beside a bare atomic
//! flag and std's park/unpark between two threads.
//!
//! Each sample's work busy-waits a little before completing, so the waiter is
//! already waiting (spinning or parked) when completion happens; the completing side
//! stamps the time as its last act and the waiter stamps it when it runs again.

use super::BenchReport;
use hetero::clock::now_ns;
use hetero::{CompletionMode, Device, DeviceConfig};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

fn busy(ns: u64) {
    let t = now_ns();
    while now_ns() - t < ns {
        std::hint::spin_loop();
    }
}

fn hetero_wait(mode: CompletionMode, samples: usize, lead_ns: u64) -> Vec<f64> {
    let dev = Device::new(
        DeviceConfig::default()
            .compute_units(1)
            .host_wait(mode)
            .engine_idle(CompletionMode::auto()),
    )
    .expect("host device");
    let s = dev.create_stream().expect("stream");
    let stamp = Arc::new(AtomicU64::new(0));
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples + samples / 10 {
        let st = stamp.clone();
        s.host_fn(move || {
            busy(lead_ns);
            st.store(now_ns(), Ordering::Release);
        })
        .expect("host_fn");
        // The host wait on the stream's timeline: the same path as Event::synchronize,
        // without a marker op between the work and the waiter.
        s.synchronize().expect("synchronize");
        let t1 = now_ns();
        if i >= samples / 10 {
            out.push(t1.saturating_sub(stamp.load(Ordering::Acquire)) as f64);
        }
    }
    out
}

/// The same hand-off with a bare atomic flag (spinning) or std park/unpark.
fn peer_wait(park: bool, samples: usize, lead_ns: u64) -> Vec<f64> {
    let go = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let stamp = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let waiter = std::thread::current();
    let (g, d, st, sp) = (go.clone(), done.clone(), stamp.clone(), stop.clone());
    let worker = std::thread::spawn(move || {
        let mut seen = 0;
        loop {
            let b = crossbeam_utils::Backoff::new();
            loop {
                let v = g.load(Ordering::Acquire);
                if v != seen {
                    seen = v;
                    break;
                }
                if sp.load(Ordering::Relaxed) {
                    return;
                }
                b.snooze();
            }
            busy(lead_ns);
            st.store(now_ns(), Ordering::Release);
            d.store(seen, Ordering::Release);
            if park {
                waiter.unpark();
            }
        }
    });
    let mut out = Vec::with_capacity(samples);
    for i in 1..=(samples + samples / 10) as u64 {
        go.store(i, Ordering::Release);
        while done.load(Ordering::Acquire) != i {
            if park {
                std::thread::park();
            } else {
                std::hint::spin_loop();
            }
        }
        let t1 = now_ns();
        if i as usize > samples / 10 {
            out.push(t1.saturating_sub(stamp.load(Ordering::Acquire)) as f64);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = worker.join();
    out
}

/// Process CPU time (user + system, all threads), ns.
fn cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Percent of one core an idle device uses once idle for 1 ms (default `Auto`).
fn idle_cpu_percent(samples: usize) -> Vec<f64> {
    let dev = Device::host().expect("host device");
    let s = dev.create_stream().expect("stream");
    (0..samples)
        .map(|_| {
            // Wake every engine with a burst of work, then leave the device idle.
            for _ in 0..64 {
                s.host_fn(|| ()).expect("host_fn");
            }
            s.synchronize().expect("synchronize");
            std::thread::sleep(std::time::Duration::from_millis(1));
            let (c0, t0) = (cpu_ns(), now_ns());
            std::thread::sleep(std::time::Duration::from_millis(20));
            let (c1, t1) = (cpu_ns(), now_ns());
            100.0 * (c1 - c0) as f64 / (t1 - t0) as f64
        })
        .collect()
}

pub fn run(quick: bool) -> BenchReport {
    let (spin_n, park_n) = if quick { (3_000, 600) } else { (20_000, 3_000) };
    let mut rep = BenchReport::new("events");
    let mut v = hetero_wait(CompletionMode::Spin, spin_n, 20_000);
    rep.push_samples("hetero/event-wait-spin", "ns", &mut v);
    let mut v = peer_wait(false, spin_n, 20_000);
    rep.push_samples("atomic-flag/wait-spin", "ns", &mut v);
    let mut v = hetero_wait(CompletionMode::Block, park_n, 50_000);
    rep.push_samples("hetero/event-wait-block", "ns", &mut v);
    let mut v = peer_wait(true, park_n, 50_000);
    rep.push_samples("std-park/wait-block", "ns", &mut v);
    let mut v = idle_cpu_percent(if quick { 10 } else { 50 });
    rep.push_samples("hetero/idle-device-cpu", "%", &mut v);
    rep.ratio_of("hetero/event-wait-spin", "atomic-flag/wait-spin");
    rep.ratio_of("hetero/event-wait-block", "std-park/wait-block");
    rep
}
