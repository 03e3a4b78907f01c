//! Stream-ordered reuse through the public API: a buffer dropped while only its
//! own stream's queued work uses it is reused at once by later work on that
//! stream, and every use of that memory on another stream waits for the work
//! that used it before.

mod common;

use common::{settle, Checks, Gate};
use hetero::{Arg, Device, DeviceBuffer, DeviceConfig, Grid, Kernel, PoolConfig, Stream};
use std::collections::VecDeque;

fn dev(config: DeviceConfig) -> Device {
    Device::new(config.compute_units(2)).expect("host device")
}

/// Elements (u32) of the buffers most tests use: 64 KiB.
const N: usize = 16 * 1024;

/// A default device with two streams.
fn two_streams() -> (Device, Stream, Stream) {
    let d = dev(common::config());
    let (s, t) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    (d, s, t)
}

/// Two streams on a device whose pool already holds an idle block of `N`
/// elements for `s` (so the next buffer on `s` comes from its cache).
fn warm_streams() -> (Device, Stream, Stream) {
    let (d, s, t) = two_streams();
    drop(s.alloc::<u32>(N).unwrap());
    (d, s, t)
}

/// Blocks `s` until the returned gate opens (or drops).
fn gate(s: &Stream) -> Gate {
    Gate::hold(s)
}

/// Drops `a` and allocates the same size on `s`, which must take `a`'s memory
/// from the stream's cache (`why` says why it should).
fn realloc_from_cache(
    d: &Device,
    s: &Stream,
    a: DeviceBuffer<u32>,
    why: &str,
) -> DeviceBuffer<u32> {
    drop(a);
    let hits = d.memory_stats().cache_hits;
    let b = s.alloc::<u32>(N).unwrap();
    assert_eq!(d.memory_stats().cache_hits, hits + 1, "{why}");
    b
}

/// Fills `buf` (memory of a fill of 1s queued on `s` behind `open`) with 2s on
/// `t`: `t` must not run before `s` passed that fill, and the 2s must win.
fn fill_elsewhere_waits_for_the_gate(
    d: &Device,
    s: &Stream,
    t: &Stream,
    open: Gate,
    buf: &DeviceBuffer<u32>,
    name: &str,
) {
    t.fill(buf, 2).unwrap();
    settle(d);
    assert!(
        !t.query().unwrap(),
        "t ran before s finished with the memory"
    );
    open.open();
    t.synchronize().unwrap();
    s.synchronize().unwrap();
    let got = t.read_to_vec(buf).unwrap();
    assert!(
        got.iter().all(|v| *v == 2),
        "a's fill landed after {name}'s"
    );
}

#[test]
fn reuse_same_stream_reuses_memory_while_its_work_is_queued() {
    if common::skipped("reuse_same_stream_reuses_memory_while_its_work_is_queued") {
        return;
    }
    let rounds = 200u32;
    // The checks' result buffers come before the warm block and the stats.
    let (d, s, _t) = two_streams();
    let mut checks = Checks::new(&d, rounds as usize);
    drop(s.alloc::<u32>(N).unwrap());
    let open = gate(&s);
    let before = d.memory_stats();
    for i in 0..rounds {
        let b = s.alloc::<u32>(N).unwrap();
        s.fill(&b, i).unwrap();
        checks.launch(&s, &b, i);
        // Dropped with a fill and a kernel queued behind the closed gate.
    }
    let queued = d.memory_stats();
    assert!(!s.query().unwrap(), "the gate holds the stream");
    // Without reuse each round would hold its own 64 KiB until the gate opens
    // (12.5 MiB, seven new chunks).
    assert_eq!(
        queued.reserved, before.reserved,
        "rounds queued behind one gate needed new memory"
    );
    assert!(queued.cache_hits >= before.cache_hits + u64::from(rounds) - 1);
    open.open();
    s.synchronize().expect("every round ran");
    assert_eq!(
        checks.wrong(&s),
        0,
        "a round saw another round's values: reuse broke stream order"
    );
}

#[test]
fn reuse_memory_reused_on_its_stream_is_ordered_for_other_streams() {
    let (d, s, t) = warm_streams();
    let open = gate(&s);
    let a = s.alloc::<u32>(N).unwrap();
    s.fill(&a, 1).unwrap(); // queued behind the gate
    let b = realloc_from_cache(
        &d,
        &s,
        a,
        "b should take a's memory from the stream's cache",
    );
    // b is used on t: t must wait until s has passed the fill of a's 1s.
    fill_elsewhere_waits_for_the_gate(&d, &s, &t, open, &b, "b");
}

#[test]
fn reuse_memory_taken_from_another_streams_queue_waits_on_the_device() {
    // Two 768 KiB buffers fill the only 2 MiB chunk the pool may map: t's
    // allocation can only be served with memory s's queued work still uses.
    let pool = PoolConfig::default().max_reserved(2 << 20);
    let d = dev(common::config().memory(pool));
    let s = d.create_stream().unwrap();
    let t = d.create_stream().unwrap();
    let n = 192 * 1024; // 768 KiB
    let open = gate(&s);
    let a1 = s.alloc::<u32>(n).unwrap();
    let a2 = s.alloc::<u32>(n).unwrap();
    s.fill(&a1, 1).unwrap();
    s.fill(&a2, 1).unwrap();
    drop((a1, a2));
    let b = t
        .alloc::<u32>(n)
        .expect("memory of s's queued work, ordered after it");
    t.fill(&b, 2).unwrap();
    settle(&d);
    assert!(!t.query().unwrap(), "t reused memory s still writes");
    open.open();
    t.synchronize().unwrap();
    let got = t.read_to_vec(&b).unwrap();
    assert!(got.iter().all(|v| *v == 2), "s's fill landed after t's");
    s.synchronize().unwrap();
}

#[test]
fn reuse_a_buffer_used_on_two_streams_waits_for_both() {
    if common::skipped("reuse_a_buffer_used_on_two_streams_waits_for_both") {
        return;
    }
    let (d, s, t) = two_streams();
    let mut checks = Checks::new(&d, 1);
    let a = s.alloc::<u32>(N).unwrap();
    s.fill(&a, 5).unwrap();
    s.synchronize().unwrap();
    // t reads a behind its gate; a is then dropped. Its memory must not come
    // back to s while t's kernel may still read it.
    let open = gate(&t);
    checks.launch(&t, &a, 5);
    drop(a);
    for _ in 0..4 {
        let b = s.alloc::<u32>(N).unwrap();
        s.fill(&b, 9).unwrap();
    }
    s.synchronize().unwrap();
    open.open();
    t.synchronize().unwrap();
    assert_eq!(checks.wrong(&t), 0, "s overwrote memory t still read");
}

#[test]
fn reuse_an_earlier_users_fault_does_not_fail_the_next_user() {
    let (_d, s, t) = warm_streams();
    let a = s.alloc::<u32>(N).unwrap();
    let boom =
        Kernel::new("boom", |_| panic!("injected")).wgsl(common::wgsl::fails("injected"), "main");
    s.launch(&boom, Grid::new(1), &[Arg::write(&a)]).unwrap();
    drop(a);
    let b = s.alloc::<u32>(N).unwrap();
    // s failed; t only waited for s to be done with the memory.
    t.fill(&b, 3).unwrap();
    t.synchronize().expect("t is not faulted by s's kernel");
    assert!(s.synchronize().is_err());
    assert_eq!(t.read_to_vec(&b).unwrap(), vec![3u32; N]);
}

/// A small deterministic generator (xorshift), so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

struct Live {
    buf: hetero::DeviceBuffer<u32>,
    value: u32,
    /// The stream of its last use: another stream waits for it before touching it.
    last: usize,
}

/// Random programs over three streams that allocate, use (on their own stream or,
/// after an event, on others; or first on a stream other than the allocating one)
/// and drop buffers while gates keep queues deep (a stream waits on an event
/// behind a gate until the program opens it), so memory is reused while earlier
/// users' work is queued. Every check must see its own buffer's value: any
/// mix-up means reuse broke an ordering.
#[test]
fn reuse_random_programs_never_mix_buffers() {
    if common::skipped("reuse_random_programs_never_mix_buffers") {
        return;
    }
    let d = dev(common::config());
    let streams: Vec<Stream> = (0..3).map(|_| d.create_stream().unwrap()).collect();
    // Gates sit in order on a stream of their own, so only the oldest closed one
    // holds an engine; a held stream waits on the event after its gate.
    let gates = d.create_stream().unwrap();
    let mut next_value = 1u32;
    for seed in 1..=12u64 {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seed);
        // At most one check per step.
        let mut checks = Checks::new(&d, 150);
        let mut live: Vec<Live> = Vec::new();
        let mut held: VecDeque<Gate> = VecDeque::new();
        for _ in 0..150 {
            match rng.below(8) {
                0 => {
                    let s = rng.below(3);
                    if held.is_empty() || rng.below(2) == 0 {
                        held.push_back(gate(&gates));
                        let e = gates.record_event().unwrap();
                        streams[s].wait_event(&e).unwrap();
                    } else {
                        held.pop_front(); // opens it
                    }
                }
                1..=3 if live.len() < 4 => {
                    let home = rng.below(3);
                    let len = [1024, 4096, 16384][rng.below(3)];
                    let buf = streams[home].alloc::<u32>(len).unwrap();
                    // First user: the allocating stream, or another one directly.
                    let user = rng.below(3);
                    let value = next_value;
                    next_value += 1;
                    streams[user].fill(&buf, value).unwrap();
                    checks.launch(&streams[user], &buf, value);
                    live.push(Live {
                        buf,
                        value,
                        last: user,
                    });
                }
                4 | 5 if !live.is_empty() => {
                    let i = rng.below(live.len());
                    let s = rng.below(3);
                    let l = &mut live[i];
                    if s != l.last {
                        let e = streams[l.last].record_event().unwrap();
                        streams[s].wait_event(&e).unwrap();
                    }
                    if rng.below(2) == 0 {
                        l.value = next_value;
                        next_value += 1;
                        streams[s].fill(&l.buf, l.value).unwrap();
                    }
                    checks.launch(&streams[s], &l.buf, l.value);
                    l.last = s;
                }
                _ if !live.is_empty() => {
                    let i = rng.below(live.len());
                    drop(live.swap_remove(i));
                }
                _ => {}
            }
        }
        drop(live);
        drop(held); // opens the rest
        for s in &streams {
            s.synchronize().unwrap();
        }
        assert_eq!(
            checks.wrong(&streams[0]),
            0,
            "seed {seed}: a buffer saw another buffer's values"
        );
    }
    let st = d.memory_stats();
    assert!(st.cache_hits > 0, "the programs should reuse memory");
}

#[test]
fn reuse_a_synchronous_read_elsewhere_does_not_hold_the_memory() {
    let (d, s, t) = warm_streams();
    let a = s.alloc::<u32>(N).unwrap();
    s.fill(&a, 4).unwrap();
    s.synchronize().unwrap();
    assert_eq!(t.read_to_vec(&a).unwrap(), vec![4u32; N]);
    let open = gate(&s);
    s.fill(&a, 5).unwrap(); // queued behind the gate
    let b = realloc_from_cache(
        &d,
        &s,
        a,
        "the read on t was over: a's memory should be back in s's cache",
    );
    open.open();
    s.fill(&b, 6).unwrap();
    assert_eq!(s.read_to_vec(&b).unwrap(), vec![6u32; N]);
}

/// Memory reused in stream order and dropped again before any op used it is
/// still memory that queued work on its stream uses: the next buffer built
/// from it must still be ordered after that work for other streams.
#[test]
fn reuse_memory_dropped_unused_keeps_its_stream_order() {
    let (d, s, t) = warm_streams();
    let open = gate(&s);
    let a = s.alloc::<u32>(N).unwrap();
    s.fill(&a, 1).unwrap(); // queued behind the gate
    let b = realloc_from_cache(&d, &s, a, "b should take a's memory");
    // b goes unused: its storage is the only owner when it drops.
    let c = realloc_from_cache(&d, &s, b, "c should take b's memory");
    fill_elsewhere_waits_for_the_gate(&d, &s, &t, open, &c, "c");
}
