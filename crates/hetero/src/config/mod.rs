//! Device configuration: engine counts, hardware queues, completion modes.

pub(crate) mod emu;
pub(crate) mod link;
pub(crate) mod peer;

/// What one ring slot of a stream costs for the stream's life, about: the op,
/// its sequence number and the kernel a host slot keeps (checked against the
/// op's size where `Op` is defined).
pub(crate) const OP_SLOT_BYTES: usize = 144;

use std::time::Duration;

/// How a thread waits for work to complete (host waits) or for work to arrive (idle
/// engines).
///
/// On a virtual machine a parked thread takes about 100 µs to wake while a spinning
/// hand-off takes about 150 ns, so the default spins for a bounded budget first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionMode {
    /// Busy-poll: lowest latency, burns a core while waiting.
    Spin,
    /// Poll, yielding the core between polls.
    Yield,
    /// Park on a futex at once: no CPU while waiting, about 100 µs to wake here.
    Block,
    /// Spin (then yield) for the budget, then park.
    Auto {
        /// How long to poll before parking.
        spin: Duration,
    },
}

impl CompletionMode {
    /// The default `Auto` budget. An idle device parks after this, so once idle for
    /// 1 ms it uses well under 2 % of a core.
    pub const DEFAULT_SPIN: Duration = Duration::from_micros(200);

    /// `Auto` with the default budget.
    pub const fn auto() -> Self {
        CompletionMode::Auto {
            spin: Self::DEFAULT_SPIN,
        }
    }
}

impl Default for CompletionMode {
    fn default() -> Self {
        Self::auto()
    }
}

/// Which backend a device runs on.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendKind {
    /// The CPU itself.
    Host,
    /// An emulated discrete accelerator.
    Emu(emu::EmuConfig),
    /// A Vulkan device (the `index`-th the loader lists; `hetero info` shows
    /// them). Copies go on the transfer lane where the device's queue plan
    /// gives it a queue of its own (a copy engine); `split_lanes` sends them
    /// there even where it aliases the compute queue (one-queue devices such
    /// as lavapipe): the two-lane path with its cross-lane waits, run where
    /// there is one queue (`HETERO_BACKEND=vulkan:0,lanes=split`).
    Vulkan { index: usize, split_lanes: bool },
}

impl BackendKind {
    /// Parses `host`, `emu` or `emu:PRESET[,time=real|virtual][,capacity=BYTES]`,
    /// or `vulkan[:INDEX][,lanes=split]` (the `HETERO_BACKEND` syntax).
    pub fn parse(spec: &str) -> Result<Self, crate::Error> {
        match spec.trim() {
            "" | "host" => Ok(BackendKind::Host),
            s if s == "vulkan" || s.starts_with("vulkan:") || s.starts_with("vulkan,") => {
                Self::parse_vulkan(s)
            }
            s => emu::EmuConfig::parse(s)
                .map(BackendKind::Emu)
                .map_err(crate::Error::InvalidArgument),
        }
    }

    fn parse_vulkan(s: &str) -> Result<Self, crate::Error> {
        let bad = |what: String| {
            crate::Error::InvalidArgument(format!(
                "{s:?}: {what}; the syntax is vulkan[:INDEX][,lanes=split] (vulkan:0 is the first \
             device; `hetero info` lists them)"
            ))
        };
        let mut parts = s.split(',');
        let head = parts.next().unwrap_or_default();
        let index = match head.strip_prefix("vulkan:") {
            None => 0,
            Some(i) => i
                .parse()
                .map_err(|_| bad(format!("the device index {i:?} is not a number")))?,
        };
        let mut split_lanes = false;
        for p in parts {
            match p {
                "lanes=split" => split_lanes = true,
                "lanes=auto" => split_lanes = false,
                other => return Err(bad(format!("unknown option {other:?}"))),
            }
        }
        Ok(BackendKind::Vulkan { index, split_lanes })
    }

    /// `HETERO_BACKEND` if set (an unknown value is an error), else `Host`.
    pub fn from_env() -> Result<Self, crate::Error> {
        match std::env::var_os("HETERO_BACKEND") {
            None => Ok(BackendKind::Host),
            Some(v) => match v.to_str() {
                Some(s) => Self::parse(s),
                None => Err(crate::Error::InvalidArgument(
                    "HETERO_BACKEND is not valid UTF-8; use host, emu, emu:PRESET or vulkan[:INDEX]".into(),
                )),
            },
        }
    }
}

/// Configuration of a device (host by default; see [`DeviceConfig::emu`]).
///
/// ```
/// use hetero::{DeviceConfig, CompletionMode};
/// let cfg = DeviceConfig::default().compute_units(2).copy_engines(1, 1, 1).hardware_queues(8);
/// assert_eq!(cfg.hardware_queue_count(), 8);
/// # let _ = CompletionMode::Spin;
/// ```
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    pub(crate) compute_units: usize,
    pub(crate) copy_engines: [usize; 3],
    pub(crate) hardware_queues: usize,
    pub(crate) host_wait: CompletionMode,
    pub(crate) engine_idle: CompletionMode,
    pub(crate) async_poll: std::time::Duration,
    pub(crate) ring_capacity: usize,
    pub(crate) pin_engines: bool,
    pub(crate) pool: Option<hetero_memory::PoolConfig>,
    pub(crate) pinned: hetero_memory::PinnedConfig,
    pub(crate) backend: BackendKind,
    pub(crate) pitch_alignment: usize,
    pub(crate) height_alignment: usize,
    pub(crate) graph_memory_slack: f64,
    pub(crate) placement_wait: std::time::Duration,
    pub(crate) lose_device_at: Option<u64>,
    pub(crate) queue_priority: Option<QueuePriority>,
}

/// A device queue's priority among every program's queues on the device
/// (Vulkan's global priority). Inside one device, streams are ordered by
/// their own priorities (`Device::create_stream_with_priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueuePriority {
    Low,
    Medium,
    High,
    /// Usually needs privileges (the device then opens at the default).
    Realtime,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            compute_units: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            copy_engines: [1, 1, 1],
            hardware_queues: 8,
            host_wait: CompletionMode::default(),
            engine_idle: CompletionMode::default(),
            async_poll: std::time::Duration::from_micros(50),
            ring_capacity: 1024,
            pin_engines: true,
            pool: None,
            pinned: hetero_memory::PinnedConfig::default(),
            backend: BackendKind::Host,
            pitch_alignment: 16,
            height_alignment: 2,
            graph_memory_slack: GRAPH_MEMORY_SLACK,
            placement_wait: Self::PLACEMENT_WAIT,
            lose_device_at: None,
            queue_priority: None,
        }
    }
}

impl DeviceConfig {
    /// The default configuration on the backend `HETERO_BACKEND` names (host
    /// when unset): how programs and the test suite pick their device.
    pub fn from_env() -> Result<Self, crate::Error> {
        Ok(DeviceConfig::default().backend(BackendKind::from_env()?))
    }

    /// Runs the device on `backend`.
    pub fn backend(mut self, backend: BackendKind) -> Self {
        self.backend = backend;
        self
    }

    /// Runs the device on the emulated accelerator `emu`.
    pub fn emu(self, emu: emu::EmuConfig) -> Self {
        self.backend(BackendKind::Emu(emu))
    }

    /// Runs the device on the `index`-th Vulkan device (see [`BackendKind::Vulkan`]).
    pub fn vulkan(self, index: usize) -> Self {
        self.backend(BackendKind::Vulkan {
            index,
            split_lanes: false,
        })
    }

    /// Fault injection, for testing how a program handles a lost device
    /// (Vulkan only; other backends have no driver to lose and ignore it):
    /// the driver reports the device lost at its `n`-th submission (1: the
    /// first) and from every call after, as after a GPU crash or reset. Work
    /// that has not completed fails with [`Error::DeviceLost`](crate::Error)
    /// or a stream fault that says so; new work is refused.
    pub fn lose_device_at_submission(mut self, n: u64) -> Self {
        self.lose_device_at = Some(n.max(1));
        self
    }

    /// Asks for this priority for the device's queues among every program's
    /// (Vulkan devices whose driver has VK_KHR/EXT_global_priority; a
    /// priority the process may not take, or a driver without it, leaves
    /// the default: `DeviceProperties::queue_priority` says what was
    /// granted). Other backends ignore it.
    pub fn queue_priority(mut self, priority: QueuePriority) -> Self {
        self.queue_priority = Some(priority);
        self
    }

    /// The backend the device will run on.
    pub fn backend_kind(&self) -> &BackendKind {
        &self.backend
    }

    /// Number of compute units (engine threads on the host). Default: available
    /// cores.
    pub fn compute_units(mut self, n: usize) -> Self {
        self.compute_units = n;
        self
    }

    /// Number of copy engines per direction: host→device, device→host, device→device.
    pub fn copy_engines(mut self, h2d: usize, d2h: usize, d2d: usize) -> Self {
        self.copy_engines = [h2d, d2h, d2d];
        self
    }

    /// Size of the fixed pool of hardware queues streams are mapped onto. Default 8.
    pub fn hardware_queues(mut self, n: usize) -> Self {
        self.hardware_queues = n;
        self
    }

    /// How host threads wait in `synchronize` and friends. Default `Auto`.
    pub fn host_wait(mut self, mode: CompletionMode) -> Self {
        self.host_wait = mode;
        self
    }

    /// How idle engines wait for work. Default `Auto`.
    pub fn engine_idle(mut self, mode: CompletionMode) -> Self {
        self.engine_idle = mode;
        self
    }

    /// While async ops ([`crate::AsyncOp`]) are in flight, an engine that
    /// found no work parks for at most this long before it polls them again
    /// (the bound on their polling rate when the device is otherwise idle).
    /// Default 50 µs; from 1 µs to 1 s.
    pub fn async_poll(mut self, interval: std::time::Duration) -> Self {
        self.async_poll = interval;
        self
    }

    /// Host backend: how long a ready op that reads a buffer of at least
    /// 64 KiB is left to the engine that last wrote that buffer, whose cache
    /// holds it, while that engine is busy (it takes the op when it next
    /// looks for work). Other engines run other work meanwhile, and the op
    /// once the time is up. Default [`Self::PLACEMENT_WAIT`] (32 µs); zero
    /// runs every op on the first engine that finds it. At most one second.
    pub fn placement_wait(mut self, wait: std::time::Duration) -> Self {
        self.placement_wait = wait;
        self
    }

    /// The default [`Self::placement_wait`]. Tuned on the host demo (256 KiB
    /// tiles, two engines; median speedup of four runs each, in one quiet
    /// spell of the VM): 10 µs 1.70, 20 µs 1.77, 32 µs 1.88, 40 µs 1.74,
    /// 80 µs 1.59, against 1.51 for no wait.
    pub const PLACEMENT_WAIT: std::time::Duration = std::time::Duration::from_micros(32);

    /// How much a graph's lanes may raise its arena over the plan of running it
    /// on one lane, as a fraction (default [`GRAPH_MEMORY_SLACK`], 0.10):
    /// past it, instantiate schedules the lanes again under that budget, and
    /// runs the graph on one lane if that is not enough
    /// ([`crate::PlanReport::memory_order`]). 0 holds lanes to the one-lane
    /// arena; `f64::INFINITY` never holds them.
    pub fn graph_memory_slack(mut self, fraction: f64) -> Self {
        self.graph_memory_slack = fraction;
        self
    }

    /// Operations a stream can hold in flight before submission waits (rounded up to
    /// a power of two). Default 1024, at most [`DeviceConfig::MAX_STREAM_CAPACITY`]:
    /// each slot takes memory (about 140 bytes) for the stream's whole life.
    pub fn stream_capacity(mut self, n: usize) -> Self {
        self.ring_capacity = n;
        self
    }

    /// The device memory pool's configuration. Default: `HETERO_ALLOC_CONF` if set
    /// (`key:value,key:value`; a bad key or value fails `Device::new`), else the
    /// pool's defaults.
    pub fn memory(mut self, pool: hetero_memory::PoolConfig) -> Self {
        self.pool = Some(pool);
        self
    }

    /// The pinned host pool's configuration.
    pub fn pinned_memory(mut self, pinned: hetero_memory::PinnedConfig) -> Self {
        self.pinned = pinned;
        self
    }

    /// Pin each engine thread to its own core (the n-th CPU the process may use).
    /// Default on: it keeps compute units spread across cores.
    pub fn pin_engines(mut self, on: bool) -> Self {
        self.pin_engines = on;
        self
    }

    /// The row pitch alignment of pitched buffers, bytes: a power of two from 1
    /// to 4096 (image units commonly want 16, 64, 128 or 256). Default 16.
    pub fn pitch_alignment(mut self, bytes: usize) -> Self {
        self.pitch_alignment = bytes;
        self
    }

    /// Pitched buffers get their rows allocated to a multiple of this. Default 2.
    pub fn height_alignment(mut self, rows: usize) -> Self {
        self.height_alignment = rows;
        self
    }

    /// The largest `stream_capacity`: 65 536 slots, about 9 MiB per stream.
    pub const MAX_STREAM_CAPACITY: usize = 1 << 16;

    /// The configured number of hardware queues.
    pub fn hardware_queue_count(&self) -> usize {
        self.hardware_queues
    }

    pub(crate) fn validate(&self) -> crate::Result<()> {
        let bad = |m: String| Err(crate::Error::InvalidArgument(m));
        if self.compute_units == 0 || self.compute_units > 1024 {
            return bad(format!(
                "compute_units is {}; use 1..=1024",
                self.compute_units
            ));
        }
        if self.copy_engines.iter().any(|&n| n == 0 || n > 32) {
            return bad(format!(
                "copy_engines is {:?}; each direction needs 1..=32",
                self.copy_engines
            ));
        }
        if self.graph_memory_slack.is_nan() || self.graph_memory_slack < 0.0 {
            return bad(format!(
                "graph_memory_slack is {}; use a fraction of at least 0 (0.10 by default, \
                 f64::INFINITY to never hold lanes back)",
                self.graph_memory_slack
            ));
        }
        if self.placement_wait > std::time::Duration::from_secs(1) {
            return bad(format!(
                "placement_wait is {:?}; use at most 1 s (32 µs by default, 0 to turn it off): \
                 an op left to a busy engine waits that long before another runs it",
                self.placement_wait
            ));
        }
        if self.async_poll.is_zero() || self.async_poll > std::time::Duration::from_secs(1) {
            return bad(format!(
                "async_poll is {:?}; use 1 µs to 1 s (50 µs by default): an async op in flight \
                 is polled that often while nothing else wakes the device",
                self.async_poll
            ));
        }
        if self.hardware_queues == 0 || self.hardware_queues > 256 {
            return bad(format!(
                "hardware_queues is {}; use 1..=256",
                self.hardware_queues
            ));
        }
        if !self.pitch_alignment.is_power_of_two() || self.pitch_alignment > 4096 {
            return bad(format!(
                "pitch_alignment is {}; use a power of two from 1 to 4096 bytes",
                self.pitch_alignment
            ));
        }
        if self.height_alignment == 0 || self.height_alignment > 4096 {
            return bad(format!(
                "height_alignment is {}; use 1..=4096 rows",
                self.height_alignment
            ));
        }
        if self.ring_capacity < 2 || self.ring_capacity > Self::MAX_STREAM_CAPACITY {
            return bad(format!(
                "stream_capacity is {}; use 2..={}: every slot costs about {} bytes for the \
                 stream's whole life (a larger ring only lets the host run further ahead)",
                self.ring_capacity,
                Self::MAX_STREAM_CAPACITY,
                // The op, its sequence number and the kernel a host slot keeps.
                OP_SLOT_BYTES
            ));
        }
        Ok(())
    }
}

/// The default of [`DeviceConfig::graph_memory_slack`](crate::DeviceConfig::graph_memory_slack):
/// how much a graph's lanes may raise its arena over the plan of running it on
/// one lane, as a fraction; past it, instantiate holds the lanes back (see
/// [`PlanReport::memory_order`](crate::PlanReport::memory_order)). Concurrency that runs a device out of memory
/// is no speed-up.
pub const GRAPH_MEMORY_SLACK: f64 = 0.10;

/// A stream option: the device may merge consecutive copies of at most
/// `max_bytes` each, of one direction, up to `window` of them, into one
/// descriptor chain (one setup latency for all). See [`Stream::set_coalescing`](crate::Stream::set_coalescing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coalescing {
    /// Copies larger than this are never merged.
    pub max_bytes: usize,
    /// At most this many copies go into one chain.
    pub window: usize,
}

impl Default for Coalescing {
    /// Copies up to 64 KiB (where a PCIe setup latency costs more than the
    /// bytes), up to 256 in a chain.
    fn default() -> Self {
        Coalescing {
            max_bytes: 64 << 10,
            window: 256,
        }
    }
}
