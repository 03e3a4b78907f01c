//! hetero across processes and nodes: ranks over MPI (Open MPI through the
//! `mpi` crate), each with its hetero device.
//!
//! With the cargo feature `mpi` (off by default, so that a build without an
//! MPI installation works) this crate gives a [`Cluster`] over the world
//! communicator that knows every rank's device ([`RankInfo`]), remote copies
//! as stream operations ([`Cluster::send`], [`Cluster::recv`] and their
//! pinned and range variants: non-blocking MPI started in stream order and
//! completed by the device's own engines, no progress thread), and events
//! across ranks ([`Cluster::send_event`], [`Cluster::wait_event`]). A failed
//! remote copy fails its stream with a typed [`MpiError`] naming the peer
//! (see [`Transfer::result`]); a peer that never answers is reported after
//! [`ClusterConfig::timeout`].
//!
//! Run programs that use it under `mpirun -np N` (as root add
//! `--allow-run-as-root`, on a machine with fewer cores than ranks
//! `--oversubscribe`).
//!
//! Invariants: every MPI call on a transfer is made by the one thread polling
//! its op (MPI_THREAD_MULTIPLE lets that thread change); a buffer MPI may
//! write is held by its op until the receive completed or was cancelled.

mod config;
mod error;

pub use config::{rank_device_config, ClusterConfig};
pub use error::{MpiError, Result};

#[cfg(feature = "mpi")]
mod cluster;
#[cfg(feature = "mpi")]
mod events;
#[cfg(feature = "mpi")]
pub mod stencil;
#[cfg(feature = "mpi")]
mod transfer;

#[cfg(feature = "mpi")]
pub use cluster::{Cluster, RankInfo, MAX_TAG};
/// The rsmpi crate this one builds on (for the application's own MPI calls).
#[cfg(feature = "mpi")]
pub use mpi;
#[cfg(feature = "mpi")]
pub use transfer::Transfer;
