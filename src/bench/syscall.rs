//! The system-call benchmark (`winefs bench syscall`): the same small operations through the winefs library and through
//! `std::fs` on the host's tmpfs, in one run, with the ratio against the targets of issue 2.
//!
//! Each measurement is repeated (`repeats`, default 3) after a short warm-up and the best run is
//! kept, which filters out most of the noise of a shared machine. Nothing here asserts on time.

use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::media::pool::{CATEGORIES, PersistStats};
use crate::types::{Consistency, MkfsOptions, MountOptions};
use std::fmt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// I/O size of the append, overwrite and read measurements.
pub(crate) const IO_SIZE: usize = 4096;

/// What to run.
#[derive(Clone, Debug)]
pub struct SyscallBenchConfig {
    /// Where to put the pool and the host files (default: /dev/shm, else the temp dir).
    pub dir: Option<PathBuf>,
    /// Operations per measurement.
    pub ops: u64,
    /// Size of the file the overwrite and read measurements use.
    pub file_size: u64,
    /// Size of the winefs pool.
    pub pool_size: u64,
    /// Timed repetitions of each measurement; the best is reported.
    pub repeats: u32,
}

impl Default for SyscallBenchConfig {
    fn default() -> Self {
        SyscallBenchConfig {
            dir: None,
            ops: 20_000,
            file_size: 64 << 20,
            pool_size: 256 << 20,
            repeats: 3,
        }
    }
}

/// Persistence traffic per operation (averaged over the timed runs).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PersistPerOp {
    /// Bytes written per op, indexed by `Category as usize`.
    pub bytes: [f64; CATEGORIES],
    /// Cache lines flushed per op, indexed by `Category as usize`.
    pub lines: [f64; CATEGORIES],
    /// File bytes the caller wrote per op (0 for operations that write none).
    pub user: f64,
    /// Fences per op.
    pub fences: f64,
}

impl PersistPerOp {
    fn from_delta(before: &PersistStats, after: &PersistStats, ops: u64) -> PersistPerOp {
        let n = ops.max(1) as f64;
        let mut p = PersistPerOp {
            fences: after.fences.saturating_sub(before.fences) as f64 / n,
            ..Default::default()
        };
        for i in 0..CATEGORIES {
            p.bytes[i] = after.bytes_written[i].saturating_sub(before.bytes_written[i]) as f64 / n;
            p.lines[i] = after.lines_flushed[i].saturating_sub(before.lines_flushed[i]) as f64 / n;
        }
        p
    }

    /// The same, noting that the caller wrote `n` bytes per op.
    fn wrote(self, n: usize) -> PersistPerOp {
        PersistPerOp {
            user: n as f64,
            ..self
        }
    }
}

/// One measured operation.
#[derive(Clone, Debug)]
pub struct BenchRow {
    /// What was measured (one of the report's row names).
    pub name: &'static str,
    /// Operations per timed run.
    pub ops: u64,
    /// Operations per second through the library.
    pub winefs_ops_per_s: f64,
    /// Operations per second through `std::fs` on tmpfs.
    pub tmpfs_ops_per_s: f64,
    /// Target ratio winefs/tmpfs from the issue, if it sets one.
    pub target: Option<f64>,
    /// winefs persistence traffic per op.
    pub persist: PersistPerOp,
}

impl BenchRow {
    /// winefs ops/s divided by tmpfs ops/s.
    pub fn ratio(&self) -> f64 {
        if self.tmpfs_ops_per_s > 0.0 {
            self.winefs_ops_per_s / self.tmpfs_ops_per_s
        } else {
            0.0
        }
    }

    /// Whether the target is met (None when there is no target).
    pub fn meets_target(&self) -> Option<bool> {
        self.target.map(|t| self.ratio() >= t)
    }
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct SyscallBenchReport {
    /// One row per measurement, in report order.
    pub rows: Vec<BenchRow>,
    /// Directory that held the pool and the host files.
    pub dir: PathBuf,
    /// File system type of that directory ("tmpfs", or the magic number in hex).
    pub dir_fs: String,
    /// Size of the winefs pool.
    pub pool_size: u64,
    /// Size of the overwrite and read file.
    pub file_size: u64,
    /// Timed repetitions per measurement.
    pub repeats: u32,
}

impl SyscallBenchReport {
    /// The row called `name`.
    pub fn row(&self, name: &str) -> Option<&BenchRow> {
        self.rows.iter().find(|r| r.name == name)
    }
}

/// The hot set of the "strict hot" overwrite row: 256 blocks, within what one partition's zone
/// of the smallest pools keeps live without writing back (three quarters of 512 slots).
const HOT_SET: u64 = 1 << 20;

/// Row names, in report order.
pub(crate) const ROWS: [&str; 7] = [
    "append 4K strict",
    "overwrite 4K strict",
    "overwrite 4K strict hot",
    "overwrite 4K relaxed",
    "read 4K",
    "create",
    "unlink",
];

pub(crate) fn fmt_rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.2}M", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1}K", r / 1e3)
    } else {
        format!("{r:.0}")
    }
}

impl fmt::Display for SyscallBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "winefs vs std::fs on {} ({}); pool {} MiB, file {} MiB, best of {}",
            self.dir.display(),
            self.dir_fs,
            self.pool_size >> 20,
            self.file_size >> 20,
            self.repeats
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "| operation               |    ops | winefs ops/s | tmpfs ops/s | ratio | target | met |"
        )?;
        writeln!(
            f,
            "|-------------------------|-------:|-------------:|------------:|------:|-------:|:---:|"
        )?;
        for r in &self.rows {
            let (target, met) = match r.target {
                Some(t) => (
                    format!("≥ {t:.1}"),
                    if r.ratio() >= t { "yes" } else { "NO" },
                ),
                None => ("-".to_string(), "-"),
            };
            writeln!(
                f,
                "| {:<23} | {:>6} | {:>12} | {:>11} | {:>5.2} | {:>6} | {:^3} |",
                r.name,
                r.ops,
                fmt_rate(r.winefs_ops_per_s),
                fmt_rate(r.tmpfs_ops_per_s),
                r.ratio(),
                target,
                met
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "winefs persistence traffic per op: bytes stored per category (data = the caller's \
             bytes in place; cow = copied or zero-filled around them; slot = alternate slots; \
             writeback = slots written back), their sum over the caller's bytes, cache lines \
             flushed and fences:"
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "| operation               |   user B |   data B | meta B | journal B |    cow B |   slot B | writeback B |  total B | x user | lines | fences |"
        )?;
        writeln!(
            f,
            "|-------------------------|---------:|---------:|-------:|----------:|---------:|---------:|------------:|---------:|-------:|------:|-------:|"
        )?;
        for r in &self.rows {
            let p = &r.persist;
            let total: f64 = p.bytes.iter().sum();
            let amp = if p.user > 0.0 {
                format!("{:.2}", total / p.user)
            } else {
                "-".into()
            };
            writeln!(
                f,
                "| {:<23} | {:>8.0} | {:>8.0} | {:>6.0} | {:>9.0} | {:>8.0} | {:>8.0} | {:>11.0} | {:>8.0} | {:>6} | {:>5.1} | {:>6.2} |",
                r.name,
                p.user,
                p.bytes[0],
                p.bytes[1],
                p.bytes[2],
                p.bytes[3],
                p.bytes[4],
                p.bytes[5],
                total,
                amp,
                p.lines.iter().sum::<f64>(),
                p.fences
            )?;
        }
        Ok(())
    }
}

/// Removes the benchmark's directory when dropped.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn io_err(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

pub(crate) fn default_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Name of the file system holding `dir`.
pub(crate) fn fs_type(dir: &Path) -> String {
    match crate::sys::fs_magic(dir) {
        None => "unknown".into(),
        Some(0x0102_1994) => "tmpfs".into(),
        Some(0x9584_58f6) => "hugetlbfs".into(),
        Some(0xef53) => "ext4".into(),
        Some(0x5846_5342) => "xfs".into(),
        Some(0x794c_7630) => "overlayfs".into(),
        Some(0x6573_5546) => "fuse".into(),
        Some(t) => format!("fs magic {t:#x}"),
    }
}

/// Seeded pseudo-random offsets: `n` 4 KiB-aligned offsets inside `size`.
fn random_offsets(n: u64, size: u64, seed: u64) -> Vec<u64> {
    offsets_of(n, size, IO_SIZE as u64, seed)
}

/// Seeded pseudo-random offsets: `n` `unit`-aligned offsets of `unit`-byte updates inside
/// `size`.
pub(crate) fn offsets_of(n: u64, size: u64, unit: u64, seed: u64) -> Vec<u64> {
    let slots = (size / unit).max(1);
    let mut rng = crate::rng::Rng::new(seed);
    (0..n).map(|_| rng.below(slots) * unit).collect()
}

/// Run `f` (which performs `ops` operations and returns) `repeats` times; best ops/s.
pub(crate) fn best_of(repeats: u32, ops: u64, mut f: impl FnMut(u32) -> Result<()>) -> Result<f64> {
    let mut best = 0f64;
    for r in 0..repeats.max(1) {
        let t = Instant::now();
        f(r)?;
        let s = t.elapsed().as_secs_f64().max(1e-9);
        best = best.max(ops as f64 / s);
    }
    Ok(best)
}

fn warmup_ops(ops: u64) -> u64 {
    (ops / 10).clamp(1, 1000)
}

fn name(prefix: &str, i: u64) -> Vec<u8> {
    format!("{prefix}{i:07}").into_bytes()
}

/// Measure every row of the system-call benchmark once (see the module docs).
pub fn syscall_bench(cfg: &SyscallBenchConfig) -> Result<SyscallBenchReport> {
    if cfg.ops == 0 {
        return Err(Error::Invalid("ops must be positive".into()));
    }
    let file_size = (cfg.file_size / IO_SIZE as u64) * IO_SIZE as u64;
    if file_size == 0 {
        return Err(Error::Invalid(format!(
            "file size must be at least {IO_SIZE} bytes"
        )));
    }
    if file_size + (8 << 20) > cfg.pool_size {
        return Err(Error::Invalid(format!(
            "file size {file_size} does not fit in a {} byte pool (needs 8 MiB spare)",
            cfg.pool_size
        )));
    }
    let base = cfg.dir.clone().unwrap_or_else(default_dir);
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = TempDir(base.join(format!("winefs-bench-{}-{nonce:08x}", std::process::id())));
    std::fs::create_dir_all(&tmp.0).map_err(io_err(format!("create {}", tmp.0.display())))?;
    let host = tmp.0.join("host");
    std::fs::create_dir(&host).map_err(io_err(format!("create {}", host.display())))?;
    let pool = tmp.0.join("bench.pool");
    Fs::mkfs(
        &pool,
        &MkfsOptions {
            size: Some(cfg.pool_size),
            ..Default::default()
        },
    )?;

    let ops = cfg.ops;
    let reps = cfg.repeats.max(1);
    let buf = vec![0x5au8; IO_SIZE];
    let offsets = random_offsets(ops, file_size, 0x9e37_79b9_7f4a_7c15);
    let hot_offsets = random_offsets(ops, file_size.min(HOT_SET), 0x6a09_e667_f3bc_c908);

    // ----- winefs, strict mount: append, overwrite strict, create, unlink -----
    // Timed once the pool's pages are all faulted in, as a long-mounted pool (or persistent
    // memory) is, and with the prefault thread no longer competing for the CPUs.
    let fs = mount_pool(&pool, Consistency::Strict)?;
    let root = fs.root();
    // Warm-up: a few appends and a create/unlink.
    {
        let w = fs.create(root, b"warmup", 0o644, 0, 0)?.ino;
        for _ in 0..warmup_ops(ops) {
            fs.append(w, &buf)?;
        }
        fs.unlink(root, b"warmup")?;
    }
    let (w_append, p_append) = {
        let s0 = fs.persist_stats();
        let rate = best_of(reps, ops, |r| {
            let n = name("append", r as u64);
            let ino = fs.create(root, &n, 0o644, 0, 0)?.ino;
            for _ in 0..ops {
                fs.append(ino, &buf)?;
            }
            Ok(())
        })?;
        let s1 = fs.persist_stats();
        // The create of each run is one extra op in `ops` appends; negligible.
        for r in 0..reps {
            fs.unlink(root, &name("append", r as u64))?;
        }
        (rate, PersistPerOp::from_delta(&s0, &s1, ops * reps as u64))
    };
    let big = fs.create(root, b"big", 0o644, 0, 0)?.ino;
    fs.fallocate(big, 0, file_size, false)?;
    let (w_strict, p_strict) = overwrite_rate(&fs, big, &offsets, &buf, reps, ops)?;
    // The same, over a hot set that fits the alternate-slot zones: the steady state in which
    // every update is written once (the newest copy alternates between slot and home).
    let (w_hot, p_hot) = overwrite_rate(&fs, big, &hot_offsets, &buf, reps, ops)?;
    // Create/unlink: each run in a fresh directory, as many files as the inode table allows.
    let st = fs.statfs();
    let cops = ops.min(st.free_inodes.saturating_sub(64)).max(1);
    let (w_create, p_create, w_unlink, p_unlink) = {
        let d = fs.mkdir(root, b"wd", 0o755, 0, 0)?.ino;
        for i in 0..warmup_ops(cops) {
            fs.create(d, &name("w", i), 0o644, 0, 0)?;
        }
        for i in 0..warmup_ops(cops) {
            fs.unlink(d, &name("w", i))?;
        }
        let mut best_c = 0f64;
        let mut best_u = 0f64;
        let mut pc = PersistStats::default();
        let mut pu = PersistStats::default();
        let add = |acc: &mut PersistStats, a: &PersistStats, b: &PersistStats| {
            for i in 0..CATEGORIES {
                acc.bytes_written[i] += b.bytes_written[i] - a.bytes_written[i];
                acc.lines_flushed[i] += b.lines_flushed[i] - a.lines_flushed[i];
            }
            acc.fences += b.fences - a.fences;
        };
        for r in 0..reps {
            let dn = name("d", r as u64);
            let dir = fs.mkdir(root, &dn, 0o755, 0, 0)?.ino;
            let s0 = fs.persist_stats();
            let t = Instant::now();
            for i in 0..cops {
                fs.create(dir, &name("f", i), 0o644, 0, 0)?;
            }
            best_c = best_c.max(cops as f64 / t.elapsed().as_secs_f64().max(1e-9));
            let s1 = fs.persist_stats();
            let t = Instant::now();
            for i in 0..cops {
                fs.unlink(dir, &name("f", i))?;
            }
            best_u = best_u.max(cops as f64 / t.elapsed().as_secs_f64().max(1e-9));
            let s2 = fs.persist_stats();
            add(&mut pc, &s0, &s1);
            add(&mut pu, &s1, &s2);
            fs.rmdir(root, &dn)?;
        }
        let z = PersistStats::default();
        let n = cops * reps as u64;
        (
            best_c,
            PersistPerOp::from_delta(&z, &pc, n),
            best_u,
            PersistPerOp::from_delta(&z, &pu, n),
        )
    };
    fs.rmdir(root, b"wd")?;
    fs.unmount()?;

    // ----- winefs, relaxed mount of the same pool: overwrite relaxed, read -----
    let fs = mount_pool(&pool, Consistency::Relaxed)?;
    let big = fs.lookup(root, b"big")?.ino;
    let (w_relaxed, p_relaxed) = overwrite_rate(&fs, big, &offsets, &buf, reps, ops)?;
    let read_offsets = random_offsets(ops, file_size, 0x2545_f491_4f6c_dd1d);
    let mut rbuf = vec![0u8; IO_SIZE];
    for &o in read_offsets.iter().take(warmup_ops(ops) as usize) {
        fs.read(big, o, &mut rbuf)?;
    }
    let (w_read, p_read) = {
        let s0 = fs.persist_stats();
        let rate = best_of(reps, ops, |_| {
            for &o in &read_offsets {
                let n = fs.read(big, o, &mut rbuf)?;
                std::hint::black_box(&rbuf[..n]);
            }
            Ok(())
        })?;
        let s1 = fs.persist_stats();
        (rate, PersistPerOp::from_delta(&s0, &s1, ops * reps as u64))
    };
    fs.unmount()?;

    // ----- std::fs on the host directory -----
    let h_append = {
        use std::io::Write;
        let mut w = std::fs::File::create(host.join("warmup"))
            .map_err(io_err(format!("create {}", host.display())))?;
        for _ in 0..warmup_ops(ops) {
            w.write_all(&buf).map_err(io_err("host append".into()))?;
        }
        drop(w);
        let _ = std::fs::remove_file(host.join("warmup"));
        let rate = best_of(reps, ops, |r| {
            let p = host.join(format!("append{r}"));
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
                .map_err(io_err(format!("create {}", p.display())))?;
            for _ in 0..ops {
                f.write_all(&buf).map_err(io_err("host append".into()))?;
            }
            Ok(())
        })?;
        for r in 0..reps {
            let _ = std::fs::remove_file(host.join(format!("append{r}")));
        }
        rate
    };
    let bigp = host.join("big");
    let hf = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&bigp)
        .map_err(io_err(format!("create {}", bigp.display())))?;
    {
        // Allocate every page, as fallocate did for winefs.
        let chunk = vec![0u8; 1 << 20];
        let mut o = 0;
        while o < file_size {
            let k = (file_size - o).min(chunk.len() as u64) as usize;
            hf.write_all_at(&chunk[..k], o)
                .map_err(io_err(format!("fill {}", bigp.display())))?;
            o += k as u64;
        }
    }
    for &o in offsets.iter().take(warmup_ops(ops) as usize) {
        hf.write_all_at(&buf, o)
            .map_err(io_err("host pwrite".into()))?;
    }
    let h_overwrite = best_of(reps, ops, |_| {
        for &o in &offsets {
            hf.write_at(&buf, o).map_err(io_err("host pwrite".into()))?;
        }
        Ok(())
    })?;
    let h_hot = best_of(reps, ops, |_| {
        for &o in &hot_offsets {
            hf.write_at(&buf, o).map_err(io_err("host pwrite".into()))?;
        }
        Ok(())
    })?;
    for &o in read_offsets.iter().take(warmup_ops(ops) as usize) {
        hf.read_at(&mut rbuf, o)
            .map_err(io_err("host pread".into()))?;
    }
    let h_read = best_of(reps, ops, |_| {
        for &o in &read_offsets {
            let n = hf
                .read_at(&mut rbuf, o)
                .map_err(io_err("host pread".into()))?;
            std::hint::black_box(&rbuf[..n]);
        }
        Ok(())
    })?;
    drop(hf);
    let _ = std::fs::remove_file(&bigp);
    let (h_create, h_unlink) = {
        let names: Vec<String> = (0..cops).map(|i| format!("f{i:07}")).collect();
        let wd = host.join("wd");
        std::fs::create_dir(&wd).map_err(io_err(format!("create {}", wd.display())))?;
        for n in names.iter().take(warmup_ops(cops) as usize) {
            drop(std::fs::File::create(wd.join(n)).map_err(io_err("host create".into()))?);
        }
        for n in names.iter().take(warmup_ops(cops) as usize) {
            std::fs::remove_file(wd.join(n)).map_err(io_err("host unlink".into()))?;
        }
        let mut best_c = 0f64;
        let mut best_u = 0f64;
        for r in 0..reps {
            let d = host.join(format!("d{r}"));
            std::fs::create_dir(&d).map_err(io_err(format!("create {}", d.display())))?;
            let paths: Vec<PathBuf> = names.iter().map(|n| d.join(n)).collect();
            let t = Instant::now();
            for p in &paths {
                drop(std::fs::File::create(p).map_err(io_err("host create".into()))?);
            }
            best_c = best_c.max(cops as f64 / t.elapsed().as_secs_f64().max(1e-9));
            let t = Instant::now();
            for p in &paths {
                std::fs::remove_file(p).map_err(io_err("host unlink".into()))?;
            }
            best_u = best_u.max(cops as f64 / t.elapsed().as_secs_f64().max(1e-9));
            let _ = std::fs::remove_dir(&d);
        }
        (best_c, best_u)
    };

    let row = |name, ops, w, h, target, persist| BenchRow {
        name,
        ops,
        winefs_ops_per_s: w,
        tmpfs_ops_per_s: h,
        target,
        persist,
    };
    let rows = vec![
        row(ROWS[0], ops, w_append, h_append, Some(1.5), p_append.wrote(IO_SIZE)),
        row(ROWS[1], ops, w_strict, h_overwrite, Some(1.0), p_strict.wrote(IO_SIZE)),
        row(ROWS[2], ops, w_hot, h_hot, None, p_hot.wrote(IO_SIZE)),
        row(ROWS[3], ops, w_relaxed, h_overwrite, Some(1.5), p_relaxed.wrote(IO_SIZE)),
        row(ROWS[4], ops, w_read, h_read, Some(1.5), p_read),
        row(ROWS[5], cops, w_create, h_create, Some(2.0), p_create),
        row(ROWS[6], cops, w_unlink, h_unlink, None, p_unlink),
    ];
    Ok(SyscallBenchReport {
        rows,
        dir_fs: fs_type(&base),
        dir: base,
        pool_size: cfg.pool_size,
        file_size,
        repeats: reps,
    })
}

/// 4 KiB overwrites of `big` at `offsets` after a warm-up: best rate and persistence per op.
fn overwrite_rate(
    fs: &Fs,
    big: u64,
    offsets: &[u64],
    buf: &[u8],
    reps: u32,
    ops: u64,
) -> Result<(f64, PersistPerOp)> {
    for &o in offsets.iter().take(warmup_ops(ops) as usize) {
        fs.write(big, o, buf)?;
    }
    let s0 = fs.persist_stats();
    let rate = best_of(reps, ops, |_| {
        for &o in offsets {
            fs.write(big, o, buf)?;
        }
        Ok(())
    })?;
    let s1 = fs.persist_stats();
    Ok((rate, PersistPerOp::from_delta(&s0, &s1, ops * reps as u64)))
}

/// Mount a pool for a benchmark, once its pages are all faulted in (see [`Fs::wait_prefault`]).
pub(crate) fn mount_pool(pool: &Path, consistency: Consistency) -> Result<Fs> {
    let fs = Fs::mount(
        pool,
        MountOptions {
            consistency,
            ..Default::default()
        },
    )?;
    fs.wait_prefault();
    Ok(fs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_run_reports_every_row() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = SyscallBenchConfig {
            dir: Some(dir.path().to_path_buf()),
            ops: 200,
            file_size: 8 << 20,
            pool_size: 64 << 20,
            repeats: 2,
        };
        let rep = syscall_bench(&cfg).unwrap();
        assert_eq!(rep.rows.len(), ROWS.len());
        for name in ROWS {
            let r = rep
                .row(name)
                .unwrap_or_else(|| panic!("row {name} missing"));
            assert!(r.winefs_ops_per_s > 0.0, "{name}: {r:?}");
            assert!(r.tmpfs_ops_per_s > 0.0, "{name}: {r:?}");
            assert!(r.ratio() > 0.0, "{name}");
            assert!(r.ops > 0);
        }
        // Strict overwrites persist their data (journal or data lines), so traffic is counted.
        let s = rep.row("overwrite 4K strict").unwrap();
        assert!(s.persist.lines.iter().sum::<f64>() > 0.0);
        assert!(s.persist.fences > 0.0);
        let text = rep.to_string();
        for name in ROWS {
            assert!(text.contains(name));
        }
        // The benchmark cleans up after itself.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
