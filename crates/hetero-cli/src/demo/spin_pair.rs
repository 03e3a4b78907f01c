//! The demo's work without a runtime: a hand-written pipeline of two threads,
//! one running every copy and the other every kernel, handing tiles over by
//! spinning on counters (no queue, no event, no wake-up, no allocation). The
//! host demo (and so `hetero bench pipeline`) runs it right after hetero's
//! reps, in the same process, as the peer that shows whether a run's shortfall
//! is the runtime's or the machine's. It is not a ceiling: each thread keeps its stage, where hetero's
//! two engines take whichever stage is ready, and on the 2-vCPU VM the pair
//! alone overlapped less (1.06-1.40x over its serial run) than hetero's three
//! streams did in the same state (about 1.5x).
//!
//! Who touches what: the copier thread runs every tile's H2D (input → an in
//! slot) and D2H (an out slot → output); the calling thread runs every kernel
//! (in slot → out slot). Slot `c % SLOTS` belongs to tile `c`. The counters say
//! how many tiles finished each stage; a stage starts tile `c` only when the
//! counters say the slot's previous user is done with it:
//! - H2D of `c` once the kernel of `c - SLOTS` finished (`computed > c - SLOTS`),
//! - the kernel of `c` once H2D of `c` finished and D2H of `c - SLOTS` did,
//! - D2H of `c` once the kernel of `c` finished.
//!
//! So at most one thread uses a slot at a time; the slots' mutexes are never
//! contended, they only make that sharing safe without `unsafe`. Every buffer
//! is the device's pinned memory, as the demo's inputs and outputs are (with
//! plain `Vec`s the pair ran 20-30 % slower on the same work here: 4 KiB pages
//! against the pinned pool's huge pages). A round's
//! counters are reset by the caller while the copier waits for the round number,
//! which it reads with Acquire after the caller's Release store.

use super::kernel::{reference, scale_into};
use crossbeam_utils::CachePadded;
use hetero::{Device, PinnedBuffer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

/// Tiles in flight, as in the demo.
const SLOTS: usize = 4;
/// The round number that tells the copier to exit.
const STOP: usize = usize::MAX;

type Buf = Mutex<PinnedBuffer<f32>>;

struct Shared {
    input: Vec<Buf>,
    output: Vec<Buf>,
    slot_in: Vec<Buf>,
    slot_out: Vec<Buf>,
    work: u32,
    copied: CachePadded<AtomicUsize>,
    computed: CachePadded<AtomicUsize>,
    drained: CachePadded<AtomicUsize>,
    /// The round the copier is to run (0: none yet).
    round: CachePadded<AtomicUsize>,
    /// The round the copier is ready for (it spins until `go` says start).
    ready: CachePadded<AtomicUsize>,
    go: CachePadded<AtomicUsize>,
}

fn lock(m: &Buf) -> std::sync::MutexGuard<'_, PinnedBuffer<f32>> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// No stream ever sees the pair's buffers and `SpinPair::new` opened each one,
/// so host access cannot fail afterwards.
const OPENED: &str = "pair buffers are host memory no op uses (checked in SpinPair::new)";

fn read(b: &PinnedBuffer<f32>) -> &[f32] {
    b.as_slice().expect(OPENED)
}

fn write(b: &mut PinnedBuffer<f32>) -> &mut [f32] {
    b.as_mut_slice().expect(OPENED)
}

fn spin_until(mut ready: impl FnMut() -> bool) {
    while !ready() {
        std::hint::spin_loop();
    }
}

impl Shared {
    fn kernel(&self, c: usize) {
        let src = lock(&self.slot_in[c % SLOTS]);
        let mut dst = lock(&self.slot_out[c % SLOTS]);
        scale_into(read(&src), write(&mut dst), self.work);
    }

    fn h2d(&self, c: usize) {
        write(&mut lock(&self.slot_in[c % SLOTS])).copy_from_slice(read(&lock(&self.input[c])));
    }

    fn d2h(&self, c: usize) {
        write(&mut lock(&self.output[c])).copy_from_slice(read(&lock(&self.slot_out[c % SLOTS])));
    }

    /// The copier's part of one round: D2H as soon as a kernel finished (it
    /// frees an out slot), else the next H2D its in slot allows.
    fn copy_round(&self) {
        let tiles = self.input.len();
        let (mut h, mut d) = (0, 0);
        while d < tiles {
            if self.computed.load(Ordering::Acquire) > d {
                self.d2h(d);
                d += 1;
                self.drained.store(d, Ordering::Release);
            } else if h < tiles && self.computed.load(Ordering::Acquire) + SLOTS > h {
                self.h2d(h);
                h += 1;
                self.copied.store(h, Ordering::Release);
            } else {
                std::hint::spin_loop();
            }
        }
    }

    fn copier(&self) {
        let mut seen = 0;
        loop {
            let r = loop {
                let r = self.round.load(Ordering::Acquire);
                if r != seen {
                    break r;
                }
                std::thread::park();
            };
            if r == STOP {
                return;
            }
            seen = r;
            self.ready.store(r, Ordering::Release);
            spin_until(|| self.go.load(Ordering::Acquire) == r);
            self.copy_round();
        }
    }
}

/// The pair: the copier thread lives as long as this value.
pub struct SpinPair {
    shared: Arc<Shared>,
    copier: Option<JoinHandle<()>>,
    rounds: usize,
}

impl SpinPair {
    /// A pair over its own pinned copy of `input` (one buffer per tile, all the
    /// same length) on host device `dev`, running the demo kernel with `work`
    /// eighths of a pass.
    pub fn new(dev: &Device, input: &[&[f32]], work: u32) -> hetero::Result<Self> {
        let n = input.first().map_or(0, |i| i.len());
        if let Some(i) = input.iter().position(|t| t.len() != n) {
            return Err(hetero::Error::InvalidArgument(format!(
                "spin pair: tile {i} has {} elements, tile 0 has {n}; pass tiles of one length",
                input[i].len()
            )));
        }
        let open = |mut b: PinnedBuffer<f32>| -> hetero::Result<Buf> {
            b.as_mut_slice()?;
            Ok(Mutex::new(b))
        };
        let bufs = |k: usize| -> hetero::Result<Vec<Buf>> {
            (0..k).map(|_| open(dev.alloc_pinned(n)?)).collect()
        };
        let shared = Arc::new(Shared {
            input: input
                .iter()
                .map(|i| open(dev.pinned_from_slice(i)?))
                .collect::<hetero::Result<_>>()?,
            output: bufs(input.len())?,
            slot_in: bufs(SLOTS)?,
            slot_out: bufs(SLOTS)?,
            work,
            copied: Default::default(),
            computed: Default::default(),
            drained: Default::default(),
            round: Default::default(),
            ready: Default::default(),
            go: Default::default(),
        });
        let sh = Arc::clone(&shared);
        let copier = std::thread::Builder::new()
            .name("spin-pair copier".into())
            .spawn(move || sh.copier())
            .map_err(|e| {
                hetero::Error::Setup(format!(
                    "the spin-pair peer could not start its thread: {e}"
                ))
            })?;
        Ok(SpinPair {
            shared,
            copier: Some(copier),
            rounds: 0,
        })
    }

    /// Every stage of every tile on the calling thread, through the same slots
    /// (ms).
    pub fn serial_ms(&mut self) -> f64 {
        let sh = &*self.shared;
        let t = Instant::now();
        for c in 0..sh.input.len() {
            sh.h2d(c);
            sh.kernel(c);
            sh.d2h(c);
        }
        t.elapsed().as_secs_f64() * 1e3
    }

    /// One pipelined round: the kernels here, the copies on the copier (ms,
    /// from the moment the copier is spinning, ready to start). An error if the
    /// copier thread is gone (it panicked): the round could never end.
    pub fn pipelined_ms(&mut self) -> hetero::Result<f64> {
        let sh = &*self.shared;
        let copier = self.copier.as_ref();
        let gone = || copier.is_none_or(JoinHandle::is_finished);
        let wait = |ready: &dyn Fn() -> bool| -> hetero::Result<()> {
            spin_until(|| ready() || gone());
            if ready() {
                Ok(())
            } else {
                Err(hetero::Error::Setup(
                    "the spin-pair copier thread ended mid-round".into(),
                ))
            }
        };
        let tiles = sh.input.len();
        for c in [&sh.copied, &sh.computed, &sh.drained] {
            c.store(0, Ordering::Relaxed);
        }
        self.rounds += 1;
        let r = self.rounds;
        sh.round.store(r, Ordering::Release);
        if let Some(t) = copier {
            t.thread().unpark();
        }
        wait(&|| sh.ready.load(Ordering::Acquire) == r)?;
        let t = Instant::now();
        sh.go.store(r, Ordering::Release);
        for c in 0..tiles {
            wait(&|| {
                sh.copied.load(Ordering::Acquire) > c
                    && sh.drained.load(Ordering::Acquire) + SLOTS > c
            })?;
            sh.kernel(c);
            sh.computed.store(c + 1, Ordering::Release);
        }
        wait(&|| sh.drained.load(Ordering::Acquire) == tiles)?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }

    /// Whether the last run's outputs match the CPU reference bit for bit.
    pub fn verify(&self) -> bool {
        let sh = &*self.shared;
        sh.input.iter().zip(&sh.output).all(|(i, o)| {
            let (i, o) = (lock(i), lock(o));
            let (i, o) = (read(&i), read(&o));
            let n = i.len();
            o.iter()
                .zip(i)
                .enumerate()
                .all(|(k, (y, x))| y.to_bits() == reference(*x, sh.work, k, n).to_bits())
        })
    }
}

impl Drop for SpinPair {
    fn drop(&mut self) {
        self.shared.round.store(STOP, Ordering::Release);
        if let Some(t) = self.copier.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both modes produce the reference, round after round (a slot handed over
    /// too early would mix tiles), and the pair shuts down.
    #[test]
    fn both_modes_match_the_reference() {
        let n = 1024;
        let input: Vec<Vec<f32>> = (0..13)
            .map(|c| (0..n).map(|i| ((c * n + i) % 1000) as f32).collect())
            .collect();
        let slices: Vec<&[f32]> = input.iter().map(Vec::as_slice).collect();
        let dev = Device::host().expect("host device");
        let mut pair = SpinPair::new(&dev, &slices, 13).expect("pair");
        for _ in 0..3 {
            pair.serial_ms();
            assert!(pair.verify());
            for o in &pair.shared.output {
                write(&mut lock(o)).fill(f32::NAN);
            }
            pair.pipelined_ms().expect("round");
            assert!(pair.verify());
            for o in &pair.shared.output {
                write(&mut lock(o)).fill(f32::NAN);
            }
        }
        assert!(!pair.verify(), "cleared outputs must fail the check");
    }

    #[test]
    fn tiles_of_different_lengths_are_an_error() {
        let dev = Device::host().expect("host device");
        let (a, b) = (vec![0f32; 8], vec![0f32; 9]);
        let e = SpinPair::new(&dev, &[&a, &b], 8).err().expect("an error");
        assert!(e.to_string().contains("tile 1 has 9 elements"), "{e}");
    }
}
