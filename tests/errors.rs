//! Error handling: space and inode exhaustion, name limits, POSIX errors through the inode and
//! path APIs, corrupt or foreign pools (which must never be written), mkfs refusals, and
//! unlinked-but-open files.

mod common;

use common::mount;
use std::path::{Path, PathBuf};
use winefs::{Error, FileKind, Fs, MkfsOptions, MountOptions, RenameFlags};

fn fresh(size: u64, partitions: u32, inodes: Option<u64>) -> (tempfile::TempDir, PathBuf) {
    common::fresh_pool_with(&MkfsOptions {
        size: Some(size),
        partitions: Some(partitions),
        inodes,
        ..Default::default()
    })
}

/// Give the root directory its first block (directories keep their blocks), so a baseline
/// taken afterwards is what deleting everything returns to.
fn prime_root(fs: &Fs) {
    fs.create(fs.root(), b"primer", 0o644, 0, 0).unwrap();
    fs.unlink(fs.root(), b"primer").unwrap();
}

fn assert_clean(fs: &Fs, when: &str) -> winefs::state::fsck::Report {
    let r = fs.check();
    assert!(r.is_clean(), "{when}: fsck problems: {:#?}", r.problems);
    r
}

// ---------------------------------------------------------------------------------------------
// Space exhaustion.

#[test]
fn enospc_leaks_no_blocks_and_space_merges_back() {
    let (_d, p) = fresh(32 << 20, 1, None);
    let fs = mount(&p);
    prime_root(&fs);
    let s0 = fs.statfs();
    assert!(s0.free_aligned_extents > 0);
    let root = fs.root();
    let chunk: Vec<u8> = (0..(1 << 20) as u32).map(|i| (i % 253) as u8).collect();
    let mut files = Vec::new();
    let mut hit = false;
    'outer: for i in 0..1000 {
        let name = format!("f{i}");
        let a = match fs.create(root, name.as_bytes(), 0o644, 0, 0) {
            Ok(a) => a,
            Err(Error::NoSpace(_)) => {
                hit = true;
                break;
            }
            Err(e) => panic!("create {name}: {e}"),
        };
        files.push(name.clone());
        // Write a few chunks at different offsets (including one crossing 2 MiB).
        for (k, off) in [0u64, 1 << 20, (2 << 20) - 1000].into_iter().enumerate() {
            match fs.write(a.ino, off, &chunk) {
                Ok(n) if n == chunk.len() => {}
                Ok(n) => {
                    assert!(n < chunk.len(), "write {k} returned {n}");
                    hit = true;
                    break 'outer;
                }
                Err(Error::NoSpace(msg)) => {
                    assert!(!msg.is_empty());
                    hit = true;
                    break 'outer;
                }
                Err(e) => panic!("write {name}: {e}"),
            }
        }
    }
    assert!(hit, "a 32 MiB pool never ran out of space");
    // After the failure the file system is consistent and all space is accounted for.
    let r = assert_clean(&fs, "after ENOSPC");
    let s = fs.statfs();
    assert_eq!(
        r.free_blocks, s.free_blocks,
        "fsck's free count vs the allocator's"
    );
    assert_eq!(
        r.used_blocks + s.free_blocks,
        s.blocks,
        "used + free must equal the data area"
    );
    assert!(
        s.free_blocks < s0.free_blocks / 10,
        "pool should be nearly full: {} of {}",
        s.free_blocks,
        s0.free_blocks
    );

    // fallocate beyond the free space fails and changes nothing.
    let victim = fs.create(root, b"falloc", 0o644, 0, 0);
    if let Ok(v) = victim {
        let before = fs.statfs();
        let len = (before.free_blocks + 10) * 4096;
        match fs.fallocate(v.ino, 0, len, false) {
            Err(Error::NoSpace(_)) => {}
            other => panic!(
                "fallocate of {len} bytes with {} blocks free: {other:?}",
                before.free_blocks
            ),
        }
        let after = fs.statfs();
        assert_eq!(
            after.free_blocks, before.free_blocks,
            "a failed fallocate must not consume space"
        );
        let a = fs.getattr(v.ino).unwrap();
        assert_eq!((a.size, a.blocks), (0, 0));
        assert!(fs.extents(v.ino).unwrap().is_empty());
        fs.unlink(root, b"falloc").unwrap();
    }
    assert_clean(&fs, "after the failed fallocate");

    // Survives a remount in the full state too.
    fs.unmount().unwrap();
    let fs = mount(&p);
    assert_clean(&fs, "after remount of a full pool");
    for n in &files {
        fs.unlink(root, n.as_bytes()).unwrap();
    }
    let s2 = fs.statfs();
    assert_eq!(
        s2.free_blocks, s0.free_blocks,
        "free blocks after deleting everything"
    );
    assert_eq!(
        s2.free_inodes, s0.free_inodes,
        "free inodes after deleting everything"
    );
    assert_eq!(
        s2.free_aligned_extents, s0.free_aligned_extents,
        "space must merge back into aligned 2 MiB extents"
    );
    assert_clean(&fs, "after deleting everything");
    fs.unmount().unwrap();
    let fs = mount(&p);
    let s3 = fs.statfs();
    assert_eq!(
        (s3.free_blocks, s3.free_aligned_extents),
        (s0.free_blocks, s0.free_aligned_extents),
        "after remount"
    );
}

#[test]
fn fallocate_larger_than_free_space_on_empty_pool_changes_nothing() {
    let (_d, p) = fresh(32 << 20, 1, None);
    let fs = mount(&p);
    let a = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap();
    fs.write(a.ino, 0, b"keep me").unwrap();
    let before = fs.statfs();
    let err = fs
        .fallocate(a.ino, 4096, (before.free_blocks + 1) * 4096, false)
        .unwrap_err();
    assert!(matches!(err, Error::NoSpace(_)), "{err:?}");
    assert_eq!(err.errno(), libc::ENOSPC);
    assert_eq!(fs.statfs(), before);
    let at = fs.getattr(a.ino).unwrap();
    assert_eq!(at.size, 7);
    let mut buf = vec![0u8; 7];
    fs.read(a.ino, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"keep me");
    // One that fits succeeds and extends the size.
    fs.fallocate(a.ino, 4096, 3 << 20, false).unwrap();
    assert_eq!(fs.getattr(a.ino).unwrap().size, 4096 + (3 << 20));
    assert_clean(&fs, "after fallocate");
}

#[test]
fn inode_exhaustion_gives_nospace() {
    let (_d, p) = fresh(32 << 20, 1, Some(64));
    let fs = mount(&p);
    let s0 = fs.statfs();
    assert_eq!(s0.inodes, 64);
    let root = fs.root();
    let mut made = 0u64;
    let err = loop {
        match fs.create(root, format!("f{made}").as_bytes(), 0o644, 0, 0) {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
        assert!(made <= 64, "created more files than there are inodes");
    };
    assert!(
        matches!(err, Error::NoSpace(ref m) if m.contains("inode")),
        "{err:?}"
    );
    assert_eq!(made, s0.free_inodes, "every free inode was usable");
    assert_eq!(fs.statfs().free_inodes, 0);
    // A taken name is EEXIST even with no inode free: Linux looks the name up first.
    assert!(matches!(fs.create(root, b"f1", 0o644, 0, 0), Err(Error::Exists)));
    // mkdir and symlink fail the same way, and nothing leaks.
    let blocks = fs.statfs().free_blocks;
    assert!(matches!(
        fs.mkdir(root, b"dir", 0o755, 0, 0),
        Err(Error::NoSpace(_))
    ));
    assert!(matches!(
        fs.symlink(root, b"sym", b"target", 0, 0),
        Err(Error::NoSpace(_))
    ));
    assert_eq!(fs.statfs().free_blocks, blocks);
    assert!(matches!(fs.lookup(root, b"dir"), Err(Error::NotFound)));
    assert_clean(&fs, "after inode exhaustion");
    // Freeing one makes room for exactly one.
    fs.unlink(root, b"f0").unwrap();
    fs.mkdir(root, b"dir", 0o755, 0, 0).unwrap();
    assert!(matches!(
        fs.create(root, b"again", 0o644, 0, 0),
        Err(Error::NoSpace(_))
    ));
    assert_clean(&fs, "after reuse");
    fs.unmount().unwrap();
    let fs = mount(&p);
    assert_eq!(fs.statfs().free_inodes, 0);
    assert_clean(&fs, "after remount");
}

// ---------------------------------------------------------------------------------------------
// Names.

#[test]
fn name_limits() {
    let (_d, p) = fresh(32 << 20, 1, None);
    let fs = mount(&p);
    let root = fs.root();
    let n255 = vec![b'n'; 255];
    let n256 = vec![b'n'; 256];
    fs.create(root, &n255, 0o644, 0, 0).unwrap();
    assert_eq!(fs.lookup(root, &n255).unwrap().kind, FileKind::File);
    assert!(matches!(
        fs.create(root, &n256, 0o644, 0, 0),
        Err(Error::NameTooLong(256))
    ));
    assert!(matches!(
        fs.mkdir(root, &n256, 0o755, 0, 0),
        Err(Error::NameTooLong(256))
    ));
    assert!(matches!(
        fs.lookup(root, &n256),
        Err(Error::NameTooLong(256))
    ));
    let e = fs
        .rename(root, &n255, root, &n256, RenameFlags::default())
        .unwrap_err();
    assert!(matches!(e, Error::NameTooLong(256)), "{e:?}");
    assert_eq!(e.errno(), libc::ENAMETOOLONG);
    assert!(e.to_string().contains("256"), "{e}");
    let ino = fs.lookup(root, &n255).unwrap().ino;
    assert!(matches!(
        fs.link(ino, root, &n256),
        Err(Error::NameTooLong(256))
    ));
    // The path API too.
    let long_path = format!("/{}", "p".repeat(256));
    assert!(matches!(
        fs.mkdir_path(&long_path),
        Err(Error::NameTooLong(256))
    ));
    assert!(matches!(
        fs.stat_path(&long_path),
        Err(Error::NameTooLong(256))
    ));
    // Symlink targets: 4095 bytes fit, 4096 do not.
    let t4095 = vec![b't'; 4095];
    let s = fs.symlink(root, b"ok", &t4095, 0, 0).unwrap();
    assert_eq!(fs.readlink(s.ino).unwrap(), t4095);
    assert!(matches!(
        fs.symlink(root, b"toolong", &vec![b't'; 4096], 0, 0),
        Err(Error::NameTooLong(4096))
    ));
    assert!(matches!(fs.lookup(root, b"toolong"), Err(Error::NotFound)));
    // '/' and NUL are invalid in a name.
    for bad in [&b"a/b"[..], b"x\0y"] {
        match fs.create(root, bad, 0o644, 0, 0) {
            Err(Error::Invalid(m)) => assert!(m.contains("'/'"), "{m}"),
            other => panic!("create {bad:?}: {other:?}"),
        }
    }
    assert!(matches!(
        fs.mkdir(root, b"a/b", 0o755, 0, 0),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        fs.symlink(root, b"a/b", b"t", 0, 0),
        Err(Error::Invalid(_))
    ));
    // "." and ".." cannot be created.
    assert!(matches!(
        fs.create(root, b".", 0o644, 0, 0),
        Err(Error::Exists)
    ));
    assert!(matches!(
        fs.mkdir(root, b"..", 0o755, 0, 0),
        Err(Error::Exists)
    ));
    assert_clean(&fs, "after name tests");
    fs.unmount().unwrap();
    let fs = mount(&p);
    assert_eq!(fs.lookup(fs.root(), &n255).unwrap().kind, FileKind::File);
    assert_eq!(
        fs.readlink(fs.resolve("/ok", false).unwrap())
            .unwrap()
            .len(),
        4095
    );
}

// ---------------------------------------------------------------------------------------------
// POSIX errors through both APIs.

#[test]
fn posix_errors_inode_and_path_apis() {
    let (_d, p) = fresh(32 << 20, 1, None);
    let fs = mount(&p);
    let root = fs.root();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let e = fs.mkdir(root, b"e", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    fs.create(d, b"inner", 0o644, 0, 0).unwrap();

    // ENOENT
    assert!(matches!(fs.lookup(root, b"missing"), Err(Error::NotFound)));
    assert!(matches!(fs.unlink(root, b"missing"), Err(Error::NotFound)));
    assert!(matches!(fs.rmdir(root, b"missing"), Err(Error::NotFound)));
    assert!(matches!(
        fs.rename(root, b"missing", root, b"x", RenameFlags::default()),
        Err(Error::NotFound)
    ));
    assert!(matches!(
        fs.resolve("/missing/x", true),
        Err(Error::NotFound)
    ));
    assert!(matches!(fs.stat_path("/d/missing"), Err(Error::NotFound)));
    assert!(matches!(fs.open_file("/missing"), Err(Error::NotFound)));
    assert!(matches!(fs.unlink_path("/missing"), Err(Error::NotFound)));
    assert!(matches!(fs.rmdir_path("/missing"), Err(Error::NotFound)));
    assert!(matches!(
        fs.rename_path("/missing", "/x"),
        Err(Error::NotFound)
    ));
    assert!(matches!(fs.create_file("/missing/x"), Err(Error::NotFound)));
    assert!(matches!(fs.mkdir_path("/missing/x"), Err(Error::NotFound)));
    assert!(matches!(fs.list_dir("/missing"), Err(Error::NotFound)));
    assert!(matches!(fs.getxattr(f, b"user.none"), Err(Error::NoAttr)));
    assert!(matches!(
        fs.removexattr(f, b"user.none"),
        Err(Error::NoAttr)
    ));
    assert_eq!(
        fs.getxattr(f, b"user.none").unwrap_err().errno(),
        libc::ENODATA
    );

    // EEXIST
    assert!(matches!(
        fs.create(root, b"f", 0o644, 0, 0),
        Err(Error::Exists)
    ));
    assert!(matches!(
        fs.mkdir(root, b"f", 0o755, 0, 0),
        Err(Error::Exists)
    ));
    assert!(matches!(
        fs.mkdir(root, b"d", 0o755, 0, 0),
        Err(Error::Exists)
    ));
    assert!(matches!(
        fs.symlink(root, b"d", b"t", 0, 0),
        Err(Error::Exists)
    ));
    assert!(matches!(fs.link(f, root, b"d"), Err(Error::Exists)));
    assert!(matches!(fs.create_file("/f"), Err(Error::Exists)));
    assert!(matches!(fs.mkdir_path("/d"), Err(Error::Exists)));
    assert_eq!(
        fs.create(root, b"f", 0o644, 0, 0).unwrap_err().errno(),
        libc::EEXIST
    );

    // ENOTEMPTY
    assert!(matches!(fs.rmdir(root, b"d"), Err(Error::NotEmpty)));
    assert!(matches!(fs.rmdir_path("/d"), Err(Error::NotEmpty)));
    assert!(matches!(
        fs.rename(root, b"e", root, b"d", RenameFlags::default()),
        Err(Error::NotEmpty)
    ));
    assert!(matches!(fs.rename_path("/e", "/d"), Err(Error::NotEmpty)));

    // EISDIR
    assert!(matches!(fs.unlink(root, b"d"), Err(Error::IsDir)));
    assert!(matches!(fs.unlink_path("/d"), Err(Error::IsDir)));
    assert!(matches!(fs.open_file("/d"), Err(Error::IsDir)));
    assert!(matches!(fs.write(d, 0, b"x"), Err(Error::IsDir)));
    assert!(matches!(fs.read(d, 0, &mut [0u8; 4]), Err(Error::IsDir)));
    assert!(matches!(fs.truncate(d, 0), Err(Error::IsDir)));
    assert!(matches!(
        fs.rename(root, b"f", root, b"e", RenameFlags::default()),
        Err(Error::IsDir)
    ));
    assert!(matches!(fs.rename_path("/f", "/e"), Err(Error::IsDir)));

    // ENOTDIR
    assert!(matches!(fs.rmdir(root, b"f"), Err(Error::NotDir)));
    assert!(matches!(fs.rmdir_path("/f"), Err(Error::NotDir)));
    assert!(matches!(
        fs.create(f, b"x", 0o644, 0, 0),
        Err(Error::NotDir)
    ));
    assert!(matches!(fs.lookup(f, b"x"), Err(Error::NotDir)));
    assert!(matches!(fs.readdir(f, 0), Err(Error::NotDir)));
    assert!(matches!(fs.resolve("/f/x", true), Err(Error::NotDir)));
    assert!(matches!(fs.stat_path("/f/x"), Err(Error::NotDir)));
    assert!(matches!(fs.create_file("/f/x"), Err(Error::NotDir)));
    assert!(matches!(fs.list_dir("/f"), Err(Error::NotDir)));
    assert!(matches!(
        fs.rename(root, b"e", root, b"f", RenameFlags::default()),
        Err(Error::NotDir)
    ));
    assert!(matches!(fs.rename_path("/e", "/f"), Err(Error::NotDir)));

    // EPERM / EINVAL
    assert!(matches!(
        fs.link(d, root, b"dlink"),
        Err(Error::NotPermitted(_))
    ));
    assert!(matches!(
        fs.rename(root, b"d", d, b"sub", RenameFlags::default()),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        fs.rename_path("/d", "/d/sub"),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(fs.readlink(f), Err(Error::Invalid(_))));
    assert!(matches!(
        fs.fallocate(f, 0, 0, false),
        Err(Error::Invalid(_))
    ));

    // RENAME_NOREPLACE onto an existing name.
    let noreplace = RenameFlags {
        whiteout: None,
        noreplace: true,
        exchange: false,
    };
    assert!(matches!(
        fs.rename(root, b"f", d, b"inner", noreplace),
        Err(Error::Exists)
    ));
    assert!(matches!(
        fs.rename(root, b"e", root, b"d", noreplace),
        Err(Error::Exists)
    ));
    assert!(matches!(
        fs.rename(
            root,
            b"f",
            root,
            b"f2",
            RenameFlags {
                whiteout: None,
                noreplace: true,
                exchange: true
            }
        ),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        fs.rename(
            root,
            b"f",
            root,
            b"nope",
            RenameFlags {
                whiteout: None,
                noreplace: false,
                exchange: true
            }
        ),
        Err(Error::NotFound)
    ));
    fs.rename(root, b"f", root, b"f2", noreplace).unwrap();
    fs.rename(root, b"f2", root, b"f", noreplace).unwrap();
    assert_eq!(fs.lookup(root, b"f").unwrap().ino, f);

    // Nothing changed through all of that.
    let mut names = fs.list_dir("/").unwrap();
    names.sort();
    assert_eq!(names, vec![b"d".to_vec(), b"e".to_vec(), b"f".to_vec()]);
    assert_eq!(fs.getattr(root).unwrap().nlink, 4);
    assert_eq!(fs.getattr(f).unwrap().nlink, 1);
    assert_eq!(fs.getattr(e).unwrap().nlink, 2);
    assert_clean(&fs, "after the error tests");
}

#[test]
fn rename_exchange_file_and_dir_across_directories() {
    let (_d, p) = fresh(32 << 20, 1, None);
    let fs = mount(&p);
    let root = fs.root();
    let a = fs.mkdir(root, b"A", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(root, b"B", 0o755, 0, 0).unwrap().ino;
    let file = fs.create(a, b"file", 0o644, 0, 0).unwrap().ino;
    fs.write(file, 0, b"payload").unwrap();
    let dir = fs.mkdir(b, b"dir", 0o755, 0, 0).unwrap().ino;
    fs.create(dir, b"child", 0o644, 0, 0).unwrap();
    assert_eq!(fs.getattr(a).unwrap().nlink, 2);
    assert_eq!(fs.getattr(b).unwrap().nlink, 3);

    fs.rename(
        a,
        b"file",
        b,
        b"dir",
        RenameFlags {
            whiteout: None,
            noreplace: false,
            exchange: true,
        },
    )
    .unwrap();
    // A/file is now the directory, B/dir is now the file.
    assert_eq!(fs.lookup(a, b"file").unwrap().ino, dir);
    assert_eq!(fs.lookup(b, b"dir").unwrap().ino, file);
    assert_eq!(fs.getattr(a).unwrap().nlink, 3, "A gained a subdirectory");
    assert_eq!(fs.getattr(b).unwrap().nlink, 2, "B lost its subdirectory");
    assert_eq!(
        fs.lookup(dir, b"..").unwrap().ino,
        a,
        "the moved directory's parent"
    );
    assert_eq!(fs.stat_path("/A/file/child").unwrap().kind, FileKind::File);
    assert_eq!(
        fs.open_file("/B/dir").unwrap().read_all().unwrap(),
        b"payload"
    );
    let ents = fs.readdir(a, 0).unwrap();
    assert!(
        ents.iter()
            .any(|e| e.name == b"file" && e.kind == FileKind::Dir),
        "dirent kind updated: {ents:?}"
    );
    assert_clean(&fs, "after exchange");
    fs.unmount().unwrap();
    let fs = mount(&p);
    assert_clean(&fs, "after exchange + remount");
    assert_eq!(fs.getattr(a).unwrap().nlink, 3);
    assert_eq!(fs.getattr(b).unwrap().nlink, 2);
    assert_eq!(fs.lookup(dir, b"..").unwrap().ino, a);
    // And back.
    fs.rename(
        a,
        b"file",
        b,
        b"dir",
        RenameFlags {
            whiteout: None,
            noreplace: false,
            exchange: true,
        },
    )
    .unwrap();
    assert_eq!(fs.lookup(a, b"file").unwrap().ino, file);
    assert_eq!(
        (fs.getattr(a).unwrap().nlink, fs.getattr(b).unwrap().nlink),
        (2, 3)
    );
    assert_clean(&fs, "after exchanging back");
}

// ---------------------------------------------------------------------------------------------
// Corrupt and foreign pools: mount must fail precisely and must not write a byte.

fn mount_err(p: &Path) -> Error {
    match Fs::mount(p, MountOptions::default()) {
        Ok(_) => panic!("mounting {} succeeded", p.display()),
        Err(e) => e,
    }
}

/// Apply `damage` to a fresh pool, mount it, and check the pool is byte-for-byte unchanged.
fn damaged(damage: impl FnOnce(&mut Vec<u8>)) -> (tempfile::TempDir, Error) {
    let (d, p) = fresh(16 << 20, 1, None);
    let mut bytes = std::fs::read(&p).unwrap();
    damage(&mut bytes);
    std::fs::write(&p, &bytes).unwrap();
    let e = mount_err(&p);
    let private = Fs::mount(
        &p,
        MountOptions {
            private: true,
            ..Default::default()
        },
    );
    assert!(
        private.is_err(),
        "a private mount of a damaged pool succeeded"
    );
    let after = std::fs::read(&p).unwrap();
    assert!(after == bytes, "a failed mount wrote to the pool ({e})");
    (d, e)
}

#[test]
fn corrupt_superblock_checksum() {
    let (_d, e) = damaged(|b| b[24] ^= 0x40);
    assert!(
        matches!(e, Error::Corrupted(ref m) if m.contains("checksum")),
        "{e:?}"
    );
    assert_eq!(e.errno(), libc::EIO);
    // Every byte of the checksummed area is covered.
    for off in [8usize + 4, 16, 40, 96, 112, 119] {
        let (_d, e) = damaged(|b| b[off] ^= 1);
        assert!(
            matches!(e, Error::Corrupted(ref m) if m.contains("checksum")),
            "byte {off}: {e:?}"
        );
    }
}

#[test]
fn foreign_magic() {
    let (_d, e) = damaged(|b| b[..8].copy_from_slice(b"XXXXXXXX"));
    assert!(
        matches!(e, Error::Foreign(ref m) if m.contains("magic")),
        "{e:?}"
    );
    assert!(e.to_string().contains("not a winefs pool"), "{e}");
}

#[test]
fn wrong_version() {
    // A pool of the previous format (extent-index blocks and directory headers without
    // checksums).
    let (_d, e) = damaged(|b| b[8..12].copy_from_slice(&2u32.to_le_bytes()));
    assert!(
        matches!(
            e,
            Error::Version {
                found: 2,
                supported: 3
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("version 2"), "{e}");
}

#[test]
fn random_bytes_are_foreign() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("random");
    // A deterministic xorshift stream (no dependency needed).
    let mut x = 0x9e3779b97f4a7c15u64;
    let bytes: Vec<u8> = (0..(4 << 20))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&p, &bytes).unwrap();
    let e = mount_err(&p);
    assert!(
        matches!(e, Error::Foreign(ref m) if m.contains("magic")),
        "{e:?}"
    );
    assert!(
        std::fs::read(&p).unwrap() == bytes,
        "mount wrote to a foreign file"
    );
    // A tiny file: too small to be a pool at all.
    let small = d.path().join("small");
    std::fs::write(&small, b"hello").unwrap();
    let e = mount_err(&small);
    assert!(
        matches!(e, Error::PoolTooSmall { size: 5, .. } | Error::Foreign(_)),
        "{e:?}"
    );
    assert_eq!(std::fs::read(&small).unwrap(), b"hello");
}

#[test]
fn missing_pool_is_io_error_with_path() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("no-such-pool");
    let e = mount_err(&p);
    match &e {
        Error::Io { source, .. } => assert_eq!(source.kind(), std::io::ErrorKind::NotFound),
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains(&p.display().to_string()), "{e}");
    assert_eq!(e.errno(), libc::ENOENT);
    assert!(!p.exists(), "mount created the missing pool");
}

#[test]
fn truncated_pool() {
    let (_d, e) = damaged(|b| {
        let half = b.len() / 2;
        b.truncate(half)
    });
    assert!(
        matches!(e, Error::Corrupted(ref m) if m.contains("truncated")),
        "{e:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// mkfs refusals.

#[test]
fn mkfs_refuses_existing_pool_without_force() {
    let (_d, p) = fresh(16 << 20, 1, None);
    {
        let fs = mount(&p);
        fs.create(fs.root(), b"precious", 0o644, 0, 0).unwrap();
        fs.unmount().unwrap();
    }
    let before = std::fs::read(&p).unwrap();
    let e = Fs::mkfs(
        &p,
        &MkfsOptions {
            size: Some(16 << 20),
            partitions: Some(1),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::Invalid(ref m) if m.contains("--force") && m.contains("winefs")),
        "{e:?}"
    );
    assert!(
        std::fs::read(&p).unwrap() == before,
        "refused mkfs changed the pool"
    );
    // A plain existing file is refused as well.
    let other = p.with_file_name("other");
    std::fs::write(&other, vec![7u8; 8 << 20]).unwrap();
    let e = Fs::mkfs(
        &other,
        &MkfsOptions {
            size: Some(16 << 20),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::Invalid(ref m) if m.contains("--force")),
        "{e:?}"
    );
    assert_eq!(std::fs::metadata(&other).unwrap().len(), 8 << 20);
    // With force, it is formatted and the old contents are gone.
    Fs::mkfs(
        &p,
        &MkfsOptions {
            size: Some(16 << 20),
            partitions: Some(1),
            force: true,
            ..Default::default()
        },
    )
    .unwrap();
    let fs = mount(&p);
    assert!(matches!(
        fs.lookup(fs.root(), b"precious"),
        Err(Error::NotFound)
    ));
    assert_clean(&fs, "after forced mkfs");
}

#[test]
fn mkfs_too_small() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("tiny");
    let e = Fs::mkfs(
        &p,
        &MkfsOptions {
            size: Some(1 << 20),
            partitions: Some(1),
            ..Default::default()
        },
    )
    .unwrap_err();
    match e {
        Error::PoolTooSmall { size, min } => {
            assert_eq!(size, 1 << 20);
            assert!(min > size, "min {min}");
        }
        other => panic!("{other:?}"),
    }
    // The refused size was checked before anything was created.
    assert!(!p.exists(), "a refused mkfs left {} behind", p.display());
    // No size for a missing file.
    let q = d.path().join("nosize");
    let e = Fs::mkfs(&q, &MkfsOptions::default()).unwrap_err();
    assert!(
        matches!(e, Error::Invalid(ref m) if m.contains("size")),
        "{e:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Unlinked-but-open files.

#[test]
fn unlinked_open_file_lives_until_dropped() {
    let (_d, p) = fresh(32 << 20, 1, None);
    let fs = mount(&p);
    prime_root(&fs);
    let base = fs.statfs();
    let mut f = fs.create_file("/victim").unwrap();
    let data = vec![0xabu8; 3 << 20];
    assert_eq!(f.write_at(0, &data).unwrap(), data.len());
    let used = fs.statfs().free_blocks;
    assert!(used < base.free_blocks);
    fs.unlink_path("/victim").unwrap();
    assert!(matches!(fs.stat_path("/victim"), Err(Error::NotFound)));
    // Still usable through the handle.
    assert_eq!(f.metadata().unwrap().nlink, 0);
    assert!(f.read_all().unwrap() == data);
    f.append(b"tail").unwrap();
    f.write_at(5, b"hello").unwrap();
    let all = f.read_all().unwrap();
    assert_eq!(all.len(), data.len() + 4);
    assert_eq!(&all[5..10], b"hello");
    // Cannot be linked back (like Linux without O_TMPFILE).
    assert!(matches!(
        fs.link(f.ino(), fs.root(), b"back"),
        Err(Error::NotFound)
    ));
    assert!(fs.statfs().free_blocks < base.free_blocks);
    assert_clean(&fs, "while unlinked and open");
    let ino = f.ino();
    drop(f);
    let s = fs.statfs();
    assert_eq!(
        s.free_blocks, base.free_blocks,
        "blocks freed at the last close"
    );
    assert_eq!(
        s.free_inodes, base.free_inodes,
        "inode freed at the last close"
    );
    assert!(matches!(fs.getattr(ino), Err(Error::Stale(_))));
    assert_clean(&fs, "after the last close");
}

#[test]
fn orphan_freed_at_next_mount() {
    let (_d, p) = fresh(32 << 20, 1, None);
    let base = {
        let fs = mount(&p);
        prime_root(&fs);
        let s = fs.statfs();
        fs.unmount().unwrap();
        s
    };
    {
        let fs = mount(&p);
        let root = fs.root();
        let ino = fs.create(root, b"orphan", 0o644, 0, 0).unwrap().ino;
        fs.open(ino).unwrap();
        fs.write(ino, 0, &vec![1u8; 5 << 20]).unwrap();
        fs.setxattr(ino, b"user.x", b"y", Default::default())
            .unwrap();
        fs.unlink_path("/orphan").unwrap();
        // A file made without a name (O_TMPFILE), written and synced: an orphan too.
        let unnamed = fs.create_unnamed(root, 0o600, 0, 0, true).unwrap().ino;
        fs.write(unnamed, 0, &vec![3u8; 3 << 20]).unwrap();
        fs.fsync(unnamed).unwrap();
        assert!(fs.statfs().free_blocks < base.free_blocks);
        // The open handles are never released and the pool never unmounted, as in a crash:
        // the orphans are still in use on media.
        drop(fs);
    }
    let fs = mount(&p);
    let s = fs.statfs();
    assert_eq!(
        s.free_blocks, base.free_blocks,
        "orphan's blocks freed at mount"
    );
    assert_eq!(
        s.free_inodes, base.free_inodes,
        "orphan's inode freed at mount"
    );
    assert_eq!(s.free_aligned_extents, base.free_aligned_extents);
    assert!(fs.list_dir("/").unwrap().is_empty());
    assert_clean(&fs, "after orphan cleanup");
    fs.unmount().unwrap();
    let fs = mount(&p);
    assert_eq!(fs.statfs().free_blocks, base.free_blocks);
    assert_clean(&fs, "after a second remount");
}

/// A file made without a name (open(2) with `O_TMPFILE`): a link gives it its first name, or
/// its release frees it; made unlinkable (`O_EXCL`), or named and unlinked again, no link
/// takes it (ENOENT, as Linux answers).
#[test]
fn unnamed_file_is_named_by_a_link_or_goes_at_its_release() {
    let (_d, p) = fresh(32 << 20, 1, None);
    let fs = mount(&p);
    prime_root(&fs);
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    let data = vec![0x5au8; 3 << 20];
    let base = fs.statfs();
    let dir_before = fs.getattr(d).unwrap();

    let a = fs.create_unnamed(d, 0o640, 7, 8, true).unwrap();
    assert_eq!((a.kind, a.perm, a.nlink, a.uid, a.gid), (FileKind::File, 0o640, 0, 7, 8));
    fs.write(a.ino, 0, &data).unwrap();
    assert!(fs.list_dir("/d").unwrap().is_empty(), "named by nothing yet");
    let dir_after = fs.getattr(d).unwrap();
    assert_eq!((dir_after.mtime, dir_after.ctime), (dir_before.mtime, dir_before.ctime));
    assert_eq!(fs.link(a.ino, d, b"named").unwrap().nlink, 1);
    fs.release(a.ino).unwrap();
    let mut back = vec![0u8; data.len()];
    assert_eq!(fs.read(a.ino, 0, &mut back).unwrap(), data.len());
    assert!(back == data, "named: kept after its release");
    assert_eq!(fs.lookup(d, b"named").unwrap().ino, a.ino);

    let b = fs.create_unnamed(d, 0o600, 0, 0, true).unwrap();
    fs.write(b.ino, 0, &data).unwrap();
    fs.release(b.ino).unwrap();
    assert!(matches!(fs.getattr(b.ino), Err(Error::Stale(_))), "released unnamed: gone");

    let c = fs.create_unnamed(d, 0o600, 0, 0, false).unwrap();
    assert!(matches!(fs.link(c.ino, d, b"never"), Err(Error::NotFound)));
    fs.release(c.ino).unwrap();

    let e = fs.create_unnamed(d, 0o600, 0, 0, true).unwrap();
    fs.link(e.ino, d, b"briefly").unwrap();
    fs.unlink(d, b"briefly").unwrap();
    assert!(matches!(fs.link(e.ino, d, b"again"), Err(Error::NotFound)));
    fs.release(e.ino).unwrap();

    // Made for a directory with the alignment hint, it inherits the hint as a named file does.
    fs.setxattr(d, b"user.winefs.hugepage", b"1", Default::default()).unwrap();
    let h = fs.create_unnamed(d, 0o600, 0, 0, true).unwrap();
    assert!(fs.getxattr(h.ino, b"user.winefs.hugepage").is_ok(), "hint not inherited");
    fs.release(h.ino).unwrap();
    fs.removexattr(d, b"user.winefs.hugepage").unwrap();

    let f = fs.create(d, b"plain", 0o644, 0, 0).unwrap().ino;
    assert!(matches!(fs.create_unnamed(f, 0o600, 0, 0, true), Err(Error::NotDir)));
    let s = fs.statfs();
    assert_eq!(s.free_inodes, base.free_inodes - 2, "only the named file and plain remain");
    assert_eq!(fs.list_dir("/d").unwrap().len(), 2);
    assert_clean(&fs, "after unnamed files came and went");
}

// ---------------------------------------------------------------------------------------------
// Errno order where two checks apply (regressions: each once differed from Linux).

#[test]
fn link_dir_onto_existing_name_is_eexist() {
    let (_d, p) = fresh(32 << 20, 1, None);
    let fs = mount(&p);
    let root = fs.root();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    fs.create(root, b"f", 0o644, 0, 0).unwrap();
    let e = fs.link(d, root, b"f").unwrap_err();
    assert_eq!(e.errno(), libc::EEXIST, "{e:?}");
}

#[test]
fn rename_onto_own_ancestor_is_enotempty() {
    let (_d, p) = fresh(32 << 20, 1, None);
    let fs = mount(&p);
    fs.mkdir_path("/d").unwrap();
    fs.create_file("/d/a").unwrap();
    // rename("d/a", "d") on Linux/tmpfs fails with ENOTEMPTY (target is an ancestor of the source).
    let e = fs.rename_path("/d/a", "/d").unwrap_err();
    assert_eq!(e.errno(), libc::ENOTEMPTY, "{e:?}");
}

#[test]
fn rename_dir_into_own_subtree_over_file_is_einval() {
    let (_d, p) = fresh(32 << 20, 1, None);
    let fs = mount(&p);
    fs.mkdir_path("/d").unwrap();
    fs.create_file("/d/b").unwrap();
    // rename("d", "d/b") on Linux/tmpfs fails with EINVAL (source is an ancestor of the target).
    let e = fs.rename_path("/d", "/d/b").unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e:?}");
}

#[test]
fn path_helpers_refuse_a_non_directory_parent() {
    let (_d, p) = fresh(32 << 20, 1, None);
    let fs = mount(&p);
    fs.create_file("/file").unwrap();
    // Linux: rename("missing", "file/x") fails with ENOTDIR (both parents are walked first).
    let e = fs.rename_path("/missing", "/file/x").unwrap_err();
    assert!(matches!(e, Error::NotDir), "{e:?}");
}
