//! Crash-consistency testing (a tool beside the core, like `bench`): the persistence-point crash
//! explorer and the FUSE kill harness.
//!
//! The explorer runs each workload (`workload`) on a small pool with a recorder attached to the
//! pool's persistence seam (`record`), which freezes a crash point at every fence. For each
//! crash point it builds crash images — everything guaranteed durable, plus every subset
//! (exhaustive while small, seeded samples beyond) of the cache lines that may or may not have
//! reached media — mounts each (recovery runs on a private mapping), runs fsck, and compares
//! what is observable with the states the operation may leave (`tree`). docs/TESTING.md
//! describes the model and the oracles.

pub(crate) mod catalogue;
pub mod corrupt;
pub mod kill;
pub(crate) mod model;
pub(crate) mod record;
pub(crate) mod tree;
pub(crate) mod workload;

pub use workload::Workload;

use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::media::layout::ROOT_INO;
use crate::media::pool::{Category, Pool};
use crate::types::{Consistency, MkfsOptions, MountOptions};
use record::{CrashPoint, Line, Recorder};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tree::Tree;
use crate::rng::Rng;
use workload::Start;

/// Size of the explored pools: one partition, 256 inodes, nine 2 MiB data units.
pub(crate) const POOL_SIZE: u64 = 24 << 20;

/// What to explore.
#[derive(Clone, Debug)]
pub struct ExploreConfig {
    /// Every length-1 workload, in every mode of `modes`.
    pub all_singles: bool,
    /// Length-2 workloads: all of them when this is at least their number, else this many
    /// drawn with the seed.
    pub pairs: usize,
    /// Length-3 workloads drawn with the seed.
    pub triples: usize,
    /// The mount consistencies each workload runs in.
    pub modes: Vec<Consistency>,
    /// Crash points with at most this many pending lines get every subset of them.
    pub exhaustive_lines: u32,
    /// Beyond that, this many random subsets (plus none and all).
    pub samples: usize,
    /// Seed of every sampled choice (workloads and subsets).
    pub seed: u64,
    /// Worker threads (0: one per CPU).
    pub threads: usize,
    /// Run only the workload with this index (as printed with a failure).
    pub only: Option<usize>,
    /// Test the explorer itself: record with the fence after the undo records skipped.
    pub broken_skip_undo_fence: bool,
    /// Test the explorer itself: record with the fence between an alternate write's stores and
    /// its descriptor skipped.
    pub broken_skip_slot_fence: bool,
    /// Test the explorer itself: record with the fence between an append's bytes and the size
    /// store that covers them skipped.
    pub broken_skip_append_fence: bool,
    /// Directory for pool images (default: /dev/shm, else the temporary directory).
    pub dir: Option<PathBuf>,
    /// Print a progress line to stderr every this many workloads (0: never).
    pub progress_every: usize,
}

impl Default for ExploreConfig {
    fn default() -> Self {
        ExploreConfig {
            all_singles: true,
            pairs: 0,
            triples: 0,
            modes: vec![Consistency::Strict, Consistency::Relaxed],
            exhaustive_lines: 8,
            samples: 24,
            seed: 1,
            threads: 0,
            only: None,
            broken_skip_undo_fence: false,
            broken_skip_slot_fence: false,
            broken_skip_append_fence: false,
            dir: None,
            progress_every: 0,
        }
    }
}

/// One crash state that failed an oracle.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The workload's index in [`workloads`] (`winefs crashtest explore --only`).
    pub index: usize,
    /// The workload, as [`Workload`] displays it.
    pub workload: String,
    /// The crash point: the ordinal of the fence it precedes, from the start of the recording.
    pub fence: usize,
    /// The operation in progress (None: after the last one).
    pub op: Option<String>,
    /// Cache lines written but not yet fenced at the crash point.
    pub pending: usize,
    /// Pool offsets of the pending lines that reached media in this state.
    pub on_media: Vec<u64>,
    /// What the oracle found (fsck problems, or the observable tree against the allowed ones).
    pub what: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "workload #{} {}", self.index, self.workload)?;
        writeln!(
            f,
            "  crash before fence {} {}; {} of {} pending lines on media: {:?}{}",
            self.fence,
            match &self.op {
                Some(op) => format!("during `{op}`"),
                None => "after the last operation".to_string(),
            },
            self.on_media.len(),
            self.pending,
            &self.on_media[..self.on_media.len().min(12)],
            if self.on_media.len() > 12 { " ..." } else { "" }
        )?;
        write!(f, "  {}", self.what.trim_end())
    }
}

/// What an exploration did.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Workloads run.
    pub workloads: usize,
    /// Workloads by sequence length (index 0: length 1).
    pub by_length: [usize; 3],
    /// Operations run (and of those, refused with an error).
    pub ops: usize,
    /// Operations that returned an error (the oracles then expect no change from them).
    pub ops_refused: usize,
    /// Crash points (fences) recorded.
    pub crash_points: usize,
    /// Crash states built, recovered and checked.
    pub states: usize,
    /// One failure per failing workload (the first state found).
    pub failures: Vec<Failure>,
    /// Wall-clock time of the run.
    pub elapsed: Duration,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.elapsed.as_secs_f64();
        writeln!(
            f,
            "workloads: {} (length 1: {}, 2: {}, 3: {}); operations: {} ({} refused)",
            self.workloads,
            self.by_length[0],
            self.by_length[1],
            self.by_length[2],
            self.ops,
            self.ops_refused
        )?;
        writeln!(
            f,
            "crash points: {}; crash states checked: {} in {:.1} s ({:.0} states/s)",
            self.crash_points,
            self.states,
            secs,
            self.states as f64 / secs.max(1e-9)
        )?;
        write!(f, "failures: {}", self.failures.len())
    }
}

/// The workloads a configuration explores, in index order.
pub fn workloads(cfg: &ExploreConfig) -> Vec<Workload> {
    let mut out = Vec::new();
    let mut rng = Rng::new(cfg.seed);
    let modes = if cfg.modes.is_empty() {
        vec![Consistency::Strict]
    } else {
        cfg.modes.clone()
    };
    if cfg.all_singles {
        for (start, ops) in model::enumerate(1) {
            for &consistency in &modes {
                out.push(Workload {
                    start,
                    consistency,
                    ops: ops.clone(),
                });
            }
        }
    }
    if cfg.pairs > 0 {
        let mut all = model::enumerate(2);
        if cfg.pairs < all.len() {
            // A seeded partial shuffle: the first `pairs` are a uniform sample.
            for i in 0..cfg.pairs {
                let j = i + rng.pick(all.len() - i);
                all.swap(i, j);
            }
            all.truncate(cfg.pairs);
        }
        for (i, (start, ops)) in all.into_iter().enumerate() {
            out.push(Workload {
                start,
                consistency: modes[i % modes.len()],
                ops,
            });
        }
    }
    for i in 0..cfg.triples {
        let start = if rng.below(2) == 0 {
            Start::Fresh
        } else {
            Start::Populated
        };
        if let Ok(ops) = model::sample(start, 3, &mut rng) {
            out.push(Workload {
                start,
                consistency: modes[i % modes.len()],
                ops,
            });
        }
    }
    out
}

/// A directory removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(under: Option<&Path>) -> Result<Scratch> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let root = match under {
            Some(d) => d.to_path_buf(),
            None if Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
            None => std::env::temp_dir(),
        };
        let dir = root.join(format!(
            "winefs-crash-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mount_opts(consistency: Consistency, private: bool) -> MountOptions {
    MountOptions {
        consistency,
        private,
        no_background_rewrite: true,
        read_only: false,
        overwrite_path: Default::default(),
        wear_aware: false,
        // Thousands of short mounts: faulting their pools in would only cost time.
        no_prefault: true,
        cached_inodes: 0,
        // The oracles read every file and directory: access times they stored would add
        // unflushed stores (outside every checksum) to the crash points they look at.
        noatime: true,
    }
}

/// Make the starting pool of `start` at `path` (cleanly unmounted).
fn make_template(path: &Path, start: Start) -> Result<()> {
    Fs::mkfs(
        path,
        &MkfsOptions {
            size: Some(POOL_SIZE),
            partitions: Some(1),
            inodes: Some(256),
            force: false,
            wear_stats: false,
        },
    )?;
    let fs = Fs::mount(path, mount_opts(Consistency::Strict, false))?;
    for op in start.setup() {
        op.apply(&fs)
            .map_err(|e| Error::Invalid(format!("setting up the {start} pool: {op}: {e}")))?;
    }
    fs.unmount()
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to)
        .map(drop)
        .map_err(|e| Error::io(format!("copy {} to {}", from.display(), to.display()), e))
}

/// What recording one workload produced.
struct Recording {
    base: PathBuf,
    log: Vec<(u64, Line)>,
    points: Vec<CrashPoint>,
    /// Per operation (and one more for after the last): the states a crash may leave.
    allowed: Vec<Vec<Tree>>,
    refused: usize,
}

/// Run `wl` with a recorder attached; `work` is a copy of its starting pool.
fn record(
    wl: &Workload,
    work: &Path,
    base: &Path,
    scratch: &Path,
    broken: (bool, bool, bool),
) -> Result<Recording> {
    let fs = Fs::mount(work, mount_opts(wl.consistency, false))?;
    fs.set_broken_skip_undo_fence(broken.0);
    fs.set_broken_skip_slot_fence(broken.1);
    fs.set_broken_skip_append_fence(broken.2);
    let image =
        std::fs::read(work).map_err(|e| Error::io(format!("read {}", work.display()), e))?;
    std::fs::write(base, &image).map_err(|e| Error::io(format!("write {}", base.display()), e))?;
    let rec = Arc::new(Recorder::new(image));
    let pool = fs.pool();
    pool.set_observer(Some(rec.clone()));
    let mut allowed = Vec::new();
    let mut refused = 0;
    let mut before = Tree::of(&fs)?;
    for (i, op) in wl.ops.iter().enumerate() {
        let mut states = vec![before.clone()];
        // The documented intermediate states, from the same operation split into its atomic
        // steps on a copy of the file system as it is now.
        let steps = op.steps(&fs).unwrap_or_default();
        if steps.len() > 1 {
            copy(work, scratch)?;
            let s = Fs::mount(scratch, mount_opts(wl.consistency, true))?;
            for step in &steps[..steps.len() - 1] {
                step.apply(&s)?;
                states.push(Tree::of(&s)?);
            }
        }
        rec.set_op(i);
        if op.apply(&fs).is_err() {
            refused += 1;
        }
        let after = Tree::of(&fs)?;
        states.push(after.clone());
        allowed.push(states);
        before = after;
    }
    rec.set_op(wl.ops.len());
    allowed.push(vec![before]);
    let (log, points) = rec.finish(pool);
    pool.set_observer(None);
    drop(fs);
    Ok(Recording {
        base: base.to_path_buf(),
        log,
        points,
        allowed,
        refused,
    })
}

/// Mount one crash image and run every oracle on it; `Err` describes the failure.
fn check_state(
    rec: &Recording,
    mode: Consistency,
    durable: &BTreeMap<u64, Line>,
    point: &CrashPoint,
    mask: &[bool],
) -> std::result::Result<(), String> {
    let pool = Pool::open(&rec.base, true).map_err(|e| format!("open the image: {e}"))?;
    let lines = durable.iter().map(|(o, l)| (*o, l)).chain(
        point
            .pending
            .iter()
            .zip(mask)
            .filter(|(_, on)| **on)
            .map(|((o, l), _)| (*o, l)),
    );
    for (off, l) in lines {
        pool.write(off, l, Category::Metadata)
            .map_err(|e| format!("build the image: {e}"))?;
    }
    let fs = Fs::mount_pool(pool, mount_opts(mode, true))
        .map_err(|e| format!("mount (recovery) failed: {e}"))?;
    let report = fs.check();
    if !report.is_clean() {
        return Err(format!("fsck after recovery: {:?}", report.problems));
    }
    let got = Tree::of(&fs).map_err(|e| format!("reading the recovered tree failed: {e}"))?;
    let allowed = &rec.allowed[point.op];
    if !tree::matches(&got, allowed, mode) {
        let mut what = String::from("the recovered state is none of the allowed states:\n");
        for (k, t) in allowed.iter().enumerate() {
            let name = match k {
                0 => "before".to_string(),
                k if k + 1 == allowed.len() => "after".to_string(),
                k => format!("after step {k}"),
            };
            what += &format!("  vs {name}:\n{}", t.diff(&got, 6));
        }
        return Err(what);
    }
    // Nothing a crash left past the end of a file shows when the file grows.
    got.check_nothing_past_the_end_shows(&fs)
        .map_err(|e| format!("bytes past the end show after recovery: {e}"))?;
    // The recovered file system must also keep working: a new file, then fsck again.
    let probe = fs
        .create(ROOT_INO, b".crashprobe", 0o644, 0, 0)
        .and_then(|a| fs.write(a.ino, 0, &vec![0x5a; 20000]).map(drop));
    if let Err(e) = probe {
        return Err(format!("creating a file after recovery failed: {e}"));
    }
    let report = fs.check();
    if !report.is_clean() {
        return Err(format!(
            "fsck after a write following recovery: {:?}",
            report.problems
        ));
    }
    Ok(())
}

/// The subsets of `n` pending lines to try at one crash point.
fn subsets(n: usize, cfg: &ExploreConfig, rng: &mut Rng) -> Vec<Vec<bool>> {
    if n <= cfg.exhaustive_lines as usize {
        return (0..1u64 << n)
            .map(|m| (0..n).map(|i| m >> i & 1 == 1).collect())
            .collect();
    }
    let mut out = vec![vec![false; n], vec![true; n]];
    for k in 0..cfg.samples {
        // Vary the density: mostly-absent, half, mostly-present.
        let p = [16u64, 128, 240][k % 3];
        out.push((0..n).map(|_| rng.below(256) < p).collect());
    }
    out
}

struct Outcome {
    crash_points: usize,
    states: usize,
    refused: usize,
    failure: Option<Failure>,
}

fn explore_one(
    cfg: &ExploreConfig,
    index: usize,
    wl: &Workload,
    template: &Path,
    dir: &Path,
) -> Result<Outcome> {
    let work = dir.join(format!("w{index}.pool"));
    let base = dir.join(format!("w{index}.base"));
    let scratch = dir.join(format!("w{index}.scratch"));
    copy(template, &work)?;
    let broken = (
        cfg.broken_skip_undo_fence,
        cfg.broken_skip_slot_fence,
        cfg.broken_skip_append_fence,
    );
    let rec = record(wl, &work, &base, &scratch, broken);
    for p in [&work, &scratch] {
        let _ = std::fs::remove_file(p);
    }
    let rec = rec?;
    let mut out = Outcome {
        crash_points: 0,
        states: 0,
        refused: rec.refused,
        failure: None,
    };
    let mut rng = Rng::new(cfg.seed ^ (index as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut durable = BTreeMap::new();
    let mut applied = 0;
    let mut last: Option<(usize, usize)> = None;
    for point in &rec.points {
        for (off, l) in &rec.log[applied..point.durable_len] {
            durable.insert(*off, *l);
        }
        applied = point.durable_len;
        // A fence with nothing pending and nothing newly durable repeats the previous image.
        if point.pending.is_empty() && last == Some((point.op, point.durable_len)) {
            continue;
        }
        last = Some((point.op, point.durable_len));
        out.crash_points += 1;
        for mask in subsets(point.pending.len(), cfg, &mut rng) {
            out.states += 1;
            if let Err(what) = check_state(&rec, wl.consistency, &durable, point, &mask) {
                out.failure = Some(Failure {
                    index,
                    workload: wl.to_string(),
                    fence: point.fence,
                    op: wl.ops.get(point.op).map(|o| o.to_string()),
                    pending: point.pending.len(),
                    on_media: point
                        .pending
                        .iter()
                        .zip(&mask)
                        .filter(|(_, on)| **on)
                        .map(|((o, _), _)| *o)
                        .collect(),
                    what,
                });
                let _ = std::fs::remove_file(&base);
                return Ok(out);
            }
        }
    }
    let _ = std::fs::remove_file(&base);
    Ok(out)
}

/// Explore every workload of `cfg`.
pub fn explore(cfg: &ExploreConfig) -> Result<Summary> {
    let t0 = Instant::now();
    let all = workloads(cfg);
    let chosen: Vec<(usize, Workload)> = match cfg.only {
        Some(i) => {
            let wl = all.get(i).cloned().ok_or_else(|| {
                Error::Invalid(format!("no workload {i} (there are {})", all.len()))
            })?;
            vec![(i, wl)]
        }
        None => all.into_iter().enumerate().collect(),
    };
    let dir = Scratch::new(cfg.dir.as_deref())?;
    let mut templates = BTreeMap::new();
    for start in Start::ALL {
        let p = dir.0.join(format!("template-{start}.pool"));
        make_template(&p, start)?;
        templates.insert(start, p);
    }
    let threads = match cfg.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let next = AtomicUsize::new(0);
    let summary = Mutex::new(Summary::default());
    let error: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.min(chosen.len()).max(1) {
            s.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some((index, wl)) = chosen.get(k) else {
                        break;
                    };
                    let r = explore_one(cfg, *index, wl, &templates[&wl.start], &dir.0);
                    let mut sum = summary.lock().unwrap_or_else(|e| e.into_inner());
                    match r {
                        Ok(o) => {
                            sum.workloads += 1;
                            sum.by_length[wl.ops.len().clamp(1, 3) - 1] += 1;
                            sum.ops += wl.ops.len();
                            sum.ops_refused += o.refused;
                            sum.crash_points += o.crash_points;
                            sum.states += o.states;
                            if let Some(f) = o.failure {
                                sum.failures.push(f);
                            }
                            if cfg.progress_every > 0 && sum.workloads % cfg.progress_every == 0 {
                                eprintln!(
                                    "  {}/{} workloads, {} states, {} failures, {:.0} s",
                                    sum.workloads,
                                    chosen.len(),
                                    sum.states,
                                    sum.failures.len(),
                                    t0.elapsed().as_secs_f64()
                                );
                            }
                        }
                        Err(e) => {
                            let mut slot = error.lock().unwrap_or_else(|e| e.into_inner());
                            slot.get_or_insert(Error::Invalid(format!(
                                "workload #{index} {wl}: {e}"
                            )));
                            next.store(chosen.len(), Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let mut sum = summary.into_inner().unwrap_or_else(|e| e.into_inner());
    sum.failures.sort_by_key(|f| f.index);
    sum.elapsed = t0.elapsed();
    Ok(sum)
}
