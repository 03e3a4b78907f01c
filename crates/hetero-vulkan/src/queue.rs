//! The queue plan (which hardware queue each lane drains) and submission.
//!
//! Plan, by IREE's rules (hal/drivers/vulkan device selection): the compute lane
//! takes a family with COMPUTE, preferring one without GRAPHICS; the transfer lane
//! takes a transfer-only family when there is one (copy engines), else a second
//! queue of the compute family, else it aliases the compute queue (lavapipe: one
//! family with one queue).
//!
//! Invariants: `vkQueueSubmit2` on a `VkQueue` is externally synchronised, so each
//! distinct queue sits behind one `Mutex`, and two aliased lanes share it. Every
//! submission also signals the queue's private `progress` timeline with the next
//! value, taken under that mutex, so values on it complete in order; command
//! buffers and keep-alive lists are released by comparing with it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ash::vk;

use crate::info::QueueFamilyInfo;

/// A lane: an in-order stream of work that hetero maps onto one hardware queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Dispatches (and copies, fills, timestamps).
    Compute,
    /// Copies and fills; on a copy engine when the device has one.
    Transfer,
}

impl Lane {
    pub(crate) fn index(self) -> usize {
        match self {
            Lane::Compute => 0,
            Lane::Transfer => 1,
        }
    }
}

/// Which hardware queue one lane uses.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LaneQueue {
    /// Queue family index.
    pub family: u32,
    /// Queue index within the family.
    pub index: u32,
    /// True when this lane shares its hardware queue with another lane.
    pub aliased: bool,
    /// The family's capabilities.
    pub flags: vk::QueueFlags,
    /// Valid timestamp bits on this family (0: no timestamps).
    pub timestamp_valid_bits: u32,
}

impl fmt::Debug for LaneQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LaneQueue")
            .field("family", &self.family)
            .field("index", &self.index)
            .field("aliased", &self.aliased)
            .field("flags", &format_args!("{}", crate::info::flags(self.flags)))
            .field("timestamp_valid_bits", &self.timestamp_valid_bits)
            .finish()
    }
}

/// The hardware queue of each lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePlan {
    pub compute: LaneQueue,
    pub transfer: LaneQueue,
}

impl QueuePlan {
    /// The queue a lane uses.
    pub fn lane(&self, lane: Lane) -> LaneQueue {
        match lane {
            Lane::Compute => self.compute,
            Lane::Transfer => self.transfer,
        }
    }

    /// Chooses queues from a device's families; None when no family computes.
    pub fn choose(families: &[QueueFamilyInfo]) -> Option<QueuePlan> {
        let find = |want: vk::QueueFlags, avoid: vk::QueueFlags| {
            families
                .iter()
                .position(|f| f.count > 0 && f.flags.contains(want) && !f.flags.intersects(avoid))
        };
        let compute = find(vk::QueueFlags::COMPUTE, vk::QueueFlags::GRAPHICS)
            .or_else(|| find(vk::QueueFlags::COMPUTE, vk::QueueFlags::empty()))?;
        let lane = |family: usize, index: u32, aliased: bool| LaneQueue {
            family: family as u32,
            index,
            aliased,
            flags: families[family].flags,
            timestamp_valid_bits: families[family].timestamp_valid_bits,
        };
        let dedicated = find(
            vk::QueueFlags::TRANSFER,
            vk::QueueFlags::COMPUTE | vk::QueueFlags::GRAPHICS,
        );
        Some(match dedicated {
            Some(t) => QueuePlan {
                compute: lane(compute, 0, false),
                transfer: lane(t, 0, false),
            },
            None if families[compute].count >= 2 => QueuePlan {
                compute: lane(compute, 0, false),
                transfer: lane(compute, 1, false),
            },
            None => QueuePlan {
                compute: lane(compute, 0, true),
                transfer: lane(compute, 0, true),
            },
        })
    }

    /// The distinct families in the plan (one or two), for sharing modes.
    pub(crate) fn families(&self) -> Vec<u32> {
        let mut f = vec![self.compute.family];
        if self.transfer.family != self.compute.family {
            f.push(self.transfer.family);
        }
        f
    }
}

impl fmt::Display for QueuePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let one = |f: &mut fmt::Formatter<'_>, name: &str, q: &LaneQueue| {
            write!(
                f,
                "{name} -> family {} queue {}{}",
                q.family,
                q.index,
                if q.aliased { " (aliased)" } else { "" }
            )
        };
        one(f, "compute", &self.compute)?;
        f.write_str(", ")?;
        one(f, "transfer", &self.transfer)
    }
}

/// Objects a submission uses, held until it completes: its command buffers
/// and timelines, inline for the usual few (a submission allocates nothing).
pub(crate) type KeepAlive = smallvec::SmallVec<[Arc<dyn Send + Sync>; 4]>;

/// One distinct `VkQueue`, its lock, and its private progress timeline.
pub(crate) struct QueueSlot {
    pub(crate) family: u32,
    /// The queue handle and the last progress value submitted, under one lock:
    /// taking the value and submitting must be one step, or values could complete
    /// out of order.
    pub(crate) state: Mutex<QueueState>,
    pub(crate) progress: vk::Semaphore,
    /// Objects that pending submissions use, released once `progress` passes the value.
    pub(crate) keep: Mutex<Vec<(u64, KeepAlive)>>,
    pub(crate) submitted: AtomicU64,
}

pub(crate) struct QueueState {
    pub(crate) queue: vk::Queue,
    pub(crate) last: u64,
}

impl QueueSlot {
    pub(crate) fn submitted(&self) -> u64 {
        self.submitted.load(Ordering::Relaxed)
    }
}
