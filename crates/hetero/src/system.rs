//! What the machine offers a runtime: cores, memory, huge pages, the memlock limit
//! and whether pinning actually works. Read from /proc and /sys and by trying.

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

impl SystemInfo {
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
            backends: vec!["host", "emu"],
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
        assert_eq!(s.backends, vec!["host", "emu"]);
    }
}
