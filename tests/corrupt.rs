//! CI's run of the structure-aware corruption tester (`winefs crashtest corrupt` runs more):
//! every kind of metadata damaged, 520 seeded trials, judged by the trust rules.

use winefs::crash::corrupt::{self, Damage, Outcome};

#[test]
fn damaged_pools_are_refused_unchanged_or_served_truthfully() {
    let dir = tempfile::tempdir().unwrap();
    let sum = corrupt::run(dir.path(), 520, 1).unwrap();
    println!("{sum}");
    assert!(sum.failures.is_empty(), "{:#?}", sum.failures);
    assert!(sum.trials >= 500, "only {} trials ran", sum.trials);
    // Damage that checksums and validation cover is never served wrongly without a report,
    // and every kind was exercised.
    for d in Damage::ALL {
        let n: usize = [Outcome::Refused, Outcome::Repaired, Outcome::Served]
            .iter()
            .map(|o| sum.outcomes.get(&(d, *o)).copied().unwrap_or(0))
            .sum();
        assert!(n > 0, "no trial damaged {d:?}");
    }
    // A block two files claim is always refused, and repair gives each file its own copy.
    let n = |d, o| sum.outcomes.get(&(d, o)).copied().unwrap_or(0);
    assert!(n(Damage::SharedBlock, Outcome::Repaired) > 0, "no shared block was repaired");
    // Damage to the journal of an interrupted transaction is refused or recovered right.
    assert!(sum.outcomes.get(&(Damage::StagedImage, Outcome::Refused)).copied().unwrap_or(0) > 0);
}
