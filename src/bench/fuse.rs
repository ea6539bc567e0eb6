//! The FUSE benchmark (`winefs bench fuse`): the same `std::fs` calls on a FUSE mount of winefs
//! (served by this process, strict mode) and on a tmpfs directory, in one run.
//!
//! Rows: create+close and unlink of many empty files; 4 KiB and 1 MiB sequential writes and reads
//! of one file. Reads reopen the file first, which drops the kernel's page cache for a FUSE file
//! (no `FOPEN_KEEP_CACHE`), so every read reaches winefs. Best of `repeats` runs per row.

use super::syscall::{TempDir, best_of, default_dir, fmt_rate, fs_type, io_err};
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::fuse::WinefsFuse;
use crate::types::{Consistency, MkfsOptions, MountOptions};
use fuser::{Config, MountOption, Session};
use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What to run.
#[derive(Clone, Debug)]
pub struct FuseBenchConfig {
    /// Directory for the pool, the tmpfs baseline and the mountpoint (default: /dev/shm).
    pub dir: Option<PathBuf>,
    /// Files created and unlinked per run.
    pub files: u64,
    /// Size of the sequentially written and read file.
    pub file_size: u64,
    /// Size of the winefs pool.
    pub pool_size: u64,
    /// Timed repetitions of each measurement; the best is reported.
    pub repeats: u32,
    /// FUSE worker threads.
    pub threads: usize,
}

impl Default for FuseBenchConfig {
    fn default() -> Self {
        FuseBenchConfig {
            dir: None,
            files: 5000,
            file_size: 64 << 20,
            pool_size: 512 << 20,
            repeats: 3,
            threads: 2,
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
    /// Operations per second on the winefs FUSE mount.
    pub winefs_ops_per_s: f64,
    /// Operations per second on tmpfs.
    pub tmpfs_ops_per_s: f64,
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
    /// Timed repetitions per measurement.
    pub repeats: u32,
}

impl fmt::Display for FuseBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "winefs over FUSE ({} threads, strict) vs tmpfs, pool on {} ({}); best of {}",
            self.threads,
            self.dir.display(),
            self.dir_fs,
            self.repeats
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "| operation        |    ops | winefs/FUSE ops/s | tmpfs ops/s | winefs MB/s | tmpfs MB/s | ratio |"
        )?;
        writeln!(
            f,
            "|------------------|-------:|------------------:|------------:|------------:|-----------:|------:|"
        )?;
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
                "| {:<16} | {:>6} | {:>17} | {:>11} | {:>11} | {:>10} | {:>5.2} |",
                r.name,
                r.ops,
                fmt_rate(r.winefs_ops_per_s),
                fmt_rate(r.tmpfs_ops_per_s),
                mbs(r.winefs_ops_per_s),
                mbs(r.tmpfs_ops_per_s),
                r.ratio()
            )?;
        }
        Ok(())
    }
}

/// The same workload on one directory: (create, unlink, write 4K, read 4K, write 1M, read 1M)
/// as ops/s.
fn run_side(dir: &Path, cfg: &FuseBenchConfig) -> Result<[f64; 6]> {
    let reps = cfg.repeats;
    let n = cfg.files.max(1);
    let mut out = [0f64; 6];
    // Create and unlink, each run in a fresh subdirectory.
    let mut best_c = 0f64;
    let mut best_u = 0f64;
    for r in 0..reps.max(1) {
        let d = dir.join(format!("ns{r}"));
        std::fs::create_dir(&d).map_err(io_err(format!("mkdir {}", d.display())))?;
        let t = std::time::Instant::now();
        for i in 0..n {
            let p = d.join(format!("f{i:07}"));
            std::fs::File::create(&p).map_err(io_err(format!("create {}", p.display())))?;
        }
        best_c = best_c.max(n as f64 / t.elapsed().as_secs_f64().max(1e-9));
        let t = std::time::Instant::now();
        for i in 0..n {
            let p = d.join(format!("f{i:07}"));
            std::fs::remove_file(&p).map_err(io_err(format!("unlink {}", p.display())))?;
        }
        best_u = best_u.max(n as f64 / t.elapsed().as_secs_f64().max(1e-9));
        std::fs::remove_dir(&d).map_err(io_err(format!("rmdir {}", d.display())))?;
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
    Ok(out)
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
            ..Default::default()
        },
    )?;
    let fs = Arc::new(Fs::mount(
        &pool,
        MountOptions {
            consistency: Consistency::Strict,
            ..Default::default()
        },
    )?);
    let mut fc = Config::default();
    fc.mount_options = vec![
        MountOption::FSName("winefs-bench".into()),
        MountOption::DefaultPermissions,
    ];
    fc.n_threads = Some(cfg.threads.max(1));
    fc.clone_fd = true;
    let session = Session::new(WinefsFuse::new(Arc::clone(&fs)), &mnt.0, &fc)
        .map_err(io_err(format!("FUSE mount on {}", mnt.0.display())))?
        .spawn()
        .map_err(io_err("start the FUSE session".into()))?;
    let measured = run_side(&mnt.0, cfg);
    let stopped = session.umount_and_join();
    let fs = Arc::try_unwrap(fs)
        .map_err(|_| Error::Busy("the benchmark's pool is still referenced".into()))?;
    let check = fs.check();
    fs.unmount()?;
    let w = measured?;
    stopped.map_err(io_err("stop the FUSE session".into()))?;
    if !check.is_clean() {
        return Err(Error::Corrupted(format!(
            "fsck after the benchmark: {:?}",
            check.problems
        )));
    }
    let t = run_side(&host, cfg)?;
    let names = [
        "create",
        "unlink",
        "write 4K seq",
        "read 4K seq",
        "write 1M seq",
        "read 1M seq",
    ];
    let bytes = [0u64, 0, 4096, 4096, 1 << 20, 1 << 20];
    let rows = (0..6)
        .map(|i| FuseRow {
            name: names[i],
            ops: cfg
                .file_size
                .checked_div(bytes[i])
                .map_or(cfg.files, |n| n.max(1)),
            bytes: bytes[i],
            winefs_ops_per_s: w[i],
            tmpfs_ops_per_s: t[i],
        })
        .collect();
    Ok(FuseBenchReport {
        rows,
        dir_fs: fs_type(&base),
        dir: base,
        threads: cfg.threads,
        repeats: cfg.repeats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The benchmark mounts, measures every row and leaves nothing mounted or on disk.
    #[test]
    fn fuse_bench_produces_every_row() {
        let d = tempfile::tempdir().unwrap();
        let cfg = FuseBenchConfig {
            dir: Some(d.path().to_path_buf()),
            files: 50,
            file_size: 2 << 20,
            pool_size: 64 << 20,
            repeats: 1,
            threads: 2,
        };
        let rep = fuse_bench(&cfg).unwrap();
        assert_eq!(rep.rows.len(), 6);
        for r in &rep.rows {
            assert!(r.winefs_ops_per_s > 0.0 && r.tmpfs_ops_per_s > 0.0, "{r:?}");
        }
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        let text = rep.to_string();
        assert!(text.contains("write 1M seq"), "{text}");
    }
}
