//! Basic end-to-end behaviour of the library API across remounts.

mod common;

use common::mount;
use winefs::{Error, FileKind, RenameFlags};

fn fresh(size: u64) -> (tempfile::TempDir, std::path::PathBuf) {
    common::fresh_pool(size, Some(2))
}

#[test]
fn files_dirs_and_data_survive_remount() {
    let (_d, p) = fresh(64 << 20);
    let fs = mount(&p);
    fs.mkdir_path("/a").unwrap();
    let f = fs.create_file("/a/f").unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(f.write_at(0, &data).unwrap(), data.len());
    f.write_at(100, b"hello").unwrap();
    drop(f);
    let s = fs.create(fs.root(), b"link-target", 0o600, 1, 2).unwrap();
    fs.symlink(fs.root(), b"sym", b"/a/f", 0, 0).unwrap();
    fs.link(s.ino, fs.resolve("/a", true).unwrap(), b"hard")
        .unwrap();
    fs.setxattr(s.ino, b"user.k", b"v", Default::default())
        .unwrap();
    let r = fs.check();
    assert!(r.is_clean(), "{:?}", r.problems);
    fs.unmount().unwrap();

    for round in 0..2 {
        let fs = mount(&p);
        let r = fs.check();
        assert!(r.is_clean(), "round {round}: {:?}", r.problems);
        let got = fs.open_file("/sym").unwrap().read_all().unwrap();
        let mut want = data.clone();
        want[100..105].copy_from_slice(b"hello");
        assert_eq!(got.len(), want.len());
        assert!(got == want);
        let a = fs.stat_path("/a/hard").unwrap();
        assert_eq!(a.nlink, 2);
        assert_eq!((a.uid, a.gid, a.perm), (1, 2, 0o600));
        assert_eq!(fs.getxattr(a.ino, b"user.k").unwrap(), b"v");
        assert_eq!(fs.stat_path("/a").unwrap().nlink, 2);
        assert_eq!(
            fs.lookup(fs.root(), b"sym").unwrap().kind,
            FileKind::Symlink
        );
        if round == 0 {
            drop(fs); // Drop unmounts cleanly too
        } else {
            fs.unmount().unwrap();
        }
    }
}

#[test]
fn posix_errors() {
    let (_d, p) = fresh(32 << 20);
    let fs = mount(&p);
    let root = fs.root();
    fs.mkdir(root, b"d", 0o755, 0, 0).unwrap();
    fs.create(root, b"f", 0o644, 0, 0).unwrap();
    assert!(matches!(
        fs.create(root, b"f", 0o644, 0, 0),
        Err(Error::Exists)
    ));
    assert!(matches!(fs.lookup(root, b"nope"), Err(Error::NotFound)));
    assert!(matches!(
        fs.lookup(root, &[b'x'; 256]),
        Err(Error::NameTooLong(256))
    ));
    assert!(matches!(fs.unlink(root, b"d"), Err(Error::IsDir)));
    assert!(matches!(fs.rmdir(root, b"f"), Err(Error::NotDir)));
    fs.create(fs.resolve("/d", true).unwrap(), b"x", 0o644, 0, 0)
        .unwrap();
    assert!(matches!(fs.rmdir(root, b"d"), Err(Error::NotEmpty)));
    let f = fs.resolve("/f", true).unwrap();
    assert!(matches!(
        fs.create(f, b"y", 0o644, 0, 0),
        Err(Error::NotDir)
    ));
    assert!(matches!(
        fs.rename(
            root,
            b"d",
            fs.resolve("/d", true).unwrap(),
            b"inner",
            RenameFlags::default()
        ),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        fs.rename(root, b"f", root, b"d", RenameFlags::default()),
        Err(Error::IsDir)
    ));
    assert!(matches!(
        fs.rename(root, b"d", root, b"f", RenameFlags::default()),
        Err(Error::NotDir)
    ));
    assert!(fs.check().is_clean());
}

#[test]
fn a_write_after_a_look_at_the_times_changes_them_visibly() {
    // Multigrain timestamps: whoever looked at the times sees the next write change them, even
    // many writes within one clock tick; on every write path (append, in place, alternate slot).
    for consistency in [winefs::Consistency::Relaxed, winefs::Consistency::Strict] {
        let (_d, p) = fresh(64 << 20);
        let fs = common::mount_with(&p, consistency);
        let f = fs.create_file("/f").unwrap();
        let ino = f.ino();
        let mut last = fs.getattr(ino).unwrap();
        for i in 0..200u64 {
            let off = match i % 3 {
                0 => last.size,    // append
                1 => 0,            // whole-block overwrite
                _ => 100 + i % 50, // small overwrite
            };
            fs.write(ino, off, &[i as u8; 512]).unwrap();
            let now = fs.getattr(ino).unwrap();
            assert!(
                now.mtime > last.mtime && now.ctime > last.ctime,
                "{consistency:?} write {i}: times {} / {} after {} / {}",
                now.mtime,
                now.ctime,
                last.mtime,
                last.ctime
            );
            last = now;
        }
    }
}

#[test]
fn writes_nobody_looks_at_store_their_times_once_per_clock_tick() {
    let (_d, p) = fresh(64 << 20);
    let fs = common::mount_with(&p, winefs::Consistency::Relaxed);
    let f = fs.create_file("/f").unwrap();
    let ino = f.ino();
    fs.write(ino, 0, &vec![1u8; 1 << 20]).unwrap();
    let writes = 5000u64;
    let wall = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64
    };
    let began = wall(std::time::SystemTime::now());
    let started = std::time::Instant::now();
    let before = fs.persist_stats();
    for i in 0..writes {
        fs.write(ino, (i % 256) * 4096, &[i as u8; 4096]).unwrap();
    }
    let spent = fs.persist_stats().since(&before);
    // An in-place relaxed overwrite stores metadata only for its times (16 bytes), and only
    // when the clock tick's time differs from what the inode holds: at most once per tick,
    // and a tick of the coarse clock is at least a millisecond (HZ <= 1000).
    let ticks = u64::try_from(started.elapsed().as_millis()).unwrap() + 3;
    let meta = spent.bytes_written[winefs::media::pool::Category::Metadata as usize];
    assert!(
        meta <= 16 * ticks && ticks < writes,
        "{meta} bytes of metadata for {writes} writes over at most {ticks} clock ticks"
    );
    // And the times did move with the writes (to a clock tick at most 20 ms before they began).
    assert!(fs.getattr(ino).unwrap().mtime >= began - 20_000_000);
}
