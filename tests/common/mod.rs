//! The prologue the integration tests share: format a pool (in a temporary directory or at a
//! given path) and mount it.

// Each test file uses its own subset of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use winefs::{Consistency, Error, Fs, MkfsOptions, MountOptions};

/// Format a pool of `size` bytes at `path` (`partitions`: None for the default, one per CPU).
pub fn format(path: &Path, size: u64, partitions: Option<u32>) {
    format_with(
        path,
        &MkfsOptions {
            size: Some(size),
            partitions,
            ..Default::default()
        },
    );
}

/// Format a pool at `path` with any options.
pub fn format_with(path: &Path, opts: &MkfsOptions) {
    Fs::mkfs(path, opts).unwrap_or_else(|e| panic!("mkfs {}: {e}", path.display()));
}

/// A freshly formatted pool in a new temporary directory (removed when the guard drops).
pub fn fresh_pool(size: u64, partitions: Option<u32>) -> (tempfile::TempDir, PathBuf) {
    fresh_pool_with(&MkfsOptions {
        size: Some(size),
        partitions,
        ..Default::default()
    })
}

/// [`fresh_pool`] with any mkfs options.
pub fn fresh_pool_with(opts: &MkfsOptions) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let path = dir.path().join("pool");
    format_with(&path, opts);
    (dir, path)
}

/// Mount with the default options (strict).
pub fn mount(path: &Path) -> Fs {
    mount_with(path, Consistency::Strict)
}

/// Mount with the given data guarantees.
pub fn mount_with(path: &Path, consistency: Consistency) -> Fs {
    mount_opts(
        path,
        MountOptions {
            consistency,
            ..Default::default()
        },
    )
}

/// Mount with any options.
pub fn mount_opts(path: &Path, opts: MountOptions) -> Fs {
    Fs::mount(path, opts).unwrap_or_else(|e| panic!("mount {}: {e}", path.display()))
}

// ----- damaged pools: patching images, refusals and repairs -----

/// `len` bytes of a pattern that differs with `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Overwrite bytes of the pool image at `p`.
pub fn patch(p: &Path, off: u64, bytes: &[u8]) {
    let mut img = std::fs::read(p).unwrap();
    img[off as usize..off as usize + bytes.len()].copy_from_slice(bytes);
    std::fs::write(p, img).unwrap();
}

/// Flip the bits of `mask` in the byte at `off` of the pool image at `p`.
pub fn flip(p: &Path, off: u64, mask: u8) {
    let img = std::fs::read(p).unwrap();
    patch(p, off, &[img[off as usize] ^ mask]);
}

/// Mounting `p` fails with `Corrupted` containing `what`, and writes nothing.
pub fn refused(p: &Path, what: &str) -> String {
    let before = std::fs::read(p).unwrap();
    let e = match Fs::mount(p, MountOptions::default()) {
        Ok(_) => panic!("a pool that should be refused ({what}) mounted"),
        Err(e) => e,
    };
    assert!(
        matches!(&e, Error::Corrupted(m) if m.contains(what)),
        "expected a refusal mentioning {what:?}, got: {e}"
    );
    assert!(
        std::fs::read(p).unwrap() == before,
        "a refused mount wrote to the pool ({e})"
    );
    e.to_string()
}

/// `fsck --repair` (the library's `Fs::repair_pool`) of `p` leaves nothing, one of its change
/// lines mentions `expect`, and the pool then checks clean.
pub fn repaired(p: &Path, expect: &str) -> winefs::RepairReport {
    let rep = Fs::repair_pool(p).unwrap();
    assert!(rep.left.is_empty(), "left: {:?}", rep.left);
    assert!(
        rep.changes.iter().any(|c| c.contains(expect)),
        "no change mentions {expect:?}: {:?}",
        rep.changes
    );
    let after = winefs::state::fsck::check_pool(p).unwrap();
    assert!(after.is_clean(), "{:?}", after.problems);
    rep
}

/// Where two transcripts of the same script differ, a pair of lines each (`a` and `b` name
/// them, padded to one width), and a last line if one has more lines: empty when equal.
pub fn transcript_differences(a: (&str, &str), b: (&str, &str)) -> Vec<String> {
    let ((name_a, text_a), (name_b, text_b)) = (a, b);
    let mut differ: Vec<String> = text_a
        .lines()
        .zip(text_b.lines())
        .filter(|(x, y)| x != y)
        .map(|(x, y)| format!("  {name_a} {x}\n  {name_b} {y}"))
        .collect();
    let (len_a, len_b) = (text_a.lines().count(), text_b.lines().count());
    if len_a != len_b {
        differ.push(format!("  {name_a} {len_a} lines, {name_b} {len_b} lines"));
    }
    differ
}
