//! Emulated devices of one context, together: the peer links between them and
//! one lock over their models. Whoever runs any member's model holds the
//! group's lock, so a peer copy started in one model may move bytes in the
//! other device's memory while that device's model is still (no engine of it
//! runs), and in virtual time every member's model runs in one loop on one
//! clock: a host wait on any member dispatches all of them and jumps all to
//! the earliest next event, so a stream of one device waiting on an event of
//! another starts at the modelled time it completed, and a run's trace hashes
//! stay deterministic (members are dispatched in device-id order).

use super::engine::{self, Sim};
use super::{EmuBackend, Shared};
use crate::config::emu::TimeMode;
use crate::config::peer::PeerLink;
use crate::exec::storage::Reach;
use crate::{Error, Result};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

pub(crate) struct Group {
    /// Held by whoever runs a member's model (before that member's own lock).
    lock: Mutex<()>,
    /// By device id.
    members: Vec<(u64, Weak<Shared>)>,
    /// The direct links, per unordered pair.
    links: Vec<(u64, u64, PeerLink)>,
    /// How each member's engines reach its memory (fixed at creation).
    reaches: Vec<(u64, Reach)>,
}

impl Group {
    /// The peer link between devices `a` and `b`, if they have one.
    pub(crate) fn link(&self, a: u64, b: u64) -> Option<&PeerLink> {
        self.links
            .iter()
            .find(|(x, y, _)| (*x, *y) == (a, b) || (*x, *y) == (b, a))
            .map(|(_, _, l)| l)
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

fn advance_all(sims: &mut [MutexGuard<'_, Sim>], members: &[Arc<Shared>], t: u64) {
    for (sim, sh) in sims.iter_mut().zip(members) {
        sim.advance_to(sh, t);
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
        links,
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
    if shared[0].emu.time == TimeMode::Virtual {
        let mut sims: Vec<MutexGuard<'_, Sim>> = shared
            .iter()
            .map(|m| m.sim.lock().unwrap_or_else(|p| p.into_inner()))
            .collect();
        let _inside = engine::InSim::enter();
        let t = sims.iter().map(|s| s.now).max().unwrap_or(0);
        for (sim, sh) in sims.iter_mut().zip(&shared) {
            catch_up(sim, sh, t);
        }
    }
    drop(held);
    Ok(())
}
