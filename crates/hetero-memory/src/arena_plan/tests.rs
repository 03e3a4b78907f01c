//! The planner's tests.

use super::random::{SplitMix, MAX_CASE_SIZE, MIN_CASE_SIZE};
use super::*;
use proptest::prelude::*;

/// Strict reachability by depth-first search, for checking `from_dag`.
fn reaches(nodes: usize, edges: &[(u32, u32)]) -> Vec<Vec<bool>> {
    let mut reach = vec![vec![false; nodes]; nodes];
    for (start, row) in reach.iter_mut().enumerate() {
        let mut stack = vec![start];
        while let Some(v) = stack.pop() {
            for &(f, t) in edges {
                if f as usize == v && !row[t as usize] {
                    row[t as usize] = true;
                    stack.push(t as usize);
                }
            }
        }
    }
    reach
}

fn check_all_plans(sizes: &[u64], align: u64, c: &Conflicts) -> (ArenaPlan, ArenaPlan) {
    let p = plan(sizes, align, c);
    let g = plan_greedy_by_size(sizes, align, c);
    let naive = plan_naive(sizes, align);
    for q in [&p, &g, &naive] {
        if let Err(e) = verify(sizes, align, c, q) {
            panic!("{}: {e}", q.strategy);
        }
    }
    assert!(p.size <= g.size, "plan {} above greedy {}", p.size, g.size);
    (p, g)
}

fn interval_case() -> impl Strategy<Value = (Vec<u64>, Vec<(u32, u32)>, u64)> {
    let buffer = (
        prop_oneof![Just(0u64), 1u64..5_000, 1u64..(1 << 26)],
        0u32..64,
        0u32..16,
    );
    (
        prop::collection::vec(buffer, 0..48),
        prop::sample::select(vec![1u64, 8, 256, 4096]),
    )
        .prop_map(|(bufs, align)| {
            let sizes = bufs.iter().map(|b| b.0).collect();
            let intervals = bufs.iter().map(|b| (b.1, b.1 + b.2)).collect();
            (sizes, intervals, align)
        })
}

/// A small DAG with shuffled labels, any uses and sizes.
fn dag_case() -> impl Strategy<Value = RandomCase> {
    (1usize..24)
        .prop_flat_map(|nodes| {
            let labels = Just((0..nodes as u32).collect::<Vec<u32>>()).prop_shuffle();
            let pairs = prop::collection::vec((0..nodes, 0..nodes), 0..3 * nodes);
            let uses = prop::collection::vec(prop::collection::vec(0..nodes as u32, 1..4), 0..20);
            let sizes = prop::collection::vec(prop_oneof![Just(0u64), 1u64..100_000], 20);
            (Just(nodes), labels, pairs, uses, sizes)
        })
        .prop_map(|(nodes, labels, pairs, uses, sizes)| {
            // Edges only go forward in a hidden order, so the graph is acyclic.
            let edges = pairs
                .into_iter()
                .filter(|(a, b)| a < b)
                .map(|(a, b)| (labels[a], labels[b]))
                .collect();
            let sizes = sizes[..uses.len()].to_vec();
            RandomCase {
                nodes,
                edges,
                order: labels,
                uses,
                sizes,
            }
        })
}

proptest! {
    #[test]
    fn plans_are_valid_on_intervals((sizes, intervals, align) in interval_case()) {
        let c = Conflicts::from_intervals(&intervals);
        let (p, _) = check_all_plans(&sizes, align, &c);
        prop_assert!(p.size >= peak_live_intervals(&sizes, &intervals));
        for (i, &s) in sizes.iter().enumerate() {
            if s == 0 {
                prop_assert_eq!(p.offsets[i], 0);
            }
        }
    }

    #[test]
    fn from_dag_matches_reachability(case in dag_case()) {
        let RandomCase { nodes, edges, uses, sizes, .. } = &case;
        let c = Conflicts::from_dag(*nodes, edges, uses);
        let reach = reaches(*nodes, edges);
        let before = |a: &[u32], b: &[u32]| {
            a.iter().all(|&u| b.iter().all(|&v| reach[u as usize][v as usize]))
        };
        for a in 0..uses.len() {
            for b in 0..uses.len() {
                let apart = a == b || before(&uses[a], &uses[b]) || before(&uses[b], &uses[a]);
                prop_assert_eq!(c.conflict(a, b), !apart, "buffers {} {}", a, b);
            }
        }
        let (p, _) = check_all_plans(sizes, 256, &c);
        prop_assert!(p.size >= heaviest_clique(sizes, &c));
        // The hidden order is one schedule of the DAG: a plan for any schedule
        // holds for it.
        let seq = Conflicts::from_intervals(&case.intervals());
        prop_assert_eq!(verify(sizes, 256, &seq, &p), Ok(()));
    }

    #[test]
    fn transpose_matches_bits(rows in 0usize..150, cols in 0usize..150, seed: u64) {
        let mut rng = SplitMix(seed);
        let mut m = BitMatrix::zeros(rows, cols);
        for r in 0..rows {
            for c in 0..cols {
                if rng.below(3) == 0 {
                    m.set(r, c);
                }
            }
        }
        let t = m.transpose();
        for r in 0..rows {
            for c in 0..cols {
                prop_assert_eq!(m.get(r, c), t.get(c, r));
            }
        }
    }
}

#[test]
fn random_cases_are_graphs() {
    for seed in 0..6 {
        let c = random_case(seed, 400);
        assert_eq!((c.sizes.len(), c.uses.len()), (400, 400));
        assert!((400..=800).contains(&c.nodes), "{} nodes", c.nodes);
        let mut position = vec![usize::MAX; c.nodes];
        for (k, &v) in c.order.iter().enumerate() {
            position[v as usize] = k;
        }
        assert!(
            position.iter().all(|&k| k != usize::MAX),
            "order is a permutation"
        );
        assert!(c
            .edges
            .iter()
            .all(|&(f, t)| position[f as usize] < position[t as usize]));
        assert!(c.uses.iter().all(|u| !u.is_empty()));
        assert!(c
            .sizes
            .iter()
            .all(|&s| (MIN_CASE_SIZE..=MAX_CASE_SIZE).contains(&s)));
        assert!(
            c.order != (0..c.nodes as u32).collect::<Vec<_>>(),
            "labels are shuffled"
        );
        // A sequential schedule is one of the DAG's: its conflicts are a subset.
        let seq = Conflicts::from_intervals(&c.intervals());
        let dag = Conflicts::from_dag(c.nodes, &c.edges, &c.uses);
        for a in 0..400 {
            for b in seq.neighbours(a) {
                assert!(dag.conflict(a, b), "{a} and {b} overlap in the order only");
            }
        }
    }
}

#[test]
fn plans_are_valid_on_random_cases() {
    for seed in 0..4 {
        let c = random_case(seed, 1000);
        let intervals = c.intervals();
        let seq = Conflicts::from_intervals(&intervals);
        let (p, _) = check_all_plans(&c.sizes, 256, &seq);
        assert!(p.size >= peak_live_intervals(&c.sizes, &intervals));
        let dag = Conflicts::from_dag(c.nodes, &c.edges, &c.uses);
        let (d, _) = check_all_plans(&c.sizes, 256, &dag);
        assert!(d.size >= heaviest_clique(&c.sizes, &dag));
        assert_eq!(plan(&c.sizes, 256, &dag), d, "deterministic");
    }
}

#[test]
fn verify_rejects_bad_plans() {
    let sizes = [1024, 1024, 512];
    let c = Conflicts::from_intervals(&[(0, 2), (1, 3), (4, 5)]);
    let good = ArenaPlan {
        offsets: vec![0, 1024, 0],
        size: 2048,
        strategy: "hand-made",
    };
    assert_eq!(verify(&sizes, 256, &c, &good), Ok(()));
    let overlap = ArenaPlan {
        offsets: vec![0, 512, 0],
        ..good.clone()
    };
    let err = verify(&sizes, 256, &c, &overlap).expect_err("0 and 1 overlap");
    assert!(err.contains("buffers 0") && err.contains("and 1"), "{err}");
    let misaligned = ArenaPlan {
        offsets: vec![0, 1100, 0],
        size: 4096,
        ..good.clone()
    };
    assert!(verify(&sizes, 256, &c, &misaligned).is_err());
    let short = ArenaPlan {
        size: 2000,
        ..good.clone()
    };
    assert!(verify(&sizes, 256, &c, &short).is_err());
    let missing = ArenaPlan {
        offsets: vec![0, 1024],
        ..good
    };
    assert!(verify(&sizes, 256, &c, &missing).is_err());
}

#[test]
fn no_buffers() {
    for c in [
        Conflicts::from_intervals(&[]),
        Conflicts::from_dag(0, &[], &[]),
    ] {
        assert!(c.is_empty());
        for p in [
            plan(&[], 64, &c),
            plan_greedy_by_size(&[], 64, &c),
            plan_naive(&[], 64),
        ] {
            assert_eq!((p.offsets.len(), p.size), (0, 0));
            assert_eq!(verify(&[], 64, &c, &p), Ok(()));
        }
    }
    assert_eq!(peak_live_intervals(&[], &[]), 0);
    assert_eq!(random_case(7, 0).nodes, 0);
}

#[test]
fn zero_sized_buffers_take_no_room() {
    let sizes = [0, 100, 0, 50];
    let c = Conflicts::from_intervals(&[(0, 3); 4]);
    let (p, _) = check_all_plans(&sizes, 16, &c);
    assert_eq!((p.offsets[0], p.offsets[2]), (0, 0));
    assert_eq!(p.size, 112 + 50);
    assert_eq!(plan_naive(&sizes, 16).size, 112 + 50);
    // A buffer nobody uses conflicts with nothing.
    let d = Conflicts::from_dag(2, &[(0, 1)], &[vec![0], vec![], vec![0, 1]]);
    assert!(!d.conflict(1, 0) && !d.conflict(1, 2) && d.conflict(0, 2));
}

#[test]
fn huge_buffers_do_not_overflow() {
    let half = u64::MAX / 2;
    let c = Conflicts::from_intervals(&[(0, 1), (1, 2), (2, 3)]);
    for align in [1, 4096] {
        // Two halves fit side by side; with a third on top the arena passes u64::MAX.
        let fits = [half, half - 5000];
        let c2 = Conflicts::from_intervals(&[(0, 1), (1, 2)]);
        let (p, _) = check_all_plans(&fits, align, &c2);
        assert!(p.size > half);
        let sizes = [half, half, half];
        let all = Conflicts::from_intervals(&[(0, 3); 3]);
        for q in [
            plan(&sizes, align, &all),
            plan_greedy_by_size(&sizes, align, &all),
            plan_naive(&sizes, align),
        ] {
            assert_eq!(q.size, u64::MAX);
            assert!(verify(&sizes, align, &all, &q).is_err());
        }
        // Sharing makes them fit where one after another cannot.
        let p = plan(&sizes, align, &c);
        assert_eq!(verify(&sizes, align, &c, &p), Ok(()));
        assert_eq!(p.offsets[0], p.offsets[2], "0 and 2 share bytes");
        assert!(verify(&sizes, align, &c, &plan_naive(&sizes, align)).is_err());
    }
    assert_eq!(
        peak_live_intervals(&[half, half, half], &[(0, 3); 3]),
        u64::MAX
    );
    assert_eq!(
        peak_live_intervals(&[half, half], &[(0, u32::MAX); 2]),
        2 * half
    );
}

#[test]
fn offsets_follow_alignment() {
    let c = random_case(11, 200);
    let conflicts = Conflicts::from_intervals(&c.intervals());
    for align in [1, 4096] {
        let (p, g) = check_all_plans(&c.sizes, align, &conflicts);
        assert!(p.offsets.iter().chain(&g.offsets).all(|&o| o % align == 0));
    }
}

proptest! {
    /// The sweep's plan is valid for the intervals' conflicts, and never
    /// below their exact peak (nor, being first fit, above their total).
    #[test]
    fn the_interval_sweep_never_overlaps_buffers_live_together(
        (sizes, intervals, align) in interval_case()
    ) {
        let p = plan_intervals(&sizes, align, &intervals);
        let c = Conflicts::from_intervals(&intervals);
        prop_assert!(verify(&sizes, align, &c, &p).is_ok(), "{:?}", verify(&sizes, align, &c, &p));
        prop_assert!(p.size >= peak_live_intervals(&sizes, &intervals));
        let total = sizes.iter().fold(0u64, |t, &s| t.saturating_add(s.div_ceil(align) * align));
        prop_assert!(p.size <= total);
    }
}

/// A chain of 100 000 buffers each live for two steps takes two buffers' room,
/// planned without the n² conflict matrix.
#[test]
fn the_interval_sweep_plans_a_long_chain_in_two_buffers() {
    let n = 100_000u32;
    let sizes = vec![4096u64; n as usize];
    let intervals: Vec<(u32, u32)> = (0..n).map(|i| (i, i + 1)).collect();
    let p = plan_intervals(&sizes, 256, &intervals);
    assert_eq!(p.size, 2 * 4096);
}
