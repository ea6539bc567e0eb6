//! The persistence-point crash explorer (src/crash): a bounded run with zero failures, and
//! deliberately broken builds (a fence skipped in the undo journal, or in alternate writing)
//! that it must catch.

use winefs::crash::{ExploreConfig, explore, workloads};

#[test]
fn bounded_exploration_finds_no_failures() {
    let cfg = ExploreConfig {
        pairs: 800,
        triples: 100,
        ..Default::default()
    };
    let n = workloads(&cfg).len();
    let sum = explore(&cfg).unwrap();
    eprintln!("{sum}");
    for f in &sum.failures {
        eprintln!("{f}");
    }
    assert_eq!(sum.workloads, n);
    assert_eq!(sum.by_length, [184, 800, 100]);
    // Tens of thousands of crash states (about 163000 at seed 1), each recovered and checked.
    assert!(sum.states >= 50_000, "{sum}");
    assert!(sum.failures.is_empty(), "{} failures", sum.failures.len());
}

#[test]
fn broken_build_is_caught() {
    let cfg = ExploreConfig {
        broken_skip_undo_fence: true,
        ..Default::default()
    };
    let sum = explore(&cfg).unwrap();
    eprintln!("{sum}");
    for f in sum.failures.iter().take(5) {
        eprintln!("{f}");
    }
    assert!(!sum.failures.is_empty());
}

/// Explore `cfg` (a deliberately broken build) and assert that every workload `select` picks
/// (by its printed form; at least `min` of them) is among the failures.
fn assert_each_fails(cfg: &ExploreConfig, min: usize, select: impl Fn(&str) -> bool) {
    let picked: Vec<usize> = workloads(cfg)
        .iter()
        .enumerate()
        .filter(|(_, w)| select(&w.to_string()))
        .map(|(i, _)| i)
        .collect();
    assert!(picked.len() >= min, "{picked:?}");
    let sum = explore(cfg).unwrap();
    eprintln!("{sum}");
    for a in &picked {
        assert!(
            sum.failures.iter().any(|f| f.index == *a),
            "workload #{a} passed with the broken build"
        );
    }
}

/// With the fence between an alternate write's stores and its descriptor skipped, the
/// explorer finds crash states where the descriptor names lines whose bytes never reached
/// media: every alternate-writing workload in strict mode fails.
#[test]
fn broken_slot_build_is_caught() {
    let cfg = ExploreConfig {
        broken_skip_slot_fence: true,
        modes: vec![winefs::Consistency::Strict],
        ..Default::default()
    };
    assert_each_fails(&cfg, 3, |w| w.contains("alternate"));
}

/// With the fence between an append's bytes and the one-store size commit skipped, the size
/// may reach media before the bytes it covers: every strict workload that appends into blocks
/// the file already has fails.
#[test]
fn broken_append_build_is_caught() {
    let cfg = ExploreConfig {
        broken_skip_append_fence: true,
        modes: vec![winefs::Consistency::Strict],
        ..Default::default()
    };
    // /A (5000 bytes) and /B (2 MiB + 12 KiB, its second unit aligned) of the populated start
    // have their next block: an append of 3000 bytes lands in it.
    assert_each_fails(&cfg, 2, |w| {
        w.starts_with("[populated") && (w.contains("] append /A +") || w.contains("] append /B +"))
    });
}
