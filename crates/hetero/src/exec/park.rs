//! Waiting strategies shared by host waits and idle engines: poll a condition, spin
//! or yield for a budget, then park on a futex word. The waker side is cheap when
//! nobody sleeps: one load of a waiter count.
//!
//! Invariant (no lost wake-up): a sleeper increments `sleepers`, issues a SeqCst
//! fence and reads the futex word *before* its last check of the condition; a waker
//! makes the condition true, issues a SeqCst fence, then reads `sleepers` and, if
//! non-zero, bumps the word and wakes. The two fences are what orders each side's
//! write before its read (the condition is read with Acquire only, so a SeqCst
//! increment alone is not enough; loom's timeline model finds the lost wake-up). Either the sleeper's last check sees the condition, or the waker sees
//! the sleeper and the word changes under it, so `futex_wait` returns at once.

use crate::config::CompletionMode;
use crate::exec::loom::{AtomicU32, Ordering};
use crossbeam_utils::CachePadded;
use std::time::{Duration, Instant};

/// A futex word with a count of the threads parked (or about to park) on it.
#[derive(Debug)]
pub(crate) struct Parker {
    word: CachePadded<AtomicU32>,
    sleepers: CachePadded<AtomicU32>,
    /// Threads polling for the condition without sleeping (engines looking for
    /// work). While one polls, a waker need not wake anybody.
    searching: CachePadded<AtomicU32>,
    /// Under loom the futex is modelled by a mutex and condition variable, so a lost
    /// wake-up shows as a deadlock rather than as an endless spin.
    #[cfg(loom)]
    futex: LoomFutex,
}

impl Default for Parker {
    fn default() -> Self {
        Self::new()
    }
}

impl Parker {
    pub(crate) fn new() -> Self {
        Parker {
            word: CachePadded::new(AtomicU32::new(0)),
            sleepers: CachePadded::new(AtomicU32::new(0)),
            searching: CachePadded::new(AtomicU32::new(0)),
            #[cfg(loom)]
            futex: LoomFutex::default(),
        }
    }

    /// Wakes one sleeper unless some thread is already polling: that thread will see
    /// the new condition (it registered before its last poll, and stops polling only
    /// through `park_for`, whose final look sees everything made true before a
    /// skipped wake).
    #[inline]
    pub(crate) fn wake_one_if_idle(&self) {
        crate::exec::loom::fence(Ordering::SeqCst);
        self.wake_one_if_idle_fenced();
    }

    /// [`Parker::wake_one_if_idle`] for a caller that has already issued a SeqCst
    /// fence after making the condition true (the submitter, which fences before
    /// it reads its queue's state): a second fence would order nothing more.
    #[inline]
    pub(crate) fn wake_one_if_idle_fenced(&self) {
        // `sleepers` first: it changes only when an engine parks or wakes, while
        // `searching` changes around every op an engine runs (a shared-line miss).
        if self.sleepers.load(Ordering::Relaxed) != 0 && self.searching.load(Ordering::Relaxed) == 0
        {
            self.wake_slow(1);
        }
    }

    /// Marks the calling thread as polling (see `wake_one_if_idle`), unless `max`
    /// threads already poll: then it returns false and the caller should park. More
    /// pollers than that only take cores from the threads doing the work.
    pub(crate) fn try_begin_search(&self, max: u32) -> bool {
        let mut n = self.searching.load(Ordering::Relaxed);
        loop {
            if n >= max {
                return false;
            }
            match self.searching.compare_exchange_weak(
                n,
                n + 1,
                Ordering::SeqCst,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => n = now,
            }
        }
    }

    /// Counts the calling thread as polling whatever the cap (an engine between
    /// finishing an op and its next look for work).
    pub(crate) fn begin_search_unbounded(&self) {
        self.searching.fetch_add(1, Ordering::SeqCst);
    }

    /// Ends a `try_begin_search` or `begin_search_unbounded`.
    pub(crate) fn end_search(&self) {
        self.searching.fetch_sub(1, Ordering::SeqCst);
    }

    /// Wakes up to `n` sleepers; call after making their condition true.
    #[inline]
    pub(crate) fn wake(&self, n: u32) {
        crate::exec::loom::fence(Ordering::SeqCst);
        self.wake_fenced(n);
    }

    /// [`Parker::wake`] for a caller that has already issued a SeqCst fence after
    /// making the condition true.
    #[inline]
    pub(crate) fn wake_fenced(&self, n: u32) {
        if self.sleepers.load(Ordering::Relaxed) != 0 {
            self.wake_slow(n);
        }
    }

    #[cold]
    fn wake_slow(&self, n: u32) {
        self.word.fetch_add(1, Ordering::SeqCst);
        self.futex_wake(n);
    }

    /// Whether a thread is parked or about to park.
    #[allow(dead_code)]
    pub(crate) fn has_sleepers(&self) -> bool {
        self.sleepers.load(Ordering::SeqCst) != 0
    }

    /// Parks until `ready()` holds, after one final check. `timeout` bounds one park
    /// (a safety net only: correctness does not depend on it).
    pub(crate) fn park_until(&self, mut ready: impl FnMut() -> bool, timeout: Option<Duration>) {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        // Pairs with the fence in `wake`: without it the condition check below may be
        // satisfied from before the waker's update while the waker still reads
        // `sleepers == 0` (the language model allows it; loom finds it).
        crate::exec::loom::fence(Ordering::SeqCst);
        loop {
            let seen = self.word.load(Ordering::SeqCst);
            if ready() {
                break;
            }
            self.futex_wait(seen, timeout);
            if timeout.is_some() {
                break;
            }
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Parks until `claim()` returns something, which it returns. The caller counts
    /// as a sleeper only while `claim` looks; it should not do long work inside it.
    #[allow(dead_code)] // the wake-up models (hw_queue.rs) park this way
    pub(crate) fn park_for<W>(&self, claim: impl FnMut() -> Option<W>) -> W {
        self.park_for_polling(claim, || None)
    }

    /// [`Parker::park_for`], but each park lasts at most `bound()` (when it
    /// says so): the caller then looks again (`claim`) without being woken,
    /// for work that completes without anyone waking it (async ops).
    pub(crate) fn park_for_polling<W>(
        &self,
        mut claim: impl FnMut() -> Option<W>,
        mut bound: impl FnMut() -> Option<Duration>,
    ) -> W {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        // Pairs with the waker's fence: our later look at the condition cannot be
        // ordered before the registration.
        crate::exec::loom::fence(Ordering::SeqCst);
        let got = loop {
            let seen = self.word.load(Ordering::SeqCst);
            if let Some(w) = claim() {
                break w;
            }
            self.futex_wait(seen, bound());
        };
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        got
    }

    /// Waits until `ready()` holds using `mode`.
    pub(crate) fn wait(&self, mode: CompletionMode, mut ready: impl FnMut() -> bool) {
        if ready() {
            return;
        }
        match mode {
            CompletionMode::Spin => {
                while !ready() {
                    crate::exec::loom::spin_hint();
                }
            }
            CompletionMode::Yield => {
                while !ready() {
                    crate::exec::loom::yield_now();
                }
            }
            CompletionMode::Block => self.park_until(ready, None),
            CompletionMode::Auto { spin } => {
                if spin_for(spin, &mut ready) {
                    return;
                }
                self.park_until(ready, None);
            }
        }
    }
}

/// Polls `ready` for up to `budget`: busy spins for the first part (up to 2 µs),
/// then yields the core between polls (on a 2-core machine a pure spinner can starve
/// the thread it waits for). Returns whether `ready` became true.
pub(crate) fn spin_for(budget: Duration, ready: &mut impl FnMut() -> bool) -> bool {
    spin_for_pausing(budget, 32, ready)
}

/// [`spin_for`] with at most `max_pauses` spin hints between two polls (an
/// engine polling async ops keeps them short: a message's arrival is seen
/// within one poll).
pub(crate) fn spin_for_pausing(
    budget: Duration,
    max_pauses: u32,
    ready: &mut impl FnMut() -> bool,
) -> bool {
    // Short: the thread polled for may share this core (the scheduler places a
    // woken thread beside its waker, and engines are pinned), and then it runs
    // only when this one yields. With 50 µs here, a launch-and-synchronize round
    // trip took ~108 µs in about half the runs on the 2-vCPU VM, 50 µs per
    // hand-off; with 2 µs it takes 1.5-5 µs (`examples/graph_probe.rs`).
    const PURE_SPIN: Duration = Duration::from_micros(2);
    // Pauses between polls grow to `max_pauses` (32 for plain waits): a poller
    // that reads shared lines in a tight loop slows the threads that write them
    // (submitters, completers).
    let start = Instant::now();
    let pure = budget.min(PURE_SPIN);
    let mut pauses = 1;
    // Polls between two looks at the clock: 8 while spinning, 1 once yielding
    // (a yield is long enough to read the clock after each).
    let mut polls = 8;
    loop {
        for _ in 0..polls {
            if ready() {
                return true;
            }
            for _ in 0..pauses {
                crate::exec::loom::spin_hint();
            }
            pauses = (pauses * 2).min(max_pauses.max(1));
        }
        let waited = start.elapsed();
        if waited >= budget {
            return ready();
        }
        if waited >= pure {
            crate::exec::loom::yield_now();
            polls = 1;
            pauses = 1;
        }
    }
}

#[cfg(not(loom))]
impl Parker {
    fn futex_wait(&self, seen: u32, timeout: Option<Duration>) {
        use rustix::thread::futex;
        let ts = timeout.map(|d| rustix::fs::Timespec {
            tv_sec: d.as_secs() as i64,
            tv_nsec: d.subsec_nanos() as i64,
        });
        // EAGAIN (word changed), EINTR and ETIMEDOUT all mean: look again.
        let _ = futex::wait(&self.word, futex::Flags::PRIVATE, seen, ts.as_ref());
    }

    fn futex_wake(&self, n: u32) {
        use rustix::thread::futex;
        // The kernel reads the count as a signed int: u32::MAX would wake only one.
        let _ = futex::wake(&self.word, futex::Flags::PRIVATE, n.min(i32::MAX as u32));
    }
}

#[cfg(loom)]
#[derive(Debug, Default)]
struct LoomFutex {
    lock: loom::sync::Mutex<()>,
    cv: loom::sync::Condvar,
}

/// The futex's contract under loom: `wait` sleeps only while the word still holds
/// `seen` (checked under the lock), `wake` runs after the word changed. Timeouts are
/// a safety net only and are not modelled.
#[cfg(loom)]
impl Parker {
    fn futex_wait(&self, seen: u32, _timeout: Option<Duration>) {
        let guard = self.futex.lock.lock().expect("loom futex lock");
        if self.word.load(Ordering::SeqCst) == seen {
            drop(self.futex.cv.wait(guard).expect("loom futex wait"));
        }
    }

    fn futex_wake(&self, _n: u32) {
        let _guard = self.futex.lock.lock().expect("loom futex lock");
        self.futex.cv.notify_all();
    }
}
