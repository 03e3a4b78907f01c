//! Host callbacks on the Vulkan device's engine thread, and what they may
//! wait for there.
//!
//! A callback runs on the engine thread with the engine free: the thread's
//! loop (`run`) takes one look at a time (`Engine::step`) and runs the
//! callback a look hands back between looks, so a wait made inside it can
//! make looks itself. The rule, per blocking call made inside the callback
//! of stream S at timeline value c (the host backend's rule,
//! `backend/host/callback.rs`):
//! - waiting for `(S, v)` with `v >= c` (its own stream at or after the
//!   callback: `Stream::synchronize`, a full ring of S, `Device::synchronize`)
//!   is `Error::WouldDeadlock`, at once; so is a wait whose chain of event
//!   waits (heads of streams waiting on events of this device) leads back to
//!   a running callback, once the device has nothing else to do;
//! - any other wait works: while it waits, the thread takes, submits and
//!   completes the other streams' work (the callback's stream takes nothing
//!   until it returns), so a wait on another stream ends even though the
//!   device has one engine thread.
//!
//! Invariants: `Home` lives on the engine thread only (thread-local, never
//! sent). Its engine is borrowed for one look at a time; user code that runs
//! inside a look (a graph's host node) finds it borrowed, and its waits are
//! refused unless already satisfied. `Home::running` lists the callbacks
//! running on the thread, innermost last; only this thread touches it.

use super::complete::{complete, Stamps};
use super::engine::{Engine, Step, Taken};
use super::{Shared, VulkanStream};
use crate::exec::op::{self, Body};
use crate::exec::timeline::Timeline;
use crate::{Error, Result};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The engine thread's state between looks.
struct Home {
    sh: Arc<Shared>,
    engine: RefCell<Engine>,
    /// The callbacks running on this thread (stream, value), innermost last.
    running: RefCell<Vec<(Arc<VulkanStream>, u64)>>,
}

thread_local! {
    /// The engine this thread runs (set for the life of `run`).
    static HOME: RefCell<Option<Rc<Home>>> = const { RefCell::new(None) };
}

/// The engine thread's loop: looks until the device is dropped, running the
/// host callbacks the looks hand back.
pub(super) fn run(engine: Engine, sh: &Arc<Shared>) {
    crate::exec::thread::mark_engine_thread();
    crate::exec::timeline::set_engine_wait(wait_in_callback);
    let home = Rc::new(Home {
        sh: sh.clone(),
        engine: RefCell::new(engine),
        running: RefCell::new(Vec::new()),
    });
    HOME.with(|h| *h.borrow_mut() = Some(home.clone()));
    loop {
        let step = home.engine.borrow_mut().step(sh, None);
        match step {
            Step::Callback(t) => home.run_callback(t),
            Step::Shutdown => break,
            Step::Again | Step::Idle => {}
        }
    }
    let _ = HOME.try_with(|h| h.borrow_mut().take());
}

impl Home {
    /// Runs the taken callback `t` and completes it; its stream takes work
    /// again after.
    fn run_callback(&self, t: Box<Taken>) {
        let mut t = *t;
        let stream = t.stream.clone();
        self.running.borrow_mut().push((stream.clone(), t.value));
        if let Body::Host(f) = &mut t.op.body {
            if let Some(f) = f.take() {
                t.result = op::catch_user(|| "host callback".into(), f);
            }
        }
        // Still running while it completes: what its captures do when they
        // drop there is judged as from inside it.
        complete(&self.sh, t, None, &Stamps::default());
        self.running.borrow_mut().pop();
        // What it was holding back is taken by the next look, which takes
        // before it parks.
        stream.in_callback.store(false, Ordering::Relaxed);
    }

    /// Why waiting for `(timeline, value)` from inside the running callbacks
    /// could never end, judged from them alone.
    fn waits_for_itself(&self, timeline: &Timeline, value: u64, what: &str) -> Option<Error> {
        let running = self.running.borrow();
        let (s, at) = running
            .iter()
            .find(|(s, at)| std::ptr::eq(&*s.timeline, timeline) && value >= *at)?;
        Some(Error::WouldDeadlock(format!(
            "{what} waits for operation {value} of stream {}, but this thread is running its \
             operation {at} (a host callback on a Vulkan device); the wait could only end after \
             the callback returns: wait outside the callback, or on an event recorded before it",
            s.id
        )))
    }
}

/// The host wait of the Vulkan engine thread (installed by `run`): refuses a
/// wait that could never end, and makes the engine's looks while it waits.
fn wait_in_callback(
    timeline: &Timeline,
    value: u64,
    what: &'static str,
    ready: &mut dyn FnMut() -> bool,
) -> Result<()> {
    if ready() {
        return Ok(());
    }
    let Some(home) = HOME.try_with(|h| h.borrow().clone()).ok().flatten() else {
        return Err(refused(what));
    };
    if let Some(e) = home.waits_for_itself(timeline, value, what) {
        return Err(e);
    }
    let sh = home.sh.clone();
    loop {
        if ready() {
            return Ok(());
        }
        // Borrowed: this wait comes from user code inside a look (a graph's
        // host node), which holds the engine until it returns.
        let Ok(mut engine) = home.engine.try_borrow_mut() else {
            return Err(refused(what));
        };
        let step = engine.step(&sh, Some(&mut *ready));
        let cycle = matches!(step, Step::Idle)
            && timeline.device == sh.device
            && engine.leads_back(&home.running.borrow(), timeline.stream, value);
        drop(engine);
        match step {
            Step::Callback(t) => home.run_callback(t),
            Step::Again | Step::Idle | Step::Shutdown => {}
        }
        if cycle && !ready() {
            return Err(Error::WouldDeadlock(format!(
                "{what} waits for operation {value} of stream {}, which (through the events it \
                 waits on) needs a host callback running on this Vulkan device's engine thread \
                 to return first; wait outside the callback",
                timeline.stream
            )));
        }
    }
}

fn refused(what: &str) -> Error {
    Error::WouldDeadlock(format!(
        "{what} from a graph's host node on a Vulkan device: its engine cannot progress until \
         the node returns; wait outside the graph"
    ))
}

impl Engine {
    /// Whether `(stream, value)` of this device waits, through the events the
    /// heads of streams wait on, for one of the `running` callbacks (asked
    /// when nothing is in flight and nothing was ready).
    pub(super) fn leads_back(
        &self,
        running: &[(Arc<VulkanStream>, u64)],
        mut stream: u64,
        mut value: u64,
    ) -> bool {
        for _ in 0..64 {
            if running.iter().any(|(s, at)| s.id == stream && value >= *at) {
                return true;
            }
            let Some(s) = self.stream(stream) else {
                return false;
            };
            if s.timeline.is_reached(value) {
                return false;
            }
            // SAFETY: this is the engine thread, the ring's only consumer.
            let next = unsafe {
                s.ring.peek_with(|op, _| match &op.body {
                    Body::Wait {
                        timeline, value, ..
                    } if timeline.device == s.timeline.device && timeline.stream != 0 => {
                        Some((timeline.stream, *value))
                    }
                    _ => None,
                })
            };
            let Some(Some(next)) = next else {
                return false;
            };
            (stream, value) = next;
        }
        false
    }
}
