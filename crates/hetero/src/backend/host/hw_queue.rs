//! Hardware queues: in-order lanes that streams are mapped onto, and the state
//! machine that makes one engine at a time their consumer.
//!
//! States of a queue (`QueueState`):
//! - `IDLE`: no op of the queue is being claimed or run;
//! - `CLAIMING`: an engine holds the queue while it looks at its streams' oldest
//!   ops; it may find none ready and let go without running anything, so a
//!   submitter that sees this state must not count on it;
//! - `RUNNING`: an op of the queue is in flight; the engine that completes it
//!   looks for work right after (`finish` then the engine's next look).
//!
//! Invariants:
//! - Only the engine whose CAS moved the queue out of `IDLE` consumes the rings of
//!   the queue's streams, until it stores `IDLE` again.
//! - No lost wake-up between a submitter and the engine finishing an op: the
//!   submitter publishes its op, issues a SeqCst fence and reads the state
//!   (`submitter_must_wake`); the engine stores `IDLE`, issues a SeqCst fence and
//!   then looks for work. Either the submitter sees the queue not `RUNNING` (and
//!   wakes an idle engine) or the engine's look sees the op.
//!
//! The loom models at the bottom drive these same functions with the real ring and
//! parker.

use crate::exec::loom::{fence, AtomicU8, Ordering};
use crossbeam_utils::CachePadded;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

pub(super) const IDLE: u8 = 0;
pub(super) const CLAIMING: u8 = 1;
pub(super) const RUNNING: u8 = 2;

/// The state word of one hardware queue (see the module doc).
#[derive(Debug)]
pub(crate) struct QueueState(CachePadded<AtomicU8>);

/// Why a look at a queue took nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skipped {
    /// Nothing to take, or the queue runs an op (its engine looks again after).
    Nothing,
    /// Another engine was claiming the queue: its verdict may be stale, look again
    /// before sleeping.
    Contended,
}

impl QueueState {
    pub(crate) fn new() -> Self {
        QueueState(CachePadded::new(AtomicU8::new(IDLE)))
    }

    /// A look without claiming: `Err` when the queue cannot be claimed now or the
    /// stream has nothing queued (`nonempty`).
    #[inline]
    pub(crate) fn may_claim(&self, nonempty: bool) -> Result<(), Skipped> {
        match self.0.load(Ordering::Acquire) {
            IDLE if nonempty => Ok(()),
            CLAIMING if nonempty => Err(Skipped::Contended),
            _ => Err(Skipped::Nothing),
        }
    }

    /// Claims the queue and runs `take` as the only consumer of its streams' rings.
    /// If `take` returns work the queue is `RUNNING` until `finish`; otherwise it is
    /// released at once.
    #[inline]
    pub(crate) fn claim_with<W>(&self, take: impl FnOnce() -> Option<W>) -> Result<W, Skipped> {
        if let Err(state) =
            self.0
                .compare_exchange(IDLE, CLAIMING, Ordering::Acquire, Ordering::Relaxed)
        {
            return Err(if state == CLAIMING {
                Skipped::Contended
            } else {
                Skipped::Nothing
            });
        }
        match take() {
            Some(w) => {
                self.0.store(RUNNING, Ordering::Relaxed);
                Ok(w)
            }
            None => {
                self.0.store(IDLE, Ordering::Release);
                Err(Skipped::Nothing)
            }
        }
    }

    /// Ends the in-flight op's hold on the queue. The caller then looks for work
    /// (it pairs with `submitter_must_wake`, see the module doc).
    #[inline]
    pub(crate) fn finish(&self) {
        self.0.store(IDLE, Ordering::Release);
        fence(Ordering::SeqCst);
    }

    /// The submitter's side, after publishing an op: whether no engine is bound to
    /// look at the queue (it is not `RUNNING`), so an idle engine must be woken.
    /// Issues the SeqCst fence that orders the publication before this read.
    #[inline]
    pub(crate) fn submitter_must_wake(&self) -> bool {
        // Without the fence x86 may read the state before the op's publication
        // drains from the store buffer (tests/wakeups.rs caught exactly that).
        fence(Ordering::SeqCst);
        self.0.load(Ordering::Relaxed) != RUNNING
    }
}

pub(super) struct HwQueue {
    /// Shared with the queue's streams, whose submitters read it.
    pub(super) state: Arc<QueueState>,
    pub(super) streams: AtomicUsize,
}

/// Loom models of the engine wake-up protocol, built from the real `QueueState`,
/// ring and parker: the submitter's fence and skip, the "looking" token an engine
/// holds between finishing an op and its next look, and the re-look after a
/// contended claim. Each model must end with the op taken; a lost wake-up shows as
/// a loom deadlock.
#[cfg(all(test, loom))]
mod loom_wake_models {
    use super::*;
    use crate::exec::loom::{Arc, AtomicBool, AtomicU32};
    use crate::exec::park::Parker;
    use crate::exec::ring::Ring;

    struct Queue {
        state: QueueState,
        ring: Ring<u32>,
        /// Whether the oldest op may run (an event it waits for completed).
        ready: AtomicBool,
    }

    fn queue(ready: bool) -> Queue {
        Queue {
            state: QueueState::new(),
            ring: Ring::with_capacity(2),
            ready: AtomicBool::new(ready),
        }
    }

    /// One look for work, as `EngineThread::claim` does for one stream.
    fn claim(q: &Queue) -> Result<u32, Skipped> {
        q.state.may_claim(!q.ring.is_empty())?;
        q.state.claim_with(|| {
            if !q.ready.load(Ordering::Acquire) {
                return None;
            }
            // SAFETY: holding the claim makes this thread the ring's only consumer.
            unsafe { q.ring.pop() }.map(|(v, _)| v)
        })
    }

    /// `claim`, looking again while another engine holds the queue.
    fn look(q: &Queue) -> Option<u32> {
        loop {
            match claim(q) {
                Ok(v) => return Some(v),
                Err(Skipped::Contended) => loom::thread::yield_now(),
                Err(Skipped::Nothing) => return None,
            }
        }
    }

    /// The submitter's side of `HostStream::submit`.
    fn submit(p: &Parker, q: &Queue, v: u32) {
        assert!(q.ring.try_push(v).is_ok());
        if q.state.submitter_must_wake() {
            p.wake_one_if_idle_fenced();
        }
    }

    /// `Shared::finish` then the engine's first look, then parking.
    fn finish_then_look(p: &Parker, q: &Queue) -> u32 {
        p.begin_search_unbounded();
        q.state.finish();
        let first = claim(q);
        p.end_search();
        match first {
            Ok(v) => v,
            Err(_) => p.park_for(|| look(q)),
        }
    }

    /// A submitter pushes while the queue's op is in flight and skips the wake;
    /// the engine that completes the op must still find the new op.
    #[test]
    fn loom_submit_during_running_op_is_seen_by_its_engine() {
        loom::model(|| {
            let p = Arc::new(Parker::new());
            let q = Arc::new(queue(true));
            // An op of the queue is in flight.
            assert!(q.state.claim_with(|| Some(())).is_ok());
            let (p2, q2) = (p.clone(), q.clone());
            let engine = loom::thread::spawn(move || finish_then_look(&p2, &q2));
            submit(&p, &q, 7);
            assert_eq!(engine.join().expect("engine"), 7);
        });
    }

    /// An engine that looks for work until it takes the op or another engine did
    /// (`taken`), re-looking while contended and parking otherwise.
    fn engine(p: &Parker, q: &Queue, taken: &AtomicU32) {
        let got = p.park_for(|| {
            if taken.load(Ordering::SeqCst) != 0 {
                return Some(0);
            }
            look(q)
        });
        if got != 0 {
            taken.store(got, Ordering::SeqCst);
            p.wake(u32::MAX);
        }
    }

    /// One engine judges the oldest op not ready while another completes what it
    /// waits for and then looks, finding the queue being claimed. One of them must
    /// take the op: nobody sleeps on the stale verdict.
    #[test]
    fn loom_contended_claim_does_not_strand_a_ready_op() {
        loom::model(|| {
            let p = Arc::new(Parker::new());
            let q = Arc::new(queue(false));
            assert!(q.ring.try_push(9).is_ok());
            let taken = Arc::new(AtomicU32::new(0));
            let (p1, q1, t1) = (p.clone(), q.clone(), taken.clone());
            let looker = loom::thread::spawn(move || engine(&p1, &q1, &t1));
            // The completer: what the op waits for finishes, then it looks.
            q.ready.store(true, Ordering::Release);
            engine(&p, &q, &taken);
            looker.join().expect("looker");
            assert_eq!(taken.load(Ordering::SeqCst), 9);
        });
    }

    /// Idle engines, two submissions on an idle queue: whichever engines wake, the
    /// one that runs the first op looks again (the looking token) and takes the
    /// second if nobody else did. Both ops run; nobody sleeps forever.
    #[test]
    fn loom_two_submissions_to_idle_engines_both_run() {
        const ENGINES: usize = 2;
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder.check(|| {
            let p = Arc::new(Parker::new());
            let q = Arc::new(queue(true));
            let done = Arc::new(AtomicU32::new(0));
            let engines: Vec<_> = (0..ENGINES)
                .map(|_| {
                    let (p, q, done) = (p.clone(), q.clone(), done.clone());
                    loom::thread::spawn(move || {
                        let wait = || {
                            p.park_for(|| {
                                if done.load(Ordering::SeqCst) == 2 {
                                    return Some(None);
                                }
                                look(&q).map(Some)
                            })
                        };
                        let mut next = wait();
                        while next.is_some() {
                            if done.fetch_add(1, Ordering::SeqCst) + 1 == 2 {
                                p.wake(u32::MAX);
                            }
                            p.begin_search_unbounded();
                            q.state.finish();
                            let first = look(&q);
                            p.end_search();
                            next = match first {
                                Some(v) => Some(v),
                                None => wait(),
                            };
                        }
                    })
                })
                .collect();
            submit(&p, &q, 1);
            submit(&p, &q, 2);
            for e in engines {
                e.join().expect("engine");
            }
            assert_eq!(done.load(Ordering::SeqCst), 2);
        });
    }
}
