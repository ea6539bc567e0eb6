//! Strict random (or, with `seq`, sequential) 4 KiB overwrites of a 256 MiB file on a clean
//! pool and on one aged to 75% (agrawal profile, 1.5x the capacity written): ops/s, bytes
//! stored per op by category, the free aligned 2 MiB extents left per partition and the blocks
//! lent to the slot zones. It shows where an aged pool's strict overwrites go slower
//! (docs/EVALUATION.md, "Where winefs loses").
//!
//! `cargo run --release --example aged_overwrite -- [POOL] [seq]` (default: a 1.6 GB pool in
//! /dev/shm, made for each run and removed after it).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use winefs::age::profile::Profile;
use winefs::age::{AgeConfig, Ager, CreateMethod, LibraryTarget};
use winefs::{Fs, MkfsOptions, MountOptions};

const FILE_MIB: u64 = 256;
const OPS: u64 = 65_536;

fn run(pool: &Path, aged: bool, sequential: bool) -> winefs::Result<()> {
    let _ = std::fs::remove_file(pool);
    Fs::mkfs(pool, &MkfsOptions { size: Some(1600 << 20), ..Default::default() })?;
    if aged {
        let fs = Fs::mount(pool, MountOptions::default())?;
        let mut cfg = AgeConfig::new(Profile::load("agrawal")?);
        cfg.writes = 1.5;
        let target = LibraryTarget { fs: fs.clone(), method: CreateMethod::default() };
        Ager::new(&cfg, target)?.run()?;
        let _ = fs.settle_rewrites(Duration::from_secs(60));
        fs.unmount()?;
    }
    let fs = Fs::mount(pool, MountOptions::default())?;
    fs.wait_prefault();
    let dir = fs.mkdir(fs.root(), b"overwrite", 0o755, 0, 0)?.ino;
    let ino = fs.create(dir, b"file", 0o644, 0, 0)?.ino;
    let data = vec![7u8; 1 << 20];
    for _ in 0..FILE_MIB {
        fs.append(ino, &data)?;
    }
    let before = fs.write_stats();
    let blocks = FILE_MIB << 8;
    let mut x: u64 = 1;
    let t = Instant::now();
    for i in 0..OPS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let block = if sequential { i % blocks } else { x % blocks };
        fs.write(ino, block * 4096, &data[..4096])?;
    }
    let secs = t.elapsed().as_secs_f64();
    let after = fs.write_stats();
    let per_op = |a: u64, b: u64| (a - b) as f64 / OPS as f64;
    println!(
        "{}: {:.0} overwrites/s, {:.2} fences per op",
        if aged { "aged to 75%" } else { "clean" },
        OPS as f64 / secs,
        per_op(after.pool_fences, before.pool_fences)
    );
    let stored: Vec<String> = after
        .pool_bytes
        .iter()
        .zip(&before.pool_bytes)
        .map(|((name, a), (_, b))| format!("{name} {:.0}", per_op(*a, *b)))
        .collect();
    println!("  bytes stored per op: {}", stored.join(", "));
    let aligned: Vec<u64> = fs.alloc_stats().iter().map(|s| s.free_aligned_extents).collect();
    println!("  free aligned 2 MiB extents per partition: {aligned:?}");
    let st = fs.statfs();
    println!("  blocks free {}, lent to slot zones {}", st.free_blocks, st.zone_blocks);
    fs.unmount()?;
    std::fs::remove_file(pool).map_err(|e| winefs::Error::io("remove the pool", e))
}

fn main() -> winefs::Result<()> {
    let pool = std::env::args().nth(1).map_or_else(
        || PathBuf::from(format!("/dev/shm/winefs-aged-overwrite-{}.pool", std::process::id())),
        PathBuf::from,
    );
    let sequential = std::env::args().nth(2).is_some_and(|a| a == "seq");
    run(&pool, false, sequential)?;
    run(&pool, true, sequential)
}
