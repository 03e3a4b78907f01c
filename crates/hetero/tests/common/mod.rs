//! Helpers shared by the integration tests: the device every test runs on (the
//! backend `HETERO_BACKEND` names: the same suite runs on every backend), the
//! skip tables (what a backend cannot run, and why, in one place), and a gate
//! that holds a stream's work queued while a test looks, opened by the test (or
//! by its drop, so a failing assertion never leaves a stream blocked: dropping a
//! stream waits for its work).
#![allow(dead_code)]

pub mod managed;
pub mod wgsl;

use hetero::{
    Arg, BackendKind, Device, DeviceBuffer, DeviceConfig, Event, Grid, HostEvent, Kernel, Stream,
    TimeMode,
};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The configuration of the device under test: the defaults on the backend
/// `HETERO_BACKEND` names (host when unset).
pub fn config() -> DeviceConfig {
    DeviceConfig::from_env().expect("HETERO_BACKEND names a backend")
}

/// The device under test.
pub fn device() -> Device {
    Device::new(config()).expect("device under test")
}

/// The device under test, configured further by `f`.
pub fn device_with(f: impl FnOnce(DeviceConfig) -> DeviceConfig) -> Device {
    Device::new(f(config())).expect("device under test")
}

/// A backend the suite runs on, as the skip tables name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `HETERO_BACKEND` unset or `host`.
    Host,
    /// `emu:PRESET` (virtual time, the default).
    EmuVirtual,
    /// `emu:PRESET,time=real`.
    EmuReal,
    /// `vulkan[:INDEX]`.
    Vulkan,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Host => "host",
            Backend::EmuVirtual => "emu (virtual time)",
            Backend::EmuReal => "emu (real time)",
            Backend::Vulkan => "vulkan",
        }
    }

    /// What this backend cannot run: `(test, reason)`, in one or more tables.
    pub fn skips(self) -> &'static [&'static [(&'static str, &'static str)]] {
        match self {
            Backend::Host => &[
                VIRTUAL_TIME_SKIPS,
                NO_DRIVER_SKIPS,
                HOST_CODE_SKIPS,
                NO_CAPACITY_SKIPS,
                NO_FAULT_SKIPS,
            ],
            Backend::EmuVirtual => &[
                EMU_SKIPS,
                NO_DRIVER_SKIPS,
                VIRTUAL_CLOCK_SKIPS,
                HOST_CODE_SKIPS,
            ],
            Backend::EmuReal => &[
                EMU_SKIPS,
                VIRTUAL_TIME_SKIPS,
                NO_DRIVER_SKIPS,
                HOST_CODE_SKIPS,
            ],
            Backend::Vulkan => &[VULKAN_SKIPS, VIRTUAL_TIME_SKIPS, VULKAN_MANAGED_SKIPS],
        }
    }
}

/// The backend under test.
pub fn backend() -> Backend {
    match config().backend_kind() {
        BackendKind::Host => Backend::Host,
        BackendKind::Emu(emu) => match emu.time_mode() {
            TimeMode::Virtual => Backend::EmuVirtual,
            TimeMode::Real => Backend::EmuReal,
        },
        BackendKind::Vulkan { .. } => Backend::Vulkan,
    }
}

// Reasons shared by both time modes of the emulated device.
const EMU_ONE_THREAD_KERNEL: &str = "holds a kernel running (at a gate) while other work goes on \
     beside it; emu runs kernels, copies and callbacks one at a time on the one thread running \
     its model, which the gated kernel would hold (hangs)";
const EMU_BLOCKS_BACK_TO_BACK: &str = "emu runs all of a kernel's blocks back to back when the \
     kernel starts (backend/emu/engine/mod.rs: data effects at op start); async ops are polled between \
     ops, never between the blocks of one";
const EMU_CALLBACK_WAITS: &str = "emu runs callbacks inside its model on one thread: a callback's \
     wait for its own device is refused with WouldDeadlock by design (tests/emu.rs \
     a_callback_waiting_for_its_own_emulated_device_is_an_error)";
const EMU_NO_PLACEMENT: &str = "placement by data is the host engines' policy; emu runs every \
     kernel on the one thread running its model, so writer and reader always match and the \
     check would pass vacuously";
const EMU_NO_AGING: &str = "emu's model has no aging: strict priority, then the stream served \
     longest ago (backend/emu/engine/mod.rs Sim::dispatch; docs/ARCHITECTURE.md 'Model'), so \
     continuous priority-0 work starves a priority-7 stream; the 7 x 16-dispatch aging asserted \
     is the host scheduler's (backend/host/stream.rs AGING_TICKS)";
const EMU_ASYNC_NO_LOCKS: &str = "emu's model starts an async op without taking its buffers' \
     access locks (backend/emu/engine/mod.rs polls with `|| true`), so an unordered op of \
     another stream on the op's buffer is not held back: a known gap of the emulated device";
const VIRTUAL_TIME_ONLY: &str = "virtual time only: AsyncContext::complete_at_ns is honoured by \
     a device in virtual time; in real time an op completes when it is done";

/// What a device in virtual time cannot run, and why.
const VIRTUAL_CLOCK_SKIPS: &[(&str, &str)] = &[
    (
        "a_mixed_context_matches_submission_order",
        "emulated devices in virtual time join only contexts of such devices (Context::new \
         refuses a host device beside them: their clock runs only when driven)",
    ),
    (
        "held_tasks_move_to_devices_without_another_call_into_the_task_layer",
        "real time only: in virtual time the devices' model runs only when the host waits, so \
         held tasks move at the task layer's calls (Task::wait, Context::wait_tasks), no thread \
         of its own (whose timing would make placements differ from run to run)",
    ),
];

/// What a device without virtual time (the host, the emulated device in real
/// time) cannot run, and why.
const VIRTUAL_TIME_SKIPS: &[(&str, &str)] = &[
    (
        "in_virtual_time_an_async_op_completes_at_the_time_it_asks",
        VIRTUAL_TIME_ONLY,
    ),
    (
        "outliers_do_not_move_the_work_share",
        "virtual time only: the inflated samples come from a kernel's declared cost (600x on a \
         grid of two blocks), which only a device in virtual time takes as its time",
    ),
    (
        "a_size_never_seen_is_predicted_by_regression",
        "virtual time only: the modelled times it predicts are deterministic there; in real \
         time a task's measured time varies from run to run by more than the 5 % asserted",
    ),
    (
        "dmda_places_each_kernel_on_the_class_it_runs_best_on",
        "virtual time only: its devices are emulated ones of two classes whose kernels' declared \
         costs are their times (in real time dmda's models learn wall-clock times that vary \
         from run to run)",
    ),
    (
        "placements_in_virtual_time_are_deterministic",
        "virtual time only: in real time the task layer's clock and the observed times that \
         train dmda's and the learning policy's models vary from run to run",
    ),
];

/// What a backend without a device driver (host, emu) cannot run, and why.
const NO_DRIVER_SKIPS: &[(&str, &str)] = &[(
    "a_lost_device_fails_its_pending_work_and_refuses_new_work",
    "device loss is injected at the driver's submission (DeviceConfig::lose_device_at_submission); \
     the host and the emulated device have no driver to lose and ignore the setting",
)];

/// What a backend whose devices run kernels' host closures (host, emu)
/// cannot run, and why.
const HOST_CODE_SKIPS: &[(&str, &str)] = &[(
    "each_task_goes_to_a_device_its_kernel_has_code_for",
    "a context of the host and this backend's device: both run host closures, so no kernel \
     has code for one of them only (a device that runs device code, Vulkan, is the other half)",
)];

/// What a device whose memory is the host's cannot run, and why.
const NO_CAPACITY_SKIPS: &[(&str, &str)] = &[
    (
        "read_mostly_keeps_a_replica_and_preferred_host_pages_are_evicted_first",
        HOST_ONE_MEMORY,
    ),
    (
        "eviction_copies_nothing_for_clean_pages_and_each_dirty_page_once",
        HOST_ONE_MEMORY,
    ),
    (
        "a_working_set_past_capacity_is_a_typed_error_naming_the_figures",
        HOST_ONE_MEMORY,
    ),
    ("thrashing_pages_are_throttled_then_pinned", HOST_ONE_MEMORY),
    (
        "random_programs_past_capacity_match_the_sequential_model",
        HOST_ONE_MEMORY,
    ),
    (
        "each_device_evicts_past_its_own_capacity_while_the_other_keeps_its_pages",
        HOST_ONE_MEMORY,
    ),
    (
        "random_programs_over_two_devices_past_capacity_match_the_sequential_model",
        HOST_ONE_MEMORY,
    ),
];
const HOST_ONE_MEMORY: &str = "the host device's memory is the host's: a managed buffer has one \
     copy, nothing is resident elsewhere, so there is no device capacity to pass (EmuConfig::capacity \
     is an emu setting)";

/// What a device without host faults on managed memory cannot run, and why.
const NO_FAULT_SKIPS: &[(&str, &str)] = &[
    (
        "a_host_touch_waits_for_the_queued_kernel_on_its_page",
        NO_HOST_FAULTS,
    ),
    (
        "host_faults_bring_the_rest_of_a_2mib_block_after_two_sequential_faults",
        NO_HOST_FAULTS,
    ),
];
const NO_HOST_FAULTS: &str = "managed host faults exist where the device has memory of its own \
     and the host copy is a view the runtime protects (the emulated device, Vulkan): on the host \
     device the buffer is the host's plain memory; a raw pointer touch there does not wait \
     (as_slice/as_mut_slice do)";

/// What a Vulkan device cannot run of managed memory, and why.
const VULKAN_MANAGED_SKIPS: &[(&str, &str)] = &[
    (
        "read_mostly_keeps_a_replica_and_preferred_host_pages_are_evicted_first",
        VK_MANAGED_WHOLE,
    ),
    (
        "eviction_copies_nothing_for_clean_pages_and_each_dirty_page_once",
        VK_MANAGED_WHOLE,
    ),
    (
        "a_working_set_past_capacity_is_a_typed_error_naming_the_figures",
        VK_MANAGED_WHOLE,
    ),
    (
        "thrashing_pages_are_throttled_then_pinned",
        VK_MANAGED_WHOLE,
    ),
    (
        "random_programs_past_capacity_match_the_sequential_model",
        VK_MANAGED_WHOLE,
    ),
    (
        "each_device_evicts_past_its_own_capacity_while_the_other_keeps_its_pages",
        VK_MANAGED_WHOLE,
    ),
    (
        "random_programs_over_two_devices_past_capacity_match_the_sequential_model",
        VK_MANAGED_WHOLE,
    ),
];
const VK_MANAGED_WHOLE: &str = "a managed buffer's device copy on Vulkan is one allocation of the \
     whole buffer (api/managed.rs), so there is no page-by-page capacity to pass or evict from \
     (EmuConfig::capacity is an emu setting)";

/// What the emulated device cannot run, in either time mode, and why.
const EMU_SKIPS: &[(&str, &str)] = &[
    (
        "low_priority_progresses_under_continuous_high_priority_work",
        EMU_NO_AGING,
    ),
    (
        "async_ops_progress_between_the_blocks_of_a_running_kernel",
        EMU_BLOCKS_BACK_TO_BACK,
    ),
    (
        "callback_waiting_on_another_stream_works_with_one_compute_unit",
        EMU_CALLBACK_WAITS,
    ),
    (
        "memory_a_slow_kernel_uses_is_not_reused_by_another_stream",
        EMU_ONE_THREAD_KERNEL,
    ),
    (
        "a_running_launch_keeps_its_kernel_while_its_slot_is_replaced",
        EMU_ONE_THREAD_KERNEL,
    ),
    (
        "consumers_follow_the_engine_that_wrote_their_data",
        EMU_NO_PLACEMENT,
    ),
    (
        "consumers_follow_their_writer_while_other_engines_park",
        EMU_NO_PLACEMENT,
    ),
    (
        "other_streams_run_beside_an_async_op_but_not_on_its_buffer",
        EMU_ASYNC_NO_LOCKS,
    ),
];

// Reasons for the Vulkan backend.
const VK_ASYNC_AFTER_DEVICE: &str = "asserts that an async op starts and completes between the \
     blocks of a running kernel; the Vulkan engine starts an async op only when its stream and the \
     device have nothing in flight (it reaches its buffers' bytes directly: backend/vulkan/engine.rs \
     module doc), and a workgroup cannot complete a host-side op as the closure's first block does";
const VK_KERNEL_CALLS_RUNTIME: &str = "the kernel calls into the runtime (drops a stream, reads \
     a buffer, synchronizes, submits) and the test checks what those calls do; device code cannot \
     call the host (the same calls from a host callback, which Vulkan runs, are tested in \
     hardening.rs)";
const VK_GATED_KERNEL: &str = "holds a kernel running at a host gate (so the test knows it is \
     running) and checks from inside it that its closure was not dropped; device code can neither \
     wait for the host nor see its own kernel's handle";
const VK_HOST_VIEWS: &str = "checks host-side typed views of a kernel's arguments (Block::read \
     with a mismatched element type, Block::write_rows of a flat buffer split between blocks); a \
     WGSL kernel binds raw storage buffers, so there is no view to check";
const VK_NO_PLACEMENT: &str = "placement by data is the host engines' policy; the Vulkan \
     backend has one engine thread and one queue, so the check would pass vacuously";
const VK_ONE_UNIT: &str = "asserts a plan of several lanes; a plan has at most one lane per \
     compute unit and the Vulkan device reports one (its kernels all run on its compute lane)";
const VK_QUEUED_AT_ONCE: &str = "asserts that stream priority orders work that became ready \
     at once; the Vulkan engine hands each stream's work to the device's one queue as it arrives \
     (a wait on another stream of the device is a wait on the device, engine.rs), so work already \
     submitted runs in the order it arrived and priority orders only what the engine has yet to \
     take (lavapipe's queue has no priorities either)";
/// What the Vulkan backend cannot run, and why.
const VULKAN_SKIPS: &[(&str, &str)] = &[
    (
        "dmdas_runs_a_ready_high_priority_task_first",
        VK_QUEUED_AT_ONCE,
    ),
    (
        "async_ops_progress_between_the_blocks_of_a_running_kernel",
        VK_ASYNC_AFTER_DEVICE,
    ),
    (
        "dropping_the_last_stream_in_a_kernel_does_not_hang",
        VK_KERNEL_CALLS_RUNTIME,
    ),
    (
        "kernel_reading_its_own_argument_synchronously_is_an_error",
        VK_KERNEL_CALLS_RUNTIME,
    ),
    (
        "kernel_type_mismatch_fails_stream_not_process",
        VK_HOST_VIEWS,
    ),
    (
        "blocking_calls_inside_graph_nodes_work_or_refuse_never_hang",
        VK_KERNEL_CALLS_RUNTIME,
    ),
    (
        "a_kernel_submitting_a_task_while_the_pool_is_full_does_not_deadlock",
        VK_KERNEL_CALLS_RUNTIME,
    ),
    (
        "a_kernel_launching_its_graph_while_a_launch_waits_for_room_does_not_deadlock",
        VK_KERNEL_CALLS_RUNTIME,
    ),
    (
        "a_kernel_waiting_for_a_held_task_gets_an_error_not_a_hang",
        VK_KERNEL_CALLS_RUNTIME,
    ),
    (
        "a_flat_buffer_written_by_rows_by_several_blocks_fails_the_stream",
        VK_HOST_VIEWS,
    ),
    (
        "consumers_follow_the_engine_that_wrote_their_data",
        VK_NO_PLACEMENT,
    ),
    (
        "consumers_follow_their_writer_while_other_engines_park",
        VK_NO_PLACEMENT,
    ),
    (
        "lanes_are_held_to_the_memory_budget_and_free_without_buffers",
        VK_ONE_UNIT,
    ),
    (
        "a_running_launch_keeps_its_kernel_while_its_slot_is_replaced",
        VK_GATED_KERNEL,
    ),
];

/// Whether the backend under test lists `test` (the test function's name) in
/// its skip table; if so, says so with the reason, on stderr past the test
/// harness's capture, so every run's log shows what it did not check. A test
/// starts with `if common::skipped("its_name") { return; }`.
pub fn skipped(test: &str) -> bool {
    // The harness names each test's thread after the test: a misspelt name here
    // would never match the table.
    if let Some(running) = std::thread::current().name() {
        if running != "main" {
            assert_eq!(
                running.rsplit("::").next(),
                Some(test),
                "common::skipped names another test"
            );
        }
    }
    let backend = backend();
    let mut listed = backend.skips().iter().flat_map(|t| t.iter());
    let Some((_, reason)) = listed.find(|(name, _)| *name == test) else {
        return false;
    };
    let line = format!("skipped on {}: {test}: {reason}\n", backend.name());
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    true
}

/// Open once `open` is called or the gate drops.
pub struct Gate {
    open: Arc<AtomicBool>,
    /// Set by the gate's op once it runs (it then holds its engine).
    reached: Arc<AtomicBool>,
    /// For `hold`: the host event the stream waits on, and an event recorded
    /// just before it (the stream reached the gate when it completes).
    held: Option<(HostEvent, Event)>,
}

impl Gate {
    /// A closed gate that no stream waits on yet.
    pub fn new() -> Gate {
        Gate {
            open: Arc::new(AtomicBool::new(false)),
            reached: Arc::new(AtomicBool::new(false)),
            held: None,
        }
    }

    /// Holds `s`: its later work waits until the gate opens. The stream waits on
    /// a host event, so no engine is occupied, on any backend.
    pub fn hold(s: &Stream) -> Gate {
        let mut g = Gate::new();
        let before = s.record_event().expect("record");
        let go = s.device().host_event();
        s.wait_event(go.event()).expect("gate");
        g.held = Some((go, before));
        g
    }

    /// A closure that says it was reached, then returns once the gate opens (for
    /// a kernel or a host callback).
    pub fn waiter(&self) -> impl Fn() + Send + Sync + 'static {
        let (open, reached) = (self.open.clone(), self.reached.clone());
        move || {
            reached.store(true, Ordering::Release);
            while !open.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
        }
    }

    /// Returns once the stream got as far as the gate (for `hold`), or once an op
    /// waiting on the gate runs (for `waiter`).
    pub fn wait_reached(&self) {
        if let Some((_, before)) = &self.held {
            before.synchronize().expect("the stream reaches the gate");
            return;
        }
        while !self.reached.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
    }

    /// As `wait_reached`, polling `s` meanwhile: a device in virtual time runs
    /// only when a host thread waits or polls, so a `waiter` on another thread
    /// (one an async op's poll hands work to) is reached only then.
    pub fn wait_reached_polling(&self, s: &Stream) {
        while !self.reached.load(Ordering::Acquire) {
            s.query().expect("the stream polled");
            std::thread::yield_now();
        }
    }

    pub fn open(&self) {
        self.open.store(true, Ordering::Release);
        if let Some((go, _)) = &self.held {
            go.signal();
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

/// Gives the device's free engines turns to run whatever work is ready: a few
/// round trips through a fresh stream. Work that is wrongly ready (a missing
/// wait) then usually runs before the test looks; the test still cannot see
/// "never runs", so its final check (on values, after the gate opens) is what
/// catches an ordering bug for sure when the work ran early. A window by
/// progress, not by time: nothing here depends on how fast the machine is.
pub fn settle(d: &Device) {
    let probe = d.create_stream().expect("probe stream");
    for _ in 0..4 {
        probe.host_fn(|| ()).expect("probe");
        probe.synchronize().expect("probe");
    }
}

/// Device time `f` takes on a fresh stream of `dev` (virtual time on an
/// emulated device in virtual mode): from an idle stream to its completion.
pub fn modelled(dev: &Device, f: impl FnOnce(&Stream)) -> u64 {
    let s = dev.create_stream().expect("stream");
    s.synchronize().expect("idle");
    let t0 = dev.now_ns();
    f(&s);
    s.synchronize().expect("sync");
    dev.now_ns() - t0
}

/// Runs `f` on its own thread; fails the test if it has not returned in `secs`.
pub fn within<R: Send + 'static>(
    secs: u64,
    what: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what}: still running after {secs} s (hung)"))
}

/// Checks that read a buffer in stream order and say later what they saw:
/// each check is a kernel that writes into a result buffer of its own the
/// buffer's first element and how many elements differ from it (host code and
/// its WGSL twin alike, so a device that runs compiled code checks the same
/// thing as one that runs the closure). The result buffers are allocated up
/// front (`Checks::new`), so they take no part in the reuse a test watches.
pub struct Checks {
    kernel: Kernel,
    free: Vec<DeviceBuffer<u32>>,
    queued: Vec<(DeviceBuffer<u32>, u32)>,
}

impl Checks {
    /// Room for `n` checks on `d`.
    pub fn new(d: &Device, n: usize) -> Checks {
        let kernel = Kernel::new("check", |b| {
            let x = b.read::<u32>(0);
            let first = x.first().copied().unwrap_or(0);
            let differ = x.iter().filter(|v| **v != first).count() as u32;
            b.write::<u32>(0).copy_from_slice(&[first, differ]);
        })
        .wgsl(wgsl::check_uniform(1), "main");
        let free = (0..n)
            .map(|_| d.alloc::<u32>(2).expect("a check's result buffer"))
            .collect();
        Checks {
            kernel,
            free,
            queued: Vec::new(),
        }
    }

    /// Queues on `s` a check that every element of `buf` is `want`.
    pub fn launch(&mut self, s: &Stream, buf: &DeviceBuffer<u32>, want: u32) {
        let r = self
            .free
            .pop()
            .expect("Checks::new made room for every check");
        s.launch(
            &self.kernel,
            Grid::new(1),
            &[Arg::read(buf), Arg::write(&r)],
        )
        .expect("check queued");
        self.queued.push((r, want));
    }

    /// How many checks (once their streams are synchronized) saw a buffer
    /// that was not all its own value, read on `s`.
    pub fn wrong(&self, s: &Stream) -> usize {
        self.queued
            .iter()
            .filter(|(r, want)| s.read_to_vec(r).expect("a check's result") != [*want, 0])
            .count()
    }
}
