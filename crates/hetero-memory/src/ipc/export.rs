//! The exporting side: a Unix socket and the thread that serves it, the
//! export table and the revocation table importers map.

use super::{
    gran_code, io_err, IpcHandle, BAD, GONE, LIVE, MAX_EXPORTS, OK, OP_GET, OP_TABLE, REVOKED,
    TABLE_BYTES, UNKNOWN,
};
use crate::error::MemoryError;
use crate::vmm::PhysicalMemory;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use std::collections::HashMap;
use std::io::{IoSlice, Read};
use std::mem::MaybeUninit;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

struct Table {
    fd: OwnedFd,
    ptr: *mut AtomicU64,
}

// SAFETY: the table is a shared mapping of atomics; every access is atomic.
unsafe impl Send for Table {}
// SAFETY: as above.
unsafe impl Sync for Table {}

impl Table {
    fn new() -> Result<Self, MemoryError> {
        use rustix::fs::{MemfdFlags, SealFlags};
        let fd = rustix::fs::memfd_create(
            c"hetero-ipc-revocations",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| io_err("memfd_create of the revocation table", e))?;
        rustix::fs::ftruncate(&fd, TABLE_BYTES as u64)
            .map_err(|e| io_err("ftruncate of the revocation table", e))?;
        use rustix::mm::{MapFlags, ProtFlags};
        // SAFETY: a fresh shared mapping of the table's memfd aliases nothing.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                TABLE_BYTES,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(|e| io_err("mmap of the revocation table", e))?;
        // Only this mapping may write: importers can map it read-only.
        let seals = SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE | SealFlags::SEAL;
        if let Err(e) = rustix::fs::fcntl_add_seals(&fd, seals) {
            tracing::debug!(error = %e, "F_SEAL_FUTURE_WRITE refused; sealing size only");
            rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
                .map_err(|e| io_err("sealing the revocation table", e))?;
        }
        Ok(Table {
            fd,
            ptr: ptr.cast(),
        })
    }

    fn set(&self, id: u64, state: u64) {
        // SAFETY: id < MAX_EXPORTS (checked by callers); the mapping holds
        // MAX_EXPORTS aligned u64 words and lives as long as `self`.
        unsafe { (*self.ptr.add(id as usize)).store(state, Ordering::Release) };
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, used by nothing past drop.
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), TABLE_BYTES) };
    }
}

struct Inner {
    exports: Mutex<HashMap<u64, PhysicalMemory>>,
    table: Table,
    next: AtomicU64,
    shutdown: AtomicBool,
}

/// Serves this process's exports on a Unix socket. Dropping it stops the
/// server and removes the socket; memory already imported stays mapped in
/// the importers.
pub struct IpcExporter {
    inner: Arc<Inner>,
    path: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for IpcExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcExporter")
            .field("path", &self.path)
            .finish()
    }
}

impl IpcExporter {
    /// Binds a socket at `path` (which must not exist) and starts serving.
    pub fn bind(path: impl AsRef<Path>) -> Result<Self, MemoryError> {
        let path = path.as_ref().to_path_buf();
        let listener = UnixListener::bind(&path).map_err(|e| MemoryError::Os {
            what: format!("binding the export socket {}", path.display()),
            source: e,
            hint: "pick a path that does not exist in a writable directory",
        })?;
        let inner = Arc::new(Inner {
            exports: Mutex::new(HashMap::new()),
            table: Table::new()?,
            next: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
        });
        let served = inner.clone();
        let thread = std::thread::Builder::new()
            .name("hetero-ipc-export".into())
            .spawn(move || serve(listener, served))
            .map_err(|e| io_err("spawning the export thread", e))?;
        Ok(IpcExporter {
            inner,
            path,
            thread: Some(thread),
        })
    }

    /// The socket importers connect to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Exports `handle`: importers that get the returned name may map it
    /// until it is revoked.
    /// A private handle cannot be exported ([`MemoryError::Private`]).
    pub fn export(&self, handle: &PhysicalMemory) -> Result<IpcHandle, MemoryError> {
        handle.fd()?;
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        if id as usize >= MAX_EXPORTS {
            return Err(MemoryError::InvalidRequest {
                what: format!("export number {id} of this exporter"),
                hint: "an exporter serves at most 8192 exports over its life: bind another",
            });
        }
        self.lock().insert(id, handle.clone());
        self.inner.table.set(id, LIVE);
        Ok(IpcHandle {
            exporter: std::process::id(),
            path: self.path.clone(),
            id,
            size: handle.size(),
            granularity: handle.granularity(),
        })
    }

    /// Revokes an export: from now on importing it fails with
    /// [`MemoryError::Revoked`] in every process, cached or not.
    pub fn revoke(&self, handle: &IpcHandle) -> Result<(), MemoryError> {
        if handle.path != self.path || self.lock().remove(&handle.id).is_none() {
            return Err(MemoryError::InvalidRequest {
                what: format!("revoke of {handle}"),
                hint: "revoke only live exports of this exporter",
            });
        }
        self.inner.table.set(handle.id, GONE);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, PhysicalMemory>> {
        self.inner.exports.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for IpcExporter {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::Release);
        // Wake the accept loop so it sees the flag.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(listener: UnixListener, inner: Arc<Inner>) {
    for conn in listener.incoming() {
        if inner.shutdown.load(Ordering::Acquire) {
            return;
        }
        let Ok(conn) = conn else { continue };
        let inner = inner.clone();
        // One thread per importing process; it ends when the importer closes.
        let _ = std::thread::Builder::new()
            .name("hetero-ipc-conn".into())
            .spawn(move || {
                if let Err(e) = answer(conn, &inner) {
                    tracing::debug!(error = %e, "an importer's connection ended");
                }
            });
    }
}

fn answer(mut conn: UnixStream, inner: &Inner) -> std::io::Result<()> {
    let mut req = [0u8; 16];
    loop {
        if let Err(e) = conn.read_exact(&mut req) {
            return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Ok(())
            } else {
                Err(e)
            };
        }
        let op = u64::from_le_bytes(req[..8].try_into().expect("8 bytes"));
        let id = u64::from_le_bytes(req[8..].try_into().expect("8 bytes"));
        match op {
            OP_TABLE => reply(
                &conn,
                OK,
                TABLE_BYTES as u64,
                0,
                Some(inner.table.fd.as_fd()),
            )?,
            OP_GET => {
                let h = inner
                    .exports
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&id)
                    .cloned();
                match h {
                    Some(h) => reply(
                        &conn,
                        OK,
                        h.size() as u64,
                        gran_code(h.granularity()),
                        Some(h.fd().expect("only shareable handles are exported")),
                    )?,
                    None if id < inner.next.load(Ordering::Relaxed) => {
                        reply(&conn, REVOKED, 0, 0, None)?
                    }
                    None => reply(&conn, UNKNOWN, 0, 0, None)?,
                }
            }
            _ => reply(&conn, BAD, 0, 0, None)?,
        }
    }
}

fn reply(
    conn: &UnixStream,
    status: u64,
    size: u64,
    gran: u64,
    fd: Option<BorrowedFd<'_>>,
) -> std::io::Result<()> {
    let mut msg = [0u8; 24];
    msg[..8].copy_from_slice(&status.to_le_bytes());
    msg[8..16].copy_from_slice(&size.to_le_bytes());
    msg[16..].copy_from_slice(&gran.to_le_bytes());
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(fd) = fd {
        fds = [fd];
        control.push(SendAncillaryMessage::ScmRights(&fds));
    }
    let sent = rustix::net::sendmsg(
        conn,
        &[IoSlice::new(&msg)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent != msg.len() {
        return Err(std::io::Error::other("short reply"));
    }
    Ok(())
}
