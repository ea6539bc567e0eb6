//! Operator safety: mkfs never touches a pool that is in use, and every option that no pool or
//! command could have is refused with one clear line instead of a panic or a silent rounding.

mod common;

use std::path::Path;
use std::process::Command;
use winefs::{Error, Fs, MkfsOptions};

const BIN: &str = env!("CARGO_BIN_EXE_winefs");
const MIB: u64 = 1 << 20;

/// Run the CLI: (exit code, stdout, stderr).
fn winefs(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A refusal by winefs itself: exit 1, nothing on stdout, one stderr line `winefs: ...` that
/// contains `want` (and no panic).
fn refused(args: &[&str], want: &str) -> String {
    let (code, out, err) = winefs(args);
    assert_eq!(code, 1, "winefs {args:?} exit code; stderr:\n{err}");
    assert_eq!(out, "", "winefs {args:?} printed on stdout");
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with("winefs: ") && lines[0].contains(want),
        "winefs {args:?}: expected one line \"winefs: ...{want}...\", got:\n{err}"
    );
    lines[0].to_string()
}

/// An argument refused by the parser: exit 2, a message naming the option, no panic.
fn rejected_by_parser(args: &[&str], option: &str) {
    let (code, _, err) = winefs(args);
    assert_eq!(code, 2, "winefs {args:?} exit code; stderr:\n{err}");
    assert!(
        err.contains(option) && !err.contains("panicked"),
        "winefs {args:?}: {err}"
    );
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn mkfs_force_refuses_a_mounted_pool_before_touching_it() {
    let (_d, pool) = common::fresh_pool(64 * MIB, Some(1));
    let fs = common::mount(&pool);
    let mut f = fs.create_file("/keep").unwrap();
    f.append(b"still here").unwrap();
    drop(f);
    let len = std::fs::metadata(&pool).unwrap().len();
    // Growing and shrinking: either resize before the lock would change the file under the
    // mount (a shrink would kill this process with SIGBUS on its next access).
    for size in ["128M", "32M"] {
        let line = refused(&["mkfs", s(&pool), "--size", size, "--force"], "in use");
        assert!(line.contains(s(&pool)), "{line}");
        assert_eq!(
            std::fs::metadata(&pool).unwrap().len(),
            len,
            "mkfs --size {size} --force resized a mounted pool"
        );
    }
    // Without --force, and through the library: refused as in use as well.
    refused(&["mkfs", s(&pool), "--size", "64M"], "in use");
    let e = Fs::mkfs(
        &pool,
        &MkfsOptions {
            size: Some(96 * MIB),
            force: true,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(matches!(e, Error::Busy(_)), "{e:?}");
    assert_eq!(std::fs::metadata(&pool).unwrap().len(), len);
    // The mount never noticed.
    assert_eq!(
        fs.open_file("/keep").unwrap().read_all().unwrap(),
        b"still here"
    );
    assert!(fs.check().is_clean());
    fs.unmount().unwrap();
    let fs = common::mount(&pool);
    assert_eq!(
        fs.open_file("/keep").unwrap().read_all().unwrap(),
        b"still here"
    );
    fs.unmount().unwrap();
    // Once unmounted, --force formats it (to the new size).
    let (code, out, err) = winefs(&["mkfs", s(&pool), "--size", "32M", "--force"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(std::fs::metadata(&pool).unwrap().len(), 32 * MIB);
}

#[test]
fn mkfs_options_are_refused_never_rounded_or_panicking() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("p");
    // The library: each nonsense option is a clear error, and nothing is created.
    let bad = [
        (
            Some(64 * MIB),
            Some(0),
            None,
            "partitions must be 1..=256, got 0",
        ),
        (Some(64 * MIB), Some(257), None, "got 257"),
        (Some(64 * MIB), None, Some(0), "inodes must be at least 1"),
        (
            Some(64 * MIB + 100),
            None,
            None,
            "not a multiple of the 4096-byte block",
        ),
        (Some(64 * MIB), Some(1), Some(u64::MAX), "too many inodes"),
    ];
    for (size, partitions, inodes, want) in bad {
        let opts = MkfsOptions {
            size,
            partitions,
            inodes,
            ..Default::default()
        };
        let e = Fs::mkfs(&p, &opts).unwrap_err();
        assert!(
            matches!(e, Error::Invalid(ref m) if m.contains(want)),
            "{opts:?}: {e:?}"
        );
        assert!(!p.exists(), "a refused mkfs ({opts:?}) left a file");
    }
    // The same through the CLI: one line, no panic, no file.
    refused(
        &["mkfs", s(&p), "--size", "64M", "--partitions", "0"],
        "partitions must be 1..=256, got 0",
    );
    refused(
        &["mkfs", s(&p), "--size", "64M", "--inodes", "0"],
        "inodes must be at least 1",
    );
    refused(&["mkfs", s(&p), "--size", "0"], "pool too small: 0 bytes");
    assert!(!p.exists());
    // An existing pool is refused as well, before anything is written.
    common::format(&p, 64 * MIB, Some(1));
    let before = std::fs::read(&p).unwrap();
    refused(
        &[
            "mkfs",
            s(&p),
            "--size",
            "64M",
            "--partitions",
            "0",
            "--force",
        ],
        "partitions must be 1..=256",
    );
    assert!(std::fs::read(&p).unwrap() == before, "a refused mkfs wrote");
    // A valid count is honoured exactly when it is a whole number of groups of 16 per
    // partition (once it was silently raised to 64 per partition) ...
    let q = d.path().join("q");
    let (code, out, err) = winefs(&[
        "mkfs",
        s(&q),
        "--size",
        "64M",
        "--partitions",
        "2",
        "--inodes",
        "64",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("inodes        64 (32 per partition)"), "{out}");
    // ... and rounded up to one, and said so, when it is not.
    let r = d.path().join("r");
    let (code, out, err) = winefs(&[
        "mkfs",
        s(&r),
        "--size",
        "64M",
        "--partitions",
        "2",
        "--inodes",
        "40",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("inodes        64 (32 per partition; --inodes 40 rounded up to whole groups of 16 per partition)"),
        "{out}"
    );
    let fs = common::mount(&r);
    assert_eq!(fs.geometry().total_inodes(), 64);
}

#[test]
fn other_nonsense_options_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let pool = d.path().join("pool");
    common::format(&pool, 64 * MIB, Some(1));
    let mnt = d.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    // Thread counts (once silently clamped), counts and sizes of zero.
    rejected_by_parser(&["mount", s(&pool), s(&mnt), "--threads", "0"], "--threads");
    rejected_by_parser(
        &["mount", s(&pool), s(&mnt), "--threads", "65"],
        "--threads",
    );
    rejected_by_parser(&["bench", "syscall", "--ops", "0"], "--ops");
    rejected_by_parser(&["bench", "syscall", "--repeats", "0"], "--repeats");
    rejected_by_parser(&["bench", "fuse", "--files", "0"], "--files");
    rejected_by_parser(&["bench", "mmap", "--size", "0"], "--size");
    rejected_by_parser(&["demo", "--size", "0"], "--size");
    rejected_by_parser(&["crashtest", "kill", "--rounds", "0"], "--rounds");
    rejected_by_parser(
        &["crashtest", "explore", "--exhaustive-lines", "64"],
        "--exhaustive-lines",
    );
    // --size sizes only a new default pool (it was silently ignored with POOL MOUNTPOINT).
    refused(
        &["mount", s(&pool), s(&mnt), "--size", "1G"],
        "--size only sizes a new default pool",
    );
}
