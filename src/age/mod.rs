//! `winefs age`: a file-system ager in the spirit of Geriatrix (Kadekodi et al., ATC'18), a
//! tool beside the core. It creates and deletes files following a profile's file-size,
//! file-age and directory-depth distributions until the file system reaches a target
//! utilization, then keeps churning (deleting to make room, creating to refill) at that
//! utilization until a target volume of writes, a multiple of the capacity, has passed.
//!
//! * **Ages** are relative, as in Geriatrix: a clock ticks once per create or delete, and a file
//!   born at tick b has age (clock − b) / clock; bucket i of the profile's age list holds the
//!   files younger than cutoff_i / cutoff_last of that. A deletion picks its victim uniformly
//!   in the bucket that holds the most files beyond its share, so the live files' ages converge
//!   to the profile. Convergence (a chi-square test at 95%) is reported, and stops the run only
//!   when asked (`stop_on_convergence`): the requested volume of writes is honoured.
//! * **Directories**: depth d of the profile holds `subdirs(d-1)` subdirectories per directory
//!   of depth d-1, capped at `MAX_DIRS_PER_DEPTH` (256); a new file picks a depth by weight and a
//!   directory of that depth uniformly; directories are made on first use.
//! * **Deterministic** under a seed: every choice comes from one seeded generator, so the same
//!   seed on the same (fresh) file system gives the same sequence of operations.
//! * **Resumable**: the ager's state is checkpointed (atomically) beside the target; a new run
//!   with the same state file reconciles it with the file system and goes on.

pub mod profile;
pub mod target;

use crate::error::{Error, Result};
use crate::report::rounded;
use profile::{Profile, Weighted, chi_square, chi_square_critical_95};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
pub use target::{AgeTarget, CreateMethod, LibraryTarget, PosixTarget, Usage};

/// Directories per depth at most (the profiles' products of subdirectory counts reach
/// millions; a few hundred directories per level spread files as widely as small pools need).
pub(crate) const MAX_DIRS_PER_DEPTH: u64 = 256;

/// What to run.
#[derive(Clone, Debug)]
pub struct AgeConfig {
    /// The distributions to follow.
    pub profile: Profile,
    /// Seed of every choice: the same seed on the same fresh file system runs the same way.
    pub seed: u64,
    /// Target utilization, 0 < u < 1.
    pub utilization: f64,
    /// Total bytes to write, as a multiple of the capacity (fill included).
    pub writes: f64,
    /// Stop once the age distribution converges (after the fill), even before `writes`.
    pub stop_on_convergence: bool,
    /// Where the ager's state lives (checkpointed every `checkpoint_every` and at the end).
    pub state: Option<PathBuf>,
    /// How often the state is checkpointed while running.
    pub checkpoint_every: Duration,
    /// Draw a progress bar on standard error.
    pub progress: bool,
}

impl AgeConfig {
    /// The defaults for `profile`: seed 1, 75% utilization, 10x capacity of writes, no state
    /// file, a checkpoint every 30 s, no progress bar.
    pub fn new(profile: Profile) -> AgeConfig {
        AgeConfig {
            profile,
            seed: 1,
            utilization: 0.75,
            writes: 10.0,
            stop_on_convergence: false,
            state: None,
            checkpoint_every: Duration::from_secs(30),
            progress: false,
        }
    }
}

/// A small deterministic generator (splitmix64).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct LiveFile {
    id: u64,
    size: u64,
    depth: u32,
    dir: u64,
}

/// The directory tree the profile describes.
#[derive(Clone, Debug)]
struct Tree {
    /// (depth, directories at that depth) of every depth files may go to.
    depths: Vec<(u32, u64)>,
    /// Directories at each depth 0..=max.
    counts: Vec<u64>,
    /// Subdirectories per directory at each depth 0..=max.
    fanout: Vec<u64>,
    pick: Weighted,
}

impl Tree {
    fn new(p: &Profile) -> Tree {
        let max = p.dirs.iter().map(|d| d.depth).max().unwrap_or(0);
        let mut counts = vec![1u64];
        let mut fanout = Vec::new();
        for d in 0..=max {
            // A depth the profile does not list passes one subdirectory down, so deeper
            // levels stay reachable.
            let sub = p
                .dirs
                .iter()
                .find(|e| e.depth == d)
                .map_or(1, |e| e.subdirs);
            fanout.push(sub.max(1));
            if d < max {
                let next = (counts[d as usize] * sub.max(1)).min(MAX_DIRS_PER_DEPTH);
                counts.push(next);
            }
        }
        let depths: Vec<(u32, u64)> = p
            .dirs
            .iter()
            .map(|e| (e.depth, counts[e.depth as usize]))
            .collect();
        Tree {
            depths,
            counts,
            fanout,
            pick: Weighted::new(p.dirs.iter().map(|e| e.weight)),
        }
    }

    /// The parent (at depth d-1) of directory `j` at depth d.
    fn parent(&self, depth: u32, j: u64) -> u64 {
        let d = depth as usize;
        (j / self.fanout[d - 1]) % self.counts[d - 1]
    }

    /// Path of directory `j` at `depth` ("" for the root).
    fn path(&self, depth: u32, j: u64) -> String {
        if depth == 0 {
            return String::new();
        }
        let up = self.path(depth - 1, self.parent(depth, j));
        if up.is_empty() {
            format!("d{j}")
        } else {
            format!("{up}/d{j}")
        }
    }
}

/// Everything the ager knows, checkpointed for resuming.
#[derive(Clone, Debug, PartialEq, Eq)]
struct State {
    profile: String,
    seed: u64,
    rng: Rng,
    clock: u64,
    next_id: u64,
    written: u64,
    creates: u64,
    deletes: u64,
    full: u64,
    filled: bool,
    /// Live files by birth tick, births ascending (appends are always the youngest).
    births: Vec<u64>,
    files: HashMap<u64, LiveFile>,
    made: BTreeSet<(u32, u64)>,
    /// Files created per size class and per depth entry (sampling checks).
    size_counts: Vec<u64>,
    depth_counts: Vec<u64>,
}

/// The format of the state file: a JSON object (see [`Checkpoint`]) whose `format` field is
/// this string. Version 1 was a line format.
const STATE_MAGIC: &str = "winefs-age-state 2";

/// The ager's state as its file holds it.
#[derive(Serialize, Deserialize)]
struct Checkpoint {
    /// [`STATE_MAGIC`].
    format: String,
    profile: String,
    seed: u64,
    rng: u64,
    clock: u64,
    next_id: u64,
    written: u64,
    creates: u64,
    deletes: u64,
    full: u64,
    filled: bool,
    /// Files created per size class and per depth entry.
    sizes: Vec<u64>,
    depths: Vec<u64>,
    /// Directories made: (depth, index at that depth).
    dirs: Vec<(u32, u64)>,
    /// Live files, births ascending: (birth, id, size, depth, directory).
    files: Vec<(u64, u64, u64, u32, u64)>,
}

impl State {
    fn new(cfg: &AgeConfig) -> State {
        State {
            profile: cfg.profile.name.clone(),
            seed: cfg.seed,
            rng: Rng(cfg.seed),
            clock: 0,
            next_id: 0,
            written: 0,
            creates: 0,
            deletes: 0,
            full: 0,
            filled: false,
            births: Vec::new(),
            files: HashMap::new(),
            made: BTreeSet::new(),
            size_counts: vec![0; cfg.profile.sizes.len()],
            depth_counts: vec![0; cfg.profile.dirs.len()],
        }
    }

    /// Write the state to `path` atomically (a temporary file renamed into place).
    fn save(&self, path: &Path) -> Result<()> {
        let cp = Checkpoint {
            format: STATE_MAGIC.into(),
            profile: self.profile.clone(),
            seed: self.seed,
            rng: self.rng.0,
            clock: self.clock,
            next_id: self.next_id,
            written: self.written,
            creates: self.creates,
            deletes: self.deletes,
            full: self.full,
            filled: self.filled,
            sizes: self.size_counts.clone(),
            depths: self.depth_counts.clone(),
            dirs: self.made.iter().copied().collect(),
            files: self
                .births
                .iter()
                .map(|b| {
                    let f = &self.files[b];
                    (*b, f.id, f.size, f.depth, f.dir)
                })
                .collect(),
        };
        let tmp = path.with_extension("tmp");
        let write = || -> std::io::Result<()> {
            let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            serde_json::to_writer(&mut w, &cp)?;
            w.write_all(b"\n")?;
            w.into_inner().map_err(|e| e.into_error())?;
            Ok(())
        };
        write().map_err(|e| Error::io(format!("write {}", tmp.display()), e))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| Error::io(format!("rename {} into place", tmp.display()), e))
    }

    fn load(path: &Path, cfg: &AgeConfig) -> Result<State> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        let bad = |what: &str| {
            Error::Invalid(format!(
                "{} is not a usable ager state: {what}",
                path.display()
            ))
        };
        if text.starts_with("winefs-age-state 1\n") {
            return Err(bad(
                "it is in the line format of an earlier winefs; start afresh (--restart)",
            ));
        }
        let cp: Checkpoint = serde_json::from_str(&text).map_err(|e| bad(&e.to_string()))?;
        if cp.format != STATE_MAGIC {
            return Err(bad("wrong header"));
        }
        if cp.profile != cfg.profile.name {
            return Err(Error::Invalid(format!(
                "{} was made with profile {}, not {}; start afresh on a new file system or use \
                 that profile",
                path.display(),
                cp.profile,
                cfg.profile.name
            )));
        }
        let mut st = State::new(cfg);
        if cp.sizes.len() != st.size_counts.len() || cp.depths.len() != st.depth_counts.len() {
            return Err(bad("the profile's classes changed"));
        }
        st.seed = cp.seed;
        st.rng = Rng(cp.rng);
        st.clock = cp.clock;
        st.next_id = cp.next_id;
        st.written = cp.written;
        st.creates = cp.creates;
        st.deletes = cp.deletes;
        st.full = cp.full;
        st.filled = cp.filled;
        st.size_counts = cp.sizes;
        st.depth_counts = cp.depths;
        st.made = cp.dirs.into_iter().collect();
        for (birth, id, size, depth, dir) in cp.files {
            if st.births.last().is_some_and(|&b| b >= birth) {
                return Err(bad("births out of order"));
            }
            st.births.push(birth);
            st.files.insert(
                birth,
                LiveFile {
                    id,
                    size,
                    depth,
                    dir,
                },
            );
        }
        Ok(st)
    }
}

/// Where the run stands; also the final report.
#[derive(Clone, Debug)]
pub struct AgeReport {
    /// What was aged ([`AgeTarget::describe`]).
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
        let idx = lo + self.st.rng.below((hi - lo) as u64) as usize;
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

#[cfg(test)]
mod tests {
    use super::*;

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

    fn config(profile_name: &str) -> AgeConfig {
        let mut p = Profile::parse(profile_name, profile::BUILTIN[0].1).unwrap();
        p.name = profile_name.into();
        AgeConfig::new(p)
    }

    #[test]
    fn checkpoint_round_trips_and_refuses_what_it_cannot_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let cfg = config(AWKWARD);
        let mut st = State::new(&cfg);
        st.rng.next_u64();
        (st.clock, st.next_id, st.written, st.creates) = (7, 9, 1 << 40, 5);
        (st.deletes, st.full, st.filled) = (2, 1, true);
        st.size_counts[0] = 4;
        st.depth_counts[1] = 3;
        st.made.extend([(1, 0), (2, 5)]);
        for (birth, id) in [(2u64, 1u64), (5, 4), (7, 8)] {
            st.births.push(birth);
            let f = LiveFile {
                id,
                size: id << 12,
                depth: 2,
                dir: 5,
            };
            st.files.insert(birth, f);
        }
        st.save(&path).unwrap();
        assert_eq!(State::load(&path, &cfg).unwrap(), st);
        // Another profile is refused, naming the one the state was made with.
        let e = State::load(&path, &config("wang")).unwrap_err().to_string();
        assert!(e.contains(&format!("profile {AWKWARD}")), "{e}");
        // So are the line format of version 1 and a damaged file.
        std::fs::write(&path, "winefs-age-state 1\nprofile agrawal\n").unwrap();
        let e = State::load(&path, &cfg).unwrap_err().to_string();
        assert!(e.contains("earlier winefs"), "{e}");
        std::fs::write(&path, "{\"format\": \"winefs-age-state 2\", \"profile\"").unwrap();
        let e = State::load(&path, &cfg).unwrap_err().to_string();
        assert!(e.contains("not a usable ager state"), "{e}");
    }
}
