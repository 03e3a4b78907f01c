//! A plan for many buffers of a sequential schedule without the conflict
//! matrix ([`Conflicts`](super::Conflicts) keeps n² bits: 1.2 GiB for 100 000
//! buffers, and building it took seconds): [`plan_intervals`].

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::ArenaPlan;

/// Offsets (multiples of `align`, a power of two) for buffers live over steps
/// `intervals[i].0 ..= intervals[i].1` (a reversed pair read as its swap), as
/// [`Conflicts::from_intervals`](super::Conflicts::from_intervals) relates them:
/// two buffers whose intervals meet never share a byte. Buffers are placed in
/// order of their first step, each at the lowest free block of the arena that
/// holds it (first fit), after the blocks of the buffers whose last step came
/// before that first step are given back (merged with their free neighbours);
/// the arena grows at its top when no block holds it. A zero-sized buffer gets
/// offset 0.
///
/// Cost: O(n log n) for the steps, and per buffer a walk of the free blocks;
/// O(n) memory. Its arena is not searched as [`plan`](super::plan)'s is: it
/// is for graphs too large for that.
///
/// Panics if `align` is not a power of two or `sizes` and `intervals` differ in
/// length.
pub fn plan_intervals(sizes: &[u64], align: u64, intervals: &[(u32, u32)]) -> ArenaPlan {
    assert!(
        align.is_power_of_two(),
        "align {align} is not a power of two"
    );
    assert_eq!(sizes.len(), intervals.len(), "one interval per buffer");
    let span = |i: usize| {
        let (a, b) = intervals[i];
        (a.min(b), a.max(b))
    };
    let mut order: Vec<usize> = (0..sizes.len()).filter(|&i| sizes[i] > 0).collect();
    order.sort_by_key(|&i| (span(i).0, i));
    let mut offsets = vec![0u64; sizes.len()];
    // Live buffers by last step: (last step, offset, bytes taken).
    let mut live: BinaryHeap<Reverse<(u32, u64, u64)>> = BinaryHeap::new();
    // Free blocks below `top`, by offset: offset -> bytes.
    let mut free: BTreeMap<u64, u64> = BTreeMap::new();
    let mut top = 0u64;
    let mut size = 0u64;
    for i in order {
        let (first, last) = span(i);
        while let Some(&Reverse((end, at, bytes))) = live.peek() {
            if end >= first {
                break;
            }
            live.pop();
            give_back(&mut free, &mut top, at, bytes);
        }
        let bytes = sizes[i].div_ceil(align).saturating_mul(align);
        let fit = free
            .iter()
            .find(|&(_, &len)| len >= bytes)
            .map(|(&at, &len)| (at, len));
        let at = match fit {
            Some((at, len)) => {
                free.remove(&at);
                if len > bytes {
                    free.insert(at + bytes, len - bytes);
                }
                at
            }
            None => {
                let at = top;
                top = top.saturating_add(bytes);
                at
            }
        };
        offsets[i] = at;
        size = size.max(at.saturating_add(sizes[i]));
        live.push(Reverse((last, at, bytes)));
    }
    ArenaPlan {
        offsets,
        size,
        strategy: "first-fit sweep of the intervals",
    }
}

/// Returns `at..at + bytes` to the free blocks; a block that reaches `top`
/// lowers it instead.
fn give_back(free: &mut BTreeMap<u64, u64>, top: &mut u64, at: u64, bytes: u64) {
    let (at, bytes) = merge_free(free, at, bytes);
    if at.saturating_add(bytes) == *top {
        *top = at;
    } else {
        free.insert(at, bytes);
    }
}

/// Takes the free blocks beside `at..at + len` (keyed by start, holding
/// their length) out of `free` and returns the merged block, for the caller
/// to insert (or not). Shared with other free lists of ranges (the emulated
/// device's memory).
pub fn merge_free<T>(free: &mut BTreeMap<T, T>, mut at: T, mut len: T) -> (T, T)
where
    T: Ord + Copy + std::ops::Add<Output = T>,
{
    if let Some((&before, &blen)) = free.range(..at).next_back() {
        if before + blen == at {
            free.remove(&before);
            at = before;
            len = len + blen;
        }
    }
    if let Some(after) = free.remove(&(at + len)) {
        len = len + after;
    }
    (at, len)
}
