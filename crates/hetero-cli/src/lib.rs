//! The `hetero` command line as a library, so tests drive the same code the binary
//! runs: the demo workload and the benchmarks. The binary (`main.rs`) only parses
//! arguments.

pub mod bench;
pub mod demo;
pub mod device;
pub mod info;
pub mod profile;
pub mod spin_pair;
