//! Manual AddressSanitizer poisoning. When built with `--cfg hetero_asan` (see
//! ci/asan.sh) the pools poison a buffer's bytes when it is freed or cached and
//! unpoison them when it is handed out, so a use-after-free through a stale
//! pointer is reported even though the memory stays mapped. Otherwise these
//! are no-ops.

#[cfg(hetero_asan)]
extern "C" {
    fn __asan_poison_memory_region(addr: *const u8, size: usize);
    fn __asan_unpoison_memory_region(addr: *const u8, size: usize);
    fn __asan_address_is_poisoned(addr: *const u8) -> i32;
}

/// Marks `[addr, addr + len)` as unusable.
#[inline(always)]
pub(crate) fn poison(addr: *const u8, len: usize) {
    #[cfg(hetero_asan)]
    // SAFETY: the ASan runtime only updates its shadow memory for the range; the
    // callers pass ranges of chunks this process has mapped.
    unsafe {
        __asan_poison_memory_region(addr, len)
    };
    let _ = (addr, len);
}

/// Marks `[addr, addr + len)` as usable again.
#[inline(always)]
pub(crate) fn unpoison(addr: *const u8, len: usize) {
    #[cfg(hetero_asan)]
    // SAFETY: as for `poison`.
    unsafe {
        __asan_unpoison_memory_region(addr, len)
    };
    let _ = (addr, len);
}

/// Whether ASan considers the byte at `addr` poisoned (always false without ASan).
pub fn is_poisoned(addr: *const u8) -> bool {
    #[cfg(hetero_asan)]
    // SAFETY: a query of ASan's shadow memory; it does not touch `addr` itself.
    return unsafe { __asan_address_is_poisoned(addr) } != 0;
    #[cfg(not(hetero_asan))]
    {
        let _ = addr;
        false
    }
}
