//! Pool configuration: a builder, and `HETERO_ALLOC_CONF` (`key:value,key:value`,
//! like `PYTORCH_CUDA_ALLOC_CONF`). Unknown keys, bad values, a key given twice
//! and a value that is not UTF-8 are errors that say what to fix; nothing is
//! silently ignored.

use crate::error::MemoryError;
use serde::Serialize;
use std::ffi::OsString;

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
#[derive(Debug, Clone, PartialEq, Serialize)]
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
    /// Before mapping a chunk that would take reserved bytes past this many
    /// times the bytes in use (live plus stream-cached, and the request), a
    /// host thread first waits for stream work behind which frees are queued,
    /// earliest first, and retries from what they freed; it maps only when
    /// none is left. Bounds the memory a host running ahead of its streams
    /// makes the pool reserve. `None`: never wait, map at once. Engine threads
    /// never wait.
    pub wait_before_grow_ratio: Option<f64>,
    /// One reserved virtual range per size class that grows and shrinks by
    /// whole 2 MiB granules of physical memory (PyTorch's
    /// `expandable_segments`), instead of chunks. Applies to the host chunk
    /// source ([`DevicePool::new`](crate::DevicePool::new)); a pool over
    /// another source maps chunks and says so in its stats.
    pub expandable_segments: bool,
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
            wait_before_grow_ratio: Some(DEFAULT_WAIT_BEFORE_GROW_RATIO),
            expandable_segments: false,
        }
    }
}

/// The default of [`PoolConfig::wait_before_grow_ratio`].
pub const DEFAULT_WAIT_BEFORE_GROW_RATIO: f64 = 1.25;

const VALID_KEYS: &str = "huge_pages:{huge_first|huge_only|normal_only}, \
reuse:{follow_event_dependencies|opportunistic|internal_dependencies}, max_reserved_mb:N, \
max_split_size_mb:N, release_threshold_mb:N, stream_cache_mb:N, prefault:{true|false}, \
wait_before_grow_ratio:{R >= 1.0|off} (default 1.25), expandable_segments:{true|false}";

const ENV: &str = "HETERO_ALLOC_CONF";

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
    /// See [`PoolConfig::wait_before_grow_ratio`]; `None` turns the wait off.
    pub fn wait_before_grow_ratio(mut self, ratio: Option<f64>) -> Self {
        self.wait_before_grow_ratio = ratio;
        self
    }

    /// See [`PoolConfig::expandable_segments`].
    pub fn expandable_segments(mut self, on: bool) -> Self {
        self.expandable_segments = on;
        self
    }

    /// Reads `HETERO_ALLOC_CONF`; the defaults when it is unset or empty.
    pub fn from_env() -> Result<Self, MemoryError> {
        Self::from_env_value(std::env::var_os(ENV))
    }

    /// [`PoolConfig::from_env`] for a given value of `HETERO_ALLOC_CONF`
    /// (`None`: unset). A value that is not UTF-8 is an error, not "unset".
    pub fn from_env_value(value: Option<OsString>) -> Result<Self, MemoryError> {
        let Some(value) = value else {
            return Ok(Self::default());
        };
        match value.into_string() {
            Ok(s) => Self::parse(&s),
            Err(raw) => Err(MemoryError::Config {
                input: raw.to_string_lossy().into_owned(),
                problem: format!(
                    "{ENV} is not valid UTF-8 (shown with U+FFFD for the bad bytes); \
                     set it to ASCII key:value pairs or unset it"
                ),
                valid: VALID_KEYS,
            }),
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
        let mut seen: Vec<&str> = Vec::new();
        for item in input.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item
                .split_once(':')
                .ok_or_else(|| err(format!("{item:?} is not key:value")))?;
            let (key, value) = (key.trim(), value.trim());
            // A repeated key is most likely two settings merged by accident
            // (a script appending to the variable): refuse rather than guess.
            if seen.contains(&key) {
                return Err(err(format!(
                    "{key} is given more than once; keep one {key}:… entry"
                )));
            }
            seen.push(key);
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
                "expandable_segments" => {
                    c.expandable_segments = value.parse().map_err(|_| {
                        err(format!(
                            "expandable_segments wants true or false, got {value:?}"
                        ))
                    })?
                }
                "wait_before_grow_ratio" => {
                    c.wait_before_grow_ratio = match value {
                        "off" => None,
                        v => {
                            Some(v.parse::<f64>().ok().filter(|r| *r >= 1.0).ok_or_else(|| {
                                err(format!(
                                    "wait_before_grow_ratio wants a number of at least 1.0 \
                                     (reserved over live bytes) or off, got {v:?}"
                                ))
                            })?)
                        }
                    }
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
             max_split_size_mb:4,release_threshold_mb:2,stream_cache_mb:1,prefault:true,\
             wait_before_grow_ratio:1.5,expandable_segments:true",
        )
        .expect("valid");
        assert_eq!(c.huge_pages, HugePagePolicy::NormalOnly);
        assert_eq!(c.reuse, ReusePolicy::InternalDependencies);
        assert_eq!(c.max_reserved, 8 << 20);
        assert_eq!(c.max_split_size, 4 << 20);
        assert_eq!(c.release_threshold, 2 << 20);
        assert_eq!(c.stream_cache_bytes, 1 << 20);
        assert!(c.prefault);
        assert_eq!(c.wait_before_grow_ratio, Some(1.5));
        assert!(c.expandable_segments);
        assert_eq!(PoolConfig::parse("").expect("empty"), PoolConfig::default());
        let off = PoolConfig::parse("wait_before_grow_ratio:off").expect("off");
        assert_eq!(off.wait_before_grow_ratio, None);
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
            "wait_before_grow_ratio:0.5",
            "wait_before_grow_ratio:NaN",
            "wait_before_grow_ratio:never",
            "expandable_segments:yes",
        ] {
            let e = PoolConfig::parse(bad).unwrap_err();
            assert!(matches!(e, MemoryError::Config { .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn a_key_given_twice_is_an_error_naming_it() {
        let e = PoolConfig::parse("max_reserved_mb:64,reuse:opportunistic,max_reserved_mb:128")
            .unwrap_err();
        assert!(matches!(e, MemoryError::Config { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("max_reserved_mb is given more than once"),
            "{msg}"
        );
        assert!(msg.contains("keep one"), "{msg}");
        // Spacing does not make it a different key.
        assert!(PoolConfig::parse("prefault:true, prefault :false").is_err());
    }

    #[test]
    fn non_utf8_value_is_an_error_not_unset() {
        use std::os::unix::ffi::OsStringExt;
        let raw = OsString::from_vec(b"max_reserved_mb:\xff64".to_vec());
        let e = PoolConfig::from_env_value(Some(raw)).unwrap_err();
        assert!(matches!(e, MemoryError::Config { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("not valid UTF-8"), "{msg}");
        assert!(msg.contains("unset it"), "{msg}");
        assert!(msg.contains("max_reserved_mb:\u{FFFD}64"), "{msg}");
    }

    #[test]
    fn unset_and_empty_values_are_the_defaults() {
        let unset = PoolConfig::from_env_value(None).expect("unset");
        assert_eq!(unset, PoolConfig::default());
        let empty = PoolConfig::from_env_value(Some(OsString::new())).expect("empty");
        assert_eq!(empty, PoolConfig::default());
        let set = PoolConfig::from_env_value(Some("stream_cache_mb:2".into())).expect("set");
        assert_eq!(set.stream_cache_bytes, 2 << 20);
    }
}
