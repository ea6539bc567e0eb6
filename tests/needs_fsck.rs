//! The "needs fsck" flag and read-only mounts (docs/DESIGN.md §7): a check of media that fails
//! while a mount serves it is EIO for that object and flags the pool durably; a flagged pool is
//! refused writable (unchanged) and mounts read-only; a read-only mount writes nothing and
//! refuses every change with EROFS; `fsck` reports the flag and `fsck --repair` clears it once
//! the pool checks clean.

mod common;

use common::{fresh_pool, mount};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use winefs::media::layout::{FileKind, SbState, sb};
use winefs::{Error, Fs, MountOptions, RenameFlags, SetAttr, TimeSet, XattrSet};

const BIN: &str = env!("CARGO_BIN_EXE_winefs");
const MIB: u64 = 1 << 20;
const VALUE: &[u8] = b"value-n4f";
const TARGET: &[u8] = b"target-rk3/file";

/// Change one byte of the pool file in place (no truncation: a mount may have it mapped).
fn flip(p: &Path, off: u64, mask: u8) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .unwrap();
    let mut b = [0u8];
    f.seek(SeekFrom::Start(off)).unwrap();
    f.read_exact(&mut b).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    f.write_all(&[b[0] ^ mask]).unwrap();
}

fn find(p: &Path, what: &[u8]) -> u64 {
    let img = std::fs::read(p).unwrap();
    img.windows(what.len())
        .position(|w| w == what)
        .unwrap_or_else(|| panic!("{:?} is not in the pool", String::from_utf8_lossy(what)))
        as u64
}

/// The state record as the pool file holds it now (readable while mounted).
fn record(p: &Path) -> SbState {
    let img = std::fs::read(p).unwrap();
    SbState::decode(&img[sb::STATE..sb::STATE + 32])
}

/// A 1-partition pool holding `/f` (data and the xattr `user.tag`) and the symlink `/ln`,
/// cleanly unmounted.
fn pool() -> (tempfile::TempDir, PathBuf) {
    let (d, p) = fresh_pool(32 * MIB, Some(1));
    let fs = mount(&p);
    let f = fs.create_file("/f").unwrap();
    f.write_at(0, b"file content").unwrap();
    fs.setxattr(f.ino(), b"user.tag", VALUE, XattrSet::Any)
        .unwrap();
    drop(f);
    fs.symlink(fs.root(), b"ln", TARGET, 0, 0).unwrap();
    fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap();
    fs.unmount().unwrap();
    (d, p)
}

fn read_only(p: &Path) -> Fs {
    common::mount_opts(
        p,
        MountOptions {
            read_only: true,
            ..Default::default()
        },
    )
}

/// A pool flagged by a damaged xattr block found while mounted (the flip stays in the pool).
fn flagged_pool() -> (tempfile::TempDir, PathBuf, u64) {
    let (d, p) = pool();
    let fs = mount(&p);
    let at = find(&p, VALUE);
    flip(&p, at, 0x20);
    let ino = fs.resolve("/f", true).unwrap();
    assert!(matches!(
        fs.getxattr(ino, b"user.tag"),
        Err(Error::Corrupted(_))
    ));
    fs.unmount().unwrap();
    (d, p, at)
}

/// The writable mount of a flagged pool is refused with the message, the pool unchanged.
fn refused_writable(p: &Path) -> String {
    let before = std::fs::read(p).unwrap();
    for private in [false, true] {
        let opts = MountOptions {
            private,
            ..Default::default()
        };
        match Fs::mount(p, opts) {
            Ok(_) => panic!("a flagged pool mounted writable (private: {private})"),
            Err(e) => {
                assert!(matches!(e, Error::NeedsFsck(_)), "{e}");
                assert_eq!(e.errno(), libc::EIO);
            }
        }
    }
    assert!(
        std::fs::read(p).unwrap() == before,
        "a refused mount wrote to the pool"
    );
    Fs::mount(p, MountOptions::default())
        .err()
        .unwrap()
        .to_string()
}

#[test]
fn a_damaged_xattr_block_is_eio_and_flags_the_pool_durably() {
    let (_d, p) = pool();
    let fs = mount(&p);
    let ino = fs.resolve("/f", true).unwrap();
    assert_eq!(fs.needs_fsck(), 0);
    assert_eq!(record(&p).needs_fsck, 0);
    flip(&p, find(&p, VALUE), 0x20);
    // Four threads at once: each gets EIO, the flag is raised once.
    let errs: Vec<Error> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| fs.getxattr(ino, b"user.tag").unwrap_err()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in &errs {
        assert!(
            matches!(e, Error::Corrupted(m) if m.contains(&format!("inode {ino}")) && m.contains("xattr block")),
            "{e}"
        );
        assert_eq!(e.errno(), libc::EIO);
    }
    assert!(fs.listxattr(ino).is_err());
    assert_eq!(fs.needs_fsck(), 2);
    // Durable while still mounted: written, flushed and fenced at the failure.
    let rec = record(&p);
    assert!(!rec.damaged && !rec.clean && rec.needs_fsck == 2, "{rec:?}");
    // The rest of the pool is served as before.
    assert_eq!(
        fs.open_file("/f").unwrap().read_all().unwrap(),
        b"file content"
    );
    fs.create_file("/new").unwrap().write_at(0, b"x").unwrap();
    fs.unmount().unwrap();
    let (_, st) = winefs::state::mount::read_superblock(&p).unwrap();
    assert!(
        st.clean && st.needs_fsck == 2,
        "a clean unmount kept the flag: {st:?}"
    );
    let msg = refused_writable(&p);
    assert!(
        msg.contains("needs fsck")
            && msg.contains("an xattr block failed its checks")
            && msg.contains(&format!("winefs fsck --repair {}", p.display()))
            && msg.contains("--read-only"),
        "{msg}"
    );
}

#[test]
fn a_damaged_symlink_target_flags_the_pool() {
    let (_d, p) = pool();
    let fs = mount(&p);
    let ln = fs.resolve("/ln", false).unwrap();
    assert_eq!(fs.readlink(ln).unwrap(), TARGET);
    flip(&p, find(&p, TARGET) + 2, 0x01);
    let e = fs.readlink(ln).unwrap_err();
    assert!(
        matches!(&e, Error::Corrupted(m) if m.contains(&format!("symlink {ln}"))),
        "{e}"
    );
    assert_eq!(record(&p).needs_fsck, 1);
    drop(fs); // dropping the last handle unmounts cleanly, too
    let msg = refused_writable(&p);
    assert!(
        msg.contains("a symlink target failed its checksum"),
        "{msg}"
    );
}

/// Every call of the facade that would change the pool, on a read-only mount: EROFS.
fn every_change_is_erofs(fs: &Fs) {
    let root = fs.root();
    let f = fs.resolve("/f", true).unwrap();
    let file = fs.open_file("/f").unwrap();
    let none = RenameFlags::default();
    let calls: Vec<(&str, winefs::Result<()>)> = vec![
        ("create", fs.create(root, b"n", 0o644, 0, 0).map(drop)),
        ("mkdir", fs.mkdir(root, b"n", 0o755, 0, 0).map(drop)),
        (
            "mknod",
            fs.mknod(root, b"n", FileKind::Fifo, 0o644, 0, 0, 0)
                .map(drop),
        ),
        ("symlink", fs.symlink(root, b"n", b"t", 0, 0).map(drop)),
        ("link", fs.link(f, root, b"n").map(drop)),
        ("unlink", fs.unlink(root, b"f")),
        ("rmdir", fs.rmdir(root, b"d")),
        ("rename", fs.rename(root, b"f", root, b"g", none)),
        ("write", fs.write(f, 0, b"no").map(drop)),
        ("append", fs.append(f, b"no").map(drop)),
        ("truncate", fs.truncate(f, 0)),
        ("fallocate", fs.fallocate(f, 0, 4096, false)),
        ("punch_hole", fs.punch_hole(f, 0, 4096)),
        ("zero_range", fs.zero_range(f, 0, 4096, true)),
        ("collapse_range", fs.collapse_range(f, 0, 4096)),
        ("insert_range", fs.insert_range(f, 0, 4096)),
        (
            "setattr",
            fs.setattr(
                f,
                &SetAttr {
                    mode: Some(0o600),
                    mtime: Some(TimeSet::At(1)),
                    ..Default::default()
                },
            )
            .map(drop),
        ),
        ("setxattr", fs.setxattr(f, b"user.n", b"v", XattrSet::Any)),
        ("removexattr", fs.removexattr(f, b"user.tag")),
        ("rewrite", fs.rewrite(f).map(drop)),
        ("scatter", fs.scatter(f).map(drop)),
        ("compact", fs.compact().map(drop)),
        ("File::write_at", file.write_at(0, b"no").map(drop)),
        ("File::set_len", file.set_len(1)),
        ("File::fallocate", file.fallocate(0, 4096)),
        ("File::mmap", file.mmap(0, 4096).map(drop)),
        ("File::mmap_atomic", file.mmap_atomic(0, 4096).map(drop)),
        ("create_file", fs.create_file("/n").map(drop)),
        ("mkdir_path", fs.mkdir_path("/n").map(drop)),
        ("unlink_path", fs.unlink_path("/f")),
        ("rename_path", fs.rename_path("/f", "/g")),
    ];
    for (what, r) in calls {
        match r {
            Err(e @ Error::ReadOnly) => assert_eq!(e.errno(), libc::EROFS),
            other => panic!("{what} on a read-only mount: {other:?}"),
        }
    }
}

#[test]
fn a_read_only_mount_serves_reads_refuses_changes_and_writes_nothing() {
    let (_d, p, _) = flagged_pool();
    let before = std::fs::read(&p).unwrap();
    let fs = read_only(&p);
    assert!(fs.is_read_only());
    assert_eq!(fs.needs_fsck(), 2);
    let notes = fs.recovery_report().notes;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("the pool needs fsck") && n.contains("serving it read-only")),
        "{notes:?}"
    );
    assert_eq!(
        fs.open_file("/f").unwrap().read_all().unwrap(),
        b"file content"
    );
    assert_eq!(
        fs.readlink(fs.resolve("/ln", false).unwrap()).unwrap(),
        TARGET
    );
    assert_eq!(fs.list_dir("/").unwrap().len(), 3); // f, ln, d
    let f = fs.resolve("/f", true).unwrap();
    assert!(matches!(
        fs.getxattr(f, b"user.tag"),
        Err(Error::Corrupted(_))
    ));
    every_change_is_erofs(&fs);
    fs.fsync(f).unwrap();
    fs.unmount().unwrap();
    assert!(
        std::fs::read(&p).unwrap() == before,
        "a read-only mount wrote to the pool"
    );
    // A pool that is not flagged mounts read-only too, just the same.
    let (_d2, q) = pool();
    let before = std::fs::read(&q).unwrap();
    let fs = read_only(&q);
    assert_eq!(fs.needs_fsck(), 0);
    every_change_is_erofs(&fs);
    drop(fs);
    assert!(
        std::fs::read(&q).unwrap() == before,
        "a read-only mount wrote to the pool"
    );
}

#[test]
fn a_read_only_mount_recovers_an_unclean_pool_in_memory_only() {
    let (_d, p) = pool();
    let fs = mount(&p);
    let f = fs.open_file("/f").unwrap();
    fs.inject_crash_before_commit(1);
    assert!(f.write_at(0, b"XXXXXXXXXXXX and longer").is_err());
    drop(f);
    drop(fs); // poisoned: left not clean, like a crash
    let before = std::fs::read(&p).unwrap();
    assert!(!record(&p).clean);
    let fs = read_only(&p);
    assert!(!fs.recovery_report().rolled_back.is_empty());
    assert_eq!(
        fs.open_file("/f").unwrap().read_all().unwrap(),
        b"file content"
    );
    fs.unmount().unwrap();
    assert!(
        std::fs::read(&p).unwrap() == before,
        "a read-only mount wrote to the pool"
    );
    // The writable mount still finds the transaction to roll back.
    let fs = mount(&p);
    assert!(!fs.recovery_report().rolled_back.is_empty());
    assert_eq!(
        fs.open_file("/f").unwrap().read_all().unwrap(),
        b"file content"
    );
}

fn winefs(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn fsck_reports_the_flag_and_repair_clears_it_once_the_pool_checks_clean() {
    let (_d, p, at) = flagged_pool();
    let ps = p.to_str().unwrap();
    let (code, out, _) = winefs(&["info", ps]);
    assert_eq!(code, 0);
    assert!(
        out.contains("needs fsck    YES: an xattr block failed its checks"),
        "{out}"
    );
    assert!(out.contains("size words    checked"), "{out}");
    let rep = winefs::state::fsck::check_pool(&p).unwrap();
    assert!(
        rep.problems
            .iter()
            .any(|x| x.contains("flagged \"needs fsck\": an xattr block failed its checks")),
        "{:?}",
        rep.problems
    );
    // Repair cannot rebuild the block, so it drops it as e2fsck would (the file keeps its data
    // and loses its extended attributes), says so, and clears the flag.
    let (code, out, err) = winefs(&["fsck", "--repair", ps]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("failed its checks") && out.contains("dropped (its extended attributes are lost)"),
        "{out}"
    );
    assert!(
        out.contains(
            "repaired: cleared the \"needs fsck\" flag (an xattr block failed its checks)"
        ),
        "{out}"
    );
    let (code, out, _) = winefs(&["fsck", ps]);
    assert_eq!(code, 0, "{out}");
    let (_, out, _) = winefs(&["info", ps]);
    assert!(out.contains("needs fsck    no"), "{out}");
    // The damaged bytes are in a block that is free now: nothing reads them any more.
    let _ = at;
    let fs = mount(&p);
    assert_eq!(fs.needs_fsck(), 0);
    let f = fs.resolve("/f", true).unwrap();
    assert!(matches!(fs.getxattr(f, b"user.tag"), Err(Error::NoAttr)));
    assert_eq!(
        fs.open_file("/f").unwrap().read_all().unwrap(),
        b"file content"
    );
    fs.setxattr(f, b"user.tag", VALUE, XattrSet::Any).unwrap();
    fs.write(f, 0, b"FILE").unwrap();
    fs.unmount().unwrap();
    let (code, out, _) = winefs(&["fsck", ps]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn repair_frees_a_symlink_whose_target_fails_its_checksum_and_clears_the_flag() {
    let (_d, p) = pool();
    let fs = mount(&p);
    let ln = fs.resolve("/ln", false).unwrap();
    flip(&p, find(&p, TARGET) + 2, 0x01);
    assert!(fs.readlink(ln).is_err());
    fs.unmount().unwrap();
    let ps = p.to_str().unwrap();
    let (code, out, err) = winefs(&["fsck", "--repair", ps]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains(&format!("symlink {ln}: its target failed its checksum; freed")),
        "{out}"
    );
    assert!(out.contains("removed entry \"ln\""), "{out}");
    assert!(out.contains("cleared the \"needs fsck\" flag"), "{out}");
    let (code, out, _) = winefs(&["fsck", ps]);
    assert_eq!(code, 0, "{out}");
    let fs = mount(&p);
    assert!(matches!(fs.resolve("/ln", false), Err(Error::NotFound)));
    assert_eq!(
        fs.open_file("/f").unwrap().read_all().unwrap(),
        b"file content"
    );
    fs.symlink(fs.root(), b"ln", TARGET, 0, 0).unwrap();
    fs.unmount().unwrap();
}

#[test]
fn the_cli_refuses_a_writable_mount_of_a_flagged_pool_in_one_line() {
    let (d, p, _) = flagged_pool();
    let mnt = d.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let before = std::fs::read(&p).unwrap();
    let (code, out, err) = winefs(&["mount", p.to_str().unwrap(), mnt.to_str().unwrap(), "-f"]);
    assert_eq!(code, 1, "{out}{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines.len() == 1
            && lines[0].starts_with("winefs: mount ")
            && lines[0].contains("pool needs fsck: a checksum failed at run time (an xattr block failed its checks); run `winefs fsck --repair")
            && lines[0].contains("or mount with --read-only"),
        "{err}"
    );
    assert!(
        std::fs::read(&p).unwrap() == before,
        "a refused mount wrote to the pool"
    );
}

#[test]
fn an_inode_damaged_under_a_mount_is_never_resealed_by_the_next_change() {
    let (_d, p) = pool();
    let fs = mount(&p);
    let f = fs.resolve("/f", true).unwrap();
    // A byte of /f's inode outside the times (its xattr block field) changes under the mount;
    // a chmod then changes another part of the header. Sealing would bless the damage.
    let off = fs.geometry().inode_offset(f).unwrap() + 41;
    flip(&p, off, 0x01);
    let e = fs
        .setattr(
            f,
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::Corrupted(m) if m.contains(&format!("inode {f} fails its checksum"))),
        "{e}"
    );
    assert_eq!(record(&p).needs_fsck, 4);
    drop(fs);
    let msg = refused_writable(&p);
    assert!(msg.contains("an inode failed its checksum"), "{msg}");
    // The damage was never sealed: fsck still sees the inode fail its checksum.
    let rep = winefs::state::fsck::check_pool(&p).unwrap();
    assert!(
        rep.problems.iter().any(|x| x.contains(&format!("inode {f} fails its checksum"))),
        "{:?}",
        rep.problems
    );
}
