//! Helpers shared by the integration tests: a gate that holds a stream's work
//! queued while a test looks, opened by the test (or by its drop, so a failing
//! assertion never leaves a stream blocked: dropping a stream waits for its work).
#![allow(dead_code)]

use hetero::{Device, Grid, Kernel, Stream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Open once `open` is called or the gate drops.
pub struct Gate {
    open: Arc<AtomicBool>,
    /// Set by the gate's op once it runs (it then holds its engine).
    reached: Arc<AtomicBool>,
}

impl Gate {
    /// A closed gate that no stream waits on yet.
    pub fn new() -> Gate {
        Gate {
            open: Arc::new(AtomicBool::new(false)),
            reached: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Holds `s`: its later work waits until the gate opens. The gate is a
    /// one-block kernel that occupies one compute engine while it waits.
    pub fn hold(s: &Stream) -> Gate {
        let g = Gate::new();
        let wait = g.waiter();
        s.launch(&Kernel::new("gate", move |_| wait()), Grid::new(1), &[])
            .expect("gate");
        g
    }

    /// A closure that says it was reached, then returns once the gate opens (for
    /// a kernel or a host callback).
    pub fn waiter(&self) -> impl Fn() + Send + Sync + 'static {
        let (open, reached) = (self.open.clone(), self.reached.clone());
        move || {
            reached.store(true, Ordering::Release);
            while !open.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
        }
    }

    /// Returns once an op waiting on the gate runs (its stream got that far).
    pub fn wait_reached(&self) {
        while !self.reached.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
    }

    pub fn open(&self) {
        self.open.store(true, Ordering::Release);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

/// Gives the device's free engines turns to run whatever work is ready: a few
/// round trips through a fresh stream. Work that is wrongly ready (a missing
/// wait) then usually runs before the test looks; the test still cannot see
/// "never runs", so its final check (on values, after the gate opens) is what
/// catches an ordering bug for sure when the work ran early. A window by
/// progress, not by time: nothing here depends on how fast the machine is.
pub fn settle(d: &Device) {
    let probe = d.create_stream().expect("probe stream");
    for _ in 0..4 {
        probe.host_fn(|| ()).expect("probe");
        probe.synchronize().expect("probe");
    }
}
