//! The FUSE benchmark (`winefs bench fuse`): the same `std::fs` calls on a FUSE mount of winefs
//! (served by this process, strict mode), on libfuse's own `passthrough_ll` example passing
//! through to tmpfs (the floor any /dev/fuse file system pays; built from the example source
//! when it is installed, Debian `libfuse3-dev`), run twice: with its own defaults and with
//! `-o default_permissions,xattr`, doing what winefs does (the kernel checks permissions; extended
//! attributes are kept, so `ls -l` asks every file for one), and on a tmpfs directory, in one run.
//!
//! Rows: create+close and unlink of many empty files; 4 KiB and 1 MiB sequential writes and reads
//! of one file. Reads reopen the file first, which drops the kernel's page cache for a FUSE file
//! (no `FOPEN_KEEP_CACHE`), so every read reaches winefs. Random 4 KiB overwrites and reads of
//! one laid-out file by four threads at once. Best of `repeats` runs per row. Then a
//! many-files directory (`dir_files`, 100,000 by default): its creates, `stat` of every file
//! (once the kernel has seen them: the cached-metadata case), `ls -l` of the directory, and its
//! unlinks, each once but for `stat` and `ls -l` (best of `repeats`).

use super::syscall::{TempDir, best_of, default_dir, fmt_rate, fs_type, io_err};
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::fuse::WinefsFuse;
use crate::fuse::channel::Channel;
use crate::types::{Consistency, MkfsOptions, MountOptions};
use fuser::{BackgroundSession, Config, MountOption, Session};
use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where Debian's `libfuse3-dev` puts libfuse's examples.
pub const PASSTHROUGH_EXAMPLES: &str = "/usr/share/doc/libfuse3-dev/examples";

/// What to run.
#[derive(Clone, Debug)]
pub struct FuseBenchConfig {
    /// Directory for the pool, the tmpfs baseline and the mountpoint (default: /dev/shm).
    pub dir: Option<PathBuf>,
    /// Files created and unlinked per run.
    pub files: u64,
    /// Files of the many-files directory (0: those rows are left out).
    pub dir_files: u64,
    /// Size of the sequentially written and read file.
    pub file_size: u64,
    /// Size of the winefs pool.
    pub pool_size: u64,
    /// Timed repetitions of each measurement; the best is reported.
    pub repeats: u32,
    /// FUSE worker threads.
    pub threads: usize,
    /// Mount winefs as `winefs mount --no-direct` does: no direct path, file data cached by
    /// the kernel (otherwise as the default mount: opens that may read, not `O_APPEND` nor
    /// `O_DIRECT`, of files no direct-path client leases are cached, the rest direct I/O).
    pub no_direct: bool,
}

impl Default for FuseBenchConfig {
    fn default() -> Self {
        FuseBenchConfig {
            dir: None,
            files: 5000,
            dir_files: 100_000,
            file_size: 64 << 20,
            pool_size: 512 << 20,
            repeats: 3,
            threads: 2,
            no_direct: false,
        }
    }
}

/// One row: operations per second on both sides (for I/O rows, MB/s is ops/s x size).
#[derive(Clone, Debug)]
pub struct FuseRow {
    /// What was measured.
    pub name: &'static str,
    /// Operations per timed run.
    pub ops: u64,
    /// Bytes per op (0 for namespace rows).
    pub bytes: u64,
    /// Operations per second on the winefs FUSE mount (requests on /dev/fuse).
    pub winefs_ops_per_s: f64,
    /// The same with requests over io_uring (`--transport uring`; None: not measured).
    pub uring_ops_per_s: Option<f64>,
    /// Operations per second on tmpfs.
    pub tmpfs_ops_per_s: f64,
    /// Operations per second on libfuse's `passthrough_ll` over tmpfs (None: not measured).
    pub passthrough_ops_per_s: Option<f64>,
    /// The same with `-o default_permissions,xattr`: the kernel checking permissions and
    /// extended attributes kept, as on winefs (None: not measured).
    pub passthrough_alike_ops_per_s: Option<f64>,
}

impl FuseRow {
    /// winefs ops/s divided by tmpfs ops/s (0 when tmpfs measured nothing).
    pub fn ratio(&self) -> f64 {
        if self.tmpfs_ops_per_s > 0.0 {
            self.winefs_ops_per_s / self.tmpfs_ops_per_s
        } else {
            0.0
        }
    }

    /// winefs ops/s divided by `passthrough_ll`'s, if that was measured.
    pub fn vs_passthrough(&self) -> Option<f64> {
        self.passthrough_ops_per_s.filter(|&p| p > 0.0).map(|p| self.winefs_ops_per_s / p)
    }

    /// winefs over io_uring divided by winefs over /dev/fuse, if io_uring was measured.
    pub fn uring_vs_dev(&self) -> Option<f64> {
        self.uring_ops_per_s
            .filter(|_| self.winefs_ops_per_s > 0.0)
            .map(|u| u / self.winefs_ops_per_s)
    }

    /// winefs ops/s divided by `passthrough_ll -o default_permissions,xattr`'s, if that was
    /// measured.
    pub fn vs_passthrough_alike(&self) -> Option<f64> {
        self.passthrough_alike_ops_per_s.filter(|&p| p > 0.0).map(|p| self.winefs_ops_per_s / p)
    }
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct FuseBenchReport {
    /// One row per measurement, in report order.
    pub rows: Vec<FuseRow>,
    /// Directory that held the pool, the tmpfs files and the mountpoint.
    pub dir: PathBuf,
    /// File system type of that directory ("tmpfs", or the magic number in hex).
    pub dir_fs: String,
    /// FUSE worker threads.
    pub threads: usize,
    /// winefs was mounted with no direct path, file data cached by the kernel.
    pub no_direct: bool,
    /// Timed repetitions per measurement.
    pub repeats: u32,
    /// Why winefs over io_uring was not measured (None: it was).
    pub uring_skipped: Option<String>,
    /// Why `passthrough_ll` was not measured (None: it was).
    pub passthrough_skipped: Option<String>,
    /// Why its many-files rows were not measured when the others were (None: they were).
    pub passthrough_big_skipped: Option<String>,
    /// Why its run with `-o default_permissions,xattr` was not measured when the first one was.
    pub passthrough_alike_skipped: Option<String>,
}

impl fmt::Display for FuseBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "winefs over FUSE ({} threads, strict, {}) vs tmpfs, pool on {} ({}); best of {}",
            self.threads,
            match self.no_direct {
                true => "no direct path: file data cached by the kernel",
                false => "with a direct path: opens that may read cached, opens that only write or append direct-I/O",
            },
            self.dir.display(),
            self.dir_fs,
            self.repeats
        )?;
        if let Some(why) = &self.uring_skipped {
            writeln!(f, "winefs over io_uring not measured: {why}")?;
        }
        if let Some(why) = &self.passthrough_skipped {
            writeln!(f, "passthrough_ll not measured: {why}")?;
        }
        if let Some(why) = &self.passthrough_big_skipped {
            writeln!(f, "passthrough_ll's many-files rows not measured: {why}")?;
        }
        if let Some(why) = &self.passthrough_alike_skipped {
            writeln!(f, "passthrough_ll -o default_permissions,xattr not measured: {why}")?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "| operation          |    ops | winefs/FUSE ops/s | winefs/io_uring ops/s | io_uring vs /dev/fuse | passthrough_ll ops/s | passthrough_ll -o default_permissions,xattr ops/s | tmpfs ops/s | winefs MB/s | tmpfs MB/s | vs passthrough | vs passthrough -o default_permissions,xattr | vs tmpfs |"
        )?;
        writeln!(
            f,
            "|--------------------|-------:|------------------:|----------------------:|----------------------:|---------------------:|-------------------------------------------------:|------------:|------------:|-----------:|---------------:|--------------------------------------------:|---------:|"
        )?;
        let ratio = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
        for r in &self.rows {
            let mbs = |ops: f64| {
                if r.bytes == 0 {
                    "-".to_string()
                } else {
                    format!("{:.0}", ops * r.bytes as f64 / 1e6)
                }
            };
            writeln!(
                f,
                "| {:<18} | {:>6} | {:>17} | {:>21} | {:>21} | {:>20} | {:>48} | {:>11} | {:>11} | {:>10} | {:>14} | {:>43} | {:>8.2} |",
                r.name,
                r.ops,
                fmt_rate(r.winefs_ops_per_s),
                r.uring_ops_per_s.map_or("-".to_string(), fmt_rate),
                ratio(r.uring_vs_dev()),
                r.passthrough_ops_per_s.map_or("-".to_string(), fmt_rate),
                r.passthrough_alike_ops_per_s.map_or("-".to_string(), fmt_rate),
                fmt_rate(r.tmpfs_ops_per_s),
                mbs(r.winefs_ops_per_s),
                mbs(r.tmpfs_ops_per_s),
                ratio(r.vs_passthrough()),
                ratio(r.vs_passthrough_alike()),
                r.ratio()
            )?;
        }
        Ok(())
    }
}

/// The rows in report order: name, bytes per op (0: namespace), and whether the row belongs to
/// the many-files directory (its op count is `dir_files`).
const ROWS: [(&str, u64, bool); 12] = [
    ("create", 0, false),
    ("unlink", 0, false),
    ("write 4K seq", 4096, false),
    ("read 4K seq", 4096, false),
    ("write 1M seq", 1 << 20, false),
    ("read 1M seq", 1 << 20, false),
    ("write 4K rand x4", 4096, false),
    ("read 4K rand x4", 4096, false),
    ("create, big dir", 0, true),
    ("stat, cached", 0, true),
    ("ls -l, big dir", 0, true),
    ("unlink, big dir", 0, true),
];

/// The rows measured with `cfg` (the many-files ones only when `dir_files` > 0).
fn rows_of(cfg: &FuseBenchConfig) -> impl Iterator<Item = (usize, &'static (&'static str, u64, bool))> {
    let big = cfg.dir_files > 0;
    ROWS.iter().enumerate().filter(move |(_, r)| big || !r.2)
}

/// The same workload on one directory: ops/s per row of `ROWS` (0 for a row left out: the
/// many-files rows unless `big`).
fn run_side(dir: &Path, cfg: &FuseBenchConfig, big: bool) -> Result<[f64; ROWS.len()]> {
    let reps = cfg.repeats;
    let n = cfg.files.max(1);
    let mut out = [0f64; ROWS.len()];
    // Create and unlink, each run in a fresh subdirectory.
    let mut best_c = 0f64;
    let mut best_u = 0f64;
    for r in 0..reps.max(1) {
        let d = dir.join(format!("ns{r}"));
        let (c, u) = create_unlink(&d, n, |_| Ok(()))?;
        best_c = best_c.max(c);
        best_u = best_u.max(u);
    }
    out[0] = best_c;
    out[1] = best_u;
    for (k, io) in [(2usize, 4096usize), (4, 1 << 20)] {
        let count = (cfg.file_size / io as u64).max(1);
        let buf: Vec<u8> = (0..io).map(|i| (i % 251) as u8).collect();
        let p = dir.join(format!("seq{io}"));
        out[k] = best_of(reps, count, |_| {
            let mut f =
                std::fs::File::create(&p).map_err(io_err(format!("create {}", p.display())))?;
            for _ in 0..count {
                f.write_all(&buf)
                    .map_err(io_err(format!("write {}", p.display())))?;
            }
            Ok(())
        })?;
        let mut rbuf = vec![0u8; io];
        out[k + 1] = best_of(reps, count, |_| {
            let mut f = std::fs::File::open(&p).map_err(io_err(format!("open {}", p.display())))?;
            for _ in 0..count {
                f.read_exact(&mut rbuf)
                    .map_err(io_err(format!("read {}", p.display())))?;
            }
            Ok(())
        })?;
        if rbuf != buf {
            return Err(Error::Corrupted(format!(
                "{} read back wrong data",
                p.display()
            )));
        }
        std::fs::remove_file(&p).map_err(io_err(format!("unlink {}", p.display())))?;
    }
    (out[6], out[7]) = parallel_random(dir, cfg)?;
    if big && cfg.dir_files > 0 {
        let files = cfg.dir_files;
        let d = dir.join("big");
        let (c, u) = create_unlink(&d, files, |d| {
            // Every name once first, so the kernel has seen them all: the cached case.
            stat_all(d, files)?;
            out[9] = best_of(reps, files, |_| stat_all(d, files))?;
            out[10] = best_of(reps, files, |_| list_long(d))?;
            Ok(())
        })?;
        out[8] = c;
        out[11] = u;
    }
    Ok(out)
}

/// Threads of the parallel rows.
const PARALLEL: u64 = 4;

/// Random 4 KiB writes, then reads, by `PARALLEL` threads into one file of `file_size` bytes
/// (each thread its own descriptor): (writes/s, reads/s), best of `repeats`. The reads check
/// that every block holds what some thread wrote there.
fn parallel_random(dir: &Path, cfg: &FuseBenchConfig) -> Result<(f64, f64)> {
    use std::os::unix::fs::FileExt;
    let p = dir.join("parallel");
    let blocks = (cfg.file_size / 4096).max(1);
    // Laid out first, so the rows measure overwrites and reads of data that is there.
    let f = std::fs::File::create(&p).map_err(io_err(format!("create {}", p.display())))?;
    f.set_len(blocks * 4096).map_err(io_err(format!("truncate {}", p.display())))?;
    let per_thread = blocks.div_ceil(PARALLEL);
    let run = |write: bool| -> Result<()> {
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..PARALLEL)
                .map(|t| {
                    let p = &p;
                    s.spawn(move || -> Result<()> {
                        let f = std::fs::OpenOptions::new()
                            .read(true)
                            .write(true)
                            .open(p)
                            .map_err(io_err(format!("open {}", p.display())))?;
                        let mut buf = [0u8; 4096];
                        // A different sequence of blocks per thread.
                        let mut rng = crate::rng::Rng::new(t);
                        for _ in 0..per_thread {
                            let b = rng.below(blocks);
                            if write {
                                buf.fill((b % 251) as u8);
                                f.write_all_at(&buf, b * 4096)
                                    .map_err(io_err(format!("write {}", p.display())))?;
                            } else {
                                f.read_exact_at(&mut buf, b * 4096)
                                    .map_err(io_err(format!("read {}", p.display())))?;
                                if buf[0] != 0 && buf.iter().any(|&v| v != (b % 251) as u8) {
                                    return Err(Error::Corrupted(format!(
                                        "{} block {b} holds bytes no writer wrote there",
                                        p.display()
                                    )));
                                }
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            // The scope joins every thread; the first error is reported.
            workers.into_iter().try_for_each(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(Error::Invalid("a benchmark thread panicked".into())))
            })
        })
    };
    let ops = per_thread * PARALLEL;
    let w = best_of(cfg.repeats, ops, |_| run(true))?;
    let r = best_of(cfg.repeats, ops, |_| run(false))?;
    drop(f);
    std::fs::remove_file(&p).map_err(io_err(format!("unlink {}", p.display())))?;
    Ok((w, r))
}

/// Name of file `i` of a benchmark directory.
fn file_name(d: &Path, i: u64) -> PathBuf {
    d.join(format!("f{i:07}"))
}

/// Make directory `d`, create `n` empty files in it, run `between` on it, unlink them and
/// remove `d`: (creates/s, unlinks/s).
fn create_unlink(d: &Path, n: u64, between: impl FnOnce(&Path) -> Result<()>) -> Result<(f64, f64)> {
    std::fs::create_dir(d).map_err(io_err(format!("mkdir {}", d.display())))?;
    let t = Instant::now();
    for i in 0..n {
        let p = file_name(d, i);
        std::fs::File::create(&p).map_err(io_err(format!("create {}", p.display())))?;
    }
    let created = n as f64 / t.elapsed().as_secs_f64().max(1e-9);
    between(d)?;
    let t = Instant::now();
    for i in 0..n {
        let p = file_name(d, i);
        std::fs::remove_file(&p).map_err(io_err(format!("unlink {}", p.display())))?;
    }
    let unlinked = n as f64 / t.elapsed().as_secs_f64().max(1e-9);
    std::fs::remove_dir(d).map_err(io_err(format!("rmdir {}", d.display())))?;
    Ok((created, unlinked))
}

/// `lstat` every file of `d` by name.
fn stat_all(d: &Path, n: u64) -> Result<()> {
    for i in 0..n {
        let p = file_name(d, i);
        std::fs::symlink_metadata(&p).map_err(io_err(format!("stat {}", p.display())))?;
    }
    Ok(())
}

/// `ls -l d`, its listing thrown away.
fn list_long(d: &Path) -> Result<()> {
    let st = Command::new("ls")
        .arg("-l")
        .arg(d)
        .stdout(Stdio::null())
        .status()
        .map_err(io_err(format!("ls -l {}", d.display())))?;
    if !st.success() {
        return Err(Error::Invalid(format!("ls -l {} failed: {st}", d.display())));
    }
    Ok(())
}

/// Mount a fresh pool with FUSE in this process, run the workload there and on tmpfs.
pub fn fuse_bench(cfg: &FuseBenchConfig) -> Result<FuseBenchReport> {
    let base = cfg.dir.clone().unwrap_or_else(default_dir);
    let root = TempDir(base.join(format!("winefs-fusebench-{}", std::process::id())));
    std::fs::create_dir_all(&root.0).map_err(io_err(format!("mkdir {}", root.0.display())))?;
    let pool = root.0.join("pool");
    let host = root.0.join("tmpfs");
    std::fs::create_dir(&host).map_err(io_err(format!("mkdir {}", host.display())))?;
    // The mountpoint lives outside the pool's directory so that removing it never walks
    // into a live mount.
    let mnt =
        TempDir(std::env::temp_dir().join(format!("winefs-fusebench-mnt-{}", std::process::id())));
    std::fs::create_dir_all(&mnt.0).map_err(io_err(format!("mkdir {}", mnt.0.display())))?;

    Fs::mkfs(
        &pool,
        &MkfsOptions {
            size: Some(cfg.pool_size),
            // Room for both directories whatever the pool size.
            inodes: Some((cfg.files + cfg.dir_files + 1024).max(cfg.pool_size / (16 << 10))),
            ..Default::default()
        },
    )?;
    let w = winefs_side(&pool, &mnt.0, cfg, false)?
        .map_err(|why| Error::Busy(format!("FUSE over /dev/fuse: {why}")))?;
    let (u, uring_skipped) = match winefs_side(&pool, &mnt.0, cfg, true)? {
        Ok(u) => (Some(u), None),
        Err(why) => (None, Some(why)),
    };
    let (pt, passthrough_skipped) = match passthrough_side(&root.0, cfg, &[]) {
        Ok(v) => (Some(v), None),
        Err(why) => (None, Some(why)),
    };
    let (pt_alike, passthrough_alike_skipped) = match pt {
        Some(_) => match passthrough_side(&root.0, cfg, &["-o", "default_permissions,xattr"]) {
            Ok(v) => (Some(v), None),
            Err(why) => (None, Some(why)),
        },
        None => (None, None),
    };
    let t = run_side(&host, cfg, true)?;
    let passthrough_big_skipped = match (pt, passthrough_descriptors(cfg)) {
        (Some(_), Err(why)) if cfg.dir_files > 0 => Some(why),
        _ => None,
    };
    let rows = rows_of(cfg)
        .map(|(i, &(name, bytes, big))| FuseRow {
            name,
            ops: match (big, cfg.file_size.checked_div(bytes)) {
                (true, _) => cfg.dir_files,
                (false, Some(n)) => n.max(1),
                (false, None) => cfg.files,
            },
            bytes,
            winefs_ops_per_s: w[i],
            uring_ops_per_s: u.map(|u| u[i]).filter(|&x| x > 0.0),
            tmpfs_ops_per_s: t[i],
            passthrough_ops_per_s: pt.map(|p| p[i]).filter(|&x| x > 0.0),
            passthrough_alike_ops_per_s: pt_alike.map(|p| p[i]).filter(|&x| x > 0.0),
        })
        .collect();
    Ok(FuseBenchReport {
        rows,
        dir_fs: fs_type(&base),
        dir: base,
        threads: cfg.threads,
        no_direct: cfg.no_direct,
        repeats: cfg.repeats,
        uring_skipped,
        passthrough_skipped,
        passthrough_big_skipped,
        passthrough_alike_skipped,
    })
}

/// Mount the pool with the FUSE front end (requests over io_uring if `io_uring`) and run
/// every row on it; Ok(Err(why)) when io_uring was asked for and does not serve (the session
/// says why). The pool must check clean afterwards.
fn winefs_side(
    pool: &Path,
    mnt: &Path,
    cfg: &FuseBenchConfig,
    io_uring: bool,
) -> Result<std::result::Result<[f64; ROWS.len()], String>> {
    let fs = Fs::mount(
        pool,
        MountOptions {
            consistency: Consistency::Strict,
            ..Default::default()
        },
    )?;
    let served = FuseServed::start(fs, mnt, cfg.threads.max(1), io_uring, cfg.no_direct)?;
    if let (true, Err(why)) = (io_uring, &served.uring) {
        let why = why.clone();
        served.stop()?;
        return Ok(Err(why));
    }
    let measured = run_side(mnt, cfg, true);
    let stopped = served.stop();
    let w = measured?;
    stopped?;
    Ok(Ok(w))
}

/// A pool mounted with the FUSE front end by this process, as `winefs mount` mounts one
/// (`default_permissions`, cloned descriptors per thread); unmounted on drop.
pub(crate) struct FuseServed {
    fs: Option<Arc<Fs>>,
    session: Option<BackgroundSession>,
    /// The direct-path channel, as `winefs mount` offers one (none with `page_cache`).
    channel: Option<Arc<Channel>>,
    /// The queues requests travel over with io_uring, or why it does not serve.
    pub(crate) uring: std::result::Result<usize, String>,
}

impl FuseServed {
    /// Mount `fs` on `mnt` served by `threads` threads, asking for io_uring if `io_uring`; with
    /// `page_cache`, as a mount with no direct path (`WinefsFuse::with_page_cache`).
    pub(crate) fn start(
        fs: Fs,
        mnt: &Path,
        threads: usize,
        io_uring: bool,
        page_cache: bool,
    ) -> Result<FuseServed> {
        let fs = Arc::new(fs);
        let mut fc = Config::default();
        fc.mount_options = vec![
            MountOption::FSName("winefs-bench".into()),
            MountOption::DefaultPermissions,
        ];
        fc.n_threads = Some(threads);
        fc.clone_fd = true;
        fc.dev_spin = crate::fuse::DEV_SPIN;
        fc.io_uring = io_uring;
        let mut adapter = WinefsFuse::new(Arc::clone(&fs));
        let notifier = adapter.notifier_slot();
        let mut channel = None;
        if page_cache {
            adapter = adapter.with_page_cache();
        } else {
            let ch = Channel::start(Arc::clone(&fs), Arc::clone(&notifier), adapter.cache_gate())
                .map_err(io_err("start the direct-path channel".into()))?;
            adapter = adapter.with_channel(ch.name());
            channel = Some(ch);
        }
        let session = match Session::new(adapter, mnt, &fc) {
            Ok(s) => s,
            Err(e) => {
                if let Some(ch) = &channel {
                    ch.stop();
                }
                return Err(io_err(format!("FUSE mount on {}", mnt.display()))(e));
            }
        };
        let uring = session.io_uring().map_err(|e| e.to_string());
        let _ = notifier.set(session.notifier());
        let session = session.spawn();
        let session = match session {
            Ok(s) => s,
            Err(e) => {
                if let Some(ch) = &channel {
                    ch.stop();
                }
                return Err(io_err("start the FUSE session".into())(e));
            }
        };
        Ok(FuseServed {
            fs: Some(fs),
            session: Some(session),
            channel,
            uring,
        })
    }

    /// How requests travel, in words.
    pub(crate) fn transport(&self) -> &'static str {
        if self.uring.is_ok() {
            "FUSE over io_uring"
        } else {
            "/dev/fuse"
        }
    }

    /// Unmount, then check the pool (it must be clean) and close it.
    pub(crate) fn stop(mut self) -> Result<()> {
        if let Some(s) = self.session.take() {
            s.umount_and_join()
                .map_err(io_err("stop the FUSE session".into()))?;
        }
        if let Some(ch) = self.channel.take() {
            ch.stop();
        }
        let fs = self.fs.take().and_then(|fs| Arc::try_unwrap(fs).ok());
        check_and_unmount(
            fs.ok_or_else(|| Error::Busy("the benchmark's pool is still referenced".into()))?,
        )
    }
}

impl Drop for FuseServed {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = s.umount_and_join();
        }
        if let Some(ch) = self.channel.take() {
            ch.stop();
        }
    }
}

/// fsck the pool (it must be clean after a benchmark) and unmount it.
pub(crate) fn check_and_unmount(fs: Fs) -> Result<()> {
    let check = fs.check();
    fs.unmount()?;
    if check.is_clean() {
        Ok(())
    } else {
        Err(Error::Corrupted(format!(
            "fsck after the benchmark: {:?}",
            check.problems
        )))
    }
}

/// Build libfuse's `passthrough_ll` example into `dir`, mount it over a fresh directory of
/// `dir` and run the workload there. Err: why it was not measured (the example source, a C
/// compiler or pkg-config missing, or the mount failing), in one line.
fn passthrough_side(
    dir: &Path,
    cfg: &FuseBenchConfig,
    opts: &[&str],
) -> std::result::Result<[f64; ROWS.len()], String> {
    // Its limit of descriptors is raised to what the rows need, through a shell that then
    // becomes the daemon; the many-files rows are left out where that is not allowed.
    let (descriptors, big) = match passthrough_descriptors(cfg) {
        Ok(n) => (n, true),
        Err(_) => (cfg.files + 1024, false),
    };
    let bin = dir.join("passthrough_ll");
    if !bin.exists() {
        build_passthrough(&bin)?;
    }
    // A fresh source directory and mountpoint per variant.
    let variant = if opts.is_empty() { "" } else { "-alike" };
    let source = dir.join(format!("passthrough-source{variant}"));
    std::fs::create_dir(&source).map_err(|e| format!("mkdir {}: {e}", source.display()))?;
    let mnt = TempDir(std::env::temp_dir().join(format!(
        "winefs-fusebench-pt{variant}-{}",
        std::process::id()
    )));
    std::fs::create_dir_all(&mnt.0).map_err(|e| format!("mkdir {}: {e}", mnt.0.display()))?;
    let mounted = Mounted::start(&bin, &source, &mnt.0, descriptors, opts)?;
    let r = run_side(&mounted.at, cfg, big).map_err(|e| format!("on passthrough_ll: {e}"));
    drop(mounted);
    r
}

/// Build libfuse's `passthrough_ll` example as `bin`. Err: why not (the example source, a C
/// compiler or pkg-config missing, or the build failing), in one line.
pub(crate) fn build_passthrough(bin: &Path) -> std::result::Result<(), String> {
    let examples = Path::new(PASSTHROUGH_EXAMPLES);
    let src = examples.join("passthrough_ll.c");
    if !src.exists() {
        return Err(format!("{} is not installed (Debian: libfuse3-dev)", src.display()));
    }
    let flags = Command::new("pkg-config")
        .args(["fuse3", "--cflags", "--libs"])
        .output()
        .map_err(|e| format!("pkg-config: {e}"))?;
    if !flags.status.success() {
        return Err("pkg-config knows no fuse3 (Debian: libfuse3-dev)".into());
    }
    let flags = String::from_utf8_lossy(&flags.stdout).into_owned();
    let built = Command::new("cc")
        .args(["-O2", "-Wall", "-I"])
        .arg(examples)
        .arg(&src)
        .arg("-o")
        .arg(bin)
        .args(flags.split_whitespace())
        .output()
        .map_err(|e| format!("cc: {e}"))?;
    if !built.status.success() {
        return Err(format!(
            "building {} failed: {}",
            src.display(),
            String::from_utf8_lossy(&built.stderr).lines().next().unwrap_or("")
        ));
    }
    Ok(())
}

/// Descriptors `passthrough_ll` needs for every row (it holds one per inode the kernel knows),
/// or why this process's hard limit of open files (from /proc/self/limits; children inherit it
/// and only a privileged process may raise it) is too low for the many-files rows.
fn passthrough_descriptors(cfg: &FuseBenchConfig) -> std::result::Result<u64, String> {
    let need = cfg.files.max(cfg.dir_files) + 1024;
    let hard = std::fs::read_to_string("/proc/self/limits").ok().and_then(|limits| {
        let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
        // "Max open files  <soft>  <hard>  files"
        line.split_whitespace().nth(4)?.parse::<u64>().ok()
    });
    // With CAP_SYS_RESOURCE (bit 24 of the effective set) the shell that starts it raises the
    // hard limit too, up to the kernel's ceiling.
    let may_raise = std::fs::read_to_string("/proc/self/status").ok().and_then(|st| {
        let caps = st.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
        u64::from_str_radix(caps.trim(), 16).ok()
    });
    let ceiling = match may_raise {
        Some(caps) if caps & (1 << 24) != 0 => std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok()),
        _ => hard,
    };
    match ceiling {
        Some(most) if most < need => Err(format!(
            "it holds a descriptor per file, and at most {most} open files are allowed here \
             ({need} needed)"
        )),
        _ => Ok(need),
    }
}

/// A running `passthrough_ll`, unmounted and reaped on drop.
pub(crate) struct Mounted {
    child: Child,
    pub(crate) at: PathBuf,
}

impl Mounted {
    /// Start `bin` (passthrough_ll) in the foreground passing `source` through on `mnt`, with
    /// `opts`, its limit of descriptors raised to `descriptors` (through a shell that then
    /// becomes the daemon: `ulimit -n` sets the soft limit and, with `CAP_SYS_RESOURCE`, the
    /// hard one); returns once the mount is in place, Err(why) in one line.
    pub(crate) fn start(
        bin: &Path,
        source: &Path,
        mnt: &Path,
        descriptors: u64,
        opts: &[&str],
    ) -> std::result::Result<Mounted, String> {
        let child = Command::new("sh")
            .arg("-c")
            .arg("ulimit -n \"$1\" 2>/dev/null; shift; exec \"$@\"")
            .arg("sh")
            .arg(descriptors.to_string())
            .arg(bin)
            .arg("-f")
            .arg("-o")
            .arg(format!("source={}", source.display()))
            .args(opts)
            .arg(mnt)
            // Nothing reads its output while it serves: a pipe that filled would stall it.
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        let mounted = Mounted { child, at: mnt.to_path_buf() };
        mounted.wait_mounted()?;
        Ok(mounted)
    }

    /// Wait (up to 10 s) until the mount shows in /proc/self/mountinfo; Err if the daemon
    /// exits first or the time runs out.
    fn wait_mounted(&self) -> std::result::Result<(), String> {
        let at = self.at.to_string_lossy().into_owned();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            if info.lines().any(|l| l.split(' ').nth(4) == Some(at.as_str())) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!("passthrough_ll did not mount {at} within 10 s"))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let unmounted = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.at)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        }
        // With -f the daemon exits once unmounted; kill it if it has not.
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The benchmark mounts, measures every row and leaves nothing mounted or on disk.
    #[test]
    fn fuse_bench_produces_every_row() {
        // In memory, as the benchmark's default directory: a pool on a disk file system
        // offers no direct path.
        let d = tempfile::tempdir_in("/dev/shm").unwrap();
        let cfg = FuseBenchConfig {
            dir: Some(d.path().to_path_buf()),
            files: 50,
            dir_files: 200,
            file_size: 2 << 20,
            pool_size: 64 << 20,
            repeats: 1,
            threads: 2,
            no_direct: false,
        };
        let rep = fuse_bench(&cfg).unwrap();
        assert_eq!(rep.rows.len(), ROWS.len());
        assert!(rep.to_string().contains("opens that may read cached"), "{rep}");
        // Where libfuse's example source is installed, its floor is measured beside winefs.
        let floor = Path::new(PASSTHROUGH_EXAMPLES).join("passthrough_ll.c").exists();
        assert_eq!(rep.passthrough_skipped.is_none(), floor, "{:?}", rep.passthrough_skipped);
        // Where the kernel offers FUSE over io_uring, winefs is measured on it too.
        let uring = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
            .is_ok_and(|v| v.trim() == "Y");
        assert_eq!(rep.uring_skipped.is_none(), uring, "{:?}", rep.uring_skipped);
        for (r, &(_, _, big)) in rep.rows.iter().zip(&ROWS) {
            assert!(r.winefs_ops_per_s > 0.0 && r.tmpfs_ops_per_s > 0.0, "{r:?}");
            assert_eq!(r.uring_ops_per_s.is_some_and(|u| u > 0.0), uring, "{r:?}");
            // The many-files rows also need descriptors enough for passthrough_ll.
            let measured = floor && !(big && rep.passthrough_big_skipped.is_some());
            assert_eq!(r.passthrough_ops_per_s.is_some_and(|p| p > 0.0), measured, "{r:?}");
            assert_eq!(r.passthrough_alike_ops_per_s.is_some_and(|p| p > 0.0), measured, "{r:?}");
        }
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        let text = rep.to_string();
        assert!(text.contains("write 1M seq") && text.contains("ls -l, big dir"), "{text}");
    }
}
