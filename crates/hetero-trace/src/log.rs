//! A single-writer, single-reader, chunked, append-only log: the per-thread
//! buffer behind the recorder.
//!
//! Layout: a linked list of fixed-size chunks. The writer ([`Writer`], owned
//! by one thread) appends into its tail chunk and links a fresh chunk when the
//! tail is full; a published record never moves. The reader ([`Log::drain`],
//! serialized by a mutex the writer never touches) copies records out and
//! frees chunks it has fully consumed.
//!
//! Invariants:
//! - Only the writer writes slots, `next` links and `len`; `len` only grows.
//! - The writer fully writes slot `i` (and, when `i` opens a chunk, links that
//!   chunk from its predecessor) *before* storing `len = i + 1` with Release.
//!   The reader loads `len` with Acquire and reads only slots below it, so it
//!   never reads a slot that is being written, and every link it follows is
//!   already stored.
//! - The reader frees a chunk only once it has consumed every slot in it *and*
//!   `len` shows a record in a later chunk. The writer links the later chunk
//!   before writing it and never touches an earlier chunk again, so a freed
//!   chunk is one the writer no longer uses.
//! - Every chunk from the reader's head onward is owned by the [`Log`]; the
//!   last owner of the `Arc<Log>` frees them. A writer that exits leaves its
//!   records in the log until they are drained.

use std::mem::MaybeUninit;
use std::ptr;

use crossbeam_utils::CachePadded;

use crate::loom::{lock, Arc, AtomicBool, AtomicPtr, AtomicUsize, Mutex, Ordering, UnsafeCell};

/// Records per chunk. Small under loom so a test crosses chunk boundaries.
#[cfg(not(loom))]
pub(crate) const CHUNK: usize = 256;
#[cfg(loom)]
pub(crate) const CHUNK: usize = 2;

struct Chunk<T> {
    slots: [UnsafeCell<MaybeUninit<T>>; CHUNK],
    next: AtomicPtr<Chunk<T>>,
}

impl<T> Chunk<T> {
    fn alloc() -> *mut Chunk<T> {
        Box::into_raw(Box::new(Chunk {
            slots: std::array::from_fn(|_| UnsafeCell::new(MaybeUninit::uninit())),
            next: AtomicPtr::new(ptr::null_mut()),
        }))
    }
}

/// The reader's position: the oldest chunk still owned and the index of the
/// next record to read.
struct ReadState<T> {
    head: *mut Chunk<T>,
    /// Global index of `head`'s slot 0.
    head_base: usize,
    /// Global index of the next record to read.
    read: usize,
}

// SAFETY: `head` points to chunks owned by the `Log`; the pointer is only
// dereferenced under the `Log`'s reader mutex, and the records are `Send`.
unsafe impl<T: Send> Send for ReadState<T> {}

/// The shared half of a per-thread buffer.
pub(crate) struct Log<T> {
    /// Records published by the writer (Release); the reader loads it with Acquire.
    len: CachePadded<AtomicUsize>,
    /// Set (Release) when the writer is dropped, for instance when its thread exits.
    closed: AtomicBool,
    reader: Mutex<ReadState<T>>,
}

/// The writing half, owned by exactly one thread.
pub(crate) struct Writer<T> {
    log: Arc<Log<T>>,
    tail: *mut Chunk<T>,
    /// Global index of `tail`'s slot 0.
    tail_base: usize,
    /// Records written so far (the writer's private copy of `len`).
    written: usize,
}

// SAFETY: a `Writer` is the unique writer of its log (it is not `Clone` and
// `push` takes `&mut self`); moving it to another thread moves that role with
// it. `tail` points into the log, which is `Sync`.
unsafe impl<T: Send> Send for Writer<T> {}

/// Creates an empty log and its one writer.
pub(crate) fn channel<T: Copy + Send>() -> (Writer<T>, Arc<Log<T>>) {
    let first = Chunk::<T>::alloc();
    let log = Arc::new(Log {
        len: CachePadded::new(AtomicUsize::new(0)),
        closed: AtomicBool::new(false),
        reader: Mutex::new(ReadState {
            head: first,
            head_base: 0,
            read: 0,
        }),
    });
    let writer = Writer {
        log: Arc::clone(&log),
        tail: first,
        tail_base: 0,
        written: 0,
    };
    (writer, log)
}

impl<T: Copy> Writer<T> {
    /// Appends one record. Allocates only when the tail chunk is full.
    #[inline]
    pub(crate) fn push(&mut self, record: T) {
        let mut offset = self.written - self.tail_base;
        if offset == CHUNK {
            self.grow();
            offset = 0;
        }
        // SAFETY: `tail` is a live chunk owned by the log: the reader frees a
        // chunk only after `len` shows a record beyond it, and `len` never
        // exceeds `written`, which lies inside `tail`. Slot `offset` is not yet
        // published (`offset + tail_base == written >= len`), so no reader
        // reads it, and this writer is its only writer.
        unsafe {
            (*self.tail).slots[offset].with_mut(|slot| (*slot).write(record));
        }
        self.written += 1;
        self.log.len.store(self.written, Ordering::Release);
    }

    #[cold]
    fn grow(&mut self) {
        let next = Chunk::<T>::alloc();
        // SAFETY: `tail` is live (see `push`); the link is published to the
        // reader by the Release store of `len` that follows the first write
        // into `next`.
        unsafe { (*self.tail).next.store(next, Ordering::Release) };
        self.tail = next;
        self.tail_base += CHUNK;
    }
}

impl<T> Drop for Writer<T> {
    fn drop(&mut self) {
        self.log.closed.store(true, Ordering::Release);
    }
}

impl<T: Copy> Log<T> {
    /// Copies every published record not yet drained into `out`, in order, and
    /// frees the chunks that are done. Returns how many records it moved.
    pub(crate) fn drain(&self, out: &mut Vec<T>) -> usize {
        let mut state = lock(&self.reader);
        let end = self.len.load(Ordering::Acquire);
        let start = state.read;
        out.reserve(end - start);
        while state.read < end {
            if state.read - state.head_base == CHUNK {
                // SAFETY: `head` is live (owned by the log, freed only here).
                // `end > read` means the writer published a record in a later
                // chunk, so it linked `next` before that Release store and will
                // never touch `head` again: freeing it is ours alone.
                let next = unsafe { (*state.head).next.load(Ordering::Acquire) };
                debug_assert!(
                    !next.is_null(),
                    "a published record past a chunk implies its link"
                );
                // SAFETY: see above; `head` came from `Box::into_raw` in `Chunk::alloc`.
                drop(unsafe { Box::from_raw(state.head) });
                state.head = next;
                state.head_base += CHUNK;
            }
            let offset = state.read - state.head_base;
            // SAFETY: slot `read` is below `len` (Acquire), so the writer's write
            // to it happened before, and the writer never writes it again.
            let record = unsafe { (*state.head).slots[offset].with(|slot| (*slot).assume_init()) };
            out.push(record);
            state.read += 1;
        }
        end - start
    }

    /// True when the writer is gone and every record has been drained: the log
    /// can be dropped without losing anything.
    pub(crate) fn is_finished(&self) -> bool {
        if !self.closed.load(Ordering::Acquire) {
            return false;
        }
        let state = lock(&self.reader);
        state.read == self.len.load(Ordering::Acquire)
    }
}

impl<T> Drop for Log<T> {
    fn drop(&mut self) {
        // The last `Arc` is gone, so the writer is too: every chunk from the
        // reader's head onward is ours alone.
        let state = lock(&self.reader);
        let mut chunk = state.head;
        while !chunk.is_null() {
            // SAFETY: `chunk` is a live chunk owned by this log (reachable from
            // the head through links), allocated by `Chunk::alloc`.
            let boxed = unsafe { Box::from_raw(chunk) };
            chunk = boxed.next.load(Ordering::Acquire);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn push_and_drain_across_chunks() {
        let (mut w, log) = channel::<u64>();
        let mut out = Vec::new();
        for i in 0..(3 * CHUNK as u64 + 7) {
            w.push(i);
            if i % 100 == 0 {
                log.drain(&mut out);
            }
        }
        log.drain(&mut out);
        assert_eq!(out, (0..(3 * CHUNK as u64 + 7)).collect::<Vec<_>>());
        assert!(!log.is_finished());
        drop(w);
        assert!(log.is_finished());
    }

    #[test]
    fn records_survive_the_writer() {
        let (mut w, log) = channel::<u32>();
        for i in 0..(CHUNK as u32 + 1) {
            w.push(i);
        }
        drop(w);
        assert!(!log.is_finished());
        let mut out = Vec::new();
        assert_eq!(log.drain(&mut out), CHUNK + 1);
        assert!(log.is_finished());
    }

    #[test]
    fn concurrent_writer_and_reader() {
        let (mut w, log) = channel::<u64>();
        const N: u64 = 20_000;
        let writer = std::thread::spawn(move || {
            for i in 0..N {
                w.push(i);
            }
        });
        let mut out = Vec::new();
        while out.len() < N as usize {
            log.drain(&mut out);
        }
        writer.join().expect("writer thread");
        assert_eq!(out, (0..N).collect::<Vec<_>>());
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    /// A writer crossing two chunk boundaries while a reader drains: the reader
    /// sees a prefix in order, never a torn or freed slot, and nothing is lost.
    #[test]
    fn loom_writer_reader() {
        loom::model(|| {
            let (mut w, log) = channel::<u64>();
            let writer = loom::thread::spawn(move || {
                for i in 0..(2 * CHUNK as u64 + 1) {
                    w.push(i);
                }
            });
            let mut out = Vec::new();
            log.drain(&mut out);
            log.drain(&mut out);
            writer.join().expect("writer thread");
            log.drain(&mut out);
            assert_eq!(out, (0..(2 * CHUNK as u64 + 1)).collect::<Vec<_>>());
            assert!(log.is_finished());
        });
    }

    /// The writer exits with records unread; the log keeps them and frees
    /// every chunk when dropped.
    #[test]
    fn loom_writer_exits_before_drain() {
        loom::model(|| {
            let (mut w, log) = channel::<u64>();
            let reader_log = Arc::clone(&log);
            let reader = loom::thread::spawn(move || {
                let mut out = Vec::new();
                reader_log.drain(&mut out);
                out
            });
            for i in 0..(CHUNK as u64 + 1) {
                w.push(i);
            }
            drop(w);
            let mut seen = reader.join().expect("reader thread");
            log.drain(&mut seen);
            assert_eq!(seen, (0..(CHUNK as u64 + 1)).collect::<Vec<_>>());
        });
    }
}
