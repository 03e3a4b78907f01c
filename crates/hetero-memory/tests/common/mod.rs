//! Test doubles: a fence completed by hand and a per-stream fence recorder.
#![allow(dead_code)]

use hetero_memory::{Fence, StreamFences, StreamId};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

/// A fence that completes when the test says so (a "slow kernel").
#[derive(Debug, Default)]
pub struct ManualFence {
    done: Mutex<bool>,
    cv: Condvar,
}

impl ManualFence {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
    pub fn complete(&self) {
        *self.done.lock().expect("lock") = true;
        self.cv.notify_all();
    }
}

impl Fence for ManualFence {
    fn is_complete(&self) -> bool {
        *self.done.lock().expect("lock")
    }
    fn wait(&self) {
        let mut d = self.done.lock().expect("lock");
        while !*d {
            d = self.cv.wait(d).expect("wait");
        }
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

impl StreamFences for Streams {
    fn record(&self, stream: StreamId) -> Arc<dyn Fence> {
        self.tail(stream)
    }
}
