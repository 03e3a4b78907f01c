//! The errors of the MPI layer: each names the peer rank it concerns.

use std::time::Duration;

/// What went wrong with MPI or with a transfer between ranks.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MpiError {
    /// MPI could not be set up.
    #[error("MPI setup failed: {0}")]
    Init(String),
    /// The MPI library gives less thread support than remote copies need.
    #[error(
        "MPI provides thread level {provided}, remote copies need MPI_THREAD_MULTIPLE \
         (the device's engines call MPI_Test concurrently); use an MPI built with \
         thread support (Open MPI: the default since 4.0)"
    )]
    ThreadLevel {
        /// The level MPI_Init_thread provided.
        provided: String,
    },
    /// A peer rank outside the communicator.
    #[error("peer rank {peer} is not in the communicator of {size} ranks (use 0..{size})")]
    InvalidRank {
        /// The rank asked for.
        peer: i32,
        /// The communicator's size.
        size: i32,
    },
    /// A message tag outside what MPI allows.
    #[error("tag {tag} is outside 0..={max} (MPI_TAG_UB of this MPI)")]
    InvalidTag {
        /// The tag asked for.
        tag: i32,
        /// The largest tag allowed.
        max: i32,
    },
    /// A transfer larger than one MPI message of bytes can carry.
    #[error("{op} of {bytes} bytes with peer rank {peer}: one message carries at most 2^31-1 bytes; split it")]
    TooLarge {
        /// send or recv.
        op: &'static str,
        /// The peer rank.
        peer: i32,
        /// The size asked for.
        bytes: usize,
    },
    /// The sender and the receiver disagree on the size of a transfer.
    #[error(
        "recv from peer rank {peer} (tag {tag}): expected {expected} bytes, the peer sent \
         {}; post a receive of the size the peer sends",
        match .got { Some(n) => format!("{n}"), None => "more".to_string() }
    )]
    SizeMismatch {
        /// The peer rank.
        peer: i32,
        /// The message tag.
        tag: i32,
        /// The size of the receiving buffer.
        expected: usize,
        /// The size that arrived (`None`: more than `expected`, truncated).
        got: Option<usize>,
    },
    /// A peer that did not answer in time (dead, hung, or never posting the match).
    #[error(
        "{op} with peer rank {peer} (tag {tag}) not done after {waited:?}: the peer may have \
         died or never posts the matching operation; raise ClusterConfig::timeout if it is \
         only slow"
    )]
    PeerTimeout {
        /// send, recv or event wait.
        op: &'static str,
        /// The peer rank.
        peer: i32,
        /// The message tag.
        tag: i32,
        /// How long it waited.
        waited: Duration,
    },
    /// An event on a peer rank failed: the work before it faulted there.
    #[error("event from peer rank {peer} (tag {tag}) failed there: {message}")]
    RemoteEventFailed {
        /// The peer rank.
        peer: i32,
        /// The message tag.
        tag: i32,
        /// The peer's fault.
        message: String,
    },
    /// The operation never ran: its stream had failed before it.
    #[error(
        "remote operation with peer rank {peer} (tag {tag}) did not run: its stream failed earlier"
    )]
    NotRun {
        /// The peer rank.
        peer: i32,
        /// The message tag.
        tag: i32,
    },
    /// An MPI call returned an error.
    #[error("{call} with peer rank {peer} failed: {message} (MPI error {code})")]
    Call {
        /// The MPI function.
        call: &'static str,
        /// The peer rank.
        peer: i32,
        /// MPI's error code.
        code: i32,
        /// MPI's error string.
        message: String,
    },
    /// The device refused an operation.
    #[error(transparent)]
    Device(#[from] hetero::Error),
}

impl MpiError {
    /// The peer rank the error concerns, if any.
    pub fn peer(&self) -> Option<i32> {
        match self {
            MpiError::InvalidRank { peer, .. }
            | MpiError::TooLarge { peer, .. }
            | MpiError::SizeMismatch { peer, .. }
            | MpiError::PeerTimeout { peer, .. }
            | MpiError::RemoteEventFailed { peer, .. }
            | MpiError::NotRun { peer, .. }
            | MpiError::Call { peer, .. } => Some(*peer),
            _ => None,
        }
    }
}

/// Results of the MPI layer.
pub type Result<T> = std::result::Result<T, MpiError>;
