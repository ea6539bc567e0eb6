//! The small-update benchmark (`winefs bench small`): random strict overwrites of 64 B to 4 KiB
//! on a large file through the library, written by each of the three paths a strict mount can
//! take (`OverwritePath`): alternate writing, undo journaling, copy-on-write; and a 70/30
//! read/write mix at 128 B. Per case: operations per second and bytes stored per operation, on
//! the writer's own path (its thread's counters: what it waited for) and in all (the pool's:
//! with the background write-back of slots), each over the caller's bytes.
//!
//! Each path gets a fresh pool and file, each case a fresh mount of it, so that no case pays
//! for the slots the one before left (a clean unmount writes them home). Nothing here asserts
//! on time.

use crate::bench::syscall::{TempDir, default_dir, fmt_rate, fs_type, io_err, offsets_of};
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::media::pool::{PersistStats, thread_stats};
use crate::types::{Consistency, MkfsOptions, MountOptions, OverwritePath};
use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Update sizes measured.
pub const SIZES: [u64; 5] = [64, 128, 256, 1024, 4096];
/// The update size of the read/write mix.
const MIX_SIZE: u64 = 128;
/// Share of writes in the mix, in percent.
const MIX_WRITES: u64 = 30;

/// What to run.
#[derive(Clone, Debug)]
pub struct SmallBenchConfig {
    /// Where to put the pools (default: /dev/shm, else the temporary directory).
    pub dir: Option<PathBuf>,
    /// Size of the file the updates land in.
    pub file_size: u64,
    /// Operations per measurement.
    pub ops: u64,
}

impl Default for SmallBenchConfig {
    fn default() -> Self {
        SmallBenchConfig {
            dir: None,
            file_size: 1 << 30,
            ops: 20_000,
        }
    }
}

/// One measured case.
#[derive(Clone, Debug)]
pub struct SmallRow {
    /// The path ("alternate", "journal", "copy-on-write").
    pub path: &'static str,
    /// Update size in bytes; the mix rows say `mix` in `what`.
    pub size: u64,
    /// "write", or "mix 70/30" for the read/write mix.
    pub what: &'static str,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Bytes the caller wrote per operation.
    pub user: f64,
    /// Bytes stored per operation by the writing thread.
    pub own_bytes: f64,
    /// Bytes stored per operation in all (the background write-back included).
    pub all_bytes: f64,
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct SmallBenchReport {
    /// Every case, by path then size.
    pub rows: Vec<SmallRow>,
    /// Directory that held the pools.
    pub dir: PathBuf,
    /// Its file system.
    pub dir_fs: String,
    /// The file's size.
    pub file_size: u64,
    /// Operations per case.
    pub ops: u64,
}

const PATHS: [(OverwritePath, &str); 3] = [
    (OverwritePath::Alternate, "alternate"),
    (OverwritePath::Journal, "journal"),
    (OverwritePath::CopyOnWrite, "copy-on-write"),
];

/// Run every case once.
pub fn small_bench(cfg: &SmallBenchConfig) -> Result<SmallBenchReport> {
    if cfg.ops == 0 || cfg.file_size < 1 << 20 {
        return Err(Error::Invalid(
            "ops must be positive and the file at least 1 MiB".into(),
        ));
    }
    let base = cfg.dir.clone().unwrap_or_else(default_dir);
    let tmp = TempDir(base.join(format!("winefs-bench-small-{}", std::process::id())));
    std::fs::create_dir_all(&tmp.0).map_err(io_err(format!("create {}", tmp.0.display())))?;
    let mut rows = Vec::new();
    for (path, name) in PATHS {
        let pool = tmp.0.join(format!("{name}.pool"));
        Fs::mkfs(
            &pool,
            &MkfsOptions {
                size: Some(cfg.file_size + cfg.file_size / 8 + (64 << 20)),
                ..Default::default()
            },
        )?;
        let mount = || {
            Fs::mount(
                &pool,
                MountOptions {
                    consistency: Consistency::Strict,
                    overwrite_path: path,
                    ..Default::default()
                },
            )
        };
        let fs = mount()?;
        let ino = fs.create(fs.root(), b"big", 0o644, 0, 0)?.ino;
        fs.fallocate(ino, 0, cfg.file_size, false)?;
        fs.unmount()?;
        let cases = (0u64..).zip(SIZES).map(|(i, size)| (size, 100, 0x9e37_79b9 + i));
        for (size, writes, seed) in cases.chain([(MIX_SIZE, MIX_WRITES, 0x2545_f491)]) {
            // Each case on a fresh mount: a clean unmount wrote the slots the case before left
            // home, so no case pays for another's (alternate writing defers that copy).
            let fs = mount()?;
            let offs = offsets_of(cfg.ops, cfg.file_size, size, seed);
            rows.push(measure(&fs, ino, name, size, &offs, writes)?);
            fs.unmount()?;
        }
        let _ = std::fs::remove_file(&pool);
    }
    Ok(SmallBenchReport {
        rows,
        dir_fs: fs_type(&base),
        dir: base,
        file_size: cfg.file_size,
        ops: cfg.ops,
    })
}

/// Updates of `size` bytes at `offs`, `writes` percent of them writes (the rest reads), once
/// the pool is faulted in and the background work settled.
fn measure(
    fs: &Fs,
    ino: u64,
    path: &'static str,
    size: u64,
    offs: &[u64],
    writes: u64,
) -> Result<SmallRow> {
    // Timed with the pool faulted in, as a pool on persistent memory is mapped.
    fs.wait_prefault();
    let _ = fs.settle_rewrites(Duration::from_secs(30));
    let data = vec![0xa5u8; size as usize];
    let mut buf = vec![0u8; size as usize];
    let (pool0, own0) = (fs.persist_stats(), thread_stats());
    let t = Instant::now();
    let mut written = 0u64;
    for (i, &o) in offs.iter().enumerate() {
        if (i as u64 * 7919) % 100 < writes {
            fs.write(ino, o, &data)?;
            written += size;
        } else {
            fs.read(ino, o, &mut buf)?;
            std::hint::black_box(&buf);
        }
    }
    let secs = t.elapsed().as_secs_f64().max(1e-9);
    // The write-back the case started belongs to it.
    let _ = fs.settle_rewrites(Duration::from_secs(30));
    let n = offs.len().max(1) as f64;
    let total = |d: PersistStats| d.total_bytes() as f64 / n;
    Ok(SmallRow {
        path,
        size,
        what: if writes == 100 { "write" } else { "mix 70/30" },
        ops_per_s: n / secs,
        user: written as f64 / n,
        own_bytes: total(thread_stats().since(&own0)),
        all_bytes: total(fs.persist_stats().since(&pool0)),
    })
}

impl SmallBenchReport {
    /// The row of `path` at `size` (`mix`: the read/write mix).
    pub fn row(&self, path: &str, size: u64, mix: bool) -> Option<&SmallRow> {
        self.rows
            .iter()
            .find(|r| r.path == path && r.size == size && (r.what != "write") == mix)
    }
}

impl fmt::Display for SmallBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "strict random overwrites of a {} MiB file, {} ops per case, pools on {} ({})\n",
            self.file_size >> 20,
            self.ops,
            self.dir.display(),
            self.dir_fs
        )?;
        writeln!(
            f,
            "| path          | update  | ops/s   | vs copy-on-write | user B/op | writer B/op | x user | all B/op | x user |"
        )?;
        writeln!(
            f,
            "|---------------|---------|--------:|-----------------:|----------:|------------:|-------:|---------:|-------:|"
        )?;
        for r in &self.rows {
            let cow = self
                .row("copy-on-write", r.size, r.what != "write")
                .map_or(0.0, |c| c.ops_per_s);
            let what = match r.what {
                "write" => format!("{} B", r.size),
                _ => format!("mix {} B", r.size),
            };
            let amp = |b: f64| match r.user > 0.0 {
                true => format!("{:.2}", b / r.user),
                false => "-".into(),
            };
            writeln!(
                f,
                "| {:<13} | {:<7} | {:>7} | {:>16.2} | {:>9.0} | {:>11.0} | {:>6} | {:>8.0} | {:>6} |",
                r.path,
                what,
                fmt_rate(r.ops_per_s),
                r.ops_per_s / cow.max(1e-9),
                r.user,
                r.own_bytes,
                amp(r.own_bytes),
                r.all_bytes,
                amp(r.all_bytes)
            )?;
        }
        writeln!(
            f,
            "\nwriter B/op: stored by the writing thread (what each update waited for); all B/op: \
             stored in all, the background write-back of slots included."
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_run_measures_every_case_and_alternate_writes_once() {
        let dir = tempfile::tempdir().unwrap();
        let rep = small_bench(&SmallBenchConfig {
            dir: Some(dir.path().to_path_buf()),
            file_size: 8 << 20,
            ops: 100,
        })
        .unwrap();
        assert_eq!(rep.rows.len(), PATHS.len() * (SIZES.len() + 1));
        for r in &rep.rows {
            assert!(r.ops_per_s > 0.0, "{r:?}");
        }
        // A 128 B update by alternate writing stores its bytes once (twice when the writer
        // itself must write a slot back), plus descriptor words and times; undo journaling
        // stores them twice plus three journal entries; copy-on-write copies a block.
        let alt = rep.row("alternate", 128, false).unwrap();
        let journal = rep.row("journal", 128, false).unwrap();
        let cow = rep.row("copy-on-write", 128, false).unwrap();
        assert_eq!(alt.user, 128.0);
        assert!(alt.own_bytes < 2.0 * 128.0 + 64.0, "{alt:?}");
        assert!(alt.own_bytes < journal.own_bytes, "{alt:?} {journal:?}");
        assert!(cow.own_bytes > 4096.0, "{cow:?}");
        let text = rep.to_string();
        assert!(text.contains("mix 128 B") && text.contains("copy-on-write"));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
