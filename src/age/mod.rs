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
//!   of depth d-1, capped at [`MAX_DIRS_PER_DEPTH`]; a new file picks a depth by weight and a
//!   directory of that depth uniformly; directories are made on first use.
//! * **Deterministic** under a seed: every choice comes from one seeded generator, so the same
//!   seed on the same (fresh) file system gives the same sequence of operations.
//! * **Resumable**: the ager's state is checkpointed (atomically) beside the target; a new run
//!   with the same state file reconciles it with the file system and goes on.

pub mod profile;
pub mod target;

use crate::error::{Error, Result};
use profile::{Profile, Weighted, chi_square, chi_square_critical_95};
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
pub use target::{AgeTarget, CreateMethod, LibraryTarget, PosixTarget, Usage};

/// Directories per depth at most (the profiles' products of subdirectory counts reach
/// millions; a few hundred directories per level spread files as widely as small pools need).
pub const MAX_DIRS_PER_DEPTH: u64 = 256;

/// What to run.
#[derive(Clone, Debug)]
pub struct AgeConfig {
    pub profile: Profile,
    pub seed: u64,
    /// Target utilization, 0 < u < 1.
    pub utilization: f64,
    /// Total bytes to write, as a multiple of the capacity (fill included).
    pub writes: f64,
    /// Stop once the age distribution converges (after the fill), even before `writes`.
    pub stop_on_convergence: bool,
    /// Where the ager's state lives (checkpointed every `checkpoint_every` and at the end).
    pub state: Option<PathBuf>,
    pub checkpoint_every: Duration,
    /// Draw a progress bar on standard error.
    pub progress: bool,
}

impl AgeConfig {
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
#[derive(Clone, Debug)]
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
#[derive(Clone, Debug)]
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

const STATE_MAGIC: &str = "winefs-age-state 1";

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

    fn save(&self, path: &Path) -> Result<()> {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ = writeln!(s, "{STATE_MAGIC}");
        let _ = writeln!(s, "profile {}", self.profile);
        let _ = writeln!(
            s,
            "counters {} {} {} {} {} {} {} {} {}",
            self.seed,
            self.rng.0,
            self.clock,
            self.next_id,
            self.written,
            self.creates,
            self.deletes,
            self.full,
            self.filled as u8
        );
        let join = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
        let _ = writeln!(s, "sizes {}", join(&self.size_counts));
        let _ = writeln!(s, "depths {}", join(&self.depth_counts));
        for (d, j) in &self.made {
            let _ = writeln!(s, "D {d} {j}");
        }
        for b in &self.births {
            let f = &self.files[b];
            let _ = writeln!(s, "F {b} {} {} {} {}", f.id, f.size, f.depth, f.dir);
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, s).map_err(|e| Error::io(format!("write {}", tmp.display()), e))?;
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
        let mut lines = text.lines();
        if lines.next() != Some(STATE_MAGIC) {
            return Err(bad("wrong header"));
        }
        let mut st = State::new(cfg);
        let nums = |rest: &str| -> Result<Vec<u64>> {
            rest.split_whitespace()
                .map(|w| w.parse().map_err(|_| bad(&format!("bad number {w:?}"))))
                .collect()
        };
        for line in lines {
            let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
            match kind {
                "profile" => {
                    if rest != cfg.profile.name {
                        return Err(Error::Invalid(format!(
                            "{} was made with profile {rest}, not {}; start afresh on a new \
                             file system or use that profile",
                            path.display(),
                            cfg.profile.name
                        )));
                    }
                }
                "counters" => {
                    let v = nums(rest)?;
                    if v.len() != 9 {
                        return Err(bad("counters"));
                    }
                    st.seed = v[0];
                    st.rng = Rng(v[1]);
                    st.clock = v[2];
                    st.next_id = v[3];
                    st.written = v[4];
                    st.creates = v[5];
                    st.deletes = v[6];
                    st.full = v[7];
                    st.filled = v[8] != 0;
                }
                "sizes" | "depths" => {
                    let v = nums(rest)?;
                    let want = if kind == "sizes" {
                        &mut st.size_counts
                    } else {
                        &mut st.depth_counts
                    };
                    if v.len() != want.len() {
                        return Err(bad("the profile's classes changed"));
                    }
                    *want = v;
                }
                "D" => {
                    let v = nums(rest)?;
                    if v.len() != 2 {
                        return Err(bad("directory line"));
                    }
                    st.made.insert((v[0] as u32, v[1]));
                }
                "F" => {
                    let v = nums(rest)?;
                    if v.len() != 5 {
                        return Err(bad("file line"));
                    }
                    if st.births.last().is_some_and(|&b| b >= v[0]) {
                        return Err(bad("births out of order"));
                    }
                    st.births.push(v[0]);
                    st.files.insert(
                        v[0],
                        LiveFile {
                            id: v[1],
                            size: v[2],
                            depth: v[3] as u32,
                            dir: v[4],
                        },
                    );
                }
                _ => return Err(bad(&format!("unknown line {kind:?}"))),
            }
        }
        Ok(st)
    }
}

/// Where the run stands; also the final report.
#[derive(Clone, Debug)]
pub struct AgeReport {
    pub target: String,
    pub profile: String,
    pub seed: u64,
    pub target_utilization: f64,
    pub usage: Usage,
    /// Bytes written (sizes of the files created), in all runs of this state.
    pub written: u64,
    pub writes_target: u64,
    pub creates: u64,
    pub deletes: u64,
    /// Creates refused for lack of space (each answered by a deletion).
    pub full: u64,
    pub live_files: u64,
    pub live_bytes: u64,
    /// Live files per age bucket, and the chi-square statistic against the profile.
    pub age_counts: Vec<u64>,
    pub age_chi_square: f64,
    pub age_critical: f64,
    /// Files created per size class and per depth entry since the start.
    pub size_counts: Vec<u64>,
    pub depth_counts: Vec<u64>,
    /// Utilization seen at every create or delete after the fill: (lowest, highest).
    pub churn_range: Option<(f64, f64)>,
    pub seconds: f64,
    pub resumed: bool,
}

impl AgeReport {
    pub fn converged(&self) -> bool {
        self.age_chi_square <= self.age_critical
    }

    /// The report as one JSON object (for scripts).
    pub fn to_json(&self) -> String {
        let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let (lo, hi) = self.churn_range.unwrap_or((f64::NAN, f64::NAN));
        let num = |x: f64| {
            if x.is_finite() {
                format!("{x:.6}")
            } else {
                "null".into()
            }
        };
        format!(
            "{{\"target\":{:?},\"profile\":{:?},\"seed\":{},\"target_utilization\":{},\
             \"utilization\":{},\"used\":{},\"capacity\":{},\"written\":{},\"writes_target\":{},\
             \"writes_x_capacity\":{},\"creates\":{},\"deletes\":{},\"full\":{},\
             \"live_files\":{},\"live_bytes\":{},\"age_counts\":[{}],\"age_chi_square\":{},\
             \"age_critical\":{},\"converged\":{},\"size_counts\":[{}],\"depth_counts\":[{}],\
             \"churn_min\":{},\"churn_max\":{},\"seconds\":{:.1},\"resumed\":{}}}",
            self.target,
            self.profile,
            self.seed,
            num(self.target_utilization),
            num(self.usage.utilization()),
            self.usage.used,
            self.usage.capacity,
            self.written,
            self.writes_target,
            num(self.written as f64 / self.usage.capacity.max(1) as f64),
            self.creates,
            self.deletes,
            self.full,
            self.live_files,
            self.live_bytes,
            list(&self.age_counts),
            num(self.age_chi_square),
            num(self.age_critical),
            self.converged(),
            list(&self.size_counts),
            list(&self.depth_counts),
            num(lo),
            num(hi),
            self.seconds,
            self.resumed
        )
    }
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
