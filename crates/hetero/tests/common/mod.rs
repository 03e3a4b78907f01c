//! Helpers shared by the integration tests: the device every test runs on (the
//! backend `HETERO_BACKEND` names: the same suite runs on every backend), and a
//! gate that holds a stream's work queued while a test looks, opened by the test
//! (or by its drop, so a failing assertion never leaves a stream blocked:
//! dropping a stream waits for its work).
#![allow(dead_code)]

use hetero::{BackendKind, Device, DeviceConfig, Event, HostEvent, Stream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The configuration of the device under test: the defaults on the backend
/// `HETERO_BACKEND` names (host when unset).
pub fn config() -> DeviceConfig {
    DeviceConfig::from_env().expect("HETERO_BACKEND names a backend")
}

/// The device under test.
pub fn device() -> Device {
    Device::new(config()).expect("device under test")
}

/// The device under test, configured further by `f`.
pub fn device_with(f: impl FnOnce(DeviceConfig) -> DeviceConfig) -> Device {
    Device::new(f(config())).expect("device under test")
}

/// Whether the suite runs on the host backend. Tests of host-only behaviour
/// (engine threads, wake-ups, a kernel running while the host works beside it)
/// say so and return early elsewhere.
pub fn on_host() -> bool {
    let host = matches!(config().backend_kind(), BackendKind::Host);
    if !host {
        eprintln!("(host-only behaviour: not checked on this backend)");
    }
    host
}

/// Open once `open` is called or the gate drops.
pub struct Gate {
    open: Arc<AtomicBool>,
    /// Set by the gate's op once it runs (it then holds its engine).
    reached: Arc<AtomicBool>,
    /// For `hold`: the host event the stream waits on, and an event recorded
    /// just before it (the stream reached the gate when it completes).
    held: Option<(HostEvent, Event)>,
}

impl Gate {
    /// A closed gate that no stream waits on yet.
    pub fn new() -> Gate {
        Gate {
            open: Arc::new(AtomicBool::new(false)),
            reached: Arc::new(AtomicBool::new(false)),
            held: None,
        }
    }

    /// Holds `s`: its later work waits until the gate opens. The stream waits on
    /// a host event, so no engine is occupied, on any backend.
    pub fn hold(s: &Stream) -> Gate {
        let mut g = Gate::new();
        let before = s.record_event().expect("record");
        let go = s.device().host_event();
        s.wait_event(go.event()).expect("gate");
        g.held = Some((go, before));
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

    /// Returns once the stream got as far as the gate (for `hold`), or once an op
    /// waiting on the gate runs (for `waiter`).
    pub fn wait_reached(&self) {
        if let Some((_, before)) = &self.held {
            before.synchronize().expect("the stream reaches the gate");
            return;
        }
        while !self.reached.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
    }

    pub fn open(&self) {
        self.open.store(true, Ordering::Release);
        if let Some((go, _)) = &self.held {
            go.signal();
        }
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

/// Device time `f` takes on a fresh stream of `dev` (virtual time on an
/// emulated device in virtual mode): from an idle stream to its completion.
pub fn modelled(dev: &Device, f: impl FnOnce(&Stream)) -> u64 {
    let s = dev.create_stream().expect("stream");
    s.synchronize().expect("idle");
    let t0 = dev.now_ns();
    f(&s);
    s.synchronize().expect("sync");
    dev.now_ns() - t0
}

/// Runs `f` on its own thread; fails the test if it has not returned in `secs`.
pub fn within<R: Send + 'static>(
    secs: u64,
    what: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what}: still running after {secs} s (hung)"))
}
