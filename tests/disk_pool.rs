//! A pool that is a file on a disk file system without DAX. Its mapping is the file's page cache,
//! so cache-line write-backs make nothing durable: the kernel must write the file to the disk.
//! Every operation that returns must have done so (its fences are `fdatasync`s), which these
//! tests check with `cachestat(2)`: no page of the pool file is left dirty or under write-back.

mod common;

use std::path::Path;
use winefs::{Consistency, Fs, MkfsOptions, MountOptions, RenameFlags};

/// A directory on the disk the build directory is on (the checkout's own disk).
fn disk_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a directory in target/");
    let probe = dir.path().join("probe");
    let file = std::fs::File::create(&probe).expect("a file in target/");
    let backing = winefs::sys::backing(&probe, &file);
    assert_eq!(
        backing,
        winefs::sys::Backing::PageCache,
        "{}: these tests need the build on a disk file system without DAX",
        dir.path().display()
    );
    dir
}

fn unwritten(path: &Path) -> u64 {
    let f = std::fs::File::open(path).expect("open the pool file");
    winefs::sys::unwritten_pages(&f).expect("cachestat(2) of the pool file")
}

#[test]
fn every_operation_is_on_the_disk_when_it_returns() {
    let dir = disk_dir();
    // The check itself: a file written the ordinary way keeps dirty pages for a while (the
    // kernel writes them back after about 30 s).
    let plain = dir.path().join("plain");
    std::fs::write(&plain, vec![1u8; 1 << 20]).unwrap();
    assert!(
        unwritten(&plain) > 0,
        "cachestat sees a fresh file's dirty pages"
    );

    let pool = dir.path().join("pool");
    common::format(&pool, 64 << 20, None);
    assert_eq!(unwritten(&pool), 0, "mkfs leaves the pool on the disk");
    let fs = common::mount(&pool);
    assert_eq!(unwritten(&pool), 0, "mount leaves the pool on the disk");
    assert!(
        fs.check_direct_path().is_err(),
        "no process may store into it directly"
    );
    let before = fs
        .disk_syncs()
        .expect("a pool on a disk file system syncs to the disk");

    let root = fs.root();
    let f = fs.create(root, b"a", 0o644, 0, 0).unwrap().ino;
    assert_eq!(unwritten(&pool), 0, "create");
    fs.write(f, 0, &common::pattern(3 << 20, 1)).unwrap();
    assert_eq!(unwritten(&pool), 0, "a 3 MiB strict write");
    fs.write(f, 4096 * 5 + 100, &common::pattern(300, 2))
        .unwrap();
    assert_eq!(unwritten(&pool), 0, "a 300-byte strict overwrite");
    fs.append(f, &common::pattern(5000, 3)).unwrap();
    assert_eq!(unwritten(&pool), 0, "an append");
    fs.mkdir(root, b"d", 0o755, 0, 0).unwrap();
    let d = fs.lookup(root, b"d").unwrap().ino;
    fs.rename(root, b"a", d, b"b", RenameFlags::default())
        .unwrap();
    assert_eq!(unwritten(&pool), 0, "mkdir and rename");
    let syncs = fs.disk_syncs().unwrap();
    assert!(syncs > before, "the operations wrote the pool to the disk");
    let mut buf = vec![0u8; 4096];
    fs.read(fs.lookup(d, b"b").unwrap().ino, 0, &mut buf)
        .unwrap();
    assert_eq!(
        fs.disk_syncs(),
        Some(syncs),
        "a lookup and a read write nothing"
    );
    fs.unlink(d, b"b").unwrap();
    assert_eq!(unwritten(&pool), 0, "unlink");
    fs.unmount().unwrap();
    assert_eq!(unwritten(&pool), 0, "unmount");
    assert!(info(&pool).contains("durability    every commit waits for fdatasync"));

    // Relaxed: data is written in place and durable at fsync.
    let fs = common::mount_with(&pool, Consistency::Relaxed);
    let g = fs.create(root, b"r", 0o644, 0, 0).unwrap().ino;
    fs.write(g, 0, &common::pattern(1 << 20, 4)).unwrap();
    fs.write(g, 777, &common::pattern(4096, 5)).unwrap();
    fs.fsync(g).unwrap();
    assert_eq!(unwritten(&pool), 0, "relaxed writes after fsync");
    fs.unmount().unwrap();

    let fs = common::mount(&pool);
    let mut back = vec![0u8; 4096];
    fs.read(fs.lookup(root, b"r").unwrap().ino, 777, &mut back)
        .unwrap();
    assert_eq!(back, common::pattern(4096, 5));
    fs.unmount().unwrap();
}

#[test]
fn a_pool_in_memory_writes_to_no_disk() {
    let dir = tempfile::tempdir_in("/dev/shm").expect("a directory in /dev/shm");
    let pool = dir.path().join("pool");
    Fs::mkfs(
        &pool,
        &MkfsOptions {
            size: Some(64 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    let fs = Fs::mount(&pool, MountOptions::default()).unwrap();
    assert_eq!(fs.disk_syncs(), None);
    assert!(fs.check_direct_path().is_ok());
    fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap();
    fs.unmount().unwrap();
    assert!(info(&pool).contains("durability    cache-line write-backs and fences; the pool is in memory"));
}

/// `winefs info POOL`'s output.
fn info(pool: &Path) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_winefs"))
        .arg("info")
        .arg(pool)
        .output()
        .expect("run winefs info");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
