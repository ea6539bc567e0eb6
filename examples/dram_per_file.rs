//! DRAM per file (issue 18, item 5): heap bytes a mounted pool holds per file, counted by a
//! counting global allocator, with the mount's own account of each DRAM structure beside it
//! (`Fs::dram_usage`).
//!
//! `cargo run --release --example dram_per_file -- [FILES] [POOL]` (default 200000 files, a
//! pool in /dev/shm, made for the run and removed after it). Three measurements:
//! 1. FILES empty files created through the library in one directory (names of 9 bytes);
//! 2. FILES files of 100 bytes each in a second directory;
//! 3. the same pool unmounted and mounted again: what the mount builds for all of them (the
//!    directories; a file's state is built on its first use);
//! 4. every file then looked up: what using all of them costs.
#![allow(unsafe_code)] // a global allocator can only be written as `unsafe` (Cargo.toml [lints])

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use winefs::{Consistency, Fs, MkfsOptions, MountOptions};

/// The system allocator, counting the bytes it has handed out and not had back.
struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

fn add(n: usize) {
    LIVE.fetch_add(i64::try_from(n).unwrap_or(i64::MAX), Ordering::Relaxed);
}

fn sub(n: usize) {
    LIVE.fetch_sub(i64::try_from(n).unwrap_or(i64::MAX), Ordering::Relaxed);
}

// SAFETY: every call is passed unchanged to the system allocator; the counter has no effect on
// the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size());
        // SAFETY: forwarded with the caller's layout, which meets `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        sub(layout.size());
        // SAFETY: `ptr` came from this allocator with `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        sub(layout.size());
        add(new_size);
        // SAFETY: forwarded unchanged; the caller meets `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Anonymous resident memory of this process (`RssAnon`), in bytes: the counter's cross-check,
/// and the measure earlier runs used.
fn anon_rss() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kib: i64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("RssAnon in /proc/self/status");
    kib * 1024
}

fn live() -> i64 {
    LIVE.load(Ordering::Relaxed)
}

/// Bytes per file of a heap growth, as text.
fn per(bytes: i64, files: u64) -> String {
    format!("{:.1}", bytes as f64 / files as f64)
}

/// The mount's account of its DRAM structures, per file.
fn breakdown(fs: &Fs, files: u64) {
    for (what, bytes) in fs.dram_usage() {
        println!(
            "    {what:<28} {:>9} bytes/file",
            per(i64::try_from(bytes).unwrap_or(0), files)
        );
    }
}

fn main() -> winefs::Result<()> {
    let mut args = std::env::args().skip(1);
    let files: u64 = args
        .next()
        .map_or(200_000, |s| s.parse().expect("FILES is a number"));
    let pool = args.next().map_or_else(
        || PathBuf::from(format!("/dev/shm/winefs-dram-{}.pool", std::process::id())),
        PathBuf::from,
    );
    Fs::mkfs(
        &pool,
        &MkfsOptions {
            size: Some((1 << 30) + files * 8192),
            inodes: Some(2 * files + 1024),
            ..Default::default()
        },
    )?;
    let opts = MountOptions {
        consistency: Consistency::Strict,
        no_prefault: true,
        ..Default::default()
    };
    let fs = Fs::mount(&pool, opts.clone())?;
    let empty = fs.mkdir(fs.root(), b"empty", 0o755, 0, 0)?.ino;
    let small = fs.mkdir(fs.root(), b"small", 0o755, 0, 0)?.ino;
    let (start, rss) = (live(), anon_rss());
    for i in 0..files {
        fs.create(empty, format!("f{i:08}").as_bytes(), 0o644, 0, 0)?;
    }
    let after_empty = live();
    println!(
        "{files} empty files created:    {} heap bytes per file ({} of RssAnon)",
        per(after_empty - start, files),
        per(anon_rss() - rss, files)
    );
    let data = [7u8; 100];
    for i in 0..files {
        let a = fs.create(small, format!("f{i:08}").as_bytes(), 0o644, 0, 0)?;
        fs.write(a.ino, 0, &data)?;
    }
    println!(
        "{files} 100-byte files created: {} heap bytes per file",
        per(live() - after_empty, files)
    );
    breakdown(&fs, 2 * files);
    fs.unmount()?;
    let before = live();
    let fs = Fs::mount(&pool, opts)?;
    println!(
        "mounted again:                 {} heap bytes per file (both kinds)",
        per(live() - before, 2 * files)
    );
    breakdown(&fs, 2 * files);
    let before = live();
    for dir in [empty, small] {
        for i in 0..files {
            fs.lookup(dir, format!("f{i:08}").as_bytes())?;
        }
    }
    println!(
        "every file looked up:          {} heap bytes per file (both kinds)",
        per(live() - before, 2 * files)
    );
    breakdown(&fs, 2 * files);
    fs.unmount()?;
    std::fs::remove_file(&pool).map_err(|e| winefs::Error::io("remove the pool", e))?;
    Ok(())
}
