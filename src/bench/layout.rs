//! `winefs bench layout`: the mmap benchmark over given physical layouts, in one run.
//!
//! * A **winefs** case maps a file of a (possibly aged) pool through `File::mmap`.
//! * A **replay** case reproduces the layout another file system gave a file (its extents from
//!   FIEMAP: file offset, physical offset, length): a sparse file the size of that file
//!   system's device is made on the hugepage tmpfs, and each extent is mapped with `MAP_FIXED`
//!   from the same physical offset of it, side by side in one 2 MiB-aligned range, as a DAX
//!   file system maps a file's extents from its PM device. The kernel then maps with 2 MiB
//!   pages exactly the pieces that are 2 MiB-aligned and 2 MiB-contiguous, so faults and
//!   bandwidth follow the real allocator's layout (the closest this machine comes to ext4-DAX
//!   and xfs-DAX).

use super::mmap::{Mem, MmapBenchConfig, MmapCase, PlainMap, ensure_map_count, measure};
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::report::rounded;
use crate::sys::vm;
use crate::types::MountOptions;
use serde::Serialize;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// One layout to measure.
#[derive(Clone, Debug)]
pub enum LayoutCase {
    /// A file of a winefs pool, mapped through `File::mmap`.
    Winefs {
        /// The case's name in the results.
        name: String,
        /// The pool (not mounted elsewhere).
        pool: PathBuf,
        /// The file's path inside the pool.
        path: String,
    },
    /// Another file system's layout of a file, replayed on the hugepage tmpfs.
    Replay {
        /// The case's name in the results.
        name: String,
        /// Lines "file_offset physical_offset length" in bytes (`#` comments allowed).
        layout: PathBuf,
        /// Size of the device the offsets refer to.
        device_size: u64,
    },
}

impl LayoutCase {
    /// Parse "NAME=winefs:POOL:PATH" or "NAME=replay:LAYOUT:DEVICE_SIZE_BYTES".
    pub fn parse(s: &str) -> Result<LayoutCase> {
        let bad = || {
            Error::Invalid(format!(
                "case {s:?}: expected NAME=winefs:POOL:PATH or NAME=replay:LAYOUT:DEVICE_BYTES"
            ))
        };
        let (name, rest) = s.split_once('=').ok_or_else(bad)?;
        let mut it = rest.splitn(3, ':');
        let (kind, a, b) = (
            it.next().ok_or_else(bad)?,
            it.next().ok_or_else(bad)?,
            it.next().ok_or_else(bad)?,
        );
        match kind {
            "winefs" => Ok(LayoutCase::Winefs {
                name: name.into(),
                pool: a.into(),
                path: b.into(),
            }),
            "replay" => Ok(LayoutCase::Replay {
                name: name.into(),
                layout: a.into(),
                device_size: b.parse().map_err(|_| bad())?,
            }),
            _ => Err(bad()),
        }
    }
}

/// Read a layout file: (file offset, physical offset, length) in bytes, sorted by file offset.
pub(crate) fn read_layout(path: &Path) -> Result<Vec<(u64, u64, u64)>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let body = line.split('#').next().unwrap_or("").trim();
        if body.is_empty() {
            continue;
        }
        let v: Vec<u64> = body
            .split_whitespace()
            .map(|w| w.parse::<u64>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| {
                Error::Invalid(format!("{} line {}: not numbers", path.display(), i + 1))
            })?;
        if v.len() != 3 || v.iter().any(|x| x % 4096 != 0) || v[2] == 0 {
            return Err(Error::Invalid(format!(
                "{} line {}: expected three multiples of 4096 (offset, physical, length > 0)",
                path.display(),
                i + 1
            )));
        }
        out.push((v[0], v[1], v[2]));
    }
    out.sort_unstable();
    Ok(out)
}

/// Share of the first `size` bytes that lie in 2 MiB units backed by one extent at a
/// 2 MiB-aligned physical address (the same rule as `winefs filemap`).
pub fn mappable_share(layout: &[(u64, u64, u64)], size: u64) -> f64 {
    const H: u64 = 2 << 20;
    let mut ok = 0;
    for &(l, p, n) in layout {
        let mut u = l.div_ceil(H) * H;
        while u + H <= l + n && u + H <= size {
            if (p + (u - l)).is_multiple_of(H) {
                ok += H;
            }
            u += H;
        }
    }
    if size == 0 {
        0.0
    } else {
        ok as f64 / size as f64
    }
}

/// Measure every case with files of `cfg.size` bytes (each case's file must be at least that).
pub fn layout_bench(cfg: &MmapBenchConfig, cases: &[LayoutCase]) -> Result<Vec<MmapCase>> {
    let dir = super::mmap::prepare(cfg, "bench-layout")?;
    ensure_map_count(cfg.size / 4096)?;
    let mut out = Vec::new();
    for case in cases {
        out.push(match case {
            LayoutCase::Winefs { name, pool, path } => {
                let fs = Fs::mount(
                    pool,
                    MountOptions {
                        no_background_rewrite: true,
                        ..Default::default()
                    },
                )?;
                let f = fs.open_file(path)?;
                if f.metadata()?.size < cfg.size {
                    return Err(Error::Invalid(format!(
                        "{path} in {} is smaller than {} bytes",
                        pool.display(),
                        cfg.size
                    )));
                }
                let extents = fs
                    .extents(f.ino())?
                    .iter()
                    .filter(|e| e.0 * 4096 < cfg.size)
                    .count();
                let c = measure(name, cfg, extents, || {
                    Ok(Box::new(f.mmap(0, cfg.size as usize)?) as Box<dyn Mem>)
                })?;
                drop(f);
                fs.unmount()?;
                c
            }
            LayoutCase::Replay {
                name,
                layout,
                device_size,
            } => {
                let ext: Vec<(u64, u64, u64)> = read_layout(layout)?
                    .into_iter()
                    .filter(|e| e.0 < cfg.size)
                    .map(|(l, p, n)| (l, p, n.min(cfg.size - l)))
                    .collect();
                let covered: u64 = ext.iter().map(|e| e.2).sum();
                if covered != cfg.size
                    || ext.iter().any(|e| e.1 + e.2 > *device_size)
                    || ext.windows(2).any(|w| w[0].0 + w[0].2 > w[1].0)
                {
                    return Err(Error::Invalid(format!(
                        "{}: the extents must cover [0, {}) without overlap and lie inside \
                         the {device_size}-byte device",
                        layout.display(),
                        cfg.size
                    )));
                }
                let img = dir.join(format!("winefs-replay-{}-{name}.img", std::process::id()));
                let r = (|| {
                    let f = std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create_new(true)
                        .open(&img)
                        .map_err(|e| Error::io(format!("create {}", img.display()), e))?;
                    f.set_len(*device_size)
                        .map_err(|e| Error::io(format!("size {}", img.display()), e))?;
                    measure(name, cfg, ext.len(), || {
                        let len = cfg.size as usize;
                        let addr = vm::reserve(len, 0)?;
                        // Owns the reservation from here: dropped, it unmaps the whole range.
                        let m = PlainMap { addr, len };
                        for &(l, p, n) in &ext {
                            vm::map_pool_fixed(
                                addr + l as usize,
                                n as usize,
                                f.as_raw_fd(),
                                p,
                                false,
                            )?;
                        }
                        Ok(Box::new(m) as Box<dyn Mem>)
                    })
                })();
                let _ = std::fs::remove_file(&img);
                r?
            }
        });
    }
    Ok(out)
}

/// The results as a Markdown table.
pub fn table(cfg: &MmapBenchConfig, cases: &[MmapCase]) -> String {
    let mut s = format!(
        "mmap of {} MiB of each file, memcpy through the mapping, best of {}\n\n\
         | case | extents | seq write GB/s | rand 4K write GB/s | seq read GB/s | rand 4K read GB/s | 8 B read ns | first-touch faults | PMD-mapped |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        cfg.size >> 20,
        cfg.repeats
    );
    for c in cases {
        s += &format!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {} | {:.0}% |\n",
            c.name,
            c.extents,
            c.seq_write,
            c.rand_write_cold,
            c.seq_read,
            c.rand_read,
            c.read8_ns,
            c.faults,
            c.pmd_share * 100.0
        );
    }
    s
}

/// One JSON object per case and line (for scripts): the fields of [`MmapCase`], bandwidths
/// in GB/s with four decimals, `read8_ns` with two.
pub fn json(cases: &[MmapCase]) -> String {
    let mut out = String::new();
    for c in cases {
        let j = CaseJson {
            name: &c.name,
            extents: c.extents,
            seq_write: rounded(c.seq_write, 4),
            rand_write_cold: rounded(c.rand_write_cold, 4),
            rand_write: rounded(c.rand_write, 4),
            seq_read: rounded(c.seq_read, 4),
            rand_read: rounded(c.rand_read, 4),
            read8_ns: rounded(c.read8_ns, 2),
            faults: c.faults,
            pmd_share: rounded(c.pmd_share, 4),
        };
        out += &serde_json::to_string(&j).expect("a case of strings and numbers serializes");
        out.push('\n');
    }
    out
}

/// One line of [`json`] (scripts/aging_compare.py reads them).
#[derive(Serialize)]
struct CaseJson<'a> {
    name: &'a str,
    extents: usize,
    seq_write: f64,
    rand_write_cold: f64,
    rand_write: f64,
    seq_read: f64,
    rand_read: f64,
    read8_ns: f64,
    faults: u64,
    pmd_share: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappable_share_counts_aligned_congruent_units() {
        const M: u64 = 1 << 20;
        // One aligned 4 MiB extent: all of it.
        assert_eq!(mappable_share(&[(0, 8 * M, 4 * M)], 4 * M), 1.0);
        // Shifted by 4 KiB physically: nothing.
        assert_eq!(mappable_share(&[(0, 8 * M + 4096, 4 * M)], 4 * M), 0.0);
        // Two 2 MiB extents, one aligned: half.
        assert_eq!(
            mappable_share(&[(0, 2 * M, 2 * M), (2 * M, 7 * M, 2 * M)], 4 * M),
            0.5
        );
    }

    /// Names go through JSON escaping: each line parses back to the case it describes.
    #[test]
    fn json_lines_parse_back() {
        let awkward = "ext4 \"aged\" \\ \u{1}\t é";
        let cases = [
            MmapCase {
                name: awkward.into(),
                seq_write: 12.345_678,
                read8_ns: 81.126,
                faults: 4,
                pmd_share: 1.0,
                extents: 2,
                ..Default::default()
            },
            MmapCase {
                name: "plain".into(),
                ..Default::default()
            },
        ];
        let text = json(&cases);
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["name"], awkward);
        assert_eq!(lines[0]["seq_write"], 12.3457);
        assert_eq!(lines[0]["read8_ns"], 81.13);
        assert_eq!(lines[0]["faults"], 4);
        assert_eq!(lines[0]["extents"], 2);
        assert_eq!(lines[0]["pmd_share"], 1.0);
        assert_eq!(lines[1]["name"], "plain");
        assert_eq!(lines[0].as_object().unwrap().len(), 10);
    }

    /// A replayed layout maps with hugepages exactly where it is aligned.
    #[test]
    fn replay_follows_the_layout() {
        let (p, warning) = crate::hugepool::default_pool("bench-layout-test");
        assert!(warning.is_none(), "needs a hugepage tmpfs: {warning:?}");
        let dir = p.parent().unwrap().to_path_buf();
        const M: u64 = 1 << 20;
        let aligned = dir.join(format!("layout-a-{}", std::process::id()));
        let shifted = dir.join(format!("layout-s-{}", std::process::id()));
        std::fs::write(&aligned, format!("0 {} {}\n", 4 * M, 8 * M)).unwrap();
        std::fs::write(&shifted, format!("0 {} {}\n", 4 * M + 4096, 8 * M)).unwrap();
        let cfg = MmapBenchConfig {
            dir: Some(dir),
            size: 8 * M,
            repeats: 1,
            reads: 1000,
        };
        let cases = [
            LayoutCase::parse(&format!("a=replay:{}:{}", aligned.display(), 16 * M)).unwrap(),
            LayoutCase::parse(&format!("s=replay:{}:{}", shifted.display(), 16 * M)).unwrap(),
        ];
        let r = layout_bench(&cfg, &cases);
        let _ = std::fs::remove_file(&aligned);
        let _ = std::fs::remove_file(&shifted);
        let r = r.unwrap();
        assert_eq!(r[0].pmd_share, 1.0, "{:?}", r[0]);
        assert!(r[0].faults <= 4 + 2, "{:?}", r[0]);
        assert_eq!(r[1].pmd_share, 0.0, "{:?}", r[1]);
        assert!(r[1].faults >= 2048, "{:?}", r[1]);
        assert!(LayoutCase::parse("x=bogus:a:b").is_err());
    }
}
