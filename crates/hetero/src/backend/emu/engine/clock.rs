//! The emulated device's clock: the next event (a completion, or a transfer's
//! end at the rates the link gives the transfers on the wire together) and the
//! advance to it.
use super::{Sim, Transfer};
use crate::backend::emu::Shared;
use crate::config::link::{Dir, LinkPreset};
use std::sync::atomic::Ordering;

impl Sim {
    /// Per-direction state of the host link: transfers with bytes on the wire.
    fn on_wire(&self) -> [usize; 2] {
        let mut n = [0usize; 2];
        for r in &self.running {
            if let Some(t) = &r.transfer {
                if t.setup_until <= self.now && t.peer.is_none() {
                    n[t.dir as usize] += 1;
                }
            }
        }
        n
    }

    /// The rate of `t`, bytes per ns, with `wire` transfers on the host link's
    /// wires (a peer copy's rate is its link's: `PeerWire::rate`).
    fn rate(link: &LinkPreset, t: &Transfer, wire: [usize; 2]) -> f64 {
        match &t.peer {
            Some(p) => p.rate(),
            None => {
                let both = wire[0] > 0 && wire[1] > 0;
                link.wire_rate(t.dir, both) / wire[t.dir as usize].max(1) as f64
            }
        }
    }

    /// When the next op completes or a transfer's data phase begins.
    pub(crate) fn next_event(&self, link: &LinkPreset) -> Option<u64> {
        let wire = self.on_wire();
        // A lone transfer's rate never changes: its setup end is no event (the
        // common case of one stream copying, at one event per copy).
        let alone = self.running.iter().filter(|r| r.transfer.is_some()).count() == 1;
        self.running
            .iter()
            .map(|r| match &r.transfer {
                Some(t) if t.setup_until > self.now && !alone => t.setup_until,
                Some(t) => {
                    let on_wire = [
                        usize::from(t.dir == Dir::H2D),
                        usize::from(t.dir == Dir::D2H),
                    ];
                    let w = if alone { on_wire } else { wire };
                    let rate = Self::rate(link, t, w);
                    let from = t.setup_until.max(self.now);
                    let end = from + (t.remaining / rate).ceil().max(0.0) as u64;
                    end.max(t.floor)
                }
                None => r.end,
            })
            .min()
    }

    /// Moves the clock to `t` (no event lies in between) and completes what ends.
    pub(crate) fn advance_to(&mut self, sh: &Shared, t: u64) {
        self.progress_to(sh, t);
        self.finish_now(sh);
    }

    /// Moves the clock to `t` (no event lies in between): every transfer's
    /// bytes progress at the interval's rates.
    pub(crate) fn progress_to(&mut self, sh: &Shared, t: u64) {
        let link = &sh.emu.link;
        let wire = self.on_wire();
        let now = self.now;
        for r in &mut self.running {
            if let Some(tr) = &mut r.transfer {
                // Only a lone transfer enters the wire between events (see
                // `next_event`): it runs alone from its setup end.
                let from = tr.setup_until.max(now);
                if from < t {
                    let mut w = wire;
                    w[tr.dir as usize] = w[tr.dir as usize].max(1);
                    tr.remaining -= Self::rate(link, tr, w) * (t - from) as f64;
                }
            }
        }
        self.now = self.now.max(t);
        sh.publish_now(self.now);
    }

    /// Completes what ends at the current time.
    pub(crate) fn finish_now(&mut self, sh: &Shared) {
        let now = self.now;
        // What ends now, completed in start order (deterministic): sequence
        // numbers first, so each op moves once, out of `running` into `complete`.
        let mut done = std::mem::take(&mut self.finished);
        done.extend(self.running.iter().filter_map(|r| {
            let finished = match &r.transfer {
                Some(tr) => tr.setup_until <= now && tr.remaining < 0.5 && tr.floor <= now,
                None => r.end <= now,
            };
            finished.then_some(r.seq)
        }));
        done.sort_unstable();
        for &seq in &done {
            let Some(i) = self.running.iter().position(|r| r.seq == seq) else {
                continue;
            };
            let mut r = self.running.swap_remove(i);
            self.mark(sh, r.engine, true);
            // A peer copy: off its link, and the other end's engine free (its
            // driver looks again: in real time it may be parked).
            r.transfer = None;
            if let Some((other, k, i)) = r.remote.take() {
                other.set_copy_busy(k, i, false);
                other.submitted();
            }
            r.stream.served.in_flight.store(false, Ordering::Relaxed);
            self.complete(sh, r);
        }
        done.clear();
        self.finished = done;
    }
}
