//! The FUSE benchmark (`winefs bench fuse`): the same `std::fs` calls on a FUSE mount of winefs
//! (served by this process, strict mode), on libfuse's own `passthrough_ll` example passing
//! through to tmpfs (the floor any /dev/fuse file system pays; built from the example source
//! when it is installed, Debian `libfuse3-dev`), and on a tmpfs directory, in one run.
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
    /// Operations per second on libfuse's `passthrough_ll` over tmpfs (None: not measured).
    pub passthrough_ops_per_s: Option<f64>,
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
    /// Why `passthrough_ll` was not measured (None: it was).
    pub passthrough_skipped: Option<String>,
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
        if let Some(why) = &self.passthrough_skipped {
            writeln!(f, "passthrough_ll not measured: {why}")?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "| operation        |    ops | winefs/FUSE ops/s | passthrough_ll ops/s | tmpfs ops/s | winefs MB/s | passthrough MB/s | tmpfs MB/s | vs passthrough | vs tmpfs |"
        )?;
        writeln!(
            f,
            "|------------------|-------:|------------------:|---------------------:|------------:|------------:|-----------------:|-----------:|---------------:|---------:|"
        )?;
        for r in &self.rows {
            let mbs = |ops: f64| {
                if r.bytes == 0 {
                    "-".to_string()
                } else {
                    format!("{:.0}", ops * r.bytes as f64 / 1e6)
                }
            };
            let pt = r.passthrough_ops_per_s;
            writeln!(
                f,
                "| {:<16} | {:>6} | {:>17} | {:>20} | {:>11} | {:>11} | {:>16} | {:>10} | {:>14} | {:>8.2} |",
                r.name,
                r.ops,
                fmt_rate(r.winefs_ops_per_s),
                pt.map_or("-".to_string(), fmt_rate),
                fmt_rate(r.tmpfs_ops_per_s),
                mbs(r.winefs_ops_per_s),
                pt.map_or("-".to_string(), mbs),
                mbs(r.tmpfs_ops_per_s),
                r.vs_passthrough().map_or("-".to_string(), |x| format!("{x:.2}")),
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
    let (pt, passthrough_skipped) = match passthrough_side(&root.0, cfg) {
        Ok(v) => (Some(v), None),
        Err(why) => (None, Some(why)),
    };
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
            passthrough_ops_per_s: pt.map(|p| p[i]),
        })
        .collect();
    Ok(FuseBenchReport {
        rows,
        dir_fs: fs_type(&base),
        dir: base,
        threads: cfg.threads,
        repeats: cfg.repeats,
        passthrough_skipped,
    })
}

/// Build libfuse's `passthrough_ll` example into `dir`, mount it over a fresh directory of
/// `dir` and run the workload there. Err: why it was not measured (the example source, a C
/// compiler or pkg-config missing, or the mount failing), in one line.
fn passthrough_side(dir: &Path, cfg: &FuseBenchConfig) -> std::result::Result<[f64; 6], String> {
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
    let bin = dir.join("passthrough_ll");
    let built = Command::new("cc")
        .args(["-O2", "-Wall", "-I"])
        .arg(examples)
        .arg(&src)
        .arg("-o")
        .arg(&bin)
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
    let source = dir.join("passthrough-source");
    std::fs::create_dir(&source).map_err(|e| format!("mkdir {}: {e}", source.display()))?;
    let mnt = TempDir(
        std::env::temp_dir().join(format!("winefs-fusebench-pt-{}", std::process::id())),
    );
    std::fs::create_dir_all(&mnt.0).map_err(|e| format!("mkdir {}: {e}", mnt.0.display()))?;
    let child = Command::new(&bin)
        .arg("-f")
        .arg("-o")
        .arg(format!("source={}", source.display()))
        .arg(&mnt.0)
        // Nothing reads its output while it serves: a pipe that filled would stall it.
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start {}: {e}", bin.display()))?;
    let mounted = Mounted { child, at: mnt.0.clone() };
    mounted.wait_mounted()?;
    let r = run_side(&mounted.at, cfg).map_err(|e| format!("on passthrough_ll: {e}"));
    drop(mounted);
    r
}

/// A running `passthrough_ll`, unmounted and reaped on drop.
struct Mounted {
    child: Child,
    at: PathBuf,
}

impl Mounted {
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
        // Where libfuse's example source is installed, its floor is measured beside winefs.
        let floor = Path::new(PASSTHROUGH_EXAMPLES).join("passthrough_ll.c").exists();
        assert_eq!(rep.passthrough_skipped.is_none(), floor, "{:?}", rep.passthrough_skipped);
        for r in &rep.rows {
            assert!(r.winefs_ops_per_s > 0.0 && r.tmpfs_ops_per_s > 0.0, "{r:?}");
            assert_eq!(r.passthrough_ops_per_s.is_some_and(|p| p > 0.0), floor, "{r:?}");
        }
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        let text = rep.to_string();
        assert!(text.contains("write 1M seq"), "{text}");
    }
}
