//! The `hetero` command line as a library, so tests drive the same code the binary
//! runs: the demo workload and the benchmarks. The binary (`main.rs`) only parses
//! arguments. The benchmarks and their peers build with the `bench` feature
//! (on in workspace builds, see crates/bench-on), so the demo's build skips them.

#[cfg(feature = "bench")]
pub mod bench;
pub mod demo;
pub mod device;
pub mod info;
pub mod profile;
