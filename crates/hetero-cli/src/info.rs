//! `hetero info`: what this machine offers the runtime.

use hetero::SystemInfo;
use serde_json::{json, Value};

fn gib(b: Option<u64>) -> String {
    b.map_or("unknown".into(), |b| {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    })
}

/// The probe as JSON.
pub fn to_json(s: &SystemInfo) -> Value {
    json!({
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
    })
}

/// Prints the probe as text or JSON.
pub fn print(json_out: bool) {
    let s = SystemInfo::probe();
    if json_out {
        println!("{}", to_json(&s));
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
    println!("  backends              {}", s.backends.join(", "));
}
