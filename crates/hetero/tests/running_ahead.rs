//! A host running ahead of its streams: an inference-like pattern (layers that
//! allocate activations of varying sizes, fill them and free them, with no
//! synchronisation) must not make the pool reserve much more than the trace
//! ever has live, whether the buffers are used on one stream or on two.
//! The checks are memory figures (peak reserved over peak live), not times.

mod common;

use hetero::{Device, DeviceBuffer, Stream};

/// A small deterministic generator (xorshift64*), so every run replays the same trace.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Log-uniform in [lo, hi).
    fn log_uniform(&mut self, lo: usize, hi: usize) -> usize {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (lo as f64 * (hi as f64 / lo as f64).powf(u)) as usize
    }
}

const LAYERS: usize = 300;
const MIB: usize = 1 << 20;

/// What a replay measured.
struct Replay {
    peak_live: usize,
    peak_reserved: usize,
}

/// Replays `LAYERS` layers on `s`: each allocates its output activation and a
/// workspace, fills both (on `other` too when given, so the memory is used on a
/// second stream), then frees the workspace and its input (the previous
/// layer's output). Weights stay live throughout. Nothing synchronises until
/// the end. Panics if an allocation fails.
fn replay(dev: &Device, s: &Stream, other: Option<&Stream>) -> Replay {
    let mut rng = Rng(0x5EED_A4EAD_u64 ^ u64::from(other.is_some()));
    let fill = |b: &DeviceBuffer<u8>, v: u8| {
        // A tiny fill: the work is queued, its cost is not the point.
        s.fill_range(b, 0, 64, v).expect("fill");
        if let Some(t) = other {
            t.fill_range(b, 64, 64, v)
                .expect("fill on the second stream");
        }
    };
    let weights: Vec<DeviceBuffer<u8>> = [48 * MIB, 24 * MIB, 3 * MIB, 512 << 10]
        .iter()
        .map(|&n| s.alloc::<u8>(n).expect("weights"))
        .collect();
    for w in &weights {
        fill(w, 1);
    }
    let base: usize = weights.iter().map(DeviceBuffer::len).sum();
    let mut peak_live = base;
    let mut input: Option<DeviceBuffer<u8>> = None;
    for layer in 0..LAYERS {
        let out_len = rng.log_uniform(256 << 10, 24 * MIB);
        let out = s
            .alloc::<u8>(out_len)
            .unwrap_or_else(|e| panic!("layer {layer}: activation of {out_len} B: {e}"));
        fill(&out, layer as u8);
        let ws_len = rng.log_uniform(64 << 10, 8 * MIB);
        let ws = s
            .alloc::<u8>(ws_len)
            .unwrap_or_else(|e| panic!("layer {layer}: workspace of {ws_len} B: {e}"));
        fill(&ws, layer as u8);
        let live = base + input.as_ref().map_or(0, DeviceBuffer::len) + out_len + ws_len;
        peak_live = peak_live.max(live);
        drop(ws);
        input = Some(out);
    }
    drop(input);
    dev.synchronize().expect("the replay's work");
    let peak_reserved = dev.memory_stats().peak_reserved;
    drop(weights);
    Replay {
        peak_live,
        peak_reserved,
    }
}

fn check(r: &Replay, what: &str) {
    let ratio = r.peak_reserved as f64 / r.peak_live as f64;
    assert!(
        ratio <= 1.25,
        "{what}: peak reserved {} MiB over peak live {} MiB is {ratio:.2} (limit 1.25)",
        r.peak_reserved >> 20,
        r.peak_live >> 20
    );
}

#[test]
fn running_ahead_on_one_stream_keeps_reserved_near_live() {
    let dev = Device::new(common::config()).expect("host device");
    let s = dev.create_stream().expect("stream");
    let r = replay(&dev, &s, None);
    check(&r, "one stream");
}

#[test]
fn running_ahead_on_two_streams_keeps_reserved_near_live() {
    let dev = Device::new(common::config()).expect("host device");
    let s = dev.create_stream().expect("stream");
    let t = dev.create_stream().expect("second stream");
    let r = replay(&dev, &s, Some(&t));
    check(&r, "two streams");
}

/// A host callback runs on an engine thread. One that allocates while a free is
/// queued behind the callback itself must not wait for that free (it would wait
/// for itself): the pool maps instead. A watchdog turns a deadlock into a failure.
#[test]
fn a_host_callback_that_allocates_does_not_wait_for_itself() {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let dev = Device::new(common::config()).expect("host device");
        let s = dev.create_stream().expect("stream");
        let a = s.alloc::<u8>(20 * MIB).expect("a");
        s.fill_range(&a, 0, 64, 1).expect("fill");
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (got_tx, got_rx) = std::sync::mpsc::channel();
        let s2 = s.clone();
        s.host_fn(move || {
            // Runs once `a` is freed behind this very callback.
            go_rx.recv().expect("go");
            // Not within 1/8 of `a`'s size: only a new chunk or `a`'s serves it.
            let b = s2.alloc::<u8>(30 * MIB).map(|b| b.len());
            got_tx.send(b).expect("result");
        })
        .expect("host_fn");
        drop(a);
        go_tx.send(()).expect("go");
        // Polling the stream lets a device in virtual time reach the callback.
        let got = loop {
            match got_rx.try_recv() {
                Ok(got) => break got,
                Err(std::sync::mpsc::TryRecvError::Empty) => {
                    let _ = s.query();
                    std::thread::yield_now();
                }
                Err(e) => panic!("the callback never reported: {e}"),
            }
        };
        s.synchronize().expect("stream");
        let _ = done_tx.send(got.map_err(|e| e.to_string()));
    });
    let got = done_rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("no progress for 60 s: the callback waited for its own stream");
    assert_eq!(got, Ok(30 * MIB));
}
