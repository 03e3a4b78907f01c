//! The importing side: one connection and one mapped revocation table per
//! exporting process, and the imports made from it.

use super::{gran_of, io_err, IpcHandle, GONE, OK, OP_GET, OP_TABLE, REVOKED, TABLE_BYTES};
use crate::error::{Bytes, MemoryError};
use crate::os::PageKind;
use crate::vmm::physical::SEALS_REQUIRED;
use crate::vmm::{Access, MemoryContext, PhysicalMemory, VirtualRange};
use rustix::fd::OwnedFd;
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use std::collections::HashMap;
use std::io::{IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

struct ImportedInner {
    range: VirtualRange,
    handle: PhysicalMemory,
}

/// Memory imported from another process, mapped read-write in the
/// importer's context. Clones share the mapping; it is unmapped when the
/// last clone (and the importer's cache entry) is gone.
#[derive(Clone)]
pub struct ImportedMemory {
    inner: Arc<ImportedInner>,
}

impl std::fmt::Debug for ImportedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedMemory")
            .field("ptr", &self.ptr())
            .field("size", &self.size())
            .finish()
    }
}

impl ImportedMemory {
    /// The first byte of the mapping.
    pub fn ptr(&self) -> *mut u8 {
        self.inner.range.ptr()
    }
    /// Bytes mapped: the exported handle's size.
    pub fn size(&self) -> usize {
        self.inner.handle.size()
    }
    /// The imported handle, to map again elsewhere in this context.
    pub fn handle(&self) -> &PhysicalMemory {
        &self.inner.handle
    }
}

struct Peer {
    conn: UnixStream,
    table: *const AtomicU64,
    imports: HashMap<u64, ImportedMemory>,
}

// SAFETY: the table pointer is a read-only shared mapping of atomics owned by
// the peer; the rest is Send.
unsafe impl Send for Peer {}

impl Peer {
    fn state(&self, id: u64) -> u64 {
        if id as usize >= super::MAX_EXPORTS {
            return GONE;
        }
        // SAFETY: id < MAX_EXPORTS; the mapping of TABLE_BYTES lives as long
        // as the peer.
        unsafe { (*self.table.add(id as usize)).load(Ordering::Acquire) }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // SAFETY: the table mapping made in `connect`; nothing uses it past drop.
        let _ = unsafe { rustix::mm::munmap(self.table as *mut _, TABLE_BYTES) };
    }
}

/// Imports memory other processes export, into one memory context (whose
/// quota the mappings count against).
pub struct IpcImporter {
    ctx: MemoryContext,
    peers: HashMap<(u32, PathBuf), Peer>,
}

impl std::fmt::Debug for IpcImporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcImporter")
            .field("context", &self.ctx.id())
            .field("exporters", &self.peers.len())
            .finish()
    }
}

fn import_err(h: &IpcHandle, problem: String, hint: &'static str) -> MemoryError {
    MemoryError::Import {
        exporter: h.exporter,
        export: h.id,
        problem,
        hint,
    }
}

/// Sends a request and receives the reply words and the fd attached, if any.
fn ask(conn: &mut UnixStream, op: u64, id: u64) -> std::io::Result<([u64; 3], Option<OwnedFd>)> {
    let mut req = [0u8; 16];
    req[..8].copy_from_slice(&op.to_le_bytes());
    req[8..].copy_from_slice(&id.to_le_bytes());
    conn.write_all(&req)?;
    let mut msg = [0u8; 24];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut got = 0;
    let mut fd = None;
    while got < msg.len() {
        let r = rustix::net::recvmsg(
            &*conn,
            &mut [IoSliceMut::new(&mut msg[got..])],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        if r.bytes == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        got += r.bytes;
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = m {
                for f in fds {
                    fd.get_or_insert(f);
                }
            }
        }
    }
    let word = |i: usize| u64::from_le_bytes(msg[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    Ok(([word(0), word(1), word(2)], fd))
}

/// Checks that `fd` is sealed against shrinking and growing and holds `size`
/// bytes, the handle's size.
pub(crate) fn check_shared_fd(fd: &OwnedFd, size: usize, h: &IpcHandle) -> Result<(), MemoryError> {
    let seals = rustix::fs::fcntl_get_seals(fd).map_err(|e| {
        import_err(
            h,
            format!("the fd cannot be sealed ({e}): it is not a memfd"),
            "export memory with IpcExporter::export, which shares sealed memfds only",
        )
    })?;
    if !seals.contains(SEALS_REQUIRED) {
        return Err(import_err(
            h,
            format!("the memfd is not sealed against shrinking and growing (seals {seals:?})"),
            "the exporter could shrink it and fault this process: export a hetero PhysicalMemory",
        ));
    }
    let st = rustix::fs::fstat(fd).map_err(|e| io_err("fstat of an imported fd", e))?;
    if st.st_size as u64 != size as u64 || size != h.size {
        return Err(import_err(
            h,
            format!(
                "the memfd holds {} and the exporter said {}, the handle {}",
                Bytes(st.st_size as usize),
                Bytes(size),
                Bytes(h.size)
            ),
            "the handle does not name this memory: ask the exporter for a fresh one",
        ));
    }
    Ok(())
}

impl IpcImporter {
    /// An importer whose mappings belong to `ctx`.
    pub fn new(ctx: &MemoryContext) -> Self {
        IpcImporter {
            ctx: ctx.clone(),
            peers: HashMap::new(),
        }
    }

    /// Exporting processes this importer is connected to.
    pub fn exporters(&self) -> usize {
        self.peers.len()
    }

    fn connect(&mut self, h: &IpcHandle) -> Result<&mut Peer, MemoryError> {
        let key = (h.exporter, h.path.clone());
        if !self.peers.contains_key(&key) {
            let mut conn = UnixStream::connect(&h.path).map_err(|e| {
                import_err(
                    h,
                    format!("cannot connect to {} ({e})", h.path.display()),
                    "the exporter must be running and serving that socket",
                )
            })?;
            let cred = rustix::net::sockopt::socket_peercred(&conn)
                .map_err(|e| io_err("SO_PEERCRED on the export socket", e))?;
            if cred.pid.as_raw_nonzero().get() as u32 != h.exporter {
                return Err(import_err(
                    h,
                    format!(
                        "the socket is served by process {}, not the exporter",
                        cred.pid.as_raw_nonzero()
                    ),
                    "the handle is stale or forged: ask the exporter for a fresh one",
                ));
            }
            let ([status, size, _], fd) = ask(&mut conn, OP_TABLE, 0)
                .map_err(|e| io_err("asking for the revocation table", e))?;
            let fd = match (status, fd) {
                (OK, Some(fd)) if size as usize == TABLE_BYTES => fd,
                _ => {
                    return Err(import_err(
                        h,
                        "the exporter sent no revocation table".into(),
                        "the socket is not a hetero exporter",
                    ))
                }
            };
            use rustix::mm::{MapFlags, ProtFlags};
            // SAFETY: a fresh read-only shared mapping of the table memfd.
            let table = unsafe {
                rustix::mm::mmap(
                    std::ptr::null_mut(),
                    TABLE_BYTES,
                    ProtFlags::READ,
                    MapFlags::SHARED,
                    &fd,
                    0,
                )
            }
            .map_err(|e| io_err("mmap of the revocation table", e))?;
            self.peers.insert(
                key.clone(),
                Peer {
                    conn,
                    table: table.cast(),
                    imports: HashMap::new(),
                },
            );
        }
        Ok(self.peers.get_mut(&key).expect("inserted above"))
    }

    /// Imports the memory `h` names: from the cache when this importer has it
    /// already (no message), else by asking the exporter for the memfd.
    pub fn import(&mut self, h: &IpcHandle) -> Result<ImportedMemory, MemoryError> {
        // The cached path: one lookup and one atomic load.
        if let Some(peer) = self.peers.get_mut(&(h.exporter, h.path.clone())) {
            if let Some(m) = peer.imports.get(&h.id) {
                if peer.state(h.id) == GONE {
                    peer.imports.remove(&h.id);
                    return Err(MemoryError::Revoked {
                        exporter: h.exporter,
                        export: h.id,
                    });
                }
                return Ok(m.clone());
            }
        }
        let ctx = self.ctx.clone();
        let peer = self.connect(h)?;
        if peer.state(h.id) == GONE {
            return Err(MemoryError::Revoked {
                exporter: h.exporter,
                export: h.id,
            });
        }
        let ([status, size, gran], fd) =
            ask(&mut peer.conn, OP_GET, h.id).map_err(|e| io_err("asking for an export", e))?;
        let fd = match (status, fd) {
            (OK, Some(fd)) => fd,
            (REVOKED, _) => {
                return Err(MemoryError::Revoked {
                    exporter: h.exporter,
                    export: h.id,
                })
            }
            (s, _) => {
                return Err(import_err(
                    h,
                    format!("the exporter answered status {s} (2: no such export)"),
                    "the handle names no export of that process",
                ))
            }
        };
        let granularity = gran_of(gran).ok_or_else(|| {
            import_err(
                h,
                format!("granularity code {gran}"),
                "exporter and importer differ in version",
            )
        })?;
        check_shared_fd(&fd, size as usize, h)?;
        let handle =
            PhysicalMemory::from_shared(fd, size as usize, granularity, PageKind::Normal, ctx.id());
        let mut range = ctx.reserve(handle.size(), granularity)?;
        range.map(0, &handle, 0, handle.size(), Access::ReadWrite)?;
        let m = ImportedMemory {
            inner: Arc::new(ImportedInner { range, handle }),
        };
        peer.imports.insert(h.id, m.clone());
        Ok(m)
    }

    /// Drops the cached import of `h` (mappings handed out stay valid).
    pub fn forget(&mut self, h: &IpcHandle) {
        if let Some(peer) = self.peers.get_mut(&(h.exporter, h.path.clone())) {
            peer.imports.remove(&h.id);
        }
    }
}
