//! What a physical device offers, read once at discovery: names, queue families,
//! memory heaps and types, the limits a compute runtime cares about, and which
//! optional features are there. Plain data; `Display` is what `hetero info` prints.

use std::fmt;

use ash::vk;

/// The kind of device, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceType {
    /// A CPU implementation (lavapipe, SwiftShader).
    Cpu,
    /// A GPU sharing memory with the host.
    IntegratedGpu,
    /// A GPU with its own memory.
    DiscreteGpu,
    /// A GPU in a virtual machine.
    VirtualGpu,
    /// Anything else.
    Other,
}

impl DeviceType {
    pub(crate) fn from_vk(t: vk::PhysicalDeviceType) -> Self {
        match t {
            vk::PhysicalDeviceType::CPU => Self::Cpu,
            vk::PhysicalDeviceType::INTEGRATED_GPU => Self::IntegratedGpu,
            vk::PhysicalDeviceType::DISCRETE_GPU => Self::DiscreteGpu,
            vk::PhysicalDeviceType::VIRTUAL_GPU => Self::VirtualGpu,
            _ => Self::Other,
        }
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cpu => "cpu",
            Self::IntegratedGpu => "integrated gpu",
            Self::DiscreteGpu => "discrete gpu",
            Self::VirtualGpu => "virtual gpu",
            Self::Other => "other",
        })
    }
}

/// A Vulkan version, major.minor.patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ApiVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl ApiVersion {
    pub(crate) fn from_vk(v: u32) -> Self {
        Self {
            major: vk::api_version_major(v),
            minor: vk::api_version_minor(v),
            patch: vk::api_version_patch(v),
        }
    }

    pub(crate) fn at_least(self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// One queue family: what its hardware queues can run and how many there are.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct QueueFamilyInfo {
    pub flags: vk::QueueFlags,
    pub count: u32,
    /// Valid bits in a timestamp written on this family; 0 means no timestamps.
    pub timestamp_valid_bits: u32,
}

/// One memory heap.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MemoryHeapInfo {
    pub size: u64,
    pub flags: vk::MemoryHeapFlags,
}

/// One memory type: its properties and the heap it draws from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MemoryTypeInfo {
    pub heap: u32,
    pub flags: vk::MemoryPropertyFlags,
}

/// The limits that matter to a compute runtime.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub min_storage_buffer_offset_alignment: u64,
    pub max_storage_buffer_range: u32,
    pub max_push_constants_size: u32,
    pub max_compute_work_group_count: [u32; 3],
    pub max_compute_work_group_size: [u32; 3],
    pub max_compute_work_group_invocations: u32,
    /// Nanoseconds per timestamp tick.
    pub timestamp_period_ns: f32,
    pub non_coherent_atom_size: u64,
    /// Alignment of pointer and length for `Chunk::import_host` (None without VK_EXT_external_memory_host).
    pub min_imported_host_pointer_alignment: Option<u64>,
}

/// Optional capabilities, each true when the device offers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Features {
    pub timeline_semaphore: bool,
    pub synchronization2: bool,
    pub buffer_device_address: bool,
    /// VK_KHR_push_descriptor.
    pub push_descriptor: bool,
    /// VK_EXT_calibrated_timestamps.
    pub calibrated_timestamps: bool,
    /// VK_EXT_external_memory_host.
    pub external_memory_host: bool,
    /// VK_KHR_global_priority or VK_EXT_global_priority.
    pub global_priority: bool,
    /// The KHR one of the two (the same structures; the EXT one otherwise).
    pub global_priority_khr: bool,
    pub sparse_binding: bool,
    /// Vulkan 1.2's hostQueryReset.
    pub host_query_reset: bool,
    /// Vulkan 1.2's descriptorBindingStorageBufferUpdateAfterBind: storage
    /// buffer descriptors of a set a recorded command buffer binds can be
    /// rewritten without invalidating it ([`crate::GraphSets`]).
    pub storage_buffer_update_after_bind: bool,
}

/// Everything discovery learns about one physical device.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    /// Position in `Instance::list_devices`, the index `Gpu::open` takes.
    pub index: usize,
    pub name: String,
    pub driver_name: String,
    pub driver_info: String,
    pub device_type: DeviceType,
    /// The version the device supports (before any cap from the loader).
    pub api_version: ApiVersion,
    pub vendor_id: u32,
    pub device_id: u32,
    pub pipeline_cache_uuid: [u8; 16],
    pub queue_families: Vec<QueueFamilyInfo>,
    pub memory_heaps: Vec<MemoryHeapInfo>,
    pub memory_types: Vec<MemoryTypeInfo>,
    pub limits: Limits,
    pub features: Features,
}

/// Bytes in the largest binary unit that keeps the number at least 1.
pub(crate) struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
        for (unit, size) in UNITS {
            if b >= size {
                return write!(f, "{:.1} {unit}", b as f64 / size as f64);
            }
        }
        write!(f, "{b} B")
    }
}

/// Flag names joined by `|` (ash names flags only with its `debug`
/// feature, which costs the main job's build seconds; these are the ones
/// hetero prints).
pub(crate) fn flags<F: Flags>(flags: F) -> String {
    let bits = flags.bits();
    let mut names: Vec<String> = F::NAMES
        .iter()
        .filter(|(b, _)| bits & b == *b)
        .map(|(_, n)| (*n).to_string())
        .collect();
    let rest = F::NAMES.iter().fold(bits, |r, (b, _)| r & !b);
    if rest != 0 {
        names.push(format!("{rest:#x}"));
    }
    if names.is_empty() {
        return "0".into();
    }
    names.join("|")
}

/// A Vulkan flags type with the names of its bits.
pub(crate) trait Flags: Copy {
    const NAMES: &'static [(u32, &'static str)];
    fn bits(self) -> u32;
}

impl Flags for vk::QueueFlags {
    const NAMES: &'static [(u32, &'static str)] = &[
        (0x1, "GRAPHICS"),
        (0x2, "COMPUTE"),
        (0x4, "TRANSFER"),
        (0x8, "SPARSE_BINDING"),
        (0x10, "PROTECTED"),
        (0x20, "VIDEO_DECODE"),
        (0x40, "VIDEO_ENCODE"),
        (0x100, "OPTICAL_FLOW"),
    ];
    fn bits(self) -> u32 {
        self.as_raw()
    }
}

impl Flags for vk::MemoryHeapFlags {
    const NAMES: &'static [(u32, &'static str)] = &[(0x1, "DEVICE_LOCAL"), (0x2, "MULTI_INSTANCE")];
    fn bits(self) -> u32 {
        self.as_raw()
    }
}

impl Flags for vk::MemoryPropertyFlags {
    const NAMES: &'static [(u32, &'static str)] = &[
        (0x1, "DEVICE_LOCAL"),
        (0x2, "HOST_VISIBLE"),
        (0x4, "HOST_COHERENT"),
        (0x8, "HOST_CACHED"),
        (0x10, "LAZILY_ALLOCATED"),
        (0x20, "PROTECTED"),
        (0x40, "DEVICE_COHERENT_AMD"),
        (0x80, "DEVICE_UNCACHED_AMD"),
        (0x100, "RDMA_CAPABLE_NV"),
    ];
    fn bits(self) -> u32 {
        self.as_raw()
    }
}

impl fmt::Debug for QueueFamilyInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueFamilyInfo")
            .field("flags", &format_args!("{}", flags(self.flags)))
            .field("count", &self.count)
            .field("timestamp_valid_bits", &self.timestamp_valid_bits)
            .finish()
    }
}

impl fmt::Debug for MemoryHeapInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryHeapInfo")
            .field("size", &self.size)
            .field("flags", &format_args!("{}", flags(self.flags)))
            .finish()
    }
}

impl fmt::Debug for MemoryTypeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTypeInfo")
            .field("heap", &self.heap)
            .field("flags", &format_args!("{}", flags(self.flags)))
            .finish()
    }
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "[{}] {} ({}, Vulkan {}, {} {}, ids {:04x}:{:04x})",
            self.index,
            self.name,
            self.device_type,
            self.api_version,
            self.driver_name,
            self.driver_info,
            self.vendor_id,
            self.device_id
        )?;
        let families: Vec<String> = self
            .queue_families
            .iter()
            .enumerate()
            .map(|(i, q)| {
                format!(
                    "{i}: {} x{} ts {}b",
                    flags(q.flags),
                    q.count,
                    q.timestamp_valid_bits
                )
            })
            .collect();
        writeln!(f, "    queue families: {}", families.join("; "))?;
        let heaps: Vec<String> = self
            .memory_heaps
            .iter()
            .enumerate()
            .map(|(i, h)| format!("{i}: {} {}", Bytes(h.size), flags(h.flags)))
            .collect();
        writeln!(f, "    heaps: {}", heaps.join("; "))?;
        let types: Vec<String> = self
            .memory_types
            .iter()
            .enumerate()
            .map(|(i, t)| format!("{i}: heap {} {}", t.heap, flags(t.flags)))
            .collect();
        writeln!(f, "    memory types: {}", types.join("; "))?;
        let l = &self.limits;
        writeln!(
            f,
            "    limits: storage offset align {} B, storage range {}, push constants {} B, \
             groups {:?}, group size {:?} (max {} invocations), timestamp period {} ns, \
             non-coherent atom {} B{}",
            l.min_storage_buffer_offset_alignment,
            Bytes(u64::from(l.max_storage_buffer_range)),
            l.max_push_constants_size,
            l.max_compute_work_group_count,
            l.max_compute_work_group_size,
            l.max_compute_work_group_invocations,
            l.timestamp_period_ns,
            l.non_coherent_atom_size,
            match l.min_imported_host_pointer_alignment {
                Some(a) => format!(", host import align {a} B"),
                None => String::new(),
            }
        )?;
        let ft = &self.features;
        let list = [
            ("timeline-semaphore", ft.timeline_semaphore),
            ("synchronization2", ft.synchronization2),
            ("buffer-device-address", ft.buffer_device_address),
            ("push-descriptor", ft.push_descriptor),
            ("calibrated-timestamps", ft.calibrated_timestamps),
            ("external-memory-host", ft.external_memory_host),
            ("global-priority", ft.global_priority),
            ("sparse-binding", ft.sparse_binding),
            ("host-query-reset", ft.host_query_reset),
            ("update-after-bind", ft.storage_buffer_update_after_bind),
        ];
        let yes: Vec<&str> = list.iter().filter(|(_, on)| *on).map(|(n, _)| *n).collect();
        let no: Vec<&str> = list
            .iter()
            .filter(|(_, on)| !*on)
            .map(|(n, _)| *n)
            .collect();
        write!(f, "    features: {}", yes.join(" "))?;
        if !no.is_empty() {
            write!(f, " (missing: {})", no.join(" "))?;
        }
        Ok(())
    }
}
