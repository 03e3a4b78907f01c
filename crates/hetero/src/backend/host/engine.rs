//! Engine threads: each looks for ready work across the streams (priority,
//! aging, placement by data), runs it, and parks when there is none; see the
//! module doc of `backend/host` for the wake-up protocol.

use super::callback::run_user;
use super::dispatch::{Engine, Ran, Taken, LOOKING};
use super::graph::{drive, start_graph, GraphJob};
use super::kernel_job::{run_blocks, start_job};
use super::stream::HostStream;
use super::Shared;
use crate::exec::op::{Body, Op};
use crate::exec::storage::Reach;
use crate::{Block, CompletionMode};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Work a engine has claimed (moved, never boxed: claiming must not allocate).
#[allow(clippy::large_enum_variant)]
pub(super) enum Work {
    /// A stream's oldest op, popped with its queue claimed.
    Op {
        stream: Arc<HostStream>,
        taken: Taken,
    },
    /// Blocks of a running multi-block kernel.
    /// (The index of the hardware queue whose job slot holds it.)
    Help(usize),
    /// Ready chains of a running graph launch.
    Graph(Arc<GraphJob>),
}

/// While polling a pending async op, one look in this many sees every stream.
const FULL_LOOK_EVERY: u32 = 8;

pub(super) struct EngineThread {
    pub(super) index: u32,
    pub(super) streams: Vec<Arc<HostStream>>,
    pub(super) generation: u64,
    pub(super) candidates: Vec<(i64, u8, u64, usize)>,
    /// The stream of the last op this engine ran.
    pub(super) last_stream: u64,
    /// The last claim left other streams' ready work behind.
    pub(super) more: bool,
    /// The last claim skipped a non-empty stream whose queue another engine was
    /// claiming (its verdict may be stale).
    pub(super) contended: bool,
    /// This run of continued ops has already woken another engine for the ready
    /// work it leaves behind.
    pub(super) woke: bool,
    /// The stream whose oldest op, an async op, was not done at this engine's
    /// last look at it (`search` polls it alone between full looks).
    pub(super) async_head: Option<u64>,
    /// The last look left a ready op to the engine that produced its data
    /// (`defers`): look again rather than park.
    pub(super) deferred: bool,
}

impl EngineThread {
    pub(super) fn new(index: u32) -> Self {
        // Room for the usual number of streams up front: looking for work then
        // allocates nothing even the first time an engine sees them.
        EngineThread {
            index,
            streams: Vec::with_capacity(64),
            generation: u64::MAX,
            candidates: Vec::with_capacity(64),
            last_stream: 0,
            more: false,
            contended: false,
            woke: false,
            async_head: None,
            deferred: false,
        }
    }

    pub(super) fn run(mut self, sh: &Shared) {
        loop {
            let found = self.claim(sh);
            if LOOKING.with(|l| l.replace(false)) {
                sh.idle.end_search();
            }
            if let Some(work) = found {
                self.execute(sh, work);
                continue;
            }
            if sh.shutdown.load(Ordering::SeqCst) && self.all_drained(sh) {
                return;
            }
            let budget = match sh.config.engine_idle {
                CompletionMode::Spin | CompletionMode::Yield => None,
                CompletionMode::Block => Some(Duration::ZERO),
                CompletionMode::Auto { spin } => Some(spin),
            };
            if budget != Some(Duration::ZERO) {
                if let Some(work) = self.search(sh, budget) {
                    self.execute(sh, work);
                    continue;
                }
                if budget.is_none() {
                    continue; // only on shutdown
                }
            }
            self.park(sh);
        }
    }

    /// Polls for work for `budget` (forever if `None`) while counted as searching,
    /// so submitters skip the futex wake. Returns early on shutdown.
    pub(super) fn search(&mut self, sh: &Shared, budget: Option<Duration>) -> Option<Work> {
        // At most half the engines (at least one) poll at a time; the others park.
        // With Spin or Yield idling every engine polls, as configured.
        let max = match budget {
            Some(_) => (sh.config.compute_units as u32 / 2).max(1),
            None => u32::MAX,
        };
        if !sh.idle.try_begin_search(max) {
            return None;
        }
        let mut found = None;
        let mut polls = 0u32;
        let mut poll = || {
            // While a stream's head is an async op that was not done, most
            // polls look at that stream alone; every `FULL_LOOK_EVERY`th is a
            // full look, which also sees other streams' new work.
            polls = polls.wrapping_add(1);
            let full = polls.is_multiple_of(FULL_LOOK_EVERY);
            found = match self.async_head {
                Some(id) if !full => self.claim_stream(sh, id),
                _ => None,
            };
            if found.is_none() && (self.async_head.is_none() || full) {
                found = self.claim(sh);
            }
            found.is_some() || sh.shutdown.load(Ordering::SeqCst)
        };
        // While async ops are queued each poll may be the one that sees a
        // message arrive: keep the pauses between polls short.
        let pauses = if sh.async_queued.load(Ordering::Relaxed) > 0 {
            1
        } else {
            32
        };
        match (budget, sh.config.engine_idle) {
            // A searcher does not park while async ops are queued: their
            // completion wakes nobody, and a parked engine would see it only
            // at its next `async_poll` timeout (a 4 MiB transfer would lose a
            // quarter of its bandwidth). It keeps polling, yielding the core
            // between polls, in rounds of its budget.
            (Some(b), _) => {
                while !crate::exec::park::spin_for_pausing(b, pauses, &mut poll)
                    && sh.async_queued.load(Ordering::Relaxed) > 0
                {}
            }
            (None, CompletionMode::Yield) => {
                while !poll() {
                    std::thread::yield_now();
                }
            }
            (None, _) => {
                while !poll() {
                    crate::exec::loom::spin_hint();
                }
            }
        }
        sh.idle.end_search();
        found
    }

    /// Parks until work can be claimed (or shutdown). The thread counts as a sleeper
    /// only while it looks for work, never while it runs it: submitters and
    /// completers then pay the futex wake only when someone really sleeps.
    pub(super) fn park(&mut self, sh: &Shared) {
        // Async ops in flight complete without waking anyone: park for at most
        // `async_poll` at a time and poll them again (claim looks at them).
        let bound = || (sh.async_queued.load(Ordering::SeqCst) > 0).then_some(sh.config.async_poll);
        // `parked` says "asleep or about to be": set only once a look found
        // nothing and the futex wait comes next, cleared at every look. An
        // engine looking again and again (a contended queue, an op it left to
        // another) is awake, and others may leave ops to it.
        let parked = &sh.parked[self.index as usize];
        let claimed = sh.idle.park_for_polling(
            || loop {
                parked.store(false, Ordering::Relaxed);
                match self.claim(sh) {
                    Some(w) => return Some(Some(w)),
                    // Another engine was looking at a queue we skipped: it may have
                    // judged an op not ready just before the op it waits for completed
                    // (and the completer skipped that queue as held). Look again once
                    // it let go rather than sleep on a stale verdict.
                    None if self.contended || self.deferred => crate::exec::loom::spin_hint(),
                    None => {
                        parked.store(true, Ordering::Relaxed);
                        return sh.shutdown.load(Ordering::SeqCst).then_some(None);
                    }
                }
            },
            bound,
        );
        parked.store(false, Ordering::Relaxed);
        if let Some(work) = claimed {
            self.execute(sh, work);
        }
    }

    /// After claiming: if more work is ready than this thread takes, make sure
    /// another engine looks at it.
    pub(super) fn chain_wake(&self, sh: &Shared, more: bool) {
        if more {
            sh.idle.wake_one_if_idle();
        }
    }

    pub(super) fn all_drained(&mut self, sh: &Shared) -> bool {
        self.refresh(sh);
        self.streams.iter().all(|s| s.ring.is_empty())
            && sh.job_count.load(Ordering::SeqCst) == 0
            && sh.graph_count.load(Ordering::SeqCst) == 0
    }

    pub(super) fn refresh(&mut self, sh: &Shared) {
        sh.streams.refresh(&mut self.streams, &mut self.generation);
    }

    pub(super) fn execute(&mut self, sh: &Shared, work: Work) {
        let more = std::mem::take(&mut self.more);
        self.chain_wake(sh, more);
        let (stream, taken) = match work {
            Work::Help(slot) => return run_blocks(sh, &sh.jobs[slot]),
            Work::Graph(job) => return drive(sh, &job, self.index),
            Work::Op { stream, taken } => (stream, taken),
        };
        let stream = &stream;
        self.last_stream = stream.id;
        self.woke = false;
        let mut next = Some(taken);
        while let Some(Taken { value, engine }) = next.take() {
            // SAFETY: this engine holds the stream's queue (claimed in `claim`, kept
            // by `continue_on`), so it is the ring's only consumer, and `try_claim`
            // saw this op published at the head.
            let op = unsafe { stream.ring.take_head() };
            if !self.run_op(sh, stream, op, value, engine) {
                // A multi-block kernel: its last block completes it and lets the
                // queue go.
                return;
            }
            next = self.continue_on(sh, stream);
        }
        sh.release_queue(stream);
    }

    /// After an async op of `stream` finished (its queue held, the op taken
    /// but not yet retired): starts the stream's next op if it is an async op,
    /// before this one's bookkeeping (access locks, drop, timeline). A chain of
    /// remote copies, as in a ping-pong, then issues its next MPI call one
    /// retirement earlier: the retirement (a free and several atomics) leaves
    /// each message's round trip. The next op sees everything before it
    /// finished; only the publication of the last one's end follows its start.
    /// If its access locks conflict with the finished op's, it is not started
    /// here, and starts at its usual poll after the retirement.
    fn start_next_async(&self, sh: &Shared, stream: &HostStream) {
        if !stream.ring.has_next() {
            return;
        }
        // SAFETY: the caller holds the stream's queue, which makes this thread the
        // ring's only consumer.
        unsafe {
            stream.ring.peek_with(|op, pos| {
                if let Body::Async(a) = &op.body {
                    if !stream.timeline.failing() {
                        let _ = sh.async_readiness(stream, op, pos + 1, a);
                    }
                }
            });
        }
    }

    /// Runs one op of `stream` (the queue held) and completes it on the timeline;
    /// false when it became a multi-block kernel job, which completes later.
    /// Inlined into `execute`'s loop, so the op is never copied again after it
    /// left the ring.
    #[inline(always)]
    fn run_op(
        &mut self,
        sh: &Shared,
        stream: &Arc<HostStream>,
        mut op: Op,
        value: u64,
        engine: Option<Engine>,
    ) -> bool {
        let start_ns = if crate::exec::clock::profiling() || op.span().is_some() {
            crate::exec::clock::now_ns()
        } else {
            0
        };
        let ran = Ran {
            unit: self.index,
            start_ns,
        };
        let Some(engine) = engine else {
            sh.complete(stream, op, value, Engine::None, Err(String::new()), ran);
            return true;
        };
        if let Body::Kernel { blocks, .. } = op.body {
            if blocks > 1 {
                start_job(sh, stream, op, value, blocks, ran);
                return false;
            }
        }
        if let Body::Graph(_) = op.body {
            start_graph(sh, stream, op, value, ran);
            return false;
        }
        let callback = match &mut op.body {
            Body::Host(f) => Some(f.take()),
            _ => None,
        };
        let result = match (&op.body, callback) {
            (_, Some(Some(f))) => run_user(stream, value, &op, || "host callback".into(), f),
            (_, Some(None)) | (Body::Host(_), None) => Ok(()),
            (
                Body::Copy { .. }
                | Body::Fill { .. }
                | Body::HostWrite { .. }
                | Body::HostRead { .. }
                | Body::CopyBatch(_)
                | Body::Copy2D(_),
                _,
            ) => {
                crate::exec::effects::run(&op.body, Reach::HOST);
                Ok(())
            }
            (
                Body::Wait {
                    timeline,
                    value: v,
                    fault,
                },
                _,
            ) => match timeline.error_for(*v).filter(|_| *fault) {
                Some(e) => Err(crate::exec::op::wait_fault(timeline, e)),
                None => Ok(()),
            },
            (Body::WaitAll(w), _) => w.fault(),
            (Body::Graph(_), _) => unreachable!("graph launches run as jobs"),
            (Body::Async(a), _) => {
                // SAFETY: this engine holds the stream's queue.
                let result = unsafe { a.take_result() };
                if result.is_ok() {
                    self.start_next_async(sh, stream);
                }
                result
            }
            (Body::Record { stamp }, _) => {
                stamp.store(crate::exec::clock::now_ns(), Ordering::Release);
                Ok(())
            }
            (Body::Kernel { kernel, args, .. }, _) => {
                let (name, f) = (kernel.name, kernel.host());
                let mut block = Block::new(0, 1, args, Reach::HOST);
                run_user(
                    stream,
                    value,
                    &op,
                    || format!("kernel '{name}' in block 0"),
                    || f(&mut block),
                )
            }
        };
        sh.complete(stream, op, value, engine, result, ran);
        true
    }
}
