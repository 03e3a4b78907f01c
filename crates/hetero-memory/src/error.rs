//! The memory layer's error type. Every message says what was asked, what was
//! there, and what to do about it.

use std::fmt;

/// Bytes, printed in the unit a person reads fastest (B, KiB, MiB, GiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{v:.1} {}", UNITS[u])
        }
    }
}

/// Errors of the OS layer, the pinned pool and the device pool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// The pool could not serve a request even after freeing cached blocks,
    /// waiting for pending stream-ordered frees and releasing unused chunks.
    #[error(
        "out of memory: requested {requested}, reserved {reserved} (limit {limit}), allocated {allocated}, \
         free but fragmented {free_fragmented}, largest free {largest_free}; {hint}"
    )]
    OutOfMemory {
        requested: Bytes,
        reserved: Bytes,
        limit: Bytes,
        allocated: Bytes,
        free_fragmented: Bytes,
        largest_free: Bytes,
        hint: &'static str,
    },
    /// A request that no allocator could honour (zero size, bad alignment).
    #[error("invalid request: {what}; {hint}")]
    InvalidRequest { what: String, hint: &'static str },
    /// The operating system refused a mapping.
    #[error("mmap of {len} failed: {source}; {hint}")]
    Map {
        len: Bytes,
        #[source]
        source: std::io::Error,
        hint: &'static str,
    },
    /// Huge pages were required (`huge_pages:huge_only`) but none could be had.
    #[error("huge pages required but unavailable for {len}: {reason}; reserve some with `echo N > /proc/sys/vm/nr_hugepages` or use huge_pages:huge_first")]
    HugePagesUnavailable { len: Bytes, reason: String },
    /// A configuration key or value was not understood.
    #[error("bad allocator configuration {input:?}: {problem}; valid keys: {valid}")]
    Config {
        input: String,
        problem: String,
        valid: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_print_in_readable_units() {
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(3 << 30).to_string(), "3.0 GiB");
        assert_eq!(Bytes(1536).to_string(), "1.5 KiB");
    }
}
