//! The pipeline cache on disk: one `VkPipelineCache` per device, loaded at open
//! from a file named by the device's vendor id, device id and pipelineCacheUUID,
//! and saved when the device closes (or on request).
//!
//! Directory: `$HETERO_VULKAN_CACHE_DIR`, else `$XDG_CACHE_HOME/hetero/vulkan`,
//! else `~/.cache/hetero/vulkan`. A file that is unreadable, too short, or whose
//! header names another device or driver build is ignored with a warning (drivers
//! are meant to check this themselves; some crash instead). Saving writes a
//! temporary file and renames it, so concurrent processes never see half a file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use ash::vk;

use crate::error::{call, Result, VkError};
use crate::info::DeviceInfo;

/// Where the disk pipeline cache lives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CacheLocation {
    /// `$HETERO_VULKAN_CACHE_DIR`, else `$XDG_CACHE_HOME/hetero/vulkan`, else
    /// `~/.cache/hetero/vulkan`; no disk cache when none of these can be found.
    #[default]
    Default,
    /// This directory.
    Dir(PathBuf),
    /// Keep the cache in memory only.
    Off,
}

/// The version-one header every `VkPipelineCache` blob starts with.
const HEADER_LEN: usize = 16 + 16;

/// Where the cache came from at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheStatus {
    /// The file it is loaded from and saved to (None: memory only).
    pub path: Option<PathBuf>,
    /// Bytes of cache data handed to the driver at open (0: started empty).
    pub loaded_bytes: usize,
    /// Why a file that was there was not used.
    pub warning: Option<String>,
}

pub(crate) struct PipelineCacheStore {
    pub(crate) handle: vk::PipelineCache,
    status: CacheStatus,
}

/// The cache directory for `location`, if any.
pub fn cache_dir(location: &CacheLocation) -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    match location {
        CacheLocation::Off => None,
        CacheLocation::Dir(d) => Some(d.clone()),
        CacheLocation::Default => env("HETERO_VULKAN_CACHE_DIR")
            .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("hetero").join("vulkan")))
            .or_else(|| env("HOME").map(|d| d.join(".cache").join("hetero").join("vulkan"))),
    }
}

/// The file name for a device: vendor, device, and the driver's cache UUID.
pub(crate) fn file_name(info: &DeviceInfo) -> String {
    let uuid: String = info
        .pipeline_cache_uuid
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{:04x}-{:04x}-{uuid}.bin", info.vendor_id, info.device_id)
}

/// Why `data` is not a cache for this device, or None when its header matches.
fn header_mismatch(data: &[u8], info: &DeviceInfo) -> Option<String> {
    if data.len() < HEADER_LEN {
        return Some(format!(
            "{} bytes, shorter than the {HEADER_LEN}-byte header",
            data.len()
        ));
    }
    let word = |i: usize| u32::from_le_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
    let (len, version, vendor, device) = (word(0), word(4), word(8), word(12));
    if (len as usize) < HEADER_LEN || len as usize > data.len() {
        return Some(format!("header length {len} is invalid"));
    }
    if version != vk::PipelineCacheHeaderVersion::ONE.as_raw() as u32 {
        return Some(format!("header version {version} is not 1"));
    }
    if vendor != info.vendor_id || device != info.device_id {
        return Some(format!(
            "written for device {vendor:04x}:{device:04x}, this is {:04x}:{:04x}",
            info.vendor_id, info.device_id
        ));
    }
    if data[16..32] != info.pipeline_cache_uuid {
        return Some("written by another driver build (pipelineCacheUUID differs)".into());
    }
    None
}

impl PipelineCacheStore {
    /// Creates the device's pipeline cache, seeded from its file when usable. Never
    /// fails for a bad file; falls back to an empty cache (and to no cache at all,
    /// `VK_NULL_HANDLE`, if even that cannot be made).
    pub(crate) fn open(device: &ash::Device, info: &DeviceInfo, location: &CacheLocation) -> Self {
        let path = cache_dir(location).map(|d| d.join(file_name(info)));
        let mut warning = None;
        let mut data = Vec::new();
        if let Some(p) = &path {
            match std::fs::read(p) {
                Ok(bytes) => match header_mismatch(&bytes, info) {
                    None => data = bytes,
                    Some(why) => {
                        warning = Some(format!("ignoring pipeline cache {}: {why}", p.display()))
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => warning = Some(format!("ignoring pipeline cache {}: {e}", p.display())),
            }
        }
        let create = |initial: &[u8]| {
            let ci = vk::PipelineCacheCreateInfo::default().initial_data(initial);
            // SAFETY: valid create info for a live device; the header was checked
            // against this device, and the driver checks the rest.
            unsafe { device.create_pipeline_cache(&ci, None) }
        };
        let (handle, loaded_bytes) = match create(&data) {
            Ok(h) => (h, data.len()),
            Err(e) => {
                if !data.is_empty() {
                    warning = Some(format!(
                        "the driver rejected the cached pipelines ({e:?}); starting empty"
                    ));
                }
                (create(&[]).unwrap_or(vk::PipelineCache::null()), 0)
            }
        };
        if let Some(w) = &warning {
            tracing::warn!("{w}");
        }
        PipelineCacheStore {
            handle,
            status: CacheStatus {
                path,
                loaded_bytes,
                warning,
            },
        }
    }

    pub(crate) fn status(&self) -> CacheStatus {
        self.status.clone()
    }

    /// Writes the cache to its file; Ok(None) when there is no file to write.
    pub(crate) fn save_checked(&self, device: &ash::Device) -> Result<Option<PathBuf>> {
        let Some(path) = &self.status.path else {
            return Ok(None);
        };
        if self.handle == vk::PipelineCache::null() {
            return Ok(None);
        }
        // SAFETY: the cache is live; vkGetPipelineCacheData is internally synchronised
        // against pipeline creation on the same cache.
        let data = unsafe { device.get_pipeline_cache_data(self.handle) }
            .map_err(call("vkGetPipelineCacheData"))?;
        write_atomically(path, &data).map_err(|e| {
            VkError::InvalidArgument(format!(
                "could not write the pipeline cache to {}: {e}; set HETERO_VULKAN_CACHE_DIR to a writable directory",
                path.display()
            ))
        })?;
        Ok(Some(path.clone()))
    }

    /// Saves, reporting failure as a warning (used when the device closes).
    pub(crate) fn save(&self, device: &ash::Device) {
        if let Err(e) = self.save_checked(device) {
            tracing::warn!(error = %e, "pipeline cache not saved");
        }
    }

    /// # Safety
    /// The device must be idle and no pipeline creation may be under way.
    pub(crate) unsafe fn destroy(&self, device: &ash::Device) {
        if self.handle != vk::PipelineCache::null() {
            // SAFETY: guaranteed by the caller.
            unsafe { device.destroy_pipeline_cache(self.handle, None) };
        }
    }
}

fn write_atomically(path: &Path, data: &[u8]) -> std::io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}
