//! The FUSE kill harness (src/crash/kill.rs), a bounded number of rounds: a multi-threaded
//! fsync'ing writer workload on `winefs mount`, the daemon killed with SIGKILL at seeded random
//! moments, then fsck and a check of every fsync'd file after each remount. Needs root and
//! /dev/fuse, like tests/fuse_mount.rs.

use std::path::PathBuf;
use winefs::crash::kill::{KillConfig, run};

#[test]
fn sigkill_of_the_daemon_keeps_every_fsynced_file() {
    let rounds = 40;
    let cfg = KillConfig {
        rounds,
        seed: 7,
        ..KillConfig::new(PathBuf::from(env!("CARGO_BIN_EXE_winefs")))
    };
    let sum = run(&cfg).unwrap();
    eprintln!("{sum}");
    assert!(sum.failures.is_empty(), "{:#?}", sum.failures);
    assert_eq!(sum.rounds, rounds);
    // The workload really wrote and the checks really ran.
    assert!(sum.synced_ops >= rounds as u64, "{sum}");
    assert!(sum.checks >= rounds as u64, "{sum}");
}
