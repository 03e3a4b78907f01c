//! Discovery: open the Vulkan loader at run time (ash's `loaded` feature, so nothing
//! links against libvulkan), create one `VkInstance`, and describe each physical
//! device as a [`DeviceInfo`].
//!
//! Invariant: an `InstanceShared` outlives every device made from it (devices hold
//! an `Arc` to it), so `vkDestroyInstance` runs last.

use std::ffi::{c_char, CStr};
use std::sync::Arc;

use ash::vk;

use crate::error::{call, Result, VkError};
use crate::info::{
    ApiVersion, DeviceInfo, DeviceType, Features, Limits, MemoryHeapInfo, MemoryTypeInfo,
    QueueFamilyInfo,
};

/// The loader and instance, shared by every device opened from them.
pub(crate) struct InstanceShared {
    /// Keeps the loader library loaded while the instance lives.
    _entry: ash::Entry,
    pub(crate) instance: ash::Instance,
    /// The version the instance was created for: min(loader, 1.3).
    pub(crate) api: ApiVersion,
    pub(crate) physical: Vec<vk::PhysicalDevice>,
    pub(crate) calibrated: Option<ash::ext::calibrated_timestamps::Instance>,
}

impl Drop for InstanceShared {
    fn drop(&mut self) {
        // SAFETY: every device made from this instance holds an Arc to it, so none is
        // left; no other thread can use the instance once its last Arc is dropping.
        unsafe { self.instance.destroy_instance(None) };
    }
}

/// A Vulkan instance: the entry point for discovery and for opening a [`crate::Gpu`].
///
/// ```no_run
/// let instance = hetero_vulkan::Instance::load()?;
/// for info in instance.list_devices()? {
///     println!("{info}");
/// }
/// # Ok::<(), hetero_vulkan::VkError>(())
/// ```
#[derive(Clone)]
pub struct Instance {
    pub(crate) shared: Arc<InstanceShared>,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("api", &self.shared.api)
            .field("devices", &self.shared.physical.len())
            .finish()
    }
}

/// Extension names a device reports.
pub(crate) fn device_extensions(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
) -> Result<Vec<String>> {
    // SAFETY: `pd` was enumerated from `instance`, which is alive.
    let props = unsafe { instance.enumerate_device_extension_properties(pd) }
        .map_err(call("vkEnumerateDeviceExtensionProperties"))?;
    Ok(props
        .iter()
        .filter_map(|p| p.extension_name_as_c_str().ok())
        .map(|n| n.to_string_lossy().into_owned())
        .collect())
}

fn c_str_field(bytes: &[c_char]) -> String {
    // The fields are NUL-terminated inside fixed arrays; stop at the first NUL.
    let bytes: Vec<u8> = bytes
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The loader, opened once per process and kept: never closed, so the drivers
/// it loaded stay loaded until exit (what they keep until then stays theirs,
/// and instances come and go without loading them again).
fn entry() -> Result<ash::Entry> {
    static ENTRY: std::sync::Mutex<Option<ash::Entry>> = std::sync::Mutex::new(None);
    let mut kept = ENTRY.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = kept.as_ref() {
        return Ok(e.clone());
    }
    // SAFETY: loading the library runs its initialisers; the Vulkan loader is
    // meant to be loaded this way and keeps no state that conflicts with ours.
    let e = unsafe { ash::Entry::load() }.map_err(|e| VkError::LoaderMissing {
        reason: e.to_string(),
    })?;
    *kept = Some(e.clone());
    Ok(e)
}

impl Instance {
    /// Opens the loader (libvulkan.so.1) and creates an instance for Vulkan 1.3, or
    /// the loader's version when older (1.2 is the least this layer accepts).
    ///
    /// Errors: [`VkError::LoaderMissing`] without a loader, [`VkError::NoDevice`]
    /// when the loader lists no device; both say what to install.
    pub fn load() -> Result<Instance> {
        let entry = entry()?;
        // SAFETY: `entry` holds valid loader function pointers.
        let loader = unsafe { entry.try_enumerate_instance_version() }
            .map_err(call("vkEnumerateInstanceVersion"))?
            .unwrap_or(vk::API_VERSION_1_0);
        let loader_version = ApiVersion::from_vk(loader);
        if !loader_version.at_least(1, 2) {
            return Err(VkError::Version {
                what: "the Vulkan loader".into(),
                found: loader_version.to_string(),
                needed: "1.2",
            });
        }
        let api = if loader_version.at_least(1, 3) {
            vk::API_VERSION_1_3
        } else {
            vk::API_VERSION_1_2
        };
        // SAFETY: as above.
        let available = unsafe { entry.enumerate_instance_extension_properties(None) }
            .map_err(call("vkEnumerateInstanceExtensionProperties"))?;
        let has = |name: &CStr| {
            available
                .iter()
                .any(|p| p.extension_name_as_c_str().is_ok_and(|n| n == name))
        };
        let mut extensions: Vec<*const c_char> = Vec::new();
        let mut flags = vk::InstanceCreateFlags::empty();
        // Portability drivers (MoltenVK) are listed only when asked for.
        if has(ash::khr::portability_enumeration::NAME) {
            extensions.push(ash::khr::portability_enumeration::NAME.as_ptr());
            flags |= vk::InstanceCreateFlags::ENUMERATE_PORTABILITY_KHR;
        }
        let app = vk::ApplicationInfo::default()
            .application_name(c"hetero")
            .engine_name(c"hetero")
            .api_version(api);
        let create = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_extension_names(&extensions)
            .flags(flags);
        // SAFETY: `create` and everything it points to live across the call.
        let instance = unsafe { entry.create_instance(&create, None) }.map_err(|e| match e {
            vk::Result::ERROR_INCOMPATIBLE_DRIVER => VkError::NoDevice,
            e => call("vkCreateInstance")(e),
        })?;
        // SAFETY: `instance` was just created from `entry`.
        let physical = match unsafe { instance.enumerate_physical_devices() } {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: nothing was made from the instance yet.
                unsafe { instance.destroy_instance(None) };
                return Err(call("vkEnumeratePhysicalDevices")(e));
            }
        };
        let calibrated = Some(ash::ext::calibrated_timestamps::Instance::new(
            &entry, &instance,
        ));
        let shared = InstanceShared {
            _entry: entry,
            instance,
            api: ApiVersion::from_vk(api),
            physical,
            calibrated,
        };
        if shared.physical.is_empty() {
            return Err(VkError::NoDevice);
        }
        Ok(Instance {
            shared: Arc::new(shared),
        })
    }

    /// The version the instance was created for (1.3, or 1.2 under an older loader).
    pub fn api_version(&self) -> ApiVersion {
        self.shared.api
    }

    /// Describes every physical device, in the order `Gpu::open` indexes them.
    pub fn list_devices(&self) -> Result<Vec<DeviceInfo>> {
        (0..self.shared.physical.len())
            .map(|i| self.device_info(i))
            .collect()
    }

    /// Describes one physical device.
    pub fn device_info(&self, index: usize) -> Result<DeviceInfo> {
        let pd = *self
            .shared
            .physical
            .get(index)
            .ok_or(VkError::DeviceIndex {
                index,
                count: self.shared.physical.len(),
            })?;
        let inst = &self.shared.instance;
        let exts = device_extensions(inst, pd)?;
        let has = |name: &CStr| exts.iter().any(|e| e.as_bytes() == name.to_bytes());
        // SAFETY: `pd` belongs to `inst`, which is alive.
        let base = unsafe { inst.get_physical_device_properties(pd) };
        let api_version = ApiVersion::from_vk(base.api_version);
        let effective = api_version.min(self.shared.api);
        let v12 = effective.at_least(1, 2);

        let mut driver = vk::PhysicalDeviceDriverProperties::default();
        let mut host_import = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
        let external_memory_host = has(ash::ext::external_memory_host::NAME);
        let mut props2 = vk::PhysicalDeviceProperties2::default();
        if v12 {
            props2 = props2.push_next(&mut driver);
        }
        if external_memory_host {
            props2 = props2.push_next(&mut host_import);
        }
        // SAFETY: the chain holds only structs valid for this device's version and
        // extensions, all alive across the call.
        unsafe { inst.get_physical_device_properties2(pd, &mut props2) };
        let props = props2.properties;

        let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut sync2 = vk::PhysicalDeviceSynchronization2Features::default();
        let sync2_known = effective.at_least(1, 3) || has(ash::khr::synchronization2::NAME);
        let mut features2 = vk::PhysicalDeviceFeatures2::default();
        if v12 {
            features2 = features2.push_next(&mut f12);
        }
        if sync2_known {
            features2 = features2.push_next(&mut sync2);
        }
        // SAFETY: as above.
        unsafe { inst.get_physical_device_features2(pd, &mut features2) };
        let sparse_binding = features2.features.sparse_binding == vk::TRUE;

        // SAFETY: as above.
        let families = unsafe { inst.get_physical_device_queue_family_properties(pd) };
        // SAFETY: as above.
        let memory = unsafe { inst.get_physical_device_memory_properties(pd) };

        let l = &props.limits;
        let calibrated_timestamps = has(ash::ext::calibrated_timestamps::NAME);
        Ok(DeviceInfo {
            index,
            name: c_str_field(&props.device_name),
            driver_name: if v12 {
                c_str_field(&driver.driver_name)
            } else {
                String::new()
            },
            driver_info: if v12 {
                c_str_field(&driver.driver_info)
            } else {
                String::new()
            },
            device_type: DeviceType::from_vk(props.device_type),
            api_version,
            vendor_id: props.vendor_id,
            device_id: props.device_id,
            pipeline_cache_uuid: props.pipeline_cache_uuid,
            queue_families: families
                .iter()
                .map(|q| QueueFamilyInfo {
                    flags: q.queue_flags,
                    count: q.queue_count,
                    timestamp_valid_bits: q.timestamp_valid_bits,
                })
                .collect(),
            memory_heaps: memory
                .memory_heaps_as_slice()
                .iter()
                .map(|h| MemoryHeapInfo {
                    size: h.size,
                    flags: h.flags,
                })
                .collect(),
            memory_types: memory
                .memory_types_as_slice()
                .iter()
                .map(|t| MemoryTypeInfo {
                    heap: t.heap_index,
                    flags: t.property_flags,
                })
                .collect(),
            limits: Limits {
                min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
                max_storage_buffer_range: l.max_storage_buffer_range,
                max_push_constants_size: l.max_push_constants_size,
                max_compute_work_group_count: l.max_compute_work_group_count,
                max_compute_work_group_size: l.max_compute_work_group_size,
                max_compute_work_group_invocations: l.max_compute_work_group_invocations,
                timestamp_period_ns: l.timestamp_period,
                non_coherent_atom_size: l.non_coherent_atom_size,
                min_imported_host_pointer_alignment: external_memory_host
                    .then_some(host_import.min_imported_host_pointer_alignment),
            },
            features: Features {
                timeline_semaphore: v12 && f12.timeline_semaphore == vk::TRUE,
                synchronization2: sync2_known && sync2.synchronization2 == vk::TRUE,
                buffer_device_address: v12 && f12.buffer_device_address == vk::TRUE,
                push_descriptor: has(ash::khr::push_descriptor::NAME),
                calibrated_timestamps,
                external_memory_host,
                global_priority: has(ash::khr::global_priority::NAME)
                    || has(ash::ext::global_priority::NAME),
                global_priority_khr: has(ash::khr::global_priority::NAME),
                sparse_binding,
                host_query_reset: v12 && f12.host_query_reset == vk::TRUE,
                storage_buffer_update_after_bind: v12
                    && f12.descriptor_binding_storage_buffer_update_after_bind == vk::TRUE,
            },
        })
    }
}
