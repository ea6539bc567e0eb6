//! DRAM per file: anonymous memory (`RssAnon` of /proc/self/status) a mounted pool gains per
//! empty file created through the library, in one directory.
//!
//! `cargo run --release --example dram_per_file -- [FILES] [POOL]` (default 200000 files, a
//! pool in /dev/shm). The pool is made for the run and removed after it.

use std::path::PathBuf;
use winefs::{Consistency, Fs, MkfsOptions, MountOptions};

/// Anonymous resident memory of this process, in bytes.
fn anon_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("RssAnon in /proc/self/status");
    kib * 1024
}

fn main() -> winefs::Result<()> {
    let mut args = std::env::args().skip(1);
    let files: u64 = args.next().map_or(200_000, |s| s.parse().expect("FILES is a number"));
    let pool = args.next().map_or_else(
        || PathBuf::from(format!("/dev/shm/winefs-dram-{}.pool", std::process::id())),
        PathBuf::from,
    );
    Fs::mkfs(
        &pool,
        &MkfsOptions {
            size: Some(1 << 30),
            inodes: Some(files + 1024),
            ..Default::default()
        },
    )?;
    let fs = Fs::mount(
        &pool,
        MountOptions {
            consistency: Consistency::Strict,
            no_prefault: true,
            ..Default::default()
        },
    )?;
    let dir = fs.mkdir(fs.root(), b"d", 0o755, 0, 0)?.ino;
    let before = anon_rss();
    for i in 0..files {
        fs.create(dir, format!("f{i:08}").as_bytes(), 0o644, 0, 0)?;
    }
    let after = anon_rss();
    println!(
        "{files} empty files: {:.1} bytes of anonymous memory per file",
        after.saturating_sub(before) as f64 / files as f64
    );
    fs.unmount()?;
    std::fs::remove_file(&pool).map_err(|e| winefs::Error::io("remove the pool", e))?;
    Ok(())
}
