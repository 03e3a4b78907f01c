//! The cluster: this process's rank in an MPI communicator, its device, and
//! what every rank's device is (exchanged once, at creation).
//!
//! MPI is initialised with `MPI_THREAD_MULTIPLE`: the device's engines poll
//! transfers (`MPI_Test`) from several threads at once, and the host thread
//! may start collectives meanwhile. Transfers and event signals use
//! communicators of their own (duplicates of the world), so they never match
//! a message the application sends on the world communicator itself.

use crate::{ClusterConfig, MpiError, Result};
use hetero::{Device, Stream};
use mpi::ffi;
use mpi::topology::Communicator;
use mpi::traits::CommunicatorCollectives;
use std::sync::Arc;

/// The largest tag every MPI allows (the standard's minimum for MPI_TAG_UB).
pub const MAX_TAG: i32 = 32_767;

/// One rank's device, as that rank described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    /// The rank in the cluster's communicator.
    pub rank: i32,
    /// The node it runs on (`MPI_Get_processor_name`).
    pub host: String,
    /// The backend of its device (`host`, `emu`).
    pub backend: String,
    /// Its device's name.
    pub device: String,
    /// Its device's compute units.
    pub compute_units: usize,
    /// Whether its device memory is host memory (sent without staging).
    pub host_visible_memory: bool,
    /// Whether its device runs in virtual time.
    pub virtual_time: bool,
}

const DESC: usize = 256;

impl RankInfo {
    fn encode(&self) -> [u8; DESC] {
        let mut out = [0u8; DESC];
        let put = |out: &mut [u8; DESC], at: usize, cap: usize, s: &str| {
            let b = s.as_bytes();
            let n = b.len().min(cap - 1);
            out[at] = n as u8;
            out[at + 1..at + 1 + n].copy_from_slice(&b[..n]);
        };
        put(&mut out, 0, 64, &self.host);
        put(&mut out, 64, 16, &self.backend);
        put(&mut out, 80, 160, &self.device);
        out[240..248].copy_from_slice(&(self.compute_units as u64).to_le_bytes());
        out[248] = u8::from(self.host_visible_memory);
        out[249] = u8::from(self.virtual_time);
        out
    }

    fn decode(rank: i32, d: &[u8]) -> RankInfo {
        let get = |at: usize| {
            let n = d[at] as usize;
            String::from_utf8_lossy(&d[at + 1..at + 1 + n]).into_owned()
        };
        let mut cu = [0u8; 8];
        cu.copy_from_slice(&d[240..248]);
        RankInfo {
            rank,
            host: get(0),
            backend: get(64),
            device: get(80),
            compute_units: u64::from_le_bytes(cu) as usize,
            host_visible_memory: d[248] != 0,
            virtual_time: d[249] != 0,
        }
    }
}

/// A raw communicator handle. Open MPI's handles are pointers.
#[derive(Clone, Copy)]
pub(crate) struct Comm(pub(crate) ffi::MPI_Comm);

// SAFETY: with MPI_THREAD_MULTIPLE (checked at `Cluster::init`) any thread may
// use a communicator handle; the handle itself is never written after creation.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

/// What transfers share: the communicators, this rank, the configuration.
pub(crate) struct Inner {
    pub(crate) data: Comm,
    pub(crate) events: Comm,
    pub(crate) stamps: Comm,
    pub(crate) rank: i32,
    pub(crate) size: i32,
    pub(crate) config: ClusterConfig,
}

impl Inner {
    pub(crate) fn check_peer(&self, peer: i32, tag: i32) -> Result<()> {
        if peer < 0 || peer >= self.size {
            return Err(MpiError::InvalidRank {
                peer,
                size: self.size,
            });
        }
        if !(0..=MAX_TAG).contains(&tag) {
            return Err(MpiError::InvalidTag { tag, max: MAX_TAG });
        }
        Ok(())
    }
}

/// MPI's message for an error code.
pub(crate) fn error_string(code: i32) -> String {
    let mut buf = vec![0 as std::os::raw::c_char; 512];
    let mut len = 0;
    // SAFETY: the buffer has MPI_MAX_ERROR_STRING (256 in Open MPI) bytes or more.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if rc != 0 {
        return format!("error code {code}");
    }
    let bytes: Vec<u8> = buf[..len.max(0) as usize]
        .iter()
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Ranks over MPI, each with a hetero device: remote copies and events across
/// ranks as stream operations (see the crate docs).
pub struct Cluster {
    pub(crate) inner: Arc<Inner>,
    pub(crate) device: Device,
    ranks: Vec<RankInfo>,
    /// Where exported events wait to be signalled (one async op each).
    pub(crate) signal: Stream,
    world: mpi::topology::SimpleCommunicator,
    /// Finalizes MPI when dropped: the last field.
    _universe: Option<mpi::environment::Universe>,
}

impl Cluster {
    /// Initialises MPI (`MPI_THREAD_MULTIPLE`), and exchanges with every rank
    /// of the world communicator a description of its device. Collective:
    /// every rank calls it. Dropping the cluster waits for the device's work,
    /// then finalizes MPI.
    pub fn init(device: &Device, config: ClusterConfig) -> Result<Cluster> {
        config.validate()?;
        let (universe, level) = mpi::initialize_with_threading(mpi::Threading::Multiple)
            .ok_or_else(|| {
                MpiError::Init(
                    "MPI was initialised already in this process; create the cluster once".into(),
                )
            })?;
        if level != mpi::Threading::Multiple {
            return Err(MpiError::ThreadLevel {
                provided: format!("{level:?}"),
            });
        }
        let world = universe.world();
        let dup = |what: &str| -> Result<Comm> {
            let mut c = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
            // SAFETY: MPI is initialised; `c` receives the new handle. The
            // duplicate is never freed: MPI_Finalize releases it.
            let rc = unsafe {
                use mpi::raw::AsRaw;
                ffi::MPI_Comm_dup(world.as_raw(), c.as_mut_ptr())
            };
            if rc != 0 {
                return Err(MpiError::Init(format!(
                    "MPI_Comm_dup for {what}: {}",
                    error_string(rc)
                )));
            }
            // SAFETY: MPI_Comm_dup succeeded, so it wrote the handle.
            let c = unsafe { c.assume_init() };
            // Errors come back as codes (a truncated receive is a typed error),
            // not as an abort of the whole job.
            // SAFETY: `c` is a valid communicator; the handler is predefined.
            unsafe { ffi::MPI_Comm_set_errhandler(c, ffi::RSMPI_ERRORS_RETURN) };
            Ok(Comm(c))
        };
        let inner = Arc::new(Inner {
            data: dup("transfers")?,
            events: dup("events")?,
            stamps: dup("virtual-time stamps")?,
            rank: world.rank(),
            size: world.size(),
            config,
        });
        let props = device.properties();
        let probe = device.alloc::<u8>(1)?;
        let me = RankInfo {
            rank: inner.rank,
            host: mpi::environment::processor_name().unwrap_or_default(),
            backend: props.backend.to_string(),
            device: props.name.clone(),
            compute_units: props.compute_units,
            host_visible_memory: probe.is_host_visible(),
            virtual_time: device.trace_hash().is_some(),
        };
        drop(probe);
        let mine = me.encode();
        let mut all = vec![0u8; DESC * inner.size as usize];
        world.all_gather_into(&mine[..], &mut all[..]);
        let ranks = all
            .chunks(DESC)
            .enumerate()
            .map(|(r, d)| RankInfo::decode(r as i32, d))
            .collect();
        let signal = device.create_stream()?;
        signal.set_name("mpi-event-signals");
        Ok(Cluster {
            inner,
            device: device.clone(),
            ranks,
            signal,
            world,
            _universe: Some(universe),
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> i32 {
        self.inner.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> i32 {
        self.inner.size
    }

    /// Every rank's device, indexed by rank.
    pub fn ranks(&self) -> &[RankInfo] {
        &self.ranks
    }

    /// This rank's device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The world communicator (for the application's own MPI calls, which
    /// never match the cluster's transfers).
    pub fn world(&self) -> &mpi::topology::SimpleCommunicator {
        &self.world
    }

    /// Blocks until every rank called it.
    pub fn barrier(&self) {
        self.world.barrier();
    }

    /// How long transfers wait for a peer.
    pub fn config(&self) -> &ClusterConfig {
        &self.inner.config
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Transfers still queued hold buffers MPI reads or writes: let them end
        // (each fails after the timeout if its peer is gone) before MPI_Finalize.
        let _ = self.device.synchronize();
    }
}
