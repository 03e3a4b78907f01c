//! Memory shared between processes: a process exports [`PhysicalMemory`]
//! handles through an [`IpcExporter`] (a Unix socket served by one thread);
//! another imports them with an [`IpcImporter`], which receives the memfd by
//! `SCM_RIGHTS` and maps it into a range of its own memory context.
//!
//! - An [`IpcHandle`] names an export (exporter pid, socket path, export id,
//!   size); it travels as text ([`IpcHandle`]'s `Display` / `FromStr`) over
//!   any channel.
//! - Imports are cached per exporting process: a second import of a handle is
//!   a table lookup and one atomic load, no message.
//! - That load reads the exporter's revocation table, a small sealed memfd
//!   every importer maps read-only on first contact: after
//!   [`IpcExporter::revoke`], importing the handle fails with
//!   [`MemoryError::Revoked`], cached or not (mappings already handed out stay
//!   valid: the memory lives while any process maps it).
//! - On import the memfd's seals are checked (`F_SEAL_SHRINK | F_SEAL_GROW`)
//!   and its size compared with the handle's: an exporter cannot shrink the
//!   memory under an importer and make it fault.
//!
//! Wire format (little-endian u64 words): request `[op, id]`, op 1 = the
//! revocation table, op 2 = export `id`; reply `[status, size, granularity]`
//! with the fd attached when status is 0.

mod export;
mod import;

pub use export::IpcExporter;
pub use import::{ImportedMemory, IpcImporter};

use crate::error::MemoryError;
use crate::vmm::Granularity;
#[cfg(doc)]
use crate::vmm::PhysicalMemory;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Exports one exporter can hold over its life (slots of its revocation table).
pub const MAX_EXPORTS: usize = 8192;
const TABLE_BYTES: usize = MAX_EXPORTS * 8;

const OP_TABLE: u64 = 1;
const OP_GET: u64 = 2;
const OK: u64 = 0;
const REVOKED: u64 = 1;
const UNKNOWN: u64 = 2;
const BAD: u64 = 3;

/// States of a revocation table entry.
const LIVE: u64 = 1;
const GONE: u64 = 2;

/// The name of one export: what an importer needs to import it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IpcHandle {
    /// Process id of the exporter.
    pub exporter: u32,
    /// The exporter's socket.
    pub path: PathBuf,
    pub id: u64,
    pub size: usize,
    pub granularity: Granularity,
}

fn gran_code(g: Granularity) -> u64 {
    match g {
        Granularity::Page4K => 0,
        Granularity::Huge2M => 1,
        Granularity::Huge1G => 2,
    }
}

fn gran_of(code: u64) -> Option<Granularity> {
    match code {
        0 => Some(Granularity::Page4K),
        1 => Some(Granularity::Huge2M),
        2 => Some(Granularity::Huge1G),
        _ => None,
    }
}

impl fmt::Display for IpcHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "hetero-ipc:{}:{}:{}:{}:{}",
            self.exporter,
            self.id,
            self.size,
            gran_code(self.granularity),
            self.path.display()
        )
    }
}

impl FromStr for IpcHandle {
    type Err = MemoryError;

    /// Parses what `Display` wrote.
    fn from_str(s: &str) -> Result<Self, MemoryError> {
        let bad = || MemoryError::InvalidRequest {
            what: format!("IPC handle {s:?}"),
            hint:
                "pass the text IpcHandle's Display wrote: hetero-ipc:PID:ID:SIZE:GRANULARITY:PATH",
        };
        let rest = s.strip_prefix("hetero-ipc:").ok_or_else(bad)?;
        let mut it = rest.splitn(5, ':');
        let mut num = || {
            it.next()
                .and_then(|x| x.parse::<u64>().ok())
                .ok_or_else(bad)
        };
        let exporter = u32::try_from(num()?).map_err(|_| bad())?;
        let id = num()?;
        let size = usize::try_from(num()?).map_err(|_| bad())?;
        let granularity = gran_of(num()?).ok_or_else(bad)?;
        let path = it.next().filter(|p| !p.is_empty()).ok_or_else(bad)?;
        Ok(IpcHandle {
            exporter,
            path: PathBuf::from(path),
            id,
            size,
            granularity,
        })
    }
}

fn io_err(what: impl Into<String>, e: impl Into<std::io::Error>) -> MemoryError {
    MemoryError::Os {
        what: what.into(),
        source: e.into(),
        hint: "the exporting process may have exited or closed its socket",
    }
}

#[cfg(test)]
mod tests;
