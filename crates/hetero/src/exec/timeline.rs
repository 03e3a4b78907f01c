//! A stream's timeline: a monotonically increasing u64 of completed work, plus the
//! stream's fault, plus a parker for host threads that wait on it.
//!
//! Invariants:
//! - Only the engine completing the stream's operations writes `completed`, one op at
//!   a time, in submission order: values only grow, by one per operation.
//! - A fault at value `v` is published (`fault_at`, message) *before* `completed`
//!   reaches `v`, so a reader that sees `completed >= v` (Acquire) also sees the fault.
//! - A fault fails every operation from the failed one to the end of its *scope*: it
//!   does not run, its resources are released, and the timeline still advances past it
//!   (nobody waits forever). A wait among them still waits for its point first
//!   (`Op::failed_wait_done`), so the stream's points keep their order for work that
//!   follows them with memory waits. A stream's scope lasts until a value its
//!   submitter named with `start_scope` (a placed graph's step: a fault there fails
//!   the step, not the steps after it on the stream), else for ever: a stream
//!   nobody starts scopes on fails for good at its first fault.
//! - Only the engine running the stream's current operation writes `failing` and
//!   ends a fault's scope (`recover_at`, before it runs the op that starts the next),
//!   in order, as it writes `completed`. A fault's record (`faults`) is pushed before
//!   `completed` reaches its value, and its scope's end before `completed` reaches
//!   the scope after it, so a reader that sees `completed >= v` sees whether `v`
//!   failed.
//! - No lost wake-up, and no wake-up for nothing: a host thread that parks first
//!   records the value it waits for (`waiting`, whose minimum is `wake_at`), then
//!   registers as a sleeper, fences and checks; a completion stores `completed`,
//!   fences, and wakes only if its value reached `wake_at`. Either the waiter sees
//!   its value completed, or the completer of that value sees `wake_at` at or
//!   below it. (Without `wake_at` a host thread parked for the end of a long
//!   stream cost every completion a futex wake, a syscall on the engine's path.)

use crate::config::CompletionMode;
use crate::exec::loom::{AtomicBool, AtomicU64, Mutex, Ordering};
use crate::exec::park::Parker;
use crate::Error;
use crossbeam_utils::CachePadded;
use std::cell::Cell;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How an engine thread waits: it may not simply block, because the work it
/// waits for may need it (see `backend/host/callback.rs`, `waits_for_itself`). The backend installs one on
/// each of its engine threads. It returns once `ready()` holds, or the error that
/// says why waiting would never end. `(timeline, value)` names what `ready`
/// depends on, for that judgement.
pub(crate) type EngineWait = fn(
    timeline: &Timeline,
    value: u64,
    what: &'static str,
    ready: &mut dyn FnMut() -> bool,
) -> crate::Result<()>;

thread_local! {
    static ENGINE_WAIT: Cell<Option<EngineWait>> = const { Cell::new(None) };
}

/// Installs `wait` for every host wait made on the calling thread.
pub(crate) fn set_engine_wait(wait: EngineWait) {
    ENGINE_WAIT.with(|w| w.set(Some(wait)));
}

/// A device whose clock advances only when someone waits for it (virtual time):
/// a host wait on one of its timelines runs its simulation instead of blocking.
pub(crate) trait Driver: Send + Sync {
    /// Runs the device until `ready()` holds (true) or nothing more can happen
    /// now (false: another thread may still be publishing work).
    fn drive(&self, ready: &mut dyn FnMut() -> bool) -> crate::Result<bool>;
    /// One step of progress, for a host that polls (`query`).
    fn poll(&self);
}

/// Room for scope starts a stream's list makes at once (more when that
/// many are in flight).
const SCOPES_KEPT: usize = 256;

fn lock<T>(m: &Mutex<T>) -> crate::exec::loom::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn engine_wait() -> Option<EngineWait> {
    ENGINE_WAIT.try_with(|w| w.get()).ok().flatten()
}

#[derive(Debug)]
pub(crate) struct Timeline {
    completed: CachePadded<AtomicU64>,
    /// The first failed value (`u64::MAX`: none): whether anything failed.
    fault_at: AtomicU64,
    /// Whether a fault fails the stream's operations now (the last of
    /// `faults` has no end yet).
    failing: AtomicBool,
    /// Every fault: its first failed value, the last value of its scope
    /// (`u64::MAX` while it lasts) and its message, in order.
    faults: Mutex<Vec<(u64, u64, Arc<str>)>>,
    /// Values where a scope starts that the engine has not passed
    /// (`start_scope`); empty on streams nobody starts scopes on.
    scopes: Mutex<std::collections::VecDeque<u64>>,
    has_scopes: AtomicBool,
    parker: Parker,
    /// The smallest value a parked host thread waits for (`u64::MAX`: none).
    wake_at: AtomicU64,
    /// The values parked host threads wait for (one entry per waiter).
    waiting: std::sync::Mutex<Vec<u64>>,
    pub(crate) stream: u64,
    pub(crate) device: u64,
    /// How host threads wait on this timeline by default (the device's mode).
    pub(crate) host_wait: CompletionMode,
    /// Set for a device in virtual time: waits drive it.
    driver: OnceLock<std::sync::Weak<dyn Driver>>,
    /// The smallest value a watcher waits for (`u64::MAX`: none).
    watch_at: AtomicU64,
    /// Devices to kick when a value is reached: streams of other devices of a
    /// context that wait on this timeline (their engines do not look at it
    /// otherwise). One entry per wait, removed when it fires.
    watchers: Mutex<Vec<(u64, Watcher)>>,
}

/// A watcher: the value it waits for is beside it in the list.
#[derive(Clone)]
struct Watcher(Kick);

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watcher")
    }
}

/// What a completion calls to make another device look at its waits again.
pub(crate) type Kick = Arc<dyn Fn() + Send + Sync>;

impl Timeline {
    pub(crate) fn new(device: u64, stream: u64, host_wait: CompletionMode) -> Self {
        Timeline {
            completed: CachePadded::new(AtomicU64::new(0)),
            fault_at: AtomicU64::new(u64::MAX),
            failing: AtomicBool::new(false),
            faults: Mutex::new(Vec::new()),
            scopes: Mutex::new(std::collections::VecDeque::new()),
            has_scopes: AtomicBool::new(false),
            parker: Parker::new(),
            wake_at: AtomicU64::new(u64::MAX),
            // Room for a few waiters up front: parking allocates nothing.
            waiting: std::sync::Mutex::new(Vec::with_capacity(4)),
            stream,
            device,
            host_wait,
            driver: OnceLock::new(),
            watch_at: AtomicU64::new(u64::MAX),
            watchers: Mutex::new(Vec::new()),
        }
    }

    /// Calls `kick` once `value` is reached (at once if it is). Same protocol
    /// as parked host waiters (see the module invariants): the watcher is
    /// published, then the value checked; a completion stores, then looks.
    pub(crate) fn watch(&self, value: u64, kick: Kick) {
        {
            let mut w = lock(&self.watchers);
            w.push((value, Watcher(kick)));
            // `watch_at` is the least value in `watchers` (both change only
            // under this lock): no scan of the list, which grows with the
            // waits on the timeline not yet reached.
            let min = self.watch_at.load(Ordering::Relaxed).min(value);
            self.watch_at.store(min, Ordering::SeqCst);
        }
        crate::exec::loom::fence(Ordering::SeqCst);
        if self.is_reached(value) {
            self.fire_watchers(self.completed());
        }
    }

    #[cold]
    fn fire_watchers(&self, reached: u64) {
        let fired: Vec<Kick> = {
            let mut w = lock(&self.watchers);
            let mut fired = Vec::new();
            w.retain(|(v, k)| {
                if *v <= reached {
                    fired.push(k.0.clone());
                    false
                } else {
                    true
                }
            });
            let min = w.iter().map(|e| e.0).min().unwrap_or(u64::MAX);
            self.watch_at.store(min, Ordering::SeqCst);
            fired
        };
        for k in fired {
            k();
        }
    }

    /// Makes host waits on this timeline drive `driver` (once).
    pub(crate) fn set_driver(&self, driver: std::sync::Weak<dyn Driver>) {
        let _ = self.driver.set(driver);
    }

    fn driver(&self) -> Option<Arc<dyn Driver>> {
        self.driver.get().and_then(std::sync::Weak::upgrade)
    }

    /// For a host that polls: lets a device in virtual time make a step.
    pub(crate) fn poll_driver(&self) {
        if let Some(d) = self.driver() {
            d.poll();
        }
    }

    /// The highest completed value.
    #[inline]
    pub(crate) fn completed(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }

    #[inline]
    pub(crate) fn is_reached(&self, value: u64) -> bool {
        self.completed() >= value
    }

    /// The value of the first failed operation, if any.
    pub(crate) fn fault_at(&self) -> Option<u64> {
        match self.fault_at.load(Ordering::Acquire) {
            u64::MAX => None,
            v => Some(v),
        }
    }

    /// Marks the operation at `value` completed. Called by the one engine that runs
    /// this stream's current operation.
    #[inline]
    pub(crate) fn complete(&self, value: u64) {
        debug_assert_eq!(self.completed.load(Ordering::Relaxed) + 1, value);
        self.completed.store(value, Ordering::Release);
        crate::exec::loom::fence(Ordering::SeqCst);
        if value >= self.wake_at.load(Ordering::Relaxed) {
            self.parker.wake_fenced(u32::MAX);
        }
        if value >= self.watch_at.load(Ordering::Relaxed) {
            self.fire_watchers(value);
        }
    }

    /// Whether a fault fails the stream's operations now (its scope lasts):
    /// the engine skips them (see the module invariants).
    #[inline]
    pub(crate) fn failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }

    /// Records that the operation at `value` failed with `message` (within a
    /// fault's scope, the first fault wins), then completes it.
    pub(crate) fn fail(&self, value: u64, message: Arc<str>) {
        if !self.failing.load(Ordering::Relaxed) {
            lock(&self.faults).push((value, u64::MAX, message));
            self.failing.store(true, Ordering::Release);
            if self.fault_at.load(Ordering::Relaxed) == u64::MAX {
                self.fault_at.store(value, Ordering::Release);
            }
        }
        self.complete(value);
    }

    /// Starts a fault scope at `value`, the value of the next operation
    /// submitted: a fault before it fails no operation from it on. Called by
    /// the stream's submitter before it submits that operation.
    pub(crate) fn start_scope(&self, value: u64) {
        self.has_scopes.store(true, Ordering::Relaxed);
        let mut scopes = lock(&self.scopes);
        // The engine drops those it passes only while a fault lasts: those
        // passed go when the list is full, before it grows (a look at the
        // engine's line per list's worth of scopes; nothing allocated once
        // the list holds the scopes in flight).
        if scopes.len() == scopes.capacity() {
            let done = self.completed();
            while scopes.front().is_some_and(|&v| v <= done) {
                scopes.pop_front();
            }
            if scopes.len() == scopes.capacity() {
                let more = SCOPES_KEPT.max(scopes.len());
                scopes.reserve(more);
            }
        }
        scopes.push_back(value);
    }

    /// Whether its submitter started a fault scope (a wait on one of its
    /// own points may then take on a fault its order does not).
    pub(crate) fn has_scopes(&self) -> bool {
        self.has_scopes.load(Ordering::Relaxed)
    }

    /// Whether a scope starts at `value` (for an engine that decides when
    /// it records, ahead of completing: it drops nothing).
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))] // the Vulkan engine's
    pub(crate) fn starts_scope(&self, value: u64) -> bool {
        self.has_scopes() && lock(&self.scopes).binary_search(&value).is_ok()
    }

    /// For the engine, before it skips the operation at `value` of a failing
    /// stream: whether a scope starts there. If so the fault's scope ends
    /// before it, and the operation runs.
    pub(crate) fn recover_at(&self, value: u64) -> bool {
        let starts = {
            let mut scopes = lock(&self.scopes);
            while scopes.front().is_some_and(|&v| v < value) {
                scopes.pop_front();
            }
            scopes.front() == Some(&value)
        };
        if starts {
            if let Some(last) = lock(&self.faults).last_mut() {
                last.1 = value - 1;
            }
            self.failing.store(false, Ordering::Release);
        }
        starts
    }

    /// The error for work at `value`: the fault whose scope holds it, if any.
    #[inline]
    pub(crate) fn error_for(&self, value: u64) -> Option<Error> {
        self.error_in(value, value)
    }

    /// The first fault of an operation in `from..=to`, if any. (Inlined up
    /// to the look at `fault_at`: a wait's check on a stream that never
    /// failed, a pool stream's look at its last task, costs one load.)
    #[inline]
    pub(crate) fn error_in(&self, from: u64, to: u64) -> Option<Error> {
        if self.fault_at()? > to {
            return None;
        }
        self.fault_in(from, to)
    }

    #[cold]
    fn fault_in(&self, from: u64, to: u64) -> Option<Error> {
        let faults = lock(&self.faults);
        let (at, _, message) = faults.iter().find(|f| f.0 <= to && f.1 >= from)?;
        Some(Error::StreamFault {
            device: self.device,
            stream: self.stream,
            value: *at,
            message: message.clone(),
        })
    }

    /// The stream's first fault, if any.
    pub(crate) fn fault(&self) -> Option<Error> {
        self.error_in(0, u64::MAX)
    }

    /// `None` while `value` is pending; then `Ok` or the stream's fault.
    pub(crate) fn status(&self, value: u64) -> Option<crate::Result<()>> {
        if !self.is_reached(value) {
            return None;
        }
        Some(match self.error_for(value) {
            Some(e) => Err(e),
            None => Ok(()),
        })
    }

    /// Blocks the calling thread until `value` is reached, waiting as `mode` says;
    /// then the stream's fault if it failed at or before `value`. On an engine
    /// thread a wait that could never end (it waits for the calling op itself) is
    /// an `Error::WouldDeadlock` instead.
    pub(crate) fn wait(&self, value: u64, mode: CompletionMode) -> crate::Result<()> {
        self.wait_for(value, mode, "wait")?;
        match self.error_for(value) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// [`Timeline::wait`] without the fault: only the end of the work matters.
    pub(crate) fn wait_for(
        &self,
        value: u64,
        mode: CompletionMode,
        what: &'static str,
    ) -> crate::Result<()> {
        self.wait_until(value, mode, what, || self.is_reached(value))
    }

    /// Blocks until `ready()` holds, where `ready` becomes true only as this
    /// timeline advances towards `value` (each completion re-checks it).
    pub(crate) fn wait_until(
        &self,
        value: u64,
        mode: CompletionMode,
        what: &'static str,
        mut ready: impl FnMut() -> bool,
    ) -> crate::Result<()> {
        if ready() {
            return Ok(());
        }
        if let Some(d) = self.driver() {
            // When nothing can progress, what the wait needs may come from another
            // thread (a submission still being published, a host event): drive
            // again after a yield, then after short sleeps.
            let mut idle = 0u32;
            loop {
                if d.drive(&mut ready)? || ready() {
                    return Ok(());
                }
                idle = idle.saturating_add(1);
                if idle < 1000 {
                    crate::exec::loom::yield_now();
                } else {
                    self.park_briefly(&mut ready, Duration::from_micros(500));
                }
            }
        }
        if let Some(wait) = engine_wait() {
            return wait(self, value, what, &mut ready);
        }
        match mode {
            CompletionMode::Spin | CompletionMode::Yield => self.parker.wait(mode, ready),
            CompletionMode::Block | CompletionMode::Auto { .. } => {
                if let CompletionMode::Auto { spin } = mode {
                    if crate::exec::park::spin_for(spin, &mut ready) {
                        return Ok(());
                    }
                }
                self.set_waiting(value, true);
                self.parker.park_until(&mut ready, None);
                self.set_waiting(value, false);
            }
        }
        Ok(())
    }

    /// Adds (or removes) one parked waiter for `value` and republishes the
    /// minimum (see the module invariants).
    fn set_waiting(&self, value: u64, add: bool) {
        let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if add {
            w.push(value);
        } else if let Some(i) = w.iter().position(|&v| v == value) {
            w.swap_remove(i);
        }
        let min = w.iter().copied().min().unwrap_or(u64::MAX);
        self.wake_at.store(min, Ordering::SeqCst);
    }

    /// Parks for at most `timeout` unless `ready()` holds (an engine thread that
    /// found nothing else to run while it waits).
    /// Waits at most `limit` (host time) for `value`, as `mode` says; whether it
    /// was reached. For waits that must not hang when the work never comes
    /// (the pool's waits for queued frees). Engine threads do not wait.
    pub(crate) fn reached_within(&self, value: u64, mode: CompletionMode, limit: Duration) -> bool {
        let start = std::time::Instant::now();
        let mut ready = || self.is_reached(value);
        if ready() {
            return true;
        }
        if let Some(d) = self.driver() {
            let mut idle = 0u32;
            loop {
                match d.drive(&mut ready) {
                    Ok(true) => return true,
                    Ok(false) => {}
                    Err(_) => return ready(),
                }
                if ready() {
                    return true;
                }
                let left = limit.saturating_sub(start.elapsed());
                if left.is_zero() {
                    return false;
                }
                idle = idle.saturating_add(1);
                if idle < 1000 {
                    crate::exec::loom::yield_now();
                } else {
                    self.park_briefly(&mut ready, left.min(Duration::from_micros(500)));
                }
            }
        }
        if engine_wait().is_some() {
            return false;
        }
        if let CompletionMode::Auto { spin } = mode {
            if crate::exec::park::spin_for(spin.min(limit), &mut ready) {
                return true;
            }
        }
        self.set_waiting(value, true);
        loop {
            let left = limit.saturating_sub(start.elapsed());
            if ready() || left.is_zero() {
                break;
            }
            self.parker.park_until(&mut ready, Some(left));
        }
        self.set_waiting(value, false);
        ready()
    }

    pub(crate) fn park_briefly(&self, ready: impl FnMut() -> bool, timeout: Duration) {
        self.parker.park_until(ready, Some(timeout));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::exec::loom::Arc;

    /// A waiter parked (Block mode) on a timeline always wakes when the value is
    /// completed, and sees a fault published with it.
    #[test]
    fn completion_wakes_blocked_waiter_and_publishes_fault() {
        loom::model(|| {
            let tl = Arc::new(Timeline::new(0, 7, CompletionMode::Block));
            let t2 = tl.clone();
            let waiter = loom::thread::spawn(move || t2.wait(2, CompletionMode::Block));
            tl.complete(1);
            // The message is a std `Arc<str>`: not a shared loom object.
            tl.fail(2, std::sync::Arc::from("boom"));
            let r = waiter.join().expect("waiter thread");
            assert!(matches!(r, Err(Error::StreamFault { value: 2, .. })));
        });
    }

    /// A watcher registered while its value completes on another thread is
    /// kicked: the watch publishes, then checks; the completion stores, then
    /// looks; they never both miss. (Without the fence in `watch`, or with
    /// the completion's look before its store, this model fails.)
    #[test]
    fn a_watcher_is_kicked_when_its_value_completes() {
        loom::model(|| {
            let tl = Arc::new(Timeline::new(0, 7, CompletionMode::Block));
            let kicks = Arc::new(crate::exec::loom::AtomicUsize::new(0));
            let t2 = tl.clone();
            let done = loom::thread::spawn(move || t2.complete(1));
            let k = kicks.clone();
            tl.watch(
                1,
                std::sync::Arc::new(move || {
                    k.fetch_add(1, Ordering::Relaxed);
                }),
            );
            done.join().expect("completer");
            assert!(kicks.load(Ordering::Relaxed) >= 1);
        });
    }

    /// A fault's scope: a reader that sees a value completed sees whether
    /// its op failed, the fault's scope ending where the submitter started
    /// the next (the engine's `recover_at` before it runs that op).
    #[test]
    fn a_reader_sees_where_a_faults_scope_ends() {
        loom::model(|| {
            let tl = Arc::new(Timeline::new(0, 7, CompletionMode::Spin));
            tl.start_scope(3);
            let t2 = tl.clone();
            let engine = loom::thread::spawn(move || {
                t2.fail(1, std::sync::Arc::from("boom"));
                // Within the fault's scope: skipped, failed.
                assert!(t2.failing() && !t2.recover_at(2));
                t2.fail(2, std::sync::Arc::from(""));
                assert!(t2.failing() && t2.recover_at(3));
                t2.complete(3);
            });
            let seen = tl.completed();
            if seen >= 1 {
                assert!(tl.error_for(1).is_some());
            }
            if seen >= 3 {
                assert!(tl.error_for(2).is_some());
                assert!(tl.error_for(3).is_none());
            }
            engine.join().expect("engine");
            assert!(!tl.failing());
            let e = tl.error_in(2, 3).expect("the fault");
            assert!(
                matches!(e, Error::StreamFault { value: 1, ref message, .. } if &**message == "boom")
            );
        });
    }

    #[test]
    fn spin_waiter_sees_completion() {
        loom::model(|| {
            let tl = Arc::new(Timeline::new(0, 1, CompletionMode::Spin));
            let t2 = tl.clone();
            let waiter = loom::thread::spawn(move || t2.wait(1, CompletionMode::Spin));
            tl.complete(1);
            assert!(waiter.join().expect("waiter").is_ok());
            assert_eq!(tl.completed(), 1);
        });
    }
}
