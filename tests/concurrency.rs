//! Many threads at once: per-CPU journals, partitions and inode locks under contention.

mod common;

use std::sync::Arc;
use winefs::{Consistency, RenameFlags};

fn run(mode: Consistency) {
    let (_d, p) = common::fresh_pool(128 << 20, Some(4));
    let fs = Arc::new(common::mount_with(&p, mode));
    let shared = fs.create(fs.root(), b"shared", 0o644, 0, 0).unwrap().ino;
    let threads: Vec<_> = (0..6u8)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let dir = fs
                    .mkdir(fs.root(), format!("t{t}").as_bytes(), 0o755, 0, 0)
                    .unwrap()
                    .ino;
                for i in 0..150u32 {
                    let name = format!("f{i}");
                    let a = fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap();
                    let data = vec![
                        t.wrapping_mul(31).wrapping_add(i as u8);
                        1000 + (i as usize * 97) % 9000
                    ];
                    fs.write(a.ino, 0, &data).unwrap();
                    // Each thread owns one 4 KiB slot of the shared file.
                    fs.write(
                        shared,
                        t as u64 * 4096 + (i as u64 % 8) * 512,
                        &[t + 1; 512],
                    )
                    .unwrap();
                    if i % 3 == 0 {
                        fs.unlink(dir, name.as_bytes()).unwrap();
                    } else if i % 3 == 1 {
                        fs.rename(
                            dir,
                            name.as_bytes(),
                            fs.root(),
                            format!("m{t}-{i}").as_bytes(),
                            RenameFlags::default(),
                        )
                        .unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let r = fs.check();
    assert!(r.is_clean(), "{:?}", r.problems);
    for t in 0..6u8 {
        let mut b = vec![0u8; 4096];
        fs.read(shared, t as u64 * 4096, &mut b).unwrap();
        assert!(
            b.iter().all(|&x| x == t + 1),
            "thread {t}'s slot of the shared file"
        );
        for i in (1..150u32).step_by(3) {
            let a = fs.stat_path(&format!("/m{t}-{i}")).unwrap();
            assert_eq!(a.size, 1000 + (i as u64 * 97) % 9000);
        }
        assert_eq!(fs.list_dir(&format!("/t{t}")).unwrap().len(), 50);
    }
    let fs = Arc::try_unwrap(fs).ok().expect("threads joined");
    fs.unmount().unwrap();
    let fs = common::mount(&p);
    let r = fs.check();
    assert!(r.is_clean(), "after remount: {:?}", r.problems);
}

#[test]
fn concurrent_namespace_and_data_operations_strict() {
    run(Consistency::Strict);
}

#[test]
fn concurrent_namespace_and_data_operations_relaxed() {
    run(Consistency::Relaxed);
}

/// Alternate writing under contention, with the zones held to their own slots (a ballast file
/// leaves the pool nearly full): the background worker and the writers write slots back all
/// along.
#[test]
fn alternate_writes_under_contention_keep_every_record() {
    alternate_writes_under_contention(false);
}

/// The same with zones free to grow: the writers' slots spread into units of free space.
#[test]
fn alternate_writes_into_grown_zones_under_contention_keep_every_record() {
    alternate_writes_under_contention(true);
}

/// Four writer threads overwrite their own interleaved 192-byte records of one file (so they
/// share blocks and slots) far more often than the zones have slots of their own, while a
/// reader checks that every record it reads is one its writer wrote whole. Every record ends
/// as its writer's last, before and after a crash (no clean unmount to write slots back) and
/// a remount.
fn alternate_writes_under_contention(grow: bool) {
    const RECORD: u64 = 192;
    const RECORDS: u64 = 4 * 4096; // 3 MiB: 768 blocks, against 64 slots per zone
    const WRITERS: u64 = 4;
    let (_d, p) = common::fresh_pool(48 << 20, Some(2));
    let fs = Arc::new(common::mount_with(&p, Consistency::Strict));
    assert!(fs.geometry().zone_slots > 0);
    if !grow {
        let ballast = fs.create(fs.root(), b"ballast", 0o644, 0, 0).unwrap().ino;
        // All but 4 MiB: the records' 3 MiB and their map, no room to lend (`Room::may_lend`).
        fs.fallocate(ballast, 0, (fs.statfs().free_blocks - 1024) * 4096, false).unwrap();
    }
    let ino = fs.create(fs.root(), b"records", 0o644, 0, 0).unwrap().ino;
    fs.fallocate(ino, 0, RECORDS * RECORD, false).unwrap();
    let extents_before = fs.statfs().free_aligned_extents;
    // Record r belongs to writer r % WRITERS; version v of it is bytes of (r, v) throughout.
    let body = |r: u64, v: u64| -> Vec<u8> {
        let tag = (r as u32).to_le_bytes();
        let mut b: Vec<u8> = (0..RECORD).map(|i| (v as u8).wrapping_add(i as u8)).collect();
        b[..4].copy_from_slice(&tag);
        b[4..12].copy_from_slice(&v.to_le_bytes());
        b
    };
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Records the reader found written and whole; writers wait halfway for the first, so the
    // checks overlap writes even where one CPU runs every thread (the writes take ~30 ms).
    let checked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reader = {
        let (fs, done, checked) = (fs.clone(), done.clone(), checked.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; RECORD as usize];
            let mut x = 7u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let r = (x >> 33) % RECORDS;
                fs.read(ino, r * RECORD, &mut buf).unwrap();
                let v = u64::from_le_bytes(buf[4..12].try_into().unwrap());
                if v > 0 {
                    assert_eq!(buf, body(r, v), "record {r} torn or foreign");
                    checked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        })
    };
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (fs, checked) = (fs.clone(), checked.clone());
            std::thread::spawn(move || {
                let mut last = vec![0u64; RECORDS as usize];
                let mut x = w + 1;
                for v in 1..=6000u64 {
                    if v == 3000 {
                        // Bounded, so that a reader that panicked fails the test at its join.
                        let waited = std::time::Instant::now();
                        while checked.load(std::sync::atomic::Ordering::Relaxed) == 0
                            && waited.elapsed() < std::time::Duration::from_secs(10)
                        {
                            std::thread::yield_now();
                        }
                    }
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let r = ((x >> 33) % (RECORDS / WRITERS)) * WRITERS + w;
                    fs.write(ino, r * RECORD, &body(r, v)).unwrap();
                    last[r as usize] = v;
                }
                last
            })
        })
        .collect();
    let mut last = vec![0u64; RECORDS as usize];
    for h in writers {
        for (r, v) in h.join().unwrap().into_iter().enumerate() {
            last[r] = last[r].max(v);
        }
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    reader.join().unwrap();
    assert!(checked.load(std::sync::atomic::Ordering::Relaxed) > 0);
    // Units lent to the zones are aligned extents out of the free ones.
    let extents_after = fs.statfs().free_aligned_extents;
    match grow {
        true => assert!(extents_after < extents_before, "the zones did not grow"),
        false => assert_eq!(extents_after, extents_before, "the zones grew on a fuller pool"),
    }
    let check = |fs: &winefs::Fs| {
        let mut all = vec![0u8; (RECORDS * RECORD) as usize];
        fs.read(ino, 0, &mut all).unwrap();
        for r in 0..RECORDS {
            let got = &all[(r * RECORD) as usize..((r + 1) * RECORD) as usize];
            match last[r as usize] {
                0 => assert!(got.iter().all(|&b| b == 0), "record {r} never written"),
                v => assert_eq!(got, &body(r, v)[..], "record {r} is not version {v}"),
            }
        }
        assert!(fs.check().is_clean());
    };
    check(&fs);
    // A crash: nothing writes the slots back; recovery does.
    Arc::into_inner(fs).unwrap().simulate_crash();
    let fs = common::mount_with(&p, Consistency::Strict);
    check(&fs);
    fs.unmount().unwrap();
}

#[test]
fn racing_name_changes_on_the_same_names_stay_consistent() {
    // Creates, unlinks, links, lookups, mkdirs and rmdirs race on three names in two shared
    // directories (renames among them now and then): each call may only find the name there
    // or gone, and the namespace must check clean afterwards, and after a remount.
    use winefs::Error;
    let (_d, p) = common::fresh_pool(128 << 20, Some(4));
    let fs = Arc::new(common::mount_with(&p, Consistency::Strict));
    let root = fs.root();
    let dirs = [
        fs.mkdir(root, b"a", 0o755, 0, 0).unwrap().ino,
        fs.mkdir(root, b"b", 0o755, 0, 0).unwrap().ino,
    ];
    let threads = 6u64;
    let start = Arc::new(std::sync::Barrier::new(threads as usize));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (fs, start) = (fs.clone(), start.clone());
            std::thread::spawn(move || {
                let own = fs
                    .create(fs.root(), format!("own{t}").as_bytes(), 0o644, 0, 0)
                    .unwrap()
                    .ino;
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                let mut done = [0u32; 7];
                start.wait();
                for _ in 0..100_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let dir = dirs[(x % 2) as usize];
                    let name = format!("n{}", (x >> 8) % 3);
                    let name = name.as_bytes();
                    // Mostly creates, unlinks and links: the races that free and reuse inodes.
                    let op = [0, 0, 1, 1, 1, 2, 2, 3, 4, 5, 6][((x >> 16) % 11) as usize];
                    let r = match op {
                        0 => fs.create(dir, name, 0o644, 0, 0).map(drop),
                        1 => fs.unlink(dir, name),
                        2 => fs.link(own, dir, name).map(drop),
                        3 => fs.lookup(dir, name).map(drop),
                        4 => fs.mkdir(dir, name, 0o755, 0, 0).map(drop),
                        5 => fs.rmdir(dir, name),
                        _ => {
                            let to = dirs[((x >> 24) % 2) as usize];
                            let to_name = format!("n{}", (x >> 32) % 3);
                            fs.rename(dir, name, to, to_name.as_bytes(), RenameFlags::default())
                        }
                    };
                    match r {
                        Ok(()) => done[op] += 1,
                        Err(
                            Error::Exists
                            | Error::NotFound
                            | Error::IsDir
                            | Error::NotDir
                            | Error::NotEmpty,
                        ) => {}
                        Err(e) => panic!("thread {t}, op {op} on {:?}: {e}", name),
                    }
                }
                done
            })
        })
        .collect();
    let mut done = [0u32; 7];
    for w in workers {
        for (d, n) in done.iter_mut().zip(w.join().unwrap()) {
            *d += n;
        }
    }
    // Every kind of call succeeded some of the time: the race was run, not refused.
    assert!(done.iter().all(|&n| n > 0), "{done:?}");
    let r = fs.check();
    assert!(r.is_clean(), "{:?}", r.problems);
    let fs = Arc::try_unwrap(fs).ok().expect("threads joined");
    fs.unmount().unwrap();
    let fs = common::mount(&p);
    let r = fs.check();
    assert!(r.is_clean(), "after remount: {:?}", r.problems);
}

#[test]
fn readers_of_a_directory_see_it_whole_while_its_names_change() {
    // Writers create and unlink names of their own in one directory (and make and remove a
    // directory there) while readers look names up, list the directory and stat it: lookups
    // and listings go on while a name change commits (DESIGN §6), so they must still see every
    // name that stays, once, and nothing half made.
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::atomic::{AtomicBool, Ordering};
    use winefs::Error;
    let (_d, p) = common::fresh_pool(128 << 20, Some(4));
    let fs = Arc::new(common::mount_with(&p, Consistency::Strict));
    let dir = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    let stable: BTreeMap<Vec<u8>, u64> = (0..10)
        .map(|i| {
            let name = format!("s{i}").into_bytes();
            let ino = fs.create(dir, &name, 0o644, 0, 0).unwrap().ino;
            (name, ino)
        })
        .collect();
    let stable = Arc::new(stable);
    let writing = Arc::new(AtomicBool::new(true));
    let writers: Vec<_> = (0..3u32)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut present = BTreeSet::new();
                for i in 0..20_000u32 {
                    let add = format!("w{t}_{}", i % 20).into_bytes();
                    let r = fs.create(dir, &add, 0o644, 0, 0).map(drop);
                    match (present.contains(&add), r) {
                        (false, Ok(())) => {
                            present.insert(add);
                        }
                        (true, Err(Error::Exists)) => {}
                        (had, r) => panic!("create {add:?} (there: {had}): {r:?}"),
                    }
                    let del = format!("w{t}_{}", (i + 7) % 20).into_bytes();
                    let r = fs.unlink(dir, &del);
                    match (present.remove(&del), r) {
                        (true, Ok(())) | (false, Err(Error::NotFound)) => {}
                        (had, r) => panic!("unlink {del:?} (there: {had}): {r:?}"),
                    }
                    if i % 50 == 0 {
                        let sub = format!("sub{t}").into_bytes();
                        fs.mkdir(dir, &sub, 0o755, 0, 0).unwrap();
                        fs.rmdir(dir, &sub).unwrap();
                    }
                }
                present
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (fs, stable, writing) = (fs.clone(), stable.clone(), writing.clone());
            std::thread::spawn(move || {
                let mut looks = 0u64;
                while writing.load(Ordering::Relaxed) {
                    for (name, &ino) in stable.iter() {
                        assert_eq!(fs.lookup(dir, name).unwrap().ino, ino);
                    }
                    let listed: Vec<Vec<u8>> =
                        fs.readdir(dir, 0).unwrap().into_iter().map(|e| e.name).collect();
                    let unique: BTreeSet<&Vec<u8>> = listed.iter().collect();
                    assert_eq!(unique.len(), listed.len(), "a name listed twice: {listed:?}");
                    for name in stable.keys() {
                        assert!(unique.contains(name), "{name:?} missing from {listed:?}");
                    }
                    for name in &listed {
                        let ok = name.as_slice() == b"."
                            || name.as_slice() == b".."
                            || name.starts_with(b"s")
                            || name.starts_with(b"w");
                        assert!(ok, "a name nobody made: {name:?}");
                    }
                    assert!(fs.getattr(dir).unwrap().nlink >= 2);
                    looks += 1;
                }
                looks
            })
        })
        .collect();
    let present: Vec<BTreeSet<Vec<u8>>> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    writing.store(false, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0, "the readers ran");
    }
    let check = |fs: &winefs::Fs| {
        let listed: BTreeSet<Vec<u8>> =
            fs.readdir(dir, 0).unwrap().into_iter().map(|e| e.name).collect();
        let mut want: BTreeSet<Vec<u8>> = present.iter().flatten().cloned().collect();
        want.extend(stable.keys().cloned());
        want.extend([b".".to_vec(), b"..".to_vec()]);
        assert_eq!(listed, want);
        assert_eq!(fs.getattr(dir).unwrap().nlink, 2, "the subdirectories are gone");
        let r = fs.check();
        assert!(r.is_clean(), "{:?}", r.problems);
    };
    check(&fs);
    let fs = Arc::try_unwrap(fs).ok().expect("threads joined");
    fs.unmount().unwrap();
    check(&common::mount(&p));
}
