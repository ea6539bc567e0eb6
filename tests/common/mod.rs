//! The prologue the integration tests share: format a pool (in a temporary directory or at a
//! given path) and mount it.

// Each test file uses its own subset of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use winefs::{Consistency, Fs, MkfsOptions, MountOptions};

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
