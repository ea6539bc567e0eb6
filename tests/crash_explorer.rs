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
    assert_eq!(sum.by_length, [136, 800, 100]);
    // Tens of thousands of crash states (about 123000 at seed 1), each recovered and checked.
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
    let alternates: Vec<usize> = workloads(&cfg)
        .iter()
        .enumerate()
        .filter(|(_, w)| w.to_string().contains("alternate"))
        .map(|(i, _)| i)
        .collect();
    assert!(alternates.len() >= 3, "{alternates:?}");
    let sum = explore(&cfg).unwrap();
    eprintln!("{sum}");
    for a in &alternates {
        assert!(
            sum.failures.iter().any(|f| f.index == *a),
            "alternate workload #{a} passed with the slot fence skipped"
        );
    }
}
