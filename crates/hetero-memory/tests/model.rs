//! proptest model of the device pool: random alloc/free sequences over several
//! streams, checked against a list of live ranges.

use hetero_memory::{DevicePool, PoolConfig};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        size: usize,
        align_pow: u32,
        stream: u64,
    },
    Free {
        index: prop::sample::Index,
        stream: u64,
    },
    Trim,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (prop_oneof![1usize..5000, 5000usize..2_000_000, 2_000_000usize..30_000_000], 0u32..14, 0u64..3)
            .prop_map(|(size, align_pow, stream)| Op::Alloc { size, align_pow, stream }),
        5 => (any::<prop::sample::Index>(), 0u64..3).prop_map(|(index, stream)| Op::Free { index, stream }),
        1 => Just(Op::Trim),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// No two live allocations overlap, alignment is honoured, and every byte
    /// is accounted for: after all frees and a trim nothing stays reserved.
    #[test]
    fn pool_model(ops in prop::collection::vec(op(), 1..120), limited in any::<bool>()) {
        let mut config = PoolConfig::default();
        if limited {
            config = config.max_reserved(64 << 20);
        }
        let p = DevicePool::new(config).expect("pool");
        let mut live: Vec<(usize, usize, hetero_memory::Allocation)> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { size, align_pow, stream } => {
                    let align = 1usize << (8 + align_pow % 14);
                    match p.alloc(size, align, stream) {
                        Ok(a) => {
                            let start = a.ptr().as_ptr() as usize;
                            prop_assert_eq!(start % align, 0);
                            prop_assert!(a.size() == size);
                            for (s, l, _) in &live {
                                prop_assert!(start + size <= *s || s + l <= start, "overlap");
                            }
                            live.push((start, size, a));
                        }
                        Err(e) => {
                            prop_assert!(limited, "unlimited pool failed: {}", e);
                        }
                    }
                }
                Op::Free { index, stream } => {
                    if !live.is_empty() {
                        let (_, _, a) = live.swap_remove(index.index(live.len()));
                        p.free(a, stream, Vec::new());
                    }
                }
                Op::Trim => {
                    p.trim();
                }
            }
            let st = p.stats();
            let live_bytes: usize = live.iter().map(|l| l.1).sum();
            prop_assert!(st.allocated >= live_bytes);
            prop_assert_eq!(st.allocated + st.cached + st.free, st.reserved);
            if limited {
                prop_assert!(st.reserved <= 64 << 20);
            }
        }
        for (_, _, a) in live {
            p.free(a, 0, Vec::new());
        }
        p.trim();
        let st = p.stats();
        prop_assert_eq!((st.allocated, st.cached, st.reserved), (0, 0, 0));
    }
}
