//! The one error type of this layer. Every message says what was asked, what was
//! there, and what to do about it.

use ash::vk;

/// Installing a Vulkan driver, said once for every message that needs it.
const INSTALL: &str = "install a Vulkan driver: `apt-get install -y mesa-vulkan-drivers` \
                       for the CPU driver (lavapipe), or your GPU vendor's driver";

/// What can go wrong in the Vulkan layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VkError {
    /// The Vulkan loader library could not be opened.
    #[error("the Vulkan loader (libvulkan.so.1) could not be opened ({reason}); install it with `apt-get install -y libvulkan1`, then {INSTALL}")]
    LoaderMissing { reason: String },

    /// The loader is there but reports no physical device.
    #[error("the Vulkan loader found no device; {INSTALL}")]
    NoDevice,

    /// The loader or device is older than this layer needs.
    #[error("{what} supports Vulkan {found}, this layer needs {needed} or newer; update the driver or loader")]
    Version {
        what: String,
        found: String,
        needed: &'static str,
    },

    /// `Gpu::open` was given an index past the device list.
    #[error("device index {index} is out of range: {count} Vulkan device(s) present (list them with `hetero info`)")]
    DeviceIndex { index: usize, count: usize },

    /// A feature this layer requires is missing on the device.
    #[error("device `{device}` lacks {feature}, which hetero's Vulkan layer requires; update the driver")]
    MissingFeature {
        device: String,
        feature: &'static str,
    },

    /// An optional capability was used where the device does not offer it.
    #[error(
        "device `{device}` does not support {what}; check `DeviceInfo::features` before using it"
    )]
    Unsupported { device: String, what: &'static str },

    /// A Vulkan call failed with a result this layer does not turn into anything more specific.
    #[error("{call} failed: {result:?}")]
    Call {
        call: &'static str,
        result: vk::Result,
    },

    /// The driver could not allocate memory, or the request exceeds the heap.
    #[error("out of device memory: requested {requested} bytes of {usage} memory from heap {heap} of {heap_size} bytes; free chunks, or ask for less")]
    OutOfMemory {
        usage: &'static str,
        requested: u64,
        heap: u32,
        heap_size: u64,
    },

    /// No memory type fits the use on this device.
    #[error("device `{device}` has no memory type for {usage} memory (needs {needs})")]
    NoMemoryType {
        device: String,
        usage: &'static str,
        needs: &'static str,
    },

    /// WGSL that does not parse or validate, with naga's message and where it points.
    #[error("WGSL error at line {line}, column {column}: {message}")]
    Wgsl {
        message: String,
        line: u32,
        column: u32,
    },

    /// naga could not write SPIR-V for a module that validated.
    #[error("SPIR-V generation failed for entry point `{entry}`: {message}")]
    SpirvOut { entry: String, message: String },

    /// Words that are not a SPIR-V module this layer can hand to the driver.
    #[error("invalid SPIR-V: {0}")]
    InvalidSpirv(String),

    /// The module has no compute entry point of that name.
    #[error(
        "no compute entry point `{entry}` in the module (compute entry points: {available:?})"
    )]
    NoEntryPoint {
        entry: String,
        available: Vec<String>,
    },

    /// An argument outside what the call or the device allows.
    #[error("{0}")]
    InvalidArgument(String),

    /// A range past the end of a chunk.
    #[error("{what}: bytes {offset}..{end} are outside the chunk of {size} bytes", end = .offset.saturating_add(*.len))]
    OutOfBounds {
        what: &'static str,
        offset: u64,
        len: u64,
        size: u64,
    },

    /// Objects from two different `Gpu`s were mixed in one call.
    #[error("{what} belongs to another Gpu; objects of one Gpu cannot be used with another")]
    ForeignObject { what: &'static str },

    /// A blocking wait ran out of time.
    #[error("timed out after {timeout_ms} ms waiting for timeline value {value} (current value {current})")]
    Timeout {
        value: u64,
        current: u64,
        timeout_ms: u128,
    },

    /// The producer of a timeline value marked it failed (see [`crate::Timeline::fail`]).
    #[error("timeline value {value} was marked failed (at value {failed_at}); the work it guards did not complete")]
    TimelineFailed { value: u64, failed_at: u64 },

    /// The device was lost (driver crash, hang, reset).
    #[error("the Vulkan device was lost during {call}; the Gpu and everything made from it must be recreated")]
    DeviceLost { call: &'static str },
}

/// Shorthand used across the crate.
pub type Result<T, E = VkError> = std::result::Result<T, E>;

/// Names a failed call; device loss gets its own variant since it changes what the caller does.
pub(crate) fn call(call: &'static str) -> impl FnOnce(vk::Result) -> VkError {
    move |result| match result {
        vk::Result::ERROR_DEVICE_LOST => VkError::DeviceLost { call },
        result => VkError::Call { call, result },
    }
}
