//! The text of a `winefs bench workload` report ([`super::workload`]): one Markdown table per
//! workload with ratios against the baselines of the same run, then the targets of issue 18.

use super::workload::{Setup, Workload, WorkloadBenchReport, WorkloadRun};
use std::fmt;

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2}"))
}

/// What a run's row says in place of numbers when it has none.
fn why_not(r: &WorkloadRun) -> Option<String> {
    r.skipped
        .as_ref()
        .map(|s| format!("skipped: {s}"))
        .or_else(|| r.error.as_ref().map(|e| format!("**failed**: {e}")))
}

impl WorkloadBenchReport {
    fn setup_rows(&self, f: &mut fmt::Formatter<'_>, w: Workload) -> fmt::Result {
        writeln!(
            f,
            "| setup | threads | ops/s | p50 µs | p99 µs | p99.9 µs | vs tmpfs | vs passthrough_ll | aged/clean | extents per file (most) |"
        )?;
        writeln!(f, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")?;
        for r in self.runs.iter().filter(|r| r.workload == w) {
            let label = match &r.transport {
                Some(t) => format!("{} ({t})", r.setup.label()),
                None => r.setup.label().to_string(),
            };
            if let Some(why) = why_not(r) {
                writeln!(f, "| {label} | {} | {why} | | | | | | | |", r.threads)?;
                continue;
            }
            let t = Some(r.threads);
            let vs_pt = matches!(r.setup, Setup::Fuse | Setup::FuseAged)
                .then(|| self.ratio(w, r.setup, Setup::Passthrough, t))
                .flatten();
            let clean = match r.setup {
                Setup::LibStrictAged => Some(Setup::LibStrict),
                Setup::FuseAged => Some(Setup::Fuse),
                _ => None,
            };
            let pieces = r
                .pieces
                .map_or("-".into(), |p| format!("{:.2} ({})", p.per_file(), p.most));
            writeln!(
                f,
                "| {label} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {pieces} |",
                r.threads,
                thousands(r.ops_per_s as u64),
                r.p50_us,
                r.p99_us,
                r.p999_us,
                ratio(self.ratio(w, r.setup, Setup::Tmpfs, t)),
                ratio(vs_pt),
                ratio(clean.and_then(|c| self.ratio(w, r.setup, c, t))),
            )?;
        }
        Ok(())
    }

    fn targets(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "targets (issue 18; ratios of this run):")?;
        let mut line = |what: String, got: Option<f64>, want: f64| {
            let verdict = match got {
                None => "not measured".to_string(),
                Some(g) if g >= want => format!("{g:.2} (met)"),
                Some(g) => format!("{g:.2} (**not met**)"),
            };
            writeln!(f, "- {what} >= {want}: {verdict}")
        };
        for w in [Workload::Varmail, Workload::AppendFsync] {
            if self.runs.iter().any(|r| r.workload == w) {
                line(
                    format!("{}: winefs library (strict) / tmpfs", w.name()),
                    self.ratio(w, Setup::LibStrict, Setup::Tmpfs, None),
                    2.0,
                )?;
            }
        }
        let mut seen: Vec<Workload> = Vec::new();
        for r in &self.runs {
            if !seen.contains(&r.workload) {
                seen.push(r.workload);
            }
        }
        for &w in &seen {
            let top = self
                .runs
                .iter()
                .filter(|r| r.workload == w)
                .map(|r| r.threads)
                .max();
            let t = if w == Workload::Scale { top } else { None };
            line(
                format!("{}: winefs FUSE / passthrough_ll", w.name()),
                self.ratio(w, Setup::Fuse, Setup::Passthrough, t),
                1.0,
            )?;
            line(
                format!("{}: winefs library aged / clean", w.name()),
                self.ratio(w, Setup::LibStrictAged, Setup::LibStrict, t),
                0.9,
            )?;
            line(
                format!("{}: winefs FUSE aged / clean", w.name()),
                self.ratio(w, Setup::FuseAged, Setup::Fuse, t),
                0.9,
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for WorkloadBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "winefs bench workload: in {} ({}), {} CPUs, {} s per timed run, file counts x{} of the \
             defaults, microbenchmark file {} MiB; aged pools at {}% (agrawal profile)",
            self.dir.display(),
            self.dir_fs,
            self.cpus,
            self.seconds,
            self.scale,
            self.micro_size >> 20,
            self.util_pct
        )?;
        if self.rounds > 1 {
            writeln!(
                f,
                "{} rounds, the setups in turn in each: ops/s and latencies of each run's median \
                 round, ratios the median of the rounds' ratios",
                self.rounds
            )?;
        }
        for (w, s) in &self.aging {
            writeln!(f, "aged pool for {}: {s}", w.name())?;
        }
        if self.runs.iter().any(|r| r.pieces.is_some()) {
            writeln!(
                f,
                "extents per file: the file set after the run on winefs, counted in physically \
                 contiguous runs of blocks (the most in one file in brackets)"
            )?;
        }
        let mut seen: Vec<Workload> = Vec::new();
        for r in &self.runs {
            if seen.contains(&r.workload) {
                continue;
            }
            seen.push(r.workload);
            let w = r.workload;
            writeln!(f, "\n{}: {}", w.name(), w.flow())?;
            match w.paper() {
                Some((t, n)) => writeln!(
                    f,
                    "paper (Table 1): {t} threads, {} files; here: {} threads, {} files, {}\n",
                    thousands(n),
                    r.threads,
                    thousands(r.files),
                    w.shape()
                )?,
                None => writeln!(f, "{}\n", w.shape())?,
            }
            self.setup_rows(f, w)?;
        }
        writeln!(f)?;
        self.targets(f)
    }
}
