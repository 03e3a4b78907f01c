//! A host running ahead of its streams: frees queued behind work that has not
//! finished must not make the pool grow without bound. Before mapping more, a
//! host thread waits for the earliest queued work and reuses what it freed;
//! an engine thread never waits (it may be running the work it would wait for).
//!
//! The fake device here keeps each stream's work as a timeline that advances
//! only on a helper thread, and only when someone waits: work that nobody waits
//! for never finishes, so a pool that does not wait grows on every request.

use hetero_memory::thread_role::mark_engine_thread;
use hetero_memory::{DevicePool, MemoryError, PoolConfig, StreamId, StreamPoint, StreamPoints};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};

const S: StreamId = 1;
const T: StreamId = 2;
const MIB: usize = 1 << 20;

/// Each stream's queued work: `submitted` grows with every fence recorded,
/// `completed` only when the helper thread finishes work up to a fence.
#[derive(Debug, Default)]
struct Timelines {
    submitted: HashMap<StreamId, u64>,
    completed: HashMap<StreamId, u64>,
}

#[derive(Debug)]
struct FakeDevice {
    state: Mutex<Timelines>,
    cv: Condvar,
    /// Requests to finish (stream, value) for the helper; `None`: no helper,
    /// any wait is a test failure.
    finish: Mutex<Option<Sender<(StreamId, u64)>>>,
    waits: Mutex<usize>,
    /// Work finishes by itself, as the pool looks at its fence for the n-th
    /// time (0: never): an engine that runs on completes work in any window
    /// between two of the pool's looks.
    done_at_look: u32,
}

impl FakeDevice {
    /// A device whose work finishes (on a helper thread) when waited for.
    fn with_helper() -> Arc<Self> {
        let (tx, rx) = channel::<(StreamId, u64)>();
        let dev = Self::new(Some(tx));
        let d = Arc::downgrade(&dev);
        std::thread::spawn(move || {
            for (stream, value) in rx {
                let Some(d) = d.upgrade() else { return };
                let mut st = d.state.lock().expect("state");
                let c = st.completed.entry(stream).or_insert(0);
                *c = (*c).max(value);
                d.cv.notify_all();
            }
        });
        dev
    }

    /// A device whose work never finishes: a wait panics.
    fn stalled() -> Arc<Self> {
        Self::new(None)
    }

    /// A device whose work finishes by itself as its fence is looked at for
    /// the `n`-th time, or when waited for.
    fn done_at_look(n: u32) -> Arc<Self> {
        let mut dev = Self::new(None);
        Arc::get_mut(&mut dev).expect("new").done_at_look = n;
        dev
    }

    fn new(finish: Option<Sender<(StreamId, u64)>>) -> Arc<Self> {
        Arc::new(FakeDevice {
            state: Mutex::new(Timelines::default()),
            cv: Condvar::new(),
            finish: Mutex::new(finish),
            waits: Mutex::new(0),
            done_at_look: 0,
        })
    }

    fn waits(&self) -> usize {
        *self.waits.lock().expect("waits")
    }
}

/// The pool's fence recorder over a [`FakeDevice`].
#[derive(Debug)]
struct Recorder(Arc<FakeDevice>);

impl StreamPoints for Recorder {
    fn record(&self, stream: StreamId) -> Arc<dyn StreamPoint> {
        let mut st = self.0.state.lock().expect("state");
        let v = st.submitted.entry(stream).or_insert(0);
        *v += 1;
        Arc::new(FakeFence {
            dev: self.0.clone(),
            stream,
            value: *v,
            looks: AtomicU32::new(0),
        })
    }
}

#[derive(Debug)]
struct FakeFence {
    dev: Arc<FakeDevice>,
    stream: StreamId,
    value: u64,
    looks: AtomicU32,
}

impl StreamPoint for FakeFence {
    fn is_complete(&self) -> bool {
        if self.dev.done_at_look > 0 {
            return self.looks.fetch_add(1, Ordering::Relaxed) + 1 >= self.dev.done_at_look;
        }
        let st = self.dev.state.lock().expect("state");
        st.completed.get(&self.stream).copied().unwrap_or(0) >= self.value
    }

    fn wait(&self) {
        assert!(
            !hetero_memory::thread_role::on_engine_thread(),
            "an engine thread waited on a fence"
        );
        *self.dev.waits.lock().expect("waits") += 1;
        if self.dev.done_at_look > 0 {
            self.looks.store(self.dev.done_at_look, Ordering::Relaxed);
            return;
        }
        let finish = self.dev.finish.lock().expect("finish").clone();
        let Some(finish) = finish else {
            panic!("waited on work that never finishes");
        };
        finish
            .send((self.stream, self.value))
            .expect("helper thread");
        let mut st = self.dev.state.lock().expect("state");
        while st.completed.get(&self.stream).copied().unwrap_or(0) < self.value {
            st = self.dev.cv.wait(st).expect("wait");
        }
    }

    /// The fake device finishes whatever is waited for, at once.
    fn wait_progressing(&self, _idle: std::time::Duration) -> bool {
        self.wait();
        true
    }
}

fn pool(config: PoolConfig, dev: &Arc<FakeDevice>) -> DevicePool {
    let p = DevicePool::new(config).expect("pool");
    assert!(p.set_stream_points(Arc::new(Recorder(dev.clone()))));
    p
}

/// Sizes of 11–30 MiB: each its own chunk, no two within 1/8 of each other in
/// a row, so a queued free never serves the next request as it is.
fn sizes() -> impl Iterator<Item = usize> {
    (0..40).map(|i| (11 + (i * 7) % 20) * MIB)
}

/// One buffer live at a time on `stream`, freed while its work is queued.
/// Returns the peak live bytes.
fn churn(p: &DevicePool, stream: StreamId) -> usize {
    let mut peak = 0;
    for size in sizes() {
        let a = p.alloc(size, 0, stream).expect("alloc");
        peak = peak.max(size);
        p.free(a, stream, Vec::new());
    }
    peak
}

/// [`churn`] on `S`, checking the pool never reserved more than its largest
/// buffer (one live at a time).
fn churn_within_one_buffer(p: &DevicePool, what: &str) {
    let peak_live = churn(p, S);
    let reserved = p.stats().peak_reserved;
    assert!(
        reserved <= peak_live,
        "{what}peak reserved {} MiB for one live buffer of at most {} MiB",
        reserved >> 20,
        peak_live >> 20
    );
}

#[test]
fn queued_frees_are_waited_for_before_the_pool_grows() {
    let dev = FakeDevice::with_helper();
    let p = pool(PoolConfig::default(), &dev);
    // Each request waits for the previous buffer's work, unmaps its chunk and
    // maps its own: never more than one buffer's chunk reserved.
    churn_within_one_buffer(&p, "");
    let st = p.stats();
    assert!(st.grow_waits > 0 && dev.waits() > 0);
    p.trim();
}

/// Queued frees whose work completes while a request looks for memory, at
/// whichever of its looks: the request takes what they freed rather than map
/// beside it. (When the work completed between the pool's reap and its look
/// for a fence to wait for, it mapped: a chunk more than the ratio allows.)
#[test]
fn frees_whose_work_completes_meanwhile_are_reused_before_the_pool_grows() {
    for n in 1..=6 {
        let dev = FakeDevice::done_at_look(n);
        let p = pool(PoolConfig::default(), &dev);
        churn_within_one_buffer(&p, &format!("work done at look {n}: "));
    }
}

#[test]
fn the_wait_before_growing_can_be_turned_off() {
    let dev = FakeDevice::stalled();
    let config = PoolConfig::parse("wait_before_grow_ratio:off").expect("config");
    let p = pool(config, &dev);
    let peak_live = churn(&p, S);
    // Work never finishes and nobody waits: every buffer keeps its chunk.
    assert!(p.stats().reserved > 10 * peak_live);
    assert_eq!(dev.waits(), 0);
    assert_eq!(p.stats().grow_waits, 0);
}

#[test]
fn frees_used_on_another_stream_are_waited_for_too() {
    let dev = FakeDevice::with_helper();
    let p = pool(PoolConfig::default(), &dev);
    let mut peak_live = 0;
    for size in sizes() {
        let a = p.alloc(size, 0, S).expect("alloc");
        peak_live = peak_live.max(size);
        p.free_used_on(a, S, &[T]);
    }
    assert!(p.stats().peak_reserved <= peak_live);
    assert!(p.stats().grow_waits > 0);
}

#[test]
fn a_free_used_on_another_stream_serves_no_stream_before_both_finish() {
    let dev = FakeDevice::stalled();
    let p = pool(PoolConfig::default(), &dev);
    let a = p.alloc(4 * MIB, 0, S).expect("a");
    let addr = a.ptr();
    p.free_used_on(a, S, &[T]);
    // Neither S (it would have to wait for T) nor T gets it while work is queued.
    for stream in [S, T] {
        let b = p.alloc(4 * MIB, 0, stream).expect("b");
        assert_ne!(b.ptr(), addr, "stream {stream} got memory queued work uses");
        p.free_completed(b, stream);
    }
}

#[test]
fn an_engine_thread_maps_instead_of_waiting() {
    let dev = FakeDevice::stalled();
    let p = Arc::new(pool(PoolConfig::default(), &dev));
    let q = p.clone();
    // A stalled device panics on any wait: the engine thread must map.
    let peak_live = std::thread::spawn(move || {
        mark_engine_thread();
        churn(&q, S)
    })
    .join()
    .expect("the engine thread waited on a fence");
    assert!(p.stats().reserved > 10 * peak_live);
    assert_eq!(dev.waits(), 0);
    assert_eq!(p.stats().grow_waits, 0);
}

#[test]
fn out_of_memory_waits_for_queued_frees_then_retries() {
    let dev = FakeDevice::with_helper();
    for config in [
        PoolConfig::default(),
        PoolConfig::default().wait_before_grow_ratio(None),
    ] {
        let p = pool(config.max_reserved(32 * MIB), &dev);
        let a = p.alloc(24 * MIB, 0, S).expect("a");
        p.free(a, S, Vec::new());
        // 24 + 20 MiB is past the limit until S's queued work on `a` finishes.
        let waits = dev.waits();
        let b = p
            .alloc(20 * MIB, 0, T)
            .expect("served once S's work finished");
        assert!(dev.waits() > waits);
        assert!(p.stats().reserved <= 32 * MIB);
        p.free_completed(b, T);
    }
}

#[test]
fn out_of_memory_on_an_engine_thread_does_not_wait() {
    let dev = FakeDevice::stalled();
    let p = Arc::new(pool(PoolConfig::default().max_reserved(32 * MIB), &dev));
    let a = p.alloc(24 * MIB, 0, S).expect("a");
    p.free(a, S, Vec::new());
    let q = p.clone();
    let r = std::thread::spawn(move || {
        mark_engine_thread();
        q.alloc(20 * MIB, 0, T).map(|b| q.free_completed(b, T))
    })
    .join()
    .expect("the engine thread waited on a fence");
    assert!(matches!(r, Err(MemoryError::OutOfMemory { .. })), "{r:?}");
    assert_eq!(dev.waits(), 0);
}
