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

use crate::loom::{AtomicU64, Ordering, UnsafeCell};
use crossbeam_utils::CachePadded;
use std::mem::MaybeUninit;

struct Slot<T> {
    seq: AtomicU64,
    value: UnsafeCell<MaybeUninit<T>>,
}

pub(crate) struct Ring<T> {
    head: CachePadded<AtomicU64>,
    tail: CachePadded<AtomicU64>,
    slots: Box<[Slot<T>]>,
    mask: u64,
}

// SAFETY: values move between threads (T: Send); slot access is serialised by the
// sequence protocol above and the single-consumer contract.
unsafe impl<T: Send> Send for Ring<T> {}
// SAFETY: as above; shared references only reach a value through that protocol.
unsafe impl<T: Send> Sync for Ring<T> {}

impl<T> Ring<T> {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let cap = capacity.max(2).next_power_of_two();
        let slots = (0..cap)
            .map(|i| Slot {
                seq: AtomicU64::new(i as u64),
                value: UnsafeCell::new(MaybeUninit::uninit()),
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

    /// Appends `value`, returning its position, or gives it back when the ring is full.
    #[inline]
    pub(crate) fn try_push(&self, value: T) -> Result<u64, T> {
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
                        // producer the only writer of the slot until it publishes it.
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
                crate::loom::model_yield();
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
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

impl<T> Drop for Ring<T> {
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
    use crate::loom::Arc;

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
    fn pop_n(ring: &Ring<u32>, n: usize) -> Vec<(u32, u64)> {
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
}
