//! Timelines: Vulkan timeline semaphores (a u64 counter the device and the host
//! both advance), named by hetero's word for the concept.
//!
//! Failure: Vulkan has no "failed" state for a semaphore. [`Timeline::fail`]
//! records the failed value in the timeline, then signals it anyway so every host
//! and device waiter wakes; host waits through [`Timeline::wait`] then return
//! [`VkError::TimelineFailed`]. Device work that waited on the value has run; the
//! backend must treat its results as poisoned (it knows from `failed_at`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ash::vk;
use smallvec::SmallVec;

use crate::device::{DeviceShared, Gpu};
use crate::error::{call, Result, VkError};

/// No failure recorded.
const NOT_FAILED: u64 = u64::MAX;

pub(crate) struct TimelineInner {
    pub(crate) shared: Arc<DeviceShared>,
    pub(crate) semaphore: vk::Semaphore,
    failed_at: AtomicU64,
}

impl Drop for TimelineInner {
    fn drop(&mut self) {
        // SAFETY: submissions that use the semaphore hold this struct alive in the
        // queue's keep-alive list, so none is pending when the last Arc drops.
        unsafe { self.shared.device.destroy_semaphore(self.semaphore, None) };
    }
}

/// A timeline semaphore: a monotonically increasing u64 of completed work.
///
/// ```no_run
/// # use hetero_vulkan::{Instance, Gpu, Timeline};
/// # use std::time::Duration;
/// let gpu = Gpu::open(&Instance::load()?, 0)?;
/// let t = Timeline::new(&gpu, 0)?;
/// t.signal(3)?;
/// t.wait(3, Duration::from_secs(1))?;
/// assert_eq!(t.value()?, 3);
/// # Ok::<(), hetero_vulkan::VkError>(())
/// ```
#[derive(Clone)]
pub struct Timeline {
    pub(crate) inner: Arc<TimelineInner>,
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeline")
            .field("value", &self.value().ok())
            .finish()
    }
}

impl Timeline {
    /// A timeline starting at `initial`.
    pub fn new(gpu: &Gpu, initial: u64) -> Result<Timeline> {
        let shared = Arc::clone(&gpu.shared);
        let mut ty = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(initial);
        let info = vk::SemaphoreCreateInfo::default().push_next(&mut ty);
        // SAFETY: valid create info for a live device with timeline semaphores enabled.
        let semaphore = unsafe { shared.device.create_semaphore(&info, None) }
            .map_err(call("vkCreateSemaphore"))?;
        Ok(Timeline {
            inner: Arc::new(TimelineInner {
                shared,
                semaphore,
                failed_at: AtomicU64::new(NOT_FAILED),
            }),
        })
    }

    /// The current value (polls the counter; does not block).
    pub fn value(&self) -> Result<u64> {
        let shared = &self.inner.shared;
        shared.check_lost("vkGetSemaphoreCounterValue")?;
        // SAFETY: the semaphore is a live timeline semaphore of this device.
        let r = unsafe {
            shared
                .device
                .get_semaphore_counter_value(self.inner.semaphore)
        };
        shared.note(r.map_err(call("vkGetSemaphoreCounterValue")))
    }

    /// Sets the value from the host. It must be greater than the current value and
    /// than any value a pending submission will signal.
    pub fn signal(&self, value: u64) -> Result<()> {
        let current = self.value()?;
        if value <= current {
            return Err(VkError::InvalidArgument(format!(
                "timeline signal to {value}, but it is already at {current}: values only increase"
            )));
        }
        let info = vk::SemaphoreSignalInfo::default()
            .semaphore(self.inner.semaphore)
            .value(value);
        // SAFETY: the semaphore is live; the value was checked to increase.
        unsafe { self.inner.shared.device.signal_semaphore(&info) }
            .map_err(call("vkSignalSemaphore"))
    }

    /// Marks `value` failed and signals it so that waiters wake (see the module docs).
    /// Keeps the lowest failed value when called more than once.
    pub fn fail(&self, value: u64) -> Result<()> {
        self.inner.failed_at.fetch_min(value, Ordering::AcqRel);
        if self.value()? < value {
            self.signal(value)?;
        }
        Ok(())
    }

    /// The lowest value marked failed, if any.
    pub fn failed_at(&self) -> Option<u64> {
        match self.inner.failed_at.load(Ordering::Acquire) {
            NOT_FAILED => None,
            v => Some(v),
        }
    }

    /// Blocks until any of `waits` reaches its value (`vkWaitSemaphores` with
    /// `WAIT_ANY`), or `timeout` passes; whether one did. All the timelines
    /// are of one device. (A thread that waits for the device and for the host
    /// at once: the host signals a timeline of its own.)
    pub fn wait_any(waits: &[(&Timeline, u64)], timeout: Duration) -> Result<bool> {
        let Some((first, _)) = waits.first() else {
            return Ok(false);
        };
        let shared = &first.inner.shared;
        shared.check_lost("vkWaitSemaphores")?;
        if waits
            .iter()
            .any(|(t, _)| !Arc::ptr_eq(&t.inner.shared, shared))
        {
            return Err(VkError::ForeignObject { what: "a timeline" });
        }
        // Inline for the usual few (an engine's lanes and doorbell): a wait
        // allocates nothing.
        let sems: SmallVec<[vk::Semaphore; 4]> =
            waits.iter().map(|(t, _)| t.inner.semaphore).collect();
        let values: SmallVec<[u64; 4]> = waits.iter().map(|(_, v)| *v).collect();
        let info = vk::SemaphoreWaitInfo::default()
            .flags(vk::SemaphoreWaitFlags::ANY)
            .semaphores(&sems)
            .values(&values);
        let ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: the semaphores are live timeline semaphores of one device
        // (checked); `info` and the arrays it points at live across the call.
        match unsafe { shared.device.wait_semaphores(&info, ns) } {
            Ok(()) => Ok(true),
            Err(vk::Result::TIMEOUT) => Ok(false),
            Err(e) => shared.note(Err(call("vkWaitSemaphores")(e))),
        }
    }

    /// Blocks until the value reaches `value` (`vkWaitSemaphores`), or `timeout` passes.
    ///
    /// Errors: [`VkError::Timeout`]; [`VkError::TimelineFailed`] when a value up to
    /// `value` was marked failed.
    pub fn wait(&self, value: u64, timeout: Duration) -> Result<()> {
        self.inner.shared.check_lost("vkWaitSemaphores")?;
        let sems = [self.inner.semaphore];
        let values = [value];
        let info = vk::SemaphoreWaitInfo::default()
            .semaphores(&sems)
            .values(&values);
        let ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: the semaphore is live; `info` lives across the call.
        match unsafe { self.inner.shared.device.wait_semaphores(&info, ns) } {
            Ok(()) => {}
            Err(vk::Result::TIMEOUT) => {
                return Err(VkError::Timeout {
                    value,
                    current: self.value()?,
                    timeout_ms: timeout.as_millis(),
                })
            }
            Err(e) => return self.inner.shared.note(Err(call("vkWaitSemaphores")(e))),
        }
        // Work that signalled the value may have completed: release what it held.
        self.inner.shared.sweep_all();
        match self.failed_at() {
            Some(failed_at) if failed_at <= value => {
                Err(VkError::TimelineFailed { value, failed_at })
            }
            _ => Ok(()),
        }
    }

    /// The raw semaphore, for code that records its own Vulkan calls. It stays valid
    /// while this `Timeline` (or a clone) lives.
    pub fn raw(&self) -> vk::Semaphore {
        self.inner.semaphore
    }
}
