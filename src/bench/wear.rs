//! The wear benchmark (`winefs bench wear`): a varmail-like churn (delete a small file, create
//! it again, append to it in 4 KiB pieces with an fsync after each, read another) on a pool
//! half filled with large files, once with the default allocation (lowest hole first) and once
//! with wear-aware allocation (`MountOptions::wear_aware`: next fit for small allocations and
//! inode numbers, rotating undo staging), both on pools made with
//! `--wear-stats`. It reports, for the churn alone, the most and the mean writes per block of
//! the data area and their ratio (peak-to-mean), and the same for the journals. Nothing here
//! asserts on time.

use crate::bench::syscall::{TempDir, default_dir, io_err};
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::media::wear::WearReport;
use crate::types::{MkfsOptions, MountOptions};
use std::fmt;
use std::path::PathBuf;

/// What to run.
#[derive(Clone, Debug)]
pub struct WearBenchConfig {
    /// Where to put the pools (default: /dev/shm, else the temporary directory).
    pub dir: Option<PathBuf>,
    /// Pool size (half of it is filled with large files first).
    pub pool_size: u64,
    /// Small files the churn works on.
    pub files: u64,
    /// Churn iterations (each a delete, a create, its appends with fsyncs, and a read).
    pub ops: u64,
}

impl Default for WearBenchConfig {
    fn default() -> Self {
        WearBenchConfig {
            dir: None,
            pool_size: 256 << 20,
            files: 1000,
            ops: 20_000,
        }
    }
}

/// One policy's result.
#[derive(Clone, Debug)]
pub struct WearRow {
    /// "lowest hole first" or "wear-aware (next fit)".
    pub policy: &'static str,
    /// The churn's most writes of one data block.
    pub data_max: u32,
    /// The churn's mean writes per data block.
    pub data_mean: f64,
    /// The churn's most writes of one directory block (left out of the data figures).
    pub dir_max: u32,
    /// The churn's most writes of one inode-table block.
    pub inode_max: u32,
    /// The churn's mean writes per inode-table block.
    pub inode_mean: f64,
    /// The churn's most writes of one journal block (entry rings and undo staging).
    pub journal_max: u32,
    /// The churn's mean writes per journal block.
    pub journal_mean: f64,
}

impl WearRow {
    /// Most writes of a data block over the mean.
    pub fn peak_to_mean(&self) -> f64 {
        if self.data_mean > 0.0 {
            f64::from(self.data_max) / self.data_mean
        } else {
            0.0
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct WearBenchReport {
    /// Default allocation first, then wear-aware.
    pub rows: Vec<WearRow>,
    /// The configuration run.
    pub cfg: WearBenchConfig,
}

/// Run the churn under both policies.
pub fn wear_bench(cfg: &WearBenchConfig) -> Result<WearBenchReport> {
    if cfg.files == 0 || cfg.ops == 0 || cfg.pool_size < 64 << 20 {
        return Err(Error::Invalid(
            "files and ops must be positive and the pool at least 64 MiB".into(),
        ));
    }
    let base = cfg.dir.clone().unwrap_or_else(default_dir);
    let tmp = TempDir(base.join(format!("winefs-bench-wear-{}", std::process::id())));
    std::fs::create_dir_all(&tmp.0).map_err(io_err(format!("create {}", tmp.0.display())))?;
    let mut rows = Vec::new();
    for (wear_aware, policy) in [(false, "lowest hole first"), (true, "wear-aware (next fit)")] {
        let pool = tmp.0.join("wear.pool");
        let _ = std::fs::remove_file(&pool);
        Fs::mkfs(
            &pool,
            &MkfsOptions {
                size: Some(cfg.pool_size),
                wear_stats: true,
                ..Default::default()
            },
        )?;
        let fs = Fs::mount(
            &pool,
            MountOptions {
                wear_aware,
                no_background_rewrite: true,
                ..Default::default()
            },
        )?;
        let before = churn(&fs, cfg)?;
        let after = fs.wear_counts().unwrap_or_default();
        let mut delta: Vec<u32> = after
            .iter()
            .zip(before.iter().chain(std::iter::repeat(&0)))
            .map(|(a, b)| a.saturating_sub(*b))
            .collect();
        // Directory blocks are rewritten in place by every create and unlink whatever the
        // allocation policy: counted apart, so the data figures are the files' blocks.
        let mut dir_max = 0;
        for d in [fs.root(), fs.lookup(fs.root(), b"mail")?.ino] {
            for (_, phys, n) in fs.extents(d)? {
                for b in phys..phys + n {
                    if let Some(c) = usize::try_from(b).ok().and_then(|i| delta.get_mut(i)) {
                        dir_max = dir_max.max(std::mem::take(c));
                    }
                }
            }
        }
        let rep = WearReport::new(&fs.geometry(), &delta, 0);
        let region = |name: &str| {
            rep.regions
                .iter()
                .find(|r| r.region == name)
                .map_or((0, 0.0), |r| (r.max, r.mean))
        };
        let ((data_max, data_mean), (inode_max, inode_mean)) =
            (region("data"), region("inode tables"));
        let (journal_max, journal_mean) = region("journals");
        rows.push(WearRow {
            policy,
            dir_max,
            data_max,
            data_mean,
            inode_max,
            inode_mean,
            journal_max,
            journal_mean,
        });
        fs.unmount()?;
    }
    Ok(WearBenchReport {
        rows,
        cfg: cfg.clone(),
    })
}

/// Fill half the pool with 2 MiB files and make the small files; return the counters then;
/// run the churn.
fn churn(fs: &Fs, cfg: &WearBenchConfig) -> Result<Vec<u32>> {
    let root = fs.root();
    let big = vec![0x11u8; 2 << 20];
    for i in 0..cfg.pool_size / 2 / (2 << 20) {
        let ino = fs.create(root, format!("big{i}").as_bytes(), 0o644, 0, 0)?.ino;
        fs.write(ino, 0, &big)?;
    }
    let dir = fs.mkdir(root, b"mail", 0o755, 0, 0)?.ino;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n.max(1)
    };
    let piece = vec![0x5au8; 4096];
    let write_file = |name: &[u8], pieces: u64| -> Result<()> {
        let ino = fs.create(dir, name, 0o644, 0, 0)?.ino;
        for k in 0..pieces {
            fs.write(ino, k * 4096, &piece)?;
            fs.fsync(ino)?;
        }
        Ok(())
    };
    let name = |i: u64| format!("m{i:06}").into_bytes();
    for i in 0..cfg.files {
        write_file(&name(i), 1 + i % 4)?;
    }
    let before = fs.wear_counts().unwrap_or_default();
    let mut buf = vec![0u8; 16 << 10];
    for _ in 0..cfg.ops {
        let i = next(cfg.files);
        fs.unlink(dir, &name(i))?;
        write_file(&name(i), 1 + next(4))?;
        let j = fs.lookup(dir, &name(next(cfg.files)))?.ino;
        fs.read(j, 0, &mut buf)?;
    }
    Ok(before)
}

impl fmt::Display for WearBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "varmail-like churn: {} small files (4-16 KiB, 4 KiB appends with fsync), {} \
             iterations, on a {} MiB pool half full of 2 MiB files; writes per block during the \
             churn\n",
            self.cfg.files,
            self.cfg.ops,
            self.cfg.pool_size >> 20
        )?;
        writeln!(
            f,
            "| allocation             | data max | data mean | data peak/mean | directory max | inode-table max | inode-table mean | journal max | journal mean |"
        )?;
        writeln!(
            f,
            "|------------------------|---------:|----------:|---------------:|--------------:|----------------:|-----------------:|------------:|-------------:|"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "| {:<22} | {:>8} | {:>9.3} | {:>14.1} | {:>13} | {:>15} | {:>16.1} | {:>11} | {:>12.1} |",
                r.policy,
                r.data_max,
                r.data_mean,
                r.peak_to_mean(),
                r.dir_max,
                r.inode_max,
                r.inode_mean,
                r.journal_max,
                r.journal_mean
            )?;
        }
        writeln!(
            f,
            "\ndata: the data area's blocks other than the directories' (whose blocks every create \
             and unlink rewrites in place: 'directory max')"
        )?;
        if let [a, b] = &self.rows[..] {
            let lower = |x: u32, y: u32| f64::from(x) / f64::from(y.max(1));
            writeln!(
                f,
                "\nwear-aware allocation: peak writes of a block {:.1}x lower in the data area, \
                 {:.1}x in the inode tables, {:.1}x in the journals",
                lower(a.data_max, b.data_max),
                lower(a.inode_max, b.inode_max),
                lower(a.journal_max, b.journal_max)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_churn_counts_writes_and_spreads_them() {
        let dir = tempfile::tempdir().unwrap();
        let rep = wear_bench(&WearBenchConfig {
            dir: Some(dir.path().to_path_buf()),
            pool_size: 64 << 20,
            files: 50,
            ops: 400,
        })
        .unwrap();
        let [plain, aware] = &rep.rows[..] else {
            panic!("{rep:?}")
        };
        assert!(plain.data_max > 0 && plain.journal_max > 0, "{rep:?}");
        // Lowest-first hands the freed inode slot and blocks straight back; next fit moves on.
        assert!(aware.inode_max < plain.inode_max, "{rep:?}");
        assert!(aware.data_max < plain.data_max, "{rep:?}");
        assert!(rep.to_string().contains("wear-aware"));
    }
}
