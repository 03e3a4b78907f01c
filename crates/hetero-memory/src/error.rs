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
    /// A virtual memory call got an offset or length that is not a multiple
    /// of the granularity it needs.
    #[error("{what} {value:#x} is not a multiple of the granularity {granularity}; round it to a multiple of {granularity}")]
    Unaligned {
        what: &'static str,
        value: usize,
        granularity: Bytes,
    },
    /// A virtual memory call reached past the end of a range or handle.
    #[error("{what} [{offset:#x}, {offset:#x} + {len:#x}) reaches past the end ({size}); keep offset + len within {size}")]
    OutOfRange {
        what: &'static str,
        offset: usize,
        len: usize,
        size: Bytes,
    },
    /// A map over pages that are already mapped.
    #[error("map of [{offset:#x}, {offset:#x} + {len:#x}) overlaps the mapping at [{existing:#x}, {existing:#x} + {existing_len:#x}); unmap it first or map elsewhere")]
    Overlap {
        offset: usize,
        len: usize,
        existing: usize,
        existing_len: usize,
    },
    /// An unmap or set-access over pages that are not mapped.
    #[error("{what} of [{offset:#x}, {offset:#x} + {len:#x}) covers unmapped pages from {first_unmapped:#x}; map them first or shorten the range")]
    NotMapped {
        what: &'static str,
        offset: usize,
        len: usize,
        first_unmapped: usize,
    },
    /// A physical handle of a coarser granularity than the range it is mapped into.
    #[error("a physical handle of granularity {physical} cannot be mapped into a range reserved at {range}; reserve the range at {physical} or more")]
    GranularityMismatch { physical: Bytes, range: Bytes },
    /// A call reached memory of another memory context.
    #[error("{what}: the handle belongs to memory context {owner}, the call was made in context {caller}; import it into context {caller} first")]
    ForeignContext {
        what: &'static str,
        owner: String,
        caller: String,
    },
    /// A map that would take a memory context past its quota.
    #[error("memory context {context}: mapping {requested} would make {would_be} of quota {quota} ({mapped} mapped); unmap memory of this context or raise its quota")]
    QuotaExceeded {
        context: String,
        requested: Bytes,
        mapped: Bytes,
        would_be: Bytes,
        quota: Bytes,
    },
    /// A system call of the virtual memory or sharing layer failed.
    #[error("{what} failed: {source}; {hint}")]
    Os {
        what: String,
        #[source]
        source: std::io::Error,
        hint: &'static str,
    },
    /// Imported memory failed a check (seals, size, revocation, protocol).
    #[error("import of export {export} from process {exporter}: {problem}; {hint}")]
    Import {
        exporter: u32,
        export: u64,
        problem: String,
        hint: &'static str,
    },
    /// The export was revoked by its process: stale handles no longer import.
    #[error(
        "export {export} of process {exporter} was revoked; ask the exporter for a fresh handle"
    )]
    Revoked { exporter: u32, export: u64 },
    /// A private handle (anonymous memory, see
    /// [`MemoryContext::create_private`](crate::vmm::MemoryContext::create_private))
    /// was asked for what only a shareable one can do, or to map in part.
    #[error("{what}: handle {handle} was created private (anonymous memory at one address at a time); {hint}")]
    Private {
        what: &'static str,
        handle: u64,
        hint: &'static str,
    },
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
