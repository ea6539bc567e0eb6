//! What `winefs bench workload` ([`super::workload`]) runs on: one small file interface
//! ([`Target`]) with two implementations — the winefs library called directly ([`LibTarget`])
//! and `std::fs` on any directory ([`PosixTarget`]) — and the setups that provide a fresh one
//! each: a new pool (clean or a copy of an aged one) through the library (the FUSE mount of one
//! is `bench::fuse::FuseServed`, shared with `bench fuse`), a directory on the host tmpfs,
//! libfuse's `passthrough_ll` over tmpfs, and ext4 and xfs made on loop images (root).

use super::app_env::last_nonempty_line;
use super::fuse::{Mounted, build_passthrough};
#[cfg(test)]
use super::fuse::check_and_unmount;
use super::syscall::io_err;
use crate::FileKind;
use crate::error::{Error, Result};
use crate::fs::Fs;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// How many pieces the allocator left the file set's files in, counted after a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FilePieces {
    /// Regular files in the file set.
    pub files: u64,
    /// Their physically contiguous runs of blocks, in all.
    pub pieces: u64,
    /// The most runs any one of them has.
    pub most: u64,
}

impl FilePieces {
    /// Runs per file (0 with no files).
    pub fn per_file(&self) -> f64 {
        self.pieces as f64 / self.files.max(1) as f64
    }
}

/// Count the physically contiguous runs of every regular file of the file set (`/wl` of `fs`,
/// where both [`LibTarget`] and [`PosixTarget`] on a winefs mount put it).
pub(crate) fn file_pieces(fs: &Fs) -> Result<FilePieces> {
    let mut out = FilePieces::default();
    let mut dirs = vec![fs.lookup(fs.root(), b"wl")?.ino];
    while let Some(d) = dirs.pop() {
        for e in fs.readdir(d, 0)? {
            match e.kind {
                FileKind::Dir if e.name != b"." && e.name != b".." => dirs.push(e.ino),
                FileKind::File => {
                    let n = contiguous_runs(&fs.extents(e.ino)?);
                    out.files += 1;
                    out.pieces += n;
                    out.most = out.most.max(n);
                }
                _ => {}
            }
        }
    }
    Ok(out)
}

/// Runs of `(logical, phys, len)` extents in logical order once neighbours that continue each
/// other both logically and physically are counted as one.
fn contiguous_runs(extents: &[(u64, u64, u64)]) -> u64 {
    let joined = extents
        .windows(2)
        .filter(|w| w[0].0 + w[0].2 == w[1].0 && w[0].1 + w[0].2 == w[1].1)
        .count();
    (extents.len() - joined) as u64
}

/// One file of a workload's file set: directory `dir`, file number `idx` (named `f<idx>`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FileRef {
    pub(crate) dir: u64,
    pub(crate) idx: u64,
}

/// How a file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpenFor {
    /// Reading only.
    Read,
    /// Appending (O_APPEND: every write lands at the end, also with other writers).
    Append,
    /// Writing in place.
    Write,
}

/// The calls a workload makes. Implementations are shared by the workload's threads.
pub(crate) trait Target: Sync {
    /// An open file.
    type File: Send;
    /// Make directories `0..n` of the file set (before any thread starts).
    fn make_dirs(&mut self, n: u64) -> Result<()>;
    /// Create a new file (it must not exist) and open it for appending.
    fn create(&self, f: FileRef) -> Result<Self::File>;
    fn open(&self, f: FileRef, how: OpenFor) -> Result<Self::File>;
    fn append(&self, h: &mut Self::File, data: &[u8]) -> Result<()>;
    fn write_at(&self, h: &Self::File, off: u64, data: &[u8]) -> Result<()>;
    /// Bytes read (0 at the end of the file).
    fn read_at(&self, h: &Self::File, off: u64, buf: &mut [u8]) -> Result<usize>;
    fn fsync(&self, h: &Self::File) -> Result<()>;
    /// Cut the file to `size` bytes.
    fn truncate(&self, h: &Self::File, size: u64) -> Result<()>;
    fn close(&self, h: Self::File) -> Result<()>;
    fn unlink(&self, f: FileRef) -> Result<()>;
    /// The file's size.
    fn stat(&self, f: FileRef) -> Result<u64>;
}

/// `f<idx>` without an allocation.
fn file_name(idx: u64, buf: &mut [u8; 24]) -> &[u8] {
    buf[0] = b'f';
    let mut digits = [0u8; 20];
    let (mut n, mut len) = (idx, 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[1 + i] = digits[len - 1 - i];
    }
    &buf[..1 + len]
}

/// The winefs library, called directly: names are looked up in directories whose inode
/// numbers the workload keeps (as a program holding directory descriptors would).
pub(crate) struct LibTarget {
    pub(crate) fs: Fs,
    root: u64,
    dirs: Vec<u64>,
}

impl LibTarget {
    /// The file set lives in `/wl` of `fs` (made here).
    pub(crate) fn new(fs: Fs) -> Result<LibTarget> {
        let root = fs.mkdir(fs.root(), b"wl", 0o755, 0, 0)?.ino;
        Ok(LibTarget {
            fs,
            root,
            dirs: Vec::new(),
        })
    }

    fn dir(&self, f: FileRef) -> Result<u64> {
        self.dirs
            .get(f.dir as usize)
            .copied()
            .ok_or_else(|| Error::Invalid(format!("no directory {} in the file set", f.dir)))
    }
}

impl Target for LibTarget {
    type File = u64;

    fn make_dirs(&mut self, n: u64) -> Result<()> {
        let mut name = [0u8; 24];
        for d in 0..n {
            let ino = self
                .fs
                .mkdir(self.root, file_name(d, &mut name), 0o755, 0, 0)?
                .ino;
            self.dirs.push(ino);
        }
        Ok(())
    }

    fn create(&self, f: FileRef) -> Result<u64> {
        let mut name = [0u8; 24];
        let a = self
            .fs
            .create(self.dir(f)?, file_name(f.idx, &mut name), 0o644, 0, 0)?;
        self.fs.open(a.ino).map(|a| a.ino)
    }

    fn open(&self, f: FileRef, _how: OpenFor) -> Result<u64> {
        let mut name = [0u8; 24];
        let a = self.fs.lookup(self.dir(f)?, file_name(f.idx, &mut name))?;
        if a.kind != FileKind::File {
            return Err(Error::IsDir);
        }
        self.fs.open(a.ino).map(|a| a.ino)
    }

    fn append(&self, h: &mut u64, data: &[u8]) -> Result<()> {
        match self.fs.append(*h, data)? {
            (n, _) if n == data.len() => Ok(()),
            (n, _) => Err(Error::NoSpace(format!(
                "appended {n} of {} bytes",
                data.len()
            ))),
        }
    }

    fn write_at(&self, h: &u64, off: u64, data: &[u8]) -> Result<()> {
        match self.fs.write(*h, off, data)? {
            n if n == data.len() => Ok(()),
            n => Err(Error::NoSpace(format!("wrote {n} of {} bytes", data.len()))),
        }
    }

    fn read_at(&self, h: &u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.fs.read(*h, off, buf)
    }

    fn fsync(&self, h: &u64) -> Result<()> {
        self.fs.fsync(*h)
    }

    fn truncate(&self, h: &u64, size: u64) -> Result<()> {
        self.fs.truncate(*h, size)
    }

    fn close(&self, h: u64) -> Result<()> {
        self.fs.release(h)
    }

    fn unlink(&self, f: FileRef) -> Result<()> {
        let mut name = [0u8; 24];
        self.fs.unlink(self.dir(f)?, file_name(f.idx, &mut name))
    }

    fn stat(&self, f: FileRef) -> Result<u64> {
        let mut name = [0u8; 24];
        self.fs
            .lookup(self.dir(f)?, file_name(f.idx, &mut name))
            .map(|a| a.size)
    }
}

/// `std::fs` calls under a directory of any file system.
pub(crate) struct PosixTarget {
    root: PathBuf,
    dirs: Vec<PathBuf>,
}

impl PosixTarget {
    /// The file set lives in `dir/wl` (made here).
    pub(crate) fn new(dir: &Path) -> Result<PosixTarget> {
        let root = dir.join("wl");
        std::fs::create_dir(&root).map_err(io_err(format!("mkdir {}", root.display())))?;
        Ok(PosixTarget {
            root,
            dirs: Vec::new(),
        })
    }

    fn path(&self, f: FileRef) -> Result<PathBuf> {
        let mut name = [0u8; 24];
        let d = self
            .dirs
            .get(f.dir as usize)
            .ok_or_else(|| Error::Invalid(format!("no directory {} in the file set", f.dir)))?;
        let name = std::str::from_utf8(file_name(f.idx, &mut name)).unwrap_or("f");
        Ok(d.join(name))
    }
}

fn os<T>(what: &str, p: &Path, r: std::io::Result<T>) -> Result<T> {
    r.map_err(io_err(format!("{what} {}", p.display())))
}

impl Target for PosixTarget {
    type File = File;

    fn make_dirs(&mut self, n: u64) -> Result<()> {
        let mut name = [0u8; 24];
        for d in 0..n {
            let name = std::str::from_utf8(file_name(d, &mut name)).unwrap_or("f");
            let p = self.root.join(name);
            os("mkdir", &p, std::fs::create_dir(&p))?;
            self.dirs.push(p);
        }
        Ok(())
    }

    fn create(&self, f: FileRef) -> Result<File> {
        let p = self.path(f)?;
        os(
            "create",
            &p,
            OpenOptions::new()
                .read(true)
                .append(true)
                .create_new(true)
                .open(&p),
        )
    }

    fn open(&self, f: FileRef, how: OpenFor) -> Result<File> {
        let p = self.path(f)?;
        let mut o = OpenOptions::new();
        match how {
            OpenFor::Read => o.read(true),
            OpenFor::Append => o.read(true).append(true),
            OpenFor::Write => o.read(true).write(true),
        };
        os("open", &p, o.open(&p))
    }

    fn append(&self, h: &mut File, data: &[u8]) -> Result<()> {
        h.write_all(data).map_err(io_err("append".into()))
    }

    fn write_at(&self, h: &File, off: u64, data: &[u8]) -> Result<()> {
        h.write_all_at(data, off).map_err(io_err("pwrite".into()))
    }

    fn read_at(&self, h: &File, off: u64, buf: &mut [u8]) -> Result<usize> {
        h.read_at(buf, off).map_err(io_err("pread".into()))
    }

    fn fsync(&self, h: &File) -> Result<()> {
        h.sync_all().map_err(io_err("fsync".into()))
    }

    fn truncate(&self, h: &File, size: u64) -> Result<()> {
        h.set_len(size).map_err(io_err("ftruncate".into()))
    }

    fn close(&self, h: File) -> Result<()> {
        drop(h);
        Ok(())
    }

    fn unlink(&self, f: FileRef) -> Result<()> {
        let p = self.path(f)?;
        os("unlink", &p, std::fs::remove_file(&p))
    }

    fn stat(&self, f: FileRef) -> Result<u64> {
        let p = self.path(f)?;
        os("stat", &p, std::fs::metadata(&p)).map(|m| m.len())
    }
}

/// Run a command; Err(why) with its last line of standard error.
fn run(cmd: &mut Command, what: &str) -> std::result::Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(format!("{what}: {} ({})", out.status, last_nonempty_line(&err)))
}

/// A file system made with `mkfs_cmd` on a loop device over an image file, mounted;
/// unmounted, detached and removed on drop.
pub(crate) struct LoopFs {
    image: PathBuf,
    dev: String,
    pub(crate) mnt: PathBuf,
    mounted: bool,
}

impl LoopFs {
    /// `kind` is "ext4" or "xfs". Err(why not) in one line: not root, a tool missing, or a
    /// step failing.
    pub(crate) fn make(
        kind: &str,
        image: &Path,
        mnt: &Path,
        size: u64,
    ) -> std::result::Result<LoopFs, String> {
        if crate::sys::euid() != 0 {
            return Err("loop devices need root".into());
        }
        let mkfs: &[&str] = match kind {
            // No lazy initialisation: a background thread would write while we measure.
            "ext4" => &[
                "mkfs.ext4",
                "-q",
                "-F",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
            ],
            "xfs" => &["mkfs.xfs", "-q", "-f"],
            _ => return Err(format!("unknown file system {kind}")),
        };
        let f = File::create(image).map_err(|e| format!("create {}: {e}", image.display()))?;
        f.set_len(size)
            .map_err(|e| format!("size {}: {e}", image.display()))?;
        drop(f);
        let dev = match run(
            Command::new("losetup")
                .args(["--find", "--show"])
                .arg(image),
            "losetup",
        ) {
            Ok(d) => d,
            Err(e) => {
                let _ = std::fs::remove_file(image);
                return Err(e);
            }
        };
        let mut made = LoopFs {
            image: image.to_path_buf(),
            dev,
            mnt: mnt.to_path_buf(),
            mounted: false,
        };
        let hint = if kind == "xfs" {
            " (Debian: xfsprogs)"
        } else {
            " (Debian: e2fsprogs)"
        };
        run(
            Command::new(mkfs[0]).args(&mkfs[1..]).arg(&made.dev),
            &format!("{}{hint}", mkfs[0]),
        )?;
        std::fs::create_dir_all(mnt).map_err(|e| format!("mkdir {}: {e}", mnt.display()))?;
        run(
            Command::new("mount").arg(&made.dev).arg(mnt),
            &format!("mount {kind}"),
        )?;
        made.mounted = true;
        Ok(made)
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted && run(Command::new("umount").arg(&self.mnt), "umount").is_err() {
            let _ = crate::sys::lazy_unmount(&self.mnt);
        }
        let _ = std::fs::remove_dir(&self.mnt);
        let _ = run(
            Command::new("losetup").arg("-d").arg(&self.dev),
            "losetup -d",
        );
        let _ = std::fs::remove_file(&self.image);
    }
}

/// libfuse's `passthrough_ll` (built into `bin` on first use) passing through to `source`,
/// mounted on `mnt` with its defaults; Err(why not) in one line.
pub(crate) fn passthrough(
    bin: &Path,
    source: &Path,
    mnt: &Path,
    descriptors: u64,
) -> std::result::Result<Mounted, String> {
    if !bin.exists() {
        build_passthrough(bin)?;
    }
    std::fs::create_dir_all(source).map_err(|e| format!("mkdir {}: {e}", source.display()))?;
    std::fs::create_dir_all(mnt).map_err(|e| format!("mkdir {}: {e}", mnt.display()))?;
    Mounted::start(bin, source, mnt, descriptors, &[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::syscall::mount_pool;
    use crate::types::Consistency;

    #[test]
    fn file_names_are_f_and_the_number() {
        let mut b = [0u8; 24];
        assert_eq!(file_name(0, &mut b), b"f0");
        assert_eq!(file_name(907, &mut b), b"f907");
        assert_eq!(
            file_name(u64::MAX, &mut b),
            format!("f{}", u64::MAX).as_bytes()
        );
    }

    #[test]
    fn extents_that_continue_each_other_count_as_one_run() {
        assert_eq!(contiguous_runs(&[]), 0);
        assert_eq!(contiguous_runs(&[(0, 100, 4)]), 1);
        // Joined: (0..4 at 100) and (4..8 at 104); apart: a jump in either address.
        let e = [(0, 100, 4), (4, 104, 4), (8, 300, 1), (10, 301, 1), (11, 302, 2)];
        assert_eq!(contiguous_runs(&e), 3);
    }

    #[test]
    fn the_file_set_is_counted_in_runs_of_blocks() {
        let d = tempfile::tempdir().unwrap();
        let pool = d.path().join("pool");
        Fs::mkfs(&pool, &crate::types::MkfsOptions { size: Some(64 << 20), ..Default::default() })
            .unwrap();
        let mut lib = LibTarget::new(mount_pool(&pool, Consistency::Strict).unwrap()).unwrap();
        lib.make_dirs(2).unwrap();
        for (dir, idx) in [(0, 1), (1, 2), (1, 3)] {
            let mut h = lib.create(FileRef { dir, idx }).unwrap();
            lib.append(&mut h, &[7u8; 10_000]).unwrap();
            lib.close(h).unwrap();
        }
        let one_each = file_pieces(&lib.fs).unwrap();
        assert_eq!(one_each, FilePieces { files: 3, pieces: 3, most: 1 });
        // A write 8 MiB past the end of one file gives it a second run.
        let h = lib.open(FileRef { dir: 1, idx: 3 }, OpenFor::Write).unwrap();
        lib.write_at(&h, 8 << 20, b"far").unwrap();
        lib.close(h).unwrap();
        let p = file_pieces(&lib.fs).unwrap();
        assert_eq!(p, FilePieces { files: 3, pieces: 4, most: 2 });
        assert!((p.per_file() - 4.0 / 3.0).abs() < 1e-9);
        check_and_unmount(lib.fs).unwrap();
    }

    /// The library and `std::fs` targets agree on every call's effect.
    #[test]
    fn library_and_posix_targets_behave_alike() {
        let d = tempfile::tempdir().unwrap();
        let pool = d.path().join("pool");
        Fs::mkfs(
            &pool,
            &crate::types::MkfsOptions {
                size: Some(64 << 20),
                ..Default::default()
            },
        )
        .unwrap();
        let mut lib = LibTarget::new(mount_pool(&pool, Consistency::Strict).unwrap()).unwrap();
        let host = d.path().join("host");
        std::fs::create_dir(&host).unwrap();
        let mut posix = PosixTarget::new(&host).unwrap();
        fn exercise<T: Target>(t: &mut T) -> (u64, Vec<u8>, bool, bool) {
            t.make_dirs(2).unwrap();
            let f = FileRef { dir: 1, idx: 42 };
            let mut h = t.create(f).unwrap();
            t.append(&mut h, b"hello ").unwrap();
            t.append(&mut h, b"world").unwrap();
            t.fsync(&h).unwrap();
            t.append(&mut h, b"!!!").unwrap();
            t.truncate(&h, 11).unwrap();
            t.close(h).unwrap();
            let w = t.open(f, OpenFor::Write).unwrap();
            t.write_at(&w, 0, b"J").unwrap();
            t.close(w).unwrap();
            let r = t.open(f, OpenFor::Read).unwrap();
            let mut buf = vec![0u8; 64];
            let n = t.read_at(&r, 0, &mut buf).unwrap();
            assert_eq!(t.read_at(&r, n as u64, &mut buf[n..]).unwrap(), 0);
            buf.truncate(n);
            t.close(r).unwrap();
            let size = t.stat(f).unwrap();
            let twice = t.create(f).is_err();
            t.unlink(f).unwrap();
            (size, buf, twice, t.stat(f).is_err())
        }
        let a = exercise(&mut lib);
        let b = exercise(&mut posix);
        assert_eq!(a, (11, b"Jello world".to_vec(), true, true));
        assert_eq!(a, b);
        check_and_unmount(lib.fs).unwrap();
    }
}
