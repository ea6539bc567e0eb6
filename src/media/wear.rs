//! Wear statistics (after SanGuo; `mkfs --wear-stats`): a write counter per pool block. Every
//! store through the pool adds one to the counter of each block it touches (a 4 KiB write, one;
//! an 8-byte descriptor store, one), kept in DRAM and saved to the pool's wear region (4 bytes
//! per block, little-endian, after the slot zones: docs/DESIGN.md §2) by every clean unmount,
//! loaded by mount. Counts since the last clean unmount are lost in a crash.
#![deny(clippy::cast_possible_truncation)]

use crate::media::geometry::{BLOCK_SIZE, Geometry};
use std::sync::atomic::{AtomicU32, Ordering};

/// The counters of one pool, in DRAM.
pub struct WearCounters {
    counts: Vec<AtomicU32>,
}

impl WearCounters {
    /// Counters from the wear region's bytes (4 per block, little-endian).
    pub fn from_bytes(raw: &[u8]) -> WearCounters {
        WearCounters {
            counts: decode(raw).into_iter().map(AtomicU32::new).collect(),
        }
    }

    /// Count one write of bytes `off..off+len`.
    pub(crate) fn count(&self, off: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (first, last) = (off / BLOCK_SIZE, (off + len - 1) / BLOCK_SIZE);
        for b in first..=last {
            if let Some(c) = usize::try_from(b).ok().and_then(|i| self.counts.get(i)) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The counts now, one per pool block.
    pub fn snapshot(&self) -> Vec<u32> {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }

    /// The counts as the wear region stores them.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.snapshot().iter().flat_map(|c| c.to_le_bytes()).collect()
    }
}

/// Counts from the wear region's bytes.
pub fn decode(raw: &[u8]) -> Vec<u32> {
    raw.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Bytes of the wear region that hold counts (4 per pool block); 0 for a pool without one.
pub fn region_len(g: &Geometry) -> u64 {
    match g.wear_blocks {
        0 => 0,
        _ => g.pool_size / BLOCK_SIZE * 4,
    }
}

/// Wear of one region of the pool.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionWear {
    /// Region name (`journals`, `inode tables`, `slot zones`, `data`, ...).
    pub region: &'static str,
    /// Blocks in the region.
    pub blocks: u64,
    /// Most writes of one block.
    pub max: u32,
    /// Mean writes per block.
    pub mean: f64,
}

/// What `winefs wear` reports.
#[derive(Clone, Debug, PartialEq)]
pub struct WearReport {
    /// Per region, in pool order.
    pub regions: Vec<RegionWear>,
    /// Data-area blocks by writes: (at most this many writes, blocks), powers of two.
    pub histogram: Vec<(u32, u64)>,
    /// The most written blocks of the pool: (block, writes, region), most first.
    pub hottest: Vec<(u64, u32, &'static str)>,
}

impl WearReport {
    /// Summarise `counts` (one per pool block) for the pool laid out as `g`.
    pub fn new(g: &Geometry, counts: &[u32], top: usize) -> WearReport {
        let zones_end = g.wear_start;
        let spans: [(&'static str, u64, u64); 6] = [
            ("superblock", 0, g.journal_start),
            ("journals", g.journal_start, g.inode_table_start),
            ("inode tables", g.inode_table_start, g.bitmap_start),
            ("bitmap", g.bitmap_start, g.zone_start),
            ("slot zones", g.zone_start, zones_end),
            ("data", g.data_start, g.data_start + g.data_blocks),
        ];
        let region_of = |b: u64| {
            spans
                .iter()
                .find(|(_, s, e)| (*s..*e).contains(&b))
                .map_or("other", |r| r.0)
        };
        let slice = |s: u64, e: u64| {
            let (s, e) = (usize::try_from(s).unwrap_or(0), usize::try_from(e).unwrap_or(0));
            &counts[s.min(counts.len())..e.min(counts.len())]
        };
        let regions = spans
            .iter()
            .filter(|(_, s, e)| e > s)
            .map(|&(region, s, e)| {
                let c = slice(s, e);
                let sum: u64 = c.iter().map(|&x| u64::from(x)).sum();
                RegionWear {
                    region,
                    blocks: e - s,
                    max: c.iter().copied().max().unwrap_or(0),
                    mean: sum as f64 / (e - s) as f64,
                }
            })
            .collect();
        let mut histogram: Vec<(u32, u64)> = Vec::new();
        for &c in slice(g.data_start, g.data_start + g.data_blocks) {
            let bound = if c == 0 { 0 } else { c.next_power_of_two() };
            match histogram.iter_mut().find(|h| h.0 == bound) {
                Some(h) => h.1 += 1,
                None => histogram.push((bound, 1)),
            }
        }
        histogram.sort_unstable();
        let mut hottest: Vec<(u64, u32, &'static str)> = counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(b, &c)| (b as u64, c, region_of(b as u64)))
            .collect();
        hottest.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        hottest.truncate(top);
        WearReport {
            regions,
            histogram,
            hottest,
        }
    }

    /// The data area's peak-to-mean ratio of block writes (0 when nothing was written).
    pub fn data_peak_to_mean(&self) -> f64 {
        self.regions
            .iter()
            .find(|r| r.region == "data")
            .filter(|r| r.mean > 0.0)
            .map_or(0.0, |r| f64::from(r.max) / r.mean)
    }
}

impl std::fmt::Display for WearReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "| region       |     blocks | max writes | mean writes | max/mean |")?;
        writeln!(f, "|--------------|-----------:|-----------:|------------:|---------:|")?;
        for r in &self.regions {
            let ratio = if r.mean > 0.0 { f64::from(r.max) / r.mean } else { 0.0 };
            writeln!(
                f,
                "| {:<12} | {:>10} | {:>10} | {:>11.2} | {:>8.1} |",
                r.region, r.blocks, r.max, r.mean, ratio
            )?;
        }
        writeln!(f, "\ndata blocks by writes:")?;
        for (bound, n) in &self.histogram {
            match bound {
                0 => writeln!(f, "  never written   {n:>10}")?,
                b => writeln!(f, "  {:>6} ..= {:<6} {n:>10}", b / 2 + 1, b)?,
            }
        }
        writeln!(f, "\nhottest blocks:")?;
        for (b, c, region) in &self.hottest {
            writeln!(f, "  block {b:>10} ({region}): {c} writes")?;
        }
        Ok(())
    }
}
