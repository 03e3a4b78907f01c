//! The one place tests decide whether Vulkan is there. Without a loader or device
//! they print why and skip, unless `HETERO_REQUIRE_VULKAN=1` (CI), where that fails.
//! `HETERO_VULKAN_DEVICE` picks the device index (default 0).

#![allow(dead_code)]

use hetero_vulkan::{CacheLocation, Gpu, Instance, OpenOptions};

fn required() -> bool {
    std::env::var("HETERO_REQUIRE_VULKAN").is_ok_and(|v| v == "1")
}

pub fn device_index() -> usize {
    std::env::var("HETERO_VULKAN_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The instance, or None (after printing why) when Vulkan is missing. The
/// first one is kept for the whole run: while an instance lives, the loader
/// keeps the drivers loaded; unloading Mesa's drivers leaks an allocation of
/// their once-initialisation each time (LeakSanitizer under `ci/asan.sh`).
/// Tests that need instances of their own still make them.
pub fn instance() -> Option<Instance> {
    static KEPT: std::sync::Mutex<Option<Instance>> = std::sync::Mutex::new(None);
    match Instance::load() {
        Ok(i) => {
            KEPT.lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| i.clone());
            Some(i)
        }
        Err(e) if required() => panic!("HETERO_REQUIRE_VULKAN=1 but Vulkan is unavailable: {e}"),
        Err(e) => {
            eprintln!("skipping: Vulkan is unavailable ({e})");
            None
        }
    }
}

/// A device opened with `options` (the disk cache off unless the options say otherwise).
pub fn gpu_with(options: &OpenOptions) -> Option<Gpu> {
    let instance = instance()?;
    match Gpu::open_with(&instance, device_index(), options) {
        Ok(g) => Some(g),
        Err(e) if required() => panic!("HETERO_REQUIRE_VULKAN=1 but the device did not open: {e}"),
        Err(e) => {
            eprintln!("skipping: the Vulkan device did not open ({e})");
            None
        }
    }
}

/// A device with default options, the disk pipeline cache kept in memory.
pub fn gpu() -> Option<Gpu> {
    gpu_with(&OpenOptions {
        cache: CacheLocation::Off,
        ..OpenOptions::default()
    })
}

/// A fresh directory under the target's temp dir.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("hetero-vulkan-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create a temp dir");
    d
}
