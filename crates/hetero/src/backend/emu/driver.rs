//! What runs the emulated device's model: in virtual time, the host thread that
//! waits or polls (`Driver`); in real time, the device's driver thread, which
//! sleeps until the next modelled event (spinning when it is near). Also the
//! device's clock as other floors see it (`DeviceClock`).
use super::engine::{self};
use super::Shared;
use crate::exec::timeline::{Driver, Timeline};
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Real time: the driver waits for a modelled completion nearer than this
/// awake (spinning, then yielding its core), not parked. Waking a parked
/// thread costs about 100 µs on a busy 2-core VM (scheduler latency; timer
/// slack without `set_current_timer_slack`), more than a whole pipeline stage
/// of a small transfer; a spin hand-off costs well under a microsecond. A
/// farther completion is slept for until `SPIN_NS / 2` before it.
const SPIN_NS: u64 = 200_000;
/// The first part of such a wait only spins (see `spin_until`).
const SPIN_ONLY_NS: u64 = 50_000;
/// Real time: an idle driver waits awake this long for the next submission
/// before it parks (the host backend's engines and waits do the same with
/// `CompletionMode::DEFAULT_SPIN`): a program that waits and then submits its
/// next step finds the device awake.
const IDLE_SPIN_NS: u64 = 200_000;

impl Shared {
    /// Runs the model (virtual time) until `ready()` or nothing more can happen.
    fn run_virtual(&self, ready: &mut dyn FnMut() -> bool) -> Result<bool> {
        if let Some(g) = self.group.get() {
            return g.run_virtual(ready);
        }
        if engine::in_sim() {
            return Err(Error::WouldDeadlock(
                "a kernel or host callback on the emulated device waits for that device's \
                 work, which cannot run before the callback returns; wait outside the callback"
                    .into(),
            ));
        }
        let mut sim = self.sim.lock().unwrap_or_else(|p| p.into_inner());
        let _inside = engine::InSim::enter();
        loop {
            let progressed = sim.dispatch(self);
            if ready() {
                return Ok(true);
            }
            match sim.next_event(&self.emu.link) {
                Some(t) => sim.advance_to(self, t),
                None if progressed => {}
                None => return Ok(false),
            }
        }
    }

    /// One event of progress (a host poll in virtual time).
    fn step_virtual(&self) {
        if let Some(g) = self.group.get() {
            return g.step_virtual();
        }
        if engine::in_sim() {
            return;
        }
        let Ok(mut sim) = self.sim.try_lock() else {
            return;
        };
        let _inside = engine::InSim::enter();
        if !sim.dispatch(self) {
            if let Some(t) = sim.next_event(&self.emu.link) {
                sim.advance_to(self, t);
                sim.dispatch(self);
            }
        }
    }

    /// The real-time driver thread's loop.
    pub(super) fn run_real(self: &Arc<Self>) {
        // The device's engine: what runs here must not wait for the device.
        crate::exec::thread::mark_engine_thread();
        let _inside = engine::InSim::enter();
        crate::exec::timeline::set_engine_wait(refuse_wait);
        // Its long waits end close to their deadline: without this a timed
        // park may oversleep by the default 50 µs of timer slack.
        let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1_000));
        // When the model last had work or a submission came: an idle driver
        // stays awake `IDLE_SPIN_NS` after it, so the next op submitted right
        // after a wait (a program's next step) does not wait for a wake-up.
        let (mut busy_at, mut last_seen) = (0u64, u64::MAX);
        loop {
            let seen = self.bell.pending.load(Ordering::Acquire);
            let next = {
                // A member of a context's group runs its model only while no
                // other member runs its own (peer copies reach both memories).
                let _held = self.group.get().map(|g| g.hold());
                let mut sim = self.sim.lock().unwrap_or_else(|p| p.into_inner());
                // Catch the model up with the wall clock, event by event (rates
                // change only at events), starting what became ready on the way.
                let wall = self.now_ns();
                let mut dispatched = false;
                while let Some(t) = sim.next_event(&self.emu.link) {
                    if t > wall {
                        break;
                    }
                    sim.advance_to(self, t);
                    sim.dispatch(self);
                    dispatched = true;
                }
                // Ops submitted since the last look start now (the ones that
                // became ready at an event started then, above).
                if !dispatched || self.bell.pending.load(Ordering::Acquire) != seen {
                    sim.advance_to(self, wall);
                    sim.dispatch(self);
                }
                if self.shutdown.load(Ordering::Acquire) && sim.idle() && self.drained() {
                    return;
                }
                (sim.next_event(&self.emu.link), sim.polling())
            };
            let now = self.now_ns();
            if next.0.is_some() || seen != last_seen {
                (busy_at, last_seen) = (now, seen);
            }
            match next {
                (Some(t), _) if t <= now => continue,
                (None, false) if now - busy_at < IDLE_SPIN_NS => {
                    self.spin_until(busy_at + IDLE_SPIN_NS, seen)
                }
                // A modelled completion soon: wait for it awake (see `SPIN_NS`).
                (Some(t), _) if t - now <= SPIN_NS => self.spin_until(t, seen),
                // A far one: sleep until shortly before it, then wait awake. An
                // async op polled and not done completes without a submission:
                // look again after at most `async_poll`.
                (next, polling) => {
                    let far = next.map(|t| t - now - SPIN_NS / 2);
                    let poll = polling.then(|| self.config.async_poll.as_nanos() as u64);
                    match far.into_iter().chain(poll).min() {
                        Some(ns) => self.bell.wake.park_until(
                            || self.bell.pending.load(Ordering::Acquire) != seen,
                            Some(Duration::from_nanos(ns)),
                        ),
                        None => self.bell.wake.park_until(
                            || {
                                self.bell.pending.load(Ordering::Acquire) != seen
                                    || self.shutdown.load(Ordering::Acquire)
                            },
                            Some(Duration::from_millis(50)),
                        ),
                    }
                }
            }
        }
    }

    /// Waits awake until the wall clock reaches `t` or a submission comes:
    /// spins for up to `SPIN_ONLY_NS`, then yields the core between looks (a
    /// yield on a busy machine may hand the core away for a whole time slice,
    /// longer than a short wait itself).
    fn spin_until(&self, t: u64, seen: u64) {
        let from = self.now_ns();
        loop {
            let now = self.now_ns();
            if now >= t
                || self.bell.pending.load(Ordering::Acquire) != seen
                || self.shutdown.load(Ordering::Acquire)
            {
                return;
            }
            if now - from < SPIN_ONLY_NS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    fn drained(&self) -> bool {
        self.streams.all(|s| s.ring.is_empty())
    }
}

/// A wait made by the real-time driver thread (a callback inside the model):
/// the device cannot progress while it waits, so it is refused unless already met.
fn refuse_wait(
    _timeline: &Timeline,
    _value: u64,
    what: &'static str,
    ready: &mut dyn FnMut() -> bool,
) -> Result<()> {
    if ready() {
        return Ok(());
    }
    Err(Error::WouldDeadlock(format!(
        "{what} from a kernel or host callback on the emulated device: the device cannot \
         progress until the callback returns; wait outside the callback"
    )))
}

impl crate::exec::clock::DeviceClock for Shared {
    fn now_ns(&self) -> u64 {
        Shared::now_ns(self)
    }
}

impl Driver for Shared {
    fn drive(&self, ready: &mut dyn FnMut() -> bool) -> Result<bool> {
        self.run_virtual(ready)
    }

    fn poll(&self) {
        self.step_virtual();
    }
}
