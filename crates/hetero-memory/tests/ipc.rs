//! Memory shared between two processes: this test binary re-runs itself as
//! the importing process (`child_imports`, which does nothing unless the
//! parent set HETERO_IPC_CHILD).

use hetero_memory::ipc::{IpcExporter, IpcHandle, IpcImporter};
use hetero_memory::vmm::{Access, Granularity, MemoryContext};
use hetero_memory::MemoryError;
use std::process::Command;

const SIZE: usize = 8 << 20;

fn pattern(i: usize) -> u8 {
    (i * 31 % 251) as u8
}

#[test]
fn two_processes_share_memory_and_revocation_holds() {
    let ctx = MemoryContext::unlimited("parent");
    let phys = ctx
        .create_physical(SIZE, Granularity::Huge2M)
        .expect("physical");
    let mut r = ctx.reserve(SIZE, Granularity::Huge2M).expect("reserve");
    r.map(0, &phys, 0, SIZE, Access::ReadWrite).expect("map");
    // SAFETY: SIZE bytes mapped read-write.
    let mem = unsafe { std::slice::from_raw_parts_mut(r.ptr(), SIZE) };
    for (i, b) in mem.iter_mut().enumerate().step_by(4093) {
        *b = pattern(i);
    }
    let path = std::env::temp_dir().join(format!("hetero-ipc-test-{}.sock", std::process::id()));
    let exp = IpcExporter::bind(&path).expect("bind");
    let live = exp.export(&phys).expect("export");
    let stale = exp.export(&phys).expect("export");
    exp.revoke(&stale).expect("revoke");
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "child_imports",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("HETERO_IPC_CHILD", "1")
        .env("HETERO_IPC_LIVE", live.to_string())
        .env("HETERO_IPC_STALE", stale.to_string())
        .output()
        .expect("spawn the importing process");
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{log}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(log.contains("child: imported"), "the child ran: {log}");
    // The child's write is visible here.
    assert_eq!(mem[SIZE - 1], 0xC7, "written by the other process");
    assert_eq!(mem[0], 0xC8);
}

#[test]
fn child_imports() {
    if std::env::var_os("HETERO_IPC_CHILD").is_none() {
        return;
    }
    let live: IpcHandle = std::env::var("HETERO_IPC_LIVE")
        .expect("handle")
        .parse()
        .expect("parse");
    let stale: IpcHandle = std::env::var("HETERO_IPC_STALE")
        .expect("handle")
        .parse()
        .expect("parse");
    assert_ne!(live.exporter, std::process::id(), "another process");
    let ctx = MemoryContext::new("child", SIZE);
    let mut imp = IpcImporter::new(&ctx);
    let m = imp.import(&live).expect("import");
    assert_eq!(m.size(), SIZE);
    // SAFETY: the import maps SIZE bytes read-write.
    let mem = unsafe { std::slice::from_raw_parts_mut(m.ptr(), SIZE) };
    for i in (0..SIZE).step_by(4093) {
        assert_eq!(mem[i], pattern(i), "byte {i}");
    }
    let again = imp.import(&live).expect("cached import");
    assert_eq!(again.ptr(), m.ptr());
    let e = imp.import(&stale).unwrap_err();
    assert!(matches!(e, MemoryError::Revoked { .. }), "{e}");
    // The exporter's memfd is sealed: it cannot be shrunk under us.
    assert!(rustix::fs::ftruncate(m.handle().fd().expect("a memfd"), 0).is_err());
    mem[SIZE - 1] = 0xC7;
    mem[0] = 0xC8;
    println!(
        "child: imported {} bytes from process {}",
        m.size(),
        live.exporter
    );
}
