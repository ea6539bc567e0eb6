//! Inodes loaded on first use: a serving mount keeps only the directories in DRAM and builds a
//! file's state from its table slot when something first asks for it. The files must read,
//! change and check exactly as if the mount had loaded them all, from any number of threads at
//! once; damage to a slot after the mount checked it must be an error, never wrong data.

mod common;

use common::{fresh_pool, mount, mount_opts, pattern};
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use winefs::{Error, Fs, MountOptions};

/// Mount keeping at most `cached` idle file states.
fn mount_caching(p: &Path, cached: u64) -> Fs {
    mount_opts(
        p,
        MountOptions {
            cached_inodes: cached,
            ..Default::default()
        },
    )
}

/// Bytes of DRAM the mount reports for its per-inode states.
fn state_bytes(fs: &Fs) -> u64 {
    fs.dram_usage()
        .into_iter()
        .find(|(what, _)| *what == "inode states")
        .map(|(_, b)| b)
        .expect("the inode states are accounted")
}

/// Write `bytes` into the pool file at `off` in place (the pool stays mapped by a mount).
fn poke(p: &Path, off: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    f.write_all(bytes).unwrap();
}

#[test]
fn files_are_loaded_on_first_use_and_behave_as_if_always_loaded() {
    let (_d, p) = fresh_pool(256 << 20, None);
    let names: Vec<String> = (0..300).map(|i| format!("f{i}")).collect();
    {
        let fs = mount(&p);
        let root = fs.root();
        let sub = fs.mkdir(root, b"sub", 0o755, 0, 0).unwrap().ino;
        for (i, n) in names.iter().enumerate() {
            let a = fs
                .create(sub, n.as_bytes(), 0o600 + (i as u32 % 8), 7, 8)
                .unwrap();
            fs.write(a.ino, 0, &pattern(i * 37 % 9000, i as u8))
                .unwrap();
        }
        fs.link(fs.lookup(sub, b"f1").unwrap().ino, root, b"hard")
            .unwrap();
        fs.symlink(root, b"sym", b"sub/f2", 0, 0).unwrap();
        fs.setxattr(
            fs.lookup(sub, b"f3").unwrap().ino,
            b"user.k",
            b"v",
            winefs::XattrSet::Any,
        )
        .unwrap();
        fs.unmount().unwrap();
    }
    let fs = mount(&p);
    // Only the two directories are in DRAM after the mount.
    let dirs_only = state_bytes(&fs);
    assert!(dirs_only > 0);
    let sub = fs.lookup(fs.root(), b"sub").unwrap().ino;
    assert_eq!(
        state_bytes(&fs),
        dirs_only,
        "a directory lookup loads nothing new"
    );
    let per_state = dirs_only / 2;
    // A lookup of a file loads that file, once.
    let a = fs.lookup(sub, b"f10").unwrap();
    assert_eq!(state_bytes(&fs), dirs_only + per_state);
    assert_eq!(fs.getattr(a.ino).unwrap().size, 370);
    assert_eq!(state_bytes(&fs), dirs_only + per_state);
    // Every file reads back as written, with its attributes, links, xattr and symlink.
    for (i, n) in names.iter().enumerate() {
        let a = fs.lookup(sub, n.as_bytes()).unwrap();
        assert_eq!((a.perm, a.uid, a.gid), (0o600 + (i as u32 % 8), 7, 8));
        let want = pattern(i * 37 % 9000, i as u8);
        let mut got = vec![0u8; want.len() + 10];
        assert_eq!(fs.read(a.ino, 0, &mut got).unwrap(), want.len());
        assert_eq!(&got[..want.len()], &want[..], "{n}");
    }
    let hard = fs.lookup(fs.root(), b"hard").unwrap();
    assert_eq!(
        (hard.ino, hard.nlink),
        (fs.lookup(sub, b"f1").unwrap().ino, 2)
    );
    assert_eq!(
        fs.readlink(fs.lookup(fs.root(), b"sym").unwrap().ino)
            .unwrap(),
        b"sub/f2"
    );
    let f3 = fs.lookup(sub, b"f3").unwrap().ino;
    assert_eq!(fs.getxattr(f3, b"user.k").unwrap(), b"v");
    // Changes to files loaded late stick across a remount, and the pool checks clean.
    fs.unlink(sub, b"f4").unwrap();
    fs.rename(sub, b"f5", fs.root(), b"moved", Default::default())
        .unwrap();
    let f6 = fs.lookup(sub, b"f6").unwrap().ino;
    fs.truncate(f6, 1).unwrap();
    let r = fs.check();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    fs.unmount().unwrap();
    let fs = mount(&p);
    assert!(matches!(fs.lookup(sub, b"f4"), Err(Error::NotFound)));
    assert_eq!(
        fs.getattr(fs.lookup(fs.root(), b"moved").unwrap().ino)
            .unwrap()
            .size,
        185
    );
    assert_eq!(fs.getattr(f6).unwrap().size, 1);
    // An inode number that is free is stale, whether or not it was ever loaded.
    assert!(matches!(
        fs.getattr(1_000_000),
        Err(Error::Stale(_)) | Err(Error::Invalid(_))
    ));
    let r = fs.check();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    fs.unmount().unwrap();
}

#[test]
fn threads_racing_to_load_the_same_files_see_one_inode() {
    racing_appends(0);
}

#[test]
fn threads_racing_to_load_and_drop_the_same_files_see_one_inode() {
    // Four idle states at most: states are dropped and rebuilt all through the run.
    racing_appends(4);
}

fn racing_appends(cached: u64) {
    let (_d, p) = fresh_pool(256 << 20, None);
    {
        let fs = mount(&p);
        for i in 0..200u32 {
            fs.create(fs.root(), format!("f{i}").as_bytes(), 0o644, 0, 0)
                .unwrap();
        }
        fs.unmount().unwrap();
    }
    let fs = mount_caching(&p, cached);
    let root = fs.root();
    // Eight threads each append their own 8 bytes to every file, all starting from unloaded
    // inodes: had two threads built two states of one file, appends would be lost.
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let fs = &fs;
            s.spawn(move || {
                for i in 0..200u32 {
                    let ino = fs.lookup(root, format!("f{i}").as_bytes()).unwrap().ino;
                    let (_, off) = fs.append(ino, &[t; 8]).unwrap();
                    assert_eq!(off % 8, 0);
                }
            });
        }
    });
    for i in 0..200u32 {
        let a = fs.lookup(root, format!("f{i}").as_bytes()).unwrap();
        assert_eq!(a.size, 64, "f{i}");
        let mut got = vec![0u8; 64];
        fs.read(a.ino, 0, &mut got).unwrap();
        let mut seen: Vec<u8> = got.chunks(8).map(|c| c[0]).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..8).collect::<Vec<u8>>(), "f{i}");
    }
    let r = fs.check();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    fs.unmount().unwrap();
}

#[test]
fn a_slot_damaged_after_the_mount_is_an_error_when_first_used() {
    let (_d, p) = fresh_pool(64 << 20, None);
    {
        let fs = mount(&p);
        for n in [&b"good"[..], b"bad"] {
            let a = fs.create(fs.root(), n, 0o644, 0, 0).unwrap();
            fs.write(a.ino, 0, b"content").unwrap();
        }
        fs.unmount().unwrap();
    }
    let fs = mount(&p);
    let g = fs.geometry();
    // The entry still names the inode (lookups read only the directory)...
    let bad = {
        let names = fs.readdir(fs.root(), 0).unwrap();
        names.iter().find(|e| e.name == b"bad").unwrap().ino
    };
    // ...whose table slot is damaged behind the mount's back before its first use.
    let off = g.inode_offset(bad).unwrap() + 24;
    let byte = std::fs::read(&p).unwrap()[off as usize];
    poke(&p, off, &[byte ^ 0x10]);
    let e = fs.lookup(fs.root(), b"bad").unwrap_err();
    assert!(
        matches!(&e, Error::Corrupted(m) if m.contains(&format!("inode {bad} fails its checksum"))),
        "{e}"
    );
    assert!(matches!(fs.getattr(bad), Err(Error::Corrupted(_))));
    // Everything else works, and fsck of the live mount lists the damage.
    let good = fs.lookup(fs.root(), b"good").unwrap().ino;
    let mut buf = [0u8; 7];
    fs.read(good, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"content");
    let r = fs.check();
    assert!(
        r.problems.iter().any(|l| l.contains("fails its checksum")),
        "{:?}",
        r.problems
    );
}

#[test]
fn idle_file_states_are_dropped_past_the_cap_and_rebuilt_unchanged() {
    let (_d, p) = fresh_pool(256 << 20, None);
    let fs = mount_caching(&p, 16);
    let root = fs.root();
    let per_state = state_bytes(&fs); // the root's
    let n = 200usize;
    let mut inos = Vec::new();
    for i in 0..n {
        let a = fs
            .create(root, format!("f{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        fs.write(a.ino, 0, &pattern(100 + i * 50, i as u8)).unwrap();
        inos.push(a.ino);
    }
    // The root and at most 16 idle files (plus the two a load may be over by) stay in DRAM.
    let held = state_bytes(&fs) / per_state;
    assert!(held <= 1 + 16 + 2, "{held} states in DRAM");
    // A change after a stat shows as a new mtime even when the state was dropped in between
    // (two appends within one clock tick store the same coarse time unless the times were read
    // in between: a rebuilt state must assume they may have been).
    let victim = inos[5];
    fs.append(victim, b"y").unwrap();
    let seen = fs.getattr(victim).unwrap().mtime;
    for &ino in &inos[100..140] {
        fs.getattr(ino).unwrap();
    }
    fs.append(victim, b"z").unwrap();
    assert!(
        fs.getattr(victim).unwrap().mtime > seen,
        "the append after a stat changed mtime"
    );
    // A file held open is never dropped: its state (and open count) stays while others churn.
    let kept = inos[0];
    fs.open(kept).unwrap();
    fs.unlink(root, b"f0").unwrap();
    for round in 0..3 {
        for (i, &ino) in inos.iter().enumerate().skip(1) {
            let a = fs.getattr(ino).unwrap();
            let extra = if ino == victim { 2 } else { 0 };
            assert_eq!(a.size, (100 + i * 50 + extra) as u64, "round {round}, f{i}");
            if round == 1 {
                // Changes to dropped-and-rebuilt states: data, size, times, xattrs, links.
                fs.write(ino, 10, b"changed").unwrap();
                fs.setxattr(ino, b"user.r", &[round as u8], winefs::XattrSet::Any)
                    .unwrap();
            }
        }
    }
    // A second open and its release leave the first open standing.
    fs.open(kept).unwrap();
    fs.release(kept).unwrap();
    let mut buf = [0u8; 7];
    fs.read(kept, 0, &mut buf).unwrap();
    assert_eq!(
        &buf[..],
        &pattern(100, 0)[..7],
        "the unlinked open file kept its data"
    );
    fs.release(kept).unwrap();
    assert!(
        matches!(fs.getattr(kept), Err(Error::Stale(_))),
        "freed at its last release"
    );
    for (i, &ino) in inos.iter().enumerate().skip(1) {
        let mut got = vec![0u8; 100 + i * 50 + if ino == victim { 2 } else { 0 }];
        fs.read(ino, 0, &mut got).unwrap();
        let mut want = pattern(100 + i * 50, i as u8);
        want[10..17].copy_from_slice(b"changed");
        if ino == victim {
            want.extend_from_slice(b"yz");
        }
        assert_eq!(got, want, "f{i}");
        assert_eq!(fs.getxattr(ino, b"user.r").unwrap(), vec![1]);
    }
    let r = fs.check();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    fs.unmount().unwrap();
    let fs = mount(&p);
    assert_eq!(fs.getattr(inos[7]).unwrap().size, 450);
    let r = fs.check();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
}

#[test]
fn files_created_and_unlinked_do_not_push_idle_states_out_below_the_cap() {
    let (_d, p) = fresh_pool(256 << 20, None);
    let fs = mount_caching(&p, 64);
    let root = fs.root();
    let per_state = state_bytes(&fs); // the root's
    let kept: Vec<u64> = (0..20)
        .map(|i| fs.create(root, format!("k{i}").as_bytes(), 0o644, 0, 0).unwrap().ino)
        .collect();
    assert_eq!(state_bytes(&fs), 21 * per_state);
    // A churn of 2,000 files made and removed (varmail's): 20 live files, far below the cap of
    // 64, so every one of their states stays. Freed files counted as held once pushed live
    // ones out long before the cap, and every open loaded its file from media again.
    for i in 0..2000 {
        let a = fs.create(root, format!("t{i}").as_bytes(), 0o644, 0, 0).unwrap();
        fs.append(a.ino, b"x").unwrap();
        fs.unlink(root, format!("t{i}").as_bytes()).unwrap();
    }
    assert_eq!(state_bytes(&fs), 21 * per_state, "no state dropped below the cap");
    // Past the cap the count still holds: 100 more live files leave at most 64 (plus the two
    // a load may be over by) beside the root.
    for i in 0..100 {
        fs.create(root, format!("m{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    let held = state_bytes(&fs) / per_state;
    assert!((1 + 60..=1 + 64 + 2).contains(&held), "{held} states in DRAM");
    for &ino in &kept {
        assert_eq!(fs.getattr(ino).unwrap().size, 0);
    }
    let r = fs.check();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    fs.unmount().unwrap();
}
