//! Path helpers of the facade: resolving '/'-separated paths from the root (following symlinks
//! like the kernel, at most 40 of them) and path-based conveniences over the inode-level API.

use crate::error::{Error, Result};
use crate::fs::api::Fs;
use crate::fs::handle::File;
use crate::media::layout::{FileKind, ROOT_INO};
use crate::types::{Attr, RenameFlags};

/// Symlinks followed in one resolution before ELOOP (Linux's limit).
const MAX_SYMLINKS: u32 = 40;

impl Fs {
    /// Resolve a path from the root ('/'-separated; leading '/' optional). Symlinks in
    /// intermediate components are followed; the last one only if `follow`.
    pub fn resolve(&self, path: &str, follow: bool) -> Result<u64> {
        let mut budget = MAX_SYMLINKS;
        self.resolve_from(ROOT_INO, path.as_bytes(), follow, &mut budget)
    }

    fn resolve_from(&self, start: u64, path: &[u8], follow: bool, budget: &mut u32) -> Result<u64> {
        let mut cur = if path.first() == Some(&b'/') {
            ROOT_INO
        } else {
            start
        };
        let comps: Vec<&[u8]> = path
            .split(|&c| c == b'/')
            .filter(|c| !c.is_empty())
            .collect();
        for (i, c) in comps.iter().enumerate() {
            let last = i + 1 == comps.len();
            let a = self.lookup(cur, c)?;
            if a.kind == FileKind::Symlink && (!last || follow) {
                if *budget == 0 {
                    return Err(Error::Loop);
                }
                *budget -= 1;
                let t = self.readlink(a.ino)?;
                cur = self.resolve_from(cur, &t, true, budget)?;
            } else {
                if !last && a.kind != FileKind::Dir {
                    return Err(Error::NotDir);
                }
                cur = a.ino;
            }
        }
        Ok(cur)
    }

    /// Split a path into (parent inode, final name).
    pub fn parent_of(&self, path: &str) -> Result<(u64, Vec<u8>)> {
        let t = path.trim_end_matches('/');
        let (dirpart, name) = match t.rfind('/') {
            Some(i) => (&t[..i], &t[i + 1..]),
            None => ("", t),
        };
        if name.is_empty() {
            return Err(Error::Invalid(format!(
                "path {path:?} has no final component"
            )));
        }
        let parent = self.resolve(dirpart, true)?;
        if self.getattr(parent)?.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        Ok((parent, name.as_bytes().to_vec()))
    }

    /// Attributes of the file at `path` (following a final symlink).
    pub fn stat_path(&self, path: &str) -> Result<Attr> {
        self.getattr(self.resolve(path, true)?)
    }

    /// Create a new file (error if it exists) and open it.
    pub fn create_file(&self, path: &str) -> Result<File> {
        let (p, n) = self.parent_of(path)?;
        let a = self.create(p, &n, 0o644, 0, 0)?;
        File::open(self.clone(), a.ino)
    }

    /// Open inode `ino` as a [`File`] handle (directories too; the handle only counts it open).
    pub fn open_inode(&self, ino: u64) -> Result<File> {
        File::open(self.clone(), ino)
    }

    /// Open an existing file.
    pub fn open_file(&self, path: &str) -> Result<File> {
        let ino = self.resolve(path, true)?;
        if self.getattr(ino)?.kind == FileKind::Dir {
            return Err(Error::IsDir);
        }
        File::open(self.clone(), ino)
    }

    /// Create a directory (mode 0755).
    pub fn mkdir_path(&self, path: &str) -> Result<Attr> {
        let (p, n) = self.parent_of(path)?;
        self.mkdir(p, &n, 0o755, 0, 0)
    }

    /// Remove a file (not a directory).
    pub fn unlink_path(&self, path: &str) -> Result<()> {
        let (p, n) = self.parent_of(path)?;
        self.unlink(p, &n)
    }

    /// Remove an empty directory.
    pub fn rmdir_path(&self, path: &str) -> Result<()> {
        let (p, n) = self.parent_of(path)?;
        self.rmdir(p, &n)
    }

    /// Rename, replacing the target if it exists.
    pub fn rename_path(&self, from: &str, to: &str) -> Result<()> {
        let (p1, n1) = self.parent_of(from)?;
        let (p2, n2) = self.parent_of(to)?;
        self.rename(p1, &n1, p2, &n2, RenameFlags::default())
    }

    /// Names in a directory (without "." and "..").
    pub fn list_dir(&self, path: &str) -> Result<Vec<Vec<u8>>> {
        let ino = self.resolve(path, true)?;
        Ok(self.readdir(ino, 2)?.into_iter().map(|e| e.name).collect())
    }
}
