//! The ager (`winefs::age`): its distributions match the profile, it is deterministic under a
//! seed, it reaches and holds the utilization target, it resumes, and it drives a directory
//! through POSIX calls as well as a pool through the library.

use std::collections::BTreeMap;
use std::path::Path;
use winefs::age::profile::{Profile, chi_square, chi_square_critical_95};
use winefs::age::{AgeConfig, AgeReport, Ager, CreateMethod, LibraryTarget, PosixTarget};
use winefs::{Fs, MountOptions};

mod common;

const MIB: u64 = 1 << 20;

fn pool(dir: &Path, name: &str, size: u64) -> Fs {
    let p = dir.join(name);
    // One partition: with per-CPU partitions, where a file lands (and so, now and then, how
    // many metadata blocks it needs) depends on the core the thread runs on.
    common::format(&p, size, Some(1));
    // The ager's own properties are tested on a file system without background work: hole
    // compaction moves blocks on its own schedule, so usage (and every choice after it) would
    // depend on timing. tests/compact.rs ages with it on.
    common::mount_opts(
        &p,
        MountOptions {
            no_background_rewrite: true,
            ..Default::default()
        },
    )
}

fn cfg(profile: &str, util: f64, writes: f64, seed: u64) -> AgeConfig {
    let mut c = AgeConfig::new(Profile::load(profile).unwrap());
    c.utilization = util;
    c.writes = writes;
    c.seed = seed;
    c
}

fn age_pool(fs: &Fs, c: &AgeConfig) -> (AgeReport, Vec<(String, u64)>) {
    let target = LibraryTarget {
        fs: fs.clone(),
        method: CreateMethod::Fallocate,
    };
    let mut ager = Ager::new(c, target).unwrap();
    let r = ager.run().unwrap();
    (r, ager.live())
}

/// Every regular file under `dir` of the pool with its size.
fn tree(fs: &Fs, dir: &str, out: &mut BTreeMap<String, u64>) {
    let ino = fs
        .resolve(if dir.is_empty() { "/" } else { dir }, true)
        .unwrap();
    for e in fs.readdir(ino, 0).unwrap() {
        let name = String::from_utf8(e.name.clone()).unwrap();
        if name == "." || name == ".." {
            continue;
        }
        let path = format!("{dir}/{name}");
        if e.kind == winefs::media::layout::FileKind::Dir {
            tree(fs, &path, out);
        } else {
            out.insert(path, fs.getattr(e.ino).unwrap().size);
        }
    }
}

#[test]
fn sampled_sizes_and_depths_match_the_profile() {
    let dir = tempfile::tempdir().unwrap();
    let fs = pool(dir.path(), "p", 256 * MIB);
    let c = cfg("agrawal", 0.75, 20.0, 7);
    let (r, _) = age_pool(&fs, &c);
    assert!(r.creates > 20_000, "{r}");
    let sizes: Vec<f64> = c.profile.sizes.iter().map(|s| s.1).collect();
    let (stat, df) = chi_square(&r.size_counts, &sizes);
    assert_eq!(df, 10);
    assert!(
        stat < chi_square_critical_95(df),
        "sizes: chi-square {stat} ({r})"
    );
    let depths: Vec<f64> = c.profile.dirs.iter().map(|d| d.weight).collect();
    let (stat, df) = chi_square(&r.depth_counts, &depths);
    assert!(
        stat < chi_square_critical_95(df),
        "depths: chi-square {stat}"
    );
    // The test has teeth: the same counts against a skewed profile are rejected.
    let mut skewed = sizes.clone();
    skewed.swap(0, 4);
    let (stat, df) = chi_square(&r.size_counts, &skewed);
    assert!(stat > chi_square_critical_95(df));
    fs.unmount().unwrap();
}

#[test]
fn deletions_drive_ages_to_the_profile() {
    let dir = tempfile::tempdir().unwrap();
    let weights: Vec<f64> = Profile::load("agrawal")
        .unwrap()
        .ages
        .iter()
        .map(|a| a.1)
        .collect();
    // Right after the fill every file is about as old as the clock: the last buckets hold all.
    let fs = pool(dir.path(), "fill", 256 * MIB);
    let (fill, _) = age_pool(&fs, &cfg("agrawal", 0.75, 0.0, 3));
    fs.unmount().unwrap();
    let fs = pool(dir.path(), "churn", 256 * MIB);
    let (churn, _) = age_pool(&fs, &cfg("agrawal", 0.75, 40.0, 3));
    fs.unmount().unwrap();
    assert!(
        fill.age_chi_square > 100.0 * churn.age_chi_square,
        "{fill}\n{churn}"
    );
    // Every bucket expected to hold at least 150 live files (the bulk: about 85% of them) holds
    // its share within 20%. (Younger buckets, expecting a few dozen files or fewer, swing with
    // every burst of creates that follows the deletion of a large file; the report's
    // chi-square shows that noise.)
    let n: u64 = churn.age_counts.iter().sum();
    let total: f64 = weights.iter().sum();
    let mut checked = 0;
    for (i, (&c, &w)) in churn.age_counts.iter().zip(&weights).enumerate() {
        let e = n as f64 * w / total;
        if e >= 150.0 {
            checked += 1;
            assert!(
                (c as f64 - e).abs() <= 0.2 * e,
                "bucket {i}: {c} vs {e:.0} ({churn})"
            );
        }
    }
    assert!(checked >= 3);
}

#[test]
fn same_seed_same_run_other_seed_other_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, seed: u64| {
        let fs = pool(dir.path(), name, 96 * MIB);
        let (r, live) = age_pool(&fs, &cfg("agrawal", 0.7, 4.0, seed));
        let mut t = BTreeMap::new();
        tree(&fs, "", &mut t);
        fs.unmount().unwrap();
        (r, live, t)
    };
    let (r1, live1, t1) = run("a", 11);
    let (r2, live2, t2) = run("b", 11);
    let (_, live3, _) = run("c", 12);
    assert_eq!(
        (r1.creates, r1.deletes, r1.written, &r1.age_counts),
        (r2.creates, r2.deletes, r2.written, &r2.age_counts)
    );
    assert_eq!(live1, live2);
    assert_eq!(t1, t2);
    assert_ne!(live1, live3);
    // The ager's view is the file system's: every live file, at its size, and nothing else.
    let mine: BTreeMap<String, u64> = live1
        .into_iter()
        .map(|(p, s)| (format!("/{p}"), s))
        .collect();
    assert_eq!(mine, t1);
}

#[test]
fn utilization_is_reached_and_held() {
    let dir = tempfile::tempdir().unwrap();
    let fs = pool(dir.path(), "p", 256 * MIB);
    let c = cfg("agrawal", 0.6, 6.0, 5);
    let (r, _) = age_pool(&fs, &c);
    let cap = r.usage.capacity as f64;
    // One create or delete moves utilization by at most the largest file (8 MiB) and a few
    // blocks of metadata.
    let step = (8 * MIB + 64 * 4096) as f64 / cap;
    let (lo, hi) = r.churn_range.unwrap();
    assert!(lo >= 0.6 - step && hi <= 0.6 + step, "{r}");
    assert!((r.usage.utilization() - 0.6).abs() <= step, "{r}");
    assert!(r.written as f64 >= 6.0 * cap, "{r}");
    assert!(r.deletes > 1000);
    fs.unmount().unwrap();
    // A target already exceeded is an error, not a silent no-op.
    let fs = pool(dir.path(), "full", 32 * MIB);
    let f = fs.create_file("/big").unwrap();
    f.fallocate(0, 20 * MIB).unwrap();
    let target = LibraryTarget {
        fs: fs.clone(),
        method: CreateMethod::Fallocate,
    };
    let c = cfg("agrawal", 0.5, 1.0, 1);
    let e = Ager::new(&c, target).unwrap().run().unwrap_err();
    assert!(e.to_string().contains("already exceeded"), "{e}");
}

#[test]
fn resumes_after_an_interruption() {
    let dir = tempfile::tempdir().unwrap();
    let fs = pool(dir.path(), "p", 128 * MIB);
    let state = dir.path().join("state");
    let mut c = cfg("wang", 0.7, 2.0, 9);
    c.state = Some(state.clone());
    let (first, live) = age_pool(&fs, &c);
    assert!(!first.resumed);
    // An interruption after the last checkpoint: a file the state does not know (made after
    // it) and a file it lists that is gone (deleted after it).
    let f = fs.create_file("/f99999999").unwrap();
    f.write_at(0, b"made after the checkpoint").unwrap();
    drop(f);
    let gone = &live[0].0;
    fs.unlink_path(&format!("/{gone}")).unwrap();
    c.writes = 5.0;
    let target = LibraryTarget {
        fs: fs.clone(),
        method: CreateMethod::Fallocate,
    };
    let mut ager = Ager::new(&c, target).unwrap();
    let before = ager.status().unwrap();
    assert!(before.resumed);
    assert_eq!(before.live_files, first.live_files - 1);
    assert!(
        fs.resolve("/f99999999", false).is_err(),
        "the stray file was removed"
    );
    let second = ager.run().unwrap();
    drop(ager);
    assert!(second.written as f64 >= 5.0 * second.usage.capacity as f64);
    assert!(second.creates > first.creates);
    let mut t = BTreeMap::new();
    tree(&fs, "", &mut t);
    assert_eq!(t.len() as u64, second.live_files);
    let ck = fs.check();
    assert!(ck.problems.is_empty(), "{:?}", ck.problems);
    fs.unmount().unwrap();
    // A state made with another profile is refused.
    let fs = common::mount(&dir.path().join("p"));
    let mut other = cfg("agrawal", 0.7, 5.0, 9);
    other.state = Some(state);
    let target = LibraryTarget {
        fs: fs.clone(),
        method: CreateMethod::Fallocate,
    };
    let e = Ager::new(&other, target).err().unwrap();
    assert!(e.to_string().contains("profile wang"), "{e}");
    fs.unmount().unwrap();
}

#[test]
fn ages_a_directory_through_posix_calls() {
    assert_eq!(
        winefs::sys::euid(),
        0,
        "this test mounts a tmpfs; run it as root"
    );
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m", "none"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success());
    let c = cfg("agrawal", 0.5, 3.0, 2);
    let r = {
        let target = PosixTarget {
            root: mnt.clone(),
            method: CreateMethod::Write,
        };
        let mut ager = Ager::new(&c, target).unwrap();
        ager.run()
    };
    let used = winefs::sys::space(&mnt).unwrap();
    let _ = std::process::Command::new("umount").arg(&mnt).status();
    let r = r.unwrap();
    assert!(r.written >= 3 * r.usage.capacity, "{r}");
    assert!((r.usage.utilization() - 0.5).abs() < 0.15, "{r}");
    let util = 1.0 - used.2 as f64 / used.1 as f64;
    assert!((util - r.usage.utilization()).abs() < 0.01);
}
