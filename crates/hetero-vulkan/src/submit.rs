//! Submission: command buffers to a lane's queue with `vkQueueSubmit2`, waiting
//! on and signalling timelines; what a submission uses stays alive until it
//! completes (the queue's keep-alive list, released by `device.rs`'s sweeps).

use crate::command::CommandBuffer;
use crate::device::{lock, Gpu, Sync2};
use crate::error::{call, Result, VkError};
use crate::queue::{KeepAlive, Lane};
use crate::timeline::Timeline;
use ash::vk;
use smallvec::SmallVec;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Gpu {
    /// Submits command buffers to a lane's queue with `vkQueueSubmit2`: the work starts
    /// after every `(timeline, value)` in `waits` is reached, and each timeline in
    /// `signals` is set to its value when the work completes.
    ///
    /// A command buffer may be submitted again (and while still pending); the objects
    /// it uses stay alive until the submission completes.
    pub fn submit(
        &self,
        lane: Lane,
        cmds: &[&CommandBuffer],
        waits: &[(&Timeline, u64)],
        signals: &[(&Timeline, u64)],
    ) -> Result<()> {
        let s = &self.shared;
        s.check_lost("vkQueueSubmit2")?;
        let slot_index = s.lanes[lane.index()];
        let slot = &s.queues[slot_index];
        for c in cmds {
            if !Arc::ptr_eq(&c.inner.shared, s) {
                return Err(VkError::ForeignObject {
                    what: "a command buffer",
                });
            }
            if c.inner.family != slot.family {
                return Err(VkError::InvalidArgument(format!(
                    "a command buffer recorded for queue family {} was submitted to the {lane:?} lane, \
                     whose queue is in family {}; record it for this lane",
                    c.inner.family, slot.family
                )));
            }
        }
        for (t, _) in waits.iter().chain(signals) {
            if !Arc::ptr_eq(&t.inner.shared, s) {
                return Err(VkError::ForeignObject { what: "a timeline" });
            }
        }
        let stage = vk::PipelineStageFlags2::ALL_COMMANDS;
        // Inline lists: a submission of a few buffers allocates nothing.
        let wait_infos: SmallVec<[vk::SemaphoreSubmitInfo<'_>; 4]> = waits
            .iter()
            .map(|(t, v)| {
                vk::SemaphoreSubmitInfo::default()
                    .semaphore(t.inner.semaphore)
                    .value(*v)
                    .stage_mask(stage)
            })
            .collect();
        let cb_infos: SmallVec<[vk::CommandBufferSubmitInfo<'_>; 4]> = cmds
            .iter()
            .map(|c| vk::CommandBufferSubmitInfo::default().command_buffer(c.inner.cb))
            .collect();

        s.sweep(slot_index);
        let mut state = lock(&slot.state);
        if s.submissions.load(Ordering::Relaxed) + 1 >= s.lose_at {
            s.lost.store(true, Ordering::Release);
            return Err(VkError::DeviceLost {
                call: "vkQueueSubmit2",
            });
        }
        let value = state.last + 1;
        let mut signal_infos: SmallVec<[vk::SemaphoreSubmitInfo<'_>; 4]> = signals
            .iter()
            .map(|(t, v)| {
                vk::SemaphoreSubmitInfo::default()
                    .semaphore(t.inner.semaphore)
                    .value(*v)
                    .stage_mask(stage)
            })
            .collect();
        signal_infos.push(
            vk::SemaphoreSubmitInfo::default()
                .semaphore(slot.progress)
                .value(value)
                .stage_mask(stage),
        );
        let submit = vk::SubmitInfo2::default()
            .wait_semaphore_infos(&wait_infos)
            .command_buffer_infos(&cb_infos)
            .signal_semaphore_infos(&signal_infos);
        // SAFETY: the queue is locked (external synchronisation); every command
        // buffer is executable (finished recording) and recorded with
        // SIMULTANEOUS_USE, so resubmitting a pending one is allowed; every semaphore
        // is a live timeline semaphore of this device (checked above).
        let r = unsafe {
            match &s.sync2 {
                Sync2::Core => s
                    .device
                    .queue_submit2(state.queue, &[submit], vk::Fence::null()),
                Sync2::Khr(k) => k.queue_submit2(state.queue, &[submit], vk::Fence::null()),
            }
        };
        s.note(r.map_err(call("vkQueueSubmit2")))?;
        state.last = value;
        drop(state);

        let mut keep = KeepAlive::new();
        for c in cmds {
            keep.push(Arc::clone(&c.inner) as Arc<dyn Send + Sync>);
        }
        for (t, _) in waits.iter().chain(signals) {
            keep.push(Arc::clone(&t.inner) as Arc<dyn Send + Sync>);
        }
        lock(&slot.keep).push((value, keep));
        slot.submitted.fetch_add(1, Ordering::Relaxed);
        s.submissions.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
