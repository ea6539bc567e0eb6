//! The persistence-point crash explorer (src/crash): a bounded run with zero failures, and a
//! deliberately broken build that it must catch.

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
    assert_eq!(sum.by_length, [126, 800, 100]);
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
