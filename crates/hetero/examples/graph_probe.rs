//! Scratch probe: where a chain replay's time goes (engine time vs latency).
use hetero::{CommandBuffer, Device, Grid, Kernel};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let mut cfg = hetero::DeviceConfig::from_env().expect("env");
    match std::env::var("WAIT").as_deref() {
        Ok("block") => cfg = cfg.host_wait(hetero::CompletionMode::Block),
        Ok("spin") => cfg = cfg.host_wait(hetero::CompletionMode::Spin),
        Ok("long") => {
            cfg = cfg.host_wait(hetero::CompletionMode::Auto {
                spin: std::time::Duration::from_millis(2),
            })
        }
        Ok("engspin") => cfg = cfg.engine_idle(hetero::CompletionMode::Spin),
        _ => {}
    }
    if std::env::var_os("NOPIN").is_some() {
        cfg = cfg.pin_engines(false);
    }
    if let Some(units) = std::env::var("UNITS").ok().and_then(|u| u.parse().ok()) {
        cfg = cfg.compute_units(units);
    }
    let dev = Device::new(cfg).unwrap();
    let s = dev.create_stream().unwrap();
    let k = Kernel::new("empty", |_| {});
    let epoch = Instant::now();
    let t0 = Arc::new(AtomicU64::new(0));
    let t1 = Arc::new(AtomicU64::new(0));
    let cb = CommandBuffer::new(&dev).unwrap();
    let a = t0.clone();
    cb.host_callback(move || a.store(epoch.elapsed().as_nanos() as u64, Ordering::Relaxed))
        .unwrap();
    let nodes: usize = std::env::var("NODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    for _ in 0..nodes {
        cb.launch(&k, Grid::new(1), &[]).unwrap();
    }
    let b = t1.clone();
    cb.host_callback(move || b.store(epoch.elapsed().as_nanos() as u64, Ordering::Relaxed))
        .unwrap();
    let exec = cb.finish().unwrap();
    let mut inside = Vec::new();
    let mut total = Vec::new();
    let mut start_lat = Vec::new();
    for _ in 0..200 {
        let st = epoch.elapsed().as_nanos() as u64;
        if std::env::var_os("OPS").is_some() {
            let a = t0.clone();
            s.host_callback(move || a.store(epoch.elapsed().as_nanos() as u64, Ordering::Relaxed))
                .unwrap();
            for _ in 0..nodes {
                s.launch(&k, Grid::new(1), &[]).unwrap();
            }
            let b = t1.clone();
            s.host_callback(move || b.store(epoch.elapsed().as_nanos() as u64, Ordering::Relaxed))
                .unwrap();
        } else {
            s.launch_graph(&exec).unwrap();
        }
        s.synchronize().unwrap();
        let en = epoch.elapsed().as_nanos() as u64;
        let (a, b) = (t0.load(Ordering::Relaxed), t1.load(Ordering::Relaxed));
        inside.push((b - a) as f64);
        total.push((en - st) as f64);
        start_lat.push((a - st) as f64);
    }
    for v in [&mut inside, &mut total, &mut start_lat] {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    println!(
        "inside {:.0} ns, total {:.0} ns, start latency {:.0} ns (medians)",
        inside[100], total[100], start_lat[100]
    );
}
