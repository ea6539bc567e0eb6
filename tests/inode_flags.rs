//! The inode flags `chattr` sets (immutable, append-only, no-dump, no-atime) through the
//! library: every change Linux refuses on such an inode is EPERM, what it allows still works,
//! the flags persist across a remount and pass to new files as ext4 passes them.

mod common;

use common::{fresh_pool, mount, mount_opts};
use winefs::{Error, Fs, MountOptions, RenameFlags, SetAttr, TimeSet, XattrSet};

const IMMUTABLE: u32 = 0x10;
const APPEND: u32 = 0x20;
const NODUMP: u32 = 0x40;
const NOATIME: u32 = 0x80;

fn eperm<T: std::fmt::Debug>(r: Result<T, Error>, what: &str) {
    match r {
        Err(e) => assert_eq!(e.errno(), libc::EPERM, "{what}: {e}"),
        Ok(v) => panic!("{what} was allowed: {v:?}"),
    }
}

fn file(fs: &Fs, dir: u64, name: &str, data: &[u8]) -> u64 {
    let ino = fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
    fs.write(ino, 0, data).unwrap();
    ino
}

#[test]
fn an_immutable_file_refuses_every_change_until_the_flag_goes() {
    let (_d, pool) = fresh_pool(64 << 20, None);
    let fs = mount(&pool);
    let root = fs.root();
    let f = file(&fs, root, "f", b"kept");
    let other = file(&fs, root, "other", b"o");
    let ctime = fs.getattr(f).unwrap().ctime;
    assert_eq!(fs.inode_flags(f).unwrap(), 0);
    fs.set_inode_flags(f, IMMUTABLE).unwrap();
    assert_eq!(fs.inode_flags(f).unwrap(), IMMUTABLE);
    assert!(fs.getattr(f).unwrap().ctime >= ctime);
    eperm(fs.write(f, 0, b"x"), "overwrite");
    eperm(fs.append(f, b"x"), "append");
    eperm(fs.truncate(f, 0), "truncate");
    eperm(fs.fallocate(f, 0, 4096, true), "fallocate");
    eperm(fs.punch_hole(f, 0, 4096), "punch hole");
    eperm(fs.zero_range(f, 0, 4096, true), "zero range");
    eperm(fs.collapse_range(f, 0, 4096), "collapse range");
    eperm(fs.insert_range(f, 0, 4096), "insert range");
    let chmod = SetAttr { mode: Some(0o600), ..Default::default() };
    eperm(fs.setattr(f, &chmod), "chmod");
    let touch = SetAttr { mtime: Some(TimeSet::Now), ..Default::default() };
    eperm(fs.setattr(f, &touch), "touch");
    let changed = SetAttr { touch: true, ..Default::default() };
    eperm(fs.setattr(f, &changed), "chown(f, -1, -1)");
    eperm(fs.setxattr(f, b"user.a", b"1", XattrSet::Any), "setxattr");
    eperm(fs.removexattr(f, b"user.a"), "removexattr");
    eperm(fs.unlink(root, b"f"), "unlink");
    eperm(fs.rename(root, b"f", root, b"g", RenameFlags::default()), "rename");
    eperm(fs.rename(root, b"other", root, b"f", RenameFlags::default()), "rename over it");
    eperm(fs.link(f, root, b"h"), "link");
    eperm(fs.open_inode(f).and_then(|h| h.mmap(0, 4096)).map(drop), "mmap");
    eperm(fs.lease(f, 0, 4096, false), "a direct-path lease");
    for flags in [libc::O_WRONLY, libc::O_RDWR | libc::O_APPEND, libc::O_RDONLY | libc::O_TRUNC] {
        eperm(fs.check_open(f, flags), "open for writing");
    }
    fs.check_open(f, libc::O_RDONLY).unwrap();
    let mut buf = [0u8; 4];
    assert_eq!(fs.read(f, 0, &mut buf).unwrap(), 4);
    assert_eq!(&buf, b"kept");
    assert_eq!(fs.lookup(root, b"other").unwrap().ino, other);
    // Flags winefs does not keep are refused as ext4 refuses them.
    assert_eq!(fs.set_inode_flags(f, IMMUTABLE | 0x4).unwrap_err().errno(), libc::EOPNOTSUPP);
    assert_eq!(fs.inode_flags(f).unwrap(), IMMUTABLE);
    // The flag is on media: a remount keeps refusing.
    fs.unmount().unwrap();
    let fs = mount(&pool);
    assert_eq!(fs.inode_flags(f).unwrap(), IMMUTABLE);
    eperm(fs.write(f, 0, b"x"), "overwrite after a remount");
    fs.set_inode_flags(f, 0).unwrap();
    fs.write(f, 0, b"K").unwrap();
    fs.unlink(root, b"f").unwrap();
    assert!(fs.check().problems.is_empty());
}

#[test]
fn an_append_only_file_grows_at_its_end_and_nothing_else() {
    let (_d, pool) = fresh_pool(64 << 20, None);
    let fs = mount(&pool);
    let root = fs.root();
    let f = file(&fs, root, "log", b"one\n");
    fs.set_inode_flags(f, APPEND).unwrap();
    fs.append(f, b"two\n").unwrap();
    fs.write(f, 8, b"three\n").unwrap();
    fs.fallocate(f, 0, 1 << 20, true).unwrap();
    let touch = SetAttr { atime: Some(TimeSet::Now), mtime: Some(TimeSet::Now), ..Default::default() };
    fs.setattr(f, &touch).unwrap();
    // chown(f, -1, -1): a new ctime, nothing else.
    let before = fs.getattr(f).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let after = fs.setattr(f, &SetAttr { touch: true, ..Default::default() }).unwrap();
    assert!(after.ctime > before.ctime, "ctime changed");
    assert_eq!((after.mtime, after.atime, after.perm), (before.mtime, before.atime, before.perm));
    eperm(fs.write(f, 0, b"ONE"), "overwrite");
    eperm(fs.truncate(f, 4), "truncate");
    eperm(fs.punch_hole(f, 0, 4096), "punch hole");
    let back = SetAttr { mtime: Some(TimeSet::At(0)), ..Default::default() };
    eperm(fs.setattr(f, &back), "times set to a given value");
    eperm(fs.setxattr(f, b"user.a", b"1", XattrSet::Any), "setxattr");
    eperm(fs.unlink(root, b"log"), "unlink");
    eperm(fs.link(f, root, b"log2"), "link");
    eperm(fs.open_inode(f).and_then(|h| h.mmap(0, 4096)).map(drop), "mmap");
    eperm(fs.check_open(f, libc::O_WRONLY), "open for writing without O_APPEND");
    eperm(fs.check_open(f, libc::O_WRONLY | libc::O_APPEND | libc::O_TRUNC), "O_TRUNC");
    fs.check_open(f, libc::O_WRONLY | libc::O_APPEND).unwrap();
    let mut buf = vec![0u8; 64];
    let n = fs.read(f, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"one\ntwo\nthree\n");
    assert!(fs.check().problems.is_empty());
}

#[test]
fn flagged_directories_keep_their_entries_and_pass_flags_on() {
    let (_d, pool) = fresh_pool(64 << 20, None);
    let fs = mount(&pool);
    let root = fs.root();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let x = file(&fs, d, "x", b"x");
    let sub = fs.mkdir(d, b"sub", 0o755, 0, 0).unwrap().ino;
    fs.set_inode_flags(d, IMMUTABLE).unwrap();
    eperm(fs.create(d, b"y", 0o644, 0, 0), "create");
    eperm(fs.mkdir(d, b"y", 0o755, 0, 0), "mkdir");
    eperm(fs.symlink(d, b"y", b"x", 0, 0), "symlink");
    eperm(fs.create_unnamed(d, 0o600, 0, 0, true), "O_TMPFILE");
    eperm(fs.link(x, d, b"y"), "link into it");
    eperm(fs.unlink(d, b"x"), "unlink");
    eperm(fs.rename(d, b"x", d, b"y", RenameFlags::default()), "rename inside it");
    eperm(fs.rename(d, b"x", root, b"y", RenameFlags::default()), "rename out of it");
    // What is inside the directory is not itself immutable.
    fs.write(x, 0, b"X").unwrap();
    file(&fs, sub, "deeper", b"");
    // Append-only: names come, none go.
    fs.set_inode_flags(d, APPEND | NODUMP | NOATIME).unwrap();
    let y = file(&fs, d, "y", b"y");
    eperm(fs.unlink(d, b"y"), "unlink");
    eperm(fs.rename(d, b"y", d, b"z", RenameFlags::default()), "rename away");
    let outside = file(&fs, root, "outside", b"");
    fs.rename(root, b"outside", d, b"moved", RenameFlags::default()).unwrap();
    file(&fs, root, "o2", b"");
    eperm(fs.rename(root, b"o2", d, b"moved", RenameFlags::default()), "rename over a name in it");
    assert_eq!(fs.lookup(d, b"moved").unwrap().ino, outside);
    // New files take no-dump and no-atime (not append-only) from their directory, as on ext4.
    assert_eq!(fs.inode_flags(y).unwrap(), NODUMP | NOATIME);
    let unnamed = fs.create_unnamed(d, 0o600, 0, 0, true).unwrap().ino;
    assert_eq!(fs.inode_flags(unnamed).unwrap(), NODUMP | NOATIME);
    fs.release(unnamed).unwrap();
    fs.set_inode_flags(d, 0).unwrap();
    fs.unlink(d, b"y").unwrap();
    assert!(fs.check().problems.is_empty());
}

#[test]
fn no_atime_files_store_no_access_time_and_read_only_mounts_set_no_flags() {
    let (_d, pool) = fresh_pool(64 << 20, None);
    let fs = mount(&pool);
    let root = fs.root();
    let f = file(&fs, root, "f", b"data");
    let old = SetAttr { atime: Some(TimeSet::At(1_000_000_000)), ..Default::default() };
    fs.setattr(f, &old).unwrap();
    fs.set_inode_flags(f, NOATIME).unwrap();
    let mut buf = [0u8; 4];
    fs.read(f, 0, &mut buf).unwrap();
    assert_eq!(fs.getattr(f).unwrap().atime, 1_000_000_000, "a no-atime file stored one");
    fs.set_inode_flags(f, 0).unwrap();
    fs.read(f, 0, &mut buf).unwrap();
    assert!(fs.getattr(f).unwrap().atime > 1_000_000_000, "relatime stored none");
    fs.unmount().unwrap();
    let ro = mount_opts(&pool, MountOptions { read_only: true, ..Default::default() });
    assert_eq!(ro.set_inode_flags(f, NODUMP).unwrap_err().errno(), libc::EROFS);
    assert_eq!(ro.inode_flags(f).unwrap(), 0);
}
