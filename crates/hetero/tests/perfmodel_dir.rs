//! Where a context's performance models persist when its directory is set
//! to an empty path: the default (`HETERO_PERFMODEL_DIR` here), as for an
//! empty `HETERO_PERFMODEL_DIR`, never the working directory. Its own test
//! binary: it sets the process's environment.

mod common;

use hetero::{Context, Kernel};
use std::path::PathBuf;

#[test]
fn an_empty_perfmodel_dir_means_the_default_one() {
    let dir = std::env::temp_dir().join(format!("hetero-perfmodel-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // SAFETY: the only test of this binary, set before any thread reads the
    // environment.
    unsafe { std::env::set_var("HETERO_PERFMODEL_DIR", &dir) };
    let cwd_model = PathBuf::from("empty_dir_probe.model");
    let _ = std::fs::remove_file(&cwd_model);
    let devs = [common::device(), common::device()];
    let ctx = Context::new(&devs).unwrap();
    ctx.set_perfmodel_dir(Some(PathBuf::new()));
    let k = Kernel::new("empty_dir_probe", |b| b.write::<u32>(0).fill(1))
        .wgsl(common::wgsl::map("u32", 0, "1u"), "main");
    let x = ctx.data::<u32>(64).unwrap();
    for _ in 0..24 {
        ctx.task(&k).write(&x).submit().unwrap();
    }
    ctx.wait_tasks().unwrap();
    drop(ctx);
    assert!(
        dir.join("empty_dir_probe.model").exists(),
        "the model is saved in the default directory"
    );
    assert!(!cwd_model.exists(), "no model in the working directory");
    let _ = std::fs::remove_dir_all(&dir);
}
