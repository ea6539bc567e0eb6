//! The report of `winefs bench app` ([`super::app`]): the tables of ops/s and page faults per
//! workload, setup and state, the ratios against their targets, and the preload statistics.

use super::app::{AppBenchReport, Measurement, PoolState, READ_HEAVY, Setup};
use super::syscall::fmt_rate;
use crate::units::format_size;
use std::fmt;

/// Targets the report checks.
pub(crate) const PRELOAD_VS_TMPFS: f64 = 0.9;
pub(crate) const PRELOAD_VS_FUSE: f64 = 3.0;
pub(crate) const AGED_OPS: f64 = 0.95;
pub(crate) const AGED_FAULTS: f64 = 1.2;

/// "1.23" and whether it meets `target` (at least, or at most when `at_most`).
fn judged(r: Option<f64>, target: f64, at_most: bool) -> String {
    match r {
        None => "-".into(),
        Some(r) => {
            let ok = if at_most { r <= target } else { r >= target };
            format!("{r:.2} {}", if ok { "ok" } else { "MISS" })
        }
    }
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0 && a.is_finite()).then(|| a / b)
}

impl AppBenchReport {
    /// The measurement of `workload` on `setup` in `state`.
    pub fn get(&self, workload: &str, setup: Setup, state: PoolState) -> Option<&Measurement> {
        self.results
            .iter()
            .find(|m| m.workload == workload && m.setup == setup && m.state == state)
    }

    /// Workload names in the order measured.
    pub fn workloads(&self) -> Vec<&str> {
        let mut w: Vec<&str> = Vec::new();
        for m in &self.results {
            if !w.contains(&m.workload.as_str()) {
                w.push(&m.workload);
            }
        }
        w
    }

    fn states(&self) -> Vec<PoolState> {
        [PoolState::Clean, PoolState::Aged]
            .into_iter()
            .filter(|s| self.results.iter().any(|m| m.state == *s))
            .collect()
    }

    /// `a`'s ops/s over `b`'s for a workload in a state.
    pub fn ops_ratio(&self, w: &str, a: Setup, b: Setup, s: PoolState) -> Option<f64> {
        ratio(self.get(w, a, s)?.ops_per_s, self.get(w, b, s)?.ops_per_s)
    }

    /// Aged ops/s over clean ops/s, and aged page faults over clean ones.
    pub fn aged_ratios(&self, w: &str, setup: Setup) -> Option<(Option<f64>, Option<f64>)> {
        let c = self.get(w, setup, PoolState::Clean)?;
        let a = self.get(w, setup, PoolState::Aged)?;
        let faults = if c.faults() == 0 && a.faults() == 0 {
            Some(1.0)
        } else {
            ratio(a.faults() as f64, c.faults() as f64)
        };
        Some((ratio(a.ops_per_s, c.ops_per_s), faults))
    }
}

/// A blank line, then a Markdown table head: the columns (`a | b | c`), the first `left` of
/// them left-aligned and the rest right-aligned.
fn head(f: &mut fmt::Formatter<'_>, columns: &str, left: usize) -> fmt::Result {
    let n = columns.split(" | ").count();
    let align: String = (0..n)
        .map(|i| if i < left { "---|" } else { "--:|" })
        .collect();
    writeln!(f)?;
    writeln!(f, "| {columns} |")?;
    writeln!(f, "|{align}")
}

impl fmt::Display for AppBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "LMDB YCSB-like driver (MDB_WRITEMAP): {} records x {} B, {} ops per workload; \
             RocksDB db_bench --mmap_read=1: {}; seed {}; best of {}",
            self.records,
            self.value_size,
            self.ops,
            if self.rocksdb_num == 0 {
                "skipped".to_string()
            } else {
                format!("--num {}", self.rocksdb_num)
            },
            self.seed,
            self.repeats
        )?;
        writeln!(
            f,
            "tmpfs and pool: {} (huge=always tmpfs); aged: {}; preload: {}",
            format_size(self.pool_size),
            match self.util_pct {
                Some(u) => format!(
                    "winefs age --util {u} --writes {} --seed {}",
                    self.age_writes, self.seed
                ),
                None => "skipped".into(),
            },
            self.preload_lib.display()
        )?;
        for a in &self.aging {
            writeln!(f, "  aged {a}")?;
        }
        head(
            f,
            &format!(
                "workload | state | tmpfs ops/s | FUSE ops/s | preload ops/s | tmpfs faults | FUSE faults | preload faults | preload/tmpfs (>= {PRELOAD_VS_TMPFS}) | preload/FUSE (>= {PRELOAD_VS_FUSE} read-heavy)"
            ),
            2,
        )?;
        for w in self.workloads() {
            for s in self.states() {
                let cell = |setup: Setup, faults: bool| {
                    self.get(w, setup, s).map_or("-".to_string(), |m| {
                        if faults {
                            m.faults().to_string()
                        } else {
                            fmt_rate(m.ops_per_s)
                        }
                    })
                };
                let vs_fuse = self.ops_ratio(w, Setup::Preload, Setup::Fuse, s);
                writeln!(
                    f,
                    "| {w} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    s.label(),
                    cell(Setup::Tmpfs, false),
                    cell(Setup::Fuse, false),
                    cell(Setup::Preload, false),
                    cell(Setup::Tmpfs, true),
                    cell(Setup::Fuse, true),
                    cell(Setup::Preload, true),
                    judged(
                        self.ops_ratio(w, Setup::Preload, Setup::Tmpfs, s),
                        PRELOAD_VS_TMPFS,
                        false
                    ),
                    if READ_HEAVY.contains(&w) {
                        judged(vs_fuse, PRELOAD_VS_FUSE, false)
                    } else {
                        vs_fuse.map_or("-".into(), |r| format!("{r:.2}"))
                    }
                )?;
            }
        }
        if self.states().len() == 2 {
            head(
                f,
                &format!(
                    "workload | aged/clean ops: tmpfs | FUSE | preload (>= {AGED_OPS}) | aged/clean faults: tmpfs | FUSE | preload (<= {AGED_FAULTS})"
                ),
                1,
            )?;
            for w in self.workloads() {
                let r = |setup| self.aged_ratios(w, setup).unwrap_or((None, None));
                let plain = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
                let (t, fu, p) = (r(Setup::Tmpfs), r(Setup::Fuse), r(Setup::Preload));
                writeln!(
                    f,
                    "| {w} | {} | {} | {} | {} | {} | {} |",
                    plain(t.0),
                    plain(fu.0),
                    judged(p.0, AGED_OPS, false),
                    plain(t.1),
                    plain(fu.1),
                    judged(p.1, AGED_FAULTS, true)
                )?;
            }
        }
        writeln!(f)?;
        writeln!(
            f,
            "preload statistics (calls on winefs files, direct/FUSE):"
        )?;
        for r in &self.preload_stats {
            match &r.stats {
                None => writeln!(
                    f,
                    "  {} {}: n/a (no stats file)",
                    r.program,
                    r.state.label()
                )?,
                Some(s) => writeln!(
                    f,
                    "  {} {}: {} processes; mmap {}/{}, read {}/{}, write {}/{}; direct {}",
                    r.program,
                    r.state.label(),
                    r.processes,
                    s.mmap_direct,
                    s.mmap_fuse,
                    s.read_direct,
                    s.read_fuse,
                    s.write_direct,
                    s.write_fuse,
                    if s.total() == 0 {
                        "n/a (no calls)".to_string()
                    } else {
                        format!("{:.1}%", 100.0 * s.direct() as f64 / s.total() as f64)
                    }
                )?,
            }
        }
        Ok(())
    }
}
