//! The mmap benchmark (`winefs bench mmap`): one file written and read through a memory
//! mapping with memcpy, in three layouts measured in one run on a hugepage pool:
//! (a) winefs, the file on aligned 2 MiB extents; (b) the same file moved onto 4 KiB-scattered
//! blocks (`Fs::scatter`, the layout of a badly aged file system), mapped by winefs the same
//! way; (c) a plain file on the hugepage tmpfs mapped with `mmap(2)`, the upper bound.
//! Reported: sequential and random write/read bandwidth (1 MiB and 4 KiB memcpy), random
//! 8-byte read latency, page faults taken while first touching the mapping, PMD-mapped share.

use crate::rng::Rng;
use crate::error::{Error, Result};
use crate::fs::{Fs, Mapping};
use crate::sys::thread_page_faults;
use crate::sys::vm;
use crate::types::{MkfsOptions, MountOptions};
use std::fmt;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

const MIB: u64 = 1 << 20;
const HUGE: u64 = 2 * MIB;

/// What to run.
#[derive(Clone, Debug)]
pub struct MmapBenchConfig {
    /// Directory on a hugepage tmpfs (default: the one `hugepool` finds or mounts).
    pub dir: Option<PathBuf>,
    /// File size (a multiple of 2 MiB).
    pub size: u64,
    /// Fresh mappings measured per case (the best of each figure is reported).
    pub repeats: u32,
    /// Random 8-byte reads per measurement.
    pub reads: u64,
}

impl Default for MmapBenchConfig {
    fn default() -> Self {
        MmapBenchConfig {
            dir: None,
            size: 1 << 30,
            repeats: 3,
            reads: 4_000_000,
        }
    }
}

/// One layout's figures.
#[derive(Clone, Debug, Default)]
pub struct MmapCase {
    /// The case's name ("winefs", "scattered", "tmpfs", or a layout case's).
    pub name: String,
    /// GB/s (10^9 bytes per second).
    pub seq_write: f64,
    /// Sequential reads through the mapping, GB/s.
    pub seq_read: f64,
    /// Random 4 KiB writes over a fresh mapping (each page's first touch faults).
    pub rand_write_cold: f64,
    /// Random 4 KiB writes over a mapping already touched everywhere (TLB effects only).
    pub rand_write: f64,
    /// Random 4 KiB reads, GB/s.
    pub rand_read: f64,
    /// Nanoseconds per random 8-byte read.
    pub read8_ns: f64,
    /// Page faults taken by the first (sequential write) pass over a fresh mapping.
    pub faults: u64,
    /// Share of the mapping mapped with 2 MiB pages after the passes.
    pub pmd_share: f64,
    /// Extents of the file (1 for the tmpfs file).
    pub extents: usize,
}

/// Results of one run.
#[derive(Clone, Debug)]
pub struct MmapBenchReport {
    /// File size of every case.
    pub size: u64,
    /// Fresh mappings measured per case.
    pub repeats: u32,
    /// The hugepage tmpfs directory used.
    pub dir: PathBuf,
    /// A winefs file on aligned 2 MiB extents.
    pub winefs: MmapCase,
    /// A winefs file scattered in 4 KiB blocks (the fragmented baseline).
    pub scattered: MmapCase,
    /// A plain file on the hugepage tmpfs.
    pub tmpfs: MmapCase,
}

/// A mapping under test: winefs's or a plain file mapping.
pub(crate) trait Mem {
    fn store(&self, at: usize, data: &[u8]) -> Result<()>;
    fn load(&self, at: usize, buf: &mut [u8]) -> Result<()>;
    /// One 8-byte load (a memcpy call per 8 bytes would dominate the figure).
    fn load_u64(&self, at: usize) -> Result<u64>;
    fn pmd_bytes(&self) -> Result<u64>;
}

impl Mem for Mapping {
    fn store(&self, at: usize, data: &[u8]) -> Result<()> {
        Mapping::store(self, at, data)
    }
    fn load(&self, at: usize, buf: &mut [u8]) -> Result<()> {
        Mapping::load(self, at, buf)
    }
    fn load_u64(&self, at: usize) -> Result<u64> {
        Mapping::load_u64(self, at)
    }
    fn pmd_bytes(&self) -> Result<u64> {
        self.pmd_mapped_bytes()
    }
}

pub(crate) struct PlainMap {
    pub(crate) addr: usize,
    pub(crate) len: usize,
}

impl PlainMap {
    fn check(&self, at: usize, n: usize) -> Result<()> {
        if at.checked_add(n).is_none_or(|e| e > self.len) {
            return Err(Error::Invalid(format!("{at}+{n} outside the mapping")));
        }
        Ok(())
    }
}

impl Mem for PlainMap {
    fn store(&self, at: usize, data: &[u8]) -> Result<()> {
        self.check(at, data.len())?;
        vm::copy_in(self.addr + at, data);
        Ok(())
    }
    fn load(&self, at: usize, buf: &mut [u8]) -> Result<()> {
        self.check(at, buf.len())?;
        vm::copy_out(self.addr + at, buf);
        Ok(())
    }
    fn load_u64(&self, at: usize) -> Result<u64> {
        self.check(at, 8)?;
        Ok(vm::read_u64(self.addr + at))
    }
    fn pmd_bytes(&self) -> Result<u64> {
        crate::sys::pmd_mapped_bytes(self.addr, self.len)
    }
}

impl Drop for PlainMap {
    fn drop(&mut self) {
        vm::unmap(self.addr, self.len);
    }
}

fn gbs(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs.max(1e-9) / 1e9
}

/// Measure `repeats` fresh mappings made by `map`; keep the best of each figure.
pub(crate) fn measure(
    name: &str,
    cfg: &MmapBenchConfig,
    extents: usize,
    mut map: impl FnMut() -> Result<Box<dyn Mem>>,
) -> Result<MmapCase> {
    let size = cfg.size as usize;
    let pages = size / 4096;
    let mut big = vec![0x3cu8; MIB as usize];
    let mut page = vec![0xc3u8; 4096];
    let mut best = MmapCase {
        name: name.to_string(),
        extents,
        read8_ns: f64::MAX,
        faults: u64::MAX,
        ..Default::default()
    };
    for rep in 0..cfg.repeats.max(1) {
        let m = map()?;
        let f0 = thread_page_faults();
        let t = Instant::now();
        for off in (0..size).step_by(MIB as usize) {
            m.store(off, &big)?;
        }
        best.seq_write = best.seq_write.max(gbs(cfg.size, t.elapsed().as_secs_f64()));
        best.faults = best.faults.min(thread_page_faults() - f0);
        let t = Instant::now();
        for off in (0..size).step_by(MIB as usize) {
            m.load(off, &mut big)?;
        }
        best.seq_read = best.seq_read.max(gbs(cfg.size, t.elapsed().as_secs_f64()));
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ rep as u64);
        {
            let cold = map()?;
            let t = Instant::now();
            for _ in 0..pages {
                cold.store(rng.pick(pages) * 4096, &page)?;
            }
            best.rand_write_cold = best
                .rand_write_cold
                .max(gbs(cfg.size, t.elapsed().as_secs_f64()));
        }
        let t = Instant::now();
        for _ in 0..pages {
            m.store(rng.pick(pages) * 4096, &page)?;
        }
        best.rand_write = best
            .rand_write
            .max(gbs(cfg.size, t.elapsed().as_secs_f64()));
        let t = Instant::now();
        for _ in 0..pages {
            m.load(rng.pick(pages) * 4096, &mut page)?;
        }
        best.rand_read = best.rand_read.max(gbs(cfg.size, t.elapsed().as_secs_f64()));
        let words = size / 8;
        let mut sink = 0u64;
        let t = Instant::now();
        for _ in 0..cfg.reads {
            sink ^= m.load_u64(rng.pick(words) * 8)?;
        }
        let ns = t.elapsed().as_secs_f64() * 1e9 / cfg.reads.max(1) as f64;
        best.read8_ns = best.read8_ns.min(ns);
        std::hint::black_box(sink);
        best.pmd_share = best.pmd_share.max(m.pmd_bytes()? as f64 / cfg.size as f64);
    }
    Ok(best)
}

/// Make sure the kernel allows `vmas` mappings in this process (a 4 KiB-scattered file needs
/// one per block), raising `vm.max_map_count` when allowed.
pub(crate) fn ensure_map_count(vmas: u64) -> Result<()> {
    const KNOB: &str = "/proc/sys/vm/max_map_count";
    let cur: u64 = std::fs::read_to_string(KNOB)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let want = vmas * 2 + 65536;
    if cur >= want {
        return Ok(());
    }
    std::fs::write(KNOB, want.to_string()).map_err(|e| {
        Error::io(
            format!(
                "the scattered case needs {vmas} mappings, vm.max_map_count is {cur}; \
                 run `sysctl -w vm.max_map_count={want}` as root"
            ),
            e,
        )
    })
}

/// Check the size and find the hugepage directory of a run (`name`: the default pool's name).
pub(crate) fn prepare(cfg: &MmapBenchConfig, name: &str) -> Result<PathBuf> {
    if cfg.size == 0 || !cfg.size.is_multiple_of(HUGE) {
        return Err(Error::Invalid(format!(
            "size {} is not a positive multiple of 2 MiB",
            cfg.size
        )));
    }
    Ok(match &cfg.dir {
        Some(d) => d.clone(),
        None => {
            let (p, warning) = crate::hugepool::default_pool(name);
            if let Some(w) = warning {
                log::warn!("{w}");
            }
            p.parent().map(Path::to_path_buf).unwrap_or_default()
        }
    })
}

/// Run the benchmark.
pub fn mmap_bench(cfg: &MmapBenchConfig) -> Result<MmapBenchReport> {
    let dir = prepare(cfg, "bench-mmap")?;
    let blocks = cfg.size / 4096;
    ensure_map_count(blocks)?;
    // (c) first, and its file removed before the pool is made, to keep the tmpfs small.
    let plain_path = dir.join(format!("winefs-bench-mmap-{}.tmpfs", std::process::id()));
    let tmpfs = {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&plain_path)
            .map_err(|e| Error::io(format!("create {}", plain_path.display()), e))?;
        let r = (|| {
            f.set_len(cfg.size)
                .map_err(|e| Error::io("size the tmpfs file", e))?;
            measure("tmpfs (hugepage)", cfg, 1, || {
                let addr = vm::map_file_shared(f.as_raw_fd(), cfg.size as usize)?;
                Ok(Box::new(PlainMap {
                    addr,
                    len: cfg.size as usize,
                }) as Box<dyn Mem>)
            })
        })();
        let _ = std::fs::remove_file(&plain_path);
        r?
    };
    let pool = dir.join(format!("winefs-bench-mmap-{}.pool", std::process::id()));
    let r = (|| {
        Fs::mkfs(
            &pool,
            &MkfsOptions {
                size: Some(2 * cfg.size + 128 * MIB),
                ..Default::default()
            },
        )?;
        // The scattered case must stay scattered while it is measured.
        let fs = Fs::mount(
            &pool,
            MountOptions {
                no_background_rewrite: true,
                ..Default::default()
            },
        )?;
        let f = fs.create_file("/aligned")?;
        f.fallocate(0, cfg.size)?;
        let winefs = measure("winefs", cfg, fs.extents(f.ino())?.len(), || {
            Ok(Box::new(f.mmap(0, cfg.size as usize)?) as Box<dyn Mem>)
        })?;
        drop(f);
        fs.unlink(fs.root(), b"aligned")?;
        let f = fs.create_file("/scattered")?;
        f.fallocate(0, cfg.size)?;
        fs.scatter(f.ino())?;
        let scattered = measure(
            "winefs 4K-scattered",
            cfg,
            fs.extents(f.ino())?.len(),
            || Ok(Box::new(f.mmap(0, cfg.size as usize)?) as Box<dyn Mem>),
        )?;
        drop(f);
        fs.unmount()?;
        Ok::<_, Error>((winefs, scattered))
    })();
    let _ = std::fs::remove_file(&pool);
    let (winefs, scattered) = r?;
    Ok(MmapBenchReport {
        size: cfg.size,
        repeats: cfg.repeats,
        dir,
        winefs,
        scattered,
        tmpfs,
    })
}

impl MmapBenchReport {
    /// Worst of winefs/tmpfs over the write figures on fresh mappings, sequential and random
    /// (target ≥ 0.9).
    pub fn write_vs_tmpfs(&self) -> f64 {
        (self.winefs.seq_write / self.tmpfs.seq_write)
            .min(self.winefs.rand_write_cold / self.tmpfs.rand_write_cold)
    }
    /// Worst of winefs/scattered over the write figures on fresh mappings (target ≥ 2).
    pub fn write_vs_scattered(&self) -> f64 {
        (self.winefs.seq_write / self.scattered.seq_write)
            .min(self.winefs.rand_write_cold / self.scattered.rand_write_cold)
    }
    /// winefs first-touch faults per 2 MiB of file (target ≤ 1.1).
    pub fn fault_ratio(&self) -> f64 {
        self.winefs.faults as f64 / (self.size / HUGE) as f64
    }
}

impl fmt::Display for MmapBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "mmap of a {} MiB file on {}, memcpy through the mapping, best of {}",
            self.size / MIB,
            self.dir.display(),
            self.repeats
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "| case                 | extents | seq write GB/s | rand 4K write GB/s | rand 4K write, warm | seq read GB/s | rand 4K read GB/s | 8 B read ns | first-touch faults | PMD-mapped |"
        )?;
        writeln!(
            f,
            "|----------------------|--------:|---------------:|-------------------:|--------------------:|--------------:|------------------:|------------:|-------------------:|-----------:|"
        )?;
        for c in [&self.winefs, &self.scattered, &self.tmpfs] {
            writeln!(
                f,
                "| {:<20} | {:>7} | {:>14.2} | {:>18.2} | {:>19.2} | {:>13.2} | {:>17.2} | {:>11.1} | {:>18} | {:>9.0}% |",
                c.name,
                c.extents,
                c.seq_write,
                c.rand_write_cold,
                c.rand_write,
                c.seq_read,
                c.rand_read,
                c.read8_ns,
                c.faults,
                c.pmd_share * 100.0
            )?;
        }
        writeln!(f)?;
        let met = |ok: bool| if ok { "met" } else { "MISSED" };
        let (a, b, c) = (
            self.write_vs_tmpfs(),
            self.write_vs_scattered(),
            self.fault_ratio(),
        );
        writeln!(
            f,
            "writes on fresh mappings, winefs / tmpfs (worst of seq, rand): {a:.2} (target >= 0.90: {})",
            met(a >= 0.9)
        )?;
        writeln!(
            f,
            "writes on fresh mappings, winefs / 4K-scattered (worst of seq, rand): {b:.2} (target >= 2.00: {})",
            met(b >= 2.0)
        )?;
        write!(
            f,
            "first-touch faults per 2 MiB: {c:.2} (target <= 1.10: {}); 8 B reads: winefs {:.0} ns, scattered {:.0} ns, tmpfs {:.0} ns",
            met(c <= 1.1),
            self.winefs.read8_ns,
            self.scattered.read8_ns,
            self.tmpfs.read8_ns
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small run produces every figure, and the layouts are what the cases claim.
    #[test]
    fn small_run_reports_every_case() {
        let (p, warning) = crate::hugepool::default_pool("bench-mmap-test");
        assert!(warning.is_none(), "needs a hugepage tmpfs: {warning:?}");
        let cfg = MmapBenchConfig {
            dir: p.parent().map(Path::to_path_buf),
            size: 8 * MIB,
            repeats: 1,
            reads: 1000,
        };
        let r = mmap_bench(&cfg).unwrap();
        for c in [&r.winefs, &r.scattered, &r.tmpfs] {
            assert!(
                c.seq_write > 0.0 && c.rand_read > 0.0 && c.read8_ns > 0.0,
                "{c:?}"
            );
        }
        // Whole aligned units, so every 2 MiB maps with one PMD (checked below). Usually one
        // extent; a writer that the scheduler moves to the other CPU midway allocates the rest
        // from that CPU's partition, so up to one extent per unit is as designed.
        assert!(
            (1..=(cfg.size / (2 * MIB)) as usize).contains(&r.winefs.extents),
            "{:?}",
            r.winefs
        );
        assert_eq!(r.scattered.extents, 2048);
        assert_eq!(r.winefs.pmd_share, 1.0);
        assert_eq!(r.scattered.pmd_share, 0.0);
        assert!(r.winefs.faults <= 4 + 2, "{:?}", r.winefs);
        assert!(r.scattered.faults >= 2048, "{:?}", r.scattered);
        assert!(r.to_string().contains("first-touch faults per 2 MiB"));
    }
}
