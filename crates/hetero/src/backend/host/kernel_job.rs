//! Multi-block kernels: published in a fixed slot so idle engines help run their
//! blocks. A launch allocates nothing and takes no lock.
//!
//! There is one slot per hardware queue: at most one op per queue is in flight, so
//! at most one kernel job per queue exists at a time.
//!
//! Invariants (the slot protocol):
//! - `claim` packs `(generation << 32) | next block`. The engine that starts a job
//!   (the *owner*) first closes the slot, `(generation + 1, CLOSED)`, then fills it
//!   (every block of the previous job finished, so nobody reads it), stores
//!   `blocks` with Release, and publishes `(generation + 1, 0)` with Release. A
//!   thread that read the new `blocks` (Acquire) therefore also sees the slot
//!   closed: a stale claim of the old generation cannot pair with the new count.
//! - A block is claimed by a CAS `(g, b) -> (g, b + 1)` with `b < blocks`; a claim
//!   of a job that ended in between fails (its generation moved on), so a block is
//!   run exactly once and never one of another job. `blocks` and the op are read
//!   only after a successful claim (Acquire), while `done < blocks`.
//! - The thread whose `done.fetch_add` finishes the last block (AcqRel) is the only
//!   one left using the slot: it takes the op and completes it. The slot is then
//!   empty until the queue's next multi-block op starts.
//!
//! (A claim whose generation wrapped 2^32 jobs around while its thread was
//! preempted between its load and its CAS could succeed wrongly; that is not a
//! concern in practice.)
use super::callback::run_user;
use super::dispatch::{Engine, Ran};
use super::stream::HostStream;
use super::Shared;
use crate::exec::op::{Body, Op};
use crate::exec::storage::Reach;
use crate::Block;
use std::cell::UnsafeCell;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

pub(super) struct JobSlot {
    claim: AtomicU64,
    done: AtomicU32,
    blocks: AtomicU32,
    /// Filled by the owner before publishing; read by block runners holding a
    /// claim; taken by the completer.
    job: UnsafeCell<Option<Job>>,
    /// The first panic of a block (locked only when a block panics).
    panic: Mutex<Option<String>>,
}

struct Job {
    op: Op,
    stream: Arc<HostStream>,
    value: u64,
    ran: Ran,
}

// SAFETY: `job` is written only by the owner while no block of the slot is
// claimable, read (shared) only by threads holding an unfinished claim, and taken
// only by the completer after every block finished (module invariants).
unsafe impl Sync for JobSlot {}
// SAFETY: every field is Send (Op and Arc<HostStream> are).
unsafe impl Send for JobSlot {}

const BLOCK_BITS: u32 = 32;
const BLOCK_MASK: u64 = (1 << BLOCK_BITS) - 1;
/// A block index no grid reaches: the slot is being refilled.
const CLOSED: u64 = BLOCK_MASK;

impl JobSlot {
    pub(super) fn new() -> Self {
        JobSlot {
            claim: AtomicU64::new(0),
            done: AtomicU32::new(0),
            blocks: AtomicU32::new(0),
            job: UnsafeCell::new(None),
            panic: Mutex::new(None),
        }
    }

    /// Whether blocks of a job here are still to be claimed (a hint).
    pub(super) fn has_blocks(&self) -> bool {
        let c = self.claim.load(Ordering::Relaxed);
        (c & BLOCK_MASK) < u64::from(self.blocks.load(Ordering::Relaxed))
    }

    /// Claims the next block, or `None` when all are claimed (or the job ended).
    fn claim_block(&self) -> Option<u32> {
        let mut c = self.claim.load(Ordering::Acquire);
        loop {
            let b = c & BLOCK_MASK;
            if b >= u64::from(self.blocks.load(Ordering::Acquire)) {
                return None;
            }
            match self
                .claim
                .compare_exchange_weak(c, c + 1, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return Some(b as u32),
                Err(now) => c = now,
            }
        }
    }
}

/// Publishes the multi-block kernel `op` of `stream` in its queue's slot and runs
/// blocks of it; idle engines are woken to help.
pub(super) fn start_job(
    sh: &Shared,
    stream: &Arc<HostStream>,
    op: Op,
    value: u64,
    blocks: u32,
    ran: Ran,
) {
    let slot = &sh.jobs[stream.queue];
    let generation = (slot.claim.load(Ordering::Relaxed) >> BLOCK_BITS) + 1;
    slot.claim
        .swap(generation << BLOCK_BITS | CLOSED, Ordering::AcqRel);
    // SAFETY: the queue's previous op completed before this one was claimed, so
    // every block of the slot's previous job finished and nobody reads the slot's
    // job; no block is claimable until the store below publishes it.
    unsafe {
        *slot.job.get() = Some(Job {
            op,
            stream: stream.clone(),
            value,
            ran,
        })
    };
    slot.done.store(0, Ordering::Relaxed);
    slot.blocks.store(blocks, Ordering::Release);
    slot.claim
        .store(generation << BLOCK_BITS, Ordering::Release);
    sh.job_count.fetch_add(1, Ordering::Release);
    let helpers = (sh.config.compute_units as u32 - 1).min(blocks - 1);
    if helpers > 0 {
        sh.idle.wake(helpers);
    }
    run_blocks(sh, slot);
}

/// The index of a slot with blocks left to claim, if any.
pub(super) fn find_job(sh: &Shared) -> Option<usize> {
    sh.jobs.iter().position(|s| s.has_blocks())
}

/// Claims and runs blocks of the job in `slot` until none are left; the thread
/// that finishes the last block completes the op.
pub(super) fn run_blocks(sh: &Shared, slot: &JobSlot) {
    while let Some(b) = slot.claim_block() {
        // SAFETY: this thread holds an unfinished claim: the job is in place and
        // only read until `done` counts this block.
        let job = unsafe { (*slot.job.get()).as_ref() }.expect("a claimed job is in place");
        let blocks = slot.blocks.load(Ordering::Relaxed);
        if let Body::Kernel { kernel, args, .. } = &job.op.body {
            let (name, f) = (kernel.name, kernel.host());
            let mut block = Block::new(b, blocks, args, Reach::HOST);
            let ran = run_user(
                &job.stream,
                job.value,
                &job.op,
                || format!("kernel '{name}' in block {b}"),
                || f(&mut block),
            );
            if let Err(msg) = ran {
                slot.panic
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(msg);
            }
        }
        if slot.done.fetch_add(1, Ordering::AcqRel) + 1 == blocks {
            complete_job(sh, slot);
            return;
        }
        // Transfers in flight progress between blocks (rate-limited).
        sh.progress_async();
    }
}

fn complete_job(sh: &Shared, slot: &JobSlot) {
    // SAFETY: every block has finished (`done == blocks`, AcqRel chain), so no
    // runner reads the job any more; this thread is the only one that got here.
    let job = unsafe { (*slot.job.get()).take() }.expect("the job is taken once");
    sh.job_count.fetch_sub(1, Ordering::Release);
    let result = match slot.panic.lock().unwrap_or_else(|p| p.into_inner()).take() {
        Some(m) => Err(m),
        None => Ok(()),
    };
    sh.finish(
        &job.stream,
        job.op,
        job.value,
        Engine::Compute,
        result,
        job.ran,
    );
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn block_claims_stop_at_the_end_of_the_largest_grid() {
        let slot = JobSlot::new();
        slot.blocks.store(u32::MAX, Ordering::Relaxed);
        slot.claim.store(
            (1 << BLOCK_BITS) | u64::from(u32::MAX - 2),
            Ordering::Relaxed,
        );
        assert_eq!(slot.claim_block(), Some(u32::MAX - 2));
        assert_eq!(slot.claim_block(), Some(u32::MAX - 1));
        for _ in 0..1000 {
            assert_eq!(slot.claim_block(), None);
        }
        assert!(!slot.has_blocks());
    }

    #[test]
    fn a_claim_of_an_ended_job_fails() {
        let slot = JobSlot::new();
        slot.blocks.store(4, Ordering::Relaxed);
        slot.claim.store(1 << BLOCK_BITS, Ordering::Relaxed);
        let seen = slot.claim.load(Ordering::Relaxed);
        // The job ends and the next one (generation 2) starts.
        slot.claim.store(2 << BLOCK_BITS, Ordering::Relaxed);
        assert!(slot
            .claim
            .compare_exchange(seen, seen + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err());
        assert_eq!(slot.claim_block(), Some(0));
    }
}
