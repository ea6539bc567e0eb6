//! The ager itself: fill to the target utilization, then churn, following the profile.

use crate::age::config::AgeConfig;
use crate::age::profile::{Weighted, chi_square, chi_square_critical_95};
use crate::age::report::AgeReport;
use crate::age::state::{LiveFile, State, Tree};
use crate::age::target::AgeTarget;
use crate::error::{Error, Result};
use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

/// The ager.
pub struct Ager<'a, T: AgeTarget> {
    cfg: &'a AgeConfig,
    target: T,
    tree: Tree,
    sizes: Weighted,
    fractions: Vec<f64>,
    st: State,
    resumed: bool,
    churn: Option<(f64, f64)>,
}

impl<'a, T: AgeTarget> Ager<'a, T> {
    /// An ager for `target`; resumes from `cfg.state` when that file exists.
    pub fn new(cfg: &'a AgeConfig, mut target: T) -> Result<Ager<'a, T>> {
        if !(cfg.utilization > 0.0 && cfg.utilization < 1.0) {
            return Err(Error::Invalid(format!(
                "utilization {} is not between 0 and 1",
                cfg.utilization
            )));
        }
        if !(cfg.writes.is_finite() && cfg.writes >= 0.0) {
            return Err(Error::Invalid(format!(
                "writes {} is not a multiple of capacity ≥ 0",
                cfg.writes
            )));
        }
        let (st, resumed) = match &cfg.state {
            Some(p) if p.exists() => {
                let mut st = State::load(p, cfg)?;
                reconcile(&mut st, &mut target, &Tree::new(&cfg.profile))?;
                (st, true)
            }
            _ => (State::new(cfg), false),
        };
        Ok(Ager {
            cfg,
            tree: Tree::new(&cfg.profile),
            sizes: Weighted::new(cfg.profile.sizes.iter().map(|s| s.1)),
            fractions: cfg.profile.age_fractions(),
            target,
            st,
            resumed,
            churn: None,
        })
    }

    /// The target, to measure it after aging.
    pub fn into_target(self) -> T {
        self.target
    }

    fn file_path(&self, f: &LiveFile) -> String {
        let d = self.tree.path(f.depth, f.dir);
        if d.is_empty() {
            format!("f{}", f.id)
        } else {
            format!("{d}/f{}", f.id)
        }
    }

    fn ensure_dir(&mut self, depth: u32, j: u64) -> Result<()> {
        if depth == 0 || self.st.made.contains(&(depth, j)) {
            return Ok(());
        }
        self.ensure_dir(depth - 1, self.tree.parent(depth, j))?;
        self.target.mkdir(&self.tree.path(depth, j))?;
        self.st.made.insert((depth, j));
        Ok(())
    }

    /// Live files per age bucket.
    fn age_counts(&self) -> Vec<u64> {
        let clock = self.st.clock.max(1) as f64;
        let mut out = Vec::with_capacity(self.fractions.len());
        let mut prev = self.st.births.len();
        // Bucket i: age ≤ fraction_i × clock, i.e. birth ≥ clock − fraction_i × clock.
        for (i, frac) in self.fractions.iter().enumerate() {
            let bound = if i + 1 == self.fractions.len() {
                0.0
            } else {
                clock - frac * clock
            };
            let start = self.st.births.partition_point(|&b| (b as f64) < bound);
            out.push((prev - start) as u64);
            prev = start;
        }
        out
    }

    fn bucket_range(&self, bucket: usize) -> (usize, usize) {
        let clock = self.st.clock.max(1) as f64;
        let bound = |i: usize| -> usize {
            if i + 1 >= self.fractions.len() {
                0
            } else {
                let b = clock - self.fractions[i] * clock;
                self.st.births.partition_point(|&x| (x as f64) < b)
            }
        };
        let lo = bound(bucket);
        let hi = if bucket == 0 {
            self.st.births.len()
        } else {
            bound(bucket - 1)
        };
        (lo, hi)
    }

    fn create(&mut self) -> Result<bool> {
        let si = self.sizes.pick(self.st.rng.unit());
        let di = self.tree.pick.pick(self.st.rng.unit());
        let size = self.cfg.profile.sizes[si].0;
        let (depth, dirs) = self.tree.depths[di];
        let dir = self.st.rng.below(dirs);
        let f = LiveFile {
            id: self.st.next_id,
            size,
            depth,
            dir,
        };
        self.st.next_id += 1;
        self.ensure_dir(depth, dir)?;
        let path = self.file_path(&f);
        if !self.target.create(&path, size)? {
            self.st.full += 1;
            return Ok(false);
        }
        self.st.clock += 1;
        let birth = self.st.clock;
        self.st.births.push(birth);
        self.st.files.insert(birth, f);
        self.st.written += size;
        self.st.creates += 1;
        self.st.size_counts[si] += 1;
        self.st.depth_counts[di] += 1;
        Ok(true)
    }

    /// Delete the victim the age policy picks; false when nothing is left to delete.
    fn delete(&mut self) -> Result<bool> {
        if self.st.births.is_empty() {
            return Ok(false);
        }
        let counts = self.age_counts();
        let n = self.st.births.len() as f64;
        let total: f64 = self.cfg.profile.ages.iter().map(|a| a.1).sum();
        let bucket = (0..counts.len())
            .filter(|&i| counts[i] > 0)
            .max_by(|&a, &b| {
                // The greedy chi-square step: removing one file from bucket i lowers the
                // statistic by about 2 (c_i - e_i) / e_i, so take the largest relative excess
                // (an absolute excess would leave small old buckets, like the files of the
                // fill, overfull for ever).
                let ex = |i: usize| {
                    let e = n * self.cfg.profile.ages[i].1 / total;
                    if e > 0.0 {
                        (counts[i] as f64 - e) / e
                    } else {
                        f64::INFINITY
                    }
                };
                ex(a).total_cmp(&ex(b))
            })
            .unwrap_or(0);
        let (lo, hi) = self.bucket_range(bucket);
        let idx = lo + self.st.rng.pick(hi - lo);
        let birth = self.st.births.remove(idx);
        let f = self
            .st
            .files
            .remove(&birth)
            .ok_or_else(|| Error::Invalid("ager state lost a file".into()))?;
        self.target.remove(&self.file_path(&f))?;
        self.st.clock += 1;
        self.st.deletes += 1;
        Ok(true)
    }

    fn report(&mut self, started: Instant) -> Result<AgeReport> {
        let usage = self.target.usage()?;
        let counts = self.age_counts();
        let weights: Vec<f64> = self.cfg.profile.ages.iter().map(|a| a.1).collect();
        let (stat, df) = chi_square(&counts, &weights);
        Ok(AgeReport {
            target: self.target.describe(),
            profile: self.cfg.profile.name.clone(),
            seed: self.st.seed,
            target_utilization: self.cfg.utilization,
            usage,
            written: self.st.written,
            writes_target: (self.cfg.writes * usage.capacity as f64) as u64,
            creates: self.st.creates,
            deletes: self.st.deletes,
            full: self.st.full,
            live_files: self.st.births.len() as u64,
            live_bytes: self.st.files.values().map(|f| f.size).sum(),
            age_counts: counts,
            age_chi_square: stat,
            age_critical: chi_square_critical_95(df),
            size_counts: self.st.size_counts.clone(),
            depth_counts: self.st.depth_counts.clone(),
            churn_range: self.churn,
            seconds: started.elapsed().as_secs_f64(),
            resumed: self.resumed,
        })
    }

    /// The current report (no operation run).
    pub fn status(&mut self) -> Result<AgeReport> {
        self.report(Instant::now())
    }

    /// Age until the utilization target is reached and the volume of writes has passed.
    pub fn run(&mut self) -> Result<AgeReport> {
        let started = Instant::now();
        let capacity = self.target.usage()?.capacity;
        let goal = (self.cfg.writes * capacity as f64) as u64;
        let bar = self.cfg.progress.then(|| {
            let b = indicatif::ProgressBar::new(goal.max(1));
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{elapsed_precise} [{bar:40}] {binary_bytes}/{binary_total_bytes} written \
                     ({eta} left) {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b
        });
        let mut last_save = Instant::now();
        let mut ops: u64 = 0;
        // Refusals in a row: a file system that refuses creates even when nearly empty is full
        // of something else (another user's files, inodes), which the ager cannot fix.
        let mut refused_in_row = 0u32;
        loop {
            let u = self.target.usage()?.utilization();
            if self.st.filled {
                self.churn = Some(match self.churn {
                    Some((lo, hi)) => (lo.min(u), hi.max(u)),
                    None => (u, u),
                });
            }
            if !self.st.filled && u >= self.cfg.utilization {
                self.st.filled = true;
            }
            if self.st.filled && self.st.written >= goal {
                break;
            }
            if self.st.filled && self.cfg.stop_on_convergence && ops.is_multiple_of(1024) {
                let r = self.report(started)?;
                if r.converged() {
                    break;
                }
            }
            if u < self.cfg.utilization {
                if self.create()? {
                    refused_in_row = 0;
                } else {
                    refused_in_row += 1;
                    if refused_in_row > 64 || !self.delete()? {
                        return Err(Error::NoSpace(format!(
                            "{} refuses new files at {:.1}% utilization with the ager's own \
                             files deleted; the target utilization cannot be reached",
                            self.target.describe(),
                            100.0 * u
                        )));
                    }
                }
            } else if !self.delete()? {
                return Err(Error::Invalid(format!(
                    "{} is {:.1}% full before any file of the ager's: the target {:.1}% is \
                     already exceeded",
                    self.target.describe(),
                    100.0 * u,
                    100.0 * self.cfg.utilization
                )));
            }
            ops += 1;
            if ops.is_multiple_of(256) {
                if let Some(b) = &bar {
                    b.set_position(self.st.written.min(goal));
                    b.set_message(format!(
                        "{:.1}% full, {} files",
                        100.0 * u,
                        self.st.births.len()
                    ));
                }
                if let Some(p) = &self.cfg.state
                    && last_save.elapsed() >= self.cfg.checkpoint_every
                {
                    self.st.save(p)?;
                    last_save = Instant::now();
                }
            }
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        if let Some(p) = &self.cfg.state {
            self.st.save(p)?;
        }
        self.report(started)
    }

    /// Live files with their sizes and paths (for tests and measurements).
    pub fn live(&self) -> Vec<(String, u64)> {
        self.st
            .births
            .iter()
            .map(|b| {
                let f = &self.st.files[b];
                (self.file_path(f), f.size)
            })
            .collect()
    }
}

/// Bring a loaded state in line with the file system after an interruption: files the state
/// lists that are gone are forgotten; ager files the state does not list (made after the last
/// checkpoint) are deleted.
fn reconcile<T: AgeTarget>(st: &mut State, target: &mut T, tree: &Tree) -> Result<()> {
    let mut listed: HashMap<(u32, u64), BTreeSet<String>> = HashMap::new();
    for b in &st.births {
        let f = &st.files[b];
        listed
            .entry((f.depth, f.dir))
            .or_default()
            .insert(format!("f{}", f.id));
    }
    let mut dirs: Vec<(u32, u64)> = st.made.iter().copied().collect();
    dirs.push((0, 0));
    let mut present: HashMap<(u32, u64), BTreeSet<String>> = HashMap::new();
    for (d, j) in dirs {
        let path = tree.path(d, j);
        let names = match target.files_in(&path) {
            Ok(n) => n,
            Err(Error::NotFound) => continue,
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                continue;
            }
            Err(e) => return Err(e),
        };
        for n in names {
            let ours = n
                .strip_prefix('f')
                .is_some_and(|r| r.parse::<u64>().is_ok());
            if !ours {
                continue;
            }
            if listed.get(&(d, j)).is_some_and(|s| s.contains(&n)) {
                present.entry((d, j)).or_default().insert(n);
            } else {
                let p = if path.is_empty() {
                    n.clone()
                } else {
                    format!("{path}/{n}")
                };
                target.remove(&p)?;
            }
        }
    }
    let files = &st.files;
    st.births.retain(|b| {
        let f = &files[b];
        present
            .get(&(f.depth, f.dir))
            .is_some_and(|s| s.contains(&format!("f{}", f.id)))
    });
    let keep: BTreeSet<u64> = st.births.iter().copied().collect();
    st.files.retain(|b, _| keep.contains(b));
    Ok(())
}
