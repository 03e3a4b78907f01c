//! Emulated devices of one context, together: the peer links between them and
//! one lock over their models. Whoever runs any member's model holds the
//! group's lock, so a peer copy started in one model may move bytes in the
//! other device's memory while that device's model is still (no engine of it
//! runs), and in virtual time every member's model runs in one loop on one
//! clock: a host wait on any member dispatches all of them and jumps all to
//! the earliest next event, so a stream of one device waiting on an event of
//! another starts at the modelled time it completed, and a run's trace hashes
//! stay deterministic (members are dispatched in device-id order).
//!
//! A peer copy takes a copy engine at both ends (out of the source, into the
//! destination), whichever device's stream issued it, and the copies on one
//! link share its rate (`PeerWire`, counted from each copy's start to its
//! completion, across the models). In virtual time that is exact: every
//! member moves to each event together, progress first, completions after.
//! In real time each device's driver applies the counts it sees when it
//! catches up, so a rate change made by the other device between two of its
//! events is applied from its last event: approximate by up to that gap.

use super::engine::{self, Sim};
use super::{EmuBackend, Shared};
use crate::config::emu::TimeMode;
use crate::config::link::Dir;
use crate::config::peer::PeerLink;
use crate::exec::storage::Reach;
use crate::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

pub(crate) struct Group {
    /// Held by whoever runs a member's model (before that member's own lock).
    lock: Mutex<()>,
    /// By device id.
    members: Vec<(u64, Weak<Shared>)>,
    /// The direct links, per unordered pair `(a, b)` with `a < b`, and the
    /// copies on each of its two lanes (0: a → b, 1: b → a), whichever
    /// device's model runs them: they share the link's rate.
    links: Vec<(u64, u64, PeerLink, Arc<[AtomicUsize; 2]>)>,
    /// How each member's engines reach its memory (fixed at creation).
    reaches: Vec<(u64, Reach)>,
}

/// A peer copy's place on its link: the link, its lanes' counts of copies,
/// and which lane (direction) this copy takes. A copy counts on its lane from
/// its start to its completion (`enter`, `Drop`).
pub(crate) struct PeerWire {
    pub(crate) link: PeerLink,
    lanes: Arc<[AtomicUsize; 2]>,
    lane: usize,
    entered: bool,
}

impl PeerWire {
    /// The copy is on its lane from now on.
    pub(crate) fn enter(mut self) -> Self {
        self.lanes[self.lane].fetch_add(1, Ordering::Relaxed);
        self.entered = true;
        self
    }

    /// Raw wire rate (bytes per ns) this copy gets now: the link's (its
    /// both-at-once rate while the other lane carries data), shared equally
    /// among the copies on its lane.
    pub(crate) fn rate(&self) -> f64 {
        let same = self.lanes[self.lane].load(Ordering::Relaxed).max(1);
        let both = self.lanes[1 - self.lane].load(Ordering::Relaxed) > 0;
        self.link.wire_rate(Dir::H2D, both) / same as f64
    }
}

impl Drop for PeerWire {
    fn drop(&mut self) {
        if self.entered {
            self.lanes[self.lane].fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Group {
    /// The lane of the link from device `src` to `dst`, if they have a link.
    pub(crate) fn wire(&self, src: u64, dst: u64) -> Option<PeerWire> {
        self.links
            .iter()
            .find(|(a, b, _, _)| (*a, *b) == (src, dst) || (*a, *b) == (dst, src))
            .map(|(a, _, link, lanes)| PeerWire {
                link: link.clone(),
                lanes: lanes.clone(),
                lane: usize::from(*a != src),
                entered: false,
            })
    }

    /// Member `device`, if it is alive.
    pub(crate) fn member(&self, device: u64) -> Option<Arc<Shared>> {
        self.members
            .iter()
            .find(|(d, _)| *d == device)
            .and_then(|(_, w)| w.upgrade())
    }

    /// How the engines reach member `device`'s memory.
    pub(crate) fn reach_of(&self, device: u64) -> Option<Reach> {
        self.reaches
            .iter()
            .find(|(d, _)| *d == device)
            .map(|(_, r)| *r)
    }

    /// Taken before a member's model lock by whoever runs that model.
    pub(crate) fn hold(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn live(&self) -> Vec<Arc<Shared>> {
        self.members
            .iter()
            .filter_map(|(_, w)| w.upgrade())
            .collect()
    }

    /// Virtual time: runs every member's model together until `ready()` holds
    /// (true) or nothing more can happen now (false).
    pub(crate) fn run_virtual(&self, ready: &mut dyn FnMut() -> bool) -> Result<bool> {
        if engine::in_sim() {
            return Err(Error::WouldDeadlock(
                "a kernel or host callback on an emulated device waits for work of its \
                 context's emulated devices, which cannot run before the callback returns; \
                 wait outside the callback"
                    .into(),
            ));
        }
        let members = self.live();
        let _held = self.hold();
        let mut sims: Vec<MutexGuard<'_, Sim>> = members
            .iter()
            .map(|m| m.sim.lock().unwrap_or_else(|p| p.into_inner()))
            .collect();
        let _inside = engine::InSim::enter();
        loop {
            let progressed = dispatch_all(&mut sims, &members);
            if ready() {
                return Ok(true);
            }
            match next_event(&sims, &members) {
                Some(t) => advance_all(&mut sims, &members, t),
                None if progressed => {}
                None => return Ok(false),
            }
        }
    }

    /// One event of progress for every member (a host poll in virtual time).
    pub(crate) fn step_virtual(&self) {
        if engine::in_sim() {
            return;
        }
        let members = self.live();
        let Ok(_held) = self.lock.try_lock() else {
            return;
        };
        let mut sims: Vec<MutexGuard<'_, Sim>> = Vec::with_capacity(members.len());
        for m in &members {
            match m.sim.try_lock() {
                Ok(s) => sims.push(s),
                Err(_) => return,
            }
        }
        let _inside = engine::InSim::enter();
        if !dispatch_all(&mut sims, &members) {
            if let Some(t) = next_event(&sims, &members) {
                advance_all(&mut sims, &members, t);
                dispatch_all(&mut sims, &members);
            }
        }
    }
}

/// Dispatches every member until none starts anything more (an op completed
/// at its start on one may let another's wait go).
fn dispatch_all(sims: &mut [MutexGuard<'_, Sim>], members: &[Arc<Shared>]) -> bool {
    let mut any = false;
    loop {
        let mut round = false;
        for (sim, sh) in sims.iter_mut().zip(members) {
            round |= sim.dispatch(sh);
        }
        any |= round;
        if !round {
            return any;
        }
    }
}

fn next_event(sims: &[MutexGuard<'_, Sim>], members: &[Arc<Shared>]) -> Option<u64> {
    sims.iter()
        .zip(members)
        .filter_map(|(s, sh)| s.next_event(&sh.emu.link))
        .min()
}

/// Every member to `t`: first every transfer's progress (at the rates of the
/// interval, which copies on shared links fix), then what ends.
fn advance_all(sims: &mut [MutexGuard<'_, Sim>], members: &[Arc<Shared>], t: u64) {
    for (sim, sh) in sims.iter_mut().zip(members) {
        sim.progress_to(sh, t);
    }
    for (sim, sh) in sims.iter_mut().zip(members) {
        sim.finish_now(sh);
    }
}

/// Brings a model's clock to `t`, completing what ends on the way (rates
/// change only at events) and starting what becomes ready.
fn catch_up(sim: &mut Sim, sh: &Shared, t: u64) {
    while let Some(next) = sim.next_event(&sh.emu.link) {
        if next > t {
            break;
        }
        sim.advance_to(sh, next);
        sim.dispatch(sh);
    }
    sim.advance_to(sh, t);
}

/// Joins emulated devices (by id, with their backends) into one group with
/// `links` between pairs. In virtual time their clocks are first brought to
/// the latest of them.
pub(crate) fn join(
    members: &[(u64, &dyn super::Backend)],
    links: Vec<(u64, u64, PeerLink)>,
) -> Result<()> {
    if engine::in_sim() {
        return Err(Error::WouldDeadlock(
            "Context::new from a kernel or host callback on an emulated device: the device's \
             model runs the callback; make the context outside it"
                .into(),
        ));
    }
    let mut shared: Vec<Arc<Shared>> = Vec::with_capacity(members.len());
    for (id, b) in members {
        let emu = b
            .as_any()
            .and_then(|a| a.downcast_ref::<EmuBackend>())
            .ok_or_else(|| {
                Error::InvalidArgument(format!("device {id} is not an emulated device"))
            })?;
        shared.push(emu.shared.clone());
    }
    shared.sort_by_key(|s| s.device);
    if shared.iter().any(|s| s.emu.time != shared[0].emu.time) {
        return Err(Error::DeviceContext {
            op: "Context::new",
            detail: "emulated devices in virtual time and in real time cannot share a \
                     context: give them all the same time mode"
                .into(),
        });
    }
    let group = Arc::new(Group {
        lock: Mutex::new(()),
        members: shared
            .iter()
            .map(|s| (s.device, Arc::downgrade(s)))
            .collect(),
        links: links
            .into_iter()
            .map(|(a, b, l)| (a.min(b), a.max(b), l, Arc::default()))
            .collect(),
        reaches: shared.iter().map(|s| (s.device, s.reach)).collect(),
    });
    // Taken before any member joins: no model of the group runs meanwhile.
    let held = group.hold();
    for s in &shared {
        if s.group.set(group.clone()).is_err() {
            return Err(Error::DeviceContext {
                op: "Context::new",
                detail: format!("device {} is in a context already", s.device),
            });
        }
    }
    // Each model's lock once, after every member knows its group: a real-time
    // driver that looked before the group was set finishes that step first,
    // and every later step takes the group's lock. In virtual time the
    // members' clocks are brought to the latest of them meanwhile.
    let mut sims: Vec<MutexGuard<'_, Sim>> = shared
        .iter()
        .map(|m| m.sim.lock().unwrap_or_else(|p| p.into_inner()))
        .collect();
    if shared[0].emu.time == TimeMode::Virtual {
        let _inside = engine::InSim::enter();
        let t = sims.iter().map(|s| s.now).max().unwrap_or(0);
        for (sim, sh) in sims.iter_mut().zip(&shared) {
            catch_up(sim, sh, t);
        }
    }
    drop(sims);
    drop(held);
    Ok(())
}
