//! Pending frees, the block level's last tier: freed blocks in a list under
//! the pool mutex, each returning to the TLSF (`reap`) once its fences (of its
//! home stream's queued work, of its uses on other streams) complete.
//!
//! A block freed on stream S is reused at once by later work on S; it reaches
//! another stream only after a fence shows S's work on it finished (or, under
//! [`ReusePolicy::FollowEventDependencies`], with that fence in
//! [`Allocation::wait_for`](super::Allocation::wait_for)). A block freed with
//! `hold` ([`DevicePool::free_used_on`]) reaches no stream, its home included,
//! before every fence completed. Fences of S come from the installed
//! [`StreamPoints`](super::StreamPoints), recorded when first needed; without
//! one, streams are treated as host-synchronous.

use super::allocation::Allocation;
use super::entry::{class_for_block, Entry};
use super::point::StreamPoint;
#[cfg(doc)]
use super::DevicePool;
use super::{Shared, Slow, StreamId};
use crate::config::ReusePolicy;
use crate::poison::poison;
use std::ptr::NonNull;
use std::sync::Arc;

/// A freed block and the fences it waits for.
pub(super) struct Pending {
    addr: usize,
    block: usize,
    node: u32,
    /// A `Kind` as its discriminant.
    kind: u8,
    home: StreamId,
    /// Work on `home` may still use the block: it reaches another stream only
    /// after `home_tail` (recorded when first needed) completes. False for
    /// blocks freed after their last use completed.
    queued: bool,
    home_tail: Option<Arc<dyn StreamPoint>>,
    uses: Vec<Arc<dyn StreamPoint>>,
    /// Reused by no stream, its home included, before every fence completed
    /// ([`DevicePool::free_used_on`]).
    hold: bool,
    /// Order of arrival in the pending list: the fences of an older entry were
    /// recorded no later than a newer one's, so its work finishes first.
    seq: u64,
}

impl Slow {
    /// (address, home stream) of every pending free.
    pub(super) fn pending_blocks(&self) -> impl Iterator<Item = (usize, StreamId)> + '_ {
        self.pending.iter().map(|p| (p.addr, p.home))
    }
}

impl Shared {
    #[cold]
    pub(super) fn free_slow(
        &self,
        a: Allocation,
        stream: StreamId,
        uses: Vec<Arc<dyn StreamPoint>>,
        queued: bool,
        hold: bool,
    ) {
        let mut g = self.lock();
        let seq = g.next_seq;
        g.next_seq += 1;
        g.pending.push(Pending {
            addr: a.ptr.as_ptr() as usize,
            block: a.block,
            node: a.node,
            kind: a.kind,
            home: stream,
            queued: queued || !uses.is_empty(),
            home_tail: None,
            uses,
            hold,
            seq,
        });
        g.pending_bytes += a.block;
        self.reap(&mut g);
        if g.reserved > self.config.release_threshold {
            self.release_free_chunks(&mut g, None);
            self.release_granules(&mut g, self.config.release_threshold);
        }
    }

    /// Returns completed pending frees to the TLSF.
    pub(super) fn reap(&self, g: &mut Slow) {
        if g.pending.is_empty() {
            return;
        }
        let recorder = self.points.get();
        let mut recorded: Vec<(StreamId, Arc<dyn StreamPoint>)> = Vec::new();
        let mut i = 0;
        while i < g.pending.len() {
            let p = &mut g.pending[i];
            if p.queued && p.home_tail.is_none() {
                if let Some(r) = recorder {
                    let f = match recorded.iter().find(|(s, _)| *s == p.home) {
                        Some((_, f)) => f.clone(),
                        None => {
                            let f = r.record(p.home);
                            recorded.push((p.home, f.clone()));
                            f
                        }
                    };
                    p.home_tail = Some(f);
                }
            }
            let done = p.home_tail.as_ref().is_none_or(|f| f.is_complete())
                && p.uses.iter().all(|f| f.is_complete());
            if done {
                let p = g.pending.swap_remove(i);
                g.pending_bytes -= p.block;
                g.out -= p.block;
                poison(p.addr as *const u8, p.block);
                g.tlsf[p.kind as usize].free(p.node);
                if let Some(segs) = g.segments.as_mut() {
                    segs.unback(usize::from(p.kind), p.addr, p.block);
                    g.reserved = segs.reserved();
                }
            } else {
                i += 1;
            }
        }
    }

    /// Takes a pending block of the right size for `stream`: its home stream's
    /// own blocks when `cross` is false, other streams' when true.
    pub(super) fn take_pending(
        &self,
        g: &mut Slow,
        stream: StreamId,
        rounded: usize,
        align: usize,
        cross: bool,
    ) -> Option<Allocation> {
        let policy = self.config.reuse;
        let recorder = self.points.get();
        for i in 0..g.pending.len() {
            let p = &mut g.pending[i];
            if (p.home == stream) == cross
                || p.block < rounded
                || p.block - rounded > rounded / 8
                || p.addr & (align - 1) != 0
            {
                continue;
            }
            if cross && p.queued && p.home_tail.is_none() {
                if let Some(r) = recorder {
                    p.home_tail = Some(r.record(p.home));
                }
            }
            let mut wait: Vec<Arc<dyn StreamPoint>> = p
                .uses
                .iter()
                .filter(|f| !f.is_complete())
                .cloned()
                .collect();
            if cross {
                if let Some(f) = p.home_tail.as_ref().filter(|f| !f.is_complete()) {
                    wait.push(f.clone());
                }
            }
            if !wait.is_empty() && (policy == ReusePolicy::Opportunistic || p.hold) {
                continue;
            }
            let p = g.pending.swap_remove(i);
            g.pending_bytes -= p.block;
            g.pending_hits += 1;
            g.tlsf[p.kind as usize].set_tag(p.node, stream);
            return Some(Allocation {
                // SAFETY: pending addresses come from chunks, which are never null.
                ptr: unsafe { NonNull::new_unchecked(p.addr as *mut u8) },
                size: 0,
                block: p.block,
                node: p.node,
                kind: p.kind,
                pool: self.id,
                wait_for: (!wait.is_empty()).then(|| Box::new(wait)),
                // On its home stream, queued work there orders the reuse.
                queued: p.queued && !cross,
                class: class_for_block(p.block),
            });
        }
        None
    }

    pub(super) fn push_pending(
        &self,
        g: &mut Slow,
        home: StreamId,
        v: impl IntoIterator<Item = Entry>,
    ) {
        for e in v {
            g.pending_bytes += e.block as usize;
            g.pending.push(Pending {
                addr: e.addr(),
                block: e.block as usize,
                node: e.node,
                kind: e.kind(),
                home,
                queued: e.queued(),
                home_tail: None,
                uses: Vec::new(),
                hold: false,
                seq: g.next_seq,
            });
            g.next_seq += 1;
        }
    }

    /// The incomplete fences of the oldest pending free still waiting for any
    /// (its stream work was queued first, so it is the next to finish); `None`
    /// when every pending free is ready. Call after `reap`, which records the
    /// fence of every queued free.
    pub(super) fn earliest_pending_points(&self, g: &Slow) -> Option<Vec<Arc<dyn StreamPoint>>> {
        let mut best: Option<(u64, Vec<Arc<dyn StreamPoint>>)> = None;
        for p in &g.pending {
            if best.as_ref().is_some_and(|(seq, _)| *seq < p.seq) {
                continue;
            }
            let open: Vec<Arc<dyn StreamPoint>> = p
                .home_tail
                .iter()
                .chain(p.uses.iter())
                .filter(|f| !f.is_complete())
                .cloned()
                .collect();
            if !open.is_empty() {
                best = Some((p.seq, open));
            }
        }
        best.map(|(_, f)| f)
    }

    /// Every fence of every pending free, recording the home fence of queued
    /// frees that have none yet: what to wait for before a last retry.
    pub(super) fn all_pending_points(&self, g: &mut Slow) -> Vec<Arc<dyn StreamPoint>> {
        let mut fences: Vec<Arc<dyn StreamPoint>> = Vec::new();
        let recorder = self.points.get();
        for p in g.pending.iter_mut() {
            if p.queued && p.home_tail.is_none() {
                p.home_tail = recorder.map(|r| r.record(p.home));
            }
            fences.extend(p.home_tail.iter().cloned());
            fences.extend(p.uses.iter().cloned());
        }
        fences
    }
}
