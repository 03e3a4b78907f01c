//! The submission queue of a stream: a bounded multi-producer, single-consumer ring
//! of operations, stored inline (no allocation per submission).
//!
//! Each slot carries a sequence number (Vyukov's bounded queue). For position `p`:
//! `seq == p` means the slot is free for the producer of position `p`; `seq == p + 1`
//! means it holds the value of position `p`; after the consumer takes it, `seq`
//! becomes `p + capacity`, freeing it for position `p + capacity`.
//!
//! Invariants:
//! - Producers claim positions with a CAS on `tail`; positions are handed out in one
//!   total order, which is the stream's submission order (value = position + 1).
//! - Exactly one thread at a time consumes (`peek`/`pop`): the caller guarantees it
//!   (the scheduler holds the stream's hardware-queue claim). That is why the
//!   consumer methods are `unsafe`.
//! - A value is written before its slot's `seq` is published (Release) and read only
//!   after the consumer observes it (Acquire).
//! - Each slot also has a `keep` cell (`K`, `()` unless asked for) that only
//!   producers touch: the producer of position `p`, between winning `p` and
//!   publishing it (`Ring::try_push_with`). The producer of `p + capacity`
//!   wins that slot only after the consumer freed it, which it did after seeing
//!   `p` published, so the seq protocol orders successive users of a keep cell.
//!   The host stream keeps there the kernel that ops of that slot borrow.

use crate::exec::loom::{AtomicU64, Ordering, UnsafeCell};
use crossbeam_utils::CachePadded;
use std::mem::MaybeUninit;

/// Asks the CPU to bring the lines of the `bytes` from `p` into its cache,
/// for a use a little later: to be written (`WRITE`: owned, so that the
/// stores do not wait for the line to be claimed), or read. Only a hint: it
/// reads and writes nothing the program sees and faults on no address, so
/// any pointer will do.
#[inline(always)]
pub(crate) fn prefetch_lines<const WRITE: bool>(p: *const u8, bytes: usize) {
    let skip = p.addr() % 64;
    let first = p.wrapping_sub(skip);
    for off in (0..skip + bytes).step_by(64) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch neither reads nor writes memory the program
        // sees and faults on no address (SSE is in the x86_64 baseline; a
        // CPU without PREFETCHW takes the write hint as a read one).
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0, _MM_HINT_T0};
            let line = first.wrapping_add(off).cast();
            if WRITE {
                _mm_prefetch::<_MM_HINT_ET0>(line);
            } else {
                _mm_prefetch::<_MM_HINT_T0>(line);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (first, off);
    }
}

/// [`prefetch_lines`] for a read.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, bytes: usize) {
    prefetch_lines::<false>(p, bytes);
}

struct Slot<T, K> {
    seq: AtomicU64,
    value: UnsafeCell<MaybeUninit<T>>,
    keep: UnsafeCell<K>,
}

pub(crate) struct Ring<T, K = ()> {
    head: CachePadded<AtomicU64>,
    tail: CachePadded<AtomicU64>,
    slots: Box<[Slot<T, K>]>,
    mask: u64,
}

// SAFETY: values and keep cells move between threads (T, K: Send); slot access is
// serialised by the sequence protocol above and the single-consumer contract.
unsafe impl<T: Send, K: Send> Send for Ring<T, K> {}
// SAFETY: as above; shared references only reach a value or a keep cell through
// that protocol.
unsafe impl<T: Send, K: Send> Sync for Ring<T, K> {}

impl<T> Ring<T> {
    /// Appends `value`, returning its position, or gives it back when the ring is full.
    #[inline]
    pub(crate) fn try_push(&self, value: T) -> Result<u64, T> {
        self.try_push_with(value, |_, _, _| {})
    }
}

impl<T, K: Default> Ring<T, K> {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let cap = capacity.max(2).next_power_of_two();
        let slots = (0..cap)
            .map(|i| Slot {
                seq: AtomicU64::new(i as u64),
                value: UnsafeCell::new(MaybeUninit::uninit()),
                keep: UnsafeCell::new(K::default()),
            })
            .collect::<Vec<_>>()
            .into_boxed_slice();
        Ring {
            head: CachePadded::new(AtomicU64::new(0)),
            tail: CachePadded::new(AtomicU64::new(0)),
            slots,
            mask: cap as u64 - 1,
        }
    }
}

impl<T, K> Ring<T, K> {
    /// Appends `value`, returning its position, or gives it back when the ring
    /// is full. Once the position is won and before the value is published,
    /// `settle` sees the value, the slot's keep cell (this producer's alone
    /// meanwhile) and the position. It must not panic: the slot is claimed.
    #[inline]
    pub(crate) fn try_push_with(
        &self,
        mut value: T,
        settle: impl FnOnce(&mut T, &mut K, u64),
    ) -> Result<u64, T> {
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[(pos & self.mask) as usize];
            let seq = slot.seq.load(Ordering::Acquire);
            if seq == pos {
                match self.tail.compare_exchange_weak(
                    pos,
                    pos + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: winning the CAS for `pos` while `seq == pos` makes this
                        // producer the only user of the slot's keep cell and the only
                        // writer of its value until it publishes it.
                        slot.keep
                            .with_mut(|k| settle(&mut value, unsafe { &mut *k }, pos));
                        // SAFETY: as above.
                        slot.value.with_mut(|p| unsafe { (*p).write(value) });
                        slot.seq.store(pos + 1, Ordering::Release);
                        return Ok(pos);
                    }
                    Err(now) => pos = now,
                }
            } else if seq < pos {
                // The consumer has not freed this slot yet: full.
                return Err(value);
            } else {
                // Another producer took `pos`: our view of `tail` is stale.
                crate::exec::loom::model_yield();
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Empties every slot's keep cell.
    ///
    /// # Safety
    /// No producer may push during or after the call, and no value pushed may
    /// still rely on what the cells keep.
    pub(crate) unsafe fn clear_keeps(&self)
    where
        K: Default,
    {
        for slot in self.slots.iter() {
            // SAFETY: no producer runs (the caller's promise), and consumers
            // never touch keep cells.
            slot.keep.with_mut(|k| unsafe { *k = K::default() });
        }
    }

    /// Asks the CPU to bring the slots of the next `n` positions into its
    /// cache, for pushes a little later: a slot was last written a whole
    /// ring's worth of pushes ago (or by the consumer), so a push otherwise
    /// stalls on it. Only a hint: it changes nothing (it reads the tail).
    #[inline]
    pub(crate) fn prefetch(&self, n: u64) {
        let tail = self.tail.load(Ordering::Relaxed);
        for pos in tail..tail + n.min(self.mask + 1) {
            let slot: *const Slot<T, K> = &self.slots[(pos & self.mask) as usize];
            prefetch_lines::<true>(slot.cast(), std::mem::size_of::<Slot<T, K>>());
        }
    }

    /// Asks the CPU to bring in what a push reads first: the tail (owned: a
    /// push writes it), and where the slots are (for a [`Ring::prefetch`] a
    /// little later).
    #[inline]
    pub(crate) fn prefetch_header(&self) {
        prefetch_lines::<true>((&raw const *self.tail).cast(), 8);
        prefetch((&raw const self.slots).cast(), 8);
    }

    /// Positions handed out so far (the next position to be claimed).
    #[inline]
    pub(crate) fn tail(&self) -> u64 {
        self.tail.load(Ordering::Acquire)
    }

    /// How many values the ring holds at most.
    #[inline]
    pub(crate) fn capacity(&self) -> u64 {
        self.mask + 1
    }

    /// Whether a push at the current tail would find its slot free: the value
    /// `capacity` positions before it was consumed. A hint while producers race.
    #[inline]
    pub(crate) fn has_room(&self) -> bool {
        self.tail().saturating_sub(self.head()) < self.capacity()
    }

    /// Positions consumed so far.
    #[inline]
    pub(crate) fn head(&self) -> u64 {
        self.head.load(Ordering::Acquire)
    }

    /// Whether no position has been claimed beyond those consumed. A hint for
    /// non-consumers; exact for the consumer.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.head() >= self.tail()
    }

    /// Whether the oldest position holds a published value: a look at its slot
    /// only (not at `tail`, which producers write). For the consumer.
    #[inline]
    pub(crate) fn has_next(&self) -> bool {
        let pos = self.head.load(Ordering::Relaxed);
        self.slots[(pos & self.mask) as usize]
            .seq
            .load(Ordering::Acquire)
            == pos + 1
    }

    /// Runs `f` on the oldest value without removing it; `None` when the oldest
    /// position is not published yet.
    ///
    /// # Safety
    /// The caller must be the only consumer for the duration of the call.
    #[inline]
    pub(crate) unsafe fn peek_with<R>(&self, f: impl FnOnce(&T, u64) -> R) -> Option<R> {
        let pos = self.head.load(Ordering::Relaxed);
        let slot = &self.slots[(pos & self.mask) as usize];
        if slot.seq.load(Ordering::Acquire) != pos + 1 {
            return None;
        }
        // SAFETY: `seq == pos + 1` (Acquire) means the producer finished writing the
        // value, and only the consumer (the caller, exclusively) reads or takes it.
        Some(
            slot.value
                .with_mut(|p| f(unsafe { (*p).assume_init_ref() }, pos)),
        )
    }

    /// Removes the oldest value, which the caller saw published (`peek_with`),
    /// returning it by value without the `Option` of [`Ring::pop`] (one move of
    /// the value, straight into the caller's local).
    ///
    /// # Safety
    /// The caller must be the only consumer since it saw the value published.
    #[inline(always)]
    pub(crate) unsafe fn take_head(&self) -> T {
        let pos = self.head.load(Ordering::Relaxed);
        let slot = &self.slots[(pos & self.mask) as usize];
        debug_assert_eq!(slot.seq.load(Ordering::Acquire), pos + 1);
        // SAFETY: the caller saw `seq == pos + 1` (Acquire) and has been the only
        // consumer since, so the value is written and not yet taken; it is moved
        // out exactly once, then the slot goes to the producer of `pos + capacity`.
        let value = slot.value.with_mut(|p| unsafe { (*p).assume_init_read() });
        slot.seq.store(pos + self.mask + 1, Ordering::Release);
        self.head.store(pos + 1, Ordering::Release);
        value
    }

    /// Removes the oldest value.
    ///
    /// # Safety
    /// The caller must be the only consumer for the duration of the call.
    #[inline]
    pub(crate) unsafe fn pop(&self) -> Option<(T, u64)> {
        let pos = self.head.load(Ordering::Relaxed);
        let slot = &self.slots[(pos & self.mask) as usize];
        if slot.seq.load(Ordering::Acquire) != pos + 1 {
            return None;
        }
        // SAFETY: the caller is the only consumer, and the value at `pos` was
        // just seen published (Acquire).
        Some((unsafe { self.take_head() }, pos))
    }
}

impl<T, K> Drop for Ring<T, K> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no other producer or consumer exists any more.
        while unsafe { self.pop() }.is_some() {}
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_full() {
        let r = Ring::with_capacity(4);
        for i in 0..4 {
            assert_eq!(r.try_push(i), Ok(i as u64));
        }
        assert_eq!(r.try_push(9), Err(9));
        // SAFETY: single-threaded test: the only consumer.
        unsafe {
            assert_eq!(r.peek_with(|v, p| (*v, p)), Some((0, 0)));
            assert_eq!(r.pop(), Some((0, 0)));
        }
        assert_eq!(r.try_push(4), Ok(4));
        let mut got = vec![];
        // SAFETY: as above.
        while let Some((v, _)) = unsafe { r.pop() } {
            got.push(v);
        }
        assert_eq!(got, vec![1, 2, 3, 4]);
    }

    #[test]
    fn drops_leftovers() {
        let item = std::sync::Arc::new(());
        let r = Ring::with_capacity(8);
        for _ in 0..5 {
            assert!(r.try_push(item.clone()).is_ok());
        }
        drop(r);
        assert_eq!(std::sync::Arc::strong_count(&item), 1);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::exec::loom::Arc;

    /// Pushes `v`, yielding while the ring is full.
    fn push(ring: &Ring<u32>, mut v: u32) -> u64 {
        loop {
            match ring.try_push(v) {
                Ok(pos) => return pos,
                Err(back) => {
                    v = back;
                    loom::thread::yield_now();
                }
            }
        }
    }

    /// Pops `n` values, yielding while the oldest is not published.
    fn pop_n<K>(ring: &Ring<u32, K>, n: usize) -> Vec<(u32, u64)> {
        let mut got = Vec::new();
        while got.len() < n {
            // SAFETY: the calling thread is the ring's only consumer.
            match unsafe { ring.pop() } {
                Some(v) => got.push(v),
                None => loom::thread::yield_now(),
            }
        }
        got
    }

    /// Two producers race for positions while the consumer drains: each value
    /// arrives exactly once, at the position its producer was given, positions dense.
    #[test]
    fn two_producers_one_consumer() {
        loom::model(|| {
            let ring = Arc::new(Ring::with_capacity(2));
            let producers: Vec<_> = (0..2u32)
                .map(|id| {
                    let ring = ring.clone();
                    loom::thread::spawn(move || (id, push(&ring, id)))
                })
                .collect();
            let got = pop_n(&ring, 2);
            let mut given: Vec<(u32, u64)> = producers
                .into_iter()
                .map(|p| p.join().expect("producer"))
                .collect();
            given.sort_by_key(|g| g.1);
            assert_eq!(got, given);
            assert_eq!(got.iter().map(|g| g.1).collect::<Vec<_>>(), vec![0, 1]);
        });
    }

    /// A producer wraps around a full two-slot ring while the consumer frees slots:
    /// values arrive in order, none lost or duplicated, and a full ring gives the
    /// value back instead of overwriting.
    #[test]
    fn wraparound_with_full_ring() {
        loom::model(|| {
            let ring = Arc::new(Ring::with_capacity(2));
            let r = ring.clone();
            let producer = loom::thread::spawn(move || {
                for v in 0..3u32 {
                    assert_eq!(push(&r, v), v as u64);
                }
            });
            let got = pop_n(&ring, 3);
            producer.join().expect("producer");
            assert_eq!(got, vec![(0, 0), (1, 1), (2, 2)]);
            assert!(ring.is_empty());
        });
    }

    /// Keep cells pass from producer to producer: two producers and the
    /// consumer (which pushes a third value once it popped the first, so that
    /// one slot is used twice) each add their value to the keep cell of the
    /// slot they won. Loom fails the model if two threads can touch a cell at
    /// once; each cell ends holding the sum of its slot's values.
    #[test]
    fn keep_cells_pass_from_producer_to_producer() {
        fn push(r: &Ring<u32, u32>, v: u32) -> u64 {
            let mut v = v;
            loop {
                match r.try_push_with(v, |v, k, _| *k += *v) {
                    Ok(pos) => return pos,
                    Err(back) => {
                        v = back;
                        loom::thread::yield_now();
                    }
                }
            }
        }
        loom::model(|| {
            let ring: Arc<Ring<u32, u32>> = Arc::new(Ring::with_capacity(2));
            let producers: Vec<_> = [1u32, 10]
                .into_iter()
                .map(|v| {
                    let r = ring.clone();
                    loom::thread::spawn(move || push(&r, v))
                })
                .collect();
            let mut got = pop_n(&ring, 1);
            push(&ring, 100);
            got.extend(pop_n(&ring, 2));
            for p in producers {
                p.join().expect("producer");
            }
            let mut want = [0u32; 2];
            for (v, pos) in &got {
                want[(pos & 1) as usize] += v;
            }
            let mut seen = [0u32; 2];
            for _ in 0..2 {
                let pushed = ring.try_push_with(0, |_, k, pos| seen[(pos & 1) as usize] = *k);
                assert!(pushed.is_ok());
                pop_n(&ring, 1);
            }
            assert_eq!(seen, want);
        });
    }
}
