//! What the machine offers a runtime: cores, memory, huge pages, the memlock limit
//! and whether pinning actually works, read from /proc and /sys and by trying;
//! and what parking a thread costs here (`SystemInfo::wake_latency`, measured).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Facts about the host, probed at call time.
#[derive(Debug, Clone)]
pub struct SystemInfo {
    /// Cores available to this process.
    pub cores: usize,
    /// Total memory in bytes (`MemTotal`), if readable.
    pub mem_total_bytes: Option<u64>,
    /// Available memory in bytes (`MemAvailable`), if readable.
    pub mem_available_bytes: Option<u64>,
    /// Transparent huge pages mode (the bracketed word of
    /// /sys/kernel/mm/transparent_hugepage/enabled: always, madvise or never).
    pub thp_mode: Option<String>,
    /// hugetlb pages reserved (/proc/sys/vm/nr_hugepages).
    pub hugepages_reserved: Option<u64>,
    /// hugetlb pages free now (`HugePages_Free`).
    pub hugepages_free: Option<u64>,
    /// The default huge page size in bytes (`Hugepagesize`).
    pub hugepage_size_bytes: Option<u64>,
    /// RLIMIT_MEMLOCK soft limit in bytes (`None`: unlimited).
    pub memlock_limit_bytes: Option<u64>,
    /// Whether mlock of one page beyond nothing succeeded, and the error if not.
    pub mlock: Result<(), String>,
    /// The backends this build can create devices on.
    pub backends: Vec<&'static str>,
}

fn meminfo(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let mut parts = line[key.len()..].trim_start_matches(':').split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    Some(match parts.next() {
        Some("kB") => n * 1024,
        _ => n,
    })
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The bracketed choice of a sysfs selector such as `always [madvise] never`.
fn selected(path: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let start = text.find('[')? + 1;
    let end = text[start..].find(']')? + start;
    Some(text[start..end].to_string())
}

fn try_mlock() -> Result<(), String> {
    let layout = std::alloc::Layout::from_size_align(4096, 4096).map_err(|e| e.to_string())?;
    // SAFETY: non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err("could not allocate a page to test".into());
    }
    // SAFETY: `p` is a live 4 KiB allocation owned here.
    let r = unsafe { rustix::mm::mlock(p.cast(), 4096) };
    if r.is_ok() {
        // SAFETY: the same range was locked just above.
        let _ = unsafe { rustix::mm::munlock(p.cast(), 4096) };
    }
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(p, layout) };
    r.map_err(|e| e.to_string())
}

/// Pins the calling thread to the `n`-th CPU (modulo) this process may run on, so
/// that compute units stay spread one per core: left to the OS, two engines of a
/// 2-core VM were seen queued on one vCPU while the other idled. Best effort: if
/// the affinity cannot be read or set, or only one CPU is allowed, the thread
/// floats as before.
pub(crate) fn pin_to_nth_allowed_cpu(n: usize) {
    let Ok(allowed) = rustix::thread::sched_getaffinity(None) else {
        return;
    };
    let cpus: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| allowed.is_set(c))
        .collect();
    if cpus.len() < 2 {
        return;
    }
    let mut one = rustix::thread::CpuSet::new();
    one.set(cpus[n % cpus.len()]);
    if let Err(e) = rustix::thread::sched_setaffinity(None, &one) {
        tracing::debug!("could not pin thread to allowed CPU {n}: {e}");
    }
}

/// How long a parked thread on another core took to run again after it was
/// unparked (µs), over [`WakeLatency::SAMPLES`] wake-ups each after
/// [`WakeLatency::IDLE`] of quiet.
#[derive(Debug, Clone, Copy)]
pub struct WakeLatency {
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl WakeLatency {
    /// The quiet before each wake-up: long enough for the waiter's core to go
    /// idle (a VM's vCPU halts), as an engine's does between bursts of work.
    pub const IDLE: Duration = Duration::from_millis(2);
    pub const SAMPLES: usize = 100;
}

impl SystemInfo {
    /// Measures what a runtime pays each time it parks an engine and needs it
    /// back: a thread on the first allowed CPU parks, and the caller, on the
    /// second (its own affinity restored afterwards), unparks it after
    /// [`WakeLatency::IDLE`]. On the 2-vCPU VM the median was ~100 µs and the
    /// tail moved with the host's load, from ~0.15 ms to over 10 ms. Takes
    /// about `SAMPLES × IDLE` (0.2 s); `None` if the waiter thread could not
    /// start.
    pub fn wake_latency() -> Option<WakeLatency> {
        let base = Instant::now();
        let ns = move || base.elapsed().as_nanos() as u64;
        // When the caller unparked (ns since `base`); 0 once the waiter took it.
        let signal = Arc::new(AtomicU64::new(0));
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let waiter = {
            let signal = Arc::clone(&signal);
            std::thread::Builder::new()
                .name("hetero-wake-probe".into())
                .spawn(move || {
                    pin_to_nth_allowed_cpu(0);
                    for _ in 0..WakeLatency::SAMPLES {
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
                .ok()?
        };
        let saved = rustix::thread::sched_getaffinity(None).ok();
        pin_to_nth_allowed_cpu(1);
        let mut lat = Vec::with_capacity(WakeLatency::SAMPLES);
        for _ in 0..WakeLatency::SAMPLES {
            std::thread::sleep(WakeLatency::IDLE);
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
            return None;
        }
        lat.sort_by(f64::total_cmp);
        let at = |q: f64| lat[((lat.len() - 1) as f64 * q).round() as usize];
        Some(WakeLatency {
            p50_us: at(0.5),
            p90_us: at(0.9),
            p99_us: at(0.99),
            max_us: at(1.0),
        })
    }

    /// Probes the machine now.
    pub fn probe() -> SystemInfo {
        let memlock = rustix::process::getrlimit(rustix::process::Resource::Memlock).current;
        SystemInfo {
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            mem_total_bytes: meminfo("MemTotal"),
            mem_available_bytes: meminfo("MemAvailable"),
            thp_mode: selected("/sys/kernel/mm/transparent_hugepage/enabled"),
            hugepages_reserved: read_u64("/proc/sys/vm/nr_hugepages"),
            hugepages_free: meminfo("HugePages_Free"),
            hugepage_size_bytes: meminfo("Hugepagesize"),
            memlock_limit_bytes: memlock,
            mlock: try_mlock(),
            backends: if cfg!(feature = "vulkan") {
                vec!["host", "emu", "vulkan"]
            } else {
                vec!["host", "emu"]
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_reads_the_machine() {
        let s = SystemInfo::probe();
        assert!(s.cores >= 1);
        assert!(s.mem_total_bytes.unwrap_or(1) > 0);
        assert_eq!(&s.backends[..2], &["host", "emu"]);
        assert_eq!(s.backends.contains(&"vulkan"), cfg!(feature = "vulkan"));
    }

    #[test]
    fn wake_latency_is_measured_in_order() {
        let w = SystemInfo::wake_latency().expect("a waiter thread");
        assert!(w.p50_us > 0.0, "{w:?}");
        assert!(
            w.p50_us <= w.p90_us && w.p90_us <= w.p99_us && w.p99_us <= w.max_us,
            "{w:?}"
        );
    }
}
