//! Where an ager run stands, and its final report (text and JSON).

use crate::age::target::Usage;
use crate::report::rounded;
use serde::Serialize;
use std::fmt;

/// Where the run stands; also the final report.
#[derive(Clone, Debug)]
pub struct AgeReport {
    /// What was aged ([`AgeTarget::describe`](crate::age::AgeTarget::describe)).
    pub target: String,
    /// The profile's name.
    pub profile: String,
    /// The seed of the run.
    pub seed: u64,
    /// The utilization asked for, 0 < u < 1.
    pub target_utilization: f64,
    /// Space in use now.
    pub usage: Usage,
    /// Bytes written (sizes of the files created), in all runs of this state.
    pub written: u64,
    /// Bytes to write in all: the configured multiple of the capacity.
    pub writes_target: u64,
    /// Files created, in all runs of this state.
    pub creates: u64,
    /// Files deleted, in all runs of this state.
    pub deletes: u64,
    /// Creates refused for lack of space (each answered by a deletion).
    pub full: u64,
    /// Files of the ager's alive now.
    pub live_files: u64,
    /// Their sizes, summed.
    pub live_bytes: u64,
    /// Live files per age bucket, and the chi-square statistic against the profile.
    pub age_counts: Vec<u64>,
    /// Pearson's chi-square of `age_counts` against the profile's age weights.
    pub age_chi_square: f64,
    /// The statistic's critical value at 95% (converged when `age_chi_square` is at most this).
    pub age_critical: f64,
    /// Files created per size class of the profile since the start.
    pub size_counts: Vec<u64>,
    /// Files created per depth entry of the profile since the start.
    pub depth_counts: Vec<u64>,
    /// Utilization seen at every create or delete after the fill: (lowest, highest).
    pub churn_range: Option<(f64, f64)>,
    /// Wall-clock seconds of this run.
    pub seconds: f64,
    /// Whether this run went on from a saved state.
    pub resumed: bool,
}

impl AgeReport {
    /// Whether the live files' ages follow the profile (chi-square at or under the 95%
    /// critical value).
    pub fn converged(&self) -> bool {
        self.age_chi_square <= self.age_critical
    }

    /// The report as one JSON object (for scripts): the fields above, with `usage` as `used` and
    /// `capacity`, `churn_range` as `churn_min` and `churn_max`, and the derived `utilization`,
    /// `writes_x_capacity` and `converged`. Ratios keep six decimals (seconds one); one that
    /// is not a number (no churn yet) is null.
    pub fn to_json(&self) -> String {
        let r6 = |x: f64| rounded(x, 6);
        let (lo, hi) = self.churn_range.unwrap_or((f64::NAN, f64::NAN));
        let j = AgeReportJson {
            target: &self.target,
            profile: &self.profile,
            seed: self.seed,
            target_utilization: r6(self.target_utilization),
            utilization: r6(self.usage.utilization()),
            used: self.usage.used,
            capacity: self.usage.capacity,
            written: self.written,
            writes_target: self.writes_target,
            writes_x_capacity: r6(self.written as f64 / self.usage.capacity.max(1) as f64),
            creates: self.creates,
            deletes: self.deletes,
            full: self.full,
            live_files: self.live_files,
            live_bytes: self.live_bytes,
            age_counts: &self.age_counts,
            age_chi_square: r6(self.age_chi_square),
            age_critical: r6(self.age_critical),
            converged: self.converged(),
            size_counts: &self.size_counts,
            depth_counts: &self.depth_counts,
            churn_min: r6(lo),
            churn_max: r6(hi),
            seconds: rounded(self.seconds, 1),
            resumed: self.resumed,
        };
        serde_json::to_string(&j).expect("a report of strings and numbers serializes")
    }
}

/// [`AgeReport::to_json`]'s object: the report's fields, with `usage` flattened, the derived
/// `utilization`, `writes_x_capacity` and `converged`, and `churn_range` as `churn_min` and
/// `churn_max`. scripts/aging_compare.py reads it.
#[derive(Serialize)]
struct AgeReportJson<'a> {
    target: &'a str,
    profile: &'a str,
    seed: u64,
    target_utilization: f64,
    utilization: f64,
    used: u64,
    capacity: u64,
    written: u64,
    writes_target: u64,
    writes_x_capacity: f64,
    creates: u64,
    deletes: u64,
    full: u64,
    live_files: u64,
    live_bytes: u64,
    age_counts: &'a [u64],
    age_chi_square: f64,
    age_critical: f64,
    converged: bool,
    size_counts: &'a [u64],
    depth_counts: &'a [u64],
    churn_min: f64,
    churn_max: f64,
    seconds: f64,
    resumed: bool,
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

impl fmt::Display for AgeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "aged {} with profile {} (seed {}){}",
            self.target,
            self.profile,
            self.seed,
            if self.resumed { ", resumed" } else { "" }
        )?;
        writeln!(
            f,
            "utilization: {:.1}% ({} of {}; target {:.1}%){}",
            100.0 * self.usage.utilization(),
            gib(self.usage.used),
            gib(self.usage.capacity),
            100.0 * self.target_utilization,
            match self.churn_range {
                Some((lo, hi)) => format!(
                    ", held at {:.1}%–{:.1}% while churning",
                    100.0 * lo,
                    100.0 * hi
                ),
                None => String::new(),
            }
        )?;
        writeln!(
            f,
            "writes: {} = {:.1}x capacity (target {:.1}x); {} creates, {} deletes, {} creates \
             refused for space",
            gib(self.written),
            self.written as f64 / self.usage.capacity.max(1) as f64,
            self.writes_target as f64 / self.usage.capacity.max(1) as f64,
            self.creates,
            self.deletes,
            self.full
        )?;
        writeln!(
            f,
            "live: {} files, {}",
            self.live_files,
            gib(self.live_bytes)
        )?;
        write!(
            f,
            "age distribution: chi-square {:.1} vs {:.1} at 95% ({}); {:.1}s",
            self.age_chi_square,
            self.age_critical,
            if self.converged() {
                "converged"
            } else {
                "not converged"
            },
            self.seconds
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// What JSON must escape or carry as UTF-8: a quote, a backslash, control characters, and
    /// non-ASCII (which Rust's `{:?}` writes as `\u{..}`, not JSON).
    const AWKWARD: &str = "dir \"q\" \\ tab\t nl\n \u{1} \u{7f} é ✓ \u{1F600}";

    fn report() -> AgeReport {
        AgeReport {
            target: format!("directory /tmp/{AWKWARD}"),
            profile: AWKWARD.into(),
            seed: 3,
            target_utilization: 0.75,
            usage: Usage {
                used: 3 << 30,
                capacity: 4 << 30,
            },
            written: 40 << 30,
            writes_target: 40 << 30,
            creates: 10,
            deletes: 4,
            full: 1,
            live_files: 6,
            live_bytes: 3 << 30,
            age_counts: vec![1, 2, 3],
            age_chi_square: 1.234_567_89,
            age_critical: 5.991_464_5,
            size_counts: vec![4, 6],
            depth_counts: vec![10],
            churn_range: None,
            seconds: 12.345,
            resumed: true,
        }
    }

    #[test]
    fn report_json_keeps_strings_fields_and_precision() {
        let r = report();
        let text = r.to_json();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["target"], r.target.as_str(), "{text}");
        assert_eq!(v["profile"], AWKWARD, "{text}");
        let keys: BTreeSet<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        let want: BTreeSet<&str> = [
            "target",
            "profile",
            "seed",
            "target_utilization",
            "utilization",
            "used",
            "capacity",
            "written",
            "writes_target",
            "writes_x_capacity",
            "creates",
            "deletes",
            "full",
            "live_files",
            "live_bytes",
            "age_counts",
            "age_chi_square",
            "age_critical",
            "converged",
            "size_counts",
            "depth_counts",
            "churn_min",
            "churn_max",
            "seconds",
            "resumed",
        ]
        .into();
        assert_eq!(keys, want);
        assert_eq!(v["utilization"], 0.75);
        assert_eq!(v["writes_x_capacity"], 10.0);
        assert_eq!(v["age_chi_square"], 1.234568);
        assert_eq!(v["seconds"], 12.3);
        assert_eq!(v["age_counts"], serde_json::json!([1, 2, 3]));
        assert_eq!(v["converged"], true);
        assert!(
            v["churn_min"].is_null() && v["churn_max"].is_null(),
            "{text}"
        );
        let churned = AgeReport {
            churn_range: Some((0.7, 0.8)),
            ..r
        };
        let v: serde_json::Value = serde_json::from_str(&churned.to_json()).unwrap();
        assert_eq!(
            (&v["churn_min"], &v["churn_max"]),
            (&0.7.into(), &0.8.into())
        );
    }
}
