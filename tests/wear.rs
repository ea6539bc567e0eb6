//! Wear statistics and wear-aware allocation (`mkfs --wear-stats`, `winefs wear`,
//! `MountOptions::wear_aware`): every store counts against the blocks it touches, the counts
//! survive a clean unmount, `winefs wear` reports them, and next-fit allocation does not hand
//! the block just freed straight back.

mod common;

use std::process::Command;
use winefs::{Fs, MkfsOptions, MountOptions};

const BIN: &str = env!("CARGO_BIN_EXE_winefs");

fn wear_pool() -> (tempfile::TempDir, std::path::PathBuf) {
    common::fresh_pool_with(&MkfsOptions {
        size: Some(64 << 20),
        partitions: Some(1),
        wear_stats: true,
        ..Default::default()
    })
}

#[test]
fn writes_are_counted_per_block_and_kept_across_unmount() {
    let (_d, p) = wear_pool();
    let fs = common::mount(&p);
    let f = fs.create_file("/f").unwrap();
    f.write_at(0, &[1u8; 8192]).unwrap();
    let block = fs.extents(f.ino()).unwrap()[0].1 + 1; // the file's second block
    let before = fs.wear_counts().unwrap()[block as usize];
    // Relaxed-mode-independent: 10 whole-block writes of the second block each store into it
    // at least once (strict: home or a slot, alternately, so at least every other one).
    for k in 0..10u8 {
        f.write_at(4096, &[k; 4096]).unwrap();
    }
    let after = fs.wear_counts().unwrap()[block as usize];
    assert!(after >= before + 5, "{before} -> {after}");
    drop(f);
    let total: u64 = fs.wear_counts().unwrap().iter().map(|&c| u64::from(c)).sum();
    fs.unmount().unwrap();

    let (g, saved) = winefs::state::mount::read_wear(&p).unwrap();
    assert_eq!(saved.len() as u64, g.pool_size / 4096);
    assert!(saved[block as usize] >= after, "saved {} < {after}", saved[block as usize]);
    let saved_total: u64 = saved.iter().map(|&c| u64::from(c)).sum();
    assert!(saved_total >= total);
    // Mounted again, counting goes on from the saved counts.
    let fs = common::mount(&p);
    assert!(fs.wear_counts().unwrap()[block as usize] >= saved[block as usize]);
    fs.unmount().unwrap();

    let out = Command::new(BIN).args(["wear", "--top", "3"]).arg(&p).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in ["| journals ", "| data ", "hottest blocks:", "data blocks by writes:"] {
        assert!(text.contains(want), "{want} missing:\n{text}");
    }
    assert_eq!(text.matches("  block ").count(), 3, "{text}");
}

#[test]
fn a_pool_without_counters_is_refused_in_one_line() {
    let (_d, p) = common::fresh_pool(64 << 20, Some(1));
    let fs = common::mount(&p);
    assert!(fs.wear_counts().is_none());
    fs.unmount().unwrap();
    let out = Command::new(BIN).arg("wear").arg(&p).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--wear-stats"), "{err}");
}

/// Lowest-hole-first hands a freed block straight back; next fit moves on.
#[test]
fn wear_aware_allocation_moves_on_from_the_block_just_freed() {
    let first_blocks = |wear_aware: bool| {
        let (_d, p) = wear_pool();
        let fs = Fs::mount(&p, MountOptions { wear_aware, ..Default::default() }).unwrap();
        let mut got = Vec::new();
        for i in 0..4 {
            let name = format!("/s{i}");
            let f = fs.create_file(&name).unwrap();
            f.write_at(0, b"x").unwrap();
            got.push(fs.extents(f.ino()).unwrap()[0].1);
            drop(f);
            fs.unlink_path(&name).unwrap();
        }
        fs.unmount().unwrap();
        got
    };
    let plain = first_blocks(false);
    assert!(plain.windows(2).all(|w| w[0] == w[1]), "{plain:?}");
    let aware = first_blocks(true);
    assert!(aware.windows(2).all(|w| w[0] != w[1]), "{aware:?}");
}
