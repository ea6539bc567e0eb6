//! Aging profiles: the file-size, file-age and directory-depth distributions an ager follows.
//! The three profiles the WineFS paper used or cited ship as data files in `profiles/`, with
//! the numbers Geriatrix publishes (docs/AGING.md cites the sources).
//!
//! Format, one entry per line (`#` starts a comment):
//! `size BYTES WEIGHT` (weight: share of files), `age CUTOFF WEIGHT` (relative age cutoffs,
//! ascending), `dir DEPTH WEIGHT SUBDIRS` (share of new files at that depth; SUBDIRS: how many
//! subdirectories each directory at that depth has).

use crate::error::{Error, Result};

/// The profiles built in, by name.
pub(crate) const BUILTIN: [(&str, &str); 3] = [
    ("agrawal", include_str!("../../profiles/agrawal.txt")),
    ("wang", include_str!("../../profiles/wang.txt")),
    ("meyer", include_str!("../../profiles/meyer.txt")),
];

/// One depth of the directory tree.
#[derive(Clone, Debug, PartialEq)]
pub struct DepthEntry {
    /// Depth below the aged tree's root (0: the root itself).
    pub depth: u32,
    /// Share of new files placed at this depth.
    pub weight: f64,
    /// Subdirectories of each directory at this depth.
    pub subdirs: u64,
}

/// An aging profile: the distributions of file sizes, relative ages and directory depths.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// The built-in name, or the path it was read from.
    pub name: String,
    /// (file size in bytes, weight), sizes ascending.
    pub sizes: Vec<(u64, f64)>,
    /// (age cutoff, weight), cutoffs ascending: bucket i holds files younger than
    /// `cutoff_i / cutoff_last` of the current clock (and at least bucket i-1's bound).
    pub ages: Vec<(f64, f64)>,
    /// Depths ascending.
    pub dirs: Vec<DepthEntry>,
}

fn bad(name: &str, line: usize, why: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("profile {name}, line {line}: {why}"))
}

fn num<T: std::str::FromStr>(name: &str, line: usize, s: Option<&str>, what: &str) -> Result<T> {
    let s = s.ok_or_else(|| bad(name, line, format!("missing {what}")))?;
    s.parse()
        .map_err(|_| bad(name, line, format!("{what} {s:?} is not a number")))
}

fn weight(name: &str, line: usize, s: Option<&str>) -> Result<f64> {
    let w: f64 = num(name, line, s, "weight")?;
    if !w.is_finite() || w < 0.0 {
        return Err(bad(
            name,
            line,
            format!("weight {w} is not a finite number ≥ 0"),
        ));
    }
    Ok(w)
}

impl Profile {
    /// A built-in profile by name, or a profile file by path.
    pub fn load(name_or_path: &str) -> Result<Profile> {
        if let Some((n, text)) = BUILTIN
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name_or_path))
        {
            return Profile::parse(n, text);
        }
        let text = std::fs::read_to_string(name_or_path).map_err(|e| {
            Error::io(
                format!(
                    "profile {name_or_path:?} is not built in ({}) and cannot be read",
                    BUILTIN.map(|b| b.0).join(", ")
                ),
                e,
            )
        })?;
        Profile::parse(name_or_path, &text)
    }

    /// Parse a profile from its text (the format above); `name` names it in errors.
    pub fn parse(name: &str, text: &str) -> Result<Profile> {
        let mut p = Profile {
            name: name.to_string(),
            sizes: Vec::new(),
            ages: Vec::new(),
            dirs: Vec::new(),
        };
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let body = raw.split('#').next().unwrap_or("").trim();
            if body.is_empty() {
                continue;
            }
            let mut w = body.split_whitespace();
            let kind = w.next().unwrap_or("");
            match kind {
                "size" => {
                    let s: u64 = num(name, line, w.next(), "size")?;
                    p.sizes.push((s, weight(name, line, w.next())?));
                }
                "age" => {
                    let c: f64 = num(name, line, w.next(), "age cutoff")?;
                    if !c.is_finite() || c <= 0.0 {
                        return Err(bad(name, line, format!("age cutoff {c} is not > 0")));
                    }
                    p.ages.push((c, weight(name, line, w.next())?));
                }
                "dir" => {
                    let depth: u32 = num(name, line, w.next(), "depth")?;
                    let weight = weight(name, line, w.next())?;
                    let subdirs: u64 = num(name, line, w.next(), "subdirectory count")?;
                    p.dirs.push(DepthEntry {
                        depth,
                        weight,
                        subdirs,
                    });
                }
                other => {
                    return Err(bad(
                        name,
                        line,
                        format!("unknown entry {other:?} (size, age or dir)"),
                    ));
                }
            }
            if w.next().is_some() {
                return Err(bad(name, line, "trailing fields"));
            }
        }
        for (what, total) in [
            ("size", p.sizes.iter().map(|s| s.1).sum::<f64>()),
            ("age", p.ages.iter().map(|s| s.1).sum::<f64>()),
        ] {
            if total <= 0.0 {
                return Err(Error::Invalid(format!(
                    "profile {name}: no {what} entry with a positive weight"
                )));
            }
        }
        if p.dirs.is_empty() {
            // Profiles without a tree (Wang, OS) put every file in the root.
            p.dirs.push(DepthEntry {
                depth: 0,
                weight: 1.0,
                subdirs: 0,
            });
        }
        if p.dirs.iter().map(|d| d.weight).sum::<f64>() <= 0.0 {
            return Err(Error::Invalid(format!(
                "profile {name}: no dir entry with a positive weight"
            )));
        }
        let ascending = |v: &[f64]| v.windows(2).all(|w| w[0] < w[1]);
        if !ascending(&p.sizes.iter().map(|s| s.0 as f64).collect::<Vec<_>>())
            || !ascending(&p.ages.iter().map(|s| s.0).collect::<Vec<_>>())
            || !ascending(&p.dirs.iter().map(|d| d.depth as f64).collect::<Vec<_>>())
        {
            return Err(Error::Invalid(format!(
                "profile {name}: sizes, age cutoffs and depths must each be listed ascending"
            )));
        }
        Ok(p)
    }

    /// Mean file size in bytes.
    pub fn mean_size(&self) -> f64 {
        let total: f64 = self.sizes.iter().map(|s| s.1).sum();
        self.sizes.iter().map(|s| s.0 as f64 * s.1).sum::<f64>() / total
    }

    /// Share of bytes (by the size distribution) in files of at least `min` bytes.
    pub fn byte_share_at_least(&self, min: u64) -> f64 {
        let total: f64 = self.sizes.iter().map(|s| s.0 as f64 * s.1).sum();
        self.sizes
            .iter()
            .filter(|s| s.0 >= min)
            .map(|s| s.0 as f64 * s.1)
            .sum::<f64>()
            / total
    }

    /// Age bucket bounds as fractions of the clock (ascending, the last is 1).
    pub fn age_fractions(&self) -> Vec<f64> {
        let last = self.ages.last().map_or(1.0, |a| a.0);
        self.ages.iter().map(|a| a.0 / last).collect()
    }
}

/// Draws an index with probability weight / total.
#[derive(Clone, Debug)]
pub(crate) struct Weighted {
    cumulative: Vec<f64>,
}

impl Weighted {
    /// A draw over `weights` (each ≥ 0), in their order.
    pub(crate) fn new(weights: impl IntoIterator<Item = f64>) -> Weighted {
        let mut acc = 0.0;
        let cumulative = weights
            .into_iter()
            .map(|w| {
                acc += w;
                acc
            })
            .collect();
        Weighted { cumulative }
    }

    /// The index for a uniform draw `u` in [0, 1).
    pub(crate) fn pick(&self, u: f64) -> usize {
        let total = self.cumulative.last().copied().unwrap_or(0.0);
        let x = u * total;
        // The first entry whose cumulative weight exceeds x (zero-weight entries never win).
        self.cumulative
            .partition_point(|&c| c <= x)
            .min(self.cumulative.len().saturating_sub(1))
    }
}

/// Pearson's chi-square statistic of `observed` counts against `weights`, and its degrees of
/// freedom. Adjacent categories are pooled until each expects at least 5 counts (the usual
/// validity rule; without it a category expecting 0.3 files dominates the statistic).
pub fn chi_square(observed: &[u64], weights: &[f64]) -> (f64, usize) {
    let n: u64 = observed.iter().sum();
    let total: f64 = weights.iter().sum();
    let mut cells: Vec<(f64, f64)> = Vec::new(); // (observed, expected)
    let (mut o, mut e) = (0.0, 0.0);
    for (&obs, &w) in observed.iter().zip(weights) {
        o += obs as f64;
        e += n as f64 * w / total;
        if e >= 5.0 {
            cells.push((o, e));
            (o, e) = (0.0, 0.0);
        }
    }
    if e > 0.0 || o > 0.0 {
        match cells.last_mut() {
            Some(last) => {
                last.0 += o;
                last.1 += e;
            }
            None => cells.push((o, e)),
        }
    }
    let stat = cells
        .iter()
        .filter(|c| c.1 > 0.0)
        .map(|&(o, e)| (o - e).powi(2) / e)
        .sum();
    (stat, cells.len().saturating_sub(1))
}

/// The chi-square critical value at `df` degrees of freedom for an upper tail of 5% (95%
/// confidence), by the Wilson–Hilferty approximation (within 1% for df ≥ 3).
pub fn chi_square_critical_95(df: usize) -> f64 {
    if df == 0 {
        return 0.0;
    }
    let k = df as f64;
    let z = 1.644_853_6; // the standard normal's 95th percentile
    let a = 2.0 / (9.0 * k);
    k * (1.0 - a + z * a.sqrt()).powi(3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_profiles_parse_with_the_published_numbers() {
        let a = Profile::load("agrawal").unwrap();
        assert_eq!(a.sizes.len(), 11);
        assert_eq!(a.sizes[10], (8_388_608, 1.0));
        assert_eq!(a.ages.len(), 10);
        assert_eq!(a.dirs.len(), 15);
        // The derived figures aging-profiles.md gives: mean 114 KB, 64% of bytes ≥ 2 MiB.
        assert!(
            (a.mean_size() / 1000.0 - 114.0).abs() < 1.0,
            "{}",
            a.mean_size()
        );
        assert!((a.byte_share_at_least(2 << 20) - 0.64).abs() < 0.01);
        let w = Profile::load("Wang").unwrap();
        assert!((w.mean_size() / 1000.0 - 234.0).abs() < 1.0);
        assert_eq!(w.dirs.len(), 1);
        let m = Profile::load("meyer").unwrap();
        assert!(
            (m.mean_size() / 1000.0 - 496.0).abs() < 1.0,
            "{}",
            m.mean_size()
        );
        assert!((m.byte_share_at_least(2 << 20) - 0.89).abs() < 0.01);
    }

    #[test]
    fn bad_profiles_get_precise_errors() {
        let e = Profile::parse("p", "size 10 1\nage 1 1\nsize x 2\n").unwrap_err();
        assert!(e.to_string().contains("line 3"), "{e}");
        let e = Profile::parse("p", "size 10 1\n").unwrap_err();
        assert!(e.to_string().contains("no age entry"), "{e}");
        let e = Profile::parse("p", "size 10 1\nsize 5 1\nage 1 1\n").unwrap_err();
        assert!(e.to_string().contains("ascending"), "{e}");
        let e = Profile::parse("p", "size 10 -1\nage 1 1\n").unwrap_err();
        assert!(e.to_string().contains("weight"), "{e}");
        let e = Profile::parse("p", "bogus 1 2\n").unwrap_err();
        assert!(e.to_string().contains("unknown entry"), "{e}");
        assert!(Profile::load("/nonexistent/profile").is_err());
    }

    #[test]
    fn weighted_pick_follows_the_weights() {
        let w = Weighted::new([1.0, 0.0, 3.0]);
        assert_eq!(w.pick(0.0), 0);
        assert_eq!(w.pick(0.2499), 0);
        assert_eq!(w.pick(0.25), 2);
        assert_eq!(w.pick(0.9999), 2);
    }

    #[test]
    fn chi_square_critical_values_match_tables() {
        // Table values at 95%: df 1: 3.841, 9: 16.919, 10: 18.307, 30: 43.773.
        for (df, v) in [(9, 16.919), (10, 18.307), (30, 43.773)] {
            let c = chi_square_critical_95(df);
            assert!((c - v).abs() / v < 0.01, "df {df}: {c} vs {v}");
        }
        let (s, df) = chi_square(&[10, 30], &[1.0, 3.0]);
        assert_eq!((s, df), (0.0, 1));
        let (s, _) = chi_square(&[30, 10], &[1.0, 3.0]);
        assert!(s > 3.841);
        // Categories expecting fewer than 5 are pooled with their neighbours.
        let (s, df) = chi_square(&[3, 2, 45, 50], &[3.0, 2.0, 45.0, 50.0]);
        assert_eq!((s, df), (0.0, 2));
        // A trailing small category joins the last cell.
        let (_, df) = chi_square(&[50, 48, 2], &[50.0, 48.0, 2.0]);
        assert_eq!(df, 1);
    }
}
