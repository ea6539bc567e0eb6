//! What the ager ages: a winefs pool through the library (the fast path), or any directory
//! through POSIX calls (a winefs FUSE mount, ext4, xfs, tmpfs ...).

use crate::error::{Error, Result};
use crate::fs::Fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// How a new file gets its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CreateMethod {
    /// fallocate(2) of the whole size in one call, as Geriatrix does: the allocator sees the
    /// final size at once.
    #[default]
    Fallocate,
    /// write(2) of the whole size, 1 MiB at a time (allocation as the data arrives).
    Write,
}

/// Space in use, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Bytes in use.
    pub used: u64,
    /// Bytes the file system can hold.
    pub capacity: u64,
}

impl Usage {
    /// `used / capacity` (1 for a file system of no capacity).
    pub fn utilization(&self) -> f64 {
        if self.capacity == 0 {
            1.0
        } else {
            self.used as f64 / self.capacity as f64
        }
    }
}

/// A file system the ager drives. Paths are relative to the aged tree's root ("" is the root).
pub trait AgeTarget {
    /// Make directory `path` (its parent exists); one that exists already is fine.
    fn mkdir(&mut self, path: &str) -> Result<()>;
    /// Create `path` with `size` bytes. `Ok(false)`: the file system is full (the partial
    /// file is removed).
    fn create(&mut self, path: &str, size: u64) -> Result<bool>;
    /// Remove file `path`.
    fn remove(&mut self, path: &str) -> Result<()>;
    /// Space in use and capacity now.
    fn usage(&mut self) -> Result<Usage>;
    /// Names of the regular files directly in directory `path` (for resuming).
    fn files_in(&mut self, path: &str) -> Result<Vec<String>>;
    /// Describe the target for reports.
    fn describe(&self) -> String;
}

fn abs(path: &str) -> String {
    format!("/{path}")
}

/// A winefs pool driven through the library.
pub struct LibraryTarget {
    /// The mounted pool.
    pub fs: Fs,
    /// How new files get their bytes.
    pub method: CreateMethod,
}

impl AgeTarget for LibraryTarget {
    fn mkdir(&mut self, path: &str) -> Result<()> {
        match self.fs.mkdir_path(&abs(path)) {
            Ok(_) | Err(Error::Exists) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn create(&mut self, path: &str, size: u64) -> Result<bool> {
        let p = abs(path);
        let f = match self.fs.create_file(&p) {
            Ok(f) => f,
            Err(Error::NoSpace(_)) => return Ok(false),
            Err(e) => return Err(e),
        };
        let r = match (size, self.method) {
            (0, _) => Ok(()),
            (_, CreateMethod::Fallocate) => f.fallocate(0, size),
            (_, CreateMethod::Write) => {
                let chunk = vec![0xa5u8; (1 << 20).min(size) as usize];
                let mut off = 0;
                let mut r = Ok(());
                while off < size && r.is_ok() {
                    let n = chunk.len().min((size - off) as usize);
                    // A write short of space stores what fits: the file would have a hole.
                    r = match f.write_at(off, &chunk[..n]) {
                        Ok(w) if w < n => Err(Error::NoSpace(format!("wrote {w} of {n} bytes"))),
                        r => r.map(drop),
                    };
                    off += n as u64;
                }
                r
            }
        };
        match r {
            Ok(()) => Ok(true),
            Err(Error::NoSpace(_)) => {
                drop(f);
                self.fs.unlink_path(&p)?;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn remove(&mut self, path: &str) -> Result<()> {
        self.fs.unlink_path(&abs(path))
    }

    fn usage(&mut self) -> Result<Usage> {
        let s = self.fs.statfs();
        Ok(Usage {
            used: (s.blocks - s.free_blocks) * s.block_size,
            capacity: s.blocks * s.block_size,
        })
    }

    fn files_in(&mut self, path: &str) -> Result<Vec<String>> {
        let dir = self.fs.resolve(&abs(path), true)?;
        let mut out = Vec::new();
        for e in self.fs.readdir(dir, 0)? {
            if e.kind != crate::media::layout::FileKind::Dir {
                out.push(String::from_utf8_lossy(&e.name).into_owned());
            }
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        "winefs (library)".into()
    }
}

/// Any directory, through POSIX calls.
pub struct PosixTarget {
    /// The directory the ager's tree goes in.
    pub root: PathBuf,
    /// How new files get their bytes.
    pub method: CreateMethod,
}

fn io_err(what: String, e: std::io::Error) -> Error {
    Error::io(what, e)
}

fn is_enospc(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

impl PosixTarget {
    fn path(&self, p: &str) -> PathBuf {
        if p.is_empty() {
            self.root.clone()
        } else {
            self.root.join(p)
        }
    }

    fn fill(&self, f: &mut std::fs::File, size: u64) -> std::io::Result<()> {
        match self.method {
            CreateMethod::Fallocate => crate::sys::fallocate(f, 0, size),
            CreateMethod::Write => {
                let chunk = vec![0xa5u8; (1 << 20).min(size) as usize];
                let mut left = size;
                while left > 0 {
                    let n = chunk.len().min(left as usize);
                    f.write_all(&chunk[..n])?;
                    left -= n as u64;
                }
                Ok(())
            }
        }
    }
}

impl AgeTarget for PosixTarget {
    fn mkdir(&mut self, path: &str) -> Result<()> {
        let p = self.path(path);
        match std::fs::create_dir(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(io_err(format!("mkdir {}", p.display()), e)),
        }
    }

    fn create(&mut self, path: &str, size: u64) -> Result<bool> {
        let p = self.path(path);
        let mut f = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(f) => f,
            Err(e) if is_enospc(&e) => return Ok(false),
            Err(e) => return Err(io_err(format!("create {}", p.display()), e)),
        };
        if size == 0 {
            return Ok(true);
        }
        match self.fill(&mut f, size) {
            Ok(()) => Ok(true),
            Err(e) if is_enospc(&e) => {
                drop(f);
                std::fs::remove_file(&p)
                    .map_err(|e| io_err(format!("remove {}", p.display()), e))?;
                Ok(false)
            }
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Err(io_err(
                format!(
                    "fallocate {} (this file system has no fallocate; use --create write)",
                    p.display()
                ),
                e,
            )),
            Err(e) => Err(io_err(format!("fill {}", p.display()), e)),
        }
    }

    fn remove(&mut self, path: &str) -> Result<()> {
        let p = self.path(path);
        std::fs::remove_file(&p).map_err(|e| io_err(format!("remove {}", p.display()), e))
    }

    fn usage(&mut self) -> Result<Usage> {
        let (frsize, blocks, free) = crate::sys::space(&self.root)
            .map_err(|e| io_err(format!("statvfs {}", self.root.display()), e))?;
        Ok(Usage {
            used: (blocks - free.min(blocks)) * frsize,
            capacity: blocks * frsize,
        })
    }

    fn files_in(&mut self, path: &str) -> Result<Vec<String>> {
        let p = self.path(path);
        let mut out = Vec::new();
        for e in std::fs::read_dir(&p).map_err(|e| io_err(format!("list {}", p.display()), e))? {
            let e = e.map_err(|e| io_err(format!("list {}", p.display()), e))?;
            let t = e
                .file_type()
                .map_err(|e| io_err(format!("stat in {}", p.display()), e))?;
            if !t.is_dir() {
                out.push(e.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        format!("directory {}", self.root.display())
    }
}

/// Whether `path` can hold the ager's tree: an existing directory.
pub fn check_dir(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Error::Invalid(format!(
            "{} is not a directory",
            path.display()
        ))),
        Err(e) => Err(Error::io(format!("{}", path.display()), e)),
    }
}
