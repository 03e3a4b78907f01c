//! Contexts: several devices joined, so that buffers and events of one are
//! used on another. A context knows its topology (which pairs have a direct
//! path and over what link); peer copies (`api/stream/peer.rs`) go direct
//! where it has one and are staged through pinned host memory where not;
//! a stream waits on events of any device of its context.
//!
//! Invariants: a device joins at most one context, for its life; emulated
//! devices in virtual time share one clock (their models run together,
//! `backend/emu/group.rs`), so they join only contexts of such devices.

use crate::api::device::{Device, WeakDevice};
use crate::config::peer::PeerLink;
use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static NEXT_CONTEXT: AtomicU64 = AtomicU64::new(1);

/// Several devices used together: a buffer of one is copied to another with
/// [`Stream::copy_peer`](crate::Stream::copy_peer), and a stream waits on an
/// event recorded on any device of the context (CUDA's cross-device
/// `cudaStreamWaitEvent`). Cloning gives another handle to the same context.
///
/// ```
/// use hetero::{Context, Device, DeviceConfig, EmuConfig, LinkPreset, PeerPath};
/// let emu = || DeviceConfig::default().emu(EmuConfig::new(LinkPreset::pcie4x16()));
/// let (a, b) = (Device::new(emu()).unwrap(), Device::new(emu()).unwrap());
/// let ctx = Context::new(&[a.clone(), b.clone()]).unwrap();
/// assert!(matches!(ctx.topology().path(a.id(), b.id()), Some(PeerPath::Link(_))));
/// let (src, dst) = (a.alloc::<u32>(256).unwrap(), b.alloc::<u32>(256).unwrap());
/// let s = a.create_stream().unwrap();
/// s.fill(&src, 7).unwrap();
/// s.copy_peer(&src, &dst).unwrap();
/// s.synchronize().unwrap();
/// assert_eq!(b.create_stream().unwrap().read_to_vec(&dst).unwrap(), vec![7; 256]);
/// ```
#[derive(Clone)]
pub struct Context {
    shared: Arc<ContextShared>,
}

pub(crate) struct ContextShared {
    id: u64,
    /// The devices, held weakly: each device holds its context.
    devices: Vec<(u64, WeakDevice)>,
    topology: Topology,
    /// The task layer's state: policy, models, the runtime (`api/task`).
    pub(crate) tasks: crate::api::task::ContextTasks,
}

impl ContextShared {
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn contains(&self, device: u64) -> bool {
        self.devices.iter().any(|(id, _)| *id == device)
    }

    /// Whether device `id` is in the context and still has a handle.
    pub(crate) fn is_alive(&self, id: u64) -> bool {
        self.devices.iter().any(|(d, w)| *d == id && w.is_alive())
    }

    pub(crate) fn device(&self, id: u64) -> Option<Device> {
        self.devices
            .iter()
            .find(|(d, _)| *d == id)
            .and_then(|(_, w)| w.upgrade())
    }

    pub(crate) fn topology(&self) -> &Topology {
        &self.topology
    }
}

/// Which device pairs of a context have a direct path, and over what.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    /// The devices, in the order the context was made with.
    pub devices: Vec<TopologyDevice>,
    /// One entry per unordered pair of devices.
    pub pairs: Vec<PeerPair>,
}

/// A device of a topology.
#[derive(Debug, Clone, PartialEq)]
pub struct TopologyDevice {
    /// [`Device::id`].
    pub id: u64,
    /// [`DeviceProperties::name`](crate::DeviceProperties::name).
    pub name: String,
    /// The backend (`host`, `emu`).
    pub backend: &'static str,
}

/// How bytes move between two devices of a context.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerPair {
    /// One device's id.
    pub a: u64,
    /// The other's.
    pub b: u64,
    /// The path between them.
    pub path: PeerPath,
}

/// The path a peer copy between two devices takes.
#[derive(Debug, Clone, PartialEq)]
pub enum PeerPath {
    /// A direct link (emulated devices): one DMA over the link's model.
    Link(PeerLink),
    /// Both devices' memory is host memory (host devices): one copy.
    SharedMemory,
    /// No direct path: the bytes go through pinned host memory, a copy out of
    /// the source's device and one into the destination's, ordered by events.
    Staged {
        /// Why there is no direct path.
        reason: &'static str,
    },
}

impl PeerPath {
    /// A short name (`link:NAME`, `shared-memory`, `staged`), as `hetero info` prints it.
    pub fn describe(&self) -> String {
        match self {
            PeerPath::Link(l) => format!("link:{}", l.name),
            PeerPath::SharedMemory => "shared-memory".into(),
            PeerPath::Staged { .. } => "staged".into(),
        }
    }
}

impl Topology {
    /// The path between devices `a` and `b` (either order); `None` if either is
    /// not in the context or they are the same device.
    pub fn path(&self, a: u64, b: u64) -> Option<&PeerPath> {
        self.pairs
            .iter()
            .find(|p| (p.a, p.b) == (a, b) || (p.a, p.b) == (b, a))
            .map(|p| &p.path)
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("id", &self.shared.id)
            .field("topology", &self.shared.topology)
            .finish()
    }
}

impl Context {
    /// Joins `devices` (any mix of host, emulated and Vulkan devices; each in
    /// no other context) into one context. Pairs of emulated devices get a direct
    /// peer link, [`PeerLink::pcie4_switch`]; host devices share memory; other
    /// pairs are staged through pinned host memory. See
    /// [`Context::with_peer_link`] to choose the link.
    pub fn new(devices: &[Device]) -> Result<Context> {
        Self::with_peer_link(devices, Some(PeerLink::pcie4_switch()))
    }

    /// As [`Context::new`], with `peer_link` between every pair of emulated
    /// devices (`None`: no direct path, every copy between them is staged).
    ///
    /// Emulated devices in virtual time share one clock from here on: their
    /// models run together whenever any of them is waited on, so the trace of
    /// a run stays deterministic. They join only contexts whose devices are
    /// all emulated in virtual time (a host device's work does not run in
    /// virtual time). Vulkan devices join too: their copies to and from other
    /// devices are staged through the host.
    pub fn with_peer_link(devices: &[Device], peer_link: Option<PeerLink>) -> Result<Context> {
        const OP: &str = "Context::new";
        if devices.is_empty() {
            return Err(Error::InvalidArgument(
                "Context::new: no devices; pass the devices to join (at least one)".into(),
            ));
        }
        if let Some(Err(e)) = peer_link.as_ref().map(PeerLink::validate) {
            return Err(Error::InvalidArgument(format!(
                "Context::with_peer_link: {e}"
            )));
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].iter().any(|e| e.id() == d.id()) {
                return Err(Error::DeviceContext {
                    op: OP,
                    detail: format!("device {} is listed twice; list each device once", d.id()),
                });
            }
            if let Some(c) = d.context() {
                return Err(Error::DeviceContext {
                    op: OP,
                    detail: format!(
                        "device {} is in context {} already; a device joins one context for its \
                         life: make the new context with that context's devices",
                        d.id(),
                        c.id()
                    ),
                });
            }
        }
        let virt = devices.iter().filter(|d| d.is_virtual_time()).count();
        if virt != 0 && virt != devices.len() {
            return Err(Error::DeviceContext {
                op: OP,
                detail: "emulated devices in virtual time run only when waited on, on a clock of \
                         their own, so they join only contexts of such devices; make the \
                         emulated devices with time=real (EmuConfig::time(TimeMode::Real)) to \
                         use them beside host devices"
                    .into(),
            });
        }
        let topology = topology_of(devices, peer_link.as_ref());
        let emu: Vec<(u64, &dyn crate::backend::Backend)> = devices
            .iter()
            .filter(|d| d.properties().backend == "emu")
            .map(|d| (d.id(), d.backend()))
            .collect();
        if emu.len() > 1 {
            let links = topology
                .pairs
                .iter()
                .filter_map(|p| match &p.path {
                    PeerPath::Link(l) => Some((p.a, p.b, l.clone())),
                    _ => None,
                })
                .collect();
            crate::backend::emu::join(&emu, links)?;
        }
        let shared = Arc::new(ContextShared {
            id: NEXT_CONTEXT.fetch_add(1, Ordering::Relaxed),
            devices: devices.iter().map(|d| (d.id(), d.downgrade())).collect(),
            topology,
            tasks: Default::default(),
        });
        for d in devices {
            // Checked above; a race with another context for the same device
            // loses here.
            if !d.join_context(&shared) {
                return Err(Error::DeviceContext {
                    op: OP,
                    detail: format!("device {} joined another context meanwhile", d.id()),
                });
            }
        }
        Ok(Context { shared })
    }

    pub(crate) fn from_shared(shared: Arc<ContextShared>) -> Self {
        Context { shared }
    }

    pub(crate) fn shared(&self) -> &Arc<ContextShared> {
        &self.shared
    }

    /// The context's id (unique in the process).
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// The context's devices that are still alive, in the order it was made with.
    pub fn devices(&self) -> Vec<Device> {
        self.shared
            .devices
            .iter()
            .filter_map(|(_, w)| w.upgrade())
            .collect()
    }

    /// Which pairs have a direct path, and over what.
    pub fn topology(&self) -> &Topology {
        &self.shared.topology
    }
}

fn topology_of(devices: &[Device], peer_link: Option<&PeerLink>) -> Topology {
    let list = devices
        .iter()
        .map(|d| TopologyDevice {
            id: d.id(),
            name: d.properties().name.clone(),
            backend: d.properties().backend,
        })
        .collect::<Vec<_>>();
    let mut pairs = Vec::new();
    for (i, a) in list.iter().enumerate() {
        for b in &list[i + 1..] {
            let path = match (a.backend, b.backend, peer_link) {
                ("host", "host", _) => PeerPath::SharedMemory,
                ("emu", "emu", Some(l)) => PeerPath::Link(l.clone()),
                ("emu", "emu", None) => PeerPath::Staged {
                    reason: "the context was made without a peer link",
                },
                ("vulkan", "vulkan", _) => PeerPath::Staged {
                    reason: "hetero does not join Vulkan devices into a device group \
                             (VK_KHR_device_group): their copies go through the host",
                },
                _ => PeerPath::Staged {
                    reason: "devices of different kinds share no link but the host's",
                },
            };
            pairs.push(PeerPair {
                a: a.id,
                b: b.id,
                path,
            });
        }
    }
    Topology {
        devices: list,
        pairs,
    }
}
