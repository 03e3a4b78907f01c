//! In-process tests of the IPC protocol (the two-process test is tests/ipc.rs).

use super::*;
use crate::vmm::{Access, MemoryContext};

const M2: usize = 2 << 20;

fn socket(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("hetero-ipc-{}-{name}.sock", std::process::id()))
}

#[test]
fn handles_print_and_parse() {
    let h = IpcHandle {
        exporter: 42,
        path: "/tmp/a:b.sock".into(),
        id: 7,
        size: 4 << 20,
        granularity: Granularity::Huge2M,
    };
    let back: IpcHandle = h.to_string().parse().expect("parse");
    assert_eq!(back, h);
    for bad in [
        "",
        "hetero-ipc:1:2",
        "nope:1:2:3:0:/x",
        "hetero-ipc:1:2:3:9:/x",
        "hetero-ipc:1:2:3:0:",
    ] {
        let e = bad.parse::<IpcHandle>().unwrap_err();
        assert!(
            matches!(e, MemoryError::InvalidRequest { .. }),
            "{bad}: {e}"
        );
    }
}

#[test]
fn import_caches_and_revoke_makes_stale_handles_fail() {
    let owner = MemoryContext::unlimited("exporter");
    let phys = owner
        .create_physical(2 * M2, Granularity::Huge2M)
        .expect("physical");
    let mut r = owner.reserve(2 * M2, Granularity::Huge2M).expect("reserve");
    r.map(0, &phys, 0, 2 * M2, Access::ReadWrite).expect("map");
    // SAFETY: mapped read-write.
    unsafe { r.ptr().add(12345).write(0x5A) };
    let path = socket("cache");
    let exp = IpcExporter::bind(&path).expect("bind");
    let h = exp.export(&phys).expect("export");
    let other = exp.export(&phys).expect("second export");

    let importer_ctx = MemoryContext::unlimited("importer");
    let mut imp = IpcImporter::new(&importer_ctx);
    let a = imp.import(&h).expect("first import");
    // SAFETY: the import maps the whole handle read-write.
    assert_eq!(unsafe { a.ptr().add(12345).read() }, 0x5A);
    assert_ne!(a.ptr(), r.ptr(), "a mapping of its own");
    assert_eq!(
        importer_ctx.stats().mapped,
        2 * M2,
        "charged to the importer"
    );
    let b = imp.import(&h).expect("cached import");
    assert_eq!(a.ptr(), b.ptr(), "the cache answers");
    assert_eq!(imp.exporters(), 1);
    // Writes through the import reach the exporter's mapping.
    // SAFETY: as above.
    unsafe { a.ptr().add(7).write(9) };
    // SAFETY: the exporter's mapping is still there.
    assert_eq!(unsafe { r.ptr().add(7).read() }, 9);

    exp.revoke(&h).expect("revoke");
    let e = imp.import(&h).unwrap_err();
    assert!(matches!(e, MemoryError::Revoked { .. }), "cached: {e}");
    let e = imp.import(&h).unwrap_err();
    assert!(matches!(e, MemoryError::Revoked { .. }), "uncached: {e}");
    assert!(e.to_string().contains("fresh handle"), "{e}");
    // A fresh importer cannot get it either.
    let mut fresh = IpcImporter::new(&importer_ctx);
    assert!(matches!(fresh.import(&h), Err(MemoryError::Revoked { .. })));
    // The other export still imports; the mapping handed out before stays valid.
    fresh.import(&other).expect("other export");
    // SAFETY: `a` keeps its mapping after the revoke.
    assert_eq!(unsafe { a.ptr().add(7).read() }, 9);
    let e = exp.revoke(&h).unwrap_err();
    assert!(matches!(e, MemoryError::InvalidRequest { .. }), "{e}");
    let unknown = IpcHandle {
        id: 99,
        ..h.clone()
    };
    let e = fresh.import(&unknown).unwrap_err();
    assert!(matches!(e, MemoryError::Import { .. }), "{e}");
    let forged = IpcHandle {
        exporter: 1,
        ..other.clone()
    };
    let e = IpcImporter::new(&importer_ctx).import(&forged).unwrap_err();
    assert!(e.to_string().contains("not the exporter"), "{e}");
    drop(exp);
    assert!(!path.exists(), "the socket is removed");
}

#[test]
fn an_import_over_quota_is_refused() {
    let owner = MemoryContext::unlimited("exporter");
    let phys = owner
        .create_physical(4 * M2, Granularity::Huge2M)
        .expect("physical");
    let exp = IpcExporter::bind(socket("quota")).expect("bind");
    let h = exp.export(&phys).expect("export");
    let small = MemoryContext::new("small importer", 2 * M2);
    let e = IpcImporter::new(&small).import(&h).unwrap_err();
    assert!(matches!(e, MemoryError::QuotaExceeded { .. }), "{e}");
}

#[test]
fn unsealed_or_resized_fds_are_refused() {
    use rustix::fs::MemfdFlags;
    let h = IpcHandle {
        exporter: 1,
        path: "/x".into(),
        id: 0,
        size: 4096,
        granularity: Granularity::Page4K,
    };
    let fd = rustix::fs::memfd_create(c"unsealed", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .expect("memfd");
    rustix::fs::ftruncate(&fd, 4096).expect("size");
    let e = import::check_shared_fd(&fd, 4096, &h).unwrap_err();
    assert!(e.to_string().contains("not sealed"), "{e}");
    rustix::fs::fcntl_add_seals(&fd, crate::vmm::physical::SEALS_REQUIRED).expect("seal");
    import::check_shared_fd(&fd, 4096, &h).expect("sealed, right size");
    let e = import::check_shared_fd(
        &fd,
        8192,
        &IpcHandle {
            size: 8192,
            ..h.clone()
        },
    )
    .unwrap_err();
    assert!(matches!(e, MemoryError::Import { .. }), "{e}");
}

#[test]
fn a_private_handle_cannot_be_exported() {
    let c = MemoryContext::unlimited("private-export");
    let p = c
        .create_private(2 * M2, crate::vmm::Granularity::Huge2M)
        .expect("private");
    let ex = IpcExporter::bind(socket("private")).expect("bind");
    let e = ex
        .export(&p)
        .expect_err("a private handle has no fd to send");
    assert!(matches!(e, crate::MemoryError::Private { .. }), "{e}");
}
