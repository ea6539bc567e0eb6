//! Hole compaction (`winefs::compact`): broken 2 MiB units that hold little are emptied into
//! holes elsewhere and come back as aligned extents; nothing observable changes, and it is safe
//! against concurrent foreground work. (Crash safety: the crash explorer's `compact` workloads
//! on its fragmented start, tests/crash_explorer.rs.)

use std::collections::BTreeMap;
use winefs::age::profile::Profile;
use winefs::age::{AgeConfig, Ager, CreateMethod, LibraryTarget};
use winefs::report::FragReport;
use winefs::{Fs, MountOptions, XattrSet};

mod common;

const MIB: u64 = 1 << 20;

fn mkfs(path: &std::path::Path, size: u64) {
    common::format(path, size, None);
}

/// Path -> (content, sorted xattrs).
type Snapshot = BTreeMap<String, (Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>)>;

/// Every file under the root (recursively) with its content and xattrs.
fn snapshot(fs: &Fs, dir: &str, out: &mut Snapshot) {
    let ino = fs
        .resolve(if dir.is_empty() { "/" } else { dir }, true)
        .unwrap();
    for e in fs.readdir(ino, 0).unwrap() {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        let path = format!("{dir}/{}", String::from_utf8(e.name.clone()).unwrap());
        if e.kind == winefs::media::layout::FileKind::Dir {
            snapshot(fs, &path, out);
            continue;
        }
        let data = fs.open_file(&path).unwrap().read_all().unwrap();
        let mut x: Vec<(Vec<u8>, Vec<u8>)> = fs
            .listxattr(e.ino)
            .unwrap()
            .into_iter()
            .map(|n| {
                let v = fs.getxattr(e.ino, &n).unwrap();
                (n, v)
            })
            .collect();
        x.sort();
        out.insert(path, (data, x));
    }
}

#[test]
fn compaction_returns_broken_units_and_keeps_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("p");
    mkfs(&pool, 96 * MIB);
    let opts = MountOptions {
        no_background_rewrite: true,
        ..Default::default()
    };
    let fs = Fs::mount(&pool, opts.clone()).unwrap();
    // Small files over several units, in two directories, some with xattrs; then most of them
    // deleted, leaving units broken and sparse.
    fs.mkdir_path("/a").unwrap();
    fs.mkdir_path("/b").unwrap();
    let mut x: u64 = 0x1234_5678;
    let mut names = Vec::new();
    for i in 0..600u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let size = 4096 * (1 + x % 24) + x % 4000;
        let path = format!("/{}/f{i}", if i % 2 == 0 { "a" } else { "b" });
        let f = fs.create_file(&path).unwrap();
        let data: Vec<u8> = (0..size).map(|k| (k as u8) ^ (i as u8)).collect();
        f.write_at(0, &data).unwrap();
        if i % 7 == 0 {
            fs.setxattr(
                f.ino(),
                b"user.tag",
                format!("file {i}").as_bytes(),
                XattrSet::Any,
            )
            .unwrap();
        }
        names.push(path);
    }
    for (i, p) in names.iter().enumerate() {
        if i % 5 != 0 {
            fs.unlink_path(p).unwrap();
        }
    }
    let mut before = BTreeMap::new();
    snapshot(&fs, "", &mut before);
    let frag0 = FragReport::new(&fs);
    let st = fs.compact().unwrap();
    let frag1 = FragReport::new(&fs);
    assert!(st.units_freed >= 2, "{st:?}");
    assert!(st.blocks_moved > 0);
    assert!(
        frag1.aligned_extents() >= frag0.aligned_extents() + st.units_freed,
        "{frag0}\n{frag1}"
    );
    assert!(frag1.aligned_share() > frag0.aligned_share());
    let mut after = BTreeMap::new();
    snapshot(&fs, "", &mut after);
    assert_eq!(before, after);
    let ck = fs.check();
    assert!(ck.problems.is_empty(), "{:?}", ck.problems);
    // Compacting again finds less or nothing to do, and the layout survives a remount.
    let again = fs.compact().unwrap();
    assert!(again.units_freed <= st.units_freed);
    fs.unmount().unwrap();
    let fs = Fs::mount(&pool, opts).unwrap();
    let mut remounted = BTreeMap::new();
    snapshot(&fs, "", &mut remounted);
    assert_eq!(before, remounted);
    assert_eq!(
        FragReport::new(&fs).aligned_extents(),
        FragReport::new(&fs).aligned_extents()
    );
    let ck = fs.check();
    assert!(ck.problems.is_empty(), "{:?}", ck.problems);
    fs.unmount().unwrap();
}

/// The background compaction runs while the ager creates and deletes; everything the ager
/// believes exists exists, fsck is clean, and most free space is aligned afterwards.
#[test]
fn background_compaction_under_churn() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("p");
    mkfs(&pool, 512 * MIB);
    let fs = Fs::mount(&pool, MountOptions::default()).unwrap();
    let mut cfg = AgeConfig::new(Profile::load("agrawal").unwrap());
    cfg.writes = 10.0;
    cfg.seed = 4;
    let live = {
        let target = LibraryTarget {
            fs: fs.clone(),
            method: CreateMethod::Fallocate,
        };
        let mut ager = Ager::new(&cfg, target).unwrap();
        ager.run().unwrap();
        ager.live()
    };
    fs.settle_rewrites(std::time::Duration::from_secs(120))
        .expect("background work settles");
    let ck = fs.check();
    assert!(ck.problems.is_empty(), "{:?}", ck.problems);
    for (p, size) in &live {
        assert_eq!(fs.stat_path(&format!("/{p}")).unwrap().size, *size, "{p}");
    }
    let frag = FragReport::new(&fs);
    // Compaction stops at 4% of free space in holes, or when no unit qualifies.
    assert!(frag.aligned_share() >= 0.85, "{frag}");
    fs.unmount().unwrap();
}
