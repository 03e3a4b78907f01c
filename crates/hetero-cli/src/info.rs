//! `hetero info`: what this machine offers the runtime, the backends and the
//! emulated device's link presets.

use crate::device::DeviceSpec;
use hetero::{Context, LinkPreset, PeerLink, PeerPath, SystemInfo, Topology, WakeLatency};
use serde_json::{json, Value};

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

fn peer_json(p: &PeerLink) -> Value {
    json!({
        "name": p.name,
        "setup_ns": p.setup_ns,
        "gbps": p.gbps,
        "bidir_gbps": p.bidir_gbps,
        "source": p.source,
    })
}

/// A context's topology as JSON: its devices and every pair's path.
pub fn topology_json(t: &Topology) -> Value {
    json!({
        "devices": t.devices.iter().map(|d| json!({
            "id": d.id, "name": d.name, "backend": d.backend,
        })).collect::<Vec<_>>(),
        "pairs": t.pairs.iter().map(|p| json!({
            "a": p.a,
            "b": p.b,
            "path": p.path.describe(),
            "link": match &p.path { PeerPath::Link(l) => peer_json(l), _ => Value::Null },
            "reason": match &p.path { PeerPath::Staged { reason } => json!(reason), _ => Value::Null },
        })).collect::<Vec<_>>(),
    })
}

/// Opens the devices `list` names (`--devices`) in one context with
/// `peer_link` (a preset name, or `none`) between emulated pairs.
pub fn open_context(list: &str, peer_link: &str) -> Result<Context, String> {
    let link = match peer_link {
        "none" => None,
        name => Some(PeerLink::by_name(name).ok_or_else(|| {
            format!(
                "--peer-link {name:?} is not a preset; use one of {} or none",
                PeerLink::names().join(", ")
            )
        })?),
    };
    let devices = DeviceSpec::parse_list(list)?
        .iter()
        .map(|s| s.open())
        .collect::<hetero::Result<Vec<_>>>()
        .map_err(|e| e.to_string())?;
    Context::with_peer_link(&devices, link).map_err(|e| e.to_string())
}

fn print_topology(t: &Topology) {
    println!("  context               {} devices", t.devices.len());
    for d in &t.devices {
        println!("    device {:<3} {}", d.id, d.name);
    }
    for p in &t.pairs {
        let detail = match &p.path {
            PeerPath::Link(l) => format!(
                "{:.1} GB/s one way, {:.1} each way both at once, setup {:.1} us",
                l.gbps,
                l.bidir_gbps,
                l.setup_ns as f64 / 1e3
            ),
            PeerPath::SharedMemory => "one copy in host memory".into(),
            PeerPath::Staged { reason } => format!("through pinned host memory: {reason}"),
        };
        println!("    {} <-> {}  {}  ({detail})", p.a, p.b, p.path.describe());
    }
}

/// The probe as JSON (with `wake` from [`SystemInfo::wake_latency`]).
pub fn to_json(s: &SystemInfo, wake: Option<WakeLatency>) -> Value {
    json!({
        "wake_after_idle_us": wake.map(|w| json!({
            "idle_us": WakeLatency::IDLE.as_micros() as u64,
            "p50": w.p50_us, "p90": w.p90_us, "p99": w.p99_us, "max": w.max_us,
        })),
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
        "vulkan": vulkan_json(),
        "emu_presets": LinkPreset::all().iter().map(preset_json).collect::<Vec<_>>(),
        "peer_links": PeerLink::all().iter().map(peer_json).collect::<Vec<_>>(),
    })
}

/// The Vulkan devices as JSON: each one's main properties and queue plan, or
/// why there are none.
fn vulkan_json() -> Value {
    match hetero::vulkan::devices() {
        Ok(devices) => json!(devices
            .iter()
            .map(|d| json!({
                "index": d.index,
                "name": d.name,
                "driver": format!("{} {}", d.driver_name, d.driver_info),
                "type": d.device_type.to_string(),
                "api_version": d.api_version.to_string(),
                "queue_families": d.queue_families.len(),
                "queue_plan": hetero::vulkan::QueuePlan::choose(&d.queue_families)
                    .map(|p| p.to_string()),
                "heaps_bytes": d.memory_heaps.iter().map(|h| h.size).collect::<Vec<_>>(),
                "details": d.to_string(),
            }))
            .collect::<Vec<_>>()),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

/// Prints the Vulkan devices (what `--device vulkan:INDEX` opens), or why
/// there are none.
fn print_vulkan() {
    match hetero::vulkan::devices() {
        Ok(devices) => {
            println!("  vulkan devices        (--device vulkan:INDEX)");
            for d in &devices {
                for line in d.to_string().lines() {
                    println!("    {line}");
                }
                match hetero::vulkan::QueuePlan::choose(&d.queue_families) {
                    Some(plan) => println!("    queue plan: {plan}"),
                    None => println!("    queue plan: none (no queue family runs compute work)"),
                }
            }
        }
        Err(e) => println!("  vulkan devices        none: {e}"),
    }
}

/// Prints the probe as text or JSON; with `context` (from `--devices`), its
/// topology too.
pub fn print(json_out: bool, context: Option<&Context>) {
    let s = SystemInfo::probe();
    let wake = SystemInfo::wake_latency();
    if json_out {
        let mut v = to_json(&s, wake);
        if let Some(c) = context {
            v["context"] = topology_json(c.topology());
        }
        println!("{v}");
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
    match wake {
        Some(w) => println!(
            "  wake-up latency       p50 {:.0} us, p90 {:.0}, p99 {:.0}, max {:.0} (a thread parked \
             {} ms on another core, {} samples: what parking an engine costs here)",
            w.p50_us,
            w.p90_us,
            w.p99_us,
            w.max_us,
            WakeLatency::IDLE.as_millis(),
            WakeLatency::SAMPLES
        ),
        None => println!("  wake-up latency       not measured (no thread could be started)"),
    }
    println!("  backends              {}", s.backends.join(", "));
    print_vulkan();
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
    println!("  peer links            (--peer-link NAME between emulated devices of a context)");
    for p in PeerLink::all() {
        println!(
            "    {:<18} {:6.1} GB/s one way, {:6.1} each way both at once, setup {:.1} us",
            p.name,
            p.gbps,
            p.bidir_gbps,
            p.setup_ns as f64 / 1e3
        );
        println!("    {:<18} source: {}", "", p.source);
    }
    if let Some(c) = context {
        print_topology(c.topology());
    }
}
