//! The one error type of the public API. Every message says what was asked, what was
//! there, and what to do about it.

use std::sync::Arc;

/// Errors returned by hetero's public API.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A size or length did not match what the operation needs.
    #[error("size mismatch in {op}: {detail}")]
    SizeMismatch { op: &'static str, detail: String },

    /// A range reaches past the end of a buffer.
    #[error("{op}: range {offset}..{end} (elements) is out of bounds for a buffer of {len} elements; pass a range inside the buffer")]
    OutOfBounds {
        op: &'static str,
        offset: usize,
        end: usize,
        len: usize,
    },

    /// A buffer belongs to another device than the stream it was used on.
    #[error("{op}: buffer belongs to device {buffer_device} but the stream is on device {stream_device}; copy it to this device first")]
    WrongDevice {
        op: &'static str,
        buffer_device: u64,
        stream_device: u64,
    },

    /// The device was lost (a driver crash, hang or reset): its pending work
    /// did not complete and it takes no more.
    #[error("device {device} was lost ({reason}); work that had not completed did not run: drop the Device and create a new one")]
    DeviceLost { device: u64, reason: String },

    /// Devices used together that are not in one context, or a context that
    /// cannot be made as asked.
    #[error("{op}: {detail}")]
    DeviceContext { op: &'static str, detail: String },

    /// The stream was destroyed; no more work can be submitted to it.
    #[error("stream {stream} was destroyed; create a new stream with Device::create_stream")]
    StreamDestroyed { stream: u64 },

    /// An event was used before it was recorded on a stream.
    #[error("{op}: the event was never recorded; call Stream::record(&mut event) first")]
    EventNotRecorded { op: &'static str },

    /// An event of a device outside the stream's context was used.
    #[error(
        "{op}: the event belongs to device {event_device}, the stream to device {stream_device}, \
         and they are in no context together; join them with hetero::Context::new to wait \
         across devices"
    )]
    EventWrongDevice {
        op: &'static str,
        event_device: u64,
        stream_device: u64,
    },

    /// Elapsed time was asked of events that carry no timestamp.
    #[error("elapsed_ms: {detail}")]
    EventTiming { detail: String },

    /// A kernel launch named an empty grid.
    #[error(
        "launch of kernel '{kernel}': the grid is empty (0 blocks); launch at least one block"
    )]
    EmptyGrid { kernel: &'static str },

    /// A kernel launch passed too many buffer arguments.
    #[error("launch of kernel '{kernel}': {count} buffer arguments, at most {max} are supported")]
    TooManyArgs {
        kernel: &'static str,
        count: usize,
        max: usize,
    },

    /// The same buffer was passed so that one operation would read and write it at once.
    #[error(
        "{op}: the same buffer is both read and written by one operation; use a separate buffer"
    )]
    Aliasing { op: &'static str },

    /// A value is outside the allowed range (priority, count, …).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// Work on a stream failed: a kernel or host callback panicked, or it waited on
    /// work that failed. Later work on that stream does not run. (`stream` numbers
    /// the streams of one device: `device` says which.)
    #[error("stream {stream} of device {device} failed at operation {value}: {message}")]
    StreamFault {
        device: u64,
        stream: u64,
        value: u64,
        message: Arc<str>,
    },

    /// A host write to a pinned buffer that a graph holds: a `Graph`, its
    /// `GraphExec` and their `Bindings` keep every buffer they name while they
    /// exist, so no synchronize frees it.
    #[error(
        "{op}: {holds} graph object(s) (Graph, GraphExec or Bindings) copy from or into this \
         pinned buffer and hold it while they exist, launched or not, so synchronizing cannot \
         free it; drop them first, or record those copies on a pinned slot \
         (Graph::pinned_slot) and bind this buffer at each launch (Bindings::bind_pinned), \
         then drop or rebind those bindings before writing it from the host"
    )]
    HeldByGraph { op: &'static str, holds: u32 },

    /// Host access to a pinned buffer that pending work still uses. Polling
    /// for it is fine: on a device in virtual time each refusal also lets the
    /// model make a step (as `Stream::query` does), so the work progresses.
    #[error("{op}: the buffer is still used by pending work ({detail}); synchronize the stream that uses it first")]
    BufferBusy {
        op: &'static str,
        detail: &'static str,
    },

    /// One access to managed memory (a kernel launch, a copy, a prefetch)
    /// covers more pages than the device can hold at once: nothing was
    /// submitted.
    #[error("{op}: its managed pages need {needed} bytes on device {device}, which holds at most {budget} bytes of managed pages (capacity {capacity} bytes, {pool} of them held by its pool); split the work over smaller ranges (Arg::managed_read_range / managed_write_range) or give the device more capacity")]
    ManagedWorkingSet {
        op: String,
        device: u64,
        needed: usize,
        budget: usize,
        capacity: usize,
        pool: usize,
    },

    /// Managed memory used wrongly, or where it is not available (the message
    /// says which and what to do).
    #[error("{op}: {detail}")]
    Managed { op: &'static str, detail: String },

    /// The device's memory could not satisfy an allocation (the message names the
    /// requested, reserved, allocated, free and largest free bytes), or the memory
    /// configuration is invalid.
    #[error("{0}")]
    Memory(#[source] Arc<hetero_memory::MemoryError>),

    /// A blocking call made from inside a kernel or host callback would wait for
    /// work that cannot run before the callback returns (its own stream, a stream
    /// behind it, or a full ring it alone could drain). Nothing was waited for.
    #[error("would deadlock: {0}")]
    WouldDeadlock(String),

    /// A graph, command buffer or stream capture was used wrongly: a cycle, a
    /// node of another graph, a buffer used outside the graph it belongs to, an
    /// unbound slot, a capture left unjoined, or an update that changes the
    /// graph's shape (re-instantiate for that).
    #[error("{op}: {detail}")]
    Graph { op: &'static str, detail: String },

    /// A 2-D region or pitched layout is wrong: empty, a pitch below its width,
    /// out of bounds, a pitch the device's alignment refuses, or two shapes.
    #[error("{op}: {problem}")]
    Region {
        op: &'static str,
        problem: RegionProblem,
    },

    /// A backend could not start (threads, OS resources).
    /// A kernel launched on a device it has no code for.
    #[error("kernel '{kernel}' has no code for device {device} (it has {has}): {hint}")]
    NoCodeForDevice {
        kernel: &'static str,
        device: String,
        has: &'static str,
        hint: &'static str,
    },
    #[error("device setup failed: {0}")]
    Setup(String),
}

impl Error {
    /// A graph's stand-in (a buffer allocated while recording it, or one of its
    /// slots) used where real memory is needed.
    pub(crate) fn stand_in(op: &'static str) -> Error {
        Error::Graph {
            op,
            detail: "this buffer belongs to a graph (allocated while recording it, or one of \
                     its slots): it has memory only inside that graph's launches; use it in \
                     operations recorded into that graph, or bind a real buffer to the slot"
                .into(),
        }
    }
}

impl From<hetero_memory::MemoryError> for Error {
    fn from(e: hetero_memory::MemoryError) -> Self {
        Error::Memory(Arc::new(e))
    }
}

/// Result type of the public API.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What is wrong with a 2-D region or layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionProblem {
    /// The rectangle has no elements.
    Empty { width: usize, height: usize },
    /// Rows would overlap: the pitch is smaller than the width.
    PitchBelowWidth { pitch: usize, width: usize },
    /// The last row ends past the buffer.
    OutOfBounds { end: usize, len: usize },
    /// A rectangle (x, y, width, height) reaches past its image (width, height).
    OutsideImage {
        rect: (usize, usize, usize, usize),
        image: (usize, usize),
    },
    /// The pitch is not a multiple of the alignment the device requires.
    Unaligned {
        pitch_bytes: usize,
        alignment: usize,
    },
    /// Source and destination rectangles differ in shape.
    ShapeMismatch {
        src: (usize, usize),
        dst: (usize, usize),
    },
}

impl std::fmt::Display for RegionProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegionProblem::Empty { width, height } => write!(
                f,
                "the rectangle is {width} x {height}: it has no elements; give it a width and a height of at least 1"
            ),
            RegionProblem::PitchBelowWidth { pitch, width } => write!(
                f,
                "pitch {pitch} is smaller than width {width} (elements): rows would overlap; use a pitch of at least the width"
            ),
            RegionProblem::OutOfBounds { end, len } => write!(
                f,
                "the last row ends at element {end}, past the buffer's {len} elements; shrink the rectangle or move it inside"
            ),
            RegionProblem::OutsideImage { rect, image } => write!(
                f,
                "the rectangle {} x {} at ({}, {}) reaches past the {} x {} image; keep x + width and y + height inside it",
                rect.2, rect.3, rect.0, rect.1, image.0, image.1
            ),
            RegionProblem::Unaligned { pitch_bytes, alignment } => write!(
                f,
                "a pitch of {pitch_bytes} bytes is not a multiple of the device's {alignment}-byte pitch alignment; use Device::alloc_pitched or round the pitch up"
            ),
            RegionProblem::ShapeMismatch { src, dst } => write!(
                f,
                "the source rectangle is {} x {}, the destination {} x {}; copy rectangles of one shape",
                src.0, src.1, dst.0, dst.1
            ),
        }
    }
}
