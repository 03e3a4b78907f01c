//! `hetero info`: what this machine offers the runtime, the backends and the
//! emulated device's link presets.

use hetero::{LinkPreset, SystemInfo};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the waker idles before each wake-up: long enough for the waiter's
/// core to go idle (a VM's vCPU halts), as an engine's does between bursts.
const WAKE_IDLE: Duration = Duration::from_millis(2);
const WAKE_SAMPLES: usize = 100;

/// Wake-up latency of a parked thread on another core after [`WAKE_IDLE`] of
/// quiet (unpark to running, µs): p50, p90, p99 and max of [`WAKE_SAMPLES`].
/// This is what a runtime pays each time it parks an engine and needs it
/// back; on the 2-vCPU VM the median was ~100 µs and the tail moved with the
/// host's load, from ~1 ms to over 10 ms.
pub fn wake_latency_us() -> [f64; 4] {
    let allowed: Vec<usize> = rustix::thread::sched_getaffinity(None)
        .map(|set| {
            (0..rustix::thread::CpuSet::MAX_CPU)
                .filter(|&c| set.is_set(c))
                .collect()
        })
        .unwrap_or_default();
    let allowed = Arc::new(allowed);
    let pin = move |i: usize| {
        if allowed.len() >= 2 {
            let mut one = rustix::thread::CpuSet::new();
            one.set(allowed[i]);
            let _ = rustix::thread::sched_setaffinity(None, &one);
        }
    };
    let base = Instant::now();
    let ns = move || base.elapsed().as_nanos() as u64;
    // `signal`: when the waker unparked (ns since `base`), 0 once the waiter
    // took it; the waiter pushes the latency.
    let signal = Arc::new(AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    let waiter = {
        let signal = Arc::clone(&signal);
        let pin = pin.clone();
        std::thread::spawn(move || {
            pin(0);
            for _ in 0..WAKE_SAMPLES {
                let sent = loop {
                    match signal.swap(0, Ordering::AcqRel) {
                        0 => std::thread::park(),
                        t => break t,
                    }
                };
                if tx.send(ns().saturating_sub(sent)).is_err() {
                    return;
                }
            }
        })
    };
    let saved = rustix::thread::sched_getaffinity(None).ok();
    pin(1);
    let mut lat = Vec::with_capacity(WAKE_SAMPLES);
    for _ in 0..WAKE_SAMPLES {
        std::thread::sleep(WAKE_IDLE);
        // A moment of work, so that this core is awake when it signals.
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(50) {
            std::hint::spin_loop();
        }
        signal.store(ns().max(1), Ordering::Release);
        waiter.thread().unpark();
        match rx.recv() {
            Ok(l) => lat.push(l as f64 / 1e3),
            Err(_) => break,
        }
    }
    if let Some(set) = saved {
        let _ = rustix::thread::sched_setaffinity(None, &set);
    }
    let _ = waiter.join();
    if lat.is_empty() {
        return [f64::NAN; 4];
    }
    lat.sort_by(f64::total_cmp);
    let at = |q: f64| lat[((lat.len() - 1) as f64 * q).round() as usize];
    [at(0.5), at(0.9), at(0.99), at(1.0)]
}

fn gib(b: Option<u64>) -> String {
    b.map_or("unknown".into(), |b| {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    })
}

fn preset_json(p: &LinkPreset) -> Value {
    json!({
        "name": p.name,
        "setup_ns": p.setup_ns,
        "h2d_gbps": p.h2d_gbps,
        "d2h_gbps": p.d2h_gbps,
        "bidir_h2d_gbps": p.bidir_h2d_gbps,
        "bidir_d2h_gbps": p.bidir_d2h_gbps,
        "d2d_gbps": p.d2d_gbps,
        "memory_gbps": p.memory_gbps,
        "peak_gbps": p.peak_gbps(),
        "source": p.source,
    })
}

/// The probe as JSON (with `wake` from [`wake_latency_us`]).
pub fn to_json(s: &SystemInfo, wake: [f64; 4]) -> Value {
    json!({
        "wake_after_idle_us": {
            "idle_us": WAKE_IDLE.as_micros() as u64,
            "p50": wake[0], "p90": wake[1], "p99": wake[2], "max": wake[3],
        },
        "cores": s.cores,
        "mem_total_bytes": s.mem_total_bytes,
        "mem_available_bytes": s.mem_available_bytes,
        "thp_mode": s.thp_mode,
        "hugepages_reserved": s.hugepages_reserved,
        "hugepages_free": s.hugepages_free,
        "hugepage_size_bytes": s.hugepage_size_bytes,
        "memlock_limit_bytes": s.memlock_limit_bytes,
        "mlock_works": s.mlock.is_ok(),
        "mlock_error": s.mlock.as_ref().err(),
        "backends": s.backends,
        "emu_presets": LinkPreset::all().iter().map(preset_json).collect::<Vec<_>>(),
    })
}

/// Prints the probe as text or JSON.
pub fn print(json_out: bool) {
    let s = SystemInfo::probe();
    let wake = wake_latency_us();
    if json_out {
        println!("{}", to_json(&s, wake));
        return;
    }
    println!("hetero info");
    println!("  cores                 {}", s.cores);
    println!(
        "  memory                {} total, {} available",
        gib(s.mem_total_bytes),
        gib(s.mem_available_bytes)
    );
    println!(
        "  transparent huge pages {}",
        s.thp_mode.as_deref().unwrap_or("unknown")
    );
    println!(
        "  hugetlb pages         {} reserved, {} free, {} KiB each{}",
        s.hugepages_reserved.map_or("?".into(), |n| n.to_string()),
        s.hugepages_free.map_or("?".into(), |n| n.to_string()),
        s.hugepage_size_bytes
            .map_or("?".into(), |n| (n / 1024).to_string()),
        if s.hugepages_reserved == Some(0) {
            " (pools fall back to transparent huge pages; reserve with /proc/sys/vm/nr_hugepages)"
        } else {
            ""
        }
    );
    println!(
        "  memlock limit         {}",
        s.memlock_limit_bytes
            .map_or("unlimited".into(), |b| format!("{} KiB", b / 1024))
    );
    match &s.mlock {
        Ok(()) => println!("  mlock                 works"),
        Err(e) => println!(
            "  mlock                 refused ({e}); pinned memory falls back to unpinned pages"
        ),
    }
    println!(
        "  wake-up latency       p50 {:.0} us, p90 {:.0}, p99 {:.0}, max {:.0} (a thread parked \
         {} ms on another core, {WAKE_SAMPLES} samples: what parking an engine costs here)",
        wake[0],
        wake[1],
        wake[2],
        wake[3],
        WAKE_IDLE.as_millis()
    );
    println!("  backends              {}", s.backends.join(", "));
    println!("  emu presets           (--device emu:PRESET; GB/s alone, both at once)");
    for p in LinkPreset::all() {
        println!(
            "    {:<10} h2d {:5.1}  d2h {:5.1}  both {:5.1} / {:5.1}  setup {:.1} us  \
             memory {:.0}",
            p.name,
            p.h2d_gbps,
            p.d2h_gbps,
            p.bidir_h2d_gbps,
            p.bidir_d2h_gbps,
            p.setup_ns as f64 / 1e3,
            p.memory_gbps
        );
        println!("    {:<10} source: {}", "", p.source);
    }
}
