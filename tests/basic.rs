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

#[test]
fn a_name_change_after_a_look_at_the_directory_changes_its_times_visibly() {
    let (_d, p) = fresh(64 << 20);
    let fs = mount(&p);
    let root = fs.root();
    let dir = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(dir, b"keep", 0o644, 0, 0).unwrap().ino;
    let mut last = fs.getattr(dir).unwrap();
    let mut last_f = fs.getattr(f).unwrap();
    for i in 0..100u32 {
        let n = format!("n{i}");
        match i % 4 {
            0 => drop(fs.create(dir, n.as_bytes(), 0o644, 0, 0).unwrap()),
            1 => fs.unlink(dir, format!("n{}", i - 1).as_bytes()).unwrap(),
            2 => drop(fs.link(f, dir, n.as_bytes()).unwrap()),
            _ => fs
                .rename(dir, format!("n{}", i - 1).as_bytes(), dir, n.as_bytes(), RenameFlags::default())
                .unwrap(),
        }
        let now = fs.getattr(dir).unwrap();
        assert!(now.mtime > last.mtime && now.ctime > last.ctime, "op {i}: directory times");
        if i % 4 == 2 {
            // A new link changes the file's ctime, visibly: it was looked at.
            let now_f = fs.getattr(f).unwrap();
            assert!(now_f.ctime > last_f.ctime, "op {i}: file ctime");
            last_f = now_f;
        }
        last = now;
    }
}

#[test]
fn creates_nobody_looks_at_store_the_directorys_times_once_per_clock_tick() {
    // The same creates twice, in two fresh directories: once looking at the directory after
    // each (its times then change every time), once not (they change once per clock tick).
    let (_d, p) = fresh(64 << 20);
    let fs = mount(&p);
    let root = fs.root();
    let files = 1000u64;
    let run = |dname: &[u8], look: bool| {
        let dir = fs.mkdir(root, dname, 0o755, 0, 0).unwrap().ino;
        fs.getattr(dir).unwrap();
        let started = std::time::Instant::now();
        let before = fs.persist_stats();
        for i in 0..files {
            fs.create(dir, format!("f{i:06}").as_bytes(), 0o644, 0, 0).unwrap();
            if look {
                fs.getattr(dir).unwrap();
            }
        }
        let bytes = fs.persist_stats().since(&before).total_bytes();
        (bytes, u64::try_from(started.elapsed().as_millis()).unwrap() + 3)
    };
    let (unlooked, ticks) = run(b"quiet", false);
    let (looked, _) = run(b"watched", true);
    // Each change of the times stores their 32-byte chunk (and journals it); a coarse-clock
    // tick is at least a millisecond.
    assert!(ticks < files, "the run took too long to tell: {ticks} ms");
    assert!(
        unlooked + 32 * (files - ticks) <= looked,
        "{unlooked} bytes without looks, {looked} with, over at most {ticks} ticks"
    );
}

#[test]
fn strict_overwrites_of_a_hot_set_are_written_once() {
    // Alternate writing's steady state: a hot set that fits the slot zones (256 blocks; the
    // zones of a 256 MiB pool keep 384 live per partition before writing back) is updated by
    // one copy per write, the newest copy alternating between slot and home — no write-back,
    // no journal.
    let (_d, p) = fresh(256 << 20);
    let fs = common::mount_with(&p, winefs::Consistency::Strict);
    let ino = fs.create_file("/big").unwrap().ino();
    fs.fallocate(ino, 0, 64 << 20, false).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % 256) * 4096
    };
    let buf = [0x5au8; 4096];
    for _ in 0..5000 {
        fs.write(ino, next(), &buf).unwrap();
    }
    let writes = 5000u64;
    let before = fs.persist_stats();
    for _ in 0..writes {
        fs.write(ino, next(), &buf).unwrap();
    }
    let spent = fs.persist_stats().since(&before);
    let per_write = spent.total_bytes() as f64 / writes as f64;
    assert!(
        per_write <= 1.1 * 4096.0,
        "{per_write:.0} bytes stored per 4 KiB write: {spent:?}"
    );
    // And the bytes are there.
    let mut back = vec![0u8; 4096];
    fs.read(ino, 4096 * 17, &mut back).unwrap();
    assert_eq!(back, buf);
}

#[test]
fn a_create_journals_only_what_a_crash_must_undo() {
    // A create writes the new inode (checksum included) into its free slot unjournaled, then
    // journals three things: a START entry, the undo image of the inode's first 32 bytes (the
    // in-use flag) and that of the directory block's header; a COMMIT closes it. The parent's
    // times change at most once per clock tick, and a directory block is added once per
    // hundred-odd names. Journaling the checksum again (a fifth entry per create) fails this.
    let (_d, p) = fresh(64 << 20);
    let fs = common::mount_with(&p, winefs::Consistency::Strict);
    let dir = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    let creates = 2000u64;
    let before = fs.persist_stats();
    for i in 0..creates {
        fs.create(dir, format!("f{i:06}").as_bytes(), 0o644, 0, 0)
            .unwrap();
    }
    let spent = fs.persist_stats().since(&before);
    let entry = winefs::media::layout::JOURNAL_ENTRY_SIZE as f64;
    let journal = spent.bytes_written[winefs::media::pool::Category::Journal as usize] as f64;
    let per_create = journal / creates as f64 / entry;
    assert!(
        per_create < 4.5,
        "{per_create:.2} journal entries per create: {spent:?}"
    );
    // And every file is there, whole, after a remount.
    fs.unmount().unwrap();
    let fs = mount(&p);
    assert!(fs.check().is_clean());
    assert_eq!(fs.readdir(dir, 0).unwrap().len() as u64, creates + 2);
}

#[test]
fn a_write_after_times_set_ahead_takes_the_clocks_time() {
    // As on ext4: a write sets mtime to now, even when it was set ahead of the clock.
    let (_d, p) = fresh(64 << 20);
    let fs = common::mount_with(&p, winefs::Consistency::Strict);
    let ino = fs.create_file("/f").unwrap().ino();
    fs.write(ino, 0, &[1u8; 4096]).unwrap();
    let future = 4_102_444_800_000_000_000i64; // 2100-01-01
    let set = winefs::SetAttr { mtime: Some(winefs::TimeSet::At(future)), ..Default::default() };
    assert_eq!(fs.setattr(ino, &set).unwrap().mtime, future);
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    fs.write(ino, 0, &[2u8; 100]).unwrap();
    let a = fs.getattr(ino).unwrap();
    assert!(a.mtime < future && a.mtime >= before - 20_000_000, "mtime {}", a.mtime);
}

/// Access times follow Linux's default `relatime`: a read stores one when the stored one is not
/// later than the last change (or a day old), a second read does not, a read after a write
/// does again; a directory listing likewise; `read_noatime` (an `O_NOATIME` read) and a
/// `noatime` mount never; the time survives a remount.
#[test]
fn reads_and_listings_store_access_times_as_relatime_does() {
    use winefs::{MountOptions, SetAttr, TimeSet};
    let (_d, p) = fresh(64 << 20);
    let old = 1_000_000_000_000_000i64; // 2001
    let set_old = SetAttr { atime: Some(TimeSet::At(old)), ..Default::default() };
    let mut buf = [0u8; 16];
    {
        let fs = mount(&p);
        let ino = fs.create_file("/f").unwrap().ino();
        fs.write(ino, 0, b"hello").unwrap();
        fs.setattr(ino, &set_old).unwrap();
        fs.read_noatime(ino, 0, &mut buf).unwrap();
        assert_eq!(fs.getattr(ino).unwrap().atime, old, "an O_NOATIME read stores none");
        fs.read(ino, 0, &mut buf).unwrap();
        let first = fs.getattr(ino).unwrap();
        assert!(first.atime > first.mtime && first.atime > old, "a read after the change");
        std::thread::sleep(std::time::Duration::from_millis(30));
        fs.read(ino, 0, &mut buf).unwrap();
        assert_eq!(fs.getattr(ino).unwrap().atime, first.atime, "read again: left alone");
        std::thread::sleep(std::time::Duration::from_millis(30));
        fs.write(ino, 5, b"!").unwrap();
        fs.read(ino, 0, &mut buf).unwrap();
        let again = fs.getattr(ino).unwrap();
        assert!(again.atime > first.atime && again.atime >= again.mtime, "read after a write");
        let dir = fs.mkdir_path("/d").unwrap().ino;
        fs.setattr(dir, &set_old).unwrap();
        fs.readdir(dir, 0).unwrap();
        assert!(fs.getattr(dir).unwrap().atime > old, "a listing stores the directory's");
        fs.setattr(ino, &set_old).unwrap();
        fs.read(ino, 0, &mut buf).unwrap();
        let kept = fs.getattr(ino).unwrap().atime;
        fs.unmount().unwrap();
        let fs = mount(&p);
        assert_eq!(fs.getattr(ino).unwrap().atime, kept, "stored in the pool");
        fs.setattr(ino, &set_old).unwrap();
        fs.unmount().unwrap();
    }
    let fs = common::mount_opts(&p, MountOptions { noatime: true, ..Default::default() });
    let ino = fs.resolve("/f", false).unwrap();
    fs.read(ino, 0, &mut buf).unwrap();
    fs.readdir(fs.root(), 0).unwrap();
    assert_eq!(fs.getattr(ino).unwrap().atime, old, "a noatime mount stores none");
    fs.unmount().unwrap();
    let fs = common::mount_opts(&p, MountOptions { read_only: true, ..Default::default() });
    fs.read(ino, 0, &mut buf).unwrap();
    assert_eq!(fs.getattr(ino).unwrap().atime, old, "a read-only mount stores none");
}

/// An inode's generation is one more than its slot's last inode had, across remounts, so a
/// file handle of a removed file never names the file that reuses its number.
#[test]
fn a_reused_inode_number_gets_the_next_generation() {
    // One partition, so one inode free list: the freed number comes back whichever CPU the
    // thread runs on (with two, a thread moved to the other CPU took numbers from the other
    // list, and under load the test could miss the reuse).
    let (_d, p) = common::fresh_pool(64 << 20, Some(1));
    let fs = mount(&p);
    let first = fs.create(fs.root(), b"first", 0o644, 0, 0).unwrap();
    assert_eq!(fs.getattr(first.ino).unwrap().generation, first.generation);
    let mut seen = first.clone();
    for round in 0..3 {
        fs.unlink(fs.root(), b"first").unwrap();
        // The freed number comes back within a few creates (the lowest free number first).
        let mut made = Vec::new();
        let again = loop {
            let name = format!("n{round}-{}", made.len());
            let a = fs.create(fs.root(), name.as_bytes(), 0o644, 0, 0).unwrap();
            made.push(name);
            if a.ino == seen.ino {
                break a;
            }
            assert!(made.len() < 2000, "inode {} not reused", seen.ino);
        };
        assert_eq!(again.generation, seen.generation.wrapping_add(1), "round {round}");
        let last = made.pop().unwrap();
        fs.rename(fs.root(), last.as_bytes(), fs.root(), b"first", RenameFlags::default())
            .unwrap();
        for n in made {
            fs.unlink(fs.root(), n.as_bytes()).unwrap();
        }
        seen = again;
    }
    fs.unmount().unwrap();
    // The generation lives on media: the next reuse after a remount goes on counting.
    let fs = mount(&p);
    assert_eq!(fs.lookup(fs.root(), b"first").unwrap().generation, seen.generation);
    fs.unlink(fs.root(), b"first").unwrap();
    let mut i = 0;
    let again = loop {
        let a = fs.create(fs.root(), format!("m{i}").as_bytes(), 0o644, 0, 0).unwrap();
        i += 1;
        if a.ino == seen.ino {
            break a;
        }
        assert!(i < 2000, "inode {} not reused after remount", seen.ino);
    };
    assert_eq!(again.generation, seen.generation.wrapping_add(1));
    fs.unmount().unwrap();
}

#[test]
fn an_attribute_removed_if_present_goes_and_an_absent_one_is_no_error() {
    let (_d, p) = fresh(64 << 20);
    let fs = mount(&p);
    let bare = fs.create(fs.root(), b"bare", 0o644, 0, 0).unwrap().ino;
    assert!(!fs.remove_xattr_if_present(bare, b"security.capability").unwrap());
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.setxattr(f, b"security.capability", b"cap", Default::default()).unwrap();
    fs.setxattr(f, b"user.keep", b"1", Default::default()).unwrap();
    assert!(fs.remove_xattr_if_present(f, b"security.capability").unwrap());
    assert!(!fs.remove_xattr_if_present(f, b"security.capability").unwrap());
    assert!(matches!(fs.getxattr(f, b"security.capability"), Err(Error::NoAttr)));
    assert_eq!(fs.getxattr(f, b"user.keep").unwrap(), b"1");
    let r = fs.check();
    assert!(r.is_clean(), "{:?}", r.problems);
    fs.unmount().unwrap();
}

/// A directory removed while open (rmdir, or a rename over it) lives on with no links until
/// its last handle goes, as on ext4: fstat on it works and shows no links, and it takes no new
/// entries (ENOENT). A crash with one open frees it at the next mount.
#[test]
fn an_open_directory_outlives_its_removal() {
    let (_d, p) = fresh(64 << 20);
    let base = {
        let fs = mount(&p);
        let root = fs.root();
        // The root's first directory block is in place before anything is counted.
        fs.mkdir(root, b"primer", 0o755, 0, 0).unwrap();
        fs.rmdir(root, b"primer").unwrap();
        let base = fs.statfs();
        let gone = fs.mkdir(root, b"gone", 0o755, 0, 0).unwrap().ino;
        let victim = fs.mkdir(root, b"victim", 0o755, 0, 0).unwrap().ino;
        fs.mkdir(root, b"src", 0o755, 0, 0).unwrap();
        let file = fs.create(root, b"file", 0o644, 0, 0).unwrap().ino;
        fs.open(gone).unwrap();
        fs.open(victim).unwrap();
        fs.rmdir(root, b"gone").unwrap();
        fs.rename(root, b"src", root, b"victim", RenameFlags::default())
            .unwrap();
        for ino in [gone, victim] {
            let a = fs.getattr(ino).expect("an open directory outlives its removal");
            assert_eq!((a.kind, a.nlink), (FileKind::Dir, 0));
            assert!(matches!(fs.mkdir(ino, b"x", 0o755, 0, 0), Err(Error::NotFound)));
            assert!(matches!(fs.create(ino, b"x", 0o644, 0, 0), Err(Error::NotFound)));
            assert!(matches!(fs.link(file, ino, b"x"), Err(Error::NotFound)));
            assert!(matches!(
                fs.rename(root, b"file", ino, b"x", RenameFlags::default()),
                Err(Error::NotFound)
            ));
        }
        let r = fs.check();
        assert!(r.is_clean(), "while open: {:#?}", r.problems);
        for ino in [gone, victim] {
            fs.release(ino).unwrap();
            assert!(matches!(fs.getattr(ino), Err(Error::Stale(_))), "freed at the last release");
        }
        fs.unlink(root, b"file").unwrap();
        fs.rmdir(root, b"victim").unwrap();
        let s = fs.statfs();
        assert_eq!((s.free_blocks, s.free_inodes), (base.free_blocks, base.free_inodes));
        // Removed while open, then a crash: the handle is never released.
        let open = fs.mkdir(root, b"open", 0o755, 0, 0).unwrap().ino;
        fs.open(open).unwrap();
        fs.rmdir(root, b"open").unwrap();
        drop(fs);
        base
    };
    let fs = mount(&p);
    let s = fs.statfs();
    assert_eq!((s.free_blocks, s.free_inodes), (base.free_blocks, base.free_inodes), "the orphan directory is freed at mount");
    let r = fs.check();
    assert!(r.is_clean(), "after the mount: {:#?}", r.problems);
    assert!(fs.list_dir("/").unwrap().is_empty());
    fs.unmount().unwrap();
}

/// `Fs::set_read_only` (what `mount -o remount,ro|rw` asks of the daemon): every change is
/// refused while read-only, reads go on, a file whose last link went while open is not freed
/// by its last release then but when the mount is read-write again; a mount made read-only
/// from the start is never made read-write.
#[test]
fn a_mount_turns_read_only_and_back_in_place() {
    let (_d, p) = fresh(64 << 20);
    let fs = mount(&p);
    let root = fs.root();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, b"kept").unwrap();
    let doomed = fs.create(root, b"doomed", 0o644, 0, 0).unwrap().ino;
    fs.write(doomed, 0, &vec![7u8; 1 << 20]).unwrap();
    fs.open(doomed).unwrap();
    fs.unlink(root, b"doomed").unwrap();
    let with_doomed = fs.statfs();

    fs.set_read_only(true).unwrap();
    assert!(fs.is_read_only());
    assert!(matches!(fs.create(root, b"g", 0o644, 0, 0), Err(Error::ReadOnly)));
    assert!(matches!(fs.write(f, 0, b"x"), Err(Error::ReadOnly)));
    assert!(matches!(fs.unlink(root, b"f"), Err(Error::ReadOnly)));
    let mut buf = [0u8; 4];
    assert_eq!(fs.read(f, 0, &mut buf).unwrap(), 4);
    assert_eq!(&buf, b"kept");
    fs.release(doomed).unwrap();
    let s = fs.statfs();
    assert_eq!((s.free_blocks, s.free_inodes), (with_doomed.free_blocks, with_doomed.free_inodes), "nothing freed while read-only");

    fs.set_read_only(false).unwrap();
    assert!(!fs.is_read_only());
    let s = fs.statfs();
    assert_eq!(s.free_inodes, with_doomed.free_inodes + 1, "freed once read-write again");
    assert!(s.free_blocks > with_doomed.free_blocks);
    fs.write(f, 4, b"!").unwrap();
    let r = fs.check();
    assert!(r.is_clean(), "{:#?}", r.problems);
    fs.unmount().unwrap();

    let fs = common::mount_opts(&p, winefs::MountOptions { read_only: true, ..Default::default() });
    assert!(matches!(fs.set_read_only(false), Err(Error::ReadOnly)));
    assert!(fs.is_read_only());
    let mut buf = [0u8; 5];
    fs.read(f, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"kept!");
}

/// renameat2 with RENAME_WHITEOUT (what overlayfs asks of its upper layer): the name moves,
/// replacing what it lands on, and a whiteout — a character device 0:0 with mode 0, owned as
/// asked — takes the old name in the same transaction; not with RENAME_EXCHANGE.
#[test]
fn a_rename_can_leave_a_whiteout() {
    let (_d, p) = fresh(64 << 20);
    let fs = mount(&p);
    let root = fs.root();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let a = fs.create(root, b"a", 0o644, 0, 0).unwrap().ino;
    fs.write(a, 0, b"moved").unwrap();
    let old = fs.create(d, b"old", 0o644, 0, 0).unwrap().ino;
    let base = fs.statfs();
    let whiteout = |uid, gid| RenameFlags { whiteout: Some((uid, gid)), ..Default::default() };

    fs.rename(root, b"a", d, b"old", whiteout(1000, 100)).unwrap();
    let w = fs.lookup(root, b"a").unwrap();
    assert_eq!((w.kind, w.perm & 0o7777, w.rdev, w.nlink), (FileKind::CharDev, 0, 0, 1));
    assert_eq!((w.uid, w.gid), (1000, 100));
    assert_eq!(fs.lookup(d, b"old").unwrap().ino, a, "the file took the target's name");
    assert!(matches!(fs.getattr(old), Err(Error::Stale(_))), "the replaced file is freed");
    assert_eq!(fs.statfs().free_inodes, base.free_inodes, "one inode freed, one made");

    // A directory leaves one too; its parent's link count goes with it.
    let sub = fs.mkdir(root, b"sub", 0o755, 0, 0).unwrap().ino;
    let links = fs.getattr(root).unwrap().nlink;
    fs.rename(root, b"sub", d, b"sub", whiteout(0, 0)).unwrap();
    assert_eq!(fs.lookup(root, b"sub").unwrap().kind, FileKind::CharDev);
    assert_eq!(fs.lookup(d, b"sub").unwrap().ino, sub);
    assert_eq!(fs.getattr(root).unwrap().nlink, links - 1);

    let both = RenameFlags { exchange: true, whiteout: Some((0, 0)), ..Default::default() };
    assert!(matches!(fs.rename(d, b"old", d, b"sub", both), Err(Error::Invalid(_))));
    let noreplace = RenameFlags { noreplace: true, whiteout: Some((0, 0)), ..Default::default() };
    assert!(matches!(fs.rename(d, b"old", d, b"sub", noreplace), Err(Error::Exists)));
    assert_eq!(fs.lookup(d, b"old").unwrap().ino, a, "a refused rename changes nothing");
    let r = fs.check();
    assert!(r.is_clean(), "{:#?}", r.problems);
    fs.unmount().unwrap();
    let fs = mount(&p);
    assert_eq!(fs.lookup(root, b"a").unwrap().kind, FileKind::CharDev);
    let mut buf = [0u8; 5];
    fs.read(a, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"moved");
    let r = fs.check();
    assert!(r.is_clean(), "{:#?}", r.problems);
}

/// A mount turned read-only still unmounts cleanly: the unmount brings every alternate slot
/// home and saves the allocator (what it writes is the clean state, as ext4's read-only
/// remount writes it), and the data is all there at the next mount.
#[test]
fn a_mount_turned_read_only_unmounts_cleanly() {
    let (_d, p) = fresh(256 << 20);
    let fs = common::mount_with(&p, winefs::Consistency::Strict);
    let ino = fs.create_file("/hot").unwrap().ino();
    fs.fallocate(ino, 0, 8 << 20, false).unwrap();
    // Small strict overwrites go to alternate slots (live until written back).
    for round in 0..4u8 {
        for block in 0..64u64 {
            fs.write(ino, block * 4096, &[round.wrapping_add(block as u8); 4096]).unwrap();
        }
    }
    fs.set_read_only(true).unwrap();
    fs.unmount().expect("a read-only mount unmounts cleanly");
    let fs = mount(&p);
    assert!(fs.recovery_report().rolled_back.is_empty());
    let mut buf = [0u8; 4096];
    for block in 0..64u64 {
        fs.read(ino, block * 4096, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 3u8.wrapping_add(block as u8)), "block {block}");
    }
    let r = fs.check();
    assert!(r.is_clean(), "{:#?}", r.problems);
}
