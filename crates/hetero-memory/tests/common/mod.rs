//! Test doubles: a fence completed by hand and a per-stream fence recorder.
#![allow(dead_code)]

use hetero_memory::{StreamId, StreamPoint, StreamPoints};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

/// A fence that completes when the test says so (a "slow kernel").
#[derive(Debug, Default)]
pub struct ManualFence {
    state: Mutex<FenceState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct FenceState {
    done: bool,
    /// Calls to `wait` so far (a waiter counts from before it blocks).
    waiters: usize,
}

impl ManualFence {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
    pub fn complete(&self) {
        self.state.lock().expect("lock").done = true;
        self.cv.notify_all();
    }
    /// Returns once someone waits on the fence, or it completed: a "slow
    /// kernel" that ends only after the pool blocked on it, whatever the timing.
    pub fn wait_for_waiter(&self) {
        let mut st = self.state.lock().expect("lock");
        while st.waiters == 0 && !st.done {
            st = self.cv.wait(st).expect("wait");
        }
    }
}

impl StreamPoint for ManualFence {
    fn is_complete(&self) -> bool {
        self.state.lock().expect("lock").done
    }
    fn wait(&self) {
        let mut st = self.state.lock().expect("lock");
        st.waiters += 1;
        self.cv.notify_all();
        while !st.done {
            st = self.cv.wait(st).expect("wait");
        }
    }
    fn wait_progressing(&self, limit: std::time::Duration) -> bool {
        let start = std::time::Instant::now();
        let mut st = self.state.lock().expect("lock");
        st.waiters += 1;
        self.cv.notify_all();
        while !st.done {
            let left = limit.saturating_sub(start.elapsed());
            if left.is_zero() {
                return false;
            }
            st = self.cv.wait_timeout(st, left).expect("wait").0;
        }
        true
    }
}

/// Completes its fence when dropped: a test that fails before completing a
/// fence another thread waits for does not leave that thread blocked.
pub struct CompleteOnDrop(pub Arc<ManualFence>);

impl Drop for CompleteOnDrop {
    fn drop(&mut self) {
        self.0.complete();
    }
}

/// Each stream's pending work is one ManualFence until the test completes it.
#[derive(Debug, Default)]
pub struct Streams {
    tails: Mutex<HashMap<StreamId, Arc<ManualFence>>>,
}

impl Streams {
    pub fn tail(&self, s: StreamId) -> Arc<ManualFence> {
        self.tails
            .lock()
            .expect("lock")
            .entry(s)
            .or_default()
            .clone()
    }
}

impl StreamPoints for Streams {
    fn record(&self, stream: StreamId) -> Arc<dyn StreamPoint> {
        self.tail(stream)
    }
}
