//! Two processes share memory: run with no argument, it exports 64 MiB, runs
//! itself again as the importer (`ipc_share import HANDLE`), which reads what
//! the exporter wrote and writes an answer back; then the exporter revokes the
//! export and shows that a stale handle no longer imports.
//!
//! `cargo run --release -p hetero-memory --example ipc_share`

use hetero_memory::ipc::{IpcExporter, IpcHandle, IpcImporter};
use hetero_memory::vmm::{Access, Granularity, MemoryContext};
use std::process::Command;

const SIZE: usize = 64 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("import") {
        let h: IpcHandle = args.get(2).ok_or("import wants a handle")?.parse()?;
        let ctx = MemoryContext::new("importer", SIZE);
        let mut imp = IpcImporter::new(&ctx);
        let t = std::time::Instant::now();
        let m = imp.import(&h)?;
        let first = t.elapsed();
        let t = std::time::Instant::now();
        imp.import(&h)?;
        let cached = t.elapsed();
        // SAFETY: the import maps SIZE bytes read-write.
        let mem = unsafe { std::slice::from_raw_parts_mut(m.ptr(), m.size()) };
        let text = std::str::from_utf8(&mem[..5])?.to_string();
        mem[SIZE - 6..].copy_from_slice(b"pong!\0");
        println!(
            "importer (pid {}): read {text:?}; first import {first:?}, cached {cached:?}",
            std::process::id()
        );
        return Ok(());
    }
    let ctx = MemoryContext::unlimited("exporter");
    let phys = ctx.create_physical(SIZE, Granularity::Huge2M)?;
    let mut range = ctx.reserve(SIZE, Granularity::Huge2M)?;
    range.map(0, &phys, 0, SIZE, Access::ReadWrite)?;
    // SAFETY: SIZE bytes mapped read-write.
    let mem = unsafe { std::slice::from_raw_parts_mut(range.ptr(), SIZE) };
    mem[..5].copy_from_slice(b"ping!");
    let path = std::env::temp_dir().join(format!("hetero-ipc-example-{}.sock", std::process::id()));
    let exporter = IpcExporter::bind(&path)?;
    let handle = exporter.export(&phys)?;
    let status = Command::new(std::env::current_exe()?)
        .args(["import", &handle.to_string()])
        .status()?;
    if !status.success() {
        return Err("the importer failed".into());
    }
    println!(
        "exporter (pid {}): the importer wrote {:?}",
        std::process::id(),
        std::str::from_utf8(&mem[SIZE - 6..SIZE - 1])?
    );
    exporter.revoke(&handle)?;
    match IpcImporter::new(&ctx).import(&handle) {
        Err(e) => println!("after revoke: {e}"),
        Ok(_) => return Err("a revoked handle imported".into()),
    }
    Ok(())
}
