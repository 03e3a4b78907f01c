//! Multi-block kernels.

#[allow(unused_imports)]
use super::*;

/// A kernel with more than one block, published so idle workers can help.
pub(super) struct KernelJob {
    /// Taken by the thread that finishes the last block.
    pub(super) op: UnsafeCell<Option<Op>>,
    pub(super) stream: Arc<HostStream>,
    pub(super) value: u64,
    pub(super) blocks: u32,
    /// The next block index to hand out; 64 bits so that handing out past the end
    /// of a grid of `u32::MAX` blocks cannot wrap to block 0.
    pub(super) next: AtomicU64,
    pub(super) done: AtomicU32,
    pub(super) panic: Mutex<Option<String>>,
    pub(super) ran: Ran,
}

// SAFETY: `op` is read (shared) by block runners while `done < blocks`, and taken
// only by the thread whose `done.fetch_add` (AcqRel) finished the last block, after
// which no runner reads it: runners that claim an index `>= blocks` never touch it.
unsafe impl Sync for KernelJob {}
// SAFETY: every field is Send (Op is Send).
unsafe impl Send for KernelJob {}

/// The next block index of a grid of `blocks`, from the counter `next`; `None`
/// once all are handed out. The counter is 64 bits: even a grid of `u32::MAX`
/// blocks, with every engine claiming past its end, cannot wrap it to block 0.
pub(super) fn claim_block(next: &AtomicU64, blocks: u32) -> Option<u32> {
    let b = next.fetch_add(1, Ordering::Relaxed);
    (b < u64::from(blocks)).then_some(b as u32)
}

/// Claims and runs blocks of `job` until none are left; the thread that finishes the
/// last block completes the op.
pub(super) fn run_blocks(sh: &Shared, job: &Arc<KernelJob>) {
    loop {
        let Some(b) = claim_block(&job.next, job.blocks) else {
            return;
        };
        // SAFETY: `done < blocks` while this block runs (it is not counted yet), so
        // the op is still in place and only read (see `KernelJob`'s Sync note).
        let op = unsafe { (*job.op.get()).as_ref() }.expect("op present while blocks run");
        if let Body::Kernel { kernel, args, .. } = &op.body {
            let (name, f) = (kernel.name, &kernel.f);
            let mut block = Block::new(b, job.blocks, args);
            let ran = run_user(
                &job.stream,
                job.value,
                op,
                || format!("kernel '{name}' in block {b}"),
                || f(&mut block),
            );
            if let Err(msg) = ran {
                job.panic
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(msg);
            }
        }
        if job.done.fetch_add(1, Ordering::AcqRel) + 1 == job.blocks {
            complete_job(sh, job);
            return;
        }
    }
}

pub(super) fn complete_job(sh: &Shared, job: &Arc<KernelJob>) {
    {
        let mut jobs = sh.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.retain(|j| !Arc::ptr_eq(j, job));
    }
    sh.job_count.fetch_sub(1, Ordering::Release);
    // SAFETY: every block has finished (`done == blocks`, AcqRel chain), so no
    // runner reads the op any more; this thread is the only one that got here.
    let op = unsafe { (*job.op.get()).take() }.expect("job op taken once");
    let result = match job.panic.lock().unwrap_or_else(|p| p.into_inner()).take() {
        Some(m) => Err(m),
        None => Ok(()),
    };
    sh.finish(&job.stream, op, job.value, Engine::Compute, result, job.ran);
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn block_claims_past_the_end_of_the_largest_grid_never_wrap() {
        let next = AtomicU64::new(u64::from(u32::MAX) - 2);
        assert_eq!(claim_block(&next, u32::MAX), Some(u32::MAX - 2));
        assert_eq!(claim_block(&next, u32::MAX), Some(u32::MAX - 1));
        for _ in 0..1000 {
            assert_eq!(claim_block(&next, u32::MAX), None);
        }
    }
}
