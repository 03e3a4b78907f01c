//! Pool configuration: a builder, and `HETERO_ALLOC_CONF` (`key:value,key:value`,
//! like `PYTORCH_CUDA_ALLOC_CONF`). Unknown keys and bad values are errors that
//! list the valid keys; nothing is silently ignored.

use crate::error::MemoryError;
use serde::Serialize;

/// Which pages the OS layer asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HugePagePolicy {
    /// hugetlb pages first, then transparent huge pages, then 4 KiB pages.
    HugeFirst,
    /// hugetlb pages or an error.
    HugeOnly,
    /// 4 KiB pages only.
    NormalOnly,
}

/// When a block freed on one stream may serve another (cudaMemPool's reuse flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReusePolicy {
    /// Hand the block out at once and list the pending fences in
    /// [`Allocation::wait_for`](crate::Allocation::wait_for); the new stream waits on them.
    FollowEventDependencies,
    /// Reuse only blocks whose fences have already completed.
    Opportunistic,
    /// Wait on the host for the fences before handing the block out.
    InternalDependencies,
}

/// Device pool configuration. Build with [`PoolConfig::default`] and the setters,
/// or read it from `HETERO_ALLOC_CONF` with [`PoolConfig::from_env`].
///
/// ```
/// use hetero_memory::{PoolConfig, ReusePolicy};
/// let c = PoolConfig::parse("max_reserved_mb:64,reuse:opportunistic").unwrap();
/// assert_eq!(c.max_reserved, 64 << 20);
/// assert_eq!(c.reuse, ReusePolicy::Opportunistic);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolConfig {
    pub huge_pages: HugePagePolicy,
    pub reuse: ReusePolicy,
    /// Most bytes the pool may reserve (the device's capacity).
    pub max_reserved: usize,
    /// Blocks larger than this are never split.
    pub max_split_size: usize,
    /// `trim`-like release of unused chunks happens whenever reserved bytes exceed this.
    pub release_threshold: usize,
    /// Most bytes one stream's block cache holds before frees go to the shared level.
    pub stream_cache_bytes: usize,
    /// Touch every page of a new chunk (in parallel for large ones).
    pub prefault: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            huge_pages: HugePagePolicy::HugeFirst,
            reuse: ReusePolicy::FollowEventDependencies,
            max_reserved: usize::MAX,
            max_split_size: usize::MAX,
            release_threshold: usize::MAX,
            stream_cache_bytes: 64 << 20,
            prefault: false,
        }
    }
}

const VALID_KEYS: &str = "huge_pages:{huge_first|huge_only|normal_only}, \
reuse:{follow_event_dependencies|opportunistic|internal_dependencies}, max_reserved_mb:N, \
max_split_size_mb:N, release_threshold_mb:N, stream_cache_mb:N, prefault:{true|false}";

impl PoolConfig {
    pub fn huge_pages(mut self, p: HugePagePolicy) -> Self {
        self.huge_pages = p;
        self
    }
    pub fn reuse(mut self, p: ReusePolicy) -> Self {
        self.reuse = p;
        self
    }
    pub fn max_reserved(mut self, bytes: usize) -> Self {
        self.max_reserved = bytes;
        self
    }
    pub fn max_split_size(mut self, bytes: usize) -> Self {
        self.max_split_size = bytes;
        self
    }
    pub fn release_threshold(mut self, bytes: usize) -> Self {
        self.release_threshold = bytes;
        self
    }
    pub fn stream_cache_bytes(mut self, bytes: usize) -> Self {
        self.stream_cache_bytes = bytes;
        self
    }
    pub fn prefault(mut self, on: bool) -> Self {
        self.prefault = on;
        self
    }

    /// Reads `HETERO_ALLOC_CONF`; the defaults when it is unset or empty.
    pub fn from_env() -> Result<Self, MemoryError> {
        match std::env::var("HETERO_ALLOC_CONF") {
            Ok(s) => Self::parse(&s),
            Err(_) => Ok(Self::default()),
        }
    }

    /// Parses `key:value,key:value` over the defaults.
    pub fn parse(input: &str) -> Result<Self, MemoryError> {
        let mut c = Self::default();
        let err = |problem: String| MemoryError::Config {
            input: input.to_string(),
            problem,
            valid: VALID_KEYS,
        };
        for item in input.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item
                .split_once(':')
                .ok_or_else(|| err(format!("{item:?} is not key:value")))?;
            let (key, value) = (key.trim(), value.trim());
            let mb = |v: &str| -> Result<usize, MemoryError> {
                v.parse::<usize>()
                    .ok()
                    .and_then(|n| n.checked_mul(1 << 20))
                    .ok_or_else(|| err(format!("{key} wants a whole number of MiB, got {v:?}")))
            };
            match key {
                "huge_pages" => {
                    c.huge_pages = match value {
                        "huge_first" => HugePagePolicy::HugeFirst,
                        "huge_only" => HugePagePolicy::HugeOnly,
                        "normal_only" => HugePagePolicy::NormalOnly,
                        v => return Err(err(format!("huge_pages cannot be {v:?}"))),
                    }
                }
                "reuse" => {
                    c.reuse = match value {
                        "follow_event_dependencies" => ReusePolicy::FollowEventDependencies,
                        "opportunistic" => ReusePolicy::Opportunistic,
                        "internal_dependencies" => ReusePolicy::InternalDependencies,
                        v => return Err(err(format!("reuse cannot be {v:?}"))),
                    }
                }
                "max_reserved_mb" => c.max_reserved = mb(value)?,
                "max_split_size_mb" => c.max_split_size = mb(value)?,
                "release_threshold_mb" => c.release_threshold = mb(value)?,
                "stream_cache_mb" => c.stream_cache_bytes = mb(value)?,
                "prefault" => {
                    c.prefault = value
                        .parse()
                        .map_err(|_| err(format!("prefault wants true or false, got {value:?}")))?
                }
                k => return Err(err(format!("unknown key {k:?}"))),
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key() {
        let c = PoolConfig::parse(
            "huge_pages:normal_only, reuse:internal_dependencies,max_reserved_mb:8,\
             max_split_size_mb:4,release_threshold_mb:2,stream_cache_mb:1,prefault:true",
        )
        .expect("valid");
        assert_eq!(c.huge_pages, HugePagePolicy::NormalOnly);
        assert_eq!(c.reuse, ReusePolicy::InternalDependencies);
        assert_eq!(c.max_reserved, 8 << 20);
        assert_eq!(c.max_split_size, 4 << 20);
        assert_eq!(c.release_threshold, 2 << 20);
        assert_eq!(c.stream_cache_bytes, 1 << 20);
        assert!(c.prefault);
        assert_eq!(PoolConfig::parse("").expect("empty"), PoolConfig::default());
    }

    #[test]
    fn unknown_key_lists_valid_keys() {
        let e = PoolConfig::parse("garbage_collection_threshold:0.8").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("unknown key"), "{msg}");
        assert!(msg.contains("max_split_size_mb"), "{msg}");
    }

    #[test]
    fn bad_values_are_errors() {
        for bad in [
            "max_reserved_mb:lots",
            "huge_pages:sometimes",
            "prefault:1",
            "reuse",
            "reuse:x",
        ] {
            let e = PoolConfig::parse(bad).unwrap_err();
            assert!(matches!(e, MemoryError::Config { .. }), "{bad}: {e}");
        }
    }
}
