//! `HETERO_SCHED` picks a new context's policy. A test binary of its own:
//! the variable is the process's, and no other test may see it change.

mod common;

use hetero::{Context, Kernel, SchedPolicy};

#[test]
fn hetero_sched_picks_a_new_contexts_policy() {
    let k = Kernel::new("sched-env", |b| b.write::<u32>(0).fill(3))
        .wgsl(common::wgsl::map("u32", 0, "3u"), "main");
    let made = |value: Option<&str>| {
        match value {
            Some(v) => std::env::set_var("HETERO_SCHED", v),
            None => std::env::remove_var("HETERO_SCHED"),
        }
        // (A device joins one context for its life: one each, kept
        // beside it.)
        let dev = common::device();
        let ctx = Context::new(std::slice::from_ref(&dev)).expect("context");
        ctx.set_perfmodel_dir(None);
        (ctx, dev)
    };
    for p in SchedPolicy::ALL {
        let (ctx, _dev) = made(Some(p.name()));
        assert_eq!(ctx.scheduler(), p);
        // Its tasks run under it.
        let x = ctx.data::<u32>(64).expect("data");
        ctx.task(&k)
            .write(&x)
            .submit()
            .expect("task")
            .wait()
            .expect("ran");
        assert_eq!(x.to_vec().expect("read"), vec![3; 64], "{}", p.name());
    }
    // A name of no policy is a warning, and dmda; so is none.
    assert_eq!(made(Some("fastest")).0.scheduler(), SchedPolicy::Dmda);
    assert_eq!(made(None).0.scheduler(), SchedPolicy::Dmda);
    // Set on a context, the policy is its own whatever the variable says.
    let (ctx, _dev) = made(Some("eager"));
    ctx.set_scheduler(SchedPolicy::Learned);
    std::env::set_var("HETERO_SCHED", "ws");
    assert_eq!(ctx.scheduler(), SchedPolicy::Learned);
    std::env::remove_var("HETERO_SCHED");
}
