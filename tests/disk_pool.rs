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

/// A mount point of its own (a size-limited tmpfs or a loop-mounted ext4), lazily unmounted on
/// drop so a failed assertion leaves nothing mounted.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Run a setup command; it must succeed (the test runs only as root, where all of them can).
fn must(cmd: &mut std::process::Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

/// A temporary directory holding `shelf`, a 48 MiB tmpfs of its own (a file system that can
/// be filled up); None, with a message, unless run as root.
fn shelf(needs: &str) -> Option<(tempfile::TempDir, std::path::PathBuf, Mounted)> {
    if winefs::sys::euid() != 0 {
        eprintln!("skipping: {needs} needs root");
        return None;
    }
    let dir = tempfile::tempdir_in("/dev/shm").expect("a directory in /dev/shm");
    let shelf = dir.path().join("shelf");
    std::fs::create_dir(&shelf).unwrap();
    must(std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=48m", "winefs-test"])
        .arg(&shelf));
    Some((dir, shelf.clone(), Mounted(shelf)))
}

/// Fill the shelf with the file `filler` until no write fits; returns its path.
fn fill(shelf: &Path) -> std::path::PathBuf {
    let filler = shelf.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0xa5u8; 64 << 10];
    while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
    assert!(
        std::fs::write(shelf.join("probe"), [1u8; 8192]).is_err(),
        "the shelf is full"
    );
    filler
}

fn mount_ext4(img: &Path, at: &Path) -> Mounted {
    must(std::process::Command::new("mount").args(["-o", "loop"]).arg(img).arg(at));
    Mounted(at.to_path_buf())
}

/// A disk that stops taking writes: ext4 on a loop device whose image is a sparse file on a
/// small tmpfs. Filling the tmpfs makes every write to a part of the image never written
/// before fail (the loop device's write gets ENOSPC), as a thinly provisioned disk that runs
/// out of space does; parts written before still take writes. A strict write of fresh blocks
/// then fails at its fdatasync, and from there on the mount must store nothing: no later store
/// may reach the disk without the ones that failed (the kernel may write pages dirtied after
/// the failure back once the disk takes writes again, e.g. the size of a file whose data was
/// lost), and the pool must not be marked clean. The next mount then finds what a crash at the
/// failed sync leaves: everything that was durable, and no file whose bytes were lost.
#[test]
fn a_failed_disk_write_stops_the_mount_and_loses_nothing_durable() {
    let Some((dir, shelf, shelf_guard)) = shelf("a failing disk (tmpfs and loop mounts)") else {
        return;
    };
    let disk = dir.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let img = shelf.join("ext4.img");
    std::fs::File::create(&img).unwrap().set_len(256 << 20).unwrap();
    // Inode tables and the journal written now (not lazily later, when the shelf is full).
    must(std::process::Command::new("mkfs.ext4")
        .args(["-q", "-b", "4096", "-N", "1024", "-J", "size=4"])
        .args(["-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard"])
        .arg(&img));
    let ext4 = mount_ext4(&img, &disk);

    let pool = disk.join("pool");
    common::format(&pool, 64 << 20, None);
    let fs = common::mount(&pool);
    let root = fs.root();
    let kept = fs.create(root, b"kept", 0o644, 0, 0).unwrap().ino;
    fs.write(kept, 0, &common::pattern(1 << 20, 7)).unwrap();
    fs.fsync(kept).unwrap();

    // The disk fills up.
    let filler = fill(&shelf);

    // Fresh blocks: their write to the disk fails.
    let failed = (|| {
        let lost = fs.create(root, b"lost", 0o644, 0, 0)?.ino;
        fs.write(lost, 0, &common::pattern(4 << 20, 9))?;
        fs.fsync(lost)
    })();
    let e = failed.expect_err("a write whose blocks cannot reach the disk fails");
    let msg = e.to_string();
    assert!(
        msg.contains("to the disk") && msg.contains(&pool.display().to_string()),
        "one line naming the pool and the disk: {msg}"
    );
    // Every later call fails the same way, and nothing more is left to write back.
    let after = fs.create(root, b"after", 0o644, 0, 0).expect_err("a create after the failure");
    assert!(after.to_string().contains("to the disk"), "{after}");
    let mut buf = vec![0u8; 16];
    assert!(fs.read(kept, 0, &mut buf).is_err(), "a read after the failure");
    assert_eq!(unwritten(&pool), 0, "no store after the failed sync");
    let un = fs.unmount().expect_err("an unmount after the failure does not mark it clean");
    assert!(
        un.to_string().contains("not marking") && un.to_string().contains("to the disk"),
        "{un}"
    );
    assert_eq!(unwritten(&pool), 0, "the unmount stored nothing");

    // The disk takes writes again; the page cache goes (as at a reboot).
    std::fs::remove_file(&filler).unwrap();
    drop(ext4);
    let _ext4 = mount_ext4(&img, &disk);
    let state = info(&pool);
    assert!(
        !state.contains("state         clean unmount"),
        "the pool is not marked clean: {state}"
    );
    let fs = common::mount(&pool);
    let kept = fs.lookup(root, b"kept").unwrap().ino;
    let mut back = vec![0u8; 1 << 20];
    assert_eq!(fs.read(kept, 0, &mut back).unwrap(), 1 << 20);
    assert!(back == common::pattern(1 << 20, 7), "the durable file is intact");
    // The failed file: absent, or there with none of the lost bytes claimed.
    if let Ok(lost) = fs.lookup(root, b"lost") {
        assert_eq!(
            fs.getattr(lost.ino).unwrap().size,
            0,
            "no size for bytes that never reached the disk"
        );
    }
    assert!(fs.lookup(root, b"after").is_err());
    let report = fs.check();
    assert!(report.is_clean(), "{report:?}");
    fs.unmount().unwrap();
    drop(shelf_guard);
}

/// A sparse copy of a pool (`cp` leaves its runs of zeros as holes) on a file system without
/// room for them: the mount refuses it in one line and stores nothing (it died of SIGBUS
/// before, at its first read of a hole: on tmpfs that allocates a page), and mounts once there
/// is room.
#[test]
fn a_sparse_pool_on_a_full_file_system_is_refused_in_one_line() {
    use std::os::unix::fs::MetadataExt;
    let Some((_dir, shelf, _shelf)) = shelf("a full file system of its own (a tmpfs mount)") else {
        return;
    };
    let pool = shelf.join("pool");
    common::format(&pool, 32 << 20, None);
    let fs = common::mount(&pool);
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap().ino;
    fs.write(a, 0, &common::pattern(1 << 20, 3)).unwrap();
    fs.unmount().unwrap();
    let copy = shelf.join("copy");
    must(std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(&pool)
        .arg(&copy));
    std::fs::remove_file(&pool).unwrap();
    let held = std::fs::metadata(&copy).unwrap().blocks() * 512;
    assert!(held < 16 << 20, "the copy is sparse: {held} bytes allocated");

    let filler = fill(&shelf);
    let before = std::fs::read(&copy).unwrap();
    // Readers that map it privately (they must not change it) refuse it too: on tmpfs a read
    // of a hole takes a page.
    for tool in ["info", "fsck"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_winefs"))
            .arg(tool)
            .arg(&copy)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code().is_some_and(|c| c != 0)
                && err.contains("has holes")
                && err.lines().count() == 1,
            "winefs {tool}: one line, no SIGBUS: {out:?}"
        );
    }
    let Err(e) = Fs::mount(&copy, MountOptions::default()) else {
        panic!("a sparse pool mounted on a file system without room for its holes");
    };
    let msg = e.to_string();
    assert!(
        e.errno() == libc::ENOSPC && msg.contains("allocate the holes") && !msg.contains('\n'),
        "one line: {msg}"
    );
    assert!(
        std::fs::read(&copy).unwrap() == before,
        "the refused pool is unchanged"
    );

    std::fs::remove_file(&filler).unwrap();
    let fs = common::mount(&copy);
    assert_eq!(
        std::fs::metadata(&copy).unwrap().blocks() * 512,
        32 << 20,
        "the mount gave the copy its blocks"
    );
    let a = fs.lookup(fs.root(), b"a").unwrap().ino;
    let mut back = vec![0u8; 1 << 20];
    fs.read(a, 0, &mut back).unwrap();
    assert!(back == common::pattern(1 << 20, 3));
    let b = fs.create(fs.root(), b"b", 0o644, 0, 0).unwrap().ino;
    fs.write(b, 0, &common::pattern(4 << 20, 4)).unwrap();
    fs.unmount().unwrap();
}
