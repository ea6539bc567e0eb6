//! The space benchmark (`winefs bench space`): an fsstress-style seeded random workload —
//! creates, appends, overwrites, random writes (which may leave sparse gaps), truncates up and
//! down, unlinks and mkdirs, file sizes drawn from an aging profile (Agrawal by default: many
//! small files, a few large ones holding most bytes) — run with the same operations against a
//! directory on the host tmpfs, the winefs library, and optionally a FUSE mount of winefs; then
//! the space each used.
//!
//! tmpfs counts what `du` would: the sum of `st_blocks * 512` of the tree (its directories take
//! no blocks there). winefs counts what `df` would: the data blocks in use from `statfs` (every
//! file block, directory block, extent-index and xattr block), less what the fresh pool already
//! used; its speculative preallocation past file ends is shown apart (statfs counts it as
//! available, since allocations take it back before failing). Every file is opened and closed
//! per operation, as a program would. The operation sequence depends only on the seed, never
//! on what a target reports, so all sides see the same operations.

use super::syscall::{TempDir, default_dir, io_err};
use crate::rng::Rng;
use crate::age::profile::{Profile, Weighted};
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::fuse::WinefsFuse;
use crate::types::{MkfsOptions, MountOptions};
use crate::units::format_size;
use fuser::{Config, MountOption, Session};
use std::fmt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Largest single write of a create (programs copy in chunks).
const CHUNK: u64 = 1 << 20;
/// Longest overwrite or random write (fsstress's default write length bound).
const MAX_IO: u64 = 128 << 10;
/// How far past the end a random write or truncate may reach (fsstress: size + 1 MiB).
const REACH: u64 = 1 << 20;
/// Files in the hot set that takes half of the operations on existing files.
const HOT: u64 = 64;
/// The target ratio winefs / tmpfs.
pub const TARGET_RATIO: f64 = 1.3;

/// What to run.
#[derive(Clone, Debug)]
pub struct SpaceBenchConfig {
    /// Directory for the pool and the tmpfs tree (default: /dev/shm).
    pub dir: Option<PathBuf>,
    /// Seed of the operation sequence.
    pub seed: u64,
    /// Operations.
    pub ops: u64,
    /// Bound on the live files' total size: above it the next operation is an unlink.
    pub max_bytes: u64,
    /// Size of the winefs pool.
    pub pool_size: u64,
    /// File-size profile (a built-in name or a file, as for `winefs age`).
    pub profile: String,
    /// Also run the workload on a FUSE mount of a second pool.
    pub fuse: bool,
}

impl Default for SpaceBenchConfig {
    fn default() -> Self {
        SpaceBenchConfig {
            dir: None,
            seed: 1,
            ops: 20_000,
            max_bytes: 512 << 20,
            pool_size: 2 << 30,
            profile: "agrawal".into(),
            fuse: false,
        }
    }
}

/// One operation of the workload (paths relative to the tree's root).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Mkdir(String),
    /// A new file of this size, written from the start in chunks.
    Create(String, u64),
    /// Write `len` bytes at `off` (an append when `off` is the size).
    Write(String, u64, u64),
    /// Store `len` bytes at `off` through a mapping of just that range, growing the file
    /// first if it ends before (fsstress's mwrite).
    MapWrite(String, u64, u64),
    Truncate(String, u64),
    Unlink(String),
}

/// How many operations of each kind the workload holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Directories made.
    pub mkdirs: u64,
    /// Files created (and written).
    pub creates: u64,
    /// Writes at the end of a file.
    pub appends: u64,
    /// Writes inside a file.
    pub overwrites: u64,
    /// Writes at a random offset up to 1 MiB past the end.
    pub random_writes: u64,
    /// Stores through a mapping of the written range (random offset, as random writes).
    pub map_writes: u64,
    /// Truncates (up or down).
    pub truncates: u64,
    /// Files removed.
    pub unlinks: u64,
}

impl OpCounts {
    /// Each count with its name, in report order.
    pub fn named(&self) -> [(u64, &'static str); 8] {
        [
            (self.creates, "creates"),
            (self.appends, "appends"),
            (self.overwrites, "overwrites"),
            (self.random_writes, "random writes"),
            (self.map_writes, "map writes"),
            (self.truncates, "truncates"),
            (self.unlinks, "unlinks"),
            (self.mkdirs, "mkdirs"),
        ]
    }
}

impl fmt::Display for OpCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (n, what)) in self.named().iter().enumerate() {
            write!(f, "{}{n} {what}", if i == 0 { "" } else { ", " })?;
        }
        Ok(())
    }
}

/// The seeded workload: operations and the tree they leave (file path → size).
struct Workload {
    ops: Vec<Op>,
    counts: OpCounts,
    files: Vec<(String, u64)>,
    dirs: usize,
}

/// A size drawn from the profile: a bucket by weight, then uniform above the bucket below it.
fn draw_size(rng: &mut Rng, p: &Profile, pick: &Weighted) -> u64 {
    let i = pick.pick(rng.unit());
    let hi = p.sizes[i].0;
    let lo = if i == 0 { 0 } else { p.sizes[i - 1].0 };
    lo + 1 + rng.below(hi.saturating_sub(lo).max(1))
}

fn workload(cfg: &SpaceBenchConfig, p: &Profile) -> Workload {
    let mut rng = Rng(cfg.seed);
    let pick = Weighted::new(p.sizes.iter().map(|s| s.1));
    // fsstress-like mix: create, append, overwrite, random write, truncate, unlink, mkdir,
    // map write.
    let kinds = Weighted::new([20.0, 16.0, 14.0, 10.0, 10.0, 16.0, 6.0, 8.0]);
    let mut dirs = vec![String::new()];
    let mut files: Vec<(String, u64)> = Vec::new();
    let mut live: u64 = 0;
    let mut ops = Vec::with_capacity(usize::try_from(cfg.ops).unwrap_or(0));
    let mut c = OpCounts::default();
    let mut next_id = 0u64;
    let mut name = |prefix: &str, dir: &str| {
        next_id += 1;
        if dir.is_empty() {
            format!("{prefix}{next_id}")
        } else {
            format!("{dir}/{prefix}{next_id}")
        }
    };
    for _ in 0..cfg.ops {
        let mut kind = kinds.pick(rng.unit());
        if files.is_empty() && kind != 6 {
            kind = 0;
        } else if live > cfg.max_bytes {
            kind = 5;
        }
        // Operations on existing files go half the time to a hot set (the oldest files in
        // the list), as in fsstress, whose few names per process each take many operations:
        // that is what grows files into large sparse ones.
        let n = files.len() as u64;
        let pool = if rng.below(2) == 0 { n.min(HOT) } else { n };
        let fi = usize::try_from(rng.below(pool)).unwrap_or(0);
        match kind {
            0 => {
                let d = &dirs[usize::try_from(rng.below(dirs.len() as u64)).unwrap_or(0)];
                let path = name("f", d);
                let size = draw_size(&mut rng, p, &pick);
                live += size;
                files.push((path.clone(), size));
                ops.push(Op::Create(path, size));
                c.creates += 1;
            }
            1 => {
                let (path, size) = &mut files[fi];
                let len = draw_size(&mut rng, p, &pick).min(CHUNK);
                ops.push(Op::Write(path.clone(), *size, len));
                *size += len;
                live += len;
                c.appends += 1;
            }
            2 | 3 | 7 => {
                let (path, size) = &mut files[fi];
                let (off, len) = if kind == 2 && *size > 0 {
                    let off = rng.below(*size);
                    (off, (1 + rng.below(MAX_IO)).min(*size - off))
                } else {
                    (rng.below(*size + REACH), 1 + rng.below(MAX_IO))
                };
                let end = (off + len).max(*size);
                live += end - *size;
                *size = end;
                if kind == 7 {
                    ops.push(Op::MapWrite(path.clone(), off, len));
                    c.map_writes += 1;
                } else {
                    ops.push(Op::Write(path.clone(), off, len));
                    if kind == 2 {
                        c.overwrites += 1;
                    } else {
                        c.random_writes += 1;
                    }
                }
            }
            4 => {
                let (path, size) = &mut files[fi];
                let new = rng.below(*size + REACH);
                live = live + new - *size;
                *size = new;
                ops.push(Op::Truncate(path.clone(), new));
                c.truncates += 1;
            }
            5 => {
                let fi = usize::try_from(rng.below(n)).unwrap_or(0);
                let (path, size) = files.swap_remove(fi);
                live -= size;
                ops.push(Op::Unlink(path));
                c.unlinks += 1;
            }
            _ => {
                let d = &dirs[usize::try_from(rng.below(dirs.len() as u64)).unwrap_or(0)];
                let path = name("d", d);
                dirs.push(path.clone());
                ops.push(Op::Mkdir(path));
                c.mkdirs += 1;
            }
        }
    }
    Workload {
        ops,
        counts: c,
        files,
        dirs: dirs.len() - 1,
    }
}

/// Space one side used after the workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SideUsage {
    /// What was measured.
    pub name: String,
    /// Bytes in use: tmpfs `du`; winefs `df` (statfs) less the fresh pool's use, without
    /// speculative preallocation.
    pub used: u64,
    /// Of the space in use, speculative preallocation past file ends (winefs only; statfs
    /// counts it as available).
    pub preallocated: u64,
    /// Sum of the files' `st_blocks * 512` (for winefs this includes preallocation).
    pub du: u64,
    /// Operations refused for want of space.
    pub enospc: u64,
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct SpaceBenchReport {
    /// Seed of the operation sequence.
    pub seed: u64,
    /// Profile the sizes came from.
    pub profile: String,
    /// Operations by kind.
    pub counts: OpCounts,
    /// Live files and directories at the end, and their total size (bytes, holes included).
    pub files: usize,
    /// Directories made.
    pub dirs: usize,
    /// Sum of the live files' sizes.
    pub logical: u64,
    /// The tmpfs baseline first, then winefs through the library, then (if run) over FUSE.
    pub sides: Vec<SideUsage>,
    /// Pool size.
    pub pool_size: u64,
}

impl SpaceBenchReport {
    /// Space used by side `i` over the tmpfs baseline's.
    pub fn ratio(&self, i: usize) -> f64 {
        let base = self.sides.first().map_or(0, |s| s.used);
        if base == 0 {
            return 0.0;
        }
        self.sides
            .get(i)
            .map_or(0.0, |s| s.used as f64 / base as f64)
    }
}

impl fmt::Display for SpaceBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "space: seed {}, profile {}, pool {}; {}",
            self.seed,
            self.profile,
            format_size(self.pool_size),
            self.counts
        )?;
        writeln!(
            f,
            "live at the end: {} files in {} directories, {} of file size",
            self.files,
            self.dirs,
            format_size(self.logical)
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "| side | used | / tmpfs | preallocated (available) | du (st_blocks) | ENOSPC |"
        )?;
        writeln!(f, "|---|--:|--:|--:|--:|--:|")?;
        for (i, s) in self.sides.iter().enumerate() {
            writeln!(
                f,
                "| {} | {} | {:.3} | {} | {} | {} |",
                s.name,
                format_size(s.used),
                self.ratio(i),
                format_size(s.preallocated),
                format_size(s.du),
                s.enospc
            )?;
        }
        for (i, s) in self.sides.iter().enumerate().skip(1) {
            let r = self.ratio(i);
            let met = if r <= TARGET_RATIO { "met" } else { "MISSED" };
            writeln!(
                f,
                "{}: {r:.3}x the space of tmpfs (target <= {TARGET_RATIO}: {met})",
                s.name
            )?;
        }
        Ok(())
    }
}

/// A file system the workload runs on.
trait Side {
    fn mkdir(&mut self, path: &str) -> Result<()>;
    /// Write `len` bytes of `byte` at `off`, creating the file first if `create`.
    fn write(&mut self, path: &str, off: u64, len: u64, create: bool, byte: u8) -> Result<()>;
    fn truncate(&mut self, path: &str, size: u64) -> Result<()>;
    /// Store through a mapping of [off, off+len), growing the file to cover it first. Host
    /// sides write instead: a store allocates the pages it touches there, as a write does.
    fn map_write(&mut self, path: &str, off: u64, len: u64, size: u64, byte: u8) -> Result<()> {
        if off + len > size {
            self.truncate(path, off + len)?;
        }
        self.write(path, off, len, false, byte)
    }
    fn unlink(&mut self, path: &str) -> Result<()>;
    fn size(&mut self, path: &str) -> Result<u64>;
    /// (used, preallocated, du) now.
    fn usage(&mut self) -> Result<(u64, u64, u64)>;
}

/// Run the workload on one side; returns the operations refused for space.
fn run(side: &mut dyn Side, w: &Workload) -> Result<u64> {
    let mut enospc = 0;
    let mut sizes: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for (i, op) in w.ops.iter().enumerate() {
        let byte = (i % 251) as u8 | 1;
        let r = match op {
            Op::Mkdir(p) => side.mkdir(p),
            Op::Create(p, size) => (|| {
                side.write(p, 0, 0, true, byte)?;
                let mut off = 0;
                while off < *size {
                    let n = CHUNK.min(size - off);
                    side.write(p, off, n, false, byte)?;
                    off += n;
                }
                Ok(())
            })(),
            Op::Write(p, off, len) => side.write(p, *off, *len, false, byte),
            Op::MapWrite(p, off, len) => {
                let size = sizes.get(p.as_str()).copied().unwrap_or(0);
                side.map_write(p, *off, *len, size, byte)
            }
            Op::Truncate(p, size) => side.truncate(p, *size),
            Op::Unlink(p) => side.unlink(p),
        };
        // The size each file has after the operation, as the workload computed it.
        match op {
            Op::Create(p, n) | Op::Truncate(p, n) => {
                sizes.insert(p, *n);
            }
            Op::Write(p, off, len) | Op::MapWrite(p, off, len) => {
                let s = sizes.entry(p).or_insert(0);
                *s = (*s).max(off + len);
            }
            Op::Unlink(p) => {
                sizes.remove(p.as_str());
            }
            Op::Mkdir(_) => {}
        }
        match r {
            Ok(()) => {}
            Err(Error::NoSpace(_)) => enospc += 1,
            Err(e) => return Err(e),
        }
    }
    if enospc == 0 {
        // Every side must hold the same tree: check the sizes.
        for (p, size) in &w.files {
            let got = side.size(p)?;
            if got != *size {
                return Err(Error::Corrupted(format!(
                    "space benchmark: {p} is {got} bytes, the workload made it {size}"
                )));
            }
        }
    }
    Ok(enospc)
}

/// A directory on the host (tmpfs, or a FUSE mount) through `std::fs`.
struct PosixSide {
    root: PathBuf,
    buf: Vec<u8>,
    /// statvfs used at the start (FUSE: the fresh pool's), or None to report `du` as used.
    statvfs_base: Option<u64>,
}

/// ENOSPC from the host becomes `NoSpace`, anything else an I/O error naming the path.
fn host_err(what: &str, p: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let what = format!("{what} {}", p.display());
    move |e| match e.raw_os_error() {
        Some(libc::ENOSPC) => Error::NoSpace(what),
        _ => Error::io(what, e),
    }
}

fn statvfs_used(p: &Path) -> Result<u64> {
    let (frsize, blocks, free) =
        crate::sys::space(p).map_err(io_err(format!("statvfs {}", p.display())))?;
    Ok((blocks - free) * frsize)
}

/// Sum of `st_blocks * 512` of every file under `dir`.
fn du(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir).map_err(io_err(format!("readdir {}", dir.display())))? {
        let e = e.map_err(io_err(format!("readdir {}", dir.display())))?;
        let md = e
            .metadata()
            .map_err(io_err(format!("stat {}", e.path().display())))?;
        total += md.blocks() * 512;
        if md.is_dir() {
            total += du(&e.path())?;
        }
    }
    Ok(total)
}

impl Side for PosixSide {
    fn mkdir(&mut self, path: &str) -> Result<()> {
        let p = self.root.join(path);
        std::fs::create_dir(&p).map_err(host_err("mkdir", &p))
    }
    fn write(&mut self, path: &str, off: u64, len: u64, create: bool, byte: u8) -> Result<()> {
        let p = self.root.join(path);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(create)
            .open(&p)
            .map_err(host_err("open", &p))?;
        let n = usize::try_from(len).map_err(|_| Error::FileTooBig)?;
        if self.buf.len() < n {
            self.buf.resize(n, 0);
        }
        self.buf[..n].fill(byte);
        f.write_all_at(&self.buf[..n], off)
            .map_err(host_err("write", &p))
    }
    fn truncate(&mut self, path: &str, size: u64) -> Result<()> {
        let p = self.root.join(path);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .map_err(host_err("open", &p))?;
        f.set_len(size).map_err(host_err("truncate", &p))
    }
    fn unlink(&mut self, path: &str) -> Result<()> {
        let p = self.root.join(path);
        std::fs::remove_file(&p).map_err(host_err("unlink", &p))
    }
    fn size(&mut self, path: &str) -> Result<u64> {
        let p = self.root.join(path);
        Ok(std::fs::metadata(&p).map_err(host_err("stat", &p))?.len())
    }
    fn usage(&mut self) -> Result<(u64, u64, u64)> {
        let du = du(&self.root)?;
        let used = match self.statvfs_base {
            Some(base) => statvfs_used(&self.root)?.saturating_sub(base),
            None => du,
        };
        Ok((used, 0, du))
    }
}

/// The winefs library: every operation opens and closes a `File`, as a program would.
struct LibrarySide {
    fs: Fs,
    buf: Vec<u8>,
    base: u64,
}

impl Side for LibrarySide {
    fn mkdir(&mut self, path: &str) -> Result<()> {
        self.fs.mkdir_path(&format!("/{path}")).map(|_| ())
    }
    fn write(&mut self, path: &str, off: u64, len: u64, create: bool, byte: u8) -> Result<()> {
        let p = format!("/{path}");
        let f = if create {
            self.fs.create_file(&p)?
        } else {
            self.fs.open_file(&p)?
        };
        let n = usize::try_from(len).map_err(|_| Error::FileTooBig)?;
        if self.buf.len() < n {
            self.buf.resize(n, 0);
        }
        self.buf[..n].fill(byte);
        let mut done = 0;
        while done < n {
            done += f.write_at(off + done as u64, &self.buf[done..n])?;
        }
        Ok(())
    }
    fn truncate(&mut self, path: &str, size: u64) -> Result<()> {
        self.fs.open_file(&format!("/{path}"))?.set_len(size)
    }
    fn map_write(&mut self, path: &str, off: u64, len: u64, size: u64, byte: u8) -> Result<()> {
        let f = self.fs.open_file(&format!("/{path}"))?;
        if off + len > size {
            f.set_len(off + len)?;
        }
        let start = off / 4096 * 4096;
        let too_big = |_| Error::FileTooBig;
        let n = usize::try_from(len).map_err(too_big)?;
        let m = f.mmap(start, usize::try_from(off + len - start).map_err(too_big)?)?;
        if self.buf.len() < n {
            self.buf.resize(n, 0);
        }
        self.buf[..n].fill(byte);
        m.store(
            usize::try_from(off - start).map_err(too_big)?,
            &self.buf[..n],
        )
    }
    fn unlink(&mut self, path: &str) -> Result<()> {
        self.fs.unlink_path(&format!("/{path}"))
    }
    fn size(&mut self, path: &str) -> Result<u64> {
        Ok(self.fs.stat_path(&format!("/{path}"))?.size)
    }
    fn usage(&mut self) -> Result<(u64, u64, u64)> {
        let st = self.fs.statfs();
        let used = (st.blocks - st.free_blocks) * st.block_size;
        let pre = st.preallocated_blocks * st.block_size;
        Ok((used.saturating_sub(self.base), pre, self.du("/")?))
    }
}

impl LibrarySide {
    fn du(&self, dir: &str) -> Result<u64> {
        let mut total = 0;
        for name in self.fs.list_dir(dir)? {
            let p = format!(
                "{}/{}",
                dir.trim_end_matches('/'),
                String::from_utf8_lossy(&name)
            );
            let a = self.fs.stat_path(&p)?;
            total += a.blocks * 512;
            if a.kind == crate::media::layout::FileKind::Dir {
                total += self.du(&p)?;
            }
        }
        Ok(total)
    }
}

fn mkfs(pool: &Path, size: u64) -> Result<Fs> {
    Fs::mkfs(
        pool,
        &MkfsOptions {
            size: Some(size),
            ..Default::default()
        },
    )?;
    Fs::mount(pool, MountOptions::default())
}

fn side_usage(name: &str, side: &mut dyn Side, enospc: u64) -> Result<SideUsage> {
    let (used, preallocated, du) = side.usage()?;
    Ok(SideUsage {
        name: name.into(),
        used,
        preallocated,
        du,
        enospc,
    })
}

/// Run the workload on a FUSE mount of a fresh pool served by this process.
fn fuse_side(pool: &Path, cfg: &SpaceBenchConfig, w: &Workload) -> Result<SideUsage> {
    let mnt =
        TempDir(std::env::temp_dir().join(format!("winefs-spacebench-mnt-{}", std::process::id())));
    std::fs::create_dir_all(&mnt.0).map_err(io_err(format!("mkdir {}", mnt.0.display())))?;
    let fs = Arc::new(mkfs(pool, cfg.pool_size)?);
    let mut fc = Config::default();
    fc.mount_options = vec![
        MountOption::FSName("winefs-spacebench".into()),
        MountOption::DefaultPermissions,
    ];
    fc.n_threads = Some(2);
    let session = Session::new(WinefsFuse::new(Arc::clone(&fs)), &mnt.0, &fc)
        .map_err(io_err(format!("FUSE mount on {}", mnt.0.display())))?
        .spawn()
        .map_err(io_err("start the FUSE session".into()))?;
    let measured = (|| {
        let mut side = PosixSide {
            root: mnt.0.clone(),
            buf: Vec::new(),
            statvfs_base: Some(statvfs_used(&mnt.0)?),
        };
        let enospc = run(&mut side, w)?;
        side_usage("winefs over FUSE (statvfs)", &mut side, enospc)
    })();
    let stopped = session.umount_and_join();
    let fs = Arc::try_unwrap(fs)
        .map_err(|_| Error::Busy("the benchmark's pool is still referenced".into()))?;
    let pre = fs.statfs().preallocated_blocks * fs.statfs().block_size;
    fs.unmount()?;
    stopped.map_err(io_err("stop the FUSE session".into()))?;
    let mut u = measured?;
    u.preallocated = pre;
    Ok(u)
}

/// Run the workload on tmpfs, the winefs library and (if asked) a FUSE mount.
pub fn space_bench(cfg: &SpaceBenchConfig) -> Result<SpaceBenchReport> {
    let profile = Profile::load(&cfg.profile)?;
    let w = workload(cfg, &profile);
    let base = cfg.dir.clone().unwrap_or_else(default_dir);
    let root = TempDir(base.join(format!("winefs-spacebench-{}", std::process::id())));
    let host = root.0.join("tmpfs");
    std::fs::create_dir_all(&host).map_err(io_err(format!("mkdir {}", host.display())))?;
    let mut sides = Vec::new();
    let mut tmpfs = PosixSide {
        root: host.clone(),
        buf: Vec::new(),
        statvfs_base: None,
    };
    let enospc = run(&mut tmpfs, &w)?;
    sides.push(side_usage("tmpfs (du)", &mut tmpfs, enospc)?);
    std::fs::remove_dir_all(&host).map_err(io_err(format!("remove {}", host.display())))?;

    let pool = root.0.join("pool");
    let fs = mkfs(&pool, cfg.pool_size)?;
    let st = fs.statfs();
    let mut lib = LibrarySide {
        base: (st.blocks - st.free_blocks) * st.block_size,
        fs,
        buf: Vec::new(),
    };
    let enospc = run(&mut lib, &w)?;
    sides.push(side_usage("winefs library (statfs)", &mut lib, enospc)?);
    let check = lib.fs.check();
    if !check.is_clean() {
        return Err(Error::Corrupted(format!(
            "fsck after the benchmark: {:?}",
            check.problems
        )));
    }
    lib.fs.unmount()?;
    std::fs::remove_file(&pool).map_err(io_err(format!("remove {}", pool.display())))?;
    if cfg.fuse {
        sides.push(fuse_side(&pool, cfg, &w)?);
    }
    Ok(SpaceBenchReport {
        seed: cfg.seed,
        profile: profile.name,
        counts: w.counts,
        files: w.files.len(),
        dirs: w.dirs,
        logical: w.files.iter().map(|f| f.1).sum(),
        sides,
        pool_size: cfg.pool_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(seed: u64) -> SpaceBenchConfig {
        SpaceBenchConfig {
            dir: Some(std::env::temp_dir()),
            seed,
            ops: 1500,
            max_bytes: 24 << 20,
            pool_size: 128 << 20,
            ..Default::default()
        }
    }

    /// The workload is a function of the seed, and holds every kind of operation.
    #[test]
    fn workload_is_seeded_and_mixed() {
        let p = Profile::load("agrawal").unwrap();
        let a = workload(&small(7), &p);
        let b = workload(&small(7), &p);
        assert_eq!(a.ops, b.ops);
        assert_ne!(a.ops, workload(&small(8), &p).ops);
        let all = a.counts.named();
        assert!(all.iter().all(|&(n, _)| n > 0), "{}", a.counts);
        assert_eq!(all.iter().map(|x| x.0).sum::<u64>(), 1500);
    }

    /// Both sides run the same tree (sizes checked inside), winefs stays within the target
    /// on this small run, and the report names both.
    #[test]
    fn space_bench_measures_both_sides() {
        let rep = space_bench(&small(3)).unwrap();
        assert_eq!(rep.sides.len(), 2);
        assert!(
            rep.sides.iter().all(|s| s.used > 0 && s.enospc == 0),
            "{rep:?}"
        );
        assert!(rep.ratio(1) <= TARGET_RATIO, "{rep}");
        let text = rep.to_string();
        assert!(text.contains("winefs library"), "{text}");
    }
}
