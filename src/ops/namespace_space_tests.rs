//! Space running short while names removed under a caller's hold (`Fs::unlink_held` and its
//! kin) keep their files: the pressure free (`MountState::relieve_removed_held`) and the waits
//! for frees under way on other threads (`MountState::wait_for_closing`), for data blocks and
//! for inode numbers. Beside `namespace.rs`, whose unit tests they are.

use crate::error::Error;
use crate::fs::Fs;
use crate::types::{MkfsOptions, MountOptions};

/// How long allocations wait for a free under way in the tests that make one wait: longer than
/// a loaded machine keeps a thread from running.
const TEST_CLOSING_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A fresh pool of `size` bytes (and `inodes` inodes, if given), mounted.
fn mounted(size: u64, inodes: Option<u64>) -> (tempfile::TempDir, Fs) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("pool");
    Fs::mkfs(&p, &MkfsOptions { size: Some(size), inodes, ..Default::default() }).unwrap();
    let fs = Fs::mount(&p, MountOptions::default()).unwrap();
    (d, fs)
}

/// Fill the pool with a file "filler", 1 MiB and then 4 KiB at a time, until no write fits.
fn fill(fs: &Fs) {
    let filler = fs.create(fs.root(), b"filler", 0o644, 0, 0).unwrap().ino;
    let mut end = 0;
    for chunk in [1 << 20, 4096] {
        while fs.write(filler, end, &vec![2u8; chunk]).is_ok() {
            end += chunk as u64;
        }
    }
}

/// A 48 MiB pool filled but for an 8 MiB file "old" (returned), and an empty file "new".
fn full_but_for_old() -> (tempfile::TempDir, Fs, u64, u64) {
    let (d, fs) = mounted(48 << 20, None);
    let root = fs.root();
    let old = fs.create(root, b"old", 0o644, 0, 0).unwrap().ino;
    fs.write(old, 0, &vec![1u8; 8 << 20]).unwrap();
    fill(&fs);
    let new = fs.create(root, b"new", 0o644, 0, 0).unwrap().ino;
    (d, fs, old, new)
}

#[test]
fn a_file_released_just_after_its_removal_gives_its_space_to_the_write_that_follows() {
    // A FUSE program closes a file, removes it and at once writes where it was: the kernel
    // sends the RELEASE in the background, and another thread may still be serving it when
    // the write comes. The write waits for it instead of finding no space.
    // A loaded machine can keep the releasing thread off a CPU for longer than a mount waits
    // (measured: 0.5 s): the test waits as long as any stall.
    let (_d, fs, old, new) = full_but_for_old();
    fs.state.removed_held.set_closing_wait(TEST_CLOSING_WAIT);
    fs.open(old).unwrap();
    let want = vec![3u8; 6 << 20];
    let removed = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !removed.load(std::sync::atomic::Ordering::Acquire) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            fs.release(old).unwrap();
        });
        assert!(fs.unlink_held(fs.root(), b"old", true).unwrap().is_some());
        removed.store(true, std::sync::atomic::Ordering::Release);
        assert_eq!(fs.write(new, 0, &want).unwrap(), want.len(), "the closed file's blocks");
    });
    fs.let_go(old).unwrap();
    assert!(matches!(fs.getattr(old), Err(Error::Stale(_))));
    let report = fs.check();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn a_file_its_forget_is_freeing_gives_its_space_to_the_write_that_follows() {
    // The kernel's FORGET of a removed file, served by another thread, has taken the hold
    // and is freeing the file (`Fs::let_go`, here slowed down) when a write needs its space.
    let (_d, fs, old, new) = full_but_for_old();
    fs.state.removed_held.set_closing_wait(TEST_CLOSING_WAIT);
    assert!(fs.unlink_held(fs.root(), b"old", true).unwrap().is_some());
    let releasing = fs.state.removed_held.take_to_release(old).expect("kept");
    let want = vec![3u8; 6 << 20];
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            crate::ops::open::release(&fs.state, old).unwrap();
            drop(releasing);
        });
        assert_eq!(fs.write(new, 0, &want).unwrap(), want.len(), "the freed file's blocks");
    });
    assert!(matches!(fs.getattr(old), Err(Error::Stale(_))));
    let report = fs.check();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn a_create_on_a_full_inode_table_takes_the_number_of_an_inode_removed_under_a_hold() {
    // The kernel's FORGET of an unlinked file may come after the caller's next create: the
    // number it keeps until then is given to the create, as ext4 gives it at once. A removed
    // directory's too, unless it is open.
    let (_d, fs) = mounted(32 << 20, Some(64));
    let root = fs.root();
    let dir = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let open_dir = fs.mkdir(root, b"o", 0o755, 0, 0).unwrap().ino;
    let mut n = 0;
    let err = loop {
        match fs.create(root, format!("f{n}").as_bytes(), 0o644, 0, 0) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::NoSpace(_)), "{err}");
    let gone = fs.unlink_held(root, b"f0", true).unwrap().expect("kept for the caller");
    let new = fs.create(root, b"g", 0o644, 0, 0).expect("the removed file's number").ino;
    assert_eq!(new, gone, "the only number there is");
    fs.let_go(gone).unwrap();
    assert!(matches!(fs.create(root, b"h", 0o644, 0, 0), Err(Error::NoSpace(_))));
    assert_eq!(fs.getattr(new).unwrap().nlink, 1, "the late FORGET left the new file alone");
    fs.open(open_dir).unwrap();
    assert!(fs.rmdir_held(root, b"o", true).unwrap().is_some());
    assert!(fs.rmdir_held(root, b"d", true).unwrap().is_some());
    let e = fs.mkdir(root, b"e", 0o755, 0, 0).expect("the removed directory's number").ino;
    assert_eq!(e, dir, "the one not open");
    assert!(matches!(fs.create(root, b"h", 0o644, 0, 0), Err(Error::NoSpace(_))), "open: kept");
    assert_eq!(fs.getattr(open_dir).unwrap().nlink, 0);
    for ino in [dir, open_dir] {
        fs.let_go(ino).unwrap();
    }
    fs.release(open_dir).unwrap();
    fs.create(root, b"h", 0o644, 0, 0).expect("the open directory's number, once closed");
    let report = fs.check();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn space_running_short_frees_removed_files_only_their_hold_keeps() {
    let (_d, fs) = mounted(48 << 20, None);
    let root = fs.root();
    let mut big = Vec::new();
    for name in [&b"held"[..], b"open"] {
        let ino = fs.create(root, name, 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, &vec![1u8; 8 << 20]).unwrap();
        big.push(ino);
    }
    let (held, open) = (big[0], big[1]);
    let dir = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    fill(&fs);
    fs.open(open).unwrap();
    for name in [&b"held"[..], b"open"] {
        assert!(fs.unlink_held(root, name, true).unwrap().is_some());
    }
    assert!(fs.rmdir_held(root, b"d", true).unwrap().is_some());
    // The kernel has not let go yet (its FORGET comes later): the write takes the blocks
    // of the file only the hold keeps, not those of the one open, nor the directory.
    let new = fs.create(root, b"new", 0o644, 0, 0).unwrap().ino;
    let want = vec![3u8; 6 << 20];
    assert_eq!(fs.write(new, 0, &want).unwrap(), want.len());
    assert!(matches!(fs.getattr(held), Err(Error::Stale(_))), "freed under pressure");
    assert_eq!(fs.getattr(open).unwrap().nlink, 0, "open: kept");
    assert_eq!(fs.getattr(dir).unwrap().nlink, 0, "a directory: kept");
    let more = vec![4u8; 6 << 20];
    match fs.write(new, 8 << 20, &more) {
        Ok(n) => assert!(n < more.len(), "a short write: space ran out"),
        Err(e) => assert!(matches!(e, Error::NoSpace(_)), "{e}"),
    }
    // The FORGETs come: nothing left to let go of the freed one; the others go now.
    for ino in [held, open, dir] {
        fs.let_go(ino).unwrap();
    }
    assert_eq!(fs.getattr(open).unwrap().nlink, 0, "still open");
    assert!(matches!(fs.getattr(dir), Err(Error::Stale(_))));
    fs.release(open).unwrap();
    assert_eq!(fs.write(new, 16 << 20, &more).unwrap(), more.len(), "the open one's blocks");
    let report = fs.check();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn a_removed_file_that_stays_open_delays_allocations_only_for_a_while_after_its_removal() {
    // No RELEASE comes: the program still has the file open. A write short of space waits
    // for it until the while after the removal has passed, and is refused then; allocations
    // after that are refused at once.
    let (_d, fs, old, new) = full_but_for_old();
    let wait = std::time::Duration::from_millis(300);
    fs.state.removed_held.set_closing_wait(wait);
    fs.open(old).unwrap();
    let removed_at = std::time::Instant::now();
    assert!(fs.unlink_held(fs.root(), b"old", true).unwrap().is_some());
    let err = fs.write(new, 0, &vec![3u8; 6 << 20]).unwrap_err();
    assert!(matches!(err, Error::NoSpace(_)), "{err}");
    assert!(removed_at.elapsed() >= wait, "it waited for the RELEASE");
    assert!(
        !fs.state.removed_held.removed_open_within(fs.state.removed_held.closing_wait()),
        "the allocations that follow do not wait"
    );
    assert_eq!(fs.getattr(old).unwrap().nlink, 0, "still open: kept");
    fs.release(old).unwrap();
    fs.let_go(old).unwrap();
    assert_eq!(fs.write(new, 0, &vec![3u8; 6 << 20]).unwrap(), 6 << 20, "its blocks, once closed");
    let report = fs.check();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}
